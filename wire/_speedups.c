/*
 * wire._speedups: the hot loop of typed BINARY marshalling in C.
 *
 * wire/marshal.py stays the reference implementation. It compiles a per-class "plan" and hands the
 * common cases to this module:
 *   Plan.encode / encode_block     append an object's fields (int/float/str/bool/enum fast paths,
 *                                  every other value through the plan's Python writer),
 *   Plan.decode_fields / decode_object / decode / read
 *                                  read a block of fields whose names and value codes they know;
 *                                  anything unusual (unknown field, nested value, bad bytes) goes to
 *                                  the Python path, which decides and reports errors,
 *   generic(...)                   the generic value model (Reader.read_document / read_value of a
 *                                  block) for the common codes, with the same give-up rule.
 * Number rules are Java's compact BinaryWire rules (smallest exact code), mirrored from wire/binary.py.
 * Every read is bounds-checked against `end`; nothing here can read outside the buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_document_source.h"
#include <float.h>
#include <stddef.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { K_INT = 0, K_FLOAT = 1, K_STR = 2, K_BOOL = 3, K_ENUM = 4, K_OTHER = 5, K_FLOAT32 = 6 };

/* ------------------------------------------------------------------ output */
/* Bytes are gathered in a scratch buffer and appended to the caller's bytearray once (or before a
 * Python fallback writer appends to it directly). */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char inline_buf[512];
} Out;

static void out_init(Out *o) {
    o->data = o->inline_buf;
    o->len = 0;
    o->cap = (Py_ssize_t)sizeof(o->inline_buf);
}

static void out_free(Out *o) {
    if (o->data != o->inline_buf) PyMem_Free(o->data);
}

static __attribute__((noinline)) char *reserve_more(Out *o, Py_ssize_t n) {
    if (n < 0 || n > PY_SSIZE_T_MAX / 2 - o->len) {
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t cap = (o->len + n) * 2;
    char *data = PyMem_Malloc((size_t)cap);
    if (!data) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(data, o->data, (size_t)o->len);
    out_free(o);
    o->data = data;
    o->cap = cap;
    char *p = o->data + o->len;
    o->len += n;
    return p;
}

/* n more bytes at the end of o; the usual case (they fit) inline */
static inline __attribute__((always_inline)) char *reserve(Out *o, Py_ssize_t n) {
    if (n >= 0 && n <= o->cap - o->len) {
        char *p = o->data + o->len;
        o->len += n;
        return p;
    }
    return reserve_more(o, n);
}

static int flush(Out *o, PyObject *buf) {
    if (!o->len) return 0;
    Py_ssize_t old = PyByteArray_GET_SIZE(buf);
    if (PyByteArray_Resize(buf, old + o->len) < 0) return -1;
    memcpy(PyByteArray_AS_STRING(buf) + old, o->data, (size_t)o->len);
    o->len = 0;
    return 0;
}

static int put(Out *o, const void *data, Py_ssize_t n) {
    char *p = reserve(o, n);
    if (!p) return -1;
    memcpy(p, data, (size_t)n);
    return 0;
}

static int put_code_le(Out *o, unsigned char code, uint64_t v, int width) {
    char *p = reserve(o, 1 + width);
    if (!p) return -1;
    p[0] = (char)code;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p + 1, &v, (size_t)width); /* the low `width` bytes */
#else
    for (int i = 0; i < width; i++) p[1 + i] = (char)(unsigned char)(v >> (8 * i));
#endif
    return 0;
}

static int put_stop_bit(Out *o, unsigned char code, int64_t n) {
    unsigned char tmp[12];
    int len = 0;
    tmp[len++] = code;
    uint64_t u = n < 0 ? ~(uint64_t)n : (uint64_t)n;
    while (u > 0x7F) {
        tmp[len++] = (unsigned char)((u & 0x7F) | 0x80);
        u >>= 7;
    }
    if (n < 0) {
        tmp[len++] = (unsigned char)(u | 0x80);
        tmp[len++] = 0;
    } else {
        tmp[len++] = (unsigned char)u;
    }
    return put(o, tmp, len);
}

static int put_float32(Out *o, double d) {
    float f = (float)d;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return put_code_le(o, 0x90, bits, 4);
}

static int is_float32(double d) {
    if (isinf(d)) return 1;
    if (isnan(d) || fabs(d) > FLT_MAX) return 0;
    return (double)(float)d == d;
}

static int put_int(Out *o, int64_t v) {
    if (v >= 0) {
        if (v <= 0xFF) return put_code_le(o, 0xA1, (uint64_t)v, 1);
        if (v <= 0x7FFF) return put_code_le(o, 0xA5, (uint64_t)v, 2);
        if (v <= 0xFFFF) return put_code_le(o, 0xA2, (uint64_t)v, 2);
        if (v <= 0x7FFFFFFF) return put_code_le(o, 0xA6, (uint64_t)v, 4);
        if (v <= 0xFFFFFFFFLL) return put_code_le(o, 0xA3, (uint64_t)v, 4);
    } else {
        if (v >= -0x80) return put_code_le(o, 0xA4, (uint64_t)v, 1);
        if (v >= -0x8000) return put_code_le(o, 0xA5, (uint64_t)v, 2);
        if (v >= -0x80000000LL) return put_code_le(o, 0xA6, (uint64_t)v, 4);
    }
    /* Java: a long that a float32 holds exactly is written as FLOAT32 (Long.MAX_VALUE rounds to 2^63) */
    double f = (double)v;
    int exact = (f < 9223372036854775808.0 && (int64_t)f == v) || (v == INT64_MAX && f == 9223372036854775808.0);
    if (exact && is_float32(f)) return put_float32(o, f);
    return put_code_le(o, 0xA7, (uint64_t)v, 8);
}

static int put_float(Out *o, double d) {
    if (isfinite(d) && d == floor(d)) {
        if (d >= 0) {
            if (d <= 255) return put_code_le(o, 0xA1, (uint64_t)d, 1);
            if (d <= 65535) return put_code_le(o, 0xA2, (uint64_t)d, 2);
            if (is_float32(d)) return put_float32(o, d);
            if (d <= 4294967295.0) return put_code_le(o, 0xA3, (uint64_t)d, 4);
        } else {
            if (d >= -128) return put_code_le(o, 0xA4, (uint64_t)(int64_t)d, 1);
            if (d >= -32768) return put_code_le(o, 0xA5, (uint64_t)(int64_t)d, 2);
            if (is_float32(d)) return put_float32(o, d);
            if (d >= -2147483648.0) return put_code_le(o, 0xA6, (uint64_t)(int64_t)d, 4);
        }
        uint64_t bits;
        memcpy(&bits, &d, 8);
        return put_code_le(o, 0x91, bits, 8);
    }
    if (isfinite(d)) {
        double fl = floor(d * 1e6 + 0.5);
        if (fl / 1e6 == d && fl > -34359738368.0 && fl < 4398046511104.0) {
            int64_t l6 = (int64_t)fl;
            static const int codes[3] = {0x92, 0x94, 0x96};
            static const int64_t divs[3] = {10000, 100, 1};
            static const double scales[3] = {1e2, 1e4, 1e6};
            for (int i = 0; i < 3; i++) {
                if (l6 % divs[i]) continue;
                int64_t v = l6 / divs[i];
                if ((double)v / scales[i] == d) return put_stop_bit(o, (unsigned char)codes[i], v);
            }
        }
    }
    if (is_float32(d) || isnan(d)) return put_float32(o, d);
    uint64_t bits;
    memcpy(&bits, &d, 8);
    return put_code_le(o, 0x91, bits, 8);
}

/* Java's compact writeNumber(float): the value is rounded to float32 first (beyond its range: inf). */
static int put_float32_compact(Out *o, double d) {
    double f = isfinite(d) ? (double)(float)d : d;
    if (isfinite(f) && f == floor(f)) {
        if (f >= 0) {
            if (f <= 255) return put_code_le(o, 0xA1, (uint64_t)f, 1);
            if (f <= 65535) return put_code_le(o, 0xA2, (uint64_t)f, 2);
        } else {
            if (f >= -128) return put_code_le(o, 0xA4, (uint64_t)(int64_t)f, 1);
            if (f >= -32768) return put_code_le(o, 0xA5, (uint64_t)(int64_t)f, 2);
        }
    } else if (isfinite(f)) {
        double fl = floor(f * 1e6 + 0.5);
        if ((double)(float)(fl / 1e6) == f && fl > -16384.0 && fl < 2097152.0) {
            int64_t l6 = (int64_t)fl;
            static const int codes[3] = {0x92, 0x94, 0x96};
            static const int64_t divs[3] = {10000, 100, 1};
            static const double scales[3] = {1e2, 1e4, 1e6};
            for (int i = 0; i < 3; i++) {
                if (l6 % divs[i]) continue;
                int64_t v = l6 / divs[i];
                if ((double)(float)((double)v / scales[i]) == f) return put_stop_bit(o, (unsigned char)codes[i], v);
            }
        }
    }
    return put_float32(o, f);
}

/* 1 = written, 0 = not a simple string (caller falls back to Python), -1 = error */
static int put_str(Out *o, PyObject *s) {
    if (!PyUnicode_CheckExact(s)) return 0;
    const char *data;
    Py_ssize_t n;
    if (PyUnicode_IS_ASCII(s)) {
        data = (const char *)PyUnicode_DATA(s);
        n = PyUnicode_GET_LENGTH(s);
    } else {
        if (PyUnicode_MAX_CHAR_VALUE(s) > 0xFFFF) return 0; /* CESU-8 surrogate pairs: Python */
        data = PyUnicode_AsUTF8AndSize(s, &n);
        if (!data) { /* lone surrogates: Python's surrogatepass */
            PyErr_Clear();
            return 0;
        }
    }
    if (n < 32) {
        char *p = reserve(o, 1 + n);
        if (!p) return -1;
        p[0] = (char)(0xE0 + n);
        memcpy(p + 1, data, (size_t)n);
    } else {
        if (put_stop_bit(o, 0xB8, n) < 0) return -1;
        if (put(o, data, n) < 0) return -1;
    }
    return 1;
}

/* ------------------------------------------------------------------ input */
typedef struct {
    const unsigned char *p;
    Py_ssize_t pos, end;
} In;

#define HOT static inline __attribute__((always_inline))

HOT int need(In *in, Py_ssize_t n) { return n >= 0 && in->end - in->pos >= n; }

/* A little-endian unsigned integer of `width` (1, 2, 4 or 8) bytes; one load on little-endian hosts. */
static inline uint64_t le(const unsigned char *p, int width) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (width == 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    if (width == 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    if (width == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
#endif
    uint64_t v = 0;
    for (int i = 0; i < width; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* 1 ok, 0 give up */
HOT int read_stop_bit(In *in, int64_t *out) {
    uint64_t v = 0;
    int shift = 0;
    for (;;) {
        if (!need(in, 1) || shift > 63) return 0;
        unsigned b = in->p[in->pos++];
        if (b < 0x80) {
            if (shift && b == 0) v = ~v;
            else v |= (uint64_t)b << shift;
            *out = (int64_t)v;
            return 1;
        }
        v |= (uint64_t)(b & 0x7F) << shift;
        shift += 7;
    }
}

static void skip_padding(In *in) {
    while (in->pos < in->end) {
        unsigned c = in->p[in->pos];
        if (c == 0x8F) {
            in->pos++;
        } else if (c == 0x8E && need(in, 5)) {
            uint64_t n = le(in->p + in->pos + 1, 4);
            if ((uint64_t)(in->end - in->pos - 5) < n) return; /* let Python report it */
            in->pos += 5 + (Py_ssize_t)n;
        } else {
            return;
        }
    }
}

/* skip_padding where padding is rare: one compare when there is none */
static inline void skip_pad(In *in) {
    if (in->pos < in->end && (in->p[in->pos] & 0xFE) == 0x8E) skip_padding(in);
}

/* A numeric value as int (is_int) or double; 1 ok, 0 give up. */
HOT int read_number(In *in, int *is_int, int64_t *iv, double *dv) {
    if (!need(in, 1)) return 0;
    unsigned c = in->p[in->pos++];
    const unsigned char *q = in->p + in->pos;
    *is_int = 1;
    if (c < 0x80) { *iv = c; return 1; }
    switch (c) {
    case 0xA1: case 0xA8: if (!need(in, 1)) return 0; *iv = q[0]; in->pos += 1; return 1;
    case 0xA2: case 0xA9: if (!need(in, 2)) return 0; *iv = (int64_t)le(q, 2); in->pos += 2; return 1;
    case 0xA3: if (!need(in, 4)) return 0; *iv = (int64_t)le(q, 4); in->pos += 4; return 1;
    case 0xA4: if (!need(in, 1)) return 0; *iv = (int8_t)q[0]; in->pos += 1; return 1;
    case 0xA5: if (!need(in, 2)) return 0; *iv = (int16_t)le(q, 2); in->pos += 2; return 1;
    case 0xA6: if (!need(in, 4)) return 0; *iv = (int32_t)le(q, 4); in->pos += 4; return 1;
    case 0xA7: if (!need(in, 8)) return 0; *iv = (int64_t)le(q, 8); in->pos += 8; return 1;
    case 0xB0: *iv = 0; return 1;
    case 0xB1: *iv = 1; return 1;
    }
    *is_int = 0;
    switch (c) {
    case 0x90: {
        if (!need(in, 4)) return 0;
        uint32_t bits = (uint32_t)le(q, 4);
        float f;
        memcpy(&f, &bits, 4);
        *dv = f;
        in->pos += 4;
        return 1;
    }
    case 0x91: {
        if (!need(in, 8)) return 0;
        uint64_t bits = le(q, 8);
        memcpy(dv, &bits, 8);
        in->pos += 8;
        return 1;
    }
    case 0x92: case 0x94: case 0x96: {
        int64_t v;
        if (!read_stop_bit(in, &v)) return 0;
        *dv = (double)v / (c == 0x92 ? 1e2 : c == 0x94 ? 1e4 : 1e6);
        return 1;
    }
    }
    return 0;
}

/* ------------------------------------------------------------------ Plan */
/* A per-class plan, compiled once by wire/marshal.py: for each field its encoded key, attribute,
 * kind, enum type and members, and the Python writer used for anything the fast paths skip. */
typedef struct {
    PyObject *key;      /* bytes: the field's key as written (FIELD_NAMEn + name, or FIELD_NUMBER...) */
    PyObject *attr;     /* str: attribute to read when encoding */
    int kind;           /* K_* */
    PyObject *type;     /* the enum class for K_ENUM */
    PyObject *fallback; /* callable(buf, value) writing any value of the declared type */
    PyObject *members;  /* K_ENUM: tuple of (name: bytes, member) */
    Py_ssize_t offset;  /* > 0: the attribute is this slot of a `cls` instance (see slots_valid) */
    PyObject *last;     /* K_STR: the last short ASCII text read, reused when the same bytes come again
                         * (symbols, names and codes repeat; a str costs an allocation) */
    const char *kp;     /* key's bytes and length, read without touching the bytes object on each scan */
    Py_ssize_t kn;
} Field;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    int decodable; /* every field has a short name and a scalar kind */
    int arguments; /* a method's arguments, not a class: 1 one bare value, 2 a sequence of values */
    int positional; /* cls(*values) means cls(**fields): calls without keywords are about 2x cheaper */
    int msgpack;    /* the plan reads and writes msgspec's MessagePack (WireType.MSGSPEC), not BINARY */
    unsigned int version; /* cls's type version when the slot offsets were taken; 0: none */
    PyObject *cls;
    PyObject *kwnames;
    PyObject *fallback;      /* callable(data) for Plan.decode when the fast path gives up */
    PyObject *read_fallback; /* callable(reader) for Plan.read when the fast path gives up */
    Field *fields;
} Plan;

static PyObject *str_name, *str_buf, *str_pos, *str_end, *str_metadata;

/* Plans reference classes and Python writers that may reference the plan again: GC-tracked. */
static int plan_traverse(Plan *self, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; self->fields && i < self->n; i++) {
        Field *f = &self->fields[i];
        Py_VISIT(f->key);
        Py_VISIT(f->attr);
        Py_VISIT(f->type);
        Py_VISIT(f->fallback);
        Py_VISIT(f->members);
        Py_VISIT(f->last);
    }
    Py_VISIT(self->cls);
    Py_VISIT(self->kwnames);
    Py_VISIT(self->fallback);
    Py_VISIT(self->read_fallback);
    return 0;
}

static int plan_clear(Plan *self) {
    for (Py_ssize_t i = 0; self->fields && i < self->n; i++) {
        Field *f = &self->fields[i];
        Py_CLEAR(f->key);
        Py_CLEAR(f->attr);
        Py_CLEAR(f->type);
        Py_CLEAR(f->fallback);
        Py_CLEAR(f->members);
        Py_CLEAR(f->last);
    }
    self->n = 0; /* a cleared plan encodes and decodes nothing */
    self->decodable = 0;
    Py_CLEAR(self->cls);
    Py_CLEAR(self->kwnames);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->read_fallback);
    return 0;
}

static void plan_dealloc(Plan *self) {
    PyObject_GC_UnTrack(self);
    plan_clear(self);
    PyMem_Free(self->fields);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define MAX_FIELDS 64

/* Fields stored in slots (msgspec Structs, slotted attrs classes and dataclasses) are read straight
 * from the instance when encoding an object of exactly `cls`: the generic attribute lookup is a
 * quarter of the encode time. The offsets hold only while cls and its bases are unchanged, which
 * the type's version tag tells (any change to a class dict in the MRO gives it a new one). */
static int find_slots(Plan *self) {
    PyTypeObject *cls = (PyTypeObject *)self->cls;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        PyObject *d = PyObject_GetAttr(self->cls, self->fields[i].attr); /* also assigns a version */
        if (!d) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
            PyErr_Clear();
            continue;
        }
        if (Py_IS_TYPE(d, &PyMemberDescr_Type) && PyType_IsSubtype(cls, PyDescr_TYPE(d))) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX && m->offset > 0) self->fields[i].offset = m->offset;
        }
        Py_DECREF(d);
    }
    if (PyType_HasFeature(cls, Py_TPFLAGS_VALID_VERSION_TAG)) self->version = cls->tp_version_tag;
    return 0;
}

