// The commit: its first half (references, block groups, root items, the
// tree blocks sealed, the superblocks filled in) and its second half
// (txn/commit_tail.h: the blocks written, flushes and superblocks).
#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "format/checksum.h"
#include "format/superblock.h"
#include "io/cores.h"
#include "stats/stats.h"
#include "tree/block_buffer.h"
#include "tree/tree_block.h"
#include "txn/commit_tail.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::Cursor;

namespace {
constexpr int kMaxCommitLoops = 64;
}  // namespace

// ---- Commit ----------------------------------------------------------------------------------

Status TxnManager::SealDirtyBlocks(SealedBlocks* out) {
  const tree::TreeParams& params = vol_->reader()->params();
  const auto blocks = dirty_->All();  // by address
  // Each block's pieces on the devices, every copy; blocks in RAID5/6
  // chunks go row by row through the chunk layer (their parity) instead.
  std::vector<std::vector<alloc::Piece>> phys(blocks.size());
  std::vector<char> in_parity_chunk(blocks.size(), 0);
  // Seal and verify blocks [from, to): checksum, and never write a block our
  // own reader would refuse.
  auto seal_range = [&](size_t from, size_t to) -> Status {
    for (size_t i = from; i < to; ++i) {
      const auto& [bytenr, block] = blocks[i];
      Header& h = block->mutable_header();
      h.flags = h.flags.get() | kHeaderFlagWritten;
      auto bytes = block->bytes();
      CsumBytes c = ComputeCsum(params.csum_type, bytes.subspan(kCsumSize));
      std::memcpy(block->mutable_bytes(), c.data(), kCsumSize);
      UB_RETURN_IF_ERROR(tree::VerifyTreeBlock(bytes, params, tree::BlockCheck{bytenr, -1, transid(), {}})
                             .WithContext("refusing to write"));
      if (vol_->chunk_io().IsParityChunk(bytenr)) {
        in_parity_chunk[i] = 1;
        continue;
      }
      UB_ASSIGN_OR_RETURN(auto copies, vol_->chunks().Map(bytenr, bytes.size()));
      for (auto& copy : copies) {
        for (const alloc::Piece& p : copy) {
          // A degraded array writes the copies it has (as the kernel).
          if (vol_->devices().Has(p.devid)) phys[i].push_back(p);
        }
      }
    }
    return Status::Ok();
  };
  // A large commit seals its two halves on two threads (checksums and checks
  // are the CPU work of writing).
  constexpr size_t kParallelFrom = 1024;
  static stats::Histogram& seal_time = stats::GetHistogram("commit.seal_time", "ns");
  const uint64_t seal_t0 = stats::NowNs();
  Status first, second;
  if (blocks.size() >= kParallelFrom && io::UsableCores() > 1) {
    const size_t mid = blocks.size() / 2;
    std::thread helper;
    try {
      helper = std::thread([&] { second = seal_range(mid, blocks.size()); });
    } catch (const std::system_error&) {
      // no thread to be had (the process limit): this one seals both
    }
    first = seal_range(0, mid);
    if (helper.joinable()) {
      helper.join();
    } else {
      second = seal_range(mid, blocks.size());
    }
  } else {
    first = seal_range(0, blocks.size());
  }
  UB_RETURN_IF_ERROR(first);
  UB_RETURN_IF_ERROR(second);
  seal_time.Record(stats::NowNs() - seal_t0);
  out->blocks.assign(blocks.begin(), blocks.end());
  out->phys = std::move(phys);
  out->in_parity_chunk = std::move(in_parity_chunk);
  return Status::Ok();
}

