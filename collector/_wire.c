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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NEED(x) do { if (!(x)) return 0; } while (0)
#define MAX_DEPTH 16 /* nested arrays in an attribute value; deeper ones go to the Python path */

/* ---- growable byte buffer ------------------------------------------------------------------------ */
typedef struct { char *p; size_t len, cap; } Buf;

static int buf_grow(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    NEED(p);
    b->p = p;
    b->cap = cap;
    return 1;
}
static int put(Buf *b, const void *s, size_t n) {
    NEED(buf_grow(b, n));
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    return 1;
}
static int putc_(Buf *b, char c) { return put(b, &c, 1); }
#define PUTS(b, lit) put((b), (lit), sizeof(lit) - 1)

/* ---- wire reader: varints, fixed widths, length-delimited slices --------------------------------- */
typedef struct { const uint8_t *p, *end; } Rd;

static int rd_varint_slow(Rd *r, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
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
    return rd_varint_slow(r, out);
}
static int rd_fixed64(Rd *r, uint64_t *out) {
    NEED(r->end - r->p >= 8);
    memcpy(out, r->p, 8); /* little-endian host: checked at import */
    r->p += 8;
    return 1;
}
static int rd_skip32(Rd *r) { NEED(r->end - r->p >= 4); r->p += 4; return 1; }
static int rd_len(Rd *r, Rd *sub) {
    uint64_t n;
    NEED(rd_varint(r, &n));
    NEED(n <= (uint64_t)(r->end - r->p));
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    return 1;
}
/* The next tag as (field << 3 | wire type); field 0 and tags past 32 bits are malformed. */
static int rd_tag(Rd *r, uint32_t *tag) {
    uint64_t t;
    NEED(rd_varint(r, &t));
    NEED(t >= 8 && t <= 0xFFFFFFFFu);
    *tag = (uint32_t)t;
    return 1;
}
/* A singular field seen twice is merged (messages) or overwritten (scalars) by upb: not handled here. */
static int once(uint32_t *seen, uint32_t tag) {
    uint32_t bit = 1u << ((tag >> 3) & 31);
    NEED(!(*seen & bit));
    *seen |= bit;
    return 1;
}
#define LEN(f) (((f) << 3) | 2)
#define VARINT(f) ((f) << 3)
#define I64(f) (((f) << 3) | 1)
#define I32(f) (((f) << 3) | 5)

/* ---- strict UTF-8 (as upb checks proto3 strings: no overlongs, surrogates or > U+10FFFF) --------- */
static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) { i += 8; continue; }
        }
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        uint8_t lo = 0x80, hi = 0xBF; /* range of the first continuation byte */
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c == 0xE0) { k = 2; lo = 0xA0; }
        else if (c == 0xED) { k = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) k = 2;
        else if (c == 0xF0) { k = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) k = 3;
        else if (c == 0xF4) { k = 3; hi = 0x8F; }
        else return 0;
        NEED(i + k < n); /* the k continuation bytes are there */
        NEED(s[i + 1] >= lo && s[i + 1] <= hi);
        for (size_t j = 2; j <= k; j++) NEED((s[i + j] & 0xC0) == 0x80);
        i += k + 1;
    }
    return 1;
}
static int rd_string(Rd *r, Rd *s) { NEED(rd_len(r, s)); return utf8_ok(s->p, (size_t)(s->end - s->p)); }

/* ---- JSON text, as orjson writes it -------------------------------------------------------------- */
static const char HEX[] = "0123456789abcdef";

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull
/* Whether none of 8 bytes needs escaping (< 0x20, '"', '\\'): the usual bit tricks, exact as a yes/no. */
static inline int word_plain(uint64_t w) {
    uint64_t quote = w ^ (ONES * '"'), slash = w ^ (ONES * '\\');
    return !((((w - ONES * 0x20) & ~w) | ((quote - ONES) & ~quote) | ((slash - ONES) & ~slash)) & HIGHS);
}

static int json_str(Buf *b, const uint8_t *s, size_t n) {
    NEED(buf_grow(b, n + 2));
    b->p[b->len++] = '"';
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t w;
        while (i + 8 <= n && (memcpy(&w, s + i, 8), word_plain(w))) i += 8;
        if (i >= n) break;
        uint8_t c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        NEED(put(b, s + run, i - run));
        run = i + 1;
        char esc[6] = {'\\', 0, '0', '0', HEX[c >> 4], HEX[c & 15]};
        switch (c) {
            case '"': esc[1] = '"'; break;
            case '\\': esc[1] = '\\'; break;
            case '\b': esc[1] = 'b'; break;
            case '\t': esc[1] = 't'; break;
            case '\n': esc[1] = 'n'; break;
            case '\f': esc[1] = 'f'; break;
            case '\r': esc[1] = 'r'; break;
            default: esc[1] = 'u'; NEED(put(b, esc, 6)); continue;
        }
        NEED(put(b, esc, 2));
    }
    NEED(put(b, s + run, n - run));
    return putc_(b, '"');
}

