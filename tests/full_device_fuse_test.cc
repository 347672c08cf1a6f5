// A full device through `ubtrfs mount` (issue 15, the mount cases): on a
// data-full 200 MiB `ubtrfs mkfs` image, zero-range fallocate and an
// unaligned truncate get ENOSPC and nothing else, df reports what is left,
// a write right after an unlink finds the freed space, the mount stays
// writable, the daemon's final commit succeeds (exit 0), and the image is
// btrfs-check clean with the content written.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/fuse_mount.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::LoopMount;
using ubtrfs_test::MountProcess;
using ubtrfs_test::RunCommand;
using ubtrfs_test::Scratch;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

std::string Bytes(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i >> 12) * 131 + (i & 4095) * 7 + seed * 977 + 1);
  return s;
}

// Appends pieces of `piece` bytes until write(2) fails; returns the errno
// of that failure (0 if it never failed within `limit`) and the bytes
// written in *size.
int AppendUntilFull(const std::string& path, size_t piece, uint64_t limit, uint64_t* size) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return errno;
  const std::string buf = Bytes(piece, 3);
  int err = 0;
  while (*size < limit) {
    ssize_t w = write(fd, buf.data(), buf.size());
    if (w < 0) {
      err = errno;
      break;
    }
    *size += static_cast<uint64_t>(w);
  }
  fsync(fd);
  close(fd);
  return err;
}

// An fsync of the mount's top directory (`sync MOUNTPOINT`) commits the
// running transaction (other fsyncs write a tree log).
int CommitViaFsync(const std::string& mnt) {
  int fd = open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return -1;
  const int r = fsync(fd);
  close(fd);
  return r;
}

TEST(FullDeviceFuse, DataFullMountGivesEnospcOnlyAndUnmountsClean) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(mkdir(s.mnt.c_str(), 0755), 0);
  auto mk = RunCommand({UBTRFS_CLI_PATH, "mkfs", "--size", "200M", s.img});
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  const std::string content = Bytes(388332, 1);
  {
    MountProcess mount;
    START_MOUNT(mount, s);
    const std::string file = s.mnt + "/file";
    {
      int fd = open(file.c_str(), O_WRONLY | O_CREAT, 0644);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
      ASSERT_EQ(fsync(fd), 0);
      close(fd);
    }
    // dd until ENOSPC, then top up with 4 KiB appends.
    uint64_t filled = 0;
    EXPECT_EQ(AppendUntilFull(s.mnt + "/fill", kMiB, 1ull << 30, &filled), ENOSPC);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(AppendUntilFull(s.mnt + "/fill", 4 * kKiB, 1ull << 30, &filled), ENOSPC);
    struct statvfs v {};
    ASSERT_EQ(statvfs(s.mnt.c_str(), &v), 0);
    const uint64_t avail = uint64_t{v.f_bavail} * v.f_frsize;
    // At most the superblock stripe of a data chunk, which the kernel's
    // statfs counts as free (and shows as available) too.
    EXPECT_LE(avail, 64 * kKiB) << "df on a data-full device";
    std::cout << "[ full     ] " << (filled >> 20) << " MiB filled; df: " << (uint64_t{v.f_blocks} * v.f_frsize >> 10)
              << " KiB size, " << (avail >> 10) << " KiB available\n";

    // Case 1: zero-range fallocate past the end.
    int fd = open(file.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    errno = 0;
    EXPECT_EQ(fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 648655, 494490), -1);
    EXPECT_EQ(errno, ENOSPC) << strerror(errno);
    // Case 2: an unaligned truncate to a smaller size.
    errno = 0;
    EXPECT_EQ(ftruncate(fd, 300123), -1);
    EXPECT_EQ(errno, ENOSPC) << strerror(errno);
    close(fd);
    struct stat st {};
    ASSERT_EQ(stat(file.c_str(), &st), 0);
    EXPECT_EQ(st.st_size, static_cast<off_t>(content.size()));
    // A full device is told once per interval, not once per ENOSPC: 2,000
    // failing writes add at most a line or two to the log.
    {
      const auto lines = [&mount] {
        const std::string log = mount.Log();
        return std::count(log.begin(), log.end(), '\n');
      };
      const auto before = lines();
      int wfd = open(file.c_str(), O_WRONLY);
      ASSERT_GE(wfd, 0);
      const std::string page = Bytes(4096, 9);
      int enospc = 0;
      for (int i = 0; i < 2000; ++i) enospc += pwrite(wfd, page.data(), page.size(), 1 << 20) < 0 && errno == ENOSPC;
      close(wfd);
      EXPECT_EQ(enospc, 2000);
      EXPECT_LE(lines() - before, 2) << mount.Log().substr(0, 2000);
    }

    // Still writable: a directory, a small file.
    ASSERT_EQ(mkdir((s.mnt + "/dir").c_str(), 0755), 0) << strerror(errno);
    {
      int sfd = open((s.mnt + "/dir/small").c_str(), O_WRONLY | O_CREAT, 0644);
      ASSERT_GE(sfd, 0) << strerror(errno);
      ASSERT_EQ(write(sfd, "hello\n", 6), 6);
      close(sfd);
    }
    // Case 5: the space of a deleted file is there for the next write.
    ASSERT_EQ(unlink((s.mnt + "/fill").c_str()), 0);
    uint64_t after = 0;
    EXPECT_EQ(AppendUntilFull(s.mnt + "/after", kMiB, 8 * kMiB, &after), 0);
    EXPECT_EQ(after, 8 * kMiB);
    std::string err;
    EXPECT_EQ(mount.Unmount(&err), 0) << err << "\nlog: " << mount.Log();
  }
  EXPECT_EQ(BtrfsCheck(s.img), "");
  auto fs = ubtrfs::Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto id = (*fs)->Lookup("/file");
  ASSERT_TRUE(id.ok());
  std::string got(content.size(), '\0');
  auto n = (*fs)->Read(*id, 0, std::span(reinterpret_cast<uint8_t*>(got.data()), got.size()));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(got, content);
  auto small = (*fs)->Lookup("/dir/small");
  EXPECT_TRUE(small.ok()) << small.status().ToString();
  auto a = (*fs)->Lookup("/after");
  ASSERT_TRUE(a.ok());
  auto ast = (*fs)->GetStat(*a);
  ASSERT_TRUE(ast.ok());
  EXPECT_EQ(ast->size, 8 * kMiB);
}

