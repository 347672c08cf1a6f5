// Shared by the whole-image fuzz targets (image_open_fuzz, image_read_fuzz,
// image_write_fuzz): a compact encoding of a mostly-zero btrfs image, a
// sparse in-memory block device to decode it into, and bounded walks over a
// Filesystem.
//
// Input encoding (all integers little endian):
//   header, 8 bytes:
//     u32 size    device size in 4 KiB units
//     u8  flags   kKeepMetaCsums: leave superblock and tree block checksums
//                 as they are (otherwise they are recomputed after decoding,
//                 so mutations get past the checksum to the checks behind
//                 it); kNoDataCsums: open with verify_data_csums = false (so
//                 mutated data still reaches the decompressors);
//                 kRescueAll: a read-only open takes every rescue fallback
//                 (OpenOptions::rescue, the kernel's rescue=all)
//     u8  reserved
//     u16 ops     length of the operation script that follows (used by
//                 image_write_fuzz, skipped by the others)
//   ops bytes
//   records, until the input ends:
//     u32 unit    byte offset / 16 of a run of non-zero bytes
//     u16 len     its length
//     len bytes   (a short last record is zero-padded)
// Runs that fall past the device end are cut off there. Everything not
// covered by a run reads as zero. tests/fuzz/make_seed.py converts an image
// file into this encoding; tests/fuzz/make_corpus.sh builds the seeds.
#ifndef UBTRFS_TESTS_FUZZ_FUZZ_IMAGE_H_
#define UBTRFS_TESTS_FUZZ_FUZZ_IMAGE_H_

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fs/open_device.h"
#include "format/checksum.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "io/block_device.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/status.h"

namespace ubtrfs_fuzz {

inline constexpr uint8_t kKeepMetaCsums = 1;
inline constexpr uint8_t kNoDataCsums = 2;
inline constexpr uint8_t kRescueAll = 4;
inline constexpr size_t kHeaderSize = 8;
inline constexpr uint64_t kPage = 4096;
// Device sizes above this are cut down: nothing in a small seed lies there,
// and huge sizes only make the allocator's work per run larger.
inline constexpr uint64_t kMaxDeviceSize = 1ull << 40;

[[noreturn]] inline void Violated(const char* target, const char* what, int line) {
  std::fprintf(stderr, "%s: invariant violated at line %d: %s\n", target, line, what);
  std::abort();
}
#define FUZZ_CHECK(cond)                                           \
  do {                                                             \
    if (!(cond)) ::ubtrfs_fuzz::Violated(__FILE__, #cond, __LINE__); \
  } while (0)

// UBTRFS_FUZZ_VERBOSE=1 prints every error a target sees (to check that the
// seeds open, or to read what a reproducer is refused with).
inline bool Verbose() {
  static const bool v = std::getenv("UBTRFS_FUZZ_VERBOSE") != nullptr;
  return v;
}

// Every error a target sees must say what went wrong.
inline void CheckError(const ubtrfs::Status& st) {
  if (Verbose()) std::fprintf(stderr, "status: %s\n", st.ToString().c_str());
  FUZZ_CHECK(!st.ok());
  FUZZ_CHECK(st.code() > 0);
  FUZZ_CHECK(!st.message().empty());
}

// The pages of a sparse image, shared between a device and the target (so a
// written image can be opened again after the Filesystem is gone).
struct Pages {
  uint64_t size = 0;
  std::map<uint64_t, std::array<uint8_t, kPage>> pages;  // page number -> bytes

  void Read(uint64_t off, std::span<uint8_t> out) const {
    size_t done = 0;
    while (done < out.size()) {
      const uint64_t at = off + done;
      const uint64_t pno = at / kPage, in = at % kPage;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kPage - in, out.size() - done));
      auto it = pages.find(pno);
      if (it == pages.end()) {
        std::memset(out.data() + done, 0, n);
      } else {
        std::memcpy(out.data() + done, it->second.data() + in, n);
      }
      done += n;
    }
  }
  void Write(uint64_t off, std::span<const uint8_t> in_bytes) {
    size_t done = 0;
    while (done < in_bytes.size()) {
      const uint64_t at = off + done;
      const uint64_t pno = at / kPage, in = at % kPage;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kPage - in, in_bytes.size() - done));
      auto it = pages.find(pno);
      if (it == pages.end()) it = pages.emplace(pno, std::array<uint8_t, kPage>{}).first;
      std::memcpy(it->second.data() + in, in_bytes.data() + done, n);
      done += n;
    }
  }
};

