/* spanrl.instrumentation._encode: a span snapshot (exporter.snapshot's tuple) as its OTLP `ScopeSpans.spans`
 * field, for the agent's export thread: ~0.4 us a chat span against ~4.5 us in Python (both warm, in the
 * batch's loop). Spans are snapshotted where they end, on the agent's thread, and encoded here in batches,
 * so this code stays in the caches while it runs (called once per span between two LLM calls, cold, it
 * cost as much as the Python snapshot it would replace: measured, see docs/measurements.md).
 *
 * It is NOT a second implementation of every rule. exporter.py's Python encoder is the reference; this one
 * takes only the common shape and returns None for anything else, which the caller then encodes in Python
 * (so every odd case keeps the reference's behaviour and its errors): events, links or anything dropped
 * from them, attribute values other than exact str, bool, int (int64), float or a tuple/list of those,
 * keys that are not exact str, text that is not valid UTF-8 (lone surrogates), ids or times out of their
 * range, a kind or status code out of range. For what it takes, the bytes equal the Python encoder's byte
 * for byte (tests/instrumentation/test_span_exporter.py compares them over random spans).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---- an output buffer: on the stack, moved to the heap past its size --------------------------------- */
typedef struct {
    char *p;
    size_t len, cap;
    char stack[2048];
} Buf;

static void buf_init(Buf *b) { b->p = b->stack; b->len = 0; b->cap = sizeof b->stack; }
static void buf_free(Buf *b) { if (b->p != b->stack) PyMem_Free(b->p); }

/* Room for n more bytes; 0, or -1 with MemoryError set. */
static int reserve(Buf *b, size_t n) {
    if (b->len + n <= b->cap) return 0;
    size_t cap = b->cap * 2;
    while (cap < b->len + n) cap *= 2;
    char *p = PyMem_Malloc(cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    memcpy(p, b->p, b->len);
    buf_free(b);
    b->p = p;
    b->cap = cap;
    return 0;
}

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) { v >>= 7; n++; }
    return n;
}
/* These assume room was reserved: a varint takes at most 10 bytes. */
static void put_byte(Buf *b, unsigned char c) { b->p[b->len++] = (char)c; }
static void put_varint(Buf *b, uint64_t v) {
    while (v >= 0x80) { put_byte(b, (unsigned char)((v & 0x7F) | 0x80)); v >>= 7; }
    put_byte(b, (unsigned char)v);
}
static void put_le(Buf *b, uint64_t v, int n) { for (int i = 0; i < n; i++) put_byte(b, (unsigned char)(v >> (8 * i))); }
static void put_be(Buf *b, uint64_t v, int n) { for (int i = n - 1; i >= 0; i--) put_byte(b, (unsigned char)(v >> (8 * i))); }

/* ---- values: 1 = taken, 0 = declined (no exception), -1 = error (exception set) ------------------------ */

/* The UTF-8 of an exact str. An ASCII str is its own UTF-8; any other is converted into a bytes object held
 * in `owned` (PyUnicode_AsUTF8AndSize would keep a UTF-8 copy inside the agent's string for its lifetime). */
typedef struct { const char *p; Py_ssize_t n; PyObject *owned; } Text;

/* 1, or 0 (exception cleared) when it has no UTF-8 (lone surrogates); release() it after use. */
static int text_of(PyObject *s, Text *t) {
    t->owned = NULL;
    if (PyUnicode_IS_ASCII(s)) {
        t->p = PyUnicode_AsUTF8AndSize(s, &t->n);  /* the str's own data: no copy */
    } else if ((t->owned = PyUnicode_AsUTF8String(s))) {
        t->p = PyBytes_AS_STRING(t->owned);
        t->n = PyBytes_GET_SIZE(t->owned);
    } else {
        t->p = NULL;
    }
    if (t->p) return 1;
    PyErr_Clear();
    return 0;
}
static void release(Text *t) { Py_CLEAR(t->owned); }

