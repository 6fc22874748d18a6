/*
 * json.c - strict JSON validation and splitting of request bodies, in one
 * linear pass.
 *
 * The gateway's promise is that a 202 means exactly the events that were sent
 * are stored.  So nothing here builds a value: the scanner checks the grammar
 * of RFC 8259 (UTF-8 included) token by token and reports each event as a
 * byte range of the body.  The only change made to an event is the removal of
 * insignificant whitespace between tokens; string and number tokens are
 * stored byte for byte (a number is never converted, an escape never
 * decoded, duplicate keys stay as sent).
 *
 * Two body formats:
 *   COMET_BODY_JSON    one JSON text.  An array gives one event per element;
 *                      any other value is one event.
 *   COMET_BODY_NDJSON  one JSON text per line ('\n'; a '\r' before it is
 *                      whitespace).  Lines holding only whitespace are
 *                      skipped; a value may not span lines.
 *
 * Design choices and their trade-offs:
 *   - A hand-written state machine rather than a library: the one library fast
 *     enough (simdjson) is C++, builds a tape we would not use, and its
 *     minifier does not validate; what we need - validate, find event bounds,
 *     drop whitespace - is one small pass.  Strings, where most bytes are, are
 *     scanned 16 bytes at a time with SSE2 for '"', '\\', control bytes and
 *     non-ASCII bytes; digits eight at a time in a 64-bit word; the rest byte
 *     by byte.  Whitespace costs compact JSON at most one compare where it
 *     may stand (a value's or a separator's own byte is checked first).
 *   - Nesting is tracked on an explicit stack (no recursion), limited to
 *     COMET_JSON_MAX_DEPTH levels per event.
 *   - An event without whitespace inside is referenced in place (no copy).
 *     The first whitespace inside an event starts a copy of that event into
 *     a scratch buffer the size of the body, allocated on first use.
 *   - Errors name the first bad event's index, the byte offset of the fault
 *     and a reason; the line number is counted from the offset only when
 *     there is an error, so the happy path does no line bookkeeping.
 *   - Lone surrogate escapes ("\ud800") are accepted: RFC 8259's grammar
 *     allows any \uXXXX (as Python's json does).  Raw bytes must be valid
 *     UTF-8 (no overlong forms, no encoded surrogates, nothing above
 *     U+10FFFF); a byte order mark is refused.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "codec.h"
#include "port/port.h"

/* Whitespace between tokens: JSON's four, and NDJSON's three (no '\n'). */
static const uint8_t WS_JSON[256] = {[' '] = 1, ['\t'] = 1, ['\n'] = 1, ['\r'] = 1};
static const uint8_t WS_LINE[256] = {[' '] = 1, ['\t'] = 1, ['\r'] = 1};

/* Bytes that end the fast scan of a string: '"', '\\', controls, non-ASCII. */
static const uint8_t STRING_STOP[256] = {
    [0 ... 0x1f] = 1, ['"'] = 1, ['\\'] = 1, [0x80 ... 0xff] = 1,
};

static const uint8_t IS_HEX[256] = {
    ['0' ... '9'] = 1, ['a' ... 'f'] = 1, ['A' ... 'F'] = 1,
};

static inline int is_digit(uint8_t c)
{
    return (uint8_t)(c - '0') < 10;
}

/* Describes the byte at p for an error message ("'x'", "a line break"). */
static void describe(const json_splitter *j, const uint8_t *p, char *out, size_t cap)
{
    if (p >= j->end)
        snprintf(out, cap, "the end of the body");
    else if (*p == '\n')
        snprintf(out, cap, "a line break");
    else if (*p >= 0x20 && *p < 0x7f)
        snprintf(out, cap, "'%c'", *p);
    else
        snprintf(out, cap, "byte 0x%02x", *p);
}

static const uint8_t *fail(json_splitter *j, const uint8_t *p, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), cold, noinline));

static const uint8_t *fail(json_splitter *j, const uint8_t *p, const char *fmt, ...)
{
    if (j->code == 0) {
        j->code = COMET_E_BAD_JSON;
        j->fault = p;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(j->reason, sizeof j->reason, fmt, ap);
        va_end(ap);
    }
    return NULL;
}

static __attribute__((cold, noinline)) const uint8_t *unexpected(json_splitter *j,
                                                                 const uint8_t *p,
                                                                 const char *wanted)
{
    char what[32];
    describe(j, p, what, sizeof what);
    return fail(j, p, "expected %s, found %s", wanted, what);
}

/* ---- whitespace and compaction -------------------------------------------- */

/* Scratch bytes past the body's size: room for drop_gap's fixed-size copy. */
#define SCRATCH_SLACK 16

