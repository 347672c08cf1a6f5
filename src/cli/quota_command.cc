// `ubtrfs quota rescan IMAGE`: every quota group counted anew, as
// `btrfs quota rescan -w` on a mount (the numbers of an image the kernel
// marked inconsistent, or left in the middle of a rescan).
#include <fmt/core.h>

#include <string>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {

std::string rescan_image;

void Rescan() {
  OpenOptions o;
  o.writable = true;
  PlacementInto(&o);
  auto fs = Filesystem::Open(rescan_image, o);
  Status st = fs.ok() ? (*fs)->RescanQuotas() : fs.status();
  if (!st.ok()) {
    fmt::print(stderr, "ubtrfs: quota rescan: {}: {}\n", rescan_image, st.ToString());
    return SetExitCode(st.code() == EINVAL || st.code() == ENOENT ? 2 : 1);
  }
  fmt::print("quota rescan finished\n");
}

}  // namespace

void RegisterQuota(CLI::App& app) {
  auto* q = app.add_subcommand("quota", "Quota groups, as btrfs quota");
  q->require_subcommand(1);
  auto* rescan = q->add_subcommand("rescan", "Count every quota group of IMAGE anew (and clear INCONSISTENT)");
  rescan->add_option("image", rescan_image, "IMAGE")->required();
  rescan->callback(Rescan);
}

}  // namespace ubtrfs::cli
