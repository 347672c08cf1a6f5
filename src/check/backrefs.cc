// Reference counting (see backrefs.h). The rules follow btrfs-progs' original
// mode (check/main.c): a pointer from a parent whose extent carries
// FULL_BACKREF is a SHARED_BLOCK_REF of that parent, any other pointer and a
// ROOT_ITEM naming a block are a TREE_BLOCK_REF of the tree; a file extent
// item in a FULL_BACKREF leaf is a SHARED_DATA_REF of the leaf, otherwise an
// EXTENT_DATA_REF (root, inode, file offset - extent offset); the refs count
// of an extent is the number of such references, and equal references are
// one backref with a count.
#include "check/backrefs.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "format/ondisk.h"
#include "tree/tree_block.h"
#include "txn/extent_refs.h"

namespace ubtrfs::check {
namespace {

using namespace ubtrfs::format;

std::string N(uint64_t v) { return std::to_string(v); }

constexpr uint64_t kLevelMask = 7, kFullBit = 8, kReportedBit = 16, kLowMask = 31;

}  // namespace

// ------------------------------------------------------------------ BlockBits

void BlockBits::Init(const alloc::ChunkMap& chunks, uint32_t sectorsize) {
  shift_ = static_cast<uint32_t>(__builtin_ctz(sectorsize));
  uint64_t bits = 0;
  for (const auto& [logical, c] : chunks.chunks()) {
    if (!(c.type & (kBlockGroupMetadata | kBlockGroupSystem))) continue;
    spans_.push_back(Span{logical, logical + c.length, bits});
    bits += c.length >> shift_;
  }
  words_.assign((bits + 63) / 64, 0);
}

const BlockBits::Span* BlockBits::Find(uint64_t bytenr) const {
  auto it = std::upper_bound(spans_.begin(), spans_.end(), bytenr,
                             [](uint64_t b, const Span& s) { return b < s.start; });
  if (it == spans_.begin()) return nullptr;
  --it;
  return bytenr < it->end && (bytenr & ((uint64_t{1} << shift_) - 1)) == 0 ? &*it : nullptr;
}

bool BlockBits::Test(uint64_t bytenr) const {
  const Span* s = Find(bytenr);
  if (s == nullptr) return other_.count(bytenr) != 0;
  const uint64_t bit = s->first_bit + ((bytenr - s->start) >> shift_);
  return (words_[bit / 64] >> (bit % 64)) & 1;
}

bool BlockBits::Set(uint64_t bytenr) {
  const Span* s = Find(bytenr);
  if (s == nullptr) return other_.insert(bytenr).second;
  const uint64_t bit = s->first_bit + ((bytenr - s->start) >> shift_);
  const uint64_t mask = uint64_t{1} << (bit % 64);
  const bool was = words_[bit / 64] & mask;
  words_[bit / 64] |= mask;
  return !was;
}

// ------------------------------------------------------------------ the walk

RefTally::RefTally(const alloc::ChunkMap& chunks, uint32_t sectorsize, uint32_t nodesize, uint64_t super_generation,
                   Report* report)
    : ss_(sectorsize), nodesize_(nodesize), super_gen_(super_generation), report_(report) {
  for (BlockBits* b : {&visited_, &owner_reached_, &tree_extents_, &full_extents_}) b->Init(chunks, sectorsize);
}

void RefTally::NoteExtentItem(const Key& k, std::span<const uint8_t> d) {
  if ((k.type != kExtentItemKey && k.type != kMetadataItemKey) || d.size() < sizeof(ExtentItem)) return;
  const uint64_t flags = reinterpret_cast<const ExtentItem*>(d.data())->flags.get();
  if (!(flags & kExtentFlagTreeBlock)) return;
  tree_extents_.Set(k.objectid);
  if (flags & kBlockFlagFullBackref) full_extents_.Set(k.objectid);
}

int RefTally::ExtentFullBackref(uint64_t bytenr) const {
  if (!tree_extents_.Test(bytenr)) return -1;
  return full_extents_.Test(bytenr) ? 1 : 0;
}

void RefTally::Block(uint64_t bytenr, int level, uint64_t owner, bool full_backref, bool bad_full_reported) {
  blocks_.push_back(BlockRec{bytenr | (static_cast<uint64_t>(level) & kLevelMask) | (full_backref ? kFullBit : 0) |
                                 (bad_full_reported ? kReportedBit : 0),
                             owner});
}

void RefTally::TreeRef(uint64_t bytenr, uint64_t parent, uint64_t root) {
  trefs_.push_back(parent != 0 ? TreeRefRec{bytenr | 1, parent} : TreeRefRec{bytenr, root});
}

void RefTally::DataRef(uint64_t disk, uint64_t disk_num_bytes, bool reg, uint64_t leaf_parent, uint64_t root,
                       uint64_t ino, uint64_t offset) {
  const uint64_t bits = disk_num_bytes << 2 | (leaf_parent != 0 ? 2 : 0) | (reg ? 1 : 0);
  if (leaf_parent != 0) {
    data_.push_back(DataRefRec{disk, leaf_parent, 0, 0, bits});
  } else {
    data_.push_back(DataRefRec{disk, root, ino, offset, bits});
  }
}

uint64_t RefTally::memory_bytes() const {
  return blocks_.capacity() * sizeof(BlockRec) + trefs_.capacity() * sizeof(TreeRefRec) +
         data_.capacity() * sizeof(DataRefRec) + visited_.bytes() + owner_reached_.bytes() + tree_extents_.bytes() +
         full_extents_.bytes();
}

// ------------------------------------------------------------------ the extent tree, streamed

bool RefTally::ParseExtentItem(const Key& k, std::span<const uint8_t> d, ExtentRec* e) {
  const std::string where = "extent tree: " + KeyToString(k);
  *e = ExtentRec{};
  e->key = k;
  e->start = k.objectid;
  e->len = k.type == kMetadataItemKey ? nodesize_ : k.offset;
  if (e->start % ss_ != 0) {
    Error(where + ": extent start is not aligned to the sector size " + N(ss_));
    return false;
  }
  if (d.size() < sizeof(ExtentItem)) {
    Error(where + ": item is " + N(d.size()) + " bytes, shorter than an EXTENT_ITEM");
    return false;
  }
  const auto* ei = reinterpret_cast<const ExtentItem*>(d.data());
  e->refs = ei->refs.get();
  e->generation = ei->generation.get();
  e->flags = ei->flags.get();
  e->tree_block = e->flags & kExtentFlagTreeBlock;
  if (e->tree_block && e->len != nodesize_) {
    Error(where + ": tree block extent of " + N(e->len) + " bytes, node size is " + N(nodesize_));
    return false;
  }
  if (!e->tree_block && (e->len == 0 || e->len % ss_ != 0)) {
    Error(where + ": data extent length " + N(e->len) + " is not a multiple of the sector size");
    return false;
  }
  size_t p = sizeof(ExtentItem);
  if (e->tree_block) {
    if (k.type == kExtentItemKey) {
      if (d.size() < p + sizeof(TreeBlockInfo)) {
        Error(where + ": tree block EXTENT_ITEM without its tree_block_info");
        return false;
      }
      e->level = reinterpret_cast<const TreeBlockInfo*>(d.data() + p)->level;
      p += sizeof(TreeBlockInfo);
    } else {
      e->level = static_cast<int>(std::min<uint64_t>(k.offset, 255));
    }
    if (e->level >= kMaxLevel) {
      Error(where + ": tree block level " + N(static_cast<uint64_t>(e->level)));
      return false;
    }
  }
  const size_t refs_start = p;
  // The kernel keeps inline refs sorted, by type and within a type by
  // falling offset (an EXTENT_DATA_REF by its hash); its tree checker
  // refuses a leaf that breaks the order, and its lookups would miss refs.
  uint8_t last_type = 0;
  uint64_t last_seq = UINT64_MAX;
  bool order_reported = false;
  auto in_order = [&](uint8_t type, uint64_t seq) {
    if (type > last_type) last_seq = UINT64_MAX;
    if (!order_reported && (type < last_type || seq > last_seq)) {
      Error(where + ": inline refs out of order (" + KeyTypeName(type) + " " + N(seq) + " after " +
            KeyTypeName(last_type) + " " + N(last_seq) + "); the kernel refuses the leaf");
      order_reported = true;
    }
    last_type = type;
    last_seq = seq;
  };
  while (p < d.size()) {
    const uint8_t type = d[p];
    auto need = [&](size_t n) {
      if (p + n <= d.size()) return true;
      Error(where + ": inline ref of type " + KeyTypeName(type) + " at byte " + N(p) + " overruns the item");
      return false;
    };
    DeclRef r;
    r.type = type;
    if (type == kTreeBlockRefKey || type == kSharedBlockRefKey) {
      if (!need(sizeof(ExtentInlineRef))) break;
      r.a = LoadLe<uint64_t>(d.data() + p + 1);
      p += sizeof(ExtentInlineRef);
    } else if (type == kExtentDataRefKey) {
      if (!need(1 + sizeof(ExtentDataRef))) break;
      const auto* dr = reinterpret_cast<const ExtentDataRef*>(d.data() + p + 1);
      r.a = dr->root.get();
      r.ino = dr->objectid.get();
      r.offset = dr->offset.get();
      r.count = dr->count.get();
      p += 1 + sizeof(ExtentDataRef);
    } else if (type == kSharedDataRefKey) {
      if (!need(sizeof(ExtentInlineRef) + sizeof(SharedDataRef))) break;
      r.a = LoadLe<uint64_t>(d.data() + p + 1);
      r.count = LoadLe<uint32_t>(d.data() + p + sizeof(ExtentInlineRef));
      p += sizeof(ExtentInlineRef) + sizeof(SharedDataRef);
    } else if (type == kExtentOwnerRefKey) {  // simple quotas: not a backref
      if (!need(sizeof(ExtentInlineRef))) break;
      // Only where the kernel puts it counts (btrfs check reads no other).
      if (p == refs_start) e->owner_ref = LoadLe<uint64_t>(d.data() + p + 1);
      in_order(type, LoadLe<uint64_t>(d.data() + p + 1));
      p += sizeof(ExtentInlineRef);
      continue;
    } else {
      Error(where + ": unknown inline ref type " + N(type) + " at byte " + N(p));
      break;
    }
    in_order(type, type == kExtentDataRefKey ? txn::ExtentDataRefHash(r.a, r.ino, r.offset) : r.a);
    e->decl.push_back(r);
  }
  if (e->generation > super_gen_ + 1) {
    Error(where + ": generation " + N(e->generation) + " beyond the superblock generation " + N(super_gen_));
  }
  return true;
}

void RefTally::AddKeyedRef(const Key& k, std::span<const uint8_t> d, ExtentRec* cur, bool have) {
  const std::string where = "extent tree: " + KeyToString(k);
  DeclRef r;
  r.type = k.type;
  r.keyed = true;
  switch (k.type) {
    case kTreeBlockRefKey:
    case kSharedBlockRefKey:
      r.a = k.offset;
      break;
    case kExtentDataRefKey: {
      if (d.size() < sizeof(ExtentDataRef)) {
        Error(where + ": item is " + N(d.size()) + " bytes");
        return;
      }
      const auto* dr = reinterpret_cast<const ExtentDataRef*>(d.data());
      r.a = dr->root.get();
      r.ino = dr->objectid.get();
      r.offset = dr->offset.get();
      r.count = dr->count.get();
      break;
    }
    case kSharedDataRefKey:
      if (d.size() < sizeof(SharedDataRef)) {
        Error(where + ": item is " + N(d.size()) + " bytes");
        return;
      }
      r.a = k.offset;
      r.count = LoadLe<uint32_t>(d.data());
      break;
    default:
      return;  // block group items, EXTENT_OWNER_REF, qgroup leftovers, ...
  }
  if (!have || cur->start != k.objectid) {
    Error(where + ": backref item without an EXTENT_ITEM/METADATA_ITEM for " + N(k.objectid));
    return;
  }
  cur->decl.push_back(r);
}

// Depth first, children in key order: the items arrive sorted, and each
// extent's keyed refs right after its extent item.
void RefTally::Stream(tree::BlockReader* reader, const tree::BlockCheck& bc, ExtentRec* cur, bool* have,
                      const std::function<void(ExtentRec&)>& done) {
  auto r = reader->Read(bc);
  if (!r.ok()) return;  // the walk reported it
  const tree::TreeBlock& b = **r;
  if (!b.is_leaf()) {
    for (int i = 0; i < b.nritems(); ++i) {
      Stream(reader, tree::BlockCheck{b.child_bytenr(i), b.level() - 1, b.child_generation(i), b.key(i)}, cur, have,
             done);
    }
    return;
  }
  for (int slot = 0; slot < b.nritems(); ++slot) {
    const Key k = b.key(slot);
    const auto d = b.item_data(slot);
    if (k.type == kExtentItemKey || k.type == kMetadataItemKey) {
      if (*have && cur->start == k.objectid) {
        Error("extent tree: " + KeyToString(k) + ": a second extent item for extent " + N(k.objectid));
        continue;
      }
      if (*have) done(*cur);
      *have = ParseExtentItem(k, d, cur);
      continue;
    }
    AddKeyedRef(k, d, cur, *have);
  }
}

void RefTally::Compare(tree::BlockReader* reader, const tree::RootPtr& extent_root,
                       const std::function<void(const ExtentRec&, uint64_t owner)>& each) {
  std::sort(blocks_.begin(), blocks_.end(), [](const BlockRec& a, const BlockRec& b) { return a.bits < b.bits; });
  std::sort(trefs_.begin(), trefs_.end(), [](const TreeRefRec& a, const TreeRefRec& b) {
    return a.bits != b.bits ? a.bits < b.bits : a.who < b.who;
  });
  std::sort(data_.begin(), data_.end(), [](const DataRefRec& a, const DataRefRec& b) {
    const uint64_t as = a.len_bits & 2, bs = b.len_bits & 2;
    return std::tie(a.disk, as, a.who, a.ino, a.offset) < std::tie(b.disk, bs, b.who, b.ino, b.offset);
  });
  ti_ = bi_ = di_ = 0;
  ExtentRec cur, prev;
  bool have = false, have_prev = false;
  auto done = [&](ExtentRec& e) {
    ++extent_items_;
    Unmatched(e.start, have_prev ? &prev : nullptr);
    const size_t tb = ti_;
    while (ti_ < trefs_.size() && (trefs_[ti_].bits & ~kLowMask) == e.start) ++ti_;
    const size_t db = di_;
    while (di_ < data_.size() && data_[di_].disk == e.start) ++di_;
    const BlockRec* blk = nullptr;
    while (bi_ < blocks_.size() && (blocks_[bi_].bits & ~kLowMask) <= e.start) {
      if ((blocks_[bi_].bits & ~kLowMask) == e.start) blk = &blocks_[bi_];
      ++bi_;
    }
    if (e.tree_block) {
      CompareTreeBlock(e, tb, ti_, blk);
      if (db != di_) {
        const bool shared = data_[db].len_bits & 2;
        Error("extent tree: data extent " + N(e.start) + ", used by " +
              (shared ? "leaf " + N(data_[db].who) : TreeLabel(data_[db].who) + " inode " + N(data_[db].ino)) +
              ", is a tree block extent, " + KeyToString(e.key));
      }
    } else {
      ++data_extents_;
      if (tb != ti_) {
        Error("extent tree: " + KeyToString(e.key) + " for tree block " + N(e.start) +
              ": the extent item is not flagged TREE_BLOCK");
      }
      CompareData(e, db, di_);
    }
    each(e, blk != nullptr ? blk->owner : 0);
    prev = std::move(e);
    have_prev = true;
  };
  if (extent_root.bytenr != 0) {
    Stream(reader, tree::BlockCheck{extent_root.bytenr, extent_root.level, extent_root.generation, {}}, &cur, &have,
           done);
  }
  if (have) done(cur);
  Unmatched(UINT64_MAX, have_prev ? &prev : nullptr);
}

// Every reference to an address below `below` not yet matched has no extent
// item (or one this pass skipped as malformed, which was reported).
void RefTally::Unmatched(uint64_t below, const ExtentRec* prev) {
  auto inside = [&](uint64_t bytenr) -> std::string {
    if (prev != nullptr && prev->start <= bytenr && bytenr < prev->start + prev->len) {
      return " (it lies inside extent " + KeyToString(prev->key) + ")";
    }
    return "";
  };
  while (ti_ < trefs_.size() && (trefs_[ti_].bits & ~kLowMask) < below) {
    const uint64_t bytenr = trefs_[ti_].bits & ~kLowMask;
    const TreeRefRec& first = trefs_[ti_];
    while (ti_ < trefs_.size() && (trefs_[ti_].bits & ~kLowMask) == bytenr) ++ti_;
    while (bi_ < blocks_.size() && (blocks_[bi_].bits & ~kLowMask) < bytenr) ++bi_;
    std::string what = "tree block " + N(bytenr);
    if (bi_ < blocks_.size() && (blocks_[bi_].bits & ~kLowMask) == bytenr) {
      what += " (" + TreeLabel(blocks_[bi_].owner) + ", level " + N(blocks_[bi_].bits & kLevelMask) + ")";
    }
    what += (first.bits & 1) ? ", child of " + N(first.who) : ", reached from " + TreeLabel(first.who);
    Error("extent tree: " + what + " has no METADATA_ITEM or EXTENT_ITEM" + inside(bytenr));
  }
  while (bi_ < blocks_.size() && (blocks_[bi_].bits & ~kLowMask) < below) ++bi_;
  while (di_ < data_.size() && data_[di_].disk < below) {
    const DataRefRec& first = data_[di_];
    const size_t b = di_;
    while (di_ < data_.size() && data_[di_].disk == first.disk) ++di_;
    const bool shared = first.len_bits & 2;
    Error("extent tree: data extent " + N(first.disk) + " (" + N(first.len_bits >> 2) + " bytes), used by " +
          (shared ? "leaf " + N(first.who) : TreeLabel(first.who) + " inode " + N(first.ino)) +
          (di_ - b > 1 ? " and " + N(di_ - b - 1) + " more" : "") + ", has no EXTENT_ITEM" + inside(first.disk));
  }
}

std::string TreeRefText(bool shared, uint64_t who) {
  return shared ? "SHARED_BLOCK_REF parent " + N(who) : "TREE_BLOCK_REF root " + ObjectidName(who);
}

void RefTally::CompareTreeBlock(const ExtentRec& e, size_t tb, size_t te, const BlockRec* b) {
  std::string blk = "tree block " + N(e.start);
  if (b != nullptr) {
    blk += " (" + TreeLabel(b->owner) + ", level " + N(b->bits & kLevelMask) + ")";
  } else if (tb != te) {
    blk += " (unreadable)";
  }
  const std::string item = "extent tree: " + KeyToString(e.key) + " for " + blk;
  if (tb == te) {
    std::string owner;
    for (const auto& r : e.decl) {
      if (r.type == kTreeBlockRefKey) owner = ", root " + ObjectidName(r.a);
    }
    Error("extent tree: " + KeyToString(e.key) + ": tree block extent with refs " + N(e.refs) + owner +
          ", but no tree references block " + N(e.start));
    return;
  }
  // The extent's backrefs as (shared, who), each once.
  std::vector<std::pair<bool, uint64_t>> decl;
  for (const auto& r : e.decl) {
    if (r.type != kTreeBlockRefKey && r.type != kSharedBlockRefKey) {
      Error(item + ": carries a data backref (" + KeyTypeName(r.type) + ")");
      continue;
    }
    const std::pair<bool, uint64_t> f{r.type == kSharedBlockRefKey, r.a};
    if (std::find(decl.begin(), decl.end(), f) != decl.end()) {
      Error(item + ": " + TreeRefText(f.first, f.second) + " listed twice");
      continue;
    }
    decl.push_back(f);
  }
  bool owner_ref = false;
  for (size_t i = tb; i < te; ++i) {
    const std::pair<bool, uint64_t> f{(trefs_[i].bits & 1) != 0, trefs_[i].who};
    if (b != nullptr && !f.first && f.second == b->owner) owner_ref = true;
    if (i > tb && trefs_[i].bits == trefs_[i - 1].bits && trefs_[i].who == trefs_[i - 1].who) continue;
    if (std::find(decl.begin(), decl.end(), f) == decl.end()) {
      Error(item + ": no " + TreeRefText(f.first, f.second) + ", though " +
            (f.first ? "block " + N(f.second) + " points to it" : ObjectidName(f.second) + " reaches it"));
    }
  }
  for (const auto& f : decl) {
    bool found = false;
    for (size_t i = tb; i < te && !found; ++i) found = ((trefs_[i].bits & 1) != 0) == f.first && trefs_[i].who == f.second;
    if (!found) Error(item + ": " + TreeRefText(f.first, f.second) + ", but no such reference to the block exists");
  }
  if (e.refs != te - tb) Error(item + ": refs " + N(e.refs) + ", but " + N(te - tb) + " reference(s) found");
  if (b == nullptr) return;
  const int level = static_cast<int>(b->bits & kLevelMask);
  if (e.level != level) {
    Error(item + ": level " + N(static_cast<uint64_t>(e.level)) + " in the extent tree, the block is level " +
          N(static_cast<uint64_t>(level)));
  }
  const bool full = b->bits & kFullBit;
  if (!(b->bits & kReportedBit) && ((e.flags & kBlockFlagFullBackref) != 0) != full) {
    Error(item + ": FULL_BACKREF flag " + ((e.flags & kBlockFlagFullBackref) ? "set" : "clear") +
          ", but its references say otherwise");
  }
  if (!full && !owner_ref && !owner_reached_.Test(e.start)) {
    Error(item + ": owner " + ObjectidName(b->owner) + " neither refers to the block nor reaches it");
  }
}

void RefTally::CompareData(const ExtentRec& e, size_t db, size_t de) {
  const std::string item = "extent tree: data extent " + KeyToString(e.key);
  if (db == de) {
    Error(item + ": refs " + N(e.refs) + ", but no file extent item points to it");
    return;
  }
  // (shared, who, ino, offset) -> count, as declared.
  using RefKey = std::tuple<bool, uint64_t, uint64_t, uint64_t>;
  std::map<RefKey, uint64_t> decl;
  for (const auto& r : e.decl) {
    RefKey key;
    if (r.type == kExtentDataRefKey) {
      key = RefKey{false, r.a, r.ino, r.offset};
    } else if (r.type == kSharedDataRefKey) {
      key = RefKey{true, r.a, 0, 0};
    } else {
      Error(item + ": carries a tree block backref (" + KeyTypeName(r.type) + ")");
      continue;
    }
    if (decl.count(key)) Error(item + ": " + KeyTypeName(r.type) + " listed twice");
    decl[key] += r.count;
  }
  auto text = [](const RefKey& k) {
    return std::get<0>(k) ? "SHARED_DATA_REF parent " + N(std::get<1>(k))
                          : "EXTENT_DATA_REF root " + ObjectidName(std::get<1>(k)) + " inode " + N(std::get<2>(k)) +
                                " offset " + N(std::get<3>(k));
  };
  size_t matched = 0;
  bool size_mismatch = false;
  const DataRefRec* odd = nullptr;
  for (size_t i = db; i < de;) {
    const DataRefRec& r = data_[i];
    const RefKey k{(r.len_bits & 2) != 0, r.who, r.ino, r.offset};
    size_t j = i;
    while (j < de && data_[j].who == r.who && data_[j].ino == r.ino && data_[j].offset == r.offset &&
           (data_[j].len_bits & 2) == (r.len_bits & 2)) {
      if ((data_[j].len_bits >> 2) != e.len && !size_mismatch) {
        size_mismatch = true;
        odd = &data_[j];
      }
      ++j;
    }
    const uint64_t n = j - i;
    auto d = decl.find(k);
    if (d == decl.end()) {
      Error(item + ": no " + text(k) + ", though " + N(n) + " file extent item(s) use it that way");
    } else {
      ++matched;
      if (d->second != n) Error(item + ": " + text(k) + " count " + N(d->second) + ", but " + N(n) + " file extent item(s) found");
      d->second = UINT64_MAX;  // seen
    }
    i = j;
  }
  if (matched != decl.size()) {
    for (const auto& [k, n] : decl) {
      if (n != UINT64_MAX) Error(item + ": " + text(k) + " count " + N(n) + ", but no such file extent item");
    }
  }
  if (e.refs != de - db) Error(item + ": refs " + N(e.refs) + ", but " + N(de - db) + " file extent item(s) point to it");
  if (size_mismatch) {
    const bool shared = odd->len_bits & 2;
    Error(item + ": file extent items give disk_num_bytes " + N(odd->len_bits >> 2) + " (e.g. " +
          (shared ? "in leaf " + N(odd->who) : TreeLabel(odd->who) + " inode " + N(odd->ino)) + "), the extent is " +
          N(e.len) + " bytes");
  }
}

bool RefTally::HasRegularRef(uint64_t disk) const {
  auto it = std::lower_bound(data_.begin(), data_.end(), disk, [](const DataRefRec& r, uint64_t d) { return r.disk < d; });
  for (; it != data_.end() && it->disk == disk; ++it) {
    if (it->len_bits & 1) return true;
  }
  return false;
}

}  // namespace ubtrfs::check
