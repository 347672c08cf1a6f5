// Receive of synthetic streams (StreamWriter) into a fresh image: every
// command, a full stream then an incremental one on top, and the refusals
// (hostile paths, commands out of place, bad encoded lengths), each leaving
// the image as committed. Kernel-made streams: tests/receive_test.cc.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

#include "fs/compress.h"
#include "io/block_device.h"
#include "send/stream.h"
#include "txn/mkfs.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/send.h"

namespace ubtrfs::send {
namespace UBTRFS_UNITY_ID {

class Image {
 public:
  Image() {
    char tmpl[] = "/tmp/recv-unit-XXXXXX";
    int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, 256ll << 20), 0);
    close(fd);
    path_ = tmpl;
    auto dev = io::OpenFileDevice(path_, io::OpenFlags{true});
    EXPECT_TRUE(dev.ok());
    EXPECT_TRUE(txn::MakeFilesystem(dev->get(), txn::MkfsOptions{}).ok());
  }
  ~Image() { unlink(path_.c_str()); }
  std::unique_ptr<Filesystem> Open(bool writable) {
    OpenOptions o;
    o.writable = writable;
    auto fs = Filesystem::Open(path_, o);
    EXPECT_TRUE(fs.ok()) << fs.status().ToString();
    return fs.ok() ? std::move(*fs) : nullptr;
  }
  Status Receive(const std::vector<uint8_t>& stream, ReceiveResult* res = nullptr) {
    auto fs = Open(true);
    size_t pos = 0;
    return ubtrfs::Receive(*fs, [&](std::span<uint8_t> buf) -> Result<size_t> {
      const size_t n = std::min(buf.size(), stream.size() - pos);
      if (n > 0) std::memcpy(buf.data(), stream.data() + pos, n);
      pos += n;
      return n;
    }, {}, res);
  }
  std::string Read(const std::string& path) {
    auto fs = Open(false);
    auto id = fs->Lookup(path);
    if (!id.ok()) return "<" + id.status().ToString() + ">";
    std::string out(1 << 20, '\0');
    auto n = fs->Read(*id, 0, std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()));
    if (!n.ok()) return "<" + n.status().ToString() + ">";
    out.resize(*n);
    return out;
  }
  Stat StatOf(const std::string& path) {
    auto fs = Open(false);
    auto id = fs->Lookup(path);
    EXPECT_TRUE(id.ok()) << path << ": " << id.status().ToString();
    if (!id.ok()) return Stat{};
    return *fs->GetStat(*id);
  }
  std::vector<SubvolumeInfo> Subvolumes() { return *Open(false)->ListSubvolumes(); }
  uint64_t Used() { return Open(false)->Info().bytes_used; }

 private:
  std::string path_;
};

struct Builder {
  std::vector<uint8_t> out;
  StreamWriter w;
  explicit Builder(uint32_t version)
      : w(version, [this](std::span<const uint8_t> b) {
          out.insert(out.end(), b.begin(), b.end());
          return Status::Ok();
        }) {
    EXPECT_TRUE(w.WriteHeader().ok());
  }
  void Cmd(uint16_t cmd, const std::function<void(StreamWriter&)>& attrs) {
    w.Begin(cmd);
    attrs(w);
    EXPECT_TRUE(w.End().ok());
  }
  void Path(uint16_t cmd, const std::string& p, const std::function<void(StreamWriter&)>& more = {}) {
    Cmd(cmd, [&](StreamWriter& w) {
      w.String(kAttrPath, p);
      if (more) more(w);
    });
  }
  void Make(uint16_t cmd, const std::string& tmp, const std::string& final_path, uint64_t ino,
            const std::function<void(StreamWriter&)>& more = {}) {
    Path(cmd, tmp, [&](StreamWriter& w) {
      w.U64(kAttrIno, ino);
      if (more) more(w);
    });
    Cmd(kCmdRename, [&](StreamWriter& w) {
      w.String(kAttrPath, tmp);
      w.String(kAttrPathTo, final_path);
    });
  }
  void Write(const std::string& p, uint64_t off, const std::string& data) {
    Path(kCmdWrite, p, [&](StreamWriter& w) {
      w.U64(kAttrFileOffset, off);
      w.Data(std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
    });
  }
  void End() { Cmd(kCmdEnd, [](StreamWriter&) {}); }
};

const Uuid kU1{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
const Uuid kU2{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i / 7 + seed) % 26);
  return s;
}

