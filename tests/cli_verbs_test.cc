// The editing verbs (cli/verbs.cc) and `ubtrfs edit`, against coreutils and
// attr doing the same on a host directory, then against the kernel's view of
// the image (a loop mount where the machine has them, else btrfs check).
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/array_mount.h"
#include "support/fuse_mount.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_compare.h"
#include "ubtrfs/filesystem.h"

#ifndef UBTRFS_CLI_PATH
#error "UBTRFS_CLI_PATH must name the ubtrfs executable"
#endif

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs_test;
const std::string kCli = UBTRFS_CLI_PATH;

std::string ReadFile(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

class CliVerbsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (FindProgram("setfattr").empty()) GTEST_SKIP() << "setfattr (attr package) not installed";
    host_ = tmp_.Sub("host");
    ASSERT_EQ(::mkdir(host_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((host_ + "/dir1").c_str(), 0755), 0);
    ASSERT_TRUE(WriteFile("a", "file a\n"));
    ASSERT_TRUE(WriteFile("dir1/b", std::string(5000, 'b')));
    ASSERT_TRUE(WriteFile("dir1/c", "c contents\n"));
    ASSERT_EQ(::setxattr((host_ + "/dir1/b").c_str(), "user.old", "x", 1, 0), 0);
    img_ = tmp_.Sub("img");
    auto mk = RunCommand({kCli, "mkfs", "-q", "--size", "128M", "--rootdir", host_, img_});
    ASSERT_TRUE(mk.ok()) << mk.Describe();
  }
  bool WriteFile(const std::string& rel, const std::string& data) {
    std::ofstream out(host_ + "/" + rel, std::ios::binary);
    out << data;
    return static_cast<bool>(out);
  }
  // The same change both ways: `host` runs in the host directory, `verb`
  // on the image; both must succeed.
  void Both(const std::vector<std::string>& host, const std::vector<std::string>& verb) {
    std::vector<std::string> h = {"sh", "-c", "cd \"$0\" && exec \"$@\"", host_};
    h.insert(h.end(), host.begin(), host.end());
    auto hr = RunCommand(h);
    ASSERT_TRUE(hr.ok()) << ShellJoin(host) << ": " << hr.Describe();
    std::vector<std::string> v = {kCli};
    v.insert(v.end(), verb.begin(), verb.end());
    auto vr = RunCommand(v);
    ASSERT_TRUE(vr.ok()) << ShellJoin(v) << ": " << vr.Describe();
  }
  std::string I(const std::string& path) const { return img_ + ":" + path; }
  CommandResult Ubtrfs(std::vector<std::string> args) {
    args.insert(args.begin(), kCli);
    return RunCommand(args);
  }
  void ExpectSameTree(const std::set<std::string>& changed_now) {
    auto fs = ubtrfs::Filesystem::Open(img_);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    CompareOptions o;
    o.compare_dir_mtime = false;  // each side's directories changed at its own "now"
    o.compare_top_attrs = false;
    o.skip_times = [changed_now](const std::string& rel) { return changed_now.count(rel) != 0; };
    auto m = CompareTreeToImage(host_, **fs, o);
    EXPECT_TRUE(m.empty()) << FormatMismatches(m);
    fs->reset();
    EXPECT_EQ(BtrfsCheck(img_), "");
    std::string why;
    if (!LoopMountsAvailable(&why)) {
      std::cout << "[ kernel view skipped: " << why << " ]\n";
      return;
    }
    LoopMount mnt;
    const std::string dir = tmp_.Sub("mnt");
    ::mkdir(dir.c_str(), 0755);
    ASSERT_EQ(mnt.Mount(img_, dir, "ro"), "");
    auto km = CompareHostTrees(host_, dir, o);
    EXPECT_TRUE(km.empty()) << "kernel view: " << FormatMismatches(km);
    EXPECT_EQ(mnt.Unmount(), "");
  }
  // The host-side list of operations and the verbs doing the same.
  void ApplyTheEdits() {
    Both({"touch", "-d", "2021-03-04 05:06:07.5", "a"}, {"touch", "-d", "2021-03-04 05:06:07.5", I("/a")});
    Both({"touch", "new"}, {"touch", I("/new")});
    Both({"mv", "a", "dir1"}, {"mv", I("/a"), I("/dir1")});
    Both({"mv", "dir1/b", "b2"}, {"mv", I("/dir1/b"), I("/b2")});
    Both({"ln", "b2", "b3"}, {"ln", I("/b2"), I("/b3")});
    Both({"ln", "-s", "../b2", "dir1/sl"}, {"ln", "-s", "../b2", I("/dir1/sl")});
    Both({"chmod", "0640", "b2"}, {"chmod", "0640", I("/b2")});
    Both({"chmod", "u+x,go-r", "dir1/c"}, {"chmod", "u+x,go-r", I("/dir1/c")});
    if (::geteuid() == 0) Both({"chown", "1234:5678", "b3"}, {"chown", "1234:5678", I("/b3")});
    Both({"truncate", "-s", "10K", "b2"}, {"truncate", "-s", "10K", I("/b2")});
    Both({"truncate", "-s", "-5", "dir1/c"}, {"truncate", "-s", "-5", I("/dir1/c")});
    Both({"setfattr", "-n", "user.k", "-v", "value", "dir1/c"}, {"setfattr", "-n", "user.k", "-v", "value", I("/dir1/c")});
    Both({"setfattr", "-n", "user.h", "-v", "0x00ff10", "dir1/c"},
         {"setfattr", "-n", "user.h", "-v", "0x00ff10", I("/dir1/c")});
    Both({"setfattr", "-x", "user.old", "b2"}, {"setfattr", "-x", "user.old", I("/b2")});
  }
  const std::set<std::string> kChangedNow = {"new", "b2", "b3", "dir1/c", "dir1/sl"};

  TempDir tmp_{"ubtrfs-verbs"};
  std::string host_, img_;
};

TEST_F(CliVerbsTest, EachVerbDoesWhatCoreutilsDo) {
  ApplyTheEdits();
  ExpectSameTree(kChangedNow);
}

