#include "fs/dir_names.h"

#include <algorithm>
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
  const size_t n = v.size();
  // Pass 1, sequential: each name's validity and hash.
  std::vector<uint64_t> hashes(n);
  std::vector<const char*> bad(n, nullptr);
  const std::hash<std::string_view> hasher;
  for (size_t i = 0; i < n; ++i) {
    bad[i] = InvalidNameReason(v[i].name);
    hashes[i] = hasher(v[i].name);
  }
  // Pass 2: open addressing, each slot the upper half of a name's hash and
  // its position + 1 (0 = empty), so that a probe reads only the table --
  // names are compared only when 32 bits of hash agree -- and the slot of
  // the entry a few ahead is prefetched: a million-entry directory's table
  // (16 MiB) does not fit in a cache, and waiting for each probe's miss was
  // most of the cost.
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  const size_t mask = cap - 1;
  std::vector<uint64_t> slots(n > 1 ? cap : 0, 0);
  constexpr size_t kAhead = 32;
  std::vector<bool> dup(n, false);
  std::vector<uint64_t> dup_of;  // for each duplicate in turn: the index of the first entry of its name
  for (size_t i = 0; n > 1 && i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(&slots[hashes[i + kAhead] & mask]);
    if (bad[i] != nullptr) continue;
    const uint64_t h = hashes[i];
    const uint64_t tag = h >> 32;
    size_t s = h & mask;
    for (; slots[s] != 0; s = (s + 1) & mask) {
      if ((slots[s] >> 32) != tag) continue;
      const size_t j = static_cast<size_t>(slots[s] & 0xffffffffu) - 1;
      if (v[j].name == v[i].name) {
        dup[i] = true;
        dup_of.push_back(v[j].index);
        break;
      }
    }
    if (!dup[i]) slots[s] = tag << 32 | static_cast<uint64_t>(i + 1);
  }
  if (dup_of.empty() && std::find_if(bad.begin(), bad.end(), [](const char* b) { return b != nullptr; }) == bad.end()) {
    return;  // the common case: a clean directory, nothing moves
  }
  size_t kept = 0, next_dup = 0;
  for (size_t i = 0; i < n; ++i) {
    std::string reason;
    if (bad[i] != nullptr) {
      reason = bad[i];
    } else if (dup[i]) {
      reason = "duplicate of the entry at index " + std::to_string(dup_of[next_dup++]);
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
