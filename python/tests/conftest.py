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
