// Images in Ceph RBD (issue 20), against a throwaway single-node cluster on
// 127.0.0.1: the one ./test starts (UBTRFS_CEPH_CONF names its ceph.conf),
// or one this suite starts with scripts/ceph-cluster.sh and stops at its end.
// Every case is skipped, saying why, where Ceph is not installed or the
// cluster does not come up.
//
// What must hold: mkfs --rootdir straight into rbd:rbd/IMAGE and every
// subcommand on it; cp out equals the tree; the image, exported, passes
// btrfs check and a kernel loop mount shows the same tree; a snapshot opens
// read-only at its state; a second writer is refused; a cluster that is down
// is a clear error within a bounded time; kill -9 of the daemon during writes
// leaves the image at its last commit, with everything fsynced; the
// project's FUSE POSIX suite passes on an RBD image. Two cases run a
// bluestore cluster of their own, whose OSD they kill: with the writer
// (everything fsynced survives), and under a running mount (fsync fails in
// bounded time, nothing is committed over the lost write).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "io/rbd_device.h"
#include "support/deadline.h"
#include "support/fuse_mount.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/block_device.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/ubtrfs.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif
#ifndef UBTRFS_SOURCE_DIR
#error "UBTRFS_SOURCE_DIR must name the source tree"
#endif

namespace {

using ubtrfs_test::CommandResult;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;
using Clock = std::chrono::steady_clock;

const std::string kCli = UBTRFS_CLI_PATH;
const std::string kClusterScript = std::string(UBTRFS_SOURCE_DIR) + "/scripts/ceph-cluster.sh";

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// `ubtrfs mount -f IMG MNT` (log in LOG) into `mount`, or skip the test
// where FUSE mounts are refused, or fail it.
#define START_RBD_MOUNT(mount, img, mnt, log)                                          \
  do {                                                                                 \
    std::string skip_, error_;                                                         \
    if (!(mount).Start((img), (mnt), (log), {}, &skip_, &error_)) {                    \
      if (!skip_.empty()) GTEST_SKIP() << skip_;                                       \
      FAIL() << error_;                                                                \
    }                                                                                  \
  } while (0)

// Writes `data` to a new file at `path` and fsyncs it.
::testing::AssertionResult WriteAndFsync(const std::string& path, const std::string& data) {
  const int fd = open(path.c_str(), O_CREAT | O_WRONLY, 0644);
  if (fd < 0) return ::testing::AssertionFailure() << "open " << path << ": " << strerror(errno);
  const bool ok = write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) && fsync(fd) == 0;
  const int err = errno;
  close(fd);
  if (!ok) return ::testing::AssertionFailure() << "write+fsync " << path << ": " << strerror(err);
  return ::testing::AssertionSuccess();
}

// Files DIR/w0, w1, ... of `chunk` written on a thread of its own until
// Stop(), every `fsync_every`-th one (w0, wN, w2N, ...) fsynced; it stops by
// itself at the first failure (the mount died).
class BackgroundWriter {
 public:
  BackgroundWriter(const std::string& dir, std::string chunk, int fsync_every)
      : chunk_(std::move(chunk)), thread_([this, dir, fsync_every] {
          for (int i = 0; !stop_; ++i) {
            const int fd = open((dir + "/w" + std::to_string(i)).c_str(), O_CREAT | O_WRONLY, 0644);
            if (fd < 0) break;
            bool ok = write(fd, chunk_.data(), chunk_.size()) == static_cast<ssize_t>(chunk_.size());
            if (ok && i % fsync_every == 0) ok = fsync(fd) == 0;
            close(fd);
            if (!ok) break;
            written_ = i + 1;
          }
        }) {}
  ~BackgroundWriter() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int written() const { return written_; }

 private:
  const std::string chunk_;
  std::atomic<bool> stop_{false};
  std::atomic<int> written_{0};
  std::thread thread_;
};

// The RBD image NAME of the cluster of CONF, exported to FILE, checked by
// btrfs check ("" clean).
std::string ExportAndCheck(const std::string& conf, const std::string& name, const std::string& file) {
  ::unlink(file.c_str());
  CommandResult r = RunCommand({"rbd", "-c", conf, "export", "--no-progress", "rbd/" + name, file});
  if (!r.ok()) return "rbd export: " + r.Describe();
  return ubtrfs_test::BtrfsCheck(file);
}

class RbdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (const char* c = std::getenv("UBTRFS_CEPH_CONF"); c && *c) {
      if (access(c, R_OK) == 0) {
        conf_ = c;
        return;
      }
      skip_ = std::string("UBTRFS_CEPH_CONF=") + c + " is not readable";
      return;
    }
    if (!ubtrfs::io::RbdSupported()) {
      skip_ = "ubtrfs was built without librbd (apt install librbd-dev librados-dev; scripts/deps.sh does)";
      return;
    }
    for (const char* tool : {"ceph-mon", "ceph-osd", "rbd"}) {
      if (ubtrfs_test::FindProgram(tool).empty()) {
        skip_ = std::string(tool) + " not installed (scripts/deps.sh installs ceph-mon ceph-osd ceph-common)";
        return;
      }
    }
    const auto t0 = Clock::now();
    CommandResult r = RunCommand({kClusterScript, "start"});
    std::string out = r.out;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    if (!r.ok() || out.empty()) {
      skip_ = "the test Ceph cluster did not start (" + kClusterScript + " start): " + r.Describe();
      return;
    }
    conf_ = out.substr(out.rfind('\n') + 1);
    started_ = true;
    std::fprintf(stderr, "note: started a Ceph cluster in %.1f s: %s\n", SecondsSince(t0), conf_.c_str());
  }
  static void TearDownTestSuite() {
    if (started_) {
      CommandResult r = RunCommand({kClusterScript, "stop", conf_});
      if (!r.ok()) std::fprintf(stderr, "warning: stopping the Ceph cluster: %s\n", r.Describe().c_str());
    }
    started_ = false;
    conf_.clear();
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    name_ = std::string("t-") + info->name() + "-" + std::to_string(getpid());
  }
  void TearDown() override {
    if (!skip_.empty()) return;
    for (const auto& n : made_) {
      (void)Rbd({"snap", "purge", "--no-progress", "rbd/" + n});
      (void)Rbd({"rm", "--no-progress", "rbd/" + n});
    }
  }

  // rbd:rbd/NAME:conf=... (NAME: this test's image by default).
  std::string Spec(const std::string& extra = "") {
    if (made_.empty()) made_.push_back(name_);
    return "rbd:rbd/" + name_ + extra + ":conf=" + conf_;
  }
  static CommandResult Cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kCli};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }
  static CommandResult Rbd(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"rbd", "-c", conf_};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }
  // The image as it is now, exported to a file, checked by btrfs check ("" clean).
  std::string ExportAndCheck(const std::string& file) { return ::ExportAndCheck(conf_, name_, file); }

  static std::string conf_, skip_;
  static bool started_;
  std::string name_;
  std::vector<std::string> made_;
};
std::string RbdTest::conf_, RbdTest::skip_;
bool RbdTest::started_ = false;

// The device itself: asynchronous writes are read back at once (before any
// Flush), a gathered write lands in one piece, Flush succeeds, and the
// bounds, the read-only open and the one-writer rule hold.
TEST_F(RbdTest, DeviceReadsItsWritesAndFlushes) {
  const std::string spec = Spec();
  ASSERT_TRUE(ubtrfs::io::CreateRbdImage(spec, 64ull << 20).ok());
  auto size = ubtrfs::io::RbdImageSize(spec);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  ASSERT_TRUE(size->has_value());
  EXPECT_EQ(**size, 64ull << 20);

  auto dev = ubtrfs::io::OpenDevice(spec, {.writable = true});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ((*dev)->Size(), 64ull << 20);
  EXPECT_EQ((*dev)->Name(), "rbd:rbd/" + name_);
  // 4 MiB in 4 KiB writes spanning two RADOS objects, then overwritten in
  // part while the first writes may still be in flight.
  const std::string data = ubtrfs_test::SeededBytes(4 << 20, 7);
  for (size_t off = 0; off < data.size(); off += 4096) {
    ASSERT_TRUE((*dev)->WriteAt((2 << 20) + off, ubtrfs_test::SpanOf(data.substr(off, 4096))).ok());
  }
  const std::string over = ubtrfs_test::SeededBytes(8192, 8);
  ASSERT_TRUE((*dev)->WriteAt((2 << 20) + 4096, ubtrfs_test::SpanOf(over)).ok());
  std::string want = data;
  want.replace(4096, over.size(), over);
  std::string back(want.size(), '\0');
  ASSERT_TRUE((*dev)->ReadAt(2 << 20, std::span(reinterpret_cast<uint8_t*>(back.data()), back.size())).ok());
  EXPECT_TRUE(back == want) << "a read right after the writes saw other bytes";

  const std::string a(5000, 'a'), b(3192, 'b');
  const std::span<const uint8_t> pieces[] = {ubtrfs_test::SpanOf(a), ubtrfs_test::SpanOf(b)};
  ASSERT_TRUE((*dev)->WriteGather(40 << 20, pieces).ok());
  ASSERT_TRUE((*dev)->Flush().ok());

  std::vector<uint8_t> buf(8192);
  auto past = (*dev)->ReadAt((64 << 20) - 4096, buf);
  EXPECT_EQ(past.code(), EIO) << past.ToString();
  auto past_w = (*dev)->WriteAt((64 << 20) - 4096, buf);
  EXPECT_EQ(past_w.code(), ENOSPC) << past_w.ToString();

  // A second writer, in this process, is refused while a reader is not.
  auto second = ubtrfs::io::OpenDevice(spec, {.writable = true});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), EBUSY) << second.status().ToString();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status().message();

  auto ro = ubtrfs::io::OpenDevice(spec);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  ASSERT_TRUE((*ro)->ReadAt(40 << 20, buf).ok());
  EXPECT_EQ(std::string(buf.begin(), buf.end()), a + b);
  EXPECT_EQ((*ro)->WriteAt(0, buf).code(), EROFS);
  dev->reset();
  // The lock went with the writer.
  auto again = ubtrfs::io::OpenDevice(spec, {.writable = true});
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

