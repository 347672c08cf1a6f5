// `ubtrfs subvolume create|snapshot|delete|list|get-default|set-default`, in btrfs-progs' words and
// output format, on an image instead of a mount.
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/text.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {

struct SubvolArgs {
  std::vector<std::string> targets;
  std::string image;
  bool read_only = false;
  bool json = false;
};

void Fail(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: subvolume: {}: {}\n", what, st.ToString());
  SetExitCode(1);
}

// Wrong arguments exit 2, as the other subcommands; a failed open 1.
void FailOpen(const Status& st) {
  fmt::print(stderr, "ubtrfs: subvolume: {}\n", st.ToString());
  SetExitCode(st.code() == EINVAL ? 2 : 1);
}

std::string Uuid(const std::array<uint8_t, 16>& u) {
  bool zero = true;
  for (uint8_t b : u) zero &= b == 0;
  if (zero) return "-";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += fmt::format("{:02x}", u[i]);
  }
  return s;
}

// Opens the image all targets name; their paths in *paths.
Result<std::unique_ptr<Filesystem>> OpenTargets(const std::vector<std::string>& targets, bool writable,
                                                std::vector<std::string>* paths) {
  std::string image;
  for (const std::string& t : targets) {
    std::string img, path;
    if (!SplitImagePath(t, &img, &path)) return Status::Invalid("expected IMAGE:PATH, got '" + t + "'");
    if (!image.empty() && img != image) return Status::Invalid("all paths must be in one image");
    image = img;
    paths->push_back(path);
  }
  OpenOptions o;
  o.writable = writable;
  auto fs = OpenImage(image, o);
  if (!fs.ok()) return fs.status().WithContext(image);
  return std::move(*fs);
}

// Runs `op` on the parent directory and name of each target, in order,
// printing `done` with the path after each; stops at the first failure.
void ForEachTarget(const std::vector<std::string>& targets, const char* done,
                   const std::function<Status(Filesystem&, InodeId, const std::string&)>& op) {
  std::vector<std::string> paths;
  auto fs = OpenTargets(targets, true, &paths);
  if (!fs.ok()) return FailOpen(fs.status());
  for (const std::string& p : paths) {
    auto [dir_path, name] = SplitLast(p);
    auto dir = (*fs)->Lookup(dir_path.empty() ? "/" : dir_path);
    if (!dir.ok()) return Fail(p, dir.status());
    if (Status st = op(**fs, *dir, name); !st.ok()) return Fail(p, st);
    fmt::print("{} '{}'\n", done, p);
  }
}

void Create(const SubvolArgs& a) {
  ForEachTarget(a.targets, "Create subvolume", [](Filesystem& fs, InodeId dir, const std::string& name) {
    NewInode attrs;
    const mode_t mask = ::umask(0);
    ::umask(mask);
    attrs.mode = 0755 & ~mask;
    attrs.uid = ::geteuid();
    attrs.gid = ::getegid();
    return fs.CreateSubvolume(dir, name, attrs).status();
  });
}

void Snapshot(const SubvolArgs& a) {
  if (a.targets.size() != 2) {
    fmt::print(stderr, "ubtrfs: subvolume snapshot: expected IMAGE:SOURCE IMAGE:DEST\n");
    return SetExitCode(2);
  }
  std::vector<std::string> paths;
  auto fs = OpenTargets(a.targets, true, &paths);
  if (!fs.ok()) return FailOpen(fs.status());
  auto src = (*fs)->Lookup(paths[0]);
  if (!src.ok()) return Fail(paths[0], src.status());
  // As btrfs: into DEST under the source's name when DEST is a directory.
  std::string dir_path, name;
  if (auto dest = (*fs)->Lookup(paths[1]); dest.ok()) {
    dir_path = paths[1];
    name = SplitLast(paths[0]).second;
  } else {
    std::tie(dir_path, name) = SplitLast(paths[1]);
  }
  auto dir = (*fs)->Lookup(dir_path.empty() ? "/" : dir_path);
  if (!dir.ok()) return Fail(dir_path, dir.status());
  auto snap = (*fs)->CreateSnapshot(*src, *dir, name, a.read_only);
  if (!snap.ok()) return Fail(paths[0], snap.status());
  std::string where = dir_path;
  while (!where.empty() && where.back() == '/') where.pop_back();
  fmt::print("Create {}snapshot of '{}' in '{}/{}'\n", a.read_only ? "a readonly " : "a ", paths[0], where, name);
}

void Delete(const SubvolArgs& a) {
  ForEachTarget(a.targets, "Delete subvolume", [](Filesystem& fs, InodeId dir, const std::string& name) {
    return fs.DeleteSubvolume(dir, name);
  });
}

void List(const SubvolArgs& a) {
  OpenOptions o;
  auto fs = OpenImage(a.image, o);
  if (!fs.ok()) return Fail(a.image, fs.status());
  auto list = (*fs)->ListSubvolumes();
  if (!list.ok()) return Fail(a.image, list.status());
  if (!a.json) {
    for (const auto& s : *list) {
      fmt::print("ID {} gen {} top level {} path {}\n", s.id, s.generation, s.parent_id, s.path);
    }
    return;
  }
  fmt::print("[");
  for (size_t i = 0; i < list->size(); ++i) {
    const auto& s = (*list)[i];
    fmt::print("{}\n  {{\"id\": {}, \"parent_id\": {}, \"path\": {}, \"uuid\": {}, \"parent_uuid\": {}, "
               "\"received_uuid\": {}, \"generation\": {}, \"ctransid\": {}, \"otransid\": {}, "
               "\"otime\": {}, \"read_only\": {}}}",
               i ? "," : "", s.id, s.parent_id, JsonString(s.path), JsonString(Uuid(s.uuid)),
               JsonString(Uuid(s.parent_uuid)), JsonString(Uuid(s.received_uuid)), s.generation, s.ctransid,
               s.otransid, s.otime.sec, s.read_only ? "true" : "false");
  }
  fmt::print("{}]\n", list->empty() ? "" : "\n");
}