/* Copies the event's bytes from j->run up to from into scratch and resumes the
 * run at to: the whitespace [from, to) is left out of the stored event.  0, or
 * COMET_E_NOMEM (also kept in j->code). */
static int drop_gap(json_splitter *j, const uint8_t *from, const uint8_t *to)
{
    if (!j->copying) {
        if (!j->scratch) {
            j->scratch = sys_malloc((size_t)(j->end - j->body) + SCRATCH_SLACK);
            if (!j->scratch) {
                j->code = set_error(COMET_E_NOMEM, "out of memory for a %zu-byte body",
                                    (size_t)(j->end - j->body));
                return j->code;
            }
        }
        j->copying = 1;
        j->event_out = j->scratch_len;
    }
    size_t n = (size_t)(from - j->run);
    uint8_t *out = j->scratch + j->scratch_len;
    /* Runs between gaps are short (a key, a value): one fixed 16-byte copy,
     * inlined, instead of a call; it may write past the run into the slack
     * and read past it inside the body, never past either end. */
    if (n <= 16 && j->end - j->run >= 16)
        memcpy(out, j->run, 16);
    else
        memcpy(out, j->run, n);
    j->scratch_len += n;
    j->run = to;
    return 0;
}

/* Skips whitespace inside an event (dropping it); NULL only on NOMEM.  p is
 * a byte <= ' ': whitespace, or a byte the grammar will refuse. */
static inline __attribute__((always_inline)) const uint8_t *skip_gap(json_splitter *j, const uint8_t *p)
{
    if (!j->ws[*p])
        return p;
    const uint8_t *q = p + 1;
    while (q < j->end && j->ws[*q])
        q++;
    if (drop_gap(j, p, q))
        return NULL;
    return q;
}

/* Skips whitespace between events (nothing to drop: it is outside them). */
static inline const uint8_t *skip_outer(const json_splitter *j, const uint8_t *p,
                                        const uint8_t *ws)
{
    while (p < j->end && ws[*p])
        p++;
    return p;
}

/* ---- tokens ----------------------------------------------------------------- */

#if defined(__SSE2__)
/* Bit i is set when v's byte i ends the fast scan of a string. */
static inline uint32_t stop_bits_16(__m128i v)
{
    const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    /* signed v < 0x20 holds for controls and for every byte >= 0x80 */
    __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                               _mm_cmplt_epi8(v, space));
    return (uint32_t)_mm_movemask_epi8(hit);
}
#endif

/* Bit i of the result is set when block[i] ends the fast scan of a string. */
static inline uint64_t stop_mask_64(const uint8_t *block)
{
#if defined(__SSE2__)
    uint64_t lo = stop_bits_16(_mm_loadu_si128((const __m128i *)block)) |
                  stop_bits_16(_mm_loadu_si128((const __m128i *)(block + 16))) << 16;
    uint64_t hi = stop_bits_16(_mm_loadu_si128((const __m128i *)(block + 32))) |
                  stop_bits_16(_mm_loadu_si128((const __m128i *)(block + 48))) << 16;
    return lo | hi << 32;
#else
    uint64_t mask = 0;
    for (int i = 0; i < 64; i++)
        mask |= (uint64_t)STRING_STOP[block[i]] << i;
    return mask;
#endif
}

/* Computes the stop mask of the 64-byte block (counted from the body's
 * start) holding offset off; the last, partial block's bytes past the end
 * stop the scan.  off is below the body's length. */
static __attribute__((noinline)) void load_stop_mask(json_splitter *j, size_t off)
{
    size_t block = off & ~(size_t)63, left = (size_t)(j->end - j->body) - block;
    if (left >= 64) {
        j->mask = stop_mask_64(j->body + block);
    } else {
        j->mask = ~(uint64_t)0 << left;
        for (size_t i = 0; i < left; i++)
            j->mask |= (uint64_t)STRING_STOP[j->body[block + i]] << i;
    }
    j->block = block;
}

/* The first byte at or after p that ends the fast scan of a string (or end).
 * Strings are short and many: the stop mask of the 64-byte block holding p is
 * computed once and kept, so the next strings of the same block cost a shift
 * and a count of trailing zeros each. */
static inline __attribute__((always_inline)) const uint8_t *find_string_stop(json_splitter *j,
                                                                              const uint8_t *p)
{
    size_t off = (size_t)(p - j->body);
    for (;;) {
        size_t rel = off - j->block;
        if (rel < 64) {
            uint64_t m = j->mask >> rel;
            if (m) /* a bit past the end stops at the end itself */
                return p + __builtin_ctzll(m);
            off = j->block + 64;
            p = j->body + off;
        }
        if (p >= j->end)
            return j->end;
        load_stop_mask(j, off);
    }
}

