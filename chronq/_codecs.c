/*
 * chronq._codecs: batch framing and unframing of codec payloads (chronq/codecs.py, layout in docs/codecs.md),
 * and of replication's datagrams (chronq/replication/_udp.py, layout in its docstring).
 *
 * A message of a codec queue costs one library call (zstd, AES-GCM) and a few Python steps around it; at
 * 256 bytes the Python steps cost more than the library's own work. These functions take a whole batch:
 *   - frame_many: the frames of a batch of payloads (already compressed by zstd's batch API when the
 *     codec compresses), AES-GCM sealed here when the codec encrypts;
 *   - read_frames: reads a run of documents of a codec queue from a tailer through wire/_document_source.h
 *     (no Python call per document) and decodes the frames it can: plain frames, zstd frames (one call to
 *     python-zstandard's multi_decompress_to_buffer per run of the same dictionary) and AES-GCM frames.
 *     Anything else (an unknown or missing key or dictionary, a failed tag, damage, a size above the
 *     bound) stops the run and is handed back to the caller, whose per-message decoder names the problem.
 *   - seal_datagrams / open_datagrams: chronq/replication/_udp.py's datagrams a batch per call (sealed and
 *     sent with sendmmsg; taken with recvmmsg and checked), the GIL released around the crypto and the
 *     system calls; without OpenSSL _udp.py seals and opens one at a time through `cryptography`.
 * AES-GCM uses OpenSSL's EVP when built with CHRONQ_OPENSSL (setup.py defines it when the headers are
 * found); without it HAVE_AES is False and chronq.codecs keeps the `cryptography` path. Keys never appear
 * in an error. Every length read from a document is checked against the document before it is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../wire/_document_source.h"
#include "csrc/pyerr.h"
#include <stdint.h>
#include <string.h>
#ifdef CHRONQ_OPENSSL
#include <openssl/evp.h>
#endif

#define MAGIC0 0xC5
#define MAGIC1 0x1C
#define VERSION 1
#define HEAD 12
#define KEYED 28
#define TAG 16
#define CID_ZSTD 1
#define CID_AES 0x10

static uint32_t ld32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void st32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* obj[i] of a sequence that may only implement the mapping protocol (python-zstandard's collections). */
static PyObject *item_at(PyObject *obj, Py_ssize_t i) {
    PySequenceMethods *sq = Py_TYPE(obj)->tp_as_sequence;
    if (sq && sq->sq_item) return sq->sq_item(obj, i);
    PyObject *k = PyLong_FromSsize_t(i);
    if (!k) return NULL;
    PyObject *r = PyObject_GetItem(obj, k);
    Py_DECREF(k);
    return r;
}

/* ---- AES-GCM ------------------------------------------------------------------------------------- */
#ifdef CHRONQ_OPENSSL
static const EVP_CIPHER *gcm_cipher(Py_ssize_t key_len) {
    switch (key_len) {
    case 16: return EVP_aes_128_gcm();
    case 24: return EVP_aes_192_gcm();
    case 32: return EVP_aes_256_gcm();
    default: return NULL;
    }
}

/* EVP lengths are ints: feed a long body in pieces. */
static int gcm_update(EVP_CIPHER_CTX *ctx, int enc, unsigned char *out, const unsigned char *in, Py_ssize_t len) {
    while (len > 0) {
        int piece = len > (1 << 30) ? (1 << 30) : (int)len, outl = 0;
        int ok = enc ? EVP_EncryptUpdate(ctx, out, &outl, in, piece) : EVP_DecryptUpdate(ctx, out, &outl, in, piece);
        if (ok != 1 || outl != piece) return -1;
        in += piece;
        out += piece;
        len -= piece;
    }
    return 0;
}

/* Seal `body` into out (len bytes of ciphertext, then the tag); the 28-byte header at aad is authenticated. */
static int gcm_seal(EVP_CIPHER_CTX *ctx, const unsigned char *aad, const unsigned char *body, Py_ssize_t len,
                    unsigned char *out) {
    int outl = 0;
    if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, aad + 16) != 1) return -1; /* the nonce is header[16:28] */
    if (EVP_EncryptUpdate(ctx, NULL, &outl, aad, KEYED) != 1) return -1;
    if (gcm_update(ctx, 1, out, body, len) < 0) return -1;
    if (EVP_EncryptFinal_ex(ctx, out + len, &outl) != 1 || outl != 0) return -1;
    return EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG, out + len) == 1 ? 0 : -1;
}

/* Open a frame of `len` bytes (header, ciphertext, tag) into out; -1 when the tag does not match. */
static int gcm_open(EVP_CIPHER_CTX *ctx, const unsigned char *frame, Py_ssize_t len, unsigned char *out) {
    int outl = 0;
    Py_ssize_t n = len - KEYED - TAG;
    if (n < 0) return -1;
    if (EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, frame + 16) != 1) return -1;
    if (EVP_DecryptUpdate(ctx, NULL, &outl, frame, KEYED) != 1) return -1;
    if (gcm_update(ctx, 0, out, frame + KEYED, n) < 0) return -1;
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG, (void *)(frame + KEYED + n)) != 1) return -1;
    return EVP_DecryptFinal_ex(ctx, out + n, &outl) == 1 ? 0 : -1;
}

/* A context keyed with `key` (bytes of 16, 24 or 32), or NULL with an exception. */
static EVP_CIPHER_CTX *gcm_context(PyObject *key, int enc) {
    if (!PyBytes_Check(key) || !gcm_cipher(PyBytes_GET_SIZE(key))) {
        PyErr_SetString(PyExc_ValueError, "an AES key is 16, 24 or 32 bytes");
        return NULL;
    }
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (!ctx) {
        PyErr_NoMemory();
        return NULL;
    }
    const EVP_CIPHER *cipher = gcm_cipher(PyBytes_GET_SIZE(key));
    const unsigned char *k = (const unsigned char *)PyBytes_AS_STRING(key);
    int ok = enc ? EVP_EncryptInit_ex(ctx, cipher, NULL, k, NULL) : EVP_DecryptInit_ex(ctx, cipher, NULL, k, NULL);
    if (ok != 1) {
        EVP_CIPHER_CTX_free(ctx);
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not set up AES-GCM");
        return NULL;
    }
    return ctx;
}
#endif

