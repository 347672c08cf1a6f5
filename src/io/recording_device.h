// Write-order recording and power-cut replay, in the manner of dm-log-writes:
// a RecordingDevice logs every write and flush a filesystem issues, and a
// CrashReplayer rebuilds the device as a power cut after any prefix of that
// log could have left it -- everything written, the writes since the last
// completed flush lost, any subset of them (the device reorders what it has
// not been told to make durable), or one of them torn at sector granularity.
//
// Images are sparse (4 KiB pages, absent pages read as zeros) and the replayer
// walks the log forward, applying flushed writes to one durable image and
// putting each crash image's unflushed writes in a small copy-on-write
// overlay, so thousands of crash points of a 256 MiB image cost little more
// than the metadata the workload wrote.
#ifndef UBTRFS_IO_RECORDING_DEVICE_H_
#define UBTRFS_IO_RECORDING_DEVICE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/block_device.h"

namespace ubtrfs::io {

// A byte image of a fixed size held as 4 KiB pages; pages never written read
// as zeros. An image may sit over a base image (not owned, must outlive it):
// reads fall through to the base, writes copy the page first.
class SparseImage {
 public:
  static constexpr uint64_t kPageSize = 4096;

  explicit SparseImage(uint64_t size, const SparseImage* base = nullptr) : size_(size), base_(base) {}
  SparseImage(const SparseImage& other);
  SparseImage& operator=(const SparseImage& other);
  // An image holding `bytes` (only the pages that are not all zeros).
  static SparseImage FromBytes(std::span<const uint8_t> bytes);

  uint64_t size() const { return size_; }
  const SparseImage* base() const { return base_; }
  // The caller checks bounds (offset + out.size() <= size()).
  void Read(uint64_t offset, std::span<uint8_t> out) const;
  // Grows the image when the write ends past its size.
  void Write(uint64_t offset, std::span<const uint8_t> data);
  // Pages this image holds itself (not counting its base).
  size_t own_pages() const { return pages_.size(); }
  // Writes the image (through its base) to `path` as a sparse file of size()
  // bytes: only pages that hold data are written.
  Status SaveToFile(const std::string& path) const;
  // The whole image as bytes (small images and tests).
  std::vector<uint8_t> ToBytes() const;

 private:
  const uint8_t* FindPage(uint64_t index) const;
  uint8_t* MutablePage(uint64_t index);

  uint64_t size_;
  const SparseImage* base_;
  std::unordered_map<uint64_t, std::unique_ptr<uint8_t[]>> pages_;
};

// One entry of the write log.
struct LogEntry {
  enum class Kind { kWrite, kFlush };
  Kind kind = Kind::kWrite;
  uint64_t offset = 0;        // writes
  std::vector<uint8_t> data;  // writes: the bytes written
};

// A memory device that logs what is done to it. Reads see every write so
// far. Thread-safe. Hand it to a Filesystem with NewUnownedDevice() to keep
// access to the log.
class RecordingDevice final : public BlockDevice {
 public:
  // A device of `size` zero bytes.
  RecordingDevice(std::string name, uint64_t size);
  // A device holding `image`.
  RecordingDevice(std::string name, SparseImage image);

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  uint64_t Size() const override;
  std::string Name() const override { return name_; }

  // Makes the current contents the initial image and empties the log (after
  // mkfs, say, so that replay starts from a finished filesystem).
  void ResetLog();
  // The log and the image it starts from. Replay only while nothing writes.
  const std::vector<LogEntry>& log() const { return log_; }
  const SparseImage& initial() const { return initial_; }
  const SparseImage& current() const { return current_; }
  // Number of log entries so far: a marker for "the crash points after here".
  size_t position() const;
  uint64_t bytes_logged() const;