// extent_as_sent false: the last encoded write's data goes as a plain write.
std::vector<uint8_t> FullStream(bool extent_as_sent = true) {
  Builder b(2);
  b.Cmd(kCmdSubvol, [](StreamWriter& w) {
    w.String(kAttrPath, "s1");
    w.PutUuid(kAttrUuid, kU1);
    w.U64(kAttrCtransid, 10);
  });
  b.Make(kCmdMkdir, "o257-10-0", "d", 257);
  b.Make(kCmdMkfile, "o258-10-0", "d/f", 258);
  b.Write("d/f", 0, "hello world");
  b.Path(kCmdSetXattr, "d/f", [](StreamWriter& w) {
    w.String(kAttrXattrName, "user.k");
    w.String(kAttrXattrData, "v");
  });
  b.Path(kCmdChown, "d/f", [](StreamWriter& w) {
    w.U64(kAttrUid, 1000);
    w.U64(kAttrGid, 100);
  });
  b.Path(kCmdChmod, "d/f", [](StreamWriter& w) { w.U64(kAttrMode, 0640); });
  b.Path(kCmdTruncate, "d/f", [](StreamWriter& w) { w.U64(kAttrSize, 5); });
  b.Path(kCmdUtimes, "d/f", [](StreamWriter& w) {
    w.Time(kAttrAtime, Timespec{1000, 1});
    w.Time(kAttrMtime, Timespec{2000, 2});
    w.Time(kAttrCtime, Timespec{3000, 3});
  });
  b.Cmd(kCmdLink, [](StreamWriter& w) {
    w.String(kAttrPath, "d/f_link");
    w.String(kAttrPathLink, "d/f");
  });
  b.Make(kCmdSymlink, "o259-10-0", "l", 259, [](StreamWriter& w) { w.String(kAttrPathLink, "d/f"); });
  b.Make(kCmdMkfifo, "o260-10-0", "fifo", 260);
  b.Make(kCmdMksock, "o261-10-0", "sock", 261);
  b.Make(kCmdMknod, "o262-10-0", "chr", 262, [](StreamWriter& w) {
    w.U64(kAttrMode, S_IFCHR | 0600);
    w.U64(kAttrRdev, (1 << 8) | 3);
  });
  // A big file, a clone of part of it, a hole punched, a prealloc.
  b.Make(kCmdMkfile, "o263-10-0", "big", 263);
  b.Write("big", 0, Pattern(40000, 1));
  b.Write("big", 40000, Pattern(25536, 2));
  b.Make(kCmdMkfile, "o264-10-0", "clone", 264);
  b.Path(kCmdClone, "clone", [](StreamWriter& w) {
    w.U64(kAttrFileOffset, 4096);
    w.U64(kAttrCloneLen, 8192);
    w.PutUuid(kAttrCloneUuid, kU1);
    w.U64(kAttrCloneCtransid, 10);
    w.String(kAttrClonePath, "big");
    w.U64(kAttrCloneOffset, 16384);
  });
  b.Path(kCmdFallocate, "big", [](StreamWriter& w) {
    w.U32(kAttrFallocateMode, 3);  // PUNCH_HOLE | KEEP_SIZE
    w.U64(kAttrFileOffset, 8192);
    w.U64(kAttrSize, 4096);
  });
  // Encoded writes: zstd and lzo, a piece out of the middle of the extent.
  const std::string plain = Pattern(131072, 3);
  const std::span<const uint8_t> pspan(reinterpret_cast<const uint8_t*>(plain.data()), plain.size());
  b.Make(kCmdMkfile, "o265-10-0", "enc", 265);
  for (auto [comp, type, off] : {std::tuple{kEncodedZstd, format::kCompressZstd, uint64_t{0}},
                                 std::tuple{kEncodedLzo4k, format::kCompressLzo, uint64_t{131072}}}) {
    auto z = fs::Compress(type, pspan, 4096);
    EXPECT_TRUE(z.ok());
    // (copies: a lambda may not name a structured binding before clang 16)
    b.Path(kCmdEncodedWrite, "enc", [&, comp = comp, off = off](StreamWriter& w) {
      w.U64(kAttrFileOffset, off);
      w.U64(kAttrUnencodedFileLen, 65536);
      w.U64(kAttrUnencodedLen, 131072);
      w.U64(kAttrUnencodedOffset, 4096);
      w.U32(kAttrCompression, comp);
      w.Data(*z);
    });
  }
  // One that is a whole extent from its start: stored compressed as sent.
  if (!extent_as_sent) {
    b.Write("enc", 262144, plain.substr(0, 131072 - 100));
  } else {
    auto z = fs::Compress(format::kCompressZstd, pspan, 4096);
    EXPECT_TRUE(z.ok());
    b.Path(kCmdEncodedWrite, "enc", [&](StreamWriter& w) {
      w.U64(kAttrFileOffset, 262144);
      w.U64(kAttrUnencodedFileLen, 131072 - 100);  // the file's end inside the last sector
      w.U64(kAttrUnencodedLen, 131072);
      w.U64(kAttrUnencodedOffset, 0);
      w.U32(kAttrCompression, kEncodedZstd);
      w.Data(*z);
    });
  }
  b.Path(kCmdFileattr, "enc", [](StreamWriter& w) { w.U64(kAttrFileattr, 0); });
  b.Path(kCmdUpdateExtent, "enc", [](StreamWriter& w) {
    w.U64(kAttrFileOffset, 0);
    w.U64(kAttrSize, 4096);
  });
  b.Path(kCmdUtimes, "", [](StreamWriter& w) {
    w.Time(kAttrAtime, Timespec{5, 0});
    w.Time(kAttrMtime, Timespec{6, 0});
    w.Time(kAttrCtime, Timespec{7, 0});
  });
  b.End();
  return b.out;
}

