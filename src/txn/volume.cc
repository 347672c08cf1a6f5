#include "txn/volume.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "format/checksum.h"
#include "format/superblock.h"
#include "format/key.h"
#include "txn/devices.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Result<std::unique_ptr<Volume>> Volume::Open(std::unique_ptr<io::BlockDevice> dev, const VolumeOptions& options) {
  std::vector<std::unique_ptr<io::BlockDevice>> devs;
  devs.push_back(std::move(dev));
  return Open(std::move(devs), options);
}

Result<std::unique_ptr<Volume>> Volume::Open(std::vector<std::unique_ptr<io::BlockDevice>> devs,
                                             const VolumeOptions& options) {
  if (devs.empty()) return Status::Invalid("no device to open");
  std::unique_ptr<Volume> v(new Volume(options));
  UB_RETURN_IF_ERROR(v->LoadDevices(std::move(devs)));
  UB_RETURN_IF_ERROR(v->CheckFeatures());
  UB_RETURN_IF_ERROR(v->LoadChunks());
  UB_RETURN_IF_ERROR(v->CheckDevices());
  if (options.chunks_only && !options.writable) return v;
  UB_RETURN_IF_ERROR(v->LoadRootTree());
  UB_RETURN_IF_ERROR(v->LoadCsumRoot());
  return v;
}

std::vector<std::unique_ptr<io::BlockDevice>> Volume::TakeDevices(std::unique_ptr<Volume> v) {
  std::vector<std::unique_ptr<io::BlockDevice>> out;
  for (auto& [id, d] : v->devs_->Release()) out.push_back(std::move(d));
  v.reset();
  return out;
}

Status Volume::AddDevice(std::unique_ptr<io::BlockDevice> dev, const format::DevItem& item) {
  const uint64_t devid = item.devid.get();
  auto super_lock = SuperLock();
  if (dev_items_.count(devid)) return Status::Invalid("device " + std::to_string(devid) + " exists already");
  const uint64_t size = dev->Size();
  if (!devs_->Add(devid, std::move(dev))) return Status::Invalid("device " + std::to_string(devid) + " is open already");
  dev_items_[devid] = item;
  chunks_->set_device_size(devid, size);
  return Status::Ok();
}

std::unique_ptr<io::BlockDevice> Volume::RemoveDevice(uint64_t devid) {
  auto super_lock = SuperLock();
  dev_items_.erase(devid);
  std::erase(missing_, devid);
  return devs_->Remove(devid);
}

std::unique_ptr<io::BlockDevice> Volume::ReplaceDevice(uint64_t devid, std::unique_ptr<io::BlockDevice> dev,
                                                       const uint8_t* uuid) {
  auto super_lock = SuperLock();
  std::unique_ptr<io::BlockDevice> old = devs_->Remove(devid);
  const uint64_t size = dev->Size();
  devs_->Add(devid, std::move(dev));
  std::memcpy(dev_items_[devid].uuid, uuid, format::kUuidSize);
  std::erase(missing_, devid);
  chunks_->set_device_size(devid, size);
  return old;
}

format::DevItem* Volume::mutable_dev_item(uint64_t devid) {
  auto it = dev_items_.find(devid);
  return it == dev_items_.end() ? nullptr : &it->second;
}

// A member's DEV_ITEM carries the filesystem's metadata uuid (its fsid when
// it has none: `btrfstune -m` changes the fsid and leaves the items); a
// seed's carries the seed's fsid.
bool Volume::IsSeedDevice(uint64_t devid) const {
  auto it = dev_items_.find(devid);
  return it != dev_items_.end() && std::memcmp(it->second.fsid, MetadataFsid(super_), kFsidSize) != 0;
}

bool Volume::sprouted() const {
  for (const auto& [devid, item] : dev_items_) {
    if (IsSeedDevice(devid)) return true;
  }
  return false;
}

