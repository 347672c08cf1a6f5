"""Read and write btrfs images from Python, without root or the kernel.

A thin, Pythonic layer over libubtrfs's C API (include/ubtrfs/ubtrfs.h),
called through ctypes: no compiled extension, so it does not depend on the
Python or C++ ABI.

    import ubtrfs

    ubtrfs.mkfs("disk.img", 256 << 20)
    with ubtrfs.open("disk.img", writable=True) as fs:
        fs.mkdir("/etc")
        with fs.open("/etc/hostname", "w") as f:
            f.write("box\\n")
        fs.setxattr("/etc/hostname", "user.origin", b"python")
        fs.commit()
        print(fs.listdir("/etc"), fs.stat("/etc/hostname").st_size)

Paths inside an image are absolute ("/etc/hostname"); symbolic links are not
followed by any call (``stat`` is ``lstat``). Errors raise ``OSError`` with
the errno, so the usual subclasses apply (``FileNotFoundError``,
``FileExistsError``, ``PermissionError``, ...); the message is libubtrfs's.

A writable image collects changes in a running transaction; ``commit()``
makes them durable (all or nothing on a crash) and ``close()`` (or leaving the
``with`` block) commits what is left; ``discard()`` (or an exception leaving
the ``with`` block) gives it up instead.

The shared library is found, in this order, at ``$UBTRFS_LIBRARY``, next to
this module (``pip install`` copies it there), or on the system's library
path (``libubtrfs.so.0`` from ``cmake --install``).
"""

import ctypes
import ctypes.util
import errno as _errno
import io
import os
import posixpath
import stat as _stat
import threading
from collections import namedtuple

__all__ = [
    "open", "mkfs", "Filesystem", "File", "DirEntry", "StatVFS", "Subvolume", "library_path",
    "RENAME_NOREPLACE", "RENAME_EXCHANGE", "XATTR_CREATE", "XATTR_REPLACE",
]
__version__ = "0.1.0"

_builtin_open = open

XATTR_CREATE = 0x1
XATTR_REPLACE = 0x2
RENAME_NOREPLACE = 0x1
RENAME_EXCHANGE = 0x2
_OPEN_WRITABLE = 0x1
_OPEN_NO_VERIFY_CSUMS = 0x2
_OPEN_UNDO_UNCOMMITTED = 0x4
_EXPORT_STRICT, _EXPORT_NO_DEVICES, _EXPORT_NO_XATTRS = 0x1, 0x2, 0x4
_SET_MODE, _SET_UID, _SET_GID, _SET_SIZE, _SET_ATIME, _SET_MTIME = 0x1, 0x2, 0x4, 0x8, 0x10, 0x20


# ---- The C API --------------------------------------------------------------------------------

class _Ino(ctypes.Structure):
    _fields_ = [("root", ctypes.c_uint64), ("ino", ctypes.c_uint64)]


class _Time(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_int64), ("nsec", ctypes.c_uint32)]


class _Stat(ctypes.Structure):
    _fields_ = [("id", _Ino), ("mode", ctypes.c_uint32), ("nlink", ctypes.c_uint32),
                ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32), ("rdev", ctypes.c_uint64),
                ("size", ctypes.c_uint64), ("nbytes", ctypes.c_uint64), ("generation", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("atime", _Time), ("mtime", _Time), ("ctime", _Time),
                ("otime", _Time)]


class _StatFs(ctypes.Structure):
    _fields_ = [("block_size", ctypes.c_uint32), ("node_size", ctypes.c_uint32),
                ("total_bytes", ctypes.c_uint64), ("used_bytes", ctypes.c_uint64),
                ("free_bytes", ctypes.c_uint64), ("name_max", ctypes.c_uint64),
                ("avail_bytes", ctypes.c_uint64)]


class _Subvol(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("parent_id", ctypes.c_uint64), ("dir_ino", ctypes.c_uint64),
                ("path", ctypes.c_char_p), ("uuid", ctypes.c_uint8 * 16), ("parent_uuid", ctypes.c_uint8 * 16),
                ("received_uuid", ctypes.c_uint8 * 16), ("generation", ctypes.c_uint64),
                ("ctransid", ctypes.c_uint64), ("otransid", ctypes.c_uint64), ("ctime", _Time), ("otime", _Time),
                ("read_only", ctypes.c_int)]


_SUBVOL_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_Subvol))


class _SetAttr(ctypes.Structure):
    _fields_ = [("valid", ctypes.c_uint32), ("mode", ctypes.c_uint32), ("uid", ctypes.c_uint32),
                ("gid", ctypes.c_uint32), ("size", ctypes.c_uint64), ("atime", _Time), ("mtime", _Time),
                ("ctime", _Time)]


class _MkfsOpts(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("size", ctypes.c_uint64), ("force", ctypes.c_int),
                ("label", ctypes.c_char_p), ("uuid", ctypes.c_char_p), ("csum", ctypes.c_char_p),
                ("nodesize", ctypes.c_uint32), ("data_profile", ctypes.c_char_p),
                ("metadata_profile", ctypes.c_char_p), ("features", ctypes.c_char_p), ("mixed", ctypes.c_int),
                ("rootdir", ctypes.c_char_p), ("compress", ctypes.c_char_p),
                ("subvols", ctypes.POINTER(ctypes.c_char_p)), ("inode_flags", ctypes.POINTER(ctypes.c_char_p)),
                ("owner_set", ctypes.c_int), ("owner_uid", ctypes.c_uint32), ("owner_gid", ctypes.c_uint32),
                ("deterministic", ctypes.c_int), ("source_date_epoch_set", ctypes.c_int),
                ("source_date_epoch", ctypes.c_int64), ("shrink", ctypes.c_int), ("reflink", ctypes.c_int)]


