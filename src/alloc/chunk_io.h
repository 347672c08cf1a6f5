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
#ifndef UBTRFS_ALLOC_CHUNK_IO_H_
#define UBTRFS_ALLOC_CHUNK_IO_H_

#include <cstdint>
#include <span>

#include "alloc/chunk_map.h"
#include "io/device_set.h"

namespace ubtrfs::alloc {

class ChunkIo {
 public:
  ChunkIo(const ChunkMap* map, io::DeviceSet* devs) : map_(map), devs_(devs) {}

  // How many mirrors Read takes for the chunk holding `logical` (0 when
  // none does).
  int NumMirrors(uint64_t logical) const;
  // [logical, logical + out.size()) as mirror `mirror` has it; the range
  // lies in one chunk.
  Status Read(uint64_t logical, std::span<uint8_t> out, int mirror);
  // Every copy. A stripe on a missing device is skipped (a degraded array
  // keeps the copies it has); any other write error fails. RAID5/6: refused.
  Status Write(uint64_t logical, std::span<const uint8_t> data);
  // One copy only (repairing a bad mirror); mirror profiles only.
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

  const ChunkMap& map() const { return *map_; }
  io::DeviceSet& devices() { return *devs_; }

 private:
  Status ReadParity(const ChunkInfo& c, uint64_t logical, std::span<uint8_t> out, int mirror);

  const ChunkMap* map_;
  io::DeviceSet* devs_;
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
