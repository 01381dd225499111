/*
 * native.h: what the C files of chronq._native share (private: only the files of chronq/csrc include it).
 *
 * chronq._native is one extension built from these files (setup.py lists them):
 *   module.c   the module: its state (NativeState), the chronq.errors helpers, the method table, init
 *   buffers.c  Map (a shared mapping exporting the buffer protocol) and the atomics on any buffer
 *   cycle.c    a cycle file's layout: Geometry, index arrays and lookups; write_eof, scan, gather, index_array
 *   appender.c AppenderCore: lock, find the end, copy the body, publish the header, writePosition + index
 *   tailer.c   Excerpt and TailerCore: header scan, index lookup, zero-copy excerpts; read_payloads
 *   merge.c    Merge: chronq.merge's k-way merge of finished inputs
 *   runs.c     replication runs: check_run, read_run, read_runs, write_run
 *
 * Sections of this header: includes and the document header bits; module state; errors; atomics on
 * memory (inline: the hot path); then one section per file with its structs and the functions the other
 * files call. Everything declared here has hidden visibility: calls between the files are direct calls
 * inside the shared object (no PLT), and only PyInit__native is exported.
 */
#ifndef CHRONQ_NATIVE_H
#define CHRONQ_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_LONGLONG etc.: Py_T_* need 3.12 */
#include "../../wire/_document_source.h"
#include "pyerr.h"
#include "doorbell.h"
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#pragma GCC visibility push(hidden)

#define HDR_LENGTH_MASK 0x3FFFFFFFu
#define HDR_META 0x40000000u
#define HDR_NOT_COMPLETE 0x80000000u
#define HDR_EOF 0xC0000000u
#define LOCK_UNLOCKED ((int64_t)INT64_MIN)

/* ------------------------------------------------------------------ module state (module.c) */

typedef struct ExcerptObject ExcerptObject;

/* Excerpts die and are born once per iteration step: keep a few for reuse (like CPython's float freelist). */
#define EX_FREELIST 64

/* The module's state in one struct: the types are static, so code that has no module object at hand
 * (an error deep in a read, an excerpt's dealloc) reaches it at no cost. The error classes are loaded
 * when the first error is raised. */
typedef struct {
    PyObject *corrupt_queue_error; /* chronq.errors.CorruptQueueError */
    PyObject *chronq_error;        /* chronq.errors.ChronqError */
    ExcerptObject *ex_freelist[EX_FREELIST];
    int ex_nfree;
} NativeState;

extern NativeState native_state;

/* ------------------------------------------------------------------ errors (module.c) */

/* CorruptQueueError(name, pos, detail) set as the current exception (name None or NULL: "<buffer>") */
void raise_corrupt(PyObject *name, Py_ssize_t pos, const char *fmt, ...);
/* ChronqError(message) set as the current exception */
void raise_chronq(const char *fmt, ...);

/* ------------------------------------------------------------------ atomics */

