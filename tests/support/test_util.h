// Small helpers shared by the cross-layer suites: running external commands,
// scratch directories, loop mounts, and printable renderings of raw bytes.
#ifndef UBTRFS_TESTS_SUPPORT_TEST_UTIL_H_
#define UBTRFS_TESTS_SUPPORT_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ubtrfs_test {

struct CommandResult {
  int exit_code = -1;      // exit status, or 128+signal; -1 when it could not start
  std::string out;         // captured stdout (binary safe)
  std::string err;         // captured stderr
  bool ok() const { return exit_code == 0; }
  // "exit 1; stderr: ...; stdout: ..." (truncated) for failure messages.
  std::string Describe() const;
};

// Runs argv[0] (looked up in PATH) with the given arguments; no shell involved.
CommandResult RunCommand(const std::vector<std::string>& argv);
// The command line as a shell would accept it (for logs and failure messages).
std::string ShellJoin(const std::vector<std::string>& argv);
// sha256sum of a file as 64 hex digits, or a line saying why not (which
// then differs from every digest).
std::string Sha256(const std::string& path);
// Full path of an executable found in PATH (plus /sbin, /usr/sbin), or "".
std::string FindProgram(const std::string& name);

// Printable form of raw bytes: printable ASCII as is, everything else \xNN.
std::string Printable(std::string_view bytes, size_t max_len = 200);

// Deletes a tree (like rm -rf) without crossing mount points; makes directories
// writable first so modes like 0555 do not get in the way.
void RemoveTree(const std::string& path);

// A fresh directory from mkdtemp under /tmp. The destructor deletes it unless
// the current gtest test has failed (or, for a directory deleted from
// TearDownTestSuite, any test of the suite) -- then it is kept and its path
// printed -- or Keep() was called.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ubtrfs-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

// Creates (or extends) a sparse file of the given size.
bool MakeSparseFile(const std::string& path, uint64_t size, std::string* error);

// A loop mount of an image file. Mount() runs mount(8) with -o loop,<opts>;
// Unmount() (also run by the destructor) unmounts and detaches the loop device.
class LoopMount {
 public:
  LoopMount() = default;
  ~LoopMount();
  LoopMount(const LoopMount&) = delete;
  LoopMount& operator=(const LoopMount&) = delete;
  // Returns "" on success, otherwise the reason.
  std::string Mount(const std::string& image, const std::string& mountpoint,
                    const std::string& options = "");
  // Returns "" on success, otherwise what went wrong.
  std::string Unmount();
  bool mounted() const { return mounted_; }
  const std::string& mountpoint() const { return mountpoint_; }

 private:
  std::string image_, mountpoint_;
  bool mounted_ = false;
};

// Whether we run as root and a btrfs loop mount works here; when not, *reason
// says why. The probe result is cached for the process.
bool LoopMountsAvailable(std::string* reason);

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_TEST_UTIL_H_
