#include "io/recording_device.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>

namespace ubtrfs::io {
namespace UBTRFS_UNITY_ID {

std::vector<uint8_t> Fill(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }

std::vector<uint8_t> ReadAll(BlockDevice& dev) {
  std::vector<uint8_t> out(dev.Size());
  EXPECT_TRUE(dev.ReadAt(0, out).ok());
  return out;
}

TEST(SparseImageTest, ReadsZerosWhereNothingWasWritten) {
  SparseImage img(1 << 20);
  std::vector<uint8_t> buf(10000, 0xff);
  img.Read(12345, buf);
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](uint8_t b) { return b == 0; }));
  EXPECT_EQ(img.own_pages(), 0u);
}

TEST(SparseImageTest, WritesAcrossPagesAndOverlaysBase) {
  SparseImage base(64 * 1024);
  base.Write(4000, Fill(200, 1));  // straddles pages 0 and 1
  EXPECT_EQ(base.own_pages(), 2u);
  SparseImage over(base.size(), &base);
  over.Write(4090, Fill(4, 2));
  std::vector<uint8_t> buf(220);
  over.Read(3990, buf);
  for (size_t i = 0; i < buf.size(); ++i) {
    const uint64_t off = 3990 + i;
    uint8_t want = off < 4000 || off >= 4200 ? 0 : (off >= 4090 && off < 4094 ? 2 : 1);
    ASSERT_EQ(buf[i], want) << "offset " << off;
  }
  // The base is untouched by the overlay's write.
  base.Read(4090, std::span(buf).first(4));
  EXPECT_EQ(buf[0], 1);
  EXPECT_EQ(over.own_pages(), 1u);
  SparseImage copy = over;
  copy.Write(0, Fill(1, 9));
  over.Read(0, std::span(buf).first(1));
  EXPECT_EQ(buf[0], 0) << "a copy must not share pages with the original";
}

TEST(SparseImageTest, SavesASparseFileWithTheSameBytes) {
  SparseImage base(8 << 20);
  base.Write(1 << 20, Fill(5000, 7));
  SparseImage over(base.size(), &base);
  over.Write((1 << 20) + 100, Fill(10, 8));
  over.Write((8 << 20) - 1, Fill(1, 3));
  char tmpl[] = "/tmp/ubtrfs-sparse-XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_TRUE(over.SaveToFile(tmpl).ok());
  std::ifstream in(tmpl, std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  struct stat st;
  ASSERT_EQ(stat(tmpl, &st), 0);
  unlink(tmpl);
  EXPECT_EQ(file, over.ToBytes());
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 1u << 20) << "the file should be sparse";
}

TEST(RecordingDeviceTest, LogsWritesAndFlushesInOrderAndServesReads) {
  RecordingDevice dev("rec", 1 << 20);
  ASSERT_TRUE(dev.WriteAt(0, Fill(100, 1)).ok());
  ASSERT_TRUE(dev.WriteAt(50, Fill(100, 2)).ok());
  ASSERT_TRUE(dev.Flush().ok());
  ASSERT_TRUE(dev.WriteAt(4096, Fill(512, 3)).ok());
  const auto& log = dev.log();
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log[0].kind, LogEntry::Kind::kWrite);
  EXPECT_EQ(log[1].offset, 50u);
  EXPECT_EQ(log[2].kind, LogEntry::Kind::kFlush);
  EXPECT_EQ(log[3].data.size(), 512u);
  EXPECT_EQ(dev.bytes_logged(), 712u);
  std::vector<uint8_t> buf(3);
  ASSERT_TRUE(dev.ReadAt(49, buf).ok());
  EXPECT_EQ(buf, (std::vector<uint8_t>{1, 2, 2}));
  EXPECT_EQ(dev.ReadAt((1 << 20) - 1, buf).code(), EIO);
  dev.ResetLog();
  EXPECT_TRUE(dev.log().empty());
  EXPECT_EQ(dev.initial().ToBytes(), dev.current().ToBytes());
}

