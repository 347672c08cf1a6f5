// Subvolumes as `btrfs subvolume create|delete|list` manage them: the entry
// that names a subvolume in its parent (DIR_ITEM and DIR_INDEX whose
// location is the subvolume's ROOT_ITEM, type directory), the ROOT_REF /
// ROOT_BACKREF pair in the root tree that carries the same name and index,
// the UUID tree item, and the tree itself (txn/snapshot.cc creates it,
// txn/drop_tree.cc drops it). Each call commits before it returns.
#include <sys/stat.h>

#include <cstring>
#include <functional>
#include <map>

#include "fs/fs_impl.h"
#include "fs/subvolume.h"
#include "txn/clock.h"

namespace ubtrfs::fsimpl {

using namespace ubtrfs::format;

namespace {

Key UuidKey(const uint8_t* uuid, uint8_t type) {
  return Key{LoadLe<uint64_t>(uuid), type, LoadLe<uint64_t>(uuid + 8)};
}

bool IsZeroUuid(const uint8_t* u) {
  for (int i = 0; i < 16; ++i) {
    if (u[i]) return false;
  }
  return true;
}

// Adds subvolume `id` to the UUID tree's (uuid, type) item, once.
Status AddUuidEntry(tree::BlockSource* source, tree::TreeWriter* uw, const uint8_t* uuid, uint8_t type, uint64_t id) {
  const Key ukey = UuidKey(uuid, type);
  std::vector<uint8_t> ids(8);
  StoreLe<uint64_t>(ids.data(), id);
  UB_ASSIGN_OR_RETURN(auto have, tree::LookupItem(source, uw->LiveRef(), ukey));
  if (!have) return uw->Insert(ukey, ids);
  for (size_t i = 0; i + 8 <= have->size(); i += 8) {
    if (LoadLe<uint64_t>(have->data() + i) == id) return Status::Ok();
  }
  have->insert(have->end(), ids.begin(), ids.end());
  return uw->Update(ukey, *have);
}

// Takes subvolume `id` out of the UUID tree's (uuid, type) item; the item
// goes when no other subvolume is left in it.
Status RemoveUuidEntry(tree::BlockSource* source, tree::TreeWriter* uw, const uint8_t* uuid, uint8_t type,
                       uint64_t id) {
  const Key ukey = UuidKey(uuid, type);
  UB_ASSIGN_OR_RETURN(auto have, tree::LookupItem(source, uw->LiveRef(), ukey));
  if (!have) return Status::Ok();
  std::vector<uint8_t> rest;
  for (size_t i = 0; i + 8 <= have->size(); i += 8) {
    if (LoadLe<uint64_t>(have->data() + i) != id) rest.insert(rest.end(), have->begin() + i, have->begin() + i + 8);
  }
  return rest.empty() ? uw->Delete(ukey) : uw->Update(ukey, rest);
}

void SetNow(Timespec& ts) {
  const timespec now = txn::WallClock();
  ts.sec = static_cast<uint64_t>(now.tv_sec);
  ts.nsec = static_cast<uint32_t>(now.tv_nsec);
}

}  // namespace

// The kernel takes the next id above the largest objectid of the root tree
// in the subvolume range; ids this view deleted are not handed out again.
Result<uint64_t> FilesystemImpl::NewSubvolumeId() {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, txn_->Writer(kRootTreeObjectid));
  tree::Cursor c(vol_->source(), rootw->LiveRef());
  UB_RETURN_IF_ERROR(c.SeekAtOrBefore(Key{kLastFreeObjectid, 255, UINT64_MAX}));
  uint64_t id = kFirstFreeObjectid;
  if (c.Valid() && c.key().objectid >= kFirstFreeObjectid) id = c.key().objectid + 1;
  id = std::max(id, min_subvol_id_);
  if (id >= kLastFreeObjectid) return Status::Error(ENOSPC, "no free subvolume id");
  min_subvol_id_ = id + 1;
  return id;
}

