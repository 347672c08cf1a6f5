#include "fs/compress.h"

#include <gtest/gtest.h>
#include <lzo/lzo1x.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zlib.h>
#include <zstd.h>

#include "format/endian.h"

namespace ubtrfs::fs {
namespace UBTRFS_UNITY_ID {

constexpr uint8_t kZlib = 1;
constexpr uint8_t kLzo = 2;
constexpr uint8_t kZstd = 3;
constexpr uint32_t kSector = 4096;
constexpr uint8_t kTypes[] = {kZlib, kLzo, kZstd};

using Bytes = std::vector<uint8_t>;

std::string TypeName(uint8_t type) {
  switch (type) {
    case kZlib:
      return "zlib";
    case kLzo:
      return "lzo";
    case kZstd:
      return "zstd";
    default:
      return "type" + std::to_string(type);
  }
}

Bytes RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& c : b) c = static_cast<uint8_t>(rng());
  return b;
}

// Text-like data: compresses well but is not trivially repetitive.
Bytes TextBytes(size_t n, uint32_t seed) {
  static const char* const kWords[] = {"btrfs ", "extent ", "inode ", "tree ", "chunk ", "sector ",
                                       "compress ", "lzo ", "zstd ", "zlib ", "\n", "0123 "};
  std::mt19937 rng(seed);
  Bytes b;
  b.reserve(n + 16);
  while (b.size() < n) {
    const char* w = kWords[rng() % std::size(kWords)];
    b.insert(b.end(), w, w + std::strlen(w));
  }
  b.resize(n);
  return b;
}

// Half random, half zero runs, in 1000-byte stripes.
Bytes MixedBytes(size_t n, uint32_t seed) {
  Bytes b = RandomBytes(n, seed);
  for (size_t i = 0; i < n; ++i) {
    if ((i / 1000) % 2 == 1) b[i] = 0;
  }
  return b;
}

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Bytes MustCompress(uint8_t type, const Bytes& in, uint32_t sectorsize = kSector) {
  auto r = Compress(type, in, sectorsize);
  EXPECT_TRUE(r.ok()) << TypeName(type) << ": " << r.status().ToString();
  return r.ok() ? std::move(r).value() : Bytes{};
}

// Decodes into a buffer of out_size pre-filled with a marker so that unwritten
// bytes are visible.
Status DecodeInto(uint8_t type, const Bytes& in, size_t out_size, Bytes* out, uint32_t sectorsize = kSector) {
  out->assign(out_size, 0xA5);
  return Decompress(type, in, *out, sectorsize);
}

void ExpectCorrupt(const Status& s, uint8_t type, const std::string& what) {
  EXPECT_FALSE(s.ok()) << what;
  EXPECT_EQ(s.code(), EUCLEAN) << what << ": " << s.ToString();
  EXPECT_EQ(s.message().rfind(TypeName(type) + ":", 0), 0u) << what << ": message should name the algorithm: "
                                                            << s.message();
}

// One lzo1x block made directly with liblzo2, as the kernel makes each segment.
Bytes LzoBlock(const uint8_t* data, size_t n) {
  EXPECT_EQ(lzo_init(), LZO_E_OK);
  std::vector<lzo_align_t> wrk((LZO1X_1_MEM_COMPRESS + sizeof(lzo_align_t) - 1) / sizeof(lzo_align_t));
  Bytes out(n + n / 16 + 64 + 3);
  lzo_uint len = out.size();
  EXPECT_EQ(lzo1x_1_compress(data, n, out.data(), &len, wrk.data()), LZO_E_OK);
  out.resize(len);
  return out;
}

void PutLe32(Bytes& b, size_t at, uint32_t v) { format::StoreLe<uint32_t>(b.data() + at, v); }
void AppendLe32(Bytes& b, uint32_t v) {
  b.resize(b.size() + 4);
  PutLe32(b, b.size() - 4, v);
}

// ------------------------------------------------------------ round trips

struct RoundTripCase {
  uint8_t type;
  size_t size;
  int kind;  // 0 text, 1 random, 2 zeros, 3 mixed
};

