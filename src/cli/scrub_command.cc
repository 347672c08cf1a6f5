// scrub: every copy of every tree block and checksummed data sector read and
// verified, bad copies rewritten from good ones (check/scrub.h). Exit codes
// as btrfs scrub start -B: 0 nothing wrong (or all of it repaired), 3 errors
// left (uncorrectable, or not repaired with --readonly), 1 operational error.
#include <fmt/core.h>

#include <string>
#include <vector>

#include "check/scrub.h"
#include "cli/commands.h"
#include "cli/image_options.h"
#include "txn/volume.h"

namespace ubtrfs::cli {
namespace {

struct ScrubArgs {
  std::vector<std::string> images;
  bool readonly = false;
  bool json = false;
};

void CmdScrub(const ScrubArgs& a) {
  std::string list;
  for (const auto& i : a.images) list += (list.empty() ? "" : ",") + i;
  auto devs = OpenImageDevices(list, !a.readonly);
  if (!devs.ok()) {
    fmt::print(stderr, "ubtrfs: scrub: {}\n", devs.status().ToString());
    return SetExitCode(1);
  }
  // Repairs go straight to the devices: the volume itself stays read-only
  // (no transaction), which also lets RAID5/6 data be put back in place.
  txn::VolumeOptions vo;
  vo.verify_data_csums = false;
  vo.node_cache_bytes = 16ull << 20;
  auto vol = txn::Volume::Open(std::move(*devs), vo);
  if (!vol.ok()) {
    fmt::print(stderr, "ubtrfs: scrub: {}: {}\n", list, vol.status().ToString());
    return SetExitCode(1);
  }
  for (const auto& w : (*vol)->warnings()) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", list, w);
  check::ScrubOptions so;
  so.readonly = a.readonly;
  auto r = check::ScrubVolume(**vol, so);
  if (!r.ok()) {
    fmt::print(stderr, "ubtrfs: scrub: {}: {}\n", list, r.status().ToString());
    return SetExitCode(1);
  }
  if (a.json) {
    fmt::print("{}\n", check::ScrubJson(*r));
  } else {
    for (const auto& e : r->errors) fmt::print(stderr, "ubtrfs: scrub: {}\n", e);
    if (r->error_lines_dropped) fmt::print(stderr, "ubtrfs: scrub: ... and {} more\n", r->error_lines_dropped);
    fmt::print("{}", check::ScrubSummary(*r));
  }
  if (r->uncorrectable > 0 || r->unrepaired > 0) SetExitCode(3);
}

}  // namespace

void RegisterScrub(CLI::App& app) {
  static ScrubArgs args;
  auto* cmd = app.add_subcommand(
      "scrub", "Read every copy of every tree block and checksummed data sector, verify it, and rewrite bad copies "
               "from good ones (as btrfs scrub start -B); exit 3 when errors are left");
  cmd->add_option("images", args.images, "The filesystem's devices (or one, with --scan)")->required();
  cmd->add_flag("-r,--readonly", args.readonly, "Only report; write nothing");
  cmd->add_flag("--json", args.json, "Print the result as one JSON object");
  cmd->callback([] { CmdScrub(args); });
}

}  // namespace ubtrfs::cli
