// The exit code a command's callback leaves for main(): on its own so that
// mkfs.ubtrfs (mkfs_main.cc) links without the other commands.
#include "cli/commands.h"

namespace ubtrfs::cli {
namespace {
int g_exit_code = 0;
}  // namespace

void SetExitCode(int code) {
  if (code != 0 && g_exit_code == 0) g_exit_code = code;
}
int ExitCode() { return g_exit_code; }

}  // namespace ubtrfs::cli
