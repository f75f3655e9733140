/* OTLP ExportTraceServiceRequest (protobuf wire format) -> spans-table columns as Arrow buffers.
 *
 * The C twin of latscope/collector/mapping.py's SpanColumns, which stays the reference: the
 * differential tests in tests/test_collector_fuzz.py hold the two to the same tables, the same
 * rejections and the same first problem. Input is untrusted network bytes: every read is
 * bounds-checked, and anything upb (the protobuf runtime behind grpc's Python parse) would refuse
 * is refused here too, as a MalformedExport for the whole Export:
 *
 *   - tags of at most 5 bytes whose value fits 32 bits, field number not 0, wire types 0-5;
 *   - varints of at most 10 bytes, lengths of at most 5 bytes that fit what is left;
 *   - valid UTF-8 in every proto3 string field of the schema, also in parts not stored;
 *   - messages and groups nested at most 100 deep (upb's default limit);
 *   - a known field with an unexpected wire type is an unknown field (skipped), as in upb;
 *   - a singular message field sent twice is merged, a scalar sent twice keeps the last value.
 *
 * Output: one Arrow buffer per offsets/data/values array of DECODED_SPANS_SCHEMA (the B_* enum
 * below), handed to Arrow as one struct array of the Arrow C data interface (batch_of), which
 * mapping.py imports. Rare, fiddly values (arrays and kvlists, rendered as JSON) are handed back
 * to Python one value at a time.
 *
 * Built by setuptools at install time (pyproject.toml, ext-modules); after editing this file,
 * run `pip install -e .` again to rebuild the extension an editable install imports.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 100

/* -- buffers ------------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

/* Every buffer of the output (batch_of places each in its column). String columns are an
 * offsets buffer (int32, n+1 entries) followed by a data buffer; maps are row offsets, then
 * the key and value string columns; lists are row offsets followed by their children. Columns
 * written only once a span is accepted come first; from B_ATT_O on, a rejected span rolls
 * back what it wrote.
 *
 * The resource attributes a batch's spans share are stored once, as an Arrow dictionary: each
 * row holds an index (B_RES_IX) into one entry per resource (B_RESD_*). Copied onto every span,
 * they made a 7.9 MB Export with large resource attributes half a gigabyte of columns.
 * ClickHouse expands the dictionary on insert: the stored table is the same. An entry is added
 * when the first span of its resource is accepted, so the dictionary holds only what some row
 * refers to. (String columns stay plain: ClickHouse refuses a string dictionary with repeated
 * values, and service and scope names are short.) */
enum {
    B_TS, B_DUR,
    B_TID_O, B_TID_D, B_SID_O, B_SID_D, B_PAR_O, B_PAR_D, B_TST_O, B_TST_D,
    B_NAME_O, B_NAME_D, B_KIND_O, B_KIND_D, B_SVC_O, B_SVC_D,
    B_RES_IX, B_RESD_O, B_RESD_KO, B_RESD_KD, B_RESD_VO, B_RESD_VD,
    B_SCN_O, B_SCN_D, B_SCV_O, B_SCV_D, B_STC_O, B_STC_D, B_STM_O, B_STM_D,
    B_ATT_O, B_ATT_KO, B_ATT_KD, B_ATT_VO, B_ATT_VD,
    B_EV_O, B_EV_TS, B_EVN_O, B_EVN_D, B_EVA_O, B_EVA_KO, B_EVA_KD, B_EVA_VO, B_EVA_VD,
    B_LN_O, B_LNT_O, B_LNT_D, B_LNS_O, B_LNS_D, B_LNST_O, B_LNST_D,
    B_LNA_O, B_LNA_KO, B_LNA_KD, B_LNA_VO, B_LNA_VD,
    B_TF_O, B_TF_D,
    NB
};
#define B_ROLLBACK B_ATT_O

/* Which buffers are int32 offsets (they start with one 0 entry). */
static const unsigned char IS_OFFSETS[NB] = {
    [B_TID_O] = 1, [B_SID_O] = 1, [B_PAR_O] = 1, [B_TST_O] = 1, [B_NAME_O] = 1,
    [B_KIND_O] = 1, [B_SVC_O] = 1, [B_RESD_O] = 1, [B_RESD_KO] = 1, [B_RESD_VO] = 1,
    [B_SCN_O] = 1, [B_SCV_O] = 1, [B_STC_O] = 1, [B_STM_O] = 1,
    [B_ATT_O] = 1, [B_ATT_KO] = 1, [B_ATT_VO] = 1,
    [B_EV_O] = 1, [B_EVN_O] = 1, [B_EVA_O] = 1, [B_EVA_KO] = 1, [B_EVA_VO] = 1,
    [B_LN_O] = 1, [B_LNT_O] = 1, [B_LNS_O] = 1, [B_LNST_O] = 1,
    [B_LNA_O] = 1, [B_LNA_KO] = 1, [B_LNA_VO] = 1,
    [B_TF_O] = 1,
};

typedef struct {
    const uint8_t *p;
    size_t n;
} Slice;

typedef struct {
    Slice *v;
    size_t len, cap;
} SliceList;

enum { E_MALFORMED = 1, E_NOMEM, E_TOOBIG, E_PY };

enum { P_NONE, P_TRACE, P_SPAN, P_PARENT, P_END, P_TIME, P_OLD, P_FUTURE, P_COUNT, P_LONG,
       P_EVENT_TIME };
enum { W_SPAN, W_EVENT, W_LINK };

/* Why a span is rejected; formatted into text only for the first rejection of an Export. */
typedef struct {
    int kind;
    int where;          /* W_*: the attributes of the span, of an event, of a link */
    Py_ssize_t n;       /* P_COUNT: how many attributes; P_LONG: the value's length */
    Slice key;          /* P_LONG: the attribute */
    Slice event;        /* W_EVENT: the event's name */
} Problem;

typedef struct {
    size_t e0, n;
} RowCache;

typedef struct {
    Buf b[NB];
    Buf res[4];            /* the current resource's attributes: key offsets, keys, value offsets, values */
    Slice service;         /* service.name among them */
    int32_t res_ix;        /* the resource's dictionary entry, -1 until a span of it is accepted */
    int32_t n_res;         /* dictionary entries so far */
    SliceList res_kvs, span_kvs, sub_kvs, values, events, links;
    uint32_t *htab;
    size_t hcap;
    /* Per map (span, event, link attributes): the last row found free of repeated keys. The
     * next row with the same keys needs no check: consecutive spans mostly share them. */
    RowCache seen[3];
    long long max_attrs, max_value;
    /* the span time window (ns since the epoch; 0: no bound) */
    uint64_t oldest_start, latest_end;
    size_t max_bytes, total;
    int64_t *tokens;       /* scratch for a span's token offsets, then their gaps */
    size_t tokens_cap;
    Py_ssize_t rows, rejected;
    /* The current resource's attributes once written out on a row (the Arrow bytes of a map
     * entry: keys, values, two offsets a pair and one a row), and the sum over the rows so far:
     * what inserting the resource dictionary expanded costs (mapping.expanded_bytes). */
    uint64_t res_entry, res_rows_bytes;
    PyObject *first_problem;
    PyObject *render;      /* Python callable: AnyValue bytes -> str (arrays, kvlists) */
    PyThreadState *ts;     /* while the decode runs without the GIL: this thread's state */
    const char *why;       /* E_MALFORMED: what was wrong */
    int err;
} Ctx;

#define BAD(c, text) ((c)->err = E_MALFORMED, (c)->why = (text), -1)

/* The decode runs without the GIL (decode_traces): the few steps that call Python's API (a
 * double's repr, an array or kvlist rendered by Python, the first rejection's text) take it
 * back for that call. */
static inline void gil_take(Ctx *c)
{
    if (c->ts != NULL)
        PyEval_RestoreThread(c->ts);
}

static inline void gil_give(Ctx *c)
{
    if (c->ts != NULL)
        c->ts = PyEval_SaveThread();
}

static int grow(Ctx *c, Buf *b, size_t extra)
{
    /* What is bounded is the memory the Export's columns take: the sum of all capacities. */
    if (extra > c->max_bytes) {
        c->err = E_TOOBIG;
        return -1;
    }
    size_t want = b->len + extra;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < want)
        cap *= 2;
    if (cap - b->cap > c->max_bytes - c->total) {
        c->err = E_TOOBIG;
        return -1;
    }
    char *p = realloc(b->p, cap);
    if (p == NULL) {
        c->err = E_NOMEM;
        return -1;
    }
    c->total += cap - b->cap;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int need(Ctx *c, Buf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    return grow(c, b, extra);
}

static inline void put_i32(Buf *b, int32_t v)
{
    memcpy(b->p + b->len, &v, 4);
    b->len += 4;
}

static inline int32_t get_i32(const Buf *b, size_t i)
{
    int32_t v;
    memcpy(&v, b->p + 4 * i, 4);
    return v;
}

static inline size_t n_offsets(const Buf *b) { return b->len / 4 - 1; }

static inline int push_off(Ctx *c, Buf *o, size_t value)
{
    if (value > INT32_MAX) {
        c->err = E_TOOBIG;
        return -1;
    }
    if (need(c, o, 4))
        return -1;
    put_i32(o, (int32_t)value);
    return 0;
}

/* Append one string to the column whose offsets are o and data o + 1. */
static inline int add_str(Ctx *c, Buf *o, const void *p, size_t n)
{
    Buf *d = o + 1;
    if (need(c, d, n))
        return -1;
    if (n)
        memcpy(d->p + d->len, p, n);
    d->len += n;
    return push_off(c, o, d->len);
}

static int slices_push(Ctx *c, SliceList *l, const uint8_t *p, size_t n)
{
    if (l->len == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        Slice *v = realloc(l->v, cap * sizeof(Slice));
        if (v == NULL) {
            c->err = E_NOMEM;
            return -1;
        }
        l->v = v;
        l->cap = cap;
    }
    l->v[l->len].p = p;
    l->v[l->len].n = n;
    l->len++;
    return 0;
}

