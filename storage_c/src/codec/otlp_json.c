/*
 * otlp_json.c - the JSON text of OTLP events: strings, numbers, ids, bytes
 * and the value_types of an event.  otlp.c decodes the protobuf and decides
 * what goes where; this file only writes.
 *
 * Design choices and their trade-offs:
 *   - Writers append to a growing buffer (ojbuf) and return nothing.  A
 *     failed allocation marks the buffer failed and every later write is
 *     dropped; the decoder looks at the mark once per event.  That keeps the
 *     dozens of writes an event takes free of error plumbing.
 *   - Strings arrive as valid UTF-8 (otlp.c validated them as protobuf
 *     does), so only '"', '\\' and control bytes are escaped; everything
 *     else, DEL and non-ASCII included, is copied as is.  Clean runs are
 *     found eight bytes at a time.
 *   - A double is written as the shortest of %.15g, %.16g and %.17g that
 *     reads back as the same double (%.17g always does), with ".0" appended
 *     when that text has neither '.' nor 'e', so that a reader tells it from
 *     an integer.  Integral values below 2^53 take a shortcut without
 *     snprintf.  The text depends on the C locale's decimal point: Python
 *     processes keep LC_NUMERIC at "C".
 *   - JSON pointers into the event are rendered only for the rare values
 *     that go into value_types (bytes, non-finite doubles); the walk keeps
 *     the pointer's tokens unrendered (ojpath).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "otlp_json.h"
#include "port/port.h"

static void set_room(ojbuf *b)
{
    b->room = b->limit && b->limit < b->cap ? b->limit : b->cap;
}

void ojbuf_limit(ojbuf *b, size_t limit)
{
    b->limit = limit;
    b->over = 0;
    set_room(b);
}

int ojbuf_grow(ojbuf *b, size_t n)
{
    if (b->failed || b->over)
        return 0;
    if (b->limit && b->limit - b->len < n) {
        b->over = 1;
        return 0;
    }
    if (b->cap - b->len >= n)
        return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n) {
        if (cap > SIZE_MAX / 2) {
            b->failed = 1;
            return 0;
        }
        cap *= 2;
    }
    uint8_t *p = sys_realloc(b->p, cap);
    if (!p) {
        b->failed = 1;
        return 0;
    }
    b->p = p;
    b->cap = cap;
    set_room(b);
    return 1;
}

void ojbuf_free(ojbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- strings ---------------------------------------------------------------- */

/* Bytes a JSON string cannot hold raw: controls, '"' and '\\'. */
static const uint8_t NEEDS_ESCAPE[256] = {[0 ... 0x1f] = 1, ['"'] = 1, ['\\'] = 1};

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Whether any of the eight bytes of w is below 0x20, '"' or '\\'. */
static inline uint64_t word_needs_escape(uint64_t w)
{
    uint64_t quote = w ^ (ONES * '"'), slash = w ^ (ONES * '\\');
    uint64_t zero_q = (quote - ONES) & ~quote, zero_s = (slash - ONES) & ~slash;
    uint64_t low = (w - ONES * 0x20) & ~w;
    return (zero_q | zero_s | low) & HIGHS;
}

static size_t clean_run(const uint8_t *s, size_t i, size_t n)
{
    while (n - i >= 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (word_needs_escape(w))
            break;
        i += 8;
    }
    while (i < n && !NEEDS_ESCAPE[s[i]])
        i++;
    return i;
}

/* Escapes the byte c (one NEEDS_ESCAPE) into w: returns the bytes written. */
static size_t escape(uint8_t c, uint8_t *w)
{
    static const char hex[] = "0123456789abcdef";
    static const char SHORT[32] = {['\b'] = 'b', ['\t'] = 't', ['\n'] = 'n', ['\f'] = 'f',
                                   ['\r'] = 'r'};
    w[0] = '\\';
    if (c == '"' || c == '\\') {
        w[1] = c;
        return 2;
    }
    if (SHORT[c]) {
        w[1] = (uint8_t)SHORT[c];
        return 2;
    }
    memcpy(w + 1, "u00", 3);
    w[4] = (uint8_t)hex[c >> 4];
    w[5] = (uint8_t)hex[c & 15];
    return 6;
}

