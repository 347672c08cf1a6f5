#include "fs/statfs.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <functional>
#include <string>

#include "format/ondisk.h"
#include "tree/cursor.h"
#include "txn/chunk_alloc.h"
#include "txn/transaction.h"
#include "txn/volume.h"

namespace ubtrfs::fsimpl {

using namespace ubtrfs::format;

namespace {

constexpr uint64_t kStripeLen = 64 * 1024;          // the unit chunks are cut in
constexpr uint64_t kDeviceReserved = 1ull << 20;    // the start of a device no chunk takes
constexpr uint64_t kMetadataFullMargin = 4ull << 20;
constexpr uint64_t kGlobalReserveCap = 512ull << 20;
constexpr uint64_t kUnlinkItems = 6;                // orphan, dir item, dir index, inode ref, inode, parent

// The profiles in the kernel's order of its raid table (the statfs factor is
// the one of the last profile in this order that has a data block group).
struct Profile {
  uint64_t flag;         // 0 for single
  unsigned devs_min;
  unsigned dev_stripes;  // stripes of one chunk on one device
  unsigned ncopies;
};
constexpr std::array<Profile, 9> kProfiles = {{
    {kBlockGroupRaid10, 2, 1, 2},
    {kBlockGroupRaid1, 2, 1, 2},
    {kBlockGroupDup, 1, 2, 2},
    {kBlockGroupRaid0, 1, 1, 1},
    {0, 1, 1, 1},
    {kBlockGroupRaid5, 2, 1, 1},
    {kBlockGroupRaid6, 3, 1, 1},
    {kBlockGroupRaid1c3, 3, 1, 3},
    {kBlockGroupRaid1c4, 4, 1, 4},
}};

const Profile& ProfileOf(uint64_t flags) {
  const uint64_t p = flags & kBlockGroupProfileMask;
  for (const Profile& r : kProfiles) {
    if (r.flag != 0 && (p & r.flag)) return r;
  }
  return kProfiles[4];
}

size_t IndexOf(const Profile& p) { return static_cast<size_t>(&p - kProfiles.data()); }

// The profile a new data chunk gets: of the profiles data block groups have,
// the most redundant one that the writable devices allow; single when none
// (read-only devices allow none).
const Profile& DataAllocProfile(const StatFsInput& in) {
  uint64_t have = 0;
  for (const StatFsGroup& g : in.groups) {
    if (g.flags & kBlockGroupData) have |= g.flags & kBlockGroupProfileMask;
  }
  const size_t rw_devices = in.devices_writable ? in.devices.size() : 0;
  uint64_t allowed = 0;
  for (const Profile& r : kProfiles) {
    if (rw_devices >= r.devs_min) allowed |= r.flag;
  }
  allowed &= have;
  for (uint64_t pick : {kBlockGroupRaid1c4, kBlockGroupRaid6, kBlockGroupRaid1c3, kBlockGroupRaid5,
                        kBlockGroupRaid10, kBlockGroupRaid1, kBlockGroupDup, kBlockGroupRaid0}) {
    if (allowed & pick) return ProfileOf(pick);
  }
  return kProfiles[4];
}

// Device space new data chunks could still take, counting every copy.
uint64_t UnallocatedDataSpace(const StatFsInput& in) {
  const Profile& p = DataAllocProfile(in);
  const uint64_t flag = p.flag;
  size_t stripes = 1;
  if (flag == kBlockGroupRaid0) {
    stripes = in.devices.size();
  } else if (flag == kBlockGroupRaid1 || flag == kBlockGroupRaid1c3 || flag == kBlockGroupRaid1c4) {
    stripes = p.ncopies;
  } else if (flag == kBlockGroupRaid10) {
    stripes = 4;
  }
  const uint64_t min_stripe = uint64_t{p.dev_stripes} * kStripeLen;

  std::vector<uint64_t> room;
  for (const StatFsDevice& d : in.devices) {
    uint64_t r = d.total_bytes > d.bytes_used ? d.total_bytes - d.bytes_used : 0;
    r -= r % kStripeLen;
    if (r <= kDeviceReserved + min_stripe) continue;
    room.push_back(r - kDeviceReserved);
  }
  std::sort(room.begin(), room.end(), std::greater<>());

  // From the device with the least room up: a chunk striped over it and
  // the next larger ones, as long as the profile has enough devices.
  uint64_t total = 0;
  size_t n = room.size();
  while (n >= p.devs_min && n > 0) {
    const size_t i = n - 1;
    stripes = std::min(stripes, n);
    if (room[i] >= min_stripe) {
      const uint64_t take = room[i];
      total += take * stripes;
      for (size_t j = i + 1 - stripes; j <= i; ++j) room[j] -= take;
    }
    --n;
  }
  return total;
}

}  // namespace

uint64_t KernelGlobalReserve(const StatFsInput& in) {
  const uint64_t per_item = uint64_t{in.nodesize} * kMaxLevel * 2;  // a path's worth of COW, split included
  const uint64_t items = in.reserve_trees + kUnlinkItems;
  const uint64_t delayed_refs = per_item * kUnlinkItems * (in.free_space_tree ? 2 : 1);
  const uint64_t floor = per_item * items + delayed_refs;
  return std::min(std::max(in.reserve_tree_bytes, floor), kGlobalReserveCap);
}

StatFsFigures KernelStatFs(const StatFsInput& in) {
  StatFsFigures f;
  const unsigned bits = static_cast<unsigned>(__builtin_ctz(in.sectorsize ? in.sectorsize : 4096));
  uint64_t disk_used = 0, free_data = 0, free_meta = 0;
  bool mixed = false;
  size_t data_profile = 0;
  bool have_data = false;
  for (const StatFsGroup& g : in.groups) {
    const Profile& p = ProfileOf(g.flags);
    const uint64_t used = std::min(g.used, g.length);
    disk_used += used * p.ncopies;
    if (g.flags & kBlockGroupData) {
      // On read-only devices every block group is read-only: no free space.
      if (in.devices_writable && !g.read_only) free_data += (g.length - used) * p.ncopies;
      data_profile = have_data ? std::max(data_profile, IndexOf(p)) : IndexOf(p);
      have_data = true;
    }
    if (g.flags & kBlockGroupMetadata) {
      if (g.flags & kBlockGroupData) {
        mixed = true;
      } else {
        free_meta += (g.length - used) * p.ncopies;
      }
    }
  }
  const uint64_t factor = have_data ? kProfiles[data_profile].ncopies : 1;
  f.global_reserve = KernelGlobalReserve(in);

  f.blocks = (in.super_total_bytes / factor) >> bits;
  const uint64_t used_blocks = (disk_used / factor) >> bits;
  f.bfree = f.blocks > used_blocks ? f.blocks - used_blocks : 0;
  const uint64_t reserve_blocks = f.global_reserve >> bits;
  f.bfree = f.bfree >= reserve_blocks ? f.bfree - reserve_blocks : 0;

  f.bavail = (free_data / factor + UnallocatedDataSpace(in) / factor) >> bits;
  if (!mixed && in.metadata_full &&
      (free_meta < kMetadataFullMargin || free_meta - kMetadataFullMargin < f.global_reserve)) {
    f.bavail = 0;
  }
  return f;
}

namespace {

// The trees the global reserve covers, and their bytes.
Status AddReserveTrees(txn::Volume& vol, StatFsInput* in) {
  const SuperBlock& sb = vol.super();
  std::vector<uint64_t> ids = {kExtentTreeObjectid, kCsumTreeObjectid};
  if (sb.compat_ro_flags.get() & kCompatRoFreeSpaceTree) ids.push_back(kFreeSpaceTreeObjectid);
  if (sb.compat_ro_flags.get() & kCompatRoBlockGroupTree) ids.push_back(kBlockGroupTreeObjectid);
  in->reserve_trees = 1;  // the tree root: a mount starts counting its bytes at 0
  in->reserve_tree_bytes = 0;
  for (uint64_t id : ids) {
    auto r = vol.FindRoot(id);
    if (!r.ok()) {
      if (r.status().code() == ENOENT) continue;  // no such tree
      return r.status();
    }
    in->reserve_tree_bytes += r->item.bytes_used.get();
    ++in->reserve_trees;
  }
  in->free_space_tree = sb.compat_ro_flags.get() & kCompatRoFreeSpaceTree;
  return Status::Ok();
}

StatFsInput BaseInput(txn::Volume& vol) {
  StatFsInput in;
  in.sectorsize = vol.sectorsize();
  in.nodesize = vol.nodesize();
  in.super_total_bytes = vol.super().total_bytes.get();
  return in;
}

}  // namespace

Result<StatFsInput> StatFsInputFromVolume(txn::Volume& vol) {
  StatFsInput in = BaseInput(vol);
  const SuperBlock& sb = vol.super();
  const uint64_t bg_tree =
      (sb.compat_ro_flags.get() & kCompatRoBlockGroupTree) ? kBlockGroupTreeObjectid : kExtentTreeObjectid;
  UB_ASSIGN_OR_RETURN(auto bgt, vol.FindRoot(bg_tree));
  tree::Cursor c(vol.source(), bgt.ref);
  for (const auto& [logical, chunk] : vol.chunks().chunks()) {
    StatFsGroup g;
    g.flags = chunk.type & (kBlockGroupTypeMask | kBlockGroupProfileMask);
    g.length = chunk.length;
    for (const alloc::StripeLoc& st : chunk.stripes) g.read_only |= vol.IsSeedDevice(st.devid);
    const Key k{logical, kBlockGroupItemKey, chunk.length};
    UB_RETURN_IF_ERROR(c.Seek(k));
    if (c.Valid() && c.key() == k && c.data().size() >= sizeof(BlockGroupItem)) {
      g.used = reinterpret_cast<const BlockGroupItem*>(c.data().data())->used.get();
    }
    in.groups.push_back(g);
  }
  const auto& missing = vol.missing_devices();
  for (const auto& [devid, item] : vol.dev_items()) {
    if (std::find(missing.begin(), missing.end(), devid) != missing.end() || vol.IsSeedDevice(devid)) continue;
    in.devices.push_back({item.total_bytes.get(), item.bytes_used.get()});
  }
  UB_RETURN_IF_ERROR(AddReserveTrees(vol, &in));
  return in;
}

Result<StatFsInput> StatFsInputFromTxn(txn::TxnManager& txn) {
  txn::Volume& vol = *txn.volume();
  StatFsInput in = BaseInput(vol);
  {
    auto lock = txn.AllocLock();
    txn.space().ForEachGroup([&](const alloc::BlockGroup& g) {
      // Pinned space (freed by the running transaction) is not used: the
      // kernel drops it from a group's used bytes when it frees it.
      const uint64_t excluded = txn.ExcludedIn(g.start());
      in.groups.push_back(
          {g.flags(), g.length(), g.used_bytes() > excluded ? g.used_bytes() - excluded : 0, g.read_only()});
    });
    for (auto [total, used] : txn.chunk_alloc().DeviceUsage()) in.devices.push_back({total, used});
    // The kernel learns that metadata cannot grow when a chunk allocation
    // fails; here: no device hole could hold a (DUP) metadata chunk.
    uint64_t largest_hole = 0;
    for (auto [start, len] : txn.chunk_alloc().FreeDeviceRanges()) largest_hole = std::max(largest_hole, len);
    in.metadata_full = largest_hole < 2 * txn::ChunkAllocator::kStripeLen;
  }
  UB_RETURN_IF_ERROR(AddReserveTrees(vol, &in));
  return in;
}

FsStat ToFsStat(const StatFsInput& in, const StatFsFigures& f) {
  FsStat s;
  s.block_size = in.sectorsize;
  s.node_size = in.nodesize;
  s.total_bytes = f.blocks * in.sectorsize;
  s.free_bytes = f.bfree * in.sectorsize;
  s.avail_bytes = f.bavail * in.sectorsize;
  for (const StatFsGroup& g : in.groups) s.used_bytes += std::min(g.used, g.length);
  return s;
}

}  // namespace ubtrfs::fsimpl
