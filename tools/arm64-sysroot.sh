#!/usr/bin/env bash
# Makes an arm64 sysroot for the AArch64 cross build (tools/dev.sh
# cross-arm64, cmake/aarch64-linux-gnu.cmake): the Debian 12 arm64 packages
# PACKAGE... and everything they depend on, unpacked into DIR. The host's
# packages are left alone: apt runs with a state and cache of its own
# (APT::Architecture=arm64, an empty dpkg status), only downloads, and
# dpkg-deb -x unpacks each .deb into DIR, so no package script runs, nothing
# is installed on the host and no root is needed.
#
#   tools/arm64-sysroot.sh DIR PACKAGE...
#
# DIR is remade only when the package list changed or the package lists are
# older than 7 days. Environment: CTQUANT_ARM64_APT_CACHE (apt's lists and
# the downloaded .deb files, shared by every checkout; default
# ${XDG_CACHE_HOME:-$HOME/.cache}/ctquant/arm64-apt), CTQUANT_DEBIAN_MIRROR
# and CTQUANT_DEBIAN_SECURITY_MIRROR (as tools/check-deb.sh).
set -euo pipefail

die() { echo "arm64-sysroot: $*" >&2; exit 1; }
[ $# -ge 2 ] || die "usage: tools/arm64-sysroot.sh DIR PACKAGE..."
root=$1; shift
packages=("$@")
cache=${CTQUANT_ARM64_APT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctquant/arm64-apt}
mirror=${CTQUANT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${CTQUANT_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || die "$keyring is missing (Debian's debian-archive-keyring)"

stamp=$root/.ctquant-sysroot
want="packages: ${packages[*]}"
if [ -f "$stamp" ] && [ "$(head -1 "$stamp")" = "$want" ] &&
   [ -n "$(find "$stamp" -mtime -7)" ]; then
  exit 0
fi

mkdir -p "$cache/lists/partial" "$cache/archives/partial" "$cache/etc"
: >"$cache/status"
cat >"$cache/etc/sources.list" <<EOF
deb [arch=arm64 signed-by=$keyring] $mirror bookworm main
deb [arch=arm64 signed-by=$keyring] $mirror bookworm-updates main
deb [arch=arm64 signed-by=$keyring] $security_mirror bookworm-security main
EOF
apt_arm64() {
  apt-get -q -o APT::Architecture=arm64 -o APT::Architectures::=arm64 \
    -o Dir::State::lists="$cache/lists" -o Dir::State::status="$cache/status" \
    -o Dir::Cache="$cache" -o Dir::Cache::archives="$cache/archives" \
    -o Dir::Etc::SourceList="$cache/etc/sources.list" -o Dir::Etc::SourceParts="$cache/etc" \
    -o Dir::Etc::Preferences="$cache/etc/preferences" -o Dir::Etc::PreferencesParts="$cache/etc" \
    -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)" "$@"
}
echo "arm64-sysroot: downloading ${packages[*]} and their dependencies (arm64)" >&2
apt_arm64 update >/dev/null
apt_arm64 install -y --download-only --no-install-recommends "${packages[@]}" >/dev/null
# The .deb files of this resolution: "Inst NAME (VERSION ORIGIN [ARCH])".
mapfile -t debs < <(apt_arm64 -s install --no-install-recommends "${packages[@]}" |
  sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) [^[]*\[\([a-z0-9]*\)\]).*/\1_\2_\3.deb/p' | sed 's/:/%3a/g')
[ ${#debs[@]} -gt 0 ] || die "apt resolved no package"

rm -rf "$root"
mkdir -p "$root"
for deb in "${debs[@]}"; do
  [ -f "$cache/archives/$deb" ] || die "$deb was not downloaded"
  dpkg-deb -x "$cache/archives/$deb" "$root"
done
# Absolute symbolic links (libc's libm.so -> /lib/aarch64-linux-gnu/libm.so.6)
# point into the sysroot instead of the host.
while IFS= read -r -d '' link; do
  target=$(readlink "$link")
  ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$root$target")" "$link"
done < <(find "$root" -type l -lname '/*' -print0)
{ echo "$want"; printf '%s\n' "${debs[@]}"; } >"$stamp"
echo "arm64-sysroot: ${#debs[@]} packages unpacked in $root" >&2
