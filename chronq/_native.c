/*
 * chronq._native: the hot path of chronq in C.
 *
 * Owns what must be atomic or fast on shared memory-mapped queue files:
 *   - atomic loads/stores/CAS on any buffer (the table store uses these),
 *   - Map: a shared mapping of one cycle file that exports the buffer protocol,
 *   - AppenderCore: lock, find end, copy body, publish header, writePosition + index,
 *   - TailerCore: header scan with acquire loads, index lookup, zero-copy excerpts,
 *   - scan/gather: batch helpers for columnar readers.
 * Slow paths (roll, growth, stale-lock takeover, next cycle) are Python methods of the
 * subclasses in chronq/appender.py and chronq/tailer.py, called from here.
 * Every offset is bounds-checked; problems become Python exceptions, never aborts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_LONGLONG etc.: Py_T_* need 3.12 */
#include "../wire/_document_source.h"
#include "csrc/doorbell.h" /* doorbell */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define HDR_LENGTH_MASK 0x3FFFFFFFu
#define HDR_META 0x40000000u
#define HDR_NOT_COMPLETE 0x80000000u
#define HDR_EOF 0xC0000000u
#define LOCK_UNLOCKED ((int64_t)INT64_MIN)

static PyObject *CorruptQueueError = NULL; /* chronq.errors.CorruptQueueError, loaded lazily */
static PyObject *ChronqError = NULL;

static int load_errors(void) {
    if (CorruptQueueError) return 0;
    PyObject *mod = PyImport_ImportModule("chronq.errors");
    if (!mod) return -1;
    CorruptQueueError = PyObject_GetAttrString(mod, "CorruptQueueError");
    ChronqError = PyObject_GetAttrString(mod, "ChronqError");
    Py_DECREF(mod);
    if (!CorruptQueueError || !ChronqError) {
        Py_CLEAR(CorruptQueueError);
        Py_CLEAR(ChronqError);
        return -1;
    }
    return 0;
}

static void raise_corrupt(PyObject *name, Py_ssize_t pos, const char *fmt, ...) {
    if (load_errors() < 0) return;
    if (!name || name == Py_None) name = PyUnicode_FromString("<buffer>");
    else Py_INCREF(name);
    if (!name) return;
    va_list ap;
    va_start(ap, fmt);
    PyObject *detail = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!detail) {
        Py_DECREF(name);
        return;
    }
    PyObject *exc = PyObject_CallFunction(CorruptQueueError, "OnO", name, pos, detail);
    Py_DECREF(detail);
    Py_DECREF(name);
    if (exc) {
        PyErr_SetObject(CorruptQueueError, exc);
        Py_DECREF(exc);
    }
}

static void raise_chronq(const char *fmt, ...) {
    if (load_errors() < 0) return;
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!msg) return;
    PyErr_SetObject(ChronqError, msg);
    Py_DECREF(msg);
}

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

/* ------------------------------------------------------------------ Map */

typedef struct {
    PyObject_HEAD
    char *base;
    Py_ssize_t size;
    int writable;
    PyObject *name; /* file name, for error messages */
} MapObject;

static PyTypeObject MapType;

static PyObject *Map_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"fd", "size", "writable", "name", NULL};
    int fd, writable = 0;
    Py_ssize_t size;
    PyObject *name = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "in|pO", kwlist, &fd, &size, &writable, &name)) return NULL;
    if (size <= 0) {
        PyErr_Format(PyExc_ValueError, "cannot map %zd bytes of %R", size, name);
        return NULL;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, name);
        return NULL;
    }
    MapObject *self = (MapObject *)type->tp_alloc(type, 0);
    if (!self) {
        munmap(p, (size_t)size);
        return NULL;
    }
    self->base = p;
    self->size = size;
    self->writable = writable;
    Py_INCREF(name);
    self->name = name;
    return (PyObject *)self;
}

static void Map_dealloc(MapObject *self) {
    if (self->base) munmap(self->base, (size_t)self->size);
    Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Map_getbuffer(MapObject *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->base, self->size, !self->writable, flags);
}

static PyBufferProcs Map_as_buffer = {(getbufferproc)Map_getbuffer, NULL};

/* Drops this process's mapping of [start, end) of a mapping at base (clean file pages: the page
 * cache keeps them, so RSS stays flat on long replays). The kernel may map a file with 2 MiB pages
 * (large folios, shown as FilePmdMapped in smaps) and then drops only a 2 MiB block that the range
 * covers entirely, so the range is cut to whole blocks of RELEASE_BLOCK at their addresses. Returns
 * the offset up to which pages are released (the next range starts there), or -1: nothing released
 * yet (the range covers no whole block), or madvise failed (errno set). */
#define RELEASE_BLOCK ((uintptr_t)2 << 20)
static Py_ssize_t release_range(char *base, Py_ssize_t size, Py_ssize_t start, Py_ssize_t end) {
    if (start < 0) start = 0;
    if (end > size) end = size;
    uintptr_t lo = ((uintptr_t)base + (uintptr_t)start + RELEASE_BLOCK - 1) & ~(RELEASE_BLOCK - 1);
    uintptr_t hi = ((uintptr_t)base + (uintptr_t)end) & ~(RELEASE_BLOCK - 1);
    errno = 0;
    if (end <= start || hi <= lo) return -1;
    if (madvise((void *)lo, (size_t)(hi - lo), MADV_DONTNEED) != 0) return -1;
    return (Py_ssize_t)(hi - (uintptr_t)base);
}

static PyObject *Map_release_pages(MapObject *self, PyObject *args) {
    /* Drop clean pages of [start, end) from this process; returns the end released (or None). */
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "nn", &start, &end)) return NULL;
    Py_ssize_t upto = release_range(self->base, self->size, start, end);
    if (upto < 0 && errno) return PyErr_SetFromErrno(PyExc_OSError);
    if (upto < 0) Py_RETURN_NONE;
    return PyLong_FromSsize_t(upto);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static PyObject *Map_populate(MapObject *self, PyObject *args) {
    /* Map the pages of [start, end) writable now, in one call, instead of one page fault per page on the
       writer's first store (Linux 5.14+; older kernels, read-only maps: nothing, it is only an
       optimisation). Returns whether it was done. */
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "nn", &start, &end)) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    start &= ~(Py_ssize_t)(page - 1);
    if (start < 0) start = 0;
    if (end > self->size) end = self->size;
    int done = self->writable && end > start &&
               madvise(self->base + start, (size_t)(end - start), MADV_POPULATE_WRITE) == 0;
    return PyBool_FromLong(done);
}

static PyObject *Map_sync(MapObject *self, PyObject *Py_UNUSED(ignored)) {
    if (msync(self->base, (size_t)self->size, MS_SYNC) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyMethodDef Map_methods[] = {
    {"release_pages", (PyCFunction)Map_release_pages, METH_VARARGS,
     "release_pages(start, end) -> int | None: madvise(DONTNEED) the whole 2 MiB blocks in [start, end); the end "
     "released."},
    {"sync", (PyCFunction)Map_sync, METH_NOARGS, "msync the mapping to disk."},
    {"populate", (PyCFunction)Map_populate, METH_VARARGS, "populate(start, end) -> bool: prefault pages writable."},
    {NULL}};

static PyObject *Map_get_size(MapObject *self, void *c) { return PyLong_FromSsize_t(self->size); }
static PyObject *Map_get_name(MapObject *self, void *c) { return Py_NewRef(self->name); }
static PyObject *Map_get_writable(MapObject *self, void *c) { return PyBool_FromLong(self->writable); }
static PyGetSetDef Map_getset[] = {{"size", (getter)Map_get_size, NULL, NULL, NULL},
                                   {"name", (getter)Map_get_name, NULL, NULL, NULL},
                                   {"writable", (getter)Map_get_writable, NULL, NULL, NULL},
                                   {NULL}};

static Py_ssize_t Map_len(MapObject *self) { return self->size; }
static PySequenceMethods Map_as_sequence = {.sq_length = (lenfunc)Map_len};

static PyTypeObject MapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chronq._native.Map",
    .tp_basicsize = sizeof(MapObject),
    .tp_as_sequence = &Map_as_sequence,
    .tp_dealloc = (destructor)Map_dealloc,
    .tp_as_buffer = &Map_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Map(fd, size, writable=False, name=None): a MAP_SHARED mapping, unmapped only when freed.",
    .tp_methods = Map_methods,
    .tp_getset = Map_getset,
    .tp_new = Map_new,
};

/* ------------------------------------------------------------------ buffer access for the atomics */

typedef struct {
    Py_buffer view;
    char *base;
    Py_ssize_t len;
    int has_view;
} BufRef;

static int get_buf(PyObject *obj, BufRef *b, int writable) {
    if (Py_IS_TYPE(obj, &MapType)) {
        MapObject *m = (MapObject *)obj;
        if (writable && !m->writable) {
            PyErr_SetString(PyExc_TypeError, "the mapping is read-only");
            return -1;
        }
        b->base = m->base;
        b->len = m->size;
        b->has_view = 0;
        return 0;
    }
    if (PyObject_GetBuffer(obj, &b->view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return -1;
    b->base = b->view.buf;
    b->len = b->view.len;
    b->has_view = 1;
    return 0;
}

static void put_buf(BufRef *b) {
    if (b->has_view) PyBuffer_Release(&b->view);
}

/* Check off is a valid, naturally aligned place for an n-byte atomic. */
static char *atomic_at(BufRef *b, PyObject *offobj, int n) {
    Py_ssize_t off = PyLong_AsSsize_t(offobj);
    if (off == -1 && PyErr_Occurred()) return NULL;
    if (off < 0 || off > b->len - n) {
        PyErr_Format(PyExc_IndexError, "offset %zd out of range for a %d-byte value in a buffer of %zd bytes", off, n,
                     b->len);
        return NULL;
    }
    char *p = b->base + off;
    if (((uintptr_t)p) % (uintptr_t)n) {
        PyErr_Format(PyExc_ValueError, "offset %zd is not %d-byte aligned", off, n);
        return NULL;
    }
    return p;
}

static int check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    return 0;
}

#define ATOMIC_PROLOGUE(NAME, NARGS, WRITABLE, SIZE)  \
    if (check_nargs(NAME, nargs, NARGS) < 0) return NULL; \
    BufRef b;                                         \
    if (get_buf(args[0], &b, WRITABLE) < 0) return NULL; \
    char *p = atomic_at(&b, args[1], SIZE);           \
    if (!p) {                                         \
        put_buf(&b);                                  \
        return NULL;                                  \
    }

static int as_i64(PyObject *o, int64_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 0;
}

static int as_u32(PyObject *o, uint32_t *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if (v > 0xFFFFFFFFull) {
        PyErr_SetString(PyExc_OverflowError, "value does not fit in 32 unsigned bits");
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static PyObject *py_load32(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("load32", 2, 0, 4)
    uint32_t v = ld32(p);
    put_buf(&b);
    return PyLong_FromUnsignedLong(v);
}

static PyObject *py_load64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("load64", 2, 0, 8)
    int64_t v = ld64(p);
    put_buf(&b);
    return PyLong_FromLongLong(v);
}

static PyObject *py_store64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("store64", 3, 1, 8)
    int64_t v;
    if (as_i64(args[2], &v) < 0) {
        put_buf(&b);
        return NULL;
    }
    st64(p, v);
    put_buf(&b);
    Py_RETURN_NONE;
}

static PyObject *py_store32(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("store32", 3, 1, 4)
    uint32_t v;
    if (as_u32(args[2], &v) < 0) {
        put_buf(&b);
        return NULL;
    }
    __atomic_store_n((uint32_t *)p, v, __ATOMIC_RELEASE);
    put_buf(&b);
    Py_RETURN_NONE;
}

static PyObject *py_cas32(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("cas32", 4, 1, 4)
    uint32_t e, n;
    if (as_u32(args[2], &e) < 0 || as_u32(args[3], &n) < 0) {
        put_buf(&b);
        return NULL;
    }
    int ok = cas32p(p, e, n);
    put_buf(&b);
    return PyBool_FromLong(ok);
}

static PyObject *py_cas64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("cas64", 4, 1, 8)
    int64_t e, n;
    if (as_i64(args[2], &e) < 0 || as_i64(args[3], &n) < 0) {
        put_buf(&b);
        return NULL;
    }
    int ok = cas64p(p, e, n);
    put_buf(&b);
    return PyBool_FromLong(ok);
}

static PyObject *py_set_max64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("set_max64", 3, 1, 8)
    int64_t v;
    if (as_i64(args[2], &v) < 0) {
        put_buf(&b);
        return NULL;
    }
    setmax64p(p, v);
    int64_t now = ld64(p);
    put_buf(&b);
    return PyLong_FromLongLong(now);
}

static PyObject *py_set_min64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("set_min64", 3, 1, 8)
    int64_t v;
    if (as_i64(args[2], &v) < 0) {
        put_buf(&b);
        return NULL;
    }
    int64_t cur = ld64(p);
    while (cur > v && !__atomic_compare_exchange_n((int64_t *)p, &cur, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    int64_t now = ld64(p);
    put_buf(&b);
    return PyLong_FromLongLong(now);
}

static PyObject *py_add64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("add64", 3, 1, 8)
    int64_t d;
    if (as_i64(args[2], &d) < 0) {
        put_buf(&b);
        return NULL;
    }
    /* wrap-around like Java's getAndAdd, without C signed-overflow UB */
    uint64_t r = __atomic_add_fetch((uint64_t *)p, (uint64_t)d, __ATOMIC_ACQ_REL);
    put_buf(&b);
    return PyLong_FromLongLong((int64_t)r);
}

/* ------------------------------------------------------------------ document walking helpers */

/* Locate the int64 array of an index/index2index metadata document at doc_pos.
   Returns the offset of its capacity field (values start 16 bytes later) or -1 with an exception. */
static Py_ssize_t index_array_at(const char *base, Py_ssize_t size, Py_ssize_t doc_pos, int64_t want_cap,
                                 PyObject *name, Py_ssize_t where) {
    /* where: the file offset of the value that pointed here (reported when doc_pos is impossible) */
    if (doc_pos <= 0 || doc_pos > size - 4 || (doc_pos & 3)) {
        raise_corrupt(name, where, "index document position %zd is outside the file or misaligned", doc_pos);
        return -1;
    }
    uint32_t h = ld32(base + doc_pos);
    if ((h & HDR_EOF) != HDR_META) {
        raise_corrupt(name, doc_pos, "expected an index metadata document, found header 0x%08x", h);
        return -1;
    }
    Py_ssize_t end = doc_pos + 4 + (Py_ssize_t)(h & HDR_LENGTH_MASK);
    if (end > size) {
        raise_corrupt(name, doc_pos, "index document of %u bytes runs past the end of the mapping", h & HDR_LENGTH_MASK);
        return -1;
    }
    const unsigned char *u = (const unsigned char *)base;
    Py_ssize_t p = doc_pos + 4;
    if (p + 2 > end || u[p] != 0xB9 || u[p + 1] > 0x7F) goto bad;
    p += 2 + u[p + 1];
    while (p < end) {
        if (u[p] == 0x8F) {
            p++;
        } else if (u[p] == 0x8E) {
            if (p + 5 > end) goto bad;
            uint32_t n;
            memcpy(&n, base + p + 1, 4);
            p += 5 + (Py_ssize_t)n;
        } else {
            break;
        }
    }
    if (p >= end || u[p] != 0x8D) goto bad;
    p++;
    if ((p & 7) || p + 16 > end) goto bad;
    int64_t cap = ld64(base + p);
    if (cap <= 0 || (want_cap > 0 && cap != want_cap) || p + 16 + cap * 8 > end) {
        raise_corrupt(name, doc_pos, "index array capacity %lld does not match the store (%lld)", (long long)cap,
                      (long long)want_cap);
        return -1;
    }
    return p;
bad:
    raise_corrupt(name, doc_pos, "malformed index document");
    return -1;
}

/* ------------------------------------------------------------------ Geometry (Python side) */

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

static PyTypeObject GeometryType;

static PyObject *Geometry_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"map", "cycle", "shift", "align", "index_count", "index_spacing",
                             "write_position_offset", "has_hint", "index2index_position", "last_index_offset",
                             "data_start", "headerless", NULL};
    PyObject *map;
    long long v[10];
    int headerless = 0;
    if (PyTuple_GET_SIZE(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "Geometry() takes keyword arguments only");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!LLLLLLLLLL|p", kwlist, &MapType, &map, &v[0], &v[1], &v[2],
                                     &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &headerless))
        return NULL;
    GeometryObject *self = (GeometryObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->map = Py_NewRef(map);
    self->cycle = v[0];
    self->shift = v[1];
    self->align = v[2];
    self->index_count = v[3];
    self->index_spacing = v[4];
    self->write_position_offset = v[5];
    self->has_hint = v[6];
    self->index2index_position = v[7];
    self->last_index_offset = v[8];
    self->data_start = v[9];
    self->headerless = (char)headerless;
    return (PyObject *)self;
}

