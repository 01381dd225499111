/*
 * runs.c: replication runs (part of chronq._native; see native.h): what chronq.replication sends of a
 * queue, consecutive documents of one cycle in one frame.
 *
 * Sections: the run format (big-endian words, the store's own documents left out); check_run (a
 * received run's documents, before anything is written); read_run (copy a run out of a tailer's mapped
 * cycle); read_runs (several runs of one cycle into fixed-size slots, a datagram's each); write_run
 * (append a run through an appender, as write()/write_meta() would).
 */
#include "native.h"

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

PyObject *py_check_run(PyObject *m, PyObject *args) {
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

/* One run out of the tailer into base[start, limit), at most max_count documents, of cycle *cycle (-1: the
   tailer's next one, then set): *docs, *data, *end, *first (index of the first, -1 for none) and *blocked
   (the size a first document too big for the room would need); -1 with an exception. *full: the next
   document is ready but did not fit (another run may take it). */
static int run_read(TailerObject *self, char *base, Py_ssize_t start, Py_ssize_t limit, Py_ssize_t max_count,
                    int64_t *cycle, Py_ssize_t *docs_out, Py_ssize_t *data_out, Py_ssize_t *end_out,
                    int64_t *first_out, Py_ssize_t *blocked_out, int *full) {
    Py_ssize_t docs = 0, data = 0, at = start, blocked = 0;
    int64_t first = -1;
    *full = 0;
    while (docs < max_count) {
        uint32_t h;
        int r = Tl_next_doc(self, 1, &h);
        if (r < 0) return -1;
        if (r == 0) break;
        Geometry *g = &self->g;
        if (*cycle >= 0 && g->cycle != *cycle) break; /* a run holds one cycle */
        Py_ssize_t pos = self->pos, len = (Py_ssize_t)(h & HDR_LENGTH_MASK);
        const char *body = g->base + pos + 4;
        int meta = (h & HDR_META) != 0;
        if (meta && run_store_doc(body, len)) {
            self->pos = align_up(pos + 4 + len, g->align);
            continue;
        }
        if (len > limit - at - 4) {
            if (!docs) blocked = 4 + len;
            *full = 1;
            break;
        }
        if (!meta && g->i2i_arr && (self->seq & (((int64_t)1 << g->spacing_bits) - 1)) == 0) {
            int64_t entry; /* as read(): every indexed document cross-checks the chain against the index */
            if (index_entry(g, self->seq, &entry) < 0) return -1;
            if (entry != 0 && entry != (int64_t)pos) {
                raise_corrupt(g->map->name, pos, "document chain and index disagree for sequence %lld (index says %lld)",
                              (long long)self->seq, (long long)entry);
                return -1;
            }
        }
        int64_t index = ((int64_t)g->cycle << g->shift) | self->seq;
        if (!docs) {
            first = index;
            *cycle = g->cycle;
        }
        st_be32(base + at, (uint32_t)len | (meta ? RUN_META : 0));
        memcpy(base + at + 4, body, (size_t)len);
        at += 4 + len;
        self->pos = align_up(pos + 4 + len, g->align);
        if (!meta) {
            self->seq++;
            self->last_read = index;
            data++;
        }
        docs++;
    }
    *docs_out = docs;
    *data_out = data;
    *end_out = at;
    *first_out = first;
    *blocked_out = blocked;
    return 0;
}

/* As read(): drop the pages behind what was copied (release_pages_every). */
static void run_release(TailerObject *self) {
    if (self->release_every && self->g.map && self->pos - self->released_to > self->release_every) {
        Py_ssize_t released = release_range(self->g.base, self->g.size, self->released_to, self->pos);
        if (released > 0) self->released_to = released;
    }
}

static TailerObject *run_tailer(PyObject *tobj, const char *name) {
    if (!PyObject_TypeCheck(tobj, &TailerType)) {
        PyErr_Format(PyExc_TypeError, "%s() reads a chronq tailer", name);
        return NULL;
    }
    TailerObject *self = (TailerObject *)tobj;
    if (self->direction != 1 || self->named_p || self->headerless) {
        PyErr_Format(PyExc_ValueError, "%s() needs an unnamed forward tailer on a queue with headers", name);
        return NULL;
    }
    return self;
}

PyObject *py_read_run(PyObject *m, PyObject *args) {
    /* read_run(tailer, out, start, limit, max_count) -> (documents, data documents, end, first index,
       blocked): copy the ready documents of the tailer's cycle into out[start, limit) */
    PyObject *tobj, *out;
    Py_ssize_t start, limit, max_count;
    if (!PyArg_ParseTuple(args, "OOnnn", &tobj, &out, &start, &limit, &max_count)) return NULL;
    TailerObject *self = run_tailer(tobj, "read_run");
    if (!self) return NULL;
    BufRef b;
    if (get_buf(out, &b, 1) < 0) return NULL;
    PyObject *res = NULL;
    if (run_bounds(&b, start, limit) < 0) goto done;
    Py_ssize_t docs, data, at, blocked;
    int64_t first, cycle = -1;
    int full;
    if (run_read(self, b.base, start, limit, max_count, &cycle, &docs, &data, &at, &first, &blocked, &full) < 0)
        goto done;
    run_release(self);
    res = Py_BuildValue("nnnLn", docs, data, at, (long long)first, blocked);
done:
    put_buf(&b);
    return res;
}

PyObject *py_read_runs(PyObject *m, PyObject *args) {
    /* read_runs(tailer, out, size, start, stop, max_runs, max_count) -> (documents, data documents, first
       index, blocked, ends): runs of one cycle into the slots out[k*size + start, k*size + stop) */
    PyObject *tobj, *out;
    Py_ssize_t size, start, stop, max_runs, max_count;
    if (!PyArg_ParseTuple(args, "OOnnnnn", &tobj, &out, &size, &start, &stop, &max_runs, &max_count)) return NULL;
    TailerObject *self = run_tailer(tobj, "read_runs");
    if (!self) return NULL;
    if (size <= 0 || start < 0 || stop < start || stop > size || max_runs < 0) {
        PyErr_Format(PyExc_ValueError, "read_runs(): slots of %zd bytes, documents in [%zd, %zd), %zd slots", size,
                     start, stop, max_runs);
        return NULL;
    }
    BufRef b;
    if (get_buf(out, &b, 1) < 0) return NULL;
    PyObject *res = NULL, *ends = NULL;
    if (max_runs > b.len / size) {
        PyErr_Format(PyExc_IndexError, "%zd slots of %zd bytes do not fit in the buffer (%zd bytes)", max_runs, size,
                     b.len);
        goto done;
    }
    if (!(ends = PyList_New(0))) goto done;
    Py_ssize_t docs = 0, data = 0, blocked = 0;
    int64_t first = -1, cycle = -1;
    for (Py_ssize_t k = 0; k < max_runs && docs < max_count; k++) {
        Py_ssize_t d, dd, at, bl;
        int64_t f;
        int full;
        if (run_read(self, b.base, k * size + start, k * size + stop, max_count - docs, &cycle, &d, &dd, &at, &f,
                     &bl, &full) < 0)
            goto done;
        if (!d) {
            if (!k) blocked = bl;
            break;
        }
        PyObject *e = PyLong_FromSsize_t(at);
        if (!e || PyList_Append(ends, e) < 0) {
            Py_XDECREF(e);
            goto done;
        }
        Py_DECREF(e);
        if (!k) first = f;
        docs += d;
        data += dd;
        if (!full) break; /* nothing more ready, another cycle next, or max_count */
    }
    run_release(self);
    res = Py_BuildValue("nnLnO", docs, data, (long long)first, blocked, ends);
done:
    Py_XDECREF(ends);
    put_buf(&b);
    return res;
}

PyObject *py_write_run(PyObject *m, PyObject *args) {
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

