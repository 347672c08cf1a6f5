// The ubtrfs command line against mkfs.btrfs --rootdir images: `cp` must
// reproduce the tree (bytes, modes, owners, times, xattrs, symlinks, special
// files, hard links), `cat` must print files byte for byte, `ls` must list
// the names, and errors must give a nonzero exit status and a message.
// Also self-tests of the tree generator and CompareHostTrees that the other
// suites rely on.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "support/tree_gen.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

const std::string kCli = UBTRFS_CLI_PATH;

std::string ReadHostFile(const std::string& path) {
  std::string s;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) s.append(buf, n);
  close(fd);
  return s;
}

// The escaping `ubtrfs ls` applies to names: control bytes, DEL and
// backslash as \xNN, everything else as is.
std::string LsEscape(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f || c == '\\') out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> r;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find('\n', pos);
    if (end == std::string::npos) end = s.size();
    r.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return r;
}

std::vector<std::string> HostNames(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names.push_back(e->d_name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_error_ = MkfsMissingReason();
    if (!setup_error_.empty()) return;
    tmp_ = new TempDir("ubtrfs-cli");
    src_ = tmp_->Sub("src");
    image_ = tmp_->Sub("image.img");
    mkdir(src_.c_str(), 0755);
    try {
      GenerateTree(src_, 2024, ScaledTreeOptions(1500));
    } catch (const std::exception& e) {
      setup_error_ = e.what();
      return;
    }
    setup_error_ = RunMkfs(image_, src_, 16384, "crc32c");
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(setup_error_.empty()) << setup_error_;
    ASSERT_EQ(access(kCli.c_str(), X_OK), 0) << kCli << " is not executable";
  }
  static CommandResult Cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {kCli};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }

  static TempDir* tmp_;
  static std::string src_, image_, setup_error_;
};
TempDir* CliTest::tmp_ = nullptr;
std::string CliTest::src_, CliTest::image_, CliTest::setup_error_;

TEST_F(CliTest, CpWholeImageReproducesTheTree) {
  TempDir out("ubtrfs-cli-cp");
  std::string dest = out.Sub("dest");  // does not exist: becomes the copy of /
  CommandResult r = Cli({"cp", image_ + ":/", dest});
  ASSERT_TRUE(r.ok()) << ShellJoin({kCli, "cp", image_ + ":/", dest}) << ": " << r.Describe();
  EXPECT_EQ(r.err, "") << "unexpected messages on stderr";

  // Against the image itself: everything it holds must arrive exactly
  // (times with their nanoseconds, device numbers as stored, hard links).
  auto fs = ubtrfs::Filesystem::Open(image_);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  CompareOptions exact;
  exact.compare_top_attrs = true;
  CompareStats cs;
  auto m = CompareTreeToImage(dest, **fs, exact, "/", &cs);
  EXPECT_TRUE(m.empty()) << "copy " << dest << " vs image " << image_ << ": " << FormatMismatches(m);
  EXPECT_GE(cs.entries, 1350u);

  // Against the source tree, through what mkfs --rootdir keeps.
  auto hm = CompareHostTrees(src_, dest, MkfsRootdirCompareOptions());
  EXPECT_TRUE(hm.empty()) << "source " << src_ << " vs copy " << dest << ": " << FormatMismatches(hm);
}

