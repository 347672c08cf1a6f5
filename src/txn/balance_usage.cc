// ubtrfs balance -dusage=N -musage=N (RelocateGroups of ubtrfs/resize.h):
// the block groups the usage filters take, emptied one after the other by
// txn::RelocateGroup and deleted with their chunks.
#include <algorithm>
#include <charconv>
#include <vector>

#include "alloc/chunk_map.h"
#include "format/ondisk.h"
#include "tree/cursor.h"
#include "txn/extent_relocation.h"
#include "txn/offline_open.h"
#include "ubtrfs/resize.h"

namespace ubtrfs {

namespace {

Result<uint32_t> Percent(std::string_view t, std::string_view whole) {
  uint32_t v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size() || v > 100) {
    return Status::Invalid("usage filter '" + std::string(whole) + "': '" + std::string(t) +
                           "' is not a percentage from 0 to 100");
  }
  return v;
}

// The kernel's chunk_usage_filter and chunk_usage_range_filter: a group is
// taken when min% of its length <= used < max% of it (max 0: used < 1 byte).
bool Takes(const UsageFilter& f, uint64_t used, uint64_t length) {
  const uint64_t lo = length / 100 * f.min_percent + length % 100 * f.min_percent / 100;
  const uint64_t hi = f.max_percent == 0 ? 1 : length / 100 * f.max_percent + length % 100 * f.max_percent / 100;
  return lo <= used && used < hi;
}

uint64_t ChunkBytes(const txn::Volume& vol) {
  uint64_t total = 0;
  for (const auto& [logical, c] : vol.chunks().chunks()) {
    if (c.type & (format::kBlockGroupData | format::kBlockGroupMetadata)) total += c.stripe_size * c.stripes.size();
  }
  return total;
}

}  // namespace

Status ParseUsageFilter(std::string_view text, UsageFilter* out) {
  constexpr std::string_view kPrefix = "usage=";
  if (!text.starts_with(kPrefix)) {
    return Status::Invalid("filter '" + std::string(text) + "': only usage=N and usage=MIN..MAX are supported");
  }
  std::string_view v = text.substr(kPrefix.size());
  UsageFilter f;
  f.on = true;
  if (const size_t dots = v.find(".."); dots != std::string_view::npos) {
    UB_ASSIGN_OR_RETURN(f.min_percent, Percent(v.substr(0, dots), text));
    UB_ASSIGN_OR_RETURN(f.max_percent, Percent(v.substr(dots + 2), text));
    if (f.min_percent > f.max_percent) {
      return Status::Invalid("usage filter '" + std::string(text) + "': the range is empty");
    }
  } else {
    UB_ASSIGN_OR_RETURN(f.max_percent, Percent(v, text));
  }
  *out = f;
  return Status::Ok();
}

Status RelocateGroups(const std::vector<std::string>& devices, const RelocateOptions& options, RelocateResult* result) {
  using namespace ubtrfs::format;
  *result = RelocateResult{};
  if (!options.data.on && !options.metadata.on) {
    return Status::Invalid("nothing to relocate: give a usage filter for data and/or metadata");
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
  if (set.o.vol->super().incompat_flags.get() & kIncompatSimpleQuota) {
    return Status::Invalid("simple quotas are on: moving extents is not supported with them yet");
  }
  {
    // The kernel's relocation trees of a balance it did not finish: it
    // merges them at its next mount, and their blocks are the kernel's to
    // account for.
    tree::Cursor c(set.o.vol->source(), set.o.vol->root_tree());
    UB_RETURN_IF_ERROR(c.Seek(Key{kTreeRelocObjectid, 0, 0}));
    if (c.Valid() && c.key().objectid == kTreeRelocObjectid) {
      return Status::Invalid("a balance of the kernel's was interrupted here (it left relocation trees): "
                             "mount the filesystem with the kernel once to finish or cancel it");
    }
  }
  struct Candidate {
    uint64_t start, used, kind;
  };
  // Mixed groups hold both kinds: the filter given for either takes them;
  // both given must agree (the kernel refuses them otherwise too).
  constexpr uint64_t kMixed = kBlockGroupData | kBlockGroupMetadata;
  const UsageFilter* mixed_filter = options.data.on ? &options.data : &options.metadata;
  if (options.data.on && options.metadata.on &&
      (options.data.min_percent != options.metadata.min_percent ||
       options.data.max_percent != options.metadata.max_percent)) {
    bool any_mixed = false;
    txn.space().ForEachGroup([&](const alloc::BlockGroup& g) { any_mixed |= (g.flags() & kMixed) == kMixed; });
    if (any_mixed) {
      return Status::Invalid("the filesystem has mixed data and metadata block groups: the data and metadata "
                             "usage filters must be the same");
    }
  }
  std::vector<Candidate> take;
  txn.space().ForEachGroup([&](const alloc::BlockGroup& g) {
    const uint64_t kind = g.flags() & kBlockGroupTypeMask;
    const UsageFilter* f = kind == kBlockGroupData       ? &options.data
                           : kind == kBlockGroupMetadata ? &options.metadata
                           : kind == kMixed              ? mixed_filter
                                                         : nullptr;
    if (f == nullptr || !f->on || g.read_only()) return;
    const uint64_t used = g.used_bytes() - txn.ExcludedIn(g.start());
    if (Takes(*f, used, g.length())) take.push_back({g.start(), used, kind});
  });
  std::sort(take.begin(), take.end(), [](const Candidate& a, const Candidate& b) {
    return a.used != b.used ? a.used < b.used : a.start < b.start;
  });
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
    for (const Candidate& c : take) {
      if (c.kind == kind && txn.space().SetReadOnly(c.start, true).ok()) held.push_back(c.start);
    }
    for (const Candidate& c : take) {
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
