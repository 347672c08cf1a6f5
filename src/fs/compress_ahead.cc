#include "fs/compress_ahead.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "fs/source_open.h"
#include "io/cores.h"

namespace ubtrfs::fs {
namespace {

// Chunks a compressor may have queued for it: enough that none waits while
// the importer stores the chunk in front, few enough to keep memory small.
constexpr size_t kAheadPerCore = 2;

size_t Cores() { return std::clamp<size_t>(io::UsableCores(), 1, 16); }

}  // namespace

CompressAhead::CompressAhead(const WriteCompression& c, uint32_t sectorsize, std::vector<File> files)
    : c_(c), ss_(sectorsize), files_(std::move(files)), ahead_(kAheadPerCore * Cores() + 1) {
  // A compressor per core: the reader and the importer mostly wait, for
  // the disk and for these.
  try {
    for (size_t i = 0; i < Cores(); ++i) compressors_.emplace_back([this] { CompressLoop(); });
    reader_ = std::thread([this] { ReadLoop(); });
  } catch (const std::system_error&) {
    Stop();  // started() says no; the importer writes these files itself
  }
}

CompressAhead::~CompressAhead() { Stop(); }

void CompressAhead::Stop() {
  {
    std::lock_guard l(mu_);
    stop_ = true;
  }
  room_cv_.notify_all();
  work_cv_.notify_all();
  if (reader_.joinable()) reader_.join();
  for (std::thread& t : compressors_) t.join();
  compressors_.clear();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<std::optional<CompressAhead::Chunk>> CompressAhead::Next(size_t i) {
  std::unique_lock l(mu_);
  for (;;) {
    ready_cv_.wait(l, [this] { return items_.empty() ? done_ : items_.front().pending == 0; });
    if (items_.empty()) return std::optional<Chunk>();
    Item& front = items_.front();
    if (front.file > i) return std::optional<Chunk>();  // file i was handed out already
    Item it = std::move(front);
    items_.pop_front();
    if (items_.size() == LowWater()) room_cv_.notify_one();
    if (it.file < i) continue;  // a file the caller went past
    if (!it.status.ok()) return it.status;
    if (it.end) return std::optional<Chunk>();
    return std::optional<Chunk>(std::move(it.chunk));
  }
}

void CompressAhead::Recycle(std::vector<uint8_t>&& bytes) {
  std::lock_guard l(mu_);
  if (spare_.size() < ahead_) spare_.push_back(std::move(bytes));
}

void CompressAhead::ReadLoop() {
  for (;;) {
    {
      std::unique_lock l(mu_);
      // Once the queue is full, the reader sleeps until it is down to the
      // low water mark and then reads the rest in one go: woken for every
      // chunk taken, it made a context switch (and on a VM an interrupt
      // to the other core) per 128 KiB.
      if (items_.size() >= ahead_) room_cv_.wait(l, [this] { return stop_ || items_.size() <= LowWater(); });
      if (stop_) return;
      if (cur_ >= files_.size()) {  // no files at all
        done_ = true;
        work_cv_.notify_all();
        ready_cv_.notify_all();
        return;
      }
    }
    Item it = ReadOne();
    const std::vector<Range> ranges = Plan(it);
    std::lock_guard l(mu_);
    Item& queued = items_.emplace_back(std::move(it));
    queued.pending = ranges.size();
    for (size_t k = 0; k < ranges.size(); ++k) jobs_.push_back(Job{&queued, k, ranges[k]});
    done_ = cur_ >= files_.size();
    // A compressor per job: waking them all for one left the others to
    // find nothing and sleep again.
    if (done_) {
      work_cv_.notify_all();
    } else {
      for (size_t k = 0; k < ranges.size(); ++k) work_cv_.notify_one();
    }
    if (queued.pending == 0 && &queued == &items_.front()) ready_cv_.notify_all();
    if (done_) return;
  }
}

void CompressAhead::CompressLoop() {
  std::unique_lock l(mu_);
  for (;;) {
    work_cv_.wait(l, [this] { return stop_ || done_ || !jobs_.empty(); });
    if (stop_ || jobs_.empty()) return;  // stopped, or nothing more will come
    const Job j = jobs_.front();
    jobs_.pop_front();
    Chunk& c = j.item->chunk;
    Precompressed& p = c.pre[j.k];
    l.unlock();
    // The item stays queued until its last range is in: Next waits for that.
    const std::span<const uint8_t> aligned(c.bytes.data(), Padded(c.len));
    RangeResult result =
        CompressRange(c_, aligned.subspan(j.r.pos, p.file_len), aligned.subspan(j.r.pos, j.r.len), ss_);
    l.lock();
    p.result = std::move(result);
    // Next waits for the front item only; a later one it finds done.
    if (--j.item->pending == 0 && j.item == &items_.front()) ready_cv_.notify_all();
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

// The ranges of a chunk that the write path would try, as
// FilesystemImpl::AllocCompressedPieces picks them for a write of the chunk
// at its offset into a file of the scanned size.
std::vector<Range> CompressAhead::Plan(Item& it) const {
  std::vector<Range> ranges;
  if (it.chunk.len == 0 || it.chunk.off % ss_ != 0) return ranges;
  const std::span<const uint8_t> aligned(it.chunk.bytes.data(), Padded(it.chunk.len));
  const uint64_t file_len = std::max(files_[it.file].size, it.chunk.off + it.chunk.len) - it.chunk.off;
  for (const Range& r : PlanRanges(aligned, ss_)) {
    const uint64_t fb = BytesToTry(r, it.chunk.off, file_len, ss_);
    if (fb == 0) continue;
    ranges.push_back(r);
    Precompressed& p = it.chunk.pre.emplace_back();
    p.file_off = it.chunk.off + r.pos;
    p.file_len = fb;
    p.type = c_.type;
    p.level = c_.level;
    p.force = c_.force;
  }
  return ranges;
}

}  // namespace ubtrfs::fs
