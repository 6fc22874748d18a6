/*
 * otlp.c - OTLP/HTTP export requests (protobuf) into JSON events: one event
 * per log record, span or metric data point, each carrying its resource and
 * scope (comet.h: comet_otlp_decode).  The layout, and what refuses a whole
 * request or one record, is specified by tests/support/otlp.py, which does
 * the same on the official protobuf library (upb); a differential fuzz test
 * (tests/test_otlp_decode.py) holds the two to the same answer for any body.
 *
 * Three files: otlp_wire.c reads the protobuf wire, this one decides what
 * goes where in the events, otlp_json.c writes the JSON text.
 *
 * Two passes over the body:
 *   1. pb_check walks every byte as upb's decoder does and refuses what
 *      upb refuses: tags of more than 5 bytes or above 2^32, field number 0,
 *      wire types 6 and 7, varints of more than 10 bytes, lengths past the
 *      end of their message, unmatched groups, more than 100 levels of
 *      messages and groups, invalid UTF-8 in a known string field, packed
 *      fixed64 lengths that are not a multiple of 8.  A known field sent with
 *      another wire type is an unknown field (skipped), except that repeated
 *      numbers come packed or not.  Nothing is written in this pass: upb
 *      refuses before any event exists.
 *   2. The walk writes the events from the checked bytes (no bounds checks
 *      left to do).  A message is read once (pb_scan) into one slot per field
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

#include "otlp_json.h"
#include "otlp_wire.h"
#include "port/port.h"

/* ---- the decoder's state ---------------------------------------------------- */




/* A part of every event of a group, written once (the resource, the scope,
 * a metric's description) with its value_types. */
typedef struct fragment {
    ojbuf json;
    ojtypes types;
    int ready;
} fragment;

