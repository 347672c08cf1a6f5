"""The ubtrfs package's own PEP 517 build backend (pyproject.toml names it).

It needs nothing but the standard library, so `pip install .` works in a fresh
venv with no network: pip has no build requirement to download (setuptools
would be one). It builds a wheel of the `ubtrfs` module plus a copy of
libubtrfs.so.0, found, in this order, at $UBTRFS_LIBRARY (a path to
libubtrfs.so.0), ../build/libubtrfs.so.0 (the README's build directory), or
pkg-config's libdir for ubtrfs (an installed copy). With none, the wheel has no
copy and the module loads libubtrfs.so.0 from the system's library path.
"""
import base64
import hashlib
import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "ubtrfs"


def _version():
    with open(os.path.join(HERE, NAME, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("ubtrfs/__init__.py has no __version__")
    return m.group(1)


def _metadata():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {_version()}\n"
        "Summary: Read and write btrfs images from Python, without root or the kernel (libubtrfs)\n"
        "License: GPL-2.0-or-later\n"
        "Requires-Python: >=3.9\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Operating System :: POSIX :: Linux\n"
        "Classifier: Topic :: System :: Filesystems\n"
        "Description-Content-Type: text/markdown\n"
        "\n" + readme
    )


def find_library():
    env = os.environ.get("UBTRFS_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"UBTRFS_LIBRARY={env}: no such file")
        return env
    cand = os.path.join(HERE, "..", "build", "libubtrfs.so.0")
    if os.path.isfile(cand):
        return cand
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "ubtrfs"], capture_output=True, text=True,
                                check=True).stdout.strip()
        cand = os.path.join(libdir, "libubtrfs.so.0")
        if os.path.isfile(cand):
            return cand
    except (OSError, subprocess.CalledProcessError):
        pass
    return None


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}\n"


def _dist_info():
    return f"{NAME}-{_version()}.dist-info"


def _wheel_text(tag, purelib):
    return ("Wheel-Version: 1.0\nGenerator: ubtrfs _ubtrfs_build\n"
            f"Root-Is-Purelib: {'true' if purelib else 'false'}\nTag: {tag}\n")


# ---- PEP 517 hooks

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    lib = find_library()
    files = []  # (path in the wheel, bytes)
    with open(os.path.join(HERE, NAME, "__init__.py"), "rb") as f:
        files.append((f"{NAME}/__init__.py", f.read()))
    if lib is not None:
        print(f"ubtrfs: bundling {os.path.realpath(lib)}", file=sys.stderr)
        with open(os.path.realpath(lib), "rb") as f:
            files.append((f"{NAME}/libubtrfs.so.0", f.read()))
        tag = "py3-none-" + re.sub(r"[-.]", "_", sysconfig.get_platform())
    else:
        print("ubtrfs: no libubtrfs.so.0 found (build it: cmake/ninja in ../build, or set UBTRFS_LIBRARY); "
              "the module will load it from the system library path", file=sys.stderr)
        tag = "py3-none-any"
    info = _dist_info()
    files.append((f"{info}/METADATA", _metadata().encode()))
    files.append((f"{info}/WHEEL", _wheel_text(tag, lib is None).encode()))
    files.append((f"{info}/top_level.txt", f"{NAME}\n".encode()))
    record = "".join(_record_line(p, d) for p, d in files) + f"{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode()))
    name = f"{NAME}-{_version()}-{tag}.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if path.endswith(".so.0") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return name


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{_version()}"
    name = base + ".tar.gz"
    members = ["pyproject.toml", "_ubtrfs_build.py", "README.md", f"{NAME}/__init__.py"]
    tests = os.path.join(HERE, "tests")
    members += [os.path.join("tests", t) for t in sorted(os.listdir(tests)) if not t.startswith((".", "__"))]
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for m in members:
            t.add(os.path.join(HERE, m), arcname=f"{base}/{m}", recursive=False)
        pkg_info = _metadata().encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(pkg_info)
        ti.mode = 0o644
        t.addfile(ti, io.BytesIO(pkg_info))
    return name
