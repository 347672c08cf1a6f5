// mkfs --rootdir of a directory: its --subvol directories made subvolumes
// (imported each on its own, then read-only and default flags set) and its
// --inode-flags paths, checked against the directory.
#include "fs/rootdir_import.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string_view>

namespace ubtrfs::fs {
namespace {

// `path` below the canonical directory `root` as a canonical path relative
// to it ("" for `root` itself), following symlinks as realpath does; an
// error message (empty result) when it does not exist or leads outside.
std::optional<std::string> RelBelow(const std::string& root, const std::string& path, std::string* err) {
  const std::string joined = root + "/" + path;
  char* real = ::realpath(joined.c_str(), nullptr);
  if (!real) {
    *err = path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  const std::string r = real;
  std::free(real);
  if (r == root) return std::string();
  if (r.size() <= root.size() || r.compare(0, root.size(), root) != 0 || r[root.size()] != '/') {
    *err = path + ": not below --rootdir " + root;
    return std::nullopt;
  }
  return r.substr(root.size() + 1);
}

// The import options for the tree at `base` (relative to the rootdir, ""
// for the rootdir): the subvolumes below it are left out, and the inode
// flags below it keyed relative to it.
ImportOptions ImportOptionsFor(const std::string& base, const std::vector<SubvolSpec>& subvols,
                               const std::map<std::string, uint32_t>& flags,
                               const std::optional<std::pair<uint32_t, uint32_t>>& owner,
                               const std::optional<Time>& max_time,
                               const std::function<void(const ImportStats&)>& progress, bool reflink) {
  ImportOptions io;
  io.reflink = reflink;
  io.progress = progress;
  io.owner = owner;
  io.max_time = max_time;
  io.bulk = true;  // a new image: only the end state counts
  auto below = [&](const std::string& p) -> std::optional<std::string> {
    if (base.empty()) return p;
    if (p == base) return std::string();
    if (p.size() > base.size() && p.compare(0, base.size(), base) == 0 && p[base.size()] == '/') {
      return p.substr(base.size() + 1);
    }
    return std::nullopt;
  };
  for (const auto& s : subvols) {
    if (auto r = below(s.rel); r && !r->empty()) io.skip.push_back(*r);
  }
  for (const auto& [p, bits] : flags) {
    if (auto r = below(p)) io.inode_flags.emplace(*r, bits);
  }
  return io;
}

}  // namespace

// --subvol values as mkfs.btrfs: an optional rw:, ro:, default: or
// default-ro: prefix (anything else before a colon is part of the path; a
// leading ./ keeps a path like "ro:x" whole), the directory relative to the
// rootdir; each an existing directory below it, none twice, one default.
std::optional<std::vector<SubvolSpec>> ParseSubvols(const std::vector<std::string>& args, const std::string& root,
                                                    std::string* err) {
  std::vector<SubvolSpec> out;
  bool have_default = false;
  for (const std::string& a : args) {
    SubvolSpec s;
    std::string path = a;
    static const std::pair<const char*, std::pair<bool, bool>> kPrefixes[] = {
        {"rw:", {false, false}}, {"ro:", {true, false}}, {"default:", {false, true}}, {"default-ro:", {true, true}}};
    for (const auto& [prefix, flags] : kPrefixes) {
      if (a.rfind(prefix, 0) == 0) {
        path = a.substr(std::strlen(prefix));
        s.read_only = flags.first;
        s.is_default = flags.second;
        break;
      }
    }
    if (path.empty()) {
      *err = "--subvol " + a + ": no directory given";
      return std::nullopt;
    }
    std::string why;
    auto rel = RelBelow(root, path, &why);
    if (!rel) {
      *err = "--subvol " + a + ": " + why;
      return std::nullopt;
    }
    if (rel->empty()) {
      *err = "--subvol " + a + ": the --rootdir itself cannot be a subvolume (it is the top level)";
      return std::nullopt;
    }
    struct stat st;
    if (::lstat((root + "/" + *rel).c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      *err = "--subvol " + a + ": not a directory";
      return std::nullopt;
    }
    for (const auto& o : out) {
      if (o.rel == *rel) {
        *err = "--subvol " + a + ": " + *rel + " is given more than once";
        return std::nullopt;
      }
    }
    if (s.is_default) {
      if (have_default) {
        *err = "--subvol " + a + ": only one default (default: or default-ro:) subvolume may be given";
        return std::nullopt;
      }
      have_default = true;
    }
    s.rel = *rel;
    out.push_back(std::move(s));
  }
  return out;
}

// --inode-flags values: FLAG[,FLAG...]:PATH with nodatacow and nodatasum,
// PATH relative to the rootdir (the rootdir itself allowed), none twice.
std::optional<std::map<std::string, uint32_t>> ParseInodeFlags(const std::vector<std::string>& args,
                                                               const std::string& root, std::string* err) {
  std::map<std::string, uint32_t> out;
  for (const std::string& a : args) {
    const size_t colon = a.find(':');
    if (colon == std::string::npos || colon + 1 == a.size()) {
      *err = "--inode-flags " + a + ": expected FLAGS:PATH (FLAGS nodatacow and/or nodatasum, comma-separated)";
      return std::nullopt;
    }
    uint32_t bits = 0;
    std::string_view flags = std::string_view(a).substr(0, colon);
    while (!flags.empty()) {
      const size_t comma = flags.find(',');
      const std::string_view f = flags.substr(0, comma);
      if (f == "nodatacow") {
        bits |= kImportNodatacow;
      } else if (f == "nodatasum") {
        bits |= kImportNodatasum;
      } else {
        *err = "--inode-flags " + a + ": unknown flag '" + std::string(f) + "' (nodatacow or nodatasum)";
        return std::nullopt;
      }
      flags = comma == std::string_view::npos ? std::string_view() : flags.substr(comma + 1);
    }
    std::string why;
    auto rel = RelBelow(root, a.substr(colon + 1), &why);
    if (!rel) {
      *err = "--inode-flags " + a + ": " + why;
      return std::nullopt;
    }
    if (!out.emplace(*rel, bits).second) {
      *err = "--inode-flags " + a + ": " + (rel->empty() ? std::string(".") : *rel) + " is given more than once";
      return std::nullopt;
    }
  }
  return out;
}

// Imports the rootdir with its --subvol directories as subvolumes, then
// sets their read-only flags and the default subvolume.
Status ImportRootdir(Filesystem& fs, const std::string& root, const std::vector<SubvolSpec>& subvols_in,
                     const std::map<std::string, uint32_t>& flags,
                     const std::optional<std::pair<uint32_t, uint32_t>>& owner,
                     const std::optional<Time>& max_time,
                     const std::function<void(const ImportStats&)>& progress, ImportStats* stats, bool reflink) {
  UB_RETURN_IF_ERROR(ImportContents(fs, root, fs.Root(), ImportOptionsFor("", subvols_in, flags, owner, max_time, progress, reflink), stats));
  // Parents before children: a path sorts before the paths below it.
  std::vector<SubvolSpec> subvols = subvols_in;
  std::sort(subvols.begin(), subvols.end(), [](const auto& x, const auto& y) { return x.rel < y.rel; });
  std::set<std::string> parents;  // directories that got a subvolume entry: their times are restored after
  std::vector<std::pair<const SubvolSpec*, InodeId>> made;
  for (const auto& s : subvols) {
    const size_t slash = s.rel.rfind('/');
    const std::string parent = slash == std::string::npos ? "" : s.rel.substr(0, slash);
    const std::string name = slash == std::string::npos ? s.rel : s.rel.substr(slash + 1);
    const std::string host = root + "/" + s.rel;
    UB_ASSIGN_OR_RETURN(InodeId dir, parent.empty() ? fs.Root() : fs.Lookup("/" + parent));
    struct stat st;
    if (::lstat(host.c_str(), &st) != 0) return Status::Error(errno, host + ": lstat: " + std::strerror(errno));
    NewInode a;
    a.mode = st.st_mode & 07777;
    a.uid = owner ? owner->first : st.st_uid;
    a.gid = owner ? owner->second : st.st_gid;
    auto made_top = fs.CreateSubvolume(dir, name, a);
    if (!made_top.ok()) return made_top.status().WithContext("subvolume " + s.rel);
    const InodeId top = *made_top;
    UB_RETURN_IF_ERROR(ImportContents(fs, host, top, ImportOptionsFor(s.rel, subvols, flags, owner, max_time, progress, reflink), stats)
                           .WithContext("subvolume " + s.rel));
    ++stats->dirs;
    parents.insert(parent);
    made.emplace_back(&s, top);
  }
  // A new entry changed its directory's times: back to the host's.
  for (const auto& p : parents) {
    const std::string host = p.empty() ? root : root + "/" + p;
    struct stat st;
    if (::lstat(host.c_str(), &st) != 0) return Status::Error(errno, host + ": lstat: " + std::strerror(errno));
    UB_ASSIGN_OR_RETURN(InodeId dir, p.empty() ? fs.Root() : fs.Lookup("/" + p));
    auto clamped = [&](const timespec& ts) {
      const Time t{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)};
      return max_time && (t.sec > max_time->sec || (t.sec == max_time->sec && t.nsec > max_time->nsec)) ? *max_time
                                                                                                            : t;
    };
    AttrChange c;
    c.atime = clamped(st.st_atim);
    c.mtime = clamped(st.st_mtim);
    c.ctime = clamped(st.st_ctim);
    UB_RETURN_IF_ERROR(fs.SetAttr(dir, c).WithContext(host));
  }
  UB_RETURN_IF_ERROR(fs.Commit());
  for (const auto& [s, top] : made) {
    if (s->read_only) UB_RETURN_IF_ERROR(fs.SetSubvolumeReadOnly(top, true).WithContext("subvolume " + s->rel));
    if (s->is_default) UB_RETURN_IF_ERROR(fs.SetDefaultSubvolume(top.root).WithContext("subvolume " + s->rel));
  }
  return Status::Ok();
}

}  // namespace ubtrfs::fs
