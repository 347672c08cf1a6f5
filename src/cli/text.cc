#include "cli/text.h"

#include <sys/stat.h>

#include <ctime>

#include <fmt/core.h>

namespace ubtrfs::cli {

std::string ModeString(uint32_t mode) {
  std::string s = "?rwxrwxrwx";
  switch (mode & S_IFMT) {
    case S_IFREG: s[0] = '-'; break;
    case S_IFDIR: s[0] = 'd'; break;
    case S_IFLNK: s[0] = 'l'; break;
    case S_IFCHR: s[0] = 'c'; break;
    case S_IFBLK: s[0] = 'b'; break;
    case S_IFIFO: s[0] = 'p'; break;
    case S_IFSOCK: s[0] = 's'; break;
  }
  for (int i = 0; i < 9; ++i) {
    if (!(mode & (1u << (8 - i)))) s[1 + i] = '-';
  }
  if (mode & S_ISUID) s[3] = (mode & S_IXUSR) ? 's' : 'S';
  if (mode & S_ISGID) s[6] = (mode & S_IXGRP) ? 's' : 'S';
  if (mode & S_ISVTX) s[9] = (mode & S_IXOTH) ? 't' : 'T';
  return s;
}

std::string TimeString(const Time& t) {
  char buf[64];
  time_t secs = static_cast<time_t>(t.sec);
  struct tm tm;
  gmtime_r(&secs, &tm);
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string Printable(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f || c == '\\') out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    // A valid UTF-8 sequence of 2-4 bytes passes as it is.
    size_t len = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 1;
    if (c >= 0x80 && len > 1 && i + len <= s.size()) {
      bool ok = true;
      for (size_t k = 1; k < len; ++k) ok &= (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      if (ok) {
        out.append(s.substr(i, len));
        i += len - 1;
        continue;
      }
    }
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
  return out;
}

void PrintCopyCheck(std::string_view command, const CopyCheck& c) {
  for (const std::string& line : c.errors) fmt::print(stderr, "ubtrfs {}: {}\n", command, line);
  if (c.repaired == 0 && c.unrecoverable == 0) return;
  const uint64_t named = c.errors.size();
  if (named < c.repaired + c.unrecoverable) {
    fmt::print(stderr, "ubtrfs {}: (only the first {} named)\n", command, named);
  }
  fmt::print(stderr,
             "ubtrfs {}: {} tree blocks and data sectors failed verification as read: {} copied from another copy "
             "that verifies, {} with no such copy copied as read{}\n",
             command, c.repaired + c.unrecoverable, c.repaired, c.unrecoverable,
             c.unrecoverable ? " (ubtrfs check --check-data-csum and scrub name them)" : "");
}

void WarnSkipped(const std::string& path, const SkippedEntry& s) {
  if (s.name.empty()) {
    fmt::print(stderr, "ubtrfs: warning: {}: {}\n", Printable(path), s.reason);
  } else {
    fmt::print(stderr, "ubtrfs: warning: {}: entry {} (index {}) not listed: {}\n", Printable(path),
               Printable(s.name), s.index, s.reason);
  }
}

}  // namespace ubtrfs::cli