static void Geometry_dealloc(GeometryObject *self) {
    Py_XDECREF(self->map);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Geometry_repr(GeometryObject *self) {
    return PyUnicode_FromFormat(
        "Geometry(cycle=%lld, shift=%lld, align=%lld, index_count=%lld, index_spacing=%lld, "
        "write_position_offset=%lld, has_hint=%lld, index2index_position=%lld, last_index_offset=%lld, "
        "data_start=%lld, headerless=%s)",
        self->cycle, self->shift, self->align, self->index_count, self->index_spacing, self->write_position_offset,
        self->has_hint, self->index2index_position, self->last_index_offset, self->data_start,
        self->headerless ? "True" : "False");
}

#define GEO_MEMBER(NAME) {#NAME, T_LONGLONG, offsetof(GeometryObject, NAME), READONLY, NULL}
static PyMemberDef Geometry_members[] = {
    {"map", T_OBJECT_EX, offsetof(GeometryObject, map), READONLY, NULL},
    GEO_MEMBER(cycle),
    GEO_MEMBER(shift),
    GEO_MEMBER(align),
    GEO_MEMBER(index_count),
    GEO_MEMBER(index_spacing),
    GEO_MEMBER(write_position_offset),
    GEO_MEMBER(has_hint),
    GEO_MEMBER(index2index_position),
    GEO_MEMBER(last_index_offset),
    GEO_MEMBER(data_start),
    {"headerless", T_BOOL, offsetof(GeometryObject, headerless), READONLY, NULL},
    {NULL}};
#undef GEO_MEMBER

static PyTypeObject GeometryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chronq._native.Geometry",
    .tp_basicsize = sizeof(GeometryObject),
    .tp_dealloc = (destructor)Geometry_dealloc,
    .tp_repr = (reprfunc)Geometry_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Geometry(*, map, cycle, shift, align, index_count, index_spacing, write_position_offset, "
              "has_hint, index2index_position, last_index_offset, data_start, headerless=False): "
              "a cycle file's store geometry for AppenderCore/TailerCore._attach.",
    .tp_members = Geometry_members,
    .tp_new = Geometry_new,
};

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

static int parse_geometry(Geometry *g, PyObject *arg, long long wp_off) {
    /* `wp_off` overrides the object's write_position_offset (a headerless cycle has none: -1) */
    if (!Py_IS_TYPE(arg, &GeometryType)) {
        PyErr_Format(PyExc_TypeError, "_attach() expects a chronq._native.Geometry, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    GeometryObject *geo = (GeometryObject *)arg;
    MapObject *map = (MapObject *)geo->map;
    long long cycle = geo->cycle, shift = geo->shift, align = geo->align, count = geo->index_count,
              spacing = geo->index_spacing, hint_ok = geo->has_hint, i2i_pos = geo->index2index_position,
              li_off = geo->last_index_offset, data_start = geo->data_start;
    if (shift < 1 || shift > 62 || (align != 1 && align != 4) || count < 1 || (count & (count - 1)) || spacing < 1 ||
        (spacing & (spacing - 1))) {
        raise_corrupt(map->name, 0, "invalid store geometry (shift %lld, align %lld, indexCount %lld, "
                      "indexSpacing %lld)", shift, align, count, spacing);
        return -1;
    }
    if (wp_off < 0 || wp_off > map->size - 16 || (wp_off & 7) || i2i_pos < 0 || i2i_pos > map->size - 4 ||
        li_off < 0 || li_off > map->size - 8 || (li_off & 7) || data_start < 0 || data_start > map->size) {
        raise_corrupt(map->name, 0,
                      "store header fields point outside the file (%zd bytes) or are misaligned "
                      "(writePosition at %lld, index2index %lld, lastIndex at %lld, data from %lld)",
                      map->size, wp_off, i2i_pos, li_off, data_start);
        return -1;
    }
    Py_ssize_t i2i_arr = 0;
    if (i2i_pos > 0) {
        /* Java writes index2index right after the store header and the first index right after
           index2index: a header or length that disagrees means the prefix is damaged */
        if (data_start > i2i_pos) {
            raise_corrupt(map->name, 0, "the store header (ending at %lld) overlaps index2index at %lld",
                          data_start, i2i_pos);
            return -1;
        }
        i2i_arr = index_array_at(map->base, map->size, (Py_ssize_t)i2i_pos, count, map->name, 0);
        if (i2i_arr < 0) return -1;
        int64_t first = ld64(map->base + i2i_arr + 16);
        uint32_t h = ld32(map->base + i2i_pos);
        int64_t after = align_up((Py_ssize_t)i2i_pos + 4 + (Py_ssize_t)(h & HDR_LENGTH_MASK), (Py_ssize_t)align);
        if (first != 0 && first != after) {
            raise_corrupt(map->name, (Py_ssize_t)(i2i_arr + 16),
                          "the first index is at %lld, not right after index2index (%lld)", (long long)first,
                          (long long)after);
            return -1;
        }
        if (first != 0 &&
            index_array_at(map->base, map->size, (Py_ssize_t)first, count, map->name, i2i_arr + 16) < 0)
            return -1;
    }
    Py_INCREF(map);
    Py_XSETREF(g->map, map);
    g->base = map->base;
    g->size = map->size;
    g->cycle = cycle;
    g->shift = (int)shift;
    g->align = (int)align;
    g->count_bits = __builtin_ctzll((unsigned long long)count);
    g->spacing_bits = __builtin_ctzll((unsigned long long)spacing);
    g->wp_off = (Py_ssize_t)wp_off;
    g->hint_ok = hint_ok != 0;
    g->i2i_pos = (Py_ssize_t)i2i_pos;
    g->i2i_arr = i2i_arr;
    g->li_off = (Py_ssize_t)li_off;
    g->data_start = (Py_ssize_t)data_start;
    memset(g->cached_sec, 0, sizeof g->cached_sec);
    return 0;
}

/* The array of the secondary index document sec that index2index slot k names (checked once, then
   cached: random access would otherwise re-parse a document header, one more cache miss, per seek). */
static Py_ssize_t secondary_array(Geometry *g, int64_t k, int64_t sec) {
    int c = (int)(k & (ARRAY_CACHE - 1));
    if (g->cached_sec[c] == sec) return g->cached_arr[c];
    Py_ssize_t arr = index_array_at(g->base, g->size, (Py_ssize_t)sec, (int64_t)1 << g->count_bits, g->map->name,
                                    g->i2i_arr + 16 + 8 * k);
    if (arr < 0) return -1;
    g->cached_sec[c] = sec;
    g->cached_arr[c] = arr;
    return arr;
}

/* The index entry for seq (0 if none yet); -1 with an exception on a damaged index. */
static int index_entry(Geometry *g, int64_t seq, int64_t *out) {
    int64_t count = (int64_t)1 << g->count_bits;
    int64_t index2 = seq >> (g->count_bits + g->spacing_bits);
    *out = 0;
    if (!g->i2i_arr || index2 >= count) return 0;
    int64_t sec = ld64(g->base + g->i2i_arr + 16 + 8 * index2);
    if (!sec) return 0;
    Py_ssize_t arr = secondary_array(g, index2, sec);
    if (arr < 0) return -1;
    *out = ld64(g->base + arr + 16 + 8 * ((seq >> g->spacing_bits) & (count - 1)));
    return 0;
}

/* Find the position of the data document with sequence seq using the index, or the position where it
   will be written. Returns 1 found (pos_out = its header), 0 = seq is the next one to be written
   (pos_out = that free position), -1 = fewer documents, -2 = error (exception set),
   -3 = EOF before seq (pos_out = the EOF header). */
static int seek_seq(Geometry *g, int64_t seq, Py_ssize_t *pos_out) {
    Py_ssize_t pos = g->data_start;
    int64_t cur = 0;
    if (g->i2i_arr > 0 && seq >= 0) {
        int64_t count = (int64_t)1 << g->count_bits;
        int64_t index2 = seq >> (g->count_bits + g->spacing_bits);
        int64_t index1 = (seq >> g->spacing_bits) & (count - 1);
        if (index2 >= count) return -1;
        for (int64_t k = index2; k >= 0; k--) {
            int64_t sec = ld64(g->base + g->i2i_arr + 16 + 8 * k);
            if (sec == 0) continue;
            Py_ssize_t arr = secondary_array(g, k, sec);
            if (arr < 0) return -2;
            for (int64_t slot = (k == index2 ? index1 : count - 1); slot >= 0; slot--) {
                int64_t p = ld64(g->base + arr + 16 + 8 * slot);
                if (p != 0) {
                    if (p < g->data_start || p > g->size - 4 || (p & (g->align - 1))) {
                        raise_corrupt(g->map->name, (Py_ssize_t)(arr + 16 + 8 * slot),
                                      "index entry %lld points outside the data area or is misaligned",
                                      (long long)p);
                        return -2;
                    }
                    uint32_t eh = ld32(g->base + p);
                    if (eh == 0 || (eh & (HDR_NOT_COMPLETE | HDR_META))) {
                        raise_corrupt(g->map->name, (Py_ssize_t)(arr + 16 + 8 * slot),
                                      "index entry %lld does not point at a data document (header 0x%08x)",
                                      (long long)p, eh);
                        return -2;
                    }
                    pos = (Py_ssize_t)p;
                    cur = (k << (g->count_bits + g->spacing_bits)) + (slot << g->spacing_bits);
                    if (seq - cur > 8 && slot + 1 < count) {
                        /* the walk below is a chain of dependent loads: start fetching the lines it will
                           cross all at once (the next entry bounds the stretch) */
                        int64_t pn = ld64(g->base + arr + 16 + 8 * (slot + 1));
                        if (pn > p && pn <= g->size) {
                            int64_t est = p + (pn - p) * (seq - cur) / ((int64_t)1 << g->spacing_bits) + 128;
                            if (est > pn) est = pn;
                            for (int64_t a = p & ~(int64_t)63; a < est; a += 64) __builtin_prefetch(g->base + a, 0, 3);
                        }
                    }
                    goto scan;
                }
            }
        }
    }
scan:;
    int runs = 1; /* documents of one size are skipped in runs until a run turns out to be one long */
    for (;;) {
        if (pos > g->size - 4) {
            *pos_out = pos;
            return cur == seq ? 0 : -1;
        }
        uint32_t h = ld32(g->base + pos);
        if (h == HDR_EOF) {
            *pos_out = pos; /* seq just past the last of a closed cycle: park at EOF, read() moves on */
            return cur == seq ? 0 : -3;
        }
        if (h == 0 || (h & HDR_NOT_COMPLETE)) {
            *pos_out = pos;
            return cur == seq ? 0 : -1;
        }
        if (pos + 4 + (Py_ssize_t)(h & HDR_LENGTH_MASK) > g->size) {
            /* a length running past the mapping (a damaged header, or a file grown since it was mapped):
               stop at this header, never beyond the mapping; the forward read remaps or reports it */
            *pos_out = pos;
            return cur == seq ? 0 : -1;
        }
        Py_ssize_t step = align_up(4 + (Py_ssize_t)(h & HDR_LENGTH_MASK), g->align);
        if (!(h & HDR_META)) {
            if (cur == seq) {
                *pos_out = pos;
                return 1;
            }
            cur++;
            if (runs) {
                /* Walking is a chain of dependent loads (each header gives the next position). When the
                   next headers are this same complete data header, each `step` apart, the walk would
                   visit exactly those positions: checking them is independent loads, several per cycle. */
                Py_ssize_t next = pos + step, n = 0;
                while (cur + n < seq && next <= g->size - 4 && ld32(g->base + next) == h) {
                    next += step;
                    n++;
                }
                if (n) {
                    cur += n;
                    pos = next;
                    continue;
                }
                runs = 0; /* sizes vary here: the plain walk costs less than testing every step */
            }
        }
        pos += step;
    }
}

/* Sequence number of the data document at wp, from the hint or the index + a scan. -1 on error. */
static int64_t seq_at_position(Geometry *g, Py_ssize_t wp) {
    if (g->hint_ok) {
        uint64_t hint = (uint64_t)ld64(g->base + g->wp_off + 8);
        uint64_t w = (uint64_t)wp;
        if (g->shift < 64 && (hint >> g->shift) == ((w << g->shift) >> g->shift)) {
            return (int64_t)(hint & ((1ull << g->shift) - 1));
        }
    }
    /* fall back: count data documents from the start (rare: foreign writer without a hint) */
    Py_ssize_t pos = g->data_start;
    int64_t seq = 0;
    while (pos <= g->size - 4) {
        uint32_t h = ld32(g->base + pos);
        if (h == 0 || (h & HDR_NOT_COMPLETE)) break;
        if (pos == wp) return (h & HDR_META) ? -1 : seq;
        if (!(h & HDR_META)) seq++;
        pos = align_up(pos + 4 + (Py_ssize_t)(h & HDR_LENGTH_MASK), g->align);
    }
    raise_corrupt(g->map->name, wp, "writePosition %zd is not the start of a data document", wp);
    return -1;
}

/* ------------------------------------------------------------------ AppenderCore */

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
    int clock_mode; /* 0: system realtime vs [cycle_start_ms, cycle_end_ms); 1: ask Python each write */
    int64_t cycle_start_ms, cycle_end_ms;
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

static void App_clear_lock_view(AppenderObject *self) {
    if (self->has_lock_view) {
        PyBuffer_Release(&self->lock_view);
        self->has_lock_view = 0;
    }
    self->lock_p = NULL;
    Py_CLEAR(self->lock_obj);
}

static int App_traverse(AppenderObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->g.map);
    Py_VISIT(self->lock_obj);
    return 0;
}

static void App_dealloc(AppenderObject *self) {
    PyObject_GC_UnTrack(self);
    PyMem_Free(self->deferred);
    App_clear_lock_view(self);
    doorbell_clear(&self->db); /* doorbell */
    Py_CLEAR(self->g.map);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *App_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    AppenderObject *self = (AppenderObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->last_index = -1;
    self->spin = 20000;
    self->cycle_start_ms = INT64_MIN;
    self->cycle_end_ms = INT64_MAX;
    self->grow_at = PY_SSIZE_T_MAX;
    self->alloc_end = PY_SSIZE_T_MAX;
    self->ahead_at = PY_SSIZE_T_MAX;
    return (PyObject *)self;
}

static PyObject *App_attach(AppenderObject *self, PyObject *arg) {
    if (!Py_IS_TYPE(arg, &GeometryType)) {
        PyErr_Format(PyExc_TypeError, "_attach() expects a chronq._native.Geometry, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    GeometryObject *geo = (GeometryObject *)arg;
    if (geo->headerless) { /* no writePosition to append at (the queue refuses such files earlier) */
        PyErr_SetString(PyExc_ValueError, "cannot append to a headerless cycle");
        return NULL;
    }
    if (parse_geometry(&self->g, arg, geo->write_position_offset) < 0) return NULL;
    self->cache_valid = 0;
    /* Never append after a broken chain: the document at writePosition must be reachable from the
       index (or the start) by walking headers, else what we append could never be read. */
    Geometry *g = &self->g;
    int64_t wp = ld64(g->base + g->wp_off);
    if (wp != 0) {
        if (wp < g->data_start || wp > g->size - 4) {
            raise_corrupt(g->map->name, g->wp_off, "writePosition %lld is outside the file", (long long)wp);
            goto fail;
        }
        int64_t s = seq_at_position(g, (Py_ssize_t)wp);
        if (s < 0) goto fail;
        Py_ssize_t pos;
        int r = seek_seq(g, s, &pos);
        if (r == -2) goto fail;
        if (r != 1 || pos != (Py_ssize_t)wp) {
            raise_corrupt(g->map->name, (Py_ssize_t)wp,
                          "the documents before writePosition %lld do not lead to it (sequence %lld)",
                          (long long)wp, (long long)s);
            goto fail;
        }
    }
    Py_RETURN_NONE;
fail:
    Py_CLEAR(self->g.map);
    self->g.base = NULL;
    self->g.size = 0;
    return NULL;
}

static PyObject *App_detach(AppenderObject *self, PyObject *Py_UNUSED(ignored)) {
    Py_CLEAR(self->g.map);
    self->g.base = NULL;
    self->g.size = 0;
    self->cache_valid = 0;
    Py_RETURN_NONE;
}

static PyObject *App_set_lock(AppenderObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t off;
    long long pid;
    if (!PyArg_ParseTuple(args, "OnL", &obj, &off, &pid)) return NULL;
    if (self->lock_depth) {
        PyErr_SetString(PyExc_RuntimeError, "cannot change the lock while it is held");
        return NULL;
    }
    App_clear_lock_view(self);
    if (obj == Py_None) Py_RETURN_NONE;
    if (PyObject_GetBuffer(obj, &self->lock_view, PyBUF_WRITABLE) < 0) return NULL;
    self->has_lock_view = 1;
    if (off < 0 || off > self->lock_view.len - 8 || ((uintptr_t)((char *)self->lock_view.buf + off) & 7)) {
        App_clear_lock_view(self);
        PyErr_Format(PyExc_ValueError, "write lock offset %zd is out of range or not 8-byte aligned", off);
        return NULL;
    }
    Py_INCREF(obj);
    self->lock_obj = obj;
    self->lock_p = (char *)self->lock_view.buf + off;
    self->pid = (int64_t)pid;
    Py_RETURN_NONE;
}

/* doorbell: _set_doorbell(table_buffer | None, word_off, probe_off) (-1: none) */
static PyObject *App_set_doorbell(AppenderObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t word_off, probe_off;
    if (!PyArg_ParseTuple(args, "Onn", &obj, &word_off, &probe_off)) return NULL;
    if (doorbell_set(&self->db, obj, word_off, probe_off) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *App_set_clock(AppenderObject *self, PyObject *args) {
    int mode;
    long long start, end;
    if (!PyArg_ParseTuple(args, "pLL", &mode, &start, &end)) return NULL;
    self->clock_mode = mode;
    self->cycle_start_ms = start;
    self->cycle_end_ms = end;
    Py_RETURN_NONE;
}

static PyObject *App_set_grow_at(AppenderObject *self, PyObject *args) {
    Py_ssize_t v, alloc = PY_SSIZE_T_MAX, ahead = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "n|nn", &v, &alloc, &ahead)) return NULL;
    self->grow_at = v;
    self->alloc_end = alloc;
    self->ahead_at = ahead;
    Py_RETURN_NONE;
}

/* After a write has published and released the lock: once the end is past `ahead_at`, reserve and
 * prefault the next stretch of the file now (Appender._reserve_ahead), so that no write waits for
 * it between taking its position and publishing, and no other writer waits for it on the lock.
 * The write itself succeeded, so an error here is reported as unraisable and its index returned;
 * only a KeyboardInterrupt or SystemExit arriving meanwhile propagates (-1). */
static int App_after_write(AppenderObject *self) {
    if (self->end_pos <= self->ahead_at || self->lock_depth || self->atomic || self->claimed) return 0;
    self->ahead_at = PY_SSIZE_T_MAX; /* until _reserve_ahead sets it again */
    PyObject *r = PyObject_CallMethod((PyObject *)self, "_reserve_ahead", NULL);
    if (r) {
        Py_DECREF(r);
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyErr_WriteUnraisable((PyObject *)self);
    return 0;
}

static int App_lock(AppenderObject *self) {
    if (self->lock_depth) {
        self->lock_depth++;
        return 0;
    }
    if (self->lock_p) {
        int ok = 0;
        for (int i = 0; i < self->spin; i++) {
            if (cas64p(self->lock_p, LOCK_UNLOCKED, self->pid)) {
                ok = 1;
                break;
            }
            __builtin_ia32_pause();
        }
        if (!ok) {
            /* contended or stale: Python backs off, checks /proc/<pid> and may take over */
            PyObject *r = PyObject_CallMethod((PyObject *)self, "_lock_contended", NULL);
            if (!r) return -1;
            Py_DECREF(r);
        }
    }
    self->lock_depth = 1;
    return 0;
}

static void App_unlock(AppenderObject *self) {
    if (self->lock_depth > 1) {
        self->lock_depth--;
        return;
    }
    self->lock_depth = 0;
    /* we hold it, so a release store frees it; a lock taken over from us (we were thought dead) stays */
    if (self->lock_p && ld64(self->lock_p) == self->pid) st64(self->lock_p, LOCK_UNLOCKED);
}

static int64_t clock_ms(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* How far CLOCK_REALTIME_COARSE may lag the real time: one scheduler tick normally, up to about a second
   on a nohz_full CPU (1 Hz residual tick). Within this distance of a cycle's end, the precise clock decides. */
#define COARSE_LAG_MS 2500

/* With the lock held: make sure we are in the cycle the clock says (rolling via Python). */
static int App_check_cycle(AppenderObject *self) {
    if (self->g.map) {
        if (self->clock_mode == 0) {
            /* the coarse clock never runs ahead of the real one: far from the end it is enough (~10 ns
               against ~45 ns for the precise clock on a VM) */
            int64_t c = clock_ms(CLOCK_REALTIME_COARSE);
            if (c >= self->cycle_start_ms && c < self->cycle_end_ms - COARSE_LAG_MS) return 0;
            int64_t t = clock_ms(CLOCK_REALTIME);
            if (t >= self->cycle_start_ms && t < self->cycle_end_ms) return 0;
        }
    }
    PyObject *r = PyObject_CallMethod((PyObject *)self, "_roll", "O", Py_False);
    if (!r) return -1;
    Py_DECREF(r);
    if (!self->g.map) {
        raise_chronq("appender has no cycle file after rolling");
        return -1;
    }
    return 0;
}

/* With the lock held: find the first free header position and the next sequence number.
   Handles other writers, crashed leftovers and EOF (roll via Python). */
static int App_locate_end(AppenderObject *self) {
    int remapped = 0;
    for (int attempt = 0; attempt < 16; attempt++) {
        Geometry *g = &self->g;
        int64_t wp = ld64(g->base + g->wp_off);
        Py_ssize_t pos;
        int64_t seq;
        if (self->cache_valid && wp == self->seen_wp) {
            pos = self->end_pos;
            seq = self->next_seq;
        } else if (wp == 0) {
            pos = g->data_start;
            seq = 0;
        } else {
            if (wp >= g->data_start && wp > g->size - 4 && !remapped) {
                /* Another writer (process or thread) grew the file and appended past the end of our
                   mapping, which is as big as the file was when we last looked: map the file as it is
                   now (Appender._remap) and look again. Only a writePosition outside the grown file
                   is corrupt. */
                PyObject *r = PyObject_CallMethod((PyObject *)self, "_remap", NULL);
                if (!r) return -1;
                Py_DECREF(r);
                if (!self->g.map) {
                    raise_chronq("appender has no cycle file after remapping");
                    return -1;
                }
                self->cache_valid = 0;
                remapped = 1;
                attempt--;
                continue;
            }
            if (wp < g->data_start || wp > g->size - 4) {
                raise_corrupt(g->map->name, g->wp_off, "writePosition %lld is outside the file (%zd bytes)",
                              (long long)wp, g->size);
                return -1;
            }
            int64_t s = seq_at_position(g, (Py_ssize_t)wp);
            if (s < 0) return -1;
            uint32_t h = ld32(g->base + wp);
            pos = align_up((Py_ssize_t)wp + 4 + (Py_ssize_t)(h & HDR_LENGTH_MASK), g->align);
            seq = s + 1;
        }
        int eof = 0;
        for (;;) {
            if (pos > g->size - 4) break; /* grown by the caller */
            char *hp = g->base + pos;
            uint32_t h = ld32(hp);
            if (h == 0) break;
            if (h == HDR_EOF) {
                eof = 1;
                break;
            }
            if (h & HDR_NOT_COMPLETE) {
                /* leftover of a writer that died mid-document (we hold the lock): reclaim it */
                cas32p(hp, h, 0);
                break;
            }
            if (!(h & HDR_META)) seq++;
            pos = align_up(pos + 4 + (Py_ssize_t)(h & HDR_LENGTH_MASK), g->align);
        }
        if (!eof) {
            self->end_pos = pos;
            self->next_seq = seq;
            self->seen_wp = wp;
            self->cache_valid = 1;
            return 0;
        }
        self->cache_valid = 0;
        PyObject *r = PyObject_CallMethod((PyObject *)self, "_roll", "O", Py_True);
        if (!r) return -1;
        Py_DECREF(r);
        if (!self->g.map) {
            raise_chronq("appender has no cycle file after rolling");
            return -1;
        }
    }
    raise_chronq("could not find the end of the queue (rolled 16 times)");
    return -1;
}

static Py_ssize_t index_doc_len(Py_ssize_t doc_pos, int64_t count) {
    Py_ssize_t q = doc_pos + 4 + 7;
    Py_ssize_t pad = (7 - (q & 7)) & 7;
    return 7 + pad + 1 + 16 + 8 * (Py_ssize_t)count;
}

/* Make sure [pos, need_end) is mapped and the file is Java-sized for a header at pos. */
static int App_ensure_room(AppenderObject *self, Py_ssize_t pos, Py_ssize_t need_end) {
    if (need_end <= self->g.size && pos < self->grow_at && need_end <= self->alloc_end) return 0;
    PyObject *r = PyObject_CallMethod((PyObject *)self, "_grow", "nn", pos, need_end);
    if (!r) return -1;
    Py_DECREF(r);
    if (need_end > self->g.size) {
        raise_chronq("could not map %zd bytes of the cycle file", need_end);
        return -1;
    }
    self->cache_valid = 0;
    return 0;
}

/* Write a metadata "index" document at pos (already room-checked). Returns its end position. */
static Py_ssize_t write_index_doc(Geometry *g, Py_ssize_t pos, int64_t count) {
    char *b = g->base;
    Py_ssize_t len = index_doc_len(pos, count);
    unsigned char *u = (unsigned char *)b + pos + 4;
    memcpy(u, "\xb9\x05index", 7);
    Py_ssize_t p = 7;
    Py_ssize_t pad = (7 - ((pos + 4 + 7) & 7)) & 7;
    if (pad <= 4) {
        memset(u + p, 0x8F, (size_t)pad);
    } else {
        u[p] = 0x8E;
        uint32_t n = (uint32_t)(pad - 5);
        memcpy(u + p + 1, &n, 4);
        memset(u + p + 5, 0, (size_t)n);
    }
    p += pad;
    u[p++] = 0x8D;
    memcpy(u + p, &count, 8);
    memset(u + p + 8, 0, 8 + 8 * (size_t)count);
    Py_ssize_t end = pos + 4 + len;
    Py_ssize_t zero_end = end + 8 < g->size ? end + 8 : g->size;
    memset(b + end, 0, (size_t)(zero_end - end));
    __atomic_store_n((uint32_t *)(b + pos), HDR_META | (uint32_t)len, __ATOMIC_RELEASE);
    return align_up(end, g->align);
}

/* Index entries for the published data document seq at pos; ip is the index array written inline for
   its index2index slot (0: none). */
static int App_index(AppenderObject *self, int64_t seq, Py_ssize_t pos, Py_ssize_t ip) {
    Geometry *g = &self->g;
    char *b = g->base;
    int64_t count = (int64_t)1 << g->count_bits;
    int64_t index2 = seq >> (g->count_bits + g->spacing_bits);
    char *slot2 = b + g->i2i_arr + 16 + 8 * index2;
    if (ip) {
        cas64p(slot2, 0, ip);
        setmax64p(b + g->i2i_arr + 8, index2 + 1);
    }
    int64_t sec = ld64(slot2);
    Py_ssize_t arr = index_array_at(b, g->size, (Py_ssize_t)sec, count, g->map->name, slot2 - b);
    if (arr < 0) return -1;
    int64_t index1 = (seq >> g->spacing_bits) & (count - 1);
    char *slot1 = b + arr + 16 + 8 * index1;
    if (ld64(slot1) == 0) {
        st64(slot1, pos);
        setmax64p(b + arr + 8, index1 + 1);
    }
    if (g->li_off) setmax64p(b + g->li_off, seq + ((int64_t)1 << g->spacing_bits));
    return 0;
}

static int App_defer_index(AppenderObject *self, int64_t seq, Py_ssize_t pos, Py_ssize_t ip) {
    if (self->n_deferred == self->cap_deferred) {
        Py_ssize_t cap = self->cap_deferred ? self->cap_deferred * 2 : 256;
        IndexWork *w = PyMem_Realloc(self->deferred, (size_t)cap * sizeof(IndexWork));
        if (!w) {
            PyErr_NoMemory();
            return -1;
        }
        self->deferred = w;
        self->cap_deferred = cap;
    }
    self->deferred[self->n_deferred++] = (IndexWork){seq, pos, ip};
    return 0;
}

/* The body of one append, with the lock held and the end located. */
static int64_t App_put(AppenderObject *self, const char *data, Py_ssize_t len, int meta) {
    Geometry *g;
    if (len > (Py_ssize_t)HDR_LENGTH_MASK) {
        PyErr_Format(PyExc_ValueError, "a message of %zd bytes is longer than the 2^30-1 a header can hold", len);
        return -1;
    }
    Py_ssize_t blen = len ? len : 1;
    for (int attempt = 0;; attempt++) {
        g = &self->g;
        Py_ssize_t pos = self->end_pos;
        int64_t seq = self->next_seq;
        int64_t count = (int64_t)1 << g->count_bits;
        Py_ssize_t need = pos + 4 + blen + 8;
        int new_index = 0, boundary = 0;
        int64_t index2 = 0;
        if (!meta) {
            if (seq >> g->shift) {
                raise_chronq("cycle %lld is full: sequence %lld does not fit in %d bits", (long long)g->cycle,
                             (long long)seq, g->shift);
                return -1;
            }
            index2 = seq >> (g->count_bits + g->spacing_bits);
            boundary = g->i2i_arr && (seq & (((int64_t)1 << g->spacing_bits) - 1)) == 0;
            if (boundary) {
                if (index2 >= count) {
                    raise_chronq("cycle %lld is full: the number of entries exceeds the index capacity",
                                 (long long)g->cycle);
                    return -1;
                }
                /* inside an atomic block the slot stays empty until publication: one array per slot */
                if (ld64(g->base + g->i2i_arr + 16 + 8 * index2) == 0 &&
                    !(self->atomic && index2 == self->atomic_index2)) {
                    new_index = 1;
                    Py_ssize_t ip = align_up(pos + 4 + blen, g->align);
                    need = ip + 4 + index_doc_len(ip, count) + 8;
                }
            }
        }
        if (need > g->size || pos >= self->grow_at || need > self->alloc_end) {
            if (attempt > 2) {
                raise_chronq("no room for a %zd-byte message at position %zd", len, pos);
                return -1;
            }
            if (App_ensure_room(self, pos, need) < 0) return -1;
            /* an atomic block owns the end (its first header is still 0): nothing to locate */
            if (!self->atomic && App_locate_end(self) < 0) return -1;
            continue;
        }
        char *b = g->base;
        char *body = b + pos + 4;
        if (len)
            memcpy(body, data, (size_t)len);
        else
            body[0] = (char)0x8F;
        Py_ssize_t end = pos + 4 + blen;
        Py_ssize_t zero_end = end + 8 < g->size ? end + 8 : g->size;
        memset(b + end, 0, (size_t)(zero_end - end));
        uint32_t header = (uint32_t)blen | (meta ? HDR_META : 0);
        if (self->atomic && !self->gate_pos) {
            self->gate_pos = pos; /* published when the block ends */
            self->gate_header = header;
        } else if (!cas32p(b + pos, 0, header)) {
            self->cache_valid = 0;
            raise_corrupt(g->map->name, pos, "header changed while the document was being written (0x%08x)",
                          ld32(b + pos));
            return -1;
        }
        Py_ssize_t next = align_up(end, g->align);
        int64_t index = ((int64_t)g->cycle << g->shift) | seq;
        if (meta) {
            self->end_pos = next;
            return index;
        }
        int indexed = boundary && (!g->li_off || seq >= ld64(b + g->li_off));
        Py_ssize_t ip = 0;
        if (indexed && new_index) {
            ip = next;
            next = write_index_doc(g, ip, count);
        }
        self->end_pos = next;
        self->next_seq = seq + 1;
        if (self->atomic) {
            if (indexed) {
                if (App_defer_index(self, seq, pos, ip) < 0) return -1;
                if (ip) self->atomic_index2 = index2;
            }
            self->last_data_pos = pos;
            self->last_data_seq = seq;
            return index;
        }
        raise64p(b + g->wp_off, pos); /* under the lock */
        if (g->hint_ok) st64(b + g->wp_off + 8, (int64_t)(((uint64_t)pos << g->shift) + (uint64_t)seq));
        if (indexed && App_index(self, seq, pos, ip) < 0) return -1;
        self->seen_wp = ld64(b + g->wp_off);
        self->cache_valid = (self->seen_wp == pos);
        self->last_index = index;
        return index;
    }
}

static int App_prepare(AppenderObject *self) {
    if (App_lock(self) < 0) return -1;
    if (self->atomic) return 0; /* the block pinned its cycle and owns the end */
    if (App_check_cycle(self) < 0 || App_locate_end(self) < 0) {
        App_unlock(self);
        return -1;
    }
    return 0;
}

static PyObject *App_write_impl(AppenderObject *self, PyObject *obj, int meta) {
    if (self->claimed) {
        PyErr_SetString(PyExc_RuntimeError, "a document is open on this appender (writing_document)");
        return NULL;
    }
    Py_buffer v;
    const char *data;
    Py_ssize_t len;
    if (PyBytes_CheckExact(obj)) {
        data = PyBytes_AS_STRING(obj);
        len = PyBytes_GET_SIZE(obj);
        v.obj = NULL;
    } else {
        if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) < 0) return NULL;
        data = v.buf;
        len = v.len;
    }
    int64_t index = -1;
    if (App_prepare(self) == 0) {
        index = App_put(self, data, len, meta);
        App_unlock(self);
        if (index >= 0 && !self->lock_depth) doorbell_after_publish(&self->db, (PyObject *)self); /* doorbell */
    }
    if (v.obj) PyBuffer_Release(&v);
    if (index < 0 || App_after_write(self) < 0) return NULL;
    return PyLong_FromLongLong(index);
}

static PyObject *App_write(AppenderObject *self, PyObject *obj) { return App_write_impl(self, obj, 0); }
static PyObject *App_write_meta(AppenderObject *self, PyObject *obj) { return App_write_impl(self, obj, 1); }

static PyObject *App_write_many(AppenderObject *self, PyObject *iterable) {
    if (self->claimed) {
        PyErr_SetString(PyExc_RuntimeError, "a document is open on this appender (writing_document)");
        return NULL;
    }
    PyObject *it = PyObject_GetIter(iterable);
    if (!it) return NULL;
    if (App_lock(self) < 0) {
        Py_DECREF(it);
        return NULL;
    }
    Py_ssize_t n = 0;
    int64_t index = 0;
    PyObject *item;
    int failed = 0;
    int64_t batch_start = 0;
    while ((item = PyIter_Next(it))) {
        Py_buffer v;
        const char *data;
        Py_ssize_t len;
        if (PyBytes_CheckExact(item)) {
            data = PyBytes_AS_STRING(item);
            len = PyBytes_GET_SIZE(item);
            v.obj = NULL;
        } else if (PyObject_GetBuffer(item, &v, PyBUF_SIMPLE) < 0) {
            Py_DECREF(item);
            failed = 1;
            break;
        } else {
            data = v.buf;
            len = v.len;
        }
        /* check the clock once per 1024 messages and whenever we have no file yet (an atomic block
           pinned its cycle and owns the end) */
        if (self->atomic) {
            /* nothing to check */
        } else if ((n & 1023) == 0 || !self->g.map) {
            if (App_check_cycle(self) < 0 || App_locate_end(self) < 0) failed = 1;
        } else if (!self->cache_valid || ld64(self->g.base + self->g.wp_off) != self->seen_wp) {
            if (App_locate_end(self) < 0) failed = 1;
        }
        if (!failed) {
            index = App_put(self, data, len, 0);
            if (index < 0) failed = 1;
        }
        if (v.obj) PyBuffer_Release(&v);
        Py_DECREF(item);
        if (failed) break;
        if (n == 0) batch_start = index;
        n++;
    }
    App_unlock(self);
    if (n && !self->lock_depth) doorbell_after_publish(&self->db, (PyObject *)self); /* doorbell */
    Py_DECREF(it);
    if (failed || PyErr_Occurred() || App_after_write(self) < 0) return NULL;
    (void)batch_start;
    return PyLong_FromSsize_t(n);
}

/* writing_document support: _begin(meta) -> index (lock held), _commit(data), _abort() */
static PyObject *App_begin(AppenderObject *self, PyObject *arg) {
    if (self->claimed) {
        PyErr_SetString(PyExc_RuntimeError, "a document is already open on this appender");
        return NULL;
    }
    int meta = PyObject_IsTrue(arg);
    if (meta < 0) return NULL;
    if (App_prepare(self) < 0) return NULL;
    self->claimed = 1;
    self->claim_meta = meta;
    return PyLong_FromLongLong(((int64_t)self->g.cycle << self->g.shift) | self->next_seq);
}

static PyObject *App_commit(AppenderObject *self, PyObject *obj) {
    if (!self->claimed) {
        PyErr_SetString(PyExc_RuntimeError, "no document is open");
        return NULL;
    }
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) < 0) return NULL;
    int64_t index = App_put(self, v.buf, v.len, self->claim_meta);
    PyBuffer_Release(&v);
    self->claimed = 0;
    App_unlock(self);
    if (index >= 0 && !self->lock_depth) doorbell_after_publish(&self->db, (PyObject *)self); /* doorbell */
    if (index < 0 || App_after_write(self) < 0) return NULL;
    return PyLong_FromLongLong(index);
}

static PyObject *App_abort(AppenderObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->claimed) {
        self->claimed = 0;
        App_unlock(self);
    }
    Py_RETURN_NONE;
}

/* atomic blocks: _atomic_begin() takes the lock and finds the end; _atomic_end(publish) publishes the
   first header, then writes the deferred index entries and writePosition, or drops the block. */
static PyObject *App_atomic_begin(AppenderObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->claimed || self->atomic) {
        PyErr_SetString(PyExc_RuntimeError, "a document or an atomic block is already open on this appender");
        return NULL;
    }
    if (App_prepare(self) < 0) return NULL;
    self->atomic = 1;
    self->gate_pos = 0;
    self->atomic_index2 = -1;
    self->last_data_pos = -1;
    self->n_deferred = 0;
    Py_RETURN_NONE;
}

static PyObject *App_atomic_end(AppenderObject *self, PyObject *arg) {
    int publish = PyObject_IsTrue(arg);
    if (publish < 0) return NULL;
    if (!self->atomic) {
        if (!publish) Py_RETURN_NONE;
        PyErr_SetString(PyExc_RuntimeError, "no atomic block is open on this appender");
        return NULL;
    }
    if (self->claimed) { /* a writing_document left open inside the block goes with it */
        self->claimed = 0;
        App_unlock(self);
    }
    self->atomic = 0;
    int failed = 0;
    Geometry *g = &self->g;
    if (publish && self->gate_pos && !g->map) { /* the file was lost inside the block (a failed remap) */
        raise_chronq("the atomic block's cycle file is no longer mapped: nothing of the block was published");
        failed = 1;
    } else if (publish && self->gate_pos) {
        char *b = g->base;
        if (!cas32p(b + self->gate_pos, 0, self->gate_header)) {
            raise_corrupt(g->map->name, self->gate_pos,
                          "the first header of an atomic block changed before it was published (0x%08x): "
                          "another writer took the write lock",
                          ld32(b + self->gate_pos));
            failed = 1;
        } else {
            for (Py_ssize_t i = 0; i < self->n_deferred && !failed; i++) {
                IndexWork *w = &self->deferred[i];
                if (App_index(self, w->seq, w->pos, w->ip) < 0) failed = 1;
            }
            if (!failed && self->last_data_pos >= 0) {
                raise64p(b + g->wp_off, self->last_data_pos);
                if (g->hint_ok)
                    st64(b + g->wp_off + 8,
                         (int64_t)(((uint64_t)self->last_data_pos << g->shift) + (uint64_t)self->last_data_seq));
                self->last_index = ((int64_t)g->cycle << g->shift) | self->last_data_seq;
            }
        }
    }
    self->gate_pos = 0;
    self->n_deferred = 0;
    if (publish && !failed && g->map) {
        self->seen_wp = ld64(g->base + g->wp_off);
        self->cache_valid = 1;
    } else {
        self->cache_valid = 0;
    }
    App_unlock(self);
    if (publish && !failed && !self->lock_depth) doorbell_after_publish(&self->db, (PyObject *)self); /* doorbell */
    if (failed) return NULL;
    Py_RETURN_NONE;
}

/* Called by Python slow paths that need the lock around their own work (e.g. EOF normalising). */
static PyObject *App_lock_py(AppenderObject *self, PyObject *Py_UNUSED(ignored)) {
    if (App_lock(self) < 0) return NULL;
    Py_RETURN_NONE;
}
static PyObject *App_unlock_py(AppenderObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->lock_depth) App_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *App_end_position(AppenderObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->g.map) Py_RETURN_NONE;
    if (App_locate_end(self) < 0) return NULL;
    return Py_BuildValue("nL", self->end_pos, (long long)self->next_seq);
}

