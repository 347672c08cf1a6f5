// One block group: the free-space bitmap of a chunk's logical range, and the
// clone that keeps space freed by the running transaction from being handed
// out again before that transaction is on disk.
//
// The rule (after gfs2's bi_clone): the last committed tree may still point
// at a block that the running transaction has freed. If the allocator gave
// that block to a new tree block and the machine crashed before the commit,
// the committed tree would come back damaged. So a unit is allocatable only
// when it is free in the bitmap AND free in the clone, and the clone lives
// from the first Free after a commit until the next Commit().
//
// A commit that writes its superblock while the next transaction already
// runs (txn/commit_tail.h) seals the clone first: the sealed one keeps what
// the committing transaction freed pinned until that superblock is on disk,
// and the next transaction's frees start a clone of their own.
#ifndef UBTRFS_ALLOC_BLOCK_GROUP_H_
#define UBTRFS_ALLOC_BLOCK_GROUP_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ubtrfs/status.h"

namespace ubtrfs::alloc {

// Not thread-safe: every call must be serialized by the owner. Inside the
// file system the owner is SpaceManager, whose mutex guards all its groups.
//
// Bit i of the bitmap covers [start + i * unit, start + (i + 1) * unit);
// a set bit means used. Space is in exactly one of three states:
//   used     set in the bitmap;
//   pinned   clear in the bitmap, set in the clone or the sealed clone
//            (freed since the last commit, reusable only after the
//            Commit() of the transaction that freed it);
//   free     clear in both; Allocate() hands out only this.
// used_bytes() + pinned_bytes() + free_bytes() == length() always.
class BlockGroup {
 public:
  struct Stats {
    uint64_t allocations = 0;   // successful Allocate() calls
    uint64_t frees = 0;         // successful Free() calls
    uint64_t clones_made = 0;   // one per transaction that freed space here
    uint64_t bytes_pinned = 0;  // over the group's life; pinned_bytes() is the current figure
  };

  using ExtentFn = std::function<void(uint64_t start, uint64_t len)>;

  // Checks what the constructor requires: unit a power of two >= 512, start
  // and length multiples of unit, length > 0, no wrap past 2^64.
  static Status CheckGeometry(uint64_t start, uint64_t length, uint32_t unit);
  // The checked way to make a group (the constructor trusts its arguments).
  static Result<std::unique_ptr<BlockGroup>> Create(uint64_t start, uint64_t length, uint64_t flags, uint32_t unit);

  // Requires CheckGeometry(start, length, unit).ok(). All space starts free.
  BlockGroup(uint64_t start, uint64_t length, uint64_t flags, uint32_t unit);
  ~BlockGroup();
  BlockGroup(const BlockGroup&) = delete;
  BlockGroup& operator=(const BlockGroup&) = delete;

  // Records space that the committed state already uses (loading the extent
  // tree or the free space tree). Fails if the range leaves the group, is not
  // unit-aligned, or overlaps used or pinned space; nothing changes then.
  Status MarkUsed(uint64_t start, uint64_t len);

  // Finds `len` bytes (a multiple of unit) of free space whose logical start
  // is a multiple of `align` (a multiple of unit; 0 means unit), marks them
  // used and returns the start. Next-fit: the search starts where the last
  // allocation ended, so successive allocations are contiguous, and wraps
  // around once; first-fit (`first_fit`) starts at the group's start, so a
  // smaller run fills a gap a larger one left (relocation packing). nullopt
  // when no such run exists or the arguments are not multiples of unit.
  std::optional<uint64_t> Allocate(uint64_t len, uint64_t align, bool first_fit = false);

  // Frees space in the running transaction. The first Free after a commit
  // makes the clone (one page-aligned copy of the whole bitmap, taken before
  // any bit is cleared); every freed unit is also set in the clone, so it
  // stays pinned until Commit(). Freeing space that is not used (a double
  // free) fails naming the range, and so do ranges outside the group or not
  // unit-aligned; nothing changes then. ENOMEM if the clone cannot be made.
  Status Free(uint64_t start, uint64_t len);

  // The running transaction is complete and being written: what it freed
  // moves to the sealed clone, pinned until Commit(); later frees belong to
  // the next transaction. Sealing again before that Commit() (a commit
  // whose superblock never got written) folds the two together, so nothing
  // either freed is handed out until a superblock after both is durable.
  void Seal();
  // The oldest transaction not yet on disk now is: the sealed one, or
  // without one the running one (sealed at once). The space it freed
  // becomes free; what a later transaction freed stays pinned.
  void Commit();