/* ---- frame_many ---------------------------------------------------------------------------------- */
PyDoc_STRVAR(frame_many_doc,
"frame_many(items, compressed, cid, dict_id, limit, key, key_id, nonce_prefix, counter, /)\n--\n\n"
"The frames of `items` (a list of bytes-like payloads): `compressed` is None or a sequence of the same\n"
"length holding each payload compressed with codec `cid` (kept only where smaller); `key` None or the AES\n"
"key to seal them with under `key_id`, nonces nonce_prefix (8 bytes) + counter, counter + 1, ... (the\n"
"caller keeps counter + len(items) <= 2**32). Returns the list of frames, or the position (an int) of\n"
"the first payload longer than `limit`.");

static PyObject *frame_many(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "frame_many takes 9 arguments");
        return NULL;
    }
    PyObject *items = args[0], *compressed = args[1], *key = args[5], *prefix = args[7];
    long cid = PyLong_AsLong(args[2]);
    unsigned long long did = PyLong_AsUnsignedLongLong(args[3]);
    unsigned long long limit = PyLong_AsUnsignedLongLong(args[4]);
    unsigned long long kid = PyLong_AsUnsignedLongLong(args[6]);
    unsigned long long counter = PyLong_AsUnsignedLongLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "frame_many: items must be a list");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    if (cid < 0 || cid > 0xF || did > 0xFFFFFFFFull || kid > 0xFFFFFFFFull || limit > 0xFFFFFFFFull) {
        PyErr_SetString(PyExc_ValueError, "frame_many: codec id, dictionary id, key id or limit out of range");
        return NULL;
    }
    if (compressed != Py_None && PyObject_Size(compressed) != count) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "frame_many: one compressed body per item");
        return NULL;
    }
    int sealed = key != Py_None;
    if (sealed && (!PyBytes_Check(prefix) || PyBytes_GET_SIZE(prefix) != 8 || counter + (unsigned long long)count > 0x100000000ull)) {
        PyErr_SetString(PyExc_ValueError, "frame_many: the nonce prefix is 8 bytes and the counter must not wrap");
        return NULL;
    }
#ifdef CHRONQ_OPENSSL
    EVP_CIPHER_CTX *ctx = NULL;
    if (sealed && !(ctx = gcm_context(key, 1))) return NULL;
#else
    if (sealed) {
        PyErr_SetString(PyExc_NotImplementedError, "chronq._codecs was built without OpenSSL");
        return NULL;
    }
#endif
    PyObject *out = PyList_New(count);
    if (!out) goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer item, comp;
        comp.obj = NULL;
        if (i >= PyList_GET_SIZE(items)) {
            PyErr_SetString(PyExc_RuntimeError, "frame_many: items changed size");
            goto fail;
        }
        if (PyObject_GetBuffer(PyList_GET_ITEM(items, i), &item, PyBUF_SIMPLE) < 0) goto fail;
        if ((unsigned long long)item.len > limit) {
            PyBuffer_Release(&item);
            Py_DECREF(out);
#ifdef CHRONQ_OPENSSL
            EVP_CIPHER_CTX_free(ctx);
#endif
            return PyLong_FromSsize_t(i);
        }
        const unsigned char *body = item.buf;
        Py_ssize_t body_len = item.len;
        int c = 0;
        if (compressed != Py_None) {
            PyObject *seg = item_at(compressed, i);
            int got = seg ? PyObject_GetBuffer(seg, &comp, PyBUF_SIMPLE) : -1;
            Py_XDECREF(seg);
            if (got < 0) {
                comp.obj = NULL;
                PyBuffer_Release(&item);
                goto fail;
            }
            if (comp.len < item.len) {
                body = comp.buf;
                body_len = comp.len;
                c = (int)cid;
            }
        }
        Py_ssize_t head = sealed ? KEYED : HEAD;
        PyObject *frame = PyBytes_FromStringAndSize(NULL, head + body_len + (sealed ? TAG : 0));
        if (frame) {
            unsigned char *f = (unsigned char *)PyBytes_AS_STRING(frame);
            f[0] = MAGIC0;
            f[1] = MAGIC1;
            f[2] = VERSION;
            f[3] = (unsigned char)(c | (sealed ? CID_AES : 0));
            st32(f + 4, c ? (uint32_t)did : 0);
            st32(f + 8, (uint32_t)item.len);
            if (!sealed) {
                memcpy(f + HEAD, body, (size_t)body_len);
            } else {
#ifdef CHRONQ_OPENSSL
                st32(f + 12, (uint32_t)kid);
                memcpy(f + 16, PyBytes_AS_STRING(prefix), 8);
                st32(f + 24, (uint32_t)(counter + (unsigned long long)i));
                if (gcm_seal(ctx, f, body, body_len, f + KEYED) < 0) {
                    Py_CLEAR(frame);
                    PyErr_SetString(PyExc_RuntimeError, "OpenSSL AES-GCM encryption failed");
                }
#endif
            }
        }
        if (comp.obj) PyBuffer_Release(&comp);
        PyBuffer_Release(&item);
        if (!frame) goto fail;
        PyList_SET_ITEM(out, i, frame);
    }
#ifdef CHRONQ_OPENSSL
    EVP_CIPHER_CTX_free(ctx);
#endif
    return out;
fail:
#ifdef CHRONQ_OPENSSL
    EVP_CIPHER_CTX_free(ctx);
#endif
    Py_XDECREF(out);
    return NULL;
}

