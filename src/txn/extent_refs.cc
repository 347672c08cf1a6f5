#include "txn/extent_refs.h"

#include <algorithm>
#include <cstring>

#include "format/checksum.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

namespace {

uint32_t CrcLe64(uint32_t seed, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return Crc32c(seed, std::span<const uint8_t>(b, 8));
}

size_t RefSize(uint8_t type) {
  switch (type) {
    case kTreeBlockRefKey:
    case kSharedBlockRefKey:
    case kExtentOwnerRefKey:  // simple quotas: the owning tree, in the offset
      return sizeof(ExtentInlineRef);
    case kExtentDataRefKey:
      return 1 + sizeof(ExtentDataRef);
    case kSharedDataRefKey:
      return sizeof(ExtentInlineRef) + sizeof(SharedDataRef);
    default:
      return 0;
  }
}

uint64_t GetLe64(const uint8_t* p) { return LoadLe<uint64_t>(p); }

}  // namespace

uint64_t ExtentDataRefHash(uint64_t root, uint64_t objectid, uint64_t offset) {
  const uint32_t high = CrcLe64(~0u, root);
  const uint32_t low = CrcLe64(CrcLe64(~0u, objectid), offset);
  return (uint64_t{high} << 31) ^ uint64_t{low};
}

uint64_t InlineRef::SortValue() const {
  return type == kExtentDataRefKey ? ExtentDataRefHash(root, objectid, data_offset) : offset;
}

Result<ExtentItemHead> ParseExtentItemHead(const Key& k, std::span<const uint8_t> d) {
  if (d.size() < sizeof(ExtentItem)) return Status::Corrupt("extent tree: short item " + KeyToString(k));
  ExtentItemHead h;
  h.tree_block = reinterpret_cast<const ExtentItem*>(d.data())->flags.get() & kExtentFlagTreeBlock;
  h.refs_start = sizeof(ExtentItem);
  if (k.type == kMetadataItemKey) {
    h.level = static_cast<int>(k.offset);
  } else if (h.tree_block) {
    if (d.size() < h.refs_start + sizeof(TreeBlockInfo)) return Status::Corrupt("extent tree: short " + KeyToString(k));
    h.level = reinterpret_cast<const TreeBlockInfo*>(d.data() + h.refs_start)->level;
    h.refs_start += sizeof(TreeBlockInfo);
  }
  return h;
}