void oj_string(ojbuf *b, const uint8_t *s, size_t n)
{
    size_t i = clean_run(s, 0, n);
    uint8_t *w;
    if (i == n) { /* nothing to escape: the common case */
        if (!(w = ojbuf_room(b, n + 2)))
            return;
        w[0] = '"';
        memcpy(w + 1, s, n);
        w[n + 1] = '"';
        b->len += n + 2;
        return;
    }
    /* room for exactly what is written, so that a limit is met to the byte */
    oj_byte(b, '"');
    for (size_t from = 0;;) {
        oj_put(b, s + from, i - from);
        if (i == n)
            break;
        uint8_t esc[6];
        oj_put(b, esc, escape(s[i], esc));
        from = ++i;
        i = clean_run(s, i, n);
    }
    oj_byte(b, '"');
}

/* ---- numbers ---------------------------------------------------------------- */

static const char DIGIT_PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* The decimal digits of v, right-aligned to end; returns where they start. */
static char *u64_digits(uint64_t v, char *end)
{
    char *p = end;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        p -= 2;
        memcpy(p, DIGIT_PAIRS + 2 * r, 2);
    }
    if (v >= 10) {
        p -= 2;
        memcpy(p, DIGIT_PAIRS + 2 * v, 2);
    } else {
        *--p = (char)('0' + v);
    }
    return p;
}

void oj_u64(ojbuf *b, uint64_t v)
{
    char tmp[24];
    char *p = u64_digits(v, tmp + sizeof tmp);
    oj_put(b, p, (size_t)(tmp + sizeof tmp - p));
}

void oj_i64(ojbuf *b, int64_t v)
{
    char tmp[24];
    uint64_t mag = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    char *p = u64_digits(mag, tmp + sizeof tmp);
    if (v < 0)
        *--p = '-';
    oj_put(b, p, (size_t)(tmp + sizeof tmp - p));
}

/* Powers of ten that are exact doubles. */
static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17};

/* The common case without snprintf and strtod: x written as m / 10^k with the
 * fewest digits k after the point (k <= 17) such that the division, done in
 * doubles, gives x back.  With m below 2^53 (exact) and 10^k exact, that
 * division and a reader's conversion of the text are both the correctly
 * rounded value of the same rational number, so the text reads back as x.
 * Returns 0 when no such m exists (very large, very small or long values). */
static int short_decimal(ojbuf *b, double x)
{
    double mag = x < 0 ? -x : x;
    if (!(mag >= 1e-7 && mag < 1e15))
        return 0;
    for (int k = 1; k < (int)(sizeof POW10 / sizeof *POW10); k++) {
        double scaled = mag * POW10[k];
        if (scaled >= 9007199254740991.0)
            return 0;
        uint64_t v = (uint64_t)(scaled + 0.5), unit = 1; /* a candidate: checked next */
        if ((double)v / POW10[k] != mag)
            continue;
        for (int i = 0; i < k; i++)
            unit *= 10;
        char tmp[48];
        char *end = tmp + sizeof tmp, *p = u64_digits(v % unit, end);
        while (end - p < k)
            *--p = '0'; /* the fraction's leading zeros */
        *--p = '.';
        p = u64_digits(v / unit, p);
        if (x < 0)
            *--p = '-';
        oj_put(b, p, (size_t)(end - p));
        return 1;
    }
    return 0;
}

void oj_double(ojbuf *b, double x)
{
    if (x != x) {
        oj_lit(b, "\"NaN\"");
        return;
    }
    if (x > 1.7976931348623157e308 || x < -1.7976931348623157e308) {
        oj_lit(b, x > 0 ? "\"Infinity\"" : "\"-Infinity\"");
        return;
    }
    /* integral and exact: the integer and ".0" (-0.0 keeps its sign) */
    if (x > -9007199254740992.0 && x < 9007199254740992.0 && x == (double)(int64_t)x) {
        if (x == 0 && __builtin_signbit(x))
            oj_lit(b, "-0");
        else
            oj_i64(b, (int64_t)x);
        oj_lit(b, ".0");
        return;
    }
    if (short_decimal(b, x))
        return;
    char text[40];
    int n = 0;
    for (int digits = 15; digits <= 17; digits++) {
        n = snprintf(text, sizeof text, "%.*g", digits, x);
        if (digits == 17 || strtod(text, NULL) == x)
            break;
    }
    oj_put(b, text, (size_t)n);
    if (!memchr(text, '.', (size_t)n) && !memchr(text, 'e', (size_t)n))
        oj_lit(b, ".0");
}

/* ---- bytes ------------------------------------------------------------------ */

