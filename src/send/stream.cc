#include "send/stream.h"

#include <cstring>

#include "format/checksum.h"
#include "format/endian.h"

namespace ubtrfs::send {

using format::LoadLe;
using format::StoreLe;

namespace {

constexpr const char* kCmdNames[] = {
    "unspec",   "subvol", "snapshot",     "mkfile",       "mkdir",         "mknod",     "mkfifo",
    "mksock",   "symlink", "rename",      "link",         "unlink",        "rmdir",     "set_xattr",
    "remove_xattr", "write", "clone",     "truncate",     "chmod",         "chown",     "utimes",
    "end",      "update_extent", "fallocate", "fileattr", "encoded_write", "enable_verity",
};
static_assert(std::size(kCmdNames) == kCmdMax + 1);

constexpr const char* kAttrNames[] = {
    "unspec",          "uuid",          "ctransid",        "ino",           "size",
    "mode",            "uid",           "gid",             "rdev",          "ctime",
    "mtime",           "atime",         "otime",           "xattr_name",    "xattr_data",
    "path",            "path_to",       "path_link",       "file_offset",   "data",
    "clone_uuid",      "clone_ctransid", "clone_path",     "clone_offset",  "clone_len",
    "fallocate_mode",  "fileattr",      "unencoded_file_len", "unencoded_len", "unencoded_offset",
    "compression",     "encryption",    "verity_algorithm", "verity_block_size", "verity_salt_data",
    "verity_sig_data",
};
static_assert(std::size(kAttrNames) == kAttrMax + 1);

uint32_t CommandCrc(std::span<uint8_t> cmd) {
  // The CRC covers the header with its own field zeroed.
  uint8_t saved[4];
  std::memcpy(saved, cmd.data() + 6, 4);
  std::memset(cmd.data() + 6, 0, 4);
  const uint32_t crc = format::Crc32c(0, cmd);
  std::memcpy(cmd.data() + 6, saved, 4);
  return crc;
}

}  // namespace

std::string CmdName(uint16_t cmd) {
  return cmd <= kCmdMax ? kCmdNames[cmd] : "command " + std::to_string(cmd);
}

std::string AttrName(uint16_t attr) {
  return attr <= kAttrMax ? kAttrNames[attr] : "attribute " + std::to_string(attr);
}

uint16_t MaxCmd(uint32_t version) {
  return version <= 1 ? kCmdUpdateExtent : version == 2 ? kCmdEncodedWrite : kCmdEnableVerity;
}

uint16_t MaxAttr(uint32_t version) {
  return version <= 1 ? kAttrCloneLen : version == 2 ? kAttrEncryption : kAttrVeritySigData;
}

// ---- Command ----

std::string Command::Where() const {
  return "command " + std::to_string(index) + " (" + CmdName(cmd) + ") at byte " + std::to_string(offset);
}

Status Command::Error(int code, const std::string& what) const {
  return Status::Error(code, "send stream: " + Where() + ": " + what);
}

Result<std::span<const uint8_t>> Command::Raw(uint16_t attr) const {
  if (!Has(attr)) return Error(EINVAL, "no " + AttrName(attr) + " attribute");
  return attrs_[attr];
}

Result<uint64_t> Command::U64(uint16_t attr) const {
  UB_ASSIGN_OR_RETURN(auto b, Raw(attr));
  if (b.size() != 8) return Error(EINVAL, AttrName(attr) + " is " + std::to_string(b.size()) + " bytes, not 8");
  return LoadLe<uint64_t>(b.data());
}

Result<uint32_t> Command::U32(uint16_t attr) const {
  UB_ASSIGN_OR_RETURN(auto b, Raw(attr));
  if (b.size() != 4) return Error(EINVAL, AttrName(attr) + " is " + std::to_string(b.size()) + " bytes, not 4");
  return LoadLe<uint32_t>(b.data());
}

Result<uint8_t> Command::U8(uint16_t attr) const {
  UB_ASSIGN_OR_RETURN(auto b, Raw(attr));
  if (b.size() != 1) return Error(EINVAL, AttrName(attr) + " is " + std::to_string(b.size()) + " bytes, not 1");
  return b[0];
}

Result<Uuid> Command::GetUuid(uint16_t attr) const {
  UB_ASSIGN_OR_RETURN(auto b, Raw(attr));
  if (b.size() != 16) return Error(EINVAL, AttrName(attr) + " is " + std::to_string(b.size()) + " bytes, not 16");
  Uuid u;
  std::memcpy(u.data(), b.data(), 16);
  return u;
}

Result<Timespec> Command::Time(uint16_t attr) const {
  UB_ASSIGN_OR_RETURN(auto b, Raw(attr));
  if (b.size() != 12) return Error(EINVAL, AttrName(attr) + " is " + std::to_string(b.size()) + " bytes, not 12");
  return Timespec{LoadLe<uint64_t>(b.data()), LoadLe<uint32_t>(b.data() + 8)};
}

Result<std::string_view> Command::String(uint16_t attr) const {
  UB_ASSIGN_OR_RETURN(auto b, Raw(attr));
  std::string_view s(reinterpret_cast<const char*>(b.data()), b.size());
  if (s.find('\0') != std::string_view::npos) return Error(EINVAL, AttrName(attr) + " holds a NUL byte");
  return s;
}

Result<std::span<const uint8_t>> Command::Bytes(uint16_t attr) const { return Raw(attr); }

// ---- StreamReader ----

Status StreamReader::ReadFull(std::span<uint8_t> buf, size_t* got) {
  size_t pos = 0;
  while (pos < buf.size()) {
    auto n = read_(buf.subspan(pos));
    if (!n.ok()) return n.status().WithContext("send stream: reading at byte " + std::to_string(offset_ + pos));
    if (*n == 0) break;
    if (*n > buf.size() - pos) return Status::Error(EIO, "send stream: the source returned more bytes than asked");
    pos += *n;
  }
  *got = pos;
  offset_ += pos;
  return Status::Ok();
}

Status StreamReader::ReadHeader(bool* eof) {
  uint8_t h[kStreamHeaderSize];
  const uint64_t at = offset_;
  size_t got = 0;
  UB_RETURN_IF_ERROR(ReadFull(h, &got));
  *eof = got == 0;
  if (got == 0) return Status::Ok();
  if (got < sizeof(h)) {
    return Status::Error(EINVAL, "send stream: cut in its header at byte " + std::to_string(at) + " (" +
                                     std::to_string(got) + " of " + std::to_string(sizeof(h)) + " bytes)");
  }
  if (std::memcmp(h, kMagic, kMagicSize) != 0) {
    return Status::Error(EINVAL, "send stream: no btrfs-stream magic at byte " + std::to_string(at));
  }
  const uint32_t v = LoadLe<uint32_t>(h + kMagicSize);
  if (v < 1 || v > kMaxVersion) {
    return Status::Error(EOPNOTSUPP, "send stream: version " + std::to_string(v) + " at byte " + std::to_string(at) +
                                         " (1 to " + std::to_string(kMaxVersion) + " are known)");
  }
  version_ = v;
  ++streams_;
  return Status::Ok();
}

Result<bool> StreamReader::Next(Command* out) {
  if (need_header_) {
    bool eof = false;
    UB_RETURN_IF_ERROR(ReadHeader(&eof));
    if (eof) {
      if (streams_ == 0) return Status::Error(EINVAL, "send stream: empty input (no header at byte 0)");
      return false;
    }
    need_header_ = false;
  }
  const uint64_t at = offset_;
  const uint64_t index = index_ + 1;
  const auto where = [&](uint16_t cmd) {
    return "command " + std::to_string(index) + (cmd == 0xffff ? std::string() : " (" + CmdName(cmd) + ")") +
           " at byte " + std::to_string(at);
  };
  buf_.resize(kCmdHeaderSize);
  size_t got = 0;
  UB_RETURN_IF_ERROR(ReadFull(buf_, &got));
  if (got < kCmdHeaderSize) {
    if (got == 0) {
      return Status::Error(EINVAL, "send stream: ends at byte " + std::to_string(at) + " before " + where(0xffff) +
                                       " with no end command (cut short?)");
    }
    return Status::Error(EINVAL, "send stream: " + where(0xffff) + ": cut in its header (" + std::to_string(got) +
                                     " of 10 bytes)");
  }
  const uint32_t len = LoadLe<uint32_t>(buf_.data());
  const uint16_t cmd = LoadLe<uint16_t>(buf_.data() + 4);
  const uint32_t crc = LoadLe<uint32_t>(buf_.data() + 6);
  if (len > kMaxCommandSize) {
    return Status::Error(EINVAL, "send stream: " + where(cmd) + ": length " + std::to_string(len) +
                                     " is over the limit of " + std::to_string(kMaxCommandSize));
  }
  // The body comes in steps of at most 1 MiB, so that a cut stream with a
  // large length costs what it holds, not the length.
  got = 0;
  while (got < len) {
    const size_t step = std::min<size_t>(len - got, 1u << 20);
    buf_.resize(kCmdHeaderSize + got + step);
    size_t n = 0;
    UB_RETURN_IF_ERROR(ReadFull(std::span(buf_).subspan(kCmdHeaderSize + got, step), &n));
    got += n;
    if (n < step) break;
  }
  if (got < len) {
    return Status::Error(EINVAL, "send stream: " + where(cmd) + ": cut short (" + std::to_string(got) + " of " +
                                     std::to_string(len) + " bytes)");
  }
  const uint32_t want = CommandCrc(buf_);
  if (want != crc) {
    return Status::Error(EBADMSG, "send stream: " + where(cmd) + ": CRC32C mismatch (stored " + std::to_string(crc) +
                                      ", computed " + std::to_string(want) + ")");
  }
  if (cmd == kCmdUnspec || cmd > MaxCmd(version_)) {
    return Status::Error(EINVAL, "send stream: " + where(cmd) + ": unknown command for stream version " +
                                     std::to_string(version_));
  }
  Command c;
  c.cmd = cmd;
  c.offset = at;
  c.index = index;
  c.length = len;
  const std::span<const uint8_t> body = std::span<const uint8_t>(buf_).subspan(kCmdHeaderSize);
  size_t pos = 0;
  while (pos < body.size()) {
    if (body.size() - pos < 2) return c.Error(EINVAL, "attribute header cut at body byte " + std::to_string(pos));
    const uint16_t type = LoadLe<uint16_t>(body.data() + pos);
    pos += 2;
    if (type == kAttrUnspec || type > MaxAttr(version_)) {
      return c.Error(EINVAL, "unknown attribute " + std::to_string(type) + " at body byte " + std::to_string(pos - 2));
    }
    size_t alen;
    if (version_ >= 2 && type == kAttrData) {
      alen = body.size() - pos;  // the rest of the command
    } else {
      if (body.size() - pos < 2) return c.Error(EINVAL, AttrName(type) + ": length cut at body byte " + std::to_string(pos));
      alen = LoadLe<uint16_t>(body.data() + pos);
      pos += 2;
      if (alen > body.size() - pos) {
        return c.Error(EINVAL, AttrName(type) + ": length " + std::to_string(alen) + " runs past the command's end");
      }
    }
    if (c.present_[type]) return c.Error(EINVAL, AttrName(type) + " appears twice");
    c.present_[type] = true;
    c.attrs_[type] = body.subspan(pos, alen);
    pos += alen;
  }
  index_ = index;
  if (cmd == kCmdEnd) need_header_ = true;
  *out = c;
  return true;
}

// ---- StreamWriter ----

Status StreamWriter::WriteHeader() {
  uint8_t h[kStreamHeaderSize];
  std::memcpy(h, kMagic, kMagicSize);
  StoreLe<uint32_t>(h + kMagicSize, version_);
  return write_(h);
}

void StreamWriter::Begin(uint16_t cmd) {
  cmd_.assign(kCmdHeaderSize, 0);
  StoreLe<uint16_t>(cmd_.data() + 4, cmd);
  too_long_ = false;
}

void StreamWriter::Tlv(uint16_t attr, const void* p, size_t n) {
  if (n > 0xffff) too_long_ = true;
  uint8_t h[4];
  StoreLe<uint16_t>(h, attr);
  StoreLe<uint16_t>(h + 2, static_cast<uint16_t>(n));
  cmd_.insert(cmd_.end(), h, h + 4);
  const auto* b = static_cast<const uint8_t*>(p);
  cmd_.insert(cmd_.end(), b, b + n);
}

void StreamWriter::U64(uint16_t attr, uint64_t v) {
  uint8_t b[8];
  StoreLe<uint64_t>(b, v);
  Tlv(attr, b, 8);
}

void StreamWriter::U32(uint16_t attr, uint32_t v) {
  uint8_t b[4];
  StoreLe<uint32_t>(b, v);
  Tlv(attr, b, 4);
}

void StreamWriter::U8(uint16_t attr, uint8_t v) { Tlv(attr, &v, 1); }
void StreamWriter::String(uint16_t attr, std::string_view s) { Tlv(attr, s.data(), s.size()); }
void StreamWriter::Bytes(uint16_t attr, std::span<const uint8_t> b) { Tlv(attr, b.data(), b.size()); }
void StreamWriter::PutUuid(uint16_t attr, const Uuid& u) { Tlv(attr, u.data(), u.size()); }

void StreamWriter::Time(uint16_t attr, Timespec t) {
  uint8_t b[12];
  StoreLe<uint64_t>(b, t.sec);
  StoreLe<uint32_t>(b + 8, t.nsec);
  Tlv(attr, b, 12);
}

void StreamWriter::Data(std::span<const uint8_t> b) {
  if (version_ < 2) return Tlv(kAttrData, b.data(), b.size());
  uint8_t h[2];
  StoreLe<uint16_t>(h, kAttrData);
  cmd_.insert(cmd_.end(), h, h + 2);
  cmd_.insert(cmd_.end(), b.begin(), b.end());
}

Status StreamWriter::End() {
  if (too_long_) return Status::Invalid("send stream: an attribute is over 65535 bytes");
  if (cmd_.size() - kCmdHeaderSize > kMaxCommandSize) return Status::Invalid("send stream: command over the size limit");
  StoreLe<uint32_t>(cmd_.data(), static_cast<uint32_t>(cmd_.size() - kCmdHeaderSize));
  StoreLe<uint32_t>(cmd_.data() + 6, CommandCrc(cmd_));
  return write_(cmd_);
}

Status PutEnableVerity(StreamWriter& w, std::string_view path, uint8_t algorithm, uint32_t block_size,
                       std::span<const uint8_t> salt, std::span<const uint8_t> signature) {
  w.Begin(kCmdEnableVerity);
  w.String(kAttrPath, path);
  w.U8(kAttrVerityAlgorithm, algorithm);
  w.U32(kAttrVerityBlockSize, block_size);
  w.Bytes(kAttrVeritySaltData, salt);
  w.Bytes(kAttrVeritySigData, signature);
  return w.End();
}

}  // namespace ubtrfs::send
