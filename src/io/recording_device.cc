#include "io/recording_device.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <set>

namespace ubtrfs::io {

// ---- SparseImage ------------------------------------------------------------------------------

SparseImage::SparseImage(const SparseImage& other) : size_(other.size_), base_(other.base_) {
  pages_.reserve(other.pages_.size());
  for (const auto& [index, page] : other.pages_) {
    auto copy = std::make_unique<uint8_t[]>(kPageSize);
    std::memcpy(copy.get(), page.get(), kPageSize);
    pages_.emplace(index, std::move(copy));
  }
}

SparseImage& SparseImage::operator=(const SparseImage& other) {
  if (this != &other) {
    SparseImage copy(other);
    size_ = copy.size_;
    base_ = copy.base_;
    pages_ = std::move(copy.pages_);
  }
  return *this;
}

SparseImage SparseImage::FromBytes(std::span<const uint8_t> bytes) {
  SparseImage img(bytes.size());
  for (uint64_t off = 0; off < bytes.size(); off += kPageSize) {
    auto page = bytes.subspan(off, std::min<uint64_t>(kPageSize, bytes.size() - off));
    if (std::any_of(page.begin(), page.end(), [](uint8_t b) { return b != 0; })) img.Write(off, page);
  }
  return img;
}

const uint8_t* SparseImage::FindPage(uint64_t index) const {
  for (const SparseImage* img = this; img != nullptr; img = img->base_) {
    auto it = img->pages_.find(index);
    if (it != img->pages_.end()) return it->second.get();
  }
  return nullptr;
}

uint8_t* SparseImage::MutablePage(uint64_t index) {
  auto it = pages_.find(index);
  if (it != pages_.end()) return it->second.get();
  auto page = std::make_unique<uint8_t[]>(kPageSize);
  if (const uint8_t* below = base_ ? base_->FindPage(index) : nullptr) {
    std::memcpy(page.get(), below, kPageSize);
  } else {
    std::memset(page.get(), 0, kPageSize);
  }
  return pages_.emplace(index, std::move(page)).first->second.get();
}

void SparseImage::Read(uint64_t offset, std::span<uint8_t> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const uint64_t pos = offset + done;
    const uint64_t in_page = pos % kPageSize;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPageSize - in_page, out.size() - done));
    if (const uint8_t* page = FindPage(pos / kPageSize)) {
      std::memcpy(out.data() + done, page + in_page, n);
    } else {
      std::memset(out.data() + done, 0, n);
    }
    done += n;
  }
}

void SparseImage::Write(uint64_t offset, std::span<const uint8_t> data) {
  size_t done = 0;
  while (done < data.size()) {
    const uint64_t pos = offset + done;
    const uint64_t in_page = pos % kPageSize;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPageSize - in_page, data.size() - done));
    std::memcpy(MutablePage(pos / kPageSize) + in_page, data.data() + done, n);
    done += n;
  }
  size_ = std::max<uint64_t>(size_, offset + data.size());
}

Status SparseImage::SaveToFile(const std::string& path) const {
  std::set<uint64_t> indices;
  for (const SparseImage* img = this; img != nullptr; img = img->base_) {
    for (const auto& [index, page] : img->pages_) indices.insert(index);
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int e = errno;
    return Status::Error(e, path + ": cannot create: " + std::strerror(e));
  }
  auto fail = [&](const std::string& what) {
    int e = errno;
    ::close(fd);
    return Status::Error(e, path + ": " + what + ": " + std::strerror(e));
  };
  if (::ftruncate(fd, static_cast<off_t>(size_)) != 0) return fail("ftruncate");
  for (uint64_t index : indices) {
    const uint64_t off = index * kPageSize;
    if (off >= size_) continue;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPageSize, size_ - off));
    const uint8_t* page = FindPage(index);
    size_t done = 0;
    while (done < n) {
      ssize_t w = ::pwrite(fd, page + done, n - done, static_cast<off_t>(off + done));
      if (w < 0) {
        if (errno == EINTR) continue;
        return fail("write at offset " + std::to_string(off + done));
      }
      done += static_cast<size_t>(w);
    }
  }
  if (::close(fd) != 0) {
    int e = errno;
    return Status::Error(e, path + ": close: " + std::strerror(e));
  }
  return Status::Ok();
}