/* ---- read_frames --------------------------------------------------------------------------------- */
/* A run of zstd frames of one dictionary, decompressed in one call when it ends. */
typedef struct {
    PyObject *dctx;          /* the decompressor of dict_id (a reference) */
    uint32_t dict_id;
    PyObject *excerpts;      /* list: the run's documents, handed back if the batch call fails */
    unsigned char *data;     /* the frames' compressed bodies, back to back */
    Py_ssize_t len, cap;
    uint64_t *segments;      /* (offset, length) per frame */
    uint64_t *sizes;         /* plain length per frame */
    Py_ssize_t count, seg_cap;
} Run;

static void run_free(Run *r) {
    Py_CLEAR(r->dctx);
    Py_CLEAR(r->excerpts);
    PyMem_Free(r->data);
    PyMem_Free(r->segments);
    PyMem_Free(r->sizes);
    memset(r, 0, sizeof *r);
}

/* Add a frame of `len` compressed bytes to the run: copied from `body`, or (body NULL) left for the
 * caller to fill at *dst. */
static int run_add(Run *r, PyObject *ex, const unsigned char *body, Py_ssize_t len, uint32_t n, unsigned char **dst) {
    if (!r->excerpts && !(r->excerpts = PyList_New(0))) return -1;
    if (r->len + len > r->cap) {
        Py_ssize_t cap = r->cap ? r->cap : 16384;
        while (cap < r->len + len) {
            if (cap > PY_SSIZE_T_MAX / 2) {
                PyErr_NoMemory();
                return -1;
            }
            cap *= 2;
        }
        unsigned char *d = PyMem_Realloc(r->data, (size_t)cap);
        if (!d) {
            PyErr_NoMemory();
            return -1;
        }
        r->data = d;
        r->cap = cap;
    }
    if (r->count == r->seg_cap) {
        Py_ssize_t cap = r->seg_cap ? r->seg_cap * 2 : 256;
        uint64_t *s = PyMem_Realloc(r->segments, (size_t)cap * 2 * sizeof(uint64_t));
        if (!s) {
            PyErr_NoMemory();
            return -1;
        }
        r->segments = s;
        uint64_t *z = PyMem_Realloc(r->sizes, (size_t)cap * sizeof(uint64_t));
        if (!z) {
            PyErr_NoMemory();
            return -1;
        }
        r->sizes = z;
        r->seg_cap = cap;
    }
    if (PyList_Append(r->excerpts, ex) < 0) return -1;
    if (body)
        memcpy(r->data + r->len, body, (size_t)len);
    else
        *dst = r->data + r->len;
    r->segments[2 * r->count] = (uint64_t)r->len;
    r->segments[2 * r->count + 1] = (uint64_t)len;
    r->sizes[r->count] = n;
    r->len += len;
    r->count++;
    return 0;
}

#ifdef CHRONQ_OPENSSL
/* Take the last frame back out of the run (its body could not be decrypted). */
static int run_pop(Run *r) {
    r->count--;
    r->len = (Py_ssize_t)r->segments[2 * r->count];
    return PyList_SetSlice(r->excerpts, r->count, r->count + 1, NULL);
}
#endif

/* Decompress the run into `out`. 1: done; 0: zstd refused it (the run's documents go to `pending`);
 * -1: another error. The output of each frame is bounded by its plain length (python-zstandard fails a
 * frame that would decompress to more or less). */
static int run_flush(Run *r, PyObject *zstd, PyObject *out, PyObject *pending) {
    if (!r->count) return 1;
    int result = -1;
    PyObject *bws = NULL, *res = NULL, *data = NULL, *segs = NULL, *sizes = NULL;
    PyObject *bws_type = PyTuple_GET_ITEM(zstd, 0), *zstd_error = PyTuple_GET_ITEM(zstd, 1);
    data = PyBytes_FromStringAndSize((const char *)r->data, r->len);
    segs = PyBytes_FromStringAndSize((const char *)r->segments, r->count * 2 * (Py_ssize_t)sizeof(uint64_t));
    sizes = PyBytes_FromStringAndSize((const char *)r->sizes, r->count * (Py_ssize_t)sizeof(uint64_t));
    if (!data || !segs || !sizes) goto done;
    bws = PyObject_CallFunctionObjArgs(bws_type, data, segs, NULL);
    if (!bws) goto done;
    PyObject *meth = PyObject_GetAttrString(r->dctx, "multi_decompress_to_buffer");
    if (!meth) goto done;
    PyObject *kw = Py_BuildValue("{sO}", "decompressed_sizes", sizes);
    if (kw) {
        PyObject *a = PyTuple_Pack(1, bws);
        if (a) res = PyObject_Call(meth, a, kw);
        Py_XDECREF(a);
        Py_DECREF(kw);
    }
    Py_DECREF(meth);
    if (!res) {
        if (PyErr_ExceptionMatches(zstd_error)) {
            PyErr_Clear();
            Py_ssize_t k = PyList_GET_SIZE(r->excerpts);
            for (Py_ssize_t i = 0; i < k; i++)
                if (PyList_Append(pending, PyList_GET_ITEM(r->excerpts, i)) < 0) goto done;
            result = 0;
        }
        goto done;
    }
    Py_ssize_t k = PyObject_Size(res);
    if (k != r->count) {
        if (k >= 0) PyErr_SetString(PyExc_RuntimeError, "zstd returned a different number of frames");
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *seg = item_at(res, i);
        if (!seg) goto done;
        Py_buffer b;
        if (PyObject_GetBuffer(seg, &b, PyBUF_SIMPLE) < 0) {
            Py_DECREF(seg);
            goto done;
        }
        PyObject *msg = NULL;
        if ((uint64_t)b.len == r->sizes[i])
            msg = PyBytes_FromStringAndSize(b.buf, b.len);
        else
            PyErr_SetString(PyExc_RuntimeError, "zstd returned a frame of another length than asked");
        PyBuffer_Release(&b);
        Py_DECREF(seg);
        if (!msg) goto done;
        int app = PyList_Append(out, msg);
        Py_DECREF(msg);
        if (app < 0) goto done;
    }
    result = 1;
done:
    Py_XDECREF(res);
    Py_XDECREF(bws);
    Py_XDECREF(data);
    Py_XDECREF(segs);
    Py_XDECREF(sizes);
    Py_CLEAR(r->excerpts);
    Py_CLEAR(r->dctx);
    r->len = 0;
    r->count = 0;
    return result;
}

