// Receive: a send stream applied to an image, with the behaviour of
// btrfs-progs' cmds/receive.c (SUBVOL creates the subvolume, SNAPSHOT
// snapshots the parent found by received uuid, else by uuid; commands act
// on paths relative to the subvolume's top; at the end the subvolume gets
// its received uuid and stransid and becomes read-only). The operations are
// the library's public ones; the only internal hooks are the held commits
// (one transaction for the whole stream) and SetReceivedSubvol.
#include <sys/stat.h>

#include <cstring>
#include <map>

#include "fs/compress.h"
#include "fs/compress_write.h"
#include "fs/fs_impl.h"
#include "send/stream.h"
#include "ubtrfs/send.h"

namespace ubtrfs {

namespace {

using send::Command;

// The kernel's BTRFS_MAX_UNCOMPRESSED: the most an encoded extent decodes to.
constexpr uint64_t kMaxUnencoded = 128 * 1024;

class Receiver {
 public:
  Receiver(fsimpl::FilesystemImpl& fs, InodeId dest, ReceiveResult* res) : fs_(fs), dest_(dest), res_(res) {}

  Status Apply(const Command& c) {
    ++res_->commands;
    Status st = Dispatch(c);
    if (st.ok()) return st;
    // Stream errors already name the command; the others get it here.
    if (st.message().rfind("send stream:", 0) == 0) return st;
    return c.Error(st.code(), st.message());
  }

  Status Finish() {
    if (!active_) return Status::Ok();
    active_ = false;
    uint8_t uuid[16];
    std::memcpy(uuid, cur_.received_uuid.data(), 16);
    UB_ASSIGN_OR_RETURN(cur_.rtransid, fs_.SetReceivedSubvol(top_, uuid, cur_.stransid));
    res_->subvolumes.push_back(cur_);
    cache_.clear();
    return Status::Ok();
  }

  bool active() const { return active_; }
  // How many of the received subvolumes an intermediate commit made durable.
  size_t committed() const { return committed_; }

