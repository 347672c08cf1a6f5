#include "txn/volume.h"

#include <algorithm>
#include <cstring>

#include "format/checksum.h"
#include "format/superblock.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Result<std::unique_ptr<Volume>> Volume::Open(std::unique_ptr<io::BlockDevice> dev, const VolumeOptions& options) {
  std::unique_ptr<Volume> v(new Volume(std::move(dev), options));
  UB_RETURN_IF_ERROR(v->LoadSuperblock());
  UB_RETURN_IF_ERROR(v->CheckFeatures());
  UB_RETURN_IF_ERROR(v->LoadChunks());
  auto csum = v->FindRoot(kCsumTreeObjectid);
  if (!csum.ok() && csum.status().code() != ENOENT) return csum.status();
  if (!csum.ok()) v->warnings_.push_back("the csum tree is missing: file data cannot be verified");
  if (v->dev_->Size() < v->super_.dev_item.total_bytes.get()) {
    v->warnings_.push_back("the device is " + std::to_string(v->dev_->Size()) + " bytes, smaller than the " +
                           std::to_string(v->super_.dev_item.total_bytes.get()) + " its superblock records (truncated image?)");
  }
  return v;
}

Status Volume::LoadSuperblock() {
  std::vector<std::string> problems;
  std::vector<uint8_t> buf(kSuperInfoSize);
  int best = -1;
  uint64_t best_gen = 0;
  SuperBlock best_sb{};
  for (int mirror = 0; mirror < kSuperMirrorMax; ++mirror) {
    const uint64_t off = SuperblockOffset(mirror);
    if (off + kSuperInfoSize > dev_->Size()) {
      if (mirror == 0) {
        problems.push_back("primary superblock at 65536: device is only " + std::to_string(dev_->Size()) + " bytes");
      }
      break;
    }
    Status st = dev_->ReadAt(off, buf);
    if (st.ok()) st = ValidateSuperblock(buf, off);
    if (!st.ok()) {
      problems.push_back((mirror == 0 ? "primary " : "copy " + std::to_string(mirror) + " ") + st.message());
      continue;
    }
    SuperBlock sb;
    std::memcpy(&sb, buf.data(), sizeof sb);
    if (mirror == 0) {
      best = 0;
      best_sb = sb;
      break;  // a valid primary always wins, as in the kernel
    }
    if (best < 0 || sb.generation.get() > best_gen) {
      best = mirror;
      best_gen = sb.generation.get();
      best_sb = sb;
    }
  }
  if (best < 0) {
    std::string msg = dev_->Name() + ": no valid btrfs superblock";
    for (const auto& p : problems) msg += "; " + p;
    // A checksum type we do not know is not damage: say unsupported.
    if (!problems.empty() && problems.front().find("unsupported: ") != std::string::npos) {
      return Status::Error(EOPNOTSUPP, msg);
    }
    return Status::Corrupt(msg);
  }
  super_ = best_sb;
  committed_super_ = best_sb;
  super_mirror_ = best;
  root_tree_ = tree::RootPtr{super_.root.get(), super_.root_level, super_.generation.get(), kRootTreeObjectid};
  chunk_tree_ = tree::RootPtr{super_.chunk_root.get(), super_.chunk_root_level, super_.chunk_root_generation.get(),
                              kChunkTreeObjectid};
  if (best > 0) {
    warnings_.push_back(problems.front() + "; using superblock copy " + std::to_string(best) + " at offset " +
                        std::to_string(SuperblockOffset(best)) + " (generation " +
                        std::to_string(super_.generation.get()) + ")");
  }
  return Status::Ok();
}

Status Volume::CheckFeatures() {
  const uint64_t incompat = super_.incompat_flags.get();
  if (uint64_t extra = incompat & ~kSupportedIncompat) {
    return Status::Unsupported("filesystem features " + IncompatNames(extra));
  }
  if (super_.num_devices.get() != 1) {
    return Status::Unsupported("multi-device filesystem (" + std::to_string(super_.num_devices.get()) +
                               " devices); only single-device images can be opened");
  }
  const uint64_t flags = super_.flags.get();
  if (flags & kSuperFlagSeeding) return Status::Unsupported("seed device");
  if (flags & (kSuperFlagChangingFsid | kSuperFlagChangingFsidV2)) {
    return Status::Unsupported("an fsid change was interrupted on this filesystem (run btrfstune)");
  }
  if (flags & (kSuperFlagMetadump | kSuperFlagMetadumpV2)) {
    return Status::Unsupported("btrfs-image metadump (restore it with btrfs-image -r first)");
  }
  if (flags & kSuperFlagError) warnings_.push_back("the filesystem was marked as having errors by the kernel");
  if (super_.log_root.get() != 0) {
    warnings_.push_back("a tree log is present (the image was not cleanly unmounted after an fsync): the fsynced "
                        "changes since the last commit are only in the log");
  }
  return Status::Ok();
}

