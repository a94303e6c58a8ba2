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
#   tools/dev.sh deps     only install the packages the build needs
#   tools/dev.sh cross-arm64  cross-compile for AArch64 (in build-arm64/,
#                         against an arm64 sysroot: the host's packages are
#                         not touched) and run the kernel tests and the
#                         golden cases under qemu-user (README)
#   tools/dev.sh realref-check [--keep]  load ctquant's outputs in transformers +
#                         compressed-tensors (tools/realref-check.sh; root)
# Each command prints how long its steps took; docs/build.md lists them.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache (when installed) keys objects on paths relative to the checkout, so
# a fresh clone elsewhere reuses what an earlier build compiled.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  googletest libgtest-dev libpcre2-dev libbenchmark-dev libhwy-dev
  libyaml-cpp-dev libssl-dev help2man
)
BUILD_DIR=${CTQUANT_BUILD_DIR:-build}
# The sanitizer and fuzzing build (tools/dev.sh sanitize, tools/fuzz.sh).
SANITIZE_PACKAGES=(clang libclang-rt-14-dev)
SANITIZE_BUILD_DIR=${CTQUANT_SANITIZE_BUILD_DIR:-build-asan}
SANITIZE_OPTIONS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCTQUANT_SANITIZE=ON -DCTQUANT_BUILD_FUZZERS=ON)

# The AArch64 cross build (tools/dev.sh cross-arm64): Debian's cross
# compiler and qemu-user on the host; the arm64 -dev packages (and the
# libraries the tests run with under qemu) unpacked into a sysroot of their
# own by tools/arm64-sysroot.sh, not installed beside the native ones: some
# (libyaml-cpp-dev) cannot be installed for two architectures at once.
CROSS_PACKAGES=(g++-aarch64-linux-gnu qemu-user-static cmake ninja-build pkg-config
  debian-archive-keyring)
CROSS_ARM64_PACKAGES=(libspdlog-dev libfmt-dev libpcre2-dev libgtest-dev libyaml-cpp-dev libssl-dev
  libhwy-dev nlohmann-json3-dev libcli11-dev libc6 libstdc++6)
CROSS_BUILD_DIR=${CTQUANT_CROSS_BUILD_DIR:-build-arm64}
CROSS_SYSROOT=${CTQUANT_ARM64_SYSROOT:-$CROSS_BUILD_DIR/sysroot}

as_root() {
  if [ "$(id -u)" -ne 0 ]; then sudo "$@"; else "$@"; fi
}