PyDoc_STRVAR(read_frames_doc,
"read_frames(source, tailer, out, max_count, max_bytes, max_size, dctxs, keys, zstd, /)\n--\n\n"
"Reads up to `max_count` data documents from `tailer` (through `source`, the tailer's DocumentSource\n"
"capsule), stopping after the one that brings the plain bytes read to `max_bytes`, and appends their plain\n"
"payloads to the list `out`. `max_size` (>= 0) bounds a frame's plain length. `dctxs` maps dictionary\n"
"ids (0: none) to zstd decompressors, `keys` key ids to AES keys (or None), `zstd` is\n"
"(BufferWithSegments, ZstdError). (A plain queue's batches: chronq._native.read_payloads.)\n"
"Returns (pending, nbytes, error): the documents read but not decoded, in order after those in `out`\n"
"(the first frame that is not a plain, zstd or AES-GCM frame of a known dictionary and key, or is\n"
"damaged, and the rest of its zstd run; empty when all were decoded), the plain bytes read (those of a\n"
"run handed back included), and None, or the exception the tailer raised when it could not read on\n"
"(the documents read before it are in `out` and `pending`).");

static PyObject *read_frames(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "read_frames takes 9 arguments");
        return NULL;
    }
    PyObject *tailer = args[1], *out = args[2], *dctxs = args[6], *keys = args[7], *zstd = args[8];
    DocumentSource *src = PyCapsule_GetPointer(args[0], DOCUMENT_SOURCE_CAPSULE);
    if (!src) return NULL;
    if (src->version != DOCUMENT_SOURCE_VERSION) {
        PyErr_SetString(PyExc_TypeError, "read_frames: unknown document source version");
        return NULL;
    }
    Py_ssize_t max_count = PyLong_AsSsize_t(args[3]);
    long long max_bytes = PyLong_AsLongLong(args[4]);
    long long max_size = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (max_size < 0) {
        PyErr_SetString(PyExc_ValueError, "read_frames: max_size must be >= 0");
        return NULL;
    }
    if (!PyList_Check(out) || !PyDict_Check(dctxs) || (keys != Py_None && !PyDict_Check(keys)) ||
        !PyTuple_Check(zstd) || PyTuple_GET_SIZE(zstd) != 2) {
        PyErr_SetString(PyExc_TypeError, "read_frames: out is a list, dctxs and keys dicts, zstd a pair");
        return NULL;
    }
    PyObject *pending = PyList_New(0);
    if (!pending) return NULL;
    Run run;
    memset(&run, 0, sizeof run);
#ifdef CHRONQ_OPENSSL
    EVP_CIPHER_CTX *ctx = NULL;
    PyObject *ctx_key = NULL; /* the key ctx was set up with, compared by identity */
#endif
    long long bytes = 0;
    PyObject *error = NULL; /* what the tailer's read raised */
    for (Py_ssize_t i = 0; i < max_count && bytes < max_bytes; i++) {
        const char *doc;
        Py_ssize_t len;
        int metadata;
        int64_t index;
        PyObject *ex = src->read(tailer, &doc, &len, &metadata, &index);
        if (!ex) {
            /* the tailer could not read on: what was read before is decoded and returned with the error */
            error = take_error();
            break;
        }
        if (ex == Py_None) {
            Py_DECREF(ex);
            break;
        }
        const unsigned char *d = (const unsigned char *)doc;
        PyObject *msg = NULL;
        int cid = -1;
        uint32_t n = 0;
        long long plain = 0; /* bytes this document adds to out */
        if (d && metadata == 0 && len >= HEAD && d[0] == MAGIC0 && d[1] == MAGIC1 && d[2] == VERSION &&
            (n = ld32(d + 8)) <= (unsigned long long)max_size) {
            cid = d[3];
            plain = n;
        }
#ifdef CHRONQ_OPENSSL
        /* the key of an AES-GCM frame (ctx set up with it), or NULL: not given, or not in the ring */
        PyObject *key = NULL;
        if ((cid & 0xF0) == CID_AES && keys != Py_None && len >= KEYED + TAG) {
            PyObject *kid = PyLong_FromUnsignedLong(ld32(d + 12));
            if (!kid) goto fail_ex;
            key = PyDict_GetItemWithError(keys, kid);
            Py_DECREF(kid);
            if (!key && PyErr_Occurred()) goto fail_ex;
            if (key && key != ctx_key) {
                EVP_CIPHER_CTX_free(ctx);
                Py_CLEAR(ctx_key);
                if (!(ctx = gcm_context(key, 0))) goto fail_ex;
                ctx_key = Py_NewRef(key);
            }
        }
#endif
        if (cid == 0 && len - HEAD == (Py_ssize_t)n) {
            msg = PyBytes_FromStringAndSize(doc + HEAD, len - HEAD);
            if (!msg) goto fail_ex;
        } else if ((cid & 0xF) == CID_ZSTD && n > 0) {
            /* zstd, or zstd then AES-GCM: the compressed body joins the run of its dictionary */
            uint32_t did = ld32(d + 4);
            if (run.count && run.dict_id != did) {
                int f = run_flush(&run, zstd, out, pending);
                if (f < 0) goto fail_ex;
                if (f == 0) goto stop;
            }
            if (!run.count) {
                PyObject *k = PyLong_FromUnsignedLong(did);
                if (!k) goto fail_ex;
                Py_XSETREF(run.dctx, Py_XNewRef(PyDict_GetItemWithError(dctxs, k)));
                Py_DECREF(k);
                if (!run.dctx && PyErr_Occurred()) goto fail_ex;
                run.dict_id = did;
            }
            int taken = 0;
            if (run.dctx && cid == CID_ZSTD) {
                if (run_add(&run, ex, d + HEAD, len - HEAD, n, NULL) < 0) goto fail_ex;
                taken = 1;
            }
#ifdef CHRONQ_OPENSSL
            else if (run.dctx && cid == (CID_ZSTD | CID_AES) && key) {
                unsigned char *dst;
                if (run_add(&run, ex, NULL, len - KEYED - TAG, n, &dst) < 0) goto fail_ex;
                if (gcm_open(ctx, d, len, dst) == 0)
                    taken = 1;
                else if (run_pop(&run) < 0)
                    goto fail_ex;
            }
#endif
            if (taken) {
                Py_DECREF(ex);
                bytes += plain;
                continue;
            }
        }
#ifdef CHRONQ_OPENSSL
        else if (cid == CID_AES && key && len - KEYED - TAG == (Py_ssize_t)n) {
            msg = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
            if (!msg) goto fail_ex;
            if (gcm_open(ctx, d, len, (unsigned char *)PyBytes_AS_STRING(msg)) < 0) Py_CLEAR(msg);
        }
#endif
        /* a decoded document goes after the run read before it, an undecoded one stops the batch */
        int f = run_flush(&run, zstd, out, pending);
        if (f < 0) {
            Py_XDECREF(msg);
            goto fail_ex;
        }
        if (f == 0 || !msg) {
            Py_XDECREF(msg);
            goto stop;
        }
        int app = PyList_Append(out, msg);
        Py_DECREF(msg);
        Py_DECREF(ex);
        if (app < 0) goto fail;
        bytes += plain;
        continue;
    stop:
        if (PyList_Append(pending, ex) < 0) goto fail_ex;
        Py_DECREF(ex);
        goto done;
    fail_ex:
        Py_DECREF(ex);
        goto fail;
    }
    if (run_flush(&run, zstd, out, pending) < 0) goto fail;