 private:
  Status Dispatch(const Command& c) {
    using namespace send;
    if (c.cmd == kCmdSubvol || c.cmd == kCmdSnapshot) return Begin(c);
    if (c.cmd == kCmdEnd) return Finish();
    if (!active_) return c.Error(EINVAL, "comes before any subvol or snapshot command");
    switch (c.cmd) {
      case kCmdMkfile:
      case kCmdMkdir:
      case kCmdMknod:
      case kCmdMkfifo:
      case kCmdMksock:
      case kCmdSymlink:
        return Make(c);
      case kCmdRename: {
        UB_ASSIGN_OR_RETURN(auto from, c.String(kAttrPath));
        UB_ASSIGN_OR_RETURN(auto to, c.String(kAttrPathTo));
        UB_ASSIGN_OR_RETURN(auto a, ResolveParent(from));
        UB_ASSIGN_OR_RETURN(auto b, ResolveParent(to));
        Forget(from);
        Forget(to);
        return fs_.Rename(a.first, a.second, b.first, b.second, 0);
      }
      case kCmdLink: {
        UB_ASSIGN_OR_RETURN(auto path, c.String(kAttrPath));
        UB_ASSIGN_OR_RETURN(auto target, c.String(kAttrPathLink));
        UB_ASSIGN_OR_RETURN(InodeId existing, Resolve(target));
        UB_ASSIGN_OR_RETURN(auto at, ResolveParent(path));
        return fs_.Link(existing, at.first, at.second);
      }
      case kCmdUnlink:
      case kCmdRmdir: {
        UB_ASSIGN_OR_RETURN(auto path, c.String(kAttrPath));
        UB_ASSIGN_OR_RETURN(auto at, ResolveParent(path));
        Forget(path);
        return c.cmd == kCmdUnlink ? fs_.Unlink(at.first, at.second) : fs_.Rmdir(at.first, at.second);
      }
      case kCmdSetXattr: {
        UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
        UB_ASSIGN_OR_RETURN(auto name, c.String(kAttrXattrName));
        UB_ASSIGN_OR_RETURN(auto value, c.Bytes(kAttrXattrData));
        return fs_.SetXattr(id, name, std::string_view(reinterpret_cast<const char*>(value.data()), value.size()), 0);
      }
      case kCmdRemoveXattr: {
        UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
        UB_ASSIGN_OR_RETURN(auto name, c.String(kAttrXattrName));
        return fs_.RemoveXattr(id, name);
      }
      case kCmdWrite: {
        UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
        UB_ASSIGN_OR_RETURN(uint64_t off, c.U64(kAttrFileOffset));
        UB_ASSIGN_OR_RETURN(auto data, c.Bytes(kAttrData));
        return WriteAll(id, off, data);
      }
      case kCmdClone:
        return CloneCmd(c);
      case kCmdTruncate: {
        UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
        UB_ASSIGN_OR_RETURN(uint64_t size, c.U64(kAttrSize));
        AttrChange ch;
        ch.size = size;
        return fs_.SetAttr(id, ch);
      }
      case kCmdChmod: {
        UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
        UB_ASSIGN_OR_RETURN(uint64_t mode, c.U64(kAttrMode));
        AttrChange ch;
        ch.mode = static_cast<uint32_t>(mode & 07777);
        return fs_.SetAttr(id, ch);
      }
      case kCmdChown: {
        UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
        UB_ASSIGN_OR_RETURN(uint64_t uid, c.U64(kAttrUid));
        UB_ASSIGN_OR_RETURN(uint64_t gid, c.U64(kAttrGid));
        if (uid > UINT32_MAX || gid > UINT32_MAX) return c.Error(EINVAL, "uid or gid over 32 bits");
        AttrChange ch;
        ch.uid = static_cast<uint32_t>(uid);
        ch.gid = static_cast<uint32_t>(gid);
        return fs_.SetAttr(id, ch);
      }
      case kCmdUtimes: {
        UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
        UB_ASSIGN_OR_RETURN(auto at, c.Time(kAttrAtime));
        UB_ASSIGN_OR_RETURN(auto mt, c.Time(kAttrMtime));
        UB_RETURN_IF_ERROR(c.Time(kAttrCtime).status());
        if (at.nsec >= 1000000000u || mt.nsec >= 1000000000u) return c.Error(EINVAL, "nanoseconds of 1e9 or more");
        // As btrfs receive (utimensat): atime and mtime; ctime becomes now,
        // since no call can set it.
        AttrChange ch;
        ch.atime = Time{static_cast<int64_t>(at.sec), at.nsec};
        ch.mtime = Time{static_cast<int64_t>(mt.sec), mt.nsec};
        return fs_.SetAttr(id, ch);
      }
      case kCmdUpdateExtent:
        // Only in --no-data streams, where the receiver has nothing to write.
        UB_RETURN_IF_ERROR(c.String(kAttrPath).status());
        return Status::Ok();
      case kCmdFallocate: {
        UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
        UB_ASSIGN_OR_RETURN(uint32_t mode, c.U32(kAttrFallocateMode));
        UB_ASSIGN_OR_RETURN(uint64_t off, c.U64(kAttrFileOffset));
        UB_ASSIGN_OR_RETURN(uint64_t len, c.U64(kAttrSize));
        return fs_.Fallocate(id, static_cast<int>(mode), off, len);
      }
      case kCmdFileattr:
        // btrfs receive ignores it too (progs 6.x: the flags cannot be set
        // through FS_IOC_SETFLAGS as they come).
        UB_RETURN_IF_ERROR(c.String(kAttrPath).status());
        return c.U64(kAttrFileattr).status();
      case kCmdEncodedWrite:
        return EncodedWrite(c);
      case kCmdEnableVerity: {
        // As btrfs receive: the tree is built anew here from the received
        // data, with the sender's parameters.
        UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
        VerityParams p;
        UB_ASSIGN_OR_RETURN(p.hash_algorithm, c.U8(kAttrVerityAlgorithm));
        UB_ASSIGN_OR_RETURN(p.block_size, c.U32(kAttrVerityBlockSize));
        UB_ASSIGN_OR_RETURN(auto salt, c.Bytes(kAttrVeritySaltData));
        UB_ASSIGN_OR_RETURN(auto sig, c.Bytes(kAttrVeritySigData));
        p.salt.assign(salt.begin(), salt.end());
        p.signature.assign(sig.begin(), sig.end());
        return fs_.EnableVerity(id, p);
      }
      default:
        return c.Error(EINVAL, "unexpected command");
    }
  }