 private:
  mutable std::mutex mu_;
  std::string name_;
  SparseImage initial_;
  SparseImage current_;
  std::vector<LogEntry> log_;
  uint64_t bytes_logged_ = 0;
};

// What reached the disk at a power cut after the first `entries` log entries.
enum class CrashMode {
  kPrefix,         // every write among them
  kDropUnflushed,  // only the writes before the last flush among them
  kSubset,         // those, plus a random subset of the later (unflushed) writes in random order
  kTorn,           // as kSubset, plus one more unflushed write of which only random 512-byte sectors landed
                   // (when every unflushed write is atomic, just kSubset)
};

const char* CrashModeName(CrashMode mode);

struct CrashPoint {
  size_t entries = 0;  // how many log entries were issued before the power cut
  CrashMode mode = CrashMode::kPrefix;
  uint64_t seed = 0;   // kSubset / kTorn: which writes and sectors
  std::string ToString() const;
};

inline constexpr uint64_t kTornSectorSize = 512;

// A crash image: the replayer's durable image (not owned) with the chosen
// unflushed writes over it. It can be read, written (into the overlay),
// saved to a file and cloned; the replayer must outlive it and must not
// materialize another point with a different durable prefix meanwhile.
class CrashImage final : public BlockDevice {
 public:
  CrashImage(std::string name, const SparseImage* durable) : name_(std::move(name)), image_(durable->size(), durable) {}
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override { return Status::Ok(); }
  uint64_t Size() const override { return image_.size(); }
  std::string Name() const override { return name_; }

  std::unique_ptr<CrashImage> Clone() const { return std::make_unique<CrashImage>(*this); }
  Status SaveToFile(const std::string& path) const { return image_.SaveToFile(path); }
  const SparseImage& image() const { return image_; }
  // Log indices of the unflushed writes applied, in the order applied; the
  // torn one (kTorn) last, with the sectors of it that landed.
  const std::vector<size_t>& applied() const { return applied_; }
  size_t torn_entry() const { return torn_entry_; }
  const std::vector<uint64_t>& torn_sectors() const { return torn_sectors_; }

 private:
  friend class CrashReplayer;
  std::string name_;
  SparseImage image_;
  std::vector<size_t> applied_;
  size_t torn_entry_ = SIZE_MAX;
  std::vector<uint64_t> torn_sectors_;  // sector indices within the torn write
};

// Rebuilds crash images from a finished recording (the device must not be
// written while a replayer uses it). Cheapest when points come in
// increasing order of `entries`: the durable image only moves forward.
class CrashReplayer {
 public:
  explicit CrashReplayer(const RecordingDevice* rec);

  Result<std::unique_ptr<CrashImage>> Materialize(const CrashPoint& point);

  // Device ranges written atomically: a write inside one is never torn (it
  // lands whole or not at all). btrfs assumes this of its 4 KiB superblock
  // copies -- the kernel and btrfs check refuse a primary superblock whose
  // checksum fails -- so crash tests of btrfs declare those ranges here.
  void AddAtomicRange(uint64_t offset, uint64_t len) { atomic_.emplace_back(offset, len); }

  // Number of log entries before the last flush among the first `entries`
  // (0 when there is none): what a power cut after them cannot lose.
  size_t DurablePrefix(size_t entries) const;
  // Log entries applied to the durable image so far (replay work), and how
  // often the walk restarted from the initial image.
  uint64_t entries_applied() const { return entries_applied_; }
  uint64_t restarts() const { return restarts_; }

 private:
  void AdvanceDurable(size_t prefix);

  bool Atomic(const LogEntry& e) const;

  const RecordingDevice* rec_;
  std::vector<std::pair<uint64_t, uint64_t>> atomic_;
  std::vector<size_t> flush_before_;  // flush_before_[n]: DurablePrefix(n)
  SparseImage durable_;
  size_t durable_pos_ = 0;
  uint64_t entries_applied_ = 0;
  uint64_t restarts_ = 0;
};

// A device that forwards to `dev` without owning it (the caller keeps `dev`
// alive longer), for APIs that take ownership of their device.
std::unique_ptr<BlockDevice> NewUnownedDevice(BlockDevice* dev);

}  // namespace ubtrfs::io

#endif  // UBTRFS_IO_RECORDING_DEVICE_H_
