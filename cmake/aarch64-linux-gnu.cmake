# Cross-compiling ctquant for 64-bit Arm Linux (AArch64, e.g. the Grace CPU of
# a DGX Spark) on a Debian 12 x86-64 machine, with Debian's cross compiler
# (g++-aarch64-linux-gnu) and an arm64 sysroot holding the arm64 -dev
# packages and their libraries (tools/arm64-sysroot.sh makes it; tools/dev.sh
# cross-arm64 does it all):
#
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DCTQUANT_ARM64_SYSROOT=/path/to/sysroot
#
# The host's own packages are not used for arm64 and not changed: installing
# the arm64 -dev packages on the host (multiarch) would replace the native
# ones that cannot coexist with them (libyaml-cpp-dev), and break the native
# build.
#
# Tests and tools built this way run through qemu-user (CMAKE_CROSSCOMPILING_EMULATOR,
# which ctest and gtest_discover_tests use), see the README and docs/build.md.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# try_compile projects read this file again: pass the sysroot on.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES CTQUANT_ARM64_SYSROOT)
if(NOT CTQUANT_ARM64_SYSROOT OR NOT IS_DIRECTORY "${CTQUANT_ARM64_SYSROOT}/usr/include")
  message(FATAL_ERROR "cmake/aarch64-linux-gnu.cmake: CTQUANT_ARM64_SYSROOT ('${CTQUANT_ARM64_SYSROOT}') "
                      "is not an arm64 sysroot; make one with tools/arm64-sysroot.sh "
                      "(tools/dev.sh cross-arm64 does)")
endif()
set(CMAKE_SYSROOT "${CTQUANT_ARM64_SYSROOT}")

# Headers, libraries and CMake package files come from the sysroot only (the
# cross compiler adds its own C and C++ runtime); programs (cmake, pkg-config)
# are the host's.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config sees only the sysroot's .pc files, and prefixes their paths with it.
set(ENV{PKG_CONFIG_LIBDIR}
    "${CMAKE_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${CMAKE_SYSROOT}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${CMAKE_SYSROOT}")

# Runs AArch64 programs on the build machine. -L SYSROOT: the dynamic loader
# and libc come from the same package (the sysroot's libc6, at
# /lib/ld-linux-aarch64.so.1 and /lib/aarch64-linux-gnu): a loader from
# /usr/aarch64-linux-gnu (libc6-arm64-cross) with another build of glibc
# hangs the first time a program creates a thread.
find_program(CTQUANT_QEMU_AARCH64 qemu-aarch64-static)
if(CTQUANT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${CTQUANT_QEMU_AARCH64};-L;${CMAKE_SYSROOT}")
endif()