done:
    run_free(&run);
#ifdef CHRONQ_OPENSSL
    EVP_CIPHER_CTX_free(ctx);
    Py_XDECREF(ctx_key);
#endif
    return Py_BuildValue("(NLN)", pending, bytes, error ? error : Py_NewRef(Py_None));
fail:
    run_free(&run);
#ifdef CHRONQ_OPENSSL
    EVP_CIPHER_CTX_free(ctx);
    Py_XDECREF(ctx_key);
#endif
    Py_XDECREF(error);
    Py_DECREF(pending);
    return NULL;
}

/* ---- replication datagrams ------------------------------------------------------------------------ */
/* chronq/replication/_udp.py's datagrams: version (1) | sequence (8) | first index (8) | documents (4) | the
 * run's documents | AES-GCM tag (16), big-endian, the nonce 4 zero bytes and the sequence number; the tag
 * over everything before it (documents in clear) or, `encrypt`, over the head with the documents encrypted.
 * A run's documents are each a big-endian word (bit 31 metadata, bits 0-29 the body's length) and a body. */
#define DG_VERSION 1
#define DG_HEAD 21
#define DG_MIN (DG_HEAD + 4 + TAG)
#define DG_BATCH 64 /* datagrams per sendmmsg/recvmmsg call */

static uint64_t ld_be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | p[i];
    return v;
}

static void st_be64(unsigned char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}

static uint32_t ld_be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The documents of the run p[0, len): their number and data documents; -1 if a word or body leaves it. */
static Py_ssize_t dg_walk(const unsigned char *p, Py_ssize_t len, Py_ssize_t *data) {
    Py_ssize_t n = 0, at = 0;
    *data = 0;
    while (at < len) {
        if (len - at < 4) return -1;
        uint32_t w = ld_be32(p + at);
        Py_ssize_t body = (Py_ssize_t)(w & 0x3FFFFFFFu);
        if ((w & 0x40000000u) || body > len - at - 4) return -1;
        if (!(w & 0x80000000u)) (*data)++;
        at += 4 + body;
        n++;
    }
    return n;
}

#ifdef CHRONQ_OPENSSL
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103 /* Linux 4.18's; older headers lack it */
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif

static void dg_nonce(unsigned char nonce[12], uint64_t seq) {
    memset(nonce, 0, 4);
    st_be64(nonce + 4, seq);
}

/* Seal the datagram d[0, len) whose tag goes at d + len: see above. 0, or -1. */
static int dg_seal(EVP_CIPHER_CTX *ctx, unsigned char *d, Py_ssize_t len, int encrypt) {
    unsigned char nonce[12];
    int outl = 0;
    dg_nonce(nonce, ld_be64(d + 1));
    if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1) return -1;
    Py_ssize_t aad = encrypt ? DG_HEAD : len;
    if (EVP_EncryptUpdate(ctx, NULL, &outl, d, (int)aad) != 1) return -1;
    if (encrypt && gcm_update(ctx, 1, d + DG_HEAD, d + DG_HEAD, len - DG_HEAD) < 0) return -1;
    if (EVP_EncryptFinal_ex(ctx, d + len, &outl) != 1 || outl != 0) return -1;
    return EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG, d + len) == 1 ? 0 : -1;
}

/* Check the datagram d[0, n) (its tag the last 16 bytes) and put its documents, decrypted with `encrypt`,
 * at out (n - DG_HEAD - TAG bytes). 0, or -1 when the tag does not match. */
