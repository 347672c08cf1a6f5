// `ubtrfs dump-tree` against images made by mkfs.btrfs --rootdir: every tree
// is printed with real content (inodes, names, extents, chunks), -t / -b /
// --follow / -r select what is printed, and damaged blocks or items give ERROR
// lines and a nonzero exit instead of a crash.
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "format/checksum.h"
#include "support/test_util.h"
#include "ubtrfs/inspect.h"

namespace UBTRFS_UNITY_ID {

using ubtrfs_test::CommandResult;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

constexpr uint32_t kNodeSize = 16384;  // mkfs.btrfs default

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool WriteFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
  return static_cast<bool>(f);
}

// One tree of the dump: the line that introduces it ("root tree",
// "fs tree key (FS_TREE ROOT_ITEM 0)") and the lines below it.
struct Section {
  std::string title;
  std::vector<std::string> lines;
};

bool IsTitle(const std::string& line) {
  static const std::regex kTitle(R"(^(root tree|chunk tree|log root tree|[a-z ]+ key \(.*\))$)");
  return std::regex_match(line, kTitle);
}

std::vector<Section> Sections(const std::string& out) {
  std::vector<Section> secs;
  for (const auto& line : Lines(out)) {
    if (IsTitle(line)) {
      secs.push_back({line, {}});
    } else if (!secs.empty()) {
      secs.back().lines.push_back(line);
    }
  }
  return secs;
}

const Section* FindSection(const std::vector<Section>& secs, const std::string& title) {
  for (const auto& s : secs) {
    if (s.title == title) return &s;
  }
  return nullptr;
}
// The result points into `secs`: keep the vector alive.
const Section* FindSection(std::vector<Section>&& secs, const std::string& title) = delete;

int CountMatching(const std::vector<std::string>& lines, const std::regex& re) {
  int n = 0;
  for (const auto& l : lines) n += std::regex_search(l, re) ? 1 : 0;
  return n;
}

// The "name: " lines of items whose key type is `type`.
std::vector<std::string> NamesOf(const std::vector<std::string>& lines, const std::string& type) {
  static const std::regex kItem(R"(^\titem \d+ key \(\S+ (\S+) \S+\) itemoff)");
  std::vector<std::string> names;
  bool in = false;
  for (const auto& l : lines) {
    std::smatch m;
    if (std::regex_search(l, m, kItem)) {
      in = m[1] == type;
    } else if (in && l.rfind("\t\tname: ", 0) == 0) {
      names.push_back(l.substr(8));
    }
  }
  return names;
}

struct ChunkLoc {
  uint64_t logical = 0, length = 0;
  std::vector<uint64_t> stripes;  // physical offsets of the copies
};

// The chunks as the dump's chunk tree shows them.
std::vector<ChunkLoc> ParseChunks(const std::vector<std::string>& lines) {
  static const std::regex kKey(R"(^\titem \d+ key \(FIRST_CHUNK_TREE CHUNK_ITEM (\d+)\))");
  static const std::regex kLen(R"(^\t\tlength (\d+) owner)");
  static const std::regex kStripe(R"(^\t\t\tstripe \d+ devid \d+ offset (\d+)$)");
  std::vector<ChunkLoc> chunks;
  for (const auto& l : lines) {
    std::smatch m;
    if (std::regex_search(l, m, kKey)) {
      chunks.push_back({std::stoull(m[1]), 0, {}});
    } else if (!chunks.empty() && std::regex_search(l, m, kLen)) {
      chunks.back().length = std::stoull(m[1]);
    } else if (!chunks.empty() && std::regex_search(l, m, kStripe)) {
      chunks.back().stripes.push_back(std::stoull(m[1]));
    } else if (l.rfind("\titem ", 0) == 0) {
      // another item type: not part of a chunk
    }
  }
  return chunks;
}

std::vector<uint64_t> PhysicalCopies(const std::vector<ChunkLoc>& chunks, uint64_t logical) {
  for (const auto& c : chunks) {
    if (logical >= c.logical && logical + kNodeSize <= c.logical + c.length) {
      std::vector<uint64_t> out;
      for (uint64_t s : c.stripes) out.push_back(s + (logical - c.logical));
      return out;
    }
  }
  return {};
}

class DumpTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mkfs_ = ubtrfs_test::FindProgram("mkfs.btrfs");
    if (mkfs_.empty()) GTEST_SKIP() << "mkfs.btrfs not installed";
    const std::string root = dir_.Sub("root");
    ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((root + "/sub").c_str(), 0755), 0);
    ASSERT_TRUE(WriteFile(root + "/a.txt", "hello\n"));
    ASSERT_TRUE(WriteFile(root + "/sub/b.txt", "bee\n"));
    std::string big(1536 * 1024 + 123, '\0');  // > 1 MiB: regular extents
    uint32_t x = 12345;
    for (auto& c : big) {
      x = x * 1103515245u + 12345u;
      c = static_cast<char>(x >> 24);
    }
    ASSERT_TRUE(WriteFile(root + "/big.bin", big));
    ASSERT_TRUE(WriteFile(root + "/tab\there", "t"));  // a control byte in a name
    ASSERT_EQ(::symlink("a.txt", (root + "/link").c_str()), 0);
    xattr_ = ::setxattr((root + "/a.txt").c_str(), "user.dumptest", "value123", 8, 0) == 0;
    // a.txt, big.bin, tab\there, link, sub, sub/b.txt
    created_ = 6;

    image_ = dir_.Sub("fs.img");
    std::string err;
    ASSERT_TRUE(ubtrfs_test::MakeSparseFile(image_, 256ull << 20, &err)) << err;
    CommandResult mk = RunCommand({mkfs_, "-q", "-f", "--rootdir", root, image_});
    ASSERT_TRUE(mk.ok()) << mk.Describe();
  }

  CommandResult Dump(std::vector<std::string> args) {
    std::vector<std::string> argv = {UBTRFS_CLI_PATH, "dump-tree"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }

  // "fs tree key (FS_TREE ROOT_ITEM 0) 30441472 level 0" from -r.
  uint64_t FsTreeRoot(const std::string& image) {
    CommandResult r = Dump({"-r", image});
    EXPECT_TRUE(r.ok()) << r.Describe();
    std::smatch m;
    static const std::regex kFs(R"(\nfs tree key \(FS_TREE ROOT_ITEM 0\) (\d+) level (\d+)\n)");
    if (!std::regex_search(r.out, m, kFs)) {
      ADD_FAILURE() << "no fs tree root in -r output: " << r.out;
      return 0;
    }
    EXPECT_EQ(m[2], "0") << "the small fs tree should be one leaf";
    return std::stoull(m[1]);
  }

  // Every physical copy of the fs tree's root block in the image file
  // (empty, with a failure recorded, when it cannot be found).
  std::vector<uint64_t> FsRootCopies() {
    CommandResult all = Dump({image_});
    EXPECT_EQ(all.exit_code, 0) << all.Describe();
    const auto secs = Sections(all.out);
    const Section* chunk = FindSection(secs, "chunk tree");
    if (chunk == nullptr) {
      ADD_FAILURE() << "no chunk tree in the dump";
      return {};
    }
    const uint64_t fs_root = FsTreeRoot(image_);
    auto copies = PhysicalCopies(ParseChunks(chunk->lines), fs_root);
    EXPECT_FALSE(copies.empty()) << "fs tree root " << fs_root << " not in any chunk";
    return copies;
  }

  TempDir dir_{"dump-tree-test"};
  std::string mkfs_, image_;
  bool xattr_ = false;
  int created_ = 0;
};

