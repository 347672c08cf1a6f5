// nullfs: a do-nothing in-memory file system on libfuse3's low-level API,
// the ceiling of the FUSE route for the benchmarks (bench/run.py). It keeps
// the namespace and the attributes (enough for fs_mark, dbench and rm -rf)
// and throws file data away: a write only moves the size, a read returns
// zeros. Every request is answered under one mutex, from a multi-threaded
// session loop, so what it costs is the FUSE round trip and little else.
//
//   nullfs MOUNTPOINT [-f] [-o default_permissions,...]     (fusermount3 -u to stop)
//
// There is no flush: the kernel's first FLUSH gets ENOSYS and it sends no
// more, as with ubtrfs. With NULLFS_STATS=1 in the environment, the request
// counts are printed on stderr at unmount ("requests: lookup N, ...").
//
// xattr requests get the cheapest real answers (no such attribute, empty
// list) rather than ENOSYS, so the kernel sends the same requests it sends to
// a file system with xattrs (ubtrfs), and the two are compared like for like.
//
// Built by bench/run.sh with `cc $(pkg-config --cflags --libs fuse3)`: it is
// not a bench/*.cc target because it needs libfuse3 and not libubtrfs.
#define FUSE_USE_VERSION 312
#define _GNU_SOURCE

#include <errno.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

static const double kTimeout = 1.0;  // entry/attr/negative: ubtrfs's defaults

struct entry;

struct node {
  fuse_ino_t ino;
  mode_t mode;
  nlink_t nlink;
  uid_t uid;
  gid_t gid;
  dev_t rdev;
  off_t size;
  struct timespec atime, mtime, ctime;
  uint64_t nlookup;  // kernel references (lookup counts)
  char* target;      // symlinks
  // Directories: entries in creation order (NULL where removed); the index
  // is the readdir offset.
  struct entry** slots;
  size_t nslots, capslots, live;
  fuse_ino_t parent;
};

struct entry {
  struct entry* next;  // hash chain
  fuse_ino_t parent;
  fuse_ino_t ino;
  size_t slot;
  char name[];
};

// Request counts (NULLFS_STATS=1): one relaxed atomic add per request.
static const char* const kOpNames[] = {"lookup", "forget", "forget_multi", "getattr", "setattr", "mknod", "mkdir", "symlink", "readlink", "create", "unlink", "rmdir", "rename", "link", "open", "read", "write", "release", "fsync", "opendir", "readdir", "releasedir", "fsyncdir", "statfs", "getxattr", "listxattr", "setxattr", "removexattr"};
static unsigned long g_counts[sizeof(kOpNames) / sizeof(kOpNames[0])];
static void Count(int op) { __atomic_fetch_add(&g_counts[op], 1, __ATOMIC_RELAXED); }
static void PrintCounts(void) {
  fprintf(stderr, "requests:");
  const char* sep = " ";
  for (size_t i = 0; i < sizeof(kOpNames) / sizeof(kOpNames[0]); ++i) {
    if (!g_counts[i]) continue;
    fprintf(stderr, "%s%s %lu", sep, kOpNames[i], g_counts[i]);
    sep = ", ";
  }
  fprintf(stderr, "\n");
}

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct node** g_nodes;
static size_t g_nnodes, g_capnodes;
static struct entry** g_buckets;
static size_t g_nbuckets, g_nentries;

static uint64_t Hash(fuse_ino_t parent, const char* name) {
  uint64_t h = 1469598103934665603ULL ^ parent;
  for (const unsigned char* p = (const unsigned char*)name; *p; ++p) h = (h ^ *p) * 1099511628211ULL;
  return h ^ (h >> 29);
}

static void* XRealloc(void* p, size_t n) {
  void* q = realloc(p, n);
  if (!q) {
    fprintf(stderr, "nullfs: out of memory\n");
    abort();
  }
  return q;
}

static struct node* Node(fuse_ino_t ino) { return ino < g_nnodes ? g_nodes[ino] : NULL; }

