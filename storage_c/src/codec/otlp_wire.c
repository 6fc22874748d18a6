/*
 * otlp_wire.c - the protobuf wire of OTLP export requests (otlp_wire.h): the
 * schema of the messages a request holds, pass 1 (upb's checks) and pass 2's
 * reading of checked bytes.  otlp.c's top comment has the design.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "otlp_wire.h"
#include "port/port.h"
#include "utf8.h"

/* upb's default limit on nested messages and groups below the request. */
#define WIRE_MAX_DEPTH 100

/* ---- the schema ------------------------------------------------------------- */

typedef struct field_def {
    uint8_t kind;
    uint8_t msg;      /* K_MESSAGE: its type */
    uint8_t repeated;
    uint8_t oneof;    /* a member of the message's (one) oneof */
} field_def;

typedef struct msg_def {
    const char *name;
    field_def f[MAX_FIELD + 1]; /* by field number: {kind, msg, repeated, oneof} */
} msg_def;

static const msg_def MSGS[M_COUNT] = {
    [M_UNKNOWN] = {"group", {{0}}},
    [M_LOGS_REQUEST] = {"ExportLogsServiceRequest", {[1] = {K_MESSAGE, M_RESOURCE_LOGS, 1, 0}}},
    [M_TRACES_REQUEST] = {"ExportTraceServiceRequest", {[1] = {K_MESSAGE, M_RESOURCE_SPANS, 1, 0}}},
    [M_METRICS_REQUEST] = {"ExportMetricsServiceRequest",
                           {[1] = {K_MESSAGE, M_RESOURCE_METRICS, 1, 0}}},
    [M_RESOURCE_LOGS] = {"ResourceLogs", {[1] = {K_MESSAGE, M_RESOURCE, 0, 0},
                                          [2] = {K_MESSAGE, M_SCOPE_LOGS, 1, 0},
                                          [3] = {K_STRING, 0, 0, 0}}},
    [M_RESOURCE_SPANS] = {"ResourceSpans", {[1] = {K_MESSAGE, M_RESOURCE, 0, 0},
                                            [2] = {K_MESSAGE, M_SCOPE_SPANS, 1, 0},
                                            [3] = {K_STRING, 0, 0, 0}}},
    [M_RESOURCE_METRICS] = {"ResourceMetrics", {[1] = {K_MESSAGE, M_RESOURCE, 0, 0},
                                                [2] = {K_MESSAGE, M_SCOPE_METRICS, 1, 0},
                                                [3] = {K_STRING, 0, 0, 0}}},
    [M_SCOPE_LOGS] = {"ScopeLogs", {[1] = {K_MESSAGE, M_SCOPE, 0, 0},
                                    [2] = {K_MESSAGE, M_LOG_RECORD, 1, 0},
                                    [3] = {K_STRING, 0, 0, 0}}},
    [M_SCOPE_SPANS] = {"ScopeSpans", {[1] = {K_MESSAGE, M_SCOPE, 0, 0},
                                      [2] = {K_MESSAGE, M_SPAN, 1, 0},
                                      [3] = {K_STRING, 0, 0, 0}}},
    [M_SCOPE_METRICS] = {"ScopeMetrics", {[1] = {K_MESSAGE, M_SCOPE, 0, 0},
                                          [2] = {K_MESSAGE, M_METRIC, 1, 0},
                                          [3] = {K_STRING, 0, 0, 0}}},
    [M_RESOURCE] = {"Resource", {[1] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                                 [2] = {K_VARINT, 0, 0, 0},
                                 [3] = {K_MESSAGE, M_ENTITY_REF, 1, 0}}},
    [M_SCOPE] = {"InstrumentationScope", {[1] = {K_STRING, 0, 0, 0},
                                          [2] = {K_STRING, 0, 0, 0},
                                          [3] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                                          [4] = {K_VARINT, 0, 0, 0}}},
    [M_KEY_VALUE] = {"KeyValue", {[1] = {K_STRING, 0, 0, 0},
                                  [2] = {K_MESSAGE, M_ANY_VALUE, 0, 0},
                                  [3] = {K_VARINT, 0, 0, 0}}},
    [M_ANY_VALUE] = {"AnyValue", {[1] = {K_STRING, 0, 0, 1},
                                  [2] = {K_VARINT, 0, 0, 1},
                                  [3] = {K_VARINT, 0, 0, 1},
                                  [4] = {K_I64, 0, 0, 1},
                                  [5] = {K_MESSAGE, M_ARRAY_VALUE, 0, 1},
                                  [6] = {K_MESSAGE, M_KVLIST, 0, 1},
                                  [7] = {K_BYTES, 0, 0, 1},
                                  [8] = {K_VARINT, 0, 0, 1}}},
    [M_ARRAY_VALUE] = {"ArrayValue", {[1] = {K_MESSAGE, M_ANY_VALUE, 1, 0}}},
    [M_KVLIST] = {"KeyValueList", {[1] = {K_MESSAGE, M_KEY_VALUE, 1, 0}}},
    [M_ENTITY_REF] = {"EntityRef", {[1] = {K_STRING, 0, 0, 0},
                                    [2] = {K_STRING, 0, 0, 0},
                                    [3] = {K_STRING, 0, 1, 0},
                                    [4] = {K_STRING, 0, 1, 0}}},
    [M_LOG_RECORD] = {"LogRecord", {[1] = {K_I64, 0, 0, 0},
                                    [2] = {K_VARINT, 0, 0, 0},
                                    [3] = {K_STRING, 0, 0, 0},
                                    [5] = {K_MESSAGE, M_ANY_VALUE, 0, 0},
                                    [6] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                                    [7] = {K_VARINT, 0, 0, 0},
                                    [8] = {K_I32, 0, 0, 0},
                                    [9] = {K_BYTES, 0, 0, 0},
                                    [10] = {K_BYTES, 0, 0, 0},
                                    [11] = {K_I64, 0, 0, 0},
                                    [12] = {K_STRING, 0, 0, 0}}},
    [M_SPAN] = {"Span", {[1] = {K_BYTES, 0, 0, 0},
                         [2] = {K_BYTES, 0, 0, 0},
                         [3] = {K_STRING, 0, 0, 0},
                         [4] = {K_BYTES, 0, 0, 0},
                         [5] = {K_STRING, 0, 0, 0},
                         [6] = {K_VARINT, 0, 0, 0},
                         [7] = {K_I64, 0, 0, 0},
                         [8] = {K_I64, 0, 0, 0},
                         [9] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                         [10] = {K_VARINT, 0, 0, 0},
                         [11] = {K_MESSAGE, M_SPAN_EVENT, 1, 0},
                         [12] = {K_VARINT, 0, 0, 0},
                         [13] = {K_MESSAGE, M_SPAN_LINK, 1, 0},
                         [14] = {K_VARINT, 0, 0, 0},
                         [15] = {K_MESSAGE, M_STATUS, 0, 0},
                         [16] = {K_I32, 0, 0, 0}}},
    [M_SPAN_EVENT] = {"Span.Event", {[1] = {K_I64, 0, 0, 0},
                                     [2] = {K_STRING, 0, 0, 0},
                                     [3] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                                     [4] = {K_VARINT, 0, 0, 0}}},
    [M_SPAN_LINK] = {"Span.Link", {[1] = {K_BYTES, 0, 0, 0},
                                   [2] = {K_BYTES, 0, 0, 0},
                                   [3] = {K_STRING, 0, 0, 0},
                                   [4] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                                   [5] = {K_VARINT, 0, 0, 0},
                                   [6] = {K_I32, 0, 0, 0}}},
    [M_STATUS] = {"Status", {[2] = {K_STRING, 0, 0, 0}, [3] = {K_VARINT, 0, 0, 0}}},
    [M_METRIC] = {"Metric", {[1] = {K_STRING, 0, 0, 0},
                             [2] = {K_STRING, 0, 0, 0},
                             [3] = {K_STRING, 0, 0, 0},
                             [5] = {K_MESSAGE, M_GAUGE, 0, 1},
                             [7] = {K_MESSAGE, M_SUM, 0, 1},
                             [9] = {K_MESSAGE, M_HISTOGRAM, 0, 1},
                             [10] = {K_MESSAGE, M_EXP_HISTOGRAM, 0, 1},
                             [11] = {K_MESSAGE, M_SUMMARY, 0, 1},
                             [12] = {K_MESSAGE, M_KEY_VALUE, 1, 0}}},
    [M_GAUGE] = {"Gauge", {[1] = {K_MESSAGE, M_NUMBER_POINT, 1, 0}}},
    [M_SUM] = {"Sum", {[1] = {K_MESSAGE, M_NUMBER_POINT, 1, 0},
                       [2] = {K_VARINT, 0, 0, 0},
                       [3] = {K_VARINT, 0, 0, 0}}},
    [M_HISTOGRAM] = {"Histogram", {[1] = {K_MESSAGE, M_HISTOGRAM_POINT, 1, 0},
                                   [2] = {K_VARINT, 0, 0, 0}}},
    [M_EXP_HISTOGRAM] = {"ExponentialHistogram", {[1] = {K_MESSAGE, M_EXP_POINT, 1, 0},
                                                  [2] = {K_VARINT, 0, 0, 0}}},
    [M_SUMMARY] = {"Summary", {[1] = {K_MESSAGE, M_SUMMARY_POINT, 1, 0}}},
    [M_NUMBER_POINT] = {"NumberDataPoint", {[2] = {K_I64, 0, 0, 0},
                                            [3] = {K_I64, 0, 0, 0},
                                            [4] = {K_I64, 0, 0, 1},
                                            [5] = {K_MESSAGE, M_EXEMPLAR, 1, 0},
                                            [6] = {K_I64, 0, 0, 1},
                                            [7] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                                            [8] = {K_VARINT, 0, 0, 0}}},
    [M_HISTOGRAM_POINT] = {"HistogramDataPoint", {[2] = {K_I64, 0, 0, 0},
                                                  [3] = {K_I64, 0, 0, 0},
                                                  [4] = {K_I64, 0, 0, 0},
                                                  [5] = {K_I64, 0, 0, 0},
                                                  [6] = {K_PACKED_I64, 0, 1, 0},
                                                  [7] = {K_PACKED_I64, 0, 1, 0},
                                                  [8] = {K_MESSAGE, M_EXEMPLAR, 1, 0},
                                                  [9] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                                                  [10] = {K_VARINT, 0, 0, 0},
                                                  [11] = {K_I64, 0, 0, 0},
                                                  [12] = {K_I64, 0, 0, 0}}},
    [M_EXP_POINT] = {"ExponentialHistogramDataPoint", {[1] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                                                       [2] = {K_I64, 0, 0, 0},
                                                       [3] = {K_I64, 0, 0, 0},
                                                       [4] = {K_I64, 0, 0, 0},
                                                       [5] = {K_I64, 0, 0, 0},
                                                       [6] = {K_VARINT, 0, 0, 0},
                                                       [7] = {K_I64, 0, 0, 0},
                                                       [8] = {K_MESSAGE, M_BUCKETS, 0, 0},
                                                       [9] = {K_MESSAGE, M_BUCKETS, 0, 0},
                                                       [10] = {K_VARINT, 0, 0, 0},
                                                       [11] = {K_MESSAGE, M_EXEMPLAR, 1, 0},
                                                       [12] = {K_I64, 0, 0, 0},
                                                       [13] = {K_I64, 0, 0, 0},
                                                       [14] = {K_I64, 0, 0, 0}}},
    [M_BUCKETS] = {"ExponentialHistogramDataPoint.Buckets", {[1] = {K_VARINT, 0, 0, 0},
                                                             [2] = {K_PACKED_VARINT, 0, 1, 0}}},
    [M_SUMMARY_POINT] = {"SummaryDataPoint", {[2] = {K_I64, 0, 0, 0},
                                              [3] = {K_I64, 0, 0, 0},
                                              [4] = {K_I64, 0, 0, 0},
                                              [5] = {K_I64, 0, 0, 0},
                                              [6] = {K_MESSAGE, M_QUANTILE, 1, 0},
                                              [7] = {K_MESSAGE, M_KEY_VALUE, 1, 0},
                                              [8] = {K_VARINT, 0, 0, 0}}},
    [M_QUANTILE] = {"SummaryDataPoint.ValueAtQuantile", {[1] = {K_I64, 0, 0, 0},
                                                        [2] = {K_I64, 0, 0, 0}}},
    [M_EXEMPLAR] = {"Exemplar", {[2] = {K_I64, 0, 0, 0},
                                 [3] = {K_I64, 0, 0, 1},
                                 [4] = {K_BYTES, 0, 0, 0},
                                 [5] = {K_BYTES, 0, 0, 0},
                                 [6] = {K_I64, 0, 0, 1},
                                 [7] = {K_MESSAGE, M_KEY_VALUE, 1, 0}}},
};

