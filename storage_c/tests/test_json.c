/* JSON ingest (json.c) under the sanitizers: accept/reject tables of both body
 * formats with the exact compacted events, where errors are reported, the
 * nesting limit, every truncation of valid documents, random byte mutations
 * (every body is split from a heap copy of exactly its size, so a read past
 * its end is an ASan report), and comet_ingest into a real data directory:
 * a bad body stores nothing, a good one exactly its compacted events. */
#include "util.h"

static read_buf rb;
static uint32_t rng_state = 20240611;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

/* ---- splitting a heap copy of exactly len bytes ---------------------------- */

typedef struct split_t {
    int64_t rc;
    size_t len;
    uint8_t *out;   /* the compacted events, back to back */
    uint32_t *lens;
    comet_ingest_result res;
} split_t;

static void split_free(split_t *s)
{
    free(s->out);
    free(s->lens);
    s->out = NULL;
    s->lens = NULL;
}

/* comet_json_split on a copy of body that ends where the body ends. */
static int64_t split_raw(split_t *s, const void *body, size_t len, uint32_t fmt, uint32_t max_entry)
{
    uint8_t *copy = malloc(len ? len : 1);
    CHECK(copy != NULL);
    if (len)
        memcpy(copy, body, len);
    uint32_t lens_cap = (uint32_t)(len / 2 + 2);
    s->len = len;
    s->out = malloc(len ? len : 1);
    s->lens = malloc(lens_cap * sizeof *s->lens);
    CHECK(s->out && s->lens);
    memset(&s->res, 0xAB, sizeof s->res);
    comet_ingest_request req = {.body = copy, .len = len, .format = fmt};
    s->rc = comet_json_split(&req, max_entry, s->out, len, s->lens, lens_cap, &s->res);
    free(copy);
    return s->rc;
}

static uint64_t lines_before(const uint8_t *body, uint64_t offset)
{
    uint64_t line = 1;
    for (uint64_t i = 0; i < offset; i++)
        line += body[i] == '\n';
    return line;
}

/* The same, then the invariants every result must satisfy. */
static int64_t split(split_t *s, const void *body, size_t len, uint32_t fmt, uint32_t max_entry)
{
    int64_t rc = split_raw(s, body, len, fmt, max_entry);
    const comet_ingest_result *r = &s->res;
    if (rc > 0) {
        CHECK(r->first == 0 && r->count == (uint32_t)rc && r->error_index == COMET_NO_INDEX);
        size_t total = 0, at = 0;
        for (int64_t i = 0; i < rc; i++)
            total += s->lens[i];
        CHECK(total <= len);
        /* a stored event is compacted already: as an NDJSON line it is itself */
        for (int64_t i = 0; i < rc; i++) {
            const uint8_t *ev = s->out + at;
            uint32_t n = s->lens[i];
            CHECK(n > 0);
            CHECK(ev[0] != ' ' && ev[0] != '\t' && ev[0] != '\r' && ev[0] != '\n');
            CHECK(memchr(ev, '\n', n) == NULL);
            if (max_entry == 0) { /* keep the cost linear: no nested checks of nested checks */
                split_t again;
                CHECK(split_raw(&again, ev, n, COMET_BODY_NDJSON, 0) == 1);
                CHECK(again.lens[0] == n && memcmp(again.out, ev, n) == 0);
                split_free(&again);
            }
            at += n;
        }
        return rc;
    }
    CHECK(rc == COMET_E_BAD_JSON || rc == COMET_E_NO_EVENTS ||
          (rc == COMET_E_ENTRY_TOO_LARGE && max_entry));
    CHECK(r->first == -1 && r->count == 0);
    CHECK(r->error_offset <= len);
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, body, len);
    CHECK(r->error_line == lines_before(copy, r->error_offset));
    free(copy);
    CHECK(r->error_index == COMET_NO_INDEX || r->error_index <= len / 2 + 1);
    CHECK(r->error_reason[0] != 0 && memchr(r->error_reason, 0, sizeof r->error_reason));
    if (rc == COMET_E_NO_EVENTS)
        CHECK(r->error_index == COMET_NO_INDEX && r->error_offset == len);
    return rc;
}

/* ---- tables ------------------------------------------------------------------ */

#define J COMET_BODY_JSON
#define N COMET_BODY_NDJSON
#define BAD COMET_E_BAD_JSON
#define NONE COMET_E_NO_EVENTS
#define B(s) s, sizeof(s) - 1

typedef struct table_case {
    uint32_t fmt;
    const char *body;
    size_t len;
    int64_t rc;              /* number of events, or the error */
    const char *events[8];   /* the stored events, NULL-terminated */
} table_case;

