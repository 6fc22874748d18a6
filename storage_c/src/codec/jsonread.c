/*
 * jsonread.c - a pull reader of one JSON value (jsonread.h).
 *
 * Design choices and their trade-offs:
 *   - Pull, not a tree: the caller asks for the value it expects where it
 *     expects it, so converting an event costs one pass and no allocation
 *     beyond a scratch buffer for unescaped strings.  A caller that needs
 *     members in another order than they come (otlp_encode.c indexes an
 *     object's keys first) skips them once and reads the spans again.
 *   - Strict: the grammar of RFC 8259, UTF-8 checked in strings, escapes
 *     decoded and lone surrogates refused (their UTF-8 does not exist; the
 *     gateway's own splitter accepts them, as Python's json does, so an
 *     event holding one cannot be turned into protobuf and is reported).
 *   - A string without escapes is handed out in place; one with escapes is
 *     unescaped into the scratch buffer, which the owner sizes to the text
 *     (unescaping never grows a string), so nothing reallocates mid-value.
 *   - Numbers: the integer's magnitude is accumulated with an overflow mark
 *     and strtod gives the double (exact for the shortest round-trip text
 *     the decoder writes); the C locale's decimal point is assumed, as in
 *     otlp_json.c.
 *   - Nesting is recursion, bounded by max_depth.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "jsonread.h"
#include "port/port.h"
#include "utf8.h"

static const uint8_t WS[256] = {[' '] = 1, ['\t'] = 1, ['\n'] = 1, ['\r'] = 1};

int jr_fail(jreader *r, const char *why)
{
    if (!r->why)
        r->why = why;
    r->p = r->end;
    return 0;
}

void jr_init(jreader *r, const uint8_t *text, size_t len, uint8_t *scratch, size_t cap,
             uint32_t max_depth)
{
    r->p = text;
    r->end = text + len;
    r->scratch = scratch;
    r->scratch_len = 0;
    r->scratch_cap = cap;
    r->why = NULL;
    r->depth = 0;
    r->max_depth = max_depth;
    r->fresh = 0;
}

static inline void skip_ws(jreader *r)
{
    while (r->p < r->end && WS[*r->p])
        r->p++;
}

enum jtype jr_peek(jreader *r)
{
    skip_ws(r);
    if (r->why || r->p >= r->end)
        return J_NONE;
    switch (*r->p) {
    case 'n':
        return J_NULL;
    case 'f':
        return J_FALSE;
    case 't':
        return J_TRUE;
    case '"':
        return J_STRING;
    case '[':
        return J_ARRAY;
    case '{':
        return J_OBJECT;
    default:
        return (*r->p == '-' || (*r->p >= '0' && *r->p <= '9')) ? J_NUMBER : J_NONE;
    }
}

int jr_at_end(jreader *r)
{
    skip_ws(r);
    return !r->why && r->p >= r->end;
}

static int literal(jreader *r, const char *lit, size_t n)
{
    skip_ws(r);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, lit, n) != 0)
        return jr_fail(r, "not a JSON value");
    r->p += n;
    return 1;
}

int jr_null(jreader *r)
{
    return literal(r, "null", 4);
}

int jr_bool(jreader *r, int *out)
{
    enum jtype t = jr_peek(r);
    if (t == J_TRUE) {
        *out = 1;
        return literal(r, "true", 4);
    }
    if (t == J_FALSE) {
        *out = 0;
        return literal(r, "false", 5);
    }
    return jr_fail(r, "a boolean was expected");
}

static inline int digit(uint8_t c)
{
    return (uint8_t)(c - '0') < 10;
}

/* Exact powers of ten as doubles (10^22 is the last one). */
static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* Clinger's fast path: a decimal with at most 2^53 as its digits and a power
 * of ten below 10^23 is one correctly rounded multiplication or division of
 * two exact doubles, the same double strtod gives.  0: use strtod. */
static int fast_double(const uint8_t *p, const uint8_t *end, double *out)
{
    int negative = p < end && *p == '-';
    p += negative;
    uint64_t m = 0;
    int digits = 0, scale = 0;
    for (; p < end && digit(*p); p++, digits++)
        m = m * 10 + (uint64_t)(*p - '0');
    if (p < end && *p == '.')
        for (p++; p < end && digit(*p); p++, digits++, scale--)
            m = m * 10 + (uint64_t)(*p - '0');
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int sign = 1, e = 0;
        if (p < end && (*p == '+' || *p == '-'))
            sign = *p++ == '-' ? -1 : 1;
        for (; p < end && digit(*p); p++) {
            if (e > 1000)
                return 0;
            e = e * 10 + (*p - '0');
        }
        scale += sign * e;
    }
    if (digits > 19 || m > (1ULL << 53) || scale < -22 || scale > 22)
        return 0;
    double x = (double)m;
    x = scale < 0 ? x / POW10[-scale] : x * POW10[scale];
    *out = negative ? -x : x;
    return 1;
}

