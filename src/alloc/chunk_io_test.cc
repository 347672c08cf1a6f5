#include "alloc/chunk_io.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "format/checksum.h"
#include "format/ondisk.h"

namespace ubtrfs::alloc {
namespace UBTRFS_UNITY_ID {

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

// Random writes (single ranges and batches, any byte alignment) into a
// RAID5/6 chunk: every mirror reads the model back and every row's P and Q
// agree with its data.
void WriteRandomly(ChunkIo& io, std::vector<uint8_t>& model, uint32_t seed, int rounds) {
  std::mt19937 rng(seed);
  for (int i = 0; i < rounds; ++i) {
    const uint64_t len = 1 + rng() % (3 * kSl);
    const uint64_t at = rng() % (model.size() - len);
    std::vector<uint8_t> bytes(len);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    if (i % 3 == 0) {
      // A batch: this range and a second one that does not overlap it.
      const uint64_t at2 = (at + len + rng() % kSl) % (model.size() - 4096);
      if (at2 >= at && at2 < at + len + 4096) continue;
      std::vector<uint8_t> b2(4096, static_cast<uint8_t>(i));
      const ChunkIo::Range ranges[] = {{at, bytes}, {at2, b2}};
      ASSERT_TRUE(io.WriteBatch(ranges).ok());
      std::copy(b2.begin(), b2.end(), model.begin() + at2);
    } else {
      ASSERT_TRUE(io.Write(at, bytes).ok());
    }
    std::copy(bytes.begin(), bytes.end(), model.begin() + at);
  }
}

void ExpectWhole(ChunkIo& io, const ChunkMap& map, const std::vector<uint8_t>& model, bool check_rows = true) {
  std::vector<uint8_t> out(model.size());
  for (int m = 0; m < io.NumMirrors(0); ++m) {
    SCOPED_TRACE("mirror " + std::to_string(m));
    std::fill(out.begin(), out.end(), 0);
    ASSERT_TRUE(io.Read(0, out, m).ok());
    EXPECT_TRUE(out == model);
    if (!check_rows) return;  // degraded: mirror 0 is the one way
  }
  if (!check_rows) return;
  const ChunkInfo* c = map.Find(0);
  for (uint64_t row = 0; row < c->length / (c->stripe_len * c->data_stripes()); ++row) {
    auto rp = io.CheckRowParity(*c, row, false);
    ASSERT_TRUE(rp.ok());
    EXPECT_FALSE(rp->p_bad || rp->q_bad) << "row " << row;
  }
}

TEST(ChunkIo, ParityWritesKeepEveryRowWhole) {
  for (auto [profile, n] : {std::pair{kBlockGroupRaid5, 3u}, std::pair{kBlockGroupRaid5, 4u},
                            std::pair{kBlockGroupRaid6, 4u}, std::pair{kBlockGroupRaid6, 5u}}) {
    SCOPED_TRACE(ProfileName(profile) + " over " + std::to_string(n));
    ParityArray a(profile, n, 6);
    std::vector<uint8_t> model = a.logical;
    WriteRandomly(*a.chunk_io, model, n, 60);
    ExpectWhole(*a.chunk_io, *a.map, model);
  }
}

// Written with devices missing (as many as the parity covers): the data on
// the missing devices lives in the parity, and reads rebuild it.
TEST(ChunkIo, DegradedParityWritesReadBack) {
  for (auto [profile, n, gone] : {std::tuple{kBlockGroupRaid5, 3u, std::vector<uint64_t>{2}},
                                  std::tuple{kBlockGroupRaid6, 4u, std::vector<uint64_t>{1}},
                                  std::tuple{kBlockGroupRaid6, 5u, std::vector<uint64_t>{2, 5}}}) {
    SCOPED_TRACE(ProfileName(profile) + " over " + std::to_string(n) + ", " + std::to_string(gone.size()) + " gone");
    ParityArray a(profile, n, 6);
    auto all = a.devs.Release();
    io::DeviceSet degraded;
    for (auto& [id, d] : all) {
      if (std::find(gone.begin(), gone.end(), id) == gone.end()) degraded.Add(id, std::move(d));
    }
    ChunkIo io(a.map.get(), &degraded);
    std::vector<uint8_t> model = a.logical;
    WriteRandomly(io, model, 11, 40);
    ExpectWhole(io, *a.map, model, false);
  }
  // One more missing device than the parity covers: refused, nothing written.
  ParityArray b(kBlockGroupRaid5, 3, 2);
  auto all = b.devs.Release();
  io::DeviceSet one;
  one.Add(1, std::move(all[0].second));
  ChunkIo io(b.map.get(), &one);
  std::vector<uint8_t> buf(4096, 1);
  EXPECT_EQ(io.Write(0, buf).code(), EIO);
}

// Reads that take a while, so that two read-modify-writes of one row
// overlap unless something keeps them apart.
class SlowReads final : public io::BlockDevice {
 public:
  explicit SlowReads(std::unique_ptr<io::BlockDevice> d) : d_(std::move(d)) {}
  Status ReadAt(uint64_t off, std::span<uint8_t> buf) override {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    return d_->ReadAt(off, buf);
  }
  Status WriteAt(uint64_t off, std::span<const uint8_t> buf) override { return d_->WriteAt(off, buf); }
  Status Flush() override { return d_->Flush(); }
  uint64_t Size() const override { return d_->Size(); }
  std::string Name() const override { return d_->Name(); }

