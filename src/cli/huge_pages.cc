// The heap in transparent huge pages. An import builds its tree blocks and
// tables in fresh heap memory, and on the VMs measured a first touch of a
// page (a page fault, with a paravirtual interrupt round trip) was a fifth
// of `mkfs --rootdir` of 200,000 empty files: with glibc's malloc asking
// for huge pages (the glibc.malloc.hugetlb tunable) that build took 0.85-
// 0.94 s instead of 1.32-1.41 s, and `mkfs --compress zstd` of 214 MiB of
// text 1.09 s instead of 1.33 s (docs/BENCHMARKS.md, session 22). Tunables
// are read when a process starts, so the program starts itself once more
// with the tunable set, then puts the environment back as it was, so that
// nothing it runs inherits it. The second start costs a few milliseconds.
#include "cli/huge_pages.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace ubtrfs::cli {
namespace {

constexpr char kMark[] = "UBTRFS_HEAP_TUNED";

void RestoreTunables(const std::string& mark) {
  if (mark.size() >= 2 && mark[0] == '1' && mark[1] == ':') {
    ::setenv("GLIBC_TUNABLES", mark.c_str() + 2, 1);
  } else {
    ::unsetenv("GLIBC_TUNABLES");
  }
  ::unsetenv(kMark);
}

// Counts names below the directory open at `fd` (closed here) into *n,
// stopping once it reaches `limit`.
void Count(int fd, size_t limit, size_t* n) {
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return;
  }
  while (*n < limit) {
    const dirent* e = ::readdir(d);
    if (e == nullptr) break;
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    ++*n;
    bool dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st;
      dir = ::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (!dir) continue;
    const int sub = ::openat(::dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0) Count(sub, limit, n);
  }
  ::closedir(d);
}

}  // namespace

bool ResumeAfterHugePageRestart() {
  const char* mark = std::getenv(kMark);
  if (mark == nullptr) return false;
  RestoreTunables(mark);
  return true;
}

void UseHugePagesForTheHeap(char** argv) {
  if (ResumeAfterHugePageRestart()) return;
  if (const char* opt = std::getenv("UBTRFS_HUGE_PAGES"); opt && std::strcmp(opt, "0") == 0) return;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.hugetlb")) return;
  std::string thp;
  std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), thp);
  if (thp.empty() || thp.find("[never]") != std::string::npos) return;
  const std::string mark = tunables ? std::string("1:") + tunables : std::string("0");
  const std::string set = tunables && *tunables ? std::string(tunables) + ":glibc.malloc.hugetlb=1"
                                                : std::string("glibc.malloc.hugetlb=1");
  ::setenv(kMark, mark.c_str(), 1);
  ::setenv("GLIBC_TUNABLES", set.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  RestoreTunables(mark);  // no exec: go on as we are
}

bool TreeHasAtLeast(const std::string& dir, size_t entries) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t n = 0;
  Count(fd, entries, &n);
  return n >= entries;
}

}  // namespace ubtrfs::cli
