/* Shared by the C files of spanrl.collector._wire (see _wire.c for what the fast path accepts):
 * the growable buffer and the protobuf wire reader (inline: they run per field), the parsed value
 * and column types, and the functions one file offers the others. Every function returns 1 when it
 * went on and 0 when the request leaves the fast path (the Python decoder then takes all of it).
 */
#ifndef SPANRL_WIRE_H
#define SPANRL_WIRE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NEED(x) do { if (!(x)) return 0; } while (0)
/* Arrays nested in one attribute value, at most (encoding.MAX_NESTING, the documented limit): deeper
 * ones go to the Python path, which refuses the request with INVALID_ARGUMENT / 400. */
#define MAX_DEPTH 16

/* ---- output budget: every byte the decoder allocates counts, as it is allocated ------------------ */
/* `over` is set when an allocation would pass `limit`; the decode then stops (it is not declined:
 * the caller holds more of the collector's memory budget and calls again, or refuses the request), and
 * `used` says what it would have reached (> limit). */
typedef struct { size_t used, limit; int over; } Budget;

static inline int budget_take(Budget *bu, size_t extra) {
    if (!bu) return 1;
    if (extra > bu->limit - bu->used) { bu->over = 1; bu->used += extra; return 0; }
    bu->used += extra;
    return 1;
}
static inline void budget_give(Budget *bu, size_t n) { if (bu) bu->used -= n; }
/* `*p` (an array of `*cap` elements of `size` bytes) grown to hold at least `need` of them. */
static inline int grow_array(Budget *bu, void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 1;
    size_t n = *cap ? *cap : 32;
    while (n < need) n *= 2;
    NEED(budget_take(bu, (n - *cap) * size));
    void *q = realloc(*p, n * size);
    NEED(q);
    *p = q;
    *cap = n;
    return 1;
}

/* ---- growable byte buffer ------------------------------------------------------------------------ */
typedef struct { char *p; size_t len, cap; Budget *budget; } Buf;

static inline int buf_grow(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    NEED(budget_take(b->budget, cap - b->cap));
    char *p = realloc(b->p, cap);
    NEED(p);
    b->p = p;
    b->cap = cap;
    return 1;
}
static inline int put(Buf *b, const void *s, size_t n) {
    NEED(buf_grow(b, n));
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    return 1;
}
static inline int putc_(Buf *b, char c) { return put(b, &c, 1); }
#define PUTS(b, lit) put((b), (lit), sizeof(lit) - 1)

/* ---- wire reader: varints, fixed widths, length-delimited slices --------------------------------- */
typedef struct { const uint8_t *p, *end; } Rd;

/* A varint of at most `max_bytes` bytes: 10 for values; 5 for tags and lengths, which upb reads as
 * 32-bit varints and refuses past 5 bytes (a 6-10 byte tag or length is a malformed body there). */
static inline int rd_varint_slow(Rd *r, uint64_t *out, int max_bytes) {
    uint64_t v = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (r->p >= r->end) return 0;
        uint8_t b = *r->p++;
        if (i == 9 && b > 1) return 0; /* past 64 bits: upb truncates, leave that to it */
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) { *out = v; return 1; }
    }
    return 0;
}
/* Tags, lengths and small ints are one byte nearly always: that case inline, the rest out of line. */
static inline int rd_varint(Rd *r, uint64_t *out) {
    if (r->p < r->end && *r->p < 0x80) {
        *out = *r->p++;
        return 1;
    }
    return rd_varint_slow(r, out, 10);
}
static inline int rd_varint32(Rd *r, uint64_t *out) {
    if (r->p < r->end && *r->p < 0x80) {
        *out = *r->p++;
        return 1;
    }
    return rd_varint_slow(r, out, 5);
}
static inline int rd_fixed64(Rd *r, uint64_t *out) {
    NEED(r->end - r->p >= 8);
    memcpy(out, r->p, 8); /* little-endian host: checked at import */
    r->p += 8;
    return 1;
}
static inline int rd_skip32(Rd *r) { NEED(r->end - r->p >= 4); r->p += 4; return 1; }
static inline int rd_len(Rd *r, Rd *sub) {
    uint64_t n;
    NEED(rd_varint32(r, &n));
    NEED(n <= (uint64_t)(r->end - r->p));
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return 1;
}
/* The next tag as (field << 3 | wire type); field 0 and tags past 32 bits are malformed. */
static inline int rd_tag(Rd *r, uint32_t *tag) {
    uint64_t t;
    NEED(rd_varint32(r, &t));
    NEED(t >= 8 && t <= 0xFFFFFFFFu);
    *tag = (uint32_t)t;
    return 1;
}
/* A singular field seen twice is merged (messages) or overwritten (scalars) by upb: not handled here. */
static inline int once(uint32_t *seen, uint32_t tag) {
    uint32_t bit = 1u << ((tag >> 3) & 31);
    NEED(!(*seen & bit));
    *seen |= bit;
    return 1;
}
#define LEN(f) (((f) << 3) | 2)
#define VARINT(f) ((f) << 3)
#define I64(f) (((f) << 3) | 1)
#define I32(f) (((f) << 3) | 5)

