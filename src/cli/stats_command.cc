// `ubtrfs stats`: the statistics of a live mount (its counters and latency
// histograms, read through a virtual xattr on the mount's root), or, for an
// image file, the shape of its trees (levels, blocks, items, leaf fill) --
// what a researcher wants to see of batching and splits.
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "fuse/adapter.h"
#include "ubtrfs/devices.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs::cli {
namespace {

int ImageStats(const std::string& image, bool json) {
  OpenOptions where;
  PlacementInto(&where);
  auto shapes = TreeShapes(image, where);
  if (!shapes.ok()) {
    std::cerr << "ubtrfs stats: " << shapes.status().ToString() << "\n";
    return 8;
  }
  std::string out = json ? "{\"image\":" + fmt::format("\"{}\"", image) + ",\"trees\":[" : "";
  if (!json) out += fmt::format("{:>22} {:>6} {:>9} {:>9} {:>11} {:>10}\n", "tree", "levels", "nodes", "leaves", "items", "leaf fill");
  bool first = true;
  int rc = 0;
  for (const TreeShape& t : *shapes) {
    if (!t.error.empty()) {
      std::cerr << "ubtrfs stats: tree " << t.tree << ": " << t.error << "\n";
      rc = 1;
      continue;
    }
    const double fill = t.leaf_bytes ? 100.0 * double(t.leaf_bytes_used) / double(t.leaf_bytes) : 0.0;
    if (json) {
      out += fmt::format("{}{{\"tree\":{},\"levels\":{},\"nodes\":{},\"leaves\":{},\"items\":{},\"leaf_fill_pct\":{:.1f}}}",
                         first ? "" : ",", t.tree, t.levels, t.nodes, t.leaves, t.items, fill);
    } else {
      out += fmt::format("{:>22} {:>6} {:>9} {:>9} {:>11} {:>9.1f}%\n", t.name, t.levels, t.nodes, t.leaves, t.items,
                         fill);
    }
    first = false;
  }
  if (json) out += "]}\n";
  std::cout << out;
  return rc;
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
