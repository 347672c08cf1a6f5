// mkfs.ubtrfs: `ubtrfs mkfs` as a program of its own, as btrfs-progs ships
// mkfs.btrfs beside btrfs. Image builders run mkfs by name and count its
// memory; this program links only mkfs and what it calls, without the
// other verbs, the checker, the send stream or the FUSE mount.
//
// The heap goes into huge pages (cli/huge_pages.h) only for a --rootdir of
// many entries: there it took 0.83-0.85 s instead of 1.13-1.31 s for
// 200,000 empty files (session 30), while for a few large files a huge page
// of heap was 2 MB more at the peak, above mkfs.btrfs's.
//
// One malloc arena: the threads of a build (read-ahead, compressors, the
// work pool) allocate little and seldom, and each arena a thread opened
// held its own pages at the peak: --compress zstd of a 214 MiB text tree
// peaked at 9.7 MB with an arena per thread, 9.2-9.5 MB with one, in the
// same time (session 31).
#include <malloc.h>

#include <CLI/CLI.hpp>

#include <string>

#include "cli/commands.h"
#include "cli/huge_pages.h"
#include "cli/image_options.h"

namespace {
constexpr size_t kManyEntries = 10000;
}  // namespace

int main(int argc, char** argv) {
  ::mallopt(M_ARENA_MAX, 1);
  const bool restarted = ubtrfs::cli::ResumeAfterHugePageRestart();
  CLI::App app{"mkfs.ubtrfs: create a btrfs filesystem in image files or on block devices, as mkfs.btrfs"};
  app.name("mkfs.ubtrfs");
  ubtrfs::cli::AddMkfsOptions(&app);
  ubtrfs::cli::AddPlacementOptions(&app);
  // Before the build starts: the option's callback runs as it is parsed.
  app.get_option("--rootdir")->each([restarted, argv](const std::string& dir) {
    if (!restarted && ubtrfs::cli::TreeHasAtLeast(dir, kManyEntries)) ubtrfs::cli::UseHugePagesForTheHeap(argv);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // wrong arguments: 2, as ubtrfs says them
  }
  return ubtrfs::cli::ExitCode();
}