std::string CaseName(const testing::TestParamInfo<RoundTripCase>& info) {
  static const char* const kKinds[] = {"text", "random", "zeros", "mixed"};
  return TypeName(info.param.type) + "_" + std::to_string(info.param.size) + "_" + kKinds[info.param.kind];
}

class CompressRoundTrip : public testing::TestWithParam<RoundTripCase> {};

Bytes MakeData(const RoundTripCase& c) {
  const uint32_t seed = static_cast<uint32_t>(c.size * 31 + c.kind);
  switch (c.kind) {
    case 0:
      return TextBytes(c.size, seed);
    case 1:
      return RandomBytes(c.size, seed);
    case 2:
      return Bytes(c.size, 0);
    default:
      return MixedBytes(c.size, seed);
  }
}

TEST_P(CompressRoundTrip, DecodesExactly) {
  const RoundTripCase& c = GetParam();
  const Bytes data = MakeData(c);
  const Bytes comp = MustCompress(c.type, data);
  Bytes out;
  ASSERT_TRUE(DecodeInto(c.type, comp, data.size(), &out).ok());
  EXPECT_TRUE(out == data);

  // A regular extent is read in whole sectors: bytes after the stream (zero
  // padding, or anything) are ignored.
  for (uint8_t fill : {uint8_t{0}, uint8_t{0xFF}}) {
    Bytes padded = comp;
    padded.resize((comp.size() / kSector + 1) * kSector, fill);
    Status s = DecodeInto(c.type, padded, data.size(), &out);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(out == data) << "fill " << int(fill);
  }
}

std::vector<RoundTripCase> AllRoundTripCases() {
  const size_t sizes[] = {0, 1, 3, 4, 5, 100, 1000, 4093, 4095, 4096, 4097, 8191, 8192, 8193, 12345, 65536,
                          100000, 131071, 131072};
  std::vector<RoundTripCase> cases;
  for (uint8_t t : kTypes)
    for (size_t n : sizes)
      for (int k = 0; k < 4; ++k) cases.push_back({t, n, k});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CompressRoundTrip, testing::ValuesIn(AllRoundTripCases()), CaseName);

TEST(Compress, LzoRoundTripOtherSectorSizes) {
  for (uint32_t ss : {512u, 16384u, 65536u}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{ss - 1}, size_t{ss}, size_t{ss + 1}, size_t{3 * ss + 7}, size_t{131072}}) {
      for (const Bytes& data : {TextBytes(n, 7), RandomBytes(n, 8), MixedBytes(n, 9)}) {
        const Bytes comp = MustCompress(kLzo, data, ss);
        Bytes out;
        Status s = DecodeInto(kLzo, comp, data.size(), &out, ss);
        ASSERT_TRUE(s.ok()) << "ss " << ss << " n " << n << ": " << s.ToString();
        EXPECT_TRUE(out == data) << "ss " << ss << " n " << n;
      }
    }
  }
}

TEST(Compress, LzoFramingMatchesKernelLayout) {
  // Every header inside one sector; total length covers everything.
  const Bytes data = MixedBytes(131072, 42);
  const Bytes comp = MustCompress(kLzo, data);
  ASSERT_GE(comp.size(), 8u);
  EXPECT_EQ(format::LoadLe<uint32_t>(comp.data()), comp.size());
  size_t cur = 4;
  size_t segments = 0;
  while (cur < comp.size()) {
    ASSERT_EQ(cur / kSector, (cur + 3) / kSector) << "header at " << cur << " straddles a sector boundary";
    const uint32_t len = format::LoadLe<uint32_t>(comp.data() + cur);
    cur += 4 + len;
    ++segments;
    const size_t left = kSector - cur % kSector;
    if (left < 4) {
      for (size_t i = 0; i < left; ++i) EXPECT_EQ(comp[cur + i], 0) << "padding at " << cur + i;
      cur += left;
    }
  }
  EXPECT_EQ(cur, comp.size());
  EXPECT_EQ(segments, 131072u / kSector);
}

