#!/usr/bin/env bash
# `pip install .` of the ubtrfs module into a fresh venv, then its pytest suite
# against the installed copy (ctest: python_pip_install_test):
#   pip_install_test.sh PYTHON LIBRARY WORK_DIR
# PYTHON must have pytest (the venv sees the system's site-packages for it);
# LIBRARY is the libubtrfs.so.0 to bundle. Plain `pip install .` with build
# isolation, as a user types it, from python/ and from the top of the source
# tree; --no-index makes any download an error (the in-tree build backend
# needs none). $UBTRFS_TEST_PRELOAD, when set, is preloaded for the test run
# (the sanitizer runtime in an ASan build).
set -euo pipefail
python=$1 lib=$2 work=$3
src=$(cd "$(dirname "$0")/.." && pwd)
top=$(cd "$src/.." && pwd)
rm -rf "$work"
mkdir -p "$work/top"
# Build from copies (pip builds in place), laid out as the source tree is.
cp -r "$src" "$work/top/python"
cp "$top/pyproject.toml" "$work/top/"
rm -rf "$work/top/python/build" "$work/top/python"/*.egg-info
"$python" -m venv --system-site-packages "$work/venv"
pip_install() {  # pip_install DIR
  (cd "$1" && UBTRFS_LIBRARY=$lib "$work/venv/bin/python" -m pip install -q --no-index --disable-pip-version-check \
     --force-reinstall .) >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; exit 1; }
}
check_installed() {
  (cd "$work" && unset UBTRFS_LIBRARY PYTHONPATH && LD_PRELOAD=${UBTRFS_TEST_PRELOAD:-} "$work/venv/bin/python" - "$work/venv" <<'PY'
import sys, ubtrfs
venv = sys.argv[1]
assert ubtrfs.__file__.startswith(venv), ubtrfs.__file__
assert ubtrfs.library_path().startswith(venv), ubtrfs.library_path()
print("installed:", ubtrfs.__file__, "library:", ubtrfs.library_path())
PY
  )
}
pip_install "$work/top"
check_installed
pip_install "$work/top/python"
check_installed
cd "$work"
unset UBTRFS_LIBRARY PYTHONPATH
LD_PRELOAD=${UBTRFS_TEST_PRELOAD:-} "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$work/top/python/tests"