TEST(Receive, EveryCommandOfAFullStreamThenAnIncrementalOne) {
  Image im;
  ReceiveResult res;
  Status st = im.Receive(FullStream(), &res);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(res.subvolumes.size(), 1u);
  EXPECT_EQ(res.subvolumes[0].name, "s1");
  EXPECT_EQ(res.clones, 1u);
  EXPECT_EQ(res.encoded_writes, 3u);
  EXPECT_EQ(im.Read("/s1/d/f"), "hello");
  EXPECT_EQ(im.Read("/s1/d/f_link"), "hello");
  Stat f = im.StatOf("/s1/d/f");
  EXPECT_EQ(f.mode, S_IFREG | 0640u);
  EXPECT_EQ(f.uid, 1000u);
  EXPECT_EQ(f.gid, 100u);
  EXPECT_EQ(f.nlink, 2u);
  EXPECT_EQ(f.mtime.sec, 2000);
  EXPECT_EQ(f.mtime.nsec, 2u);
  EXPECT_EQ(f.atime.sec, 1000);
  EXPECT_EQ(im.StatOf("/s1").mtime.sec, 6);
  EXPECT_EQ(im.StatOf("/s1/fifo").mode & S_IFMT, static_cast<uint32_t>(S_IFIFO));
  EXPECT_EQ(im.StatOf("/s1/sock").mode & S_IFMT, static_cast<uint32_t>(S_IFSOCK));
  EXPECT_EQ(im.StatOf("/s1/chr").rdev, (1u << 8) | 3u);
  {
    auto fs = im.Open(false);
    EXPECT_EQ(*fs->ReadLink(*fs->Lookup("/s1/l")), "d/f");
    EXPECT_EQ(*fs->GetXattr(*fs->Lookup("/s1/d/f"), "user.k"), "v");
  }
  const std::string big = Pattern(40000, 1) + Pattern(25536, 2);
  std::string want_big = big;
  std::fill(want_big.begin() + 8192, want_big.begin() + 12288, '\0');
  EXPECT_TRUE(im.Read("/s1/big") == want_big);
  EXPECT_TRUE(im.Read("/s1/clone") == std::string(4096, '\0') + big.substr(16384, 8192));
  const std::string plain = Pattern(131072, 3);
  EXPECT_TRUE(im.Read("/s1/enc") == plain.substr(4096, 65536) + std::string(65536, '\0') + plain.substr(4096, 65536) +
                                      std::string(65536, '\0') + plain.substr(0, 131072 - 100));
  // Stored compressed: the same stream with that range as a plain write
  // takes about its 128 KiB more.
  {
    Image plain_im;
    ASSERT_TRUE(plain_im.Receive(FullStream(false)).ok());
    EXPECT_TRUE(plain_im.Read("/s1/enc") == im.Read("/s1/enc"));
    EXPECT_GE(plain_im.Used(), im.Used() + 96 * 1024) << plain_im.Used() << " vs " << im.Used();
  }
  auto subs = im.Subvolumes();
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_TRUE(subs[0].read_only);
  EXPECT_EQ(subs[0].received_uuid, kU1);

  // The incremental stream: a snapshot of s1 (found by its received uuid).
  Builder b(1);
  b.Cmd(kCmdSnapshot, [](StreamWriter& w) {
    w.String(kAttrPath, "s2");
    w.PutUuid(kAttrUuid, kU2);
    w.U64(kAttrCtransid, 20);
    w.PutUuid(kAttrCloneUuid, kU1);
    w.U64(kAttrCloneCtransid, 10);
  });
  b.Cmd(kCmdRename, [](StreamWriter& w) {
    w.String(kAttrPath, "d/f");
    w.String(kAttrPathTo, "d/renamed");
  });
  b.Path(kCmdUnlink, "d/f_link");
  b.Path(kCmdRemoveXattr, "d/renamed", [](StreamWriter& w) { w.String(kAttrXattrName, "user.k"); });
  b.Write("d/renamed", 5, " again");
  b.Path(kCmdUnlink, "fifo");
  b.Make(kCmdMkfile, "o300-20-0", "d/from_s1", 300);
  b.Path(kCmdClone, "d/from_s1", [](StreamWriter& w) {
    w.U64(kAttrFileOffset, 0);
    w.U64(kAttrCloneLen, 65536);
    w.PutUuid(kAttrCloneUuid, kU1);  // the parent, by received uuid
    w.U64(kAttrCloneCtransid, 10);
    w.String(kAttrClonePath, "big");
    w.U64(kAttrCloneOffset, 0);
  });
  b.End();
  st = im.Receive(b.out, &res);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(res.subvolumes.size(), 1u);
  EXPECT_TRUE(res.subvolumes[0].snapshot);
  EXPECT_EQ(im.Read("/s2/d/renamed"), "hello again");
  EXPECT_EQ(im.Read("/s1/d/f"), "hello");  // the parent is untouched
  EXPECT_EQ(im.StatOf("/s2/d/renamed").nlink, 1u);
  EXPECT_TRUE(im.Read("/s2/d/from_s1") == want_big.substr(0, 65536));
  EXPECT_NE(im.Read("/s2/fifo").find("No such file"), std::string::npos);
  subs = im.Subvolumes();
  ASSERT_EQ(subs.size(), 2u);
  EXPECT_EQ(subs[1].received_uuid, kU2);
  EXPECT_EQ(subs[1].parent_uuid, subs[0].uuid);
  EXPECT_TRUE(subs[1].read_only);
}

