#include "tree/tree_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <atomic>
#include <thread>
#include <vector>

#include "format/checksum.h"
#include "tree/writer.h"

namespace ubtrfs::tree {
namespace UBTRFS_UNITY_ID {

using namespace ubtrfs::format;

constexpr uint32_t kNodesize = 4096;
constexpr uint64_t kBytenr = 30 * 4096;

TreeParams Params() {
  TreeParams p;
  p.nodesize = kNodesize;
  p.csum_type = 0;
  std::memset(p.fsid, 0xab, sizeof p.fsid);
  return p;
}

void Seal(std::vector<uint8_t>& b) {
  CsumBytes c = ComputeCsum(0, std::span<const uint8_t>(b).subspan(kCsumSize));
  std::memcpy(b.data(), c.data(), kCsumSize);
}

// A leaf with items (k, 0), k = 1..n, each carrying `size` bytes.
std::vector<uint8_t> Leaf(int n, uint32_t size) {
  std::vector<uint8_t> b(kNodesize);
  auto* h = reinterpret_cast<Header*>(b.data());
  std::memset(h->fsid, 0xab, kFsidSize);
  h->bytenr = kBytenr;
  h->generation = 7;
  h->owner = kFsTreeObjectid;
  h->nritems = static_cast<uint32_t>(n);
  h->level = 0;
  uint32_t end = kNodesize - sizeof(Header);
  for (int i = 0; i < n; ++i) {
    auto* it = reinterpret_cast<Item*>(b.data() + sizeof(Header)) + i;
    Key{static_cast<uint64_t>(i + 1), kInodeItemKey, 0}.To(&it->key);
    end -= size;
    it->offset = end;
    it->size = size;
    std::memset(b.data() + sizeof(Header) + end, i, size);
  }
  Seal(b);
  return b;
}

Item* ItemAt(std::vector<uint8_t>& b, int i) { return reinterpret_cast<Item*>(b.data() + sizeof(Header)) + i; }

std::string Verify(const std::vector<uint8_t>& b, BlockCheck check = {kBytenr, -1, 0, {}}) {
  Status st = VerifyTreeBlock(b, Params(), check);
  return st.ok() ? "ok" : st.message();
}

TEST(TreeBlock, AcceptsAWellFormedLeafAndReadsIt) {
  auto r = TreeBlock::Parse(BlockBuffer::CopyOf(Leaf(10, 16)), Params(), BlockCheck{kBytenr, 0, 7, Key{1, kInodeItemKey, 0}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const TreeBlock& b = **r;
  EXPECT_EQ(b.nritems(), 10);
  EXPECT_EQ(b.key(3), (Key{4, kInodeItemKey, 0}));
  EXPECT_EQ(b.item_data(3).size(), 16u);
  EXPECT_EQ(b.item_data(3)[0], 3);
  EXPECT_EQ(b.FirstSlotAtOrAfter(Key{4, 0, 0}), 3);
  EXPECT_EQ(b.FirstSlotAtOrAfter(Key{11, 0, 0}), 10);
  EXPECT_EQ(b.LastSlotAtOrBefore(Key{4, 0, 0}), 2);
  EXPECT_EQ(b.LastSlotAtOrBefore(Key{0, 0, 0}), -1);
}

TEST(TreeBlock, NamesEachKindOfDamage) {
  auto b = Leaf(10, 16);
  b[200] ^= 1;
  EXPECT_EQ(Verify(b), "tree block 122880: checksum mismatch (crc32c)");

  b = Leaf(10, 16);
  reinterpret_cast<Header*>(b.data())->bytenr = kBytenr + 4096;
  Seal(b);
  EXPECT_NE(Verify(b).find("header bytenr is 126976"), std::string::npos);

  b = Leaf(10, 16);
  reinterpret_cast<Header*>(b.data())->fsid[0] = 0;
  Seal(b);
  EXPECT_NE(Verify(b).find("fsid"), std::string::npos);

  b = Leaf(10, 16);
  EXPECT_NE(Verify(b, BlockCheck{kBytenr, 1, 0, {}}).find("level 0, expected 1"), std::string::npos);
  EXPECT_NE(Verify(b, BlockCheck{kBytenr, 0, 8, {}}).find("generation 7, expected 8"), std::string::npos);
  EXPECT_NE(Verify(b, BlockCheck{kBytenr, 0, 7, Key{2, kInodeItemKey, 0}}).find("first key"), std::string::npos);

  b = Leaf(10, 16);
  reinterpret_cast<Header*>(b.data())->nritems = 1000;
  Seal(b);
  EXPECT_NE(Verify(b).find("do not fit"), std::string::npos);

  b = Leaf(10, 16);
  ItemAt(b, 4)->offset = ItemAt(b, 4)->offset.get() + 1;
  Seal(b);
  EXPECT_NE(Verify(b).find("item 4 data"), std::string::npos);

  b = Leaf(10, 16);
  ItemAt(b, 0)->size = 100000;
  Seal(b);
  EXPECT_NE(Verify(b).find("item 0 data"), std::string::npos);

  b = Leaf(10, 16);
  Key{1, kInodeItemKey, 0}.To(&ItemAt(b, 5)->key);
  Seal(b);
  EXPECT_NE(Verify(b).find("is not above"), std::string::npos);

  b = Leaf(10, 16);
  reinterpret_cast<Header*>(b.data())->level = 9;
  Seal(b);
  EXPECT_NE(Verify(b).find("too high"), std::string::npos);
}

TEST(TreeBlock, ItemDataMayNotOverlapItemHeaders) {
  // 150 items of 4 bytes each: headers need 3750 bytes, data 600 -> overlap.
  auto b = Leaf(150, 4);
  EXPECT_NE(Verify(b).find("overlaps the item headers"), std::string::npos) << Verify(b);
}

TEST(TreeBlock, RejectsEmptyNodesAndUnalignedPointers) {
  std::vector<uint8_t> b(kNodesize);
  auto* h = reinterpret_cast<Header*>(b.data());
  std::memset(h->fsid, 0xab, kFsidSize);
  h->bytenr = kBytenr;
  h->level = 1;
  h->nritems = 0;
  Seal(b);
  EXPECT_NE(Verify(b).find("empty node"), std::string::npos);
  h->nritems = 1;
  auto* p = reinterpret_cast<KeyPtr*>(b.data() + sizeof(Header));
  p->blockptr = 12345;
  Seal(b);
  EXPECT_NE(Verify(b).find("unaligned block 12345"), std::string::npos);
  p->blockptr = 8192;
  Seal(b);
  EXPECT_EQ(Verify(b), "ok");
}

// Slabs serve threads other than the main one: the tests that expect them
// run on a thread of their own. The counts are the whole process's: the
// blocks earlier tests' tree writes left in this thread's scratch go first.
void OnAThread(const std::function<void()>& f) {
  DropThreadScratch();
  std::thread(f).join();
}

// Released block buffers feed new blocks (zeroed, so nothing of an old block
// leaks into a new one), the pool keeps no more than its cap (which commits
// move), and odd sizes are not pooled.
TEST(BlockBuffers, ReleasedBlocksFeedNewOnesZeroedUpToTheCap) {
  OnAThread([] {
    TrimBlockBuffers();
    EXPECT_EQ(PooledBlockBuffers(), 0u);
    {
      auto b = TreeBlock::NewBlank(16384);
      std::memset(b->mutable_bytes(), 0xab, 16384);
    }
    EXPECT_EQ(PooledBlockBuffers(), 1u);
    auto fresh = TreeBlock::NewBlank(16384);
    EXPECT_EQ(PooledBlockBuffers(), 0u);
    for (uint8_t byte : fresh->bytes()) ASSERT_EQ(byte, 0);
    std::memset(fresh->mutable_bytes(), 0x5c, 16384);
    auto copy = fresh->Clone();
    EXPECT_TRUE(std::equal(copy->bytes().begin(), copy->bytes().end(), fresh->bytes().begin()));
    fresh.reset();
    copy.reset();
    EXPECT_EQ(PooledBlockBuffers(), 2u);
  
    // Past the heap's share, buffers come from slabs, which can only go back
    // whole: released, the pool keeps at most its cap, and less than the cap
    // by at most the slots of one slab.
    const size_t cap = kBufferPoolBytes / 16384;
    const size_t per_slab = kSlabBytes / 16384;
    std::vector<std::shared_ptr<TreeBlock>> many;
    for (size_t i = 0; i < cap + 10; ++i) many.push_back(TreeBlock::NewBlank(16384));
    EXPECT_EQ(PooledBlockBuffers(), 0u);
    EXPECT_GT(GetBlockBufferStats().slab_bytes, 0u);
    EXPECT_LE(GetBlockBufferStats().heap_bytes, kHeapBufferBytes);
    many.clear();
    EXPECT_LE(PooledBlockBuffers(), cap);
    EXPECT_GE(PooledBlockBuffers(), cap - per_slab);
    { auto odd = TreeBlock::NewBlank(5000); }
    EXPECT_LE(PooledBlockBuffers(), cap);
  
    // A commit that wrote more raises the cap for the next transaction; a
    // smaller one lowers it and frees what is above it; both stay clamped.
    ExpectBlockBuffers(kBufferPoolBytes + 300 * 16384);
    EXPECT_EQ(BlockBufferPoolCap(), kBufferPoolBytes + 300 * 16384);
    for (size_t i = 0; i < cap + 310; ++i) many.push_back(TreeBlock::NewBlank(16384));
    many.clear();
    EXPECT_LE(PooledBlockBuffers(), cap + 300);
    EXPECT_GE(PooledBlockBuffers(), cap + 300 - per_slab);
    EXPECT_GT(PooledBlockBuffers(), cap);
    ExpectBlockBuffers(0);
    EXPECT_EQ(BlockBufferPoolCap(), kBufferPoolBytes);
    EXPECT_LE(PooledBlockBuffers(), cap);
    ExpectBlockBuffers(size_t{1} << 40);
    EXPECT_EQ(BlockBufferPoolCap(), kBufferPoolMaxBytes);
    TrimBlockBuffers();
    EXPECT_EQ(BlockBufferPoolCap(), kBufferPoolBytes);
    { auto odd = TreeBlock::NewBlank(5000); }
    EXPECT_EQ(PooledBlockBuffers(), 0u);
    EXPECT_EQ(GetBlockBufferStats().slab_bytes, 0u);
    EXPECT_EQ(GetBlockBufferStats().heap_bytes, 0u);
  });
}

// Slab buffers are distinct, of the size asked, and a slab goes back to the
// system only when none of its buffers is in use: Trim keeps a slab a live
// block is in, and the block's bytes stay intact.
TEST(BlockBuffers, SlabsGoBackWholeAndOnlyWhenUnused) {
  OnAThread([] {
    TrimBlockBuffers();
    const size_t heap_share = kHeapBufferBytes / 4096;
    std::vector<BlockBuffer> held;
    for (size_t i = 0; i < heap_share; ++i) held.push_back(BlockBuffer::Take(4096));
    EXPECT_EQ(GetBlockBufferStats().slab_bytes, 0u);
    std::vector<BlockBuffer> slabbed;
    const size_t per_slab = kSlabBytes / 4096;
    for (size_t i = 0; i < per_slab + 1; ++i) {
      slabbed.push_back(BlockBuffer::Take(4096));
      ASSERT_EQ(slabbed.back().size(), 4096u);
      std::memset(slabbed.back().data(), static_cast<int>(i & 0xff), 4096);
    }
    EXPECT_EQ(GetBlockBufferStats().slab_bytes, 2 * kSlabBytes);
    std::vector<const uint8_t*> starts;
    for (const auto& b : slabbed) starts.push_back(b.data());
    std::sort(starts.begin(), starts.end());
    for (size_t i = 1; i < starts.size(); ++i) ASSERT_GE(starts[i] - starts[i - 1], 4096);
  
    BlockBuffer keep = std::move(slabbed[3]);
    held.clear();
    slabbed.clear();
    TrimBlockBuffers();
    EXPECT_EQ(GetBlockBufferStats().slab_bytes, kSlabBytes);
    for (size_t i = 0; i < keep.size(); ++i) ASSERT_EQ(keep.data()[i], 3);
    BlockBuffer moved;
    moved = std::move(keep);
    EXPECT_EQ(keep.data(), nullptr);
    EXPECT_EQ(moved.size(), 4096u);
    moved = BlockBuffer();
    TrimBlockBuffers();
    EXPECT_EQ(GetBlockBufferStats().slab_bytes, 0u);
    EXPECT_EQ(PooledBlockBuffers(), 0u);
  });
}

// Buffers come from the fullest slab with room, so that a slab with few
// buffers in use drains instead of being refilled.
TEST(BlockBuffers, TheFullestSlabWithRoomServesFirst) {
  OnAThread([] {
    TrimBlockBuffers();
    std::vector<BlockBuffer> heap;
    for (size_t i = 0; i < kHeapBufferBytes / 8192; ++i) heap.push_back(BlockBuffer::Take(8192));
    const size_t per_slab = kSlabBytes / 8192;
    // Slabs are aligned to their size.
    auto slab_of = [](const BlockBuffer& x) { return reinterpret_cast<uintptr_t>(x.data()) & ~(kSlabBytes - 1); };
    std::vector<BlockBuffer> a, b;
    for (size_t i = 0; i < per_slab; ++i) a.push_back(BlockBuffer::Take(8192));
    for (size_t i = 0; i < per_slab; ++i) b.push_back(BlockBuffer::Take(8192));
    ASSERT_EQ(GetBlockBufferStats().slab_bytes, 2 * kSlabBytes);
    const uintptr_t sparse = slab_of(a[0]), full = slab_of(b[0]);
    ASSERT_NE(sparse, full);
    for (const auto& x : a) ASSERT_EQ(slab_of(x), sparse);
    // All but ten of b in use, then one of a: a had room last.
    b.erase(b.begin(), b.begin() + 10);
    a.resize(1);
    std::vector<BlockBuffer> next;
    for (int i = 0; i < 10; ++i) {
      next.push_back(BlockBuffer::Take(8192));
      EXPECT_EQ(slab_of(next.back()), full) << i;
    }
    // b is full again: the next one comes from a, the only slab with room.
    next.push_back(BlockBuffer::Take(8192));
    EXPECT_EQ(slab_of(next.back()), sparse);
    EXPECT_EQ(GetBlockBufferStats().slab_bytes, 2 * kSlabBytes);
    heap.clear();
    a.clear();
    b.clear();
    next.clear();
    TrimBlockBuffers();
    EXPECT_EQ(GetBlockBufferStats().slab_bytes, 0u);
  });
}

// The main thread's buffers stay on the heap past the heap's share: its
// arena is the one glibc's huge-page tunable reaches, and a bulk import on
// it reuses for blocks what the rest of it freed.
TEST(BlockBuffers, TheMainThreadKeepsTheHeap) {
  DropThreadScratch();
  TrimBlockBuffers();
  std::vector<BlockBuffer> held;
  for (size_t i = 0; i < kHeapBufferBytes / 16384 + 200; ++i) held.push_back(BlockBuffer::Take(16384));
  EXPECT_EQ(GetBlockBufferStats().slab_bytes, 0u);
  EXPECT_GT(GetBlockBufferStats().heap_bytes, kHeapBufferBytes);
  OnAThread([] {
    BlockBuffer b = BlockBuffer::Take(16384);
    EXPECT_EQ(GetBlockBufferStats().slab_bytes, kSlabBytes);
  });
  held.clear();
  TrimBlockBuffers();
  EXPECT_EQ(GetBlockBufferStats().slab_bytes, 0u);
  EXPECT_EQ(GetBlockBufferStats().heap_bytes, 0u);
}

// Threads take and release buffers of several sizes at once (for TSan);
// no buffer is handed to two holders: each keeps its own pattern.
TEST(BlockBuffers, ThreadsTakeAndReleaseAtOnce) {
  TrimBlockBuffers();
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &bad] {
      std::vector<BlockBuffer> held;
      for (int round = 0; round < 3000; ++round) {
        const size_t n = size_t{4096} << ((round + t) % 3);
        held.push_back(BlockBuffer::Take(n));
        std::memset(held.back().data(), t + 1, n);
        if (held.size() > 200) {
          for (size_t i = 0; i < 100; ++i) {
            const BlockBuffer& b = held[i];
            if (std::any_of(b.data(), b.data() + b.size(), [t](uint8_t x) { return x != t + 1; })) ++bad;
          }
          held.erase(held.begin(), held.begin() + 100);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(GetBlockBufferStats().slab_bytes, 0u);
  TrimBlockBuffers();
  EXPECT_EQ(GetBlockBufferStats().slab_bytes, 0u);
  EXPECT_EQ(GetBlockBufferStats().heap_bytes, 0u);
}

}  // namespace
}  // namespace ubtrfs::tree
