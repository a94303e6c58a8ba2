#!/usr/bin/env bash
# Fuzzes the safetensors reader and the planner with libFuzzer, for a bounded
# time (what CI runs after the tests):
#   tools/fuzz.sh [SECONDS]
# builds build-asan/ ($CTQUANT_SANITIZE_BUILD_DIR, shared with tools/dev.sh
# sanitize) with clang, ASan, UBSan and libFuzzer, and runs
# tests/fuzz/fuzz_header for SECONDS (default 60) on a seed corpus made of
# every safetensors file of tests/golden and tests/real.
# New interesting inputs are kept in build-asan/fuzz-corpus/ for the next run;
# a crash, leak or undefined behaviour stops the run, writes the input to
# build-asan/fuzz-crash-* and exits non-zero. Reproduce one with
#   build-asan/tests/fuzz/fuzz_header build-asan/fuzz-crash-<hash>
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
# The sanitizer build of tools/dev.sh sanitize (clang, ASan, UBSan, libFuzzer).
BUILD_DIR=${CTQUANT_SANITIZE_BUILD_DIR:-build-asan}
bash tools/dev.sh sanitize-build fuzz_header

seeds="$BUILD_DIR/fuzz-seeds"
corpus="$BUILD_DIR/fuzz-corpus"
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus"
# Seed names carry their path: many seeds are called model.safetensors.
while IFS= read -r -d '' file; do
  cp "$file" "$seeds/$(echo "$file" | tr '/' '_')"
done < <(find tests/golden tests/real -name '*.safetensors' -print0)
echo "fuzz.sh: $(ls "$seeds" | wc -l) seeds, ${seconds} s" >&2

"$BUILD_DIR/tests/fuzz/fuzz_header" "$corpus" "$seeds" \
  -dict=tests/fuzz/safetensors.dict -max_total_time="$seconds" -max_len=65536 \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$BUILD_DIR/fuzz-"