static const table_case TABLE[] = {
    /* JSON: an array gives its elements, any other value one event */
    {J, B("1"), 1, {"1"}},
    {J, B(" [1, 2 ,\n3 ]\r\n"), 3, {"1", "2", "3"}},
    {J, B("[[]]"), 1, {"[]"}},
    {J, B("[[ ], { }]"), 2, {"[]", "{}"}},
    {J, B("{ \"a\" : [ 1 , { } ] }"), 1, {"{\"a\":[1,{}]}"}},
    {J, B("\t{}\n"), 1, {"{}"}},
    {J, B("[true,false, null]"), 3, {"true", "false", "null"}},
    {J, B(" true "), 1, {"true"}},
    /* strings byte for byte: whitespace, escapes, lone surrogates */
    {J, B("[\"a b\", \" \\\" \\\\ \\/ \\b\\f\\n\\r\\t \", \"\\ud800\", \"\\uDC00\\uD800\"]"), 4,
     {"\"a b\"", "\" \\\" \\\\ \\/ \\b\\f\\n\\r\\t \"", "\"\\ud800\"", "\"\\uDC00\\uD800\""}},
    /* numbers byte for byte, never converted */
    {J, B("[1.0, -0, 1E400, 0.10, 2e-0, -0.0E+00, 123456789012345678901234567890]"), 7,
     {"1.0", "-0", "1E400", "0.10", "2e-0", "-0.0E+00", "123456789012345678901234567890"}},
    /* duplicate keys kept as sent */
    {J, B("{\"a\":1, \"a\" :2,\"\\u0061\":3}"), 1, {"{\"a\":1,\"a\":2,\"\\u0061\":3}"}},
    /* valid UTF-8 of every length, the largest code point, DEL, a BOM inside a string */
    {J, B("\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\x7f\xef\xbb\xbf\xed\x9f\xbf\xee\x80\x80\""), 1,
     {"\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\x7f\xef\xbb\xbf\xed\x9f\xbf\xee\x80\x80\""}},
    /* a string longer than the 16-byte vector step, escapes across its boundary */
    {J, B("[\"0123456789abcde\\\"0123456789abcdef\\u00e9\xc3\xa9 0123456789abcdef\"]"), 1,
     {"\"0123456789abcde\\\"0123456789abcdef\\u00e9\xc3\xa9 0123456789abcdef\""}},
    /* JSON: no events */
    {J, B(""), NONE, {NULL}},
    {J, B(" \t\r\n"), NONE, {NULL}},
    {J, B("[]"), NONE, {NULL}},
    {J, B(" [ \n ] "), NONE, {NULL}},
    /* JSON: refused */
    {J, B("[1,]"), BAD, {NULL}}, {J, B("[,1]"), BAD, {NULL}}, {J, B("[1 2]"), BAD, {NULL}},
    {J, B("1 2"), BAD, {NULL}}, {J, B("[1]]"), BAD, {NULL}}, {J, B("[[1]"), BAD, {NULL}},
    {J, B("[1] x"), BAD, {NULL}}, {J, B("[] x"), BAD, {NULL}}, {J, B("["), BAD, {NULL}},
    {J, B("{\"a\"}"), BAD, {NULL}}, {J, B("{\"a\":}"), BAD, {NULL}}, {J, B("{1:2}"), BAD, {NULL}},
    {J, B("{\"a\":1,}"), BAD, {NULL}}, {J, B("{\"a\" 1}"), BAD, {NULL}}, {J, B("{,}"), BAD, {NULL}},
    {J, B("01"), BAD, {NULL}}, {J, B("-01"), BAD, {NULL}}, {J, B("-"), BAD, {NULL}},
    {J, B("-a"), BAD, {NULL}}, {J, B("1."), BAD, {NULL}}, {J, B(".5"), BAD, {NULL}},
    {J, B("1e"), BAD, {NULL}}, {J, B("1e+"), BAD, {NULL}}, {J, B("+1"), BAD, {NULL}},
    {J, B("0x10"), BAD, {NULL}}, {J, B("1.5."), BAD, {NULL}}, {J, B("NaN"), BAD, {NULL}},
    {J, B("Infinity"), BAD, {NULL}}, {J, B("[-Infinity]"), BAD, {NULL}}, {J, B("tru"), BAD, {NULL}},
    {J, B("nulll"), BAD, {NULL}}, {J, B("True"), BAD, {NULL}}, {J, B("'a'"), BAD, {NULL}},
    {J, B("\"\\x\""), BAD, {NULL}}, {J, B("\"\\u12\""), BAD, {NULL}}, {J, B("\"\\u12g4\""), BAD, {NULL}},
    {J, B("\"\\U0041\""), BAD, {NULL}}, {J, B("\"\\"), BAD, {NULL}}, {J, B("\"\\u00"), BAD, {NULL}},
    {J, B("\"abc"), BAD, {NULL}}, {J, B("\"\x01\""), BAD, {NULL}}, {J, B("\"\x1f\""), BAD, {NULL}},
    {J, B("\"\n\""), BAD, {NULL}}, {J, B("\"\t\""), BAD, {NULL}}, {J, B("\"\0\""), BAD, {NULL}},
    {J, B("\xef\xbb\xbf" "1"), BAD, {NULL}}, {J, B("\xef\xbb"), BAD, {NULL}},
    {J, B("\"\xc0\xaf\""), BAD, {NULL}},         /* overlong */
    {J, B("\"\xc1\xbf\""), BAD, {NULL}},
    {J, B("\"\xe0\x80\xaf\""), BAD, {NULL}},
    {J, B("\"\xf0\x8f\xbf\xbf\""), BAD, {NULL}},
    {J, B("\"\xed\xa0\x80\""), BAD, {NULL}},     /* an encoded surrogate */
    {J, B("\"\xed\xbf\xbf\""), BAD, {NULL}},
    {J, B("\"\xf4\x90\x80\x80\""), BAD, {NULL}}, /* above U+10FFFF */
    {J, B("\"\xf5\x80\x80\x80\""), BAD, {NULL}}, {J, B("\"\xf8\""), BAD, {NULL}},
    {J, B("\"\xff\""), BAD, {NULL}}, {J, B("\"\x80\""), BAD, {NULL}},
    {J, B("\"\xc3\""), BAD, {NULL}}, {J, B("\"\xe2\x82\""), BAD, {NULL}},
    {J, B("\"\xe2\x82"), BAD, {NULL}},           /* the body ends inside a character */
    {J, B("\"\xf0\x9f\x98"), BAD, {NULL}}, {J, B("\xc3\xa9"), BAD, {NULL}},
    {J, B("\x0c" "1"), BAD, {NULL}}, {J, B("1\x00"), BAD, {NULL}}, {J, B("[1]\x00"), BAD, {NULL}},
    {J, B("\xc2\xa0" "1"), BAD, {NULL}},
    /* NDJSON: one event per line, '\r' is whitespace, blank lines skipped */
    {N, B("1\n2\n"), 2, {"1", "2"}},
    {N, B("1\r\n\r\n \t\n[1, 2]\r"), 2, {"1", "[1,2]"}},
    {N, B("{\"a\" : 1}"), 1, {"{\"a\":1}"}},
    {N, B("\n\n3"), 1, {"3"}},
    {N, B("[1,\r2]"), 1, {"[1,2]"}},
    {N, B("[]\n{}\n\"\"\n"), 3, {"[]", "{}", "\"\""}},
    {N, B(""), NONE, {NULL}},
    {N, B("\n \n\r\n\t"), NONE, {NULL}},
    /* NDJSON: a value may not span lines */
    {N, B("[1\n2]\n4,5\n"), BAD, {NULL}},
    {N, B("{\"a\":1\n\"b\":2}\n3,4\n"), BAD, {NULL}},
    {N, B("[\n]"), BAD, {NULL}}, {N, B("1 2"), BAD, {NULL}}, {N, B("1\r2"), BAD, {NULL}},
    {N, B("1,\n2"), BAD, {NULL}}, {N, B("\"a\nb\""), BAD, {NULL}}, {N, B("1\n2]"), BAD, {NULL}},
    {N, B("1\n\xef\xbb\xbf" "2"), BAD, {NULL}}, {N, B("\x0c" "1"), BAD, {NULL}},
};

