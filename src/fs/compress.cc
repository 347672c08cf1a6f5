// btrfs extent (de)compression: the codecs are zlib, libzstd and liblzo2;
// this file only adds the btrfs framing and strict bounds checking.
#include "fs/compress.h"

#include <lzo/lzo1x.h>
#include <zlib.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_c_maxBlockSize
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "format/endian.h"

namespace ubtrfs::fs {
namespace {

constexpr uint8_t kTypeZlib = 1;
constexpr uint8_t kTypeLzo = 2;
constexpr uint8_t kTypeZstd = 3;

constexpr size_t kLzoLen = 4;  // size of the lzo total-length and segment headers
constexpr int kZlibLevel = 3;  // the kernel's default zlib level
constexpr int kZstdLevel = 3;  // the kernel's default zstd level
constexpr int kZstdBtrfsWindowLog = 17;
// zstd sizes a level's match tables for its input (128 KiB here): at levels
// 2 and 3 that is 2^15-2^16 entries, more than such an input has positions
// worth keeping, and they stop fitting the L2 cache. Tables of 2^14 took
// 13-20% less CPU in `mkfs --compress zstd` (a text tree, /usr/share/doc,
// /usr/lib) for 0.0-0.4% more bytes and 0.6 MB less memory (two contexts).
// Level 1 is smaller already; higher levels ask for ratio and keep theirs.
constexpr int kZstdSmallTablesUpTo = 3;
constexpr int kZstdSmallTableLog = 14;
// Most of a context is the store of one block's sequences, sized for the
// largest block (128 KiB). Blocks of 32 KiB made each context 648 -> 279 KB
// (an image build holds one per core) for -0.1..+0.3% bytes on text and
// headers and no loss of speed; a frame of several blocks is what zstd
// writes anyway, and the kernel reads it as any other.
constexpr int kZstdSmallBlock = 32 << 10;

// Inputs larger than this are not extents; refusing them keeps every length
// within zlib's 32-bit counters and the lzo u32 total length.
constexpr size_t kMaxCompressInput = size_t{1} << 30;

template <typename T>
std::string Num(T v) {
  return std::to_string(v);
}

void ZeroFill(std::span<uint8_t> out, size_t from) {
  if (from < out.size()) std::memset(out.data() + from, 0, out.size() - from);
}

// ---------------------------------------------------------------- zlib

Status InflateZlib(std::span<const uint8_t> in, std::span<uint8_t> out) {
  z_stream s{};
  int rc = inflateInit(&s);
  if (rc != Z_OK) {
    return Status::Error(rc == Z_MEM_ERROR ? ENOMEM : EIO, "zlib: inflateInit failed (" + Num(rc) + ")");
  }
  struct Ender {
    z_stream* s;
    ~Ender() { inflateEnd(s); }
  } ender{&s};

  size_t in_pos = 0;
  size_t out_pos = 0;
  while (out_pos < out.size()) {
    const size_t in_chunk = std::min<size_t>(in.size() - in_pos, UINT_MAX);
    const size_t out_chunk = std::min<size_t>(out.size() - out_pos, UINT_MAX);
    s.next_in = const_cast<Bytef*>(in.data() + in_pos);
    s.avail_in = static_cast<uInt>(in_chunk);
    s.next_out = out.data() + out_pos;
    s.avail_out = static_cast<uInt>(out_chunk);
    rc = inflate(&s, Z_NO_FLUSH);
    const size_t consumed = in_chunk - s.avail_in;
    const size_t produced = out_chunk - s.avail_out;
    in_pos += consumed;
    out_pos += produced;
    switch (rc) {
      case Z_STREAM_END:
        ZeroFill(out, out_pos);
        return Status::Ok();
      case Z_OK:
        if (consumed == 0 && produced == 0) {
          return Status::Corrupt("zlib: no progress at input offset " + Num(in_pos));
        }
        break;
      case Z_BUF_ERROR:
        // No progress possible: the output is not full (loop condition), so
        // the input ran out before the end of the stream.
        if (out_pos < out.size()) {
          return Status::Corrupt("zlib: stream truncated: " + Num(in.size()) + " input bytes decoded to " +
                                 Num(out_pos) + " of " + Num(out.size()) + " bytes without reaching its end");
        }
        break;
      case Z_NEED_DICT:
        return Status::Corrupt("zlib: stream needs a preset dictionary (input offset " + Num(in_pos) + ")");
      case Z_DATA_ERROR:
        return Status::Corrupt("zlib: invalid data near input offset " + Num(in_pos) + ": " +
                               (s.msg != nullptr ? s.msg : "data error"));
      case Z_MEM_ERROR:
        return Status::Error(ENOMEM, "zlib: out of memory while inflating");
      default:
        return Status::Corrupt("zlib: inflate failed with code " + Num(rc) +
                               " near input offset " + Num(in_pos));
    }
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> DeflateZlib(std::span<const uint8_t> in, int level) {
  z_stream s{};
  int rc = deflateInit(&s, level != 0 ? level : kZlibLevel);
  if (rc != Z_OK) {
    return Status::Error(rc == Z_MEM_ERROR ? ENOMEM : EIO, "zlib: deflateInit failed (" + Num(rc) + ")");
  }
  struct Ender {
    z_stream* s;
    ~Ender() { deflateEnd(s); }
  } ender{&s};
  std::vector<uint8_t> out(deflateBound(&s, static_cast<uLong>(in.size())));
  s.next_in = const_cast<Bytef*>(in.data());
  s.avail_in = static_cast<uInt>(in.size());
  s.next_out = out.data();
  s.avail_out = static_cast<uInt>(out.size());
  rc = deflate(&s, Z_FINISH);
  if (rc != Z_STREAM_END) return Status::IoError("zlib: deflate failed (" + Num(rc) + ")");
  out.resize(s.total_out);
  return out;
}

// ---------------------------------------------------------------- zstd

struct ZstdDctxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// One decompression context per thread, reused across calls.
ZSTD_DCtx* ThreadDctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, ZstdDctxDeleter> dctx;
  if (!dctx) {
    std::unique_ptr<ZSTD_DCtx, ZstdDctxDeleter> d(ZSTD_createDCtx());
    if (!d) return nullptr;
    if (ZSTD_isError(ZSTD_DCtx_setParameter(d.get(), ZSTD_d_windowLogMax, kZstdWindowLogMax))) return nullptr;
    dctx = std::move(d);
  }
  return dctx.get();
}

Status DecompressZstd(std::span<const uint8_t> in, std::span<uint8_t> out) {
  ZSTD_DCtx* dctx = ThreadDctx();
  if (dctx == nullptr) return Status::Error(ENOMEM, "zstd: cannot create a decompression context");
  // Drop whatever a previous (possibly failed) call left behind; parameters stay.
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);

  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  ZSTD_outBuffer ob{out.data(), out.size(), 0};
  while (ob.pos < ob.size) {
    const size_t prev_in = ib.pos;
    const size_t prev_out = ob.pos;
    const size_t r = ZSTD_decompressStream(dctx, &ob, &ib);
    if (ZSTD_isError(r)) {
      ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
      const ZSTD_ErrorCode code = ZSTD_getErrorCode(r);
      if (code == ZSTD_error_memory_allocation) return Status::Error(ENOMEM, "zstd: out of memory");
      std::string what = ZSTD_getErrorName(r);
      if (code == ZSTD_error_frameParameter_windowTooLarge) {
        what += " (limit 2^" + Num(kZstdWindowLogMax) + ")";
      }
      return Status::Corrupt("zstd: " + what + " near input offset " + Num(ib.pos));
    }
    if (r == 0) {  // frame fully decoded and flushed; trailing bytes are ignored
      ZeroFill(out, ob.pos);
      return Status::Ok();
    }
    if (ob.pos == ob.size) break;
    if (ib.pos == prev_in && ob.pos == prev_out) {
      return Status::Corrupt("zstd: frame truncated: " + Num(in.size()) + " input bytes decoded to " +
                             Num(ob.pos) + " of " + Num(out.size()) + " bytes without reaching its end");
    }
  }
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
  return Status::Ok();
}

// A compression context with the buffer it compresses into, kept between
// calls: creating a context per 128 KiB extent cost more than compressing
// it, and a fresh buffer of the bound's size was zeroed (and faulted in)
// for every range, most of it never used.
struct ZstdCompressor {
  struct Free {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  };
  std::unique_ptr<ZSTD_CCtx, Free> cctx;
  std::vector<uint8_t> scratch;
};

// Contexts are shared by the threads that compress rather than kept one per
// thread (about 0.9 MB each at level 3): a program has as many as it ever
// compressed with at once, whichever threads those were (an image build's
// importer, then its compressors; a mount's request threads).
class ZstdCompressors {
 public:
  std::unique_ptr<ZstdCompressor> Take() {
    {
      std::lock_guard l(mu_);
      if (!idle_.empty()) {
        std::unique_ptr<ZstdCompressor> z = std::move(idle_.back());
        idle_.pop_back();
        return z;
      }
    }
    auto z = std::make_unique<ZstdCompressor>();
    z->cctx.reset(ZSTD_createCCtx());
    return z->cctx ? std::move(z) : nullptr;
  }
  void Give(std::unique_ptr<ZstdCompressor> z) {
    std::lock_guard l(mu_);
    idle_.push_back(std::move(z));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<ZstdCompressor>> idle_;
};

ZstdCompressors& TheZstdCompressors() {
  static ZstdCompressors* all = new ZstdCompressors;  // never destroyed: threads may compress at exit
  return *all;
}

Result<std::vector<uint8_t>> CompressZstd(std::span<const uint8_t> in, int level, uint32_t sectorsize) {
  std::unique_ptr<ZstdCompressor> z = TheZstdCompressors().Take();
  if (!z) return Status::Error(ENOMEM, "zstd: cannot create a compression context");
  struct GiveBack {
    std::unique_ptr<ZstdCompressor>& z;
    ~GiveBack() { TheZstdCompressors().Give(std::move(z)); }
  } give_back{z};
  ZSTD_CCtx* cctx = z->cctx.get();
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  if (level == 0) level = kZstdLevel;
  bool set = !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level)) &&
             !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_windowLog, kZstdBtrfsWindowLog));
  if (set && level >= 2 && level <= kZstdSmallTablesUpTo) {
    set = !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_hashLog, kZstdSmallTableLog)) &&
          !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_chainLog, kZstdSmallTableLog));