Status FilesystemImpl::CheckNewSubvolumeEntry(InodeId dir, std::string_view name) {
  UB_RETURN_IF_ERROR(CheckName(name));
  UB_ASSIGN_OR_RETURN(Stat dst, GetStat(dir));
  if ((dst.mode & S_IFMT) != S_IFDIR) return Status::Error(ENOTDIR, InodeName(dir) + " is not a directory");
  auto existing = LookupChild(dir, name);
  if (existing.ok()) return Status::Error(EEXIST, std::string(name) + " exists");
  return existing.status().code() == ENOENT ? Status::Ok() : existing.status();
}

Status FilesystemImpl::LinkSubvolume(InodeId dir, std::string_view name, uint64_t id, const uint8_t (&uuid)[16]) {
  UB_RETURN_IF_ERROR(LinkSubvolumeEntry(dir, name, id));
  // The UUID tree finds subvolumes by uuid (send/receive). An image
  // without one gets it from the kernel's next mount, which rescans.
  if (!vol_->FindRoot(kUuidTreeObjectid).ok()) return Status::Ok();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * uw, txn_->Writer(kUuidTreeObjectid));
  UB_RETURN_IF_ERROR(AddUuidEntry(vol_->source(), uw, uuid, kUuidKeySubvol, id));
  // A read-only snapshot of a received subvolume keeps its received uuid
  // (txn/snapshot.cc), and the kernel files it under that one too.
  UB_ASSIGN_OR_RETURN(auto root, vol_->FindRoot(id));
  if (root.item_size < sizeof(RootItem) || IsZeroUuid(root.item.received_uuid)) return Status::Ok();
  return AddUuidEntry(vol_->source(), uw, root.item.received_uuid, kUuidKeyReceivedSubvol, id);
}

Result<InodeId> FilesystemImpl::CreateSubvolume(InodeId dir, std::string_view name, const NewInode& attrs) {
  return Change({dir}, 16, [&]() -> Result<InodeId> {
    UB_RETURN_IF_ERROR(CheckNewSubvolumeEntry(dir, name));
    UB_ASSIGN_OR_RETURN(const uint64_t id, NewSubvolumeId());
    const uint64_t transid = txn_->transid();
    // The root item as the kernel's create_subvol fills it.
    RootItem item{};
    item.inode.generation = 1;
    item.inode.size = 3;
    item.inode.nlink = 1;
    item.inode.nbytes = vol_->nodesize();
    item.inode.mode = S_IFDIR | 0755;
    item.inode.flags = kInodeRootItemInit;
    item.root_dirid = kFirstFreeObjectid;
    item.refs = 1;
    UB_RETURN_IF_ERROR(txn::NewUuid(item.uuid));
    item.ctransid = transid;
    item.otransid = transid;
    SetNow(item.ctime);
    item.otime = item.ctime;
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, txn_->CreateTree(id, item, 0));
    UB_RETURN_IF_ERROR(txn_->NewQgroup(id, 0, dir.root));
    // Its top directory, with the ".." back reference to itself.
    InodeItem ii{};
    ii.generation = transid;
    ii.transid = transid;
    ii.nlink = 1;
    ii.uid = attrs.uid;
    ii.gid = attrs.gid;
    ii.mode = S_IFDIR | (attrs.mode & 07777);
    ii.atime = item.ctime;
    ii.ctime = item.ctime;
    ii.mtime = item.ctime;
    ii.otime = item.ctime;
    std::vector<uint8_t> ref(sizeof(InodeRef) + 2);
    auto* ir = reinterpret_cast<InodeRef*>(ref.data());
    ir->index = 0;
    ir->name_len = 2;
    std::memcpy(ref.data() + sizeof(InodeRef), "..", 2);
    UB_RETURN_IF_ERROR(w->Insert(Key{kFirstFreeObjectid, kInodeItemKey, 0},
                                 std::span(reinterpret_cast<const uint8_t*>(&ii), sizeof(ii))));
    UB_RETURN_IF_ERROR(w->Insert(Key{kFirstFreeObjectid, kInodeRefKey, kFirstFreeObjectid}, ref));
    uint8_t uuid[16];
    std::memcpy(uuid, item.uuid, 16);
    UB_RETURN_IF_ERROR(LinkSubvolume(dir, name, id, uuid));
    if (!hold_commits_) UB_RETURN_IF_ERROR(CommitImpl());
    return InodeId{id, kFirstFreeObjectid};
  });
}