static inline uint32_t ld32(const char *p) { return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE); }
static inline int64_t ld64(const char *p) { return __atomic_load_n((const int64_t *)p, __ATOMIC_ACQUIRE); }
static inline void st64(char *p, int64_t v) { __atomic_store_n((int64_t *)p, v, __ATOMIC_RELEASE); }
static inline int cas32p(char *p, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n((uint32_t *)p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static inline int cas64p(char *p, int64_t expected, int64_t desired) {
    return __atomic_compare_exchange_n((int64_t *)p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
static inline void setmax64p(char *p, int64_t v) {
    int64_t cur = ld64(p);
    while (cur < v && !__atomic_compare_exchange_n((int64_t *)p, &cur, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
}
/* Raise a monotonic field that only the lock holder writes: no read-modify-write needed. */
static inline void raise64p(char *p, int64_t v) {
    if (ld64(p) < v) st64(p, v);
}
static inline Py_ssize_t align_up(Py_ssize_t pos, Py_ssize_t align) { return (pos + align - 1) & ~(align - 1); }

/* ------------------------------------------------------------------ buffers.c */

typedef struct {
    PyObject_HEAD
    char *base;
    Py_ssize_t size;
    int writable;
    PyObject *name; /* file name, for error messages */
} MapObject;

extern PyTypeObject MapType;

typedef struct {
    Py_buffer view;
    char *base;
    Py_ssize_t len;
    int has_view;
} BufRef;

/* obj's bytes (a Map directly, anything else through the buffer protocol); put_buf releases them */
int get_buf(PyObject *obj, BufRef *b, int writable);
void put_buf(BufRef *b);
Py_ssize_t release_range(char *base, Py_ssize_t size, Py_ssize_t start, Py_ssize_t end);

PyObject *py_load32(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_load64(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_store32(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_store64(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_cas32(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_cas64(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_set_max64(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_set_min64(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_add64(PyObject *m, PyObject *const *args, Py_ssize_t nargs);

/* ------------------------------------------------------------------ cycle.c */

/* What a cycle file's store header says, handed to `_attach` as one object (built once per mapping
   by chronq.queue.CycleFile.geometry): named fields instead of a positional tuple, so appender and
   tailer cannot disagree about the order, and `_attach` reads the values as C fields. */
typedef struct {
    PyObject_HEAD
    PyObject *map; /* a chronq._native.Map */
    long long cycle, shift, align, index_count, index_spacing, write_position_offset, has_hint,
        index2index_position, last_index_offset, data_start;
    char headerless; /* char: T_BOOL */
} GeometryObject;

extern PyTypeObject GeometryType;

#define ARRAY_CACHE 16

/* The store-level geometry shared by appender and tailer cores. */
typedef struct {
    MapObject *map; /* strong ref or NULL */
    char *base;
    Py_ssize_t size;
    int64_t cycle;
    int shift;        /* sequence bits of the index */
    int align;        /* 4 (dataFormat 1) or 1 */
    int count_bits;   /* log2(indexCount) */
    int spacing_bits; /* log2(indexSpacing) */
    Py_ssize_t wp_off;  /* writePosition[0]; the sequence hint is at +8 */
    Py_ssize_t i2i_pos; /* index2index document position, 0 = none */
    Py_ssize_t i2i_arr; /* its array (capacity field), 0 = none/unresolved */
    Py_ssize_t li_off;  /* lastIndex (nextEntryToBeIndexed) value offset, 0 = none */
    Py_ssize_t data_start; /* where the first document after the store header starts */
    int hint_ok;           /* the store has a 2-long writePosition */
    /* secondary index documents looked up, by index2index slot (direct-mapped): their arrays */
    int64_t cached_sec[ARRAY_CACHE];
    Py_ssize_t cached_arr[ARRAY_CACHE];
} Geometry;

Py_ssize_t index_array_at(const char *base, Py_ssize_t size, Py_ssize_t doc_pos, int64_t want_cap, PyObject *name,
                          Py_ssize_t where);
int parse_geometry(Geometry *g, PyObject *arg, long long wp_off);
int index_entry(Geometry *g, int64_t seq, int64_t *out);
int seek_seq(Geometry *g, int64_t seq, Py_ssize_t *pos_out);
int64_t seq_at_position(Geometry *g, Py_ssize_t wp);

PyObject *py_write_eof(PyObject *m, PyObject *const *args, Py_ssize_t nargs);
PyObject *py_scan(PyObject *m, PyObject *args, PyObject *kwds);
PyObject *py_gather(PyObject *m, PyObject *args);
PyObject *py_index_array(PyObject *m, PyObject *args);

/* ------------------------------------------------------------------ appender.c */

/* An index entry to write once the data document at pos (sequence seq) is published; ip is the position
   of the index array written inline after it for this entry's index2index slot (0: none). */
typedef struct {
    int64_t seq;
    Py_ssize_t pos, ip;
} IndexWork;

typedef struct {
    PyObject_HEAD
    Geometry g;
    /* write lock (chronicle.write.lock in metadata.cq4t) */
    PyObject *lock_obj;
    Py_buffer lock_view;
    int has_lock_view;
    char *lock_p;
    int64_t pid;
    int lock_depth; /* >0 while we hold the lock */
    /* clock */
    int64_t cycle_start_ms, cycle_end_ms; /* the current cycle's window */
    PyObject *clock_millis; /* a clock of the queue's own: its millis() (NULL: the system's realtime clock) */
    Py_ssize_t grow_at; /* a header at or past this position needs a bigger file (Java's chunk rule) */
    Py_ssize_t alloc_end; /* disk blocks are reserved up to here (a full disk must not SIGBUS us) */
    Py_ssize_t ahead_at;  /* past this end position, reserve more after the write (App_after_write) */
    /* cached end of the queue */
    int cache_valid;
    Py_ssize_t end_pos;
    int64_t next_seq;
    int64_t seen_wp;
    int64_t last_index;
    /* open document (writing_document) */
    int claimed;
    int claim_meta;
    int spin;
    /* atomic block: documents are written behind an unpublished first header (the gate); writePosition
       and index entries wait for the gate's publication, so a crash inside the block leaves nothing */
    int atomic;
    Py_ssize_t gate_pos; /* 0: no document yet */
    uint32_t gate_header;
    int64_t atomic_index2; /* index2index slot whose index array this block wrote (-1: none) */
    Py_ssize_t last_data_pos;
    int64_t last_data_seq;
    IndexWork *deferred;
    Py_ssize_t n_deferred, cap_deferred;
    DoorbellRef db; /* doorbell */
} AppenderObject;

extern PyTypeObject AppenderType;

/* the steps of a write that write_run (runs.c) shares with write() */
int App_lock(AppenderObject *self);
void App_unlock(AppenderObject *self);
int App_check_cycle(AppenderObject *self);
int App_locate_end(AppenderObject *self);
int64_t App_put(AppenderObject *self, const char *data, Py_ssize_t len, int meta);
int App_after_write(AppenderObject *self);

/* ------------------------------------------------------------------ tailer.c */

struct ExcerptObject {
    PyObject_HEAD
    MapObject *map;
    Py_ssize_t position; /* header position */
    Py_ssize_t length;   /* body length as stored */
    int64_t index;
    int64_t cycle;
    int64_t seq;
    int metadata;
    int raw; /* from a headerless (libchronicle) file: bytes as written, no Java padding rule */
};

extern PyTypeObject ExcerptType;

typedef struct {
    PyObject_HEAD
    Geometry g;
    Py_ssize_t pos; /* next header to look at */
    int64_t seq;    /* sequence of the next data document */
    int direction;  /* 1 forward, -1 backward, 0 none */
    ExcerptObject *ex;
    /* named tailer: int64 slot in the table store updated with the next index after each read */
    PyObject *named_obj;
    Py_buffer named_view;
    int has_named;
    char *named_p;
    /* replicated named tailer (Java's VersionedIndexUpdater): every store of the position takes the
       `index.NAME.lock` PID lock and bumps `index.NAME.version`; NULL for plain named tailers */
    char *named_ver_p;
    char *named_lock_p;
    int64_t named_pid;
    int64_t pending_named; /* index to store when the open document finishes, or -1 */
    int64_t last_read;     /* index of the last data document read, or -1 (Java's lastReadIndex) */
    Py_ssize_t release_every; /* drop pages behind the reader every N bytes (0 = never) */
    Py_ssize_t released_to;
    /* headerless (libchronicle) cycle: no writePosition and no index, documents from offset 0. Seeks walk
       the documents and keep a sparse, bounded index of their own: marks[k] = position of the data
       document with sequence k << mark_bits (the spacing doubles whenever the array is full). */
    int headerless;
    Py_ssize_t *marks;
    Py_ssize_t marks_n;
    int mark_bits;
    /* a newer cycle file existed when this cycle was attached: a header that is 0 or still held where the
       documents end is not "wait for more" but the end of a cycle nobody writes to (see _end_of_older_cycle) */
    int older;
} TailerObject;

extern PyTypeObject TailerType;
extern DocumentSource tailer_document_source;

PyObject *Ex_bytes(ExcerptObject *self, PyObject *ignored);
int Tl_next_doc(TailerObject *self, int want_meta, uint32_t *hout);
PyObject *Tl_read_impl(TailerObject *self, int want_meta, int commit, Py_ssize_t max_refs);

extern const char read_payloads_doc[];
PyObject *py_read_payloads(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

/* ------------------------------------------------------------------ merge.c */

extern PyTypeObject MergeType;

/* ------------------------------------------------------------------ runs.c */

PyObject *py_check_run(PyObject *m, PyObject *args);
PyObject *py_read_run(PyObject *m, PyObject *args);
PyObject *py_read_runs(PyObject *m, PyObject *args);
PyObject *py_write_run(PyObject *m, PyObject *args);

#pragma GCC visibility pop

#endif
