// check: a read-only consistency check of an image (ubtrfs/check.h), with
// fsck's exit codes: 0 clean, 1 errors found, 8 operational error (the image
// cannot be opened or is not btrfs, unsupported features, bad arguments).
#include <fmt/core.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "ubtrfs/check.h"

namespace ubtrfs::cli {
namespace {

constexpr int kExitErrors = 1;
constexpr int kExitOperational = 8;

struct CheckArgs {
  std::string image;
  bool json = false;
  bool check_data_csum = false;
  size_t max_errors = 2000;
  bool backup = false;
  uint64_t tree_root = 0;
  int super_mirror = -1;
};

void CmdCheck(const CheckArgs& a, const std::vector<std::string>& extra) {
  if (!extra.empty() || a.image.empty()) {
    const std::string what = extra.empty() ? "missing IMAGE" : "unexpected argument '" + extra.front() + "'";
    fmt::print(stderr, "ubtrfs check: {}\nusage: ubtrfs check IMAGE [--json] [--check-data-csum] [-b] [-r BYTENR] [-s N]\n", what);
    SetExitCode(kExitOperational);
    return;
  }
  CheckOptions opts;
  opts.check_data_csum = a.check_data_csum;
  opts.max_errors = a.max_errors;
  opts.offset = Placement().offset;
  opts.partition = Placement().partition;
  opts.scan_dirs = Placement().scan_dirs;
  opts.use_backup_root = a.backup;
  opts.tree_root = a.tree_root;
  opts.super_mirror = a.super_mirror;
  auto r = CheckImage(a.image, opts);
  if (!r.ok()) {
    if (a.json) {
      CheckResult failed;
      failed.error_count = 1;
      failed.errors.push_back("cannot check: " + r.status().ToString());
      fmt::print("{}\n", CheckJson(failed));
    }
    fmt::print(stderr, "ubtrfs check: {}\n", r.status().ToString());  // the message names the image
    SetExitCode(kExitOperational);
    return;
  }
  const CheckResult& res = *r;
  if (a.json) {
    fmt::print("{}\n", CheckJson(res));
  } else {
    for (const auto& w : res.warnings) fmt::print("WARNING: {}\n", w);
    for (const auto& e : res.errors) fmt::print("ERROR: {}\n", e);
    if (res.error_count > res.errors.size()) {
      fmt::print("ERROR: ... and {} more error(s)\n", res.error_count - res.errors.size());
    }
    std::string counts;
    for (const auto& [k, v] : res.counts) counts += fmt::format("{}{}={}", counts.empty() ? "" : " ", k, v);
    fmt::print("{}\n", counts);
    if (res.clean()) {
      fmt::print("{}: no errors found\n", a.image);
    } else {
      fmt::print("{}: {} error(s) found\n", a.image, res.error_count);
    }
  }
  std::fflush(stdout);
  if (!res.clean()) SetExitCode(kExitErrors);
}

}  // namespace

void RegisterCheck(CLI::App& app) {
  static CheckArgs args;
  auto* cmd = app.add_subcommand("check", "Check an image for consistency, read-only (like btrfs check --readonly); "
                                          "exit 0 clean, 1 errors found, 8 operational error");
  cmd->add_option("image", args.image, "Image file or block device");
  cmd->add_flag("--json", args.json, "Print the result as one JSON object {errors, warnings, counts, clean}");
  cmd->add_flag("--check-data-csum", args.check_data_csum, "Also read all checksummed data and verify it");
  cmd->add_option("--max-errors", args.max_errors, "Error lines to print at most (0: all); all are counted");
  cmd->add_flag("-b,--backup", args.backup,
                "When the superblock's root tree does not read, check the newest backup root that does");
  cmd->add_option("-r,--tree-root", args.tree_root,
                  "Check the commit whose root tree's root is the block at this logical address (inspect "
                  "find-root lists them)");
  cmd->add_option("-s,--super", args.super_mirror, "Use superblock copy N (0, 1 or 2), not the best valid one");
  // Bad arguments are an operational error (8), not CLI11's own exit code.
  cmd->allow_extras();
  cmd->callback([cmd] { CmdCheck(args, cmd->remaining()); });
}

}  // namespace ubtrfs::cli