_READDIR_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, _Ino, ctypes.c_uint,
                               ctypes.c_uint64)
_FS = ctypes.c_void_p
_P = ctypes.POINTER
_c_int, _c_i64, _c_u32, _c_u64, _c_str, _c_void, _c_size = (
    ctypes.c_int, ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_void_p,
    ctypes.c_size_t)

_SIGNATURES = {
    "ubtrfs_open": (_c_int, [_c_str, ctypes.c_uint, _P(_FS)]),
    "ubtrfs_close": (_c_int, [_FS]),
    "ubtrfs_commit": (_c_int, [_FS]),
    "ubtrfs_fsync": (_c_int, [_FS, _Ino, _c_int]),
    "ubtrfs_discard": (_c_int, [_FS]),
    "ubtrfs_open_ex": (_c_int, [_c_str, ctypes.c_uint, _c_u64, _c_int, _P(_FS)]),
    "ubtrfs_mkfs": (_c_int, [_c_str, _c_u64, _c_int]),
    "ubtrfs_mkfs_ex": (_c_int, [_P(_c_str), _c_size, _P(_MkfsOpts)]),
    "ubtrfs_last_error": (_c_str, []),
    "ubtrfs_version": (_c_str, []),
    "ubtrfs_root": (_c_int, [_FS, _P(_Ino)]),
    "ubtrfs_lookup": (_c_int, [_FS, _c_str, _P(_Ino)]),
    "ubtrfs_lookup_child": (_c_int, [_FS, _Ino, _c_str, _P(_Ino)]),
    "ubtrfs_stat": (_c_int, [_FS, _Ino, _P(_Stat)]),
    "ubtrfs_readdir": (_c_int, [_FS, _Ino, _READDIR_FN, _c_void]),
    "ubtrfs_read": (_c_i64, [_FS, _Ino, _c_u64, _c_void, _c_size]),
    "ubtrfs_write": (_c_i64, [_FS, _Ino, _c_u64, _c_void, _c_size]),
    "ubtrfs_readlink": (_c_i64, [_FS, _Ino, _c_void, _c_size]),
    "ubtrfs_create": (_c_int, [_FS, _Ino, _c_str, _c_u32, _P(_Ino)]),
    "ubtrfs_mkdir": (_c_int, [_FS, _Ino, _c_str, _c_u32, _P(_Ino)]),
    "ubtrfs_mknod": (_c_int, [_FS, _Ino, _c_str, _c_u32, _c_u64, _P(_Ino)]),
    "ubtrfs_symlink": (_c_int, [_FS, _Ino, _c_str, _c_str, _P(_Ino)]),
    "ubtrfs_link": (_c_int, [_FS, _Ino, _Ino, _c_str]),
    "ubtrfs_unlink": (_c_int, [_FS, _Ino, _c_str]),
    "ubtrfs_rmdir": (_c_int, [_FS, _Ino, _c_str]),
    "ubtrfs_rename": (_c_int, [_FS, _Ino, _c_str, _Ino, _c_str, ctypes.c_uint]),
    "ubtrfs_setattr": (_c_int, [_FS, _Ino, _P(_SetAttr)]),
    "ubtrfs_getxattr": (_c_i64, [_FS, _Ino, _c_str, _c_void, _c_size]),
    "ubtrfs_listxattr": (_c_i64, [_FS, _Ino, _c_void, _c_size]),
    "ubtrfs_setxattr": (_c_int, [_FS, _Ino, _c_str, _c_void, _c_size, _c_int]),
    "ubtrfs_removexattr": (_c_int, [_FS, _Ino, _c_str]),
    "ubtrfs_statfs": (_c_int, [_FS, _P(_StatFs)]),
    "ubtrfs_export": (_c_int, [_FS, _c_str, _c_str, ctypes.c_uint]),
    "ubtrfs_subvol_create": (_c_int, [_FS, _Ino, _c_str, _c_u32, _P(_Ino)]),
    "ubtrfs_snapshot": (_c_int, [_FS, _Ino, _Ino, _c_str, _c_int, _P(_Ino)]),
    "ubtrfs_subvol_delete": (_c_int, [_FS, _Ino, _c_str]),
    "ubtrfs_subvol_list": (_c_int, [_FS, _SUBVOL_FN, _c_void]),
    "ubtrfs_subvol_get_default": (_c_int, [_FS, _P(_c_u64)]),
    "ubtrfs_subvol_set_default": (_c_int, [_FS, _c_u64]),
    "ubtrfs_subvol_get_readonly": (_c_int, [_FS, _Ino, _P(_c_int)]),
    "ubtrfs_subvol_set_readonly": (_c_int, [_FS, _Ino, _c_int]),
    "ubtrfs_clone": (_c_int, [_FS, _Ino, _c_u64, _Ino, _c_u64, _c_u64]),
    "ubtrfs_enable_verity": (_c_int, [_FS, _Ino, _c_int, _c_u32, _c_void, _c_size]),
    "ubtrfs_measure_verity": (_c_int, [_FS, _Ino, _P(_c_int), _c_void, _P(_c_size)]),
}

_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def _candidates():
    env = os.environ.get("UBTRFS_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libubtrfs.so.0", "libubtrfs.so"):
        p = os.path.join(here, name)
        if os.path.exists(p):
            yield p
    yield "libubtrfs.so.0"
    found = ctypes.util.find_library("ubtrfs")
    if found:
        yield found


