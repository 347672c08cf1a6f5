// The whole-image check. One pass walks every tree depth-first (root tree,
// extent tree, chunk tree, the other global trees, then the fs trees, then
// trees being dropped), reading each block through the verifying
// BlockReader:
//  - on the first visit of a block, what its parent pointer implies for the
//    extent tree is recorded (the expected backref of every child, the data
//    backref of every file extent: check/backrefs.cc, compared with the
//    extent tree streamed after the walk), and the items of the global trees are
//    collected (extent items, block groups, chunks, dev extents, csums, free
//    space tree);
//  - fs trees are walked in full even through blocks shared with an earlier
//    snapshot, feeding an FsTreeChecker per tree (inode consistency).
// Then the collected pieces are compared with each other. What counts as an
// error follows `btrfs check --readonly` (btrfs-progs 6.2, original mode), so
// that the two agree on what is clean.
#include "check/checker.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "alloc/chunk_map.h"
#include "check/backrefs.h"
#include "check/qgroups.h"
#include "check/simple_quota.h"
#include "check/uuid_tree.h"
#include "check/fs_tree_check.h"
#include "check/log_check.h"
#include "check/report.h"
#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "io/block_device.h"
#include "io/offset_device.h"
#include "txn/devices.h"
#include "check/scrub.h"
#include "tree/block_reader.h"
#include "tree/tree_block.h"

namespace ubtrfs::check {
namespace {

using namespace ubtrfs::format;
using tree::BlockCheck;
using tree::TreeBlock;

constexpr uint64_t kBtrfsStripeLen = 64 * 1024;

// Trees whose blocks can be shared between roots (snapshots, relocation) and
// that hold inodes.
bool IsFsTree(uint64_t id) {
  return IsSubvolumeTree(id) || id == kTreeRelocObjectid || id == kDataRelocTreeObjectid;
}

std::string N(uint64_t v) { return std::to_string(v); }

std::string BgType(uint64_t flags) {
  std::string s;
  auto add = [&](const char* n) { s += s.empty() ? n : std::string("|") + n; };
  if (flags & kBlockGroupData) add("DATA");
  if (flags & kBlockGroupMetadata) add("METADATA");
  if (flags & kBlockGroupSystem) add("SYSTEM");
  if (flags & kBlockGroupDup) add("DUP");
  if (flags & kBlockGroupRaid0) add("RAID0");
  if (flags & kBlockGroupRaid1) add("RAID1");
  if (flags & kBlockGroupRaid10) add("RAID10");
  if (flags & kBlockGroupRaid5) add("RAID5");
  if (flags & kBlockGroupRaid6) add("RAID6");
  if (flags & kBlockGroupRaid1c3) add("RAID1C3");
  if (flags & kBlockGroupRaid1c4) add("RAID1C4");
  return s.empty() ? "no type" : s;
}

std::string Range(uint64_t start, uint64_t end) { return "[" + N(start) + ", " + N(end) + ")"; }

// ---- sorted, merged, half-open ranges ----
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;

// Sorts and merges.
Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [s, e] : r) {
    if (s >= e) continue;
    if (!out.empty() && s <= out.back().second) {
      out.back().second = std::max(out.back().second, e);
    } else {
      out.emplace_back(s, e);
    }
  }
  return out;
}

// a minus b (both normalized).
Ranges Subtract(const Ranges& a, const Ranges& b) {
  Ranges out;
  size_t j = 0;
  for (auto [s, e] : a) {
    while (j < b.size() && b[j].second <= s) ++j;
    size_t k = j;
    while (s < e) {
      if (k >= b.size() || b[k].first >= e) {
        out.emplace_back(s, e);
        break;
      }
      if (b[k].first > s) out.emplace_back(s, b[k].first);
      s = std::max(s, b[k].second);
      ++k;
    }
  }
  return out;
}

// ---- what the walk and the global trees yield ----

struct TreeCtx {
  uint64_t id = 0;
  tree::RootPtr root;
  uint64_t last_snapshot = 0;
  uint64_t root_dirid = kFirstFreeObjectid;
  uint32_t refs = 1;
  bool dropping = false;
  Key drop_key{};
  int drop_level = 0;
  FsTreeChecker* fs = nullptr;  // inode checks, for fs trees with refs > 0
};

struct BlockGroupRec {
  uint64_t start = 0, len = 0, used = 0, flags = 0;
  uint64_t actual = 0;
  bool has_chunk = false;
};

struct ChunkRec {
  uint64_t logical = 0, length = 0, type = 0, stripe_len = 0;
  uint16_t num_stripes = 0, sub_stripes = 0;
  std::vector<std::pair<uint64_t, uint64_t>> stripes;  // devid, physical
  std::vector<std::array<uint8_t, kUuidSize>> stripe_uuids;
};

struct DevExtentRec {
  uint64_t length = 0, chunk_offset = 0;
  bool matched = false;
};

struct DevRec {
  uint64_t devid = 0, total_bytes = 0, bytes_used = 0;
  std::array<uint8_t, kUuidSize> uuid{};
};

struct RootRefItem {  // ROOT_REF or ROOT_BACKREF
  uint64_t parent = 0, child = 0, dirid = 0, sequence = 0;
  std::string name;
  bool forward = false;
};

struct FstItem {
  Key key;
  std::vector<uint8_t> data;
};

class Checker {
 public:
  Checker(txn::Volume& vol, const CheckOptions& opts, CheckResult* out)
      : vol_(vol),
        reader_(vol.reader()),
        opts_(opts),
        out_(out),
        report_(out, opts.max_errors),
        tally_(vol.chunks(), vol.super().sectorsize.get(), vol.super().nodesize.get(), vol.super().generation.get(),
               &report_) {
    const SuperBlock& sb = vol_.super();
    ss_ = sb.sectorsize.get();
    nodesize_ = sb.nodesize.get();
    super_gen_ = sb.generation.get();
    csum_size_ = CsumSize(sb.csum_type.get());
    no_holes_ = sb.incompat_flags.get() & kIncompatNoHoles;
    compat_ro_ = sb.compat_ro_flags.get();
  }

  void Run();

 private:
  void Error(std::string s) { report_.Error(std::move(s)); }
  void Warning(std::string s) { report_.Warning(std::move(s)); }

  // walk
  void WalkTree(TreeCtx& t);
  void Visit(TreeCtx& t, const BlockCheck& bc, uint64_t parent, int slot);
  int FirstChildSlot(const TreeCtx& t, const TreeBlock& b) const;
  bool SkipChild(const TreeCtx& t, const TreeBlock& b, int slot) const;
  bool Account(TreeCtx& t, const TreeBlock& b);
  bool DecideFullBackref(const TreeCtx& t, const TreeBlock& b, bool* reported);
  void LeafItems(const TreeCtx& t, const TreeBlock& b, bool full);
  void RootTreeItem(const Key& k, std::span<const uint8_t> d);
  void BlockGroupItem(const Key& k, std::span<const uint8_t> d);
  void ChunkTreeItem(const Key& k, std::span<const uint8_t> d);
  void DevTreeItem(const Key& k, std::span<const uint8_t> d);
  void CsumItem(const TreeBlock& b, int slot, const Key& k, std::span<const uint8_t> d);
  void FileExtentRef(const TreeCtx& t, const TreeBlock& b, int slot, const Key& k, std::span<const uint8_t> d,
                     bool full);
  void VerifyData(uint64_t logical, std::span<const uint8_t> csums);

  // comparisons after the walk
  void PlaceExtent(const ExtentRec& e, uint64_t owner);
  void CheckBlockGroupUsage();
  void NoteRootNode(const ExtentRec& e);
  void CheckChunks();
  void CheckFreeSpaceTree();
  void CheckCsumCoverage();
  void CheckRootRefs();
  void CheckPrealloc();
  void CheckRootNodes();
  Ranges SuperStripes(const BlockGroupRec& bg) const;

  txn::Volume& vol_;
  tree::BlockReader* reader_;
  CheckOptions opts_;
  CheckResult* out_;
  Report report_;
  uint32_t ss_ = 4096, nodesize_ = 16384;
  uint64_t super_gen_ = 0;
  size_t csum_size_ = 4;
  bool no_holes_ = false;
  uint64_t compat_ro_ = 0;

