// Offline changes of where chunks lie on the devices: what `ubtrfs resize`,
// `ubtrfs mkfs --shrink` and `ubtrfs device add|remove` are built from.
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
// A copy may also move to another device (device remove): the chunk item's
// stripe then names that device (devid and uuid), the dev extent moves to
// the other device's key, and both DEV_ITEMs' bytes_used follow. Striped
// profiles (RAID0, RAID10) copy the stripe's elements as they lie.
//
// Trimming cuts a chunk's unused tail: the chunk item, its dev extents,
// DEV_ITEM.bytes_used, the block group item (keyed by length) and the free
// space tree all shrink with it.
#ifndef UBTRFS_TXN_RELOCATE_H_
#define UBTRFS_TXN_RELOCATE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "alloc/chunk_map.h"
#include "format/ondisk.h"
#include "io/block_device.h"
#include "txn/copy_check.h"

#include "ubtrfs/status.h"

namespace ubtrfs::txn {

class TxnManager;

class DeviceLayout {
 public:
  explicit DeviceLayout(TxnManager* txn) : txn_(txn) {}

  struct Stripe {
    uint64_t logical = 0;
    uint64_t length = 0;  // bytes on the device (the dev extent's length)
    uint64_t type = 0;
    size_t index = 0;     // which stripe of the chunk
    uint64_t physical = 0;
    uint64_t devid = 1;
  };
  // Every stripe of every device, by device offset.
  std::vector<Stripe> Stripes() const;
  // Where the last stripe of device `devid` ends (0: of any device; 1 MiB
  // with none).
  uint64_t DeviceExtentEnd(uint64_t devid = 0) const;

  // Cuts every chunk to the end of its last used block, rounded up to
  // 64 KiB, keeping free metadata for the kernel's global reserve at mount
  // (estimated from the trees' sizes as the kernel does) and a few system
  // blocks. Changes the running transaction; the caller commits. Sets
  // *trimmed to the device bytes given back.
  Status TrimChunks(uint64_t* trimmed);

  // Moves copy `index` of the chunk at `logical` to device offset `to`
  // (unallocated, not overlapping the copy's current place). Must be the
  // first change of a transaction; the caller commits. Adds the bytes
  // copied (only the used ranges) and what verifying them found
  // (txn/copy_check.h) to *copied; so do the other moves below.
  Status MoveStripe(uint64_t logical, size_t index, uint64_t to, CopyStats* copied);
  // The same onto device `devid` (another one: device remove).
  Status MoveStripe(uint64_t logical, size_t index, uint64_t devid, uint64_t to, CopyStats* copied);

  // The lowest offset below `limit` on the stripe's device (or on `devid`)
  // where copy `s` may go: unallocated, not overlapping it, and with every
  // superblock copy inside it landing on a free 64 KiB of the chunk. 0 when
  // there is none.
  uint64_t FindPlace(const Stripe& s, uint64_t limit) const { return FindPlace(s, s.devid, limit); }
  uint64_t FindPlace(const Stripe& s, uint64_t devid, uint64_t limit) const;
  // The highest offset above the copy's place on its device where it may
  // go, by the same rules; 0 when there is none (resize --shrink clears the
  // bottom of the device for the packed groups).
  uint64_t FindPlaceAbove(const Stripe& s) const;

  // ---- Several devices (ubtrfs device add / remove) ----

