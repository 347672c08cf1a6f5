#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <gtest/gtest.h>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/block_device.h"
#include "io/fault_device.h"
#include "io/write_combiner.h"

namespace ubtrfs::io {
namespace UBTRFS_UNITY_ID {

std::string TempFile() {
  std::string path = ::testing::TempDir() + "/ubtrfs_file_device_XXXXXX";
  int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  ::close(fd);
  return path;
}

// A gathered write puts the pieces back to back, as separate writes would,
// and more pieces than one pwritev call takes (IOV_MAX) still all land.
TEST(FileDevice, GatheredWriteEqualsPieceByPieceWrites) {
  const std::string path = TempFile();
  auto dev = OpenFileDevice(path, OpenFlags{.writable = true});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<std::span<const uint8_t>> pieces;
  for (int i = 0; i < 1500; ++i) bufs.emplace_back(7 + i % 5, static_cast<uint8_t>(i));
  for (const auto& b : bufs) pieces.emplace_back(b);
  ASSERT_TRUE((*dev)->WriteGather(100, pieces).ok());
  (*dev)->StartWriteback();
  ASSERT_TRUE((*dev)->Flush().ok());
  uint64_t off = 100;
  for (const auto& b : bufs) {
    std::vector<uint8_t> got(b.size());
    ASSERT_TRUE((*dev)->ReadAt(off, got).ok());
    ASSERT_EQ(got, b) << "piece at offset " << off;
    off += b.size();
  }
  EXPECT_EQ((*dev)->Size(), off);
  ::unlink(path.c_str());
}

// A gathered write of pieces that straddle the 64 KiB a buffered write call
// takes (file_device.cc: buffered_chunk_) lands whole: a piece cut at a
// call's end goes on in the next call.
TEST(FileDevice, GatheredWriteLongerThanOneCallLandsWhole) {
  const std::string path = TempFile();
  auto dev = OpenFileDevice(path, OpenFlags{.writable = true, .direct_writes = false});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<std::span<const uint8_t>> pieces;
  std::string want;
  for (int i = 0; i < 90; ++i) {
    bufs.emplace_back(3001 + i * 7, static_cast<uint8_t>('a' + i % 26));
    want.append(bufs.back().begin(), bufs.back().end());
  }
  for (const auto& b : bufs) pieces.emplace_back(b);
  ASSERT_TRUE((*dev)->WriteGather(4096, pieces).ok());
  const std::string big(300 << 10, 'Q');  // one large write, five calls
  ASSERT_TRUE((*dev)->WriteAt(1 << 20, std::span(reinterpret_cast<const uint8_t*>(big.data()), big.size())).ok());
  ASSERT_TRUE((*dev)->Flush().ok());
  std::string got(want.size(), '\0');
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pread(fd, got.data(), got.size(), 4096), static_cast<ssize_t>(got.size()));
  EXPECT_TRUE(got == want);
  std::string got_big(big.size(), '\0');
  ASSERT_EQ(::pread(fd, got_big.data(), got_big.size(), 1 << 20), static_cast<ssize_t>(big.size()));
  EXPECT_TRUE(got_big == big);
  ::close(fd);
  ::unlink(path.c_str());
}

// Devices that count or fail single writes see a gathered write as one write
// per piece, so crash points stay one block apart.
TEST(FileDevice, GatheredWriteThroughAFaultDeviceIsOneWritePerPiece) {
  auto mem = NewMemoryDevice("mem", std::vector<uint8_t>(4096));
  FaultDevice dev(mem.get());
  dev.FailNth(FaultOp::kWrite, 3);
  const std::vector<uint8_t> a(512, 1), b(512, 2), c(512, 3);
  const std::span<const uint8_t> pieces[] = {a, b, c};
  EXPECT_EQ(dev.WriteGather(0, pieces).code(), EIO);
  EXPECT_EQ(dev.writes(), 3u);
  std::vector<uint8_t> got(1536);
  ASSERT_TRUE(mem->ReadAt(0, got).ok());
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[512], 2);
  EXPECT_EQ(got[1024], 0);  // the failed third piece never reached the device
}

}  // namespace
}  // namespace ubtrfs::io