  Status Begin(const Command& c) {
    using namespace send;
    UB_RETURN_IF_ERROR(Finish());
    UB_ASSIGN_OR_RETURN(auto path, c.String(kAttrPath));
    UB_ASSIGN_OR_RETURN(auto uuid, c.GetUuid(kAttrUuid));
    UB_ASSIGN_OR_RETURN(uint64_t ctransid, c.U64(kAttrCtransid));
    UB_RETURN_IF_ERROR(fsimpl::CheckName(path));
    ReceivedSubvolume s;
    s.name = std::string(path);
    s.received_uuid = uuid;
    s.stransid = ctransid;
    if (c.cmd == kCmdSubvol) {
      NewInode attrs;
      attrs.mode = 0755;
      UB_ASSIGN_OR_RETURN(top_, fs_.CreateSubvolume(dest_, path, attrs));
    } else {
      UB_ASSIGN_OR_RETURN(auto parent_uuid, c.GetUuid(kAttrCloneUuid));
      UB_RETURN_IF_ERROR(c.U64(kAttrCloneCtransid).status());
      UB_ASSIGN_OR_RETURN(InodeId parent, FindSubvolume(parent_uuid));
      // A parent received earlier in this stream is changed in the running
      // transaction, and a snapshot copies its source as committed: commit
      // what the stream made so far (its finished subvolumes) first.
      for (const ReceivedSubvolume& done : res_->subvolumes) {
        if (done.id != parent.root) continue;
        fs_.set_hold_commits(false);
        Status st = fs_.Commit();
        fs_.set_hold_commits(true);
        UB_RETURN_IF_ERROR(st.WithContext("committing the subvolumes received before this snapshot of one of them"));
        committed_ = res_->subvolumes.size();
        break;
      }
      UB_ASSIGN_OR_RETURN(top_, fs_.CreateSnapshot(parent, dest_, path, false));
      s.snapshot = true;
      s.parent_id = parent.root;
    }
    s.id = top_.root;
    cur_ = s;
    active_ = true;
    cache_.clear();
    return Status::Ok();
  }

  // By received uuid first, then by uuid, as btrfs receive's search_source_subvol.
  Result<InodeId> FindSubvolume(const send::Uuid& uuid) {
    UB_ASSIGN_OR_RETURN(auto subvols, fs_.ListSubvolumes());
    for (bool received : {true, false}) {
      for (const auto& s : subvols) {
        if ((received ? s.received_uuid : s.uuid) == uuid) return fs_.SubvolumeTopOf(s.id);
      }
    }
    return Status::Error(ENOENT, "no subvolume has uuid or received uuid " + format::UuidToString(uuid.data()));
  }

  Status Make(const Command& c) {
    using namespace send;
    UB_ASSIGN_OR_RETURN(auto path, c.String(kAttrPath));
    UB_RETURN_IF_ERROR(c.U64(kAttrIno).status());
    UB_ASSIGN_OR_RETURN(auto at, ResolveParent(path));
    NewInode attrs;  // root-owned, as btrfs receive run by root makes them; chown follows
    Result<InodeId> made = Status::Error(EINVAL, "unreachable");
    switch (c.cmd) {
      case kCmdMkfile:
        attrs.mode = 0600;
        made = fs_.Create(at.first, at.second, attrs);
        break;
      case kCmdMkdir:
        attrs.mode = 0700;
        made = fs_.Mkdir(at.first, at.second, attrs);
        break;
      case kCmdMknod: {
        UB_ASSIGN_OR_RETURN(uint64_t mode, c.U64(kAttrMode));
        UB_ASSIGN_OR_RETURN(uint64_t rdev, c.U64(kAttrRdev));
        const uint32_t fmt = static_cast<uint32_t>(mode) & S_IFMT;
        if (fmt != S_IFCHR && fmt != S_IFBLK && fmt != S_IFIFO && fmt != S_IFSOCK) {
          return c.Error(EINVAL, "mknod of mode " + std::to_string(mode) + ", not a device, fifo or socket");
        }
        attrs.mode = fmt | (static_cast<uint32_t>(mode) & 07777);
        attrs.rdev = rdev;
        made = fs_.Mknod(at.first, at.second, attrs);
        break;
      }
      case kCmdMkfifo:
        attrs.mode = S_IFIFO | 0600;
        made = fs_.Mknod(at.first, at.second, attrs);
        break;
      case kCmdMksock:
        attrs.mode = S_IFSOCK | 0600;
        made = fs_.Mknod(at.first, at.second, attrs);
        break;
      case kCmdSymlink: {
        UB_ASSIGN_OR_RETURN(auto target, c.String(kAttrPathLink));
        attrs.mode = 0777;
        made = fs_.Symlink(at.first, at.second, target, attrs);
        break;
      }
    }
    return made.status();
  }