static void test_tables(void)
{
    for (size_t t = 0; t < sizeof TABLE / sizeof TABLE[0]; t++) {
        const table_case *c = &TABLE[t];
        split_t s;
        int64_t rc = split(&s, c->body, c->len, c->fmt, 0);
        if (rc != c->rc) {
            fprintf(stderr, "case %zu (%.*s): rc %lld, want %lld (%s)\n", t, (int)c->len, c->body,
                    (long long)rc, (long long)c->rc, s.res.error_reason);
            CHECK(rc == c->rc);
        }
        size_t at = 0;
        for (int64_t i = 0; i < rc; i++) {
            CHECK(c->events[i] != NULL);
            CHECK(s.lens[i] == strlen(c->events[i]));
            CHECK(memcmp(s.out + at, c->events[i], s.lens[i]) == 0);
            at += s.lens[i];
        }
        if (rc > 0)
            CHECK(c->events[rc] == NULL);
        split_free(&s);
    }
}

/* ---- where errors are reported -------------------------------------------------- */

typedef struct fault_case {
    uint32_t fmt;
    const char *body;
    size_t len;
    uint32_t max_entry;
    int64_t rc;
    uint64_t index, line, offset;
    const char *reason; /* a part of it */
} fault_case;

#define NOI COMET_NO_INDEX

