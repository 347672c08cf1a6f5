// Kernel send streams received by ubtrfs into an image, against the
// kernel's own `btrfs receive` of the same streams on a loop mount: a
// subvolume with files, directories, hard links, symlinks, special files,
// xattrs, holes, a reflink and compressed data, changed between six
// read-only snapshots (renames, swaps, moves, unlinks, appends, truncates,
// hole punches, owner, mode and xattr changes); full and incremental
// streams, protocol 1 and protocol 2 with --compressed-data. Then damaged
// streams: cut at every command boundary and at random bytes, and with
// flipped bits, each refused with the command and byte named and the image
// left as committed.
//
// Needs root and working loop mounts; skipped otherwise.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/endian.h"
#include "send/stream.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/send.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

constexpr int kSnapshots = 6;

std::string Ubtrfs() { return UBTRFS_CLI_PATH; }

ubtrfs::StreamSource FromString(const std::string& s) {
  auto pos = std::make_shared<size_t>(0);
  return [&s, pos](std::span<uint8_t> buf) -> ubtrfs::Result<size_t> {
    const size_t n = std::min(buf.size(), s.size() - *pos);
    if (n > 0) std::memcpy(buf.data(), s.data() + *pos, n);
    *pos += n;
    return n;
  };
}

// The source: a kernel filesystem (compress=zstd) with subvolume /sv and
// its read-only snapshots /snap1 .. /snap6, and the streams of each
// protocol: full for snap1, incremental (-p snap[i-1]) for the others.
struct Source {
  std::string why_not;  // set when the machine cannot do this
  TempDir tmp{"recv-src"};
  std::string img = tmp.Sub("src.img"), mnt = tmp.Sub("mnt");
  std::vector<std::string> streams[3];  // [proto]: file names of snap1..snap6
  bool proto2 = false;

  std::string Sh(const std::string& script) { return MustRun({"sh", "-ec", script}); }

