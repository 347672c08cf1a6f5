"""Build step of the ubtrfs Python package: copies libubtrfs.so.0 into it.

The library is the one built from this source tree. Found at, in this order:
$UBTRFS_LIBRARY (a path to libubtrfs.so.0), ../build/libubtrfs.so.0 (the
README's build directory), or pkg-config's libdir for ubtrfs (an installed
copy). When none exists the package is built without a copy and loads
libubtrfs.so.0 from the system's library path at import time.
"""
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def find_library():
    env = os.environ.get("UBTRFS_LIBRARY")
    if env:
        if not os.path.isfile(env):
            sys.exit(f"UBTRFS_LIBRARY={env}: no such file")
        return env
    cand = os.path.join(HERE, "..", "build", "libubtrfs.so.0")
    if os.path.isfile(cand):
        return cand
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "ubtrfs"], capture_output=True,
                                text=True, check=True).stdout.strip()
        cand = os.path.join(libdir, "libubtrfs.so.0")
        if os.path.isfile(cand):
            return cand
    except (OSError, subprocess.CalledProcessError):
        pass
    return None


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = find_library()
        if lib is None:
            print("ubtrfs: no libubtrfs.so.0 found (build it: cmake/ninja in ../build, or set "
                  "UBTRFS_LIBRARY); the module will load it from the system library path", file=sys.stderr)
            return
        dest = os.path.join(self.build_lib, "ubtrfs", "libubtrfs.so.0")
        print(f"ubtrfs: bundling {os.path.realpath(lib)}", file=sys.stderr)
        shutil.copyfile(os.path.realpath(lib), dest)


setup(cmdclass={"build_py": BuildWithLibrary})