Status Volume::LoadDevices(std::vector<std::unique_ptr<io::BlockDevice>> devs) {
  devs_ = std::make_unique<io::DeviceSet>();
  std::vector<SuperChoice> supers;
  for (size_t i = 0; i < devs.size(); ++i) {
    UB_ASSIGN_OR_RETURN(SuperChoice sc, ReadSuperblock(*devs[i], options_.rescue.super_mirror));
    supers.push_back(sc);
  }
  // The first device that is not a seed names the filesystem (a seed alone
  // is a filesystem of its own); the newest superblock among its members is
  // the one to follow (the kernel's latest_dev). A seed device of another
  // fsid is taken as the seed it was sprouted from; CheckDevices holds it
  // to the sprout's DEV_ITEM.
  auto is_seed = [&](size_t i) { return (supers[i].sb.flags.get() & kSuperFlagSeeding) != 0; };
  size_t named = 0;
  while (named < devs.size() && is_seed(named)) ++named;
  if (named == devs.size()) named = 0;
  const SuperBlock& fs_sb = supers[named].sb;
  size_t best = named;
  auto member = [&](size_t i) { return std::memcmp(supers[i].sb.fsid, fs_sb.fsid, kFsidSize) == 0; };
  for (size_t i = 0; i < devs.size(); ++i) {
    const SuperBlock& sb = supers[i].sb;
    if (!member(i)) {
      if (!is_seed(i)) {
        return Status::Invalid(devs[i]->Name() + " belongs to another filesystem (fsid " + UuidToString(sb.fsid) +
                               ", not " + UuidToString(fs_sb.fsid) + ")");
      }
      Seed& s = seeds_[sb.dev_item.devid.get()];
      std::memcpy(s.fsid.data(), sb.fsid, kFsidSize);
      std::memcpy(s.metadata_fsid.data(), MetadataFsid(sb), kFsidSize);
      continue;
    }
    if (sb.generation.get() > supers[best].sb.generation.get()) best = i;
  }
  for (size_t i = 0; i < devs.size(); ++i) {
    const uint64_t gen = supers[i].sb.generation.get(), newest = supers[best].sb.generation.get();
    if (member(i) && gen < newest) {
      warnings_.push_back(devs[i]->Name() + " (device " + std::to_string(supers[i].sb.dev_item.devid.get()) +
                          ") was last written at generation " + std::to_string(gen) + ", older than " +
                          std::to_string(newest) + ": blocks it holds may be stale (other copies are used)");
    }
  }
  super_ = supers[best].sb;
  committed_super_ = super_;
  super_mirror_ = supers[best].mirror;
  if (!supers[best].warning.empty()) warnings_.push_back(supers[best].warning);
  for (size_t i = 0; i < devs.size(); ++i) {
    const uint64_t devid = supers[i].sb.dev_item.devid.get();
    const std::string name = devs[i]->Name();
    if (devs[i]->Size() < supers[i].sb.dev_item.total_bytes.get()) {
      warnings_.push_back("the device " + (devs.size() > 1 ? name + " " : std::string()) + "is " +
                          std::to_string(devs[i]->Size()) + " bytes, smaller than the " +
                          std::to_string(supers[i].sb.dev_item.total_bytes.get()) +
                          " its superblock records (truncated image?)");
    }
    if (!devs_->Add(devid, std::move(devs[i]))) {
      return Status::Invalid(name + " is device " + std::to_string(devid) + ", which was given already");
    }
  }
  root_tree_ = tree::RootPtr{super_.root.get(), super_.root_level, super_.generation.get(), kRootTreeObjectid};
  chunk_tree_ = tree::RootPtr{super_.chunk_root.get(), super_.chunk_root_level, super_.chunk_root_generation.get(),
                              kChunkTreeObjectid};
  return Status::Ok();
}