namespace ubtrfs::io {
namespace UBTRFS_UNITY_ID {

std::string ReadWithAnotherFd(const std::string& path, size_t off, size_t n) {
  std::string out(n, '\0');
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  const ssize_t got = ::pread(fd, out.data(), n, static_cast<off_t>(off));
  ::close(fd);
  out.resize(got < 0 ? 0 : static_cast<size_t>(got));
  return out;
}

// Small writes are gathered: the device reads them back at once (a read
// drains what it overlaps), later writes over gathered ones win, and a
// Flush puts every one into the file, where another reader sees them.
TEST(FileDevice, SmallWritesReadBackAndReachTheFileByFlush) {
  const std::string path = TempFile();
  auto dev = OpenFileDevice(path, OpenFlags{.writable = true});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const std::vector<uint8_t> a(4096, 'a'), b(4096, 'b'), c(4096, 'c');
  // Out of order, as two threads writing the allocator's adjacent extents do.
  ASSERT_TRUE((*dev)->WriteAt(8192, c).ok());
  ASSERT_TRUE((*dev)->WriteAt(0, a).ok());
  ASSERT_TRUE((*dev)->WriteAt(4096, a).ok());
  ASSERT_TRUE((*dev)->WriteAt(4096, b).ok());  // over a gathered write
  EXPECT_EQ((*dev)->Size(), 12288u);
  std::vector<uint8_t> got(12288);
  ASSERT_TRUE((*dev)->ReadAt(0, got).ok());
  EXPECT_EQ(std::string(got.begin(), got.end()), std::string(4096, 'a') + std::string(4096, 'b') + std::string(4096, 'c'));
  ASSERT_TRUE((*dev)->WriteAt(20480, a).ok());
  ASSERT_TRUE((*dev)->Flush().ok());
  EXPECT_EQ(ReadWithAnotherFd(path, 20480, 4096), std::string(4096, 'a'));
  ::unlink(path.c_str());
}

// Two threads write small blocks, then write them all again, reading back
// their own and flushing now and then, as the allocator's users do: every
// block ends up with its writer's last bytes, in the device and in the file,
// whichever batch (gathering, in flight) the first ones were in. ./test runs
// this under ThreadSanitizer.
class FileDeviceBothWays : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(FileDevice, FileDeviceBothWays, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Direct" : "PageCache"; });

TEST_P(FileDeviceBothWays, SmallWritesFromTwoThreadsKeepTheirOwnBlocks) {
  const std::string path = TempFile();
  auto dev = OpenFileDevice(path, OpenFlags{.writable = true, .direct_writes = GetParam()});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  constexpr int kBlocks = 600;
  auto value = [](int block, int pass) { return static_cast<uint8_t>(pass == 0 ? block : block ^ 0x55); };
  auto work = [&](int who) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = who; i < kBlocks; i += 2) {
        const std::vector<uint8_t> data(4096, value(i, pass));
        EXPECT_TRUE((*dev)->WriteAt(uint64_t(i) * 4096, data).ok());
        if (i % 7 == 0) {
          std::vector<uint8_t> got(4096);
          EXPECT_TRUE((*dev)->ReadAt(uint64_t(i) * 4096, got).ok());
          EXPECT_EQ(got, data);
        }
        if (i % 50 == 0) {
          EXPECT_TRUE((*dev)->Flush().ok());
        }
      }
    }
  };
  std::thread t0(work, 0), t1(work, 1);
  t0.join();
  t1.join();
  ASSERT_TRUE((*dev)->Flush().ok());
  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(ReadWithAnotherFd(path, uint64_t(i) * 4096, 4096), std::string(4096, static_cast<char>(value(i, 1)))) << i;
  }
  ::unlink(path.c_str());
}

