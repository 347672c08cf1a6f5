#include "txn/super_copies.h"

#include <cstring>

#include "format/superblock.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

std::vector<SuperCopyState> CheckSuperCopies(Volume& vol) {
  const SuperBlock& want = vol.super();
  std::vector<SuperCopyState> out;
  std::vector<uint8_t> buf(kSuperInfoSize);
  for (uint64_t devid : vol.devices().Devids()) {
    if (vol.IsSeedDevice(devid)) continue;
    io::BlockDevice* dev = vol.devices().Get(devid);
    for (int m = 0; m < kSuperMirrorMax; ++m) {
      SuperCopyState c;
      c.devid = devid;
      c.device = dev->Name();
      c.mirror = m;
      c.bytenr = SuperblockOffset(m);
      if (c.bytenr + kSuperInfoSize > dev->Size()) break;
      if (Status st = dev->ReadAt(c.bytenr, buf); !st.ok()) {
        c.problem = st.message();
      } else if (Status v = ValidateSuperblock(buf, c.bytenr); !v.ok()) {
        // (without its "superblock at N: ", which the caller's line says)
        const std::string where = "superblock at " + std::to_string(c.bytenr) + ": ";
        c.problem = v.message().starts_with(where) ? v.message().substr(where.size()) : v.message();
      } else {
        const auto* sb = reinterpret_cast<const SuperBlock*>(buf.data());
        if (std::memcmp(sb->fsid, want.fsid, kFsidSize) != 0) {
          c.problem = "fsid " + UuidToString(sb->fsid);
        } else if (sb->dev_item.devid.get() != devid) {
          c.problem = "devid " + std::to_string(sb->dev_item.devid.get());
        } else {
          c.valid = true;
          c.generation = sb->generation.get();
          if (c.generation != want.generation.get()) {
            c.problem = "generation " + std::to_string(c.generation) + ", expected " +
                        std::to_string(want.generation.get());
          }
        }
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace ubtrfs::txn