Result<StoredRefs> ReadStoredRefs(tree::BlockSource* src, const tree::RootPtr& extent_root, uint64_t bytenr) {
  StoredRefs out;
  tree::Cursor c(src, extent_root);
  UB_RETURN_IF_ERROR(c.Seek(Key{bytenr, 0, 0}));
  while (c.Valid() && c.key().objectid == bytenr) {
    const Key k = c.key();
    auto d = c.data();
    if (k.type == kExtentItemKey || k.type == kMetadataItemKey) {
      UB_ASSIGN_OR_RETURN(out.head, ParseExtentItemHead(k, d));
      ++out.items;
      out.key = k;
      std::memcpy(&out.item, d.data(), sizeof out.item);
      const std::vector<uint8_t> item(d.begin(), d.end());
      UB_ASSIGN_OR_RETURN(auto refs, ParseInlineRefs(item, out.head.refs_start, k));
      out.refs.insert(out.refs.end(), refs.begin(), refs.end());
    } else if (k.type == kTreeBlockRefKey || k.type == kSharedBlockRefKey) {
      InlineRef r;
      r.type = k.type;
      r.offset = k.offset;
      out.refs.push_back(r);
    } else if (k.type == kSharedDataRefKey) {
      if (d.size() < sizeof(SharedDataRef)) return Status::Corrupt("extent tree: short item " + KeyToString(k));
      InlineRef r;
      r.type = k.type;
      r.offset = k.offset;
      r.count = reinterpret_cast<const SharedDataRef*>(d.data())->count.get();
      out.refs.push_back(r);
    } else if (k.type == kExtentDataRefKey) {
      if (d.size() < sizeof(ExtentDataRef)) return Status::Corrupt("extent tree: short item " + KeyToString(k));
      const auto* dr = reinterpret_cast<const ExtentDataRef*>(d.data());
      InlineRef r;
      r.type = k.type;
      r.root = dr->root.get();
      r.objectid = dr->objectid.get();
      r.data_offset = dr->offset.get();
      r.count = dr->count.get();
      out.refs.push_back(r);
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  return out;
}

Result<std::vector<InlineRef>> ParseInlineRefs(const std::vector<uint8_t>& item, size_t refs_start, const Key& key) {
  std::vector<InlineRef> out;
  size_t pos = refs_start;
  while (pos < item.size()) {
    InlineRef r;
    r.type = item[pos];
    r.pos = pos;
    r.size = RefSize(r.type);
    if (r.size == 0) {
      return Status::Unsupported("extent item " + KeyToString(key) + ": inline reference type " +
                                 std::to_string(r.type));
    }
    if (pos + r.size > item.size()) return Status::Corrupt("extent item " + KeyToString(key) + ": truncated inline ref");
    const uint8_t* p = item.data() + pos + 1;
    if (r.type == kExtentDataRefKey) {
      const auto* dr = reinterpret_cast<const ExtentDataRef*>(p);
      r.root = dr->root.get();
      r.objectid = dr->objectid.get();
      r.data_offset = dr->offset.get();
      r.count = dr->count.get();
    } else {
      r.offset = GetLe64(p);
      if (r.type == kSharedDataRefKey) r.count = reinterpret_cast<const SharedDataRef*>(p + 8)->count.get();
    }
    out.push_back(r);
    pos += r.size;
  }
  return out;
}

std::optional<InlineRef> FindInlineRef(const std::vector<InlineRef>& refs, const InlineRef& want) {
  for (const InlineRef& r : refs) {
    if (r.type != want.type) continue;
    if (r.type == kExtentDataRefKey) {
      if (r.root == want.root && r.objectid == want.objectid && r.data_offset == want.data_offset) return r;
    } else if (r.offset == want.offset) {
      return r;
    }
  }
  return std::nullopt;
}

void InsertInlineRef(std::vector<uint8_t>& item, const std::vector<InlineRef>& refs, size_t refs_start,
                     const InlineRef& ref) {
  size_t at = item.size();
  const uint64_t seq = ref.SortValue();
  for (const InlineRef& r : refs) {
    if (r.type > ref.type || (r.type == ref.type && r.SortValue() < seq)) {
      at = r.pos;
      break;
    }
  }
  if (refs.empty()) at = std::max(at, refs_start);
  std::vector<uint8_t> bytes(RefSize(ref.type), 0);
  bytes[0] = ref.type;
  if (ref.type == kExtentDataRefKey) {
    auto* dr = reinterpret_cast<ExtentDataRef*>(bytes.data() + 1);
    dr->root = ref.root;
    dr->objectid = ref.objectid;
    dr->offset = ref.data_offset;
    dr->count = ref.count;
  } else {
    auto* ir = reinterpret_cast<ExtentInlineRef*>(bytes.data());
    ir->offset = ref.offset;
    if (ref.type == kSharedDataRefKey) {
      reinterpret_cast<SharedDataRef*>(bytes.data() + sizeof(ExtentInlineRef))->count = ref.count;
    }
  }
  item.insert(item.begin() + static_cast<long>(at), bytes.begin(), bytes.end());
}

void EraseInlineRef(std::vector<uint8_t>& item, const InlineRef& r) {
  item.erase(item.begin() + static_cast<long>(r.pos), item.begin() + static_cast<long>(r.pos + r.size));
}

void SetInlineCount(std::vector<uint8_t>& item, const InlineRef& r, uint32_t count) {
  if (r.type == kExtentDataRefKey) {
    reinterpret_cast<ExtentDataRef*>(item.data() + r.pos + 1)->count = count;
  } else if (r.type == kSharedDataRefKey) {
    reinterpret_cast<SharedDataRef*>(item.data() + r.pos + sizeof(ExtentInlineRef))->count = count;
  }
}

}  // namespace ubtrfs::txn
