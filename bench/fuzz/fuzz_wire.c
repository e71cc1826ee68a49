/* libFuzzer harness for the collector's C protobuf decoder (collector/wire_*.c), built by
 * bench/fuzz/run.py with clang: ASan + UBSan everywhere (UBSan aborting on the first report), libFuzzer's
 * coverage in the decoder's files only (this file and the mutator are not what is measured).
 *
 * Every input: dec_run on it (no budget), and when it accepts the body
 *   - the columns are checked: a validity byte per row, int32 offsets from 0 that never decrease and
 *     end at the values' length, fixed-width values n x width, every string column valid UTF-8 (Arrow
 *     takes the buffers as they are);
 *   - one in four runs again with half the bytes it used as its budget: it must stop with `over` set
 *     (the budget path never declines a body it accepts, nor leaks, nor crashes).
 * With -DFUZZ_DIFF the harness also embeds Python and links _wire.c: the sanitized decoder is handed to
 * bench/fuzz/differential.py (`use_wire`) and `check(body)` compares it with the Python path on every
 * input (AssertionError -> abort -> a crash libFuzzer saves). FUZZ_PYTHON names the venv's python.
 * The structure-aware mutator is in proto_mutator.c.
 */
#include "../../collector/wire.h"

#include <stdio.h>

static int utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { k = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; cp = c & 0x07; }
        else return 0;
        if (i + k >= n) return 0; /* its k continuation bytes are there */
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += k + 1;
    }
    return 1;
}

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "fuzz_wire: check failed: %s (column %d)\n", #x, col); abort(); } } while (0)

/* Fixed width of a column without offsets, element width of a list column, 1 for strings. */
static size_t width(int col) {
    switch (col) {
        case C_START: case C_END: case C_REWARD: return 8;
        case C_ATTEMPT: case C_POLICY: case C_PROMPT: case C_COMPLETION: case C_LOGPROBS: return 4;
        default: return 1;
    }
}

static void check_columns(const Dec *d) {
    size_t n = (size_t)d->n;
    for (int col = 0; col < N_COLS; col++) {
        const Col *c = &d->cols[col];
        size_t w = width(col), nulls = 0;
        CHECK(c->valid.len == n);
        for (size_t i = 0; i < n; i++) nulls += !c->valid.p[i];
        CHECK(nulls == (size_t)c->nulls);
        if (!c->has_offsets) {
            CHECK(c->values.len == n * w);
            continue;
        }
        CHECK(c->offsets.len == 4 * (n + 1));
        int32_t prev = 0, o;
        for (size_t i = 0; i <= n; i++) {
            memcpy(&o, c->offsets.p + 4 * i, 4);
            CHECK(i ? o >= prev : o == 0);
            CHECK(!i || c->valid.p[i - 1] || o == prev); /* a null row is empty */
            prev = o;
        }
        CHECK((size_t)prev * w == c->values.len);
        if (w == 1) CHECK(utf8_valid((const uint8_t *)c->values.p, c->values.len));
    }
}

#ifdef FUZZ_DIFF
PyMODINIT_FUNC PyInit__wire(void);
static PyObject *diff_check;

static void py_fail(const char *what) {
    fprintf(stderr, "fuzz_wire: %s\n", what);
    PyErr_Print();
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0; /* SIGSEGV, SIGINT... stay libFuzzer's and ASan's */
    const char *python = getenv("FUZZ_PYTHON");
    if (python && PyStatus_Exception(PyConfig_SetBytesString(&config, &config.executable, python))) abort();
    if (PyStatus_Exception(Py_InitializeFromConfig(&config))) abort();
    PyConfig_Clear(&config);
    PyObject *wire = PyInit__wire();
    if (!wire) py_fail("PyInit__wire failed");
    PyObject *mod = PyImport_ImportModule("differential");
    if (!mod) py_fail("cannot import bench/fuzz/differential.py (PYTHONPATH)");
    PyObject *r = PyObject_CallMethod(mod, "use_wire", "O", wire);
    if (!r) py_fail("differential.use_wire failed");
    Py_DECREF(r);
    diff_check = PyObject_GetAttrString(mod, "check");
    if (!diff_check) py_fail("no differential.check");
    Py_DECREF(mod);
    return 0;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) { hot_init(); ready = 1; } /* PyInit__wire's part that the decoder needs */
    Dec *d = calloc(1, sizeof *d);
    if (!d) abort();
    int ok = dec_run(d, data, size, SIZE_MAX), col = -1;
    CHECK(!d->budget.over);
    if (ok) check_columns(d);
    size_t used = d->budget.used;
    dec_free(d);
    free(d);
    if (ok && (size + used) % 4 == 0) { /* a quarter of them: the rest of the work is the same */
        d = calloc(1, sizeof *d);
        if (!d) abort();
        CHECK(!dec_run(d, data, size, used / 2) && d->budget.over && d->budget.used > used / 2);
        dec_free(d);
        free(d);
    }
#ifdef FUZZ_DIFF
    PyObject *r = PyObject_CallFunction(diff_check, "y#", (const char *)data, (Py_ssize_t)size);
    if (!r) py_fail("the two decoders disagree (differential.check raised)");
    Py_DECREF(r);
#endif
    return 0;
}