TEST_F(DumpTreeTest, DefaultPrintsEveryTreeWithContent) {
  CommandResult r = Dump({image_});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.out.find("ERROR"), std::string::npos) << r.out;

  static const std::regex kRootHdr(R"((^|\n)root tree: (\d+) level (\d+)\n)");
  static const std::regex kChunkHdr(R"(\nchunk tree: (\d+) level (\d+)\n)");
  EXPECT_TRUE(std::regex_search(r.out, kRootHdr)) << r.out.substr(0, 500);
  EXPECT_TRUE(std::regex_search(r.out, kChunkHdr)) << r.out.substr(0, 500);

  const auto secs = Sections(r.out);
  for (const char* title : {"root tree", "chunk tree", "extent tree key (EXTENT_TREE ROOT_ITEM 0)",
                            "device tree key (DEV_TREE ROOT_ITEM 0)", "fs tree key (FS_TREE ROOT_ITEM 0)",
                            "checksum tree key (CSUM_TREE ROOT_ITEM 0)", "uuid tree key (UUID_TREE ROOT_ITEM 0)",
                            "free space tree key (FREE_SPACE_TREE ROOT_ITEM 0)",
                            "data reloc tree key (DATA_RELOC_TREE ROOT_ITEM 0)"}) {
    const Section* s = FindSection(secs, title);
    ASSERT_NE(s, nullptr) << "missing tree: " << title;
    ASSERT_FALSE(s->lines.empty()) << title;
    EXPECT_TRUE(s->lines[0].rfind("leaf ", 0) == 0 || s->lines[0].rfind("node ", 0) == 0)
        << title << ": " << s->lines[0];
  }
  // Every ROOT_ITEM of the root tree has its tree printed.
  const Section* root = FindSection(secs, "root tree");
  static const std::regex kRootItem(R"(^\titem \d+ key (\(\S+ ROOT_ITEM \S+\)) itemoff)");
  int root_items = 0;
  for (const auto& l : root->lines) {
    std::smatch m;
    if (!std::regex_search(l, m, kRootItem)) continue;
    ++root_items;
    bool found = false;
    for (const auto& s : secs) found |= s.title.ends_with(" key " + m[1].str());
    EXPECT_TRUE(found) << "no section for " << m[1];
  }
  EXPECT_GE(root_items, 7);

  const Section* fs = FindSection(secs, "fs tree key (FS_TREE ROOT_ITEM 0)");
  static const std::regex kInode(R"(^\titem \d+ key \(\d+ INODE_ITEM 0\) itemoff \d+ itemsize 160$)");
  EXPECT_EQ(CountMatching(fs->lines, kInode), created_ + 1);  // + the root directory
  static const std::regex kInodeBody(R"(^\t\tgeneration \d+ transid \d+ size \d+ nbytes \d+$)");
  EXPECT_EQ(CountMatching(fs->lines, kInodeBody), created_ + 1);

  auto index_names = NamesOf(fs->lines, "DIR_INDEX");
  std::set<std::string> names(index_names.begin(), index_names.end());
  EXPECT_EQ(names, (std::set<std::string>{"a.txt", "big.bin", "tab\\x09here", "link", "sub", "b.txt"}));
  auto item_names = NamesOf(fs->lines, "DIR_ITEM");
  EXPECT_EQ(std::set<std::string>(item_names.begin(), item_names.end()), names);
  auto ref_lines = CountMatching(fs->lines, std::regex(R"(^\t\tindex \d+ namelen 5 name: a\.txt$)"));
  EXPECT_EQ(ref_lines, 1);
  EXPECT_EQ(CountMatching(fs->lines, std::regex(R"(^\t\tlocation key \(\d+ INODE_ITEM 0\) type SYMLINK$)")), 2);
  if (xattr_) {
    auto xnames = NamesOf(fs->lines, "XATTR_ITEM");
    EXPECT_EQ(xnames, std::vector<std::string>{"user.dumptest"});
    EXPECT_EQ(CountMatching(fs->lines, std::regex(R"(^\t\ttransid \d+ data_len 8 name_len 13$)")), 1);
    EXPECT_EQ(CountMatching(fs->lines, std::regex(R"(^\t\tdata value123$)")), 1);
  }
  // big.bin: regular extents adding up to its size rounded to sectors; the
  // small files inline.
  static const std::regex kReg(R"(^\t\textent data offset 0 nr (\d+) ram \d+$)");
  uint64_t reg_bytes = 0;
  for (const auto& l : fs->lines) {
    std::smatch m;
    if (std::regex_search(l, m, kReg)) reg_bytes += std::stoull(m[1]);
  }
  EXPECT_EQ(reg_bytes, (1536ull * 1024 + 123 + 4095) / 4096 * 4096);
  EXPECT_GE(CountMatching(fs->lines, std::regex(R"(^\t\tinline extent data size \d+ ram_bytes \d+ compression 0 \(none\)$)")),
            3);

  const Section* chunk = FindSection(secs, "chunk tree");
  EXPECT_GE(CountMatching(chunk->lines, std::regex(R"(^\titem \d+ key \(FIRST_CHUNK_TREE CHUNK_ITEM \d+\))")), 3);
  EXPECT_GE(CountMatching(chunk->lines, std::regex(R"(^\t\t\tstripe 0 devid 1 offset \d+$)")), 3);
  EXPECT_EQ(CountMatching(chunk->lines, std::regex(R"(^\titem 0 key \(DEV_ITEMS DEV_ITEM 1\))")), 1);
  EXPECT_EQ(CountMatching(chunk->lines, std::regex(R"(^\t\tdevid 1 total_bytes 268435456 bytes_used \d+$)")), 1);

  const Section* extent = FindSection(secs, "extent tree key (EXTENT_TREE ROOT_ITEM 0)");
  EXPECT_GE(CountMatching(extent->lines, std::regex(R"(^\t\textent data backref root FS_TREE objectid \d+ offset \d+ count 1$)")),
            1);
  EXPECT_GE(CountMatching(extent->lines, std::regex(R"(^\t\ttree block backref root FS_TREE$)")), 1);
  EXPECT_GE(CountMatching(extent->lines, std::regex(R"(^\t\tblock group used \d+ chunk_objectid 256 flags DATA)")), 1);
  const Section* csum = FindSection(secs, "checksum tree key (CSUM_TREE ROOT_ITEM 0)");
  EXPECT_GE(CountMatching(csum->lines, std::regex(R"(^\t\trange start \d+ end \d+ length \d+$)")), 1);
  const Section* dev = FindSection(secs, "device tree key (DEV_TREE ROOT_ITEM 0)");
  EXPECT_GE(CountMatching(dev->lines, std::regex(R"(^\t\tdev extent chunk_tree 3$)")), 3);
  EXPECT_NE(r.out.find("\ntotal bytes 268435456\n"), std::string::npos);
}

