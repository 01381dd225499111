/* The latency floor of this machine for bench_queue's one-way latency table: the same hand-off as a
 * chronq writer and a busy-spinning tailer in two processes, with no Python and no queue format.
 *
 * A writer process paces messages at RATE per second (CLOCK_MONOTONIC busy wait), copies each
 * 40-byte message (its first 8 bytes the send time) into the next 64-byte slot of a shared file
 * mapping and publishes it with a release store of the slot's header word; a forked reader spins with
 * acquire loads on the next slot's header and records receive time - send time. The slots are
 * append-only, as in a queue, so every message lands on memory the other side has not seen yet.
 * Both sides fault the whole mapping in before the run: the floor leaves out page faults (chronq
 * prefaults its writer's pages too).
 *
 * Whatever this program gets is what any implementation of the hand-off gets on this machine, so
 * the percentiles it prints above a target are the machine's, not the queue's.
 *
 * It also says where the reader's time went. Its spin loop reads the clock on every turn (which
 * delays seeing a message by at most one clock read), so a turn longer than STALL_NS is a stretch in
 * which the reader did not run. A stall with a new involuntary context switch was the guest's
 * scheduler running something else on the reader's CPU; a stall without one was invisible to the
 * guest: the hypervisor ran something else in place of this vCPU, or an interrupt took the CPU.
 *
 * With --futex the reader sleeps instead of spinning, as a chronq reader on the queue's doorbell does
 * (bench_wakeup's floor): finding the next slot empty, it says it waits (a seq_cst store of a waiter
 * flag), reads the bell's sequence, looks at the slot once more and sleeps in futex(FUTEX_WAIT) on
 * the sequence (shared, not FUTEX_PRIVATE: the processes share a file mapping); the writer, after
 * publishing, loads the flag and, when set, moves the sequence on and calls FUTEX_WAKE.
 *
 * Usage: latency_floor [--futex] FILE SAMPLES RATE [WRITER_CPU READER_CPU]   (a CPU of -1: not pinned)
 * Prints one line of fields separated by spaces: p50 p99 p99.9 max (ns); the hypervisor's steal time
 * during the run as a percentage of all CPU time (from /proc/stat; "nan" where that is not
 * available); the reader's involuntary context switches and the total of their stalls (ns); and its
 * stalls without one: how many, their total and the longest (ns). Linux only.
 */
#define _GNU_SOURCE
#include <math.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>

#define FLOOR_PROGRAM "latency_floor"
#define FLOOR_USAGE "latency_floor [--futex] FILE SAMPLES RATE [WRITER_CPU READER_CPU]"
#include "floor.h"

enum { SLOT = 64, MSG = 40, CONTROL = 128 };
#define MAX_SAMPLES 100000000L /* 6.4 GB of slots: far beyond any sensible run */
#define STALL_NS 10000         /* the p99 target: a longer stall alone puts a sample above it */

/* The mapping starts with this block, shared by both processes; message i is in the slot at
 * CONTROL + i * SLOT. The mapping is page aligned, so every field and every slot header is aligned. */
struct control {
    uint32_t reader_ready; /* set (release) once the reader has faulted in the mapping and spins */
    uint32_t done;         /* set (release) by the reader once the results below are written */
    int64_t p50, p99, p999, max;
    int64_t preempted, preempted_ns;           /* involuntary context switches, their stalls' time */
    int64_t stalls, stalled_ns, longest_stall; /* stalls without one (see the top of this file) */
    uint32_t bell;    /* --futex: the sequence the reader sleeps on */
    uint32_t waiting; /* --futex: set while the reader is about to sleep or asleep */
};
_Static_assert(sizeof(struct control) <= CONTROL, "the control block must fit before the slots");

/* The aggregate "cpu" line of /proc/stat: steal and total jiffies (guest time is already part of
 * user time, so the total is the first eight fields). Returns 0 when unavailable. */
static int read_steal(unsigned long long *steal, unsigned long long *total) {
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL)
        return 0;
    unsigned long long v[8];
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n != 8)
        return 0;
    *total = 0;
    for (int i = 0; i < 8; i++)
        *total += v[i];
    *steal = v[7];
    return 1;
}

/* Charges the reader's turn from `last` to `now` to a stall when it took longer than STALL_NS; returns
 * the time the next turn starts from. */
static int64_t turn(int64_t last, int64_t now, long *switches, struct control *ctl) {
    if (now - last <= STALL_NS)
        return now;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        die("getrusage");
    if (ru.ru_nivcsw != *switches) { /* preempted in the guest: ru_nivcsw counts it */
        *switches = ru.ru_nivcsw;
        ctl->preempted_ns += now - last;
    } else {
        ctl->stalls++;
        ctl->stalled_ns += now - last;
        if (now - last > ctl->longest_stall)
            ctl->longest_stall = now - last;
    }
    return now_ns(); /* getrusage's own time is not the machine's */
}

static int use_futex = 0;

