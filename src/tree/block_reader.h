// Reads tree blocks through the chunk map, verifies them, and keeps recently
// used ones in an LRU node cache. A block that fails verification on one
// copy (DUP, RAID1*, RAID10) is read from the next, or rebuilt from parity.
#ifndef UBTRFS_TREE_BLOCK_READER_H_
#define UBTRFS_TREE_BLOCK_READER_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "alloc/chunk_io.h"
#include "tree/tree_block.h"

namespace ubtrfs::tree {

class NodeCache {
 public:
  explicit NodeCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}
  BlockRef Get(uint64_t bytenr);
  void Put(BlockRef block);
  void Erase(uint64_t bytenr);

 private:
  std::mutex mu_;  // guards everything below
  size_t capacity_;
  size_t bytes_ = 0;
  std::list<BlockRef> lru_;  // front = most recent
  std::unordered_map<uint64_t, std::list<BlockRef>::iterator> index_;
};

struct BlockReaderStats {
  std::atomic<uint64_t> cache_hits{0};
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> mirror_repairs{0};  // a bad copy was skipped for a good one
  std::atomic<uint64_t> bad_csums_taken{0};  // AcceptBadChecksums: blocks used although their checksum failed
};

// Where cursors get tree blocks from: committed blocks on disk (BlockReader)
// or, inside a running transaction, its dirty blocks first (DirtyBlocks).
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  virtual Result<BlockRef> Read(const BlockCheck& check) = 0;
  // Whether readers must take node locks (shared) on the blocks they read:
  // only blocks of a running transaction while several threads use it.
  virtual bool Locking() const { return false; }
  virtual bool NeedsLock(const TreeBlock&) const { return false; }
};

class BlockReader final : public BlockSource {
 public:
  BlockReader(alloc::ChunkIo* io, const TreeParams& params, size_t cache_bytes)
      : io_(io), chunks_(&io->map()), params_(params), cache_(cache_bytes) {}

  Result<BlockRef> Read(const BlockCheck& check) override;
  // One mirror of the block (alloc::ChunkIo's numbering), verified, not
  // cached: scrub and check look at every copy.
  Result<BlockRef> ReadMirror(const BlockCheck& check, int mirror);
  int NumMirrors(uint64_t bytenr) const { return io_->NumMirrors(bytenr); }
  // After a commit wrote blocks at these addresses, older cached contents
  // are stale; written blocks can be cached directly.
  void Invalidate(uint64_t bytenr) { cache_.Erase(bytenr); }
  void Cache(BlockRef block) { cache_.Put(std::move(block)); }
  // Blocks a commit has sealed but writes only in its second half
  // (txn/commit_tail.h), while the next transaction may already read them:
  // a read that misses the cache finds them here, never the stale bytes
  // the device still has at their address. Released once they are written.
  void HoldUnwritten(std::vector<BlockRef> blocks);
  void ReleaseUnwritten();
  const TreeParams& params() const { return params_; }
  const BlockReaderStats& stats() const { return stats_; }
  // Rescue reads (the kernel's rescue=ignoremetacsums): when every copy of
  // a block fails, the first whose only fault is its checksum is used.
  // Set before the first read.
  void AcceptBadChecksums() { accept_bad_csums_ = true; }

 private:
  Status CheckPlace(const BlockCheck& check) const;
  // What the referrer expects of a block verified before (cached, held).
  static Status CheckKnown(const TreeBlock& b, const BlockCheck& check);
  BlockRef FindUnwritten(uint64_t bytenr);

  alloc::ChunkIo* io_;
  const alloc::ChunkMap* chunks_;
  TreeParams params_;
  bool accept_bad_csums_ = false;
  NodeCache cache_;
  BlockReaderStats stats_;
  std::atomic<bool> any_unwritten_{false};
  std::mutex unwritten_mu_;  // guards unwritten_
  std::unordered_map<uint64_t, BlockRef> unwritten_;
};

}  // namespace ubtrfs::tree

#endif  // UBTRFS_TREE_BLOCK_READER_H_