// A stream that goes wrong at its last command: nothing of it stays.
void ExpectRefused(Image& im, const std::function<void(Builder&)>& body, int code, const std::string& msg) {
  Builder b(2);
  b.Cmd(kCmdSubvol, [](StreamWriter& w) {
    w.String(kAttrPath, "bad");
    w.PutUuid(kAttrUuid, kU2);
    w.U64(kAttrCtransid, 1);
  });
  b.Make(kCmdMkfile, "o257-1-0", "f", 257);
  b.Write("f", 0, "data");
  body(b);
  b.End();
  Status st = im.Receive(b.out);
  EXPECT_EQ(st.code(), code) << st.ToString();
  EXPECT_NE(st.message().find(msg), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("at byte"), std::string::npos) << st.ToString();
  EXPECT_TRUE(im.Subvolumes().empty());
}

TEST(Receive, RefusalsLeaveNothing) {
  Image im;
  ExpectRefused(im, [](Builder& b) { b.Write("../escape", 0, "x"); }, EINVAL, "(write)");
  ExpectRefused(im, [](Builder& b) { b.Write("./f", 0, "x"); }, EINVAL, ". or ..");
  ExpectRefused(im, [](Builder& b) { b.Write("missing", 0, "x"); }, ENOENT, "path \"missing\"");
  ExpectRefused(im, [](Builder& b) {
    b.Path(kCmdEncodedWrite, "f", [](StreamWriter& w) {
      w.U64(kAttrFileOffset, 0);
      w.U64(kAttrUnencodedFileLen, 8192);
      w.U64(kAttrUnencodedLen, 4096);
      w.U64(kAttrUnencodedOffset, 0);
      w.U32(kAttrCompression, kEncodedZstd);
      w.Data(std::vector<uint8_t>(10));
    });
  }, EINVAL, "past unencoded_len");
  ExpectRefused(im, [](Builder& b) {
    b.Path(kCmdEncodedWrite, "f", [](StreamWriter& w) {
      w.U64(kAttrFileOffset, 0);
      w.U64(kAttrUnencodedFileLen, 4096);
      w.U64(kAttrUnencodedLen, 4096);
      w.U64(kAttrUnencodedOffset, 0);
      w.U32(kAttrCompression, kEncodedZstd);
      w.Data(std::vector<uint8_t>(10, 0xee));  // not zstd
    });
  }, EUCLEAN, "(encoded_write)");
  ExpectRefused(im, [](Builder& b) { b.Path(kCmdTruncate, "f"); }, EINVAL, "no size attribute");
  ExpectRefused(im, [](Builder& b) {
    b.Cmd(kCmdSubvol, [](StreamWriter& w) {
      w.String(kAttrPath, "a/b");
      w.PutUuid(kAttrUuid, kU1);
      w.U64(kAttrCtransid, 1);
    });
  }, EINVAL, "(subvol)");
  // A command before any subvolume.
  Builder b(1);
  b.Write("f", 0, "x");
  b.End();
  Status st = im.Receive(b.out);
  EXPECT_NE(st.message().find("command 1 (write) at byte 17: comes before any subvol"), std::string::npos)
      << st.ToString();
}