static int put_u64(Buf *b, uint64_t v) {
    char t[24];
    int i = 24;
    do { t[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    return put(b, t + i, (size_t)(24 - i));
}
static int put_i64(Buf *b, int64_t v) {
    if (v < 0) { NEED(putc_(b, '-')); return put_u64(b, 0 - (uint64_t)v); }
    return put_u64(b, (uint64_t)v);
}

/* Shortest round-trip digits (the first of 15, 16, 17 significant digits that reads back exactly is the
 * shortest and nearest, as Python's repr picks; a subnormal has fewer, so it tries from 1), laid out as
 * orjson does. */
static int put_double(Buf *b, double d) {
    if (isnan(d) || isinf(d)) return PUTS(b, "null");
    if (d == 0) return signbit(d) ? PUTS(b, "-0.0") : PUTS(b, "0.0");
    char t[40];
    for (int prec = fabs(d) < 2.2250738585072014e-308 ? 1 : 15; prec <= 17; prec++) { /* subnormals: fewer digits */
        snprintf(t, sizeof t, "%.*e", prec - 1, d);
        if (strtod(t, NULL) == d) break;
    }
    char digits[24];
    int k = 0, neg = t[0] == '-';
    const char *q = t + neg;
    for (; *q && *q != 'e'; q++) {
        if (*q >= '0' && *q <= '9') digits[k++] = *q;
        else NEED(*q == '.'); /* a locale's ',' (an embedding app's setlocale): Python's path then */
    }
    int e = atoi(q + 1);
    while (k > 1 && digits[k - 1] == '0') k--;
    if (neg) NEED(putc_(b, '-'));
    if (e >= 16 || e < -5) {
        NEED(putc_(b, digits[0]));
        if (k > 1) { NEED(putc_(b, '.')); NEED(put(b, digits + 1, (size_t)(k - 1))); }
        char x[8];
        int m = snprintf(x, sizeof x, e > 0 ? "e+%d" : "e%d", e);
        return put(b, x, (size_t)m);
    }
    if (e < 0) {
        NEED(PUTS(b, "0."));
        for (int i = 0; i < -e - 1; i++) NEED(putc_(b, '0'));
        return put(b, digits, (size_t)k);
    }
    for (int i = 0; i <= e; i++) NEED(putc_(b, i < k ? digits[i] : '0'));
    NEED(putc_(b, '.'));
    if (k > e + 1) return put(b, digits + e + 1, (size_t)(k - e - 1));
    return putc_(b, '0');
}

/* ---- AnyValue ------------------------------------------------------------------------------------ */
enum { V_NONE, V_STR, V_BOOL, V_INT, V_DOUBLE, V_ARRAY, V_BYTES };
typedef struct { int kind; Rd s; int64_t i; double d; } AnyV;

/* One AnyValue with at most one field (a second one would replace the first in upb). */
static int any_parse(Rd r, AnyV *v) {
    v->kind = V_NONE;
    while (r.p < r.end) {
        uint32_t tag;
        uint64_t u;
        NEED(v->kind == V_NONE && rd_tag(&r, &tag));
        switch (tag) {
            case LEN(1): NEED(rd_string(&r, &v->s)); v->kind = V_STR; break;
            case VARINT(2): NEED(rd_varint(&r, &u)); v->kind = V_BOOL; v->i = u != 0; break;
            case VARINT(3): NEED(rd_varint(&r, &u)); v->kind = V_INT; v->i = (int64_t)u; break;
            case I64(4): NEED(rd_fixed64(&r, &u)); v->kind = V_DOUBLE; memcpy(&v->d, &u, 8); break;
            case LEN(5): NEED(rd_len(&r, &v->s)); v->kind = V_ARRAY; break;
            case LEN(7): NEED(rd_len(&r, &v->s)); v->kind = V_BYTES; break;
            default: return 0; /* kvlist (6), string_value_strindex (8), unknown */
        }
    }
    return 1;
}

static int any_json(Buf *b, const AnyV *v, int depth) {
    switch (v->kind) {
        case V_NONE: return PUTS(b, "null");
        case V_STR: return json_str(b, v->s.p, (size_t)(v->s.end - v->s.p));
        case V_BOOL: return v->i ? PUTS(b, "true") : PUTS(b, "false");
        case V_INT: return put_i64(b, v->i);
        case V_DOUBLE: return put_double(b, v->d);
        case V_ARRAY: {
            NEED(depth < MAX_DEPTH && putc_(b, '['));
            Rd r = v->s;
            for (int i = 0; r.p < r.end; i++) {
                uint32_t tag;
                Rd el;
                AnyV x;
                NEED(rd_tag(&r, &tag) && tag == LEN(1) && rd_len(&r, &el) && any_parse(el, &x));
                NEED((!i || putc_(b, ',')) && any_json(b, &x, depth + 1));
            }
            return putc_(b, ']');
        }
        default: return 0; /* bytes: base64 in JSON, left to Python */
    }
}

/* ---- typed hot-key coercions (encoding._as_str / _as_int / _as_float) ----------------------------- */
typedef struct { int valid; const char *p; size_t n; char small[24]; } CStr;

static int as_str(const AnyV *v, CStr *out) {
    out->valid = 1;
    switch (v->kind) {
        case V_STR: out->p = (const char *)v->s.p; out->n = (size_t)(v->s.end - v->s.p); return 1;
        case V_BOOL: out->p = v->i ? "True" : "False"; out->n = v->i ? 4 : 5; return 1;
        case V_INT: {
            Buf t = {out->small, 0, sizeof out->small};
            put_i64(&t, v->i); /* fits: 20 chars */
            out->p = out->small;
            out->n = t.len;
            return 1;
        }
        case V_NONE: case V_ARRAY: out->valid = 0; return 1;
        default: return 0; /* a double's str() is Python's repr: left to Python */
    }
}
static int as_int(const AnyV *v, int *valid, int32_t *out) {
    *valid = v->kind == V_INT && v->i >= INT32_MIN && v->i <= INT32_MAX;
    if (*valid) *out = (int32_t)v->i;
    return v->kind != V_STR; /* int("...") has Python's own rules */
}
static int as_float(const AnyV *v, int *valid, double *out) {
    *valid = v->kind == V_INT || v->kind == V_DOUBLE;
    if (*valid) *out = v->kind == V_INT ? (double)v->i : v->d;
    return v->kind != V_STR;
}

/* ---- columns ------------------------------------------------------------------------------------- */
enum {
    C_TRACE, C_SPAN, C_PARENT, C_NAME, C_KIND, C_START, C_END, C_STATUS, C_STATUS_MSG, C_SERVICE,
    C_SCOPE_NAME, C_SCOPE_VERSION, C_ROLLOUT, C_TASK, C_ATTEMPT, C_MODE, C_AGENT, C_OPERATION,
    C_RESPONSE, C_POLICY, C_PROMPT, C_COMPLETION, C_LOGPROBS, C_REWARD, C_REWARD_NAME, C_ATTRS,
    C_RESOURCE, C_EVENTS, C_LINKS, N_COLS
};
/* values: bytes (strings), fixed-width values, or list elements; offsets: int32 (strings and lists). */
typedef struct { Buf values, offsets, valid; Py_ssize_t nulls; int has_offsets; } Col;

static int col_end(Col *c, int valid, size_t width) {
    if (c->has_offsets) {
        size_t off = c->values.len / width;
        NEED(off <= INT32_MAX);
        int32_t o = (int32_t)off;
        NEED(put(&c->offsets, &o, 4));
    }
    c->nulls += !valid;
    return putc_(&c->valid, (char)(valid != 0));
}
static int col_str(Col *c, const void *p, size_t n) { return put(&c->values, p, n) && col_end(c, 1, 1); }
static int col_cstr(Col *c, const CStr *s) { return s->valid ? col_str(c, s->p, s->n) : col_end(c, 0, 1); }
static int col_opt(Col *c, Rd s) { return s.p < s.end ? col_str(c, s.p, (size_t)(s.end - s.p)) : col_end(c, 0, 1); }
static int col_fixed(Col *c, int valid, const void *v, size_t width) {
    char zero[8] = {0};
    return put(&c->values, valid ? v : zero, width) && col_end(c, valid, width);
}
static int col_hex(Col *c, Rd s) {
    size_t n = (size_t)(s.end - s.p);
    if (!n) return col_end(c, 0, 1);
    NEED(buf_grow(&c->values, 2 * n));
    for (size_t i = 0; i < n; i++) {
        c->values.p[c->values.len++] = HEX[s.p[i] >> 4];
        c->values.p[c->values.len++] = HEX[s.p[i] & 15];
    }
    return col_end(c, 1, 1);
}

/* ---- hot keys --------------------------------------------------------------------------------- */
enum {
    H_ROLLOUT, H_TASK, H_ATTEMPT, H_MODE, H_AGENT, H_OPERATION, H_RESPONSE, H_POLICY, H_REWARD_V,
    H_REWARD_N, H_EVAL_V, H_EVAL_N, H_SERVICE, H_PROMPT, H_COMPLETION, H_LOGPROBS, N_HOT
};
static const char *const HOT_KEYS[N_HOT] = {
    "spanrl.rollout.id", "spanrl.task.id", "spanrl.rollout.attempt", "spanrl.rollout.mode",
    "gen_ai.agent.name", "gen_ai.operation.name", "gen_ai.response.id", "spanrl.policy.version",
    "spanrl.reward.value", "spanrl.reward.name", "gen_ai.evaluation.score.value",
    "gen_ai.evaluation.name", "service.name", "spanrl.llm.prompt_token_ids",
    "spanrl.llm.completion_token_ids", "spanrl.llm.logprobs",
};
static size_t HOT_LEN[N_HOT];
typedef struct { AnyV v[N_HOT]; uint8_t has[N_HOT]; } Hot;

/* Which keys a list of attributes looks for: none (events, links, scope), the resource's, the span's. */
enum { KV_PLAIN, KV_RESOURCE, KV_SPAN };

/* The hot keys each list looks for: the resource's five, the span's (all but service.name). */
#define HOT_BIT(h) (1u << (h))
static const uint32_t HOT_MASK[] = {
    [KV_PLAIN] = 0,
    [KV_RESOURCE] = HOT_BIT(H_ROLLOUT) | HOT_BIT(H_TASK) | HOT_BIT(H_ATTEMPT) | HOT_BIT(H_MODE) | HOT_BIT(H_SERVICE),
    [KV_SPAN] = ((1u << N_HOT) - 1) & ~HOT_BIT(H_SERVICE),
};

static int hot_id(int mode, Rd key) {
    size_t n = (size_t)(key.end - key.p);
    for (int h = 0; h < N_HOT; h++)
        if ((HOT_MASK[mode] & HOT_BIT(h)) && HOT_LEN[h] == n && memcmp(HOT_KEYS[h], key.p, n) == 0) return h;
    return -1;
}

/* The keys of one attribute list so far, to send a duplicate (a dict keeps the last) to Python. */
typedef struct { Rd *keys; size_t n, cap; } Keys;

static int keys_add(Keys *k, Rd key) {
    size_t n = (size_t)(key.end - key.p);
    for (size_t i = 0; i < k->n; i++)
        NEED((size_t)(k->keys[i].end - k->keys[i].p) != n || memcmp(k->keys[i].p, key.p, n) != 0);
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 32;
        Rd *p = realloc(k->keys, cap * sizeof *p);
        NEED(p);
        k->keys = p;
        k->cap = cap;
    }
    k->keys[k->n++] = key;
    return 1;
}

typedef struct {
    Col cols[N_COLS];
    Py_ssize_t n;       /* rows written */
    Buf resource;       /* the current resource's JSON */
    Buf scratch;        /* JSON of what is validated but not kept (scope attributes) */
    Keys span_keys, inner_keys;
} Dec;

/* ---- token arrays -> the three list columns ------------------------------------------------------ */
static int b64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}
/* Canonical base64 only (length a multiple of 4, '=' only at the end, zero unused bits); the rest,
 * valid or not for base64.b64decode(validate=True), goes to Python. */
