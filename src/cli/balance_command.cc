// balance: chunks converted to another profile, or partly used block
// groups emptied, offline (as btrfs balance start -dconvert=... -mconvert=...
// -dusage=... -musage=... on a mounted filesystem). Through ubtrfs/resize.h.
#include <fmt/core.h>

#include <string>
#include <utility>
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
  std::string d_filters, m_filters, s_filters;  // btrfs-progs' -dFILTERS, -mFILTERS, -sFILTERS
  std::string d_usage, m_usage;
  bool quiet = false;
};

void CmdBalance(BalanceArgs& a) {
  if (Placement().offset != 0 || Placement().partition != 0) {
    fmt::print(stderr, "ubtrfs balance: works on whole images and devices; --offset and --partition are not supported\n");
    return SetExitCode(2);
  }
  RelocateOptions ro;
  for (Status s : {ParseBalanceFilters(a.d_filters, &ro.data, &ro.data_groups, &a.o.data),
                   ParseBalanceFilters(a.m_filters, &ro.metadata, &ro.metadata_groups, &a.o.metadata),
                   a.d_usage.empty() ? Status::Ok() : ParseUsageFilter("usage=" + a.d_usage, &ro.data),
                   a.m_usage.empty() ? Status::Ok() : ParseUsageFilter("usage=" + a.m_usage, &ro.metadata)}) {
    if (!s.ok()) {
      fmt::print(stderr, "ubtrfs balance: {}\n", s.message());
      return SetExitCode(2);
    }
  }
  if (!a.s_filters.empty()) {
    UsageFilter usage;
    GroupFilter groups;
    if (Status s = ParseBalanceFilters(a.s_filters, &usage, &groups, &a.o.system); !s.ok() || usage.on || groups.on) {
      fmt::print(stderr, "ubtrfs balance: {}\n",
                 s.ok() ? "system chunks are not relocated; -s takes convert=PROFILE" : s.message());
      return SetExitCode(2);
    }
  }
  // A kind with a convert target converts the chunks its filters take
  // (`-dconvert=raid1,usage=50`); a kind without one is emptied by them.
  if (!a.o.data.empty()) {
    a.o.data_usage = std::exchange(ro.data, UsageFilter{});
    a.o.data_groups = std::exchange(ro.data_groups, GroupFilter{});
  }
  if (!a.o.metadata.empty()) {
    a.o.metadata_usage = std::exchange(ro.metadata, UsageFilter{});
    a.o.metadata_groups = std::exchange(ro.metadata_groups, GroupFilter{});
  }
  const bool convert = !a.o.data.empty() || !a.o.metadata.empty() || !a.o.system.empty();
  const bool relocate = ro.data.on || ro.metadata.on || ro.data_groups.on || ro.metadata_groups.on;
  if (!convert && !relocate) {
    fmt::print(stderr,
               "ubtrfs balance: give what to do: -dconvert=PROFILE, -mconvert=PROFILE, -sconvert=PROFILE "
               "(or --dconvert/--mconvert/--sconvert), -dusage=N, -musage=N (or -dlimit=, -ddevid=, -ddrange=, "
               "-dvrange=, and the same for -m)\n");
    return SetExitCode(2);
  }
  if (convert) {
    a.o.scan_dirs = Placement().scan_dirs;
    a.o.degraded = Placement().degraded;
    ConvertResult r;
    if (Status s = ConvertProfiles(a.devices, a.o, &r); !s.ok()) {
      fmt::print(stderr, "ubtrfs balance: {}\n", s.ToString());
      PrintCopyCheck("balance", r.copy_check);
      return SetExitCode(1);
    }
    PrintCopyCheck("balance", r.copy_check);
    if (!a.quiet) fmt::print("Converted {} chunks ({} copied)\n", r.chunks_converted, Human(r.bytes_copied));
  }
  if (relocate) {
    ro.scan_dirs = Placement().scan_dirs;
    ro.degraded = Placement().degraded;
    RelocateResult r;
    Status s = RelocateGroups(a.devices, ro, &r);
    for (const std::string& n : r.notes) fmt::print(stderr, "ubtrfs balance: {}\n", n);
    if (!s.ok()) fmt::print(stderr, "ubtrfs balance: {}\n", s.ToString());
    // After a failure, what was done before it (nothing: no line).
    if (s.ok() ? !a.quiet : r.groups_selected > 0) {
      fmt::print("Relocated {} of {} block groups ({} data extents, {}; {} tree blocks); chunks took {}, now {}\n",
                 r.groups_emptied, r.groups_selected, r.data_extents, Human(r.data_bytes), r.tree_blocks,
                 Human(r.chunk_bytes_before), Human(r.chunk_bytes_after));
    }
    return SetExitCode(s.ok() ? 0 : 1);
  }
}

}  // namespace

void RegisterBalance(CLI::App& app) {
  static BalanceArgs args;
  auto* bal = app.add_subcommand("balance",
                                 "Convert chunks to another profile, or empty partly used block groups, offline "
                                 "(as btrfs balance start -dconvert= -mconvert= -dusage= -musage=)");
  bal->add_option("devices", args.devices, "IMAGE... (the filesystem's devices)")->required();
  bal->add_option("-d", args.d_filters,
                  "Data filters, comma-separated as btrfs balance's: convert=PROFILE[,soft], or usage=N (MIN..MAX), "
                  "limit=N (MIN..MAX), devid=N, drange=S..E, vrange=S..E (as -dusage=50,limit=2)");
  bal->add_option("-m", args.m_filters, "Metadata filter, as -d (convert also takes system chunks without -s)");
  bal->add_option("-s", args.s_filters, "System filter: convert=PROFILE");
  bal->add_option("--dconvert", args.o.data, "Profile for data chunks (single, dup, raid0, raid1, raid1c3, "
                                              "raid1c4, raid10, raid5, raid6)");
  bal->add_option("--mconvert", args.o.metadata, "Profile for metadata chunks (and system, without --sconvert)");
  bal->add_option("--sconvert", args.o.system, "Profile for system chunks");
  bal->add_option("--dusage", args.d_usage, "Empty data block groups less than this percent used (or MIN..MAX)");
  bal->add_option("--musage", args.m_usage, "Empty metadata block groups less than this percent used (or MIN..MAX)");
  bal->add_flag("-f,--force", args.o.force, "Allow metadata or system chunks to lose redundancy");
  bal->add_flag("-q,--quiet", args.quiet, "Print nothing on success");
  bal->callback([] { CmdBalance(args); });
}

}  // namespace ubtrfs::cli