TEST_F(DumpTreeTest, TreeOptionPrintsOnlyThatTree) {
  CommandResult all = Dump({image_});
  ASSERT_EQ(all.exit_code, 0) << all.Describe();
  const auto all_secs = Sections(all.out);
  const Section* fs_all = FindSection(all_secs, "fs tree key (FS_TREE ROOT_ITEM 0)");
  ASSERT_NE(fs_all, nullptr);

  for (const char* name : {"fs", "5", "FS_TREE"}) {
    CommandResult r = Dump({"-t", name, image_});
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.Describe();
    const auto secs = Sections(r.out);
    ASSERT_EQ(secs.size(), 1u) << name << ": " << r.out.substr(0, 1000);
    EXPECT_EQ(secs[0].title, "fs tree key (FS_TREE ROOT_ITEM 0)");
    EXPECT_EQ(secs[0].lines, fs_all->lines) << name;
    EXPECT_EQ(r.out.find("CHUNK_ITEM"), std::string::npos);
    EXPECT_EQ(r.out.find("ROOT_ITEM 0) itemoff"), std::string::npos);
    static const std::regex kOwner(R"(^(leaf|node) \d+ .* owner (\S+)$)");
    int blocks = 0;
    for (const auto& l : secs[0].lines) {
      std::smatch m;
      if (!std::regex_match(l, m, kOwner)) continue;
      ++blocks;
      EXPECT_EQ(m[2], "FS_TREE") << l;
    }
    EXPECT_GE(blocks, 1);
  }

  CommandResult chunk = Dump({"-t", "chunk", image_});
  ASSERT_EQ(chunk.exit_code, 0) << chunk.Describe();
  auto secs = Sections(chunk.out);
  ASSERT_EQ(secs.size(), 1u);
  EXPECT_EQ(secs[0].title, "chunk tree");
  EXPECT_NE(chunk.out.find("CHUNK_ITEM"), std::string::npos);

  CommandResult fst = Dump({"-t", "free-space", image_});
  ASSERT_EQ(fst.exit_code, 0) << fst.Describe();
  secs = Sections(fst.out);
  ASSERT_EQ(secs.size(), 1u);
  EXPECT_EQ(secs[0].title, "free space tree key (FREE_SPACE_TREE ROOT_ITEM 0)");
  EXPECT_NE(fst.out.find("\t\tfree space info extent count "), std::string::npos);

  CommandResult bad = Dump({"-t", "no-such-tree", image_});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_LT(bad.exit_code, 128) << bad.Describe();
  CommandResult missing = Dump({"-t", "777", image_});
  EXPECT_EQ(missing.exit_code, 1) << missing.Describe();
}

