// Options every subcommand that opens an image takes: where the filesystem
// lies in it (--offset N, --partition N of a GPT or MBR disk image).
#ifndef UBTRFS_CLI_IMAGE_OPTIONS_H_
#define UBTRFS_CLI_IMAGE_OPTIONS_H_

#include <CLI/CLI.hpp>

#include <cstdint>

#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {

struct ImagePlacement {
  uint64_t offset = 0;
  int partition = 0;
};

// Adds --offset and --partition to `cmd` (one set for the whole process:
// one subcommand runs per invocation).
void AddPlacementOptions(CLI::App* cmd);
const ImagePlacement& Placement();
// Copies them into open options.
void PlacementInto(OpenOptions* o);

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_IMAGE_OPTIONS_H_
