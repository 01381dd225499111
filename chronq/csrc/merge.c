/*
 * merge.c: Merge, the k-way merge behind chronq.merge(follow=False) (part of chronq._native; see native.h).
 *
 * Sections: the heap (entries ordered as Python orders (key, source, item) tuples, kept with heapq's
 * algorithm); reading an input (TailerCore's read without a Python call, any other tailer's read()
 * called); the end (every tailer moved back to its pending item, as the Python merge's `finally`);
 * the iterator type.
 */
#include "native.h"

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
    SavedError err;
    saved_error_take(&err);
    for (Py_ssize_t i = 0; i < self->size; i++) {
        MergeEntry *e = &self->heap[i];
        if (e->src != skip && merge_move_back(self, e->src, e->index) < 0) {
            if (saved_error_set(&err))
                PyErr_Clear();
            else
                saved_error_take(&err);
        }
    }
    for (Py_ssize_t i = 0; i < self->size; i++) merge_entry_clear(&self->heap[i]);
    self->size = 0;
    int failed = saved_error_set(&err);
    saved_error_restore(&err);
    return failed ? -1 : 0;
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
        SavedError err;
        saved_error_take(&err);
        if (merge_move_back(self, src, index) < 0) PyErr_Clear();
        saved_error_restore(&err);
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
                SavedError err;
                saved_error_take(&err);
                if (merge_move_back(self, e.src, e.index) < 0) PyErr_Clear();
                saved_error_restore(&err);
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
    SavedError err;
    saved_error_take(&err);
    if (!self->finished && self->tailers && merge_finish(self, self->yielded) < 0)
        PyErr_WriteUnraisable((PyObject *)self);
    saved_error_restore(&err);
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

PyTypeObject MergeType = {
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

