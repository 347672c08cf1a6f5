#include "txn/extent_relocation.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "alloc/chunk_map.h"
#include "format/checksum.h"
#include "format/ondisk.h"
#include "tree/cursor.h"
#include "txn/extent_refs.h"
#include "txn/root_walk.h"
#include "txn/chunk_alloc.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

namespace {

constexpr uint64_t kCopyBytes = 8ull << 20;
// One commit per batch bounds what a transaction holds (dirty tree blocks in
// memory, space pinned until the commit).
constexpr uint64_t kBatchDataBytes = 256ull << 20;
constexpr size_t kBatchExtents = 4096;
constexpr size_t kBatchTreeBlocks = 2048;

std::string At(uint64_t bytenr) { return std::to_string(bytenr); }

struct Extent {
  uint64_t bytenr = 0, len = 0;
  bool tree = false;
  uint64_t owner = 0;  // data under simple quotas: its EXTENT_OWNER_REF (0: none)
};

class Relocator {
 public:
  Relocator(TxnManager& txn, uint64_t start, RelocationStats* stats)
      : txn_(txn), vol_(*txn.volume()), start_(start), stats_(stats) {}

  Result<bool> Run();

 private:
  using BlockMove = TxnManager::BlockMove;
  // The blocks one batch moves, by address, with the walk that found them.
  struct Batch {
    explicit Batch(RootWalk w) : walk(std::move(w)) {}
    RootWalk walk;
    std::map<uint64_t, BlockMove> moves;
  };

  std::optional<tree::RootPtr> RootOf(uint64_t id);
  Result<RootWalk> NewWalk();
  // The group's extents, those given up on left out.
  Status Scan(std::vector<Extent>* data, std::vector<Extent>* blocks);
  // Adds block `x` and, up to the roots, every block that points at it to
  // the batch; false (why) when its back references do not account for
  // every pointer to it. `added` collects what was added, to take back.
  Result<bool> AddBlock(Batch& b, uint64_t x, std::vector<uint64_t>* added, std::string* why);
  // The leaves whose file extent items map data extent e, checked against
  // its references' counts, added with their ancestors.
  Result<bool> AddDataExtent(Batch& b, const Extent& e, std::vector<uint64_t>* added, std::string* why);
  Status CopyData(uint64_t from, uint64_t to, uint64_t len);
  void GiveUp(uint64_t bytenr, const std::string& what, const std::string& why);
  Result<size_t> MoveData(std::span<const Extent> batch);
  Result<size_t> MoveTreeBlocks(std::span<const Extent> batch);

  TxnManager& txn_;
  Volume& vol_;
  const uint64_t start_;
  RelocationStats* stats_;
  std::set<uint64_t> given_up_;  // extents that stay
  std::set<uint64_t> moved_;     // extents moved (they must not come back)
  // The running batch has begun to change trees: a failure from here on
  // must not be committed. Before it (no room for the batch), the
  // transaction holds at most new chunks and unreferenced extents, which
  // a commit handles.
  bool changing_ = false;
};

std::optional<tree::RootPtr> Relocator::RootOf(uint64_t id) {
  if (id == kRootTreeObjectid) return *vol_.mutable_root_tree();
  if (id == kChunkTreeObjectid) return *vol_.mutable_chunk_tree();
  auto r = vol_.FindRoot(id);
  if (!r.ok() || r->item.bytenr.get() == 0) return std::nullopt;
  return r->ref;
}

Result<RootWalk> Relocator::NewWalk() {
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot ext, vol_.FindRoot(kExtentTreeObjectid));
  return RootWalk(txn_.source(), ext.ref, [this](uint64_t id) { return RootOf(id); });
}

