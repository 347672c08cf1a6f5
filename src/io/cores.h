#ifndef UBTRFS_IO_CORES_H_
#define UBTRFS_IO_CORES_H_

namespace ubtrfs::io {

// The cores this process may run on (its CPU affinity, as nproc counts), at
// least 1. Every layer that sizes its threads asks here: a build in a
// container pinned to 2 of a host's 64 cores starts threads, and their codec
// contexts, for 2. A cgroup CPU quota is not seen, as nproc does not see it.
unsigned UsableCores();

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_CORES_H_