Status Volume::CheckFeatures() {
  const uint64_t incompat = super_.incompat_flags.get();
  if (uint64_t extra = incompat & ~kSupportedIncompat) {
    return Status::Unsupported("filesystem features " + IncompatNames(extra));
  }
  if (super_.num_devices.get() == 0) return Status::Corrupt("superblock: num_devices is 0");
  if (devs_->size() > super_.num_devices.get()) {
    return Status::Invalid(std::to_string(devs_->size()) + " devices given, but the filesystem has " +
                           std::to_string(super_.num_devices.get()));
  }
  const uint64_t flags = super_.flags.get();
  if ((flags & kSuperFlagSeeding) && options_.writable) {
    // As the kernel, which mounts a seed read-only: its changes go to a
    // sprouted device (btrfs device add), which ubtrfs does not make.
    return Status::Error(EROFS, "a seed device is read-only (btrfstune -S 0 makes it writable)");
  }
  if (flags & kSuperFlagChangingFsid) {
    // btrfstune -u rewrites every block header: old and new fsids mixed.
    return Status::Unsupported("an fsid change was interrupted on this filesystem (run btrfstune)");
  }
  if (flags & kSuperFlagChangingFsidV2) {
    // btrfstune -m/-M changes the superblocks alone (the blocks keep the
    // metadata uuid): readable as they are, as the kernel mounts it, but
    // not to be written until btrfstune has made the devices agree.
    if (options_.writable) {
      return Status::Unsupported("a metadata_uuid change (btrfstune -m/-M) was interrupted on this filesystem: "
                                 "run it again to finish it; read-only until then");
    }
    warnings_.push_back("a metadata_uuid change (btrfstune -m/-M) was interrupted: read-only until btrfstune "
                        "finishes it");
  }
  // btrfstune marks a conversion it has begun; the kernel refuses such a
  // filesystem (any flag it does not know) until btrfstune finishes.
  if (flags & kSuperFlagChangingBgTree) {
    UB_RETURN_IF_ERROR(RefusedSuperFlag("btrfstune's conversion to the block group tree was interrupted "
                                        "(btrfstune --convert-to-block-group-tree finishes it)"));
  }
  if (flags & (kSuperFlagChangingDataCsum | kSuperFlagChangingMetaCsum)) {
    UB_RETURN_IF_ERROR(
        RefusedSuperFlag("btrfstune's checksum change was interrupted (btrfstune --csum finishes it)"));
  }
  const uint64_t named = kSuperFlagChangingBgTree | kSuperFlagChangingDataCsum | kSuperFlagChangingMetaCsum;
  if (uint64_t unknown = flags & ~kSuperFlagsKnown & ~named) {
    char hex[24];
    std::snprintf(hex, sizeof hex, "%#llx", static_cast<unsigned long long>(unknown));
    UB_RETURN_IF_ERROR(
        RefusedSuperFlag(std::string("superblock flags ") + hex + " (unknown to ubtrfs and to the kernel)"));
  }
  // An image restored from a dump of btrfs-image's first format maps every
  // address one to one through a chunk its superblock alone holds; its
  // chunk tree is not to be read (btrfs-progs skips it), so ubtrfs stops.
  if (flags & kSuperFlagMetadump) {
    return Status::Unsupported("an image restored from an old-format btrfs-image dump (no chunk tree)");
  }
  if (flags & kSuperFlagMetadumpV2) {
    // Trees are whole, file data is not: btrfs-image keeps metadata only.
    warnings_.push_back("restored from a btrfs-image dump: the trees are whole, the file data was not kept "
                        "(reads of it fail their checksums)");
  }
  if (flags & kSuperFlagError) warnings_.push_back("the filesystem was marked as having errors by the kernel");
  if (super_.log_root.get() != 0) {
    warnings_.push_back("a tree log is present (the image was not cleanly unmounted after an fsync): the fsynced "
                        "changes since the last commit are only in the log");
  }
  return Status::Ok();
}

