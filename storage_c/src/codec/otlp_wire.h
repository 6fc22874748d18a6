/*
 * otlp_wire.h - the protobuf wire of OTLP export requests as otlp.c reads it
 * (otlp_wire.c): the messages of the schema, upb's checks of a body (pass 1),
 * and the reading of a checked message into one slot per field number
 * (pass 2).  Private to otlp.c and otlp_wire.c.
 */
#ifndef COMET_OTLP_WIRE_H
#define COMET_OTLP_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "comet.h"

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_START = 3, WT_END = 4, WT_I32 = 5 };

/* The messages an export request holds. */
enum msg {
    M_UNKNOWN, /* an unknown group: all of its fields are unknown */
    M_LOGS_REQUEST, M_TRACES_REQUEST, M_METRICS_REQUEST,
    M_RESOURCE_LOGS, M_RESOURCE_SPANS, M_RESOURCE_METRICS,
    M_SCOPE_LOGS, M_SCOPE_SPANS, M_SCOPE_METRICS,
    M_RESOURCE, M_SCOPE, M_KEY_VALUE, M_ANY_VALUE, M_ARRAY_VALUE, M_KVLIST, M_ENTITY_REF,
    M_LOG_RECORD, M_SPAN, M_SPAN_EVENT, M_SPAN_LINK, M_STATUS,
    M_METRIC, M_GAUGE, M_SUM, M_HISTOGRAM, M_EXP_HISTOGRAM, M_SUMMARY,
    M_NUMBER_POINT, M_HISTOGRAM_POINT, M_EXP_POINT, M_BUCKETS, M_SUMMARY_POINT, M_QUANTILE,
    M_EXEMPLAR,
    M_COUNT
};

/* How a field is sent: K_VARINT (int32, int64, uint32, uint64, sint32, bool,
 * enum), K_I64 (fixed64, sfixed64, double), K_I32 (fixed32), K_STRING (UTF-8
 * checked), K_BYTES, K_MESSAGE, and repeated numbers that may come packed. */
enum kind { K_NONE, K_VARINT, K_I64, K_I32, K_STRING, K_BYTES, K_MESSAGE, K_PACKED_VARINT, K_PACKED_I64 };

#define MAX_FIELD 16

typedef struct span {
    const uint8_t *p, *end;
} span;

/* A message: the payloads of its occurrences, parsed one after another. */
typedef struct view {
    const span *s;
    uint32_t n;
} view;

/* What pb_scan keeps of one field number of a message. */
typedef struct slot {
    const uint8_t *at; /* string, bytes, message: the (last; message: first) payload;
                          repeated: the tag of the first occurrence */
    uint64_t v;        /* a scalar's last value; a payload's length */
    uint32_t n;        /* occurrences (a oneof member: since the oneof last switched to it) */
    uint32_t seg;      /* repeated: the view's span holding the first occurrence */
    uint32_t cap;      /* message: room in more */
    span *more;        /* message sent more than once: every payload, in order */
} slot;

typedef struct fields {
    uint32_t present; /* bit n: f[n] holds what was seen of field n (else nothing was) */
    uint32_t which;   /* the member of the message's oneof set last, 0 if none */
    slot f[MAX_FIELD + 1];
} fields;

/* The occurrences of a repeated field, in order. */
typedef struct iter {
    view v;
    uint32_t k;       /* span */
    const uint8_t *p;
    uint32_t num, kind, left;
    const uint8_t *at; /* the tag of the occurrence returned last */
} iter;

/* What a decode's wire functions share: the body, where a refusal is told,
 * the arena of merged messages' span lists. */
typedef struct wire {
    const uint8_t *body;
    comet_otlp_result *res;
    struct block *blocks;
    int failed; /* an allocation failed: what was read since is incomplete */
} wire;

/* The request is refused: where and why, in res and the thread's error;
 * returns COMET_E_BAD_OTLP. */
int pb_fail(wire *w, const uint8_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), cold));
/* Pass 1: 0 when upb would parse body[0, len) as a message of type m, else
 * pb_fail's COMET_E_BAD_OTLP. */
int pb_check(wire *w, int m, const uint8_t *body, size_t len);
/* Pass 2, on checked bytes only: every field of the message of type m in v. */
void pb_scan(wire *w, int m, view v, fields *out);
/* The occurrences of repeated field num of a message (type m, scanned into
 * f from v), in order: pb_next gives 1 with its wire type and its payload
 * (WT_LEN) or value bytes, 0 at the end. */
iter pb_iter(view v, const fields *f, int m, uint32_t num);
int pb_next(iter *it, uint32_t *wt, span *out);
void pb_free(wire *w);

static inline const uint8_t *get_varint(const uint8_t *p, uint64_t *out)
{
    if (*p < 0x80) {
        *out = *p;
        return p + 1;
    }
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
    }
    *out = v;
    return p;
}

static inline uint64_t get_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* the wire is little-endian, as is every machine this builds for */
}

/* The slot of field num, empty when the field was not seen. */
static inline const slot *get(const fields *f, uint32_t num)
{
    static const slot none;
    return f->present >> num & 1 ? &f->f[num] : &none;
}

static inline view one_view(const span *s)
{
    return (view){s, 1};
}

/* The message in a slot of a singular message field (one: room for a single
 * payload's span, which must live as long as the view). */
static inline view message_view(const slot *s, span *one)
{
    if (s->n <= 1) {
        *one = (span){s->at, s->at + s->v};
        return (view){one, s->n};
    }
    return (view){s->more, s->n};
}

static inline uint64_t num_of(const fields *f, uint32_t num)
{
    return get(f, num)->n ? get(f, num)->v : 0;
}

#endif
