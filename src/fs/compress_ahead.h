// An import's file data read and compressed ahead of its writes.
//
// With compression on, an import is almost all compressor time (zstd was
// 88% of `mkfs --compress zstd` of a text tree), and a write compresses its
// own ranges on all cores only while it has them: files of one or two
// ranges, and the write path's own work between compressions, left a core
// idle. Here one thread reads the files in the order they will be written,
// a chunk at a time, and a compressor thread per core takes their ranges
// as they come, while the importer stores the chunks before them
// (FilesystemImpl::WritePrecompressed). A range is handed in only where it
// is the range the write path would cut and try (same offset, length,
// algorithm and level), so the image is the one a plain Write gives.
//
// What is in flight is bounded by chunks, not by batches: a few chunks a
// core, each with its compressed ranges (issue 19 holds an image build to
// mkfs.btrfs's memory; batches of 1 MiB, read and compressed a whole batch
// ahead, were 5.5 MB of a 16 MB heap).
#ifndef UBTRFS_FS_COMPRESS_AHEAD_H_
#define UBTRFS_FS_COMPRESS_AHEAD_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "fs/compress_write.h"
#include "ubtrfs/status.h"

namespace ubtrfs::fs {

class CompressAhead {
 public:
  struct File {
    std::string path;
    uint64_t size = 0;  // as the scan saw it: reading stops there
  };
  // Up to `chunk` bytes of a file from `off`, as the importer reads it
  // (holes the host knows about skipped), with its compressed ranges.
  struct Chunk {
    uint64_t off = 0;
    size_t len = 0;              // bytes read, then zeros to the end of their last sector
    std::vector<uint8_t> bytes;  // at least that; reused (Recycle) rather than zeroed anew
    std::vector<Precompressed> pre;
    std::span<const uint8_t> data() const { return std::span(bytes.data(), len); }
  };

  CompressAhead(const WriteCompression& c, uint32_t sectorsize, std::vector<File> files);
  ~CompressAhead();
  CompressAhead(const CompressAhead&) = delete;
  CompressAhead& operator=(const CompressAhead&) = delete;

  // False when its threads could not be started (the system's limit): then
  // it reads nothing, and the caller writes the files as without it.
  bool started() const { return reader_.joinable(); }

  // The next chunk of file `i` (files taken in order, each to its end),
  // nullopt after its last; waits for the thread ahead. A read error is
  // the file's and names it.
  Result<std::optional<Chunk>> Next(size_t i);

  // Hands a chunk's buffer back for a later read.
  void Recycle(std::vector<uint8_t>&& bytes);

  // One range: two a chunk (one pass through the write path for two
  // extents) were 1.1 MB more at the peak of `mkfs --compress zstd` and no
  // faster. A compressing import reads what it writes itself in chunks of
  // this size too (Importer::CopyData), so the inodes' change counts, and
  // with them the image, are the same whether or not the threads started.
  static constexpr size_t kChunk = kMaxCompressRange;

 private:
  struct Item {
    size_t file;
    bool end = false;  // no more chunks of `file`
    Status status;
    Chunk chunk;
    size_t pending = 0;  // ranges not compressed yet
  };
  // One range of a queued item: the result goes to item->chunk.pre[k].
  struct Job {
    Item* item;
    size_t k;
    Range r;
  };
  void Stop();
  void ReadLoop();
  void CompressLoop();
  // Reads the next chunk (or the end, or an error) of the file being read.
  Item ReadOne();
  // The ranges of a chunk to try, with their results' places made.
  std::vector<Range> Plan(Item& it) const;
  size_t Padded(size_t n) const { return (n + ss_ - 1) / ss_ * ss_; }

  const WriteCompression c_;
  const uint32_t ss_;
  const std::vector<File> files_;
  // Reader state (the thread ahead only).
  size_t cur_ = 0;
  int fd_ = -1;
  uint64_t pos_ = 0;

  const size_t ahead_;  // chunks read and not yet taken, at most
  // Where the reader, asleep at ahead_, starts again.
  size_t LowWater() const { return ahead_ / 2; }

  std::mutex mu_;
  std::condition_variable room_cv_;   // the reader waits for items_ to shrink
  std::condition_variable work_cv_;   // compressors wait for jobs_
  std::condition_variable ready_cv_;  // Next waits for the front item
  std::deque<Item> items_;            // read, in order; references stay valid as it grows
  std::deque<Job> jobs_;              // ranges of items_ not yet taken by a compressor
  std::vector<std::vector<uint8_t>> spare_;  // buffers back from Recycle
  bool stop_ = false;
  bool done_ = false;  // the reader has queued everything
  std::thread reader_;
  std::vector<std::thread> compressors_;
};

}  // namespace ubtrfs::fs

#endif  // UBTRFS_FS_COMPRESS_AHEAD_H_