static int slots_valid(Plan *plan, PyObject *obj) {
    PyTypeObject *tp = Py_TYPE(obj);
    return plan->version && (PyObject *)tp == plan->cls && PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) &&
           tp->tp_version_tag == plan->version && tp->tp_getattro == PyObject_GenericGetAttr;
}

/* Plan(entries, cls, kwnames, positional=False, arguments=0, msgpack=False): entries are (key, attr,
 * kind, type, fallback, members) tuples; `positional` when cls takes the field values in plan order
 * without keywords. A `msgpack` plan's keys are MessagePack str encodings and its enum members are
 * (value, member) pairs: msgspec writes enums by value. */
static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *entries, *cls, *kwnames;
    int positional = 0, arguments = 0, msgpack = 0;
    if (!PyArg_ParseTuple(args, "O!OO!|pip", &PyTuple_Type, &entries, &cls, &PyTuple_Type, &kwnames, &positional,
                          &arguments, &msgpack))
        return NULL;
    if (arguments < 0 || arguments > 2 || (arguments == 1 && PyTuple_GET_SIZE(entries) != 1) ||
        (msgpack && arguments)) {
        PyErr_SetString(PyExc_ValueError,
                        "arguments: 0 (a class), 1 (one bare value) or 2 (a sequence); a msgpack plan: 0");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(entries);
    if (PyTuple_GET_SIZE(kwnames) != n) {
        PyErr_SetString(PyExc_ValueError, "one keyword name per field is needed");
        return NULL;
    }
    Plan *self = (Plan *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->fields = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Field));
    if (!self->fields) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->n = n;
    self->cls = Py_NewRef(cls);
    self->kwnames = Py_NewRef(kwnames);
    self->decodable = n <= MAX_FIELDS;
    self->positional = positional;
    self->arguments = arguments;
    self->msgpack = msgpack;
    int slotted = PyType_Check(cls) && ((PyTypeObject *)cls)->tp_getattro == PyObject_GenericGetAttr;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyTuple_GET_ITEM(entries, i);
        Field *f = &self->fields[i];
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 6 || !PyBytes_Check(PyTuple_GET_ITEM(e, 0)) ||
            PyBytes_GET_SIZE(PyTuple_GET_ITEM(e, 0)) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(e, 1))) {
            PyErr_SetString(PyExc_TypeError, "bad plan entry");
            Py_DECREF(self);
            return NULL;
        }
        f->key = Py_NewRef(PyTuple_GET_ITEM(e, 0));
        f->kp = PyBytes_AS_STRING(f->key);
        f->kn = PyBytes_GET_SIZE(f->key);
        f->attr = Py_NewRef(PyTuple_GET_ITEM(e, 1));
        f->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(e, 2));
        f->type = Py_NewRef(PyTuple_GET_ITEM(e, 3));
        f->fallback = Py_NewRef(PyTuple_GET_ITEM(e, 4));
        f->members = Py_NewRef(PyTuple_GET_ITEM(e, 5));
        if (PyErr_Occurred()) {
            Py_DECREF(self);
            return NULL;
        }
        unsigned code = (unsigned char)PyBytes_AS_STRING(f->key)[0];
        if (f->kind < K_INT || f->kind > K_FLOAT32) {
            PyErr_SetString(PyExc_ValueError, "bad field kind");
            Py_DECREF(self);
            return NULL;
        }
        int key_ok = msgpack ? code >= 0xA0 && code < 0xC0 && f->kn == 1 + (code & 0x1F) /* a fixstr */
                             : code >= 0xC0 && code < 0xE0;                            /* FIELD_NAME0-31 */
        if (f->kind == K_OTHER || (msgpack && f->kind == K_FLOAT32) || !key_ok) self->decodable = 0;
        if (f->kind == K_ENUM) {
            int ok = PyTuple_Check(f->members);
            for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(f->members); k++) {
                PyObject *pair = PyTuple_GET_ITEM(f->members, k);
                ok = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 && PyBytes_Check(PyTuple_GET_ITEM(pair, 0));
            }
            if (!ok) self->decodable = 0;
        }
    }
    if (slotted && find_slots(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* ----- encoding */
/* The bytes the plan's enum table gives member x, found by identity (borrowed), or NULL: not in it
 * (aliases, a cleared plan) */
static PyObject *member_text(Field *f, PyObject *x) {
    if (!f->members || !PyTuple_Check(f->members)) return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(f->members); k++) {
        PyObject *pair = PyTuple_GET_ITEM(f->members, k);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || PyTuple_GET_ITEM(pair, 1) != x) continue;
        PyObject *name = PyTuple_GET_ITEM(pair, 0);
        return PyBytes_Check(name) ? name : NULL;
    }
    return NULL;
}

/* A member of the field's enum written from the plan's (name, member) table: 1 handled (*rc the
 * put result), 0 not in the table. */
static int enum_name(Out *o, Field *f, PyObject *x, int *rc) {
    PyObject *name = member_text(f, x);
    if (name) {
        Py_ssize_t n = PyBytes_GET_SIZE(name);
        if (n >= 32) return 0;
        char *p = reserve(o, 1 + n);
        *rc = p ? 0 : -1;
        if (p) {
            p[0] = (char)(0xE0 + n);
            memcpy(p + 1, PyBytes_AS_STRING(name), (size_t)n);
        }
        return 1;
    }
    return 0;
}

/* flush, making the bytearray from the scratch bytes when there is none yet */
static int flush_to(Out *o, PyObject **buf) {
    if (*buf) return flush(o, *buf);
    *buf = PyByteArray_FromStringAndSize(o->data, o->len);
    o->len = 0;
    return *buf ? 0 : -1;
}

/* A value of a kind the C plans write (K_INT, K_FLOAT, K_STR, K_BOOL) written as the Python writer of
 * that declared type writes it: 1 written, 0 not this path's (another type, an int beyond 64 bits,
 * text the Python path must write), -1 error. */
static int put_scalar(Out *o, int kind, PyObject *x) {
    if (kind == K_INT && PyLong_CheckExact(x)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        return put_int(o, (int64_t)v) < 0 ? -1 : 1;
    }
    if (kind == K_FLOAT && PyFloat_CheckExact(x)) return put_float(o, PyFloat_AS_DOUBLE(x)) < 0 ? -1 : 1;
    if (kind == K_STR) return put_str(o, x);
    if (kind == K_BOOL && (x == Py_True || x == Py_False)) return put(o, x == Py_True ? "\xb1" : "\xb0", 1) < 0 ? -1 : 1;
    return 0;
}

static int write_fields(Out *o, Plan *plan, PyObject **buf, PyObject *obj) {
    int slots = slots_valid(plan, obj);
    for (Py_ssize_t i = 0; i < plan->n; i++) {
        Field *f = &plan->fields[i];
        if (put(o, PyBytes_AS_STRING(f->key), PyBytes_GET_SIZE(f->key)) < 0) return -1;
        PyObject *x = slots && f->offset > 0 ? *(PyObject **)((char *)obj + f->offset) : NULL;
        if (x) Py_INCREF(x);
        else x = PyObject_GetAttr(obj, f->attr); /* also an unset slot's AttributeError */
        if (!x) return -1;
        int done = 0, rc = 0;
        if (f->kind == K_INT || f->kind == K_FLOAT || f->kind == K_STR || f->kind == K_BOOL) {
            rc = put_scalar(o, f->kind, x);
            done = rc > 0;
        } else if (f->kind == K_FLOAT32 && PyFloat_CheckExact(x)) {
            rc = put_float32_compact(o, PyFloat_AS_DOUBLE(x));
            done = 1;
        } else if (f->kind == K_ENUM && (PyObject *)Py_TYPE(x) == f->type && enum_name(o, f, x, &rc)) {
            done = 1;
        } else if (f->kind == K_ENUM && (PyObject *)Py_TYPE(x) == f->type) {
            PyObject *name = PyObject_GetAttr(x, str_name);
            if (!name) {
                Py_DECREF(x);
                return -1;
            }
            rc = put_str(o, name);
            done = rc != 0;
            Py_DECREF(name);
        }
        if (rc < 0) {
            Py_DECREF(x);
            return -1;
        }
        if (!done) {
            PyObject *r = NULL;
            if (flush_to(o, buf) == 0) r = PyObject_CallFunctionObjArgs(f->fallback, *buf, x, NULL);
            if (!r) {
                Py_DECREF(x);
                return -1;
            }
            Py_DECREF(r);
        }
        Py_DECREF(x);
    }
    return 0;
}

/* encode(buf, obj) / encode_block(buf, obj): appends (block) `82 <u32 length>`, then obj's fields. */
static int binary_only(Plan *plan) {
    if (!plan->msgpack) return 0;
    PyErr_SetString(PyExc_TypeError, "a MessagePack plan writes no BINARY");
    return -1;
}

static PyObject *encode_common(Plan *plan, PyObject *const *args, Py_ssize_t nargs, int block) {
    if (binary_only(plan) < 0) return NULL;
    if (nargs != 2 || !PyByteArray_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "expected (bytearray, value)");
        return NULL;
    }
    PyObject *buf = args[0];
    Py_ssize_t base = PyByteArray_GET_SIZE(buf);
    Out o;
    out_init(&o);
    int rc = block ? put(&o, "\x82\0\0\0\0", 5) : 0;
    if (rc == 0) rc = write_fields(&o, plan, &buf, args[1]);
    if (rc == 0) rc = flush(&o, buf);
    out_free(&o);
    if (rc < 0) return NULL;
    if (block) {
        Py_ssize_t len = PyByteArray_GET_SIZE(buf) - base - 5;
        if (len < 0 || len > 0xFFFFFFFFLL) {
            PyErr_SetString(PyExc_ValueError, "marshallable too large for a 32-bit length");
            return NULL;
        }
        unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(buf) + base + 1;
        for (int i = 0; i < 4; i++) p[i] = (unsigned char)((uint64_t)len >> (8 * i));
    }
    Py_RETURN_NONE;
}

static PyObject *plan_block_bytes(Plan *plan, PyObject *prefix, PyObject *obj);

/* encode_document(prefix, obj) -> bytes: what a method writer sends for a one-argument call,
 * `prefix` (the event) then obj's block, built in one buffer. */
static PyObject *plan_encode_document(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "expected (bytes, value)");
        return NULL;
    }
    return plan_block_bytes(self, args[0], args[1]);
}

static PyObject *plan_encode(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    return encode_common(self, args, nargs, 0);
}

static PyObject *plan_encode_block(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    return encode_common(self, args, nargs, 1);
}

/* `prefix` (may be NULL) + obj's marshallable (`82 <u32 length>` + fields) as a new bytes object: built
 * in the scratch buffer and copied once, unless a Python writer had to run for some field (then
 * through a bytearray). */
static PyObject *plan_block_bytes(Plan *plan, PyObject *prefix, PyObject *obj) {
    if (binary_only(plan) < 0) return NULL;
    Out o;
    out_init(&o);
    PyObject *buf = NULL, *result = NULL;
    Py_ssize_t at = prefix ? PyBytes_GET_SIZE(prefix) : 0; /* where `82` goes */
    if ((!prefix || put(&o, PyBytes_AS_STRING(prefix), at) == 0) && put(&o, "\x82\0\0\0\0", 5) == 0 &&
        write_fields(&o, plan, &buf, obj) == 0 && (!buf || flush(&o, buf) == 0)) {
        char *data = buf ? PyByteArray_AS_STRING(buf) : o.data;
        Py_ssize_t size = buf ? PyByteArray_GET_SIZE(buf) : o.len, len = size - at - 5;
        if (len > 0xFFFFFFFFLL) {
            PyErr_SetString(PyExc_ValueError, "marshallable too large for a 32-bit length");
        } else {
            for (int i = 0; i < 4; i++) data[at + 1 + i] = (char)((uint64_t)len >> (8 * i));
            result = PyBytes_FromStringAndSize(data, size);
        }
    }
    Py_XDECREF(buf);
    out_free(&o);
    return result;
}

/* ----- decoding */
/* memcmp(...) == 0 for the short keys of a plan, without a library call or a byte loop: whole words,
 * the last one overlapping the one before (both sides hold n bytes) */
HOT int same(const char *a, const unsigned char *b, Py_ssize_t n) {
    if (n >= 8) {
        uint64_t x, y;
        for (Py_ssize_t i = 0; i + 8 < n; i += 8) {
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            if (x != y) return 0;
        }
        memcpy(&x, a + n - 8, 8);
        memcpy(&y, b + n - 8, 8);
        return x == y;
    }
    if (n >= 4) {
        uint32_t x, y, u, v;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        memcpy(&u, a + n - 4, 4);
        memcpy(&v, b + n - 4, 4);
        return x == y && u == v;
    }
    if (n >= 2) {
        uint16_t x, y, u, v;
        memcpy(&x, a, 2);
        memcpy(&y, b, 2);
        memcpy(&u, a + n - 2, 2);
        memcpy(&v, b + n - 2, 2);
        return x == y && u == v;
    }
    return n <= 0 || (unsigned char)a[0] == b[0];
}

/* A K_STR or K_ENUM field's value from its n UTF-8 bytes at s (new reference), or NULL with no
 * error set to give up: an enum constant not in the plan's table, bad or CESU-8 bytes. */
HOT PyObject *text_value(Field *f, const unsigned char *s, Py_ssize_t n) {
    if (f->kind == K_ENUM) {
        Py_ssize_t m = PyTuple_GET_SIZE(f->members);
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *pair = PyTuple_GET_ITEM(f->members, i);
            PyObject *name = PyTuple_GET_ITEM(pair, 0);
            if (PyBytes_GET_SIZE(name) == n && same(PyBytes_AS_STRING(name), s, n))
                return Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        }
        return NULL;
    }
    PyObject *last = f->last;
    if (last && PyUnicode_GET_LENGTH(last) == n && same(PyUnicode_DATA(last), s, n)) return Py_NewRef(last);
    PyObject *text = PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    if (!text) PyErr_Clear();
    else if (n < 32 && PyUnicode_IS_ASCII(text)) Py_XSETREF(f->last, Py_NewRef(text));
    return text;
}

/* The next value as a new reference of the field's kind, or NULL with no error set to give up. */
HOT PyObject *read_kind(In *in, Field *f) {
    skip_pad(in);
    if (!need(in, 1)) return NULL;
    unsigned c = in->p[in->pos];
    int kind = f->kind;
    if (kind == K_FLOAT32) kind = K_FLOAT; /* read back as a Python float, like the Python path */
    if (kind == K_INT || kind == K_FLOAT) {
        int is_int;
        int64_t iv = 0;
        double dv = 0;
        if (!read_number(in, &is_int, &iv, &dv)) return NULL;
        if (kind == K_FLOAT) return PyFloat_FromDouble(is_int ? (double)iv : dv);
        if (is_int) return PyLong_FromLongLong(iv);
        if (isnan(dv)) return NULL;
        if (dv >= 9223372036854775808.0) return PyLong_FromLongLong(INT64_MAX); /* Java (long) cast */
        if (dv <= -9223372036854775808.0) return PyLong_FromLongLong(INT64_MIN);
        return PyLong_FromLongLong((int64_t)dv);
    }
    if (kind == K_BOOL) {
        if (c == 0xB1) { in->pos++; Py_RETURN_TRUE; }
        if (c == 0xB0) { in->pos++; Py_RETURN_FALSE; }
        return NULL;
    }
    if (kind == K_STR || kind == K_ENUM) {
        Py_ssize_t n;
        in->pos++;
        if (c >= 0xE0) {
            n = c - 0xE0;
        } else if (c == 0xB8) {
            int64_t len;
            if (!read_stop_bit(in, &len) || len < 0) return NULL;
            n = (Py_ssize_t)len;
        } else {
            return NULL;
        }
        if (!need(in, n)) return NULL;
        in->pos += n;
        return text_value(f, in->p + in->pos - n, n);
    }
    return NULL;
}

