/* Wall-clock offset for redis-server under the jepsen clock nemesis (LD_PRELOAD).
 *
 * libfaketime (Debian's faketime) would be the usual tool, but it deadlocks against
 * jemalloc, which Debian's redis-server is linked with (libfaketime issues #130/#327: both
 * call clock_gettime during their initialisation). This shim never allocates and never
 * calls dlsym: it reads the clocks with raw syscalls and adds an offset, in milliseconds,
 * read from the file named by JEPSEN_CLOCK_FILE (re-read at most every 20 ms).
 * Only CLOCK_REALTIME(_COARSE), gettimeofday and time are shifted; monotonic clocks are not.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile long long offset_ns = 0;
static volatile long long checked_at = -1000000000000LL;

static long long mono_ns(void) {
    struct timespec t;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void refresh(void) {
    long long now = mono_ns();
    if (now - checked_at < 20000000LL) return;
    checked_at = now;
    const char *p = getenv("JEPSEN_CLOCK_FILE");
    if (!p) return;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, p, O_RDONLY);
    if (fd < 0) return;
    char buf[64];
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return;
    buf[n] = 0;
    int i = 0, neg = 0, digits = 0;
    long long v = 0;
    while (buf[i] == ' ' || buf[i] == '+') i++;
    if (buf[i] == '-') { neg = 1; i++; }
    while (buf[i] >= '0' && buf[i] <= '9' && digits < 15) { v = v * 10 + (buf[i] - '0'); i++; digits++; }
    if (!digits) return;
    offset_ns = (neg ? -v : v) * 1000000LL;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    if (r == 0 && ts && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
        refresh();
        long long t = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns;
        ts->tv_sec = t / 1000000000LL;
        ts->tv_nsec = t % 1000000000LL;
    }
    return r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
