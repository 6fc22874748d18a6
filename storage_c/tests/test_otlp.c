/* OTLP export requests (otlp.c, otlp_json.c) under the sanitizers: hand-built
 * requests of each signal and their exact events, upb's wire rules (groups,
 * tags, varints, lengths, depth), the layout's own refusals (nesting,
 * *_strindex) and rejections (ids, max_event_bytes), every truncation and
 * random byte mutations of valid requests (each decoded from a heap copy of
 * exactly its size, so that a read past its end is an ASan report), and
 * every allocation failing in turn.  The differential test against the
 * reference on the protobuf library is tests/test_otlp_decode.py. */
#include <errno.h>
#include <math.h>

#include "otlp_roundtrip.h"
#include "util.h"

/* ---- building requests ------------------------------------------------------ */

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
} wbuf;

static void put(wbuf *b, const void *s, size_t n)
{
    if (b->cap - b->len < n) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        CHECK(b->p != NULL);
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void varint(wbuf *b, uint64_t v)
{
    do {
        uint8_t c = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            c |= 0x80;
        put(b, &c, 1);
    } while (v);
}

static void tag(wbuf *b, uint32_t num, uint32_t wt)
{
    varint(b, (uint64_t)num << 3 | wt);
}

static void bytes_field(wbuf *b, uint32_t num, const void *s, size_t n)
{
    tag(b, num, 2);
    varint(b, n);
    put(b, s, n);
}

static void str(wbuf *b, uint32_t num, const char *s)
{
    bytes_field(b, num, s, strlen(s));
}

static void uint_field(wbuf *b, uint32_t num, uint64_t v)
{
    tag(b, num, 0);
    varint(b, v);
}

static void fixed64(wbuf *b, uint32_t num, uint64_t v)
{
    tag(b, num, 1);
    put(b, &v, 8);
}

static void fixed32(wbuf *b, uint32_t num, uint32_t v)
{
    tag(b, num, 5);
    put(b, &v, 4);
}

static void double_field(wbuf *b, uint32_t num, double x)
{
    uint64_t v;
    memcpy(&v, &x, 8);
    fixed64(b, num, v);
}

/* Appends inner as field num of b and frees it. */
static void sub(wbuf *b, uint32_t num, wbuf *inner)
{
    bytes_field(b, num, inner->p, inner->len);
    free(inner->p);
    memset(inner, 0, sizeof *inner);
}

/* A KeyValue (field num of b) whose AnyValue is built by the caller. */
static void kv(wbuf *b, uint32_t num, const char *key, wbuf *value)
{
    wbuf k = {0};
    str(&k, 1, key);
    sub(&k, 2, value);
    sub(b, num, &k);
}

static void kv_string(wbuf *b, uint32_t num, const char *key, const char *s)
{
    wbuf v = {0};
    str(&v, 1, s);
    kv(b, num, key, &v);
}

static void kv_int(wbuf *b, uint32_t num, const char *key, int64_t i)
{
    wbuf v = {0};
    uint_field(&v, 3, (uint64_t)i);
    kv(b, num, key, &v);
}

static void kv_double(wbuf *b, uint32_t num, const char *key, double x)
{
    wbuf v = {0};
    double_field(&v, 4, x);
    kv(b, num, key, &v);
}

/* A request of one resource group (resource) and one scope group holding
 * the records in records (each a field of the scope group). */
static wbuf request(wbuf *resource, wbuf *scope, wbuf *records)
{
    wbuf sg = {0}, rg = {0}, req = {0};
    if (scope->len)
        sub(&sg, 1, scope);
    put(&sg, records->p, records->len);
    free(records->p);
    memset(records, 0, sizeof *records);
    if (resource->len)
        sub(&rg, 1, resource);
    sub(&rg, 2, &sg);
    sub(&req, 1, &rg);
    return req;
}

static const uint8_t TRACE_ID[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* ---- decoding a heap copy of exactly the body --------------------------------- */

static int decode(int32_t signal, const wbuf *body, uint32_t max, comet_otlp_result *res)
{
    uint8_t *copy = malloc(body->len ? body->len : 1);
    CHECK(copy != NULL);
    if (body->len)
        memcpy(copy, body->p, body->len);
    int rc = comet_otlp_decode(signal, copy, body->len, max, 0, res);
    if (rc == 0) {
        CHECK(res->events_len == 0 || res->events[res->events_len - 1] == '\n');
        uint64_t lines = 0;
        for (uint64_t i = 0; i < res->events_len; i++)
            lines += res->events[i] == '\n';
        CHECK(lines == res->count);
        CHECK(!res->has_key || res->key_offset + res->key_len <= body->len);
        CHECK((res->rejected > 0) == (res->reason[0] != 0));
    } else {
        CHECK(res->events == NULL && res->count == 0);
        if (rc == COMET_E_BAD_OTLP)
            CHECK(res->reason[0] && res->error_offset <= body->len);
    }
    free(copy);
    return rc;
}

/* The events of body are want (and nothing is checked on the way back). */
static void expect_decoded(int32_t signal, const wbuf *body, const char *want)
{
    comet_otlp_result res;
    CHECK_OK(decode(signal, body, 0, &res));
    if (res.events_len != strlen(want) || memcmp(res.events, want, res.events_len) != 0) {
        fprintf(stderr, "got:  %.*s\nwant: %s\n", (int)res.events_len, (const char *)res.events,
                want);
        CHECK(0);
    }
    comet_otlp_free(&res);
}

/* The events of body are want, and they encode back to a request of the same
 * events (otlp_encode.c). */
static void expect_events(int32_t signal, const wbuf *body, const char *want)
{
    expect_decoded(signal, body, want);
    expect_round_trip(signal, want);
}

/* Refused, with a reason holding `why`. */
static void expect_refused(int32_t signal, const wbuf *body, const char *why)
{
    comet_otlp_result res;
    int rc = decode(signal, body, 0, &res);
    if (rc != COMET_E_BAD_OTLP || !strstr(res.reason, why)) {
        fprintf(stderr, "rc %d, reason '%s', wanted '%s'\n", rc, res.reason, why);
        CHECK(0);
    }
    comet_otlp_free(&res);
}

/* ---- the events of each signal ------------------------------------------------ */

static wbuf log_request(void)
{
    wbuf res = {0}, scope = {0}, recs = {0}, rec = {0}, v = {0};
    kv_string(&res, 1, "service.name", "svc");
    bytes_field(&v, 7, "\x00\xff", 2);
    kv(&res, 1, "b/~", &v);
    str(&scope, 1, "lib");
    str(&scope, 2, "1");
    fixed64(&rec, 1, 1);
    fixed64(&rec, 11, 2);
    uint_field(&rec, 2, 9);
    str(&rec, 3, "INFO");
    str(&v, 1, "hi\n\"\x01\x7f\xc3\xa9");
    sub(&rec, 5, &v);
    kv_int(&rec, 6, "k", -5);
    kv_double(&rec, 6, "d", 1.5);
    kv_double(&rec, 6, "n", NAN);
    fixed32(&rec, 8, 1);
    bytes_field(&rec, 9, TRACE_ID, 16);
    bytes_field(&rec, 10, TRACE_ID, 8);
    sub(&recs, 2, &rec);
    return request(&res, &scope, &recs);
}

static void test_logs(void)
{
    wbuf req = log_request();
    expect_events(COMET_OTLP_LOGS, &req,
                  "{\"resource\":{\"attributes\":{\"service.name\":\"svc\",\"b/~\":\"AP8=\"}},"
                  "\"scope\":{\"name\":\"lib\",\"version\":\"1\",\"attributes\":{}},"
                  "\"time_unix_nano\":1,\"observed_time_unix_nano\":2,\"severity_number\":9,"
                  "\"severity_text\":\"INFO\",\"body\":\"hi\\n\\\"\\u0001\x7f\xc3\xa9\","
                  "\"attributes\":{\"k\":-5,\"d\":1.5,\"n\":\"NaN\"},\"flags\":1,"
                  "\"trace_id\":\"000102030405060708090a0b0c0d0e0f\",\"span_id\":\"0001020304050607\","
                  "\"event_name\":\"\",\"value_types\":{\"/attributes/n\":\"double\","
                  "\"/resource/attributes/b~1~0\":\"bytes\"}}\n");
    comet_otlp_result res;
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, 0, &res));
    CHECK(res.has_key && res.key_len == 3 && memcmp(req.p + res.key_offset, "svc", 3) == 0);
    comet_otlp_free(&res);
    /* the same bytes as spans: the record's trace_id is a Span's attribute,
     * a KeyValue starting with a field numbered 0 */
    expect_refused(COMET_OTLP_TRACES, &req, "a KeyValue: a field numbered 0");
    free(req.p);
}

