// resize: grow or shrink the filesystem in an image file, or one device of
// several, offline.
#include <fmt/core.h>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/progress_line.h"
#include "cli/text.h"
#include "ubtrfs/resize.h"

namespace ubtrfs::cli {
namespace {

struct ResizeArgs {
  std::string image;
  std::string size;
  bool quiet = false;
  bool shrink = false;
};

// --shrink: pack, cut and move the chunks, cut the file (ShrinkImage).
void CmdShrink(const ResizeArgs& a) {
  if (a.image.find(',') != std::string::npos) {
    fmt::print(stderr, "ubtrfs resize: --shrink works on images of one device\n");
    return SetExitCode(2);
  }
  ShrinkResult r;
  Status s = ShrinkImage(a.image, &r);
  for (const std::string& n : r.notes) fmt::print(stderr, "ubtrfs resize: note: {}\n", n);
  for (const std::string& n : r.packed.notes) fmt::print(stderr, "ubtrfs resize: note: {}\n", n);
  if (!s.ok()) {
    fmt::print(stderr, "ubtrfs resize: {}: {}\n", a.image, s.ToString());
    SetExitCode(1);
    return;
  }
  PrintCopyCheck("resize", r.resize.copy_check);
  if (a.quiet) return;
  fmt::print("Shrank {} from {} bytes ({}) to {} bytes ({})", a.image, r.resize.old_bytes, Human(r.resize.old_bytes),
             r.resize.new_bytes, Human(r.resize.new_bytes));
  if (r.packed.groups_emptied) {
    fmt::print("; packed {} block groups ({} data extents, {}; {} tree blocks)", r.packed.groups_emptied,
               r.packed.data_extents, Human(r.packed.data_bytes), r.packed.tree_blocks);
  }
  if (r.resize.bytes_trimmed) fmt::print("; cut {} of unused chunk tails", Human(r.resize.bytes_trimmed));
  if (r.resize.stripes_moved) fmt::print("; moved {} chunk copies", r.resize.stripes_moved);
  fmt::print("\n");
}

void CmdResize(const ResizeArgs& a) {
  if (Placement().offset != 0 || Placement().partition != 0) {
    fmt::print(stderr, "ubtrfs resize: resizes a whole image file; --offset and --partition are not supported\n");
    SetExitCode(2);
    return;
  }
  if (a.shrink != a.size.empty()) {
    fmt::print(stderr, "ubtrfs resize: {}\n", a.shrink ? "--shrink takes no size" : "a size is needed (or --shrink)");
    SetExitCode(2);
    return;
  }
  if (a.shrink) return CmdShrink(a);
  // DEVID:SIZE names the device of several, as btrfs filesystem resize.
  std::string size = a.size;
  uint64_t devid = 0;
  if (const size_t colon = size.find(':'); colon != std::string::npos) {
    const std::string id = size.substr(0, colon);
    if (id.empty() || id.size() > 19 || id.find_first_not_of("0123456789") != std::string::npos ||
        std::stoull(id) == 0) {
      fmt::print(stderr, "ubtrfs resize: '{}' is not a device id (DEVID:SIZE)\n", id);
      SetExitCode(1);
      return;
    }
    devid = std::stoull(id);
    size = size.substr(colon + 1);
  }
  ResizeTarget target;
  if (Status s = ParseResizeTarget(size, &target); !s.ok()) {
    fmt::print(stderr, "ubtrfs resize: {}\n", s.message());
    SetExitCode(1);
    return;
  }
  ResizeResult r;
  const bool several = a.image.find(',') != std::string::npos;
  Status s = several || devid != 0 ? ResizeDevice({a.image}, devid == 0 ? 1 : devid, target, DeviceChangeOptions{}, &r)
                                   : ResizeImage(a.image, target, &r);
  if (!s.ok()) {
    fmt::print(stderr, "ubtrfs resize: {}: {}\n", a.image, s.ToString());
    SetExitCode(1);
    return;
  }
  PrintCopyCheck("resize", r.copy_check);
  if (a.quiet) return;
  const std::string what = several || devid != 0 ? "device " + std::to_string(devid == 0 ? 1 : devid) + " of " + a.image
                                                  : a.image;
  fmt::print("Resized {} from {} bytes ({}) to {} bytes ({})", what, r.old_bytes, Human(r.old_bytes), r.new_bytes,
             Human(r.new_bytes));
  if (r.stripes_moved) fmt::print("; moved {} chunk copies ({} copied)", r.stripes_moved, Human(r.bytes_copied));
  fmt::print("\n");
}

}  // namespace

void RegisterResize(CLI::App& app) {
  static ResizeArgs args;
  auto* cmd = app.add_subcommand(
      "resize", "Grow or shrink the filesystem in an image file offline (chunks past the new end are moved down)");
  cmd->add_option("image", args.image,
                  "Image file (or block device), not mounted; several devices as IMG1,IMG2,...")
      ->required();
  cmd->add_option("size", args.size,
                  "New size: [DEVID:]SIZE, +N, -N (K/M/G/T suffixes), max (the whole file) or min; DEVID (default 1) "
                  "names the device of several");
  cmd->add_flag("--shrink", args.shrink,
                "Instead of a size: the smallest image that holds what it holds (block groups packed, chunks cut "
                "to what they hold and moved down, the file cut), as mkfs --shrink");
  cmd->add_flag("-q,--quiet", args.quiet, "Print nothing on success");
  cmd->callback([] { CmdResize(args); });
}

}  // namespace ubtrfs::cli
