// Memory in transparent huge pages, for the tables that grow large: the
// import's node table (30 MB for 200,000 entries), a directory's name-hash
// set (inode/delayed_dir_items.h), the slabs of tree block buffers
// (tree/block_buffer.h). On the 2-core VMs measured (session 30) a page
// fault cost as much as a system call; a mapping of its own with
// MADV_HUGEPAGE faults 2 MiB at a time instead of 4 KiB. glibc's
// glibc.malloc.hugetlb tunable does the same for the main heap, but not
// for the malloc arenas of other threads, and it is the embedding
// program's to set.
#ifndef UBTRFS_MEM_HUGE_PAGES_H_
#define UBTRFS_MEM_HUGE_PAGES_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace ubtrfs::mem {

inline constexpr size_t kHugePage = size_t{2} << 20;

// Whole huge pages, so the kernel can back every one of them.
inline size_t HugeRounded(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

// `bytes` (a multiple of kHugePage) of zeroed memory aligned to a huge page,
// marked for huge pages (a hint: where THP is off, these are plain pages).
// Throws std::bad_alloc as operator new does.
inline void* MapHuge(size_t bytes) {
  void* p = ::mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1);
  if (aligned > start) ::munmap(p, aligned - start);
  const uintptr_t end = start + bytes + kHugePage;
  if (end > aligned + bytes) ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  (void)::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

inline void UnmapHuge(void* p, size_t bytes) { ::munmap(p, bytes); }

// A std allocator: allocations of a huge page and more are mappings of
// their own (MapHuge); smaller ones, and every small build, stay with the
// ordinary heap, where a huge page would only add to the peak.
template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding is implicit

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return std::allocator<T>().allocate(n);
    return static_cast<T*>(MapHuge(HugeRounded(bytes)));
  }

  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return std::allocator<T>().deallocate(p, n);
    UnmapHuge(p, HugeRounded(bytes));
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

}  // namespace ubtrfs::mem

#endif  // UBTRFS_MEM_HUGE_PAGES_H_
