// libFuzzer target: open a whole (mutated) image and read everything a user
// can reach: every directory (bounded depth and entry count), stat of every
// entry, every regular file in full (bounded bytes), every symlink target,
// every xattr; then ask what `ubtrfs inspect` asks of it (which files hold
// each data extent, the paths of inodes and subvolumes). Input: the
// encoding of fuzz_image.h (seeds: corpus/image_read_fuzz). Each failure
// must be a Status with a message.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "format/ondisk.h"
#include "fuzz_image.h"
#include "inspect/inode_paths.h"
#include "inspect/logical_resolve.h"
#include "tree/cursor.h"
#include "txn/volume.h"

namespace {
volatile uint64_t g_sink;

namespace fmtd = ubtrfs::format;

// The extent tree's first data extents, each resolved to its files; the
// paths of the top level's first inodes and of every subvolume.
uint64_t InspectAll(const ubtrfs_fuzz::Decoded& img) {
  ubtrfs::txn::VolumeOptions vo;
  vo.node_cache_bytes = 4ull << 20;
  if (img.flags & ubtrfs_fuzz::kRescueAll) (void)ubtrfs::ParseRescueOptions("all", &vo.rescue);
  auto vol = ubtrfs::txn::Volume::Open(std::make_unique<ubtrfs_fuzz::SparseDevice>(img.pages), vo);
  if (!vol.ok()) {
    ubtrfs_fuzz::CheckError(vol.status());
    return 0;
  }
  std::vector<uint64_t> addresses, subvols;
  auto walk = [&](uint64_t tree, auto&& take) {
    auto root = (*vol)->FindRoot(tree);
    if (!root.ok()) return ubtrfs_fuzz::CheckError(root.status());
    ubtrfs::tree::Cursor c((*vol)->source(), root->ref);
    ubtrfs::Status st = c.SeekFirst();
    for (int n = 0; st.ok() && c.Valid() && n < 4096 && take(c.key()); st = c.Next(), ++n) {
    }
    if (!st.ok()) ubtrfs_fuzz::CheckError(st);
  };
  walk(fmtd::kExtentTreeObjectid, [&](const ubtrfs::format::Key& k) {
    if (k.type == fmtd::kExtentItemKey) addresses.push_back(k.objectid + k.offset / 2);
    return addresses.size() < 16;
  });
  uint64_t sum = 0;
  for (uint64_t a : addresses) {
    ubtrfs::LogicalResolution out;
    const ubtrfs::Status st = ubtrfs::inspect::ResolveLogicalIn(vol->get(), a, {}, &out);
    if (!st.ok()) ubtrfs_fuzz::CheckError(st);
    for (const auto& r : out.refs) {
      for (const auto& p : r.paths) sum += p.size();
    }
    sum += out.refs.size() + out.errors.size();
  }
  ubtrfs::inspect::PathResolver paths(vol->get());
  for (uint64_t ino = fmtd::kFirstFreeObjectid; ino < fmtd::kFirstFreeObjectid + 32; ++ino) {
    auto p = paths.InodePaths(fmtd::kFsTreeObjectid, ino);
    if (p.ok()) sum += p->size();
    else ubtrfs_fuzz::CheckError(p.status());
  }
  {
    ubtrfs::tree::Cursor c((*vol)->source(), (*vol)->root_tree());
    ubtrfs::Status st = c.SeekFirst();
    for (; st.ok() && c.Valid() && subvols.size() < 64; st = c.Next()) {
      if (c.key().type == fmtd::kRootItemKey && c.key().objectid >= fmtd::kFirstFreeObjectid) {
        subvols.push_back(c.key().objectid);
      }
    }
    if (!st.ok()) ubtrfs_fuzz::CheckError(st);
  }
  for (uint64_t id : subvols) {
    auto p = paths.SubvolPath(id);
    if (p.ok()) sum += p->size();
    else ubtrfs_fuzz::CheckError(p.status());
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ubtrfs_fuzz::Decoded img;
  if (!ubtrfs_fuzz::Decode(data, size, &img)) return 0;
  auto fs = ubtrfs_fuzz::OpenDecoded(img, /*writable=*/false);
  if (!fs) return 0;
  const ubtrfs_fuzz::WalkStats stats = ubtrfs_fuzz::WalkAll(*fs);
  fs.reset();
  g_sink = stats.checksum + stats.entries + stats.bytes + stats.errors + InspectAll(img);
  return 0;
}