static PyMethodDef App_methods[] = {
    {"write", (PyCFunction)App_write, METH_O, NULL},
    {"write_meta", (PyCFunction)App_write_meta, METH_O, NULL},
    {"write_many", (PyCFunction)App_write_many, METH_O, NULL},
    {"_begin", (PyCFunction)App_begin, METH_O, NULL},
    {"_commit", (PyCFunction)App_commit, METH_O, NULL},
    {"_abort", (PyCFunction)App_abort, METH_NOARGS, NULL},
    {"_atomic_begin", (PyCFunction)App_atomic_begin, METH_NOARGS, NULL},
    {"_atomic_end", (PyCFunction)App_atomic_end, METH_O, NULL},
    {"_attach", (PyCFunction)App_attach, METH_O, NULL},
    {"_detach", (PyCFunction)App_detach, METH_NOARGS, NULL},
    {"_set_lock", (PyCFunction)App_set_lock, METH_VARARGS, NULL},
    {"_set_doorbell", (PyCFunction)App_set_doorbell, METH_VARARGS, NULL}, /* doorbell */
    {"_set_clock", (PyCFunction)App_set_clock, METH_VARARGS, NULL},
    {"_set_grow_at", (PyCFunction)App_set_grow_at, METH_VARARGS, NULL},
    {"lock", (PyCFunction)App_lock_py, METH_NOARGS,
     "lock(): take the queue's write lock, held across several writes until unlock()"},
    {"unlock", (PyCFunction)App_unlock_py, METH_NOARGS, "unlock(): release what lock() took"},
    {"_end_position", (PyCFunction)App_end_position, METH_NOARGS, NULL},
    {NULL}};

