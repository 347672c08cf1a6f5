#include "check/qgroups.h"

#include <set>
#include <string>

#include "format/ondisk.h"
#include "txn/qgroup_recount.h"

namespace ubtrfs::check {

using namespace ubtrfs::format;

void CheckQgroups(tree::BlockReader* reader, const tree::RootPtr& extent_root, const tree::RootPtr& quota_root,
                  uint32_t nodesize, uint64_t generation, std::function<std::optional<tree::RootPtr>(uint64_t)> root_of,
                  Report* report) {
  auto stored = txn::ReadQgroups(reader, quota_root);
  if (!stored.ok()) return report->Error("quota tree: " + stored.status().message());
  const bool known_off = stored->status_flags & (kQgroupStatusInconsistent | kQgroupStatusRescan);
  // The kernel rewrites the status at every commit with quotas on; a mount
  // that finds it of another generation marks the numbers inconsistent.
  // Numbers marked so already lose nothing more (btrfs-progs' fsck-tests
  // 036, a rescan that never started: btrfs check accepts it).
  if ((stored->status_flags & kQgroupStatusOn) && stored->status_generation != generation) {
    const std::string line = "quota tree: the status item's generation is " +
                             std::to_string(stored->status_generation) + ", the commit's " +
                             std::to_string(generation) + " (a mount marks the numbers inconsistent)";
    if (known_off) {
      report->Warning(line);
    } else {
      report->Error(line);
    }
  }
  std::set<uint64_t> ids;
  for (const auto& [id, c] : stored->counts) ids.insert(id);
  txn::RootWalk walk(reader, extent_root, std::move(root_of));
  auto counted = txn::RecountQgroups(reader, extent_root, nodesize, &walk, stored->parents, ids);
  if (!counted.ok()) return report->Error("quota groups: counting them: " + counted.status().message());
  size_t differ = 0;
  for (const auto& [id, have] : stored->counts) {
    const txn::QgroupCount& want = (*counted)[id];
    if (have == want) continue;
    ++differ;
    const std::string line = "qgroup " + txn::QgroupName(id) + ": referenced " + std::to_string(have.rfer) +
                             ", exclusive " + std::to_string(have.excl) + "; counted " + std::to_string(want.rfer) +
                             " and " + std::to_string(want.excl);
    if (known_off) {
      report->Warning(line);
    } else {
      report->Error(line);
    }
  }
  if (known_off && differ > 0) {
    report->Warning("the quota status says the numbers are off (" +
                    std::string(stored->status_flags & kQgroupStatusRescan ? "a rescan is not finished" : "INCONSISTENT") +
                    "): `ubtrfs quota rescan` counts them anew");
  }
}

}  // namespace ubtrfs::check