class SparseDevice : public ubtrfs::io::BlockDevice {
 public:
  explicit SparseDevice(std::shared_ptr<Pages> pages) : pages_(std::move(pages)) {}
  ubtrfs::Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    if (offset > pages_->size || buf.size() > pages_->size - offset) {
      return ubtrfs::Status::IoError("fuzz: read of " + std::to_string(buf.size()) + " bytes at " +
                                     std::to_string(offset) + " past the device end " + std::to_string(pages_->size));
    }
    pages_->Read(offset, buf);
    return ubtrfs::Status::Ok();
  }
  ubtrfs::Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    if (offset > pages_->size || buf.size() > pages_->size - offset) {
      return ubtrfs::Status::IoError("fuzz: write of " + std::to_string(buf.size()) + " bytes at " +
                                     std::to_string(offset) + " past the device end " + std::to_string(pages_->size));
    }
    pages_->Write(offset, buf);
    return ubtrfs::Status::Ok();
  }
  ubtrfs::Status Flush() override { return ubtrfs::Status::Ok(); }
  uint64_t Size() const override { return pages_->size; }
  std::string Name() const override { return "fuzz-image"; }

 private:
  std::shared_ptr<Pages> pages_;
};

inline uint16_t Get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
inline uint32_t Get32(const uint8_t* p) { return Get16(p) | static_cast<uint32_t>(Get16(p + 2)) << 16; }

struct Decoded {
  std::shared_ptr<Pages> pages = std::make_shared<Pages>();
  uint8_t flags = 0;
  std::span<const uint8_t> ops;
};

// Recomputes the checksums of every superblock copy with a valid magic and of
// every tree block (a 4 KiB-aligned block whose header carries the fsid of
// the primary superblock), so that mutations reach the structure checks.
inline void FixChecksums(Pages& img) {
  namespace fmtd = ubtrfs::format;
  std::vector<uint8_t> sbb(fmtd::kSuperInfoSize);
  img.Read(fmtd::kSuperInfoOffset, sbb);
  const auto& sb = *reinterpret_cast<const fmtd::SuperBlock*>(sbb.data());
  if (sb.magic.get() != fmtd::kMagic) return;
  const uint16_t csum_type = sb.csum_type.get();
  if (fmtd::CsumSize(csum_type) == 0) return;
  const uint32_t nodesize = sb.nodesize.get();
  uint8_t fsid[fmtd::kFsidSize];
  std::memcpy(fsid, fmtd::MetadataFsid(sb), sizeof fsid);

  for (int m = 0; m < fmtd::kSuperMirrorMax; ++m) {
    const uint64_t off = fmtd::SuperblockOffset(m);
    if (off + fmtd::kSuperInfoSize > img.size || img.pages.count(off / kPage) == 0) continue;
    std::vector<uint8_t> copy(fmtd::kSuperInfoSize);
    img.Read(off, copy);
    const auto& c = *reinterpret_cast<const fmtd::SuperBlock*>(copy.data());
    if (c.magic.get() != fmtd::kMagic || fmtd::CsumSize(c.csum_type.get()) == 0) continue;
    auto sum = fmtd::ComputeCsum(c.csum_type.get(),
                                 std::span<const uint8_t>(copy).subspan(fmtd::kCsumSize));
    img.Write(off, std::span<const uint8_t>(sum.data(), fmtd::kCsumSize));
  }
  if (nodesize < kPage || nodesize > 65536 || (nodesize & (nodesize - 1)) != 0) return;
  std::vector<uint64_t> starts;
  for (const auto& [pno, bytes] : img.pages) {
    if (std::memcmp(bytes.data() + offsetof(fmtd::Header, fsid), fsid, sizeof fsid) == 0 &&
        bytes[offsetof(fmtd::Header, level)] < fmtd::kMaxLevel) {
      starts.push_back(pno * kPage);
    }
  }
  std::vector<uint8_t> block(nodesize);
  for (uint64_t at : starts) {
    if (at < fmtd::kSuperInfoOffset + fmtd::kSuperInfoSize && at + nodesize > fmtd::kSuperInfoOffset) continue;
    if (at + nodesize > img.size) continue;
    img.Read(at, block);
    auto sum = fmtd::ComputeCsum(csum_type, std::span<const uint8_t>(block).subspan(fmtd::kCsumSize));
    img.Write(at, std::span<const uint8_t>(sum.data(), fmtd::kCsumSize));
  }
}

