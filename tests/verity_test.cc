// fs-verity files (Filesystem::EnableVerity, format/verity.h, fs/verity.cc):
// - the Merkle tree and descriptor ubtrfs stores are byte for byte what
//   fsverity-utils' `fsverity digest --out-merkle-tree --out-descriptor`
//   computes from the same bytes, for one-block, inline, sparse and
//   three-level files, SHA-256 and SHA-512, salts, 1 KiB blocks; the digest
//   `ubtrfs fsverity measure` prints is the one `fsverity digest` prints;
// - a verity file's data cannot change (write, truncate, fallocate, clone
//   into: EPERM) while its names and attributes can, and its items go with
//   the inode; the image is check-clean (ubtrfs and btrfs check);
// - an image with the verity feature is written to (it was refused);
// - the kernel mounts such an image, sees the flag, and deletes such a file
//   cleanly (loop mounts; skipped without);
// - send (protocol 3) carries verity, receive builds it again; protocol 1
//   leaves it out;
// - fsync of a file just made verity commits (no replay, the kernel's
//   included, copies verity items), and a tree log written beside a verity
//   file replays (ubtrfs's replay and the kernel's) with the file intact;
// - `ubtrfs fsverity verify` names a data block that no longer matches its
//   tree and a tree damaged above its data hashes;
// - check names damaged verity items; items a crash left without the flag
//   are dropped by the orphan cleanup of the next writable open.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "format/ondisk.h"
#include "support/fuse_mount.h"
#include "support/host_files.h"
#include "support/mkfs_util.h"
#include "support/open_txn.h"
#include "support/test_util.h"
#include "tree/cursor.h"
#include "tree/writer.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/send.h"

