#!/usr/bin/env bash
# `pip install` of the ubtrfs module into a fresh venv, then its pytest suite
# against the installed copy (ctest: python_pip_install_test):
#   pip_install_test.sh PYTHON LIBRARY WORK_DIR
# PYTHON must have pytest (the venv sees the system's site-packages for it);
# LIBRARY is the libubtrfs.so.0 to bundle. No network: --no-index and
# --no-build-isolation (setuptools from the system). $UBTRFS_TEST_PRELOAD, when
# set, is preloaded for the test run (the sanitizer runtime in an ASan build).
set -euo pipefail
python=$1 lib=$2 work=$3
src=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$work"
mkdir -p "$work"
# Build from a copy: setuptools writes build/ and *.egg-info next to setup.py.
cp -r "$src" "$work/src"
rm -rf "$work/src/build" "$work/src"/*.egg-info
"$python" -m venv --system-site-packages "$work/venv"
UBTRFS_LIBRARY=$lib "$work/venv/bin/python" -m pip install -q --no-index --no-build-isolation \
  --disable-pip-version-check "$work/src" >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; exit 1; }
cd "$work"
unset UBTRFS_LIBRARY PYTHONPATH
LD_PRELOAD=${UBTRFS_TEST_PRELOAD:-} "$work/venv/bin/python" - "$work/venv" <<'PY'
import sys, ubtrfs
venv = sys.argv[1]
assert ubtrfs.__file__.startswith(venv), ubtrfs.__file__
assert ubtrfs.library_path().startswith(venv), ubtrfs.library_path()
print("installed:", ubtrfs.__file__, "library:", ubtrfs.library_path())
PY
LD_PRELOAD=${UBTRFS_TEST_PRELOAD:-} "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$work/src/tests"
