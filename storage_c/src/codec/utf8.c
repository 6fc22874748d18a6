/*
 * utf8.c - validation of UTF-8 text, as protobuf and JSON readers need it:
 * Unicode's table 3-7 (no overlong forms, no encoded surrogates, nothing
 * above U+10FFFF).  ASCII runs are skipped eight bytes at a time.
 */
#include <string.h>

#include "utf8.h"

const uint8_t *utf8_invalid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        uint8_t lo = 0x80, hi = 0xBF;
        size_t need;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            return s + i;
        }
        if (n - i <= need || s[i + 1] < lo || s[i + 1] > hi)
            return s + i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return s + i;
        i += need + 1;
    }
    return NULL;
}
