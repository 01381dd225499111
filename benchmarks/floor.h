/* What the C floors of the benchmarks (latency_floor.c, path_floor.c) share: argument parsing, the
 * clock, pinning, percentiles, shared mappings, children that die with their parent and the doorbell
 * protocol of chronq's readers.
 *
 * A program defines FLOOR_PROGRAM (its name) and FLOOR_USAGE (its usage line) before including this. */
#ifndef CHRONQ_BENCH_FLOOR_H
#define CHRONQ_BENCH_FLOOR_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, FLOOR_PROGRAM ": %s: %s\n", what, strerror(errno));
    exit(1);
}

static void usage(const char *why) {
    fprintf(stderr, FLOOR_PROGRAM ": %s\nusage: " FLOOR_USAGE "\n", why);
    exit(2);
}

static long parse_long(const char *s, const char *name, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s must be an integer in [%ld, %ld], got '%s'", name, lo, hi, s);
        usage(msg);
    }
    return v;
}

static int64_t now_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        die("clock_gettime(CLOCK_MONOTONIC)");
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Runs the calling process on `cpu` alone (-1: anywhere). */
static void pin(long cpu, const char *who) {
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((size_t)cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        char what[64];
        snprintf(what, sizeof what, "sched_setaffinity(%s to CPU %ld)", who, cpu);
        die(what);
    }
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Same pick as the benchmarks' Python: the sorted sample at floor(per / of * n). */
static int64_t pick(const int64_t *sorted, size_t n, size_t per, size_t of) {
    size_t i = n / of * per + n % of * per / of;
    return sorted[i < n ? i : n - 1];
}

/* Touches every page of a mapping (`write`: allocates the file's pages), so that the run meets no
 * page fault (chronq prefaults its writer's pages too). */
static void fault_in(volatile unsigned char *base, size_t size, int write) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        page = 4096;
    for (size_t off = 0; off < size; off += (size_t)page) {
        if (write)
            base[off] = 0;
        else
            (void)base[off];
    }
}

/* In a forked child: dies with the process that forked it (`parent`), so that it is never left
 * spinning or waiting for ever when the driver goes away, even if that happened before this call. */
static void die_with(pid_t parent) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        die("prctl(PR_SET_PDEATHSIG)");
    if (getppid() != parent)
        _exit(1);
}

/* A shared mapping of `size` bytes of the file `path` (made anew), every page allocated and faulted in
 * before the run: the processes forked after it only map them. */
static unsigned char *shared_mapping(const char *path, size_t size) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        die(path);
    if (ftruncate(fd, (off_t)size) != 0)
        die("ftruncate");
    unsigned char *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        die("mmap");
    if (close(fd) != 0)
        die("close");
    fault_in(base, size, 1);
    return base;
}

/* chronq's doorbell: a sleeper says it waits (a seq_cst store of `waiting`), reads the bell's
 * sequence, looks at `word` once more and sleeps in FUTEX_WAIT on the sequence while `word` is 0
 * (shared, not FUTEX_PRIVATE: the processes share a file mapping) ... */
static void doorbell_sleep(uint32_t *bell, uint32_t *waiting, const uint32_t *word) {
    __atomic_store_n(waiting, 1, __ATOMIC_SEQ_CST);
    uint32_t seen = __atomic_load_n(bell, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == 0)
        syscall(SYS_futex, bell, FUTEX_WAIT, seen, NULL, NULL, 0);
    __atomic_store_n(waiting, 0, __ATOMIC_RELAXED);
}

/* ... and a publisher, after its release store, that sees a waiter moves the sequence on and wakes it. */
static void doorbell_ring(uint32_t *bell, uint32_t *waiting) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the publication before the load (chronq's is a CAS) */
    if (__atomic_load_n(waiting, __ATOMIC_SEQ_CST)) {
        __atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

#endif