/* -- wire format --------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *p, *end;
} Rd;

static int varint_slow(Ctx *c, Rd *r, uint64_t *out)
{
    const uint8_t *p = r->p;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= r->end)
            return BAD(c, "truncated varint");
        uint8_t byte = *p++;
        v |= (uint64_t)(byte & 0x7f) << (7 * i);
        if (!(byte & 0x80)) {
            r->p = p;
            *out = v;
            return 0;
        }
    }
    return BAD(c, "varint longer than 10 bytes");
}

static inline int rd_varint(Ctx *c, Rd *r, uint64_t *out)
{
    if (r->p < r->end && !(*r->p & 0x80)) {
        *out = *r->p++;
        return 0;
    }
    return varint_slow(c, r, out);
}

/* Tags and lengths: upb reads at most 5 bytes for either. */
static int rd_u32ish(Ctx *c, Rd *r, uint64_t *out, const char *what)
{
    const uint8_t *p = r->p;
    uint64_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (p >= r->end)
            return BAD(c, what);
        uint8_t byte = *p++;
        v |= (uint64_t)(byte & 0x7f) << (7 * i);
        if (!(byte & 0x80)) {
            r->p = p;
            *out = v;
            return 0;
        }
    }
    return BAD(c, what);
}

static inline int rd_tag(Ctx *c, Rd *r, uint32_t *field, int *wt)
{
    uint64_t v;
    if (r->p < r->end && !(*r->p & 0x80)) {
        v = *r->p++;
    } else if (rd_u32ish(c, r, &v, "bad tag")) {
        return -1;
    }
    if (v > UINT32_MAX || (v >> 3) == 0)
        return BAD(c, "bad tag");
    *field = (uint32_t)(v >> 3);
    *wt = (int)(v & 7);
    return 0;
}

static inline int rd_len(Ctx *c, Rd *r, Slice *s)
{
    uint64_t v;
    if (r->p < r->end && !(*r->p & 0x80)) {
        v = *r->p++;
    } else if (rd_u32ish(c, r, &v, "bad length")) {
        return -1;
    }
    if (v > (uint64_t)(r->end - r->p))
        return BAD(c, "length past the end of the message");
    s->p = r->p;
    s->n = (size_t)v;
    r->p += v;
    return 0;
}

static inline int rd_fixed64(Ctx *c, Rd *r, uint64_t *out)
{
    if (r->end - r->p < 8)
        return BAD(c, "truncated fixed64");
    memcpy(out, r->p, 8); /* little-endian hosts only; see the check in module init */
    r->p += 8;
    return 0;
}

static inline int rd_skip(Ctx *c, Rd *r, size_t n)
{
    if ((size_t)(r->end - r->p) < n)
        return BAD(c, "truncated field");
    r->p += n;
    return 0;
}

/* Skip an unknown field (or a known one with an unexpected wire type); groups are walked so
 * their contents are checked the way upb checks them. depth is the level of the message that
 * holds the field. */
static int skip_field(Ctx *c, Rd *r, uint32_t field, int wt, int depth)
{
    uint64_t v;
    Slice s;
    switch (wt) {
    case 0:
        return rd_varint(c, r, &v);
    case 1:
        return rd_skip(c, r, 8);
    case 2:
        return rd_len(c, r, &s);
    case 5:
        return rd_skip(c, r, 4);
    case 3:
        if (depth + 1 > MAX_DEPTH)
            return BAD(c, "groups nested too deeply");
        for (;;) {
            uint32_t f;
            int w;
            if (r->p >= r->end)
                return BAD(c, "unterminated group");
            if (rd_tag(c, r, &f, &w))
                return -1;
            if (w == 4) {
                if (f != field)
                    return BAD(c, "mismatched end of group");
                return 0;
            }
            if (skip_field(c, r, f, w, depth + 1))
                return -1;
        }
    case 4:
        return BAD(c, "unexpected end of group");
    default:
        return BAD(c, "bad wire type");
    }
}

static int utf8_slow(const uint8_t *s, size_t n, size_t i)
{
    while (i < n) {
        uint8_t c0 = s[i];
        if (c0 < 0x80) {
            i++;
        } else if (c0 < 0xC2) {
            return 0;
        } else if (c0 < 0xE0) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80)
                return 0;
            i += 2;
        } else if (c0 < 0xF0) {
            if (i + 2 >= n)
                return 0;
            uint8_t c1 = s[i + 1], c2 = s[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80)
                return 0;
            if ((c0 == 0xE0 && c1 < 0xA0) || (c0 == 0xED && c1 >= 0xA0))
                return 0; /* overlong, or a surrogate */
            i += 3;
        } else if (c0 < 0xF5) {
            if (i + 3 >= n)
                return 0;
            uint8_t c1 = s[i + 1], c2 = s[i + 2], c3 = s[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80)
                return 0;
            if ((c0 == 0xF0 && c1 < 0x90) || (c0 == 0xF4 && c1 >= 0x90))
                return 0; /* overlong, or above U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static inline int utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ULL)
            return utf8_slow(s, n, i);
    }
    for (; i < n; i++)
        if (s[i] & 0x80)
            return utf8_slow(s, n, i);
    return 1;
}

static inline int rd_string(Ctx *c, Rd *r, Slice *s)
{
    if (rd_len(c, r, s))
        return -1;
    if (!utf8_ok(s->p, s->n))
        return BAD(c, "string field is not valid UTF-8");
    return 0;
}

/* Code points of valid UTF-8: what Python's len() of the decoded string gives. */
static Py_ssize_t code_points(const uint8_t *s, size_t n)
{
    Py_ssize_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += (s[i] & 0xC0) != 0x80;
    return count;
}

/* -- schema, for the parts that are checked but not stored ---------------------------------- */

enum { K_VARINT, K_FIXED64, K_FIXED32, K_BYTES, K_STRING, K_MSG };
static const int WIRE[] = {0, 1, 5, 2, 2, 2};

enum { T_KV, T_ANY, T_ARR, T_KVL, T_ENT, T_SS, T_SCOPE, T_SPAN, T_EVENT, T_LINK, T_STATUS, NT };

typedef struct {
    uint32_t field;
    unsigned char kind, sub;
} FieldDef;

typedef struct {
    const FieldDef *f;
    int n;
} MsgDef;

static const FieldDef F_KV[] = {{1, K_STRING, 0}, {2, K_MSG, T_ANY}, {3, K_VARINT, 0}};
static const FieldDef F_ANY[] = {
    {1, K_STRING, 0}, {2, K_VARINT, 0}, {3, K_VARINT, 0}, {4, K_FIXED64, 0},
    {5, K_MSG, T_ARR}, {6, K_MSG, T_KVL}, {7, K_BYTES, 0}, {8, K_VARINT, 0}};
static const FieldDef F_ARR[] = {{1, K_MSG, T_ANY}};
static const FieldDef F_KVL[] = {{1, K_MSG, T_KV}};
static const FieldDef F_ENT[] = {
    {1, K_STRING, 0}, {2, K_STRING, 0}, {3, K_STRING, 0}, {4, K_STRING, 0}};
static const FieldDef F_SS[] = {{1, K_MSG, T_SCOPE}, {2, K_MSG, T_SPAN}, {3, K_STRING, 0}};
static const FieldDef F_SCOPE[] = {
    {1, K_STRING, 0}, {2, K_STRING, 0}, {3, K_MSG, T_KV}, {4, K_VARINT, 0}};
static const FieldDef F_SPAN[] = {
    {1, K_BYTES, 0}, {2, K_BYTES, 0}, {3, K_STRING, 0}, {4, K_BYTES, 0},
    {5, K_STRING, 0}, {6, K_VARINT, 0}, {7, K_FIXED64, 0}, {8, K_FIXED64, 0},
    {9, K_MSG, T_KV}, {10, K_VARINT, 0}, {11, K_MSG, T_EVENT}, {12, K_VARINT, 0},
    {13, K_MSG, T_LINK}, {14, K_VARINT, 0}, {15, K_MSG, T_STATUS}, {16, K_FIXED32, 0}};
static const FieldDef F_EVENT[] = {
    {1, K_FIXED64, 0}, {2, K_STRING, 0}, {3, K_MSG, T_KV}, {4, K_VARINT, 0}};
static const FieldDef F_LINK[] = {
    {1, K_BYTES, 0}, {2, K_BYTES, 0}, {3, K_STRING, 0}, {4, K_MSG, T_KV},
    {5, K_VARINT, 0}, {6, K_FIXED32, 0}};
static const FieldDef F_STATUS[] = {{2, K_STRING, 0}, {3, K_VARINT, 0}};

#define DEF(a) {a, (int)(sizeof(a) / sizeof(a[0]))}
static const MsgDef MSGS[NT] = {
    [T_KV] = DEF(F_KV), [T_ANY] = DEF(F_ANY), [T_ARR] = DEF(F_ARR), [T_KVL] = DEF(F_KVL),
    [T_ENT] = DEF(F_ENT), [T_SS] = DEF(F_SS), [T_SCOPE] = DEF(F_SCOPE),
    [T_SPAN] = DEF(F_SPAN), [T_EVENT] = DEF(F_EVENT), [T_LINK] = DEF(F_LINK),
    [T_STATUS] = DEF(F_STATUS),
};

/* Check a whole message of the schema without storing anything; depth is its level. */
static int check_msg(Ctx *c, int type, const uint8_t *p, size_t n, int depth)
{
    if (depth > MAX_DEPTH)
        return BAD(c, "messages nested too deeply");
    Rd r = {p, p + n};
    const MsgDef *m = &MSGS[type];
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        const FieldDef *fd = NULL;
        for (int i = 0; i < m->n; i++) {
            if (m->f[i].field == f) {
                fd = &m->f[i];
                break;
            }
        }
        if (fd == NULL || WIRE[fd->kind] != wt) {
            if (skip_field(c, &r, f, wt, depth))
                return -1;
            continue;
        }
        uint64_t v;
        Slice s;
        switch (fd->kind) {
        case K_VARINT:
            if (rd_varint(c, &r, &v))
                return -1;
            break;
        case K_FIXED64:
            if (rd_skip(c, &r, 8))
                return -1;
            break;
        case K_FIXED32:
            if (rd_skip(c, &r, 4))
                return -1;
            break;
        case K_BYTES:
            if (rd_len(c, &r, &s))
                return -1;
            break;
        case K_STRING:
            if (rd_string(c, &r, &s))
                return -1;
            break;
        default:
            if (rd_len(c, &r, &s) || check_msg(c, fd->sub, s.p, s.n, depth + 1))
                return -1;
        }
    }
    return 0;
}

static int check_all(Ctx *c, int type, const SliceList *l, size_t from, int depth)
{
    for (size_t i = from; i < l->len; i++)
        if (check_msg(c, type, l->v[i].p, l->v[i].n, depth))
            return -1;
    return 0;
}

/* -- value rendering (as pdata's Value.AsString(), like mapping.value_to_string) ------------- */

enum { V_NONE, V_STRING, V_BOOL, V_INT, V_DOUBLE, V_ARRAY, V_KVLIST, V_BYTES, V_STRINDEX };

typedef struct {
    int kind;
    uint64_t u;
    Slice s;
} AnyValue;

