// Which files hold a logical address (ubtrfs/inspect.h ResolveLogical), as
// the kernel's LOGICAL_INO answers `btrfs inspect-internal logical-resolve`
// on a mounted filesystem -- here offline, on an image.
//
// The data extent holding the address names its referrers in its back
// references: an EXTENT_DATA_REF (tree, inode, offset) is looked up in that
// tree, a SHARED_DATA_REF names the leaf itself. Each leaf found is then
// scanned for every file extent item pointing into the extent. A leaf may
// be shared by snapshots that its back references do not name (a snapshot
// shares its source's blocks from the root down); rather than walking tree
// block back references up, every subvolume's tree is searched for the
// leaf's first key: a tree holds the leaf exactly when that search ends in
// it, since a key is in one leaf of a tree.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "format/key.h"
#include "format/ondisk.h"
#include "inspect/inode_paths.h"
#include "inspect/logical_resolve.h"
#include "inspect/open_volume.h"
#include "tree/cursor.h"
#include "txn/extent_refs.h"
#include "txn/volume.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs {
namespace {

using format::Key;

// Trees that hold file extent items: the top level, every subvolume and
// snapshot, and the data relocation tree of an interrupted balance.
bool HoldsFiles(uint64_t id) {
  return id == format::kFsTreeObjectid || id == format::kDataRelocTreeObjectid ||
         (id >= format::kFirstFreeObjectid && id <= format::kLastFreeObjectid);
}

struct Extent {
  uint64_t bytenr = 0, bytes = 0;
  bool tree_block = false;
  uint64_t owner = 0;  // a tree block's tree, where its refs say
  std::vector<txn::InlineRef> refs;  // inline and keyed, data refs only
};

// The extent item covering `logical`, with its data back references.
Result<Extent> FindExtent(txn::Volume& vol, uint64_t logical) {
  UB_ASSIGN_OR_RETURN(auto extent_root, vol.FindRoot(format::kExtentTreeObjectid));
  tree::Cursor c(vol.source(), extent_root.ref);
  UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{logical, 0xff, ~0ull}).WithContext("extent tree"));
  Extent e;
  bool found = false;
  // Back over the keyed refs of the extent that starts at or before the
  // address (and block group items of the older layout) to its item.
  for (; c.Valid(); ) {
    const Key k = c.key();
    if (k.type == format::kExtentItemKey || k.type == format::kMetadataItemKey) {
      const uint64_t len = k.type == format::kMetadataItemKey ? vol.nodesize() : k.offset;
      if (logical >= k.objectid && logical - k.objectid < len) {
        e.bytenr = k.objectid;
        e.bytes = len;
        found = true;
      }
      break;
    }
    UB_RETURN_IF_ERROR(c.Prev().WithContext("extent tree"));
  }
  if (!found) return Status::NotFound("no extent holds logical address " + std::to_string(logical));
  auto d = c.data();
  if (d.size() < sizeof(format::ExtentItem)) {
    return Status::Corrupt("extent tree: " + format::KeyToString(c.key()) + ": item too short");
  }
  format::ExtentItem ei;
  std::memcpy(&ei, d.data(), sizeof(ei));
  e.tree_block = (ei.flags.get() & format::kExtentFlagTreeBlock) != 0 || c.key().type == format::kMetadataItemKey;
  const std::vector<uint8_t> item(d.begin(), d.end());
  size_t refs_start = sizeof(format::ExtentItem);
  if (e.tree_block && c.key().type == format::kExtentItemKey) refs_start += sizeof(format::TreeBlockInfo);
  UB_ASSIGN_OR_RETURN(auto inline_refs, txn::ParseInlineRefs(item, refs_start, c.key()));
  for (const auto& r : inline_refs) {
    if (r.type == format::kTreeBlockRefKey && e.owner == 0) e.owner = r.offset;
    if (r.type == format::kExtentDataRefKey || r.type == format::kSharedDataRefKey) e.refs.push_back(r);
  }
  if (e.tree_block) return e;
  Status st = c.Next();
  for (; st.ok() && c.Valid(); st = c.Next()) {
    const Key k = c.key();
    if (k.objectid != e.bytenr) break;
    auto kd = c.data();
    txn::InlineRef r;
    r.type = k.type;
    if (k.type == format::kExtentDataRefKey && kd.size() >= sizeof(format::ExtentDataRef)) {
      format::ExtentDataRef dr;
      std::memcpy(&dr, kd.data(), sizeof(dr));
      r.root = dr.root.get();
      r.objectid = dr.objectid.get();
      r.data_offset = dr.offset.get();
      r.count = dr.count.get();
    } else if (k.type == format::kSharedDataRefKey && kd.size() >= sizeof(format::SharedDataRef)) {
      format::SharedDataRef sr;
      std::memcpy(&sr, kd.data(), sizeof(sr));
      r.offset = k.offset;
      r.count = sr.count.get();
    } else if (k.type == format::kExtentDataRefKey || k.type == format::kSharedDataRefKey) {
      return Status::Corrupt("extent tree: " + format::KeyToString(k) + ": item too short");
    } else {
      continue;
    }
    e.refs.push_back(r);
  }
  UB_RETURN_IF_ERROR(st.WithContext("extent tree"));
  return e;
}

