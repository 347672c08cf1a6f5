#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/verbs.h"

namespace ubtrfs::cli {
namespace {
int g_exit_code = 0;
}  // namespace

void SetExitCode(int code) {
  if (code != 0 && g_exit_code == 0) g_exit_code = code;
}
int ExitCode() { return g_exit_code; }

void RegisterCommands(CLI::App& app) {
  RegisterReadCommands(app);
  RegisterDumpTree(app);
  RegisterMkfs(app);
  RegisterCheck(app);
  RegisterMount(app);
  RegisterStats(app);
  RegisterVerbs(app, nullptr);
  RegisterEdit(app);
  for (auto* cmd : app.get_subcommands({})) AddPlacementOptions(cmd);
}

}  // namespace ubtrfs::cli