Result<uint64_t> FilesystemImpl::SetReceivedSubvol(InodeId subvol, const uint8_t (&received_uuid)[16],
                                                  uint64_t stransid) {
  return Change({}, 4, [&]() -> Result<uint64_t> {
    UB_RETURN_IF_ERROR(SubvolTop(*vol_, subvol).status());
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, txn_->Writer(kRootTreeObjectid));
    UB_ASSIGN_OR_RETURN(txn::Volume::TreeRoot * r, vol_->MutableRoot(subvol.root));
    if (r->item_size < sizeof(RootItem)) {
      // A v1 item has no room for the received fields; every subvolume
      // this library or a kernel since 3.8 makes has a whole one.
      return Status::Unsupported("subvolume " + std::to_string(subvol.root) + " has a short (v1) ROOT_ITEM");
    }
    uint8_t old_uuid[16];
    const uint64_t rtransid = txn_->transid();
    {
      std::lock_guard lock(vol_->roots_mutex());  // FindRoot copies the entry under it
      std::memcpy(old_uuid, r->item.received_uuid, 16);
      std::memcpy(r->item.received_uuid, received_uuid, 16);
      r->item.stransid = stransid;
      r->item.rtransid = rtransid;
      std::memset(&r->item.stime, 0, sizeof(r->item.stime));
      SetNow(r->item.rtime);
      r->item.flags = r->item.flags.get() | kRootSubvolRdonly;
    }
    UB_RETURN_IF_ERROR(rootw->Update(r->item_key, std::span(reinterpret_cast<const uint8_t*>(&r->item), r->item_size)));
    subvols_->Forget();
    if (!vol_->FindRoot(kUuidTreeObjectid).ok()) return rtransid;
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * uw, txn_->Writer(kUuidTreeObjectid));
    if (!IsZeroUuid(old_uuid)) {
      // The kernel drops the old received uuid's entry for this subvolume.
      UB_RETURN_IF_ERROR(RemoveUuidEntry(vol_->source(), uw, old_uuid, kUuidKeyReceivedSubvol, subvol.root));
    }
    if (IsZeroUuid(received_uuid)) return rtransid;
    UB_RETURN_IF_ERROR(AddUuidEntry(vol_->source(), uw, received_uuid, kUuidKeyReceivedSubvol, subvol.root));
    return rtransid;
  });
}

// A deletion, as the kernel's (which falls back on its global reserve for
// it): on a full device -- a --shrink image is one -- it is how room is made.
Status FilesystemImpl::DeleteSubvolume(InodeId dir, std::string_view name) {
  return Change({dir}, txn::ReserveFor::kDelete, kItemsPerDeleteSubvol, [&]() -> Status {
    UB_RETURN_IF_ERROR(CheckName(name));
    UB_ASSIGN_OR_RETURN(InodeId target, LookupChild(dir, name));
    if (KindOf(dir, target) != EntryKind::kSubvolume || !SubvolTop(*vol_, target).ok()) {
      return Status::Error(EINVAL, std::string(name) + " is not a subvolume");
    }
    return RemoveSubvolume(dir, name, target);
  });
}

Status FilesystemImpl::RemoveSubvolume(InodeId dir, std::string_view name, InodeId target) {
  UB_ASSIGN_OR_RETURN(auto top, SubvolTop(*vol_, target));
  const uint64_t id = target.root;
  UB_ASSIGN_OR_RETURN(const uint64_t def, DefaultSubvolumeId());
  if (id == def) return Status::Error(EPERM, std::string(name) + " is the default subvolume");
  if (id == root_.root) return Status::Error(EBUSY, std::string(name) + " is where this view's paths start");
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, txn_->Writer(kRootTreeObjectid));
  {
    tree::Cursor c(vol_->source(), rootw->LiveRef());
    UB_RETURN_IF_ERROR(c.Seek(Key{id, kRootRefKey, 0}));
    if (c.Valid() && c.key().objectid == id && c.key().type == kRootRefKey) {
      return Status::Error(ENOTEMPTY, std::string(name) + " holds other subvolumes");
    }
  }
  // The tree as committed: the drop reads every block from disk.
  UB_RETURN_IF_ERROR(CommitImpl());
  UB_RETURN_IF_ERROR(UnlinkSubvolumeEntry(dir, name, id));
  // The UUID tree items that name it.
  if (vol_->FindRoot(kUuidTreeObjectid).ok()) {
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * uw, txn_->Writer(kUuidTreeObjectid));
    for (auto [uuid, type] : {std::pair{top.item.uuid, kUuidKeySubvol}, std::pair{top.item.received_uuid, kUuidKeyReceivedSubvol}}) {
      if (!IsZeroUuid(uuid)) UB_RETURN_IF_ERROR(RemoveUuidEntry(vol_->source(), uw, uuid, type, id));
    }
  }
  UB_RETURN_IF_ERROR(txn_->MarkTreeDead(id));
  min_subvol_id_ = std::max(min_subvol_id_, id + 1);
  subvols_->Forget();
  // Committed dead, the subvolume is gone for good: a crash from here on
  // leaves the drop to whoever opens the image next.
  UB_RETURN_IF_ERROR(CommitImpl());
  return DropDeadTree(id);
}