  // Cuts the group to its first `length` bytes (a multiple of unit, > 0):
  // whatever the tail held (a range marked used to keep allocations out of
  // it, superblock stripes) goes with it; the owner has made sure that
  // nothing there is in use (txn/relocate.cc).
  Status Truncate(uint64_t length);
  // The next search starts at the group's start again.
  void Rewind() { cursor_ = 0; }
  // A read-only group hands out nothing and counts no free space, as the
  // kernel's read-only block groups (a seed device's, under a sprout); what
  // is freed in it is still tracked, for its item and the free space tree.
  void set_read_only(bool on = true) { read_only_ = on; }
  // A chunk converted to another profile (balance): its type and profile
  // bits; the space it holds stays as it is.
  void set_flags(uint64_t flags) { flags_ = flags; }
  bool read_only() const { return read_only_; }

  uint64_t start() const { return start_; }
  uint64_t length() const { return nbits_ * unit_; }
  uint64_t end() const { return start_ + length(); }
  uint64_t flags() const { return flags_; }
  uint32_t unit() const { return unit_; }
  bool Contains(uint64_t logical) const { return logical >= start_ && logical - start_ < length(); }

  uint64_t used_bytes() const { return used_units_ * unit_; }
  uint64_t pinned_bytes() const { return pinned_units_ * unit_; }
  uint64_t free_bytes() const { return read_only_ ? 0 : (nbits_ - used_units_ - pinned_units_) * unit_; }
  bool has_clone() const { return clone_ != nullptr || sealed_ != nullptr; }
  const Stats& stats() const { return stats_; }

  // Maximal extents in ascending order. "Free" is the bitmap's view, i.e. the
  // state the running transaction will commit (pinned space counts as free):
  // this is what the free space tree is written from. Pinned extents are
  // those that Allocate() must still avoid.
  void ForEachFreeExtent(const ExtentFn& fn) const;
  void ForEachUsedExtent(const ExtentFn& fn) const;
  void ForEachPinnedExtent(const ExtentFn& fn) const;

  // Bytes held by all live bitmaps and clones in the process.
  static uint64_t bitmap_bytes_in_use();
  static uint64_t clone_bytes_in_use();

 private:
  // Which bits a scan looks at: the bitmap alone, used-or-pinned (what the
  // allocator must avoid), or pinned alone.
  enum class View { kBitmap, kUnavailable, kPinned };

  struct FreeDeleter {
    void operator()(uint64_t* p) const { std::free(p); }
  };

  template <View V>
  uint64_t Word(size_t w) const;
  // First bit index in [pos, end) whose value in view V is `set`; end if none.
  template <View V>
  uint64_t FindNext(uint64_t pos, uint64_t end, bool set) const;
  template <View V>
  void ForEachRun(const ExtentFn& fn) const;
  // First start in [from, end - n] with start % a == phase and n units free.
  std::optional<uint64_t> FindRun(uint64_t from, uint64_t end, uint64_t n, uint64_t a, uint64_t phase) const;

  // Turns a byte range into unit indexes, or says why it cannot.
  Status ToUnits(const char* what, uint64_t start, uint64_t len, uint64_t* first, uint64_t* n) const;
  Status MakeClone();
  void ReleaseClone(std::unique_ptr<uint64_t[], FreeDeleter>& c, size_t& bytes);

  uint64_t start_;
  uint64_t flags_;
  uint32_t unit_;
  int unit_shift_;
  uint64_t nbits_;
  std::vector<uint64_t> bitmap_;
  std::unique_ptr<uint64_t[], FreeDeleter> clone_;
  size_t clone_alloc_bytes_ = 0;
  std::unique_ptr<uint64_t[], FreeDeleter> sealed_;  // the committing transaction's clone (Seal)
  size_t sealed_alloc_bytes_ = 0;
  uint64_t used_units_ = 0;
  uint64_t pinned_units_ = 0;
  uint64_t cursor_ = 0;  // next-fit: unit index where the next search starts
  bool read_only_ = false;
  Stats stats_;
};

}  // namespace ubtrfs::alloc

#endif  // UBTRFS_ALLOC_BLOCK_GROUP_H_
