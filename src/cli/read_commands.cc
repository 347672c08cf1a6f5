// info, ls, cat, cp: the read-only subcommands.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <optional>
#include <fmt/core.h>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/text.h"
#include "ubtrfs/export.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs::cli {
namespace {

void PrintError(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: {}: {}\n", what, st.ToString());
  HintRescue(st);
}

std::unique_ptr<Filesystem> OpenOrReport(const std::string& image) {
  OpenOptions o;
  auto fs = OpenImage(image, o);
  if (!fs.ok()) {
    PrintError(image, fs.status());
    SetExitCode(1);
    return nullptr;
  }
  for (const auto& w : (*fs)->Warnings()) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", image, w);
  return std::move(*fs);
}

bool g_json = false;  // --json of info and ls

std::string DevidList(const std::vector<uint64_t>& ids) {
  std::string out;
  for (uint64_t d : ids) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return out;
}

// `member_alone`: `i` is what a member's own superblock says, because the
// filesystem cannot be opened from the devices given (a RAID0 member
// alone): the superblock does not list the devices, so the missing ones are
// every devid up to num_devices that was not given.
void PrintInfo(const FsInfo& i, bool member_alone) {
  if (g_json) {
    fmt::print("{{\"label\": {}, \"fsid\": \"{}\", \"generation\": {}, \"sectorsize\": {}, \"nodesize\": {}, "
               "\"checksum\": \"{}\", \"total_bytes\": {}, \"bytes_used\": {}, \"devices\": {}, "
               "\"devid\": {}, \"missing_devices\": [{}], "
               "\"incompat\": {}, \"compat_ro\": {}, \"superblock_copy\": {}, \"opened\": {}}}\n",
               JsonString(i.label), i.fsid, i.generation, i.sectorsize, i.nodesize, i.csum_type, i.total_bytes,
               i.bytes_used, i.num_devices, i.devid, DevidList(i.devices_missing),
               JsonString(IncompatFeatureNames(i.incompat_flags)), JsonString(CompatRoFeatureNames(i.compat_ro_flags)),
               i.superblock_mirror, member_alone ? "false" : "true");
    return;
  }
  fmt::print("label:            {}\n", i.label);
  fmt::print("fsid:             {}\n", i.fsid);
  fmt::print("generation:       {}\n", i.generation);
  fmt::print("sectorsize:       {}\n", i.sectorsize);
  fmt::print("nodesize:         {}\n", i.nodesize);
  fmt::print("checksum:         {}\n", i.csum_type);
  fmt::print("total bytes:      {}\n", i.total_bytes);
  fmt::print("bytes used:       {}\n", i.bytes_used);
  fmt::print("devices:          {}\n", i.num_devices);
  if (i.num_devices > 1 || member_alone) {
    fmt::print("this device:      {}\n", i.devid);
    const std::string missing = i.devices_missing.empty() ? "none" : DevidList(i.devices_missing);
    fmt::print("missing devices:  {}{}\n", missing, member_alone ? " (by devid; not opened)" : "");
  }
  fmt::print("incompat:         {}\n", IncompatFeatureNames(i.incompat_flags));
  fmt::print("compat_ro:        {}\n", CompatRoFeatureNames(i.compat_ro_flags));
  fmt::print("superblock copy:  {}\n", i.superblock_mirror);
}

void CmdInfo(const std::string& image) {
  OpenOptions o;
  auto opened = OpenImage(image, o);
  if (!opened.ok()) {
    auto member = ReadMemberInfo(image, o);
    if (!member.ok()) {
      PrintError(image, opened.status());
      SetExitCode(1);
      return;
    }
    fmt::print(stderr, "ubtrfs: warning: {}: the filesystem cannot be read from the devices given: {}\n", image,
               opened.status().ToString());
    return PrintInfo(*member, /*member_alone=*/true);
  }
  for (const auto& w : (*opened)->Warnings()) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", image, w);
  PrintInfo((*opened)->Info(), /*member_alone=*/false);
}

void PrintLong(Filesystem& fs, const std::string& name, InodeId id) {
  auto st = fs.GetStat(id);
  if (!st.ok()) {
    PrintError(name, st.status());
    SetExitCode(1);
    return;
  }
  std::string line = fmt::format("{} {:>3} {:>5} {:>5} {:>10} {} {}", ModeString(st->mode), st->nlink, st->uid,
                                 st->gid, st->size, TimeString(st->mtime), Printable(name));
  if (S_ISLNK(st->mode)) {
    auto target = fs.ReadLink(id);
    line += " -> " + (target.ok() ? Printable(*target) : "?");
  }
  fmt::print("{}\n", line);
}

}  // namespace