Status Volume::LoadChunks() {
  chunks_ = std::make_unique<alloc::ChunkMap>(devs_->Sizes());
  io_ = std::make_unique<alloc::ChunkIo>(chunks_.get(), devs_.get());
  if (options_.writable && options_.verify_data_csums && CsumSize(csum_type()) != 0) {
    alloc::ChunkIo::DataSums sums;
    sums.sectorsize = sectorsize();
    sums.sum_size = CsumSize(csum_type());
    sums.lookup = [this](uint64_t logical, size_t n, std::vector<uint8_t>* out, std::vector<bool>* present) {
      return LookupCsums(logical, n, out, present);
    };
    sums.matches = [type = csum_type()](std::span<const uint8_t> sector, const uint8_t* sum) {
      return VerifyCsum(type, sector, sum);
    };
    io_->SetDataSums(std::move(sums));
  }
  UB_ASSIGN_OR_RETURN(auto sys, ParseSysChunkArray(super_));
  for (const auto& c : sys) {
    UB_RETURN_IF_ERROR(chunks_->AddChunk(c.key.offset, c.chunk, sectorsize())
                           .WithContext("superblock system chunk array"));
  }
  tree::TreeParams params;
  params.nodesize = nodesize();
  params.csum_type = csum_type();
  std::memcpy(params.fsid, MetadataFsid(super_), kFsidSize);
  for (const auto& [devid, seed] : seeds_) params.seed_fsids.push_back(seed.metadata_fsid);
  reader_ = std::make_unique<tree::BlockReader>(io_.get(), params, options_.node_cache_bytes);
  if (options_.rescue.ignore_meta_csums && !options_.writable) reader_->AcceptBadChecksums();

  tree::Cursor c(reader_.get(), chunk_tree());
  UB_RETURN_IF_ERROR(c.SeekFirst().WithContext("chunk tree"));
  for (; c.Valid(); ) {
    const Key k = c.key();
    if (k.type == kChunkItemKey) {
      UB_RETURN_IF_ERROR(chunks_->AddChunk(k.offset, c.data(), sectorsize()).WithContext("chunk tree"));
    } else if (k.type == kDevItemKey && k.objectid == kDevItemsObjectid) {
      if (c.data().size() < sizeof(DevItem)) return Status::Corrupt("chunk tree: short DEV_ITEM");
      DevItem d;
      std::memcpy(&d, c.data().data(), sizeof d);
      if (d.devid.get() != k.offset) {
        return Status::Corrupt("chunk tree: DEV_ITEM " + KeyToString(k) + " holds devid " +
                               std::to_string(d.devid.get()));
      }
      dev_items_[d.devid.get()] = d;
    }
    UB_RETURN_IF_ERROR(c.Next().WithContext("chunk tree"));
  }
  return Status::Ok();
}

Status Volume::CheckDevices() {
  const uint64_t num = super_.num_devices.get();
  if (dev_items_.size() != num) {
    return Status::Corrupt("the chunk tree lists " + std::to_string(dev_items_.size()) + " device" +
                           (dev_items_.size() == 1 ? "" : "s") + ", the superblock says " + std::to_string(num));
  }
  for (uint64_t devid : devs_->Devids()) {
    if (!dev_items_.count(devid)) {
      return Status::Invalid(devs_->Get(devid)->Name() + " claims to be device " + std::to_string(devid) +
                             ", which the filesystem does not list (a device removed from it?)");
    }
  }
  // A sprouted filesystem lists its seed devices under their own fsid.
  for (const auto& [devid, item] : dev_items_) {
    const bool of_seed = IsSeedDevice(devid);
    auto given = seeds_.find(devid);
    if (given != seeds_.end() && (!of_seed || std::memcmp(item.fsid, given->second.fsid.data(), kFsidSize) != 0)) {
      return Status::Invalid(devs_->Get(devid)->Name() + " is a seed device (fsid " +
                             UuidToString(given->second.fsid.data()) +
                             "), but not the one device " + std::to_string(devid) + " of this filesystem was sprouted from");
    }
    if (!devs_->Has(devid)) {
      missing_.push_back(devid);
      if (of_seed) {
        warnings_.push_back("device " + std::to_string(devid) + " is the seed device this filesystem was sprouted "
                            "from (fsid " + UuidToString(item.fsid) + "): name it with the others (IMG,SEED)");
      }
    }
  }
  for (const auto& [logical, ci] : chunks_->chunks()) {
    for (const alloc::StripeLoc& s : ci.stripes) {
      if (!dev_items_.count(s.devid)) {
        return Status::Corrupt("chunk at logical " + std::to_string(logical) + ": stripe on device " +
                               std::to_string(s.devid) + ", which the chunk tree does not list");
      }
    }
  }
  if (!missing_.empty()) {
    std::string list;
    for (uint64_t d : missing_) list += (list.empty() ? "" : ", ") + std::to_string(d);
    const std::string what = "device" + std::string(missing_.size() > 1 ? "s " : " ") + list + " of " +
                             std::to_string(num) + (missing_.size() > 1 ? " are" : " is") + " missing";
    if (options_.writable && !options_.degraded) {
      return Status::Error(ENODEV, what + ": a degraded filesystem is opened for writing only when asked "
                                          "(-o degraded; OpenOptions::degraded)");
    }
    warnings_.push_back(what + " (degraded): reads use the other copies or parity");
  }
  return Status::Ok();
}

