#include "fs/archive_library.h"

#include <dlfcn.h>

#include <cerrno>
#include <string>

namespace ubtrfs::fs {

namespace {

struct Loaded {
  ArchiveLibrary lib;
  Status status;
};

// RTLD_LOCAL: nothing else in the process resolves through libarchive. The
// handle stays open for the process's life; the table points into it.
Loaded Load() {
  Loaded out;
  constexpr const char* kSoname = "libarchive.so.13";
  void* handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    out.status = Status::Error(EOPNOTSUPP, std::string("reading archives needs libarchive, and ") + kSoname +
                                               " cannot be loaded (" + (why ? why : "?") +
                                               "); install libarchive13");
    return out;
  }
#define UBTRFS_ARCHIVE_RESOLVE(f)                                                                          \
  out.lib.f = reinterpret_cast<decltype(&::f)>(dlsym(handle, #f));                                         \
  if (!out.lib.f) {                                                                                        \
    out.status = Status::Error(EOPNOTSUPP, std::string("libarchive has no ") + #f + " (" + kSoname + " too old)"); \
    return out;                                                                                            \
  }
  UBTRFS_ARCHIVE_FUNCTIONS(UBTRFS_ARCHIVE_RESOLVE)
#undef UBTRFS_ARCHIVE_RESOLVE
  return out;
}

}  // namespace

Result<const ArchiveLibrary*> LoadArchiveLibrary() {
  static const Loaded loaded = Load();
  if (!loaded.status.ok()) return loaded.status;
  return &loaded.lib;
}

}  // namespace ubtrfs::fs
