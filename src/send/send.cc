// Send: a full stream of a read-only subvolume, in the order the kernel's
// fs/btrfs/send.c gives a receiver what it needs: a directory before what it
// holds, a file's data, xattrs, owner (before the mode, which chown's
// set-id clearing would undo), mode and times, and a directory's times only
// after its entries (each entry made changes them). Hard links after the
// first name are LINK commands. Holes are not sent: TRUNCATE sets the size.
// Unlike the kernel, new inodes are made under their final names (the
// kernel's o<ino>-<gen>-0 names serve incremental renames, which a full
// stream has none of). Only the public Filesystem calls are used.
#include <sys/stat.h>

#include <map>

#include "send/stream.h"
#include "ubtrfs/send.h"

namespace ubtrfs {

namespace {

using namespace send;

// What the kernel puts in one v1 WRITE (BTRFS_SEND_READ_SIZE).
constexpr size_t kWriteChunk = 48 * 1024;

class Sender {
 public:
  Sender(Filesystem& fs, StreamWriter& w, uint64_t root) : fs_(fs), w_(w), root_(root) {}

  Status Top(InodeId top, const std::string& name, const SubvolumeInfo& info) {
    w_.Begin(kCmdSubvol);
    w_.String(kAttrPath, name);
    w_.PutUuid(kAttrUuid, info.uuid);
    w_.U64(kAttrCtransid, info.ctransid);
    UB_RETURN_IF_ERROR(w_.End());
    UB_ASSIGN_OR_RETURN(Stat st, fs_.GetStat(top));
    UB_RETURN_IF_ERROR(Attrs("", top, st));
    UB_RETURN_IF_ERROR(Dir(top, ""));
    return Times("", st);
  }

 private:
  static std::string Join(const std::string& dir, const std::string& name) {
    return dir.empty() ? name : dir + "/" + name;
  }

  Status Dir(InodeId dir, const std::string& path) {
    UB_ASSIGN_OR_RETURN(auto entries, fs_.ReadDir(dir));
    for (const DirEntry& e : entries) {
      const std::string p = Join(path, e.name);
      if (e.id.root != root_) {
        // A nested subvolume is not part of this one: its place stays an
        // empty directory, as the snapshot shows it.
        w_.Begin(kCmdMkdir);
        w_.String(kAttrPath, p);
        w_.U64(kAttrIno, e.id.ino);
        UB_RETURN_IF_ERROR(w_.End());
        continue;
      }
      UB_ASSIGN_OR_RETURN(Stat st, fs_.GetStat(e.id));
      if (auto it = first_path_.find(e.id.ino); it != first_path_.end()) {
        w_.Begin(kCmdLink);
        w_.String(kAttrPath, p);
        w_.String(kAttrPathLink, it->second);
        UB_RETURN_IF_ERROR(w_.End());
        continue;
      }
      if (!S_ISDIR(st.mode) && st.nlink > 1) first_path_.emplace(e.id.ino, p);
      UB_RETURN_IF_ERROR(Make(e.id, p, st));
      if (S_ISREG(st.mode)) UB_RETURN_IF_ERROR(Data(e.id, p, st));
      UB_RETURN_IF_ERROR(Attrs(p, e.id, st));
      if (S_ISDIR(st.mode)) UB_RETURN_IF_ERROR(Dir(e.id, p));
      UB_RETURN_IF_ERROR(Times(p, st));
    }
    return Status::Ok();
  }

  Status Make(InodeId id, const std::string& p, const Stat& st) {
    const uint32_t fmt = st.mode & S_IFMT;
    uint16_t cmd = fmt == S_IFREG ? kCmdMkfile : fmt == S_IFDIR ? kCmdMkdir : fmt == S_IFLNK ? kCmdSymlink
                   : fmt == S_IFIFO ? kCmdMkfifo : fmt == S_IFSOCK ? kCmdMksock : kCmdMknod;
    std::string target;
    if (cmd == kCmdSymlink) {
      UB_ASSIGN_OR_RETURN(target, fs_.ReadLink(id));
    }
    if (cmd == kCmdMknod && fmt != S_IFCHR && fmt != S_IFBLK) {
      return Status::Corrupt(p + ": inode of unknown type " + std::to_string(st.mode));
    }
    w_.Begin(cmd);
    w_.String(kAttrPath, p);
    w_.U64(kAttrIno, id.ino);
    if (cmd == kCmdSymlink) w_.String(kAttrPathLink, target);
    if (cmd == kCmdMknod) {
      w_.U64(kAttrMode, st.mode);
      w_.U64(kAttrRdev, st.rdev);
    }
    return w_.End();
  }