static const fault_case FAULTS[] = {
    {J, B("[1,\n 2,\n x]"), 0, BAD, 2, 3, 9, "expected a value"},
    {J, B("[1, \"ab"), 0, BAD, 1, 1, 4, "not closed"},
    {J, B("[1,\n2 3]"), 0, BAD, 1, 2, 6, "after an event of the array"},
    {J, B("[1]\n\n x"), 0, BAD, NOI, 3, 6, "nothing after the closing ']'"},
    {J, B("1 x"), 0, BAD, NOI, 1, 2, "nothing after the JSON value"},
    {J, B("{\"a\": 1\n"), 0, BAD, 0, 2, 8, "the end of the body"},
    {J, B("[1, {\"a\" 2}]"), 0, BAD, 1, 1, 9, "':' after an object key"},
    {J, B("[\"\x01\"]"), 0, BAD, 0, 1, 2, "control character 0x01"},
    {J, B("[\"a\nb\"]"), 0, BAD, 0, 1, 3, "line break inside a string"},
    {J, B("01"), 0, BAD, 0, 1, 1, "leading zero"},
    {J, B("[\"\\q\"]"), 0, BAD, 0, 1, 2, "invalid escape"},
    {J, B("[0, \"\xed\xa0\x80\"]"), 0, BAD, 1, 1, 5, "invalid UTF-8"},
    {J, B("\xef\xbb\xbf[1]"), 0, BAD, NOI, 1, 0, "byte order mark"},
    {J, B(""), 0, NONE, NOI, 1, 0, "no event"},
    {J, B("[\n]\n"), 0, NONE, NOI, 3, 4, "no event"},
    {N, B("1\n\n[2,\n3]"), 0, BAD, 1, 3, 6, "a line break"},
    {N, B("1\n\"\xe2\x82\""), 0, BAD, 1, 2, 3, "invalid UTF-8"},
    {N, B("1\n2 2\n"), 0, BAD, 1, 2, 4, "end of the line"},
    {N, B("\n\n  x\n"), 0, BAD, 0, 3, 4, "expected a value"},
    {N, B(" \n\n"), 0, NONE, NOI, 3, 3, "every line is blank"},
    /* max_entry_bytes applies to an event as sent, whitespace included */
    {J, B("[1, 22, 333]"), 2, COMET_E_ENTRY_TOO_LARGE, 2, 1, 8, "3 bytes as sent"},
    {J, B("[1,\n[1, 2]]"), 5, COMET_E_ENTRY_TOO_LARGE, 1, 2, 4, "6 bytes as sent"},
    {N, B("1\n\n22\n"), 1, COMET_E_ENTRY_TOO_LARGE, 1, 3, 3, "2 bytes as sent"},
};

static void test_fault_location(void)
{
    for (size_t t = 0; t < sizeof FAULTS / sizeof FAULTS[0]; t++) {
        const fault_case *c = &FAULTS[t];
        split_t s;
        int64_t rc = split(&s, c->body, c->len, c->fmt, c->max_entry);
        const comet_ingest_result *r = &s.res;
        if (rc != c->rc || r->error_index != c->index || r->error_line != c->line ||
            r->error_offset != c->offset || !strstr(r->error_reason, c->reason)) {
            fprintf(stderr, "case %zu: rc %lld index %lld line %llu offset %llu: %s\n", t,
                    (long long)rc, (long long)r->error_index, (unsigned long long)r->error_line,
                    (unsigned long long)r->error_offset, r->error_reason);
            CHECK(0);
        }
        /* the last error says the same */
        CHECK(strstr(comet_last_error(), c->reason) != NULL);
        split_free(&s);
    }
    /* a reason that describes a byte quotes it in ASCII, never raw */
    split_t s;
    CHECK(split(&s, B("[\xff]"), J, 0) == BAD);
    CHECK(strstr(s.res.error_reason, "0xff") != NULL);
    split_free(&s);
}

/* ---- the nesting limit -------------------------------------------------------------- */

/* levels nested arrays (or objects), as one event, after prefix and before suffix. */
static size_t nested(char *out, const char *prefix, int levels, int objects, const char *suffix)
{
    size_t n = strlen(prefix);
    memcpy(out, prefix, n);
    for (int i = 0; i < levels - 1; i++) {
        const char *open = objects ? "{\"a\":" : "[";
        memcpy(out + n, open, strlen(open));
        n += strlen(open);
    }
    memcpy(out + n, objects ? "{}" : "[]", 2);
    n += 2;
    memset(out + n, objects ? '}' : ']', (size_t)levels - 1);
    n += (size_t)levels - 1;
    memcpy(out + n, suffix, strlen(suffix));
    return n + strlen(suffix);
}