/* A length-delimited text field (room reserved): tag, length, UTF-8. */
static void put_text(Buf *b, unsigned char tag, const Text *t) {
    put_byte(b, tag);
    put_varint(b, (uint64_t)t->n);
    memcpy(b->p + b->len, t->p, (size_t)t->n);
    b->len += (size_t)t->n;
}
/* Its size, or 0 for an empty one (proto3 writes no empty string field). */
static size_t text_field_size(const Text *t) { return t->n ? 1 + varint_size((uint64_t)t->n) + (size_t)t->n : 0; }

/* An exact int in 0 .. 2**64 - 1 (an id, a time) as a uint64; 0 (declined) otherwise. */
static int as_u64(PyObject *v, uint64_t *out) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    long long small = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (small == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    if (!overflow) {
        if (small < 0) return 0;
        *out = (uint64_t)small;
        return 1;
    }
    if (overflow < 0) return 0;
    unsigned long long big = PyLong_AsUnsignedLongLong(v);
    if (big == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    *out = big;
    return 1;
}

/* The size of a scalar's AnyValue message (oneof members are written even at their default); 0 = declined.
 * A str's text is held until release_scalar(). */
typedef struct { int kind; Text t; int64_t i; double d; } Scalar;
enum { S_STR = 1, S_BOOL, S_INT, S_DOUBLE };

static size_t scalar(PyObject *v, Scalar *out) {
    out->kind = 0;
    if (PyUnicode_CheckExact(v)) {
        if (!text_of(v, &out->t)) return 0;
        out->kind = S_STR;
        return 1 + varint_size((uint64_t)out->t.n) + (size_t)out->t.n;  /* even empty: a oneof member */
    }
    if (PyBool_Check(v)) { out->kind = S_BOOL; out->i = v == Py_True; return 2; }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
        out->kind = S_INT;
        out->i = x;
        return 1 + varint_size((uint64_t)x);
    }
    if (PyFloat_CheckExact(v)) { out->kind = S_DOUBLE; out->d = PyFloat_AS_DOUBLE(v); return 9; }
    return 0;
}
static void release_scalar(Scalar *s) { if (s->kind == S_STR) release(&s->t); }

static void put_scalar(Buf *b, const Scalar *s) {
    switch (s->kind) {
    case S_STR: put_text(b, 0x0a, &s->t); break;  /* written even when empty: a oneof member */
    case S_BOOL: put_byte(b, 0x10); put_byte(b, (unsigned char)s->i); break;
    case S_INT: put_byte(b, 0x18); put_varint(b, (uint64_t)s->i); break;
    default: { uint64_t bits; memcpy(&bits, &s->d, 8); put_byte(b, 0x21); put_le(b, bits, 8); }
    }
}

/* One span attribute: field 9 (KeyValue: key = 1, value = 2): a scalar, or a tuple/list as an ArrayValue
 * (AnyValue field 5) of scalar AnyValues (field 1), whose sizes are taken in a first pass. */
static int put_attribute(Buf *b, PyObject *key, PyObject *value) {
    Text k;
    if (!PyUnicode_CheckExact(key) || !text_of(key, &k)) return 0;
    size_t key_size = text_field_size(&k);
    Scalar s;
    int array = 0, r = 1;
    Py_ssize_t count = 0;
    PyObject **items = NULL;
    size_t value_size = scalar(value, &s), elements = 0;
    if (!value_size) {
        if (!PyTuple_CheckExact(value) && !PyList_CheckExact(value)) { r = 0; goto done; }
        array = 1;
        count = PySequence_Fast_GET_SIZE(value);
        items = PySequence_Fast_ITEMS(value);  /* NULL for an empty list: never read then */
        for (Py_ssize_t i = 0; i < count; i++) {
            size_t n = scalar(items[i], &s);
            release_scalar(&s);
            if (!n) { r = 0; goto done; }
            elements += 1 + varint_size(n) + n;
        }
        value_size = 1 + varint_size(elements) + elements;
    }
    size_t kv = key_size + 1 + varint_size(value_size) + value_size;
    if (reserve(b, 1 + 10 + kv) < 0) { r = -1; goto done; }
    put_byte(b, 0x4a);
    put_varint(b, kv);
    if (k.n) put_text(b, 0x0a, &k);
    put_byte(b, 0x12);
    put_varint(b, value_size);
    if (!array) {
        put_scalar(b, &s);
        goto done;
    }
    put_byte(b, 0x2a);
    put_varint(b, elements);
    for (Py_ssize_t i = 0; i < count; i++) {
        size_t n = scalar(items[i], &s);  /* the same items, each taken above */
        put_byte(b, 0x0a);
        put_varint(b, n);
        put_scalar(b, &s);
        release_scalar(&s);
    }
done:
    if (!array) release_scalar(&s);
    release(&k);
    return r;
}