def _load():
    global _lib, _lib_path
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        for cand in _candidates():
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                tried.append(f"{cand}: {e}")
                continue
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = res
                fn.argtypes = args
            _lib, _lib_path = lib, cand
            return lib
        raise ImportError("ubtrfs: cannot load libubtrfs (set UBTRFS_LIBRARY to its path): " + "; ".join(tried))


def library_path():
    """The path of the libubtrfs shared library in use."""
    _load()
    return _lib_path


def _error(rc, filename=None, filename2=None):
    msg = (_lib.ubtrfs_last_error() or b"").decode("utf-8", "replace")
    code = -rc
    text = f"{os.strerror(code)} ({msg})" if msg else os.strerror(code)
    if filename2 is not None:
        return OSError(code, text, filename, None, filename2)
    return OSError(code, text, filename)


def _check(rc, filename=None, filename2=None):
    if rc < 0:
        raise _error(rc, filename, filename2)
    return rc


def _fspath(path):
    """An image path as bytes: absolute, no NUL."""
    p = os.fsencode(os.fspath(path))
    if not p.startswith(b"/"):
        raise ValueError(f"ubtrfs paths are absolute inside the image: {os.fsdecode(p)!r}")
    if b"\0" in p:
        raise ValueError("embedded null byte in path")
    return p


def _name(name):
    n = os.fsencode(name)
    if b"\0" in n:
        raise ValueError("embedded null byte in name")
    return n


def mkfs(image, size=0, force=False, *, label=None, uuid=None, csum=None, nodesize=0, data=None, metadata=None,
         features=None, mixed=False, rootdir=None, compress=None, subvols=(), inode_flags=(), owner=None,
         deterministic=False, source_date_epoch=None, shrink=False, reflink=False):
    """Create a btrfs filesystem in the image file `image` (or a list of images or devices).

    The file is created (or extended) to `size` bytes; size 0 keeps an
    existing file's size. An image that already holds btrfs is refused
    (FileExistsError) unless `force` is true.

    The keyword arguments are `ubtrfs mkfs`'s options: `rootdir` (a host
    directory or tar archive to import, with `subvols` such as "ro:usr",
    `inode_flags` such as "nodatacow:var/lib/db", `owner` (uid, gid) and
    `compress` such as "zstd:3"), `label`, `uuid`, `csum`, `nodesize`,
    `data` and `metadata` profiles, `features` ("block-group-tree,^mixed-bg"),
    `mixed`, `source_date_epoch` (the same input then gives the same image
    bytes; `deterministic` does that with epoch 0), `shrink` and `reflink`.
    """
    lib = _load()
    if size < 0:
        raise ValueError("size must be >= 0")
    images = [image] if isinstance(image, (str, bytes, os.PathLike)) else list(image)
    plain = (len(images) == 1 and not (label or uuid or csum or nodesize or data or metadata or features or mixed
                                       or rootdir or compress or subvols or inode_flags or owner or deterministic
                                       or source_date_epoch is not None or shrink or reflink))
    if plain:
        _check(lib.ubtrfs_mkfs(os.fsencode(os.fspath(images[0])), size, 1 if force else 0), os.fspath(images[0]))
        return

    def text(v):
        return None if v is None else os.fsencode(v)

    def strings(values):
        arr = (ctypes.c_char_p * (len(values) + 1))(*[os.fsencode(v) for v in values], None)
        return ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), arr

    o = _MkfsOpts()
    o.struct_size = ctypes.sizeof(_MkfsOpts)
    o.size = size
    o.force = 1 if force else 0
    o.label, o.uuid, o.csum = text(label), text(uuid), text(csum)
    o.nodesize = nodesize
    o.data_profile, o.metadata_profile, o.features = text(data), text(metadata), text(features)
    o.mixed = 1 if mixed else 0
    o.rootdir, o.compress = text(None if rootdir is None else os.fspath(rootdir)), text(compress)
    o.subvols, keep_subvols = strings(list(subvols))
    o.inode_flags, keep_flags = strings(list(inode_flags))
    if owner is not None:
        o.owner_set, o.owner_uid, o.owner_gid = 1, owner[0], owner[1]
    o.deterministic = 1 if deterministic else 0
    if source_date_epoch is not None:
        o.source_date_epoch_set, o.source_date_epoch = 1, int(source_date_epoch)
    o.shrink = 1 if shrink else 0
    o.reflink = 1 if reflink else 0
    paths = (ctypes.c_char_p * len(images))(*[os.fsencode(os.fspath(i)) for i in images])
    _check(lib.ubtrfs_mkfs_ex(paths, len(images), ctypes.byref(o)), os.fspath(images[0]))
    del keep_subvols, keep_flags


def open(image, writable=False, verify_checksums=True, offset=0, partition=0, undo=False):  # noqa: A001
    """Open the btrfs image file (or block device) `image`; returns a Filesystem.

    With writable=False every change raises OSError(EROFS). With
    verify_checksums=False data checksums are not checked on reads. The
    filesystem may start `offset` bytes into the image, or be partition
    `partition` (1-based) of its GPT or MBR table. With undo=True,
    Filesystem.discard() (and an exception leaving the ``with`` block) puts
    the image back byte for byte as at the last commit.

    Use it as a context manager: leaving the block normally closes and
    commits; leaving it by an exception discards what was not committed.
    """
    return Filesystem(image, writable=writable, verify_checksums=verify_checksums, offset=offset,
                      partition=partition, undo=undo)