  std::vector<TreeCtx> roots_;  // from ROOT_ITEMs, in key order
  std::unordered_set<uint64_t> unreadable_;
  RefTally tally_;
  SimpleQuotaCount squota_;
  UuidTreeCheck uuids_;
  // What the checks after the walk keep of the extents streamed past them.
  Ranges used_runs_, data_runs_;
  std::vector<uint64_t> ino_cache_trees_;  // trees with the old free inode number cache
  Ranges log_data_runs_;  // data extents the tree log refers to (log_check.h)
  std::vector<LogCheckCounts::NeedsCsum> log_needs_csum_;
  Ranges log_csum_runs_;
  bool have_prev_extent_ = false;
  uint64_t prev_extent_end_ = 0;
  Key prev_extent_key_{};
  struct RootNode {
    int level = -1;
    uint64_t bytenr = 0, generation = 0, count = 0;
  };
  std::map<uint64_t, RootNode> root_nodes_;  // by the root its first inline TREE_BLOCK_REF names
  std::map<uint64_t, BlockGroupRec> bgs_;
  std::map<uint64_t, ChunkRec> chunks_;
  std::map<std::pair<uint64_t, uint64_t>, DevExtentRec> dev_extents_;
  std::vector<DevRec> devs_;
  std::vector<RootRefItem> root_refs_;
  std::set<uint64_t> root_orphans_;
  std::vector<FstItem> fst_items_;
  bool have_fst_root_ = false, have_extent_root_ = false, have_csum_root_ = false;
  CsumIndex csums_;
  uint64_t last_csum_end_ = 0;
  uint64_t csum_items_ = 0;
  std::vector<SubvolEntry> subvol_entries_;
  std::vector<PreallocCsum> prealloc_csums_;
  std::set<uint64_t> fs_roots_with_item_;  // fs trees with refs > 0
  uint64_t trees_ = 0, inodes_ = 0;
  uint64_t data_csum_errors_ = 0;
};

// ------------------------------------------------------------------ walk

int Checker::FirstChildSlot(const TreeCtx& t, const TreeBlock& b) const {
  // A tree being dropped: slots left of drop_progress are already gone.
  if (t.dropping && t.drop_level > 0 && b.level() > t.drop_level) {
    return std::max(0, b.LastSlotAtOrBefore(t.drop_key));
  }
  return 0;
}

bool Checker::SkipChild(const TreeCtx& t, const TreeBlock& b, int slot) const {
  return t.dropping && b.level() == t.drop_level && b.key(slot) < t.drop_key;
}

void Checker::WalkTree(TreeCtx& t) {
  ++trees_;
  Visit(t, BlockCheck{t.root.bytenr, t.root.level, t.root.generation, {}}, 0, -1);
}

void Checker::Visit(TreeCtx& t, const BlockCheck& bc, uint64_t parent, int slot) {
  const bool is_root = parent == 0;
  if (is_root && bc.bytenr % ss_ != 0) {
    Error(TreeLabel(t.id) + ": the root item points at unaligned block " + N(bc.bytenr));
    return;
  }
  const uint64_t repairs = reader_->stats().mirror_repairs.load();
  auto r = reader_->Read(bc);
  if (!r.ok()) {
    if (is_root) tally_.TreeRef(bc.bytenr, 0, t.id);
    if (unreadable_.insert(bc.bytenr).second) {
      const std::string from =
          is_root ? "root of the tree" : "pointed to by block " + N(parent) + " slot " + N(static_cast<uint64_t>(slot));
      Error(TreeLabel(t.id) + ": tree block " + N(bc.bytenr) + " (level " + std::to_string(bc.level) + ", " + from +
            ") is unreadable: " + r.status().message());
    }
    return;
  }
  if (reader_->stats().mirror_repairs.load() > repairs) {
    Warning(TreeLabel(t.id) + ": tree block " + N(bc.bytenr) + ": a copy failed verification; another copy is good");
  }
  const tree::BlockRef block = *r;
  const TreeBlock& b = *block;
  if (is_root) {
    // The root's own backref: a shared one (to itself) for reloc trees and
    // blocks older than mixed backrefs, else one naming the tree.
    const bool self = t.id == kTreeRelocObjectid || (b.header().flags.get() >> kBackrefRevShift) < kMixedBackrefRev;
    tally_.TreeRef(b.bytenr(), self ? b.bytenr() : 0, t.id);
  }
  const bool first = tally_.FirstVisit(b.bytenr());
  if (!first && t.fs == nullptr) return;
  if (b.owner() == t.id) tally_.OwnerReached(b.bytenr());
  if (first) Account(t, b);
  if (b.is_leaf()) {
    if (t.fs != nullptr) t.fs->Leaf(b);
    return;
  }
  for (int i = FirstChildSlot(t, b); i < b.nritems(); ++i) {
    if (SkipChild(t, b, i)) continue;
    Visit(t, BlockCheck{b.child_bytenr(i), b.level() - 1, b.child_generation(i), b.key(i)}, b.bytenr(), i);
  }
}

// As btrfs check decides it (calc_extent_flag and run_next_block in
// btrfs-progs): the extent tree's flag where it has an item for the block,
// else what the tree implies; FULL_BACKREF where it cannot be (a block newer
// than its tree's last snapshot, walked from its owner) and its absence where
// it must be (relocation trees) are errors, and the right state is assumed.
bool Checker::DecideFullBackref(const TreeCtx& t, const TreeBlock& b, bool* reported) {
  bool full;
  const uint64_t hflags = b.header().flags.get();
  const int flag = tally_.ExtentFullBackref(b.bytenr());
  if (flag >= 0) {
    full = flag == 1;
  } else if (t.id < kFirstFreeObjectid || b.bytenr() == t.root.bytenr) {
    full = false;  // only fs and reloc trees share blocks
  } else if (hflags & kHeaderFlagReloc) {
    full = true;
  } else {
    full = b.owner() != t.id;
  }
  if (full) {
    if (t.id != kTreeRelocObjectid && t.id == b.owner() && !(hflags & kHeaderFlagReloc) &&
        b.generation() > t.last_snapshot) {
      Error("extent tree: tree block " + N(b.bytenr()) + " (" + TreeLabel(t.id) + ") has FULL_BACKREF, but it is " +
            "newer (generation " + N(b.generation()) + ") than the last snapshot of its tree (" +
            N(t.last_snapshot) + ")");
      *reported = true;
      full = false;
    }
  } else if (t.id == kTreeRelocObjectid || (hflags & kHeaderFlagReloc)) {
    Error("extent tree: tree block " + N(b.bytenr()) + " (" + TreeLabel(t.id) +
          ") of a relocation tree lacks FULL_BACKREF");
    *reported = true;
    full = true;
  }
  return full;
}

bool Checker::Account(TreeCtx& t, const TreeBlock& b) {
  if (b.generation() > super_gen_ + 1) {
    Error(TreeLabel(t.id) + ": tree block " + N(b.bytenr()) + " has generation " + N(b.generation()) +
          ", beyond the superblock generation " + N(super_gen_));
  }
  if (!IsFsTree(t.id)) {
    if (b.owner() != t.id) {
      Error(TreeLabel(t.id) + ": tree block " + N(b.bytenr()) + " has owner " + ObjectidName(b.owner()) +
            ", expected " + ObjectidName(t.id));
    }
  } else if (!IsFsTree(b.owner())) {
    Error(TreeLabel(t.id) + ": tree block " + N(b.bytenr()) + " has owner " + ObjectidName(b.owner()) +
          ", not an fs tree");
  }
  bool reported = false;
  const bool full = DecideFullBackref(t, b, &reported);
  tally_.Block(b.bytenr(), b.level(), b.owner(), full, reported);
  if (b.is_leaf()) {
    LeafItems(t, b, full);
    return full;
  }
  for (int i = FirstChildSlot(t, b); i < b.nritems(); ++i) {
    if (SkipChild(t, b, i)) continue;
    tally_.TreeRef(b.child_bytenr(i), full ? b.bytenr() : 0, b.owner());
  }
  return full;
}

void Checker::LeafItems(const TreeCtx& t, const TreeBlock& b, bool full) {
  for (int slot = 0; slot < b.nritems(); ++slot) {
    const Key k = b.key(slot);
    const auto d = b.item_data(slot);
    switch (t.id) {
      case kRootTreeObjectid:
        // The v1 free space cache keeps its inodes and their file extents
        // in the root tree; those extents are referenced by root 1.
        if (k.type == kExtentDataKey) {
          FileExtentRef(t, b, slot, k, d, full);
        } else {
          RootTreeItem(k, d);
        }
        break;
      case kExtentTreeObjectid:
        if (k.type == kBlockGroupItemKey) {
          if (!(compat_ro_ & kCompatRoBlockGroupTree)) BlockGroupItem(k, d);
        } else {
          tally_.NoteExtentItem(k, d);
        }
        break;
      case kBlockGroupTreeObjectid:
        if (k.type == kBlockGroupItemKey) BlockGroupItem(k, d);
        break;
      case kUuidTreeObjectid: uuids_.Item(k, d, &report_); break;
      case kChunkTreeObjectid: ChunkTreeItem(k, d); break;
      case kDevTreeObjectid: DevTreeItem(k, d); break;
      case kCsumTreeObjectid: CsumItem(b, slot, k, d); break;
      case kFreeSpaceTreeObjectid:
        fst_items_.push_back(FstItem{k, std::vector<uint8_t>(d.begin(), d.end())});
        break;
      default:
        if (IsFsTree(t.id) && k.type == kExtentDataKey) FileExtentRef(t, b, slot, k, d, full);
        break;
    }
  }
}

