// Options every subcommand that opens an image takes: where the filesystem
// lies in it (--offset N, --partition N of a GPT or MBR disk image), where
// the other devices of a multi-device filesystem are (IMAGE itself may be
// IMG1,IMG2,...; --scan DIR finds the rest by fsid), and --degraded.
#ifndef UBTRFS_CLI_IMAGE_OPTIONS_H_
#define UBTRFS_CLI_IMAGE_OPTIONS_H_

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {

struct ImagePlacement {
  uint64_t offset = 0;
  int partition = 0;
  std::vector<std::string> scan_dirs;
  bool degraded = false;
  RescueOptions rescue;
};

// Adds --offset and --partition to `cmd` (one set for the whole process:
// one subcommand runs per invocation).
void AddPlacementOptions(CLI::App* cmd);
// Adds --rescue LIST (OpenOptions::rescue, the kernel's rescue= names) to a
// subcommand that reads.
void AddRescueOption(CLI::App* cmd);
// After a read that failed on a damaged tree block (EUCLEAN naming a tree
// block) with no --rescue given: says once which rescue options may read
// more.
void HintRescue(const Status& st);
const ImagePlacement& Placement();
// Copies them into open options (also the `where` of ubtrfs/inspect.h).
void PlacementInto(OpenOptions* o);

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_IMAGE_OPTIONS_H_
