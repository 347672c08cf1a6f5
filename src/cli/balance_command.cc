// balance: chunks converted to another profile, offline (as btrfs balance
// start -dconvert=... -mconvert=... on a mounted filesystem). Through
// ubtrfs/resize.h.
#include <fmt/core.h>

#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/progress_line.h"
#include "cli/text.h"
#include "ubtrfs/resize.h"

namespace ubtrfs::cli {
namespace {

struct BalanceArgs {
  std::vector<std::string> devices;
  ConvertOptions o;
  bool quiet = false;
};

void CmdBalance(BalanceArgs& a) {
  if (Placement().offset != 0 || Placement().partition != 0) {
    fmt::print(stderr, "ubtrfs balance: works on whole images and devices; --offset and --partition are not supported\n");
    return SetExitCode(2);
  }
  if (a.o.data.empty() && a.o.metadata.empty() && a.o.system.empty()) {
    fmt::print(stderr, "ubtrfs balance: give the profile to convert to: --dconvert, --mconvert and/or --sconvert\n");
    return SetExitCode(2);
  }
  a.o.scan_dirs = Placement().scan_dirs;
  a.o.degraded = Placement().degraded;
  ConvertResult r;
  if (Status s = ConvertProfiles(a.devices, a.o, &r); !s.ok()) {
    fmt::print(stderr, "ubtrfs balance: {}\n", s.ToString());
    PrintCopyCheck("balance", r.copy_check);
    return SetExitCode(1);
  }
  PrintCopyCheck("balance", r.copy_check);
  if (a.quiet) return;
  fmt::print("Converted {} chunks ({} copied)\n", r.chunks_converted, Human(r.bytes_copied));
}

}  // namespace

void RegisterBalance(CLI::App& app) {
  static BalanceArgs args;
  auto* bal = app.add_subcommand(
      "balance", "Convert chunks to another profile, offline (as btrfs balance start -dconvert= -mconvert=)");
  bal->add_option("devices", args.devices, "IMAGE... (the filesystem's devices)")->required();
  bal->add_option("-d,--dconvert", args.o.data, "Profile for data chunks (single, dup, raid0, raid1, raid1c3, "
                                                 "raid1c4, raid10, raid5, raid6)");
  bal->add_option("-m,--mconvert", args.o.metadata, "Profile for metadata chunks (and system, without --sconvert)");
  bal->add_option("-s,--sconvert", args.o.system, "Profile for system chunks");
  bal->add_flag("-f,--force", args.o.force, "Allow metadata or system chunks to lose redundancy");
  bal->add_flag("-q,--quiet", args.quiet, "Print nothing on success");
  bal->callback([] { CmdBalance(args); });
}

}  // namespace ubtrfs::cli