static int b64_decode(Buf *out, Rd s) {
    size_t n = (size_t)(s.end - s.p), pad = 0;
    NEED(n % 4 == 0);
    if (n && s.p[n - 1] == '=') pad++;
    if (n > 1 && s.p[n - 2] == '=') pad++;
    size_t bytes = n / 4 * 3 - pad;
    NEED(bytes % 4 == 0 && buf_grow(out, bytes + 3));
    uint8_t *o = (uint8_t *)out->p + out->len;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++) {
            v[j] = (i + j >= n - pad) ? 0 : b64_value(s.p[i + j]);
            NEED(v[j] >= 0);
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        *o++ = (uint8_t)(w >> 16);
        *o++ = (uint8_t)(w >> 8);
        *o++ = (uint8_t)w;
    }
    NEED(pad < 1 || (b64_value(s.p[n - pad - 1]) & (pad == 1 ? 3 : 15)) == 0);
    out->len += bytes;
    return 1;
}

/* A plain OTLP array: every element one int_value (int32 range), or for log-probs one double_value or
 * int_value; anything else (and an out-of-range id) is Python's to reject with its message. */
static int array_tokens(Buf *out, Rd r, int is_float) {
    /* Each element takes at least 4 wire bytes (0A len tag value) and gives 4 output bytes. */
    NEED(buf_grow(out, (size_t)(r.end - r.p)));
    while (r.p < r.end) {
        /* The shapes every SDK writes, without the general parse: an int element `0A L 18 <varint of
         * L-1 bytes>` and a double element `0A 09 21 <8 bytes>`. */
        if (r.end - r.p >= 4 && r.p[0] == 0x0A && r.p[1] <= 11 && r.p[1] + 2 <= r.end - r.p) {
            const uint8_t *v = r.p + 3, *stop = r.p + 2 + r.p[1];
            if (r.p[2] == 0x18 && r.p[1] >= 2 && !(stop[-1] & 0x80)) {
                uint64_t x = 0;
                int shift = 0, ok = 1;
                for (const uint8_t *q = v; q < stop; q++, shift += 7) {
                    ok &= q == stop - 1 || (*q & 0x80);
                    x |= (uint64_t)(*q & 0x7F) << shift;
                }
                if (ok && stop - v < 10) {
                    int64_t i = (int64_t)x;
                    if (is_float) {
                        float f = (float)(double)i;
                        memcpy(out->p + out->len, &f, 4);
                    } else {
                        NEED(i >= INT32_MIN && i <= INT32_MAX);
                        int32_t i32 = (int32_t)i;
                        memcpy(out->p + out->len, &i32, 4);
                    }
                    out->len += 4;
                    r.p = stop;
                    continue;
                }
            } else if (is_float && r.p[1] == 9 && r.p[2] == 0x21) {
                double d;
                memcpy(&d, v, 8);
                float f = (float)d;
                memcpy(out->p + out->len, &f, 4);
                out->len += 4;
                r.p = stop;
                continue;
            }
        }
        uint32_t tag;
        Rd el;
        AnyV x;
        NEED(rd_tag(&r, &tag) && tag == LEN(1) && rd_len(&r, &el) && any_parse(el, &x));
        if (is_float) {
            NEED(x.kind == V_DOUBLE || x.kind == V_INT);
            float f = x.kind == V_DOUBLE ? (float)x.d : (float)(double)x.i;
            NEED(put(out, &f, 4));
        } else {
            NEED(x.kind == V_INT && x.i >= INT32_MIN && x.i <= INT32_MAX);
            int32_t v = (int32_t)x.i;
            NEED(put(out, &v, 4));
        }
    }
    return 1;
}