static void test_traces(void)
{
    wbuf res = {0}, scope = {0}, recs = {0}, sp = {0}, ev = {0}, ln = {0}, st = {0};
    bytes_field(&sp, 1, TRACE_ID, 16);
    bytes_field(&sp, 2, TRACE_ID, 8);
    str(&sp, 3, "a=b");
    fixed32(&sp, 16, 0x301);
    str(&sp, 5, "GET /");
    uint_field(&sp, 6, 2);
    fixed64(&sp, 7, UINT64_MAX);
    fixed64(&sp, 8, 5);
    kv_int(&sp, 9, "code", 200);
    uint_field(&sp, 10, 3);
    fixed64(&ev, 1, 7);
    str(&ev, 2, "retry");
    kv_string(&ev, 3, "x", "y");
    sub(&sp, 11, &ev);
    uint_field(&sp, 12, 1);
    bytes_field(&ln, 1, TRACE_ID, 16);
    bytes_field(&ln, 2, TRACE_ID + 8, 8);
    uint_field(&ln, 5, 2);
    fixed32(&ln, 6, 1);
    sub(&sp, 13, &ln);
    uint_field(&st, 3, 2);
    str(&st, 2, "boom");
    sub(&sp, 15, &st);
    sub(&recs, 2, &sp);
    str(&scope, 1, "t");
    wbuf req = request(&res, &scope, &recs);
    expect_events(COMET_OTLP_TRACES, &req,
                  "{\"resource\":{\"attributes\":{}},\"scope\":{\"name\":\"t\",\"version\":\"\","
                  "\"attributes\":{}},\"trace_id\":\"000102030405060708090a0b0c0d0e0f\","
                  "\"span_id\":\"0001020304050607\",\"trace_state\":\"a=b\",\"parent_span_id\":\"\","
                  "\"flags\":769,\"name\":\"GET /\",\"kind\":2,"
                  "\"start_time_unix_nano\":18446744073709551615,\"end_time_unix_nano\":5,"
                  "\"attributes\":{\"code\":200},\"dropped_attributes_count\":3,"
                  "\"events\":[{\"time_unix_nano\":7,\"name\":\"retry\",\"attributes\":{\"x\":\"y\"}}],"
                  "\"dropped_events_count\":1,\"links\":[{\"trace_id\":\"000102030405060708090a0b0c0d0e0f\","
                  "\"span_id\":\"08090a0b0c0d0e0f\",\"trace_state\":\"\",\"attributes\":{},"
                  "\"dropped_attributes_count\":2,\"flags\":1}],\"status\":{\"code\":2,\"message\":\"boom\"}}\n");
    comet_otlp_result out;
    CHECK_OK(decode(COMET_OTLP_TRACES, &req, 0, &out));
    CHECK(!out.has_key);
    comet_otlp_free(&out);
    free(req.p);
}

