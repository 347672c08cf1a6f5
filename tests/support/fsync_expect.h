// What the tree-log tests (a kernel's log: log_replay_test.cc; ubtrfs's own:
// tree_log_test.cc) expect after a replay: the fsynced files byte for byte,
// link counts, names that must be gone, and the one xattr both scenarios set.
#ifndef UBTRFS_TESTS_SUPPORT_FSYNC_EXPECT_H_
#define UBTRFS_TESTS_SUPPORT_FSYNC_EXPECT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/host_files.h"
#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {

struct Expected {
  std::map<std::string, std::string> files;  // path -> bytes
  std::map<std::string, uint32_t> nlink;
  std::vector<std::string> gone;
};

inline void ExpectFsyncedIn(ubtrfs::Filesystem& fs, const Expected& x) {
  for (const auto& [path, bytes] : x.files) EXPECT_EQ(ReadImageFile(fs, path), bytes) << path;
  for (const auto& [path, n] : x.nlink) {
    auto id = fs.Lookup(path);
    ASSERT_TRUE(id.ok()) << path << ": " << id.status().ToString();
    auto st = fs.GetStat(*id);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->nlink, n) << path;
  }
  for (const auto& path : x.gone) EXPECT_FALSE(fs.Lookup(path).ok()) << path << " is still there";
  auto id = fs.Lookup("/newdir/x");
  ASSERT_TRUE(id.ok());
  auto v = fs.GetXattr(*id, "user.k");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "v1");
}

// A field of the primary superblock as btrfs inspect-internal dump-super
// prints it; UINT64_MAX when it cannot be read.
inline uint64_t SuperField(const std::string& img, const std::string& field) {
  CommandResult r = RunCommand({"btrfs", "inspect-internal", "dump-super", img});
  size_t at = r.out.find("\n" + field + "\t");
  if (at == std::string::npos) return UINT64_MAX;
  at = r.out.find_first_not_of("\t", at + field.size() + 1);
  return std::stoull(r.out.substr(at));
}

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_FSYNC_EXPECT_H_
