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
 * The parts: this file runs the pass and keeps the groups; otlp_values.c
 * turns an event's values, attributes and heads into protobuf,
 * otlp_records.c each signal's records; otlp_encoder.h holds their state and
 * the inline readers of an event's fields, pbwrite.h the protobuf writer.
 *
 * Trade-offs:
 *   - Heads whose text (and value_types) repeats the last event's are not
 *     parsed again: consecutive records of a group repeat them.
 *   - The encoding is deterministic (same events, same bytes): fields in
 *     field-number order, proto3 defaults left out, members of a oneof
 *     written even when zero.  A batch rebuilt after a crash is therefore
 *     the same request, which is what makes its Idempotency-Key meaningful.
 *   - Protobuf's lengths are written after their content (pbwrite.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "otlp_encoder.h"
#include "port/port.h"
#include "utf8.h"

/* The field numbers shared by the three signals' groups. */
enum { F_REQUEST_GROUPS = 1 };                                         /* Export*ServiceRequest */
enum { F_GROUP_RESOURCE = 1, F_GROUP_SCOPES = 2, F_GROUP_SCHEMA = 3 }; /* Resource* */
enum { F_SCOPE_SCOPE = 1, F_SCOPE_RECORDS = 2, F_SCOPE_SCHEMA = 3 };   /* Scope* */

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
            e->data = pb_open(&e->out, ENC_METRIC_FIELDS[m.type]);
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
    int ok = l == 0 ? enc_resource_head(e, v, &e->rec) : l == 1 ? enc_scope_head(e, v, &e->rec)
                                                            : enc_metric_head(e, v, &e->rec, type);
    if (ok && v.p) {
        remember(&e->seen[l], v);
        e->seen_ok[l] = 1;
    }
    return ok;
}

static int layout_event(enc *e, jspan event)
{
    jspan f[P_KEYS];
    const char *const *keys = e->signal == COMET_OTLP_LOGS     ? ENC_LOG_KEYS
                              : e->signal == COMET_OTLP_TRACES ? ENC_SPAN_KEYS
                                                               : ENC_POINT_KEYS;
    int nkeys = e->signal == COMET_OTLP_LOGS ? L_COUNT : e->signal == COMET_OTLP_TRACES ? S_COUNT : P_KEYS;
    int at_resource = e->signal == COMET_OTLP_LOGS ? L_RESOURCE : e->signal == COMET_OTLP_TRACES ? S_RESOURCE : P_RESOURCE;
    int type = 0;
    e->path.len = 0;
    if (!enc_index_object(e, event, keys, nkeys, f, "the event"))
        return 0;
    if (!jr_at_end(&e->r))
        return reject(e, "%s", "the event has bytes after its end");
    jspan types = f[at_resource + 2];
    int types_same = same_text(&e->seen_types, types);
    if (!types_same) {
        remember(&e->seen_types, types);
        e->seen_ok[0] = e->seen_ok[1] = e->seen_ok[2] = 0;
    }
    if (!enc_read_types(e, types) || !make_head(e, 0, f[at_resource], types_same, &type) ||
        !make_head(e, 1, f[at_resource + 1], types_same, &type))
        return 0;
    if (e->signal == COMET_OTLP_METRICS && !make_head(e, 2, f[P_METRIC], types_same, &type))
        return 0;
    e->rec.len = 0;
    if (e->signal == COMET_OTLP_LOGS)
        return enc_log_record(e, f, &e->rec);
    if (e->signal == COMET_OTLP_TRACES)
        return enc_span_record(e, f, &e->rec);
    return enc_point_record(e, f, type, &e->rec);
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
    if (enc_any_value(e, b, 0) && jr_at_end(&e->r)) {
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
        enc_put_head(&e.head[0], &message, (jspan){NULL, 0});
        ojbuf empty = {0};
        enc_put_head(&e.head[1], &empty, (jspan){NULL, 0});
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