  // Adds `dev` as a new device (devid: one above the highest), its DEV_ITEM
  // in the chunk tree, the superblock's num_devices and total_bytes; the
  // commit writes its superblocks. Sets *devid.
  Status AddDevice(std::unique_ptr<io::BlockDevice> dev, const std::array<uint8_t, format::kUuidSize>& uuid,
                   uint64_t* devid);
  // EINVAL when device `devid` may not go: the only device, or fewer
  // devices than a profile in use needs afterwards (the kernel's
  // btrfs_check_raid_min_devices), or not a device of the filesystem.
  Status CheckRemovable(uint64_t devid) const;
  // For a stripe on a missing device: EINVAL when its chunk cannot make it
  // again (one copy, or more stripes lost than the profile tolerates) and
  // the chunk holds something. MoveStripe and RestripeOff rebuild it.
  Status CheckRebuildable(const Stripe& s) const;
  // No new chunk goes on `devid` from now on (before moving its stripes off).
  void StopAllocating(uint64_t devid);
  // Where stripe `s` goes when its device leaves: a present device other
  // than `leaving` that holds no other stripe of the chunk (DUP: both
  // stripes on one device), the one with the largest free range where it
  // fits. EINVAL naming the chunk when there is none.
  Status FindNewHome(const Stripe& s, uint64_t leaving, uint64_t* devid, uint64_t* to) const;
  // A RAID0 or RAID10 chunk with a stripe on `leaving` and on every other
  // present device: it must be restriped (RestripeOff) to leave.
  bool NeedsRestripe(const Stripe& s, uint64_t leaving) const;
  // Restripes such a chunk over the other devices (RAID0: all that have
  // room, RAID10: an even number of them), at the same logical address and
  // length: new stripes in free device space (the old ones stay whole until
  // the commit), every used element copied to its new place, the chunk
  // item, dev extents and bytes_used rewritten. With dry_run only checks
  // that it can be done. Must be the first change of a transaction; the
  // caller commits.
  Status RestripeOff(uint64_t logical, uint64_t leaving, bool dry_run, CopyStats* copied);
  // ---- Profiles (ubtrfs balance --dconvert/--mconvert/--sconvert) ----

  // SINGLE as a conversion target (it has no profile bit; the kernel's
  // BTRFS_AVAIL_ALLOC_BIT_SINGLE).
  static constexpr uint64_t kSingle = 1ull << 48;
  // Lays the chunk at `logical` out anew as `profile` (a profile bit, or
  // kSingle) over the devices with room, at the same logical address and
  // length: new stripes in free device space beside the old ones, every
  // used range copied through the old layout into the new one (RAID5/6
  // with parity), the chunk item (type, stripes, sub_stripes), dev extents,
  // bytes_used and block group item rewritten, the RAID56/RAID1C34 feature
  // set where the new profile needs it. Must be the first change of a
  // transaction; the caller commits. ENOSPC naming the chunk without room.
  Status ConvertChunk(uint64_t logical, uint64_t profile, CopyStats* copied);
  // New chunks of `kind` (DATA, METADATA or SYSTEM) get `profile` (a
  // profile bit or 0 for SINGLE) from now on.
  void AllocateAs(uint64_t kind, uint64_t profile);

  // Takes device `devid` (no stripe left on it) out of the filesystem: its
  // DEV_ITEM (and dev stats item) go, num_devices and total_bytes shrink.
  // Hands the device back for wiping once the commit is written.
  Status RemoveDevice(uint64_t devid, std::unique_ptr<io::BlockDevice>* out);

  // `btrfs replace`, offline: `target` takes the place of device `devid`
  // (present or missing) under the same devid. Every stripe's bytes in use
  // are copied to the same offset on it (from the old device, or made again
  // from the rest of the chunk where it is missing or a read fails), then
  // the volume swaps the devices and the DEV_ITEM and every chunk stripe on
  // it take `uuid`; dev extents and sizes stay. Nothing is changed before
  // the copies are written: until the caller's commit, the committed
  // filesystem still names the old device. Hands the old device (if it
  // was there) back in *old, to scratch its superblocks after the commit.
  // EINVAL when `target` is smaller than the device's total_bytes, or a
  // missing device's chunk in use cannot be rebuilt.
  Status ReplaceDevice(uint64_t devid, std::unique_ptr<io::BlockDevice> target,
                       const std::array<uint8_t, format::kUuidSize>& uuid, CopyStats* copied,
                       std::unique_ptr<io::BlockDevice>* old);

  // DEV_ITEM.total_bytes and the superblock's sizes. EINVAL below the end
  // of the last stripe. The caller commits.
  Status SetDeviceSize(uint64_t bytes);
  // The same for device `devid` of several: its DEV_ITEM.total_bytes, and
  // the superblock's total_bytes by the difference. EINVAL below the end of
  // its last stripe. The caller commits.
  Status SetDeviceSize(uint64_t devid, uint64_t bytes);

