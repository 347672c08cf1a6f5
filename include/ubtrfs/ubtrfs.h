/* libubtrfs C API: read and change btrfs images from C (C99) or anything
 * that calls C (Python's ctypes, Go's cgo, Rust's FFI).
 *
 *   ubtrfs_fs *fs;
 *   ubtrfs_ino root, ino;
 *   if (ubtrfs_open("disk.img", UBTRFS_OPEN_WRITABLE, &fs) < 0) {
 *     fprintf(stderr, "%s\n", ubtrfs_last_error());
 *     return 1;
 *   }
 *   ubtrfs_root(fs, &root);
 *   ubtrfs_create(fs, root, "hello", 0644, &ino);
 *   ubtrfs_write(fs, ino, 0, "hi\n", 3);
 *   ubtrfs_close(fs);   // commits
 *
 * Conventions:
 * - Every call returns 0 (or a byte count) on success and a negative errno
 *   value on failure (-ENOENT, -EROFS, ...); ubtrfs_last_error() then holds a
 *   message naming what went wrong, for the calling thread.
 * - A NULL handle, NULL pointer argument or unknown flag is an error
 *   (-EBADF for the handle, -EINVAL otherwise), never a crash.
 * - Inodes are named by ubtrfs_ino: the subvolume (tree) holding them and
 *   their inode number. Names are single path components; paths given to
 *   ubtrfs_lookup are absolute ("/etc/hostname"); symlinks are not followed.
 * - A handle may be used from several threads at once (as the C++
 *   ubtrfs::Filesystem, include/ubtrfs/filesystem.h).
 * - Changes of a writable handle join a running transaction: ubtrfs_commit
 *   makes them durable (all or nothing on a crash); ubtrfs_close commits
 *   what is left.
 */
#ifndef UBTRFS_UBTRFS_H_
#define UBTRFS_UBTRFS_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define UBTRFS_C_API __attribute__((visibility("default")))
#else
#define UBTRFS_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define UBTRFS_VERSION_MAJOR 0
#define UBTRFS_VERSION_MINOR 1
#define UBTRFS_VERSION_PATCH 0

/* An opened image. */
typedef struct ubtrfs_fs ubtrfs_fs;

/* An inode: the subvolume (tree id) that holds it and its number. */
typedef struct ubtrfs_ino {
  uint64_t root;
  uint64_t ino;
} ubtrfs_ino;

typedef struct ubtrfs_time {
  int64_t sec;
  uint32_t nsec;
} ubtrfs_time;

typedef struct ubtrfs_stat_t {
  ubtrfs_ino id;
  uint32_t mode; /* S_IFMT bits and permissions, as in struct stat */
  uint32_t nlink;
  uint32_t uid;
  uint32_t gid;
  uint64_t rdev;       /* a dev_t as makedev() builds it */
  uint64_t size;
  uint64_t nbytes;     /* bytes of data allocated (st_blocks * 512) */
  uint64_t generation;
  uint64_t flags;      /* btrfs inode flags (NODATASUM, COMPRESS, ...) */
  ubtrfs_time atime, mtime, ctime, otime;
} ubtrfs_stat_t;

typedef struct ubtrfs_statfs_t {
  uint32_t block_size; /* sector size */
  uint32_t node_size;
  uint64_t total_bytes;
  uint64_t used_bytes;
  uint64_t free_bytes; /* f_bfree, as the kernel's statfs(2) reports it */
  uint64_t name_max;
  uint64_t avail_bytes; /* what file data can still take (f_bavail): free data space, never metadata */
} ubtrfs_statfs_t;

/* ---- Opening ---- */

/* Open for writing (otherwise every change fails with -EROFS). */
#define UBTRFS_OPEN_WRITABLE 0x1u
/* Do not verify data checksums on read (they are verified by default: a
 * mismatch on every copy is -EIO). */
#define UBTRFS_OPEN_NO_VERIFY_CSUMS 0x2u

/* Keep what each write of the running transaction overwrites, so that
 * ubtrfs_discard puts the image back byte for byte as at the last commit
 * (costs a read and memory for every byte written between commits). */
#define UBTRFS_OPEN_UNDO_UNCOMMITTED 0x4u

