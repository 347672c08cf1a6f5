// ubtrfs balance -dusage=N -musage=N (RelocateGroups of ubtrfs/resize.h):
// the block groups the filters take (usage, limit, devid, drange, vrange),
// emptied one after the other by txn::RelocateGroup and deleted with their
// chunks.
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

// "S..E", "S..", "..E" or "N" (N..N+1 for limit's single number is the
// caller's); sizes with ParseByteSize's suffixes.
Status ParseRange(std::string_view text, std::string_view filter, uint64_t* lo, uint64_t* hi, bool single_ok) {
  const auto bad = [&](const std::string& why) {
    return Status::Invalid("filter '" + std::string(filter) + "': " + why);
  };
  const size_t dots = text.find("..");
  if (dots == std::string_view::npos) {
    if (!single_ok) return bad("a range S..E is needed");
    UB_RETURN_IF_ERROR(ParseByteSize(text, hi).WithContext("filter '" + std::string(filter) + "'"));
    *lo = 0;
    return Status::Ok();
  }
  const std::string_view a = text.substr(0, dots), b = text.substr(dots + 2);
  *lo = 0;
  *hi = UINT64_MAX;
  if (!a.empty()) UB_RETURN_IF_ERROR(ParseByteSize(a, lo).WithContext("filter '" + std::string(filter) + "'"));
  if (!b.empty()) UB_RETURN_IF_ERROR(ParseByteSize(b, hi).WithContext("filter '" + std::string(filter) + "'"));
  if (a.empty() && b.empty()) return bad("the range has no ends");
  if (*lo > *hi) return bad("the range is empty");
  return Status::Ok();
}

// Whether chunk `c` passes the filters other than usage and limit.
bool Passes(const GroupFilter& f, const alloc::ChunkInfo& c) {
  if (f.vrange && !(c.logical < f.vrange_end && c.logical + c.length > f.vrange_start)) return false;
  if (f.devid == 0) return true;
  for (const auto& s : c.stripes) {
    if (s.devid != f.devid) continue;
    if (!f.drange || (s.physical < f.drange_end && s.physical + c.stripe_size > f.drange_start)) return true;
  }
  return false;
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

Status ParseBalanceFilters(std::string_view text, UsageFilter* usage, GroupFilter* groups, std::string* convert) {
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view f = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (f.empty()) return Status::Invalid("filters '" + std::string(text) + "': an empty filter");
    const size_t eq = f.find('=');
    const std::string_view key = f.substr(0, eq), value = eq == std::string_view::npos ? "" : f.substr(eq + 1);
    if (key == "usage") {
      UB_RETURN_IF_ERROR(ParseUsageFilter(f, usage));
    } else if (key == "convert" && eq != std::string_view::npos) {
      *convert = std::string(value);
    } else if (key == "soft" && eq == std::string_view::npos) {
      // Conversion never touches a chunk already in the target profile.
    } else if (key == "limit") {
      uint64_t lo = 0, hi = 0;
      UB_RETURN_IF_ERROR(ParseRange(value, f, &lo, &hi, true));
      groups->limit_min = lo;
      groups->limit_max = hi;
      groups->on = true;
    } else if (key == "devid") {
      uint64_t id = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), id);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size() || id == 0) {
        return Status::Invalid("filter '" + std::string(f) + "': not a device id");
      }
      groups->devid = id;
      groups->on = true;
    } else if (key == "drange" || key == "vrange") {
      uint64_t lo = 0, hi = 0;
      UB_RETURN_IF_ERROR(ParseRange(value, f, &lo, &hi, false));
      if (key == "drange") {
        groups->drange = true, groups->drange_start = lo, groups->drange_end = hi;
      } else {
        groups->vrange = true, groups->vrange_start = lo, groups->vrange_end = hi;
      }
      groups->on = true;
    } else if (eq == std::string_view::npos && text.find(',') == std::string_view::npos) {
      *convert = std::string(f);  // "-d raid1": a profile alone
    } else {
      return Status::Invalid("filter '" + std::string(f) +
                             "': supported are usage=, limit=, devid=, drange=, vrange=, convert= and soft");
    }
  }
  if (groups->drange && groups->devid == 0) {
    return Status::Invalid("filters '" + std::string(text) + "': drange needs devid (the device the range is on)");
  }
  return Status::Ok();
}

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
  if (set.o.vol->super().incompat_flags.get() & kIncompatSimpleQuota) {
    return Status::Invalid("simple quotas are on: moving extents is not supported with them yet");
  }
  UB_RETURN_IF_ERROR(txn::RefuseKernelRelocation(*set.o.vol));
  struct Candidate {
    uint64_t start, used, kind;
  };
  // Mixed groups hold both kinds: the filter given for either takes them;
  // both given must agree (the kernel refuses them otherwise too).
  constexpr uint64_t kMixed = kBlockGroupData | kBlockGroupMetadata;
  const bool mixed_data = data_on;
  const auto same_groups = [](const GroupFilter& a, const GroupFilter& b) {
    return a.on == b.on && a.devid == b.devid && a.drange == b.drange && a.drange_start == b.drange_start &&
           a.drange_end == b.drange_end && a.vrange == b.vrange && a.vrange_start == b.vrange_start &&
           a.vrange_end == b.vrange_end && a.limit_min == b.limit_min && a.limit_max == b.limit_max;
  };
  if (data_on && metadata_on &&
      (options.data.on != options.metadata.on || options.data.min_percent != options.metadata.min_percent ||
       options.data.max_percent != options.metadata.max_percent ||
       !same_groups(options.data_groups, options.metadata_groups))) {
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
  std::vector<Candidate> take;
  txn.space().ForEachGroup([&](const alloc::BlockGroup& g) {
    const uint64_t kind = g.flags() & kBlockGroupTypeMask;
    const auto [usage, groups] = filters_of(kind);
    if (usage == nullptr || !(usage->on || groups->on) || g.read_only()) return;
    const uint64_t used = g.used_bytes() - txn.ExcludedIn(g.start());
    if (usage->on && !Takes(*usage, used, g.length())) return;
    const alloc::ChunkInfo* c = set.o.vol->chunks().Find(g.start());
    if (c == nullptr || !Passes(*groups, *c)) return;
    take.push_back({g.start(), used, kind});
  });
  std::sort(take.begin(), take.end(), [](const Candidate& a, const Candidate& b) {
    return a.used != b.used ? a.used < b.used : a.start < b.start;
  });
  // limit=MIN..MAX: at most MAX of a kind, lowest use first; none unless MIN qualify.
  for (const uint64_t kind : {kBlockGroupData, kBlockGroupMetadata, kMixed}) {
    const GroupFilter* groups = filters_of(kind).second;
    const size_t n = std::count_if(take.begin(), take.end(), [&](const Candidate& c) { return c.kind == kind; });
    size_t kept = 0;
    std::erase_if(take, [&](const Candidate& c) {
      return c.kind == kind && (n < groups->limit_min || ++kept > groups->limit_max);
    });
  }
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
