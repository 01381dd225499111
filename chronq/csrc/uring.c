/* A futex wait completed into an eventfd by io_uring (see uring.h). */
#define _GNU_SOURCE
#include "uring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__linux__) && defined(__has_include)
#if __has_include(<linux/io_uring.h>) && defined(SYS_io_uring_setup) && defined(SYS_io_uring_enter) && \
    defined(SYS_io_uring_register)
#define HAVE_URING 1
#endif
#endif

#ifdef HAVE_URING
#include <linux/io_uring.h>

enum {
    ENTRIES = 4,          /* at most two submissions at once: a cancel and a wait */
    OP_FUTEX_WAIT = 51,   /* IORING_OP_FUTEX_WAIT (Linux 6.7); older headers do not name it */
    SIZE_U32 = 0x02,      /* FUTEX2_SIZE_U32; no FUTEX2_PRIVATE: the word is in a shared file mapping */
};

static void unmap(Uring *u) {
    if (u->sqes) munmap(u->sqes, u->sqes_len);
    if (u->cq_map && u->cq_map != u->sq_map) munmap(u->cq_map, u->cq_len);
    if (u->sq_map) munmap(u->sq_map, u->sq_len);
    u->sqes = u->sq_map = u->cq_map = NULL;
}

static int supports_futex_wait(int fd) {
    size_t len = sizeof(struct io_uring_probe) + 256 * sizeof(struct io_uring_probe_op);
    struct io_uring_probe *p = calloc(1, len);
    if (!p) return 0;
    int ok = syscall(SYS_io_uring_register, fd, IORING_REGISTER_PROBE, p, 256) == 0 && p->last_op >= OP_FUTEX_WAIT &&
             (p->ops[OP_FUTEX_WAIT].flags & IO_URING_OP_SUPPORTED) &&
             (p->ops[IORING_OP_ASYNC_CANCEL].flags & IO_URING_OP_SUPPORTED);
    free(p);
    return ok;
}

int uring_open(Uring *u, int efd) {
    memset(u, 0, sizeof *u);
    u->fd = -1;
    u->next_id = 1;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int fd = (int)syscall(SYS_io_uring_setup, ENTRIES, &p);
    if (fd < 0) return errno;
    int e = ENOSYS;
    if (!supports_futex_wait(fd) || !(p.features & IORING_FEAT_NODROP)) goto fail;
    u->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    u->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) u->sq_len = u->cq_len = u->sq_len > u->cq_len ? u->sq_len : u->cq_len;
    u->sq_map = mmap(NULL, u->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (u->sq_map == MAP_FAILED) {
        u->sq_map = NULL;
        e = errno;
        goto fail;
    }
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        u->cq_map = u->sq_map;
    } else {
        u->cq_map = mmap(NULL, u->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
        if (u->cq_map == MAP_FAILED) {
            u->cq_map = NULL;
            e = errno;
            goto fail;
        }
    }
    u->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    u->sqes = mmap(NULL, u->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (u->sqes == MAP_FAILED) {
        u->sqes = NULL;
        e = errno;
        goto fail;
    }
    char *sq = u->sq_map, *cq = u->cq_map;
    u->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    u->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    u->sq_array = (unsigned *)(sq + p.sq_off.array);
    u->cq_head = (unsigned *)(cq + p.cq_off.head);
    u->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    u->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    u->cq_flags = p.cq_off.flags ? (unsigned *)(cq + p.cq_off.flags) : NULL;
    u->cqes = cq + p.cq_off.cqes;
    if (!u->cq_flags) goto fail; /* (before 5.8: no way to cancel without a wake-up) */
    if (syscall(SYS_io_uring_register, fd, IORING_REGISTER_EVENTFD, &efd, 1) != 0) {
        e = errno;
        goto fail;
    }
    u->fd = fd;
    return 0;
fail:
    unmap(u);
    close(fd);
    return e;
}

void uring_close(Uring *u) {
    if (u->fd < 0) return;
    unmap(u);
    close(u->fd); /* ends what is in flight */
    u->fd = -1;
    u->wait_id = 0;
}

/* the next submission queue entry, zeroed; push() publishes it (one thread submits) */
static struct io_uring_sqe *next_sqe(Uring *u, unsigned *at) {
    unsigned t = *u->sq_tail + *at;
    unsigned i = t & *u->sq_mask;
    struct io_uring_sqe *s = (struct io_uring_sqe *)u->sqes + i;
    memset(s, 0, sizeof *s);
    u->sq_array[i] = i;
    (*at)++;
    return s;
}

/* publish `n` filled entries and submit them: 0 or an errno (the ring is then closed) */
static int push(Uring *u, unsigned n) {
    __atomic_store_n(u->sq_tail, *u->sq_tail + n, __ATOMIC_RELEASE);
    for (;;) {
        long r = syscall(SYS_io_uring_enter, u->fd, n, 0, 0, NULL, 0);
        if (r == (long)n) return 0;
        if (r < 0 && errno == EINTR) continue;
        int e = r < 0 ? errno : EIO; /* (a part submitted: cannot happen with room for all) */
        uring_close(u);
        u->failed = e;
        return e;
    }
}

static void quiet(Uring *u, int on) {
    unsigned f = __atomic_load_n(u->cq_flags, __ATOMIC_RELAXED);
    f = on ? f | IORING_CQ_EVENTFD_DISABLED : f & ~IORING_CQ_EVENTFD_DISABLED;
    __atomic_store_n(u->cq_flags, f, __ATOMIC_SEQ_CST);
}

int uring_reap(Uring *u) {
    if (u->fd < 0) return 0;
    int ended = 0;
    unsigned h = *u->cq_head, t = __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE);
    for (; h != t; h++) {
        const struct io_uring_cqe *c = (const struct io_uring_cqe *)u->cqes + (h & *u->cq_mask);
        if (!u->wait_id || c->user_data != u->wait_id) continue; /* a cancel's own completion */
        u->wait_id = 0;
        ended = 1;
        int res = c->res; /* 0 woken; -EAGAIN the value had moved; -ECANCELED; anything else: give up */
        if (res < 0 && res != -EAGAIN && res != -ECANCELED && res != -EINTR) u->failed = -res;
    }
    __atomic_store_n(u->cq_head, h, __ATOMIC_RELEASE);
    if (u->failed) uring_close(u);
    return ended;
}