static void test_metrics(void)
{
    wbuf res = {0}, scope = {0}, recs = {0}, m = {0}, data = {0}, pt = {0}, ex = {0};
    wbuf q = {0}, b = {0}, packed = {0};
    /* a sum of one point with an exemplar */
    str(&m, 1, "requests");
    str(&m, 3, "1");
    fixed64(&pt, 3, 10);
    fixed64(&pt, 6, (uint64_t)-4);
    uint_field(&pt, 8, 1);
    kv_int(&pt, 7, "a", 1);
    double_field(&ex, 3, 0.25);
    bytes_field(&ex, 4, TRACE_ID, 8);
    sub(&pt, 5, &ex);
    sub(&data, 1, &pt);
    uint_field(&data, 2, 2);
    uint_field(&data, 3, 1);
    sub(&m, 7, &data);
    kv_string(&m, 12, "k", "v");
    sub(&recs, 2, &m);
    /* a histogram: bucket counts packed and not, bounds, min */
    str(&m, 1, "latency");
    fixed64(&pt, 4, 3);
    double_field(&pt, 5, 0.5);
    for (uint64_t i = 1; i <= 2; i++)
        put(&packed, &i, 8);
    sub(&pt, 6, &packed);
    fixed64(&pt, 6, 9);
    double x = INFINITY;
    put(&packed, &x, 8);
    sub(&pt, 7, &packed);
    double_field(&pt, 11, -0.0);
    sub(&data, 1, &pt);
    sub(&m, 9, &data);
    sub(&recs, 2, &m);
    /* an exponential histogram: buckets, scale */
    str(&m, 1, "exp");
    uint_field(&pt, 6, 3); /* sint32 -2 */
    uint_field(&b, 1, 1);  /* sint32 -1 */
    varint(&packed, 5);
    varint(&packed, 300);
    sub(&b, 2, &packed);
    sub(&pt, 8, &b);
    sub(&data, 1, &pt);
    sub(&m, 10, &data);
    sub(&recs, 2, &m);
    /* a summary with a quantile */
    str(&m, 1, "sum");
    double_field(&q, 1, 0.5);
    double_field(&q, 2, NAN);
    sub(&pt, 6, &q);
    sub(&data, 1, &pt);
    sub(&m, 11, &data);
    sub(&recs, 2, &m);
    /* a metric without data: no event */
    str(&m, 1, "nothing");
    sub(&recs, 2, &m);
    wbuf req = request(&res, &scope, &recs);
    expect_events(COMET_OTLP_METRICS, &req,
                  "{\"resource\":{\"attributes\":{}},\"scope\":{\"name\":\"\",\"version\":\"\",\"attributes\":{}},"
                  "\"metric\":{\"name\":\"requests\",\"description\":\"\",\"unit\":\"1\",\"type\":\"sum\","
                  "\"aggregation_temporality\":2,\"is_monotonic\":true,\"metadata\":{\"k\":\"v\"}},"
                  "\"attributes\":{\"a\":1},\"start_time_unix_nano\":0,\"time_unix_nano\":10,\"flags\":1,"
                  "\"value\":-4,\"exemplars\":[{\"filtered_attributes\":{},\"time_unix_nano\":0,"
                  "\"value\":0.25,\"span_id\":\"0001020304050607\",\"trace_id\":\"\"}]}\n"
                  "{\"resource\":{\"attributes\":{}},\"scope\":{\"name\":\"\",\"version\":\"\",\"attributes\":{}},"
                  "\"metric\":{\"name\":\"latency\",\"description\":\"\",\"unit\":\"\",\"type\":\"histogram\","
                  "\"aggregation_temporality\":0},\"attributes\":{},\"start_time_unix_nano\":0,"
                  "\"time_unix_nano\":0,\"flags\":0,\"count\":3,\"sum\":0.5,\"bucket_counts\":[1,2,9],"
                  "\"explicit_bounds\":[\"Infinity\"],\"min\":-0.0,\"max\":null,\"exemplars\":[]}\n"
                  "{\"resource\":{\"attributes\":{}},\"scope\":{\"name\":\"\",\"version\":\"\",\"attributes\":{}},"
                  "\"metric\":{\"name\":\"exp\",\"description\":\"\",\"unit\":\"\","
                  "\"type\":\"exponential_histogram\",\"aggregation_temporality\":0},\"attributes\":{},"
                  "\"start_time_unix_nano\":0,\"time_unix_nano\":0,\"flags\":0,\"count\":0,\"sum\":null,"
                  "\"scale\":-2,\"zero_count\":0,\"zero_threshold\":0.0,"
                  "\"positive\":{\"offset\":-1,\"bucket_counts\":[5,300]},"
                  "\"negative\":{\"offset\":0,\"bucket_counts\":[]},\"min\":null,\"max\":null,\"exemplars\":[]}\n"
                  "{\"resource\":{\"attributes\":{}},\"scope\":{\"name\":\"\",\"version\":\"\",\"attributes\":{}},"
                  "\"metric\":{\"name\":\"sum\",\"description\":\"\",\"unit\":\"\",\"type\":\"summary\"},"
                  "\"attributes\":{},\"start_time_unix_nano\":0,\"time_unix_nano\":0,\"flags\":0,\"count\":0,"
                  "\"sum\":0.0,\"quantile_values\":[{\"quantile\":0.5,\"value\":\"NaN\"}]}\n");
    free(req.p);
}