 private:
  std::unique_ptr<io::BlockDevice> d_;
};

// Two threads writing the same columns of the same rows at the same time
// (one the blocks of the row's first data element, the other those of its
// second, in step): the later read-modify-write of each column must see the
// other's data, or that column's P and Q go stale.
TEST(ChunkIo, ConcurrentWritersOfOneRowKeepItsParity) {
  constexpr uint32_t kRows = 8;
  ParityArray arr(kBlockGroupRaid6, 4, kRows);  // 2 data elements a row
  io::DeviceSet slow;
  for (auto& [id, d] : arr.devs.Release()) slow.Add(id, std::make_unique<SlowReads>(std::move(d)));
  ChunkIo slow_io(arr.map.get(), &slow);
  std::vector<uint8_t> model = arr.logical;
  constexpr uint64_t kBlock = 4096;
  const uint64_t per_elem = kSl / kBlock;
  std::atomic<int> failures{0}, ready{0};
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> buf(kBlock);
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      for (uint64_t r = 0; r < kRows; ++r) {
        for (uint64_t c = 0; c < per_elem; ++c) {
          const uint64_t at = (r * 2 + t) * kSl + c * kBlock;
          std::fill(buf.begin(), buf.end(), static_cast<uint8_t>(at / kBlock * 7 + 1));
          if (!slow_io.Write(at, buf).ok()) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (uint64_t b = 0; b < model.size() / kBlock; ++b) {
    std::fill_n(model.begin() + b * kBlock, kBlock, static_cast<uint8_t>(b * 7 + 1));
  }
  ExpectWhole(slow_io, *arr.map, model);
}

// Checksums of every 4 KiB sector of a model, as the csum tree would hold
// them, handed to a ChunkIo the way the volume hands its own.
struct ModelSums {
  explicit ModelSums(const std::vector<uint8_t>& model) : model(model) {}
  void Install(ChunkIo& io) {
    ChunkIo::DataSums d;
    d.sectorsize = 4096;
    d.sum_size = 4;
    d.lookup = [this](uint64_t logical, size_t n, std::vector<uint8_t>* sums, std::vector<bool>* present) {
      sums->assign(n * 4, 0);
      present->assign(n, true);
      ++lookups;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t v = Crc32c(0, std::span(model).subspan(logical + i * 4096, 4096));
        std::memcpy(sums->data() + i * 4, &v, 4);
      }
      return Status::Ok();
    };
    d.matches = [](std::span<const uint8_t> sector, const uint8_t* sum) {
      const uint32_t v = Crc32c(0, sector);
      return std::memcmp(&v, sum, 4) == 0;
    };
    io.SetDataSums(std::move(d));
  }
  const std::vector<uint8_t>& model;
  int lookups = 0;
};

// A sector of a row damaged in place (no error on read, only its checksum
// tells), then a small write into the same columns of another element of
// that row: the read-modify-write must rebuild the damaged sector from the
// old parity before it computes the new one. Without the check, the new
// parity holds the damage and the sector can never be rebuilt.
TEST(ChunkIo, ReadModifyWriteRebuildsADamagedSectorFirst) {
  constexpr uint64_t kSector = 4096, kCol = 3 * kSector;
  for (auto [profile, n] : {std::pair{kBlockGroupRaid5, 3u}, std::pair{kBlockGroupRaid6, 4u}}) {
    for (bool checked : {true, false}) {
      SCOPED_TRACE(ProfileName(profile) + (checked ? ", checked" : ", not checked"));
      ParityArray a(profile, n, 2);
      std::vector<uint8_t> model = a.logical;
      ModelSums sums(model);
      if (checked) sums.Install(*a.chunk_io);
      // Row 0, data element 1 lies on stripe (1 + 0) % n, device 2.
      a.Smash(2, kMiB + kCol, kSector);
      std::vector<uint8_t> block(kSector, 0xc3);
      ASSERT_TRUE(a.chunk_io->Write(kCol, block).ok());  // element 0, the same column
      std::copy(block.begin(), block.end(), model.begin() + kCol);
      const uint64_t damaged = kSl + kCol;  // logical: element 1 of row 0
      std::vector<uint8_t> rebuilt(kSector);
      ASSERT_TRUE(a.chunk_io->Read(damaged, rebuilt, 1).ok());
      const bool rebuilds = std::equal(rebuilt.begin(), rebuilt.end(), model.begin() + damaged);
      if (!checked) {
        EXPECT_FALSE(rebuilds) << "without the check the new parity holds the damage (or the test damages nothing)";
        continue;
      }
      EXPECT_TRUE(rebuilds);
      EXPECT_GT(sums.lookups, 0);
      EXPECT_EQ(a.chunk_io->rmw_sectors_repaired(), 1u);
      EXPECT_EQ(a.chunk_io->rmw_sectors_unrepaired(), 0u);
      ExpectWhole(*a.chunk_io, *a.map, model);  // the damaged sector was written back too
    }
  }
  // Two damaged sectors in one column of RAID5: nothing rebuilds either;
  // the write goes on and says so in the count.
  ParityArray b(kBlockGroupRaid5, 4, 1);
  std::vector<uint8_t> model = b.logical;
  ModelSums sums(model);
  sums.Install(*b.chunk_io);
  b.Smash(2, kMiB + kCol, kSector);
  b.Smash(3, kMiB + kCol, kSector);
  std::vector<uint8_t> block(kSector, 0x3c);
  ASSERT_TRUE(b.chunk_io->Write(kCol, block).ok());
  EXPECT_EQ(b.chunk_io->rmw_sectors_repaired(), 0u);
  EXPECT_EQ(b.chunk_io->rmw_sectors_unrepaired(), 2u);
}

}  // namespace
}  // namespace ubtrfs::alloc
