#include "check/report.h"

#include <algorithm>
#include <cstdio>

#include "format/ondisk.h"

namespace ubtrfs::check {

using namespace ubtrfs::format;

std::string TreeLabel(uint64_t id) {
  switch (id) {
    case kRootTreeObjectid: return "root tree";
    case kExtentTreeObjectid: return "extent tree";
    case kChunkTreeObjectid: return "chunk tree";
    case kDevTreeObjectid: return "dev tree";
    case kFsTreeObjectid: return "fs tree 5";
    case kCsumTreeObjectid: return "csum tree";
    case kQuotaTreeObjectid: return "quota tree";
    case kUuidTreeObjectid: return "uuid tree";
    case kFreeSpaceTreeObjectid: return "free space tree";
    case kBlockGroupTreeObjectid: return "block group tree";
    case kRaidStripeTreeObjectid: return "raid stripe tree";
    case kTreeLogObjectid: return "log tree";
    case kTreeRelocObjectid: return "reloc tree";
    case kDataRelocTreeObjectid: return "data reloc tree";
    default: break;
  }
  if (id >= kFirstFreeObjectid && id <= kLastFreeObjectid) return "subvolume " + std::to_string(id);
  return "tree " + std::to_string(id);
}

std::string Esc(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c >= 0x7f || c == '\\') {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

void CsumIndex::Add(uint64_t start, uint64_t len) {
  if (len == 0) return;
  total_ += len;
  uint64_t end = start + len < start ? UINT64_MAX : start + len;
  auto it = runs_.upper_bound(start);
  if (it != runs_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= start) {
      start = prev->first;
      end = std::max(end, prev->second);
      it = runs_.erase(prev);
    }
  }
  while (it != runs_.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = runs_.erase(it);
  }
  runs_[start] = end;
}

uint64_t CsumIndex::Covered(uint64_t start, uint64_t len) const {
  if (len == 0) return 0;
  const uint64_t end = start + len < start ? UINT64_MAX : start + len;
  auto it = runs_.upper_bound(start);
  if (it != runs_.begin()) {
    auto prev = std::prev(it);
    if (prev->second > start) it = prev;
  }
  uint64_t sum = 0;
  for (; it != runs_.end() && it->first < end; ++it) {
    sum += std::min(it->second, end) - std::max(it->first, start);
  }
  return sum;
}

}  // namespace ubtrfs::check