Status Relocator::Scan(std::vector<Extent>* data, std::vector<Extent>* blocks) {
  const auto g = txn_.space().FindGroup(start_);
  if (!g || g->start != start_) return Status::Ok();
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot ext, vol_.FindRoot(kExtentTreeObjectid));
  tree::Cursor c(txn_.source(), ext.ref);
  UB_RETURN_IF_ERROR(c.Seek(Key{start_, 0, 0}));
  for (; c.Valid() && c.key().objectid < start_ + g->length;) {
    const Key k = c.key();
    if (given_up_.contains(k.objectid)) {
    } else if (k.type == kMetadataItemKey) {
      blocks->push_back({k.objectid, vol_.nodesize(), true});
    } else if (k.type == kExtentItemKey) {
      if (c.data().size() < sizeof(ExtentItem)) return Status::Corrupt("extent tree: short item " + KeyToString(k));
      const uint64_t flags = reinterpret_cast<const ExtentItem*>(c.data().data())->flags.get();
      const bool tree = flags & kExtentFlagTreeBlock;
      uint64_t owner = 0;
      // The owner ref comes first, where the kernel reads it (and only there).
      if (auto d = c.data(); !tree && d.size() >= sizeof(ExtentItem) + sizeof(ExtentInlineRef) &&
                             d[sizeof(ExtentItem)] == kExtentOwnerRefKey) {
        owner = LoadLe<uint64_t>(d.data() + sizeof(ExtentItem) + 1);
      }
      (tree ? blocks : data)->push_back({k.objectid, k.offset, tree, owner});
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  return Status::Ok();
}

Result<bool> Relocator::AddBlock(Batch& b, uint64_t x, std::vector<uint64_t>* added, std::string* why) {
  if (b.moves.contains(x)) return true;
  std::vector<RootWalk::Backref> refs;
  BlockMove m;
  m.bytenr = x;
  UB_RETURN_IF_ERROR(b.walk.Backrefs(x, &refs, &m.level));
  std::set<uint64_t> parents;
  for (const RootWalk::Backref& r : refs) {
    if (r.type == kTreeBlockRefKey && r.root) {
      const std::optional<tree::RootPtr> root = RootOf(r.a);
      if (!root || root->bytenr != x) {
        *why = "tree block " + At(x) + ": its reference by tree " + std::to_string(r.a) + " leads to no pointer";
        return false;
      }
      m.root_of.push_back(r.a);
    } else if (r.type == kTreeBlockRefKey || r.type == kSharedBlockRefKey) {
      // A parent by address is checked here; one found in a tree was found
      // by its pointer.
      if (r.type == kSharedBlockRefKey) {
        UB_ASSIGN_OR_RETURN(tree::BlockRef p, txn_.source()->Read(tree::BlockCheck{r.a, m.level + 1, 0, {}}));
        bool points = false;
        for (int i = 0; i < p->nritems() && !points; ++i) points = p->child_bytenr(i) == x;
        if (!points) {
          *why = "tree block " + At(x) + ": its parent " + At(r.a) + " does not point at it";
          return false;
        }
      }
      if (r.blocks.size() != 1 || !parents.insert(r.blocks[0]).second) {
        *why = "tree block " + At(x) + ": two references for the pointer in " + At(r.blocks.empty() ? 0 : r.blocks[0]);
        return false;
      }
    } else {
      *why = "tree block " + At(x) + " has a data reference";
      return false;
    }
    m.refs.push_back(RefId{r.type, r.a});
  }
  if (m.refs.empty()) {
    *why = "tree block " + At(x) + " has no references";
    return false;
  }
  m.parents.assign(parents.begin(), parents.end());
  b.moves.emplace(x, m);
  added->push_back(x);
  for (uint64_t p : parents) {
    UB_ASSIGN_OR_RETURN(bool ok, AddBlock(b, p, added, why));
    if (!ok) return false;
  }
  return true;
}

Result<bool> Relocator::AddDataExtent(Batch& b, const Extent& e, std::vector<uint64_t>* added, std::string* why) {
  std::vector<RootWalk::Backref> refs;
  int level = 0;
  UB_RETURN_IF_ERROR(b.walk.Backrefs(e.bytenr, &refs, &level));
  std::set<uint64_t> leaves;
  for (const RootWalk::Backref& r : refs) {
    if (r.type != kExtentDataRefKey && r.type != kSharedDataRefKey) {
      *why = "a tree block reference";
      return false;
    }
    std::set<uint64_t> mine(r.blocks.begin(), r.blocks.end());
    uint64_t found = 0;
    for (uint64_t leaf : mine) {
      UB_ASSIGN_OR_RETURN(tree::BlockRef l, txn_.source()->Read(tree::BlockCheck{leaf, 0, 0, {}}));
      // Items of a leaf referenced by tree are counted under the leaf's
      // owner; a FULL_BACKREF leaf's by parent. Asked as the move will ask
      // it: where the two disagree, the counts do not add up and the extent
      // stays.
      if (r.type == kExtentDataRefKey && (l->owner() != r.a || txn_.FullBackref(leaf))) continue;
      uint64_t n = 0;
      ForEachDataExtent(*l, [&](const Key& k, const FileExtentItem& fe) {
        if (fe.disk_bytenr.get() != e.bytenr) return;
        if (r.type == kExtentDataRefKey && (k.objectid != r.ino || k.offset - fe.offset.get() != r.off)) return;
        ++n;
      });
      if (n > 0) leaves.insert(leaf);
      found += n;
    }
    if (found != r.count) {
      *why = "its reference " + std::string(r.type == kExtentDataRefKey ? "by tree " : "by leaf ") + std::to_string(r.a) +
             " counts " + std::to_string(r.count) + " file extent items, " + std::to_string(found) + " found";
      return false;
    }
  }
  if (leaves.empty()) {
    *why = "no file extent item maps it";
    return false;
  }
  for (uint64_t leaf : leaves) {
    UB_ASSIGN_OR_RETURN(bool ok, AddBlock(b, leaf, added, why));
    if (!ok) return false;
  }
  return true;
}

void Relocator::GiveUp(uint64_t bytenr, const std::string& what, const std::string& why) {
  given_up_.insert(bytenr);
  stats_->notes.push_back(what + " " + At(bytenr) + " stays: " + why);
}

Status Relocator::CopyData(uint64_t from, uint64_t to, uint64_t len) {
  const uint32_t ss = vol_.sectorsize();
  const size_t csize = CsumSize(vol_.csum_type());
  std::vector<uint8_t> buf;
  for (uint64_t done = 0; done < len;) {
    const uint64_t n = std::min(kCopyBytes, len - done);
    buf.resize(n);
    // Verified against the checksums (another copy where one fails): a
    // silently bad copy must not become the extent's only one.
    UB_RETURN_IF_ERROR(vol_.ReadData(from + done, buf, true));
    UB_RETURN_IF_ERROR(txn_.WriteData(to + done, buf, false));
    std::vector<uint8_t> sums;
    std::vector<bool> present;
    UB_RETURN_IF_ERROR(vol_.LookupCsums(from + done, n / ss, &sums, &present));
    // The checksums go along as they are, run by run (a nodatasum extent
    // has none).
    for (size_t i = 0; i < present.size();) {
      if (!present[i]) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < present.size() && present[j]) ++j;
      UB_RETURN_IF_ERROR(txn_.ReplaceCsums(to + done + i * ss, std::span(sums).subspan(i * csize, (j - i) * csize)));
      i = j;
    }
    done += n;
  }
  return Status::Ok();
}