static int tokens(Dec *d, int slot, const AnyV *v) {
    Buf *out = &d->cols[C_PROMPT + slot].values;
    switch (v->kind) {
        case V_ARRAY: return array_tokens(out, v->s, slot == 2);
        case V_STR: return b64_decode(out, v->s);
        case V_BYTES: NEED((v->s.end - v->s.p) % 4 == 0); return put(out, v->s.p, (size_t)(v->s.end - v->s.p));
        default: return 0;
    }
}

/* ---- KeyValue lists -> JSON objects -------------------------------------------------------------- */
/* One KeyValue of a list: `"key":value` into `out`, whose object is open (a comma first unless `out`
 * ends with its '{'; no value's text ends with one), except the span's token keys, which go to their columns; hot keys are kept in `hot`. */
static int kv_entry(Dec *d, Buf *out, Keys *keys, int mode, Hot *hot, Rd r) {
    Rd key = {0, 0}, val = {0, 0};
    uint32_t seen = 0;
    while (r.p < r.end) {
        uint32_t tag;
        NEED(rd_tag(&r, &tag) && once(&seen, tag));
        if (tag == LEN(1)) NEED(rd_string(&r, &key));
        else if (tag == LEN(2)) NEED(rd_len(&r, &val));
        else return 0; /* key_strindex, unknown */
    }
    AnyV v;
    NEED(any_parse(val, &v));
    NEED(keys_add(keys, key));
    int h = mode == KV_PLAIN ? -1 : hot_id(mode, key);
    if (h >= H_PROMPT) {
        hot->has[h] = 1;
        return tokens(d, h - H_PROMPT, &v);
    }
    if (h >= 0) { hot->v[h] = v; hot->has[h] = 1; }
    if (out->p[out->len - 1] != '{') NEED(putc_(out, ','));
    NEED(json_str(out, key.p, (size_t)(key.end - key.p)) && putc_(out, ':'));
    return any_json(out, &v, 0);
}

