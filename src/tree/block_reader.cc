#include "tree/block_reader.h"

#include "format/key.h"
#include "stats/stats.h"

namespace ubtrfs::tree {

BlockRef NodeCache::Get(uint64_t bytenr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(bytenr);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return *it->second;
}

void NodeCache::Put(BlockRef block) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(block->bytenr()); it != index_.end()) {
    bytes_ -= (*it->second)->bytes().size();
    lru_.erase(it->second);
    index_.erase(it);
  }
  bytes_ += block->bytes().size();
  lru_.push_front(block);
  index_[block->bytenr()] = lru_.begin();
  while (bytes_ > capacity_ && lru_.size() > 1) {
    bytes_ -= lru_.back()->bytes().size();
    index_.erase(lru_.back()->bytenr());
    lru_.pop_back();
  }
}

void NodeCache::Erase(uint64_t bytenr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(bytenr);
  if (it == index_.end()) return;
  bytes_ -= (*it->second)->bytes().size();
  lru_.erase(it->second);
  index_.erase(it);
}

// A block verified once (cached, or held unwritten); the referrer's
// expectations may still differ (a damaged pointer), so check those again.
// Every cache hit passes here: the message is built only for a mismatch.
Status BlockReader::CheckKnown(const TreeBlock& b, const BlockCheck& check) {
  auto corrupt = [&](const std::string& what) {
    return Status::Corrupt("tree block " + std::to_string(check.bytenr) + ": " + what);
  };
  if (check.level >= 0 && b.level() != check.level) {
    return corrupt("level " + std::to_string(b.level()) + ", expected " + std::to_string(check.level));
  }
  if (check.generation != 0 && b.generation() != check.generation) {
    return corrupt("generation " + std::to_string(b.generation()) + ", expected " + std::to_string(check.generation));
  }
  if (check.first_key && (b.nritems() == 0 || b.key(0) != *check.first_key)) {
    return corrupt("first key does not match parent key " + format::KeyToString(*check.first_key));
  }
  return Status::Ok();
}

void BlockReader::HoldUnwritten(std::vector<BlockRef> blocks) {
  std::lock_guard lock(unwritten_mu_);
  for (BlockRef& b : blocks) {
    const uint64_t at = b->bytenr();
    unwritten_[at] = std::move(b);
  }
  any_unwritten_.store(!unwritten_.empty(), std::memory_order_release);
}

void BlockReader::ReleaseUnwritten() {
  std::unordered_map<uint64_t, BlockRef> gone;  // the blocks are freed outside the lock
  {
    std::lock_guard lock(unwritten_mu_);
    gone.swap(unwritten_);
    any_unwritten_.store(false, std::memory_order_release);
  }
}

BlockRef BlockReader::FindUnwritten(uint64_t bytenr) {
  if (!any_unwritten_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard lock(unwritten_mu_);
  auto it = unwritten_.find(bytenr);
  return it == unwritten_.end() ? nullptr : it->second;
}

Result<BlockRef> BlockReader::Read(const BlockCheck& check) {
  if (BlockRef cached = cache_.Get(check.bytenr)) {
    UB_RETURN_IF_ERROR(CheckKnown(*cached, check));
    stats_.cache_hits.fetch_add(1, std::memory_order_relaxed);
    return cached;
  }
  if (BlockRef held = FindUnwritten(check.bytenr)) {
    static stats::Counter& held_reads = stats::GetCounter("tree.unwritten_block_reads");
    held_reads.Add();
    UB_RETURN_IF_ERROR(CheckKnown(*held, check));
    cache_.Put(held);
    return held;
  }
  UB_RETURN_IF_ERROR(CheckPlace(check));
  const int mirrors = io_->NumMirrors(check.bytenr);
  Status first_error;
  bool bad_copy = false;  // a copy that was read and failed, not one on a missing device
  for (int i = 0; i < mirrors; ++i) {
    auto block = ReadMirror(check, i);
    if (block.ok()) {
      if (bad_copy) stats_.mirror_repairs.fetch_add(1, std::memory_order_relaxed);
      cache_.Put(*block);
      return *block;
    }
    if (first_error.ok()) first_error = block.status();
    if (!io_->MirrorOnMissingDevice(check.bytenr, params_.nodesize, i)) bad_copy = true;
  }
  if (accept_bad_csums_) {
    // What is wrong besides the checksum is what the caller hears then.
    TreeParams lenient = params_;
    lenient.verify_csum = false;
    Status structure;
    for (int i = 0; i < mirrors; ++i) {
      BlockBuffer buf = BlockBuffer::Take(params_.nodesize);
      if (!io_->Read(check.bytenr, buf.span(), i).ok()) continue;
      auto block = TreeBlock::Parse(std::move(buf), lenient, check);
      if (!block.ok()) {
        if (structure.ok()) structure = block.status();
        continue;
      }
      stats_.bad_csums_taken.fetch_add(1, std::memory_order_relaxed);
      cache_.Put(*block);
      return *block;
    }
    if (!structure.ok()) first_error = structure;
  }
  if (mirrors > 1) {
    return first_error.WithContext("all " + std::to_string(mirrors) + " copies bad, first");
  }
  return first_error;
}

Status BlockReader::CheckPlace(const BlockCheck& check) const {
  const std::string where = "tree block " + std::to_string(check.bytenr);
  if (check.bytenr % 4096 != 0) return Status::Corrupt(where + ": not aligned");
  const alloc::ChunkInfo* chunk = chunks_->Find(check.bytenr);
  if (chunk == nullptr) {
    return Status::Corrupt(where + ": logical address " + std::to_string(check.bytenr) + " is not in any chunk");
  }
  if (check.bytenr - chunk->logical > chunk->length - params_.nodesize || chunk->length < params_.nodesize) {
    return Status::Corrupt(where + ": crosses the end of chunk " + std::to_string(chunk->logical));
  }
  if (chunk->type & format::kBlockGroupData && !(chunk->type & format::kBlockGroupMetadata) &&
      !(chunk->type & format::kBlockGroupSystem)) {
    return Status::Corrupt(where + ": lies in a DATA chunk");
  }
  return Status::Ok();
}

Result<BlockRef> BlockReader::ReadMirror(const BlockCheck& check, int mirror) {
  UB_RETURN_IF_ERROR(CheckPlace(check));
  BlockBuffer buf = BlockBuffer::Take(params_.nodesize);
  stats_.reads.fetch_add(1, std::memory_order_relaxed);
  UB_RETURN_IF_ERROR(io_->Read(check.bytenr, buf.span(), mirror).WithContext("tree block " + std::to_string(check.bytenr)));
  return TreeBlock::Parse(std::move(buf), params_, check);
}

}  // namespace ubtrfs::tree
