// Little-endian integers stored as bytes. On-disk structs are built from
// these, so they have alignment 1, no padding, and read correctly on any host.
#ifndef UBTRFS_FORMAT_ENDIAN_H_
#define UBTRFS_FORMAT_ENDIAN_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace ubtrfs::format {

template <typename T>
inline T LoadLe(const void* p) {
  static_assert(std::is_unsigned_v<T>);
  T v;
  std::memcpy(&v, p, sizeof(T));
  if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1) {
    if constexpr (sizeof(T) == 2) v = __builtin_bswap16(v);
    if constexpr (sizeof(T) == 4) v = __builtin_bswap32(v);
    if constexpr (sizeof(T) == 8) v = __builtin_bswap64(v);
  }
  return v;
}

template <typename T>
inline void StoreLe(void* p, T v) {
  static_assert(std::is_unsigned_v<T>);
  if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1) {
    if constexpr (sizeof(T) == 2) v = __builtin_bswap16(v);
    if constexpr (sizeof(T) == 4) v = __builtin_bswap32(v);
    if constexpr (sizeof(T) == 8) v = __builtin_bswap64(v);
  }
  std::memcpy(p, &v, sizeof(T));
}

template <typename T>
struct Le {
  unsigned char bytes[sizeof(T)];
  T get() const { return LoadLe<T>(bytes); }
  void set(T v) { StoreLe<T>(bytes, v); }
  operator T() const { return get(); }  // NOLINT: reads like a plain integer
  Le& operator=(T v) {
    set(v);
    return *this;
  }
};

using Le16 = Le<uint16_t>;
using Le32 = Le<uint32_t>;
using Le64 = Le<uint64_t>;
static_assert(sizeof(Le64) == 8 && alignof(Le64) == 1);

}  // namespace ubtrfs::format

#endif  // UBTRFS_FORMAT_ENDIAN_H_