// Cases 3 and 4 through the mount: data full, then 1000-byte files with an
// fsync every 500 until ENOSPC; `rm -rf` of the directory then removes
// every file (no crash, no ENOSPC), the space comes back (df), and the
// daemon's final commit succeeds.
TEST(FullDeviceFuse, RmRfWorksOnAMetadataFullMount) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(mkdir(s.mnt.c_str(), 0755), 0);
  auto mk = RunCommand({UBTRFS_CLI_PATH, "mkfs", "--size", "200M", s.img});
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  MountProcess mount;
  START_MOUNT(mount, s);
  uint64_t filled = 0;
  EXPECT_EQ(AppendUntilFull(s.mnt + "/fill", kMiB, 1ull << 30, &filled), ENOSPC);
  EXPECT_EQ(AppendUntilFull(s.mnt + "/fill", 4 * kKiB, 1ull << 30, &filled), ENOSPC);
  const std::string d = s.mnt + "/d";
  ASSERT_EQ(mkdir(d.c_str(), 0755), 0);
  const std::string small = Bytes(1000, 4);
  int made = 0, err = 0;
  for (; made < 1000000; ++made) {
    const std::string p = d + "/f" + std::to_string(made);
    int fd = open(p.c_str(), O_WRONLY | O_CREAT, 0644);
    if (fd < 0) {
      err = errno;
      break;
    }
    const ssize_t w = write(fd, small.data(), small.size());
    if (w != static_cast<ssize_t>(small.size())) err = w < 0 ? errno : EIO;
    if (made % 500 == 499 && fsync(fd) != 0) err = errno;
    close(fd);
    if (err) break;
  }
  EXPECT_EQ(err, ENOSPC) << strerror(err);
  std::cout << "[ full     ] metadata full after " << made << " files of 1000 bytes\n";
  ASSERT_GT(made, 1000);
  // A file unlinked while open (an orphan inode until its release).
  const std::string open_path = d + "/f7";
  int keep = open(open_path.c_str(), O_RDONLY);
  ASSERT_GE(keep, 0) << strerror(errno);
  EXPECT_EQ(unlink(open_path.c_str()), 0) << strerror(errno);
  char first[4] = {};
  EXPECT_EQ(pread(keep, first, sizeof first, 0), static_cast<ssize_t>(sizeof first));
  EXPECT_EQ(std::string(first, 4), small.substr(0, 4));
  close(keep);
  auto rm = RunCommand({"rm", "-rf", d, s.mnt + "/fill"});
  EXPECT_TRUE(rm.ok()) << rm.Describe();
  struct stat st {};
  EXPECT_NE(stat(d.c_str(), &st), 0) << "the directory is gone";
  ASSERT_EQ(CommitViaFsync(s.mnt), 0);
  struct statvfs v {};
  ASSERT_EQ(statvfs(s.mnt.c_str(), &v), 0);
  EXPECT_GE(uint64_t{v.f_bavail} * v.f_frsize, filled) << "the space came back";
  // And files can be made again.
  int fd = open((s.mnt + "/again").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  EXPECT_EQ(write(fd, small.data(), small.size()), static_cast<ssize_t>(small.size()));
  close(fd);
  std::string e;
  EXPECT_EQ(mount.Unmount(&e), 0) << e << "\nlog: " << mount.Log();
  EXPECT_EQ(BtrfsCheck(s.img), "");
}