tree::RootPtr Volume::chunk_tree() const { return chunk_tree_; }

Result<Volume::TreeRoot> Volume::FindRoot(uint64_t objectid) {
  UB_ASSIGN_OR_RETURN(TreeRoot * r, MutableRoot(objectid));
  std::lock_guard<std::mutex> lock(roots_mu_);
  return *r;
}

Result<Volume::TreeRoot*> Volume::MutableRoot(uint64_t objectid, bool even_deleted) {
  {
    std::lock_guard<std::mutex> lock(roots_mu_);
    auto it = roots_.find(objectid);
    if (it != roots_.end()) {
      if (it->second.deleted && !even_deleted) return Status::NotFound("tree " + std::to_string(objectid) + " was deleted");
      return &it->second;
    }
  }
  tree::Cursor c(source(), root_tree());
  UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{objectid, kRootItemKey, UINT64_MAX}).WithContext("root tree"));
  if (!c.Valid() || c.key().objectid != objectid || c.key().type != kRootItemKey) {
    return Status::NotFound("tree " + std::to_string(objectid) + " has no ROOT_ITEM");
  }
  TreeRoot r;
  auto d = c.data();
  if (d.size() < kRootItemV1Size) {
    return Status::Corrupt("ROOT_ITEM of tree " + std::to_string(objectid) + " is " + std::to_string(d.size()) +
                           " bytes, shorter than " + std::to_string(kRootItemV1Size));
  }
  std::memcpy(&r.item, d.data(), std::min(d.size(), sizeof(RootItem)));
  r.item_key = c.key();
  r.item_size = static_cast<uint32_t>(d.size());
  r.ref = tree::RootPtr{r.item.bytenr.get(), r.item.level, r.item.generation.get(), objectid};
  if (r.ref.level >= kMaxLevel) {
    return Status::Corrupt("ROOT_ITEM of tree " + std::to_string(objectid) + ": level " + std::to_string(r.ref.level));
  }
  const bool subvol = IsSubvolumeTree(objectid);
  r.deleted = subvol && r.item.refs.get() == 0;
  std::lock_guard<std::mutex> lock(roots_mu_);
  TreeRoot* e = &roots_.emplace(objectid, r).first->second;
  if (e->deleted && !even_deleted) return Status::NotFound("tree " + std::to_string(objectid) + " is being deleted");
  return e;
}

std::vector<uint64_t> Volume::LoadedRoots() {
  std::lock_guard<std::mutex> lock(roots_mu_);
  std::vector<uint64_t> out;
  for (auto& [id, r] : roots_) {
    if (!r.deleted) out.push_back(id);
  }
  return out;
}

