#include "support/chunk_layout.h"

#include <gtest/gtest.h>

#include <memory>

#include "format/ondisk.h"
#include "io/block_device.h"
#include "tree/cursor.h"
#include "txn/volume.h"

namespace ubtrfs_test {

using namespace ubtrfs;
using namespace ubtrfs::format;

int ChunkLayout::Count(uint64_t kind) const {
  int n = 0;
  for (const auto& [l, t] : chunks) n += (t & kBlockGroupTypeMask) == kind;
  return n;
}

std::string ChunkLayout::Describe() const {
  std::string s;
  for (const auto& [l, t] : chunks) {
    s += std::to_string(l) + ":" + (t & kBlockGroupData ? "D" : t & kBlockGroupMetadata ? "M" : "S") + " ";
  }
  return s + "| " + std::to_string(dev_extents) + " dev extents, " + std::to_string(dev_bytes_used) + " used";
}

ChunkLayout ReadLayout(const std::vector<std::string>& images) {
  ChunkLayout out;
  std::vector<std::unique_ptr<io::BlockDevice>> devs;
  for (const auto& img : images) {
    auto dev = io::OpenFileDevice(img);
    EXPECT_TRUE(dev.ok()) << img << ": " << dev.status().ToString();
    if (!dev.ok()) return out;
    devs.push_back(std::move(*dev));
  }
  auto opened = txn::Volume::Open(std::move(devs), txn::VolumeOptions{});
  EXPECT_TRUE(opened.ok()) << opened.status().ToString();
  if (!opened.ok()) return out;
  txn::Volume& vol = **opened;
  for (const auto& [logical, c] : vol.chunks().chunks()) {
    out.chunks[logical] = c.type;
    out.stripes += c.stripes.size();
    out.stripe_bytes += c.stripes.size() * c.stripe_size;
  }
  for (const auto& [devid, item] : vol.dev_items()) out.dev_bytes_used += item.bytes_used.get();
  auto dev = vol.FindRoot(kDevTreeObjectid);
  EXPECT_TRUE(dev.ok());
  if (!dev.ok()) return out;
  tree::Cursor c(vol.reader(), dev->ref);
  EXPECT_TRUE(c.SeekFirst().ok());
  while (c.Valid()) {
    if (c.key().type == kDevExtentKey) {
      ++out.dev_extents;
      out.dev_extent_bytes += reinterpret_cast<const DevExtent*>(c.data().data())->length.get();
    }
    if (!c.Next().ok()) break;
  }
  return out;
}

ChunkLayout ReadLayout(const std::string& img) { return ReadLayout(std::vector<std::string>{img}); }

void ExpectConsistent(const ChunkLayout& l, const std::string& what) {
  EXPECT_EQ(l.dev_extents, l.stripes) << what << ": " << l.Describe();
  EXPECT_EQ(l.dev_extent_bytes, l.stripe_bytes) << what << ": " << l.Describe();
  EXPECT_EQ(l.dev_bytes_used, l.dev_extent_bytes) << what << ": " << l.Describe();
}

}  // namespace ubtrfs_test