// The verbs' other forms: mkdir -p/-m, rm -r, rmdir, touch -a/-m/-c,
// ln -f, mv over a file and into a directory, put, truncate -s +N and -c,
// chmod with X, setfattr with a base64 value; the host does the same with
// coreutils, then the kernel's view of the image.
TEST_F(CliVerbsTest, TheVerbsOtherFormsDoWhatCoreutilsDo) {
  Both({"mkdir", "-p", "x/y/z"}, {"mkdir", "-p", I("/x/y/z")});
  Both({"mkdir", "-m", "0700", "m"}, {"mkdir", "-m", "0700", I("/m")});
  Both({"mkdir", "-p", "gone/deep"}, {"mkdir", "-p", I("/gone/deep")});
  Both({"touch", "gone/deep/f"}, {"touch", I("/gone/deep/f")});
  Both({"rm", "-r", "gone"}, {"rm", "-r", I("/gone")});
  Both({"rmdir", "x/y/z"}, {"rmdir", I("/x/y/z")});
  Both({"touch", "-m", "-d", "2020-01-02 03:04:05", "a"}, {"touch", "-m", "-d", "2020-01-02 03:04:05", I("/a")});
  Both({"touch", "-a", "-d", "2019-05-06 07:08:09.25", "a"}, {"touch", "-a", "-d", "2019-05-06 07:08:09.25", I("/a")});
  Both({"touch", "-c", "never"}, {"touch", "-c", I("/never")});
  Both({"ln", "-f", "a", "dir1/c"}, {"ln", "-f", I("/a"), I("/dir1/c")});
  Both({"ln", "-sf", "elsewhere", "x/y"}, {"ln", "-sf", "elsewhere", I("/x/y")});  // into the directory y
  Both({"mv", "dir1/b", "a"}, {"mv", I("/dir1/b"), I("/a")});                    // replaces a file
  Both({"mv", "m", "x"}, {"mv", I("/m"), I("/x")});                              // into a directory
  Both({"truncate", "-s", "+3K", "a"}, {"truncate", "-s", "+3K", I("/a")});
  Both({"truncate", "-c", "-s", "1K", "absent"}, {"truncate", "-c", "-s", "1K", I("/absent")});
  Both({"truncate", "-s", "2KB", "sized"}, {"truncate", "-s", "2KB", I("/sized")});
  Both({"chmod", "a-x,u+X", "x"}, {"chmod", "a-x,u+X", I("/x")});
  Both({"chmod", "go=u-w", "sized"}, {"chmod", "go=u-w", I("/sized")});
  Both({"setfattr", "-n", "user.b64", "-v", "0sAAEC/w==", "sized"},
       {"setfattr", "-n", "user.b64", "-v", "0sAAEC/w==", I("/sized")});
  const std::string data = std::string(70000, 'q') + "tail";
  const std::string src = tmp_.Sub("put-data");
  std::ofstream(src, std::ios::binary) << data;
  auto hp = RunCommand({"sh", "-c", "cat > \"$0/put\" < \"$1\" && cat > \"$0/a\" < \"$1\"", host_, src});
  ASSERT_TRUE(hp.ok()) << hp.Describe();
  for (const std::string p : {"/put", "/a"}) {  // a new file, and one replaced
    auto r = RunCommand({"sh", "-c", "\"$0\" put \"$1\" < \"$2\"", kCli, I(p), src});
    ASSERT_TRUE(r.ok()) << r.Describe();
  }
  // touch -a set only the access time (not compared by the tree walk).
  struct stat hs;
  ASSERT_EQ(::stat((host_ + "/x/m").c_str(), &hs), 0);
  auto st = Ubtrfs({"stat", "--json", I("/dir1/c")});
  struct stat hc;
  ASSERT_EQ(::lstat((host_ + "/dir1/c").c_str(), &hc), 0);
  EXPECT_NE(st.out.find(fmt::format("\"atime\": {}.{:09},", hc.st_atim.tv_sec, hc.st_atim.tv_nsec)), std::string::npos)
      << st.out;
  ExpectSameTree({"a", "dir1", "dir1/c", "put", "sized", "x", "x/y", "x/y/elsewhere", "x/m"});
}

