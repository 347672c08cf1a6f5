// End to end through a real `ubtrfs mount`: ordinary programs doing
// ordinary work in the mount -- cc and make, git clone and git fsck, tar,
// rsync -aHX in and out, mmap -- with the results compared to the source,
// and after every unmount an image that btrfs check finds clean.
// Each case skips (with the reason) when FUSE or its program is missing;
// scripts/deps.sh installs them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "support/fuse_mount.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using ubtrfs_test::BtrfsCheck;
using ubtrfs_test::CompareOptions;
using ubtrfs_test::FindProgram;
using ubtrfs_test::FormatMismatches;
using ubtrfs_test::MountProcess;
using ubtrfs_test::RunCommand;
using ubtrfs_test::Scratch;

#define SKIP_WITHOUT(program)                                                                        \
  do {                                                                                               \
    if (FindProgram(program).empty()) GTEST_SKIP() << program " is not installed (scripts/deps.sh)"; \
  } while (0)

bool WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out << data;
  return static_cast<bool>(out);
}

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Unmounts (the process must exit 0) and runs btrfs check on the image.
void UnmountAndCheck(MountProcess& mount, const Scratch& s, const std::string& what) {
  std::string err;
  EXPECT_EQ(mount.Unmount(&err), 0) << what << ": " << err << "\nlog: " << mount.Log();
  EXPECT_EQ(BtrfsCheck(s.img), "") << what;
}

