/* Stored events back into OTLP export requests (otlp_encode.c, jsonread.c)
 * under the sanitizers: groups as the producer made them, the layout's
 * variations a stored event may have (keys in any order, whitespace, absent
 * keys), every way an event can break the layout (each reported, the others
 * encoded), plain events as log bodies, random mutations of valid events
 * (whatever is encoded must decode), every allocation failing in turn, and
 * the API's refusals.  Round trips of every request of test_otlp.c are made
 * there (otlp_roundtrip.h); the differential test against the reference on
 * the protobuf library is tests/test_otlp_encode.py. */
#include <errno.h>

#include "otlp_roundtrip.h"
#include "util.h"

static const char *RES = "\"resource\":{\"attributes\":{\"service.name\":\"a\"}},"
                         "\"scope\":{\"name\":\"s\",\"version\":\"\",\"attributes\":{}}";

typedef struct encoded {
    comet_otlp_encoded e;
    uint8_t *data;
    int32_t *offsets;
} encoded;

static void encode_lines(int32_t signal, uint32_t flags, const char *ndjson, encoded *out)
{
    uint32_t n = split_lines(ndjson, &out->data, &out->offsets);
    int64_t *stamps = malloc((n + 1) * sizeof *stamps);
    CHECK(stamps != NULL);
    for (uint32_t i = 0; i < n; i++)
        stamps[i] = 1700000000000000000LL + i;
    const uint8_t resource[] = {0x0a, 0x0a, 0x0a, 0x01, 'k', 0x12, 0x05, 0x0a, 0x03, 'e', 'v', 's'};
    CHECK_OK(comet_otlp_encode(signal, flags, out->data, out->offsets, stamps, n,
                               flags ? resource : NULL, flags ? sizeof resource : 0, &out->e));
    free(stamps);
}

static void encoded_free(encoded *out)
{
    comet_otlp_encoded_free(&out->e);
    free(out->data);
    free(out->offsets);
}

/* Occurrences of field `num` at the top of a message (every field there is
 * length-delimited in an export request and its groups). */
static int count_fields(const uint8_t *p, size_t len, uint32_t num, const uint8_t **first)
{
    int n = 0;
    size_t i = 0;
    while (i < len) {
        uint64_t tag = 0, size = 0;
        for (int shift = 0;; shift += 7) {
            tag |= (uint64_t)(p[i] & 0x7f) << shift;
            if (!(p[i++] & 0x80))
                break;
        }
        CHECK((tag & 7) == 2);
        for (int shift = 0;; shift += 7) {
            size |= (uint64_t)(p[i] & 0x7f) << shift;
            if (!(p[i++] & 0x80))
                break;
        }
        if (tag >> 3 == num) {
            if (!n && first)
                *first = p + i;
            n++;
        }
        i += size;
    }
    CHECK(i == len);
    return n;
}