static void test_depth_limit(void)
{
    const int max = COMET_JSON_MAX_DEPTH;
    char *buf = malloc(8 * (size_t)max + 64);
    for (int objects = 0; objects <= 1; objects++) {
        size_t opener = objects ? 5 : 1; /* bytes of one level's opening */
        struct {
            uint32_t fmt;
            const char *prefix, *suffix;
        } ways[] = {{N, "1\n", "\n"}, {J, "[1, ", "]"}};
        for (size_t w = 0; w < 2; w++) {
            split_t s;
            size_t n = nested(buf, ways[w].prefix, max, objects, ways[w].suffix);
            CHECK(split(&s, buf, n, ways[w].fmt, 0) == 2);
            size_t plen = strlen(ways[w].prefix);
            CHECK(s.lens[1] == n - plen - strlen(ways[w].suffix));
            CHECK(memcmp(s.out + 1, buf + plen, s.lens[1]) == 0);
            split_free(&s);

            n = nested(buf, ways[w].prefix, max + 1, objects, ways[w].suffix);
            CHECK(split(&s, buf, n, ways[w].fmt, 0) == BAD);
            CHECK(strstr(s.res.error_reason, "nesting") != NULL);
            CHECK(s.res.error_index == 1);
            /* the bracket that opens level max + 1 */
            CHECK(s.res.error_offset == plen + opener * (size_t)max);
            CHECK(buf[s.res.error_offset] == (objects ? '{' : '['));
            split_free(&s);
        }
        /* a single value as the whole JSON body: the same limit */
        size_t n = nested(buf, "", max, objects, "");
        split_t s;
        if (objects) {
            CHECK(split(&s, buf, n, J, 0) == 1);
            split_free(&s);
            n = nested(buf, "", max + 1, objects, "");
            CHECK(split(&s, buf, n, J, 0) == BAD);
        } else {
            /* an array body: the enclosing array is not counted */
            n = nested(buf, "", max + 1, 0, "");
            CHECK(split(&s, buf, n, J, 0) == 1);
            CHECK(s.lens[0] == n - 2);
            split_free(&s);
            n = nested(buf, "", max + 2, 0, "");
            CHECK(split(&s, buf, n, J, 0) == BAD);
        }
        CHECK(strstr(s.res.error_reason, "nesting") != NULL);
        split_free(&s);
    }
    /* far deeper than the limit: refused at the limit, no stack growth */
    size_t deep = 1 << 20;
    char *big = malloc(deep);
    memset(big, '[', deep);
    split_t s;
    CHECK(split(&s, big, deep, N, 0) == BAD);
    CHECK(s.res.error_offset == (uint64_t)max);
    split_free(&s);
    free(big);
    free(buf);
}

/* ---- truncations and mutations ------------------------------------------------------- */

static const struct {
    uint32_t fmt;
    const char *body;
} DOCS[] = {
    {J, "[1, -2.5e+10, \"a\\\"b\\u00e9\xc3\xa9\", {\"k\": [true, false, null]}, [], {}]\n"},
    {J, " [ {\"id\":1,\"name\":\"caf\xc3\xa9 \\ud83d\\ude00 \xf0\x9f\x98\x80\",\"tags\":[\"x\",\"y\"],"
        "\"n\":-0.0e-0} , {\"id\":2,\"nested\":{\"a\":{\"b\":[[[]]]}}} ] "},
    {J, "{\"event\":\"0123456789abcdef0123456789abcdef\\\\\",\"t\":\"\\t\\n\\r\\b\\f\\/\",\"v\":1E400}"},
    {J, "\"a long string of text, more than thirty-two bytes, \xe2\x82\xac\xf4\x8f\xbf\xbf\""},
    {J, "-12345678901234567890.123456789e-0012"},
    {N, "{\"a\":1}\n[1, 2]\r\n\n\"x y\"\n  true \n-0.5\n"},
    {N, "\r\n{\"k\": \"v\\u0041\\ud800\", \"k\": [ {} ]}\r\n\t\n12\n"},
    {N, "\"0123456789abcdef0123456789abcdef\xc3\xa9\"\n\"\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\"\n"},
};
#define NDOCS (sizeof DOCS / sizeof DOCS[0])