Result<size_t> Relocator::MoveData(std::span<const Extent> batch) {
  UB_ASSIGN_OR_RETURN(RootWalk walk, NewWalk());
  Batch b(std::move(walk));
  std::vector<Extent> go;
  for (const Extent& e : batch) {
    std::vector<uint64_t> added;
    std::string why;
    UB_ASSIGN_OR_RETURN(bool ok, AddDataExtent(b, e, &added, &why));
    if (!ok) {
      for (uint64_t x : added) b.moves.erase(x);
      GiveUp(e.bytenr, "data extent", why);
      continue;
    }
    go.push_back(e);
  }
  if (go.empty()) return 0;
  std::vector<BlockMove> moves;
  for (auto& [x, m] : b.moves) moves.push_back(std::move(m));
  // Room first, before anything changes: an ENOSPC here leaves the
  // transaction as it was. Then a new place for each extent, as many as fit,
  // each the lowest free one: the moves pack, smaller extents filling what
  // larger ones left (around a superblock copy, say).
  UB_RETURN_IF_ERROR(txn_.chunk_alloc().ReserveMetadata(moves.size() / ChunkAllocator::kBlocksPerItem + 1));
  std::vector<uint64_t> dest;
  for (const Extent& e : go) {
    Result<uint64_t> d = txn_.AllocData(e.len, /*first_fit=*/true);
    if (!d.ok()) {
      if (d.status().code() != ENOSPC || dest.empty()) return d.status();
      break;  // the rest waits for the next batch
    }
    dest.push_back(*d);
  }
  std::map<uint64_t, uint64_t> to;
  changing_ = true;
  for (size_t i = 0; i < dest.size(); ++i) {
    const Extent& e = go[i];
    // Unreferenced (a read that fails), the new extent and the checksums
    // copied so far go at the commit.
    if (Status s = CopyData(e.bytenr, dest[i], e.len); !s.ok()) {
      if (s.code() != EIO && s.code() != EUCLEAN) return s;
      GiveUp(e.bytenr, "data extent", s.ToString());
      continue;
    }
    to[e.bytenr] = dest[i];
    moved_.insert(e.bytenr);
    ++stats_->data_extents;
    stats_->data_bytes += e.len;
  }
  // The leaves of extents that stay move all the same, unchanged.
  UB_RETURN_IF_ERROR(txn_.MoveTreeBlocks(moves, to));
  if (vol_.super().incompat_flags.get() & kIncompatSimpleQuota) {
    // As the kernel's relocation: the copy is charged to the original's
    // owner and the original credited to it when freed (nothing changes for
    // an extent made under quotas). One from before quotas has no owner: its
    // copy names the data relocation tree, which no qgroup counts.
    for (const Extent& e : go) {
      if (auto it = to.find(e.bytenr); it != to.end()) {
        txn_.SetDataOwner(it->second, e.owner != 0 ? e.owner : kDataRelocTreeObjectid);
      }
    }
  }
  return to.size();
}