# A package counts as installed in the architecture it is asked for: PKG
# (no :ARCH) in the native one or "all". (A host where an arm64 -dev package
# was installed by multiarch, and replaced the native one, gets the native
# one back.)
install_packages() {
  local missing=() native
  native=$(dpkg --print-architecture)
  for p in "$@"; do
    local name=${p%%:*} arch=${p#*:}
    [ "$arch" = "$p" ] && arch=$native
    # dpkg-query exits 1 when one of the two names matches nothing (an
    # "all" package has no NAME:ARCH), so only grep's verdict counts.
    { dpkg-query -W -f='${Status} ${Architecture}\n' "$name:$arch" "$name" 2>/dev/null || true; } |
      grep -Eq "^install ok installed ($arch|all)$" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "dev.sh: installing ${missing[*]}" >&2
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Seconds since $1 (from date +%s).
since() { echo $(($(date +%s) - $1)); }

# cmake -S . -B DIR with Ninja for a new build directory (an existing one
# keeps the generator it was made with), and the options given.
configure() {
  local dir=$1; shift
  local generator=()
  [ -f "$dir/CMakeCache.txt" ] || generator=(-G Ninja)
  cmake -S . -B "$dir" "${generator[@]}" "$@" >/dev/null
}

cross_arm64() {
  install_packages "${CROSS_PACKAGES[@]}"
  local start
  start=$(date +%s)
  bash tools/arm64-sysroot.sh "$CROSS_SYSROOT" "${CROSS_ARM64_PACKAGES[@]}"
  echo "dev.sh: arm64 sysroot $CROSS_SYSROOT ready in $(since "$start") s"
  start=$(date +%s)
  # A build directory configured against the host's multiarch packages
  # (before the sysroot) is configured again from scratch.
  local cache=$CROSS_BUILD_DIR/CMakeCache.txt toolchain=()
  if [ -f "$cache" ] && ! grep -q '^CTQUANT_ARM64_SYSROOT:' "$cache"; then rm -f "$cache"; fi
  [ -f "$cache" ] || toolchain=(-DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake)
  configure "$CROSS_BUILD_DIR" "${toolchain[@]}" -DCTQUANT_ARM64_SYSROOT="$(realpath "$CROSS_SYSROOT")" \
    -DCMAKE_BUILD_TYPE=Release -DCTQUANT_WERROR=ON
  # The tool, the tools and the emulated subset of the tests
  # (tests/CMakeLists.txt, CTQUANT_EMULATED_TESTS); its tests are listed by
  # running it under qemu right after the link.
  cmake --build "$CROSS_BUILD_DIR" -j "$(nproc)"
  echo "dev.sh: cross-compiled for AArch64 in $(since "$start") s"
  # Under qemu-user (the emulator comes from the toolchain file,
  # CMAKE_CROSSCOMPILING_EMULATOR): the kernel and number-format tests and
  # every golden case through the CLI at --threads 1. qemu's default CPU has
  # SVE2 with 512-bit vectors, so the kernels run at sve2, sve and neon
  # there; the kernel tests run again with 128- and 256-bit vectors for the
  # sve2_128 (the Grace CPU's) and sve_256 levels.
  start=$(date +%s)
  ctest --test-dir "$CROSS_BUILD_DIR" --output-on-failure -j "$(nproc)" --timeout 900
  echo "dev.sh: kernel tests and golden cases under qemu-aarch64 in $(since "$start") s"
  local bits
  for bits in 128 256; do
    start=$(date +%s)
    QEMU_CPU="max,sve-default-vector-length=$((bits / 8))" \
      ctest --test-dir "$CROSS_BUILD_DIR" --output-on-failure -j "$(nproc)" --timeout 900 -L kernel
    echo "dev.sh: kernel tests under qemu-aarch64 with $bits-bit SVE vectors in $(since "$start") s"
  done
}

# build [CMAKE OPTIONS]: configure, then build $BUILD_TARGET (default: everything).
BUILD_TARGET=
build() {
  install_packages "${PACKAGES[@]}"
  local start
  start=$(date +%s)
  configure "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCTQUANT_WERROR=ON -DCTQUANT_BUILD_BENCHMARKS=ON "$@"
  cmake --build "$BUILD_DIR" -j "$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
  echo "dev.sh: built ${BUILD_TARGET:-everything} in $BUILD_DIR in $(since "$start") s" >&2
}

# run_suite [CTEST OPTIONS]: the test suite of $BUILD_DIR, timed.
run_suite() {
  local start
  start=$(date +%s)
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
  echo "dev.sh: test suite of $BUILD_DIR in $(since "$start") s" >&2
}

case "${1:-}" in
  build)
    build
    ;;
  deps)
    install_packages "${PACKAGES[@]}"
    ;;
  sample)
    BUILD_TARGET=ctquant build  # the tool only: the tests and benchmarks are not needed here
    out="$(mktemp -d)/dflash-w4a16"
    # No options: the draft's qkv_proj and g_proj stay BF16 by default.
    "$BUILD_DIR/ctquant" quantize tests/golden/dflash-bf16-sharded/input "$out"
    echo "output: $out"
    ls -l "$out"
    ;;
  test)
    build
    run_suite
    ;;
  sanitize)
    # clang, so that the same build also holds the libFuzzer targets
    # (tools/fuzz.sh reuses it); the fuzz seeds are replayed as a test.
    install_packages "${SANITIZE_PACKAGES[@]}"
    BUILD_DIR=$SANITIZE_BUILD_DIR
    CC=clang CXX=clang++ build "${SANITIZE_OPTIONS[@]}"
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 run_suite
    ;;
  fuzz)
    bash tools/fuzz.sh "${2:-60}"
    ;;
  cross-arm64)
    cross_arm64
    ;;
  realref-check)
    BUILD_TARGET=ctquant build
    BUILD_TARGET=ctquant_make_checkpoint build
    as_root env ${REALREF_DIR:+REALREF_DIR="$REALREF_DIR"} ${REALREF_ROOT:+REALREF_ROOT="$REALREF_ROOT"} \
      ${CT_REPO:+CT_REPO="$CT_REPO"} ${LLMC_REPO:+LLMC_REPO="$LLMC_REPO"} BUILD_DIR="$BUILD_DIR" \
      bash tools/realref-check.sh "${@:2}"
    ;;
  sanitize-build)
    # Used by tools/fuzz.sh: configure and build one target of the sanitizer build.
    install_packages "${PACKAGES[@]}" "${SANITIZE_PACKAGES[@]}"
    CC=clang CXX=clang++ configure "$SANITIZE_BUILD_DIR" -DCTQUANT_WERROR=ON "${SANITIZE_OPTIONS[@]}"
    cmake --build "$SANITIZE_BUILD_DIR" -j "$(nproc)" --target "${2:?target}"
    ;;
  *)
    echo "usage: tools/dev.sh sample|test|sanitize|fuzz [SECONDS]|build|deps|cross-arm64|realref-check" >&2
    exit 2
    ;;
esac
