// libFuzzer target: superblock validation, the system chunk array, and a full
// fs::Volume::Open (superblock choice, feature checks, chunk tree, root tree)
// over a small in-memory image whose superblock is the input.
//
// Input layout:
//   bytes [0, 4096)      the primary superblock (zero-padded). Unless bit 0 of
//                        its last byte (in the unused padding) is set, its
//                        checksum is recomputed first, so the checks behind
//                        the checksum run.
//   bytes [4096, 8091)   optional: replaces the items area (everything after
//                        the header) of the image's chunk tree leaf
//   bytes [8091, 12086)  optional: likewise for the root tree leaf
// The tree blocks' checksums are always recomputed (with the superblock's
// checksum type when it is a known one): tree_block_fuzz covers checksums.
//
// The image is built here (see BuildImage), a minimal but complete
// single-device filesystem of 256 KiB; its own superblock + leaves are the seed
// tests/fuzz/corpus/superblock_fuzz/synthetic (set UBTRFS_FUZZ_WRITE_SEED=PATH
// to write it again). Real mkfs.btrfs superblocks are seeds too; they do not
// match this image's trees, so they exercise the superblock-level checks.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "alloc/chunk_map.h"
#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "fs/volume.h"
#include "io/block_device.h"
#include "tree/cursor.h"

