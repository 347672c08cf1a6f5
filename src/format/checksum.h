// The four btrfs checksum algorithms and the crc32c name hash. The digests
// come from Debian libraries (ISA-L, xxHash, libsodium); none is hand-written.
#ifndef UBTRFS_FORMAT_CHECKSUM_H_
#define UBTRFS_FORMAT_CHECKSUM_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "format/ondisk.h"

namespace ubtrfs::format {

using CsumBytes = std::array<uint8_t, kCsumSize>;

// Bytes of a digest that are stored (the rest of the 32-byte field is zero).
// Returns 0 for an unknown type.
size_t CsumSize(uint16_t type);
std::string CsumTypeName(uint16_t type);
std::optional<uint16_t> CsumTypeFromName(std::string_view name);

// The most checksums one EXTENT_CSUM item may hold: a leaf less two item
// headers, one checksum to spare (the kernel's MAX_CSUM_ITEMS; btrfs check
// reports "csum too large" past it). csize must not be 0.
inline size_t MaxCsumsPerItem(uint32_t nodesize, size_t csize) {
  return (nodesize - sizeof(Header) - 2 * sizeof(Item)) / csize - 1;
}

// Computes the digest of `data` into a zero-filled 32-byte buffer. `type` must
// be known (CsumSize(type) != 0).
CsumBytes ComputeCsum(uint16_t type, std::span<const uint8_t> data);

// Compares a stored checksum (only CsumSize(type) bytes matter) with the digest of data.
bool VerifyCsum(uint16_t type, std::span<const uint8_t> data, const uint8_t* stored);

// Raw crc32c update with no pre/post inversion, as the kernel's crc32c() is.
uint32_t Crc32c(uint32_t seed, std::span<const uint8_t> data);

// Hash of a directory entry or xattr name: the key offset of DIR_ITEM/XATTR_ITEM.
inline uint64_t NameHash(std::string_view name) {
  return Crc32c(~uint32_t{1}, std::span(reinterpret_cast<const uint8_t*>(name.data()), name.size()));
}

std::string HexString(const uint8_t* bytes, size_t n);

}  // namespace ubtrfs::format

#endif  // UBTRFS_FORMAT_CHECKSUM_H_
