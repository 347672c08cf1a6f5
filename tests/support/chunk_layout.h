// The chunk layout of an image or an array as the chunk tree, the dev tree
// and the DEV_ITEMs have it, for tests that watch chunks come and go
// (unused block groups, balance).
#ifndef UBTRFS_TESTS_SUPPORT_CHUNK_LAYOUT_H_
#define UBTRFS_TESTS_SUPPORT_CHUNK_LAYOUT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ubtrfs_test {

struct ChunkLayout {
  std::map<uint64_t, uint64_t> chunks;  // logical -> type
  uint64_t stripes = 0;                 // in the chunk items
  uint64_t stripe_bytes = 0;
  uint64_t dev_extents = 0;
  uint64_t dev_extent_bytes = 0;
  uint64_t dev_bytes_used = 0;  // DEV_ITEM.bytes_used, all devices

  // Chunks of one kind (DATA, METADATA or SYSTEM; mixed ones count for neither).
  int Count(uint64_t kind) const;
  std::string Describe() const;
};

// Of an image, or of an array (all its images); a gtest failure where it
// cannot be read.
ChunkLayout ReadLayout(const std::vector<std::string>& images);
ChunkLayout ReadLayout(const std::string& img);

// The dev tree, the chunk items and the DEV_ITEMs agree (gtest expectations).
void ExpectConsistent(const ChunkLayout& l, const std::string& what);

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_CHUNK_LAYOUT_H_
