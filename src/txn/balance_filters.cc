// btrfs balance's filters (ubtrfs/resize.h: UsageFilter, GroupFilter):
// parsed from btrfs-progs' comma-separated lists, and applied to a block
// group or chunk, for RelocateGroups (balance_usage.cc) and ConvertProfiles
// (balance.cc) alike.
#include "txn/balance_filters.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <string>

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

// "S..E", "S.." or "..E"; with single_ok also "N", taken as ..N (limit=N:
// at most N). Sizes with ParseByteSize's suffixes.
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

namespace txn {

// The kernel's chunk_usage_filter and chunk_usage_range_filter: a group is
// taken when min% of its length <= used < max% of it (max 0: used < 1 byte).
bool TakesUsage(const UsageFilter& f, uint64_t used, uint64_t length) {
  const uint64_t lo = length / 100 * f.min_percent + length % 100 * f.min_percent / 100;
  const uint64_t hi = f.max_percent == 0 ? 1 : length / 100 * f.max_percent + length % 100 * f.max_percent / 100;
  return lo <= used && used < hi;
}

// Whether chunk `c` passes the filters other than usage and limit.
bool PassesGroups(const GroupFilter& f, const alloc::ChunkInfo& c) {
  if (f.vrange && !(c.logical < f.vrange_end && c.logical + c.length > f.vrange_start)) return false;
  if (f.devid == 0) return true;
  for (const auto& s : c.stripes) {
    if (s.devid != f.devid) continue;
    if (!f.drange || (s.physical < f.drange_end && s.physical + c.stripe_size > f.drange_start)) return true;
  }
  return false;
}

bool TakesChunk(const UsageFilter& usage, const GroupFilter& groups, uint64_t used, const alloc::ChunkInfo& c) {
  return (!usage.on || TakesUsage(usage, used, c.length)) && PassesGroups(groups, c);
}

void ApplyLimits(std::vector<Candidate>* take, const std::function<const GroupFilter&(uint64_t kind)>& groups_of) {
  std::sort(take->begin(), take->end(), [](const Candidate& a, const Candidate& b) {
    return a.used != b.used ? a.used < b.used : a.start < b.start;
  });
  std::map<uint64_t, size_t> qualify, kept;
  for (const Candidate& c : *take) ++qualify[c.kind];
  std::erase_if(*take, [&](const Candidate& c) {
    const GroupFilter& f = groups_of(c.kind);
    return qualify[c.kind] < f.limit_min || ++kept[c.kind] > f.limit_max;
  });
}

}  // namespace txn

}  // namespace ubtrfs