std::vector<uint8_t> SparseImage::ToBytes() const {
  std::vector<uint8_t> out(size_);
  Read(0, out);
  return out;
}

// ---- RecordingDevice --------------------------------------------------------------------------

RecordingDevice::RecordingDevice(std::string name, uint64_t size)
    : name_(std::move(name)), initial_(size), current_(size) {}

RecordingDevice::RecordingDevice(std::string name, SparseImage image)
    : name_(std::move(name)), initial_(image), current_(std::move(image)) {}

Status RecordingDevice::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  std::lock_guard<std::mutex> lock(mu_);
  if (offset > current_.size() || buf.size() > current_.size() - offset) {
    return Status::IoError(name_ + ": read of " + std::to_string(buf.size()) + " bytes at offset " +
                           std::to_string(offset) + " is past the end of the device (" +
                           std::to_string(current_.size()) + " bytes)");
  }
  current_.Read(offset, buf);
  return Status::Ok();
}

Status RecordingDevice::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  std::lock_guard<std::mutex> lock(mu_);
  current_.Write(offset, buf);
  log_.push_back(LogEntry{LogEntry::Kind::kWrite, offset, std::vector<uint8_t>(buf.begin(), buf.end())});
  bytes_logged_ += buf.size();
  return Status::Ok();
}

Status RecordingDevice::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  log_.push_back(LogEntry{LogEntry::Kind::kFlush, 0, {}});
  return Status::Ok();
}

uint64_t RecordingDevice::Size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_.size();
}

void RecordingDevice::ResetLog() {
  std::lock_guard<std::mutex> lock(mu_);
  initial_ = current_;
  log_.clear();
  log_.shrink_to_fit();
  bytes_logged_ = 0;
}

size_t RecordingDevice::position() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_.size();
}

uint64_t RecordingDevice::bytes_logged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_logged_;
}

// ---- Crash points -----------------------------------------------------------------------------

const char* CrashModeName(CrashMode mode) {
  switch (mode) {
    case CrashMode::kPrefix: return "prefix";
    case CrashMode::kDropUnflushed: return "drop-unflushed";
    case CrashMode::kSubset: return "subset";
    case CrashMode::kTorn: return "torn";
  }
  return "?";
}

std::string CrashPoint::ToString() const {
  std::string s = "crash after " + std::to_string(entries) + " log entries (" + CrashModeName(mode);
  if (mode == CrashMode::kSubset || mode == CrashMode::kTorn) s += ", seed " + std::to_string(seed);
  return s + ")";
}

Status CrashImage::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  if (offset > image_.size() || buf.size() > image_.size() - offset) {
    return Status::IoError(name_ + ": read of " + std::to_string(buf.size()) + " bytes at offset " +
                           std::to_string(offset) + " is past the end of the device (" +
                           std::to_string(image_.size()) + " bytes)");
  }
  image_.Read(offset, buf);
  return Status::Ok();
}

Status CrashImage::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  image_.Write(offset, buf);
  return Status::Ok();
}

CrashReplayer::CrashReplayer(const RecordingDevice* rec) : rec_(rec), durable_(rec->initial()) {
  const auto& log = rec_->log();
  flush_before_.resize(log.size() + 1);
  size_t last = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    flush_before_[i] = last;
    if (log[i].kind == LogEntry::Kind::kFlush) last = i + 1;
  }
  flush_before_[log.size()] = last;
}

bool CrashReplayer::Atomic(const LogEntry& e) const {
  for (const auto& [off, len] : atomic_) {
    if (e.offset >= off && e.offset + e.data.size() <= off + len) return true;
  }
  return false;
}

size_t CrashReplayer::DurablePrefix(size_t entries) const {
  return flush_before_[std::min(entries, flush_before_.size() - 1)];
}

void CrashReplayer::AdvanceDurable(size_t prefix) {
  if (prefix < durable_pos_) {
    durable_ = rec_->initial();
    durable_pos_ = 0;
    ++restarts_;
  }
  const auto& log = rec_->log();
  for (; durable_pos_ < prefix; ++durable_pos_) {
    const LogEntry& e = log[durable_pos_];
    if (e.kind == LogEntry::Kind::kWrite) durable_.Write(e.offset, e.data);
    ++entries_applied_;
  }
}

