/* The text side of spanrl.collector._wire: strict UTF-8 (upb's rule for proto3 strings), AnyValue
 * parsing, JSON text byte for byte as orjson writes it (floats included), and the typed hot-key
 * coercions that mirror encoding._as_str / _as_int / _as_float.
 */
#include "wire.h"

#include <math.h>
#include <stdio.h>

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
int rd_string(Rd *r, Rd *s) { NEED(rd_len(r, s)); return utf8_ok(s->p, (size_t)(s->end - s->p)); }

/* ---- JSON text, as orjson writes it -------------------------------------------------------------- */

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull
/* Whether none of 8 bytes needs escaping (< 0x20, '"', '\\'): the usual bit tricks, exact as a yes/no. */
static inline int word_plain(uint64_t w) {
    uint64_t quote = w ^ (ONES * '"'), slash = w ^ (ONES * '\\');
    return !((((w - ONES * 0x20) & ~w) | ((quote - ONES) & ~quote) | ((slash - ONES) & ~slash)) & HIGHS);
}

int json_str(Buf *b, const uint8_t *s, size_t n) {
    if (!n) return PUTS(b, "\"\""); /* an absent field's s is NULL: no arithmetic on it */
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

int put_u64(Buf *b, uint64_t v) {
    char t[24];
    int i = 24;
    do { t[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    return put(b, t + i, (size_t)(24 - i));
}
static int put_i64(Buf *b, int64_t v) {
    if (v < 0) { NEED(putc_(b, '-')); return put_u64(b, 0 - (uint64_t)v); }
    return put_u64(b, (uint64_t)v);
}

/* `t`, as "%.*e" writes a positive double ("d.ddde-XX"), -> its digits and exponent; 0 where a locale
 * (an embedding app's setlocale) writes ',' for the point: Python's path then. */
static int e_parts(const char *t, char *digits, int *k, int *e) {
    const char *q = t;
    for (*k = 0; *q && *q != 'e'; q++) {
        if (*q >= '0' && *q <= '9') digits[(*k)++] = *q;
        else NEED(*q == '.');
    }
    NEED(*q == 'e');
    *e = atoi(q + 1);
    return 1;
}
/* digits[0..k) x 10^e read back as a double. */
static double e_value(const char *digits, int k, int e) {
    char t[48];
    snprintf(t, sizeof t, "%c.%.*se%d", digits[0], k - 1, digits + 1, e);
    return strtod(t, NULL);
}
/* The shortest digits that read back as `x` (> 0), the nearest of them to it: Python's repr, orjson's
 * text. For each length from 15 (a subnormal from 1: it has fewer) up: the nearest decimal of that many
 * digits (printf's rounding) if it reads back; else, when it lies below `x`, the next one up, which
 * reads back where the rounding interval is wider above than below (x a power of two: 2^-24 is
 * 5.960464477539063e-08 in 16 digits; its nearest 16-digit decimal ...062 lies outside the interval). */
static int shortest(double x, char *digits, int *k, int *e) {
    char t[40];
    for (int prec = x < 2.2250738585072014e-308 ? 1 : 15; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*e", prec - 1, x);
        NEED(e_parts(t, digits, k, e));
        double back = strtod(t, NULL);
        if (back == x) return 1;
        if (back > x || prec == 17) continue;
        int i = *k - 1;
        while (i >= 0 && digits[i] == '9') digits[i--] = '0';
        if (i < 0) { digits[0] = '1'; ++*e; } else digits[i]++;
        if (e_value(digits, *k, *e) == x) return 1;
    }
    snprintf(t, sizeof t, "%.16e", x); /* 17 digits always read back */
    return e_parts(t, digits, k, e);
}

/* Laid out as orjson does: 0.0, 1.5, 1e+16, 1.5e-7, 0.00001. */
static int put_double(Buf *b, double d) {
    if (isnan(d) || isinf(d)) return PUTS(b, "null");
    if (d == 0) return signbit(d) ? PUTS(b, "-0.0") : PUTS(b, "0.0");
    char digits[24];
    int k, e;
    NEED(shortest(fabs(d), digits, &k, &e));
    while (k > 1 && digits[k - 1] == '0') k--;
    if (d < 0) NEED(putc_(b, '-'));
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


/* One AnyValue with at most one field (a second one would replace the first in upb). */
int any_parse(Rd r, AnyV *v) {
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

int any_json(Buf *b, const AnyV *v, int depth) {
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

int as_str(const AnyV *v, CStr *out) {
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
int as_int(const AnyV *v, int *valid, int32_t *out) {
    *valid = v->kind == V_INT && v->i >= INT32_MIN && v->i <= INT32_MAX;
    if (*valid) *out = (int32_t)v->i;
    return v->kind != V_STR; /* int("...") has Python's own rules */
}
int as_float(const AnyV *v, int *valid, double *out) {
    *valid = v->kind == V_INT || v->kind == V_DOUBLE;
    if (*valid) *out = v->kind == V_INT ? (double)v->i : v->d;
    return v->kind != V_STR;
}
