// The shape of every tree of an image (ubtrfs/inspect.h): levels, nodes,
// leaves, items and how full the leaves are -- what a researcher looks at
// to see batching and splits (`ubtrfs stats IMAGE`).
#include <map>
#include <string>
#include <vector>

#include "format/key.h"
#include "format/ondisk.h"
#include "tree/block_reader.h"
#include "tree/cursor.h"
#include "txn/devices.h"
#include "txn/volume.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs {
namespace {

Status Walk(tree::BlockSource* src, uint64_t bytenr, int level, TreeShape* t, int depth) {
  if (depth > format::kMaxLevel) return Status::Corrupt("tree deeper than " + std::to_string(format::kMaxLevel));
  UB_ASSIGN_OR_RETURN(auto b, src->Read(tree::BlockCheck{bytenr, level, 0, {}}));
  if (b->is_leaf()) {
    ++t->leaves;
    t->items += b->nritems();
    t->leaf_bytes += b->LeafSpace();
    t->leaf_bytes_used += b->LeafSpace() - b->LeafFreeSpace();
    return Status::Ok();
  }
  ++t->nodes;
  for (int i = 0; i < b->nritems(); ++i) {
    UB_RETURN_IF_ERROR(Walk(src, b->child_bytenr(i), b->level() - 1, t, depth + 1));
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<TreeShape>> TreeShapes(const std::string& image, const OpenOptions& where) {
  UB_ASSIGN_OR_RETURN(auto devs,
                      txn::OpenDevices(txn::DeviceSpec::Of(image, where.offset, where.partition, where.scan_dirs)));
  UB_ASSIGN_OR_RETURN(auto vol, txn::Volume::Open(std::move(devs), txn::VolumeOptions{}));
  std::map<uint64_t, tree::RootPtr> trees;
  trees[format::kRootTreeObjectid] = vol->root_tree();
  trees[format::kChunkTreeObjectid] = vol->chunk_tree();
  {
    tree::Cursor c(vol->source(), vol->root_tree());
    Status st = c.Seek(format::Key{0, 0, 0});
    for (; st.ok() && c.Valid(); st = c.Next()) {
      const format::Key k = c.key();
      if (k.type != format::kRootItemKey || c.data().size() < sizeof(format::RootItem)) continue;
      const auto* ri = reinterpret_cast<const format::RootItem*>(c.data().data());
      trees[k.objectid] = tree::RootPtr{ri->bytenr.get(), ri->level, ri->generation.get(), k.objectid};
    }
    UB_RETURN_IF_ERROR(st.WithContext("root tree"));
  }
  std::vector<TreeShape> shapes;
  for (const auto& [id, root] : trees) {
    TreeShape& t = shapes.emplace_back();
    t.tree = id;
    t.name = format::ObjectidName(id);
    t.levels = root.level + 1;
    if (Status st = Walk(vol->source(), root.bytenr, root.level, &t, 0); !st.ok()) t.error = st.ToString();
  }
  return shapes;
}

}  // namespace ubtrfs