/* The resource's and scope's optional keys, a map value with its pointer. */
static void test_resource_and_scope_extras(void)
{
    wbuf res = {0}, scope = {0}, rec = {0}, ref = {0}, v = {0}, map = {0}, in = {0};
    uint_field(&res, 2, 7);
    str(&ref, 1, "u");
    str(&ref, 2, "service");
    str(&ref, 3, "a");
    str(&ref, 3, "b");
    str(&ref, 4, "c");
    sub(&res, 3, &ref);
    sub(&res, 3, &ref); /* an empty one */
    uint_field(&scope, 4, 1);
    bytes_field(&in, 7, "", 0);
    kv(&map, 1, "x/y", &in);
    kv_string(&map, 1, "x/y", "again");
    sub(&v, 6, &map);
    kv(&rec, 6, "m", &v);
    /* the groups by hand: schema_url first, a second scope group without records */
    wbuf sg = {0}, sg2 = {0}, rg = {0}, full = {0};
    sub(&sg, 1, &scope);
    sub(&sg, 2, &rec);
    str(&rg, 3, "https://r");
    sub(&rg, 1, &res);
    sub(&rg, 2, &sg);
    str(&sg2, 3, "https://s");
    sub(&rg, 2, &sg2);
    sub(&full, 1, &rg);
    /* a repeated key (OTLP forbids them) does not come back: value_types has
     * one entry for both */
    expect_decoded(COMET_OTLP_LOGS, &full,
                  "{\"resource\":{\"attributes\":{},\"dropped_attributes_count\":7,\"entity_refs\":["
                  "{\"schema_url\":\"u\",\"type\":\"service\",\"id_keys\":[\"a\",\"b\"],\"description_keys\":[\"c\"]},"
                  "{\"schema_url\":\"\",\"type\":\"\",\"id_keys\":[],\"description_keys\":[]}],"
                  "\"schema_url\":\"https://r\"},\"scope\":{\"name\":\"\",\"version\":\"\",\"attributes\":{},"
                  "\"dropped_attributes_count\":1},\"time_unix_nano\":0,\"observed_time_unix_nano\":0,"
                  "\"severity_number\":0,\"severity_text\":\"\",\"body\":null,"
                  "\"attributes\":{\"m\":{\"x/y\":\"\",\"x/y\":\"again\"}},\"flags\":0,\"trace_id\":\"\","
                  "\"span_id\":\"\",\"event_name\":\"\",\"value_types\":{\"/attributes/m/x~1y\":\"bytes\"}}\n");
    free(full.p);
}

