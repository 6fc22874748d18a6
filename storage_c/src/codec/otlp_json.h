/*
 * otlp_json.h - the JSON text of OTLP events (otlp_json.c): the growing
 * buffer the OTLP decoder (otlp.c) writes events into and the encoder
 * (otlp_encoder.h, pbwrite.h) its requests, the writers of JSON text, and the
 * value_types list of an event.  Private to codec/.
 */
#ifndef COMET_OTLP_JSON_H
#define COMET_OTLP_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A growing byte buffer.  A failed allocation sets `failed`, and a write that
 * would pass `limit` sets `over`; either drops every later write, so that
 * writers need not return codes: the decoder checks the marks once per event
 * (an event over max_event_bytes then costs no memory beyond the limit). */
typedef struct ojbuf {
    uint8_t *p;
    size_t len, cap;
    size_t limit; /* 0 (none), or the length writes may not pass (> len when set) */
    size_t room;  /* what writes may fill without a call: cap, or limit if lower */
    int failed, over;
} ojbuf;

/* Makes room for n more bytes: 1, or 0 with failed or over set. */
int ojbuf_grow(ojbuf *b, size_t n);
/* Sets the limit (0: none) and clears `over`. */
void ojbuf_limit(ojbuf *b, size_t limit);
void ojbuf_free(ojbuf *b);

/* Where n more bytes may be written (then add n to len), or NULL when the
 * buffer has failed or is over its limit. */
static inline uint8_t *ojbuf_room(ojbuf *b, size_t n)
{
    if (b->room - b->len < n && !ojbuf_grow(b, n))
        return NULL;
    return b->p + b->len;
}

static inline void oj_put(ojbuf *b, const void *s, size_t n)
{
    if (n == 0)
        return;
    uint8_t *w = ojbuf_room(b, n);
    if (w) {
        memcpy(w, s, n);
        b->len += n;
    }
}

/* A literal (inlined, so its length is a constant). */
static inline void oj_lit(ojbuf *b, const char *s)
{
    oj_put(b, s, strlen(s));
}

static inline void oj_byte(ojbuf *b, uint8_t c)
{
    uint8_t *w = ojbuf_room(b, 1);
    if (w) {
        *w = c;
        b->len++;
    }
}

void oj_string(ojbuf *b, const uint8_t *s, size_t n); /* "s", escaped; s is valid UTF-8 */
void oj_u64(ojbuf *b, uint64_t v);
void oj_i64(ojbuf *b, int64_t v);
/* A finite double as a number that reads back as the same double and has a
 * '.' or an 'e'; another as the string "NaN", "Infinity" or "-Infinity". */
void oj_double(ojbuf *b, double x);
void oj_base64(ojbuf *b, const uint8_t *s, size_t n); /* "..." standard, padded */
void oj_hex(ojbuf *b, const uint8_t *s, size_t n);    /* "..." lowercase */

/* Where a value sits in its event: the tokens of its JSON pointer (RFC 6901),
 * a name or (name NULL) an array index.  Tokens are kept as found and
 * rendered only for a value that goes into value_types. */
#define OJ_PATH_MAX 48
typedef struct ojtoken {
    const uint8_t *name;
    uint32_t len;
    uint32_t index;
} ojtoken;

typedef struct ojpath {
    uint32_t n;
    ojtoken t[OJ_PATH_MAX];
} ojpath;

/* value_types entries: JSON pointers (rendered into chars) and their kind. */
enum { OJ_BYTES = 1, OJ_DOUBLE = 2 };
typedef struct ojtype {
    uint32_t off, len, kind;
} ojtype;

typedef struct ojtypes {
    ojbuf chars;
    ojbuf list; /* ojtype[] */
} ojtypes;

static inline size_t ojtypes_count(const ojtypes *t)
{
    return t->list.len / sizeof(ojtype);
}

static inline void ojtypes_clear(ojtypes *t)
{
    t->chars.len = 0;
    t->list.len = 0;
}

void ojtypes_add(ojtypes *t, const ojpath *path, uint32_t kind);
void ojtypes_free(ojtypes *t);
/* ',"value_types":{...}' for the entries of n lists (nothing when there is
 * none): sorted by pointer (byte order), the last of equal pointers kept.
 * Failures (the sort's scratch, types' own) are set in b->failed. */
void oj_value_types(ojbuf *b, const ojtypes *const *lists, int n);

#endif /* COMET_OTLP_JSON_H */
