// Compression on write: the decisions (which ranges, whether worth it) and
// the write path's part (FilesystemImpl::*Compress*). See compress_write.h.
#include "fs/all_zero.h"
#include "fs/compress_write.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "fs/compress.h"
#include "fs/fs_impl.h"
#include "fs/work_pool.h"

namespace ubtrfs::fs {
namespace {

constexpr std::string_view kPropertyName = "btrfs.compression";

using fs::AllZero;

// The kernel's sampling constants (compression.c): 16 bytes every 256.
constexpr size_t kSampleRead = 16;
constexpr size_t kSampleInterval = 256;
constexpr size_t kByteSetThreshold = 64;
constexpr size_t kCoreSetLow = 64;
constexpr size_t kCoreSetHigh = 200;
constexpr int kEntropyHigh = 80;  // percent of 8 bits per byte

}  // namespace

std::optional<uint8_t> PropertyType(std::string_view value) {
  if (value.empty() || value == "no" || value == "none") return uint8_t{0};
  // The kernel accepts a known name followed by anything (e.g. "zstd:3").
  if (value.starts_with("zlib")) return format::kCompressZlib;
  if (value.starts_with("lzo")) return format::kCompressLzo;
  if (value.starts_with("zstd")) return format::kCompressZstd;
  return std::nullopt;
}

uint64_t FlagsForProperty(uint64_t flags, std::optional<std::string_view> value) {
  flags &= ~(format::kInodeCompress | format::kInodeNocompress);
  if (!value || value->empty()) return flags;
  if (PropertyType(*value).value_or(0) == 0) return flags | format::kInodeNocompress;
  return flags | format::kInodeCompress;
}

WriteCompression ChooseCompression(const CompressOptions& mount, uint64_t flags, uint8_t prop_type) {
  WriteCompression c;
  // btrfs_inode_can_compress: no checksums, no compression.
  if (flags & (format::kInodeNodatacow | format::kInodeNodatasum)) return c;
  const auto mount_type = static_cast<uint8_t>(mount.algorithm);
  const bool force = mount.force && mount_type != 0;
  if (!force) {
    if (flags & format::kInodeNocompress) return c;
    if (mount_type == 0 && !(flags & format::kInodeCompress) && prop_type == 0) return c;
  }
  // The property picks the algorithm; a COMPRESS flag alone takes the mount
  // option's, or zlib as chattr +c does without one.
  c.type = prop_type ? prop_type : mount_type ? mount_type : static_cast<uint8_t>(format::kCompressZlib);
  c.level = c.type == mount_type ? mount.level : 0;
  c.force = force;
  c.by_property = prop_type != 0;
  return c;
}

bool LooksCompressible(std::span<const uint8_t> data) {
  data = data.subspan(0, std::min<size_t>(data.size(), kMaxCompressRange));
  std::vector<uint8_t> sample;
  sample.reserve(data.size() / kSampleInterval * kSampleRead + kSampleRead);
  for (size_t i = 0; i + kSampleRead <= data.size(); i += kSampleInterval) {
    sample.insert(sample.end(), data.begin() + i, data.begin() + i + kSampleRead);
  }
  if (sample.empty()) return true;
  const size_t half = sample.size() / 2;
  if (std::memcmp(sample.data(), sample.data() + half, half) == 0) return true;  // repeated pattern

  std::array<uint32_t, 256> bucket{};
  for (uint8_t b : sample) ++bucket[b];
  const size_t set = static_cast<size_t>(std::count_if(bucket.begin(), bucket.end(), [](uint32_t n) { return n; }));
  if (set < kByteSetThreshold) return true;

  // The core set: how many of the most frequent byte values cover 90%.
  std::array<uint32_t, 256> sorted = bucket;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const uint64_t threshold = sample.size() * 90 / 100;
  uint64_t sum = 0;
  size_t core = 0;
  while (core < sorted.size() && sorted[core] > 0) {
    sum += sorted[core++];
    if (sum > threshold) break;
  }
  if (core <= kCoreSetLow) return true;
  if (core >= kCoreSetHigh) return false;

  // Shannon entropy in quarter bits, in integers as the kernel computes it
  // (log2 of n^4, rounded down), so that a range near the line falls on the
  // kernel's side of it.
  const auto log2_quarters = [](uint64_t n) { return static_cast<uint64_t>(std::bit_width(n * n * n * n) - 1); };
  const uint64_t total_quarters = log2_quarters(sample.size());
  uint64_t entropy = 0;  // (samples of at most 8 KiB: n^4 fits)
  for (uint32_t n : bucket) {
    if (n) entropy += n * (total_quarters - log2_quarters(n));
  }
  const int percent = static_cast<int>(entropy / sample.size() * 100 / (8 * 4));
  // Below 65% the kernel is sure; up to 80% it compresses without a closer look.
  return percent < kEntropyHigh;
}

RangeResult CompressRange(const WriteCompression& c, std::span<const uint8_t> file_bytes,
                          std::span<const uint8_t> in_sectors, uint32_t sectorsize) {
  RangeResult r;
  if (!c.force && !LooksCompressible(in_sectors)) return r;
  auto z = Compress(c.type, file_bytes, sectorsize, c.level);
  const uint64_t in_len = (file_bytes.size() + sectorsize - 1) / sectorsize * sectorsize;
  // The kernel's compressors give up when the output reaches the input size;
  // then the range must save a whole sector.
  if (!z.ok() || z->size() >= file_bytes.size() ||
      (z->size() + sectorsize - 1) / sectorsize * sectorsize + sectorsize > in_len) {
    r.kind = RangeResult::kIncompressible;
    return r;
  }
  r.kind = RangeResult::kCompressed;
  r.bytes = std::move(*z);
  r.bytes.resize((r.bytes.size() + sectorsize - 1) / sectorsize * sectorsize, 0);
  return r;
}

std::optional<std::vector<uint8_t>> CompressInline(const WriteCompression& c, std::span<const uint8_t> content,
                                                   uint32_t sectorsize, uint64_t max_inline, bool* incompressible) {
  *incompressible = false;
  if (content.empty() || content.size() > sectorsize) return std::nullopt;
  // The kernel samples the page, zeros past the end of the file included.
  std::vector<uint8_t> page(sectorsize, 0);
  std::memcpy(page.data(), content.data(), content.size());
  if (!c.force && !LooksCompressible(page)) return std::nullopt;
  auto z = Compress(c.type, content, sectorsize, c.level);
  if (!z.ok() || z->size() >= content.size() || z->size() > max_inline) {
    // Not inline: as a regular extent a sector-sized range cannot save a
    // sector, so the kernel counts this as incompressible either way.
    *incompressible = true;
    return std::nullopt;
  }
  return std::move(*z);
}

uint64_t BytesToTry(const Range& r, uint64_t start, uint64_t file_len, uint32_t sectorsize) {
  const uint64_t file_bytes = r.pos >= file_len ? 0 : std::min<uint64_t>(r.len, file_len - r.pos);
  if (file_bytes <= sectorsize && (start + r.pos > 0 || file_len > r.pos + r.len)) return 0;
  return file_bytes;
}

std::vector<Range> PlanRanges(std::span<const uint8_t> aligned, uint32_t sectorsize) {
  std::vector<Range> out;
  size_t pos = 0;
  while (pos < aligned.size()) {
    if (AllZero(aligned.subspan(pos, sectorsize))) {
      pos += sectorsize;
      continue;
    }
    size_t len = sectorsize;
    while (pos + len < aligned.size() && len < kMaxCompressRange && !AllZero(aligned.subspan(pos + len, sectorsize))) {
      len += sectorsize;
    }
    out.push_back(Range{pos, len});
    pos += len;
  }
  return out;
}

}  // namespace ubtrfs::fs