static PyObject *App_get_last_index(AppenderObject *self, void *c) { return PyLong_FromLongLong(self->last_index); }
static PyObject *App_get_cycle(AppenderObject *self, void *c) {
    if (!self->g.map) Py_RETURN_NONE;
    return PyLong_FromLongLong(self->g.cycle);
}
static PyObject *App_get_map(AppenderObject *self, void *c) {
    if (!self->g.map) Py_RETURN_NONE;
    return Py_NewRef((PyObject *)self->g.map);
}
static PyObject *App_get_locked(AppenderObject *self, void *c) { return PyBool_FromLong(self->lock_depth > 0); }

static PyGetSetDef App_getset[] = {
    {"last_index_appended", (getter)App_get_last_index, NULL, "index of the last data message this appender wrote (-1: none)", NULL},
    {"cycle", (getter)App_get_cycle, NULL, NULL, NULL},
    {"_map", (getter)App_get_map, NULL, NULL, NULL},
    {"_locked", (getter)App_get_locked, NULL, NULL, NULL},
    {NULL}};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chronq._native.AppenderCore",
    .tp_basicsize = sizeof(AppenderObject),
    .tp_dealloc = (destructor)App_dealloc,
    .tp_traverse = (traverseproc)App_traverse,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Native appender state; subclassed by chronq.appender.Appender for the slow paths.",
    .tp_methods = App_methods,
    .tp_getset = App_getset,
    .tp_new = App_new,
};

/* ------------------------------------------------------------------ Excerpt */

typedef struct {
    PyObject_HEAD
    MapObject *map;
    Py_ssize_t position; /* header position */
    Py_ssize_t length;   /* body length as stored */
    int64_t index;
    int64_t cycle;
    int64_t seq;
    int metadata;
    int raw; /* from a headerless (libchronicle) file: bytes as written, no Java padding rule */
} ExcerptObject;

static PyTypeObject ExcerptType;

/* Excerpts die and are born once per iteration step: keep a few for reuse (like CPython's float freelist). */
#define EX_FREELIST 64
static ExcerptObject *ex_freelist[EX_FREELIST];
static int ex_nfree = 0;

static void Ex_dealloc(ExcerptObject *self) {
    Py_CLEAR(self->map);
    if (ex_nfree < EX_FREELIST && Py_IS_TYPE(self, &ExcerptType)) {
        ex_freelist[ex_nfree++] = self;
        return;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static ExcerptObject *Ex_alloc(void) {
    if (ex_nfree) {
        ExcerptObject *ex = ex_freelist[--ex_nfree];
        PyObject_Init((PyObject *)ex, &ExcerptType);
        return ex;
    }
    return PyObject_New(ExcerptObject, &ExcerptType);
}

static Py_ssize_t ex_payload_len(ExcerptObject *self) {
    /* an empty message is stored as one PADDING byte (Java's rule); give it back as empty */
    if (self->length == 1 && !self->raw && (unsigned char)self->map->base[self->position + 4] == 0x8F) return 0;
    return self->length;
}

static int Ex_getbuffer(ExcerptObject *self, Py_buffer *view, int flags) {
    if (!self->map) {
        PyErr_SetString(PyExc_BufferError, "excerpt has no data");
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, self->map->base + self->position + 4, ex_payload_len(self), 1,
                             flags);
}

static PyBufferProcs Ex_as_buffer = {(getbufferproc)Ex_getbuffer, NULL};

static PyObject *Ex_payload(ExcerptObject *self, void *c) { return PyMemoryView_FromObject((PyObject *)self); }
static PyObject *Ex_bytes(ExcerptObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!self->map) return PyBytes_FromStringAndSize("", 0);
    return PyBytes_FromStringAndSize(self->map->base + self->position + 4, ex_payload_len(self));
}
static PyObject *Ex_index(ExcerptObject *self, void *c) { return PyLong_FromLongLong(self->index); }
static PyObject *Ex_cycle(ExcerptObject *self, void *c) { return PyLong_FromLongLong(self->cycle); }
static PyObject *Ex_seq(ExcerptObject *self, void *c) { return PyLong_FromLongLong(self->seq); }
static PyObject *Ex_position(ExcerptObject *self, void *c) { return PyLong_FromSsize_t(self->position); }
static PyObject *Ex_metadata(ExcerptObject *self, void *c) { return PyBool_FromLong(self->metadata); }
static PyObject *Ex_header(ExcerptObject *self, void *c) {
    return PyLong_FromUnsignedLong((unsigned long)self->length | (self->metadata ? HDR_META : 0));
}
static Py_ssize_t Ex_len(ExcerptObject *self) { return self->map ? ex_payload_len(self) : 0; }

static PyObject *Ex_repr(ExcerptObject *self) {
    char buf[200];
    snprintf(buf, sizeof buf, "Excerpt(index=0x%llx, cycle=%lld, seq=%lld, position=%zd, length=%zd, metadata=%s)",
             (unsigned long long)self->index, (long long)self->cycle, (long long)self->seq, self->position,
             Ex_len(self), self->metadata ? "True" : "False");
    return PyUnicode_FromString(buf);
}

static PyGetSetDef Ex_getset[] = {
    {"payload", (getter)Ex_payload, NULL, "zero-copy memoryview of the body", NULL},
    {"index", (getter)Ex_index, NULL, "queue index (for metadata: the index of the next data document)", NULL},
    {"cycle", (getter)Ex_cycle, NULL, NULL, NULL},
    {"seq", (getter)Ex_seq, NULL, NULL, NULL},
    {"position", (getter)Ex_position, NULL, "file offset of the 4-byte header", NULL},
    {"metadata", (getter)Ex_metadata, NULL, NULL, NULL},
    {"header", (getter)Ex_header, NULL, "the raw 32-bit header", NULL},
    {NULL}};

/* excerpt.record(): a wire.record.RecordReader over the body, read in place (looked up once: chronq's
   native half stays free of the wire layer until a record is read) */
static PyObject *Ex_record(ExcerptObject *self, PyObject *Py_UNUSED(ignored)) {
    static PyObject *reader_cls = NULL;
    if (reader_cls == NULL) {
        PyObject *mod = PyImport_ImportModule("wire.record");
        if (mod == NULL) return NULL;
        reader_cls = PyObject_GetAttrString(mod, "RecordReader");
        Py_DECREF(mod);
        if (reader_cls == NULL) return NULL;
    }
    return PyObject_CallOneArg(reader_cls, (PyObject *)self);
}

static PyMethodDef Ex_methods[] = {
    {"bytes", (PyCFunction)Ex_bytes, METH_NOARGS, "copy of the body"},
    {"record", (PyCFunction)Ex_record, METH_NOARGS,
     "a wire.record.RecordReader of the body's positional values, valid until the tailer's next read"},
    {NULL}};
static PySequenceMethods Ex_as_sequence = {.sq_length = (lenfunc)Ex_len};

static PyTypeObject ExcerptType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chronq.Excerpt",
    .tp_basicsize = sizeof(ExcerptObject),
    .tp_dealloc = (destructor)Ex_dealloc,
    .tp_repr = (reprfunc)Ex_repr,
    .tp_as_sequence = &Ex_as_sequence,
    .tp_as_buffer = &Ex_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One document read by a tailer. The mapping stays alive while the excerpt (or a view of it) does.",
    .tp_methods = Ex_methods,
    .tp_getset = Ex_getset,
};