static struct node* NewNode(mode_t mode, const struct fuse_ctx* ctx) {
  if (g_nnodes == g_capnodes) {
    g_capnodes = g_capnodes ? g_capnodes * 2 : 1024;
    g_nodes = XRealloc(g_nodes, g_capnodes * sizeof(*g_nodes));
  }
  struct node* n = XRealloc(NULL, sizeof(*n));
  memset(n, 0, sizeof(*n));
  n->ino = g_nnodes;
  n->mode = mode;
  n->nlink = S_ISDIR(mode) ? 2 : 1;
  n->uid = ctx ? ctx->uid : getuid();
  n->gid = ctx ? ctx->gid : getgid();
  clock_gettime(CLOCK_REALTIME, &n->mtime);
  n->atime = n->ctime = n->mtime;
  g_nodes[g_nnodes++] = n;
  return n;
}

static void MaybeFree(struct node* n) {
  if (n->nlink || n->nlookup || n->ino == FUSE_ROOT_ID) return;
  g_nodes[n->ino] = NULL;
  free(n->target);
  free(n->slots);
  free(n);
}

static struct entry* Find(fuse_ino_t parent, const char* name) {
  if (!g_nbuckets) return NULL;
  for (struct entry* e = g_buckets[Hash(parent, name) & (g_nbuckets - 1)]; e; e = e->next)
    if (e->parent == parent && strcmp(e->name, name) == 0) return e;
  return NULL;
}

static void Rehash(void) {
  size_t nb = g_nbuckets ? g_nbuckets * 2 : 4096;
  struct entry** b = XRealloc(NULL, nb * sizeof(*b));
  memset(b, 0, nb * sizeof(*b));
  for (size_t i = 0; i < g_nbuckets; ++i) {
    for (struct entry* e = g_buckets[i]; e;) {
      struct entry* next = e->next;
      size_t h = Hash(e->parent, e->name) & (nb - 1);
      e->next = b[h];
      b[h] = e;
      e = next;
    }
  }
  free(g_buckets);
  g_buckets = b;
  g_nbuckets = nb;
}

static void AddEntry(struct node* dir, const char* name, struct node* child) {
  if (g_nentries + 1 > g_nbuckets) Rehash();
  size_t len = strlen(name);
  struct entry* e = XRealloc(NULL, sizeof(*e) + len + 1);
  memcpy(e->name, name, len + 1);
  e->parent = dir->ino;
  e->ino = child->ino;
  if (dir->nslots == dir->capslots) {
    dir->capslots = dir->capslots ? dir->capslots * 2 : 16;
    dir->slots = XRealloc(dir->slots, dir->capslots * sizeof(*dir->slots));
  }
  e->slot = dir->nslots;
  dir->slots[dir->nslots++] = e;
  dir->live++;
  size_t h = Hash(dir->ino, name) & (g_nbuckets - 1);
  e->next = g_buckets[h];
  g_buckets[h] = e;
  g_nentries++;
  clock_gettime(CLOCK_REALTIME, &dir->mtime);
  dir->ctime = dir->mtime;
}

static void RemoveEntry(struct entry* e) {
  struct entry** pp = &g_buckets[Hash(e->parent, e->name) & (g_nbuckets - 1)];
  while (*pp != e) pp = &(*pp)->next;
  *pp = e->next;
  struct node* dir = Node(e->parent);
  dir->slots[e->slot] = NULL;
  dir->live--;
  clock_gettime(CLOCK_REALTIME, &dir->mtime);
  dir->ctime = dir->mtime;
  g_nentries--;
  free(e);
}

static void FillStat(const struct node* n, struct stat* st) {
  memset(st, 0, sizeof(*st));
  st->st_ino = n->ino;
  st->st_mode = n->mode;
  st->st_nlink = n->nlink;
  st->st_uid = n->uid;
  st->st_gid = n->gid;
  st->st_rdev = n->rdev;
  st->st_size = n->size;
  st->st_blksize = 4096;
  st->st_blocks = 0;
  st->st_atim = n->atime;
  st->st_mtim = n->mtime;
  st->st_ctim = n->ctime;
}

// Answers with an entry for n and takes a lookup reference. Caller holds g_lock.
static void ReplyEntry(fuse_req_t req, struct node* n, struct fuse_file_info* fi) {
  struct fuse_entry_param e;
  memset(&e, 0, sizeof(e));
  e.ino = n->ino;
  e.attr_timeout = kTimeout;
  e.entry_timeout = kTimeout;
  FillStat(n, &e.attr);
  n->nlookup++;
  if (fi)
    fuse_reply_create(req, &e, fi);
  else
    fuse_reply_entry(req, &e);
}

