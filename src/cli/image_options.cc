#include "cli/image_options.h"


namespace ubtrfs::cli {
namespace {
ImagePlacement g_placement;
}  // namespace

void AddPlacementOptions(CLI::App* cmd) {
  cmd->add_option("--offset", g_placement.offset, "The filesystem starts this many bytes into the image");
  cmd->add_option("--partition", g_placement.partition,
                  "The filesystem is partition N (1-based) of the image's GPT or MBR partition table")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--scan", g_placement.scan_dirs,
                  "Find the other devices of a multi-device filesystem among the files in DIR (by fsid); "
                  "IMAGE can also name them all: IMG1,IMG2,...")
      ->type_name("DIR");
  cmd->add_flag("--degraded", g_placement.degraded,
                "Write to a multi-device filesystem although devices are missing (as the kernel's -o degraded)");
}

const ImagePlacement& Placement() { return g_placement; }

void PlacementInto(OpenOptions* o) {
  o->offset = g_placement.offset;
  o->partition = g_placement.partition;
  o->scan_dirs = g_placement.scan_dirs;
  o->degraded = g_placement.degraded;
}

}  // namespace ubtrfs::cli
