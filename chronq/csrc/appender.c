/*
 * appender.c: AppenderCore, the write side of the hot path (part of chronq._native; see native.h).
 *
 * Sections, in the order of a write: attaching to a cycle (_attach, _detach, the write lock's view, the
 * clock and the growth limits); the write lock (App_lock, App_unlock, stale-lock takeover in Python);
 * finding the end (App_check_cycle, App_locate_end); index entries and inline index arrays (App_index,
 * deferred ones for atomic blocks); App_put (copy the body, publish the header, writePosition); the
 * publish paths Python calls: write, write_meta, write_many, the open document (begin, commit, abort)
 * and the atomic block (atomic_begin, atomic_end); the type. write_run (runs.c) goes through the same
 * App_lock, App_locate_end and App_put. Slow paths (roll, growth, stale locks) are Python methods of
 * chronq.appender.Appender, called from here.
 */
#include "native.h"

/* ------------------------------------------------------------------ AppenderCore */

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
    Py_VISIT(self->clock_millis);
    return 0;
}

static void App_dealloc(AppenderObject *self) {
    PyObject_GC_UnTrack(self);
    PyMem_Free(self->deferred);
    App_clear_lock_view(self);
    doorbell_clear(&self->db); /* doorbell */
    Py_CLEAR(self->g.map);
    Py_CLEAR(self->clock_millis);
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

/* _set_clock(start_ms, end_ms, millis): the current cycle's window, against the system's realtime clock
   (millis None) or a clock of the queue's own (its millis()) */
static PyObject *App_set_clock(AppenderObject *self, PyObject *args) {
    long long start, end;
    PyObject *millis;
    if (!PyArg_ParseTuple(args, "LLO", &start, &end, &millis)) return NULL;
    if (millis != Py_None && !PyCallable_Check(millis)) {
        PyErr_SetString(PyExc_TypeError, "_set_clock(): millis must be callable or None");
        return NULL;
    }
    self->cycle_start_ms = start;
    self->cycle_end_ms = end;
    Py_XSETREF(self->clock_millis, millis == Py_None ? NULL : Py_NewRef(millis));
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
int App_after_write(AppenderObject *self) {
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

int App_lock(AppenderObject *self) {
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

void App_unlock(AppenderObject *self) {
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
int App_check_cycle(AppenderObject *self) {
    if (self->g.map) {
        if (!self->clock_millis) {
            /* the coarse clock never runs ahead of the real one: far from the end it is enough (~10 ns
               against ~45 ns for the precise clock on a VM) */
            int64_t c = clock_ms(CLOCK_REALTIME_COARSE);
            if (c >= self->cycle_start_ms && c < self->cycle_end_ms - COARSE_LAG_MS) return 0;
            int64_t t = clock_ms(CLOCK_REALTIME);
            if (t >= self->cycle_start_ms && t < self->cycle_end_ms) return 0;
        } else {
            /* a clock of the queue's own: one call of its millis(), not `_roll` (the cycle it is in,
               computed in Python, at every write); a time that is no int goes to `_roll` to be reported */
            PyObject *r = PyObject_CallNoArgs(self->clock_millis);
            if (!r) return -1;
            int overflow = 0, within = 0;
            if (PyLong_Check(r)) {
                long long t = PyLong_AsLongLongAndOverflow(r, &overflow);
                if (t == -1 && PyErr_Occurred()) PyErr_Clear();
                else within = !overflow && t >= self->cycle_start_ms && t < self->cycle_end_ms;
            }
            Py_DECREF(r);
            if (within) return 0;
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
int App_locate_end(AppenderObject *self) {
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
int64_t App_put(AppenderObject *self, const char *data, Py_ssize_t len, int meta) {
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
/* where this appender's last write ended, as it last knew (no look at the file: safe from another thread) */
static PyObject *App_get_written_to(AppenderObject *self, void *c) { return PyLong_FromSsize_t(self->end_pos); }

static PyGetSetDef App_getset[] = {
    {"last_index_appended", (getter)App_get_last_index, NULL, "index of the last data message this appender wrote (-1: none)", NULL},
    {"cycle", (getter)App_get_cycle, NULL, NULL, NULL},
    {"_map", (getter)App_get_map, NULL, NULL, NULL},
    {"_locked", (getter)App_get_locked, NULL, NULL, NULL},
    {"_written_to", (getter)App_get_written_to, NULL, NULL, NULL},
    {NULL}};

PyTypeObject AppenderType = {
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

