/*
 * otlp_records.c - the records of each signal from an event's members: a
 * LogRecord, a Span with its events, links and status, and the data point
 * of each metric type (numbers, histograms, exponential histograms,
 * summaries) with its exemplars.  Fields are written in field-number order
 * (deterministic bytes); absent members are the protobuf defaults; a member
 * of the wrong type or range rejects the event (enc_reject says why).
 * otlp_encode.c says how the encoder's parts fit.
 */
#include <string.h>

#include "otlp_encoder.h"

/* ---- records ---------------------------------------------------------------------- */


const char *const ENC_LOG_KEYS[] = {
    "time_unix_nano", "observed_time_unix_nano", "severity_number", "severity_text", "body",
    "attributes", "dropped_attributes_count", "flags", "trace_id", "span_id", "event_name",
    "resource", "scope", "value_types"};

int enc_log_record(enc *e, const jspan *f, ojbuf *b)
{
    if (!put_fixed64(e, b, 1, f[L_TIME], "time_unix_nano") ||
        !put_enum(e, b, 2, f[L_SEVERITY], "severity_number") ||
        !put_string(e, b, 3, f[L_SEVERITY_TEXT], "severity_text"))
        return 0;
    if (f[L_BODY].p) {
        size_t mark = enc_path_push_lit(e, "body");
        read_at(e, f[L_BODY]);
        pbmark body = pb_open(b, 5);
        if (!enc_any_value(e, b, 0))
            return 0;
        pb_close_or_drop(b, body);
        enc_path_pop(e, mark);
    }
    return enc_put_attributes(e, b, 6, f[L_ATTRIBUTES], "attributes") &&
           put_uint(e, b, 7, f[L_DROPPED], "dropped_attributes_count", UINT32_MAX) &&
           put_fixed32(e, b, 8, f[L_FLAGS], "flags") &&
           put_id(e, b, 9, f[L_TRACE], 16, "trace_id") && put_id(e, b, 10, f[L_SPAN], 8, "span_id") &&
           put_fixed64(e, b, 11, f[L_OBSERVED], "observed_time_unix_nano") &&
           put_string(e, b, 12, f[L_EVENT_NAME], "event_name");
}


const char *const ENC_SPAN_KEYS[] = {
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
        size_t mark = enc_path_push_lit(e, name);
        enc_path_push_index(e, i);
        if (!item(e, b, text, i++))
            return 0;
        enc_path_pop(e, mark);
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
    if (!enc_index_object(e, v, names, 4, f, "a span event") ||
        !put_fixed64(e, b, 1, f[0], "time_unix_nano") || !put_string(e, b, 2, f[1], "name") ||
        !enc_put_attributes(e, b, 3, f[2], "attributes") ||
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
    if (!enc_index_object(e, v, names, 6, f, "a span link") ||
        !put_id(e, b, 1, f[0], 16, "a link's trace_id") ||
        !put_id(e, b, 2, f[1], 8, "a link's span_id") ||
        !put_string(e, b, 3, f[2], "trace_state") || !enc_put_attributes(e, b, 4, f[3], "attributes") ||
        !put_uint(e, b, 5, f[4], "dropped_attributes_count", UINT32_MAX) ||
        !put_fixed32(e, b, 6, f[5], "flags"))
        return 0;
    pb_close(b, m);
    return 1;
}

int enc_span_record(enc *e, const jspan *f, ojbuf *b)
{
    if (!put_id(e, b, 1, f[S_TRACE], 16, "trace_id") || !put_id(e, b, 2, f[S_SPAN], 8, "span_id") ||
        !put_string(e, b, 3, f[S_STATE], "trace_state") ||
        !put_id(e, b, 4, f[S_PARENT], 8, "parent_span_id") || !put_string(e, b, 5, f[S_NAME], "name") ||
        !put_enum(e, b, 6, f[S_KIND], "kind") ||
        !put_fixed64(e, b, 7, f[S_START], "start_time_unix_nano") ||
        !put_fixed64(e, b, 8, f[S_END], "end_time_unix_nano") ||
        !enc_put_attributes(e, b, 9, f[S_ATTRIBUTES], "attributes") ||
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
        if (!enc_index_object(e, f[S_STATUS], names, 2, st, "status") ||
            !put_string(e, b, 2, st[1], "status message") || !put_enum(e, b, 3, st[0], "status code"))
            return 0;
        pb_close_or_drop(b, m);
    }
    return put_fixed32(e, b, 16, f[S_FLAGS], "flags");
}


const char *const ENC_POINT_KEYS[] = {
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
    if (!enc_index_object(e, v, names, 5, f, "an exemplar") ||
        !put_fixed64(e, b, 2, f[1], "time_unix_nano") || !put_number(e, b, f[2], 3, 6) ||
        !put_id(e, b, 4, f[3], 8, "an exemplar's span_id") ||
        !put_id(e, b, 5, f[4], 16, "an exemplar's trace_id") ||
        !enc_put_attributes(e, b, 7, f[0], "filtered_attributes"))
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
    if (!enc_index_object(e, v, names, 2, f, name) ||
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
    if (!enc_index_object(e, v, names, 2, f, "a quantile") ||
        !get_double(e, f[0], "quantile", &q, NULL) || !get_double(e, f[1], "value", &x, NULL))
        return 0;
    pb_double(b, 1, q, 0);
    pb_double(b, 2, x, 0);
    pb_close(b, m);
    return 1;
}

/* One data point of a metric of `type` (an index of METRIC_TYPES). */
int enc_point_record(enc *e, const jspan *f, int type, ojbuf *b)
{
    uint64_t count;
    double x;
    int64_t scale;
    if (type == 3 && !enc_put_attributes(e, b, 1, f[P_ATTRIBUTES], "attributes"))
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
               enc_put_attributes(e, b, 7, f[P_ATTRIBUTES], "attributes") &&
               put_uint(e, b, 8, f[P_FLAGS], "flags", UINT32_MAX);
    case 2: /* HistogramDataPoint */
        e->exemplar_field = 8;
        return put_fixed64(e, b, 4, f[P_COUNT], "count") &&
               optional_double(e, b, 5, f[P_SUM], "sum") &&
               put_packed(e, b, 6, f[P_BUCKETS], PACK_FIXED64, "bucket_counts") &&
               put_packed(e, b, 7, f[P_BOUNDS], PACK_DOUBLE, "explicit_bounds") &&
               each_item(e, b, f[P_EXEMPLARS], "exemplars", exemplar_item) &&
               enc_put_attributes(e, b, 9, f[P_ATTRIBUTES], "attributes") &&
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
               enc_put_attributes(e, b, 7, f[P_ATTRIBUTES], "attributes") &&
               put_uint(e, b, 8, f[P_FLAGS], "flags", UINT32_MAX);
    }
}