Result<size_t> Relocator::MoveTreeBlocks(std::span<const Extent> batch) {
  UB_ASSIGN_OR_RETURN(RootWalk walk, NewWalk());
  Batch b(std::move(walk));
  size_t n = 0;
  for (const Extent& e : batch) {
    std::vector<uint64_t> added;
    std::string why;
    UB_ASSIGN_OR_RETURN(bool ok, AddBlock(b, e.bytenr, &added, &why));
    if (!ok) {
      for (uint64_t x : added) b.moves.erase(x);
      GiveUp(e.bytenr, "tree block", why);
      continue;
    }
    moved_.insert(e.bytenr);
    ++n;
  }
  if (b.moves.empty()) return 0;
  std::vector<BlockMove> moves;
  for (auto& [x, m] : b.moves) moves.push_back(std::move(m));
  UB_RETURN_IF_ERROR(txn_.chunk_alloc().ReserveMetadata(moves.size() / ChunkAllocator::kBlocksPerItem + 1));
  changing_ = true;
  UB_RETURN_IF_ERROR(txn_.MoveTreeBlocks(moves, {}));
  stats_->tree_blocks += n;
  return n;
}

Result<bool> Relocator::Run() {
  const std::optional<alloc::SpaceManager::GroupInfo> g = txn_.space().FindGroup(start_);
  if (!g || g->start != start_) return Status::NotFound("no block group at " + At(start_));
  if (txn_.HasChanges()) return Status::Invalid("relocation needs a transaction with no changes");
  UB_RETURN_IF_ERROR(txn_.SetRelocating(start_, true));
  Status st = [&]() -> Status {
    for (;;) {
      std::vector<Extent> data, blocks;
      UB_RETURN_IF_ERROR(Scan(&data, &blocks));
      // One that was moved and is still here kept a reference the move
      // did not know of: it stays, and no second copy is made.
      for (auto* list : {&data, &blocks}) {
        std::erase_if(*list, [&](const Extent& e) {
          if (!moved_.contains(e.bytenr)) return false;
          GiveUp(e.bytenr, e.tree ? "tree block" : "data extent", "still referenced after its move");
          return true;
        });
      }
      if (data.empty() && blocks.empty()) return Status::Ok();
      if (!data.empty()) {
        size_t n = 0;
        uint64_t bytes = 0;
        while (n < data.size() && n < kBatchExtents && bytes < kBatchDataBytes) bytes += data[n++].len;
        UB_RETURN_IF_ERROR(MoveData(std::span(data).first(n)).status());
      } else {
        UB_RETURN_IF_ERROR(MoveTreeBlocks(std::span(blocks).first(std::min(blocks.size(), kBatchTreeBlocks))).status());
      }
      UB_RETURN_IF_ERROR(txn_.Commit());
      changing_ = false;
    }
  }();
  // Each batch was committed. One that failed while changing trees is not
  // (its changes may be half made: the caller must not commit them
  // either); one that found no room leaves a transaction a commit can take.
  if (!st.ok()) {
    (void)txn_.SetRelocating(start_, false);
    if (!changing_) UB_RETURN_IF_ERROR(txn_.Commit());
    return st;
  }
  const auto left = txn_.space().FindGroup(start_);
  const bool gone = !left || left->start != start_;
  if (!gone) {
    const uint64_t used = left->used_bytes - txn_.ExcludedIn(start_);
    if (used == 0) {
      const alloc::ChunkInfo* c = vol_.chunks().Find(start_);
      stats_->notes.push_back("block group " + At(start_) + " stays empty: " +
                              (c != nullptr && !txn_.chunk_alloc().Removable(*c)
                                   ? std::string("its chunk has a stripe on a missing device")
                                   : std::string("the last of its kind")));
    }
    UB_RETURN_IF_ERROR(txn_.SetRelocating(start_, false));
  }
  return gone;
}

}  // namespace

Result<bool> RelocateGroup(TxnManager& txn, uint64_t start, RelocationStats* stats) {
  return Relocator(txn, start, stats).Run();
}

Status RefuseKernelRelocation(Volume& vol) {
  tree::Cursor c(vol.source(), vol.root_tree());
  UB_RETURN_IF_ERROR(c.Seek(Key{kTreeRelocObjectid, 0, 0}));
  if (c.Valid() && c.key().objectid == kTreeRelocObjectid) {
    return Status::Invalid("a balance of the kernel's was interrupted here (it left relocation trees): "
                           "mount the filesystem with the kernel once to finish or cancel it");
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
