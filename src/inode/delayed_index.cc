#include "inode/delayed_index.h"

#include <bit>

namespace ubtrfs::inode {

using format::Key;

void DelayedDirIndex::Add(uint64_t root, uint64_t dir, uint64_t index, std::vector<uint8_t> item) {
  auto& q = pending_[{root, dir}];
  if (q.emplace(index, std::move(item)).second) ++pending_count_;
  ++stats_.queued;
}

bool DelayedDirIndex::Cancel(uint64_t root, uint64_t dir, uint64_t index) {
  auto it = pending_.find({root, dir});
  if (it == pending_.end() || !it->second.erase(index)) return false;
  if (it->second.empty()) pending_.erase(it);
  --pending_count_;
  ++stats_.cancelled;
  return true;
}

const std::map<uint64_t, std::vector<uint8_t>>* DelayedDirIndex::Pending(uint64_t root, uint64_t dir) const {
  auto it = pending_.find({root, dir});
  return it == pending_.end() ? nullptr : &it->second;
}

Status DelayedDirIndex::FlushDir(uint64_t root, uint64_t dir, const WriterFn& writer) {
  auto it = pending_.find({root, dir});
  if (it == pending_.end()) return Status::Ok();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, writer(root));
  auto& q = it->second;
  std::vector<Key> keys;
  std::vector<std::vector<uint8_t>> data;
  uint32_t bytes = 0;
  auto emit = [&]() -> Status {
    if (keys.empty()) return Status::Ok();
    UB_RETURN_IF_ERROR(w->InsertBatch(keys, data));
    ++stats_.batches;
    stats_.items += keys.size();
    ++stats_.batch_size_log2[std::min<size_t>(std::bit_width(keys.size()) - 1, 15)];
    keys.clear();
    data.clear();
    bytes = 0;
    return Status::Ok();
  };
  for (auto& [index, item] : q) {
    const uint32_t need = static_cast<uint32_t>(item.size() + sizeof(format::Item));
    // A batch is a run of immediate successors that fits in one leaf.
    if (!keys.empty() && (keys.back().offset + 1 != index || bytes + need > leaf_space_)) UB_RETURN_IF_ERROR(emit());
    keys.push_back(Key{dir, format::kDirIndexKey, index});
    data.push_back(std::move(item));
    bytes += need;
  }
  UB_RETURN_IF_ERROR(emit());
  pending_count_ -= q.size();
  pending_.erase(it);
  return Status::Ok();
}

Status DelayedDirIndex::Flush(const WriterFn& writer) {
  while (!pending_.empty()) {
    auto [root, dir] = pending_.begin()->first;
    UB_RETURN_IF_ERROR(FlushDir(root, dir, writer));
  }
  return Status::Ok();
}

}  // namespace ubtrfs::inode
