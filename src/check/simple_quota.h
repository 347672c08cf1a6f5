// `ubtrfs check` of simple quotas (the SIMPLE_QUOTA incompat flag): every
// qgroup's numbers recounted from the extent tree as btrfs check (progs 6.7+,
// check/qgroup-verify.c) and the kernel's accounting define them. Each extent
// item of generation >= the status item's enable_gen charges its length to
// its owner -- a data extent's leading EXTENT_OWNER_REF, a tree block's
// header owner -- when that is a subvolume with a qgroup: to that qgroup and
// every qgroup above it, referenced and exclusive alike. Nothing else counts
// (no back reference walk: a shared extent stays its owner's alone).
#ifndef UBTRFS_CHECK_SIMPLE_QUOTA_H_
#define UBTRFS_CHECK_SIMPLE_QUOTA_H_

#include <cstdint>
#include <map>
#include <vector>

#include "check/backrefs.h"
#include "check/report.h"
#include "tree/block_reader.h"

namespace ubtrfs::check {

class SimpleQuotaCount {
 public:
  // Reads the quota tree (quota_root.bytenr 0: none). Problems reading it
  // are reported; the count is then off.
  void Load(tree::BlockReader* reader, const tree::RootPtr& quota_root, bool incompat_simple, Report* report);
  bool active() const { return active_; }
  // One extent item; block_owner is the header owner of the tree block
  // there (0: the walk did not read it, say in a tree being dropped: it is
  // read here).
  void Extent(const ExtentRec& e, uint64_t block_owner);
  // Every qgroup whose stored numbers differ from the recount, and every
  // subvolume of `subvols` with no qgroup of its own: the kernel charges
  // each change to one and aborts the transaction where there is none
  // (mkfs.btrfs 6.19 --subvol with -O squota leaves them out).
  void Finish(const std::vector<uint64_t>& subvols, Report* report) const;

 private:
  struct Group {
    uint64_t rfer = 0, excl = 0;          // stored
    uint64_t count = 0;                   // recounted
    std::vector<uint64_t> parents;
  };
  tree::BlockReader* reader_ = nullptr;
  bool active_ = false;
  uint64_t enable_gen_ = 0;
  std::map<uint64_t, Group> groups_;
};

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_SIMPLE_QUOTA_H_