/* One UTF-8 sequence starting at p (p[0] >= 0x80), per Unicode's table 3-7. */
static const uint8_t *scan_utf8(json_splitter *j, const uint8_t *p)
{
    uint8_t c = p[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0; /* no overlong forms */
        if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return fail(j, p, "invalid UTF-8: byte 0x%02x cannot start a character", c);
    }
    if ((size_t)(j->end - p) <= need)
        return fail(j, p, "invalid UTF-8: the body ends inside a character");
    if (p[1] < lo || p[1] > hi)
        return fail(j, p, "invalid UTF-8: byte 0x%02x cannot follow 0x%02x", p[1], c);
    for (size_t i = 2; i <= need; i++)
        if ((p[i] & 0xC0) != 0x80)
            return fail(j, p, "invalid UTF-8: byte 0x%02x cannot continue a character", p[i]);
    return p + need + 1;
}

/* The rest of a string from its first stop byte p: escapes, UTF-8, errors. */
static __attribute__((noinline)) const uint8_t *scan_string_rest(json_splitter *j,
                                                                 const uint8_t *open,
                                                                 const uint8_t *p)
{
    const uint8_t *end = j->end;
    for (;; p = find_string_stop(j, p)) {
        if (p >= end)
            return fail(j, open, "a string is not closed before the end of the body");
        uint8_t c = *p;
        if (c == '"')
            return p + 1;
        if (c == '\\') {
            if (end - p < 2)
                return fail(j, open, "a string is not closed before the end of the body");
            switch (p[1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p += 2;
                continue;
            case 'u':
                if (end - p < 6 || !(IS_HEX[p[2]] & IS_HEX[p[3]] & IS_HEX[p[4]] & IS_HEX[p[5]]))
                    return fail(j, p, "\\u must be followed by four hexadecimal digits");
                p += 6;
                continue;
            default: {
                char what[32];
                describe(j, p + 1, what, sizeof what);
                return fail(j, p, "invalid escape: backslash followed by %s", what);
            }
            }
        }
        if (c < 0x20) {
            if (c == '\n')
                return fail(j, p, "a line break inside a string (write it as \\n)");
            return fail(j, p, "control character 0x%02x inside a string (escape it as \\u%04x)", c, c);
        }
        p = scan_utf8(j, p);
        if (!p)
            return NULL;
    }
}

/* A string from its opening quote; returns the byte after the closing one.
 * Inlined: most strings end at their first stop byte, a '"'. */
static inline __attribute__((always_inline)) const uint8_t *scan_string(json_splitter *j,
                                                                        const uint8_t *p)
{
    const uint8_t *q = find_string_stop(j, p + 1);
    if (q < j->end && *q == '"')
        return q + 1;
    return scan_string_rest(j, p, q);
}

/* The first byte at or after p that is not a digit (or end).  Eight bytes
 * at a time where eight are left: a byte b is a digit when its high nibble
 * and that of b + 6 are both 3; a carry out of a non-digit byte can only
 * disturb the bytes after it, which no longer count. */
static inline const uint8_t *skip_digits(const uint8_t *p, const uint8_t *end)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (end - p >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        const uint64_t high = 0xF0F0F0F0F0F0F0F0u;
        uint64_t not_digit = ((x & high) | (((x + 0x0606060606060606u) & high) >> 4))
                             ^ 0x3333333333333333u;
        if (not_digit)
            return p + __builtin_ctzll(not_digit) / 8; /* little-endian: the first byte is lowest */
        p += 8;
    }
#endif
    while (p < end && is_digit(*p))
        p++;
    return p;
}

static const uint8_t *scan_number(json_splitter *j, const uint8_t *p)
{
    const uint8_t *end = j->end;
    if (*p == '-')
        p++;
    if (p == end || !is_digit(*p))
        return unexpected(j, p, "a digit after '-'");
    if (*p == '0') {
        p++;
        if (p < end && is_digit(*p))
            return fail(j, p, "a number cannot have a leading zero");
    } else {
        p = skip_digits(p + 1, end);
    }
    if (p < end && *p == '.') {
        p++;
        if (p == end || !is_digit(*p))
            return unexpected(j, p, "a digit after the decimal point");
        p = skip_digits(p + 1, end);
    }
    if (p < end && (*p | 0x20) == 'e') {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p == end || !is_digit(*p))
            return unexpected(j, p, "a digit in the exponent");
        p = skip_digits(p + 1, end);
    }
    return p;
}

