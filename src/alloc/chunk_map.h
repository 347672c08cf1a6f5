// The chunk map: logical address ranges (chunks) and where their stripes sit
// on the devices. Every profile is mapped (SINGLE, DUP, RAID0, RAID1,
// RAID1C3, RAID1C4, RAID10, RAID5, RAID6); a stripe on a device that is not
// open (a missing one) is kept, and reading it fails at the device set.
#ifndef UBTRFS_ALLOC_CHUNK_MAP_H_
#define UBTRFS_ALLOC_CHUNK_MAP_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ubtrfs/status.h"

namespace ubtrfs::alloc {

struct StripeLoc {
  uint64_t devid = 0;
  uint64_t physical = 0;  // where the stripe starts on its device
  bool operator==(const StripeLoc&) const = default;
};

// One contiguous run of a mapped range on one device.
struct Piece {
  uint64_t devid = 0;
  uint64_t physical = 0;
  uint64_t length = 0;
  uint64_t buf_offset = 0;  // where it sits in the caller's buffer
};

struct ChunkInfo {
  uint64_t logical = 0;
  uint64_t length = 0;
  uint64_t type = 0;         // block group flags (DATA/METADATA/SYSTEM | profile)
  uint64_t stripe_len = 0;   // bytes per stripe element (64 KiB)
  uint32_t sub_stripes = 1;  // RAID10: copies of each element
  uint64_t stripe_size = 0;  // bytes each stripe takes on its device (its dev extent's length)
  std::vector<StripeLoc> stripes;

  uint64_t profile() const;
  // Copies of each byte: 1 for SINGLE, RAID0, RAID5, RAID6 (parity is not a copy).
  uint32_t mirrors() const;
  // RAID5: 1, RAID6: 2, else 0.
  uint32_t parity_stripes() const;
  // Stripes that hold data in one row (RAID5/6: num_stripes - parity).
  uint32_t data_stripes() const;
  // RAID5/6: the element of row `row` that stripe `index` holds (data
  // 0..data_stripes()-1, then P, then Q): row r puts its element e on
  // stripe (e + r) % num_stripes, so parity rotates one device per row.
  uint64_t RowElement(uint64_t row, size_t index) const {
    const uint64_t n = stripes.size();
    return (index + n - row % n) % n;
  }
  // Where each stripe starts on its device (single-device tools: resize).
  std::vector<uint64_t> physical() const {
    std::vector<uint64_t> out;
    for (const auto& s : stripes) out.push_back(s.physical);
    return out;
  }
};

// Profile constraints: how many stripes a chunk of it has at least, and in
// steps of how many (RAID10: pairs).
struct ProfileRule {
  uint32_t devs_min = 1;
  uint32_t devs_max = 1;  // 0: any number
  uint32_t increment = 1;
  uint32_t copies = 1;
  uint32_t parity = 0;
};
ProfileRule RuleFor(uint64_t profile);
// Stripes of a row that hold data, for a chunk of `profile` with `nstripes`
// stripes (RAID10: pairs; RAID5/6: less the parity).
uint32_t DataStripesFor(uint64_t profile, uint32_t nstripes, uint32_t sub_stripes = 2);

class ChunkMap {
 public:
  // device_sizes: devid -> bytes of every device that is open. Stripes on
  // other devices are accepted (missing devices) but not bounds-checked.
  explicit ChunkMap(std::map<uint64_t, uint64_t> device_sizes) : device_sizes_(std::move(device_sizes)) {}
  ChunkMap(uint64_t devid, uint64_t device_size) : device_sizes_{{devid, device_size}} {}

  // Adds a chunk item (a format::Chunk followed by its stripes) keyed at
  // `logical`. Validates the item; re-adding an identical chunk is a no-op.
  Status AddChunk(uint64_t logical, std::span<const uint8_t> item, uint32_t sectorsize);

  // Every copy of [logical, logical + len), each as the device pieces that
  // make it up in logical order (RAID0 and RAID10 split at element
  // boundaries). RAID5/6 give one copy: the data pieces; parity is
  // ChunkIo's business. The range must lie inside one chunk.
  Result<std::vector<std::vector<Piece>>> Map(uint64_t logical, uint64_t len) const;
  // Where each copy starts on its device, for ranges each copy holds in
  // one piece (any range of a SINGLE, DUP or RAID1* chunk; tests and tools
  // that patch single-device images). EINVAL when a copy is split.
  Result<std::vector<uint64_t>> MapPhysical(uint64_t logical, uint64_t len) const;
  // Thread-safe against a concurrent AddChunk (a writer adding a chunk while
  // readers map addresses); ChunkInfo entries never move or change.
  const ChunkInfo* Find(uint64_t logical) const;

  // Unlocked: only for the thread that adds chunks, or before sharing.
  const std::map<uint64_t, ChunkInfo>& chunks() const { return chunks_; }

  // Offline layout changes (txn/relocate.cc: resize, mkfs --shrink), made
  // while nothing else maps addresses: the one exception to entries never
  // changing. A chunk's length cut (its tail unused), a copy moved to
  // another device offset (its bytes copied first), the device's size.
  Status SetLength(uint64_t logical, uint64_t length);
  // devid 0: the stripe stays on its device.
  Status SetStripe(uint64_t logical, size_t index, uint64_t physical, uint64_t devid = 0);
  // A chunk restriped over other devices (device remove): every stripe and
  // the stripe size at once; the length stays. `type` (with its
  // sub_stripes) non-zero: converted to that profile too (balance).
  Status SetStripes(uint64_t logical, std::vector<StripeLoc> stripes, uint64_t stripe_size, uint64_t type = 0,
                    uint32_t sub_stripes = 1);
  void set_device_size(uint64_t devid, uint64_t bytes) { device_sizes_[devid] = bytes; }
  // A chunk whose block group was emptied and deleted (txn/unused_groups.cc):
  // Find, Map and chunks() no longer see it. Its entry stays alive and
  // unchanged for whoever Find gave it to before.
  Status RemoveChunk(uint64_t logical);

 private:
  std::map<uint64_t, uint64_t> device_sizes_;
  mutable std::shared_mutex mu_;           // guards chunks_ between AddChunk and Find
  std::map<uint64_t, ChunkInfo> chunks_;  // keyed by logical start
  std::vector<std::map<uint64_t, ChunkInfo>::node_type> removed_;  // mu_
};

// The logical ranges of chunk `c` that the stripe elements holding a
// superblock copy map to (on any of its devices), as the kernel's
// btrfs_rmap_block: never allocated. RAID5/6 lose the whole row.
std::vector<std::pair<uint64_t, uint64_t>> SuperblockRanges(const ChunkInfo& c);

std::string ProfileName(uint64_t type);

}  // namespace ubtrfs::alloc

#endif  // UBTRFS_ALLOC_CHUNK_MAP_H_
