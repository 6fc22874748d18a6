/*
 * jsonread.h - a pull reader of one JSON value (jsonread.c), for the code
 * that turns stored events back into something else (otlp_encode.c).
 *
 * json.c checks and splits request bodies without building anything; this
 * reader is its counterpart for the way out: it hands out strings
 * (unescaped), numbers (classified and converted) and the members of objects
 * and arrays one at a time, and skips what the caller does not want.  Every
 * value it hands out has been checked against RFC 8259 (strings as UTF-8,
 * escapes included: a lone surrogate is refused, since what the caller
 * writes must be valid UTF-8), so the caller only decides what a value
 * means.  The first problem is kept in `why` and every later call fails.
 */
#ifndef COMET_JSONREAD_H
#define COMET_JSONREAD_H

#include <stddef.h>
#include <stdint.h>

enum jtype { J_NONE, J_NULL, J_FALSE, J_TRUE, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT };

/* A byte range: a value's text, or a string's characters. */
typedef struct jspan {
    const uint8_t *p;
    uint32_t len;
} jspan;

typedef struct jnum {
    int integer;   /* no fraction and no exponent */
    int negative;
    int overflow;  /* integer: the magnitude does not fit 64 bits */
    uint64_t magnitude;
    jspan text;
} jnum;

typedef struct jreader {
    const uint8_t *p, *end;
    /* Unescaped strings go here; the owner sizes it once per value (a string
     * never grows when unescaped), so spans into it stay valid until
     * jr_reset_scratch. */
    uint8_t *scratch;
    size_t scratch_len, scratch_cap;
    const char *why; /* the first problem, NULL while there is none */
    uint32_t depth, max_depth;
    int fresh; /* an object or array was just opened: no ',' before its first member */
} jreader;

/* Reads `text`; scratch must hold len bytes. */
void jr_init(jreader *r, const uint8_t *text, size_t len, uint8_t *scratch, size_t cap,
             uint32_t max_depth);
/* The type of the next value, after whitespace; J_NONE at the end or after a problem. */
enum jtype jr_peek(jreader *r);
/* 1 when only whitespace is left. */
int jr_at_end(jreader *r);
/* Each returns 1, or 0 with `why` set. */
int jr_null(jreader *r);
int jr_bool(jreader *r, int *out);
int jr_number(jreader *r, jnum *out);
/* The number as strtod reads its text (integers too): computed on demand,
 * since most numbers of an event are integers that are never doubles. */
double jnum_value(const jnum *n);
int jr_string(jreader *r, jspan *out);      /* the characters, unescaped, valid UTF-8 */
int jr_skip(jreader *r, jspan *text);       /* any value; its text when text != NULL */
/* A value's extent only: strings to their closing quote, brackets matched,
 * nothing else checked (the caller reads with the others what it uses). */
int jr_skip_fast(jreader *r, jspan *text);
/* Objects and arrays: begin, then next until it returns 0 with no problem
 * (the end), reading one member (or its key then its value) per round. */
int jr_object(jreader *r);
int jr_next_key(jreader *r, jspan *key); /* 1: a key (then read its value), 0: the end or a problem */
int jr_array(jreader *r);
int jr_next_item(jreader *r);            /* 1: an item follows, 0: the end or a problem */
int jr_fail(jreader *r, const char *why);

static inline int jspan_is(jspan s, const char *lit, size_t n)
{
    return s.len == n && __builtin_memcmp(s.p, lit, n) == 0;
}
#define JSPAN_IS(s, lit) jspan_is((s), (lit), sizeof(lit) - 1)

#endif /* COMET_JSONREAD_H */
