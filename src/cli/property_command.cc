// `ubtrfs property get IMAGE:PATH [ro]` and `ubtrfs property set IMAGE:PATH
// ro true|false`: a subvolume's read-only flag, as btrfs-progs' property
// command on a mounted subvolume.
#include <fmt/core.h>

#include <string>

#include "cli/commands.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {

struct PropertyArgs {
  std::string target, name, value;
};

void Fail(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: property: {}: {}\n", what, st.ToString());
  SetExitCode(1);
}

void Run(const PropertyArgs& a, bool set) {
  std::string image, path;
  if (!SplitImagePath(a.target, &image, &path)) {
    fmt::print(stderr, "ubtrfs: property: expected IMAGE:PATH, got '{}'\n", a.target);
    return SetExitCode(2);
  }
  if (!a.name.empty() && a.name != "ro") {
    fmt::print(stderr, "ubtrfs: property: unknown property '{}' (ubtrfs knows: ro)\n", a.name);
    return SetExitCode(2);
  }
  bool ro = false;
  if (set) {
    if (a.value == "true") {
      ro = true;
    } else if (a.value != "false") {
      fmt::print(stderr, "ubtrfs: property: ro takes true or false, not '{}'\n", a.value);
      return SetExitCode(2);
    }
  }
  OpenOptions o;
  o.writable = set;
  auto fs = OpenImage(image, o);
  if (!fs.ok()) return Fail(image, fs.status());
  auto id = (*fs)->Lookup(path);
  if (!id.ok()) return Fail(a.target, id.status());
  if (!set) {
    auto flag = (*fs)->SubvolumeReadOnly(*id);
    if (!flag.ok()) return Fail(a.target, flag.status());
    fmt::print("ro={}\n", *flag ? "true" : "false");
    return;
  }
  if (Status st = (*fs)->SetSubvolumeReadOnly(*id, ro); !st.ok()) return Fail(a.target, st);
  if (Status st = (*fs)->Commit(); !st.ok()) return Fail(image + ": commit", st);
}

}  // namespace

void RegisterProperty(CLI::App& app) {
  static PropertyArgs get_args, set_args;
  auto* prop = app.add_subcommand("property", "Get or set a subvolume's properties (ro), as btrfs property");
  prop->require_subcommand(1);
  auto* get = prop->add_subcommand("get", "Print a subvolume's ro property (IMAGE:PATH [ro])");
  get->add_option("target", get_args.target, "IMAGE:PATH of a subvolume's top")->required();
  get->add_option("name", get_args.name, "Property name (ro)");
  AddSubvolOptions(get);
  get->callback([] { Run(get_args, false); });
  auto* set = prop->add_subcommand("set", "Set a subvolume's ro property (IMAGE:PATH ro true|false)");
  set->add_option("target", set_args.target, "IMAGE:PATH of a subvolume's top")->required();
  set->add_option("name", set_args.name, "Property name (ro)")->required();
  set->add_option("value", set_args.value, "true or false")->required();
  AddSubvolOptions(set);
  set->callback([] { Run(set_args, true); });
}

}  // namespace ubtrfs::cli