/* ---- merging, oneofs, unknown fields ------------------------------------------ */

static void test_merges_and_unknown_fields(void)
{
    wbuf res = {0}, scope = {0}, recs = {0}, rec = {0}, v = {0}, arr = {0}, elem = {0};
    /* body: an array of one string, an int, then an array twice (merged):
     * the int and the first array are gone */
    str(&elem, 1, "x");
    sub(&arr, 1, &elem);
    sub(&v, 5, &arr);
    uint_field(&v, 3, 1);
    uint_field(&elem, 3, 9);
    sub(&arr, 1, &elem);
    sub(&v, 5, &arr);
    double_field(&elem, 4, 2.0);
    sub(&arr, 1, &elem);
    sub(&v, 5, &arr);
    sub(&rec, 5, &v);
    /* the body again: merged into it, with an unknown group and a known field
     * of another wire type on the way */
    tag(&v, 20, 3);
    tag(&v, 0, 0); /* field 0 inside a group passes, as in upb */
    varint(&v, 1);
    tag(&v, 21, 3);
    tag(&v, 21, 4);
    tag(&v, 20, 4);
    uint_field(&v, 1, 5); /* string_value as a varint: an unknown field */
    sub(&rec, 5, &v);
    fixed64(&rec, 1, 3);
    fixed64(&rec, 1, 4); /* the last wins */
    uint_field(&rec, 1, 99); /* another wire type: unknown */
    sub(&recs, 2, &rec);
    wbuf req = request(&res, &scope, &recs);
    expect_events(COMET_OTLP_LOGS, &req,
                  "{\"resource\":{\"attributes\":{}},\"scope\":{\"name\":\"\",\"version\":\"\",\"attributes\":{}},"
                  "\"time_unix_nano\":4,\"observed_time_unix_nano\":0,\"severity_number\":0,"
                  "\"severity_text\":\"\",\"body\":[9,2.0],\"attributes\":{},\"flags\":0,\"trace_id\":\"\","
                  "\"span_id\":\"\",\"event_name\":\"\"}\n");
    free(req.p);
}

/* ---- refusals ---------------------------------------------------------------- */

/* A logs request whose one record holds extra (its fields). */
static wbuf log_with(const void *extra, size_t n)
{
    wbuf res = {0}, scope = {0}, recs = {0}, rec = {0};
    put(&rec, extra, n);
    sub(&recs, 2, &rec);
    return request(&res, &scope, &recs);
}

/* A body nested `levels` arrays deep, at the bottom `leaf` (AnyValue fields). */
static wbuf nested_body(int levels, const void *leaf, size_t n)
{
    wbuf v = {0}, arr = {0};
    put(&v, leaf, n);
    for (int i = 0; i < levels; i++) {
        sub(&arr, 1, &v);
        sub(&v, 5, &arr);
    }
    wbuf rec = {0};
    sub(&rec, 5, &v);
    wbuf req = log_with(rec.p, rec.len);
    free(rec.p);
    return req;
}

