#include "txn/mkfs.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cctype>
#include <ctime>
#include <map>
#include <memory>
#include <span>

#include "format/checksum.h"
#include "format/key.h"
#include "format/superblock.h"
#include "alloc/chunk_io.h"
#include "alloc/chunk_map.h"
#include "io/device_set.h"
#include "io/recording_device.h"
#include "tree/tree_block.h"
#include "tree/writer.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::LeafItem;
using tree::TreeBlock;

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kStripeLen = 64 * 1024;      // BTRFS_STRIPE_LEN
constexpr uint64_t kReservedBytes = kMiB;       // nothing is allocated below 1 MiB
constexpr uint64_t kGeneration = 1;             // everything is written by one "transaction"
constexpr uint64_t kHeaderFlags = kHeaderFlagWritten | (kMixedBackrefRev << kBackrefRevShift);
constexpr uint64_t kIncompat =
    kIncompatMixedBackref | kIncompatExtendedIref | kIncompatSkinnyMetadata | kIncompatNoHoles;
constexpr uint64_t kCompatRo = kCompatRoFreeSpaceTree | kCompatRoFreeSpaceTreeValid;
constexpr uint32_t kDirMode = 040755;
constexpr int kMaxLayoutRounds = 16;

uint64_t RoundDown(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t RoundUpMiB(uint64_t v) { return v > UINT64_MAX - kMiB ? RoundDown(v, kMiB) : RoundDown(v + kMiB - 1, kMiB); }

std::string SizeText(uint64_t bytes) {
  char buf[64];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%llu bytes, %.2f GiB", static_cast<unsigned long long>(bytes),
                  static_cast<double>(bytes) / (1ull << 30));
  } else {
    std::snprintf(buf, sizeof buf, "%llu bytes, %.2f MiB", static_cast<unsigned long long>(bytes),
                  static_cast<double>(bytes) / kMiB);
  }
  return buf;
}

template <typename T>
std::vector<uint8_t> Bytes(const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  return std::vector<uint8_t>(p, p + sizeof(T));
}

