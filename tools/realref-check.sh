#!/usr/bin/env bash
# A real client in the loop: quantizes small checkpoints with ctquant and
# loads each output with transformers + compressed-tensors (the realref
# chroot of ../shared/tools/realref: hf_load.sh), then checks what the load
# says. Run by `tools/dev.sh realref-check`; docs/loadability.md says when.
#
#   sudo tools/realref-check.sh [--keep]
#
# Cases (layouts in tools/layouts/realref-*.manifest.json, written with
# ctquant_make_checkpoint):
#   llama-w4a16          untied Llama, default options
#   qwen3-tied-w4a16     Qwen3 with tie_word_embeddings and no lm_head tensor
#   dflash-w4a16         a DFlash draft (qkv/g_proj defaults; no head of its
#                        own, so --ignore lm_head for transformers' Qwen3 class)
#   llama-fp8-dynamic    --scheme FP8_DYNAMIC
#   llama-nvfp4a16       --scheme NVFP4A16
#   qwen3-tied-w4a16-rotate, llama-w4a16-rotate
#                        --transform rotate (Hadamard R1 + R2; the tied head
#                        untied)
# and the converter golden cases (tests/golden/<case>/input, converted by
# ctquant; the logits compared with those of the library's own output,
# tests/golden/<case>/expected, loaded the same way):
#   awq-gemm-zp-g128     AutoAWQ GEMM, zero point, group 128
#   awq-gemm-sym-g128    AutoAWQ GEMM, symmetric, group 128
#   (not modelopt-nvfp4-kv, ModelOpt NVFP4 with an FP8 KV cache scheme: see
#   below)
#   modelopt-nvfp4-mlp-fp8-block-attn  the MLP converted, the attention
#                        quantized with --scheme FP8_BLOCK in the same run
# A case fails when the output does not load, the load reports an error, or
# it reports missing or unexpected keys. transformers has no DFlash class: it
# loads a draft as the class of its model_type (Qwen3ForCausalLM), which
# lacks fc and hidden_norm and wants an embedding and a head; those keys are
# allowed only when the unquantized draft reports them too (the quantized
# names, weight_packed and the like, compared as the .weight they replace).
#
# Environment:
#   REALREF_DIR   the realref tools (hf_load.sh, setup.sh); default
#                 ../shared/tools/realref relative to the repository (or to
#                 the main checkout, in a git worktree)
#   REALREF_ROOT  the chroot hf_load.sh uses (default /tmp/realref-sid)
#   CT_REPO, LLMC_REPO  git clones of compressed-tensors and llm-compressor:
#                 when the chroot is missing and both are set, setup.sh builds
#                 it first (about 2 GB, minutes); otherwise the script says
#                 what to run
#   BUILD_DIR     where ctquant and ctquant_make_checkpoint are built
#                 (default build, as tools/dev.sh)
#
# --keep leaves the work directory (inputs, outputs, hf_load logs) in place.
# Exit status: 0 when every case passes, 1 when one fails, 2 when something
# the check needs is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

# Beside the repository, or beside the main checkout of a git worktree.
if [ -z "${REALREF_DIR:-}" ]; then
  REALREF_DIR=$REPO/../shared/tools/realref
  if ! [ -d "$REALREF_DIR" ] && common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
    [ -d "$common/../../shared/tools/realref" ] && REALREF_DIR=$(cd "$common/../../shared/tools/realref" && pwd)
  fi
fi
REALREF_ROOT=${REALREF_ROOT:-/tmp/realref-sid}
BUILD_DIR=${BUILD_DIR:-${CTQUANT_BUILD_DIR:-build}}
KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1

missing() { echo "realref-check: $*" >&2; exit 2; }

# What the check needs, each named with what to do about it.
[ -f "$REALREF_DIR/hf_load.sh" ] ||
  missing "no hf_load.sh in REALREF_DIR=$REALREF_DIR; set REALREF_DIR to the realref tools" \
    "folder (../shared/tools/realref beside the repository holds them)"
[ "$(id -u)" = 0 ] ||
  missing "hf_load.sh mounts and chroots, so this needs root: sudo tools/realref-check.sh"
