// device add | remove: a device joins or leaves a filesystem, offline (as
// btrfs device add / remove on a mounted one). Through ubtrfs/resize.h.
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

struct DeviceArgs {
  std::vector<std::string> args;  // IMAGE... then NEWDEV, or DEVID|PATH
  bool force = false;
  bool quiet = false;
};

bool CheckArgs(const char* verb, const DeviceArgs& a) {
  if (Placement().offset != 0 || Placement().partition != 0) {
    fmt::print(stderr, "ubtrfs device {}: works on whole images and devices; --offset and --partition are not supported\n",
               verb);
    SetExitCode(2);
    return false;
  }
  const std::string v = verb;
  const std::string what = v == "add"       ? "the new device"
                           : v == "replace" ? "the device to replace (its devid, path or 'missing') and the new device"
                                            : "the device to remove (its devid, path or 'missing')";
  const size_t need = v == "replace" ? 3 : 2;
  if (a.args.size() < need) {
    fmt::print(stderr, "ubtrfs device {}: name the filesystem's devices (or one with --scan DIR) and then {}\n", verb,
               what);
    SetExitCode(2);
    return false;
  }
  return true;
}

DeviceChangeOptions Options(const DeviceArgs& a) {
  DeviceChangeOptions o;
  o.scan_dirs = Placement().scan_dirs;
  o.force = a.force;
  o.degraded = Placement().degraded;
  return o;
}

void CmdAdd(const DeviceArgs& a) {
  if (!CheckArgs("add", a)) return;
  const std::vector<std::string> devices(a.args.begin(), a.args.end() - 1);
  const std::string& dev = a.args.back();
  DeviceChangeResult r;
  if (Status s = AddDevice(devices, dev, Options(a), &r); !s.ok()) {
    fmt::print(stderr, "ubtrfs device add: {}: {}\n", dev, s.ToString());
    return SetExitCode(1);
  }
  if (a.quiet) return;
  fmt::print("Added {} as device {}: {} devices, {} bytes ({})\n", dev, r.devid, r.num_devices, r.total_bytes,
             Human(r.total_bytes));
}

void CmdRemove(const DeviceArgs& a) {
  if (!CheckArgs("remove", a)) return;
  const std::vector<std::string> devices(a.args.begin(), a.args.end() - 1);
  const std::string& which = a.args.back();
  DeviceChangeResult r;
  if (Status s = RemoveDevice(devices, which, Options(a), &r); !s.ok()) {
    fmt::print(stderr, "ubtrfs device remove: {}: {}\n", which, s.ToString());
    return SetExitCode(1);
  }
  PrintCopyCheck("device remove", r.copy_check);
  if (a.quiet) return;
  fmt::print("Removed device {} ({}): {} devices left, {} bytes ({})", r.devid, which, r.num_devices, r.total_bytes,
             Human(r.total_bytes));
  if (r.stripes_moved || r.chunks_restriped) {
    fmt::print("; moved {} chunk stripes", r.stripes_moved);
    if (r.chunks_restriped) fmt::print(", restriped {} chunks over fewer devices", r.chunks_restriped);
    fmt::print(" ({} copied)", Human(r.bytes_copied));
  }
  fmt::print("\n");
}

void CmdReplace(const DeviceArgs& a) {
  if (!CheckArgs("replace", a)) return;
  const std::vector<std::string> devices(a.args.begin(), a.args.end() - 2);
  const std::string& which = a.args[a.args.size() - 2];
  const std::string& dev = a.args.back();
  DeviceChangeResult r;
  if (Status s = ReplaceDevice(devices, which, dev, Options(a), &r); !s.ok()) {
    fmt::print(stderr, "ubtrfs device replace: {}: {}\n", which, s.ToString());
    return SetExitCode(1);
  }
  PrintCopyCheck("device replace", r.copy_check);
  if (a.quiet) return;
  fmt::print("Replaced device {} ({}) by {}: {} copied\n", r.devid, which, dev, Human(r.bytes_copied));
}

}  // namespace

void RegisterDevice(CLI::App& app) {
  static DeviceArgs add_args, remove_args, replace_args;
  auto* dev = app.add_subcommand("device", "Add, remove or replace a device of a filesystem, offline (as btrfs device "
                                            "and btrfs replace)");
  dev->require_subcommand(1);
  auto* add = dev->add_subcommand("add", "Add NEWDEV (an existing image file or block device) to the filesystem");
  add->add_option("devices", add_args.args, "IMAGE... (the filesystem's devices) then NEWDEV")->required();
  add->add_flag("-f,--force", add_args.force, "Overwrite a btrfs filesystem on NEWDEV");
  add->add_flag("-q,--quiet", add_args.quiet, "Print nothing on success");
  add->fallthrough();  // --scan and the like after `add`, too
  add->callback([] { CmdAdd(add_args); });
  auto* rm = dev->add_subcommand(
      "remove", "Move every chunk off a device (DEVID or PATH) and take it out of the filesystem");
  rm->alias("delete");
  rm->add_option("devices", remove_args.args,
                 "IMAGE... (the filesystem's devices) then DEVID, PATH or 'missing' (a device that is gone: its "
                 "chunks rebuilt from the other copies or parity)")
      ->required();
  rm->add_flag("-q,--quiet", remove_args.quiet, "Print nothing on success");
  rm->fallthrough();
  rm->callback([] { CmdRemove(remove_args); });
  auto* rep = dev->add_subcommand(
      "replace", "Copy a device (DEVID, PATH or 'missing') onto NEWDEV, which takes its place (as btrfs replace)");
  rep->add_option("devices", replace_args.args, "IMAGE... (the filesystem's devices), the device to replace, NEWDEV")
      ->required();
  rep->add_flag("-f,--force", replace_args.force, "Overwrite a btrfs filesystem on NEWDEV");
  rep->add_flag("-q,--quiet", replace_args.quiet, "Print nothing on success");
  rep->fallthrough();
  rep->callback([] { CmdReplace(replace_args); });
}

}  // namespace ubtrfs::cli
