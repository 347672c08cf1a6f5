#include "support/mkfs_util.h"

#include <fmt/core.h>
#include <gtest/gtest.h>

#include <sstream>

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

ProgsSpace SpaceFromDumpTree(const std::string& image) {
  ProgsSpace p;
  // The whole image: a block-group-tree image keeps its block group items
  // there, not in the extent tree.
  auto r = RunCommand({"btrfs", "inspect-internal", "dump-tree", image});
  EXPECT_TRUE(r.ok()) << r.Describe();
  // "block group used 131072 chunk_objectid 256 flags METADATA|DUP"
  // (parsed by hand: std::regex draws false -Wmaybe-uninitialized warnings
  // from GCC 12 in the sanitizer build).
  const std::string kUsed = "block group used ", kFlags = " flags ";
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    const size_t u = line.find(kUsed), f = line.find(kFlags);
    if (u != std::string::npos && f != std::string::npos) {
      const uint64_t used = std::stoull(line.substr(u + kUsed.size()));
      const std::string kind = line.substr(f + kFlags.size());
      if (kind.rfind("DATA", 0) == 0) {
        p.data_used += used;
        ++p.data_groups;
      } else if (kind.rfind("METADATA", 0) == 0) {
        p.metadata_used += used;
      } else {
        p.system_used += used;
      }
    } else if (line.find("refs ") != std::string::npos && line.find(" flags DATA") != std::string::npos) {
      // An EXTENT_ITEM's body: "refs 1 gen 7 flags DATA".
      ++p.data_extents;
    }
  }
  return p;
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
