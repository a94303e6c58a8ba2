#!/usr/bin/env bash
# Conversion speed: `ctquant quantize` of an AutoAWQ GEMM checkpoint (a
# lossless conversion, docs/converters.md) against reading its input and
# writing its output, on a full-size layout.
#
#   tools/bench-convert.sh [--layout F] [--data DIR] [--runs N] [--threads N]
#
# The layout (default tools/layouts/laguna-s-2.1-dflash.manifest.json, the
# 2.08 GiB BF16 DFlash draft) is written once into DIR/awq-input in AWQ
# form: every 2-D linear weight the layout's recommended ignore list does
# not keep becomes qweight I32 [in, out/8], qzeros I32 [in/128, out/8] and
# scales F16 [in/128, out] (synthetic codes; AutoAWQ's layout, group 128,
# zero point); every other tensor keeps its dtype and shape. Then, page cache
# warm, alternately N times (default 9), each after a sync:
#   ctquant   ctquant quantize IN OUT --no-sync --no-manifest
#   floor     cat IN/*.safetensors > /dev/null; cp OUT/*.safetensors FLOOR/
#             (reading the input, then the output's bytes copied in the
#             kernel: copy_file_range, no user-space buffer)
# and prints the medians and the paired ratios ctquant/floor (target <=
# 1.25x). On a VM, a write into page-cache pages the host has reclaimed
# can take seconds (perf: the time is in copy_folio_from_iter_atomic; a
# `dd bs=16M` floor run in the same loop stalled as often): the median and
# the minimum of the paired ratios say how often it hit. docs/performance.md
# has the figure. CTQUANT_BIN names another binary (default build/ctquant).
set -euo pipefail
cd "$(dirname "$0")/.."
LAYOUT=tools/layouts/laguna-s-2.1-dflash.manifest.json
DATA=/tmp/ctquant-bench-convert
RUNS=9
THREADS=2
while [ $# -gt 0 ]; do
  case $1 in
    --layout) LAYOUT=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    *) echo "bench-convert: unknown option $1" >&2; exit 2 ;;
  esac
done
BIN=${CTQUANT_BIN:-${CTQUANT_BUILD_DIR:-build}/ctquant}
[ -x "$BIN" ] || { echo "bench-convert: build $BIN first (tools/dev.sh build)" >&2; exit 2; }
IN=$DATA/awq-input
mkdir -p "$DATA"
if [ ! -f "$IN/model.safetensors" ]; then
  echo "bench-convert: writing $LAYOUT in AWQ form into $IN" >&2
  python3 - "$LAYOUT" "$IN" <<'PY'
import json, os, re, struct, sys
layout, out = sys.argv[1], sys.argv[2]
m = json.load(open(layout))
ignore = [re.compile(e[3:]) for e in m.get("recommended_ignore", []) if e.startswith("re:")]
sizes = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4}
tensors = []  # (name, dtype, shape, fill)
awq = []
for t in m["tensors"]:
    name, shape = t["name"], t["shape"]
    module = name[: -len(".weight")] if name.endswith(".weight") else None
    linear = (module is not None and len(shape) == 2 and "embed" not in name
              and not module.endswith("norm") and "lm_head" not in name
              and not any(r.match(module) for r in ignore)
              and shape[1] % 128 == 0 and shape[0] % 8 == 0)
    if not linear:
        tensors.append((name, t["dtype"], shape, "random"))
        continue
    out_f, in_f = shape
    awq.append(module.split(".")[-1])
    tensors.append((module + ".qweight", "I32", [in_f, out_f // 8], "random"))
    tensors.append((module + ".qzeros", "I32", [in_f // 128, out_f // 8], "random"))
    tensors.append((module + ".scales", "F16", [in_f // 128, out_f], "scale"))
header, offset = {}, 0
for name, dtype, shape, _ in tensors:
    n = sizes[dtype]
    for d in shape:
        n *= d
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
    offset += n
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    for name, dtype, shape, fill in tensors:
        a, b = header[name]["data_offsets"]
        left = b - a
        while left > 0:
            n = min(left, 64 << 20)
            # Finite scales (F16 0.0078); other tensors random bytes (BF16
            # weights copied as they are, AWQ codes any nibble).
            f.write(b"\x00\x20" * (n // 2) if fill == "scale" else os.urandom(n))
            left -= n
config = dict(m["config"])
config["torch_dtype"] = "float16"
config["quantization_config"] = {"quant_method": "awq", "version": "gemm", "bits": 4,
                                 "group_size": 128, "zero_point": True,
                                 "modules_to_not_convert": None}
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
print(f"bench-convert: {len(awq)} AWQ modules, {offset} bytes of tensor data", file=sys.stderr)
PY
fi
OUT=$DATA/out
FLOOR=$DATA/floor
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
now() { date +%s.%N; }
cat "$IN"/*.safetensors > /dev/null  # warm the page cache
ct=() fl=() ra=()
for i in $(seq "$RUNS"); do
  # Each timed command starts with no dirty pages of the one before it
  # (sync): writeback of the other's 0.9 GB would land in its time.
  rm -rf "$OUT" "$FLOOR"
  sync
  t0=$(now)
  "$BIN" quantize "$IN" "$OUT" --no-sync --no-manifest --threads "$THREADS" -q
  t1=$(now)
  mkdir -p "$FLOOR"
  sync
  t2=$(now)
  cat "$IN"/*.safetensors > /dev/null
  cp "$OUT"/*.safetensors "$FLOOR"/
  t3=$(now)
  ct+=("$(echo "$t1 - $t0" | bc -l)")
  fl+=("$(echo "$t3 - $t2" | bc -l)")
  ra+=("$(echo "($t1 - $t0) / ($t3 - $t2)" | bc -l)")
done
med() { printf '%s\n' "$@" | median; }
least() { printf '%s\n' "$@" | sort -n | head -1; }
in_bytes=$(stat -c %s "$IN"/model.safetensors)
out_bytes=$(stat -c %s "$OUT"/model.safetensors)
printf 'bench-convert: input %s bytes, output %s bytes, %s runs, --threads %s\n' \
  "$in_bytes" "$out_bytes" "$RUNS" "$THREADS"
printf '  ctquant quantize (AWQ -> pack-quantized)     median %.3f s\n' "$(med "${ct[@]}")"
printf '  floor: cat input + cp output (in-kernel)     median %.3f s  ctquant/floor: median %.2fx, min %.2fx\n' \
  "$(med "${fl[@]}")" "$(med "${ra[@]}")" "$(least "${ra[@]}")"
echo '  (ratios are paired run by run; target <= 1.25x)'
rm -rf "$OUT" "$FLOOR"