Subvolume = namedtuple("Subvolume", "id parent_id path uuid parent_uuid received_uuid generation ctransid "
                       "otransid ctime_ns otime_ns read_only")
Subvolume.__doc__ = """A subvolume or snapshot as `btrfs subvolume list` shows it (uuids as uuid.UUID or None)."""

StatVFS = namedtuple("StatVFS", "f_bsize f_frsize f_blocks f_bfree f_bavail f_namemax "
                                "total_bytes used_bytes free_bytes node_size")
StatVFS.__doc__ = "statvfs()-like numbers of an image (block counts in f_frsize units, and the byte figures)."


class DirEntry:
    """An entry of Filesystem.scandir(): name, path, inode number, and its type."""

    __slots__ = ("name", "path", "_ino", "_type", "root")

    def __init__(self, name, path, ino, dtype):
        self.name = name
        self.path = path
        self._ino = ino.ino
        self.root = ino.root
        self._type = dtype

    def inode(self):
        """The inode number."""
        return self._ino

    def is_dir(self, follow_symlinks=False):
        """Whether the entry is a directory (symlinks are never followed)."""
        return self._type == 4  # DT_DIR

    def is_file(self, follow_symlinks=False):
        """Whether the entry is a regular file."""
        return self._type == 8  # DT_REG

    def is_symlink(self):
        """Whether the entry is a symbolic link."""
        return self._type == 10  # DT_LNK

    def __repr__(self):
        return f"<ubtrfs.DirEntry {self.name!r}>"

    def __fspath__(self):
        return self.path


