// Internal to check/: the inode-level check of one fs tree (the fs tree, a
// subvolume or snapshot, the data reloc tree). It is fed the tree's leaves in
// key order and keeps a record only for inodes that are not settled yet: an
// inode whose own items are all seen, whose every name was found three ways
// (INODE_REF/INODE_EXTREF, DIR_ITEM, DIR_INDEX) and whose nlink matches is
// dropped at once, so memory follows the unresolved links, not the tree size.
#ifndef UBTRFS_CHECK_FS_TREE_CHECK_H_
#define UBTRFS_CHECK_FS_TREE_CHECK_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "check/report.h"
#include "check/verity_check.h"
#include "format/key.h"
#include "tree/tree_block.h"

namespace ubtrfs::check {

struct FsTreeEnv {
  uint64_t tree_id = 0;
  uint64_t root_dirid = format::kFirstFreeObjectid;
  uint32_t sectorsize = 4096;
  uint32_t nodesize = 16384;
  uint64_t super_generation = 0;
  bool no_holes = false;
  const CsumIndex* csums = nullptr;
  Report* report = nullptr;
};

// A directory entry naming a subvolume (location type ROOT_ITEM).
struct SubvolEntry {
  uint64_t tree = 0, dir = 0, subvol = 0, index = 0;
  std::string name;
  bool is_index = false;  // DIR_INDEX (else DIR_ITEM)
};

// A PREALLOC file extent that has checksums: consistent only if some REG file
// extent (anywhere) has written the same disk extent.
struct PreallocCsum {
  uint64_t tree = 0, ino = 0, file_offset = 0, disk_bytenr = 0;
};

class FsTreeChecker {
 public:
  explicit FsTreeChecker(const FsTreeEnv& env) : env_(env) {}
  // Every leaf of the tree, in key order.
  void Leaf(const tree::TreeBlock& leaf);
  // After the last leaf: reports every inode still unsettled.
  void Finish();

  const std::vector<SubvolEntry>& subvol_entries() const { return subvol_entries_; }
  const std::vector<PreallocCsum>& prealloc_csums() const { return prealloc_csums_; }
  uint64_t inodes() const { return inodes_; }
  // Whether the tree holds the free inode number cache of mount -o
  // inode_cache (Linux before 5.11), which the kernel now ignores.
  bool ino_cache() const { return ino_cache_; }

 private:
  struct Backref {
    uint64_t dir = 0;
    std::string name;
    uint64_t index = 0;
    uint8_t filetype = 0;
    bool dir_item = false, dir_index = false, inode_ref = false;
    std::string problems;  // ", index mismatch", ...
  };
  struct InodeRec {
    bool have_item = false, done = false;
    uint32_t nlink = 0, mode = 0;
    uint64_t isize = 0, nbytes = 0, flags = 0;
    uint32_t found_link = 0;  // DIR_ITEM entries naming this inode
    uint32_t ref_names = 0;   // names in INODE_REF / INODE_EXTREF items
    uint64_t found_size = 0;  // dir: name bytes of its entries; file: data bytes
    bool own_dir_items = false, file_extents = false;
    uint64_t extent_start = UINT64_MAX, extent_end = 0, first_gap = UINT64_MAX;
    bool overlap = false;
    bool found_csum = false, csum_missing = false;
    std::vector<Backref> backrefs;
  };

  void Item(const tree::TreeBlock& leaf, int slot, const format::Key& key);
  void OnInodeItem(InodeRec& rec, const format::Key& key, std::span<const uint8_t> d);
  void OnInodeRefs(const format::Key& key, std::span<const uint8_t> d, bool extended);
  void OnDirItems(InodeRec& rec, const format::Key& key, std::span<const uint8_t> d);
  void OnXattrItems(const format::Key& key, std::span<const uint8_t> d);
  void OnFileExtent(InodeRec& rec, const format::Key& key, std::span<const uint8_t> d, uint64_t leaf_owner);
  void AddBackref(uint64_t ino, uint64_t dir, const std::string& name, uint64_t index, uint8_t filetype,
                  uint8_t item_type);
  void FinishInode(uint64_t ino);
  void MaybeFree(uint64_t ino);
  void ReportUnsettled(uint64_t ino, const InodeRec& rec);
  void CheckRootDir(const InodeRec& rec);
  void Error(const std::string& what);
  std::string Where(const format::Key& key) const;

  FsTreeEnv env_;
  std::map<uint64_t, InodeRec> recs_;
  std::set<uint64_t> orphans_;  // ORPHAN_ITEM offsets: inodes being deleted
  VerityItemsCheck verity_;     // the current inode's
  // Inodes with fs-verity items but no VERITY flag: left by an enable a
  // crash cut short, which the orphan item of the inode then undoes.
  std::vector<uint64_t> stray_verity_;
  bool have_cur_ = false;
  bool ino_cache_ = false;  // items of the old free inode number cache seen
  uint64_t cur_ino_ = 0;
  uint64_t inodes_ = 0;
  std::vector<SubvolEntry> subvol_entries_;
  std::vector<PreallocCsum> prealloc_csums_;
};

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_FS_TREE_CHECK_H_
