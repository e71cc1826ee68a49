/* The span walk of spanrl.collector._wire: request -> resource spans -> scope spans -> span, each
 * span one row of every column (its events and links as JSON text), the resource's and scope's
 * values shared by their spans.
 */
#include "wire.h"

/* ---- columns ------------------------------------------------------------------------------------- */
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
    keys_reset(&d->span_keys);
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
    keys_reset(&d->inner_keys);
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
    keys_reset(&d->inner_keys);
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

static const int HAS_OFFSETS[N_COLS] = {
    [C_TRACE] = 1, [C_SPAN] = 1, [C_PARENT] = 1, [C_NAME] = 1, [C_KIND] = 1, [C_STATUS] = 1,
    [C_STATUS_MSG] = 1, [C_SERVICE] = 1, [C_SCOPE_NAME] = 1, [C_SCOPE_VERSION] = 1, [C_ROLLOUT] = 1,
    [C_TASK] = 1, [C_MODE] = 1, [C_AGENT] = 1, [C_OPERATION] = 1, [C_RESPONSE] = 1, [C_PROMPT] = 1,
    [C_COMPLETION] = 1, [C_LOGPROBS] = 1, [C_REWARD_NAME] = 1, [C_ATTRS] = 1, [C_RESOURCE] = 1,
    [C_EVENTS] = 1, [C_LINKS] = 1,
};

void dec_free(Dec *d) {
    for (int i = 0; i < N_COLS; i++) { free(d->cols[i].values.p); free(d->cols[i].offsets.p); free(d->cols[i].valid.p); }
    free(d->resource.p);
    free(d->scratch.p);
    Keys *keys[] = {&d->span_keys, &d->inner_keys};
    for (int i = 0; i < 2; i++) { free(keys[i]->keys); free(keys[i]->hashes); free(keys[i]->slots); }
}

int dec_run(Dec *d, const uint8_t *body, size_t n, size_t limit) {
    d->budget.limit = limit;
    Budget *bu = &d->budget;
    for (int i = 0; i < N_COLS; i++) {
        Col *c = &d->cols[i];
        c->values.budget = c->offsets.budget = c->valid.budget = bu;
        c->has_offsets = HAS_OFFSETS[i];
        if (HAS_OFFSETS[i]) { int32_t z = 0; NEED(put(&c->offsets, &z, 4)); }
    }
    d->resource.budget = d->scratch.budget = d->span_keys.budget = d->inner_keys.budget = bu;
    Rd r = {body, body + n};
    return request(d, r);
}