Status ListPath(Filesystem& fs, const std::string& path, bool long_format, bool json) {
  UB_ASSIGN_OR_RETURN(InodeId id, fs.Lookup(path));
  UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(id));
  if (!S_ISDIR(st.mode)) {
    if (long_format) PrintLong(fs, path, id);
    else fmt::print("{}\n", Printable(path));
    return Status::Ok();
  }
  std::vector<SkippedEntry> skipped;
  UB_ASSIGN_OR_RETURN(auto entries, fs.ReadDir(id, &skipped));
  for (const auto& s : skipped) WarnSkipped(path, s);
  if (json) {
    std::string out;
    for (const auto& e : entries) {
      auto es = fs.GetStat(e.id);
      if (!es.ok()) {
        PrintError(e.name, es.status());
        SetExitCode(1);
        continue;
      }
      std::string target;
      if (S_ISLNK(es->mode)) {
        auto t = fs.ReadLink(e.id);
        if (t.ok()) target = ", \"target\": " + JsonString(*t);
      }
      out += fmt::format("{}{{\"name\": {}, \"subvolume\": {}, \"inode\": {}, \"index\": {}, \"mode\": {}, "
                         "\"nlink\": {}, \"uid\": {}, \"gid\": {}, \"size\": {}, \"mtime\": {}.{:09}{}}}",
                         out.empty() ? "" : ",\n ", JsonString(e.name), e.id.root, e.id.ino, e.index, es->mode,
                         es->nlink, es->uid, es->gid, es->size, es->mtime.sec, es->mtime.nsec, target);
    }
    fmt::print("[{}]\n", out);
    return Status::Ok();
  }
  for (const auto& e : entries) {
    if (long_format) PrintLong(fs, e.name, e.id);
    else fmt::print("{}\n", Printable(e.name));
  }
  return Status::Ok();
}