static const field_def NO_FIELD = {K_NONE, 0, 0, 0};

static inline const field_def *field_of(int m, uint32_t num)
{
    return num <= MAX_FIELD ? &MSGS[m].f[num] : &NO_FIELD;
}

/* Whether a field of this kind sent with wire type wt is the known field
 * (else protobuf keeps it as an unknown field). */
static inline int wire_matches(int kind, uint32_t wt)
{
    static const uint8_t WIRES[] = {
        [K_NONE] = 0,
        [K_VARINT] = 1 << WT_VARINT,
        [K_I64] = 1 << WT_I64,
        [K_I32] = 1 << WT_I32,
        [K_STRING] = 1 << WT_LEN,
        [K_BYTES] = 1 << WT_LEN,
        [K_MESSAGE] = 1 << WT_LEN,
        [K_PACKED_VARINT] = 1 << WT_VARINT | 1 << WT_LEN,
        [K_PACKED_I64] = 1 << WT_I64 | 1 << WT_LEN,
    };
    return WIRES[kind] >> wt & 1;
}

/* ---- the arena, refusals ---------------------------------------------------- */

/* Arena for the span lists of merged messages, freed with the decoder. */
typedef struct block {
    struct block *next;
    size_t used, cap;
    span data[];
} block;

/* The request is refused: where and why, in the result and the thread's error. */
int pb_fail(wire *w, const uint8_t *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->res->reason, sizeof w->res->reason, fmt, ap);
    va_end(ap);
    w->res->error_offset = (uint64_t)(at - w->body);
    return set_error(COMET_E_BAD_OTLP, "invalid OTLP request at byte %llu: %s",
                     (unsigned long long)w->res->error_offset, w->res->reason);
}