/* The attributes of an event or link (every KeyValue field numbered `field` in `r`) as a JSON object. */
static int attrs_json(Dec *d, Buf *out, Rd r, uint32_t field) {
    d->inner_keys.n = 0;
    NEED(putc_(out, '{'));
    while (r.p < r.end) {
        uint32_t tag;
        Rd s;
        NEED(rd_tag(&r, &tag));
        if (tag == LEN(field)) { NEED(rd_len(&r, &s) && kv_entry(d, out, &d->inner_keys, KV_PLAIN, NULL, s)); }
        else if ((tag & 7) == 2) NEED(rd_len(&r, &s));   /* checked by the caller's first pass */
        else if ((tag & 7) == 0) { uint64_t u; NEED(rd_varint(&r, &u)); }
        else if ((tag & 7) == 1) { uint64_t u; NEED(rd_fixed64(&r, &u)); }
        else NEED(rd_skip32(&r));
    }
    return putc_(out, '}');
}

/* ---- messages ------------------------------------------------------------------------------------ */
/* Event {time_unix_nano=1, name=2, attributes=3, dropped=4} -> {"name","time_ns","attributes"}. */
static int event_json(Dec *d, Buf *out, Rd r) {
    Rd all = r, name = {0, 0};
    uint64_t time = 0, u;
    uint32_t seen = 0, tag;
    while (r.p < r.end) {
        Rd s;
        NEED(rd_tag(&r, &tag));
        if (tag != LEN(3)) NEED(once(&seen, tag));
        switch (tag) {
            case I64(1): NEED(rd_fixed64(&r, &time)); break;
            case LEN(2): NEED(rd_string(&r, &name)); break;
            case LEN(3): NEED(rd_len(&r, &s)); break;
            case VARINT(4): NEED(rd_varint(&r, &u)); break;
            default: return 0;
        }
    }
    NEED(PUTS(out, "{\"name\":") && json_str(out, name.p, (size_t)(name.end - name.p)));
    NEED(PUTS(out, ",\"time_ns\":") && put_u64(out, time) && PUTS(out, ",\"attributes\":"));
    return attrs_json(d, out, all, 3) && putc_(out, '}');
}

static int hex_json(Buf *out, Rd s) {
    NEED(putc_(out, '"'));
    for (const uint8_t *p = s.p; p < s.end; p++) NEED(putc_(out, HEX[*p >> 4]) && putc_(out, HEX[*p & 15]));
    return putc_(out, '"');
}

/* Link {trace_id=1, span_id=2, trace_state=3, attributes=4, dropped=5, flags=6} -> its JSON object. */
static int link_json(Dec *d, Buf *out, Rd r) {
    Rd all = r, tid = {0, 0}, sid = {0, 0}, s;
    uint64_t u;
    uint32_t seen = 0, tag;
    while (r.p < r.end) {
        NEED(rd_tag(&r, &tag));
        if (tag != LEN(4)) NEED(once(&seen, tag));
        switch (tag) {
            case LEN(1): NEED(rd_len(&r, &tid)); break;
            case LEN(2): NEED(rd_len(&r, &sid)); break;
            case LEN(3): NEED(rd_string(&r, &s)); break;
            case LEN(4): NEED(rd_len(&r, &s)); break;
            case VARINT(5): NEED(rd_varint(&r, &u)); break;
            case I32(6): NEED(rd_skip32(&r)); break;
            default: return 0;
        }
    }
    NEED(PUTS(out, "{\"trace_id\":") && hex_json(out, tid) && PUTS(out, ",\"span_id\":") && hex_json(out, sid));
    return PUTS(out, ",\"attributes\":") && attrs_json(d, out, all, 4) && putc_(out, '}');
}

