// `ubtrfs send [-f FILE] [-p PARENT] [-c CLONE_SRC]... [--proto N]
// [--compressed-data] IMAGE:SUBVOL`: a full or incremental btrfs send stream
// of a read-only subvolume of an image (stdout by default), for the kernel's
// `btrfs receive` or `ubtrfs receive`.
#include <fcntl.h>
#include <unistd.h>

#include <fmt/core.h>

#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/send.h"

namespace ubtrfs::cli {
namespace {

struct SendArgs {
  std::string target, file, parent;
  std::vector<std::string> clone_sources;
  uint32_t proto = 0;  // 0: 1, or 2 with --compressed-data (as btrfs send)
  bool compressed_data = false;
  bool verbose = false;
};

void Fail(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: send: {}: {}\n", what, st.ToString());
  SetExitCode(1);
}

void Run(const SendArgs& a) {
  std::string image, path;
  if (!SplitImagePath(a.target, &image, &path)) {
    fmt::print(stderr, "ubtrfs: send: expected IMAGE:SUBVOL, got '{}'\n", a.target);
    return SetExitCode(2);
  }
  int fd = 1;
  if (!a.file.empty()) {
    fd = ::open(a.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return Fail(a.file, Status::Error(errno, "open"));
  } else if (isatty(1)) {
    fmt::print(stderr, "ubtrfs: send: not writing a stream to a terminal; use -f FILE or a pipe\n");
    return SetExitCode(2);
  }
  OpenOptions o;
  PlacementInto(&o);
  auto fs = Filesystem::Open(image, o);
  if (!fs.ok()) return Fail(image, fs.status());
  auto id = (*fs)->Lookup(path);
  if (!id.ok()) return Fail(a.target, id.status());
  SendOptions so;
  so.proto = a.proto != 0 ? a.proto : a.compressed_data ? 2 : 1;
  so.compressed_data = a.compressed_data;
  // PARENT and CLONE_SRC: paths in the same image (IMAGE: may be repeated).
  const auto in_image = [&](const std::string& arg) -> Result<InodeId> {
    std::string p = arg;
    if (std::string img, rest; SplitImagePath(arg, &img, &rest)) {
      if (img != image) return Status::Invalid(arg + ": not in " + image);
      p = rest;
    }
    return (*fs)->Lookup(p);
  };
  if (!a.parent.empty()) {
    auto p = in_image(a.parent);
    if (!p.ok()) return Fail(a.parent, p.status());
    so.parent = *p;
  }
  for (const std::string& c : a.clone_sources) {
    auto p = in_image(c);
    if (!p.ok()) return Fail(c, p.status());
    so.clone_sources.push_back(*p);
  }
  SendResult res;
  Status st = Send(**fs, *id, [fd](std::span<const uint8_t> b) -> Status {
    while (!b.empty()) {
      const ssize_t n = ::write(fd, b.data(), b.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::Error(errno, "write");
      b = b.subspan(static_cast<size_t>(n));
    }
    return Status::Ok();
  }, so, &res);
  if (fd != 1 && ::close(fd) != 0 && st.ok()) st = Status::Error(errno, "close");
  if (!st.ok()) return Fail(a.target, st);
  if (a.verbose) {
    fmt::print(stderr,
               "send: {} commands, {} bytes, {} data bytes, {} clones, {} encoded writes; tree comparison: "
               "{} blocks read, {} shared subtrees skipped, {} inodes changed\n",
               res.commands, res.stream_bytes, res.data_bytes, res.clones, res.encoded_writes, res.blocks_read,
               res.shared_subtrees_skipped, res.changed_inodes);
  }
}

}  // namespace

void RegisterSend(CLI::App& app) {
  static SendArgs args;
  auto* cmd = app.add_subcommand(
      "send", "Write a full or incremental btrfs send stream of a read-only subvolume (btrfs send, no kernel)");
  cmd->add_option("target", args.target, "IMAGE:SUBVOL: the top of a read-only subvolume or snapshot")->required();
  cmd->add_option("-f,--file", args.file, "Write the stream to FILE instead of stdout");
  cmd->add_option("-p,--parent", args.parent,
                  "PARENT: a read-only snapshot in the same image (a path, or IMAGE:PATH); send only the changes "
                  "against it");
  cmd->add_option("-c,--clone-src", args.clone_sources,
                  "CLONE_SRC: a read-only subvolume in the same image whose extents the stream may clone (repeatable)");
  cmd->add_option("--proto", args.proto, "Stream version: 1, 2 or 3 (default 1, or 2 with --compressed-data)")
      ->check(CLI::Range(1, 3));
  cmd->add_flag("--compressed-data", args.compressed_data,
                "Send compressed extents as they are stored (ENCODED_WRITE; needs --proto 2 or 3)");
  cmd->add_flag("-v,--verbose", args.verbose, "Print what the stream holds and what the tree comparison read to stderr");
  cmd->callback([] { Run(args); });
}

}  // namespace ubtrfs::cli
