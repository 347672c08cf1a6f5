#include <fcntl.h>
#include <linux/stat.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <utility>
#include <cerrno>
#include <climits>
#include <cstring>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "io/block_device.h"
#include "io/write_combiner.h"

namespace ubtrfs::io {
namespace {

std::string Errno(int e) { return std::strerror(e); }

CloneCounts g_clone_counts;

class FileDevice final : public BlockDevice {
 public:
  FileDevice(int fd, int direct_fd, size_t direct_align, std::string path, uint64_t size)
      : fd_(fd), dfd_(direct_fd), dio_align_(direct_align), path_(std::move(path)), size_(size) {
    direct_.store(dfd_ >= 0);
  }
  ~FileDevice() override {
    {
      std::lock_guard lock(bg_mu_);
      bg_stop_ = true;
    }
    bg_cv_.notify_all();
    if (bg_.joinable()) bg_.join();
    // Nothing gathered is committed yet (a commit flushes first); written
    // anyway, as a pwrite would have left it in the page cache.
    if (gathered_.load()) {
      std::unique_lock lock(gather_mu_);
      WaitWritten(lock);
      (void)DrainLocked();
    }
    if (dfd_ >= 0) ::close(dfd_);
    ::close(fd_);
  }

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    UB_RETURN_IF_ERROR(DrainIfOverlaps(offset, buf.size()));
    const uint64_t size = size_.load(std::memory_order_relaxed);
    if (offset > size || buf.size() > size - offset) {
      return Status::IoError(path_ + ": read of " + std::to_string(buf.size()) + " bytes at offset " +
                             std::to_string(offset) + " is past the end of the device (" +
                             std::to_string(size) + " bytes; truncated image?)");
    }
    size_t done = 0;
    while (done < buf.size()) {
      ssize_t n = ::pread(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        return Status::Error(e, path_ + ": read at offset " + std::to_string(offset + done) + ": " + Errno(e));
      }
      if (n == 0) {
        return Status::IoError(path_ + ": unexpected end of file at offset " + std::to_string(offset + done));
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  MappedBytes MapForRead(uint64_t offset, size_t len) override {
    // Gathered writes not yet in the file would be missed, as by ReadAt.
    if (!DrainIfOverlaps(offset, len).ok()) return {};
    const uint64_t size = size_.load(std::memory_order_relaxed);
    if (offset > size || len > size - offset) return {};
    return MapFileRange(fd_, offset, len);
  }

  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    if (batches_[0].Takes(buf.size())) {  // both take the same sizes
      std::unique_lock lock(gather_mu_);
      // Not into a full batch (its filler waits to send it off), nor over
      // the batch in flight.
      for (;;) {
        if (!failed_.ok()) return failed_;
        if (!active_->Full() && !InFlight(offset, buf.size())) break;
        written_cv_.wait(lock);
      }
      if (active_->Overlaps(offset, buf.size())) UB_RETURN_IF_ERROR(DrainLocked());
      active_->Add(offset, buf);
      gathered_.store(true);
      Grow(offset + buf.size());
      if (!active_->Full()) return Status::Ok();
      // The full batch is written outside the lock, so the other threads
      // go on gathering into the second one meanwhile.
      WaitWritten(lock);
      if (!active_->Full()) return Status::Ok();  // drained meanwhile (a read, a flush)
      std::swap(active_, inflight_);
      writing_ = true;
      inflight_lo_ = inflight_->lo();
      inflight_hi_ = inflight_->hi();
      written_cv_.notify_all();  // room again
      WriteCombiner* batch = inflight_;
      lock.unlock();
      Status st = WriteBatch(*batch);
      lock.lock();
      writing_ = false;
      // Nobody gathered meanwhile (a batch without a buffer never took a
      // write): the batch just written takes the next writes again, so a
      // single writer (an image build, cp) never cuts the second batch's
      // buffer, 328 KiB of mkfs's peak memory.
      if (!active_->HasBuffer()) std::swap(active_, inflight_);
      if (!st.ok() && failed_.ok()) failed_ = st;
      gathered_.store(!active_->empty());
      written_cv_.notify_all();
      return st;
    }
    UB_RETURN_IF_ERROR(DrainIfOverlaps(offset, buf.size()));
    if (auto direct = WriteDirect(offset, buf); !direct.ok() || *direct) {
      if (direct.ok()) Grow(offset + buf.size());
      return direct.status();
    }
    UB_RETURN_IF_ERROR(WriteVector(fd_, offset, {iovec{const_cast<uint8_t*>(buf.data()), buf.size()}}));
    Grow(offset + buf.size());
    return Status::Ok();
  }

  Status WriteGather(uint64_t offset, std::span<const std::span<const uint8_t>> pieces) override {
    std::vector<iovec> iov;
    iov.reserve(pieces.size());
    uint64_t total = 0;
    for (const auto& p : pieces) {
      iov.push_back(iovec{const_cast<uint8_t*>(p.data()), p.size()});
      total += p.size();
    }
    UB_RETURN_IF_ERROR(DrainIfOverlaps(offset, total));
    UB_RETURN_IF_ERROR(WriteVector(fd_, offset, std::move(iov)));
    Grow(offset + total);
    return Status::Ok();
  }

  Result<bool> CloneFrom(int src_fd, uint64_t src_off, uint64_t offset, uint64_t len) override {
    UB_RETURN_IF_ERROR(DrainIfOverlaps(offset, len));
    return CloneOrCopy(src_fd, src_off, offset, len);
  }

  Status Flush() override {
    {
      std::unique_lock lock(gather_mu_);
      WaitWritten(lock);
      if (!active_->empty()) UB_RETURN_IF_ERROR(DrainLocked());
      // A gathered write that failed was acknowledged to its caller: no
      // flush may pass it off as durable, ever.
      if (!failed_.ok()) return failed_;
    }
    unflushed_.store(0, std::memory_order_relaxed);
    if (::fdatasync(fd_) != 0) {
      int e = errno;
      return Status::Error(e, path_ + ": fdatasync: " + Errno(e));
    }
    // A background flush on the same descriptor may have taken a write
    // error from the kernel (which reports it to one fdatasync only): it
    // is in failed_ once that flush is done.
    {
      std::unique_lock lock(bg_mu_);
      bg_cv_.wait(lock, [this] { return !bg_running_; });
    }
    std::lock_guard lock(gather_mu_);
    return failed_;
  }

  // What is gathered stays gathered: its batch goes down when full or at
  // the next Flush(). Draining it here took the gathering lock for a whole
  // batch write, and every data write of the other threads waited on it
  // (a futex sleep each, on a small VM). Errors are left to Flush().
  void StartWriteback() override {
    (void)::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
    if (unflushed_.load(std::memory_order_relaxed) >= kBackgroundFlushEvery) RequestBackgroundFlush();
  }

  void SetBufferedChunk(size_t n) { buffered_chunk_ = n; }
  uint64_t Size() const override { return size_.load(std::memory_order_relaxed); }
  std::string Name() const override { return path_; }

 private:
  // Whether [offset, offset + n) may meet the batch in flight (by its
  // bounds: its pieces are the writer's until it is done).
  bool InFlight(uint64_t offset, uint64_t n) const {
    return writing_ && n > 0 && offset < inflight_hi_ && inflight_lo_ < offset + n;
  }

  // The batch being written by another thread is on the device after this.
  void WaitWritten(std::unique_lock<std::mutex>& lock) {
    written_cv_.wait(lock, [this] { return !writing_; });
  }

  // Writes what active_ holds, under the lock. Emptying active_ makes room
  // as a swap does, and writers may be waiting for room (WriteAt): they are
  // woken here too. A flush or writeback hint used to drain a full batch
  // without waking them, between its filler's wake-up and its turn; the
  // filler then found the batch empty and went on, and a waiter slept on
  // until a later write filled a batch, holding its caller's inode lock
  // (seen as a hung 4 KiB create run).
  Status DrainLocked() {
    Status s = WriteBatch(*active_);
    gathered_.store(writing_);
    if (!s.ok() && failed_.ok()) failed_ = s;
    written_cv_.notify_all();
    return s;
  }

  // Needs no lock: a batch belongs to one thread while it is written.
  Status WriteBatch(WriteCombiner& batch) {
    return batch.Drain([this](uint64_t offset, std::span<const iovec> run) -> Status {
      if (DirectFits(offset, run)) {
        Status d = WriteVector(dfd_, offset, std::vector<iovec>(run.begin(), run.end()));
        if (!RefusedDirect(d)) return d;
      }
      return WriteVector(fd_, offset, std::vector<iovec>(run.begin(), run.end()));
    });
  }

  Status DrainIfOverlaps(uint64_t offset, uint64_t len) {
    if (!gathered_.load()) return Status::Ok();
    std::unique_lock lock(gather_mu_);
    if (InFlight(offset, len)) WaitWritten(lock);
    return active_->Overlaps(offset, len) ? DrainLocked() : Status::Ok();
  }

  // A flush of what the device holds so far, on a thread of its own, while
  // the writers go on: a virtual disk with a write-back cache (the VMs
  // measured) persists at a flush everything written since the last one,
  // about 0.85 s per GiB there, and writes handed down early do not
  // shorten it. Flushed along the way, a commit's or fsync's own flush
  // waits for the tail only. Durability is unchanged: only Flush() says
  // anything is durable, and the order of its callers' writes around it
  // stays theirs.
  static constexpr uint64_t kBackgroundFlushEvery = uint64_t{64} << 20;
  void RequestBackgroundFlush() {
    {
      std::lock_guard lock(bg_mu_);
      if (bg_running_ || bg_stop_) return;
      bg_running_ = true;
      if (!bg_.joinable()) {
        try {
          bg_ = std::thread([this] { FlushLoop(); });
        } catch (const std::system_error&) {
          bg_running_ = false;  // no thread to be had: the next Flush() does it all
          return;
        }
      }
    }
    bg_cv_.notify_all();
  }
  void FlushLoop() {
    std::unique_lock lock(bg_mu_);
    for (;;) {
      bg_cv_.wait(lock, [this] { return bg_running_ || bg_stop_; });
      if (bg_stop_) return;
      lock.unlock();
      unflushed_.store(0, std::memory_order_relaxed);
      const int rc = ::fdatasync(fd_);
      const int e = errno;
      if (rc != 0) {
        std::lock_guard g(gather_mu_);
        if (failed_.ok()) failed_ = Status::Error(e, path_ + ": fdatasync (in the background): " + Errno(e));
      }
      lock.lock();
      bg_running_ = false;
      bg_cv_.notify_all();
    }
  }

  // Whether a write may go around the page cache: offset, length and every
  // buffer aligned as the host file system asks.
  bool DirectFits(uint64_t offset, std::span<const iovec> iov) const {
    if (!direct_.load(std::memory_order_relaxed) || offset % dio_align_) return false;
    for (const iovec& v : iov) {
      if (v.iov_len % dio_align_ || reinterpret_cast<uintptr_t>(v.iov_base) % dio_align_) return false;
    }
    return true;
  }

  // EINVAL from a direct write: the host file system turned it down after
  // all (a bind mount of another one, a device with larger sectors). The
  // caller writes through the page cache, as every later write does.
  bool RefusedDirect(const Status& s) {
    if (s.ok() || s.code() != EINVAL) return false;
    direct_.store(false);
    return true;
  }

  // A large write around the host's page cache. Data written once and read
  // back rarely gains nothing from the page cache, and on small VMs the
  // copy into it (and the writeback of it later) was most of the system
  // time of an import (issue 24: 1 GiB by dd, 1.76 s of system time
  // buffered against 0.17 s direct). But each write waits for the disk, one
  // at a time, where the page cache's writeback keeps several in flight
  // while the caller copies on: so it is asked for, not the default. A
  // buffer that is not aligned goes through an aligned one, a MiB at a
  // time. false: not written here.
  Result<bool> WriteDirect(uint64_t offset, std::span<const uint8_t> buf) {
    if (!direct_.load(std::memory_order_relaxed) || offset % dio_align_ || buf.size() % dio_align_) return false;
    if (reinterpret_cast<uintptr_t>(buf.data()) % dio_align_ == 0) {
      Status s = WriteVector(dfd_, offset, {iovec{const_cast<uint8_t*>(buf.data()), buf.size()}});
      if (RefusedDirect(s)) return false;
      UB_RETURN_IF_ERROR(s);
      return true;
    }
    constexpr size_t kBounce = size_t{1} << 20;
    struct Free {
      void operator()(uint8_t* p) const { std::free(p); }
    };
    thread_local std::unique_ptr<uint8_t[], Free> bounce;
    if (!bounce) {
      bounce.reset(static_cast<uint8_t*>(std::aligned_alloc(WriteCombiner::kAlign, kBounce)));
      if (!bounce) return false;
    }
    for (size_t done = 0; done < buf.size();) {
      const size_t n = std::min(kBounce, buf.size() - done);
      std::memcpy(bounce.get(), buf.data() + done, n);
      Status s = WriteVector(dfd_, offset + done, {iovec{bounce.get(), n}});
      if (RefusedDirect(s)) return false;
      UB_RETURN_IF_ERROR(s);
      done += n;
    }
    return true;
  }

  // pwritev may write less than asked (and takes at most IOV_MAX pieces):
  // advance past what was written and go on.
  Status WriteVector(int fd, uint64_t offset, std::vector<iovec> iov) {
    size_t first = 0;
    uint64_t done = 0;
    while (first < iov.size()) {
      int cnt = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
      // Through the page cache at most buffered_chunk_ bytes a call: the
      // host's file system sizes the page-cache folios it fills by the
      // length of the write, and filling 1 MiB folios ran at half the speed
      // of 64 KiB ones on the VM measured, system time 1.3-1.6 s against
      // 0.35 s for an import of 1 GiB (docs/BENCHMARKS.md, session 22).
      size_t trimmed = SIZE_MAX;
      iovec saved{};
      if (fd == fd_ && buffered_chunk_ > 0) {
        size_t sum = 0;
        int k = 0;
        while (k < cnt && sum + iov[first + k].iov_len < buffered_chunk_) sum += iov[first + k++].iov_len;
        if (k < cnt) {
          trimmed = first + k;
          saved = iov[trimmed];
          iov[trimmed].iov_len = buffered_chunk_ - sum;
          cnt = k + 1;
        }
      }
      ssize_t n = ::pwritev(fd, iov.data() + first, cnt, static_cast<off_t>(offset + done));
      if (trimmed != SIZE_MAX) iov[trimmed] = saved;
      if (n < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        return Status::Error(e, path_ + ": write at offset " + std::to_string(offset + done) + ": " + Errno(e));
      }
      done += static_cast<uint64_t>(n);
      unflushed_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      for (size_t left = static_cast<size_t>(n); first < iov.size() && left > 0;) {
        if (left >= iov[first].iov_len) {
          left -= iov[first].iov_len;
          ++first;
        } else {
          iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
          iov[first].iov_len -= left;
          left = 0;
        }
      }
      while (first < iov.size() && iov[first].iov_len == 0) ++first;
    }
    return Status::Ok();
  }

  Result<bool> CloneOrCopy(int src_fd, uint64_t src_off, uint64_t offset, uint64_t len) {
    if (offset + len > Size()) return false;
    if (clone_ok_) {
      file_clone_range r{};
      r.src_fd = src_fd;
      r.src_offset = src_off;
      r.src_length = len;
      r.dest_offset = offset;
      if (::ioctl(fd_, FICLONERANGE, &r) == 0) {
        GlobalCloneCounts().cloned += len;
        return true;
      }
      // Another file system, or one that cannot clone (ext4), or blocks
      // larger than the range's alignment: no clone from here on, but the
      // kernel may still copy.
      if (errno != EINVAL) clone_ok_ = false;
    }
    if (!copy_ok_) return false;
    uint64_t done = 0;
    while (done < len) {
      loff_t in = static_cast<loff_t>(src_off + done), out = static_cast<loff_t>(offset + done);
      ssize_t n = ::copy_file_range(src_fd, &in, fd_, &out, len - done, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (done == 0 && (n == 0 || errno == EXDEV || errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL)) {
          copy_ok_ = n != 0;
          return false;
        }
        if (n == 0) return Status::IoError(path_ + ": copy_file_range stopped at the end of its source");
        int e = errno;
        return Status::Error(e, path_ + ": copy_file_range to offset " + std::to_string(out) + ": " + Errno(e));
      }
      done += static_cast<uint64_t>(n);
    }
    GlobalCloneCounts().copied += len;
    return true;
  }

  int fd_;
  // The same file opened O_DIRECT for data writes (WriteDirect), or -1:
  // not asked for (OpenFlags::direct_writes), read-only, or a host file
  // system without direct I/O (tmpfs). Reads and the commit's metadata go through fd_,
  // whose page cache the kernel keeps coherent with direct writes.
  int dfd_;
  size_t dio_align_;
  std::atomic<bool> direct_{false};
  std::string path_;
  // Grows with writes past the end, from any thread.
  std::atomic<uint64_t> size_;
  void Grow(uint64_t end) {
    uint64_t cur = size_.load(std::memory_order_relaxed);
    while (end > cur && !size_.compare_exchange_weak(cur, end, std::memory_order_relaxed)) {
    }
  }
  // 0: no limit (UBTRFS_BUFFERED_CHUNK=0, to measure against).
  size_t buffered_chunk_ = size_t{64} << 10;
  bool clone_ok_ = true;  // until the host file system says it cannot
  bool copy_ok_ = true;
  // Small writes gather in *active_; a full batch moves to *inflight_ and is
  // written by the thread that filled it, outside the lock (writing_).
  // A read or write that meets the batch in flight waits for it
  // (written_cv_); one batch is in flight at a time.
  std::mutex gather_mu_;  // guards the pointers, *active_, writing_, the bounds and failed_
  std::condition_variable written_cv_;
  WriteCombiner batches_[2];
  WriteCombiner* active_ = &batches_[0];
  WriteCombiner* inflight_ = &batches_[1];
  bool writing_ = false;
  uint64_t inflight_lo_ = 0, inflight_hi_ = 0;
  std::atomic<bool> gathered_{false};  // something gathered or in flight, read without the lock
  Status failed_;
  // The background flush (RequestBackgroundFlush): bytes written since a
  // flush last started, and the flusher thread, started at the first
  // request and stopped by the destructor.
  std::atomic<uint64_t> unflushed_{0};
  std::mutex bg_mu_;  // guards bg_running_, bg_stop_ and starting bg_
  std::condition_variable bg_cv_;
  bool bg_running_ = false;
  bool bg_stop_ = false;
  std::thread bg_;
};

}  // namespace

CloneCounts& GlobalCloneCounts() { return g_clone_counts; }

namespace {

class MemoryDevice final : public BlockDevice {
 public:
  MemoryDevice(std::string name, std::span<const uint8_t> bytes)
      : name_(std::move(name)), bytes_(bytes.begin(), bytes.end()) {}
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    if (offset > bytes_.size() || buf.size() > bytes_.size() - offset) {
      return Status::IoError(name_ + ": read of " + std::to_string(buf.size()) + " bytes at offset " +
                             std::to_string(offset) + " is past the end of the device (" +
                             std::to_string(bytes_.size()) + " bytes)");
    }
    std::memcpy(buf.data(), bytes_.data() + offset, buf.size());
    return Status::Ok();
  }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    if (offset + buf.size() > bytes_.size()) bytes_.resize(offset + buf.size());
    std::memcpy(bytes_.data() + offset, buf.data(), buf.size());
    return Status::Ok();
  }
  Status Flush() override { return Status::Ok(); }
  uint64_t Size() const override { return bytes_.size(); }
  std::string Name() const override { return name_; }

