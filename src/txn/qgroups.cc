// Quota groups, kept exact at every commit as the kernel's qgroup accounting
// keeps them (fs/btrfs/qgroup.c): for each extent whose references changed
// in the transaction, the set of subvolumes that reach it before (the
// committed extent tree) and after (the extent tree the commit writes) is
// found by walking its back references up (a ref by tree names the tree; a
// ref by parent block leads to that block's own refs). A qgroup's
// referenced bytes change where it reaches the extent on one side only, its
// exclusive bytes where every reaching subvolume is its own on one side only.
//
// Two changes alter which subvolumes reach blocks whose own references stay
// as they are, and are handled as the kernel handles them:
// - a snapshot: the new qgroup inherits the source's numbers (everything but
//   the two root blocks is shared from then on: the kernel's
//   btrfs_qgroup_inherit), and the transaction's other changes are counted
//   from that state: every extent the source reached (but its root block)
//   counts as reached by the snapshot too before, and the snapshot's root
//   copy as its own;
// - a dropped subvolume's shared block: every block and data extent below it
//   loses the dropped tree, so they are all walked (TraceDroppedSubtree).
#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <tuple>

#include "format/ondisk.h"
#include "txn/extent_refs.h"
#include "txn/qgroup_recount.h"
#include "txn/root_walk.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::Cursor;

namespace {

template <typename T>
std::vector<uint8_t> Bytes(const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  return std::vector<uint8_t>(p, p + sizeof(T));
}

}  // namespace

