#!/usr/bin/env bash
# What a user of an installed ubtrfs gets (ctest: install_test):
#   install_test.sh BUILD_DIR WORK_DIR
# 1. `cmake --install BUILD_DIR --prefix WORK/prefix` into a fresh prefix;
# 2. the shared library: versioned SONAME, and `nm -D --defined-only` shows
#    only API symbols (ubtrfs_* C functions, ubtrfs:: C++ API);
# 3. a C and a C++ program built with only `pkg-config --cflags --libs ubtrfs`,
#    a C program against libubtrfs.a with `pkg-config --static`, and a CMake
#    project with find_package(ubtrfs): each opens an image (made by the
#    installed `ubtrfs mkfs` or ubtrfs_mkfs), writes, commits and reads back;
#    btrfs check agrees;
# 4. the man page renders with `man -l` and the bash completion completes.
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "$0")" && pwd)
# The compilers of the build (ctest passes them): a sanitized library needs its own runtime.
cc=${CC:-cc}
cxx=${CXX:-c++}
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

step "cmake --install into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in lib/libubtrfs.so lib/libubtrfs.so.0 lib/libubtrfs.a lib/pkgconfig/ubtrfs.pc bin/ubtrfs bin/mkfs.ubtrfs \
         lib/cmake/ubtrfs/ubtrfsConfig.cmake lib/cmake/ubtrfs/ubtrfsConfigVersion.cmake \
         include/ubtrfs/ubtrfs.h include/ubtrfs/filesystem.h include/ubtrfs/status.h \
         include/ubtrfs/export.h include/ubtrfs/stats.h include/ubtrfs/export_macros.h include/ubtrfs/import.h \
         include/ubtrfs/block_device.h \
         share/man/man1/ubtrfs.1 share/bash-completion/completions/ubtrfs \
         share/bash-completion/completions/mkfs.ubtrfs; do
  [ -e "$prefix/$f" ] || fail "$f was not installed"