TEST_F(DumpTreeTest, BlockOptionPrintsOneBlockOrFollows) {
  CommandResult all = Dump({image_});
  ASSERT_EQ(all.exit_code, 0) << all.Describe();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(all.out, m, std::regex(R"((^|\n)root tree: (\d+) level (\d+)\n)")));
  const std::string bytenr = m[2], level = m[3];
  const auto all_secs = Sections(all.out);
  const Section* root = FindSection(all_secs, "root tree");
  ASSERT_NE(root, nullptr);

  CommandResult one = Dump({"-b", bytenr, image_});
  ASSERT_EQ(one.exit_code, 0) << one.Describe();
  const auto lines = Lines(one.out);
  ASSERT_FALSE(lines.empty());
  if (level == "0") {
    EXPECT_TRUE(lines[0].rfind("leaf " + bytenr + " items ", 0) == 0) << lines[0];
    EXPECT_EQ(lines, root->lines);
  } else {
    EXPECT_TRUE(lines[0].rfind("node " + bytenr + " level " + level + " ", 0) == 0) << lines[0];
  }
  CommandResult follow = Dump({"-b", bytenr, "--follow", image_});
  ASSERT_EQ(follow.exit_code, 0) << follow.Describe();
  EXPECT_EQ(Lines(follow.out), root->lines);

  // Two blocks in one call, each printed in turn.
  const uint64_t fs_root = FsTreeRoot(image_);
  ASSERT_NE(fs_root, 0u);
  CommandResult two = Dump({"-b", bytenr, "-b", std::to_string(fs_root), image_});
  ASSERT_EQ(two.exit_code, 0) << two.Describe();
  EXPECT_EQ(CountMatching(Lines(two.out), std::regex(R"(^(leaf|node) \d+ .* owner (ROOT_TREE|FS_TREE)$)")), 2);

  // Addresses that are no tree block: an error line, exit 1, no crash.
  for (const std::string& b : {std::string("12345"), std::string("4096"), std::string("1099511627776")}) {
    CommandResult r = Dump({"-b", b, image_});
    EXPECT_EQ(r.exit_code, 1) << b << ": " << r.Describe();
    EXPECT_NE(r.out.find("ERROR: "), std::string::npos) << b << ": " << r.Describe();
  }
  CommandResult no_block = Dump({"--follow", image_});
  EXPECT_NE(no_block.exit_code, 0);
}