 private:
  // EINVAL for a devid the filesystem does not have, naming the ones it has.
  Status NoSuchDevice(uint64_t devid) const;
  uint64_t UsedEnd(uint64_t logical) const;
  bool PlaceOk(const Stripe& s, uint64_t devid, uint64_t to) const;
  // Offsets worth trying for copy `s` on `devid`, in address order: the
  // ends of each free range and the places next to a superblock copy.
  std::set<uint64_t> PlaceCandidates(const Stripe& s, uint64_t devid) const;
  // Superblock ranges of the chunk were stripe `index` at (devid, to) that
  // are not excluded yet.
  std::vector<std::pair<uint64_t, uint64_t>> NewSuperRanges(uint64_t logical, size_t index, uint64_t devid,
                                                            uint64_t to) const;
  std::vector<std::pair<uint64_t, uint64_t>> NewSuperRanges(const alloc::ChunkInfo& layout) const;
  // Whether every superblock range of `layout` not excluded yet is free.
  bool SuperRangesFree(const alloc::ChunkInfo& layout) const;
  std::vector<std::pair<uint64_t, uint64_t>> OtherDevices(uint64_t leaving) const;
  // Devices a stripe may move to when `leaving` goes (FindNewHome's choice).
  std::vector<uint64_t> HomesFor(const Stripe& s, uint64_t leaving) const;
  // Copies what copy `index` of chunk `c` holds in use (RAID5/6: the whole
  // element of every row with used bytes) to `dst` at `to` (where the copy
  // starts there). A copy on a missing device, or one whose read fails, is
  // made again from the rest of the chunk (alloc/stripe_rebuild.h).
  Status CopyStripeBytes(const alloc::ChunkInfo& c, size_t index, io::BlockDevice* dst, uint64_t to,
                         CopyStats* copied);
  // devid 0: the stripe stays on its device.
  Status UpdateChunkItem(uint64_t logical, uint64_t length, size_t index, uint64_t physical, uint64_t devid = 0);
  Status UpdateDevItem();
  // A missing device, which the allocator leaves out, tracked from here
  // with no room (nothing goes there) once a stripe leaves it, so that its
  // DEV_ITEM's bytes_used keeps matching its dev extents until it goes.
  void TrackMissing(uint64_t devid);
  // Device `devid`'s DEV_ITEM as the chunk tree holds it now.
  Result<std::vector<uint8_t>> DevItemBytes(uint64_t devid) const;
  struct RestripePlan {
    std::vector<std::pair<uint64_t, uint64_t>> stripes;  // (devid, physical)
    uint64_t stripe_size = 0;
  };
  Status PlanRestripe(uint64_t logical, uint64_t leaving, RestripePlan* plan) const;
  // Where the chunk at `logical` goes as `profile` over the present devices
  // but `leaving` (0: none): stripes in free space only, the widest layout
  // that has room.
  Status PlanLayout(uint64_t logical, uint64_t profile, uint64_t leaving, RestripePlan* plan) const;
  // Moves the chunk to `plan` (RestripeOff, ConvertChunk); `profile`: the
  // new one (kSingle for SINGLE), 0 to keep it.
  Status Relayout(uint64_t logical, uint64_t profile, const RestripePlan& plan, CopyStats* copied);
  // The one device (resize and --shrink work on single-device images).
  auto& Dev() const;

  TxnManager* txn_;
};

struct RemoveStats {
  uint64_t stripes_moved = 0;
  uint64_t chunks_restriped = 0;
  CopyStats copied;
};
// `ubtrfs device remove` over an open TxnManager: CheckRemovable, every
// stripe off the device (FindNewHome + MoveStripe, or RestripeOff; all
// checked before the first moves; one commit each), RemoveDevice and its
// commit, then the removed device's superblock magic cleared.
Status RemoveDeviceCommitted(TxnManager* txn, uint64_t devid, RemoveStats* stats);

// A device that left the filesystem no longer claims to belong: the magic
// of its superblock copies is cleared (as the kernel's
// btrfs_scratch_superblocks).
Status ScratchSuperblocks(io::BlockDevice& dev);

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_RELOCATE_H_