class Resolver {
 public:
  Resolver(txn::Volume* vol, const LogicalResolveOptions& o, LogicalResolution* out)
      : vol_(vol), o_(o), out_(out), paths_(vol) {}

  Status Run(uint64_t logical) {
    auto found = FindExtent(*vol_, logical);
    // An extent tree that does not read there (EUCLEAN, EIO): every file
    // tree is searched for items covering the address instead.
    if (!found.ok() && found.status().code() != ENOENT && found.status().code() != EINVAL) {
      out_->warnings.push_back("the extent tree does not read at " + std::to_string(logical) + " (" +
                               found.status().message() + "): every file tree searched instead");
      return ScanAllTrees(logical);
    }
    UB_ASSIGN_OR_RETURN(Extent e, std::move(found));
    out_->extent = e.bytenr;
    out_->extent_bytes = e.bytes;
    if (e.tree_block) {
      return Status::Invalid("logical address " + std::to_string(logical) + " is in tree block " + std::to_string(e.bytenr) +
                             (e.owner ? " of tree " + std::to_string(e.owner) : std::string()) +
                             ", not in file data");
    }
    extent_ = e.bytenr;
    pos_ = logical - e.bytenr;
    UB_RETURN_IF_ERROR(LoadRoots());
    for (const auto& r : e.refs) {
      if (r.type == format::kSharedDataRefKey) {
        leaves_.insert(r.offset);
      } else {
        FindLeaves(r);
      }
    }
    for (uint64_t leaf : leaves_) ScanLeaf(leaf);
    Finish();
    return Status::Ok();
  }

 private:
  // Without the extent tree: every file extent item of every file tree
  // whose disk extent holds the address (a leaf that snapshots share is
  // read once per tree).
  Status ScanAllTrees(uint64_t logical) {
    UB_RETURN_IF_ERROR(LoadRoots());
    for (const auto& [id, root] : roots_) {
      tree::Cursor c(vol_->source(), root);
      Status st = c.SeekFirst();
      for (; st.ok() && c.Valid(); st = c.Next()) {
        const Key k = c.key();
        if (k.type != format::kExtentDataKey) continue;
        const auto* fe = txn::DataExtentItem(c.data());
        if (!fe || logical < fe->disk_bytenr.get() ||
            logical - fe->disk_bytenr.get() >= fe->disk_num_bytes.get()) {
          continue;
        }
        extent_ = fe->disk_bytenr.get();
        pos_ = logical - extent_;
        if (auto off = Covers(k, *fe)) {
          if (seen_.insert({id, k.objectid, *off}).second) out_->refs.push_back(LogicalRef{id, k.objectid, *off, {}});
        }
      }
      if (!st.ok()) out_->errors.push_back("tree " + std::to_string(id) + ": " + st.message());
    }
    out_->extent = extent_;
    Finish();
    return Status::Ok();
  }

  // The file offset at which item (k, fe) of the extent holds the address,
  // or nullopt when it does not reach it. As the kernel: a compressed
  // extent is referenced as a whole, so every item pointing into it counts,
  // at the item's own offset.
  std::optional<uint64_t> Covers(const Key& k, const format::FileExtentItem& fe) const {
    if (o_.ignore_offset || fe.compression != 0 || fe.encryption != 0 || fe.other_encoding.get() != 0) {
      return k.offset;
    }
    const uint64_t start = fe.offset.get(), len = fe.num_bytes.get();
    if (pos_ < start || pos_ - start >= len) return std::nullopt;
    return k.offset + (pos_ - start);
  }

  void Finish() {
    std::sort(out_->refs.begin(), out_->refs.end(), [](const LogicalRef& a, const LogicalRef& b) {
      return std::tie(a.root, a.inode, a.offset) < std::tie(b.root, b.inode, b.offset);
    });
    if (o_.paths) {
      for (auto& ref : out_->refs) {
        auto p = paths_.InodePaths(ref.root, ref.inode);
        if (p.ok()) {
          ref.paths = std::move(*p);
        } else {
          out_->errors.push_back("inode " + std::to_string(ref.inode) + " of tree " + std::to_string(ref.root) +
                                 ": " + p.status().message());
        }
      }
    }
  }

  Status LoadRoots() {
    tree::Cursor c(vol_->source(), vol_->root_tree());
    Status st = c.SeekFirst();
    for (; st.ok() && c.Valid(); st = c.Next()) {
      const Key k = c.key();
      if (k.type != format::kRootItemKey || !HoldsFiles(k.objectid)) continue;
      auto r = paths_.Root(k.objectid);
      if (r.ok()) roots_[k.objectid] = *r;  // a dead tree (being dropped) is left out
    }
    return st.WithContext("root tree");
  }

