/*
 * otlp_encode.c - stored events back into an OTLP export request (protobuf):
 * the way out of `comet ship` to an OTLP/HTTP backend (comet.h:
 * comet_otlp_encode).  otlp.c turns a request into events; this file turns
 * events of the same layout (docs/opentelemetry.md) into a request that
 * carries what the producer sent, field by field.  The reference of the way
 * back is request_from_events in tests/support/otlp.py; a differential test
 * (tests/test_otlp_encode.py) holds the two to equal requests.
 *
 * One pass per event, in three steps:
 *   1. The event's top-level keys are indexed (jsonread.c skips each value
 *      and keeps its text), so that fields are written in the protobuf's
 *      order whatever order the keys come in, and `value_types` (last in the
 *      layout) is known before the values it types.
 *   2. The heads (the resource, the scope, a data point's metric) and the
 *      record are written into scratch buffers.  An event that breaks the
 *      layout stops there and is reported; nothing of it reached the request.
 *   3. A head equal, byte for byte, to the open group's continues that group;
 *      another closes the groups from that level down and opens new ones.
 *      The record is then appended.  Comparing encoded heads rather than
 *      their JSON text makes `1.0` and `1.00`, or keys in another order,
 *      the same group, which is what they are in protobuf.
 *
 * Trade-offs:
 *   - A length-delimited field is written before its length is known: one
 *     byte is reserved, and the content moves when its length needs more
 *     (pb_close).  Records are short, so almost every move is of a few
 *     hundred bytes; the groups around a whole batch move once each.
 *   - The encoding is deterministic (same events, same bytes): fields in
 *     field-number order, proto3 defaults left out, members of a oneof
 *     written even when zero.  A batch rebuilt after a crash is therefore
 *     the same request, which is what makes its Idempotency-Key meaningful.
 *   - JSON pointers (for value_types) are rendered only while the event has
 *     value_types at all; most events have none.
 *   - Attributes are written as they come, duplicate keys included (OTLP
 *     forbids them; the layout kept what the producer sent).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "internal.h"
#include "jsonread.h"
#include "utf8.h"

/* Wire types, and the field numbers shared by the three signals' groups. */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };
enum { F_REQUEST_GROUPS = 1 };                                  /* Export*ServiceRequest */
enum { F_GROUP_RESOURCE = 1, F_GROUP_SCOPES = 2, F_GROUP_SCHEMA = 3 }; /* Resource* */
enum { F_SCOPE_SCOPE = 1, F_SCOPE_RECORDS = 2, F_SCOPE_SCHEMA = 3 };   /* Scope* */

#define MAX_DEPTH 64 /* the event's own levels around COMET_OTLP_MAX_DEPTH value levels */
#define MAX_TYPES 4096

enum { VT_BYTES = 1, VT_DOUBLE = 2 };

typedef struct vtype {
    jspan pointer;
    int kind;
} vtype;

typedef struct pbmark {
    size_t tag, content;
} pbmark;

typedef struct enc {
    int32_t signal;
    int plain;
    jreader r;
    uint8_t *scratch;
    size_t scratch_cap;
    ojbuf out;             /* the request */
    ojbuf head[3], open[3]; /* this event's heads, the open groups' (resource, scope, metric) */
    int level_open[3];
    pbmark group[3];        /* the open groups' fields in out */
    pbmark data;            /* metrics: the open Metric's data field */
    uint32_t exemplar_field; /* the exemplars' field number in the point being written */
    ojbuf rec;
    ojbuf seen[3], seen_types; /* the text the heads were last made from, and its value_types */
    int seen_ok[3];
    ojbuf path;             /* the JSON pointer of the value being written */
    int track;              /* the event has value_types: keep `path` */
    vtype *types;
    uint32_t ntypes, types_cap;
    const char *why;        /* why the current event is left out */
    char why_buf[96];
    comet_otlp_encoded *res;
    uint32_t rejected_cap;
} enc;

/* ---- the protobuf writer -------------------------------------------------------- */

