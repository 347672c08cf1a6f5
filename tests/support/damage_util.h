// The damaged-image suite's building blocks, shared by
// tests/damaged_image_test.cc (which asserts what the library says about each
// damage) and tests/checker_agreement_test.cc (which asserts that `ubtrfs
// check` and `btrfs check` agree about the same images):
//   - the host tree the images are made from (mkfs.btrfs --rootdir),
//   - Patcher: in-place, undone-at-scope-end edits of an image file,
//   - tree block and item accessors and ResizeItem for crafting damage,
//   - Layout: where things are in a clean image (found through the library
//     internals), and Damage/DamageItem to rewrite a block in every copy with
//     a recomputed checksum.
#ifndef UBTRFS_TESTS_SUPPORT_DAMAGE_UTIL_H_
#define UBTRFS_TESTS_SUPPORT_DAMAGE_UTIL_H_

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "fs/volume.h"
#include "tree/cursor.h"
#include "ubtrfs/status.h"

namespace ubtrfs_test {

namespace fmtd = ubtrfs::format;
namespace tree = ubtrfs::tree;
namespace ufs = ubtrfs::fs;
using ubtrfs::Status;
using ubtrfs::format::Key;

inline constexpr uint64_t kDamageImageSize = 160ull << 20;  // > 64 MiB + 4 KiB: mkfs writes the first mirror
inline constexpr size_t kWideEntries = 500;
inline constexpr uint64_t kDamageMiB = 1ull << 20;

// ---------------------------------------------------------------- host tree

inline uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::string PseudoRandom(uint64_t seed, size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = SplitMix(seed);
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return out;
}

inline std::string WideName(size_t i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "e%03zu", i);
  return buf;
}

// (not WriteHostFile: host_files.h's, which fails the test itself, has that
// name, and two functions of one signature in one namespace are one to the linker)
inline bool TryWriteHostFile(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
  return ::close(fd) == 0 && ok;
}

// Copies the first n bytes of src to dst, skipping holes (images are sparse).
inline bool CopyPrefix(const std::string& src, const std::string& dst, uint64_t n, std::string* err) {
  int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  auto fail = [&](const std::string& what) {
    *err = what + ": " + std::strerror(errno);
    if (in >= 0) ::close(in);
    if (out >= 0) ::close(out);
    return false;
  };
  if (in < 0 || out < 0) return fail("open " + src + " / " + dst);
  if (::ftruncate(out, static_cast<off_t>(n)) != 0) return fail("ftruncate " + dst);
  std::vector<char> buf(kDamageMiB);
  off_t pos = 0;
  while (static_cast<uint64_t>(pos) < n) {
    off_t data = ::lseek(in, pos, SEEK_DATA);
    if (data < 0 || static_cast<uint64_t>(data) >= n) break;
    off_t hole = ::lseek(in, data, SEEK_HOLE);
    uint64_t end = hole < 0 ? n : std::min<uint64_t>(n, static_cast<uint64_t>(hole));
    for (uint64_t at = static_cast<uint64_t>(data); at < end;) {
      size_t len = static_cast<size_t>(std::min<uint64_t>(buf.size(), end - at));
      ssize_t r = ::pread(in, buf.data(), len, static_cast<off_t>(at));
      if (r <= 0) return fail("pread " + src);
      if (::pwrite(out, buf.data(), static_cast<size_t>(r), static_cast<off_t>(at)) != r) return fail("pwrite " + dst);
      at += static_cast<uint64_t>(r);
    }
    pos = static_cast<off_t>(end);
  }
  ::close(in);
  return ::close(out) == 0 || fail("close " + dst);
}

// ---------------------------------------------------------------- patching

