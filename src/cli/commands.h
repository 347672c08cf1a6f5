#ifndef UBTRFS_CLI_COMMANDS_H_
#define UBTRFS_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>

namespace ubtrfs::cli {

// Adds every subcommand to `app`; each sets the exit code through its callback.
void RegisterCommands(CLI::App& app);
int ExitCode();

// Subcommand registration, one file each.
void RegisterReadCommands(CLI::App& app);  // info, ls, cat, cp
void RegisterDumpTree(CLI::App& app);      // dump-tree
void RegisterMkfs(CLI::App& app);          // mkfs

void SetExitCode(int code);

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_COMMANDS_H_