static void test_truncations(void)
{
    for (size_t d = 0; d < NDOCS; d++) {
        const uint8_t *doc = (const uint8_t *)DOCS[d].body;
        size_t len = strlen(DOCS[d].body);
        uint32_t fmt = DOCS[d].fmt;
        split_t full;
        int64_t events = split(&full, doc, len, fmt, 0);
        CHECK(events > 0);
        /* where the JSON text is complete: after its last non-whitespace byte */
        size_t complete = len;
        while (complete > 0 && strchr(" \t\r\n", doc[complete - 1]))
            complete--;
        for (size_t cut = 0; cut <= len; cut++) {
            for (uint32_t f = J; f <= N; f++) {
                split_t s;
                int64_t rc = split(&s, doc, cut, f, 0);
                split_t again; /* the same answer twice */
                CHECK(split_raw(&again, doc, cut, f, 0) == rc);
                CHECK(again.res.error_offset == s.res.error_offset || rc > 0);
                split_free(&again);
                if (f == fmt && fmt == J && doc[0] != '-') {
                    /* a JSON text is accepted exactly when it is whole (but for a
                     * number: a prefix of a number may be a number) */
                    CHECK(cut >= complete ? rc == events : rc < 0);
                }
                if (f == fmt && fmt == N && (cut == len || (cut > 0 && doc[cut - 1] == '\n'))) {
                    /* whole lines: the events of the lines that are not blank */
                    int64_t want = 0;
                    int blank = 1;
                    for (size_t i = 0; i < cut; i++) {
                        if (doc[i] == '\n') {
                            want += !blank;
                            blank = 1;
                        } else if (!strchr(" \t\r", doc[i])) {
                            blank = 0;
                        }
                    }
                    want += !blank;
                    CHECK(want ? rc == want : rc == NONE);
                    size_t at = 0;
                    for (int64_t i = 0; i < rc; i++) {
                        CHECK(s.lens[i] == full.lens[i]);
                        CHECK(memcmp(s.out + at, full.out + at, s.lens[i]) == 0);
                        at += s.lens[i];
                    }
                }
                split_free(&s);
            }
        }
        split_free(&full);
    }
}

static const uint8_t INTERESTING[] = {
    '[', ']', '{', '}', ':', ',', '"', '\\', ' ', '\n', '\r', '\t', '0', '1', '-', '.', 'e', 'E',
    '+', 'u', 'n', 't', 'f', 0x00, 0x1f, 0x7f, 0x80, 0xbf, 0xc0, 0xc2, 0xe0, 0xed, 0xef, 0xf0,
    0xf4, 0xf5, 0xff, 0x9f, 0xa0, 0x8f, 0x90, 0xbb,
};

static void test_random_mutations(void)
{
    enum { CAP = 1024, ITERATIONS = 300000 };
    uint8_t buf[CAP];
    uint64_t accepted = 0, refused = 0, none = 0;
    for (int iter = 0; iter < ITERATIONS; iter++) {
        size_t d = rnd() % NDOCS;
        size_t len = strlen(DOCS[d].body);
        memcpy(buf, DOCS[d].body, len);
        /* sometimes two documents back to back, or one repeated */
        if (rnd() % 8 == 0) {
            size_t d2 = rnd() % NDOCS, l2 = strlen(DOCS[d2].body);
            buf[len++] = rnd() % 2 ? ',' : '\n';
            memcpy(buf + len, DOCS[d2].body, l2);
            len += l2;
        }
        uint32_t edits = 1 + rnd() % 4;
        for (uint32_t e = 0; e < edits; e++) {
            size_t at = len ? rnd() % len : 0;
            uint8_t b = rnd() % 3 ? INTERESTING[rnd() % sizeof INTERESTING] : (uint8_t)rnd();
            switch (rnd() % 5) {
            case 0: /* overwrite */
                if (len)
                    buf[at] = b;
                break;
            case 1: /* insert */
                if (len < CAP) {
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = b;
                    len++;
                }
                break;
            case 2: /* delete */
                if (len) {
                    memmove(buf + at, buf + at + 1, len - at - 1);
                    len--;
                }
                break;
            case 3: /* flip a bit */
                if (len)
                    buf[at] ^= (uint8_t)(1u << (rnd() % 8));
                break;
            default: /* truncate */
                len = at;
                break;
            }
        }
        for (uint32_t f = J; f <= N; f++) {
            split_t s;
            /* a quarter of the time with a small entry limit, too */
            uint32_t max_entry = rnd() % 4 == 0 ? 1 + rnd() % 64 : 0;
            int64_t rc = split(&s, buf, len, f, max_entry);
            accepted += rc > 0;
            refused += rc == BAD;
            none += rc == NONE;
            if (rc > 0 && max_entry)
                for (int64_t i = 0; i < rc; i++)
                    CHECK(s.lens[i] <= max_entry); /* compacted <= as sent <= limit */
            split_free(&s);
        }
    }
    fprintf(stderr, "    %d bodies x 2 formats: %llu accepted, %llu refused, %llu without events\n",
            ITERATIONS, (unsigned long long)accepted, (unsigned long long)refused,
            (unsigned long long)none);
    CHECK(accepted > ITERATIONS / 20 && refused > ITERATIONS / 2);
}

