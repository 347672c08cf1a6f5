#include "tree/tree_block.h"

#include <endian.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "format/checksum.h"
#include "format/superblock.h"

namespace ubtrfs::tree {

using namespace ubtrfs::format;

Status VerifyTreeBlock(std::span<const uint8_t> bytes, const TreeParams& params, const BlockCheck& check) {
  const std::string where = "tree block " + std::to_string(check.bytenr);
  if (bytes.size() != params.nodesize || bytes.size() < sizeof(Header)) {
    return Status::Corrupt(where + ": size " + std::to_string(bytes.size()) + " is not the node size");
  }
  const auto& h = *reinterpret_cast<const Header*>(bytes.data());
  if (params.verify_csum && !VerifyCsum(params.csum_type, bytes.subspan(kCsumSize), h.csum)) {
    return Status::Corrupt(where + ": checksum mismatch (" + CsumTypeName(params.csum_type) + ")");
  }
  if (h.bytenr.get() != check.bytenr) {
    return Status::Corrupt(where + ": header bytenr is " + std::to_string(h.bytenr.get()));
  }
  if (std::memcmp(h.fsid, params.fsid, kFsidSize) != 0 &&
      std::none_of(params.seed_fsids.begin(), params.seed_fsids.end(),
                   [&](const auto& f) { return std::memcmp(h.fsid, f.data(), kFsidSize) == 0; })) {
    return Status::Corrupt(where + ": fsid " + UuidToString(h.fsid) + " does not match the filesystem");
  }
  if (h.level >= kMaxLevel) return Status::Corrupt(where + ": level " + std::to_string(h.level) + " is too high");
  if (check.level >= 0 && h.level != check.level) {
    return Status::Corrupt(where + ": level " + std::to_string(h.level) + ", expected " + std::to_string(check.level));
  }
  if (check.generation != 0 && h.generation.get() != check.generation) {
    return Status::Corrupt(where + ": generation " + std::to_string(h.generation.get()) + ", expected " +
                           std::to_string(check.generation));
  }
  const uint32_t nritems = h.nritems.get();
  const size_t space = bytes.size() - sizeof(Header);
  const uint8_t* body = bytes.data() + sizeof(Header);
  Key prev{};
  if (h.level == 0) {
    if (uint64_t{nritems} * sizeof(Item) > space) {
      return Status::Corrupt(where + ": " + std::to_string(nritems) + " items do not fit in a leaf");
    }
    // Items sit at the front; their data is packed from the end backwards,
    // item i's data ending where item i-1's begins.
    uint64_t data_end = space;
    const uint64_t headers_end = uint64_t{nritems} * sizeof(Item);
    for (uint32_t i = 0; i < nritems; ++i) {
      const auto* it = reinterpret_cast<const Item*>(body) + i;
      const uint64_t off = it->offset.get(), sz = it->size.get();
      if (off + sz != data_end) {
        return Status::Corrupt(where + ": item " + std::to_string(i) + " data [" + std::to_string(off) + ", +" +
                               std::to_string(sz) + ") does not end at " + std::to_string(data_end));
      }
      if (off < headers_end) {
        return Status::Corrupt(where + ": item " + std::to_string(i) + " data offset " + std::to_string(off) +
                               " overlaps the item headers");
      }
      data_end = off;
      Key k = Key::From(it->key);
      if (i > 0 && !(prev < k)) {
        return Status::Corrupt(where + ": key " + KeyToString(k) + " in slot " + std::to_string(i) +
                               " is not above " + KeyToString(prev));
      }
      prev = k;
    }
  } else {
    if (nritems == 0) return Status::Corrupt(where + ": empty node at level " + std::to_string(h.level));
    if (uint64_t{nritems} * sizeof(KeyPtr) > space) {
      return Status::Corrupt(where + ": " + std::to_string(nritems) + " pointers do not fit in a node");
    }
    for (uint32_t i = 0; i < nritems; ++i) {
      const auto* p = reinterpret_cast<const KeyPtr*>(body) + i;
      Key k = Key::From(p->key);
      if (i > 0 && !(prev < k)) {
        return Status::Corrupt(where + ": key " + KeyToString(k) + " in slot " + std::to_string(i) +
                               " is not above " + KeyToString(prev));
      }
      const uint64_t child = p->blockptr.get();
      if (child == 0 || child % 4096 != 0) {
        return Status::Corrupt(where + ": slot " + std::to_string(i) + " points at unaligned block " +
                               std::to_string(child));
      }
      prev = k;
    }
  }
  if (check.first_key) {
    if (nritems == 0) {
      return Status::Corrupt(where + ": empty, but its parent expects key " + KeyToString(*check.first_key));
    }
    const Key first = h.level == 0 ? Key::From(reinterpret_cast<const Item*>(body)->key)
                                   : Key::From(reinterpret_cast<const KeyPtr*>(body)->key);
    if (first != *check.first_key) {
      return Status::Corrupt(where + ": first key " + KeyToString(first) + ", parent expects " +
                             KeyToString(*check.first_key));
    }
  }
  return Status::Ok();
}

std::shared_ptr<TreeBlock> TreeBlock::NewBlank(uint32_t nodesize) {
  BlockBuffer buf = BlockBuffer::Take(nodesize);
  std::memset(buf.data(), 0, buf.size());
  return std::shared_ptr<TreeBlock>(new TreeBlock(std::move(buf)));
}

std::shared_ptr<TreeBlock> TreeBlock::Clone() const {
  return std::shared_ptr<TreeBlock>(new TreeBlock(BlockBuffer::CopyOf(bytes_.span())));
}

Result<std::shared_ptr<const TreeBlock>> TreeBlock::Parse(BlockBuffer bytes, const TreeParams& params,
                                                           const BlockCheck& check) {
  UB_RETURN_IF_ERROR(VerifyTreeBlock(bytes.span(), params, check));
  return std::shared_ptr<const TreeBlock>(new TreeBlock(std::move(bytes)));
}


std::span<const uint8_t> TreeBlock::item_data(int slot) const {
  const auto* it = item(slot);
  return bytes_.span().subspan(sizeof(Header) + it->offset.get(), it->size.get());
}

uint32_t TreeBlock::LeafFreeSpace() const {
  const int n = nritems();
  const uint32_t data_start = n == 0 ? LeafSpace() : item(n - 1)->offset.get();
  return data_start - static_cast<uint32_t>(n * sizeof(Item));
}

namespace {
// -1, 0 or 1 as the on-disk key at p is below, equal to or above k: the
// fields compared in place, the objectid (which mostly decides) first.
inline int CompareAt(const uint8_t* p, const Key& k) {
  uint64_t v;
  std::memcpy(&v, p + offsetof(DiskKey, objectid), sizeof v);
  v = le64toh(v);
  if (v != k.objectid) return v < k.objectid ? -1 : 1;
  const uint8_t t = p[offsetof(DiskKey, type)];
  if (t != k.type) return t < k.type ? -1 : 1;
  std::memcpy(&v, p + offsetof(DiskKey, offset), sizeof v);
  v = le64toh(v);
  if (v != k.offset) return v < k.offset ? -1 : 1;
  return 0;
}

// The first slot whose key is above k (or at/above it with `or_equal`), in a
// block whose keys start every `stride` bytes after the header.
template <size_t Stride>
int Partition(const uint8_t* first, int n, const Key& k, bool or_equal) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    const int c = CompareAt(first + static_cast<size_t>(mid) * Stride, k);
    if (c < 0 || (c == 0 && !or_equal)) lo = mid + 1; else hi = mid;
  }
  return lo;
}
}  // namespace

int TreeBlock::LastSlotAtOrBefore(const Key& k) const {
  const uint8_t* first = bytes_.data() + sizeof(Header);
  const int above = is_leaf() ? Partition<sizeof(Item)>(first, nritems(), k, false)
                              : Partition<sizeof(KeyPtr)>(first, nritems(), k, false);
  return above - 1;
}

int TreeBlock::FirstSlotAtOrAfter(const Key& k) const {
  const uint8_t* first = bytes_.data() + sizeof(Header);
  return is_leaf() ? Partition<sizeof(Item)>(first, nritems(), k, true)
                   : Partition<sizeof(KeyPtr)>(first, nritems(), k, true);
}

}  // namespace ubtrfs::tree
