#include "alloc/chunk_io.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "format/ondisk.h"

namespace ubtrfs::alloc {
namespace {

using namespace ubtrfs::format;

constexpr uint64_t kKiB = 1024, kMiB = 1 << 20;
constexpr uint64_t kSl = 64 * kKiB;

std::vector<uint8_t> ChunkItem(uint64_t length, uint64_t type, uint32_t nstripes) {
  std::vector<uint8_t> buf(sizeof(Chunk) + nstripes * sizeof(Stripe));
  auto* c = reinterpret_cast<Chunk*>(buf.data());
  c->length = length;
  c->stripe_len = kSl;
  c->type = type;
  c->sector_size = 4096;
  c->num_stripes = static_cast<uint16_t>(nstripes);
  c->sub_stripes = 1;
  auto* s = reinterpret_cast<Stripe*>(buf.data() + sizeof(Chunk));
  for (uint32_t i = 0; i < nstripes; ++i) {
    s[i].devid = i + 1;
    s[i].offset = kMiB;
  }
  return buf;
}

// A RAID5 or RAID6 chunk over `n` memory devices filled with the layout the
// kernel writes: row r's data i on stripe (i + r) % n, then P, then Q.
struct ParityArray {
  ParityArray(uint64_t profile, uint32_t n, uint32_t rows) : n(n) {
    const uint32_t parity = profile == kBlockGroupRaid6 ? 2 : 1;
    k = n - parity;
    logical.resize(uint64_t{rows} * k * kSl);
    std::mt19937 rng(7);
    for (auto& b : logical) b = static_cast<uint8_t>(rng());
    std::vector<std::vector<uint8_t>> disks(n, std::vector<uint8_t>(kMiB + rows * kSl, 0));
    for (uint32_t r = 0; r < rows; ++r) {
      std::vector<std::span<const uint8_t>> data;
      for (uint32_t i = 0; i < k; ++i) {
        data.emplace_back(logical.data() + (uint64_t{r} * k + i) * kSl, kSl);
        std::copy(data.back().begin(), data.back().end(), disks[(i + r) % n].begin() + kMiB + r * kSl);
      }
      std::vector<uint8_t> p(kSl), q(parity == 2 ? kSl : 0);
      ComputeParity(data, p, q);
      std::copy(p.begin(), p.end(), disks[(k + r) % n].begin() + kMiB + r * kSl);
      if (parity == 2) std::copy(q.begin(), q.end(), disks[(k + 1 + r) % n].begin() + kMiB + r * kSl);
    }
    std::map<uint64_t, uint64_t> sizes;
    for (uint32_t i = 0; i < n; ++i) {
      devs.Add(i + 1, io::NewMemoryDevice("d" + std::to_string(i + 1), disks[i]));
      sizes[i + 1] = disks[i].size();
    }
    map = std::make_unique<ChunkMap>(sizes);
    EXPECT_TRUE(map->AddChunk(0, ChunkItem(logical.size(), kBlockGroupData | profile, n), 4096).ok());
    chunk_io = std::make_unique<ChunkIo>(map.get(), &devs);
  }
  void Smash(uint32_t devid, uint64_t phys, size_t len) {
    std::vector<uint8_t> junk(len, 0x5a);
    ASSERT_TRUE(devs.WriteAt(devid, phys, junk).ok());
  }
  uint32_t n, k;
  std::vector<uint8_t> logical;
  io::DeviceSet devs;
  std::unique_ptr<ChunkMap> map;
  std::unique_ptr<ChunkIo> chunk_io;
};

TEST(Gf256, MatchesTheKernelsField) {
  EXPECT_EQ(GfPow2(8), 0x1d);  // x^8 = x^4 + x^3 + x^2 + 1
  for (int a = 1; a < 256; ++a) EXPECT_EQ(GfMul(static_cast<uint8_t>(a), GfInv(static_cast<uint8_t>(a))), 1);
}

TEST(ChunkIo, Raid5ReadsDirectAndRebuildsAMissingDevice) {
  ParityArray a(kBlockGroupRaid5, 3, 6);
  std::vector<uint8_t> out(a.logical.size());
  ASSERT_TRUE(a.chunk_io->Read(0, out, 0).ok());
  EXPECT_EQ(out, a.logical);
  std::fill(out.begin(), out.end(), 0);
  ASSERT_TRUE(a.chunk_io->Read(0, out, 1).ok());  // every piece from P
  EXPECT_EQ(out, a.logical);
  // Device 2 gone: mirror 0 rebuilds what it held.
  ParityArray b(kBlockGroupRaid5, 3, 6);
  auto all = b.devs.Release();
  io::DeviceSet degraded;
  for (auto& [id, d] : all) {
    if (id != 2) degraded.Add(id, std::move(d));
  }
  ChunkIo io(b.map.get(), &degraded);
  std::fill(out.begin(), out.end(), 0);
  ASSERT_TRUE(io.Read(0, out, 0).ok());
  EXPECT_EQ(out, b.logical);
  // A range inside one element, unaligned to the element.
  std::vector<uint8_t> part(8192);
  ASSERT_TRUE(io.Read(kSl + 4096, part, 0).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), b.logical.begin() + kSl + 4096));
}

