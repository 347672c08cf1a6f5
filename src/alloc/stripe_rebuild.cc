#include "alloc/stripe_rebuild.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "format/ondisk.h"

namespace ubtrfs::alloc {

using namespace ubtrfs::format;

namespace {

// ISA-L's parity wants 32-byte aligned buffers.
struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<uint8_t[], AlignedFree>;
AlignedBuf Aligned(size_t len) {
  return AlignedBuf(static_cast<uint8_t*>(std::aligned_alloc(64, (len + 63) / 64 * 64)));
}

std::string Where(const ChunkInfo& c, size_t index) {
  return "rebuilding stripe " + std::to_string(index) + " of the " + ProfileName(c.type) + " chunk at " +
         std::to_string(c.logical);
}

}  // namespace

Status ReadFromAnyCopy(ChunkIo& io, uint64_t logical, std::span<uint8_t> out) {
  Status last = Status::IoError("no copy of " + std::to_string(logical));
  for (int m = 0; m < io.NumMirrors(logical); ++m) {
    last = io.Read(logical, out, m);
    if (last.ok()) return last;
  }
  return last;
}

std::string WhyNotRebuildable(const ChunkInfo& c, const io::DeviceSet& devs) {
  const size_t n = c.stripes.size();
  std::vector<bool> lost(n);
  size_t nlost = 0;
  for (size_t i = 0; i < n; ++i) {
    lost[i] = !devs.Has(c.stripes[i].devid);
    nlost += lost[i];
  }
  if (nlost == 0) return "";
  const uint64_t profile = c.profile();
  const std::string what = "the " + ProfileName(c.type) + " chunk at logical " + std::to_string(c.logical);
  switch (profile) {
    case kBlockGroupRaid1:
    case kBlockGroupRaid1c3:
    case kBlockGroupRaid1c4:
      if (nlost < n) return "";
      return what + " has every copy on missing devices";
    case kBlockGroupRaid10:
      for (size_t i = 0; i + 1 < n; i += 2) {
        if (lost[i] && lost[i + 1]) return what + " has both copies of stripes " + std::to_string(i) + " and " +
                                            std::to_string(i + 1) + " on missing devices";
      }
      return "";
    case kBlockGroupRaid5:
    case kBlockGroupRaid6:
      if (nlost <= c.parity_stripes()) return "";
      return what + " has " + std::to_string(nlost) + " stripes on missing devices; its parity rebuilds " +
             std::to_string(c.parity_stripes());
    default:
      return what + " keeps one copy of its data, and it was on a missing device";
  }
}

Status RebuildStripeRange(ChunkIo& io, const ChunkInfo& c, size_t index, uint64_t offset, std::span<uint8_t> out) {
  const uint64_t profile = c.profile();
  const uint64_t n = c.stripes.size(), sl = c.stripe_len;
  if (index >= n || offset + out.size() > c.stripe_size || sl == 0) {
    return Status::Invalid(Where(c, index) + ": [" + std::to_string(offset) + ", +" + std::to_string(out.size()) +
                           ") is not in the stripe");
  }
  if (std::string why = WhyNotRebuildable(c, io.devices()); !why.empty()) {
    return Status::IoError(Where(c, index) + ": " + why);
  }
  const bool parity = profile == kBlockGroupRaid5 || profile == kBlockGroupRaid6;
  const bool striped = parity || profile == kBlockGroupRaid0 || profile == kBlockGroupRaid10;
  if (!striped) return ReadFromAnyCopy(io, c.logical + offset, out).WithContext(Where(c, index));

  const uint64_t k = parity ? c.data_stripes() : profile == kBlockGroupRaid10 ? n / c.sub_stripes : n;
  for (uint64_t done = 0; done < out.size();) {
    const uint64_t at = offset + done, row = at / sl, in = at % sl;
    const uint64_t len = std::min<uint64_t>(sl - in, out.size() - done);
    std::span<uint8_t> dst = out.subspan(done, len);
    done += len;
    if (!parity) {
      // RAID0: stripe i holds element row * n + i; RAID10: pair i / 2 holds
      // element row * (n / 2) + i / 2.
      const uint64_t col = profile == kBlockGroupRaid10 ? index / c.sub_stripes : index;
      UB_RETURN_IF_ERROR(ReadFromAnyCopy(io, c.logical + (row * k + col) * sl + in, dst).WithContext(Where(c, index)));
      continue;
    }
    const uint64_t s = c.RowElement(row, index);
    if (s < k) {
      UB_RETURN_IF_ERROR(ReadFromAnyCopy(io, c.logical + (row * k + s) * sl + in, dst).WithContext(Where(c, index)));
      continue;
    }
    std::vector<AlignedBuf> data;
    std::vector<std::span<const uint8_t>> spans;
    for (uint64_t d = 0; d < k; ++d) {
      data.push_back(Aligned(len));
      if (!data.back()) return Status::Error(ENOMEM, Where(c, index));
      std::span<uint8_t> buf(data.back().get(), len);
      UB_RETURN_IF_ERROR(ReadFromAnyCopy(io, c.logical + (row * k + d) * sl + in, buf).WithContext(Where(c, index)));
      spans.emplace_back(buf);
    }
    AlignedBuf p = Aligned(len), q = Aligned(len);
    if (!p || !q) return Status::Error(ENOMEM, Where(c, index));
    const bool want_q = s == k + 1;
    FastParity(spans, std::span(p.get(), len), c.parity_stripes() == 2 ? std::span(q.get(), len) : std::span<uint8_t>());
    std::copy_n(want_q ? q.get() : p.get(), len, dst.begin());
  }
  return Status::Ok();
}

}  // namespace ubtrfs::alloc