TEST_F(CliTest, CpSubtreeIntoExistingDirectoryAndSingleFile) {
  TempDir out("ubtrfs-cli-cp2");
  // An existing destination directory receives a directory of the same name.
  CommandResult r = Cli({"cp", image_ + ":/odd", out.path()});
  ASSERT_TRUE(r.ok()) << r.Describe();
  CompareOptions sub = MkfsRootdirCompareOptions();
  sub.compare_nlink = false;  // some files have other names outside /odd
  auto m = CompareHostTrees(src_ + "/odd", out.Sub("odd"), sub);
  EXPECT_TRUE(m.empty()) << FormatMismatches(m);

  // A single file to a new name.
  std::string file_dest = out.Sub("single");
  r = Cli({"cp", image_ + ":/sizes/size_131073", file_dest});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(ReadHostFile(file_dest), ReadHostFile(src_ + "/sizes/size_131073"));
  struct stat a, b;
  ASSERT_EQ(lstat((src_ + "/sizes/size_131073").c_str(), &a), 0);
  ASSERT_EQ(lstat(file_dest.c_str(), &b), 0);
  EXPECT_EQ(a.st_mode, b.st_mode);
  EXPECT_EQ(a.st_mtim.tv_sec, b.st_mtim.tv_sec);

  // A path under a directory whose name holds a newline.
  r = Cli({"cp", image_ + ":/odd/dir\nwith newline/inner3", out.Sub("inner3")});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(ReadHostFile(out.Sub("inner3")), ReadHostFile(src_ + "/odd/dir\nwith newline/inner3"));
}

