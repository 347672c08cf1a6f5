// The chunk map: logical address ranges (chunks) and where their copies sit
// on the device. Single-device SINGLE and DUP chunks are supported; any other
// profile or a stripe on another device is refused with "unsupported: ...".
#ifndef UBTRFS_ALLOC_CHUNK_MAP_H_
#define UBTRFS_ALLOC_CHUNK_MAP_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "ubtrfs/status.h"

namespace ubtrfs::alloc {

struct ChunkInfo {
  uint64_t logical = 0;
  uint64_t length = 0;
  uint64_t type = 0;                // block group flags (DATA/METADATA/SYSTEM | profile)
  std::vector<uint64_t> physical;   // one start offset per copy
};

class ChunkMap {
 public:
  explicit ChunkMap(uint64_t devid, uint64_t device_size) : devid_(devid), device_size_(device_size) {}

  // Adds a chunk item (a format::Chunk followed by its stripes) keyed at
  // `logical`. Validates the item; re-adding an identical chunk is a no-op.
  Status AddChunk(uint64_t logical, std::span<const uint8_t> item, uint32_t sectorsize);

  // Physical offsets of every copy of [logical, logical + len). The range
  // must lie inside one chunk.
  Result<std::vector<uint64_t>> Map(uint64_t logical, uint64_t len) const;
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
  Status SetStripe(uint64_t logical, size_t index, uint64_t physical);
  void set_device_size(uint64_t bytes) { device_size_ = bytes; }
  uint64_t device_size() const { return device_size_; }

 private:
  uint64_t devid_;
  uint64_t device_size_;
  mutable std::shared_mutex mu_;           // guards chunks_ between AddChunk and Find
  std::map<uint64_t, ChunkInfo> chunks_;  // keyed by logical start
};

std::string ProfileName(uint64_t type);

}  // namespace ubtrfs::alloc

#endif  // UBTRFS_ALLOC_CHUNK_MAP_H_
