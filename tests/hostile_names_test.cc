// Hostile images (issue 23): a valid image whose directory entries were
// edited as an attacker would (names changed in DIR_INDEX / DIR_ITEM items,
// locations pointed elsewhere, block checksums recomputed). `ubtrfs cp` out,
// the library's ReadDir and ExportTree, and the FUSE mount must never hand on
// an invalid or duplicate name, never write outside the destination and
// never follow a symlink they did not make, and still copy every good entry.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/block_device.h"
#include "support/damage_util.h"
#include "support/fuse_mount.h"
#include "support/test_util.h"
#include "ubtrfs/export.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

using ubtrfs::DirEntry;
using ubtrfs::Filesystem;
using ubtrfs::InodeId;
using ubtrfs::SkippedEntry;
using namespace ubtrfs_test;

const std::string kCli = UBTRFS_CLI_PATH;

// Everything under `root` (not following symlinks): path -> type, size,
// mode and mtime, to tell what a copy created or changed.
std::map<std::string, std::string> Listing(const std::string& root) {
  std::map<std::string, std::string> out;
  std::vector<std::string> todo{""};
  while (!todo.empty()) {
    const std::string rel = todo.back();
    todo.pop_back();
    DIR* d = ::opendir((root + rel).c_str());
    if (d == nullptr) continue;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      const std::string p = rel + "/" + n;
      struct stat s;
      if (::lstat((root + p).c_str(), &s) != 0) continue;
      out[p] = std::to_string(s.st_mode) + " " + std::to_string(s.st_size) + " " + std::to_string(s.st_mtim.tv_sec) +
               "." + std::to_string(s.st_mtim.tv_nsec);
      if (S_ISDIR(s.st_mode)) todo.push_back(p);
    }
    ::closedir(d);
  }
  return out;
}

// What changed under `sandbox` that is not inside `dest` (both absolute).
std::vector<std::string> ChangedOutside(const std::map<std::string, std::string>& before,
                                        const std::map<std::string, std::string>& after, const std::string& sandbox,
                                        const std::string& dest) {
  const std::string inside = dest.substr(sandbox.size());  // "/out/deep/x"
  auto under_dest = [&](const std::string& p) { return p == inside || p.starts_with(inside + "/"); };
  std::vector<std::string> changed;
  for (const auto& [p, v] : after) {
    if (under_dest(p)) continue;
    auto it = before.find(p);
    if (it == before.end()) changed.push_back("created " + p);
    else if (it->second != v && !inside.starts_with(p + "/")) changed.push_back("changed " + p);
  }
  for (const auto& [p, v] : before) {
    if (!under_dest(p) && after.count(p) == 0) changed.push_back("removed " + p);
  }
  return changed;
}

std::string ReadHostFile(const std::string& path) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return "<" + std::string(std::strerror(errno)) + ">";
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

class HostileNamesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sandbox_ = tmp_.Sub("sandbox");
    ASSERT_EQ(::mkdir(sandbox_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((sandbox_ + "/victim").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((sandbox_ + "/out").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((sandbox_ + "/out/deep").c_str(), 0755), 0);
    ASSERT_TRUE(TryWriteHostFile(sandbox_ + "/out/deep/f", "precious\n"));

    const std::string src = tmp_.Sub("src");
    ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
    auto dir = [&](const std::string& p) { ASSERT_EQ(::mkdir((src + "/" + p).c_str(), 0755), 0) << p; };
    auto file = [&](const std::string& p, const std::string& data) {
      ASSERT_TRUE(TryWriteHostFile(src + "/" + p, data)) << p;
      good_[p] = data;
    };
    // Good entries, to be copied whatever else the image holds.
    dir("good");
    for (int i = 0; i < 5; ++i) file("good/g" + std::to_string(i), "good file " + std::to_string(i) + "\n");
    file("keep.txt", "keep me\n");
    // Renamed below: yy -> "..", zz -> "..", ab -> "aa" (after the symlink
    // aa -> victim), abcd -> "../e", n0x -> "n\0x", axb -> "a/b".
    dir("yy");
    file("yy/f", "escaped through ..\n");
    file("zz", "a file named ..\n");
    ASSERT_EQ(::symlink((sandbox_ + "/victim").c_str(), (src + "/aa").c_str()), 0);
    dir("ab");
    file("ab/pwn", "written through a planted symlink\n");
    file("abcd", "climbs one level\n");
    file("n0x", "nul\n");
    file("axb", "slash\n");
    // A 255-byte name, made 256 bytes long below.
    long_name_ = std::string(255, 'L');
    file(long_name_, "long\n");
    // Two DIR_INDEX entries for one name: dup2's index is renamed dup1.
    file("dup1", "the first dup1\n");
    file("dup2", "the second name\n");
    // A DIR_INDEX without its DIR_ITEM (the DIR_ITEM's name is changed).
    file("orph", "indexed only\n");
    // A directory whose entry is pointed at the top directory: a loop.
    dir("loopdir");
    file("loopdir/inner", "inside the loop dir\n");
    // A hard link whose other name is outside the copied subtree.
    dir("hl");
    dir("other");
    file("hl/one", "linked twice\n");
    ASSERT_EQ(::link((src + "/hl/one").c_str(), (src + "/other/two").c_str()), 0);
    good_["other/two"] = "linked twice\n";
    // A symlink loop (valid: symlinks are copied as symlinks).
    ASSERT_EQ(::symlink("l2", (src + "/l1").c_str()), 0);
    ASSERT_EQ(::symlink("l1", (src + "/l2").c_str()), 0);
    for (const char* gone : {"yy/f", "zz", "ab/pwn", "abcd", "n0x", "axb", "dup2", "loopdir/inner"}) good_.erase(gone);
    good_.erase(long_name_);

    img_ = tmp_.Sub("img");
    auto mk = RunCommand({kCli, "mkfs", "-q", "--size", "128M", "--nodesize", "4096", "--rootdir", src, img_});
    ASSERT_TRUE(mk.ok()) << mk.Describe();
    Damage();
  }

  // Index and inode of each top-level entry of the clean image.
  std::map<std::string, DirEntry> TopEntries() {
    auto fs = Filesystem::Open(img_);
    EXPECT_TRUE(fs.ok()) << fs.status().ToString();
    std::map<std::string, DirEntry> m;
    if (!fs.ok()) return m;
    auto entries = (*fs)->ReadDir((*fs)->Root());
    EXPECT_TRUE(entries.ok());
    if (entries.ok()) {
      for (const auto& e : *entries) m[e.name] = e;
    }
    return m;
  }

  void Damage() {
    const auto top = TopEntries();
    for (const char* n : {"yy", "zz", "aa", "ab", "abcd", "n0x", "axb", "dup1", "dup2", "orph", "loopdir"}) {
      ASSERT_EQ(top.count(n), 1u) << n;
    }
    ASSERT_EQ(top.count(long_name_), 1u);
    // The attack on the symlink needs the symlink listed first.
    ASSERT_LT(top.at("aa").index, top.at("ab").index);

    layout_.path = img_;
    auto dev = ubtrfs::io::OpenFileDevice(img_);
    ASSERT_TRUE(dev.ok());
    auto vol = ufs::Volume::Open(std::move(*dev), ufs::VolumeOptions{});
    ASSERT_TRUE(vol.ok()) << vol.status().ToString();
    layout_.vol = std::move(*vol);
    layout_.nodesize = layout_.vol->nodesize();
    layout_.csum_type = layout_.vol->csum_type();
    auto fsr = layout_.vol->FindRoot(fmtd::kFsTreeObjectid);
    ASSERT_TRUE(fsr.ok());
    layout_.fs_root = fsr->ref;
    patcher_ = std::make_unique<Patcher>(img_);

    // Rename an entry in its DIR_INDEX (and, if `item` too, its DIR_ITEM)
    // to a name of the same length.
    auto rename = [&](const std::string& from, const std::string& to, bool item) {
      ASSERT_EQ(from.size(), to.size());
      const DirEntry& e = top.at(from);
      auto edit = [&](Block& b, int s) { std::memcpy(ItemData(b, s) + sizeof(fmtd::DirItem), to.data(), to.size()); };
      layout_.DamageItem(*patcher_, layout_.fs_root, Key{256, fmtd::kDirIndexKey, e.index}, edit);
      if (item) layout_.DamageItem(*patcher_, layout_.fs_root, Key{256, fmtd::kDirItemKey, fmtd::NameHash(from)}, edit);
    };
    rename("yy", "..", true);
    rename("zz", "..", true);
    rename("ab", "aa", true);
    rename("abcd", "../e", true);
    rename("n0x", std::string("n\0x", 3), true);
    rename("axb", "a/b", true);
    rename("dup2", "dup1", false);
    // orph keeps its DIR_INDEX; its DIR_ITEM now holds another name.
    layout_.DamageItem(*patcher_, layout_.fs_root, Key{256, fmtd::kDirItemKey, fmtd::NameHash("orph")},
                       [](Block& b, int s) { ItemData(b, s)[sizeof(fmtd::DirItem) + 3] = 'X'; });
    // The 256-byte name: the DIR_INDEX grows by one byte.
    layout_.DamageItem(*patcher_, layout_.fs_root, Key{256, fmtd::kDirIndexKey, top.at(long_name_).index},
                       [](Block& b, int s) {
                         const size_t old = ItemAt(b, s).size.get();
                         ResizeItem(b, s, old + 1);
                         auto& di = ItemAs<fmtd::DirItem>(b, s);
                         di.name_len.set(256);
                         ItemData(b, s)[old] = 'L';
                       });
    // loopdir's entries point at the top directory.
    auto to_root = [](Block& b, int s) { Key{256, fmtd::kInodeItemKey, 0}.To(&ItemAs<fmtd::DirItem>(b, s).location); };
    layout_.DamageItem(*patcher_, layout_.fs_root, Key{256, fmtd::kDirIndexKey, top.at("loopdir").index}, to_root);
    layout_.DamageItem(*patcher_, layout_.fs_root, Key{256, fmtd::kDirItemKey, fmtd::NameHash("loopdir")}, to_root);
  }

  // Runs `ubtrfs cp ARGS... img:SRC DEST` and asserts that nothing outside
  // DEST changed in the sandbox.
  CommandResult CpOut(const std::string& src, const std::string& dest, const std::vector<std::string>& flags = {}) {
    const auto before = Listing(sandbox_);
    std::vector<std::string> argv{kCli, "cp"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(img_ + ":" + src);
    argv.push_back(dest);
    auto r = RunCommand(argv);
    const auto after = Listing(sandbox_);
    const auto changed = ChangedOutside(before, after, sandbox_, dest);
    EXPECT_TRUE(changed.empty()) << ShellJoin(argv) << " changed things outside " << dest << ":\n"
                                 << ::testing::PrintToString(changed) << "\n" << r.Describe();
    EXPECT_EQ(ReadHostFile(sandbox_ + "/out/deep/f"), "precious\n");
    EXPECT_EQ(Listing(sandbox_ + "/victim").size(), 0u);
    return r;
  }

  void ExpectGoodCopied(const std::string& dest) {
    for (const auto& [p, data] : good_) {
      if (p.starts_with("loopdir/")) continue;
      EXPECT_EQ(ReadHostFile(dest + "/" + p), data) << p;
    }
    char target[64] = {};
    EXPECT_EQ(::readlink((dest + "/l1").c_str(), target, sizeof target - 1), 2);
    EXPECT_STREQ(target, "l2");
    struct stat a, b;
    ASSERT_EQ(::stat((dest + "/hl/one").c_str(), &a), 0);
    ASSERT_EQ(::stat((dest + "/other/two").c_str(), &b), 0);
    EXPECT_EQ(a.st_ino, b.st_ino) << "hard link not kept";
    // The symlink aa is copied as a symlink; the directory of the same name is not.
    struct stat l;
    ASSERT_EQ(::lstat((dest + "/aa").c_str(), &l), 0);
    EXPECT_TRUE(S_ISLNK(l.st_mode));
  }

  TempDir tmp_{"ubtrfs-hostile"};
  std::string sandbox_, img_, long_name_;
  std::map<std::string, std::string> good_;  // path in the image -> contents, of the entries left intact
  Layout layout_;
  std::unique_ptr<Patcher> patcher_;
};

TEST_F(HostileNamesTest, ReadDirNeverYieldsAnInvalidOrDuplicateName) {
  auto fs = Filesystem::Open(img_);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  std::vector<SkippedEntry> skipped;
  auto entries = (*fs)->ReadDir((*fs)->Root(), &skipped);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  std::set<std::string> names;
  for (const auto& e : *entries) {
    EXPECT_TRUE(names.insert(e.name).second) << "listed twice: " << Printable(e.name);
    EXPECT_FALSE(e.name == "." || e.name == ".." || e.name.find('/') != std::string::npos ||
                 e.name.find('\0') != std::string::npos || e.name.size() > 255)
        << Printable(e.name);
  }
  std::map<std::string, std::string> reasons;
  for (const auto& s : skipped) reasons[s.name] += s.reason + ";";
  EXPECT_EQ(skipped.size(), 8u);
  EXPECT_EQ(reasons.size(), 7u) << ::testing::PrintToString(reasons);
  EXPECT_NE(reasons[".."].find("\"..\""), std::string::npos);
  EXPECT_NE(reasons["../e"].find("'/'"), std::string::npos);
  EXPECT_NE(reasons["a/b"].find("'/'"), std::string::npos);
  EXPECT_NE(reasons[std::string("n\0x", 3)].find("NUL"), std::string::npos);
  EXPECT_NE(reasons[std::string(256, 'L')].find("255"), std::string::npos);
  EXPECT_NE(reasons["aa"].find("duplicate"), std::string::npos);
  EXPECT_NE(reasons["dup1"].find("duplicate"), std::string::npos);
  // Two entries named ".." (a directory and a file).
  EXPECT_EQ(std::count_if(skipped.begin(), skipped.end(), [](const auto& s) { return s.name == ".."; }), 2);
  // The first entry of a name is the one listed: aa is the symlink.
  for (const auto& e : *entries) {
    if (e.name == "aa") {
      EXPECT_EQ(e.type, DT_LNK);
    }
  }
  // The entry without a DIR_ITEM is listed (its name is valid and unique)
  // but cannot be looked up, as in the kernel.
  EXPECT_EQ(names.count("orph"), 1u);
  EXPECT_EQ((*fs)->Lookup("/orph").status().code(), ENOENT);
  // Lookups of names no listing could give are refused, not searched.
  EXPECT_EQ((*fs)->LookupChild((*fs)->Root(), "a/b").status().code(), EINVAL);
  EXPECT_EQ((*fs)->LookupChild((*fs)->Root(), std::string("n\0x", 3)).status().code(), EINVAL);
  EXPECT_EQ((*fs)->LookupChild((*fs)->Root(), std::string(256, 'L')).status().code(), ENAMETOOLONG);
}

TEST_F(HostileNamesTest, CpOutStaysInsideTheDestination) {
  const std::string dest = sandbox_ + "/out/deep/x";
  auto r = CpOut("/", dest);
  // Skipped entries are warnings; the directory loop too.
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  for (const char* w : {"\"..\"", "'/'", "NUL", "longer than 255", "duplicate", "already copied"}) {
    EXPECT_NE(r.err.find(w), std::string::npos) << "no warning about " << w << ":\n" << r.err;
  }
  ExpectGoodCopied(dest);
  EXPECT_EQ(ReadHostFile(dest + "/dup1"), "the first dup1\n");
  EXPECT_EQ(ReadHostFile(dest + "/orph"), "indexed only\n");
  // Nothing named after a skipped entry was made.
  for (const char* bad : {"a", "e", "n", "loopdir/inner"}) {
    struct stat s;
    EXPECT_NE(::lstat((dest + "/" + bad).c_str(), &s), 0) << bad;
  }
  EXPECT_EQ(Listing(dest + "/loopdir").size(), 0u);  // the loop directory itself is the top: not copied again
}

TEST_F(HostileNamesTest, StrictCpFailsButStillCopiesTheGoodEntries) {
  const std::string dest = sandbox_ + "/out/strict";
  auto r = CpOut("/", dest, {"--strict"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("duplicate"), std::string::npos) << r.err;
  ExpectGoodCopied(dest);
}

TEST_F(HostileNamesTest, CpOutRefusesToWriteThroughAnExistingSymlink) {
  // A destination that already holds a symlink where the image has a
  // directory: the copy of that directory stops with an error.
  const std::string dest = sandbox_ + "/out/pre";
  ASSERT_EQ(::mkdir(dest.c_str(), 0755), 0);
  ASSERT_EQ(::symlink((sandbox_ + "/victim").c_str(), (dest + "/good").c_str()), 0);
  // And a file there that is a hard link to a file outside: replaced, not written through.
  ASSERT_TRUE(TryWriteHostFile(sandbox_ + "/victim-file", "outside\n"));
  ASSERT_EQ(::link((sandbox_ + "/victim-file").c_str(), (dest + "/keep.txt").c_str()), 0);
  auto r = CpOut("/", dest);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("is not a directory"), std::string::npos) << r.err;
  EXPECT_EQ(ReadHostFile(sandbox_ + "/victim-file"), "outside\n");
  EXPECT_EQ(ReadHostFile(dest + "/keep.txt"), "keep me\n");
}

TEST_F(HostileNamesTest, HardLinkOutsideTheCopiedSubtreeIsAPlainFile) {
  const std::string dest = sandbox_ + "/out/sub";
  auto r = CpOut("/hl", dest);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(ReadHostFile(dest + "/one"), "linked twice\n");
  struct stat s;
  ASSERT_EQ(::stat((dest + "/one").c_str(), &s), 0);
  EXPECT_EQ(s.st_nlink, 1u);
}

TEST_F(HostileNamesTest, ExportTreeReportsWhatItSkipped) {
  auto fs = Filesystem::Open(img_);
  ASSERT_TRUE(fs.ok());
  const std::string dest = sandbox_ + "/out/lib";
  std::vector<std::string> messages;
  ubtrfs::ExportOptions opts;
  opts.on_message = [&](bool, std::string_view m) { messages.emplace_back(m); };
  ubtrfs::ExportReport report;
  const auto before = Listing(sandbox_);
  auto st = ubtrfs::ExportTree(**fs, (*fs)->Root(), "img:/", dest, opts, &report);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(ChangedOutside(before, Listing(sandbox_), sandbox_, dest).empty());
  // 8 skipped entries (two named ".."), and the directory loop.
  EXPECT_EQ(report.warnings, 9u) << ::testing::PrintToString(messages);
  EXPECT_EQ(report.errors, 0u);
  EXPECT_EQ(report.hardlinks, 1u);
  ExpectGoodCopied(dest);
}

TEST_F(HostileNamesTest, MountListsNoInvalidOrDuplicateName) {
  const std::string reason = FuseUnavailableReason();
  if (!reason.empty()) GTEST_SKIP() << reason;
  const std::string mnt = tmp_.Sub("mnt");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  MountProcess m;
  std::string skip, error;
  if (!m.Start(img_, mnt, tmp_.Sub("mount.log"), {"-o", "ro"}, &skip, &error)) {
    if (!skip.empty()) GTEST_SKIP() << skip;
    FAIL() << error;
  }
  std::multiset<std::string> names;
  DIR* d = ::opendir(mnt.c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = ::readdir(d)) names.insert(e->d_name);
  ::closedir(d);
  EXPECT_EQ(names.count(".."), 1u);  // the real parent only
  EXPECT_EQ(names.count("."), 1u);
  EXPECT_EQ(names.count("aa"), 1u);
  EXPECT_EQ(names.count("dup1"), 1u);
  for (const auto& n : names) EXPECT_LE(n.size(), 255u);
  EXPECT_EQ(ReadHostFile(mnt + "/keep.txt"), "keep me\n");
  struct stat s;
  ASSERT_EQ(::lstat((mnt + "/aa").c_str(), &s), 0);
  EXPECT_TRUE(S_ISLNK(s.st_mode));
  std::string err;
  EXPECT_EQ(m.Unmount(&err), 0) << err;
  const std::string log = m.Log();
  EXPECT_NE(log.find("damaged entries not shown"), std::string::npos) << log;
}

}  // namespace

namespace UBTRFS_UNITY_ID {

// What a copy out keeps of set-id bits, device nodes and privileged xattrs:
// everything when privileged; as GNU tar for an ordinary user otherwise.
class ExportPrivilegeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "making a device node and trusted.* xattrs for the image needs root";
    const std::string src = tmp_.Sub("src");
    ASSERT_EQ(::mkdir(src.c_str(), 0755), 0);
    ASSERT_TRUE(TryWriteHostFile(src + "/suid", "#!/bin/sh\n"));
    ASSERT_EQ(::chmod((src + "/suid").c_str(), 06755), 0);
    ASSERT_EQ(::mknod((src + "/null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
    ASSERT_EQ(::mkfifo((src + "/fifo").c_str(), 0644), 0);
    ASSERT_EQ(::setxattr((src + "/suid").c_str(), "trusted.t", "T", 1, 0), 0);
    ASSERT_EQ(::setxattr((src + "/suid").c_str(), "user.u", "U", 1, 0), 0);
    img_ = tmp_.Sub("img");
    auto mk = RunCommand({kCli, "mkfs", "-q", "--size", "128M", "--rootdir", src, img_});
    ASSERT_TRUE(mk.ok()) << mk.Describe();
  }
  ubtrfs::ExportReport Export(const std::string& dest, ubtrfs::ExportOptions opts) {
    auto fs = Filesystem::Open(img_);
    EXPECT_TRUE(fs.ok());
    ubtrfs::ExportReport r;
    if (!fs.ok()) return r;
    opts.on_message = [&](bool, std::string_view m) { messages_ += std::string(m) + "\n"; };
    auto st = ubtrfs::ExportTree(**fs, (*fs)->Root(), "img:/", dest, opts, &r);
    EXPECT_TRUE(st.ok()) << st.ToString() << "\n" << messages_;
    return r;
  }
  static bool HasXattr(const std::string& p, const char* name) {
    char v[16];
    return ::getxattr(p.c_str(), name, v, sizeof v) >= 0;
  }
  TempDir tmp_{"ubtrfs-export"};
  std::string img_, messages_;
};

TEST_F(ExportPrivilegeTest, UnprivilegedCopyDropsSetIdDevicesAndPrivilegedXattrs) {
  ubtrfs::ExportOptions opts;
  opts.privileged = false;
  const std::string dest = tmp_.Sub("out");
  auto r = Export(dest, opts);
  struct stat s;
  ASSERT_EQ(::stat((dest + "/suid").c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 07777, 0755u);
  EXPECT_NE(::lstat((dest + "/null").c_str(), &s), 0) << "device node made";
  EXPECT_NE(messages_.find("device node not made"), std::string::npos) << messages_;
  ASSERT_EQ(::lstat((dest + "/fifo").c_str(), &s), 0);
  EXPECT_TRUE(S_ISFIFO(s.st_mode));
  EXPECT_FALSE(HasXattr(dest + "/suid", "trusted.t"));
  EXPECT_TRUE(HasXattr(dest + "/suid", "user.u"));
  EXPECT_NE(messages_.find("xattrs in trusted.* not copied"), std::string::npos) << messages_;
  EXPECT_EQ(r.errors, 0u);
}

TEST_F(ExportPrivilegeTest, PrivilegedCopyKeepsThemUnlessSwitchedOff) {
  const std::string dest = tmp_.Sub("out");
  ubtrfs::ExportOptions opts;
  opts.privileged = true;
  Export(dest, opts);
  struct stat s;
  ASSERT_EQ(::stat((dest + "/suid").c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 07777, 06755u);
  ASSERT_EQ(::lstat((dest + "/null").c_str(), &s), 0);
  EXPECT_TRUE(S_ISCHR(s.st_mode));
  EXPECT_EQ(s.st_rdev, makedev(1, 3));
  EXPECT_TRUE(HasXattr(dest + "/suid", "trusted.t"));

  // The CLI's switches.
  const std::string dest2 = tmp_.Sub("out2");
  auto cp = RunCommand({kCli, "cp", "--no-devices", "--no-xattrs", img_ + ":/", dest2});
  EXPECT_TRUE(cp.ok()) << cp.Describe();
  EXPECT_NE(::lstat((dest2 + "/null").c_str(), &s), 0);
  EXPECT_FALSE(HasXattr(dest2 + "/suid", "user.u"));
  EXPECT_FALSE(HasXattr(dest2 + "/suid", "trusted.t"));
}

}  // namespace