void Checker::RootTreeItem(const Key& k, std::span<const uint8_t> d) {
  if (k.type == kRootItemKey) {
    if (d.size() < kRootItemV1Size) {
      Error("root tree: ROOT_ITEM " + KeyToString(k) + " is " + N(d.size()) + " bytes, shorter than " +
            N(kRootItemV1Size));
      return;
    }
    RootItem ri{};
    std::memcpy(&ri, d.data(), std::min(d.size(), sizeof ri));
    TreeCtx t;
    t.id = k.objectid;
    t.root = tree::RootPtr{ri.bytenr.get(), ri.level, ri.generation.get(), k.objectid};
    t.last_snapshot = ri.last_snapshot.get();
    t.root_dirid = ri.root_dirid.get();
    t.refs = ri.refs.get();
    t.drop_key = Key::From(ri.drop_progress);
    t.drop_level = ri.drop_level;
    t.dropping = t.drop_key.objectid != 0;
    if (ri.generation.get() > super_gen_ + 1) {
      Error("root tree: ROOT_ITEM " + KeyToString(k) + ": generation " + N(ri.generation.get()) +
            " beyond the superblock generation " + N(super_gen_));
    }
    if (ri.level >= kMaxLevel) {
      Error("root tree: ROOT_ITEM " + KeyToString(k) + ": level " + N(ri.level));
      return;
    }
    if (IsSubvolumeTree(t.id) && t.refs > 0) uuids_.Subvolume(t.id, d);
    roots_.push_back(t);
  } else if (k.type == kRootRefKey || k.type == kRootBackrefKey) {
    if (d.size() < sizeof(RootRef)) {
      Error("root tree: " + KeyToString(k) + " is " + N(d.size()) + " bytes");
      return;
    }
    const auto* rr = reinterpret_cast<const RootRef*>(d.data());
    const size_t len = std::min<size_t>(rr->name_len.get(), d.size() - sizeof(RootRef));
    if (len != rr->name_len.get()) Error("root tree: " + KeyToString(k) + ": name overruns the item");
    RootRefItem it;
    it.forward = k.type == kRootRefKey;
    it.parent = it.forward ? k.objectid : k.offset;
    it.child = it.forward ? k.offset : k.objectid;
    it.dirid = rr->dirid.get();
    it.sequence = rr->sequence.get();
    it.name.assign(reinterpret_cast<const char*>(d.data()) + sizeof(RootRef), len);
    root_refs_.push_back(std::move(it));
  } else if (k.type == kOrphanItemKey && k.objectid == kOrphanObjectid) {
    root_orphans_.insert(k.offset);
  } else if (k.type == kInodeItemKey && k.objectid >= kFirstFreeObjectid && k.objectid <= kLastFreeObjectid) {
    // An inode of the v1 free space cache: a regular file, or the kernel's
    // tree checker refuses the root tree leaf that holds it.
    if (d.size() < sizeof(InodeItem)) {
      Error("root tree: free space cache " + KeyToString(k) + " is " + N(d.size()) + " bytes");
    } else if (const uint32_t mode = reinterpret_cast<const InodeItem*>(d.data())->mode.get();
               FileTypeOfMode(mode) != kFtRegFile) {
      char m[16];
      std::snprintf(m, sizeof m, "0%o", mode);
      Error("root tree: free space cache inode " + N(k.objectid) + " has mode " + m + ", not a regular file");
    }
  }
}

void Checker::BlockGroupItem(const Key& k, std::span<const uint8_t> d) {
  if (d.size() < sizeof(format::BlockGroupItem)) {
    Error("block group item " + KeyToString(k) + " is " + N(d.size()) + " bytes");
    return;
  }
  const auto* bi = reinterpret_cast<const format::BlockGroupItem*>(d.data());
  BlockGroupRec bg;
  bg.start = k.objectid;
  bg.len = k.offset;
  bg.used = bi->used.get();
  bg.flags = bi->flags.get();
  if (!bgs_.emplace(bg.start, bg).second) Error("block group " + N(bg.start) + ": a second BLOCK_GROUP_ITEM");
}

void Checker::ChunkTreeItem(const Key& k, std::span<const uint8_t> d) {
  if (k.type == kChunkItemKey) {
    if (d.size() < sizeof(Chunk)) {
      Error("chunk tree: " + KeyToString(k) + " is " + N(d.size()) + " bytes");
      return;
    }
    const auto* c = reinterpret_cast<const Chunk*>(d.data());
    ChunkRec cr;
    cr.logical = k.offset;
    cr.length = c->length.get();
    cr.type = c->type.get();
    cr.stripe_len = c->stripe_len.get();
    cr.num_stripes = c->num_stripes.get();
    cr.sub_stripes = c->sub_stripes.get();
    if (d.size() < sizeof(Chunk) + size_t{cr.num_stripes} * sizeof(Stripe)) {
      Error("chunk tree: " + KeyToString(k) + ": " + N(cr.num_stripes) + " stripes overrun the item");
      return;
    }
    for (uint16_t i = 0; i < cr.num_stripes; ++i) {
      const auto* s = reinterpret_cast<const Stripe*>(d.data() + sizeof(Chunk) + i * sizeof(Stripe));
      cr.stripes.emplace_back(s->devid.get(), s->offset.get());
      std::array<uint8_t, kUuidSize> u;
      std::memcpy(u.data(), s->dev_uuid, kUuidSize);
      cr.stripe_uuids.push_back(u);
    }
    // What btrfs-progs' chunk validation (btrfs_check_chunk_valid) refuses.
    const std::string where = "chunk tree: " + KeyToString(k) + ": ";
    const uint64_t profile = cr.type & kBlockGroupProfileMask;
    if (cr.num_stripes == 0) Error(where + "no stripes");
    if (d.size() != sizeof(Chunk) + size_t{cr.num_stripes} * sizeof(Stripe)) {
      Error(where + "item is " + N(d.size()) + " bytes for " + N(cr.num_stripes) + " stripe(s)");
    }
    if (cr.logical % ss_ != 0) Error(where + "logical address not sector aligned");
    if (c->sector_size.get() != ss_) Error(where + "sector size " + N(c->sector_size.get()));
    if (cr.length == 0 || cr.length % ss_ != 0) Error(where + "length " + N(cr.length));
    if (cr.stripe_len != kBtrfsStripeLen) Error(where + "stripe length " + N(cr.stripe_len) + ", expected 65536");
    if (cr.type & ~(kBlockGroupTypeMask | kBlockGroupProfileMask)) Error(where + "unknown type bits " + N(cr.type));
    if (!(cr.type & kBlockGroupTypeMask)) Error(where + "no DATA/METADATA/SYSTEM type");
    if (profile & (profile - 1)) Error(where + "conflicting profiles " + BgType(profile));
    if ((profile == 0 && cr.num_stripes != 1) || ((profile & kBlockGroupDup) && cr.num_stripes > 2)) {
      Error(where + N(cr.num_stripes) + " stripes for profile " + (profile ? BgType(profile) : "SINGLE"));
    }
    chunks_.emplace(cr.logical, std::move(cr));
  } else if (k.type == kDevItemKey) {
    if (d.size() < sizeof(DevItem)) {
      Error("chunk tree: " + KeyToString(k) + " is " + N(d.size()) + " bytes");
      return;
    }
    const auto* di = reinterpret_cast<const DevItem*>(d.data());
    DevRec dr{di->devid.get(), di->total_bytes.get(), di->bytes_used.get()};
    std::memcpy(dr.uuid.data(), di->uuid, kUuidSize);
    devs_.push_back(dr);
  }
}