namespace ubtrfs_test {
namespace UBTRFS_UNITY_ID {

using ubtrfs::Filesystem;
using ubtrfs::InodeId;
using ubtrfs::Status;
using ubtrfs::VerityParams;
namespace fmt_ = ubtrfs::format;

std::string FsverityMissing() {
  return FindProgram("fsverity").empty() ? "fsverity (Debian package fsverity) is not installed" : "";
}

std::string MkImage(TempDir& tmp, const std::string& name) {
  const std::string img = tmp.Sub(name);
  EXPECT_EQ(MustRun({UBTRFS_CLI_PATH, "mkfs", "--size", "512M", img}), "");
  return img;
}

// The bytes of one inode's items of `type` in the top subvolume from key
// offset `first_offset` on, joined in key order (offsets checked to follow
// on from each other); with `one`, only the item at first_offset.
std::string ItemBytes(const std::string& img, uint64_t ino, uint8_t type, uint64_t first_offset, bool one = false) {
  auto o = OpenForWrite(img);
  if (!o.ok()) return "open: " + o.status().ToString();
  auto root = o->vol->FindRoot(fmt_::kFsTreeObjectid);
  if (!root.ok()) return "fs tree: " + root.status().ToString();
  ubtrfs::tree::Cursor c(o->vol->source(), root->ref);
  std::string out;
  for (auto st = c.Seek(fmt_::Key{ino, type, first_offset}); st.ok() && c.Valid(); st = c.Next()) {
    if (c.key().objectid != ino || c.key().type != type) break;
    if (c.key().offset != first_offset + out.size()) return "item at " + std::to_string(c.key().offset) + ": a gap";
    out.append(reinterpret_cast<const char*>(c.data().data()), c.data().size());
    if (one) break;
  }
  return out;
}

size_t CountVerityItems(const std::string& img, uint64_t ino) {
  auto o = OpenForWrite(img);
  EXPECT_TRUE(o.ok());
  if (!o.ok()) return 0;
  auto root = o->vol->FindRoot(fmt_::kFsTreeObjectid);
  EXPECT_TRUE(root.ok());
  if (!root.ok()) return 0;
  ubtrfs::tree::Cursor c(o->vol->source(), root->ref);
  size_t n = 0;
  for (auto st = c.Seek(fmt_::Key{ino, fmt_::kVerityDescItemKey, 0}); st.ok() && c.Valid(); st = c.Next()) {
    if (c.key().objectid != ino || c.key().type > fmt_::kVerityMerkleItemKey) break;
    ++n;
  }
  return n;
}

// A copy of `img` named `name`, its top subvolume's tree changed item by
// item by `change` below the API (damage, or what a crash leaves), committed.
std::string EditedCopy(TempDir& tmp, const std::string& img, const std::string& name,
                       const std::function<Status(ubtrfs::tree::TreeWriter&)>& change) {
  const std::string copy = tmp.Sub(name);
  std::filesystem::copy_file(img, copy);
  auto o = OpenForWrite(copy);
  if (!o.ok()) {
    ADD_FAILURE() << name << ": " << o.status().ToString();
    return copy;
  }
  auto w = o->txn->Writer(fmt_::kFsTreeObjectid);
  if (!w.ok()) {
    ADD_FAILURE() << name << ": " << w.status().ToString();
    return copy;
  }
  Status st = change(**w);
  EXPECT_TRUE(st.ok()) << name << ": " << st.ToString();
  st = o->txn->Commit();
  EXPECT_TRUE(st.ok()) << name << ": " << st.ToString();
  return copy;
}

struct Shape {
  std::string name;
  std::string data;  // "" with `sparse`: a file of holes and islands
  VerityParams params;
  std::string salt_hex;
};

std::vector<Shape> Shapes() {
  std::vector<Shape> s;
  VerityParams sha256;
  VerityParams sha512_salted;
  sha512_salted.hash_algorithm = 2;
  sha512_salted.salt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  VerityParams small_blocks;
  small_blocks.block_size = 1024;
  small_blocks.salt = {0xaa, 0xbb, 0xcc};
  s.push_back({"empty", "", sha256, ""});
  s.push_back({"inline", SeededBytes(100, 1), sha256, ""});
  s.push_back({"one_block", SeededBytes(4096, 2), sha256, ""});
  s.push_back({"two_blocks", SeededBytes(4097, 3), sha512_salted, "0102030405060708090a0b0c0d0e0f1011"});
  s.push_back({"two_levels", SeededBytes((1 << 20) + 123, 4), sha256, ""});
  s.push_back({"small_blocks", SeededBytes(300 * 1024 + 5, 5), small_blocks, "aabbcc"});
  // More than 128 * 128 blocks: three levels.
  s.push_back({"three_levels", SeededBytes((64 << 20) + 4097, 6), sha256, ""});
  return s;
}

TEST(Verity, TreeAndDescriptorAreFsverityUtilsOwn) {
  if (std::string why = FsverityMissing(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp("ubtrfs-verity");
  const std::string img = MkImage(tmp, "v.img");
  std::map<std::string, uint64_t> inos;
  {
    auto fs = OpenWritable(img);
    ASSERT_TRUE(fs);
    for (const Shape& sh : Shapes()) {
      PutFile(*fs, "/", sh.name, sh.data);
      const InodeId id = MustLookup(*fs, "/" + sh.name);
      inos[sh.name] = id.ino;
      ASSERT_TRUE(fs->EnableVerity(id, sh.params).ok()) << sh.name;
    }
    // A sparse file: its holes hash as zeros.
    PutFile(*fs, "/", "sparse", "");
    const InodeId sp = MustLookup(*fs, "/sparse");
    const std::string island = SeededBytes(5000, 7);
    ASSERT_TRUE(fs->Write(sp, 3 << 20, SpanOf(island)).ok());
    ubtrfs::AttrChange grow;
    grow.size = (6 << 20) + 11;
    ASSERT_TRUE(fs->SetAttr(sp, grow).ok());
    ASSERT_TRUE(fs->EnableVerity(sp, {}).ok());
    inos["sparse"] = sp.ino;
    ASSERT_TRUE(fs->Commit().ok());
  }
  std::string sparse(static_cast<size_t>((6 << 20) + 11), '\0');
  const std::string island = SeededBytes(5000, 7);
  sparse.replace(3 << 20, island.size(), island);
  std::vector<Shape> shapes = Shapes();
  shapes.push_back({"sparse", sparse, {}, ""});

  for (const Shape& sh : shapes) {
    SCOPED_TRACE(sh.name);
    const std::string host = tmp.Sub(sh.name), tree = tmp.Sub(sh.name + ".tree"), desc = tmp.Sub(sh.name + ".desc");
    WriteHostFile(host, sh.data);
    std::vector<std::string> argv = {"fsverity", "digest", host,
                                     "--hash-alg=" + std::string(sh.params.hash_algorithm == 2 ? "sha512" : "sha256"),
                                     "--block-size=" + std::to_string(sh.params.block_size),
                                     "--out-merkle-tree=" + tree, "--out-descriptor=" + desc};
    if (!sh.salt_hex.empty()) argv.push_back("--salt=" + sh.salt_hex);
    CommandResult d = RunCommand(argv);
    ASSERT_TRUE(d.ok()) << d.Describe();
    // "sha256:HEX PATH"
    const std::string digest = d.out.substr(0, d.out.find(' '));
    CommandResult m = RunUbtrfs({"fsverity", "measure", img + ":/" + sh.name});
    ASSERT_TRUE(m.ok()) << m.Describe();
    EXPECT_EQ(m.out.substr(0, m.out.find(' ')), digest);

    const std::string stored_tree = ItemBytes(img, inos[sh.name], fmt_::kVerityMerkleItemKey, 0);
    EXPECT_TRUE(stored_tree == ReadHostFile(tree)) << "Merkle tree: " << stored_tree.size() << " bytes stored, "
                                                    << ReadHostFile(tree).size() << " from fsverity";
    // The descriptor items hold the descriptor as fsverity writes it (no
    // signature here), after the 25-byte head naming its size.
    const std::string head = ItemBytes(img, inos[sh.name], fmt_::kVerityDescItemKey, 0, true);
    ASSERT_EQ(head.size(), sizeof(fmt_::VerityDescriptorItem));
    const std::string stored_desc = ItemBytes(img, inos[sh.name], fmt_::kVerityDescItemKey, 1);
    EXPECT_TRUE(stored_desc == ReadHostFile(desc)) << "descriptor differs";
    fmt_::VerityDescriptorItem h;
    std::memcpy(&h, head.data(), sizeof(h));
    EXPECT_EQ(h.size.get(), stored_desc.size());
  }

  EXPECT_EQ(BtrfsCheck(img), "");
  CommandResult c = RunUbtrfs({"check", img});
  EXPECT_TRUE(c.ok()) << c.Describe();
}

TEST(Verity, TheCommandLineEnablesAndMeasures) {
  if (std::string why = FsverityMissing(); !why.empty()) GTEST_SKIP() << why;
  TempDir tmp("ubtrfs-verity");
  const std::string img = MkImage(tmp, "v.img");
  const std::string data = SeededBytes(123456, 18), host = tmp.Sub("f");
  WriteHostFile(host, data);
  ASSERT_EQ(MustRun({UBTRFS_CLI_PATH, "cp", host, img + ":/f"}), "");
  ASSERT_EQ(MustRun({UBTRFS_CLI_PATH, "cp", host, img + ":/g"}), "");
  EXPECT_EQ(RunUbtrfs({"fsverity", "enable", "--hash-alg", "md5", img + ":/f"}).exit_code, 2);
  EXPECT_EQ(RunUbtrfs({"fsverity", "enable", "--salt", "xyz", img + ":/f"}).exit_code, 2);
  CommandResult r = RunUbtrfs({"fsverity", "enable", "--block-size", "3000", img + ":/f"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("block size 3000"), std::string::npos) << r.Describe();
  r = RunUbtrfs({"fsverity", "measure", img + ":/f"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a verity file"), std::string::npos) << r.Describe();
  ASSERT_EQ(MustRun({UBTRFS_CLI_PATH, "fsverity", "enable", "--hash-alg", "sha512", "--salt", "0a0B0c", img + ":/f"}),
            "");
  r = RunUbtrfs({"fsverity", "enable", img + ":/f"});
  EXPECT_EQ(r.exit_code, 1);
  CommandResult want = RunCommand({"fsverity", "digest", host, "--hash-alg=sha512", "--salt=0a0b0c"});
  ASSERT_TRUE(want.ok()) << want.Describe();
  r = RunUbtrfs({"fsverity", "measure", img + ":/f"});
  ASSERT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(r.out, want.out.substr(0, want.out.find(' ')) + " " + img + ":/f\n");
  auto fs = Filesystem::Open(img);
  ASSERT_TRUE(fs.ok());
  EXPECT_EQ(ReadImageFile(**fs, "/f"), data);
}

TEST(Verity, DataCannotChangeNamesAndAttributesCan) {
  TempDir tmp("ubtrfs-verity");
  const std::string img = MkImage(tmp, "v.img");
  const std::string data = SeededBytes(70000, 9);
  InodeId v;
  {
    auto fs = OpenWritable(img);
    ASSERT_TRUE(fs);
    PutFile(*fs, "/", "v", data);
    PutFile(*fs, "/", "other", SeededBytes(8192, 10));
    v = MustLookup(*fs, "/v");
    ASSERT_TRUE(fs->EnableVerity(v, {}).ok());
    EXPECT_EQ(fs->EnableVerity(v, {}).code(), EEXIST);
    VerityParams bad;
    bad.block_size = 3000;
    EXPECT_EQ(fs->EnableVerity(MustLookup(*fs, "/other"), bad).code(), EINVAL);
    EXPECT_EQ(fs->EnableVerity(fs->Root(), {}).code(), EISDIR);
    auto st = fs->GetStat(v);
    ASSERT_TRUE(st.ok());
    EXPECT_TRUE(st->flags & ubtrfs::kStatFlagVerity);
    ASSERT_TRUE(fs->Commit().ok());
  }
  // The feature is on the image now; it opens writable, and every data
  // change is refused.
  auto fs = OpenWritable(img);
  ASSERT_TRUE(fs);
  EXPECT_TRUE(fs->Info().compat_ro_flags & fmt_::kCompatRoVerity);
  EXPECT_EQ(fs->Write(v, 0, SpanOf("x")).status().code(), EPERM);
  EXPECT_EQ(fs->Write(v, data.size(), SpanOf("appended")).status().code(), EPERM);
  ubtrfs::AttrChange trunc;
  trunc.size = 10;
  EXPECT_EQ(fs->SetAttr(v, trunc).code(), EPERM);
  trunc.size = data.size();
  EXPECT_EQ(fs->SetAttr(v, trunc).code(), EPERM);
  EXPECT_EQ(fs->Fallocate(v, 0, 0, 1 << 20).code(), EPERM);
  EXPECT_EQ(fs->Fallocate(v, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096).code(), EPERM);
  const InodeId other = MustLookup(*fs, "/other");
  EXPECT_EQ(fs->Clone(other, 0, v, 0, 4096).code(), EPERM);
  // Out of it is fine: only extents are shared, and the copy has no verity.
  ASSERT_TRUE(fs->Clone(v, 0, other, 0, 65536).ok());
  auto ost = fs->GetStat(other);
  ASSERT_TRUE(ost.ok());
  EXPECT_FALSE(ost->flags & ubtrfs::kStatFlagVerity);
  // Names and attributes change as on any file.
  ubtrfs::AttrChange mode;
  mode.mode = 0600;
  EXPECT_TRUE(fs->SetAttr(v, mode).ok());
  EXPECT_TRUE(fs->SetXattr(v, "user.k", "value").ok());
  EXPECT_TRUE(fs->Link(v, fs->Root(), "v_link").ok());
  EXPECT_TRUE(fs->Rename(fs->Root(), "v", fs->Root(), "v_renamed").ok());
  EXPECT_EQ(ReadImageFile(*fs, "/v_renamed"), data);
  auto info = fs->GetVerity(v);
  ASSERT_TRUE(info.ok() && *info);
  EXPECT_EQ((*info)->data_size, data.size());
  EXPECT_EQ((*info)->digest.size(), 32u);
  ASSERT_TRUE(fs->Commit().ok());
  fs.reset();
  EXPECT_EQ(BtrfsCheck(img), "");
  EXPECT_GT(CountVerityItems(img, v.ino), 2u);

  // The last name goes: the inode goes with every one of its items.
  fs = OpenWritable(img);
  ASSERT_TRUE(fs);
  ASSERT_TRUE(fs->Unlink(fs->Root(), "v_link").ok());
  ASSERT_TRUE(fs->Unlink(fs->Root(), "v_renamed").ok());
  ASSERT_TRUE(fs->Commit().ok());
  fs.reset();
  EXPECT_EQ(CountVerityItems(img, v.ino), 0u);
  EXPECT_EQ(BtrfsCheck(img), "");
  CommandResult c = RunUbtrfs({"check", img});
  EXPECT_TRUE(c.ok()) << c.Describe();
}

TEST(Verity, TheMountRefusesToOpenItForWriting) {
  SKIP_IF_NO_FUSE();
  Scratch s;
  ASSERT_EQ(s.Make(), "");
  const std::string data = SeededBytes(40000, 19);
  {
    auto fs = OpenWritable(s.img);
    ASSERT_TRUE(fs);
    PutFile(*fs, "/", "v", data);
    ASSERT_TRUE(fs->EnableVerity(MustLookup(*fs, "/v"), {}).ok());
    ASSERT_TRUE(fs->Commit().ok());
  }
  std::filesystem::create_directory(s.mnt);
  MountProcess m;
  START_MOUNT(m, s);
  const std::string v = s.mnt + "/v";
  errno = 0;
  EXPECT_LT(::open(v.c_str(), O_WRONLY), 0);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_LT(::open(v.c_str(), O_RDWR | O_TRUNC), 0);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_NE(::truncate(v.c_str(), 5), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ReadHostFile(v), data);
  EXPECT_EQ(::chmod(v.c_str(), 0400), 0);
  EXPECT_EQ(::rename(v.c_str(), (s.mnt + "/w").c_str()), 0);
  std::string err;
  EXPECT_EQ(m.Unmount(&err), 0) << err;
  auto fs = Filesystem::Open(s.img);
  ASSERT_TRUE(fs.ok());
  EXPECT_EQ(ReadImageFile(**fs, "/w"), data);
  auto info = (*fs)->GetVerity(MustLookup(**fs, "/w"));
  ASSERT_TRUE(info.ok() && *info);
}

TEST(Verity, TheKernelMountsItAndDeletesAVerityFile) {
  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << why;
  TempDir tmp("ubtrfs-verity");
  const std::string img = MkImage(tmp, "v.img");
  const std::string data = SeededBytes(300000, 12);
  uint64_t gone_ino = 0;
  std::vector<uint8_t> digest;
  {
    auto fs = OpenWritable(img);
    ASSERT_TRUE(fs);
    PutFile(*fs, "/", "keep", data);
    PutFile(*fs, "/", "gone", data);
    ASSERT_TRUE(fs->EnableVerity(MustLookup(*fs, "/keep"), {}).ok());
    ASSERT_TRUE(fs->EnableVerity(MustLookup(*fs, "/gone"), {}).ok());
    gone_ino = MustLookup(*fs, "/gone").ino;
    digest = (*fs->GetVerity(MustLookup(*fs, "/keep")))->digest;
    ASSERT_TRUE(fs->Commit().ok());
  }
  const std::string mnt = tmp.Sub("mnt");
  std::filesystem::create_directory(mnt);
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(img, mnt), "");
    struct stat st{};
    ASSERT_EQ(::stat((mnt + "/keep").c_str(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), data.size());
    const int fd = ::open((mnt + "/keep").c_str(), O_RDONLY);
    if (fd < 0) {
      // A kernel without CONFIG_FS_VERITY refuses to open what it knows is
      // a verity file: the flag was read.
      EXPECT_EQ(errno, EOPNOTSUPP);
    } else {
      ::close(fd);
      EXPECT_EQ(ReadHostFile(mnt + "/keep"), data);
      CommandResult me = RunCommand({"fsverity", "measure", mnt + "/keep"});
      if (me.ok()) {
        EXPECT_EQ(me.out.substr(7, 64), fmt_::HexString(digest.data(), digest.size()));
      }
      // Writing is refused by the kernel as by ubtrfs.
      EXPECT_LT(::open((mnt + "/keep").c_str(), O_WRONLY), 0);
    }
    ASSERT_EQ(::unlink((mnt + "/gone").c_str()), 0);
    WriteHostFile(mnt + "/new", "written by the kernel");
    ASSERT_EQ(m.Unmount(), "");
  }
  EXPECT_EQ(CountVerityItems(img, gone_ino), 0u);
  CommandResult c = RunUbtrfs({"check", img});
  EXPECT_TRUE(c.ok()) << c.Describe();
  EXPECT_EQ(BtrfsCheck(img), "");
  auto fs = OpenWritable(img);
  ASSERT_TRUE(fs);
  EXPECT_EQ(ReadImageFile(*fs, "/keep"), data);
  EXPECT_EQ(ReadImageFile(*fs, "/new"), "written by the kernel");
}

TEST(Verity, SendCarriesItInProtocol3) {
  TempDir tmp("ubtrfs-verity");
  const std::string src = MkImage(tmp, "src.img");
  const std::string data = SeededBytes(200000, 13), later = SeededBytes(5000, 14);
  std::vector<uint8_t> digest, later_digest;
  VerityParams salted;
  salted.hash_algorithm = 2;
  salted.salt = {9, 8, 7};
  {
    auto fs = OpenWritable(src);
    ASSERT_TRUE(fs);
    ubtrfs::NewInode a;
    a.mode = 0755;
    auto sv = fs->CreateSubvolume(fs->Root(), "sv", a);
    ASSERT_TRUE(sv.ok());
    PutFile(*fs, "/sv", "v", data);
    PutFile(*fs, "/sv", "later", later);
    ASSERT_TRUE(fs->EnableVerity(MustLookup(*fs, "/sv/v"), salted).ok());
    digest = (*fs->GetVerity(MustLookup(*fs, "/sv/v")))->digest;
    ASSERT_TRUE(fs->CreateSnapshot(*sv, fs->Root(), "snap1", true).ok());
    // Enabled between the two snapshots: the incremental stream says so.
    ASSERT_TRUE(fs->EnableVerity(MustLookup(*fs, "/sv/later"), {}).ok());
    later_digest = (*fs->GetVerity(MustLookup(*fs, "/sv/later")))->digest;
    ASSERT_TRUE(fs->CreateSnapshot(*sv, fs->Root(), "snap2", true).ok());
  }
  auto stream = [&](uint32_t proto, const std::string& snap, const std::string& parent) {
    auto fs = Filesystem::Open(src);
    EXPECT_TRUE(fs.ok());
    std::string out;
    ubtrfs::SendOptions o;
    o.proto = proto;
    if (!parent.empty()) o.parent = MustLookup(**fs, parent);
    Status st = ubtrfs::Send(**fs, MustLookup(**fs, snap), [&](std::span<const uint8_t> b) {
      out.append(reinterpret_cast<const char*>(b.data()), b.size());
      return ubtrfs::Status::Ok();
    }, o);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  };
  auto receive = [&](const std::string& img, const std::string& bytes) {
    auto fs = OpenWritable(img);
    size_t at = 0;
    Status st = ubtrfs::Receive(*fs, [&](std::span<uint8_t> buf) -> ubtrfs::Result<size_t> {
      const size_t n = std::min(buf.size(), bytes.size() - at);
      std::memcpy(buf.data(), bytes.data() + at, n);
      at += n;
      return n;
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return fs;
  };
  const std::string dst = MkImage(tmp, "dst.img");
  {
    auto fs = receive(dst, stream(3, "/snap1", ""));
    EXPECT_EQ(ReadImageFile(*fs, "/snap1/v"), data);
    auto v = fs->GetVerity(MustLookup(*fs, "/snap1/v"));
    ASSERT_TRUE(v.ok() && *v);
    EXPECT_EQ((*v)->digest, digest);
    EXPECT_EQ((*v)->params.salt, salted.salt);
    ASSERT_TRUE(fs->Commit().ok());
  }
  {
    auto fs = receive(dst, stream(3, "/snap2", "/snap1"));
    auto v = fs->GetVerity(MustLookup(*fs, "/snap2/later"));
    ASSERT_TRUE(v.ok() && *v);
    EXPECT_EQ((*v)->digest, later_digest);
    ASSERT_TRUE(fs->Commit().ok());
  }
  EXPECT_EQ(BtrfsCheck(dst), "");
  // Protocol 1 has no such command: the file arrives plain.
  const std::string plain = MkImage(tmp, "plain.img");
  {
    auto fs = receive(plain, stream(1, "/snap1", ""));
    EXPECT_EQ(ReadImageFile(*fs, "/snap1/v"), data);
    auto v = fs->GetVerity(MustLookup(*fs, "/snap1/v"));
    ASSERT_TRUE(v.ok());
    EXPECT_FALSE(*v);
  }
}

TEST(Verity, FsyncAfterEnableSurvivesAPowerCut) {
  TempDir tmp("ubtrfs-verity");
  const std::string img = MkImage(tmp, "v.img");
  const std::string data = SeededBytes(150000, 15);
  std::vector<uint8_t> digest;
  {
    auto fs = OpenWritable(img);
    ASSERT_TRUE(fs);
    PutFile(*fs, "/", "old", "committed");
    ASSERT_TRUE(fs->Commit().ok());
    PutFile(*fs, "/", "v", data);
    const InodeId v = MustLookup(*fs, "/v");
    ASSERT_TRUE(fs->EnableVerity(v, {}).ok());
    digest = (*fs->GetVerity(v))->digest;
    // No replay copies verity items: this fsync commits.
    ASSERT_TRUE(fs->Fsync(v, false).ok());
    EXPECT_EQ(LogRootOf(img), 0u);
    // A new file beside it, fsynced into a tree log.
    PutFile(*fs, "/", "n", "logged");
    ASSERT_TRUE(fs->Fsync(MustLookup(*fs, "/n"), false).ok());
    // The power cut: the image as it is now.
    std::filesystem::copy_file(img, tmp.Sub("cut.img"));
    (void)fs->Discard();
  }
  const std::string cut = tmp.Sub("cut.img");
  ASSERT_NE(LogRootOf(cut), 0u) << "the second fsync committed instead of logging";
  auto check = [&](const std::string& image) {
    auto fs = OpenWritable(image);
    ASSERT_TRUE(fs);
    EXPECT_TRUE(fs->Info().compat_ro_flags & fmt_::kCompatRoVerity);
    EXPECT_EQ(ReadImageFile(*fs, "/v"), data);
    EXPECT_EQ(ReadImageFile(*fs, "/n"), "logged");
    auto v = fs->GetVerity(MustLookup(*fs, "/v"));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_TRUE(*v);
    EXPECT_EQ((*v)->digest, digest);
    ASSERT_TRUE(fs->Commit().ok());
  };
  const std::string by_ubtrfs = tmp.Sub("by_ubtrfs.img");
  std::filesystem::copy_file(cut, by_ubtrfs);
  check(by_ubtrfs);
  EXPECT_EQ(BtrfsCheck(by_ubtrfs), "");

  std::string why;
  if (!LoopMountsAvailable(&why)) GTEST_SKIP() << "the kernel's replay: " << why;
  const std::string by_kernel = tmp.Sub("by_kernel.img");
  std::filesystem::copy_file(cut, by_kernel);
  const std::string mnt = tmp.Sub("mnt");
  std::filesystem::create_directory(mnt);
  {
    LoopMount m;
    ASSERT_EQ(m.Mount(by_kernel, mnt), "");
    ASSERT_EQ(m.Unmount(), "");
  }
  EXPECT_EQ(LogRootOf(by_kernel), 0u);
  check(by_kernel);
  EXPECT_EQ(BtrfsCheck(by_kernel), "");
}

TEST(Verity, VerifyFindsDataAndTreesThatDisagree) {
  TempDir tmp("ubtrfs-verity");
  // A file without data checksums: damage to its data only fs-verity sees.
  const std::string root = tmp.Sub("root"), img = tmp.Sub("v.img");
  std::filesystem::create_directory(root);
  const std::string data = SeededBytes(3 << 20, 20);
  WriteHostFile(root + "/f", data);
  ASSERT_EQ(MustRun({UBTRFS_CLI_PATH, "mkfs", "--size", "256M", "--rootdir", root, "--inode-flags", "nodatasum:f", img}),
            "");
  ASSERT_EQ(MustRun({UBTRFS_CLI_PATH, "fsverity", "enable", img + ":/f"}), "");
  CommandResult r = RunUbtrfs({"fsverity", "verify", img + ":/f"});
  EXPECT_TRUE(r.ok()) << r.Describe();
  uint64_t ino = 0;
  {
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok());
    ino = MustLookup(**fs, "/f").ino;
  }

  // One byte of data block 300 changed in place.
  const std::string bad_data = tmp.Sub("bad_data.img");
  std::filesystem::copy_file(img, bad_data);
  {
    const std::string image = ReadHostFile(bad_data);
    const size_t at = image.find(data.substr(300 * 4096, 4096));
    ASSERT_NE(at, std::string::npos);
    const int fd = ::open(bad_data.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const char x = static_cast<char>(image[at + 17] ^ 1);
    ASSERT_EQ(::pwrite(fd, &x, 1, static_cast<off_t>(at + 17)), 1);
    ::close(fd);
  }
  r = RunUbtrfs({"fsverity", "verify", bad_data + ":/f"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("data block 300 (bytes 1228800..) does not match"), std::string::npos) << r.Describe();

  // A hash in the tree's top level changed: the data matches, the tree
  // does not hash to itself.
  std::string top = ItemBytes(img, ino, fmt_::kVerityMerkleItemKey, 0, true);
  ASSERT_EQ(top.size(), 2048u);
  top[5] ^= 1;
  const std::string bad_tree = EditedCopy(tmp, img, "bad_tree.img", [&](ubtrfs::tree::TreeWriter& w) {
    return w.Update(fmt_::Key{ino, fmt_::kVerityMerkleItemKey, 0}, SpanOf(top));
  });
  r = RunUbtrfs({"fsverity", "verify", bad_tree + ":/f"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("upper levels are damaged"), std::string::npos) << r.Describe();
}

TEST(Verity, CheckNamesDamageAndTheOrphanCleanupDropsAnUnfinishedEnable) {
  TempDir tmp("ubtrfs-verity");
  const std::string img = MkImage(tmp, "v.img");
  uint64_t ino = 0, plain_ino = 0;
  {
    auto fs = OpenWritable(img);
    ASSERT_TRUE(fs);
    PutFile(*fs, "/", "v", SeededBytes(1 << 20, 16));
    PutFile(*fs, "/", "plain", SeededBytes(1 << 20, 17));
    ino = MustLookup(*fs, "/v").ino;
    plain_ino = MustLookup(*fs, "/plain").ino;
    ASSERT_TRUE(fs->EnableVerity(MustLookup(*fs, "/v"), {}).ok());
    ASSERT_TRUE(fs->Commit().ok());
  }
  ASSERT_TRUE(RunUbtrfs({"check", img}).ok());
  // One Merkle item gone: a gap in the tree.
  const std::string gap = EditedCopy(tmp, img, "gap.img", [&](ubtrfs::tree::TreeWriter& w) {
    return w.Delete(fmt_::Key{ino, fmt_::kVerityMerkleItemKey, 2048});
  });
  CommandResult r = RunUbtrfs({"check", gap});
  EXPECT_FALSE(r.ok());
  EXPECT_NE((r.out + r.err).find("Merkle tree item at 4096 where 2048 was due"), std::string::npos) << r.Describe();
  // The descriptor item's reserved bytes set: GetVerity refuses it too.
  const std::string reserved = EditedCopy(tmp, img, "reserved.img", [&](ubtrfs::tree::TreeWriter& w) {
    fmt_::VerityDescriptorItem head{};
    head.size = 256;
    head.encryption = 1;
    return w.Update(fmt_::Key{ino, fmt_::kVerityDescItemKey, 0},
                    std::span(reinterpret_cast<const uint8_t*>(&head), sizeof(head)));
  });
  r = RunUbtrfs({"check", reserved});
  EXPECT_FALSE(r.ok());
  EXPECT_NE((r.out + r.err).find("reserved fields set"), std::string::npos) << r.Describe();
  {
    auto fs = Filesystem::Open(reserved);
    ASSERT_TRUE(fs.ok());
    EXPECT_EQ((*fs)->GetVerity(MustLookup(**fs, "/v")).status().code(), EUCLEAN);
  }

  // What an enable a crash cut short leaves (the kernel's order): items,
  // no flag, and an orphan item naming the linked inode. Check accepts it;
  // the next writable open drops the items and the orphan item.
  const std::string cut = EditedCopy(tmp, img, "cut.img", [&](ubtrfs::tree::TreeWriter& w) -> Status {
    const std::string chunk(2048, 'm');
    for (uint64_t off = 0; off < 3 * 2048; off += 2048) {
      UB_RETURN_IF_ERROR(w.Insert(fmt_::Key{plain_ino, fmt_::kVerityMerkleItemKey, off}, SpanOf(chunk)));
    }
    return w.Insert(fmt_::Key{fmt_::kOrphanObjectid, fmt_::kOrphanItemKey, plain_ino}, {});
  });
  r = RunUbtrfs({"check", cut});
  EXPECT_TRUE(r.ok()) << r.Describe();
  // Without the orphan item nothing would ever drop them.
  const std::string stray = EditedCopy(tmp, cut, "stray.img", [&](ubtrfs::tree::TreeWriter& w) {
    return w.Delete(fmt_::Key{fmt_::kOrphanObjectid, fmt_::kOrphanItemKey, plain_ino});
  });
  r = RunUbtrfs({"check", stray});
  EXPECT_FALSE(r.ok());
  EXPECT_NE((r.out + r.err).find("fs-verity items without the VERITY flag"), std::string::npos) << r.Describe();
  {
    auto fs = OpenWritable(cut);
    ASSERT_TRUE(fs);
    EXPECT_EQ(ReadImageFile(*fs, "/plain"), SeededBytes(1 << 20, 17));
  }
  EXPECT_EQ(CountVerityItems(cut, plain_ino), 0u);
  EXPECT_GT(CountVerityItems(cut, ino), 2u);  // the finished one stays
  r = RunUbtrfs({"check", cut});
  EXPECT_TRUE(r.ok()) << r.Describe();
  EXPECT_EQ(BtrfsCheck(cut), "");
}

}  // namespace
}  // namespace ubtrfs_test