static int dg_open(EVP_CIPHER_CTX *ctx, const unsigned char *d, Py_ssize_t n, int encrypt, unsigned char *out) {
    unsigned char nonce[12];
    int outl = 0;
    Py_ssize_t body = n - DG_HEAD - TAG;
    dg_nonce(nonce, ld_be64(d + 1));
    if (EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce) != 1) return -1;
    if (EVP_DecryptUpdate(ctx, NULL, &outl, d, (int)(encrypt ? DG_HEAD : n - TAG)) != 1) return -1;
    if (encrypt) {
        if (gcm_update(ctx, 0, out, d + DG_HEAD, body) < 0) return -1;
    }
    if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG, (void *)(d + n - TAG)) != 1) return -1;
    if (EVP_DecryptFinal_ex(ctx, out + body, &outl) != 1) return -1;
    if (!encrypt && out != d + DG_HEAD) memmove(out, d + DG_HEAD, (size_t)body);
    return 0;
}

/* Send the n datagrams of iov through the connected socket fd, without the GIL, up to DG_BATCH messages per
 * sendmmsg. Consecutive datagrams of one length (and a shorter one after them) go as one message with UDP
 * generic segmentation offload (UDP_SEGMENT: the kernel cuts it into the same datagrams, for a fraction of
 * the cost of a send each); where the socket's path refuses it, one message per datagram. A message
 * refused for a reason in `skip` (ECONNREFUSED: nothing listens there, from an ICMP error of an earlier
 * send; any error when `lenient`) is left out (its sink asks for its datagrams again). 0, or -1 with errno. */
#define DG_GSO_SEGMENTS 64
#define DG_GSO_BYTES 65000
static int dg_send(int fd, struct iovec *iov, Py_ssize_t n, int lenient) {
    struct mmsghdr msgs[DG_BATCH];
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } ctl[DG_BATCH];
    Py_ssize_t starts[DG_BATCH + 1];
    int gso = 1;
    Py_ssize_t i = 0;
    while (i < n) {
        /* the next messages, from datagram i on */
        int k = 0;
        Py_ssize_t at = i;
        memset(msgs, 0, sizeof msgs);
        while (k < DG_BATCH && at < n) {
            Py_ssize_t j = at + 1;
            size_t seg = iov[at].iov_len, total = seg;
            if (gso) {
                while (j < n && j - at < DG_GSO_SEGMENTS && total + iov[j].iov_len <= DG_GSO_BYTES &&
                       iov[j].iov_len <= seg) {
                    total += iov[j].iov_len;
                    if (iov[j++].iov_len < seg) break; /* a shorter one ends the message */
                }
            }
            starts[k] = at;
            msgs[k].msg_hdr.msg_iov = &iov[at];
            msgs[k].msg_hdr.msg_iovlen = (size_t)(j - at);
            if (j - at > 1) {
                msgs[k].msg_hdr.msg_control = ctl[k].buf;
                msgs[k].msg_hdr.msg_controllen = sizeof ctl[k].buf;
                struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[k].msg_hdr);
                c->cmsg_level = SOL_UDP;
                c->cmsg_type = UDP_SEGMENT;
                c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t s16 = (uint16_t)seg;
                memcpy(CMSG_DATA(c), &s16, sizeof s16);
            }
            at = j;
            k++;
        }
        starts[k] = at;
        int m = 0;
        while (m < k) {
            int r = sendmmsg(fd, msgs + m, (unsigned)(k - m), 0);
            if (r > 0)
                m += r;
            else if (r < 0 && errno == EINTR)
                continue;
            else if (r < 0 && msgs[m].msg_hdr.msg_iovlen > 1 &&
                     (errno == EIO || errno == EINVAL || errno == ENOPROTOOPT || errno == EOPNOTSUPP)) {
                gso = 0; /* this path takes no segmentation offload: a message per datagram from here */
                break;
            } else if (r < 0 && (errno == ECONNREFUSED || lenient))
                m++;
            else
                return -1;
        }
        i = starts[m];
    }
    return 0;
}
#endif

PyDoc_STRVAR(seal_datagrams_doc,
"seal_datagrams(key, encrypt, buf, size, ends, seq, first, fd, lenient, in_place=False, /)\n--\n\n"
"Seals the runs chronq._native.read_runs put in the slots of `buf` (slot k at k * size, its documents from\n"
"21 bytes on to ends[k]) as datagrams numbered seq, seq + 1, ..., the first index of the first `first`\n"
"(each next one's the index after the data documents before it), under the 32-byte `key`, and sends them\n"
"to the connected UDP socket `fd` with sendmmsg (none when fd is -1), the GIL released. A datagram the\n"
"socket refuses with ECONNREFUSED (or any error, `lenient`) is left out; another error is raised\n"
"(OSError). Returns ([(datagram, documents), ...], their bytes). `in_place`: each datagram is sealed in its\n"
"slot (its tag after its documents: ends[k] + 16 within the slot) and is a memoryview of `buf` there, not\n"
"a copy (valid until `buf` is used again).");

static PyObject *seal_datagrams(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 && nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "seal_datagrams takes 9 or 10 arguments");
        return NULL;
    }
#ifndef CHRONQ_OPENSSL
    PyErr_SetString(PyExc_NotImplementedError, "chronq._codecs was built without OpenSSL");
    return NULL;
