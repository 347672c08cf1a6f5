// ubtrfs: one command, btrfs-progs-like subcommands. Front end only: parse
// arguments, call libubtrfs, print.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/huge_pages.h"

namespace {

// Only for the commands that build large heaps (the second start costs a
// few milliseconds, which `ls` or `stat` would feel); see cli/huge_pages.h.
bool BuildsLargeHeaps(const char* subcommand) {
  for (const char* c : {"mkfs", "cp", "copy-in", "mount", "receive", "check"}) {
    if (std::strcmp(subcommand, c) == 0) return true;
  }
  return false;
}

// Installed (or linked) under the name of btrfs-progs' mkfs, ubtrfs is the
// mkfs verb: tools that run `mkfs.btrfs` by name (systemd-repart, mkosi
// through it, `mkfs -t btrfs`) then build their images with ubtrfs when it
// comes first in PATH. The verb takes mkfs.btrfs's options.
std::vector<char*> VerbFromProgramName(int argc, char** argv) {
  std::vector<char*> out(argv, argv + argc);
  const char* slash = std::strrchr(argv[0], '/');
  const char* name = slash ? slash + 1 : argv[0];
  static char mkfs_word[] = "mkfs";
  if (std::strcmp(name, "mkfs.btrfs") == 0 || std::strcmp(name, "mkfs.ubtrfs") == 0) {
    out.insert(out.begin() + 1, mkfs_word);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ubtrfs: read and write btrfs images from user space"};
  app.require_subcommand(1);
  ubtrfs::cli::RegisterCommands(app);
  try {
    std::vector<char*> args = VerbFromProgramName(argc, argv);
    if (args.size() == static_cast<size_t>(argc)) {
      args = ubtrfs::cli::MountHelperArgv(app, argc, argv);  // fstab: fuse.ubtrfs
    }
    if (args.size() > 1 && BuildsLargeHeaps(args[1])) ubtrfs::cli::UseHugePagesForTheHeap(argv);
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    // app.exit prints the message (or the help, with 0). Wrong arguments
    // exit 2, as coreutils and the rest of ubtrfs say it, not CLI11's codes;
    // check's are an operational error (8), as its other failures to start.
    if (app.exit(e) == 0) return 0;
    return app.got_subcommand("check") ? 8 : 2;
  }
  return ubtrfs::cli::ExitCode();
}