  std::string Build() {
    if (mkdir(mnt.c_str(), 0755) != 0) return "mkdir " + mnt;
    if (std::string e = RunMkfs(img, "", 16384, "crc32c", 512ull << 20); !e.empty()) return e;
    LoopMount m;
    if (std::string e = m.Mount(img, mnt, "compress=zstd"); !e.empty()) return e;
    const std::string sv = mnt + "/sv";
    if (std::string e = MustRun({"btrfs", "subvolume", "create", sv}); !e.empty()) return e;
    // State 1.
    mkdir((sv + "/a").c_str(), 0755);
    mkdir((sv + "/a/b").c_str(), 0750);
    mkdir((sv + "/empty").c_str(), 0700);
    WriteHostFile(sv + "/small", "small file\n");
    WriteHostFile(sv + "/a/random", SeededBytes(300000, 1));
    std::string text;
    for (int i = 0; i < 20000; ++i) text += "line " + std::to_string(i) + " of a compressible text\n";
    WriteHostFile(sv + "/a/b/text", text);
    WriteHostFile(sv + "/tochange", SeededBytes(200000, 2));
    WriteHostFile(sv + "/x", "x content");
    WriteHostFile(sv + "/y", "y content");
    if (std::string e = Sh(
            "cd " + sv +
            "\n"
            "dd if=/dev/urandom of=holes bs=4096 count=2 status=none\n"
            "dd if=/dev/urandom of=holes bs=4096 seek=300 count=3 status=none conv=notrunc\n"
            "truncate -s 3M holes\n"
            "cp --reflink=always a/random reflinked\n"
            "ln small a/hardlink\nln small a/b/hardlink2\n"
            "ln -s ../small a/symlink\nln -s /nonexistent/target dangling\n"
            "mkfifo fifo\nmknod chardev c 1 3\n"
            "setfattr -n user.one -v value1 small\nsetfattr -n user.dir -v dirvalue a\n"
            "setfattr -h -n trusted.link -v on-a-symlink a/symlink\n"
            "chown 1000:1001 a/random\nchown -h 7:8 a/symlink\nchmod 4755 x\nchmod 1777 empty\n"
            "touch -d '2001-02-03 04:05:06.789' y\n");
        !e.empty()) {
      return e;
    }
    const std::vector<std::string> changes = {
        // 1 -> 2: renames, a swap, a move between directories, appends.
        "mv x x2\nmv a/b a/b_renamed\nmv y tmp && mv tochange y && mv tmp tochange\n"
        "mv a/random empty/random_moved\necho more >> small\n"
        "dd if=/dev/urandom of=tochange bs=1000 count=10 seek=50 conv=notrunc status=none\n"
        "setfattr -n user.two -v value2 small\n",
        // 2 -> 3: unlinks, a hard link dropped and one added, a truncate, a hole punched.
        "rm a/hardlink\nln empty/random_moved a/random_link\ntruncate -s 1000 y\n"
        "fallocate -p -o 0 -l 8192 holes\nrm dangling\nrmdir a/b_renamed 2>/dev/null || true\n"
        "setfattr -x user.one small\nchmod 0600 small\nchown 5:6 tochange\n",
        // 3 -> 4: a directory tree moved under a new one, new files, a new reflink.
        "mkdir -p new/deep/er\nmv a new/deep/er/a_moved\n"
        "for i in $(seq 1 50); do echo file $i > new/f$i; done\n"
        "cp --reflink=always holes new/holes_clone\nmknod blockdev b 7 200\n",
        // 4 -> 5: rename over an existing file, a file replaced by a directory.
        "echo replacement > new/f2\nmv new/f2 new/f1\nrm new/f3\nmkdir new/f3\necho inside > new/f3/g\n"
        "touch -d '1999-12-31 23:59:59' new/f4\nsetfattr -n user.big -v \"$(head -c 3000 /dev/zero | tr '\\0' z)\" new/f5\n",
        // 5 -> 6: lots gone, some back under old names.
        "rm -r new/deep\necho back > x\nln -s new/f1 new/link_to_f1\n"
        "dd if=/dev/urandom of=new/f6 bs=65536 count=3 status=none\n",
    };
    for (int i = 1; i <= kSnapshots; ++i) {
      if (i > 1) {
        if (std::string e = Sh("cd " + sv + "\n" + changes[i - 2]); !e.empty()) return e;
      }
      if (std::string e = MustRun({"sync"}); !e.empty()) return e;
      if (std::string e = MustRun({"btrfs", "subvolume", "snapshot", "-r", sv, mnt + "/snap" + std::to_string(i)});
          !e.empty()) {
        return e;
      }
    }
    if (std::string e = MustRun({"sync"}); !e.empty()) return e;
    CommandResult help = RunCommand({"btrfs", "send", "--help"});
    proto2 = (help.out + help.err).find("--compressed-data") != std::string::npos;
    for (int proto : {1, 2}) {
      if (proto == 2 && !proto2) continue;
      for (int i = 1; i <= kSnapshots; ++i) {
        const std::string f = tmp.Sub("p" + std::to_string(proto) + "-" + std::to_string(i) + ".stream");
        std::vector<std::string> argv = {"btrfs", "-q", "send", "-f", f};
        if (proto == 2) argv.insert(argv.end(), {"--proto", "2", "--compressed-data"});
        if (i > 1) argv.insert(argv.end(), {"-p", mnt + "/snap" + std::to_string(i - 1)});
        argv.push_back(mnt + "/snap" + std::to_string(i));
        if (std::string e = MustRun(argv); !e.empty()) return e;
        streams[proto].push_back(f);
      }
    }
    return m.Unmount();
  }
};

Source* g_source = nullptr;

class Receive : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_source = new Source;
    std::string why;
    if (!LoopMountsAvailable(&why)) {
      g_source->why_not = "loop mounts unavailable: " + why;
      return;
    }
    if (std::string e = MkfsMissingReason(); !e.empty()) {
      g_source->why_not = e;
      return;
    }
    if (std::string e = g_source->Build(); !e.empty()) g_source->why_not = "building the source failed: " + e;
  }
  static void TearDownTestSuite() {
    delete g_source;
    g_source = nullptr;
  }
  void SetUp() override {
    if (!g_source->why_not.empty()) GTEST_SKIP() << g_source->why_not;
  }

  static std::string UbtrfsMkfs(const std::string& img) {
    return MustRun({Ubtrfs(), "mkfs", "--size", "512M", img});
  }
};