// The fill / delete half / refill loop on a mounted directory (ours through
// FUSE, or the kernel's): each round tries files of mixed sizes worth 120
// MiB (more than the half deleted frees), counting the ENOSPC results;
// then deletes a random half; fsync after every tenth file. Every file
// keeps what write(2) reported written; the check reads each back.
struct LoopResult {
  uint64_t files = 0, enospc = 0, other_errors = 0;
  std::string first_other;
  std::map<std::string, std::pair<uint64_t, uint64_t>> kept;  // name -> size, seed
};

std::string Pattern(uint64_t off, size_t n, uint64_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    const uint64_t p = off + i;
    s[i] = static_cast<char>((p >> 12) * 131 + (p & 4095) * 7 + seed * 977 + 1);
  }
  return s;
}

void FillDeleteLoop(const std::string& dir, int rounds, LoopResult* out) {
  std::mt19937_64 rng(15);
  const uint64_t sizes[] = {700, 3000, 64 * kKiB, 300 * kKiB, 2 * kMiB, 9 * kMiB};
  uint64_t next = 0;
  auto note_error = [&](int e, const std::string& what) {
    if (e == ENOSPC) {
      ++out->enospc;
    } else {
      if (out->other_errors++ == 0) out->first_other = what + ": " + strerror(e);
    }
  };
  for (int round = 0; round < rounds; ++round) {
    uint64_t tried = 0;
    while (tried < 120 * kMiB) {
      const std::string name = "f" + std::to_string(next);
      const uint64_t size = sizes[rng() % std::size(sizes)] + rng() % 5000;
      const uint64_t seed = next++;
      tried += size;
      ++out->files;
      int fd = open((dir + "/" + name).c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
      if (fd < 0) {
        note_error(errno, "create " + name);
        continue;
      }
      uint64_t done = 0;
      while (done < size) {
        const std::string piece = Pattern(done, std::min<uint64_t>(kMiB, size - done), seed);
        ssize_t w = write(fd, piece.data(), piece.size());
        if (w < 0) {
          note_error(errno, "write " + name);
          break;
        }
        done += static_cast<uint64_t>(w);
        if (static_cast<size_t>(w) < piece.size()) continue;  // short: the next write says why
      }
      if (next % 10 == 0 && fsync(fd) != 0) note_error(errno, "fsync " + name);
      if (close(fd) != 0) note_error(errno, "close " + name);
      out->kept[name] = {done, seed};
    }
    std::vector<std::string> names;
    for (const auto& [n, f] : out->kept) names.push_back(n);
    std::shuffle(names.begin(), names.end(), rng);
    for (size_t i = 0; i < names.size() / 2; ++i) {
      if (unlink((dir + "/" + names[i]).c_str()) != 0) note_error(errno, "unlink " + names[i]);
      out->kept.erase(names[i]);
    }
  }
}

// "" when every kept file under dir reads back as written.
std::string CheckKept(const std::string& dir, const LoopResult& r) {
  for (const auto& [name, f] : r.kept) {
    int fd = open((dir + "/" + name).c_str(), O_RDONLY);
    if (fd < 0) return name + ": " + strerror(errno);
    std::string got(f.first + 1, '\0');
    ssize_t n = pread(fd, got.data(), got.size(), 0);
    close(fd);
    if (n != static_cast<ssize_t>(f.first)) return name + ": " + std::to_string(n) + " bytes, want " + std::to_string(f.first);
    got.resize(f.first);
    if (got != Pattern(0, f.first, f.second)) return name + ": content differs";
  }
  return "";
}

TEST(FullDeviceFuse, FillDeleteRefillLoopThroughTheMountAndTheKernel) {
  SKIP_IF_NO_FUSE();
  constexpr int kRounds = 20;
  LoopResult ours;
  double ours_secs = 0, kernel_secs = 0;
  {
    Scratch s;
    ASSERT_EQ(mkdir(s.mnt.c_str(), 0755), 0);
    auto mk = RunCommand({UBTRFS_CLI_PATH, "mkfs", "--size", "200M", s.img});
    ASSERT_TRUE(mk.ok()) << mk.Describe();
    {
      MountProcess mount;
      START_MOUNT(mount, s);
      const auto t0 = std::chrono::steady_clock::now();
      FillDeleteLoop(s.mnt, kRounds, &ours);
      ours_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_EQ(ours.other_errors, 0u) << ours.first_other;
      EXPECT_EQ(CheckKept(s.mnt, ours), "");
      std::string err;
      EXPECT_EQ(mount.Unmount(&err), 0) << err << "\nlog: " << mount.Log();
    }
    EXPECT_EQ(BtrfsCheck(s.img), "");
    MountProcess again;
    START_MOUNT(again, s, "-o", "ro");
    EXPECT_EQ(CheckKept(s.mnt, ours), "") << "after remounting";
    std::string err;
    EXPECT_EQ(again.Unmount(&err), 0) << err;
  }
  std::cout << "[ loop     ] ubtrfs mount: " << ours.files << " files tried, " << ours.enospc << " ENOSPC, "
            << ours.kept.size() << " kept, " << ours_secs << " s\n";
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    std::cout << "[ loop     ] kernel row skipped: " << why << "\n";
    return;
  }
  LoopResult kernel;
  {
    Scratch k;
    ASSERT_EQ(mkdir(k.mnt.c_str(), 0755), 0);
    auto mk = RunCommand({UBTRFS_CLI_PATH, "mkfs", "--size", "200M", k.img});
    ASSERT_TRUE(mk.ok()) << mk.Describe();
    LoopMount m;
    ASSERT_EQ(m.Mount(k.img, k.mnt), "");
    const auto t0 = std::chrono::steady_clock::now();
    FillDeleteLoop(k.mnt, kRounds, &kernel);
    kernel_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(kernel.other_errors, 0u) << kernel.first_other;
    EXPECT_EQ(CheckKept(k.mnt, kernel), "");
    ASSERT_EQ(m.Unmount(), "");
    EXPECT_EQ(BtrfsCheck(k.img), "");
  }
  std::cout << "[ loop     ] kernel btrfs: " << kernel.files << " files tried, " << kernel.enospc << " ENOSPC, "
            << kernel.kept.size() << " kept, " << kernel_secs << " s\n";
  EXPECT_LE(ours.enospc, 2 * kernel.enospc + 2) << "ENOSPC counts: ubtrfs " << ours.enospc << ", kernel " << kernel.enospc;
  EXPECT_LE(kernel.enospc, 2 * ours.enospc + 2) << "ENOSPC counts: ubtrfs " << ours.enospc << ", kernel " << kernel.enospc;
}

}  // namespace