void Checker::DevTreeItem(const Key& k, std::span<const uint8_t> d) {
  if (k.type != kDevExtentKey) return;
  if (d.size() < sizeof(DevExtent)) {
    Error("dev tree: " + KeyToString(k) + " is " + N(d.size()) + " bytes");
    return;
  }
  const auto* de = reinterpret_cast<const DevExtent*>(d.data());
  dev_extents_[{k.objectid, k.offset}] = DevExtentRec{de->length.get(), de->chunk_offset.get(), false};
}

void Checker::CsumItem(const TreeBlock& b, int slot, const Key& k, std::span<const uint8_t> d) {
  if (k.type != kExtentCsumKey) return;
  ++csum_items_;
  if (k.objectid != kExtentCsumObjectid) {
    Error("csum tree: " + KeyToString(k) + ": objectid is not EXTENT_CSUM");
  }
  if (k.offset < last_csum_end_) {
    Error("csum tree: " + KeyToString(k) + " (block " + N(b.bytenr()) + " slot " + N(static_cast<uint64_t>(slot)) +
          ") overlaps the previous csum item, which ends at " + N(last_csum_end_));
  }
  const uint64_t entries = d.size() / csum_size_;
  const uint64_t len = entries * ss_;
  const uint64_t max_entries = MaxCsumsPerItem(nodesize_, csum_size_);
  if (entries > max_entries) {
    Error("csum tree: " + KeyToString(k) + ": " + N(entries) + " checksums, at most " + N(max_entries) + " fit");
  }
  if (d.size() % csum_size_ != 0) {
    Error("csum tree: " + KeyToString(k) + ": item size " + N(d.size()) + " is not a multiple of the checksum size");
  }
  if (opts_.check_data_csum) VerifyData(k.offset, d.first(entries * csum_size_));
  csums_.Add(k.offset, len);
  last_csum_end_ = k.offset + len;
}

void Checker::VerifyData(uint64_t logical, std::span<const uint8_t> csums) {
  const uint64_t n = csums.size() / csum_size_;
  const uint16_t type = vol_.csum_type();
  constexpr uint64_t kBatch = 256;  // sectors per read
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < n;) {
    const uint64_t pos = logical + i * ss_;
    // One csum item can span two chunks that are adjacent in logical space.
    const alloc::ChunkInfo* chunk = vol_.chunks().Find(pos);
    if (chunk == nullptr || chunk->logical + chunk->length <= pos) {
      Error("csum tree: csums for " + Range(pos, logical + n * ss_) + " lie outside every chunk");
      return;
    }
    const uint64_t cnt = std::min({kBatch, n - i, (chunk->logical + chunk->length - pos) / ss_});
    if (cnt == 0) return;
    auto copies = vol_.chunks().Map(pos, cnt * ss_);
    if (!copies.ok()) {
      Error("csum tree: csums for " + Range(pos, pos + cnt * ss_) + " cannot be mapped: " + copies.status().message());
      return;
    }
    buf.resize(cnt * ss_);
    // Every copy (RAID5/6: the data as stored, mirror 0); a missing device's
    // copies are not there to check.
    const size_t ncopies = copies->size();
    for (size_t c = 0; c < ncopies; ++c) {
      bool present = true;
      for (const auto& p : (*copies)[c]) present = present && vol_.devices().Has(p.devid);
      if (!present) continue;
      Status st = vol_.chunk_io().Read(pos, buf, static_cast<int>(c));
      if (!st.ok()) {
        Error("data at logical " + N(pos) + " (mirror " + N(c + 1) + "): " + st.message());
        continue;
      }
      for (uint64_t j = 0; j < cnt; ++j) {
        const std::span<const uint8_t> sector(buf.data() + j * ss_, ss_);
        if (!VerifyCsum(type, sector, csums.data() + (i + j) * csum_size_)) {
          ++data_csum_errors_;
          Error("data checksum mismatch at logical " + N(pos + j * ss_) + " (mirror " + N(c + 1) + ")");
        }
      }
    }
    i += cnt;
  }
}

void Checker::FileExtentRef(const TreeCtx& t, const TreeBlock& b, int slot, const Key& k,
                            std::span<const uint8_t> d, bool full) {
  (void)t;
  const std::string where = TreeLabel(b.owner()) + ": block " + N(b.bytenr()) + " slot " +
                            N(static_cast<uint64_t>(slot)) + " " + KeyToString(k);
  if (d.size() < kFileExtentInlineDataStart) return;  // reported by the inode check
  const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
  if (fe->type == kFileExtentInline) return;
  if (d.size() != sizeof(FileExtentItem)) {
    Error(where + ": file extent item is " + N(d.size()) + " bytes, expected " + N(sizeof(FileExtentItem)));
    return;
  }
  if (k.offset % ss_ != 0) {
    Error(where + ": file offset is not sector aligned");
    return;
  }
  const uint64_t disk = fe->disk_bytenr.get();
  if (disk == 0) return;
  if (fe->generation.get() > super_gen_ + 1) {
    Error(where + ": file extent generation " + N(fe->generation.get()) + " beyond the superblock generation " +
          N(super_gen_));
  }
  tally_.DataRef(disk, fe->disk_num_bytes.get(), fe->type == kFileExtentReg, full ? b.bytenr() : 0, b.owner(),
                 k.objectid, k.offset - fe->offset.get());
}

// ------------------------------------------------------------------ comparisons

// Runs of [start, end) in address order, merged as they come.
void AddRun(Ranges* runs, uint64_t start, uint64_t end) {
  if (!runs->empty() && start <= runs->back().second) {
    runs->back().second = std::max(runs->back().second, end);
  } else {
    runs->emplace_back(start, end);
  }
}

// One extent of the extent tree, in key order (RefTally::Compare streams
// them): overlap, block group, stripe, and what the later checks need of it.
void Checker::PlaceExtent(const ExtentRec& e, uint64_t owner) {
  const uint64_t start = e.start;
  AddRun(&used_runs_, start, start + e.len);
  if (!e.tree_block) AddRun(&data_runs_, start, start + e.len);
  NoteRootNode(e);
  const std::string item = "extent " + KeyToString(e.key);
  if (have_prev_extent_ && start < prev_extent_end_) {
    Error("extent tree: " + item + " overlaps " + KeyToString(prev_extent_key_));
  }
  if (!have_prev_extent_ || start + e.len > prev_extent_end_) {
    prev_extent_end_ = start + e.len;
    prev_extent_key_ = e.key;
    have_prev_extent_ = true;
  }
  auto bg = bgs_.upper_bound(start);
  if (bg == bgs_.begin() || std::prev(bg)->second.start + std::prev(bg)->second.len <= start) {
    Error("extent tree: " + item + " is not inside any block group");
    return;
  }
  BlockGroupRec& g = std::prev(bg)->second;
  g.actual += e.len;
  if (start + e.len > g.start + g.len) {
    Error("extent tree: " + item + " runs past the end of block group " + Range(g.start, g.start + g.len));
  }
  if (!e.tree_block) {
    if (!(g.flags & kBlockGroupData)) {
      Error("extent tree: data " + item + " lies in a " + BgType(g.flags) + " block group");
    }
    return;
  }
  if (!(g.flags & (kBlockGroupMetadata | kBlockGroupSystem))) {
    Error("extent tree: tree block " + item + " lies in a " + BgType(g.flags) + " block group");
  } else {
    uint64_t tree = owner;
    if (tree == 0) {
      for (const auto& r : e.decl) {
        if (r.type == kTreeBlockRefKey) tree = r.a;
      }
    }
    if (tree != 0) {
      const uint64_t want = tree == kChunkTreeObjectid ? kBlockGroupSystem : kBlockGroupMetadata;
      if (!(g.flags & want)) {
        Error("extent tree: tree block " + item + " of the " + TreeLabel(tree) + " lies in a " + BgType(g.flags) +
              " block group");
      }
    }
  }
  if (start / kBtrfsStripeLen != (start + nodesize_ - 1) / kBtrfsStripeLen) {
    Error("extent tree: tree block " + item + " crosses a 64 KiB stripe boundary");
  }
}