Status Volume::LoadChunks() {
  chunks_ = std::make_unique<alloc::ChunkMap>(super_.dev_item.devid.get(), dev_->Size());
  UB_ASSIGN_OR_RETURN(auto sys, ParseSysChunkArray(super_));
  for (const auto& c : sys) {
    UB_RETURN_IF_ERROR(chunks_->AddChunk(c.key.offset, c.chunk, sectorsize())
                           .WithContext("superblock system chunk array"));
  }
  tree::TreeParams params;
  params.nodesize = nodesize();
  params.csum_type = csum_type();
  std::memcpy(params.fsid, MetadataFsid(super_), kFsidSize);
  reader_ = std::make_unique<tree::BlockReader>(dev_.get(), chunks_.get(), params, options_.node_cache_bytes);

  tree::Cursor c(reader_.get(), chunk_tree());
  UB_RETURN_IF_ERROR(c.SeekFirst().WithContext("chunk tree"));
  for (; c.Valid(); ) {
    const Key k = c.key();
    if (k.type == kChunkItemKey) {
      UB_RETURN_IF_ERROR(chunks_->AddChunk(k.offset, c.data(), sectorsize()).WithContext("chunk tree"));
    } else if (k.type == kDevItemKey && k.objectid == kDevItemsObjectid) {
      if (c.data().size() < sizeof(DevItem)) return Status::Corrupt("chunk tree: short DEV_ITEM");
      const auto* d = reinterpret_cast<const DevItem*>(c.data().data());
      if (d->devid.get() != super_.dev_item.devid.get()) {
        return Status::Unsupported("chunk tree lists device " + std::to_string(d->devid.get()) +
                                   " besides this one (multi-device filesystem)");
      }
    }
    UB_RETURN_IF_ERROR(c.Next().WithContext("chunk tree"));
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
  const bool subvol = objectid == kFsTreeObjectid || (objectid >= kFirstFreeObjectid && objectid <= kLastFreeObjectid);
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

Status Volume::WriteSuperblocks() {
  super_.root = root_tree_.bytenr;
  super_.root_level = static_cast<uint8_t>(root_tree_.level);
  super_.chunk_root = chunk_tree_.bytenr;
  super_.chunk_root_level = static_cast<uint8_t>(chunk_tree_.level);
  super_.chunk_root_generation = chunk_tree_.generation;
  std::vector<uint8_t> buf(kSuperInfoSize);
  for (int mirror = 0; mirror < kSuperMirrorMax; ++mirror) {
    const uint64_t off = SuperblockOffset(mirror);
    if (off + kSuperInfoSize > dev_->Size()) break;
    super_.bytenr = off;
    std::memcpy(buf.data(), &super_, kSuperInfoSize);
    CsumBytes c = ComputeCsum(csum_type(), std::span<const uint8_t>(buf).subspan(kCsumSize));
    std::memcpy(buf.data(), c.data(), kCsumSize);
    UB_RETURN_IF_ERROR(dev_->WriteAt(off, buf));
  }
  super_.bytenr = SuperblockOffset(0);
  committed_super_ = super_;
  return Status::Ok();
}

Status Volume::WriteLogSuperblock(uint64_t log_root, uint8_t log_root_level) {
  SuperBlock sb = committed_super_;
  sb.log_root = log_root;
  sb.log_root_level = log_root_level;
  sb.bytenr = SuperblockOffset(0);
  std::vector<uint8_t> buf(kSuperInfoSize);
  std::memcpy(buf.data(), &sb, kSuperInfoSize);
  CsumBytes c = ComputeCsum(csum_type(), std::span<const uint8_t>(buf).subspan(kCsumSize));
  std::memcpy(buf.data(), c.data(), kCsumSize);
  return dev_->WriteAt(SuperblockOffset(0), buf).WithContext("writing the tree log's superblock");
}

Status Volume::LookupCsums(uint64_t logical, size_t nsectors, std::vector<uint8_t>* csums,
                           std::vector<bool>* present) {
  const size_t csize = CsumSize(csum_type());
  const uint32_t ss = sectorsize();
  csums->assign(nsectors * csize, 0);
  present->assign(nsectors, false);
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

Status Volume::ReadData(uint64_t logical, std::span<uint8_t> out, bool verify) {
  const uint32_t ss = sectorsize();
  const std::string where = "data at logical " + std::to_string(logical);
  if (logical % ss != 0 || out.size() % ss != 0) return Status::Invalid(where + ": unaligned read");
  if (out.empty()) return Status::Ok();
  UB_ASSIGN_OR_RETURN(std::vector<uint64_t> copies, chunks_->Map(logical, out.size()));
  const alloc::ChunkInfo* chunk = chunks_->Find(logical);
  if (!(chunk->type & kBlockGroupData)) return Status::Corrupt(where + ": not in a DATA chunk");
  std::vector<uint8_t> csums;
  std::vector<bool> present;
  const size_t nsectors = out.size() / ss;
  if (verify) UB_RETURN_IF_ERROR(LookupCsums(logical, nsectors, &csums, &present));
  const size_t csize = CsumSize(csum_type());
  Status first_error;
  for (size_t copy = 0; copy < copies.size(); ++copy) {
    Status st = dev_->ReadAt(copies[copy], out);
    if (st.ok() && verify) {
      for (size_t i = 0; i < nsectors; ++i) {
        if (!present[i]) continue;
        if (!VerifyCsum(csum_type(), out.subspan(i * ss, ss), csums.data() + i * csize)) {
          st = Status::IoError("data checksum mismatch at logical " + std::to_string(logical + i * ss) +
                               " (copy " + std::to_string(copy) + ")");
          break;
        }
      }
    }
    if (st.ok()) return st;
    if (first_error.ok()) first_error = st;
  }
  return first_error;
}

}  // namespace ubtrfs::txn
