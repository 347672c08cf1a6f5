// The transaction layer against btrfs-progs: change an image made by
// mkfs.btrfs through TxnManager, commit, and require `btrfs check` to pass
// and ubtrfs's own read path (and the kernel, where it can mount) to see the
// change.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <map>

#include "format/checksum.h"
#include "io/block_device.h"
#include "support/items.h"
#include "support/mkfs_util.h"
#include "support/open_txn.h"
#include "support/test_util.h"
#include "txn/transaction.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using namespace ubtrfs::format;
using ubtrfs_test::RunCommand;
using ubtrfs_test::TempDir;

using ubtrfs_test::XattrItem;

using ubtrfs_test::BtrfsCheck;

using ubtrfs_test::Opened;

class TxnTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(TxnTest, XattrChurnOverCommitsStaysCheckClean) {
  if (auto why = ubtrfs_test::MkfsMissingReason(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir("ubtrfs-txn");
  const std::string src = dir.Sub("src"), img = dir.Sub("img");
  ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
  for (int i = 0; i < 50; ++i) std::ofstream(src + "/f" + std::to_string(i)) << std::string(i * 300, 'x');
  ASSERT_EQ(ubtrfs_test::RunMkfs(img, src, GetParam(), "crc32c"), "");

  std::map<std::string, std::string> model;
  for (int round = 0; round < 3; ++round) {
    auto opened = ubtrfs_test::OpenForWrite(img);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    Opened o = std::move(*opened);
    auto w = o.txn->Writer(kFsTreeObjectid);
    ASSERT_TRUE(w.ok());
    // Round 0 adds 600 xattrs to the root directory (many leaves), round 1
    // deletes every other one, round 2 rewrites the rest with larger values.
    int n = 0;
    if (round == 0) {
      for (int i = 0; i < 600; ++i) {
        std::string name = "user.attr" + std::to_string(i), value(i % 200, static_cast<char>('a' + i % 26));
        Status st = (*w)->Insert(Key{256, kXattrItemKey, NameHash(name)}, XattrItem(name, value, o.txn->transid()));
        if (st.code() == EEXIST) continue;  // a hash collision: skip that name
        ASSERT_TRUE(st.ok()) << st.ToString();
        model[name] = value;
        ++n;
      }
    } else {
      int i = 0;
      for (auto it = model.begin(); it != model.end(); ++i) {
        const Key k{256, kXattrItemKey, NameHash(it->first)};
        if (round == 1 && i % 2 == 0) {
          ASSERT_TRUE((*w)->Delete(k).ok());
          it = model.erase(it);
        } else {
          if (round == 2) {
            it->second = std::string(300 + i % 500, 'z');
            ASSERT_TRUE((*w)->Update(k, XattrItem(it->first, it->second, o.txn->transid())).ok());
          }
          ++it;
        }
      }
    }
    Status st = o.txn->Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
    o.txn.reset();  // before the volume it points into
    o.vol.reset();
    ASSERT_EQ(BtrfsCheck(img), "") << "after round " << round;

    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    auto names = (*fs)->ListXattr((*fs)->Root());
    ASSERT_TRUE(names.ok());
    EXPECT_EQ(names->size(), model.size());
    for (const auto& [name, value] : model) {
      auto v = (*fs)->GetXattr((*fs)->Root(), name);
      ASSERT_TRUE(v.ok()) << name;
      ASSERT_EQ(*v, value) << name;
    }
    // The files mkfs wrote are intact.
    auto f = (*fs)->Lookup("/f49");
    ASSERT_TRUE(f.ok());
    std::vector<uint8_t> buf(20000);
    auto r = (*fs)->Read(*f, 0, buf);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, 49u * 300);
  }
}

INSTANTIATE_TEST_SUITE_P(NodeSizes, TxnTest, ::testing::Values(4096u, 16384u),
                         [](const auto& info) { return "node" + std::to_string(info.param); });

}  // namespace