static void test_wire_refusals(void)
{
    static const struct {
        const char *bytes;
        size_t len;
        const char *why;
    } cases[] = {
        {"\x0a\x05", 2, "runs past the end"},
        {"\x0a\xff\xff\xff\xff\x0f", 6, "runs past the end"},
        {"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11, "runs past the end"},
        {"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12, "cut short"},
        {"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12, "varint"},
        {"\x08", 1, "varint"},
        {"\x09\x00", 2, "8 bytes needed"},
        {"\x0d\x00", 2, "4 bytes needed"},
        {"\x00\x00", 2, "numbered 0"},
        {"\x0e", 1, "wire type 6"},
        {"\x0f", 1, "wire type 7"},
        {"\x0c", 1, "end-group"},
        {"\x0b", 1, "not closed"},
        {"\x0b\x14", 2, "end-group"},
        {"\x88\x80\x80\x80\x80\x00\x00", 7, "tag"},
        {"\x88\x80\x80\x80\x10\x00", 6, "tag"},
        {"\x88\x80\x80", 3, "tag"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        wbuf top = {0};
        put(&top, cases[i].bytes, cases[i].len);
        expect_refused(COMET_OTLP_LOGS, &top, cases[i].why);
        free(top.p);
        /* the same inside a record, four messages down */
        wbuf deep = log_with(cases[i].bytes, cases[i].len);
        expect_refused(COMET_OTLP_LOGS, &deep, cases[i].why);
        free(deep.p);
    }
    /* invalid UTF-8 in a known string field; fine in bytes and unknown fields */
    static const char *bad[] = {"\xff", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82",
                                "\xf0\x9f\x98", "\xe2\x82\x28", "ok\xf0\x9f\x98\x80\x80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        wbuf f = {0};
        str(&f, 3, bad[i]);
        wbuf req = log_with(f.p, f.len);
        expect_refused(COMET_OTLP_LOGS, &req, "not valid UTF-8");
        free(req.p);
        f.len = 0;
        str(&f, 9, bad[i]);
        str(&f, 40, bad[i]);
        req = log_with(f.p, f.len);
        comet_otlp_result res;
        CHECK(decode(COMET_OTLP_LOGS, &req, 0, &res) == 0 && res.count == 0 && res.rejected == 1);
        comet_otlp_free(&res);
        free(req.p);
        free(f.p);
    }
    /* packed fixed64 of 7 bytes; a packed varint cut short */
    wbuf pt = {0}, data = {0}, m = {0}, recs = {0}, res = {0}, scope = {0};
    bytes_field(&pt, 6, "1234567", 7);
    sub(&data, 1, &pt);
    sub(&m, 9, &data);
    sub(&recs, 2, &m);
    wbuf req = request(&res, &scope, &recs);
    expect_refused(COMET_OTLP_METRICS, &req, "8-byte values");
    free(req.p);
    bytes_field(&pt, 2, "\x05\x80", 2);
    sub(&data, 9, &pt); /* Buckets as the positive field of an exponential point */
    sub(&m, 1, &data);
    wbuf exp = {0};
    sub(&exp, 10, &m);
    sub(&recs, 2, &exp);
    req = request(&res, &scope, &recs);
    expect_refused(COMET_OTLP_METRICS, &req, "packed varint");
    free(req.p);
}

static void test_depth(void)
{
    /* the layout's limit: 32 levels of arrays in a value */
    wbuf req = nested_body(COMET_OTLP_MAX_DEPTH, "", 0);
    comet_otlp_result res;
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, 0, &res));
    CHECK(res.count == 1);
    comet_otlp_free(&res);
    free(req.p);
    req = nested_body(COMET_OTLP_MAX_DEPTH + 1, "", 0);
    expect_refused(COMET_OTLP_LOGS, &req, "nests deeper than 32 levels");
    free(req.p);
    /* upb's: 100 levels of messages and groups below the request; the body
     * is 4 down, each array adds 2 */
    req = nested_body(48, "", 0);
    expect_refused(COMET_OTLP_LOGS, &req, "deeper than 32"); /* the layout's first */
    free(req.p);
    req = nested_body(48, "\x2a\x00", 2);
    expect_refused(COMET_OTLP_LOGS, &req, "deeper than 100 levels");
    free(req.p);
    req = nested_body(47, "\xa3\x01\xab\x01\xac\x01\xa4\x01", 8);
    expect_refused(COMET_OTLP_LOGS, &req, "deeper than 32");
    free(req.p);
    req = nested_body(47, "\xa3\x01\xab\x01\xb3\x01\xb4\x01\xac\x01\xa4\x01", 12);
    expect_refused(COMET_OTLP_LOGS, &req, "deeper than 100 levels");
    free(req.p);
    /* key_strindex, string_value_strindex */
    wbuf k = {0}, kvs = {0};
    uint_field(&k, 3, 1);
    sub(&kvs, 6, &k);
    req = log_with(kvs.p, kvs.len);
    expect_refused(COMET_OTLP_LOGS, &req, "key_strindex");
    free(req.p);
    kvs.len = 0;
    uint_field(&k, 3, (uint64_t)1 << 32); /* an int32: 0 */
    sub(&kvs, 6, &k);
    req = log_with(kvs.p, kvs.len);
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, 0, &res));
    comet_otlp_free(&res);
    free(req.p);
    free(kvs.p);
    req = nested_body(3, "\x40\x00", 2);
    expect_refused(COMET_OTLP_LOGS, &req, "string_value_strindex");
    free(req.p);
}

/* ---- rejected records ---------------------------------------------------------- */