/* One AnyValue occurrence; a later occurrence merges into the earlier (the oneof member set
 * last wins). */
static int parse_any(Ctx *c, const uint8_t *p, size_t n, int depth, AnyValue *av)
{
    if (depth > MAX_DEPTH)
        return BAD(c, "messages nested too deeply");
    Rd r = {p, p + n};
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        uint64_t v;
        Slice s;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 1 && wt == 2) {
            if (rd_string(c, &r, &av->s))
                return -1;
            av->kind = V_STRING;
        } else if (f == 2 && wt == 0) {
            if (rd_varint(c, &r, &v))
                return -1;
            av->kind = V_BOOL;
            av->u = v != 0;
        } else if (f == 3 && wt == 0) {
            if (rd_varint(c, &r, &av->u))
                return -1;
            av->kind = V_INT;
        } else if (f == 4 && wt == 1) {
            if (rd_fixed64(c, &r, &av->u))
                return -1;
            av->kind = V_DOUBLE;
        } else if ((f == 5 || f == 6) && wt == 2) {
            if (rd_len(c, &r, &s) || check_msg(c, f == 5 ? T_ARR : T_KVL, s.p, s.n, depth + 1))
                return -1;
            av->kind = f == 5 ? V_ARRAY : V_KVLIST;
        } else if (f == 7 && wt == 2) {
            if (rd_len(c, &r, &av->s))
                return -1;
            av->kind = V_BYTES;
        } else if (f == 8 && wt == 0) {
            if (rd_varint(c, &r, &v))
                return -1;
            av->kind = V_STRINDEX;
        } else if (skip_field(c, &r, f, wt, depth)) {
            return -1;
        }
    }
    return 0;
}

static char *fmt_int(char *end, int64_t value)
{
    /* Writes backwards from end; returns the start. */
    uint64_t u = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    char *p = end;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (value < 0)
        *--p = '-';
    return p;
}

static int fmt_finite(Ctx *c, Buf *o, double v, Py_ssize_t *length);

/* Go's strconv.FormatFloat(v, 'f', -1, 64): Python's shortest repr, exponent written out
 * (mapping.format_double). */
static int fmt_double(Ctx *c, Buf *o, double v, Py_ssize_t *length)
{
    if (isnan(v)) {
        *length = 3;
        return add_str(c, o, "NaN", 3);
    }
    if (isinf(v)) {
        *length = 4;
        return add_str(c, o, v > 0 ? "+Inf" : "-Inf", 4);
    }
    gil_take(c);
    int rc = fmt_finite(c, o, v, length);
    gil_give(c);
    return rc;
}

static int fmt_finite(Ctx *c, Buf *o, double v, Py_ssize_t *length)
{
    char *repr = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (repr == NULL) {
        c->err = E_PY;
        return -1;
    }
    size_t n = strlen(repr);
    char *e = strchr(repr, 'e');
    int rc;
    if (e == NULL) {
        if (n >= 2 && repr[n - 2] == '.' && repr[n - 1] == '0')
            n -= 2;
        *length = (Py_ssize_t)n;
        rc = add_str(c, o, repr, n);
    } else {
        /* d[.ddd]e[+-]XX -> plain digits, as format(Decimal(text), "f") prints them. */
        char digits[32];
        size_t nd = 0, before = 0;
        int neg = repr[0] == '-', seen_dot = 0;
        for (char *q = repr + neg; q < e && nd < sizeof(digits); q++) {
            if (*q == '.') {
                seen_dot = 1;
                continue;
            }
            digits[nd++] = *q;
            if (!seen_dot)
                before++;
        }
        long exp10 = strtol(e + 1, NULL, 10);
        long point = (long)before + exp10; /* digits before the decimal point */
        size_t cap = nd + 8 + (size_t)labs(exp10);
        char *text = PyMem_Malloc(cap);
        if (text == NULL) {
            PyMem_Free(repr);
            c->err = E_NOMEM;
            return -1;
        }
        size_t t = 0;
        if (neg)
            text[t++] = '-';
        if (point <= 0) {
            text[t++] = '0';
            text[t++] = '.';
            for (long i = 0; i < -point; i++)
                text[t++] = '0';
            memcpy(text + t, digits, nd);
            t += nd;
        } else if ((size_t)point >= nd) {
            memcpy(text + t, digits, nd);
            t += nd;
            for (size_t i = nd; i < (size_t)point; i++)
                text[t++] = '0';
        } else {
            memcpy(text + t, digits, (size_t)point);
            t += (size_t)point;
            text[t++] = '.';
            memcpy(text + t, digits + point, nd - (size_t)point);
            t += nd - (size_t)point;
        }
        *length = (Py_ssize_t)t;
        rc = add_str(c, o, text, t);
        PyMem_Free(text);
    }
    PyMem_Free(repr);
    return rc;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int fmt_base64(Ctx *c, Buf *o, const uint8_t *s, size_t n, Py_ssize_t *length)
{
    size_t out = (n + 2) / 3 * 4;
    Buf *d = o + 1;
    if (need(c, d, out))
        return -1;
    char *w = d->p + d->len;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t x = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        *w++ = B64[x >> 18];
        *w++ = B64[(x >> 12) & 63];
        *w++ = B64[(x >> 6) & 63];
        *w++ = B64[x & 63];
    }
    if (n - i == 1) {
        uint32_t x = (uint32_t)s[i] << 16;
        *w++ = B64[x >> 18];
        *w++ = B64[(x >> 12) & 63];
        *w++ = '=';
        *w++ = '=';
    } else if (n - i == 2) {
        uint32_t x = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8;
        *w++ = B64[x >> 18];
        *w++ = B64[(x >> 12) & 63];
        *w++ = B64[(x >> 6) & 63];
        *w++ = '=';
    }
    d->len += out;
    *length = (Py_ssize_t)out;
    return push_off(c, o, d->len);
}

static int render_complex(Ctx *c, Buf *o, Py_ssize_t *length);

/* Arrays and kvlists: JSON through mapping.value_to_string, given the merged AnyValue bytes. */
static int fmt_complex(Ctx *c, Buf *o, Py_ssize_t *length)
{
    gil_take(c);
    int rc = render_complex(c, o, length);
    gil_give(c);
    return rc;
}

static int render_complex(Ctx *c, Buf *o, Py_ssize_t *length)
{
    size_t total = 0;
    for (size_t i = 0; i < c->values.len; i++)
        total += c->values.v[i].n;
    PyObject *raw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (raw == NULL) {
        c->err = E_PY;
        return -1;
    }
    char *w = PyBytes_AS_STRING(raw);
    for (size_t i = 0; i < c->values.len; i++) {
        if (c->values.v[i].n)
            memcpy(w, c->values.v[i].p, c->values.v[i].n);
        w += c->values.v[i].n;
    }
    PyObject *text = PyObject_CallOneArg(c->render, raw);
    Py_DECREF(raw);
    if (text == NULL) {
        c->err = E_PY;
        return -1;
    }
    if (!PyUnicode_Check(text)) {
        Py_DECREF(text);
        PyErr_SetString(PyExc_TypeError, "the value renderer must return str");
        c->err = E_PY;
        return -1;
    }
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &n);
    if (utf8 == NULL) {
        Py_DECREF(text);
        c->err = E_PY;
        return -1;
    }
    *length = PyUnicode_GET_LENGTH(text);
    int rc = add_str(c, o, utf8, (size_t)n);
    Py_DECREF(text);
    return rc;
}

/* -- attributes ----------------------------------------------------------------------------- */

/* One KeyValue: checked always; with emit, its key and rendered value appended to the map
 * whose key column is m[0..1] and value column m[2..3]. A value over the length limit sets
 * pr and appends nothing. depth is the KeyValue's level. */
static int render_kv(Ctx *c, Slice kv, Buf *m, int depth, int emit, Problem *pr)
{
    if (depth > MAX_DEPTH)
        return BAD(c, "messages nested too deeply");
    Rd r = {kv.p, kv.p + kv.n};
    Slice key = {(const uint8_t *)"", 0};
    AnyValue av = {V_NONE, 0, {NULL, 0}};
    c->values.len = 0;
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        uint64_t v;
        Slice s;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 1 && wt == 2) {
            if (rd_string(c, &r, &key))
                return -1;
        } else if (f == 2 && wt == 2) {
            if (rd_len(c, &r, &s) || parse_any(c, s.p, s.n, depth + 1, &av) ||
                slices_push(c, &c->values, s.p, s.n))
                return -1;
        } else if (f == 3 && wt == 0) {
            if (rd_varint(c, &r, &v))
                return -1;
        } else if (skip_field(c, &r, f, wt, depth)) {
            return -1;
        }
    }
    if (!emit)
        return 0;
    Buf *vo = m + 2, *vd = m + 3;
    size_t mark_o = vo->len, mark_d = vd->len;
    Py_ssize_t length;
    char tmp[24];
    int rc;
    switch (av.kind) {
    case V_STRING:
        /* Bytes bound code points from above: count them only near the limit. */
        length = c->max_value < 0 || av.s.n > (size_t)c->max_value
                     ? code_points(av.s.p, av.s.n)
                     : (Py_ssize_t)av.s.n;
        if (length > c->max_value)
            goto too_long;
        rc = add_str(c, vo, av.s.p, av.s.n);
        break;
    case V_BOOL:
        length = av.u ? 4 : 5;
        rc = add_str(c, vo, av.u ? "true" : "false", (size_t)length);
        break;
    case V_INT: {
        char *start = fmt_int(tmp + sizeof(tmp), (int64_t)av.u);
        length = tmp + sizeof(tmp) - start;
        rc = add_str(c, vo, start, (size_t)length);
        break;
    }
    case V_DOUBLE: {
        double d;
        memcpy(&d, &av.u, 8);
        rc = fmt_double(c, vo, d, &length);
        break;
    }
    case V_BYTES:
        rc = fmt_base64(c, vo, av.s.p, av.s.n, &length);
        break;
    case V_ARRAY:
    case V_KVLIST:
        rc = fmt_complex(c, vo, &length);
        break;
    default: /* unset, or an index into a string table this collector does not have */
        length = 0;
        rc = add_str(c, vo, "", 0);
    }
    if (rc)
        return -1;
    if (length > c->max_value) {
        vo->len = mark_o;
        vd->len = mark_d;
        goto too_long;
    }
    return add_str(c, m, key.p, key.n);
too_long:
    pr->kind = P_LONG;
    pr->key = key;
    pr->n = length;
    return 0;
}

/* All KeyValues of one list: the count limit first, then each in order; after a problem the
 * rest is only checked. */