/* ------------------------------------------------------------------ TailerCore */

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

#define TL_MARKS_MAX 4096
#define TL_MARK_BITS0 6

static void Tl_reset_marks(TailerObject *self) {
    self->marks_n = 0;
    self->mark_bits = TL_MARK_BITS0;
}

/* Record pos as the mark of sequence cur if it is the next one due (marks are dense from sequence 0). */
static void Tl_note_mark(TailerObject *self, int64_t cur, Py_ssize_t pos) {
    if (cur != ((int64_t)self->marks_n << self->mark_bits)) return;
    if (!self->marks) {
        self->marks = PyMem_Malloc(TL_MARKS_MAX * sizeof(Py_ssize_t));
        if (!self->marks) return; /* only a cache: seeks just walk further */
    }
    if (self->marks_n == TL_MARKS_MAX) {
        for (Py_ssize_t i = 0; i < TL_MARKS_MAX / 2; i++) self->marks[i] = self->marks[2 * i];
        self->marks_n = TL_MARKS_MAX / 2;
        self->mark_bits++;
        if (cur != ((int64_t)self->marks_n << self->mark_bits)) return;
    }
    self->marks[self->marks_n++] = pos;
}

/* Walk a headerless cycle towards sequence target (INT64_MAX: to the end), starting at the nearest mark.
   Returns 1 = data document target at *pos_out; 0 = stopped at a free, unfinished or unmapped header;
   3 = stopped at an EOF marker. *cur_out is the sequence of the next data document at *pos_out. */
static int Tl_walk_headerless(TailerObject *self, int64_t target, Py_ssize_t *pos_out, int64_t *cur_out) {
    Geometry *g = &self->g;
    Py_ssize_t pos = g->data_start;
    int64_t cur = 0;
    if (self->marks_n > 0) {
        int64_t k = target >> self->mark_bits;
        if (k >= self->marks_n) k = self->marks_n - 1;
        Py_ssize_t p = self->marks[k];
        uint32_t h = p >= 0 && p <= g->size - 4 ? ld32(g->base + p) : 0;
        if (h != 0 && !(h & (HDR_NOT_COMPLETE | HDR_META))) {
            pos = p;
            cur = k << self->mark_bits;
        } else {
            Tl_reset_marks(self); /* the file was replaced under us: start over */
        }
    }
    for (;;) {
        if (pos > g->size - 4) break;
        uint32_t h = ld32(g->base + pos);
        if (h == HDR_EOF) {
            *pos_out = pos;
            *cur_out = cur;
            return 3;
        }
        if (h == 0 || (h & HDR_NOT_COMPLETE)) break;
        Py_ssize_t len = (Py_ssize_t)(h & HDR_LENGTH_MASK);
        if (pos + 4 + len > g->size) break; /* the forward read reports it, naming the position */
        if (!(h & HDR_META)) {
            Tl_note_mark(self, cur, pos);
            if (cur == target) {
                *pos_out = pos;
                *cur_out = cur;
                return 1;
            }
            cur++;
        }
        pos = align_up(pos + 4 + len, g->align);
    }
    *pos_out = pos;
    *cur_out = cur;
    return 0;
}

/* seek_seq for either kind of cycle file (same return codes). */
static int Tl_seek_seq(TailerObject *self, int64_t seq, Py_ssize_t *pos_out) {
    if (!self->headerless) return seek_seq(&self->g, seq, pos_out);
    if (seq < 0) return -1;
    int64_t cur;
    int r = Tl_walk_headerless(self, seq, pos_out, &cur);
    if (r == 1) return 1;
    if (cur == seq) return 0;
    return r == 3 ? -3 : -1;
}

static void Tl_clear_named(TailerObject *self) {
    if (self->has_named) {
        PyBuffer_Release(&self->named_view);
        self->has_named = 0;
    }
    self->named_p = NULL;
    self->named_ver_p = NULL;
    self->named_lock_p = NULL;
    Py_CLEAR(self->named_obj);
}

static int Tl_traverse(TailerObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->g.map);
    Py_VISIT(self->ex);
    Py_VISIT(self->named_obj);
    return 0;
}

static int Tl_clear(TailerObject *self) {
    Py_CLEAR(self->ex);
    Py_CLEAR(self->g.map);
    return 0;
}

static void Tl_dealloc(TailerObject *self) {
    PyObject_GC_UnTrack(self);
    Tl_clear_named(self);
    Tl_clear(self);
    PyMem_Free(self->marks);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Tl_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    TailerObject *self = (TailerObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->direction = 1;
    self->pending_named = -1;
    self->last_read = -1;
    Tl_reset_marks(self);
    return (PyObject *)self;
}

static PyObject *Tl_attach(TailerObject *self, PyObject *arg) {
    /* same geometry as the appender; a headerless one has no writePosition and no index (its
       write_position_offset, index2index_position and last_index_offset must be -1, 0, 0).
       Positions the tailer at the start of the cycle. */
    if (!Py_IS_TYPE(arg, &GeometryType)) {
        PyErr_Format(PyExc_TypeError, "_attach() expects a chronq._native.Geometry, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    GeometryObject *geo = (GeometryObject *)arg;
    int headerless = geo->headerless;
    long long wp_off = geo->write_position_offset;
    if (headerless) {
        if (wp_off != -1) {
            PyErr_SetString(PyExc_ValueError, "a headerless cycle has no writePosition (pass -1)");
            return NULL;
        }
        wp_off = 0; /* never read: Tl_seek_end walks a headerless cycle instead */
    }
    PyObject *old_name = self->g.map && self->headerless ? Py_NewRef(self->g.map->name) : NULL;
    int64_t old_cycle = self->g.cycle;
    int r = parse_geometry(&self->g, arg, wp_off);
    if (r < 0) {
        Py_XDECREF(old_name);
        return NULL;
    }
    if (headerless && self->g.i2i_pos != 0) {
        Py_XDECREF(old_name);
        PyErr_SetString(PyExc_ValueError, "a headerless cycle has no index2index (pass 0)");
        return NULL;
    }
    /* the marks of a headerless file stay valid while the same file is re-attached (e.g. after a seek) */
    int same = headerless && old_name && old_cycle == self->g.cycle &&
               PyObject_RichCompareBool(old_name, self->g.map->name, Py_EQ) == 1;
    PyErr_Clear();
    Py_XDECREF(old_name);
    if (!same) Tl_reset_marks(self);
    self->headerless = headerless;
    self->older = 0;
    self->pos = 0;
    self->seq = 0;
    self->released_to = 0;
    Py_RETURN_NONE;
}

static PyObject *Tl_detach(TailerObject *self, PyObject *Py_UNUSED(ignored)) {
    Py_CLEAR(self->g.map);
    self->g.base = NULL;
    self->g.size = 0;
    self->pos = 0;
    self->seq = 0;
    Py_RETURN_NONE;
}

static PyObject *Tl_remap(TailerObject *self, PyObject *arg) {
    /* same file, bigger mapping: keep the position */
    if (!Py_IS_TYPE(arg, &MapType)) {
        PyErr_SetString(PyExc_TypeError, "expected a chronq._native.Map");
        return NULL;
    }
    MapObject *m = (MapObject *)arg;
    if (m->size < self->g.size) {
        PyErr_SetString(PyExc_ValueError, "a remap may not shrink the mapping");
        return NULL;
    }
    Py_INCREF(m);
    Py_XSETREF(self->g.map, m);
    self->g.base = m->base;
    self->g.size = m->size;
    self->released_to = 0;
    Py_RETURN_NONE;
}

static int named_offset_ok(Py_buffer *view, Py_ssize_t off) {
    if (off < 0 || off > view->len - 8 || ((uintptr_t)((char *)view->buf + off) & 7)) {
        PyErr_Format(PyExc_ValueError, "named tailer offset %zd is out of range or not 8-byte aligned", off);
        return 0;
    }
    return 1;
}

/* _set_named(buffer, index_offset[, version_offset, lock_offset, pid]) */
static PyObject *Tl_set_named(TailerObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t off, ver_off = -1, lock_off = -1;
    long long pid = 0;
    if (!PyArg_ParseTuple(args, "On|nnL", &obj, &off, &ver_off, &lock_off, &pid)) return NULL;
    Tl_clear_named(self);
    if (obj == Py_None) Py_RETURN_NONE;
    if (PyObject_GetBuffer(obj, &self->named_view, PyBUF_WRITABLE) < 0) return NULL;
    self->has_named = 1;
    int versioned = PyTuple_GET_SIZE(args) > 2;
    if (!named_offset_ok(&self->named_view, off) ||
        (versioned && (!named_offset_ok(&self->named_view, ver_off) || !named_offset_ok(&self->named_view, lock_off)))) {
        Tl_clear_named(self);
        return NULL;
    }
    Py_INCREF(obj);
    self->named_obj = obj;
    self->named_p = (char *)self->named_view.buf + off;
    if (versioned) {
        self->named_ver_p = (char *)self->named_view.buf + ver_off;
        self->named_lock_p = (char *)self->named_view.buf + lock_off;
        self->named_pid = pid;
    }
    Py_RETURN_NONE;
}

/* Store a named tailer's position. A replicated one does what Java's VersionedIndexUpdater.update does:
   lock (CAS Long.MIN_VALUE -> pid), store, version + 1, unlock. A lock someone else holds goes to
   Python (_named_contended), which waits, takes over a dead process's lock, or raises. */
static int Tl_store_named(TailerObject *self, int64_t next) {
    if (!self->named_lock_p) {
        st64(self->named_p, next);
        return 0;
    }
    if (cas64p(self->named_lock_p, LOCK_UNLOCKED, self->named_pid)) {
        st64(self->named_p, next);
        __atomic_add_fetch((int64_t *)self->named_ver_p, 1, __ATOMIC_ACQ_REL);
        cas64p(self->named_lock_p, self->named_pid, LOCK_UNLOCKED);
        return 0;
    }
    PyObject *r = PyObject_CallMethod((PyObject *)self, "_named_contended", "L", (long long)next);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *call_bool_method(PyObject *self, const char *name, int *out) {
    PyObject *r = PyObject_CallMethod(self, name, NULL);
    if (!r) return NULL;
    *out = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (*out < 0) return NULL;
    return Py_None;
}

/* Advance to the next readable document. Returns 1 = document at self->pos (header in *hout),
   0 = nothing ready, -1 = error. Slow paths: _map_end() (file grew?) and _next_cycle() (EOF/no file). */
static int Tl_next_doc(TailerObject *self, int want_meta, uint32_t *hout) {
    for (;;) {
        Geometry *g = &self->g;
        if (!g->map) {
            int more;
            if (!call_bool_method((PyObject *)self, "_next_cycle", &more)) return -1;
            if (!more) return 0;
            continue;
        }
        Py_ssize_t pos = self->pos;
        if (pos > g->size - 4) {
            int more;
            if (!call_bool_method((PyObject *)self, "_map_end", &more)) return -1;
            if (!more) return 0;
            continue;
        }
        uint32_t h = ld32(g->base + pos);
        if (h == 0 || (h & HDR_NOT_COMPLETE && h != HDR_EOF)) {
            if (!self->older) return 0;
            int more; /* Python moves on to the next cycle (True) or raises CorruptQueueError */
            if (!call_bool_method((PyObject *)self, "_end_of_older_cycle", &more)) return -1;
            if (!more) return 0;
            continue;
        }
        if (h & HDR_NOT_COMPLETE) {
            int more;
            if (!call_bool_method((PyObject *)self, "_next_cycle", &more)) return -1;
            if (!more) return 0;
            continue;
        }
        Py_ssize_t len = (Py_ssize_t)(h & HDR_LENGTH_MASK);
        if (pos + 4 + len > g->size) {
            int more;
            if (!call_bool_method((PyObject *)self, "_map_end", &more)) return -1;
            if (more) continue;
            raise_corrupt(g->map->name, pos, "document of %zd bytes runs past the end of the file (%zd bytes)", len,
                          g->size);
            return -1;
        }
        if ((h & HDR_META) && !want_meta) {
            self->pos = align_up(pos + 4 + len, g->align);
            continue;
        }
        *hout = h;
        return 1;
    }
}

static ExcerptObject *Tl_excerpt(TailerObject *self, Py_ssize_t max_refs) {
    ExcerptObject *ex = self->ex;
    if (ex && Py_REFCNT(ex) <= max_refs) {
        if (ex->map != self->g.map) {
            Py_INCREF(self->g.map);
            Py_XSETREF(ex->map, self->g.map);
        }
        Py_INCREF(ex);
        return ex;
    }
    ex = Ex_alloc();
    if (!ex) return NULL;
    Py_INCREF(self->g.map);
    ex->map = self->g.map;
    Py_XSETREF(self->ex, ex);
    Py_INCREF(ex);
    return ex;
}

static PyObject *Tl_read_impl(TailerObject *self, int want_meta, int commit, Py_ssize_t max_refs) {
    if (self->direction != 1) {
        return PyObject_CallMethod((PyObject *)self, "_read_directional", "ii", want_meta, commit);
    }
    uint32_t h;
    int r = Tl_next_doc(self, want_meta, &h);
    if (r <= 0) {
        if (r < 0) return NULL;
        Py_RETURN_NONE;
    }
    Geometry *g = &self->g;
    if (!(h & HDR_META) && (self->seq & (((int64_t)1 << g->spacing_bits) - 1)) == 0 && g->i2i_arr) {
        /* every indexed document cross-checks the chain we walked against the index */
        int64_t entry;
        if (index_entry(g, self->seq, &entry) < 0) return NULL;
        if (entry != 0 && entry != (int64_t)self->pos) {
            raise_corrupt(g->map->name, self->pos,
                          "document chain and index disagree for sequence %lld (index says %lld)",
                          (long long)self->seq, (long long)entry);
            return NULL;
        }
    }
    ExcerptObject *ex = Tl_excerpt(self, max_refs);
    if (!ex) return NULL;
    ex->position = self->pos;
    ex->length = (Py_ssize_t)(h & HDR_LENGTH_MASK);
    ex->metadata = (h & HDR_META) != 0;
    ex->raw = self->headerless;
    ex->cycle = g->cycle;
    ex->seq = self->seq;
    ex->index = ((int64_t)g->cycle << g->shift) | self->seq;
    self->pos = align_up(self->pos + 4 + ex->length, g->align);
    if (!ex->metadata) {
        int64_t last_read = self->last_read;
        self->seq++;
        self->last_read = ex->index;
        if (self->named_p) {
            int64_t next = ((int64_t)g->cycle << g->shift) | self->seq;
            if (commit) {
                if (Tl_store_named(self, next) < 0) {
                    /* not stored (the lock is held): stay before the document, so it is read again */
                    self->pos = ex->position;
                    self->seq = ex->seq;
                    self->last_read = last_read;
                    Py_DECREF(ex);
                    return NULL;
                }
            } else
                self->pending_named = next;
        }
    }
    if (self->release_every && self->pos - self->released_to > self->release_every) {
        Py_ssize_t upto = ex->position;
        Py_ssize_t released = release_range(g->base, g->size, self->released_to, upto);
        if (released > 0) self->released_to = released;
    }
    return (PyObject *)ex;
}

/* DocumentSource (wire/_document_source.h) for method readers: read() with the payload's address. */
static PyTypeObject TailerType;

static PyObject *Tl_read_document(PyObject *source, const char **data, Py_ssize_t *len, int *metadata) {
    *data = NULL;
    *len = 0;
    *metadata = -1;
    if (!PyObject_TypeCheck(source, &TailerType)) {
        PyErr_SetString(PyExc_TypeError, "DOCUMENT_SOURCE reads a chronq tailer");
        return NULL;
    }
    PyObject *r = Tl_read_impl((TailerObject *)source, 0, 1, 1);
    if (r && Py_IS_TYPE(r, &ExcerptType) && ((ExcerptObject *)r)->map) {
        ExcerptObject *ex = (ExcerptObject *)r;
        *data = ex->map->base + ex->position + 4;
        *len = ex_payload_len(ex);
        *metadata = ex->metadata;
    }
    return r;
}

static DocumentSource tailer_document_source = {DOCUMENT_SOURCE_VERSION, Tl_read_document};

/* Tailer.read_many's forward path: payloads copied out of the map in one C loop (no Python step per
 * message). Lives here, not in chronq._codecs, so a plain queue never loads that module (and its
 * libcrypto). */
PyDoc_STRVAR(read_payloads_doc,
"read_payloads(tailer, out, max_count, max_bytes, /)\n--\n\n"
"Reads up to `max_count` data documents from `tailer` (a TailerCore), stopping after the one that brings\n"
"the bytes read to `max_bytes`, and appends copies of their payloads to the list `out`. Returns\n"
"(pending, nbytes, error): pending holds the one document read but not copied (an excerpt not backed by\n"
"a map, which the caller copies through Python; empty otherwise), nbytes the bytes appended, error None\n"
"or the exception the tailer raised when it could not read on (what was read before is in `out`).");

static PyObject *py_read_payloads(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "read_payloads takes 4 arguments");
        return NULL;
    }
    PyObject *tailer = args[0], *out = args[1];
    if (!PyObject_TypeCheck(tailer, &TailerType) || !PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "read_payloads: a chronq tailer and a list");
        return NULL;
    }
    Py_ssize_t max_count = PyLong_AsSsize_t(args[2]);
    long long max_bytes = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    PyObject *pending = PyList_New(0);
    if (!pending) return NULL;
    long long bytes = 0;
    PyObject *error = NULL;
    for (Py_ssize_t i = 0; i < max_count && bytes < max_bytes; i++) {
        PyObject *r = Tl_read_impl((TailerObject *)tailer, 0, 1, 1);
        if (!r) {
            /* the tailer could not read on: what was read before is returned with the error */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb && value) PyException_SetTraceback(value, tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            error = value ? value : Py_NewRef(Py_None);
            break;
        }
        if (r == Py_None) {
            Py_DECREF(r);
            break;
        }
        if (!Py_IS_TYPE(r, &ExcerptType) || !((ExcerptObject *)r)->map) {
            int app = PyList_Append(pending, r);
            Py_DECREF(r);
            if (app < 0) goto fail;
            break;
        }
        ExcerptObject *ex = (ExcerptObject *)r;
        Py_ssize_t len = ex_payload_len(ex);
        PyObject *msg = PyBytes_FromStringAndSize(ex->map->base + ex->position + 4, len);
        Py_DECREF(r);
        if (!msg) goto fail;
        int app = PyList_Append(out, msg);
        Py_DECREF(msg);
        if (app < 0) goto fail;
        bytes += len;
    }
    return Py_BuildValue("(NLN)", pending, bytes, error ? error : Py_NewRef(Py_None));
fail:
    Py_XDECREF(error);
    Py_DECREF(pending);
    return NULL;
}

static PyObject *Tl_read(TailerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    int want_meta = 0;
    if (nargs > 1 || (kwnames && PyTuple_GET_SIZE(kwnames) > 1)) {
        PyErr_SetString(PyExc_TypeError, "read(metadata=False)");
        return NULL;
    }
    if (kwnames && PyTuple_GET_SIZE(kwnames) == 1 &&
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "metadata") != 0) {
        PyErr_SetString(PyExc_TypeError, "read() got an unexpected keyword argument");
        return NULL;
    }
    PyObject *m = nargs ? args[0] : (kwnames && PyTuple_GET_SIZE(kwnames) ? args[0] : NULL);
    if (m) {
        want_meta = PyObject_IsTrue(m);
        if (want_meta < 0) return NULL;
    }
    return Tl_read_impl(self, want_meta, 1, 1);
}

