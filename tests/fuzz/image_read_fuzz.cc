// libFuzzer target: open a whole (mutated) image and read everything a user
// can reach: every directory (bounded depth and entry count), stat of every
// entry, every regular file in full (bounded bytes), every symlink target,
// every xattr. Input: the encoding of fuzz_image.h (seeds:
// corpus/image_read_fuzz). Each failure must be a Status with a message.
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
  const ubtrfs_fuzz::WalkStats stats = ubtrfs_fuzz::WalkAll(*fs);
  g_sink = stats.checksum + stats.entries + stats.bytes + stats.errors;
  return 0;
}