static span *arena_spans(wire *w, size_t n)
{
    block *b = w->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 1024 ? n : 1024;
        b = sys_malloc(sizeof *b + cap * sizeof(span));
        if (!b) {
            w->failed = 1;
            return NULL;
        }
        b->next = w->blocks;
        b->used = 0;
        b->cap = cap;
        w->blocks = b;
    }
    span *s = b->data + b->used;
    b->used += n;
    return s;
}

/* ---- pass 1: the checks upb makes ------------------------------------------- */

/* A varint of at most 10 bytes (bits past the 64th are dropped, as upb
 * does): the byte after it, or NULL when it is truncated or longer. */
static inline const uint8_t *read_varint(const uint8_t *p, const uint8_t *end, uint64_t *out)
{
    if (p < end && *p < 0x80) {
        *out = *p;
        return p + 1;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10 && p + i < end; i++) {
        uint8_t b = p[i];
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return p + i + 1;
        }
    }
    return NULL;
}


/* "a ScopeLogs", "an AnyValue": for errors. */
static const char *an(const char *name)
{
    return strchr("AEIOU", name[0]) ? "an" : "a";
}

/* check_message's group for a message, which ends at its end (field numbers
 * are below 2^29). */
#define NO_GROUP UINT32_MAX

/* Checks the fields of a message of type m in [p, end) as upb parses them;
 * depth: the levels of messages and groups still allowed below it.  group:
 * the field number whose end-group tag closes it, or NO_GROUP.  (Inside an
 * unknown group upb skips fields without looking at their numbers: 0 passes
 * there.)  Returns the byte after it, or NULL after fail(). */