TEST(CrashReplayerTest, PrefixesAndDroppedUnflushedWrites) {
  RecordingDevice dev("rec", 64 * 1024);
  ASSERT_TRUE(dev.WriteAt(0, Fill(4096, 1)).ok());     // 0
  ASSERT_TRUE(dev.Flush().ok());                        // 1
  ASSERT_TRUE(dev.WriteAt(4096, Fill(4096, 2)).ok());  // 2
  ASSERT_TRUE(dev.WriteAt(0, Fill(10, 3)).ok());       // 3
  ASSERT_TRUE(dev.Flush().ok());                        // 4
  ASSERT_TRUE(dev.WriteAt(8192, Fill(10, 4)).ok());    // 5
  CrashReplayer rep(&dev);
  EXPECT_EQ(rep.DurablePrefix(0), 0u);
  EXPECT_EQ(rep.DurablePrefix(1), 0u);
  EXPECT_EQ(rep.DurablePrefix(2), 2u);
  EXPECT_EQ(rep.DurablePrefix(5), 5u);
  EXPECT_EQ(rep.DurablePrefix(6), 5u);

  // Every prefix equals a memory device that got the same writes.
  for (size_t n = 0; n <= dev.log().size(); ++n) {
    auto expect = NewMemoryDevice("m", dev.initial().ToBytes());
    for (size_t i = 0; i < n; ++i) {
      const auto& e = dev.log()[i];
      if (e.kind == LogEntry::Kind::kWrite) {
        ASSERT_TRUE(expect->WriteAt(e.offset, e.data).ok());
      }
    }
    auto img = rep.Materialize(CrashPoint{n, CrashMode::kPrefix, 0});
    ASSERT_TRUE(img.ok()) << img.status().ToString();
    EXPECT_EQ(ReadAll(**img), ReadAll(*expect)) << "prefix " << n;
  }
  // Going back restarts the walk.
  auto early = rep.Materialize(CrashPoint{4, CrashMode::kDropUnflushed, 0});
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(rep.restarts(), 1u);
  auto bytes = ReadAll(**early);
  EXPECT_EQ(bytes[0], 1) << "writes after the last flush are dropped";
  EXPECT_EQ(bytes[4096], 0);
  EXPECT_TRUE((*early)->applied().empty());
  EXPECT_FALSE(rep.Materialize(CrashPoint{7, CrashMode::kPrefix, 0}).ok());
}

TEST(CrashReplayerTest, SubsetsAndTornWritesOnlyTouchUnflushedWrites) {
  RecordingDevice dev("rec", 256 * 1024);
  ASSERT_TRUE(dev.WriteAt(0, Fill(16384, 1)).ok());
  ASSERT_TRUE(dev.Flush().ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(dev.WriteAt(16384 * (i + 1), Fill(16384, static_cast<uint8_t>(10 + i))).ok());
  CrashReplayer rep(&dev);
  bool saw_partial_subset = false, saw_torn_partial = false;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    auto sub = rep.Materialize(CrashPoint{dev.log().size(), CrashMode::kSubset, seed});
    ASSERT_TRUE(sub.ok());
    auto bytes = ReadAll(**sub);
    EXPECT_EQ(bytes[0], 1);
    size_t whole = 0;
    for (int i = 0; i < 6; ++i) {
      auto blk = std::span(bytes).subspan(16384 * (i + 1), 16384);
      const bool all_new = std::all_of(blk.begin(), blk.end(), [&](uint8_t b) { return b == 10 + i; });
      const bool all_old = std::all_of(blk.begin(), blk.end(), [](uint8_t b) { return b == 0; });
      EXPECT_TRUE(all_new || all_old) << "seed " << seed << ": a subset never tears a write";
      whole += all_new;
    }
    EXPECT_EQ(whole, (*sub)->applied().size());
    if (whole > 0 && whole < 6) saw_partial_subset = true;

    auto torn = rep.Materialize(CrashPoint{dev.log().size(), CrashMode::kTorn, seed});
    ASSERT_TRUE(torn.ok());
    const size_t t = (*torn)->torn_entry();
    ASSERT_NE(t, SIZE_MAX);
    const auto& e = dev.log()[t];
    bytes = ReadAll(**torn);
    size_t landed = 0;
    for (uint64_t s = 0; s < e.data.size() / kTornSectorSize; ++s) {
      const uint8_t b = bytes[e.offset + s * kTornSectorSize];
      EXPECT_TRUE(b == e.data[0] || b == 0);
      landed += b == e.data[0];
    }
    EXPECT_EQ(landed, (*torn)->torn_sectors().size());
    if (landed > 0 && landed < 32) saw_torn_partial = true;
  }
  EXPECT_TRUE(saw_partial_subset);
  EXPECT_TRUE(saw_torn_partial);
  EXPECT_EQ(rep.restarts(), 0u) << "points at one prefix reuse the durable image";
}

