#include "format/checksum.h"

#include <gtest/gtest.h>

#include <string>

namespace ubtrfs::format {
namespace UBTRFS_UNITY_ID {

std::span<const uint8_t> Bytes(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

std::string Digest(uint16_t type, const std::string& s) {
  CsumBytes c = ComputeCsum(type, Bytes(s));
  return HexString(c.data(), CsumSize(type));
}

TEST(Checksum, Crc32cStandardCheckValue) {
  // The CRC-32C check value of "123456789" is 0xe3069283, stored little-endian.
  EXPECT_EQ(Digest(0, "123456789"), "839206e3");
  EXPECT_EQ(~Crc32c(~0u, Bytes("123456789")), 0xe3069283u);
}

TEST(Checksum, Xxhash64KnownValues) {
  EXPECT_EQ(Digest(1, ""), "99e9d85137db46ef");  // XXH64("", seed 0) = 0xef46db3751d8e999
}

TEST(Checksum, Sha256KnownValue) {
  EXPECT_EQ(Digest(2, "abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Checksum, Blake2b256KnownValue) {
  EXPECT_EQ(Digest(3, "abc"), "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319");
}

TEST(Checksum, SizesAndNames) {
  EXPECT_EQ(CsumSize(0), 4u);
  EXPECT_EQ(CsumSize(1), 8u);
  EXPECT_EQ(CsumSize(2), 32u);
  EXPECT_EQ(CsumSize(3), 32u);
  EXPECT_EQ(CsumSize(4), 0u);
  EXPECT_EQ(CsumTypeFromName("xxhash"), uint16_t{1});
  EXPECT_EQ(CsumTypeFromName("blake2"), uint16_t{3});
  EXPECT_FALSE(CsumTypeFromName("md5").has_value());
}

TEST(Checksum, VerifyComparesOnlyTheDigestBytes) {
  std::string data = "some tree block bytes";
  CsumBytes c = ComputeCsum(0, Bytes(data));
  c[10] = 0x55;  // beyond the 4 stored bytes of crc32c
  EXPECT_TRUE(VerifyCsum(0, Bytes(data), c.data()));
  c[0] ^= 1;
  EXPECT_FALSE(VerifyCsum(0, Bytes(data), c.data()));
  EXPECT_FALSE(VerifyCsum(9, Bytes(data), c.data()));
}

TEST(NameHash, IsRawCrc32cSeededWithNotOne) {
  // The name hash is the kernel's raw crc32c(~1, name): no final inversion.
  EXPECT_EQ(NameHash("default"), Crc32c(0xfffffffeu, Bytes("default")));
  EXPECT_NE(NameHash("a"), NameHash("b"));
}

}  // namespace
}  // namespace ubtrfs::format
