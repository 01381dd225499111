/* The floor of bench_replication's lag case on this machine: the same path with nothing spinning, in
 * C, with no Python, no queue format and no frames.
 *
 * Four processes, as in the lag case (two per host): a writer paces 40-byte messages (the first 8
 * bytes its send time) at RATE per second, sleeping until each is due (clock_nanosleep, 1 us timer
 * slack), and publishes each into the next 64-byte slot of a shared mapping; a source process sleeps
 * on that mapping's doorbell (a futex), wakes, sends every message published since its last look in
 * one send() on a TCP connection over 127.0.0.1; a sink process blocks in recv(), publishes each
 * whole message into a second mapping and rings its doorbell; a reader sleeps on that doorbell and
 * records receive time - send time. The doorbells follow chronq's protocol (floor.h).
 *
 * The writer and the sink run on one CPU, the source and the reader on the other (as the lag case
 * pins them): each hop crosses to the other CPU. Three sleeping hand-offs are on the path (writer to
 * source, source to sink through the socket, sink to reader); what this program measures is what any
 * implementation of the path gets here, so a target below its percentiles is the machine's limit,
 * not chronq's.
 *
 * Usage: path_floor DIR SAMPLES RATE [CPU_A CPU_B]   (a CPU of -1: not pinned; DIR holds the two
 * mappings). Prints one line: p50 p99 p99.9 max of the reader's lags (ns). Linux only.
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>

#define FLOOR_PROGRAM "path_floor"
#define FLOOR_USAGE "path_floor DIR SAMPLES RATE [CPU_A CPU_B]"
#include "floor.h"

enum { SLOT = 64, MSG = 40, CONTROL = 128 };
#define MAX_SAMPLES 10000000L

struct control {
    uint32_t ready;   /* processes that have faulted in their mappings and are about to wait */
    uint32_t bell;    /* the sequence a sleeper waits on */
    uint32_t waiting; /* set while a sleeper is about to sleep or asleep */
    uint32_t done;    /* the reader's results below are written */
    int64_t p50, p99, p999, max;
};
_Static_assert(sizeof(struct control) <= CONTROL, "the control block must fit before the slots");

static unsigned char *mapping(const char *dir, const char *name, size_t size) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        die(dir);
    }
    return shared_mapping(path, size);
}

static uint32_t *slot_at(unsigned char *base, size_t i) {
    return (uint32_t *)(base + CONTROL + i * SLOT);
}

static void publish(unsigned char *base, size_t i, const unsigned char *msg) {
    memcpy(base + CONTROL + i * SLOT + 8, msg, MSG);
    __atomic_store_n(slot_at(base, i), (uint32_t)MSG, __ATOMIC_RELEASE);
}

/* Sleeps until slot `i` of `base` is published. */
static void wait_for(unsigned char *base, size_t i) {
    struct control *ctl = (struct control *)base;
    while (__atomic_load_n(slot_at(base, i), __ATOMIC_ACQUIRE) == 0)
        doorbell_sleep(&ctl->bell, &ctl->waiting, slot_at(base, i));
}

static pid_t driver; /* the writer, which forks the others */

static void child_setup(long cpu, struct control *a) {
    die_with(driver);
    pin(cpu, "a process of the path");
    __atomic_fetch_add(&a->ready, 1, __ATOMIC_RELEASE);
}

static void source(unsigned char *in, size_t samples, int sock, long cpu) {
    child_setup(cpu, (struct control *)in);
    unsigned char buf[64 * MSG];
    for (size_t i = 0; i < samples;) {
        wait_for(in, i);
        size_t n = 0;
        while (i < samples && n < sizeof buf / MSG && __atomic_load_n(slot_at(in, i), __ATOMIC_ACQUIRE)) {
            memcpy(buf + n * MSG, in + CONTROL + i * SLOT + 8, MSG);
            n++, i++;
        }
        for (size_t off = 0; off < n * MSG;) {
            ssize_t k = send(sock, buf + off, n * MSG - off, MSG_NOSIGNAL);
            if (k < 0)
                die("send");
            off += (size_t)k;
        }
    }
    _exit(0);
}

static void sink(unsigned char *out, size_t samples, int sock, long cpu, struct control *a) {
    child_setup(cpu, a);
    struct control *ctl = (struct control *)out;
    unsigned char buf[65536];
    size_t have = 0, i = 0;
    while (i < samples) {
        ssize_t k = recv(sock, buf + have, sizeof buf - have, 0);
        if (k <= 0)
            die("recv");
        have += (size_t)k;
        size_t used = 0;
        for (; have - used >= MSG; used += MSG)
            publish(out, i++, buf + used);
        memmove(buf, buf + used, have - used);
        have -= used;
        doorbell_ring(&ctl->bell, &ctl->waiting);
    }
    _exit(0);
}

