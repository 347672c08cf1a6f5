#include "alloc/space_manager.h"

#include <bit>
#include <cerrno>

#include "format/ondisk.h"

namespace ubtrfs::alloc {

using format::kBlockGroupData;
using format::kBlockGroupMetadata;
using format::kBlockGroupSystem;
using format::kBlockGroupTypeMask;

namespace {

std::string Range(uint64_t start, uint64_t len) {
  return "[" + std::to_string(start) + ", +" + std::to_string(len) + ")";
}

}  // namespace

std::string SpaceManager::KindName(uint64_t kind_flags) {
  std::string name;
  auto add = [&](uint64_t bit, const char* n) {
    if (!(kind_flags & bit)) return;
    if (!name.empty()) name += "+";
    name += n;
  };
  add(kBlockGroupData, "data");
  add(kBlockGroupMetadata, "metadata");
  add(kBlockGroupSystem, "system");
  return name.empty() ? "untyped" : name;
}

Status SpaceManager::AddGroup(uint64_t start, uint64_t length, uint64_t flags) {
  UB_RETURN_IF_ERROR(BlockGroup::CheckGeometry(start, length, unit_));
  const std::string where = "adding block group " + Range(start, length);
  if ((flags & kBlockGroupTypeMask) == 0) return Status::Invalid(where + ": no data/metadata/system type bits");
  std::lock_guard lock(mu_);
  auto next = groups_.lower_bound(start);
  if (next != groups_.end() && next->first < start + length) {
    return Status::Invalid(where + ": overlaps block group " + Range(next->first, next->second->length()));
  }
  if (next != groups_.begin()) {
    const BlockGroup& prev = *std::prev(next)->second;
    if (prev.end() > start)
      return Status::Invalid(where + ": overlaps block group " + Range(prev.start(), prev.length()));
  }
  groups_.emplace(start, std::make_unique<BlockGroup>(start, length, flags, unit_));
  ++groups_added_;
  return Status::Ok();
}

Result<BlockGroup*> SpaceManager::GroupForRangeLocked(const char* what, uint64_t start, uint64_t len) const {
  auto it = groups_.upper_bound(start);
  if (it == groups_.begin() || !std::prev(it)->second->Contains(start)) {
    return Status::Invalid(std::string(what) + " " + Range(start, len) + ": not in any block group");
  }
  BlockGroup* g = std::prev(it)->second.get();
  if (len > g->end() - start) {
    return Status::Invalid(std::string(what) + " " + Range(start, len) + ": crosses the end of block group " +
                           Range(g->start(), g->length()));
  }
  return g;
}

Status SpaceManager::MarkUsed(uint64_t start, uint64_t len) {
  std::lock_guard lock(mu_);
  UB_ASSIGN_OR_RETURN(BlockGroup * g, GroupForRangeLocked("marking used", start, len));
  return g->MarkUsed(start, len);
}

Status SpaceManager::TruncateGroup(uint64_t start, uint64_t length) {
  std::lock_guard lock(mu_);
  auto it = groups_.find(start);
  if (it == groups_.end()) return Status::NotFound("no block group at " + std::to_string(start));
  return it->second->Truncate(length);
}

Status SpaceManager::RemoveGroup(uint64_t start, uint64_t used) {
  std::lock_guard lock(mu_);
  auto it = groups_.find(start);
  if (it == groups_.end()) return Status::NotFound("no block group at " + std::to_string(start));
  if (it->second->used_bytes() != used) {
    return Status::Invalid("block group " + std::to_string(start) + " holds " +
                           std::to_string(it->second->used_bytes()) + " bytes, not " + std::to_string(used) +
                           ": it is not unused");
  }
  groups_.erase(it);
  return Status::Ok();
}

Status SpaceManager::SetReadOnly(uint64_t start, bool on) {
  std::lock_guard lock(mu_);
  auto it = groups_.find(start);
  if (it == groups_.end()) return Status::NotFound("no block group at " + std::to_string(start));
  it->second->set_read_only(on);
  return Status::Ok();
}

Status SpaceManager::SetFlags(uint64_t start, uint64_t flags) {
  std::lock_guard lock(mu_);
  auto it = groups_.find(start);
  if (it == groups_.end()) return Status::NotFound("no block group at " + std::to_string(start));
  it->second->set_flags(flags);
  return Status::Ok();
}

Status SpaceManager::Free(uint64_t start, uint64_t len) {
  std::lock_guard lock(mu_);
  UB_ASSIGN_OR_RETURN(BlockGroup * g, GroupForRangeLocked("freeing", start, len));
  return g->Free(start, len);
}

void SpaceManager::Seal() {
  std::lock_guard lock(mu_);
  for (auto& [start, g] : groups_) g->Seal();
}

void SpaceManager::Commit() {
  std::lock_guard lock(mu_);
  // Tree blocks freed by the committed transaction are taken again before
  // fresh space: next-fit alone would walk a large metadata group to its
  // end before reusing anything, spreading the trees over the whole chunk
  // (an imported /usr/share: 124 MiB of chunk for 82 MiB of blocks), which
  // mkfs --shrink and resize then cannot give back.
  for (auto& [start, g] : groups_) {
    g->Commit();
    if (g->flags() & (kBlockGroupMetadata | kBlockGroupSystem)) g->Rewind();
  }
  hint_[std::countr_zero(kBlockGroupMetadata)] = 0;
  hint_[std::countr_zero(kBlockGroupSystem)] = 0;
}

void SpaceManager::set_new_chunk_hook(NewChunkFn fn) {
  std::lock_guard lock(mu_);
  new_chunk_ = std::move(fn);
}

std::optional<uint64_t> SpaceManager::TryAllocateLocked(uint64_t kind, uint64_t len, uint64_t align, bool first_fit) {
  uint64_t& hint = hint_[std::countr_zero(kind)];
  // Start at the group that served this kind last, so one group fills before
  // the next is touched, and wrap once.
  const auto first = first_fit ? groups_.begin() : groups_.lower_bound(hint);
  for (int pass = 0; pass < 2; ++pass) {
    const auto begin = pass == 0 ? first : groups_.begin();
    const auto end = pass == 0 ? groups_.end() : first;
    for (auto it = begin; it != end; ++it) {
      BlockGroup& g = *it->second;
      if (!(g.flags() & kind) || g.free_bytes() < len) continue;
      if (auto a = g.Allocate(len, align, first_fit)) {
        hint = g.start();
        return a;
      }
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> SpaceManager::TryAllocate(uint64_t kind, uint64_t len, uint64_t align, bool first_fit) {
  std::lock_guard lock(mu_);
  return TryAllocateLocked(kind, len, align, first_fit);
}

Result<uint64_t> SpaceManager::Allocate(uint64_t kind_flags, uint64_t len, uint64_t align, bool first_fit) {
  const uint64_t kind = kind_flags & kBlockGroupTypeMask;
  if (!std::has_single_bit(kind)) {
    return Status::Invalid("allocating " + std::to_string(len) + " bytes: kind " + KindName(kind) +
                           " must be exactly one of data, metadata, system");
  }
  if (align == 0) align = unit_;
  if (len == 0 || len % unit_ != 0 || align % unit_ != 0) {
    return Status::Invalid("allocating " + std::to_string(len) + " bytes aligned to " + std::to_string(align) +
                           ": not a non-empty multiple of " + std::to_string(unit_));
  }
  if (auto a = TryAllocate(kind, len, align, first_fit)) return *a;

  NewChunkFn hook;
  {
    std::lock_guard lock(mu_);
    // An allocation made by the hook itself (say, system space for the new
    // chunk item) must not call the hook again: chunk_mu_ is held.
    if (hook_thread_ != std::this_thread::get_id()) hook = new_chunk_;
  }
  std::string why;
  if (hook) {
    std::lock_guard chunk_lock(chunk_mu_);
    // Whoever held chunk_mu_ before us may have added the room we need.
    if (auto a = TryAllocate(kind, len, align, first_fit)) return *a;
    for (int round = 0; round < kMaxChunkRounds; ++round) {
      uint64_t added_before = 0;
      {
        std::lock_guard lock(mu_);
        hook_thread_ = std::this_thread::get_id();
        added_before = groups_added_;
      }
      Status s = hook(kind, len);
      bool added = false;
      {
        std::lock_guard lock(mu_);
        hook_thread_ = std::thread::id();
        if (s.ok()) {
          if (auto a = TryAllocateLocked(kind, len, align, first_fit)) return *a;
          added = groups_added_ != added_before;
        }
      }
      if (!s.ok() && s.code() != ENOSPC) {
        return s.WithContext("allocating " + std::to_string(len) + " bytes of " + KindName(kind) +
                             " space: adding a chunk");
      }
      if (!s.ok()) {
        why = " (no new chunk: " + s.message() + ")";
        break;
      }
      if (!added) {
        why = " (the new-chunk hook added no group)";
        break;
      }
      // The hook added a group but there is still no room: most likely other
      // threads, which do not wait for chunk_mu_ while they find room, took
      // it before we could retry. Ask again rather than fail spuriously.
      why = " (" + std::to_string(round + 1) + " new chunks added, none with room left for it)";
    }
  }
  return Status::Error(ENOSPC, "no free " + KindName(kind) + " space for " + std::to_string(len) + " bytes" +
                                   (align > unit_ ? " aligned to " + std::to_string(align) : std::string()) + why);
}

std::optional<SpaceManager::GroupInfo> SpaceManager::FindGroup(uint64_t logical) const {
  std::lock_guard lock(mu_);
  auto it = groups_.upper_bound(logical);
  if (it == groups_.begin()) return std::nullopt;
  const BlockGroup& g = *std::prev(it)->second;
  if (!g.Contains(logical)) return std::nullopt;
  return GroupInfo{g.start(), g.length(), g.flags(), g.used_bytes(), g.pinned_bytes(), g.free_bytes(), g.has_clone(), g.read_only()};
}

void SpaceManager::ForEachGroup(const std::function<void(const BlockGroup&)>& fn) const {
  std::lock_guard lock(mu_);
  for (const auto& [start, g] : groups_) fn(*g);
}

SpaceManager::Totals SpaceManager::TotalsFor(uint64_t kind_flags) const {
  const uint64_t kind = kind_flags & kBlockGroupTypeMask;
  Totals t;
  std::lock_guard lock(mu_);
  for (const auto& [start, g] : groups_) {
    if (!(g->flags() & kind)) continue;
    ++t.groups;
    t.total_bytes += g->length();
    t.used_bytes += g->used_bytes();
    t.pinned_bytes += g->pinned_bytes();
    t.free_bytes += g->free_bytes();
  }
  return t;
}

BlockGroup::Stats SpaceManager::stats() const {
  BlockGroup::Stats s;
  std::lock_guard lock(mu_);
  for (const auto& [start, g] : groups_) {
    s.allocations += g->stats().allocations;
    s.frees += g->stats().frees;
    s.clones_made += g->stats().clones_made;
    s.bytes_pinned += g->stats().bytes_pinned;
  }
  return s;
}

size_t SpaceManager::group_count() const {
  std::lock_guard lock(mu_);
  return groups_.size();
}

}  // namespace ubtrfs::alloc
