// ubtrfs balance --dconvert/--mconvert/--sconvert (ConvertProfiles of
// ubtrfs/resize.h): every chunk of a kind laid out anew in the profile
// asked, at its logical address, by txn::DeviceLayout::ConvertChunk.
#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <vector>

#include "alloc/chunk_map.h"
#include "format/ondisk.h"
#include "txn/balance_filters.h"
#include "txn/mkfs.h"
#include "txn/offline_open.h"
#include "txn/relocate.h"
#include "ubtrfs/resize.h"

namespace ubtrfs {

namespace {

// Profiles that keep more than one copy or parity: metadata leaves them
// only with force (the kernel's rule in btrfs_balance).
bool Redundant(uint64_t profile) {
  const alloc::ProfileRule r = alloc::RuleFor(profile);
  return r.copies >= 2 || r.parity >= 1;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Status ConvertProfiles(const std::vector<std::string>& devices, const ConvertOptions& options, ConvertResult* result) {
  using namespace ubtrfs::format;
  struct Target {
    uint64_t kind;
    const char* name;
    std::string text;
    uint64_t profile = 0;
  };
  std::vector<Target> targets;
  const std::string system = options.system.empty() ? options.metadata : options.system;
  for (Target t : {Target{kBlockGroupData, "data", options.data}, Target{kBlockGroupMetadata, "metadata", options.metadata},
                   Target{kBlockGroupSystem, "system", system}}) {
    if (t.text.empty()) continue;
    const std::optional<uint64_t> p = txn::ParseProfile(t.text);
    if (!p) {
      return Status::Invalid("unknown " + std::string(t.name) + " profile '" + t.text +
                             "' (single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5, raid6)");
    }
    t.profile = *p;
    targets.push_back(t);
  }
  if (targets.empty()) return Status::Invalid("nothing to convert: name a data, metadata or system profile");
  DeviceChangeOptions dco;
  dco.scan_dirs = options.scan_dirs;
  dco.degraded = options.degraded;
  UB_ASSIGN_OR_RETURN(txn::OpenedSet set, txn::OpenSet(devices, dco));
  txn::Volume& vol = *set.o.vol;
  const size_t ndevs = vol.devices().Devids().size();
  std::map<uint64_t, uint64_t> now;  // kind -> profiles in use (bits)
  for (const auto& [logical, c] : vol.chunks().chunks()) {
    for (const Target& t : targets) {
      if (c.type & t.kind) now[t.kind] |= c.profile() == 0 ? txn::DeviceLayout::kSingle : c.profile();
    }
  }
  for (const Target& t : targets) {
    const alloc::ProfileRule rule = alloc::RuleFor(t.profile);
    if (ndevs < rule.devs_min) {
      return Status::Invalid("unable to convert " + std::string(t.name) + " to " + Lower(t.text) + ": it needs " +
                             std::to_string(rule.devs_min) + " devices, the filesystem has " + std::to_string(ndevs) +
                             (vol.missing_devices().empty() ? "" : " present"));
    }
    if (t.kind != kBlockGroupData && !options.force && !Redundant(t.profile)) {
      bool had = false;
      for (uint64_t p = 1; p <= kBlockGroupRaid1c4; p <<= 1) had = had || ((now[t.kind] & p) && Redundant(p));
      if (had) {
        return Status::Invalid("converting " + std::string(t.name) + " to " + Lower(t.text) +
                               " reduces its redundancy; use --force if you want this");
      }
    }
  }
  for (const auto& [logical, c] : vol.chunks().chunks()) {
    if ((c.type & kBlockGroupData) && (c.type & kBlockGroupMetadata) && options.data != options.metadata) {
      return Status::Invalid("mixed data and metadata block groups: give the same profile for both");
    }
  }
  txn::DeviceLayout layout(set.o.txn.get());
  for (const Target& t : targets) layout.AllocateAs(t.kind, t.profile);
  ConvertResult r;
  txn::CopyStats copied;
  auto target_of = [&](const alloc::ChunkInfo& c) -> const Target* {
    for (const Target& t : targets) {
      if ((c.type & t.kind) && c.profile() != t.profile) return &t;
    }
    return nullptr;
  };
  // The chunks to convert: all of a kind, or those its filters take (the
  // least used first up to limit's MAX, none unless MIN), in address order.
  // A conversion keeps the chunk's logical address, so the list holds.
  const UsageFilter no_usage;
  const GroupFilter no_groups;
  const auto groups_of = [&](uint64_t kind) -> const GroupFilter& {
    return kind == kBlockGroupData ? options.data_groups : kind == kBlockGroupMetadata ? options.metadata_groups
                                                                                        : no_groups;
  };
  std::vector<txn::Candidate> picks;
  for (const auto& [l, c] : vol.chunks().chunks()) {
    const Target* t = target_of(c);
    if (t == nullptr) continue;
    const auto g = set.o.txn->space().FindGroup(l);
    const uint64_t used = g ? g->used_bytes - set.o.txn->ExcludedIn(l) : 0;
    const UsageFilter& usage = t->kind == kBlockGroupData       ? options.data_usage
                               : t->kind == kBlockGroupMetadata ? options.metadata_usage
                                                                : no_usage;
    if (txn::TakesChunk(usage, groups_of(t->kind), used, c)) picks.push_back({l, used, t->kind});
  }
  txn::ApplyLimits(&picks, groups_of);
  std::sort(picks.begin(), picks.end(),
            [](const txn::Candidate& a, const txn::Candidate& b) { return a.start < b.start; });
  for (const txn::Candidate& p : picks) {
    const uint64_t logical = p.start;
    // Gone meanwhile (a commit deleted it unused), or converted already.
    const alloc::ChunkInfo* now_c = vol.chunks().Find(logical);
    const Target* t = now_c != nullptr && now_c->logical == logical ? target_of(*now_c) : nullptr;
    if (t == nullptr) continue;
    const uint64_t profile = t->profile == 0 ? txn::DeviceLayout::kSingle : t->profile;
    Status st = layout.ConvertChunk(logical, profile, &copied);
    if (!st.ok()) {
      txn::Report(copied, &r);
      *result = r;
      return st.WithContext(std::to_string(r.chunks_converted) + " chunks converted before");
    }
    UB_RETURN_IF_ERROR(set.o.txn->Commit());
    ++r.chunks_converted;
  }
  txn::Report(copied, &r);
  *result = r;
  return Status::Ok();
}

}  // namespace ubtrfs