// Decodes an input; returns false when it is too short to hold a header.
inline bool Decode(const uint8_t* data, size_t size, Decoded* out) {
  if (size < kHeaderSize) return false;
  uint64_t dev_size = uint64_t{Get32(data)} * kPage;
  dev_size = std::min(dev_size, kMaxDeviceSize);
  out->pages->size = dev_size;
  out->flags = data[4];
  const size_t ops_len = std::min<size_t>(Get16(data + 6), size - kHeaderSize);
  out->ops = std::span<const uint8_t>(data + kHeaderSize, ops_len);
  size_t pos = kHeaderSize + ops_len;
  std::vector<uint8_t> run;
  while (pos + 6 <= size) {
    const uint64_t off = uint64_t{Get32(data + pos)} * 16;
    const size_t len = Get16(data + pos + 4);
    pos += 6;
    const size_t have = std::min(len, size - pos);
    if (len == 0) continue;
    run.assign(len, 0);
    if (have > 0) std::memcpy(run.data(), data + pos, have);
    pos += have;
    if (off >= dev_size) continue;
    const size_t keep = static_cast<size_t>(std::min<uint64_t>(len, dev_size - off));
    out->pages->Write(off, std::span<const uint8_t>(run).first(keep));
  }
  if (!(out->flags & kKeepMetaCsums)) FixChecksums(*out->pages);
  return true;
}

inline ubtrfs::OpenOptions Options(const Decoded& d, bool writable) {
  ubtrfs::OpenOptions o;
  o.writable = writable;
  o.verify_data_csums = !(d.flags & kNoDataCsums);
  o.node_cache_bytes = 4ull << 20;
  if ((d.flags & kRescueAll) && !writable) (void)ubtrfs::ParseRescueOptions("all", &o.rescue);
  return o;
}

// Opens the decoded image (a device over its pages), or checks that the
// refusal is a Status with a message and returns null.
inline std::unique_ptr<ubtrfs::Filesystem> OpenDecoded(const Decoded& d, bool writable) {
  auto fs = ubtrfs::OpenOnDevice(std::make_unique<SparseDevice>(d.pages), Options(d, writable));
  if (!fs.ok()) {
    CheckError(fs.status());
    return nullptr;
  }
  return std::move(*fs);
}

// Bounds for one walk, so that a hostile image cannot make a run slow.
struct WalkBudget {
  int entries = 4000;
  uint64_t read_bytes = 8ull << 20;
  int depth = 24;
};

struct WalkStats {
  uint64_t entries = 0, bytes = 0, errors = 0, checksum = 0;
};