CompareOptions ReceivedCompareOptions() {
  CompareOptions o;
  o.source_only_xattrs.clear();
  return o;
}

// Orphan names are made and renamed in the top directory, so its mtime is
// the time of the receive (kernel and ubtrfs alike) unless the stream sets
// it: where stream `f` of `snap` does not, the top's times are not compared.
CompareOptions ReceivedCompareOptions(const std::string& f, const std::string& snap) {
  CompareOptions o = ReceivedCompareOptions();
  CommandResult d = RunCommand({Ubtrfs(), "receive", "--dump", "-f", f});
  if (!d.ok() || d.out.find("\nutimes          ./" + snap + "/ ") == std::string::npos) {
    o.skip_times = [](const std::string& rel) { return rel.empty(); };
  }
  return o;
}

// Kernel `btrfs receive` and `ubtrfs receive` of the same chain, compared
// after every stream; the ubtrfs image checks clean, lists the subvolumes as
// received and read-only, and the kernel mounts it with the same content.
void ReceiveChainAlike(int proto) {
  const auto& streams = g_source->streams[proto];
  ASSERT_EQ(streams.size(), static_cast<size_t>(kSnapshots));
  TempDir tmp{"recv-dst"};
  const std::string kimg = tmp.Sub("kernel.img"), kmnt = tmp.Sub("kmnt"), uimg = tmp.Sub("ubtrfs.img");
  ASSERT_EQ(mkdir(kmnt.c_str(), 0755), 0);
  ASSERT_EQ(RunMkfs(kimg, "", 16384, "crc32c", 512ull << 20), "");
  ASSERT_EQ(MustRun({Ubtrfs(), "mkfs", "--size", "512M", uimg}), "");
  LoopMount km;
  ASSERT_EQ(km.Mount(kimg, kmnt), "");
  for (int i = 1; i <= kSnapshots; ++i) {
    const std::string& f = streams[i - 1];
    ASSERT_EQ(MustRun({"btrfs", "-q", "receive", "-f", f, kmnt}), "") << f;
    CommandResult r = RunCommand({Ubtrfs(), "receive", "-v", "-f", f, uimg});
    ASSERT_TRUE(r.ok()) << f << ": " << r.Describe();
    const std::string snap = "snap" + std::to_string(i);
    CommandResult d = RunCommand({Ubtrfs(), "receive", "--dump", "-f", f});
    ASSERT_TRUE(d.ok()) << d.Describe();
    // The stream does carry encoded writes (compressed extents sent as they are).
    if (proto == 2 && i == 1) {
      EXPECT_NE(d.out.find("encoded_write"), std::string::npos);
    }
    const CompareOptions opts = ReceivedCompareOptions(f, snap);
    auto fs = ubtrfs::Filesystem::Open(uimg);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto mism = CompareTreeToImage(kmnt + "/" + snap, **fs, opts, "/" + snap);
    EXPECT_TRUE(mism.empty()) << snap << " (proto " << proto << "): " << FormatMismatches(mism);
  }
  ASSERT_EQ(km.Unmount(), "");
  EXPECT_EQ(BtrfsCheck(uimg), "");
  // Encoded writes keep their compressed bytes: as many zstd extent items
  // as the kernel's receive stores (which writes them with ENCODED_WRITE);
  // none from plain protocol 1 writes into an image without compression.
  const auto zstd_items = [](const std::string& img) {
    CommandResult r = RunCommand({"btrfs", "inspect-internal", "dump-tree", img});
    size_t n = 0;
    for (size_t at = r.out.find("extent compression 3"); at != std::string::npos;
         at = r.out.find("extent compression 3", at + 1)) {
      ++n;
    }
    return n;
  };
  const size_t ours = zstd_items(uimg);
  if (proto == 2) {
    EXPECT_GT(ours, 0u);
    EXPECT_EQ(ours, zstd_items(kimg));
  } else {
    EXPECT_EQ(ours, 0u);
  }
  {
    auto fs = ubtrfs::Filesystem::Open(uimg);
    ASSERT_TRUE(fs.ok());
    auto subs = (*fs)->ListSubvolumes();
    ASSERT_TRUE(subs.ok());
    ASSERT_EQ(subs->size(), static_cast<size_t>(kSnapshots));
    for (const auto& s : *subs) {
      EXPECT_TRUE(s.read_only) << s.path;
      EXPECT_NE(s.received_uuid, (std::array<uint8_t, 16>{})) << s.path;
    }
  }
  // The kernel sees the received uuids (its receive of one more stream on
  // top finds the parent by them through the UUID tree) and the same data.
  LoopMount um;
  ASSERT_EQ(um.Mount(uimg, kmnt), "");
  CommandResult show = RunCommand({"btrfs", "subvolume", "show", kmnt + "/snap3"});
  ASSERT_TRUE(show.ok()) << show.Describe();
  EXPECT_NE(show.out.find("Received UUID"), std::string::npos);
  EXPECT_EQ(show.out.find("Received UUID: \t\t-"), std::string::npos) << show.out;
  ASSERT_EQ(MustRun({"btrfs", "subvolume", "delete", kmnt + "/snap6"}), "");
  ASSERT_EQ(MustRun({"btrfs", "-q", "receive", "-f", streams[5], kmnt}), "");
  ASSERT_EQ(um.Unmount(), "");
  EXPECT_EQ(BtrfsCheck(uimg), "");
}