Status FilesystemImpl::SetDefaultSubvolume(uint64_t id) {
  return Change({}, kItemsPerDeleteSubvol, [&]() -> Status {
    if (!IsSubvolumeTree(id)) {
      return Status::Error(ENOENT, "tree " + std::to_string(id) + " is no subvolume");
    }
    auto root = vol_->FindRoot(id);
    if (!root.ok()) return Status::Error(ENOENT, "no subvolume " + std::to_string(id));
    // The kernel changes the location of the root tree directory's
    // "default" entry, which mkfs makes; it refuses an image without one.
    UB_ASSIGN_OR_RETURN(tree::TreeWriter * rootw, txn_->Writer(kRootTreeObjectid));
    const Key k{kRootTreeDirObjectid, kDirItemKey, NameHash("default")};
    UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(vol_->source(), rootw->LiveRef(), k));
    if (!item) return Status::Error(ENOENT, "the root tree has no \"default\" entry to point at the subvolume");
    std::vector<uint8_t> d = *item;
    bool found = false;
    for (size_t at = 0; at + sizeof(DirItem) <= d.size();) {
      auto* di = reinterpret_cast<DirItem*>(d.data() + at);
      const size_t len = sizeof(DirItem) + di->name_len.get() + di->data_len.get();
      if (at + len > d.size()) break;
      if (std::string_view(reinterpret_cast<const char*>(di + 1), di->name_len.get()) == "default") {
        di->location.objectid = id;
        di->location.type = kRootItemKey;
        di->location.offset = root->item_key.offset;
        found = true;
      }
      at += len;
    }
    if (!found) return Status::Error(ENOENT, "the root tree has no \"default\" entry to point at the subvolume");
    UB_RETURN_IF_ERROR(rootw->Update(k, d));
    SuperBlock& sb = vol_->mutable_super();
    sb.incompat_flags = sb.incompat_flags.get() | kIncompatDefaultSubvol;
    return CommitImpl();
  });
}

Status FilesystemImpl::DropDeadTree(uint64_t id) {
  uint64_t freed = 0;
  for (;;) {
    UB_ASSIGN_OR_RETURN(bool done, txn_->DropTreeStep(id, drop_step_blocks_, &freed));
    UB_RETURN_IF_ERROR(CommitImpl());
    if (done) return Status::Ok();
  }
}

// Runs at open, alone. Only when something is dead is anything reserved,
// and as for a deletion: on a device whose metadata is full the open must
// still succeed, or nothing could be deleted to make room.
Status FilesystemImpl::FinishDeadTrees() {
  UB_ASSIGN_OR_RETURN(auto any, txn_->DeadTrees());
  if (any.empty()) return Status::Ok();
  return Change({}, txn::ReserveFor::kDelete, kItemsPerDeleteSubvol, [&]() -> Status {
    UB_ASSIGN_OR_RETURN(auto dead, txn_->DeadTrees());
    for (uint64_t id : dead) {
      min_subvol_id_ = std::max(min_subvol_id_, id + 1);
      UB_RETURN_IF_ERROR(DropDeadTree(id).WithContext("finishing the deletion of subvolume " + std::to_string(id)));
    }
    return Status::Ok();
  });
}

