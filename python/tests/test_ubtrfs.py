"""The ubtrfs Python module against images made and checked by btrfs-progs."""
import errno
import io
import os
import shutil
import stat
import subprocess

import pytest

import ubtrfs

BLOB = bytes((i * 7 + i // 4096) & 0xFF for i in range(300_000))


def host_tree(root):
    """A host directory for mkfs.btrfs --rootdir."""
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").write_text("box\n")
    (root / "blob").write_bytes(BLOB)
    (root / "empty").write_bytes(b"")
    os.symlink("etc/hostname", root / "link")
    os.chmod(root / "etc" / "hostname", 0o640)
    os.utime(root / "blob", ns=(1_000_000_000_123, 1_234_567_890_987_654_321))
    try:
        os.setxattr(root / "blob", "user.color", b"blue")
        return True
    except OSError:
        return False


def test_reads_an_image_mkfs_btrfs_made(tmp_path):
    if not __import__("shutil").which("mkfs.btrfs"):
        pytest.skip("mkfs.btrfs (btrfs-progs) is not installed")
    src = tmp_path / "src"
    has_xattr = host_tree(src)
    img = tmp_path / "rootdir.img"
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    subprocess.run(["mkfs.btrfs", "-q", "-f", "--rootdir", str(src), str(img)], check=True, capture_output=True)

    with ubtrfs.open(img) as fs:
        assert sorted(fs.listdir("/")) == ["blob", "empty", "etc", "link"]
        assert fs.listdir("/etc") == ["hostname"]
        assert fs.read_bytes("/blob") == BLOB
        assert fs.read_bytes("/empty") == b""
        with fs.open("/etc/hostname", "r") as f:
            assert f.read() == "box\n"
        assert fs.readlink("/link") == "etc/hostname"
        st = fs.stat("/etc/hostname")
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
        assert st.st_size == 4 and st.st_nlink == 1
        assert stat.S_ISLNK(fs.lstat("/link").st_mode)
        assert stat.S_ISDIR(fs.stat("/etc").st_mode)
        b = fs.stat("/blob")
        assert b.st_mtime == 1234567890 and b.st_size == len(BLOB)  # mkfs.btrfs 6.2 keeps seconds only
        assert b.st_blocks * 512 >= len(BLOB)
        if has_xattr:
            assert fs.listxattr("/blob") == ["user.color"]
            assert fs.getxattr("/blob", "user.color") == b"blue"
        entries = {e.name: e for e in fs.scandir("/")}
        assert entries["etc"].is_dir() and entries["blob"].is_file() and entries["link"].is_symlink()
        assert entries["blob"].inode() == b.st_ino
        assert list(fs.walk("/"))[0][0] == "/"
        with pytest.raises(OSError) as e:
            fs.mkdir("/new")
        assert e.value.errno == errno.EROFS


def test_writes_what_btrfs_progs_reads_back(progs_image, btrfs_check, btrfs_restore, kernel_mount):
    with ubtrfs.open(progs_image, writable=True) as fs:
        fs.makedirs("/usr/share/doc")
        fs.write_bytes("/usr/share/doc/blob", BLOB)
        with fs.open("/hello.txt", "w") as f:
            f.write("hello\nworld\n")
        fs.mkdir("/tmpdir", 0o700)
        fs.symlink("hello.txt", "/sym")
        fs.link("/hello.txt", "/hard")
        fs.write_bytes("/moved-from", b"moved")
        fs.rename("/moved-from", "/usr/moved")
        fs.write_bytes("/gone", b"x")
        fs.remove("/gone")
        fs.mkdir("/gonedir")
        fs.rmdir("/gonedir")
        fs.chmod("/hello.txt", 0o600)
        fs.chown("/usr/moved", 1000, 1001)
        fs.utime("/usr/moved", ns=(5_000_000_001, 6_000_000_002))
        fs.setxattr("/hello.txt", "user.note", b"kept")
        fs.setxattr("/hello.txt", "user.drop", "dropped")
        fs.removexattr("/hello.txt", "user.drop")
        fs.write_bytes("/cut", b"0123456789")
        fs.truncate("/cut", 4)
        fs.mknod("/fifo", stat.S_IFIFO | 0o644)
        fs.commit()
        # After the commit, more changes; close() commits them too.
        fs.write_bytes("/after-commit", b"late")
    btrfs_check(progs_image)

    with ubtrfs.open(progs_image) as fs:
        assert sorted(fs.listdir("/")) == ["after-commit", "cut", "fifo", "hard", "hello.txt", "sym", "tmpdir", "usr"]
        assert fs.read_bytes("/usr/share/doc/blob") == BLOB
        assert fs.read_bytes("/hello.txt") == b"hello\nworld\n"
        assert fs.read_bytes("/after-commit") == b"late"
        assert fs.read_bytes("/cut") == b"0123"
        assert fs.readlink("/sym") == "hello.txt"
        h = fs.stat("/hello.txt")
        assert h.st_nlink == 2 and fs.stat("/hard").st_ino == h.st_ino
        assert stat.S_IMODE(h.st_mode) == 0o600
        assert stat.S_IMODE(fs.stat("/tmpdir").st_mode) == 0o700
        m = fs.stat("/usr/moved")
        assert (m.st_uid, m.st_gid) == (1000, 1001)
        assert (m.st_atime_ns, m.st_mtime_ns) == (5_000_000_001, 6_000_000_002)
        assert fs.listxattr("/hello.txt") == ["user.note"]
        assert stat.S_ISFIFO(fs.stat("/fifo").st_mode)
        assert not fs.exists("/gone") and not fs.exists("/gonedir") and not fs.exists("/moved-from")
        v = fs.statvfs()
        assert v.total_bytes == 256 << 20 and v.f_bsize == 4096 and 0 < v.used_bytes < v.total_bytes
        assert 0 < v.f_bavail <= v.f_bfree

    # btrfs-progs' own reader sees the same tree.
    out = btrfs_restore(progs_image)
    assert (out / "usr" / "share" / "doc" / "blob").read_bytes() == BLOB
    assert (out / "hello.txt").read_bytes() == b"hello\nworld\n"
    assert (out / "usr" / "moved").read_bytes() == b"moved"
    assert (out / "cut").read_bytes() == b"0123"
    assert os.readlink(out / "sym") == "hello.txt"

    # And so does the kernel (a read-only loop mount, where the machine has them).
    k = kernel_mount(progs_image)
    assert sorted(os.listdir(k)) == ["after-commit", "cut", "fifo", "hard", "hello.txt", "sym", "tmpdir", "usr"]
    assert (k / "usr" / "share" / "doc" / "blob").read_bytes() == BLOB
    assert (k / "hello.txt").read_bytes() == b"hello\nworld\n"
    assert (k / "after-commit").read_bytes() == b"late"
    assert (k / "cut").read_bytes() == b"0123"
    assert os.readlink(k / "sym") == "hello.txt"
    kh = os.lstat(k / "hello.txt")
    assert kh.st_nlink == 2 and os.lstat(k / "hard").st_ino == kh.st_ino and stat.S_IMODE(kh.st_mode) == 0o600
    km = os.lstat(k / "usr" / "moved")
    assert (km.st_uid, km.st_gid) == (1000, 1001)
    assert (km.st_atime_ns, km.st_mtime_ns) == (5_000_000_001, 6_000_000_002)
    assert os.listxattr(k / "hello.txt") == ["user.note"]
    assert os.getxattr(k / "hello.txt", "user.note") == b"kept"
    assert stat.S_ISFIFO(os.lstat(k / "fifo").st_mode)
    assert stat.S_IMODE(os.lstat(k / "tmpdir").st_mode) == 0o700


def test_fsync_survives_a_crash(tmp_path, btrfs_check):
    # fsync writes a tree log: a copy of the image taken right after it (a
    # power cut before any commit) has the file; an unsynced one is not there.
    img = tmp_path / "f.img"
    ubtrfs.mkfs(img, 128 << 20)
    crash = tmp_path / "crash.img"
    with ubtrfs.open(img, writable=True) as fs:
        fs.write_bytes("/committed", b"old")
        fs.commit()
        fs.makedirs("/new/dir")
        fs.write_bytes("/new/dir/synced", b"fsynced bytes")
        fs.fsync("/new/dir/synced")
        fs.write_bytes("/unsynced", b"not fsynced")
        shutil.copyfile(img, crash)
    with ubtrfs.open(crash) as fs:
        assert fs.read_bytes("/new/dir/synced") == b"fsynced bytes"
        assert fs.read_bytes("/committed") == b"old"
        assert not fs.exists("/unsynced")
    with ubtrfs.open(crash, writable=True):
        pass  # replays the log and commits
    btrfs_check(crash)
    with ubtrfs.open(img) as fs:
        with pytest.raises(OSError) as e:
            fs.fsync("/committed")
        assert e.value.errno == errno.EROFS


def test_file_objects(tmp_path, btrfs_check):
    img = tmp_path / "u.img"
    ubtrfs.mkfs(img, 128 << 20)
    with ubtrfs.open(img, writable=True) as fs:
        with fs.open("/f", "wb") as f:
            assert isinstance(f, io.RawIOBase) and f.writable() and not f.readable()
            assert f.write(b"abcdef") == 6
            assert f.tell() == 6
            f.seek(2)
            f.write(b"XY")
            f.seek(0, io.SEEK_END)
            f.write(b"\nline2\n")
        assert f.closed
        with pytest.raises(ValueError):
            f.write(b"closed")
        with fs.open("/f", "rb") as f:
            assert f.read(3) == b"abX"
            assert f.tell() == 3
            assert f.read() == b"Yef\nline2\n"
            assert f.read() == b""
            f.seek(-6, io.SEEK_END)
            assert f.read() == b"line2\n"
            f.seek(0)
            assert list(f) == [b"abXYef\n", b"line2\n"]
            buf = bytearray(4)
            f.seek(1)
            assert f.readinto(buf) == 4 and bytes(buf) == b"bXYe"
            with pytest.raises(io.UnsupportedOperation):
                f.write(b"no")
            with pytest.raises(OSError):
                f.seek(-1)
        with fs.open("/f", "ab") as f:
            f.write(b"appended")
        assert fs.read_bytes("/f").endswith(b"line2\nappended")
        with fs.open("/f", "r+b") as f:
            f.seek(0)
            f.write(b"AB")
            f.truncate(4)
        assert fs.read_bytes("/f") == b"ABXY"
        with fs.open("/f", "wb") as f:  # "w" truncates
            pass
        assert fs.read_bytes("/f") == b""
        with pytest.raises(FileExistsError):
            fs.open("/f", "xb")
        with fs.open("/t.txt", "x", encoding="utf-8") as t:
            t.write("grüße\nzwei\n")
        with fs.open("/t.txt") as t:
            assert t.readline() == "grüße\n" and t.read() == "zwei\n"
        with fs.open("/perm", "wb", perm=0o600):
            pass
        assert stat.S_IMODE(fs.stat("/perm").st_mode) == 0o600
        with pytest.raises(ValueError):
            fs.open("/f", "rw")
        with pytest.raises(IsADirectoryError):
            fs.open("/", "rb")
        fs.symlink("f", "/lnk")
        with pytest.raises(OSError) as e:
            fs.open("/lnk", "wb")
        assert e.value.errno == errno.ELOOP
        fs.mknod("/fifo")
        with pytest.raises(OSError) as e:
            fs.open("/fifo", "rb")
        assert e.value.errno == errno.EINVAL
    btrfs_check(img)


def test_mkfs_builds_an_image_from_a_tree(tmp_path, btrfs_check):
    """mkfs with `ubtrfs mkfs`'s options: a read-only subvolume, compression, a fixed epoch."""
    src = tmp_path / "src"
    host_tree(src)
    (src / "sv").mkdir()
    (src / "sv" / "inner").write_text("x" * 10000)
    imgs = [tmp_path / "a.img", tmp_path / "b.img"]
    for img in imgs:
        ubtrfs.mkfs(img, 256 << 20, label="py", rootdir=src, compress="zstd", subvols=["ro:sv"],
                    source_date_epoch=1_700_000_000, owner=(0, 0))
    assert imgs[0].read_bytes() == imgs[1].read_bytes(), "the same input gave different image bytes"
    btrfs_check(imgs[0])
    with ubtrfs.open(imgs[0]) as fs:
        assert fs.open("/blob", "rb").read() == BLOB
        assert fs.open("/sv/inner", "rb").read() == b"x" * 10000
        assert [s.path for s in fs.list_subvolumes() if s.read_only] == ["sv"]
        assert fs.stat("/etc/hostname").st_uid == 0
    with pytest.raises(FileExistsError):
        ubtrfs.mkfs(imgs[0], rootdir=src)
    with pytest.raises(OSError) as e:
        ubtrfs.mkfs(tmp_path / "c.img", 256 << 20, data="raid7")
    assert e.value.errno == errno.EINVAL and "raid7" in str(e.value)
    assert not (tmp_path / "c.img").exists()


def test_errors_are_oserrors_with_errno(tmp_path):
    img = tmp_path / "e.img"
    ubtrfs.mkfs(img, 128 << 20)
    with pytest.raises(FileExistsError):
        ubtrfs.mkfs(img, 128 << 20)
    with pytest.raises(FileNotFoundError) as e:
        ubtrfs.open(tmp_path / "missing.img")
    assert e.value.errno == errno.ENOENT and e.value.filename == str(tmp_path / "missing.img")
    junk = tmp_path / "junk.img"
    junk.write_bytes(b"\0" * (1 << 20))
    with pytest.raises(OSError) as e:
        ubtrfs.open(junk)
    assert e.value.errno and "ubtrfs_open" in str(e.value)

    with ubtrfs.open(img, writable=True) as fs:
        with pytest.raises(FileNotFoundError) as e:
            fs.stat("/nope")
        assert "nope" in str(e.value) and e.value.filename == "/nope"
        fs.mkdir("/d")
        fs.write_bytes("/d/f", b"x")
        with pytest.raises(FileExistsError):
            fs.mkdir("/d")
        with pytest.raises(FileExistsError):
            fs.mkdir("/")
        with pytest.raises(OSError) as e:
            fs.rmdir("/d")
        assert e.value.errno == errno.ENOTEMPTY
        with pytest.raises(NotADirectoryError):
            fs.listdir("/d/f")
        with pytest.raises(NotADirectoryError):
            fs.stat("/d/f/x")
        with pytest.raises(IsADirectoryError):
            fs.remove("/d")
        with pytest.raises(FileNotFoundError):
            fs.remove("/d/nothing")
        with pytest.raises(FileExistsError):
            fs.rename("/d/f", "/d", noreplace=True)
        with pytest.raises(OSError) as e:
            fs.getxattr("/d/f", "user.none")
        assert e.value.errno == errno.ENODATA
        with pytest.raises(FileExistsError):
            fs.setxattr("/d/f", "user.a", b"1") or fs.setxattr("/d/f", "user.a", b"2", ubtrfs.XATTR_CREATE)
        with pytest.raises(ValueError):
            fs.stat("relative/path")
        with pytest.raises(ValueError):
            fs.stat("/nul\0byte")
        with pytest.raises(IsADirectoryError):
            fs.truncate("/d", 0)
    assert fs.closed
    with pytest.raises(ValueError):
        fs.listdir("/")
    fs.close()  # a second close is a no-op

    with ubtrfs.open(img) as fs:
        for call in (lambda: fs.mkdir("/x"), lambda: fs.write_bytes("/x", b"1"), lambda: fs.remove("/d/f"),
                     lambda: fs.setxattr("/d", "user.x", b"1"), fs.commit, lambda: fs.open("/d/f", "ab")):
            with pytest.raises(OSError) as e:
                call()
            assert e.value.errno == errno.EROFS, call


def test_an_exception_in_the_with_block_discards(tmp_path, btrfs_check):
    img = tmp_path / "d.img"
    ubtrfs.mkfs(img, 128 << 20)
    with ubtrfs.open(img, writable=True) as fs:
        fs.write_bytes("/kept", b"committed")
    before = img.read_bytes()
    with pytest.raises(RuntimeError):
        with ubtrfs.open(img, writable=True, undo=True) as fs:
            fs.write_bytes("/lost", BLOB)
            fs.remove("/kept")
            raise RuntimeError("stop")
    assert img.read_bytes() == before
    with ubtrfs.open(img, writable=True) as fs:
        assert fs.listdir("/") == ["kept"]
        fs.write_bytes("/x", b"1")
        fs.discard()
        with pytest.raises(OSError) as e:
            fs.write_bytes("/y", b"2")
        assert e.value.errno == errno.EROFS
    with ubtrfs.open(img) as fs:
        assert fs.listdir("/") == ["kept"]
    btrfs_check(img)


def test_offset_and_partition(tmp_path):
    img = tmp_path / "p.img"
    ubtrfs.mkfs(img, 128 << 20)
    with ubtrfs.open(img, writable=True) as fs:
        fs.write_bytes("/f", b"inside")
    shifted = tmp_path / "shifted.img"
    shifted.write_bytes(b"\0" * (1 << 20) + img.read_bytes())
    with ubtrfs.open(shifted, offset=1 << 20) as fs:
        assert fs.read_bytes("/f") == b"inside"
    with pytest.raises(OSError):
        ubtrfs.open(shifted)
    with pytest.raises(OSError) as e:
        ubtrfs.open(shifted, offset=1 << 20, partition=1)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(ValueError):
        ubtrfs.open(shifted, offset=-1)


def test_export_to_the_host(tmp_path):
    img = tmp_path / "x.img"
    ubtrfs.mkfs(img, 128 << 20)
    with ubtrfs.open(img, writable=True) as fs:
        fs.makedirs("/a/b")
        fs.write_bytes("/a/b/file", BLOB)
        fs.symlink("b/file", "/a/ln")
    with ubtrfs.open(img) as fs:
        fs.export("/a", tmp_path / "out")
        with pytest.raises(FileNotFoundError):
            fs.export("/missing", tmp_path / "out2")
    assert (tmp_path / "out" / "b" / "file").read_bytes() == BLOB
    assert os.readlink(tmp_path / "out" / "ln") == "b/file"


def test_subvolumes_snapshots_and_reflinks(tmp_path, btrfs_check):
    img = tmp_path / "s.img"
    ubtrfs.mkfs(img, 128 << 20)
    with ubtrfs.open(img, writable=True) as fs:
        fs.create_subvolume("/@")
        fs.write_bytes("/@/data", BLOB)
        fs.snapshot("/@", "/snap", readonly=True)
        assert fs.is_readonly("/snap") and not fs.is_readonly("/@")
        with pytest.raises(OSError) as e:
            fs.write_bytes("/snap/new", b"x")
        assert e.value.errno == errno.EROFS
        with pytest.raises(FileExistsError):
            fs.create_subvolume("/@")
        fs.reflink("/snap/data", "/@/copy")
        assert fs.read_bytes("/@/copy") == BLOB
        subs = fs.list_subvolumes()
        assert [(s.path, s.read_only) for s in subs] == [("@", False), ("snap", True)]
        assert subs[1].parent_uuid == subs[0].uuid and subs[0].parent_uuid is None
        assert fs.default_subvolume == 5
        fs.default_subvolume = subs[0].id
        with pytest.raises(PermissionError):
            fs.delete_subvolume("/@")
        fs.default_subvolume = 5
        fs.set_readonly("/snap", False)
        fs.delete_subvolume("/snap")
        assert [s.path for s in fs.list_subvolumes()] == ["@"]
        assert fs.read_bytes("/@/copy") == BLOB
    btrfs_check(img)


def test_verity(tmp_path, btrfs_check):
    img = tmp_path / "v.img"
    ubtrfs.mkfs(img, 128 << 20)
    with ubtrfs.open(img, writable=True) as fs:
        fs.write_bytes("/v", BLOB)
        with pytest.raises(OSError) as e:
            fs.measure_verity("/v")
        assert e.value.errno == errno.ENODATA
        fs.enable_verity("/v", hash_alg="sha512", salt=b"\x01\x02")
        digest = fs.measure_verity("/v")
        with pytest.raises(PermissionError):
            fs.write_bytes("/v", b"changed")
    host = tmp_path / "v"
    host.write_bytes(BLOB)
    fsverity = shutil.which("fsverity")
    if fsverity:
        out = subprocess.run([fsverity, "digest", str(host), "--hash-alg=sha512", "--salt=0102"],
                             check=True, capture_output=True, text=True).stdout
        assert digest == out.split()[0]
    else:
        assert digest.startswith("sha512:") and len(digest) == 7 + 128
    with ubtrfs.open(img) as fs:
        assert fs.read_bytes("/v") == BLOB
    btrfs_check(img)


def test_public_api_has_docstrings():
    assert ubtrfs.__doc__ and "OSError" in ubtrfs.__doc__
    for obj in (ubtrfs.open, ubtrfs.mkfs, ubtrfs.Filesystem, ubtrfs.File, ubtrfs.DirEntry):
        assert obj.__doc__, obj
    for name in dir(ubtrfs.Filesystem):
        if not name.startswith("_"):
            assert getattr(ubtrfs.Filesystem, name).__doc__, name
    assert ubtrfs.library_path()
