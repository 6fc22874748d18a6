/* otlp_roundtrip.h - the way back in the C tests: events (NDJSON, as the
 * decoder writes them) into an export request by comet_otlp_encode, and that
 * request decoded again, which must give the same events byte for byte. */
#ifndef COMET_TEST_OTLP_ROUNDTRIP_H
#define COMET_TEST_OTLP_ROUNDTRIP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comet.h"

/* Splits NDJSON into payloads (data, offsets), as comet_read returns them. */
static inline uint32_t split_lines(const char *ndjson, uint8_t **data, int32_t **offsets)
{
    size_t len = strlen(ndjson);
    uint32_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ndjson[i] == '\n';
    *data = malloc(len + 1);
    *offsets = malloc((n + 1) * sizeof **offsets);
    CHECK(*data && *offsets);
    size_t w = 0;
    uint32_t k = 0;
    (*offsets)[0] = 0;
    for (size_t i = 0; i < len; i++) {
        if (ndjson[i] == '\n')
            (*offsets)[++k] = (int32_t)w;
        else
            (*data)[w++] = (uint8_t)ndjson[i];
    }
    return n;
}

/* The events back from the request they encode to: equal to `events`. */
static inline void expect_round_trip(int32_t signal, const char *events)
{
    uint8_t *data;
    int32_t *offsets;
    uint32_t n = split_lines(events, &data, &offsets);
    comet_otlp_encoded enc;
    CHECK_OK(comet_otlp_encode(signal, 0, data, offsets, NULL, n, NULL, 0, &enc));
    if (enc.rejected)
        fprintf(stderr, "rejected event %u: %s\n", enc.rejected_index[0], enc.reasons);
    CHECK(enc.rejected == 0 && enc.count == n);
    comet_otlp_result back;
    CHECK_OK(comet_otlp_decode(signal, enc.data, enc.len, 0, 0, &back));
    if (back.events_len != strlen(events) || memcmp(back.events, events, back.events_len) != 0) {
        fprintf(stderr, "sent: %s\nback: %.*s\n", events, (int)back.events_len,
                (const char *)back.events);
        CHECK(0);
    }
    comet_otlp_free(&back);
    comet_otlp_encoded_free(&enc);
    free(data);
    free(offsets);
}

#endif