/* Opens the image file or block device at `path`; *out gets the handle. */
UBTRFS_C_API int ubtrfs_open(const char *path, unsigned flags, ubtrfs_fs **out);
/* ubtrfs_open for a filesystem that does not start at byte 0 of the image:
 * `offset` bytes in, or partition `partition` (1-based; 0 for none) of a GPT
 * or MBR partition table. Nothing outside it is read or written. */
UBTRFS_C_API int ubtrfs_open_ex(const char *path, unsigned flags, uint64_t offset, int partition,
                                ubtrfs_fs **out);
/* Commits what a writable handle changed since the last commit, then frees
 * the handle (also when the commit fails; its error is returned). */
UBTRFS_C_API int ubtrfs_close(ubtrfs_fs *fs);
/* Makes every change so far durable. */
UBTRFS_C_API int ubtrfs_commit(ubtrfs_fs *fs);
/* fsync(2) (datasync 0) or fdatasync(2) (datasync 1) of one inode: its data,
 * attributes and a name reaching it survive a crash, through a tree log
 * (no full commit) where the kernel would write one. */
UBTRFS_C_API int ubtrfs_fsync(ubtrfs_fs *fs, ubtrfs_ino ino, int datasync);
/* An open file (as the kernel keeps one unlinked while open): while pinned,
 * removing the inode's last name leaves it, nameless, readable and writable
 * by number until its last unpin deletes it (a crash in between: the next
 * writable open, or the kernel's mount, deletes it). Pins are counted. */
UBTRFS_C_API int ubtrfs_pin_inode(ubtrfs_fs *fs, ubtrfs_ino ino);
UBTRFS_C_API int ubtrfs_unpin_inode(ubtrfs_fs *fs, ubtrfs_ino ino);
/* Gives up every change since the last commit: nothing more is committed
 * (ubtrfs_close commits nothing; later changes fail with -EROFS); with
 * UBTRFS_OPEN_UNDO_UNCOMMITTED the bytes written since are put back. Close
 * the handle after it. */
UBTRFS_C_API int ubtrfs_discard(ubtrfs_fs *fs);

/* Creates an empty btrfs filesystem in the image file `path` (created, or
 * extended, to `size` bytes; 0 keeps an existing file's size). Refuses a
 * file that already holds btrfs unless `force` is nonzero. `path` may be
 * rbd:POOL/IMAGE[:KEY=VALUE...], an RBD image in a Ceph cluster (created or
 * grown likewise). ubtrfs_open takes such paths too. */
UBTRFS_C_API int ubtrfs_mkfs(const char *path, uint64_t size, int force);

/* What `ubtrfs mkfs` takes, for ubtrfs_mkfs_ex. Zero it, set struct_size
 * to sizeof(ubtrfs_mkfs_opts_t), then the fields wanted: NULL strings and
 * zeros are the defaults. Fields added later go at the end; the library
 * reads only those within struct_size. */
typedef struct ubtrfs_mkfs_opts_t {
  uint32_t struct_size;
  uint64_t size;                  /* each image's (created or extended to it; 0: as it is) */
  int force;                      /* overwrite an existing btrfs filesystem */
  const char *label;
  const char *uuid;               /* "01234567-89ab-cdef-0123-456789abcdef"; NULL: random */
  const char *csum;               /* crc32c (default), xxhash, sha256, blake2 */
  uint32_t nodesize;              /* 0: 16384 (4096 with mixed) */
  const char *data_profile;       /* single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5, raid6 */
  const char *metadata_profile;
  const char *features;           /* -O list: "block-group-tree,^mixed-bg" */
  int mixed;                      /* data and metadata in the same chunks */
  const char *rootdir;            /* host directory, tar archive, or "-" (stdin) to import */
  const char *compress;           /* ALG[:LEVEL] for the imported data */
  const char *const *subvols;     /* NULL-terminated [rw|ro|default|default-ro:]SUBDIR list */
  const char *const *inode_flags; /* NULL-terminated nodatacow|nodatasum:PATH list */
  int owner_set;                  /* nonzero: everything imported gets owner_uid:owner_gid */
  uint32_t owner_uid, owner_gid;
  int deterministic;              /* same input, same image bytes */
  int source_date_epoch_set;      /* nonzero: times clamped to source_date_epoch (implies deterministic) */
  int64_t source_date_epoch;
  int shrink;                     /* with rootdir: the smallest image file that holds it */
  int reflink;                    /* with a directory rootdir: clone the host files' data */
} ubtrfs_mkfs_opts_t;

