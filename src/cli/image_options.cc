#include "cli/image_options.h"

#include <cerrno>

#include <fmt/core.h>


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

void AddRescueOption(CLI::App* cmd) {
  cmd->add_option_function<std::string>(
         "--rescue",
         [](const std::string& list) {
           Status st = ParseRescueOptions(list, &g_placement.rescue);
           if (!st.ok()) throw CLI::ValidationError("--rescue", st.message());
         },
         "Read a damaged image, read-only, as the kernel's -o rescue=: usebackuproot, nologreplay, "
         "ignorebadroots, ignoredatacsums, ignoremetacsums, ignoresuperflags; salvage (ubtrfs's own: "
         "directories list what their readable blocks hold); or all (several: a:b)")
      ->type_name("LIST");
  cmd->add_option("--tree-root", g_placement.rescue.tree_root,
                  "Read-only: read the commit whose root tree's root is the block at this logical address (an "
                  "older one, as inspect find-root lists them)")
      ->type_name("BYTENR");
  cmd->add_option("--super", g_placement.rescue.super_mirror,
                  "Read-only: use superblock copy N (0, 1 or 2), not the best valid one")
      ->type_name("N")
      ->check(CLI::Range(0, 2));
}

void HintRescue(const Status& st) {
  static bool said = false;
  if (said || st.code() != EUCLEAN || g_placement.rescue.any() ||
      st.message().find("tree block") == std::string::npos) {
    return;
  }
  said = true;
  fmt::print(stderr,
             "ubtrfs: hint: a damaged tree block; read-only, --rescue ignoremetacsums takes one whose checksum "
             "alone is wrong, --rescue salvage lists directories past ones that do not read, --rescue all tries "
             "every fallback\n");
}

const ImagePlacement& Placement() { return g_placement; }

void PlacementInto(OpenOptions* o) {
  o->offset = g_placement.offset;
  o->partition = g_placement.partition;
  o->scan_dirs = g_placement.scan_dirs;
  o->degraded = g_placement.degraded;
  o->rescue = g_placement.rescue;
}

}  // namespace ubtrfs::cli
