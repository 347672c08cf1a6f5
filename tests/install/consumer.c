/* An installed-library user in C: consumer IMAGE [--mkfs]. Makes the image
 * (with --mkfs), writes a file, commits, reopens read-only and reads it back. */
#include <stdio.h>
#include <string.h>

#include <ubtrfs/ubtrfs.h>

static int die(const char *what) {
  fprintf(stderr, "consumer.c: %s: %s\n", what, ubtrfs_last_error());
  return 1;
}

int main(int argc, char **argv) {
  const char payload[] = "written by an installed C program\n";
  ubtrfs_fs *fs;
  ubtrfs_ino root, dir, file;
  char buf[128];
  int64_t n;
  if (argc < 2) return 2;
  if (argc > 2 && strcmp(argv[2], "--mkfs") == 0 && ubtrfs_mkfs(argv[1], 128u << 20, 0) < 0) return die("mkfs");
  if (ubtrfs_open(argv[1], UBTRFS_OPEN_WRITABLE, &fs) < 0) return die("open");
  if (ubtrfs_root(fs, &root) < 0 || ubtrfs_mkdir(fs, root, "from-c", 0755, &dir) < 0) return die("mkdir");
  if (ubtrfs_create(fs, dir, "file", 0644, &file) < 0) return die("create");
  if (ubtrfs_write(fs, file, 0, payload, sizeof payload - 1) != (int64_t)(sizeof payload - 1)) return die("write");
  if (ubtrfs_commit(fs) < 0) return die("commit");
  if (ubtrfs_close(fs) < 0) return die("close");
  if (ubtrfs_open(argv[1], 0, &fs) < 0) return die("reopen");
  if (ubtrfs_lookup(fs, "/from-c/file", &file) < 0) return die("lookup");
  n = ubtrfs_read(fs, file, 0, buf, sizeof buf);
  if (n != (int64_t)(sizeof payload - 1) || memcmp(buf, payload, (size_t)n) != 0) return die("read back");
  if (ubtrfs_close(fs) < 0) return die("close");
  printf("consumer.c: ok (libubtrfs %s)\n", ubtrfs_version());
  return 0;
}
