// Listing a directory of a damaged tree (RescueOptions::salvage). ReadDir
// walks the directory's DIR_INDEX items with a cursor that steps over tree
// blocks that do not read; what those blocks held is lost to it. A
// directory keeps every name twice, though: its DIR_ITEMs (keyed by name
// hash) lie elsewhere in the tree, mostly in other leaves, and they hold
// the same name, target and type -- all but the index. So each lost range
// is reported, and the names found only among the DIR_ITEMs are listed
// after the others, with indexes past the highest one read.
#include <algorithm>
#include <set>

#include "fs/fs_impl.h"

namespace ubtrfs::fsimpl {

Status FilesystemImpl::SalvageDirEntries(InodeId dir, uint64_t dir_size, const tree::RootPtr& tree,
                                         const std::vector<tree::Cursor::Skipped>& lost, std::vector<DirEntry>* out,
                                         std::vector<SkippedEntry>* skipped) {
  const Key first{dir.ino, kDirIndexKey, 0}, last{dir.ino, kDirIndexKey, UINT64_MAX};
  std::vector<SkippedEntry> ranges;
  for (const auto& l : lost) {
    if (!(l.from <= last && first < l.to)) continue;  // none of this directory's index keys
    const uint64_t from = l.from < first ? 0 : l.from.offset;
    const std::string to = l.to <= last ? " up to index " + std::to_string(l.to.offset) : " on";
    ranges.push_back(SkippedEntry{"", from, "the entries from index " + std::to_string(from) + to +
                                                " did not read (" + l.why.message() + ")",
                                  true});
  }
  if (ranges.empty()) return Status::Ok();
  std::set<std::string, std::less<>> have;
  uint64_t next = 0;
  for (const auto& e : *out) {
    have.insert(e.name);
    next = std::max(next, e.index + 1);
  }
  Cursor c(vol_->source(), tree);
  std::vector<tree::Cursor::Skipped> also_lost;  // DIR_ITEM blocks that do not read either: nothing to add
  c.SkipUnreadable(&also_lost);
  UB_RETURN_IF_ERROR(c.Seek(Key{dir.ino, kDirItemKey, 0}));
  for (; c.Valid(); ) {
    const Key k = c.key();
    if (k.objectid != dir.ino || k.type != kDirItemKey) break;
    auto items = ParseDirItems(c.data(), k);
    for (const auto& e : items.ok() ? *items : std::vector<DirItemView>{}) {
      if (have.count(e.name) != 0) continue;
      auto id = Resolve(dir, e.location, e.name);
      if (!id.ok()) continue;
      have.insert(std::string(e.name));
      out->push_back(DirEntry{std::string(e.name), *id, DtFromFt(e.type), next++});
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  // A directory's size is twice the length of its names: when the names
  // now listed add up to it, none is missing.
  uint64_t name_bytes = 0;
  for (const auto& e : *out) name_bytes += e.name.size();
  const bool whole = 2 * name_bytes == dir_size;
  for (auto& r : ranges) {
    r.reason += whole ? "; every name was found again among the name-hash items"
                      : "; the names the name-hash items keep are listed, others are lost";
    r.lost = !whole;
    if (skipped != nullptr) skipped->push_back(std::move(r));
  }
  return Status::Ok();
}

}  // namespace ubtrfs::fsimpl