TEST(Compress, CompressUnknownTypeOrBadSectorsize) {
  const Bytes data = TextBytes(100, 1);
  for (uint8_t t : {uint8_t{0}, uint8_t{4}, uint8_t{255}}) {
    auto r = Compress(t, data, kSector);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), EOPNOTSUPP);
    EXPECT_TRUE(Contains(r.status().message(), "compression type " + std::to_string(t))) << r.status().message();
  }
  for (uint32_t ss : {0u, 1u, 4u, 3000u, 131072u}) {
    auto r = Compress(kLzo, data, ss);
    ASSERT_FALSE(r.ok()) << ss;
    EXPECT_EQ(r.status().code(), EINVAL);
  }
}

// ------------------------------------------------------------ output sizing

TEST(Decompress, ShortStreamIsZeroFilled) {
  for (uint8_t t : kTypes) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{5000}, size_t{8192}}) {
      const Bytes data = TextBytes(n, 3);
      const Bytes comp = MustCompress(t, data);
      Bytes out;
      Status s = DecodeInto(t, comp, 12288, &out);
      ASSERT_TRUE(s.ok()) << TypeName(t) << " " << n << ": " << s.ToString();
      EXPECT_TRUE(std::equal(data.begin(), data.end(), out.begin())) << TypeName(t);
      EXPECT_TRUE(std::all_of(out.begin() + static_cast<long>(n), out.end(), [](uint8_t b) { return b == 0; }))
          << TypeName(t) << " " << n << ": tail not zero-filled";
    }
  }
}

TEST(Decompress, LongStreamStopsAtOutputSize) {
  for (uint8_t t : kTypes) {
    for (const Bytes& data : {TextBytes(131072, 4), RandomBytes(131072, 5)}) {
      const Bytes comp = MustCompress(t, data);
      for (size_t n : {size_t{1}, size_t{4095}, size_t{4096}, size_t{5000}, size_t{131071}}) {
        Bytes out;
        Status s = DecodeInto(t, comp, n, &out);
        ASSERT_TRUE(s.ok()) << TypeName(t) << " " << n << ": " << s.ToString();
        EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin())) << TypeName(t) << " " << n;
      }
    }
  }
}

TEST(Decompress, EmptyOutputIsOk) {
  for (uint8_t t : kTypes) {
    Bytes out;
    EXPECT_TRUE(Decompress(t, MustCompress(t, TextBytes(100, 1)), out, kSector).ok());
  }
}

TEST(Decompress, UnknownType) {
  Bytes out(10);
  const Bytes in(10, 1);
  for (uint8_t t : {uint8_t{0}, uint8_t{4}, uint8_t{99}}) {
    Status s = Decompress(t, in, out, kSector);
    EXPECT_EQ(s.code(), EOPNOTSUPP);
    EXPECT_TRUE(Contains(s.message(), "compression type " + std::to_string(t))) << s.message();
  }
}

TEST(Decompress, LzoBadSectorsizeIsInvalid) {
  const Bytes comp = MustCompress(kLzo, TextBytes(100, 1));
  Bytes out(100);
  for (uint32_t ss : {0u, 2u, 4u, 100u, 4095u, 131072u}) {
    EXPECT_EQ(Decompress(kLzo, comp, out, ss).code(), EINVAL) << ss;
  }
}

// ------------------------------------------------------------ lzo framing

// Builds the btrfs lzo framing by hand for the given sectors of input,
// padding as the kernel does.
Bytes FrameLzo(const std::vector<Bytes>& blocks, uint32_t sectorsize = kSector) {
  Bytes out(4);
  for (const Bytes& blk : blocks) {
    AppendLe32(out, static_cast<uint32_t>(blk.size()));
    out.insert(out.end(), blk.begin(), blk.end());
    const size_t left = sectorsize - out.size() % sectorsize;
    if (left < 4) out.resize(out.size() + left, 0);
  }
  PutLe32(out, 0, static_cast<uint32_t>(out.size()));
  return out;
}

// A 4096-byte sector whose lzo block is exactly `want` bytes long (k zero
// bytes then random ones, for the right k: each extra zero shortens the block
// by about one byte).
Bytes SectorWithBlockSize(size_t want, Bytes* block) {
  const Bytes random = RandomBytes(kSector, 1234);
  for (size_t k = 0; k <= 400; ++k) {
    Bytes sector(k, 0);
    sector.insert(sector.end(), random.begin(), random.begin() + static_cast<long>(kSector - k));
    Bytes blk = LzoBlock(sector.data(), sector.size());
    if (blk.size() == want) {
      *block = std::move(blk);
      return sector;
    }
  }
  ADD_FAILURE() << "no sector compresses to " << want << " bytes";
  return {};
}

