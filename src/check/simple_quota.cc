#include "check/simple_quota.h"

#include <set>
#include <string>

#include "format/ondisk.h"
#include "tree/cursor.h"
#include "txn/qgroup_recount.h"

namespace ubtrfs::check {

using namespace ubtrfs::format;

using txn::QgroupName;

void SimpleQuotaCount::Load(tree::BlockReader* reader, const tree::RootPtr& quota_root, bool incompat_simple,
                            Report* report) {
  if (!incompat_simple || quota_root.bytenr == 0) return;
  reader_ = reader;
  tree::Cursor c(reader, quota_root);
  Status s = c.SeekFirst();
  bool have_status = false;
  while (s.ok() && c.Valid()) {
    const Key k = c.key();
    auto d = c.data();
    if (k.type == kQgroupStatusKey) {
      have_status = true;
      if (d.size() < sizeof(QgroupStatusItemSimple)) {
        report->Error("quota tree: the status item of simple quotas is " + std::to_string(d.size()) + " bytes");
        return;
      }
      const auto* st = reinterpret_cast<const QgroupStatusItemSimple*>(d.data());
      if (!(st->base.flags.get() & kQgroupStatusSimpleMode)) {
        report->Error("quota tree: SIMPLE_QUOTA is set but the status item is not in simple mode");
        return;
      }
      // Quotas off or being turned off: the numbers mean nothing.
      if (!(st->base.flags.get() & kQgroupStatusOn)) return;
      enable_gen_ = st->enable_gen.get();
    } else if (k.type == kQgroupInfoKey && d.size() >= sizeof(QgroupInfoItem)) {
      const auto* in = reinterpret_cast<const QgroupInfoItem*>(d.data());
      groups_[k.offset].rfer = in->rfer.get();
      groups_[k.offset].excl = in->excl.get();
    } else if (k.type == kQgroupRelationKey && k.objectid < k.offset) {
      groups_[k.objectid].parents.push_back(k.offset);
    }
    s = c.Next();
  }
  if (!s.ok()) {
    report->Error("quota tree: " + s.ToString());
    return;
  }
  if (!have_status) {
    report->Error("quota tree: no status item");
    return;
  }
  active_ = true;
}

void SimpleQuotaCount::Extent(const ExtentRec& e, uint64_t block_owner) {
  if (!active_ || e.generation < enable_gen_) return;
  uint64_t owner = e.tree_block ? block_owner : e.owner_ref;
  if (e.tree_block && owner == 0) {
    // Unreadable blocks were reported by the walk; they count for nobody.
    if (auto b = reader_->Read(tree::BlockCheck{e.start, e.level, 0, {}}); b.ok()) owner = (*b)->header().owner.get();
  }
  if (!IsSubvolumeTree(owner) || !groups_.count(owner)) return;
  std::set<uint64_t> seen;
  std::vector<uint64_t> todo = {owner};
  while (!todo.empty()) {
    const uint64_t id = todo.back();
    todo.pop_back();
    if (!seen.insert(id).second) continue;
    auto it = groups_.find(id);
    if (it == groups_.end()) continue;
    it->second.count += e.len;
    todo.insert(todo.end(), it->second.parents.begin(), it->second.parents.end());
  }
}

void SimpleQuotaCount::Finish(const std::vector<uint64_t>& subvols, Report* report) const {
  if (!active_) return;
  for (uint64_t id : subvols) {
    if (!groups_.count(id)) {
      report->Error("quota tree: subvolume " + std::to_string(id) + " has no qgroup " + QgroupName(id) +
                    " (simple quotas): the kernel aborts the first transaction that changes it");
    }
  }
  for (const auto& [id, g] : groups_) {
    if (g.rfer == g.count && g.excl == g.count) continue;
    report->Error("quota tree: qgroup " + QgroupName(id) + " (simple quotas) has referenced " +
                  std::to_string(g.rfer) + " exclusive " + std::to_string(g.excl) + ", its extents add up to " +
                  std::to_string(g.count));
  }
}

}  // namespace ubtrfs::check
