// Where the bytes of tree blocks live.
//
// A transaction creates thousands of 16 KiB blocks and a commit releases as
// many (into the node cache, which evicts older ones). Two costs come with
// fresh memory, and this pool removes both:
// - Released buffers of power-of-two sizes from 4 to 64 KiB wait here for
//   the next block instead of going back to malloc (glibc returns freed heap
//   tops to the system, and a fresh buffer faults its pages in one by one:
//   about 6% of a create path). The pool keeps kBufferPoolBytes, or as much
//   as the last commit expects the next transaction to use
//   (ExpectBlockBuffers), at most kBufferPoolMaxBytes.
// - Once a process holds kHeapBufferBytes of block buffers, threads other
//   than the main one cut new ones from 2 MiB slabs mapped with
//   MADV_HUGEPAGE, so a growing tree faults a huge page per 128 blocks
//   instead of four pages per block. On the 2-core VM of session 30, 80% of
//   a library create run's page faults were fresh block buffers in the
//   threads' malloc arenas, which glibc's huge-page tunable does not reach;
//   with slabs the run took 30% less CPU. The main thread keeps the heap:
//   its arena is the one the tunable reaches (mkfs.ubtrfs and ubtrfs set it
//   for large trees), and a bulk import on it reuses for blocks what its
//   scan freed. With slabs, /usr/share's import peaked 20 MB higher (113
//   against 93 MB): blocks and the rest each at their own peak. Small
//   workloads never reach the threshold: a huge page would only add to
//   their peak.
// A slab goes back to the system when its last buffer is released and the
// pool holds more than its cap, or at TrimBlockBuffers. A new slab is mapped
// only when no slab has room, and buffers are cut from the fullest slab with
// room, so sparse slabs drain: the slabs hold no more than the most buffers
// in use at once plus the pool's cap, where the heap returned what was
// above the cap at once.
#ifndef UBTRFS_TREE_BLOCK_BUFFER_H_
#define UBTRFS_TREE_BLOCK_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace ubtrfs::tree {

inline constexpr size_t kBufferPoolBytes = 64ull << 20;
inline constexpr size_t kBufferPoolMaxBytes = 256ull << 20;
// Block buffers a process takes from the heap before it cuts them from slabs.
inline constexpr size_t kHeapBufferBytes = 4ull << 20;
inline constexpr size_t kSlabBytes = 2ull << 20;  // one huge page (mem/huge_pages.h)

struct Slab;

// n bytes that go back to the pool when dropped. Move-only.
class BlockBuffer {
 public:
  BlockBuffer() = default;
  // A buffer of n bytes whose contents are unspecified.
  static BlockBuffer Take(size_t n);
  static BlockBuffer CopyOf(std::span<const uint8_t> bytes);

  BlockBuffer(BlockBuffer&& o) noexcept : data_(o.data_), size_(o.size_), slab_(o.slab_) { o.Forget(); }
  BlockBuffer& operator=(BlockBuffer&& o) noexcept;
  BlockBuffer(const BlockBuffer&) = delete;
  BlockBuffer& operator=(const BlockBuffer&) = delete;
  ~BlockBuffer() { Release(); }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<uint8_t> span() { return {data_, size_}; }
  std::span<const uint8_t> span() const { return {data_, size_}; }

 private:
  BlockBuffer(uint8_t* data, size_t size, Slab* slab) : data_(data), size_(size), slab_(slab) {}
  void Release();
  void Forget() {
    data_ = nullptr;
    size_ = 0;
    slab_ = nullptr;
  }
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  Slab* slab_ = nullptr;  // null: from the heap
};

// A commit that wrote `bytes` of blocks: the next transaction will likely
// make as many new ones, so the pool may keep that much (clamped as above).
// The blocks the commit releases (to the node cache, which evicts older
// ones, and the copies it replaced) then feed the next transaction instead
// of fresh pages. A lower cap frees pooled buffers above it at once.
void ExpectBlockBuffers(size_t bytes);
// The pool's cap now.
size_t BlockBufferPoolCap();
// Frees every pooled buffer and every slab none of whose buffers is in use
// (the last filesystem closed), and resets the cap.
void TrimBlockBuffers();

struct BlockBufferStats {
  size_t pooled = 0;      // released buffers waiting for a block
  size_t heap_bytes = 0;  // heap buffers, in use or pooled
  size_t slab_bytes = 0;  // slabs mapped
};
BlockBufferStats GetBlockBufferStats();
// Buffers pooled now, for tests and stats.
inline size_t PooledBlockBuffers() { return GetBlockBufferStats().pooled; }

}  // namespace ubtrfs::tree

#endif  // UBTRFS_TREE_BLOCK_BUFFER_H_
