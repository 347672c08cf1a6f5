// Kernel views of multi-device image sets: a loop device per image, btrfs
// check over them, and a mount of the set (tests skip where loop mounts are
// not available: LoopMountsAvailable).
#ifndef UBTRFS_TESTS_SUPPORT_ARRAY_MOUNT_H_
#define UBTRFS_TESTS_SUPPORT_ARRAY_MOUNT_H_

#include <mutex>
#include <string>
#include <vector>

#include "io/recording_device.h"
#include "support/test_util.h"

namespace ubtrfs::txn {
class Volume;
}

namespace ubtrfs_test {

class ArrayMount {
 public:
  ArrayMount() = default;
  ArrayMount(const ArrayMount&) = delete;
  ArrayMount& operator=(const ArrayMount&) = delete;
  ~ArrayMount() { Unmount(); }
  // Loop devices for every image and a kernel mount of the set at `dir`
  // (-o device=... for each, plus `opts`). "" on success, else what failed.
  std::string Mount(const std::vector<std::string>& images, const std::string& dir, const std::string& opts = "");
  // btrfs check --readonly over loop devices of the images (progs finds the
  // members among the block devices scanned).
  CommandResult Check(const std::vector<std::string>& images);
  // The same with loop devices of its own, detached again before it returns.
  static CommandResult CheckOnce(const std::vector<std::string>& images) {
    ArrayMount loops;
    return loops.Check(images);
  }
  // Unmounts and detaches the loop devices.
  void Unmount();

 private:
  std::vector<std::string> loops_;
  std::string dir_;
};

// RAID5/6 and mirrored arrays ubtrfs wrote: the kernel's degraded
// read-only mount of the images but those at `gone` (indexes) shows what
// ubtrfs shows over all of them, so the copies or the parity it wrote hold
// the data. Mounts at `mnt`; fails the test on a difference.
void ExpectKernelReadsAllWithout(const std::vector<std::string>& images, const std::vector<size_t>& gone,
                                 const std::string& mnt);

// The content the multi-device suites put on an array: empty to
// multi-element files (the largest `largest` bytes), a directory tree (one
// of mode 0700), a symlink, 50 small files. Fails the test if it cannot.
void MakeArraySource(const std::string& src, size_t largest);

// The logical address of every `step`-th sector of the first `first_bytes`
// of each data chunk that the csum tree has a checksum for: data in use,
// whose copies a test damages. Fails the test if the csum tree does not read.
std::vector<uint64_t> SampledDataSectors(ubtrfs::txn::Volume& vol, uint64_t first_bytes, size_t step);

// Forwards to a recording device and notes, in one order shared by the
// devices of an array, which device each logged write or flush went to
// (crash replay over several recorded devices).
class TaggedDevice final : public ubtrfs::io::BlockDevice {
 public:
  TaggedDevice(ubtrfs::io::RecordingDevice* rec, int tag, std::vector<int>* order, std::mutex* mu)
      : rec_(rec), tag_(tag), order_(order), mu_(mu) {}
  ubtrfs::Status ReadAt(uint64_t off, std::span<uint8_t> buf) override { return rec_->ReadAt(off, buf); }
  ubtrfs::Status WriteAt(uint64_t off, std::span<const uint8_t> buf) override {
    std::lock_guard lock(*mu_);
    order_->push_back(tag_);
    return rec_->WriteAt(off, buf);
  }
  ubtrfs::Status Flush() override {
    std::lock_guard lock(*mu_);
    order_->push_back(tag_);
    return rec_->Flush();
  }
  uint64_t Size() const override { return rec_->Size(); }
  std::string Name() const override { return rec_->Name(); }

 private:
  ubtrfs::io::RecordingDevice* rec_;
  int tag_;
  std::vector<int>* order_;
  std::mutex* mu_;
};

// "a,b,c".
std::string JoinDevices(const std::vector<std::string>& v, const std::string& sep = ",");

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_ARRAY_MOUNT_H_
