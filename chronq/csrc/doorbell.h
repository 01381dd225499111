/* The queue's doorbell: a 64-bit word in metadata.cq4t (key `chronq.doorbell`) that appenders ring
 * after they publish and readers with nothing to read sleep on (Linux futex on the shared file mapping,
 * not FUTEX_PRIVATE: the processes share the file, not an address space). See chronq/doorbell.py.
 *
 * Word layout (little-endian int64, as every table-store value):
 *   bits  0..31  sequence: moved on by every ring that finds a waiter; the futex word
 *   bits 32..43  waiters: doorbells armed since the last ring that found nobody asleep
 *   bits 44..63  epoch: moved on when a ring finds the waiters all awake (or dead) and clears them
 * An append with no waiter costs one atomic load of the word. */
#ifndef CHRONQ_DOORBELL_H
#define CHRONQ_DOORBELL_H

#include <Python.h>
#include <stdint.h>

#define DOORBELL_SEQ_MASK 0xFFFFFFFFull
#define DOORBELL_COUNT_SHIFT 32
#define DOORBELL_COUNT_MAX 0xFFFull
#define DOORBELL_EPOCH_SHIFT 44
#define DOORBELL_EPOCH_MASK 0xFFFFFull

/* An appender's view of the doorbell: the table-store mapping, the word (NULL: none yet), and `probe`,
 * the header at the table store's chain end while there is no word: when a key is added there (a
 * reader adding `chronq.doorbell`), the appender asks Python to look the word up. */
typedef struct {
    Py_buffer view;
    int has_view;
    uint64_t *word;
    uint32_t *probe;
} DoorbellRef;

void doorbell_ring_slow(uint64_t *word, uint64_t seen);
int doorbell_set(DoorbellRef *d, PyObject *buf, Py_ssize_t word_off, Py_ssize_t probe_off);
void doorbell_clear(DoorbellRef *d);
/* After a publication (the write lock released): ring; if the table store grew a key while the
 * appender has no word, call owner._find_doorbell() (an error there is reported as unraisable). */
void doorbell_probe(DoorbellRef *d, PyObject *owner);

static inline void doorbell_after_publish(DoorbellRef *d, PyObject *owner) {
    if (d->word) {
        /* seq_cst: not reordered before the publication (itself a CAS), so either we see a waiter
           armed before its last look, or that look sees what we published */
        uint64_t v = __atomic_load_n(d->word, __ATOMIC_SEQ_CST);
        if ((v >> DOORBELL_COUNT_SHIFT) & DOORBELL_COUNT_MAX) doorbell_ring_slow(d->word, v);
    } else if (d->probe && __atomic_load_n(d->probe, __ATOMIC_ACQUIRE) != 0) {
        doorbell_probe(d, owner);
    }
}

PyObject *doorbell_py_arm(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *doorbell_py_disarm(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *doorbell_py_wait(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *doorbell_py_ring(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *doorbell_py_watch(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *doorbell_py_wait_any(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

/* DoorbellNotifier: a waiter without Python for an event loop (see doorbell.c and chronq/doorbell.py) */
extern PyTypeObject DoorbellNotifierType;

#define DOORBELL_METHODS                                                                                   \
    {"doorbell_arm", (PyCFunction)(void (*)(void))doorbell_py_arm, METH_FASTCALL,                          \
     "doorbell_arm(buf, off, epoch) -> epoch armed in (-1: the waiter count is full)"},                     \
    {"doorbell_disarm", (PyCFunction)(void (*)(void))doorbell_py_disarm, METH_FASTCALL,                    \
     "doorbell_disarm(buf, off, epoch) -> None"},                                                          \
    {"doorbell_wait", (PyCFunction)(void (*)(void))doorbell_py_wait, METH_FASTCALL,                        \
     "doorbell_wait(buf, off, seen, epoch, timeout) -> bool (True: rung)"},                                \
    {"doorbell_ring", (PyCFunction)(void (*)(void))doorbell_py_ring, METH_FASTCALL,                        \
     "doorbell_ring(buf, off) -> None"},                                                                   \
    {"doorbell_watch", (PyCFunction)(void (*)(void))doorbell_py_watch, METH_FASTCALL,                      \
     "doorbell_watch(buf, off, seen, epoch, timeout, max_wait, watches[, max_idle]) -> bool (True: rung or a watched word moved)"}, \
    {"doorbell_wait_any", (PyCFunction)(void (*)(void))doorbell_py_wait_any, METH_FASTCALL,                \
     "doorbell_wait_any(((buf, off, seen, epoch), ...), timeout) -> position of one that moved, or -1"},

#endif
