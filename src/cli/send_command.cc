// `ubtrfs send [-f FILE] [--proto N] IMAGE:SUBVOL`: a full btrfs send stream
// of a read-only subvolume of an image (stdout by default), for the kernel's
// `btrfs receive` or `ubtrfs receive`.
#include <fcntl.h>
#include <unistd.h>

#include <fmt/core.h>

#include <string>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/send.h"

namespace ubtrfs::cli {
namespace {

struct SendArgs {
  std::string target, file;
  uint32_t proto = 1;
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
  so.proto = a.proto;
  Status st = Send(**fs, *id, [fd](std::span<const uint8_t> b) -> Status {
    while (!b.empty()) {
      const ssize_t n = ::write(fd, b.data(), b.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::Error(errno, "write");
      b = b.subspan(static_cast<size_t>(n));
    }
    return Status::Ok();
  }, so);
  if (fd != 1 && ::close(fd) != 0 && st.ok()) st = Status::Error(errno, "close");
  if (!st.ok()) Fail(a.target, st);
}

}  // namespace

void RegisterSend(CLI::App& app) {
  static SendArgs args;
  auto* cmd = app.add_subcommand("send", "Write a full btrfs send stream of a read-only subvolume (btrfs send, no kernel)");
  cmd->add_option("target", args.target, "IMAGE:SUBVOL: the top of a read-only subvolume or snapshot")->required();
  cmd->add_option("-f,--file", args.file, "Write the stream to FILE instead of stdout");
  cmd->add_option("--proto", args.proto, "Stream version: 1 or 2")->check(CLI::Range(1, 2))->capture_default_str();
  cmd->callback([] { Run(args); });
}

}  // namespace ubtrfs::cli
