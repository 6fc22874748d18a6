/*
 * otlp.c - OTLP/HTTP export requests (protobuf) into JSON events: one event
 * per log record, span or metric data point, each carrying its resource and
 * scope (comet.h: comet_otlp_decode).  The layout, and what refuses a whole
 * request or one record, is specified by tests/support/otlp.py, which does
 * the same on the official protobuf library (upb); a differential fuzz test
 * (tests/test_otlp_decode.py) holds the two to the same answer for any body.
 *
 * Two passes over the body:
 *   1. check_message walks every byte as upb's decoder does and refuses what
 *      upb refuses: tags of more than 5 bytes or above 2^32, field number 0,
 *      wire types 6 and 7, varints of more than 10 bytes, lengths past the
 *      end of their message, unmatched groups, more than 100 levels of
 *      messages and groups, invalid UTF-8 in a known string field, packed
 *      fixed64 lengths that are not a multiple of 8.  A known field sent with
 *      another wire type is an unknown field (skipped), except that repeated
 *      numbers come packed or not.  Nothing is written in this pass: upb
 *      refuses before any event exists.
 *   2. The walk writes the events from the checked bytes (no bounds checks
 *      left to do).  A message is scanned once (scan) into one slot per field
 *      number: the last value of a scalar, the last payload of a string, the
 *      first position and count of a repeated field, and every payload of a
 *      singular message field: protobuf merges the occurrences of such a
 *      field, which is the same as parsing their payloads one after another,
 *      so a message is a view over one or more spans of the body.  A oneof
 *      keeps its last member; a message member seen again merges unless
 *      another member came in between.  How fields are ordered in the wire
 *      does not matter: the event's keys are written in the layout's order.
 *
 * Trade-offs:
 *   - Two passes read the bytes twice, but keep pass 2 free of error paths
 *     other than the layout's own (nesting, *_strindex, ids), and make the
 *     "refused exactly when upb refuses" rule one function's job.
 *   - The resource, the scope and a metric's description are written once
 *     per group into a buffer of their own (a fragment) and copied into each
 *     of its events; they are written when the group's first record is, so a
 *     group without records is never looked at beyond pass 1, as in the
 *     reference.
 *   - Within a record, keys are written in the reference's order, which is
 *     also the order in which it evaluates what can refuse the request or
 *     reject the record: the first problem met is the reference's.
 *   - A rejected record (bad id length, event above max_event_bytes) is
 *     written and then rolled back: rejection is rare.  Writing an event
 *     stops at max_event_bytes (its buffers drop what would pass it), but
 *     the walk goes on: a refusal later in the record still refuses the
 *     request.  The JSON pointers of value_types are held, before they are
 *     sorted and deduplicated, within the same limit: a record with
 *     repeated keys (which OTLP forbids) whose pointers add up to more is
 *     rejected even when the deduplicated event would fit.
 *   - Recursion: pass 1 is bounded by upb's 100 levels, pass 2 by
 *     COMET_OTLP_MAX_DEPTH (a value's arrays and maps) over a fixed depth of
 *     messages.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "internal.h"
#include "sys.h"

/* upb's default limit on nested messages and groups below the request. */
#define WIRE_MAX_DEPTH 100

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_START = 3, WT_END = 4, WT_I32 = 5 };

/* ---- the schema: the messages an export request holds ---------------------- */

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

typedef struct field_def {
    uint8_t kind;
    uint8_t msg;      /* K_MESSAGE: its type */
    uint8_t repeated;
    uint8_t oneof;    /* a member of the message's (one) oneof */
} field_def;

#define MAX_FIELD 16

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

/* ---- the decoder's state ---------------------------------------------------- */

typedef struct span {
    const uint8_t *p, *end;
} span;

/* A message: the payloads of its occurrences, parsed one after another. */
typedef struct view {
    const span *s;
    uint32_t n;
} view;

/* Arena for the span lists of merged messages, freed with the decoder. */
typedef struct block {
    struct block *next;
    size_t used, cap;
    span data[];
} block;

/* A part of every event of a group, written once (the resource, the scope,
 * a metric's description) with its value_types. */
typedef struct fragment {
    ojbuf json;
    ojtypes types;
    int ready;
} fragment;

typedef struct dec {
    const uint8_t *body;
    int32_t signal;
    uint32_t max_event;
    comet_otlp_result *res;
    int failed;             /* an allocation failed (besides the buffers' own marks) */
    block *blocks;
    /* the writer: where the JSON and value_types go now, the pointer to here */
    ojbuf *o;
    ojtypes *t;
    ojpath path;
    ojbuf events;
    ojtypes types;          /* the current event's own */
    fragment resource, scope, metric;
    uint64_t record;        /* index of the current record in the request */
    char why[160];          /* why the current record is rejected */
} dec;

/* Results of the walk's functions besides 0 and the negative COMET_E_* codes:
 * the record is rejected (d->why says why), the others go on. */
#define REJECT 1

static int fail(dec *d, const uint8_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), cold, noinline));

/* The request is refused: where and why, in the result and the thread's error. */
static int fail(dec *d, const uint8_t *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->res->reason, sizeof d->res->reason, fmt, ap);
    va_end(ap);
    d->res->error_offset = (uint64_t)(at - d->body);
    return set_error(COMET_E_BAD_OTLP, "invalid OTLP request at byte %llu: %s",
                     (unsigned long long)d->res->error_offset, d->res->reason);
}