static void test_rejected_records(void)
{
    wbuf res = {0}, scope = {0}, recs = {0}, rec = {0};
    for (int i = 0; i < 3; i++) {
        bytes_field(&rec, 9, TRACE_ID, i == 1 ? 15 : 16);
        sub(&recs, 2, &rec);
    }
    wbuf req = request(&res, &scope, &recs);
    comet_otlp_result out;
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, 0, &out));
    CHECK(out.count == 2 && out.rejected == 1);
    CHECK(strcmp(out.reason, "log record 1: trace_id has 15 bytes, not 16") == 0);
    size_t one = out.events_len / 2 - 1; /* each event's length without its line break */
    comet_otlp_free(&out);
    /* max_event_bytes: an event of exactly the limit passes, one byte less rejects */
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, (uint32_t)one, &out));
    CHECK(out.count == 2 && out.rejected == 1);
    comet_otlp_free(&out);
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, (uint32_t)one - 1, &out));
    CHECK(out.count == 0 && out.rejected == 3 && out.events_len == 0);
    CHECK(strstr(out.reason, "log record 0: its event is") && strstr(out.reason, "above max_entry_bytes"));
    comet_otlp_free(&out);
    free(req.p);
    /* far above the limit: writing stops there (a long key in a resource
     * shared by many records, a long key over many bytes values) */
    static char key[20000];
    memset(key, 'k', sizeof key - 1);
    wbuf v = {0}, map = {0};
    for (int i = 0; i < 200; i++) {
        char name[16];
        snprintf(name, sizeof name, "b%d", i);
        bytes_field(&v, 7, "x", 1);
        kv(&map, 1, name, &v);
    }
    sub(&v, 6, &map);
    kv(&rec, 6, key, &v);
    sub(&recs, 2, &rec);
    sub(&recs, 2, &rec); /* an empty record */
    req = request(&res, &scope, &recs);
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, 1000, &out));
    CHECK(out.count == 1 && out.rejected == 1);
    CHECK(strcmp(out.reason, "log record 0: its event is longer than max_entry_bytes (1000)") == 0);
    comet_otlp_free(&out);
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, 0, &out));
    CHECK(out.count == 2 && out.events_len > 200 * sizeof key); /* 200 pointers through the key */
    comet_otlp_free(&out);
    free(req.p);
    kv_string(&res, 1, key, "");
    for (int i = 0; i < 100; i++)
        sub(&recs, 2, &rec);
    req = request(&res, &scope, &recs);
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, 1000, &out));
    CHECK(out.count == 0 && out.rejected == 100);
    comet_otlp_free(&out);
    /* the nesting limit still refuses the request past max_event_bytes */
    wbuf deep = nested_body(COMET_OTLP_MAX_DEPTH + 1, "", 0);
    wbuf both = {0};
    put(&both, req.p, req.len);
    put(&both, deep.p, deep.len);
    CHECK(decode(COMET_OTLP_LOGS, &both, 1000, &out) == COMET_E_BAD_OTLP);
    comet_otlp_free(&out);
    free(both.p);
    free(deep.p);
    free(req.p);
}

/* ---- robustness ----------------------------------------------------------------- */

static void decode_any(int32_t signal, const wbuf *body)
{
    comet_otlp_result res;
    int rc = decode(signal, body, 0, &res);
    CHECK(rc == 0 || rc == COMET_E_BAD_OTLP);
    comet_otlp_free(&res);
}

/* max_output_bytes bounds all events together, line breaks included: at
 * exactly their size the request decodes, one byte less refuses it whole. */
static void test_max_output(void)
{
    wbuf res = {0}, scope = {0}, recs = {0}, rec = {0};
    kv_string(&res, 1, "service.name", "svc");
    for (int i = 0; i < 50; i++)
        sub(&recs, 2, &rec);
    wbuf req = request(&res, &scope, &recs);
    comet_otlp_result out;
    CHECK_OK(decode(COMET_OTLP_LOGS, &req, 0, &out));
    uint64_t total = out.events_len;
    CHECK(out.count == 50 && total > 50 * req.len / 50);
    comet_otlp_free(&out);
    for (uint32_t max_event = 0; max_event <= 100000; max_event += 100000) {
        CHECK(comet_otlp_decode(COMET_OTLP_LOGS, req.p, req.len, max_event, total, &out) == 0);
        CHECK(out.count == 50 && out.events_len == total);
        comet_otlp_free(&out);
        CHECK(comet_otlp_decode(COMET_OTLP_LOGS, req.p, req.len, max_event, total - 1, &out) ==
              COMET_E_BATCH_TOO_LARGE);
        CHECK(out.events == NULL && out.count == 0);
        CHECK(strstr(comet_last_error(), "take more than") != NULL);
        comet_otlp_free(&out);
    }
    free(req.p);
}