int jr_number(jreader *r, jnum *out)
{
    skip_ws(r);
    const uint8_t *start = r->p, *p = r->p, *end = r->end;
    memset(out, 0, sizeof *out);
    out->integer = 1;
    if (p < end && *p == '-') {
        out->negative = 1;
        p++;
    }
    if (p >= end || !digit(*p))
        return jr_fail(r, "a number was expected");
    if (*p == '0') {
        p++;
    } else {
        /* 19 digits always fit 64 bits; a 20th may, a 21st never */
        const uint8_t *digits = p;
        uint64_t m = 0;
        while (p < end && digit(*p) && p - digits < 19)
            m = m * 10 + (uint64_t)(*p++ - '0');
        if (p < end && digit(*p)) {
            uint64_t d = (uint64_t)(*p++ - '0');
            if (m > (UINT64_MAX - d) / 10 || (p < end && digit(*p)))
                out->overflow = 1;
            else
                m = m * 10 + d;
            while (p < end && digit(*p))
                p++;
        }
        out->magnitude = m;
    }
    if (p < end && *p == '.') {
        out->integer = 0;
        p++;
        if (p >= end || !digit(*p))
            return jr_fail(r, "a digit must follow the decimal point");
        while (p < end && digit(*p))
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        out->integer = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || !digit(*p))
            return jr_fail(r, "a digit must follow the exponent");
        while (p < end && digit(*p))
            p++;
    }
    r->p = p;
    out->text.p = start;
    out->text.len = (uint32_t)(p - start);
    return 1;
}

double jnum_value(const jnum *n)
{
    double x;
    if (n->integer && !n->overflow && n->magnitude <= (1ULL << 53))
        return n->negative ? -(double)n->magnitude : (double)n->magnitude;
    if (fast_double(n->text.p, n->text.p + n->text.len, &x))
        return x;
    /* strtod needs a terminated copy: numbers are short, a long one is rare. */
    char small[64];
    char *text = n->text.len < sizeof small ? small : sys_malloc(n->text.len + 1u);
    if (!text)
        return NAN; /* out of memory for a number of more than 63 characters */
    memcpy(text, n->text.p, n->text.len);
    text[n->text.len] = 0;
    x = strtod(text, NULL);
    if (text != small)
        free(text);
    return x;
}