Result<std::unique_ptr<CrashImage>> CrashReplayer::Materialize(const CrashPoint& point) {
  const auto& log = rec_->log();
  if (point.entries > log.size()) {
    return Status::Invalid("crash point after " + std::to_string(point.entries) + " entries, but the log has " +
                           std::to_string(log.size()));
  }
  const size_t durable = DurablePrefix(point.entries);
  AdvanceDurable(durable);
  auto img = std::make_unique<CrashImage>(rec_->Name() + " " + point.ToString(), &durable_);
  std::vector<size_t> unflushed;
  for (size_t i = durable; i < point.entries; ++i) {
    if (log[i].kind == LogEntry::Kind::kWrite) unflushed.push_back(i);
  }
  std::mt19937_64 rng(point.seed * 0x9e3779b97f4a7c15ull + point.entries);
  std::vector<size_t> chosen;
  size_t torn = SIZE_MAX;
  switch (point.mode) {
    case CrashMode::kPrefix:
      chosen = unflushed;
      break;
    case CrashMode::kDropUnflushed:
      break;
    case CrashMode::kSubset:
    case CrashMode::kTorn: {
      if (point.mode == CrashMode::kTorn) {
        std::vector<size_t> tearable;
        for (size_t k = 0; k < unflushed.size(); ++k) {
          if (!Atomic(log[unflushed[k]])) tearable.push_back(k);
        }
        if (!tearable.empty()) {
          const size_t pick = tearable[rng() % tearable.size()];
          torn = unflushed[pick];
          unflushed.erase(unflushed.begin() + static_cast<long>(pick));
        }
      }
      for (size_t i : unflushed) {
        if (rng() % 2) chosen.push_back(i);
      }
      std::shuffle(chosen.begin(), chosen.end(), rng);
      break;
    }
  }
  for (size_t i : chosen) {
    img->image_.Write(log[i].offset, log[i].data);
    img->applied_.push_back(i);
  }
  if (torn != SIZE_MAX) {
    const LogEntry& e = log[torn];
    // Sectors of the device the write covers, in the order the device might
    // have finished them; a random nonempty proper subset lands (a write of
    // one sector cannot tear, so it lands whole or not at all).
    const uint64_t first = e.offset / kTornSectorSize;
    const uint64_t last = (e.offset + e.data.size() + kTornSectorSize - 1) / kTornSectorSize;
    const uint64_t n = last - first;
    std::vector<uint64_t> sectors;
    if (n <= 1) {
      if (rng() % 2) sectors.push_back(0);
    } else {
      const uint64_t keep = 1 + rng() % (n - 1);
      std::vector<uint64_t> all(n);
      for (uint64_t s = 0; s < n; ++s) all[s] = s;
      std::shuffle(all.begin(), all.end(), rng);
      sectors.assign(all.begin(), all.begin() + static_cast<long>(keep));
      std::sort(sectors.begin(), sectors.end());
    }
    for (uint64_t s : sectors) {
      const uint64_t from = std::max<uint64_t>(e.offset, (first + s) * kTornSectorSize);
      const uint64_t to = std::min<uint64_t>(e.offset + e.data.size(), (first + s + 1) * kTornSectorSize);
      img->image_.Write(from, std::span<const uint8_t>(e.data).subspan(from - e.offset, to - from));
    }
    img->applied_.push_back(torn);
    img->torn_entry_ = torn;
    img->torn_sectors_ = std::move(sectors);
  }
  return img;
}

// ---- Unowned ----------------------------------------------------------------------------------

namespace {

class UnownedDevice final : public BlockDevice {
 public:
  explicit UnownedDevice(BlockDevice* dev) : dev_(dev) {}
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override { return dev_->ReadAt(offset, buf); }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override { return dev_->WriteAt(offset, buf); }
  Status Flush() override { return dev_->Flush(); }
  void StartWriteback() override { dev_->StartWriteback(); }
  uint64_t Size() const override { return dev_->Size(); }
  std::string Name() const override { return dev_->Name(); }

 private:
  BlockDevice* dev_;
};

}  // namespace

std::unique_ptr<BlockDevice> NewUnownedDevice(BlockDevice* dev) { return std::make_unique<UnownedDevice>(dev); }

}  // namespace ubtrfs::io