static span *arena_spans(dec *d, size_t n)
{
    block *b = d->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 1024 ? n : 1024;
        b = sys_malloc(sizeof *b + cap * sizeof(span));
        if (!b) {
            d->failed = 1;
            return NULL;
        }
        b->next = d->blocks;
        b->used = 0;
        b->cap = cap;
        d->blocks = b;
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

/* The first byte of s[0, n) that is not valid UTF-8 (Unicode's table 3-7:
 * no overlong forms, no surrogates, nothing above U+10FFFF), or NULL. */
static const uint8_t *utf8_invalid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        uint8_t lo = 0x80, hi = 0xBF;
        size_t need;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            return s + i;
        }
        if (n - i <= need || s[i + 1] < lo || s[i + 1] > hi)
            return s + i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return s + i;
        i += need + 1;
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
static const uint8_t *check_message(dec *d, int m, const uint8_t *p, const uint8_t *end,
                                    int depth, uint32_t group)
{
    const char *name = MSGS[m].name;
    while (p < end) {
        const uint8_t *at = p;
        uint64_t tag;
        if (!(p = read_varint(p, end, &tag)) || p - at > 5 || tag > UINT32_MAX) {
            fail(d, at, "%s %s: a field's tag is cut short, longer than 5 bytes or above 2^32",
                 an(name), name);
            return NULL;
        }
        uint32_t num = (uint32_t)(tag >> 3), wt = (uint32_t)(tag & 7);
        if (wt == WT_END) {
            if (num == group)
                return p;
            fail(d, at, "%s %s: an end-group tag of field %u with no such group open", an(name), name, num);
            return NULL;
        }
        if (num == 0 && group == NO_GROUP) {
            fail(d, at, "%s %s: a field numbered 0", an(name), name);
            return NULL;
        }
        const field_def *f = field_of(m, num);
        int known = wire_matches(f->kind, wt);
        uint64_t n;
        switch (wt) {
        case WT_VARINT:
            if (!(p = read_varint(p, end, &n))) {
                fail(d, at, "field %u of %s %s: a varint cut short or longer than 10 bytes", num,
                     an(name), name);
                return NULL;
            }
            break;
        case WT_I64:
        case WT_I32:
            n = wt == WT_I64 ? 8 : 4;
            if ((uint64_t)(end - p) < n) {
                fail(d, at, "field %u of %s %s: %u bytes needed, %zu left in its message", num,
                     an(name), name, (unsigned)n, (size_t)(end - p));
                return NULL;
            }
            p += n;
            break;
        case WT_LEN:
            if (!(p = read_varint(p, end, &n))) {
                fail(d, at, "field %u of %s %s: its length is cut short", num, an(name), name);
                return NULL;
            }
            if (n >= INT32_MAX || n > (uint64_t)(end - p)) {
                fail(d, at, "field %u of %s %s: length %llu runs past the end of its message", num,
                     an(name), name, (unsigned long long)n);
                return NULL;
            }
            if (known && f->kind == K_STRING) {
                const uint8_t *bad = utf8_invalid(p, n);
                if (bad) {
                    fail(d, bad, "field %u of %s %s: the string is not valid UTF-8", num, an(name), name);
                    return NULL;
                }
            } else if (known && f->kind == K_MESSAGE) {
                if (depth == 0) {
                    fail(d, at, "messages nest deeper than %d levels", WIRE_MAX_DEPTH);
                    return NULL;
                }
                if (!check_message(d, f->msg, p, p + n, depth - 1, NO_GROUP))
                    return NULL;
            } else if (known && f->kind == K_PACKED_I64 && n % 8) {
                fail(d, at, "field %u of %s %s: %llu packed bytes are not a whole number of 8-byte values",
                     num, an(name), name, (unsigned long long)n);
                return NULL;
            } else if (known && f->kind == K_PACKED_VARINT) {
                for (const uint8_t *q = p; q < p + n;) {
                    uint64_t v;
                    if (!(q = read_varint(q, p + n, &v))) {
                        fail(d, at, "field %u of %s %s: a packed varint runs past its field", num,
                             an(name), name);
                        return NULL;
                    }
                }
            }
            p += n;
            break;
        case WT_START: /* never a known field here: skipped, but it must be whole */
            if (depth == 0) {
                fail(d, at, "messages nest deeper than %d levels", WIRE_MAX_DEPTH);
                return NULL;
            }
            if (!(p = check_message(d, M_UNKNOWN, p, end, depth - 1, num)))
                return NULL;
            break;
        default:
            fail(d, at, "field %u of %s %s: wire type %u does not exist", num, an(name), name, wt);
            return NULL;
        }
    }
    if (group != NO_GROUP) {
        fail(d, end, "a group of field %u is not closed before the end of its message", group);
        return NULL;
    }
    return p;
}

/* ---- pass 2: reading checked bytes ------------------------------------------ */

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

/* What scan keeps of one field number of a message. */
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

/* The slot of field num, empty when the field was not seen. */
static inline const slot *get(const fields *f, uint32_t num)
{
    static const slot none;
    return f->present >> num & 1 ? &f->f[num] : &none;
}

