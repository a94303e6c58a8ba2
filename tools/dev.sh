#!/usr/bin/env bash
# Set-up and everyday commands for a fresh Debian 12 machine (run as root, or
# as a user with sudo). Installs the missing Debian packages, builds, then:
#   tools/dev.sh sample   quantize the bundled sample checkpoint into a
#                         temporary directory and print the summary
#   tools/dev.sh test     run the whole test suite (what CI runs)
#   tools/dev.sh sanitize run the whole test suite built with AddressSanitizer
#                         and UndefinedBehaviorSanitizer (in build-asan/)
#   tools/dev.sh fuzz [S] fuzz the reader for S seconds (tools/fuzz.sh)
#   tools/dev.sh build    only install and build
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  googletest libgtest-dev libpcre2-dev libbenchmark-dev
  libssl-dev
)
BUILD_DIR=${CTQUANT_BUILD_DIR:-build}
# The sanitizer and fuzzing build (tools/dev.sh sanitize, tools/fuzz.sh).
SANITIZE_PACKAGES=(clang libclang-rt-14-dev)
SANITIZE_BUILD_DIR=${CTQUANT_SANITIZE_BUILD_DIR:-build-asan}
SANITIZE_OPTIONS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCTQUANT_SANITIZE=ON -DCTQUANT_BUILD_FUZZERS=ON)

install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  echo "dev.sh: installing ${missing[*]}" >&2
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# build [CMAKE OPTIONS]: configure, then build $BUILD_TARGET (default: everything).
BUILD_TARGET=
build() {
  install_packages "${PACKAGES[@]}"
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCTQUANT_WERROR=ON -DCTQUANT_BUILD_BENCHMARKS=ON "$@" >/dev/null
  cmake --build "$BUILD_DIR" -j "$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
}

case "${1:-}" in
  build)
    build
    ;;
  sample)
    BUILD_TARGET=ctquant build  # the tool only: the tests and benchmarks are not needed here
    out="$(mktemp -d)/dflash-w4a16"
    "$BUILD_DIR/ctquant" quantize tests/golden/dflash-bf16-sharded/input "$out" \
      --ignore 're:.*qkv_proj$' --ignore 're:.*g_proj$'
    echo "output: $out"
    ls -l "$out"
    ;;
  test)
    build
    ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
    ;;
  sanitize)
    # clang, so that the same build also holds the libFuzzer targets
    # (tools/fuzz.sh reuses it); the fuzz seeds are replayed as a test.
    install_packages "${SANITIZE_PACKAGES[@]}"
    BUILD_DIR=$SANITIZE_BUILD_DIR
    CC=clang CXX=clang++ build "${SANITIZE_OPTIONS[@]}"
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
    ;;
  fuzz)
    bash tools/fuzz.sh "${2:-60}"
    ;;
  sanitize-build)
    # Used by tools/fuzz.sh: configure and build one target of the sanitizer build.
    install_packages "${PACKAGES[@]}" "${SANITIZE_PACKAGES[@]}"
    CC=clang CXX=clang++ cmake -S . -B "$SANITIZE_BUILD_DIR" -DCTQUANT_WERROR=ON \
      "${SANITIZE_OPTIONS[@]}" >/dev/null
    cmake --build "$SANITIZE_BUILD_DIR" -j "$(nproc)" --target "${2:?target}"
    ;;
  *)
    echo "usage: tools/dev.sh sample|test|sanitize|fuzz [SECONDS]|build" >&2
    exit 2
    ;;
esac