Status TxnManager::LoadQuotas() {
  auto q = vol_->FindRoot(kQuotaTreeObjectid);
  if (!q.ok()) return Status::Ok();  // quotas were never enabled
  auto state = std::make_unique<QuotaState>();
  bool have_status = false;
  Cursor c(vol_->reader(), q->ref);
  UB_RETURN_IF_ERROR(c.SeekFirst());
  while (c.Valid()) {
    const Key k = c.key();
    auto d = c.data();
    if (k.type == kQgroupStatusKey) {
      if (d.size() < sizeof(QgroupStatusItem)) return Status::Corrupt("quota tree: short status item");
      const auto* st = reinterpret_cast<const QgroupStatusItem*>(d.data());
      have_status = true;
      if (!(st->flags.get() & kQgroupStatusOn)) {
        return Status::Unsupported("writing to an image whose quotas are being turned off (mount it once)");
      }
      // A rescan the kernel had not finished: done at this open, as the
      // kernel's mount resumes it (TxnManager::Load).
      state->rescan_at_open = st->flags.get() & kQgroupStatusRescan;
      state->simple = st->flags.get() & kQgroupStatusSimpleMode;
      if (state->simple != bool(vol_->super().incompat_flags.get() & kIncompatSimpleQuota)) {
        return Status::Unsupported("writing to an image whose quota status and SIMPLE_QUOTA flag disagree");
      }
      if (state->simple) {
        if (d.size() < sizeof(QgroupStatusItemSimple)) return Status::Corrupt("quota tree: short simple status item");
        state->enable_gen = reinterpret_cast<const QgroupStatusItemSimple*>(d.data())->enable_gen.get();
      }
    } else if (k.type == kQgroupInfoKey) {
      if (d.size() < sizeof(QgroupInfoItem)) return Status::Corrupt("quota tree: short item " + KeyToString(k));
      const auto* in = reinterpret_cast<const QgroupInfoItem*>(d.data());
      Qgroup& g = state->groups[k.offset];
      g.rfer = in->rfer.get();
      g.excl = in->excl.get();
      g.rfer_cmpr = in->rfer_cmpr.get();
      g.excl_cmpr = in->excl_cmpr.get();
    } else if (k.type == kQgroupLimitKey) {
      if (d.size() < sizeof(QgroupLimitItem)) return Status::Corrupt("quota tree: short item " + KeyToString(k));
      Qgroup& g = state->groups[k.offset];
      std::memcpy(&g.limit, d.data(), sizeof(QgroupLimitItem));
    } else if (k.type == kQgroupRelationKey) {
      // Stored both ways; (child, parent) has the child's id first and
      // lower level ids are smaller.
      if (k.objectid < k.offset) state->groups[k.objectid].parents.push_back(k.offset);
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  if (!have_status) return Status::Corrupt("quota tree has no status item");
  if (!state->simple && (vol_->super().incompat_flags.get() & kIncompatSimpleQuota)) {
    return Status::Unsupported("writing to an image whose quota status and SIMPLE_QUOTA flag disagree");
  }
  UB_ASSIGN_OR_RETURN(auto ext, vol_->FindRoot(kExtentTreeObjectid));
  state->committed_extent = ext.ref;
  state->committed_extent.live = nullptr;
  quotas_ = std::move(state);
  return Status::Ok();
}

// Every qgroup a subvolume's data counts in: its own (0/root) and the
// groups above it.
std::set<uint64_t> TxnManager::QgroupsOf(const std::set<uint64_t>& roots) const {
  std::set<uint64_t> out;
  std::vector<uint64_t> todo;
  for (uint64_t r : roots) {
    if (IsSubvolumeTree(r) && quotas_->groups.count(r)) todo.push_back(r);
  }
  while (!todo.empty()) {
    const uint64_t g = todo.back();
    todo.pop_back();
    if (!out.insert(g).second) continue;
    auto it = quotas_->groups.find(g);
    if (it != quotas_->groups.end()) todo.insert(todo.end(), it->second.parents.begin(), it->second.parents.end());
  }
  return out;
}

Status TxnManager::CheckQuota(uint64_t root, uint64_t bytes) {
  if (!quotas_) return Status::Ok();
  auto lock = AllocLock();
  const std::set<uint64_t> groups = QgroupsOf({root});
  for (uint64_t g : groups) {
    Qgroup& q = quotas_->groups[g];
    const uint64_t flags = q.limit.flags.get();
    const uint64_t rfer = q.rfer + q.reserved + bytes, excl = q.excl + q.reserved + bytes;
    if (((flags & kQgroupLimitMaxRfer) && rfer > q.limit.max_rfer.get()) ||
        ((flags & kQgroupLimitMaxExcl) && excl > q.limit.max_excl.get())) {
      return Status::Error(EDQUOT, "the quota of qgroup " + QgroupName(g) + " is exceeded");
    }
  }
  for (uint64_t g : groups) quotas_->groups[g].reserved += bytes;
  return Status::Ok();
}

Status TxnManager::NewQgroup(uint64_t root, uint64_t inherit_from, uint64_t dir_root) {
  if (!quotas_) return Status::Ok();
  if (quotas_->simple) return NewSimpleQgroup(root, dir_root);
  auto lock = AllocLock();
  Qgroup& g = quotas_->groups[root];
  g = Qgroup{};
  g.dirty = true;
  if (inherit_from) {
    auto src = quotas_->groups.find(inherit_from);
    if (src == quotas_->groups.end()) return Status::Ok();  // the source has no qgroup: start from zero
    // The groups above the source keep their numbers, which are wrong
    // from now on (the snapshot joins none of them): the kernel marks the
    // quotas inconsistent, and a rescan (RescanQuotas) mends them.
    if (!src->second.parents.empty()) quotas_->mark_inconsistent = true;
    g.limit = src->second.limit;
    UB_ASSIGN_OR_RETURN(auto from, vol_->FindRoot(inherit_from));
    UB_ASSIGN_OR_RETURN(auto to, vol_->FindRoot(root));
    quotas_->inherits.push_back({inherit_from, root, from.ref.bytenr, to.ref.bytenr});
  }
  return Status::Ok();
}

// All of a dropped tree's shared block b lies below: each block and data
// extent loses the dropped tree from its subvolumes, with no reference of
// its own changing.
Status TxnManager::TraceDroppedSubtree(uint64_t bytenr, int level, uint64_t generation) {
  if (!quotas_ || quotas_->simple) return Status::Ok();  // simple quotas follow extent items alone
  std::vector<tree::BlockCheck> todo = {tree::BlockCheck{bytenr, level, generation, {}}};
  while (!todo.empty()) {
    const tree::BlockCheck at = todo.back();
    todo.pop_back();
    if (!quotas_->extra.emplace(at.bytenr, vol_->nodesize()).second) continue;
    UB_ASSIGN_OR_RETURN(tree::BlockRef b, dirty_->Read(at));
    if (b->is_leaf()) {
      ForEachDataExtent(*b, [&](const Key&, const FileExtentItem& fe) {
        quotas_->extra.emplace(fe.disk_bytenr.get(), fe.disk_num_bytes.get());
      });
    } else {
      for (int i = 0; i < b->nritems(); ++i) {
        todo.push_back(tree::BlockCheck{b->child_bytenr(i), b->level() - 1, b->child_generation(i), {}});
      }
    }
  }
  return Status::Ok();
}

// Before the commit applies anything: which extents to account, and who
// reached them in the committed state.
Status TxnManager::PrepareQuotaAccounting() {
  QuotaState& q = *quotas_;
  if (q.simple) return Status::Ok();  // counted as extent items come and go (simple_quota.cc)
  q.touched.clear();
  for (const auto& [bytenr, p] : pending_) q.touched.push_back({bytenr, p.tree ? vol_->nodesize() : p.num_bytes, {}});
  for (auto [bytenr, len] : q.extra) q.touched.push_back({bytenr, len, {}});
  q.extra.clear();
  std::sort(q.touched.begin(), q.touched.end(), [](const auto& a, const auto& b) { return a.bytenr < b.bytenr; });
  q.touched.erase(std::unique(q.touched.begin(), q.touched.end(),
                              [](const auto& a, const auto& b) { return a.bytenr == b.bytenr; }),
                  q.touched.end());
  // The trees as last committed: their ROOT_ITEMs are rewritten only later
  // in the commit.
  RootWalk old_walk(vol_->reader(), q.committed_extent, [&](uint64_t id) -> std::optional<tree::RootPtr> {
    auto r = vol_->MutableRoot(id, true);
    if (!r.ok() || (*r)->item.generation.get() >= transid() || (*r)->item.bytenr.get() == 0) return std::nullopt;
    return tree::RootPtr{(*r)->item.bytenr.get(), (*r)->item.level, (*r)->item.generation.get(), id, nullptr};
  });
  for (auto& t : q.touched) {
    UB_ASSIGN_OR_RETURN(t.old_roots, old_walk.Roots(t.bytenr));
    // Counted from the state right after the snapshots (see the top).
    for (const auto& in : q.inherits) {
      if (t.bytenr == in.dst_root) {
        t.old_roots = {in.dst};
      } else if (t.bytenr != in.src_root && t.old_roots.count(in.src)) {
        t.old_roots.insert(in.dst);
      }
    }
  }
  return Status::Ok();
}

// After the delayed refs are applied: who reaches each extent now; the
// numbers; the snapshots' inherited numbers; the items.
Status TxnManager::AccountQuotas() {
  QuotaState& q = *quotas_;
  if (q.simple) return WriteQgroupItems();
  for (const auto& in : q.inherits) {
    Qgroup& s = q.groups[in.src];
    Qgroup& d = q.groups[in.dst];
    d.rfer = s.rfer;
    d.excl = vol_->nodesize();
    s.excl = vol_->nodesize();
    s.dirty = d.dirty = true;
  }
  q.inherits.clear();
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * ext, vol_->MutableRoot(kExtentTreeObjectid));
  tree::RootPtr now = ext->ref;
  now.live = nullptr;
  // Each subvolume's qgroups (its own and those above), found once.
  std::map<uint64_t, std::set<uint64_t>> up;
  auto groups_of = [&](uint64_t r) -> const std::set<uint64_t>& {
    auto it = up.find(r);
    if (it == up.end()) it = up.emplace(r, QgroupsOf({r})).first;
    return it->second;
  };
  auto union_of = [&](const std::set<uint64_t>& roots) {
    std::set<uint64_t> out;
    for (uint64_t r : roots) out.insert(groups_of(r).begin(), groups_of(r).end());
    return out;
  };
  RootWalk new_walk(dirty_.get(), now, [&](uint64_t id) -> std::optional<tree::RootPtr> {
    auto r = vol_->MutableRoot(id, true);
    if (!r.ok()) return std::nullopt;
    tree::RootPtr p = (*r)->ref;  // a dead tree's too: what is not yet dropped is still its own
    p.live = nullptr;
    return p;
  });
  for (const auto& t : q.touched) {
    UB_ASSIGN_OR_RETURN(auto new_roots, new_walk.Roots(t.bytenr));
    const std::set<uint64_t> before = union_of(t.old_roots), after = union_of(new_roots);
    if (before == after && before.empty()) continue;
    std::set<uint64_t> all = before;
    all.insert(after.begin(), after.end());
    auto only_under = [&](const std::set<uint64_t>& roots, uint64_t g) {
      bool any = false;
      for (uint64_t r : roots) {
        if (!IsSubvolumeTree(r)) continue;
        if (!groups_of(r).count(g)) return false;
        any = true;
      }
      return any;
    };
    for (uint64_t g : all) {
      Qgroup& qg = q.groups[g];
      const bool in_old = before.count(g), in_new = after.count(g);
      const bool ex_old = in_old && only_under(t.old_roots, g), ex_new = in_new && only_under(new_roots, g);
      if (in_new != in_old) qg.rfer += in_new ? t.len : -t.len;
      if (ex_new != ex_old) qg.excl += ex_new ? t.len : -t.len;
      if (in_new != in_old || ex_new != ex_old) qg.dirty = true;
    }
  }
  q.touched.clear();
  return WriteQgroupItems();
}

Status TxnManager::WriteQgroupItems() {
  QuotaState& q = *quotas_;
  if (q.simple) UB_RETURN_IF_ERROR(RemoveDroppedQgroups());
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kQuotaTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * root, vol_->MutableRoot(kQuotaTreeObjectid));
  bool any = false;
  for (auto& [id, g] : q.groups) {
    if (!g.dirty) continue;
    g.dirty = false;
    any = true;
    QgroupInfoItem info{};
    info.generation = transid();
    info.rfer = g.rfer;
    info.rfer_cmpr = q.simple ? g.rfer_cmpr : g.rfer;
    info.excl = g.excl;
    info.excl_cmpr = q.simple ? g.excl_cmpr : g.excl;
    const Key ik{0, kQgroupInfoKey, id}, lk{0, kQgroupLimitKey, id};
    UB_ASSIGN_OR_RETURN(auto have, tree::LookupItem(dirty_.get(), root->ref, ik));
    if (have) {
      UB_RETURN_IF_ERROR(w->Update(ik, Bytes(info)));
    } else {
      UB_RETURN_IF_ERROR(w->Insert(ik, Bytes(info)));
    }
    UB_ASSIGN_OR_RETURN(auto have_limit, tree::LookupItem(dirty_.get(), root->ref, lk));
    if (!have_limit) UB_RETURN_IF_ERROR(w->Insert(lk, Bytes(g.limit)));
  }
  if (!any && !q.mark_inconsistent && dirty_->count() == 0) return Status::Ok();
  return WriteQgroupStatus();
}

