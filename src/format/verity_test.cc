#include "format/verity.h"

#include <gtest/gtest.h>

#include <cstring>

#include "format/checksum.h"

namespace ubtrfs::format {
namespace UBTRFS_UNITY_ID {

// The digest of `data` as `fsverity digest` would print it (without the
// algorithm's name).
std::string Digest(const std::vector<uint8_t>& data, uint8_t alg, uint32_t block_size, std::vector<uint8_t> salt) {
  auto tree = BuildMerkleTree(alg, block_size, salt, data.size(), [&](uint64_t off, std::span<uint8_t> buf) {
    const size_t n = std::min<size_t>(buf.size(), data.size() - off);
    std::memcpy(buf.data(), data.data() + off, n);
    return Result<size_t>(n);
  });
  EXPECT_TRUE(tree.ok());
  if (!tree.ok()) return "";
  EXPECT_EQ(tree->bytes.size(), MerkleTreeSize(alg, block_size, data.size()));
  VerityDescriptor d;
  d.hash_algorithm = alg;
  d.block_size = block_size;
  d.data_size = data.size();
  d.root_hash = tree->root_hash;
  d.salt = std::move(salt);
  const std::vector<uint8_t> digest = VerityFileDigest(d);
  return HexString(digest.data(), digest.size());
}

// Vectors from fsverity-utils 1.5 (`fsverity digest FILE [options]`), an
// implementation of its own; tests/verity_test.cc compares whole trees.
TEST(Verity, DigestsAreFsverityUtilsOwn) {
  EXPECT_EQ(Digest({}, kVeritySha256, 4096, {}), "3d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95");
  // 5000 bytes of 'a', --salt=0102
  EXPECT_EQ(Digest(std::vector<uint8_t>(5000, 'a'), kVeritySha256, 4096, {1, 2}),
            "353a2c5fc3230daf81641c26e53916c73f643b274eecf24ece8d998756ee5190");
  // bytes 0..255 2000 times, --hash-alg=sha512 --block-size=1024: two levels
  std::vector<uint8_t> ramp;
  for (int i = 0; i < 2000; ++i) {
    for (int b = 0; b < 256; ++b) ramp.push_back(static_cast<uint8_t>(b));
  }
  EXPECT_EQ(Digest(ramp, kVeritySha512, 1024, {}),
            "c5cfc46a6b05edafb927feb362a015a0ac0411dee738e1b53462aa8955a2475566dac3ad6b766295fa36f3ac0ced399be571a8748b"
            "1825cfefed3b5d59ae8f91");
}

TEST(Verity, TreeSizesFollowTheLevels) {
  EXPECT_EQ(MerkleTreeSize(kVeritySha256, 4096, 0), 0u);
  EXPECT_EQ(MerkleTreeSize(kVeritySha256, 4096, 4096), 0u);       // one block: none
  EXPECT_EQ(MerkleTreeSize(kVeritySha256, 4096, 4097), 4096u);    // one level
  EXPECT_EQ(MerkleTreeSize(kVeritySha256, 4096, 128 * 4096), 4096u);
  EXPECT_EQ(MerkleTreeSize(kVeritySha256, 4096, 128 * 4096 + 1), 3 * 4096u);  // 2 + 1
  EXPECT_EQ(MerkleTreeSize(kVeritySha512, 4096, 64 * 4096 + 1), 3 * 4096u);
}

TEST(Verity, ParametersAreHeldToTheKernelsRules) {
  EXPECT_TRUE(CheckVerityParams(kVeritySha256, 4096, 32, 0, 4096).ok());
  EXPECT_TRUE(CheckVerityParams(kVeritySha512, 1024, 0, 1000, 4096).ok());
  EXPECT_EQ(CheckVerityParams(3, 4096, 0, 0, 4096).code(), EINVAL);
  EXPECT_EQ(CheckVerityParams(kVeritySha256, 3000, 0, 0, 4096).code(), EINVAL);
  EXPECT_EQ(CheckVerityParams(kVeritySha256, 512, 0, 0, 4096).code(), EINVAL);
  EXPECT_EQ(CheckVerityParams(kVeritySha256, 8192, 0, 0, 4096).code(), EINVAL);  // over the sector size
  EXPECT_EQ(CheckVerityParams(kVeritySha256, 4096, 33, 0, 4096).code(), EINVAL);
  EXPECT_EQ(CheckVerityParams(kVeritySha256, 4096, 0, 16384, 4096).code(), EINVAL);
}

TEST(Verity, StoredDescriptorsAreCheckedAsTheKernelOpensThem) {
  VerityDescriptor d;
  d.data_size = 12345;
  d.root_hash.assign(32, 7);
  d.salt = {1, 2, 3};
  d.signature = {9, 9};
  const std::vector<uint8_t> bytes = EncodeVerityDescriptor(d);
  ASSERT_EQ(bytes.size(), 256u + 2);
  auto back = ParseVerityDescriptor(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data_size, 12345u);
  EXPECT_EQ(back->root_hash, d.root_hash);
  EXPECT_EQ(back->salt, d.salt);
  EXPECT_EQ(back->signature, d.signature);
  // The digest leaves the signature out.
  VerityDescriptor unsigned_d = d;
  unsigned_d.signature.clear();
  EXPECT_EQ(VerityFileDigest(d), VerityFileDigest(unsigned_d));

  auto damaged = [&](size_t at, uint8_t v) {
    std::vector<uint8_t> b = bytes;
    b[at] = v;
    return ParseVerityDescriptor(b).status().code();
  };
  EXPECT_EQ(damaged(0, 2), EUCLEAN);    // version
  EXPECT_EQ(damaged(1, 9), EUCLEAN);    // algorithm
  EXPECT_EQ(damaged(2, 9), EUCLEAN);    // 512-byte blocks
  EXPECT_EQ(damaged(3, 33), EUCLEAN);   // salt size
  EXPECT_EQ(damaged(4, 3), EUCLEAN);    // signature size against the bytes there
  EXPECT_EQ(damaged(200, 1), EUCLEAN);  // reserved
  EXPECT_EQ(ParseVerityDescriptor(std::span(bytes).first(100)).status().code(), EUCLEAN);
}

TEST(Verity, ItemsMustFollowOnFromEachOther) {
  std::vector<uint8_t> joined;
  const std::vector<uint8_t> piece(10, 1);
  EXPECT_TRUE(AppendVerityItem(&joined, 1, 1, piece, "d").ok());
  EXPECT_TRUE(AppendVerityItem(&joined, 1, 11, piece, "d").ok());
  EXPECT_EQ(AppendVerityItem(&joined, 1, 30, piece, "d").code(), EUCLEAN);
  EXPECT_EQ(joined.size(), 20u);
}

}  // namespace
}  // namespace ubtrfs::format
