#include "txn/extent_refs.h"

#include <gtest/gtest.h>

#include <vector>

namespace ubtrfs::txn {
namespace UBTRFS_UNITY_ID {

using namespace ubtrfs::format;

std::vector<uint8_t> EmptyExtentItem(uint64_t refs, uint64_t flags) {
  std::vector<uint8_t> item(sizeof(ExtentItem));
  auto* ei = reinterpret_cast<ExtentItem*>(item.data());
  ei->refs = refs;
  ei->generation = 7;
  ei->flags = flags;
  return item;
}

void Insert(std::vector<uint8_t>& item, const InlineRef& r) {
  auto refs = ParseInlineRefs(item, sizeof(ExtentItem), Key{1, kExtentItemKey, 4096});
  ASSERT_TRUE(refs.ok()) << refs.status().ToString();
  InsertInlineRef(item, *refs, sizeof(ExtentItem), r);
}

InlineRef DataRef(uint64_t root, uint64_t ino, uint64_t off, uint32_t count) {
  InlineRef r;
  r.type = kExtentDataRefKey;
  r.root = root;
  r.objectid = ino;
  r.data_offset = off;
  r.count = count;
  return r;
}

InlineRef Shared(uint8_t type, uint64_t parent, uint32_t count = 1) {
  InlineRef r;
  r.type = type;
  r.offset = parent;
  r.count = count;
  return r;
}

// Inline refs go where the kernel's tree checker wants them: types
// ascending, and within a type the sort value (hash or offset) descending.
TEST(ExtentRefs, InsertKeepsTheKernelsOrder) {
  auto item = EmptyExtentItem(5, kExtentFlagData);
  Insert(item, Shared(kSharedDataRefKey, 65536));
  Insert(item, DataRef(5, 257, 0, 1));
  Insert(item, Shared(kSharedDataRefKey, 1 << 30, 2));
  Insert(item, DataRef(5, 258, 4096, 1));
  Insert(item, DataRef(256, 300, 0, 3));
  auto refs = ParseInlineRefs(item, sizeof(ExtentItem), Key{1, kExtentItemKey, 4096});
  ASSERT_TRUE(refs.ok());
  ASSERT_EQ(refs->size(), 5u);
  for (size_t i = 1; i < refs->size(); ++i) {
    const InlineRef &a = (*refs)[i - 1], &b = (*refs)[i];
    EXPECT_TRUE(a.type < b.type || (a.type == b.type && a.SortValue() >= b.SortValue())) << i;
  }
  EXPECT_EQ((*refs)[3].offset, uint64_t{1} << 30);
  EXPECT_EQ((*refs)[3].count, 2u);
  auto found = FindInlineRef(*refs, DataRef(256, 300, 0, 0));
  ASSERT_TRUE(found);
  EXPECT_EQ(found->count, 3u);
  SetInlineCount(item, *found, 9);
  EraseInlineRef(item, (*refs)[4]);  // the last: shared 65536
  refs = ParseInlineRefs(item, sizeof(ExtentItem), Key{1, kExtentItemKey, 4096});
  ASSERT_TRUE(refs.ok());
  ASSERT_EQ(refs->size(), 4u);
  EXPECT_EQ(FindInlineRef(*refs, DataRef(256, 300, 0, 0))->count, 9u);
  EXPECT_FALSE(FindInlineRef(*refs, Shared(kSharedDataRefKey, 65536)));
}

TEST(ExtentRefs, TreeBlockRefsAndBadInput) {
  auto item = EmptyExtentItem(1, kExtentFlagTreeBlock | kBlockFlagFullBackref);
  Insert(item, Shared(kSharedBlockRefKey, 30 << 20));
  Insert(item, Shared(kTreeBlockRefKey, 5));
  auto refs = ParseInlineRefs(item, sizeof(ExtentItem), Key{1, kMetadataItemKey, 0});
  ASSERT_TRUE(refs.ok());
  ASSERT_EQ(refs->size(), 2u);
  EXPECT_EQ((*refs)[0].type, kTreeBlockRefKey);
  EXPECT_EQ(item.size(), sizeof(ExtentItem) + 2 * sizeof(ExtentInlineRef));
  item.push_back(kSharedDataRefKey);  // truncated
  EXPECT_EQ(ParseInlineRefs(item, sizeof(ExtentItem), Key{1, kMetadataItemKey, 0}).status().code(), EUCLEAN);
  item.back() = 99;  // unknown type
  EXPECT_FALSE(ParseInlineRefs(item, sizeof(ExtentItem), Key{1, kMetadataItemKey, 0}).ok());
}

// The kernel's hash_extent_data_ref: crc32c(~0, le64 root) in the high
// half (shifted by 31), crc32c of objectid then offset in the low.
TEST(ExtentRefs, DataRefHashMixesBothHalves) {
  const uint64_t h = ExtentDataRefHash(5, 257, 0);
  EXPECT_NE(h, ExtentDataRefHash(5, 257, 4096));
  EXPECT_NE(h, ExtentDataRefHash(256, 257, 0));
  EXPECT_EQ(h, ExtentDataRefHash(5, 257, 0));
  EXPECT_EQ(ExtentDataRefHash(5, 257, 0) >> 63, 0u);  // at most 63 bits
  // Keys of EXTENT_DATA_REF items a 6.18 kernel wrote (dump-tree).
  EXPECT_EQ(ExtentDataRefHash(5, 314, 0), 1007496931468551167ull);
  EXPECT_EQ(ExtentDataRefHash(5, 297, 0), 1007496931555208115ull);
  EXPECT_EQ(ExtentDataRefHash(5, 313, 0), 1007496931787850508ull);
}

// Simple quotas: the owner ref the kernel writes first in a data extent's
// item stays first (the kernel and btrfs check read only that slot), and
// backrefs come and go around it.
TEST(ExtentRefs, TheSimpleQuotaOwnerRefStaysFirst) {
  auto item = EmptyExtentItem(2, kExtentFlagData);
  Insert(item, Shared(kExtentOwnerRefKey, 256));
  ASSERT_EQ(item.size(), sizeof(ExtentItem) + sizeof(ExtentInlineRef));
  Insert(item, Shared(kSharedDataRefKey, 65536));
  Insert(item, DataRef(257, 260, 0, 1));
  auto refs = ParseInlineRefs(item, sizeof(ExtentItem), Key{1, kExtentItemKey, 4096});
  ASSERT_TRUE(refs.ok()) << refs.status().ToString();
  ASSERT_EQ(refs->size(), 3u);
  EXPECT_EQ((*refs)[0].type, kExtentOwnerRefKey);
  EXPECT_EQ((*refs)[0].offset, 256u);
  EraseInlineRef(item, (*refs)[1]);
  refs = ParseInlineRefs(item, sizeof(ExtentItem), Key{1, kExtentItemKey, 4096});
  ASSERT_TRUE(refs.ok());
  ASSERT_EQ(refs->size(), 2u);
  EXPECT_EQ((*refs)[0].type, kExtentOwnerRefKey);
  EXPECT_FALSE(FindInlineRef(*refs, Shared(kSharedDataRefKey, 256)).has_value()) << "the owner is no backref";
}

}  // namespace
}  // namespace ubtrfs::txn