#ifdef ZSTD_c_maxBlockSize
    // Best effort: a libzstd without the parameter compresses in 128 KiB blocks.
    if (set) (void)ZSTD_CCtx_setParameter(cctx, ZSTD_c_maxBlockSize, kZstdSmallBlock);
#endif
  }
  if (!set) return Status::IoError("zstd: cannot set compression parameters");
  std::vector<uint8_t>& scratch = z->scratch;
  if (scratch.size() < ZSTD_compressBound(in.size())) scratch.resize(ZSTD_compressBound(in.size()));
  const size_t n = ZSTD_compress2(cctx, scratch.data(), scratch.size(), in.data(), in.size());
  if (ZSTD_isError(n)) return Status::IoError(std::string("zstd: compression failed: ") + ZSTD_getErrorName(n));
  // Room for the caller's padding to whole sectors, so that it moves nothing.
  std::vector<uint8_t> out;
  out.reserve(sectorsize ? (n + sectorsize - 1) / sectorsize * sectorsize : n);
  out.assign(scratch.begin(), scratch.begin() + static_cast<ptrdiff_t>(n));
  return out;
}

// ---------------------------------------------------------------- lzo

bool LzoReady() {
  static const bool ready = (lzo_init() == LZO_E_OK);
  return ready;
}