namespace ubtrfs::fsimpl {

Result<fs::WriteCompression> FilesystemImpl::CompressionFor(InodeId id, const InodeItem& ii) {
  const uint64_t flags = ii.flags.get();
  uint8_t prop = 0;
  // The property sets COMPRESS (kernel and here), so only those inodes pay
  // for the xattr lookup.
  if (flags & kInodeCompress) {
    auto v = GetXattr(id, fs::kPropertyName);
    if (v.ok()) {
      prop = fs::PropertyType(*v).value_or(0);
    } else if (v.status().code() != ENODATA) {
      return v.status();
    }
  }
  return fs::ChooseCompression(compress_, flags, prop);
}

Result<std::vector<FilesystemImpl::DataPiece>> FilesystemImpl::AllocCompressedPieces(
    const fs::WriteCompression& c, uint64_t start, std::span<const uint8_t> aligned, uint64_t file_len,
    std::span<const fs::Precompressed> pre, bool* mark_nocompress) {
  const uint32_t ss = vol_->sectorsize();
  const std::vector<fs::Range> ranges = fs::PlanRanges(aligned, ss);
  auto to_try = [&](const fs::Range& r) { return fs::BytesToTry(r, start, file_len, ss); };
  auto given = [&](const fs::Range& r) {
    return std::find_if(pre.begin(), pre.end(), [&](const fs::Precompressed& p) {
      return p.file_off == start + r.pos && p.file_len == to_try(r) && p.type == c.type && p.level == c.level &&
             p.force == c.force;
    });
  };
  // The ranges are compressed on all cores first, each as it would be in
  // turn, so the extents are the same whichever thread made them (a range
  // after an incompressible one is compressed for nothing, and dropped).
  std::vector<size_t> todo;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (to_try(ranges[i]) > 0 && given(ranges[i]) == pre.end()) todo.push_back(i);
  }
  std::vector<fs::RangeResult> early(todo.size() >= 2 ? ranges.size() : 0);
  if (!early.empty()) {
    fs::ParallelFor(todo.size(), [&](size_t k) {
      const fs::Range& r = ranges[todo[k]];
      early[todo[k]] = fs::CompressRange(c, aligned.subspan(r.pos, to_try(r)), aligned.subspan(r.pos, r.len), ss);
    });
  }
  std::vector<DataPiece> pieces;
  bool trying = true;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const fs::Range& r = ranges[i];
    fs::RangeResult res;
    // Past the first incompressible range the rest goes plain.
    if (trying && to_try(r) > 0) {
      if (auto hit = given(r); hit != pre.end()) {
        res = hit->result;
      } else if (!early.empty()) {
        res = std::move(early[i]);
      } else {
        res = fs::CompressRange(c, aligned.subspan(r.pos, to_try(r)), aligned.subspan(r.pos, r.len), ss);
      }
      if (res.kind == fs::RangeResult::kIncompressible && !c.force && !c.by_property) {
        *mark_nocompress = true;
        trying = false;
      }
    }
    if (res.kind != fs::RangeResult::kCompressed) {
      // Plain, in smaller pieces if space is fragmented.
      size_t done = 0;
      while (done < r.len) {
        uint64_t want = r.len - done;
        for (;;) {
          auto a = txn_->AllocData(want);
          if (a.ok()) {
            pieces.push_back(DataPiece{start + r.pos + done, r.pos + done, *a, want});
            break;
          }
          if (a.status().code() != ENOSPC || want <= ss) return a.status();
          want = std::max<uint64_t>(ss, want / 2 / ss * ss);
        }
        done += want;
      }
      continue;
    }
    // A compressed extent is one piece: its bytes cannot be split.
    UB_ASSIGN_OR_RETURN(uint64_t bytenr, txn_->AllocData(res.bytes.size()));
    DataPiece p{start + r.pos, r.pos, bytenr, r.len};
    p.compression = c.type;
    p.zdata = std::move(res.bytes);
    pieces.push_back(std::move(p));
  }
  return pieces;
}

