#!/usr/bin/env bash
# Time of planning and linting a checkpoint whose scheme groups list their
# modules by exact name, as `--observer auto` writes them for MoE models
# (docs/performance.md, "Lint"). Writes a sparse synthetic checkpoint of N
# expert weights (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight,
# BF16 [128, 128], 128 experts a layer, no config.json) and a
# QuantizationConfig of two groups naming them all (W4A16 on the first half
# of the layers, W4A16 with the MSE observer on the rest), then runs
# `ctquant quantize --dry-run --report` on it (headers, plan, lint and the
# printed plan, nothing written) and prints the time of opening, planning
# and linting from the run report, and the wall time of the command. It
# passes --allow-unloadable: without config.json lint finds error L19, which
# would stop the dry run before its report (older binaries, which --binary
# may name, have no L19 and no --allow L19).
#
# When build/tools/ctquant_bench_lint exists (and --binary is not given),
# it also prints make_plan's and run_lint's times measured in one process,
# with the CPU time of the thread, which other jobs on a shared machine do
# not inflate.
#
#   tools/bench-lint.sh [--modules N] [--binary PATH]
#
#   --modules N  weights, and exact names in the groups (default 100000)
#   --binary P   the ctquant to time (default build/ctquant)
set -euo pipefail
cd "$(dirname "$0")/.."

MODULES=100000
BINARY=${CTQUANT_BUILD_DIR:-build}/ctquant
BENCH=${CTQUANT_BUILD_DIR:-build}/tools/ctquant_bench_lint
while [ $# -gt 0 ]; do
  case "$1" in
    --modules) MODULES=$2; shift 2 ;;
    --binary) BINARY=$2; BENCH=; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | grep '^#' >&2; exit 2 ;;
  esac
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/in"

# The header: N weights of 128 x 128 BF16 (32 KiB each), in name order.
awk -v n="$MODULES" 'BEGIN {
  split("gate_proj up_proj down_proj", p, " "); proj[0] = p[1]; proj[1] = p[2]; proj[2] = p[3];
  printf "{";
  for (i = 0; i < n; i++) {
    e = int(i / 3);
    printf "%s\"model.layers.%d.mlp.experts.%d.%s.weight\":{\"dtype\":\"BF16\",\"shape\":[128,128],\"data_offsets\":[%.0f,%.0f]}",
           (i ? "," : ""), int(e / 128), e % 128, proj[i % 3], i * 32768, (i + 1) * 32768;
  }
  printf "}";
}' >"$tmp/header.json"
n=$(stat -c %s "$tmp/header.json")
pad=$(((8 - n % 8) % 8))
printf '%*s' "$pad" '' >>"$tmp/header.json"
n=$((n + pad))
prefix=
for i in 0 1 2 3 4 5 6 7; do prefix+=$(printf '\\x%02x' $(((n >> (8 * i)) & 255))); done
{ printf "$prefix"; cat "$tmp/header.json"; } >"$tmp/in/model.safetensors"
truncate -s $((8 + n + MODULES * 32768)) "$tmp/in/model.safetensors"  # sparse data

# Two groups of exact names: layers below the middle, and the rest.
awk -v n="$MODULES" 'BEGIN {
  split("gate_proj up_proj down_proj", p, " "); proj[0] = p[1]; proj[1] = p[2]; proj[2] = p[3];
  half = int(n / 768) * 384;
  printf "{\"config_groups\":{";
  for (g = 0; g < 2; g++) {
    printf "%s\"%s\":{\"targets\":[", (g ? "," : ""), (g ? "W4A16_memoryless_mse" : "W4A16");
    first = 1;
    for (i = (g ? half : 0); i < (g ? n : half); i++) {
      e = int(i / 3);
      printf "%s\"model.layers.%d.mlp.experts.%d.%s\"", (first ? "" : ","), int(e / 128), e % 128, proj[i % 3];
      first = 0;
    }
    printf "],\"weights\":{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"strategy\":\"group\",\"group_size\":128%s}}",
           (g ? ",\"observer\":\"memoryless_mse\"" : "");
  }
  printf "},\"ignore\":[]}";
}' >"$tmp/groups.json"

start=$(date +%s.%N)
status=0
"$BINARY" quantize "$tmp/in" "$tmp/out" --quantization-config "$tmp/groups.json" --dry-run -q \
  --allow-unloadable --report "$tmp/report.json" >/dev/null || status=$?
end=$(date +%s.%N)
# The run report's phase times (seconds.open, plan, lint); the wall time
# also covers printing the plan and hashing the (sparse) input for the report.
seconds() {
  sed -n '/"seconds": {/,/}/p' "$tmp/report.json" | grep -o "\"$1\": *[0-9.e+-]*" | sed 's/.*: *//'
}
if [ -s "$tmp/report.json" ]; then
  open=$(seconds open) plan=$(seconds plan) lint=$(seconds lint)
else
  open=nan plan=nan lint=nan
fi
awk -v n="$MODULES" -v s="$start" -v e="$end" -v b="$BINARY" -v x="$status" \
  -v o="$open" -v p="$plan" -v l="$lint" \
  'BEGIN { printf "%s: %d exact names in 2 groups: open %.3f s, plan %.3f s, lint %.3f s; quantize --dry-run %.2f s wall (exit %d)\n", b, n, o, p, l, e - s, x }'
if [ -n "$BENCH" ] && [ -x "$BENCH" ]; then
  "$BENCH" "$tmp/in" "$tmp/groups.json" --runs 3 | sed "s|^|$BENCH: |"
fi