// chmod's mode language against chmod(1): octal (short forms keep a
// directory's set-id bits), symbolic clauses with and without classes (the
// umask), X as the mode is by then, copies from a class (go=u), s and t,
// '=' on directories; on files and directories of several modes.
TEST_F(CliVerbsTest, ChmodAgreesWithChmodOnEveryForm) {
  const std::vector<std::string> specs = {
      "755", "0755", "00755", "644", "2755", "=x,u+X", "go=u-w", "u=g", "o=u,g-r", "a=r", "=rw", "=u", "+x",
      "u+s", "g+s", "o+s", "+t", "u+t", "o+t", "a=rwx,o-t", "a+X", "u+X", "g=o", "=x", "+s", "-s", "u=rwxs",
      "a-x,u+X", "ug=rw,o=", "u=rw-x", "+rw,-x", "u+x,go=u", "a=u", "g-u", "ugo=g", "u+rw+x", "u-wx+r", "go+u",
      "=,u+r"};
  const std::vector<std::string> inits = {"0644", "0755", "0700", "4755", "1777", "0000", "2750"};
  const mode_t old_umask = ::umask(022);
  std::string host_script = "cd \"$0\" && umask 022", edit_script;
  std::vector<std::pair<std::string, std::string>> files;  // name, spec
  for (const auto& spec : specs) {
    for (const auto& init : inits) {
      for (const char kind : {'f', 'd'}) {
        const std::string name = fmt::format("m{}", files.size());
        host_script += kind == 'd' ? " && mkdir " + name : " && touch " + name;
        host_script += " && chmod " + init + " " + name + " && chmod -- '" + spec + "' " + name;
        edit_script += fmt::format("{} /{}\nchmod {} /{}\nchmod -- '{}' /{}\n", kind == 'd' ? "mkdir" : "touch", name,
                                   init, name, spec, name);
        files.emplace_back(name, spec);
      }
    }
  }
  auto hr = RunCommand({"sh", "-c", host_script, host_});
  ASSERT_TRUE(hr.ok()) << hr.Describe();
  const std::string script = tmp_.Sub("chmod-script");
  std::ofstream(script) << edit_script;
  auto r = Ubtrfs({"edit", img_, "-f", script});
  ::umask(old_umask);
  ASSERT_TRUE(r.ok()) << r.Describe();
  auto fs = ubtrfs::Filesystem::Open(img_);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  int wrong = 0;
  for (const auto& [name, spec] : files) {
    struct stat hs;
    ASSERT_EQ(::lstat((host_ + "/" + name).c_str(), &hs), 0);
    auto id = (*fs)->Lookup("/" + name);
    ASSERT_TRUE(id.ok()) << name;
    auto st = (*fs)->GetStat(*id);
    ASSERT_TRUE(st.ok());
    if (st->mode != hs.st_mode && ++wrong <= 20) {
      ADD_FAILURE() << "chmod " << spec << " on " << name << ": host " << fmt::format("{:o}", hs.st_mode)
                    << ", ubtrfs " << fmt::format("{:o}", st->mode);
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST_F(CliVerbsTest, ReadingVerbsPrintWhatTheHostToolsPrint) {
  ApplyTheEdits();
  // find: the same paths (rooted at "." on the host, "/" in the image).
  auto hf = RunCommand({"sh", "-c", "cd \"$0\" && find . -type f | sort", host_});
  auto vf = Ubtrfs({"find", I("/"), "-type", "f"});
  ASSERT_TRUE(vf.ok()) << vf.Describe();
  std::vector<std::string> want, got = Lines(vf.out);
  for (const auto& l : Lines(hf.out)) want.push_back(l.substr(1));
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  auto hn = RunCommand({"sh", "-c", "cd \"$0\" && find . -name 'b*' | sort", host_});
  auto vn = Ubtrfs({"find", I("/"), "-name", "b*"});
  got = Lines(vn.out);
  std::sort(got.begin(), got.end());
  want.clear();
  for (const auto& l : Lines(hn.out)) want.push_back(l.substr(1));
  EXPECT_EQ(got, want);
  // getfattr -d: byte for byte.
  auto hg = RunCommand({"sh", "-c", "cd \"$0\" && getfattr -d dir1/c", host_});
  auto vg = Ubtrfs({"getfattr", "-d", I("/dir1/c")});
  EXPECT_EQ(vg.out, hg.out);
  auto hx = RunCommand({"sh", "-c", "cd \"$0\" && getfattr -n user.h dir1/c", host_});
  auto vx = Ubtrfs({"getfattr", "-n", "user.h", I("/dir1/c")});
  EXPECT_EQ(vx.out, hx.out);
  // du -ab: the files' apparent sizes (directories' sizes are each file system's own).
  auto hd = RunCommand({"sh", "-c", "cd \"$0\" && du -ab . | grep -v '\t\\.$'", host_});
  auto vd = Ubtrfs({"du", "-ab", I("/")});
  ASSERT_TRUE(vd.ok()) << vd.Describe();
  std::map<std::string, std::string> hsizes, vsizes;
  struct stat s;
  for (const auto& l : Lines(hd.out)) {
    const auto tab = l.find('\t');
    const std::string p = l.substr(tab + 3);  // "./"
    if (::lstat((host_ + "/" + p).c_str(), &s) == 0 && !S_ISDIR(s.st_mode)) hsizes[p] = l.substr(0, tab);
  }
  for (const auto& l : Lines(vd.out)) {
    const auto tab = l.find('\t');
    const std::string p = l.substr(tab + 2);
    if (hsizes.count(p) || (::lstat((host_ + "/" + p).c_str(), &s) == 0 && !S_ISDIR(s.st_mode))) {
      vsizes[p] = l.substr(0, tab);
    }
  }
  // A file with two links counts once, under whichever name the walk meets
  // first (readdir order differs between the two file systems).
  for (auto* m : {&hsizes, &vsizes}) {
    EXPECT_EQ(m->count("b2") + m->count("b3"), 1u);
    const std::string linked = m->count("b2") ? (*m)["b2"] : (*m)["b3"];
    m->erase("b2");
    m->erase("b3");
    (*m)["b2|b3"] = linked;
  }
  EXPECT_EQ(vsizes, hsizes);
  // stat --json: the attributes lstat gives on the host.
  auto vs = Ubtrfs({"stat", "--json", I("/b2")});
  ASSERT_TRUE(vs.ok()) << vs.Describe();
  ASSERT_EQ(::lstat((host_ + "/b2").c_str(), &s), 0);
  EXPECT_NE(vs.out.find("\"size\": " + std::to_string(s.st_size) + ","), std::string::npos) << vs.out;
  EXPECT_NE(vs.out.find("\"mode\": " + std::to_string(s.st_mode) + ","), std::string::npos) << vs.out;
  EXPECT_NE(vs.out.find("\"nlink\": 2,"), std::string::npos) << vs.out;
  // tree and df print.
  auto vt = Ubtrfs({"tree", I("/")});
  EXPECT_NE(vt.out.find("└── "), std::string::npos) << vt.out;
  EXPECT_NE(vt.out.find("2 directories, 6 files"), std::string::npos) << vt.out;  // tree(1) 2.x counts the top
  auto vdf = Ubtrfs({"df", "--json", img_});
  EXPECT_NE(vdf.out.find("\"total_bytes\": 134217728"), std::string::npos) << vdf.out;
}

// `ubtrfs tree` prints what tree(1) prints for the same directory (all but
// the first line, which names the directory): hidden names only with -a,
// symlinks to directories counted as directories, dangling ones as files,
// -L, names with spaces, byte order (tree in a C.UTF-8 locale).
TEST_F(CliVerbsTest, TreeAsTreeOneShowsIt) {
  if (FindProgram("tree").empty()) GTEST_SKIP() << "tree not installed (scripts/deps.sh installs it)";
  for (const char* d : {"/D", "/D/sub", "/D/sub/deeper", "/empty", "/with space", "/.hdir"}) {
    ASSERT_EQ(::mkdir((host_ + d).c_str(), 0755), 0) << d;
  }
  for (const char* f : {"D/B", "D/a", "D/sub/deeper/x", "with space/f g", ".hidden", ".hdir/in", "_u", "Zed"}) {
    ASSERT_TRUE(WriteFile(f, "x"));
  }
  ASSERT_EQ(::symlink("D", (host_ + "/ldir").c_str()), 0);
  ASSERT_EQ(::symlink("../D/sub", (host_ + "/D/up").c_str()), 0);
  ASSERT_EQ(::symlink("nowhere", (host_ + "/dangling").c_str()), 0);
  ASSERT_EQ(::symlink("loop", (host_ + "/loop").c_str()), 0);
  ASSERT_EQ(::mkfifo((host_ + "/fifo").c_str(), 0644), 0);
  ASSERT_EQ(::unlink(img_.c_str()), 0);
  auto mk = RunCommand({kCli, "mkfs", "-q", "--size", "128M", "--rootdir", host_, img_});
  ASSERT_TRUE(mk.ok()) << mk.Describe();
  auto body = [](const std::string& out) { return out.substr(std::min(out.size(), out.find('\n') + 1)); };
  for (const std::vector<std::string>& opts :
       std::vector<std::vector<std::string>>{{}, {"-a"}, {"-L", "2"}, {"-a", "-L", "1"}}) {
    std::vector<std::string> h = {"env", "LC_ALL=C.UTF-8", "sh", "-c", "cd \"$0\" && exec tree \"$@\" .", host_};
    h.insert(h.end(), opts.begin(), opts.end());
    auto hr = RunCommand(h);
    ASSERT_TRUE(hr.ok()) << hr.Describe();
    std::vector<std::string> v = {"tree"};
    v.insert(v.end(), opts.begin(), opts.end());
    v.push_back(I("/"));
    auto vr = Ubtrfs(v);
    ASSERT_TRUE(vr.ok()) << vr.Describe();
    EXPECT_EQ(body(vr.out), body(hr.out)) << ShellJoin(opts);
  }
  auto hr = RunCommand({"env", "LC_ALL=C.UTF-8", "sh", "-c", "cd \"$0\" && exec tree .", host_ + "/D"});
  auto vr = Ubtrfs({"tree", I("/D")});
  ASSERT_TRUE(vr.ok()) << vr.Describe();
  EXPECT_EQ(body(vr.out), body(hr.out));
}

TEST_F(CliVerbsTest, ErrorsAreTheCoreutilsOnes) {
  auto mv = Ubtrfs({"mv", I("/nope"), I("/x")});
  EXPECT_EQ(mv.exit_code, 1);
  EXPECT_NE(mv.err.find("mv: cannot stat '/nope': No such file or directory"), std::string::npos) << mv.err;
  auto tr = Ubtrfs({"truncate", "-s", "12Q", I("/a")});
  EXPECT_EQ(tr.exit_code, 1);
  EXPECT_NE(tr.err.find("Invalid number"), std::string::npos) << tr.err;
  auto ch = Ubtrfs({"chmod", "u+q", I("/a")});
  EXPECT_NE(ch.err.find("invalid mode"), std::string::npos) << ch.err;
  auto td = Ubtrfs({"touch", "-d", "yesterday-ish", I("/a")});
  EXPECT_NE(td.err.find("invalid date format"), std::string::npos) << td.err;
  auto put_dir = RunCommand({"sh", "-c", "echo x | \"$0\" put \"$1\"", kCli, I("/dir1")});
  EXPECT_EQ(put_dir.exit_code, 1) << put_dir.Describe();
  auto two = Ubtrfs({"mv", I("/a"), tmp_.Sub("other") + ":/x"});
  EXPECT_EQ(two.exit_code, 2);
  // Arguments the parser refuses: 2, as usage errors (check: 8), not CLI11's 105 or 109.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"ls", "--rescue", "bogus", I("/")}, {"ls", "--partition", "0", I("/")},
        {"inspect", "logical-resolve", img_, "not-a-number"}, {"cat"}, {"nosuchverb"}}) {
    auto bad = Ubtrfs(args);
    EXPECT_EQ(bad.exit_code, 2) << ShellJoin(args) << ": " << bad.Describe();
    EXPECT_FALSE(bad.err.empty());
  }
  EXPECT_EQ(Ubtrfs({"check", "--super", "x", img_}).exit_code, 8);
  EXPECT_EQ(Ubtrfs({"--help"}).exit_code, 0);
  EXPECT_EQ(BtrfsCheck(img_), "");  // nothing half done
}

// Every verb's failures, word for word as the host's coreutils / attr give
// them for the same operation on the same tree (in the C locale): the
// ubtrfs line, less its "ubtrfs: " and with image paths made relative as the
// host's are, must end with the host tool's first line, and the exit codes
// agree. Nothing changes on either side.
TEST_F(CliVerbsTest, EachFailureReadsAsTheHostToolsDo) {
  // '@' marks a path: relative in the host directory, IMAGE:/path for ubtrfs.
  const std::vector<std::vector<std::string>> cases = {
      {"mv", "@nope", "@x"},
      {"mv", "@a", "@nodir/x"},
      {"mv", "@dir1", "@dir1/sub"},
      {"mv", "@dir1", "@dir1"},
      {"mv", "@a", "@a"},
      {"mv", "@a", "@dir1", "@nope"},
      {"mv", "@a", "@dir1", "@dir1/c"},
      {"mv", "@empty", "@a"},
      {"ln", "@nope", "@x"},
      {"ln", "@a", "@dir1/c"},
      {"ln", "@dir1", "@x"},
      {"ln", "@a", "@nodir/x"},
      {"ln", "-s", "t", "@dir1/c"},
      {"ln", "-s", "t", "@nodir/x"},
      {"chmod", "644", "@nope"},
      {"chmod", "u+q", "@a"},
      {"chown", "0:0", "@nope"},
      {"chown", "no-such-user-x", "@a"},
      {"chown", ":no-such-group-x", "@a"},
      {"chown", "root:no-such-group-x", "@a"},
      {"touch", "@nodir/x"},
      {"touch", "-d", "garbage", "@a"},
      {"truncate", "-s", "1K", "@dir1"},
      {"truncate", "-s", "12Q", "@a"},
      {"truncate", "-s", "1K", "@nodir/x"},
      {"setfattr", "-n", "user.x", "-v", "1", "@nope"},
      {"setfattr", "-x", "user.nope", "@a"},
      {"getfattr", "-n", "user.nope", "@a"},
      {"getfattr", "-d", "@nope"},
      {"stat", "@nope"},
      {"find", "@nope"},
      {"du", "@nope"},
      {"cat", "@nope"},
      {"cat", "@dir1"},
      {"mkdir", "@dir1"},
      {"mkdir", "@nodir/x"},
      {"rm", "@nope"},
      {"rm", "@dir1"},
      {"rmdir", "@nope"},
      {"rmdir", "@dir1"},
      {"rmdir", "@a"},
      {"ls", "@nope"},
      {"ls", "@a/x"},
  };
  ASSERT_EQ(::mkdir((host_ + "/empty").c_str(), 0755), 0);
  ASSERT_TRUE(Ubtrfs({"mkdir", I("/empty")}).ok());
  auto first_line = [](const std::string& s) { return s.substr(0, s.find('\n')); };
  auto replace_all = [](std::string s, const std::string& from, const std::string& to) {
    for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
    return s;
  };
  for (const auto& c : cases) {
    std::vector<std::string> host = {"env", "LC_ALL=C", "sh", "-c", "cd \"$0\" && exec \"$@\"", host_};
    std::vector<std::string> verb = {kCli};
    for (const auto& a : c) {
      host.push_back(a.starts_with("@") ? a.substr(1) : a);
      verb.push_back(a.starts_with("@") ? I("/" + a.substr(1)) : a);
    }
    auto hr = RunCommand(host);
    auto vr = RunCommand(verb);
    SCOPED_TRACE(ShellJoin(c));
    EXPECT_NE(hr.exit_code, 0) << "the host's " << c[0] << " did not fail: " << hr.Describe();
    EXPECT_EQ(vr.exit_code, hr.exit_code) << vr.Describe();
    // coreutils 9 says "cannot statx" where older ones said "cannot stat".
    const std::string want = replace_all(first_line(hr.err), "cannot statx", "cannot stat");
    std::string got = first_line(vr.err);
    ASSERT_TRUE(got.starts_with("ubtrfs: ")) << vr.err;
    got = got.substr(8);
    got = replace_all(replace_all(got, "'/", "'"), ": /", ": ");
    EXPECT_TRUE(!want.empty() && got.ends_with(want)) << "ubtrfs: " << got << "\n  host: " << want;
  }
  ExpectSameTree({});
}

TEST_F(CliVerbsTest, CatTakesImagePathsAndGoesOnPastAFailure) {
  auto host = RunCommand({"sh", "-c", "cd \"$0\" && cat a nope dir1/c", host_});
  auto verb = Ubtrfs({"cat", I("/a"), I("/nope"), I("/dir1/c")});
  EXPECT_EQ(verb.exit_code, host.exit_code);
  EXPECT_EQ(verb.out, host.out);
  EXPECT_EQ(verb.out, "file a\nc contents\n");
  // The older IMAGE PATH form.
  auto old_form = Ubtrfs({"cat", img_, "/dir1/c"});
  EXPECT_TRUE(old_form.ok()) << old_form.Describe();
  EXPECT_EQ(old_form.out, "c contents\n");
}

// --json on every read-only subcommand that prints a listing or a report:
// each output parses (one document, or one per line where a command prints
// one object per file) and holds what the image holds.
TEST_F(CliVerbsTest, JsonOutputsParseAndHoldTheImagesValues) {
  ApplyTheEdits();
  ASSERT_TRUE(Ubtrfs({"subvolume", "create", I("/sv")}).ok());
  auto json = [&](std::vector<std::string> args) {
    auto r = Ubtrfs(args);
    EXPECT_TRUE(r.ok()) << ShellJoin(args) << ": " << r.Describe();
    auto doc = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(doc.is_discarded()) << ShellJoin(args) << " printed no JSON:\n" << r.out;
    return doc;
  };
  struct stat hs;
  ASSERT_EQ(::lstat((host_ + "/b2").c_str(), &hs), 0);

  auto ls = json({"ls", "--json", img_, "/"});
  ASSERT_TRUE(ls.is_array());
  std::set<std::string> names;
  for (const auto& e : ls) names.insert(e.at("name").get<std::string>());
  EXPECT_EQ(names, (std::set<std::string>{"b2", "b3", "dir1", "new", "sv"}));
  auto lsl = json({"ls", "-l", "--json", img_, "/dir1"});
  int seen = 0;
  for (const auto& e : lsl) {
    if (e.at("name") == "sl") {
      EXPECT_EQ(e.at("target"), "../b2");
      ++seen;
    }
    if (e.at("name") == "c") {
      EXPECT_EQ(e.at("size").get<uint64_t>(), 6u);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 2) << lsl.dump();

  auto info = json({"info", "--json", img_});
  EXPECT_EQ(info.at("total_bytes").get<uint64_t>(), 128u << 20);
  EXPECT_EQ(info.at("sectorsize").get<uint64_t>(), 4096u);

  auto st = json({"stat", "--json", I("/b2")});
  EXPECT_EQ(st.at("size").get<uint64_t>(), static_cast<uint64_t>(hs.st_size));
  EXPECT_EQ(st.at("mode").get<uint32_t>(), hs.st_mode);
  EXPECT_EQ(st.at("nlink").get<uint32_t>(), 2u);
  // Several files: one object per line.
  auto two = Ubtrfs({"stat", "--json", I("/b2"), I("/dir1")});
  auto lines = Lines(two.out);
  ASSERT_EQ(lines.size(), 2u) << two.out;
  EXPECT_EQ(nlohmann::json::parse(lines[1]).at("type"), "directory");

  auto df = json({"df", "--json", img_});
  EXPECT_EQ(df.at("total_bytes").get<uint64_t>(), 128u << 20);
  EXPECT_EQ(df.at("used_bytes").get<uint64_t>() + df.at("free_bytes").get<uint64_t>(),
            df.at("total_bytes").get<uint64_t>());

  auto du = json({"du", "-b", "--json", I("/dir1")});
  ASSERT_TRUE(du.is_array());
  ASSERT_FALSE(du.empty());
  EXPECT_EQ(du.back().at("path"), "/dir1");

  auto gf = json({"getfattr", "--json", "-d", I("/dir1/c")});
  EXPECT_EQ(gf.at("xattrs").at("user.k"), "value");

  auto check = json({"check", "--json", img_});
  EXPECT_EQ(check.at("clean"), true);
  EXPECT_TRUE(check.at("errors").empty());

  auto stats = json({"stats", "--json", img_});
  EXPECT_FALSE(stats.at("trees").empty());

  auto subs = json({"subvolume", "list", "--json", img_});
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_EQ(subs[0].at("path"), "sv");
}

// df and du against the same commands on mounts of the image: du's figures
// are the kernel's (st_blocks as btrfs reports them), and so are df's, on a
// read-only ubtrfs FUSE mount and on a read-only kernel mount alike (StatFs
// counts as the kernel's btrfs_statfs does: src/fs/statfs.h;
// tests/statfs_kernel_test.cc compares more images, read-write mounts too).
TEST_F(CliVerbsTest, DfAndDuPrintWhatTheToolsPrintOnAMount) {
  ApplyTheEdits();
  ASSERT_TRUE(WriteFile("rand", std::string(3 << 20, 'r')));
  ASSERT_TRUE(Ubtrfs({"cp", host_ + "/rand", I("/rand")}).ok());
  auto columns = [](const std::string& df_out) {  // the numbers of df's second line
    auto lines = Lines(df_out);
    std::vector<std::string> out;
    if (lines.size() < 2) return out;
    std::stringstream ss(lines[1]);
    std::string w;
    ss >> w;  // the file system's name
    while (ss >> w && w.find('/') == std::string::npos && w != "-") out.push_back(w);
    return out;
  };
  auto ours = Ubtrfs({"df", img_});
  auto ours_h = Ubtrfs({"df", "-h", img_});
  ASSERT_TRUE(ours.ok()) << ours.Describe();
  ASSERT_EQ(columns(ours.out).size(), 4u) << ours.out;
  auto du = Ubtrfs({"du", "-a", I("/")});
  auto du_h = Ubtrfs({"du", "-sh", I("/dir1")});
  auto norm_du = [](const std::string& out, const std::string& root) {
    std::set<std::string> lines;
    for (auto l : Lines(out)) {
      const auto tab = l.find('\t');
      std::string p = l.substr(tab + 1);
      p = p.substr(std::min(p.size(), root.size()));
      lines.insert(l.substr(0, tab) + "\t" + (p.empty() ? "/" : p));
    }
    return lines;
  };
  if (std::string r = FuseUnavailableReason(); r.empty()) {
    Scratch s;
    std::string skip, error;
    MountProcess m;
    ASSERT_EQ(::mkdir(s.mnt.c_str(), 0755), 0);
    if (m.Start(img_, s.mnt, s.log, {"-o", "ro"}, &skip, &error)) {
      auto theirs = RunCommand({"df", s.mnt});
      auto theirs_h = RunCommand({"df", "-h", s.mnt});
      EXPECT_EQ(columns(ours.out), columns(theirs.out)) << ours.out << theirs.out;
      EXPECT_EQ(columns(ours_h.out), columns(theirs_h.out)) << ours_h.out << theirs_h.out;
      EXPECT_EQ(m.Unmount(&error), 0) << error;
    } else {
      EXPECT_NE(skip, "") << error;
      std::cout << "[ df on a FUSE mount skipped: " << skip << " ]\n";
    }
  } else {
    std::cout << "[ df on a FUSE mount skipped: " << r << " ]\n";
  }
  std::string why;
  if (!LoopMountsAvailable(&why)) {
    std::cout << "[ kernel view skipped: " << why << " ]\n";
    return;
  }
  // A read-only mount of a writable loop device: on a read-only one
  // (mount -o loop,ro) the kernel does not count the free space in data
  // chunks as available (src/fs/statfs.h).
  ArrayMount mnt;
  const std::string dir = tmp_.Sub("kmnt");
  ::mkdir(dir.c_str(), 0755);
  ASSERT_EQ(mnt.Mount({img_}, dir, "ro"), "");
  auto kdf = RunCommand({"df", dir});
  auto kdf_h = RunCommand({"df", "-h", dir});
  ASSERT_FALSE(columns(kdf.out).empty()) << kdf.Describe();
  EXPECT_EQ(columns(ours.out), columns(kdf.out)) << ours.out << kdf.out;
  EXPECT_EQ(columns(ours_h.out), columns(kdf_h.out)) << ours_h.out << kdf_h.out;
  auto kdu = RunCommand({"du", "-a", dir});
  EXPECT_EQ(norm_du(du.out, "/"), norm_du(kdu.out, dir + "/")) << du.out << kdu.out;
  auto kdu_h = RunCommand({"du", "-sh", dir + "/dir1"});
  EXPECT_EQ(Lines(du_h.out).at(0).substr(0, du_h.out.find('\t')), kdu_h.out.substr(0, kdu_h.out.find('\t')));
  mnt.Unmount();
}

TEST_F(CliVerbsTest, PutWritesStandardInput) {
  const std::string data = std::string(300000, 'p') + "end";
  const std::string src = tmp_.Sub("in");
  std::ofstream(src, std::ios::binary) << data;
  auto r = RunCommand({"sh", "-c", "\"$0\" put \"$1\" < \"$2\"", kCli, I("/dir1/c"), src});
  ASSERT_TRUE(r.ok()) << r.Describe();
  auto cat = Ubtrfs({"cat", img_, "/dir1/c"});
  EXPECT_EQ(cat.out, data);
}

TEST_F(CliVerbsTest, EditScriptIsOneTransaction) {
  // The same edits as a script, with a copy-in and a mkdir the host does too.
  Both({"mkdir", "-p", "deep/er"}, {"mkdir", "-p", I("/deep/er")});
  const std::string script = tmp_.Sub("script");
  std::ofstream(script) << "# the edits of ApplyTheEdits, in one go\n"
                           "touch -d '2021-03-04 05:06:07.5' /a\n"
                           "touch /new\n"
                           "mv /a /dir1\n"
                           "mv /dir1/b /b2\n"
                           "ln /b2 /b3\n"
                           "ln -s ../b2 /dir1/sl\n"
                           "chmod 0640 /b2\n"
                           "chmod u+x,go-r /dir1/c\n"
                        << (::geteuid() == 0 ? "chown 1234:5678 /b3\n" : "")
                        << "truncate -s 10K /b2\n"
                           "truncate -s -5 /dir1/c\n"
                           "setfattr -n user.k -v value /dir1/c\n"
                           "setfattr -n user.h -v 0x00ff10 /dir1/c\n"
                           "setfattr -x user.old /b2\n"
                           "rmdir /deep/er\n";
  // The host does them with coreutils.
  {
    std::vector<std::string> h = {"sh", "-c",
                                  "cd \"$0\" && touch -d '2021-03-04 05:06:07.5' a && touch new && mv a dir1 && "
                                  "mv dir1/b b2 && ln b2 b3 && ln -s ../b2 dir1/sl && chmod 0640 b2 && "
                                  "chmod u+x,go-r dir1/c && { [ $(id -u) != 0 ] || chown 1234:5678 b3; } && "
                                  "truncate -s 10K b2 && truncate -s -5 dir1/c && "
                                  "setfattr -n user.k -v value dir1/c && setfattr -n user.h -v 0x00ff10 dir1/c && "
                                  "setfattr -x user.old b2 && rmdir deep/er",
                                  host_};
    auto hr = RunCommand(h);
    ASSERT_TRUE(hr.ok()) << hr.Describe();
  }
  auto r = Ubtrfs({"edit", img_, "-f", script});
  ASSERT_TRUE(r.ok()) << r.Describe();
  ExpectSameTree(kChangedNow);
}

TEST_F(CliVerbsTest, FailingEditLeavesTheImageByteForByte) {
  const std::string before = ReadFile(img_);
  const std::string script = tmp_.Sub("script");
  // Data written and directories made before the failing line: all undone.
  const std::string big = tmp_.Sub("big");
  std::ofstream(big, std::ios::binary) << std::string(3 << 20, 'z');
  std::ofstream(script) << "mkdir -p /x/y\ncopy-in " << big << " /x/y\ntouch /x/t\ntruncate -s 1M /a\n"
                        << "mv /nope /x\nmkdir /never\n";
  auto r = Ubtrfs({"edit", img_, "-f", script});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(script + ":5: mv: cannot stat '/nope'"), std::string::npos) << r.err;
  EXPECT_TRUE(ReadFile(img_) == before) << "the image changed";
  // A script with a syntax error stops the same way.
  std::ofstream(script) << "touch /ok\nchmod 'unterminated /a\n";
  r = Ubtrfs({"edit", img_, "-f", script});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(":2: unterminated ' quote"), std::string::npos) << r.err;
  EXPECT_TRUE(ReadFile(img_) == before) << "the image changed";
  // An unknown verb too.
  std::ofstream(script) << "touch /ok\nfrobnicate /a\n";
  r = Ubtrfs({"edit", img_, "-f", script});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(ReadFile(img_) == before) << "the image changed";
  // A script that fills the device: the line that meets ENOSPC fails, and
  // nothing before it was committed on the way (the library's commit to
  // free pinned space, and its commit at max_dirty_bytes, wait for the
  // caller under undo_uncommitted).
  std::string noise(48 << 20, '\0');
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i + 8 <= noise.size(); i += 8) {  // incompressible, no zero sectors
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(&noise[i], &x, 8);
  }
  std::ofstream(big, std::ios::binary | std::ios::trunc) << noise;
  std::ofstream(script) << "copy-in " << big << " /f1\ncopy-in " << big << " /f2\ncopy-in " << big << " /f3\ncopy-in " << big << " /f4\n";
  r = Ubtrfs({"edit", img_, "-f", script});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find(": copy-in: no free data space"), std::string::npos) << r.err;
  EXPECT_TRUE(ReadFile(img_) == before) << "the image changed";
}

