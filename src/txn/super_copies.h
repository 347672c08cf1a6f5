// Every superblock copy of a volume's devices, held to the superblock the
// volume follows: what scrub repairs and `rescue super-recover` reports.
#ifndef UBTRFS_TXN_SUPER_COPIES_H_
#define UBTRFS_TXN_SUPER_COPIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "txn/volume.h"

namespace ubtrfs::txn {

struct SuperCopyState {
  uint64_t devid = 0;
  std::string device;
  int mirror = 0;
  uint64_t bytenr = 0;
  // Valid and of this filesystem and device, whatever its generation; then
  // `generation` is the copy's.
  bool valid = false;
  uint64_t generation = 0;
  std::string problem;  // empty: valid and of the volume's generation
};

// Each copy every present device (seeds aside: their copies are their own
// filesystem's) has room for, in devid and mirror order.
std::vector<SuperCopyState> CheckSuperCopies(Volume& vol);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_SUPER_COPIES_H_