/* Reads the fields in in->pos..in->end into vals[] (new references, NULL where absent).
 * Returns 1 on success, 0 to give up (the Python path re-reads and reports), -1 on a Python error. */
HOT int scan_fields_in(In *in, Plan *plan, PyObject **vals) {
    Py_ssize_t n = plan->n, expect = 0;
    /* The usual layout first: every field in declaration order, nothing between them. Anything else
       (padding, another order, a missing or unknown field) continues in the general loop below. */
    for (; expect < n; expect++) {
        Field *f = &plan->fields[expect];
        if (in->end - in->pos <= f->kn || !same(f->kp, in->p + in->pos, f->kn)) break;
        in->pos += f->kn;
        PyObject *value = read_kind(in, f);
        if (!value) return PyErr_Occurred() ? -1 : 0;
        vals[expect] = value; /* (each slot is still empty: this is the first value for it) */
    }
    if (expect == n) expect = 0;
    for (;;) {
        skip_pad(in);
        if (in->pos >= in->end) return 1;
        unsigned c = in->p[in->pos];
        if (c < 0xC0 || c >= 0xE0) return 0; /* long names, numbers, events: Python */
        Py_ssize_t len = c - 0xC0;
        if (!need(in, 1 + len)) return 0;
        const unsigned char *key = in->p + in->pos; /* code byte + name, as stored in the plan */
        in->pos += 1 + len;
        Py_ssize_t found = -1;
        for (Py_ssize_t k = 0; k < n; k++) { /* fields usually come in declaration order */
            Py_ssize_t j = expect + k < n ? expect + k : expect + k - n;
            const Field *fj = &plan->fields[j];
            if (fj->kn == 1 + len && same(fj->kp, key, 1 + len)) {
                found = j;
                break;
            }
        }
        if (found < 0) return 0;
        PyObject *value = read_kind(in, &plan->fields[found]);
        if (!value) return PyErr_Occurred() ? -1 : 0;
        Py_XSETREF(vals[found], value);
        expect = found + 1 < n ? found + 1 : 0;
    }
}

/* scan_fields_in on a local copy of the input position */
static int scan_fields(In *at, Plan *plan, PyObject **vals) {
    In local = *at;
    int rc = scan_fields_in(&local, plan, vals);
    *at = local;
    return rc;
}

static int get_range(PyObject *const *args, Py_buffer *view, Py_ssize_t *start, Py_ssize_t *end) {
    *start = PyLong_AsSsize_t(args[1]);
    *end = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred()) return -1;
    if (PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) < 0) return -1;
    return 0;
}

/* decode_fields(buf, start, end, missing) -> list | None: one value per field, `missing` for absent
 * fields; None when the Python path must decide. */
static PyObject *plan_decode_fields(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "expected (buf, start, end, missing)");
        return NULL;
    }
    if (!self->decodable || self->msgpack) Py_RETURN_NONE;
    Py_buffer view;
    Py_ssize_t start, end;
    if (get_range(args, &view, &start, &end) < 0) return NULL;
    PyObject *vals[MAX_FIELDS] = {NULL};
    PyObject *result = NULL;
    int rc = 0;
    if (start >= 0 && start <= end && end <= view.len) {
        In in = {(const unsigned char *)view.buf, start, end};
        rc = scan_fields(&in, self, vals);
    }
    if (rc == 1) {
        result = PyList_New(self->n);
        for (Py_ssize_t i = 0; result && i < self->n; i++) {
            PyList_SET_ITEM(result, i, vals[i] ? vals[i] : Py_NewRef(args[3]));
            vals[i] = NULL;
        }
    } else if (rc == 0) {
        result = Py_NewRef(Py_None);
    }
    for (Py_ssize_t i = 0; i < self->n; i++) Py_XDECREF(vals[i]);
    PyBuffer_Release(&view);
    return result;
}

/* The length of the `80|81|82 <length>` block at in->pos (after padding), moving in->pos to its
 * contents; -1 (in->pos unchanged past the padding) when there is none or it runs past the end. */
static Py_ssize_t enter_block(In *in) {
    skip_pad(in);
    if (!need(in, 1)) return -1;
    unsigned c = in->p[in->pos];
    int width = c == 0x80 ? 1 : c == 0x81 ? 2 : c == 0x82 ? 4 : 0;
    if (!width || !need(in, 1 + width)) return -1;
    Py_ssize_t len = (Py_ssize_t)le(in->p + in->pos + 1, width);
    if (!need(in, 1 + width + len)) return -1;
    in->pos += 1 + width;
    return len;
}

/* cls(*vals) or cls(**fields) from one new reference per field: 1 ok, -1 a Python error */
static int build(Plan *self, PyObject **vals, PyObject **out) {
    Py_ssize_t n = self->n;
    *out = self->positional ? PyObject_Vectorcall(self->cls, vals, (size_t)n, NULL)
                            : PyObject_Vectorcall(self->cls, vals, 0, self->kwnames);
    return *out ? 1 : -1;
}

/* Reads the length-prefixed block at in->pos as a `cls` into *out (in->pos then follows the block).
 * 1 ok; 0 give up (type prefix, null, defaults needed, unusual bytes); -1 a Python error. */
static int read_block(In *in, Plan *self, PyObject **out) {
    if (!self->decodable || self->arguments || self->msgpack) return 0;
    Py_ssize_t n = self->n, len = enter_block(in);
    if (len < 0) return 0;
    In sub = {in->p, in->pos, in->pos + len};
    PyObject *vals[MAX_FIELDS];
    memset(vals, 0, (size_t)n * sizeof(PyObject *));
    int rc = scan_fields(&sub, self, vals);
    for (Py_ssize_t i = 0; rc == 1 && i < n; i++)
        if (!vals[i]) rc = 0; /* defaults are the Python path's business */
    if (rc == 1) {
        rc = build(self, vals, out);
        in->pos = sub.end;
    }
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(vals[i]);
    return rc;
}

/* decode_object(buf, start, end) -> (object, new_pos) | None: reads the length-prefixed block at
 * start and, if every field is present and simple, returns cls(**fields). Anything else (type
 * prefix, null, defaults needed, unusual bytes) returns None. */
static PyObject *plan_decode_object(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "expected (buf, start, end)");
        return NULL;
    }
    if (!self->decodable) Py_RETURN_NONE;
    Py_buffer view;
    Py_ssize_t pos, end;
    if (get_range(args, &view, &pos, &end) < 0) return NULL;
    PyObject *obj = NULL;
    int rc = 0;
    In in = {(const unsigned char *)view.buf, pos, end};
    if (pos >= 0 && pos <= end && end <= view.len) rc = read_block(&in, self, &obj);
    PyBuffer_Release(&view);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    return Py_BuildValue("(Nn)", obj, in.pos);
}

/* ----- MessagePack (WireType.MSGSPEC) */
/* A `msgpack` plan reads and writes msgspec's MessagePack form of a Struct: a map from each field's
 * name to its value, enums by value. The fast paths take only the usual shape (each field once, a
 * value of its declared scalar type) and leave everything else to msgspec, so every result is the
 * one msgspec gives: the plan is an accelerator, not a second definition of the format. */

/* A big-endian unsigned integer of `width` (1, 2, 4 or 8) bytes; one load and a byte swap on
 * little-endian hosts. */
static inline uint64_t be(const unsigned char *p, int width) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (width == 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        return __builtin_bswap64(v);
    }
    if (width == 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        return __builtin_bswap32(v);
    }
    if (width == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        return __builtin_bswap16(v);
    }
#endif
    uint64_t v = 0;
    for (int i = 0; i < width; i++) v = v << 8 | p[i];
    return v;
}

/* The next value as a new reference of the field's kind, or NULL with no error set to give up. */
HOT PyObject *mp_read_kind(In *in, Field *f) {
    if (!need(in, 1)) return NULL;
    const unsigned char *p = in->p + in->pos;
    unsigned c = p[0];
    if (f->kind == K_INT) {
        if (c <= 0x7F || c >= 0xE0) { /* fixints */
            in->pos++;
            return PyLong_FromLong(c <= 0x7F ? (long)c : (long)c - 256);
        }
        if (c < 0xCC || c > 0xD3) return NULL;
        int width = 1 << ((c - 0xCC) & 3);
        if (!need(in, 1 + width)) return NULL;
        uint64_t v = be(p + 1, width);
        in->pos += 1 + width;
        if (c <= 0xCF) /* (the signed call has CPython's fast path for values below 2**30) */
            return v <= INT64_MAX ? PyLong_FromLongLong((int64_t)v) : PyLong_FromUnsignedLongLong(v);
        int shift = 64 - 8 * width; /* sign-extend the signed forms */
        return PyLong_FromLongLong((int64_t)(v << shift) >> shift);
    }
    if (f->kind == K_FLOAT) {
        if (c == 0xCB && need(in, 9)) {
            uint64_t bits = be(p + 1, 8);
            double d;
            memcpy(&d, &bits, 8);
            in->pos += 9;
            return PyFloat_FromDouble(d);
        }
        if (c == 0xCA && need(in, 5)) {
            uint32_t bits = (uint32_t)be(p + 1, 4);
            float d;
            memcpy(&d, &bits, 4);
            in->pos += 5;
            return PyFloat_FromDouble((double)d);
        }
        return NULL; /* (an int for a float field: msgspec converts it) */
    }
    if (f->kind == K_BOOL) {
        if (c != 0xC2 && c != 0xC3) return NULL;
        in->pos++;
        return Py_NewRef(c == 0xC3 ? Py_True : Py_False);
    }
    if (f->kind == K_STR || f->kind == K_ENUM) {
        Py_ssize_t n, head;
        if ((c & 0xE0) == 0xA0) {
            n = c & 0x1F;
            head = 1;
        } else if (c >= 0xD9 && c <= 0xDB) {
            int width = 1 << (c - 0xD9);
            if (!need(in, 1 + width)) return NULL;
            n = (Py_ssize_t)be(p + 1, width);
            head = 1 + width;
        } else {
            return NULL;
        }
        if (!need(in, head + n)) return NULL;
        in->pos += head + n;
        return text_value(f, p + head, n);
    }
    return NULL;
}

/* Reads the map at in->pos as a `cls` into *out. 1 ok; 0 give up (a missing, unknown or repeated
 * key, another value type, bad bytes); -1 a Python error. */
static int read_map(In *in, Plan *self, PyObject **out) {
    if (!self->decodable || !self->msgpack || !need(in, 1)) return 0;
    Py_ssize_t n = self->n, count;
    unsigned c = in->p[in->pos];
    if ((c & 0xF0) == 0x80) {
        count = c & 0x0F;
        in->pos += 1;
    } else if (c == 0xDE && need(in, 3)) {
        count = (Py_ssize_t)be(in->p + in->pos + 1, 2);
        in->pos += 3;
    } else {
        return 0;
    }
    if (count != n) return 0; /* defaults to fill in or unknown fields to skip: msgspec does that */
    PyObject *vals[MAX_FIELDS];
    memset(vals, 0, (size_t)n * sizeof(PyObject *));
    int rc = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = i; /* writers put the fields in declaration order */
        Field *f = &self->fields[i];
        if (in->end - in->pos <= f->kn || !same(f->kp, in->p + in->pos, f->kn)) {
            unsigned k = need(in, 1) ? in->p[in->pos] : 0;
            Py_ssize_t len = 1 + (Py_ssize_t)(k & 0x1F);
            if ((k & 0xE0) != 0xA0 || !need(in, len)) break;
            for (j = 0; j < n; j++)
                if (self->fields[j].kn == len && same(self->fields[j].kp, in->p + in->pos, len)) break;
        }
        if (j >= n || vals[j]) break; /* unknown or repeated */
        in->pos += self->fields[j].kn;
        vals[j] = mp_read_kind(in, &self->fields[j]);
        if (!vals[j]) break;
        if (i == n - 1) rc = 1;
    }
    if (rc == 1) rc = build(self, vals, out);
    else if (PyErr_Occurred()) rc = -1;
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(vals[i]);
    return rc;
}

static char *put_be(Out *o, unsigned char code, uint64_t v, int width) {
    char *p = reserve(o, 1 + width);
    if (!p) return NULL;
    p[0] = (char)code;
    for (int i = 0; i < width; i++) p[1 + i] = (char)(v >> (8 * (width - 1 - i)));
    return p;
}

/* An int in the shortest form, as msgspec writes it: 1 written, 0 give up, -1 error */
static int mp_put_int(Out *o, PyObject *x) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(x);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear(); /* beyond 64 bits: msgspec's error */
            return 0;
        }
        return put_be(o, 0xCF, u, 8) ? 1 : -1;
    }
    if (overflow < 0) return 0;
    char *p;
    if (v >= 0) {
        p = v < 0x80 ? put_be(o, (unsigned char)v, 0, 0)
            : v <= 0xFF ? put_be(o, 0xCC, (uint64_t)v, 1)
            : v <= 0xFFFF ? put_be(o, 0xCD, (uint64_t)v, 2)
            : v <= 0xFFFFFFFFLL ? put_be(o, 0xCE, (uint64_t)v, 4)
            : put_be(o, 0xCF, (uint64_t)v, 8);
    } else {
        p = v >= -32 ? put_be(o, (unsigned char)(v & 0xFF), 0, 0)
            : v >= INT8_MIN ? put_be(o, 0xD0, (uint64_t)v, 1)
            : v >= INT16_MIN ? put_be(o, 0xD1, (uint64_t)v, 2)
            : v >= INT32_MIN ? put_be(o, 0xD2, (uint64_t)v, 4)
            : put_be(o, 0xD3, (uint64_t)v, 8);
    }
    return p ? 1 : -1;
}

/* 1 written, 0 give up, -1 error */
static int mp_put_text(Out *o, const char *s, Py_ssize_t n) {
    char *p = n < 32 ? put_be(o, (unsigned char)(0xA0 | n), 0, 0)
              : n <= 0xFF ? put_be(o, 0xD9, (uint64_t)n, 1)
              : n <= 0xFFFF ? put_be(o, 0xDA, (uint64_t)n, 2)
              : n <= 0xFFFFFFFFLL ? put_be(o, 0xDB, (uint64_t)n, 4)
              : NULL;
    if (!p) return n > 0xFFFFFFFFLL ? 0 : -1;
    return put(o, s, n) < 0 ? -1 : 1;
}

/* obj's map: 1 written, 0 give up (a value of another type, an enum member not in the table, an
 * unset or changed slot), -1 error */
static int mp_write_fields(Out *o, Plan *plan, PyObject *obj) {
    Py_ssize_t n = plan->n;
    if (!plan->msgpack || !slots_valid(plan, obj) || n > 0xFFFF) return 0;
    if (!(n < 16 ? put_be(o, (unsigned char)(0x80 | n), 0, 0) : put_be(o, 0xDE, (uint64_t)n, 2))) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Field *f = &plan->fields[i];
        PyObject *x = f->offset > 0 ? *(PyObject **)((char *)obj + f->offset) : NULL; /* borrowed */
        if (!x) return 0;
        if (put(o, f->kp, f->kn) < 0) return -1;
        int rc = 0;
        if (PyLong_CheckExact(x)) {
            rc = mp_put_int(o, x);
        } else if (PyUnicode_CheckExact(x)) {
            Py_ssize_t len;
            const char *s = PyUnicode_AsUTF8AndSize(x, &len);
            if (!s) PyErr_Clear(); /* lone surrogates: msgspec's error */
            else rc = mp_put_text(o, s, len);
        } else if (PyFloat_CheckExact(x)) {
            double d = PyFloat_AS_DOUBLE(x);
            uint64_t bits;
            memcpy(&bits, &d, 8);
            rc = put_be(o, 0xCB, bits, 8) ? 1 : -1;
        } else if (x == Py_True || x == Py_False) {
            rc = put(o, x == Py_True ? "\xc3" : "\xc2", 1) < 0 ? -1 : 1;
        } else if (f->kind == K_ENUM && (PyObject *)Py_TYPE(x) == f->type) {
            PyObject *value = member_text(f, x);
            if (value) rc = mp_put_text(o, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
        }
        if (rc <= 0) return rc;
    }
    return 1;
}

/* obj as msgspec's MessagePack bytes, or NULL: an error, or (none set) give up */
static PyObject *mp_bytes(Plan *plan, PyObject *obj) {
    Out o;
    out_init(&o);
    int rc = mp_write_fields(&o, plan, obj);
    PyObject *result = rc == 1 ? PyBytes_FromStringAndSize(o.data, o.len) : NULL;
    out_free(&o);
    return result;
}

/* The whole of p[0:len] as one object of the plan's class: 1 ok, 0 give up, -1 error */
static int decode_whole(Plan *self, const unsigned char *p, Py_ssize_t len, PyObject **obj) {
    In in = {p, 0, len};
    int rc = self->msgpack ? read_map(&in, self, obj) : read_block(&in, self, obj);
    if (rc == 1 && in.pos != in.end) {
        Py_CLEAR(*obj); /* trailing bytes: the fallback reports them */
        rc = 0;
    }
    return rc;
}

