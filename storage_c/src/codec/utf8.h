/*
 * utf8.h - UTF-8 validation (utf8.c), shared by the readers of protobuf
 * strings (otlp_wire.c) and of JSON text (jsonread.c).
 */
#ifndef COMET_UTF8_H
#define COMET_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The first byte of s[0, n) that is not valid UTF-8 (Unicode's table 3-7:
 * no overlong forms, no surrogates, nothing above U+10FFFF), or NULL. */
const uint8_t *utf8_invalid(const uint8_t *s, size_t n);

#endif /* COMET_UTF8_H */