static void test_groups(void)
{
    char buf[4096];
    /* resources a, a, b, a: three groups; the scope changes within the first */
    snprintf(buf, sizeof buf,
             "{%s,\"time_unix_nano\":1}\n"
             "{\"resource\":{\"attributes\":{\"service.name\":\"a\"}},\"scope\":{\"name\":\"t\"},\"time_unix_nano\":2}\n"
             "{\"resource\":{\"attributes\":{\"service.name\":\"b\"}},\"scope\":{},\"time_unix_nano\":3}\n"
             "{%s,\"time_unix_nano\":4}\n",
             RES, RES);
    encoded enc;
    encode_lines(COMET_OTLP_LOGS, 0, buf, &enc);
    CHECK(enc.e.count == 4 && enc.e.rejected == 0);
    const uint8_t *group;
    CHECK(count_fields(enc.e.data, enc.e.len, 1, &group) == 3);
    encoded_free(&enc);

    /* keys in another order, whitespace, 1.0 and 1.00: one group */
    snprintf(buf, sizeof buf,
             "{\"scope\":{\"name\":\"s\"},\"resource\":{\"attributes\":{\"d\":1.0}},\"time_unix_nano\":1}\n"
             "{ \"resource\" : { \"attributes\" : { \"d\" : 1.00 } } , \"scope\":{\"name\":\"s\"} }\n");
    encode_lines(COMET_OTLP_LOGS, 0, buf, &enc);
    CHECK(enc.e.count == 2 && count_fields(enc.e.data, enc.e.len, 1, NULL) == 1);
    encoded_free(&enc);

    /* a bytes attribute and a string attribute of the same text: two groups */
    snprintf(buf, sizeof buf,
             "{\"resource\":{\"attributes\":{\"r\":\"AAE=\"}},\"scope\":{},\"value_types\":{\"/resource/attributes/r\":\"bytes\"}}\n"
             "{\"resource\":{\"attributes\":{\"r\":\"AAE=\"}},\"scope\":{}}\n"
             "{\"resource\":{\"attributes\":{\"r\":\"AAE=\"}},\"scope\":{}}\n");
    encode_lines(COMET_OTLP_LOGS, 0, buf, &enc);
    CHECK(enc.e.count == 3 && count_fields(enc.e.data, enc.e.len, 1, NULL) == 2);
    encoded_free(&enc);

    /* points of one metric share it; another metric opens a new one */
    const char *point = "\"attributes\":{},\"start_time_unix_nano\":0,\"time_unix_nano\":5,\"flags\":0,"
                        "\"value\":1,\"exemplars\":[]";
    snprintf(buf, sizeof buf,
             "{%s,\"metric\":{\"name\":\"m\",\"description\":\"\",\"unit\":\"\",\"type\":\"sum\","
             "\"aggregation_temporality\":2,\"is_monotonic\":true},%s}\n"
             "{%s,\"metric\":{\"name\":\"m\",\"description\":\"\",\"unit\":\"\",\"type\":\"sum\","
             "\"aggregation_temporality\":2,\"is_monotonic\":true},%s}\n"
             "{%s,\"metric\":{\"name\":\"n\",\"description\":\"\",\"unit\":\"\",\"type\":\"gauge\"},%s}\n",
             RES, point, RES, point, RES, point);
    encode_lines(COMET_OTLP_METRICS, 0, buf, &enc);
    CHECK(enc.e.count == 3 && count_fields(enc.e.data, enc.e.len, 1, &group) == 1);
    comet_otlp_result back;
    CHECK_OK(comet_otlp_decode(COMET_OTLP_METRICS, enc.e.data, enc.e.len, 0, 0, &back));
    CHECK(back.count == 3);
    comet_otlp_free(&back);
    encoded_free(&enc);
}

/* Stored events need not be the decoder's text: absent keys are their
 * defaults, numbers may be integers where doubles are, ids may be upper case. */
