#include "format/checksum.h"

#include <isa-l/crc.h>
#include <sodium.h>
#include <xxhash.h>

#include <cstring>

namespace ubtrfs::format {

size_t CsumSize(uint16_t type) {
  switch (static_cast<CsumType>(type)) {
    case CsumType::kCrc32c: return 4;
    case CsumType::kXxhash64: return 8;
    case CsumType::kSha256: return 32;
    case CsumType::kBlake2b: return 32;
  }
  return 0;
}

std::string CsumTypeName(uint16_t type) {
  switch (static_cast<CsumType>(type)) {
    case CsumType::kCrc32c: return "crc32c";
    case CsumType::kXxhash64: return "xxhash64";
    case CsumType::kSha256: return "sha256";
    case CsumType::kBlake2b: return "blake2b";
  }
  return "unknown(" + std::to_string(type) + ")";
}

std::optional<uint16_t> CsumTypeFromName(std::string_view name) {
  for (uint16_t t = 0; t < 4; ++t) {
    if (CsumTypeName(t) == name) return t;
  }
  if (name == "xxhash") return static_cast<uint16_t>(CsumType::kXxhash64);
  if (name == "blake2") return static_cast<uint16_t>(CsumType::kBlake2b);
  return std::nullopt;
}

uint32_t Crc32c(uint32_t seed, std::span<const uint8_t> data) {
  // ISA-L's crc32_iscsi applies no inversion of its own; the seed is the
  // running CRC register, which is what the kernel's crc32c() takes too.
  uint32_t crc = seed;
  const uint8_t* p = data.data();
  size_t left = data.size();
  while (left > 0) {  // ISA-L takes an int length
    int chunk = left > (1u << 30) ? (1 << 30) : static_cast<int>(left);
    crc = crc32_iscsi(const_cast<unsigned char*>(p), chunk, crc);
    p += chunk;
    left -= chunk;
  }
  return crc;
}

namespace {
// libsodium picks its implementations for this CPU in sodium_init(), which
// touches code all over the library: only images that hash with it pay
// for that (mkfs.ubtrfs is held to mkfs.btrfs's memory).
void InitSodium() {
  static const bool done = [] {
    if (sodium_init() < 0) std::abort();
    return true;
  }();
  (void)done;
}
}  // namespace

CsumBytes ComputeCsum(uint16_t type, std::span<const uint8_t> data) {
  CsumBytes out{};
  switch (static_cast<CsumType>(type)) {
    case CsumType::kCrc32c: {
      uint32_t crc = ~Crc32c(~uint32_t{0}, data);
      StoreLe<uint32_t>(out.data(), crc);
      break;
    }
    case CsumType::kXxhash64: {
      uint64_t h = XXH64(data.data(), data.size(), 0);
      StoreLe<uint64_t>(out.data(), h);
      break;
    }
    case CsumType::kSha256:
      InitSodium();
      crypto_hash_sha256(out.data(), data.data(), data.size());
      break;
    case CsumType::kBlake2b:
      InitSodium();
      crypto_generichash(out.data(), 32, data.data(), data.size(), nullptr, 0);
      break;
  }
  return out;
}

bool VerifyCsum(uint16_t type, std::span<const uint8_t> data, const uint8_t* stored) {
  size_t n = CsumSize(type);
  if (n == 0) return false;
  CsumBytes c = ComputeCsum(type, data);
  return std::memcmp(c.data(), stored, n) == 0;
}

std::string HexString(const uint8_t* bytes, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[bytes[i] >> 4]);
    s.push_back(kDigits[bytes[i] & 15]);
  }
  return s;
}

}  // namespace ubtrfs::format
