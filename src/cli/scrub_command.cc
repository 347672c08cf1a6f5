// scrub: every copy of every tree block and checksummed data sector read and
// verified, bad copies rewritten from good ones (ubtrfs/check.h). Exit codes
// as btrfs scrub start -B: 0 nothing wrong (or all of it repaired), 3 errors
// left (uncorrectable, or not repaired with --readonly), 1 operational error.
#include <fmt/core.h>

#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "ubtrfs/check.h"

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
  ScrubOptions so;
  so.readonly = a.readonly;
  so.offset = Placement().offset;
  so.partition = Placement().partition;
  so.scan_dirs = Placement().scan_dirs;
  auto r = ScrubImage(list, so);
  if (!r.ok()) {
    fmt::print(stderr, "ubtrfs: scrub: {}\n", r.status().ToString());  // the message names the devices
    return SetExitCode(1);
  }
  for (const auto& w : r->warnings) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", list, w);
  if (a.json) {
    fmt::print("{}\n", ScrubJson(*r));
  } else {
    for (const auto& e : r->errors) fmt::print(stderr, "ubtrfs: scrub: {}\n", e);
    if (r->error_lines_dropped) fmt::print(stderr, "ubtrfs: scrub: ... and {} more\n", r->error_lines_dropped);
    fmt::print("{}", ScrubSummary(*r));
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
