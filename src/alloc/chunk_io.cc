#include "alloc/chunk_io.h"

#include <isa-l/raid.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <array>
#include <map>
#include <set>
#include <vector>

#include "format/ondisk.h"

namespace ubtrfs::alloc {

using namespace ubtrfs::format;

namespace {

struct GfTables {
  std::array<uint8_t, 512> exp{};
  std::array<int, 256> log{};
  GfTables() {
    int x = 1;
    for (int i = 0; i < 255; ++i) {
      exp[i] = static_cast<uint8_t>(x);
      log[x] = i;
      x <<= 1;
      if (x & 0x100) x ^= 0x11d;
    }
    for (int i = 255; i < 512; ++i) exp[i] = exp[i - 255];
    log[0] = -1;
  }
};

const GfTables& Gf() {
  static const GfTables t;
  return t;
}

bool IsParity(uint64_t profile) { return profile == kBlockGroupRaid5 || profile == kBlockGroupRaid6; }

// A row's elements (data, then P and Q), 64-byte aligned for ISA-L, kept per
// thread: a fresh buffer per row write is above malloc's mmap threshold,
// and with the huge-page heap each one faulted in and zeroed a 2 MiB page
// (5,000 small files into a RAID6 array took 6 s instead of 0.16 s).
uint8_t* RowBuffer(size_t bytes) {
  thread_local std::unique_ptr<uint8_t, decltype(&std::free)> buf(nullptr, &std::free);
  thread_local size_t cap = 0;
  if (cap < bytes) {
    buf.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
    cap = buf ? bytes : 0;
  }
  return buf.get();
}

}  // namespace

uint8_t GfMul(uint8_t a, uint8_t b) {
  if (a == 0 || b == 0) return 0;
  const GfTables& t = Gf();
  return t.exp[t.log[a] + t.log[b]];
}

uint8_t GfPow2(int e) { return Gf().exp[((e % 255) + 255) % 255]; }

uint8_t GfInv(uint8_t a) {
  if (a == 0) return 0;
  const GfTables& t = Gf();
  return t.exp[255 - t.log[a]];
}

void ComputeParity(std::span<const std::span<const uint8_t>> data, std::span<uint8_t> p, std::span<uint8_t> q) {
  std::fill(p.begin(), p.end(), 0);
  std::fill(q.begin(), q.end(), 0);
  for (size_t i = 0; i < data.size(); ++i) {
    const uint8_t g = GfPow2(static_cast<int>(i));
    for (size_t b = 0; b < p.size(); ++b) {
      p[b] ^= data[i][b];
      if (!q.empty()) q[b] ^= GfMul(g, data[i][b]);
    }
  }
}

void FastParity(std::span<const std::span<const uint8_t>> data, std::span<uint8_t> p, std::span<uint8_t> q) {
  std::vector<void*> v;
  for (const auto& d : data) v.push_back(const_cast<uint8_t*>(d.data()));
  v.push_back(p.data());
  const int len = static_cast<int>(p.size());
  int r;
  if (q.empty()) {
    r = data.size() >= 1 ? xor_gen(static_cast<int>(v.size()), len, v.data()) : 1;
  } else {
    v.push_back(q.data());
    r = data.size() >= 2 ? pq_gen(static_cast<int>(v.size()), len, v.data()) : 1;
  }
  if (r != 0) ComputeParity(data, p, q);
}

Result<ChunkIo::RowParity> ChunkIo::CheckRowParity(const ChunkInfo& c, uint64_t row, bool repair) {
  if (!IsParity(c.profile())) return Status::Invalid("parity of a " + ProfileName(c.type) + " chunk");
  const uint32_t k = c.data_stripes(), np = c.parity_stripes();
  const uint32_t n = static_cast<uint32_t>(c.stripes.size());
  const uint64_t sl = c.stripe_len;
  if (k == 0 || sl == 0 || sl % 32 || row >= c.length / (sl * k)) {
    return Status::Invalid("row " + std::to_string(row) + " of chunk " + std::to_string(c.logical));
  }
  RowParity out;
  std::lock_guard row_lock(RowLock(c, row));
  auto loc = [&](uint32_t s) -> const StripeLoc& { return c.stripes[(s + row) % n]; };
  for (uint32_t s = 0; s < k + np; ++s) {
    if (!devs_->Has(loc(s).devid)) {
      out.complete = false;
      return out;
    }
  }
  // The row as stored (data, P, Q), then P and Q as the data gives them.
  const size_t total = static_cast<size_t>(sl) * (k + 2 * np);
  uint8_t* const mem = RowBuffer(total);
  if (!mem) return Status::Error(ENOMEM, "parity check: " + std::to_string(total) + " bytes");
  auto elem = [&](uint32_t i) { return std::span<uint8_t>(mem + i * sl, sl); };
  const std::string where = ProfileName(c.type) + " chunk " + std::to_string(c.logical) + " row " + std::to_string(row);
  for (uint32_t s = 0; s < k + np; ++s) {
    UB_RETURN_IF_ERROR(devs_->ReadAt(loc(s).devid, loc(s).physical + row * sl, elem(s)).WithContext(where));
  }
  std::vector<std::span<const uint8_t>> data;
  for (uint32_t s = 0; s < k; ++s) data.push_back(elem(s));
  const std::span<uint8_t> p = elem(k + np), q = np == 2 ? elem(k + np + 1) : std::span<uint8_t>();
  FastParity(data, p, q);
  out.p_bad = std::memcmp(p.data(), elem(k).data(), sl) != 0;
  out.q_bad = np == 2 && std::memcmp(q.data(), elem(k + 1).data(), sl) != 0;
  if (repair && out.p_bad) {
    UB_RETURN_IF_ERROR(devs_->WriteAt(loc(k).devid, loc(k).physical + row * sl, p).WithContext(where + ": P"));
  }
  if (repair && out.q_bad) {
    UB_RETURN_IF_ERROR(devs_->WriteAt(loc(k + 1).devid, loc(k + 1).physical + row * sl, q).WithContext(where + ": Q"));
  }
  return out;
}

int ChunkIo::NumMirrors(uint64_t logical) const {
  const ChunkInfo* c = map_->Find(logical);
  if (c == nullptr) return 0;
  switch (c->profile()) {
    case kBlockGroupRaid5: return 2;
    case kBlockGroupRaid6: return 3 + static_cast<int>(c->data_stripes()) - 1;
    default: return static_cast<int>(c->mirrors());
  }
}

bool ChunkIo::MirrorOnMissingDevice(uint64_t logical, uint64_t len, int mirror) const {
  const ChunkInfo* c = map_->Find(logical);
  if (c == nullptr || IsParity(c->profile())) return false;
  auto copies = map_->Map(logical, len);
  if (!copies.ok() || mirror < 0 || static_cast<size_t>(mirror) >= copies->size()) return false;
  for (const Piece& p : (*copies)[mirror]) {
    if (!devs_->Has(p.devid)) return true;
  }
  return false;
}

Status ChunkIo::Read(uint64_t logical, std::span<uint8_t> out, int mirror) {
  const ChunkInfo* c = map_->Find(logical);
  if (c == nullptr) return Status::Corrupt("logical address " + std::to_string(logical) + " is not in any chunk");
  if (IsParity(c->profile())) return ReadParity(*c, logical, out, mirror);
  UB_ASSIGN_OR_RETURN(auto copies, map_->Map(logical, out.size()));
  if (mirror < 0 || static_cast<size_t>(mirror) >= copies.size()) {
    return Status::Invalid("mirror " + std::to_string(mirror) + " of " + std::to_string(copies.size()));
  }
  for (const Piece& p : copies[mirror]) {
    UB_RETURN_IF_ERROR(devs_->ReadAt(p.devid, p.physical, out.subspan(p.buf_offset, p.length)));
  }
  return Status::Ok();
}

io::MappedBytes ChunkIo::MapForRead(uint64_t logical, size_t len) {
  const ChunkInfo* c = map_->Find(logical);
  if (c == nullptr || IsParity(c->profile())) return {};
  auto copies = map_->Map(logical, len);
  if (!copies.ok() || copies->empty() || (*copies)[0].size() != 1) return {};
  const Piece& p = (*copies)[0][0];
  io::BlockDevice* d = devs_->Get(p.devid);
  return d == nullptr ? io::MappedBytes() : d->MapForRead(p.physical, len);
}

Status ChunkIo::ReadParity(const ChunkInfo& c, uint64_t logical, std::span<uint8_t> out, int mirror,
                           uint64_t locked_row) {
  const uint64_t off = logical - c.logical;
  if (out.size() > c.length - off) {
    return Status::Corrupt("range [" + std::to_string(logical) + ", +" + std::to_string(out.size()) +
                           ") crosses the end of chunk " + std::to_string(c.logical));
  }
  const bool raid6 = c.profile() == kBlockGroupRaid6;
  const uint32_t k = c.data_stripes();
  const uint32_t n = static_cast<uint32_t>(c.stripes.size());
  const uint64_t sl = c.stripe_len;
  const uint32_t kP = k, kQ = k + 1;
  std::vector<uint8_t> scratch;
  for (uint64_t done = 0; done < out.size();) {
    const uint64_t at = off + done;
    const uint64_t elem = at / sl, in = at % sl;
    const uint64_t row = elem / k;
    const uint32_t t = static_cast<uint32_t>(elem % k);
    const uint64_t len = std::min<uint64_t>(sl - in, out.size() - done);
    std::span<uint8_t> dst = out.subspan(done, len);
    // Stripe s of the row (data 0..k-1, then P, then Q) sits on stripe
    // (s + row) % n of the chunk: parity rotates one device per row.
    auto loc = [&](uint32_t s) -> const StripeLoc& { return c.stripes[(s + row) % n]; };
    auto read = [&](uint32_t s, std::span<uint8_t> buf) {
      const StripeLoc& l = loc(s);
      return devs_->ReadAt(l.devid, l.physical + row * sl + in, buf);
    };
    done += len;
    std::set<uint32_t> bad;
    if (mirror == 0) {
      if (devs_->Has(loc(t).devid)) {
        Status st = read(t, dst);
        if (st.ok()) continue;
      }
      bad.insert(t);
    } else if (mirror == 1) {
      bad.insert(t);
    } else if (raid6 && mirror == 2) {
      bad = {t, kP};
    } else if (raid6 && mirror >= 3 && static_cast<uint32_t>(mirror - 3) < k - 1) {
      uint32_t j = static_cast<uint32_t>(mirror - 3);
      if (j >= t) ++j;
      bad = {t, j};
    } else {
      return Status::Invalid("mirror " + std::to_string(mirror) + " of a " + ProfileName(c.type) + " chunk");
    }
    for (uint32_t s = 0; s < k + c.parity_stripes(); ++s) {
      if (!devs_->Has(loc(s).devid)) bad.insert(s);
    }
    // A rebuild reads the whole row: not while a writer is changing it.
    std::unique_lock<std::mutex> row_lock;
    if (row != locked_row) row_lock = std::unique_lock(RowLock(c, row));
    const std::string where = "rebuilding logical " + std::to_string(logical + done - len) + " (" +
                              ProfileName(c.type) + " row " + std::to_string(row) + ")";
    std::vector<uint32_t> bad_data;
    for (uint32_t s : bad) {
      if (s < k) bad_data.push_back(s);
    }
    const bool p_ok = !bad.count(kP), q_ok = raid6 && !bad.count(kQ);
    const size_t avail = (p_ok ? 1 : 0) + (q_ok ? 1 : 0);
    if (bad_data.size() > avail || bad_data.size() > 2) {
      return Status::IoError(where + ": " + std::to_string(bad.size()) + " of its stripes are unavailable");
    }
    // The good data stripes, and the sums of P and Q over them.
    std::vector<uint8_t> pacc(len, 0), qacc(len, 0);
    scratch.resize(len);
    for (uint32_t s = 0; s < k; ++s) {
      if (bad.count(s)) continue;
      UB_RETURN_IF_ERROR(read(s, scratch).WithContext(where));
      const uint8_t g = GfPow2(static_cast<int>(s));
      for (uint64_t b = 0; b < len; ++b) {
        pacc[b] ^= scratch[b];
        if (q_ok) qacc[b] ^= GfMul(g, scratch[b]);
      }
    }
    std::vector<uint8_t> pbuf, qbuf;
    if (p_ok) {
      pbuf.resize(len);
      UB_RETURN_IF_ERROR(read(kP, pbuf).WithContext(where + ": P"));
      for (uint64_t b = 0; b < len; ++b) pbuf[b] ^= pacc[b];  // = xor of the bad data stripes
    }
    if (q_ok && (bad_data.size() == 2 || !p_ok)) {
      qbuf.resize(len);
      UB_RETURN_IF_ERROR(read(kQ, qbuf).WithContext(where + ": Q"));
      for (uint64_t b = 0; b < len; ++b) qbuf[b] ^= qacc[b];  // = sum of g^i D_i over the bad ones
    }
    if (bad_data.size() == 1 && p_ok) {
      std::copy(pbuf.begin(), pbuf.end(), dst.begin());
    } else if (bad_data.size() == 1) {
      const uint8_t inv = GfInv(GfPow2(static_cast<int>(t)));
      for (uint64_t b = 0; b < len; ++b) dst[b] = GfMul(qbuf[b], inv);
    } else {
      // D_t ^ D_j = P', g^t D_t ^ g^j D_j = Q'  =>  D_t = (g^j P' ^ Q') / (g^t ^ g^j)
      const uint32_t j = bad_data[0] == t ? bad_data[1] : bad_data[0];
      const uint8_t gt = GfPow2(static_cast<int>(t)), gj = GfPow2(static_cast<int>(j));
      const uint8_t inv = GfInv(gt ^ gj);
      for (uint64_t b = 0; b < len; ++b) dst[b] = GfMul(GfMul(gj, pbuf[b]) ^ qbuf[b], inv);
    }
  }
  return Status::Ok();
}

bool ChunkIo::IsParityChunk(uint64_t logical) const {
  const ChunkInfo* c = map_->Find(logical);
  return c != nullptr && IsParity(c->profile());
}

Status ChunkIo::WriteRow(const ChunkInfo& c, uint64_t row, std::span<const RowPiece> pieces) {
  const uint32_t k = c.data_stripes(), np = c.parity_stripes();
  const uint32_t n = static_cast<uint32_t>(c.stripes.size());
  const uint64_t sl = c.stripe_len;
  const std::string where = "writing " + ProfileName(c.type) + " chunk " + std::to_string(c.logical) + " row " +
                            std::to_string(row);
  if (k == 0 || sl == 0 || sl % 32 || n != k + np) return Status::Corrupt(where + ": bad stripe layout");
  auto loc = [&](uint32_t s) -> const StripeLoc& { return c.stripes[(s + row) % n]; };
  uint32_t missing = 0;
  for (uint32_t s = 0; s < n; ++s) missing += devs_->Has(loc(s).devid) ? 0 : 1;
  if (missing > np) {
    return Status::IoError(where + ": " + std::to_string(missing) + " of its " + std::to_string(n) +
                           " stripes are on missing devices");
  }
  // P and Q are byte-wise: only the columns the pieces touch (the same
  // offsets in every element) change. [lo, hi) is their hull, 64-byte
  // aligned for ISA-L; a 4 KiB block reads 4 KiB of each other element and
  // writes 4 KiB of P and Q, not whole 64 KiB elements. `covered`: bytes of
  // each element the pieces hold (they do not overlap).
  uint64_t lo = sl, hi = 0;
  std::vector<uint64_t> covered(k, 0);
  for (const RowPiece& p : pieces) {
    for (uint64_t at = p.at, end = p.at + p.data.size(); at < end;) {
      const uint64_t e = at / sl, stop = std::min(end, (e + 1) * sl);
      lo = std::min(lo, at - e * sl);
      hi = std::max(hi, stop - e * sl);
      covered[e] += stop - at;
      at = stop;
    }
  }
  if (lo >= hi) return Status::Ok();
  lo = lo / 64 * 64;
  hi = std::min<uint64_t>(sl, (hi + 63) / 64 * 64);
  const uint64_t width = hi - lo;
  const uint64_t row_logical = c.logical + row * k * sl;
  std::vector<RowSums> sums;
  UB_RETURN_IF_ERROR(LookupRowSums(c, row, lo, hi, covered, &sums).WithContext(where));
  // The row's data elements, then P and Q.
  const size_t total = static_cast<size_t>(sl) * (k + np);
  uint8_t* const mem = RowBuffer(total);
  if (!mem) return Status::Error(ENOMEM, where + ": " + std::to_string(total) + " bytes");
  auto elem = [&](uint32_t i) { return std::span<uint8_t>(mem + i * sl, sl); };
  std::lock_guard row_lock(RowLock(c, row));
  for (uint32_t s = 0; s < k; ++s) {
    if (covered[s] >= width) continue;
    UB_RETURN_IF_ERROR(
        ReadParity(c, row_logical + s * sl + lo, elem(s).subspan(lo, width), 0, row).WithContext(where));
  }
  UB_RETURN_IF_ERROR(VerifyRow(c, row, lo, sums, mem).WithContext(where));
  for (const RowPiece& p : pieces) std::memcpy(mem + p.at, p.data.data(), p.data.size());
  std::vector<std::span<const uint8_t>> data;
  for (uint32_t s = 0; s < k; ++s) data.push_back(elem(s).subspan(lo, width));
  FastParity(data, elem(k).subspan(lo, width), np == 2 ? elem(k + 1).subspan(lo, width) : std::span<uint8_t>());
  // The new data where it lies, then the parity: a stripe on a missing
  // device is left out (the parity written holds it).
  for (const RowPiece& p : pieces) {
    for (uint64_t at = p.at, end = p.at + p.data.size(); at < end;) {
      const uint32_t e = static_cast<uint32_t>(at / sl);
      const uint64_t stop = std::min(end, (e + 1) * sl);
      if (devs_->Has(loc(e).devid)) {
        UB_RETURN_IF_ERROR(devs_->WriteAt(loc(e).devid, loc(e).physical + row * sl + at % sl,
                                          std::span<const uint8_t>(mem + at, stop - at))
                               .WithContext(where));
      }
      at = stop;
    }
  }
  for (uint32_t s = k; s < k + np; ++s) {
    if (!devs_->Has(loc(s).devid)) continue;
    UB_RETURN_IF_ERROR(devs_->WriteAt(loc(s).devid, loc(s).physical + row * sl + lo, elem(s).subspan(lo, width))
                           .WithContext(where + (s == k ? ": P" : ": Q")));
  }
  return Status::Ok();
}

Status ChunkIo::LookupRowSums(const ChunkInfo& c, uint64_t row, uint64_t lo, uint64_t hi,
                              std::span<const uint64_t> covered, std::vector<RowSums>* out) {
  out->clear();
  // Data chunks only: tree blocks carry their own checksums, which a
  // column of a block cannot be checked against (the kernel checks data only).
  if (!sums_.lookup || sums_.sectorsize == 0 || !(c.type & kBlockGroupData) || (c.type & kBlockGroupMetadata)) {
    return Status::Ok();
  }
  const uint64_t ss = sums_.sectorsize, sl = c.stripe_len, k = c.data_stripes();
  const uint64_t first = (lo + ss - 1) / ss * ss, end = hi / ss * ss;
  if (first >= end) return Status::Ok();
  out->resize(k);
  for (uint32_t s = 0; s < k; ++s) {
    if (covered[s] >= hi - lo) continue;  // not read: the write holds all of it
    RowSums& r = (*out)[s];
    UB_RETURN_IF_ERROR(sums_.lookup(c.logical + (row * k + s) * sl + first, (end - first) / ss, &r.sums, &r.present)
                           .WithContext("data checksums of the rest of the row"));
  }
  return Status::Ok();
}

Status ChunkIo::VerifyRow(const ChunkInfo& c, uint64_t row, uint64_t lo, std::span<const RowSums> sums,
                          uint8_t* mem) {
  if (sums.empty()) return Status::Ok();
  const uint64_t ss = sums_.sectorsize, sl = c.stripe_len, k = c.data_stripes();
  const uint64_t first = (lo + ss - 1) / ss * ss;
  const uint32_t n = static_cast<uint32_t>(c.stripes.size());
  std::vector<uint8_t> rebuilt(ss);
  for (uint32_t s = 0; s < k; ++s) {
    const RowSums& r = sums[s];
    for (size_t i = 0; i < r.present.size(); ++i) {
      if (!r.present[i]) continue;
      const uint64_t in = first + i * ss;  // offset in the element
      std::span<uint8_t> sector(mem + s * sl + in, ss);
      const uint8_t* sum = r.sums.data() + i * sums_.sum_size;
      if (sums_.matches(sector, sum)) continue;
      const uint64_t logical = c.logical + (row * k + s) * sl + in;
      bool fixed = false;
      for (int m = 1; m < NumMirrors(logical) && !fixed; ++m) {
        if (!ReadParity(c, logical, rebuilt, m, row).ok() || !sums_.matches(rebuilt, sum)) continue;
        std::memcpy(sector.data(), rebuilt.data(), ss);
        const StripeLoc& at = c.stripes[(s + row) % n];
        if (devs_->Has(at.devid)) {
          UB_RETURN_IF_ERROR(devs_->WriteAt(at.devid, at.physical + row * sl + in, sector)
                                 .WithContext("rewriting the damaged sector at logical " + std::to_string(logical)));
        }
        fixed = true;
      }
      (fixed ? rmw_repaired_ : rmw_unrepaired_).fetch_add(1, std::memory_order_relaxed);
    }
  }
  return Status::Ok();
}

Status ChunkIo::WriteParityRanges(const ChunkInfo& c, std::span<const Range> ranges) {
  const uint64_t sl = c.stripe_len, k = c.data_stripes();
  if (k == 0 || sl == 0) return Status::Corrupt("chunk " + std::to_string(c.logical) + ": bad stripe layout");
  const uint64_t row_bytes = sl * k;
  std::map<uint64_t, std::vector<RowPiece>> rows;
  for (const Range& r : ranges) {
    const uint64_t off = r.logical - c.logical;
    if (r.logical < c.logical || r.data.size() > c.length - off) {
      return Status::Corrupt("range [" + std::to_string(r.logical) + ", +" + std::to_string(r.data.size()) +
                             ") crosses the end of chunk " + std::to_string(c.logical));
    }
    for (uint64_t done = 0; done < r.data.size();) {
      const uint64_t at = off + done, row = at / row_bytes, in = at % row_bytes;
      const uint64_t len = std::min<uint64_t>(row_bytes - in, r.data.size() - done);
      rows[row].push_back({in, r.data.subspan(done, len)});
      done += len;
    }
  }
  for (const auto& [row, pieces] : rows) UB_RETURN_IF_ERROR(WriteRow(c, row, pieces));
  return Status::Ok();
}

Status ChunkIo::WriteBatch(std::span<const Range> ranges) {
  // Runs of ranges in one parity chunk go row by row; the rest one by one.
  for (size_t i = 0; i < ranges.size();) {
    const ChunkInfo* c = map_->Find(ranges[i].logical);
    if (c == nullptr || !IsParity(c->profile())) {
      UB_RETURN_IF_ERROR(Write(ranges[i].logical, ranges[i].data));
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < ranges.size() && map_->Find(ranges[j].logical) == c) ++j;
    UB_RETURN_IF_ERROR(WriteParityRanges(*c, ranges.subspan(i, j - i)));
    i = j;
  }
  return Status::Ok();
}

Status ChunkIo::Write(uint64_t logical, std::span<const uint8_t> data) {
  const ChunkInfo* c = map_->Find(logical);
  if (c == nullptr) return Status::Corrupt("logical address " + std::to_string(logical) + " is not in any chunk");
  if (IsParity(c->profile())) {
    const Range r{logical, data};
    return WriteParityRanges(*c, std::span(&r, 1));
  }
  UB_ASSIGN_OR_RETURN(auto copies, map_->Map(logical, data.size()));
  size_t written = 0;
  for (const auto& copy : copies) {
    bool whole = true;
    for (const Piece& p : copy) {
      if (!devs_->Has(p.devid)) {
        whole = false;
        continue;
      }
      UB_RETURN_IF_ERROR(devs_->WriteAt(p.devid, p.physical, data.subspan(p.buf_offset, p.length)));
    }
    if (whole) ++written;
  }
  if (written == 0) {
    return Status::IoError("writing logical " + std::to_string(logical) + ": no copy lies wholly on present devices");
  }
  return Status::Ok();
}

Status ChunkIo::WriteMirror(uint64_t logical, std::span<const uint8_t> data, int mirror) {
  const ChunkInfo* c = map_->Find(logical);
  if (c == nullptr) return Status::Corrupt("logical address " + std::to_string(logical) + " is not in any chunk");
  if (IsParity(c->profile())) {
    return Status::Invalid("writing one mirror of a " + ProfileName(c->type) + " chunk: its copies are parity");
  }
  UB_ASSIGN_OR_RETURN(auto copies, map_->Map(logical, data.size()));
  if (mirror < 0 || static_cast<size_t>(mirror) >= copies.size()) {
    return Status::Invalid("mirror " + std::to_string(mirror) + " of " + std::to_string(copies.size()));
  }
  for (const Piece& p : copies[mirror]) {
    UB_RETURN_IF_ERROR(devs_->WriteAt(p.devid, p.physical, data.subspan(p.buf_offset, p.length)));
  }
  return Status::Ok();
}

}  // namespace ubtrfs::alloc
