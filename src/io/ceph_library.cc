#include "io/ceph_library.h"

#ifdef UBTRFS_HAVE_RBD

#include <dlfcn.h>

#include <cerrno>
#include <mutex>
#include <string>

namespace ubtrfs::io {

namespace {

struct Loaded {
  CephLibrary lib;
  Status status;
};

// RTLD_GLOBAL: librbd resolves librados' symbols through the global scope
// as it would when linked. The handles stay open for the process's life
// (librados' threads and atexit handlers need the code mapped).
Loaded Load() {
  Loaded out;
  const char* const sonames[] = {"librados.so.2", "librbd.so.1"};
  void* handles[2] = {};
  for (int i = 0; i < 2; ++i) {
    handles[i] = dlopen(sonames[i], RTLD_NOW | RTLD_GLOBAL);
    if (!handles[i]) {
      const char* why = dlerror();
      out.status = Status::Error(EOPNOTSUPP, std::string("rbd: images need the Ceph client libraries, and ") +
                                                 sonames[i] + " cannot be loaded (" + (why ? why : "?") +
                                                 "); install librbd1 and librados2");
      return out;
    }
  }
#define UBTRFS_CEPH_RESOLVE(f)                                                                           \
  out.lib.f = reinterpret_cast<decltype(&::f)>(dlsym(handles[std::string_view(#f).starts_with("rbd_")], #f)); \
  if (!out.lib.f) {                                                                                      \
    out.status = Status::Error(EOPNOTSUPP, std::string("rbd: the Ceph client library has no ") + #f +    \
                                               " (librbd/librados too old)");                            \
    return out;                                                                                          \
  }
  UBTRFS_CEPH_FUNCTIONS(UBTRFS_CEPH_RESOLVE)
#undef UBTRFS_CEPH_RESOLVE
  return out;
}

}  // namespace

Result<const CephLibrary*> LoadCephLibrary() {
  static const Loaded loaded = Load();
  if (!loaded.status.ok()) return loaded.status;
  return &loaded.lib;
}

}  // namespace ubtrfs::io

#endif  // UBTRFS_HAVE_RBD
