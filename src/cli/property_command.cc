// `ubtrfs property get IMAGE:PATH [ro|compression]` and `ubtrfs property
// set IMAGE:PATH ro true|false | compression zlib|lzo|zstd|no|none|""`: a
// subvolume's read-only flag and an inode's compression property (the
// btrfs.compression xattr), as btrfs-progs' property command on a mount.
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

constexpr std::string_view kCompression = "btrfs.compression";

void Run(const PropertyArgs& a, bool set) {
  std::string image, path;
  if (!SplitImagePath(a.target, &image, &path)) {
    fmt::print(stderr, "ubtrfs: property: expected IMAGE:PATH, got '{}'\n", a.target);
    return SetExitCode(2);
  }
  if (!a.name.empty() && a.name != "ro" && a.name != "compression") {
    fmt::print(stderr, "ubtrfs: property: unknown property '{}' (ubtrfs knows: ro, compression)\n", a.name);
    return SetExitCode(2);
  }
  bool ro = false;
  if (set && a.name == "ro") {
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
    // As btrfs property get: ro of a subvolume's top, compression of any
    // inode when it has one (nothing printed otherwise).
    if (a.name != "compression") {
      auto flag = (*fs)->SubvolumeReadOnly(*id);
      if (!flag.ok() && !a.name.empty()) return Fail(a.target, flag.status());
      if (flag.ok()) fmt::print("ro={}\n", *flag ? "true" : "false");
    }
    if (a.name != "ro") {
      auto v = (*fs)->GetXattr(*id, kCompression);
      if (v.ok() && !v->empty()) fmt::print("compression={}\n", *v);
      if (!v.ok() && v.status().code() != ENODATA) return Fail(a.target, v.status());
    }
    return;
  }
  Status st;
  if (a.name == "ro") {
    st = (*fs)->SetSubvolumeReadOnly(*id, ro);
  } else if (a.value.empty()) {  // no property: the mount option decides again
    st = (*fs)->RemoveXattr(*id, kCompression);
    if (st.code() == ENODATA) st = Status::Ok();
  } else {  // zlib, lzo, zstd, or no / none (never compress); checked by the library
    st = (*fs)->SetXattr(*id, kCompression, a.value);
  }
  if (!st.ok()) return Fail(a.target, st);
  if (Status c = (*fs)->Commit(); !c.ok()) return Fail(image + ": commit", c);
}

}  // namespace

void RegisterProperty(CLI::App& app) {
  static PropertyArgs get_args, set_args;
  auto* prop = app.add_subcommand("property", "Get or set properties (ro, compression), as btrfs property");
  prop->require_subcommand(1);
  auto* get = prop->add_subcommand("get", "Print a subvolume's ro or an inode's compression property (IMAGE:PATH [NAME])");
  get->add_option("target", get_args.target, "IMAGE:PATH (a subvolume's top for ro)")->required();
  get->add_option("name", get_args.name, "Property name (ro, compression)");
  AddSubvolOptions(get);
  get->callback([] { Run(get_args, false); });
  auto* set = prop->add_subcommand("set", "Set a property (IMAGE:PATH ro true|false, or compression zlib|lzo|zstd|no|none|\"\")");
  set->add_option("target", set_args.target, "IMAGE:PATH (a subvolume's top for ro)")->required();
  set->add_option("name", set_args.name, "Property name (ro, compression)")->required();
  set->add_option("value", set_args.value, "ro: true or false; compression: zlib, lzo, zstd, no, none or \"\" (unset)")->required();
  AddSubvolOptions(set);
  set->callback([] { Run(set_args, true); });
}

}  // namespace ubtrfs::cli
