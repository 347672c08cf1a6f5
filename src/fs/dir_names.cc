#include "fs/dir_names.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace ubtrfs::fsimpl {

const char* InvalidNameReason(std::string_view name) {
  if (name.empty()) return "empty name";
  if (name.size() > kNameMax) return "name longer than 255 bytes";
  if (name == "." || name == "..") return "name is \".\" or \"..\"";
  if (std::memchr(name.data(), '/', name.size()) != nullptr) return "name contains '/'";
  if (std::memchr(name.data(), '\0', name.size()) != nullptr) return "name contains a NUL byte";
  return nullptr;
}

std::string PrintableName(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  static const char kHex[] = "0123456789abcdef";
  for (unsigned char ch : name) {
    if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
      out.push_back(static_cast<char>(ch));
    } else {
      out += "\\x";
      out.push_back(kHex[ch >> 4]);
      out.push_back(kHex[ch & 15]);
    }
  }
  return out;
}

void FilterDirEntries(std::vector<DirEntry>* entries, std::vector<SkippedEntry>* skipped) {
  std::vector<DirEntry>& v = *entries;
  // Open addressing over entry positions (+1; 0 = empty), keyed by a hash of
  // the name: no allocation per entry, and names are compared only when
  // their hashes agree.
  size_t cap = 16;
  while (cap < v.size() * 2) cap <<= 1;
  std::vector<uint32_t> slots(v.size() > 1 ? cap : 0, 0);
  std::vector<uint64_t> hashes;
  hashes.reserve(v.size());
  const std::hash<std::string_view> hasher;
  size_t kept = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string_view name = v[i].name;
    const char* bad = InvalidNameReason(name);
    std::string reason;
    if (bad != nullptr) {
      reason = bad;
    } else if (!slots.empty()) {
      const uint64_t h = hasher(name);
      size_t s = h & (cap - 1);
      for (; slots[s] != 0; s = (s + 1) & (cap - 1)) {
        const size_t j = slots[s] - 1;
        if (hashes[j] == h && v[j].name == name) {
          reason = "duplicate of the entry at index " + std::to_string(v[j].index);
          break;
        }
      }
      if (reason.empty()) {
        hashes.push_back(h);
        slots[s] = static_cast<uint32_t>(kept + 1);
      }
    }
    if (!reason.empty()) {
      if (skipped != nullptr) skipped->push_back(SkippedEntry{std::move(v[i].name), v[i].index, std::move(reason)});
      continue;
    }
    if (kept != i) v[kept] = std::move(v[i]);
    ++kept;
  }
  v.resize(kept);
}

}  // namespace ubtrfs::fsimpl
