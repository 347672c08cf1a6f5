#include "io/fault_device.h"

#include <cstring>

namespace ubtrfs::io {

const char* FaultOpName(FaultOp op) {
  switch (op) {
    case FaultOp::kRead: return "read";
    case FaultOp::kWrite: return "write";
    case FaultOp::kFlush: return "flush";
  }
  return "?";
}

uint64_t& FaultDevice::Counter(FaultOp op) {
  switch (op) {
    case FaultOp::kRead: return reads_;
    case FaultOp::kWrite: return writes_;
    case FaultOp::kFlush: break;
  }
  return flushes_;
}

void FaultDevice::FailNth(FaultOp op, uint64_t n, int error) {
  std::lock_guard<std::mutex> lock(mu_);
  Rule r;
  r.kind = Rule::Kind::kNth;
  r.op = op;
  r.at = Counter(op) + (n == 0 ? 1 : n);
  r.error = error;
  rules_.push_back(r);
}

void FaultDevice::FailAfter(FaultOp op, uint64_t n, int error) {
  std::lock_guard<std::mutex> lock(mu_);
  Rule r;
  r.kind = Rule::Kind::kAfter;
  r.op = op;
  r.at = Counter(op) + n;
  r.error = error;
  rules_.push_back(r);
}

void FaultDevice::FailRange(FaultOp op, uint64_t offset, uint64_t len, int error) {
  std::lock_guard<std::mutex> lock(mu_);
  Rule r;
  r.kind = Rule::Kind::kRange;
  r.op = op;
  r.offset = offset;
  r.len = len;
  r.error = error;
  rules_.push_back(r);
}

void FaultDevice::SetFull(bool full) {
  std::lock_guard<std::mutex> lock(mu_);
  full_ = full;
}

void FaultDevice::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
  full_ = false;
}

uint64_t FaultDevice::reads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reads_;
}
uint64_t FaultDevice::writes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writes_;
}
uint64_t FaultDevice::flushes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flushes_;
}
uint64_t FaultDevice::faults() const {
  std::lock_guard<std::mutex> lock(mu_);
  return faults_;
}
std::string FaultDevice::last_fault() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_fault_;
}

Status FaultDevice::Check(FaultOp op, uint64_t offset, uint64_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t count = ++Counter(op);
  int error = 0;
  std::string why;
  if (op == FaultOp::kWrite && full_) {
    error = ENOSPC;
    why = "device full";
  }
  for (Rule& r : rules_) {
    if (error != 0) break;
    if (r.op != op) continue;
    switch (r.kind) {
      case Rule::Kind::kNth:
        if (!r.used && count == r.at) {
          r.used = true;
          error = r.error;
          why = std::string(FaultOpName(op)) + " number " + std::to_string(count);
        }
        break;
      case Rule::Kind::kAfter:
        if (count > r.at) {
          error = r.error;
          why = std::string(FaultOpName(op)) + "s after number " + std::to_string(r.at);
        }
        break;
      case Rule::Kind::kRange:
        if (op != FaultOp::kFlush && offset < r.offset + r.len && r.offset < offset + len) {
          error = r.error;
          why = "bytes [" + std::to_string(r.offset) + ", " + std::to_string(r.offset + r.len) + ")";
        }
        break;
    }
  }
  if (error == 0) return Status::Ok();
  ++faults_;
  std::string what = op == FaultOp::kFlush
                         ? std::string("flush")
                         : std::string(FaultOpName(op)) + " of " + std::to_string(len) + " bytes at offset " +
                               std::to_string(offset);
  last_fault_ = inner_->Name() + ": " + what + ": " + std::strerror(error) + " (injected fault: " + why + ")";
  return Status::Error(error, last_fault_);
}

Status FaultDevice::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  UB_RETURN_IF_ERROR(Check(FaultOp::kRead, offset, buf.size()));
  return inner_->ReadAt(offset, buf);
}

Status FaultDevice::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  UB_RETURN_IF_ERROR(Check(FaultOp::kWrite, offset, buf.size()));
  return inner_->WriteAt(offset, buf);
}

Status FaultDevice::Flush() {
  UB_RETURN_IF_ERROR(Check(FaultOp::kFlush, 0, 0));
  return inner_->Flush();
}

}  // namespace ubtrfs::io