static int render_kvs(Ctx *c, const SliceList *l, Buf *m, int depth, int emit, Problem *pr)
{
    size_t i = 0;
    if (emit && (long long)l->len > c->max_attrs) {
        pr->kind = P_COUNT;
        pr->n = (Py_ssize_t)l->len;
        emit = 0;
    }
    for (; i < l->len; i++) {
        if (render_kv(c, l->v[i], m, depth, emit, pr))
            return -1;
        if (emit && pr->kind != P_NONE)
            emit = 0;
    }
    return 0;
}

static inline uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n)
        memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 32);
}

/* Whether the n keys of the rows starting at entries a0 and b0 are the same, in order. */
static int same_keys(const Buf *m, size_t a0, size_t b0, size_t n)
{
    size_t ka = (size_t)get_i32(&m[0], a0), kb = (size_t)get_i32(&m[0], b0);
    size_t la = (size_t)get_i32(&m[0], a0 + n) - ka, lb = (size_t)get_i32(&m[0], b0 + n) - kb;
    if (la != lb)
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((size_t)get_i32(&m[0], a0 + i) - ka != (size_t)get_i32(&m[0], b0 + i) - kb)
            return 0;
    return memcmp(m[1].p + ka, m[1].p + kb, la) == 0;
}

/* The map entries from e0 on form one row; a repeated key keeps its first position and its
 * last value, as a dict would (mapping._dedup). seen, when given, remembers a checked row.
 * Entries before e0 all belong to checked rows (a rejected span's rows are rolled back, and
 * the caches reset with them), so a cached row still holds the keys it was checked with. */
static int dedup_row(Ctx *c, Buf *m, size_t e0, RowCache *seen)
{
    size_t e1 = n_offsets(&m[0]);
    size_t n = e1 - e0;
    if (n < 2)
        return 0;
    if (seen != NULL && seen->n == n && seen->e0 + n <= e0 && same_keys(m, seen->e0, e0, n))
        return 0;
    size_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    if (c->hcap < cap) {
        uint32_t *t = realloc(c->htab, cap * sizeof(uint32_t));
        if (t == NULL) {
            c->err = E_NOMEM;
            return -1;
        }
        c->htab = t;
        c->hcap = cap;
    }
    uint32_t *tab = c->htab;
    memset(tab, 0xff, cap * sizeof(uint32_t));
    /* No storage yet when every key so far is empty; "" keeps the pointer arithmetic defined. */
    const char *kd = m[1].p ? m[1].p : "";
    int dup = 0;
    for (size_t i = e0; i < e1 && !dup; i++) {
        size_t a = (size_t)get_i32(&m[0], i), b = (size_t)get_i32(&m[0], i + 1);
        size_t slot = hash_bytes((const uint8_t *)kd + a, b - a) & (cap - 1);
        for (;; slot = (slot + 1) & (cap - 1)) {
            uint32_t j = tab[slot];
            if (j == UINT32_MAX) {
                tab[slot] = (uint32_t)i;
                break;
            }
            size_t ja = (size_t)get_i32(&m[0], j), jb = (size_t)get_i32(&m[0], j + 1);
            if (jb - ja == b - a && memcmp(kd + ja, kd + a, b - a) == 0) {
                dup = 1;
                break;
            }
        }
    }
    if (!dup) {
        if (seen != NULL) {
            seen->e0 = e0;
            seen->n = n;
        }
        return 0;
    }
    /* Rare: rebuild the row. winner[i] is the entry whose value the key of first occurrence i
     * ends up with. */
    size_t *first = malloc(n * sizeof(size_t)), *winner = malloc(n * sizeof(size_t));
    if (first == NULL || winner == NULL) {
        free(first);
        free(winner);
        c->err = E_NOMEM;
        return -1;
    }
    memset(tab, 0xff, cap * sizeof(uint32_t));
    size_t kept = 0;
    for (size_t i = e0; i < e1; i++) {
        size_t a = (size_t)get_i32(&m[0], i), b = (size_t)get_i32(&m[0], i + 1);
        size_t slot = hash_bytes((const uint8_t *)kd + a, b - a) & (cap - 1);
        for (;; slot = (slot + 1) & (cap - 1)) {
            uint32_t k = tab[slot];
            if (k == UINT32_MAX) {
                tab[slot] = (uint32_t)kept;
                first[kept] = i;
                winner[kept] = i;
                kept++;
                break;
            }
            size_t ja = (size_t)get_i32(&m[0], first[k]);
            size_t jb = (size_t)get_i32(&m[0], first[k] + 1);
            if (jb - ja == b - a && memcmp(kd + ja, kd + a, b - a) == 0) {
                winner[k] = i;
                break;
            }
        }
    }
    /* Copy the row out, truncate, append it back deduplicated. */
    size_t k0 = (size_t)get_i32(&m[0], e0), v0 = (size_t)get_i32(&m[2], e0);
    size_t klen = m[1].len - k0, vlen = m[3].len - v0;
    size_t ooff = 4 * (e0 + 1), olen = 4 * n;
    char *copy = malloc(klen + vlen + 2 * olen + 1);
    if (copy == NULL) {
        free(first);
        free(winner);
        c->err = E_NOMEM;
        return -1;
    }
    char *ck = copy, *cv = copy + klen, *cko = cv + vlen, *cvo = cko + olen;
    /* A buffer nothing was written to yet has no storage: memcpy must not see its NULL. */
    if (klen)
        memcpy(ck, m[1].p + k0, klen);
    if (vlen)
        memcpy(cv, m[3].p + v0, vlen);
    memcpy(cko, m[0].p + ooff, olen);
    memcpy(cvo, m[2].p + ooff, olen);
    m[0].len = ooff;
    m[1].len = k0;
    m[2].len = ooff;
    m[3].len = v0;
    int rc = 0;
    for (size_t i = 0; i < kept && !rc; i++) {
        /* Entry e's end offset is stored at position e - e0 of the copied offsets; its start is
         * the previous one's end (or the row's first offset). */
        size_t fi = first[i] - e0, wi = winner[i] - e0;
        int32_t ke, ks, ve, vs;
        memcpy(&ke, cko + 4 * fi, 4);
        if (fi) {
            memcpy(&ks, cko + 4 * (fi - 1), 4);
        } else {
            ks = (int32_t)k0;
        }
        memcpy(&ve, cvo + 4 * wi, 4);
        if (wi) {
            memcpy(&vs, cvo + 4 * (wi - 1), 4);
        } else {
            vs = (int32_t)v0;
        }
        rc = add_str(c, &m[0], ck + ((size_t)ks - k0), (size_t)(ke - ks)) ||
             add_str(c, &m[2], cv + ((size_t)vs - v0), (size_t)(ve - vs));
    }
    free(copy);
    free(first);
    free(winner);
    return rc ? -1 : 0;
}

/* -- token figures ------------------------------------------------------------------------- */

/* The streaming figures of a span's latscope.token_offsets_us, stored with it
 * (LatscopeTokenFigures, deploy/clickhouse/011_token_figures.sql): tokens.token_figures at the
 * default stall threshold, by the same double operations in the same order, so the figures are
 * the same to the bit (tests/test_collector_token_figures.py holds the two equal). The build
 * turns off the contraction of a multiply and an add into one fused operation (pyproject.toml),
 * which would round once where Python rounds twice. */
static const char OFFSETS_KEY[] = "latscope.token_offsets_us";
#define STORED_STALL_NS 250000000LL /* tokens.DEFAULT_STALL_NS */
#define N_FIGURES 7

