// libFuzzer target: the send-stream reader and the --dump formatter over
// arbitrary bytes (every length, offset and attribute checked; no read past
// a command, no allocation over the command limit).
//
// Input layout: byte 0 is a flag byte; the rest is the stream. With bit 0
// of the flag set, each command's CRC32C is recomputed first (walking the
// commands by their lengths), so that mutations reach the attribute parser
// and the per-command checks behind the CRC.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "format/checksum.h"
#include "format/endian.h"
#include "send/stream.h"
#include "ubtrfs/send.h"

namespace {

void ResealCrcs(std::vector<uint8_t>& s) {
  using namespace ubtrfs::send;
  for (size_t at = kStreamHeaderSize; at + kCmdHeaderSize <= s.size();) {
    const uint32_t len = ubtrfs::format::LoadLe<uint32_t>(s.data() + at);
    if (len > s.size() - at - kCmdHeaderSize) break;
    std::memset(s.data() + at + 6, 0, 4);
    const uint32_t crc = ubtrfs::format::Crc32c(0, std::span(s.data() + at, kCmdHeaderSize + len));
    ubtrfs::format::StoreLe<uint32_t>(s.data() + at + 6, crc);
    at += kCmdHeaderSize + len;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::vector<uint8_t> s(data + 1, data + size);
  if (data[0] & 1) ResealCrcs(s);
  size_t pos = 0;
  const size_t chunk = 1 + (data[0] >> 1);  // short reads from the source too
  ubtrfs::StreamSource src = [&](std::span<uint8_t> buf) -> ubtrfs::Result<size_t> {
    const size_t n = std::min({buf.size(), s.size() - pos, chunk * 97});
    if (n > 0) std::memcpy(buf.data(), s.data() + pos, n);
    pos += n;
    return n;
  };
  size_t lines = 0;
  (void)ubtrfs::DumpStream(src, [&](std::string_view line) { lines += line.size(); });
  // The typed getters over every attribute of every command.
  pos = 0;
  ubtrfs::send::StreamReader r(src);
  for (int i = 0; i < 100000; ++i) {
    ubtrfs::send::Command c;
    auto more = r.Next(&c);
    if (!more.ok() || !*more) break;
    for (uint16_t a = 0; a <= ubtrfs::send::kAttrMax + 1; ++a) {
      // Absent ones only build an error, the same each time: one is enough.
      if (!c.Has(a) && a != 0) continue;
      (void)c.U64(a), (void)c.U32(a), (void)c.U8(a), (void)c.GetUuid(a), (void)c.Time(a), (void)c.String(a);
    }
  }
  return 0;
}
