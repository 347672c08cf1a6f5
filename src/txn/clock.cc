#include "txn/clock.h"

#include <sodium.h>
#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

namespace ubtrfs::txn {
namespace {

std::atomic<bool> g_fixed{false};
std::atomic<int64_t> g_sec{0};
std::mutex g_seed_mutex;
std::array<uint8_t, 16> g_seed{};  // guarded by g_seed_mutex
uint64_t g_counter = 0;            // guarded by g_seed_mutex

}  // namespace

void SetDeterministic(int64_t sec, const std::array<uint8_t, 16>& seed) {
  std::lock_guard lock(g_seed_mutex);
  g_seed = seed;
  g_counter = 0;
  g_sec = sec;
  g_fixed = true;
}

void ClearDeterministic() {
  std::lock_guard lock(g_seed_mutex);
  g_fixed = false;
}

bool Deterministic() { return g_fixed.load(std::memory_order_relaxed); }

timespec WallClock(bool coarse) {
  timespec ts{};
  if (g_fixed.load(std::memory_order_relaxed)) {
    ts.tv_sec = static_cast<time_t>(g_sec.load(std::memory_order_relaxed));
    return ts;
  }
  clock_gettime(coarse ? CLOCK_REALTIME_COARSE : CLOCK_REALTIME, &ts);
  return ts;
}

std::array<uint8_t, 16> DeriveUuid(const std::array<uint8_t, 16>& seed, uint64_t purpose) {
  uint8_t in[24];
  std::memcpy(in, seed.data(), 16);
  for (int i = 0; i < 8; ++i) in[16 + i] = static_cast<uint8_t>(purpose >> (8 * i));
  std::array<uint8_t, 16> out{};
  crypto_generichash(out.data(), out.size(), in, sizeof in, nullptr, 0);
  out[6] = static_cast<uint8_t>((out[6] & 0x0f) | 0x40);  // version 4
  out[8] = static_cast<uint8_t>((out[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return out;
}

std::array<uint8_t, 16> SeedFromText(std::string_view text) {
  std::array<uint8_t, 16> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(text.data()), text.size(),
                     nullptr, 0);
  return out;
}

Status NewUuid(uint8_t out[16]) {
  if (g_fixed.load(std::memory_order_relaxed)) {
    std::lock_guard lock(g_seed_mutex);
    const auto u = DeriveUuid(g_seed, 1000 + g_counter++);
    std::memcpy(out, u.data(), u.size());
    return Status::Ok();
  }
  size_t done = 0;
  while (done < 16) {
    const ssize_t n = getrandom(out + done, 16 - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      return Status::Error(e, std::string("getrandom for a uuid: ") + std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  out[6] = static_cast<uint8_t>((out[6] & 0x0f) | 0x40);
  out[8] = static_cast<uint8_t>((out[8] & 0x3f) | 0x80);
  return Status::Ok();
}

}  // namespace ubtrfs::txn