static const uint8_t *scan_literal(json_splitter *j, const uint8_t *p, const char *word, size_t n)
{
    if ((size_t)(j->end - p) < n || memcmp(p, word, n) != 0)
        return unexpected(j, p, "a value (true, false and null are the only bare words)");
    return p + n;
}

/* One JSON value starting at p (not whitespace); returns the byte after it. */
static const uint8_t *scan_value(json_splitter *j, const uint8_t *p)
{
    const uint8_t *const end = j->end;
    uint8_t closer[COMET_JSON_MAX_DEPTH];
    int depth = 0;
    const uint8_t *q;

    /* After a value the next byte is looked for as ',' or a closer, and a
     * value as its first byte, before any whitespace check; before and after
     * a key (and after an opener) one compare (*p <= ' ') says there is
     * none.  Compact JSON, the common case, takes no whitespace path. */
value:
    if (p >= end)
        return unexpected(j, p, "a value");
    switch (*p) {
    case '"':
        p = scan_string(j, p);
        break;
    case '{':
    case '[':
        if (depth == COMET_JSON_MAX_DEPTH)
            return fail(j, p, "nesting is deeper than %d levels", COMET_JSON_MAX_DEPTH);
        closer[depth++] = *p == '{' ? '}' : ']';
        p++;
        if (p < end && *p <= ' ' && !(p = skip_gap(j, p)))
            return NULL;
        if (p < end && *p == closer[depth - 1]) {
            depth--;
            p++;
            goto after;
        }
        if (closer[depth - 1] == '}')
            goto key;
        goto value;
    case 't':
        p = scan_literal(j, p, "true", 4);
        break;
    case 'f':
        p = scan_literal(j, p, "false", 5);
        break;
    case 'n':
        p = scan_literal(j, p, "null", 4);
        break;
    case '-': case '0': case '1': case '2': case '3': case '4':
    case '5': case '6': case '7': case '8': case '9':
        p = scan_number(j, p);
        break;
    default:
        if (*p <= ' ') {
            if (!(q = skip_gap(j, p)))
                return NULL;
            if (q != p) {
                p = q;
                goto value;
            }
        }
        return unexpected(j, p, "a value");
    }
    if (!p)
        return NULL;
after:
    if (depth == 0)
        return p;
    if (p < end) {
        if (*p == ',') {
            p++;
            if (closer[depth - 1] == '}')
                goto key;
            goto value;
        }
        if (*p == closer[depth - 1]) {
            depth--;
            p++;
            goto after;
        }
        if (*p <= ' ') {
            if (!(q = skip_gap(j, p)))
                return NULL;
            if (q != p) {
                p = q;
                goto after;
            }
        }
    }
    return unexpected(j, p, closer[depth - 1] == '}' ? "',' or '}' after an object member"
                                                     : "',' or ']' after an array element");
key:
    if (p < end && *p <= ' ' && !(p = skip_gap(j, p)))
        return NULL;
    if (p >= end || *p != '"')
        return unexpected(j, p, "a string (an object key)");
    if (!(p = scan_string(j, p)))
        return NULL;
    if (p < end && *p <= ' ' && !(p = skip_gap(j, p)))
        return NULL;
    if (p >= end || *p != ':')
        return unexpected(j, p, "':' after an object key");
    p++;
    goto value;
}

/* ---- events ----------------------------------------------------------------- */

/* Scans the event at p and hands it to the emitter; returns the byte after it. */
static const uint8_t *scan_event(json_splitter *j, const uint8_t *p)
{
    j->index = j->count;
    j->copying = 0;
    j->run = p;
    const uint8_t *q = scan_value(j, p);
    if (!q)
        return NULL;
    uint64_t sent = (uint64_t)(q - p);
    if (sent > j->max_entry) {
        j->code = COMET_E_ENTRY_TOO_LARGE;
        j->fault = p;
        snprintf(j->reason, sizeof j->reason, "the event is %llu bytes as sent; max_entry_bytes is %u",
                 (unsigned long long)sent, j->max_entry);
        return NULL;
    }
    const uint8_t *event = p;
    uint64_t len = sent;
    if (j->copying) {
        size_t n = (size_t)(q - j->run);
        memcpy(j->scratch + j->scratch_len, j->run, n);
        j->scratch_len += n;
        event = j->scratch + j->event_out;
        len = j->scratch_len - j->event_out;
    }
    int rc = j->emit(j->ctx, event, (uint32_t)len, j->count);
    if (rc) {
        j->code = rc;
        j->fault = p;
        snprintf(j->reason, sizeof j->reason, "%s", comet_last_error());
        return NULL;
    }
    j->count++;
    return q;
}

static const uint8_t BOM[3] = {0xEF, 0xBB, 0xBF};