Status CheckLzoSectorsize(uint32_t sectorsize) {
  if (sectorsize < 512 || sectorsize > 65536 || (sectorsize & (sectorsize - 1)) != 0) {
    return Status::Invalid("lzo: sector size " + Num(sectorsize) + " is not a power of two in [512, 65536]");
  }
  return Status::Ok();
}

std::string LzoErrorText(int rc) {
  switch (rc) {
    case LZO_E_INPUT_OVERRUN:
      return "block is truncated";
    case LZO_E_OUTPUT_OVERRUN:
      return "block decodes to more than one sector";
    case LZO_E_LOOKBEHIND_OVERRUN:
      return "block has a back-reference before its start";
    case LZO_E_EOF_NOT_FOUND:
      return "block has no end marker";
    case LZO_E_INPUT_NOT_CONSUMED:
      return "block has trailing bytes after its end marker";
    case LZO_E_ERROR:
      return "block is invalid";
    default:
      return "block failed to decode (lzo error " + Num(rc) + ")";
  }
}

Status DecompressLzo(std::span<const uint8_t> in, std::span<uint8_t> out, uint32_t sectorsize) {
  UB_RETURN_IF_ERROR(CheckLzoSectorsize(sectorsize));
  if (!LzoReady()) return Status::IoError("lzo: lzo_init failed");
  if (in.size() < kLzoLen) {
    return Status::Corrupt("lzo: input of " + Num(in.size()) + " bytes is too short for the total-length header");
  }
  const uint32_t total = format::LoadLe<uint32_t>(in.data());
  if (total < kLzoLen) return Status::Corrupt("lzo: total length " + Num(total) + " is less than " + Num(kLzoLen));
  if (total > in.size()) {
    return Status::Corrupt("lzo: total length " + Num(total) + " exceeds input size " + Num(in.size()));
  }

  std::vector<uint8_t> scratch;  // for a segment whose output does not fit in what is left of `out`
  size_t cur = kLzoLen;
  size_t out_pos = 0;
  while (cur < total && out_pos < out.size()) {
    const size_t hdr = cur;
    if (total - cur < kLzoLen) {
      return Status::Corrupt("lzo: segment header at offset " + Num(hdr) + " is cut off by the total length " +
                             Num(total));
    }
    const uint32_t seg_len = format::LoadLe<uint32_t>(in.data() + cur);
    cur += kLzoLen;
    if (seg_len == 0) return Status::Corrupt("lzo: segment length 0 at offset " + Num(hdr));
    if (seg_len > total - cur) {
      return Status::Corrupt("lzo: segment length " + Num(seg_len) + " at offset " + Num(hdr) +
                             " exceeds input (total length " + Num(total) + ")");
    }

    const size_t room = out.size() - out_pos;
    uint8_t* dst = out.data() + out_pos;
    if (room < sectorsize) {
      scratch.resize(sectorsize);
      dst = scratch.data();
    }
    lzo_uint dst_len = sectorsize;
    const int rc = lzo1x_decompress_safe(in.data() + cur, seg_len, dst, &dst_len, nullptr);
    if (rc != LZO_E_OK) {
      return Status::Corrupt("lzo: segment at offset " + Num(hdr) + " (length " + Num(seg_len) +
                             "): " + LzoErrorText(rc));
    }
    const size_t take = std::min<size_t>(dst_len, room);
    if (dst != out.data() + out_pos) std::memcpy(out.data() + out_pos, dst, take);
    out_pos += take;
    cur += seg_len;

    // A header never straddles a sector boundary: 1-3 bytes left before the
    // next boundary are padding.
    const size_t sector_left = sectorsize - (cur % sectorsize);
    if (sector_left < kLzoLen) cur += sector_left;
  }
  ZeroFill(out, out_pos);
  return Status::Ok();
}