TEST(DecompressLzo, SegmentHeaderNeverStraddlesSectorBoundary) {
  // After [total][hdr1][block1] the next header would start at 8 + len1.
  // left = 4096 - (8 + len1): 1..3 means padding, 4 means the header just
  // fits, 0 means the next header starts exactly at the boundary.
  for (size_t left : {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{0}}) {
    SCOPED_TRACE("bytes left in sector: " + std::to_string(left));
    Bytes blk1;
    const Bytes s1 = SectorWithBlockSize(kSector - 8 - left, &blk1);
    ASSERT_FALSE(s1.empty());
    const Bytes s2 = TextBytes(kSector, 77);
    const Bytes s3 = TextBytes(1000, 78);  // a short final sector
    const Bytes blk2 = LzoBlock(s2.data(), s2.size());
    const Bytes blk3 = LzoBlock(s3.data(), s3.size());
    const Bytes framed = FrameLzo({blk1, blk2, blk3});

    Bytes data = s1;
    data.insert(data.end(), s2.begin(), s2.end());
    data.insert(data.end(), s3.begin(), s3.end());

    const size_t hdr2 = 8 + blk1.size() + (left < 4 ? left : 0);
    EXPECT_EQ(hdr2 % kSector, left == 4 ? kSector - 4 : 0);
    EXPECT_EQ(format::LoadLe<uint32_t>(framed.data() + hdr2), blk2.size());

    Bytes out;
    Status s = DecodeInto(kLzo, framed, data.size(), &out);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(out == data);

    // Our compressor writes the same bytes as the hand-built kernel layout.
    EXPECT_TRUE(MustCompress(kLzo, data) == framed);

    if (left >= 1 && left <= 3) {
      // A writer that forgot the padding puts the header across the boundary;
      // the reader skips to the boundary and then finds nonsense.
      Bytes unpadded(4);
      for (const Bytes* b : std::initializer_list<const Bytes*>{&blk1, &blk2, &blk3}) {
        AppendLe32(unpadded, static_cast<uint32_t>(b->size()));
        unpadded.insert(unpadded.end(), b->begin(), b->end());
      }
      PutLe32(unpadded, 0, static_cast<uint32_t>(unpadded.size()));
      ExpectCorrupt(DecodeInto(kLzo, unpadded, data.size(), &out), kLzo, "unpadded straddling header");
    }
  }
}

TEST(DecompressLzo, PaddingAfterFinalSegmentIsCounted) {
  // The kernel pads after the last segment too; the total length includes it.
  Bytes blk1;
  const Bytes s1 = SectorWithBlockSize(kSector - 8 - 2, &blk1);
  ASSERT_FALSE(s1.empty());
  const Bytes framed = FrameLzo({blk1});
  EXPECT_EQ(framed.size(), kSector);
  Bytes out;
  ASSERT_TRUE(DecodeInto(kLzo, framed, kSector, &out).ok());
  EXPECT_TRUE(out == s1);
  // A total length that stops before the padding is also fine.
  Bytes tight = framed;
  PutLe32(tight, 0, kSector - 2);
  ASSERT_TRUE(DecodeInto(kLzo, tight, kSector, &out).ok());
  EXPECT_TRUE(out == s1);
}

TEST(DecompressLzo, EmptyFramingZeroFills) {
  Bytes framed(4);
  PutLe32(framed, 0, 4);
  Bytes out;
  ASSERT_TRUE(DecodeInto(kLzo, framed, 100, &out).ok());
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; }));
}

