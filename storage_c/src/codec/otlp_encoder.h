/*
 * otlp_encoder.h - what the parts of the OTLP encoder share: its state, the
 * readers of an event's fields (inline: they run for every field), and the
 * functions each part offers the others.  otlp_encode.c says how the parts
 * fit; otlp_values.c turns JSON values, attributes and heads into protobuf,
 * otlp_records.c the records of each signal.  Private to those files.
 */
#ifndef COMET_OTLP_ENCODER_H
#define COMET_OTLP_ENCODER_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comet.h"
#include "otlp_json.h"
#include "jsonread.h"
#include "pbwrite.h"

/* The encoder's state, one call of comet_otlp_encode. */
#define MAX_DEPTH 64 /* the event's own levels around COMET_OTLP_MAX_DEPTH value levels */
#define MAX_TYPES 4096

enum { VT_BYTES = 1, VT_DOUBLE = 2 };

typedef struct vtype {
    jspan pointer;
    int kind;
} vtype;

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

/* Reads the object at v and puts the text of each member named in names[0,
 * n) into out (absent members: p NULL; a repeated key: its last). */
int enc_index_object(enc *e, jspan v, const char *const *names, int n, jspan *out, const char *what);
/* JSON pointers of the value being written (kept only while the event has value_types). */
size_t enc_path_push_lit(enc *e, const char *name);
size_t enc_path_push_index(enc *e, uint32_t i);
void enc_path_pop(enc *e, size_t mark);
int enc_read_types(enc *e, jspan v);
/* The AnyValue at the reader, its fields written into b. */
int enc_any_value(enc *e, ojbuf *b, uint32_t depth);
/* The attributes object whose text is v, at `field`, under pointer `name`. */
int enc_put_attributes(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name);
/* The heads (otlp_values.c): written into e->head[0..2] from the event's text. */
void enc_put_head(ojbuf *head, const ojbuf *message, jspan schema);
int enc_resource_head(enc *e, jspan v, ojbuf *scratch);
int enc_scope_head(enc *e, jspan v, ojbuf *scratch);
int enc_metric_head(enc *e, jspan v, ojbuf *scratch, int *type);
extern const uint32_t ENC_METRIC_FIELDS[5];
/* The records (otlp_records.c), from the event's members, indexed by these
 * (each signal's keys, in its array below). */
enum {
    L_TIME, L_OBSERVED, L_SEVERITY, L_SEVERITY_TEXT, L_BODY, L_ATTRIBUTES, L_DROPPED, L_FLAGS,
    L_TRACE, L_SPAN, L_EVENT_NAME, L_RESOURCE, L_SCOPE, L_TYPES, L_COUNT
};
enum {
    S_TRACE, S_SPAN, S_STATE, S_PARENT, S_FLAGS, S_NAME, S_KIND, S_START, S_END, S_ATTRIBUTES,
    S_DROPPED, S_EVENTS, S_DROPPED_EVENTS, S_LINKS, S_DROPPED_LINKS, S_STATUS, S_RESOURCE, S_SCOPE,
    S_TYPES, S_COUNT
};
enum {
    P_ATTRIBUTES, P_START, P_TIME, P_FLAGS, P_VALUE, P_COUNT, P_SUM, P_BUCKETS, P_BOUNDS, P_MIN,
    P_MAX, P_SCALE, P_ZERO_COUNT, P_ZERO_THRESHOLD, P_POSITIVE, P_NEGATIVE, P_QUANTILES,
    P_EXEMPLARS, P_METRIC, P_RESOURCE, P_SCOPE, P_TYPES, P_KEYS
};
extern const char *const ENC_LOG_KEYS[];
extern const char *const ENC_SPAN_KEYS[];
extern const char *const ENC_POINT_KEYS[];
int enc_log_record(enc *e, const jspan *f, ojbuf *b);
int enc_span_record(enc *e, const jspan *f, ojbuf *b);
int enc_point_record(enc *e, const jspan *f, int type, ojbuf *b);

/* ---- reading the event's values ------------------------------------------------ */

static inline int reject(enc *e, const char *fmt, const char *detail)
{
    if (!e->why) {
        snprintf(e->why_buf, sizeof e->why_buf, fmt, detail);
        e->why = e->why_buf;
    }
    return 0;
}

/* Points the reader at a value's text. */
static inline void read_at(enc *e, jspan text)
{
    e->r.p = text.p;
    e->r.end = text.p + text.len;
    e->r.why = NULL;
}

static inline int json_problem(enc *e, const char *name)
{
    if (e->r.why)
        return reject(e, "%s", e->r.why);
    return reject(e, "%s has the wrong type", name);
}

/* Each getter reads an event field given by its text (p NULL: absent, the
 * protobuf default) and says 0 with the reason set when it breaks the layout. */
static inline int get_u64(enc *e, jspan v, const char *name, uint64_t max, uint64_t *out)
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

static inline int get_i64(enc *e, jspan v, const char *name, int64_t min, int64_t max, int64_t *out)
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

static inline int get_bool(enc *e, jspan v, const char *name, int *out)
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

static inline int get_string(enc *e, jspan v, const char *name, jspan *out)
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

static inline int special_double(jspan s, double *out)
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
static inline int read_double(enc *e, const char *name, double *out)
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
static inline int get_double(enc *e, jspan v, const char *name, double *out, int *present)
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
static inline int put_id(enc *e, ojbuf *b, uint32_t field, jspan v, size_t size, const char *name)
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

static inline int put_string(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    jspan s;
    if (!get_string(e, v, name, &s))
        return 0;
    pb_bytes(b, field, s.p, s.len, 0);
    return 1;
}

/* An unsigned field of the event (at most max) written as a varint, or as
 * fixed 8 or 4 bytes (width 0, 8, 4). */
static inline int put_unsigned(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name, uint64_t max,
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

static inline int put_uint(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name, uint64_t max)
{
    return put_unsigned(e, b, field, v, name, max, 0);
}

static inline int put_fixed64(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    return put_unsigned(e, b, field, v, name, UINT64_MAX, 8);
}

static inline int put_fixed32(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    return put_unsigned(e, b, field, v, name, UINT32_MAX, 4);
}

/* An enum (int32 on the wire as a varint, negative values as 10 bytes). */
static inline int put_enum(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    int64_t x;
    if (!get_i64(e, v, name, INT32_MIN, INT32_MAX, &x))
        return 0;
    pb_uint(b, field, (uint64_t)x);
    return 1;
}

#endif /* COMET_OTLP_ENCODER_H */
