// Roots of older commits, found by reading the metadata chunks block by
// block (ubtrfs/inspect.h FindRoots, `ubtrfs inspect find-root`), as
// btrfs-find-root finds them for `btrfs restore -t`: when the superblock's
// root tree and its backup roots are lost, a root tree block of an earlier
// generation that copy-on-write has not yet overwritten still leads to that
// commit's trees (RescueOptions::tree_root reads them).
//
// Of the blocks a tree owns, the highest-level one of each generation is
// that generation's root (a commit writes its tree's path up to the root).
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "format/ondisk.h"
#include "format/superblock.h"
#include "inspect/open_volume.h"
#include "tree/block_reader.h"
#include "txn/volume.h"
#include "ubtrfs/inspect.h"

namespace ubtrfs {
namespace {

using format::Header;

constexpr uint64_t kWindow = 1ull << 20;  // bytes read at a time

}  // namespace

Result<FindRootResult> FindRoots(const std::string& image, const OpenOptions& where, const FindRootOptions& o) {
  txn::VolumeOptions vo;
  vo.chunks_only = true;
  vo.node_cache_bytes = 1ull << 20;
  UB_ASSIGN_OR_RETURN(auto opened, inspect::OpenVolume(image, where, vo));
  txn::Volume& vol = *opened;
  const format::SuperBlock& sb = vol.super();
  FindRootResult r;
  r.warnings = vol.warnings();
  r.generation = sb.generation.get();
  if (o.tree == format::kRootTreeObjectid) {
    r.super_root = {sb.root.get(), sb.generation.get(), sb.root_level};
  } else if (o.tree == format::kChunkTreeObjectid) {
    r.super_root = {sb.chunk_root.get(), sb.chunk_root_generation.get(), sb.chunk_root_level};
  }
  const uint32_t step = vol.sectorsize(), nodesize = vol.nodesize();
  const uint8_t* fsid = format::MetadataFsid(sb);
  std::map<uint64_t, RootCandidate> best;  // generation -> its highest block
  std::vector<uint8_t> buf;
  for (const auto& [start, c] : vol.chunks().chunks()) {
    if (!(c.type & (format::kBlockGroupMetadata | format::kBlockGroupSystem))) continue;
    ++r.chunks_scanned;
    for (uint64_t at = start; at + nodesize <= start + c.length; at += kWindow) {
      const uint64_t len = std::min<uint64_t>(kWindow, start + c.length - at);
      buf.resize(len);
      // A window that does not read is tried block by block below, through
      // the reader's other copies.
      const bool whole = vol.chunk_io().Read(at, buf, 0).ok();
      if (!whole) ++r.windows_unread;
      r.bytes_scanned += len;
      for (uint64_t off = 0; off < len; off += whole ? step : nodesize) {
        const uint64_t bytenr = at + off;
        if (whole) {
          if (off + sizeof(Header) > len) break;
          Header h;
          std::memcpy(&h, buf.data() + off, sizeof h);
          if (h.bytenr.get() != bytenr || h.owner.get() != o.tree || h.level >= format::kMaxLevel ||
              std::memcmp(h.fsid, fsid, format::kFsidSize) != 0) {
            continue;
          }
        }
        // The whole block verified (checksum, structure), any copy.
        auto b = vol.reader()->Read(tree::BlockCheck{bytenr, -1, 0, {}});
        if (!b.ok() || (*b)->owner() != o.tree) continue;
        const RootCandidate cand{bytenr, (*b)->generation(), (*b)->level()};
        ++r.blocks_found;
        auto [it, fresh] = best.emplace(cand.generation, cand);
        if (!fresh && cand.level > it->second.level) it->second = cand;
      }
    }
  }
  for (auto it = best.rbegin(); it != best.rend(); ++it) r.roots.push_back(it->second);
  return r;
}

}  // namespace ubtrfs