static PyObject *Tl_read_open(TailerObject *self, PyObject *arg) {
    /* for reading_document(): the named position moves only in _finish() */
    int want_meta = PyObject_IsTrue(arg);
    if (want_meta < 0) return NULL;
    return Tl_read_impl(self, want_meta, 0, 1);
}

static PyObject *Tl_finish(TailerObject *self, PyObject *Py_UNUSED(ignored)) {
    int64_t pending = self->pending_named;
    self->pending_named = -1;
    if (pending >= 0 && self->named_p && Tl_store_named(self, pending) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Tl_iternext(TailerObject *self) {
    /* the loop variable still holds the previous excerpt, so this allocates (from the freelist) */
    PyObject *r = Tl_read_impl(self, 0, 1, 1);
    if (r == Py_None) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

static PyObject *Tl_iter(PyObject *self) { return Py_NewRef(self); }

static PyObject *Tl_seek(TailerObject *self, PyObject *arg) {
    /* position at sequence seq of the attached cycle; returns 1 found, 0 at end, -1 beyond, -3 after EOF */
    long long seq = PyLong_AsLongLong(arg);
    if (seq == -1 && PyErr_Occurred()) return NULL;
    if (!self->g.map) return PyLong_FromLong(-1);
    Py_ssize_t pos;
    int r = Tl_seek_seq(self, seq, &pos);
    if (r == -2) return NULL;
    if (r >= 0) {
        self->pos = pos;
        self->seq = seq;
    }
    return PyLong_FromLong(r);
}

static PyObject *Tl_move_to_index(TailerObject *self, PyObject *arg) {
    /* fast path in C for a forward tailer staying in its cycle; everything else is Python's _move() */
    long long index = PyLong_AsLongLong(arg);
    if (index == -1 && PyErr_Occurred()) return NULL;
    if (self->g.map && self->direction == 1 && index >= 0 && (index >> self->g.shift) == self->g.cycle) {
        Py_ssize_t pos;
        int64_t seq = index & (((int64_t)1 << self->g.shift) - 1);
        int r = Tl_seek_seq(self, seq, &pos);
        if (r == -2) return NULL;
        if (r >= 0) {
            self->pos = pos;
            self->seq = seq;
        }
        return PyBool_FromLong(r == 1);
    }
    PyObject *r = PyObject_CallMethod((PyObject *)self, "_move", "O", arg);
    if (!r) return NULL;
    long v = PyLong_AsLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(v == 1);
}

static PyObject *Tl_seek_end(TailerObject *self, PyObject *Py_UNUSED(ignored)) {
    /* move past the last complete document of the attached cycle: returns (seq, at_eof) */
    Geometry *g = &self->g;
    if (!g->map) Py_RETURN_NONE;
    if (self->headerless) {
        Py_ssize_t end;
        int64_t n;
        int r = Tl_walk_headerless(self, INT64_MAX, &end, &n);
        self->pos = end;
        self->seq = n;
        return Py_BuildValue("LO", (long long)n, r == 3 ? Py_True : Py_False);
    }
    int64_t wp = ld64(g->base + g->wp_off);
    Py_ssize_t pos = g->data_start;
    int64_t seq = 0;
    if (wp > 0 && wp >= g->data_start && wp <= g->size - 4) {
        uint32_t h = ld32(g->base + wp);
        /* a writePosition whose document runs past the mapping is not trusted: the scan below stops
           at that header, so the tailer stays inside the mapping and the forward read reports it */
        if (h != 0 && !(h & (HDR_NOT_COMPLETE | HDR_META))
            && wp + 4 + (int64_t)(h & HDR_LENGTH_MASK) <= (int64_t)g->size) {
            int64_t s = seq_at_position(g, (Py_ssize_t)wp);
            if (s < 0) return NULL;
            pos = align_up((Py_ssize_t)wp + 4 + (Py_ssize_t)(h & HDR_LENGTH_MASK), g->align);
            seq = s + 1;
        }
    }
    int eof = 0;
    while (pos <= g->size - 4) {
        uint32_t h = ld32(g->base + pos);
        if (h == HDR_EOF) {
            eof = 1;
            break;
        }
        if (h == 0 || (h & HDR_NOT_COMPLETE)) break;
        Py_ssize_t len = (Py_ssize_t)(h & HDR_LENGTH_MASK);
        if (pos + 4 + len > g->size) break;
        if (!(h & HDR_META)) seq++;
        pos = align_up(pos + 4 + len, g->align);
    }
    self->pos = pos;
    self->seq = seq;
    return Py_BuildValue("LO", (long long)seq, eof ? Py_True : Py_False);
}

static PyObject *Tl_set_position(TailerObject *self, PyObject *args) {
    Py_ssize_t pos;
    long long seq;
    if (!PyArg_ParseTuple(args, "nL", &pos, &seq)) return NULL;
    if (pos < 0 || (self->g.map && pos > self->g.size)) {
        if (self->g.map) /* a position saved from a damaged file: report the file, not a bare ValueError */
            raise_corrupt(self->g.map->name, pos, "position is outside the mapping of %zd bytes", self->g.size);
        else
            PyErr_Format(PyExc_ValueError, "position %zd is outside the mapping", pos);
        return NULL;
    }
    self->pos = pos;
    self->seq = seq;
    Py_RETURN_NONE;
}

static PyObject *Tl_set_release(TailerObject *self, PyObject *arg) {
    Py_ssize_t v = PyLong_AsSsize_t(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    self->release_every = v < 0 ? 0 : v;
    Py_RETURN_NONE;
}

static PyMethodDef Tl_methods[] = {
    {"read", (PyCFunction)(void (*)(void))Tl_read, METH_FASTCALL | METH_KEYWORDS,
     "read(metadata=False) -> Excerpt | None"},
    {"_read_open", (PyCFunction)Tl_read_open, METH_O, NULL},
    {"_finish", (PyCFunction)Tl_finish, METH_NOARGS, NULL},
    {"_attach", (PyCFunction)Tl_attach, METH_O, NULL},
    {"_detach", (PyCFunction)Tl_detach, METH_NOARGS, NULL},
    {"_remap", (PyCFunction)Tl_remap, METH_O, NULL},
    {"_set_named", (PyCFunction)Tl_set_named, METH_VARARGS, NULL},
    {"_seek", (PyCFunction)Tl_seek, METH_O, NULL},
    {"_seek_end", (PyCFunction)Tl_seek_end, METH_NOARGS, NULL},
    {"move_to_index", (PyCFunction)Tl_move_to_index, METH_O,
     "move_to_index(index) -> bool: the next read() returns excerpt index (False: absent, or just past the end)"},
    {"_set_position", (PyCFunction)Tl_set_position, METH_VARARGS, NULL},
    {"_set_release", (PyCFunction)Tl_set_release, METH_O, NULL},
    /* TailerCore[E] (a `types.GenericAlias`): chronq.Tailer subclasses it generic in its excerpt type */
    {"__class_getitem__", Py_GenericAlias, METH_O | METH_CLASS, NULL},
    {NULL}};

static PyObject *Tl_get_index(TailerObject *self, void *c) {
    return PyLong_FromLongLong(((int64_t)self->g.cycle << self->g.shift) | self->seq);
}
static PyObject *Tl_get_cycle(TailerObject *self, void *c) {
    if (!self->g.map) Py_RETURN_NONE;
    return PyLong_FromLongLong(self->g.cycle);
}
static PyObject *Tl_get_pos(TailerObject *self, void *c) { return PyLong_FromSsize_t(self->pos); }
static PyObject *Tl_get_seq(TailerObject *self, void *c) { return PyLong_FromLongLong(self->seq); }
static PyObject *Tl_get_last_read(TailerObject *self, void *c) { return PyLong_FromLongLong(self->last_read); }
static PyObject *Tl_get_map(TailerObject *self, void *c) {
    if (!self->g.map) Py_RETURN_NONE;
    return Py_NewRef((PyObject *)self->g.map);
}
static PyObject *Tl_get_dir(TailerObject *self, void *c) { return PyLong_FromLong(self->direction); }
static int Tl_set_dir(TailerObject *self, PyObject *v, void *c) {
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete the direction");
        return -1;
    }
    long d = PyLong_AsLong(v);
    if (d == -1 && PyErr_Occurred()) return -1;
    if (d < -1 || d > 1) {
        PyErr_SetString(PyExc_ValueError, "direction must be 1 (forward), -1 (backward) or 0 (none)");
        return -1;
    }
    self->direction = (int)d;
    return 0;
}

static PyObject *Tl_get_older(TailerObject *self, void *c) { return PyBool_FromLong(self->older); }
static int Tl_set_older(TailerObject *self, PyObject *v, void *c) {
    int b = v ? PyObject_IsTrue(v) : 0;
    if (b < 0) return -1;
    self->older = b;
    return 0;
}

static PyGetSetDef Tl_getset[] = {
    {"_older", (getter)Tl_get_older, (setter)Tl_set_older, NULL, NULL},
    {"_index", (getter)Tl_get_index, NULL, NULL, NULL},
    {"_cycle", (getter)Tl_get_cycle, NULL, NULL, NULL},
    {"_pos", (getter)Tl_get_pos, NULL, NULL, NULL},
    {"_seq", (getter)Tl_get_seq, NULL, NULL, NULL},
    {"_last_read", (getter)Tl_get_last_read, NULL, NULL, NULL},
    {"_map", (getter)Tl_get_map, NULL, NULL, NULL},
    {"_direction", (getter)Tl_get_dir, (setter)Tl_set_dir, NULL, NULL},
    {NULL}};

static PyTypeObject TailerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chronq._native.TailerCore",
    .tp_basicsize = sizeof(TailerObject),
    .tp_dealloc = (destructor)Tl_dealloc,
    .tp_traverse = (traverseproc)Tl_traverse,
    .tp_clear = (inquiry)Tl_clear,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Native tailer state; subclassed by chronq.tailer.Tailer for the slow paths.",
    .tp_iter = Tl_iter,
    .tp_iternext = (iternextfunc)Tl_iternext,
    .tp_methods = Tl_methods,
    .tp_getset = Tl_getset,
    .tp_new = Tl_new,
};

/* ------------------------------------------------------------------ module-level helpers */

static PyObject *py_write_eof(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    /* write_eof(buf, from_pos, align, name=None) -> position of the EOF header (or of an existing one) */
    if (nargs < 3 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "write_eof(buf, from_pos, align, name=None)");
        return NULL;
    }
    BufRef b;
    if (get_buf(args[0], &b, 1) < 0) return NULL;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    long align = PyLong_AsLong(args[2]);
    PyObject *name = nargs > 3 ? args[3] : Py_None;
    if (PyErr_Occurred()) {
        put_buf(&b);
        return NULL;
    }
    if ((align != 1 && align != 4) || pos < 0) {
        put_buf(&b);
        PyErr_SetString(PyExc_ValueError, "write_eof: align must be 1 or 4 and the position >= 0");
        return NULL;
    }
    for (int tries = 0; tries < 1000000; tries++) {
        if (pos > b.len - 8) {
            put_buf(&b);
            raise_corrupt(name, pos < b.len ? pos : b.len, "no room for an EOF marker at position %zd", pos);
            return NULL;
        }
        char *hp = b.base + pos;
        uint32_t h = ((uintptr_t)hp & 3) ? 0 : ld32(hp);
        if ((uintptr_t)hp & 3) memcpy(&h, hp, 4);
        if (h == HDR_EOF) break;
        if (h == 0) {
            int ok;
            if ((uintptr_t)hp & 3) {
                uint32_t e = HDR_EOF;
                memcpy(hp, &e, 4);
                ok = 1;
            } else {
                ok = cas32p(hp, 0, HDR_EOF);
            }
            if (!ok) continue;
            memcpy(hp + 4, "\xc3" "EOF", 4);
            break;
        }
        if (h & HDR_NOT_COMPLETE) {
            /* a stuck writer (we hold the write lock): close the file over it, as Java does after its timeout */
            if (!((uintptr_t)hp & 3) && cas32p(hp, h, HDR_EOF)) break;
            continue;
        }
        pos = align_up(pos + 4 + (Py_ssize_t)(h & HDR_LENGTH_MASK), align);
    }
    put_buf(&b);
    return PyLong_FromSsize_t(pos);
}

static PyObject *py_scan(PyObject *m, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"buf", "start_pos", "end_pos", "start_seq", "max_rows", "include_metadata", "align", NULL};
    PyObject *obj;
    Py_ssize_t start, end, max_rows;
    long long start_seq;
    int include_meta = 0, align = 4;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnnLn|pi", kwlist, &obj, &start, &end, &start_seq, &max_rows,
                                     &include_meta, &align))
        return NULL;
    if (align != 1 && align != 4) {
        PyErr_SetString(PyExc_ValueError, "align must be 1 or 4");
        return NULL;
    }
    BufRef b;
    if (get_buf(obj, &b, 0) < 0) return NULL;
    if (end > b.len || end < 0) end = b.len;
    if (start < 0 || max_rows < 0) {
        put_buf(&b);
        PyErr_SetString(PyExc_ValueError, "start_pos and max_rows must be >= 0");
        return NULL;
    }
    Py_ssize_t cap = max_rows < 4096 ? max_rows : 4096, n = 0;
    int64_t *positions = PyMem_Malloc((size_t)(cap ? cap : 1) * 8);
    int32_t *lengths = PyMem_Malloc((size_t)(cap ? cap : 1) * 4);
    uint8_t *flags = PyMem_Malloc((size_t)(cap ? cap : 1));
    if (!positions || !lengths || !flags) {
        PyMem_Free(positions);
        PyMem_Free(lengths);
        PyMem_Free(flags);
        put_buf(&b);
        return PyErr_NoMemory();
    }
    Py_ssize_t pos = start;
    int64_t seq = start_seq;
    int status = 3; /* 0 not ready, 1 EOF, 2 max_rows, 3 end_pos */
    const char *name_err = NULL;
    while (1) {
        if (n >= max_rows) {
            status = 2;
            break;
        }
        if (pos > end - 4) {
            status = 3;
            break;
        }
        uint32_t h;
        memcpy(&h, b.base + pos, 4);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (h == HDR_EOF) {
            status = 1;
            break;
        }
        if (h == 0 || (h & HDR_NOT_COMPLETE)) {
            status = 0;
            break;
        }
        Py_ssize_t len = (Py_ssize_t)(h & HDR_LENGTH_MASK);
        if (pos + 4 + len > b.len) {
            name_err = "document runs past the end of the buffer";
            break;
        }
        int meta = (h & HDR_META) != 0;
        if (!meta || include_meta) {
            if (n == cap) {
                cap *= 2;
                int64_t *np = PyMem_Realloc(positions, (size_t)cap * 8);
                if (np) positions = np;
                int32_t *nl = PyMem_Realloc(lengths, (size_t)cap * 4);
                if (nl) lengths = nl;
                uint8_t *nf = PyMem_Realloc(flags, (size_t)cap);
                if (nf) flags = nf;
                if (!np || !nl || !nf) {
                    PyMem_Free(positions);
                    PyMem_Free(lengths);
                    PyMem_Free(flags);
                    put_buf(&b);
                    return PyErr_NoMemory();
                }
            }
            positions[n] = pos;
            lengths[n] = (int32_t)len;
            flags[n] = (uint8_t)meta;
            n++;
        }
        if (!meta) seq++;
        pos = align_up(pos + 4 + len, align);
    }
    put_buf(&b);
    if (name_err) {
        PyMem_Free(positions);
        PyMem_Free(lengths);
        PyMem_Free(flags);
        raise_corrupt(Py_IS_TYPE(obj, &MapType) ? ((MapObject *)obj)->name : Py_None, pos, "%s", name_err);
        return NULL;
    }
    PyObject *r = Py_BuildValue("y#y#y#nLi", (const char *)positions, n * 8, (const char *)lengths, n * 4,
                                (const char *)flags, n, pos, (long long)seq, status);
    PyMem_Free(positions);
    PyMem_Free(lengths);
    PyMem_Free(flags);
    return r;
}