 private:
  std::string name_;
  std::vector<uint8_t> bytes_;
};

}  // namespace

namespace {

// A second descriptor of the file for direct writes, and their alignment,
// when the host file system reports one (statx STATX_DIOALIGN) no larger
// than a sector of ours, so that every aligned data write qualifies.
std::pair<int, size_t> OpenDirect(const std::string& path, int fd, std::optional<bool> want) {
  if (!want) {
    const char* v = std::getenv("UBTRFS_DIRECT_IO");
    want = v && *v && std::strcmp(v, "0") != 0;
  }
  if (!*want) return {-1, 0};
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0 || !(sx.stx_mask & STATX_DIOALIGN)) return {-1, 0};
  const size_t align = std::max(sx.stx_dio_mem_align, sx.stx_dio_offset_align);
  if (align == 0 || align > WriteCombiner::kAlign || (align & (align - 1))) return {-1, 0};
  int dfd = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  if (dfd < 0) return {-1, 0};
  // The same file, not one renamed into its place in between.
  struct stat a, b;
  if (::fstat(fd, &a) != 0 || ::fstat(dfd, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
    ::close(dfd);
    return {-1, 0};
  }
  return {dfd, align};
}

}  // namespace

Result<std::unique_ptr<BlockDevice>> OpenFileDevice(const std::string& path, OpenFlags flags) {
  int fd = ::open(path.c_str(), (flags.writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return Status::Error(e, path + ": cannot open: " + Errno(e));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::Error(e, path + ": fstat: " + Errno(e));
  }
  uint64_t size = 0;
  if (S_ISREG(st.st_mode)) {
    size = static_cast<uint64_t>(st.st_size);
  } else if (S_ISBLK(st.st_mode)) {
    if (::ioctl(fd, BLKGETSIZE64, &size) != 0) {
      int e = errno;
      ::close(fd);
      return Status::Error(e, path + ": BLKGETSIZE64: " + Errno(e));
    }
  } else {
    ::close(fd);
    return Status::Invalid(path + ": not a regular file or block device");
  }
  auto [dfd, align] = flags.writable ? OpenDirect(path, fd, flags.direct_writes) : std::pair(-1, size_t{0});
  auto* dev = new FileDevice(fd, dfd, align, path, size);
  if (const char* v = std::getenv("UBTRFS_BUFFERED_CHUNK"); v && *v) dev->SetBufferedChunk(std::strtoul(v, nullptr, 10));
  return std::unique_ptr<BlockDevice>(dev);
}

std::unique_ptr<BlockDevice> NewMemoryDevice(std::string name, std::span<const uint8_t> bytes) {
  return std::make_unique<MemoryDevice>(std::move(name), bytes);
}

}  // namespace ubtrfs::io
