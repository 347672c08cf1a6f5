// ubtrfs: one command, btrfs-progs-like subcommands. Front end only: parse
// arguments, call libubtrfs, print.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace {

// The heap in transparent huge pages. An import builds its tree blocks and
// tables in fresh heap memory, and on the VMs measured a first touch of a
// page (a page fault, with a paravirtual interrupt round trip) was a fifth
// of `mkfs --rootdir` of 200,000 empty files: with glibc's malloc asking
// for huge pages (the glibc.malloc.hugetlb tunable) that build took 0.85-
// 0.94 s instead of 1.32-1.41 s, and `mkfs --compress zstd` of 214 MiB of
// text 1.09 s instead of 1.33 s (docs/BENCHMARKS.md, session 22). Tunables
// are read when a process starts, so the command starts itself once more
// with the tunable set, then puts the environment back as it was, so that
// nothing it runs inherits it. Only for the commands that build large
// heaps (the second start costs a few milliseconds, which `ls` or `stat`
// would feel); not where the caller set the tunable either way, with
// UBTRFS_HUGE_PAGES=0, or where the kernel has THP off.
constexpr char kMark[] = "UBTRFS_HEAP_TUNED";

void RestoreTunables(const char* mark) {
  if (mark[0] == '1' && mark[1] == ':') {
    ::setenv("GLIBC_TUNABLES", mark + 2, 1);
  } else {
    ::unsetenv("GLIBC_TUNABLES");
  }
  ::unsetenv(kMark);
}

void UseHugePagesForTheHeap(char** argv) {
  if (const char* mark = std::getenv(kMark)) {
    RestoreTunables(std::string(mark).c_str());
    return;
  }
  if (const char* opt = std::getenv("UBTRFS_HUGE_PAGES"); opt && std::strcmp(opt, "0") == 0) return;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.hugetlb")) return;
  std::string thp;
  std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), thp);
  if (thp.empty() || thp.find("[never]") != std::string::npos) return;
  const std::string mark = tunables ? std::string("1:") + tunables : std::string("0");
  const std::string set = tunables && *tunables ? std::string(tunables) + ":glibc.malloc.hugetlb=1"
                                                : std::string("glibc.malloc.hugetlb=1");
  ::setenv(kMark, mark.c_str(), 1);
  ::setenv("GLIBC_TUNABLES", set.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  RestoreTunables(mark.c_str());  // no exec: go on as we are
}

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
    if (args.size() > 1 && BuildsLargeHeaps(args[1])) UseHugePagesForTheHeap(argv);
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return ubtrfs::cli::ExitCode();
}