static void OpInit(void* userdata, struct fuse_conn_info* conn) {
  (void)userdata;
  (void)conn;
  free(NewNode(0, NULL));  // ino 0 is not a valid FUSE inode
  g_nodes[0] = NULL;
  struct node* root = NewNode(S_IFDIR | 0755, NULL);  // ino 1: FUSE_ROOT_ID
  root->parent = FUSE_ROOT_ID;
}

static void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Count(0);
  pthread_mutex_lock(&g_lock);
  struct entry* e = Find(parent, name);
  if (e) {
    ReplyEntry(req, Node(e->ino), NULL);
  } else {
    struct fuse_entry_param ep;
    memset(&ep, 0, sizeof(ep));
    ep.entry_timeout = kTimeout;  // cached "no such name"
    fuse_reply_entry(req, &ep);
  }
  pthread_mutex_unlock(&g_lock);
}

static void Forget(fuse_ino_t ino, uint64_t count) {
  struct node* n = Node(ino);
  if (!n) return;
  n->nlookup = count > n->nlookup ? 0 : n->nlookup - count;
  MaybeFree(n);
}

static void OpForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Count(1);
  pthread_mutex_lock(&g_lock);
  Forget(ino, nlookup);
  pthread_mutex_unlock(&g_lock);
  fuse_reply_none(req);
}

static void OpForgetMulti(fuse_req_t req, size_t count, struct fuse_forget_data* forgets) {
  Count(2);
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < count; ++i) Forget(forgets[i].ino, forgets[i].nlookup);
  pthread_mutex_unlock(&g_lock);
  fuse_reply_none(req);
}

static void OpGetattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  Count(3);
  (void)fi;
  pthread_mutex_lock(&g_lock);
  struct node* n = Node(ino);
  if (n) {
    struct stat st;
    FillStat(n, &st);
    fuse_reply_attr(req, &st, kTimeout);
  } else {
    fuse_reply_err(req, ENOENT);
  }
  pthread_mutex_unlock(&g_lock);
}

static void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, struct fuse_file_info* fi) {
  Count(4);
  (void)fi;
  pthread_mutex_lock(&g_lock);
  struct node* n = Node(ino);
  if (!n) {
    pthread_mutex_unlock(&g_lock);
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  if (to_set & FUSE_SET_ATTR_MODE) n->mode = (n->mode & S_IFMT) | (attr->st_mode & 07777);
  if (to_set & FUSE_SET_ATTR_UID) n->uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) n->gid = attr->st_gid;
  if (to_set & FUSE_SET_ATTR_SIZE) {
    if (!S_ISREG(n->mode)) {
      pthread_mutex_unlock(&g_lock);
      fuse_reply_err(req, S_ISDIR(n->mode) ? EISDIR : EINVAL);
      return;
    }
    n->size = attr->st_size;
    n->mtime = now;
  }
  if (to_set & FUSE_SET_ATTR_ATIME) n->atime = attr->st_atim;
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) n->atime = now;
  if (to_set & FUSE_SET_ATTR_MTIME) n->mtime = attr->st_mtim;
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) n->mtime = now;
  n->ctime = (to_set & FUSE_SET_ATTR_CTIME) ? attr->st_ctim : now;
  struct stat st;
  FillStat(n, &st);
  pthread_mutex_unlock(&g_lock);
  fuse_reply_attr(req, &st, kTimeout);
}

// Creates a node named `name` in `parent`; replies itself on failure and
// returns NULL. Caller holds g_lock.
static struct node* MakeNode(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  struct node* dir = Node(parent);
  if (!dir || !S_ISDIR(dir->mode)) {
    fuse_reply_err(req, dir ? ENOTDIR : ENOENT);
    return NULL;
  }
  if (strlen(name) > 255) {
    fuse_reply_err(req, ENAMETOOLONG);
    return NULL;
  }
  if (Find(parent, name)) {
    fuse_reply_err(req, EEXIST);
    return NULL;
  }
  struct node* n = NewNode(mode, fuse_req_ctx(req));
  if (S_ISDIR(mode)) {
    n->parent = parent;
    dir->nlink++;
  }
  AddEntry(dir, name, n);
  return n;
}

static void OpMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  Count(5);
  pthread_mutex_lock(&g_lock);
  struct node* n = MakeNode(req, parent, name, mode);
  if (n) {
    n->rdev = rdev;
    ReplyEntry(req, n, NULL);
  }
  pthread_mutex_unlock(&g_lock);
}

