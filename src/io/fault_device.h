// Fault injection: a device that forwards to another and fails chosen reads,
// writes or flushes -- the Nth one from now, every one after the next N, or
// every one touching a byte range -- with EIO (or another errno), or reports
// a full device (ENOSPC) for writes. Failed operations do not reach the
// device below. Rules can be added and cleared while a filesystem uses the
// device (hand it over with NewUnownedDevice() from recording_device.h).
#ifndef UBTRFS_IO_FAULT_DEVICE_H_
#define UBTRFS_IO_FAULT_DEVICE_H_

#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/block_device.h"

namespace ubtrfs::io {

enum class FaultOp { kRead, kWrite, kFlush };

class FaultDevice final : public BlockDevice {
 public:
  // Forwards to `inner`, which the caller keeps alive longer.
  explicit FaultDevice(BlockDevice* inner) : inner_(inner) {}
  // Forwards to `inner`, which it owns.
  explicit FaultDevice(std::unique_ptr<BlockDevice> inner) : owned_(std::move(inner)), inner_(owned_.get()) {}

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  void StartWriteback() override { inner_->StartWriteback(); }
  uint64_t Size() const override { return inner_->Size(); }
  std::string Name() const override { return inner_->Name(); }

  // Fails the nth operation of this kind from now (n = 1: the next one), once.
  void FailNth(FaultOp op, uint64_t n, int error = EIO);
  // Fails every operation of this kind after the next n (n = 0: all of them).
  void FailAfter(FaultOp op, uint64_t n, int error = EIO);
  // Fails every read or write that touches [offset, offset + len).
  void FailRange(FaultOp op, uint64_t offset, uint64_t len, int error = EIO);
  // A full device: every write from now fails with ENOSPC.
  void SetFull(bool full);
  // Removes every rule (the device works again).
  void Clear();

  // Operations seen (including failed ones), and faults injected.
  uint64_t reads() const;
  uint64_t writes() const;
  uint64_t flushes() const;
  uint64_t faults() const;
  // The message of the last injected fault ("" when none).
  std::string last_fault() const;

 private:
  struct Rule {
    enum class Kind { kNth, kAfter, kRange } kind = Kind::kNth;
    FaultOp op = FaultOp::kRead;
    uint64_t at = 0;  // kNth: the op count that fails; kAfter: counts above this fail
    uint64_t offset = 0, len = 0;
    int error = EIO;
    bool used = false;
  };
  // Counts the operation and returns the injected error, if any.
  Status Check(FaultOp op, uint64_t offset, uint64_t len);
  uint64_t& Counter(FaultOp op);

  std::unique_ptr<BlockDevice> owned_;
  BlockDevice* inner_;
  mutable std::mutex mu_;
  std::vector<Rule> rules_;
  bool full_ = false;
  uint64_t reads_ = 0, writes_ = 0, flushes_ = 0, faults_ = 0;
  std::string last_fault_;
};

const char* FaultOpName(FaultOp op);

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_FAULT_DEVICE_H_
