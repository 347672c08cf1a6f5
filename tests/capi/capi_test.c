/* The C API from C (compiled as C99): make an image, change it, commit,
 * reopen and read back; every bad argument is a clear error. Run by ctest as
 *   capi_test WORKDIR
 * (WORKDIR is created if missing and left with the image in it). */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ubtrfs/ubtrfs.h"

static int failures = 0;

#define CHECK(cond)                                                                        \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              ubtrfs_last_error());                                                        \
      ++failures;                                                                          \
    }                                                                                      \
  } while (0)

/* rc must be -err and the message must mention `word`. */
#define CHECK_ERR(expr, err, word)                                                                   \
  do {                                                                                               \
    long long rc_ = (long long)(expr);                                                               \
    if (rc_ != -(long long)(err) || strstr(ubtrfs_last_error(), (word)) == NULL) {                    \
      fprintf(stderr, "%s:%d: %s gave %lld (want %d), message \"%s\" (want it to mention \"%s\")\n", \
              __FILE__, __LINE__, #expr, rc_, -(err), ubtrfs_last_error(), (word));                  \
      ++failures;                                                                                    \
    }                                                                                                \
  } while (0)

#define OK(expr)                                                                                     \
  do {                                                                                               \
    long long rc_ = (long long)(expr);                                                               \
    if (rc_ < 0) {                                                                                   \
      fprintf(stderr, "%s:%d: %s failed: %lld: %s\n", __FILE__, __LINE__, #expr, rc_, ubtrfs_last_error()); \
      ++failures;                                                                                    \
    }                                                                                                \
  } while (0)

struct listing {
  int count;
  char names[16][64];
  unsigned types[16];
};

static int collect(void *ctx, const char *name, ubtrfs_ino ino, unsigned type, uint64_t index) {
  struct listing *l = (struct listing *)ctx;
  (void)ino;
  (void)index;
  if (l->count < 16) {
    snprintf(l->names[l->count], sizeof l->names[0], "%s", name);
    l->types[l->count] = type;
  }
  ++l->count;
  return 0;
}

static int stop_at_first(void *ctx, const char *name, ubtrfs_ino ino, unsigned type, uint64_t index) {
  (void)ctx, (void)name, (void)ino, (void)type, (void)index;
  return 42;
}

static int has_name(const struct listing *l, const char *name) {
  int i;
  for (i = 0; i < l->count && i < 16; ++i) {
    if (strcmp(l->names[i], name) == 0) return 1;
  }
  return 0;
}

struct subvols {
  int count;
  uint64_t ids[8];
  char paths[8][64];
  int read_only[8];
  uint8_t parent_uuid[8][16];
};

static int collect_subvol(void *ctx, const ubtrfs_subvol_t *s) {
  struct subvols *l = (struct subvols *)ctx;
  if (l->count < 8) {
    l->ids[l->count] = s->id;
    snprintf(l->paths[l->count], sizeof l->paths[0], "%s", s->path);
    l->read_only[l->count] = s->read_only;
    memcpy(l->parent_uuid[l->count], s->parent_uuid, 16);
  }
  ++l->count;
  return 0;
}

/* Subvolumes, a snapshot, a reflink, the default subvolume. */
static void subvolumes(const char *image) {
  ubtrfs_fs *fs = NULL;
  ubtrfs_ino root, sv, file, snap, copy, got;
  struct subvols l;
  uint64_t def = 0;
  int ro = -1;
  static char data[8192];
  char buf[8192];
  int i;
  for (i = 0; i < (int)sizeof data; ++i) data[i] = (char)(i * 7);
  OK(ubtrfs_open(image, UBTRFS_OPEN_WRITABLE, &fs));
  OK(ubtrfs_root(fs, &root));
  OK(ubtrfs_subvol_create(fs, root, "sv", 0755, &sv));
  CHECK(sv.ino == 256 && sv.root >= 256);
  CHECK_ERR(ubtrfs_subvol_create(fs, root, "sv", 0755, NULL), EEXIST, "sv");
  OK(ubtrfs_create(fs, sv, "f", 0644, &file));
  CHECK(ubtrfs_write(fs, file, 0, data, sizeof data) == (int64_t)sizeof data);
  OK(ubtrfs_snapshot(fs, sv, root, "snap", 1, &snap));
  CHECK_ERR(ubtrfs_snapshot(fs, file, root, "bad", 0, NULL), EINVAL, "");
  OK(ubtrfs_lookup(fs, "/snap/f", &got));
  CHECK(ubtrfs_read(fs, got, 0, buf, sizeof buf) == (int64_t)sizeof buf && memcmp(buf, data, sizeof buf) == 0);
  CHECK_ERR(ubtrfs_unlink(fs, snap, "f"), EROFS, "");
  OK(ubtrfs_subvol_get_readonly(fs, snap, &ro));
  CHECK(ro == 1);
  OK(ubtrfs_create(fs, sv, "copy", 0644, &copy));
  OK(ubtrfs_clone(fs, got, 0, copy, 0, 0));
  CHECK(ubtrfs_read(fs, copy, 0, buf, sizeof buf) == (int64_t)sizeof buf && memcmp(buf, data, sizeof buf) == 0);
  CHECK_ERR(ubtrfs_clone(fs, got, 1, copy, 0, 4096), EINVAL, "");
  {
    int alg = 0;
    uint8_t digest[64];
    size_t n = 0;
    CHECK_ERR(ubtrfs_measure_verity(fs, copy, &alg, digest, &n), ENODATA, "");
    CHECK_ERR(ubtrfs_enable_verity(fs, copy, 7, 0, NULL, 0), EINVAL, "");
    OK(ubtrfs_enable_verity(fs, copy, 1, 0, "salt", 4));
    OK(ubtrfs_measure_verity(fs, copy, &alg, digest, &n));
    CHECK(alg == 1 && n == 32);
    CHECK(ubtrfs_write(fs, copy, 0, data, sizeof data) == -EPERM);
    CHECK(ubtrfs_read(fs, copy, 0, buf, sizeof buf) == (int64_t)sizeof buf && memcmp(buf, data, sizeof buf) == 0);
  }
  memset(&l, 0, sizeof l);
  OK(ubtrfs_subvol_list(fs, collect_subvol, &l));
  CHECK(l.count == 2);
  CHECK(l.count >= 2 && strcmp(l.paths[0], "sv") == 0 && strcmp(l.paths[1], "snap") == 0);
  CHECK(l.count >= 2 && l.read_only[0] == 0 && l.read_only[1] == 1);
  CHECK_ERR(ubtrfs_subvol_list(fs, NULL, NULL), EINVAL, "callback is NULL");
  OK(ubtrfs_subvol_get_default(fs, &def));
  CHECK(def == 5);
  OK(ubtrfs_subvol_set_default(fs, sv.root));
  OK(ubtrfs_subvol_get_default(fs, &def));
  CHECK(def == sv.root);
  CHECK_ERR(ubtrfs_subvol_delete(fs, root, "sv"), EPERM, "default");
  OK(ubtrfs_subvol_set_default(fs, 5));
  CHECK_ERR(ubtrfs_subvol_set_default(fs, 4242), ENOENT, "4242");
  OK(ubtrfs_subvol_set_readonly(fs, snap, 0));
  OK(ubtrfs_subvol_delete(fs, root, "snap"));
  CHECK_ERR(ubtrfs_lookup(fs, "/snap", &got), ENOENT, "snap");
  OK(ubtrfs_close(fs));
  /* Reopened: the clone kept its bytes after its source went. */
  OK(ubtrfs_open(image, 0, &fs));
  OK(ubtrfs_lookup(fs, "/sv/copy", &got));
  CHECK(ubtrfs_read(fs, got, 0, buf, sizeof buf) == (int64_t)sizeof buf && memcmp(buf, data, sizeof buf) == 0);
  memset(&l, 0, sizeof l);
  OK(ubtrfs_subvol_list(fs, collect_subvol, &l));
  CHECK(l.count == 1);
  OK(ubtrfs_close(fs));
}

static void bad_inputs(const char *image) {
  ubtrfs_fs *fs = (ubtrfs_fs *)1;
  ubtrfs_ino ino = {5, 256};
  ubtrfs_stat_t st;
  char buf[16];

  CHECK_ERR(ubtrfs_open(NULL, 0, &fs), EINVAL, "path is NULL");
  CHECK(fs == NULL);
  CHECK_ERR(ubtrfs_open(image, 0, NULL), EINVAL, "out is NULL");
  CHECK_ERR(ubtrfs_open("/nonexistent/ubtrfs.img", 0, &fs), ENOENT, "/nonexistent/ubtrfs.img");
  CHECK_ERR(ubtrfs_open(image, 0x80, &fs), EINVAL, "unknown flags");
  CHECK_ERR(ubtrfs_open("/dev/null", 0, &fs), EINVAL, "/dev/null");

  /* A NULL handle is -EBADF in every call. */
  CHECK_ERR(ubtrfs_close(NULL), EBADF, "NULL");
  CHECK_ERR(ubtrfs_commit(NULL), EBADF, "ubtrfs_commit");
  CHECK_ERR(ubtrfs_root(NULL, &ino), EBADF, "NULL");
  CHECK_ERR(ubtrfs_lookup(NULL, "/", &ino), EBADF, "ubtrfs_lookup");
  CHECK_ERR(ubtrfs_stat(NULL, ino, &st), EBADF, "NULL");
  CHECK_ERR(ubtrfs_readdir(NULL, ino, collect, NULL), EBADF, "NULL");
  CHECK_ERR(ubtrfs_read(NULL, ino, 0, buf, sizeof buf), EBADF, "ubtrfs_read");
  CHECK_ERR(ubtrfs_write(NULL, ino, 0, buf, sizeof buf), EBADF, "ubtrfs_write");
  CHECK_ERR(ubtrfs_create(NULL, ino, "x", 0644, NULL), EBADF, "ubtrfs_create");
  CHECK_ERR(ubtrfs_mkdir(NULL, ino, "x", 0755, NULL), EBADF, "NULL");
  CHECK_ERR(ubtrfs_unlink(NULL, ino, "x"), EBADF, "NULL");
  CHECK_ERR(ubtrfs_rename(NULL, ino, "a", ino, "b", 0), EBADF, "NULL");
  CHECK_ERR(ubtrfs_setxattr(NULL, ino, "user.a", "v", 1, 0), EBADF, "NULL");
  CHECK_ERR(ubtrfs_getxattr(NULL, ino, "user.a", buf, sizeof buf), EBADF, "NULL");
  CHECK_ERR(ubtrfs_statfs(NULL, NULL), EBADF, "NULL");
  CHECK_ERR(ubtrfs_export(NULL, "/", "/tmp/x", 0), EBADF, "NULL");
  CHECK_ERR(ubtrfs_mkfs(NULL, 1 << 30, 0), EINVAL, "path is NULL");
  CHECK_ERR(ubtrfs_mkfs(image, 1 << 20, 1), EINVAL, "too small");
  CHECK_ERR(ubtrfs_mkfs(image, 0, 0), EEXIST, "already holds a btrfs");
}

/* ubtrfs_mkfs_ex: an image built from a host directory with a read-only
 * subvolume and compression, as `ubtrfs mkfs --rootdir` builds it. */
static void mkfs_with_options(const char *work) {
  char src[1024], img[1024], cmd[6000], buf[64];
  const char *devices[1];
  const char *subvols[] = {"ro:sv", NULL};
  ubtrfs_mkfs_opts_t o;
  ubtrfs_fs *fs = NULL;
  ubtrfs_ino got;
  struct subvols l;
  int64_t n;

  snprintf(src, sizeof src, "%s/mkfs-src", work);
  snprintf(img, sizeof img, "%s/mkfs-ex.img", work);
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' && mkdir -p '%s/sv' && echo top > '%s/a' && echo inner > '%s/sv/b'",
           src, img, src, src, src);
  if (system(cmd) != 0) {
    CHECK(!"could not make the source tree");
    return;
  }
  devices[0] = img;
  memset(&o, 0, sizeof o);
  CHECK_ERR(ubtrfs_mkfs_ex(devices, 1, &o), EINVAL, "struct_size");
  o.struct_size = sizeof o;
  o.size = 256u << 20;
  o.data_profile = "raid7";
  CHECK_ERR(ubtrfs_mkfs_ex(devices, 1, &o), EINVAL, "raid7");
  CHECK_ERR(ubtrfs_mkfs_ex(devices, 0, &o), EINVAL, "no device");
  o.data_profile = NULL;
  o.label = "from-c";
  o.rootdir = src;
  o.compress = "zstd";
  o.subvols = subvols;
  o.source_date_epoch_set = 1;
  o.source_date_epoch = 1700000000;
  OK(ubtrfs_mkfs_ex(devices, 1, &o));
  CHECK_ERR(ubtrfs_mkfs_ex(devices, 1, &o), EEXIST, "already contains");

  OK(ubtrfs_open(img, 0, &fs));
  if (!fs) return;
  OK(ubtrfs_lookup(fs, "/a", &got));
  n = ubtrfs_read(fs, got, 0, buf, sizeof buf);
  CHECK(n == 4 && memcmp(buf, "top\n", 4) == 0);
  OK(ubtrfs_lookup(fs, "/sv/b", &got));
  n = ubtrfs_read(fs, got, 0, buf, sizeof buf);
  CHECK(n == 6 && memcmp(buf, "inner\n", 6) == 0);
  memset(&l, 0, sizeof l);
  OK(ubtrfs_subvol_list(fs, collect_subvol, &l));
  CHECK(l.count == 1 && strcmp(l.paths[0], "sv") == 0 && l.read_only[0]);
  OK(ubtrfs_close(fs));
}

int main(int argc, char **argv) {
  char image[4096], out[4096], cmd[8300];
  const char *work = argc > 1 ? argv[1] : "capi_test.work";
  ubtrfs_fs *fs = NULL;
  ubtrfs_ino root, dir, file, sym, fifo, got;
  ubtrfs_stat_t st;
  ubtrfs_statfs_t sfs;
  struct listing l;
  char buf[256];
  static char big[300000];
  static char bigback[300000];
  size_t i;
  FILE *f;

  mkdir(work, 0755);
  snprintf(image, sizeof image, "%s/capi.img", work);
  snprintf(out, sizeof out, "%s/export", work);
  unlink(image);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
  if (system(cmd) != 0) return 2;

  CHECK(strcmp(ubtrfs_version(), "0.1.0") == 0);
  OK(ubtrfs_mkfs(image, 128u << 20, 0));
  bad_inputs(image);

  /* Read-only: changes are EROFS. */
  OK(ubtrfs_open(image, 0, &fs));
  OK(ubtrfs_root(fs, &root));
  CHECK(root.root == 5 && root.ino == 256);
  CHECK_ERR(ubtrfs_create(fs, root, "a", 0644, &file), EROFS, "");
  CHECK_ERR(ubtrfs_commit(fs), EROFS, "read-only");
  CHECK_ERR(ubtrfs_fsync(fs, root, 0), EROFS, "read-only");
  CHECK_ERR(ubtrfs_lookup(fs, "/missing", &got), ENOENT, "/missing");
  CHECK_ERR(ubtrfs_lookup(fs, "relative", &got), EINVAL, "not an absolute path");
  CHECK_ERR(ubtrfs_lookup(fs, NULL, &got), EINVAL, "path is NULL");
  CHECK_ERR(ubtrfs_readdir(fs, root, NULL, NULL), EINVAL, "callback is NULL");
  OK(ubtrfs_close(fs));

  /* Write. */
  OK(ubtrfs_open(image, UBTRFS_OPEN_WRITABLE, &fs));
  OK(ubtrfs_root(fs, &root));
  OK(ubtrfs_mkdir(fs, root, "dir", 0750, &dir));
  OK(ubtrfs_create(fs, dir, "hello.txt", 0640, &file));
  CHECK(ubtrfs_write(fs, file, 0, "hello, world\n", 13) == 13);
  for (i = 0; i < sizeof big; ++i) big[i] = (char)(i * 7 + i / 4096);
  OK(ubtrfs_create(fs, root, "big", 0600, &got));
  CHECK(ubtrfs_write(fs, got, 0, big, sizeof big) == (int64_t)sizeof big);
  OK(ubtrfs_symlink(fs, root, "sym", "dir/hello.txt", &sym));
  OK(ubtrfs_link(fs, file, root, "hardlink"));
  OK(ubtrfs_mknod(fs, root, "fifo", S_IFIFO | 0644, 0, &fifo));
  OK(ubtrfs_setxattr(fs, file, "user.color", "blue", 4, UBTRFS_XATTR_CREATE));
  CHECK_ERR(ubtrfs_setxattr(fs, file, "user.color", "red", 3, UBTRFS_XATTR_CREATE), EEXIST, "user.color");
  OK(ubtrfs_setxattr(fs, file, "user.gone", "x", 1, 0));
  OK(ubtrfs_removexattr(fs, file, "user.gone"));
  OK(ubtrfs_create(fs, root, "old", 0644, &got));
  OK(ubtrfs_rename(fs, root, "old", dir, "new", 0));
  OK(ubtrfs_truncate(fs, got, 10000));
  OK(ubtrfs_chmod(fs, got, 0604));
  OK(ubtrfs_chown(fs, got, 1234, 5678));
  {
    ubtrfs_time t[2] = {{1000000000, 5}, {1234567890, 123456789}};
    OK(ubtrfs_utimens(fs, got, t));
  }
  OK(ubtrfs_create(fs, root, "doomed", 0644, NULL));
  OK(ubtrfs_unlink(fs, root, "doomed"));
  OK(ubtrfs_mkdir(fs, root, "emptydir", 0755, NULL));
  OK(ubtrfs_rmdir(fs, root, "emptydir"));

  /* Bad arguments on a good handle. */
  CHECK_ERR(ubtrfs_create(fs, root, "a/b", 0644, NULL), EINVAL, "single name");
  CHECK_ERR(ubtrfs_create(fs, root, "", 0644, NULL), EINVAL, "empty name");
  CHECK_ERR(ubtrfs_create(fs, root, "..", 0644, NULL), EINVAL, "..");
  CHECK_ERR(ubtrfs_create(fs, root, NULL, 0644, NULL), EINVAL, "name is NULL");
  CHECK_ERR(ubtrfs_create(fs, dir, "hello.txt", 0644, NULL), EEXIST, "hello.txt");
  CHECK_ERR(ubtrfs_mknod(fs, root, "reg", 0644, 0, NULL), EINVAL, "S_IFIFO");
  CHECK_ERR(ubtrfs_rename(fs, root, "big", root, "x", 7), EINVAL, "unknown flags");
  CHECK_ERR(ubtrfs_rename(fs, root, "big", root, "sym", UBTRFS_RENAME_NOREPLACE), EEXIST, "");
  CHECK_ERR(ubtrfs_rmdir(fs, root, "dir"), ENOTEMPTY, "dir");
  CHECK_ERR(ubtrfs_unlink(fs, root, "nothere"), ENOENT, "nothere");
  CHECK_ERR(ubtrfs_chmod(fs, file, 0100644), EINVAL, "permission bits");
  CHECK_ERR(ubtrfs_truncate(fs, dir, 0), EISDIR, "directory");
  CHECK_ERR(ubtrfs_write(fs, file, 0, NULL, 3), EINVAL, "buf is NULL");
  CHECK_ERR(ubtrfs_setxattr(fs, file, "user.a", "v", 1, 0x10), EINVAL, "unknown flags");
  {
    ubtrfs_setattr_t sa;
    memset(&sa, 0, sizeof sa);
    sa.valid = 0x1000;
    CHECK_ERR(ubtrfs_setattr(fs, file, &sa), EINVAL, "unknown bits");
    CHECK_ERR(ubtrfs_setattr(fs, file, NULL), EINVAL, "attr is NULL");
  }
  {
    ubtrfs_ino bogus = {5, 999999}, bogus_tree = {12345, 256};
    CHECK(ubtrfs_stat(fs, bogus, &st) < 0);
    CHECK(ubtrfs_last_error()[0] != '\0');
    CHECK(ubtrfs_stat(fs, bogus_tree, &st) < 0);
    CHECK(ubtrfs_last_error()[0] != '\0');
    CHECK(ubtrfs_read(fs, bogus_tree, 0, buf, sizeof buf) < 0);
    CHECK(ubtrfs_write(fs, bogus, 0, "x", 1) < 0);
    CHECK(ubtrfs_create(fs, bogus_tree, "x", 0644, NULL) < 0);
    CHECK_ERR(ubtrfs_read(fs, dir, 0, buf, sizeof buf), EISDIR, "");
    CHECK_ERR(ubtrfs_write(fs, sym, 0, "x", 1), EINVAL, "not a regular file");
    CHECK_ERR(ubtrfs_readlink(fs, file, buf, sizeof buf), EINVAL, "");
    CHECK_ERR(ubtrfs_create(fs, file, "x", 0644, NULL), ENOTDIR, "");
  }
  /* The message is per call: a good call clears it. */
  OK(ubtrfs_stat(fs, root, &st));
  CHECK(ubtrfs_last_error()[0] == '\0');

  OK(ubtrfs_fsync(fs, file, 0));
  OK(ubtrfs_fsync(fs, root, 1));
  CHECK_ERR(ubtrfs_fsync(NULL, file, 0), EBADF, "ubtrfs_fsync");

  /* An open file unlinked: nameless but readable until the last unpin. */
  {
    ubtrfs_ino tmp;
    OK(ubtrfs_create(fs, root, "tmp-open", 0600, &tmp));
    CHECK(ubtrfs_write(fs, tmp, 0, "pinned", 6) == 6);
    OK(ubtrfs_pin_inode(fs, tmp));
    OK(ubtrfs_unlink(fs, root, "tmp-open"));
    CHECK(ubtrfs_lookup(fs, "/tmp-open", &got) == -ENOENT);
    OK(ubtrfs_stat(fs, tmp, &st));
    CHECK(st.nlink == 0);
    memset(buf, 0, sizeof buf);
    CHECK(ubtrfs_read(fs, tmp, 0, buf, sizeof buf) == 6 && memcmp(buf, "pinned", 6) == 0);
    OK(ubtrfs_unpin_inode(fs, tmp));
    CHECK(ubtrfs_stat(fs, tmp, &st) == -ENOENT);
    CHECK_ERR(ubtrfs_pin_inode(NULL, tmp), EBADF, "ubtrfs_pin_inode");
  }
  OK(ubtrfs_commit(fs));
  OK(ubtrfs_close(fs));
  fs = NULL;

  /* Reopen read-only and read everything back. */
  OK(ubtrfs_open(image, 0, &fs));
  OK(ubtrfs_lookup(fs, "/dir/hello.txt", &got));
  CHECK(got.ino == file.ino && got.root == file.root);
  memset(buf, 0, sizeof buf);
  CHECK(ubtrfs_read(fs, got, 0, buf, sizeof buf) == 13);
  CHECK(memcmp(buf, "hello, world\n", 13) == 0);
  CHECK(ubtrfs_read(fs, got, 7, buf, 5) == 5 && memcmp(buf, "world", 5) == 0);
  CHECK(ubtrfs_read(fs, got, 13, buf, sizeof buf) == 0);
  OK(ubtrfs_stat(fs, got, &st));
  CHECK(st.size == 13 && st.mode == (S_IFREG | 0640) && st.nlink == 2);
  CHECK(st.uid == (uint32_t)geteuid());

  OK(ubtrfs_lookup(fs, "/big", &got));
  CHECK(ubtrfs_read(fs, got, 0, bigback, sizeof bigback) == (int64_t)sizeof bigback);
  CHECK(memcmp(big, bigback, sizeof big) == 0);

  OK(ubtrfs_stat_path(fs, "/dir/new", &st));
  CHECK(st.mode == (S_IFREG | 0604) && st.uid == 1234 && st.gid == 5678 && st.size == 10000);
  CHECK(st.atime.sec == 1000000000 && st.atime.nsec == 5);
  CHECK(st.mtime.sec == 1234567890 && st.mtime.nsec == 123456789);
  OK(ubtrfs_stat_path(fs, "/dir", &st));
  CHECK(S_ISDIR(st.mode) && (st.mode & 07777) == 0750);
  OK(ubtrfs_stat_path(fs, "/fifo", &st));
  CHECK(S_ISFIFO(st.mode));

  OK(ubtrfs_lookup(fs, "/sym", &got));
  CHECK(ubtrfs_readlink(fs, got, buf, sizeof buf) == 13 && strcmp(buf, "dir/hello.txt") == 0);
  CHECK(ubtrfs_readlink(fs, got, buf, 4) == 13 && memcmp(buf, "dir/", 4) == 0);
  OK(ubtrfs_lookup(fs, "/hardlink", &got));
  CHECK(got.ino == file.ino);

  CHECK(ubtrfs_getxattr(fs, file, "user.color", NULL, 0) == 4);
  CHECK(ubtrfs_getxattr(fs, file, "user.color", buf, sizeof buf) == 4 && memcmp(buf, "blue", 4) == 0);
  CHECK(ubtrfs_getxattr(fs, file, "user.color", buf, 2) == 4); /* too small: the length, nothing copied */
  CHECK_ERR(ubtrfs_getxattr(fs, file, "user.gone", buf, sizeof buf), ENODATA, "user.gone");
  CHECK(ubtrfs_listxattr(fs, file, buf, sizeof buf) == 11 && strcmp(buf, "user.color") == 0);

  memset(&l, 0, sizeof l);
  OK(ubtrfs_root(fs, &root));
  OK(ubtrfs_readdir(fs, root, collect, &l));
  CHECK(l.count == 5);
  CHECK(has_name(&l, "dir") && has_name(&l, "big") && has_name(&l, "sym") && has_name(&l, "hardlink") &&
        has_name(&l, "fifo"));
  CHECK(!has_name(&l, "doomed") && !has_name(&l, "emptydir") && !has_name(&l, "old"));
  CHECK(ubtrfs_readdir(fs, root, stop_at_first, NULL) == 42);
  OK(ubtrfs_lookup_child(fs, root, "dir", &dir));
  memset(&l, 0, sizeof l);
  OK(ubtrfs_readdir(fs, dir, collect, &l));
  CHECK(l.count == 2 && has_name(&l, "hello.txt") && has_name(&l, "new"));
  CHECK_ERR(ubtrfs_readdir(fs, file, collect, &l), ENOTDIR, "");

  OK(ubtrfs_statfs(fs, &sfs));
  CHECK(sfs.block_size == 4096 && sfs.total_bytes == (128u << 20) && sfs.used_bytes > 0 && sfs.name_max == 255);
  /* Free data space for file data: some, and never more than the free bytes (metadata never counts). */
  CHECK(sfs.avail_bytes > 0 && sfs.avail_bytes <= sfs.free_bytes);

  /* Export to the host. */
  CHECK_ERR(ubtrfs_export(fs, "/dir", out, 0x100), EINVAL, "unknown flags");
  CHECK_ERR(ubtrfs_export(fs, "/nothere", out, 0), ENOENT, "/nothere");
  OK(ubtrfs_export(fs, "/dir", out, UBTRFS_EXPORT_NO_XATTRS));
  snprintf(cmd, sizeof cmd, "%s/hello.txt", out);
  f = fopen(cmd, "rb");
  CHECK(f != NULL);
  if (f) {
    memset(buf, 0, sizeof buf);
    CHECK(fread(buf, 1, sizeof buf, f) == 13 && memcmp(buf, "hello, world\n", 13) == 0);
    fclose(f);
  }
  OK(ubtrfs_close(fs));

  /* Discard: with UBTRFS_OPEN_UNDO_UNCOMMITTED the image is as at the last commit, byte for byte. */
  snprintf(cmd, sizeof cmd, "cp '%s' '%s.before'", image, image);
  CHECK(system(cmd) == 0);
  OK(ubtrfs_open(image, UBTRFS_OPEN_WRITABLE | UBTRFS_OPEN_UNDO_UNCOMMITTED, &fs));
  OK(ubtrfs_root(fs, &root));
  OK(ubtrfs_create(fs, root, "discarded", 0644, &got));
  CHECK(ubtrfs_write(fs, got, 0, big, sizeof big) == (int64_t)sizeof big);
  OK(ubtrfs_unlink(fs, root, "big"));
  OK(ubtrfs_discard(fs));
  CHECK(ubtrfs_create(fs, root, "after-discard", 0644, NULL) < 0);
  OK(ubtrfs_close(fs));
  snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s.before'", image, image);
  CHECK(system(cmd) == 0);
  OK(ubtrfs_open(image, 0, &fs));
  CHECK_ERR(ubtrfs_discard(fs), EROFS, "read-only");
  CHECK_ERR(ubtrfs_lookup(fs, "/discarded", &got), ENOENT, "discarded");
  OK(ubtrfs_lookup(fs, "/big", &got));
  OK(ubtrfs_close(fs));
  CHECK_ERR(ubtrfs_discard(NULL), EBADF, "NULL");

  /* A filesystem 1 MiB into the image file. */
  snprintf(cmd, sizeof cmd, "%s/offset.img", work);
  {
    static char sh[3 * sizeof cmd];
    snprintf(sh, sizeof sh, "head -c 1048576 /dev/zero >'%s' && cat '%s' >>'%s'", cmd, image, cmd);
    CHECK(system(sh) == 0);
  }
  CHECK_ERR(ubtrfs_open_ex(cmd, 0, 1u << 20, 1, &fs), EINVAL, "not both");
  CHECK_ERR(ubtrfs_open_ex(cmd, 0, 0, -1, &fs), EINVAL, "negative");
  CHECK(ubtrfs_open_ex(cmd, 0, 0, 0, &fs) < 0); /* no filesystem at byte 0 */
  OK(ubtrfs_open_ex(cmd, 0, 1u << 20, 0, &fs));
  OK(ubtrfs_lookup(fs, "/dir/hello.txt", &got));
  CHECK(ubtrfs_read(fs, got, 0, buf, sizeof buf) == 13 && memcmp(buf, "hello, world\n", 13) == 0);
  OK(ubtrfs_close(fs));
  unlink(cmd);

  subvolumes(image);
  mkfs_with_options(work);

  /* What btrfs-progs thinks of it. */
  if (system("command -v btrfs >/dev/null 2>&1") == 0) {
    snprintf(cmd, sizeof cmd, "btrfs check --readonly '%s' >'%s/check.log' 2>&1", image, work);
    if (system(cmd) != 0) {
      fprintf(stderr, "btrfs check --readonly %s failed; see %s/check.log\n", image, work);
      ++failures;
    }
  } else {
    printf("btrfs-progs not installed: btrfs check skipped\n");
  }

  if (failures) {
    fprintf(stderr, "capi_test: %d failure(s)\n", failures);
    return 1;
  }
  printf("capi_test: all passed\n");
  return 0;
}
