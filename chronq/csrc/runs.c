/*
 * runs.c: replication runs (part of chronq._native; see native.h): what chronq.replication sends of a
 * queue, consecutive documents of one cycle in one frame.
 *
 * Sections: the run format (big-endian words, the store's own documents left out); check_run (a
 * received run's documents, before anything is written); read_run (copy a run out of a tailer's mapped
 * cycle); write_run (append a run through an appender, as write()/write_meta() would).
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

PyObject *py_read_run(PyObject *m, PyObject *args) {
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

