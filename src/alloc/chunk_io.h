// Reads and writes of logical ranges over the device set, through the chunk
// map: every copy written, one chosen copy read, and for RAID5/RAID6 the
// data rebuilt from parity when its device is missing or a caller found it
// bad (P: xor of the row's data; Q: the kernel's raid6 Reed-Solomon syndrome
// over GF(2^8), generator 2, polynomial 0x11d).
//
// Mirrors, numbered from 0, are the ways one range can be read:
//   mirror profiles   mirror m reads copy m (DUP, RAID1*, RAID10's pair)
//   RAID5             0 direct (rebuilt where a device is missing), 1 from P
//   RAID6             0 direct, 1 from P, 2 from Q alone, 3.. from P and Q
//                     taking one more data stripe for bad as well
// so a caller that verifies checksums tries 0, 1, ... until one is good.
//
// RAID5/6 writes are read-modify-write of whole rows (the kernel's full
// stripes): the row's other data is read (rebuilt where its device is
// missing), the new bytes laid over it, P and Q computed again, and the new
// data and the parity written. A row is written by one caller at a time
// (a lock per row, hashed): two writers of one row would each compute
// parity without the other's data. As in the kernel, a crash between the
// data and the parity writes leaves that row's parity stale (the RAID5/6
// write hole): it matters only once a device is lost as well.
#ifndef UBTRFS_ALLOC_CHUNK_IO_H_
#define UBTRFS_ALLOC_CHUNK_IO_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "alloc/chunk_map.h"
#include "io/device_set.h"

namespace ubtrfs::alloc {

class ChunkIo {
 public:
  ChunkIo(const ChunkMap* map, io::DeviceSet* devs) : map_(map), devs_(devs) {}

  // How many mirrors Read takes for the chunk holding `logical` (0 when
  // none does).
  int NumMirrors(uint64_t logical) const;
  // Whether mirror `mirror` of [logical, logical + len) has a piece on a
  // missing device (a degraded array: that copy is absent, not bad).
  // RAID5/6 rebuild what is missing: false.
  bool MirrorOnMissingDevice(uint64_t logical, uint64_t len, int mirror) const;
  // [logical, logical + out.size()) as mirror `mirror` has it; the range
  // lies in one chunk.
  Status Read(uint64_t logical, std::span<uint8_t> out, int mirror);
  // Mirror 0 of [logical, logical + len) in place (BlockDevice::MapForRead)
  // where it lies in one piece on a device that maps; else empty.
  io::MappedBytes MapForRead(uint64_t logical, size_t len);
  // Every copy. A stripe on a missing device is skipped (a degraded array
  // keeps the copies it has); any other write error fails. RAID5/6: the
  // rows it touches are read, changed and written with new parity.
  Status Write(uint64_t logical, std::span<const uint8_t> data);
  // Several ranges at once (a commit's tree blocks): on RAID5/6 each row is
  // read and written once for all the ranges in it. Ranges must not overlap.
  struct Range {
    uint64_t logical = 0;
    std::span<const uint8_t> data;
  };
  Status WriteBatch(std::span<const Range> ranges);
  // Whether `logical` lies in a RAID5/6 chunk.
  bool IsParityChunk(uint64_t logical) const;
  // One copy only (repairing a bad mirror); mirror profiles only (RAID5/6
  // repair writes through Write).
  Status WriteMirror(uint64_t logical, std::span<const uint8_t> data, int mirror);

  // RAID5/6 (scrub): whether row `row` of `c` holds the P (and Q) its data
  // stripes give, as they are on the devices now; with `repair`, a wrong P
  // or Q is rewritten from the data. `complete` is false (and nothing is
  // judged) when a stripe of the row is on a missing device.
  struct RowParity {
    bool complete = true;
    bool p_bad = false, q_bad = false;
  };
  Result<RowParity> CheckRowParity(const ChunkInfo& c, uint64_t row, bool repair);

