// Internal to check/: one inode's fs-verity items (format/verity.h), fed in
// key order by the fs tree check. The kernel reads them only when the file
// is opened; a damaged descriptor makes the file unreadable, a Merkle tree
// of the wrong size makes every read fail verification.
#ifndef UBTRFS_CHECK_VERITY_CHECK_H_
#define UBTRFS_CHECK_VERITY_CHECK_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "format/key.h"

namespace ubtrfs::check {

class VerityItemsCheck {
 public:
  // A VERITY_DESC_ITEM or VERITY_MERKLE_ITEM of the inode.
  void Add(const format::Key& key, std::span<const uint8_t> d);
  bool any() const { return any_; }
  // At the inode's end, for an inode with the VERITY flag (the items must
  // make a descriptor that fits the file and a tree of the size it names):
  // what is wrong, each a sentence without the inode's name. Resets.
  std::vector<std::string> Finish(uint64_t isize);
  void Reset() { *this = VerityItemsCheck(); }

 private:
  bool any_ = false, head_ = false;
  uint64_t desc_size_ = 0;
  std::vector<uint8_t> desc_;
  uint64_t merkle_bytes_ = 0;
  std::vector<std::string> problems_;
};

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_VERITY_CHECK_H_