static PyObject *py_gather(PyObject *m, PyObject *args) {
    /* gather(buf, positions(int64 bytes), lengths(int32 bytes)) -> (bodies bytes, int32 offsets bytes) */
    PyObject *obj;
    Py_buffer pv, lv;
    if (!PyArg_ParseTuple(args, "Oy*y*", &obj, &pv, &lv)) return NULL;
    PyObject *res = NULL;
    BufRef b;
    if (get_buf(obj, &b, 0) < 0) goto done0;
    Py_ssize_t n = pv.len / 8;
    if (pv.len % 8 || lv.len != n * 4) {
        PyErr_SetString(PyExc_ValueError, "positions must be int64 and lengths int32, same count");
        goto done;
    }
    const int64_t *pos = pv.buf;
    const int32_t *len = lv.buf;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (len[i] < 0 || pos[i] < 0 || pos[i] + 4 + len[i] > b.len) {
            PyErr_Format(PyExc_IndexError, "row %zd (position %lld, length %d) is outside the buffer", i,
                         (long long)pos[i], len[i]);
            goto done;
        }
        total += len[i];
        if (total > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of bodies in one batch");
            goto done;
        }
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, total);
    PyObject *offs = PyBytes_FromStringAndSize(NULL, (n + 1) * 4);
    if (!data || !offs) {
        Py_XDECREF(data);
        Py_XDECREF(offs);
        goto done;
    }
    char *d = PyBytes_AS_STRING(data);
    int32_t *o = (int32_t *)PyBytes_AS_STRING(offs);
    int32_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        o[i] = at;
        memcpy(d + at, b.base + pos[i] + 4, (size_t)len[i]);
        at += len[i];
    }
    o[n] = at;
    res = Py_BuildValue("NN", data, offs);
done:
    put_buf(&b);
done0:
    PyBuffer_Release(&pv);
    PyBuffer_Release(&lv);
    return res;
}

static PyObject *py_index_array(PyObject *m, PyObject *args) {
    /* index_array(buf, doc_pos, capacity=0) -> offset of the capacity field of an index document's array */
    PyObject *obj;
    Py_ssize_t pos;
    long long cap = 0;
    if (!PyArg_ParseTuple(args, "On|L", &obj, &pos, &cap)) return NULL;
    BufRef b;
    if (get_buf(obj, &b, 0) < 0) return NULL;
    Py_ssize_t r =
        index_array_at(b.base, b.len, pos, cap, Py_IS_TYPE(obj, &MapType) ? ((MapObject *)obj)->name : Py_None, 0);
    put_buf(&b);
    if (r < 0) return NULL;
    return PyLong_FromSsize_t(r);
}

/* ------------------------------------------------------------------ Merge (chronq.merge, finished mode) */
/* Merge(tailers, native, key, copy): the iterator of chronq.merge(follow=False) (see chronq/merge.py, whose
 * rules this follows step for step). A heap of (key, source, item) entries ordered as Python orders those
 * tuples, kept with heapq's own algorithm, so the output is the same item for item whatever the keys.
 * `native[i]` says tailer i's read() is TailerCore's (read here without a Python call); any other is
 * called. When the merge ends, fails or is closed (or dropped), each tailer is moved back (move_to_index)
 * to its pending item, read and not yielded, as the Python merge's `finally` does. */
typedef struct {
    PyObject *key;
    PyObject *item; /* (source, index, payload) */
    Py_ssize_t src;
    int64_t index;
} MergeEntry;

typedef struct {
    PyObject_HEAD
    PyObject *tailers; /* tuple */
    PyObject *native;  /* bytes */
    PyObject *keyfn;
    int copy, started, finished, busy;
    Py_ssize_t size, yielded;
    MergeEntry *heap; /* len(tailers) entries */
} MergeObject;

static PyTypeObject MergeType;

static void merge_entry_clear(MergeEntry *e) {
    Py_CLEAR(e->key);
    Py_CLEAR(e->item);
}

/* (a < b) as Python compares the tuples (a.key, a.src, ...) and (b.key, b.src, ...): equality first (an
 * object equals itself), then `<` of the first pair that differs; sources are never equal. */
static int merge_lt(MergeEntry *a, MergeEntry *b) {
    PyObject *x = a->key, *y = b->key;
    /* 1-tuples (struct's unpack_from) compare as their items do; ints that fit compare as numbers */
    if (PyTuple_CheckExact(x) && PyTuple_CheckExact(y) && PyTuple_GET_SIZE(x) == 1 && PyTuple_GET_SIZE(y) == 1) {
        x = PyTuple_GET_ITEM(x, 0);
        y = PyTuple_GET_ITEM(y, 0);
    }
    if (PyLong_CheckExact(x) && PyLong_CheckExact(y)) {
        int ox, oy;
        long long u = PyLong_AsLongLongAndOverflow(x, &ox), v = PyLong_AsLongLongAndOverflow(y, &oy);
        if (!ox && !oy) return u == v ? a->src < b->src : u < v;
    }
    int eq = PyObject_RichCompareBool(x, y, Py_EQ);
    if (eq < 0) return -1;
    if (eq) return a->src < b->src;
    return PyObject_RichCompareBool(x, y, Py_LT);
}

/* heapq._siftdown and _siftup over self->heap; on an error the entry being moved is put back in the
 * hole, so the heap holds every entry once (in no particular order) */
static int merge_siftdown(MergeObject *self, Py_ssize_t start, Py_ssize_t pos) {
    MergeEntry *h = self->heap, item = h[pos];
    while (pos > start) {
        Py_ssize_t parent = (pos - 1) >> 1;
        int lt = merge_lt(&item, &h[parent]);
        if (lt < 0) {
            h[pos] = item;
            return -1;
        }
        if (!lt) break;
        h[pos] = h[parent];
        pos = parent;
    }
    h[pos] = item;
    return 0;
}

static int merge_siftup(MergeObject *self, Py_ssize_t pos) {
    MergeEntry *h = self->heap, item = h[pos];
    Py_ssize_t end = self->size, start = pos, child = 2 * pos + 1;
    while (child < end) {
        Py_ssize_t right = child + 1;
        if (right < end) {
            int lt = merge_lt(&h[child], &h[right]);
            if (lt < 0) {
                h[pos] = item;
                return -1;
            }
            if (!lt) child = right;
        }
        h[pos] = h[child];
        pos = child;
        child = 2 * pos + 1;
    }
    h[pos] = item;
    return merge_siftdown(self, start, pos);
}

/* move tailer `src` back to `index` */
static int merge_move_back(MergeObject *self, Py_ssize_t src, int64_t index) {
    PyObject *r = PyObject_CallMethod(PyTuple_GET_ITEM(self->tailers, src), "move_to_index", "L", (long long)index);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* the end: every pending entry's tailer moved back (but `skip`'s, already where it must be), the heap
 * emptied. Keeps an exception already set; else reports the first failing move. */
static int merge_finish(MergeObject *self, Py_ssize_t skip) {
    if (self->finished) return 0;
    self->finished = 1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int rc = 0;
    for (Py_ssize_t i = 0; i < self->size; i++) {
        MergeEntry *e = &self->heap[i];
        if (e->src != skip && merge_move_back(self, e->src, e->index) < 0) {
            if (type || rc < 0)
                PyErr_Clear();
            else
                rc = -1, PyErr_Fetch(&type, &value, &tb);
        }
    }
    for (Py_ssize_t i = 0; i < self->size; i++) merge_entry_clear(&self->heap[i]);
    self->size = 0;
    PyErr_Restore(type, value, tb);
    return type ? -1 : 0;
}

/* Read input `src` into *e: 1 with an entry, 0 with nothing to read, -1 on an error (a failing key
 * moves the tailer back to the excerpt first, as the Python merge does). */
static int merge_read(MergeObject *self, Py_ssize_t src, MergeEntry *e) {
    PyObject *tailer = PyTuple_GET_ITEM(self->tailers, src), *ex;
    if (PyBytes_AS_STRING(self->native)[src])
        ex = Tl_read_impl((TailerObject *)tailer, 0, 1, 1);
    else
        ex = PyObject_CallMethod(tailer, "read", NULL);
    if (!ex) return -1;
    if (ex == Py_None) {
        Py_DECREF(ex);
        return 0;
    }
    int64_t index;
    PyObject *payload;
    if (Py_IS_TYPE(ex, &ExcerptType)) {
        ExcerptObject *x = (ExcerptObject *)ex;
        index = x->index;
        payload = !self->copy ? Py_NewRef(ex) : Ex_bytes(x, NULL);
    } else {
        PyObject *i = PyObject_GetAttrString(ex, "index");
        if (!i) {
            Py_DECREF(ex);
            return -1;
        }
        index = PyLong_AsLongLong(i);
        Py_DECREF(i);
        if (index == -1 && PyErr_Occurred()) {
            Py_DECREF(ex);
            return -1;
        }
        payload = !self->copy ? Py_NewRef(ex) : PyObject_CallMethod(ex, "bytes", NULL);
    }
    PyObject *key = payload ? PyObject_CallOneArg(self->keyfn, ex) : NULL, *item = NULL;
    if (key) {
        PyObject *s = PyLong_FromSsize_t(src), *i = PyLong_FromLongLong(index);
        if (s && i) item = PyTuple_Pack(3, s, i, payload);
        Py_XDECREF(s);
        Py_XDECREF(i);
    }
    Py_XDECREF(payload);
    Py_DECREF(ex);
    if (!item) {
        Py_XDECREF(key);
        /* the excerpt goes back to its tailer; the error stays the one raised */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (merge_move_back(self, src, index) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return -1;
    }
    e->key = key;
    e->item = item;
    e->src = src;
    e->index = index;
    return 1;
}

static PyObject *Merge_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *tailers, *native, *keyfn;
    int copy;
    if (!PyArg_ParseTuple(args, "O!SOp:Merge", &PyTuple_Type, &tailers, &native, &keyfn, &copy)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(tailers);
    if (PyBytes_GET_SIZE(native) != n) {
        PyErr_SetString(PyExc_ValueError, "Merge: one native flag per tailer");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyBytes_AS_STRING(native)[i] && !PyObject_TypeCheck(PyTuple_GET_ITEM(tailers, i), &TailerType)) {
            PyErr_SetString(PyExc_TypeError, "Merge: a native input must be a chronq tailer");
            return NULL;
        }
    MergeObject *self = (MergeObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->heap = PyMem_Calloc(n ? (size_t)n : 1, sizeof(MergeEntry));
    if (!self->heap) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->tailers = Py_NewRef(tailers);
    self->native = Py_NewRef(native);
    self->keyfn = Py_NewRef(keyfn);
    self->copy = copy;
    self->yielded = -1;
    return (PyObject *)self;
}

static PyObject *Merge_step(MergeObject *self);

static PyObject *Merge_next(MergeObject *self) {
    if (self->finished) return NULL;
    if (self->busy) { /* a key or a tailer that advances the merge it is called from */
        PyErr_SetString(PyExc_ValueError, "chronq.merge: the merge is already advancing");
        return NULL;
    }
    self->busy = 1;
    PyObject *r = Merge_step(self);
    self->busy = 0;
    return r;
}

static PyObject *Merge_step(MergeObject *self) {
    if (!self->started) {
        self->started = 1;
        Py_ssize_t n = PyTuple_GET_SIZE(self->tailers);
        for (Py_ssize_t src = 0; src < n; src++) {
            int r = merge_read(self, src, &self->heap[self->size]);
            if (r < 0) {
                merge_finish(self, -1);
                return NULL;
            }
            self->size += r;
        }
        for (Py_ssize_t i = self->size / 2 - 1; i >= 0; i--)
            if (merge_siftup(self, i) < 0) {
                merge_finish(self, -1);
                return NULL;
            }
    } else if (self->yielded >= 0) {
        Py_ssize_t src = self->yielded;
        MergeEntry e;
        int r = merge_read(self, src, &e);
        if (r < 0) {
            merge_finish(self, src);
            return NULL;
        }
        MergeEntry old = self->heap[0];
        if (r == 0) { /* heappop */
            self->size--;
            self->heap[0] = self->heap[self->size];
            self->heap[self->size] = (MergeEntry){0};
        } else { /* heapreplace */
            self->heap[0] = e;
        }
        merge_entry_clear(&old);
        self->yielded = -1;
        if (self->size > 0 && merge_siftup(self, 0) < 0) {
            if (r) { /* keys that do not compare: the new item goes back to its tailer */
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                if (merge_move_back(self, e.src, e.index) < 0) PyErr_Clear();
                PyErr_Restore(type, value, tb);
            }
            merge_finish(self, r ? src : -1);
            return NULL;
        }
    }
    if (self->size == 0) {
        merge_finish(self, -1);
        return NULL;
    }
    self->yielded = self->heap[0].src;
    return Py_NewRef(self->heap[0].item);
}

static PyObject *Merge_close(MergeObject *self, PyObject *Py_UNUSED(ignored)) {
    if (self->busy) {
        PyErr_SetString(PyExc_ValueError, "chronq.merge: the merge is already advancing");
        return NULL;
    }
    if (merge_finish(self, self->yielded) < 0) return NULL;
    Py_RETURN_NONE;
}

static void Merge_finalize(MergeObject *self) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!self->finished && self->tailers && merge_finish(self, self->yielded) < 0)
        PyErr_WriteUnraisable((PyObject *)self);
    PyErr_Restore(type, value, tb);
}