// Overwrites bytes in every copy of the block at `logical`.
void Smash(const std::string& image, const std::vector<uint64_t>& copies, uint64_t at, const std::string& junk) {
  FILE* f = std::fopen(image.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  for (uint64_t c : copies) {
    ASSERT_EQ(std::fseek(f, static_cast<long>(c + at), SEEK_SET), 0);
    ASSERT_EQ(std::fwrite(junk.data(), 1, junk.size(), f), junk.size());
  }
  std::fclose(f);
}

// The tree shapes of `ubtrfs stats IMAGE` (ubtrfs::TreeShapes): a damaged
// tree has its error, and the walk goes on to the others, which count as
// before.
TEST_F(DumpTreeTest, DamagedTreeHasItsErrorAndTheOthersTheirShapes) {
  auto before = ubtrfs::TreeShapes(image_, {});
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  const auto copies = FsRootCopies();
  ASSERT_FALSE(copies.empty());
  const std::string damaged = dir_.Sub("damaged-shapes.img");
  ASSERT_TRUE(RunCommand({"cp", "--sparse=always", image_, damaged}).ok());
  Smash(damaged, copies, kNodeSize / 2, std::string(64, '\x5a'));

  auto after = ubtrfs::TreeShapes(damaged, {});
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ASSERT_EQ(after->size(), before->size());
  for (size_t i = 0; i < after->size(); ++i) {
    const ubtrfs::TreeShape& a = (*after)[i];
    const ubtrfs::TreeShape& b = (*before)[i];
    ASSERT_EQ(a.tree, b.tree);
    EXPECT_TRUE(b.error.empty()) << b.name << ": " << b.error;
    if (a.tree == 5) {
      EXPECT_NE(a.error.find("checksum mismatch"), std::string::npos) << a.error;
      continue;
    }
    EXPECT_TRUE(a.error.empty()) << a.name << ": " << a.error;
    EXPECT_EQ(a.items, b.items) << a.name;
    EXPECT_EQ(a.leaves, b.leaves) << a.name;
    EXPECT_GT(a.items, 0u) << a.name;
    EXPECT_LE(a.leaf_bytes_used, a.leaf_bytes) << a.name;
  }
  // The command: the other trees printed, the damaged one on stderr, exit 1.
  CommandResult st = RunCommand({UBTRFS_CLI_PATH, "stats", damaged});
  EXPECT_EQ(st.exit_code, 1) << st.Describe();
  EXPECT_NE(st.out.find("ROOT_TREE"), std::string::npos) << st.out;
  EXPECT_NE(st.out.find("EXTENT_TREE"), std::string::npos) << st.out;
  EXPECT_EQ(st.out.find("FS_TREE"), std::string::npos) << st.out;
  EXPECT_NE(st.err.find("tree 5: "), std::string::npos) << st.err;
}

TEST_F(DumpTreeTest, DamagedBlockGivesErrorLineAndNonzeroExit) {
  CommandResult all = Dump({image_});
  ASSERT_EQ(all.exit_code, 0) << all.Describe();
  const auto secs = Sections(all.out);
  const Section* chunk = FindSection(secs, "chunk tree");
  ASSERT_NE(chunk, nullptr);
  const uint64_t fs_root = FsTreeRoot(image_);
  ASSERT_NE(fs_root, 0u);
  const auto copies = PhysicalCopies(ParseChunks(chunk->lines), fs_root);
  ASSERT_FALSE(copies.empty()) << "fs tree root " << fs_root << " not in any chunk";

  const std::string damaged = dir_.Sub("damaged.img");
  ASSERT_TRUE(RunCommand({"cp", "--sparse=always", image_, damaged}).ok());
  Smash(damaged, copies, kNodeSize / 2, std::string(64, '\xa5'));

  const std::string block = "tree block " + std::to_string(fs_root);
  CommandResult r = Dump({damaged});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  const auto lines = Lines(r.out);
  int errors = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("ERROR: ", 0) != 0) continue;
    ++errors;
    EXPECT_NE(lines[i].find(block), std::string::npos) << lines[i];
    EXPECT_NE(lines[i].find("checksum mismatch"), std::string::npos) << lines[i];
    ASSERT_GT(i, 0u);
    EXPECT_EQ(lines[i - 1], "fs tree key (FS_TREE ROOT_ITEM 0)");
  }
  EXPECT_EQ(errors, 1) << r.out;
  // The other trees are still printed in full.
  const auto dsecs = Sections(r.out);
  EXPECT_EQ(dsecs.size(), secs.size());
  for (const auto& s : secs) {
    if (s.title == "fs tree key (FS_TREE ROOT_ITEM 0)") continue;
    const Section* d = FindSection(dsecs, s.title);
    ASSERT_NE(d, nullptr) << s.title;
    EXPECT_EQ(d->lines.size(), s.lines.size()) << s.title;
  }

  CommandResult t = Dump({"-t", "fs", damaged});
  EXPECT_EQ(t.exit_code, 1) << t.Describe();
  EXPECT_NE(t.out.find("ERROR: "), std::string::npos);
  EXPECT_NE(t.out.find(block), std::string::npos);
  CommandResult b = Dump({"-b", std::to_string(fs_root), damaged});
  EXPECT_EQ(b.exit_code, 1) << b.Describe();
  EXPECT_NE(b.out.find("ERROR: "), std::string::npos);
  EXPECT_NE(b.out.find(block), std::string::npos);
}

