// `ubtrfs cp --reflink IMAGE:SRC IMAGE:DST`: a copy inside one image whose
// regular files share their data with the originals (Filesystem::Clone), as
// `cp -r --reflink=always` on a kernel mount; directories, symlinks and
// special files are made anew. Modes, owners, times, xattrs and hard links
// are kept as the other cp directions keep them. One commit at the end.
#include <sys/stat.h>

#include <map>
#include <utility>

#include <fmt/core.h>

#include "cli/commands.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {

struct IdLess {
  bool operator()(const InodeId& a, const InodeId& b) const {
    return a.root != b.root ? a.root < b.root : a.ino < b.ino;
  }
};

class ReflinkCopier {
 public:
  explicit ReflinkCopier(Filesystem& fs) : fs_(fs) {}

  // Copies `src` (named `what` in messages) as `name` in `dir`.
  Status Copy(InodeId src, const std::string& what, InodeId dir, const std::string& name) {
    UB_ASSIGN_OR_RETURN(Stat st, fs_.GetStat(src));
    NewInode attrs;
    attrs.mode = st.mode & 07777;
    attrs.uid = st.uid;
    attrs.gid = st.gid;
    attrs.atime = st.atime;
    attrs.mtime = st.mtime;
    const uint32_t type = st.mode & S_IFMT;
    if (type != S_IFDIR && st.nlink > 1) {
      // A second name of an inode already copied: a hard link, as cp -a.
      if (auto it = copied_.find(src); it != copied_.end()) {
        return fs_.Link(it->second, dir, name).WithContext(what);
      }
    }
    InodeId made;
    switch (type) {
      case S_IFDIR: {
        UB_ASSIGN_OR_RETURN(made, fs_.Mkdir(dir, name, attrs));
        made_dirs_.emplace(made, true);
        UB_ASSIGN_OR_RETURN(auto entries, fs_.ReadDir(src));
        for (const DirEntry& e : entries) {
          // What this copy made inside its own source is not copied again.
          if (made_dirs_.count(e.id) != 0 || made_files_.count(e.id) != 0) continue;
          UB_RETURN_IF_ERROR(Copy(e.id, what + "/" + e.name, made, e.name));
        }
        break;
      }
      case S_IFREG: {
        UB_ASSIGN_OR_RETURN(made, fs_.Create(dir, name, attrs));
        made_files_.emplace(made, true);
        UB_RETURN_IF_ERROR(fs_.Clone(src, 0, made, 0, 0).WithContext(what));
        break;
      }
      case S_IFLNK: {
        UB_ASSIGN_OR_RETURN(std::string target, fs_.ReadLink(src));
        UB_ASSIGN_OR_RETURN(made, fs_.Symlink(dir, name, target, attrs));
        break;
      }
      default: {
        attrs.mode = st.mode;
        attrs.rdev = st.rdev;
        UB_ASSIGN_OR_RETURN(made, fs_.Mknod(dir, name, attrs));
        break;
      }
    }
    if (type != S_IFDIR) copied_.emplace(src, made);
    UB_ASSIGN_OR_RETURN(auto names, fs_.ListXattr(src));
    for (const std::string& x : names) {
      UB_ASSIGN_OR_RETURN(std::string value, fs_.GetXattr(src, x));
      UB_RETURN_IF_ERROR(fs_.SetXattr(made, x, value).WithContext(what + ": xattr " + x));
    }
    // The clone and the entries made inside stamped the times: put them back.
    AttrChange times;
    times.atime = st.atime;
    times.mtime = st.mtime;
    return fs_.SetAttr(made, times).WithContext(what);
  }

 private:
  Filesystem& fs_;
  std::map<InodeId, InodeId, IdLess> copied_;  // source inode -> its copy (hard links)
  std::map<InodeId, bool, IdLess> made_dirs_, made_files_;
};

void Fail(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: cp: {}: {}\n", what, st.ToString());
  SetExitCode(1);
}

}  // namespace

void CopyReflink(const std::string& image, const std::string& src_path, const std::string& dst_path) {
  OpenOptions o;
  o.writable = true;
  o.node_cache_bytes = 16ull << 20;
  auto opened = OpenImage(image, o);
  if (!opened.ok()) return Fail(image, opened.status());
  Filesystem& fs = **opened;
  for (const auto& w : fs.Warnings()) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", image, w);
  auto src = fs.Lookup(src_path);
  if (!src.ok()) return Fail(src_path, src.status());
  auto where = CopyInTarget(fs, src_path, dst_path);
  if (!where.ok()) return Fail(dst_path, where.status());
  const auto& [dir, name] = *where;
  // A directory copied into itself would never end.
  InodeId up = dir;
  for (int depth = 0; depth < 4096; ++depth) {
    if (up == *src) {
      return Fail(src_path, Status::Invalid("cannot copy a directory into itself, '" + dst_path + "'"));
    }
    auto parent = fs.LookupChild(up, "..");
    if (!parent.ok() || *parent == up) break;
    up = *parent;
  }
  ReflinkCopier copier(fs);
  if (Status st = copier.Copy(*src, src_path, dir, name); !st.ok()) return Fail(src_path, st);
  if (Status st = fs.Commit(); !st.ok()) Fail(image + ": commit", st);
}

}  // namespace ubtrfs::cli
