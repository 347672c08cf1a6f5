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

#include "fs/fs_impl.h"
#include "send/incremental.h"
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
      // A nested subvolume is not part of this one, nor is its empty
      // stand-in directory: the kernel's send walks inode references, and
      // a subvolume's entry has none (a root ref instead), so the receiver
      // never sees a name there.
      if (e.id.root != root_) continue;
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
      if (S_ISREG(st.mode) && (st.flags & kStatFlagVerity)) UB_RETURN_IF_ERROR(Verity(e.id, p));
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

  // After the data and the attributes, as the kernel's send; protocol 3
  // only (older streams have no such command and go without).
  Status Verity(InodeId id, const std::string& p) {
    if (w_.version() < 3) return Status::Ok();
    UB_ASSIGN_OR_RETURN(auto v, fs_.GetVerity(id));
    if (!v) return Status::Ok();
    return PutEnableVerity(w_, p, v->params.hash_algorithm, v->params.block_size, v->params.salt,
                           v->params.signature);
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

namespace {

// The subvolume whose top is `top`, read-only (`what` names it in errors).
Result<SubvolumeInfo> ReadOnlyTop(Filesystem& fs, const std::vector<SubvolumeInfo>& subvols, InodeId top,
                                  const std::string& what) {
  const SubvolumeInfo* info = nullptr;
  for (const auto& s : subvols) {
    if (s.id == top.root) info = &s;
  }
  if (info == nullptr) return Status::Invalid("send: " + what + ": the top level (5) or no subvolume's top");
  UB_ASSIGN_OR_RETURN(InodeId real_top, fs.Lookup("/" + info->path));
  if (real_top != top) return Status::Invalid("send: " + what + ": not the top of subvolume " + info->path);
  UB_ASSIGN_OR_RETURN(const bool ro, fs.SubvolumeReadOnly(top));
  if (!ro) {
    return Status::Invalid("send: " + what + ": subvolume " + info->path +
                           " is not read-only (btrfs send sends only those)");
  }
  return *info;
}

}  // namespace

Status Send(Filesystem& fs, InodeId subvol, const StreamSink& sink, const SendOptions& options, SendResult* result) {
  if (options.proto < 1 || options.proto > 3) return Status::Invalid("send: protocol 1, 2 or 3");
  if (options.compressed_data && options.proto < 2) {
    return Status::Invalid("send: compressed data needs protocol 2 or later");
  }
  SendResult local;
  SendResult* res = result ? result : &local;
  *res = SendResult{};
  UB_ASSIGN_OR_RETURN(auto subvols, fs.ListSubvolumes());
  UB_ASSIGN_OR_RETURN(SubvolumeInfo info, ReadOnlyTop(fs, subvols, subvol, "the subvolume"));
  if (options.parent) {
    UB_RETURN_IF_ERROR(ReadOnlyTop(fs, subvols, *options.parent, "the parent").status());
    if (options.parent->root == subvol.root) return Status::Invalid("send: the parent is the subvolume itself");
  }
  for (const InodeId& c : options.clone_sources) {
    UB_RETURN_IF_ERROR(ReadOnlyTop(fs, subvols, c, "clone source").status());
  }
  const size_t slash = info.path.rfind('/');
  const std::string name = slash == std::string::npos ? info.path : info.path.substr(slash + 1);
  StreamWriter w(options.proto, [&](std::span<const uint8_t> b) {
    res->stream_bytes += b.size();
    return sink(b);
  });
  UB_RETURN_IF_ERROR(w.WriteHeader());
  if (options.parent || !options.clone_sources.empty() || options.compressed_data) {
    auto* impl = dynamic_cast<fsimpl::FilesystemImpl*>(&fs);
    if (impl == nullptr) return Status::Unsupported("send: incremental streams from this Filesystem");
    return SendByComparison(*impl, w, options, res, subvol.root, name);
  }
  // A receiver knows a subvolume received from elsewhere by its received
  // uuid, as the kernel's send names it.
  if (info.received_uuid != std::array<uint8_t, 16>{}) info.uuid = info.received_uuid;
  Sender s(fs, w, subvol.root);
  UB_RETURN_IF_ERROR(s.Top(subvol, name, info));
  w.Begin(kCmdEnd);
  return w.End();
}

}  // namespace ubtrfs
