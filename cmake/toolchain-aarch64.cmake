# Cross-compiling peng for aarch64 on a Debian 12 x86-64 host (scripts/build_arm64.sh,
# docs/arm64.md): Debian's g++-aarch64-linux-gnu, the multiarch :arm64 -dev packages, and
# qemu-user as the emulator that runs the test binaries (gtest discovery at test time, ctest).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# The cross toolchain's own sysroot plus the multiarch library/include folders.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config sees only the arm64 .pc files (and the arch-independent ones).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# Test executables run under qemu-user with the multiarch arm64 libraries of this host
# (/lib/ld-linux-aarch64.so.1, /usr/lib/aarch64-linux-gnu: libc6:arm64 and friends, installed by
# scripts/build_arm64.sh). Not -L /usr/aarch64-linux-gnu: with the cross toolchain's copy of
# glibc, qemu-aarch64 7.2 hangs in the first pthread_create. QEMU_CPU (environment) picks the
# CPU model (scripts/test_arm64.sh).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