static void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  Count(6);
  pthread_mutex_lock(&g_lock);
  struct node* n = MakeNode(req, parent, name, S_IFDIR | (mode & 07777));
  if (n) ReplyEntry(req, n, NULL);
  pthread_mutex_unlock(&g_lock);
}

static void OpSymlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  Count(7);
  pthread_mutex_lock(&g_lock);
  struct node* n = MakeNode(req, parent, name, S_IFLNK | 0777);
  if (n) {
    n->target = strdup(link);
    n->size = (off_t)strlen(link);
    ReplyEntry(req, n, NULL);
  }
  pthread_mutex_unlock(&g_lock);
}

static void OpReadlink(fuse_req_t req, fuse_ino_t ino) {
  Count(8);
  pthread_mutex_lock(&g_lock);
  struct node* n = Node(ino);
  if (n && n->target)
    fuse_reply_readlink(req, n->target);
  else
    fuse_reply_err(req, n ? EINVAL : ENOENT);
  pthread_mutex_unlock(&g_lock);
}

static void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, struct fuse_file_info* fi) {
  Count(9);
  pthread_mutex_lock(&g_lock);
  struct node* n = MakeNode(req, parent, name, S_IFREG | (mode & 07777));
  if (n) ReplyEntry(req, n, fi);
  pthread_mutex_unlock(&g_lock);
}

// Drops the name `e`; the node goes when the kernel forgets it too.
static void DropName(struct entry* e) {
  struct node* n = Node(e->ino);
  struct node* dir = Node(e->parent);
  RemoveEntry(e);
  if (S_ISDIR(n->mode)) {
    dir->nlink--;
    n->nlink = 0;
  } else {
    n->nlink--;
  }
  clock_gettime(CLOCK_REALTIME, &n->ctime);
  MaybeFree(n);
}

static void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Count(10);
  pthread_mutex_lock(&g_lock);
  struct entry* e = Find(parent, name);
  int err = 0;
  if (!e)
    err = ENOENT;
  else if (S_ISDIR(Node(e->ino)->mode))
    err = EISDIR;
  else
    DropName(e);
  pthread_mutex_unlock(&g_lock);
  fuse_reply_err(req, err);
}

static void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Count(11);
  pthread_mutex_lock(&g_lock);
  struct entry* e = Find(parent, name);
  int err = 0;
  if (!e)
    err = ENOENT;
  else if (!S_ISDIR(Node(e->ino)->mode))
    err = ENOTDIR;
  else if (Node(e->ino)->live)
    err = ENOTEMPTY;
  else
    DropName(e);
  pthread_mutex_unlock(&g_lock);
  fuse_reply_err(req, err);
}

static void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
                     unsigned int flags) {
  Count(12);
  pthread_mutex_lock(&g_lock);
  int err = 0;
  struct entry* from = Find(parent, name);
  struct entry* to = Find(newparent, newname);
  struct node* ndir = Node(newparent);
  if (flags & ~(unsigned)RENAME_NOREPLACE) {
    err = EINVAL;  // RENAME_EXCHANGE and whiteouts are not needed here
  } else if (!from) {
    err = ENOENT;
  } else if (!ndir || !S_ISDIR(ndir->mode)) {
    err = ENOTDIR;
  } else if (to && (flags & RENAME_NOREPLACE)) {
    err = EEXIST;
  } else if (to == from) {
    err = 0;
  } else {
    struct node* n = Node(from->ino);
    // A directory may not move below itself.
    for (fuse_ino_t a = newparent; S_ISDIR(n->mode); a = Node(a)->parent) {
      if (a == n->ino) {
        err = EINVAL;
        break;
      }
      if (a == FUSE_ROOT_ID) break;
    }
    if (!err && to) {
      struct node* victim = Node(to->ino);
      if (S_ISDIR(victim->mode) != S_ISDIR(n->mode))
        err = S_ISDIR(victim->mode) ? EISDIR : ENOTDIR;
      else if (S_ISDIR(victim->mode) && victim->live)
        err = ENOTEMPTY;
      else
        DropName(to);
    }
    if (!err) {
      RemoveEntry(from);
      if (S_ISDIR(n->mode)) {
        Node(parent)->nlink--;
        ndir->nlink++;
        n->parent = newparent;
      }
      AddEntry(ndir, newname, n);
      clock_gettime(CLOCK_REALTIME, &n->ctime);
    }
  }
  pthread_mutex_unlock(&g_lock);
  fuse_reply_err(req, err);
}