/* decode(data) -> object: the whole of `data` (bytes or any buffer) is one object of this class;
 * anything the fast path does not take goes to the `fallback` callable, which reports errors. */
static PyObject *plan_decode(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "expected (data)");
        return NULL;
    }
    PyObject *obj = NULL;
    int rc = 0;
    if (PyBytes_CheckExact(args[0])) {
        rc = decode_whole(self, (const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), &obj);
    } else if (PyObject_CheckBuffer(args[0])) {
        Py_buffer view;
        if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* not contiguous: the fallback decides */
        } else {
            rc = decode_whole(self, (const unsigned char *)view.buf, view.len, &obj);
            PyBuffer_Release(&view);
        }
    }
    if (rc < 0) return NULL;
    if (rc == 1) return obj;
    if (!self->fallback) {
        PyErr_SetString(PyExc_RuntimeError, "Plan.fallback is not set");
        return NULL;
    }
    return PyObject_CallOneArg(self->fallback, args[0]);
}

/* read(reader) -> object: one block at reader.pos (a wire.binary.Reader), advancing it; anything the
 * fast path does not take goes to `read_fallback(reader)` with the reader untouched. */
static PyObject *plan_read(Plan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "expected (reader)");
        return NULL;
    }
    PyObject *reader = args[0];
    if (self->decodable) {
        PyObject *range[3] = {NULL, NULL, NULL};
        range[0] = PyObject_GetAttr(reader, str_buf);
        range[1] = range[0] ? PyObject_GetAttr(reader, str_pos) : NULL;
        range[2] = range[1] ? PyObject_GetAttr(reader, str_end) : NULL;
        PyObject *found = range[2] ? plan_decode_object(self, range, 3) : NULL;
        for (int i = 0; i < 3; i++) Py_XDECREF(range[i]);
        if (!found) return NULL;
        if (found != Py_None) {
            if (PyObject_SetAttr(reader, str_pos, PyTuple_GET_ITEM(found, 1)) < 0) {
                Py_DECREF(found);
                return NULL;
            }
            PyObject *obj = Py_NewRef(PyTuple_GET_ITEM(found, 0));
            Py_DECREF(found);
            return obj;
        }
        Py_DECREF(found);
    }
    if (!self->read_fallback) {
        PyErr_SetString(PyExc_RuntimeError, "Plan.read_fallback is not set");
        return NULL;
    }
    return PyObject_CallOneArg(self->read_fallback, reader);
}

static PyMemberDef plan_members[] = {
    {"fallback", T_OBJECT, offsetof(Plan, fallback), 0, "callable(data) used by decode() off the fast path"},
    {"read_fallback", T_OBJECT, offsetof(Plan, read_fallback), 0, "callable(reader) used by read() off the fast path"},
    {"decodable", T_INT, offsetof(Plan, decodable), READONLY, "1 if the C fast paths can read this class's blocks"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef plan_methods[] = {
    {"read", (PyCFunction)(void (*)(void))plan_read, METH_FASTCALL,
     "read(reader) -> object, through `read_fallback` when the fast path gives up."},
    {"decode", (PyCFunction)(void (*)(void))plan_decode, METH_FASTCALL,
     "decode(data) -> object, through `fallback` when the fast path gives up."},
    {"encode", (PyCFunction)(void (*)(void))plan_encode, METH_FASTCALL,
     "encode(buf, obj): append obj's fields to the bytearray."},
    {"encode_document", (PyCFunction)(void (*)(void))plan_encode_document, METH_FASTCALL,
     "encode_document(prefix, obj) -> bytes: prefix + `82 <u32 length>` + obj's fields."},
    {"encode_block", (PyCFunction)(void (*)(void))plan_encode_block, METH_FASTCALL,
     "encode_block(buf, obj): append `82 <u32 length>` and obj's fields."},
    {"decode_fields", (PyCFunction)(void (*)(void))plan_decode_fields, METH_FASTCALL,
     "decode_fields(buf, start, end, missing) -> list | None"},
    {"decode_object", (PyCFunction)(void (*)(void))plan_decode_object, METH_FASTCALL,
     "decode_object(buf, start, end) -> (object, end) | None"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wire._speedups.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)plan_traverse,
    .tp_clear = (inquiry)plan_clear,
    .tp_doc = "A per-class encode/decode plan compiled by wire.marshal.",
    .tp_methods = plan_methods,
    .tp_members = plan_members,
    .tp_new = plan_new,
};

/* ------------------------------------------------------------------ generic values */
/* The generic value model of wire/binary.py (Reader.read_value / read_document) for the common codes.
 * Anything else (dates, UUIDs, type prefixes, EVENT_OBJECT, comments, arrays, history, bad bytes)
 * makes the whole call give up, and Python decodes it (and reports errors) instead. */
typedef struct {
    PyObject *event_name, *field_number, *int64hex; /* wire.types classes */
} Kinds;

#define GIVE_UP ((PyObject *)NULL)
#define MAX_DEPTH 100

static int is_field_code(unsigned c) { return (c >= 0xC0 && c < 0xE0) || c == 0xB7 || c == 0xB9 || c == 0xBA || c == 0xBD; }

static PyObject *g_value(In *in, Kinds *k, int depth);

static PyObject *g_key(In *in, Kinds *k) {
    unsigned c = in->p[in->pos++];
    Py_ssize_t n;
    if (c >= 0xC0 && c < 0xE0) {
        n = c - 0xC0;
    } else if (c == 0xB7 || c == 0xB9) {
        int64_t len;
        if (!read_stop_bit(in, &len) || len < 0) return GIVE_UP;
        n = (Py_ssize_t)len;
    } else if (c == 0xBA) {
        int64_t v;
        if (!read_stop_bit(in, &v)) return GIVE_UP;
        PyObject *num = PyLong_FromLongLong(v);
        if (!num) return NULL;
        PyObject *key = PyObject_CallOneArg(k->field_number, num);
        Py_DECREF(num);
        return key;
    } else {
        return GIVE_UP; /* EVENT_OBJECT */
    }
    if (!need(in, n)) return GIVE_UP;
    PyObject *name = PyUnicode_DecodeLatin1((const char *)in->p + in->pos, n, NULL);
    in->pos += n;
    if (!name || c != 0xB9) return name;
    PyObject *key = PyObject_CallOneArg(k->event_name, name);
    Py_DECREF(name);
    return key;
}

/* The remaining fields of the current block as a dict (Reader._fields_here). */
static PyObject *g_fields(In *in, Kinds *k, int depth) {
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    for (;;) {
        skip_padding(in);
        if (in->pos >= in->end) return out;
        if (!is_field_code(in->p[in->pos])) break;
        PyObject *key = g_key(in, k);
        if (!key) break;
        skip_padding(in);
        PyObject *value;
        if (in->pos >= in->end || is_field_code(in->p[in->pos])) value = Py_NewRef(Py_None);
        else value = g_value(in, k, depth);
        if (!value) {
            Py_DECREF(key);
            break;
        }
        int rc = PyDict_SetItem(out, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (rc < 0) break;
    }
    Py_DECREF(out);
    return NULL; /* an error is set, or nothing: give up */
}

static PyObject *g_block(In *in, Kinds *k, int depth, Py_ssize_t len) {
    if (depth >= MAX_DEPTH || !need(in, len)) return GIVE_UP;
    In sub = {in->p, in->pos, in->pos + len};
    in->pos += len;
    skip_padding(&sub);
    if (sub.pos >= sub.end) return PyList_New(0);
    unsigned c = sub.p[sub.pos];
    if (is_field_code(c)) {
        PyObject *fields = g_fields(&sub, k, depth + 1);
        return fields;
    }
    if (c == 0x8A) return PyBytes_FromStringAndSize((const char *)sub.p + sub.pos + 1, sub.end - sub.pos - 1);
    if (c == 0x86) return GIVE_UP;
    PyObject *items = PyList_New(0);
    if (!items) return NULL;
    for (;;) {
        skip_padding(&sub);
        if (sub.pos >= sub.end) return items;
        PyObject *item = g_value(&sub, k, depth + 1);
        if (!item || PyList_Append(items, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(items);
            return NULL;
        }
        Py_DECREF(item);
    }
}

static PyObject *g_value(In *in, Kinds *k, int depth) {
    skip_padding(in);
    if (!need(in, 1)) return GIVE_UP;
    unsigned c = in->p[in->pos];
    if (c >= 0xE0 || c == 0xB8) {
        in->pos++;
        Py_ssize_t n;
        if (c >= 0xE0) {
            n = c - 0xE0;
        } else {
            int64_t len;
            if (!read_stop_bit(in, &len) || len < 0) return GIVE_UP;
            n = (Py_ssize_t)len;
        }
        if (!need(in, n)) return GIVE_UP;
        PyObject *text = PyUnicode_DecodeUTF8((const char *)in->p + in->pos, n, NULL);
        if (!text) PyErr_Clear(); /* CESU-8 or bad bytes: Python */
        in->pos += n;
        return text;
    }
    if (c < 0x80 || (c >= 0xA1 && c <= 0xA9)) {
        int is_int;
        int64_t iv = 0;
        double dv;
        if (!read_number(in, &is_int, &iv, &dv)) return GIVE_UP;
        if (c == 0xA3) return PyLong_FromUnsignedLongLong((uint64_t)(uint32_t)iv);
        return PyLong_FromLongLong(iv);
    }
    if (c == 0x90 || c == 0x91 || c == 0x92 || c == 0x94 || c == 0x96) {
        int is_int;
        int64_t iv;
        double dv;
        if (!read_number(in, &is_int, &iv, &dv)) return GIVE_UP;
        return PyFloat_FromDouble(dv);
    }
    if (c == 0xAF) {
        if (!need(in, 9)) return GIVE_UP;
        PyObject *num = PyLong_FromLongLong((int64_t)le(in->p + in->pos + 1, 8));
        in->pos += 9;
        if (!num) return NULL;
        PyObject *v = PyObject_CallOneArg(k->int64hex, num);
        Py_DECREF(num);
        return v;
    }
    if (c == 0xB0 || c == 0xB1 || c == 0xBB) {
        in->pos++;
        return Py_NewRef(c == 0xB1 ? Py_True : c == 0xB0 ? Py_False : Py_None);
    }
    if (c == 0x80 || c == 0x81 || c == 0x82) {
        Py_ssize_t len = enter_block(in);
        return len < 0 ? GIVE_UP : g_block(in, k, depth, len);
    }
    if (is_field_code(c)) return g_fields(in, k, depth); /* an inline map, as Reader.read_value */
    return GIVE_UP;
}

/* generic(buf, start, end, document, depth, EventName, FieldNumber, Int64Hex) -> (value, end) | None
 * document=True: the fields from start to end as a dict (Reader.read_document); else one value.
 * depth: the nesting depth of the calling Reader, so the limit is the same as Python's. */
static PyObject *generic(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "expected 8 arguments");
        return NULL;
    }
    long depth = PyLong_AsLong(args[4]);
    if (depth == -1 && PyErr_Occurred()) return NULL;
    if (depth < 0 || depth > MAX_DEPTH) Py_RETURN_NONE;
    Py_buffer view;
    Py_ssize_t start, end;
    if (get_range(args, &view, &start, &end) < 0) return NULL;
    int document = PyObject_IsTrue(args[3]);
    Kinds k = {args[5], args[6], args[7]};
    PyObject *result = NULL;
    if (document >= 0 && start >= 0 && start <= end && end <= view.len) {
        In in = {(const unsigned char *)view.buf, start, end};
        PyObject *value;
        if (document) {
            skip_padding(&in);
            value = in.pos >= in.end || is_field_code(in.p[in.pos]) ? g_fields(&in, &k, (int)depth) : GIVE_UP;
        } else {
            value = g_value(&in, &k, (int)depth);
        }
        if (value) result = Py_BuildValue("(Nn)", value, in.pos);
    }
    PyBuffer_Release(&view);
    if (!result && !PyErr_Occurred()) result = Py_NewRef(Py_None);
    return result;
}

/* ------------------------------------------------------------------ Encode, Decode */
/* wire.binary.encode and decode (and MSGSPEC's encoder) without their Python frame for the common
 * calls. Both wrap `function`, the Python reference, which handles every other call and fills `table`:
 *   Encode(function, plans, aliases, planless=None): a value whose class has a plan in `plans`
 *     (wire.marshal.whole_encoders) and no `!alias` in `aliases` (the registry's class -> name
 *     dict, looked up on every call, so a later registration takes effect); a msgpack plan's
 *     class goes to its plan, and a class `plans` maps to None to `planless` when given;
 *   Decode(function, table): a call with `type`, found in `table` (wire.marshal.whole_decoders:
 *     type -> callable(data), usually a class's Plan.decode, called without the bound method). */
typedef struct {
    PyObject_HEAD
    PyObject *function, *table, *aliases; /* aliases: Encode only */
    PyObject *planless; /* Encode only, optional: called for classes the table maps to None */
    vectorcallfunc vectorcall;
} Front;

static PyTypeObject EncodeType, DecodeType;
static PyObject *str_type;

static PyObject *encode_vectorcall(Front *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (!self->function || !self->table || !self->aliases) {
        PyErr_SetString(PyExc_RuntimeError, "Encode was cleared");
        return NULL;
    }
    if (PyVectorcall_NARGS(nargsf) == 1 && !kwnames) {
        PyObject *cls = (PyObject *)Py_TYPE(args[0]);
        PyObject *plan = PyDict_GetItemWithError(self->table, cls); /* borrowed */
        if (!plan && PyErr_Occurred()) return NULL;
        if (plan && Py_IS_TYPE(plan, &PlanType) && ((Plan *)plan)->msgpack) {
            Py_INCREF(plan);
            PyObject *result = mp_bytes((Plan *)plan, args[0]);
            Py_DECREF(plan);
            if (result || PyErr_Occurred()) return result;
        } else if (plan == Py_None && self->planless) {
            return PyObject_Vectorcall(self->planless, args, nargsf, kwnames);
        } else if (plan && Py_IS_TYPE(plan, &PlanType)) {
            int aliased = PyDict_Contains(self->aliases, cls);
            if (aliased < 0) return NULL;
            if (!aliased) {
                Py_INCREF(plan);
                PyObject *result = plan_block_bytes((Plan *)plan, NULL, args[0]);
                Py_DECREF(plan);
                return result;
            }
        }
    }
    return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
}

static PyObject *decode_vectorcall(Front *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *type = NULL;
    if (!self->function || !self->table) {
        PyErr_SetString(PyExc_RuntimeError, "Decode was cleared");
        return NULL;
    }
    if (nargs == 2 && !kwnames) {
        type = args[1];
    } else if (nargs == 1 && kwnames && PyTuple_GET_SIZE(kwnames) == 1) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, 0);
        if (name == str_type || PyUnicode_Compare(name, str_type) == 0) type = args[1];
        else if (PyErr_Occurred()) return NULL;
    }
    if (type && type != Py_None) {
        PyObject *decode = PyDict_GetItemWithError(self->table, type); /* borrowed */
        if (decode && PyCFunction_Check(decode) &&
            PyCFunction_GET_FUNCTION(decode) == (PyCFunction)(void (*)(void))plan_decode &&
            PyCFunction_GET_SELF(decode) && Py_IS_TYPE(PyCFunction_GET_SELF(decode), &PlanType)) {
            PyObject *plan = Py_NewRef(PyCFunction_GET_SELF(decode)); /* a class's Plan.decode: no method call */
            PyObject *result = plan_decode((Plan *)plan, args, 1);
            Py_DECREF(plan);
            return result;
        }
        if (decode) {
            Py_INCREF(decode);
            PyObject *result = PyObject_CallOneArg(decode, args[0]);
            Py_DECREF(decode);
            return result;
        }
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_Vectorcall(self->function, args, nargsf, kwnames);
}

static PyObject *front_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *function, *table, *aliases = NULL, *planless = NULL;
    int encode = type == &EncodeType;
    if (!PyArg_ParseTuple(args, encode ? "OO!O!|O" : "OO!", &function, &PyDict_Type, &table, &PyDict_Type, &aliases,
                          &planless))
        return NULL;
    Front *self = (Front *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->function = Py_NewRef(function);
    self->table = Py_NewRef(table);
    self->aliases = Py_XNewRef(aliases);
    self->planless = planless == Py_None ? NULL : Py_XNewRef(planless);
    self->vectorcall = (vectorcallfunc)(encode ? encode_vectorcall : decode_vectorcall);
    return (PyObject *)self;
}

static int front_traverse(Front *self, visitproc visit, void *arg) {
    Py_VISIT(self->function);
    Py_VISIT(self->table);
    Py_VISIT(self->aliases);
    Py_VISIT(self->planless);
    return 0;
}

static int front_clear(Front *self) {
    Py_CLEAR(self->function);
    Py_CLEAR(self->table);
    Py_CLEAR(self->aliases);
    Py_CLEAR(self->planless);
    return 0;
}

static void front_dealloc(Front *self) {
    PyObject_GC_UnTrack(self);
    front_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *front_get_doc(Front *self, void *c) {
    return self->function ? PyObject_GetAttrString(self->function, "__doc__") : Py_NewRef(Py_None);
}

static PyMemberDef front_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(Front, function), READONLY, "the Python function (signature, docs)"},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Front, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef front_getset[] = {
    {"__doc__", (getter)front_get_doc, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define FRONT_TYPE(NAME)                                                                 \
    {                                                                                    \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "wire._speedups." NAME,                 \
        .tp_basicsize = sizeof(Front), .tp_dealloc = (destructor)front_dealloc,          \
        .tp_vectorcall_offset = offsetof(Front, vectorcall), .tp_call = PyVectorcall_Call, \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL, \
        .tp_traverse = (traverseproc)front_traverse, .tp_clear = (inquiry)front_clear,   \
        .tp_members = front_members, .tp_getset = front_getset, .tp_new = front_new,     \
    }

static PyTypeObject EncodeType = FRONT_TYPE("Encode");
static PyTypeObject DecodeType = FRONT_TYPE("Decode");

/* ------------------------------------------------------------------ method events */
/* The raised exception as one object (normalized), clearing it; PyErr_GetRaisedException from 3.12. */
/* raise `exc` (stolen) as it is: its context is not replaced by an exception the caller is handling */
static void raise_as_is(PyObject *exc) {
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
}

static PyObject *take_raised(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && tb) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* The method reader's hot path in one step. `table` maps an event name (bytes) to a tuple whose first
 * items are (entry, Plan[, handlers]). A document body that starts with a short EVENT_NAME (no history)
 * found in the table, followed by one plain block of the plan's class, is decoded here; anything else
 * (history, method ids, unknown events, defaults, unusual or bad bytes, an object without a buffer)
 * gives up before any handler runs, and the caller's general path decides and reports errors. */

/* The table value for the document's event (borrowed) and the position after the event name;
 * NULL with no error set to give up. Small tables are scanned without building a key. */
static PyObject *event_lookup(const unsigned char *p, Py_ssize_t size, PyObject *table, Py_ssize_t *pos) {
    if (size < 2 || p[0] != 0xB9 || p[1] >= 0x80 || 2 + (Py_ssize_t)p[1] > size) return NULL;
    Py_ssize_t n = p[1];
    if (n == 7 && memcmp(p + 2, "history", 7) == 0) return NULL;
    *pos = 2 + n;
    PyObject *key, *value;
    if (PyDict_GET_SIZE(table) <= 8) {
        Py_ssize_t i = 0;
        while (PyDict_Next(table, &i, &key, &value))
            if (PyBytes_Check(key) && PyBytes_GET_SIZE(key) == n && same(PyBytes_AS_STRING(key), p + 2, n))
                return value;
        return NULL;
    }
    PyObject *name = PyBytes_FromStringAndSize((const char *)p + 2, n);
    value = name ? PyDict_GetItemWithError(table, name) : NULL;
    Py_XDECREF(name);
    return value;
}

/* A method's arguments as Java's method writer writes them at in->pos into *obj, a tuple: one bare value
 * (arguments 1), or a sequence `80|81|82 <length>` holding exactly one value per parameter (2).
 * 1 ok; 0 give up (fewer or more values, other codes: the general path decides); -1 error. */
static int read_arguments(In *in, Plan *plan, PyObject **obj) {
    if (!plan->decodable) return 0;
    Py_ssize_t n = plan->n;
    In sub = *in;
    if (plan->arguments == 2) {
        Py_ssize_t len = enter_block(in);
        if (len < 0) return 0;
        sub.pos = in->pos;
        sub.end = in->pos + len;
    }
    PyObject *args = PyTuple_New(n);
    if (!args) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = read_kind(&sub, &plan->fields[i]);
        if (!v) {
            Py_DECREF(args);
            return PyErr_Occurred() ? -1 : 0;
        }
        PyTuple_SET_ITEM(args, i, v);
    }
    if (plan->arguments == 2) {
        skip_pad(&sub);
        if (sub.pos != sub.end) { /* a newer writer's extra arguments: the general path ignores them */
            Py_DECREF(args);
            return 0;
        }
    }
    in->pos = plan->arguments == 1 ? sub.pos : sub.end;
    *obj = args;
    return 1;
}

/* A value another wire type wrote, framed as BINARY bytes (`80|81|82 <length> 8A data`, see
 * rpc._codec.framed_encoder), at in->pos: `decode(data)` into *obj. 1 ok; 0 give up (odd bytes, or the
 * decoder raised an ordinary exception: the general path decodes again and reports it); -1 error. */
static int read_framed(In *in, PyObject *decode, PyObject **obj) {
    Py_ssize_t len = enter_block(in);
    if (len < 1 || in->p[in->pos] != 0x8A) return 0;
    PyObject *data = PyBytes_FromStringAndSize((const char *)in->p + in->pos + 1, len - 1);
    if (!data) return -1;
    *obj = PyObject_CallOneArg(decode, data);
    Py_DECREF(data);
    if (!*obj) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
        PyErr_Clear();
        return 0;
    }
    in->pos += len;
    return 1;
}

/* What event_decode found: the table value (`hit`), the argument (or, `spread`, the arguments tuple),
 * the position after it, and the payload of a binary MessageHistory the document started with. */
typedef struct {
    PyObject *hit, *obj, *history;
    Py_ssize_t end;
    int spread;
} Decoded;

static void decoded_clear(Decoded *d) {
    Py_CLEAR(d->hit);
    Py_CLEAR(d->obj);
    Py_CLEAR(d->history);
}

/* Where the event starts: after the usual binary MessageHistory (`BA 80 00 81 <u16> 86 payload`, its
 * payload, well-formed, copied to *history), or 0; -1 to give up (another history form, bad bytes). */
static Py_ssize_t skip_history(const unsigned char *p, Py_ssize_t size, PyObject **history) {
    if (size < 3 || p[0] != 0xBA || p[1] != 0x80 || p[2] != 0x00) return 0;
    if (size < 8 || p[3] != 0x81 || p[6] != 0x86) return -1;
    Py_ssize_t end = 6 + (Py_ssize_t)(p[4] | (p[5] << 8));
    if (end > size) return -1;
    const unsigned char *h = p + 7;
    Py_ssize_t n = end - 7;
    if (n < 1) return -1;
    Py_ssize_t tpos = 1 + 12 * (Py_ssize_t)h[0];
    if (tpos >= n || tpos + 1 + 8 * (Py_ssize_t)h[tpos] > n) return -1;
    *history = PyBytes_FromStringAndSize((const char *)h, n);
    return *history ? end : -2;
}

/* 1 decoded (into *d, new references), 0 give up, -1 error; `handlers` asks for a third item in the
 * table value. The table value is held while the class is called, which may run any Python code. */
static int event_decode_at(const unsigned char *p, Py_ssize_t size, PyObject *table, int handlers, Decoded *d) {
    memset(d, 0, sizeof(*d));
    if (!PyDict_Check(table)) {
        PyErr_SetString(PyExc_TypeError, "the event table must be a dict");
        return -1;
    }
    Py_ssize_t start = skip_history(p, size, &d->history), pos = 0;
    int rc = 0;
    PyObject *hit = start < 0 ? NULL : event_lookup(p + start, size - start, table, &pos);
    if (start == -2) {
        rc = -1;
    } else if (!hit) {
        rc = PyErr_Occurred() ? -1 : 0;
    } else if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) < 2 + handlers ||
               !(Py_IS_TYPE(PyTuple_GET_ITEM(hit, 1), &PlanType) || PyCallable_Check(PyTuple_GET_ITEM(hit, 1))) ||
               (handlers && !PyTuple_Check(PyTuple_GET_ITEM(hit, 2)))) {
        PyErr_SetString(PyExc_TypeError, "event table values must be (entry, Plan or decoder, handler tuple)");
        rc = -1;
    } else {
        In in = {p, start + pos, size};
        PyObject *how = PyTuple_GET_ITEM(hit, 1);
        d->hit = Py_NewRef(hit);
        d->spread = Py_IS_TYPE(how, &PlanType) && ((Plan *)how)->arguments;
        rc = d->spread ? read_arguments(&in, (Plan *)how, &d->obj)
             : Py_IS_TYPE(how, &PlanType) ? read_block(&in, (Plan *)how, &d->obj)
                                          : read_framed(&in, how, &d->obj);
        d->end = in.pos;
    }
    if (rc != 1) decoded_clear(d);
    return rc;
}

