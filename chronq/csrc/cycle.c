/*
 * cycle.c: the layout of a cycle file, shared by the appender and the tailer (part of chronq._native;
 * see native.h).
 *
 * Sections: document walking helpers (locating an index or index2index document's int64 array);
 * Geometry (the Python object a cycle file's store header becomes, and the C struct the cores keep:
 * parse_geometry, index_entry, seek_seq, seq_at_position); module-level helpers over a whole cycle
 * buffer (write_eof, scan and gather for columnar readers, index_array).
 */
#include "native.h"

/* ------------------------------------------------------------------ document walking helpers */

/* Locate the int64 array of an index/index2index metadata document at doc_pos.
   Returns the offset of its capacity field (values start 16 bytes later) or -1 with an exception. */
Py_ssize_t index_array_at(const char *base, Py_ssize_t size, Py_ssize_t doc_pos, int64_t want_cap,
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

PyTypeObject GeometryType = {
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

int parse_geometry(Geometry *g, PyObject *arg, long long wp_off) {
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
int index_entry(Geometry *g, int64_t seq, int64_t *out) {
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
int seek_seq(Geometry *g, int64_t seq, Py_ssize_t *pos_out) {
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
int64_t seq_at_position(Geometry *g, Py_ssize_t wp) {
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

/* ------------------------------------------------------------------ module-level helpers */

PyObject *py_write_eof(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *py_scan(PyObject *m, PyObject *args, PyObject *kwds) {
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

PyObject *py_gather(PyObject *m, PyObject *args) {
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

PyObject *py_index_array(PyObject *m, PyObject *args) {
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