/* ubtrfs_mkfs with every option of `ubtrfs mkfs` (ubtrfs::Mkfs in
 * <ubtrfs/mkfs.h>), over `ndevices` images or block devices (devids 1, 2,
 * ... in this order). */
UBTRFS_C_API int ubtrfs_mkfs_ex(const char *const *devices, size_t ndevices, const ubtrfs_mkfs_opts_t *opts);

/* The message of the calling thread's last failed call ("" when none). The
 * pointer stays valid until that thread's next ubtrfs_* call. */
UBTRFS_C_API const char *ubtrfs_last_error(void);
/* "0.1.0" */
UBTRFS_C_API const char *ubtrfs_version(void);

/* ---- Names ---- */

/* The top directory of the default subvolume. */
UBTRFS_C_API int ubtrfs_root(ubtrfs_fs *fs, ubtrfs_ino *out);
/* Resolves an absolute path ("." and ".." are followed, symlinks not). */
UBTRFS_C_API int ubtrfs_lookup(ubtrfs_fs *fs, const char *path, ubtrfs_ino *out);
/* Looks up one name in a directory. */
UBTRFS_C_API int ubtrfs_lookup_child(ubtrfs_fs *fs, ubtrfs_ino dir, const char *name, ubtrfs_ino *out);

UBTRFS_C_API int ubtrfs_stat(ubtrfs_fs *fs, ubtrfs_ino ino, ubtrfs_stat_t *out);
/* ubtrfs_lookup then ubtrfs_stat. */
UBTRFS_C_API int ubtrfs_stat_path(ubtrfs_fs *fs, const char *path, ubtrfs_stat_t *out);

/* Called once per entry ("." and ".." are not listed), in DIR_INDEX order;
 * `type` is a DT_* value, `index` the entry's readdir cookie. `name` is
 * NUL-terminated and valid only during the call. Return 0 to go on, anything
 * else to stop: ubtrfs_readdir then returns that value. */
typedef int (*ubtrfs_readdir_fn)(void *ctx, const char *name, ubtrfs_ino ino, unsigned type, uint64_t index);
UBTRFS_C_API int ubtrfs_readdir(ubtrfs_fs *fs, ubtrfs_ino dir, ubtrfs_readdir_fn fn, void *ctx);

/* ---- Data ---- */

/* Reads up to `len` bytes at `offset`: the count (0 at the end of the file)
 * or a negative errno. */
UBTRFS_C_API int64_t ubtrfs_read(ubtrfs_fs *fs, ubtrfs_ino file, uint64_t offset, void *buf, size_t len);
/* Writes `len` bytes at `offset` (extending the file): the count written. */
UBTRFS_C_API int64_t ubtrfs_write(ubtrfs_fs *fs, ubtrfs_ino file, uint64_t offset, const void *buf, size_t len);
/* Copies a symlink's target into buf (NUL-terminated when it fits): the
 * target's length, which may be >= len (then it was cut short). */
UBTRFS_C_API int64_t ubtrfs_readlink(ubtrfs_fs *fs, ubtrfs_ino link, char *buf, size_t len);

/* ---- Changes (a writable handle; -EROFS otherwise) ----
 * New inodes belong to the calling process's effective user and group; `mode`
 * gives the permission bits (and, for mknod, the S_IFMT type). `out` may be
 * NULL. */
UBTRFS_C_API int ubtrfs_create(ubtrfs_fs *fs, ubtrfs_ino dir, const char *name, uint32_t mode, ubtrfs_ino *out);
UBTRFS_C_API int ubtrfs_mkdir(ubtrfs_fs *fs, ubtrfs_ino dir, const char *name, uint32_t mode, ubtrfs_ino *out);
/* Fifos, sockets and device nodes (`rdev` as makedev() builds it). */
UBTRFS_C_API int ubtrfs_mknod(ubtrfs_fs *fs, ubtrfs_ino dir, const char *name, uint32_t mode, uint64_t rdev,
                              ubtrfs_ino *out);
UBTRFS_C_API int ubtrfs_symlink(ubtrfs_fs *fs, ubtrfs_ino dir, const char *name, const char *target,
                                ubtrfs_ino *out);