void Checker::CheckBlockGroupUsage() {
  uint64_t total = 0;
  for (const auto& [start, g] : bgs_) {
    total += g.actual;
    if (g.used != g.actual) {
      Error("block group " + Range(g.start, g.start + g.len) + " (" + BgType(g.flags) + "): BLOCK_GROUP_ITEM used " +
            N(g.used) + ", but its extents add up to " + N(g.actual));
    }
  }
  // An older commit's trees (check -b or -r) go with the bytes_used of its
  // backup root, if the superblock keeps one; the superblock's own is the
  // newest commit's.
  const SuperBlock& sb = vol_.super();
  std::optional<uint64_t> sb_used;
  if (vol_.root_tree().bytenr == sb.root.get()) {
    sb_used = sb.bytes_used.get();
  } else {
    for (const RootBackup& b : sb.super_roots) {
      if (b.tree_root.get() == vol_.root_tree().bytenr) sb_used = b.bytes_used.get();
    }
    if (!sb_used) {
      Warning("superblock: bytes_used not compared: the trees checked are an older commit's, which no backup root "
              "of the superblock describes");
    }
  }
  if (sb_used && *sb_used != total) {
    Error("superblock: bytes_used " + N(*sb_used) + ", but the block groups hold " + N(total) + " bytes of extents");
  }
  out_->counts.emplace_back("bytes_used", total);
}

void Checker::CheckChunks() {
  for (const auto& [logical, c] : chunks_) {
    const std::string name = "chunk " + Range(logical, logical + c.length) + " (" + BgType(c.type) + ")";
    auto bg = bgs_.find(logical);
    if (bg == bgs_.end()) {
      Error(name + " has no BLOCK_GROUP_ITEM");
    } else {
      bg->second.has_chunk = true;
      if (bg->second.len != c.length || bg->second.flags != c.type) {
        Error(name + " does not match its block group: length " + N(bg->second.len) + ", flags " +
              BgType(bg->second.flags));
      }
    }
    uint64_t stripe_len = c.length;
    const uint64_t n = std::max<uint64_t>(c.num_stripes, 1);
    if (c.type & kBlockGroupRaid0) stripe_len = c.length / n;
    if (c.type & kBlockGroupRaid10) stripe_len = c.length * std::max<uint64_t>(c.sub_stripes, 1) / n;
    if (c.type & kBlockGroupRaid5) stripe_len = n > 1 ? c.length / (n - 1) : c.length;
    if (c.type & kBlockGroupRaid6) stripe_len = n > 2 ? c.length / (n - 2) : c.length;
    for (size_t si = 0; si < c.stripes.size(); ++si) {
      const auto [devid, phys] = c.stripes[si];
      auto dev = std::find_if(devs_.begin(), devs_.end(), [want = uint64_t{devid}](const DevRec& d) { return d.devid == want; });
      if (dev == devs_.end()) {
        Error(name + ": stripe " + N(si) + " is on device " + N(devid) + ", which has no DEV_ITEM");
      } else if (dev->uuid != c.stripe_uuids[si]) {
        Error(name + ": stripe " + N(si) + " names device uuid " + UuidToString(c.stripe_uuids[si].data()) +
              ", device " + N(devid) + " has uuid " + UuidToString(dev->uuid.data()));
      }
      auto de = dev_extents_.find({devid, phys});
      if (de == dev_extents_.end()) {
        Error(name + ": stripe at device " + N(devid) + " offset " + N(phys) + " has no DEV_EXTENT");
        continue;
      }
      de->second.matched = true;
      if (de->second.chunk_offset != logical || de->second.length != stripe_len) {
        Error(name + ": DEV_EXTENT at device " + N(devid) + " offset " + N(phys) + " says chunk " +
              N(de->second.chunk_offset) + " length " + N(de->second.length) + ", expected " + N(logical) +
              " length " + N(stripe_len));
      }
    }
  }
  for (const auto& [start, g] : bgs_) {
    if (!g.has_chunk) Error("block group " + Range(g.start, g.start + g.len) + " (" + BgType(g.flags) + ") has no chunk");
  }
  uint64_t prev_dev = UINT64_MAX, prev_end = 0;
  std::map<uint64_t, uint64_t> dev_sum;
  for (const auto& [key, de] : dev_extents_) {
    const auto [devid, phys] = key;
    const std::string name = "dev tree: DEV_EXTENT at device " + N(devid) + " offset " + N(phys);
    if (!de.matched) Error(name + " (length " + N(de.length) + ") belongs to no chunk");
    if (devid == prev_dev && phys < prev_end) Error(name + " overlaps the previous one, which ends at " + N(prev_end));
    prev_dev = devid;
    prev_end = phys + de.length;
    dev_sum[devid] += de.length;
    auto dev = std::find_if(devs_.begin(), devs_.end(), [want = uint64_t{devid}](const DevRec& d) { return d.devid == want; });
    if (dev == devs_.end()) {
      Error(name + ": no DEV_ITEM for device " + N(devid));
    } else if (phys + de.length > dev->total_bytes) {
      Error(name + " (length " + N(de.length) + ") runs past the end of the device (" + N(dev->total_bytes) + ")");
    }
  }
  uint64_t dev_total = 0;
  for (const auto& d : devs_) {
    dev_total += d.total_bytes;
    if (d.bytes_used > d.total_bytes) {
      Error("chunk tree: DEV_ITEM " + N(d.devid) + ": bytes_used " + N(d.bytes_used) + " exceeds total_bytes " +
            N(d.total_bytes));
    } else if (dev_sum[d.devid] != d.bytes_used) {
      Error("chunk tree: DEV_ITEM " + N(d.devid) + ": bytes_used " + N(d.bytes_used) + ", but its dev extents add up to " +
            N(dev_sum[d.devid]));
    }
  }
  if (devs_.empty()) Error("chunk tree: no DEV_ITEM");
  // Each device's superblock carries its DEV_ITEM as the chunk tree has it:
  // the kernel writes both from one place at every commit (btrfs check
  // 6.19 warns of a difference).
  for (uint64_t devid : vol_.devices().Devids()) {
    if (vol_.IsSeedDevice(devid)) continue;
    auto sc = txn::ReadSuperblock(*vol_.devices().Get(devid));
    auto d = std::find_if(devs_.begin(), devs_.end(), [devid](const DevRec& r) { return r.devid == devid; });
    if (!sc.ok() || d == devs_.end() || sc->sb.generation.get() != vol_.super().generation.get()) continue;
    const format::DevItem& own = sc->sb.dev_item;
    if (own.total_bytes.get() != d->total_bytes || own.bytes_used.get() != d->bytes_used) {
      Error("superblock of device " + N(devid) + ": DEV_ITEM total_bytes " + N(own.total_bytes.get()) +
            ", bytes_used " + N(own.bytes_used.get()) + "; the chunk tree's says " + N(d->total_bytes) + ", " +
            N(d->bytes_used));
    }
  }
  // Sizes older kernels left behind (a partition of an odd size): the
  // kernel since 4.11 refuses the first, warns of the others.
  const std::string fix = " (`ubtrfs rescue fix-device-size` fixes it)";
  for (const auto& d : devs_) {
    if (d.total_bytes % ss_ != 0) {
      Warning("chunk tree: DEV_ITEM " + N(d.devid) + ": total_bytes " + N(d.total_bytes) +
              " is not a multiple of the sector size" + fix);
    }
  }
  const uint64_t sb_total = vol_.super().total_bytes.get();
  if (!devs_.empty() && sb_total < dev_total) {
    Error("superblock: total_bytes " + N(sb_total) + " is smaller than the device size " + N(dev_total) +
          ": the kernel refuses to mount it" + fix);
  } else if (!devs_.empty() && sb_total != dev_total) {
    Warning("superblock: total_bytes " + N(sb_total) + " is not the devices' total " + N(dev_total) + fix);
  }
}

Ranges Checker::SuperStripes(const BlockGroupRec& bg) const {
  Ranges out;
  const alloc::ChunkInfo* c = vol_.chunks().Find(bg.start);
  if (c == nullptr || c->logical != bg.start) return out;
  for (auto [start, len] : alloc::SuperblockRanges(*c)) out.emplace_back(start, start + len);
  return Normalize(out);
}