static const uint8_t *check_message(wire *w, int m, const uint8_t *p, const uint8_t *end,
                                    int depth, uint32_t group)
{
    const char *name = MSGS[m].name;
    while (p < end) {
        const uint8_t *at = p;
        uint64_t tag;
        if (!(p = read_varint(p, end, &tag)) || p - at > 5 || tag > UINT32_MAX) {
            pb_fail(w, at, "%s %s: a field's tag is cut short, longer than 5 bytes or above 2^32",
                 an(name), name);
            return NULL;
        }
        uint32_t num = (uint32_t)(tag >> 3), wt = (uint32_t)(tag & 7);
        if (wt == WT_END) {
            if (num == group)
                return p;
            pb_fail(w, at, "%s %s: an end-group tag of field %u with no such group open", an(name), name, num);
            return NULL;
        }
        if (num == 0 && group == NO_GROUP) {
            pb_fail(w, at, "%s %s: a field numbered 0", an(name), name);
            return NULL;
        }
        const field_def *f = field_of(m, num);
        int known = wire_matches(f->kind, wt);
        uint64_t n;
        switch (wt) {
        case WT_VARINT:
            if (!(p = read_varint(p, end, &n))) {
                pb_fail(w, at, "field %u of %s %s: a varint cut short or longer than 10 bytes", num,
                     an(name), name);
                return NULL;
            }
            break;
        case WT_I64:
        case WT_I32:
            n = wt == WT_I64 ? 8 : 4;
            if ((uint64_t)(end - p) < n) {
                pb_fail(w, at, "field %u of %s %s: %u bytes needed, %zu left in its message", num,
                     an(name), name, (unsigned)n, (size_t)(end - p));
                return NULL;
            }
            p += n;
            break;
        case WT_LEN:
            if (!(p = read_varint(p, end, &n))) {
                pb_fail(w, at, "field %u of %s %s: its length is cut short", num, an(name), name);
                return NULL;
            }
            if (n >= INT32_MAX || n > (uint64_t)(end - p)) {
                pb_fail(w, at, "field %u of %s %s: length %llu runs past the end of its message", num,
                     an(name), name, (unsigned long long)n);
                return NULL;
            }
            if (known && f->kind == K_STRING) {
                const uint8_t *bad = utf8_invalid(p, n);
                if (bad) {
                    pb_fail(w, bad, "field %u of %s %s: the string is not valid UTF-8", num, an(name), name);
                    return NULL;
                }
            } else if (known && f->kind == K_MESSAGE) {
                if (depth == 0) {
                    pb_fail(w, at, "messages nest deeper than %d levels", WIRE_MAX_DEPTH);
                    return NULL;
                }
                if (!check_message(w, f->msg, p, p + n, depth - 1, NO_GROUP))
                    return NULL;
            } else if (known && f->kind == K_PACKED_I64 && n % 8) {
                pb_fail(w, at, "field %u of %s %s: %llu packed bytes are not a whole number of 8-byte values",
                     num, an(name), name, (unsigned long long)n);
                return NULL;
            } else if (known && f->kind == K_PACKED_VARINT) {
                for (const uint8_t *q = p; q < p + n;) {
                    uint64_t v;
                    if (!(q = read_varint(q, p + n, &v))) {
                        pb_fail(w, at, "field %u of %s %s: a packed varint runs past its field", num,
                             an(name), name);
                        return NULL;
                    }
                }
            }
            p += n;
            break;
        case WT_START: /* never a known field here: skipped, but it must be whole */
            if (depth == 0) {
                pb_fail(w, at, "messages nest deeper than %d levels", WIRE_MAX_DEPTH);
                return NULL;
            }
            if (!(p = check_message(w, M_UNKNOWN, p, end, depth - 1, num)))
                return NULL;
            break;
        default:
            pb_fail(w, at, "field %u of %s %s: wire type %u does not exist", num, an(name), name, wt);
            return NULL;
        }
    }
    if (group != NO_GROUP) {
        pb_fail(w, end, "a group of field %u is not closed before the end of its message", group);
        return NULL;
    }
    return p;
}

