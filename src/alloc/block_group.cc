#include "alloc/block_group.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cstring>
#include <string>
#include <utility>

namespace ubtrfs::alloc {
namespace {

constexpr size_t kPageSize = 4096;

// Process-wide, so a bench or a statfs-style report can see what the
// allocator costs in memory without walking every manager.
std::atomic<uint64_t> g_bitmap_bytes{0};
std::atomic<uint64_t> g_clone_bytes{0};

std::string Range(uint64_t start, uint64_t len) {
  return "[" + std::to_string(start) + ", +" + std::to_string(len) + ")";
}

// Mask of bits [lo, hi) within one word; 0 <= lo < hi <= 64.
uint64_t Mask(unsigned lo, unsigned hi) {
  const uint64_t upper = hi == 64 ? ~0ULL : (1ULL << hi) - 1;
  return upper & (~0ULL << lo);
}

// Calls fn(word index, mask) for each word touched by bits [pos, pos + n).
template <typename Fn>
void ForEachWordMask(uint64_t pos, uint64_t n, Fn fn) {
  const uint64_t end = pos + n;
  while (pos < end) {
    const size_t w = pos >> 6;
    const unsigned lo = pos & 63;
    const unsigned hi = static_cast<unsigned>(std::min<uint64_t>(64, end - (pos & ~63ULL)));
    fn(w, Mask(lo, hi));
    pos = (pos & ~63ULL) + hi;
  }
}

// Smallest q >= pos with q % a == phase (phase < a).
uint64_t AlignUp(uint64_t pos, uint64_t a, uint64_t phase) {
  if (pos <= phase) return phase;
  return phase + (pos - phase + a - 1) / a * a;
}

}  // namespace

Status BlockGroup::CheckGeometry(uint64_t start, uint64_t length, uint32_t unit) {
  const std::string where = "block group " + Range(start, length);
  if (unit < 512 || !std::has_single_bit(unit)) {
    return Status::Invalid(where + ": unit " + std::to_string(unit) + " is not a power of two >= 512");
  }
  if (length == 0 || length % unit != 0 || start % unit != 0) {
    return Status::Invalid(where + ": start and length must be non-zero multiples of " + std::to_string(unit));
  }
  if (start + length < start) return Status::Invalid(where + ": wraps past the end of the address space");
  return Status::Ok();
}

Result<std::unique_ptr<BlockGroup>> BlockGroup::Create(uint64_t start, uint64_t length, uint64_t flags, uint32_t unit) {
  UB_RETURN_IF_ERROR(CheckGeometry(start, length, unit));
  return std::make_unique<BlockGroup>(start, length, flags, unit);
}

BlockGroup::BlockGroup(uint64_t start, uint64_t length, uint64_t flags, uint32_t unit)
    : start_(start),
      flags_(flags),
      unit_(unit),
      unit_shift_(std::countr_zero(unit)),
      nbits_(length >> std::countr_zero(unit)),
      bitmap_((nbits_ + 63) / 64, 0) {
  assert(CheckGeometry(start, length, unit).ok());
  g_bitmap_bytes += bitmap_.size() * sizeof(uint64_t);
}

BlockGroup::~BlockGroup() {
  g_bitmap_bytes -= bitmap_.size() * sizeof(uint64_t);
  g_clone_bytes -= clone_alloc_bytes_ + sealed_alloc_bytes_;
}

uint64_t BlockGroup::bitmap_bytes_in_use() { return g_bitmap_bytes.load(); }
uint64_t BlockGroup::clone_bytes_in_use() { return g_clone_bytes.load(); }

template <BlockGroup::View V>
uint64_t BlockGroup::Word(size_t w) const {
  if constexpr (V == View::kBitmap) {
    return bitmap_[w];
  } else {
    uint64_t pinned = clone_ ? clone_[w] : 0;
    if (sealed_) pinned |= sealed_[w];
    if constexpr (V == View::kUnavailable) {
      return bitmap_[w] | pinned;
    } else {
      return pinned & ~bitmap_[w];
    }
  }
}

template <BlockGroup::View V>
uint64_t BlockGroup::FindNext(uint64_t pos, uint64_t end, bool set) const {
  if (pos >= end) return end;
  // Bits past nbits_ in the last word are zero in both maps; `end` (never
  // beyond nbits_) keeps them from being reported as free.
  const uint64_t flip = set ? 0 : ~0ULL;
  size_t w = pos >> 6;
  uint64_t x = (Word<V>(w) ^ flip) & (~0ULL << (pos & 63));
  while (x == 0) {
    ++w;
    if (uint64_t{w} << 6 >= end) return end;
    x = Word<V>(w) ^ flip;
  }
  return std::min<uint64_t>(end, (uint64_t{w} << 6) + std::countr_zero(x));
}

template <BlockGroup::View V>
void BlockGroup::ForEachRun(const ExtentFn& fn) const {
  uint64_t pos = 0;
  while (pos < nbits_) {
    const uint64_t s = FindNext<V>(pos, nbits_, true);
    if (s >= nbits_) break;
    const uint64_t e = FindNext<V>(s, nbits_, false);
    fn(start_ + (s << unit_shift_), (e - s) << unit_shift_);
    pos = e;
  }
}

void BlockGroup::ForEachUsedExtent(const ExtentFn& fn) const { ForEachRun<View::kBitmap>(fn); }
void BlockGroup::ForEachPinnedExtent(const ExtentFn& fn) const { ForEachRun<View::kPinned>(fn); }

void BlockGroup::ForEachFreeExtent(const ExtentFn& fn) const {
  uint64_t pos = 0;
  while (pos < nbits_) {
    const uint64_t s = FindNext<View::kBitmap>(pos, nbits_, false);
    if (s >= nbits_) break;
    const uint64_t e = FindNext<View::kBitmap>(s, nbits_, true);
    fn(start_ + (s << unit_shift_), (e - s) << unit_shift_);
    pos = e;
  }
}

Status BlockGroup::ToUnits(const char* what, uint64_t start, uint64_t len, uint64_t* first, uint64_t* n) const {
  if (len == 0 || start % unit_ != 0 || len % unit_ != 0) {
    return Status::Invalid(std::string(what) + " " + Range(start, len) + ": not a non-empty multiple of " +
                           std::to_string(unit_) + " bytes");
  }
  if (start < start_ || start - start_ > length() || len > length() - (start - start_)) {
    return Status::Invalid(std::string(what) + " " + Range(start, len) + ": outside block group " +
                           Range(start_, length()));
  }
  *first = (start - start_) >> unit_shift_;
  *n = len >> unit_shift_;
  return Status::Ok();
}

Status BlockGroup::MarkUsed(uint64_t start, uint64_t len) {
  uint64_t first = 0, n = 0;
  UB_RETURN_IF_ERROR(ToUnits("marking used", start, len, &first, &n));
  const uint64_t taken = FindNext<View::kUnavailable>(first, first + n, true);
  if (taken != first + n) {
    const uint64_t taken_end = FindNext<View::kUnavailable>(taken, first + n, false);
    return Status::Invalid("marking used " + Range(start, len) + ": " +
                           Range(start_ + (taken << unit_shift_), (taken_end - taken) << unit_shift_) +
                           " is already used or pinned");
  }
  ForEachWordMask(first, n, [&](size_t w, uint64_t m) { bitmap_[w] |= m; });
  used_units_ += n;
  return Status::Ok();
}

std::optional<uint64_t> BlockGroup::FindRun(uint64_t from, uint64_t end, uint64_t n, uint64_t a, uint64_t phase) const {
  uint64_t pos = from;
  while (true) {
    pos = FindNext<View::kUnavailable>(pos, end, false);
    if (a > 1) pos = AlignUp(pos, a, phase);
    if (pos >= end || end - pos < n) return std::nullopt;
    const uint64_t taken = FindNext<View::kUnavailable>(pos, pos + n, true);
    if (taken == pos + n) return pos;
    pos = taken + 1;
  }
}

std::optional<uint64_t> BlockGroup::Allocate(uint64_t len, uint64_t align, bool first_fit) {
  if (align == 0) align = unit_;
  if (len == 0 || len % unit_ != 0 || align % unit_ != 0 || read_only_) return std::nullopt;
  const uint64_t n = len >> unit_shift_;
  if (n > nbits_ - used_units_ - pinned_units_) return std::nullopt;
  const uint64_t a = align >> unit_shift_;
  // Alignment is of the logical address, not of the offset in the group:
  // groups need not start on a nodesize boundary.
  const uint64_t phase = ((align - start_ % align) % align) >> unit_shift_;

  const uint64_t from = first_fit ? 0 : cursor_;
  std::optional<uint64_t> pos = FindRun(from, nbits_, n, a, phase);
  // Wrap once. A run that starts before the cursor may reach past it, so the
  // second pass may look up to n - 1 units beyond.
  if (!pos && from > 0) pos = FindRun(0, std::min(nbits_, from + n - 1), n, a, phase);
  if (!pos) return std::nullopt;

  ForEachWordMask(*pos, n, [&](size_t w, uint64_t m) { bitmap_[w] |= m; });
  used_units_ += n;
  cursor_ = *pos + n == nbits_ ? 0 : *pos + n;
  ++stats_.allocations;
  return start_ + (*pos << unit_shift_);
}

Status BlockGroup::MakeClone() {
  const size_t bytes = bitmap_.size() * sizeof(uint64_t);
  const size_t alloc = (bytes + kPageSize - 1) / kPageSize * kPageSize;
  auto* p = static_cast<uint64_t*>(std::aligned_alloc(kPageSize, alloc));
  if (p == nullptr) {
    return Status::Error(ENOMEM, "block group " + Range(start_, length()) + ": cannot allocate a " +
                                     std::to_string(alloc) + "-byte clone bitmap");
  }
  std::memcpy(p, bitmap_.data(), bytes);
  std::memset(reinterpret_cast<uint8_t*>(p) + bytes, 0, alloc - bytes);
  clone_.reset(p);
  clone_alloc_bytes_ = alloc;
  g_clone_bytes += alloc;
  ++stats_.clones_made;
  return Status::Ok();
}

Status BlockGroup::Free(uint64_t start, uint64_t len) {
  uint64_t first = 0, n = 0;
  UB_RETURN_IF_ERROR(ToUnits("freeing", start, len, &first, &n));
  const uint64_t hole = FindNext<View::kBitmap>(first, first + n, false);
  if (hole != first + n) {
    const uint64_t hole_end = FindNext<View::kBitmap>(hole, first + n, true);
    const bool pinned = FindNext<View::kPinned>(hole, hole_end, true) != hole_end;
    return Status::Invalid("freeing " + Range(start, len) + " in block group " + Range(start_, length()) + ": " +
                           Range(start_ + (hole << unit_shift_), (hole_end - hole) << unit_shift_) +
                           (pinned ? " was already freed in this transaction" : " is not allocated") +
                           " (double free)");
  }
  if (!clone_) UB_RETURN_IF_ERROR(MakeClone());
  // Setting the freed bits in the clone, not only relying on the snapshot,
  // pins space that was allocated after the clone was made, too: the rule is
  // "freed since the last commit", whatever happened before.
  ForEachWordMask(first, n, [&](size_t w, uint64_t m) {
    clone_[w] |= m;
    bitmap_[w] &= ~m;
  });
  used_units_ -= n;
  pinned_units_ += n;
  ++stats_.frees;
  stats_.bytes_pinned += len;
  return Status::Ok();
}

Status BlockGroup::Truncate(uint64_t length) {
  if (length == 0 || length % unit_ != 0 || length > this->length()) {
    return Status::Invalid("truncating block group " + Range(start_, this->length()) + " to " +
                           std::to_string(length) + " bytes");
  }
  const uint64_t keep = length >> unit_shift_;
  for (uint64_t i = keep; i < nbits_; ++i) {
    const size_t w = i >> 6;
    const uint64_t m = 1ULL << (i & 63);
    const bool used = bitmap_[w] & m;
    const bool pinned = !used && ((clone_ && (clone_[w] & m)) || (sealed_ && (sealed_[w] & m)));
    if (used) --used_units_;
    if (pinned) --pinned_units_;
    bitmap_[w] &= ~m;
    if (clone_) clone_[w] &= ~m;
    if (sealed_) sealed_[w] &= ~m;
  }
  g_bitmap_bytes -= bitmap_.size() * sizeof(uint64_t);
  nbits_ = keep;
  bitmap_.resize((nbits_ + 63) / 64);
  g_bitmap_bytes += bitmap_.size() * sizeof(uint64_t);
  if (cursor_ >= nbits_) cursor_ = 0;
  return Status::Ok();
}

void BlockGroup::ReleaseClone(std::unique_ptr<uint64_t[], FreeDeleter>& c, size_t& bytes) {
  c.reset();
  g_clone_bytes -= bytes;
  bytes = 0;
}

void BlockGroup::Seal() {
  if (!clone_) return;
  if (!sealed_) {
    sealed_ = std::move(clone_);
    sealed_alloc_bytes_ = std::exchange(clone_alloc_bytes_, 0);
    return;
  }
  for (size_t w = 0; w < bitmap_.size(); ++w) sealed_[w] |= clone_[w];
  ReleaseClone(clone_, clone_alloc_bytes_);
}

void BlockGroup::Commit() {
  if (!sealed_) Seal();
  if (!sealed_) return;
  if (!clone_) {
    pinned_units_ = 0;
  } else {
    // Units pinned by the sealed clone alone become free.
    for (size_t w = 0; w < bitmap_.size(); ++w) {
      pinned_units_ -= std::popcount(sealed_[w] & ~clone_[w] & ~bitmap_[w]);
    }
  }
  ReleaseClone(sealed_, sealed_alloc_bytes_);
}

}  // namespace ubtrfs::alloc
