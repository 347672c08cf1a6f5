// The public BlockDevice (ubtrfs/block_device.h) and the library's
// io::BlockDevice, each adapted to the other. They are kept apart so that
// the internal interface (gathered writes, writeback hints) can change
// without changing the library's ABI.
#include "fs/block_device_api.h"

#include "fs/open_device.h"
#include "io/block_device.h"
#include "io/offset_device.h"
#include "txn/devices.h"
#include "ubtrfs/devices.h"

namespace ubtrfs {

BlockDevice::~BlockDevice() = default;

namespace {

// A caller's device, as the library uses devices.
class FromPublic final : public io::BlockDevice {
 public:
  explicit FromPublic(std::unique_ptr<ubtrfs::BlockDevice> d) : d_(std::move(d)) {}
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override { return d_->ReadAt(offset, buf); }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override { return d_->WriteAt(offset, buf); }
  Status Flush() override { return d_->Flush(); }
  uint64_t Size() const override { return d_->Size(); }
  std::string Name() const override { return d_->Name(); }

 private:
  std::unique_ptr<ubtrfs::BlockDevice> d_;
};

// One of the library's devices handed to a caller; Filesystem::Open takes
// the inner device back out, so nothing is lost on the way.
class ToPublic final : public ubtrfs::BlockDevice {
 public:
  explicit ToPublic(std::unique_ptr<io::BlockDevice> d) : d_(std::move(d)) {}
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override { return d_->ReadAt(offset, buf); }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override { return d_->WriteAt(offset, buf); }
  Status Flush() override { return d_->Flush(); }
  uint64_t Size() const override { return d_->Size(); }
  std::string Name() const override { return d_->Name(); }
  std::unique_ptr<io::BlockDevice> Take() { return std::move(d_); }

 private:
  std::unique_ptr<io::BlockDevice> d_;
};

}  // namespace

std::unique_ptr<io::BlockDevice> FromPublicDevice(std::unique_ptr<ubtrfs::BlockDevice> d) {
  if (!d) return nullptr;
  if (auto* own = dynamic_cast<ToPublic*>(d.get())) return own->Take();
  return std::make_unique<FromPublic>(std::move(d));
}

Result<std::unique_ptr<ubtrfs::BlockDevice>> OpenBlockDevice(const std::string& path, bool writable) {
  UB_ASSIGN_OR_RETURN(auto dev, io::OpenDevice(path, io::OpenFlags{writable}));
  return std::unique_ptr<ubtrfs::BlockDevice>(std::make_unique<ToPublic>(std::move(dev)));
}

std::vector<std::string> SplitDeviceList(const std::string& spec) { return txn::SplitDeviceList(spec); }

Result<std::unique_ptr<Filesystem>> Filesystem::Open(std::unique_ptr<ubtrfs::BlockDevice> device,
                                                     const OpenOptions& options) {
  if (!device) return Status::Invalid("Filesystem::Open: no device");
  std::unique_ptr<io::BlockDevice> dev = FromPublicDevice(std::move(device));
  if (options.offset != 0 || options.partition != 0) {
    io::Placement where;
    where.offset = options.offset;
    where.partition = options.partition;
    UB_ASSIGN_OR_RETURN(dev, io::OpenWindow(std::move(dev), where));
  }
  return OpenOnDevice(std::move(dev), options);
}

}  // namespace ubtrfs