TEST(DecompressLzo, LyingTotalLength) {
  const Bytes data = TextBytes(3 * kSector, 11);
  const Bytes comp = MustCompress(kLzo, data);
  Bytes out;
  for (uint32_t total : {0u, 1u, 3u}) {
    Bytes bad = comp;
    PutLe32(bad, 0, total);
    Status s = DecodeInto(kLzo, bad, data.size(), &out);
    ExpectCorrupt(s, kLzo, "total " + std::to_string(total));
    EXPECT_TRUE(Contains(s.message(), "total length")) << s.message();
  }
  for (uint32_t total : {static_cast<uint32_t>(comp.size() + 1), 0xFFFFFFFFu, 70000u}) {
    Bytes bad = comp;
    PutLe32(bad, 0, total);
    Status s = DecodeInto(kLzo, bad, data.size(), &out);
    ExpectCorrupt(s, kLzo, "total " + std::to_string(total));
    EXPECT_TRUE(Contains(s.message(), "exceeds input size")) << s.message();
  }
  // Smaller than the data: cuts a header or a segment.
  for (uint32_t total : {5u, 6u, 7u, 8u, 20u, static_cast<uint32_t>(comp.size() - 1)}) {
    Bytes bad = comp;
    PutLe32(bad, 0, total);
    ExpectCorrupt(DecodeInto(kLzo, bad, data.size(), &out), kLzo, "total " + std::to_string(total));
  }
}

TEST(DecompressLzo, SegmentLengthLargerThanInput) {
  const Bytes data = TextBytes(2 * kSector, 12);
  const Bytes comp = MustCompress(kLzo, data);
  Bytes out;
  Bytes bad = comp;
  PutLe32(bad, 4, 70000);
  Status s = DecodeInto(kLzo, bad, data.size(), &out);
  ExpectCorrupt(s, kLzo, "segment length 70000");
  EXPECT_TRUE(Contains(s.message(), "segment length 70000 at offset 4 exceeds input")) << s.message();

  bad = comp;
  PutLe32(bad, 4, 0xFFFFFFFF);
  ExpectCorrupt(DecodeInto(kLzo, bad, data.size(), &out), kLzo, "segment length 2^32-1");

  bad = comp;
  PutLe32(bad, 4, 0);
  s = DecodeInto(kLzo, bad, data.size(), &out);
  ExpectCorrupt(s, kLzo, "segment length 0");
  EXPECT_TRUE(Contains(s.message(), "segment length 0")) << s.message();

  // Second segment's length runs past the total by one byte.
  bad = comp;
  const uint32_t len1 = format::LoadLe<uint32_t>(bad.data() + 4);
  const size_t hdr2 = 8 + len1;
  const uint32_t len2 = format::LoadLe<uint32_t>(bad.data() + hdr2);
  PutLe32(bad, hdr2, len2 + 1);
  s = DecodeInto(kLzo, bad, data.size(), &out);
  ExpectCorrupt(s, kLzo, "segment 2 too long");
  EXPECT_TRUE(Contains(s.message(), "at offset " + std::to_string(hdr2))) << s.message();
}

TEST(DecompressLzo, SegmentDecodingToMoreThanASector) {
  const Bytes big = TextBytes(2 * kSector, 13);
  const Bytes framed = FrameLzo({LzoBlock(big.data(), big.size())});
  Bytes out;
  Status s = DecodeInto(kLzo, framed, big.size(), &out);
  ExpectCorrupt(s, kLzo, "oversized segment");
  EXPECT_TRUE(Contains(s.message(), "more than one sector")) << s.message();
  // With a larger sector size the same framing is fine.
  ASSERT_TRUE(DecodeInto(kLzo, framed, big.size(), &out, 16384).ok());
  EXPECT_TRUE(out == big);
}

TEST(DecompressLzo, SegmentWithTrailingBytes) {
  const Bytes sector = TextBytes(kSector, 14);
  Bytes blk = LzoBlock(sector.data(), sector.size());
  blk.push_back(0x11);  // junk after the end-of-stream marker, counted in the length
  Bytes out;
  ExpectCorrupt(DecodeInto(kLzo, FrameLzo({blk}), kSector, &out), kLzo, "trailing bytes in segment");
}

// ------------------------------------------------------------ zlib / zstd specifics