/* ---- the span ------------------------------------------------------------------------------------------ */
typedef struct {
    PyObject *trace_id, *span_id, *trace_state, *parent_id, *name, *start, *end, *status_description;
    int parent_remote, kind, status_code;
    long long dropped_attributes;
    /* attributes: keys and values as two runs of the snapshot */
    PyObject **keys, **values;
    Py_ssize_t count;
} Span;

static PyObject *SIXTY_FOUR;

/* An id as `size` (8 or 16) big-endian bytes, field `tag`. */
static int put_id(Buf *b, unsigned char tag, PyObject *id, int size) {
    uint64_t lo, hi = 0;
    if (size == 8) {
        if (!as_u64(id, &lo)) return 0;
    } else {
        if (!PyLong_CheckExact(id)) return 0;
        PyObject *high = PyNumber_Rshift(id, SIXTY_FOUR);  /* negative stays negative: declined below */
        if (!high) return -1;
        int ok = as_u64(high, &hi);
        Py_DECREF(high);
        if (!ok) return 0;
        lo = PyLong_AsUnsignedLongLongMask(id);
        if (lo == (uint64_t)-1 && PyErr_Occurred()) return -1;
    }
    put_byte(b, tag);
    put_byte(b, (unsigned char)size);
    if (size == 16) put_be(b, hi, 8);
    put_be(b, lo, 8);
    return 1;
}

static int put_string_field(Buf *b, unsigned char tag, PyObject *s) {
    Text t;
    if (!PyUnicode_CheckExact(s) || !text_of(s, &t)) return 0;
    int r = reserve(b, text_field_size(&t)) < 0 ? -1 : 1;
    if (r > 0 && t.n) put_text(b, tag, &t);
    release(&t);
    return r;
}

#define STEP(call) do { int r_ = (call); if (r_ <= 0) return r_; } while (0)

static int put_span(Buf *b, const Span *s) {
    if (reserve(b, 64) < 0) return -1;
    STEP(put_id(b, 0x0a, s->trace_id, 16));
    STEP(put_id(b, 0x12, s->span_id, 8));
    if (s->trace_state != Py_None) STEP(put_string_field(b, 0x1a, s->trace_state));
    if (reserve(b, 64) < 0) return -1;
    if (s->parent_id != Py_None) STEP(put_id(b, 0x22, s->parent_id, 8));
    STEP(put_string_field(b, 0x2a, s->name));
    if (s->kind < 0 || s->kind > 4) return 0;
    if (reserve(b, 32) < 0) return -1;
    put_byte(b, 0x30);
    put_byte(b, (unsigned char)(s->kind + 1));
    uint64_t start = 0, end = 0;
    if (s->start != Py_None && !as_u64(s->start, &start)) return 0;
    if (s->end != Py_None && !as_u64(s->end, &end)) return 0;
    if (start) { put_byte(b, 0x39); put_le(b, start, 8); }
    if (end) { put_byte(b, 0x41); put_le(b, end, 8); }
    for (Py_ssize_t i = 0; i < s->count; i++) STEP(put_attribute(b, s->keys[i], s->values[i]));
    if (s->dropped_attributes < 0) return 0;
    if (reserve(b, 32) < 0) return -1;
    if (s->dropped_attributes) { put_byte(b, 0x50); put_varint(b, (uint64_t)s->dropped_attributes); }
    /* status (field 15): message = 2, code = 3 */
    if (s->status_code < 0 || s->status_code > 2) return 0;
    Text d = {"", 0, NULL};
    if (s->status_description != Py_None
        && (!PyUnicode_CheckExact(s->status_description) || !text_of(s->status_description, &d)))
        return 0;
    size_t status = text_field_size(&d) + (s->status_code ? 2 : 0);
    if (reserve(b, 32 + status) < 0) { release(&d); return -1; }
    put_byte(b, 0x7a);
    put_varint(b, status);
    if (d.n) put_text(b, 0x12, &d);
    release(&d);
    if (s->status_code) { put_byte(b, 0x18); put_byte(b, (unsigned char)s->status_code); }
    /* flags (field 16, fixed32): HAS_IS_REMOTE, and IS_REMOTE for a remote parent */
    put_byte(b, 0x85);
    put_byte(b, 0x01);
    put_le(b, s->parent_remote ? 0x300 : 0x100, 4);
    return 1;
}