static int no_events(json_splitter *j, const char *why)
{
    j->code = COMET_E_NO_EVENTS;
    j->fault = j->end;
    j->index = COMET_NO_INDEX;
    snprintf(j->reason, sizeof j->reason, "%s", why);
    return j->code;
}

static int split_json(json_splitter *j)
{
    const uint8_t *p = skip_outer(j, j->body, WS_JSON), *end = j->end;
    if (p == end)
        return no_events(j, "the body holds no event");
    if (*p != '[') {
        if (!(p = scan_event(j, p)))
            return j->code;
        p = skip_outer(j, p, WS_JSON);
        if (p != end) {
            j->index = COMET_NO_INDEX;
            unexpected(j, p, "nothing after the JSON value");
            return j->code;
        }
        return 0;
    }
    p = skip_outer(j, p + 1, WS_JSON);
    if (p < end && *p == ']') {
        p = skip_outer(j, p + 1, WS_JSON);
        if (p != end) {
            j->index = COMET_NO_INDEX;
            unexpected(j, p, "nothing after the closing ']'");
            return j->code;
        }
        return no_events(j, "the JSON array holds no event");
    }
    for (;;) {
        if (!(p = scan_event(j, p)))
            return j->code;
        p = skip_outer(j, p, WS_JSON);
        if (p < end && *p == ',') {
            p = skip_outer(j, p + 1, WS_JSON);
            continue;
        }
        if (p < end && *p == ']')
            break;
        j->index = j->count - 1;
        unexpected(j, p, "',' or ']' after an event of the array");
        return j->code;
    }
    p = skip_outer(j, p + 1, WS_JSON);
    if (p != end) {
        j->index = COMET_NO_INDEX;
        unexpected(j, p, "nothing after the closing ']'");
        return j->code;
    }
    return 0;
}

static int split_ndjson(json_splitter *j)
{
    const uint8_t *p = j->body, *end = j->end;
    while (p < end) {
        p = skip_outer(j, p, WS_LINE);
        if (p == end)
            break;
        if (*p == '\n') { /* a blank line */
            p++;
            continue;
        }
        if (!(p = scan_event(j, p)))
            return j->code;
        p = skip_outer(j, p, WS_LINE);
        if (p < end && *p != '\n') {
            unexpected(j, p, "the end of the line after the event (one JSON value per line)");
            return j->code;
        }
        if (p < end) /* past the '\n'; the last line may have none (end + 1 is undefined) */
            p++;
    }
    if (j->count == 0)
        return no_events(j, "the body holds no event (every line is blank)");
    return 0;
}

int json_split(json_splitter *j, const uint8_t *body, size_t len, uint32_t format,
               uint32_t max_entry, json_emit_fn emit, void *ctx)
{
    memset(j, 0, sizeof *j);
    j->body = body;
    j->end = body + len;
    j->format = format;
    j->max_entry = max_entry ? max_entry : COMET_MAX_ENTRY_BYTES_LIMIT;
    j->emit = emit;
    j->ctx = ctx;
    j->index = COMET_NO_INDEX;
    j->block = (size_t)0 - 64; /* no stop mask yet: off - block is off + 64, never below 64 */
    if (format != COMET_BODY_JSON && format != COMET_BODY_NDJSON)
        return j->code = set_error(COMET_E_INVALID, "body format %u is not COMET_BODY_JSON (1) "
                                   "or COMET_BODY_NDJSON (2)", format);
    if (len >= 3 && memcmp(body, BOM, 3) == 0) {
        fail(j, body, "the body starts with a byte order mark (U+FEFF), which JSON does not allow");
        return j->code;
    }
    j->ws = format == COMET_BODY_JSON ? WS_JSON : WS_LINE;
    return format == COMET_BODY_JSON ? split_json(j) : split_ndjson(j);
}

void json_split_free(json_splitter *j)
{
    free(j->scratch);
    j->scratch = NULL;
}

void json_report(const json_splitter *j, comet_ingest_result *res)
{
    if (!res)
        return;
    if (j->code == 0 || !j->fault) {
        res->error_index = COMET_NO_INDEX;
        res->error_line = 0;
        res->error_offset = 0;
        res->error_reason[0] = 0;
        return;
    }
    uint64_t line = 1;
    for (const uint8_t *p = j->body; (p = memchr(p, '\n', (size_t)(j->fault - p))) != NULL; p++)
        line++;
    res->error_index = j->index;
    res->error_line = line;
    res->error_offset = (uint64_t)(j->fault - j->body);
    snprintf(res->error_reason, sizeof res->error_reason, "%s", j->reason);
}