TEST_F(Receive, KernelStreamsProtocol1MatchKernelReceive) { ReceiveChainAlike(1); }

TEST_F(Receive, KernelStreamsProtocol2CompressedMatchKernelReceive) {
  if (!g_source->proto2) GTEST_SKIP() << "btrfs send here has no --compressed-data";
  ReceiveChainAlike(2);
}

TEST_F(Receive, DumpMatchesBtrfsReceiveDump) {
  for (int proto : {1, 2}) {
    for (const std::string& f : g_source->streams[proto]) {
      CommandResult theirs = RunCommand({"btrfs", "receive", "--dump", "-f", f});
      ASSERT_TRUE(theirs.ok()) << theirs.Describe();
      CommandResult ours = RunCommand({Ubtrfs(), "receive", "--dump", "-f", f});
      ASSERT_TRUE(ours.ok()) << ours.Describe();
      // Line by line, so that a difference shows where it is.
      std::vector<std::string> a, b;
      for (size_t p = 0, q; (q = theirs.out.find('\n', p)) != std::string::npos; p = q + 1) a.push_back(theirs.out.substr(p, q - p));
      for (size_t p = 0, q; (q = ours.out.find('\n', p)) != std::string::npos; p = q + 1) b.push_back(ours.out.substr(p, q - p));
      ASSERT_EQ(a.size(), b.size()) << f;
      // btrfs-progs 6.2 separates encoded_write's fields with ", ", later
      // versions (and ubtrfs) with " ".
      for (std::string& line : a) {
        for (size_t at; line.rfind("encoded_write", 0) == 0 && (at = line.find(", ")) != std::string::npos;) {
          line.erase(at, 1);
        }
      }
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(Printable(b[i], 400), Printable(a[i], 400)) << f << " line " << i;
    }
  }
}

// The offsets of every command of a stream (the first at the header's end).
std::vector<size_t> CommandOffsets(const std::string& s) {
  std::vector<size_t> out;
  for (size_t at = ubtrfs::send::kStreamHeaderSize; at + ubtrfs::send::kCmdHeaderSize <= s.size();) {
    out.push_back(at);
    at += ubtrfs::send::kCmdHeaderSize + ubtrfs::format::LoadLe<uint32_t>(s.data() + at);
  }
  return out;
}

// Receives `bytes` into `img` through the library: the status.
ubtrfs::Status ReceiveBytes(const std::string& img, const std::string& bytes) {
  ubtrfs::OpenOptions o;
  o.writable = true;
  auto fs = ubtrfs::Filesystem::Open(img, o);
  if (!fs.ok()) return fs.status();
  return ubtrfs::Receive(**fs, FromString(bytes));
}

