// `ubtrfs inspect dump-super` prints what `btrfs inspect-internal
// dump-super` prints, line for line (btrfs-progs is the oracle): the
// default copy, -f (system chunk array, backup roots), -a (every copy), -s,
// on images mkfs.btrfs, btrfstune and ubtrfs made -- a label with bytes
// that do not print, a metadata_uuid, a seed device, two devices, a copy
// whose checksum does not match -- and the errors: a copy without the
// magic (printed with -F), a copy number past 2, a damaged system chunk
// array.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

namespace fmtd = ubtrfs::format;

class DumpSuperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
    if (!HaveBtrfsProgs()) GTEST_SKIP() << "btrfs-progs' btrfs command is the oracle; it is not installed";
  }

  // The two outputs for `args` (dump-super's options) on `image`.
  static void ExpectSame(const std::vector<std::string>& args, const std::string& image) {
    std::vector<std::string> ours = {"inspect", "dump-super"}, theirs = {"btrfs", "inspect-internal", "dump-super"};
    ours.insert(ours.end(), args.begin(), args.end());
    theirs.insert(theirs.end(), args.begin(), args.end());
    ours.push_back(image);
    theirs.push_back(image);
    const CommandResult u = RunUbtrfs(ours), b = RunCommand(theirs);
    EXPECT_EQ(u.exit_code, b.exit_code) << ShellJoin(ours) << ": " << u.Describe() << "\nbtrfs: " << b.Describe();
    EXPECT_EQ(u.out, b.out) << ShellJoin(ours);
  }
  static void ExpectSameEverywhere(const std::string& image) {
    for (const auto& args : std::vector<std::vector<std::string>>{{}, {"-f"}, {"-a"}, {"-f", "-a"}, {"-s", "1"}}) {
      ExpectSame(args, image);
    }
  }
  // Rewrites superblock copy `m` of `image` through `change`, with its
  // checksum computed again unless `keep_csum`.
  static void PatchSuper(const std::string& image, int m, void (*change)(fmtd::SuperBlock&), bool keep_csum = false) {
    const int fd = ::open(image.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> raw(fmtd::kSuperInfoSize);
    const off_t off = static_cast<off_t>(fmtd::SuperblockOffset(m));
    ASSERT_EQ(::pread(fd, raw.data(), raw.size(), off), static_cast<ssize_t>(raw.size()));
    auto* sb = reinterpret_cast<fmtd::SuperBlock*>(raw.data());
    change(*sb);
    if (!keep_csum) {
      auto sum = fmtd::ComputeCsum(sb->csum_type.get(), std::span<const uint8_t>(raw).subspan(fmtd::kCsumSize));
      std::memcpy(sb->csum, sum.data(), fmtd::kCsumSize);
    }
    ASSERT_EQ(::pwrite(fd, raw.data(), raw.size(), off), static_cast<ssize_t>(raw.size()));
    ::close(fd);
  }

  TempDir tmp_{"ubtrfs-dump-super"};
};

TEST_F(DumpSuperTest, ImagesOfMkfsBtrfsAndBtrfstune) {
  const std::string img = tmp_.Sub("progs.img");
  ASSERT_EQ(RunMkfs(img, "", 0, "", 256ull << 20, {"-L", "a label"}), "");
  ExpectSameEverywhere(img);
  const std::string xx = tmp_.Sub("xxhash.img");
  ASSERT_EQ(RunMkfs(xx, "", 4096, "xxhash", 128ull << 20, {"-O", "^no-holes"}), "");
  ExpectSameEverywhere(xx);
  // A new fsid with the old one kept as the metadata_uuid, then a seed.
  ASSERT_TRUE(RunCommand({"btrfstune", "-f", "-m", img}).ok());
  ExpectSameEverywhere(img);
  ASSERT_TRUE(RunCommand({"btrfstune", "-S", "1", xx}).ok());
  ExpectSameEverywhere(xx);
}

TEST_F(DumpSuperTest, ImagesOfUbtrfsOnTwoDevices) {
  const std::string a = tmp_.Sub("a.img"), b = tmp_.Sub("b.img");
  for (const auto& p : {a, b}) {
    std::string err;
    ASSERT_TRUE(MakeSparseFile(p, 200ull << 20, &err)) << err;
  }
  CommandResult r = RunUbtrfs({"mkfs", "-q", "-d", "raid1", "-m", "raid1", a, b});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ExpectSameEverywhere(a);
  ExpectSameEverywhere(b);
  // Both devices named at once: each printed in turn, as btrfs does for two arguments.
  const CommandResult both = RunUbtrfs({"inspect", "dump-super", a + "," + b});
  const CommandResult progs = RunCommand({"btrfs", "inspect-internal", "dump-super", a, b});
  EXPECT_TRUE(both.ok()) << both.Describe();
  EXPECT_EQ(both.out, progs.out);
}

TEST_F(DumpSuperTest, DamagedCopiesAreShownAsTheyAre) {
  const std::string img = tmp_.Sub("damaged.img");
  ASSERT_EQ(RunMkfs(img, "", 0, "", 256ull << 20), "");
  // A label that does not print; a checksum that no longer matches.
  PatchSuper(img, 0, [](fmtd::SuperBlock& sb) { std::memcpy(sb.label, "tab\there\x01", 10); });
  PatchSuper(img, 0, [](fmtd::SuperBlock& sb) { sb.generation = sb.generation.get() + 1; }, /*keep_csum=*/true);
  ExpectSameEverywhere(img);
  CommandResult r = RunUbtrfs({"inspect", "dump-super", img});
  EXPECT_NE(r.out.find("[DON'T MATCH]"), std::string::npos) << r.out;
  // No magic in copy 1: an error at that copy (what came before printed), unless forced.
  PatchSuper(img, 1, [](fmtd::SuperBlock& sb) { sb.magic = 0x1234; });
  ExpectSame({"-a"}, img);
  ExpectSame({"-s", "1", "-F"}, img);
  r = RunUbtrfs({"inspect", "dump-super", "-s", "1", img});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad magic on superblock copy 1 at 67108864"), std::string::npos) << r.err;
  // A copy past the device's end: a blank line, as btrfs prints, and a word on stderr.
  ExpectSame({"-s", "2"}, img);
  EXPECT_NE(RunUbtrfs({"inspect", "dump-super", "-s", "2", img}).err.find("no superblock copy 2"), std::string::npos);
  r = RunUbtrfs({"inspect", "dump-super", "-s", "3", img});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("there are copies 0 to 2"), std::string::npos) << r.err;
  // A system chunk array that says it is longer than it is (btrfs-progs
  // says so on stderr and exits 0; ubtrfs exits 1).
  PatchSuper(img, 0, [](fmtd::SuperBlock& sb) { sb.sys_chunk_array_size = sb.sys_chunk_array_size.get() + 11; });
  r = RunUbtrfs({"inspect", "dump-super", "-f", img});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.out, RunCommand({"btrfs", "inspect-internal", "dump-super", "-f", img}).out);
  EXPECT_NE(r.err.find("sys_array too short to read"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("backup_roots[4]:"), std::string::npos) << "the rest not printed: " << r.out;
}

}  // namespace UBTRFS_UNITY_ID
}  // namespace ubtrfs_test
