// The btrfs send stream (btrfs-progs Documentation/dev/dev-send-stream.rst,
// the kernel's fs/btrfs/send.h): the "btrfs-stream\0" magic and a LE32
// version (1, 2 or 3), then commands. A command is a 10-byte header (LE32
// length of what follows, LE16 command, LE32 CRC32C with seed 0 over the
// header with a zero crc field and the body) and a body of TLV attributes
// (LE16 type, LE16 length, bytes). From version 2 the DATA attribute has no
// length field: it is the rest of the command.
//
// The reader treats the stream as hostile: every length is checked against
// what is left of its command, the command against a size limit, each CRC
// is verified, and each error names the command's number, name and byte
// offset.
#ifndef UBTRFS_SEND_STREAM_H_
#define UBTRFS_SEND_STREAM_H_

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ubtrfs/status.h"

namespace ubtrfs::send {

inline constexpr char kMagic[] = "btrfs-stream";  // 13 bytes with its NUL
inline constexpr size_t kMagicSize = sizeof(kMagic);
inline constexpr size_t kStreamHeaderSize = kMagicSize + 4;
inline constexpr size_t kCmdHeaderSize = 10;
inline constexpr uint32_t kMaxVersion = 3;
// Larger than any command the kernel makes (v1: 64 KiB, v2: 16 KiB plus a
// 128 KiB encoded extent), small enough that a hostile length cannot make
// the reader allocate much.
inline constexpr uint32_t kMaxCommandSize = 16u << 20;

enum Cmd : uint16_t {
  kCmdUnspec = 0,
  kCmdSubvol = 1,
  kCmdSnapshot = 2,
  kCmdMkfile = 3,
  kCmdMkdir = 4,
  kCmdMknod = 5,
  kCmdMkfifo = 6,
  kCmdMksock = 7,
  kCmdSymlink = 8,
  kCmdRename = 9,
  kCmdLink = 10,
  kCmdUnlink = 11,
  kCmdRmdir = 12,
  kCmdSetXattr = 13,
  kCmdRemoveXattr = 14,
  kCmdWrite = 15,
  kCmdClone = 16,
  kCmdTruncate = 17,
  kCmdChmod = 18,
  kCmdChown = 19,
  kCmdUtimes = 20,
  kCmdEnd = 21,
  kCmdUpdateExtent = 22,
  kCmdFallocate = 23,      // v2
  kCmdFileattr = 24,       // v2
  kCmdEncodedWrite = 25,   // v2
  kCmdEnableVerity = 26,   // v3
  kCmdMax = 26,
};

enum Attr : uint16_t {
  kAttrUnspec = 0,
  kAttrUuid = 1,
  kAttrCtransid = 2,
  kAttrIno = 3,
  kAttrSize = 4,
  kAttrMode = 5,
  kAttrUid = 6,
  kAttrGid = 7,
  kAttrRdev = 8,
  kAttrCtime = 9,
  kAttrMtime = 10,
  kAttrAtime = 11,
  kAttrOtime = 12,
  kAttrXattrName = 13,
  kAttrXattrData = 14,
  kAttrPath = 15,
  kAttrPathTo = 16,
  kAttrPathLink = 17,
  kAttrFileOffset = 18,
  kAttrData = 19,
  kAttrCloneUuid = 20,
  kAttrCloneCtransid = 21,
  kAttrClonePath = 22,
  kAttrCloneOffset = 23,
  kAttrCloneLen = 24,
  kAttrFallocateMode = 25,      // v2
  kAttrFileattr = 26,
  kAttrUnencodedFileLen = 27,
  kAttrUnencodedLen = 28,
  kAttrUnencodedOffset = 29,
  kAttrCompression = 30,
  kAttrEncryption = 31,
  kAttrVerityAlgorithm = 32,    // v3
  kAttrVerityBlockSize = 33,
  kAttrVeritySaltData = 34,
  kAttrVeritySigData = 35,
  kAttrMax = 35,
};

// BTRFS_ENCODED_IO_COMPRESSION_*: the encoded_write compression field.
inline constexpr uint32_t kEncodedNone = 0, kEncodedZlib = 1, kEncodedZstd = 2, kEncodedLzo4k = 3,
                          kEncodedLzo64k = 7;

// "write", "clone", ...; "command N" for unknown numbers.
std::string CmdName(uint16_t cmd);
std::string AttrName(uint16_t attr);
// The highest command and attribute numbers a stream version may use.
uint16_t MaxCmd(uint32_t version);
uint16_t MaxAttr(uint32_t version);

struct Timespec {
  uint64_t sec = 0;
  uint32_t nsec = 0;
};
using Uuid = std::array<uint8_t, 16>;

// One decoded command. Attribute views point into the reader's buffer and
// stay valid until its next call of Next().
class Command {
 public:
  uint16_t cmd = kCmdUnspec;
  uint64_t offset = 0;  // byte offset of its header in the stream
  uint64_t index = 0;   // 1 for the first command
  uint32_t length = 0;  // body bytes