#else
    PyObject *key = args[0], *ends = args[4];
    int encrypt = PyObject_IsTrue(args[1]);
    Py_ssize_t size = PyLong_AsSsize_t(args[3]);
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[5]);
    long long first = PyLong_AsLongLong(args[6]);
    int fd = PyLong_AsLong(args[7]);
    int lenient = PyObject_IsTrue(args[8]);
    int in_place = nargs > 9 ? PyObject_IsTrue(args[9]) : 0;
    if (encrypt < 0 || lenient < 0 || in_place < 0 || PyErr_Occurred()) return NULL;
    if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) != 32 || !PyList_Check(ends)) {
        PyErr_SetString(PyExc_TypeError, "seal_datagrams: a 32-byte key and a list of ends");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(ends);
    if (size < DG_HEAD || first < 0 || seq + (unsigned long long)n >= (1ull << 63)) {
        PyErr_SetString(PyExc_ValueError, "seal_datagrams: slot size, first index or sequence out of range");
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[2], &b, in_place ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = NULL, *items = PyList_New(n), *view = NULL;
    struct iovec *iov = PyMem_Calloc((size_t)(n ? n : 1), sizeof *iov);
    EVP_CIPHER_CTX *ctx = NULL;
    long long nbytes = 0;
    if (!items || !iov) {
        PyErr_NoMemory();
        goto done;
    }
    if (!(ctx = gcm_context(key, 1))) goto done;
    if (in_place && !(view = PyMemoryView_FromObject(args[2]))) goto done;
    /* every datagram checked and its bytes object made with the GIL, sealed and sent without it */
    long long index = first;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t end = PyLong_AsSsize_t(PyList_GET_ITEM(ends, k)), data, docs = -1;
        if (end == -1 && PyErr_Occurred()) goto done;
        const unsigned char *slot = (const unsigned char *)b.buf + k * size;
        if (k * size + size <= b.len && end >= k * size + DG_HEAD && end <= k * size + size - TAG)
            docs = dg_walk(slot + DG_HEAD, end - k * size - DG_HEAD, &data);
        if (docs < 1) {
            PyErr_Format(PyExc_ValueError, "seal_datagrams: slot %zd holds no run (end %zd)", k, end);
            goto done;
        }
        Py_ssize_t len = end - k * size;
        PyObject *dg;
        unsigned char *d;
        if (view) { /* sealed where it is: the tag fits in the slot (checked above) */
            PyObject *lo = PyLong_FromSsize_t(k * size), *hi = PyLong_FromSsize_t(end + TAG);
            PyObject *sl = lo && hi ? PySlice_New(lo, hi, NULL) : NULL;
            dg = sl ? PyObject_GetItem(view, sl) : NULL;
            Py_XDECREF(sl);
            Py_XDECREF(lo);
            Py_XDECREF(hi);
            if (!dg) goto done;
            d = (unsigned char *)b.buf + k * size;
        } else {
            if (!(dg = PyBytes_FromStringAndSize(NULL, len + TAG))) goto done;
            d = (unsigned char *)PyBytes_AS_STRING(dg);
            memcpy(d, slot, (size_t)len);
        }
        d[0] = DG_VERSION;
        st_be64(d + 1, seq + (unsigned long long)k);
        st_be64(d + 9, (uint64_t)index);
        d[17] = (unsigned char)(docs >> 24);
        d[18] = (unsigned char)(docs >> 16);
        d[19] = (unsigned char)(docs >> 8);
        d[20] = (unsigned char)docs;
        index += data;
        iov[k].iov_base = d;
        iov[k].iov_len = (size_t)(len + TAG);
        nbytes += len + TAG;
        PyObject *item = Py_BuildValue("(Nn)", dg, docs);
        if (!item) goto done;
        PyList_SET_ITEM(items, k, item);
    }
    int failed = 0, sent = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n && !failed; k++)
        failed = dg_seal(ctx, iov[k].iov_base, (Py_ssize_t)iov[k].iov_len - TAG, encrypt) < 0;
    if (!failed && fd >= 0) sent = dg_send(fd, iov, n, lenient);
    Py_END_ALLOW_THREADS
    if (failed)
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL AES-GCM encryption failed");
    else if (sent < 0)
        PyErr_SetFromErrno(PyExc_OSError);
    else
        out = Py_BuildValue("(OL)", items, nbytes);
done:
    EVP_CIPHER_CTX_free(ctx);
    PyMem_Free(iov);
    Py_XDECREF(items);
    Py_XDECREF(view);
    PyBuffer_Release(&b);
    return out;
#endif
}

PyDoc_STRVAR(open_datagrams_doc,
"open_datagrams(key, encrypt, fd, buf, slot, max_count, view_from=0, /)\n--\n\n"
"Takes up to `max_count` datagrams off the non-blocking UDP socket `fd` with recvmmsg (into the slots of\n"
"`buf`, `slot` bytes each) and checks each under the 32-byte `key` (None: a key not known yet, every\n"
"datagram discarded), the GIL released. Returns ([(sequence, first index, documents, data documents,\n"
"their bytes), ...] of the authentic ones, the datagrams taken, those dropped): a datagram shorter than\n"
"a head, a document word and a tag, of another version, truncated (longer than a slot), with a negative\n"
"first index or no documents, or whose tag fails is dropped. `data documents` is -1 when the documents'\n"
"words leave the datagram (the writer refuses such a run, naming it). The bytes of a datagram holding\n"
"`view_from` bytes of documents or more (0: none) are a memoryview of `buf` where they were opened, not a\n"
"copy: valid until `buf` is used again, so the call then takes no more than one recvmmsg's datagrams.");

#ifdef CHRONQ_OPENSSL
typedef struct {
    uint64_t seq;
    int64_t first;
    uint32_t count;
    Py_ssize_t data, len;
    int ok;
} DgIn;
#endif

static PyObject *open_datagrams(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "open_datagrams takes 6 or 7 arguments");
        return NULL;
    }
#ifndef CHRONQ_OPENSSL
    PyErr_SetString(PyExc_NotImplementedError, "chronq._codecs was built without OpenSSL");
    return NULL;
