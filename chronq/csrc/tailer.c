/*
 * tailer.c: Excerpt and TailerCore, the read side of the hot path (part of chronq._native; see native.h).
 *
 * Sections: Excerpt (a zero-copy view of one document, reused through the module state's freelist);
 * TailerCore: the sparse marks of headerless (libchronicle) cycles, attach/detach/remap, named tailers'
 * position slots, the header scan with acquire loads (Tl_next_doc, which merge.c and runs.c also call),
 * read (Tl_read_impl), the DocumentSource for method readers, read_payloads (Tailer.read_many's forward
 * path), seeks (move_to_index, seek_end), the type. Slow paths (next cycle, remap, end of an older
 * cycle) are Python methods of chronq.tailer.Tailer, called from here.
 */
#include "native.h"

/* ------------------------------------------------------------------ Excerpt */

static void Ex_dealloc(ExcerptObject *self) {
    Py_CLEAR(self->map);
    if (native_state.ex_nfree < EX_FREELIST && Py_IS_TYPE(self, &ExcerptType)) {
        native_state.ex_freelist[native_state.ex_nfree++] = self;
        return;
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static ExcerptObject *Ex_alloc(void) {
    if (native_state.ex_nfree) {
        ExcerptObject *ex = native_state.ex_freelist[--native_state.ex_nfree];
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
PyObject *Ex_bytes(ExcerptObject *self, PyObject *Py_UNUSED(ignored)) {
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

PyTypeObject ExcerptType = {
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
int Tl_next_doc(TailerObject *self, int want_meta, uint32_t *hout) {
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

PyObject *Tl_read_impl(TailerObject *self, int want_meta, int commit, Py_ssize_t max_refs) {
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
static PyObject *Tl_read_document(PyObject *source, const char **data, Py_ssize_t *len, int *metadata,
                                  int64_t *index) {
    *data = NULL;
    *len = 0;
    *metadata = -1;
    *index = -1;
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
        *index = ex->index;
    }
    return r;
}

DocumentSource tailer_document_source = {DOCUMENT_SOURCE_VERSION, Tl_read_document};

/* Tailer.read_many's forward path: payloads copied out of the map in one C loop (no Python step per
 * message). Lives here, not in chronq._codecs, so a plain queue never loads that module (and its
 * libcrypto). */
const char read_payloads_doc[] = PyDoc_STR(
"read_payloads(tailer, out, max_count, max_bytes, /)\n--\n\n"
"Reads up to `max_count` data documents from `tailer` (a TailerCore), stopping after the one that brings\n"
"the bytes read to `max_bytes`, and appends copies of their payloads to the list `out`. Returns\n"
"(pending, nbytes, error): pending holds the one document read but not copied (an excerpt not backed by\n"
"a map, which the caller copies through Python; empty otherwise), nbytes the bytes appended, error None\n"
"or the exception the tailer raised when it could not read on (what was read before is in `out`).");

PyObject *py_read_payloads(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
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
            error = take_error();
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
static int Tl_set_last_read(TailerObject *self, PyObject *v, void *c) {
    if (!v) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete the last read index");
        return -1;
    }
    long long i = PyLong_AsLongLong(v);
    if (i == -1 && PyErr_Occurred()) return -1;
    self->last_read = i < 0 ? -1 : i;
    return 0;
}
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
    {"_last_read", (getter)Tl_get_last_read, (setter)Tl_set_last_read, NULL, NULL},
    {"_map", (getter)Tl_get_map, NULL, NULL, NULL},
    {"_direction", (getter)Tl_get_dir, (setter)Tl_set_dir, NULL, NULL},
    {NULL}};

PyTypeObject TailerType = {
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

