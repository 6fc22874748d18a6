/*
 * pbwrite.h - writing protobuf into a growing buffer (ojbuf), for the OTLP
 * encoder (otlp_encode.c and its parts).
 *
 * Fields are written in the order they are called; proto3 defaults are left
 * out unless `always` says the field is a oneof member or optional (present
 * even when zero).  A length-delimited field is opened before its length is
 * known: one byte is reserved, and pb_close moves the content when the
 * length needs more.  Records are short, so a move is of a few hundred bytes;
 * the groups around a whole batch move once each.
 */
#ifndef COMET_PBWRITE_H
#define COMET_PBWRITE_H

#include <stdint.h>
#include <string.h>

#include "otlp_json.h"

enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };

typedef struct pbmark {
    size_t tag, content;
} pbmark;


static inline void pb_varint(ojbuf *b, uint64_t v)
{
    uint8_t *w = ojbuf_room(b, 10);
    if (!w)
        return;
    size_t n = 0;
    while (v >= 0x80) {
        w[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    w[n++] = (uint8_t)v;
    b->len += n;
}

static inline void pb_tag(ojbuf *b, uint32_t field, uint32_t wt)
{
    pb_varint(b, (uint64_t)field << 3 | wt);
}

static inline void pb_le(ojbuf *b, uint64_t v, size_t n)
{
    uint8_t *w = ojbuf_room(b, n);
    if (!w)
        return;
    memcpy(w, &v, n); /* little-endian, as every machine this builds for */
    b->len += n;
}

static inline void pb_uint(ojbuf *b, uint32_t field, uint64_t v)
{
    if (v) {
        pb_tag(b, field, WT_VARINT);
        pb_varint(b, v);
    }
}

static inline void pb_fixed64(ojbuf *b, uint32_t field, uint64_t v)
{
    if (v) {
        pb_tag(b, field, WT_I64);
        pb_le(b, v, 8);
    }
}

static inline void pb_fixed32(ojbuf *b, uint32_t field, uint32_t v)
{
    if (v) {
        pb_tag(b, field, WT_I32);
        pb_le(b, v, 4);
    }
}

/* A double; with `always` (a oneof member, an optional field) even 0. */
static inline void pb_double(ojbuf *b, uint32_t field, double x, int always)
{
    uint64_t bits;
    memcpy(&bits, &x, 8);
    if (bits || always) {
        pb_tag(b, field, WT_I64);
        pb_le(b, bits, 8);
    }
}

static inline void pb_bytes(ojbuf *b, uint32_t field, const uint8_t *p, size_t n, int always)
{
    if (n || always) {
        pb_tag(b, field, WT_LEN);
        pb_varint(b, n);
        oj_put(b, p, n);
    }
}

/* Opens a length-delimited field: its tag and one byte for its length. */
static inline pbmark pb_open(ojbuf *b, uint32_t field)
{
    pbmark m;
    m.tag = b->len;
    pb_tag(b, field, WT_LEN);
    oj_byte(b, 0);
    m.content = b->len;
    return m;
}

static inline size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes the length of the field opened at m, moving its content when the
 * length needs more than the byte reserved. */
static inline void pb_close(ojbuf *b, pbmark m)
{
    if (b->failed || b->over)
        return;
    size_t len = b->len - m.content, n = varint_size(len);
    if (n > 1) {
        if (!ojbuf_room(b, n - 1))
            return;
        memmove(b->p + m.content + n - 1, b->p + m.content, len);
        b->len += n - 1;
    }
    uint8_t *w = b->p + m.content - 1;
    while (len >= 0x80) {
        *w++ = (uint8_t)(len | 0x80);
        len >>= 7;
    }
    *w = (uint8_t)len;
}

/* pb_close, or nothing at all when the field stayed empty. */
static inline void pb_close_or_drop(ojbuf *b, pbmark m)
{
    if (b->len == m.content)
        b->len = m.tag;
    else
        pb_close(b, m);
}

#endif /* COMET_PBWRITE_H */
