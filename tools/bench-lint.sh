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
# --layout dense writes a dense Llama-like checkpoint instead
# (model.layers.L.{self_attn.{q,k,v,o}_proj,mlp.{gate,up,down}_proj}.weight,
# seven a layer, with a LlamaForCausalLM config.json, so that the role
# analysis fuses q/k/v and gate/up as vLLM does) and one group naming every
# module. --unmatched K adds K exact targets names and K ignore entries that
# match no module (each a finding of lint L1, whose fix is checked).
#
#   tools/bench-lint.sh [--modules N] [--layout moe|dense] [--unmatched K] [--binary PATH]
#
#   --modules N    weights, and exact names in the groups (default 100000)
#   --layout L     moe (default) or dense
#   --unmatched K  targets and ignore entries that match nothing (default 0)
#   --binary P     the ctquant to time (default build/ctquant)
set -euo pipefail
cd "$(dirname "$0")/.."

MODULES=100000
LAYOUT=moe
UNMATCHED=0
BINARY=${CTQUANT_BUILD_DIR:-build}/ctquant
BENCH=${CTQUANT_BUILD_DIR:-build}/tools/ctquant_bench_lint
while [ $# -gt 0 ]; do
  case "$1" in
    --modules) MODULES=$2; shift 2 ;;
    --binary) BINARY=$2; BENCH=; shift 2 ;;
    --layout) LAYOUT=$2; shift 2 ;;
    --unmatched) UNMATCHED=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | grep '^#' >&2; exit 2 ;;
  esac
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/in"

case "$LAYOUT" in
  moe|dense) ;;
  *) echo "bench-lint.sh: --layout is moe or dense, not $LAYOUT" >&2; exit 2 ;;
esac
# The i-th module's name (awk): MoE experts, or a dense Llama layer's seven.
NAME_FN='function module(i,   e, l) {
  if (layout == "dense") {
    split("self_attn.q_proj self_attn.k_proj self_attn.v_proj self_attn.o_proj mlp.gate_proj mlp.up_proj mlp.down_proj", d, " ");
    return sprintf("model.layers.%d.%s", int(i / 7), d[i % 7 + 1]);
  }
  split("gate_proj up_proj down_proj", p, " ");
  e = int(i / 3);
  return sprintf("model.layers.%d.mlp.experts.%d.%s", int(e / 128), e % 128, p[i % 3 + 1]);
}'

# The header: N weights of 128 x 128 BF16 (32 KiB each), in name order.
awk -v n="$MODULES" -v layout="$LAYOUT" "$NAME_FN"'
BEGIN {
  printf "{";
  for (i = 0; i < n; i++) {
    printf "%s\"%s.weight\":{\"dtype\":\"BF16\",\"shape\":[128,128],\"data_offsets\":[%.0f,%.0f]}",
           (i ? "," : ""), module(i), i * 32768, (i + 1) * 32768;
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

# MoE: two groups of exact names, layers below the middle and the rest;
# dense: one group naming every module. Then the unmatched entries.
awk -v n="$MODULES" -v layout="$LAYOUT" -v k="$UNMATCHED" "$NAME_FN"'
BEGIN {
  groups = (layout == "dense" ? 1 : 2);
  half = (layout == "dense" ? n : int(n / 768) * 384);
  printf "{\"config_groups\":{";
  for (g = 0; g < groups; g++) {
    printf "%s\"%s\":{\"targets\":[", (g ? "," : ""), (g ? "W4A16_memoryless_mse" : "W4A16");
    first = 1;
    for (i = (g ? half : 0); i < (g ? n : half); i++) {
      printf "%s\"%s\"", (first ? "" : ","), module(i);
      first = 0;
    }
    for (i = 0; g == 0 && i < k; i++) printf ",\"model.nothing.%d.proj\"", i;
    printf "],\"weights\":{\"num_bits\":4,\"type\":\"int\",\"symmetric\":true,\"strategy\":\"group\",\"group_size\":128%s}}",
           (g ? ",\"observer\":\"memoryless_mse\"" : "");
  }
  printf "},\"ignore\":[";
  for (i = 0; i < k; i++) printf "%s\"model.absent.%d.proj\"", (i ? "," : ""), i;
  printf "]}";
}' >"$tmp/groups.json"
if [ "$LAYOUT" = dense ]; then
  layers=$(((MODULES + 6) / 7))
  printf '{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":128,"intermediate_size":128,"num_attention_heads":4,"num_key_value_heads":4,"num_hidden_layers":%d,"vocab_size":256,"tie_word_embeddings":true}\n' \
    "$layers" >"$tmp/in/config.json"
fi

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
  -v layout="$LAYOUT" -v k="$UNMATCHED" \
  'BEGIN { printf "%s: %s, %d exact names (+%d unmatched targets, %d unmatched ignore entries): open %.3f s, plan %.3f s, lint %.3f s; quantize --dry-run %.2f s wall (exit %d)\n", b, layout, n, k, k, o, p, l, e - s, x }'
if [ -n "$BENCH" ] && [ -x "$BENCH" ]; then
  "$BENCH" "$tmp/in" "$tmp/groups.json" --runs 3 | sed "s|^|$BENCH: |"
fi
