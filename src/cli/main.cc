// ubtrfs: one command, btrfs-progs-like subcommands. Front end only: parse
// arguments, call libubtrfs, print.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cstdio>
#include <vector>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"ubtrfs: read and write btrfs images from user space"};
  app.require_subcommand(1);
  ubtrfs::cli::RegisterCommands(app);
  try {
    std::vector<char*> args = ubtrfs::cli::MountHelperArgv(app, argc, argv);  // fstab: fuse.ubtrfs
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return ubtrfs::cli::ExitCode();
}