// Writes bytes into an image file and puts the original bytes back when it
// goes out of scope, so each case starts from the clean image.
class Patcher {
 public:
  explicit Patcher(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CLOEXEC)) {
    if (fd_ < 0) ADD_FAILURE() << "open " << path << ": " << std::strerror(errno);
  }
  ~Patcher() {
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) PWrite(it->first, it->second);
    if (fd_ >= 0) ::close(fd_);
  }
  Patcher(const Patcher&) = delete;
  Patcher& operator=(const Patcher&) = delete;

  std::vector<uint8_t> Read(uint64_t off, size_t n) {
    std::vector<uint8_t> b(n);
    if (::pread(fd_, b.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      ADD_FAILURE() << "pread " << n << " bytes at " << off << ": " << std::strerror(errno);
    }
    return b;
  }
  void Write(uint64_t off, const std::vector<uint8_t>& bytes) {
    undo_.emplace_back(off, Read(off, bytes.size()));
    PWrite(off, bytes);
  }
  void FlipBit(uint64_t off, int bit = 3) {
    auto b = Read(off, 1);
    b[0] ^= static_cast<uint8_t>(1u << bit);
    Write(off, b);
  }

 private:
  void PWrite(uint64_t off, const std::vector<uint8_t>& b) {
    if (::pwrite(fd_, b.data(), b.size(), static_cast<off_t>(off)) != static_cast<ssize_t>(b.size())) {
      ADD_FAILURE() << "pwrite " << b.size() << " bytes at " << off << ": " << std::strerror(errno);
    }
  }
  int fd_;
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> undo_;
};

using Block = std::vector<uint8_t>;
using Mutator = std::function<void(Block&)>;

inline fmtd::Header& Hdr(Block& b) { return *reinterpret_cast<fmtd::Header*>(b.data()); }
inline fmtd::Item& ItemAt(Block& b, int slot) {
  return reinterpret_cast<fmtd::Item*>(b.data() + sizeof(fmtd::Header))[slot];
}
inline fmtd::KeyPtr& PtrAt(Block& b, int slot) {
  return reinterpret_cast<fmtd::KeyPtr*>(b.data() + sizeof(fmtd::Header))[slot];
}
inline uint8_t* ItemData(Block& b, int slot) { return b.data() + sizeof(fmtd::Header) + ItemAt(b, slot).offset.get(); }
template <typename T>
T& ItemAs(Block& b, int slot) {
  return *reinterpret_cast<T*>(ItemData(b, slot));
}
inline Key KeyAt(Block& b, int slot) {
  return Key::From(Hdr(b).level == 0 ? ItemAt(b, slot).key : PtrAt(b, slot).key);
}
inline void SetKey(Block& b, int slot, const Key& k) { k.To(Hdr(b).level == 0 ? &ItemAt(b, slot).key : &PtrAt(b, slot).key); }

inline void FixTreeCsum(Block& b, uint16_t csum_type) {
  auto c = fmtd::ComputeCsum(csum_type, std::span<const uint8_t>(b).subspan(fmtd::kCsumSize));
  std::memcpy(b.data(), c.data(), fmtd::kCsumSize);
}

// Changes the size of one leaf item, repacking the data of all items as btrfs
// lays it out (data packed from the end of the block, in slot order).
inline void ResizeItem(Block& b, int slot, size_t new_size) {
  struct Raw {
    fmtd::DiskKey key;
    std::vector<uint8_t> data;
  };
  std::vector<Raw> items;
  const int n = static_cast<int>(Hdr(b).nritems.get());
  for (int i = 0; i < n; ++i) {
    const uint8_t* d = ItemData(b, i);
    items.push_back(Raw{ItemAt(b, i).key, std::vector<uint8_t>(d, d + ItemAt(b, i).size.get())});
  }
  items[slot].data.resize(new_size, 0);
  uint8_t* body = b.data() + sizeof(fmtd::Header);
  const size_t space = b.size() - sizeof(fmtd::Header);
  std::memset(body, 0, space);
  size_t end = space;
  for (int i = 0; i < n; ++i) {
    end -= items[i].data.size();
    ItemAt(b, i).key = items[i].key;
    ItemAt(b, i).offset.set(static_cast<uint32_t>(end));
    ItemAt(b, i).size.set(static_cast<uint32_t>(items[i].data.size()));
    std::memcpy(body + end, items[i].data.data(), items[i].data.size());
  }
}

// ---------------------------------------------------------------- image layout

