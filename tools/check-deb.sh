#!/usr/bin/env bash
# Builds the ctquant .deb with CPack and proves that it installs and runs on a
# fresh Debian 12 (bookworm) root: mmdebstrap makes a minbase system and apt
# installs the package into it with the dependencies dpkg-shlibdeps declared
# (and nothing else); then `ctquant --version` must print the project
# version and a sample checkpoint must quantize and verify.
#
#   bash tools/check-deb.sh            (as root; .ci/run calls it)
#
# Environment: CTQUANT_DEB_BUILD_DIR (default build-deb: a Release build
# without tests; a build directory that exists already is reused as it is
# configured, as .ci/run does with the build/ of tools/dev.sh test),
# CTQUANT_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# CTQUANT_DEBIAN_SECURITY_MIRROR (default http://deb.debian.org/debian-security).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${CTQUANT_DEB_BUILD_DIR:-build-deb}
MIRROR=${CTQUANT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${CTQUANT_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

die() { echo "check-deb: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root (mmdebstrap, chroot)"
since() { echo $(($(date +%s) - $1)); }

missing=()
for p in mmdebstrap dpkg-dev help2man build-essential cmake ninja-build; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "check-deb: installing ${missing[*]}" >&2
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# 1. The package: a Release build of the tool (the same flags as tools/dev.sh,
# so ccache reuses its objects), then CPack.
start=$(date +%s)
bash tools/dev.sh deps
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCTQUANT_WERROR=ON \
    -DCTQUANT_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
rm -rf "$BUILD_DIR/package"
(cd "$BUILD_DIR" && cpack -G DEB -B package >/dev/null)
deb=$(realpath "$(ls "$BUILD_DIR"/package/ctquant_*.deb)")
[ -f "$deb" ] || die "CPack made no .deb in $BUILD_DIR/package"
echo "check-deb: $deb (built in $(since "$start") s)"
dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Architecture\|Depends\):/  \1:/p'
version=$(sed -n 's/^project(ctquant VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
if dpkg-deb --field "$deb" Depends | grep -q -- '-dev\b'; then
  die "the package depends on a -dev package: $(dpkg-deb --field "$deb" Depends)"
fi

# 2. A fresh Debian 12 root with the package installed by apt.
start=$(date +%s)
root=$(mktemp -d /tmp/ctquant-deb-root.XXXXXX)
cleanup() {
  # Only what this script mounted, inside its own root.
  for m in "$root/proc"; do mountpoint -q "$m" && umount -l "$m"; done
  rm -rf "$root"
}
trap cleanup EXIT
echo "check-deb: mmdebstrap --variant=minbase bookworm, with $(basename "$deb")" >&2
# The hook makes the .deb visible to dpkg inside the root at the same path.
mmdebstrap --quiet --variant=minbase --include="$deb" \
  --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount bookworm "$root" \
  "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
  "deb $SECURITY_MIRROR bookworm-security main" >"$root.log" 2>&1 \
  || { tail -30 "$root.log" >&2; rm -f "$root.log"; die "mmdebstrap failed"; }
rm -f "$root.log"
chmod 755 "$root"
echo "check-deb: root made and package installed in $(since "$start") s" >&2
cp -r tests/golden/llama-bf16/input "$root/tmp/sample"

# 3. Run it inside the root, in a private mount namespace.
mkdir -p "$root/proc"
unshare --mount --propagation private -- bash -euc '
  root=$1 version=$2
  mount -t proc proc "$root/proc"
  in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
                LANG=C.UTF-8 "$@"; }
  got=$(in_root ctquant --version)
  echo "check-deb: in a fresh Debian 12 root: $(in_root sh -c "command -v ctquant"): $got"
  [ "$got" = "ctquant $version" ] || { echo "check-deb: expected ctquant $version" >&2; exit 1; }
  in_root ctquant quantize /tmp/sample /tmp/out --progress none -q
  in_root ctquant verify /tmp/out --manifest >/dev/null
  if [ -e "$root/usr/share/man/man1/ctquant.1.gz" ]; then
    echo "check-deb: man page /usr/share/man/man1/ctquant.1.gz installed"
  fi
' check-deb "$root" "$version"
echo "check-deb: ok"