static inline int is_ws(uint8_t ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* tokens.parse_int_list: a JSON array of integers of at most 15 digits (tokens.INT_ARRAY), else
 * nothing. The integers go to c->tokens; returns how many (0: not such an array, or empty), -1
 * when out of memory. */
static Py_ssize_t parse_offsets(Ctx *c, const uint8_t *p, size_t n)
{
    size_t i = 0, count = 0;
    /* Every scan below stops at the last byte, ']', so only the ends need a bound. */
    if (n < 2 || p[0] != '[' || p[n - 1] != ']')
        return 0;
    /* At most one integer per two bytes of the text. */
    if (c->tokens_cap < n / 2 + 1) {
        int64_t *t = realloc(c->tokens, (n / 2 + 1) * sizeof(int64_t));
        if (t == NULL) {
            c->err = E_NOMEM;
            return -1;
        }
        c->tokens = t;
        c->tokens_cap = n / 2 + 1;
    }
    for (i = 1; i < n && is_ws(p[i]); i++)
        ;
    if (i < n && p[i] == ']')
        return 0; /* empty, or text after it */
    for (;;) {
        int negative = p[i] == '-'; /* i < n: the text ends with ']' */
        i += negative;
        unsigned d = (unsigned)(p[i] - '0');
        if (d > 9)
            return 0;
        int64_t v = d;
        size_t first = i++;
        if (d != 0) {
            while ((d = (unsigned)(p[i] - '0')) <= 9 && i - first < 15) {
                v = v * 10 + d;
                i++;
            }
        }
        if ((unsigned)(p[i] - '0') <= 9)
            return 0; /* 16 digits or more, or a leading zero */
        c->tokens[count++] = negative ? -v : v;
        while (is_ws(p[i]))
            i++;
        if (p[i] == ',') {
            i++;
            while (is_ws(p[i]))
                i++;
            continue;
        }
        if (p[i] == ']' && i + 1 == n)
            return (Py_ssize_t)count;
        return 0;
    }
}

/* Moves the k-th smallest (0-based) of t[lo..hi] to t[k], the smaller ones before it and the
 * larger after (Hoare's selection; a sort of every span's gaps cost four times as much). */
static void select_kth(int64_t *t, ptrdiff_t lo, ptrdiff_t hi, ptrdiff_t k)
{
    while (lo < hi) {
        int64_t pivot = t[lo + (hi - lo) / 2];
        ptrdiff_t i = lo, j = hi;
        while (i <= j) {
            while (t[i] < pivot)
                i++;
            while (t[j] > pivot)
                j--;
            if (i <= j) {
                int64_t x = t[i];
                t[i++] = t[j];
                t[j--] = x;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return;
    }
}

/* The smallest of t[lo..hi]. */
static int64_t min_of(const int64_t *t, ptrdiff_t lo, ptrdiff_t hi)
{
    int64_t m = t[lo];
    for (ptrdiff_t i = lo + 1; i <= hi; i++)
        m = t[i] < m ? t[i] : m;
    return m;
}

/* tokens.linear_quantile of the n >= 1 values t[0..n), of which t[0..from) are already the
 * smallest, in order or not, and no larger than the rest. Partitions t further. */
static double linear_quantile(int64_t *t, ptrdiff_t n, ptrdiff_t from, double q, ptrdiff_t *at)
{
    double pos = q * (double)(n - 1);
    double fi = floor(pos);
    ptrdiff_t i = (ptrdiff_t)fi;
    select_kth(t, from, n - 1, i);
    *at = i + 1;
    if (i + 1 >= n)
        return (double)t[n - 1];
    double step = (double)(min_of(t, i + 1, n - 1) - t[i]) * (pos - fi);
    return (double)t[i] + step;
}

/* The figures of one span: its attributes are the map entries from e0 on. Appends the seven
 * figures, or none when it has no token offsets, and the row's end. */
static int add_token_figures(Ctx *c, size_t e0)
{
    Buf *b = c->b;
    Buf *ko = &b[B_ATT_KO];
    size_t e1 = n_offsets(ko);
    size_t klen = sizeof(OFFSETS_KEY) - 1;
    for (size_t e = e0; e < e1; e++) {
        size_t k0 = (size_t)get_i32(ko, e), k1 = (size_t)get_i32(ko, e + 1);
        if (k1 - k0 != klen || memcmp(ko[1].p + k0, OFFSETS_KEY, klen) != 0)
            continue;
        Buf *vo = &b[B_ATT_VO];
        size_t v0 = (size_t)get_i32(vo, e), v1 = (size_t)get_i32(vo, e + 1);
        Py_ssize_t n = parse_offsets(c, (const uint8_t *)vo[1].p + v0, v1 - v0);
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        int64_t *t = c->tokens;
        double figures[N_FIGURES] = {(double)t[0], 0.0, 0.0, 0.0, 0.0, 0.0, (double)n};
        if (n > 1) {
            size_t gaps = (size_t)n - 1;
            int64_t span_ns = (t[gaps] - t[0]) * 1000;
            /* The gaps (ns) in place of the offsets, then sorted. */
            size_t stalls = 0;
            int64_t max = INT64_MIN;
            for (size_t g = 0; g < gaps; g++) {
                t[g] = (t[g + 1] - t[g]) * 1000;
                stalls += t[g] > STORED_STALL_NS;
                max = t[g] > max ? t[g] : max;
            }
            ptrdiff_t at = 0;
            figures[1] = (double)span_ns / (double)gaps;
            figures[2] = linear_quantile(t, (ptrdiff_t)gaps, 0, 0.5, &at);
            /* The p99 is at or above the median: only the values above it are searched. */
            figures[3] = linear_quantile(t, (ptrdiff_t)gaps, at, 0.99, &at);
            figures[4] = (double)max;
            figures[5] = (double)stalls;
        }
        if (need(c, &b[B_TF_D], sizeof(figures)))
            return -1;
        memcpy(b[B_TF_D].p + b[B_TF_D].len, figures, sizeof(figures));
        b[B_TF_D].len += sizeof(figures);
        break;
    }
    return push_off(c, &b[B_TF_O], b[B_TF_D].len / sizeof(double));
}

/* -- spans ---------------------------------------------------------------------------------- */

static const char *const KINDS[] = {"Unspecified", "Internal", "Server", "Client", "Producer",
                                    "Consumer"};
static const char *const CODES[] = {"Unset", "Ok", "Error"};

static int add_hex(Ctx *c, Buf *o, Slice id)
{
    static const char HEX[] = "0123456789abcdef";
    Buf *d = o + 1;
    if (need(c, d, 2 * id.n))
        return -1;
    char *w = d->p + d->len;
    for (size_t i = 0; i < id.n; i++) {
        *w++ = HEX[id.p[i] >> 4];
        *w++ = HEX[id.p[i] & 15];
    }
    d->len += 2 * id.n;
    return push_off(c, o, d->len);
}

static int all_zero(Slice s)
{
    for (size_t i = 0; i < s.n; i++)
        if (s.p[i])
            return 0;
    return 1;
}

static PyObject *short_repr(Slice s)
{
    /* repr(text[:64]) */
    PyObject *text = PyUnicode_DecodeUTF8((const char *)s.p, (Py_ssize_t)s.n, "strict");
    if (text == NULL)
        return NULL;
    PyObject *head = PyUnicode_Substring(text, 0, 64);
    Py_DECREF(text);
    if (head == NULL)
        return NULL;
    PyObject *r = PyObject_Repr(head);
    Py_DECREF(head);
    return r;
}

static int word_problem(Ctx *c, Slice span_id, const Problem *pr, int resource);

/* The first rejection's text, worded as mapping.py words it. */
static int note_problem(Ctx *c, Slice span_id, const Problem *pr, int resource)
{
    c->rejected++;
    if (c->first_problem != NULL)
        return 0;
    gil_take(c);
    int rc = word_problem(c, span_id, pr, resource);
    gil_give(c);
    return rc;
}

static int word_problem(Ctx *c, Slice span_id, const Problem *pr, int resource)
{
    PyObject *inner = NULL, *key = NULL;
    switch (pr->kind) {
    case P_TRACE:
        inner = PyUnicode_FromString("trace_id must be 16 bytes, not all zero");
        break;
    case P_SPAN:
        inner = PyUnicode_FromString("span_id must be 8 bytes, not all zero");
        break;
    case P_PARENT:
        inner = PyUnicode_FromString("parent_span_id must be empty or 8 bytes");
        break;
    case P_END:
        inner = PyUnicode_FromString("end_time_unix_nano is before start_time_unix_nano");
        break;
    case P_TIME:
        inner = PyUnicode_FromString(
            "end_time_unix_nano is past the year 2262 (not a signed 64-bit nanosecond time)");
        break;
    case P_OLD:
        inner = PyUnicode_FromString(
            "start_time_unix_nano is older than the collector accepts (--max-span-age-s)");
        break;
    case P_FUTURE:
        inner = PyUnicode_FromString("end_time_unix_nano is further in the future than the "
                                     "collector accepts (--max-span-future-s)");
        break;
    case P_EVENT_TIME:
        inner = PyUnicode_FromString(
            "time_unix_nano is past the year 2262 (not a signed 64-bit nanosecond time)");
        break;
    case P_COUNT:
        inner = PyUnicode_FromFormat("%zd attributes, more than the limit of %lld", pr->n,
                                     c->max_attrs);
        break;
    default:
        key = short_repr(pr->key);
        if (key != NULL)
            inner = PyUnicode_FromFormat("attribute %U is %zd long, more than %lld", key, pr->n,
                                         c->max_value);
        Py_XDECREF(key);
    }
    if (inner != NULL && pr->where == W_EVENT) {
        PyObject *name = short_repr(pr->event);
        PyObject *outer = name ? PyUnicode_FromFormat("event %U: %U", name, inner) : NULL;
        Py_XDECREF(name);
        Py_DECREF(inner);
        inner = outer;
    } else if (inner != NULL && pr->where == W_LINK) {
        PyObject *outer = PyUnicode_FromFormat("link: %U", inner);
        Py_DECREF(inner);
        inner = outer;
    }
    if (inner != NULL && resource) {
        PyObject *outer = PyUnicode_FromFormat("resource: %U", inner);
        Py_DECREF(inner);
        inner = outer;
    }
    if (inner == NULL) {
        c->err = E_PY;
        return -1;
    }
    PyObject *hex;
    if (span_id.n) {
        PyObject *raw = PyBytes_FromStringAndSize((const char *)span_id.p, (Py_ssize_t)span_id.n);
        hex = raw ? PyObject_CallMethod(raw, "hex", NULL) : NULL;
        Py_XDECREF(raw);
    } else {
        hex = PyUnicode_FromString("<empty>");
    }
    if (hex == NULL) {
        Py_DECREF(inner);
        c->err = E_PY;
        return -1;
    }
    c->first_problem = PyUnicode_FromFormat("span %U: %U", hex, inner);
    Py_DECREF(hex);
    Py_DECREF(inner);
    if (c->first_problem == NULL) {
        c->err = E_PY;
        return -1;
    }
    return 0;
}

typedef struct {
    Slice name, version;
} Scope;

static int parse_scope(Ctx *c, const uint8_t *p, size_t n, int depth, Scope *sc)
{
    if (depth > MAX_DEPTH)
        return BAD(c, "messages nested too deeply");
    Rd r = {p, p + n};
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        uint64_t v;
        Slice s;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 1 && wt == 2) {
            if (rd_string(c, &r, &sc->name))
                return -1;
        } else if (f == 2 && wt == 2) {
            if (rd_string(c, &r, &sc->version))
                return -1;
        } else if (f == 3 && wt == 2) {
            if (rd_len(c, &r, &s) || check_msg(c, T_KV, s.p, s.n, depth + 1))
                return -1;
        } else if (f == 4 && wt == 0) {
            if (rd_varint(c, &r, &v))
                return -1;
        } else if (skip_field(c, &r, f, wt, depth)) {
            return -1;
        }
    }
    return 0;
}

/* One event or link: checked always; with emit (and no problem so far) appended. */
static int do_event(Ctx *c, Slice ev, int depth, int emit, Problem *pr)
{
    if (depth > MAX_DEPTH)
        return BAD(c, "messages nested too deeply");
    Rd r = {ev.p, ev.p + ev.n};
    uint64_t time = 0, v;
    Slice name = {(const uint8_t *)"", 0}, s;
    c->sub_kvs.len = 0;
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 1 && wt == 1) {
            if (rd_fixed64(c, &r, &time))
                return -1;
        } else if (f == 2 && wt == 2) {
            if (rd_string(c, &r, &name))
                return -1;
        } else if (f == 3 && wt == 2) {
            if (rd_len(c, &r, &s) || slices_push(c, &c->sub_kvs, s.p, s.n))
                return -1;
        } else if (f == 4 && wt == 0) {
            if (rd_varint(c, &r, &v))
                return -1;
        } else if (skip_field(c, &r, f, wt, depth)) {
            return -1;
        }
    }
    /* mine: the problem found here is this event's (not an earlier span-level one). */
    int mine = 0;
    if (emit && time > (uint64_t)INT64_MAX) {
        pr->kind = P_EVENT_TIME;
        emit = 0;
        mine = 1;
    }
    Buf *b = c->b;
    size_t e0 = n_offsets(&b[B_EVA_KO]);
    if (render_kvs(c, &c->sub_kvs, &b[B_EVA_KO], depth + 1, emit, pr))
        return -1;
    if (emit && pr->kind != P_NONE)
        mine = 1;
    if (mine) {
        pr->where = W_EVENT;
        pr->event = name;
        return 0;
    }
    if (!emit)
        return 0;
    if (dedup_row(c, &b[B_EVA_KO], e0, &c->seen[1]) || push_off(c, &b[B_EVA_O], n_offsets(&b[B_EVA_KO])) ||
        need(c, &b[B_EV_TS], 8))
        return -1;
    memcpy(b[B_EV_TS].p + b[B_EV_TS].len, &time, 8);
    b[B_EV_TS].len += 8;
    return add_str(c, &b[B_EVN_O], name.p, name.n);
}