Status TxnManager::WriteSealedBlocks(const SealedBlocks& sealed) {
  static stats::Histogram& write_time = stats::GetHistogram("commit.write_time", "ns");
  const uint64_t t0 = stats::NowNs();
  const auto& blocks = sealed.blocks;
  const auto& phys = sealed.phys;
  // Writes from one thread (parallel writes to one file only queue on its
  // lock), each run of neighbouring blocks as one gathered write of at most
  // kRunBytes. Every few MiB the device is told to start writing, so the
  // flush after this waits only for the tail.
  constexpr uint64_t kRunBytes = 1u << 20;
  constexpr uint64_t kWritebackEvery = 8u << 20;
  uint64_t since_hint = 0;
  // Every piece in device order, so neighbouring blocks on one device
  // become one gathered write.
  struct Out {
    uint64_t devid, physical;
    std::span<const uint8_t> bytes;
  };
  std::vector<Out> outs;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto bytes = blocks[i].second->bytes();
    for (const alloc::Piece& p : phys[i]) outs.push_back({p.devid, p.physical, bytes.subspan(p.buf_offset, p.length)});
  }
  std::sort(outs.begin(), outs.end(),
            [](const Out& a, const Out& b) { return std::tie(a.devid, a.physical) < std::tie(b.devid, b.physical); });
  std::vector<std::span<const uint8_t>> run;
  uint64_t run_dev = 0, run_start = 0, run_bytes = 0;
  auto flush_run = [&]() -> Status {
    if (run.empty()) return Status::Ok();
    UB_RETURN_IF_ERROR(vol_->devices().WriteGather(run_dev, run_start, run));
    since_hint += run_bytes;
    run.clear();
    run_bytes = 0;
    if (since_hint >= kWritebackEvery) {
      vol_->devices().StartWriteback();
      since_hint = 0;
    }
    return Status::Ok();
  };
  for (const Out& o : outs) {
    if (!run.empty() && (o.devid != run_dev || o.physical != run_start + run_bytes ||
                         run_bytes + o.bytes.size() > kRunBytes)) {
      UB_RETURN_IF_ERROR(flush_run());
    }
    if (run.empty()) {
      run_dev = o.devid;
      run_start = o.physical;
    }
    run.push_back(o.bytes);
    run_bytes += o.bytes.size();
  }
  UB_RETURN_IF_ERROR(flush_run());
  if (sealed.any_parity()) {
    std::vector<alloc::ChunkIo::Range> parity_blocks;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (sealed.in_parity_chunk[i]) parity_blocks.push_back({blocks[i].first, blocks[i].second->bytes()});
    }
    UB_RETURN_IF_ERROR(vol_->chunk_io().WriteBatch(parity_blocks));
  }
  write_time.Record(stats::NowNs() - t0);
  return Status::Ok();
}

Status TxnManager::Commit(CommitTail* tail) {
  CommitTail here;
  CommitTail& t = tail != nullptr ? *tail : here;
  // The commit before has its superblocks on disk before this one starts:
  // what it freed is free again, and superblocks go out in order.
  t.super_lock_ = vol_->SuperLock();
  UB_RETURN_IF_ERROR(CommitFirstHalf(t));
  return tail != nullptr ? Status::Ok() : here.Finish();
}

Status CommitTail::Finish() {
  if (txn_ == nullptr) {
    if (super_lock_.owns_lock()) super_lock_.unlock();
    return Status::Ok();
  }
  TxnManager* txn = std::exchange(txn_, nullptr);
  Status st = txn->CommitSecondHalf(*this);
  super_lock_.unlock();
  return st;
}