/* Span kind / status code: upb keeps any int32 (open enum); the names cover 0..n-1, the rest is the default. */
static int enum_index(uint64_t v, int n, int *out) {
    NEED(v <= 0xFFFFFFFFull || v >= 0xFFFFFFFF80000000ull); /* else upb truncates: Python's case */
    *out = v < (uint64_t)n ? (int)v : 0;
    return 1;
}

static const char *const KIND_NAMES[] = {"UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"};
static const char *const STATUS_NAMES[] = {"UNSET", "OK", "ERROR"};

/* Status {message=2, code=3}. */
static int status_parse(Rd r, Rd *message, int *code) {
    uint32_t seen = 0, tag;
    uint64_t u;
    while (r.p < r.end) {
        NEED(rd_tag(&r, &tag) && once(&seen, tag));
        if (tag == LEN(2)) NEED(rd_string(&r, message));
        else if (tag == VARINT(3)) NEED(rd_varint(&r, &u) && enum_index(u, 3, code));
        else return 0;
    }
    return 1;
}

/* What every span of one ResourceSpans / ScopeSpans shares. */
typedef struct { CStr service, rollout, task, mode; int attempt_valid; int32_t attempt; Rd scope_name, scope_version; } Ctx;

static int span_row(Dec *d, const Ctx *ctx, const Hot *hot, Rd tid, Rd sid, Rd pid, Rd name, int kind,
                    uint64_t start, uint64_t end, Rd status_msg, int code);

/* Span: fields in wire order; attributes, events, links and token arrays are written to their columns
 * as they come, the rest once the span is read. */
static int span(Dec *d, Rd r, const Ctx *ctx) {
    Rd tid = {0, 0}, sid = {0, 0}, pid = {0, 0}, name = {0, 0}, msg = {0, 0}, s;
    uint64_t start = 0, end = 0, u;
    int kind = 0, code = 0, n_events = 0, n_links = 0;
    uint32_t seen = 0, tag;
    Hot hot;
    memset(hot.has, 0, sizeof hot.has);
    Buf *attrs = &d->cols[C_ATTRS].values, *events = &d->cols[C_EVENTS].values, *links = &d->cols[C_LINKS].values;
    d->span_keys.n = 0;
    NEED(putc_(attrs, '{'));
    while (r.p < r.end) {
        NEED(rd_tag(&r, &tag));
        if (tag != LEN(9) && tag != LEN(11) && tag != LEN(13)) NEED(once(&seen, tag));
        switch (tag) {
            case LEN(1): NEED(rd_len(&r, &tid)); break;
            case LEN(2): NEED(rd_len(&r, &sid)); break;
            case LEN(3): NEED(rd_string(&r, &s)); break; /* trace_state: not stored */
            case LEN(4): NEED(rd_len(&r, &pid)); break;
            case LEN(5): NEED(rd_string(&r, &name)); break;
            case VARINT(6): NEED(rd_varint(&r, &u) && enum_index(u, 6, &kind)); break;
            case I64(7): NEED(rd_fixed64(&r, &start)); break;
            case I64(8): NEED(rd_fixed64(&r, &end)); break;
            case LEN(9): NEED(rd_len(&r, &s) && kv_entry(d, attrs, &d->span_keys, KV_SPAN, &hot, s)); break;
            case LEN(11): NEED(rd_len(&r, &s) && putc_(events, n_events++ ? ',' : '[') && event_json(d, events, s)); break;
            case LEN(13): NEED(rd_len(&r, &s) && putc_(links, n_links++ ? ',' : '[') && link_json(d, links, s)); break;
            case LEN(15): NEED(rd_len(&r, &s) && status_parse(s, &msg, &code)); break;
            case VARINT(10): case VARINT(12): case VARINT(14): NEED(rd_varint(&r, &u)); break;
            case I32(16): NEED(rd_skip32(&r)); break;
            default: return 0;
        }
    }
    NEED(putc_(attrs, '}') && col_end(&d->cols[C_ATTRS], 1, 1));
    NEED(n_events ? putc_(events, ']') && col_end(&d->cols[C_EVENTS], 1, 1) : col_end(&d->cols[C_EVENTS], 0, 1));
    NEED(n_links ? putc_(links, ']') && col_end(&d->cols[C_LINKS], 1, 1) : col_end(&d->cols[C_LINKS], 0, 1));
    for (int slot = 0; slot < 3; slot++) NEED(col_end(&d->cols[C_PROMPT + slot], hot.has[H_PROMPT + slot], 4));
    return span_row(d, ctx, &hot, tid, sid, pid, name, kind, start, end, msg, code);
}

static int all_zero(Rd s) {
    for (const uint8_t *p = s.p; p < s.end; p++) if (*p) return 0;
    return 1;
}

/* A span attribute if present, else the resource's (already coerced) value. */
static int str_or(const Hot *hot, int h, const CStr *fallback, CStr *out) {
    if (hot->has[h]) return as_str(&hot->v[h], out);
    if (fallback) *out = *fallback; else out->valid = 0;
    if (fallback && fallback->p == fallback->small) out->p = out->small;
    return 1;
}