/* A new name `name` in `dir` for the inode `target` (not a directory). */
UBTRFS_C_API int ubtrfs_link(ubtrfs_fs *fs, ubtrfs_ino target, ubtrfs_ino dir, const char *name);
UBTRFS_C_API int ubtrfs_unlink(ubtrfs_fs *fs, ubtrfs_ino dir, const char *name);
UBTRFS_C_API int ubtrfs_rmdir(ubtrfs_fs *fs, ubtrfs_ino dir, const char *name);

#define UBTRFS_RENAME_NOREPLACE 0x1u /* -EEXIST when the new name exists */
#define UBTRFS_RENAME_EXCHANGE 0x2u  /* swap the two names */
UBTRFS_C_API int ubtrfs_rename(ubtrfs_fs *fs, ubtrfs_ino old_dir, const char *old_name, ubtrfs_ino new_dir,
                               const char *new_name, unsigned flags);

/* setattr: only the fields whose UBTRFS_SET_* bit is in `valid` change. */
#define UBTRFS_SET_MODE 0x01u  /* permission bits only */
#define UBTRFS_SET_UID 0x02u
#define UBTRFS_SET_GID 0x04u
#define UBTRFS_SET_SIZE 0x08u  /* truncate or extend (regular files) */
#define UBTRFS_SET_ATIME 0x10u
#define UBTRFS_SET_MTIME 0x20u
#define UBTRFS_SET_CTIME 0x40u
typedef struct ubtrfs_setattr_t {
  uint32_t valid;
  uint32_t mode;
  uint32_t uid;
  uint32_t gid;
  uint64_t size;
  ubtrfs_time atime, mtime, ctime;
} ubtrfs_setattr_t;
UBTRFS_C_API int ubtrfs_setattr(ubtrfs_fs *fs, ubtrfs_ino ino, const ubtrfs_setattr_t *attr);
UBTRFS_C_API int ubtrfs_truncate(ubtrfs_fs *fs, ubtrfs_ino file, uint64_t size);
UBTRFS_C_API int ubtrfs_chmod(ubtrfs_fs *fs, ubtrfs_ino ino, uint32_t mode);
/* (uint32_t)-1 leaves that id as it is, as chown(2). */
UBTRFS_C_API int ubtrfs_chown(ubtrfs_fs *fs, ubtrfs_ino ino, uint32_t uid, uint32_t gid);
/* times[0] the access time, times[1] the modification time; NULL sets both
 * to now. The change time becomes now. */
UBTRFS_C_API int ubtrfs_utimens(ubtrfs_fs *fs, ubtrfs_ino ino, const ubtrfs_time times[2]);

/* ---- Extended attributes ---- */

/* Copies the value into buf: the value's length, which may be > len (then
 * nothing was copied; call again with a larger buffer); len 0 asks for the
 * length only. -ENODATA when there is no such attribute. */
UBTRFS_C_API int64_t ubtrfs_getxattr(ubtrfs_fs *fs, ubtrfs_ino ino, const char *name, void *buf, size_t len);
/* The names, each NUL-terminated, one after the other (as listxattr(2)):
 * the total length, which may be > len (then nothing was copied). */
UBTRFS_C_API int64_t ubtrfs_listxattr(ubtrfs_fs *fs, ubtrfs_ino ino, char *buf, size_t len);
#define UBTRFS_XATTR_CREATE 0x1  /* -EEXIST when it exists (XATTR_CREATE) */
#define UBTRFS_XATTR_REPLACE 0x2 /* -ENODATA when it does not (XATTR_REPLACE) */
UBTRFS_C_API int ubtrfs_setxattr(ubtrfs_fs *fs, ubtrfs_ino ino, const char *name, const void *value, size_t len,
                                 int flags);
UBTRFS_C_API int ubtrfs_removexattr(ubtrfs_fs *fs, ubtrfs_ino ino, const char *name);

/* ---- The file system ---- */

UBTRFS_C_API int ubtrfs_statfs(ubtrfs_fs *fs, ubtrfs_statfs_t *out);

/* Copies the image's `src_path` (a directory recursively) to the host path
 * `dest`, safe against hostile images (as `ubtrfs cp IMAGE:PATH DEST`; see
 * include/ubtrfs/export.h). Flags below. Returns 0, or a negative errno when
 * anything failed (the message says what; the rest is still copied). */