static void OpLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  Count(13);
  pthread_mutex_lock(&g_lock);
  struct node* n = Node(ino);
  struct node* dir = Node(newparent);
  if (!n || !dir) {
    fuse_reply_err(req, ENOENT);
  } else if (S_ISDIR(n->mode)) {
    fuse_reply_err(req, EPERM);
  } else if (Find(newparent, newname)) {
    fuse_reply_err(req, EEXIST);
  } else {
    n->nlink++;
    AddEntry(dir, newname, n);
    ReplyEntry(req, n, NULL);
  }
  pthread_mutex_unlock(&g_lock);
}

static void OpOpen(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  Count(14);
  pthread_mutex_lock(&g_lock);
  struct node* n = Node(ino);
  if (n && (fi->flags & O_TRUNC)) n->size = 0;
  pthread_mutex_unlock(&g_lock);
  if (n)
    fuse_reply_open(req, fi);
  else
    fuse_reply_err(req, ENOENT);
}

static void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info* fi) {
  Count(15);
  (void)fi;
  static const char kZeros[128 * 1024];
  pthread_mutex_lock(&g_lock);
  struct node* n = Node(ino);
  off_t fsize = n ? n->size : 0;
  pthread_mutex_unlock(&g_lock);
  size_t len = off >= fsize ? 0 : (size_t)(fsize - off) < size ? (size_t)(fsize - off) : size;
  if (len > sizeof(kZeros)) len = sizeof(kZeros);
  fuse_reply_buf(req, kZeros, len);
}

static void OpWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
                    struct fuse_file_info* fi) {
  Count(16);
  (void)buf;
  (void)fi;
  pthread_mutex_lock(&g_lock);
  struct node* n = Node(ino);
  if (n) {
    if (off + (off_t)size > n->size) n->size = off + (off_t)size;
    clock_gettime(CLOCK_REALTIME, &n->mtime);
    n->ctime = n->mtime;
  }
  pthread_mutex_unlock(&g_lock);
  if (n)
    fuse_reply_write(req, size);
  else
    fuse_reply_err(req, ENOENT);
}

static void OpReplyOk(fuse_req_t req) { fuse_reply_err(req, 0); }
static void OpRelease(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  Count(17);
  (void)ino;
  (void)fi;
  OpReplyOk(req);
}
static void OpFsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info* fi) {
  Count(18);
  (void)ino;
  (void)datasync;
  (void)fi;
  OpReplyOk(req);
}

static void OpOpendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  Count(19);
  pthread_mutex_lock(&g_lock);
  struct node* n = Node(ino);
  int err = !n ? ENOENT : !S_ISDIR(n->mode) ? ENOTDIR : 0;
  pthread_mutex_unlock(&g_lock);
  if (err)
    fuse_reply_err(req, err);
  else
    fuse_reply_open(req, fi);
}

// Offsets: 1 and 2 after "." and "..", then slot index + 3.
static void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info* fi) {
  Count(20);
  (void)fi;
  char* buf = XRealloc(NULL, size);
  size_t used = 0;
  pthread_mutex_lock(&g_lock);
  struct node* dir = Node(ino);
  if (!dir) {
    pthread_mutex_unlock(&g_lock);
    free(buf);
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct stat st;
  memset(&st, 0, sizeof(st));
  for (off_t o = off; o < (off_t)dir->nslots + 3; ++o) {
    const char* name;
    if (o == 0) {
      name = ".";
      st.st_ino = ino;
      st.st_mode = S_IFDIR;
    } else if (o == 1) {
      name = "..";
      st.st_ino = dir->parent;
      st.st_mode = S_IFDIR;
    } else if (o == 2) {
      continue;
    } else {
      struct entry* e = dir->slots[o - 3];
      if (!e) continue;
      name = e->name;
      st.st_ino = e->ino;
      st.st_mode = Node(e->ino)->mode & S_IFMT;
    }
    size_t need = fuse_add_direntry(req, buf + used, size - used, name, &st, o + 1);
    if (need > size - used) break;
    used += need;
  }
  pthread_mutex_unlock(&g_lock);
  fuse_reply_buf(req, buf, used);
  free(buf);
}

static void OpReleasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  Count(21);
  (void)ino;
  (void)fi;
  OpReplyOk(req);
}
static void OpFsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info* fi) {
  Count(22);
  (void)ino;
  (void)datasync;
  (void)fi;
  OpReplyOk(req);
}