void FilesystemImpl::NoteCompressed(uint8_t type) {
  // The kernel sets these when such data is first written; zlib needs none.
  if (type == kCompressLzo) pending_incompat_.fetch_or(kIncompatCompressLzo, std::memory_order_relaxed);
  if (type == kCompressZstd) pending_incompat_.fetch_or(kIncompatCompressZstd, std::memory_order_relaxed);
}

void FilesystemImpl::ApplyPendingIncompat() {
  const uint64_t f = pending_incompat_.load(std::memory_order_relaxed);
  SuperBlock& sb = vol_->mutable_super();
  if (f & ~sb.incompat_flags.get()) sb.incompat_flags = sb.incompat_flags.get() | f;
}

Status FilesystemImpl::CheckCompressionProperty(std::string_view name, std::optional<std::string_view> value,
                                                InodeItem* ii) {
  if (name != fs::kPropertyName) return Status::Ok();
  if (value && !fs::PropertyType(*value)) {
    return Status::Invalid("btrfs.compression: \"" + std::string(*value) + "\" is not zlib, lzo, zstd, no or none");
  }
  ii->flags = fs::FlagsForProperty(ii->flags.get(), value);
  return Status::Ok();
}

Status FilesystemImpl::InheritCompressionProperty(InodeId dir, InodeId child) {
  auto v = GetXattr(dir, fs::kPropertyName);
  if (!v.ok()) return v.status().code() == ENODATA ? Status::Ok() : v.status();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(child.root));
  const auto item = DirItemBytes(Key{}, txn_->transid(), kFtXattr, fs::kPropertyName, *v);
  return w->Insert(Key{child.ino, kXattrItemKey, NameHash(fs::kPropertyName)}, item);
}

}  // namespace ubtrfs::fsimpl