static const char HEX[] = "0123456789abcdef";

/* ---- AnyValue, typed hot-key values -------------------------------------------------------------- */
enum { V_NONE, V_STR, V_BOOL, V_INT, V_DOUBLE, V_ARRAY, V_BYTES };
typedef struct { int kind; Rd s; int64_t i; double d; } AnyV;
typedef struct { int valid; const char *p; size_t n; char small[24]; } CStr;

/* ---- columns, in encoding.SPANS_ARROW_SCHEMA order ----------------------------------------------- */
enum {
    C_TRACE, C_SPAN, C_PARENT, C_NAME, C_KIND, C_START, C_END, C_STATUS, C_STATUS_MSG, C_SERVICE,
    C_SCOPE_NAME, C_SCOPE_VERSION, C_ROLLOUT, C_TASK, C_ATTEMPT, C_MODE, C_AGENT, C_OPERATION,
    C_RESPONSE, C_POLICY, C_PROMPT, C_COMPLETION, C_LOGPROBS, C_REWARD, C_REWARD_NAME, C_ATTRS,
    C_RESOURCE, C_EVENTS, C_LINKS, N_COLS
};
/* values: bytes (strings), fixed-width values, or list elements; offsets: int32 (strings and lists). */
typedef struct { Buf values, offsets, valid; Py_ssize_t nulls; int has_offsets; } Col;

/* ---- hot keys: attributes that also fill a typed column ------------------------------------------ */
enum {
    H_ROLLOUT, H_TASK, H_ATTEMPT, H_MODE, H_AGENT, H_OPERATION, H_RESPONSE, H_POLICY, H_REWARD_V,
    H_REWARD_N, H_EVAL_V, H_EVAL_N, H_SERVICE, H_PROMPT, H_COMPLETION, H_LOGPROBS, N_HOT
};
typedef struct { AnyV v[N_HOT]; uint8_t has[N_HOT]; } Hot;
/* Which keys a list of attributes looks for: none (events, links, scope), the resource's, the span's. */
enum { KV_PLAIN, KV_RESOURCE, KV_SPAN };
/* The keys of one attribute list so far, to send a duplicate (a dict keeps the last) to Python:
 * scanned while the list is short, then a hash set (open addressing over indexes into `keys`). */
typedef struct {
    Rd *keys;
    uint64_t *hashes;  /* of keys[i], once the list is indexed */
    uint32_t *slots;   /* 0 empty, else index + 1 */
    size_t n, cap, hcap, nslots;
    int indexed;       /* slots hold keys[0..n) */
    Budget *budget;
} Keys;
/* Start a new list (keys_add in wire_attrs.c adds to it). */
static inline void keys_reset(Keys *k) { k->n = 0; k->indexed = 0; }

/* One request's decoder state. */
typedef struct {
    Budget budget;      /* every buffer below counts against it */
    Col cols[N_COLS];
    Py_ssize_t n;       /* rows written */
    Buf resource;       /* the current resource's JSON */
    Buf scratch;        /* JSON of what is validated but not kept (scope attributes) */
    Keys span_keys, inner_keys;
} Dec;

/* wire_text.c: strict UTF-8, AnyValue parse, JSON text as orjson writes it, hot-key coercions. */
int rd_string(Rd *r, Rd *s);
int any_parse(Rd r, AnyV *v);
int any_json(Buf *b, const AnyV *v, int depth);
int json_str(Buf *b, const uint8_t *s, size_t n);
int put_u64(Buf *b, uint64_t v);
int as_str(const AnyV *v, CStr *out);
int as_int(const AnyV *v, int *valid, int32_t *out);
int as_float(const AnyV *v, int *valid, double *out);

/* wire_attrs.c: KeyValue lists -> JSON objects, hot keys, token arrays -> the list columns. */
void hot_init(void);
int kv_entry(Dec *d, Buf *out, Keys *keys, int mode, Hot *hot, Rd r);
int attrs_json(Dec *d, Buf *out, Rd r, uint32_t field);

/* wire_spans.c: the request -> resource -> scope -> span walk, one row per span. `limit`: the bytes its
 * buffers may take (SIZE_MAX: no limit); past it dec_run returns 0 with d->budget.over set. */
int dec_run(Dec *d, const uint8_t *body, size_t n, size_t limit);
void dec_free(Dec *d);

#endif