TEST_F(CliTest, CatPrintsFilesByteForByte) {
  std::vector<std::string> paths;
  for (const auto& n : HostNames(src_ + "/sizes")) paths.push_back("/sizes/" + n);
  for (const auto& n : HostNames(src_ + "/big")) paths.push_back("/big/" + n);
  paths.push_back("/links/a/same");
  paths.push_back("/odd/dir\nwith newline/inner4");
  paths.push_back("/odd/" + std::string(255, 'x'));
  int checked = 0;
  for (const auto& p : paths) {
    struct stat st;
    if (lstat((src_ + p).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    CommandResult r = Cli({"cat", image_, p});
    ASSERT_TRUE(r.ok()) << "cat " << Printable(p) << ": " << r.Describe();
    std::string want = ReadHostFile(src_ + p);
    EXPECT_EQ(r.out.size(), want.size()) << Printable(p);
    EXPECT_TRUE(r.out == want) << "cat " << Printable(p) << ": output differs from the file";
    ++checked;
  }
  EXPECT_GE(checked, 40);
}

TEST_F(CliTest, LsListsTheNames) {
  for (const std::string dir : {"/", "/sizes", "/odd", "/links/many"}) {
    CommandResult r = Cli({"ls", image_, dir});
    ASSERT_TRUE(r.ok()) << "ls " << dir << ": " << r.Describe();
    std::vector<std::string> got = Lines(r.out);
    std::sort(got.begin(), got.end());
    std::vector<std::string> want;
    for (const auto& n : HostNames(src_ + dir)) want.push_back(LsEscape(n));
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want) << "ls " << dir;
  }
  // -l: one line per entry.
  CommandResult r = Cli({"ls", "-l", image_, "/special"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(Lines(r.out).size(), HostNames(src_ + "/special").size()) << r.out;
}

TEST_F(CliTest, InfoDescribesTheImage) {
  CommandResult r = Cli({"info", image_});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_NE(r.out.find("16384"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("crc32c"), std::string::npos) << r.out;
}

TEST_F(CliTest, ErrorsGiveNonzeroExitAndMessage) {
  TempDir out("ubtrfs-cli-err");
  struct Case {
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {
      {{"cat", image_, "/does/not/exist"}},
      {{"cat", image_, "/sizes"}},  // a directory
      {{"ls", image_, "/nope"}},
      {{"info", out.Sub("missing.img")}},
      {{"cat", out.Sub("missing.img"), "/x"}},
      {{"cp", image_ + ":/nope", out.Sub("x")}},
      {{"cp", "no-colon-here", out.Sub("y")}},
  };
  for (const auto& c : cases) {
    CommandResult r = Cli(c.args);
    std::vector<std::string> argv = {kCli};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    EXPECT_NE(r.exit_code, 0) << ShellJoin(argv) << " succeeded";
    EXPECT_LT(r.exit_code, 128) << ShellJoin(argv) << " died from a signal: " << r.Describe();
    EXPECT_FALSE(r.err.empty()) << ShellJoin(argv) << " gave no message on stderr";
  }
  // A file that is not a btrfs image.
  std::string junk = out.Sub("junk.img");
  std::string err;
  ASSERT_TRUE(MakeSparseFile(junk, 1 << 20, &err)) << err;
  CommandResult r = Cli({"info", junk});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << r.Describe();
  EXPECT_FALSE(r.err.empty());
}

// ---- self-tests of the support code ---------------------------------------

TEST(TreeSupport, GeneratorIsDeterministicAndCompareFindsDifferences) {
  TempDir tmp("ubtrfs-support");
  std::string a = tmp.Sub("a"), b = tmp.Sub("b"), c = tmp.Sub("c");
  ASSERT_EQ(mkdir(a.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(b.c_str(), 0755), 0);
  TreeGenOptions o = ScaledTreeOptions(500);
  TreeGenStats st;
  ASSERT_NO_THROW(st = GenerateTreeWithStats(a, 5, o));
  ASSERT_NO_THROW(GenerateTree(b, 5, o));
  EXPECT_GE(st.files + st.dirs + st.symlinks + st.hard_links + st.fifos + st.devices, 480u) << st.Summary();
  auto m = CompareHostTrees(a, b);
  EXPECT_TRUE(m.empty()) << "same seed, different trees: " << FormatMismatches(m);

  CommandResult r = RunCommand({"cp", "-a", a, c});
  ASSERT_TRUE(r.ok()) << r.Describe();
  m = CompareHostTrees(a, c);
  EXPECT_TRUE(m.empty()) << "cp -a copy differs: " << FormatMismatches(m);

  // Now change one thing of each kind in the copy; each must be reported.
  auto path = [&](const std::string& rel) { return c + "/" + rel; };
  {
    int fd = open(path("sizes/size_65537").c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "\x01", 1, 40000), 1);
    close(fd);
  }
  ASSERT_EQ(chmod(path("sizes/size_1").c_str(), 0600), 0);
  ASSERT_EQ(lsetxattr(path("special/xattr_many").c_str(), "user.n05", "zz", 2, 0), 0);
  ASSERT_EQ(lremovexattr(path("special/xattr_many").c_str(), "user.n06"), 0);
  ASSERT_EQ(unlink(path("links/alias").c_str()), 0);
  ASSERT_EQ(link(path("sizes/size_2").c_str(), path("links/alias").c_str()), 0);
  ASSERT_EQ(rename(path("odd/new\nline").c_str(), path("odd/new line").c_str()), 0);
  ASSERT_EQ(unlink(path("odd/link_slashes").c_str()), 0);
  ASSERT_EQ(symlink("//a//b//", path("odd/link_slashes").c_str()), 0);
  struct timespec ts[2] = {{0, UTIME_OMIT}, {1000000000, 1}};
  ASSERT_EQ(utimensat(AT_FDCWD, path("sizes/size_0").c_str(), ts, AT_SYMLINK_NOFOLLOW), 0);
  ASSERT_EQ(truncate(path("sizes/size_3072").c_str(), 3071), 0);
  m = CompareHostTrees(a, c);
  std::string all = FormatMismatches(m);
  for (const char* want : {"/sizes/size_65537: data differs at file offset 40000", "/sizes/size_1: mode differs",
                           "xattr \"user.n05\" value differs", "xattr \"user.n06\" missing on b side",
                           "/links/alias: hard link to", "/odd/new\\x0aline: missing on b side",
                           "/odd/new line: extra entry on b side", "/odd/link_slashes: symlink target differs",
                           "/sizes/size_0: mtime differs", "/sizes/size_3072: size differs"}) {
    EXPECT_NE(all.find(want), std::string::npos) << "not reported: " << want << "\n" << all;
  }
  // The relaxations do what they say.
  CompareOptions loose;
  loose.compare_hardlink_identity = false;
  loose.compare_nlink = false;
  loose.compare_time_nsec = false;
  auto lm = CompareHostTrees(a, c, loose);
  for (const auto& s : lm) EXPECT_EQ(s.find("hard link"), std::string::npos) << s;
  // The cap holds.
  CompareOptions capped;
  capped.max_mismatches = 3;
  EXPECT_EQ(CompareHostTrees(a, c, capped).size(), 4u);  // 3 + "stopped after"
}

}  // namespace
}  // namespace ubtrfs_test
