/* The doorbell's futex protocol (see doorbell.h for the word, chronq/doorbell.py for the design). */
#define PY_SSIZE_T_CLEAN
#include "doorbell.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define COUNT(v) (((v) >> DOORBELL_COUNT_SHIFT) & DOORBELL_COUNT_MAX)
#define EPOCH(v) ((int64_t)(((v) >> DOORBELL_EPOCH_SHIFT) & DOORBELL_EPOCH_MASK))

/* the sequence half of the word: the futex word */
static inline uint32_t *seq_word(uint64_t *w) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return (uint32_t *)w;
#else
    return (uint32_t *)w + 1;
#endif
}

/* FUTEX_WAKE without FUTEX_PRIVATE_FLAG: sleepers in other processes map the same file */
static long futex_wake(uint64_t *w) { return syscall(SYS_futex, seq_word(w), FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

void doorbell_ring_slow(uint64_t *w, uint64_t v) {
    uint64_t n;
    do {
        if (!COUNT(v)) return;
        n = (v & ~DOORBELL_SEQ_MASK) | ((v + 1) & DOORBELL_SEQ_MASK);
    } while (!__atomic_compare_exchange_n(w, &v, n, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    if (futex_wake(w) != 0) return;
    /* Nobody was asleep: the armed waiters are awake (looking, and they look again before they sleep:
       they re-arm first) or dead (killed while armed). Clear the count under a new epoch, moving the
       sequence on again so that a waiter on its way into the kernel returns at once, and wake whoever
       got in meanwhile. Later appends cost one load again until someone arms. */
    v = n;
    uint64_t r = ((uint64_t)((EPOCH(n) + 1) & DOORBELL_EPOCH_MASK) << DOORBELL_EPOCH_SHIFT) |
                 ((n + 1) & DOORBELL_SEQ_MASK);
    if (__atomic_compare_exchange_n(w, &v, r, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) futex_wake(w);
}

void doorbell_clear(DoorbellRef *d) {
    d->word = NULL;
    d->probe = NULL;
    if (d->has_view) {
        d->has_view = 0;
        PyBuffer_Release(&d->view);
    }
}

int doorbell_set(DoorbellRef *d, PyObject *buf, Py_ssize_t word_off, Py_ssize_t probe_off) {
    doorbell_clear(d);
    if (buf == Py_None) return 0;
    if (PyObject_GetBuffer(buf, &d->view, PyBUF_WRITABLE) < 0) return -1;
    d->has_view = 1;
    char *base = (char *)d->view.buf;
    Py_ssize_t len = d->view.len;
    if (word_off >= 0) {
        if (word_off > len - 8 || ((uintptr_t)(base + word_off) & 7)) {
            doorbell_clear(d);
            PyErr_Format(PyExc_ValueError, "doorbell offset %zd is out of range or not 8-byte aligned (%zd bytes)",
                         word_off, len);
            return -1;
        }
        d->word = (uint64_t *)(base + word_off);
    }
    if (probe_off >= 0 && probe_off <= len - 4 && !((uintptr_t)(base + probe_off) & 3))
        d->probe = (uint32_t *)(base + probe_off); /* past the mapping: no probe (readers fall back to max_wait) */
    if (!d->word && !d->probe) doorbell_clear(d);
    return 0;
}

void doorbell_probe(DoorbellRef *d, PyObject *owner) {
    if (PyErr_Occurred()) return; /* a failed write that published part of its documents: look next time */
    d->probe = NULL; /* _find_doorbell sets a new one */
    PyObject *r = PyObject_CallMethod(owner, "_find_doorbell", NULL);
    if (!r) {
        PyErr_WriteUnraisable(owner);
        return;
    }
    Py_DECREF(r);
    if (d->word) { /* found: ring for the publication that led us here */
        uint64_t v = __atomic_load_n(d->word, __ATOMIC_SEQ_CST);
        if ((v >> DOORBELL_COUNT_SHIFT) & DOORBELL_COUNT_MAX) doorbell_ring_slow(d->word, v);
    }
}

/* -------------------------------------------------------------------------- module functions */

static uint64_t *word_at(PyObject *const *args, Py_buffer *view, int writable) {
    if (PyObject_GetBuffer(args[0], view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    if (off == -1 && PyErr_Occurred()) goto fail;
    if (off < 0 || off > view->len - 8 || ((uintptr_t)((char *)view->buf + off) & 7)) {
        PyErr_Format(PyExc_ValueError, "doorbell offset %zd is out of range or not 8-byte aligned (%zd bytes)", off,
                     view->len);
        goto fail;
    }
    return (uint64_t *)((char *)view->buf + off);
fail:
    PyBuffer_Release(view);
    return NULL;
}

static int nargs_is(const char *name, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd arguments (%zd given)", name, want, nargs);
    return -1;
}

PyObject *doorbell_py_arm(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs_is("doorbell_arm", nargs, 3) < 0) return NULL;
    long long epoch = PyLong_AsLongLong(args[2]);
    if (epoch == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    uint64_t *w = word_at(args, &view, 1);
    if (!w) return NULL;
    uint64_t v = __atomic_load_n(w, __ATOMIC_SEQ_CST);
    long long armed;
    for (;;) {
        if (EPOCH(v) == epoch && COUNT(v)) { /* still counted: no ring has cleared us */
            armed = epoch;
            break;
        }
        if (COUNT(v) == DOORBELL_COUNT_MAX) {
            armed = -1;
            break;
        }
        if (__atomic_compare_exchange_n(w, &v, v + ((uint64_t)1 << DOORBELL_COUNT_SHIFT), 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST)) {
            armed = EPOCH(v);
            break;
        }
    }
    /* the caller's next look (its loads of the queue) must not pass this arming */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(armed);
}

PyObject *doorbell_py_disarm(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs_is("doorbell_disarm", nargs, 3) < 0) return NULL;
    long long epoch = PyLong_AsLongLong(args[2]);
    if (epoch == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    uint64_t *w = word_at(args, &view, 1);
    if (!w) return NULL;
    uint64_t v = __atomic_load_n(w, __ATOMIC_SEQ_CST);
    while (EPOCH(v) == epoch && COUNT(v) &&
           !__atomic_compare_exchange_n(w, &v, v - ((uint64_t)1 << DOORBELL_COUNT_SHIFT), 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST)) {
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

PyObject *doorbell_py_ring(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs_is("doorbell_ring", nargs, 2) < 0) return NULL;
    Py_buffer view;
    uint64_t *w = word_at(args, &view, 1);
    if (!w) return NULL;
    uint64_t v = __atomic_load_n(w, __ATOMIC_SEQ_CST);
    if (COUNT(v)) doorbell_ring_slow(w, v);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ValueError naming the argument's value as Python prints it (PyErr_Format has no %g: 3.12+ refuse it) */
static void raise_bad_seconds(const char *what, PyObject *value) {
    PyErr_Format(PyExc_ValueError, "%s, not %R", what, value);
}

/* the (seen, epoch) at args[2..3] every wait takes; -1 with an exception set if one is bad */
static int seen_args(PyObject *const *args, unsigned long long *seen, long long *epoch) {
    *seen = PyLong_AsUnsignedLongLong(args[2]);
    if (*seen == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if (*seen > DOORBELL_SEQ_MASK) {
        PyErr_SetString(PyExc_OverflowError, "a doorbell sequence is 32 bits");
        return -1;
    }
    *epoch = PyLong_AsLongLong(args[3]);
    if (*epoch == -1 && PyErr_Occurred()) return -1;
    return 0;
}

/* the (seen, epoch, timeout) at args[2..4] both waits take; -1 with an exception set if one is bad */
static int wait_args(PyObject *const *args, unsigned long long *seen, long long *epoch, double *timeout) {
    if (seen_args(args, seen, epoch) < 0) return -1;
    *timeout = PyFloat_AsDouble(args[4]);
    if (*timeout == -1.0 && PyErr_Occurred()) return -1;
    if (!(*timeout >= 0.0) || *timeout > 1e9) {
        raise_bad_seconds("doorbell wait timeout must be between 0 and 1e9 seconds", args[4]);
        return -1;
    }
    return 0;
}

/* doorbell_wait(buf, off, seen, epoch, timeout): sleep while the sequence is `seen` (and, epoch >= 0,
 * the epoch is `epoch`) for at most `timeout` seconds. True once either moved on, False on timeout. */
PyObject *doorbell_py_wait(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs_is("doorbell_wait", nargs, 5) < 0) return NULL;
    unsigned long long seen;
    long long epoch;
    double timeout;
    if (wait_args(args, &seen, &epoch, &timeout) < 0) return NULL;
    Py_buffer view; /* held while asleep: the mapping cannot be closed under us */
    uint64_t *w = word_at(args, &view, 0);
    if (!w) return NULL;
    double deadline = now_s() + timeout;
    int rung = 0;
    for (;;) {
        uint64_t v = __atomic_load_n(w, __ATOMIC_SEQ_CST);
        if ((v & DOORBELL_SEQ_MASK) != seen || (epoch >= 0 && EPOCH(v) != epoch)) {
            rung = 1;
            break;
        }
        double left = deadline - now_s();
        if (left <= 0) break;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        long r;
        int err;
        Py_BEGIN_ALLOW_THREADS
        r = syscall(SYS_futex, seq_word(w), FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
        err = errno;
        Py_END_ALLOW_THREADS
        if (r != 0 && err == EINTR && PyErr_CheckSignals() < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(rung);
}

/* -------------------------------------------------------------------------- sleeping on several doorbells */

#define WAIT_ANY_MAX 128 /* doorbells one wait_any sleeps on: as many as futex_waitv takes */

typedef struct {
    Py_buffer view;
    uint64_t *word;
    uint32_t seen;
    long long epoch;
} Bell;

/* futex_waitv (Linux 5.16+): sleep until one of the words is woken or differs from its value; 0 on a
 * wake or a value that moved (EAGAIN), ETIMEDOUT, EINTR, or ENOSYS where the kernel has no such call */
static int futex_wait_any(Bell *bells, Py_ssize_t n, double deadline) {
#ifdef SYS_futex_waitv
    struct futex_waitv waiters[WAIT_ANY_MAX];
    memset(waiters, 0, sizeof waiters);
    for (Py_ssize_t i = 0; i < n; i++) {
        waiters[i].val = bells[i].seen;
        waiters[i].uaddr = (uint64_t)(uintptr_t)seq_word(bells[i].word);
        waiters[i].flags = FUTEX_32; /* not private: appenders of other processes wake it */
    }
    struct timespec ts = {(time_t)deadline, (long)((deadline - (double)(time_t)deadline) * 1e9)};
    if (syscall(SYS_futex_waitv, waiters, (unsigned int)n, 0, &ts, CLOCK_MONOTONIC) >= 0) return 0;
    return errno == EAGAIN ? 0 : errno;
#else
    (void)bells;
    (void)n;
    (void)deadline;
    return ENOSYS;
#endif
}

/* the first bell whose sequence (or epoch) moved on, or -1 */
static Py_ssize_t bell_moved(const Bell *bells, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v = __atomic_load_n(bells[i].word, __ATOMIC_SEQ_CST);
        if ((v & DOORBELL_SEQ_MASK) != bells[i].seen || (bells[i].epoch >= 0 && EPOCH(v) != bells[i].epoch))
            return i;
    }
    return -1;
}

/* doorbell_wait_any(bells, timeout): `bells` a tuple of (buf, off, seen, epoch), as doorbell_wait takes
 * for one; sleep while every one's sequence is its `seen` (and its epoch its `epoch`), for at most
 * `timeout` seconds, in one futex_waitv. The position of one that moved on, or -1 on timeout. Where the
 * kernel has no futex_waitv, sleeps on the first for at most 1 ms at a time and looks at the others. */
PyObject *doorbell_py_wait_any(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs_is("doorbell_wait_any", nargs, 2) < 0) return NULL;
    if (!PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) < 1 || PyTuple_GET_SIZE(args[0]) > WAIT_ANY_MAX) {
        PyErr_Format(PyExc_TypeError, "doorbell_wait_any() takes a tuple of 1 to %d (buffer, offset, seen, epoch)",
                     WAIT_ANY_MAX);
        return NULL;
    }
    double timeout = PyFloat_AsDouble(args[1]);
    if (timeout == -1.0 && PyErr_Occurred()) return NULL;
    if (!(timeout >= 0.0) || timeout > 1e9) {
        raise_bad_seconds("doorbell wait timeout must be between 0 and 1e9 seconds", args[1]);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args[0]), held = 0;
    Bell bells[WAIT_ANY_MAX];
    PyObject *result = NULL;
    for (; held < n; held++) { /* buffers held while asleep: no mapping can be closed under us */
        PyObject *t = PyTuple_GET_ITEM(args[0], held);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
            PyErr_SetString(PyExc_TypeError, "doorbell_wait_any() bells are (buffer, offset, seen, epoch)");
            goto done;
        }
        PyObject *const *item = &PyTuple_GET_ITEM(t, 0);
        unsigned long long seen;
        long long epoch;
        double unused;
        PyObject *wait[5] = {item[0], item[1], item[2], item[3], args[1]};
        if (wait_args(wait, &seen, &epoch, &unused) < 0) goto done;
        bells[held].word = word_at(item, &bells[held].view, 0);
        if (!bells[held].word) goto done;
        bells[held].seen = (uint32_t)seen;
        bells[held].epoch = epoch;
    }
    double deadline = now_s() + timeout;
    Py_ssize_t moved = -1;
    int interrupted = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        moved = bell_moved(bells, n);
        if (moved >= 0) break;
        double now = now_s();
        if (now >= deadline) break;
        int err = futex_wait_any(bells, n, deadline);
        if (err == EINTR) {
            interrupted = 1;
            break;
        }
        if (err == ENOSYS) { /* an older kernel: the first bell, looking at the others every 1 ms */
            double left = deadline - now < 0.001 ? deadline - now : 0.001;
            struct timespec ts = {0, (long)(left * 1e9)};
            if (syscall(SYS_futex, seq_word(bells[0].word), FUTEX_WAIT, bells[0].seen, &ts, NULL, 0) != 0 &&
                errno == EINTR) {
                interrupted = 1;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (interrupted && moved < 0 && PyErr_CheckSignals() < 0) goto done;
    if (interrupted && moved < 0) moved = bell_moved(bells, n); /* a handled signal: the caller looks again */
    result = PyLong_FromSsize_t(moved);
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&bells[i].view);
    return result;
}

/* -------------------------------------------------------------------------- sleeping with watched words */

/* a word an appender that does not ring must change when it publishes (a cycle file's writePosition,
 * the header at the reader's position, the listing's modCount), with its value before the caller's look */
typedef struct {
    Py_buffer view;
    const char *at;
    int width;
    uint64_t expected;
} Watched;

static uint64_t load_watched(const Watched *w) {
    if (w->width == 4) {
        if (!((uintptr_t)w->at & 3)) return __atomic_load_n((const uint32_t *)w->at, __ATOMIC_ACQUIRE);
        uint32_t v;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        memcpy(&v, (const void *)w->at, 4); /* a 4.x file's headers need not be aligned */
        return v;
    }
    if (!((uintptr_t)w->at & 7)) return __atomic_load_n((const uint64_t *)w->at, __ATOMIC_ACQUIRE);
    uint64_t v;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    memcpy(&v, (const void *)w->at, 8);
    return v;
}

#define WATCH_MAX 8
#define SIGNAL_EVERY 0.1 /* seconds asleep between two runs of Python's signal handlers at most */

/* doorbell_watch(buf, off, seen, epoch, timeout, max_wait, watches[, max_idle]): as doorbell_wait, but
 * without returning to Python every max_wait: sleeps on the doorbell for up to max_wait at a time and,
 * on each timeout, compares the watched words, `watches` a tuple of (buffer, offset, width 4|8, expected
 * value read before the caller's last look). Each look that finds nothing moved doubles the next sleep,
 * up to max_idle (>= max_wait; default max_wait): a long idle wait costs fewer timer wake-ups. True once
 * the doorbell rang or a watched word moved on, False when `timeout` ran out. Python's signal handlers run between sleeps
 * (at least every 0.1 s). */
PyObject *doorbell_py_watch(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 && nargs_is("doorbell_watch", nargs, 8) < 0) return NULL;
    unsigned long long seen;
    long long epoch;
    double timeout;
    if (wait_args(args, &seen, &epoch, &timeout) < 0) return NULL;
    double max_wait = PyFloat_AsDouble(args[5]);
    if (max_wait == -1.0 && PyErr_Occurred()) return NULL;
    if (!(max_wait > 0.0) || max_wait > 1e9) {
        raise_bad_seconds("doorbell max_wait must be positive and at most 1e9 seconds", args[5]);
        return NULL;
    }
    double max_idle = max_wait;
    if (nargs == 8) {
        max_idle = PyFloat_AsDouble(args[7]);
        if (max_idle == -1.0 && PyErr_Occurred()) return NULL;
        if (!(max_idle >= max_wait) || max_idle > 1e9) {
            raise_bad_seconds("doorbell max_idle must be at least max_wait and at most 1e9 seconds", args[7]);
            return NULL;
        }
    }
    if (!PyTuple_Check(args[6]) || PyTuple_GET_SIZE(args[6]) > WATCH_MAX) {
        PyErr_Format(PyExc_TypeError, "doorbell_watch() watches must be a tuple of at most %d (buffer, offset, width, "
                     "value)", WATCH_MAX);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args[6]), held = 0;
    Watched ws[WATCH_MAX];
    PyObject *result = NULL;
    Py_buffer view; /* held while asleep: no mapping can be closed under us */
    uint64_t *w = word_at(args, &view, 0);
    if (!w) return NULL;
    for (; held < n; held++) {
        PyObject *t = PyTuple_GET_ITEM(args[6], held);
        PyObject *obj;
        Py_ssize_t off;
        int width;
        unsigned long long expected;
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "OniK;doorbell_watch() watches are (buffer, offset, width, value)",
                                                   &obj, &off, &width, &expected)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "doorbell_watch() watches are (buffer, offset, width, value)");
            goto done;
        }
        if (width != 4 && width != 8) {
            PyErr_Format(PyExc_ValueError, "a watched word is 4 or 8 bytes wide, not %d", width);
            goto done;
        }
        if (PyObject_GetBuffer(obj, &ws[held].view, PyBUF_SIMPLE) < 0) goto done;
        if (off < 0 || off > ws[held].view.len - width) {
            PyErr_Format(PyExc_ValueError, "watched offset %zd is outside the buffer (%zd bytes)", off,
                         ws[held].view.len);
            PyBuffer_Release(&ws[held].view);
            goto done;
        }
        ws[held].at = (const char *)ws[held].view.buf + off;
        ws[held].width = width;
        ws[held].expected = width == 4 ? (expected & 0xFFFFFFFFull) : expected;
    }
    double deadline = now_s() + timeout;
    double step = max_wait; /* the next sleep: doubles at each look that finds nothing, up to max_idle */
    int moved = 0;
    for (;;) {
        double start = now_s(), left = deadline - start;
        double until = left < SIGNAL_EVERY ? deadline : start + SIGNAL_EVERY;
        Py_BEGIN_ALLOW_THREADS
        for (;;) {
            uint64_t v = __atomic_load_n(w, __ATOMIC_SEQ_CST);
            if ((v & DOORBELL_SEQ_MASK) != seen || (epoch >= 0 && EPOCH(v) != epoch)) {
                moved = 1;
                break;
            }
            for (Py_ssize_t i = 0; i < n && !moved; i++) moved = load_watched(&ws[i]) != ws[i].expected;
            if (moved) break;
            double l = until - now_s();
            if (l <= 0) break;
            if (l > step) l = step;
            step = step * 2 < max_idle ? step * 2 : max_idle;
            struct timespec ts = {(time_t)l, (long)((l - (double)(time_t)l) * 1e9)};
            if (syscall(SYS_futex, seq_word(w), FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0) != 0 && errno == EINTR)
                break; /* a signal: let Python's handlers run */
        }
        Py_END_ALLOW_THREADS
        if (moved) break;
        if (PyErr_CheckSignals() < 0) goto done;
        if (now_s() >= deadline) break;
    }
    result = PyBool_FromLong(moved);
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&ws[i].view);
    PyBuffer_Release(&view);
    return result;
}

/* -------------------------------------------------------------------------- the native waiter */

/* DoorbellNotifier: waits for an event loop, in a thread that runs no Python. The loop's thread makes the
 * race-free look (arm, read the sequence and the watched words, look for its excerpt) and hands the wait
 * to `arm()`; the thread (a Python thread whose target is `serve()`, which gives up the GIL for good)
 * sleeps on the doorbell word exactly as doorbell_watch does, and when the sequence or the epoch moves
 * on, or a watched word moves, it writes the eventfd the loop watches (`add_reader`): the loop is woken
 * by the kernel, with no Python thread, GIL hand-off or call_soon_threadsafe in between. Without watched
 * words (`watches` None: the caller must look from Python) it writes the eventfd after `max_wait`.
 *
 * The thread also sleeps on a private futex word of its own (`ctl`, with futex_waitv; without it, on
 * the doorbell alone, noticing `ctl` at its next look), which `arm()`, `cancel()` and `stop()` move on:
 * a new wait replaces the one being served at once, and `stop()` ends `serve()` at once.
 *
 * With io_uring (Linux 6.7+, see uring.h) the doorbell wait is not the thread's: `arm()` hands it to
 * the kernel as an io_uring FUTEX_WAIT whose completion makes the eventfd readable, so a ring wakes the
 * loop's thread alone, not this thread and then the loop's. The thread keeps the watched words and the
 * `max_wait` looks (what appenders that do not ring change) and sleeps on `ctl` alone.
 *
 * A request's buffers stay exported while the thread may read them (no mapping can be unmapped under
 * it); the thread cannot release them (that needs the GIL), so it marks the request retired and the next
 * `arm()`, `close()` or the object's end release it. */

#include <pthread.h>
#include <sys/eventfd.h>

#include "uring.h"

#ifndef FUTEX2_SIZE_U32
#define FUTEX2_SIZE_U32 0x02
#endif
#ifndef FUTEX2_PRIVATE
#define FUTEX2_PRIVATE 128
#endif

enum { SLOT_FREE, SLOT_PENDING, SLOT_SERVING, SLOT_RETIRED };
#define NOTIFIER_SLOTS 2 /* at most one served and one pending */

typedef struct {
    int state;        /* SLOT_*: FREE and RETIRED slots belong to Python's side, PENDING/SERVING to the thread */
    int has_word;
    Py_buffer word_view;
    uint64_t *word;   /* NULL: no doorbell word (sleep on ctl; look at the watches) */
    uint32_t seen;
    long long epoch;
    Py_ssize_t held;  /* watched words (their views held) */
    int watching;     /* 0: no watches given, wake the loop after max_wait for a look from Python */
    int ring_waits;   /* the io_uring waits on the doorbell word: the thread does not look at it */
    Watched ws[WATCH_MAX];
    double max_wait, max_idle;
} Request;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready;        /* mu and cv initialised */
    int efd;          /* the eventfd the loop watches (-1: closed) */
    uint32_t ctl;     /* private futex word, moved on by arm/cancel/stop (atomic) */
    int stop;         /* under mu */
    int serving;      /* under mu: serve() runs */
    int error;        /* errno of a failed eventfd write in the thread (atomic), raised by consume() */
    Uring ring;       /* the doorbell waits, where io_uring has FUTEX_WAIT (ring.fd -1: the thread's) */
    double looks_at;  /* when the thread's sleep ends, for its next look (atomic; 0: not asleep on a wait) */
    Request slots[NOTIFIER_SLOTS];
} Notifier;

static void request_release(Request *r) {
    for (Py_ssize_t i = 0; i < r->held; i++) PyBuffer_Release(&r->ws[i].view);
    r->held = 0;
    if (r->has_word) {
        r->has_word = 0;
        PyBuffer_Release(&r->word_view);
    }
    r->word = NULL;
    r->ring_waits = 0;
    r->state = SLOT_FREE;
}

/* end the wait being served: called with mu held, before a new request becomes pending (the thread reads
 * ctl under mu when it takes one, so it never sees a bump meant for the wait before); ctl_wake after */
static void ctl_bump(Notifier *self) { __atomic_add_fetch(&self->ctl, 1, __ATOMIC_SEQ_CST); }

static void ctl_wake(Notifier *self) {
    /* wake the thread if it sleeps on ctl; errors (none expected: the word is ours) change nothing */
    (void)syscall(SYS_futex, &self->ctl, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static int notify_fd(int efd) {
    uint64_t one = 1;
    for (;;) {
        ssize_t r = write(efd, &one, sizeof one);
        if (r == (ssize_t)sizeof one) return 0;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) return 0; /* the counter is full: the loop has a wake-up pending */
        return r < 0 ? errno : EIO;
    }
}

static PyObject *notifier_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"uring", NULL};
    int use_uring = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p:DoorbellNotifier", kwlist, &use_uring)) return NULL;
    Notifier *self = (Notifier *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->efd = -1;
    self->ring.fd = -1;
    int e = pthread_mutex_init(&self->mu, NULL);
    if (e == 0 && (e = pthread_cond_init(&self->cv, NULL)) != 0) pthread_mutex_destroy(&self->mu);
    if (e != 0) {
        errno = e;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    self->ready = 1;
    self->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (self->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    /* no ring (no io_uring, no FUTEX_WAIT in it, a descriptor limit): the thread waits, as before */
    if (use_uring) (void)uring_open(&self->ring, self->efd);
    return (PyObject *)self;
}

static void notifier_dealloc(Notifier *self) {
    /* serve() holds a reference (its bound method) while it runs: nobody serves here */
    uring_close(&self->ring);
    for (int i = 0; i < NOTIFIER_SLOTS; i++) request_release(&self->slots[i]);
    if (self->efd >= 0) close(self->efd);
    if (self->ready) {
        pthread_cond_destroy(&self->cv);
        pthread_mutex_destroy(&self->mu);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* release the slots the thread is done with (the GIL held, mu not) */
static void release_retired(Notifier *self) {
    for (int i = 0; i < NOTIFIER_SLOTS; i++) {
        Request *r = &self->slots[i];
        pthread_mutex_lock(&self->mu);
        int retired = r->state == SLOT_RETIRED;
        pthread_mutex_unlock(&self->mu);
        if (retired) request_release(r);
    }
}

/* arm(buf, off, seen, epoch, watches, max_wait, max_idle): buf None (and off -1) without a doorbell word;
 * watches None where the caller must look from Python every max_wait. Replaces a wait not yet ended. */
static PyObject *notifier_arm(Notifier *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs_is("arm", nargs, 7) < 0) return NULL;
    unsigned long long seen;
    long long epoch;
    if (seen_args(args, &seen, &epoch) < 0) return NULL;
    double max_wait = PyFloat_AsDouble(args[5]), max_idle = PyFloat_AsDouble(args[6]);
    if ((max_wait == -1.0 || max_idle == -1.0) && PyErr_Occurred()) return NULL;
    if (!(max_wait > 0.0) || max_wait > 1e9) {
        raise_bad_seconds("doorbell max_wait must be positive and at most 1e9 seconds", args[5]);
        return NULL;
    }
    if (!(max_idle >= max_wait) || max_idle > 1e9) {
        raise_bad_seconds("doorbell max_idle must be at least max_wait and at most 1e9 seconds", args[6]);
        return NULL;
    }
    PyObject *watches = args[4];
    if (watches != Py_None && (!PyTuple_Check(watches) || PyTuple_GET_SIZE(watches) > WATCH_MAX)) {
        PyErr_Format(PyExc_TypeError, "arm() watches must be None or a tuple of at most %d (buffer, offset, width, "
                     "value)", WATCH_MAX);
        return NULL;
    }
    pthread_mutex_lock(&self->mu);
    int stopped = self->stop || self->efd < 0;
    Request *r = NULL;
    for (int i = 0; i < NOTIFIER_SLOTS && !stopped; i++)
        if (self->slots[i].state == SLOT_PENDING) { /* not taken yet: replaced */
            self->slots[i].state = SLOT_RETIRED;
        }
    pthread_mutex_unlock(&self->mu);
    if (stopped) {
        PyErr_SetString(PyExc_RuntimeError, "this doorbell notifier is stopped");
        return NULL;
    }
    release_retired(self);
    for (int i = 0; i < NOTIFIER_SLOTS && !r; i++)
        if (self->slots[i].state == SLOT_FREE) r = &self->slots[i];
    if (!r) { /* cannot happen: at most one slot is served, and none is pending now */
        PyErr_SetString(PyExc_RuntimeError, "doorbell notifier has no free slot");
        return NULL;
    }
    /* fill the free slot (the thread does not look at free slots) */
    r->seen = (uint32_t)seen;
    r->epoch = epoch;
    r->max_wait = max_wait;
    r->max_idle = max_idle;
    r->watching = watches != Py_None;
    if (args[0] != Py_None) {
        r->word = word_at(args, &r->word_view, 0);
        if (!r->word) return NULL;
        r->has_word = 1;
    }
    Py_ssize_t n = watches == Py_None ? 0 : PyTuple_GET_SIZE(watches);
    for (; r->held < n;) {
        Watched *w = &r->ws[r->held];
        PyObject *t = PyTuple_GET_ITEM(watches, r->held), *obj;
        Py_ssize_t off;
        int width;
        unsigned long long expected;
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "OniK;arm() watches are (buffer, offset, width, value)", &obj,
                                                   &off, &width, &expected)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "arm() watches are (buffer, offset, width, value)");
            goto fail;
        }
        if (width != 4 && width != 8) {
            PyErr_Format(PyExc_ValueError, "a watched word is 4 or 8 bytes wide, not %d", width);
            goto fail;
        }
        if (PyObject_GetBuffer(obj, &w->view, PyBUF_SIMPLE) < 0) goto fail;
        if (off < 0 || off > w->view.len - width) {
            PyErr_Format(PyExc_ValueError, "watched offset %zd is outside the buffer (%zd bytes)", off, w->view.len);
            PyBuffer_Release(&w->view);
            goto fail;
        }
        w->at = (const char *)w->view.buf + off;
        w->width = width;
        w->expected = width == 4 ? (expected & 0xFFFFFFFFull) : expected;
        r->held++;
    }
    if (r->word && self->ring.fd >= 0) { /* the thread's first look at the word, then the kernel waits */
        uint64_t v = __atomic_load_n(r->word, __ATOMIC_SEQ_CST);
        if ((v & DOORBELL_SEQ_MASK) != r->seen || (epoch >= 0 && EPOCH(v) != epoch)) {
            uring_cancel(&self->ring);
            int e = notify_fd(self->efd);
            if (e) __atomic_store_n(&self->error, e, __ATOMIC_SEQ_CST);
            r->ring_waits = 1; /* (nothing left to wait for on the word) */
        } else {
            r->ring_waits = uring_wait(&self->ring, seq_word(r->word), r->seen, self->efd) == 0;
        }
    } else {
        uring_cancel(&self->ring); /* (a wait without the word: none on the word either) */
    }
    pthread_mutex_lock(&self->mu);
    ctl_bump(self); /* the wait being served (if any) is replaced */
    r->state = SLOT_PENDING;
    pthread_cond_signal(&self->cv);
    pthread_mutex_unlock(&self->mu);
    /* A thread that sleeps on the doorbell takes the new wait at once. Where the io_uring waits on it
       and the thread's next look is due within the new wait's max_wait, the thread is left asleep: it
       takes the new wait at that look (ctl moved) and looks at once, so the watched words are still
       looked at within max_wait, and a loop woken by ring after ring does not wake this thread too for
       every message. */
    double looks_at;
    __atomic_load(&self->looks_at, &looks_at, __ATOMIC_SEQ_CST);
    if (!r->ring_waits || !(looks_at > 0) || looks_at > now_s() + r->max_wait) ctl_wake(self);
    Py_RETURN_NONE;
fail:
    request_release(r);
    return NULL;
}

/* the wait of request r, without the GIL: 1 to wake the loop, 0 when replaced, cancelled or stopped */
static int serve_one(Notifier *self, Request *r, uint32_t ctl) {
    double start = now_s(), step = r->max_wait;
    uint64_t *word = r->ring_waits ? NULL : r->word; /* sleep on it (the io_uring does where it waits) */
    for (;;) {
        if (__atomic_load_n(&self->ctl, __ATOMIC_SEQ_CST) != ctl) return 0;
        if (r->word) { /* rung: wake the loop, unless the io_uring's completion does */
            uint64_t v = __atomic_load_n(r->word, __ATOMIC_SEQ_CST);
            if ((v & DOORBELL_SEQ_MASK) != r->seen || (r->epoch >= 0 && EPOCH(v) != r->epoch)) return !r->ring_waits;
        }
        for (Py_ssize_t i = 0; i < r->held; i++)
            if (load_watched(&r->ws[i]) != r->ws[i].expected) return 1;
        double l = step;
        if (!r->watching) { /* the caller looks from Python every max_wait */
            l = start + r->max_wait - now_s();
            if (l <= 0) return 1;
        } else {
            step = step * 2 < r->max_idle ? step * 2 : r->max_idle;
        }
        struct timespec rel = {(time_t)l, (long)((l - (double)(time_t)l) * 1e9)};
        double looks_at = now_s() + l;
        __atomic_store(&self->looks_at, &looks_at, __ATOMIC_SEQ_CST);
        long res = -1;
        int err = ENOSYS;
#if defined(SYS_futex_waitv)
        struct timespec until;
        if (clock_gettime(CLOCK_MONOTONIC, &until) == 0) {
            until.tv_sec += rel.tv_sec;
            until.tv_nsec += rel.tv_nsec;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec += 1;
                until.tv_nsec -= 1000000000L;
            }
            struct futex_waitv ws[2];
            memset(ws, 0, sizeof ws);
            unsigned nr = 0;
            ws[nr].val = ctl;
            ws[nr].uaddr = (uintptr_t)&self->ctl;
            ws[nr++].flags = FUTEX2_SIZE_U32 | FUTEX2_PRIVATE;
            if (word) { /* shared: the appenders are other processes */
                ws[nr].val = r->seen;
                ws[nr].uaddr = (uintptr_t)seq_word(word);
                ws[nr++].flags = FUTEX2_SIZE_U32;
            }
            res = syscall(SYS_futex_waitv, ws, nr, 0, &until, CLOCK_MONOTONIC);
            err = res < 0 ? errno : 0;
        }
#endif
        if (res < 0 && err == ENOSYS) { /* an older kernel: one word at a time, ctl seen at the next look */
            if (word)
                res = syscall(SYS_futex, seq_word(word), FUTEX_WAIT, r->seen, &rel, NULL, 0);
            else
                res = syscall(SYS_futex, &self->ctl, FUTEX_WAIT_PRIVATE, ctl, &rel, NULL, 0);
            err = res < 0 ? errno : 0;
        }
        /* woken, timed out, a value that had moved, a signal: look again; anything else (not expected)
           must not spin: sleep the step out */
        if (res < 0 && err != EAGAIN && err != ETIMEDOUT && err != EINTR) {
            while (nanosleep(&rel, &rel) != 0 && errno == EINTR) {
            }
        }
    }
}

/* serve(): the thread's body (a Python thread's target): serves the armed waits until stop(), without
 * the GIL (returns at once if stopped already). */
static PyObject *notifier_serve(Notifier *self, PyObject *unused) {
    pthread_mutex_lock(&self->mu);
    int refused = self->serving, stopped = self->stop || self->efd < 0;
    if (!refused && !stopped) self->serving = 1;
    pthread_mutex_unlock(&self->mu);
    if (refused) {
        PyErr_SetString(PyExc_RuntimeError, "this doorbell notifier is already served by another thread");
        return NULL;
    }
    if (stopped) Py_RETURN_NONE; /* stopped before its thread began */
    int efd = self->efd; /* close() refuses while serving: it stays open */
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mu);
    for (;;) {
        Request *r = NULL;
        while (!self->stop) {
            for (int i = 0; i < NOTIFIER_SLOTS && !r; i++)
                if (self->slots[i].state == SLOT_PENDING) r = &self->slots[i];
            if (r) break;
            pthread_cond_wait(&self->cv, &self->mu);
        }
        if (self->stop) break;
        r->state = SLOT_SERVING;
        uint32_t ctl = __atomic_load_n(&self->ctl, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&self->mu);
        int wake = serve_one(self, r, ctl);
        double idle = 0.0; /* (waiting for a request under mu: arm() signals cv) */
        __atomic_store(&self->looks_at, &idle, __ATOMIC_SEQ_CST);
        if (wake) {
            int e = notify_fd(efd);
            if (e) __atomic_store_n(&self->error, e, __ATOMIC_SEQ_CST);
        }
        pthread_mutex_lock(&self->mu);
        r->state = SLOT_RETIRED;
    }
    self->serving = 0;
    pthread_mutex_unlock(&self->mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* cancel(): the wait armed (if any) ends without waking the loop */
static PyObject *notifier_cancel(Notifier *self, PyObject *unused) {
    pthread_mutex_lock(&self->mu);
    for (int i = 0; i < NOTIFIER_SLOTS; i++)
        if (self->slots[i].state == SLOT_PENDING) self->slots[i].state = SLOT_RETIRED;
    ctl_bump(self);
    pthread_mutex_unlock(&self->mu);
    ctl_wake(self);
    uring_cancel(&self->ring);
    release_retired(self);
    Py_RETURN_NONE;
}

/* stop(): serve() returns (at once; the caller joins its thread, then calls close()) */
static PyObject *notifier_stop(Notifier *self, PyObject *unused) {
    pthread_mutex_lock(&self->mu);
    self->stop = 1;
    ctl_bump(self);
    pthread_cond_signal(&self->cv);
    pthread_mutex_unlock(&self->mu);
    ctl_wake(self);
    Py_RETURN_NONE;
}

/* close(): release the buffers and the eventfd; refused while serve() runs */
static PyObject *notifier_close(Notifier *self, PyObject *unused) {
    pthread_mutex_lock(&self->mu);
    int serving = self->serving;
    if (!serving) self->stop = 1;
    pthread_mutex_unlock(&self->mu);
    if (serving) {
        PyErr_SetString(PyExc_RuntimeError, "stop the doorbell notifier and end its thread before closing it");
        return NULL;
    }
    uring_close(&self->ring);
    for (int i = 0; i < NOTIFIER_SLOTS; i++) request_release(&self->slots[i]);
    if (self->efd >= 0) {
        int fd = self->efd;
        self->efd = -1;
        if (close(fd) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static int check_open(Notifier *self) {
    if (self->efd >= 0) return 0;
    PyErr_SetString(PyExc_ValueError, "this doorbell notifier is closed");
    return -1;
}

/* wake(): wake the loop now (another thread closing the queue): the eventfd becomes readable */
static PyObject *notifier_wake(Notifier *self, PyObject *unused) {
    if (check_open(self) < 0) return NULL;
    int e = notify_fd(self->efd);
    if (e) {
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* consume() -> int: the wake-ups since the last consume (0: none; the eventfd is non-blocking) */
static PyObject *notifier_consume(Notifier *self, PyObject *unused) {
    if (check_open(self) < 0) return NULL;
    int e = __atomic_exchange_n(&self->error, 0, __ATOMIC_SEQ_CST);
    if (e) {
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    uring_reap(&self->ring); /* (the completions the eventfd counted) */
    uint64_t v = 0;
    for (;;) {
        ssize_t r = read(self->efd, &v, sizeof v);
        if (r == (ssize_t)sizeof v) break;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) return PyLong_FromLong(0);
        if (r >= 0) errno = EIO;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromUnsignedLongLong(v);
}

static PyObject *notifier_fileno(Notifier *self, PyObject *unused) {
    if (check_open(self) < 0) return NULL;
    return PyLong_FromLong(self->efd);
}

/* uring() -> bool: the doorbell waits go through io_uring (not the thread) */
static PyObject *notifier_uring(Notifier *self, PyObject *unused) { return PyBool_FromLong(self->ring.fd >= 0); }

static PyMethodDef notifier_methods[] = {
    {"arm", (PyCFunction)(void (*)(void))notifier_arm, METH_FASTCALL,
     "arm(buf, off, seen, epoch, watches, max_wait, max_idle): hand a wait to the thread"},
    {"serve", (PyCFunction)notifier_serve, METH_NOARGS, "serve(): the thread's body, until stop()"},
    {"cancel", (PyCFunction)notifier_cancel, METH_NOARGS, "cancel(): end the armed wait without a wake-up"},
    {"stop", (PyCFunction)notifier_stop, METH_NOARGS, "stop(): serve() returns"},
    {"close", (PyCFunction)notifier_close, METH_NOARGS, "close(): release the buffers and the eventfd"},
    {"wake", (PyCFunction)notifier_wake, METH_NOARGS, "wake(): make the eventfd readable"},
    {"consume", (PyCFunction)notifier_consume, METH_NOARGS, "consume() -> wake-ups since the last one"},
    {"fileno", (PyCFunction)notifier_fileno, METH_NOARGS, "fileno() -> the eventfd"},
    {"uring", (PyCFunction)notifier_uring, METH_NOARGS, "uring() -> True: io_uring waits on the doorbell"},
    {NULL}};

PyTypeObject DoorbellNotifierType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chronq._native.DoorbellNotifier",
    .tp_basicsize = sizeof(Notifier),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Wakes an event loop's eventfd when the doorbell rings or a watched word moves (no Python in "
              "between).",
    .tp_new = notifier_new,
    .tp_dealloc = (destructor)notifier_dealloc,
    .tp_methods = notifier_methods,
};