// The status item's generation says the numbers are of this transaction:
// the kernel rewrites it at every commit with quotas on, and a mount that
// finds it behind the superblock's generation marks the numbers
// inconsistent. So every commit that writes anything writes it.
Status TxnManager::WriteQgroupStatus() {
  QuotaState& q = *quotas_;
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kQuotaTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * root, vol_->MutableRoot(kQuotaTreeObjectid));
  const Key sk{0, kQgroupStatusKey, 0};
  UB_ASSIGN_OR_RETURN(auto st, tree::LookupItem(dirty_.get(), root->ref, sk));
  if (!st || st->size() < sizeof(QgroupStatusItem)) return Status::Corrupt("quota tree has no status item");
  auto* status = reinterpret_cast<QgroupStatusItem*>(st->data());
  status->generation = transid();
  if (q.mark_inconsistent) status->flags = status->flags.get() | kQgroupStatusInconsistent;
  q.mark_inconsistent = false;
  q.status_written = true;
  return w->Update(sk, *st);
}

// Every extent of the committed state walked up to the subvolumes that
// reach it; each qgroup gets the numbers that gives, and the status loses
// its INCONSISTENT and RESCAN flags (the kernel's rescan worker).
Status TxnManager::RescanQuotas() {
  if (!quotas_) return Status::Error(ENOENT, "quotas are not enabled on this filesystem");
  QuotaState& q = *quotas_;
  if (q.simple) return Status::Invalid("simple quotas are counted as extents come and go: there is nothing to rescan");
  if (!q.inherits.empty()) return Status::Invalid("a quota rescan after a snapshot needs it committed first");
  RootWalk walk(vol_->reader(), q.committed_extent, [&](uint64_t id) -> std::optional<tree::RootPtr> {
    auto r = vol_->FindRoot(id);
    if (!r.ok() || r->item.bytenr.get() == 0) return std::nullopt;
    return r->ref;
  });
  std::map<uint64_t, std::vector<uint64_t>> parents;
  std::set<uint64_t> ids;
  for (const auto& [id, g] : q.groups) {
    ids.insert(id);
    if (!g.parents.empty()) parents[id] = g.parents;
  }
  UB_ASSIGN_OR_RETURN(auto counts, RecountQgroups(vol_->reader(), q.committed_extent, vol_->nodesize(), &walk, parents, ids));
  for (auto& [id, g] : q.groups) {
    const QgroupCount& c = counts[id];
    g.rfer = g.rfer_cmpr = c.rfer;
    g.excl = g.excl_cmpr = c.excl;
    g.dirty = true;
  }
  q.mark_inconsistent = false;
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, Writer(kQuotaTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * root, vol_->MutableRoot(kQuotaTreeObjectid));
  const Key sk{0, kQgroupStatusKey, 0};
  UB_ASSIGN_OR_RETURN(auto st, tree::LookupItem(dirty_.get(), root->ref, sk));
  if (!st || st->size() < sizeof(QgroupStatusItem)) return Status::Corrupt("quota tree has no status item");
  auto* status = reinterpret_cast<QgroupStatusItem*>(st->data());
  status->flags = status->flags.get() & ~(kQgroupStatusInconsistent | kQgroupStatusRescan);
  status->rescan = UINT64_MAX;  // done
  return w->Update(sk, *st);
}

bool TxnManager::QgroupsDirty() const {
  for (const auto& [id, g] : quotas_->groups) {
    if (g.dirty) return true;
  }
  return false;
}

void TxnManager::QuotasCommitted() {
  if (!quotas_) return;
  quotas_->status_written = false;
  quotas_->new_blocks.clear();
  for (auto& [id, g] : quotas_->groups) g.reserved = 0;
  if (auto ext = vol_->FindRoot(kExtentTreeObjectid); ext.ok()) {
    quotas_->committed_extent = ext->ref;
    quotas_->committed_extent.live = nullptr;
  }
}

}  // namespace ubtrfs::txn