TEST_F(CliVerbsTest, EditHasLsAndNamesUnknownCommands) {
  auto r = RunCommand({"sh", "-c", "printf 'mkdir /m\\nls /\\nls -l /dir1\\n' | \"$0\" edit \"$1\"", kCli, img_});
  ASSERT_TRUE(r.ok()) << r.Describe();
  auto top = Ubtrfs({"ls", img_, "/"});
  auto dir1 = Ubtrfs({"ls", "-l", I("/dir1")});
  EXPECT_EQ(r.out, top.out + dir1.out);
  EXPECT_NE(top.out.find("m\n"), std::string::npos) << top.out;
  const std::string before = ReadFile(img_);
  r = RunCommand({"sh", "-c", "printf 'touch /x\\nfrobnicate /a\\n' | \"$0\" edit \"$1\"", kCli, img_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("stdin:2: frobnicate: unknown command"), std::string::npos) << r.err;
  EXPECT_TRUE(ReadFile(img_) == before) << "the image changed";
}

// `ubtrfs edit IMAGE` on a terminal: a prompt, line editing with history
// (the up arrow brings back the last line, which is then edited), a failing
// line reported without ending the session, and the end of input (^D)
// committing.
TEST_F(CliVerbsTest, EditAtATerminalIsAPromptWithHistory) {
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0) << strerror(errno);
  if (pid == 0) {
    ::setenv("TERM", "xterm", 1);
    ::setenv("HOME", tmp_.path().c_str(), 1);  // no ~/.editrc of the user's
    ::execl(kCli.c_str(), kCli.c_str(), "edit", img_.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string screen;
  // Reads what the session prints until `count` prompts have appeared.
  auto await_prompts = [&](size_t count) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    auto prompts = [&] {
      size_t n = 0;
      for (size_t at = 0; (at = screen.find("ubtrfs> ", at)) != std::string::npos; at += 8) ++n;
      return n;
    };
    while (prompts() < count && std::chrono::steady_clock::now() < deadline) {
      struct pollfd p = {master, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) break;
      screen.append(buf, static_cast<size_t>(n));
    }
    if (prompts() < count) return false;
    // The prompt is out; keys typed before the line editor has the terminal
    // in raw mode would be cooked (and echoed) by the line discipline.
    while (std::chrono::steady_clock::now() < deadline) {
      struct termios t;
      if (::tcgetattr(master, &t) == 0 && !(t.c_lflag & ICANON)) return true;
      ::usleep(2000);
    }
    return false;
  };
  auto type = [&](const std::string& keys) { ASSERT_EQ(::write(master, keys.data(), keys.size()), static_cast<ssize_t>(keys.size())); };
  ASSERT_TRUE(await_prompts(1)) << screen;
  type("touch /t1\r");
  ASSERT_TRUE(await_prompts(2)) << screen;
  type("mv /nope /x\r");
  ASSERT_TRUE(await_prompts(3)) << screen;
  type("\x1b[A\x1b[A");  // two lines back: "touch /t1"
  type("\x7f" "2\r");    // made "touch /t2"
  ASSERT_TRUE(await_prompts(4)) << screen;
  type("rm /t1 /nope\r");  // fails after removing /t1: the whole line is undone
  ASSERT_TRUE(await_prompts(5)) << screen;
  type("\x04");  // end of input: commit
  int status = 0;
  pid_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    struct pollfd p = {master, POLLIN, 0};
    ssize_t n = 0;
    if (::poll(&p, 1, 50) > 0) {  // keep the terminal drained
      char buf[4096];
      n = ::read(master, buf, sizeof buf);
      if (n > 0) screen.append(buf, static_cast<size_t>(n));
    }
    if (n <= 0) ::usleep(20000);  // (a hung-up terminal polls ready at once)
  }
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the session did not end at ^D:\n" << screen;
  }
  ::close(master);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << screen;
  EXPECT_NE(screen.find("mv: cannot stat '/nope': No such file or directory"), std::string::npos) << screen;
  auto ls = Ubtrfs({"ls", img_, "/"});
  EXPECT_NE(ls.out.find("t1\n"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("t2\n"), std::string::npos) << ls.out << "\n(the recalled line was not edited)\n" << screen;
  EXPECT_NE(screen.find("'/nope'"), std::string::npos) << screen;
  EXPECT_NE(ls.out.find("t1\n"), std::string::npos) << ls.out << "\n(the failed rm line kept its removal of /t1)\n" << screen;
  EXPECT_EQ(BtrfsCheck(img_), "");
}