Status TxnManager::CommitFirstHalf(CommitTail& t) {
  ChunkAllocator::CommitScope commit_scope(chunk_alloc_.get());  // commit may use the metadata reserve
  // Where a commit's time goes: reference and accounting updates, writing the
  // blocks (checksum, verify, write), and the two device flushes (the
  // second half).
  static stats::Histogram& refs_time = stats::GetHistogram("commit.refs_time", "ns");
  uint64_t t0 = stats::NowNs();
  if (force_super_ && dirty_->count() == 0) {
    // A superblock of a new generation needs a root tree of that generation
    // (readers check it, as the kernel's commit always copies it). A log
    // whose replay changed nothing (say, one that only dropped an inode
    // that is gone) gets here: the root tree's first item rewritten as it
    // is copies its path.
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * rw, Writer(kRootTreeObjectid));
    Cursor c(dirty_.get(), rw->CurrentRoot());
    UB_RETURN_IF_ERROR(c.SeekFirst());
    if (c.Valid()) {
      const Key k = c.key();
      const std::vector<uint8_t> same(c.data().begin(), c.data().end());
      UB_RETURN_IF_ERROR(rw->Update(k, same));
    }
  }
  // Rides along with a commit that writes anyway: never a commit of its own.
  if (!stale_fst_keys_.empty() && dirty_->count() > 0) UB_RETURN_IF_ERROR(DropStaleFreeSpaceItems());
  if (quotas_) UB_RETURN_IF_ERROR(PrepareQuotaAccounting());
  const size_t ref_nodes = pending_.size() + new_data_.size();
  int loops = 0;
  for (;; ++loops) {
    if (loops >= kMaxCommitLoops) return Status::Error(EIO, "internal: commit did not settle");
    bool changed = false;
    UB_RETURN_IF_ERROR(RunDelayedRefs(&changed));
    // Every reference of a subvolume's extents is applied after the first
    // round (later rounds change only the global trees' own blocks).
    // Simple quotas change with every extent item, in whichever round.
    if (quotas_ && (loops == 0 || (quotas_->simple && QgroupsDirty()))) {
      UB_RETURN_IF_ERROR(AccountQuotas());
      changed = true;
    } else if (quotas_ && !quotas_->status_written && dirty_->count() > 0) {
      UB_RETURN_IF_ERROR(WriteQgroupStatus());  // (a commit that became one after its first round)
      changed = true;
    }
    UB_RETURN_IF_ERROR(chunk_alloc_->FinishPending(&changed));  // new chunks' items, before their groups'
    UB_RETURN_IF_ERROR(DeleteUnusedGroups(&changed));  // once the refs have freed what they free
    UB_RETURN_IF_ERROR(UpdateBlockGroups(&changed));
    UB_RETURN_IF_ERROR(UpdateRootItems(&changed));
    if (!changed && pending_.empty() && new_data_.empty() && dirty_groups_.empty() &&
        !chunk_alloc_->HasPending()) {
      break;
    }
  }
  stats_.commit_loops = loops;
  // The pool keeps what a transaction like this one needs again; a very
  // large one (an import in one transaction) gives its nodes back.
  constexpr size_t kKeepRefNodes = 1 << 17;  // about 20 MB
  if (ref_nodes > kKeepRefNodes) ref_nodes_.release();
  if (dirty_->count() == 0 && !force_super_) {
    // Nothing changed on the device. What the refs pass freed can only be
    // data this transaction took and never referenced (the pieces of a write
    // that got ENOSPC): never part of a committed tree, so reusable now --
    // left pinned, a full device would stay full until some real commit.
    space_->Commit();
    chunk_alloc_->TransactionSealed();
    QuotasCommitted();
    return Status::Ok();
  }
  refs_time.Record(stats::NowNs() - t0);

  UB_RETURN_IF_ERROR(SealDirtyBlocks(&t.blocks_));
  if (t.blocks_.any_parity()) {
    // A RAID5/6 row is read back for its parity: not while the next
    // transaction's data may be going into that row (mixed groups).
    UB_RETURN_IF_ERROR(WriteSealedBlocks(t.blocks_));
    t.blocks_.written = true;
  }

  SuperBlock& sb = vol_->mutable_super();
  uint64_t used = 0;
  space_->ForEachGroup([&](const alloc::BlockGroup& g) { used += g.used_bytes() - ExcludedIn(g.start()); });
  sb.generation = transid();
  // (not after `rescue clear-uuid-tree`: with no tree there is nothing current)
  if (uuid_tree_current_ && vol_->FindRoot(kUuidTreeObjectid).ok()) sb.uuid_tree_generation = transid();
  sb.bytes_used = used;
  RootBackup& b = sb.super_roots[NextBackupRootSlot(sb, transid())];
  std::memset(&b, 0, sizeof b);
  const tree::RootPtr rt = vol_->root_tree();
  b.tree_root = rt.bytenr;
  b.tree_root_gen = rt.generation;
  b.tree_root_level = static_cast<uint8_t>(rt.level);
  const tree::RootPtr ct = vol_->chunk_tree();
  b.chunk_root = ct.bytenr;
  b.chunk_root_gen = ct.generation;
  b.chunk_root_level = static_cast<uint8_t>(ct.level);
  auto fill = [&](uint64_t id, Le64& bytenr, Le64& gen, uint8_t& level) {
    if (auto r = vol_->FindRoot(id); r.ok()) {
      bytenr = r->ref.bytenr;
      gen = r->ref.generation;
      level = static_cast<uint8_t>(r->ref.level);
    }
  };
  fill(kExtentTreeObjectid, b.extent_root, b.extent_root_gen, b.extent_root_level);
  fill(kFsTreeObjectid, b.fs_root, b.fs_root_gen, b.fs_root_level);
  fill(kDevTreeObjectid, b.dev_root, b.dev_root_gen, b.dev_root_level);
  fill(kCsumTreeObjectid, b.csum_root, b.csum_root_gen, b.csum_root_level);
  b.total_bytes = sb.total_bytes.get();
  b.bytes_used = used;
  b.num_devices = sb.num_devices.get();
  t.supers_ = vol_->SealSuperblocks();
  force_super_ = false;
  moved_only_.clear();

  // The next transaction starts: it finds this one's blocks in the cache,
  // or held until the second half has written them, and what this one
  // freed stays pinned until that half is done. The buffers this releases are
  // kept for the next transaction's blocks.
  const size_t nblocks = t.blocks_.blocks.size();
  tree::ExpectBlockBuffers(nblocks * vol_->nodesize());
  space_->Seal();
  for (uint64_t f : freed_blocks_) vol_->reader()->Invalidate(f);
  freed_blocks_.clear();
  std::vector<tree::BlockRef> unwritten;
  if (!t.blocks_.written) unwritten.reserve(nblocks);
  for (const auto& [bytenr, block] : t.blocks_.blocks) {
    vol_->reader()->Cache(block);
    if (!t.blocks_.written) unwritten.push_back(block);
  }
  if (!unwritten.empty()) vol_->reader()->HoldUnwritten(std::move(unwritten));
  stats_.blocks_written += nblocks;
  ++stats_.commits;
  dirty_->Reset(transid() + 1);
  chunk_alloc_->TransactionSealed();
  QuotasCommitted();
  t.txn_ = this;
  return Status::Ok();
}

Status TxnManager::CommitSecondHalf(CommitTail& t) {
  static stats::Histogram& flush_time = stats::GetHistogram("commit.flush_time", "ns");
  if (!t.blocks_.written) {
    UB_RETURN_IF_ERROR(WriteSealedBlocks(t.blocks_));
    // On the device (in its cache at least): readers may read them there.
    // After a failed write they stay held: the file system aborts, and its
    // read-only view must not read what never got there.
    vol_->reader()->ReleaseUnwritten();
  }
  t.blocks_ = SealedBlocks{};
  const uint64_t t0 = stats::NowNs();
  UB_RETURN_IF_ERROR(vol_->devices().Flush());
  UB_RETURN_IF_ERROR(vol_->WriteSealedSuperblocks(t.supers_));
  UB_RETURN_IF_ERROR(vol_->devices().Flush());
  flush_time.Record(stats::NowNs() - t0);
  space_->Commit();
  chunk_alloc_->ReleaseRemoved();
  return Status::Ok();
}

}  // namespace ubtrfs::txn
