// fs-verity on btrfs (the kernel's fs/btrfs/verity.c): a file's Merkle tree
// and descriptor live in its own items of its subvolume's tree, the data
// and its extents stay as they are.
//
//   (ino, VERITY_DESC_ITEM, 0)        VerityDescriptorItem: the descriptor's size
//   (ino, VERITY_DESC_ITEM, 1 + pos)  the descriptor's bytes from pos
//   (ino, VERITY_MERKLE_ITEM, pos)    the Merkle tree's bytes from pos
//
// both written in pieces of 2048 bytes as the kernel writes them; the inode
// gets RO_VERITY (in the upper half of its flags) and the superblock the
// verity compat_ro feature, which the kernel never clears. The kernel
// builds the items over several transactions with an orphan item as the
// marker of an unfinished enable; here one transaction does it all, so no
// orphan item is needed. Deleting the inode deletes every item it has
// (DropInode), these included, as the kernel's evict does.
//
// Reads do not verify data against the tree (the kernel does); `ubtrfs
// check --check-data-csum` does (check/fs_tree_check.cc).
#include <sys/stat.h>

#include "fs/fs_impl.h"

namespace ubtrfs::fsimpl {

Status FilesystemImpl::DataMayChange(InodeId id, const InodeItem& ii) {
  if (ii.flags.get() & kInodeRoVerity) {
    return Status::Error(EPERM, InodeName(id) + " has fs-verity: its data cannot change");
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> FilesystemImpl::JoinVerityItems(InodeId id, uint8_t type, uint64_t first,
                                                             uint64_t limit, const std::string& what) {
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  Cursor c(vol_->source(), tree);
  std::vector<uint8_t> bytes;
  UB_RETURN_IF_ERROR(c.Seek(Key{id.ino, type, first}));
  while (c.Valid() && bytes.size() < limit) {
    if (c.key().objectid != id.ino || c.key().type != type) break;
    UB_RETURN_IF_ERROR(format::AppendVerityItem(&bytes, first, c.key().offset, c.data(), what));
    UB_RETURN_IF_ERROR(c.Next());
  }
  return bytes;
}

Result<std::optional<format::VerityDescriptor>> FilesystemImpl::LoadVerityDescriptor(InodeId id) {
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  UB_ASSIGN_OR_RETURN(auto item, tree::LookupItem(vol_->source(), tree, Key{id.ino, kVerityDescItemKey, 0}));
  if (!item) return std::optional<format::VerityDescriptor>();
  const std::string what = "the fs-verity descriptor of " + InodeName(id);
  auto head = format::ParseVerityDescriptorHead(*item);
  if (!head.ok()) return head.status().WithContext(what);
  const uint64_t size = *head;
  UB_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, JoinVerityItems(id, kVerityDescItemKey, 1, size, what));
  if (bytes.size() != size) {
    return Status::Corrupt(what + ": " + std::to_string(bytes.size()) + " of " + std::to_string(size) + " bytes");
  }
  UB_ASSIGN_OR_RETURN(format::VerityDescriptor d, format::ParseVerityDescriptor(bytes));
  return std::optional(std::move(d));
}

Result<std::optional<format::VerityDescriptor>> FilesystemImpl::FlaggedVerity(InodeId file, Stat* st) {
  UB_ASSIGN_OR_RETURN(*st, GetStat(file));
  if (!(st->flags & kInodeRoVerity)) return std::optional<format::VerityDescriptor>();
  UB_ASSIGN_OR_RETURN(auto d, LoadVerityDescriptor(file));
  if (!d) return Status::Corrupt(InodeName(file) + " has the VERITY flag but no fs-verity descriptor");
  return d;
}

Result<std::optional<VerityInfo>> FilesystemImpl::GetVerity(InodeId file) {
  auto guard = Guard();
  Stat st;
  UB_ASSIGN_OR_RETURN(auto d, FlaggedVerity(file, &st));
  if (!d) return std::optional<VerityInfo>();
  VerityInfo info;
  info.params.hash_algorithm = d->hash_algorithm;
  info.params.block_size = d->block_size;
  info.params.salt = d->salt;
  info.params.signature = d->signature;
  info.data_size = d->data_size;
  info.root_hash = d->root_hash;
  info.digest = format::VerityFileDigest(*d);
  return std::optional(std::move(info));
}

Status FilesystemImpl::VerifyVerity(InodeId file) {
  auto guard = Guard();
  Stat st;
  UB_ASSIGN_OR_RETURN(auto d, FlaggedVerity(file, &st));
  if (!d) return Status::Error(ENODATA, InodeName(file) + " has no fs-verity");
  if (d->data_size != st.size) {
    return Status::Corrupt("the fs-verity descriptor of " + InodeName(file) + " is for " +
                           std::to_string(d->data_size) + " bytes, the file has " + std::to_string(st.size));
  }
  const std::string what = "the Merkle tree of " + InodeName(file);
  UB_ASSIGN_OR_RETURN(std::vector<uint8_t> stored, JoinVerityItems(file, kVerityMerkleItemKey, 0, UINT64_MAX, what));
  const uint64_t want = format::MerkleTreeSize(d->hash_algorithm, d->block_size, d->data_size);
  if (stored.size() != want) {
    return Status::Corrupt(what + ": " + std::to_string(stored.size()) + " bytes, " + std::to_string(want) +
                           " expected");
  }
  UB_ASSIGN_OR_RETURN(format::MerkleTree built,
                      format::BuildMerkleTree(d->hash_algorithm, d->block_size, d->salt, d->data_size,
                                              [&](uint64_t off, std::span<uint8_t> buf) { return Read(file, off, buf); }));
  // The data blocks' hashes are the tree's last level (or, for one block,
  // the root hash itself): the first that differs names the bad block.
  const size_t ds = format::VerityDigestSize(d->hash_algorithm);
  const uint64_t blocks = (d->data_size + d->block_size - 1) / d->block_size;
  const auto bad_block = [&](uint64_t i) {
    return Status::IoError(InodeName(file) + ": data block " + std::to_string(i) + " (bytes " +
                           std::to_string(i * d->block_size) + "..) does not match its fs-verity Merkle tree");
  };
  if (blocks == 1) {
    return built.root_hash == d->root_hash ? Status::Ok() : bad_block(0);
  }
  const uint64_t level0 = (blocks * ds + d->block_size - 1) / d->block_size * d->block_size;
  for (uint64_t i = 0; i < blocks && stored.size() >= level0; ++i) {
    const size_t at = stored.size() - level0 + i * ds;
    if (!std::equal(built.bytes.begin() + at, built.bytes.begin() + at + ds, stored.begin() + at)) return bad_block(i);
  }
  if (built.bytes != stored) return Status::IoError(what + " does not hash to itself (its upper levels are damaged)");
  if (built.root_hash != d->root_hash) return Status::IoError(what + " does not match the descriptor's root hash");
  return Status::Ok();
}

Status FilesystemImpl::EnableVerity(InodeId file, const VerityParams& params) {
  UB_RETURN_IF_ERROR(format::CheckVerityParams(params.hash_algorithm, params.block_size, params.salt.size(),
                                               params.signature.size(), vol_->sectorsize()));
  // The tree's items, reserved up front with the descriptor's.
  UB_ASSIGN_OR_RETURN(Stat st, GetStat(file));
  const uint64_t tree = format::MerkleTreeSize(params.hash_algorithm, params.block_size, st.size);
  const uint64_t items = 8 + (tree + sizeof(FsverityDescriptor) + params.signature.size()) / format::kVerityItemBytes;
  return Change({file}, items, [&] { return EnableVerityImpl(file, params); });
}

Status FilesystemImpl::EnableVerityImpl(InodeId id, const VerityParams& params) {
  UB_ASSIGN_OR_RETURN(InodeItem ii, LoadInode(id));
  if (S_ISDIR(ii.mode.get())) return Status::Error(EISDIR, InodeName(id) + " is a directory");
  if (!S_ISREG(ii.mode.get())) return Status::Invalid(InodeName(id) + " is not a regular file");
  if (ii.flags.get() & kInodeRoVerity) return Status::Error(EEXIST, InodeName(id) + " has fs-verity already");
  const uint64_t size = ii.size.get();
  UB_ASSIGN_OR_RETURN(format::MerkleTree tree,
                      format::BuildMerkleTree(params.hash_algorithm, params.block_size, params.salt, size,
                                              [&](uint64_t off, std::span<uint8_t> buf) { return Read(id, off, buf); }));
  format::VerityDescriptor d;
  d.hash_algorithm = params.hash_algorithm;
  d.block_size = params.block_size;
  d.data_size = size;
  d.root_hash = tree.root_hash;
  d.salt = params.salt;
  d.signature = params.signature;
  const std::vector<uint8_t> desc = format::EncodeVerityDescriptor(d);

  // Whatever an earlier, unfinished enable left goes first (the kernel's
  // btrfs_drop_verity_items at the start of its enable).
  UB_RETURN_IF_ERROR(DropVerityItems(id));
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  auto put = [&](uint8_t type, uint64_t first, std::span<const uint8_t> bytes) -> Status {
    std::vector<Key> keys;
    std::vector<std::span<const uint8_t>> pieces;
    for (size_t at = 0; at < bytes.size(); at += format::kVerityItemBytes) {
      keys.push_back(Key{id.ino, type, first + at});
      pieces.push_back(bytes.subspan(at, std::min(format::kVerityItemBytes, bytes.size() - at)));
    }
    return keys.empty() ? Status::Ok() : w->InsertSorted(keys, pieces);
  };
  VerityDescriptorItem head{};
  head.size = desc.size();
  UB_RETURN_IF_ERROR(w->Insert(Key{id.ino, kVerityDescItemKey, 0},
                               std::span(reinterpret_cast<const uint8_t*>(&head), sizeof(head))));
  UB_RETURN_IF_ERROR(put(kVerityDescItemKey, 1, desc));
  UB_RETURN_IF_ERROR(put(kVerityMerkleItemKey, 0, tree.bytes));

  ii.flags = ii.flags.get() | kInodeRoVerity;
  SetTime(ii.ctime, Now());
  UB_RETURN_IF_ERROR(StoreInode(id, ii));
  NoteInodeChanged(id.root, id.ino);  // a tree log copy of the inode would lack the items
  SuperBlock& sb = vol_->mutable_super();
  sb.compat_ro_flags = sb.compat_ro_flags.get() | kCompatRoVerity;
  return Status::Ok();
}

Status FilesystemImpl::DropVerityItems(InodeId id) {
  UB_ASSIGN_OR_RETURN(tree::RootPtr tree, FsTree(id.root));
  std::vector<Key> keys;
  {
    Cursor c(vol_->source(), tree);
    UB_RETURN_IF_ERROR(c.Seek(Key{id.ino, kVerityDescItemKey, 0}));
    for (; c.Valid() && c.key().objectid == id.ino &&
           (c.key().type == kVerityDescItemKey || c.key().type == kVerityMerkleItemKey);) {
      keys.push_back(c.key());
      UB_RETURN_IF_ERROR(c.Next());
    }
  }
  if (keys.empty()) return Status::Ok();
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * w, FsWriter(id.root));
  for (const Key& k : keys) UB_RETURN_IF_ERROR(w->Delete(k));
  return Status::Ok();
}

}  // namespace ubtrfs::fsimpl
