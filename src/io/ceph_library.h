// The Ceph client libraries (librbd, librados), loaded on the first rbd:
// path rather than linked: loading them maps about 20 MB and starts their
// static state, which every other command (and every program embedding
// libubtrfs for image files) would pay for nothing.
#ifndef UBTRFS_IO_CEPH_LIBRARY_H_
#define UBTRFS_IO_CEPH_LIBRARY_H_

#ifdef UBTRFS_HAVE_RBD

#include <rados/librados.h>
#include <rbd/librbd.h>

#include "ubtrfs/status.h"

namespace ubtrfs::io {

// Every librados/librbd call the RBD device makes.
#define UBTRFS_CEPH_FUNCTIONS(X)                                                                          \
  X(rados_create) X(rados_conf_set) X(rados_conf_get) X(rados_conf_read_file) X(rados_conf_parse_env)     \
  X(rados_connect) X(rados_shutdown) X(rados_ioctx_create) X(rados_ioctx_destroy)                         \
  X(rados_ioctx_set_namespace) X(rbd_open) X(rbd_open_read_only) X(rbd_close) X(rbd_get_size)             \
  X(rbd_get_features) X(rbd_read) X(rbd_write) X(rbd_flush) X(rbd_resize) X(rbd_remove) X(rbd_create4)   \
  X(rbd_image_options_create) X(rbd_image_options_destroy) X(rbd_lock_acquire) X(rbd_lock_exclusive)      \
  X(rbd_unlock) X(rbd_lock_get_owners) X(rbd_lock_get_owners_cleanup) X(rbd_aio_create_completion)        \
  X(rbd_aio_write) X(rbd_aio_get_return_value) X(rbd_aio_release)

struct CephLibrary {
#define UBTRFS_CEPH_POINTER(f) decltype(&::f) f = nullptr;
  UBTRFS_CEPH_FUNCTIONS(UBTRFS_CEPH_POINTER)
#undef UBTRFS_CEPH_POINTER
};

// Loads the libraries once per process (thread-safe); later calls return
// the same table, or the same error: ENOPKG-like EOPNOTSUPP naming the
// library that is missing and the package that has it.
Result<const CephLibrary*> LoadCephLibrary();

}  // namespace ubtrfs::io

#endif  // UBTRFS_HAVE_RBD
#endif  // UBTRFS_IO_CEPH_LIBRARY_H_
