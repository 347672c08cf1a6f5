// `ubtrfs stats`: the statistics of a live mount (its counters and latency
// histograms, read through a virtual xattr on the mount's root), or, for an
// image file, the shape of its trees (levels, blocks, items, leaf fill) --
// what a researcher wants to see of batching and splits.
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "ubtrfs/devices.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "fuse/adapter.h"
#include "tree/block_reader.h"
#include "tree/cursor.h"
#include "txn/volume.h"
#include "io/block_device.h"
#include "io/offset_device.h"

namespace ubtrfs::cli {
namespace {

struct TreeShape {
  int levels = 0;
  uint64_t nodes = 0, leaves = 0, items = 0, leaf_bytes_used = 0, leaf_bytes = 0;
};

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

int ImageStats(const std::string& image, bool json) {
  auto dev = OpenImageDevices(image);
  if (!dev.ok()) {
    std::cerr << "ubtrfs stats: " << dev.status().ToString() << "\n";
    return 8;
  }
  auto vol = txn::Volume::Open(std::move(*dev), txn::VolumeOptions{});
  if (!vol.ok()) {
    std::cerr << "ubtrfs stats: " << vol.status().ToString() << "\n";
    return 8;
  }
  std::map<uint64_t, tree::RootPtr> trees;
  trees[format::kRootTreeObjectid] = (*vol)->root_tree();
  trees[format::kChunkTreeObjectid] = (*vol)->chunk_tree();
  {
    tree::Cursor c((*vol)->source(), (*vol)->root_tree());
    Status st = c.Seek(format::Key{0, 0, 0});
    for (; st.ok() && c.Valid(); st = c.Next()) {
      const format::Key k = c.key();
      if (k.type != format::kRootItemKey || c.data().size() < sizeof(format::RootItem)) continue;
      const auto* ri = reinterpret_cast<const format::RootItem*>(c.data().data());
      trees[k.objectid] = tree::RootPtr{ri->bytenr.get(), ri->level, ri->generation.get(), k.objectid};
    }
    if (!st.ok()) {
      std::cerr << "ubtrfs stats: root tree: " << st.ToString() << "\n";
      return 8;
    }
  }
  std::string out = json ? "{\"image\":" + fmt::format("\"{}\"", image) + ",\"trees\":[" : "";
  if (!json) out += fmt::format("{:>22} {:>6} {:>9} {:>9} {:>11} {:>10}\n", "tree", "levels", "nodes", "leaves", "items", "leaf fill");
  bool first = true;
  for (const auto& [id, root] : trees) {
    TreeShape t;
    t.levels = root.level + 1;
    Status st = Walk((*vol)->source(), root.bytenr, root.level, &t, 0);
    if (!st.ok()) {
      std::cerr << "ubtrfs stats: tree " << id << ": " << st.ToString() << "\n";
      return 1;
    }
    const double fill = t.leaf_bytes ? 100.0 * double(t.leaf_bytes_used) / double(t.leaf_bytes) : 0.0;
    if (json) {
      out += fmt::format("{}{{\"tree\":{},\"levels\":{},\"nodes\":{},\"leaves\":{},\"items\":{},\"leaf_fill_pct\":{:.1f}}}",
                         first ? "" : ",", id, t.levels, t.nodes, t.leaves, t.items, fill);
    } else {
      out += fmt::format("{:>22} {:>6} {:>9} {:>9} {:>11} {:>9.1f}%\n", format::ObjectidName(id), t.levels, t.nodes,
                         t.leaves, t.items, fill);
    }
    first = false;
  }
  if (json) out += "]}\n";
  std::cout << out;
  return 0;
}

int MountStats(const std::string& mnt, bool json) {
  const std::string name = std::string(json ? fuse::kStatsXattr : fuse::kStatsTextXattr);
  ssize_t n = ::getxattr(mnt.c_str(), name.c_str(), nullptr, 0);
  std::string buf;
  while (n >= 0) {
    buf.resize(static_cast<size_t>(n) + 4096);
    n = ::getxattr(mnt.c_str(), name.c_str(), buf.data(), buf.size());
    if (n >= 0) {
      buf.resize(static_cast<size_t>(n));
      break;
    }
    if (errno != ERANGE) break;
    n = ::getxattr(mnt.c_str(), name.c_str(), nullptr, 0);
  }
  if (n < 0) {
    std::cerr << "ubtrfs stats: " << mnt << " is not a ubtrfs mount (getxattr " << name << ": " << std::strerror(errno)
              << ")\n";
    return 8;
  }
  std::cout << buf << (json ? "\n" : "");
  return 0;
}

}  // namespace

void RegisterStats(CLI::App& app) {
  auto* cmd = app.add_subcommand("stats", "Live statistics of a mount, or tree shapes of an image");
  static std::string target;
  static bool json = false;
  cmd->add_option("TARGET", target, "a ubtrfs mount point, or an image (file or rbd:POOL/IMAGE)")->required();
  cmd->add_flag("--json", json, "print JSON");
  cmd->callback([] {
    if (target.starts_with("rbd:")) return SetExitCode(ImageStats(target, json));
    struct stat st;
    // IMG1,IMG2,...: the first device decides whether this is an image.
    // (Only commas name no device: the stat of the whole name reports it.)
    const std::vector<std::string> devices = SplitDeviceList(target);
    const std::string first = devices.empty() ? target : devices.front();
    if (::stat(first.c_str(), &st) != 0) {
      std::cerr << "ubtrfs stats: " << target << ": " << std::strerror(errno) << "\n";
      SetExitCode(8);
      return;
    }
    SetExitCode(S_ISDIR(st.st_mode) ? MountStats(target, json) : ImageStats(target, json));
  });
}

}  // namespace ubtrfs::cli
