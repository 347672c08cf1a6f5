// libFuzzer target: open a whole (mutated) image writable, apply a few
// changes chosen by the input (creates, writes, renames, unlinks, xattrs,
// ...), commit, close, then open the result again and read everything back.
// The image may be damaged in ways the reader accepted; writing into it must
// still never crash: each failure is a Status with a message (a failed
// change may abort the transaction and leave the view read-only).
//
// Input: the encoding of fuzz_image.h; its "ops" section is the script, one
// operation per opcode byte followed by its operand bytes (missing operand
// bytes read as 0). Seeds: corpus/image_write_fuzz.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz_image.h"
#include "fuzz_script.h"

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

  auto again = ubtrfs_fuzz::OpenDecoded(img, /*writable=*/false);
  if (!again) return 0;
  const ubtrfs_fuzz::WalkStats stats = ubtrfs_fuzz::WalkAll(*again);
  g_sink = acc + stats.checksum + stats.entries;
  return 0;
}
