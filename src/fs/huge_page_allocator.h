// An allocator for the import's large tables (its node table grows by
// doubling to 30 MB for 200,000 entries): allocations of 2 MiB and more
// are mappings of their own with MADV_HUGEPAGE, so their first touches
// fault 2 MiB at a time instead of 4 KiB. On the 2-core VM of session 30 a
// page fault cost as much as a system call, and the node table's were half
// the faults of `mkfs --rootdir` of 200,000 empty files. Smaller ones, and
// every small build, stay with the ordinary heap: there a huge page would
// only add to the peak.
#ifndef UBTRFS_FS_HUGE_PAGE_ALLOCATOR_H_
#define UBTRFS_FS_HUGE_PAGE_ALLOCATOR_H_

#include <sys/mman.h>

#include <cstddef>
#include <memory>
#include <new>

namespace ubtrfs::fs {

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding is implicit

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHuge) return std::allocator<T>().allocate(n);
    const size_t mapped = Mapped(bytes);
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    (void)::madvise(p, mapped, MADV_HUGEPAGE);  // a hint: where THP is off, these are plain pages
    return static_cast<T*>(p);
  }

  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHuge) return std::allocator<T>().deallocate(p, n);
    ::munmap(p, Mapped(bytes));
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }

 private:
  static constexpr size_t kHuge = size_t{2} << 20;
  // Whole huge pages, so the kernel can back every one of them.
  static size_t Mapped(size_t bytes) { return (bytes + kHuge - 1) / kHuge * kHuge; }
};

}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_HUGE_PAGE_ALLOCATOR_H_
