/* Attributes in spanrl.collector._wire: KeyValue lists as JSON objects, the hot keys that also fill
 * typed columns, and the token-id / log-prob arrays (plain OTLP arrays, base64 or raw bytes) written
 * straight into the three list columns.
 */
#include "wire.h"

/* ---- hot keys --------------------------------------------------------------------------------- */
static const char *const HOT_KEYS[N_HOT] = {
    "spanrl.rollout.id", "spanrl.task.id", "spanrl.rollout.attempt", "spanrl.rollout.mode",
    "gen_ai.agent.name", "gen_ai.operation.name", "gen_ai.response.id", "spanrl.policy.version",
    "spanrl.reward.value", "spanrl.reward.name", "gen_ai.evaluation.score.value",
    "gen_ai.evaluation.name", "service.name", "spanrl.llm.prompt_token_ids",
    "spanrl.llm.completion_token_ids", "spanrl.llm.logprobs",
};
static size_t HOT_LEN[N_HOT];

void hot_init(void) {
    for (int h = 0; h < N_HOT; h++) HOT_LEN[h] = strlen(HOT_KEYS[h]);
}

/* Which keys a list of attributes looks for: none (events, links, scope), the resource's, the span's. */

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

/* ---- duplicate keys ----------------------------------------------------------------------------- */
/* A duplicate key sends the request to Python (its dict keeps the last value at the first one's place).
 * Keys are the same exactly when their bytes are (both are valid UTF-8). A short list is scanned; from
 * KEYS_SCAN keys on, a hash set at most 1/4 full: linear in the list, 160,000 keys in milliseconds. The
 * hash is not keyed, so an input can be built whose keys collide: a probe sequence past KEYS_PROBES
 * sends the request to Python (which any input can choose anyway), so the work stays linear. */
#define KEYS_SCAN 16
#define KEYS_PROBES 32

static int same_key(Rd a, Rd b) {
    size_t n = (size_t)(a.end - a.p);
    return (size_t)(b.end - b.p) == n && (n == 0 || memcmp(a.p, b.p, n) == 0);
}
static uint64_t key_hash(Rd key) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)(key.end - key.p);
    const uint8_t *p = key.p;
    for (; key.end - p >= 8; p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    uint64_t w = 0;
    for (int i = 0; p < key.end; p++, i += 8) w |= (uint64_t)*p << i;
    h = (h ^ w) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
}
/* Key `i` into the set; 0 if an equal key is there or the probe sequence is too long. */
static int slot_put(Keys *k, size_t i) {
    size_t mask = k->nslots - 1, at = (size_t)k->hashes[i] & mask;
    for (int probes = 0; k->slots[at]; at = (at + 1) & mask) {
        size_t j = k->slots[at] - 1;
        NEED(++probes < KEYS_PROBES && !(k->hashes[j] == k->hashes[i] && same_key(k->keys[j], k->keys[i])));
    }
    k->slots[at] = (uint32_t)(i + 1);
    return 1;
}
/* The set rebuilt from keys[0..n) with room for `want` keys. */
static int keys_index(Keys *k, size_t want) {
    size_t nslots = 64;
    while (nslots < 4 * want) nslots *= 2;
    if (nslots != k->nslots) { /* smaller too: a short list after a long one clears a short table */
        free(k->slots);
        budget_give(k->budget, k->nslots * sizeof *k->slots);
        k->slots = NULL;
        k->nslots = 0;
        NEED(budget_take(k->budget, nslots * sizeof *k->slots) && (k->slots = malloc(nslots * sizeof *k->slots)));
        k->nslots = nslots;
    }
    memset(k->slots, 0, k->nslots * sizeof *k->slots);
    NEED(grow_array(k->budget, (void **)&k->hashes, &k->hcap, k->cap, sizeof *k->hashes));
    for (size_t i = 0; i < k->n; i++) {
        if (!k->indexed) k->hashes[i] = key_hash(k->keys[i]);
        NEED(slot_put(k, i));
    }
    k->indexed = 1;
    return 1;
}

static int keys_add(Keys *k, Rd key) {
    NEED(k->n < UINT32_MAX - 1 && grow_array(k->budget, (void **)&k->keys, &k->cap, k->n + 1, sizeof *k->keys));
    if (k->n < KEYS_SCAN) {
        for (size_t i = 0; i < k->n; i++) NEED(!same_key(k->keys[i], key));
        k->keys[k->n++] = key;
        return 1;
    }
    if (!k->indexed || 4 * (k->n + 1) > k->nslots) NEED(keys_index(k, 2 * k->n));
    NEED(grow_array(k->budget, (void **)&k->hashes, &k->hcap, k->cap, sizeof *k->hashes));
    k->keys[k->n] = key;
    k->hashes[k->n] = key_hash(key);
    NEED(slot_put(k, k->n));
    k->n++;
    return 1;
}

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
int kv_entry(Dec *d, Buf *out, Keys *keys, int mode, Hot *hot, Rd r) {
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
int attrs_json(Dec *d, Buf *out, Rd r, uint32_t field) {
    keys_reset(&d->inner_keys);
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