void Checker::CheckFreeSpaceTree() {
  if (!(compat_ro_ & kCompatRoFreeSpaceTree)) return;
  if (!have_fst_root_) {
    Error("superblock: the free-space-tree feature is set, but there is no free space tree");
    return;
  }
  auto first_at = [&](const Key& k) {
    return std::lower_bound(fst_items_.begin(), fst_items_.end(), k,
                            [](const FstItem& a, const Key& b) { return a.key < b; });
  };
  auto first_bg_at_or_after = [&](uint64_t bytenr) -> const BlockGroupRec* {
    for (const auto& [s, g] : bgs_) {
      if (g.start + g.len > bytenr) return &g;
    }
    return nullptr;
  };
  // Every FREE_SPACE_INFO, hopping from one to the next as btrfs check does:
  // one left behind by a removed block group is accepted when a block group
  // follows it (mkfs.btrfs 6.2 --rootdir leaves such items).
  std::string stale;
  for (uint64_t at = 0;;) {
    auto it = first_at(Key{at, 0, 0});
    if (it == fst_items_.end()) break;
    if (it->key.type != kFreeSpaceInfoKey) {
      Error("free space tree: expected a FREE_SPACE_INFO at or after " + N(at) + ", found " + KeyToString(it->key));
      break;
    }
    const BlockGroupRec* g = first_bg_at_or_after(it->key.objectid);
    if (g == nullptr) {
      Error("free space tree: " + KeyToString(it->key) + " belongs to no block group");
      break;
    }
    if (g->start != it->key.objectid || g->len != it->key.offset) stale += (stale.empty() ? "" : ", ") + KeyToString(it->key);
    if (it->key.objectid + it->key.offset <= at) break;
    at = it->key.objectid + it->key.offset;
  }
  if (!stale.empty()) {
    Warning("free space tree: FREE_SPACE_INFO of block groups that no longer exist (mkfs.btrfs 6.2 leaves them, "
            "the kernel ignores them, btrfs check 6.19 reports them; ubtrfs removes them at its first commit): " +
            stale);
  }

  const Ranges& used = used_runs_;

  for (const auto& [bstart, g] : bgs_) {
    const uint64_t gend = g.start + g.len;
    if (gend <= kSuperInfoOffset + kSuperInfoSize) continue;  // btrfs check starts past the first superblock
    const std::string bgname = "free space tree: block group " + Range(g.start, gend);
    auto it = first_at(Key{g.start, kFreeSpaceInfoKey, g.len});
    if (it == fst_items_.end() || it->key != Key{g.start, kFreeSpaceInfoKey, g.len}) {
      Error(bgname + " has no FREE_SPACE_INFO");
      continue;
    }
    if (it->data.size() < sizeof(FreeSpaceInfo)) {
      Error(bgname + ": FREE_SPACE_INFO is " + N(it->data.size()) + " bytes");
      continue;
    }
    const auto* info = reinterpret_cast<const FreeSpaceInfo*>(it->data.data());
    const uint32_t want_count = info->extent_count.get();
    const bool bitmaps = info->flags.get() & 1;  // FREE_SPACE_USING_BITMAPS
    Ranges listed;
    uint32_t count = 0;
    bool prev_bit = false;
    uint64_t run_start = 0;
    bool have_prev = false;
    uint64_t prev_s = 0, prev_e = 0;
    for (++it; it != fst_items_.end() && it->key.type != kFreeSpaceInfoKey; ++it) {
      const Key& k = it->key;
      const uint8_t want_type = bitmaps ? kFreeSpaceBitmapKey : kFreeSpaceExtentKey;
      if (k.type != want_type) {
        Error(bgname + ": unexpected " + KeyToString(k) + " (the info says " + (bitmaps ? "bitmaps" : "extents") + ")");
        break;
      }
      if (k.objectid >= gend || k.objectid + k.offset > gend || k.objectid + k.offset < k.objectid) {
        Error(bgname + ": " + KeyToString(k) + " lies beyond the block group");
        break;
      }
      if (!bitmaps) {
        const uint64_t s = k.objectid, e = k.objectid + k.offset;
        if (have_prev && s < prev_e) Error(bgname + ": free extent " + Range(s, e) + " overlaps " + Range(prev_s, prev_e));
        if (have_prev && s == prev_e) Error(bgname + ": free extent " + Range(s, e) + " is not merged with " + Range(prev_s, prev_e));
        listed.emplace_back(s, e);
        ++count;
        have_prev = true;
        prev_s = s;
        prev_e = e;
        continue;
      }
      const uint64_t nbits = k.offset / ss_;
      if (it->data.size() * 8 < nbits) {
        Error(bgname + ": bitmap " + KeyToString(k) + " is " + N(it->data.size()) + " bytes, too short");
        break;
      }
      for (uint64_t i = 0; i < nbits; ++i) {
        const bool bit = (it->data[i / 8] >> (i % 8)) & 1;
        const uint64_t off = k.objectid + i * ss_;
        if (!prev_bit && bit) {
          run_start = off;
        } else if (prev_bit && !bit) {
          listed.emplace_back(run_start, off);
          ++count;
        }
        prev_bit = bit;
      }
    }
    if (prev_bit) {
      listed.emplace_back(run_start, gend);
      ++count;
    }
    if (count != want_count) {
      Error(bgname + ": FREE_SPACE_INFO says " + N(want_count) + " free extent(s), the tree holds " + N(count));
    }
    // Superblock copies are never allocated; the kernel lists their stripes
    // as free, btrfs check ignores them either way.
    Ranges supers = SuperStripes(g);
    Ranges excluded = supers;
    if (g.start < kSuperInfoOffset) excluded.emplace_back(g.start, kSuperInfoOffset);
    excluded = Normalize(std::move(excluded));
    const Ranges free_listed = Subtract(Normalize(std::move(listed)), excluded);
    Ranges group_used;
    for (const auto& [s, e] : used) {
      if (e <= g.start || s >= gend) continue;
      group_used.emplace_back(std::max(s, g.start), std::min(e, gend));
    }
    const Ranges expected = Subtract(Subtract(Ranges{{g.start, gend}}, group_used), supers);
    int shown = 0;
    for (const auto& [s, e] : Subtract(free_listed, expected)) {
      if (shown++ < 4) Error(bgname + ": " + Range(s, e) + " is listed as free, but extents use it");
    }
    for (const auto& [s, e] : Subtract(expected, free_listed)) {
      if (shown++ < 4) Error(bgname + ": " + Range(s, e) + " is not listed as free, but no extent uses it");
    }
    if (shown > 4) Error(bgname + ": " + N(static_cast<uint64_t>(shown - 4)) + " more differing range(s)");
  }
}

void Checker::CheckCsumCoverage() {
  const Ranges& data = data_runs_;
  Ranges runs(csums_.runs().begin(), csums_.runs().end());
  int shown = 0;
  for (const auto& [s, e] : Subtract(Subtract(runs, data), log_data_runs_)) {
    if (shown++ < 20) Error("csum tree: checksums for " + Range(s, e) + ", but no data extent lies there");
  }
  if (shown > 20) Error("csum tree: " + N(static_cast<uint64_t>(shown - 20)) + " more ranges of checksums without data");

  // The log's file extents: their data has checksums in the log or in the
  // csum tree, or the replay makes extents whose reads fail.
  Ranges have = runs;
  have.insert(have.end(), log_csum_runs_.begin(), log_csum_runs_.end());
  have = Normalize(std::move(have));
  for (const auto& n : log_needs_csum_) {
    // Merged runs: a range with checksums throughout lies in one of them.
    auto run = std::upper_bound(have.begin(), have.end(), std::pair{n.start, UINT64_MAX});
    if (run != have.begin() && std::prev(run)->second >= n.start + n.len) continue;
    Error("tree log: log tree of " + TreeLabel(n.subvol) + ": inode " + N(n.ino) + " offset " + N(n.file_offset) +
          ": no checksums for its data " + Range(n.start, n.start + n.len) + " in the log or the csum tree");
  }
}

// btrfs check's "checking root items": the highest tree block whose first
// inline backref is TREE_BLOCK_REF of a subvolume must be the block its
// ROOT_ITEM names (a root item left pointing at an older root node is how
// the 3.17 snapshot bug showed).
void Checker::NoteRootNode(const ExtentRec& e) {
  if (!e.tree_block || e.decl.empty() || e.decl[0].keyed || e.decl[0].type != kTreeBlockRefKey) return;
  RootNode& f = root_nodes_[e.decl[0].a];
  if (e.level > f.level) {
    f = RootNode{e.level, e.start, e.generation, 1};
  } else if (e.level == f.level) {
    ++f.count;
  }
}

void Checker::CheckRootNodes() {
  const auto& found = root_nodes_;
  for (const auto& t : roots_) {
    if (t.id < kFirstFreeObjectid || t.id == kTreeRelocObjectid) continue;
    const std::string item = "root tree: ROOT_ITEM of " + TreeLabel(t.id);
    auto it = found.find(t.id);
    if (it == found.end()) {
      Error(item + ": no tree block in the extent tree carries TREE_BLOCK_REF " + N(t.id));
      continue;
    }
    const RootNode& f = it->second;
    if (f.count != 1) {
      Error(item + ": " + N(f.count) + " tree blocks at level " + N(static_cast<uint64_t>(f.level)) +
            " carry TREE_BLOCK_REF " + N(t.id) + ", so none is clearly its root");
    } else if (f.bytenr != t.root.bytenr || f.level != t.root.level || f.generation != t.root.generation) {
      Error(item + ": names block " + N(t.root.bytenr) + " level " + N(static_cast<uint64_t>(t.root.level)) +
            " generation " + N(t.root.generation) + ", but the extent tree's root block is " + N(f.bytenr) +
            " level " + N(static_cast<uint64_t>(f.level)) + " generation " + N(f.generation));
    }
  }
}

