/* A futex wait that ends by making an eventfd readable, with no thread of ours in between: an io_uring
 * of the event loop's thread with one FUTEX_WAIT in flight (Linux 6.7+), its completions signalling the
 * eventfd the loop watches (IORING_REGISTER_EVENTFD). The writer's FUTEX_WAKE completes the wait in the
 * kernel and the loop's thread is the only one woken.
 *
 * Not thread-safe: one thread submits (the ring's completions run as task work of the submitting
 * thread, which the kernel interrupts for it). Where io_uring is missing, disabled (sysctl
 * kernel.io_uring_disabled, a seccomp filter) or has no FUTEX_WAIT, uring_open fails and the caller
 * waits the old way. */
#ifndef CHRONQ_URING_H
#define CHRONQ_URING_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int fd; /* -1: none */
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask, *cq_flags;
    void *sqes, *cqes;
    void *sq_map, *cq_map;
    size_t sq_len, cq_len, sqes_len;
    uint64_t next_id;   /* user_data of the next submission (never 0) */
    uint64_t wait_id;   /* the futex wait in flight (0: none) */
    const uint32_t *wait_addr;
    uint32_t wait_val;
    int failed;         /* errno of a wait that ended with an error: no more waits through the ring */
} Uring;

/* Set up `u` with completions signalling `efd`: 0, or an errno (u->fd stays -1). */
int uring_open(Uring *u, int efd);
/* Close the ring; its wait in flight ends without signalling. */
void uring_close(Uring *u);
/* Consume the completions; 1 if the wait in flight ended (woken, the value had moved, cancelled). */
int uring_reap(Uring *u);
/* Have the eventfd made readable once the 32-bit shared futex word at `addr` no longer holds `val`
 * (or is woken). A wait in flight on the same word and value is kept; another is cancelled first,
 * without a wake-up. 0, or an errno (nothing in flight then: wait another way). */
int uring_wait(Uring *u, const uint32_t *addr, uint32_t val, int efd);
/* End the wait in flight without a wake-up. */
void uring_cancel(Uring *u);

#endif
