// fs-verity's descriptor and Merkle tree, as the kernel builds them for
// FS_IOC_ENABLE_VERITY (fs/verity/) and fsverity-utils' `fsverity digest`
// reproduces them from a file's bytes. btrfs stores both in the file's own
// items (format/ondisk.h: VerityDescriptorItem); how they are split into
// items is fs/verity.cc's business, what they hold is this file's.
//
// The tree: every block_size block of data (the last zero-padded) is hashed
// as H(salt padded to the hash's block size || block); those hashes, packed
// and the last block zero-padded, are level 0; each level above hashes the
// blocks of the one below, until a level is one block. The stored tree is
// the levels from the top down; the root hash is that top block's hash. A
// file of one block has no tree (its root hash is that block's hash), an
// empty file an all-zero root hash.
#ifndef UBTRFS_FORMAT_VERITY_H_
#define UBTRFS_FORMAT_VERITY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/ondisk.h"
#include "ubtrfs/status.h"

namespace ubtrfs::format {

inline constexpr uint8_t kVeritySha256 = 1;
inline constexpr uint8_t kVeritySha512 = 2;
// The kernel writes descriptor and Merkle items in pieces of at most this
// many bytes (a choice of fs/btrfs/verity.c, not a limit of the format).
inline constexpr size_t kVerityItemBytes = 2048;
inline constexpr size_t kVerityMaxDescriptor = 16384;  // FS_VERITY_MAX_DESCRIPTOR_SIZE
inline constexpr size_t kVerityMaxSalt = 32;

// 32 or 64; 0 for an algorithm fs-verity does not define.
size_t VerityDigestSize(uint8_t alg);

struct VerityDescriptor {
  uint8_t hash_algorithm = kVeritySha256;
  uint32_t block_size = 4096;
  uint64_t data_size = 0;
  std::vector<uint8_t> root_hash;  // VerityDigestSize bytes
  std::vector<uint8_t> salt;
  std::vector<uint8_t> signature;
};

// The parameters FS_IOC_ENABLE_VERITY accepts: a known algorithm, a block
// size that is a power of two from 1 KiB to max_block_size and holds two
// digests, at most 32 bytes of salt, a descriptor of at most 16 KiB.
Status CheckVerityParams(uint8_t alg, uint32_t block_size, size_t salt_size, size_t sig_size,
                         uint32_t max_block_size);

// The descriptor's size from the (ino, VERITY_DESC_ITEM, 0) item: EUCLEAN
// for a short item, set reserved fields, or a size over 16 KiB.
Result<uint64_t> ParseVerityDescriptorHead(std::span<const uint8_t> item);

// Reads a stored descriptor (with its signature), held to what the kernel
// accepts when it opens the file; EUCLEAN (corrupt) otherwise.
Result<VerityDescriptor> ParseVerityDescriptor(std::span<const uint8_t> bytes);
std::vector<uint8_t> EncodeVerityDescriptor(const VerityDescriptor& d);

// The file's digest (FS_IOC_MEASURE_VERITY, `fsverity digest`): the hash of
// the descriptor with no signature and sig_size 0.
std::vector<uint8_t> VerityFileDigest(const VerityDescriptor& d);

struct MerkleTree {
  std::vector<uint8_t> bytes;      // the stored tree, top level first
  std::vector<uint8_t> root_hash;  // digest-size bytes
};

// Fills buf with the file's bytes at offset; returns how many (less than
// buf.size() only at the end of the file).
using VerityReader = std::function<Result<size_t>(uint64_t offset, std::span<uint8_t> buf)>;

// The tree of data_size bytes read through `read`. Parameters must have
// passed CheckVerityParams. EIO when the file is shorter than data_size.
Result<MerkleTree> BuildMerkleTree(uint8_t alg, uint32_t block_size, std::span<const uint8_t> salt,
                                   uint64_t data_size, const VerityReader& read);

// Bytes of the stored tree for data_size bytes (0 for at most one block).
uint64_t MerkleTreeSize(uint8_t alg, uint32_t block_size, uint64_t data_size);

// Appends one item's bytes to what its earlier items gave: the descriptor
// items start at key offset 1, the Merkle items at 0, and each must start
// where the last ended (else EUCLEAN, naming `what`).
Status AppendVerityItem(std::vector<uint8_t>* joined, uint64_t first_offset, uint64_t key_offset,
                        std::span<const uint8_t> bytes, std::string_view what);

}  // namespace ubtrfs::format

#endif  // UBTRFS_FORMAT_VERITY_H_
