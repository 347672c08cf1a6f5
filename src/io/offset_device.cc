#include "io/offset_device.h"
#include "io/rbd_device.h"

#include <blkid/blkid.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace ubtrfs::io {
namespace {

class WindowDevice final : public BlockDevice {
 public:
  WindowDevice(std::unique_ptr<BlockDevice> inner, uint64_t offset, uint64_t size)
      : inner_(std::move(inner)), offset_(offset), size_(size) {}
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    UB_RETURN_IF_ERROR(Check(offset, buf.size(), "read"));
    return inner_->ReadAt(offset_ + offset, buf);
  }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    UB_RETURN_IF_ERROR(Check(offset, buf.size(), "write"));
    return inner_->WriteAt(offset_ + offset, buf);
  }
  Status WriteGather(uint64_t offset, std::span<const std::span<const uint8_t>> pieces) override {
    uint64_t len = 0;
    for (const auto& p : pieces) len += p.size();
    UB_RETURN_IF_ERROR(Check(offset, len, "write"));
    return inner_->WriteGather(offset_ + offset, pieces);
  }
  Result<bool> CloneFrom(int src_fd, uint64_t src_off, uint64_t offset, uint64_t len) override {
    if (offset > size_ || len > size_ - offset) return false;
    return inner_->CloneFrom(src_fd, src_off, offset_ + offset, len);
  }
  Status Flush() override { return inner_->Flush(); }
  void StartWriteback() override { inner_->StartWriteback(); }
  uint64_t Size() const override { return size_; }
  std::string Name() const override {
    return inner_->Name() + " (from byte " + std::to_string(offset_) + ", " + std::to_string(size_) + " bytes)";
  }

 private:
  Status Check(uint64_t offset, uint64_t len, const char* what) const {
    if (offset > size_ || len > size_ - offset) {
      return Status::IoError(std::string(what) + " of " + std::to_string(len) + " bytes at " + std::to_string(offset) +
                             " past the end of " + Name());
    }
    return Status::Ok();
  }
  std::unique_ptr<BlockDevice> inner_;
  uint64_t offset_, size_;
};

// libblkid probes a file descriptor. Without the image's path, the
// device's first and last MiBs (where MBR, GPT and the backup GPT live) are
// copied into a memory file of its size for it.
Status CopyEdges(BlockDevice& dev, int fd, uint64_t size) {
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return Status::Error(errno, "ftruncate of the probe file");
  constexpr uint64_t kEdge = 1 << 20;
  std::vector<uint8_t> buf(kEdge);
  for (uint64_t at : {uint64_t{0}, size > kEdge ? size - kEdge : 0}) {
    const uint64_t n = std::min(kEdge, size - at);
    UB_RETURN_IF_ERROR(dev.ReadAt(at, std::span(buf.data(), n)));
    if (::pwrite(fd, buf.data(), n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) {
      return Status::Error(errno, "pwrite of the probe file");
    }
  }
  return Status::Ok();
}

// The partitions of `dev` (read through `path` when given).
Result<std::vector<PartitionEntry>> Probe(BlockDevice& dev, const std::string& path) {
  const uint64_t size = dev.Size();
  const int fd = path.empty() ? ::memfd_create("ubtrfs-ptable", MFD_CLOEXEC) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(errno, (path.empty() ? std::string("memfd_create") : path) + ": " + strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (path.empty()) UB_RETURN_IF_ERROR(CopyEdges(dev, fd, size));
  blkid_probe pr = blkid_new_probe();
  if (pr == nullptr) return Status::Error(ENOMEM, "blkid_new_probe");
  struct Freer {
    blkid_probe pr;
    ~Freer() { blkid_free_probe(pr); }
  } freer{pr};
  if (blkid_probe_set_device(pr, fd, 0, static_cast<blkid_loff_t>(size)) != 0) {
    return Status::Error(EIO, "libblkid cannot probe " + dev.Name());
  }
  blkid_probe_enable_partitions(pr, 1);
  blkid_probe_set_partitions_flags(pr, BLKID_PARTS_ENTRY_DETAILS);
  blkid_probe_enable_superblocks(pr, 0);
  if (blkid_do_fullprobe(pr) < 0) return Status::Error(EIO, "libblkid: probing " + dev.Name() + " failed");
  std::vector<PartitionEntry> out;
  blkid_partlist ls = blkid_probe_get_partitions(pr);
  if (ls == nullptr) return out;
  const int n = blkid_partlist_numof_partitions(ls);
  for (int i = 0; i < n; ++i) {
    blkid_partition p = blkid_partlist_get_partition(ls, i);
    if (p == nullptr) continue;
    PartitionEntry e;
    e.number = blkid_partition_get_partno(p);
    e.start = static_cast<uint64_t>(blkid_partition_get_start(p)) * 512;
    e.size = static_cast<uint64_t>(blkid_partition_get_size(p)) * 512;
    const char* t = blkid_partition_get_type_string(p);
    e.type = t ? t : std::to_string(blkid_partition_get_type(p));
    out.push_back(e);
  }
  return out;
}

}  // namespace

Result<std::vector<PartitionEntry>> ListPartitions(BlockDevice& inner, const std::string& path) {
  return Probe(inner, path);
}

Result<std::unique_ptr<BlockDevice>> OpenWindow(std::unique_ptr<BlockDevice> inner, const Placement& where) {
  uint64_t offset = where.offset, size = where.size;
  if (where.partition != 0) {
    if (where.offset != 0) return Status::Invalid("give a partition or an offset, not both");
    UB_ASSIGN_OR_RETURN(auto parts, Probe(*inner, where.path));
    if (parts.empty()) return Status::NotFound(inner->Name() + " has no partition table (GPT or MBR) libblkid knows");
    const PartitionEntry* hit = nullptr;
    std::string have;
    for (const auto& p : parts) {
      if (p.number == where.partition) hit = &p;
      have += (have.empty() ? "" : ", ") + std::to_string(p.number);
    }
    if (hit == nullptr) {
      return Status::NotFound(inner->Name() + " has no partition " + std::to_string(where.partition) +
                              " (it has " + have + ")");
    }
    offset = hit->start;
    size = hit->size;
  }
  const uint64_t total = inner->Size();
  if (offset > total) {
    return Status::Invalid("offset " + std::to_string(offset) + " is past the end of " + inner->Name() + " (" +
                           std::to_string(total) + " bytes)");
  }
  if (size == 0) size = total - offset;
  if (size > total - offset) {
    return Status::Invalid("the filesystem's window (" + std::to_string(offset) + " + " + std::to_string(size) +
                           " bytes) is past the end of " + inner->Name());
  }
  if (offset == 0 && size == total) return inner;
  return std::unique_ptr<BlockDevice>(std::make_unique<WindowDevice>(std::move(inner), offset, size));
}

Result<std::unique_ptr<BlockDevice>> OpenImage(const std::string& path, OpenFlags flags, const Placement& where) {
  UB_ASSIGN_OR_RETURN(auto dev, OpenDevice(path, flags));
  if (where.offset == 0 && where.partition == 0 && where.size == 0) return dev;
  Placement w = where;
  // (an RBD image has no host path for libblkid: its table is read through the device)
  if (w.path.empty() && !IsRbdPath(path)) w.path = path;
  return OpenWindow(std::move(dev), w);
}

}  // namespace ubtrfs::io