// Flushes racing two writers that fill batches, one of which holds a lock
// of its own across each write that the other takes between its writes, as
// the file system's inode locks are held; a watchdog turns a hang into a
// failure. A drain used to empty a full batch without waking the writers
// waiting for room: one then slept until a later write filled a batch, and
// a 4 KiB create run hung when the other writer waited for the sleeper's
// inode lock (file_device.cc, DrainLocked). That needs a writer to come
// back between the in-flight writer's wake-up call and the filler's turn,
// and a drain to win the lock before the filler; this test makes flushes
// meet writers waiting for room, but does not force that order (50
// repetitions without the fix passed).
TEST_P(FileDeviceBothWays, ADrainWakesWritersWaitingForRoom) {
  const std::string path = TempFile();
  auto dev = OpenFileDevice(path, OpenFlags{.writable = true, .direct_writes = GetParam()});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  constexpr int kBlocksEach = 20000;
  std::mutex a_lock;
  std::atomic<int> writers_done{0};
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 1200 && !finished.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!finished.load()) {
      std::fprintf(stderr, "FileDevice writers hung for 120 s: a waiter for room was never woken\n");
      std::abort();
    }
  });
  // Blocks are handed out in ascending order, as the allocator does; each
  // block's bytes say which writer wrote it.
  std::atomic<uint64_t> next_block{0};
  std::vector<std::atomic<uint8_t>> owner(kBlocksEach * 2);
  auto write = [&](int who) {
    std::vector<uint8_t> data(4096, static_cast<uint8_t>(who + 1));
    for (int i = 0; i < kBlocksEach; ++i) {
      const uint64_t block = next_block.fetch_add(1);
      owner[block] = static_cast<uint8_t>(who + 1);
      const uint64_t off = block * 4096;
      if (who == 0) {
        std::lock_guard hold(a_lock);
        EXPECT_TRUE((*dev)->WriteAt(off, data).ok());
      } else {
        EXPECT_TRUE((*dev)->WriteAt(off, data).ok());
        std::lock_guard touch(a_lock);
      }
    }
    writers_done.fetch_add(1);
  };
  auto drain = [&](int who) {
    for (int n = 0; writers_done.load() < 2; ++n) {
      if (n % 4 == who) {
        EXPECT_TRUE((*dev)->Flush().ok());
      } else {
        (*dev)->StartWriteback();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100 + (n * 37 + who * 101) % 400));
    }
  };
  std::thread a(write, 0), b(write, 1), d0(drain, 0), d1(drain, 1);
  a.join();
  b.join();
  d0.join();
  d1.join();
  finished = true;
  watchdog.join();
  ASSERT_TRUE((*dev)->Flush().ok());
  for (int i = 0; i < kBlocksEach * 2; i += 997) {
    ASSERT_EQ(ReadWithAnotherFd(path, uint64_t(i) * 4096, 4096), std::string(4096, static_cast<char>(owner[i].load())))
        << i;
  }
  ::unlink(path.c_str());
}

// Past 64 MiB written, a writeback hint starts a flush on a thread of the
// device's own. It runs beside writers and beside Flush() calls, and the
// device closes with it running; every byte reads back through another
// descriptor. ./test runs this under ThreadSanitizer.
TEST_P(FileDeviceBothWays, BackgroundFlushesRunBesideWritersAndFlushes) {
  const std::string path = TempFile();
  constexpr uint64_t kMiB = 1 << 20, kEach = 72;  // two writers: 144 MiB, two flushes' worth
  {
    auto dev = OpenFileDevice(path, OpenFlags{.writable = true, .direct_writes = GetParam()});
    ASSERT_TRUE(dev.ok()) << dev.status().ToString();
    auto write = [&](int who) {
      std::vector<uint8_t> data(kMiB);
      for (uint64_t i = 0; i < kEach; ++i) {
        std::memset(data.data(), static_cast<int>(who * kEach + i + 1), data.size());
        EXPECT_TRUE((*dev)->WriteAt((i * 2 + who) * kMiB, data).ok());
        if (i % 8 == 7) (*dev)->StartWriteback();
        if (who == 0 && i % 24 == 23) {
          EXPECT_TRUE((*dev)->Flush().ok());
        }
      }
    };
    std::thread a(write, 0), b(write, 1);
    a.join();
    b.join();
    (*dev)->StartWriteback();  // may leave a flush running as the device closes
  }
  for (uint64_t block = 0; block < 2 * kEach; block += 7) {
    const uint64_t who = block % 2, i = block / 2;
    ASSERT_EQ(ReadWithAnotherFd(path, block * kMiB, 4096), std::string(4096, static_cast<char>(who * kEach + i + 1)))
        << block;
  }
  ::unlink(path.c_str());
}

// Large writes: aligned ones go around the page cache (from the caller's
// buffer, or through an aligned copy when the buffer is not aligned), others
// through it; each reads back at once, through the device and through
// another descriptor, also where a buffered write and a direct one meet.
TEST_P(FileDeviceBothWays, LargeWritesReadBackWhicheverWayTheyWent) {
  const std::string path = TempFile();
  auto dev = OpenFileDevice(path, OpenFlags{.writable = true, .direct_writes = GetParam()});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::string want(8 << 20, '\0');
  auto put = [&](uint64_t off, const std::string& bytes, size_t misalign) {
    std::vector<uint8_t> buf(bytes.size() + misalign + 4096);
    auto* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 4095) / 4096 * 4096) + misalign;
    std::memcpy(p, bytes.data(), bytes.size());
    ASSERT_TRUE((*dev)->WriteAt(off, std::span<const uint8_t>(p, bytes.size())).ok());
    want.replace(off, bytes.size(), bytes);
  };
  put(0, std::string(8 << 20, 'z'), 0);                  // aligned buffer
  put(4096, std::string(3 << 20, 'u'), 1);               // unaligned buffer: a bounce copy
  put(100, std::string(200 << 10, 'b'), 0);              // unaligned offset: the page cache
  put(1 << 20, std::string(1 << 20, 'd'), 0);            // direct over the buffered one's tail
  put((1 << 20) + 5, std::string(100 << 10, 'e'), 0);    // and buffered over the direct one
  std::vector<uint8_t> got(want.size());
  ASSERT_TRUE((*dev)->ReadAt(0, got).ok());
  EXPECT_TRUE(std::string(got.begin(), got.end()) == want);
  ASSERT_TRUE((*dev)->Flush().ok());
  EXPECT_TRUE(ReadWithAnotherFd(path, 0, want.size()) == want);
  ::unlink(path.c_str());
}