void GetDefault(const SubvolArgs& a) {
  OpenOptions o;
  PlacementInto(&o);
  auto fs = Filesystem::Open(a.image, o);
  if (!fs.ok()) return Fail(a.image, fs.status());
  auto id = (*fs)->DefaultSubvolume();
  if (!id.ok()) return Fail(a.image, id.status());
  const SubvolumeInfo* info = nullptr;
  auto list = (*fs)->ListSubvolumes();
  if (!list.ok()) return Fail(a.image, list.status());
  for (const auto& s : *list) {
    if (s.id == *id) info = &s;
  }
  if (a.json) {
    fmt::print("{{\"id\": {}, \"path\": {}}}\n", *id, JsonString(info ? info->path : ""));
  } else if (info == nullptr) {
    fmt::print("ID 5 (FS_TREE)\n");
  } else {
    fmt::print("ID {} gen {} top level {} path {}\n", info->id, info->generation, info->parent_id, info->path);
  }
}

// set-default IMAGE:PATH (PATH a subvolume's top) or set-default ID IMAGE.
void SetDefault(const SubvolArgs& a) {
  uint64_t id = 0;
  std::unique_ptr<Filesystem> fs;
  if (a.targets.size() == 2) {
    const std::string& n = a.targets[0];
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || n.size() > 19) {
      fmt::print(stderr, "ubtrfs: subvolume set-default: expected a subvolume id, got '{}'\n", n);
      return SetExitCode(2);
    }
    id = std::stoull(n);
    OpenOptions o;
    o.writable = true;
    PlacementInto(&o);
    auto opened = Filesystem::Open(a.targets[1], o);
    if (!opened.ok()) return FailOpen(opened.status().WithContext(a.targets[1]));
    fs = std::move(*opened);
  } else if (a.targets.size() == 1) {
    std::vector<std::string> paths;
    auto opened = OpenTargets(a.targets, true, &paths);
    if (!opened.ok()) return FailOpen(opened.status());
    fs = std::move(*opened);
    auto at = fs->Lookup(paths[0]);
    if (!at.ok()) return Fail(paths[0], at.status());
    if (at->ino != kSubvolTopIno) return Fail(paths[0], Status::Error(EINVAL, "not the top of a subvolume"));
    id = at->root;
  } else {
    fmt::print(stderr, "ubtrfs: subvolume set-default: expected IMAGE:PATH, or ID IMAGE\n");
    return SetExitCode(2);
  }
  if (Status st = fs->SetDefaultSubvolume(id); !st.ok()) return Fail(std::to_string(id), st);
}

}  // namespace

void RegisterSubvolume(CLI::App& app) {
  static SubvolArgs create_args, snap_args, delete_args, list_args, get_default_args, set_default_args;
  auto* sv = app.add_subcommand("subvolume", "Create, snapshot, delete and list subvolumes, as btrfs subvolume");
  sv->require_subcommand(1);
  auto* create = sv->add_subcommand("create", "Create an empty subvolume at each IMAGE:PATH");
  create->add_option("targets", create_args.targets, "IMAGE:PATH of the new subvolume")->required();
  AddSubvolOptions(create);
  create->callback([] { Create(create_args); });
  auto* snap = sv->add_subcommand("snapshot", "Snapshot the subvolume IMAGE:SOURCE as IMAGE:DEST (or into DEST)");
  snap->add_flag("-r", snap_args.read_only, "Make a read-only snapshot");
  snap->add_option("targets", snap_args.targets, "IMAGE:SOURCE IMAGE:DEST")->required()->expected(2);
  AddSubvolOptions(snap);
  snap->callback([] { Snapshot(snap_args); });
  auto* del = sv->add_subcommand("delete", "Delete the subvolume or snapshot at each IMAGE:PATH");
  del->add_option("targets", delete_args.targets, "IMAGE:PATH of a subvolume")->required();
  AddSubvolOptions(del);
  del->callback([] { Delete(delete_args); });
  auto* list = sv->add_subcommand("list", "List the subvolumes and snapshots of IMAGE");
  list->add_option("image", list_args.image, "Image file or block device")->required();
  list->add_flag("--json", list_args.json, "Print a JSON array");
  AddSubvolOptions(list);
  list->callback([] { List(list_args); });
  auto* getdef = sv->add_subcommand("get-default", "Show the default subvolume of IMAGE (where paths and mounts start)");
  getdef->add_option("image", get_default_args.image, "Image file or block device")->required();
  getdef->add_flag("--json", get_default_args.json, "Print a JSON object");
  getdef->callback([] { GetDefault(get_default_args); });
  auto* setdef = sv->add_subcommand("set-default", "Make the subvolume at IMAGE:PATH (or ID in IMAGE) the default");
  setdef->add_option("targets", set_default_args.targets, "IMAGE:PATH, or ID IMAGE")->required()->expected(1, 2);
  AddSubvolOptions(setdef);
  setdef->callback([] { SetDefault(set_default_args); });
}

}  // namespace ubtrfs::cli
