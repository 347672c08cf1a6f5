// Small helpers the image tests share: host and image files as strings, seeded
// pseudo-random contents (the same bytes for the same seed in every test and
// run), and commands that must succeed.
#ifndef UBTRFS_TESTS_SUPPORT_HOST_FILES_H_
#define UBTRFS_TESTS_SUPPORT_HOST_FILES_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs_test {

void WriteHostFile(const std::string& path, const std::string& data);
std::string ReadHostFile(const std::string& path);
// Writes `data` to a new host file and fsyncs it (on a kernel mount: into
// the tree log, not a commit). "" or what failed.
std::string WriteAndFsync(const std::string& path, const std::string& data);
// The superblock's log_root of an image (0: no tree log to replay); a test
// failure and 0 when the superblock cannot be read.
uint64_t LogRootOf(const std::string& image);
// n bytes from a xorshift generator seeded with `seed`.
std::string SeededBytes(size_t n, uint64_t seed);
inline std::span<const uint8_t> SpanOf(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}
// A file's bytes read through ubtrfs, or the error as text.
std::string ReadImageFile(ubtrfs::Filesystem& fs, const std::string& path);
// The inode at `path` in the image (a failed expectation and a null id if none).
ubtrfs::InodeId MustLookup(ubtrfs::Filesystem& f, const std::string& path);
// Creates dir/name (mode 0644) in the image holding `bytes` (fatal failures).
void PutFile(ubtrfs::Filesystem& f, const std::string& dir, const std::string& name, const std::string& bytes);
// "" when the command exits 0, else the command line and what it printed.
std::string MustRun(const std::vector<std::string>& argv);
// The ubtrfs command line tool of this build, run with `args`.
CommandResult RunUbtrfs(const std::vector<std::string>& args);
// A host file of `size` bytes from std::mt19937 seeded with `seed`:
// incompressible, or lower-case letters with `text`; the same bytes for the
// same seed. A test failure when it cannot be written.
void WriteRandomFile(const std::string& path, size_t size, uint32_t seed, bool text = false);
// st_size of a host file (a test failure and 0 when it cannot be stat'ed).
uint64_t HostFileSize(const std::string& path);
// Whether btrfs-progs' `btrfs` command is installed.
bool HaveBtrfsProgs();

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_HOST_FILES_H_