command -v python3 >/dev/null ||
  missing "python3 is needed to read hf_load.sh's JSON lines (apt-get install python3)"
CTQUANT=$BUILD_DIR/ctquant
MAKE_CHECKPOINT=$BUILD_DIR/tools/ctquant_make_checkpoint
[ -x "$CTQUANT" ] && [ -x "$MAKE_CHECKPOINT" ] ||
  missing "no $CTQUANT or $MAKE_CHECKPOINT; build them first (tools/dev.sh build, or" \
    "cmake --build $BUILD_DIR --target ctquant ctquant_make_checkpoint)"
if ! [ -x "$REALREF_ROOT/usr/bin/python3" ] || ! [ -d "$REALREF_ROOT/opt/ct/src" ]; then
  if [ -n "${CT_REPO:-}" ] && [ -n "${LLMC_REPO:-}" ]; then
    echo "realref-check: no realref chroot at $REALREF_ROOT: building it with setup.sh" >&2
    REALREF_ROOT=$REALREF_ROOT CT_REPO=$CT_REPO LLMC_REPO=$LLMC_REPO bash "$REALREF_DIR/setup.sh"
  else
    missing "no realref chroot at $REALREF_ROOT; build it (about 2 GB) with" \
      "CT_REPO=<compressed-tensors clone> LLMC_REPO=<llm-compressor clone> tools/realref-check.sh" \
      "(setup.sh runs first), or $REALREF_DIR/setup.sh; or set REALREF_ROOT to an existing one"
  fi
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ctquant-realref-check.XXXXXX")
if [ "$KEEP" = 1 ]; then
  echo "realref-check: work directory $WORK (kept)" >&2
else
  trap 'rm -rf "$WORK"' EXIT
fi

# hf_load.sh DIR > LOG.json; the JSON line is its last line of stdout.
hf_load() {
  REALREF_ROOT=$REALREF_ROOT bash "$REALREF_DIR/hf_load.sh" "$@" 2>"$WORK/hf_load.stderr" |
    tail -n 1 || true
}

# verdict NAME OUTPUT_JSON [INPUT_JSON]: prints one line, returns 1 on a failure.
verdict() {
  python3 - "$@" <<'PY'
import json, re, sys
name, out = sys.argv[1], sys.argv[2]
ref = sys.argv[3] if len(sys.argv) > 3 else None
def load(text):
    try:
        return json.loads(text)
    except ValueError:
        return {"loaded": False, "error": "hf_load.sh printed no JSON line: " + text[-300:]}
o = load(out)
quantized = re.compile(r"\.(weight_packed|weight_scale|weight_shape|weight_zero_point|"
                       r"weight_global_scale|input_global_scale)$")
def as_weights(keys):
    return sorted({quantized.sub(".weight", k) for k in keys})
problems = []
if not o.get("loaded") or o.get("error"):
    problems.append("load error: %s" % o.get("error"))
missing, unexpected = o.get("missing", []), o.get("unexpected", [])
if ref is not None:
    r = load(ref)
    if not r.get("loaded") or r.get("error"):
        problems.append("the unquantized input does not load either: %s" % r.get("error"))
    allowed_missing = set(as_weights(r.get("missing", [])))
    allowed_unexpected = set(as_weights(r.get("unexpected", [])))
    missing = [k for k in missing if quantized.sub(".weight", k) not in allowed_missing]
    unexpected = [k for k in unexpected if quantized.sub(".weight", k) not in allowed_unexpected]
if missing:
    problems.append("missing keys: " + ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""))
if unexpected:
    problems.append("unexpected keys: " + ", ".join(unexpected[:8]) +
                    (" ..." if len(unexpected) > 8 else ""))
if o.get("mismatched"):
    problems.append("mismatched shapes: " + ", ".join(o["mismatched"][:4]))
err = o.get("rel_logit_err")
detail = "" if err is None else ", relative logit error %.4f" % err
if problems:
    print("realref-check: FAIL %s: %s" % (name, "; ".join(problems)))
    sys.exit(1)
print("realref-check: ok   %s: loaded in transformers + compressed-tensors, no missing or "
      "unexpected keys%s" % (name, detail))
PY
}