Result<std::vector<SubvolumeInfo>> FilesystemImpl::ListSubvolumes() {
  auto guard = Guard();
  struct Back {
    uint64_t parent = 0, dirid = 0;
    std::string name;
  };
  std::map<uint64_t, SubvolumeInfo> subvols;
  std::map<uint64_t, Back> backs;
  {
    tree::Cursor c(vol_->source(), txn_ ? txn_->Writer(kRootTreeObjectid).value()->LiveRef() : vol_->root_tree());
    UB_RETURN_IF_ERROR(c.Seek(Key{kFirstFreeObjectid, 0, 0}));
    for (; c.Valid() && c.key().objectid <= kLastFreeObjectid;) {
      const Key k = c.key();
      auto d = c.data();
      if (k.type == kRootItemKey) {
        RootItem ri{};
        std::memcpy(&ri, d.data(), std::min(d.size(), sizeof(ri)));
        if (ri.refs.get() == 0) {  // deleted, its tree not yet dropped: gone, as for btrfs subvolume list
          UB_RETURN_IF_ERROR(c.Next());
          continue;
        }
        SubvolumeInfo& s = subvols[k.objectid];
        s.id = k.objectid;
        std::memcpy(s.uuid.data(), ri.uuid, 16);
        std::memcpy(s.parent_uuid.data(), ri.parent_uuid, 16);
        std::memcpy(s.received_uuid.data(), ri.received_uuid, 16);
        s.generation = ri.generation.get();
        s.ctransid = ri.ctransid.get();
        s.otransid = ri.otransid.get();
        s.ctime = Time{static_cast<int64_t>(ri.ctime.sec.get()), ri.ctime.nsec.get()};
        s.otime = Time{static_cast<int64_t>(ri.otime.sec.get()), ri.otime.nsec.get()};
        s.read_only = ri.flags.get() & kRootSubvolRdonly;
      } else if (k.type == kRootBackrefKey && d.size() >= sizeof(RootRef)) {
        const auto* rr = reinterpret_cast<const RootRef*>(d.data());
        const size_t n = std::min<size_t>(rr->name_len.get(), d.size() - sizeof(RootRef));
        backs[k.objectid] = Back{k.offset, rr->dirid.get(),
                                 std::string(reinterpret_cast<const char*>(d.data() + sizeof(RootRef)), n)};
      }
      UB_RETURN_IF_ERROR(c.Next());
    }
  }
  // Paths: the parent's path, the directory inside the parent (INODE_REF
  // chain up to its top), the name.
  std::map<uint64_t, std::string> paths{{kFsTreeObjectid, ""}};
  std::function<std::string(uint64_t, int)> path_of = [&](uint64_t id, int depth) -> std::string {
    if (auto it = paths.find(id); it != paths.end()) return it->second;
    auto b = backs.find(id);
    if (b == backs.end() || depth > 64) return "";  // an orphan (being deleted) or a loop
    std::string p = path_of(b->second.parent, depth + 1);
    std::string inner;
    auto parent_top = vol_->FindRoot(b->second.parent);
    const uint64_t top_ino = parent_top.ok() ? parent_top->item.root_dirid.get() : kFirstFreeObjectid;
    InodeId at{b->second.parent, b->second.dirid};
    for (int hops = 0; at.ino != top_ino && hops < 4096; ++hops) {
      auto up = LookupChild(at, "..");
      if (!up.ok()) break;
      auto entries = ReadDir(*up);
      if (!entries.ok()) break;
      std::string name;
      for (const auto& e : *entries) {
        if (e.id == at) name = e.name;
      }
      if (name.empty()) break;
      inner = name + (inner.empty() ? "" : "/" + inner);
      at = *up;
    }
    std::string full = p;
    for (const std::string& part : {inner, b->second.name}) {
      if (part.empty()) continue;
      full += (full.empty() ? "" : "/") + part;
    }
    paths[id] = full;
    return full;
  };
  std::vector<SubvolumeInfo> out;
  for (auto& [id, s] : subvols) {
    if (auto b = backs.find(id); b != backs.end()) {
      s.parent_id = b->second.parent;
      s.dir_ino = b->second.dirid;
    }
    s.path = path_of(id, 0);
    out.push_back(s);
  }
  return out;
}

}  // namespace ubtrfs::fsimpl