// Each device's superblock carries its own DEV_ITEM, as the kernel's
// write_all_supers fills it in.
SuperBlock Volume::SuperFor(const SuperBlock& base, uint64_t devid) const {
  SuperBlock sb = base;
  if (auto it = dev_items_.find(devid); it != dev_items_.end()) {
    const DevItem& d = it->second;
    sb.dev_item.devid = d.devid.get();
    sb.dev_item.total_bytes = d.total_bytes.get();
    sb.dev_item.bytes_used = d.bytes_used.get();
    sb.dev_item.io_align = d.io_align.get();
    sb.dev_item.io_width = d.io_width.get();
    sb.dev_item.sector_size = d.sector_size.get();
    sb.dev_item.type = d.type.get();
    sb.dev_item.generation = 0;
    std::memcpy(sb.dev_item.uuid, d.uuid, kUuidSize);
    std::memcpy(sb.dev_item.fsid, d.fsid, kUuidSize);
  }
  return sb;
}

Status Volume::WriteSuperCopy(io::BlockDevice* dev, SuperBlock sb, int mirror) {
  const uint64_t off = SuperblockOffset(mirror);
  std::vector<uint8_t> buf(kSuperInfoSize);
  sb.bytenr = off;
  std::memcpy(buf.data(), &sb, kSuperInfoSize);
  CsumBytes c = ComputeCsum(csum_type(), std::span<const uint8_t>(buf).subspan(kCsumSize));
  std::memcpy(buf.data(), c.data(), kCsumSize);
  return dev->WriteAt(off, buf);
}

Volume::SealedSupers Volume::SealSuperblocks() {
  super_.root = root_tree_.bytenr;
  super_.root_level = static_cast<uint8_t>(root_tree_.level);
  super_.chunk_root = chunk_tree_.bytenr;
  super_.chunk_root_level = static_cast<uint8_t>(chunk_tree_.level);
  super_.chunk_root_generation = chunk_tree_.generation;
  SealedSupers out;
  for (uint64_t devid : devs_->Devids()) {
    if (IsSeedDevice(devid)) continue;
    out.per_device.emplace_back(devid, SuperFor(super_, devid));
    if (devid == super_.dev_item.devid.get()) super_.dev_item = out.per_device.back().second.dev_item;
  }
  super_.bytenr = SuperblockOffset(0);
  out.committed = super_;
  return out;
}

Status Volume::WriteSealedSuperblocks(const SealedSupers& s) {
  for (const auto& [devid, sb] : s.per_device) {
    io::BlockDevice* dev = devs_->Get(devid);
    if (dev == nullptr) continue;  // gone meanwhile: device removal takes SuperLock()
    for (int mirror = 0; mirror < kSuperMirrorMax; ++mirror) {
      if (SuperblockOffset(mirror) + kSuperInfoSize > dev->Size()) break;
      UB_RETURN_IF_ERROR(WriteSuperCopy(dev, sb, mirror));
    }
  }
  committed_super_ = s.committed;
  return Status::Ok();
}

Status Volume::WriteSuperblocks() { return WriteSealedSuperblocks(SealSuperblocks()); }

Status Volume::WriteLogSuperblock(uint64_t log_root, uint8_t log_root_level) {
  SuperBlock base = committed_super_;
  base.log_root = log_root;
  base.log_root_level = log_root_level;
  for (uint64_t devid : devs_->Devids()) {
    if (IsSeedDevice(devid)) continue;
    UB_RETURN_IF_ERROR(WriteSuperCopy(devs_->Get(devid), SuperFor(base, devid), 0)
                           .WithContext("writing the tree log's superblock"));
  }
  return Status::Ok();
}