static int span_row(Dec *d, const Ctx *ctx, const Hot *hot, Rd tid, Rd sid, Rd pid, Rd name, int kind,
                    uint64_t start, uint64_t end, Rd status_msg, int code) {
    Col *c = d->cols;
    NEED(tid.end - tid.p == 16 && !all_zero(tid) && sid.end - sid.p == 8 && !all_zero(sid));
    NEED(pid.end == pid.p || pid.end - pid.p == 8);
    NEED(start <= INT64_MAX && end <= INT64_MAX);
    NEED(col_hex(&c[C_TRACE], tid) && col_hex(&c[C_SPAN], sid) && col_hex(&c[C_PARENT], pid));
    NEED(col_str(&c[C_NAME], name.p, (size_t)(name.end - name.p)));
    NEED(col_str(&c[C_KIND], KIND_NAMES[kind], strlen(KIND_NAMES[kind])));
    int64_t s64 = (int64_t)start, e64 = (int64_t)end;
    NEED(col_fixed(&c[C_START], 1, &s64, 8) && col_fixed(&c[C_END], 1, &e64, 8));
    NEED(col_str(&c[C_STATUS], STATUS_NAMES[code], strlen(STATUS_NAMES[code])) && col_opt(&c[C_STATUS_MSG], status_msg));
    NEED(col_cstr(&c[C_SERVICE], &ctx->service) && col_opt(&c[C_SCOPE_NAME], ctx->scope_name));
    NEED(col_opt(&c[C_SCOPE_VERSION], ctx->scope_version));
    CStr t;
    NEED(str_or(hot, H_ROLLOUT, &ctx->rollout, &t) && col_cstr(&c[C_ROLLOUT], &t));
    NEED(str_or(hot, H_TASK, &ctx->task, &t) && col_cstr(&c[C_TASK], &t));
    int valid = ctx->attempt_valid;
    int32_t i32 = ctx->attempt;
    if (hot->has[H_ATTEMPT]) NEED(as_int(&hot->v[H_ATTEMPT], &valid, &i32));
    NEED(col_fixed(&c[C_ATTEMPT], valid, &i32, 4));
    NEED(str_or(hot, H_MODE, &ctx->mode, &t) && col_cstr(&c[C_MODE], &t));
    NEED(str_or(hot, H_AGENT, NULL, &t) && col_cstr(&c[C_AGENT], &t));
    NEED(str_or(hot, H_OPERATION, NULL, &t) && col_cstr(&c[C_OPERATION], &t));
    NEED(str_or(hot, H_RESPONSE, NULL, &t) && col_cstr(&c[C_RESPONSE], &t));
    valid = 0;
    if (hot->has[H_POLICY]) NEED(as_int(&hot->v[H_POLICY], &valid, &i32));
    NEED(col_fixed(&c[C_POLICY], valid, &i32, 4));
    double reward = 0;
    valid = 0;
    t.valid = 0;
    int rv = hot->has[H_REWARD_V] ? H_REWARD_V : hot->has[H_EVAL_V] ? H_EVAL_V : -1; /* reward.value first */
    if (rv >= 0) {
        NEED(as_float(&hot->v[rv], &valid, &reward));
        NEED(str_or(hot, rv == H_REWARD_V ? H_REWARD_N : H_EVAL_N, NULL, &t));
    }
    NEED(col_fixed(&c[C_REWARD], valid, &reward, 8) && col_cstr(&c[C_REWARD_NAME], &t));
    NEED(col_str(&c[C_RESOURCE], d->resource.p, d->resource.len));
    d->n++;
    return 1;
}

/* InstrumentationScope {name=1, version=2, attributes=3 (validated, not stored), dropped=4}. */
static int scope_parse(Dec *d, Rd r, Ctx *ctx) {
    uint32_t seen = 0, tag;
    uint64_t u;
    Rd s;
    d->inner_keys.n = 0;
    d->scratch.len = 0;
    NEED(putc_(&d->scratch, '{'));
    while (r.p < r.end) {
        NEED(rd_tag(&r, &tag));
        if (tag != LEN(3)) NEED(once(&seen, tag));
        switch (tag) {
            case LEN(1): NEED(rd_string(&r, &ctx->scope_name)); break;
            case LEN(2): NEED(rd_string(&r, &ctx->scope_version)); break;
            case LEN(3): NEED(rd_len(&r, &s) && kv_entry(d, &d->scratch, &d->inner_keys, KV_PLAIN, NULL, s)); break;
            case VARINT(4): NEED(rd_varint(&r, &u)); break;
            default: return 0;
        }
    }
    return 1;
}

/* ScopeSpans {scope=1, spans=2, schema_url=3}: the scope first (it may follow the spans on the wire). */
static int scope_spans(Dec *d, Rd r, Ctx ctx) {
    Rd all = r, s;
    uint32_t seen = 0, tag;
    ctx.scope_name.p = ctx.scope_name.end = ctx.scope_version.p = ctx.scope_version.end = NULL;
    while (r.p < r.end) {
        NEED(rd_tag(&r, &tag));
        if (tag != LEN(2)) NEED(once(&seen, tag));
        if (tag == LEN(1)) NEED(rd_len(&r, &s) && scope_parse(d, s, &ctx));
        else if (tag == LEN(2)) NEED(rd_len(&r, &s));
        else if (tag == LEN(3)) NEED(rd_string(&r, &s));
        else return 0;
    }
    for (r = all; r.p < r.end;) {
        NEED(rd_tag(&r, &tag) && rd_len(&r, &s));
        if (tag == LEN(2)) NEED(span(d, s, &ctx));
    }
    return 1;
}

