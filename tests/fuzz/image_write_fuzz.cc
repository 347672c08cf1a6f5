// libFuzzer target: open a whole (mutated) image writable, apply a few
// changes chosen by the input (creates, writes, renames, unlinks, xattrs,
// ...), commit, close; move every extent to a new place (balance by usage);
// cut the chunks' unused tails and move them up the device (resize
// --shrink's first steps); fix the device sizes and clear the UUID tree
// (rescue); then open the result again and read everything back.
// The image may be damaged in ways the reader accepted; writing into it must
// still never crash: each failure is a Status with a message (a failed
// change may abort the transaction and leave the view read-only).
//
// Input: the encoding of fuzz_image.h; its "ops" section is the script, one
// operation per opcode byte followed by its operand bytes (missing operand
// bytes read as 0). Seeds: corpus/image_write_fuzz.
#include <algorithm>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz_image.h"
#include "fuzz_script.h"
#include "format/ondisk.h"
#include "rescue/repairs.h"
#include "txn/extent_relocation.h"
#include "txn/relocate.h"
#include "txn/transaction.h"
#include "txn/volume.h"

namespace {

volatile uint64_t g_sink;

using ubtrfs_fuzz::Note;
using ubtrfs_fuzz::Script;
using ubtrfs_fuzz::State;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ubtrfs_fuzz::Decoded img;
  if (!ubtrfs_fuzz::Decode(data, size, &img)) return 0;
  uint64_t acc = 0;
  {
    auto fs = ubtrfs_fuzz::OpenDecoded(img, /*writable=*/true);
    if (!fs) return 0;
    State s;
    s.dirs.push_back(fs->Root());
    s.nodes.push_back(fs->Root());
    // The existing entries of the root directory are targets too.
    auto entries = fs->ReadDir(fs->Root());
    if (entries.ok()) {
      for (size_t i = 0; i < entries->size() && i < 16; ++i) {
        const auto& e = (*entries)[i];
        s.nodes.push_back(e.id);
        if (e.type == 4 /* DT_DIR */) s.dirs.push_back(e.id);
        s.names.push_back(e.name);
      }
    } else {
      ubtrfs_fuzz::CheckError(entries.status());
    }
    Script sc(img.ops);
    ubtrfs_fuzz::RunScript(*fs, sc, &s);
    Note(fs->Commit());
    acc += s.nodes.size();
  }  // the destructor commits whatever is left (or does nothing after an abort)

  // Then every data and metadata group emptied by moving its extents, as
  // `ubtrfs balance -dusage=100 -musage=100` does: the back references of a
  // damaged image lead the moves.
  {
    ubtrfs::txn::VolumeOptions vo;
    vo.writable = true;
    auto vol = ubtrfs::txn::Volume::Open(std::make_unique<ubtrfs_fuzz::SparseDevice>(img.pages), vo);
    ubtrfs::Result<std::unique_ptr<ubtrfs::txn::TxnManager>> txn = vol.status();
    if (vol.ok()) txn = ubtrfs::txn::TxnManager::Open(vol->get());
    if (txn.ok()) {
      std::vector<uint64_t> groups;
      (*txn)->space().ForEachGroup([&](const ubtrfs::alloc::BlockGroup& g) {
        const uint64_t kind = g.flags() & ubtrfs::format::kBlockGroupTypeMask;
        if (kind == ubtrfs::format::kBlockGroupData || kind == ubtrfs::format::kBlockGroupMetadata) {
          groups.push_back(g.start());
        }
      });
      ubtrfs::txn::RelocationStats stats;
      for (uint64_t g : groups) {
        auto gone = ubtrfs::txn::RelocateGroup(**txn, g, &stats);
        if (!gone.ok()) {
          ubtrfs_fuzz::CheckError(gone.status());
          break;
        }
      }
      acc += stats.data_extents + stats.tree_blocks;
      // resize --shrink's first steps: tails cut, copies to the top (not
      // after a move that failed half way: those changes are not committed).
      ubtrfs::txn::DeviceLayout layout(txn->get());
      uint64_t trimmed = 0;
      ubtrfs::Status st = (*txn)->HasChanges() ? ubtrfs::Status::Invalid("relocation left changes")
                                               : layout.TrimChunks(&trimmed);
      if (st.ok()) st = (*txn)->Commit();
      if (st.ok()) {
        ubtrfs::txn::CopyStats copied;
        for (const auto& stripe : layout.Stripes()) {
          const uint64_t to = layout.FindPlaceAbove(stripe);
          if (to == 0) continue;
          st = layout.MoveStripe(stripe.logical, stripe.index, to, &copied);
          if (st.ok()) st = (*txn)->Commit();
          if (!st.ok()) break;
        }
      }
      if (!st.ok() && st.message() != "relocation left changes") ubtrfs_fuzz::CheckError(st);
      acc += trimmed;
      // `rescue fix-device-size` and `rescue clear-uuid-tree` on what is
      // left (the UUID tree's blocks found in a damaged extent tree where
      // the tree itself does not read).
      if (st.ok()) {
        auto fixed = ubtrfs::rescue::FixDeviceSizeIn(**vol, **txn);
        ubtrfs::Status fs = fixed.ok() && fixed->changed() ? (*txn)->Commit() : fixed.status();
        if (!fs.ok()) ubtrfs_fuzz::CheckError(fs);
        auto cleared = ubtrfs::rescue::ClearUuidTreeIn(**vol, **txn);
        ubtrfs::Status cs = cleared.ok() && cleared->had_tree ? (*txn)->Commit() : cleared.status();
        if (!cs.ok()) ubtrfs_fuzz::CheckError(cs);
        if (cleared.ok()) acc += cleared->blocks_freed;
      }
      if (ubtrfs_fuzz::Verbose()) {
        std::fprintf(stderr, "relocated %zu groups: %llu data extents, %llu tree blocks, %zu left\n", groups.size(),
                     static_cast<unsigned long long>(stats.data_extents),
                     static_cast<unsigned long long>(stats.tree_blocks), stats.notes.size());
        for (const std::string& n : stats.notes) std::fprintf(stderr, "  %s\n", n.c_str());
      }
    } else {
      ubtrfs_fuzz::CheckError(txn.status());
    }
  }

  auto again = ubtrfs_fuzz::OpenDecoded(img, /*writable=*/false);
  if (!again) return 0;
  const ubtrfs_fuzz::WalkStats stats = ubtrfs_fuzz::WalkAll(*again);
  g_sink = acc + stats.checksum + stats.entries;
  return 0;
}
