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
void RegisterWriteCommands(CLI::App& app); // rm, mkdir (cp into an image goes through CopyIn)
void RegisterCheck(CLI::App& app);         // check
void RegisterMount(CLI::App& app);         // mount (FUSE, src/fuse/)

// `cp HOST IMAGE:PATH`: copies a host file or tree into an image.
void CopyIn(const std::string& host, const std::string& image, const std::string& path);
// Splits "IMAGE:PATH" when IMAGE names an existing file or block device.
bool SplitImagePath(const std::string& arg, std::string* image, std::string* path);

void SetExitCode(int code);

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_COMMANDS_H_
