// The heap in transparent huge pages, for the programs that build large
// heaps (src/cli/main.cc for its verbs, mkfs.ubtrfs for a large --rootdir).
#ifndef UBTRFS_CLI_HUGE_PAGES_H_
#define UBTRFS_CLI_HUGE_PAGES_H_

#include <cstddef>
#include <string>

namespace ubtrfs::cli {

// Starts the program once more (execv of /proc/self/exe with `argv`) with
// glibc's malloc asking for huge pages. Returns without a restart where the
// caller set the tunable either way, with UBTRFS_HUGE_PAGES=0, where the
// kernel has THP off, or when this is the restarted program.
void UseHugePagesForTheHeap(char** argv);

// In the restarted program: puts GLIBC_TUNABLES back as the caller had it
// (so that nothing the program runs inherits the tunable) and returns true.
// False in a program that was not restarted.
bool ResumeAfterHugePageRestart();

// Whether the directory `dir` holds at least `entries` names below it,
// counted with readdir alone and no further than that; false for anything
// that is not a directory (an archive, "-").
bool TreeHasAtLeast(const std::string& dir, size_t entries);

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_HUGE_PAGES_H_