static int do_link(Ctx *c, Slice ln, int depth, int emit, Problem *pr)
{
    if (depth > MAX_DEPTH)
        return BAD(c, "messages nested too deeply");
    Rd r = {ln.p, ln.p + ln.n};
    Slice tid = {NULL, 0}, sid = {NULL, 0}, state = {(const uint8_t *)"", 0}, s;
    uint64_t v;
    c->sub_kvs.len = 0;
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 1 && wt == 2) {
            if (rd_len(c, &r, &tid))
                return -1;
        } else if (f == 2 && wt == 2) {
            if (rd_len(c, &r, &sid))
                return -1;
        } else if (f == 3 && wt == 2) {
            if (rd_string(c, &r, &state))
                return -1;
        } else if (f == 4 && wt == 2) {
            if (rd_len(c, &r, &s) || slices_push(c, &c->sub_kvs, s.p, s.n))
                return -1;
        } else if (f == 5 && wt == 0) {
            if (rd_varint(c, &r, &v))
                return -1;
        } else if (f == 6 && wt == 5) {
            if (rd_skip(c, &r, 4))
                return -1;
        } else if (skip_field(c, &r, f, wt, depth)) {
            return -1;
        }
    }
    Buf *b = c->b;
    size_t e0 = n_offsets(&b[B_LNA_KO]);
    if (render_kvs(c, &c->sub_kvs, &b[B_LNA_KO], depth + 1, emit, pr))
        return -1;
    if (pr->kind != P_NONE) {
        if (emit)
            pr->where = W_LINK;
        return 0;
    }
    if (!emit)
        return 0;
    if (dedup_row(c, &b[B_LNA_KO], e0, &c->seen[2]) || push_off(c, &b[B_LNA_O], n_offsets(&b[B_LNA_KO])))
        return -1;
    return add_hex(c, &b[B_LNT_O], tid) || add_hex(c, &b[B_LNS_O], sid) ||
                   add_str(c, &b[B_LNST_O], state.p, state.n)
               ? -1
               : 0;
}

static int do_span(Ctx *c, Slice span, int depth, const Scope *sc)
{
    if (depth > MAX_DEPTH)
        return BAD(c, "messages nested too deeply");
    Rd r = {span.p, span.p + span.n};
    Slice tid = {NULL, 0}, sid = {NULL, 0}, psid = {NULL, 0};
    Slice state = {(const uint8_t *)"", 0}, name = {(const uint8_t *)"", 0};
    Slice message = {(const uint8_t *)"", 0};
    uint64_t start = 0, end = 0, v;
    int64_t kind = 0, code = 0;
    c->span_kvs.len = c->events.len = c->links.len = 0;
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        Slice s;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        int ok = 0;
        switch (f) {
        case 1:
            ok = wt == 2 && !rd_len(c, &r, &tid);
            break;
        case 2:
            ok = wt == 2 && !rd_len(c, &r, &sid);
            break;
        case 3:
            ok = wt == 2 && !rd_string(c, &r, &state);
            break;
        case 4:
            ok = wt == 2 && !rd_len(c, &r, &psid);
            break;
        case 5:
            ok = wt == 2 && !rd_string(c, &r, &name);
            break;
        case 6:
            ok = wt == 0 && !rd_varint(c, &r, &v);
            if (ok)
                kind = (int32_t)(uint32_t)v; /* an open enum: int32, like upb */
            break;
        case 7:
            ok = wt == 1 && !rd_fixed64(c, &r, &start);
            break;
        case 8:
            ok = wt == 1 && !rd_fixed64(c, &r, &end);
            break;
        case 9:
            ok = wt == 2 && !rd_len(c, &r, &s) && !slices_push(c, &c->span_kvs, s.p, s.n);
            break;
        case 11:
            ok = wt == 2 && !rd_len(c, &r, &s) && !slices_push(c, &c->events, s.p, s.n);
            break;
        case 13:
            ok = wt == 2 && !rd_len(c, &r, &s) && !slices_push(c, &c->links, s.p, s.n);
            break;
        case 10:
        case 12:
        case 14:
            ok = wt == 0 && !rd_varint(c, &r, &v);
            break;
        case 15:
            if (wt == 2) {
                /* Status; a second one merges into the first. */
                if (rd_len(c, &r, &s))
                    return -1;
                if (depth + 1 > MAX_DEPTH)
                    return BAD(c, "messages nested too deeply");
                Rd st = {s.p, s.p + s.n};
                while (st.p < st.end) {
                    uint32_t sf;
                    int swt;
                    if (rd_tag(c, &st, &sf, &swt))
                        return -1;
                    if (sf == 2 && swt == 2) {
                        if (rd_string(c, &st, &message))
                            return -1;
                    } else if (sf == 3 && swt == 0) {
                        if (rd_varint(c, &st, &v))
                            return -1;
                        code = (int32_t)(uint32_t)v;
                    } else if (skip_field(c, &st, sf, swt, depth + 1)) {
                        return -1;
                    }
                }
                ok = 1;
            }
            break;
        case 16:
            ok = wt == 5 && !rd_skip(c, &r, 4);
            break;
        }
        if (c->err)
            return -1;
        if (!ok && skip_field(c, &r, f, wt, depth))
            return -1;
    }

    Problem pr = {P_NONE, W_SPAN, 0, {NULL, 0}, {NULL, 0}};
    if (tid.n != 16 || all_zero(tid))
        pr.kind = P_TRACE;
    else if (sid.n != 8 || all_zero(sid))
        pr.kind = P_SPAN;
    else if (psid.n && psid.n != 8)
        pr.kind = P_PARENT;
    else if (end < start)
        pr.kind = P_END;
    else if (end > (uint64_t)INT64_MAX)
        pr.kind = P_TIME;
    else if (start < c->oldest_start)
        pr.kind = P_OLD;
    else if (c->latest_end && end > c->latest_end)
        pr.kind = P_FUTURE;
    if (pr.kind != P_NONE) {
        if (check_all(c, T_KV, &c->span_kvs, 0, depth + 1) ||
            check_all(c, T_EVENT, &c->events, 0, depth + 1) ||
            check_all(c, T_LINK, &c->links, 0, depth + 1))
            return -1;
        return note_problem(c, sid, &pr, 0);
    }

    Buf *b = c->b;
    size_t mark[NB - B_ROLLBACK];
    for (int i = B_ROLLBACK; i < NB; i++)
        mark[i - B_ROLLBACK] = b[i].len;
    size_t e0 = n_offsets(&b[B_ATT_KO]);
    if (render_kvs(c, &c->span_kvs, &b[B_ATT_KO], depth + 1, 1, &pr))
        return -1;
    /* Events and links go through do_event/do_link even after a problem: they are checked. */
    for (size_t i = 0; i < c->events.len; i++)
        if (do_event(c, c->events.v[i], depth + 1, pr.kind == P_NONE, &pr))
            return -1;
    for (size_t i = 0; i < c->links.len; i++)
        if (do_link(c, c->links.v[i], depth + 1, pr.kind == P_NONE, &pr))
            return -1;
    if (pr.kind != P_NONE) {
        for (int i = B_ROLLBACK; i < NB; i++)
            b[i].len = mark[i - B_ROLLBACK];
        memset(c->seen, 0, sizeof(c->seen)); /* they may point into what was rolled back */
        return note_problem(c, sid, &pr, 0);
    }
    if (dedup_row(c, &b[B_ATT_KO], e0, &c->seen[0]) || push_off(c, &b[B_ATT_O], n_offsets(&b[B_ATT_KO])) ||
        add_token_figures(c, e0) ||
        push_off(c, &b[B_EV_O], n_offsets(&b[B_EVN_O])) ||
        push_off(c, &b[B_LN_O], n_offsets(&b[B_LNT_O])))
        return -1;

    if (need(c, &b[B_TS], 8) || need(c, &b[B_DUR], 8))
        return -1;
    uint64_t duration = end - start;
    memcpy(b[B_TS].p + b[B_TS].len, &start, 8);
    b[B_TS].len += 8;
    memcpy(b[B_DUR].p + b[B_DUR].len, &duration, 8);
    b[B_DUR].len += 8;
    const char *kind_text = kind >= 0 && kind < 6 ? KINDS[kind] : KINDS[0];
    const char *code_text = code >= 0 && code < 3 ? CODES[code] : CODES[0];
    if (add_hex(c, &b[B_TID_O], tid) || add_hex(c, &b[B_SID_O], sid) ||
        add_hex(c, &b[B_PAR_O], psid) || add_str(c, &b[B_TST_O], state.p, state.n) ||
        add_str(c, &b[B_NAME_O], name.p, name.n) ||
        add_str(c, &b[B_KIND_O], kind_text, strlen(kind_text)) ||
        add_str(c, &b[B_SVC_O], c->service.p, c->service.n) ||
        add_str(c, &b[B_SCN_O], sc->name.p, sc->name.n) ||
        add_str(c, &b[B_SCV_O], sc->version.p, sc->version.n) ||
        add_str(c, &b[B_STC_O], code_text, strlen(code_text)) ||
        add_str(c, &b[B_STM_O], message.p, message.n))
        return -1;

    if (c->res_ix < 0) {
        /* The resource's first accepted span: its attributes, rendered once per ResourceSpans,
         * become a dictionary entry, copied as a block. */
        Buf *ko = &b[B_RESD_KO];
        size_t nres = n_offsets(&c->res[0]);
        size_t kbase = ko[1].len, vbase = ko[3].len;
        if (need(c, &ko[0], 4 * nres) || need(c, &ko[1], c->res[1].len) ||
            need(c, &ko[2], 4 * nres) || need(c, &ko[3], c->res[3].len))
            return -1;
        if (kbase + c->res[1].len > INT32_MAX || vbase + c->res[3].len > INT32_MAX) {
            c->err = E_TOOBIG;
            return -1;
        }
        if (c->res[1].len)
            memcpy(ko[1].p + kbase, c->res[1].p, c->res[1].len);
        if (c->res[3].len)
            memcpy(ko[3].p + vbase, c->res[3].p, c->res[3].len);
        ko[1].len += c->res[1].len;
        ko[3].len += c->res[3].len;
        for (size_t i = 1; i <= nres; i++) {
            put_i32(&ko[0], (int32_t)(kbase + (size_t)get_i32(&c->res[0], i)));
            put_i32(&ko[2], (int32_t)(vbase + (size_t)get_i32(&c->res[2], i)));
        }
        if (push_off(c, &b[B_RESD_O], n_offsets(&ko[0])))
            return -1;
        c->res_ix = c->n_res++;
    }
    if (need(c, &b[B_RES_IX], 4))
        return -1;
    put_i32(&b[B_RES_IX], c->res_ix);
    c->res_rows_bytes += c->res_entry;
    c->rows++;
    return 0;
}