#define UBTRFS_EXPORT_STRICT 0x1u     /* a skipped hostile entry is an error */
#define UBTRFS_EXPORT_NO_DEVICES 0x2u /* make no device nodes */
#define UBTRFS_EXPORT_NO_XATTRS 0x4u  /* copy no extended attributes */
UBTRFS_C_API int ubtrfs_export(ubtrfs_fs *fs, const char *src_path, const char *dest, unsigned flags);

/* ---- Subvolumes, snapshots and reflinks ----
 * As `btrfs subvolume` and FICLONERANGE (see include/ubtrfs/filesystem.h):
 * each subvolume call commits before it returns. A subvolume's top
 * directory is the ubtrfs_ino {id, 256}. */
UBTRFS_C_API int ubtrfs_subvol_create(ubtrfs_fs *fs, ubtrfs_ino dir, const char *name, uint32_t mode,
                                      ubtrfs_ino *out);
/* A snapshot of the subvolume whose top is `subvol`, as `name` in `dir`. */
UBTRFS_C_API int ubtrfs_snapshot(ubtrfs_fs *fs, ubtrfs_ino subvol, ubtrfs_ino dir, const char *name, int read_only,
                                 ubtrfs_ino *out);
/* -EPERM for the default subvolume, -ENOTEMPTY while it holds others. */
UBTRFS_C_API int ubtrfs_subvol_delete(ubtrfs_fs *fs, ubtrfs_ino dir, const char *name);
typedef struct ubtrfs_subvol_t {
  uint64_t id, parent_id, dir_ino; /* parent subvolume, and the directory in it holding the entry */
  const char *path;                /* from the top level; valid during the callback only */
  uint8_t uuid[16], parent_uuid[16], received_uuid[16];
  uint64_t generation, ctransid, otransid;
  ubtrfs_time ctime, otime;
  int read_only;
} ubtrfs_subvol_t;
/* Calls fn for every subvolume but the top level, by id; a non-zero return
 * stops the walk and is returned. */
typedef int (*ubtrfs_subvol_fn)(void *ctx, const ubtrfs_subvol_t *subvol);
UBTRFS_C_API int ubtrfs_subvol_list(ubtrfs_fs *fs, ubtrfs_subvol_fn fn, void *ctx);
UBTRFS_C_API int ubtrfs_subvol_get_default(ubtrfs_fs *fs, uint64_t *id);
UBTRFS_C_API int ubtrfs_subvol_set_default(ubtrfs_fs *fs, uint64_t id);
UBTRFS_C_API int ubtrfs_subvol_get_readonly(ubtrfs_fs *fs, ubtrfs_ino subvol, int *read_only);
UBTRFS_C_API int ubtrfs_subvol_set_readonly(ubtrfs_fs *fs, ubtrfs_ino subvol, int read_only);
/* Shares [src_offset, +len) of src with dst at dst_offset (len 0: to src's
 * end); whole sectors, or up to src's end. */
UBTRFS_C_API int ubtrfs_clone(ubtrfs_fs *fs, ubtrfs_ino src, uint64_t src_offset, ubtrfs_ino dst, uint64_t dst_offset,
                              uint64_t len);
/* fs-verity, as FS_IOC_ENABLE_VERITY: hash_alg 1 (SHA-256) or 2 (SHA-512),
 * block_size 0 for 4096, salt_len bytes of salt (salt may be NULL when 0).
 * From then on the file's data cannot change (EPERM). */
UBTRFS_C_API int ubtrfs_enable_verity(ubtrfs_fs *fs, ubtrfs_ino file, int hash_alg, uint32_t block_size,
                                      const void *salt, size_t salt_len);
/* The file's fs-verity digest, as FS_IOC_MEASURE_VERITY: its algorithm in
 * *hash_alg, its bytes in digest (room for 64) and their count in
 * *digest_len. ENODATA when the file has no fs-verity. */
UBTRFS_C_API int ubtrfs_measure_verity(ubtrfs_fs *fs, ubtrfs_ino file, int *hash_alg, uint8_t digest[64],
                                       size_t *digest_len);

#ifdef __cplusplus
}
#endif

#endif /* UBTRFS_UBTRFS_H_ */
