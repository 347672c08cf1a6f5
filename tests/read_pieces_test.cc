// Filesystem::ReadPieces (fs/read_pieces.cc), the FUSE mount's read path:
// whole sectors of plain extents come in place from a map of the image
// file, everything else from the caller's scratch buffer. Whatever the
// extents, the pieces put together equal what Read gives; a sector whose
// checksum fails in the map is read again the way Read reads it (the other
// copy of DUP data, else the error Read names).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_util.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/mkfs.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

constexpr uint64_t K = 1024;

// Sector i of a pattern file starts with its own marker, so that its copies
// can be found in the image.
std::string Pattern(size_t sectors, const std::string& tag) {
  std::string s(sectors * 4096, '\0');
  for (size_t i = 0; i < sectors; ++i) {
    char mark[48];
    std::snprintf(mark, sizeof(mark), "<%s sector %06zu>", tag.c_str(), i);
    for (size_t j = 0; j < 4096; ++j) s[i * 4096 + j] = static_cast<char>((i * 7 + j * 13 + j / 97) % 256);
    std::memcpy(&s[i * 4096], mark, std::strlen(mark));
  }
  return s;
}

std::string MakeImage(const TempDir& dir, const std::string& data_profile = "") {
  const std::string img = dir.path() + "/r.img";
  ubtrfs::MkfsSpec spec;
  spec.images = {img};
  spec.size = 256ull << 20;
  spec.data_profile = data_profile;
  ubtrfs::Status st = ubtrfs::Mkfs(spec);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return img;
}

std::unique_ptr<ubtrfs::Filesystem> Open(const std::string& img, bool writable, ubtrfs::CompressOptions c = {}) {
  ubtrfs::OpenOptions o;
  o.writable = writable;
  o.compress = c;
  auto fs = ubtrfs::Filesystem::Open(img, o);
  EXPECT_TRUE(fs.ok()) << fs.status().ToString();
  return fs.ok() ? std::move(*fs) : nullptr;
}

ubtrfs::InodeId NewFile(ubtrfs::Filesystem& fs, const std::string& name) {
  ubtrfs::NewInode a;
  a.mode = 0644;
  auto root = fs.Lookup("/");
  EXPECT_TRUE(root.ok());
  auto c = fs.Create(*root, name, a);
  EXPECT_TRUE(c.ok()) << name << ": " << c.status().ToString();
  return c.ok() ? *c : ubtrfs::InodeId{};
}

void Put(ubtrfs::Filesystem& fs, ubtrfs::InodeId f, uint64_t off, const std::string& bytes) {
  for (size_t done = 0; done < bytes.size(); done += 1 << 20) {
    const size_t n = std::min<size_t>(1 << 20, bytes.size() - done);
    auto w = fs.Write(f, off + done, std::span(reinterpret_cast<const uint8_t*>(bytes.data()) + done, n));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
  }
}

// What one ReadPieces call gave, put together, and how.
struct Pieced {
  ubtrfs::Status status;
  std::string bytes;
  int sends = 0;
  size_t mapped = 0;  // bytes of pieces outside the scratch buffer
};

Pieced ReadByPieces(ubtrfs::Filesystem& fs, ubtrfs::InodeId f, uint64_t off, size_t size) {
  std::vector<uint8_t> scratch(size);
  Pieced out;
  auto n = fs.ReadPieces(f, off, scratch, [&](std::span<const ubtrfs::Filesystem::ReadPiece> pieces) {
    ++out.sends;
    for (const auto& p : pieces) {
      out.bytes.append(reinterpret_cast<const char*>(p.data), p.size);
      if (p.data < scratch.data() || p.data >= scratch.data() + scratch.size()) out.mapped += p.size;
    }
  });
  out.status = n.status();
  if (n.ok() && *n != out.bytes.size()) {
    out.status = ubtrfs::Status::Invalid("returned " + std::to_string(*n) + ", pieces hold " +
                                         std::to_string(out.bytes.size()));
  }
  return out;
}

