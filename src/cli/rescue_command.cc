// rescue zero-log: offline repairs of an image the kernel refuses to mount
// (ubtrfs/rescue.h), as `btrfs rescue`.
#include <fmt/core.h>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "ubtrfs/rescue.h"

namespace ubtrfs::cli {
namespace {

struct Options {
  std::string image;
};

void CmdZeroLog(const Options& o) {
  OpenOptions where;
  PlacementInto(&where);
  auto r = ZeroLog(o.image, where);
  if (!r.ok()) {
    fmt::print(stderr, "ubtrfs: rescue zero-log: {}\n", r.status().ToString());
    SetExitCode(1);
    return;
  }
  for (const auto& w : r->warnings) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", o.image, w);
  if (r->log_root == 0) {
    fmt::print("No tree log on {}: nothing to clear\n", o.image);
    return;
  }
  fmt::print("Clearing log on {}, previous log_root {}, level {}\n", o.image, r->log_root, r->log_level);
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
}

}  // namespace ubtrfs::cli
