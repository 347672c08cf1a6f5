// ubtrfs balance -dusage=N -musage=N (RelocateGroups of ubtrfs/resize.h):
// the block groups the filters take (usage, limit, devid, drange, vrange),
// emptied one after the other by txn::RelocateGroup and deleted with their
// chunks.
#include <algorithm>
#include <vector>

#include "alloc/chunk_map.h"
#include "format/ondisk.h"
#include "tree/cursor.h"
#include "txn/balance_filters.h"
#include "txn/extent_relocation.h"
#include "txn/offline_open.h"
#include "ubtrfs/resize.h"

namespace ubtrfs {

namespace {

uint64_t ChunkBytes(const txn::Volume& vol) {
  uint64_t total = 0;
  for (const auto& [logical, c] : vol.chunks().chunks()) {
    if (c.type & (format::kBlockGroupData | format::kBlockGroupMetadata)) total += c.stripe_size * c.stripes.size();
  }
  return total;
}

}  // namespace

Status RelocateGroups(const std::vector<std::string>& devices, const RelocateOptions& options, RelocateResult* result) {
  using namespace ubtrfs::format;
  *result = RelocateResult{};
  const bool data_on = options.data.on || options.data_groups.on;
  const bool metadata_on = options.metadata.on || options.metadata_groups.on;
  if (!data_on && !metadata_on) {
    return Status::Invalid("nothing to relocate: give a filter for data and/or metadata");
  }
  DeviceChangeOptions dco;
  dco.scan_dirs = options.scan_dirs;
  dco.degraded = options.degraded;
  UB_ASSIGN_OR_RETURN(txn::OpenedSet set, txn::OpenSet(devices, dco));
  txn::TxnManager& txn = *set.o.txn;
  if (!set.o.vol->missing_devices().empty()) {
    // New chunks would lack the missing device's copies (the kernel's
    // degraded allocations go single the same way), and the old chunks,
    // with a stripe there, could not be deleted: the moves would only cost.
    return Status::Invalid("a device of the filesystem is missing: replace it or remove it first "
                           "(ubtrfs device replace / device remove ... missing), then balance");
  }
  UB_RETURN_IF_ERROR(txn::RefuseKernelRelocation(*set.o.vol));
  // Mixed groups hold both kinds: the filter given for either takes them;
  // both given must agree (the kernel refuses them otherwise too).
  constexpr uint64_t kMixed = kBlockGroupData | kBlockGroupMetadata;
  const bool mixed_data = data_on;
  if (data_on && metadata_on &&
      (options.data != options.metadata || options.data_groups != options.metadata_groups)) {
    bool any_mixed = false;
    txn.space().ForEachGroup([&](const alloc::BlockGroup& g) { any_mixed |= (g.flags() & kMixed) == kMixed; });
    if (any_mixed) {
      return Status::Invalid("the filesystem has mixed data and metadata block groups: the data and metadata "
                             "filters must be the same");
    }
  }
  const auto filters_of = [&](uint64_t kind) -> std::pair<const UsageFilter*, const GroupFilter*> {
    const bool data = kind == kBlockGroupData || (kind == kMixed && mixed_data);
    if (data) return {&options.data, &options.data_groups};
    if (kind == kBlockGroupMetadata || kind == kMixed) return {&options.metadata, &options.metadata_groups};
    return {nullptr, nullptr};
  };
  std::vector<txn::Candidate> take;
  txn.space().ForEachGroup([&](const alloc::BlockGroup& g) {
    const uint64_t kind = g.flags() & kBlockGroupTypeMask;
    const auto [usage, groups] = filters_of(kind);
    if (usage == nullptr || !(usage->on || groups->on) || g.read_only()) return;
    const uint64_t used = g.used_bytes() - txn.ExcludedIn(g.start());
    const alloc::ChunkInfo* c = set.o.vol->chunks().Find(g.start());
    if (c != nullptr && txn::TakesChunk(*usage, *groups, used, *c)) take.push_back({g.start(), used, kind});
  });
  txn::ApplyLimits(&take, [&](uint64_t kind) -> const GroupFilter& { return *filters_of(kind).second; });
  RelocateResult r;
  r.groups_selected = take.size();
  r.chunk_bytes_before = ChunkBytes(*set.o.vol);
  txn::RelocationStats stats;
  Status st;
  // Data first, then metadata, then mixed. The groups of the kind still to be emptied
  // hand out nothing meanwhile, so what one gives up goes to the others or
  // to new chunks, not into the next one to be emptied (moved twice). Where
  // that leaves no room, they serve again, as the kernel's balance has it
  // (only the group being emptied is read-only).
  for (const uint64_t kind : {kBlockGroupData, kBlockGroupMetadata, kMixed}) {
    std::vector<uint64_t> held;
    auto release = [&] {
      for (uint64_t start : held) (void)txn.space().SetReadOnly(start, false);  // NotFound: the group went
      held.clear();
    };
    for (const txn::Candidate& c : take) {
      if (c.kind == kind && txn.space().SetReadOnly(c.start, true).ok()) held.push_back(c.start);
    }
    for (const txn::Candidate& c : take) {
      if (c.kind != kind) continue;
      const auto g = txn.space().FindGroup(c.start);
      if (!g || g->start != c.start) continue;  // went with an earlier commit
      Result<bool> gone = txn::RelocateGroup(txn, c.start, &stats);
      if (!gone.ok() && gone.status().code() == ENOSPC && !held.empty() && !txn.HasChanges()) {
        release();
        gone = txn::RelocateGroup(txn, c.start, &stats);
      }
      if (!gone.ok()) {
        st = gone.status().WithContext("block group " + std::to_string(c.start) + " (" +
                                       std::to_string(r.groups_emptied) + " emptied before)");
        break;
      }
      if (*gone) ++r.groups_emptied;
      std::erase(held, c.start);
    }
    release();
    if (!st.ok()) break;
  }
  r.data_extents = stats.data_extents;
  r.data_bytes = stats.data_bytes;
  r.tree_blocks = stats.tree_blocks;
  r.notes = std::move(stats.notes);
  r.chunk_bytes_after = ChunkBytes(*set.o.vol);
  *result = std::move(r);
  return st;
}

}  // namespace ubtrfs