// mkfs --rootdir of a generated tree straight into the cluster; every
// subcommand works on rbd:; cp out equals the tree; the exported image is
// btrfs-check clean and the kernel sees the same tree.
TEST_F(RbdTest, MkfsRootdirCpOutCheckAndKernelMount) {
  TempDir tmp("ubtrfs-rbd");
  const std::string src = tmp.Sub("src"), out = tmp.Sub("out"), exported = tmp.Sub("exported.img");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  ubtrfs_test::TreeGenOptions gen = ubtrfs_test::ScaledTreeOptions(800);
  ubtrfs_test::GenerateTree(src, 20, gen);
  const std::string img = Spec();

  auto t0 = Clock::now();
  CommandResult r = Cli({"mkfs", "-q", "--size", "512M", "--rootdir", src, img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  std::fprintf(stderr, "note: mkfs --rootdir into RBD: %.2f s\n", SecondsSince(t0));
  r = Rbd({"info", "rbd/" + name_});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("size 512 MiB"), std::string::npos) << r.out;
  r = Cli({"mkfs", "-q", "--size", "512M", img});
  EXPECT_FALSE(r.ok()) << "mkfs over an image holding btrfs without --force";
  EXPECT_NE(r.err.find("already contains a btrfs filesystem"), std::string::npos) << r.err;

  // The library reads it as the tree.
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ubtrfs_test::CompareOptions co;
    co.compare_top_attrs = false;
    auto m = ubtrfs_test::CompareTreeToImage(src, **fs, co);
    EXPECT_TRUE(m.empty()) << ubtrfs_test::FormatMismatches(m);
  }
  r = Cli({"cp", img + ":/", out});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ubtrfs_test::CompareOptions co;
  co.compare_top_attrs = false;
  auto hm = ubtrfs_test::CompareHostTrees(src, out, co);
  EXPECT_TRUE(hm.empty()) << "source vs cp out: " << ubtrfs_test::FormatMismatches(hm);

  // The other subcommands, on the same image.
  const std::string host_file = tmp.Sub("extra");
  ubtrfs_test::WriteHostFile(host_file, ubtrfs_test::SeededBytes(300000, 3));
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"subvolume", "snapshot", img + ":/", img + ":/snap"},
                                             {"info", img},
                                             {"ls", img, "/"},
                                             {"check", img},
                                             {"mkdir", img + ":/added"},
                                             {"cp", host_file, img + ":/added/extra"},
                                             {"stat", img + ":/added/extra"},
                                             {"mv", img + ":/added/extra", img + ":/added/moved"},
                                             {"du", img + ":/added"},
                                             {"df", img},
                                             {"dump-tree", img},
                                             {"stats", img},
                                             {"subvolume", "list", img}}) {
    r = Cli(args);
    EXPECT_TRUE(r.ok()) << ubtrfs_test::ShellJoin(args) << ": " << r.Describe();
  }
  r = Cli({"cat", img, "/added/moved"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_TRUE(r.out == ubtrfs_test::ReadHostFile(host_file)) << "cat of the copied-in file differs";
  r = Cli({"rm", img + ":/added/moved"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  r = Cli({"check", img});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();

  // What the kernel's tools say of the same bytes.
  EXPECT_EQ(ExportAndCheck(exported), "");
  std::string why;
  if (!ubtrfs_test::LoopMountsAvailable(&why)) {
    std::fprintf(stderr, "note: kernel loop mount skipped: %s\n", why.c_str());
    return;
  }
  const std::string mnt = tmp.Sub("mnt");
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ubtrfs_test::LoopMount lm;
  std::string e = lm.Mount(exported, mnt, "ro");
  ASSERT_EQ(e, "") << e;
  auto km = ubtrfs_test::CompareHostTrees(src, mnt + "/snap", co);
  EXPECT_TRUE(km.empty()) << "source vs kernel mount of the exported image: " << ubtrfs_test::FormatMismatches(km);
  struct stat st;
  EXPECT_EQ(stat((mnt + "/added").c_str(), &st), 0);
  EXPECT_NE(stat((mnt + "/added/moved").c_str(), &st), 0);
  EXPECT_EQ(lm.Unmount(), "");
}

// An RBD snapshot shows the filesystem as it was when it was taken, and it
// opens read-only only.
TEST_F(RbdTest, SnapshotOpensReadOnlyAtItsState) {
  TempDir tmp("ubtrfs-rbd-snap");
  const std::string img = Spec(), snap = Spec("@before");
  ASSERT_TRUE(Cli({"mkfs", "-q", "--size", "256M", img}).ok());
  const std::string host = tmp.Sub("f");
  ubtrfs_test::WriteHostFile(host, "first version\n");
  ASSERT_TRUE(Cli({"cp", host, img + ":/kept"}).ok());
  ASSERT_TRUE(Cli({"cp", host, img + ":/removed-later"}).ok());
  CommandResult r = Rbd({"snap", "create", "--no-progress", "rbd/" + name_ + "@before"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ubtrfs_test::WriteHostFile(host, "second version, after the snapshot\n");
  ASSERT_TRUE(Cli({"cp", host, img + ":/added-later"}).ok());
  ASSERT_TRUE(Cli({"rm", img + ":/removed-later"}).ok());

  auto fs = ubtrfs::Filesystem::Open(snap);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_TRUE((*fs)->Lookup("/kept").ok());
  EXPECT_TRUE((*fs)->Lookup("/removed-later").ok());
  EXPECT_EQ((*fs)->Lookup("/added-later").status().code(), ENOENT);
  EXPECT_EQ(ubtrfs_test::ReadImageFile(**fs, "/removed-later"), "first version\n");
  auto now = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ((*now)->Lookup("/removed-later").status().code(), ENOENT);
  EXPECT_TRUE((*now)->Lookup("/added-later").ok());

  ubtrfs::OpenOptions w;
  w.writable = true;
  auto rw = ubtrfs::Filesystem::Open(snap, w);
  ASSERT_FALSE(rw.ok());
  EXPECT_EQ(rw.status().code(), EROFS) << rw.status().ToString();
  r = Cli({"mkdir", snap + ":/nope"});
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.err.find("a snapshot is read-only"), std::string::npos) << r.err;
  r = Cli({"check", snap});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

// One writer: while a process has the image open read-write, another
// process's (and this process's) read-write open is refused with a message
// saying so; readers go on; the writer's close frees it.
TEST_F(RbdTest, SecondWriterIsRefused) {
  const std::string img = Spec();
  ASSERT_TRUE(Cli({"mkfs", "-q", "--size", "256M", img}).ok());
  ubtrfs::OpenOptions w;
  w.writable = true;
  auto first = ubtrfs::Filesystem::Open(img, w);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE((*first)->Mkdir((*first)->Root(), "by-first", {.mode = 0755}).ok());
  ASSERT_TRUE((*first)->Commit().ok());

  const auto t0 = Clock::now();
  CommandResult r = Cli({"mkdir", img + ":/by-second"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("in use: another client holds its exclusive lock"), std::string::npos) << r.Describe();
  EXPECT_LT(SecondsSince(t0), 20.0);
  auto second = ubtrfs::Filesystem::Open(img, w);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), EBUSY) << second.status().ToString();

  r = Cli({"ls", img, "/"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("by-first"), std::string::npos) << r.out;

  // The public API's device open follows the same rule.
  auto dev = ubtrfs::OpenBlockDevice(img, true);
  EXPECT_FALSE(dev.ok());
  first->reset();
  r = Cli({"mkdir", img + ":/by-second"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  auto dev2 = ubtrfs::OpenBlockDevice(img, true);
  ASSERT_TRUE(dev2.ok()) << dev2.status().ToString();
  auto fs = ubtrfs::Filesystem::Open(std::move(*dev2), w);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_TRUE((*fs)->Lookup("/by-second").ok());
}

// A cluster that does not answer: a clear error within the connection
// timeout, with our default (15 s) or one given in the spec; nothing hangs.
TEST_F(RbdTest, ClusterDownIsAClearErrorInBoundedTime) {
  TempDir tmp("ubtrfs-rbd-down");
  // A port with nothing behind it: bound once, then closed.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  close(s);
  std::string conf = ubtrfs_test::ReadHostFile(conf_);
  conf = std::regex_replace(conf, std::regex(R"(127\.0\.0\.1:\d+)"), "127.0.0.1:" + std::to_string(port));
  const std::string bad = tmp.Sub("down.conf");
  ubtrfs_test::WriteHostFile(bad, conf);

  const std::string spec = "rbd:rbd/" + name_ + ":conf=" + bad;
  auto t0 = Clock::now();
  CommandResult r = Cli({"ls", spec + ":client_mount_timeout=2", "/"});
  double took = SecondsSince(t0);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("cannot connect to the Ceph cluster at [v2:127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("client_mount_timeout=2"), std::string::npos) << r.err;
  EXPECT_LT(took, 10.0);

  t0 = Clock::now();
  r = Cli({"mkfs", "-q", "--size", "256M", spec});
  took = SecondsSince(t0);
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("client_mount_timeout=15"), std::string::npos) << r.err;
  EXPECT_GT(took, 10.0);
  EXPECT_LT(took, 30.0);
  std::fprintf(stderr, "note: a cluster that is down: %.1f s to the error with the default timeout\n", took);
  // Nothing was created anywhere.
  EXPECT_FALSE(Rbd({"info", "rbd/" + name_}).ok());
}

// kill -9 of a mount daemon while it writes: the image is at its last
// commit, btrfs-check clean, with everything fsynced before the kill; the
// dead writer's lock is broken for the next writer.
TEST_F(RbdTest, KillDuringWritesLeavesTheLastCommit) {
  SKIP_IF_NO_FUSE();
  TempDir tmp("ubtrfs-rbd-kill");
  const std::string img = Spec(), mnt = tmp.Sub("mnt"), log = tmp.Sub("mount.log");
  ASSERT_TRUE(Cli({"mkfs", "-q", "--size", "512M", img}).ok());
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ubtrfs_test::MountProcess mount;
  START_RBD_MOUNT(mount, img, mnt, log);
  const std::string synced = ubtrfs_test::SeededBytes(3 << 20, 11);
  ASSERT_TRUE(WriteAndFsync(mnt + "/synced", synced));
  // Writes keep going (and some commit) until the kill.
  BackgroundWriter writer(mnt, ubtrfs_test::SeededBytes(256 << 10, 12), 8);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_EQ(kill(mount.pid(), SIGKILL), 0);
  EXPECT_EQ(mount.Wait(30), 128 + SIGKILL);
  writer.Stop();
  mount.Cleanup();
  EXPECT_GT(writer.written(), 8) << "the writer did not get going before the kill";

  EXPECT_EQ(ExportAndCheck(tmp.Sub("exported.img")), "");
  CommandResult r = Cli({"check", img});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    EXPECT_TRUE(ubtrfs_test::ReadImageFile(**fs, "/synced") == synced) << "the fsynced file is not intact";
  }
  // The next writer gets the image once librbd sees the dead owner gone
  // (the OSD drops its watch after osd_client_watch_timeout) and breaks its lock.
  const auto t0 = Clock::now();
  ubtrfs::OpenOptions w;
  w.writable = true;
  ubtrfs::Status last;
  while (SecondsSince(t0) < 90) {
    auto fs = ubtrfs::Filesystem::Open(img, w);
    if (fs.ok()) {
      EXPECT_TRUE((*fs)->Mkdir((*fs)->Root(), "after-the-crash", {.mode = 0755}).ok());
      EXPECT_TRUE((*fs)->Commit().ok());
      last = ubtrfs::Status::Ok();
      break;
    }
    last = fs.status();
    if (last.code() != EBUSY) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  EXPECT_TRUE(last.ok()) << last.ToString();
  std::fprintf(stderr, "note: the next writer got the image %.1f s after the kill\n", SecondsSince(t0));
  EXPECT_EQ(ExportAndCheck(tmp.Sub("exported2.img")), "");
}

// The C API takes rbd: paths too: ubtrfs_mkfs creates the RBD image, a
// second ubtrfs_mkfs refuses it without force, open/write/close/read.
TEST_F(RbdTest, CApiMkfsOpenWriteRead) {
  const std::string img = Spec();
  ASSERT_EQ(ubtrfs_mkfs(img.c_str(), 256ull << 20, 0), 0) << ubtrfs_last_error();
  EXPECT_EQ(ubtrfs_mkfs(img.c_str(), 0, 0), -EEXIST);
  ubtrfs_fs* fs = nullptr;
  ASSERT_EQ(ubtrfs_open(img.c_str(), UBTRFS_OPEN_WRITABLE, &fs), 0) << ubtrfs_last_error();
  ubtrfs_ino root, file;
  ASSERT_EQ(ubtrfs_root(fs, &root), 0);
  ASSERT_EQ(ubtrfs_create(fs, root, "from-c", 0644, &file), 0) << ubtrfs_last_error();
  ASSERT_EQ(ubtrfs_write(fs, file, 0, "hello rbd\n", 10), 10) << ubtrfs_last_error();
  ubtrfs_fs* other = nullptr;
  EXPECT_EQ(ubtrfs_open(img.c_str(), UBTRFS_OPEN_WRITABLE, &other), -EBUSY);
  ASSERT_EQ(ubtrfs_close(fs), 0) << ubtrfs_last_error();
  ASSERT_EQ(ubtrfs_open(img.c_str(), 0, &fs), 0) << ubtrfs_last_error();
  ASSERT_EQ(ubtrfs_lookup(fs, "/from-c", &file), 0);
  char buf[32] = {};
  EXPECT_EQ(ubtrfs_read(fs, file, 0, buf, sizeof buf), 10);
  EXPECT_STREQ(buf, "hello rbd\n");
  EXPECT_EQ(ubtrfs_close(fs), 0);
}

// `ubtrfs mount` without -f: the daemon opens the RBD image after its fork
// (librados threads do not survive one), the command returns once it is
// mounted, and an error of the daemon's open reaches the command's exit code
// and stderr. The unmount ends the daemon and frees the lock.
TEST_F(RbdTest, DaemonMountReportsItsOpen) {
  SKIP_IF_NO_FUSE();
  TempDir tmp("ubtrfs-rbd-daemon");
  const std::string img = Spec(), mnt = tmp.Sub("mnt"), mnt2 = tmp.Sub("mnt2");
  ASSERT_TRUE(Cli({"mkfs", "-q", "--size", "256M", img}).ok());
  ASSERT_TRUE(Cli({"mkdir", img + ":/here"}).ok());
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(mnt2.c_str(), 0755), 0);
  CommandResult r = Cli({"mount", img, mnt});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  struct stat st;
  EXPECT_EQ(stat((mnt + "/here").c_str(), &st), 0);
  ubtrfs_test::WriteHostFile(mnt + "/through-the-daemon", "x");
  // /proc/mounts (world-readable) names the image without its options.
  {
    std::ifstream mounts("/proc/mounts");
    std::string source, point, line;
    bool found = false;
    while (std::getline(mounts, line)) {
      std::istringstream fields(line);
      fields >> source >> point;
      if (point == mnt) {
        found = true;
        EXPECT_EQ(source, "rbd:rbd/" + name_);
      }
    }
    EXPECT_TRUE(found) << mnt << " not in /proc/mounts";
  }
  r = Cli({"mount", img, mnt2});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("in use"), std::string::npos) << r.err;
  EXPECT_FALSE(ubtrfs_test::IsUbtrfsMount(mnt2));
  r = RunCommand({"fusermount3", "-u", mnt});
  ASSERT_TRUE(r.ok()) << r.Describe();
  // The daemon commits and closes after the unmount: the next writer gets in.
  const auto t0 = Clock::now();
  do {
    r = Cli({"mkdir", img + ":/after"});
    if (r.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (SecondsSince(t0) < 20);
  EXPECT_TRUE(r.ok()) << r.Describe();
  r = Cli({"ls", img, "/"});
  EXPECT_NE(r.out.find("through-the-daemon"), std::string::npos) << r.out;
}

// The project's POSIX suite (tests/fuse_posix_test.cc), run again by this
// binary with every case on an RBD image of this cluster.
TEST_F(RbdTest, FusePosixSuiteOnRbd) {
  SKIP_IF_NO_FUSE();
  if (geteuid() != 0) GTEST_SKIP() << "the POSIX suite needs root";
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  setenv("UBTRFS_POSIX_RBD_CONF", conf_.c_str(), 1);
  const auto t0 = Clock::now();
  // Each case's progress goes to the log, so that a case that hangs is
  // named, with what the suite and its mount daemons wait for, well before
  // ctest's own timeout (900 s) ends everything without a word. It takes
  // 30 s here, a few minutes under ASan on a busy machine.
  TempDir tmp("ubtrfs-rbd-posix");
  constexpr int kDeadline = 720;
  std::string overdue;
  CommandResult r = ubtrfs_test::RunCommandWithDeadline({self, "--gtest_filter=FusePosix*"}, tmp.Sub("suite.log"),
                                                        kDeadline, {"--gtest_filter=FusePosix", "rbd/posix-"}, &overdue);
  unsetenv("UBTRFS_POSIX_RBD_CONF");
  std::fprintf(stderr, "note: the FUSE POSIX suite on RBD took %.1f s\n", SecondsSince(t0));
  if (r.exit_code == -2) {
    // The killed daemons' mounts stay behind, dead: lazily unmounted.
    std::ifstream mounts("/proc/mounts");
    for (std::string line; std::getline(mounts, line);) {
      std::istringstream fields(line);
      std::string source, point;
      fields >> source >> point;
      if (source.rfind("rbd:rbd/posix-", 0) == 0) (void)RunCommand({"umount", "-l", point});
    }
  }
  ASSERT_NE(r.exit_code, -2) << "the suite did not end in " << kDeadline << " s; its last output:\n"
                             << r.out.substr(r.out.size() > 6000 ? r.out.size() - 6000 : 0)
                             << "\nwhat its processes wait for:\n"
                             << overdue;
  EXPECT_EQ(r.exit_code, 0) << r.Describe() << "\n" << r.out.substr(r.out.size() > 6000 ? r.out.size() - 6000 : 0);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[  PASSED  \] (\d+) tests?)"))) << r.out;
  EXPECT_GE(std::stoi(m[1].str()), 15) << r.out;
  EXPECT_EQ(r.out.find("SKIPPED"), std::string::npos) << r.out;
}

}  // namespace

namespace {

// A crash of the storage and of the writer at once, on a cluster of its own
// whose OSD keeps its data on disk (bluestore on a sparse file, which
// survives kill -9; memstore does not): the OSD and the mount daemon are
// killed while files are being written, the OSD restarted, and the image is
// at its last commit, btrfs-check clean, with everything fsynced.
// A cluster of its own (bluestore), stopped when it goes; conf() is empty
// and why() says why when it could not start.
class BluestoreCluster {
 public:
  BluestoreCluster() {
    if (!ubtrfs::io::RbdSupported()) {
      why_ = "ubtrfs was built without librbd";
      return;
    }
    for (const char* tool : {"ceph-mon", "ceph-osd", "rbd"}) {
      if (ubtrfs_test::FindProgram(tool).empty()) {
        why_ = std::string(tool) + " not installed (scripts/deps.sh)";
        return;
      }
    }
    setenv("UBTRFS_CEPH_STORE", "bluestore", 1);
    setenv("UBTRFS_CEPH_STORE_BYTES", "2147483648", 1);
    CommandResult started = RunCommand({kClusterScript, "start"});
    unsetenv("UBTRFS_CEPH_STORE");
    unsetenv("UBTRFS_CEPH_STORE_BYTES");
    std::string conf = started.out;
    while (!conf.empty() && conf.back() == '\n') conf.pop_back();
    if (!started.ok() || conf.empty()) {
      why_ = "a bluestore test cluster did not start: " + started.Describe();
      return;
    }
    conf_ = conf;
  }
  ~BluestoreCluster() {
    if (!conf_.empty()) (void)RunCommand({kClusterScript, "stop", conf_});
  }
  const std::string& conf() const { return conf_; }
  const std::string& why() const { return why_; }

 private:
  std::string conf_, why_;
};

TEST(RbdBluestoreTest, OsdAndDaemonKilledLeaveTheLastCommit) {
  SKIP_IF_NO_FUSE();
  BluestoreCluster cluster;
  if (cluster.conf().empty()) GTEST_SKIP() << cluster.why();
  const std::string conf = cluster.conf();

  TempDir tmp("ubtrfs-rbd-osdkill");
  const std::string img = "rbd:rbd/crash:conf=" + conf, mnt = tmp.Sub("mnt"), log = tmp.Sub("mount.log");
  CommandResult r = RunCommand({kCli, "mkfs", "-q", "--size", "512M", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ubtrfs_test::MountProcess mount;
  START_RBD_MOUNT(mount, img, mnt, log);
  const std::string synced = ubtrfs_test::SeededBytes(2 << 20, 21);
  ASSERT_TRUE(WriteAndFsync(mnt + "/synced", synced));
  BackgroundWriter writer(mnt, ubtrfs_test::SeededBytes(128 << 10, 22), 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  r = RunCommand({kClusterScript, "kill-osd", conf});
  EXPECT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(kill(mount.pid(), SIGKILL), 0);
  EXPECT_EQ(mount.Wait(30), 128 + SIGKILL);
  writer.Stop();
  mount.Cleanup();
  const int written = writer.written();
  EXPECT_GT(written, 4) << "the writer did not get going before the kill";
  const int fsynced = written / 4 * 4;  // w0, w4, ... below it were fsynced
  r = RunCommand({kClusterScript, "start-osd", conf});
  ASSERT_TRUE(r.ok()) << r.Describe();

  EXPECT_EQ(ExportAndCheck(conf, "crash", tmp.Sub("exported.img")), "");
  auto fs = ubtrfs::Filesystem::Open(img);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_TRUE(ubtrfs_test::ReadImageFile(**fs, "/synced") == synced) << "the fsynced file is not intact";
  const std::string chunk = ubtrfs_test::SeededBytes(128 << 10, 22);
  for (int i = 0; i < fsynced; i += 4) {
    EXPECT_TRUE(ubtrfs_test::ReadImageFile(**fs, "/w" + std::to_string(i)) == chunk) << "fsynced /w" << i;
  }
  std::fprintf(stderr, "note: %d files written, those up to w%d fsynced, before the OSD and the daemon died\n",
               written, fsynced > 0 ? fsynced - 4 : 0);
}

// The OSD dies under a running mount: the next fsync fails within the
// spec's rados_osd_op_timeout (no hang), saying what failed; the device
// stays failed after the OSD is back (the lost write is not on the image),
// so nothing is committed over it; the unmount's final commit fails too;
// and the image is at its last commit, check-clean, and writable again.
TEST(RbdBluestoreTest, OsdDownMidwayFailsFsyncInBoundedTime) {
  SKIP_IF_NO_FUSE();
  BluestoreCluster cluster;
  if (cluster.conf().empty()) GTEST_SKIP() << cluster.why();
  const std::string conf = cluster.conf();
  TempDir tmp("ubtrfs-rbd-osddown");
  const std::string img = "rbd:rbd/down:conf=" + conf, mnt = tmp.Sub("mnt"), log = tmp.Sub("mount.log");
  CommandResult r = RunCommand({kCli, "mkfs", "-q", "--size", "256M", img});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  ubtrfs_test::MountProcess mount;
  START_RBD_MOUNT(mount, img + ":rados_osd_op_timeout=3", mnt, log);
  const auto fsync_mount = [&] {
    int fd = open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
    int rc = fsync(fd) == 0 ? 0 : errno;
    close(fd);
    return rc;
  };
  const std::string kept = ubtrfs_test::SeededBytes(200000, 31);
  ubtrfs_test::WriteHostFile(mnt + "/kept", kept);
  ASSERT_EQ(fsync_mount(), 0);

  r = RunCommand({kClusterScript, "kill-osd", conf});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ubtrfs_test::WriteHostFile(mnt + "/lost", ubtrfs_test::SeededBytes(200000, 32));
  const auto t0 = Clock::now();
  EXPECT_NE(fsync_mount(), 0) << "fsync with the only OSD down";
  EXPECT_LT(SecondsSince(t0), 20.0);
  r = RunCommand({kClusterScript, "start-osd", conf});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(fsync_mount(), 0) << "a device that lost a write must not commit";
  std::string err;
  EXPECT_NE(mount.Unmount(&err), 0) << "the final commit should have failed: " << mount.Log();
  EXPECT_NE(mount.Log().find("Connection timed out"), std::string::npos) << mount.Log();

  EXPECT_EQ(ExportAndCheck(conf, "down", tmp.Sub("exported.img")), "");
  {
    auto fs = ubtrfs::Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    EXPECT_TRUE(ubtrfs_test::ReadImageFile(**fs, "/kept") == kept);
    EXPECT_EQ((*fs)->Lookup("/lost").status().code(), ENOENT);
  }
  r = RunCommand({kCli, "mkdir", img + ":/writable-again"});
  EXPECT_TRUE(r.ok()) << r.Describe();
}

}  // namespace
