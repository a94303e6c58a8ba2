# Cross-compiling ctquant for 64-bit Arm Linux (AArch64, e.g. the Grace CPU of
# a DGX Spark) on a Debian 12 x86-64 machine, with Debian's cross compiler
# (g++-aarch64-linux-gnu) and the arm64 -dev packages installed beside the
# native ones (dpkg --add-architecture arm64; tools/dev.sh cross-arm64 does
# it all):
#
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#
# Tests and tools built this way run through qemu-user (CMAKE_CROSSCOMPILING_EMULATOR,
# which ctest and gtest_discover_tests use), see the README and docs/performance.md.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Headers and libraries of the arm64 packages are in the multiarch
# directories of the host (/usr/include/aarch64-linux-gnu,
# /usr/lib/aarch64-linux-gnu), which Debian's cross compiler searches;
# CMAKE_LIBRARY_ARCHITECTURE makes find_package look for CMake package files
# under /usr/lib/aarch64-linux-gnu/cmake. Programs (cmake, pkg-config) are
# the host's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

# pkg-config must see only the arm64 .pc files (plus the
# architecture-independent ones), not the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Runs AArch64 programs on the build machine. -L / : the dynamic loader and
# libc come from the same package (libc6:arm64, installed with the arm64 -dev
# packages, at /lib/ld-linux-aarch64.so.1 and /lib/aarch64-linux-gnu): a
# loader from /usr/aarch64-linux-gnu (libc6-arm64-cross) with that libc
# (a different build of glibc) hangs the first time a program creates a
# thread.
find_program(CTQUANT_QEMU_AARCH64 qemu-aarch64-static)
if(CTQUANT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${CTQUANT_QEMU_AARCH64};-L;/")
endif()