namespace {

using ubtrfs::format::Key;
namespace fmtd = ubtrfs::format;
namespace tree = ubtrfs::tree;

[[noreturn]] void Violated(const char* what, int line) {
  std::fprintf(stderr, "superblock_fuzz: invariant violated at line %d: %s\n", line, what);
  std::abort();
}
#define FUZZ_CHECK(cond)                      \
  do {                                        \
    if (!(cond)) Violated(#cond, __LINE__);   \
  } while (0)

volatile uint64_t g_sink;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;
constexpr uint32_t kNode = 4096;
// Small, because every run copies it (NewMemoryDevice keeps its own copy).
constexpr uint64_t kDevSize = 256 * kKiB;
constexpr uint64_t kGen = 9;
// Chunks: logical -> physical.
constexpr uint64_t kSysLogical = 1 * kMiB, kSysPhys = 128 * kKiB, kSysLen = 16 * kKiB;
constexpr uint64_t kMetaLogical = 4 * kMiB, kMetaLen = 32 * kKiB;
constexpr uint64_t kMetaPhys[2] = {144 * kKiB, 176 * kKiB};  // DUP
constexpr uint64_t kDataLogical = 8 * kMiB, kDataPhys = 208 * kKiB, kDataLen = 16 * kKiB;
// Tree blocks.
constexpr uint64_t kChunkRoot = kSysLogical;
constexpr uint64_t kRootTree = kMetaLogical;
constexpr uint64_t kFsTree = kMetaLogical + kNode;
constexpr uint64_t kCsumTree = kMetaLogical + 2 * kNode;
constexpr size_t kBody = kNode - sizeof(fmtd::Header);

const uint8_t kFsid[16] = {0x75, 0x62, 0x74, 0x72, 0x66, 0x73, 0x2d, 0x66, 0x75, 0x7a, 0x7a, 0x2d, 0x66, 0x73, 0x69, 0x64};
const uint8_t kDevUuid[16] = {0x64, 0x65, 0x76, 0x2d, 0x75, 0x75, 0x69, 0x64, 1, 2, 3, 4, 5, 6, 7, 8};
const uint8_t kChunkTreeUuid[16] = {0x63, 0x68, 0x75, 0x6e, 0x6b, 0x2d, 0x75, 0x75, 0x69, 0x64, 9, 9, 9, 9, 9, 9};

class Leaf {
 public:
  Leaf(uint64_t bytenr, uint64_t owner) : b_(kNode, 0), end_(kBody) {
    auto& h = header();
    std::memcpy(h.fsid, kFsid, 16);
    h.bytenr.set(bytenr);
    h.flags.set(fmtd::kHeaderFlagWritten | (fmtd::kMixedBackrefRev << fmtd::kBackrefRevShift));
    std::memcpy(h.chunk_tree_uuid, kChunkTreeUuid, 16);
    h.generation.set(kGen);
    h.owner.set(owner);
    h.level = 0;
  }
  template <typename T>
  void Add(const Key& k, const T& item) {
    Add(k, &item, sizeof item);
  }
  void Add(const Key& k, const void* data, size_t len) {
    auto* it = reinterpret_cast<fmtd::Item*>(b_.data() + sizeof(fmtd::Header)) + n_;
    end_ -= len;
    k.To(&it->key);
    it->offset.set(static_cast<uint32_t>(end_));
    it->size.set(static_cast<uint32_t>(len));
    std::memcpy(b_.data() + sizeof(fmtd::Header) + end_, data, len);
    header().nritems.set(++n_);
  }
  std::vector<uint8_t>& bytes() { return b_; }

 private:
  fmtd::Header& header() { return *reinterpret_cast<fmtd::Header*>(b_.data()); }
  std::vector<uint8_t> b_;
  size_t end_;
  uint32_t n_ = 0;
};

void FixTreeCsum(std::span<uint8_t> block, uint16_t type) {
  auto c = fmtd::ComputeCsum(type, block.subspan(fmtd::kCsumSize));
  std::memcpy(block.data(), c.data(), fmtd::kCsumSize);
}

void FixSuperCsum(std::span<uint8_t> sb, uint16_t type) {
  auto c = fmtd::ComputeCsum(type, sb.subspan(fmtd::kCsumSize, fmtd::kSuperInfoSize - fmtd::kCsumSize));
  std::memcpy(sb.data(), c.data(), fmtd::kCsumSize);
}

// A chunk item with its stripes.
std::vector<uint8_t> ChunkItem(uint64_t length, uint64_t type, std::initializer_list<uint64_t> phys) {
  std::vector<uint8_t> out(sizeof(fmtd::Chunk) + phys.size() * sizeof(fmtd::Stripe), 0);
  auto* c = reinterpret_cast<fmtd::Chunk*>(out.data());
  c->length.set(length);
  c->owner.set(fmtd::kExtentTreeObjectid);
  c->stripe_len.set(64 * kKiB);
  c->type.set(type);
  c->io_align.set(kNode);
  c->io_width.set(kNode);
  c->sector_size.set(kNode);
  c->num_stripes.set(static_cast<uint16_t>(phys.size()));
  auto* s = reinterpret_cast<fmtd::Stripe*>(out.data() + sizeof(fmtd::Chunk));
  for (uint64_t p : phys) {
    s->devid.set(1);
    s->offset.set(p);
    std::memcpy(s->dev_uuid, kDevUuid, 16);
    ++s;
  }
  return out;
}

fmtd::DevItem DevItem() {
  fmtd::DevItem d{};
  d.devid.set(1);
  d.total_bytes.set(kDevSize);
  d.bytes_used.set(kSysLen + 2 * kMetaLen + kDataLen);
  d.io_align.set(kNode);
  d.io_width.set(kNode);
  d.sector_size.set(kNode);
  std::memcpy(d.uuid, kDevUuid, 16);
  std::memcpy(d.fsid, kFsid, 16);
  return d;
}

fmtd::InodeItem DirInode() {
  fmtd::InodeItem i{};
  i.generation.set(1);
  i.transid.set(kGen);
  i.size.set(0);
  i.nbytes.set(kNode);
  i.nlink.set(1);
  i.mode.set(040755);
  return i;
}

fmtd::RootItem RootItem(uint64_t bytenr) {
  fmtd::RootItem r{};
  r.inode = DirInode();
  r.generation.set(kGen);
  r.root_dirid.set(256);
  r.bytenr.set(bytenr);
  r.bytes_used.set(kNode);
  r.refs.set(1);
  r.level = 0;
  r.generation_v2.set(kGen);
  return r;
}

struct Image {
  std::vector<uint8_t> bytes;
  // Physical offsets of the leaves the input may overwrite.
  std::vector<uint64_t> chunk_leaf{kSysPhys};
  std::vector<uint64_t> root_leaf{kMetaPhys[0], kMetaPhys[1]};
};

Image BuildImage() {
  Image img;
  img.bytes.assign(kDevSize, 0);
  auto put = [&](uint64_t phys, const std::vector<uint8_t>& b) { std::memcpy(img.bytes.data() + phys, b.data(), b.size()); };

  const auto sys_chunk = ChunkItem(kSysLen, fmtd::kBlockGroupSystem, {kSysPhys});
  const auto meta_chunk = ChunkItem(kMetaLen, fmtd::kBlockGroupMetadata | fmtd::kBlockGroupDup, {kMetaPhys[0], kMetaPhys[1]});
  const auto data_chunk = ChunkItem(kDataLen, fmtd::kBlockGroupData, {kDataPhys});

  // Superblock.
  std::vector<uint8_t> sbb(fmtd::kSuperInfoSize, 0);
  auto& sb = *reinterpret_cast<fmtd::SuperBlock*>(sbb.data());
  std::memcpy(sb.fsid, kFsid, 16);
  sb.bytenr.set(fmtd::kSuperInfoOffset);
  sb.flags.set(fmtd::kSuperFlagWritten);
  sb.magic.set(fmtd::kMagic);
  sb.generation.set(kGen);
  sb.root.set(kRootTree);
  sb.chunk_root.set(kChunkRoot);
  sb.total_bytes.set(kDevSize);
  sb.bytes_used.set(4 * kNode);
  sb.root_dir_objectid.set(fmtd::kRootTreeDirObjectid);
  sb.num_devices.set(1);
  sb.sectorsize.set(kNode);
  sb.nodesize.set(kNode);
  sb.unused_leafsize.set(kNode);
  sb.stripesize.set(kNode);
  sb.chunk_root_generation.set(kGen);
  sb.incompat_flags.set(fmtd::kIncompatMixedBackref | fmtd::kIncompatBigMetadata | fmtd::kIncompatExtendedIref |
                        fmtd::kIncompatSkinnyMetadata | fmtd::kIncompatNoHoles);
  sb.csum_type.set(0);
  sb.dev_item = DevItem();
  std::strcpy(sb.label, "ubtrfs-fuzz");
  {
    fmtd::DiskKey k{};
    Key{fmtd::kFirstChunkTreeObjectid, fmtd::kChunkItemKey, kSysLogical}.To(&k);
    std::memcpy(sb.sys_chunk_array, &k, sizeof k);
    std::memcpy(sb.sys_chunk_array + sizeof k, sys_chunk.data(), sys_chunk.size());
    sb.sys_chunk_array_size.set(static_cast<uint32_t>(sizeof k + sys_chunk.size()));
  }
  FixSuperCsum(sbb, 0);
  put(fmtd::kSuperInfoOffset, sbb);

  // Chunk tree: the device and the three chunks.
  Leaf chunk(kChunkRoot, fmtd::kChunkTreeObjectid);
  chunk.Add(Key{fmtd::kDevItemsObjectid, fmtd::kDevItemKey, 1}, DevItem());
  chunk.Add(Key{fmtd::kFirstChunkTreeObjectid, fmtd::kChunkItemKey, kSysLogical}, sys_chunk.data(), sys_chunk.size());
  chunk.Add(Key{fmtd::kFirstChunkTreeObjectid, fmtd::kChunkItemKey, kMetaLogical}, meta_chunk.data(), meta_chunk.size());
  chunk.Add(Key{fmtd::kFirstChunkTreeObjectid, fmtd::kChunkItemKey, kDataLogical}, data_chunk.data(), data_chunk.size());
  FixTreeCsum(chunk.bytes(), 0);
  put(kSysPhys, chunk.bytes());

  // Root tree: the fs tree and the (empty) csum tree.
  Leaf root(kRootTree, fmtd::kRootTreeObjectid);
  root.Add(Key{fmtd::kFsTreeObjectid, fmtd::kRootItemKey, 0}, RootItem(kFsTree));
  root.Add(Key{fmtd::kCsumTreeObjectid, fmtd::kRootItemKey, 0}, RootItem(kCsumTree));
  FixTreeCsum(root.bytes(), 0);

  // Fs tree: the root directory.
  Leaf fs(kFsTree, fmtd::kFsTreeObjectid);
  fs.Add(Key{256, fmtd::kInodeItemKey, 0}, DirInode());
  {
    uint8_t ref[sizeof(fmtd::InodeRef) + 2] = {};
    reinterpret_cast<fmtd::InodeRef*>(ref)->name_len.set(2);
    std::memcpy(ref + sizeof(fmtd::InodeRef), "..", 2);
    fs.Add(Key{256, fmtd::kInodeRefKey, 256}, ref, sizeof ref);
  }
  FixTreeCsum(fs.bytes(), 0);
  Leaf csum(kCsumTree, fmtd::kCsumTreeObjectid);
  FixTreeCsum(csum.bytes(), 0);
  for (uint64_t base : kMetaPhys) {
    put(base + (kRootTree - kMetaLogical), root.bytes());
    put(base + (kFsTree - kMetaLogical), fs.bytes());
    put(base + (kCsumTree - kMetaLogical), csum.bytes());
  }
  return img;
}

const Image& Base() {
  static const Image img = BuildImage();
  return img;
}

// Reads what a Volume can reach, bounded.
void Exercise(ubtrfs::fs::Volume& vol) {
  uint64_t acc = vol.super().generation.get() + vol.warnings().size();
  FUZZ_CHECK(vol.super_mirror() == 0);  // the device is too small for mirrors
  for (uint64_t id : {fmtd::kFsTreeObjectid, fmtd::kCsumTreeObjectid, fmtd::kExtentTreeObjectid, uint64_t{256}}) {
    auto r = vol.FindRoot(id);
    if (r.ok()) {
      acc += r->ref.bytenr;
      tree::Cursor c(vol.reader(), r->ref);
      int steps = 0;
      for (ubtrfs::Status st = c.SeekFirst(); st.ok() && c.Valid() && steps < 4096; st = c.Next(), ++steps) {
        for (uint8_t b : c.data()) acc += b;
      }
    } else {
      FUZZ_CHECK(!r.status().message().empty());
    }
  }
  tree::Cursor c(vol.reader(), vol.chunk_tree());
  int steps = 0;
  for (ubtrfs::Status st = c.SeekLast(); st.ok() && c.Valid() && steps < 4096; st = c.Prev(), ++steps) acc += c.key().offset;
  std::vector<uint8_t> buf(vol.sectorsize());
  acc += vol.ReadData(kDataLogical, buf, true).ok();
  g_sink = acc;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const Image& img = Base();
  // The harness is only useful if the pristine image opens.
  auto vol = ubtrfs::fs::Volume::Open(ubtrfs::io::NewMemoryDevice("base", img.bytes), {});
  if (!vol.ok()) {
    std::fprintf(stderr, "superblock_fuzz: the built-in image does not open: %s\n", vol.status().ToString().c_str());
    std::abort();
  }
  if (const char* path = std::getenv("UBTRFS_FUZZ_WRITE_SEED")) {
    std::vector<uint8_t> seed(img.bytes.begin() + fmtd::kSuperInfoOffset,
                              img.bytes.begin() + fmtd::kSuperInfoOffset + fmtd::kSuperInfoSize);
    seed.insert(seed.end(), img.bytes.begin() + img.chunk_leaf[0] + sizeof(fmtd::Header),
                img.bytes.begin() + img.chunk_leaf[0] + kNode);
    seed.insert(seed.end(), img.bytes.begin() + img.root_leaf[0] + sizeof(fmtd::Header),
                img.bytes.begin() + img.root_leaf[0] + kNode);
    FILE* f = std::fopen(path, "wb");
    if (f == nullptr || std::fwrite(seed.data(), 1, seed.size(), f) != seed.size() || std::fclose(f) != 0) {
      std::perror(path);
      std::abort();
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> sbb(fmtd::kSuperInfoSize, 0);
  std::memcpy(sbb.data(), data, std::min<size_t>(size, sbb.size()));
  auto& sb = *reinterpret_cast<fmtd::SuperBlock*>(sbb.data());
  const uint16_t csum_type = sb.csum_type.get();
  const bool known_csum = fmtd::CsumSize(csum_type) != 0;
  if (!(sbb.back() & 1) && known_csum) FixSuperCsum(sbb, csum_type);

  // The pure functions.
  const ubtrfs::Status valid = fmtd::ValidateSuperblock(sbb, fmtd::kSuperInfoOffset);
  FUZZ_CHECK(valid.ok() || valid.message().rfind("superblock at 65536: ", 0) == 0 ||
             valid.message().rfind("unsupported: superblock at 65536: ", 0) == 0);
  FUZZ_CHECK(!fmtd::ValidateSuperblock(std::span<const uint8_t>(sbb).first(100), fmtd::kSuperInfoOffset).ok());
  g_sink = fmtd::IncompatNames(sb.incompat_flags.get()).size() + fmtd::CompatRoNames(sb.compat_ro_flags.get()).size() +
           fmtd::UuidToString(fmtd::MetadataFsid(sb)).size();
  if (valid.ok()) {
    auto sys = fmtd::ParseSysChunkArray(sb);
    if (sys.ok()) {
      FUZZ_CHECK(!sys->empty());
      ubtrfs::alloc::ChunkMap map(sb.dev_item.devid.get(), sb.total_bytes.get());
      for (const auto& c : *sys) {
        FUZZ_CHECK(c.key.type == fmtd::kChunkItemKey);
        FUZZ_CHECK(c.chunk.size() >= sizeof(fmtd::Chunk) + sizeof(fmtd::Stripe));
        if (!map.AddChunk(c.key.offset, c.chunk, sb.sectorsize.get()).ok()) continue;
        const auto* info = map.Find(c.key.offset);
        FUZZ_CHECK(info != nullptr && info->logical == c.key.offset);
        auto m = map.Map(c.key.offset, std::min<uint64_t>(info->length, sb.sectorsize.get()));
        FUZZ_CHECK(m.ok() && m->size() == info->mirrors());
        auto past = map.Map(c.key.offset + info->length - 1, 2);
        (void)past;
      }
    }
  }

  // The full open over the small image. `img` is patched in place and put
  // back afterwards (cheaper than a fresh copy per run).
  static std::vector<uint8_t> img = Base().bytes;
  struct Restore {
    ~Restore() {
      const auto& base = Base();
      auto put_back = [&](uint64_t off, size_t n) { std::memcpy(img.data() + off, base.bytes.data() + off, n); };
      put_back(fmtd::kSuperInfoOffset, fmtd::kSuperInfoSize);
      for (uint64_t p : base.chunk_leaf) put_back(p, kNode);
      for (uint64_t p : base.root_leaf) put_back(p, kNode);
    }
  } restore;
  std::memcpy(img.data() + fmtd::kSuperInfoOffset, sbb.data(), sbb.size());
  auto overlay = [&](const std::vector<uint64_t>& copies, size_t from) {
    for (uint64_t phys : copies) {
      std::span<uint8_t> block(img.data() + phys, kNode);
      if (size > from) {
        const size_t n = std::min<size_t>(size - from, kBody);
        std::memcpy(block.data() + sizeof(fmtd::Header), data + from, n);
      }
      if (known_csum) FixTreeCsum(block, csum_type);
    }
  };
  overlay(Base().chunk_leaf, fmtd::kSuperInfoSize);
  overlay(Base().root_leaf, fmtd::kSuperInfoSize + kBody);

  ubtrfs::fs::VolumeOptions opts;
  opts.node_cache_bytes = 256 * 1024;
  auto vol = ubtrfs::fs::Volume::Open(ubtrfs::io::NewMemoryDevice("fuzz", img), opts);
  if (!vol.ok()) {
    FUZZ_CHECK(!vol.status().message().empty());
    return 0;
  }
  Exercise(**vol);
  return 0;
}
