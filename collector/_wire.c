/* spanrl.collector._wire: a fast path from OTLP ExportTraceServiceRequest bytes to the spans table's
 * column buffers (the Arrow layout of `encoding.SPANS_ARROW_SCHEMA`), with no Python object per span,
 * attribute or array element, and without the GIL while it reads.
 *
 * It is NOT a second implementation of every rule. It accepts only the common, valid shape and returns
 * None for anything else, so that `encoding.encode_request` (the reference) handles the whole request
 * and every error message, rejection and partial success stays as it is:
 *   unknown field numbers or wire types, a singular field seen twice (upb would merge or overwrite),
 *   invalid UTF-8 in any string field (upb rejects it: checked here for every string, kept or not),
 *   duplicate attribute keys, kvlist or bytes values (outside the token keys), string values in the
 *   typed int/float hot keys, a double in a typed string hot key, bad id lengths, times >= 2^63, token
 *   arrays that are not whole int32 / float32 (or base64 / raw bytes of them), a request without spans.
 * One writer per column: values, int32 offsets (strings, lists) and one validity byte per row (packed
 * into an Arrow bitmap at the end). JSON text matches orjson's output byte for byte in the cases tested
 * (orjson's float format: shortest round-trip digits, exponent below 1e-5 and from 1e16).
 *
 * Files: wire.h (buffer, wire reader, shared types), wire_text.c (UTF-8, AnyValue, JSON text),
 * wire_attrs.c (attribute lists, hot keys, token arrays), wire_spans.c (the span walk, the columns);
 * this file is the Python glue.
 */
#include "wire.h"

/* ---- Python glue --------------------------------------------------------------------------------- */
/* One column -> (validity bitmap or None, offsets or None, values, null count). */
static PyObject *col_tuple(const Col *c, Py_ssize_t n) {
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
    if (c->has_offsets) offsets = PyBytes_FromStringAndSize(c->offsets.p, (Py_ssize_t)c->offsets.len);
    else offsets = Py_NewRef(Py_None);
    values = PyBytes_FromStringAndSize(c->values.p ? c->values.p : "", (Py_ssize_t)c->values.len);
    if (!valid || !offsets || !values) {
        Py_XDECREF(valid);
        Py_XDECREF(offsets);
        Py_XDECREF(values);
        return NULL;
    }
    return Py_BuildValue("(NNNn)", valid, offsets, values, c->nulls);
}

static PyObject *decode(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Dec *d = calloc(1, sizeof *d);
    if (!d) { PyBuffer_Release(&view); return PyErr_NoMemory(); }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = dec_run(d, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (!ok) {
        result = Py_None;
        Py_INCREF(result);
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
    {"decode", decode, METH_O,
     "decode(body) -> (rows, columns) or None: an OTLP ExportTraceServiceRequest's spans as the spans\n"
     "table's column buffers, one (validity bitmap | None, int32 offsets | None, values, null count)\n"
     "per column in SPANS_ARROW_SCHEMA order; None when the request is not in the shape this fast path\n"
     "accepts (the Python path then decides)."},
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
    PyObject *m = PyModule_Create(&MODULE);
    if (m && PyModule_AddIntConstant(m, "N_COLUMNS", N_COLS) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