  bool Has(uint16_t attr) const { return attr <= kAttrMax && present_[attr]; }
  // Typed getters: an error names the command and the attribute when it is
  // missing or of the wrong size.
  Result<uint64_t> U64(uint16_t attr) const;
  Result<uint32_t> U32(uint16_t attr) const;
  Result<uint8_t> U8(uint16_t attr) const;
  Result<Uuid> GetUuid(uint16_t attr) const;
  Result<Timespec> Time(uint16_t attr) const;
  // Strings hold any bytes but NUL (the receive side builds C strings).
  Result<std::string_view> String(uint16_t attr) const;
  Result<std::span<const uint8_t>> Bytes(uint16_t attr) const;
  // "command 7 (write) at byte 1234"
  std::string Where() const;
  Status Error(int code, const std::string& what) const;

 private:
  friend class StreamReader;
  Result<std::span<const uint8_t>> Raw(uint16_t attr) const;
  std::array<std::span<const uint8_t>, kAttrMax + 1> attrs_{};
  std::array<bool, kAttrMax + 1> present_{};
};

// Fills up to buf.size() bytes of `buf`; returns how many (0 only at the end).
using ReadFn = std::function<Result<size_t>(std::span<uint8_t>)>;

class StreamReader {
 public:
  explicit StreamReader(ReadFn read) : read_(std::move(read)) {}
  // Reads the next command into *out. Stream headers are read as they
  // come: at the start, and after an END command, where a further stream
  // may follow (btrfs receive reads concatenated streams). Returns false
  // at the end of the input after an END command; the end anywhere else
  // is an error (a cut stream).
  Result<bool> Next(Command* out);
  uint32_t version() const { return version_; }
  uint64_t offset() const { return offset_; }
  uint64_t streams() const { return streams_; }

 private:
  // Reads exactly buf.size() bytes; *got tells how many came before the end.
  Status ReadFull(std::span<uint8_t> buf, size_t* got);
  Status ReadHeader(bool* eof);

  ReadFn read_;
  std::vector<uint8_t> buf_;
  uint32_t version_ = 0;
  uint64_t offset_ = 0;
  uint64_t index_ = 0;
  uint64_t streams_ = 0;
  bool need_header_ = true;
  bool ended_ = false;  // the last command was END
};

// Builds a stream: header, then commands of attributes (tests, `ubtrfs send`).
class StreamWriter {
 public:
  using WriteFn = std::function<Status(std::span<const uint8_t>)>;
  StreamWriter(uint32_t version, WriteFn write) : version_(version), write_(std::move(write)) {}
  Status WriteHeader();
  void Begin(uint16_t cmd);
  void U64(uint16_t attr, uint64_t v);
  void U32(uint16_t attr, uint32_t v);
  void U8(uint16_t attr, uint8_t v);
  void String(uint16_t attr, std::string_view s);
  void Bytes(uint16_t attr, std::span<const uint8_t> b);
  void PutUuid(uint16_t attr, const Uuid& u);
  void Time(uint16_t attr, Timespec t);
  // DATA: with a length field in v1, without one (and last) from v2.
  void Data(std::span<const uint8_t> b);
  // Computes the CRC and writes the command. EINVAL when an attribute was
  // too long for its 16-bit length (v1 data over 64 KiB).
  Status End();
  uint32_t version() const { return version_; }

 private:
  void Tlv(uint16_t attr, const void* p, size_t n);
  uint32_t version_;
  WriteFn write_;
  std::vector<uint8_t> cmd_;
  bool too_long_ = false;
};

// ENABLE_VERITY (protocol 3) for the file at `path`: the parameters its
// descriptor holds, from which the receiver builds the tree anew.
Status PutEnableVerity(StreamWriter& w, std::string_view path, uint8_t algorithm, uint32_t block_size,
                       std::span<const uint8_t> salt, std::span<const uint8_t> signature);

}  // namespace ubtrfs::send

#endif  // UBTRFS_SEND_STREAM_H_