/* event_decode_at on the buffer `document` exports */
static int event_decode(PyObject *document, PyObject *table, int handlers, Decoded *d) {
    Py_buffer view;
    if (PyObject_GetBuffer(document, &view, PyBUF_SIMPLE) < 0) {
        memset(d, 0, sizeof(*d));
        PyErr_Clear(); /* not a buffer (or a closed one): the general path reports it */
        return 0;
    }
    int rc = event_decode_at((const unsigned char *)view.buf, view.len, table, handlers, d);
    PyBuffer_Release(&view);
    return rc;
}

/* handler(obj), or handler(*obj) when obj holds the arguments */
static PyObject *deliver(PyObject *handler, PyObject *obj, int spread) {
    if (!spread) {
        if (PyMethod_Check(handler)) { /* a bound method: its function with (self, obj), no method object call */
            PyObject *call[3] = {NULL, PyMethod_GET_SELF(handler), obj};
            return PyObject_Vectorcall(PyMethod_GET_FUNCTION(handler), call + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                       NULL);
        }
        return PyObject_CallOneArg(handler, obj);
    }
    return PyObject_Vectorcall(handler, PySequence_Fast_ITEMS(obj), (size_t)PyTuple_GET_SIZE(obj), NULL);
}

/* The arguments as a tuple (new reference) */
static PyObject *arguments_of(Decoded *d) {
    return d->spread ? Py_NewRef(d->obj) : PyTuple_Pack(1, d->obj);
}

/* event_value(document, table) -> (entry, arguments tuple, end, history payload | None) | None */
static PyObject *event_value(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "expected (document, table)");
        return NULL;
    }
    Decoded d;
    int rc = event_decode(args[0], args[1], 0, &d);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE;
    PyObject *arguments = arguments_of(&d), *result = NULL;
    if (arguments)
        result = Py_BuildValue("(ONnO)", PyTuple_GET_ITEM(d.hit, 0), arguments, d.end,
                               d.history ? d.history : Py_None);
    decoded_clear(&d);
    return result;
}

/* event_call(document, table) -> entry | None: decodes as event_value, then calls every handler in
 * the table value's third item with the arguments; None (nothing called) when it gives up, and for a
 * document that carries a history (its handlers must see it: the caller's business). */
static PyObject *event_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "expected (document, table)");
        return NULL;
    }
    Decoded d;
    int rc = event_decode(args[0], args[1], 1, &d);
    if (rc < 0) return NULL;
    if (rc == 0 || d.history) {
        decoded_clear(&d);
        Py_RETURN_NONE;
    }
    PyObject *handlers = PyTuple_GET_ITEM(d.hit, 2), *result = NULL;
    Py_ssize_t i = 0;
    for (; i < PyTuple_GET_SIZE(handlers); i++) {
        PyObject *r = deliver(PyTuple_GET_ITEM(handlers, i), d.obj, d.spread);
        if (!r) break;
        Py_DECREF(r);
    }
    if (i == PyTuple_GET_SIZE(handlers)) result = Py_NewRef(PyTuple_GET_ITEM(d.hit, 0));
    decoded_clear(&d);
    return result;
}

/* PendingHop(base, source, read_ns): the history of the message a method reader is dispatching, as the
 * reader found it: `base` (the carried history's payload bytes, a MessageHistory, or None), `source`
 * ((source id, index) or None) and `read_ns` (when it was read), plus a `_built` slot for the caller.
 * A base type (rpc adds the methods): made once per message, so it costs one allocation and no Python
 * frame, and HistoryCall reads its fields directly. */
typedef struct {
    PyObject_HEAD
    PyObject *base, *source, *read_ns, *built;
    /* c_hop: made by a reader (read_one_pending, read_one_reuse_hop), `source` is (sid, idx) and
     * `read_ns` is read_c, kept as C values (HistoryCall splices them as they are) and made objects only
     * when Python asks for them */
    int c_hop;
    int64_t sid, idx, read_c;
} PendingHop;

