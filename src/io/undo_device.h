// A device that remembers what every write overwrote, until told to forget,
// so that a transaction that is given up can leave the image byte for byte
// as it was: ubtrfs writes file data into free space before the commit, and
// a discarded edit must not leave even that behind (`ubtrfs edit` is all or
// nothing). The old bytes are kept in memory, once per byte.
#ifndef UBTRFS_IO_UNDO_DEVICE_H_
#define UBTRFS_IO_UNDO_DEVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "io/block_device.h"

namespace ubtrfs::io {

class UndoDevice final : public BlockDevice {
 public:
  explicit UndoDevice(std::unique_ptr<BlockDevice> inner) : inner_(std::move(inner)) {}

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override { return inner_->ReadAt(offset, buf); }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override { return inner_->Flush(); }
  void StartWriteback() override { inner_->StartWriteback(); }
  uint64_t Size() const override { return inner_->Size(); }
  std::string Name() const override { return inner_->Name(); }

  // The writes so far are to stay (a commit made them durable).
  void Forget();
  // Puts back every byte written since the last Forget, then flushes.
  Status Rollback();
  // Bytes of old contents held.
  uint64_t held_bytes() const;

 private:
  std::unique_ptr<BlockDevice> inner_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::vector<uint8_t>> old_;  // disjoint ranges: start -> the bytes there before
  uint64_t held_ = 0;
};

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_UNDO_DEVICE_H_
