/* A protobuf-aware libFuzzer mutator (LLVMFuzzerCustomMutator) for bench/fuzz/fuzz_wire.c.
 *
 * Byte mutations of a protobuf body break the enclosing lengths, so most of them are refused at the
 * first length check. Here the input is parsed as a tree of wire-format fields (a length-delimited
 * field whose payload parses whole is a message, else bytes), one field is changed, and the tree is
 * written back with every enclosing length right. A third of the calls are libFuzzer's own mutation of
 * the whole input. The changes: drop a field, repeat it, copy another field (any depth) next to it,
 * write its tag or length as an overlong varint (6-10 bytes: upb refuses those, a 2-5 byte one it reads),
 * give a varint an edge value (0, 1, 2^31, 2^32 - 1, 2^63, -1, ...), renumber the field or change its wire
 * type, mutate a bytes payload with libFuzzer's mutator, or wrap a field in a message of its own (deep
 * nesting). Schema-free: the decoder under test decides what any field means.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

#define MAX_NODES 4096
#define MAX_TREE_DEPTH 24
#define ARENA 65536

typedef struct {
    uint32_t field;
    uint8_t wt, tag_pad, len_pad;
    uint64_t value;      /* varint value */
    const uint8_t *raw;  /* fixed32/64 bytes, or a bytes payload */
    size_t rawlen;
    int first, next;     /* children (a message payload) and the next sibling; -1: none */
    int is_msg;
} Node;

static Node nodes[MAX_NODES];
static int n_nodes;
static uint8_t arena[ARENA];
static size_t arena_used;
static uint64_t rng;

static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static int pick(int n) { return (int)(rnd() % (uint64_t)n); }

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 10 && *p < end; i++) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) { *out = v; return 1; }
    }
    return 0;
}