static void test_truncations_and_mutations(void)
{
    wbuf reqs[3] = {log_request(), {0}, {0}};
    /* a traces and a metrics request: the log request's bytes read as them,
     * and the earlier tests' richer ones are covered by mutation below */
    wbuf res = {0}, scope = {0}, recs = {0}, sp = {0};
    bytes_field(&sp, 1, TRACE_ID, 16);
    kv_double(&sp, 9, "x", 0.1);
    sub(&recs, 2, &sp);
    reqs[1] = request(&res, &scope, &recs);
    wbuf m = {0}, data = {0}, pt = {0};
    double_field(&pt, 4, 3.25);
    kv_string(&pt, 7, "k", "v");
    sub(&data, 1, &pt);
    sub(&m, 5, &data);
    sub(&recs, 2, &m);
    reqs[2] = request(&res, &scope, &recs);
    uint32_t seed = 20250101;
    for (int s = 0; s < 3; s++) {
        const wbuf *r = &reqs[s];
        comet_otlp_result whole;
        CHECK_OK(decode(s + 1, r, 0, &whole));
        CHECK(whole.count == 1);
        comet_otlp_free(&whole);
        for (size_t n = 0; n < r->len; n++) {
            wbuf cut = {r->p, n, n};
            for (int32_t signal = 1; signal <= 3; signal++)
                decode_any(signal, &cut);
        }
        wbuf copy = {malloc(r->len + 8), 0, r->len + 8};
        CHECK(copy.p != NULL);
        for (int i = 0; i < 3000; i++) {
            memcpy(copy.p, r->p, r->len);
            copy.len = r->len;
            for (int k = 0; k < 1 + i % 3; k++) {
                seed = seed * 1103515245 + 12345;
                size_t at = (seed >> 8) % copy.len;
                switch ((seed >> 4) % 3) {
                case 0: copy.p[at] ^= (uint8_t)(1 << (seed >> 28) % 8); break;
                case 1: copy.p[at] = (uint8_t)(seed >> 16); break;
                default: copy.len = at + 1;
                }
            }
            decode_any(s + 1, &copy);
        }
        free(copy.p);
        free(reqs[s].p);
    }
}

static void test_api(void)
{
    comet_otlp_result res;
    CHECK(comet_otlp_decode(0, (const uint8_t *)"", 0, 0, 0, &res) == COMET_E_INVALID);
    CHECK(comet_otlp_decode(4, (const uint8_t *)"", 0, 0, 0, &res) == COMET_E_INVALID);
    CHECK(comet_otlp_decode(1, NULL, 3, 0, 0, &res) == COMET_E_INVALID);
    CHECK(comet_otlp_decode(1, NULL, 0, 0, 0, NULL) == COMET_E_INVALID);
    CHECK(comet_otlp_decode(1, NULL, 0, 0, 0, &res) == 0 && res.count == 0 && !res.has_key);
    comet_otlp_free(&res);
    comet_otlp_free(NULL);
    CHECK(strcmp(comet_strerror(COMET_E_BAD_OTLP), "invalid OTLP request") == 0);
    wbuf top = {0};
    put(&top, "\x0a\x05", 2);
    CHECK(comet_otlp_decode(1, top.p, top.len, 0, 0, &res) == COMET_E_BAD_OTLP);
    CHECK(strstr(comet_last_error(), "at byte 0: field 1 of an ExportLogsServiceRequest") != NULL);
    free(top.p);
}

/* Every allocation of a decode failing in turn: COMET_E_NOMEM, no leak. */
static void test_allocation_failures(void)
{
    wbuf req = log_request();
    /* many records, merged messages and value types: every allocating path */
    wbuf body = {0}, v = {0}, arr = {0}, elem = {0};
    put(&body, req.p, req.len);
    for (int i = 0; i < 40; i++) {
        str(&elem, 1, "a string long enough to make the buffers grow more than once");
        sub(&arr, 1, &elem);
        sub(&v, 5, &arr);
        wbuf k = {0}, kvs = {0}, rec = {0};
        str(&k, 1, "k");
        sub(&k, 2, &v);
        bytes_field(&k, 2, "\x3a\x01\x00", 3); /* the value again, bytes: merged */
        sub(&kvs, 6, &k);
        put(&rec, kvs.p, kvs.len);
        free(kvs.p);
        wbuf recs = {0}, res = {0}, scope = {0};
        sub(&recs, 2, &rec);
        wbuf one = request(&res, &scope, &recs);
        put(&body, one.p, one.len);
        free(one.p);
    }
    comet_otlp_result out;
    CHECK_OK(decode(COMET_OTLP_LOGS, &body, 0, &out));
    CHECK(out.count == 41);
    comet_otlp_free(&out);
    int failed = 0;
    for (long n = 1;; n++) {
        fault_once(COMET_FAULT_ALLOC, n, ENOMEM);
        int rc = decode(COMET_OTLP_LOGS, &body, 0, &out);
        long fired = comet_fault_fired();
        comet_fault_clear();
        comet_otlp_free(&out);
        if (!fired) {
            CHECK(rc == 0);
            break;
        }
        CHECK(rc == COMET_E_NOMEM);
        failed++;
    }
    CHECK(failed > 5);
    free(body.p);
    free(req.p);
}

int main(void)
{
    RUN(test_logs);
    RUN(test_traces);
    RUN(test_metrics);
    RUN(test_resource_and_scope_extras);
    RUN(test_merges_and_unknown_fields);
    RUN(test_wire_refusals);
    RUN(test_depth);
    RUN(test_rejected_records);
    RUN(test_max_output);
    RUN(test_truncations_and_mutations);
    RUN(test_api);
    RUN(test_allocation_failures);
    return 0;
}