static void OpStatfs(fuse_req_t req, fuse_ino_t ino) {
  Count(23);
  (void)ino;
  struct statvfs s;
  memset(&s, 0, sizeof(s));
  s.f_bsize = s.f_frsize = 4096;
  s.f_blocks = 1 << 24;  // 64 GiB, nearly all free
  s.f_bfree = s.f_bavail = (1 << 24) - 1;
  s.f_files = 1 << 30;
  s.f_ffree = s.f_favail = (1 << 30) - g_nnodes;
  s.f_namemax = 255;
  fuse_reply_statfs(req, &s);
}

static void OpGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  Count(24);
  (void)ino;
  (void)name;
  (void)size;
  fuse_reply_err(req, ENODATA);
}
static void OpListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  Count(25);
  (void)ino;
  if (size == 0)
    fuse_reply_xattr(req, 0);
  else
    fuse_reply_buf(req, NULL, 0);
}
static void OpSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  Count(26);
  (void)ino;
  (void)name;
  (void)value;
  (void)size;
  (void)flags;
  fuse_reply_err(req, ENOTSUP);
}
static void OpRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  Count(27);
  (void)ino;
  (void)name;
  fuse_reply_err(req, ENODATA);
}

static const struct fuse_lowlevel_ops kOps = {
    .init = OpInit,
    .lookup = OpLookup,
    .forget = OpForget,
    .getattr = OpGetattr,
    .setattr = OpSetattr,
    .readlink = OpReadlink,
    .mknod = OpMknod,
    .mkdir = OpMkdir,
    .unlink = OpUnlink,
    .rmdir = OpRmdir,
    .symlink = OpSymlink,
    .rename = OpRename,
    .link = OpLink,
    .open = OpOpen,
    .read = OpRead,
    .write = OpWrite,
    .release = OpRelease,
    .fsync = OpFsync,
    .opendir = OpOpendir,
    .readdir = OpReaddir,
    .releasedir = OpReleasedir,
    .fsyncdir = OpFsyncdir,
    .statfs = OpStatfs,
    .setxattr = OpSetxattr,
    .getxattr = OpGetxattr,
    .listxattr = OpListxattr,
    .removexattr = OpRemovexattr,
    .create = OpCreate,
    .forget_multi = OpForgetMulti,
};

int main(int argc, char* argv[]) {
  struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
  struct fuse_cmdline_opts opts;
  if (fuse_parse_cmdline(&args, &opts) != 0) return 2;
  if (opts.show_help || !opts.mountpoint) {
    fprintf(stderr, "usage: %s MOUNTPOINT [-f] [-o options]\n", argv[0]);
    fuse_cmdline_help();
    free(opts.mountpoint);
    fuse_opt_free_args(&args);
    return opts.show_help ? 0 : 2;
  }
  int ret = 1;
  struct fuse_session* se = fuse_session_new(&args, &kOps, sizeof(kOps), NULL);
  if (!se) goto out;
  if (fuse_set_signal_handlers(se) != 0) goto out_session;
  if (fuse_session_mount(se, opts.mountpoint) != 0) goto out_signals;
  if (fuse_daemonize(opts.foreground) != 0) goto out_unmount;
  if (opts.singlethread) {
    ret = fuse_session_loop(se);
  } else {
    struct fuse_loop_config* lc = fuse_loop_cfg_create();
    fuse_loop_cfg_set_clone_fd(lc, opts.clone_fd);
    fuse_loop_cfg_set_max_threads(lc, opts.max_threads);
    ret = fuse_session_loop_mt(se, lc);
    fuse_loop_cfg_destroy(lc);
  }
out_unmount:
  fuse_session_unmount(se);
  const char* st = getenv("NULLFS_STATS");
  if (st && strcmp(st, "1") == 0) PrintCounts();
out_signals:
  fuse_remove_signal_handlers(se);
out_session:
  fuse_session_destroy(se);
out:
  free(opts.mountpoint);
  fuse_opt_free_args(&args);
  return ret ? 1 : 0;
}