static int Merge_traverse(MergeObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->tailers);
    Py_VISIT(self->keyfn);
    for (Py_ssize_t i = 0; i < self->size; i++) {
        Py_VISIT(self->heap[i].key);
        Py_VISIT(self->heap[i].item);
    }
    return 0;
}

static int Merge_clear(MergeObject *self) {
    for (Py_ssize_t i = 0; i < self->size; i++) merge_entry_clear(&self->heap[i]);
    self->size = 0;
    self->finished = 1;
    Py_CLEAR(self->tailers);
    Py_CLEAR(self->native);
    Py_CLEAR(self->keyfn);
    return 0;
}

static void Merge_dealloc(MergeObject *self) {
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) return; /* resurrected */
    PyObject_GC_UnTrack(self);
    Merge_clear(self);
    PyMem_Free(self->heap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Merge_methods[] = {
    {"close", (PyCFunction)Merge_close, METH_NOARGS,
     "stop: each tailer is moved back to just after the last item yielded from it"},
    {NULL}};

static PyTypeObject MergeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "chronq._native.Merge",
    .tp_basicsize = sizeof(MergeObject),
    .tp_dealloc = (destructor)Merge_dealloc,
    .tp_finalize = (destructor)Merge_finalize,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Merge_traverse,
    .tp_clear = (inquiry)Merge_clear,
    .tp_doc = "Merge(tailers, native, key, copy): chronq.merge's iterator over finished inputs",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Merge_next,
    .tp_methods = Merge_methods,
    .tp_new = Merge_new,
};

/* ------------------------------------------------------------------ replication runs
 *
 * A run is what replication sends of a queue: consecutive documents of one cycle, the store's own
 * documents (cycle header, index2index and index arrays: every queue writes its own) left out. Each
 * document is a big-endian uint32 word (bit 31: metadata, bits 0-29: body length, bit 30 zero) then its
 * body. read_run copies a run out of a tailer's mapped cycle file into a frame buffer in one call;
 * write_run appends one through an appender exactly as its write()/write_meta() would (same positions,
 * same index entries and inline index arrays), so a sink's files match its source's. */

#define RUN_META 0x80000000u
#define RUN_RESERVED 0x40000000u

static inline uint32_t ld_be32(const char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}

static inline void st_be32(char *p, uint32_t v) {
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
}

/* Whether a metadata body is one of the store's own documents (as sink.is_store_document). */
static int run_store_doc(const char *body, Py_ssize_t len) {
    static const char header[] = "\xb9\x06header\xb6\x08SCQStore";
    static const char i2i[] = "\xb9\x0bindex2index";
    static const char idx[] = "\xb9\x05index";
    if (len >= (Py_ssize_t)sizeof(header) - 1 && memcmp(body, header, sizeof(header) - 1) == 0) return 1;
    const char *prefixes[2] = {i2i, idx};
    Py_ssize_t sizes[2] = {(Py_ssize_t)sizeof(i2i) - 1, (Py_ssize_t)sizeof(idx) - 1};
    for (int k = 0; k < 2; k++) {
        if (len > sizes[k] && memcmp(body, prefixes[k], (size_t)sizes[k]) == 0) {
            unsigned char c = (unsigned char)body[sizes[k]];
            return c == 0x8D || c == 0x8E || c == 0x8F;
        }
    }
    return 0;
}

/* Walk the documents of a run in buf[start, end): their number and how many are data documents; -1 with
   ValueError naming the document and its offset if a word or a body leaves the run. */
static Py_ssize_t run_walk(const char *buf, Py_ssize_t start, Py_ssize_t end, Py_ssize_t *data_out) {
    Py_ssize_t n = 0, data = 0, at = start;
    while (at < end) {
        if (end - at < 4) {
            PyErr_Format(PyExc_ValueError, "run document %zd: %zd bytes left at offset %zd, a 4-byte header needed",
                         n, end - at, at);
            return -1;
        }
        uint32_t w = ld_be32(buf + at);
        if (w & RUN_RESERVED) {
            PyErr_Format(PyExc_ValueError, "run document %zd at offset %zd: reserved bit set (0x%08x)", n, at, w);
            return -1;
        }
        Py_ssize_t len = (Py_ssize_t)(w & HDR_LENGTH_MASK);
        if (len > end - at - 4) {
            PyErr_Format(PyExc_ValueError, "run document %zd at offset %zd: %zd bytes run past the end of the run (%zd)",
                         n, at, len, end);
            return -1;
        }
        if (!(w & RUN_META))
            data++;
        else if (run_store_doc(buf + at + 4, len)) {
            PyErr_Format(PyExc_ValueError, "run document %zd at offset %zd is a store document (a cycle header or an "
                         "index array): every queue writes its own", n, at);
            return -1;
        }
        at += 4 + len;
        n++;
    }
    *data_out = data;
    return n;
}

static int run_bounds(BufRef *b, Py_ssize_t start, Py_ssize_t end) {
    if (start < 0 || end < start || end > b->len) {
        PyErr_Format(PyExc_IndexError, "run [%zd, %zd) is outside the buffer (%zd bytes)", start, end, b->len);
        return -1;
    }
    return 0;
}

static PyObject *py_check_run(PyObject *m, PyObject *args) {
    /* check_run(buf, start, end) -> (documents, data documents); ValueError for a malformed run */
    PyObject *obj;
    Py_ssize_t start, end, data = 0;
    if (!PyArg_ParseTuple(args, "Onn", &obj, &start, &end)) return NULL;
    BufRef b;
    if (get_buf(obj, &b, 0) < 0) return NULL;
    Py_ssize_t n = run_bounds(&b, start, end) < 0 ? -1 : run_walk(b.base, start, end, &data);
    put_buf(&b);
    if (n < 0) return NULL;
    return Py_BuildValue("nn", n, data);
}

static PyObject *py_read_run(PyObject *m, PyObject *args) {
    /* read_run(tailer, out, start, limit, max_count) -> (documents, data documents, end, first index,
       blocked): copy the ready documents of the tailer's cycle into out[start, limit) */
    PyObject *tobj, *out;
    Py_ssize_t start, limit, max_count;
    if (!PyArg_ParseTuple(args, "OOnnn", &tobj, &out, &start, &limit, &max_count)) return NULL;
    if (!PyObject_TypeCheck(tobj, &TailerType)) {
        PyErr_SetString(PyExc_TypeError, "read_run() reads a chronq tailer");
        return NULL;
    }
    TailerObject *self = (TailerObject *)tobj;
    if (self->direction != 1 || self->named_p || self->headerless) {
        PyErr_SetString(PyExc_ValueError, "read_run() needs an unnamed forward tailer on a queue with headers");
        return NULL;
    }
    BufRef b;
    if (get_buf(out, &b, 1) < 0) return NULL;
    PyObject *res = NULL;
    if (run_bounds(&b, start, limit) < 0) goto done;
    Py_ssize_t docs = 0, data = 0, at = start, blocked = 0;
    int64_t first = -1, cycle = -1;
    while (docs < max_count) {
        uint32_t h;
        int r = Tl_next_doc(self, 1, &h);
        if (r < 0) goto done;
        if (r == 0) break;
        Geometry *g = &self->g;
        if (docs && g->cycle != cycle) break; /* a run holds one cycle */
        Py_ssize_t pos = self->pos, len = (Py_ssize_t)(h & HDR_LENGTH_MASK);
        const char *body = g->base + pos + 4;
        int meta = (h & HDR_META) != 0;
        if (meta && run_store_doc(body, len)) {
            self->pos = align_up(pos + 4 + len, g->align);
            continue;
        }
        if (len > limit - at - 4) {
            if (!docs) blocked = 4 + len;
            break;
        }
        if (!meta && g->i2i_arr && (self->seq & (((int64_t)1 << g->spacing_bits) - 1)) == 0) {
            int64_t entry; /* as read(): every indexed document cross-checks the chain against the index */
            if (index_entry(g, self->seq, &entry) < 0) goto done;
            if (entry != 0 && entry != (int64_t)pos) {
                raise_corrupt(g->map->name, pos, "document chain and index disagree for sequence %lld (index says %lld)",
                              (long long)self->seq, (long long)entry);
                goto done;
            }
        }
        int64_t index = ((int64_t)g->cycle << g->shift) | self->seq;
        if (!docs) {
            first = index;
            cycle = g->cycle;
        }
        st_be32(b.base + at, (uint32_t)len | (meta ? RUN_META : 0));
        memcpy(b.base + at + 4, body, (size_t)len);
        at += 4 + len;
        self->pos = align_up(pos + 4 + len, g->align);
        if (!meta) {
            self->seq++;
            self->last_read = index;
            data++;
        }
        docs++;
    }
    if (self->release_every && self->g.map && self->pos - self->released_to > self->release_every) {
        /* as read(): drop the pages behind what was copied (release_pages_every) */
        Py_ssize_t released = release_range(self->g.base, self->g.size, self->released_to, self->pos);
        if (released > 0) self->released_to = released;
    }
    res = Py_BuildValue("nnnLn", docs, data, at, (long long)first, blocked);
done:
    put_buf(&b);
    return res;
}

static PyObject *py_write_run(PyObject *m, PyObject *args) {
    /* write_run(appender, buf, start, end, cycle, first_seq, count) -> (data documents, metadata documents
       after the last data document): append a run of count documents at cycle/first_seq, which must be
       where the appender's cycle ends; nothing is written if the run is malformed or does not start there */
    PyObject *aobj, *obj;
    Py_ssize_t start, end, count;
    long long cycle, first_seq;
    if (!PyArg_ParseTuple(args, "OOnnLLn", &aobj, &obj, &start, &end, &cycle, &first_seq, &count)) return NULL;
    if (!PyObject_TypeCheck(aobj, &AppenderType)) {
        PyErr_SetString(PyExc_TypeError, "write_run() writes through a chronq appender");
        return NULL;
    }
    AppenderObject *self = (AppenderObject *)aobj;
    if (self->claimed || self->atomic) {
        PyErr_SetString(PyExc_RuntimeError, "a document or an atomic block is open on this appender");
        return NULL;
    }
    BufRef b;
    if (get_buf(obj, &b, 0) < 0) return NULL;
    PyObject *res = NULL;
    Py_ssize_t data = 0, n;
    if (run_bounds(&b, start, end) < 0 || (n = run_walk(b.base, start, end, &data)) < 0) goto done;
    if (n != count) {
        PyErr_Format(PyExc_ValueError, "the run announces %zd documents but holds %zd", count, n);
        goto done;
    }
    if (cycle < 0 || first_seq < 0) {
        PyErr_Format(PyExc_ValueError, "run at cycle %lld sequence %lld", cycle, first_seq);
        goto done;
    }
    if (App_lock(self) < 0) goto done;
    if (App_check_cycle(self) < 0 || App_locate_end(self) < 0) goto unlock;
    if (self->g.cycle != cycle || self->next_seq != first_seq) {
        PyErr_Format(PyExc_ValueError, "the run starts at cycle %lld sequence %lld but the queue ends at cycle %lld "
                     "sequence %lld", cycle, first_seq, (long long)self->g.cycle, (long long)self->next_seq);
        goto unlock;
    }
    if ((int64_t)data > ((int64_t)1 << self->g.shift) - first_seq) {
        PyErr_Format(PyExc_ValueError, "%zd data documents from sequence %lld do not fit in cycle %lld (%d-bit sequences)",
                     data, first_seq, cycle, self->g.shift);
        goto unlock;
    }
    Py_ssize_t at = start, trailing = 0;
    int64_t seq = first_seq;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t w = ld_be32(b.base + at);
        Py_ssize_t len = (Py_ssize_t)(w & HDR_LENGTH_MASK);
        int meta = (w & RUN_META) != 0;
        int64_t index = App_put(self, b.base + at + 4, len, meta);
        if (index < 0) goto unlock;
        int64_t want = ((int64_t)cycle << self->g.shift) | seq;
        if (index != want || self->g.cycle != cycle) {
            PyErr_Format(PyExc_ValueError, "run document %zd was written at index %#llx, not %#llx", i,
                         (long long)index, (long long)want);
            goto unlock;
        }
        if (meta)
            trailing++;
        else {
            seq++;
            trailing = 0;
        }
        at += 4 + len;
    }
    res = Py_BuildValue("nn", data, trailing);
unlock:
    App_unlock(self);
    if (!self->lock_depth) doorbell_after_publish(&self->db, (PyObject *)self); /* doorbell: even a failed run published some */
    if (res && App_after_write(self) < 0) Py_CLEAR(res);
done:
    put_buf(&b);
    return res;
}

static PyMethodDef module_methods[] = {
    {"load32", (PyCFunction)(void (*)(void))py_load32, METH_FASTCALL, "load32(buf, off) -> int (acquire)"},
    {"load64", (PyCFunction)(void (*)(void))py_load64, METH_FASTCALL, "load64(buf, off) -> int (acquire)"},
    {"store32", (PyCFunction)(void (*)(void))py_store32, METH_FASTCALL, "store32(buf, off, v) (release)"},
    {"store64", (PyCFunction)(void (*)(void))py_store64, METH_FASTCALL, "store64(buf, off, v) (release)"},
    {"cas32", (PyCFunction)(void (*)(void))py_cas32, METH_FASTCALL, "cas32(buf, off, expected, new) -> bool"},
    {"cas64", (PyCFunction)(void (*)(void))py_cas64, METH_FASTCALL, "cas64(buf, off, expected, new) -> bool"},
    {"set_max64", (PyCFunction)(void (*)(void))py_set_max64, METH_FASTCALL, "set_max64(buf, off, v) -> new value"},
    {"set_min64", (PyCFunction)(void (*)(void))py_set_min64, METH_FASTCALL, "set_min64(buf, off, v) -> new value"},
    {"add64", (PyCFunction)(void (*)(void))py_add64, METH_FASTCALL, "add64(buf, off, delta) -> new value"},
    {"write_eof", (PyCFunction)(void (*)(void))py_write_eof, METH_FASTCALL, "write_eof(buf, from_pos, align, name=None) -> pos"},
    {"scan", (PyCFunction)(void (*)(void))py_scan, METH_VARARGS | METH_KEYWORDS, "batch header scan"},
    {"gather", (PyCFunction)py_gather, METH_VARARGS, "copy bodies into one buffer + int32 offsets"},
    {"index_array", (PyCFunction)py_index_array, METH_VARARGS, "locate an index document's int64 array"},
    {"check_run", (PyCFunction)py_check_run, METH_VARARGS, "check a replication run's documents"},
    {"read_run", (PyCFunction)py_read_run, METH_VARARGS, "copy a run of documents from a tailer"},
    {"write_run", (PyCFunction)py_write_run, METH_VARARGS, "append a run of documents through an appender"},
    {"read_payloads", (PyCFunction)(void (*)(void))py_read_payloads, METH_FASTCALL, read_payloads_doc},
    DOORBELL_METHODS /* doorbell */
    {NULL}};

static struct PyModuleDef native_module = {PyModuleDef_HEAD_INIT, "chronq._native",
                                           "chronq's native hot path (private; see _native.pyi).", -1, module_methods,
                                           NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&MapType) < 0 || PyType_Ready(&GeometryType) < 0 || PyType_Ready(&AppenderType) < 0 ||
        PyType_Ready(&ExcerptType) < 0 || PyType_Ready(&TailerType) < 0)
        return NULL;
    if (PyType_Ready(&MergeType) < 0) return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Map", (PyObject *)&MapType) < 0 ||
        PyModule_AddObjectRef(m, "Geometry", (PyObject *)&GeometryType) < 0 ||
        PyModule_AddObjectRef(m, "AppenderCore", (PyObject *)&AppenderType) < 0 ||
        PyModule_AddObjectRef(m, "Excerpt", (PyObject *)&ExcerptType) < 0 ||
        PyModule_AddObjectRef(m, "TailerCore", (PyObject *)&TailerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Merge", (PyObject *)&MergeType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *source = PyCapsule_New(&tailer_document_source, DOCUMENT_SOURCE_CAPSULE, NULL);
    if (!source || PyModule_AddObject(m, "DOCUMENT_SOURCE", source) < 0) {
        Py_XDECREF(source);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *unl = PyLong_FromLongLong(LOCK_UNLOCKED);
    if (!unl || PyModule_AddObject(m, "UNLOCKED", unl) < 0) {
        Py_XDECREF(unl);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