/* Resource {attributes=1, dropped=2}: its JSON into d->resource, its hot keys coerced into ctx. */
static int resource_parse(Dec *d, Rd r, Ctx *ctx) {
    uint32_t seen = 0, tag;
    uint64_t u;
    Rd s;
    Hot hot;
    memset(hot.has, 0, sizeof hot.has);
    d->inner_keys.n = 0;
    NEED(putc_(&d->resource, '{'));
    while (r.p < r.end) {
        NEED(rd_tag(&r, &tag));
        if (tag == LEN(1)) NEED(rd_len(&r, &s) && kv_entry(d, &d->resource, &d->inner_keys, KV_RESOURCE, &hot, s));
        else if (tag == VARINT(2)) NEED(once(&seen, tag) && rd_varint(&r, &u));
        else return 0; /* entity_refs, unknown */
    }
    NEED(putc_(&d->resource, '}'));
    CStr *out[] = {&ctx->service, &ctx->rollout, &ctx->task, &ctx->mode};
    int keys[] = {H_SERVICE, H_ROLLOUT, H_TASK, H_MODE};
    for (int i = 0; i < 4; i++) {
        if (hot.has[keys[i]]) NEED(as_str(&hot.v[keys[i]], out[i]));
        else out[i]->valid = 0;
    }
    ctx->attempt_valid = 0;
    if (hot.has[H_ATTEMPT]) NEED(as_int(&hot.v[H_ATTEMPT], &ctx->attempt_valid, &ctx->attempt));
    return 1;
}

/* ResourceSpans {resource=1, scope_spans=2, schema_url=3}: the resource first, wherever it is. */
static int resource_spans(Dec *d, Rd r) {
    Rd all = r, s;
    uint32_t seen = 0, tag;
    Ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    d->resource.len = 0;
    int have_resource = 0;
    while (r.p < r.end) {
        NEED(rd_tag(&r, &tag));
        if (tag != LEN(2)) NEED(once(&seen, tag));
        if (tag == LEN(1)) { NEED(rd_len(&r, &s) && resource_parse(d, s, &ctx)); have_resource = 1; }
        else if (tag == LEN(2)) NEED(rd_len(&r, &s));
        else if (tag == LEN(3)) NEED(rd_string(&r, &s));
        else return 0;
    }
    if (!have_resource) NEED(PUTS(&d->resource, "{}"));
    for (r = all; r.p < r.end;) {
        NEED(rd_tag(&r, &tag) && rd_len(&r, &s));
        if (tag == LEN(2)) NEED(scope_spans(d, s, ctx));
    }
    return 1;
}

static int request(Dec *d, Rd r) {
    while (r.p < r.end) {
        uint32_t tag;
        Rd s;
        NEED(rd_tag(&r, &tag) && tag == LEN(1) && rd_len(&r, &s) && resource_spans(d, s));
    }
    return d->n > 0; /* no spans: the Python path answers that request */
}

/* ---- Python glue --------------------------------------------------------------------------------- */
static const int HAS_OFFSETS[N_COLS] = {
    [C_TRACE] = 1, [C_SPAN] = 1, [C_PARENT] = 1, [C_NAME] = 1, [C_KIND] = 1, [C_STATUS] = 1,
    [C_STATUS_MSG] = 1, [C_SERVICE] = 1, [C_SCOPE_NAME] = 1, [C_SCOPE_VERSION] = 1, [C_ROLLOUT] = 1,
    [C_TASK] = 1, [C_MODE] = 1, [C_AGENT] = 1, [C_OPERATION] = 1, [C_RESPONSE] = 1, [C_PROMPT] = 1,
    [C_COMPLETION] = 1, [C_LOGPROBS] = 1, [C_REWARD_NAME] = 1, [C_ATTRS] = 1, [C_RESOURCE] = 1,
    [C_EVENTS] = 1, [C_LINKS] = 1,
};

static void dec_free(Dec *d) {
    for (int i = 0; i < N_COLS; i++) { free(d->cols[i].values.p); free(d->cols[i].offsets.p); free(d->cols[i].valid.p); }
    free(d->resource.p);
    free(d->scratch.p);
    free(d->span_keys.keys);
    free(d->inner_keys.keys);
}

static int dec_run(Dec *d, const uint8_t *body, size_t n) {
    for (int i = 0; i < N_COLS; i++) {
        d->cols[i].has_offsets = HAS_OFFSETS[i];
        if (HAS_OFFSETS[i]) { int32_t z = 0; NEED(put(&d->cols[i].offsets, &z, 4)); }
    }
    Rd r = {body, body + n};
    return request(d, r);
}

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
    for (int h = 0; h < N_HOT; h++) HOT_LEN[h] = strlen(HOT_KEYS[h]);
    PyObject *m = PyModule_Create(&MODULE);
    if (m && PyModule_AddIntConstant(m, "N_COLUMNS", N_COLS) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
