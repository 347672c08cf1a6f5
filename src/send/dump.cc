// DumpStream: the commands of a stream in the layout of `btrfs receive
// --dump` (btrfs-progs cmds/receive-dump.c): the command name padded to 16
// columns, the path (under "./" and the subvolume's name, special bytes
// escaped) padded to 32, then the command's fields.
#include <time.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>

#include "format/superblock.h"
#include "send/stream.h"
#include "ubtrfs/send.h"

namespace ubtrfs {

namespace {

using send::Command;

// Backslash escapes for control characters, space and backslash; octal
// for other bytes outside printable ASCII.
std::string Escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
      case '\a': out += "\\a"; break;
      case '\b': out += "\\b"; break;
      case 0x1b: out += "\\e"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\v': out += "\\v"; break;
      case ' ': out += "\\ "; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c < 0x20 || c > 0x7e) {
          out += '\\';
          out += static_cast<char>('0' + ((c >> 6) & 3));
          out += static_cast<char>('0' + ((c >> 3) & 7));
          out += static_cast<char>('0' + (c & 7));
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

// btrfs-progs' path_cat: one slash between, a trailing one of each dropped.
std::string PathCat(std::string_view a, std::string_view b) {
  if (!a.empty() && a.back() == '/') a.remove_suffix(1);
  if (!b.empty() && b.back() == '/') b.remove_suffix(1);
  return std::string(a) + "/" + std::string(b);
}

std::string Fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

std::string Line(std::string_view title, const std::string& full_path, const std::string& rest) {
  std::string out(title);
  out.resize(std::max<size_t>(out.size(), 16), ' ');
  const std::string p = Escape(full_path);
  out += p;
  if (rest.empty()) return out;
  out.append(p.size() < 32 ? 32 - p.size() : 1, ' ');
  return out + rest;
}

Result<std::string> TimeText(const Command& c, uint16_t attr) {
  UB_ASSIGN_OR_RETURN(auto t, c.Time(attr));
  const time_t sec = static_cast<time_t>(t.sec);
  struct tm tm;
  char buf[64];
  if (localtime_r(&sec, &tm) == nullptr || strftime(buf, sizeof(buf), "%FT%T%z", &tm) == 0) {
    return c.Error(EINVAL, "time " + std::to_string(t.sec) + " cannot be shown");
  }
  return std::string(buf);
}

class Dumper {
 public:
  Result<std::string> Format(const Command& c) {
    using namespace send;
    const std::string name = CmdName(c.cmd);
    if (c.cmd == kCmdEnd) return std::string();
    UB_ASSIGN_OR_RETURN(auto path, c.String(kAttrPath));
    if (c.cmd == kCmdSubvol || c.cmd == kCmdSnapshot) {
      UB_ASSIGN_OR_RETURN(auto uuid, c.GetUuid(kAttrUuid));
      UB_ASSIGN_OR_RETURN(uint64_t transid, c.U64(kAttrCtransid));
      subvol_ = PathCat(".", path);
      std::string rest = "uuid=" + format::UuidToString(uuid.data()) + " transid=" + std::to_string(transid);
      if (c.cmd == kCmdSnapshot) {
        UB_ASSIGN_OR_RETURN(auto puuid, c.GetUuid(kAttrCloneUuid));
        UB_ASSIGN_OR_RETURN(uint64_t ptransid, c.U64(kAttrCloneCtransid));
        rest += " parent_uuid=" + format::UuidToString(puuid.data()) + " parent_transid=" + std::to_string(ptransid);
      }
      return Line(name, subvol_, rest);
    }
    const std::string full = PathCat(subvol_, path);
    switch (c.cmd) {
      case kCmdMkfile:
      case kCmdMkdir:
      case kCmdMkfifo:
      case kCmdMksock:
      case kCmdUnlink:
      case kCmdRmdir:
        return Line(name, full, "");
      case kCmdMknod: {
        UB_ASSIGN_OR_RETURN(uint64_t mode, c.U64(kAttrMode));
        UB_ASSIGN_OR_RETURN(uint64_t rdev, c.U64(kAttrRdev));
        return Line(name, full, Fmt("mode=%" PRIo64 " dev=0x%" PRIx64, mode, rdev));
      }
      case kCmdSymlink:
      case kCmdLink: {
        UB_ASSIGN_OR_RETURN(auto link, c.String(kAttrPathLink));
        return Line(name, full, "dest=" + Escape(link));
      }
      case kCmdRename: {
        UB_ASSIGN_OR_RETURN(auto to, c.String(kAttrPathTo));
        return Line(name, full, "dest=" + Escape(PathCat(subvol_, to)));
      }
      case kCmdWrite: {
        UB_ASSIGN_OR_RETURN(uint64_t off, c.U64(kAttrFileOffset));
        UB_ASSIGN_OR_RETURN(auto data, c.Bytes(kAttrData));
        return Line(name, full, Fmt("offset=%" PRIu64 " len=%zu", off, data.size()));
      }
      case kCmdClone: {
        UB_ASSIGN_OR_RETURN(uint64_t off, c.U64(kAttrFileOffset));
        UB_ASSIGN_OR_RETURN(uint64_t len, c.U64(kAttrCloneLen));
        UB_ASSIGN_OR_RETURN(auto from, c.String(kAttrClonePath));
        UB_ASSIGN_OR_RETURN(uint64_t from_off, c.U64(kAttrCloneOffset));
        return Line(name, full,
                    Fmt("offset=%" PRIu64 " len=%" PRIu64 " from=", off, len) + Escape(PathCat(subvol_, from)) +
                        " clone_offset=" + std::to_string(from_off));
      }
      case kCmdSetXattr: {
        UB_ASSIGN_OR_RETURN(auto xname, c.String(kAttrXattrName));
        UB_ASSIGN_OR_RETURN(auto data, c.Bytes(kAttrXattrData));
        return Line(name, full,
                    "name=" + Escape(xname) + " data=" +
                        Escape(std::string_view(reinterpret_cast<const char*>(data.data()), data.size())) +
                        " len=" + std::to_string(data.size()));
      }
      case kCmdRemoveXattr: {
        UB_ASSIGN_OR_RETURN(auto xname, c.String(kAttrXattrName));
        return Line(name, full, "name=" + Escape(xname));
      }
      case kCmdTruncate: {
        UB_ASSIGN_OR_RETURN(uint64_t size, c.U64(kAttrSize));
        return Line(name, full, "size=" + std::to_string(size));
      }
      case kCmdChmod: {
        UB_ASSIGN_OR_RETURN(uint64_t mode, c.U64(kAttrMode));
        return Line(name, full, Fmt("mode=%" PRIo64, mode));
      }
      case kCmdChown: {
        UB_ASSIGN_OR_RETURN(uint64_t uid, c.U64(kAttrUid));
        UB_ASSIGN_OR_RETURN(uint64_t gid, c.U64(kAttrGid));
        return Line(name, full, "gid=" + std::to_string(gid) + " uid=" + std::to_string(uid));
      }
      case kCmdUtimes: {
        UB_ASSIGN_OR_RETURN(auto at, TimeText(c, kAttrAtime));
        UB_ASSIGN_OR_RETURN(auto mt, TimeText(c, kAttrMtime));
        UB_ASSIGN_OR_RETURN(auto ct, TimeText(c, kAttrCtime));
        return Line(name, full, "atime=" + at + " mtime=" + mt + " ctime=" + ct);
      }
      case kCmdUpdateExtent: {
        UB_ASSIGN_OR_RETURN(uint64_t off, c.U64(kAttrFileOffset));
        UB_ASSIGN_OR_RETURN(uint64_t size, c.U64(kAttrSize));
        return Line(name, full, Fmt("offset=%" PRIu64 " len=%" PRIu64, off, size));
      }
      case kCmdEncodedWrite: {
        UB_ASSIGN_OR_RETURN(uint64_t off, c.U64(kAttrFileOffset));
        UB_ASSIGN_OR_RETURN(uint64_t flen, c.U64(kAttrUnencodedFileLen));
        UB_ASSIGN_OR_RETURN(uint64_t ulen, c.U64(kAttrUnencodedLen));
        UB_ASSIGN_OR_RETURN(uint64_t uoff, c.U64(kAttrUnencodedOffset));
        uint32_t comp = 0, enc = 0;
        if (c.Has(kAttrCompression)) {
          UB_ASSIGN_OR_RETURN(comp, c.U32(kAttrCompression));
        }
        if (c.Has(kAttrEncryption)) {
          UB_ASSIGN_OR_RETURN(enc, c.U32(kAttrEncryption));
        }
        UB_ASSIGN_OR_RETURN(auto data, c.Bytes(kAttrData));
        return Line(name, full,
                    Fmt("offset=%" PRIu64 " len=%zu unencoded_file_len=%" PRIu64 " unencoded_len=%" PRIu64
                        " unencoded_offset=%" PRIu64 " compression=%u encryption=%u",
                        off, data.size(), flen, ulen, uoff, comp, enc));
      }
      case kCmdFallocate: {
        UB_ASSIGN_OR_RETURN(uint32_t mode, c.U32(kAttrFallocateMode));
        UB_ASSIGN_OR_RETURN(uint64_t off, c.U64(kAttrFileOffset));
        UB_ASSIGN_OR_RETURN(uint64_t size, c.U64(kAttrSize));
        return Line(name, full, Fmt("mode=%d offset=%" PRIu64 " len=%" PRIu64, static_cast<int>(mode), off, size));
      }
      case kCmdFileattr: {
        UB_ASSIGN_OR_RETURN(uint64_t attr, c.U64(kAttrFileattr));
        // btrfs-progs prints the decimal value after "0x"; kept for diffs.
        return Line(name, full, "fileattr=0x" + std::to_string(attr));
      }
      case kCmdEnableVerity: {
        UB_ASSIGN_OR_RETURN(uint8_t alg, c.U8(kAttrVerityAlgorithm));
        UB_ASSIGN_OR_RETURN(uint32_t bs, c.U32(kAttrVerityBlockSize));
        UB_ASSIGN_OR_RETURN(auto salt, c.Bytes(kAttrVeritySaltData));
        UB_ASSIGN_OR_RETURN(auto sig, c.Bytes(kAttrVeritySigData));
        return Line(name, full,
                    Fmt("algorithm=%u block_size=%u salt_len=%zu sig_len=%zu", alg, bs, salt.size(), sig.size()));
      }
      default:
        return c.Error(EINVAL, "unexpected command");
    }
  }

 private:
  std::string subvol_ = ".";
};

}  // namespace

Status DumpStream(const StreamSource& source, const std::function<void(std::string_view line)>& out) {
  send::StreamReader reader(source);
  Dumper d;
  for (;;) {
    send::Command c;
    UB_ASSIGN_OR_RETURN(bool more, reader.Next(&c));
    if (!more) return Status::Ok();
    UB_ASSIGN_OR_RETURN(std::string line, d.Format(c));
    if (c.cmd != send::kCmdEnd) out(line);
  }
}

}  // namespace ubtrfs