// What an image's committed state is, as far as a receive could change it.
std::string Summary(const std::string& img) {
  auto fs = ubtrfs::Filesystem::Open(img);
  if (!fs.ok()) return fs.status().ToString();
  std::string out = "gen " + std::to_string((*fs)->Info().generation) + " bytes_used " +
                    std::to_string((*fs)->Info().bytes_used);
  auto subs = (*fs)->ListSubvolumes();
  if (!subs.ok()) return subs.status().ToString();
  for (const auto& s : *subs) out += " " + s.path;
  return out;
}

TEST_F(Receive, DamagedStreamsChangeNothing) {
  TempDir tmp{"recv-damaged"};
  const std::string img = tmp.Sub("u.img");
  ASSERT_EQ(UbtrfsMkfs(img), "");
  const std::string full = ReadHostFile(g_source->streams[1][0]);
  const std::string incr = ReadHostFile(g_source->streams[1][2]);
  // The image holds snap1 and snap2; the damaged one is snap3's stream.
  ASSERT_TRUE(ReceiveBytes(img, full).ok());
  ASSERT_TRUE(ReceiveBytes(img, ReadHostFile(g_source->streams[1][1])).ok());
  const std::string before = Summary(img);
  ASSERT_EQ(BtrfsCheck(img), "");
  int trials = 0;
  const auto expect_refused = [&](const std::string& bytes, const std::string& what) {
    ++trials;
    ubtrfs::Status st = ReceiveBytes(img, bytes);
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find("send stream"), std::string::npos) << what << ": " << st.ToString();
    EXPECT_NE(st.message().find("byte"), std::string::npos) << what << ": " << st.ToString();
    ASSERT_EQ(Summary(img), before) << what << ": " << st.ToString();
  };
  // Cut at every command boundary (a stream without its END is cut too).
  const auto offs = CommandOffsets(incr);
  ASSERT_GT(offs.size(), 20u);
  for (size_t o : offs) expect_refused(incr.substr(0, o), "cut at command boundary " + std::to_string(o));
  ASSERT_EQ(BtrfsCheck(img), "");
  std::mt19937_64 rng(22);
  for (int i = 0; i < 40; ++i) {
    const size_t cut = rng() % incr.size();
    expect_refused(incr.substr(0, cut), "cut at byte " + std::to_string(cut));
  }
  for (int i = 0; i < 40; ++i) {
    std::string bad = incr;
    // Past the header: a flipped version bit can make a valid v3 stream.
    const size_t at = ubtrfs::send::kStreamHeaderSize + rng() % (bad.size() - ubtrfs::send::kStreamHeaderSize);
    bad[at] = static_cast<char>(bad[at] ^ (1u << (rng() % 8)));
    expect_refused(bad, "bit flipped in byte " + std::to_string(at));
  }
  // A full stream cut late, after its subvolume and much data were applied.
  expect_refused(std::string(full).substr(0, full.size() - 20), "full stream cut 20 bytes short");
  EXPECT_GT(trials, 100);
  EXPECT_EQ(BtrfsCheck(img), "");
  // And the image still takes the good stream.
  ubtrfs::Status st = ReceiveBytes(img, incr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(BtrfsCheck(img), "");
}

TEST_F(Receive, ErrorsNameTheCommandAndLeaveTheImage) {
  TempDir tmp{"recv-errors"};
  const std::string img = tmp.Sub("u.img");
  ASSERT_EQ(UbtrfsMkfs(img), "");
  // An incremental stream without its parent.
  const std::string incr = ReadHostFile(g_source->streams[1][1]);
  ubtrfs::Status st = ReceiveBytes(img, incr);
  EXPECT_EQ(st.code(), ENOENT) << st.ToString();
  EXPECT_NE(st.message().find("command 1 (snapshot) at byte 17"), std::string::npos) << st.ToString();
  // The same subvolume twice: EEXIST, the first copy kept.
  const std::string full = ReadHostFile(g_source->streams[1][0]);
  ASSERT_TRUE(ReceiveBytes(img, full).ok());
  const std::string before = Summary(img);
  st = ReceiveBytes(img, full);
  EXPECT_EQ(st.code(), EEXIST) << st.ToString();
  EXPECT_EQ(Summary(img), before);
  // The CLI says so and exits 1.
  CommandResult r = RunCommand({Ubtrfs(), "receive", "-f", g_source->streams[1][2], img});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("snapshot"), std::string::npos) << r.err;
  EXPECT_EQ(BtrfsCheck(img), "");
}