def _to_stat_result(s):
    def ns(t):
        return t.sec * 1_000_000_000 + t.nsec
    a, m, c = ns(s.atime), ns(s.mtime), ns(s.ctime)
    return os.stat_result((
        s.mode, s.id.ino, s.id.root, s.nlink, s.uid, s.gid, s.size,
        s.atime.sec, s.mtime.sec, s.ctime.sec,
        a / 1e9, m / 1e9, c / 1e9, a, m, c,
        4096, (s.nbytes + 511) // 512, s.rdev))


class Filesystem:
    """An opened btrfs image. Make one with ubtrfs.open(); all paths are absolute.

    Safe to use from several threads (as libubtrfs's Filesystem is).
    """

    def __init__(self, image, writable=False, verify_checksums=True, offset=0, partition=0, undo=False):
        lib = _load()
        self._lib = lib
        self._image = os.fspath(image)
        self.writable = bool(writable)
        flags = ((_OPEN_WRITABLE if writable else 0) | (0 if verify_checksums else _OPEN_NO_VERIFY_CSUMS)
                 | (_OPEN_UNDO_UNCOMMITTED if undo else 0))
        if offset < 0 or partition < 0:
            raise ValueError("offset and partition must be >= 0")
        h = _FS()
        _check(lib.ubtrfs_open_ex(os.fsencode(image), flags, offset, partition, ctypes.byref(h)), self._image)
        self._h = h

    # -- lifetime --

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.writable and self._h:
            try:
                self.discard()
            except OSError:
                pass
        self.close()
        return False

    def __del__(self):
        if getattr(self, "_h", None):
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self):
        state = "closed" if self.closed else ("writable" if self.writable else "read-only")
        return f"<ubtrfs.Filesystem {self._image!r} {state}>"

    @property
    def closed(self):
        """Whether close() was called."""
        return not getattr(self, "_h", None)

    def close(self):
        """Commit what a writable image changed since the last commit, and close it."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            _check(self._lib.ubtrfs_close(h), self._image)

    def commit(self):
        """Make every change so far durable (one transaction: all or nothing on a crash)."""
        _check(self._lib.ubtrfs_commit(self._handle()), self._image)

    def fsync(self, path, datasync=False):
        """Make one file or directory durable, as os.fsync (os.fdatasync with datasync=True).

        Writes a tree log of its changes, not a whole commit, where the kernel
        would; other changes may or may not survive a crash.
        """
        _check(self._lib.ubtrfs_fsync(self._handle(), self._lookup(path), 1 if datasync else 0), os.fsdecode(path))

    def discard(self):
        """Give up every change since the last commit (then close the image).

        Nothing more is committed and later changes raise OSError(EROFS);
        opened with undo=True, the image is put back byte for byte.
        """
        _check(self._lib.ubtrfs_discard(self._handle()), self._image)

    def _handle(self):
        if not self._h:
            raise ValueError("I/O operation on a closed ubtrfs.Filesystem")
        return self._h

    # -- names --

    def _lookup(self, path):
        p = _fspath(path)
        ino = _Ino()
        _check(self._lib.ubtrfs_lookup(self._handle(), p, ctypes.byref(ino)), os.fsdecode(p))
        return ino

    def _parent(self, path, root_errno=_errno.EBUSY):
        """(parent inode, name) of a path whose last component is to be made or removed."""
        p = _fspath(path).rstrip(b"/")
        if not p:
            raise OSError(root_errno, os.strerror(root_errno) + " (the root directory)", os.fsdecode(path))
        head, name = posixpath.split(p)
        if name in (b".", b".."):
            raise OSError(_errno.EINVAL, "Invalid argument (cannot use . or .. as the name)", os.fsdecode(p))
        return self._lookup(head or b"/"), name, os.fsdecode(p)

    def _stat_ino(self, ino, path):
        s = _Stat()
        _check(self._lib.ubtrfs_stat(self._handle(), ino, ctypes.byref(s)), path)
        return s

    def stat(self, path):
        """An os.stat_result for `path` (not following a final symlink: this is lstat).

        st_ino is the inode number, st_dev the subvolume (tree) id, times carry
        nanoseconds (st_mtime_ns ...), st_blocks counts 512-byte units.
        """
        return _to_stat_result(self._stat_ino(self._lookup(path), os.fsdecode(os.fspath(path))))

    lstat = stat

    def exists(self, path):
        """Whether `path` exists in the image."""
        try:
            self._lookup(path)
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path):
        """Whether `path` is a directory."""
        try:
            return _stat.S_ISDIR(self.stat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path):
        """Whether `path` is a regular file."""
        try:
            return _stat.S_ISREG(self.stat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def scandir(self, path="/"):
        """The entries of a directory (without . and ..) as a list of DirEntry, in index order."""
        ino = self._lookup(path)
        base = os.fsdecode(_fspath(path)).rstrip("/")
        out = []

        def each(_ctx, name, child, dtype, _index):
            n = os.fsdecode(name)
            out.append(DirEntry(n, base + "/" + n, _Ino(child.root, child.ino), dtype))
            return 0

        cb = _READDIR_FN(each)
        _check(self._lib.ubtrfs_readdir(self._handle(), ino, cb, None), os.fsdecode(os.fspath(path)))
        return out

    def listdir(self, path="/"):
        """The names in a directory (without . and ..), in index order."""
        return [e.name for e in self.scandir(path)]

    def walk(self, top="/"):
        """Like os.walk (top-down, symlinks not followed): yields (dirpath, dirnames, filenames)."""
        entries = self.scandir(top)
        dirs = [e.name for e in entries if e.is_dir()]
        files = [e.name for e in entries if not e.is_dir()]
        yield top, dirs, files
        base = os.fsdecode(os.fspath(top)).rstrip("/")
        for d in dirs:
            yield from self.walk(base + "/" + d)

    # -- data --

    def open(self, path, mode="r", perm=0o644, encoding=None, errors=None, newline=None):  # noqa: A003
        """Open a file in the image, like the builtin open(): returns a file object.

        Modes: "r", "w", "a", "x" with optional "+" and "b" ("rb", "wb",
        "r+b", ...). Binary modes give an unbuffered ubtrfs.File (read, write,
        seek, tell, truncate, readinto, iteration by lines); text modes wrap it
        in io.TextIOWrapper. "w" and "a" create the file with permission bits
        `perm` when it is missing; "w" truncates it; "x" requires it to be new.
        """
        m = set(mode)
        if not m <= set("rwaxb+t") or len(m) != len(mode) or len(m & set("rwax")) != 1 or {"b", "t"} <= m:
            raise ValueError(f"invalid mode: {mode!r}")
        binary = "b" in m
        raw = File(self, path, mode.replace("b", "").replace("t", ""), perm)
        if binary:
            if encoding is not None or errors is not None or newline is not None:
                raw.close()
                raise ValueError("binary mode doesn't take an encoding, errors or newline argument")
            return raw
        if raw.readable() and raw.writable():
            buf = io.BufferedRandom(raw)
        elif raw.writable():
            buf = io.BufferedWriter(raw)
        else:
            buf = io.BufferedReader(raw)
        return io.TextIOWrapper(buf, encoding=encoding or "utf-8", errors=errors, newline=newline)

    def read_bytes(self, path):
        """The whole content of a file."""
        with self.open(path, "rb") as f:
            return f.read()

    def write_bytes(self, path, data, perm=0o644):
        """Create or replace the content of a file with `data`."""
        with self.open(path, "wb", perm=perm) as f:
            f.write(data)

    def _read(self, ino, offset, size, path):
        buf = ctypes.create_string_buffer(size)
        n = _check(self._lib.ubtrfs_read(self._handle(), ino, offset, buf, size), path)
        return buf.raw[:n]

    def _write(self, ino, offset, data, path):
        return _check(self._lib.ubtrfs_write(self._handle(), ino, offset, data, len(data)), path)

    # -- changes --

    def mkdir(self, path, mode=0o755):
        """Create a directory (FileExistsError when the name exists)."""
        parent, name, p = self._parent(path, _errno.EEXIST)
        _check(self._lib.ubtrfs_mkdir(self._handle(), parent, name, mode & 0o7777, None), p)

    def makedirs(self, path, mode=0o755, exist_ok=False):
        """Create a directory and its missing parents, like os.makedirs."""
        p = os.fsdecode(_fspath(path)).rstrip("/")
        if not p:
            if exist_ok:
                return
            raise FileExistsError(_errno.EEXIST, "File exists", "/")
        head = posixpath.dirname(p)
        if head and head != "/" and not self.exists(head):
            self.makedirs(head, mode, exist_ok=True)
        try:
            self.mkdir(p, mode)
        except FileExistsError:
            if not exist_ok or not self.isdir(p):
                raise

    def mknod(self, path, mode=0o600 | _stat.S_IFIFO, device=0):
        """Create a fifo, socket or device node (mode carries S_IFIFO, S_IFCHR, ...)."""
        parent, name, p = self._parent(path)
        _check(self._lib.ubtrfs_mknod(self._handle(), parent, name, mode, device, None), p)

    def remove(self, path):
        """Remove a file, symlink or special file (not a directory: IsADirectoryError)."""
        parent, name, p = self._parent(path)
        _check(self._lib.ubtrfs_unlink(self._handle(), parent, name), p)

    unlink = remove

    def rmdir(self, path):
        """Remove an empty directory."""
        parent, name, p = self._parent(path)
        _check(self._lib.ubtrfs_rmdir(self._handle(), parent, name), p)

    def rename(self, src, dst, noreplace=False, exchange=False):
        """Rename src to dst, replacing dst as rename(2) does.

        noreplace: FileExistsError when dst exists; exchange: swap the two.
        """
        sp, sn, s = self._parent(src)
        dp, dn, d = self._parent(dst)
        flags = (RENAME_NOREPLACE if noreplace else 0) | (RENAME_EXCHANGE if exchange else 0)
        _check(self._lib.ubtrfs_rename(self._handle(), sp, sn, dp, dn, flags), s, d)

    replace = rename

    def symlink(self, target, path):
        """Create a symbolic link at `path` pointing to `target` (as os.symlink(target, path))."""
        parent, name, p = self._parent(path)
        _check(self._lib.ubtrfs_symlink(self._handle(), parent, name, _name(target), None), p)

    def readlink(self, path):
        """The target of a symbolic link (str)."""
        ino = self._lookup(path)
        p = os.fsdecode(os.fspath(path))
        n = _check(self._lib.ubtrfs_readlink(self._handle(), ino, None, 0), p)
        buf = ctypes.create_string_buffer(n + 1)
        _check(self._lib.ubtrfs_readlink(self._handle(), ino, buf, n + 1), p)
        return os.fsdecode(buf.raw[:n])

    def link(self, src, dst):
        """A new name `dst` for the existing file `src` (a hard link)."""
        ino = self._lookup(src)
        parent, name, d = self._parent(dst)
        _check(self._lib.ubtrfs_link(self._handle(), ino, parent, name), os.fsdecode(os.fspath(src)), d)

    def _setattr(self, path, **fields):
        ino = self._lookup(path)
        sa = _SetAttr()
        for k, (bit, v) in fields.items():
            sa.valid |= bit
            setattr(sa, k, v)
        _check(self._lib.ubtrfs_setattr(self._handle(), ino, ctypes.byref(sa)), os.fsdecode(os.fspath(path)))

    def chmod(self, path, mode):
        """Set the permission bits (mode & 0o7777)."""
        self._setattr(path, mode=(_SET_MODE, mode & 0o7777))

    def chown(self, path, uid, gid):
        """Set the owner and group; -1 leaves one as it is."""
        f = {}
        if uid != -1:
            f["uid"] = (_SET_UID, uid)
        if gid != -1:
            f["gid"] = (_SET_GID, gid)
        self._setattr(path, **f)

    def truncate(self, path, length):
        """Cut or extend a regular file to `length` bytes."""
        if length < 0:
            raise ValueError("negative length")
        st = self.stat(path)
        if _stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(_errno.EISDIR, "Is a directory", os.fsdecode(os.fspath(path)))
        self._setattr(path, size=(_SET_SIZE, length))

    def utime(self, path, times=None, *, ns=None):
        """Set access and modification times, like os.utime: times=(atime, mtime) in
        seconds, or ns=(atime_ns, mtime_ns); neither sets both to now."""
        if times is not None and ns is not None:
            raise ValueError("utime: you may specify either 'times' or 'ns' but not both")
        if times is not None:
            ns = tuple(int(round(t * 1e9)) for t in times)
        if ns is None:
            import time
            now = time.time_ns()
            ns = (now, now)
        a, m = ns
        self._setattr(path, atime=(_SET_ATIME, _Time(a // 10**9, a % 10**9)),
                      mtime=(_SET_MTIME, _Time(m // 10**9, m % 10**9)))

    # -- extended attributes --

    def getxattr(self, path, name):
        """The value (bytes) of the extended attribute `name` (OSError ENODATA when absent)."""
        ino = self._lookup(path)
        p = os.fsdecode(os.fspath(path))
        n = _name(name)
        while True:
            size = _check(self._lib.ubtrfs_getxattr(self._handle(), ino, n, None, 0), p)
            buf = ctypes.create_string_buffer(max(size, 1))
            got = _check(self._lib.ubtrfs_getxattr(self._handle(), ino, n, buf, max(size, 1)), p)
            if got <= max(size, 1):
                return buf.raw[:got]

    def setxattr(self, path, name, value, flags=0):
        """Set the extended attribute `name` to `value` (bytes or str).

        flags: ubtrfs.XATTR_CREATE (FileExistsError if present) or XATTR_REPLACE.
        """
        if isinstance(value, str):
            value = value.encode()
        value = bytes(value)
        ino = self._lookup(path)
        _check(self._lib.ubtrfs_setxattr(self._handle(), ino, _name(name), value, len(value), flags),
               os.fsdecode(os.fspath(path)))

    def listxattr(self, path):
        """The names of the extended attributes of `path` (list of str)."""
        ino = self._lookup(path)
        p = os.fsdecode(os.fspath(path))
        while True:
            size = _check(self._lib.ubtrfs_listxattr(self._handle(), ino, None, 0), p)
            if size == 0:
                return []
            buf = ctypes.create_string_buffer(size)
            got = _check(self._lib.ubtrfs_listxattr(self._handle(), ino, buf, size), p)
            if got <= size:
                return [os.fsdecode(n) for n in buf.raw[:got].split(b"\0") if n]

    def removexattr(self, path, name):
        """Remove the extended attribute `name`."""
        ino = self._lookup(path)
        _check(self._lib.ubtrfs_removexattr(self._handle(), ino, _name(name)), os.fsdecode(os.fspath(path)))

    # -- the whole image --

    def statvfs(self):
        """Sizes of the image as a StatVFS (os.statvfs-like fields plus bytes)."""
        s = _StatFs()
        _check(self._lib.ubtrfs_statfs(self._handle(), ctypes.byref(s)), self._image)
        bs = s.block_size or 4096
        return StatVFS(bs, bs, s.total_bytes // bs, s.free_bytes // bs, s.avail_bytes // bs, s.name_max,
                       s.total_bytes, s.used_bytes, s.free_bytes, s.node_size)

    # -- subvolumes, snapshots, reflinks --

    def create_subvolume(self, path, mode=0o755):
        """Create an empty subvolume at `path` (committed on return), as `btrfs subvolume create`."""
        parent, name, p = self._parent(path, _errno.EEXIST)
        _check(self._lib.ubtrfs_subvol_create(self._handle(), parent, name, mode & 0o7777, None), p)

    def snapshot(self, source, path, readonly=False):
        """Snapshot the subvolume whose top is `source` as `path` (O(1); committed on return)."""
        src = self._lookup(source)
        parent, name, p = self._parent(path, _errno.EEXIST)
        _check(self._lib.ubtrfs_snapshot(self._handle(), src, parent, name, 1 if readonly else 0, None),
               os.fsdecode(os.fspath(source)), p)

    def delete_subvolume(self, path):
        """Delete the subvolume or snapshot at `path`; what only it held is freed."""
        parent, name, p = self._parent(path)
        _check(self._lib.ubtrfs_subvol_delete(self._handle(), parent, name), p)

    def list_subvolumes(self):
        """Every subvolume and snapshot but the top level, by id, as Subvolume tuples."""
        import uuid as _uuid
        out = []

        def u(raw):
            b = bytes(raw)
            return None if not any(b) else _uuid.UUID(bytes=b)

        def each(_ctx, sp):
            s = sp.contents
            out.append(Subvolume(s.id, s.parent_id, os.fsdecode(s.path or b""), u(s.uuid), u(s.parent_uuid),
                                 u(s.received_uuid), s.generation, s.ctransid, s.otransid,
                                 s.ctime.sec * 10**9 + s.ctime.nsec, s.otime.sec * 10**9 + s.otime.nsec,
                                 bool(s.read_only)))
            return 0

        _check(self._lib.ubtrfs_subvol_list(self._handle(), _SUBVOL_FN(each), None), self._image)
        return out

    @property
    def default_subvolume(self):
        """Id of the subvolume the kernel mounts by default (5: the top level); settable."""
        v = ctypes.c_uint64()
        _check(self._lib.ubtrfs_subvol_get_default(self._handle(), ctypes.byref(v)), self._image)
        return v.value

    @default_subvolume.setter
    def default_subvolume(self, subvol_id):
        _check(self._lib.ubtrfs_subvol_set_default(self._handle(), int(subvol_id)), self._image)

    def is_readonly(self, path):
        """The read-only flag of the subvolume whose top is `path` (`btrfs property get ro`)."""
        v = ctypes.c_int()
        _check(self._lib.ubtrfs_subvol_get_readonly(self._handle(), self._lookup(path), ctypes.byref(v)),
               os.fsdecode(os.fspath(path)))
        return bool(v.value)

    def set_readonly(self, path, readonly=True):
        """Set or clear that flag: while set, every change inside is EROFS (an OSError)."""
        _check(self._lib.ubtrfs_subvol_set_readonly(self._handle(), self._lookup(path), 1 if readonly else 0),
               os.fsdecode(os.fspath(path)))

    def reflink(self, src, dst, src_offset=0, dst_offset=0, length=0):
        """Share src's bytes with dst (created if missing) without copying, as FICLONERANGE.

        length 0 means to src's end; offsets and length in whole sectors.
        """
        s = self._lookup(src)
        if not self.exists(dst):
            with self.open(dst, "wb"):
                pass
        _check(self._lib.ubtrfs_clone(self._handle(), s, src_offset, self._lookup(dst), dst_offset, length),
               os.fsdecode(os.fspath(src)), os.fsdecode(os.fspath(dst)))

    def enable_verity(self, path, hash_alg="sha256", block_size=4096, salt=b""):
        """Give the file at `path` fs-verity, as `fsverity enable`: its data cannot change from then on."""
        algs = {"sha256": 1, "sha512": 2}
        if hash_alg not in algs:
            raise ValueError(f"hash_alg must be sha256 or sha512, not {hash_alg!r}")
        salt = bytes(salt)
        _check(self._lib.ubtrfs_enable_verity(self._handle(), self._lookup(path), algs[hash_alg], block_size,
                                              salt, len(salt)), os.fsdecode(os.fspath(path)))

    def measure_verity(self, path):
        """The fs-verity digest of the file at `path` as `fsverity measure` prints it ("sha256:HEX")."""
        alg = ctypes.c_int()
        digest = ctypes.create_string_buffer(64)
        n = ctypes.c_size_t()
        _check(self._lib.ubtrfs_measure_verity(self._handle(), self._lookup(path), ctypes.byref(alg), digest,
                                               ctypes.byref(n)), os.fsdecode(os.fspath(path)))
        return {1: "sha256", 2: "sha512"}.get(alg.value, f"alg{alg.value}") + ":" + digest.raw[:n.value].hex()

    def export(self, path, dest, strict=False, devices=True, xattrs=True):
        """Copy the image's `path` (a directory recursively) to the host path `dest`.

        Safe on untrusted images (as `ubtrfs cp IMAGE:PATH DEST`): nothing is
        written outside `dest` and no symlink there is followed.
        """
        flags = ((_EXPORT_STRICT if strict else 0) | (0 if devices else _EXPORT_NO_DEVICES)
                 | (0 if xattrs else _EXPORT_NO_XATTRS))
        _check(self._lib.ubtrfs_export(self._handle(), _fspath(path), os.fsencode(dest), flags),
               os.fsdecode(os.fspath(path)), os.fspath(dest))


class File(io.RawIOBase):
    """A file in an image, opened by Filesystem.open() in a binary mode.

    Unbuffered: each read() and write() is one libubtrfs call at the current
    position. Supports read, readinto, readline, iteration, write, seek, tell,
    truncate, and use as a context manager.
    """

    def __init__(self, fs, path, mode, perm=0o644):
        super().__init__()
        self._fs = fs
        self.name = os.fsdecode(os.fspath(path))
        self.mode = mode
        self._pos = 0
        self._readable = "r" in mode or "+" in mode
        self._writable = "r" not in mode or "+" in mode
        self._append = "a" in mode
        lib = fs._lib
        try:
            self._ino = fs._lookup(path)
            exists = True
        except FileNotFoundError:
            exists = False
        if "x" in mode and exists:
            raise FileExistsError(_errno.EEXIST, "File exists", self.name)
        if not exists:
            if "r" in mode:
                raise FileNotFoundError(_errno.ENOENT, "No such file or directory", self.name)
            parent, name, p = fs._parent(path)
            ino = _Ino()
            _check(lib.ubtrfs_create(fs._handle(), parent, name, perm & 0o7777, ctypes.byref(ino)), p)
            self._ino = ino
        st = fs._stat_ino(self._ino, self.name)
        if _stat.S_ISDIR(st.mode):
            raise IsADirectoryError(_errno.EISDIR, "Is a directory", self.name)
        if _stat.S_ISLNK(st.mode):
            raise OSError(_errno.ELOOP, "Too many levels of symbolic links (ubtrfs does not follow them)",
                          self.name)
        if not _stat.S_ISREG(st.mode):
            raise OSError(_errno.EINVAL, "Invalid argument (not a regular file)", self.name)
        if self._writable and not fs.writable:
            raise OSError(_errno.EROFS, "Read-only file system (the image was opened read-only)", self.name)
        if exists and "w" in mode and st.size:
            fs._setattr(path, size=(_SET_SIZE, 0))
        if self._append:
            self._pos = fs._stat_ino(self._ino, self.name).size

    def __repr__(self):
        return f"<ubtrfs.File {self.name!r} mode={self.mode!r}>"

    def readable(self):
        return self._readable

    def writable(self):
        return self._writable

    def seekable(self):
        return True

    def _check_open(self):
        if self.closed:
            raise ValueError("I/O operation on closed file.")

    def _size(self):
        return self._fs._stat_ino(self._ino, self.name).size

    def readinto(self, b):
        """Read up to len(b) bytes into b at the current position; the count (0 at EOF)."""
        self._check_open()
        if not self._readable:
            raise io.UnsupportedOperation("not readable")
        mv = memoryview(b).cast("B")
        if len(mv) == 0:
            return 0
        buf = (ctypes.c_char * len(mv)).from_buffer(mv)
        n = _check(self._fs._lib.ubtrfs_read(self._fs._handle(), self._ino, self._pos, buf, len(mv)), self.name)
        self._pos += n
        return n

    def readall(self):
        """Read from the current position to the end of the file."""
        self._check_open()
        if not self._readable:
            raise io.UnsupportedOperation("not readable")
        chunks = []
        while True:
            want = max(self._size() - self._pos, 0) or 65536
            data = self._fs._read(self._ino, self._pos, min(want, 1 << 24), self.name)
            if not data:
                return b"".join(chunks)
            self._pos += len(data)
            chunks.append(data)

    def write(self, b):
        """Write the bytes b at the current position (at the end in append mode); the count."""
        self._check_open()
        if not self._writable:
            raise io.UnsupportedOperation("not writable")
        data = bytes(b)
        if not data:
            return 0
        if self._append:
            self._pos = self._size()
        n = self._fs._write(self._ino, self._pos, data, self.name)
        self._pos += n
        return n

    def seek(self, offset, whence=io.SEEK_SET):
        """Move the position: SEEK_SET, SEEK_CUR or SEEK_END, like a host file."""
        self._check_open()
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size() + offset
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        if pos < 0:
            raise OSError(_errno.EINVAL, "Invalid argument (negative position)", self.name)
        self._pos = pos
        return pos

    def tell(self):
        """The current position."""
        self._check_open()
        return self._pos

    def truncate(self, size=None):
        """Cut or extend the file to `size` (the current position by default)."""
        self._check_open()
        if not self._writable:
            raise io.UnsupportedOperation("not writable")
        size = self._pos if size is None else size
        if size < 0:
            raise OSError(_errno.EINVAL, "Invalid argument (negative size)", self.name)
        sa = _SetAttr()
        sa.valid = _SET_SIZE
        sa.size = size
        _check(self._fs._lib.ubtrfs_setattr(self._fs._handle(), self._ino, ctypes.byref(sa)), self.name)
        return size

    def fileno(self):
        raise io.UnsupportedOperation("a file inside an image has no file descriptor")
