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
}

const ImagePlacement& Placement() { return g_placement; }

void PlacementInto(OpenOptions* o) {
  o->offset = g_placement.offset;
  o->partition = g_placement.partition;
}

}  // namespace ubtrfs::cli
