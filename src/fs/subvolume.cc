#include "fs/subvolume.h"

#include <cerrno>

#include "format/ondisk.h"
#include "fs/fs_impl.h"
#include "txn/volume.h"

namespace ubtrfs::fsimpl {

using namespace ubtrfs::format;

Result<bool> SubvolumeFlags::ReadOnly(uint64_t root) {
  Slot& s = slots_[SlotOf(root)];
  if (s.root.load(std::memory_order_acquire) == root) return s.ro.load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  if (s.root.load(std::memory_order_relaxed) == root) return s.ro.load(std::memory_order_relaxed);
  if (auto it = overflow_.find(root); it != overflow_.end()) return it->second;
  UB_ASSIGN_OR_RETURN(auto r, vol_->FindRoot(root));
  const bool ro = (r.item.flags.get() & kRootSubvolRdonly) != 0;
  if (s.root.load(std::memory_order_relaxed) == 0) {
    s.ro.store(ro, std::memory_order_relaxed);
    s.root.store(root, std::memory_order_release);  // publishes ro with it
  } else {
    overflow_[root] = ro;
  }
  return ro;
}

Status SubvolumeFlags::CheckWritable(uint64_t root) {
  auto ro = ReadOnly(root);
  if (!ro.ok() || !*ro) return Status::Ok();
  return Status::Error(EROFS, "subvolume " + std::to_string(root) + " is read-only");
}

Status SubvolumeFlags::CheckWritable(std::initializer_list<InodeId> ids) {
  for (const InodeId& id : ids) UB_RETURN_IF_ERROR(CheckWritable(id.root));
  return Status::Ok();
}

void SubvolumeFlags::Forget() {
  std::lock_guard lock(mu_);
  for (Slot& s : slots_) s.root.store(0, std::memory_order_relaxed);
  overflow_.clear();
}

}  // namespace ubtrfs::fsimpl

// ---- Choosing where paths start (OpenOptions::subvol / subvolid) ---------------------------------

namespace ubtrfs::fsimpl {

Status FilesystemImpl::Init(const std::string& subvol_path, uint64_t subvolid, bool fall_back) {
  if (subvol_path.empty() && subvolid == 0) return InitDefault(fall_back);
  std::optional<InodeId> by_id, by_path;
  if (subvolid != 0) {
    if (subvolid != kFsTreeObjectid && (subvolid < kFirstFreeObjectid || subvolid > kLastFreeObjectid)) {
      return Status::Error(EINVAL, "subvolid " + std::to_string(subvolid) + " is not a subvolume id");
    }
    if (!vol_->FindRoot(subvolid).ok()) {
      return Status::Error(ENOENT, "subvolid " + std::to_string(subvolid) + ": no such subvolume");
    }
    UB_ASSIGN_OR_RETURN(by_id, SubvolRoot(subvolid));
  }
  if (!subvol_path.empty()) {
    UB_ASSIGN_OR_RETURN(root_, SubvolRoot(kFsTreeObjectid));  // the path starts at the top level
    const std::string where = "subvol " + subvol_path;
    auto looked = Lookup(subvol_path);
    if (!looked.ok()) return looked.status().WithContext(where);
    const InodeId id = *looked;
    auto sub = vol_->FindRoot(id.root);
    if (!sub.ok() || id.ino != sub->item.root_dirid.get()) {
      return Status::Error(EINVAL, where + ": not a subvolume");
    }
    by_path = id;
  }
  if (by_id && by_path && !(*by_id == *by_path)) {
    return Status::Error(EINVAL, "subvol " + subvol_path + " is subvolume " + std::to_string(by_path->root) +
                                     ", not subvolid " + std::to_string(subvolid));
  }
  root_ = by_path ? *by_path : *by_id;
  return GetStat(root_).status().WithContext("root directory");
}

}  // namespace ubtrfs::fsimpl

// ---- The read-only flag ------------------------------------------------------------------------

namespace ubtrfs::fsimpl {

Result<txn::Volume::TreeRoot> SubvolTop(txn::Volume& vol, InodeId subvol) {
  if (subvol.root != kFsTreeObjectid && (subvol.root < kFirstFreeObjectid || subvol.root > kLastFreeObjectid)) {
    return Status::Error(EINVAL, InodeName(subvol) + " is not in a subvolume");
  }
  UB_ASSIGN_OR_RETURN(auto r, vol.FindRoot(subvol.root));
  if (subvol.ino != r.item.root_dirid.get()) {
    return Status::Error(EINVAL, InodeName(subvol) + " is not the top of a subvolume");
  }
  return r;
}

Result<bool> FilesystemImpl::SubvolumeReadOnly(InodeId subvol) {
  auto guard = Guard();
  UB_ASSIGN_OR_RETURN(auto r, SubvolTop(*vol_, subvol));
  return (r.item.flags.get() & kRootSubvolRdonly) != 0;
}

Status FilesystemImpl::SetSubvolumeReadOnly(InodeId subvol, bool read_only) {
  // Not refused by the subvolume's own flag: clearing it is the way out.
  return Change({}, 2, [&]() -> Status {
    UB_ASSIGN_OR_RETURN(auto found, SubvolTop(*vol_, subvol));
    const uint64_t old_flags = found.item.flags.get();
    const uint64_t flags = read_only ? old_flags | kRootSubvolRdonly : old_flags & ~kRootSubvolRdonly;
    if (flags == old_flags) return Status::Ok();
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, txn_->Writer(kRootTreeObjectid));
    UB_ASSIGN_OR_RETURN(txn::Volume::TreeRoot * r, vol_->MutableRoot(subvol.root));
    {
      std::lock_guard lock(vol_->roots_mutex());  // FindRoot copies the entry under it
      r->item.flags = flags;
    }
    UB_RETURN_IF_ERROR(rootw->Update(r->item_key, std::span(reinterpret_cast<const uint8_t*>(&r->item), r->item_size)));
    subvols_->Forget();
    return Status::Ok();
  });
}

}  // namespace ubtrfs::fsimpl