static void add_payload(dec *d, slot *s, const uint8_t *p, uint64_t len)
{
    if (s->n == 0) {
        s->at = p;
        s->v = len;
    } else {
        if (s->n == 1 || s->n == s->cap) {
            uint32_t cap = s->n == 1 ? 4 : 2 * s->cap;
            span *more = arena_spans(d, cap);
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
static void scan(dec *d, int m, view v, fields *out)
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
                    add_payload(d, s, p, len);
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

/* The occurrences of a repeated field, in order. */
typedef struct iter {
    view v;
    uint32_t k;       /* span */
    const uint8_t *p;
    uint32_t num, kind, left;
    const uint8_t *at; /* the tag of the occurrence returned last */
} iter;

static iter iter_of(view v, const fields *f, int m, uint32_t num)
{
    const slot *s = get(f, num);
    return (iter){v, s->seg, s->n ? s->at : NULL, num, field_of(m, num)->kind, s->n, NULL};
}

/* The next occurrence: 1 with its wire type and payload (WT_LEN) or value
 * bytes, or 0 at the end. */
static int iter_next(iter *it, uint32_t *wt, span *out)
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

/* ---- pass 2: writing --------------------------------------------------------- */

static inline void path_push(dec *d, const uint8_t *name, size_t len, uint32_t index)
{
    d->path.t[d->path.n++] = (ojtoken){name, (uint32_t)len, index};
}

static inline void path_name(dec *d, const char *name)
{
    path_push(d, (const uint8_t *)name, strlen(name), 0);
}

static void write_string_field(dec *d, const fields *f, uint32_t num)
{
    const slot *s = get(f, num);
    if (s->n)
        oj_string(d->o, s->at, s->v);
    else
        oj_lit(d->o, "\"\"");
}

static int write_attributes(dec *d, view msg, const fields *f, int m, uint32_t num, int depth);

/* An AnyValue (v: its occurrences, none when unset) at depth arrays and maps
 * below its attribute; at: where it sits, for an error. */
static int write_any(dec *d, view v, int depth, const uint8_t *at)
{
    if (depth > COMET_OTLP_MAX_DEPTH)
        return fail(d, at, "an attribute value or a body nests deeper than %d levels",
                    COMET_OTLP_MAX_DEPTH);
    fields f;
    scan(d, M_ANY_VALUE, v, &f);
    const slot *s = get(&f, f.which);
    ojbuf *o = d->o;
    span one;
    switch (f.which) {
    case 0:
        oj_lit(o, "null");
        return 0;
    case 1:
        oj_string(o, s->at, s->v);
        return 0;
    case 2:
        oj_lit(o, s->v ? "true" : "false");
        return 0;
    case 3:
        oj_i64(o, (int64_t)s->v);
        return 0;
    case 4: {
        double x;
        memcpy(&x, &s->v, 8);
        if (!isfinite(x))
            ojtypes_add(d->t, &d->path, OJ_DOUBLE);
        oj_double(o, x);
        return 0;
    }
    case 5: {
        view av = message_view(s, &one);
        fields a;
        scan(d, M_ARRAY_VALUE, av, &a);
        iter it = iter_of(av, &a, M_ARRAY_VALUE, 1);
        uint32_t wt, i = 0;
        span elem;
        oj_byte(o, '[');
        while (iter_next(&it, &wt, &elem)) {
            if (i)
                oj_byte(d->o, ',');
            path_push(d, NULL, 0, i++);
            int rc = write_any(d, one_view(&elem), depth + 1, it.at);
            d->path.n--;
            if (rc)
                return rc;
        }
        oj_byte(d->o, ']');
        return 0;
    }
    case 6: {
        view kv = message_view(s, &one);
        fields k;
        scan(d, M_KVLIST, kv, &k);
        return write_attributes(d, kv, &k, M_KVLIST, 1, depth + 1);
    }
    case 7:
        ojtypes_add(d->t, &d->path, OJ_BYTES);
        oj_base64(o, s->at, s->v);
        return 0;
    default:
        return fail(d, at, "string_value_strindex refers to a dictionary only profiles have");
    }
}

/* The KeyValues of field num of message msg (scanned into f, of type m) as a
 * JSON object; a repeated key is written as sent (JSON readers keep the last). */
static int write_attributes(dec *d, view msg, const fields *f, int m, uint32_t num, int depth)
{
    iter it = iter_of(msg, f, m, num);
    uint32_t wt, i = 0;
    span kv;
    oj_byte(d->o, '{');
    while (iter_next(&it, &wt, &kv)) {
        fields k;
        scan(d, M_KEY_VALUE, one_view(&kv), &k);
        if ((int32_t)num_of(&k, 3) != 0)
            return fail(d, it.at, "key_strindex refers to a dictionary only profiles have");
        if (i++)
            oj_byte(d->o, ',');
        write_string_field(d, &k, 1);
        oj_byte(d->o, ':');
        if (get(&k, 1)->n)
            path_push(d, get(&k, 1)->at, get(&k, 1)->v, 0);
        else
            path_name(d, "");
        span one;
        int rc = write_any(d, message_view(get(&k, 2), &one), depth, it.at);
        d->path.n--;
        if (rc)
            return rc;
    }
    oj_byte(d->o, '}');
    return 0;
}

/* An attributes object at the pointer given by names (then the keys). */
static int write_attributes_at(dec *d, view msg, const fields *f, int m, uint32_t num,
                               const char *name)
{
    uint32_t n = d->path.n;
    path_name(d, name);
    int rc = write_attributes(d, msg, f, m, num, 0);
    d->path.n = n;
    return rc;
}

/* The attributes of item i of a list of the event: /list/i/name/... */
static int write_item_attributes(dec *d, const char *list, uint32_t i, view msg, const fields *f,
                                 int m, uint32_t num, const char *name)
{
    path_name(d, list);
    path_push(d, NULL, 0, i);
    int rc = write_attributes_at(d, msg, f, m, num, name);
    d->path.n -= 2;
    return rc;
}

/* ',"name":n' for a uint32 count that is not zero. */
static void write_dropped(dec *d, const fields *f, uint32_t num, const char *key)
{
    uint32_t n = (uint32_t)num_of(f, num);
    if (n) {
        oj_lit(d->o, key);
        oj_u64(d->o, n);
    }
}

/* An id: lowercase hex; REJECT unless its length is 0 or size. */
static int write_id(dec *d, const fields *f, uint32_t num, size_t size, const char *what)
{
    const slot *s = get(f, num);
    size_t len = s->n ? s->v : 0;
    if (len != 0 && len != size) {
        snprintf(d->why, sizeof d->why, "%s has %zu bytes, not %zu", what, len, size);
        return REJECT;
    }
    oj_hex(d->o, s->n ? s->at : NULL, len);
    return 0;
}

static inline int32_t int32_of(uint64_t v)
{
    return (int32_t)(uint32_t)v;
}

static inline int32_t sint32_of(uint64_t v)
{
    uint32_t n = (uint32_t)v;
    return (int32_t)((n >> 1) ^ (0u - (n & 1)));
}

static inline double double_of(uint64_t bits)
{
    double x;
    memcpy(&x, &bits, 8);
    return x;
}

/* ---- fragments: resource, scope, a metric's description --------------------- */

static void fragment_begin(dec *d, fragment *fr, const char *name)
{
    fr->json.len = 0;
    ojbuf_limit(&fr->json, d->max_event);
    ojtypes_clear(&fr->types);
    ojbuf_limit(&fr->types.chars, d->max_event);
    d->o = &fr->json;
    d->t = &fr->types;
    d->path.n = 0;
    path_name(d, name);
}

static int fragment_end(dec *d, fragment *fr, int rc)
{
    d->o = &d->events;
    d->t = &d->types;
    d->path.n = 0;
    fr->ready = rc == 0;
    return rc;
}

/* group: a ResourceLogs, ResourceSpans or ResourceMetrics (type m). */
static int write_resource(dec *d, const fields *group)
{
    fragment_begin(d, &d->resource, "resource");
    span one;
    view rv = message_view(get(group, 1), &one);
    fields r;
    scan(d, M_RESOURCE, rv, &r);
    oj_lit(d->o, "{\"attributes\":");
    int rc = write_attributes_at(d, rv, &r, M_RESOURCE, 1, "attributes");
    if (rc)
        return fragment_end(d, &d->resource, rc);
    write_dropped(d, &r, 2, ",\"dropped_attributes_count\":");
    if (get(&r, 3)->n) {
        iter it = iter_of(rv, &r, M_RESOURCE, 3);
        uint32_t wt, i = 0;
        span ref;
        oj_lit(d->o, ",\"entity_refs\":[");
        while (iter_next(&it, &wt, &ref)) {
            fields e;
            scan(d, M_ENTITY_REF, one_view(&ref), &e);
            oj_lit(d->o, i++ ? ",{\"schema_url\":" : "{\"schema_url\":");
            write_string_field(d, &e, 1);
            oj_lit(d->o, ",\"type\":");
            write_string_field(d, &e, 2);
            for (uint32_t num = 3; num <= 4; num++) {
                oj_lit(d->o, num == 3 ? ",\"id_keys\":[" : "],\"description_keys\":[");
                iter keys = iter_of(one_view(&ref), &e, M_ENTITY_REF, num);
                span key;
                for (uint32_t j = 0; iter_next(&keys, &wt, &key); j++) {
                    if (j)
                        oj_byte(d->o, ',');
                    oj_string(d->o, key.p, (size_t)(key.end - key.p));
                }
            }
            oj_lit(d->o, "]}");
        }
        oj_byte(d->o, ']');
    }
    if (get(group, 3)->n && get(group, 3)->v) {
        oj_lit(d->o, ",\"schema_url\":");
        write_string_field(d, group, 3);
    }
    oj_byte(d->o, '}');
    return fragment_end(d, &d->resource, 0);
}

/* group: a ScopeLogs, ScopeSpans or ScopeMetrics. */
static int write_scope(dec *d, const fields *group)
{
    fragment_begin(d, &d->scope, "scope");
    span one;
    view sv = message_view(get(group, 1), &one);
    fields s;
    scan(d, M_SCOPE, sv, &s);
    oj_lit(d->o, "{\"name\":");
    write_string_field(d, &s, 1);
    oj_lit(d->o, ",\"version\":");
    write_string_field(d, &s, 2);
    oj_lit(d->o, ",\"attributes\":");
    int rc = write_attributes_at(d, sv, &s, M_SCOPE, 3, "attributes");
    if (rc)
        return fragment_end(d, &d->scope, rc);
    write_dropped(d, &s, 4, ",\"dropped_attributes_count\":");
    if (get(group, 3)->n && get(group, 3)->v) {
        oj_lit(d->o, ",\"schema_url\":");
        write_string_field(d, group, 3);
    }
    oj_byte(d->o, '}');
    return fragment_end(d, &d->scope, 0);
}

/* ---- events ------------------------------------------------------------------ */

/* The start of an event: its resource and scope (written first for the
 * group's first record), then the event's own keys.  Returns where the event
 * starts in d->events, or a negative code. */
static int64_t begin_event(dec *d, const fields *resource_group, const fields *scope_group)
{
    int rc;
    if (!d->resource.ready && (rc = write_resource(d, resource_group)))
        return rc;
    if (!d->scope.ready && (rc = write_scope(d, scope_group)))
        return rc;
    ojtypes_clear(&d->types);
    ojbuf_limit(&d->types.chars, d->max_event);
    d->path.n = 0;
    size_t start = d->events.len;
    ojbuf_limit(&d->events, d->max_event ? start + d->max_event + 1 : 0);
    oj_lit(d->o, "{\"resource\":");
    oj_put(d->o, d->resource.json.p, d->resource.json.len);
    oj_lit(d->o, ",\"scope\":");
    oj_put(d->o, d->scope.json.p, d->scope.json.len);
    return (int64_t)start;
}

/* Whether an allocation failed: the writes since are incomplete. */
static int failed(const dec *d)
{
    return d->failed || d->events.failed || d->resource.json.failed || d->scope.json.failed ||
           d->metric.json.failed;
}

/* Whether the event, or a part of it, passed max_event_bytes while written. */
static int over(const dec *d)
{
    const fragment *frags[] = {&d->resource, &d->scope, &d->metric};
    for (int i = 0; i < 3; i++)
        if (frags[i]->json.over || frags[i]->types.chars.over)
            return 1;
    return d->events.over || d->types.chars.over;
}

static void reject(dec *d, size_t start, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reject(dec *d, size_t start, const char *what, const char *fmt, ...)
{
    d->events.len = start;
    if (d->res->rejected++ == 0) {
        char why[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        snprintf(d->res->reason, sizeof d->res->reason, "%s %llu: %s", what,
                 (unsigned long long)d->record, why);
    }
}

/* Ends the event begun at start: value_types, the size limit, the line.
 * rc: what writing it returned (REJECT: d->why says why). */
static int end_event(dec *d, size_t start, const char *what, int rc)
{
    if (rc == REJECT)
        reject(d, start, what, "%s", d->why);
    if (rc)
        return rc < 0 ? rc : 0;
    const ojtypes *lists[] = {&d->types, &d->resource.types, &d->scope.types, &d->metric.types};
    oj_value_types(d->o, lists, d->signal == COMET_OTLP_METRICS ? 4 : 3);
    oj_byte(d->o, '}');
    if (failed(d))
        return set_error(COMET_E_NOMEM, "out of memory writing the events of an OTLP request");
    if (over(d)) {
        reject(d, start, what, "its event is longer than the limit of %u bytes", d->max_event);
        return 0;
    }
    size_t size = d->events.len - start;
    if (d->max_event && size > d->max_event) {
        reject(d, start, what, "its event is %zu bytes, above the limit of %u", size,
               d->max_event);
        return 0;
    }
    oj_byte(d->o, '\n');
    d->res->count++;
    return 0;
}

/* ---- logs -------------------------------------------------------------------- */

static int log_fields(dec *d, span rec)
{
    fields r;
    view rv = one_view(&rec);
    scan(d, M_LOG_RECORD, rv, &r);
    ojbuf *o = d->o;
    oj_lit(o, ",\"time_unix_nano\":");
    oj_u64(o, num_of(&r, 1));
    oj_lit(o, ",\"observed_time_unix_nano\":");
    oj_u64(o, num_of(&r, 11));
    oj_lit(o, ",\"severity_number\":");
    oj_i64(o, int32_of(num_of(&r, 2)));
    oj_lit(o, ",\"severity_text\":");
    write_string_field(d, &r, 3);
    oj_lit(o, ",\"body\":");
    int rc;
    if (get(&r, 5)->n) {
        span one;
        path_name(d, "body");
        rc = write_any(d, message_view(get(&r, 5), &one), 0, get(&r, 5)->at);
        d->path.n--;
        if (rc)
            return rc;
    } else {
        oj_lit(o, "null");
    }
    oj_lit(o, ",\"attributes\":");
    if ((rc = write_attributes_at(d, rv, &r, M_LOG_RECORD, 6, "attributes")))
        return rc;
    write_dropped(d, &r, 7, ",\"dropped_attributes_count\":");
    oj_lit(o, ",\"flags\":");
    oj_u64(o, (uint32_t)num_of(&r, 8));
    oj_lit(o, ",\"trace_id\":");
    if ((rc = write_id(d, &r, 9, 16, "trace_id")))
        return rc;
    oj_lit(o, ",\"span_id\":");
    if ((rc = write_id(d, &r, 10, 8, "span_id")))
        return rc;
    oj_lit(o, ",\"event_name\":");
    write_string_field(d, &r, 12);
    return 0;
}

/* ---- traces ------------------------------------------------------------------ */

static int span_events(dec *d, view sv, const fields *s)
{
    iter it = iter_of(sv, s, M_SPAN, 11);
    uint32_t wt, i = 0;
    span ev;
    oj_lit(d->o, ",\"events\":[");
    while (iter_next(&it, &wt, &ev)) {
        fields e;
        scan(d, M_SPAN_EVENT, one_view(&ev), &e);
        oj_lit(d->o, i ? ",{\"time_unix_nano\":" : "{\"time_unix_nano\":");
        oj_u64(d->o, num_of(&e, 1));
        oj_lit(d->o, ",\"name\":");
        write_string_field(d, &e, 2);
        oj_lit(d->o, ",\"attributes\":");
        int rc = write_item_attributes(d, "events", i++, one_view(&ev), &e, M_SPAN_EVENT, 3,
                                       "attributes");
        if (rc)
            return rc;
        write_dropped(d, &e, 4, ",\"dropped_attributes_count\":");
        oj_byte(d->o, '}');
    }
    oj_byte(d->o, ']');
    return 0;
}

static int span_links(dec *d, view sv, const fields *s)
{
    iter it = iter_of(sv, s, M_SPAN, 13);
    uint32_t wt, i = 0;
    span ln;
    oj_lit(d->o, ",\"links\":[");
    while (iter_next(&it, &wt, &ln)) {
        fields l;
        scan(d, M_SPAN_LINK, one_view(&ln), &l);
        int rc;
        oj_lit(d->o, i ? ",{\"trace_id\":" : "{\"trace_id\":");
        if ((rc = write_id(d, &l, 1, 16, "a link's trace_id")))
            return rc;
        oj_lit(d->o, ",\"span_id\":");
        if ((rc = write_id(d, &l, 2, 8, "a link's span_id")))
            return rc;
        oj_lit(d->o, ",\"trace_state\":");
        write_string_field(d, &l, 3);
        oj_lit(d->o, ",\"attributes\":");
        rc = write_item_attributes(d, "links", i++, one_view(&ln), &l, M_SPAN_LINK, 4, "attributes");
        if (rc)
            return rc;
        write_dropped(d, &l, 5, ",\"dropped_attributes_count\":");
        oj_lit(d->o, ",\"flags\":");
        oj_u64(d->o, (uint32_t)num_of(&l, 6));
        oj_byte(d->o, '}');
    }
    oj_byte(d->o, ']');
    return 0;
}

static int span_fields(dec *d, span rec)
{
    fields s;
    view sv = one_view(&rec);
    scan(d, M_SPAN, sv, &s);
    ojbuf *o = d->o;
    int rc;
    oj_lit(o, ",\"trace_id\":");
    if ((rc = write_id(d, &s, 1, 16, "trace_id")))
        return rc;
    oj_lit(o, ",\"span_id\":");
    if ((rc = write_id(d, &s, 2, 8, "span_id")))
        return rc;
    oj_lit(o, ",\"trace_state\":");
    write_string_field(d, &s, 3);
    oj_lit(o, ",\"parent_span_id\":");
    if ((rc = write_id(d, &s, 4, 8, "parent_span_id")))
        return rc;
    oj_lit(o, ",\"flags\":");
    oj_u64(o, (uint32_t)num_of(&s, 16));
    oj_lit(o, ",\"name\":");
    write_string_field(d, &s, 5);
    oj_lit(o, ",\"kind\":");
    oj_i64(o, int32_of(num_of(&s, 6)));
    oj_lit(o, ",\"start_time_unix_nano\":");
    oj_u64(o, num_of(&s, 7));
    oj_lit(o, ",\"end_time_unix_nano\":");
    oj_u64(o, num_of(&s, 8));
    oj_lit(o, ",\"attributes\":");
    if ((rc = write_attributes_at(d, sv, &s, M_SPAN, 9, "attributes")))
        return rc;
    write_dropped(d, &s, 10, ",\"dropped_attributes_count\":");
    if ((rc = span_events(d, sv, &s)))
        return rc;
    write_dropped(d, &s, 12, ",\"dropped_events_count\":");
    if ((rc = span_links(d, sv, &s)))
        return rc;
    write_dropped(d, &s, 14, ",\"dropped_links_count\":");
    span one;
    fields st;
    scan(d, M_STATUS, message_view(get(&s, 15), &one), &st);
    oj_lit(o, ",\"status\":{\"code\":");
    oj_i64(o, int32_of(num_of(&st, 3)));
    oj_lit(o, ",\"message\":");
    write_string_field(d, &st, 2);
    oj_byte(o, '}');
    return 0;
}

/* ---- metrics ----------------------------------------------------------------- */

static const char *const METRIC_TYPES[MAX_FIELD + 1] = {
    [5] = "gauge", [7] = "sum", [9] = "histogram", [10] = "exponential_histogram",
    [11] = "summary",
};

static const int METRIC_DATA[MAX_FIELD + 1] = {
    [5] = M_GAUGE, [7] = M_SUM, [9] = M_HISTOGRAM, [10] = M_EXP_HISTOGRAM, [11] = M_SUMMARY,
};

/* '"metric":{...}' of a metric (m) whose data (of its type) is data. */
static int write_metric(dec *d, view mv, const fields *m, const fields *data)
{
    fragment_begin(d, &d->metric, "metric");
    oj_lit(d->o, "{\"name\":");
    write_string_field(d, m, 1);
    oj_lit(d->o, ",\"description\":");
    write_string_field(d, m, 2);
    oj_lit(d->o, ",\"unit\":");
    write_string_field(d, m, 3);
    oj_lit(d->o, ",\"type\":\"");
    oj_lit(d->o, METRIC_TYPES[m->which]);
    oj_byte(d->o, '"');
    if (m->which == 7 || m->which == 9 || m->which == 10) {
        oj_lit(d->o, ",\"aggregation_temporality\":");
        oj_i64(d->o, int32_of(num_of(data, 2)));
    }
    if (m->which == 7)
        oj_lit(d->o, num_of(data, 3) ? ",\"is_monotonic\":true" : ",\"is_monotonic\":false");
    if (get(m, 12)->n) {
        oj_lit(d->o, ",\"metadata\":");
        int rc = write_attributes_at(d, mv, m, M_METRIC, 12, "metadata");
        if (rc)
            return fragment_end(d, &d->metric, rc);
    }
    oj_byte(d->o, '}');
    return fragment_end(d, &d->metric, 0);
}

/* number(): as_int, as_double or null, from a point or an exemplar. */
static void write_number(dec *d, const fields *f, uint32_t as_double, uint32_t as_int)
{
    if (f->which == as_int)
        oj_i64(d->o, (int64_t)get(f, as_int)->v);
    else if (f->which == as_double)
        oj_double(d->o, double_of(get(f, as_double)->v));
    else
        oj_lit(d->o, "null");
}

static void write_optional_double(dec *d, const fields *f, uint32_t num)
{
    if (get(f, num)->n)
        oj_double(d->o, double_of(get(f, num)->v));
    else
        oj_lit(d->o, "null");
}

/* A repeated number field (packed or not) as a JSON array. */
static void write_numbers(dec *d, view v, const fields *f, int m, uint32_t num, int doubles)
{
    iter it = iter_of(v, f, m, num);
    uint32_t wt, i = 0;
    span x;
    oj_byte(d->o, '[');
    while (iter_next(&it, &wt, &x)) {
        for (const uint8_t *p = x.p; p < x.end;) {
            uint64_t n;
            if (it.kind == K_PACKED_VARINT) {
                p = get_varint(p, &n);
            } else {
                n = get_u64(p);
                p += 8;
            }
            if (i++)
                oj_byte(d->o, ',');
            if (doubles)
                oj_double(d->o, double_of(n));
            else
                oj_u64(d->o, n);
        }
    }
    oj_byte(d->o, ']');
}

static int write_exemplars(dec *d, view pv, const fields *p, int m, uint32_t num)
{
    iter it = iter_of(pv, p, m, num);
    uint32_t wt, i = 0;
    span ex;
    oj_lit(d->o, ",\"exemplars\":[");
    while (iter_next(&it, &wt, &ex)) {
        fields e;
        scan(d, M_EXEMPLAR, one_view(&ex), &e);
        oj_lit(d->o, i ? ",{\"filtered_attributes\":" : "{\"filtered_attributes\":");
        int rc = write_item_attributes(d, "exemplars", i++, one_view(&ex), &e, M_EXEMPLAR, 7,
                                       "filtered_attributes");
        if (rc)
            return rc;
        oj_lit(d->o, ",\"time_unix_nano\":");
        oj_u64(d->o, num_of(&e, 2));
        oj_lit(d->o, ",\"value\":");
        write_number(d, &e, 3, 6);
        oj_lit(d->o, ",\"span_id\":");
        if ((rc = write_id(d, &e, 4, 8, "an exemplar's span_id")))
            return rc;
        oj_lit(d->o, ",\"trace_id\":");
        if ((rc = write_id(d, &e, 5, 16, "an exemplar's trace_id")))
            return rc;
        oj_byte(d->o, '}');
    }
    oj_byte(d->o, ']');
    return 0;
}

static void write_buckets(dec *d, const fields *p, uint32_t num)
{
    span one;
    view bv = message_view(get(p, num), &one);
    fields b;
    scan(d, M_BUCKETS, bv, &b);
    oj_lit(d->o, "{\"offset\":");
    oj_i64(d->o, sint32_of(num_of(&b, 1)));
    oj_lit(d->o, ",\"bucket_counts\":");
    write_numbers(d, bv, &b, M_BUCKETS, 2, 0);
    oj_byte(d->o, '}');
}

/* The keys of a data point (of metric type `type`, a field number of Metric)
 * after the metric. */
static int point_fields(dec *d, uint32_t type, span rec)
{
    static const int POINTS[MAX_FIELD + 1] = {
        [5] = M_NUMBER_POINT, [7] = M_NUMBER_POINT, [9] = M_HISTOGRAM_POINT,
        [10] = M_EXP_POINT, [11] = M_SUMMARY_POINT,
    };
    /* attributes and exemplars by point type: NumberDataPoint 7 and 5,
     * HistogramDataPoint 9 and 8, ExponentialHistogramDataPoint 1 and 11,
     * SummaryDataPoint 7 */
    int m = POINTS[type];
    uint32_t attrs = m == M_HISTOGRAM_POINT ? 9 : m == M_EXP_POINT ? 1 : 7;
    uint32_t exemplars = m == M_NUMBER_POINT ? 5 : m == M_HISTOGRAM_POINT ? 8 : 11;
    uint32_t flags = 10;
    if (m == M_NUMBER_POINT || m == M_SUMMARY_POINT)
        flags = 8;
    fields p;
    view pv = one_view(&rec);
    scan(d, m, pv, &p);
    ojbuf *o = d->o;
    oj_lit(o, ",\"attributes\":");
    int rc = write_attributes_at(d, pv, &p, m, attrs, "attributes");
    if (rc)
        return rc;
    oj_lit(o, ",\"start_time_unix_nano\":");
    oj_u64(o, num_of(&p, 2));
    oj_lit(o, ",\"time_unix_nano\":");
    oj_u64(o, num_of(&p, 3));
    oj_lit(o, ",\"flags\":");
    oj_u64(o, (uint32_t)num_of(&p, flags));
    if (m == M_NUMBER_POINT) {
        oj_lit(o, ",\"value\":");
        write_number(d, &p, 4, 6);
    } else if (m == M_SUMMARY_POINT) {
        oj_lit(o, ",\"count\":");
        oj_u64(o, num_of(&p, 4));
        oj_lit(o, ",\"sum\":");
        oj_double(o, double_of(num_of(&p, 5)));
        oj_lit(o, ",\"quantile_values\":[");
        iter it = iter_of(pv, &p, m, 6);
        uint32_t wt, i = 0;
        span q;
        while (iter_next(&it, &wt, &q)) {
            fields v;
            scan(d, M_QUANTILE, one_view(&q), &v);
            oj_lit(o, i++ ? ",{\"quantile\":" : "{\"quantile\":");
            oj_double(o, double_of(num_of(&v, 1)));
            oj_lit(o, ",\"value\":");
            oj_double(o, double_of(num_of(&v, 2)));
            oj_byte(o, '}');
        }
        oj_byte(o, ']');
        return 0;
    } else {
        oj_lit(o, ",\"count\":");
        oj_u64(o, num_of(&p, 4));
        oj_lit(o, ",\"sum\":");
        write_optional_double(d, &p, 5);
        if (m == M_HISTOGRAM_POINT) {
            oj_lit(o, ",\"bucket_counts\":");
            write_numbers(d, pv, &p, m, 6, 0);
            oj_lit(o, ",\"explicit_bounds\":");
            write_numbers(d, pv, &p, m, 7, 1);
        } else {
            oj_lit(o, ",\"scale\":");
            oj_i64(o, sint32_of(num_of(&p, 6)));
            oj_lit(o, ",\"zero_count\":");
            oj_u64(o, num_of(&p, 7));
            oj_lit(o, ",\"zero_threshold\":");
            oj_double(o, double_of(num_of(&p, 14)));
            oj_lit(o, ",\"positive\":");
            write_buckets(d, &p, 8);
            oj_lit(o, ",\"negative\":");
            write_buckets(d, &p, 9);
        }
        uint32_t min = m == M_HISTOGRAM_POINT ? 11 : 12;
        oj_lit(o, ",\"min\":");
        write_optional_double(d, &p, min);
        oj_lit(o, ",\"max\":");
        write_optional_double(d, &p, min + 1);
    }
    return write_exemplars(d, pv, &p, m, exemplars);
}

/* ---- the request ------------------------------------------------------------- */

static const char *const RECORD_NAMES[] = {"", "log record", "span", "data point"};

/* The records of a scope group (fields sg, of type sm, in sv). */
static int walk_scope(dec *d, const fields *rg, view sv, const fields *sg, int sm)
{
    const char *what = RECORD_NAMES[d->signal];
    iter it = iter_of(sv, sg, sm, 2);
    uint32_t wt;
    span rec;
    while (iter_next(&it, &wt, &rec)) {
        int rc;
        if (d->signal == COMET_OTLP_METRICS) {
            fields m;
            scan(d, M_METRIC, one_view(&rec), &m);
            if (!m.which)
                continue;
            span one;
            view dv = message_view(get(&m, m.which), &one);
            fields data;
            scan(d, METRIC_DATA[m.which], dv, &data);
            d->metric.ready = 0;
            iter pi = iter_of(dv, &data, METRIC_DATA[m.which], 1);
            span point;
            while (iter_next(&pi, &wt, &point)) {
                int64_t start = begin_event(d, rg, sg);
                if (start < 0)
                    return (int)start;
                if (!d->metric.ready && (rc = write_metric(d, one_view(&rec), &m, &data)))
                    return rc;
                oj_lit(d->o, ",\"metric\":");
                oj_put(d->o, d->metric.json.p, d->metric.json.len);
                rc = point_fields(d, m.which, point);
                if ((rc = end_event(d, (size_t)start, what, rc)))
                    return rc;
                d->record++;
            }
            continue;
        }
        int64_t start = begin_event(d, rg, sg);
        if (start < 0)
            return (int)start;
        rc = d->signal == COMET_OTLP_LOGS ? log_fields(d, rec) : span_fields(d, rec);
        if ((rc = end_event(d, (size_t)start, what, rc)))
            return rc;
        d->record++;
    }
    return 0;
}

static int walk(dec *d, view req, const fields *rq, int request, int rm, int sm)
{
    iter ri = iter_of(req, rq, request, 1);
    uint32_t wt;
    span rs;
    while (iter_next(&ri, &wt, &rs)) {
        fields rg;
        scan(d, rm, one_view(&rs), &rg);
        d->resource.ready = 0;
        iter si = iter_of(one_view(&rs), &rg, rm, 2);
        span ss;
        while (iter_next(&si, &wt, &ss)) {
            fields sg;
            scan(d, sm, one_view(&ss), &sg);
            d->scope.ready = 0;
            int rc = walk_scope(d, &rg, one_view(&ss), &sg, sm);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* The partition key: service.name of the first resource, when a string. */
static void find_key(dec *d, view req, const fields *rq, int request, int rm)
{
    iter ri = iter_of(req, rq, request, 1);
    uint32_t wt;
    span rs;
    if (!iter_next(&ri, &wt, &rs))
        return;
    fields rg, r;
    scan(d, rm, one_view(&rs), &rg);
    span one;
    view rv = message_view(get(&rg, 1), &one);
    scan(d, M_RESOURCE, rv, &r);
    iter it = iter_of(rv, &r, M_RESOURCE, 1);
    span kv;
    while (iter_next(&it, &wt, &kv)) {
        fields k, v;
        scan(d, M_KEY_VALUE, one_view(&kv), &k);
        if (!get(&k, 1)->n || get(&k, 1)->v != 12 || memcmp(get(&k, 1)->at, "service.name", 12) != 0)
            continue;
        span vone;
        scan(d, M_ANY_VALUE, message_view(get(&k, 2), &vone), &v);
        if (v.which == 1) {
            d->res->has_key = 1;
            d->res->key_offset = (uint64_t)(get(&v, 1)->at - d->body);
            d->res->key_len = (uint32_t)get(&v, 1)->v;
            return;
        }
    }
}

static void dec_free(dec *d)
{
    while (d->blocks) {
        block *b = d->blocks;
        d->blocks = b->next;
        free(b);
    }
    ojtypes_free(&d->types);
    fragment *frags[] = {&d->resource, &d->scope, &d->metric};
    for (int i = 0; i < 3; i++) {
        ojbuf_free(&frags[i]->json);
        ojtypes_free(&frags[i]->types);
    }
}

int comet_otlp_decode(int32_t signal, const uint8_t *body, uint64_t len,
                      uint32_t max_event_bytes, comet_otlp_result *out)
{
    if (!out)
        return set_error(COMET_E_INVALID, "comet_otlp_decode: no result given");
    memset(out, 0, sizeof *out);
    if (signal < COMET_OTLP_LOGS || signal > COMET_OTLP_METRICS)
        return set_error(COMET_E_INVALID, "comet_otlp_decode: signal %d is not 1, 2 or 3", signal);
    if (!body && len)
        return set_error(COMET_E_INVALID, "comet_otlp_decode: no body");
    static const uint8_t empty[1];
    if (!body)
        body = empty;
    /* requests, their resource groups and scope groups follow the signals' order */
    int request = M_LOGS_REQUEST + signal - 1, rm = M_RESOURCE_LOGS + signal - 1;
    int sm = M_SCOPE_LOGS + signal - 1;
    dec *d = sys_calloc(1, sizeof *d);
    if (!d)
        return set_error(COMET_E_NOMEM, "out of memory decoding an OTLP request");
    d->body = body;
    d->signal = signal;
    d->max_event = max_event_bytes;
    d->res = out;
    d->o = &d->events;
    d->t = &d->types;
    int rc = 0;
    if (!check_message(d, request, body, body + len, WIRE_MAX_DEPTH, NO_GROUP)) {
        rc = COMET_E_BAD_OTLP;
    } else {
        span whole = {body, body + len};
        fields rq;
        scan(d, request, one_view(&whole), &rq);
        rc = walk(d, one_view(&whole), &rq, request, rm, sm);
        if (rc == 0)
            find_key(d, one_view(&whole), &rq, request, rm);
        if (rc == 0 && failed(d))
            rc = set_error(COMET_E_NOMEM, "out of memory decoding an OTLP request");
    }
    if (rc == 0) {
        out->events = d->events.p;
        out->events_len = d->events.len;
        d->events.p = NULL;
    } else {
        out->count = 0;
        out->rejected = 0;
        out->has_key = 0;
        if (rc != COMET_E_BAD_OTLP)
            out->reason[0] = 0;
        ojbuf_free(&d->events);
    }
    dec_free(d);
    free(d);
    return rc;
}

void comet_otlp_free(comet_otlp_result *out)
{
    if (!out)
        return;
    free(out->events);
    out->events = NULL;
    out->events_len = 0;
}