done
# Every public header of the source tree, installed; each compiles on its own
# with the installed flags (ubtrfs.h as C too).
src_include=$(cd "$here/../../include/ubtrfs" && pwd)
for h in "$src_include"/*.h; do
  [ -e "$prefix/include/ubtrfs/$(basename "$h")" ] || fail "include/ubtrfs/$(basename "$h") was not installed"
done
lib=$(readlink -f "$prefix/lib/libubtrfs.so")
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libubtrfs.so.0 ] || fail "SONAME is '$soname', want libubtrfs.so.0"
[ "$(readlink "$prefix/lib/libubtrfs.so")" = libubtrfs.so.0 ] || fail "libubtrfs.so does not point at libubtrfs.so.0"
echo "SONAME $soname, $(basename "$lib")"

# The Ceph client libraries are loaded on the first rbd: path, never
# linked: they map ~20 MB into every program that loads them.
for f in "$lib" "$prefix/bin/ubtrfs"; do
  if readelf -d "$f" | grep -E 'NEEDED.*lib(rbd|rados)\.' >&2; then fail "$(basename "$f") links librbd/librados"; fi
done

# mkfs.ubtrfs is held to mkfs.btrfs's memory: it maps no C++ runtime, fmt,
# FUSE or line editor (all linked statically or not at all), except in a
# sanitizer build, where the runtime wants them shared (gcc links the
# runtime as a library, clang into the program).
sanitized() {
  # (grep reads to the end: with -q readelf could die of SIGPIPE, and pipefail)
  readelf -d "$1" | grep -E 'NEEDED.*lib(asan|tsan|ubsan)' >/dev/null ||
    readelf --dyn-syms "$1" | grep -E ' __(asan|tsan)_init$' >/dev/null
}
if ! sanitized "$prefix/bin/mkfs.ubtrfs"; then
  if readelf -d "$prefix/bin/mkfs.ubtrfs" | grep -E 'NEEDED.*lib(stdc\+\+|fmt|fuse3|edit|rbd|rados|archive)\.' >&2; then
    fail "mkfs.ubtrfs maps a library it should not"
  fi
fi
"$prefix/bin/mkfs.ubtrfs" -q --size 128M "$work/mkfs-program.img" || fail "mkfs.ubtrfs failed"
"$prefix/bin/ubtrfs" check "$work/mkfs-program.img" >/dev/null || fail "ubtrfs check of mkfs.ubtrfs's image failed"

step "nm -D --defined-only: only the API"
nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u >"$work/symbols.mangled"
c++filt <"$work/symbols.mangled" >"$work/symbols"
grep -vE '^(UBTRFS_0$|ubtrfs_[a-z_0-9]+$|ubtrfs::|typeinfo for ubtrfs::|typeinfo name for ubtrfs::|vtable for ubtrfs::)' \
  "$work/symbols" >"$work/symbols.bad" || true
if [ -s "$work/symbols.bad" ]; then
  head -20 "$work/symbols.bad" >&2
  fail "$(wc -l <"$work/symbols.bad") non-API symbol(s) exported"
fi
for want in ubtrfs_open ubtrfs_close ubtrfs_read ubtrfs_write ubtrfs_commit ubtrfs_last_error ubtrfs_export \
            'ubtrfs::Filesystem::Open(' 'ubtrfs::ExportTree(' 'ubtrfs::ImportTree(' 'typeinfo for ubtrfs::Filesystem' \
            'ubtrfs::OpenBlockDevice(' 'typeinfo for ubtrfs::BlockDevice' 'ubtrfs::SplitDeviceList(' \
            'ubtrfs::CheckImage(' 'ubtrfs::ScrubImage(' 'ubtrfs::DumpTree(' 'ubtrfs::TreeShapes(' \
            'ubtrfs::ReadMemberInfo('; do
  grep -qF "$want" "$work/symbols" || fail "$want is not exported"
done
echo "$(grep -c '^ubtrfs_' "$work/symbols") C functions, $(grep -c 'ubtrfs::' "$work/symbols") C++ symbols, nothing else"

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cflags=$(pkg-config --cflags ubtrfs)
libs=$(pkg-config --libs ubtrfs)
echo "pkg-config --cflags --libs ubtrfs: $cflags $libs"
check() {
  if command -v btrfs >/dev/null; then
    btrfs check --readonly "$1" >"$1.check.log" 2>&1 || fail "btrfs check $1: $(tail -3 "$1.check.log")"
  fi
}

step "each installed header compiles alone"
for h in "$prefix"/include/ubtrfs/*.h; do
  # shellcheck disable=SC2086
  echo "#include <ubtrfs/$(basename "$h")>" | "$cxx" -std=c++20 -Wall -Wextra -Werror $cflags -x c++ -fsyntax-only - ||
    fail "$(basename "$h") does not compile alone"
done
# shellcheck disable=SC2086
echo "#include <ubtrfs/ubtrfs.h>" | "$cc" -std=c99 -Wall -Wextra -Werror -pedantic-errors $cflags -x c -fsyntax-only - ||
  fail "ubtrfs.h does not compile as C99"
echo "$(ls "$prefix"/include/ubtrfs/*.h | wc -l) headers"

step "C program with pkg-config (image from ubtrfs_mkfs)"
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic-errors "$here/consumer.c" $cflags $libs -o "$work/consumer_c"
"$work/consumer_c" "$work/c.img" --mkfs
check "$work/c.img"

step "C++ program with pkg-config (image from the installed ubtrfs mkfs)"
"$prefix/bin/ubtrfs" mkfs -q --size 128M "$work/cxx.img"
# shellcheck disable=SC2086
"$cxx" -std=c++20 -Wall -Wextra -Werror "$here/consumer.cc" $cflags $libs -o "$work/consumer_cxx"
"$work/consumer_cxx" "$work/cxx.img"
check "$work/cxx.img"

step "C program against libubtrfs.a (pkg-config --static)"
static_libs=$(pkg-config --static --libs ubtrfs | sed 's/-lubtrfs\b//')
# shellcheck disable=SC2086
"$cc" -std=c99 "$here/consumer.c" $cflags "$prefix/lib/libubtrfs.a" $static_libs -o "$work/consumer_static"
if readelf -d "$work/consumer_static" | grep -q 'libubtrfs'; then fail "consumer_static needs libubtrfs.so"; fi
"$work/consumer_static" "$work/static.img" --mkfs
check "$work/static.img"

step "CMake project with find_package(ubtrfs)"
cmake -S "$here/cmake_project" -B "$work/cmake_project" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Release >"$work/cmake_project.log" 2>&1 || { cat "$work/cmake_project.log"; fail "configure"; }
ninja -C "$work/cmake_project" >>"$work/cmake_project.log" 2>&1 || { cat "$work/cmake_project.log"; fail "build"; }
# (an image mkfs.btrfs made, where btrfs-progs is installed)
if command -v mkfs.btrfs >/dev/null; then
  truncate -s 128M "$work/cmake.img"
  mkfs.btrfs -q -f "$work/cmake.img" >"$work/mkfs.btrfs.log" 2>&1 || { cat "$work/mkfs.btrfs.log"; fail "mkfs.btrfs"; }
else
  "$prefix/bin/ubtrfs" mkfs -q --size 128M "$work/cmake.img"
fi
"$work/cmake_project/consumer_c" "$work/cmake.img"
"$work/cmake_project/consumer_cxx" "$work/cmake.img"
check "$work/cmake.img"
out=$("$prefix/bin/ubtrfs" ls "$work/cmake.img" /)
[ "$(echo "$out" | sort | tr '\n' ' ')" = "from-c from-cxx " ] || fail "ubtrfs ls of cmake.img: $out"

step "man page and bash completion"
man_out=$(MANWIDTH=100 man -l "$prefix/share/man/man1/ubtrfs.1" 2>"$work/man.err" | col -bx)
[ -s "$work/man.err" ] && { cat "$work/man.err" >&2; fail "man -l printed warnings"; }
for w in mkfs check mount dump-tree "--rootdir" "--check-data-csum"; do
  grep -qF -- "$w" <<<"$man_out" || fail "the man page does not mention $w"
done
groff_warn=$(groff -man -Tutf8 -ww -z "$prefix/share/man/man1/ubtrfs.1" 2>&1 || true)
[ -z "$groff_warn" ] || fail "groff -ww: $groff_warn"
complete_words() {  # complete_words WORD... : what completing the last word offers
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
           _ubtrfs; printf "%s\n" "${COMPREPLY[@]}"' _ "$prefix/share/bash-completion/completions/ubtrfs" "$@"
}
got=$(complete_words ubtrfs m | sort | tr '\n' ' ')
[ "$got" = "mkdir mkfs mount mv " ] || fail "completing 'ubtrfs m' gave '$got'"
got=$(complete_words ubtrfs mkfs --no | tr '\n' ' ')
[ "$got" = "--nodesize --nodiscard " ] || fail "completing 'ubtrfs mkfs --no' gave '$got'"
got=$(bash -c 'source "$1"; COMP_WORDS=(mkfs.ubtrfs --no); COMP_CWORD=1; _mkfs_ubtrfs; printf "%s\n" "${COMPREPLY[@]}"' \
      _ "$prefix/share/bash-completion/completions/mkfs.ubtrfs" | tr '\n' ' ')
[ "$got" = "--nodesize --nodiscard " ] || fail "completing 'mkfs.ubtrfs --no' gave '$got'"
got=$(bash -c 'source "$1"; COMP_WORDS=(mkfs.ubtrfs --csum b); COMP_CWORD=2; _mkfs_ubtrfs; printf "%s\n" "${COMPREPLY[@]}"' \
      _ "$prefix/share/bash-completion/completions/mkfs.ubtrfs" | tr '\n' ' ')
[ "$got" = "blake2 " ] || fail "completing 'mkfs.ubtrfs --csum b' gave '$got'"
echo "install_test: all passed"