TEST(ChunkIo, Raid6RebuildsFromQAndFromTwoLostStripes) {
  ParityArray a(kBlockGroupRaid6, 4, 8);
  EXPECT_EQ(a.chunk_io->NumMirrors(0), 4);  // direct, P, Q, P+Q with the other data stripe
  std::vector<uint8_t> out(a.logical.size());
  for (int m = 0; m < a.chunk_io->NumMirrors(0); ++m) {
    SCOPED_TRACE(m);
    std::fill(out.begin(), out.end(), 0);
    ASSERT_TRUE(a.chunk_io->Read(0, out, m).ok());
    EXPECT_EQ(out, a.logical);
  }
  // Row 0: data 0 on device 1 bad and P (device 3) bad: mirror 2 (Q) reads it.
  a.Smash(1, kMiB, 4096);
  a.Smash(3, kMiB, 4096);
  std::vector<uint8_t> blk(4096);
  ASSERT_TRUE(a.chunk_io->Read(0, blk, 2).ok());
  EXPECT_TRUE(std::equal(blk.begin(), blk.end(), a.logical.begin()));
  // Two devices missing: both data stripes of a row rebuilt from P and Q.
  ParityArray b(kBlockGroupRaid6, 4, 8);
  auto all = b.devs.Release();
  io::DeviceSet degraded;
  for (auto& [id, d] : all) {
    if (id == 3 || id == 4) degraded.Add(id, std::move(d));
  }
  ChunkIo io(b.map.get(), &degraded);
  std::fill(out.begin(), out.end(), 0);
  ASSERT_TRUE(io.Read(0, out, 0).ok());
  EXPECT_EQ(out, b.logical);
}

TEST(ChunkIo, FastParityMatchesTheReference) {
  std::mt19937 rng(11);
  for (uint32_t k : {1u, 2u, 3u, 5u}) {
    for (bool raid6 : {false, true}) {
      SCOPED_TRACE(std::to_string(k) + (raid6 ? " raid6" : " raid5"));
      std::unique_ptr<uint8_t, decltype(&std::free)> mem(static_cast<uint8_t*>(std::aligned_alloc(64, (k + 4) * kSl)),
                                                         &std::free);
      std::vector<std::span<const uint8_t>> data;
      for (uint32_t i = 0; i < k; ++i) {
        std::span<uint8_t> d(mem.get() + i * kSl, kSl);
        for (auto& b : d) b = static_cast<uint8_t>(rng());
        data.push_back(d);
      }
      std::span<uint8_t> p(mem.get() + k * kSl, kSl), q(mem.get() + (k + 1) * kSl, raid6 ? kSl : 0);
      std::vector<uint8_t> rp(kSl), rq(raid6 ? kSl : 0);
      FastParity(data, p, q);
      ComputeParity(data, rp, rq);
      EXPECT_TRUE(std::equal(p.begin(), p.end(), rp.begin()));
      EXPECT_TRUE(std::equal(q.begin(), q.end(), rq.begin()));
    }
  }
}

// Scrub's parity pass: a row whose P or Q was damaged is found and, with
// repair, rewritten from the data; the other rows and the data stay.
TEST(ChunkIo, RowParityFindsAndRepairsBadPAndQ) {
  for (uint64_t profile : {kBlockGroupRaid5, kBlockGroupRaid6}) {
    ParityArray a(profile, profile == kBlockGroupRaid6 ? 4 : 3, 6);
    const uint32_t np = profile == kBlockGroupRaid6 ? 2 : 1;
    ASSERT_NE(a.map->Find(0), nullptr);
    const ChunkInfo& c = *a.map->Find(0);
    for (uint64_t r = 0; r < 6; ++r) {
      auto ok = a.chunk_io->CheckRowParity(c, r, false);
      ASSERT_TRUE(ok.ok()) << ok.status().ToString();
      EXPECT_TRUE(ok->complete && !ok->p_bad && !ok->q_bad) << r;
    }
    // Row 2: P lies on device (k + 2) % n + 1, Q on the next.
    const uint64_t row = 2;
    a.Smash((a.k + row) % a.n + 1, kMiB + row * kSl + 8192, 100);
    if (np == 2) a.Smash((a.k + 1 + row) % a.n + 1, kMiB + row * kSl, 4096);
    auto bad = a.chunk_io->CheckRowParity(c, row, false);
    ASSERT_TRUE(bad.ok());
    EXPECT_TRUE(bad->p_bad);
    EXPECT_EQ(bad->q_bad, np == 2);
    auto other = a.chunk_io->CheckRowParity(c, row + 1, false);
    ASSERT_TRUE(other.ok());
    EXPECT_FALSE(other->p_bad || other->q_bad);
    auto fixed = a.chunk_io->CheckRowParity(c, row, true);
    ASSERT_TRUE(fixed.ok());
    EXPECT_TRUE(fixed->p_bad);
    auto again = a.chunk_io->CheckRowParity(c, row, false);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(again->p_bad || again->q_bad);
    // The repaired P rebuilds the data: every element read from parity.
    std::vector<uint8_t> out(a.logical.size());
    ASSERT_TRUE(a.chunk_io->Read(0, out, 1).ok());
    EXPECT_EQ(out, a.logical);
    // A missing device: the row cannot be judged.
    auto all = a.devs.Release();
    io::DeviceSet degraded;
    for (auto& [id, d] : all) {
      if (id != 1) degraded.Add(id, std::move(d));
    }
    ChunkIo io(a.map.get(), &degraded);
    auto partial = io.CheckRowParity(c, row, false);
    ASSERT_TRUE(partial.ok());
    EXPECT_FALSE(partial->complete);
  }
}

TEST(ChunkIo, ParityWritesAreRefused) {
  ParityArray a(kBlockGroupRaid5, 3, 2);
  std::vector<uint8_t> buf(4096, 1);
  EXPECT_EQ(a.chunk_io->Write(0, buf).code(), EOPNOTSUPP);
}

}  // namespace
}  // namespace ubtrfs::alloc