TEST(FuseE2e, BuildACProjectInTheMount) {
  SKIP_IF_NO_FUSE();
  SKIP_WITHOUT("cc");
  SKIP_WITHOUT("make");
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::string proj = s.mnt + "/proj";
  {
    MountProcess mount;
    START_MOUNT(mount, s);
    ASSERT_EQ(mkdir(proj.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((proj + "/lib").c_str(), 0755), 0);
    ASSERT_TRUE(WriteFile(proj + "/lib/sum.h", "#ifndef SUM_H\n#define SUM_H\nlong sum_to(long n);\n#endif\n"));
    ASSERT_TRUE(WriteFile(proj + "/lib/sum.c",
                          "#include \"sum.h\"\nlong sum_to(long n) { long s = 0; for (long i = 1; i <= n; ++i) s += i; "
                          "return s; }\n"));
    ASSERT_TRUE(WriteFile(proj + "/main.c",
                          "#include <stdio.h>\n#include \"lib/sum.h\"\n"
                          "int main(int argc, char** argv) { (void)argv; printf(\"%ld\\n\", sum_to(1000L * argc)); "
                          "return 0; }\n"));
    // Objects, an archive and the program: make's mtime checks, ar's rewrites
    // and the linker's renames all go through the mount.
    ASSERT_TRUE(WriteFile(proj + "/Makefile",
                          "CFLAGS = -O1 -Wall\n"
                          "prog: main.o libsum.a\n\t$(CC) -o $@ main.o libsum.a\n"
                          "main.o: main.c lib/sum.h\n\t$(CC) $(CFLAGS) -c -o $@ main.c\n"
                          "lib/sum.o: lib/sum.c lib/sum.h\n\t$(CC) $(CFLAGS) -c -o $@ lib/sum.c\n"
                          "libsum.a: lib/sum.o\n\trm -f $@\n\tar rcs $@ lib/sum.o\n"
                          "clean:\n\trm -f prog main.o lib/sum.o libsum.a\n"));
    auto r = RunCommand({"make", "-C", proj});
    ASSERT_TRUE(r.ok()) << r.Describe();
    r = RunCommand({proj + "/prog"});
    ASSERT_TRUE(r.ok()) << r.Describe();
    EXPECT_EQ(r.out, "500500\n");
    // Nothing to do the second time: the times in the mount say so.
    r = RunCommand({"make", "-C", proj, "-q"});
    EXPECT_TRUE(r.ok()) << "make -q after a build: " << r.Describe();
    // A changed source rebuilds what depends on it.
    ASSERT_TRUE(WriteFile(proj + "/lib/sum.c",
                          "#include \"sum.h\"\nlong sum_to(long n) { return n * (n + 1) / 2 + 1; }\n"));
    r = RunCommand({"make", "-C", proj});
    ASSERT_TRUE(r.ok()) << r.Describe();
    EXPECT_NE(r.out.find("ar rcs"), std::string::npos) << r.out;
    r = RunCommand({proj + "/prog"});
    EXPECT_EQ(r.out, "500501\n");
    UnmountAndCheck(mount, s, "after the build");
  }
  // The program survives the remount and still runs.
  MountProcess again;
  START_MOUNT(again, s);
  auto r = RunCommand({proj + "/prog"});
  EXPECT_EQ(r.out, "500501\n") << r.Describe();
  r = RunCommand({"make", "-C", proj, "clean"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  struct stat st;
  EXPECT_NE(stat((proj + "/prog").c_str(), &st), 0);
  UnmountAndCheck(again, s, "after make clean");
}

TEST(FuseE2e, GitCloneAndFsck) {
  SKIP_IF_NO_FUSE();
  SKIP_WITHOUT("git");
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  // A local repository with some history: several commits, a branch, a tag,
  // packed and loose objects.
  const std::string repo = s.dir.Sub("repo");
  auto git = [&](const std::string& dir, std::vector<std::string> args) {
    std::vector<std::string> argv = {"git", "-C", dir, "-c", "user.name=ubtrfs", "-c", "user.email=t@example.org",
                                     "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  };
  ASSERT_EQ(mkdir(repo.c_str(), 0755), 0);
  ASSERT_TRUE(git(repo, {"init", "-q"}).ok());
  std::mt19937_64 rng(5);
  for (int c = 0; c < 12; ++c) {
    for (int f = 0; f < 15; ++f) {
      const std::string dir = repo + "/d" + std::to_string(f % 4);
      mkdir(dir.c_str(), 0755);
      std::string body;
      for (int l = 0; l < 50 + static_cast<int>(rng() % 400); ++l) body += std::to_string(rng()) + "\n";
      ASSERT_TRUE(WriteFile(dir + "/f" + std::to_string(f) + ".txt", body));
    }
    ASSERT_TRUE(git(repo, {"add", "-A"}).ok());
    auto r = git(repo, {"commit", "-q", "-m", "commit " + std::to_string(c)});
    ASSERT_TRUE(r.ok()) << r.Describe();
    if (c == 6) {
      ASSERT_TRUE(git(repo, {"tag", "v1"}).ok());
      ASSERT_TRUE(git(repo, {"gc", "-q"}).ok());
    }
  }
  ASSERT_TRUE(git(repo, {"branch", "side", "v1"}).ok());
  const std::string head = git(repo, {"rev-parse", "HEAD"}).out;

  const std::string clone = s.mnt + "/clone";
  {
    MountProcess mount;
    START_MOUNT(mount, s);
    auto r = RunCommand({"git", "clone", "-q", "--no-local", repo, clone});
    ASSERT_TRUE(r.ok()) << r.Describe();
    r = git(clone, {"fsck", "--full", "--strict"});
    EXPECT_TRUE(r.ok()) << r.Describe();
    EXPECT_EQ(git(clone, {"rev-parse", "HEAD"}).out, head);
    EXPECT_TRUE(git(clone, {"rev-parse", "v1", "origin/side"}).ok());
    // The checkout equals the source's work tree (.git aside).
    CompareOptions opts;
    opts.compare_mtime = opts.compare_dir_mtime = opts.compare_symlink_mtime = false;
    opts.compare_top_attrs = false;
    RunCommand({"mv", repo + "/.git", s.dir.Sub("repo.git")});
    RunCommand({"mv", clone + "/.git", s.mnt + "/clone.git"});
    auto mism = ubtrfs_test::CompareHostTrees(repo, clone, opts);
    EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);
    RunCommand({"mv", s.dir.Sub("repo.git"), repo + "/.git"});
    RunCommand({"mv", s.mnt + "/clone.git", clone + "/.git"});
    // Work in the clone: a commit, a repack.
    ASSERT_TRUE(WriteFile(clone + "/new.txt", "new\n"));
    ASSERT_TRUE(git(clone, {"add", "new.txt"}).ok());
    r = git(clone, {"commit", "-q", "-m", "in the mount"});
    EXPECT_TRUE(r.ok()) << r.Describe();
    r = git(clone, {"repack", "-a", "-d", "-q"});
    EXPECT_TRUE(r.ok()) << r.Describe();
    UnmountAndCheck(mount, s, "after clone, commit and repack");
  }
  MountProcess again;
  START_MOUNT(again, s);
  auto r = git(clone, {"fsck", "--full", "--strict"});
  EXPECT_TRUE(r.ok()) << "after a remount: " << r.Describe();
  EXPECT_EQ(git(clone, {"log", "-1", "--format=%s"}).out, "in the mount\n");
  r = git(clone, {"status", "--porcelain"});
  EXPECT_TRUE(r.ok() && r.out.empty()) << r.Describe();
  UnmountAndCheck(again, s, "after fsck");
}

TEST(FuseE2e, TarExtractAndCompare) {
  SKIP_IF_NO_FUSE();
  SKIP_WITHOUT("tar");
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::string src = s.dir.Sub("src");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ubtrfs_test::GenerateTreeWithStats(src, 21, ubtrfs_test::ScaledTreeOptions(400));
  // The oracle: the same archive extracted on the host (tar drops sockets
  // and turns hard-linked fifos into copies).
  const std::string archive = s.dir.Sub("tree.tar"), hostx = s.dir.Sub("hostx");
  const std::vector<std::string> flags = {"--xattrs", "--xattrs-include=*", "--acls"};
  std::vector<std::string> argv = {"tar"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {"-C", src, "-cf", archive, "."});
  auto r = RunCommand(argv);
  ASSERT_TRUE(r.ok()) << r.Describe();
  CompareOptions opts;
  opts.compare_top_attrs = false;
  {
    MountProcess mount;
    START_MOUNT(mount, s);
    for (const std::string& dest : {hostx, s.mnt + "/x"}) {
      ASSERT_EQ(mkdir(dest.c_str(), 0755), 0);
      argv = {"tar"};
      argv.insert(argv.end(), flags.begin(), flags.end());
      argv.insert(argv.end(), {"--same-owner", "-p", "-C", dest, "-xf", archive});
      r = RunCommand(argv);
      ASSERT_TRUE(r.ok()) << dest << ": " << r.Describe();
    }
    auto mism = ubtrfs_test::CompareHostTrees(hostx, s.mnt + "/x", opts);
    EXPECT_TRUE(mism.empty()) << FormatMismatches(mism);
    // tar's own check: --compare reads every file back.
    r = RunCommand({"tar", "-C", s.mnt + "/x", "--compare", "-f", archive});
    EXPECT_TRUE(r.ok()) << r.Describe();
    UnmountAndCheck(mount, s, "after tar x");
  }
  auto fs = ubtrfs::Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto mism = ubtrfs_test::CompareTreeToImage(hostx, **fs, opts, "/x");
  EXPECT_TRUE(mism.empty()) << "in the image: " << FormatMismatches(mism);
}

TEST(FuseE2e, RsyncInAndOutWithHardLinksAndXattrs) {
  SKIP_IF_NO_FUSE();
  SKIP_WITHOUT("rsync");
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::string src = s.dir.Sub("src"), back = s.dir.Sub("back");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  auto gen = ubtrfs_test::GenerateTreeWithStats(src, 33, ubtrfs_test::ScaledTreeOptions(500));
  ASSERT_GT(gen.hard_links, 0u);
  ASSERT_GT(gen.xattrs, 0u);
  CompareOptions opts;
  opts.compare_top_attrs = false;
  {
    MountProcess mount;
    START_MOUNT(mount, s);
    auto r = RunCommand({"rsync", "-aHXA", "--devices", "--specials", src + "/", s.mnt + "/r/"});
    ASSERT_TRUE(r.ok()) << r.Describe();
    auto mism = ubtrfs_test::CompareHostTrees(src, s.mnt + "/r", opts);
    EXPECT_TRUE(mism.empty()) << "rsync in: " << FormatMismatches(mism);
    // A second run finds nothing to transfer.
    r = RunCommand({"rsync", "-aHXA", "--devices", "--specials", "--itemize-changes", src + "/", s.mnt + "/r/"});
    ASSERT_TRUE(r.ok()) << r.Describe();
    EXPECT_EQ(r.out, "") << "a second rsync saw differences";
    UnmountAndCheck(mount, s, "after rsync in");
  }
  {
    MountProcess mount;
    START_MOUNT(mount, s);
    auto r = RunCommand({"rsync", "-aHXA", "--devices", "--specials", s.mnt + "/r/", back + "/"});
    ASSERT_TRUE(r.ok()) << r.Describe();
    auto mism = ubtrfs_test::CompareHostTrees(src, back, opts);
    EXPECT_TRUE(mism.empty()) << "rsync out: " << FormatMismatches(mism);
    UnmountAndCheck(mount, s, "after rsync out");
  }
}

TEST(FuseE2e, MmapSharedReadsAndWrites) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::string f = s.mnt + "/mapped";
  constexpr size_t kSize = (3 << 20) + 1234;
  std::string want(kSize, '\0');
  std::mt19937_64 rng(9);
  for (auto& c : want) c = static_cast<char>(rng());
  {
    MountProcess mount;
    START_MOUNT(mount, s);
    ASSERT_TRUE(WriteFile(f, want));
    const int fd = open(f.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    void* p = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(p, MAP_FAILED) << strerror(errno);
    char* m = static_cast<char*>(p);
    // Reads through the mapping see what write(2) put there.
    EXPECT_EQ(std::memcmp(m, want.data(), kSize), 0);
    // Stores on scattered pages, the last partial page included.
    for (size_t off : {size_t{0}, size_t{4095}, size_t{4096}, size_t{1} << 20, size_t{(2 << 20) + 7}, kSize - 1}) {
      m[off] = static_cast<char>(~m[off]);
      want[off] = static_cast<char>(~want[off]);
    }
    std::memset(m + 100000, 'M', 50000);
    std::memset(want.data() + 100000, 'M', 50000);
    ASSERT_EQ(msync(m, kSize, MS_SYNC), 0) << strerror(errno);
    // read(2) on another descriptor sees the stores.
    EXPECT_TRUE(ReadWhole(f) == want) << "read after msync";
    ASSERT_EQ(munmap(p, kSize), 0);
    // A write(2) shows through a new mapping.
    ASSERT_EQ(pwrite(fd, "written", 7, 5000), 7);
    std::memcpy(want.data() + 5000, "written", 7);
    p = mmap(nullptr, kSize, PROT_READ, MAP_SHARED, fd, 0);
    ASSERT_NE(p, MAP_FAILED);
    EXPECT_EQ(std::memcmp(p, want.data(), kSize), 0) << "mapping after pwrite";
    munmap(p, kSize);
    close(fd);
    UnmountAndCheck(mount, s, "after mmap writes");
  }
  MountProcess again;
  START_MOUNT(again, s);
  EXPECT_TRUE(ReadWhole(f) == want) << "after a remount";
  const int fd = open(f.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* p = mmap(nullptr, kSize, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(std::memcmp(p, want.data(), kSize), 0) << "mapping after a remount";
  munmap(p, kSize);
  close(fd);
  UnmountAndCheck(again, s, "after the reread");
}

// mount -t fuse.ubtrfs, as an /etc/fstab line would: mount(8) runs
// mount.fuse3, which runs `ubtrfs IMAGE MOUNTPOINT -o OPTIONS` found on the
// default PATH. The test puts our ubtrfs there inside a private mount
// namespace (bind-mounted over /usr/local/sbin), so the system is untouched.
TEST(FuseE2e, MountTypeFuseUbtrfsAsFromFstab) {
  SKIP_IF_NO_FUSE();
  if (geteuid() != 0) GTEST_SKIP() << "needs root (mount(8), a mount namespace)";
  SKIP_WITHOUT("unshare");
  SKIP_WITHOUT("mount.fuse3");
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::string bin = s.dir.Sub("bin");
  ASSERT_EQ(mkdir(bin.c_str(), 0755), 0);
  ASSERT_EQ(symlink(UBTRFS_CLI_PATH, (bin + "/ubtrfs").c_str()), 0);
  // Inside the namespace: mount with fstab-style options (mount(8) drops
  // nofail and x-*), write, read the mount table, unmount with umount(8),
  // then wait for the daemon's final commit by taking the image's lock.
  const std::string script =
      "set -e\n"
      "mount --make-rprivate /\n"
      "mount --bind '" + bin + "' /usr/local/sbin\n"
      "mount -t fuse.ubtrfs -o commit=5,allow_other,nofail,x-systemd.device-timeout=5 '" + s.img + "' '" + s.mnt +
      "'\n"
      "grep ' " + s.mnt + " ' /proc/self/mountinfo\n"
      "echo fstab > '" + s.mnt + "/hello'\n"
      "mkdir '" + s.mnt + "/dir'\n"
      "umount '" + s.mnt + "'\n"
      "flock '" + s.img + "' true\n";
  auto r = RunCommand({"unshare", "-m", "sh", "-c", script});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("fuse.ubtrfs " + s.img), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("allow_other"), std::string::npos) << r.out;
  EXPECT_EQ(BtrfsCheck(s.img), "");
  auto fs = ubtrfs::Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto id = (*fs)->Lookup("/hello");
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  std::string back(16, '\0');
  auto n = (*fs)->Read(*id, 0, std::span(reinterpret_cast<uint8_t*>(back.data()), back.size()));
  ASSERT_TRUE(n.ok());
  back.resize(*n);
  EXPECT_EQ(back, "fstab\n");
  EXPECT_TRUE((*fs)->Lookup("/dir").ok());

  // The helper's own argument shape, run directly: a bad option is refused
  // with a clear message and nothing is mounted.
  r = RunCommand({UBTRFS_CLI_PATH, s.img, s.mnt, "-o", "commit=soon"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("bad commit interval"), std::string::npos) << r.Describe();
  EXPECT_FALSE(ubtrfs_test::IsUbtrfsMount(s.mnt));
  // A mistyped subcommand stays a usage error, not a mount attempt.
  r = RunCommand({UBTRFS_CLI_PATH, "mnt", s.img});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.find("mount:"), std::string::npos) << r.Describe();
}

// umount(8) as the unmount, and SIGTERM: both end in a final commit.
TEST(FuseE2e, UmountCommits) {
  SKIP_IF_NO_FUSE();
  if (geteuid() != 0) GTEST_SKIP() << "umount(8) of a FUSE mount needs root";
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  MountProcess mount;
  START_MOUNT(mount, s, "-o", "commit=0");
  ASSERT_TRUE(WriteFile(s.mnt + "/a", std::string(70000, 'a')));
  auto r = RunCommand({"umount", s.mnt});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(mount.Wait(60), 0) << mount.Log();
  EXPECT_EQ(BtrfsCheck(s.img), "");
  auto fs = ubtrfs::Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto st = (*fs)->Lookup("/a");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*fs)->GetStat(*st)->size, 70000u);
}

}  // namespace