/* ---- pass 2: reading checked bytes ------------------------------------------ */



static inline uint32_t get_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The byte after the value of a field of wire type wt at p. */
static const uint8_t *skip_value(const uint8_t *p, uint32_t wt)
{
    uint64_t n;
    switch (wt) {
    case WT_VARINT:
        return get_varint(p, &n);
    case WT_I64:
        return p + 8;
    case WT_I32:
        return p + 4;
    case WT_LEN:
        p = get_varint(p, &n);
        return p + n;
    default: { /* WT_START: to the byte after its end-group tag */
        uint32_t open = 1;
        for (;;) {
            uint64_t tag;
            p = get_varint(p, &tag);
            uint32_t t = (uint32_t)(tag & 7);
            if (t == WT_END) {
                if (--open == 0)
                    return p;
            } else if (t == WT_START) {
                open++;
            } else {
                p = skip_value(p, t);
            }
        }
    }
    }
}




static void add_payload(wire *w, slot *s, const uint8_t *p, uint64_t len)
{
    if (s->n == 0) {
        s->at = p;
        s->v = len;
    } else {
        if (s->n == 1 || s->n == s->cap) {
            uint32_t cap = s->n == 1 ? 4 : 2 * s->cap;
            span *more = arena_spans(w, cap);
            if (!more)
                return;
            if (s->n == 1)
                more[0] = (span){s->at, s->at + s->v};
            else
                memcpy(more, s->more, s->n * sizeof *more);
            s->more = more;
            s->cap = cap;
        }
        s->more[s->n] = (span){p, p + len};
    }
    s->n++;
}