static PyObject *pending_hop_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *base, *source, *read_ns;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "PendingHop takes no keywords");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "PendingHop", 3, 3, &base, &source, &read_ns)) return NULL;
    PendingHop *self = (PendingHop *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->base = Py_NewRef(base);
    self->source = Py_NewRef(source);
    self->read_ns = Py_NewRef(read_ns);
    self->built = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static int pending_hop_traverse(PendingHop *self, visitproc visit, void *arg) {
    Py_VISIT(self->base); /* (a heap subclass's type is visited, and released, by its subtype slots) */
    Py_VISIT(self->source);
    Py_VISIT(self->read_ns);
    Py_VISIT(self->built);
    return 0;
}

static int pending_hop_clear(PendingHop *self) {
    Py_CLEAR(self->base);
    Py_CLEAR(self->source);
    Py_CLEAR(self->read_ns);
    Py_CLEAR(self->built);
    return 0;
}

static void pending_hop_dealloc(PendingHop *self) {
    PyObject_GC_UnTrack(self);
    pending_hop_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef pending_hop_members[] = {
    {"base", T_OBJECT, offsetof(PendingHop, base), 0, "the carried history: payload bytes as read, a MessageHistory, or None"},
    {"_built", T_OBJECT, offsetof(PendingHop, built), 0, "the MessageHistory built from it, once asked for"},
    {NULL, 0, 0, 0, NULL},
};

/* `source` and `read_ns`: made from the C values of a reader's hop the first time they are asked for */
static PyObject *pending_hop_source(PendingHop *self, void *c) {
    if (!self->source) {
        if (!self->c_hop) Py_RETURN_NONE;
        self->source = Py_BuildValue("(LL)", (long long)self->sid, (long long)self->idx);
        if (!self->source) return NULL;
    }
    return Py_NewRef(self->source);
}

static PyObject *pending_hop_read_ns(PendingHop *self, void *c) {
    if (!self->read_ns) {
        if (!self->c_hop) Py_RETURN_NONE;
        self->read_ns = PyLong_FromLongLong((long long)self->read_c);
        if (!self->read_ns) return NULL;
    }
    return Py_NewRef(self->read_ns);
}

static PyGetSetDef pending_hop_getset[] = {
    {"source", (getter)pending_hop_source, NULL, "(source id, index) of this read, or None", NULL},
    {"read_ns", (getter)pending_hop_read_ns, NULL, "when this read happened (the reader's clock)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PendingHopType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wire._speedups.PendingHop",
    .tp_basicsize = sizeof(PendingHop),
    .tp_dealloc = (destructor)pending_hop_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_traverse = (traverseproc)pending_hop_traverse,
    .tp_clear = (inquiry)pending_hop_clear,
    .tp_doc = "PendingHop(base, source, read_ns): the history of the message being dispatched, as read.",
    .tp_members = pending_hop_members,
    .tp_getset = pending_hop_getset,
    .tp_new = pending_hop_new,
};

static PyObject *monotonic_ns; /* time.monotonic_ns, the readers' and writers' default clock */

/* clock() as an int: time.monotonic_ns's own clock read here (what it returns, without the call) */
static PyObject *call_clock(PyObject *clock) {
    if (clock == monotonic_ns) {
        struct timespec ts;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0)
            return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    }
    return PyObject_CallNoArgs(clock);
}

/* ReadOne(read, table, current, slow, pending, clock, source_id, source=None): a method reader's
 * read_one() in one C call. `read()` gives None (False: nothing to read) or an excerpt; with `source`,
 * (object, DocumentSource capsule), the capsule's read is used instead (_document_source.h). A data excerpt the fast path
 * decodes is delivered (True) to the table value's handlers: directly, or, when the document carried
 * a history, the reader has a source id, or the ContextVar `current` holds a history already (a
 * reader inside a handler), with `current` set to `pending(history payload | None, (source_id,
 * index) | None, clock() | 0)` (or None when there is nothing to record) while they run. Everything
 * else goes to `slow(got)`, whose result is returned: the excerpt when the fast path does not take
 * it, or (excerpt, exception) when a handler raised, so the caller can name the document. */
typedef struct {
    PyObject_HEAD
    PyObject *read, *table, *current, *slow, *pending, *clock, *source_id;
    PyObject *source;                 /* with source_api: what is read (held alive) */
    const DocumentSource *source_api; /* NULL: call `read` */
    int has_source;
    vectorcallfunc vectorcall;
    PyTypeObject *ex_type; /* the excerpt class last seen, and its `metadata` data descriptor (or NULL) */
    PyObject *ex_metadata;
    int pending_direct; /* `pending` is a PendingHop class made as PendingHop makes it: allocated here */
    int sid_c_ok;       /* source_id fits in 64 bits, as sid_c */
    int64_t sid_c;
} ReadOne;

/* ex.metadata as 1/0, -1 with an error: through the excerpt class's data descriptor, found once per
 * class (a data descriptor wins over any instance attribute, so this is exactly getattr). */
static int read_one_metadata(ReadOne *self, PyObject *ex) {
    PyTypeObject *tp = Py_TYPE(ex);
    if (tp != self->ex_type) {
        PyObject *d = PyObject_GetAttr((PyObject *)tp, str_metadata);
        if (!d) PyErr_Clear();
        else if (!Py_TYPE(d)->tp_descr_get || !Py_TYPE(d)->tp_descr_set) Py_CLEAR(d);
        Py_XSETREF(self->ex_metadata, d);
        Py_XSETREF(self->ex_type, (PyTypeObject *)Py_NewRef(tp));
    }
    PyObject *flag = self->ex_metadata ? Py_TYPE(self->ex_metadata)->tp_descr_get(self->ex_metadata, ex, (PyObject *)tp)
                                       : PyObject_GetAttr(ex, str_metadata);
    int metadata = flag ? PyObject_IsTrue(flag) : -1;
    Py_XDECREF(flag);
    return metadata;
}

static PyObject *str_index, *int_zero;

/* pending(base, source, now): without a Python call where it is a plain PendingHop class */
static PyObject *read_one_make_pending(ReadOne *self, PyObject *base, PyObject *source, PyObject *now) {
    if (self->pending_direct) {
        PyTypeObject *tp = (PyTypeObject *)self->pending;
        PendingHop *hop = (PendingHop *)tp->tp_alloc(tp, 0);
        if (!hop) return NULL;
        hop->base = Py_NewRef(base);
        hop->source = Py_NewRef(source);
        hop->read_ns = Py_NewRef(now);
        hop->built = Py_NewRef(Py_None);
        return (PyObject *)hop;
    }
    PyObject *call[3] = {base, source, now};
    return PyObject_Vectorcall(self->pending, call, 3, NULL);
}

/* clock() as int64 in *ns (1), or its result in *obj when that is not an int of 64 bits (0); -1: error */
static int clock_ns(PyObject *clock, int64_t *ns, PyObject **obj) {
    *obj = NULL;
    if (clock == monotonic_ns) {
        struct timespec ts;
        if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0) {
            *ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
            return 1;
        }
    }
    PyObject *r = PyObject_CallNoArgs(clock);
    if (!r) return -1;
    if (PyLong_CheckExact(r)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(r, &overflow);
        if (!overflow && !(v == -1 && PyErr_Occurred())) {
            Py_DECREF(r);
            *ns = (int64_t)v;
            return 1;
        }
        PyErr_Clear();
    }
    *obj = r;
    return 0;
}

/* The `pending` object for a document (new reference; None when there is nothing to record). `index`:
 * the document's queue index as its source gave it, -1 when unknown (asked of the excerpt). A plain
 * PendingHop class with the index and the default clock gets the hop as C values (no objects made). */
static PyObject *read_one_pending(ReadOne *self, Decoded *d, PyObject *ex, int64_t index) {
    if (!self->has_source) {
        if (!d->history) Py_RETURN_NONE;
        return read_one_make_pending(self, d->history, Py_None, int_zero);
    }
    PyObject *base = d->history ? d->history : Py_None, *now = NULL, *index_obj = NULL, *result = NULL;
    int64_t now_c = 0;
    if (index >= 0 && self->pending_direct && self->sid_c_ok) {
        int rc = clock_ns(self->clock, &now_c, &now);
        if (rc < 0) return NULL;
        if (rc == 1) {
            PyTypeObject *tp = (PyTypeObject *)self->pending;
            PendingHop *hop = (PendingHop *)tp->tp_alloc(tp, 0);
            if (!hop) return NULL;
            hop->base = Py_NewRef(base);
            hop->built = Py_NewRef(Py_None);
            hop->c_hop = 1;
            hop->sid = self->sid_c;
            hop->idx = index;
            hop->read_c = now_c;
            return (PyObject *)hop;
        }
    }
    index_obj = index >= 0 ? PyLong_FromLongLong((long long)index) : PyObject_GetAttr(ex, str_index);
    if (!index_obj) goto done;
    PyObject *source = PyTuple_Pack(2, self->source_id, index_obj);
    if (!source) goto done;
    if (!now) { /* (not taken above) */
        int rc = clock_ns(self->clock, &now_c, &now);
        if (rc == 1) now = PyLong_FromLongLong((long long)now_c);
    }
    if (now) result = read_one_make_pending(self, base, source, now);
    Py_DECREF(source);
done:
    Py_XDECREF(index_obj);
    Py_XDECREF(now);
    return result;
}

/* A batch of `many()` (see read_one_core): the token of its first set of `current` and the hop it set last */
typedef struct {
    PyObject *token, *hop;
} Batch;

/* `current` as it was before the batch's first set (the batch token used and cleared); 0 or -1 */
static int read_one_end_batch(ReadOne *self, Batch *batch) {
    Py_CLEAR(batch->hop);
    if (!batch->token) return 0;
    PyObject *token = batch->token;
    batch->token = NULL;
    int rc = PyContextVar_Reset(self->current, token);
    Py_DECREF(token);
    return rc;
}

/* A context's layout (CPython's own, the same in 3.11-3.13; checked at import against the type's size and
 * a new context's mapping, else ctx_layout_ok stays 0 and hops are never reused) */
typedef struct {
    PyObject_HEAD
    PyObject *ctx_prev, *ctx_vars, *ctx_weakreflist;
    int ctx_entered;
} ContextLayout;
static int ctx_layout_ok;

/* Make the batch's hop, current since the previous message, this message's in place: 1 done, 0 not
 * possible (a new hop is set), -1 error. Only where nothing can see the change: `current` still holds
 * that hop, nothing but the context's mapping and the batch refers to it, and that mapping is the current
 * context's alone (a context copied by a handler, e.g. for a task or a callback, keeps its mapping
 * alive: the hop it holds must stay that message's). Saves a context-variable set (a new mapping and a
 * token) and a hop per message. */
static int read_one_reuse_hop(ReadOne *self, Batch *batch, Decoded *d, int64_t index) {
    PendingHop *hop = (PendingHop *)batch->hop;
    if (!hop || !ctx_layout_ok || index < 0 || !self->sid_c_ok || Py_REFCNT(hop) != 2) return 0;
    ContextLayout *ctx = (ContextLayout *)PyThreadState_Get()->context;
    if (!ctx || !ctx->ctx_vars || Py_REFCNT(ctx->ctx_vars) != 1) return 0;
    PyObject *cur = NULL;
    if (PyContextVar_Get(self->current, NULL, &cur) < 0) return -1;
    Py_XDECREF(cur);
    if (cur != (PyObject *)hop) return 0;
    int64_t now = 0;
    PyObject *now_obj = NULL;
    int rc = clock_ns(self->clock, &now, &now_obj);
    if (rc <= 0) { /* (a clock beyond 64 bits: a new hop with its objects) */
        if (rc < 0) return -1;
        Py_DECREF(now_obj);
        return 0;
    }
    Py_SETREF(hop->base, Py_NewRef(d->history ? d->history : Py_None));
    Py_CLEAR(hop->source);
    Py_CLEAR(hop->read_ns);
    Py_SETREF(hop->built, Py_NewRef(Py_None));
    hop->c_hop = 1;
    hop->sid = self->sid_c;
    hop->idx = index;
    hop->read_c = now;
    return 1;
}

/* One message (see ReadOne). `batch`, in `many()` of a reader with a source id (every message sets
 * `current`): the token of the batch's first set, kept instead of resetting after each message's
 * handlers (the next message sets `current` again, or changes the hop set last in place:
 * read_one_reuse_hop; `many()` resets it once at the end), and reset before anything else runs (the
 * general path, a failed handler's report) or when NULL is returned. */
static PyObject *read_one_core(ReadOne *self, Batch *batch) {
    if (!self->read) {
        PyErr_SetString(PyExc_RuntimeError, "ReadOne was cleared");
        return NULL;
    }
    const char *data = NULL;
    Py_ssize_t len = 0;
    int metadata = -1;
    int64_t index = -1;
    PyObject *ex = self->source_api ? self->source_api->read(self->source, &data, &len, &metadata, &index)
                                    : PyObject_CallNoArgs(self->read);
    if (!ex) return NULL;
    if (ex == Py_None) {
        Py_DECREF(ex);
        Py_RETURN_FALSE;
    }
    if (metadata < 0) {
        data = NULL;
        metadata = read_one_metadata(self, ex);
    }
    Decoded d;
    int rc = 0;
    if (metadata < 0) PyErr_Clear(); /* no such attribute: the general path reports it */
    else if (metadata == 0)
        rc = data ? event_decode_at((const unsigned char *)data, len, self->table, 1, &d)
                  : event_decode(ex, self->table, 1, &d);
    if (rc < 0) {
        Py_DECREF(ex);
        return NULL;
    }
    if (rc == 0) {
        if (batch && read_one_end_batch(self, batch) < 0) {
            Py_DECREF(ex);
            return NULL;
        }
        PyObject *got = PyObject_CallOneArg(self->slow, ex);
        Py_DECREF(ex);
        return got;
    }
    PyObject *token = NULL, *got = NULL;
    int hop = d.history || self->has_source;
    if (batch && !self->has_source) batch = NULL; /* (only where every message sets `current`) */
    if (!hop) { /* a history current here (a reader inside a handler) is not this message's */
        PyObject *outer = NULL;
        if (PyContextVar_Get(self->current, Py_None, &outer) < 0) goto done;
        hop = outer != Py_None;
        Py_DECREF(outer);
    }
    if (hop) {
        int reused = batch ? read_one_reuse_hop(self, batch, &d, metadata < 0 ? -1 : index) : 0;
        if (reused < 0) goto done;
        if (!reused) {
            PyObject *pending = read_one_pending(self, &d, ex, metadata < 0 ? -1 : index);
            if (!pending) goto done;
            token = PyContextVar_Set(self->current, pending);
            if (!token) {
                Py_DECREF(pending);
                goto done;
            }
            if (batch) { /* kept: the batch's first token restores what was current before it */
                Py_XSETREF(batch->hop, pending);
                if (!batch->token) batch->token = token;
                else Py_DECREF(token);
                token = NULL;
            } else {
                Py_DECREF(pending);
            }
        }
    }
    PyObject *handlers = PyTuple_GET_ITEM(d.hit, 2);
    Py_ssize_t i = 0;
    for (; i < PyTuple_GET_SIZE(handlers); i++) {
        PyObject *r = deliver(PyTuple_GET_ITEM(handlers, i), d.obj, d.spread);
        if (!r) break;
        Py_DECREF(r);
    }
    int failed = i < PyTuple_GET_SIZE(handlers);
    PyObject *exc = failed ? take_raised() : NULL;
    if (token && PyContextVar_Reset(self->current, token) < 0) {
        Py_XDECREF(exc);
        goto done;
    }
    if (failed && batch && read_one_end_batch(self, batch) < 0) {
        Py_XDECREF(exc);
        goto done;
    }
    if (failed) {
        PyObject *pair = PyTuple_Pack(2, ex, exc ? exc : Py_None);
        got = pair ? PyObject_CallOneArg(self->slow, pair) : NULL;
        Py_XDECREF(pair);
    } else {
        got = Py_NewRef(Py_True);
    }
    Py_XDECREF(exc);
done:
    Py_XDECREF(token);
    decoded_clear(&d);
    Py_DECREF(ex);
    return got;
}

static PyObject *read_one_vectorcall(ReadOne *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) || kwnames) {
        PyErr_SetString(PyExc_TypeError, "read_one() takes no arguments");
        return NULL;
    }
    return read_one_core(self, NULL);
}

static PyObject *read_one_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *read, *table, *current, *slow, *pending, *clock, *source_id, *source = Py_None;
    if (!PyArg_ParseTuple(args, "OO!OOOOO!|O", &read, &PyDict_Type, &table, &current, &slow, &pending, &clock,
                          &PyLong_Type, &source_id, &source))
        return NULL;
    const DocumentSource *api = NULL;
    PyObject *source_obj = NULL;
    if (source != Py_None) { /* (object, DocumentSource capsule): read() through the capsule */
        if (!PyTuple_Check(source) || PyTuple_GET_SIZE(source) != 2) {
            PyErr_SetString(PyExc_TypeError, "source must be (object, DocumentSource capsule) or None");
            return NULL;
        }
        api = PyCapsule_GetPointer(PyTuple_GET_ITEM(source, 1), DOCUMENT_SOURCE_CAPSULE);
        if (!api) return NULL;
        if (api->version != DOCUMENT_SOURCE_VERSION || !api->read) {
            PyErr_SetString(PyExc_ValueError, "unknown DocumentSource version");
            return NULL;
        }
        source_obj = PyTuple_GET_ITEM(source, 0);
    }
    if (!PyContextVar_CheckExact(current)) {
        PyErr_SetString(PyExc_TypeError, "current must be a ContextVar");
        return NULL;
    }
    int has_source = PyObject_IsTrue(source_id);
    if (has_source < 0) return NULL;
    ReadOne *self = (ReadOne *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->read = Py_NewRef(read);
    self->table = Py_NewRef(table);
    self->current = Py_NewRef(current);
    self->slow = Py_NewRef(slow);
    self->pending = Py_NewRef(pending);
    self->clock = Py_NewRef(clock);
    self->source_id = Py_NewRef(source_id);
    self->source = Py_XNewRef(source_obj);
    self->source_api = api;
    self->has_source = has_source;
    int overflow = 0;
    long long sid = PyLong_AsLongLongAndOverflow(source_id, &overflow);
    if (sid == -1 && PyErr_Occurred()) {
        Py_DECREF(self);
        return NULL;
    }
    self->sid_c_ok = !overflow;
    self->sid_c = (int64_t)sid;
    if (PyType_Check(pending)) {
        PyTypeObject *tp = (PyTypeObject *)pending;
        self->pending_direct = PyType_IsSubtype(tp, &PendingHopType) && tp->tp_new == PendingHopType.tp_new &&
                               tp->tp_init == PendingHopType.tp_init && tp->tp_alloc == PyType_GenericAlloc;
    }
    self->vectorcall = (vectorcallfunc)read_one_vectorcall;
    return (PyObject *)self;
}

static int read_one_traverse(ReadOne *self, visitproc visit, void *arg) {
    Py_VISIT(self->read);
    Py_VISIT(self->table);
    Py_VISIT(self->current);
    Py_VISIT(self->slow);
    Py_VISIT(self->pending);
    Py_VISIT(self->clock);
    Py_VISIT(self->source_id);
    Py_VISIT(self->source);
    Py_VISIT(self->ex_type);
    Py_VISIT(self->ex_metadata);
    return 0;
}

static int read_one_clear(ReadOne *self) {
    Py_CLEAR(self->read);
    Py_CLEAR(self->table);
    Py_CLEAR(self->current);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->source_id);
    Py_CLEAR(self->source);
    self->source_api = NULL;
    Py_CLEAR(self->ex_type);
    Py_CLEAR(self->ex_metadata);
    return 0;
}

static void read_one_dealloc(ReadOne *self) {
    PyObject_GC_UnTrack(self);
    read_one_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* many(limit) -> int: read_one() until it returns False or `limit` documents were consumed, without
 * a Python call per document (catching up, replaying, an event loop's batch). */
static PyObject *read_one_many(ReadOne *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "many(limit) takes one argument");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[0]), count = 0;
    if (limit == -1 && PyErr_Occurred()) return NULL;
    Batch batch = {NULL, NULL}; /* (see read_one_core) */
    while (count < limit) {
        PyObject *got = read_one_core(self, &batch);
        int more = got ? PyObject_IsTrue(got) : -1;
        Py_XDECREF(got);
        if (more < 0) {
            PyObject *exc = take_raised();
            int rc = read_one_end_batch(self, &batch);
            if (rc < 0) {
                Py_XDECREF(exc); /* (the reset's error stands) */
                return NULL;
            }
            if (exc) raise_as_is(exc);
            return NULL;
        }
        if (!more) break;
        count++;
    }
    if (read_one_end_batch(self, &batch) < 0) return NULL;
    return PyLong_FromSsize_t(count);
}