// ubtrfs to kernel: the snapshots ubtrfs received, sent again by ubtrfs
// (full streams), are accepted by the kernel's btrfs receive and give the
// kernel's original snapshots; ubtrfs to ubtrfs gives them too.
TEST_F(Receive, UbtrfsSendIsAcceptedByKernelReceive) {
  TempDir tmp{"recv-send"};
  const std::string uimg = tmp.Sub("u.img"), u2img = tmp.Sub("u2.img"), kimg = tmp.Sub("k.img");
  const std::string kmnt = tmp.Sub("kmnt"), smnt = tmp.Sub("smnt");
  ASSERT_EQ(mkdir(kmnt.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(smnt.c_str(), 0755), 0);
  ASSERT_EQ(UbtrfsMkfs(uimg), "");
  ASSERT_EQ(UbtrfsMkfs(u2img), "");
  ASSERT_EQ(RunMkfs(kimg, "", 16384, "crc32c", 512ull << 20), "");
  for (int i = 1; i <= kSnapshots; ++i) {
    ASSERT_EQ(MustRun({Ubtrfs(), "receive", "-f", g_source->streams[1][i - 1], uimg}), "");
  }
  LoopMount src, km;
  ASSERT_EQ(src.Mount(g_source->img, smnt, "ro"), "");
  ASSERT_EQ(km.Mount(kimg, kmnt), "");
  // Writable subvolumes are refused, as btrfs send refuses them.
  CommandResult rw = RunCommand({Ubtrfs(), "send", "-f", tmp.Sub("x"), uimg + ":/"});
  EXPECT_EQ(rw.exit_code, 1) << rw.Describe();
  for (int i : {1, 4, 6}) {
    const std::string snap = "snap" + std::to_string(i);
    for (int proto : {1, 2}) {
      const std::string f = tmp.Sub(snap + "-p" + std::to_string(proto) + ".stream");
      ASSERT_EQ(MustRun({Ubtrfs(), "send", "--proto", std::to_string(proto), "-f", f, uimg + ":/" + snap}), "");
      CommandResult dump = RunCommand({"btrfs", "receive", "--dump", "-f", f});
      ASSERT_TRUE(dump.ok()) << dump.Describe();
      if (proto == 1) {
        ASSERT_EQ(MustRun({"btrfs", "-q", "receive", "-f", f, kmnt}), "") << f;
        auto mism = CompareHostTrees(smnt + "/" + snap, kmnt + "/" + snap,
                                     ReceivedCompareOptions(g_source->streams[1][i - 1], snap));
        EXPECT_TRUE(mism.empty()) << snap << ": " << FormatMismatches(mism);
      }
      // Round trip ubtrfs to ubtrfs (the v2 stream into the second image).
      if (proto == 2) {
        ASSERT_EQ(MustRun({Ubtrfs(), "receive", "-f", f, u2img}), "") << f;
        auto fs = ubtrfs::Filesystem::Open(u2img);
        ASSERT_TRUE(fs.ok());
        auto mism = CompareTreeToImage(smnt + "/" + snap, **fs, ReceivedCompareOptions(g_source->streams[1][i - 1], snap),
                                       "/" + snap);
        EXPECT_TRUE(mism.empty()) << snap << " (ubtrfs round trip): " << FormatMismatches(mism);
      }
    }
  }
  ASSERT_EQ(km.Unmount(), "");
  ASSERT_EQ(src.Unmount(), "");
  EXPECT_EQ(BtrfsCheck(kimg), "");
  EXPECT_EQ(BtrfsCheck(u2img), "");
}

}  // namespace
}  // namespace ubtrfs_test
