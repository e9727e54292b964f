# Cross-compiling for Windows x64 with Debian's mingw-w64, posix threads (g++-mingw-w64-x86-64-posix):
# ci/mingw-build.sh (the tree and its tests) and ci/wheel-windows.sh (the win_amd64 wheel).
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(CMAKE_C_COMPILER x86_64-w64-mingw32-gcc-posix)
set(CMAKE_CXX_COMPILER x86_64-w64-mingw32-g++-posix)
set(CMAKE_RC_COMPILER x86_64-w64-mingw32-windres)
# Debian 12's mingw-w64 headers lack THREAD_POWER_THROTTLING_STATE, which ggml's CPU backend uses
set(CMAKE_C_FLAGS_INIT "-include ${CMAKE_CURRENT_LIST_DIR}/mingw-compat.h")
