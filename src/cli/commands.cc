#include "cli/commands.h"

#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {
int g_exit_code = 0;
std::string g_subvol;
uint64_t g_subvolid = 0;
}  // namespace

void AddSubvolOptions(CLI::App* cmd) {
  cmd->add_option("--subvol", g_subvol, "Paths start at this subvolume (its path from the top level), as subvol=");
  cmd->add_option("--subvolid", g_subvolid, "Paths start at the subvolume with this id (5: the top level), as subvolid=");
}

void SubvolOptionsInto(OpenOptions* o) {
  o->subvol = g_subvol;
  o->subvolid = g_subvolid;
}

void SetExitCode(int code) {
  if (code != 0 && g_exit_code == 0) g_exit_code = code;
}
int ExitCode() { return g_exit_code; }

void RegisterCommands(CLI::App& app) {
  RegisterReadCommands(app);
  RegisterDumpTree(app);
  RegisterWriteCommands(app);
  RegisterMkfs(app);
  RegisterCheck(app);
  RegisterMount(app);
  RegisterStats(app);
  RegisterProperty(app);
  for (const char* name : {"info", "ls", "cat", "cp", "rm", "mkdir"}) AddSubvolOptions(app.get_subcommand(name));
}

}  // namespace ubtrfs::cli