// Window size a zstd frame header asks for (RFC 8878 3.1.1.1), or the content
// size for a single-segment frame.
uint64_t ZstdWindowSize(const Bytes& frame) {
  if (frame.size() < 6 || format::LoadLe<uint32_t>(frame.data()) != 0xFD2FB528u) return 0;
  const uint8_t fhd = frame[4];
  if ((fhd & 0x20) == 0) {
    const uint8_t wd = frame[5];
    const uint64_t base = uint64_t{1} << (10 + (wd >> 3));
    return base + (base / 8) * (wd & 7);
  }
  // Single segment: the window is the content size, whose field follows the
  // optional dictionary id.
  static const int kDictIdBytes[] = {0, 1, 2, 4};
  static const int kFcsBytes[] = {1, 2, 4, 8};
  const size_t at = 5 + static_cast<size_t>(kDictIdBytes[fhd & 3]);
  const int n = kFcsBytes[fhd >> 6];
  if (frame.size() < at + static_cast<size_t>(n)) return 0;
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | frame[at + static_cast<size_t>(i)];
  return n == 2 ? v + 256 : v;
}

// Streams `data` into a frame whose header has no content size (as the
// kernel's streaming compressor may write).
Bytes ZstdFrameWithoutContentSize(const Bytes& data) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  EXPECT_NE(c, nullptr);
  EXPECT_FALSE(ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0)));
  Bytes comp(ZSTD_compressBound(data.size()) + 64);
  ZSTD_outBuffer ob{comp.data(), comp.size(), 0};
  ZSTD_inBuffer ib{data.data(), data.size(), 0};
  EXPECT_FALSE(ZSTD_isError(ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_continue)));
  size_t r;
  do {
    r = ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_end);
    EXPECT_FALSE(ZSTD_isError(r));
  } while (r != 0 && !ZSTD_isError(r));
  ZSTD_freeCCtx(c);
  comp.resize(ob.pos);
  return comp;
}

TEST(DecompressZstd, FrameWithoutContentSize) {
  const Bytes data = TextBytes(100000, 15);
  const Bytes comp = ZstdFrameWithoutContentSize(data);
  ASSERT_EQ(ZSTD_getFrameContentSize(comp.data(), comp.size()), ZSTD_CONTENTSIZE_UNKNOWN);
  Bytes out;
  ASSERT_TRUE(DecodeInto(kZstd, comp, data.size(), &out).ok());
  EXPECT_TRUE(out == data);
  ASSERT_TRUE(DecodeInto(kZstd, comp, data.size() + 5000, &out).ok());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), out.begin()));
  EXPECT_TRUE(std::all_of(out.begin() + static_cast<long>(data.size()), out.end(), [](uint8_t b) { return b == 0; }));
}

TEST(DecompressZstd, HugeWindowIsRejected) {
  // A frame that asks for a 2^30 window must be refused, not allocated. The
  // window descriptor (RFC 8878) of a frame without content size is byte 5:
  // exponent in the top 5 bits, window log = 10 + exponent.
  const Bytes data = TextBytes(10000, 16);
  Bytes comp = ZstdFrameWithoutContentSize(data);
  ASSERT_GE(comp.size(), 6u);
  ASSERT_EQ(comp[4] & 0x20, 0) << "expected a frame with a window descriptor";
  comp[5] = static_cast<uint8_t>(20 << 3);
  ASSERT_GT(ZstdWindowSize(comp), uint64_t{1} << kZstdWindowLogMax);
  Bytes out;
  Status s = DecodeInto(kZstd, comp, data.size(), &out);
  ExpectCorrupt(s, kZstd, "huge window");
  // The decoder still works afterwards (the per-thread context is reset).
  const Bytes ok = MustCompress(kZstd, data);
  ASSERT_TRUE(DecodeInto(kZstd, ok, data.size(), &out).ok());
  EXPECT_TRUE(out == data);
}

TEST(DecompressZstd, CompressorStaysWithinBtrfsWindow) {
  const Bytes data = RandomBytes(200000, 17);  // bigger than an extent, to force the limit
  const Bytes comp = MustCompress(kZstd, data);
  EXPECT_LE(ZstdWindowSize(comp), uint64_t{1} << 17);
}