static void test_variations(void)
{
    char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"resource\":{\"attributes\":{}},\"scope\":{\"name\":\"\",\"version\":\"\",\"attributes\":{}},"
             "\"trace_id\":\"000102030405060708090A0B0C0D0E0F\",\"body\":\"x\"}\n");
    encoded enc;
    encode_lines(COMET_OTLP_LOGS, 0, buf, &enc);
    CHECK(enc.e.count == 1);
    comet_otlp_result back;
    CHECK_OK(comet_otlp_decode(COMET_OTLP_LOGS, enc.e.data, enc.e.len, 0, 0, &back));
    CHECK(strstr((const char *)back.events, "\"trace_id\":\"000102030405060708090a0b0c0d0e0f\""));
    CHECK(strstr((const char *)back.events, "\"body\":\"x\""));
    comet_otlp_free(&back);
    encoded_free(&enc);

    snprintf(buf, sizeof buf,
             "{%s,\"metric\":{\"name\":\"h\",\"description\":\"\",\"unit\":\"\",\"type\":\"histogram\","
             "\"aggregation_temporality\":1},\"count\":3,\"sum\":5,\"bucket_counts\":[1,2],"
             "\"explicit_bounds\":[1,\"Infinity\"],\"min\":null,\"max\":\"NaN\"}\n"
             "{%s,\"metric\":{\"name\":\"s\",\"description\":\"\",\"unit\":\"\",\"type\":\"summary\"},"
             "\"count\":1,\"sum\":-0.5,\"quantile_values\":[{\"quantile\":0.5,\"value\":2}]}\n"
             "{%s,\"metric\":{\"name\":\"e\",\"description\":\"\",\"unit\":\"\",\"type\":\"exponential_histogram\","
             "\"aggregation_temporality\":2},\"count\":2,\"scale\":-3,\"zero_count\":1,\"zero_threshold\":0.25,"
             "\"positive\":{\"offset\":-2,\"bucket_counts\":[1]},\"negative\":{\"offset\":0,\"bucket_counts\":[]},"
             "\"exemplars\":[{\"value\":-7,\"filtered_attributes\":{\"k\":[]}}]}\n",
             RES, RES, RES);
    encode_lines(COMET_OTLP_METRICS, 0, buf, &enc);
    if (enc.e.rejected)
        fprintf(stderr, "%s\n", enc.e.reasons);
    CHECK(enc.e.count == 3 && enc.e.rejected == 0);
    CHECK_OK(comet_otlp_decode(COMET_OTLP_METRICS, enc.e.data, enc.e.len, 0, 0, &back));
    const char *ev = (const char *)back.events;
    CHECK(strstr(ev, "\"sum\":5.0,\"bucket_counts\":[1,2],\"explicit_bounds\":[1.0,\"Infinity\"],\"min\":null,\"max\":\"NaN\""));
    CHECK(strstr(ev, "\"quantile_values\":[{\"quantile\":0.5,\"value\":2.0}]"));
    CHECK(strstr(ev, "\"scale\":-3,\"zero_count\":1,\"zero_threshold\":0.25,\"positive\":{\"offset\":-2,\"bucket_counts\":[1]}"));
    CHECK(strstr(ev, "\"exemplars\":[{\"filtered_attributes\":{\"k\":[]},\"time_unix_nano\":0,\"value\":-7,"));
    comet_otlp_free(&back);
    encoded_free(&enc);

    snprintf(buf, sizeof buf,
             "{%s,\"trace_id\":\"000102030405060708090a0b0c0d0e0f\",\"span_id\":\"0001020304050607\","
             "\"kind\":2,\"status\":{\"code\":2,\"message\":\"e\"},\"events\":[{\"name\":\"x\",\"time_unix_nano\":3}],"
             "\"links\":[{\"trace_id\":\"\",\"span_id\":\"\",\"flags\":256,\"attributes\":{\"a\":\"\\u00e9\\ud83d\\ude00\"}}]}\n",
             RES);
    encode_lines(COMET_OTLP_TRACES, 0, buf, &enc);
    CHECK(enc.e.count == 1);
    CHECK_OK(comet_otlp_decode(COMET_OTLP_TRACES, enc.e.data, enc.e.len, 0, 0, &back));
    ev = (const char *)back.events;
    CHECK(strstr(ev, "\"events\":[{\"time_unix_nano\":3,\"name\":\"x\",\"attributes\":{}}]"));
    CHECK(strstr(ev, "\"attributes\":{\"a\":\"\xc3\xa9\xf0\x9f\x98\x80\"},\"flags\":256}]"));
    CHECK(strstr(ev, "\"status\":{\"code\":2,\"message\":\"e\"}"));
    comet_otlp_free(&back);
    encoded_free(&enc);
}

/* Each event breaks the layout in its own way: left out with a reason; the
 * good event between them is encoded. */
