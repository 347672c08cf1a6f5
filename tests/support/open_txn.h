// An image opened as the write path opens it, below the public API: the
// volume and a transaction manager over it, for tests that change trees
// item by item (damage a writer could do, items the API does not make).
#ifndef UBTRFS_TESTS_SUPPORT_OPEN_TXN_H_
#define UBTRFS_TESTS_SUPPORT_OPEN_TXN_H_

#include <memory>
#include <string>

#include "txn/transaction.h"
#include "txn/volume.h"
#include "ubtrfs/status.h"

namespace ubtrfs_test {

struct Opened {
  std::unique_ptr<ubtrfs::txn::Volume> vol;
  std::unique_ptr<ubtrfs::txn::TxnManager> txn;  // points into vol: goes first
  Opened() = default;
  Opened(Opened&&) = default;
  Opened& operator=(Opened&& other);
  ~Opened() { txn.reset(); }
};

// The image file writable, with its TxnManager (which checks the free space
// tree against the extent tree, as every write opening does).
ubtrfs::Result<Opened> OpenForWrite(const std::string& img);

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_OPEN_TXN_H_