void Checker::CheckPrealloc() {
  for (const auto& p : prealloc_csums_) {
    if (tally_.HasRegularRef(p.disk_bytenr)) continue;
    Error(TreeLabel(p.tree) + ": inode " + N(p.ino) + " offset " + N(p.file_offset) + ": preallocated extent " +
          N(p.disk_bytenr) + " has checksums but was never written");
  }
}

void Checker::CheckRootRefs() {
  struct Backref {
    uint64_t ref_root = 0, dir = 0;
    std::string name;
    std::optional<uint64_t> index;
    bool dir_item = false, dir_index = false, fwd = false, back = false, reachable = false;
    std::string problems;
  };
  struct Rec {
    bool root_item = false;
    int64_t found_ref = 0;
    std::vector<Backref> backrefs;
  };
  std::map<uint64_t, Rec> recs;
  auto backref = [&](uint64_t child, uint64_t parent, uint64_t dir, const std::string& name) -> Backref& {
    Rec& r = recs[child];
    for (auto& b : r.backrefs) {
      if (b.ref_root == parent && b.dir == dir && b.name == name) return b;
    }
    r.backrefs.push_back(Backref{parent, dir, name});
    return r.backrefs.back();
  };
  auto set_index = [](Backref& b, uint64_t index) {
    if (b.index && *b.index != index) b.problems += ", index mismatch";
    b.index = index;
  };
  for (uint64_t id : fs_roots_with_item_) recs[id].root_item = true;
  for (const auto& r : root_refs_) {
    Backref& b = backref(r.child, r.parent, r.dirid, r.name);
    set_index(b, r.sequence);
    if (r.forward) {
      if (b.fwd) b.problems += ", duplicate ROOT_REF";
      b.fwd = true;
    } else {
      if (b.back) b.problems += ", duplicate ROOT_BACKREF";
      b.back = true;
    }
  }
  // A subvolume entry counts only where the subvolume is a child of that
  // tree (a snapshot keeps entries of subvolumes nested in its source).
  auto is_child = [&](uint64_t parent, uint64_t child) {
    bool has_parent = false;
    for (const auto& r : root_refs_) {
      if (r.forward && r.parent == parent && r.child == child) return true;
      if (!r.forward && r.child == child) {
        has_parent = true;
        if (r.parent == parent) return true;
      }
    }
    return !has_parent;
  };
  for (const auto& s : subvol_entries_) {
    if (!is_child(s.tree, s.subvol)) continue;
    Backref& b = backref(s.subvol, s.tree, s.dir, s.name);
    if (s.is_index) {
      set_index(b, s.index);
      b.dir_index = true;
    } else {
      b.dir_item = true;
    }
  }
  for (auto& [id, r] : recs) {
    for (auto& b : r.backrefs) {
      b.reachable = b.fwd && b.dir_item;
      if (b.reachable) ++r.found_ref;
    }
  }
  recs[kFsTreeObjectid].found_ref += 1;
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& [id, r] : recs) {
      if (r.found_ref == 0) continue;
      for (auto& b : r.backrefs) {
        if (!b.reachable) continue;
        if (recs[b.ref_root].found_ref > 0) continue;
        b.reachable = false;
        if (--r.found_ref == 0) changed = true;
      }
    }
  }
  // A deleted subvolume is found by its orphan item: the kernel's cleaner
  // drops only the dead roots it lists, so without one the tree's space
  // stays taken for good.
  for (const auto& t : roots_) {
    if (t.id >= kFirstFreeObjectid && t.id <= kLastFreeObjectid && t.refs == 0 && root_orphans_.count(t.id) == 0) {
      Error("root tree: " + TreeLabel(t.id) + " is deleted (refs 0), but has no ORPHAN_ITEM, so nothing drops it");
    }
  }
  for (auto& [id, r] : recs) {
    const std::string name = TreeLabel(id);
    if (r.found_ref == 0 && id >= kFirstFreeObjectid && id <= kLastFreeObjectid && r.root_item &&
        root_orphans_.count(id) == 0) {
      Error("root tree: " + name + " is not referenced by any directory");
    }
    if (r.found_ref > 0 && !r.root_item) Error("root tree: " + name + " is referenced, but has no ROOT_ITEM");
    for (const auto& b : r.backrefs) {
      std::string p;
      if (!b.dir_item) p += ", no DIR_ITEM";
      if (!b.dir_index) p += ", no DIR_INDEX";
      if (!b.back) p += ", no ROOT_BACKREF";
      if (!b.fwd) p += ", no ROOT_REF";
      p += b.problems;
      if (!b.reachable || p.empty()) continue;
      Error("root tree: " + name + " named '" + Esc(b.name) + "' in " + TreeLabel(b.ref_root) + " directory " +
            N(b.dir) + p);
    }
  }
}

// ------------------------------------------------------------------ driver