static PyMethodDef read_one_methods[] = {
    {"many", (PyCFunction)(void (*)(void))read_one_many, METH_FASTCALL,
     "many(limit) -> int: consume and dispatch up to `limit` ready documents; how many were."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReadOneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wire._speedups.ReadOne",
    .tp_basicsize = sizeof(ReadOne),
    .tp_dealloc = (destructor)read_one_dealloc,
    .tp_vectorcall_offset = offsetof(ReadOne, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_traverse = (traverseproc)read_one_traverse,
    .tp_clear = (inquiry)read_one_clear,
    .tp_doc = "ReadOne(read, table, current, slow, pending, clock, source_id, source=None): a method reader's "
              "read_one(); source=(object, DocumentSource capsule) reads through the capsule instead of read().",
    .tp_methods = read_one_methods,
    .tp_new = read_one_new,
};

/* The binary MessageHistory document part (`BA 80 00 81 <u16> 86 body`) of the history whose payload
 * (as read: `n`, n source ids, n indexes, `m`, m timings) is p[0:size], plus one source (`add`: (sid,
 * idx)) and `extra` timings, appended to `o`. 1: done; 0: anything unusual, nothing appended (the Python
 * reference, wire.history, then builds it or reports the error); -1: out of memory. */
static int splice_hop(Out *o, const unsigned char *p, Py_ssize_t size, int add, int64_t sid, int64_t idx,
                      const int64_t *timings, Py_ssize_t extra) {
    if (size < 2 || extra < 0 || extra > 255) return 0;
    Py_ssize_t n = p[0], ids_end = 1 + 4 * n, sources_end = 1 + 12 * n;
    if (sources_end >= size) return 0;
    Py_ssize_t m = p[sources_end];
    if (sources_end + 1 + 8 * m > size || n + add > 255 || m + extra > 255) return 0;
    if (add && (sid < INT32_MIN || sid > INT32_MAX)) return 0;
    Py_ssize_t body = 1 + 12 * (n + add) + 1 + 8 * (m + extra);
    if (body + 1 > 0xFFFF) return 0;
    unsigned char *q = (unsigned char *)reserve(o, 7 + body);
    if (!q) return -1;
    memcpy(q, "\xba\x80\x00\x81", 4);
    q[4] = (unsigned char)((body + 1) & 0xFF);
    q[5] = (unsigned char)((body + 1) >> 8);
    q[6] = 0x86;
    q += 7;
    *q++ = (unsigned char)(n + add);
    memcpy(q, p + 1, (size_t)(4 * n));
    q += 4 * n;
    if (add) {
        int32_t v = (int32_t)sid;
        memcpy(q, &v, 4);
        q += 4;
    }
    memcpy(q, p + ids_end, (size_t)(8 * n));
    q += 8 * n;
    if (add) {
        memcpy(q, &idx, 8);
        q += 8;
    }
    *q++ = (unsigned char)(m + extra);
    memcpy(q, p + sources_end + 1, (size_t)(8 * m));
    q += 8 * m;
    memcpy(q, timings, (size_t)(8 * extra));
    return 1;
}

/* history_hop(payload, source, timings) -> bytearray | None: `splice_hop` of `payload` with `source`
 * ((id, index) or None) and `timings` (a tuple of ints); None when anything is unusual. */
static PyObject *history_hop(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "expected (bytes, (id, index) | None, tuple of timings)");
        return NULL;
    }
    int add = args[1] != Py_None;
    long long sid = 0, idx = 0;
    if (add) {
        if (!PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 2) Py_RETURN_NONE;
        int overflow = 0;
        sid = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(args[1], 0), &overflow);
        if (overflow || sid < INT32_MIN || sid > INT32_MAX) Py_RETURN_NONE;
        idx = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(args[1], 1), &overflow);
        if (overflow) Py_RETURN_NONE;
        if (PyErr_Occurred()) return NULL;
    }
    Py_ssize_t extra = PyTuple_GET_SIZE(args[2]);
    if (extra > 255) Py_RETURN_NONE;
    int64_t timings[255];
    for (Py_ssize_t i = 0; i < extra; i++) {
        int overflow = 0;
        long long t = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(args[2], i), &overflow);
        if (overflow || (t == -1 && PyErr_Occurred())) {
            if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)) return NULL;
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        timings[i] = (int64_t)t;
    }
    Out o;
    out_init(&o);
    int rc = splice_hop(&o, (const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), add,
                        (int64_t)sid, (int64_t)idx, timings, extra);
    PyObject *out = rc < 0 ? NULL : rc == 0 ? Py_NewRef(Py_None) : PyByteArray_FromStringAndSize(o.data, o.len);
    out_free(&o);
    return out;
}


/* HistoryCall(current, event, kinds, encoders, prefix, on_error, slow): a method of a generated history-
 * carrying method writer (an object with `_write`, where documents go, and `_start`, its clock), in one
 * C call: `writer.method(*values)` writes the whole document with `writer._write(document)` and returns
 * None. Its history is the one the ContextVar `current` holds (a reader's PendingHop: `base` payload
 * bytes as read, `source` (id, index) or None, `read_ns`) plus this write's `_start()`, or a first hop
 * when it holds None, spliced as history_hop does; anything unusual (another pending object, a history
 * not as read, a clock beyond 64 bits) takes `prefix(now)`, the Python reference, which returns the
 * bytearray to continue. Then `event` and the values: those whose declared kind (`kinds`, one byte each)
 * the C path writes, the others by `encoders[i](bytearray, value)`; more than one as Java's sequence
 * `82 <u32 length> values`, none as an empty text. An AttributeError, TypeError, ValueError or
 * OverflowError raised on the way is replaced by `on_error(exception, values)` (which names the method
 * and the parameter), as the generated Python methods do. A call with keywords or another number of
 * values goes to `slow`, the generated Python method it stands for (defaults, Python's own argument
 * errors), which is also its `__wrapped__` (signatures, names). A method descriptor: `writer.method(...)`
 * calls it with the writer first, without a bound method object. */
typedef struct {
    PyObject_HEAD
    PyObject *current, *event, *kinds, *encoders, *prefix, *on_error, *slow;
    vectorcallfunc vectorcall;
    /* the writer class last seen (borrowed, compared only) and, while its version tag is the same, the
     * offsets of its `_write` and `_start` slots (0: not plain slots, looked up by name) */
    PyTypeObject *w_type;
    unsigned int w_version;
    Py_ssize_t write_off, start_off;
} HistoryCall;

static PyObject *str_write_attr, *str_start_attr;

/* 1: the pending hop's history spliced into `o`; 0: not the usual case (nothing written); -1: error */
static int history_call_prefix(Out *o, PyObject *pending, int64_t now) {
    if (pending == Py_None) return splice_hop(o, (const unsigned char *)"\0\0", 2, 0, 0, 0, &now, 1);
    if (!PyObject_TypeCheck(pending, &PendingHopType)) return 0; /* not a reader's: the reference decides */
    PendingHop *hop = (PendingHop *)pending;
    PyObject *base = hop->base;
    /* the carried payload as read; a message that carried none (a first hop's input: a writer without a
     * source id, or Java's plain appends) is the empty history's payload (no sources, no timings) */
    const unsigned char *bp;
    Py_ssize_t bn;
    if (base == Py_None) {
        bp = (const unsigned char *)"\0\0";
        bn = 2;
    } else if (base && PyBytes_CheckExact(base)) {
        bp = (const unsigned char *)PyBytes_AS_STRING(base);
        bn = PyBytes_GET_SIZE(base);
    } else {
        return 0; /* a MessageHistory (built, or set from Python): the reference encodes it */
    }
    int rc = 0;
    if (hop->c_hop) {
        int64_t timings[2] = {hop->read_c, now};
        return splice_hop(o, bp, bn, 1, hop->sid, hop->idx, timings, 2);
    }
    PyObject *source = hop->source, *read_ns = hop->read_ns;
    if (!source || !read_ns) return 0; /* (deleted: the reference reports it) */
    if (source == Py_None) {
        rc = splice_hop(o, bp, bn, 0, 0, 0, &now, 1);
    } else if (PyTuple_CheckExact(source) && PyTuple_GET_SIZE(source) == 2 && PyLong_CheckExact(read_ns)) {
        int o1 = 0, o2 = 0, o3 = 0;
        long long sid = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(source, 0), &o1);
        long long idx = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(source, 1), &o2);
        long long read = PyLong_AsLongLongAndOverflow(read_ns, &o3);
        if (PyErr_Occurred()) PyErr_Clear(); /* not ints: the reference reports it */
        else if (!o1 && !o2 && !o3) {
            int64_t timings[2] = {(int64_t)read, now};
            rc = splice_hop(o, bp, bn, 1, (int64_t)sid, (int64_t)idx, timings, 2);
        }
    }
    return rc;
}

/* the document for `values` with `clock`'s time (new reference), or NULL */
static PyObject *history_call_document(HistoryCall *self, PyObject *clock, PyObject *const *values, Py_ssize_t n) {
    PyObject *now_obj = call_clock(clock);
    if (!now_obj) return NULL;
    PyObject *pending = NULL, *buf = NULL, *result = NULL;
    Out o;
    out_init(&o);
    int rc = 0;
    if (PyLong_CheckExact(now_obj)) {
        int overflow = 0;
        long long now = PyLong_AsLongLongAndOverflow(now_obj, &overflow);
        if (!overflow && !(now == -1 && PyErr_Occurred())) {
            if (PyContextVar_Get(self->current, Py_None, &pending) < 0) goto done;
            rc = history_call_prefix(&o, pending, (int64_t)now);
            if (rc < 0) goto done;
        }
        PyErr_Clear();
    }
    if (!rc) {
        buf = PyObject_CallOneArg(self->prefix, now_obj);
        if (!buf) goto done;
        if (!PyByteArray_CheckExact(buf)) {
            PyErr_SetString(PyExc_TypeError, "a history prefix must be a bytearray");
            goto done;
        }
    }
    if (put(&o, PyBytes_AS_STRING(self->event), PyBytes_GET_SIZE(self->event)) < 0) goto done;
    Py_ssize_t seq = -1;
    if (n == 0 && put(&o, "\xe0", 1) < 0) goto done;
    if (n > 1) {
        if (put(&o, "\x82\0\0\0\0", 5) < 0) goto done;
        seq = (buf ? PyByteArray_GET_SIZE(buf) : 0) + o.len;
    }
    const unsigned char *kinds = (const unsigned char *)PyBytes_AS_STRING(self->kinds);
    for (Py_ssize_t i = 0; i < n; i++) {
        int done_c = put_scalar(&o, kinds[i], values[i]);
        if (done_c < 0) goto done;
        if (!done_c) {
            if (flush_to(&o, &buf) < 0) goto done;
            PyObject *r = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(self->encoders, i), buf, values[i], NULL);
            if (!r) goto done;
            Py_DECREF(r);
        }
    }
    if (buf) {
        if (flush(&o, buf) < 0) goto done;
        if (seq >= 0) {
            uint32_t len = (uint32_t)(PyByteArray_GET_SIZE(buf) - seq);
            memcpy(PyByteArray_AS_STRING(buf) + seq - 4, &len, 4);
        }
        result = Py_NewRef(buf);
    } else {
        if (seq >= 0) {
            uint32_t len = (uint32_t)(o.len - seq);
            memcpy(o.data + seq - 4, &len, 4);
        }
        result = PyBytes_FromStringAndSize(o.data, o.len);
    }
done:
    out_free(&o);
    Py_XDECREF(buf);
    Py_XDECREF(pending);
    Py_DECREF(now_obj);
    return result;
}

/* the raised argument error replaced by on_error(exception, values), as the generated methods do */
static void history_call_name_error(HistoryCall *self, PyObject *const *values, Py_ssize_t n) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError) && !PyErr_ExceptionMatches(PyExc_TypeError) &&
        !PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_OverflowError))
        return;
    PyObject *exc = take_raised();
    PyObject *args = exc ? PyTuple_New(n) : NULL;
    if (!args) {
        Py_XDECREF(exc);
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(args, i, Py_NewRef(values[i]));
    PyObject *named = PyObject_CallFunctionObjArgs(self->on_error, exc, args, NULL);
    Py_DECREF(args);
    if (!named) { /* on_error itself failed: that error stands, with the argument error as its context */
        PyObject *failed = take_raised();
        if (failed) {
            PyException_SetContext(failed, exc);
            raise_as_is(failed);
        } else {
            Py_DECREF(exc);
        }
        return;
    }
    if (named != exc) PyException_SetContext(named, Py_NewRef(exc)); /* as `raise` inside `except` */
    raise_as_is(named);
    Py_DECREF(exc);
}

/* The offset of `name` in instances of `tp` when it is a plain object slot (a member descriptor, found by
 * the generic getattr), else 0 */
static Py_ssize_t slot_offset(PyTypeObject *tp, PyObject *name) {
    PyObject *d = _PyType_Lookup(tp, name); /* borrowed */
    if (!d || !Py_IS_TYPE(d, &PyMemberDescr_Type)) return 0;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    return m->type == T_OBJECT_EX && m->offset > 0 ? m->offset : 0;
}

/* Learn where writers of class `tp` keep `_write` and `_start`: their slots' offsets while the class's
 * version tag stays (any change to the class or a base gives it a new one), or 0 (getattr each call) */
static void history_call_learn(HistoryCall *self, PyTypeObject *tp) {
    self->w_type = tp;
    self->write_off = self->start_off = 0;
    Py_ssize_t write_off = 0, start_off = 0;
    if (tp->tp_getattro == PyObject_GenericGetAttr) {
        write_off = slot_offset(tp, str_write_attr);
        start_off = write_off ? slot_offset(tp, str_start_attr) : 0;
    }
    if (!(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) { /* nothing to tell a change by: learn again */
        self->w_type = NULL;
        return;
    }
    self->w_version = tp->tp_version_tag;
    if (write_off && start_off) {
        self->write_off = write_off;
        self->start_off = start_off;
    }
}

static PyObject *history_call_vectorcall(HistoryCall *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), n = self->kinds ? PyBytes_GET_SIZE(self->kinds) : 0;
    if (!self->current) {
        PyErr_SetString(PyExc_RuntimeError, "HistoryCall was cleared");
        return NULL;
    }
    if (kwnames || nargs != 1 + n) return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    PyObject *w = args[0], *clock = NULL, *write = NULL;
    PyTypeObject *tp = Py_TYPE(w);
    if (tp != self->w_type || tp->tp_version_tag != self->w_version) history_call_learn(self, tp);
    if (self->write_off) { /* the slots' values, as getattr would find them (data descriptors win) */
        clock = Py_XNewRef(*(PyObject **)((char *)w + self->start_off));
        write = Py_XNewRef(*(PyObject **)((char *)w + self->write_off));
    }
    if (!clock || !write) { /* not plain slots, or unset: getattr says what it is */
        Py_XDECREF(clock);
        Py_XDECREF(write);
        clock = PyObject_GetAttr(w, str_start_attr);
        write = clock ? PyObject_GetAttr(w, str_write_attr) : NULL;
    }
    PyObject *doc = write ? history_call_document(self, clock, args + 1, n) : NULL;
    PyObject *r = doc ? PyObject_CallOneArg(write, doc) : NULL;
    Py_XDECREF(doc);
    Py_XDECREF(write);
    Py_XDECREF(clock);
    if (!r) {
        history_call_name_error(self, args + 1, n);
        return NULL;
    }
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* `writer.method` outside a call: a bound method, as for a function */
static PyObject *history_call_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *history_call_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *current, *event, *kinds, *encoders, *prefix, *on_error, *slow;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "HistoryCall takes no keywords");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!SSO!OOO:HistoryCall", &PyContextVar_Type, &current, &event, &kinds, &PyTuple_Type,
                          &encoders, &prefix, &on_error, &slow))
        return NULL;
    if (PyTuple_GET_SIZE(encoders) != PyBytes_GET_SIZE(kinds)) {
        PyErr_SetString(PyExc_ValueError, "one kind and one encoder per value");
        return NULL;
    }
    HistoryCall *self = (HistoryCall *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->current = Py_NewRef(current);
    self->event = Py_NewRef(event);
    self->kinds = Py_NewRef(kinds);
    self->encoders = Py_NewRef(encoders);
    self->prefix = Py_NewRef(prefix);
    self->on_error = Py_NewRef(on_error);
    self->slow = Py_NewRef(slow);
    self->vectorcall = (vectorcallfunc)history_call_vectorcall;
    return (PyObject *)self;
}

static int history_call_traverse(HistoryCall *self, visitproc visit, void *arg) {
    Py_VISIT(self->current);
    Py_VISIT(self->event);
    Py_VISIT(self->kinds);
    Py_VISIT(self->encoders);
    Py_VISIT(self->prefix);
    Py_VISIT(self->on_error);
    Py_VISIT(self->slow);
    return 0;
}

static int history_call_clear(HistoryCall *self) {
    Py_CLEAR(self->current);
    Py_CLEAR(self->event);
    Py_CLEAR(self->kinds);
    Py_CLEAR(self->encoders);
    Py_CLEAR(self->prefix);
    Py_CLEAR(self->on_error);
    Py_CLEAR(self->slow);
    return 0;
}

