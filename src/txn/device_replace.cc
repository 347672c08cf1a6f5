// Device replace, offline (`ubtrfs device replace`, the kernel's `btrfs
// replace start`): a new device takes an old one's devid and stripes. The
// kernel copies while the filesystem runs, mirroring new writes to both
// devices until it swaps them; offline, nothing else writes, so the copy
// comes first and one commit swaps them.
#include <cstring>

#include "alloc/stripe_rebuild.h"
#include "format/key.h"
#include "txn/chunk_alloc.h"
#include "txn/relocate.h"
#include "txn/transaction.h"
#include "txn/volume.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Status DeviceLayout::ReplaceDevice(uint64_t devid, std::unique_ptr<io::BlockDevice> target,
                                   const std::array<uint8_t, kUuidSize>& uuid, CopyStats* copied,
                                   std::unique_ptr<io::BlockDevice>* old) {
  Volume* vol = txn_->vol_;
  const auto item = vol->dev_items().find(devid);
  if (item == vol->dev_items().end()) return NoSuchDevice(devid);
  if (vol->IsSeedDevice(devid)) return Status::Unsupported("replacing a seed device");
  const uint64_t need = item->second.total_bytes.get();
  if (target->Size() < need) {
    return Status::Invalid(target->Name() + " has " + std::to_string(target->Size()) + " bytes; device " +
                           std::to_string(devid) + " has " + std::to_string(need) +
                           ": the new device must be at least as large (shrink the old one first)");
  }
  std::vector<Stripe> on;
  for (const Stripe& s : Stripes()) {
    if (s.devid == devid) on.push_back(s);
  }
  for (const Stripe& s : on) UB_RETURN_IF_ERROR(CheckRebuildable(s));

  // The bytes, each stripe at its own offset: the dev extents stay.
  for (const Stripe& s : on) {
    const alloc::ChunkInfo* ci = vol->chunks().Find(s.logical);
    if (!ci) return Status::Corrupt("no chunk at " + std::to_string(s.logical));
    UB_RETURN_IF_ERROR(CopyStripeBytes(*ci, s.index, target.get(), s.physical, copied)
                           .WithContext("copying stripe " + std::to_string(s.index) + " of chunk " +
                                        std::to_string(s.logical) + " to the new device"));
  }
  UB_RETURN_IF_ERROR(target->Flush());

  // The swap: the volume's device, the DEV_ITEM's uuid, and every chunk
  // stripe's dev_uuid (the kernel matches stripes to devices by both).
  *old = vol->ReplaceDevice(devid, std::move(target), uuid.data());
  if (auto it = txn_->chunk_alloc_->devs_.find(devid); it != txn_->chunk_alloc_->devs_.end()) {
    std::memcpy(it->second.item.uuid, uuid.data(), kUuidSize);  // new chunks' stripes name it
  }
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * chunk_w, txn_->Writer(kChunkTreeObjectid));
  UB_ASSIGN_OR_RETURN(std::vector<uint8_t> dev_item, DevItemBytes(devid));
  std::memcpy(reinterpret_cast<DevItem*>(dev_item.data())->uuid, uuid.data(), kUuidSize);
  UB_RETURN_IF_ERROR(chunk_w->Update(Key{kDevItemsObjectid, kDevItemKey, devid}, dev_item));
  for (const Stripe& s : on) {
    const alloc::ChunkInfo* ci = vol->chunks().Find(s.logical);
    UB_RETURN_IF_ERROR(UpdateChunkItem(s.logical, ci->length, s.index, s.physical, devid));
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