void Checker::Run() {
  const SuperBlock& sb = vol_.super();
  if (vol_.super_mirror() != 0 && opts_.super_mirror < 0) {  // not when asked for
    Error("superblock: the primary copy is unusable; superblock copy " + N(static_cast<uint64_t>(vol_.super_mirror())) +
          " was used");
  }
  if (sb.log_root.get() != 0) {
    const size_t before = out_->error_count;
    LogCheckCounts lc = CheckTreeLog(
        vol_, [this](std::string e) { Error(std::move(e)); }, [this](std::string w) { Warning(std::move(w)); });
    log_data_runs_ = Normalize(std::move(lc.data_extents));
    log_needs_csum_ = std::move(lc.needs_csum);
    log_csum_runs_ = Normalize(std::move(lc.log_csums));
    if (out_->error_count == before) {
      Warning("tree log: " + N(lc.log_trees) + " log trees, " + N(lc.blocks) + " blocks, " + N(lc.items) +
              " items, verified; ubtrfs replays it at the next open, the kernel at mount");
    }
  }

  TreeCtx root_tree;
  root_tree.id = kRootTreeObjectid;
  root_tree.root = vol_.root_tree();
  WalkTree(root_tree);

  // Then the other trees: the extent tree first (its items decide the
  // FULL_BACKREF state of shared blocks), the chunk tree, the remaining
  // global trees (the csum tree before any fs tree: file extents are checked
  // against it), the fs trees, and last the trees being dropped.
  std::vector<TreeCtx*> order;
  for (auto& t : roots_) {
    if (t.id == kExtentTreeObjectid && !t.dropping) order.push_back(&t);
  }
  TreeCtx chunk_tree;
  chunk_tree.id = kChunkTreeObjectid;
  chunk_tree.root = vol_.chunk_tree();
  order.push_back(&chunk_tree);
  for (auto& t : roots_) {
    if (t.id != kExtentTreeObjectid && !IsFsTree(t.id) && !t.dropping) order.push_back(&t);
  }
  for (auto& t : roots_) {
    if (IsFsTree(t.id) && !t.dropping) order.push_back(&t);
  }
  for (auto& t : roots_) {
    if (t.dropping) order.push_back(&t);
  }
  for (auto& t : roots_) {
    if (t.id == kExtentTreeObjectid) have_extent_root_ = true;
    if (t.id == kCsumTreeObjectid) have_csum_root_ = true;
    if (t.id == kFreeSpaceTreeObjectid) have_fst_root_ = true;
  }
  if (!have_extent_root_) Error("root tree: no ROOT_ITEM for the extent tree");
  if (!have_csum_root_) Error("root tree: no ROOT_ITEM for the csum tree");
  bool have_dev = false, have_fs = false;
  for (auto& t : roots_) {
    have_dev |= t.id == kDevTreeObjectid;
    have_fs |= t.id == kFsTreeObjectid;
  }
  if (!have_dev) Error("root tree: no ROOT_ITEM for the dev tree");
  if (!have_fs) Error("root tree: no ROOT_ITEM for the fs tree");
  if (compat_ro_ & kCompatRoBlockGroupTree) {
    if (std::none_of(roots_.begin(), roots_.end(), [](const TreeCtx& t) { return t.id == kBlockGroupTreeObjectid; })) {
      Error("superblock: the block-group-tree feature is set, but there is no block group tree");
    }
  }

  for (TreeCtx* t : order) {
    std::unique_ptr<FsTreeChecker> fs;
    const bool inode_check = IsFsTree(t->id) && t->id != kTreeRelocObjectid && t->refs > 0 && !t->dropping;
    if (IsFsTree(t->id) && t->id != kTreeRelocObjectid && t->refs > 0) fs_roots_with_item_.insert(t->id);
    if (inode_check) {
      FsTreeEnv env;
      env.tree_id = t->id;
      env.root_dirid = t->root_dirid;
      env.sectorsize = ss_;
      env.nodesize = nodesize_;
      env.super_generation = super_gen_;
      env.no_holes = no_holes_;
      env.csums = have_csum_root_ ? &csums_ : nullptr;
      env.report = &report_;
      fs = std::make_unique<FsTreeChecker>(env);
      t->fs = fs.get();
    }
    WalkTree(*t);
    if (fs) {
      fs->Finish();
      inodes_ += fs->inodes();
      subvol_entries_.insert(subvol_entries_.end(), fs->subvol_entries().begin(), fs->subvol_entries().end());
      prealloc_csums_.insert(prealloc_csums_.end(), fs->prealloc_csums().begin(), fs->prealloc_csums().end());
      if (fs->ino_cache()) ino_cache_trees_.push_back(t->id);
      t->fs = nullptr;
    }
  }
  if (!ino_cache_trees_.empty()) {
    std::string trees;
    for (size_t i = 0; i < ino_cache_trees_.size() && i < 4; ++i) trees += (i ? ", " : "") + TreeLabel(ino_cache_trees_[i]);
    if (ino_cache_trees_.size() > 4) trees += " and " + N(ino_cache_trees_.size() - 4) + " more";
    Warning("the free inode number cache of mount -o inode_cache (Linux before 5.11) in " + trees +
            ": the kernel ignores it; btrfs check reports it, btrfs check --clear-ino-cache removes it");
  }

  tree::RootPtr extent_root, quota_root;  // none: every reference is reported as missing its extent item
  for (const auto& t : roots_) {
    if (t.id == kExtentTreeObjectid && !t.dropping) extent_root = t.root;
    if (t.id == kQuotaTreeObjectid && !t.dropping) quota_root = t.root;
  }
  squota_.Load(reader_, quota_root, vol_.super().incompat_flags.get() & kIncompatSimpleQuota, &report_);
  tally_.Compare(reader_, extent_root, [this](const ExtentRec& e, uint64_t owner) {
    PlaceExtent(e, owner);
    squota_.Extent(e, owner);
  });
  std::vector<uint64_t> subvols;
  for (const auto& t : roots_) {
    if (IsSubvolumeTree(t.id) && !t.dropping) subvols.push_back(t.id);
  }
  squota_.Finish(subvols, &report_);
  // Full qgroups are counted by walking every extent's back references up,
  // which needs a sound extent tree: on an image with other errors the
  // count would add noise to them.
  if (quota_root.bytenr != 0 && !(vol_.super().incompat_flags.get() & kIncompatSimpleQuota)) {
    if (report_.errors() > 0) {
      Warning("quota groups are not verified (the image has other errors)");
    } else {
      std::map<uint64_t, tree::RootPtr> trees;
      for (const auto& t : roots_) {
        if (!t.dropping) trees[t.id] = t.root;
      }
      CheckQgroups(reader_, extent_root, quota_root, nodesize_, vol_.root_tree().generation,
                   [&](uint64_t id) -> std::optional<tree::RootPtr> {
        auto it = trees.find(id);
        if (it == trees.end()) return std::nullopt;
        return it->second;
      }, &report_);
    }
  }
  uuids_.Finish(vol_.super().uuid_tree_generation.get() == super_gen_,
                std::any_of(roots_.begin(), roots_.end(), [](const TreeCtx& t) { return t.id == kUuidTreeObjectid; }),
                &report_);
  CheckBlockGroupUsage();
  CheckChunks();
  CheckFreeSpaceTree();
  CheckCsumCoverage();
  CheckPrealloc();
  CheckRootNodes();
  CheckRootRefs();

  auto& c = out_->counts;
  c.insert(c.begin(), {{"trees", trees_},
                       {"tree_blocks", tally_.tree_blocks()},
                       {"unreadable_tree_blocks", unreadable_.size()},
                       {"extent_items", tally_.extent_items()},
                       {"data_extents", tally_.data_extents()},
                       {"file_extent_refs", tally_.file_extent_refs()},
                       {"block_groups", bgs_.size()},
                       {"chunks", chunks_.size()},
                       {"inodes", inodes_},
                       {"csum_items", csum_items_},
                       {"csum_bytes", csums_.total()}});
  if (opts_.check_data_csum) c.emplace_back("data_csum_errors", data_csum_errors_);
  c.emplace_back("errors", out_->error_count);
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (ch < 0x20 || ch >= 0x7f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", ch);
          out += b;
        } else {
          out.push_back(static_cast<char>(ch));
        }
    }
  }
  return out + "\"";
}

}  // namespace

CheckResult CheckVolume(txn::Volume& vol, const CheckOptions& options) {
  CheckResult result;
  for (const auto& w : vol.warnings()) result.warnings.push_back(w);
  Checker(vol, options, &result).Run();
  // Every copy of every tree block: reads stop at the first good copy, so
  // a bad mirror would go unseen (data copies: --check-data-csum above).
  ScrubOptions so;
  so.readonly = true;
  so.data = false;
  so.superblocks = false;  // the open already chose among them, with a warning
  so.only_repairable = true;
  if (auto s = ScrubVolume(vol, so); s.ok()) {
    for (const auto& e : s->errors) result.warnings.push_back(e + " (another copy is good; ubtrfs scrub rewrites it)");
  }
  return result;
}

}  // namespace ubtrfs::check

namespace ubtrfs {

using namespace ::ubtrfs::format;
using check::JsonString;

Result<CheckResult> CheckImage(const std::string& path, const CheckOptions& options) {
  auto devs = txn::OpenDevices(txn::DeviceSpec::Of(path, options.offset, options.partition, options.scan_dirs));
  if (!devs.ok()) return devs.status();
  // Whether any superblock copy carries the magic: without one this is not
  // a btrfs image at all (an operational error), with one it is a damaged one.
  bool magic = false;
  io::BlockDevice* first = devs->front().get();
  for (int i = 0; i < kSuperMirrorMax && !magic; ++i) {
    std::vector<uint8_t> buf(sizeof(SuperBlock));
    const uint64_t off = SuperblockOffset(i);
    if (off + buf.size() > first->Size()) break;
    if (!first->ReadAt(off, buf).ok()) continue;
    const auto* sb = reinterpret_cast<const SuperBlock*>(buf.data());
    magic = sb->magic.get() == kMagic;
  }
  if (!magic) {
    // What ReadSuperblock says it is instead, if it knows (a btrfs-image dump).
    if (auto sb = txn::ReadSuperblock(*first); !sb.ok() && sb.status().code() == EOPNOTSUPP) return sb.status();
    return Status::Invalid(path + ": not a btrfs image (no superblock magic at 64 KiB, 64 MiB or 256 GiB)");
  }
  txn::VolumeOptions vo;
  vo.node_cache_bytes = 32ull << 20;
  vo.verify_data_csums = false;
  vo.rescue.use_backup_root = options.use_backup_root;
  vo.rescue.tree_root = options.tree_root;
  vo.rescue.super_mirror = options.super_mirror;
  auto vol = txn::Volume::Open(std::move(*devs), vo);
  if (!vol.ok()) {
    const int code = vol.status().code();
    if (code != EUCLEAN && code != EIO) return vol.status();
    CheckResult r;
    r.error_count = 1;
    r.errors.push_back("cannot open the filesystem: " + vol.status().message());
    r.counts.emplace_back("errors", 1);
    return r;
  }
  return check::CheckVolume(**vol, options);
}

std::string CheckJson(const CheckResult& r) {
  std::string out = "{\"errors\": [";
  for (size_t i = 0; i < r.errors.size(); ++i) out += (i ? ", " : "") + JsonString(r.errors[i]);
  out += "], \"warnings\": [";
  for (size_t i = 0; i < r.warnings.size(); ++i) out += (i ? ", " : "") + JsonString(r.warnings[i]);
  out += "], \"counts\": {";
  for (size_t i = 0; i < r.counts.size(); ++i) {
    out += (i ? ", " : "") + JsonString(r.counts[i].first) + ": " + std::to_string(r.counts[i].second);
  }
  out += "}, \"clean\": ";
  out += r.clean() ? "true" : "false";
  out += "}";
  return out;
}

}  // namespace ubtrfs