  Status WriteAll(InodeId id, uint64_t off, std::span<const uint8_t> data) {
    if (off > UINT64_MAX - data.size()) return Status::Invalid("write past 2^64");
    while (!data.empty()) {
      UB_ASSIGN_OR_RETURN(size_t n, fs_.Write(id, off, data));
      if (n == 0) return Status::IoError("write made no progress");
      data = data.subspan(n);
      off += n;
      res_->data_bytes += n;
    }
    return Status::Ok();
  }

  Status CloneCmd(const Command& c) {
    using namespace send;
    UB_ASSIGN_OR_RETURN(InodeId dst, ResolveAttr(c, kAttrPath));
    UB_ASSIGN_OR_RETURN(uint64_t off, c.U64(kAttrFileOffset));
    UB_ASSIGN_OR_RETURN(uint64_t len, c.U64(kAttrCloneLen));
    UB_ASSIGN_OR_RETURN(auto uuid, c.GetUuid(kAttrCloneUuid));
    UB_RETURN_IF_ERROR(c.U64(kAttrCloneCtransid).status());
    UB_ASSIGN_OR_RETURN(auto src_path, c.String(kAttrClonePath));
    UB_ASSIGN_OR_RETURN(uint64_t src_off, c.U64(kAttrCloneOffset));
    InodeId src_top = top_;
    if (uuid != cur_.received_uuid) {
      UB_ASSIGN_OR_RETURN(src_top, FindSubvolume(uuid));
    }
    UB_ASSIGN_OR_RETURN(InodeId src, ResolveFrom(src_top, src_path));
    if (len == 0) return Status::Ok();  // the ioctl's 0 means "to the end"; the stream's, nothing
    Status st = fs_.Clone(src, src_off, dst, off, len);
    if (st.ok()) {
      ++res_->clones;
      return st;
    }
    if (st.code() != EINVAL) return st;
    // The reflink rules refused the range (alignment, NODATASUM mismatch):
    // the kernel would have failed here; copying keeps the content right.
    ++res_->clone_copies;
    std::vector<uint8_t> buf(std::min<uint64_t>(len, 1 << 20));
    for (uint64_t done = 0; done < len;) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), len - done));
      UB_ASSIGN_OR_RETURN(size_t n, fs_.Read(src, src_off + done, std::span(buf.data(), want)));
      if (n == 0) return Status::Invalid("clone source ends before the range does");
      UB_RETURN_IF_ERROR(WriteAll(dst, off + done, std::span(buf.data(), n)));
      res_->data_bytes -= n;
      done += n;
    }
    return Status::Ok();
  }

  // The data is always decoded (which also proves it decodes); where the
  // extent fits the write path's cut, its compressed bytes are stored as
  // they came, else the plain bytes are written (and compressed again only
  // if the image's or the file's settings say so).
  Status EncodedWrite(const Command& c) {
    using namespace send;
    UB_ASSIGN_OR_RETURN(InodeId id, ResolveAttr(c, kAttrPath));
    UB_ASSIGN_OR_RETURN(uint64_t off, c.U64(kAttrFileOffset));
    UB_ASSIGN_OR_RETURN(uint64_t file_len, c.U64(kAttrUnencodedFileLen));
    UB_ASSIGN_OR_RETURN(uint64_t unencoded_len, c.U64(kAttrUnencodedLen));
    UB_ASSIGN_OR_RETURN(uint64_t unencoded_off, c.U64(kAttrUnencodedOffset));
    uint32_t compression = kEncodedNone, encryption = 0;
    if (c.Has(kAttrCompression)) {
      UB_ASSIGN_OR_RETURN(compression, c.U32(kAttrCompression));
    }
    if (c.Has(kAttrEncryption)) {
      UB_ASSIGN_OR_RETURN(encryption, c.U32(kAttrEncryption));
    }
    UB_ASSIGN_OR_RETURN(auto data, c.Bytes(kAttrData));
    if (encryption != 0) return c.Error(EOPNOTSUPP, "encryption " + std::to_string(encryption));
    if (unencoded_len > kMaxUnencoded) {
      return c.Error(EINVAL, "unencoded_len " + std::to_string(unencoded_len) + " is over 128 KiB");
    }
    if (unencoded_off > unencoded_len || file_len > unencoded_len - unencoded_off) {
      return c.Error(EINVAL, "unencoded range [" + std::to_string(unencoded_off) + ", +" + std::to_string(file_len) +
                                 ") is past unencoded_len " + std::to_string(unencoded_len));
    }
    ++res_->encoded_writes;
    if (compression == kEncodedNone) {
      if (data.size() < unencoded_off + file_len) return c.Error(EINVAL, "data shorter than the unencoded range");
      return WriteAll(id, off, data.subspan(unencoded_off, file_len));
    }
    uint8_t type;
    uint32_t sector = 4096;
    if (compression == kEncodedZlib) {
      type = format::kCompressZlib;
    } else if (compression == kEncodedZstd) {
      type = format::kCompressZstd;
    } else if (compression >= kEncodedLzo4k && compression <= kEncodedLzo64k) {
      type = format::kCompressLzo;
      sector = 4096u << (compression - kEncodedLzo4k);
    } else {
      return c.Error(EOPNOTSUPP, "compression " + std::to_string(compression));
    }
    std::vector<uint8_t> plain(unencoded_len);
    UB_RETURN_IF_ERROR(fs::Decompress(type, data, plain, sector));
    const std::span<const uint8_t> range = std::span<const uint8_t>(plain).subspan(unencoded_off, file_len);
    const uint32_t ss = fs_.Info().sectorsize;
    // An extent the write path would cut the same way (whole, from the
    // start, aligned, smaller compressed) is handed in as compressed ahead,
    // so its bytes are stored as sent; anything else is written plain.
    const bool as_extent = unencoded_off == 0 && ss != 0 && off % ss == 0 && file_len > ss &&
                           (file_len + ss - 1) / ss * ss == unencoded_len && sector == ss &&
                           data.size() <= unencoded_len - ss;
    if (!as_extent) return WriteAll(id, off, range);
    fs::Precompressed pre;
    pre.file_off = off;
    pre.file_len = file_len;
    pre.type = type;
    pre.force = true;
    pre.result.kind = fs::RangeResult::kCompressed;
    pre.result.bytes.assign(data.begin(), data.end());
    pre.result.bytes.resize((data.size() + ss - 1) / ss * ss, 0);
    // The handle's compression is what the write path matches the range
    // against: the stream's algorithm, forced, for this one write.
    const CompressOptions saved = fs_.compression();
    CompressOptions co;
    co.algorithm = static_cast<CompressAlgorithm>(type);
    co.force = true;
    fs_.set_compression(co);
    auto n = fs_.WritePrecompressed(id, off, range, std::span(&pre, 1));
    fs_.set_compression(saved);
    if (!n.ok()) return n.status();
    if (*n != range.size()) return WriteAll(id, off + *n, range.subspan(*n));
    res_->data_bytes += *n;
    return Status::Ok();
  }

  // ---- Paths, relative to the subvolume's top ----

  Result<InodeId> ResolveAttr(const Command& c, uint16_t attr) {
    UB_ASSIGN_OR_RETURN(auto path, c.String(attr));
    return Resolve(path);
  }

  Result<InodeId> Resolve(std::string_view path) {
    if (auto it = cache_.find(path); it != cache_.end()) return it->second;
    UB_ASSIGN_OR_RETURN(InodeId id, ResolveFrom(top_, path));
    if (cache_.size() > 65536) cache_.clear();
    cache_.emplace(std::string(path), id);
    return id;
  }

  // Every component a plain name: a stream cannot reach outside the
  // subvolume with "..", nor name "." or empty components.
  Result<InodeId> ResolveFrom(InodeId top, std::string_view path) {
    InodeId at = top;
    size_t pos = 0;
    while (pos < path.size()) {
      size_t slash = path.find('/', pos);
      if (slash == std::string_view::npos) slash = path.size();
      const std::string_view name = path.substr(pos, slash - pos);
      if (name.empty() || name == "." || name == "..") {
        return Status::Invalid("path \"" + std::string(path) + "\" has an empty, . or .. component");
      }
      auto next = fs_.LookupChild(at, name);
      if (!next.ok()) return next.status().WithContext("path \"" + std::string(path) + "\"");
      at = *next;
      pos = slash + 1;
    }
    return at;
  }

  Result<std::pair<InodeId, std::string_view>> ResolveParent(std::string_view path) {
    const size_t slash = path.rfind('/');
    const std::string_view name = slash == std::string_view::npos ? path : path.substr(slash + 1);
    UB_RETURN_IF_ERROR(fsimpl::CheckName(name).WithContext("path \"" + std::string(path) + "\""));
    if (slash == std::string_view::npos) return std::pair{top_, name};
    UB_ASSIGN_OR_RETURN(InodeId dir, Resolve(path.substr(0, slash)));
    return std::pair{dir, name};
  }

  // A rename or removal changes what `path` and everything below it name.
  void Forget(std::string_view path) {
    if (auto it = cache_.find(path); it != cache_.end()) cache_.erase(it);
    const std::string below = std::string(path) + "/";
    auto it = cache_.lower_bound(below);
    while (it != cache_.end() && it->first.compare(0, below.size(), below) == 0) it = cache_.erase(it);
  }

  fsimpl::FilesystemImpl& fs_;
  InodeId dest_;
  ReceiveResult* res_;
  bool active_ = false;
  size_t committed_ = 0;
  InodeId top_;
  ReceivedSubvolume cur_;
  std::map<std::string, InodeId, std::less<>> cache_;  // resolved paths of the current subvolume
};

}  // namespace