TEST(CrashReplayerTest, AtomicRangesAreNeverTorn) {
  RecordingDevice dev("rec", 256 * 1024);
  ASSERT_TRUE(dev.Flush().ok());
  ASSERT_TRUE(dev.WriteAt(65536, Fill(4096, 1)).ok());
  ASSERT_TRUE(dev.WriteAt(131072, Fill(4096, 2)).ok());
  CrashReplayer rep(&dev);
  rep.AddAtomicRange(65536, 4096);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto img = rep.Materialize(CrashPoint{3, CrashMode::kTorn, seed});
    ASSERT_TRUE(img.ok());
    EXPECT_EQ((*img)->torn_entry(), 2u) << "only the write outside the atomic range may tear";
  }
  rep.AddAtomicRange(131072, 4096);
  auto img = rep.Materialize(CrashPoint{3, CrashMode::kTorn, 1});
  ASSERT_TRUE(img.ok());
  EXPECT_EQ((*img)->torn_entry(), SIZE_MAX);
}

TEST(CrashReplayerTest, CloneAndWriteDoNotChangeTheDurableImage) {
  RecordingDevice dev("rec", 64 * 1024);
  ASSERT_TRUE(dev.WriteAt(0, Fill(4096, 5)).ok());
  ASSERT_TRUE(dev.Flush().ok());
  CrashReplayer rep(&dev);
  auto img = rep.Materialize(CrashPoint{2, CrashMode::kPrefix, 0});
  ASSERT_TRUE(img.ok());
  auto clone = (*img)->Clone();
  ASSERT_TRUE(clone->WriteAt(0, Fill(1, 6)).ok());
  std::vector<uint8_t> b(1);
  ASSERT_TRUE((*img)->ReadAt(0, b).ok());
  EXPECT_EQ(b[0], 5);
  ASSERT_TRUE(clone->ReadAt(0, b).ok());
  EXPECT_EQ(b[0], 6);
  auto again = rep.Materialize(CrashPoint{2, CrashMode::kPrefix, 0});
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->ReadAt(0, b).ok());
  EXPECT_EQ(b[0], 5);
}

TEST(UnownedDeviceTest, Forwards) {
  RecordingDevice dev("rec", 8192);
  auto u = NewUnownedDevice(&dev);
  ASSERT_TRUE(u->WriteAt(10, Fill(2, 4)).ok());
  ASSERT_TRUE(u->Flush().ok());
  EXPECT_EQ(dev.log().size(), 2u);
  EXPECT_EQ(u->Size(), 8192u);
  EXPECT_EQ(u->Name(), "rec");
  u.reset();
  std::vector<uint8_t> b(1);
  EXPECT_TRUE(dev.ReadAt(10, b).ok());
  EXPECT_EQ(b[0], 4);
}

}  // namespace
}  // namespace ubtrfs::io