// Reads one inode the way a reader would: stat, contents / link target,
// xattrs. Every error must carry a message.
inline void ReadInode(ubtrfs::Filesystem& fs, ubtrfs::InodeId id, WalkBudget* budget, WalkStats* stats) {
  auto note = [&](const ubtrfs::Status& st) {
    if (!st.ok()) {
      CheckError(st);
      ++stats->errors;
    }
  };
  auto st = fs.GetStat(id);
  if (!st.ok()) {
    note(st.status());
    return;
  }
  stats->checksum += st->mode + st->size + st->nlink;
  if (S_ISREG(st->mode)) {
    std::vector<uint8_t> buf(64 * 1024);
    uint64_t off = 0;
    while (budget->read_bytes > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), budget->read_bytes));
      auto n = fs.Read(id, off, std::span<uint8_t>(buf).first(want));
      if (!n.ok()) {
        note(n.status());
        break;
      }
      FUZZ_CHECK(*n <= want);
      if (*n == 0) break;
      for (size_t i = 0; i < *n; i += 512) stats->checksum += buf[i];
      off += *n;
      budget->read_bytes -= *n;
      stats->bytes += *n;
    }
    if (st->flags & ubtrfs::kStatFlagVerity) {
      // The descriptor and tree items are image bytes like any other.
      auto v = fs.GetVerity(id);
      if (!v.ok()) {
        note(v.status());
      } else if (*v) {
        stats->checksum += (*v)->data_size + (*v)->digest.size();
        if (st->size <= (1u << 20)) note(fs.VerifyVerity(id));
      }
    }
  } else if (S_ISLNK(st->mode)) {
    auto t = fs.ReadLink(id);
    if (t.ok()) {
      stats->checksum += t->size();
    } else {
      note(t.status());
    }
  }
  auto names = fs.ListXattr(id);
  if (!names.ok()) {
    note(names.status());
    return;
  }
  for (const auto& n : *names) {
    auto v = fs.GetXattr(id, n);
    if (v.ok()) {
      stats->checksum += v->size();
    } else {
      note(v.status());
    }
  }
}

// Walks every directory below `dir` (bounded), reading each inode.
inline void Walk(ubtrfs::Filesystem& fs, ubtrfs::InodeId dir, int depth, std::set<std::pair<uint64_t, uint64_t>>* seen,
                 WalkBudget* budget, WalkStats* stats) {
  if (depth > budget->depth || !seen->insert({dir.root, dir.ino}).second) return;
  auto entries = fs.ReadDir(dir);
  if (!entries.ok()) {
    CheckError(entries.status());
    ++stats->errors;
    return;
  }
  for (const auto& e : *entries) {
    if (budget->entries-- <= 0) return;
    ++stats->entries;
    FUZZ_CHECK(!e.name.empty());
    auto found = fs.LookupChild(dir, e.name);
    if (!found.ok()) {
      CheckError(found.status());
      ++stats->errors;
    }
    ReadInode(fs, e.id, budget, stats);
    if (e.type == 4 /* DT_DIR */) Walk(fs, e.id, depth + 1, seen, budget, stats);
  }
}

inline WalkStats WalkAll(ubtrfs::Filesystem& fs) {
  WalkBudget budget;
  WalkStats stats;
  std::set<std::pair<uint64_t, uint64_t>> seen;
  ReadInode(fs, fs.Root(), &budget, &stats);
  Walk(fs, fs.Root(), 0, &seen, &budget, &stats);
  auto sf = fs.StatFs();
  if (!sf.ok()) CheckError(sf.status());
  if (Verbose()) {
    std::fprintf(stderr, "walk: %llu entries, %llu bytes read, %llu errors\n",
                 static_cast<unsigned long long>(stats.entries), static_cast<unsigned long long>(stats.bytes),
                 static_cast<unsigned long long>(stats.errors));
  }
  return stats;
}

}  // namespace ubtrfs_fuzz

#endif  // UBTRFS_TESTS_FUZZ_FUZZ_IMAGE_H_
