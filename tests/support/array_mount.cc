#include "support/array_mount.h"

namespace ubtrfs_test {

namespace {

std::string Attach(const std::string& img, std::string* err) {
  auto r = RunCommand({"losetup", "-f", "--show", img});
  if (!r.ok()) {
    *err = "losetup " + img + ": " + r.Describe();
    return "";
  }
  std::string dev = r.out;
  while (!dev.empty() && (dev.back() == '\n' || dev.back() == ' ')) dev.pop_back();
  return dev;
}

}  // namespace

std::string ArrayMount::Mount(const std::vector<std::string>& images, const std::string& dir, const std::string& opts) {
  for (const auto& img : images) {
    std::string err;
    const std::string dev = Attach(img, &err);
    if (dev.empty()) return err;
    loops_.push_back(dev);
  }
  std::string o;
  for (const auto& l : loops_) o += (o.empty() ? "" : ",") + std::string("device=") + l;
  if (!opts.empty()) o += "," + opts;
  auto r = RunCommand({"mount", "-t", "btrfs", "-o", o, loops_.front(), dir});
  if (!r.ok()) return "mount: " + r.Describe();
  dir_ = dir;
  return "";
}

CommandResult ArrayMount::Check(const std::vector<std::string>& images) {
  for (const auto& img : images) {
    std::string err;
    const std::string dev = Attach(img, &err);
    if (dev.empty()) {
      CommandResult r;
      r.err = err;
      return r;
    }
    loops_.push_back(dev);
  }
  // Only these devices: a scan of every block device would register other
  // tests' loop devices with the kernel too.
  std::vector<std::string> scan{"btrfs", "device", "scan"};
  scan.insert(scan.end(), loops_.begin(), loops_.end());
  RunCommand(scan);
  return RunCommand({"btrfs", "check", "--readonly", loops_.front()});
}

void ArrayMount::Unmount() {
  if (!dir_.empty()) RunCommand({"umount", dir_});
  dir_.clear();
  for (const auto& l : loops_) RunCommand({"losetup", "-d", l});
  loops_.clear();
}

std::string JoinDevices(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace ubtrfs_test
