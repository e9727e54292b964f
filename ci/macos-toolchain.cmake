# Cross-compiling for macOS 11.0+ (arm64 or x86_64) with zig's clang and linker, which ship the macOS libc headers
# (mach, sysctl, fcntl) and libSystem.tbd: no Apple SDK, so no framework (Metal, BLAS and Accelerate off).
# ci/macos-cross.sh (the tree, its tests and the checks) and ci/wheel-macos.sh (the wheel) use it;
# LONGHAUL_MACOS_ARCH (arm64 | x86_64, from the cache or the environment) chooses the target.
set(CMAKE_SYSTEM_NAME Darwin)
if (NOT LONGHAUL_MACOS_ARCH)
    set(LONGHAUL_MACOS_ARCH "$ENV{LONGHAUL_MACOS_ARCH}")
endif()
if (NOT LONGHAUL_MACOS_ARCH)
    set(LONGHAUL_MACOS_ARCH arm64)
endif()
set(LONGHAUL_MACOS_ARCH ${LONGHAUL_MACOS_ARCH} CACHE STRING "arm64 or x86_64")
if (LONGHAUL_MACOS_ARCH STREQUAL "arm64")
    set(_zig_target aarch64-macos.11.0)
elseif (LONGHAUL_MACOS_ARCH STREQUAL "x86_64")
    set(_zig_target x86_64-macos.11.0)
else()
    message(FATAL_ERROR "LONGHAUL_MACOS_ARCH=${LONGHAUL_MACOS_ARCH}: use arm64 or x86_64")
endif()
set(CMAKE_SYSTEM_PROCESSOR ${LONGHAUL_MACOS_ARCH})
set(CMAKE_OSX_ARCHITECTURES ${LONGHAUL_MACOS_ARCH})
set(CMAKE_OSX_DEPLOYMENT_TARGET 11.0)
set(CMAKE_OSX_SYSROOT "")  # no SDK: zig's own headers and libSystem.tbd

# the wrappers (ci/zig/zig-wrap) rewrite the flags zig does not take; the target travels in the flags, so it
# reaches every compile and link
set(CMAKE_C_COMPILER   ${CMAKE_CURRENT_LIST_DIR}/zig/cc)
set(CMAKE_CXX_COMPILER ${CMAKE_CURRENT_LIST_DIR}/zig/c++)
set(CMAKE_AR           ${CMAKE_CURRENT_LIST_DIR}/zig/ar CACHE FILEPATH "" FORCE)
set(CMAKE_RANLIB       ${CMAKE_CURRENT_LIST_DIR}/zig/ranlib CACHE FILEPATH "" FORCE)
set(CMAKE_C_FLAGS_INIT   "-target ${_zig_target}")
set(CMAKE_CXX_FLAGS_INIT "-target ${_zig_target}")
set(CMAKE_ASM_FLAGS_INIT "-target ${_zig_target}")
set(CMAKE_EXE_LINKER_FLAGS_INIT    "-target ${_zig_target}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-target ${_zig_target}")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "-target ${_zig_target}")

# install names and rpaths set at link time: any edit afterwards (install_name_tool) would invalidate the ad-hoc code
# signature zig's linker gives arm64 binaries. Libraries are @rpath/lib*.dylib; everything looks beside itself.
set(CMAKE_BUILD_WITH_INSTALL_RPATH ON)
# CMake's Darwin rules want install_name_tool even when nothing is edited: LLVM's (Debian's llvm-14)
find_program(CMAKE_INSTALL_NAME_TOOL NAMES llvm-install-name-tool llvm-install-name-tool-14 install_name_tool REQUIRED)
set(CMAKE_INSTALL_RPATH "@loader_path")
set(CMAKE_INSTALL_NAME_DIR "@rpath")

set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
