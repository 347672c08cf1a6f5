#include "fs/compress_ahead.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <utility>

#include "fs/source_open.h"
#include "fs/work_pool.h"

namespace ubtrfs::fs {
namespace {

// Read ahead of the writes by at most this much, in batches compressed
// together: enough ranges a batch to keep every core busy, little memory.
constexpr size_t kBatchBytes = size_t{1} << 20;
constexpr size_t kBatchesAhead = 1;
constexpr size_t kSpares = 2;

}  // namespace

CompressAhead::CompressAhead(const WriteCompression& c, uint32_t sectorsize, std::vector<File> files)
    : c_(c), ss_(sectorsize), files_(std::move(files)) {
  thread_ = std::thread([this] { Run(); });
}

CompressAhead::~CompressAhead() {
  {
    std::lock_guard l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (fd_ >= 0) ::close(fd_);
}

Result<std::optional<CompressAhead::Chunk>> CompressAhead::Next(size_t i) {
  std::unique_lock l(mu_);
  for (;;) {
    if (taking_.empty()) {
      // Waiting for the batch being compressed: compress some of it
      // (between batches, while the thread ahead reads, look again soon).
      while (ready_.empty() && !done_) {
        l.unlock();
        const bool helped = HelpParallelFor();
        l.lock();
        if (!helped && ready_.empty() && !done_) cv_.wait_for(l, std::chrono::milliseconds(1));
      }
      if (ready_.empty()) return std::optional<Chunk>();
      for (Item& it : ready_.front()) taking_.push_back(std::move(it));
      ready_.pop_front();
      cv_.notify_all();  // room for another batch
      continue;
    }
    Item& front = taking_.front();
    if (front.file > i) return std::optional<Chunk>();  // file i was handed out already
    Item it = std::move(front);
    taking_.pop_front();
    if (it.file < i) continue;  // a file the caller went past
    if (!it.status.ok()) return it.status;
    if (it.end) return std::optional<Chunk>();
    return std::optional<Chunk>(std::move(it.chunk));
  }
}

void CompressAhead::Recycle(std::vector<uint8_t>&& bytes) {
  std::lock_guard l(mu_);
  if (spare_.size() < kSpares) spare_.push_back(std::move(bytes));
}

void CompressAhead::Run() {
  for (;;) {
    {
      std::unique_lock l(mu_);
      cv_.wait(l, [this] { return stop_ || ready_.size() < kBatchesAhead; });
      if (stop_) return;
    }
    std::vector<Item> batch;
    size_t bytes = 0;
    while (bytes < kBatchBytes && cur_ < files_.size()) {
      batch.push_back(ReadOne());
      bytes += batch.back().chunk.len;
    }
    Compress(batch);
    std::lock_guard l(mu_);
    if (!batch.empty()) ready_.push_back(std::move(batch));
    if (cur_ >= files_.size()) done_ = true;
    cv_.notify_all();
    if (done_) return;
  }
}

// As Importer::CopyData reads: from each run of data the host knows of, a
// chunk at a time, up to the size the scan saw.
CompressAhead::Item CompressAhead::ReadOne() {
  Item it;
  it.file = cur_;
  const File& f = files_[cur_];
  auto end_of_file = [&] {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    pos_ = 0;
    ++cur_;
    it.end = true;
    return std::move(it);
  };
  auto failed = [&](const char* what) {
    const int e = errno;
    it.status = Status::Error(e, f.path + ": " + what + ": " + std::strerror(e));
    return end_of_file();
  };
  if (fd_ < 0) {
    fd_ = OpenSource(AT_FDCWD, f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return failed("open");
    pos_ = 0;
  }
  if (pos_ >= f.size) return end_of_file();
  const off_t data = ::lseek(fd_, static_cast<off_t>(pos_), SEEK_DATA);
  if (data < 0) return end_of_file();  // only a hole up to the end
  pos_ = static_cast<uint64_t>(data);
  it.chunk.off = pos_;
  // Up to the size the scan saw: the inode has that size already, and a
  // buffer no larger than the data keeps what is read ahead small.
  const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, f.size - pos_));
  {
    std::lock_guard l(mu_);
    auto fits = std::find_if(spare_.begin(), spare_.end(), [&](const auto& b) { return b.size() >= Padded(want); });
    if (fits != spare_.end()) {
      it.chunk.bytes = std::move(*fits);
      spare_.erase(fits);
    }
  }
  if (it.chunk.bytes.size() < Padded(want)) it.chunk.bytes.resize(Padded(want));
  ssize_t n;
  do {
    n = ::pread(fd_, it.chunk.bytes.data(), want, data);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return failed("read");
  if (n == 0) return end_of_file();
  it.chunk.len = static_cast<size_t>(n);
  std::memset(it.chunk.bytes.data() + it.chunk.len, 0, Padded(it.chunk.len) - it.chunk.len);
  pos_ += it.chunk.len;
  return it;
}

// The ranges of each chunk that the write path would try, as
// FilesystemImpl::AllocCompressedPieces picks them for a write of the chunk
// at its offset into a file of the scanned size.
void CompressAhead::Compress(std::vector<Item>& batch) const {
  struct Job {
    Item* item;
    Range r;
    uint64_t file_bytes;
    RangeResult result;
  };
  std::vector<Job> jobs;
  for (Item& it : batch) {
    if (it.chunk.len == 0 || it.chunk.off % ss_ != 0) continue;
    const std::span<const uint8_t> aligned(it.chunk.bytes.data(), Padded(it.chunk.len));
    const uint64_t file_len = std::max(files_[it.file].size, it.chunk.off + it.chunk.len) - it.chunk.off;
    for (const Range& r : PlanRanges(aligned, ss_)) {
      if (const uint64_t fb = BytesToTry(r, it.chunk.off, file_len, ss_); fb > 0) jobs.push_back(Job{&it, r, fb, {}});
    }
  }
  ParallelFor(jobs.size(), [&](size_t k) {
    Job& j = jobs[k];
    const std::span<const uint8_t> aligned(j.item->chunk.bytes.data(), Padded(j.item->chunk.len));
    j.result = CompressRange(c_, aligned.subspan(j.r.pos, j.file_bytes), aligned.subspan(j.r.pos, j.r.len), ss_);
  });
  for (Job& j : jobs) {
    Precompressed p;
    p.file_off = j.item->chunk.off + j.r.pos;
    p.file_len = j.file_bytes;
    p.type = c_.type;
    p.level = c_.level;
    p.force = c_.force;
    p.result = std::move(j.result);
    j.item->chunk.pre.push_back(std::move(p));
  }
}

}  // namespace ubtrfs::fs