/* The span_id a rejected span is reported under: the last one on the wire. */
static Slice span_id_of(Slice span)
{
    Ctx scratch = {0};
    Slice sid = {NULL, 0};
    Rd r = {span.p, span.p + span.n};
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        if (rd_tag(&scratch, &r, &f, &wt))
            break;
        if (f == 2 && wt == 2) {
            if (rd_len(&scratch, &r, &sid))
                break;
        } else if (skip_field(&scratch, &r, f, wt, 0)) {
            break;
        }
    }
    return sid;
}

static int do_scope_spans(Ctx *c, Slice ss, int depth, const Problem *res_problem)
{
    if (depth > MAX_DEPTH)
        return BAD(c, "messages nested too deeply");
    if (res_problem->kind != P_NONE) {
        /* Every span of a resource that cannot be stored is rejected with it. */
        if (check_msg(c, T_SS, ss.p, ss.n, depth))
            return -1;
        Rd r = {ss.p, ss.p + ss.n};
        while (r.p < r.end) {
            uint32_t f;
            int wt;
            Slice s;
            if (rd_tag(c, &r, &f, &wt))
                return -1;
            if (f == 2 && wt == 2) {
                if (rd_len(c, &r, &s) || note_problem(c, span_id_of(s), res_problem, 1))
                    return -1;
            } else if (skip_field(c, &r, f, wt, depth)) {
                return -1;
            }
        }
        return 0;
    }
    /* The scope may come after the spans on the wire: read it first. */
    Scope sc = {{(const uint8_t *)"", 0}, {(const uint8_t *)"", 0}};
    Rd r = {ss.p, ss.p + ss.n};
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        Slice s;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 1 && wt == 2) {
            if (rd_len(c, &r, &s) || parse_scope(c, s.p, s.n, depth + 1, &sc))
                return -1;
        } else if (f == 2 && wt == 2) {
            if (rd_len(c, &r, &s))
                return -1;
        } else if (f == 3 && wt == 2) {
            if (rd_string(c, &r, &s))
                return -1;
        } else if (skip_field(c, &r, f, wt, depth)) {
            return -1;
        }
    }
    r.p = ss.p;
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        Slice s;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 2 && wt == 2) {
            if (rd_len(c, &r, &s) || do_span(c, s, depth + 1, &sc))
                return -1;
        } else if (skip_field(c, &r, f, wt, depth)) {
            return -1;
        }
    }
    return 0;
}

static int do_resource_spans(Ctx *c, Slice rs, int depth)
{
    /* The resource may come after its spans on the wire, and twice (merged): collect its
     * attributes from the whole message first. */
    c->res_kvs.len = 0;
    Rd r = {rs.p, rs.p + rs.n};
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        Slice s;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 1 && wt == 2) {
            if (rd_len(c, &r, &s))
                return -1;
            if (depth + 1 > MAX_DEPTH)
                return BAD(c, "messages nested too deeply");
            Rd rr = {s.p, s.p + s.n};
            while (rr.p < rr.end) {
                uint32_t rf;
                int rwt;
                uint64_t v;
                Slice a;
                if (rd_tag(c, &rr, &rf, &rwt))
                    return -1;
                if (rf == 1 && rwt == 2) {
                    if (rd_len(c, &rr, &a) || slices_push(c, &c->res_kvs, a.p, a.n))
                        return -1;
                } else if (rf == 2 && rwt == 0) {
                    if (rd_varint(c, &rr, &v))
                        return -1;
                } else if (rf == 3 && rwt == 2) {
                    if (rd_len(c, &rr, &a) || check_msg(c, T_ENT, a.p, a.n, depth + 2))
                        return -1;
                } else if (skip_field(c, &rr, rf, rwt, depth + 1)) {
                    return -1;
                }
            }
        } else if (f == 2 && wt == 2) {
            if (rd_len(c, &r, &s))
                return -1;
        } else if (f == 3 && wt == 2) {
            if (rd_string(c, &r, &s))
                return -1;
        } else if (skip_field(c, &r, f, wt, depth)) {
            return -1;
        }
    }
    Problem pr = {P_NONE, W_SPAN, 0, {NULL, 0}, {NULL, 0}};
    for (int i = 0; i < 4; i++)
        c->res[i].len = 0;
    if (push_off(c, &c->res[0], 0) || push_off(c, &c->res[2], 0) ||
        render_kvs(c, &c->res_kvs, c->res, depth + 2, 1, &pr))
        return -1;
    c->service.p = (const uint8_t *)"";
    c->service.n = 0;
    c->res_ix = -1;
    if (pr.kind == P_NONE) {
        if (dedup_row(c, c->res, 0, NULL))
            return -1;
        size_t n = n_offsets(&c->res[0]);
        for (size_t i = 0; i < n; i++) {
            size_t a = (size_t)get_i32(&c->res[0], i), e = (size_t)get_i32(&c->res[0], i + 1);
            if (e - a == 12 && memcmp(c->res[1].p + a, "service.name", 12) == 0) {
                size_t va = (size_t)get_i32(&c->res[2], i), ve = (size_t)get_i32(&c->res[2], i + 1);
                c->service.p = (const uint8_t *)c->res[3].p + va;
                c->service.n = ve - va;
            }
        }
    }
    /* What the dictionary entry a span of this resource makes copies, once per row. */
    c->res_entry = c->res[1].len + c->res[3].len + 8 * n_offsets(&c->res[0]) + 4;
    r.p = rs.p;
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        Slice s;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 2 && wt == 2) {
            if (rd_len(c, &r, &s) || do_scope_spans(c, s, depth + 1, &pr))
                return -1;
        } else if (skip_field(c, &r, f, wt, depth)) {
            return -1;
        }
    }
    return 0;
}

static int do_request(Ctx *c, const uint8_t *p, size_t n)
{
    Rd r = {p, p + n};
    while (r.p < r.end) {
        uint32_t f;
        int wt;
        Slice s;
        if (rd_tag(c, &r, &f, &wt))
            return -1;
        if (f == 1 && wt == 2) {
            if (rd_len(c, &r, &s) || do_resource_spans(c, s, 1))
                return -1;
        } else if (skip_field(c, &r, f, wt, 0)) {
            return -1;
        }
    }
    return 0;
}

/* -- the Arrow C data interface --------------------------------------------------------------- */

/* The decoded columns leave as one struct array of the Arrow C data interface
 * (https://arrow.apache.org/docs/format/CDataInterface.html), which mapping.py imports with
 * DECODED_SPANS_SCHEMA: one call, where wrapping each buffer and array in Python costs about a
 * hundred. Its nodes point into the decoder's buffers, which the root's release frees. */
struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* The tree batch_of builds is fixed: 45 nodes holding 43 children in all. */
#define MAX_NODES 48
#define MAX_KIDS 48

/* Everything the array holds, in one allocation beside the decoder's buffers. */
typedef struct {
    struct ArrowArray nodes[MAX_NODES];
    const void *bufs[MAX_NODES][3];
    size_t sizes[MAX_NODES][3]; /* the bytes of each node's buffers */
    struct ArrowArray *kids[MAX_KIDS];
    char *mem[NB];
    size_t len[NB];
    int n_nodes, n_kids;
} Batch;

/* A buffer nothing was written to has no storage; Arrow wants a pointer all the same. */
static const int64_t NO_BYTES[1];

static void child_release(struct ArrowArray *a) { a->release = NULL; }

static void batch_release(struct ArrowArray *a)
{
    Batch *bt = a->private_data;
    for (int i = 0; i < NB; i++)
        free(bt->mem[i]);
    a->release = NULL;
    free(bt);
}

static const void *buf_of(const Batch *bt, int i) { return bt->mem[i] ? bt->mem[i] : NO_BYTES; }

/* A node of `length` values over buffers b0, b1 (-1: none), with `kids` children to come. */
static struct ArrowArray *node(Batch *bt, int64_t length, int nbufs, int b0, int b1, int kids)
{
    struct ArrowArray *a = &bt->nodes[bt->n_nodes];
    const void **bufs = bt->bufs[bt->n_nodes];
    size_t *sizes = bt->sizes[bt->n_nodes++];
    bufs[0] = NULL; /* no validity bitmap: the decoder writes no nulls */
    if (nbufs > 1) {
        bufs[1] = buf_of(bt, b0);
        sizes[1] = bt->len[b0];
    }
    if (nbufs > 2) {
        bufs[2] = buf_of(bt, b1);
        sizes[2] = bt->len[b1];
    }
    a->length = length;
    a->null_count = 0;
    a->offset = 0;
    a->n_buffers = nbufs;
    a->n_children = kids;
    a->buffers = bufs;
    a->children = kids ? &bt->kids[bt->n_kids] : NULL;
    bt->n_kids += kids;
    a->dictionary = NULL;
    a->release = child_release;
    a->private_data = NULL;
    return a;
}

/* Values of a string, map or list column: its offsets buffer's entries less one. */
static int64_t counted(const Batch *bt, int offsets) { return (int64_t)(bt->len[offsets] / 4) - 1; }

static void string_node(Batch *bt, struct ArrowArray **slot, int offsets)
{
    *slot = node(bt, counted(bt, offsets), 3, offsets, offsets + 1, 0);
}

/* A map column: row offsets, then the key and the value string columns. */
static void map_node(Batch *bt, struct ArrowArray **slot, int offsets)
{
    struct ArrowArray *m = node(bt, counted(bt, offsets), 2, offsets, -1, 1);
    struct ArrowArray *entries = node(bt, counted(bt, offsets + 1), 1, -1, -1, 2);
    m->children[0] = entries;
    string_node(bt, &entries->children[0], offsets + 1);
    string_node(bt, &entries->children[1], offsets + 3);
    *slot = m;
}

/* A list column over the row offsets `offsets`; its child is the caller's to fill. */
static struct ArrowArray *list_node(Batch *bt, struct ArrowArray **slot, int64_t rows, int offsets)
{
    struct ArrowArray *l = node(bt, rows, 2, offsets, -1, 1);
    *slot = l;
    return l;
}