/* The fields of [p, end) as a sibling list; its first node (or -1, or -2 if it does not parse). */
static int parse(const uint8_t *p, const uint8_t *end, int depth) {
    int first = -1, last = -1;
    while (p < end) {
        uint64_t tag, len;
        if (!read_varint(&p, end, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF || n_nodes >= MAX_NODES) return -2;
        Node *nd = &nodes[n_nodes];
        memset(nd, 0, sizeof *nd);
        nd->field = (uint32_t)(tag >> 3);
        nd->wt = (uint8_t)(tag & 7);
        nd->first = nd->next = -1;
        switch (nd->wt) {
            case 0: if (!read_varint(&p, end, &nd->value)) return -2; break;
            case 1: if (end - p < 8) return -2; nd->raw = p; nd->rawlen = 8; p += 8; break;
            case 5: if (end - p < 4) return -2; nd->raw = p; nd->rawlen = 4; p += 4; break;
            case 2:
                if (!read_varint(&p, end, &len) || len > (uint64_t)(end - p)) return -2;
                nd->raw = p;
                nd->rawlen = (size_t)len;
                p += len;
                break;
            default: return -2;
        }
        int me = n_nodes++;
        if (nodes[me].wt == 2 && nodes[me].rawlen && depth < MAX_TREE_DEPTH) {
            int keep = n_nodes, kids = parse(nodes[me].raw, nodes[me].raw + nodes[me].rawlen, depth + 1);
            if (kids >= 0) { nodes[me].first = kids; nodes[me].is_msg = 1; }
            else n_nodes = keep; /* bytes, not a message */
        }
        if (last >= 0) nodes[last].next = me; else first = me;
        last = me;
    }
    return first;
}

static size_t varint_size(uint64_t v, int pad) {
    size_t n = 1;
    while (v >= 0x80) { v >>= 7; n++; }
    return n + (size_t)pad;
}
static size_t list_size(int i);
static size_t content_size(const Node *nd) { return nd->is_msg ? list_size(nd->first) : nd->rawlen; }
static size_t node_size(const Node *nd) {
    size_t n = varint_size((uint64_t)nd->field << 3 | nd->wt, nd->tag_pad);
    if (nd->wt == 0) return n + varint_size(nd->value, 0);
    if (nd->wt != 2) return n + nd->rawlen;
    size_t c = content_size(nd);
    return n + varint_size(c, nd->len_pad) + c;
}
static size_t list_size(int i) {
    size_t n = 0;
    for (; i >= 0; i = nodes[i].next) n += node_size(&nodes[i]);
    return n;
}

/* v as a varint, `pad` bytes longer than it needs (continuation bits on, then 0x80s and a final 0). */
static uint8_t *put_varint(uint8_t *o, uint64_t v, int pad) {
    while (v >= 0x80) { *o++ = (uint8_t)(v & 0x7F) | 0x80; v >>= 7; }
    if (!pad) { *o++ = (uint8_t)v; return o; }
    *o++ = (uint8_t)v | 0x80;
    for (int k = 1; k < pad; k++) *o++ = 0x80;
    *o++ = 0;
    return o;
}
static uint8_t *put_list(uint8_t *o, int i) {
    for (; i >= 0; i = nodes[i].next) {
        const Node *nd = &nodes[i];
        o = put_varint(o, (uint64_t)nd->field << 3 | nd->wt, nd->tag_pad);
        if (nd->wt == 0) { o = put_varint(o, nd->value, 0); continue; }
        if (nd->wt == 2) o = put_varint(o, content_size(nd), nd->len_pad);
        if (nd->is_msg) o = put_list(o, nd->first);
        else { memcpy(o, nd->raw, nd->rawlen); o += nd->rawlen; }
    }
    return o;
}

/* A copy of node `j` (its subtree shared: nodes are not changed in place after this). */
static int clone(int j) {
    if (n_nodes >= MAX_NODES) return -1;
    nodes[n_nodes] = nodes[j];
    nodes[n_nodes].next = -1;
    return n_nodes++;
}

static const uint64_t EDGES[] = {0, 1, 2, 0x7F, 0x80, 0x3FFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x100000000ull,
                                 0x7FFFFFFFFFFFFFFFull, 0x8000000000000000ull, 0xFFFFFFFFFFFFFFFFull, 0xFFFFFFFF80000000ull};

/* One change to node `i` (parent's child list head in *head); 0 if it could not be made. */
static int change(int i, int *head) {
    Node *nd = &nodes[i];
    switch (pick(9)) {
        case 0: { /* drop it */
            if (*head == i) { *head = nd->next; return 1; }
            for (int k = *head; k >= 0; k = nodes[k].next)
                if (nodes[k].next == i) { nodes[k].next = nd->next; return 1; }
            return 0;
        }
        case 1: case 2: { /* repeat it, or put a copy of any other field beside it */
            int j = pick(3) ? i : pick(n_nodes), c = clone(j);
            if (c < 0) return 0;
            if (j != i && nodes[c].is_msg) { /* j may hold i: its copy as bytes, so no list loops */
                size_t len = list_size(nodes[c].first);
                if (len > ARENA - arena_used) return 0;
                put_list(arena + arena_used, nodes[c].first);
                nodes[c].raw = arena + arena_used;
                nodes[c].rawlen = len;
                nodes[c].is_msg = 0;
                arena_used += len;
            }
            nodes[c].next = nd->next;
            nd->next = c;
            return 1;
        }
        case 3: { /* overlong tag or length: 6-10 bytes mostly, 2-5 sometimes */
            int pad = pick(4) ? 5 + pick(5) : 1 + pick(4);
            if (nd->wt == 2 && pick(2)) nd->len_pad = (uint8_t)pad; else nd->tag_pad = (uint8_t)pad;
            return 1;
        }
        case 4: /* an edge value */
            if (nd->wt != 0) return 0;
            nd->value = pick(4) ? EDGES[pick(sizeof EDGES / sizeof *EDGES)] : nd->value + (uint64_t)(pick(5) - 2);
            return 1;
        case 5: nd->field = pick(3) ? (uint32_t)(1 + pick(20)) : nd->field + 1; return 1;
        case 6: { /* another wire type, keeping what it holds when it can */
            static const uint8_t WT[] = {0, 1, 2, 5};
            nd->wt = WT[pick(4)];
            if (nd->wt != 2) nd->is_msg = 0;
            if (nd->wt == 1 || nd->wt == 5) {
                size_t w = nd->wt == 1 ? 8 : 4;
                if (arena_used + w > ARENA) return 0;
                for (size_t k = 0; k < w; k++) arena[arena_used + k] = (uint8_t)rnd();
                nd->raw = arena + arena_used;
                nd->rawlen = w;
                nd->is_msg = 0;
                arena_used += w;
            } else if (nd->wt == 2 && !nd->raw) {
                nd->rawlen = 0;
                nd->raw = arena;
            }
            return 1;
        }
        case 7: { /* its bytes through libFuzzer's mutator */
            if (nd->wt != 2 || nd->is_msg) return 0;
            size_t room = ARENA - arena_used, cap = nd->rawlen + 64;
            if (cap > room || cap > 8192) return 0;
            memcpy(arena + arena_used, nd->raw, nd->rawlen);
            nd->rawlen = LLVMFuzzerMutate(arena + arena_used, nd->rawlen, cap);
            nd->raw = arena + arena_used;
            arena_used += cap;
            return 1;
        }
        default: { /* wrap it: a message holding a copy of it (AnyValue inside ArrayValue: deeper arrays) */
            int c = clone(i);
            if (c < 0) return 0;
            nd->wt = 2;
            nd->is_msg = 1;
            nd->first = c;
            nd->len_pad = nd->tag_pad = 0;
            return 1;
        }
    }
}

/* The head of the child list that holds node `i` (the root list is `root`). */
static int *holder(int *root, int i) {
    for (int k = *root; k >= 0; k = nodes[k].next) if (k == i) return root;
    for (int k = 0; k < n_nodes; k++)
        if (nodes[k].is_msg)
            for (int c = nodes[k].first; c >= 0; c = nodes[c].next) if (c == i) return &nodes[k].first;
    return NULL;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    rng = (uint64_t)seed * 0x9E3779B97F4A7C15ull | 1;
    n_nodes = 0;
    arena_used = 0;
    int root = pick(3) ? parse(data, data + size, 0) : -2;
    if (root < 0) return LLVMFuzzerMutate(data, size, max_size);
    for (int changes = 1 + (pick(4) == 0) * pick(4); changes > 0; changes--) {
        int i = pick(n_nodes), *head = holder(&root, i);
        if (head) change(i, head);
    }
    static uint8_t out[1 << 20]; /* not in place: the nodes point into `data` */
    size_t n = list_size(root);
    if (n > max_size || n > sizeof out) return LLVMFuzzerMutate(data, size, max_size);
    put_list(out, root);
    memcpy(data, out, n);
    return n;
}