static void history_call_dealloc(HistoryCall *self) {
    PyObject_GC_UnTrack(self);
    history_call_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* __name__, __qualname__, __doc__, __module__: the Python method's */
static PyObject *history_call_slow_attr(HistoryCall *self, void *name) {
    if (!self->slow) {
        PyErr_SetString(PyExc_RuntimeError, "HistoryCall was cleared");
        return NULL;
    }
    return PyObject_GetAttrString(self->slow, (const char *)name);
}

static PyGetSetDef history_call_getset[] = {
    {"__name__", (getter)history_call_slow_attr, NULL, NULL, "__name__"},
    {"__qualname__", (getter)history_call_slow_attr, NULL, NULL, "__qualname__"},
    {"__doc__", (getter)history_call_slow_attr, NULL, NULL, "__doc__"},
    {"__module__", (getter)history_call_slow_attr, NULL, NULL, "__module__"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef history_call_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(HistoryCall, slow), READONLY, "the generated Python method"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject HistoryCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wire._speedups.HistoryCall",
    .tp_basicsize = sizeof(HistoryCall),
    .tp_dealloc = (destructor)history_call_dealloc,
    .tp_vectorcall_offset = offsetof(HistoryCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = (traverseproc)history_call_traverse,
    .tp_clear = (inquiry)history_call_clear,
    .tp_descr_get = history_call_get,
    .tp_getset = history_call_getset,
    .tp_members = history_call_members,
    .tp_new = history_call_new,
};

/* ------------------------------------------------------------------ records (wire.record.Layout) */
/* RecordLayout(kinds, Decimal, pack_slow, unpack_slow): `pack(*values)` -> bytes and `unpack(buf)` ->
 * tuple of one fixed sequence of record kinds, the bytes RecordWriter writes and RecordReader reads.
 * The C path takes only what it is sure of: exact ints in range, exact floats, exact str (UTF-8),
 * None as text, exact Decimals written in plain notation (no exponent), True/False; and the codes
 * RecordWriter writes. Anything else (a subclass, a value out of range, NaN, an exponent, Java's compact
 * numbers, bad bytes) goes to the Python slow path, which is the reference and reports the error.
 * Kinds are the indexes of wire.record.KINDS. */
enum { R_INT32 = 0, R_INT64 = 1, R_FLOAT64 = 2, R_TEXT = 3, R_DECIMAL = 4, R_BOOLEAN = 5 };

typedef struct {
    PyObject_HEAD
    PyObject *kinds; /* bytes, one kind per value */
    PyObject *decimal, *pack_slow, *unpack_slow;
    int direct_new; /* `decimal` is a type whose __init__ is object's: its tp_new alone makes one */
} RecordLayout;

static int record_traverse(RecordLayout *self, visitproc visit, void *arg) {
    Py_VISIT(self->kinds);
    Py_VISIT(self->decimal);
    Py_VISIT(self->pack_slow);
    Py_VISIT(self->unpack_slow);
    return 0;
}

static int record_clear(RecordLayout *self) {
    Py_CLEAR(self->kinds);
    Py_CLEAR(self->decimal);
    Py_CLEAR(self->pack_slow);
    Py_CLEAR(self->unpack_slow);
    return 0;
}

static void record_dealloc(RecordLayout *self) {
    PyObject_GC_UnTrack(self);
    record_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *record_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *kinds, *decimal, *pack_slow, *unpack_slow;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "RecordLayout takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "SOOO:RecordLayout", &kinds, &decimal, &pack_slow, &unpack_slow)) return NULL;
    const unsigned char *k = (const unsigned char *)PyBytes_AS_STRING(kinds);
    for (Py_ssize_t i = 0; i < PyBytes_GET_SIZE(kinds); i++)
        if (k[i] > R_BOOLEAN) {
            PyErr_Format(PyExc_ValueError, "unknown record kind code %d", (int)k[i]);
            return NULL;
        }
    RecordLayout *self = (RecordLayout *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->kinds = Py_NewRef(kinds);
    self->decimal = Py_NewRef(decimal);
    self->pack_slow = Py_NewRef(pack_slow);
    self->unpack_slow = Py_NewRef(unpack_slow);
    self->direct_new = PyType_Check(decimal) && ((PyTypeObject *)decimal)->tp_new &&
                       ((PyTypeObject *)decimal)->tp_init == PyBaseObject_Type.tp_init;
    return (PyObject *)self;
}

static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* A decimal's text the fast path takes: [+-] digits [. digits] [(e|E) [+-] 1 to 9 digits], at least
 * one digit before the exponent. Decimal() parses every such text to a finite value without a signal
 * whatever the context (the exponent is far inside its limits); anything else goes to the reader. */
static int decimal_text_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0, digits = 0;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    while (i < n && is_digit(s[i])) i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && is_digit(s[i])) i++, digits++;
    }
    if (!digits) return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        Py_ssize_t e = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        while (i < n && is_digit(s[i])) i++, e++;
        if (e < 1 || e > 9) return 0;
    }
    return i == n;
}

/* the header of a text of n bytes: E0+n up to 31, else B8 and the stop-bit length */
static int put_text_head(Out *o, Py_ssize_t n) {
    if (n < 32) {
        char *p = reserve(o, 1);
        if (!p) return -1;
        p[0] = (char)(0xE0 + n);
        return 0;
    }
    return put_stop_bit(o, 0xB8, (int64_t)n);
}

#define RECORD_SLOW 1 /* the value is not the fast path's: hand the whole record to Python */

static int record_put(Out *o, RecordLayout *self, int kind, PyObject *v) {
    int overflow = 0;
    switch (kind) {
    case R_INT32:
    case R_INT64: {
        if (!PyLong_CheckExact(v)) return RECORD_SLOW;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) return RECORD_SLOW;
        if (kind == R_INT32) {
            if (x < INT32_MIN || x > INT32_MAX) return RECORD_SLOW;
            return put_code_le(o, 0xA6, (uint64_t)x, 4);
        }
        return put_code_le(o, 0xA7, (uint64_t)x, 8);
    }
    case R_FLOAT64: {
        if (!PyFloat_CheckExact(v)) return RECORD_SLOW;
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        return put_code_le(o, 0x91, bits, 8);
    }
    case R_TEXT: {
        if (v == Py_None) return put(o, "\xbb", 1);
        if (!PyUnicode_CheckExact(v)) return RECORD_SLOW;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (!s) { /* a lone surrogate: the writer has Java's modified UTF-8 for it */
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
            PyErr_Clear();
            return RECORD_SLOW;
        }
        if (put_text_head(o, n) < 0) return -1;
        return put(o, s, n);
    }
    case R_DECIMAL: {
        if (Py_TYPE(v) != (PyTypeObject *)self->decimal) return RECORD_SLOW;
        PyObject *str = PyObject_Str(v);
        if (!str) return -1;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(str, &n);
        int rc = RECORD_SLOW;
        /* plain notation only: its scale is its count of digits after the point, always a Java int;
         * an exponent (or NaN, an infinity) goes to the writer, which checks it */
        if (s && decimal_text_ok((const unsigned char *)s, n) && !memchr(s, 'E', (size_t)n) && s[0] != '+')
            rc = put_text_head(o, n) < 0 ? -1 : put(o, s, n);
        else if (!s)
            rc = -1;
        Py_DECREF(str);
        return rc;
    }
    default: /* R_BOOLEAN */
        if (v == Py_True) return put(o, "\xb1", 1);
        if (v == Py_False) return put(o, "\xb0", 1);
        return RECORD_SLOW;
    }
}

static PyObject *record_pack(RecordLayout *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t n = PyBytes_GET_SIZE(self->kinds);
    if (nargs != n) {
        PyErr_Format(PyExc_TypeError, "pack() takes %zd values (%zd given)", n, nargs);
        return NULL;
    }
    const unsigned char *kinds = (const unsigned char *)PyBytes_AS_STRING(self->kinds);
    Out o;
    out_init(&o);
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = record_put(&o, self, kinds[i], args[i]);
        if (rc < 0) {
            out_free(&o);
            return NULL;
        }
        if (rc == RECORD_SLOW) {
            out_free(&o);
            PyObject *values = PyTuple_New(n);
            if (!values) return NULL;
            for (Py_ssize_t j = 0; j < n; j++) PyTuple_SET_ITEM(values, j, Py_NewRef(args[j]));
            PyObject *res = PyObject_CallOneArg(self->pack_slow, values);
            Py_DECREF(values);
            return res;
        }
    }
    PyObject *res = PyBytes_FromStringAndSize(o.data, o.len);
    out_free(&o);
    return res;
}

/* the value of `kind` at *pos, advancing *pos; NULL with no error set: not the fast path's */
static PyObject *record_get(RecordLayout *self, int kind, const unsigned char *p, Py_ssize_t len, Py_ssize_t *pos) {
    Py_ssize_t at = *pos;
    if (at >= len) return NULL;
    unsigned char code = p[at];
    switch (kind) {
    case R_INT32: {
        if (code != 0xA6 || len - at < 5) return NULL;
        int32_t x;
        memcpy(&x, p + at + 1, 4);
        *pos = at + 5;
        return PyLong_FromLong((long)x);
    }
    case R_INT64: {
        if (code != 0xA7 || len - at < 9) return NULL;
        int64_t x;
        memcpy(&x, p + at + 1, 8);
        *pos = at + 9;
        return PyLong_FromLongLong((long long)x);
    }
    case R_FLOAT64: {
        if (code != 0x91 || len - at < 9) return NULL;
        double d;
        memcpy(&d, p + at + 1, 8);
        *pos = at + 9;
        return PyFloat_FromDouble(d);
    }
    case R_TEXT:
    case R_DECIMAL: {
        if (code < 0xE0) return NULL;
        Py_ssize_t n = code - 0xE0;
        if (len - at - 1 < n) return NULL;
        const char *s = (const char *)p + at + 1;
        PyObject *v;
        if (kind == R_TEXT) {
            v = PyUnicode_DecodeUTF8(s, n, NULL);
        } else {
            if (!decimal_text_ok((const unsigned char *)s, n)) return NULL;
            PyObject *text = PyUnicode_DecodeASCII(s, n, NULL);
            if (!text) return NULL;
            if (self->direct_new) {
                /* Decimal's constructor without the generic call of a type around it (a tenth of
                 * a decimal record's unpack): its __init__ is object's, which does nothing */
                PyObject *args = PyTuple_Pack(1, text);
                PyTypeObject *t = (PyTypeObject *)self->decimal;
                v = args ? t->tp_new(t, args, NULL) : NULL;
                Py_XDECREF(args);
            } else {
                v = PyObject_CallOneArg(self->decimal, text);
            }
            Py_DECREF(text);
        }
        if (!v) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL; /* KeyboardInterrupt and the like */
            PyErr_Clear(); /* bad UTF-8 (the reader knows modified UTF-8) or a decimal it reports */
            return NULL;
        }
        *pos = at + 1 + n;
        return v;
    }
    default: /* R_BOOLEAN */
        if (code != 0xB1 && code != 0xB0) return NULL;
        *pos = at + 1;
        return Py_NewRef(code == 0xB1 ? Py_True : Py_False);
    }
}

static PyObject *record_unpack(RecordLayout *self, PyObject *buf) {
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* not a buffer: the reader says so */
        return PyObject_CallOneArg(self->unpack_slow, buf);
    }
    Py_ssize_t n = PyBytes_GET_SIZE(self->kinds);
    const unsigned char *kinds = (const unsigned char *)PyBytes_AS_STRING(self->kinds);
    PyObject *out = PyTuple_New(n);
    if (!out) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = record_get(self, kinds[i], (const unsigned char *)view.buf, view.len, &pos);
        if (!v) {
            PyBuffer_Release(&view);
            Py_DECREF(out);
            if (PyErr_Occurred()) return NULL;
            return PyObject_CallOneArg(self->unpack_slow, buf);
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef record_methods[] = {
    {"pack", (PyCFunction)(void (*)(void))record_pack, METH_FASTCALL,
     "pack(*values) -> bytes: the record's bytes (the slow path for anything unusual)"},
    {"unpack", (PyCFunction)record_unpack, METH_O,
     "unpack(buf) -> tuple: the record's values (the slow path for anything unusual)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RecordLayoutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "wire._speedups.RecordLayout",
    .tp_basicsize = sizeof(RecordLayout),
    .tp_dealloc = (destructor)record_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)record_traverse,
    .tp_clear = (inquiry)record_clear,
    .tp_doc = "RecordLayout(kinds, Decimal, pack_slow, unpack_slow): wire.record.Layout's pack and unpack.",
    .tp_methods = record_methods,
    .tp_new = record_new,
};

/* last_source(body) -> (source id, index) | None | False: the last source of the history that starts a
 * document body, read in place where it is in the usual binary layout (`BA 80 00 81 <u16> 86` and a
 * payload that checks out: n, n ids, n indexes, m, m timings within the block); None when that history
 * names no source; False for anything else (no history, another layout, a damaged one): the Python
 * reference, wire.history.last_source, then decides. */
static PyObject *last_source(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len;
    PyObject *result = NULL;
    if (len > 8 && p[0] == 0xBA && p[1] == 0x80 && p[2] == 0x00 && p[3] == 0x81 && p[6] == 0x86) {
        Py_ssize_t end = 6 + (p[4] | (Py_ssize_t)p[5] << 8), n = p[7], tpos = 8 + 12 * n;
        if (end <= len && tpos < end && tpos + 1 + 8 * (Py_ssize_t)p[tpos] <= end) {
            if (n == 0) {
                result = Py_NewRef(Py_None);
            } else {
                int32_t sid;
                int64_t idx;
                memcpy(&sid, p + 4 + 4 * n, 4);
                memcpy(&idx, p + 12 * n, 8);
                result = Py_BuildValue("(iL)", (int)sid, (long long)idx);
            }
        }
    }
    if (!result && !PyErr_Occurred()) result = Py_NewRef(Py_False);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef module_methods[] = {
    {"history_hop", (PyCFunction)(void (*)(void))history_hop, METH_FASTCALL,
     "history_hop(payload, source, timings) -> bytearray | None: a history spliced with one more hop"},
    {"last_source", (PyCFunction)last_source, METH_O,
     "last_source(body) -> (id, index) | None | False: a history's last source, read in place (False: "
     "not the usual layout)"},
    {"event_value", (PyCFunction)(void (*)(void))event_value, METH_FASTCALL,
     "event_value(document, table) -> (entry, value, end) | None"},
    {"event_call", (PyCFunction)(void (*)(void))event_call, METH_FASTCALL,
     "event_call(document, table) -> entry | None: event_value, then each handler(value)"},
    {"generic", (PyCFunction)(void (*)(void))generic, METH_FASTCALL,
     "generic(buf, start, end, document, depth, EventName, FieldNumber, Int64Hex) -> (value, end) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "wire._speedups", NULL, -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    str_name = PyUnicode_InternFromString("_name_");
    str_buf = PyUnicode_InternFromString("buf");
    str_pos = PyUnicode_InternFromString("pos");
    str_end = PyUnicode_InternFromString("end");
    str_type = PyUnicode_InternFromString("type");
    str_metadata = PyUnicode_InternFromString("metadata");
    str_index = PyUnicode_InternFromString("index");
    int_zero = PyLong_FromLong(0);
    PyObject *time_module = PyImport_ImportModule("time");
    monotonic_ns = time_module ? PyObject_GetAttrString(time_module, "monotonic_ns") : NULL;
    Py_XDECREF(time_module);
    if (!monotonic_ns) return NULL;
    str_write_attr = PyUnicode_InternFromString("_write");
    str_start_attr = PyUnicode_InternFromString("_start");
    if (!str_write_attr || !str_start_attr || PyType_Ready(&HistoryCallType) < 0 || PyType_Ready(&PendingHopType) < 0)
        return NULL;
    if (!str_metadata || !str_index || !int_zero) return NULL;
    PyObject *probe = PyContext_New(); /* (ContextLayout: CPython's, checked here rather than assumed) */
    if (!probe) return NULL;
    ContextLayout *layout = (ContextLayout *)probe;
    ctx_layout_ok = PyContext_Type.tp_basicsize == (Py_ssize_t)sizeof(ContextLayout) && layout->ctx_vars &&
                    strcmp(Py_TYPE(layout->ctx_vars)->tp_name, "hamt") == 0 && layout->ctx_prev == NULL;
    Py_DECREF(probe);
    if (!str_name || !str_buf || !str_pos || !str_end || !str_type || PyType_Ready(&PlanType) < 0 ||
        PyType_Ready(&DecodeType) < 0 || PyType_Ready(&ReadOneType) < 0 ||
        PyType_Ready(&EncodeType) < 0 || PyType_Ready(&RecordLayoutType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0 ||
        PyModule_AddObjectRef(m, "Decode", (PyObject *)&DecodeType) < 0 ||
        PyModule_AddObjectRef(m, "ReadOne", (PyObject *)&ReadOneType) < 0 ||
        PyModule_AddObjectRef(m, "Encode", (PyObject *)&EncodeType) < 0 ||
        PyModule_AddObjectRef(m, "RecordLayout", (PyObject *)&RecordLayoutType) < 0 ||
        PyModule_AddObjectRef(m, "HistoryCall", (PyObject *)&HistoryCallType) < 0 ||
        PyModule_AddObjectRef(m, "PendingHop", (PyObject *)&PendingHopType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
