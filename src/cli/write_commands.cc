// Commands that change an image: cp into it, rm, mkdir.
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include "cli/commands.h"
#include "fs/import.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {

void Report(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: {}: {}\n", what, st.ToString());
  SetExitCode(1);
}

std::unique_ptr<Filesystem> OpenWritable(const std::string& image) {
  OpenOptions o;
  o.writable = true;
  o.node_cache_bytes = 16ull << 20;  // writes go through the transaction, not the read cache
  SubvolOptionsInto(&o);
  auto fs = Filesystem::Open(image, o);
  if (!fs.ok()) {
    Report(image, fs.status());
    return nullptr;
  }
  for (const auto& w : (*fs)->Warnings()) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", image, w);
  return std::move(*fs);
}

// "a/b/c" -> ("a/b", "c"), ignoring trailing slashes.
std::pair<std::string, std::string> SplitLast(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {"/", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

void Commit(Filesystem& fs, const std::string& image) {
  Status st = fs.Commit();
  if (!st.ok()) Report(image + ": commit", st);
}

Status RemoveRecursive(Filesystem& fs, InodeId dir, const std::string& name) {
  UB_ASSIGN_OR_RETURN(InodeId id, fs.LookupChild(dir, name));
  UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(id));
  if (!S_ISDIR(st.mode)) return fs.Unlink(dir, name);
  UB_ASSIGN_OR_RETURN(auto entries, fs.ReadDir(id));
  for (const auto& e : entries) UB_RETURN_IF_ERROR(RemoveRecursive(fs, id, e.name));
  return fs.Rmdir(dir, name);
}

void CmdRm(const std::string& target, bool recursive) {
  std::string image, path;
  if (!SplitImagePath(target, &image, &path)) {
    fmt::print(stderr, "ubtrfs: rm: expected IMAGE:PATH, got '{}'\n", target);
    return SetExitCode(2);
  }
  auto fs = OpenWritable(image);
  if (!fs) return;
  auto [parent, name] = SplitLast(path);
  if (name.empty() || name == "/") {
    fmt::print(stderr, "ubtrfs: rm: refusing to remove the top directory\n");
    return SetExitCode(2);
  }
  auto dir = fs->Lookup(parent);
  if (!dir.ok()) return Report(parent, dir.status());
  auto id = fs->LookupChild(*dir, name);
  if (!id.ok()) return Report(path, id.status());
  auto st = fs->GetStat(*id);
  if (!st.ok()) return Report(path, st.status());
  Status r = S_ISDIR(st->mode) ? (recursive ? RemoveRecursive(*fs, *dir, name) : fs->Rmdir(*dir, name))
                               : fs->Unlink(*dir, name);
  if (!r.ok()) return Report(path, r);
  Commit(*fs, image);
}

void CmdMkdir(const std::string& target, bool parents, uint32_t mode) {
  std::string image, path;
  if (!SplitImagePath(target, &image, &path)) {
    fmt::print(stderr, "ubtrfs: mkdir: expected IMAGE:PATH, got '{}'\n", target);
    return SetExitCode(2);
  }
  auto fs = OpenWritable(image);
  if (!fs) return;
  InodeId cur = fs->Root();
  size_t pos = 0;
  while (pos < path.size()) {
    size_t slash = path.find('/', pos);
    std::string comp = path.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    pos = slash == std::string::npos ? path.size() : slash + 1;
    if (comp.empty() || comp == ".") continue;
    const bool last = path.find_first_not_of('/', pos) == std::string::npos;
    auto next = fs->LookupChild(cur, comp);
    if (next.ok() && (!last || parents)) {
      cur = *next;
      continue;
    }
    if (!last && !parents) return Report(path, next.ok() ? Status::Ok() : next.status());
    NewInode a;
    a.mode = mode;
    a.uid = geteuid();
    a.gid = getegid();
    auto made = fs->Mkdir(cur, comp, a);
    if (!made.ok()) return Report(path, made.status());
    cur = *made;
  }
  Commit(*fs, image);
}

}  // namespace

bool SplitImagePath(const std::string& arg, std::string* image, std::string* path) {
  const size_t colon = arg.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  struct stat st;
  const std::string candidate = arg.substr(0, colon);
  if (::stat(candidate.c_str(), &st) != 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) return false;
  *image = candidate;
  *path = arg.substr(colon + 1);
  if (path->empty()) *path = "/";
  return true;
}

void CopyIn(const std::string& host, const std::string& image, const std::string& path) {
  struct stat hst;
  if (::lstat(host.c_str(), &hst) != 0) {
    fmt::print(stderr, "ubtrfs: cp: {}: {}\n", host, strerror(errno));
    return SetExitCode(1);
  }
  auto fs = OpenWritable(image);
  if (!fs) return;
  // Like cp -r: into an existing directory under the source's own name,
  // else as the named path.
  std::string base = host;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  base = base.substr(base.find_last_of('/') + 1);
  InodeId dir;
  std::string name;
  auto target = fs->Lookup(path);
  if (target.ok()) {
    auto st = fs->GetStat(*target);
    if (!st.ok()) return Report(path, st.status());
    if (!S_ISDIR(st->mode)) return Report(path, Status::Error(EEXIST, "exists"));
    dir = *target;
    name = base;
  } else {
    auto [parent, last] = SplitLast(path);
    auto p = fs->Lookup(parent);
    if (!p.ok()) return Report(parent, p.status());
    dir = *p;
    name = last;
  }
  fs::ImportStats stats;
  fs::ImportOptions options;
  const bool tty = ::isatty(2);
  if (tty) {
    options.progress = [](const fs::ImportStats& s) {
      fmt::print(stderr, "\rubtrfs: {} files, {} directories, {} MiB", s.files, s.dirs, s.bytes >> 20);
    };
  }
  Status st = fs::ImportTree(*fs, host, dir, name, options, &stats);
  if (tty && stats.files + stats.dirs >= 4096) fmt::print(stderr, "\n");
  if (!st.ok()) return Report(host, st);
  Commit(*fs, image);
}

void RegisterWriteCommands(CLI::App& app) {
  static std::string target;
  static bool recursive = false, parents = false;
  static std::string mode_text = "755";

  auto* rm = app.add_subcommand("rm", "Remove a file or directory from an image (IMAGE:PATH)");
  rm->add_flag("-r,--recursive", recursive, "Remove directories and their contents");
  rm->add_option("target", target, "IMAGE:PATH")->required();
  rm->callback([] { CmdRm(target, recursive); });

  auto* mkdir = app.add_subcommand("mkdir", "Create a directory in an image (IMAGE:PATH)");
  mkdir->add_flag("-p,--parents", parents, "Create missing parents; no error if it exists");
  mkdir->add_option("-m,--mode", mode_text, "Permission bits, octal")->default_val("755");
  mkdir->add_option("target", target, "IMAGE:PATH")->required();
  mkdir->callback([] {
    char* end = nullptr;
    const unsigned long m = std::strtoul(mode_text.c_str(), &end, 8);
    if (!end || *end || m > 07777) {
      fmt::print(stderr, "ubtrfs: mkdir: bad mode '{}'\n", mode_text);
      return SetExitCode(2);
    }
    CmdMkdir(target, parents, static_cast<uint32_t>(m));
  });
}

}  // namespace ubtrfs::cli
