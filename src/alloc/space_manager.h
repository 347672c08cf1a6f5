// All block groups of a file system and the allocation policy across them:
// which groups may serve a kind of space, and what happens when none can.
#ifndef UBTRFS_ALLOC_SPACE_MANAGER_H_
#define UBTRFS_ALLOC_SPACE_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "alloc/block_group.h"
#include "ubtrfs/status.h"

namespace ubtrfs::alloc {

// Thread-safe. One mutex (mu_) guards the group map and every BlockGroup in
// it; allocations are short bitmap scans, so finer locking would buy little.
// A second mutex (chunk_mu_) serializes calls to the new-chunk hook so that
// threads running out of space at the same moment add one chunk, not one
// each. The hook runs with mu_ released, so it may call back into the
// manager (AddGroup, Allocate of SYSTEM space for the chunk item, ...).
class SpaceManager {
 public:
  // Called when no group of a kind can satisfy an allocation. It should
  // create a chunk of that kind with room for at least min_len bytes and
  // register it with AddGroup(). Returning an error, or ok without adding a
  // group, makes the allocation fail with ENOSPC (or with the hook's own
  // error if that is not ENOSPC). kind_flags holds exactly one of DATA,
  // METADATA, SYSTEM. Allocate() calls it once per failed search; only if
  // the hook did add a group and other threads used it up before the caller
  // could retry is it called again, at most kMaxChunkRounds times in all.
  using NewChunkFn = std::function<Status(uint64_t kind_flags, uint64_t min_len)>;

  static constexpr int kMaxChunkRounds = 4;

  struct Totals {
    size_t groups = 0;
    uint64_t total_bytes = 0;
    uint64_t used_bytes = 0;
    uint64_t pinned_bytes = 0;
    uint64_t free_bytes = 0;  // allocatable now
  };

  // A snapshot of one group, safe to keep after the lock is gone.
  struct GroupInfo {
    uint64_t start = 0;
    uint64_t length = 0;
    uint64_t flags = 0;
    uint64_t used_bytes = 0;
    uint64_t pinned_bytes = 0;
    uint64_t free_bytes = 0;
    bool has_clone = false;
    bool read_only = false;
  };

  // unit: the bitmap granularity of every group (the sectorsize).
  explicit SpaceManager(uint32_t unit) : unit_(unit) {}
  SpaceManager(const SpaceManager&) = delete;
  SpaceManager& operator=(const SpaceManager&) = delete;

  uint32_t unit() const { return unit_; }

  // Adds a group with all space free. flags must contain at least one of
  // DATA/METADATA/SYSTEM (profile bits are kept, not interpreted); the
  // range must be unit-aligned and overlap no other group.
  Status AddGroup(uint64_t start, uint64_t length, uint64_t flags);
  // Committed state from disk; the range must lie in one group.
  Status MarkUsed(uint64_t start, uint64_t len);
  // BlockGroup::Truncate of the group that starts at `start`.
  Status TruncateGroup(uint64_t start, uint64_t length);
  // Takes the group that starts at `start` away (its chunk is deleted). It
  // must hold exactly `used` bytes in use (what the owner keeps out of
  // allocation: superblock stripes); what it has pinned goes with it, and
  // the owner keeps its device space untouched until that is durable.
  Status RemoveGroup(uint64_t start, uint64_t used);
  // BlockGroup::set_read_only of the group that starts at `start` (a seed
  // device's for good; one being emptied by relocation until it is gone).
  Status SetReadOnly(uint64_t start, bool on = true);
  // BlockGroup::set_flags: a group whose chunk was converted to another
  // profile (balance).
  Status SetFlags(uint64_t start, uint64_t flags);

  void set_new_chunk_hook(NewChunkFn fn);

  // Allocates len bytes aligned (in logical space) to align from a group
  // whose type bits include the kind (kind_flags & type mask must be exactly
  // one of DATA, METADATA, SYSTEM; a DATA|METADATA mixed group serves both).
  // Groups are tried next-fit, starting with the one that served this kind
  // last. When none has room the new-chunk hook, if any, is called and the
  // search retried (see NewChunkFn); then ENOSPC. EINVAL for malformed
  // arguments. `first_fit`: groups in address order, each searched from its
  // start (BlockGroup::Allocate), for the lowest free run.
  Result<uint64_t> Allocate(uint64_t kind_flags, uint64_t len, uint64_t align, bool first_fit = false);

  // Frees [start, start + len), which must lie in one group; see
  // BlockGroup::Free for the clone rule and the double-free check.
  Status Free(uint64_t start, uint64_t len);

  // The running transaction is complete and being written while the next
  // one may already run: BlockGroup::Seal of every group.
  void Seal();
  // The oldest transaction not yet on disk is (the sealed one, else the
  // running one): BlockGroup::Commit of every group.
  void Commit();

  std::optional<GroupInfo> FindGroup(uint64_t logical) const;
  // Visits groups in address order with the lock held: fn must not call
  // back into this manager. For writing the free space tree, reports, tests.
  void ForEachGroup(const std::function<void(const BlockGroup&)>& fn) const;
  // Sums over groups serving the kind (mixed groups count for both kinds).
  Totals TotalsFor(uint64_t kind_flags) const;
  // Counters summed over all groups.
  BlockGroup::Stats stats() const;
  size_t group_count() const;

  static std::string KindName(uint64_t kind_flags);

 private:
  // Under mu_. nullopt when no group of the kind has room.
  std::optional<uint64_t> TryAllocateLocked(uint64_t kind, uint64_t len, uint64_t align, bool first_fit);
  std::optional<uint64_t> TryAllocate(uint64_t kind, uint64_t len, uint64_t align, bool first_fit);
  // Under mu_. The group containing [start, start + len), or an error.
  Result<BlockGroup*> GroupForRangeLocked(const char* what, uint64_t start, uint64_t len) const;

  const uint32_t unit_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<BlockGroup>> groups_;  // keyed by start; guarded by mu_
  uint64_t hint_[3] = {0, 0, 0};  // per kind (bit index), start of the group that served last; mu_
  uint64_t groups_added_ = 0;     // tells the hook caller whether the hook added anything; mu_
  NewChunkFn new_chunk_;          // mu_
  std::thread::id hook_thread_;   // the thread inside new_chunk_, if any; mu_
  std::mutex chunk_mu_;           // serializes new_chunk_ calls
};

}  // namespace ubtrfs::alloc

#endif  // UBTRFS_ALLOC_SPACE_MANAGER_H_