void oj_base64(ojbuf *b, const uint8_t *s, size_t n)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint8_t *w = ojbuf_room(b, (n + 2) / 3 * 4 + 2);
    if (!w)
        return;
    *w++ = '"';
    size_t i = 0;
    for (; n - i >= 3; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        w[0] = (uint8_t)A[v >> 18];
        w[1] = (uint8_t)A[(v >> 12) & 63];
        w[2] = (uint8_t)A[(v >> 6) & 63];
        w[3] = (uint8_t)A[v & 63];
        w += 4;
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        w[0] = (uint8_t)A[v >> 18];
        w[1] = (uint8_t)A[(v >> 12) & 63];
        w[2] = w[3] = '=';
        w += 4;
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8;
        w[0] = (uint8_t)A[v >> 18];
        w[1] = (uint8_t)A[(v >> 12) & 63];
        w[2] = (uint8_t)A[(v >> 6) & 63];
        w[3] = '=';
        w += 4;
    }
    *w++ = '"';
    b->len = (size_t)(w - b->p);
}

void oj_hex(ojbuf *b, const uint8_t *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    uint8_t *w = ojbuf_room(b, 2 * n + 2);
    if (!w)
        return;
    *w++ = '"';
    for (size_t i = 0; i < n; i++, w += 2) {
        w[0] = (uint8_t)hex[s[i] >> 4];
        w[1] = (uint8_t)hex[s[i] & 15];
    }
    *w++ = '"';
    b->len = (size_t)(w - b->p);
}

/* ---- value_types ------------------------------------------------------------ */

void ojtypes_add(ojtypes *t, const ojpath *path, uint32_t kind)
{
    ojbuf *c = &t->chars;
    if (c->over || c->failed)
        return;
    /* a pointer longer than the limit is not rendered at all: keys can be long */
    size_t least = 0;
    for (uint32_t i = 0; i < path->n; i++)
        least += 1 + (path->t[i].name ? path->t[i].len : 1);
    if (c->limit && c->limit - c->len < least) {
        c->over = 1;
        return;
    }
    size_t start = c->len;
    for (uint32_t i = 0; i < path->n; i++) {
        const ojtoken *k = &path->t[i];
        oj_byte(c, '/');
        if (!k->name) {
            oj_u64(c, k->index);
            continue;
        }
        for (uint32_t j = 0; j < k->len; j++) {
            uint8_t ch = k->name[j];
            if (ch == '~')
                oj_put(c, "~0", 2);
            else if (ch == '/')
                oj_put(c, "~1", 2);
            else
                oj_byte(c, ch);
        }
    }
    if (c->over)
        return;
    ojtype e = {(uint32_t)start, (uint32_t)(c->len - start), kind};
    if (c->failed || c->len > UINT32_MAX)
        t->list.failed = 1;
    oj_put(&t->list, &e, sizeof e);
}

void ojtypes_free(ojtypes *t)
{
    ojbuf_free(&t->chars);
    ojbuf_free(&t->list);
}

typedef struct typed {
    const uint8_t *s;
    uint32_t len, kind;
    size_t seq; /* order of insertion: of equal pointers, the last wins */
} typed;

static int typed_cmp(const void *a, const void *b)
{
    const typed *x = a, *y = b;
    int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

void oj_value_types(ojbuf *b, const ojtypes *const *lists, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += ojtypes_count(lists[i]);
        if (lists[i]->list.failed || lists[i]->chars.failed)
            b->failed = 1;
    }
    if (total == 0 || b->failed)
        return;
    typed small[16];
    typed *all = total <= 16 ? small : sys_malloc(total * sizeof *all);
    if (!all) {
        b->failed = 1;
        return;
    }
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        const ojtype *e = (const ojtype *)lists[i]->list.p;
        for (size_t j = 0; j < ojtypes_count(lists[i]); j++, k++)
            all[k] = (typed){lists[i]->chars.p + e[j].off, e[j].len, e[j].kind, k};
    }
    qsort(all, total, sizeof *all, typed_cmp);
    oj_lit(b, ",\"value_types\":{");
    int first = 1;
    for (size_t i = 0; i < total; i++) {
        if (i + 1 < total && all[i + 1].len == all[i].len &&
            memcmp(all[i + 1].s, all[i].s, all[i].len) == 0)
            continue; /* a later value at the same pointer replaced this one */
        if (!first)
            oj_byte(b, ',');
        first = 0;
        oj_string(b, all[i].s, all[i].len);
        oj_lit(b, all[i].kind == OJ_BYTES ? ":\"bytes\"" : ":\"double\"");
    }
    oj_byte(b, '}');
    if (all != small)
        free(all);
}
