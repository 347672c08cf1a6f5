// How the CLI shows modes, times, names, JSON strings and a move's copy check.
#ifndef UBTRFS_CLI_TEXT_H_
#define UBTRFS_CLI_TEXT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "ubtrfs/filesystem.h"
#include "ubtrfs/resize.h"

namespace ubtrfs::cli {

// "drwxr-xr-x", as ls -l.
std::string ModeString(uint32_t mode);
// "2026-12-01 18:24:41" (UTC).
std::string TimeString(const Time& t);
// Control bytes and '\' as \xNN, so a listing stays one line per name.
std::string Printable(const std::string& name);
// A JSON string literal (quotes included); bytes that are not UTF-8 text
// are written as \u00NN of the byte, as btrfs names may hold any byte.
std::string JsonString(std::string_view s);
// What verifying a move's reads found, on stderr as `command`'s warnings
// (nothing when every copy read verified); quiet or not, as the data may
// be damaged.
void PrintCopyCheck(std::string_view command, const CopyCheck& c);
// A warning on stderr for an entry of directory `path` that ReadDir left out
// (a damaged name, or with --rescue salvage a range of a block that did not
// read).
void WarnSkipped(const std::string& path, const SkippedEntry& s);

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_TEXT_H_