Status Volume::LookupCsums(uint64_t logical, size_t nsectors, std::vector<uint8_t>* csums,
                           std::vector<bool>* present) {
  const size_t csize = CsumSize(csum_type());
  const uint32_t ss = sectorsize();
  csums->assign(nsectors * csize, 0);
  present->assign(nsectors, false);
  if (csum_tree_ignored_) return Status::Ok();
  // In a running transaction, writes add checksums from other threads:
  // follow the csum tree writer's root.
  Result<tree::RootPtr> csum_root = Status::Ok();
  if (live_roots_) {
    csum_root = live_roots_(kCsumTreeObjectid);
  } else if (auto r = FindRoot(kCsumTreeObjectid); r.ok()) {
    csum_root = r->ref;
  } else {
    csum_root = r.status();
  }
  if (!csum_root.ok()) return csum_root.status().code() == ENOENT ? Status::Ok() : csum_root.status();
  const tree::RootPtr root = *csum_root;
  const uint64_t end = logical + uint64_t{nsectors} * ss;
  tree::Cursor c(source(), root);
  UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{kExtentCsumObjectid, kExtentCsumKey, logical}).WithContext("csum tree"));
  if (!c.Valid()) UB_RETURN_IF_ERROR(c.Seek(Key{kExtentCsumObjectid, kExtentCsumKey, logical}).WithContext("csum tree"));
  for (; c.Valid(); ) {
    const Key k = c.key();
    if (k.objectid == kExtentCsumObjectid && k.type == kExtentCsumKey) {
      if (k.offset >= end) break;
      auto d = c.data();
      if (d.size() % csize != 0) {
        return Status::Corrupt("csum tree: item " + KeyToString(k) + " size " + std::to_string(d.size()) +
                               " is not a multiple of " + std::to_string(csize));
      }
      const uint64_t item_end = k.offset + (d.size() / csize) * uint64_t{ss};
      const uint64_t from = std::max(k.offset, logical), to = std::min(item_end, end);
      for (uint64_t a = from; a < to; a += ss) {
        if ((a - k.offset) % ss != 0) break;  // misaligned item: leave unverified
        size_t dst = (a - logical) / ss, src = (a - k.offset) / ss;
        std::memcpy(csums->data() + dst * csize, d.data() + src * csize, csize);
        (*present)[dst] = true;
      }
    } else if (k.objectid > kExtentCsumObjectid || (k.objectid == kExtentCsumObjectid && k.type > kExtentCsumKey)) {
      break;
    }
    UB_RETURN_IF_ERROR(c.Next().WithContext("csum tree"));
  }
  return Status::Ok();
}

namespace {

struct MappedCheck {
  const uint8_t* data;
  size_t nsectors;
  uint32_t sectorsize;
  uint16_t csum_type;
  const uint8_t* csums;
  const std::vector<bool>* present;
};

// Runs under io::TouchMapped: reads the map, allocates nothing.
bool MappedSectorsMatch(const void* ctx) {
  const auto& c = *static_cast<const MappedCheck*>(ctx);
  const size_t csize = CsumSize(c.csum_type);
  for (size_t i = 0; i < c.nsectors; ++i) {
    // The map's pages come cold from memory, and the CPU's own prefetchers
    // stop at each page's end: asking for the next sector's lines while
    // this one is summed halves the loop's time (crc32c over 1 GiB of a
    // file in the page cache, 1 MiB maps: 0.18 -> 0.08 s on the machine of
    // docs/BENCHMARKS.md's session 51). A prefetch never faults, so the
    // SIGBUS guard stays the only way out.
    if (i + 1 < c.nsectors) {
      const uint8_t* next = c.data + (i + 1) * c.sectorsize;
      for (uint32_t line = 0; line < c.sectorsize; line += 64) __builtin_prefetch(next + line);
    }
    if ((*c.present)[i] && !VerifyCsum(c.csum_type, std::span(c.data + i * c.sectorsize, c.sectorsize),
                                       c.csums + i * csize)) {
      return false;
    }
  }
  return true;
}

}  // namespace