Result<std::vector<uint8_t>> CompressLzo(std::span<const uint8_t> in, uint32_t sectorsize) {
  UB_RETURN_IF_ERROR(CheckLzoSectorsize(sectorsize));
  if (!LzoReady()) return Status::IoError("lzo: lzo_init failed");
  std::vector<lzo_align_t> wrkmem((LZO1X_1_MEM_COMPRESS + sizeof(lzo_align_t) - 1) / sizeof(lzo_align_t));
  // lzo1x worst case for one sector of input.
  std::vector<uint8_t> seg(sectorsize + sectorsize / 16 + 64 + 3);
  std::vector<uint8_t> out(kLzoLen);
  for (size_t off = 0; off < in.size(); off += sectorsize) {
    const size_t len = std::min<size_t>(sectorsize, in.size() - off);
    lzo_uint seg_len = seg.size();
    const int rc = lzo1x_1_compress(in.data() + off, len, seg.data(), &seg_len, wrkmem.data());
    if (rc != LZO_E_OK) return Status::IoError("lzo: compression failed (lzo error " + Num(rc) + ")");
    const size_t at = out.size();  // padding below keeps this header inside one sector
    out.resize(at + kLzoLen + seg_len);
    format::StoreLe<uint32_t>(out.data() + at, static_cast<uint32_t>(seg_len));
    std::memcpy(out.data() + at + kLzoLen, seg.data(), seg_len);
    const size_t sector_left = sectorsize - (out.size() % sectorsize);
    if (sector_left < kLzoLen) out.resize(out.size() + sector_left, 0);
  }
  format::StoreLe<uint32_t>(out.data(), static_cast<uint32_t>(out.size()));
  return out;
}

}  // namespace

Status Decompress(uint8_t type, std::span<const uint8_t> in, std::span<uint8_t> out, uint32_t sectorsize) {
  if (type != kTypeZlib && type != kTypeLzo && type != kTypeZstd) {
    return Status::Unsupported("compression type " + Num(type));
  }
  if (out.empty()) return Status::Ok();
  switch (type) {
    case kTypeZlib:
      return InflateZlib(in, out);
    case kTypeLzo:
      return DecompressLzo(in, out, sectorsize);
    default:
      return DecompressZstd(in, out);
  }
}

Result<std::vector<uint8_t>> Compress(uint8_t type, std::span<const uint8_t> in, uint32_t sectorsize, int level) {
  if (type != kTypeZlib && type != kTypeLzo && type != kTypeZstd) {
    return Status::Unsupported("compression type " + Num(type));
  }
  if (in.size() > kMaxCompressInput) {
    return Status::Invalid("compress: input of " + Num(in.size()) + " bytes is larger than an extent can be");
  }
  switch (type) {
    case kTypeZlib:
      return DeflateZlib(in, level);
    case kTypeLzo:
      return CompressLzo(in, sectorsize);
    default:
      return CompressZstd(in, level, sectorsize);
  }
}

}  // namespace ubtrfs::fs
