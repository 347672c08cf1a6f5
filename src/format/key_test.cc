#include "format/key.h"

#include <gtest/gtest.h>

namespace ubtrfs::format {
namespace UBTRFS_UNITY_ID {

TEST(Key, OrdersByObjectidThenTypeThenOffset) {
  EXPECT_LT((Key{1, 200, 500}), (Key{2, 0, 0}));
  EXPECT_LT((Key{5, kInodeItemKey, 99}), (Key{5, kInodeRefKey, 0}));
  EXPECT_LT((Key{5, kDirIndexKey, 2}), (Key{5, kDirIndexKey, 3}));
  EXPECT_LT(Key::Min(), Key::Max());
  // Offsets and objectids compare unsigned: -1 is the largest.
  EXPECT_LT((Key{kFirstFreeObjectid, 0, 0}), (Key{kExtentCsumObjectid, 0, 0}));
}

TEST(Key, RoundTripsThroughDiskKey) {
  DiskKey d;
  Key k{0x0102030405060708ULL, kExtentDataKey, 0xfffffffffffffff0ULL};
  k.To(&d);
  const auto* raw = reinterpret_cast<const uint8_t*>(&d);
  EXPECT_EQ(raw[0], 0x08);  // little-endian on disk whatever the host
  EXPECT_EQ(raw[8], kExtentDataKey);
  EXPECT_EQ(Key::From(d), k);
}

TEST(Key, PrintsLikeDumpTree) {
  EXPECT_EQ(KeyToString(Key{256, kInodeItemKey, 0}), "(256 INODE_ITEM 0)");
  EXPECT_EQ(KeyToString(Key{kExtentCsumObjectid, kExtentCsumKey, 13631488}), "(EXTENT_CSUM EXTENT_CSUM 13631488)");
  EXPECT_EQ(KeyToString(Key{kFsTreeObjectid, kRootItemKey, UINT64_MAX}), "(FS_TREE ROOT_ITEM -1)");
}

}  // namespace
}  // namespace ubtrfs::format
