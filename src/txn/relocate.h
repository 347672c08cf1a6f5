// Offline changes of where chunks lie on the device: what `ubtrfs resize`
// and `ubtrfs mkfs --shrink` are built from. Single device, SINGLE and DUP.
//
// A chunk is moved by its device copies, not by its logical addresses: a
// stripe's bytes are copied to unallocated device space, then the CHUNK_ITEM
// (and the superblock's system chunk array) names the new offset and the
// DEV_EXTENT moves with it, all in one transaction. Every tree block and
// data extent keeps its logical address, so no reference, checksum or file
// extent item changes, and full chunks move as easily as empty ones. The
// kernel's balance relocates by logical address instead because it runs
// online and over several devices; for one offline device the copy is all
// that is needed. Until the commit the committed superblock still maps the
// old place, which nothing writes to (the target must be unallocated in the
// committed state and may not overlap the source), so a crash at any point
// leaves either layout whole.
//
// A stripe that lands on a superblock copy (64 MiB, 256 GiB) gives up the
// 64 KiB of the chunk that maps there, as the kernel's exclude_super_stripes
// expects; it must be free in the block group, and is kept from allocation.
//
// Trimming cuts a chunk's unused tail: the chunk item, its dev extents,
// DEV_ITEM.bytes_used, the block group item (keyed by length) and the free
// space tree all shrink with it.
#ifndef UBTRFS_TXN_RELOCATE_H_
#define UBTRFS_TXN_RELOCATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ubtrfs/status.h"

namespace ubtrfs::txn {

class TxnManager;

class DeviceLayout {
 public:
  explicit DeviceLayout(TxnManager* txn) : txn_(txn) {}

  struct Stripe {
    uint64_t logical = 0;
    uint64_t length = 0;
    uint64_t type = 0;
    size_t index = 0;     // which copy of the chunk
    uint64_t physical = 0;
  };
  // Every stripe, by device offset.
  std::vector<Stripe> Stripes() const;
  // Where the last stripe ends (1 MiB with none).
  uint64_t DeviceExtentEnd() const;

  // Cuts every chunk to the end of its last used block, rounded up to
  // 64 KiB, keeping free metadata for the kernel's global reserve at mount
  // (estimated from the trees' sizes as the kernel does) and a few system
  // blocks. Changes the running transaction; the caller commits. Sets
  // *trimmed to the device bytes given back.
  Status TrimChunks(uint64_t* trimmed);

  // Moves copy `index` of the chunk at `logical` to device offset `to`
  // (unallocated, not overlapping the copy's current place). Must be the
  // first change of a transaction; the caller commits. Adds the bytes
  // copied (only the used ranges) to *copied.
  Status MoveStripe(uint64_t logical, size_t index, uint64_t to, uint64_t* copied);

  // The lowest offset in [from, limit) where copy `s` may go: unallocated,
  // not overlapping it, and with every superblock copy inside it landing
  // on a free 64 KiB of the chunk. 0 when there is none.
  uint64_t FindPlace(const Stripe& s, uint64_t limit) const;

  // DEV_ITEM.total_bytes and the superblock's sizes. EINVAL below the end
  // of the last stripe. The caller commits.
  Status SetDeviceSize(uint64_t bytes);

 private:
  uint64_t UsedEnd(uint64_t logical) const;
  bool PlaceOk(const Stripe& s, uint64_t to) const;
  Status UpdateChunkItem(uint64_t logical, uint64_t length, size_t index, uint64_t physical);
  Status UpdateDevItem();

  TxnManager* txn_;
};

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_RELOCATE_H_