Status RandomUuid(Uuid* out) {
  size_t done = 0;
  while (done < out->size()) {
    ssize_t n = getrandom(out->data() + done, out->size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      return Status::Error(e, std::string("getrandom: ") + std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  (*out)[6] = static_cast<uint8_t>(((*out)[6] & 0x0f) | 0x40);  // version 4 (random)
  (*out)[8] = static_cast<uint8_t>(((*out)[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return Status::Ok();
}

// ---- Chunk layout ------------------------------------------------------------------------

struct PlannedChunk : MkfsChunk {
  // Logical ranges whose copy holds a superblock: never allocated (the
  // kernel excludes them), not counted as used, listed as free in the free
  // space tree.
  std::vector<std::pair<uint64_t, uint64_t>> excluded;
  uint64_t next = 0;             // bump allocator for tree blocks
  std::vector<uint64_t> blocks;  // tree blocks placed here
};

void AddChunk(std::vector<PlannedChunk>* chunks, uint64_t type, uint64_t length, int copies, uint64_t* phys) {
  PlannedChunk c;
  c.logical = *phys;
  c.length = length;
  c.type = type;
  c.stripe_bytes = length;
  for (int i = 0; i < copies; ++i) {
    c.physical.push_back(*phys);
    c.devids.push_back(1);
    *phys += length;
  }
  // The 64 KiB stripe of a copy that holds a superblock (as btrfs_rmap_block
  // maps it back to a logical address).
  for (uint64_t p : c.physical) {
    for (int m = 0; m < kSuperMirrorMax; ++m) {
      const uint64_t sb = SuperblockOffset(m);
      if (sb < p || sb >= p + length) continue;
      const uint64_t start = c.logical + RoundDown(sb - p, kStripeLen);
      c.excluded.push_back({start, std::min(kStripeLen, c.logical + length - start)});
    }
  }
  std::sort(c.excluded.begin(), c.excluded.end());
  chunks->push_back(std::move(c));
}

// The smallest default metadata chunk: room for the kernel's global block
// reserve (about 350 nodes) and the reservations of a few operations on top.
uint64_t MetadataFloor(uint32_t nodesize) { return std::max(16 * kMiB, RoundUpMiB(768ull * nodesize)); }

uint64_t SystemChunkBytes(uint64_t total) { return total < (256 * kMiB) ? 4 * kMiB : 8 * kMiB; }

Result<std::vector<PlannedChunk>> PlanChunks(uint64_t total, const MkfsOptions& o) {
  const uint64_t sys = SystemChunkBytes(total);
  uint64_t meta = o.metadata_chunk_bytes;
  if (meta == 0) {
    if (total < 256 * kMiB) {
      meta = RoundDown(total / 8, kMiB);
    } else {
      meta = std::clamp(RoundDown(total / 20, kMiB), 32 * kMiB, 256 * kMiB);
    }
    meta = std::max(meta, MetadataFloor(o.nodesize));
  } else {
    meta = RoundUpMiB(meta);
  }
  const uint64_t fixed = kReservedBytes + 2 * sys;
  if (meta > (total - fixed) / 2) {
    return Status::Invalid("a " + SizeText(meta) + " DUP metadata chunk does not fit in a " + SizeText(total) +
                           " filesystem");
  }
  uint64_t phys = kReservedBytes;
  std::vector<PlannedChunk> chunks;
  // Chunks go in ascending logical (= physical) order either way.
  const uint64_t tail = RoundDown(total - 2 * sys - 2 * meta, kMiB);
  if (!o.metadata_at_end) {
    AddChunk(&chunks, kBlockGroupSystem | kBlockGroupDup, sys, 2, &phys);
    AddChunk(&chunks, kBlockGroupMetadata | kBlockGroupDup, meta, 2, &phys);
  }
  const uint64_t left = RoundDown((o.metadata_at_end ? tail : total) - phys, kMiB);
  uint64_t data;
  if (o.data_bytes == 0) {
    data = std::min(64 * kMiB, RoundDown(left / 2, kMiB));
  } else if (o.data_bytes == kMkfsAllSpace) {
    data = left;
  } else {
    data = RoundUpMiB(o.data_bytes);
    if (data > left) {
      return Status::Invalid(SizeText(data) + " of data chunks do not fit: the system and metadata chunks leave " +
                             SizeText(left));
    }
  }
  if (data == 0) return Status::Invalid("no room left for a data chunk in a " + SizeText(total) + " filesystem");
  while (data > 0) {
    const uint64_t len = std::min(data, kMkfsMaxDataChunk);
    AddChunk(&chunks, kBlockGroupData, len, 1, &phys);
    data -= len;
  }
  if (o.metadata_at_end) {
    phys = tail;
    AddChunk(&chunks, kBlockGroupSystem | kBlockGroupDup, sys, 2, &phys);
    AddChunk(&chunks, kBlockGroupMetadata | kBlockGroupDup, meta, 2, &phys);
  }
  return chunks;
}

// The chunk as the chunk map sees it.
alloc::ChunkInfo InfoOf(const MkfsChunk& c) {
  alloc::ChunkInfo ci;
  ci.logical = c.logical;
  ci.length = c.length;
  ci.type = c.type;
  ci.stripe_len = kStripeLen;
  ci.sub_stripes = (c.type & kBlockGroupRaid10) ? 2 : 1;
  ci.stripe_size = c.stripe_bytes;
  for (size_t i = 0; i < c.physical.size(); ++i) ci.stripes.push_back({c.devids[i], c.physical[i]});
  return ci;
}

// Several devices, or profiles other than the single-device defaults:
// a system, a metadata and a data chunk, each on the devices with the most
// room left (ties: the lower devid), as many as the profile takes.
Result<std::vector<PlannedChunk>> PlanProfileChunks(const std::vector<uint64_t>& sizes, uint64_t meta_profile,
                                                    uint64_t data_profile, const MkfsOptions& o) {
  const uint64_t smallest = *std::min_element(sizes.begin(), sizes.end());
  std::vector<uint64_t> next(sizes.size(), kReservedBytes);  // each device's first free byte
  uint64_t logical = kReservedBytes;
  std::vector<PlannedChunk> chunks;
  auto add = [&](uint64_t kind, uint64_t profile, uint64_t stripe) -> Status {
    const alloc::ProfileRule rule = alloc::RuleFor(profile);
    std::vector<size_t> order(sizes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return sizes[a] - next[a] > sizes[b] - next[b]; });
    size_t ndev = rule.devs_max == 0 ? order.size() : std::min<size_t>(rule.devs_max, order.size());
    ndev -= ndev % rule.increment;
    if (profile == kBlockGroupDup) ndev = 1;
    const std::string what = std::string(kind == (kBlockGroupData | kBlockGroupMetadata) ? "mixed data and metadata"
                                         : kind == kBlockGroupData                           ? "data"
                                         : kind == kBlockGroupSystem                         ? "system"
                                                                                             : "metadata") +
                             " profile " + alloc::ProfileName(profile);
    if (ndev < rule.devs_min) {
      return Status::Invalid("the " + what + " needs at least " + std::to_string(rule.devs_min) + " devices; " +
                             std::to_string(sizes.size()) + (sizes.size() == 1 ? " was" : " were") + " given");
    }
    const size_t nstripes = profile == kBlockGroupDup ? 2 : ndev;
    PlannedChunk c;
    c.type = kind | profile;
    c.stripe_bytes = stripe;
    for (size_t k = 0; k < nstripes; ++k) {
      const size_t d = order[profile == kBlockGroupDup ? 0 : k];
      if (next[d] + stripe > sizes[d]) {
        return Status::Invalid("device " + std::to_string(d + 1) + " (" + SizeText(sizes[d]) +
                               ") has no room for a " + SizeText(stripe) + " stripe of the " + what + " chunk");
      }
      c.devids.push_back(d + 1);
      c.physical.push_back(next[d]);
      next[d] += stripe;
    }
    const uint64_t data_stripes = alloc::DataStripesFor(profile, static_cast<uint32_t>(nstripes));
    c.logical = logical;
    c.length = stripe * data_stripes;
    logical += c.length;
    for (auto r : alloc::SuperblockRanges(InfoOf(c))) c.excluded.push_back(r);
    chunks.push_back(std::move(c));
    return Status::Ok();
  };
  uint64_t meta = o.metadata_chunk_bytes;
  if (meta == 0) {
    meta = smallest < 256 * kMiB ? RoundDown(smallest / 8, kMiB)
                                 : std::clamp(RoundDown(smallest / 20, kMiB), 32 * kMiB, 256 * kMiB);
    meta = std::max(meta, MetadataFloor(o.nodesize));
  } else {
    meta = RoundUpMiB(meta);
  }
  const uint64_t sys = SystemChunkBytes(smallest);
  UB_RETURN_IF_ERROR(add(kBlockGroupSystem, meta_profile, sys));
  if (!o.mixed) UB_RETURN_IF_ERROR(add(kBlockGroupMetadata, meta_profile, meta));
  // Data: 64 MiB a stripe, less where the devices the profile takes have
  // less than twice that left (room for the kernel's next metadata chunk).
  // Mixed: one chunk with room for both.
  uint64_t left = UINT64_MAX;
  for (size_t d = 0; d < sizes.size(); ++d) left = std::min(left, sizes[d] - next[d]);
  uint64_t data = std::min(64 * kMiB, RoundDown(left / (data_profile == kBlockGroupDup ? 4 : 2), kMiB));
  if (data == 0) return Status::Invalid("no room left for a data chunk");
  if (o.mixed) {
    const uint64_t both = std::min(data + meta, RoundDown(left / (data_profile == kBlockGroupDup ? 2 : 1), kMiB));
    UB_RETURN_IF_ERROR(add(kBlockGroupData | kBlockGroupMetadata, data_profile, both));
  } else {
    UB_RETURN_IF_ERROR(add(kBlockGroupData, data_profile, data));
  }
  return chunks;
}

// ---- Trees ---------------------------------------------------------------------------------

enum TreeIndex { kTChunk, kTRoot, kTExtent, kTDev, kTFs, kTCsum, kTUuid, kTFst, kTReloc, kTBgt, kNumTrees };
constexpr uint64_t kTreeOwner[kNumTrees] = {
    kChunkTreeObjectid, kRootTreeObjectid,      kExtentTreeObjectid,    kDevTreeObjectid,       kFsTreeObjectid,
    kCsumTreeObjectid,  kUuidTreeObjectid,      kFreeSpaceTreeObjectid, kDataRelocTreeObjectid, kBlockGroupTreeObjectid};

// How a sorted item list is cut into blocks: levels[0] holds each leaf's
// item range, levels[l] each level-l node's range of children in level l-1.
// Blocks are numbered leaves first, then level by level; the root is last.
struct Shape {
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  std::vector<Ranges> levels = {Ranges{std::pair<size_t, size_t>{0, 0}}};  // one empty leaf
  size_t blocks() const {
    size_t n = 0;
    for (const auto& l : levels) n += l.size();
    return n;
  }
  int level() const { return static_cast<int>(levels.size()) - 1; }
  // Level of block number k.
  int LevelOf(size_t k) const {
    for (size_t l = 0; l < levels.size(); ++l) {
      if (k < levels[l].size()) return static_cast<int>(l);
      k -= levels[l].size();
    }
    return -1;
  }
  friend bool operator==(const Shape&, const Shape&) = default;
};

Result<Shape> ShapeTree(const std::vector<LeafItem>& items, uint32_t nodesize) {
  const size_t space = nodesize - sizeof(Header);
  Shape s;
  s.levels.assign(1, {});
  auto& leaves = s.levels[0];
  size_t begin = 0, used = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const size_t need = sizeof(Item) + items[i].data.size();
    if (need > space) {
      return Status::Error(EIO, "internal: item " + KeyToString(items[i].key) + " does not fit in a leaf");
    }
    if (used + need > space) {
      leaves.push_back({begin, i});
      begin = i;
      used = 0;
    }
    used += need;
  }
  leaves.push_back({begin, items.size()});
  const size_t max_ptrs = space / sizeof(KeyPtr);
  while (s.levels.back().size() > 1) {
    if (static_cast<int>(s.levels.size()) >= kMaxLevel) return Status::Error(EIO, "internal: tree too tall");
    const size_t n = s.levels.back().size();
    const size_t groups = (n + max_ptrs - 1) / max_ptrs;
    std::vector<std::pair<size_t, size_t>> next;
    for (size_t g = 0; g < groups; ++g) next.push_back({n * g / groups, n * (g + 1) / groups});
    s.levels.push_back(std::move(next));
  }
  return s;
}

struct Ctx {
  uint32_t nodesize = 0;
  uint32_t sectorsize = 0;
  uint16_t csum_type = 0;
  uint64_t total = 0;                // all devices together
  std::vector<uint64_t> dev_totals;  // by devid - 1
  std::vector<Uuid> dev_uuids;       // by devid - 1
  Uuid fsid{}, chunk_uuid{}, fs_uuid{};
  int64_t tsec = 0;
  uint32_t tnsec = 0;
  bool block_group_tree = false;  // block group items in a tree of their own
  std::vector<PlannedChunk> chunks;
  bool Has(int t) const { return t != kTBgt || block_group_tree; }
};

Result<uint64_t> AllocBlock(Ctx& ctx, uint64_t kind) {
  for (PlannedChunk& c : ctx.chunks) {
    if (!(c.type & kind)) continue;
    for (;;) {
      const uint64_t a = c.next;
      if (a + ctx.nodesize > c.logical + c.length) break;
      bool clash = false;
      for (auto [s, l] : c.excluded) {
        if (a < s + l && s < a + ctx.nodesize) {
          c.next = (s + l + ctx.nodesize - 1) / ctx.nodesize * ctx.nodesize;
          clash = true;
          break;
        }
      }
      if (clash) continue;
      c.next = a + ctx.nodesize;
      c.blocks.push_back(a);
      return a;
    }
  }
  return Status::Invalid(std::string("the ") + (kind == kBlockGroupSystem ? "system" : "metadata") +
                         " chunk is too small for the initial tree blocks");
}

void SetTime(Timespec* t, int64_t sec, uint32_t nsec) {
  t->sec = static_cast<uint64_t>(sec);
  t->nsec = nsec;
}

InodeItem RootDirInode(const Ctx& ctx, uint64_t nbytes, bool otime) {
  InodeItem ii{};
  ii.generation = kGeneration;
  ii.transid = kGeneration;
  ii.size = 0;
  ii.nbytes = nbytes;
  ii.nlink = 1;
  ii.mode = kDirMode;
  SetTime(&ii.atime, ctx.tsec, ctx.tnsec);
  SetTime(&ii.ctime, ctx.tsec, ctx.tnsec);
  SetTime(&ii.mtime, ctx.tsec, ctx.tnsec);
  if (otime) SetTime(&ii.otime, ctx.tsec, ctx.tnsec);
  return ii;
}

std::vector<uint8_t> InodeRefItem(uint64_t index, std::string_view name) {
  std::vector<uint8_t> d(sizeof(InodeRef) + name.size());
  auto* r = reinterpret_cast<InodeRef*>(d.data());
  r->index = index;
  r->name_len = static_cast<uint16_t>(name.size());
  std::memcpy(d.data() + sizeof(InodeRef), name.data(), name.size());
  return d;
}

// Items of the fs tree and the data reloc tree: the root directory, 256.
std::vector<LeafItem> RootDirItems(const Ctx& ctx, uint64_t nbytes, bool otime) {
  std::vector<LeafItem> items;
  items.push_back({Key{kFirstFreeObjectid, kInodeItemKey, 0}, Bytes(RootDirInode(ctx, nbytes, otime))});
  items.push_back({Key{kFirstFreeObjectid, kInodeRefKey, kFirstFreeObjectid}, InodeRefItem(0, "..")});
  return items;
}

std::vector<uint8_t> ChunkItemBytes(const Ctx& ctx, const PlannedChunk& c) {
  std::vector<uint8_t> d(sizeof(Chunk) + c.physical.size() * sizeof(Stripe));
  auto* ch = reinterpret_cast<Chunk*>(d.data());
  ch->length = c.length;
  ch->owner = kExtentTreeObjectid;
  ch->stripe_len = kStripeLen;
  ch->type = c.type;
  ch->io_align = static_cast<uint32_t>(kStripeLen);
  ch->io_width = static_cast<uint32_t>(kStripeLen);
  ch->sector_size = ctx.sectorsize;
  ch->num_stripes = static_cast<uint16_t>(c.physical.size());
  ch->sub_stripes = (c.type & kBlockGroupRaid10) ? 2 : 1;
  for (size_t i = 0; i < c.physical.size(); ++i) {
    auto* st = reinterpret_cast<Stripe*>(d.data() + sizeof(Chunk) + i * sizeof(Stripe));
    st->devid = c.devids[i];
    st->offset = c.physical[i];
    std::memcpy(st->dev_uuid, ctx.dev_uuids[c.devids[i] - 1].data(), kUuidSize);
  }
  return d;
}

DevItem MakeDevItem(const Ctx& ctx, uint64_t devid) {
  DevItem d{};
  uint64_t used = 0;
  for (const auto& c : ctx.chunks) {
    for (uint64_t id : c.devids) used += id == devid ? c.stripe_bytes : 0;
  }
  d.devid = devid;
  d.total_bytes = ctx.dev_totals[devid - 1];
  d.bytes_used = used;
  d.io_align = ctx.sectorsize;
  d.io_width = ctx.sectorsize;
  d.sector_size = ctx.sectorsize;
  std::memcpy(d.uuid, ctx.dev_uuids[devid - 1].data(), kUuidSize);
  std::memcpy(d.fsid, ctx.fsid.data(), kFsidSize);
  return d;
}

std::vector<LeafItem> ChunkTreeItems(const Ctx& ctx) {
  std::vector<LeafItem> items;
  for (uint64_t id = 1; id <= ctx.dev_totals.size(); ++id) {
    items.push_back({Key{kDevItemsObjectid, kDevItemKey, id}, Bytes(MakeDevItem(ctx, id))});
  }
  for (const auto& c : ctx.chunks) {
    items.push_back({Key{kFirstChunkTreeObjectid, kChunkItemKey, c.logical}, ChunkItemBytes(ctx, c)});
  }
  return items;
}

std::vector<LeafItem> DevTreeItems(const Ctx& ctx) {
  std::vector<LeafItem> items;
  for (const auto& c : ctx.chunks) {
    for (size_t i = 0; i < c.physical.size(); ++i) {
      DevExtent de{};
      de.chunk_tree = kChunkTreeObjectid;
      de.chunk_objectid = kFirstChunkTreeObjectid;
      de.chunk_offset = c.logical;
      de.length = c.stripe_bytes;
      std::memcpy(de.chunk_tree_uuid, ctx.chunk_uuid.data(), kUuidSize);
      items.push_back({Key{c.devids[i], kDevExtentKey, c.physical[i]}, Bytes(de)});
    }
  }
  return items;
}

std::vector<LeafItem> UuidTreeItems(const Ctx& ctx) {
  Le64 subvol;
  subvol = kFsTreeObjectid;
  return {{Key{LoadLe<uint64_t>(ctx.fs_uuid.data()), kUuidKeySubvol, LoadLe<uint64_t>(ctx.fs_uuid.data() + 8)},
           Bytes(subvol)}};
}

struct Placement {
  std::array<Shape, kNumTrees> shapes;
  std::array<std::vector<uint64_t>, kNumTrees> addrs;  // per tree, in Shape block order
};

std::vector<LeafItem> BlockGroupItems(const Ctx& ctx, std::vector<LeafItem> items = {}) {
  for (const auto& c : ctx.chunks) {
    BlockGroupItem bg{};
    bg.used = c.blocks.size() * uint64_t{ctx.nodesize};
    bg.chunk_objectid = kFirstChunkTreeObjectid;
    bg.flags = c.type;
    items.push_back({Key{c.logical, kBlockGroupItemKey, c.length}, Bytes(bg)});
  }
  return items;
}

std::vector<LeafItem> ExtentTreeItems(const Ctx& ctx, const Placement& pl) {
  std::vector<LeafItem> items;
  for (int t = 0; t < kNumTrees; ++t) {
    for (size_t k = 0; k < pl.addrs[t].size(); ++k) {
      std::vector<uint8_t> d(sizeof(ExtentItem) + sizeof(ExtentInlineRef));
      auto* ei = reinterpret_cast<ExtentItem*>(d.data());
      ei->refs = 1;
      ei->generation = kGeneration;
      ei->flags = kExtentFlagTreeBlock;
      auto* ref = reinterpret_cast<ExtentInlineRef*>(d.data() + sizeof(ExtentItem));
      ref->type = kTreeBlockRefKey;
      ref->offset = kTreeOwner[t];
      const int level = std::max(0, pl.shapes[t].LevelOf(k));
      items.push_back({Key{pl.addrs[t][k], kMetadataItemKey, static_cast<uint64_t>(level)}, std::move(d)});
    }
  }
  if (!ctx.block_group_tree) items = BlockGroupItems(ctx, std::move(items));
  return items;
}

// The free space tree lists, per block group, everything not taken by a
// tree block -- superblock stripes included, as the kernel writes it.
std::vector<LeafItem> FreeSpaceTreeItems(const Ctx& ctx) {
  std::vector<LeafItem> items;
  for (const auto& c : ctx.chunks) {
    std::vector<uint64_t> blocks = c.blocks;
    std::sort(blocks.begin(), blocks.end());
    std::vector<std::pair<uint64_t, uint64_t>> free;
    uint64_t cur = c.logical;
    for (uint64_t b : blocks) {
      if (b > cur) free.push_back({cur, b - cur});
      cur = b + ctx.nodesize;
    }
    if (cur < c.logical + c.length) free.push_back({cur, c.logical + c.length - cur});
    FreeSpaceInfo info{};
    info.extent_count = static_cast<uint32_t>(free.size());
    info.flags = 0;
    items.push_back({Key{c.logical, kFreeSpaceInfoKey, c.length}, Bytes(info)});
    for (auto [s, l] : free) items.push_back({Key{s, kFreeSpaceExtentKey, l}, {}});
  }
  return items;
}

RootItem MakeRootItem(const Ctx& ctx, const Placement& pl, int t) {
  RootItem ri{};
  ri.inode.generation = 1;
  ri.inode.size = 3;
  ri.inode.nlink = 1;
  ri.inode.nbytes = ctx.nodesize;
  ri.inode.mode = kDirMode;
  ri.generation = kGeneration;
  ri.root_dirid = (t == kTFs || t == kTReloc) ? kFirstFreeObjectid : 0;
  ri.bytenr = pl.addrs[t].empty() ? 0 : pl.addrs[t].back();
  ri.bytes_used = pl.addrs[t].size() * uint64_t{ctx.nodesize};
  ri.refs = 1;
  ri.level = static_cast<uint8_t>(pl.shapes[t].level());
  ri.generation_v2 = kGeneration;
  if (t == kTFs) {
    std::memcpy(ri.uuid, ctx.fs_uuid.data(), kUuidSize);
    SetTime(&ri.ctime, ctx.tsec, ctx.tnsec);
    SetTime(&ri.otime, ctx.tsec, ctx.tnsec);
  }
  return ri;
}

std::vector<LeafItem> RootTreeItems(const Ctx& ctx, const Placement& pl) {
  std::vector<LeafItem> items;
  for (int t : {kTExtent, kTDev, kTFs, kTCsum, kTUuid, kTFst, kTReloc, kTBgt}) {
    if (!ctx.Has(t)) continue;
    items.push_back({Key{kTreeOwner[t], kRootItemKey, 0}, Bytes(MakeRootItem(ctx, pl, t))});
  }
  // The root tree's directory (6) with the entry "default" for subvolume 5,
  // and that subvolume's back reference, as mkfs.btrfs writes them.
  const std::string_view kDefault = "default";
  items.push_back({Key{kFsTreeObjectid, kInodeRefKey, kRootTreeDirObjectid}, InodeRefItem(0, kDefault)});
  items.push_back({Key{kRootTreeDirObjectid, kInodeItemKey, 0}, Bytes(RootDirInode(ctx, ctx.nodesize, true))});
  items.push_back({Key{kRootTreeDirObjectid, kInodeRefKey, kRootTreeDirObjectid}, InodeRefItem(0, "..")});
  std::vector<uint8_t> dir(sizeof(DirItem) + kDefault.size());
  auto* di = reinterpret_cast<DirItem*>(dir.data());
  Key{kFsTreeObjectid, kRootItemKey, UINT64_MAX}.To(&di->location);
  di->transid = kGeneration;
  di->data_len = 0;
  di->name_len = static_cast<uint16_t>(kDefault.size());
  di->type = kFtDir;
  std::memcpy(dir.data() + sizeof(DirItem), kDefault.data(), kDefault.size());
  items.push_back({Key{kRootTreeDirObjectid, kDirItemKey, NameHash(kDefault)}, std::move(dir)});
  return items;
}

Status SortItems(std::vector<LeafItem>* items) {
  std::sort(items->begin(), items->end(), [](const LeafItem& a, const LeafItem& b) { return a.key < b.key; });
  for (size_t i = 1; i < items->size(); ++i) {
    if ((*items)[i - 1].key == (*items)[i].key) {
      return Status::Error(EIO, "internal: duplicate key " + KeyToString((*items)[i].key));
    }
  }
  return Status::Ok();
}

// Builds the blocks of one tree from its sorted items, the shape and the
// addresses; each is checksummed and verified as a reader would.
Result<std::vector<std::shared_ptr<TreeBlock>>> EmitTree(const Ctx& ctx, const std::vector<LeafItem>& items,
                                                         const Shape& shape, const std::vector<uint64_t>& addrs,
                                                         uint64_t owner) {
  tree::TreeParams params;
  params.nodesize = ctx.nodesize;
  params.csum_type = ctx.csum_type;
  std::memcpy(params.fsid, ctx.fsid.data(), kFsidSize);
  std::vector<std::shared_ptr<TreeBlock>> out;
  std::vector<Key> first_keys;       // of every block so far, in block order
  size_t level_base = 0, prev_base = 0;
  for (size_t l = 0; l < shape.levels.size(); ++l) {
    for (size_t j = 0; j < shape.levels[l].size(); ++j) {
      const size_t k = level_base + j;
      const auto [begin, end] = shape.levels[l][j];
      auto b = TreeBlock::NewBlank(ctx.nodesize);
      Header& h = b->mutable_header();
      std::memcpy(h.fsid, ctx.fsid.data(), kFsidSize);
      std::memcpy(h.chunk_tree_uuid, ctx.chunk_uuid.data(), kUuidSize);
      h.bytenr = addrs[k];
      h.flags = kHeaderFlags;
      h.generation = kGeneration;
      h.owner = owner;
      h.level = static_cast<uint8_t>(l);
      if (l == 0) {
        tree::WriteLeafItems(*b, std::span(items).subspan(begin, end - begin));
        first_keys.push_back(begin < end ? items[begin].key : Key{});
      } else {
        for (size_t c = begin; c < end; ++c) {
          KeyPtr* p = b->mutable_ptr(static_cast<int>(c - begin));
          first_keys[prev_base + c].To(&p->key);
          p->blockptr = addrs[prev_base + c];
          p->generation = kGeneration;
        }
        b->set_nritems(static_cast<int>(end - begin));
        first_keys.push_back(first_keys[prev_base + begin]);
      }
      CsumBytes sum = ComputeCsum(ctx.csum_type, b->bytes().subspan(kCsumSize));
      std::memcpy(b->mutable_bytes(), sum.data(), kCsumSize);
      UB_RETURN_IF_ERROR(
          tree::VerifyTreeBlock(b->bytes(), params, tree::BlockCheck{addrs[k], static_cast<int>(l), kGeneration, {}})
              .WithContext("mkfs: refusing to write"));
      out.push_back(std::move(b));
    }
    prev_base = level_base;
    level_base += shape.levels[l].size();
  }
  return out;
}

}  // namespace

uint64_t MkfsMinBytes(uint32_t nodesize) {
  // The reserved first MiB, both DUP chunks at their smallest, and 16 MiB
  // for data and for the kernel to allocate another chunk.
  return std::max(64 * kMiB, kReservedBytes + 2 * SystemChunkBytes(0) + 2 * MetadataFloor(nodesize) + 16 * kMiB);
}

Status ValidateMkfsOptions(const MkfsOptions& o) {
  if (o.sectorsize != 4096) {
    return Status::Invalid("sectorsize " + std::to_string(o.sectorsize) + " is not supported (only 4096)");
  }
  if (o.nodesize < o.sectorsize || o.nodesize > 65536 || (o.nodesize & (o.nodesize - 1)) != 0) {
    return Status::Invalid("nodesize " + std::to_string(o.nodesize) +
                           " is invalid: it must be a power of two from 4096 (the sector size) to 65536");
  }
  if (o.mixed && o.nodesize != o.sectorsize) {
    return Status::Invalid("nodesize " + std::to_string(o.nodesize) +
                           " is invalid with mixed block groups: it must equal the sector size (" +
                           std::to_string(o.sectorsize) + ")");
  }
  if (CsumSize(o.csum_type) == 0) return Status::Invalid("unknown checksum type " + std::to_string(o.csum_type));
  if (o.label.size() >= kLabelSize) {
    return Status::Invalid("label is " + std::to_string(o.label.size()) + " bytes long; at most " +
                           std::to_string(kLabelSize - 1) + " are allowed");
  }
  if (o.label.find('\0') != std::string::npos) return Status::Invalid("label contains a NUL byte");
  if (o.total_bytes != 0 && o.total_bytes < MkfsMinBytes(o.nodesize)) {
    return Status::Invalid("filesystem size " + SizeText(o.total_bytes) + " is too small; at least " +
                           SizeText(MkfsMinBytes(o.nodesize)) + " are needed with " + std::to_string(o.nodesize) +
                           "-byte nodes");
  }
  return Status::Ok();
}

std::optional<Uuid> ParseUuid(const std::string& text) {
  if (text.size() != 36) return std::nullopt;
  Uuid u{};
  size_t n = 0;
  for (size_t i = 0; i < text.size();) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (text[i] != '-') return std::nullopt;
      ++i;
      continue;
    }
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int hi = hex(text[i]), lo = i + 1 < text.size() ? hex(text[i + 1]) : -1;
    if (hi < 0 || lo < 0) return std::nullopt;
    u[n++] = static_cast<uint8_t>(hi * 16 + lo);
    i += 2;
  }
  if (n != u.size()) return std::nullopt;
  return u;
}

Result<bool> HasBtrfsSignature(io::BlockDevice* dev) {
  std::vector<uint8_t> buf(kSuperInfoSize);
  for (int m = 0; m < kSuperMirrorMax; ++m) {
    const uint64_t off = SuperblockOffset(m);
    if (off + kSuperInfoSize > dev->Size()) break;
    UB_RETURN_IF_ERROR(dev->ReadAt(off, buf));
    if (LoadLe<uint64_t>(buf.data() + offsetof(SuperBlock, magic)) == kMagic) return true;
  }
  return false;
}

std::optional<uint64_t> ParseProfile(const std::string& name) {
  std::string n;
  for (char c : name) n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, uint64_t> kNames[] = {
      {"single", 0},
      {"dup", kBlockGroupDup},
      {"raid0", kBlockGroupRaid0},
      {"raid1", kBlockGroupRaid1},
      {"raid1c3", kBlockGroupRaid1c3},
      {"raid1c4", kBlockGroupRaid1c4},
      {"raid10", kBlockGroupRaid10},
      {"raid5", kBlockGroupRaid5},
      {"raid6", kBlockGroupRaid6},
  };
  for (auto [text, bits] : kNames) {
    if (n == text) return bits;
  }
  return std::nullopt;
}

std::pair<uint64_t, uint64_t> MkfsProfiles(const MkfsOptions& opts, size_t devices) {
  if (opts.mixed) {
    // One profile for both (mkfs.btrfs: SINGLE unless one is given).
    const uint64_t p = opts.metadata_profile.value_or(opts.data_profile.value_or(0));
    return {p, p};
  }
  return {opts.metadata_profile.value_or(devices > 1 ? kBlockGroupRaid1 : kBlockGroupDup),
          opts.data_profile.value_or(0)};
}

Status ValidateMkfsProfiles(const MkfsOptions& opts, size_t devices) {
  if (opts.mixed && opts.metadata_profile && opts.data_profile && *opts.metadata_profile != *opts.data_profile) {
    return Status::Invalid("with mixed block groups the data and metadata profiles must be the same");
  }
  const auto [meta_profile, data_profile] = MkfsProfiles(opts, devices);
  for (auto [what, p] : {std::pair{"data", data_profile}, std::pair{"metadata", meta_profile}}) {
    if (p & ~kBlockGroupProfileMask || (p && (p & (p - 1)))) {
      return Status::Invalid(std::string("invalid ") + what + " profile bits " + std::to_string(p));
    }
    const uint32_t min = alloc::RuleFor(p).devs_min;
    if (devices < min) {
      return Status::Invalid(std::string("the ") + what + " profile " + alloc::ProfileName(p) + " needs at least " +
                             std::to_string(min) + " devices; " + std::to_string(devices) +
                             (devices == 1 ? " was" : " were") + " given");
    }
  }
  return Status::Ok();
}

Status MakeFilesystem(io::BlockDevice* dev, const MkfsOptions& opts, MkfsSummary* summary) {
  return MakeFilesystem(std::vector<io::BlockDevice*>{dev}, opts, summary);
}

Status MakeFilesystem(const std::vector<io::BlockDevice*>& devs, const MkfsOptions& opts, MkfsSummary* summary) {
  UB_RETURN_IF_ERROR(ValidateMkfsOptions(opts));
  if (devs.empty()) return Status::Invalid("no device given");
  Ctx ctx;
  ctx.nodesize = opts.nodesize;
  ctx.sectorsize = opts.sectorsize;
  ctx.csum_type = opts.csum_type;
  ctx.block_group_tree = opts.block_group_tree;
  for (io::BlockDevice* dev : devs) {
    const uint64_t dev_size = dev->Size();
    if (opts.total_bytes > dev_size) {
      return Status::Invalid("filesystem size " + SizeText(opts.total_bytes) + " is larger than " + dev->Name() +
                             " (" + SizeText(dev_size) + ")");
    }
    const uint64_t total = RoundDown(opts.total_bytes ? opts.total_bytes : dev_size, opts.sectorsize);
    if (total < MkfsMinBytes(opts.nodesize)) {
      return Status::Invalid(dev->Name() + " is too small for a filesystem: " + SizeText(total) + "; at least " +
                             SizeText(MkfsMinBytes(opts.nodesize)) + " are needed with " +
                             std::to_string(opts.nodesize) + "-byte nodes");
    }
    ctx.dev_totals.push_back(total);
    ctx.total += total;
  }
  UB_RETURN_IF_ERROR(ValidateMkfsProfiles(opts, devs.size()));
  const bool several = devs.size() > 1;
  const auto [meta_profile, data_profile] = MkfsProfiles(opts, devs.size());
  const bool default_layout = !several && !opts.mixed && meta_profile == kBlockGroupDup && data_profile == 0;
  if (!default_layout && (opts.metadata_at_end || opts.data_bytes != 0)) {
    return Status::Invalid("the data size and metadata-at-end layouts (--shrink) are for one device with the "
                           "default profiles and separate data and metadata chunks");
  }
  ctx.dev_uuids.resize(devs.size());
  for (size_t i = 0; i < devs.size(); ++i) {
    const std::optional<Uuid>& given =
        i == 0 ? opts.dev_uuid : (i - 1 < opts.more_dev_uuids.size() ? std::optional<Uuid>(opts.more_dev_uuids[i - 1])
                                                                     : std::nullopt);
    if (given) ctx.dev_uuids[i] = *given;
    else UB_RETURN_IF_ERROR(RandomUuid(&ctx.dev_uuids[i]));
  }
  for (auto [opt, field] : {std::pair{&opts.fsid, &ctx.fsid}, std::pair{&opts.chunk_tree_uuid, &ctx.chunk_uuid},
                            std::pair{&opts.fs_tree_uuid, &ctx.fs_uuid}}) {
    if (opt->has_value()) *field = **opt;
    else UB_RETURN_IF_ERROR(RandomUuid(field));
  }
  if (opts.time_sec) {
    ctx.tsec = *opts.time_sec;
    ctx.tnsec = opts.time_nsec;
  } else {
    timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    ctx.tsec = now.tv_sec;
    ctx.tnsec = static_cast<uint32_t>(now.tv_nsec);
  }
  if (default_layout) {
    UB_ASSIGN_OR_RETURN(ctx.chunks, PlanChunks(ctx.total, opts));
  } else {
    UB_ASSIGN_OR_RETURN(ctx.chunks, PlanProfileChunks(ctx.dev_totals, meta_profile, data_profile, opts));
  }

  // Trees whose items do not depend on where blocks go.
  std::array<std::vector<LeafItem>, kNumTrees> items;
  items[kTChunk] = ChunkTreeItems(ctx);
  items[kTDev] = DevTreeItems(ctx);
  items[kTFs] = RootDirItems(ctx, ctx.nodesize, true);
  items[kTReloc] = RootDirItems(ctx, 0, false);
  items[kTUuid] = UuidTreeItems(ctx);
  for (int t : {kTChunk, kTDev, kTFs, kTReloc, kTUuid}) UB_RETURN_IF_ERROR(SortItems(&items[t]));

  // The extent, free space and root trees describe where every block went,
  // so their size depends on the placement: place, describe, reshape until
  // nothing changes (one or two rounds; every tree of an empty filesystem
  // is one leaf unless the device has very many data chunks).
  Placement pl;
  bool settled = false;
  for (int round = 0; round < kMaxLayoutRounds && !settled; ++round) {
    for (auto& c : ctx.chunks) {
      c.next = c.logical;
      c.blocks.clear();
    }
    for (int t = 0; t < kNumTrees; ++t) {
      pl.addrs[t].clear();
      if (!ctx.Has(t)) continue;
      const uint64_t kind = t == kTChunk ? kBlockGroupSystem : kBlockGroupMetadata;
      for (size_t k = 0; k < pl.shapes[t].blocks(); ++k) {
        UB_ASSIGN_OR_RETURN(uint64_t a, AllocBlock(ctx, kind));
        pl.addrs[t].push_back(a);
      }
    }
    items[kTExtent] = ExtentTreeItems(ctx, pl);
    items[kTFst] = FreeSpaceTreeItems(ctx);
    items[kTRoot] = RootTreeItems(ctx, pl);
    if (ctx.block_group_tree) items[kTBgt] = BlockGroupItems(ctx);
    for (int t : {kTExtent, kTFst, kTRoot, kTBgt}) UB_RETURN_IF_ERROR(SortItems(&items[t]));
    settled = true;
    for (int t = 0; t < kNumTrees; ++t) {
      if (!ctx.Has(t)) continue;
      UB_ASSIGN_OR_RETURN(Shape s, ShapeTree(items[t], ctx.nodesize));
      if (!(s == pl.shapes[t])) {
        pl.shapes[t] = std::move(s);
        settled = false;
      }
    }
  }
  if (!settled) return Status::Error(EIO, "internal: mkfs tree layout did not settle");

  std::vector<std::shared_ptr<TreeBlock>> blocks;
  for (int t = 0; t < kNumTrees; ++t) {
    if (!ctx.Has(t)) continue;
    UB_ASSIGN_OR_RETURN(auto b, EmitTree(ctx, items[t], pl.shapes[t], pl.addrs[t], kTreeOwner[t]));
    for (auto& x : b) blocks.push_back(std::move(x));
  }

  // ---- Superblock ----
  SuperBlock sb{};
  std::memcpy(sb.fsid, ctx.fsid.data(), kFsidSize);
  sb.flags = kHeaderFlagWritten;
  sb.magic = kMagic;
  sb.generation = kGeneration;
  sb.root = pl.addrs[kTRoot].back();
  sb.root_level = static_cast<uint8_t>(pl.shapes[kTRoot].level());
  sb.chunk_root = pl.addrs[kTChunk].back();
  sb.chunk_root_level = static_cast<uint8_t>(pl.shapes[kTChunk].level());
  sb.chunk_root_generation = kGeneration;
  sb.total_bytes = ctx.total;
  uint64_t used = 0;
  for (const auto& c : ctx.chunks) used += c.blocks.size() * uint64_t{ctx.nodesize};
  sb.bytes_used = used;
  sb.root_dir_objectid = kRootTreeDirObjectid;
  sb.num_devices = devs.size();
  sb.sectorsize = ctx.sectorsize;
  sb.nodesize = ctx.nodesize;
  sb.unused_leafsize = ctx.nodesize;
  sb.stripesize = ctx.sectorsize;
  sb.compat_flags = 0;
  sb.compat_ro_flags = kCompatRo | (ctx.block_group_tree ? kCompatRoBlockGroupTree : 0);
  // As mkfs.btrfs: the profiles older kernels cannot read are named.
  uint64_t profiles = 0;
  for (const auto& c : ctx.chunks) profiles |= c.type & kBlockGroupProfileMask;
  sb.incompat_flags = kIncompat | (opts.mixed ? kIncompatMixedGroups : 0) |
                      (profiles & (kBlockGroupRaid5 | kBlockGroupRaid6) ? kIncompatRaid56 : 0) |
                      (profiles & (kBlockGroupRaid1c3 | kBlockGroupRaid1c4) ? kIncompatRaid1c34 : 0);
  sb.csum_type = ctx.csum_type;
  std::memcpy(sb.label, opts.label.data(), opts.label.size());
  sb.cache_generation = 0;       // mkfs.btrfs: 0 with the free space tree
  // mkfs.btrfs leaves it 0, and the kernel's first mount rescans every
  // subvolume and commits, or on a --shrink image logs that the scan failed
  // for want of space. This UUID tree is complete (the one subvolume's uuid).
  sb.uuid_tree_generation = kGeneration;
  size_t array = 0;
  for (const auto& c : ctx.chunks) {
    if (!(c.type & kBlockGroupSystem)) continue;
    const std::vector<uint8_t> chunk = ChunkItemBytes(ctx, c);
    if (array + sizeof(DiskKey) + chunk.size() > kSystemChunkArraySize) {
      return Status::Error(EIO, "internal: system chunk array overflow");
    }
    Key{kFirstChunkTreeObjectid, kChunkItemKey, c.logical}.To(reinterpret_cast<DiskKey*>(sb.sys_chunk_array + array));
    array += sizeof(DiskKey);
    std::memcpy(sb.sys_chunk_array + array, chunk.data(), chunk.size());
    array += chunk.size();
  }
  sb.sys_chunk_array_size = static_cast<uint32_t>(array);
  RootBackup& bk = sb.super_roots[kGeneration % kNumBackupRoots];
  auto root_of = [&](int t, Le64& bytenr, Le64& gen, uint8_t& level) {
    bytenr = pl.addrs[t].back();
    gen = kGeneration;
    level = static_cast<uint8_t>(pl.shapes[t].level());
  };
  root_of(kTRoot, bk.tree_root, bk.tree_root_gen, bk.tree_root_level);
  root_of(kTChunk, bk.chunk_root, bk.chunk_root_gen, bk.chunk_root_level);
  root_of(kTExtent, bk.extent_root, bk.extent_root_gen, bk.extent_root_level);
  root_of(kTFs, bk.fs_root, bk.fs_root_gen, bk.fs_root_level);
  root_of(kTDev, bk.dev_root, bk.dev_root_gen, bk.dev_root_level);
  root_of(kTCsum, bk.csum_root, bk.csum_root_gen, bk.csum_root_level);
  bk.total_bytes = ctx.total;
  bk.bytes_used = used;
  bk.num_devices = devs.size();

  // Where each tree block's copies go (the chunk map validates the items).
  std::map<uint64_t, uint64_t> dev_sizes;
  for (size_t i = 0; i < devs.size(); ++i) dev_sizes[i + 1] = devs[i]->Size();
  alloc::ChunkMap map(dev_sizes);
  for (const auto& c : ctx.chunks) {
    UB_RETURN_IF_ERROR(map.AddChunk(c.logical, ChunkItemBytes(ctx, c), ctx.sectorsize)
                           .WithContext("mkfs: refusing to write chunk " + std::to_string(c.logical)));
  }

  // ---- Write: wipe the start (old signatures and the old primary
  // superblock) and the end of each device, then the tree blocks, then the
  // superblocks (mirrors first, the primary last). ----
  const std::vector<uint8_t> zeros(kMiB, 0);
  for (size_t i = 0; i < devs.size(); ++i) {
    io::BlockDevice* dev = devs[i];
    const uint64_t dev_size = dev->Size();
    UB_RETURN_IF_ERROR(dev->WriteAt(0, zeros));
    if (ctx.dev_totals[i] != RoundDown(dev_size, ctx.sectorsize)) continue;
    uint64_t stripes_end = 0;
    for (const auto& c : ctx.chunks) {
      for (size_t k = 0; k < c.physical.size(); ++k) {
        if (c.devids[k] == i + 1) stripes_end = std::max(stripes_end, c.physical[k] + c.stripe_bytes);
      }
    }
    const uint64_t tail = std::max<uint64_t>(stripes_end, dev_size - std::min<uint64_t>(dev_size, kMiB));
    if (tail < dev_size) UB_RETURN_IF_ERROR(dev->WriteAt(tail, std::span(zeros).subspan(0, dev_size - tail)));
  }
  {
    // Through the chunk layer, which writes every copy, or on RAID5/6 the
    // rows with their parity.
    io::DeviceSet set;
    for (size_t i = 0; i < devs.size(); ++i) set.Add(i + 1, io::NewUnownedDevice(devs[i]));
    alloc::ChunkIo chunk_io(&map, &set);
    std::vector<alloc::ChunkIo::Range> ranges;
    for (const auto& b : blocks) ranges.push_back({b->bytenr(), b->bytes()});
    std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.logical < b.logical; });
    UB_RETURN_IF_ERROR(chunk_io.WriteBatch(ranges));
  }
  for (io::BlockDevice* dev : devs) UB_RETURN_IF_ERROR(dev->Flush());
  std::vector<uint8_t> buf(kSuperInfoSize);
  int copies = 0;
  for (size_t i = 0; i < devs.size(); ++i) {
    sb.dev_item = MakeDevItem(ctx, i + 1);
    for (int m = kSuperMirrorMax - 1; m >= 0; --m) {
      const uint64_t off = SuperblockOffset(m);
      if (off + kSuperInfoSize > ctx.dev_totals[i]) continue;
      sb.bytenr = off;
      std::memcpy(buf.data(), &sb, kSuperInfoSize);
      CsumBytes sum = ComputeCsum(ctx.csum_type, std::span<const uint8_t>(buf).subspan(kCsumSize));
      std::memcpy(buf.data(), sum.data(), kCsumSize);
      UB_RETURN_IF_ERROR(ValidateSuperblock(buf, off).WithContext("mkfs: refusing to write superblock"));
      UB_RETURN_IF_ERROR(devs[i]->WriteAt(off, buf));
      ++copies;
    }
  }
  for (io::BlockDevice* dev : devs) UB_RETURN_IF_ERROR(dev->Flush());

  if (summary) {
    summary->fsid = ctx.fsid;
    summary->dev_uuid = ctx.dev_uuids[0];
    summary->dev_uuids = ctx.dev_uuids;
    summary->dev_bytes = ctx.dev_totals;
    summary->chunk_tree_uuid = ctx.chunk_uuid;
    summary->total_bytes = ctx.total;
    summary->bytes_used = used;
    summary->generation = kGeneration;
    summary->tree_blocks = static_cast<int>(blocks.size());
    summary->superblock_copies = copies;
    summary->chunks.clear();
    for (const auto& c : ctx.chunks) summary->chunks.push_back(static_cast<const MkfsChunk&>(c));
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