  // An EXTENT_DATA_REF: the leaves of its tree holding its `count` file
  // extent items (inode, offset - extent offset == ref offset), found from
  // the ref's offset on, as the kernel looks them up.
  void FindLeaves(const txn::InlineRef& r) {
    auto root = roots_.find(r.root);
    if (root == roots_.end()) {
      out_->errors.push_back("extent " + std::to_string(extent_) + ": a reference from tree " + std::to_string(r.root) +
                             ", which is not there");
      return;
    }
    tree::Cursor c(vol_->source(), root->second);
    uint32_t found = 0;
    // A clone to a file offset below the extent offset it takes makes the
    // ref's offset (key offset - extent offset) wrap around; the items are
    // then looked for from the file's start, as the kernel does.
    const uint64_t from = r.data_offset >= (uint64_t{1} << 63) ? 0 : r.data_offset;
    Status st = c.Seek(Key{r.objectid, format::kExtentDataKey, from});
    for (; st.ok() && c.Valid() && found < r.count; st = c.Next()) {
      const Key k = c.key();
      if (k.objectid != r.objectid || k.type != format::kExtentDataKey) break;
      const auto* fe = txn::DataExtentItem(c.data());
      if (!fe || fe->disk_bytenr.get() != extent_ || k.offset - fe->offset.get() != r.data_offset) continue;
      leaves_.insert(c.leaf().bytenr());
      ++found;
    }
    if (!st.ok()) {
      out_->errors.push_back("tree " + std::to_string(r.root) + ": " + st.message());
    } else if (found < r.count) {
      out_->errors.push_back("extent " + std::to_string(extent_) + ": tree " + std::to_string(r.root) + " has " +
                             std::to_string(found) + " of the " + std::to_string(r.count) +
                             " references of inode " + std::to_string(r.objectid) + " its back reference counts");
    }
  }

  void ScanLeaf(uint64_t bytenr) {
    auto b = vol_->source()->Read(tree::BlockCheck{bytenr, 0, 0, {}});
    if (!b.ok()) {
      out_->errors.push_back(b.status().message());
      return;
    }
    const tree::TreeBlock& leaf = **b;
    std::vector<std::pair<uint64_t, uint64_t>> hits;  // (inode, file offset)
    txn::ForEachDataExtent(leaf, [&](const Key& k, const format::FileExtentItem& fe) {
      if (fe.disk_bytenr.get() != extent_) return;
      if (auto offset = Covers(k, fe)) hits.emplace_back(k.objectid, *offset);
    });
    if (hits.empty() || leaf.nritems() == 0) return;
    const Key first = leaf.key(0);
    for (const auto& [id, root] : roots_) {
      tree::Cursor c(vol_->source(), root);
      Status st = c.Seek(first);
      if (!st.ok()) {
        out_->errors.push_back("tree " + std::to_string(id) + ": " + st.message());
        continue;
      }
      if (!c.Valid() || c.leaf().bytenr() != bytenr) continue;
      for (const auto& [ino, off] : hits) {
        if (seen_.insert({id, ino, off}).second) out_->refs.push_back(LogicalRef{id, ino, off, {}});
      }
    }
  }

  txn::Volume* vol_;
  const LogicalResolveOptions& o_;
  LogicalResolution* out_;
  inspect::PathResolver paths_;
  std::map<uint64_t, tree::RootPtr> roots_;
  std::set<uint64_t> leaves_;
  std::set<std::tuple<uint64_t, uint64_t, uint64_t>> seen_;
  uint64_t extent_ = 0, pos_ = 0;
};

}  // namespace

Status inspect::ResolveLogicalIn(txn::Volume* vol, uint64_t logical, const LogicalResolveOptions& options,
                                 LogicalResolution* out) {
  Resolver r(vol, options, out);
  return r.Run(logical);
}

Result<LogicalResolution> ResolveLogical(const std::string& image, const OpenOptions& where, uint64_t logical,
                                         const LogicalResolveOptions& options) {
  UB_ASSIGN_OR_RETURN(auto vol, inspect::OpenVolume(image, where, {}));
  LogicalResolution out;
  out.warnings = vol->warnings();
  UB_RETURN_IF_ERROR(inspect::ResolveLogicalIn(vol.get(), logical, options, &out).WithContext(image));
  return out;
}

Result<std::vector<std::string>> ResolveInode(const std::string& image, const OpenOptions& where, uint64_t subvolid,
                                              uint64_t ino) {
  UB_ASSIGN_OR_RETURN(auto vol, inspect::OpenVolume(image, where, {}));
  inspect::PathResolver paths(vol.get());
  auto r = paths.InodePaths(subvolid, ino);
  if (!r.ok()) return r.status().WithContext(image);
  return r;
}

Result<std::string> ResolveSubvolume(const std::string& image, const OpenOptions& where, uint64_t subvolid) {
  if (!HoldsFiles(subvolid)) return Status::Invalid(image + ": " + std::to_string(subvolid) + " is no subvolume id");
  UB_ASSIGN_OR_RETURN(auto vol, inspect::OpenVolume(image, where, {}));
  inspect::PathResolver paths(vol.get());
  UB_RETURN_IF_ERROR(paths.Root(subvolid).status().WithContext(image));
  auto r = paths.SubvolPath(subvolid);
  if (!r.ok()) return r.status().WithContext(image);
  return r;
}

}  // namespace ubtrfs
