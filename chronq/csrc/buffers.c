/*
 * buffers.c: shared memory and the atomics on it (part of chronq._native; see native.h).
 *
 * Sections: Map (a MAP_SHARED mapping of a cycle or table file that exports the buffer protocol and
 * is unmapped only when freed; release_pages, populate, sync); buffer access for the atomics (get_buf
 * and put_buf, used by every function that takes a buffer) and the atomic loads, stores, CAS and
 * max/min/add on any buffer that the table store and the Python slow paths use.
 */
#include "native.h"

/* ------------------------------------------------------------------ Map */

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
Py_ssize_t release_range(char *base, Py_ssize_t size, Py_ssize_t start, Py_ssize_t end) {
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
       optimisation), without the GIL (the pretoucher thread calls it beside the writing thread).
       Returns whether it was done. */
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "nn", &start, &end)) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    start &= ~(Py_ssize_t)(page - 1);
    if (start < 0) start = 0;
    if (end > self->size) end = self->size;
    int done = 0;
    if (self->writable && end > start) { /* (the mapping lives while self does: the caller holds it) */
        Py_BEGIN_ALLOW_THREADS
        done = madvise(self->base + start, (size_t)(end - start), MADV_POPULATE_WRITE) == 0;
        Py_END_ALLOW_THREADS
    }
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

PyTypeObject MapType = {
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

int get_buf(PyObject *obj, BufRef *b, int writable) {
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

void put_buf(BufRef *b) {
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

PyObject *py_load32(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("load32", 2, 0, 4)
    uint32_t v = ld32(p);
    put_buf(&b);
    return PyLong_FromUnsignedLong(v);
}

PyObject *py_load64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    ATOMIC_PROLOGUE("load64", 2, 0, 8)
    int64_t v = ld64(p);
    put_buf(&b);
    return PyLong_FromLongLong(v);
}

PyObject *py_store64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *py_store32(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *py_cas32(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *py_cas64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *py_set_max64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *py_set_min64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *py_add64(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
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