/* The span as a ScopeSpans.spans field (tag 2, length, body): bytes, None when declined, NULL on error. */
static PyObject *field(const Span *s) {
    Buf b;
    buf_init(&b);
    b.len = 11;  /* room for the tag and length, written once the body's size is known */
    int r = put_span(&b, s);
    PyObject *out;
    if (r < 0) {
        out = NULL;
    } else if (r == 0) {
        out = Py_NewRef(Py_None);
    } else {
        size_t body = b.len - 11, head = 1 + varint_size(body);
        b.len = 11 - head;
        put_byte(&b, 0x12);
        put_varint(&b, body);
        out = PyBytes_FromStringAndSize(b.p + 11 - head, (Py_ssize_t)(head + body));
    }
    buf_free(&b);
    return out;
}

/* ---- encode_snapshot(snap) ------------------------------------------------------------------------------ */
/* exporter.snapshot's layout: (resource part, scope part, trace id, span id, trace state, parent id, parent
 * remote, name, kind, start, end, events, links, status code, status description, dropped attributes,
 * dropped events, dropped links, *keys, *values) */
enum { FIXED = 18 };

static PyObject *encode_snapshot(PyObject *Py_UNUSED(module), PyObject *snap) {
    if (!PyTuple_CheckExact(snap) || PyTuple_GET_SIZE(snap) < FIXED || (PyTuple_GET_SIZE(snap) - FIXED) % 2)
        Py_RETURN_NONE;
    PyObject **f = &PyTuple_GET_ITEM(snap, 0);
    if (f[11] != Py_None || f[12] != Py_None || !PyLong_CheckExact(f[8]) || !PyLong_CheckExact(f[13])
        || !PyLong_CheckExact(f[15]) || !PyLong_CheckExact(f[16]) || !PyLong_CheckExact(f[17])
        || PyLong_AsLong(f[16]) != 0 || PyLong_AsLong(f[17]) != 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    long kind = PyLong_AsLong(f[8]), code = PyLong_AsLong(f[13]);  /* range-checked before the casts */
    Span s = {.trace_id = f[2], .span_id = f[3], .trace_state = f[4], .parent_id = f[5], .name = f[7],
              .start = f[9], .end = f[10], .status_description = f[14], .parent_remote = f[6] == Py_True,
              .kind = kind >= 0 && kind <= 4 ? (int)kind : -1, .status_code = code >= 0 && code <= 2 ? (int)code : -1,
              .dropped_attributes = PyLong_AsLongLong(f[15]), .count = (PyTuple_GET_SIZE(snap) - FIXED) / 2};
    if (PyErr_Occurred() || (f[6] != Py_True && f[6] != Py_False)) { PyErr_Clear(); Py_RETURN_NONE; }
    s.keys = f + FIXED;
    s.values = f + FIXED + s.count;
    return field(&s);
}

static PyMethodDef METHODS[] = {
    {"encode_snapshot", encode_snapshot, METH_O,
     "encode_snapshot(snap) -> the ScopeSpans.spans field of an exporter.snapshot tuple, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_encode", "The agent's span encoder in C.", -1, METHODS};

PyMODINIT_FUNC PyInit__encode(void) {
    if (!(SIXTY_FOUR = PyLong_FromLong(64))) return NULL;
    return PyModule_Create(&MODULE);
}