Status Receive(Filesystem& fs, const StreamSource& source, const ReceiveOptions& options, ReceiveResult* result) {
  auto* impl = dynamic_cast<fsimpl::FilesystemImpl*>(&fs);
  if (impl == nullptr) return Status::Unsupported("receive into this Filesystem");
  ReceiveResult local;
  ReceiveResult* res = result ? result : &local;
  *res = ReceiveResult{};
  UB_RETURN_IF_ERROR(fs.Commit().WithContext("receive: committing the changes before it"));
  const InodeId dest = options.dest.value_or(fs.Root());
  Receiver rx(*impl, dest, res);
  send::StreamReader reader(source);
  impl->set_hold_commits(true);
  Status st = [&]() -> Status {
    for (;;) {
      send::Command c;
      UB_ASSIGN_OR_RETURN(bool more, reader.Next(&c));
      if (!more) break;
      UB_RETURN_IF_ERROR(rx.Apply(c));
    }
    // Streams with several subvolumes end each but the last at the next
    // SUBVOL or SNAPSHOT; an END finishes the last.
    return rx.Finish();
  }();
  impl->set_hold_commits(false);
  res->stream_bytes = reader.offset();
  if (st.ok()) st = fs.Commit().WithContext("receive: commit");
  if (!st.ok()) {
    res->subvolumes.resize(rx.committed());
    Status d = fs.Discard();
    if (!d.ok()) return st.WithContext("and discarding failed too (" + d.ToString() + ")");
  }
  return st;
}

}  // namespace ubtrfs
