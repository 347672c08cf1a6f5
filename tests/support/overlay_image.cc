#include "support/overlay_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace ubtrfs_test {

using ubtrfs::Result;
using ubtrfs::Status;

namespace {

Status Errno(const std::string& what) {
  const int e = errno;
  return Status::Error(e, what + ": " + std::strerror(e));
}

Status PreadAll(int fd, uint8_t* buf, uint64_t len, uint64_t off, const std::string& name) {
  while (len > 0) {
    ssize_t n = ::pread(fd, buf, len, static_cast<off_t>(off));
    if (n < 0) return Errno(name + ": read");
    if (n == 0) {
      std::memset(buf, 0, len);  // past a short base file: zeros
      return Status::Ok();
    }
    buf += n;
    off += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status PwriteAll(int fd, const uint8_t* buf, uint64_t len, uint64_t off, const std::string& name) {
  while (len > 0) {
    ssize_t n = ::pwrite(fd, buf, len, static_cast<off_t>(off));
    if (n <= 0) return Errno(name + ": write");
    buf += n;
    off += static_cast<uint64_t>(n);
    len -= static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

class OverlayDevice : public ubtrfs::io::BlockDevice {
 public:
  explicit OverlayDevice(std::shared_ptr<OverlayImage> img) : img_(std::move(img)) {}
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override { return img_->Read(offset, buf.data(), buf.size()); }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    return img_->Write(offset, buf.data(), buf.size());
  }
  Status Flush() override { return Status::Ok(); }
  uint64_t Size() const override { return img_->size(); }
  std::string Name() const override { return "overlay"; }

 private:
  std::shared_ptr<OverlayImage> img_;
};

}  // namespace

Result<std::shared_ptr<OverlayImage>> OverlayImage::Open(const std::string& base) {
  int fd = ::open(base.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno(base + ": open");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const Status s = Errno(base + ": fstat");
    ::close(fd);
    return s;
  }
  return std::shared_ptr<OverlayImage>(new OverlayImage(fd, base, static_cast<uint64_t>(st.st_size)));
}

OverlayImage::~OverlayImage() { ::close(fd_); }

std::unique_ptr<ubtrfs::io::BlockDevice> OverlayImage::Device() {
  return std::make_unique<OverlayDevice>(shared_from_this());
}

size_t OverlayImage::pages() const {
  std::lock_guard lock(mu_);
  return pages_.size();
}

Status OverlayImage::Read(uint64_t offset, uint8_t* buf, uint64_t len) {
  if (offset > size_ || len > size_ - offset) {
    return Status::Error(EIO, "read of " + std::to_string(len) + " bytes at " + std::to_string(offset) +
                                  " past the end of the " + std::to_string(size_) + "-byte overlay");
  }
  std::lock_guard lock(mu_);
  while (len > 0) {
    const uint64_t page = offset / kPage, in = offset % kPage, n = std::min(len, kPage - in);
    auto it = pages_.find(page);
    if (it != pages_.end()) {
      std::memcpy(buf, it->second->data() + in, n);
    } else {
      // Runs of pages not in memory come from the base in one read.
      uint64_t run = n;
      while (run < len && !pages_.count((offset + run) / kPage)) run += std::min(len - run, kPage);
      UB_RETURN_IF_ERROR(PreadAll(fd_, buf, run, offset, name_));
      buf += run;
      offset += run;
      len -= run;
      continue;
    }
    buf += n;
    offset += n;
    len -= n;
  }
  return Status::Ok();
}

Status OverlayImage::Write(uint64_t offset, const uint8_t* buf, uint64_t len) {
  if (offset > size_ || len > size_ - offset) {
    return Status::Error(EIO, "write of " + std::to_string(len) + " bytes at " + std::to_string(offset) +
                                  " past the end of the " + std::to_string(size_) + "-byte overlay");
  }
  std::lock_guard lock(mu_);
  while (len > 0) {
    const uint64_t page = offset / kPage, in = offset % kPage, n = std::min(len, kPage - in);
    auto& p = pages_[page];
    if (!p) {
      p = std::make_unique<Page>();
      if (n < kPage) UB_RETURN_IF_ERROR(PreadAll(fd_, p->data(), kPage, page * kPage, name_));
    }
    std::memcpy(p->data() + in, buf, n);
    buf += n;
    offset += n;
    len -= n;
  }
  return Status::Ok();
}

Status OverlayImage::WriteTo(const std::string& path) {
  int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return Errno(path + ": create");
  Status st;
  if (::ftruncate(out, static_cast<off_t>(size_)) != 0) st = Errno(path + ": truncate");
  // The base's data regions (it is sparse), then the pages.
  std::vector<uint8_t> buf(1 << 20);
  off_t pos = 0;
  while (st.ok()) {
    off_t data = ::lseek(fd_, pos, SEEK_DATA);
    if (data < 0) break;
    off_t hole = ::lseek(fd_, data, SEEK_HOLE);
    if (hole < 0) hole = static_cast<off_t>(size_);
    for (off_t at = data; at < hole && st.ok();) {
      const uint64_t n = std::min<uint64_t>(buf.size(), static_cast<uint64_t>(hole - at));
      st = PreadAll(fd_, buf.data(), n, static_cast<uint64_t>(at), name_);
      if (st.ok()) st = PwriteAll(out, buf.data(), n, static_cast<uint64_t>(at), path);
      at += static_cast<off_t>(n);
    }
    pos = hole;
  }
  if (st.ok()) {
    std::lock_guard lock(mu_);
    for (const auto& [page, p] : pages_) {
      st = PwriteAll(out, p->data(), kPage, page * kPage, path);
      if (!st.ok()) break;
    }
  }
  ::close(out);
  return st;
}

}  // namespace ubtrfs_test
