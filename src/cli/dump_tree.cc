#include "cli/commands.h"

namespace ubtrfs::cli {
void RegisterDumpTree(CLI::App&) {}
}  // namespace ubtrfs::cli