static void test_rejected_events(void)
{
    static const struct {
        int32_t signal;
        const char *event, *why;
    } bad[] = {
        {COMET_OTLP_LOGS, "[1]", "the event is not an object"},
        {COMET_OTLP_LOGS, "{}x", "bytes after its end"},
        {COMET_OTLP_LOGS, "{\"time_unix_nano\":\"1\"}", "time_unix_nano has the wrong type"},
        {COMET_OTLP_LOGS, "{\"time_unix_nano\":-1}", "time_unix_nano is out of range"},
        {COMET_OTLP_LOGS, "{\"time_unix_nano\":1.5}", "time_unix_nano has the wrong type"},
        {COMET_OTLP_LOGS, "{\"time_unix_nano\":18446744073709551616}", "out of range"},
        {COMET_OTLP_LOGS, "{\"severity_number\":2147483648}", "severity_number is out of range"},
        {COMET_OTLP_LOGS, "{\"flags\":4294967296}", "flags is out of range"},
        {COMET_OTLP_LOGS, "{\"trace_id\":\"0001\"}", "trace_id is not empty nor of the right length"},
        {COMET_OTLP_LOGS, "{\"span_id\":\"000102030405060g\"}", "span_id is not hex"},
        {COMET_OTLP_LOGS, "{\"severity_text\":null}", "severity_text has the wrong type"},
        {COMET_OTLP_LOGS, "{\"body\":\"\\ud800\"}", "lone surrogate"},
        {COMET_OTLP_LOGS, "{\"body\":\"\xff\"}", "not valid UTF-8"},
        {COMET_OTLP_LOGS, "{\"body\":\"a\\x\"}", "invalid escape"},
        {COMET_OTLP_LOGS, "{\"body\":1e}", "a digit must follow the exponent"},
        {COMET_OTLP_LOGS, "{\"body\":9223372036854775808}", "an integer value is out of range"},
        {COMET_OTLP_LOGS, "{\"body\":\"AA\",\"value_types\":{\"/body\":\"bytes\"}}", "not base64"},
        {COMET_OTLP_LOGS, "{\"body\":\"A*A=\",\"value_types\":{\"/body\":\"bytes\"}}", "not base64"},
        {COMET_OTLP_LOGS, "{\"body\":\"x\",\"value_types\":{\"/body\":\"double\"}}", "wrong type"},
        {COMET_OTLP_LOGS, "{\"value_types\":{\"/body\":\"int\"}}", "unknown type"},
        {COMET_OTLP_LOGS, "{\"value_types\":[]}", "value_types is not an object"},
        {COMET_OTLP_LOGS, "{\"attributes\":[]}", "attributes has the wrong type"},
        {COMET_OTLP_LOGS, "{\"attributes\":{\"a\":1,}}", "a string was expected"},
        {COMET_OTLP_LOGS, "{\"resource\":1}", "resource is not an object"},
        {COMET_OTLP_LOGS, "{\"resource\":{\"entity_refs\":{}}}", "entity_refs is not an array"},
        {COMET_OTLP_LOGS, "{\"resource\":{\"entity_refs\":[{\"id_keys\":[1]}]}}", "id_keys has the wrong type"},
        {COMET_OTLP_LOGS, "{\"scope\":{\"name\":7}}", "scope name has the wrong type"},
        {COMET_OTLP_LOGS,
         "{\"body\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", "deeper than 32"},
        {COMET_OTLP_TRACES, "{\"events\":{}}", "events is not an array"},
        {COMET_OTLP_TRACES, "{\"links\":[{\"span_id\":\"00\"}]}", "a link's span_id"},
        {COMET_OTLP_TRACES, "{\"status\":{\"code\":\"ok\"}}", "status code has the wrong type"},
        {COMET_OTLP_TRACES, "{\"kind\":true}", "kind has the wrong type"},
        {COMET_OTLP_METRICS, "{\"value\":1}", "metric is missing"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"counter\"}}", "not a metric type"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"gauge\",\"is_monotonic\":1}}", "is_monotonic has the wrong type"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"gauge\"},\"value\":\"one\"}", "value has the wrong type"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"gauge\"},\"value\":-9223372036854775809}", "value is out of range"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"histogram\"},\"bucket_counts\":[-1]}", "bucket_counts has the wrong type"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"histogram\"},\"explicit_bounds\":{}}", "explicit_bounds is not an array"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"summary\"},\"sum\":\"Inf\"}", "sum has the wrong type"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"exponential_histogram\"},\"scale\":2147483648}", "scale is out of range"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"exponential_histogram\"},\"positive\":[]}", "positive is not an object"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"gauge\"},\"exemplars\":[{\"trace_id\":\"0\"}]}", "trace_id is not empty"},
        {COMET_OTLP_METRICS, "{\"metric\":{\"type\":\"summary\"},\"quantile_values\":[{\"quantile\":null}]}", "quantile has the wrong type"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[1024];
        const char *good = bad[i].signal == COMET_OTLP_METRICS
                               ? "{\"metric\":{\"type\":\"gauge\"},\"value\":1.5}"
                               : "{}";
        snprintf(buf, sizeof buf, "%s\n%s\n%s\n", good, bad[i].event, good);
        encoded enc;
        encode_lines(bad[i].signal, 0, buf, &enc);
        if (enc.e.rejected != 1 || enc.e.rejected_index[0] != 1 || !strstr(enc.e.reasons, bad[i].why)) {
            fprintf(stderr, "%s: rejected %u, reason '%s', wanted '%s'\n", bad[i].event,
                    enc.e.rejected, enc.e.rejected ? enc.e.reasons : "", bad[i].why);
            CHECK(0);
        }
        CHECK(enc.e.count == 2);
        comet_otlp_result back;
        CHECK_OK(comet_otlp_decode(bad[i].signal, enc.e.data, enc.e.len, 0, 0, &back));
        CHECK(back.count == 2);
        comet_otlp_free(&back);
        encoded_free(&enc);
    }
}

/* Plain events: each payload the body of a log record, JSON values with
 * their types; what protobuf cannot carry as a value, the payload itself. */
static void test_plain_events(void)
{
    encoded enc;
    encode_lines(COMET_OTLP_LOGS, COMET_OTLP_PLAIN,
                 "{\"level\":\"info\",\"n\":3,\"x\":2.5,\"ok\":true,\"tags\":[\"a\",null]}\n"
                 "42\n"
                 "123456789012345678901234567890\n"
                 "not json\n"
                 "\"\\ud800\"\n"
                 "\xff\xfe\n"
                 "\n",
                 &enc);
    CHECK(enc.e.count == 7 && enc.e.rejected == 0);
    CHECK(count_fields(enc.e.data, enc.e.len, 1, NULL) == 1);
    comet_otlp_result back;
    CHECK_OK(comet_otlp_decode(COMET_OTLP_LOGS, enc.e.data, enc.e.len, 0, 0, &back));
    const char *ev = (const char *)back.events;
    CHECK(strstr(ev, "{\"resource\":{\"attributes\":{\"k\":\"evs\"}},\"scope\":{\"name\":\"\",\"version\":\"\","
                     "\"attributes\":{}},\"time_unix_nano\":1700000000000000000,"
                     "\"observed_time_unix_nano\":1700000000000000000,"));
    CHECK(strstr(ev, "\"body\":{\"level\":\"info\",\"n\":3,\"x\":2.5,\"ok\":true,\"tags\":[\"a\",null]}"));
    CHECK(strstr(ev, "\"body\":42,"));
    CHECK(strstr(ev, "\"body\":\"123456789012345678901234567890\""));
    CHECK(strstr(ev, "\"body\":\"not json\""));
    CHECK(strstr(ev, "\"body\":\"\\\"\\\\ud800\\\"\""));
    CHECK(strstr(ev, "\"body\":\"//4=\""));
    CHECK(strstr(ev, "\"body\":\"\","));
    comet_otlp_free(&back);
    encoded_free(&enc);
}

/* Random changes to valid events: never a crash; whatever is encoded decodes. */
static void test_mutations(void)
{
    static const char *events[] = {
        "{\"resource\":{\"attributes\":{\"service.name\":\"a\",\"b\":\"AAE=\"},\"entity_refs\":[{\"type\":\"t\",\"id_keys\":[\"k\"]}]},"
        "\"scope\":{\"name\":\"s\"},\"time_unix_nano\":1,\"body\":{\"m\":[1,2.5,\"x\\n\",true,null,{\"d\":\"NaN\"}]},"
        "\"attributes\":{\"k~/\":-3},\"trace_id\":\"000102030405060708090a0b0c0d0e0f\","
        "\"value_types\":{\"/resource/attributes/b\":\"bytes\",\"/body/m/5/d\":\"double\"}}",
        "{\"resource\":{},\"scope\":{},\"trace_id\":\"000102030405060708090a0b0c0d0e0f\",\"span_id\":\"0001020304050607\","
        "\"events\":[{\"name\":\"e\",\"attributes\":{\"a\":1}}],\"links\":[{\"trace_state\":\"t\",\"flags\":1}],"
        "\"status\":{\"code\":1,\"message\":\"m\"}}",
        "{\"resource\":{},\"scope\":{},\"metric\":{\"name\":\"e\",\"type\":\"exponential_histogram\","
        "\"aggregation_temporality\":2,\"metadata\":{\"x\":\"y\"}},\"count\":2,\"scale\":-3,\"zero_threshold\":0.25,"
        "\"positive\":{\"offset\":-2,\"bucket_counts\":[1]},\"exemplars\":[{\"value\":1.5,\"span_id\":\"\"}]}",
    };
    uint32_t seed = 20261207;
    for (int s = 0; s < 3; s++) {
        size_t len = strlen(events[s]);
        uint8_t *copy = malloc(len);
        CHECK(copy != NULL);
        int encoded_some = 0;
        for (int i = 0; i < 4000; i++) {
            memcpy(copy, events[s], len);
            size_t n = len;
            for (int k = 0; k < 1 + i % 3; k++) {
                seed = seed * 1103515245 + 12345;
                size_t at = (seed >> 8) % n;
                switch ((seed >> 4) % 4) {
                case 0: copy[at] ^= (uint8_t)(1 << (seed >> 28) % 8); break;
                case 1: copy[at] = "{}[]\",:0-1e.\\u"[(seed >> 16) % 15]; break;
                case 2: copy[at] = (uint8_t)(seed >> 16); break;
                default: n = at + 1;
                }
            }
            /* the payload alone in a heap block of its size: a read past it is a report */
            uint8_t *exact = malloc(n);
            CHECK(exact != NULL);
            memcpy(exact, copy, n);
            int32_t offsets[2] = {0, (int32_t)n};
            int64_t stamp = 5;
            for (uint32_t flags = 0; flags <= (s == 0 ? COMET_OTLP_PLAIN : 0); flags++) {
                comet_otlp_encoded enc;
                CHECK_OK(comet_otlp_encode(s + 1, flags, exact, offsets, &stamp, 1,
                                           (const uint8_t *)"", 0, &enc));
                CHECK(enc.count + enc.rejected == 1);
                CHECK(enc.rejected == 0 || enc.reasons[0]);
                comet_otlp_result back;
                CHECK_OK(comet_otlp_decode(s + 1, enc.data, enc.len, 0, 0, &back));
                CHECK(back.count == enc.count);
                encoded_some += enc.count;
                comet_otlp_free(&back);
                comet_otlp_encoded_free(&enc);
            }
            free(exact);
        }
        CHECK(encoded_some > 100);
        free(copy);
    }
}

static void test_allocation_failures(void)
{
    char buf[8192];
    size_t w = 0;
    for (int i = 0; i < 30; i++)
        w += (size_t)snprintf(buf + w, sizeof buf - w,
                              "{\"resource\":{\"attributes\":{\"r\":%d}},\"scope\":{},\"body\":\"AAE=\","
                              "\"value_types\":{\"/body\":\"bytes\",\"/x%d\":\"bytes\"}}\n%s\n",
                              i % 3, i, i % 5 ? "{}" : "[]");
    uint8_t *data;
    int32_t *offsets;
    uint32_t n = split_lines(buf, &data, &offsets);
    comet_otlp_encoded enc;
    CHECK_OK(comet_otlp_encode(COMET_OTLP_LOGS, 0, data, offsets, NULL, n, NULL, 0, &enc));
    CHECK(enc.count == 54 && enc.rejected == 6);
    comet_otlp_encoded_free(&enc);
    int failed = 0;
    for (long k = 1;; k++) {
        fault_once(COMET_FAULT_ALLOC, k, ENOMEM);
        int rc = comet_otlp_encode(COMET_OTLP_LOGS, 0, data, offsets, NULL, n, NULL, 0, &enc);
        long fired = comet_fault_fired();
        comet_fault_clear();
        comet_otlp_encoded_free(&enc);
        if (!fired) {
            CHECK(rc == 0);
            break;
        }
        CHECK(rc == COMET_E_NOMEM);
        failed++;
    }
    CHECK(failed > 5);
    free(data);
    free(offsets);
}

static void test_api(void)
{
    comet_otlp_encoded enc;
    int32_t offsets[2] = {0, 2};
    int64_t stamp = 0;
    const uint8_t *data = (const uint8_t *)"{}";
    CHECK(comet_otlp_encode(0, 0, data, offsets, NULL, 1, NULL, 0, &enc) == COMET_E_INVALID);
    CHECK(comet_otlp_encode(COMET_OTLP_LOGS, 4, data, offsets, NULL, 1, NULL, 0, &enc) == COMET_E_INVALID);
    CHECK(comet_otlp_encode(COMET_OTLP_TRACES, COMET_OTLP_PLAIN, data, offsets, &stamp, 1, NULL, 0, &enc) ==
          COMET_E_INVALID);
    CHECK(comet_otlp_encode(COMET_OTLP_LOGS, COMET_OTLP_PLAIN, data, offsets, NULL, 1, NULL, 0, &enc) ==
          COMET_E_INVALID);
    CHECK(comet_otlp_encode(COMET_OTLP_LOGS, 0, NULL, offsets, NULL, 1, NULL, 0, &enc) == COMET_E_INVALID);
    CHECK(comet_otlp_encode(COMET_OTLP_LOGS, 0, data, offsets, NULL, 1, NULL, 3, &enc) == COMET_E_INVALID);
    CHECK(comet_otlp_encode(COMET_OTLP_LOGS, 0, data, offsets, NULL, 1, NULL, 0, NULL) == COMET_E_INVALID);
    int32_t backwards[2] = {2, 0};
    CHECK(comet_otlp_encode(COMET_OTLP_LOGS, 0, data, backwards, NULL, 1, NULL, 0, &enc) == COMET_E_INVALID);
    CHECK(strstr(comet_last_error(), "offsets go backwards") != NULL);
    CHECK_OK(comet_otlp_encode(COMET_OTLP_METRICS, 0, NULL, NULL, NULL, 0, NULL, 0, &enc));
    CHECK(enc.len == 0 && enc.count == 0);
    comet_otlp_encoded_free(&enc);
    comet_otlp_encoded_free(NULL);
}

int main(void)
{
    RUN(test_groups);
    RUN(test_variations);
    RUN(test_rejected_events);
    RUN(test_plain_events);
    RUN(test_mutations);
    RUN(test_allocation_failures);
    RUN(test_api);
    return 0;
}