#else
    PyObject *key = args[0];
    int encrypt = PyObject_IsTrue(args[1]);
    int fd = PyLong_AsLong(args[2]);
    Py_ssize_t slot = PyLong_AsSsize_t(args[4]), max_count = PyLong_AsSsize_t(args[5]);
    Py_ssize_t view_from = nargs > 6 ? PyLong_AsSsize_t(args[6]) : 0;
    if (encrypt < 0 || PyErr_Occurred()) return NULL;
    if (key != Py_None && (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) != 32)) {
        PyErr_SetString(PyExc_TypeError, "open_datagrams: a 32-byte key or None");
        return NULL;
    }
    if (slot < DG_MIN || max_count < 0 || fd < 0 || view_from < 0) {
        PyErr_SetString(PyExc_ValueError, "open_datagrams: slot size, count or socket out of range");
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(args[3], &b, PyBUF_WRITABLE) < 0) return NULL;
    Py_ssize_t slots = b.len / slot;
    if (slots > DG_BATCH) slots = DG_BATCH;
    PyObject *res = NULL, *items = PyList_New(0), *view = NULL;
    EVP_CIPHER_CTX *ctx = NULL;
    if (view_from && !(view = PyMemoryView_FromObject(args[3]))) goto done;
    if (!items || slots < 1) {
        if (items) PyErr_SetString(PyExc_ValueError, "open_datagrams: the buffer holds no slot");
        goto done;
    }
    if (key != Py_None && !(ctx = gcm_context(key, 0))) goto done;
    Py_ssize_t taken = 0, dropped = 0;
    int viewed = 0; /* views of the slots handed out: no further recvmmsg into them */
    while (taken < max_count && !viewed) {
        int k = max_count - taken > slots ? (int)slots : (int)(max_count - taken), r;
        struct mmsghdr msgs[DG_BATCH];
        struct iovec iov[DG_BATCH];
        DgIn in[DG_BATCH];
        memset(msgs, 0, sizeof msgs[0] * (size_t)k);
        for (int j = 0; j < k; j++) {
            iov[j].iov_base = (unsigned char *)b.buf + j * slot;
            iov[j].iov_len = (size_t)slot;
            msgs[j].msg_hdr.msg_iov = &iov[j];
            msgs[j].msg_hdr.msg_iovlen = 1;
        }
        Py_BEGIN_ALLOW_THREADS
        do
            r = recvmmsg(fd, msgs, (unsigned)k, MSG_DONTWAIT, NULL);
        while (r < 0 && errno == EINTR);
        for (int j = 0; j < r; j++) {
            /* every bound checked before the tag: the head, a document word and the tag must fit */
            const unsigned char *d = iov[j].iov_base;
            Py_ssize_t n = (Py_ssize_t)msgs[j].msg_len;
            DgIn *x = &in[j];
            x->ok = 0;
            if (!ctx || (msgs[j].msg_hdr.msg_flags & MSG_TRUNC) || n < DG_MIN || n > slot || d[0] != DG_VERSION)
                continue;
            x->seq = ld_be64(d + 1);
            x->first = (int64_t)ld_be64(d + 9);
            x->count = ld_be32(d + 17);
            x->len = n - DG_HEAD - TAG;
            if (x->first < 0 || x->count < 1 || x->seq >= (1ull << 63)) continue;
            /* the documents opened in place, after the head */
            if (dg_open(ctx, d, n, encrypt, (unsigned char *)d + DG_HEAD) < 0) continue;
            Py_ssize_t docs = dg_walk(d + DG_HEAD, x->len, &x->data);
            if (docs != (Py_ssize_t)x->count) x->data = -1;
            x->ok = 1;
        }
        Py_END_ALLOW_THREADS
        if (r <= 0) break; /* nothing more now (EAGAIN), or an error the next poll's recvmmsg reports again */
        taken += r;
        for (int j = 0; j < r; j++) {
            DgIn *x = &in[j];
            if (!ctx) continue;
            if (!x->ok) {
                dropped++;
                continue;
            }
            Py_ssize_t at = (const unsigned char *)iov[j].iov_base + DG_HEAD - (const unsigned char *)b.buf;
            PyObject *docs;
            if (view && x->len >= view_from) { /* a view of the documents where they were opened */
                viewed = 1;
                PyObject *lo = PyLong_FromSsize_t(at), *hi = PyLong_FromSsize_t(at + x->len);
                PyObject *sl = lo && hi ? PySlice_New(lo, hi, NULL) : NULL;
                docs = sl ? PyObject_GetItem(view, sl) : NULL;
                Py_XDECREF(sl);
                Py_XDECREF(lo);
                Py_XDECREF(hi);
            } else
                docs = PyBytes_FromStringAndSize((const char *)b.buf + at, x->len);
            PyObject *item = Py_BuildValue("(KLknN)", (unsigned long long)x->seq, (long long)x->first,
                                           (unsigned long)x->count, x->data, docs);
            if (!item || PyList_Append(items, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        }
        if (r < k) break;
    }
    res = Py_BuildValue("(Onn)", items, taken, dropped);
done:
    EVP_CIPHER_CTX_free(ctx);
    Py_XDECREF(items);
    Py_XDECREF(view);
    PyBuffer_Release(&b);
    return res;
#endif
}

static PyMethodDef codec_methods[] = {
    {"frame_many", (PyCFunction)(void (*)(void))frame_many, METH_FASTCALL, frame_many_doc},
    {"read_frames", (PyCFunction)(void (*)(void))read_frames, METH_FASTCALL, read_frames_doc},
    {"seal_datagrams", (PyCFunction)(void (*)(void))seal_datagrams, METH_FASTCALL, seal_datagrams_doc},
    {"open_datagrams", (PyCFunction)(void (*)(void))open_datagrams, METH_FASTCALL, open_datagrams_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT, "chronq._codecs", "Batch framing and unframing of codec payloads.", -1, codec_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__codecs(void) {
    PyObject *m = PyModule_Create(&codec_module);
    if (!m) return NULL;
#ifdef CHRONQ_OPENSSL
    PyObject *have = Py_True;
#else
    PyObject *have = Py_False;
#endif
    if (PyModule_AddObjectRef(m, "HAVE_AES", have) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
