/* Declarations that newer mingw-w64 headers have and Debian 12's (mingw-w64 10) lack; force-included
 * by ci/mingw-build.sh into C files only. No includes: ULONG is a 32-bit unsigned long on Windows. */
#ifndef LONGHAUL_MINGW_COMPAT_H
#define LONGHAUL_MINGW_COMPAT_H
#ifndef THREAD_POWER_THROTTLING_CURRENT_VERSION
#define THREAD_POWER_THROTTLING_CURRENT_VERSION 1
#define THREAD_POWER_THROTTLING_EXECUTION_SPEED 0x1
typedef struct _THREAD_POWER_THROTTLING_STATE {
    unsigned long Version;
    unsigned long ControlMask;
    unsigned long StateMask;
} THREAD_POWER_THROTTLING_STATE;
#endif
#endif
