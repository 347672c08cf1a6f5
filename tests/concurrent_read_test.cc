// Several threads reading one image at once through one Filesystem, with a
// node cache small enough to evict constantly. Run under TSan by ./test.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

namespace stdfs = std::filesystem;

std::string Content(int i) {
  std::mt19937 rng(static_cast<unsigned>(i));
  std::string s((i * 7919) % 300000, '\0');
  for (auto& c : s) c = static_cast<char>(rng() % 7 == 0 ? rng() : 'a' + i % 26);
  return s;
}

TEST(ConcurrentRead, ThreadsShareOneFilesystem) {
  char tmpl[] = "/tmp/ubtrfs-concurrent.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const stdfs::path dir = tmpl;
  const int kFiles = 120;
  for (int i = 0; i < kFiles; ++i) {
    stdfs::create_directories(dir / "src" / ("d" + std::to_string(i % 6)));
    std::ofstream(dir / "src" / ("d" + std::to_string(i % 6)) / ("f" + std::to_string(i)), std::ios::binary)
        << Content(i);
  }
  const std::string img = (dir / "img").string();
  const std::string cmd = "truncate -s 512M " + img + " && mkfs.btrfs -q -f --nodesize 4096 --rootdir " +
                          (dir / "src").string() + " " + img + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  ubtrfs::OpenOptions opts;
  opts.node_cache_bytes = 8 * 4096;  // constant eviction
  auto fs = ubtrfs::Filesystem::Open(img, opts);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();

  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<uint8_t> buf(65536 + t * 1000);
      for (int round = 0; round < 3 * kFiles; ++round) {
        const int i = static_cast<int>(rng() % kFiles);
        auto id = (*fs)->Lookup("/d" + std::to_string(i % 6) + "/f" + std::to_string(i));
        if (!id.ok()) { ++failures[t]; continue; }
        const std::string want = Content(i);
        std::string got;
        for (uint64_t off = 0;;) {
          auto n = (*fs)->Read(*id, off, buf);
          if (!n.ok()) { ++failures[t]; break; }
          if (*n == 0) break;
          got.append(reinterpret_cast<const char*>(buf.data()), *n);
          off += *n;
        }
        if (got != want) ++failures[t];
        auto entries = (*fs)->ReadDir(*(*fs)->Lookup("/d" + std::to_string(i % 6)));
        if (!entries.ok() || entries->size() != static_cast<size_t>(kFiles / 6)) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  stdfs::remove_all(dir);
}

}  // namespace
