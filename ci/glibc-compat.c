/* The glibc functions and data that the build machine's GCC runtime (libstdc++.a, libgcc_eh.a of GCC 12) and
 * headers (glibc 2.36) refer to but glibc 2.28 lacks, defined here for the manylinux_2_28 wheel
 * (LONGHAUL_GLIBC_FLOOR, ci/glibc-floor.sh). Compiled with -fvisibility=hidden and linked into every shared
 * library, module and tool of that build: each binary binds these names to its own copy, on every glibc (also on
 * newer ones, where the real functions exist), and exports none of them.
 * Everything else comes from glibc 2.28 itself: the build links against zig's glibc 2.28 stub libraries, whose
 * libc_nonshared.a also carries the stat/fstat/lstat wrappers (glibc < 2.33 exports only __xstat and kin) and
 * __libc_csu_init (glibc < 2.34 runs the executable's constructors from crt1.o). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/random.h>
#include <time.h>

/* glibc 2.32: nonzero while the process has one thread. 0 ("maybe threaded") only makes libstdc++ use atomic
 * reference counts always, which is what it did before 2.32. */
char __libc_single_threaded = 0;

/* glibc 2.35: the unwinder of GCC 12's libgcc_eh.a finds a PC's object with _dl_find_object and, when that fails,
 * gives up (no exception could be caught): the same answer from dl_iterate_phdr, as unwinders did before 2.35. */
struct longhaul_find {
    uintptr_t pc;
    struct dl_find_object *result;
    int found;
};

static int longhaul_find_cb(struct dl_phdr_info *info, size_t size, void *data) {
    struct longhaul_find *f = data;
    (void)size;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    int inside = 0;
    void *eh = NULL;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + p->p_vaddr;
        if (p->p_type == PT_LOAD) {
            uintptr_t end = start + p->p_memsz;
            if (start < lo) lo = start;
            if (end > hi) hi = end;
            if (f->pc >= start && f->pc < end) inside = 1;
        } else if (p->p_type == PT_GNU_EH_FRAME) {
            eh = (void *)start;
        }
    }
    if (!inside) return 0;
    f->result->dlfo_flags = 0;
    f->result->dlfo_map_start = (void *)lo;
    f->result->dlfo_map_end = (void *)hi;
    f->result->dlfo_link_map = NULL;
    f->result->dlfo_eh_frame = eh;
    f->found = 1;
    return 1;
}

int _dl_find_object(void *address, struct dl_find_object *result) {
    struct longhaul_find f = {(uintptr_t)address, result, 0};
    dl_iterate_phdr(longhaul_find_cb, &f);
    return f.found && result->dlfo_eh_frame ? 0 : -1;
}

/* glibc 2.36: std::random_device's default source in GCC 12's libstdc++.a. getrandom is glibc 2.25. */
static void longhaul_random(void *buf, size_t n) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            got = getrandom(p, n, GRND_NONBLOCK);  /* never blocks forever; the bytes are only a seed */
            if (got < 0) continue;
        }
        p += got;
        n -= (size_t)got;
    }
}

uint32_t arc4random(void) {
    uint32_t v;
    longhaul_random(&v, sizeof v);
    return v;
}

void arc4random_buf(void *buf, size_t n) { longhaul_random(buf, n); }

uint32_t arc4random_uniform(uint32_t upper) {
    if (upper < 2) return 0;
    uint32_t min = -upper % upper;  /* rejection sampling: no modulo bias */
    for (;;) {
        uint32_t r = arc4random();
        if (r >= min) return r % upper;
    }
}

/* glibc 2.30: the steady-clock waits of GCC 12's <condition_variable>, <mutex>, <shared_mutex> and <semaphore>
 * (std::condition_variable::wait_for / wait_until on steady_clock call pthread_cond_clockwait). Before 2.30
 * libstdc++ waited on the system clock: the same here, the deadline moved onto CLOCK_REALTIME. */
static struct timespec longhaul_realtime(clockid_t clock, const struct timespec *abstime) {
    if (clock == CLOCK_REALTIME) return *abstime;
    struct timespec now_clock, now_real, t;
    clock_gettime(clock, &now_clock);
    clock_gettime(CLOCK_REALTIME, &now_real);
    long long ns = (long long)(abstime->tv_sec - now_clock.tv_sec) * 1000000000LL + (abstime->tv_nsec - now_clock.tv_nsec);
    if (ns < 0) ns = 0;
    ns += now_real.tv_nsec;
    t.tv_sec = now_real.tv_sec + (time_t)(ns / 1000000000LL);
    t.tv_nsec = (long)(ns % 1000000000LL);
    return t;
}

int pthread_cond_clockwait(pthread_cond_t *cond, pthread_mutex_t *mutex, clockid_t clock, const struct timespec *abstime) {
    struct timespec t = longhaul_realtime(clock, abstime);
    return pthread_cond_timedwait(cond, mutex, &t);
}

int pthread_mutex_clocklock(pthread_mutex_t *mutex, clockid_t clock, const struct timespec *abstime) {
    struct timespec t = longhaul_realtime(clock, abstime);
    return pthread_mutex_timedlock(mutex, &t);
}

int pthread_rwlock_clockrdlock(pthread_rwlock_t *lock, clockid_t clock, const struct timespec *abstime) {
    struct timespec t = longhaul_realtime(clock, abstime);
    return pthread_rwlock_timedrdlock(lock, &t);
}

int pthread_rwlock_clockwrlock(pthread_rwlock_t *lock, clockid_t clock, const struct timespec *abstime) {
    struct timespec t = longhaul_realtime(clock, abstime);
    return pthread_rwlock_timedwrlock(lock, &t);
}

int sem_clockwait(sem_t *sem, clockid_t clock, const struct timespec *abstime) {
    struct timespec t = longhaul_realtime(clock, abstime);
    return sem_timedwait(sem, &t);
}

/* glibc 2.29: ggml's CPU backend asks which CPU (NUMA node) a thread runs on. The system call is older. */
#include <sys/syscall.h>
#include <unistd.h>
int getcpu(unsigned int *cpu, unsigned int *node) { return (int)syscall(SYS_getcpu, cpu, node, NULL); }

/* glibc 2.29: common's subprocess helper (the server's child processes) spawns in a given folder. Before 2.29 there
 * is no way to ask posix_spawn for it: the real function when this glibc has it, else ENOSYS (that spawn fails). */
#include <spawn.h>
int posix_spawn_file_actions_addchdir_np(posix_spawn_file_actions_t *actions, const char *path) {
    typedef int (*fn_t)(posix_spawn_file_actions_t *, const char *);
    fn_t real = (fn_t)dlsym(RTLD_DEFAULT, "posix_spawn_file_actions_addchdir_np");
    return real && real != posix_spawn_file_actions_addchdir_np ? real(actions, path) : ENOSYS;
}
