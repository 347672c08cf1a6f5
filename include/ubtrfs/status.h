// Status and Result<T>: errors travel as values carrying an errno code and a
// message that names what went wrong and where.
#ifndef UBTRFS_STATUS_H_
#define UBTRFS_STATUS_H_

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

namespace ubtrfs {

#ifndef EUCLEAN
#define EUCLEAN 117
#endif

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(int code, std::string message) {
    return Status(code == 0 ? EIO : code, std::move(message));
  }
  // Convenience constructors for the codes the project uses most.
  static Status Corrupt(std::string m) { return Error(EUCLEAN, std::move(m)); }
  static Status IoError(std::string m) { return Error(EIO, std::move(m)); }
  static Status Unsupported(std::string m) { return Error(EOPNOTSUPP, "unsupported: " + std::move(m)); }
  static Status NotFound(std::string m) { return Error(ENOENT, std::move(m)); }
  static Status Invalid(std::string m) { return Error(EINVAL, std::move(m)); }

  bool ok() const { return code_ == 0; }
  int code() const { return code_; }  // a positive errno value, 0 when ok
  const std::string& message() const { return message_; }
  std::string ToString() const {
    if (ok()) return "OK";
    return message_ + " (" + std::strerror(code_) + ")";
  }

  // Prefixes context ("reading inode 257: ...") to an error; no-op when ok.
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  Status(int code, std::string message) : code_(code), message_(std::move(message)) {}
  int code_ = 0;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {       // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status::Error(EIO, "internal: Result built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ubtrfs

#define UB_CONCAT_INNER(a, b) a##b
#define UB_CONCAT(a, b) UB_CONCAT_INNER(a, b)

#define UB_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::ubtrfs::Status ub_status_ = (expr);        \
    if (!ub_status_.ok()) return ub_status_;     \
  } while (0)

#define UB_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#define UB_ASSIGN_OR_RETURN(lhs, expr) \
  UB_ASSIGN_OR_RETURN_IMPL(UB_CONCAT(ub_result_, __LINE__), lhs, expr)

#endif  // UBTRFS_STATUS_H_