/* The decoder's buffers (taken from c) as DECODED_SPANS_SCHEMA's struct array; NULL when out of
 * memory (c keeps its buffers then). */
static struct ArrowArray *batch_of(Ctx *c)
{
    Batch *bt = calloc(1, sizeof(Batch));
    struct ArrowArray *root = malloc(sizeof(struct ArrowArray));
    if (bt == NULL || root == NULL) {
        free(bt);
        free(root);
        return NULL;
    }
    for (int i = 0; i < NB; i++) {
        bt->mem[i] = c->b[i].p;
        bt->len[i] = c->b[i].len;
        c->b[i].p = NULL;
    }
    int64_t rows = c->rows;
    struct ArrowArray *top = node(bt, rows, 1, -1, -1, 23);
    struct ArrowArray **col = top->children;
    static const int IDS_TO_SERVICE[] = {B_TID_O, B_SID_O, B_PAR_O, B_TST_O, B_NAME_O, B_KIND_O,
                                         B_SVC_O};
    int k = 0;
    col[k++] = node(bt, rows, 2, B_TS, -1, 0);
    for (int i = 0; i < 7; i++)
        string_node(bt, &col[k++], IDS_TO_SERVICE[i]);
    struct ArrowArray *resource = node(bt, rows, 2, B_RES_IX, -1, 0);
    map_node(bt, &resource->dictionary, B_RESD_O);
    col[k++] = resource;
    string_node(bt, &col[k++], B_SCN_O);
    string_node(bt, &col[k++], B_SCV_O);
    map_node(bt, &col[k++], B_ATT_O);
    col[k++] = node(bt, rows, 2, B_DUR, -1, 0);
    string_node(bt, &col[k++], B_STC_O);
    string_node(bt, &col[k++], B_STM_O);
    int64_t events = counted(bt, B_EVN_O);
    list_node(bt, &col[k++], rows, B_EV_O)->children[0] = node(bt, events, 2, B_EV_TS, -1, 0);
    string_node(bt, list_node(bt, &col[k++], rows, B_EV_O)->children, B_EVN_O);
    map_node(bt, list_node(bt, &col[k++], rows, B_EV_O)->children, B_EVA_O);
    string_node(bt, list_node(bt, &col[k++], rows, B_LN_O)->children, B_LNT_O);
    string_node(bt, list_node(bt, &col[k++], rows, B_LN_O)->children, B_LNS_O);
    string_node(bt, list_node(bt, &col[k++], rows, B_LN_O)->children, B_LNST_O);
    map_node(bt, list_node(bt, &col[k++], rows, B_LN_O)->children, B_LNA_O);
    int64_t figures = (int64_t)(bt->len[B_TF_D] / sizeof(double));
    list_node(bt, &col[k++], rows, B_TF_O)->children[0] = node(bt, figures, 2, B_TF_D, -1, 0);
    /* The root is the caller's to free (the consumer moves it); its content is the top node. */
    *root = *top;
    root->release = batch_release;
    root->private_data = bt;
    return root;
}

/* The bytes of a column's node and of what it holds, as pyarrow's nbytes counts them: each
 * buffer's, but an offsets buffer of n + 1 entries (a string's, a list's or a map's) as n. */
static uint64_t node_bytes(const Batch *bt, const struct ArrowArray *a)
{
    const size_t *sizes = bt->sizes[a - bt->nodes];
    int offsets = a->n_buffers == 3 || a->n_children > 0;
    uint64_t n = a->n_buffers > 1 ? sizes[1] - (offsets ? 4 : 0) : 0;
    if (a->n_buffers > 2)
        n += sizes[2];
    for (int64_t i = 0; i < a->n_children; i++)
        n += node_bytes(bt, a->children[i]);
    return n;
}

/* The batch's bytes with its resource dictionary written out on every row, as
 * mapping.expanded_bytes counts them from the table: what sizes an insert's slices, known here
 * without a pass over the table. The dictionary column's node counts its indices; the entries
 * the rows refer to were summed as the spans were accepted (res_rows_bytes). */
static uint64_t expanded_of(const Batch *bt, uint64_t res_rows_bytes)
{
    const struct ArrowArray *top = &bt->nodes[0];
    uint64_t n = res_rows_bytes;
    for (int64_t i = 0; i < top->n_children; i++)
        n += node_bytes(bt, top->children[i]);
    return n;
}

static void capsule_free(PyObject *capsule)
{
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, "arrow_array");
    if (a == NULL) {
        PyErr_Clear();
        return;
    }
    if (a->release != NULL)
        a->release(a); /* never imported */
    free(a);
}

/* -- Python ----------------------------------------------------------------------------------- */

static PyObject *MalformedExport;
static PyObject *TooLarge;
static PyObject *value_renderer;

static void ctx_free(Ctx *c)
{
    for (int i = 0; i < NB; i++)
        free(c->b[i].p);
    for (int i = 0; i < 4; i++)
        free(c->res[i].p);
    free(c->res_kvs.v);
    free(c->span_kvs.v);
    free(c->sub_kvs.v);
    free(c->values.v);
    free(c->events.v);
    free(c->links.v);
    free(c->htab);
    free(c->tokens);
    Py_XDECREF(c->first_problem);
}

PyDoc_STRVAR(decode_doc,
"decode_traces(data, max_attributes, max_value, max_bytes, oldest_start=0, latest_end=0)\n"
"    -> (rows, rejected, problem, array, address, expanded)\n"
"\n"
"Decode one serialized ExportTraceServiceRequest into the spans table's columns: array, a\n"
"capsule holding an ArrowArray (C data interface) of DECODED_SPANS_SCHEMA's struct, at address;\n"
"expanded, its bytes with the resource dictionary written out per row (expanded_bytes).\n"
"Raises MalformedExport when data is not a valid Export, or would need more than max_bytes.");

static PyObject *decode_traces(PyObject *module, PyObject *args)
{
    Py_buffer view;
    long long max_attrs, max_value;
    Py_ssize_t max_bytes;
    unsigned long long oldest_start = 0, latest_end = 0;
    if (!PyArg_ParseTuple(args, "y*LLn|KK:decode_traces", &view, &max_attrs, &max_value,
                          &max_bytes, &oldest_start, &latest_end))
        return NULL;
    if (value_renderer == NULL) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "set_value_renderer() was not called");
        return NULL;
    }
    Ctx c;
    memset(&c, 0, sizeof(c));
    c.max_attrs = max_attrs;
    c.max_value = max_value;
    c.oldest_start = (uint64_t)oldest_start;
    c.latest_end = (uint64_t)latest_end;
    c.max_bytes = max_bytes > 0 ? (size_t)max_bytes : 0;
    c.render = value_renderer;
    Py_INCREF(c.render);
    int rc = 0;
    for (int i = 0; i < NB && !rc; i++)
        if (IS_OFFSETS[i])
            rc = push_off(&c, &c.b[i], 0);
    if (!rc) {
        /* The view keeps the bytes (immutable: the callers pass bytes) while other threads
         * run Python. */
        c.ts = PyEval_SaveThread();
        rc = do_request(&c, (const uint8_t *)view.buf, (size_t)view.len);
        PyEval_RestoreThread(c.ts);
        c.ts = NULL;
    }
    PyBuffer_Release(&view);
    Py_DECREF(c.render);
    if (rc) {
        switch (c.err) {
        case E_MALFORMED:
            PyErr_Format(MalformedExport, "not a valid ExportTraceServiceRequest: %s", c.why);
            break;
        case E_TOOBIG:
            PyErr_Format(TooLarge,
                         "the Export expands to more than %zd bytes of columns; send smaller "
                         "Exports", max_bytes);
            break;
        case E_NOMEM:
            PyErr_NoMemory();
            break;
        default:
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_SystemError, "OTLP decoder failed without a reason");
        }
        ctx_free(&c);
        return NULL;
    }
    /* Give back what doubling reserved: decoded columns may wait in memory for their insert,
     * and what they hold is what the collector's memory limit counts. */
    for (int i = 0; i < NB; i++) {
        if (c.b[i].len && c.b[i].len < c.b[i].cap) {
            char *p = realloc(c.b[i].p, c.b[i].len);
            if (p != NULL) {
                c.b[i].p = p;
                c.b[i].cap = c.b[i].len;
            }
        }
    }
    struct ArrowArray *array = batch_of(&c);
    PyObject *capsule = array ? PyCapsule_New(array, "arrow_array", capsule_free) : NULL;
    if (capsule == NULL) {
        if (array != NULL) {
            array->release(array);
            free(array);
        } else {
            PyErr_NoMemory();
        }
        ctx_free(&c);
        return NULL;
    }
    PyObject *problem = c.first_problem ? c.first_problem : PyUnicode_FromString("");
    c.first_problem = NULL;
    unsigned long long expanded = expanded_of(array->private_data, c.res_rows_bytes);
    PyObject *result = problem ? Py_BuildValue("nnNNKK", c.rows, c.rejected, problem, capsule,
                                               (unsigned long long)(uintptr_t)array, expanded)
                               : NULL;
    if (result == NULL && problem == NULL)
        Py_DECREF(capsule);
    ctx_free(&c);
    return result;
}

static PyObject *set_value_renderer(PyObject *module, PyObject *fn)
{
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "the value renderer must be callable");
        return NULL;
    }
    Py_INCREF(fn);
    Py_XSETREF(value_renderer, fn);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_traces", decode_traces, METH_VARARGS, decode_doc},
    {"set_value_renderer", set_value_renderer, METH_O,
     "Set the callable that renders an AnyValue's bytes (arrays, kvlists) as text."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_otlp",
    "OTLP trace Exports -> spans-table Arrow buffers (see mapping.py for the reference).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__otlp(void)
{
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        /* fixed64 and the Arrow buffers are read and written in host order. */
        PyErr_SetString(PyExc_ImportError, "the OTLP decoder needs a little-endian host");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    MalformedExport = PyErr_NewExceptionWithDoc(
        "latscope.collector._otlp.MalformedExport",
        "The bytes are not a valid ExportTraceServiceRequest.", PyExc_ValueError, NULL);
    TooLarge = MalformedExport == NULL ? NULL : PyErr_NewExceptionWithDoc(
        "latscope.collector._otlp.TooLarge",
        "The Export's columns would take more than max_bytes.", MalformedExport, NULL);
    if (MalformedExport == NULL || TooLarge == NULL ||
        PyModule_AddObjectRef(m, "MalformedExport", MalformedExport) ||
        PyModule_AddObjectRef(m, "TooLarge", TooLarge) ||
        PyModule_AddIntConstant(m, "BUFFERS", NB) ||
        PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