  // What read-modify-writes of RAID5/6 data check the rest of their row
  // against: the data checksums, from the layer that keeps them. Before new
  // parity is computed, every sector of the row's other data that the write
  // reads and that has a checksum is verified; one that fails is rebuilt
  // from parity and, where a rebuild matches, used and written back. A
  // silently damaged sector made part of new parity could never be rebuilt
  // again (the kernel checks the same since 6.2). Where no rebuild matches,
  // the sector stays as it is: nothing better is known. `lookup` runs
  // before the row is locked, as it reads tree blocks through this ChunkIo.
  struct DataSums {
    uint32_t sectorsize = 0;
    size_t sum_size = 0;
    std::function<Status(uint64_t logical, size_t nsectors, std::vector<uint8_t>* sums, std::vector<bool>* present)>
        lookup;
    std::function<bool(std::span<const uint8_t> sector, const uint8_t* sum)> matches;
  };
  // Set before the first write.
  void SetDataSums(DataSums sums) { sums_ = std::move(sums); }
  // Sectors those checks found bad: rebuilt, and left because no rebuild matched.
  uint64_t rmw_sectors_repaired() const { return rmw_repaired_.load(std::memory_order_relaxed); }
  uint64_t rmw_sectors_unrepaired() const { return rmw_unrepaired_.load(std::memory_order_relaxed); }

  const ChunkMap& map() const { return *map_; }
  io::DeviceSet& devices() { return *devs_; }

 private:
  // `locked_row`: the row whose lock the caller holds already (a
  // read-modify-write reading the rest of its row), or UINT64_MAX.
  Status ReadParity(const ChunkInfo& c, uint64_t logical, std::span<uint8_t> out, int mirror,
                    uint64_t locked_row = UINT64_MAX);
  // Pieces of one row: where each starts in the row's data (0 .. k *
  // stripe_len) and its bytes.
  struct RowPiece {
    uint64_t at = 0;
    std::span<const uint8_t> data;
  };
  Status WriteRow(const ChunkInfo& c, uint64_t row, std::span<const RowPiece> pieces);
  Status WriteParityRanges(const ChunkInfo& c, std::span<const Range> ranges);
  std::mutex& RowLock(const ChunkInfo& c, uint64_t row) {
    return row_locks_[((c.logical >> 16) + row) * 0x9E3779B97F4A7C15ull >> 58];
  }

  // The checksums of the sectors of the row's other data a write reads
  // (its columns [lo, hi)), one entry per data element (empty: none asked).
  struct RowSums {
    std::vector<uint8_t> sums;
    std::vector<bool> present;
  };
  Status LookupRowSums(const ChunkInfo& c, uint64_t row, uint64_t lo, uint64_t hi,
                       std::span<const uint64_t> covered, std::vector<RowSums>* out);
  // After the read (row locked), before the new bytes go over it.
  Status VerifyRow(const ChunkInfo& c, uint64_t row, uint64_t lo, std::span<const RowSums> sums, uint8_t* mem);

  const ChunkMap* map_;
  io::DeviceSet* devs_;
  std::array<std::mutex, 64> row_locks_;
  DataSums sums_;
  std::atomic<uint64_t> rmw_repaired_{0}, rmw_unrepaired_{0};
};

// GF(2^8) arithmetic as the kernel's raid6 library (exposed for tests).
uint8_t GfMul(uint8_t a, uint8_t b);
uint8_t GfPow2(int e);  // 2^e
uint8_t GfInv(uint8_t a);
// P and Q of one row: data[i] are the row's data stripes in logical order
// (one byte at a time: the reference FastParity is tested against).
void ComputeParity(std::span<const std::span<const uint8_t>> data, std::span<uint8_t> p, std::span<uint8_t> q);
// The same through ISA-L's xor_gen/pq_gen (the kernel's generator and
// polynomial); every buffer 32-byte aligned, lengths a multiple of 32, q
// empty for RAID5. Falls back to ComputeParity where ISA-L declines.
void FastParity(std::span<const std::span<const uint8_t>> data, std::span<uint8_t> p, std::span<uint8_t> q);

}  // namespace ubtrfs::alloc

#endif  // UBTRFS_ALLOC_CHUNK_IO_H_
