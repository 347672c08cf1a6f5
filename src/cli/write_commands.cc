// Copying a host tree into an image (`ubtrfs cp HOST IMAGE:PATH`).
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include "cli/commands.h"
#include "ubtrfs/devices.h"
#include "ubtrfs/import.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {

void Report(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: {}: {}\n", what, st.ToString());
  SetExitCode(1);
}

std::unique_ptr<Filesystem> OpenWritable(const std::string& image, const CompressOptions& compress) {
  OpenOptions o;
  o.writable = true;
  o.compress = compress;
  o.node_cache_bytes = 16ull << 20;  // writes go through the transaction, not the read cache
  auto fs = OpenImage(image, o);
  if (!fs.ok()) {
    Report(image, fs.status());
    return nullptr;
  }
  for (const auto& w : (*fs)->Warnings()) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", image, w);
  return std::move(*fs);
}

void Commit(Filesystem& fs, const std::string& image) {
  Status st = fs.Commit();
  if (!st.ok()) Report(image + ": commit", st);
}

}  // namespace

std::pair<std::string, std::string> SplitLast(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {"/", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

Result<std::pair<InodeId, std::string>> CopyInTarget(Filesystem& fs, const std::string& host, const std::string& path) {
  std::string base = host;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  base = base.substr(base.find_last_of('/') + 1);
  auto target = fs.Lookup(path);
  if (target.ok()) {
    auto st = fs.GetStat(*target);
    if (!st.ok()) return st.status().WithContext(path);
    if (!S_ISDIR(st->mode)) return Status::Error(EEXIST, path + ": exists");
    return std::pair{*target, base};
  }
  auto [parent, last] = SplitLast(path);
  auto p = fs.Lookup(parent);
  if (!p.ok()) return p.status().WithContext(parent);
  return std::pair{*p, last};
}

// rbd:POOL/IMAGE[@SNAP][:KEY=VALUE...][:PATH]: the image's options are the
// pieces with a '=' that do not start with '/'; the path is what follows
// (all of it, colons included); none means the top directory.
bool SplitRbdImagePath(const std::string& arg, std::string* image, std::string* path) {
  size_t piece = 0;  // start of the current ':'-separated piece
  bool first = true;
  for (size_t i = 4; i <= arg.size(); ++i) {
    if (i < arg.size() && arg[i] == '\\') {
      ++i;
      continue;
    }
    if (i < arg.size() && arg[i] != ':') continue;
    if (!first) {
      const std::string_view p = std::string_view(arg).substr(piece, i - piece);
      if (p.starts_with('/') || p.find('=') == std::string_view::npos) {
        *image = arg.substr(0, piece - 1);
        *path = arg.substr(piece);
        if (path->empty()) *path = "/";
        return true;
      }
    }
    first = false;
    piece = i + 1;
  }
  *image = arg;
  *path = "/";
  return true;
}

bool SplitImagePath(const std::string& arg, std::string* image, std::string* path) {
  if (arg.starts_with("rbd:")) return SplitRbdImagePath(arg, image, path);
  const size_t colon = arg.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  struct stat st;
  const std::string candidate = arg.substr(0, colon);
  // IMG1,IMG2,...: every device of a multi-device filesystem must exist.
  for (const auto& dev : SplitDeviceList(candidate)) {
    if (::stat(dev.c_str(), &st) != 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) return false;
  }
  *image = candidate;
  *path = arg.substr(colon + 1);
  if (path->empty()) *path = "/";
  return true;
}

void CopyIn(const std::string& host, const std::string& image, const std::string& path, const std::string& compress,
            bool reflink) {
  CompressOptions co;
  if (!compress.empty()) {
    if (Status c = ParseCompressSpec(compress, &co); !c.ok()) {
      fmt::print(stderr, "ubtrfs: cp: --compress: {}\n", c.message());
      return SetExitCode(1);
    }
  }
  struct stat hst;
  if (::lstat(host.c_str(), &hst) != 0) {
    fmt::print(stderr, "ubtrfs: cp: {}: {}\n", host, strerror(errno));
    return SetExitCode(1);
  }
  auto fs = OpenWritable(image, co);
  if (!fs) return;
  auto where = CopyInTarget(*fs, host, path);
  if (!where.ok()) {
    fmt::print(stderr, "ubtrfs: {}\n", where.status().ToString());
    return SetExitCode(1);
  }
  const auto& [dir, name] = *where;
  ImportStats stats;
  ImportOptions options;
  options.reflink = reflink;
  const bool tty = ::isatty(2);
  if (tty) {
    options.progress = [](const ImportStats& s) {
      fmt::print(stderr, "\rubtrfs: {} files, {} directories, {} MiB", s.files, s.dirs, s.bytes >> 20);
    };
  }
  Status st = ImportTree(*fs, host, dir, name, options, &stats);
  if (tty && stats.files + stats.dirs >= 4096) fmt::print(stderr, "\n");
  if (!st.ok()) return Report(host, st);
  Commit(*fs, image);
}

}  // namespace ubtrfs::cli