  Status Data(InodeId id, const std::string& p, const Stat& st) {
    std::vector<uint8_t> buf(kWriteChunk);
    for (uint64_t off = 0; off < st.size;) {
      auto data = fs_.SeekHole(id, off, false);
      if (!data.ok() && data.status().code() == ENXIO) break;  // only holes follow
      UB_RETURN_IF_ERROR(data.status());
      UB_ASSIGN_OR_RETURN(uint64_t hole, fs_.SeekHole(id, *data, true));
      for (off = *data; off < hole;) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(kWriteChunk, hole - off));
        UB_ASSIGN_OR_RETURN(size_t n, fs_.Read(id, off, std::span(buf.data(), want)));
        if (n == 0) return Status::Corrupt(p + ": read ends at " + std::to_string(off) + " before its size");
        w_.Begin(kCmdWrite);
        w_.String(kAttrPath, p);
        w_.U64(kAttrFileOffset, off);
        w_.Data(std::span(buf.data(), n));
        UB_RETURN_IF_ERROR(w_.End());
        off += n;
      }
    }
    w_.Begin(kCmdTruncate);
    w_.String(kAttrPath, p);
    w_.U64(kAttrSize, st.size);
    return w_.End();
  }

  Status Attrs(const std::string& p, InodeId id, const Stat& st) {
    UB_ASSIGN_OR_RETURN(auto names, fs_.ListXattr(id));
    for (const std::string& n : names) {
      UB_ASSIGN_OR_RETURN(std::string v, fs_.GetXattr(id, n));
      w_.Begin(kCmdSetXattr);
      w_.String(kAttrPath, p);
      w_.String(kAttrXattrName, n);
      w_.String(kAttrXattrData, v);
      UB_RETURN_IF_ERROR(w_.End());
    }
    w_.Begin(kCmdChown);
    w_.String(kAttrPath, p);
    w_.U64(kAttrUid, st.uid);
    w_.U64(kAttrGid, st.gid);
    UB_RETURN_IF_ERROR(w_.End());
    if (S_ISLNK(st.mode)) return Status::Ok();
    w_.Begin(kCmdChmod);
    w_.String(kAttrPath, p);
    w_.U64(kAttrMode, st.mode & 07777);
    return w_.End();
  }

  Status Times(const std::string& p, const Stat& st) {
    w_.Begin(kCmdUtimes);
    w_.String(kAttrPath, p);
    w_.Time(kAttrAtime, Timespec{static_cast<uint64_t>(st.atime.sec), st.atime.nsec});
    w_.Time(kAttrMtime, Timespec{static_cast<uint64_t>(st.mtime.sec), st.mtime.nsec});
    w_.Time(kAttrCtime, Timespec{static_cast<uint64_t>(st.ctime.sec), st.ctime.nsec});
    return w_.End();
  }

  Filesystem& fs_;
  StreamWriter& w_;
  uint64_t root_;
  std::map<uint64_t, std::string> first_path_;  // hard-linked inodes already made
};

}  // namespace

Status Send(Filesystem& fs, InodeId subvol, const StreamSink& sink, const SendOptions& options) {
  if (options.proto < 1 || options.proto > 2) return Status::Invalid("send: protocol 1 or 2");
  UB_ASSIGN_OR_RETURN(auto subvols, fs.ListSubvolumes());
  const SubvolumeInfo* info = nullptr;
  for (const auto& s : subvols) {
    if (s.id == subvol.root) info = &s;
  }
  if (info == nullptr) return Status::Invalid("send: the top level (5) or no subvolume's top");
  UB_ASSIGN_OR_RETURN(const bool ro, fs.SubvolumeReadOnly(subvol));
  if (!ro) return Status::Invalid("send: subvolume " + info->path + " is not read-only (btrfs send sends only those)");
  const size_t slash = info->path.rfind('/');
  const std::string name = slash == std::string::npos ? info->path : info->path.substr(slash + 1);
  StreamWriter w(options.proto, sink);
  UB_RETURN_IF_ERROR(w.WriteHeader());
  Sender s(fs, w, subvol.root);
  UB_RETURN_IF_ERROR(s.Top(subvol, name, *info));
  w.Begin(kCmdEnd);
  return w.End();
}

}  // namespace ubtrfs
