#include "support/mkfs_util.h"

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "support/test_util.h"

namespace ubtrfs_test {

std::string MkfsMissingReason() {
  if (!FindProgram("mkfs.btrfs").empty()) return "";
  return "mkfs.btrfs not found in PATH (nor /sbin, /usr/sbin): install btrfs-progs "
         "(e.g. `apt-get install btrfs-progs`), as the README describes";
}

std::string RunMkfs(const std::string& image, const std::string& rootdir, uint32_t nodesize,
                    const std::string& csum, uint64_t size, const std::vector<std::string>& extra) {
  std::string err;
  if (!MakeSparseFile(image, size, &err)) return err;
  std::vector<std::string> argv = {"mkfs.btrfs", "-q", "-f"};
  if (!rootdir.empty()) argv.insert(argv.end(), {"--rootdir", rootdir});
  if (nodesize) argv.insert(argv.end(), {"--nodesize", std::to_string(nodesize)});
  if (!csum.empty()) argv.insert(argv.end(), {"--csum", csum});
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(image);
  CommandResult r = RunCommand(argv);
  if (!r.ok()) return fmt::format("{} failed: {}", ShellJoin(argv), r.Describe());
  return "";
}

CompareOptions MkfsRootdirCompareOptions() {
  CompareOptions o;
  o.compare_time_nsec = false;  // mkfs 6.2 truncates times to whole seconds
  o.compare_rdev = false;       // mkfs 6.2 writes rdev 0 for device nodes
  o.compare_top_attrs = false;  // the root inode is made afresh, not copied
  return o;
}

std::string BtrfsCheck(const std::string& image, const std::string& mode) {
  auto r = RunCommand({"btrfs", "check", "--readonly", "--mode=" + mode, image});
  if (r.ok() && r.err.find("ERROR") == std::string::npos && r.out.find("ERROR") == std::string::npos &&
      r.err.find("error") == std::string::npos && r.out.find("no error found") != std::string::npos) {
    return "";
  }
  return "btrfs check " + image + ": " + r.Describe() + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

std::unique_ptr<ubtrfs::Filesystem> OpenWritable(const std::string& image) {
  ubtrfs::OpenOptions o;
  o.writable = true;
  auto fs = ubtrfs::Filesystem::Open(image, o);
  EXPECT_TRUE(fs.ok()) << image << ": " << fs.status().ToString();
  return fs.ok() ? std::move(*fs) : nullptr;
}

}  // namespace ubtrfs_test
