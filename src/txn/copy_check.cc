#include "txn/copy_check.h"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "tree/cursor.h"
#include "tree/tree_block.h"
#include "txn/volume.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

namespace {

constexpr size_t kMaxErrorLines = 100;

void Note(CopyCheck* check, std::string line) {
  if (check->errors.size() < kMaxErrorLines) check->errors.push_back(std::move(line));
}

// Verifies one unit (a tree block or a data sector) in `bytes`; "" when good.
using Verifier = std::function<std::string(std::span<const uint8_t> bytes)>;

// `unit` (inside the caller's buffer, at `at`) failed with `why`: the first
// copy of the chunk that verifies replaces it.
void Repair(Volume& vol, uint64_t at, std::span<uint8_t> unit, const std::string& name, const std::string& why,
            const Verifier& verify, CopyCheck* check) {
  alloc::ChunkIo& io = vol.chunk_io();
  std::vector<uint8_t> other(unit.size());
  for (int m = 0; m < io.NumMirrors(at); ++m) {
    if (!io.Read(at, other, m).ok() || !verify(other).empty()) continue;
    std::memcpy(unit.data(), other.data(), unit.size());
    ++check->repaired;
    Note(check, name + ": " + why + "; copied from copy " + std::to_string(m + 1) + ", which verifies");
    return;
  }
  ++check->unrecoverable;
  Note(check, name + ": " + why + "; no copy verifies, copied as read");
}

Status TreeBlocks(Volume& vol, uint64_t logical, std::span<uint8_t> buf, CopyCheck* check) {
  auto root = vol.FindRoot(kExtentTreeObjectid);
  if (!root.ok()) return root.status().WithContext("verifying a copy: extent tree");
  const uint32_t nodesize = vol.nodesize();
  const uint64_t end = logical + buf.size();
  const tree::TreeParams& params = vol.reader()->params();
  tree::Cursor cur(vol.source(), root->ref);
  UB_RETURN_IF_ERROR(cur.Seek(Key{logical, 0, 0}).WithContext("verifying a copy: extent tree"));
  while (cur.Valid() && cur.key().objectid < end) {
    const Key k = cur.key();
    // A tree block's level: from a skinny METADATA_ITEM's key, or a full
    // EXTENT_ITEM's tree block info; -1 for anything else.
    int level = -1;
    if (k.type == kMetadataItemKey) {
      level = static_cast<int>(k.offset);
    } else if (k.type == kExtentItemKey && cur.data().size() >= sizeof(ExtentItem) + sizeof(TreeBlockInfo) &&
               (reinterpret_cast<const ExtentItem*>(cur.data().data())->flags.get() & kExtentFlagTreeBlock)) {
      level = reinterpret_cast<const TreeBlockInfo*>(cur.data().data() + sizeof(ExtentItem))->level;
    }
    if (level >= 0 && k.objectid + nodesize <= end) {  // else not wholly in this read
      const tree::BlockCheck want{k.objectid, level, 0, {}};
      const Verifier verify = [&](std::span<const uint8_t> bytes) {
        Status st = tree::VerifyTreeBlock(bytes, params, want);
        return st.ok() ? std::string() : st.message();
      };
      std::span<uint8_t> unit = buf.subspan(k.objectid - logical, nodesize);
      if (std::string why = verify(unit); !why.empty()) {
        Repair(vol, k.objectid, unit, "tree block " + std::to_string(k.objectid), why, verify, check);
      }
    }
    UB_RETURN_IF_ERROR(cur.Next().WithContext("verifying a copy: extent tree"));
  }
  return Status::Ok();
}

Status DataSectors(Volume& vol, uint64_t logical, std::span<uint8_t> buf, CopyCheck* check) {
  const uint32_t ss = vol.sectorsize();
  const uint16_t type = vol.csum_type();
  const size_t csize = CsumSize(type);
  const size_t n = buf.size() / ss;
  std::vector<uint8_t> csums;
  std::vector<bool> present;
  UB_RETURN_IF_ERROR(vol.LookupCsums(logical, n, &csums, &present).WithContext("verifying a copy: csum tree"));
  for (size_t i = 0; i < n; ++i) {
    if (!present[i]) continue;
    const uint8_t* want = csums.data() + i * csize;
    const Verifier verify = [&](std::span<const uint8_t> bytes) {
      return VerifyCsum(type, bytes, want) ? std::string() : std::string("checksum mismatch");
    };
    std::span<uint8_t> unit = buf.subspan(i * ss, ss);
    if (std::string why = verify(unit); !why.empty()) {
      Repair(vol, logical + i * ss, unit, "data sector at logical " + std::to_string(logical + i * ss), why, verify,
             check);
    }
  }
  return Status::Ok();
}

}  // namespace

void VerifyCopy(Volume& vol, uint64_t logical, std::span<uint8_t> buf, CopyCheck* check) {
  const alloc::ChunkInfo* c = vol.chunks().Find(logical);
  if (c == nullptr) return;
  // A tree that cannot be read leaves the range unverified, not the move
  // undone: replacing a lost device must not hinge on an unrelated leaf.
  auto unverified = [&](const Status& st) {
    if (!st.ok()) Note(check, "[" + std::to_string(logical) + ", +" + std::to_string(buf.size()) +
                                  ") copied unverified: " + st.ToString());
  };
  if (c->type & (kBlockGroupMetadata | kBlockGroupSystem)) unverified(TreeBlocks(vol, logical, buf, check));
  if (c->type & kBlockGroupData) unverified(DataSectors(vol, logical, buf, check));
}

}  // namespace ubtrfs::txn
