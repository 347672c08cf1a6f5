// resize: grow or shrink the filesystem in an image file offline.
#include <fmt/core.h>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/mkfs_rootdir.h"
#include "ubtrfs/resize.h"

namespace ubtrfs::cli {
namespace {

struct ResizeArgs {
  std::string image;
  std::string size;
  bool quiet = false;
};

void CmdResize(const ResizeArgs& a) {
  if (Placement().offset != 0 || Placement().partition != 0) {
    fmt::print(stderr, "ubtrfs resize: resizes a whole image file; --offset and --partition are not supported\n");
    SetExitCode(2);
    return;
  }
  ResizeTarget target;
  if (Status s = ParseResizeTarget(a.size, &target); !s.ok()) {
    fmt::print(stderr, "ubtrfs resize: {}\n", s.message());
    SetExitCode(1);
    return;
  }
  ResizeResult r;
  if (Status s = ResizeImage(a.image, target, &r); !s.ok()) {
    fmt::print(stderr, "ubtrfs resize: {}: {}\n", a.image, s.ToString());
    SetExitCode(1);
    return;
  }
  if (a.quiet) return;
  fmt::print("Resized {} from {} bytes ({}) to {} bytes ({})", a.image, r.old_bytes, Human(r.old_bytes), r.new_bytes,
             Human(r.new_bytes));
  if (r.stripes_moved) fmt::print("; moved {} chunk copies ({} copied)", r.stripes_moved, Human(r.bytes_copied));
  fmt::print("\n");
}

}  // namespace

void RegisterResize(CLI::App& app) {
  static ResizeArgs args;
  auto* cmd = app.add_subcommand(
      "resize", "Grow or shrink the filesystem in an image file offline (chunks past the new end are moved down)");
  cmd->add_option("image", args.image, "Image file (or block device); not mounted")->required();
  cmd->add_option("size", args.size, "New size: SIZE, +N, -N (K/M/G/T suffixes), max (the whole file) or min")
      ->required();
  cmd->add_flag("-q,--quiet", args.quiet, "Print nothing on success");
  cmd->callback([] { CmdResize(args); });
}

}  // namespace ubtrfs::cli