FAILED=0
declare -A MADE=()
# case NAME LAYOUT [CTQUANT OPTIONS...]
case_() {
  local name=$1 layout=$2
  shift 2
  local input=$WORK/in-$layout output=$WORK/out-$name
  if [ -z "${MADE[$layout]:-}" ]; then
    if ! "$MAKE_CHECKPOINT" "tools/layouts/$layout.manifest.json" "$input" \
        >"$WORK/$layout.make_checkpoint.log" 2>&1; then
      echo "realref-check: FAIL $name: ctquant_make_checkpoint failed:" >&2
      sed 's/^/  /' "$WORK/$layout.make_checkpoint.log" >&2
      FAILED=1
      return
    fi
    MADE[$layout]=1
  fi
  if ! "$CTQUANT" quantize "$input" "$output" --progress none "$@" 2>"$WORK/$name.ctquant.log"; then
    echo "realref-check: FAIL $name: ctquant quantize failed:" >&2
    sed 's/^/  /' "$WORK/$name.ctquant.log" >&2
    FAILED=1
    return
  fi
  local out_json ref_json
  if [ "$layout" = realref-dflash ]; then
    # No logits to compare: transformers runs the draft as a Qwen3 model.
    out_json=$(hf_load "$output")
    ref_json=$(hf_load "$input")
    verdict "$name" "$out_json" "$ref_json" || FAILED=1
  else
    out_json=$(hf_load "$output" "$input")
    verdict "$name" "$out_json" || FAILED=1
  fi
  echo "$out_json" >"$WORK/$name.hf_load.json"
}

# converter_case_ CASE [CTQUANT OPTIONS...]: ctquant on the golden case's
# input; the output loaded with the library's expected output as reference.
converter_case_() {
  local name=$1
  shift
  local input=$REPO/tests/golden/$name/input expected=$REPO/tests/golden/$name/expected
  local output=$WORK/out-$name
  if ! "$CTQUANT" quantize "$input" "$output" --progress none "$@" 2>"$WORK/$name.ctquant.log"; then
    echo "realref-check: FAIL $name: ctquant quantize failed:" >&2
    sed 's/^/  /' "$WORK/$name.ctquant.log" >&2
    FAILED=1
    return
  fi
  local out_json
  out_json=$(hf_load "$output" "$expected")
  verdict "$name" "$out_json" || FAILED=1
  echo "$out_json" >"$WORK/$name.hf_load.json"
}

start=$(date +%s)
case_ llama-w4a16 realref-llama
case_ qwen3-tied-w4a16 realref-qwen3-tied
# transformers' Qwen3ForCausalLM has an lm_head the draft lacks: without an
# entry for it compressed-tensors expects it packed (the draft's own modeling
# code, and vLLM, have no head; the default list stays the reference recipe's).
case_ dflash-w4a16 realref-dflash --ignore lm_head
case_ llama-fp8-dynamic realref-llama --scheme FP8_DYNAMIC
case_ llama-nvfp4a16 realref-llama --scheme NVFP4A16
# --transform rotate: the tied head untied (lm_head.weight written), every
# norm 1; the logit error against the unrotated input is that of W4A16.
case_ qwen3-tied-w4a16-rotate realref-qwen3-tied --transform rotate
case_ llama-w4a16-rotate realref-llama --transform rotate
converter_case_ awq-gemm-zp-g128
converter_case_ awq-gemm-sym-g128
# Not modelopt-nvfp4-kv: the library's own output (tests/golden/modelopt-nvfp4-kv/
# expected, which ctquant's equals byte for byte) does not load clean either.
# The converter keeps ModelOpt's self_attn.k_proj.k_scale / v_proj.v_scale
# (vLLM remaps them, maybe_remap_kv_scale_name), while transformers wants
# self_attn.k_scale / v_scale: two missing and two unexpected keys
# (converter_cases.json hf_load and hf_load_note).
converter_case_ modelopt-nvfp4-mlp-fp8-block-attn --scheme FP8_BLOCK \
  --targets 're:.*self_attn.(q|k|v|o)_proj$' --ignore lm_head \
  --convert-targets 're:.*mlp.*(gate_up|gate|up|down)_proj$'
echo "realref-check: $(($(date +%s) - start)) s" >&2
exit $FAILED