static void reader(unsigned char *in, size_t samples, long cpu, struct control *a) {
    child_setup(cpu, a);
    int64_t *lat = calloc(samples, sizeof *lat);
    if (lat == NULL)
        die("calloc");
    for (size_t i = 0; i < samples; i++) {
        wait_for(in, i);
        int64_t sent;
        memcpy(&sent, in + CONTROL + i * SLOT + 8, sizeof sent);
        lat[i] = now_ns() - sent;
    }
    qsort(lat, samples, sizeof *lat, cmp_i64);
    struct control *ctl = (struct control *)in;
    ctl->p50 = pick(lat, samples, 50, 100);
    ctl->p99 = pick(lat, samples, 99, 100);
    ctl->p999 = pick(lat, samples, 999, 1000);
    ctl->max = lat[samples - 1];
    __atomic_store_n(&ctl->done, 1, __ATOMIC_RELEASE);
    _exit(0);
}

/* A process of the path failed (it said why on stderr): the others, blocked for ever on what it was to
 * send, die with this one (PR_SET_PDEATHSIG). */
static void fail(int status) {
    fprintf(stderr, "path_floor: a process of the path failed (%s %d)\n",
            WIFSIGNALED(status) ? "signal" : "exit status",
            WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 6)
        usage("wrong number of arguments");
    size_t samples = (size_t)parse_long(argv[2], "SAMPLES", 1, MAX_SAMPLES);
    long rate = parse_long(argv[3], "RATE", 1, 10000000L);
    long cpu_a = -1, cpu_b = -1;
    if (argc == 6) {
        cpu_a = parse_long(argv[4], "CPU_A", -1, CPU_SETSIZE - 1);
        cpu_b = parse_long(argv[5], "CPU_B", -1, CPU_SETSIZE - 1);
    }
    size_t size = CONTROL + samples * SLOT;
    unsigned char *src = mapping(argv[1], "source.map", size), *dst = mapping(argv[1], "sink.map", size);
    struct control *a = (struct control *)src, *b = (struct control *)dst;

    int srv = socket(AF_INET, SOCK_STREAM, 0), conn = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (srv < 0 || conn < 0 || bind(srv, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(srv, 1) != 0 ||
        getsockname(srv, (struct sockaddr *)&addr, &len) != 0 ||
        connect(conn, (struct sockaddr *)&addr, sizeof addr) != 0)
        die("a TCP connection on 127.0.0.1");
    int accepted = accept(srv, NULL, NULL);
    if (accepted < 0)
        die("accept");
    setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(accepted, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

    fflush(stdout);
    driver = getpid();
    for (int k = 0; k < 3; k++) {
        pid_t kid = fork();
        if (kid < 0)
            die("fork");
        if (kid == 0) {
            if (k == 0)
                source(src, samples, conn, cpu_b);
            else if (k == 1)
                sink(dst, samples, accepted, cpu_a, a);
            else
                reader(dst, samples, cpu_b, a);
        }
    }
    close(conn);
    close(accepted);
    close(srv);
    pin(cpu_a, "the writer");
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    while (__atomic_load_n(&a->ready, __ATOMIC_ACQUIRE) < 3) { /* every process is up before the first */
        int status;
        if (waitpid(-1, &status, WNOHANG) != 0) /* one failed first: its kin die with this process */
            fail(status);
        usleep(1000);
    }
    usleep(20000); /* and asleep */

    unsigned char msg[MSG];
    memset(msg, 'p', sizeof msg);
    int64_t period = 1000000000L / rate, due = now_ns();
    for (size_t i = 0; i < samples; i++) {
        due += period;
        struct timespec ts = {.tv_sec = due / 1000000000, .tv_nsec = due % 1000000000};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
        int64_t sent = now_ns();
        memcpy(msg, &sent, sizeof sent);
        publish(src, i, msg);
        doorbell_ring(&a->bell, &a->waiting);
    }
    for (int k = 0; k < 3; k++) { /* in the order they end: the first to fail ends the run */
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail(status);
    }
    if (!__atomic_load_n(&b->done, __ATOMIC_ACQUIRE)) {
        fprintf(stderr, "path_floor: the reader ended without its results\n");
        return 1;
    }
    printf("%lld %lld %lld %lld\n", (long long)b->p50, (long long)b->p99, (long long)b->p999,
           (long long)b->max);
    return 0;
}
