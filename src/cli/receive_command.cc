// `ubtrfs receive [-f FILE] [--dump] IMAGE[:DIR]`: applies a btrfs send
// stream (stdin by default) to an image as `btrfs receive` applies it to a
// mounted filesystem, as an ordinary user; --dump prints the stream as
// `btrfs receive --dump` does, and needs no image.
#include <fcntl.h>
#include <unistd.h>

#include <fmt/core.h>

#include <string>

#include "cli/commands.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/send.h"

namespace ubtrfs::cli {
namespace {

struct ReceiveArgs {
  std::string target, file;
  bool dump = false;
  bool verbose = false;
};

void Fail(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: receive: {}: {}\n", what, st.ToString());
  SetExitCode(1);
}

void Run(const ReceiveArgs& a) {
  int fd = 0;
  if (!a.file.empty()) {
    fd = ::open(a.file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Fail(a.file, Status::Error(errno, "open"));
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd > 0) ::close(fd);
    }
  } closer{fd};
  const std::string source = a.file.empty() ? "stdin" : a.file;
  if (a.dump) {
    Status st = DumpStream(ReadFromFd(fd), [](std::string_view line) { fmt::print("{}\n", line); });
    if (!st.ok()) Fail(source, st);
    return;
  }
  if (a.target.empty()) {
    fmt::print(stderr, "ubtrfs: receive: IMAGE[:DIR] is required without --dump\n");
    return SetExitCode(2);
  }
  std::string image = a.target, dir = "/";
  SplitImagePath(a.target, &image, &dir);
  OpenOptions o;
  o.writable = true;
  auto fs = OpenImage(image, o);
  if (!fs.ok()) return Fail(image, fs.status());
  auto dest = (*fs)->Lookup(dir);
  if (!dest.ok()) return Fail(a.target, dest.status());
  ReceiveOptions ro;
  ro.dest = *dest;
  ReceiveResult res;
  Status st = Receive(**fs, ReadFromFd(fd), ro, &res);
  if (!st.ok()) {
    Fail(source, st);
    fmt::print(stderr, "ubtrfs: receive: nothing of the stream was committed; {} is as before\n", image);
    return;
  }
  for (const auto& s : res.subvolumes) {
    fmt::print(stderr, "At {} {}\n", s.snapshot ? "snapshot" : "subvol", s.name);
  }
  if (a.verbose) {
    fmt::print(stderr, "{} commands, {} stream bytes, {} data bytes written, {} clones ({} copied), {} encoded writes\n",
               res.commands, res.stream_bytes, res.data_bytes, res.clones, res.clone_copies, res.encoded_writes);
  }
}

}  // namespace

void RegisterReceive(CLI::App& app) {
  static ReceiveArgs args;
  auto* cmd = app.add_subcommand("receive", "Apply a btrfs send stream to an image (btrfs receive, no kernel)");
  cmd->add_option("target", args.target, "IMAGE[:DIR]: the image and the directory the subvolumes go in");
  cmd->add_option("-f,--file", args.file, "Read the stream from FILE instead of stdin");
  cmd->add_flag("--dump", args.dump, "Print the stream's commands as btrfs receive --dump, change nothing");
  cmd->add_flag("-v,--verbose", args.verbose, "Print what was applied");
  cmd->callback([] { Run(args); });
}

}  // namespace ubtrfs::cli
