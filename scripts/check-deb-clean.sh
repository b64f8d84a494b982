#!/usr/bin/env bash
# scripts/check-deb-clean.sh DEB_DIR [ROOT]: the packages `make deb` built, installed on a clean
# machine (docs/install.md "Debian packages"). A minimal Debian of the host's release
# (debootstrap --variant=minbase into ROOT, default a new folder under /var/tmp), the host's apt
# sources, then, chrooted there:
#   1. `apt-get install ./*.deb` of DEB_DIR's three packages: apt resolves their dependencies;
#   2. the installed `exitscope --help` and `exitscope inspect` of a recorder dump;
#   3. with gcc, g++, cmake and pkg-config added (only those): the C consumer
#      (tests/install/consumer_c) built with `pkg-config --cflags --libs exitscope` and the C++
#      one (tests/install/consumer_cxx) with find_package(exitscope), against /usr alone; each
#      records a dump that the installed tool reads.
# Needs root, debootstrap and the Debian mirror, and takes minutes: not part of `make test`.
# ROOT is removed at the end unless KEEP_ROOT=1.
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: scripts/check-deb-clean.sh DEB_DIR [ROOT]" >&2; exit 2; }
debs=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
[[ $(id -u) == 0 ]] || { echo "check-deb-clean: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "check-deb-clean: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
shopt -s nullglob
pkgs=("$debs"/*.deb)
[[ ${#pkgs[@]} -eq 3 ]] || { echo "check-deb-clean: want the 3 packages of make deb in $debs, found ${#pkgs[@]}" >&2; exit 1; }
# shellcheck disable=SC1091
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
root=${2:-$(mktemp -d /var/tmp/exitscope-clean.XXXXXX)}
cleanup() {
  umount "$root/proc" 2>/dev/null || true
  [[ ${KEEP_ROOT:-0} == 1 ]] || rm -rf "$root"
}
trap cleanup EXIT
t0=$SECONDS
echo "check-deb-clean: debootstrap $suite into $root"
debootstrap --variant=minbase "$suite" "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
  { tail -20 "$root.debootstrap.log"; exit 1; }
rm -f "$root.debootstrap.log"
# The host's apt sources (its mirror and security suites), in place of debootstrap's one line.
rm -f "$root/etc/apt/sources.list"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [[ -f $f ]] || continue
  case $f in /etc/apt/sources.list) dest=$root/etc/apt/sources.list ;; *) dest=$root/etc/apt/sources.list.d/$(basename "$f") ;; esac
  cp "$f" "$dest"
done
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
mkdir -p "$root/tmp/debs" "$root/tmp/consumers"
cp "${pkgs[@]}" "$root/tmp/debs/"
cp -r "$src/tests/install/consumer_c" "$src/tests/install/consumer_cxx" "$root/tmp/consumers/"
cp "$src/testdata/dumps/c-example.esdump" "$root/tmp/"
echo "check-deb-clean: clean root ready after $((SECONDS - t0)) s"

cat >"$root/tmp/check.sh" <<'EOF'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cd /tmp
apt-get update -qq
echo "== apt-get install ./debs/*.deb"
apt-get install -y -qq --no-install-recommends ./debs/*.deb >apt.log 2>&1 || { tail -30 apt.log; exit 1; }
dpkg-query -W -f='${Package} ${Version}\n' libexitscope0 libexitscope-dev exitscope
echo "== files"
dpkg -L libexitscope0 libexitscope-dev exitscope | grep -vE '/$|^/\.$' | grep -E 'lib|bin|include/exitscope/exitscope.h|pkgconfig|cmake/exitscope/exitscopeConfig.cmake'
echo "== exitscope --help (from $(command -v exitscope))"
exitscope --help | head -3
exitscope inspect c-example.esdump >inspect.log
grep -q uart0 inspect.log || { cat inspect.log; echo "no uart0 in the report"; exit 1; }
head -1 inspect.log
echo "== consumers, with only gcc g++ cmake pkg-config added"
apt-get install -y -qq --no-install-recommends gcc g++ cmake make pkg-config >>apt.log 2>&1 || { tail -30 apt.log; exit 1; }
readelf -d /usr/lib/libexitscope.so | grep SONAME
# shellcheck disable=SC2046
gcc -std=c11 -Wall -Wextra -Werror -pedantic $(pkg-config --cflags exitscope) consumers/consumer_c/vmm.c \
  -o vmm_c $(pkg-config --libs exitscope)
ldd vmm_c | grep libexitscope
./vmm_c c.esdump
exitscope inspect c.esdump | grep -q uart0 || { echo "vmm_c's dump: no uart0"; exit 1; }
cmake -S consumers/consumer_cxx -B cxx -DCMAKE_BUILD_TYPE=Release >cxx.log 2>&1 || { cat cxx.log; exit 1; }
grep -i "exitscope" cxx.log | head -3
cmake --build cxx >>cxx.log 2>&1 || { cat cxx.log; exit 1; }
./cxx/vmm_cxx cxx.esdump
exitscope inspect cxx.esdump | grep -q uart0 || { echo "vmm_cxx's dump: no uart0"; exit 1; }
echo "consumers: vmm_c (pkg-config) and vmm_cxx (find_package) built against /usr, each dump read by the installed exitscope"
EOF
chroot "$root" /bin/bash /tmp/check.sh
echo "check-deb-clean: passed in $((SECONDS - t0)) s"
