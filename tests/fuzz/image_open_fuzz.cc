// libFuzzer target: open a whole (mutated) image. The input is a real small
// image in the encoding of fuzz_image.h (seeds: corpus/image_open_fuzz, built
// by make_corpus.sh from ubtrfs mkfs and mkfs.btrfs images). An image is
// either opened -- then its summary, root directory and statfs answer -- or
// refused with a Status that says why; never a crash, hang or sanitizer
// report.
#include <cstddef>
#include <cstdint>

#include "fuzz_image.h"

namespace {
volatile uint64_t g_sink;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ubtrfs_fuzz::Decoded img;
  if (!ubtrfs_fuzz::Decode(data, size, &img)) return 0;
  auto fs = ubtrfs_fuzz::OpenDecoded(img, /*writable=*/false);
  if (!fs) return 0;
  uint64_t acc = 0;
  const ubtrfs::FsInfo info = fs->Info();
  FUZZ_CHECK(info.nodesize >= 4096 && info.sectorsize >= 4096);
  acc += info.generation + info.label.size() + info.fsid.size() + info.csum_type.size();
  for (const auto& w : fs->Warnings()) FUZZ_CHECK(!w.empty());
  auto st = fs->GetStat(fs->Root());
  if (st.ok()) {
    acc += st->mode;
  } else {
    ubtrfs_fuzz::CheckError(st.status());
  }
  auto entries = fs->ReadDir(fs->Root());
  if (entries.ok()) {
    acc += entries->size();
  } else {
    ubtrfs_fuzz::CheckError(entries.status());
  }
  auto sf = fs->StatFs();
  if (sf.ok()) {
    acc += sf->free_bytes;
  } else {
    ubtrfs_fuzz::CheckError(sf.status());
  }
  g_sink = acc;
  return 0;
}
