// The open's checks of the roots every read needs, and the fallbacks a
// read-only rescue open may take instead of refusing (ubtrfs::RescueOptions,
// the kernel's rescue= mount options): an older root tree from the
// superblock's backup roots, reads without a damaged csum tree, superblock
// flags warned of.
#include <algorithm>
#include <cerrno>
#include <vector>

#include "format/key.h"
#include "txn/volume.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

namespace {

// What to try next, after the error (nothing on a writable open: the
// rescue options are for reads).
Status WithHint(const Status& st, const std::string& hint) {
  return hint.empty() ? st : Status::Error(st.code(), st.message() + "; " + hint);
}

}  // namespace

Status Volume::RefusedSuperFlag(const std::string& what) {
  if (!options_.rescue.ignore_super_flags || options_.writable) {
    return Status::Unsupported(what + (options_.writable ? "" : "; the rescue option ignoresuperflags reads it"));
  }
  warnings_.push_back(what + ": read as it is (rescue=ignoresuperflags)");
  return Status::Ok();
}

Status Volume::LoadRootTree() {
  // The root block `r` names (level and generation -1 and 0: not known),
  // read and owned by the root tree.
  auto read = [&](const tree::RootPtr& r) -> Result<tree::BlockRef> {
    UB_ASSIGN_OR_RETURN(auto b, reader_->Read(tree::BlockCheck{r.bytenr, r.level, r.generation, {}}));
    if (b->owner() != kRootTreeObjectid) {
      return Status::Corrupt("tree block " + std::to_string(r.bytenr) + ": owner " + std::to_string(b->owner()) +
                             ", not the root tree");
    }
    return b;
  };
  // An older commit's root instead of the superblock's: the log belongs to
  // the newest commit, not to this one.
  auto take_older = [&](const tree::RootPtr& r, std::string why) {
    warnings_.push_back(std::move(why));
    root_tree_ = r;
    if (super_.log_root.get() != 0) {
      super_.log_root = 0;
      warnings_.push_back("the tree log of the newest commit is left out with its root tree");
    }
    return Status::Ok();
  };
  if (const uint64_t given = options_.rescue.tree_root; given != 0) {
    if (options_.writable) return Status::Invalid("a root tree given by its address (tree-root) is read only");
    auto b = read(tree::RootPtr{given, -1, 0, kRootTreeObjectid});
    if (!b.ok()) return b.status().WithContext("the root tree given (tree-root " + std::to_string(given) + ")");
    const tree::RootPtr r{given, (*b)->level(), (*b)->generation(), kRootTreeObjectid};
    return take_older(r, "root tree: the block at " + std::to_string(given) + " of generation " +
                             std::to_string(r.generation) + " given (tree-root); the superblock's is of generation " +
                             std::to_string(super_.generation.get()));
  }
  const Status current = read(root_tree_).status();
  if (current.ok()) return current;
  if (!options_.rescue.use_backup_root || options_.writable) {
    return WithHint(current.WithContext("root tree"),
                    options_.writable ? "" : "the rescue option usebackuproot tries the superblock's backup roots");
  }
  // Newest first, as the kernel tries them; a backup of the current root
  // (the commit that wrote this superblock keeps one) fails the same way.
  std::vector<const RootBackup*> backups;
  for (const RootBackup& b : super_.super_roots) {
    if (b.tree_root.get() != 0 && b.tree_root.get() != root_tree_.bytenr &&
        b.tree_root_gen.get() < super_.generation.get()) {
      backups.push_back(&b);
    }
  }
  std::sort(backups.begin(), backups.end(),
            [](const RootBackup* a, const RootBackup* b) { return a->tree_root_gen.get() > b->tree_root_gen.get(); });
  std::string tried;
  for (const RootBackup* b : backups) {
    const tree::RootPtr r{b->tree_root.get(), b->tree_root_level, b->tree_root_gen.get(), kRootTreeObjectid};
    if (r.level >= kMaxLevel) continue;
    const Status st = read(r).status();
    if (!st.ok()) {
      tried += "; generation " + std::to_string(r.generation) + ": " + st.message();
      continue;
    }
    return take_older(r, "root tree: " + current.message() + ": using the backup root of generation " +
                             std::to_string(r.generation) + " (rescue=usebackuproot; what the last " +
                             std::to_string(super_.generation.get() - r.generation) +
                             " commit(s) changed is not seen)");
  }
  return WithHint(current.WithContext("root tree"),
                  backups.empty() ? "no older backup root to try" : "no backup root reads either" + tried);
}

Status Volume::LoadCsumRoot() {
  auto csum = FindRoot(kCsumTreeObjectid);
  if (!csum.ok() && csum.status().code() == ENOENT) {
    warnings_.push_back("the csum tree is missing: file data cannot be verified");
    return Status::Ok();
  }
  Status st = csum.status();
  // Its root block too, as the kernel's mount reads it: a bad one is named
  // now, with the way around it, and a rescue open knows to leave it out.
  // Not with devices missing (a sprout opened without its seed): the open
  // goes on to say which, and reads fail where they must.
  if (st.ok() && (missing_.empty() || options_.rescue.ignore_bad_roots)) {
    st = reader_->Read(tree::BlockCheck{csum->ref.bytenr, csum->ref.level, csum->ref.generation, {}}).status();
    st = st.WithContext("csum tree");
  }
  if (st.ok()) return st;
  if (!options_.rescue.ignore_bad_roots || options_.writable) {
    return WithHint(st, options_.writable ? "" : "the rescue option ignorebadroots reads file data without it");
  }
  csum_tree_ignored_ = true;
  warnings_.push_back(st.message() + ": file data is read without checksums (rescue=ignorebadroots)");
  return Status::Ok();
}

}  // namespace ubtrfs::txn
