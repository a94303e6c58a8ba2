#!/usr/bin/env bash
# Peak memory of ctquant on the two kinds of header that cost the most per
# byte (docs/security.md, "Resources"): one with very many small entries,
# and one tensor whose shape has very many dimensions. Writes both files
# into a temporary directory, runs `ctquant inspect` and `ctquant quantize
# --dry-run` on each under /usr/bin/time (Debian package `time`) and prints
# the header's size, each command's peak RSS and their ratio.
#
#   tools/header-memory.sh [--entries N] [--dims N] [--binary PATH]
#
#   --entries N  entries of the first header (default 1300000: about 91 MB)
#   --dims N     dimensions of the one shape of the second (default 40000000:
#                about 80 MB)
#   --binary P   the ctquant to measure (default build/ctquant)
set -euo pipefail
cd "$(dirname "$0")/.."

ENTRIES=1300000
DIMS=40000000
BINARY=${CTQUANT_BUILD_DIR:-build}/ctquant
while [ $# -gt 0 ]; do
  case "$1" in
    --entries) ENTRIES=$2; shift 2 ;;
    --dims) DIMS=$2; shift 2 ;;
    --binary) BINARY=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | grep '^#' >&2; exit 2 ;;
  esac
done
[ -x /usr/bin/time ] || { echo "header-memory: needs /usr/bin/time (apt-get install time)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Writes FILE from a header (padded with spaces to a multiple of 8 bytes)
# and DATA zero bytes of tensor data.
write_file() {
  local file=$1 header=$2 data=$3
  local n pad i prefix=
  n=$(stat -c %s "$header")
  pad=$(((8 - n % 8) % 8))
  printf '%*s' "$pad" '' >>"$header"
  n=$((n + pad))
  for i in 0 1 2 3 4 5 6 7; do prefix+=$(printf '\\x%02x' $(((n >> (8 * i)) & 255))); done
  { printf "$prefix"; cat "$header"; head -c "$data" /dev/zero; } >"$file"
}

# N entries "t.0000000": U8 [1], one byte each.
awk -v n="$ENTRIES" 'BEGIN {
  printf "{";
  for (i = 0; i < n; i++)
    printf "%s\"t.%07d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%d,%d]}", (i ? "," : ""), i, i, i + 1;
  printf "}";
}' >"$tmp/entries.json"
write_file "$tmp/entries.safetensors" "$tmp/entries.json" "$ENTRIES"

# One U8 tensor of shape [1, 1, ..., 1]: one byte of data.
awk -v n="$DIMS" 'BEGIN {
  printf "{\"w\":{\"dtype\":\"U8\",\"shape\":[1";
  for (i = 1; i < n; i++) printf ",1";
  printf "],\"data_offsets\":[0,1]}}";
}' >"$tmp/shape.json"
write_file "$tmp/shape.safetensors" "$tmp/shape.json" 1

rss_mib() { awk -F': ' '/Maximum resident set size/ { printf "%d", $2 / 1024 }' "$1"; }

printf '%-40s %10s %10s %8s\n' "input / command" "header" "peak RSS" "ratio"
for kind in entries shape; do
  file="$tmp/$kind.safetensors"
  header_bytes=$(($(stat -c %s "$tmp/$kind.json")))
  header_mib=$((header_bytes / 1048576))
  for command in inspect dry-run; do
    if [ "$command" = inspect ]; then
      /usr/bin/time -v "$BINARY" inspect "$file" >/dev/null 2>"$tmp/time" || true
    else
      rm -rf "$tmp/out"
      /usr/bin/time -v "$BINARY" quantize "$file" "$tmp/out" --dry-run --allow-unloadable -q \
        >/dev/null 2>"$tmp/time" || true
    fi
    rss=$(rss_mib "$tmp/time")
    printf '%-40s %6d MiB %6d MiB %7.1fx\n' "$kind ($command)" "$header_mib" "$rss" \
      "$(awk -v a="$rss" -v b="$header_bytes" 'BEGIN { printf "%.1f", a * 1048576 / b }')"
  done
done
