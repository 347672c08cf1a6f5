// mkfs.ubtrfs: `ubtrfs mkfs` as a program of its own, as btrfs-progs ships
// mkfs.btrfs beside btrfs. Image builders run mkfs by name and count its
// memory; this program links only mkfs and what it calls, without the
// other verbs, the checker, the send stream or the FUSE mount.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/image_options.h"

int main(int argc, char** argv) {
  CLI::App app{"mkfs.ubtrfs: create a btrfs filesystem in image files or on block devices, as mkfs.btrfs"};
  app.name("mkfs.ubtrfs");
  ubtrfs::cli::AddMkfsOptions(&app);
  ubtrfs::cli::AddPlacementOptions(&app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return ubtrfs::cli::ExitCode();
}