// A block whose checksum is right but whose items lie: a DIR_INDEX claiming a
// name longer than the item, and an INODE_ITEM key on a too-small INODE_REF.
TEST_F(DumpTreeTest, DamagedItemsGiveErrorLinesNotOverreads) {
  const auto copies = FsRootCopies();
  ASSERT_FALSE(copies.empty());

  const std::string damaged = dir_.Sub("items.img");
  ASSERT_TRUE(RunCommand({"cp", "--sparse=always", image_, damaged}).ok());
  std::vector<uint8_t> blk(kNodeSize);
  {
    FILE* f = std::fopen(damaged.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, static_cast<long>(copies[0]), SEEK_SET), 0);
    ASSERT_EQ(std::fread(blk.data(), 1, blk.size(), f), blk.size());
    std::fclose(f);
  }
  constexpr size_t kHeader = 101, kItem = 25;
  const uint32_t nritems = blk[96] | blk[97] << 8 | blk[98] << 16 | static_cast<uint32_t>(blk[99]) << 24;
  ASSERT_GT(nritems, 2u);
  bool dir_done = false, ref_done = false;
  for (uint32_t i = 0; i < nritems; ++i) {
    uint8_t* item = blk.data() + kHeader + i * kItem;
    const uint8_t type = item[8];
    const uint32_t off = item[17] | item[18] << 8 | item[19] << 16 | static_cast<uint32_t>(item[20]) << 24;
    if (type == 96 && !dir_done) {  // DIR_INDEX: name_len sits 27 bytes into the dir item
      blk[kHeader + off + 27] = 0xff;
      blk[kHeader + off + 28] = 0x7f;
      dir_done = true;
    }
    // INODE_REF (12) right after the root dir's INODE_ITEM (1): retyping it to
    // INODE_ITEM keeps the keys sorted ((256 1 0) < (256 1 256) < (256 84 ..)).
    if (type == 12 && !ref_done && i > 0 && blk[kHeader + (i - 1) * kItem + 8] == 1) {
      item[8] = 1;
      ref_done = true;
    }
  }
  ASSERT_TRUE(dir_done && ref_done);
  const auto csum = ubtrfs::format::ComputeCsum(0, std::span<const uint8_t>(blk).subspan(32));
  std::copy(csum.begin(), csum.end(), blk.begin());
  Smash(damaged, copies, 0, std::string(blk.begin(), blk.end()));

  CommandResult r = Dump({"-t", "fs", damaged});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.out.find("\nERROR: "), std::string::npos) << "the block itself is valid: " << r.out;
  EXPECT_NE(r.out.find("\t\tERROR: DIR_ITEM name and data (32767 + 0 bytes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\t\tERROR: item too small for INODE_ITEM (size 12, need 160)"), std::string::npos) << r.out;
  // The items after the damaged ones are still printed.
  auto names = NamesOf(Lines(r.out), "DIR_INDEX");
  EXPECT_EQ(names.size(), 5u);
  static const std::regex kInode(R"(^\titem \d+ key \(\d+ INODE_ITEM 0\) itemoff \d+ itemsize 160$)");
  EXPECT_EQ(CountMatching(Lines(r.out), kInode), created_ + 1);
}

}  // namespace
