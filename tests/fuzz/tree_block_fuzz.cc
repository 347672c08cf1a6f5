// libFuzzer target: tree block verification (tree::VerifyTreeBlock,
// tree::TreeBlock::Parse) and every TreeBlock accessor over every slot of a
// block that parses.
//
// Input layout:
//   byte 0      control
//                 bit 0    node size 16384 (else 4096)
//                 bits 1-2 checksum type (crc32c, xxhash64, sha256, blake2b)
//                 bit 3    recompute the checksum into the block before
//                          verifying, so the structural checks run
//                 bit 4    the referrer states the level (the header's)
//                 bit 5    the referrer states the generation (the header's)
//                 bit 6    the referrer states a first key (the raw key in slot 0)
//                 bit 7    the referrer's bytenr disagrees with the header
//   bytes 1...  the block, zero-padded or truncated to the node size
// The seeds in tests/fuzz/corpus/tree_block_fuzz/ are real mkfs.btrfs blocks
// behind a control byte.
//
// Beyond "no crash", the target checks what Parse promises: a block that
// parses has strictly ascending keys, every item's data inside the block, no
// zero or unaligned child pointers, and binary searches that agree with a
// linear scan. A violation aborts (and so is reported as a crash).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "tree/tree_block.h"

namespace {

using ubtrfs::format::Key;
namespace fmtd = ubtrfs::format;
namespace tree = ubtrfs::tree;

[[noreturn]] void Violated(const char* what, int line) {
  std::fprintf(stderr, "tree_block_fuzz: invariant violated at line %d: %s\n", line, what);
  std::abort();
}
#define FUZZ_CHECK(cond)                      \
  do {                                        \
    if (!(cond)) Violated(#cond, __LINE__);   \
  } while (0)

volatile uint64_t g_sink;

Key Succ(Key k) {
  if (k.offset != UINT64_MAX) return Key{k.objectid, k.type, k.offset + 1};
  if (k.type != UINT8_MAX) return Key{k.objectid, static_cast<uint8_t>(k.type + 1), 0};
  return Key{k.objectid + 1, 0, 0};  // callers never pass Key::Max()
}
Key Pred(Key k) {
  if (k.offset != 0) return Key{k.objectid, k.type, k.offset - 1};
  if (k.type != 0) return Key{k.objectid, static_cast<uint8_t>(k.type - 1), UINT64_MAX};
  return Key{k.objectid - 1, UINT8_MAX, UINT64_MAX};  // callers never pass Key::Min()
}

// The searches' contracts, checked at the answer (keys are known ascending).
void CheckSearches(const tree::TreeBlock& b, const Key& k) {
  const int n = b.nritems();
  const int s = b.LastSlotAtOrBefore(k);
  FUZZ_CHECK(s >= -1 && s < n);
  FUZZ_CHECK(s == -1 || b.key(s) <= k);
  FUZZ_CHECK(s + 1 == n || b.key(s + 1) > k);
  const int f = b.FirstSlotAtOrAfter(k);
  FUZZ_CHECK(f >= 0 && f <= n);
  FUZZ_CHECK(f == n || b.key(f) >= k);
  FUZZ_CHECK(f == 0 || b.key(f - 1) < k);
}

void Exercise(const tree::TreeBlock& b, const tree::BlockCheck& check, uint32_t nodesize, const Key& probe) {
  FUZZ_CHECK(b.bytes().size() == nodesize);
  FUZZ_CHECK(b.bytenr() == check.bytenr);
  FUZZ_CHECK(b.level() >= 0 && b.level() < fmtd::kMaxLevel);
  FUZZ_CHECK(b.is_leaf() == (b.level() == 0));
  if (check.level >= 0) FUZZ_CHECK(b.level() == check.level);
  if (check.generation != 0) FUZZ_CHECK(b.generation() == check.generation);
  const int n = b.nritems();
  FUZZ_CHECK(n >= 0);
  if (check.first_key) FUZZ_CHECK(n > 0 && b.key(0) == *check.first_key);
  if (!b.is_leaf()) FUZZ_CHECK(n > 0);

  const uint8_t* const begin = b.bytes().data();
  const uint8_t* const end = begin + b.bytes().size();
  const size_t headers = b.is_leaf() ? sizeof(fmtd::Item) : sizeof(fmtd::KeyPtr);
  const uint8_t* const body_end = begin + sizeof(fmtd::Header) + size_t(n) * headers;
  FUZZ_CHECK(body_end <= end);

  uint64_t acc = b.owner() + b.generation();
  for (int i = 0; i < n; ++i) {
    const Key k = b.key(i);
    if (i > 0) FUZZ_CHECK(b.key(i - 1) < k);
    if (b.is_leaf()) {
      auto d = b.item_data(i);
      FUZZ_CHECK(d.size() == b.item_size(i));
      FUZZ_CHECK(d.data() == begin + sizeof(fmtd::Header) + b.item_offset(i));
      FUZZ_CHECK(d.data() >= body_end || d.empty());
      FUZZ_CHECK(d.data() + d.size() <= end);
      for (uint8_t c : d) acc += c;  // every byte, so ASan sees any overrun
    } else {
      const uint64_t child = b.child_bytenr(i);
      FUZZ_CHECK(child != 0 && child % 4096 == 0);
      acc += child ^ b.child_generation(i);
    }
    // Exact hits, and the keys right next to each one.
    FUZZ_CHECK(b.LastSlotAtOrBefore(k) == i);
    FUZZ_CHECK(b.FirstSlotAtOrAfter(k) == i);
    if (k != Key::Min()) CheckSearches(b, Pred(k));
    if (k != Key::Max()) CheckSearches(b, Succ(k));
  }
  if (b.is_leaf()) {
    // Free space: what lies between the item headers and the lowest item data.
    const uint32_t data_start = n == 0 ? b.LeafSpace() : b.item_offset(n - 1);
    FUZZ_CHECK(b.LeafSpace() == nodesize - sizeof(fmtd::Header));
    FUZZ_CHECK(b.LeafFreeSpace() <= b.LeafSpace());
    FUZZ_CHECK(b.LeafFreeSpace() == data_start - size_t(n) * sizeof(fmtd::Item));
  } else {
    FUZZ_CHECK(n <= b.MaxPtrs());
  }
  FUZZ_CHECK(b.FirstSlotAtOrAfter(Key::Min()) == 0);
  FUZZ_CHECK(b.LastSlotAtOrBefore(Key::Max()) == n - 1);
  CheckSearches(b, Key::Min());
  CheckSearches(b, Key::Max());
  CheckSearches(b, probe);
  g_sink = acc;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t ctl = data[0];
  const uint32_t nodesize = (ctl & 1) ? 16384 : 4096;
  const uint16_t csum_type = (ctl >> 1) & 3;
  std::vector<uint8_t> buf(nodesize, 0);
  std::memcpy(buf.data(), data + 1, std::min<size_t>(size - 1, nodesize));

  const auto* h = reinterpret_cast<const fmtd::Header*>(buf.data());
  tree::TreeParams params;
  params.nodesize = nodesize;
  params.csum_type = csum_type;
  std::memcpy(params.fsid, h->fsid, fmtd::kFsidSize);
  tree::BlockCheck check;
  check.bytenr = h->bytenr.get() + ((ctl & 0x80) ? nodesize : 0);
  if (ctl & 0x10) check.level = h->level;
  if (ctl & 0x20) check.generation = h->generation.get();
  if (ctl & 0x40) {
    check.first_key = Key::From(*reinterpret_cast<const fmtd::DiskKey*>(buf.data() + sizeof(fmtd::Header)));
  }
  if (ctl & 0x08) {
    auto c = fmtd::ComputeCsum(csum_type, std::span<const uint8_t>(buf).subspan(fmtd::kCsumSize));
    std::memcpy(buf.data(), c.data(), fmtd::kCsumSize);
  }
  // A probe key for the searches: the last 17 input bytes, if there are enough.
  Key probe = Key::Min();
  if (size >= 1 + sizeof(fmtd::DiskKey)) {
    probe = Key::From(*reinterpret_cast<const fmtd::DiskKey*>(data + size - sizeof(fmtd::DiskKey)));
  }

  // A buffer of the wrong size never verifies.
  FUZZ_CHECK(!tree::VerifyTreeBlock(std::span<const uint8_t>(buf).first(nodesize - 1), params, check).ok());

  const ubtrfs::Status verified = tree::VerifyTreeBlock(buf, params, check);
  auto parsed = tree::TreeBlock::Parse(tree::BlockBuffer::CopyOf(buf), params, check);
  FUZZ_CHECK(verified.ok() == parsed.ok());
  if (!parsed.ok()) {
    // Errors name the block.
    const ubtrfs::Status st = parsed.status();
    FUZZ_CHECK(st.message().rfind("tree block " + std::to_string(check.bytenr) + ": ", 0) == 0);
    FUZZ_CHECK(st.message() == verified.message());
    return 0;
  }
  Exercise(**parsed, check, nodesize, probe);
  return 0;
}