/* Random bytes from a small alphabet: most bodies are nonsense, some are JSON. */
static void test_random_alphabet(void)
{
    static const char ALPHA[] = "[]{}:,\"\\ \n\r\t01-.eEtrufalsn\xc3\xa9";
    uint8_t buf[64];
    for (int iter = 0; iter < 200000; iter++) {
        size_t len = rnd() % sizeof buf;
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)ALPHA[rnd() % (sizeof ALPHA - 1)];
        split_t s;
        split(&s, buf, len, 1 + rnd() % 2, 0);
        split_free(&s);
    }
}

/* ---- comet_ingest into a data directory ---------------------------------------------- */

static int64_t ingest(comet_stream *s, const char *body, size_t len, uint32_t fmt,
                      uint32_t compress_above, comet_ingest_result *res)
{
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, body, len);
    comet_ingest_request req = {.body = copy, .len = len, .format = fmt,
                                .compress_above = compress_above, .compress_level = 3,
                                .durability = COMET_DURABILITY_DEFAULT};
    int64_t rc = comet_ingest(s, 0, &req, res);
    free(copy);
    return rc;
}

/* The shard holds exactly these payloads, in order. */
static void check_shard(comet_stream *s, const char *const *want, uint32_t n, uint32_t compressed)
{
    CHECK_OK(read_some(s, 0, 0, 1024, &rb, 0));
    CHECK(rb.res.count == n);
    CHECK(rb.res.compressed == compressed);
    for (uint32_t i = 0; i < n; i++) {
        CHECK(rb.entries[i] == (int64_t)i);
        CHECK((size_t)(rb.offsets[i + 1] - rb.offsets[i]) == strlen(want[i]));
        CHECK(memcmp(rb.data + rb.offsets[i], want[i], strlen(want[i])) == 0);
    }
}

static void test_ingest(void)
{
    char *dir = scratch_dir();
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 1 << 20;
    cfg.max_entry_bytes = 300;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *s = open_stream(db, "j", 1);
    comet_ingest_result res;

    /* bad bodies store nothing, not even the good events before the fault */
    CHECK(ingest(s, B("[1, 2, {\"a\": }]"), J, 0, &res) == BAD);
    CHECK(res.first == -1 && res.count == 0 && res.error_index == 2 && res.error_line == 1 &&
          res.error_offset == 13);
    CHECK(strstr(comet_last_error(), "expected a value") != NULL);
    CHECK(ingest(s, B("1\n2\n[3\n"), N, 0, &res) == BAD);
    CHECK(res.count == 0 && res.error_index == 2 && res.error_line == 3);
    CHECK(ingest(s, B(" [ ] "), J, 0, &res) == NONE);
    CHECK(ingest(s, B("\n\r\n"), N, 0, &res) == NONE);
    char big[512];
    int n = snprintf(big, sizeof big, "[1, \"%0400d\", 3]", 7);
    CHECK(ingest(s, big, (size_t)n, J, 0, &res) == COMET_E_ENTRY_TOO_LARGE);
    CHECK(res.error_index == 1 && res.error_offset == 4);
    /* bad requests */
    CHECK(comet_ingest(s, 0, NULL, &res) == COMET_E_INVALID);
    comet_ingest_request req = {.body = "1", .len = 1, .format = 9, .durability = -1};
    CHECK(comet_ingest(s, 0, &req, &res) == COMET_E_INVALID);
    req.format = J;
    CHECK(comet_ingest(s, 1, &req, &res) < 0); /* no shard 1 */
    CHECK_OK(read_some(s, 0, 0, 1024, &rb, 0));
    CHECK(rb.res.count == 0);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry == 0 && st.appended_entries == 0);

    /* good bodies: exactly the compacted events, in order, as one batch each */
    CHECK(ingest(s, B("[ 1 , {\"a\" : [ true , null ] } , \"x y\" ]"), J, 0, &res) == 0);
    CHECK(res.first == 0 && res.count == 3 && res.error_index == COMET_NO_INDEX);
    CHECK(ingest(s, B("{\"k\": 1}\r\n\n[2, 3]\n"), N, 0, &res) == 3);
    CHECK(res.count == 2);
    CHECK(ingest(s, B("\"\\ud800 \xf0\x9f\x98\x80\""), J, 0, &res) == 5);
    /* events above compress_above are stored compressed and read back as sent
     * (max_entry_bytes bounds them as sent: 290 bytes of a 300 limit) */
    char body[400], event[400];
    n = snprintf(body, sizeof body, "[ {\"s\" : \"%0270d\" } , 5 ]", 0);
    snprintf(event, sizeof event, "{\"s\":\"%0270d\"}", 0);
    CHECK(ingest(s, body, (size_t)n, J, 64, &res) == 6);
    CHECK(res.count == 2);
    const char *want[] = {"1", "{\"a\":[true,null]}", "\"x y\"", "{\"k\":1}", "[2,3]",
                          "\"\\ud800 \xf0\x9f\x98\x80\"", event, "5"};
    check_shard(s, want, 8, 1);
    comet_close(db);

    /* and after a reopen */
    CHECK_OK(comet_open(dir, &cfg, &db));
    s = open_stream(db, "j", 1);
    check_shard(s, want, 8, 1);
    comet_close(db);
    rm_tree(dir);
}