namespace {

void CmdLs(const std::string& image, const std::string& path, bool long_format) {
  auto fs = OpenOrReport(image);
  if (!fs) return;
  if (Status st = ListPath(*fs, path, long_format, g_json); !st.ok()) {
    // As ls(1) for an errno it knows; the full message for anything else.
    if (st.code() == ENOENT || st.code() == ENOTDIR || st.code() == EACCES) {
      fmt::print(stderr, "ubtrfs: ls: cannot access '{}': {}\n", Printable(path), strerror(st.code()));
    } else {
      PrintError(path, st);
    }
    // ls(1)'s "serious trouble": an argument it cannot reach.
    SetExitCode(st.code() == ENOENT || st.code() == ENOTDIR || st.code() == EACCES ? 2 : 1);
  }
}

// cat(1) of files in one image: each in turn, a failing one reported as
// "cat: PATH: error" and the rest still printed (exit 1).
void CmdCat(const std::string& image, const std::vector<std::string>& paths) {
  auto fs = OpenOrReport(image);
  if (!fs) return;
  std::vector<uint8_t> buf(1 << 20);
  for (const auto& path : paths) {
    auto fail = [&](const Status& st) {
      std::fflush(stdout);
      // cat(1)'s words for a missing or unreadable name; the library's
      // whole message (which block, what is wrong) for anything else.
      const int c = st.code();
      const bool plain = c == ENOENT || c == ENOTDIR || c == EISDIR || c == EACCES || c == ELOOP;
      fmt::print(stderr, "ubtrfs: cat: {}: {}\n", Printable(path), plain ? strerror(c) : st.ToString());
      SetExitCode(1);
    };
    auto id = fs->Lookup(path);
    if (!id.ok()) {
      fail(id.status());
      continue;
    }
    for (uint64_t off = 0;;) {
      auto n = fs->Read(*id, off, buf);
      if (!n.ok()) {
        fail(n.status());
        break;
      }
      if (*n == 0) break;
      if (fwrite(buf.data(), 1, *n, stdout) != *n) {
        fmt::print(stderr, "ubtrfs: cat: write error: {}\n", strerror(errno));
        return SetExitCode(1);
      }
      off += *n;
    }
  }
  if (std::fflush(stdout) != 0) {
    fmt::print(stderr, "ubtrfs: cat: write error: {}\n", strerror(errno));
    SetExitCode(1);
  }
}

// `cat IMAGE:PATH...` (all in one image), or `cat IMAGE PATH`.
void CmdCatArgs(const std::vector<std::string>& args) {
  std::string image, path, rest;
  if (args.size() == 2 && !SplitImagePath(args[1], &rest, &path)) return CmdCat(args[0], {args[1]});
  std::vector<std::string> paths;
  for (const auto& a : args) {
    std::string img;
    if (!SplitImagePath(a, &img, &path)) {
      fmt::print(stderr, "ubtrfs: cat: expected IMAGE:PATH, got '{}'\n", a);
      return SetExitCode(2);
    }
    if (!image.empty() && img != image) {
      fmt::print(stderr, "ubtrfs: cat: every path must be in the same image ({} and {})\n", image, img);
      return SetExitCode(2);
    }
    image = img;
    paths.push_back(path);
  }
  CmdCat(image, paths);
}

ExportOptions cp_out_options;
std::string cp_compress;  // cp in: --compress
bool cp_reflink = false;  // cp inside one image: --reflink

void CmdCp(const std::string& source, const std::string& dest) {
  std::string image, path;
  // Host -> image: the data cloned from the host files into the image file.
  if (cp_reflink && !SplitImagePath(source, &image, &path) && SplitImagePath(dest, &image, &path)) {
    if (!cp_compress.empty()) {
      fmt::print(stderr, "ubtrfs: cp: --reflink and --compress exclude each other\n");
      SetExitCode(2);
      return;
    }
    return CopyIn(source, image, path, cp_compress, true);
  }
  if (cp_reflink) {
    std::string dst_image, dst_path;
    struct stat a, b;
    const auto same_image = [&] {
      if (image.starts_with("rbd:") || dst_image.starts_with("rbd:")) return image == dst_image;
      return ::stat(image.c_str(), &a) == 0 && ::stat(dst_image.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
             a.st_ino == b.st_ino;
    };
    if (!SplitImagePath(source, &image, &path) || !SplitImagePath(dest, &dst_image, &dst_path) || !same_image()) {
      fmt::print(stderr, "ubtrfs: cp --reflink: both sides must be IMAGE:PATH in one image, got '{}' and '{}'\n",
                 source, dest);
      SetExitCode(2);
      return;
    }
    return CopyReflink(image, path, dst_path);
  }
  if (!SplitImagePath(source, &image, &path)) {
    if (SplitImagePath(dest, &image, &path)) return CopyIn(source, image, path, cp_compress);
    fmt::print(stderr, "ubtrfs: cp: one side must be IMAGE:PATH with IMAGE an existing image, got '{}' and '{}'\n",
               source, dest);
    SetExitCode(2);
    return;
  }
  auto fs = OpenOrReport(image);
  if (!fs) return;
  auto id = fs->Lookup(path);
  if (!id.ok()) {
    PrintError(path, id.status());
    SetExitCode(1);
    return;
  }
  std::string target = dest;
  struct stat st;
  const bool is_root_path = path.find_first_not_of('/') == std::string::npos;
  if (!is_root_path && ::stat(dest.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::string base = path.substr(0, path.find_last_not_of('/') + 1);
    base = base.substr(base.find_last_of('/') + 1);
    target = dest + "/" + base;
  }
  ExportOptions opts = cp_out_options;
  opts.on_message = [](bool error, std::string_view m) {
    fmt::print(stderr, "ubtrfs: {}{}\n", error ? "" : "warning: ", m);
  };
  ExportReport report;
  if (!ExportTree(*fs, *id, image + ":" + path, target, opts, &report).ok()) {
    fmt::print(stderr, "ubtrfs: cp: {} error(s); the rest was copied\n", report.errors);
    SetExitCode(1);
  }
}

}  // namespace

void RegisterReadCommands(CLI::App& app) {
  static std::string image, path, source, dest;
  static bool long_format = false;

  auto* info = app.add_subcommand("info", "Show the superblock summary of an image");
  info->add_option("image", image, "Image file or block device")->required();
  info->add_flag("--json", g_json, "As one JSON object");
  info->callback([] { CmdInfo(image); });

  auto* ls = app.add_subcommand("ls", "List a directory in an image (IMAGE [PATH], or IMAGE:PATH)");
  ls->add_flag("-l", long_format, "Long listing (mode, links, owner, size, mtime)");
  ls->add_flag("--json", g_json, "A JSON list of the entries with their attributes");
  ls->add_option("image", image, "Image file or block device, or IMAGE:PATH")->required();
  ls->add_option("path", path, "Path inside the image");
  ls->callback([] {
    std::string img, p;
    if (path.empty() && SplitImagePath(image, &img, &p)) return CmdLs(img, p, long_format);
    CmdLs(image, path.empty() ? "/" : path, long_format);
  });

  static std::vector<std::string> cat_args;
  auto* cat = app.add_subcommand("cat", "Write files of an image to stdout (IMAGE:PATH..., or IMAGE PATH)");
  cat->add_option("files", cat_args, "IMAGE:PATH..., or IMAGE PATH")->required();
  cat->callback([] { CmdCatArgs(cat_args); });

  auto* cp = app.add_subcommand("cp", "Copy a file or tree out of an image (IMAGE:PATH DEST) or into it (SRC IMAGE:PATH)");
  cp->add_option("source", source, "IMAGE:PATH, or a host path")->required();
  cp->add_option("dest", dest, "a host path, or IMAGE:PATH")->required();
  cp->add_flag("--strict", cp_out_options.strict,
               "Copying out: an image entry with an invalid or duplicate name is an error, not a warning");
  cp->add_flag("--no-devices{false}", cp_out_options.devices, "Copying out: make no device nodes");
  cp->add_flag("--no-xattrs{false}", cp_out_options.xattrs, "Copying out: copy no extended attributes");
  cp->add_option("--compress", cp_compress,
                 "Copying in: compress file data with zlib, lzo or zstd (ALG[:LEVEL]), as mount -o compress=");
  cp->add_flag("--reflink", cp_reflink,
               "Inside one image (IMAGE:SRC IMAGE:DST): regular files share their data with the originals; from the "
               "host (SRC IMAGE:PATH): data cloned from the host files into the image file where the file system "
               "under both can (FICLONERANGE), else copied in the kernel");
  cp->callback([] { CmdCp(source, dest); });
}

}  // namespace ubtrfs::cli