// One thread writing many batches' worth of small blocks (an image build,
// cp) gathers into one buffer: the second is for writers that arrive while
// a full batch is being written. Then a second writer may cut it.
TEST_P(FileDeviceBothWays, ASingleWriterGathersIntoOneBuffer) {
  const std::string path = TempFile();
  const size_t before = WriteCombiner::LiveBuffers();
  auto dev = OpenFileDevice(path, OpenFlags{.writable = true, .direct_writes = GetParam()});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  constexpr size_t kBlocks = 1024;  // 4 MiB: eight full batches
  for (size_t i = 0; i < kBlocks; ++i) {
    const std::vector<uint8_t> block(4096, static_cast<uint8_t>('a' + i % 26));
    ASSERT_TRUE((*dev)->WriteAt(i * 4096, block).ok());
  }
  EXPECT_EQ(WriteCombiner::LiveBuffers() - before, 1u);
  ASSERT_TRUE((*dev)->Flush().ok());
  const std::string got = ReadWithAnotherFd(path, 0, kBlocks * 4096);
  for (size_t i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(got[i * 4096], static_cast<char>('a' + i % 26)) << "block " << i;
  }
  // Two writers: the batches take turns, whichever buffers that needs,
  // and every block still reads back as its writer left it.
  std::vector<std::thread> writers;
  for (int t = 0; t < 2; ++t) {
    writers.emplace_back([&, t] {
      for (size_t i = t; i < kBlocks; i += 2) {
        const std::vector<uint8_t> block(4096, static_cast<uint8_t>('A' + t));
        EXPECT_TRUE((*dev)->WriteAt(i * 4096, block).ok());
      }
    });
  }
  for (auto& w : writers) w.join();
  EXPECT_LE(WriteCombiner::LiveBuffers() - before, 2u);
  ASSERT_TRUE((*dev)->Flush().ok());
  const std::string again = ReadWithAnotherFd(path, 0, kBlocks * 4096);
  for (size_t i = 0; i < kBlocks; ++i) ASSERT_EQ(again[i * 4096], static_cast<char>('A' + i % 2)) << "block " << i;
  dev->reset();
  EXPECT_EQ(WriteCombiner::LiveBuffers(), before);
  ::unlink(path.c_str());
}

// The combiner writes runs of adjacent writes with one call each, in offset
// order, and a write larger than it takes is left to the caller.
TEST(WriteCombiner, AdjacentWritesGoDownAsOneRun) {
  WriteCombiner w(1 << 20, 64 << 10);
  EXPECT_FALSE(w.Takes(0));
  EXPECT_FALSE(w.Takes((64 << 10) + 1));
  const std::vector<uint8_t> x(4096, 1);
  for (uint64_t off : {8192u, 0u, 4096u, 65536u, 69632u}) w.Add(off, x);
  EXPECT_TRUE(w.Overlaps(4095, 2));
  EXPECT_FALSE(w.Overlaps(12288, 65536 - 12288));
  std::vector<std::pair<uint64_t, size_t>> runs;  // offset, pieces
  ASSERT_TRUE(w.Drain([&](uint64_t off, std::span<const iovec> pieces) {
                 runs.emplace_back(off, pieces.size());
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(runs, (std::vector<std::pair<uint64_t, size_t>>{{0, 3}, {65536, 2}}));
  EXPECT_TRUE(w.empty());
  EXPECT_FALSE(w.Overlaps(0, 1 << 20));
}

// A failed run still empties the combiner and is reported once.
TEST(WriteCombiner, AFailedRunIsReported) {
  WriteCombiner w;
  const std::vector<uint8_t> x(512, 1);
  w.Add(0, x);
  w.Add(4096, x);
  int calls = 0;
  Status s = w.Drain([&](uint64_t, std::span<const iovec>) {
    ++calls;
    return Status::Error(ENOSPC, "no space");
  });
  EXPECT_EQ(s.code(), ENOSPC);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(w.empty());
}

}  // namespace
}  // namespace ubtrfs::io
