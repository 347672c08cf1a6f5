// Several threads reading one image at once through one Filesystem, with a
// node cache small enough to evict constantly. Run under TSan by ./test.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/mkfs_util.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/mkfs.h"

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

// ReadPieces hands on bytes in place, from a map of the image. While they
// are handed on, another thread overwrites the file and commits again and
// again on an image so small that the freed extents are soon allocated and
// written again: the pieces must not change under the caller (the commit
// that would free them waits).
TEST(ConcurrentRead, PiecesStayAsTheyWereWhileCommitsReuseTheirSpace) {
  char tmpl[] = "/tmp/ubtrfs-pieces.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const stdfs::path dir = tmpl;
  const std::string img = (dir / "img").string();
  ubtrfs::MkfsSpec spec;
  spec.images = {img};
  spec.size = 64ull << 20;
  ASSERT_TRUE(ubtrfs::Mkfs(spec).ok());
  std::unique_ptr<ubtrfs::Filesystem> fs = ubtrfs_test::OpenWritable(img);
  ASSERT_TRUE(fs);
  constexpr size_t kSize = 1 << 20;
  ubtrfs::NewInode attrs;
  attrs.mode = 0644;
  auto f = fs->Create(*fs->Lookup("/"), "f", attrs);
  ASSERT_TRUE(f.ok());
  auto write_version = [&](int v) {
    const std::vector<uint8_t> bytes(kSize, static_cast<uint8_t>(v));
    auto w = fs->Write(*f, 0, bytes);
    return w.ok() ? fs->Commit() : w.status();
  };
  ASSERT_TRUE(write_version(1).ok());
  std::atomic<bool> stop{false};
  int commits = 0;
  ubtrfs::Status writer_status;
  std::thread writer([&] {
    for (int v = 2; !stop.load() && v < 100000; ++v) {
      writer_status = write_version(v % 250 + 1);
      if (!writer_status.ok()) break;
      ++commits;
    }
  });
  int reads = 0, changed = 0;
  size_t mapped = 0;
  std::vector<uint8_t> scratch(kSize);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < until) {
    std::string first;
    auto n = fs->ReadPieces(*f, 0, scratch, [&](std::span<const ubtrfs::Filesystem::ReadPiece> pieces) {
      for (const auto& p : pieces) {
        first.append(reinterpret_cast<const char*>(p.data), p.size);
        if (p.data < scratch.data() || p.data >= scratch.data() + scratch.size()) mapped += p.size;
      }
      // Long enough for the writer's allocations to come round to the
      // extent read here, were its commits not held off.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::string again;
      for (const auto& p : pieces) again.append(reinterpret_cast<const char*>(p.data), p.size);
      if (again != first) ++changed;
    });
    // Not ASSERT: the writer thread must be joined first.
    if (!n.ok() || *n != kSize) {
      ADD_FAILURE() << (n.ok() ? "read " + std::to_string(*n) + " bytes" : n.status().ToString());
      break;
    }
    ++reads;
  }
  stop = true;
  writer.join();
  ASSERT_TRUE(writer_status.ok()) << writer_status.ToString();
  EXPECT_GE(commits, 10);
  EXPECT_GT(mapped, 0u);
  EXPECT_EQ(changed, 0) << "of " << reads << " reads, " << commits << " commits";
  fs.reset();
  stdfs::remove_all(dir);
}

}  // namespace