typedef struct dec {
    wire w;                 /* body, result, arena */
    int32_t signal;
    uint32_t max_event;
    uint64_t max_output;    /* all events together, their '\n' included (0: no limit) */
    int output_bound;       /* the current event's buffer ends at max_output, not at max_event */
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

/* The request is refused (pb_fail). */
static int fail(dec *d, const uint8_t *at, const char *fmt, ...)
{
    char why[sizeof d->w.res->reason];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return pb_fail(&d->w, at, "%s", why);
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
    pb_scan(&d->w, M_ANY_VALUE, v, &f);
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
        pb_scan(&d->w, M_ARRAY_VALUE, av, &a);
        iter it = pb_iter(av, &a, M_ARRAY_VALUE, 1);
        uint32_t wt, i = 0;
        span elem;
        oj_byte(o, '[');
        while (pb_next(&it, &wt, &elem)) {
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
        pb_scan(&d->w, M_KVLIST, kv, &k);
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
    iter it = pb_iter(msg, f, m, num);
    uint32_t wt, i = 0;
    span kv;
    oj_byte(d->o, '{');
    while (pb_next(&it, &wt, &kv)) {
        fields k;
        pb_scan(&d->w, M_KEY_VALUE, one_view(&kv), &k);
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
    pb_scan(&d->w, M_RESOURCE, rv, &r);
    oj_lit(d->o, "{\"attributes\":");
    int rc = write_attributes_at(d, rv, &r, M_RESOURCE, 1, "attributes");
    if (rc)
        return fragment_end(d, &d->resource, rc);
    write_dropped(d, &r, 2, ",\"dropped_attributes_count\":");
    if (get(&r, 3)->n) {
        iter it = pb_iter(rv, &r, M_RESOURCE, 3);
        uint32_t wt, i = 0;
        span ref;
        oj_lit(d->o, ",\"entity_refs\":[");
        while (pb_next(&it, &wt, &ref)) {
            fields e;
            pb_scan(&d->w, M_ENTITY_REF, one_view(&ref), &e);
            oj_lit(d->o, i++ ? ",{\"schema_url\":" : "{\"schema_url\":");
            write_string_field(d, &e, 1);
            oj_lit(d->o, ",\"type\":");
            write_string_field(d, &e, 2);
            for (uint32_t num = 3; num <= 4; num++) {
                oj_lit(d->o, num == 3 ? ",\"id_keys\":[" : "],\"description_keys\":[");
                iter keys = pb_iter(one_view(&ref), &e, M_ENTITY_REF, num);
                span key;
                for (uint32_t j = 0; pb_next(&keys, &wt, &key); j++) {
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
    pb_scan(&d->w, M_SCOPE, sv, &s);
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
    uint64_t limit = d->max_event ? (uint64_t)start + d->max_event + 1 : 0;
    d->output_bound = d->max_output && (!limit || limit > d->max_output);
    ojbuf_limit(&d->events, d->output_bound ? (size_t)d->max_output : (size_t)limit);
    oj_lit(d->o, "{\"resource\":");
    oj_put(d->o, d->resource.json.p, d->resource.json.len);
    oj_lit(d->o, ",\"scope\":");
    oj_put(d->o, d->scope.json.p, d->scope.json.len);
    return (int64_t)start;
}

/* Whether an allocation failed: the writes since are incomplete. */
static int failed(const dec *d)
{
    return d->w.failed || d->events.failed || d->resource.json.failed || d->scope.json.failed ||
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

/* The events together would pass max_output: the request is refused. */
static int too_large(const dec *d)
{
    return set_error(COMET_E_BATCH_TOO_LARGE, "the events of this OTLP request take more than %llu bytes",
                     (unsigned long long)d->max_output);
}

static void reject(dec *d, size_t start, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reject(dec *d, size_t start, const char *what, const char *fmt, ...)
{
    d->events.len = start;
    if (d->w.res->rejected++ == 0) {
        char why[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        snprintf(d->w.res->reason, sizeof d->w.res->reason, "%s %llu: %s", what,
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
    if (d->events.over && d->output_bound)
        return too_large(d);
    if (over(d)) {
        reject(d, start, what, "its event is longer than max_entry_bytes (%u)", d->max_event);
        return 0;
    }
    size_t size = d->events.len - start;
    if (d->max_event && size > d->max_event) {
        reject(d, start, what, "its event is %zu bytes, above max_entry_bytes (%u)", size,
               d->max_event);
        return 0;
    }
    oj_byte(d->o, '\n');
    if (d->events.over)
        return too_large(d);
    d->w.res->count++;
    return 0;
}

/* ---- logs -------------------------------------------------------------------- */

static int log_fields(dec *d, span rec)
{
    fields r;
    view rv = one_view(&rec);
    pb_scan(&d->w, M_LOG_RECORD, rv, &r);
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
    iter it = pb_iter(sv, s, M_SPAN, 11);
    uint32_t wt, i = 0;
    span ev;
    oj_lit(d->o, ",\"events\":[");
    while (pb_next(&it, &wt, &ev)) {
        fields e;
        pb_scan(&d->w, M_SPAN_EVENT, one_view(&ev), &e);
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
    iter it = pb_iter(sv, s, M_SPAN, 13);
    uint32_t wt, i = 0;
    span ln;
    oj_lit(d->o, ",\"links\":[");
    while (pb_next(&it, &wt, &ln)) {
        fields l;
        pb_scan(&d->w, M_SPAN_LINK, one_view(&ln), &l);
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
    pb_scan(&d->w, M_SPAN, sv, &s);
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
    pb_scan(&d->w, M_STATUS, message_view(get(&s, 15), &one), &st);
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
    iter it = pb_iter(v, f, m, num);
    uint32_t wt, i = 0;
    span x;
    oj_byte(d->o, '[');
    while (pb_next(&it, &wt, &x)) {
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
    iter it = pb_iter(pv, p, m, num);
    uint32_t wt, i = 0;
    span ex;
    oj_lit(d->o, ",\"exemplars\":[");
    while (pb_next(&it, &wt, &ex)) {
        fields e;
        pb_scan(&d->w, M_EXEMPLAR, one_view(&ex), &e);
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
    pb_scan(&d->w, M_BUCKETS, bv, &b);
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
    pb_scan(&d->w, m, pv, &p);
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
        iter it = pb_iter(pv, &p, m, 6);
        uint32_t wt, i = 0;
        span q;
        while (pb_next(&it, &wt, &q)) {
            fields v;
            pb_scan(&d->w, M_QUANTILE, one_view(&q), &v);
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
    iter it = pb_iter(sv, sg, sm, 2);
    uint32_t wt;
    span rec;
    while (pb_next(&it, &wt, &rec)) {
        int rc;
        if (d->signal == COMET_OTLP_METRICS) {
            fields m;
            pb_scan(&d->w, M_METRIC, one_view(&rec), &m);
            if (!m.which)
                continue;
            span one;
            view dv = message_view(get(&m, m.which), &one);
            fields data;
            pb_scan(&d->w, METRIC_DATA[m.which], dv, &data);
            d->metric.ready = 0;
            iter pi = pb_iter(dv, &data, METRIC_DATA[m.which], 1);
            span point;
            while (pb_next(&pi, &wt, &point)) {
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
    iter ri = pb_iter(req, rq, request, 1);
    uint32_t wt;
    span rs;
    while (pb_next(&ri, &wt, &rs)) {
        fields rg;
        pb_scan(&d->w, rm, one_view(&rs), &rg);
        d->resource.ready = 0;
        iter si = pb_iter(one_view(&rs), &rg, rm, 2);
        span ss;
        while (pb_next(&si, &wt, &ss)) {
            fields sg;
            pb_scan(&d->w, sm, one_view(&ss), &sg);
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
    iter ri = pb_iter(req, rq, request, 1);
    uint32_t wt;
    span rs;
    if (!pb_next(&ri, &wt, &rs))
        return;
    fields rg, r;
    pb_scan(&d->w, rm, one_view(&rs), &rg);
    span one;
    view rv = message_view(get(&rg, 1), &one);
    pb_scan(&d->w, M_RESOURCE, rv, &r);
    iter it = pb_iter(rv, &r, M_RESOURCE, 1);
    span kv;
    while (pb_next(&it, &wt, &kv)) {
        fields k, v;
        pb_scan(&d->w, M_KEY_VALUE, one_view(&kv), &k);
        if (!get(&k, 1)->n || get(&k, 1)->v != 12 || memcmp(get(&k, 1)->at, "service.name", 12) != 0)
            continue;
        span vone;
        pb_scan(&d->w, M_ANY_VALUE, message_view(get(&k, 2), &vone), &v);
        if (v.which == 1) {
            d->w.res->has_key = 1;
            d->w.res->key_offset = (uint64_t)(get(&v, 1)->at - d->w.body);
            d->w.res->key_len = (uint32_t)get(&v, 1)->v;
            return;
        }
    }
}

static void dec_free(dec *d)
{
    pb_free(&d->w);
    ojtypes_free(&d->types);
    fragment *frags[] = {&d->resource, &d->scope, &d->metric};
    for (int i = 0; i < 3; i++) {
        ojbuf_free(&frags[i]->json);
        ojtypes_free(&frags[i]->types);
    }
}

int comet_otlp_decode(int32_t signal, const uint8_t *body, uint64_t len,
                      uint32_t max_event_bytes, uint64_t max_output_bytes, comet_otlp_result *out)
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
    d->w.body = body;
    d->signal = signal;
    d->max_event = max_event_bytes;
    d->max_output = max_output_bytes;
    d->w.res = out;
    d->o = &d->events;
    d->t = &d->types;
    int rc = 0;
    if ((rc = pb_check(&d->w, request, body, (size_t)len)) == 0) {
        span whole = {body, body + len};
        fields rq;
        pb_scan(&d->w, request, one_view(&whole), &rq);
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
