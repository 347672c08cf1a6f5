#include "txn/qgroup_recount.h"

#include <algorithm>
#include <string>

#include "format/ondisk.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

std::string QgroupName(uint64_t id) { return std::to_string(id >> 48) + "/" + std::to_string(id & ((1ull << 48) - 1)); }

Result<std::map<uint64_t, QgroupCount>> RecountQgroups(tree::BlockSource* src, tree::RootPtr extent_root,
                                                       uint32_t nodesize, RootWalk* walk,
                                                       const std::map<uint64_t, std::vector<uint64_t>>& parents,
                                                       const std::set<uint64_t>& qgroups) {
  std::map<uint64_t, QgroupCount> out;
  for (uint64_t g : qgroups) out[g];
  // Each subvolume's qgroup and every group above it (a relation loop,
  // which the kernel refuses to make, is walked once).
  std::map<uint64_t, std::set<uint64_t>> above;
  auto groups_of = [&](uint64_t root) -> const std::set<uint64_t>& {
    auto [it, fresh] = above.try_emplace(root);
    if (!fresh) return it->second;
    std::vector<uint64_t> todo{root};
    while (!todo.empty()) {
      const uint64_t g = todo.back();
      todo.pop_back();
      if (!qgroups.count(g) || !it->second.insert(g).second) continue;
      if (auto p = parents.find(g); p != parents.end()) todo.insert(todo.end(), p->second.begin(), p->second.end());
    }
    return it->second;
  };
  tree::Cursor c(src, extent_root);
  UB_RETURN_IF_ERROR(c.SeekFirst());
  for (bool first = true;; first = false) {
    if (!first) UB_RETURN_IF_ERROR(c.Next());
    if (!c.Valid()) break;
    const Key k = c.key();
    uint64_t bytes = 0;
    if (k.type == kMetadataItemKey) {
      bytes = nodesize;
    } else if (k.type == kExtentItemKey) {
      bytes = k.offset;
    } else {
      continue;
    }
    UB_ASSIGN_OR_RETURN(std::set<uint64_t> roots, walk->Roots(k.objectid));
    std::erase_if(roots, [](uint64_t r) { return !IsSubvolumeTree(r); });
    if (roots.empty()) continue;
    // A group reaches the extent through any of its subvolumes; it has it
    // alone when every subvolume that reaches it is one of its own.
    std::map<uint64_t, size_t> reached;  // group -> how many of `roots` are its own
    for (uint64_t r : roots) {
      for (uint64_t g : groups_of(r)) ++reached[g];
    }
    for (auto [g, n] : reached) {
      QgroupCount& q = out[g];
      q.rfer += bytes;
      if (n == roots.size()) q.excl += bytes;
    }
  }
  return out;
}

Result<StoredQgroups> ReadQgroups(tree::BlockSource* src, tree::RootPtr quota_root) {
  StoredQgroups s;
  tree::Cursor c(src, quota_root);
  UB_RETURN_IF_ERROR(c.SeekFirst());
  for (bool first = true;; first = false) {
    if (!first) UB_RETURN_IF_ERROR(c.Next());
    if (!c.Valid()) break;
    const Key k = c.key();
    auto d = c.data();
    if (k.type == kQgroupStatusKey) {
      if (d.size() < sizeof(QgroupStatusItem)) return Status::Corrupt("quota tree: short status item");
      s.status_flags = reinterpret_cast<const QgroupStatusItem*>(d.data())->flags.get();
      s.status_generation = reinterpret_cast<const QgroupStatusItem*>(d.data())->generation.get();
    } else if (k.type == kQgroupInfoKey) {
      if (d.size() < sizeof(QgroupInfoItem)) return Status::Corrupt("quota tree: short item " + KeyToString(k));
      const auto* in = reinterpret_cast<const QgroupInfoItem*>(d.data());
      s.counts[k.offset] = QgroupCount{in->rfer.get(), in->excl.get()};
    } else if (k.type == kQgroupRelationKey && k.objectid < k.offset) {
      s.parents[k.objectid].push_back(k.offset);
    }
  }
  return s;
}

}  // namespace ubtrfs::txn
