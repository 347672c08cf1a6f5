#!/usr/bin/env bash
# Installs the Debian packages ubtrfs needs to build, test and benchmark,
# skipping those already present. Safe to run repeatedly.
set -euo pipefail

PKGS=(build-essential cmake ninja-build pkg-config ccache clang lld libclang-rt-dev python3
      libisal-dev libxxhash-dev libsodium-dev zlib1g-dev liblzo2-dev libzstd-dev uuid-dev
      libcli11-dev libfmt-dev libgtest-dev nlohmann-json3-dev libfuse3-dev fuse3 libedit-dev libblkid-dev libarchive-dev fdisk
      btrfs-progs e2fsprogs util-linux attr xfsprogs hyperfine fsmark dbench fio gnuplot-nox time tree
      git rsync tar zstd make gcc man-db groff-base bash-completion
      python3-pytest python3-setuptools python3-venv python3-pip
      ceph-mon ceph-osd ceph-common librbd-dev librados-dev uuid-runtime
      fsverity  # fsverity-utils: the independent Merkle trees tests/verity_test.cc compares with
      llvm  # llvm-symbolizer: file:line in the reports of the clang-built ASan tree (./test)
      gdb)  # backtraces of a test that hangs (tests/support/deadline.cc)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