std::string ReadPlain(ubtrfs::Filesystem& fs, ubtrfs::InodeId f, uint64_t off, size_t size, ubtrfs::Status* st) {
  std::vector<uint8_t> buf(size);
  auto n = fs.Read(f, off, buf);
  *st = n.status();
  return n.ok() ? std::string(buf.begin(), buf.begin() + static_cast<long>(*n)) : "";
}

TEST(ReadPieces, EveryKindOfExtentReadsAsReadGivesIt) {
  TempDir dir;
  const std::string img = MakeImage(dir);
  const std::string big = Pattern(768, "big");  // 3 MiB
  {
    auto fs = Open(img, true);
    ASSERT_TRUE(fs);
    // Plain extents, one overwritten in the middle, a hole, a tail after it.
    ubtrfs::InodeId b = NewFile(*fs, "big");
    Put(*fs, b, 0, big);
    Put(*fs, b, 1000 * K, Pattern(3, "over"));
    Put(*fs, b, 5 * 1024 * K, Pattern(5, "tail"));
    Put(*fs, NewFile(*fs, "small"), 0, "a small file, stored inline");
    // Preallocated space with data written into its middle.
    ubtrfs::InodeId pre = NewFile(*fs, "prealloc");
    ASSERT_TRUE(fs->Fallocate(pre, 0, 0, 1024 * K).ok());
    Put(*fs, pre, 256 * K, Pattern(4, "pre"));
    // A clone of the middle of big: an extent item that starts inside its
    // disk extent.
    ubtrfs::InodeId cl = NewFile(*fs, "clone");
    ASSERT_TRUE(fs->Clone(b, 12 * K, cl, 4 * K, 256 * K).ok());
    ASSERT_TRUE(fs->Commit().ok());
  }
  {
    ubtrfs::CompressOptions z;
    ASSERT_TRUE(ubtrfs::ParseCompressSpec("zstd", &z).ok());
    auto fs = Open(img, true, z);
    ASSERT_TRUE(fs);
    Put(*fs, NewFile(*fs, "packed"), 0, std::string(300 * K, 'z') + Pattern(2, "packed"));
    ASSERT_TRUE(fs->Commit().ok());
  }
  struct Window {
    uint64_t off;
    size_t size;
  };
  const std::vector<Window> windows = {{0, 1024 * K},         {4096, 8192},         {100, 200000},
                                       {990 * K, 64 * K},     {3 * 1024 * K - 4096, 1024 * K},
                                       {5 * 1024 * K + 1, 9000}, {0, 8 * 1024 * K}, {64 * 1024 * K, 4096}};
  // Writable (the operation lock held while the pieces are handed on) and
  // read-only.
  for (bool writable : {true, false}) {
    auto fs = Open(img, writable);
    ASSERT_TRUE(fs);
    size_t mapped = 0;
    for (const char* name : {"big", "small", "prealloc", "clone", "packed"}) {
      auto f = fs->Lookup(std::string("/") + name);
      ASSERT_TRUE(f.ok()) << name;
      for (const Window& w : windows) {
        ubtrfs::Status st;
        const std::string want = ReadPlain(*fs, *f, w.off, w.size, &st);
        ASSERT_TRUE(st.ok()) << name << " " << w.off << ": " << st.ToString();
        Pieced got = ReadByPieces(*fs, *f, w.off, w.size);
        ASSERT_TRUE(got.status.ok()) << name << " " << w.off << ": " << got.status.ToString();
        EXPECT_EQ(got.sends, 1) << name << " " << w.off;
        EXPECT_TRUE(got.bytes == want) << name << " at " << w.off << " +" << w.size << ": " << got.bytes.size()
                                       << " bytes, Read gives " << want.size();
        mapped += got.mapped;
      }
    }
    // The plain extents came from the map, not through the scratch buffer.
    EXPECT_GE(mapped, 3 * 1024 * K) << (writable ? "writable" : "read-only");
  }
  // The file's own bytes, as a check of Read itself.
  auto fs = Open(img, false);
  auto b = fs->Lookup("/big");
  ASSERT_TRUE(b.ok());
  Pieced whole = ReadByPieces(*fs, *b, 0, 3 * 1024 * K);
  std::string want = big;
  want.replace(1000 * K, 3 * 4096, Pattern(3, "over"));
  EXPECT_TRUE(whole.bytes == want);
}