TEST(DecompressZlib, RejectsGzipAndRawDeflate) {
  const Bytes data = TextBytes(5000, 18);
  Bytes out;
  for (int window_bits : {15 + 16, -15}) {  // gzip wrapper, raw deflate
    z_stream s{};
    ASSERT_EQ(deflateInit2(&s, 6, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
    Bytes comp(deflateBound(&s, data.size()));
    s.next_in = const_cast<Bytef*>(data.data());
    s.avail_in = static_cast<uInt>(data.size());
    s.next_out = comp.data();
    s.avail_out = static_cast<uInt>(comp.size());
    ASSERT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
    comp.resize(s.total_out);
    deflateEnd(&s);
    ExpectCorrupt(DecodeInto(kZlib, comp, data.size(), &out), kZlib, "windowBits " + std::to_string(window_bits));
  }
}

TEST(DecompressZlib, BadChecksumIsCorrupt) {
  const Bytes data = TextBytes(5000, 19);
  Bytes comp = MustCompress(kZlib, data);
  comp.back() ^= 0x01;  // adler32 trailer
  Bytes out;
  ExpectCorrupt(DecodeInto(kZlib, comp, data.size(), &out), kZlib, "adler32");
}

// ------------------------------------------------------------ damaged input

TEST(Decompress, TruncatedInputIsCorrupt) {
  for (uint8_t t : kTypes) {
    for (const Bytes& data : {TextBytes(3 * kSector + 100, 20), RandomBytes(3 * kSector + 100, 21)}) {
      const Bytes comp = MustCompress(t, data);
      // Cuts that remove compressed payload (not just a zlib/zstd trailer that
      // is read after the output is already complete).
      for (size_t keep : {size_t{0}, size_t{1}, size_t{2}, size_t{4}, size_t{7}, comp.size() / 3, comp.size() / 2,
                          comp.size() - 9}) {
        Bytes cut(comp.begin(), comp.begin() + static_cast<long>(keep));
        Bytes out;
        ExpectCorrupt(DecodeInto(t, cut, data.size(), &out), t, "kept " + std::to_string(keep));
      }
    }
  }
}

TEST(Decompress, GarbageIsCorrupt) {
  for (uint8_t t : kTypes) {
    std::vector<Bytes> garbage = {Bytes{}, Bytes(1, 0), Bytes(3, 0xFF), Bytes(4096, 0), Bytes(4096, 0xFF),
                                  TextBytes(4096, 22)};
    for (uint32_t seed = 0; seed < 50; ++seed) garbage.push_back(RandomBytes(1 + seed * 97, 1000 + seed));
    for (const Bytes& g : garbage) {
      Bytes out;
      ExpectCorrupt(DecodeInto(t, g, 8192, &out), t, "garbage of " + std::to_string(g.size()) + " bytes");
    }
  }
}

TEST(Decompress, BitFlipsNeverCrashAndAreMostlyDetected) {
  for (uint8_t t : kTypes) {
    const Bytes data = TextBytes(3 * kSector + 500, 23);
    const Bytes comp = MustCompress(t, data);
    size_t detected = 0;
    size_t flips = 0;
    for (size_t bit = 0; bit < comp.size() * 8; ++bit) {
      Bytes bad = comp;
      bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      Bytes out;
      Status s = DecodeInto(t, bad, data.size(), &out);
      ++flips;
      if (s.ok()) {
        continue;  // a flip in literal data may still decode (no checksum for zstd/lzo)
      }
      ++detected;
      ASSERT_EQ(s.code(), EUCLEAN) << TypeName(t) << " bit " << bit << ": " << s.ToString();
      ASSERT_EQ(s.message().rfind(TypeName(t) + ":", 0), 0u) << s.message();
    }
    // Headers: zlib's CMF/FLG check, zstd's magic, the high bytes of lzo's
    // total length.
    const size_t header_bytes[] = {0, 1};
    for (size_t byte : header_bytes) {
      for (int b = 0; b < 8; ++b) {
        Bytes bad = comp;
        const size_t at = (t == kLzo) ? byte + 2 : byte;
        bad[at] ^= static_cast<uint8_t>(1u << b);
        Bytes out;
        ExpectCorrupt(DecodeInto(t, bad, data.size(), &out), t, "header byte " + std::to_string(at));
      }
    }
    std::cout << "[          ] " << TypeName(t) << ": " << detected << " of " << flips << " bit flips detected\n";
    // Flips that make the stream longer go unnoticed: decoding stops once the
    // output is full (as in the kernel), before zlib's adler32.
    const size_t min_tenths = (t == kZlib) ? 8 : (t == kZstd) ? 4 : 1;
    EXPECT_GT(detected * 10, flips * min_tenths) << TypeName(t);
  }
}

TEST(Decompress, RandomMutationsNeverCrash) {
  std::mt19937 rng(24);
  for (uint8_t t : kTypes) {
    const Bytes data = MixedBytes(5 * kSector + 33, 25);
    const Bytes comp = MustCompress(t, data);
    for (int iter = 0; iter < 1500; ++iter) {
      Bytes bad = comp;
      const int edits = 1 + static_cast<int>(rng() % 8);
      for (int e = 0; e < edits; ++e) bad[rng() % bad.size()] = static_cast<uint8_t>(rng());
      if (rng() % 4 == 0) bad.resize(rng() % (bad.size() + 1));
      if (rng() % 4 == 0) bad.resize(bad.size() + rng() % 5000, static_cast<uint8_t>(rng()));
      const size_t out_size = (rng() % 2) ? data.size() : 1 + rng() % (8 * kSector);
      Bytes out;
      Status s = DecodeInto(t, bad, out_size, &out);
      if (!s.ok()) {
        ASSERT_EQ(s.code(), EUCLEAN) << TypeName(t) << ": " << s.ToString();
      }
    }
  }
}

TEST(Decompress, ConcurrentUse) {
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([i, &failures] {
      for (int j = 0; j < 30; ++j) {
        const uint8_t t = kTypes[(i + j) % 3];
        const Bytes data = TextBytes(20000 + static_cast<size_t>(i * 1000 + j), static_cast<uint32_t>(i * 100 + j));
        auto comp = Compress(t, data, kSector);
        Bytes out(data.size());
        if (!comp.ok() || !Decompress(t, *comp, out, kSector).ok() || out != data) ++failures[i];
        Bytes garbage = RandomBytes(3000, static_cast<uint32_t>(j));
        if (Decompress(t, garbage, out, kSector).ok()) ++failures[i];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

// ------------------------------------------------------------ kernel interop

// Real kernel-written extents. A fixture is a pair in one directory:
//   NAME.zlib | NAME.lzo | NAME.zstd : the extent's on-disk bytes (disk_num_bytes
//                                      as read from the device, or inline data)
//   NAME.expected                    : the decompressed bytes (ram_bytes long)
// from a filesystem with 4096-byte sectors. The directory is
// $UBTRFS_COMPRESS_FIXTURES, else tests/fixtures/compress in the source tree.
std::filesystem::path FixtureDir() {
  if (const char* env = std::getenv("UBTRFS_COMPRESS_FIXTURES"); env != nullptr && *env != '\0') return env;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "tests" / "fixtures" /
         "compress";
}

bool ReadFile(const std::filesystem::path& p, Bytes* out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

TEST(CompressInterop, DecodesKernelExtents) {
  const std::filesystem::path dir = FixtureDir();
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    GTEST_SKIP() << "no kernel fixtures: " << dir << " does not exist (set UBTRFS_COMPRESS_FIXTURES)";
  }
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::filesystem::path p = entry.path();
    const std::string ext = p.extension().string();
    uint8_t type = 0;
    if (ext == ".zlib") type = kZlib;
    else if (ext == ".lzo") type = kLzo;
    else if (ext == ".zstd") type = kZstd;
    else continue;
    std::filesystem::path expected_path = p;
    expected_path.replace_extension(".expected");
    Bytes in;
    Bytes expected;
    ASSERT_TRUE(ReadFile(p, &in)) << p;
    ASSERT_TRUE(ReadFile(expected_path, &expected)) << "missing " << expected_path;
    Bytes out(expected.size(), 0xA5);
    Status s = Decompress(type, in, out, kSector);
    ASSERT_TRUE(s.ok()) << p << ": " << s.ToString();
    EXPECT_TRUE(out == expected) << p;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no kernel fixtures (*.zlib, *.lzo, *.zstd) in " << dir;
  std::cout << "[          ] decoded " << checked << " kernel extents from " << dir << "\n";
}

}  // namespace
}  // namespace ubtrfs::fs
