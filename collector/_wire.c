/* spanrl.collector._wire: a fast path from OTLP ExportTraceServiceRequest bytes to the spans table's
 * column buffers (the Arrow layout of `encoding.SPANS_ARROW_SCHEMA`), with no Python object per span,
 * attribute or array element, and without the GIL while it reads.
 *
 * It is NOT a second implementation of every rule. It accepts only the common, valid shape and returns
 * None for anything else, so that `encoding.encode_request` (the reference) handles the whole request
 * and every error message, rejection and partial success stays as it is:
 *   unknown field numbers or wire types, a singular field seen twice (upb would merge or overwrite),
 *   a tag or length varint longer than 5 bytes (upb refuses those), invalid UTF-8 in any string field
 *   (upb rejects it: checked here for every string, kept or not), duplicate attribute keys (a hash set
 *   past 16 keys), kvlist or bytes values (outside the token keys), arrays nested past MAX_DEPTH (the
 *   Python path refuses those), string values in the typed int/float hot keys, a double in a typed
 *   string hot key, bad id lengths, times >= 2^63, token arrays that are not whole int32 / float32 (or
 *   base64 / raw bytes of them), a request without spans.
 * One writer per column: values, int32 offsets (strings, lists) and one validity byte per row (packed
 * into an Arrow bitmap at the end), handed to Python without a copy. JSON text matches orjson's output
 * byte for byte (orjson's float format: shortest round-trip digits, exponent below 1e-5 and from 1e16;
 * every power of two tested). Every allocation counts against the caller's `limit` as it is made: past
 * it decode() stops and says how far it got, so a request whose columns outgrow its memory reservation
 * (a large resource repeated in every row) holds more of the budget or is refused, never decoded whole.
 * bench/fuzz/ fuzzes all of it under ASan + UBSan (libFuzzer) and against the Python path.
 *
 * Files: wire.h (buffer, wire reader, shared types), wire_text.c (UTF-8, AnyValue, JSON text),
 * wire_attrs.c (attribute lists, hot keys, token arrays), wire_spans.c (the span walk, the columns);
 * this file is the Python glue.
 */
#include "wire.h"

/* ---- Python glue --------------------------------------------------------------------------------- */
/* A decoder buffer handed to Python without a copy: a read-only buffer object that frees it. */
typedef struct { PyObject_HEAD char *p; Py_ssize_t len; } Owned;

static int owned_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Owned *o = (Owned *)self;
    return PyBuffer_FillInfo(view, self, o->p ? o->p : (char *)"", o->len, 1, flags);
}
static void owned_dealloc(PyObject *self) {
    free(((Owned *)self)->p);
    Py_TYPE(self)->tp_free(self);
}
static Py_ssize_t owned_len(PyObject *self) { return ((Owned *)self)->len; }
static PyBufferProcs OWNED_BUFFER = {owned_getbuffer, NULL};
static PySequenceMethods OWNED_SEQ = {.sq_length = owned_len};
static PyTypeObject OWNED_TYPE = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "spanrl.collector._wire.Buffer",
    .tp_basicsize = sizeof(Owned),
    .tp_dealloc = owned_dealloc,
    .tp_as_buffer = &OWNED_BUFFER,
    .tp_as_sequence = &OWNED_SEQ,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes of one decoded column (read-only buffer; freed with the object).",
};
/* The buffer's bytes as an Owned object (b is left empty), or NULL with an exception set. */
static PyObject *take(Buf *b) {
    Owned *o = PyObject_New(Owned, &OWNED_TYPE);
    if (!o) return NULL;
    o->p = b->p;
    o->len = (Py_ssize_t)b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

/* One column -> (validity bitmap or None, offsets or None, values, null count). */
static PyObject *col_tuple(Col *c, Py_ssize_t n) {
    PyObject *valid, *offsets, *values;
    if (c->nulls) {
        valid = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
        if (valid) {
            uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(valid);
            memset(bits, 0, (size_t)(n + 7) / 8);
            for (Py_ssize_t i = 0; i < n; i++) if (c->valid.p[i]) bits[i >> 3] |= (uint8_t)(1 << (i & 7));
        }
    } else {
        valid = Py_NewRef(Py_None);
    }
    offsets = c->has_offsets ? take(&c->offsets) : Py_NewRef(Py_None);
    values = take(&c->values);
    if (!valid || !offsets || !values) {
        Py_XDECREF(valid);
        Py_XDECREF(offsets);
        Py_XDECREF(values);
        return NULL;
    }
    return Py_BuildValue("(NNNn)", valid, offsets, values, c->nulls);
}

/* decode(body, limit=-1): see METHODS. */
static PyObject *decode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t limit = -1;
    if (!PyArg_ParseTuple(args, "y*|n:decode", &view, &limit)) return NULL;
    Dec *d = calloc(1, sizeof *d);
    if (!d) { PyBuffer_Release(&view); return PyErr_NoMemory(); }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = dec_run(d, view.buf, (size_t)view.len, limit < 0 ? SIZE_MAX : (size_t)limit);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (!ok) {
        result = d->budget.over ? PyLong_FromSize_t(d->budget.used) : Py_NewRef(Py_None);
    } else {
        PyObject *cols = PyTuple_New(N_COLS);
        for (int i = 0; cols && i < N_COLS; i++) {
            PyObject *t = col_tuple(&d->cols[i], d->n);
            if (!t) { Py_CLEAR(cols); break; }
            PyTuple_SET_ITEM(cols, i, t);
        }
        if (cols) result = Py_BuildValue("(nN)", d->n, cols);
    }
    dec_free(d);
    free(d);
    return result;
}

static PyMethodDef METHODS[] = {
    {"decode", decode, METH_VARARGS,
     "decode(body, limit=-1) -> (rows, columns), None or an int: an OTLP ExportTraceServiceRequest's\n"
     "spans as the spans table's column buffers, one (validity bitmap | None, int32 offsets | None,\n"
     "values, null count) per column in SPANS_ARROW_SCHEMA order (offsets and values: read-only buffer\n"
     "objects); None when the request is not in the shape this fast path accepts (the Python path then\n"
     "decides); an int when its buffers would take more than `limit` bytes (counted as allocated; -1: no\n"
     "limit): the bytes reached when it stopped."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_wire", "OTLP protobuf -> span column buffers (fast path).", -1, METHODS};

PyMODINIT_FUNC PyInit__wire(void) {
    uint16_t probe = 1;
    if (*(uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "spanrl.collector._wire needs a little-endian machine");
        return NULL;
    }
    hot_init();
    if (PyType_Ready(&OWNED_TYPE) < 0) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (m && PyModule_AddIntConstant(m, "N_COLUMNS", N_COLS) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