static int hex4(const uint8_t *p, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(uint8_t *w, uint32_t cp)
{
    if (cp < 0x80) {
        w[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        w[0] = (uint8_t)(0xC0 | cp >> 6);
        w[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        w[0] = (uint8_t)(0xE0 | cp >> 12);
        w[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        w[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    w[0] = (uint8_t)(0xF0 | cp >> 18);
    w[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    w[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    w[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* The escapes of a string from p (at a backslash) to its closing quote,
 * unescaped into scratch after the clean run [start, p). */
static int unescape(jreader *r, const uint8_t *start, const uint8_t *p, jspan *out)
{
    const uint8_t *end = r->end;
    if (r->scratch_cap - r->scratch_len < (size_t)(end - start))
        return jr_fail(r, "string scratch too small");
    uint8_t *w0 = r->scratch + r->scratch_len, *w = w0;
    memcpy(w, start, (size_t)(p - start));
    w += p - start;
    while (p < end && *p != '"') {
        uint8_t c = *p;
        if (c < 0x20)
            return jr_fail(r, "a control character in a string");
        if (c != '\\') {
            *w++ = c;
            p++;
            continue;
        }
        if (end - p < 2)
            return jr_fail(r, "the text ends inside a string");
        uint8_t e = p[1];
        p += 2;
        switch (e) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (end - p < 4 || !hex4(p, &cp))
                return jr_fail(r, "a \\u escape needs four hex digits");
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return jr_fail(r, "a lone surrogate escape (it has no UTF-8)");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return jr_fail(r, "a lone surrogate escape (it has no UTF-8)");
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            w += put_utf8(w, cp);
            break;
        }
        default:
            return jr_fail(r, "an invalid escape in a string");
        }
    }
    if (p >= end)
        return jr_fail(r, "the text ends inside a string");
    r->p = p + 1;
    out->p = w0;
    out->len = (uint32_t)(w - w0);
    r->scratch_len += (size_t)(w - w0);
    if (utf8_invalid(out->p, out->len))
        return jr_fail(r, "a string is not valid UTF-8");
    return 1;
}

int jr_string(jreader *r, jspan *out)
{
    skip_ws(r);
    if (r->why || r->p >= r->end || *r->p != '"')
        return jr_fail(r, "a string was expected");
    const uint8_t *start = r->p + 1, *p = start, *end = r->end;
    int ascii = 1;
    /* Eight bytes at a time while none is '"', '\\', a control byte or non-ASCII. */
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
        uint64_t quote = w ^ (ones * '"'), slash = w ^ (ones * '\\');
        uint64_t stop = ((quote - ones) & ~quote) | ((slash - ones) & ~slash) | (w - ones * 0x20) | w;
        if (stop & highs)
            break;
        p += 8;
    }
    for (; p < end && *p != '"' && *p != '\\' && *p >= 0x20; p++)
        ascii &= *p < 0x80;
    if (p < end && *p == '"') {
        if ((uint64_t)(p - start) > UINT32_MAX)
            return jr_fail(r, "a string is too long");
        out->p = start;
        out->len = (uint32_t)(p - start);
        r->p = p + 1;
        if (!ascii && utf8_invalid(out->p, out->len))
            return jr_fail(r, "a string is not valid UTF-8");
        return 1;
    }
    if (p < end && *p == '\\')
        return unescape(r, start, p, out);
    if (p < end)
        return jr_fail(r, "a control character in a string");
    return jr_fail(r, "the text ends inside a string");
}

/* Opens the object or array at the reader (its type t): its members follow. */
static int open_container(jreader *r, enum jtype t, const char *expected)
{
    if (jr_peek(r) != t)
        return jr_fail(r, expected);
    if (++r->depth > r->max_depth)
        return jr_fail(r, "nested too deep");
    r->p++;
    r->fresh = 1;
    return 1;
}

int jr_object(jreader *r)
{
    return open_container(r, J_OBJECT, "an object was expected");
}

/* Shared by objects and arrays: after the opening bracket or a member, the
 * next member (1) or the end (0). */
static int next_member(jreader *r, uint8_t close)
{
    skip_ws(r);
    if (r->why || r->p >= r->end)
        return jr_fail(r, "the text ends inside an object or array");
    uint8_t c = *r->p;
    int first = r->fresh;
    r->fresh = 0;
    if (c == close) {
        r->p++;
        r->depth--;
        return 0;
    }
    if (first)
        return 1;
    if (c != ',')
        return jr_fail(r, "a ',' or the end of an object or array was expected");
    r->p++;
    return 1;
}

int jr_next_key(jreader *r, jspan *key)
{
    if (!next_member(r, '}'))
        return 0;
    if (!jr_string(r, key))
        return 0;
    skip_ws(r);
    if (r->p >= r->end || *r->p != ':')
        return jr_fail(r, "a ':' was expected after a key");
    r->p++;
    return 1;
}

int jr_array(jreader *r)
{
    return open_container(r, J_ARRAY, "an array was expected");
}

int jr_next_item(jreader *r)
{
    return next_member(r, ']');
}

int jr_skip(jreader *r, jspan *text)
{
    skip_ws(r);
    const uint8_t *start = r->p;
    jspan s;
    jnum n;
    int b;
    switch (jr_peek(r)) {
    case J_NULL:
        if (!jr_null(r))
            return 0;
        break;
    case J_FALSE:
    case J_TRUE:
        if (!jr_bool(r, &b))
            return 0;
        break;
    case J_NUMBER:
        if (!jr_number(r, &n))
            return 0;
        break;
    case J_STRING: {
        size_t mark = r->scratch_len;
        if (!jr_string(r, &s))
            return 0;
        r->scratch_len = mark; /* a skipped string keeps no scratch */
        break;
    }
    case J_ARRAY:
        if (!jr_array(r))
            return 0;
        while (jr_next_item(r))
            if (!jr_skip(r, NULL))
                return 0;
        break;
    case J_OBJECT:
        if (!jr_object(r))
            return 0;
        while (jr_next_key(r, &s)) {
            if (!jr_skip(r, NULL))
                return 0;
        }
        break;
    default:
        return jr_fail(r, "not a JSON value");
    }
    if (r->why)
        return 0;
    if (text) {
        text->p = start;
        text->len = (uint32_t)(r->p - start);
    }
    return 1;
}

int jr_skip_fast(jreader *r, jspan *text)
{
    skip_ws(r);
    const uint8_t *p = r->p, *end = r->end, *start = p;
    uint32_t depth = 0;
    if (r->why || p >= end)
        return jr_fail(r, "a value was expected");
    do {
        uint8_t c = *p;
        if (c == '"') {
            for (p++;; p++) {
                const uint8_t *q = memchr(p, '"', (size_t)(end - p));
                if (!q)
                    return jr_fail(r, "the text ends inside a string");
                size_t slashes = 0;
                while (q - slashes > p && q[-1 - (ptrdiff_t)slashes] == '\\')
                    slashes++;
                p = q;
                if (!(slashes & 1))
                    break;
            }
            p++;
        } else if (c == '{' || c == '[') {
            if (++depth + r->depth > r->max_depth)
                return jr_fail(r, "nested too deep");
            p++;
        } else if (c == '}' || c == ']') {
            if (!depth)
                break; /* the end of the enclosing object or array */
            depth--;
            p++;
        } else if (c == ',' && !depth) {
            break;
        } else {
            p++;
        }
    } while (p < end && depth);
    if (depth)
        return jr_fail(r, "the text ends inside an object or array");
    if (p == start)
        return jr_fail(r, "a value was expected");
    /* a scalar at the top: up to the separator or the end */
    if (*start != '"' && *start != '{' && *start != '[')
        while (p < end && *p != ',' && *p != '}' && *p != ']' && !WS[*p])
            p++;
    r->p = p;
    if (text) {
        text->p = start;
        text->len = (uint32_t)(p - start);
    }
    return 1;
}