static void reader(unsigned char *base, size_t size, size_t samples, long cpu, pid_t writer) {
    die_with(writer);
    pin(cpu, "reader");
    int64_t *lat = malloc(samples * sizeof *lat);
    if (lat == NULL)
        die("malloc(samples)");
    memset(lat, 0, samples * sizeof *lat); /* allocated and touched before the run, like the writer */
    fault_in(base, size, 0);
    struct control *ctl = (struct control *)base;
    struct rusage before;
    if (getrusage(RUSAGE_SELF, &before) != 0)
        die("getrusage");
    long switches = before.ru_nivcsw;
    __atomic_store_n(&ctl->reader_ready, 1, __ATOMIC_RELEASE);

    int64_t last = now_ns();
    for (size_t i = 0; i < samples; i++) {
        unsigned char *slot = base + CONTROL + i * SLOT;
        while (__atomic_load_n((uint32_t *)slot, __ATOMIC_ACQUIRE) == 0) {
            if (use_futex) {
                doorbell_sleep(&ctl->bell, &ctl->waiting, (const uint32_t *)slot);
                last = now_ns(); /* a sleep is not a stall */
            } else {
                last = turn(last, now_ns(), &switches, ctl);
            }
        }
        int64_t sent;
        memcpy(&sent, slot + 8, sizeof sent);
        int64_t received = now_ns();
        lat[i] = received - sent;
        last = turn(last, received, &switches, ctl);
    }

    struct rusage after;
    if (getrusage(RUSAGE_SELF, &after) != 0)
        die("getrusage");
    ctl->preempted = after.ru_nivcsw - before.ru_nivcsw;
    qsort(lat, samples, sizeof *lat, cmp_i64);
    ctl->p50 = pick(lat, samples, 50, 100);
    ctl->p99 = pick(lat, samples, 99, 100);
    ctl->p999 = pick(lat, samples, 999, 1000);
    ctl->max = lat[samples - 1];
    __atomic_store_n(&ctl->done, 1, __ATOMIC_RELEASE);
    free(lat);
    _exit(0);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--futex") == 0) {
        use_futex = 1;
        argv++;
        argc--;
    }
    if (argc != 4 && argc != 6)
        usage("wrong number of arguments");
    const char *path = argv[1];
    size_t samples = (size_t)parse_long(argv[2], "SAMPLES", 1, MAX_SAMPLES);
    long rate = parse_long(argv[3], "RATE", 1, 1000000000L);
    long wcpu = -1, rcpu = -1;
    if (argc == 6) {
        wcpu = parse_long(argv[4], "WRITER_CPU", -1, CPU_SETSIZE - 1);
        rcpu = parse_long(argv[5], "READER_CPU", -1, CPU_SETSIZE - 1);
    }

    size_t size = CONTROL + samples * SLOT;
    unsigned char *base = shared_mapping(path, size);
    struct control *ctl = (struct control *)base;

    fflush(stdout);
    pid_t writer = getpid();
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0)
        reader(base, size, samples, rcpu, writer);

    pin(wcpu, "writer");
    int status = 0, reaped = 0;
    while (__atomic_load_n(&ctl->reader_ready, __ATOMIC_ACQUIRE) == 0) {
        pid_t r = waitpid(child, &status, WNOHANG); /* the reader may fail before it gets ready */
        if (r < 0)
            die("waitpid");
        if (r == child) {
            reaped = 1;
            break;
        }
    }

    unsigned long long steal0 = 0, total0 = 0, steal1 = 0, total1 = 0;
    int have_steal = read_steal(&steal0, &total0);
    unsigned char msg[MSG];
    memset(msg, 'p', sizeof msg);
    int64_t period = 1000000000L / rate, next = now_ns();
    for (size_t i = 0; i < samples && !reaped; i++) {
        while (now_ns() < next) {
        }
        next += period;
        unsigned char *slot = base + CONTROL + i * SLOT;
        int64_t sent = now_ns();
        memcpy(msg, &sent, sizeof sent);
        memcpy(slot + 8, msg, sizeof msg);
        __atomic_store_n((uint32_t *)slot, (uint32_t)MSG, __ATOMIC_RELEASE);
        if (use_futex)
            doorbell_ring(&ctl->bell, &ctl->waiting);
    }
    while (!reaped && waitpid(child, &status, 0) < 0) {
        if (errno != EINTR)
            die("waitpid");
    }
    have_steal = have_steal && read_steal(&steal1, &total1);

    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        !__atomic_load_n(&ctl->done, __ATOMIC_ACQUIRE)) {
        fprintf(stderr, "latency_floor: the reader process failed (%s %d)\n",
                WIFSIGNALED(status) ? "signal" : "exit status",
                WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        return 1;
    }
    double steal = NAN;
    if (have_steal && total1 > total0)
        steal = 100.0 * (double)(steal1 - steal0) / (double)(total1 - total0);
    printf("%lld %lld %lld %lld %.1f %lld %lld %lld %lld %lld\n", (long long)ctl->p50,
           (long long)ctl->p99, (long long)ctl->p999, (long long)ctl->max, steal,
           (long long)ctl->preempted, (long long)ctl->preempted_ns, (long long)ctl->stalls,
           (long long)ctl->stalled_ns, (long long)ctl->longest_stall);
    if (munmap(base, size) != 0)
        die("munmap");
    return 0;
}