static void cancel_entry(Uring *u, unsigned *at) {
    struct io_uring_sqe *s = next_sqe(u, at);
    s->opcode = IORING_OP_ASYNC_CANCEL;
    s->addr = u->wait_id;
    s->user_data = u->next_id++;
}

int uring_wait(Uring *u, const uint32_t *addr, uint32_t val, int efd) {
    uring_reap(u);
    if (u->fd < 0) return u->failed ? u->failed : ENOSYS;
    if (u->wait_id && u->wait_addr == addr && u->wait_val == val) return 0; /* the same wait: keep it */
    int replace = u->wait_id != 0;
    unsigned n = 0;
    if (replace) { /* no wake-up for the cancelled wait */
        quiet(u, 1);
        cancel_entry(u, &n);
    }
    struct io_uring_sqe *s = next_sqe(u, &n);
    s->opcode = OP_FUTEX_WAIT;
    s->addr = (uintptr_t)addr;
    s->addr2 = val;
    s->addr3 = 0xffffffffu; /* FUTEX_BITSET_MATCH_ANY: the waker's plain FUTEX_WAKE */
    s->fd = SIZE_U32;
    uint64_t id = s->user_data = u->next_id++;
    u->wait_id = 0; /* (the old one is cancelled: its completion is not this wait's) */
    int e = push(u, n);
    if (replace && u->fd >= 0) quiet(u, 0);
    if (e) return e;
    u->wait_id = id;
    u->wait_addr = addr;
    u->wait_val = val;
    if (replace && uring_reap(u)) { /* it ended while the eventfd was quiet: signal it here */
        uint64_t one = 1;
        while (write(efd, &one, sizeof one) < 0 && errno == EINTR) {
        }
    }
    return u->fd >= 0 || !u->failed ? 0 : u->failed;
}

void uring_cancel(Uring *u) {
    uring_reap(u);
    if (u->fd < 0 || !u->wait_id) return;
    unsigned n = 0;
    quiet(u, 1);
    cancel_entry(u, &n);
    u->wait_id = 0;
    if (push(u, n) == 0) quiet(u, 0);
    uring_reap(u);
}

#else /* no io_uring here: every caller waits the old way */

int uring_open(Uring *u, int efd) {
    (void)efd;
    memset(u, 0, sizeof *u);
    u->fd = -1;
    return ENOSYS;
}
void uring_close(Uring *u) { u->fd = -1; }
int uring_reap(Uring *u) {
    (void)u;
    return 0;
}
int uring_wait(Uring *u, const uint32_t *addr, uint32_t val, int efd) {
    (void)u, (void)addr, (void)val, (void)efd;
    return ENOSYS;
}
void uring_cancel(Uring *u) { (void)u; }

#endif
