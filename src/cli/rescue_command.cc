// rescue zero-log, super-recover, fix-device-size, clear-uuid-tree: offline
// repairs of an image the kernel refuses to mount (ubtrfs/rescue.h), as
// `btrfs rescue`, with its messages where a script may look for them.
#include <fmt/core.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "ubtrfs/rescue.h"

namespace ubtrfs::cli {
namespace {

struct Options {
  std::string image;
  bool yes = false;
  bool verbose = false;
};

void Failed(const char* verb, const Status& st) {
  fmt::print(stderr, "ubtrfs: rescue {}: {}\n", verb, st.ToString());
  SetExitCode(1);
}

void Warn(const Options& o, const std::vector<std::string>& warnings) {
  for (const auto& w : warnings) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", o.image, w);
}

void CmdZeroLog(const Options& o) {
  OpenOptions where;
  PlacementInto(&where);
  auto r = ZeroLog(o.image, where);
  if (!r.ok()) return Failed("zero-log", r.status());
  Warn(o, r->warnings);
  if (r->log_root == 0) {
    fmt::print("No tree log on {}: nothing to clear\n", o.image);
    return;
  }
  fmt::print("Clearing log on {}, previous log_root {}, level {}\n", o.image, r->log_root, r->log_level);
}

void CmdSuperRecover(const Options& o) {
  OpenOptions where;
  PlacementInto(&where);
  auto found = SuperRecover(o.image, where, /*rewrite=*/false);
  if (!found.ok()) return Failed("super-recover", found.status());
  Warn(o, found->warnings);
  for (const SuperCopy& c : found->copies) {
    if (!o.verbose && c.problem.empty()) continue;
    fmt::print("device {} ({}) superblock copy {} at {}: {}\n", c.devid, c.device, c.mirror, c.bytenr,
               c.problem.empty() ? "good, generation " + std::to_string(c.generation) : c.problem);
  }
  if (found->bad == 0) {
    fmt::print("All supers are valid, no need to recover\n");
    return;
  }
  if (!o.yes) {
    fmt::print("Rewrite {} bad superblock cop{} from generation {}? [y/N]: ", found->bad,
               found->bad == 1 ? "y" : "ies", found->generation);
    std::fflush(stdout);
    std::string answer;
    if (!std::getline(std::cin, answer) || (answer != "y" && answer != "Y" && answer != "yes")) {
      fmt::print("Aborted to recover bad superblocks\n");
      SetExitCode(1);
      return;
    }
  }
  auto done = SuperRecover(o.image, where, /*rewrite=*/true);
  if (!done.ok()) return Failed("super-recover", done.status());
  if (done->rewritten) {
    fmt::print("Recovered bad superblocks successful\n");
  } else {
    fmt::print("All supers are valid, no need to recover\n");  // (another process fixed them meanwhile)
  }
}

void CmdFixDeviceSize(const Options& o) {
  OpenOptions where;
  PlacementInto(&where);
  auto r = FixDeviceSize(o.image, where);
  if (!r.ok()) return Failed("fix-device-size", r.status());
  Warn(o, r->warnings);
  for (const DeviceSizeChange& d : r->devices) {
    fmt::print("Fixed device size for devid {}, old size: {} new size: {}\n", d.devid, d.old_bytes, d.new_bytes);
  }
  if (r->old_super_bytes != r->new_super_bytes) {
    fmt::print("Fixed super total bytes, old size: {} new size: {}\n", r->old_super_bytes, r->new_super_bytes);
  }
  if (r->changed()) {
    fmt::print("Fixed unaligned/mismatched total_bytes for super block and device items\n");
  } else {
    fmt::print("No device size related problem found\n");
  }
}

void CmdClearUuidTree(const Options& o) {
  OpenOptions where;
  PlacementInto(&where);
  auto r = ClearUuidTree(o.image, where);
  if (!r.ok()) return Failed("clear-uuid-tree", r.status());
  Warn(o, r->warnings);
  if (!r->had_tree) {
    fmt::print("No UUID tree on {}: nothing to clear\n", o.image);
    return;
  }
  fmt::print("Cleared the UUID tree of {} ({} tree block{} freed); the kernel builds it again at its next "
             "writable mount\n",
             o.image, r->blocks_freed, r->blocks_freed == 1 ? "" : "s");
}

}  // namespace

void RegisterRescue(CLI::App& app) {
  static Options opts;
  auto* rescue = app.add_subcommand("rescue", "Offline repairs of an image the kernel refuses to mount, as btrfs "
                                              "rescue");
  rescue->require_subcommand(1);
  auto* zl = rescue->add_subcommand("zero-log", "Drop the tree log, whose replay fails (what was fsynced since the "
                                                "last commit is lost)");
  zl->add_option("image", opts.image, "Image file or block device (IMG1,IMG2,... for several)")->required();
  zl->fallthrough();  // --offset, --scan and the like after the verb
  zl->callback([] { CmdZeroLog(opts); });

  auto* sr = rescue->add_subcommand("super-recover", "Rewrite bad superblock copies from the newest good one");
  sr->add_option("image", opts.image, "Image file or block device (IMG1,IMG2,... for several)")->required();
  sr->add_flag("-y,--yes", opts.yes, "Do not ask before writing");
  sr->add_flag("-v,--verbose", opts.verbose, "List the good copies too");
  sr->fallthrough();
  sr->callback([] { CmdSuperRecover(opts); });

  auto* fds = rescue->add_subcommand("fix-device-size", "Align the devices' sizes to the sector size, cut them to "
                                                        "the devices, and make the superblock's total their sum");
  fds->add_option("image", opts.image, "Image file or block device (IMG1,IMG2,... for several)")->required();
  fds->fallthrough();
  fds->callback([] { CmdFixDeviceSize(opts); });

  auto* cu = rescue->add_subcommand("clear-uuid-tree", "Remove the UUID tree, which the kernel builds again at its "
                                                       "next writable mount");
  cu->add_option("image", opts.image, "Image file or block device (IMG1,IMG2,... for several)")->required();
  cu->fallthrough();
  cu->callback([] { CmdClearUuidTree(opts); });
}

}  // namespace ubtrfs::cli