Result<io::MappedBytes> Volume::MapData(uint64_t logical, size_t len, bool verify) {
  const uint32_t ss = sectorsize();
  if (logical % ss != 0 || len % ss != 0 || len == 0) return io::MappedBytes();
  const alloc::ChunkInfo* chunk = chunks_->Find(logical);
  if (chunk == nullptr || !(chunk->type & kBlockGroupData) || len > chunk->logical + chunk->length - logical) {
    return io::MappedBytes();
  }
  io::MappedBytes m = io_->MapForRead(logical, len);
  if (m.empty() || !verify) return m;
  std::vector<uint8_t> csums;
  std::vector<bool> present;
  const size_t nsectors = len / ss;
  UB_RETURN_IF_ERROR(LookupCsums(logical, nsectors, &csums, &present));
  const MappedCheck check{m.bytes().data(), nsectors, ss, csum_type(), csums.data(), &present};
  auto ok = io::TouchMapped(MappedSectorsMatch, &check);
  if (!ok.ok() || !*ok) return io::MappedBytes();
  return m;
}

Status Volume::ReadData(uint64_t logical, std::span<uint8_t> out, bool verify) {
  const uint32_t ss = sectorsize();
  const std::string where = "data at logical " + std::to_string(logical);
  if (logical % ss != 0 || out.size() % ss != 0) return Status::Invalid(where + ": unaligned read");
  if (out.empty()) return Status::Ok();
  const alloc::ChunkInfo* chunk = chunks_->Find(logical);
  if (chunk == nullptr) return Status::Corrupt("logical address " + std::to_string(logical) + " is not in any chunk");
  if (out.size() > chunk->logical + chunk->length - logical) {
    return Status::Corrupt("range [" + std::to_string(logical) + ", +" + std::to_string(out.size()) +
                           ") crosses the end of chunk " + std::to_string(chunk->logical));
  }
  if (!(chunk->type & kBlockGroupData)) return Status::Corrupt(where + ": not in a DATA chunk");
  std::vector<uint8_t> csums;
  std::vector<bool> present;
  const size_t nsectors = out.size() / ss;
  if (verify) UB_RETURN_IF_ERROR(LookupCsums(logical, nsectors, &csums, &present));
  const size_t csize = CsumSize(csum_type());
  const int mirrors = io_->NumMirrors(logical);
  // The whole range from the first mirror; then each sector that failed
  // from the next ones, so two copies bad in different places still read.
  std::vector<size_t> bad;
  Status first_error = io_->Read(logical, out, 0);
  if (!first_error.ok()) {
    for (size_t i = 0; i < nsectors; ++i) bad.push_back(i);
  } else if (verify) {
    for (size_t i = 0; i < nsectors; ++i) {
      if (present[i] && !VerifyCsum(csum_type(), out.subspan(i * ss, ss), csums.data() + i * csize)) {
        if (first_error.ok()) {
          first_error = Status::IoError("data checksum mismatch at logical " + std::to_string(logical + i * ss) +
                                        " (copy 0)");
        }
        bad.push_back(i);
      }
    }
  }
  if (bad.empty()) return Status::Ok();
  // A missing device fails the whole range at once: retry it whole first.
  if (mirrors > 1 && bad.size() == nsectors) {
    for (int m = 1; m < mirrors; ++m) {
      if (!io_->Read(logical, out, m).ok()) continue;
      std::vector<size_t> still;
      for (size_t i : bad) {
        if (verify && present[i] && !VerifyCsum(csum_type(), out.subspan(i * ss, ss), csums.data() + i * csize)) {
          still.push_back(i);
        }
      }
      bad = std::move(still);
      break;
    }
  }
  for (size_t i : bad) {
    std::span<uint8_t> sector = out.subspan(i * ss, ss);
    Status st = first_error;
    for (int m = 1; m < mirrors; ++m) {
      st = io_->Read(logical + i * ss, sector, m);
      if (st.ok() && verify && present[i] && !VerifyCsum(csum_type(), sector, csums.data() + i * csize)) {
        st = Status::IoError("data checksum mismatch at logical " + std::to_string(logical + i * ss) + " (copy " +
                             std::to_string(m) + ")");
      }
      if (st.ok()) break;
    }
    if (!st.ok()) return first_error;
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