/* Reads every field of the message of type m in v into out. */
void pb_scan(wire *w, int m, view v, fields *out)
{
    out->present = 0;
    out->which = 0;
    for (uint32_t k = 0; k < v.n; k++) {
        const uint8_t *p = v.s[k].p, *end = v.s[k].end;
        while (p < end) {
            const uint8_t *at = p;
            uint64_t tag;
            p = get_varint(p, &tag);
            uint32_t num = (uint32_t)(tag >> 3), wt = (uint32_t)(tag & 7);
            const field_def *f = field_of(m, num);
            if (!wire_matches(f->kind, wt)) {
                p = skip_value(p, wt);
                continue;
            }
            slot *s = &out->f[num];
            if (!(out->present >> num & 1)) {
                out->present |= 1u << num;
                s->n = 0;
            }
            if (f->oneof && out->which != num) {
                out->which = num;
                s->n = 0;
            }
            if (f->repeated) {
                if (s->n++ == 0) {
                    s->at = at;
                    s->seg = k;
                }
                p = skip_value(p, wt);
                continue;
            }
            uint64_t len;
            switch (wt) {
            case WT_VARINT:
                p = get_varint(p, &s->v);
                s->n++;
                break;
            case WT_I64:
                s->v = get_u64(p);
                p += 8;
                s->n++;
                break;
            case WT_I32:
                s->v = get_u32(p);
                p += 4;
                s->n++;
                break;
            default: /* WT_LEN */
                p = get_varint(p, &len);
                if (f->kind == K_MESSAGE) {
                    add_payload(w, s, p, len);
                } else {
                    s->at = p;
                    s->v = len;
                    s->n++;
                }
                p += len;
            }
        }
    }
}





iter pb_iter(view v, const fields *f, int m, uint32_t num)
{
    const slot *s = get(f, num);
    return (iter){v, s->seg, s->n ? s->at : NULL, num, field_of(m, num)->kind, s->n, NULL};
}

/* The next occurrence: 1 with its wire type and payload (WT_LEN) or value
 * bytes, or 0 at the end. */
int pb_next(iter *it, uint32_t *wt, span *out)
{
    while (it->left) {
        const uint8_t *end = it->v.s[it->k].end;
        if (it->p >= end) {
            it->p = it->v.s[++it->k].p;
            continue;
        }
        uint64_t tag;
        it->at = it->p;
        const uint8_t *p = get_varint(it->p, &tag);
        uint32_t num = (uint32_t)(tag >> 3), t = (uint32_t)(tag & 7);
        it->p = skip_value(p, t);
        if (num != it->num || !wire_matches((int)it->kind, t))
            continue;
        it->left--;
        *wt = t;
        if (t == WT_LEN) {
            uint64_t len;
            p = get_varint(p, &len);
        }
        *out = (span){p, it->p};
        return 1;
    }
    return 0;
}


int pb_check(wire *w, int m, const uint8_t *body, size_t len)
{
    return check_message(w, m, body, body + len, WIRE_MAX_DEPTH, NO_GROUP) ? 0 : COMET_E_BAD_OTLP;
}

void pb_free(wire *w)
{
    while (w->blocks) {
        block *b = w->blocks;
        w->blocks = b->next;
        free(b);
    }
}
