// dump-tree: every tree block of an image in readable text, in the manner of
// `btrfs inspect-internal dump-tree`. Blocks are read and verified through the
// volume's BlockReader; one that fails prints an ERROR line in place of its
// subtree and the walk goes on. Item bodies are decoded with bounds checks on
// every field, so a damaged item prints an ERROR line, never reads past it.
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "fs/volume.h"
#include "inspect/dump_tree.h"
#include "inspect/open_volume.h"
#include "tree/block_reader.h"
#include "tree/cursor.h"
#include "tree/tree_block.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs::inspect {
namespace {

using namespace ubtrfs::format;
using tree::BlockCheck;
using tree::TreeBlock;

// ---- Formatting helpers -----------------------------------------------------

// Names keep UTF-8 as is; control bytes and the backslash print as \xNN so
// that one item stays one line and the output cannot be spoofed.
std::string EscapeName(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f || c == '\\') out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

// Binary values (xattr data, string items): anything outside printable ASCII escaped.
std::string EscapeData(std::string_view s, size_t max_len) {
  std::string out;
  const size_t n = std::min(s.size(), max_len);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  if (n < s.size()) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

// Object ids as dump-tree prints them: well-known trees by name, the rest as numbers.
std::string ObjectidText(uint64_t objectid, uint8_t type) {
  switch (type) {
    case kPersistentItemKey:
      return objectid == kDevStatsObjectid ? "DEV_STATS" : std::to_string(objectid);
    case kDevExtentKey:  // a device id
      return std::to_string(objectid);
    case kQgroupRelationKey:
      return fmt::format("{}/{}", objectid >> 48, objectid & ((1ULL << 48) - 1));
    case kUuidKeySubvol:
    case kUuidKeyReceivedSubvol:
      return fmt::format("0x{:016x}", objectid);
    default:
      break;
  }
  if (objectid == kDevItemsObjectid && type == kDevItemKey) return "DEV_ITEMS";
  if (objectid == kFirstChunkTreeObjectid && type == kChunkItemKey) return "FIRST_CHUNK_TREE";
  if (objectid == UINT64_MAX) return "-1";
  return ObjectidName(objectid);
}

std::string OwnerText(uint64_t owner) { return ObjectidText(owner, 0); }

std::string KeyText(const Key& k) {
  std::string type = (k.type == 0 && k.objectid == kFreeSpaceObjectid) ? "UNTYPED" : KeyTypeName(k.type);
  std::string off;
  switch (k.type) {
    case kQgroupRelationKey:
    case kQgroupInfoKey:
    case kQgroupLimitKey:
      off = fmt::format("{}/{}", k.offset >> 48, k.offset & ((1ULL << 48) - 1));
      break;
    case kUuidKeySubvol:
    case kUuidKeyReceivedSubvol:
      off = fmt::format("0x{:016x}", k.offset);
      break;
    case kRootItemKey:
      off = k.objectid == kTreeRelocObjectid ? ObjectidText(k.offset, k.type) : std::to_string(k.offset);
      break;
    default:
      off = k.offset == UINT64_MAX ? "-1" : std::to_string(k.offset);
      break;
  }
  return fmt::format("({} {} {})", ObjectidText(k.objectid, k.type), type, off);
}

std::string KeyText(const DiskKey& d) { return KeyText(Key::From(d)); }

std::string TimeText(const Timespec& t) {
  const int64_t sec = static_cast<int64_t>(t.sec.get());
  const time_t tt = static_cast<time_t>(sec);
  struct tm tm;
  char buf[64] = "?";
  if (localtime_r(&tt, &tm) != nullptr) {
    if (strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm) == 0) std::strcpy(buf, "?");
  }
  return fmt::format("{}.{} ({})", sec, t.nsec.get(), buf);
}

std::string JoinFlags(uint64_t flags, std::initializer_list<std::pair<uint64_t, const char*>> names,
                      const char* none) {
  std::string s;
  uint64_t known = 0;
  for (const auto& [bit, name] : names) {
    known |= bit;
    if (flags & bit) {
      if (!s.empty()) s += '|';
      s += name;
    }
  }
  if (uint64_t rest = flags & ~known) {
    if (!s.empty()) s += '|';
    s += fmt::format("0x{:x}", rest);
  }
  return s.empty() ? none : s;
}

std::string BlockGroupFlagsText(uint64_t flags) {
  std::string s = JoinFlags(flags & kBlockGroupTypeMask,
                            {{kBlockGroupData, "DATA"}, {kBlockGroupMetadata, "METADATA"},
                             {kBlockGroupSystem, "SYSTEM"}},
                            "");
  const uint64_t profile = flags & kBlockGroupProfileMask;
  std::string p;
  switch (profile) {
    case 0: p = "single"; break;
    case kBlockGroupRaid0: p = "RAID0"; break;
    case kBlockGroupRaid1: p = "RAID1"; break;
    case kBlockGroupDup: p = "DUP"; break;
    case kBlockGroupRaid10: p = "RAID10"; break;
    case kBlockGroupRaid5: p = "RAID5"; break;
    case kBlockGroupRaid6: p = "RAID6"; break;
    case kBlockGroupRaid1c3: p = "RAID1C3"; break;
    case kBlockGroupRaid1c4: p = "RAID1C4"; break;
    default: p = fmt::format("UNKNOWN.0x{:x}", profile); break;
  }
  if (!s.empty()) s += '|';
  s += p;
  if (uint64_t rest = flags & ~(kBlockGroupTypeMask | kBlockGroupProfileMask)) s += fmt::format("|0x{:x}", rest);
  return s;
}

std::string InodeFlagsText(uint64_t flags) {
  return JoinFlags(flags,
                   {{kInodeNodatasum, "NODATASUM"}, {kInodeNodatacow, "NODATACOW"}, {kInodeReadonly, "READONLY"},
                    {kInodeNocompress, "NOCOMPRESS"}, {kInodePrealloc, "PREALLOC"}, {kInodeSync, "SYNC"},
                    {kInodeImmutable, "IMMUTABLE"}, {kInodeAppend, "APPEND"}, {kInodeNodump, "NODUMP"},
                    {kInodeNoatime, "NOATIME"}, {kInodeDirsync, "DIRSYNC"}, {kInodeCompress, "COMPRESS"},
                    {kInodeRoVerity, "VERITY"}},
                   "none");
}

std::string CompressionText(uint8_t c) {
  switch (c) {
    case kCompressNone: return "none";
    case kCompressZlib: return "zlib";
    case kCompressLzo: return "lzo";
    case kCompressZstd: return "zstd";
    default: return fmt::format("UNKNOWN.{}", c);
  }
}

std::string DirTypeText(uint8_t t) {
  switch (t) {
    case kFtRegFile: return "FILE";
    case kFtDir: return "DIR";
    case kFtChrdev: return "CHRDEV";
    case kFtBlkdev: return "BLKDEV";
    case kFtFifo: return "FIFO";
    case kFtSock: return "SOCK";
    case kFtSymlink: return "SYMLINK";
    case kFtXattr: return "XATTR";
    default: return fmt::format("DIR_ITEM.{}", t);
  }
}

// The intro dump-tree prints before a tree named by a ROOT_ITEM.
std::string TreeTitle(uint64_t id) {
  switch (id) {
    case kRootTreeObjectid: return "root tree";
    case kExtentTreeObjectid: return "extent tree";
    case kChunkTreeObjectid: return "chunk tree";
    case kDevTreeObjectid: return "device tree";
    case kFsTreeObjectid: return "fs tree";
    case kRootTreeDirObjectid: return "directory";
    case kCsumTreeObjectid: return "checksum tree";
    case kQuotaTreeObjectid: return "quota tree";
    case kUuidTreeObjectid: return "uuid tree";
    case kFreeSpaceTreeObjectid: return "free space tree";
    case kBlockGroupTreeObjectid: return "block group tree";
    case kRaidStripeTreeObjectid: return "raid stripe tree";
    case kOrphanObjectid: return "orphan";
    case kTreeLogObjectid: return "log";
    case kTreeLogFixupObjectid: return "log fixup";
    case kTreeRelocObjectid: return "reloc";
    case kDataRelocTreeObjectid: return "data reloc tree";
    case kExtentCsumObjectid: return "extent checksum";
    default:
      if (id >= kFirstFreeObjectid && id <= kLastFreeObjectid) return "file tree";
      return "unknown tree";
  }
}

// "-t" argument: a number or a tree name (root, fs, FS_TREE, free-space, ...).
std::optional<uint64_t> ParseTreeId(const std::string& arg) {
  if (arg.empty()) return std::nullopt;
  const bool negative = arg[0] == '-';
  const std::string digits = negative ? arg.substr(1) : arg;
  if (!digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    if (digits.size() > 20) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(digits.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') return std::nullopt;
    return negative ? static_cast<uint64_t>(0) - v : static_cast<uint64_t>(v);
  }
  std::string n;
  for (char c : arg) n.push_back(c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (n.size() > 5 && n.ends_with("-tree")) n.resize(n.size() - 5);
  static const std::pair<const char*, uint64_t> kNames[] = {
      {"root", kRootTreeObjectid},         {"extent", kExtentTreeObjectid},
      {"chunk", kChunkTreeObjectid},       {"dev", kDevTreeObjectid},
      {"device", kDevTreeObjectid},        {"fs", kFsTreeObjectid},
      {"csum", kCsumTreeObjectid},         {"checksum", kCsumTreeObjectid},
      {"quota", kQuotaTreeObjectid},       {"uuid", kUuidTreeObjectid},
      {"free-space", kFreeSpaceTreeObjectid}, {"fst", kFreeSpaceTreeObjectid},
      {"block-group", kBlockGroupTreeObjectid}, {"raid-stripe", kRaidStripeTreeObjectid},
      {"data-reloc", kDataRelocTreeObjectid},   {"tree-reloc", kTreeRelocObjectid},
      {"reloc", kTreeRelocObjectid},       {"log", kTreeLogObjectid},
      {"tree-log", kTreeLogObjectid},
  };
  for (const auto& [name, id] : kNames) {
    if (n == name) return id;
  }
  return std::nullopt;
}

// Bounds-checked access to the bytes of one item. Every read of a struct or a
// field goes through Get/Has, so nothing past the item is ever touched.
class ItemBytes {
 public:
  explicit ItemBytes(std::span<const uint8_t> d) : d_(d) {}
  size_t size() const { return d_.size(); }
  bool Has(size_t off, size_t n) const { return off <= d_.size() && n <= d_.size() - off; }
  template <typename T>
  std::optional<T> Get(size_t off) const {
    static_assert(std::is_trivially_copyable_v<T> && alignof(T) == 1);
    if (!Has(off, sizeof(T))) return std::nullopt;
    T v;
    std::memcpy(&v, d_.data() + off, sizeof(T));
    return v;
  }
  std::optional<uint64_t> U64(size_t off) const {
    if (!Has(off, 8)) return std::nullopt;
    return LoadLe<uint64_t>(d_.data() + off);
  }
  std::optional<uint32_t> U32(size_t off) const {
    if (!Has(off, 4)) return std::nullopt;
    return LoadLe<uint32_t>(d_.data() + off);
  }
  // Requires Has(off, n).
  std::string_view Str(size_t off, size_t n) const {
    return std::string_view(reinterpret_cast<const char*>(d_.data() + off), n);
  }
  const uint8_t* At(size_t off) const { return d_.data() + off; }

 private:
  std::span<const uint8_t> d_;
};

// A tree found through a ROOT_ITEM.
struct RootEntry {
  Key key;
  uint64_t bytenr = 0;
  int level = 0;
  uint64_t generation = 0;
};

std::optional<RootEntry> RootEntryFrom(const Key& k, std::span<const uint8_t> data) {
  if (data.size() < kRootItemV1Size) return std::nullopt;
  RootItem ri{};
  std::memcpy(&ri, data.data(), std::min(data.size(), sizeof ri));
  return RootEntry{k, ri.bytenr.get(), ri.level, ri.generation.get()};
}

// ---- The dumper ---------------------------------------------------------------

class Dumper {
 public:
  // `vol` may be null for printing single items (PrintChunkItem).
  Dumper(fs::Volume* vol, std::FILE* out)
      : vol_(vol), out_(out), csum_size_(vol ? CsumSize(vol->csum_type()) : 0) {}

  std::FILE* out() const { return out_; }
  void PrintChunkItem(std::span<const uint8_t> d) { PrintChunk(ItemBytes(d)); }

  // Reads the block `check` names and prints it; with `follow`, then every
  // child in key order (depth-first). A block that cannot be read prints an
  // ERROR line in place of its subtree.
  void Walk(const BlockCheck& check, bool follow) {
    auto block = vol_->reader()->Read(check);
    if (!block.ok()) {
      BlockError(block.status());
      return;
    }
    const TreeBlock& b = **block;
    PrintBlock(b);
    if (!follow || b.is_leaf()) return;
    for (int i = 0; i < b.nritems(); ++i) {
      Walk(BlockCheck{b.child_bytenr(i), b.level() - 1, b.child_generation(i), b.key(i)}, true);
    }
  }

  void WalkRoot(const RootEntry& r) {
    if (r.level < 0 || r.level >= kMaxLevel) {
      BlockError(Status::Corrupt(fmt::format("ROOT_ITEM {}: root level {} is out of range", KeyText(r.key), r.level)));
      return;
    }
    Walk(BlockCheck{r.bytenr, r.level, r.generation, {}}, true);
  }

  // While set, ROOT_ITEMs seen in printed leaves are remembered (root tree walk).
  void set_collect_roots(bool on) { collect_roots_ = on; }
  const std::vector<RootEntry>& roots() const { return roots_; }

  void BlockError(const Status& st) {
    fmt::print(out_, "ERROR: {}\n", st.message());
    ++block_errors_;
  }
  int block_errors() const { return block_errors_; }
  int item_errors() const { return item_errors_; }

 private:
  void PrintBlock(const TreeBlock& b) {
    const Header& h = b.header();
    const uint32_t nodesize = static_cast<uint32_t>(b.bytes().size());
    const uint32_t space = nodesize - static_cast<uint32_t>(sizeof(Header));
    const uint64_t hflags = h.flags.get();
    const uint64_t flags = hflags & ((1ULL << kBackrefRevShift) - 1);
    const char* kind = b.is_leaf() ? "leaf" : "node";
    if (b.is_leaf()) {
      uint64_t used = uint64_t{static_cast<uint32_t>(b.nritems())} * sizeof(Item);
      for (int i = 0; i < b.nritems(); ++i) used += b.item_size(i);
      const int64_t free_space = static_cast<int64_t>(space) - static_cast<int64_t>(used);
      fmt::print(out_, "leaf {} items {} free space {} generation {} owner {}\n", b.bytenr(), b.nritems(), free_space,
                 b.generation(), OwnerText(b.owner()));
    } else {
      const int64_t free_space = static_cast<int64_t>(space / sizeof(KeyPtr)) - b.nritems();
      fmt::print(out_, "node {} level {} items {} free space {} generation {} owner {}\n", b.bytenr(), b.level(),
                 b.nritems(), free_space, b.generation(), OwnerText(b.owner()));
    }
    fmt::print(out_, "{} {} flags 0x{:x}({}) backref revision {}\n", kind, b.bytenr(), flags,
               JoinFlags(flags, {{kHeaderFlagWritten, "WRITTEN"}, {kHeaderFlagReloc, "RELOC"}}, ""),
               hflags >> kBackrefRevShift);
    fmt::print(out_, "fs uuid {}\nchunk uuid {}\n", UuidToString(h.fsid), UuidToString(h.chunk_tree_uuid));
    if (!b.is_leaf()) {
      for (int i = 0; i < b.nritems(); ++i) {
        fmt::print(out_, "\tkey {} block {} gen {}\n", KeyText(b.key(i)), b.child_bytenr(i), b.child_generation(i));
      }
      return;
    }
    for (int i = 0; i < b.nritems(); ++i) {
      const Key k = b.key(i);
      fmt::print(out_, "\titem {} key {} itemoff {} itemsize {}\n", i, KeyText(k), b.item_offset(i), b.item_size(i));
      PrintItem(k, ItemBytes(b.item_data(i)));
      if (collect_roots_ && k.type == kRootItemKey) {
        if (auto r = RootEntryFrom(k, b.item_data(i))) roots_.push_back(*r);
      }
    }
  }

  void ItemError(const std::string& msg) {
    fmt::print(out_, "\t\tERROR: {}\n", msg);
    ++item_errors_;
  }
  void TooSmall(const char* what, size_t have, size_t need) {
    ItemError(fmt::format("item too small for {} (size {}, need {})", what, have, need));
  }
  // Fetches a T at `off`, or reports the item as too small for `what`.
  template <typename T>
  std::optional<T> Need(const ItemBytes& d, size_t off, const char* what) {
    auto v = d.Get<T>(off);
    if (!v) TooSmall(what, d.size(), off + sizeof(T));
    return v;
  }

  void PrintItem(const Key& k, const ItemBytes& d) {
    if (k.type == 0 && k.objectid == kFreeSpaceObjectid) return PrintFreeSpaceHeader(d);
    switch (k.type) {
      case kInodeItemKey: return PrintInodeItem(d);
      case kInodeRefKey: return PrintInodeRefs(d);
      case kInodeExtrefKey: return PrintInodeExtrefs(d);
      case kDirItemKey:
      case kDirIndexKey:
      case kXattrItemKey: return PrintDirItems(d);
      case kDirLogItemKey:
      case kDirLogIndexKey:
        if (auto end = d.U64(0)) fmt::print(out_, "\t\tdir log end {}\n", *end);
        else TooSmall("DIR_LOG item", d.size(), 8);
        return;
      case kOrphanItemKey: fmt::print(out_, "\t\torphan item\n"); return;
      case kVerityDescItemKey:
        if (k.offset != 0) {
          fmt::print(out_, "\t\tverity descriptor bytes {}\n", d.size());
        } else if (auto size = Need<Le64>(d, 0, "VERITY_DESC_ITEM")) {
          fmt::print(out_, "\t\tverity descriptor size {}\n", size->get());
        }
        return;
      case kVerityMerkleItemKey: fmt::print(out_, "\t\tverity merkle bytes {}\n", d.size()); return;
      case kExtentDataKey: return PrintFileExtent(d);
      case kExtentCsumKey: return PrintCsum(k, d);
      case kRootItemKey: return PrintRootItem(d);
      case kRootRefKey: return PrintRootRef(d, "ref");
      case kRootBackrefKey: return PrintRootRef(d, "backref");
      case kExtentItemKey: return PrintExtentItem(k, d, false);
      case kMetadataItemKey: return PrintExtentItem(k, d, true);
      case kTreeBlockRefKey: fmt::print(out_, "\t\ttree block backref\n"); return;
      case kSharedBlockRefKey: fmt::print(out_, "\t\tshared block backref\n"); return;
      case kExtentDataRefKey:
        if (auto r = Need<ExtentDataRef>(d, 0, "EXTENT_DATA_REF")) {
          fmt::print(out_, "\t\textent data backref root {} objectid {} offset {} count {}\n", OwnerText(r->root.get()),
                     r->objectid.get(), r->offset.get(), r->count.get());
        }
        return;
      case kSharedDataRefKey:
        if (auto r = Need<SharedDataRef>(d, 0, "SHARED_DATA_REF")) {
          fmt::print(out_, "\t\tshared data backref count {}\n", r->count.get());
        }
        return;
      case kExtentOwnerRefKey:
        if (auto root = d.U64(0)) fmt::print(out_, "\t\textent owner root {}\n", OwnerText(*root));
        else TooSmall("EXTENT_OWNER_REF", d.size(), 8);
        return;
      case kBlockGroupItemKey:
        if (auto bg = Need<BlockGroupItem>(d, 0, "BLOCK_GROUP_ITEM")) {
          fmt::print(out_, "\t\tblock group used {} chunk_objectid {} flags {}\n", bg->used.get(),
                     bg->chunk_objectid.get(), BlockGroupFlagsText(bg->flags.get()));
        }
        return;
      case kFreeSpaceInfoKey:
        if (auto fsi = Need<FreeSpaceInfo>(d, 0, "FREE_SPACE_INFO")) {
          fmt::print(out_, "\t\tfree space info extent count {} flags {}\n", fsi->extent_count.get(), fsi->flags.get());
        }
        return;
      case kFreeSpaceExtentKey: fmt::print(out_, "\t\tfree space extent\n"); return;
      case kFreeSpaceBitmapKey: fmt::print(out_, "\t\tfree space bitmap\n"); return;
      case kDevItemKey: return PrintDevItem(d);
      case kDevExtentKey:
        if (auto de = Need<DevExtent>(d, 0, "DEV_EXTENT")) {
          fmt::print(out_, "\t\tdev extent chunk_tree {}\n\t\tchunk_objectid {} chunk_offset {} length {}\n"
                     "\t\tchunk_tree_uuid {}\n",
                     de->chunk_tree.get(), de->chunk_objectid.get(), de->chunk_offset.get(), de->length.get(),
                     UuidToString(de->chunk_tree_uuid));
        }
        return;
      case kChunkItemKey: return PrintChunk(d);
      case kUuidKeySubvol:
      case kUuidKeyReceivedSubvol:
        if (d.size() % 8 != 0) {
          ItemError(fmt::format("uuid item size {} is not a multiple of 8", d.size()));
          return;
        }
        for (size_t off = 0; off < d.size(); off += 8) fmt::print(out_, "\t\tsubvol_id {}\n", *d.U64(off));
        return;
      case kQgroupStatusKey: return PrintQgroupStatus(d);
      case kQgroupInfoKey: return PrintQgroupInfo(d);
      case kQgroupLimitKey: return PrintQgroupLimit(d);
      case kQgroupRelationKey: return;
      case kStringItemKey: fmt::print(out_, "\t\titem data {}\n", EscapeData(d.Str(0, d.size()), 1024)); return;
      case kPersistentItemKey: return PrintPersistent(k, d);
      case kTemporaryItemKey:
        fmt::print(out_, "\t\ttemporary item objectid {} offset {}\n", ObjectidText(k.objectid, k.type), k.offset);
        fmt::print(out_, "\t\titem data size {}\n", d.size());
        return;
      default:
        fmt::print(out_, "\t\titem data size {}\n", d.size());
        return;
    }
  }

  void PrintInodeItem(const ItemBytes& d) {
    auto ii = Need<InodeItem>(d, 0, "INODE_ITEM");
    if (!ii) return;
    fmt::print(out_, "\t\tgeneration {} transid {} size {} nbytes {}\n", ii->generation.get(), ii->transid.get(),
               ii->size.get(), ii->nbytes.get());
    fmt::print(out_, "\t\tblock group {} mode {:o} links {} uid {} gid {} rdev {}\n", ii->block_group.get(),
               ii->mode.get(), ii->nlink.get(), ii->uid.get(), ii->gid.get(), ii->rdev.get());
    fmt::print(out_, "\t\tsequence {} flags 0x{:x}({})\n", ii->sequence.get(), ii->flags.get(),
               InodeFlagsText(ii->flags.get()));
    fmt::print(out_, "\t\tatime {}\n\t\tctime {}\n\t\tmtime {}\n\t\totime {}\n", TimeText(ii->atime),
               TimeText(ii->ctime), TimeText(ii->mtime), TimeText(ii->otime));
  }

  void PrintInodeRefs(const ItemBytes& d) {
    if (d.size() == 0) return TooSmall("INODE_REF", 0, sizeof(InodeRef));
    for (size_t off = 0; off < d.size();) {
      auto r = Need<InodeRef>(d, off, "INODE_REF");
      if (!r) return;
      const size_t name_len = r->name_len.get();
      const size_t name_off = off + sizeof(InodeRef);
      if (!d.Has(name_off, name_len)) {
        return ItemError(fmt::format("INODE_REF name of {} bytes at {} runs past the item (size {})", name_len,
                                     name_off, d.size()));
      }
      fmt::print(out_, "\t\tindex {} namelen {} name: {}\n", r->index.get(), name_len,
                 EscapeName(d.Str(name_off, name_len)));
      off = name_off + name_len;
    }
  }

  void PrintInodeExtrefs(const ItemBytes& d) {
    if (d.size() == 0) return TooSmall("INODE_EXTREF", 0, sizeof(InodeExtref));
    for (size_t off = 0; off < d.size();) {
      auto r = Need<InodeExtref>(d, off, "INODE_EXTREF");
      if (!r) return;
      const size_t name_len = r->name_len.get();
      const size_t name_off = off + sizeof(InodeExtref);
      if (!d.Has(name_off, name_len)) {
        return ItemError(fmt::format("INODE_EXTREF name of {} bytes at {} runs past the item (size {})", name_len,
                                     name_off, d.size()));
      }
      fmt::print(out_, "\t\tindex {} parent {} namelen {} name: {}\n", r->index.get(), r->parent_objectid.get(),
                 name_len, EscapeName(d.Str(name_off, name_len)));
      off = name_off + name_len;
    }
  }

  void PrintDirItems(const ItemBytes& d) {
    if (d.size() == 0) return TooSmall("DIR_ITEM", 0, sizeof(DirItem));
    for (size_t off = 0; off < d.size();) {
      auto di = Need<DirItem>(d, off, "DIR_ITEM");
      if (!di) return;
      const size_t name_len = di->name_len.get(), data_len = di->data_len.get();
      fmt::print(out_, "\t\tlocation key {} type {}\n", KeyText(di->location), DirTypeText(di->type));
      fmt::print(out_, "\t\ttransid {} data_len {} name_len {}\n", di->transid.get(), data_len, name_len);
      const size_t name_off = off + sizeof(DirItem);
      if (!d.Has(name_off, name_len + data_len)) {
        return ItemError(fmt::format("DIR_ITEM name and data ({} + {} bytes at {}) run past the item (size {})",
                                     name_len, data_len, name_off, d.size()));
      }
      fmt::print(out_, "\t\tname: {}\n", EscapeName(d.Str(name_off, name_len)));
      if (data_len) fmt::print(out_, "\t\tdata {}\n", EscapeData(d.Str(name_off + name_len, data_len), 256));
      off = name_off + name_len + data_len;
    }
  }

  void PrintFileExtent(const ItemBytes& d) {
    if (!d.Has(0, kFileExtentInlineDataStart)) {
      return TooSmall("EXTENT_DATA", d.size(), kFileExtentInlineDataStart);
    }
    FileExtentItem fe{};
    std::memcpy(&fe, d.At(0), std::min(d.size(), sizeof fe));
    const char* type_name = fe.type == kFileExtentInline    ? "inline"
                            : fe.type == kFileExtentReg     ? "regular"
                            : fe.type == kFileExtentPrealloc ? "prealloc"
                                                            : "unknown";
    fmt::print(out_, "\t\tgeneration {} type {} ({})\n", fe.generation.get(), fe.type, type_name);
    if (fe.type == kFileExtentInline) {
      fmt::print(out_, "\t\tinline extent data size {} ram_bytes {} compression {} ({})\n",
                 d.size() - kFileExtentInlineDataStart, fe.ram_bytes.get(), fe.compression,
                 CompressionText(fe.compression));
      return;
    }
    if (fe.type != kFileExtentReg && fe.type != kFileExtentPrealloc) {
      return ItemError(fmt::format("unknown file extent type {}", fe.type));
    }
    if (d.size() < sizeof(FileExtentItem)) return TooSmall("EXTENT_DATA", d.size(), sizeof(FileExtentItem));
    const char* what = fe.type == kFileExtentReg ? "extent" : "prealloc";
    fmt::print(out_, "\t\t{} data disk byte {} nr {}\n", what, fe.disk_bytenr.get(), fe.disk_num_bytes.get());
    fmt::print(out_, "\t\t{} data offset {} nr {} ram {}\n", what, fe.offset.get(), fe.num_bytes.get(),
               fe.ram_bytes.get());
    fmt::print(out_, "\t\textent compression {} ({})\n", fe.compression, CompressionText(fe.compression));
  }

  void PrintCsum(const Key& k, const ItemBytes& d) {
    if (csum_size_ == 0) {
      fmt::print(out_, "\t\trange start {}\n", k.offset);
      return;
    }
    const uint64_t len = uint64_t{d.size() / csum_size_} * vol_->sectorsize();
    fmt::print(out_, "\t\trange start {} end {} length {}\n", k.offset, k.offset + len, len);
    if (d.size() % csum_size_ != 0) {
      ItemError(fmt::format("csum item size {} is not a multiple of the checksum size {}", d.size(), csum_size_));
    }
  }

  void PrintRootItem(const ItemBytes& d) {
    if (d.size() < kRootItemV1Size) return TooSmall("ROOT_ITEM", d.size(), kRootItemV1Size);
    RootItem ri{};  // zero past what the item holds, as the kernel reads a v1 item
    std::memcpy(&ri, d.At(0), std::min(d.size(), sizeof ri));
    const uint64_t flags = ri.flags.get();
    fmt::print(out_, "\t\tgeneration {} root_dirid {} bytenr {} byte_limit {} bytes_used {}\n", ri.generation.get(),
               ri.root_dirid.get(), ri.bytenr.get(), ri.byte_limit.get(), ri.bytes_used.get());
    fmt::print(out_, "\t\tlast_snapshot {} flags 0x{:x}({}) refs {}\n", ri.last_snapshot.get(), flags,
               JoinFlags(flags, {{1ULL << 0, "RDONLY"}, {1ULL << 48, "DEAD"}}, "none"), ri.refs.get());
    fmt::print(out_, "\t\tdrop_progress key {} drop_level {}\n", KeyText(ri.drop_progress), ri.drop_level);
    fmt::print(out_, "\t\tlevel {} generation_v2 {}\n", ri.level, ri.generation_v2.get());
    if (d.size() >= sizeof(RootItem) && ri.generation.get() == ri.generation_v2.get()) {
      fmt::print(out_, "\t\tuuid {}\n\t\tparent_uuid {}\n\t\treceived_uuid {}\n", UuidToString(ri.uuid),
                 UuidToString(ri.parent_uuid), UuidToString(ri.received_uuid));
      fmt::print(out_, "\t\tctransid {} otransid {} stransid {} rtransid {}\n", ri.ctransid.get(), ri.otransid.get(),
                 ri.stransid.get(), ri.rtransid.get());
      fmt::print(out_, "\t\tctime {}\n\t\totime {}\n\t\tstime {}\n\t\trtime {}\n", TimeText(ri.ctime),
                 TimeText(ri.otime), TimeText(ri.stime), TimeText(ri.rtime));
    }
  }

  void PrintRootRef(const ItemBytes& d, const char* tag) {
    auto r = Need<RootRef>(d, 0, tag[0] == 'r' ? "ROOT_REF" : "ROOT_BACKREF");
    if (!r) return;
    const size_t name_len = r->name_len.get();
    if (!d.Has(sizeof(RootRef), name_len)) {
      return ItemError(fmt::format("root {} name of {} bytes runs past the item (size {})", tag, name_len,
                                   d.size()));
    }
    fmt::print(out_, "\t\troot {} key dirid {} sequence {} name {}\n", tag, r->dirid.get(), r->sequence.get(),
               EscapeName(d.Str(sizeof(RootRef), name_len)));
  }

  void PrintExtentItem(const Key& k, const ItemBytes& d, bool metadata) {
    const char* what = metadata ? "METADATA_ITEM" : "EXTENT_ITEM";
    auto ei = Need<ExtentItem>(d, 0, what);
    if (!ei) return;
    const uint64_t flags = ei->flags.get();
    fmt::print(out_, "\t\trefs {} gen {} flags {}\n", ei->refs.get(), ei->generation.get(),
               JoinFlags(flags,
                         {{kExtentFlagData, "DATA"}, {kExtentFlagTreeBlock, "TREE_BLOCK"},
                          {kBlockFlagFullBackref, "FULL_BACKREF"}},
                         "none"));
    size_t off = sizeof(ExtentItem);
    if (metadata) {
      fmt::print(out_, "\t\ttree block skinny level {}\n", k.offset);
    } else if (flags & kExtentFlagTreeBlock) {
      auto info = Need<TreeBlockInfo>(d, off, "EXTENT_ITEM tree block info");
      if (!info) return;
      fmt::print(out_, "\t\ttree block key {} level {}\n", KeyText(info->key), info->level);
      off += sizeof(TreeBlockInfo);
    }
    while (off < d.size()) {
      const uint8_t type = *d.At(off);
      switch (type) {
        case kTreeBlockRefKey:
        case kSharedBlockRefKey:
        case kExtentOwnerRefKey: {
          auto r = Need<ExtentInlineRef>(d, off, "inline backref");
          if (!r) return;
          if (type == kTreeBlockRefKey) fmt::print(out_, "\t\ttree block backref root {}\n", OwnerText(r->offset.get()));
          else if (type == kSharedBlockRefKey) fmt::print(out_, "\t\tshared block backref parent {}\n", r->offset.get());
          else fmt::print(out_, "\t\textent owner root {}\n", OwnerText(r->offset.get()));
          off += sizeof(ExtentInlineRef);
          break;
        }
        case kExtentDataRefKey: {  // the data ref takes the place of the offset
          auto r = Need<ExtentDataRef>(d, off + 1, "inline extent data backref");
          if (!r) return;
          fmt::print(out_, "\t\textent data backref root {} objectid {} offset {} count {}\n", OwnerText(r->root.get()),
                     r->objectid.get(), r->offset.get(), r->count.get());
          off += 1 + sizeof(ExtentDataRef);
          break;
        }
        case kSharedDataRefKey: {
          auto r = Need<ExtentInlineRef>(d, off, "inline shared data backref");
          if (!r) return;
          auto c = Need<SharedDataRef>(d, off + sizeof(ExtentInlineRef), "inline shared data backref");
          if (!c) return;
          fmt::print(out_, "\t\tshared data backref parent {} count {}\n", r->offset.get(), c->count.get());
          off += sizeof(ExtentInlineRef) + sizeof(SharedDataRef);
          break;
        }
        default:
          return ItemError(fmt::format("unknown inline backref type {} at offset {}", type, off));
      }
    }
  }

  void PrintDevItem(const ItemBytes& d) {
    auto di = Need<DevItem>(d, 0, "DEV_ITEM");
    if (!di) return;
    fmt::print(out_, "\t\tdevid {} total_bytes {} bytes_used {}\n", di->devid.get(), di->total_bytes.get(),
               di->bytes_used.get());
    fmt::print(out_, "\t\tio_align {} io_width {} sector_size {} type {}\n", di->io_align.get(), di->io_width.get(),
               di->sector_size.get(), di->type.get());
    fmt::print(out_, "\t\tgeneration {} start_offset {} dev_group {}\n", di->generation.get(), di->start_offset.get(),
               di->dev_group.get());
    fmt::print(out_, "\t\tseek_speed {} bandwidth {}\n", di->seek_speed, di->bandwidth);
    fmt::print(out_, "\t\tuuid {}\n\t\tfsid {}\n", UuidToString(di->uuid), UuidToString(di->fsid));
  }

  void PrintChunk(const ItemBytes& d) {
    auto c = Need<Chunk>(d, 0, "CHUNK_ITEM");
    if (!c) return;
    const size_t n = c->num_stripes.get();
    fmt::print(out_, "\t\tlength {} owner {} stripe_len {} type {}\n", c->length.get(), c->owner.get(),
               c->stripe_len.get(), BlockGroupFlagsText(c->type.get()));
    fmt::print(out_, "\t\tio_align {} io_width {} sector_size {}\n", c->io_align.get(), c->io_width.get(),
               c->sector_size.get());
    fmt::print(out_, "\t\tnum_stripes {} sub_stripes {}\n", n, c->sub_stripes.get());
    if (n == 0) return ItemError("chunk has no stripes");
    if (!d.Has(sizeof(Chunk), n * sizeof(Stripe))) {
      return ItemError(fmt::format("{} stripes do not fit in the item (size {}, need {})", n, d.size(),
                                   sizeof(Chunk) + n * sizeof(Stripe)));
    }
    for (size_t i = 0; i < n; ++i) {
      auto s = d.Get<Stripe>(sizeof(Chunk) + i * sizeof(Stripe));
      fmt::print(out_, "\t\t\tstripe {} devid {} offset {}\n\t\t\tdev_uuid {}\n", i, s->devid.get(), s->offset.get(),
                 UuidToString(s->dev_uuid));
    }
  }

  void PrintFreeSpaceHeader(const ItemBytes& d) {
    // A free space cache header (v1 cache): location key, generation, entries, bitmaps.
    auto loc = Need<DiskKey>(d, 0, "free space header");
    if (!loc) return;
    auto gen = d.U64(17), entries = d.U64(25), bitmaps = d.U64(33);
    if (!gen || !entries || !bitmaps) return TooSmall("free space header", d.size(), 41);
    fmt::print(out_, "\t\tlocation key {}\n\t\tcache generation {} entries {} bitmaps {}\n", KeyText(*loc), *gen,
               *entries, *bitmaps);
  }

  void PrintQgroupStatus(const ItemBytes& d) {
    auto version = d.U64(0), gen = d.U64(8), flags = d.U64(16), scan = d.U64(24);
    if (!version || !gen || !flags || !scan) return TooSmall("QGROUP_STATUS", d.size(), 32);
    std::string f = (*flags & 1) ? "ON" : "OFF";
    if (*flags & 2) f += "|SCANNING";
    if (*flags & 4) f += "|INCONSISTENT";
    if (*flags & 8) f += "|SIMPLE_MODE";
    fmt::print(out_, "\t\tversion {} generation {} flags {} scan {}\n", *version, *gen, f, *scan);
  }

  void PrintQgroupInfo(const ItemBytes& d) {
    if (!d.Has(0, 40)) return TooSmall("QGROUP_INFO", d.size(), 40);
    fmt::print(out_, "\t\tgeneration {}\n\t\treferenced {} referenced_compressed {}\n"
               "\t\texclusive {} exclusive_compressed {}\n",
               *d.U64(0), *d.U64(8), *d.U64(16), *d.U64(24), *d.U64(32));
  }

  void PrintQgroupLimit(const ItemBytes& d) {
    if (!d.Has(0, 40)) return TooSmall("QGROUP_LIMIT", d.size(), 40);
    fmt::print(out_, "\t\tflags {:x}\n\t\tmax_referenced {} max_exclusive {}\n\t\trsv_referenced {} rsv_exclusive {}\n",
               *d.U64(0), static_cast<int64_t>(*d.U64(8)), static_cast<int64_t>(*d.U64(16)),
               static_cast<int64_t>(*d.U64(24)), static_cast<int64_t>(*d.U64(32)));
  }

  void PrintPersistent(const Key& k, const ItemBytes& d) {
    fmt::print(out_, "\t\tpersistent item objectid {} offset {}\n", ObjectidText(k.objectid, k.type), k.offset);
    if (k.objectid != kDevStatsObjectid) {
      fmt::print(out_, "\t\tunknown persistent item objectid {}, size {}\n", k.objectid, d.size());
      return;
    }
    if (!d.Has(0, 40)) return TooSmall("device stats", d.size(), 40);
    fmt::print(out_, "\t\tdevice stats\n\t\twrite_errs {} read_errs {} flush_errs {} corruption_errs {} generation {}\n",
               *d.U64(0), *d.U64(8), *d.U64(16), *d.U64(24), *d.U64(32));
  }

  fs::Volume* vol_;
  std::FILE* out_;
  size_t csum_size_;
  bool collect_roots_ = false;
  std::vector<RootEntry> roots_;
  int block_errors_ = 0;
  int item_errors_ = 0;
};

// Every ROOT_ITEM of tree `id` (all of them when `id` is unset), through a cursor.
Status FindRootItems(fs::Volume& vol, std::optional<uint64_t> id, std::vector<RootEntry>* out) {
  tree::Cursor c(vol.reader(), vol.root_tree());
  UB_RETURN_IF_ERROR(c.Seek(Key{id.value_or(0), static_cast<uint8_t>(id ? kRootItemKey : 0), 0}));
  for (; c.Valid(); ) {
    const Key k = c.key();
    if (id && k.objectid != *id) break;
    if (k.type == kRootItemKey) {
      auto r = RootEntryFrom(k, c.data());
      if (!r) {
        return Status::Corrupt(fmt::format("ROOT_ITEM {} is {} bytes, shorter than {}", KeyText(k), c.data().size(),
                                           kRootItemV1Size));
      }
      out->push_back(*r);
    }
    UB_RETURN_IF_ERROR(c.Next());
  }
  return Status::Ok();
}

void PrintTrailer(std::FILE* out, const SuperBlock& sb) {
  fmt::print(out, "total bytes {}\nbytes used {}\nuuid {}\n", sb.total_bytes.get(), sb.bytes_used.get(),
             UuidToString(sb.fsid));
}

void PrintRootsOnly(fs::Volume& vol, Dumper& d) {
  const SuperBlock& sb = vol.super();
  fmt::print(d.out(), "root tree: {} level {}\n", sb.root.get(), sb.root_level);
  fmt::print(d.out(), "chunk tree: {} level {}\n", sb.chunk_root.get(), sb.chunk_root_level);
  if (sb.log_root.get() != 0) fmt::print(d.out(), "log root tree: {} level {}\n", sb.log_root.get(), sb.log_root_level);
  std::vector<RootEntry> roots;
  Status st = FindRootItems(vol, std::nullopt, &roots);
  for (const auto& r : roots) {
    fmt::print(d.out(), "{} key {} {} level {}\n", TreeTitle(r.key.objectid), KeyText(r.key), r.bytenr, r.level);
  }
  if (!st.ok()) d.BlockError(st.WithContext("root tree"));
  PrintTrailer(d.out(), sb);
}

// False when the tree has no ROOT_ITEM.
bool PrintOneTree(fs::Volume& vol, Dumper& d, uint64_t id) {
  const SuperBlock& sb = vol.super();
  if (id == kRootTreeObjectid) {
    fmt::print(d.out(), "root tree\n");
    d.Walk(BlockCheck{sb.root.get(), sb.root_level, sb.generation.get(), {}}, true);
    return true;
  }
  if (id == kChunkTreeObjectid) {
    fmt::print(d.out(), "chunk tree\n");
    d.Walk(BlockCheck{sb.chunk_root.get(), sb.chunk_root_level, sb.chunk_root_generation.get(), {}}, true);
    return true;
  }
  if (id == kTreeLogObjectid && sb.log_root.get() != 0) {
    fmt::print(d.out(), "log root tree\n");
    d.Walk(BlockCheck{sb.log_root.get(), sb.log_root_level, 0, {}}, true);
    return true;
  }
  std::vector<RootEntry> roots;
  Status st = FindRootItems(vol, id, &roots);
  for (const auto& r : roots) {
    fmt::print(d.out(), "{} key {}\n", TreeTitle(r.key.objectid), KeyText(r.key));
    d.WalkRoot(r);
  }
  if (!st.ok()) d.BlockError(st.WithContext("root tree"));
  return !st.ok() || !roots.empty();
}

void PrintAll(fs::Volume& vol, Dumper& d) {
  const SuperBlock& sb = vol.super();
  fmt::print(d.out(), "root tree: {} level {}\n", sb.root.get(), sb.root_level);
  fmt::print(d.out(), "chunk tree: {} level {}\n", sb.chunk_root.get(), sb.chunk_root_level);
  if (sb.log_root.get() != 0) fmt::print(d.out(), "log root tree: {} level {}\n", sb.log_root.get(), sb.log_root_level);
  fmt::print(d.out(), "root tree\n");
  d.set_collect_roots(true);
  d.Walk(BlockCheck{sb.root.get(), sb.root_level, sb.generation.get(), {}}, true);
  d.set_collect_roots(false);
  fmt::print(d.out(), "chunk tree\n");
  d.Walk(BlockCheck{sb.chunk_root.get(), sb.chunk_root_level, sb.chunk_root_generation.get(), {}}, true);
  if (sb.log_root.get() != 0) {
    fmt::print(d.out(), "log root tree\n");
    d.Walk(BlockCheck{sb.log_root.get(), sb.log_root_level, 0, {}}, true);
  }
  const std::vector<RootEntry> roots = d.roots();
  for (const auto& r : roots) {
    fmt::print(d.out(), "{} key {}\n", TreeTitle(r.key.objectid), KeyText(r.key));
    d.WalkRoot(r);
  }
  PrintTrailer(d.out(), sb);
}

}  // namespace

void PrintSysArrayItem(std::FILE* out, int index, const format::DiskKey& key, std::span<const uint8_t> chunk) {
  fmt::print(out, "\titem {} key {}\n", index, KeyText(key));
  if (chunk.empty()) return;
  Dumper d(nullptr, out);
  d.PrintChunkItem(chunk);
}

}  // namespace ubtrfs::inspect

namespace ubtrfs {

std::optional<uint64_t> ParseTreeName(const std::string& name) { return inspect::ParseTreeId(name); }

Result<DumpTreeReport> DumpTree(const std::string& image, const OpenOptions& where, const DumpTreeOptions& o,
                                std::FILE* out) {
  fs::VolumeOptions vo;
  vo.node_cache_bytes = 8ull << 20;  // a walk reads each block once
  UB_ASSIGN_OR_RETURN(auto vol, inspect::OpenVolume(image, where, vo));
  DumpTreeReport report;
  report.warnings = vol->warnings();
  inspect::Dumper d(vol.get(), out);
  if (!o.blocks.empty()) {
    for (uint64_t b : o.blocks) d.Walk(tree::BlockCheck{b, -1, 0, {}}, o.follow);
  } else if (o.roots_only) {
    inspect::PrintRootsOnly(*vol, d);
  } else if (o.tree) {
    report.tree_not_found = !inspect::PrintOneTree(*vol, d, *o.tree);
  } else {
    inspect::PrintAll(*vol, d);
  }
  std::fflush(out);
  report.block_errors = d.block_errors();
  report.item_errors = d.item_errors();
  return report;
}

}  // namespace ubtrfs