TEST_F(CliVerbsTest, EditReadsStandardInputAndPrints) {
  auto r = RunCommand({"sh", "-c", "printf 'copy-in /etc/hostname /h\\ncat /h\\nstat --json /h\\n' | \"$0\" edit \"$1\"",
                       kCli, img_});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.out.substr(0, ReadFile("/etc/hostname").size()), ReadFile("/etc/hostname"));
  EXPECT_NE(r.out.find("\"path\": \"/h\""), std::string::npos) << r.out;
  auto cat = Ubtrfs({"cat", img_, "/h"});
  EXPECT_EQ(cat.out, ReadFile("/etc/hostname"));
}

// `property set|get IMAGE:PATH compression`: the btrfs.compression property
// (found missing by a user's ping-pong with the kernel). What ubtrfs sets
// the kernel's `btrfs property get` reads back; a file copied in under the
// directory afterwards is stored compressed; "" unsets; a bad value is an
// error that changes nothing.
TEST(CliProperty, CompressionIsSetReadAndUnsetAsBtrfsPropertyDoes) {
  TempDir tmp("ubtrfs-prop");
  const std::string img = tmp.Sub("p.img"), src = tmp.Sub("text");
  ASSERT_TRUE(RunCommand({kCli, "mkfs", "--size", "256M", img}).ok());
  ASSERT_TRUE(RunCommand({kCli, "mkdir", img + ":/d"}).ok());
  auto get = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {kCli, "property", "get", img + ":/d"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunCommand(args);
  };
  EXPECT_EQ(get({"compression"}).out, "");
  CommandResult r = RunCommand({kCli, "property", "set", img + ":/d", "compression", "zstd"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(get({"compression"}).out, "compression=zstd\n");
  EXPECT_EQ(get({}).out, "compression=zstd\n");  // not a subvolume: no ro line
  r = RunCommand({kCli, "property", "set", img + ":/d", "compression", "gzip"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("is not zlib, lzo, zstd, no or none"), std::string::npos) << r.err;
  EXPECT_EQ(get({"compression"}).out, "compression=zstd\n");
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "line " + std::to_string(i % 97) + " of a compressible file\n";
  WriteHostFile(src, text);
  ASSERT_TRUE(RunCommand({kCli, "cp", src, img + ":/d/text"}).ok());
  EXPECT_EQ(BtrfsCheck(img), "");
  std::string why;
  if (LoopMountsAvailable(&why)) {
    LoopMount m;
    const std::string mnt = tmp.Sub("mnt");
    ::mkdir(mnt.c_str(), 0755);
    ASSERT_EQ(m.Mount(img, mnt, "ro"), "");
    r = RunCommand({"btrfs", "property", "get", mnt + "/d", "compression"});
    EXPECT_EQ(r.out, "compression=zstd\n") << r.Describe();
    EXPECT_EQ(ReadFile(mnt + "/d/text"), text);
    r = RunCommand({"filefrag", "-v", mnt + "/d/text"});
    EXPECT_NE(r.out.find("encoded"), std::string::npos) << "not stored compressed: " << r.out;
    EXPECT_EQ(m.Unmount(), "");
  } else {
    std::cout << "[ kernel view skipped: " << why << " ]\n";
  }
  r = RunCommand({kCli, "property", "set", img + ":/d", "compression", ""});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(get({"compression"}).out, "");
  EXPECT_EQ(BtrfsCheck(img), "");
}

}  // namespace
