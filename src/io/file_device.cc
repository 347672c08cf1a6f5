#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

#include "io/block_device.h"
#include "io/write_combiner.h"

namespace ubtrfs::io {
namespace {

std::string Errno(int e) { return std::strerror(e); }

CloneCounts g_clone_counts;

class FileDevice final : public BlockDevice {
 public:
  FileDevice(int fd, std::string path, uint64_t size) : fd_(fd), path_(std::move(path)), size_(size) {}
  ~FileDevice() override {
    // Nothing gathered is committed yet (a commit flushes first); written
    // anyway, as a pwrite would have left it in the page cache.
    if (gathered_.load()) {
      std::lock_guard lock(gather_mu_);
      (void)DrainLocked();
    }
    ::close(fd_);
  }

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    UB_RETURN_IF_ERROR(DrainIfOverlaps(offset, buf.size()));
    if (offset > size_ || buf.size() > size_ - offset) {
      return Status::IoError(path_ + ": read of " + std::to_string(buf.size()) + " bytes at offset " +
                             std::to_string(offset) + " is past the end of the device (" +
                             std::to_string(size_) + " bytes; truncated image?)");
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

  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    if (combiner_.Takes(buf.size())) {
      std::lock_guard lock(gather_mu_);
      if (!failed_.ok()) return failed_;
      if (combiner_.Overlaps(offset, buf.size())) UB_RETURN_IF_ERROR(DrainLocked());
      combiner_.Add(offset, buf);
      gathered_.store(true);
      if (offset + buf.size() > size_) size_ = offset + buf.size();
      return combiner_.Full() ? DrainLocked() : Status::Ok();
    }
    UB_RETURN_IF_ERROR(DrainIfOverlaps(offset, buf.size()));
    size_t done = 0;
    while (done < buf.size()) {
      ssize_t n = ::pwrite(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        return Status::Error(e, path_ + ": write at offset " + std::to_string(offset + done) + ": " + Errno(e));
      }
      done += static_cast<size_t>(n);
    }
    if (offset + buf.size() > size_) size_ = offset + buf.size();
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
    UB_RETURN_IF_ERROR(WriteVector(offset, std::move(iov)));
    if (offset + total > size_) size_ = offset + total;
    return Status::Ok();
  }

  Result<bool> CloneFrom(int src_fd, uint64_t src_off, uint64_t offset, uint64_t len) override {
    UB_RETURN_IF_ERROR(DrainIfOverlaps(offset, len));
    return CloneOrCopy(src_fd, src_off, offset, len);
  }

  Status Flush() override {
    {
      std::lock_guard lock(gather_mu_);
      if (!combiner_.empty()) UB_RETURN_IF_ERROR(DrainLocked());
      // A gathered write that failed was acknowledged to its caller: no
      // flush may pass it off as durable, ever.
      if (!failed_.ok()) return failed_;
    }
    if (::fdatasync(fd_) != 0) {
      int e = errno;
      return Status::Error(e, path_ + ": fdatasync: " + Errno(e));
    }
    return Status::Ok();
  }

  // Errors are left to the Flush() that follows, which reports them.
  void StartWriteback() override {
    if (gathered_.load()) {
      std::lock_guard lock(gather_mu_);
      (void)DrainLocked();
    }
    (void)::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
  }

  uint64_t Size() const override { return size_; }
  std::string Name() const override { return path_; }

 private:
  Status DrainLocked() {
    Status s = combiner_.Drain([this](uint64_t offset, std::span<const iovec> run) {
      return WriteVector(offset, std::vector<iovec>(run.begin(), run.end()));
    });
    gathered_.store(false);
    if (!s.ok() && failed_.ok()) failed_ = s;
    return s;
  }

  Status DrainIfOverlaps(uint64_t offset, uint64_t len) {
    if (!gathered_.load()) return Status::Ok();
    std::lock_guard lock(gather_mu_);
    return combiner_.Overlaps(offset, len) ? DrainLocked() : Status::Ok();
  }

  // pwritev may write less than asked (and takes at most IOV_MAX pieces):
  // advance past what was written and go on.
  Status WriteVector(uint64_t offset, std::vector<iovec> iov) {
    size_t first = 0;
    uint64_t done = 0;
    while (first < iov.size()) {
      const int cnt = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
      ssize_t n = ::pwritev(fd_, iov.data() + first, cnt, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        return Status::Error(e, path_ + ": write at offset " + std::to_string(offset + done) + ": " + Errno(e));
      }
      done += static_cast<uint64_t>(n);
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
    if (offset + len > size_) return false;
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
  std::string path_;
  uint64_t size_;
  bool clone_ok_ = true;  // until the host file system says it cannot
  bool copy_ok_ = true;
  std::mutex gather_mu_;  // guards combiner_ and failed_
  WriteCombiner combiner_;
  std::atomic<bool> gathered_{false};  // !combiner_.empty(), read without the lock
  Status failed_;
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
  return std::unique_ptr<BlockDevice>(new FileDevice(fd, path, size));
}

std::unique_ptr<BlockDevice> NewMemoryDevice(std::string name, std::span<const uint8_t> bytes) {
  return std::make_unique<MemoryDevice>(std::move(name), bytes);
}

}  // namespace ubtrfs::io
