#include "fuse/inode_map.h"

namespace ubtrfs::fuse {

uint64_t InodeMap::ToNode(InodeId id) {
  if (id == root_) return kRootNodeId;
  if (Direct(id)) return id.ino;
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = mapped_rev_.try_emplace({id.root, id.ino}, 0);
  if (inserted) {
    it->second = next_mapped_++;
    mapped_.emplace(it->second, id);
  }
  return it->second;
}

std::optional<InodeId> InodeMap::ToInode(uint64_t node) const {
  if (node == kRootNodeId) return root_;
  if (node < kMappedBase) return InodeId{root_.root, node};
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mapped_.find(node);
  if (it == mapped_.end()) return std::nullopt;
  return it->second;
}

void InodeMap::AddLookup(uint64_t node, uint64_t n) {
  if (node == kRootNodeId || n == 0) return;  // the root is never forgotten
  std::lock_guard<std::mutex> lock(mu_);
  counts_[node] += n;
}

void InodeMap::Forget(uint64_t node, uint64_t n) {
  if (node == kRootNodeId) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(node);
  if (it == counts_.end()) return;
  if (it->second <= n) {
    counts_.erase(it);
  } else {
    it->second -= n;
  }
}

uint64_t InodeMap::LookupCount(uint64_t node) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(node);
  return it == counts_.end() ? 0 : it->second;
}

size_t InodeMap::LiveNodes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_.size();
}

}  // namespace ubtrfs::fuse
