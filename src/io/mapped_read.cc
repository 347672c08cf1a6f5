#include "io/mapped_read.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <mutex>
#include <utility>

namespace ubtrfs::io {
namespace {

// Where a SIGBUS on this thread goes: set only while TouchMapped runs fn.
// Initial-exec TLS, so the handler reads it without a call that could
// allocate.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* t_jump = nullptr;

struct sigaction g_previous;
std::once_flag g_installed;
// Cleared for good once the kernel refuses MADV_POPULATE_READ.
std::atomic<bool> g_populate_works{true};

void OnSigbus(int, siginfo_t*, void*) {
  if (t_jump != nullptr) siglongjmp(*t_jump, 1);
  // Not a read of ours: the previous disposition takes the fault when the
  // instruction runs again.
  sigaction(SIGBUS, &g_previous, nullptr);
}

void Install() {
  struct sigaction sa = {};
  sa.sa_sigaction = OnSigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

MappedBytes& MappedBytes::operator=(MappedBytes&& o) noexcept {
  if (this != &o) {
    Unmap();
    base_ = std::exchange(o.base_, nullptr);
    base_len_ = std::exchange(o.base_len_, 0);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void MappedBytes::Unmap() {
  if (base_ != nullptr) ::munmap(base_, base_len_);
  base_ = nullptr;
  data_ = nullptr;
}

MappedBytes MapFileRange(int fd, uint64_t offset, size_t len) {
  if (len == 0 || !g_populate_works.load(std::memory_order_relaxed)) return {};
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  const size_t span = static_cast<size_t>(offset + len - start);
  void* m = ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  if (m == MAP_FAILED) return {};
  MappedBytes out(m, span, static_cast<size_t>(offset - start), len);
  for (;;) {
    if (::madvise(m, span, MADV_POPULATE_READ) == 0) return out;
    if (errno == EINTR) continue;
    if (errno == EINVAL) g_populate_works.store(false, std::memory_order_relaxed);
    return {};  // EFAULT: a page did not read; ReadAt names the error
  }
}

Result<bool> TouchMapped(bool (*fn)(const void* ctx), const void* ctx) {
  std::call_once(g_installed, Install);
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1) != 0) {
    t_jump = nullptr;
    return Status::IoError("a page of the mapped image could not be read (SIGBUS)");
  }
  t_jump = &jump;
  const bool r = fn(ctx);
  t_jump = nullptr;
  return r;
}

}  // namespace ubtrfs::io
