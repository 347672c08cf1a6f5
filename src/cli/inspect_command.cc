// inspect logical-resolve | inode-resolve | subvolid-resolve | find-root |
// dump-super (ubtrfs/inspect.h), on an image with no mount and no root:
// which files hold a logical address, the paths of an inode or a
// subvolume (as btrfs inspect-internal answers them on a mounted
// filesystem), the roots of older commits (as btrfs-find-root lists them),
// every field of a superblock copy (as btrfs inspect-internal dump-super
// prints it). Paths are printed from the top level with a leading '/'.
// Exit 1 when the answer is missing or partial (a block on the way did not
// read).
#include <fmt/core.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/text.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs::cli {
namespace {

struct Options {
  std::string image;
  uint64_t logical = 0;
  uint64_t ino = 0;
  uint64_t subvolid = 5;
  bool inodes_only = false;
  bool ignore_offset = false;
  std::string tree = "root";
  DumpSuperOptions super;
};

OpenOptions Where() {
  OpenOptions where;
  PlacementInto(&where);
  return where;
}

void Fail(const std::string& verb, const Status& st) {
  fmt::print(stderr, "ubtrfs: inspect {}: {}\n", verb, st.ToString());
  HintRescue(st);
  SetExitCode(1);
}

void CmdLogicalResolve(const Options& o) {
  LogicalResolveOptions lo;
  lo.ignore_offset = o.ignore_offset;
  lo.paths = !o.inodes_only;
  auto r = ResolveLogical(o.image, Where(), o.logical, lo);
  if (!r.ok()) return Fail("logical-resolve", r.status());
  for (const auto& w : r->warnings) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", o.image, w);
  for (const auto& ref : r->refs) {
    if (o.inodes_only) {
      fmt::print("inode {} offset {} root {}\n", ref.inode, ref.offset, ref.root);
      continue;
    }
    for (const auto& p : ref.paths) fmt::print("/{}\n", Printable(p));
  }
  for (const auto& e : r->errors) fmt::print(stderr, "ubtrfs: inspect logical-resolve: {}: {}\n", o.image, e);
  if (!r->errors.empty()) SetExitCode(1);
}

void CmdInodeResolve(const Options& o) {
  auto r = ResolveInode(o.image, Where(), o.subvolid, o.ino);
  if (!r.ok()) return Fail("inode-resolve", r.status());
  for (const auto& p : *r) fmt::print("/{}\n", Printable(p));
}

void CmdSubvolidResolve(const Options& o) {
  auto r = ResolveSubvolume(o.image, Where(), o.subvolid);
  if (!r.ok()) return Fail("subvolid-resolve", r.status());
  fmt::print("/{}\n", Printable(*r));
}

void CmdFindRoot(const Options& o) {
  FindRootOptions fo;
  auto tree = ParseTreeName(o.tree);
  if (!tree) {
    fmt::print(stderr, "ubtrfs: inspect find-root: unknown tree '{}' (a number or root, extent, fs, chunk, ...)\n",
               o.tree);
    return SetExitCode(2);
  }
  fo.tree = *tree;
  auto r = FindRoots(o.image, Where(), fo);
  if (!r.ok()) return Fail("find-root", r.status());
  for (const auto& w : r->warnings) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", o.image, w);
  if (r->super_root.bytenr) {
    fmt::print("superblock: generation {}, root at {} (generation {}, level {})\n", r->generation,
               r->super_root.bytenr, r->super_root.generation, r->super_root.level);
  }
  for (const auto& c : r->roots) {
    fmt::print("generation {}: root at {} level {}{}\n", c.generation, c.bytenr, c.level,
               c == r->super_root ? " (the superblock's)" : "");
  }
  fmt::print(stderr, "ubtrfs: inspect find-root: {} chunk(s), {} bytes read, {} block(s) of tree {} found\n",
             r->chunks_scanned, r->bytes_scanned, r->blocks_found, fo.tree);
  if (r->roots.empty()) SetExitCode(1);
}

void CmdDumpSuper(const Options& o) {
  auto r = DumpSuper(o.image, Where(), o.super, stdout);
  if (!r.ok()) return Fail("dump-super", r.status());
  for (const auto& m : r->missing) fmt::print(stderr, "ubtrfs: inspect dump-super: {}\n", m);
  for (const auto& e : r->errors) fmt::print(stderr, "ubtrfs: inspect dump-super: {}: {}\n", o.image, e);
  if (!r->errors.empty()) SetExitCode(1);
}

}  // namespace

void RegisterInspect(CLI::App& app) {
  static Options opts;
  auto* in = app.add_subcommand("inspect", "Which files hold a logical address, the paths of an inode or a "
                                           "subvolume (as btrfs inspect-internal, on an image)");
  in->require_subcommand(1);
  auto* lr = in->add_subcommand("logical-resolve", "Print the path of every file whose data is at LOGICAL "
                                                   "(every reference, in every snapshot)");
  lr->add_flag("-P", opts.inodes_only, "Print \"inode I offset O root R\" instead of paths");
  lr->add_flag("-o", opts.ignore_offset,
               "Every reference to the extent holding LOGICAL, not only those to that block");
  lr->add_option("image", opts.image, "Image file or block device")->required();
  lr->add_option("logical", opts.logical, "A logical address (bytes, as dump-tree and filefrag on btrfs show "
                                          "them)")
      ->required();
  lr->callback([] { CmdLogicalResolve(opts); });
  auto* ir = in->add_subcommand("inode-resolve", "Print every path of inode INO (one per hard link)");
  ir->add_option("--subvolid", opts.subvolid, "The subvolume holding the inode (5: the top level, the default)");
  ir->add_option("image", opts.image, "Image file or block device")->required();
  ir->add_option("ino", opts.ino, "Inode number")->required();
  ir->callback([] { CmdInodeResolve(opts); });
  auto* sr = in->add_subcommand("subvolid-resolve", "Print the path of the subvolume with id ID");
  sr->add_option("image", opts.image, "Image file or block device")->required();
  sr->add_option("id", opts.subvolid, "Subvolume id")->required();
  sr->callback([] { CmdSubvolidResolve(opts); });
  auto* fr = in->add_subcommand("find-root", "List the roots of older commits still on disk, newest first (as "
                                             "btrfs-find-root; read one with --tree-root)");
  fr->add_option("-o,--tree", opts.tree, "Roots of this tree: an id or a name (root, the default; extent, fs, "
                                         "chunk, ...)");
  fr->add_option("image", opts.image, "Image file or block device")->required();
  fr->callback([] { CmdFindRoot(opts); });
  auto* ds = in->add_subcommand("dump-super", "Print every field of a superblock copy, as btrfs inspect-internal "
                                              "dump-super (from its bytes alone)");
  ds->add_flag("-f,--full", opts.super.full, "Also the system chunk array and the backup roots");
  ds->add_flag("-a,--all", opts.super.all, "Every copy the device is large enough to have");
  ds->add_option("-s,--super", opts.super.mirror, "The copy: 0 (64 KiB, the default), 1 (64 MiB), 2 (256 GiB)");
  ds->add_flag("-F,--force", opts.super.force, "Also a copy without the btrfs magic");
  ds->add_option("image", opts.image, "Image file or block device (IMG1,IMG2,... for several)")->required();
  ds->callback([] { CmdDumpSuper(opts); });
  for (auto* sub : {lr, ir, sr, fr, ds}) sub->fallthrough();  // --offset, --rescue and the like after the verb
}

}  // namespace ubtrfs::cli