static inline void pb_varint(ojbuf *b, uint64_t v)
{
    uint8_t *w = ojbuf_room(b, 10);
    if (!w)
        return;
    size_t n = 0;
    while (v >= 0x80) {
        w[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    w[n++] = (uint8_t)v;
    b->len += n;
}

static inline void pb_tag(ojbuf *b, uint32_t field, uint32_t wt)
{
    pb_varint(b, (uint64_t)field << 3 | wt);
}

static inline void pb_le(ojbuf *b, uint64_t v, size_t n)
{
    uint8_t *w = ojbuf_room(b, n);
    if (!w)
        return;
    memcpy(w, &v, n); /* little-endian, as every machine this builds for */
    b->len += n;
}

static void pb_uint(ojbuf *b, uint32_t field, uint64_t v)
{
    if (v) {
        pb_tag(b, field, WT_VARINT);
        pb_varint(b, v);
    }
}

static void pb_fixed64(ojbuf *b, uint32_t field, uint64_t v)
{
    if (v) {
        pb_tag(b, field, WT_I64);
        pb_le(b, v, 8);
    }
}

static void pb_fixed32(ojbuf *b, uint32_t field, uint32_t v)
{
    if (v) {
        pb_tag(b, field, WT_I32);
        pb_le(b, v, 4);
    }
}

/* A double; with `always` (a oneof member, an optional field) even 0. */
static void pb_double(ojbuf *b, uint32_t field, double x, int always)
{
    uint64_t bits;
    memcpy(&bits, &x, 8);
    if (bits || always) {
        pb_tag(b, field, WT_I64);
        pb_le(b, bits, 8);
    }
}

static void pb_bytes(ojbuf *b, uint32_t field, const uint8_t *p, size_t n, int always)
{
    if (n || always) {
        pb_tag(b, field, WT_LEN);
        pb_varint(b, n);
        oj_put(b, p, n);
    }
}

/* Opens a length-delimited field: its tag and one byte for its length. */
static pbmark pb_open(ojbuf *b, uint32_t field)
{
    pbmark m;
    m.tag = b->len;
    pb_tag(b, field, WT_LEN);
    oj_byte(b, 0);
    m.content = b->len;
    return m;
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes the length of the field opened at m, moving its content when the
 * length needs more than the byte reserved. */
static void pb_close(ojbuf *b, pbmark m)
{
    if (b->failed || b->over)
        return;
    size_t len = b->len - m.content, n = varint_size(len);
    if (n > 1) {
        if (!ojbuf_room(b, n - 1))
            return;
        memmove(b->p + m.content + n - 1, b->p + m.content, len);
        b->len += n - 1;
    }
    uint8_t *w = b->p + m.content - 1;
    while (len >= 0x80) {
        *w++ = (uint8_t)(len | 0x80);
        len >>= 7;
    }
    *w = (uint8_t)len;
}

/* pb_close, or nothing at all when the field stayed empty. */
static void pb_close_or_drop(ojbuf *b, pbmark m)
{
    if (b->len == m.content)
        b->len = m.tag;
    else
        pb_close(b, m);
}

/* ---- reading the event's values ------------------------------------------------ */

static int reject(enc *e, const char *fmt, const char *detail)
{
    if (!e->why) {
        snprintf(e->why_buf, sizeof e->why_buf, fmt, detail);
        e->why = e->why_buf;
    }
    return 0;
}

/* Points the reader at a value's text. */
static void read_at(enc *e, jspan text)
{
    e->r.p = text.p;
    e->r.end = text.p + text.len;
    e->r.why = NULL;
}

static int json_problem(enc *e, const char *name)
{
    if (e->r.why)
        return reject(e, "%s", e->r.why);
    return reject(e, "%s has the wrong type", name);
}

/* Each getter reads an event field given by its text (p NULL: absent, the
 * protobuf default) and says 0 with the reason set when it breaks the layout. */
static int get_u64(enc *e, jspan v, const char *name, uint64_t max, uint64_t *out)
{
    *out = 0;
    if (!v.p)
        return 1;
    read_at(e, v);
    jnum n;
    if (jr_peek(&e->r) != J_NUMBER || !jr_number(&e->r, &n) || !n.integer)
        return json_problem(e, name);
    if (n.overflow || n.magnitude > max || (n.negative && n.magnitude))
        return reject(e, "%s is out of range", name);
    *out = n.magnitude;
    return 1;
}

static int get_i64(enc *e, jspan v, const char *name, int64_t min, int64_t max, int64_t *out)
{
    *out = 0;
    if (!v.p)
        return 1;
    read_at(e, v);
    jnum n;
    if (jr_peek(&e->r) != J_NUMBER || !jr_number(&e->r, &n) || !n.integer)
        return json_problem(e, name);
    int64_t x;
    if (n.overflow || n.magnitude > (n.negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
        return reject(e, "%s is out of range", name);
    x = n.negative ? (int64_t)(0 - n.magnitude) : (int64_t)n.magnitude;
    if (x < min || x > max)
        return reject(e, "%s is out of range", name);
    *out = x;
    return 1;
}

static int get_bool(enc *e, jspan v, const char *name, int *out)
{
    *out = 0;
    if (!v.p)
        return 1;
    read_at(e, v);
    enum jtype t = jr_peek(&e->r);
    if (t != J_TRUE && t != J_FALSE)
        return reject(e, "%s has the wrong type", name);
    return jr_bool(&e->r, out) ? 1 : json_problem(e, name);
}

static int get_string(enc *e, jspan v, const char *name, jspan *out)
{
    out->p = NULL;
    out->len = 0;
    if (!v.p)
        return 1;
    read_at(e, v);
    if (jr_peek(&e->r) != J_STRING)
        return reject(e, "%s has the wrong type", name);
    return jr_string(&e->r, out) ? 1 : json_problem(e, name);
}

static int special_double(jspan s, double *out)
{
    if (JSPAN_IS(s, "NaN"))
        *out = NAN;
    else if (JSPAN_IS(s, "Infinity"))
        *out = INFINITY;
    else if (JSPAN_IS(s, "-Infinity"))
        *out = -INFINITY;
    else
        return 0;
    return 1;
}

/* A double at the reader: a number, or "NaN", "Infinity", "-Infinity". */
static int read_double(enc *e, const char *name, double *out)
{
    enum jtype t = jr_peek(&e->r);
    if (t == J_NUMBER) {
        jnum n;
        if (!jr_number(&e->r, &n))
            return json_problem(e, name);
        *out = jnum_value(&n);
        return 1;
    }
    jspan s;
    if (t == J_STRING && jr_string(&e->r, &s) && special_double(s, out))
        return 1;
    return json_problem(e, name);
}

/* A double field: absent is 0; `present` (may be NULL) says whether it was
 * given and not null. */
static int get_double(enc *e, jspan v, const char *name, double *out, int *present)
{
    *out = 0;
    if (present)
        *present = 0;
    if (!v.p)
        return 1;
    read_at(e, v);
    if (present && jr_peek(&e->r) == J_NULL)
        return 1;
    if (!read_double(e, name, out))
        return 0;
    if (present)
        *present = 1;
    return 1;
}

/* A hex digit's value plus one; 0 for any other byte. */
static const uint8_t HEX1[256] = {
    ['0'] = 1, ['1'] = 2, ['2'] = 3, ['3'] = 4, ['4'] = 5, ['5'] = 6, ['6'] = 7, ['7'] = 8,
    ['8'] = 9, ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
    ['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16,
};

/* An id: lowercase hex of `size` bytes, or "" (unset); written at `field`. */
static int put_id(enc *e, ojbuf *b, uint32_t field, jspan v, size_t size, const char *name)
{
    jspan s;
    if (!get_string(e, v, name, &s))
        return 0;
    if (!s.len)
        return 1;
    if (s.len != 2 * size)
        return reject(e, "%s is not empty nor of the right length", name);
    uint8_t id[16];
    int ok = 1;
    for (size_t i = 0; i < size; i++) {
        uint8_t hi = HEX1[s.p[2 * i]], lo = HEX1[s.p[2 * i + 1]];
        ok &= hi && lo;
        id[i] = (uint8_t)(((unsigned)hi - 1u) << 4 | ((unsigned)lo - 1u));
    }
    if (!ok)
        return reject(e, "%s is not hex", name);
    pb_bytes(b, field, id, size, 0);
    return 1;
}

static int put_string(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    jspan s;
    if (!get_string(e, v, name, &s))
        return 0;
    pb_bytes(b, field, s.p, s.len, 0);
    return 1;
}

/* An unsigned field of the event (at most max) written as a varint, or as
 * fixed 8 or 4 bytes (width 0, 8, 4). */
static int put_unsigned(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name, uint64_t max,
                        int width)
{
    uint64_t x;
    if (!get_u64(e, v, name, max, &x))
        return 0;
    if (width == 8)
        pb_fixed64(b, field, x);
    else if (width == 4)
        pb_fixed32(b, field, (uint32_t)x);
    else
        pb_uint(b, field, x);
    return 1;
}

static int put_uint(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name, uint64_t max)
{
    return put_unsigned(e, b, field, v, name, max, 0);
}

static int put_fixed64(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    return put_unsigned(e, b, field, v, name, UINT64_MAX, 8);
}

static int put_fixed32(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    return put_unsigned(e, b, field, v, name, UINT32_MAX, 4);
}

/* An enum (int32 on the wire as a varint, negative values as 10 bytes). */
static int put_enum(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    int64_t x;
    if (!get_i64(e, v, name, INT32_MIN, INT32_MAX, &x))
        return 0;
    pb_uint(b, field, (uint64_t)x);
    return 1;
}

/* ---- objects: their keys, indexed ------------------------------------------------ */

/* Reads the object at `v` and puts the text of each member named in
 * names[0, n) into out (absent members: p NULL; a repeated key: its last). */
static int index_object(enc *e, jspan v, const char *const *names, int n, jspan *out,
                        const char *what)
{
    for (int i = 0; i < n; i++)
        out[i].p = NULL, out[i].len = 0;
    if (!v.p)
        return 1;
    read_at(e, v);
    if (jr_peek(&e->r) != J_OBJECT)
        return reject(e, "%s is not an object", what);
    jspan key;
    jr_object(&e->r);
    while (jr_next_key(&e->r, &key)) {
        int i = 0;
        while (i < n && !(names[i][0] == (key.len ? key.p[0] : 0) &&
                          strncmp(names[i], (const char *)key.p, key.len) == 0 && !names[i][key.len]))
            i++;
        if (!jr_skip_fast(&e->r, i < n ? &out[i] : NULL))
            break;
    }
    if (e->r.why)
        return reject(e, "%s", e->r.why);
    return 1;
}

/* ---- JSON pointers and value_types ---------------------------------------------- */

static size_t path_push(enc *e, const uint8_t *name, size_t len)
{
    size_t mark = e->path.len;
    if (!e->track)
        return mark;
    oj_byte(&e->path, '/');
    for (size_t i = 0; i < len; i++) {
        if (name[i] == '~')
            oj_lit(&e->path, "~0");
        else if (name[i] == '/')
            oj_lit(&e->path, "~1");
        else
            oj_byte(&e->path, name[i]);
    }
    return mark;
}

static size_t path_push_lit(enc *e, const char *name)
{
    return path_push(e, (const uint8_t *)name, strlen(name));
}

static size_t path_push_index(enc *e, uint32_t i)
{
    size_t mark = e->path.len;
    if (!e->track)
        return mark;
    char text[16];
    int n = snprintf(text, sizeof text, "/%u", i);
    oj_put(&e->path, text, (size_t)n);
    return mark;
}

static void path_pop(enc *e, size_t mark)
{
    e->path.len = mark;
}

/* The value_types kind of the value at the current pointer (0: none). */
static int type_here(const enc *e)
{
    if (!e->track)
        return 0;
    for (uint32_t i = e->ntypes; i-- > 0;) { /* the last of repeated pointers */
        const vtype *t = &e->types[i];
        if (t->pointer.len == e->path.len && memcmp(t->pointer.p, e->path.p, e->path.len) == 0)
            return t->kind;
    }
    return 0;
}

static int read_types(enc *e, jspan v)
{
    e->ntypes = 0;
    e->track = 0;
    if (!v.p)
        return 1;
    read_at(e, v);
    if (jr_peek(&e->r) != J_OBJECT)
        return reject(e, "%s is not an object", "value_types");
    jspan key, kind;
    jr_object(&e->r);
    while (jr_next_key(&e->r, &key)) {
        if (!jr_string(&e->r, &kind))
            return json_problem(e, "value_types");
        int k = JSPAN_IS(kind, "bytes") ? VT_BYTES : JSPAN_IS(kind, "double") ? VT_DOUBLE : 0;
        if (!k)
            return reject(e, "value_types holds an unknown type%s", "");
        if (e->ntypes == e->types_cap) {
            uint32_t cap = e->types_cap ? e->types_cap * 2 : 16;
            if (cap > MAX_TYPES)
                return reject(e, "value_types has too many entries%s", "");
            vtype *grown = sys_realloc(e->types, cap * sizeof *grown);
            if (!grown) {
                e->out.failed = 1;
                return reject(e, "out of memory%s", "");
            }
            e->types = grown;
            e->types_cap = cap;
        }
        e->types[e->ntypes++] = (vtype){key, k};
    }
    if (e->r.why)
        return json_problem(e, "value_types");
    e->track = e->ntypes > 0;
    return 1;
}

/* ---- values --------------------------------------------------------------------- */

static int base64_value(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Standard base64, padded (what otlp_json.c writes), into bytes at `field`. */
static int put_base64(enc *e, ojbuf *b, uint32_t field, jspan s)
{
    if (s.len % 4)
        return reject(e, "%s is not base64", "a bytes value");
    size_t pad = s.len && s.p[s.len - 1] == '=' ? (s.len > 1 && s.p[s.len - 2] == '=' ? 2 : 1) : 0;
    size_t n = s.len / 4 * 3 - pad;
    pb_tag(b, field, WT_LEN);
    pb_varint(b, n);
    uint8_t *w = ojbuf_room(b, n + 3);
    if (!w)
        return 1; /* the buffer's failure is reported for the whole call */
    size_t o = 0;
    for (size_t i = 0; i < s.len; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            int c = s.p[i + k];
            v[k] = c == '=' && i + 4 == s.len && k >= 4 - (int)pad ? 0 : base64_value(c);
            if (v[k] < 0)
                return reject(e, "%s is not base64", "a bytes value");
        }
        uint32_t q = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        w[o] = (uint8_t)(q >> 16);
        w[o + 1] = (uint8_t)(q >> 8);
        w[o + 2] = (uint8_t)q;
        o += 3;
    }
    b->len += n;
    return 1;
}

static int attributes(enc *e, ojbuf *b, uint32_t field, uint32_t depth);

/* The AnyValue at the reader, its fields written into b.  In the layout, an
 * integer is int_value and a number with a fraction or an exponent
 * double_value; value_types marks bytes (base64) and non-finite doubles.
 * For plain events an integer beyond int64 keeps its digits as a string. */
static int any_value(enc *e, ojbuf *b, uint32_t depth)
{
    if (depth > COMET_OTLP_MAX_DEPTH)
        return reject(e, "a value nests deeper than %s levels", "32");
    int kind = type_here(e);
    enum jtype t = jr_peek(&e->r);
    jspan s;
    jnum n;
    int flag;
    if (kind == VT_BYTES) {
        if (t != J_STRING || !jr_string(&e->r, &s))
            return json_problem(e, "a bytes value");
        return put_base64(e, b, 7, s);
    }
    if (kind == VT_DOUBLE) {
        double x;
        if (!read_double(e, "a double value", &x))
            return 0;
        pb_double(b, 4, x, 1);
        return 1;
    }
    switch (t) {
    case J_NULL:
        return jr_null(&e->r) ? 1 : json_problem(e, "a value");
    case J_TRUE:
    case J_FALSE:
        jr_bool(&e->r, &flag);
        pb_tag(b, 2, WT_VARINT);
        pb_varint(b, (uint64_t)flag);
        return 1;
    case J_STRING:
        if (!jr_string(&e->r, &s))
            return json_problem(e, "a string value");
        pb_bytes(b, 1, s.p, s.len, 1);
        return 1;
    case J_NUMBER: {
        const uint8_t *text = e->r.p;
        if (!jr_number(&e->r, &n))
            return json_problem(e, "a number");
        if (!n.integer) {
            pb_double(b, 4, jnum_value(&n), 1);
            return 1;
        }
        if (n.overflow || n.magnitude > (n.negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX)) {
            if (!e->plain)
                return reject(e, "%s is out of range", "an integer value");
            pb_bytes(b, 1, text, (size_t)(e->r.p - text), 1);
            return 1;
        }
        pb_tag(b, 3, WT_VARINT);
        pb_varint(b, n.negative ? (uint64_t)0 - n.magnitude : n.magnitude);
        return 1;
    }
    case J_ARRAY: {
        pbmark array = pb_open(b, 5);
        jr_array(&e->r);
        uint32_t i = 0;
        while (jr_next_item(&e->r)) {
            size_t mark = path_push_index(e, i++);
            pbmark item = pb_open(b, 1);
            if (!any_value(e, b, depth + 1))
                return 0;
            pb_close(b, item);
            path_pop(e, mark);
        }
        if (e->r.why)
            return json_problem(e, "an array");
        pb_close(b, array);
        return 1;
    }
    case J_OBJECT: {
        pbmark map = pb_open(b, 6);
        if (!attributes(e, b, 1, depth + 1))
            return 0;
        pb_close(b, map);
        return 1;
    }
    default:
        return json_problem(e, "a value");
    }
}

/* The object at the reader as KeyValues at `field`, in order, repeated keys
 * included. */
static int attributes(enc *e, ojbuf *b, uint32_t field, uint32_t depth)
{
    if (jr_peek(&e->r) != J_OBJECT)
        return json_problem(e, "attributes");
    jspan key;
    jr_object(&e->r);
    while (jr_next_key(&e->r, &key)) {
        size_t mark = path_push(e, key.p, key.len);
        pbmark kv = pb_open(b, field);
        pb_bytes(b, 1, key.p, key.len, 0);
        pbmark value = pb_open(b, 2);
        if (!any_value(e, b, depth))
            return 0;
        pb_close_or_drop(b, value);
        pb_close(b, kv);
        path_pop(e, mark);
    }
    if (e->r.why)
        return json_problem(e, "attributes");
    return 1;
}

/* The attributes object whose text is v, at `field`, under pointer `name`. */
static int put_attributes(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    if (!v.p)
        return 1;
    size_t mark = path_push_lit(e, name);
    read_at(e, v);
    int ok = attributes(e, b, field, 0);
    path_pop(e, mark);
    return ok;
}

/* ---- heads: resource, scope, metric --------------------------------------------- */

/* A head buffer: [length of the message][the message][schema_url]. */
static void put_head(ojbuf *head, const ojbuf *message, jspan schema)
{
    head->len = 0;
    pb_varint(head, message->len);
    oj_put(head, message->p, message->len);
    oj_put(head, schema.p, schema.len);
}

static int resource_head(enc *e, jspan v, ojbuf *scratch)
{
    static const char *const names[] = {"attributes", "dropped_attributes_count", "entity_refs",
                                        "schema_url"};
    static const char *const ref_names[] = {"schema_url", "type", "id_keys", "description_keys"};
    jspan f[4], rf[4], schema;
    scratch->len = 0;
    size_t mark = path_push_lit(e, "resource");
    if (!index_object(e, v, names, 4, f, "resource") ||
        !put_attributes(e, scratch, 1, f[0], "attributes") ||
        !put_uint(e, scratch, 2, f[1], "dropped_attributes_count", UINT32_MAX))
        return 0;
    path_pop(e, mark);
    if (f[2].p) {
        read_at(e, f[2]);
        if (jr_peek(&e->r) != J_ARRAY)
            return reject(e, "%s is not an array", "entity_refs");
        jspan item;
        jr_array(&e->r);
        while (jr_next_item(&e->r)) {
            if (!jr_skip(&e->r, &item))
                break;
            const uint8_t *resume = e->r.p, *end = e->r.end;
            uint32_t depth = e->r.depth;
            pbmark ref = pb_open(scratch, 3);
            if (!index_object(e, item, ref_names, 4, rf, "an entity ref") ||
                !put_string(e, scratch, 1, rf[0], "schema_url") ||
                !put_string(e, scratch, 2, rf[1], "type"))
                return 0;
            for (int k = 2; k < 4; k++) {
                if (!rf[k].p)
                    continue;
                read_at(e, rf[k]);
                jspan s;
                if (jr_peek(&e->r) != J_ARRAY)
                    return reject(e, "%s is not an array", ref_names[k]);
                jr_array(&e->r);
                while (jr_next_item(&e->r)) {
                    if (jr_peek(&e->r) != J_STRING)
                        return reject(e, "%s has the wrong type", ref_names[k]);
                    if (!jr_string(&e->r, &s))
                        return json_problem(e, ref_names[k]);
                    pb_bytes(scratch, (uint32_t)k + 1, s.p, s.len, 1);
                }
                if (e->r.why)
                    return json_problem(e, ref_names[k]);
            }
            pb_close(scratch, ref);
            e->r.p = resume, e->r.end = end, e->r.depth = depth;
        }
        if (e->r.why)
            return json_problem(e, "entity_refs");
    }
    if (!get_string(e, f[3], "schema_url", &schema))
        return 0;
    put_head(&e->head[0], scratch, schema);
    return 1;
}

static int scope_head(enc *e, jspan v, ojbuf *scratch)
{
    static const char *const names[] = {"name", "version", "attributes", "dropped_attributes_count",
                                        "schema_url"};
    jspan f[5], schema;
    scratch->len = 0;
    size_t mark = path_push_lit(e, "scope");
    if (!index_object(e, v, names, 5, f, "scope") ||
        !put_string(e, scratch, 1, f[0], "scope name") ||
        !put_string(e, scratch, 2, f[1], "scope version") ||
        !put_attributes(e, scratch, 3, f[2], "attributes") ||
        !put_uint(e, scratch, 4, f[3], "dropped_attributes_count", UINT32_MAX) ||
        !get_string(e, f[4], "schema_url", &schema))
        return 0;
    path_pop(e, mark);
    put_head(&e->head[1], scratch, schema);
    return 1;
}

/* Metric types, their Metric field numbers, and what their data carries. */
static const char *const METRIC_TYPES[] = {"gauge", "sum", "histogram", "exponential_histogram",
                                           "summary"};
static const uint32_t METRIC_FIELDS[] = {5, 7, 9, 10, 11};

/* The metric head: [type][temporality varint][monotonic][length][name,
 * description, unit][metadata KeyValues at field 12]. */
static int metric_head(enc *e, jspan v, ojbuf *scratch, int *type)
{
    static const char *const names[] = {"name", "description", "unit", "type",
                                        "aggregation_temporality", "is_monotonic", "metadata"};
    jspan f[7], t;
    int64_t temporality;
    int monotonic;
    scratch->len = 0;
    if (!v.p)
        return reject(e, "%s is missing", "metric");
    if (!index_object(e, v, names, 7, f, "metric") ||
        !put_string(e, scratch, 1, f[0], "metric name") ||
        !put_string(e, scratch, 2, f[1], "metric description") ||
        !put_string(e, scratch, 3, f[2], "metric unit") || !get_string(e, f[3], "metric type", &t) ||
        !get_i64(e, f[4], "aggregation_temporality", INT32_MIN, INT32_MAX, &temporality) ||
        !get_bool(e, f[5], "is_monotonic", &monotonic))
        return 0;
    for (*type = 0; *type < 5; (*type)++)
        if (strlen(METRIC_TYPES[*type]) == t.len && memcmp(METRIC_TYPES[*type], t.p, t.len) == 0)
            break;
    if (*type == 5)
        return reject(e, "%s is not a metric type", "metric type");
    ojbuf *head = &e->head[2];
    head->len = 0;
    oj_byte(head, (uint8_t)*type);
    pb_varint(head, (uint64_t)temporality);
    oj_byte(head, (uint8_t)monotonic);
    pb_varint(head, scratch->len);
    oj_put(head, scratch->p, scratch->len);
    size_t mark = path_push_lit(e, "metric");
    int ok = put_attributes(e, head, 12, f[6], "metadata");
    path_pop(e, mark);
    return ok;
}

/* ---- records ---------------------------------------------------------------------- */

enum {
    L_TIME, L_OBSERVED, L_SEVERITY, L_SEVERITY_TEXT, L_BODY, L_ATTRIBUTES, L_DROPPED, L_FLAGS,
    L_TRACE, L_SPAN, L_EVENT_NAME, L_RESOURCE, L_SCOPE, L_TYPES, L_COUNT
};
static const char *const LOG_KEYS[] = {
    "time_unix_nano", "observed_time_unix_nano", "severity_number", "severity_text", "body",
    "attributes", "dropped_attributes_count", "flags", "trace_id", "span_id", "event_name",
    "resource", "scope", "value_types"};

static int log_record(enc *e, const jspan *f, ojbuf *b)
{
    if (!put_fixed64(e, b, 1, f[L_TIME], "time_unix_nano") ||
        !put_enum(e, b, 2, f[L_SEVERITY], "severity_number") ||
        !put_string(e, b, 3, f[L_SEVERITY_TEXT], "severity_text"))
        return 0;
    if (f[L_BODY].p) {
        size_t mark = path_push_lit(e, "body");
        read_at(e, f[L_BODY]);
        pbmark body = pb_open(b, 5);
        if (!any_value(e, b, 0))
            return 0;
        pb_close_or_drop(b, body);
        path_pop(e, mark);
    }
    return put_attributes(e, b, 6, f[L_ATTRIBUTES], "attributes") &&
           put_uint(e, b, 7, f[L_DROPPED], "dropped_attributes_count", UINT32_MAX) &&
           put_fixed32(e, b, 8, f[L_FLAGS], "flags") &&
           put_id(e, b, 9, f[L_TRACE], 16, "trace_id") && put_id(e, b, 10, f[L_SPAN], 8, "span_id") &&
           put_fixed64(e, b, 11, f[L_OBSERVED], "observed_time_unix_nano") &&
           put_string(e, b, 12, f[L_EVENT_NAME], "event_name");
}

enum {
    S_TRACE, S_SPAN, S_STATE, S_PARENT, S_FLAGS, S_NAME, S_KIND, S_START, S_END, S_ATTRIBUTES,
    S_DROPPED, S_EVENTS, S_DROPPED_EVENTS, S_LINKS, S_DROPPED_LINKS, S_STATUS, S_RESOURCE, S_SCOPE,
    S_TYPES, S_COUNT
};
static const char *const SPAN_KEYS[] = {
    "trace_id", "span_id", "trace_state", "parent_span_id", "flags", "name", "kind",
    "start_time_unix_nano", "end_time_unix_nano", "attributes", "dropped_attributes_count",
    "events", "dropped_events_count", "links", "dropped_links_count", "status", "resource",
    "scope", "value_types"};

/* Calls item(e, b, text, index) for each element of the array at v. */
static int each_item(enc *e, ojbuf *b, jspan v, const char *name,
                     int (*item)(enc *, ojbuf *, jspan, uint32_t))
{
    if (!v.p)
        return 1;
    read_at(e, v);
    if (jr_peek(&e->r) != J_ARRAY)
        return reject(e, "%s is not an array", name);
    jr_array(&e->r);
    jspan text;
    uint32_t i = 0;
    while (jr_next_item(&e->r)) {
        if (!jr_skip(&e->r, &text))
            break;
        const uint8_t *resume = e->r.p, *end = e->r.end;
        uint32_t depth = e->r.depth;
        size_t mark = path_push_lit(e, name);
        path_push_index(e, i);
        if (!item(e, b, text, i++))
            return 0;
        path_pop(e, mark);
        e->r.p = resume, e->r.end = end, e->r.depth = depth;
        e->r.why = NULL;
        e->r.fresh = 0;
    }
    if (e->r.why)
        return json_problem(e, name);
    return 1;
}

static int span_event(enc *e, ojbuf *b, jspan v, uint32_t i)
{
    static const char *const names[] = {"time_unix_nano", "name", "attributes",
                                        "dropped_attributes_count"};
    jspan f[4];
    (void)i;
    pbmark m = pb_open(b, 11);
    if (!index_object(e, v, names, 4, f, "a span event") ||
        !put_fixed64(e, b, 1, f[0], "time_unix_nano") || !put_string(e, b, 2, f[1], "name") ||
        !put_attributes(e, b, 3, f[2], "attributes") ||
        !put_uint(e, b, 4, f[3], "dropped_attributes_count", UINT32_MAX))
        return 0;
    pb_close(b, m);
    return 1;
}

static int span_link(enc *e, ojbuf *b, jspan v, uint32_t i)
{
    static const char *const names[] = {"trace_id", "span_id", "trace_state", "attributes",
                                        "dropped_attributes_count", "flags"};
    jspan f[6];
    (void)i;
    pbmark m = pb_open(b, 13);
    if (!index_object(e, v, names, 6, f, "a span link") ||
        !put_id(e, b, 1, f[0], 16, "a link's trace_id") ||
        !put_id(e, b, 2, f[1], 8, "a link's span_id") ||
        !put_string(e, b, 3, f[2], "trace_state") || !put_attributes(e, b, 4, f[3], "attributes") ||
        !put_uint(e, b, 5, f[4], "dropped_attributes_count", UINT32_MAX) ||
        !put_fixed32(e, b, 6, f[5], "flags"))
        return 0;
    pb_close(b, m);
    return 1;
}

static int span_record(enc *e, const jspan *f, ojbuf *b)
{
    if (!put_id(e, b, 1, f[S_TRACE], 16, "trace_id") || !put_id(e, b, 2, f[S_SPAN], 8, "span_id") ||
        !put_string(e, b, 3, f[S_STATE], "trace_state") ||
        !put_id(e, b, 4, f[S_PARENT], 8, "parent_span_id") || !put_string(e, b, 5, f[S_NAME], "name") ||
        !put_enum(e, b, 6, f[S_KIND], "kind") ||
        !put_fixed64(e, b, 7, f[S_START], "start_time_unix_nano") ||
        !put_fixed64(e, b, 8, f[S_END], "end_time_unix_nano") ||
        !put_attributes(e, b, 9, f[S_ATTRIBUTES], "attributes") ||
        !put_uint(e, b, 10, f[S_DROPPED], "dropped_attributes_count", UINT32_MAX) ||
        !each_item(e, b, f[S_EVENTS], "events", span_event) ||
        !put_uint(e, b, 12, f[S_DROPPED_EVENTS], "dropped_events_count", UINT32_MAX) ||
        !each_item(e, b, f[S_LINKS], "links", span_link) ||
        !put_uint(e, b, 14, f[S_DROPPED_LINKS], "dropped_links_count", UINT32_MAX))
        return 0;
    if (f[S_STATUS].p) {
        static const char *const names[] = {"code", "message"};
        jspan st[2];
        pbmark m = pb_open(b, 15);
        if (!index_object(e, f[S_STATUS], names, 2, st, "status") ||
            !put_string(e, b, 2, st[1], "status message") || !put_enum(e, b, 3, st[0], "status code"))
            return 0;
        pb_close_or_drop(b, m);
    }
    return put_fixed32(e, b, 16, f[S_FLAGS], "flags");
}

enum {
    P_ATTRIBUTES, P_START, P_TIME, P_FLAGS, P_VALUE, P_COUNT, P_SUM, P_BUCKETS, P_BOUNDS, P_MIN,
    P_MAX, P_SCALE, P_ZERO_COUNT, P_ZERO_THRESHOLD, P_POSITIVE, P_NEGATIVE, P_QUANTILES,
    P_EXEMPLARS, P_METRIC, P_RESOURCE, P_SCOPE, P_TYPES, P_KEYS
};
static const char *const POINT_KEYS[] = {
    "attributes", "start_time_unix_nano", "time_unix_nano", "flags", "value", "count", "sum",
    "bucket_counts", "explicit_bounds", "min", "max", "scale", "zero_count", "zero_threshold",
    "positive", "negative", "quantile_values", "exemplars", "metric", "resource", "scope",
    "value_types"};

/* A number point's value: as_int (an integer) or as_double, at the given
 * field numbers; null or absent: neither. */
static int put_number(enc *e, ojbuf *b, jspan v, uint32_t double_field, uint32_t int_field)
{
    if (!v.p)
        return 1;
    read_at(e, v);
    enum jtype t = jr_peek(&e->r);
    if (t == J_NULL)
        return 1;
    if (t == J_NUMBER) {
        jnum n;
        jr_number(&e->r, &n);
        if (n.integer) {
            if (n.overflow || n.magnitude > (n.negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
                return reject(e, "%s is out of range", "value");
            pb_tag(b, int_field, WT_I64);
            pb_le(b, n.negative ? (uint64_t)0 - n.magnitude : n.magnitude, 8);
            return 1;
        }
        pb_double(b, double_field, jnum_value(&n), 1);
        return 1;
    }
    double x;
    if (!read_double(e, "value", &x))
        return 0;
    pb_double(b, double_field, x, 1);
    return 1;
}

static int exemplar(enc *e, ojbuf *b, jspan v, uint32_t field)
{
    static const char *const names[] = {"filtered_attributes", "time_unix_nano", "value",
                                        "span_id", "trace_id"};
    jspan f[5];
    pbmark m = pb_open(b, field);
    if (!index_object(e, v, names, 5, f, "an exemplar") ||
        !put_fixed64(e, b, 2, f[1], "time_unix_nano") || !put_number(e, b, f[2], 3, 6) ||
        !put_id(e, b, 4, f[3], 8, "an exemplar's span_id") ||
        !put_id(e, b, 5, f[4], 16, "an exemplar's trace_id") ||
        !put_attributes(e, b, 7, f[0], "filtered_attributes"))
        return 0;
    pb_close(b, m);
    return 1;
}

/* Exemplars go at field 5 (number points), 8 (histograms), 11 (exponential). */
static int exemplar_item(enc *e, ojbuf *b, jspan v, uint32_t i)
{
    (void)i;
    return exemplar(e, b, v, e->exemplar_field);
}

/* A packed repeated field of the array at v: fixed64, double or varint. */
enum { PACK_FIXED64, PACK_DOUBLE, PACK_VARINT };
static int put_packed(enc *e, ojbuf *b, uint32_t field, jspan v, int how, const char *name)
{
    if (!v.p)
        return 1;
    read_at(e, v);
    if (jr_peek(&e->r) != J_ARRAY)
        return reject(e, "%s is not an array", name);
    jr_array(&e->r);
    pbmark m = pb_open(b, field);
    while (jr_next_item(&e->r)) {
        if (how == PACK_DOUBLE) {
            double x;
            uint64_t bits;
            if (!read_double(e, name, &x))
                return 0;
            memcpy(&bits, &x, 8);
            pb_le(b, bits, 8);
            continue;
        }
        jnum n;
        if (jr_peek(&e->r) != J_NUMBER || !jr_number(&e->r, &n) || !n.integer || n.negative ||
            n.overflow)
            return json_problem(e, name);
        if (how == PACK_FIXED64)
            pb_le(b, n.magnitude, 8);
        else
            pb_varint(b, n.magnitude);
    }
    if (e->r.why)
        return json_problem(e, name);
    pb_close_or_drop(b, m);
    return 1;
}

static int buckets(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    static const char *const names[] = {"offset", "bucket_counts"};
    jspan f[2];
    int64_t offset;
    if (!v.p)
        return 1;
    pbmark m = pb_open(b, field);
    if (!index_object(e, v, names, 2, f, name) ||
        !get_i64(e, f[0], "offset", INT32_MIN, INT32_MAX, &offset))
        return 0;
    pb_uint(b, 1, (uint64_t)((uint32_t)offset << 1 ^ (uint32_t)(offset >> 31))); /* sint32 */
    if (!put_packed(e, b, 2, f[1], PACK_VARINT, "bucket_counts"))
        return 0;
    pb_close_or_drop(b, m);
    return 1;
}

static int optional_double(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    double x;
    int present;
    if (!get_double(e, v, name, &x, &present))
        return 0;
    if (present)
        pb_double(b, field, x, 1);
    return 1;
}

static int quantile(enc *e, ojbuf *b, jspan v, uint32_t i)
{
    static const char *const names[] = {"quantile", "value"};
    jspan f[2];
    double q, x;
    (void)i;
    pbmark m = pb_open(b, 6);
    if (!index_object(e, v, names, 2, f, "a quantile") ||
        !get_double(e, f[0], "quantile", &q, NULL) || !get_double(e, f[1], "value", &x, NULL))
        return 0;
    pb_double(b, 1, q, 0);
    pb_double(b, 2, x, 0);
    pb_close(b, m);
    return 1;
}

/* One data point of a metric of `type` (an index of METRIC_TYPES). */
static int point_record(enc *e, const jspan *f, int type, ojbuf *b)
{
    uint64_t count;
    double x;
    int64_t scale;
    if (type == 3 && !put_attributes(e, b, 1, f[P_ATTRIBUTES], "attributes"))
        return 0;
    if (!put_fixed64(e, b, 2, f[P_START], "start_time_unix_nano") ||
        !put_fixed64(e, b, 3, f[P_TIME], "time_unix_nano"))
        return 0;
    switch (type) {
    case 0:
    case 1: /* NumberDataPoint */
        e->exemplar_field = 5;
        return put_number(e, b, f[P_VALUE], 4, 6) &&
               each_item(e, b, f[P_EXEMPLARS], "exemplars", exemplar_item) &&
               put_attributes(e, b, 7, f[P_ATTRIBUTES], "attributes") &&
               put_uint(e, b, 8, f[P_FLAGS], "flags", UINT32_MAX);
    case 2: /* HistogramDataPoint */
        e->exemplar_field = 8;
        return put_fixed64(e, b, 4, f[P_COUNT], "count") &&
               optional_double(e, b, 5, f[P_SUM], "sum") &&
               put_packed(e, b, 6, f[P_BUCKETS], PACK_FIXED64, "bucket_counts") &&
               put_packed(e, b, 7, f[P_BOUNDS], PACK_DOUBLE, "explicit_bounds") &&
               each_item(e, b, f[P_EXEMPLARS], "exemplars", exemplar_item) &&
               put_attributes(e, b, 9, f[P_ATTRIBUTES], "attributes") &&
               put_uint(e, b, 10, f[P_FLAGS], "flags", UINT32_MAX) &&
               optional_double(e, b, 11, f[P_MIN], "min") &&
               optional_double(e, b, 12, f[P_MAX], "max");
    case 3: /* ExponentialHistogramDataPoint */
        e->exemplar_field = 11;
        if (!put_fixed64(e, b, 4, f[P_COUNT], "count") ||
            !optional_double(e, b, 5, f[P_SUM], "sum") ||
            !get_i64(e, f[P_SCALE], "scale", INT32_MIN, INT32_MAX, &scale))
            return 0;
        pb_uint(b, 6, (uint64_t)((uint32_t)scale << 1 ^ (uint32_t)(scale >> 31))); /* sint32 */
        if (!get_u64(e, f[P_ZERO_COUNT], "zero_count", UINT64_MAX, &count))
            return 0;
        pb_fixed64(b, 7, count);
        if (!buckets(e, b, 8, f[P_POSITIVE], "positive") ||
            !buckets(e, b, 9, f[P_NEGATIVE], "negative") ||
            !put_uint(e, b, 10, f[P_FLAGS], "flags", UINT32_MAX) ||
            !each_item(e, b, f[P_EXEMPLARS], "exemplars", exemplar_item) ||
            !optional_double(e, b, 12, f[P_MIN], "min") ||
            !optional_double(e, b, 13, f[P_MAX], "max") ||
            !get_double(e, f[P_ZERO_THRESHOLD], "zero_threshold", &x, NULL))
            return 0;
        pb_double(b, 14, x, 0);
        return 1;
    default: /* SummaryDataPoint */
        if (!put_fixed64(e, b, 4, f[P_COUNT], "count") ||
            !get_double(e, f[P_SUM], "sum", &x, NULL))
            return 0;
        pb_double(b, 5, x, 0);
        return each_item(e, b, f[P_QUANTILES], "quantile_values", quantile) &&
               put_attributes(e, b, 7, f[P_ATTRIBUTES], "attributes") &&
               put_uint(e, b, 8, f[P_FLAGS], "flags", UINT32_MAX);
    }
}

/* ---- groups ------------------------------------------------------------------------ */

/* A buffer failed to grow: what it holds is incomplete, and the call fails. */
static int failed(const enc *e)
{
    if (e->out.failed || e->rec.failed || e->path.failed)
        return 1;
    for (int l = 0; l < 3; l++)
        if (e->head[l].failed || e->open[l].failed || e->seen[l].failed)
            return 1;
    return e->seen_types.failed;
}


static int head_equal(const ojbuf *a, const ojbuf *b)
{
    return a->len == b->len && memcmp(a->p, b->p, a->len) == 0;
}

/* A varint at p; returns its length. */
static size_t read_varint(const uint8_t *p, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = 0;
    for (int shift = 0;; shift += 7) {
        uint8_t c = p[i++];
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            break;
    }
    *out = v;
    return i;
}

/* The [length][message] prefix of a head (from p, n bytes), and what follows it. */
static void head_parts(const uint8_t *p, size_t n, const uint8_t **message, size_t *len,
                       const uint8_t **rest, size_t *rest_len)
{
    uint64_t m;
    size_t i = read_varint(p, &m);
    *message = p + i;
    *len = (size_t)m;
    *rest = p + i + m;
    *rest_len = n - i - (size_t)m;
}

/* A metric head: [type][temporality varint][monotonic][length][name,
 * description, unit][metadata]. */
typedef struct metric_parts {
    uint8_t type, monotonic;
    uint64_t temporality;
    const uint8_t *fields, *metadata;
    size_t fields_len, metadata_len;
} metric_parts;

static metric_parts metric_head_parts(const ojbuf *head)
{
    metric_parts m;
    m.type = head->p[0];
    size_t i = 1 + read_varint(head->p + 1, &m.temporality);
    m.monotonic = head->p[i++];
    head_parts(head->p + i, head->len - i, &m.fields, &m.fields_len, &m.metadata, &m.metadata_len);
    return m;
}

/* Closes the open groups from `level` down (2: the metric, 1: the scope, 0:
 * the resource), writing what each carries after its records. */
static void close_groups(enc *e, int level)
{
    const uint8_t *message, *rest;
    size_t len, rest_len;
    if (failed(e))
        return;
    for (int l = 2; l >= level; l--) {
        if (!e->level_open[l])
            continue;
        e->level_open[l] = 0;
        ojbuf *head = &e->open[l];
        if (l == 2) {
            metric_parts m = metric_head_parts(head);
            if (m.type >= 1 && m.type <= 3)
                pb_uint(&e->out, 2, m.temporality);
            if (m.type == 1)
                pb_uint(&e->out, 3, m.monotonic);
            pb_close(&e->out, e->data);
            oj_put(&e->out, m.metadata, m.metadata_len);
        } else {
            head_parts(head->p, head->len, &message, &len, &rest, &rest_len);
            pb_bytes(&e->out, l == 0 ? F_GROUP_SCHEMA : F_SCOPE_SCHEMA, rest, rest_len, 0);
        }
        pb_close(&e->out, e->group[l]);
    }
}

static void copy_head(enc *e, int l)
{
    e->open[l].len = 0;
    oj_put(&e->open[l], e->head[l].p, e->head[l].len);
}

/* Opens the groups from `level` down for the current heads. */
static void open_groups(enc *e, int level, int levels)
{
    const uint8_t *message, *rest;
    size_t len, rest_len;
    for (int l = level; l < levels; l++) {
        copy_head(e, l);
        e->level_open[l] = 1;
        if (l < 2) {
            e->group[l] = pb_open(&e->out, l == 0 ? F_REQUEST_GROUPS : F_GROUP_SCOPES);
            head_parts(e->head[l].p, e->head[l].len, &message, &len, &rest, &rest_len);
            pb_bytes(&e->out, l == 0 ? F_GROUP_RESOURCE : F_SCOPE_SCOPE, message, len, 0);
        } else {
            metric_parts m = metric_head_parts(&e->head[2]);
            e->group[2] = pb_open(&e->out, F_SCOPE_RECORDS);
            oj_put(&e->out, m.fields, m.fields_len); /* name, description, unit */
            e->data = pb_open(&e->out, METRIC_FIELDS[m.type]);
        }
    }
}

/* Appends the record in e->rec under the current heads. */
static void commit(enc *e)
{
    if (failed(e))
        return;
    int levels = e->signal == COMET_OTLP_METRICS ? 3 : 2;
    int first_new = levels;
    for (int l = 0; l < levels; l++) {
        if (!e->level_open[l] || !head_equal(&e->head[l], &e->open[l])) {
            first_new = l;
            break;
        }
    }
    if (first_new < levels) {
        close_groups(e, first_new);
        open_groups(e, first_new, levels);
    }
    /* a metric's points are its data's field 1; logs and spans are the scope's records */
    pb_bytes(&e->out, levels == 3 ? 1 : F_SCOPE_RECORDS, e->rec.p, e->rec.len, 1);
    e->res->count++;
}

/* ---- one event --------------------------------------------------------------------- */

static int same_text(const ojbuf *b, jspan v)
{
    return b->len == v.len && (v.len == 0 || memcmp(b->p, v.p, v.len) == 0);
}

static void remember(ojbuf *b, jspan v)
{
    b->len = 0;
    oj_put(b, v.p, v.len);
}

/* Makes head l from its text v, unless the last event's was the same text
 * under the same value_types (consecutive events of a group repeat it). */
static int make_head(enc *e, int l, jspan v, int types_same, int *type)
{
    if (e->seen_ok[l] && types_same && v.p && same_text(&e->seen[l], v)) {
        if (l == 2)
            *type = e->head[2].p[0];
        return 1;
    }
    e->seen_ok[l] = 0;
    int ok = l == 0 ? resource_head(e, v, &e->rec) : l == 1 ? scope_head(e, v, &e->rec)
                                                            : metric_head(e, v, &e->rec, type);
    if (ok && v.p) {
        remember(&e->seen[l], v);
        e->seen_ok[l] = 1;
    }
    return ok;
}

static int layout_event(enc *e, jspan event)
{
    jspan f[P_KEYS];
    const char *const *keys = e->signal == COMET_OTLP_LOGS     ? LOG_KEYS
                              : e->signal == COMET_OTLP_TRACES ? SPAN_KEYS
                                                               : POINT_KEYS;
    int nkeys = e->signal == COMET_OTLP_LOGS ? L_COUNT : e->signal == COMET_OTLP_TRACES ? S_COUNT : P_KEYS;
    int at_resource = e->signal == COMET_OTLP_LOGS ? L_RESOURCE : e->signal == COMET_OTLP_TRACES ? S_RESOURCE : P_RESOURCE;
    int type = 0;
    e->path.len = 0;
    if (!index_object(e, event, keys, nkeys, f, "the event"))
        return 0;
    if (!jr_at_end(&e->r))
        return reject(e, "%s", "the event has bytes after its end");
    jspan types = f[at_resource + 2];
    int types_same = same_text(&e->seen_types, types);
    if (!types_same) {
        remember(&e->seen_types, types);
        e->seen_ok[0] = e->seen_ok[1] = e->seen_ok[2] = 0;
    }
    if (!read_types(e, types) || !make_head(e, 0, f[at_resource], types_same, &type) ||
        !make_head(e, 1, f[at_resource + 1], types_same, &type))
        return 0;
    if (e->signal == COMET_OTLP_METRICS && !make_head(e, 2, f[P_METRIC], types_same, &type))
        return 0;
    e->rec.len = 0;
    if (e->signal == COMET_OTLP_LOGS)
        return log_record(e, f, &e->rec);
    if (e->signal == COMET_OTLP_TRACES)
        return span_record(e, f, &e->rec);
    return point_record(e, f, type, &e->rec);
}

/* A plain event: a log record whose body is the payload. */
static void plain_event(enc *e, jspan payload, int64_t timestamp)
{
    ojbuf *b = &e->rec;
    b->len = 0;
    e->track = 0;
    e->ntypes = 0;
    pb_fixed64(b, 1, (uint64_t)timestamp);
    size_t start = b->len;
    pbmark body = pb_open(b, 5);
    read_at(e, payload);
    e->why = NULL;
    if (any_value(e, b, 0) && jr_at_end(&e->r)) {
        pb_close_or_drop(b, body);
    } else {
        /* not JSON that protobuf can carry: the payload itself */
        b->len = start;
        body = pb_open(b, 5);
        int text = !utf8_invalid(payload.p, payload.len);
        pb_bytes(b, text ? 1 : 7, payload.p, payload.len, 1);
        pb_close(b, body);
    }
    e->why = NULL;
    pb_fixed64(b, 11, (uint64_t)timestamp);
}

static int add_rejected(enc *e, uint32_t index)
{
    comet_otlp_encoded *res = e->res;
    if (res->rejected == e->rejected_cap) {
        uint32_t cap = e->rejected_cap ? e->rejected_cap * 2 : 8;
        uint32_t *idx = sys_realloc(res->rejected_index, cap * sizeof *idx);
        if (!idx)
            return COMET_E_NOMEM;
        res->rejected_index = idx;
        char *reasons = sys_realloc(res->reasons, (size_t)cap * COMET_OTLP_REASON_BYTES);
        if (!reasons)
            return COMET_E_NOMEM;
        res->reasons = reasons;
        e->rejected_cap = cap;
    }
    res->rejected_index[res->rejected] = index;
    snprintf(res->reasons + (size_t)res->rejected * COMET_OTLP_REASON_BYTES,
             COMET_OTLP_REASON_BYTES, "%s", e->why ? e->why : "not in the layout");
    res->rejected++;
    return 0;
}

static void enc_free(enc *e)
{
    for (int l = 0; l < 3; l++) {
        ojbuf_free(&e->head[l]);
        ojbuf_free(&e->open[l]);
        ojbuf_free(&e->seen[l]);
    }
    ojbuf_free(&e->seen_types);
    ojbuf_free(&e->rec);
    ojbuf_free(&e->path);
    ojbuf_free(&e->out);
    free(e->types);
    free(e->scratch);
}

int comet_otlp_encode(int32_t signal, uint32_t flags, const uint8_t *data, const int32_t *offsets,
                      const int64_t *timestamps, uint32_t count, const uint8_t *resource,
                      uint64_t resource_len, comet_otlp_encoded *out)
{
    if (!out)
        return set_error(COMET_E_INVALID, "comet_otlp_encode: no result");
    memset(out, 0, sizeof *out);
    int plain = (flags & COMET_OTLP_PLAIN) != 0;
    if ((signal != COMET_OTLP_LOGS && signal != COMET_OTLP_TRACES && signal != COMET_OTLP_METRICS) ||
        (flags & ~COMET_OTLP_PLAIN) || (plain && signal != COMET_OTLP_LOGS) ||
        (count && (!data || !offsets)) || (plain && count && !timestamps) ||
        (resource_len && !resource))
        return set_error(COMET_E_INVALID, "comet_otlp_encode: bad arguments");
    enc e;
    memset(&e, 0, sizeof e);
    e.signal = signal;
    e.plain = plain;
    e.res = out;
    size_t longest = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (offsets[i + 1] < offsets[i] || offsets[i] < 0)
            return set_error(COMET_E_INVALID, "comet_otlp_encode: offsets go backwards");
        size_t n = (size_t)(offsets[i + 1] - offsets[i]);
        longest = n > longest ? n : longest;
    }
    /* every string of an event is unescaped at most three times (keys while
     * indexing, value_types, the values), never growing */
    e.scratch_cap = 3 * longest + 64;
    e.scratch = sys_malloc(e.scratch_cap);
    if (!e.scratch)
        return set_error(COMET_E_NOMEM, "comet_otlp_encode: out of memory");
    if (plain) {
        ojbuf message = {.p = (uint8_t *)resource, .len = (size_t)resource_len};
        put_head(&e.head[0], &message, (jspan){NULL, 0});
        ojbuf empty = {0};
        put_head(&e.head[1], &empty, (jspan){NULL, 0});
    }
    int rc = 0;
    for (uint32_t i = 0; i < count && !rc; i++) {
        jspan event = {data + offsets[i], (uint32_t)(offsets[i + 1] - offsets[i])};
        jr_init(&e.r, event.p, event.len, e.scratch, e.scratch_cap, MAX_DEPTH);
        e.why = NULL;
        e.rec.len = 0;
        if (plain) {
            plain_event(&e, event, timestamps[i]);
            commit(&e);
        } else if (layout_event(&e, event)) {
            commit(&e);
        } else {
            rc = add_rejected(&e, i);
        }
        if (!rc && failed(&e))
            rc = COMET_E_NOMEM;
    }
    if (!rc) {
        close_groups(&e, 0);
        if (failed(&e))
            rc = COMET_E_NOMEM;
    }
    if (rc) {
        enc_free(&e);
        return set_error(rc, "%s", "comet_otlp_encode: out of memory");
    }
    out->data = e.out.p;
    out->len = e.out.len;
    e.out.p = NULL;
    enc_free(&e);
    return 0;
}

void comet_otlp_encoded_free(comet_otlp_encoded *out)
{
    if (!out)
        return;
    free(out->data);
    free(out->rejected_index);
    free(out->reasons);
    memset(out, 0, sizeof *out);
}
