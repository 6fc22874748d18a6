/*
 * codec.h - what the request codecs offer the rest of the core.
 *
 * codec/ turns request bodies into events and stored events back into
 * requests; it stores nothing and knows nothing of the log: it sits on
 * port/ alone.  The log (log/batch.c, comet_ingest) splits a JSON body with
 * json_split below; the OTLP decoder and encoder are reached through comet.h
 * only (comet_otlp_decode, comet_otlp_encode).  Inside the folder:
 *
 *   json.c          validates a JSON, NDJSON or lines body and splits it into events
 *   jsonread.c/.h   a reader of JSON values (the OTLP encoder's input)
 *   utf8.c/.h       UTF-8 validation
 *   otlp.c          OTLP/protobuf export requests to JSON events
 *   otlp_wire.c/.h  the protobuf wire format, read
 *   otlp_json.c/.h  the JSON text those events are written in (ojbuf)
 *   otlp_encode.c, otlp_records.c, otlp_values.c, otlp_encoder.h, pbwrite.h
 *                   stored events back to OTLP/protobuf requests
 */
#ifndef COMET_CODEC_H
#define COMET_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "comet.h"

/* Receives each event in order; a non-zero return (a COMET_E_* code, with
 * comet_last_error set) stops the split. */
typedef int (*json_emit_fn)(void *ctx, const uint8_t *event, uint32_t len, uint64_t index);

typedef struct json_splitter {
    const uint8_t *body, *end;
    uint32_t format;          /* COMET_BODY_* */
    uint32_t max_entry;       /* largest event as sent */
    const uint8_t *ws;        /* whitespace table inside events */
    json_emit_fn emit;
    void *ctx;
    uint64_t count;           /* events emitted */
    /* string scanning: stop bytes of the 64-byte block at offset `block`
     * (none yet: -64); bits past the body's end are set */
    size_t block;
    uint64_t mask;
    /* compaction: events with whitespace inside are copied without it */
    uint8_t *scratch;         /* body-sized, allocated on first use */
    size_t scratch_len;
    size_t event_out;         /* where the current event starts in scratch */
    const uint8_t *run;       /* start of the bytes not yet copied */
    int copying;
    /* the first error */
    int code;
    uint64_t index;           /* event index, COMET_NO_INDEX outside events */
    const uint8_t *fault;
    char reason[160];
} json_splitter;

/* Validates and splits; 0 or the error code (details kept in j). Event
 * pointers handed to emit stay valid until json_split_free. */
int json_split(json_splitter *j, const uint8_t *body, size_t len, uint32_t format,
               uint32_t max_entry, json_emit_fn emit, void *ctx);
void json_split_free(json_splitter *j);
/* Copies the error's index, line, offset and reason into res. */
void json_report(const json_splitter *j, comet_ingest_result *res);

#endif /* COMET_CODEC_H */
