// dump-tree: every tree block of an image as text (ubtrfs/inspect.h), as
// `btrfs inspect-internal dump-tree`. Exit 1 when a block or an item could
// not be read, or the tree asked for is not there; 2 for an unknown tree.
#include <fmt/core.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs::cli {
namespace {

struct Options {
  std::string image;
  std::string tree;
  std::vector<uint64_t> blocks;
  bool follow = false;
  bool roots_only = false;
};

void CmdDumpTree(const Options& o) {
  DumpTreeOptions d;
  d.blocks = o.blocks;
  d.follow = o.follow;
  d.roots_only = o.roots_only;
  if (!o.tree.empty()) {
    d.tree = ParseTreeName(o.tree);
    if (!d.tree) {
      fmt::print(stderr,
                 "ubtrfs: dump-tree: unknown tree '{}' (use a number or root, chunk, extent, dev, fs, csum, "
                 "quota, uuid, free-space, block-group, data-reloc, log)\n",
                 o.tree);
      SetExitCode(2);
      return;
    }
  }
  OpenOptions where;
  PlacementInto(&where);
  auto r = DumpTree(o.image, where, d, stdout);
  if (!r.ok()) {
    fmt::print(stderr, "ERROR: {}\n", r.status().ToString());  // names the image
    SetExitCode(1);
    return;
  }
  for (const auto& w : r->warnings) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", o.image, w);
  if (r->tree_not_found) {
    fmt::print(stderr, "ubtrfs: dump-tree: tree {} not found (no ROOT_ITEM in the root tree)\n", o.tree);
  }
  if (r->block_errors || r->item_errors) {
    fmt::print(stderr, "ubtrfs: dump-tree: {}: {} unreadable block(s), {} damaged item(s)\n", o.image,
               r->block_errors, r->item_errors);
  }
  if (!r->clean()) SetExitCode(1);
}

}  // namespace

void RegisterDumpTree(CLI::App& app) {
  static Options opts;
  auto* cmd = app.add_subcommand("dump-tree", "Print tree blocks of an image in text form (like btrfs "
                                              "inspect-internal dump-tree)");
  auto* tree = cmd->add_option("-t,--tree", opts.tree,
                               "Print only this tree: an id or a name (root, chunk, extent, dev, fs, csum, quota, "
                               "uuid, free-space, block-group, data-reloc, log)");
  auto* block = cmd->add_option("-b,--block", opts.blocks, "Print only the block at this logical address "
                                                           "(repeatable)")
                    ->expected(1)
                    ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--follow", opts.follow, "With -b: also print every block below it, depth-first")->needs(block);
  auto* roots = cmd->add_flag("-r,--roots", opts.roots_only, "Print only the root of every tree");
  tree->excludes(block);
  roots->excludes(block);
  roots->excludes(tree);
  cmd->add_option("image", opts.image, "Image file or block device")->required();
  cmd->callback([] { CmdDumpTree(opts); });
}

}  // namespace ubtrfs::cli