static void test_split_api(void)
{
    uint8_t out[16];
    uint32_t lens[2];
    comet_ingest_result res;
    comet_ingest_request req = {.body = "[1, 2, 3]", .len = 9, .format = J};
    CHECK(comet_json_split(&req, 0, out, sizeof out, lens, 2, &res) == COMET_E_BUFFER_TOO_SMALL);
    CHECK(comet_json_split(&req, 0, out, sizeof out, lens, 2, NULL) == COMET_E_BUFFER_TOO_SMALL);
    CHECK(comet_json_split(&req, 0, out, 2, lens, 2, &res) == COMET_E_BUFFER_TOO_SMALL);
    CHECK(comet_json_split(NULL, 0, out, sizeof out, lens, 2, &res) == COMET_E_INVALID);
    req.format = 0;
    CHECK(comet_json_split(&req, 0, out, sizeof out, lens, 2, &res) == COMET_E_INVALID);
    req.format = N;
    req.body = NULL;
    req.len = 0;
    CHECK(comet_json_split(&req, 0, out, sizeof out, lens, 2, &res) == NONE);
    req.len = 1;
    CHECK(comet_json_split(&req, 0, out, sizeof out, lens, 2, &res) == COMET_E_INVALID);
}

/* ---- numbers: every length against every byte after the digits ---------------- */

/* Numbers are scanned eight digits at a time while eight bytes are left:
 * runs of 1..40 digits (in the integer part, the fraction and the exponent),
 * each followed by every byte value, at the end of the body and inside it.
 * An NDJSON line "<prefix><digits><byte>" is one valid event exactly when
 * the byte is a digit or a whitespace byte that may end a line (' ', '\t',
 * '\r', '\n'); any other byte is refused where it stands, or, for '.', 'e'
 * and 'E', just after it, where a digit is missing. */
static void test_digit_runs(void)
{
    static const char *prefixes[] = {"", "-", "0.", "1e", "-9.5E+"};
    char body[96];
    split_t s;
    for (size_t f = 0; f < sizeof prefixes / sizeof prefixes[0]; f++) {
        size_t plen = strlen(prefixes[f]);
        for (size_t n = 1; n <= 40; n++) {
            memcpy(body, prefixes[f], plen);
            body[plen] = (char)('1' + n % 9); /* no leading zero */
            for (size_t i = 1; i < n; i++)
                body[plen + i] = (char)('0' + (i * 7) % 10);
            size_t len = plen + n;
            CHECK(split(&s, body, len, N, 0) == 1 && s.lens[0] == len &&
                  memcmp(s.out, body, len) == 0);
            split_free(&s);
            for (int c = 0; c < 256; c++) {
                body[len] = (char)c;
                int valid = (c >= '0' && c <= '9') || c == ' ' || c == '\t' || c == '\r' ||
                            c == '\n';
                size_t keep = (c >= '0' && c <= '9') ? len + 1 : len;
                int64_t rc = split(&s, body, len + 1, N, 0);
                if (valid)
                    CHECK(rc == 1 && s.lens[0] == keep && memcmp(s.out, body, keep) == 0);
                else /* '.', 'e' and 'E' may start a part that then has no digit */
                    CHECK(rc == BAD && (s.res.error_offset == len ||
                                        (s.res.error_offset == len + 1 && strchr(".eE", c))));
                split_free(&s);
                /* the same inside a body that goes on after it */
                memcpy(body + len + 1, "\n2\n", 3);
                rc = split(&s, body, len + 4, N, 0);
                CHECK(valid ? rc == 2 : rc == BAD);
                split_free(&s);
            }
        }
    }
}

int main(void)
{
    RUN(test_tables);
    RUN(test_fault_location);
    RUN(test_depth_limit);
    RUN(test_digit_runs);
    RUN(test_truncations);
    RUN(test_random_mutations);
    RUN(test_random_alphabet);
    RUN(test_ingest);
    RUN(test_split_api);
    return 0;
}
