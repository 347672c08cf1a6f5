import os
import shutil
import subprocess

import pytest


def _need(tool):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} (btrfs-progs) is not installed")


@pytest.fixture
def progs_image(tmp_path):
    """An empty image made by mkfs.btrfs (btrfs-progs)."""
    _need("mkfs.btrfs")
    img = tmp_path / "progs.img"
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    subprocess.run(["mkfs.btrfs", "-q", "-f", str(img)], check=True, capture_output=True)
    return img


@pytest.fixture
def btrfs_check():
    """btrfs check --readonly IMAGE must be clean."""
    _need("btrfs")

    def check(img):
        r = subprocess.run(["btrfs", "check", "--readonly", str(img)], capture_output=True, text=True)
        assert r.returncode == 0, f"btrfs check {img}:\n{r.stdout}\n{r.stderr}"
        assert "no error found" in r.stdout + r.stderr

    return check


@pytest.fixture
def btrfs_restore(tmp_path):
    """Extract an image with btrfs-progs' own reader (btrfs restore): the host tree's path."""
    _need("btrfs")

    def restore(img):
        out = tmp_path / ("restored-" + os.path.basename(str(img)))
        out.mkdir()
        r = subprocess.run(["btrfs", "restore", "-S", "-x", str(img), str(out)], capture_output=True, text=True)
        assert r.returncode == 0, f"btrfs restore {img}:\n{r.stdout}\n{r.stderr}"
        return out

    return restore


@pytest.fixture
def kernel_mount(tmp_path):
    """The kernel's view of an image: kernel_mount(IMAGE) loop-mounts it read-only
    and returns the mount point (unmounted at the end of the test). Skips, with
    the reason, where loop mounts are missing (not root, no btrfs module, a
    container without loop devices): the test's btrfs check still ran."""
    mounted = []

    def mount(img):
        if os.geteuid() != 0:
            pytest.skip("the kernel's view needs root for a loop mount (btrfs check agreed)")
        mnt = tmp_path / ("mnt-" + os.path.basename(str(img)))
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "btrfs", "-o", "loop,ro", str(img), str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"no loop mount here ({r.stderr.strip()}); btrfs check agreed")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], check=True)