// Offsets in the image file where `marker` starts a sector.
std::vector<uint64_t> FindSector(const std::string& img, const std::string& marker) {
  std::vector<uint64_t> at;
  int fd = ::open(img.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  std::vector<char> buf(1 << 20);
  for (uint64_t off = 0;; off += buf.size()) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
    if (n <= 0) break;
    for (ssize_t s = 0; s + static_cast<ssize_t>(marker.size()) <= n; s += 4096) {
      if (std::memcmp(&buf[s], marker.data(), marker.size()) == 0) at.push_back(off + s);
    }
  }
  ::close(fd);
  return at;
}

// Overwrites 4 bytes inside the sector at `at`; returns what was there.
std::string Smudge(const std::string& img, uint64_t at, const std::string& with = "XXXX") {
  int fd = ::open(img.c_str(), O_RDWR);
  EXPECT_GE(fd, 0);
  std::string was(with.size(), '\0');
  EXPECT_EQ(::pread(fd, was.data(), was.size(), static_cast<off_t>(at + 2000)), static_cast<ssize_t>(was.size()));
  EXPECT_EQ(::pwrite(fd, with.data(), with.size(), static_cast<off_t>(at + 2000)), static_cast<ssize_t>(with.size()));
  ::close(fd);
  return was;
}

// A damaged sector fails its checksum in the map; it is read again as Read
// reads it: from the other copy of DUP data, else an error naming it.
TEST(ReadPieces, ADamagedSectorComesFromTheOtherCopyOrIsTheErrorReadGives) {
  for (const std::string profile : {"dup", "single"}) {
    SCOPED_TRACE(profile);
    TempDir dir;
    const std::string img = MakeImage(dir, profile);
    const std::string data = Pattern(256, "dmg");
    {
      auto fs = Open(img, true);
      ASSERT_TRUE(fs);
      Put(*fs, NewFile(*fs, "f"), 0, data);
      ASSERT_TRUE(fs->Commit().ok());
    }
    const std::vector<uint64_t> copies = FindSector(img, "<dmg sector 000100>");
    ASSERT_EQ(copies.size(), profile == "dup" ? 2u : 1u);
    auto read = [&](uint64_t off, size_t size, ubtrfs::Status* plain) {
      auto fs = Open(img, false);
      auto f = fs->Lookup("/f");
      EXPECT_TRUE(f.ok());
      ReadPlain(*fs, *f, off, size, plain);
      return ReadByPieces(*fs, *f, off, size);
    };
    ubtrfs::Status plain;
    if (profile == "dup") {
      // Either copy damaged alone: the other one reads, whichever the map
      // tried first.
      for (uint64_t at : copies) {
        const std::string was = Smudge(img, at);
        Pieced got = read(0, data.size(), &plain);
        ASSERT_TRUE(got.status.ok()) << got.status.ToString();
        EXPECT_TRUE(got.bytes == data);
        Smudge(img, at, was);
      }
    }
    for (uint64_t at : copies) Smudge(img, at);
    Pieced got = read(0, data.size(), &plain);
    ASSERT_FALSE(plain.ok());
    EXPECT_EQ(got.sends, 0);
    EXPECT_EQ(got.status.code(), plain.code()) << got.status.ToString();
    EXPECT_EQ(got.status.ToString(), plain.ToString());
    // The sectors before the damaged one still read, from the map.
    Pieced head = read(0, 100 * 4096, &plain);
    ASSERT_TRUE(head.status.ok()) << head.status.ToString();
    EXPECT_TRUE(head.bytes == data.substr(0, 100 * 4096));
    EXPECT_EQ(head.mapped, 100 * 4096u);
  }
}

}  // namespace UBTRFS_UNITY_ID
}  // namespace ubtrfs_test
