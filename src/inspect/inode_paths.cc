#include "inspect/inode_paths.h"

#include <cstring>

#include "format/key.h"
#include "format/ondisk.h"

namespace ubtrfs::inspect {
namespace {

using format::Key;

// Deeper than any directory tree the kernel lets one build (PATH_MAX bounds
// a path's length, so its depth) and than any nesting of subvolumes.
constexpr int kMaxDepth = 4096;

}  // namespace

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "/" + b;
}

Result<tree::RootPtr> PathResolver::Root(uint64_t id) {
  if (auto it = roots_.find(id); it != roots_.end()) return it->second;
  UB_ASSIGN_OR_RETURN(auto r, vol_->FindRoot(id));
  roots_[id] = r.ref;
  return r.ref;
}

Result<std::vector<std::pair<uint64_t, std::string>>> PathResolver::Links(uint64_t root, uint64_t ino) {
  UB_ASSIGN_OR_RETURN(auto rp, Root(root));
  std::vector<std::pair<uint64_t, std::string>> links;
  tree::Cursor c(vol_->source(), rp);
  Status st = c.Seek(Key{ino, format::kInodeRefKey, 0});
  for (; st.ok() && c.Valid(); st = c.Next()) {
    const Key k = c.key();
    if (k.objectid != ino || (k.type != format::kInodeRefKey && k.type != format::kInodeExtrefKey)) break;
    auto d = c.data();
    size_t pos = 0;
    // Several names may share an item (links in one directory, or extended
    // refs whose hashes collide); each is read only within the item.
    while (pos < d.size()) {
      uint64_t parent = 0;
      size_t head = 0, name_len = 0;
      if (k.type == format::kInodeRefKey) {
        if (d.size() - pos < sizeof(format::InodeRef)) break;
        format::InodeRef r;
        std::memcpy(&r, d.data() + pos, sizeof(r));
        parent = k.offset;
        head = sizeof(r);
        name_len = r.name_len.get();
      } else {
        if (d.size() - pos < sizeof(format::InodeExtref)) break;
        format::InodeExtref r;
        std::memcpy(&r, d.data() + pos, sizeof(r));
        parent = r.parent_objectid.get();
        head = sizeof(r);
        name_len = r.name_len.get();
      }
      if (d.size() - pos - head < name_len) {
        return Status::Corrupt("tree " + std::to_string(root) + ": " + format::KeyToString(k) +
                               ": a name runs past its item");
      }
      links.emplace_back(parent, std::string(reinterpret_cast<const char*>(d.data() + pos + head), name_len));
      pos += head + name_len;
    }
  }
  UB_RETURN_IF_ERROR(st.WithContext("tree " + std::to_string(root)));
  return links;
}

Result<std::string> PathResolver::DirPath(uint64_t root, uint64_t dir, int depth) {
  if (dir == format::kFirstFreeObjectid) return std::string();
  if (depth > kMaxDepth) {
    return Status::Corrupt("tree " + std::to_string(root) + ": directory " + std::to_string(dir) +
                           " is more than " + std::to_string(kMaxDepth) + " levels deep (a loop of parents?)");
  }
  if (auto it = dirs_.find({root, dir}); it != dirs_.end()) return it->second;
  UB_ASSIGN_OR_RETURN(auto links, Links(root, dir));
  if (links.empty()) {
    return Status::NotFound("tree " + std::to_string(root) + ": directory " + std::to_string(dir) +
                            " has no name");
  }
  // A directory has one link; its first is its path.
  const auto& [parent, name] = links.front();
  if (parent == dir) {
    return Status::Corrupt("tree " + std::to_string(root) + ": directory " + std::to_string(dir) +
                           " is its own parent");
  }
  UB_ASSIGN_OR_RETURN(std::string up, DirPath(root, parent, depth + 1));
  std::string path = JoinPath(up, name);
  dirs_[{root, dir}] = path;
  return path;
}

Result<std::string> PathResolver::SubvolPath(uint64_t root) { return SubvolPathAt(root, 0); }

Result<std::string> PathResolver::SubvolPathAt(uint64_t root, int depth) {
  if (root == format::kFsTreeObjectid) return std::string();
  if (auto it = subvols_.find(root); it != subvols_.end()) return it->second;
  if (depth > kMaxDepth) {
    return Status::Corrupt("subvolume " + std::to_string(root) + " is nested more than " +
                           std::to_string(kMaxDepth) + " deep (a loop of ROOT_BACKREFs?)");
  }
  tree::Cursor c(vol_->source(), vol_->root_tree());
  Status st = c.Seek(Key{root, format::kRootBackrefKey, 0});
  UB_RETURN_IF_ERROR(st.WithContext("root tree"));
  if (!c.Valid() || c.key().objectid != root || c.key().type != format::kRootBackrefKey) {
    return Status::NotFound("subvolume " + std::to_string(root) + " is in no directory (deleted?)");
  }
  const uint64_t parent = c.key().offset;
  auto d = c.data();
  format::RootRef r;
  if (d.size() < sizeof(r)) return Status::Corrupt("root tree: " + format::KeyToString(c.key()) + ": item too short");
  std::memcpy(&r, d.data(), sizeof(r));
  if (d.size() - sizeof(r) < r.name_len.get()) {
    return Status::Corrupt("root tree: " + format::KeyToString(c.key()) + ": the name runs past the item");
  }
  std::string name(reinterpret_cast<const char*>(d.data() + sizeof(r)), r.name_len.get());
  if (parent == root) return Status::Corrupt("subvolume " + std::to_string(root) + " is its own parent");
  UB_ASSIGN_OR_RETURN(std::string up, SubvolPathAt(parent, depth + 1));
  UB_ASSIGN_OR_RETURN(std::string dir, DirPath(parent, r.dirid.get(), 0));
  std::string path = JoinPath(JoinPath(up, dir), name);
  subvols_[root] = path;
  return path;
}

Result<std::vector<std::string>> PathResolver::InodePaths(uint64_t root, uint64_t ino) {
  UB_ASSIGN_OR_RETURN(std::string top, SubvolPath(root));
  if (ino == format::kFirstFreeObjectid) return std::vector<std::string>{top};
  UB_ASSIGN_OR_RETURN(auto links, Links(root, ino));
  if (links.empty()) {
    return Status::NotFound("tree " + std::to_string(root) + ": inode " + std::to_string(ino) + " has no name");
  }
  std::vector<std::string> paths;
  for (const auto& [parent, name] : links) {
    UB_ASSIGN_OR_RETURN(std::string dir, DirPath(root, parent, 0));
    paths.push_back(JoinPath(JoinPath(top, dir), name));
  }
  return paths;
}

}  // namespace ubtrfs::inspect