// Where things are in one clean image, found through the library internals.
struct Layout {
  std::string path;
  std::unique_ptr<ufs::Volume> vol;  // on the clean image; used for address mapping only
  uint32_t nodesize = 0;
  uint16_t csum_type = 0;
  uint64_t root_tree = 0, chunk_root = 0;
  tree::RootPtr fs_root, csum_root;
  uint64_t wide_ino = 0, big_ino = 0, link_ino = 0;
  // A /wide entry whose INODE_ITEM sits well inside its leaf, whose leaf sits
  // well inside its parent node.
  std::string target_name;
  uint64_t target_ino = 0;
  uint64_t leaf = 0;       // the leaf holding the target's INODE_ITEM
  int leaf_slot = 0, leaf_items = 0;
  uint64_t leaf_gen = 0;
  uint64_t node = 0;       // the leaf's parent
  int node_slot = 0, node_items = 0, node_level = 0;
  uint64_t sibling = 0;    // the next leaf under the same parent
  // big.bin's first two extents (the first one twice if it has only one):
  // logical disk_bytenr, and the file offset of the second.
  uint64_t big_ext0 = 0, big_ext1 = 0, big_ext1_off = 0;
  uint64_t big_ext0_len = 0, big_ext0_ram = 0, big_ext0_num = 0;  // disk_num_bytes, ram_bytes, num_bytes
  uint64_t csum_leaf = 0;  // the csum tree leaf covering big_ext1
  // A small file stored in an inline extent.
  std::string inline_path;

  std::vector<uint64_t> Copies(uint64_t logical, uint64_t len) const {
    auto m = vol->chunks().MapPhysical(logical, len);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? *m : std::vector<uint64_t>{};
  }
  tree::BlockRef ReadBlock(uint64_t bytenr) const {
    auto b = vol->reader()->Read(tree::BlockCheck{bytenr, -1, 0, {}});
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? *b : nullptr;
  }
  // Leaf and slot of the item with exactly key k in tree `root`.
  std::pair<uint64_t, int> Locate(const tree::RootPtr& root, const Key& k) const {
    tree::Cursor c(vol->reader(), root);
    Status st = c.Seek(k);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok() || !c.Valid() || c.key() != k) {
      ADD_FAILURE() << "no item " << fmtd::KeyToString(k) << " in tree " << root.id;
      return {0, -1};
    }
    return {c.leaf().bytenr(), c.slot()};
  }

  // Rewrites tree block `logical` in the copies picked by `copy_mask` (bit i
  // = copy i): applies `m`, then recomputes the checksum if `fix_csum`.
  void Damage(Patcher& p, uint64_t logical, const Mutator& m, bool fix_csum, unsigned copy_mask = ~0u) const {
    auto copies = Copies(logical, nodesize);
    ASSERT_FALSE(copies.empty());
    for (size_t i = 0; i < copies.size(); ++i) {
      if (!(copy_mask & (1u << i))) continue;
      Block b = p.Read(copies[i], nodesize);
      m(b);
      if (fix_csum) FixTreeCsum(b, csum_type);
      p.Write(copies[i], b);
    }
  }
  void DamageItem(Patcher& p, const tree::RootPtr& root, const Key& k, const std::function<void(Block&, int)>& m,
                  unsigned copy_mask = ~0u) const {
    auto [leaf, slot] = Locate(root, k);
    ASSERT_NE(leaf, 0u);
    Damage(p, leaf, [&, slot = slot](Block& b) { m(b, slot); }, true, copy_mask);
  }
};

inline std::string TreeBlockName(uint64_t bytenr) { return "tree block " + std::to_string(bytenr); }
inline void DamageSuper(Patcher& p, uint64_t off, const std::function<void(fmtd::SuperBlock&)>& m, bool fix) {
  Block b = p.Read(off, fmtd::kSuperInfoSize);
  auto& sb = *reinterpret_cast<fmtd::SuperBlock*>(b.data());
  m(sb);
  if (fix) {
    auto c = fmtd::ComputeCsum(sb.csum_type.get(), std::span<const uint8_t>(b).subspan(fmtd::kCsumSize));
    std::memcpy(sb.csum, c.data(), fmtd::kCsumSize);
  }
  p.Write(off, b);
}

// Builds the host tree under `root` (which must not exist): /small/s0..s9,
// /files/f0..f19, /big.bin (6 MiB), /dir/sub/deep.txt, /wide with
// kWideEntries files, /link -> files/f0. Fills `contents` (path in the image
// -> bytes). Returns "" or what failed.
std::string BuildDamageHostTree(const std::string& root, std::map<std::string, std::string>* contents);

// mkfs.btrfs -q -f -n 4096 EXTRA --rootdir SCRATCH/src SCRATCH/NAME over a
// sparse file of kDamageImageSize. Returns the image path, or "" after a
// gtest failure.
std::string MakeDamageImage(const std::string& scratch, const std::string& name, const std::vector<std::string>& extra);

// Fills in everything but `path` from the clean image at l->path (gtest
// failures and false when the image is not as the cases need).
bool AnalyzeDamageLayout(Layout* l);

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_DAMAGE_UTIL_H_