TEST(Send, FullStreamOfAReceivedSubvolumeReceivesAlike) {
  Image a, b;
  ASSERT_TRUE(a.Receive(FullStream()).ok());
  std::vector<uint8_t> stream;
  {
    auto fs = a.Open(false);
    const auto sink = [&](std::span<const uint8_t> bytes) {
      stream.insert(stream.end(), bytes.begin(), bytes.end());
      return Status::Ok();
    };
    EXPECT_EQ(ubtrfs::Send(*fs, fs->Root(), sink).code(), EINVAL);  // the top level
    ASSERT_TRUE(ubtrfs::Send(*fs, *fs->Lookup("/s1"), sink).ok());
  }
  ReceiveResult res;
  Status st = b.Receive(stream, &res);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(res.subvolumes.size(), 1u);
  EXPECT_EQ(res.subvolumes[0].name, "s1");
  for (const char* p : {"/s1/d/f", "/s1/d/f_link", "/s1/big", "/s1/clone", "/s1/enc"}) {
    EXPECT_TRUE(a.Read(p) == b.Read(p)) << p;
    Stat x = a.StatOf(p), y = b.StatOf(p);
    EXPECT_EQ(x.mode, y.mode) << p;
    EXPECT_EQ(x.uid, y.uid) << p;
    EXPECT_EQ(x.nlink, y.nlink) << p;
    EXPECT_EQ(x.size, y.size) << p;
    EXPECT_EQ(x.mtime.sec, y.mtime.sec) << p;
    EXPECT_EQ(x.mtime.nsec, y.mtime.nsec) << p;
  }
  EXPECT_EQ(b.StatOf("/s1").mtime.sec, 6);
  EXPECT_EQ(b.StatOf("/s1/chr").rdev, a.StatOf("/s1/chr").rdev);
  EXPECT_EQ(b.StatOf("/s1/sock").mode, a.StatOf("/s1/sock").mode);
  auto fs = b.Open(false);
  EXPECT_EQ(*fs->GetXattr(*fs->Lookup("/s1/d/f"), "user.k"), "v");
  EXPECT_EQ(*fs->ReadLink(*fs->Lookup("/s1/l")), "d/f");
  // A subvolume that was itself received is named by its received uuid, as
  // the kernel's send names it (so chains stay linked across hops).
  auto sent = a.Subvolumes();
  auto got = b.Subvolumes();
  ASSERT_EQ(got.size(), 1u);
  ASSERT_NE(sent[0].received_uuid, decltype(sent[0].received_uuid){});
  EXPECT_EQ(got[0].received_uuid, sent[0].received_uuid);
  EXPECT_NE(got[0].received_uuid, sent[0].uuid);
}

}  // namespace
}  // namespace ubtrfs::send
