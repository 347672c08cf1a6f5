// Work spread over the machine's cores, for CPU-bound steps of one call
// (compressing the 128 KiB ranges of a write). The threads are started on
// first use and kept, so a call pays no thread start and each thread keeps
// its codec contexts (thread_local) from call to call.
#ifndef UBTRFS_FS_WORK_POOL_H_
#define UBTRFS_FS_WORK_POOL_H_

#include <cstddef>
#include <functional>

namespace ubtrfs::fs {

// Calls fn(0) .. fn(n - 1), each once, on the calling thread and on the
// pool's threads (one fewer than the cores), and returns when all have
// returned. fn must not throw. While another caller's items are running,
// this caller runs its own alone: two writers on two cores already keep
// both busy, and neither waits for the other.
void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_WORK_POOL_H_
