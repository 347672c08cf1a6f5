#include "format/verity.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>

namespace ubtrfs::format {
namespace {

// SHA-256 or SHA-512 with the salt already absorbed: each block's hash
// starts from a copy of that state instead of hashing the salt again.
class SaltedHash {
 public:
  SaltedHash(uint8_t alg, std::span<const uint8_t> salt) : alg_(alg) {
    if (alg_ == kVeritySha256) {
      crypto_hash_sha256_init(&s256_);
    } else {
      crypto_hash_sha512_init(&s512_);
    }
    if (salt.empty()) return;
    // The salt is padded with zeros to the hash's own block size.
    std::vector<uint8_t> padded(salt.begin(), salt.end());
    const size_t hash_block = alg_ == kVeritySha256 ? 64 : 128;
    padded.resize((padded.size() + hash_block - 1) / hash_block * hash_block, 0);
    Update(padded);
  }
  void Digest(std::span<const uint8_t> block, uint8_t* out) const {
    SaltedHash h = *this;
    h.Update(block);
    if (alg_ == kVeritySha256) {
      crypto_hash_sha256_final(&h.s256_, out);
    } else {
      crypto_hash_sha512_final(&h.s512_, out);
    }
  }

 private:
  void Update(std::span<const uint8_t> b) {
    if (alg_ == kVeritySha256) {
      crypto_hash_sha256_update(&s256_, b.data(), b.size());
    } else {
      crypto_hash_sha512_update(&s512_, b.data(), b.size());
    }
  }
  uint8_t alg_;
  crypto_hash_sha256_state s256_{};
  crypto_hash_sha512_state s512_{};
};

bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

size_t VerityDigestSize(uint8_t alg) {
  switch (alg) {
    case kVeritySha256: return 32;
    case kVeritySha512: return 64;
    default: return 0;
  }
}

Status CheckVerityParams(uint8_t alg, uint32_t block_size, size_t salt_size, size_t sig_size,
                         uint32_t max_block_size) {
  const size_t ds = VerityDigestSize(alg);
  if (ds == 0) return Status::Invalid("fs-verity: unknown hash algorithm " + std::to_string(alg));
  if (!PowerOfTwo(block_size) || block_size < 1024 || block_size > max_block_size || block_size < 2 * ds) {
    return Status::Invalid("fs-verity: block size " + std::to_string(block_size) +
                           " is not a power of two from 1024 to " + std::to_string(max_block_size));
  }
  if (salt_size > kVerityMaxSalt) return Status::Invalid("fs-verity: salt longer than 32 bytes");
  if (sizeof(FsverityDescriptor) + sig_size > kVerityMaxDescriptor) {
    return Status::Invalid("fs-verity: signature too large (" + std::to_string(sig_size) + " bytes)");
  }
  return Status::Ok();
}

Result<uint64_t> ParseVerityDescriptorHead(std::span<const uint8_t> item) {
  if (item.size() < sizeof(VerityDescriptorItem)) {
    return Status::Corrupt("VERITY_DESC_ITEM 0 of " + std::to_string(item.size()) + " bytes");
  }
  VerityDescriptorItem head;
  std::memcpy(&head, item.data(), sizeof(head));
  if (head.reserved[0].get() || head.reserved[1].get() || head.encryption) {
    return Status::Corrupt("VERITY_DESC_ITEM 0 has reserved fields set");
  }
  if (head.size.get() > kVerityMaxDescriptor) {
    return Status::Corrupt("a descriptor of " + std::to_string(head.size.get()) + " bytes");
  }
  return head.size.get();
}

Result<VerityDescriptor> ParseVerityDescriptor(std::span<const uint8_t> bytes) {
  if (bytes.size() < sizeof(FsverityDescriptor)) {
    return Status::Corrupt("fs-verity descriptor of " + std::to_string(bytes.size()) + " bytes");
  }
  FsverityDescriptor raw;
  std::memcpy(&raw, bytes.data(), sizeof(raw));
  if (raw.version != 1) return Status::Corrupt("fs-verity descriptor version " + std::to_string(raw.version));
  const size_t ds = VerityDigestSize(raw.hash_algorithm);
  if (ds == 0) return Status::Corrupt("fs-verity descriptor: unknown hash algorithm " + std::to_string(raw.hash_algorithm));
  if (raw.log_blocksize < 10 || raw.log_blocksize > 16 || (1u << raw.log_blocksize) < 2 * ds) {
    return Status::Corrupt("fs-verity descriptor: block size 2^" + std::to_string(raw.log_blocksize));
  }
  if (raw.salt_size > kVerityMaxSalt) {
    return Status::Corrupt("fs-verity descriptor: salt of " + std::to_string(raw.salt_size) + " bytes");
  }
  if (std::any_of(std::begin(raw.reserved), std::end(raw.reserved), [](uint8_t b) { return b != 0; })) {
    return Status::Corrupt("fs-verity descriptor: reserved bytes are not zero");
  }
  if (raw.sig_size.get() != bytes.size() - sizeof(raw)) {
    return Status::Corrupt("fs-verity descriptor: a signature of " + std::to_string(raw.sig_size.get()) +
                           " bytes in " + std::to_string(bytes.size() - sizeof(raw)));
  }
  VerityDescriptor d;
  d.hash_algorithm = raw.hash_algorithm;
  d.block_size = 1u << raw.log_blocksize;
  d.data_size = raw.data_size.get();
  d.root_hash.assign(raw.root_hash, raw.root_hash + ds);
  d.salt.assign(raw.salt, raw.salt + raw.salt_size);
  d.signature.assign(bytes.begin() + sizeof(raw), bytes.end());
  return d;
}

std::vector<uint8_t> EncodeVerityDescriptor(const VerityDescriptor& d) {
  FsverityDescriptor raw{};
  raw.version = 1;
  raw.hash_algorithm = d.hash_algorithm;
  raw.log_blocksize = static_cast<uint8_t>(__builtin_ctz(d.block_size));
  raw.salt_size = static_cast<uint8_t>(d.salt.size());
  raw.sig_size = static_cast<uint32_t>(d.signature.size());
  raw.data_size = d.data_size;
  // (copy_n: an empty vector's data() may be null, which memcpy may not take)
  std::copy_n(d.root_hash.begin(), std::min(d.root_hash.size(), sizeof(raw.root_hash)), raw.root_hash);
  std::copy_n(d.salt.begin(), std::min(d.salt.size(), sizeof(raw.salt)), raw.salt);
  std::vector<uint8_t> out(sizeof(raw) + d.signature.size());
  std::memcpy(out.data(), &raw, sizeof(raw));
  std::copy(d.signature.begin(), d.signature.end(), out.begin() + sizeof(raw));
  return out;
}

std::vector<uint8_t> VerityFileDigest(const VerityDescriptor& d) {
  VerityDescriptor unsigned_desc = d;
  unsigned_desc.signature.clear();
  const std::vector<uint8_t> bytes = EncodeVerityDescriptor(unsigned_desc);
  std::vector<uint8_t> out(VerityDigestSize(d.hash_algorithm));
  SaltedHash(d.hash_algorithm, {}).Digest(bytes, out.data());
  return out;
}

Result<MerkleTree> BuildMerkleTree(uint8_t alg, uint32_t block_size, std::span<const uint8_t> salt,
                                   uint64_t data_size, const VerityReader& read) {
  const size_t ds = VerityDigestSize(alg);
  const SaltedHash hash(alg, salt);
  MerkleTree t;
  t.root_hash.assign(ds, 0);
  if (data_size == 0) return t;

  // Level 0: the data blocks' hashes, read a run of blocks at a time.
  // (Not reserved from data_size: a hostile descriptor may name any size;
  // the level grows only with what is read.)
  std::vector<uint8_t> level;
  const size_t run = std::max<size_t>(block_size, (1u << 20) / block_size * block_size);
  std::vector<uint8_t> buf(run);
  for (uint64_t at = 0; at < data_size;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(run, data_size - at));
    UB_ASSIGN_OR_RETURN(size_t got, read(at, std::span(buf.data(), want)));
    if (got != want) {
      return Status::IoError("fs-verity: the file ended at " + std::to_string(at + got) + " of " +
                             std::to_string(data_size) + " bytes");
    }
    // The last block's tail reads as zeros.
    std::fill(buf.begin() + want, buf.begin() + (want + block_size - 1) / block_size * block_size, 0);
    for (size_t off = 0; off < want; off += block_size) {
      level.resize(level.size() + ds);
      hash.Digest(std::span(buf.data() + off, block_size), level.data() + level.size() - ds);
    }
    at += want;
  }
  if (level.size() == ds) {  // one block: no tree
    t.root_hash = level;
    return t;
  }
  std::vector<std::vector<uint8_t>> levels;
  for (;;) {
    level.resize((level.size() + block_size - 1) / block_size * block_size, 0);
    const size_t blocks = level.size() / block_size;
    std::vector<uint8_t> up(blocks * ds);
    for (size_t b = 0; b < blocks; ++b) {
      hash.Digest(std::span(level.data() + b * block_size, block_size), up.data() + b * ds);
    }
    levels.push_back(std::move(level));
    if (blocks == 1) {
      t.root_hash = std::move(up);
      break;
    }
    level = std::move(up);
  }
  for (auto it = levels.rbegin(); it != levels.rend(); ++it) t.bytes.insert(t.bytes.end(), it->begin(), it->end());
  return t;
}

uint64_t MerkleTreeSize(uint8_t alg, uint32_t block_size, uint64_t data_size) {
  const uint64_t per_block = block_size / VerityDigestSize(alg);
  uint64_t blocks = (data_size + block_size - 1) / block_size, total = 0;
  while (blocks > 1) {
    blocks = (blocks + per_block - 1) / per_block;
    total += blocks;
  }
  return total * block_size;
}

Status AppendVerityItem(std::vector<uint8_t>* joined, uint64_t first_offset, uint64_t key_offset,
                        std::span<const uint8_t> bytes, std::string_view what) {
  if (key_offset != first_offset + joined->size()) {
    return Status::Corrupt(std::string(what) + ": an item at " + std::to_string(key_offset) + " where " +
                           std::to_string(first_offset + joined->size()) + " was due");
  }
  joined->insert(joined->end(), bytes.begin(), bytes.end());
  return Status::Ok();
}

}  // namespace ubtrfs::format
