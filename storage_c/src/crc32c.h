/*
 * crc32c.h - CRC32C (Castagnoli), the checksum of every entry and file header.
 *
 * crc32c_extend() works on the raw register (no pre/post inversion) so that a
 * checksum can be continued over pieces: header fields, then the payload.
 * crc32c_value() is the conventional CRC32C of a buffer.  Stored checksums are
 * masked (see crc32c_mask) so that a checksum of data holding checksums does
 * not degenerate.
 */
#ifndef COMET_CRC32C_H
#define COMET_CRC32C_H

#include <stddef.h>
#include <stdint.h>

typedef uint32_t (*crc32c_fn)(uint32_t reg, const uint8_t *p, size_t n);

typedef uint32_t (*crc32c_copy_fn)(uint32_t reg, uint8_t *dst, const uint8_t *src, size_t n);
typedef void (*crc32c_copy4_fn)(uint32_t reg[4], uint8_t *const dst[4], const uint8_t *const src[4],
                                size_t n);

/* The implementation chosen at load time: hardware if the CPU has it. */
extern crc32c_fn crc32c_extend;
/* Extends the register over n bytes of src while copying them to dst: each
 * byte is loaded once for both (an entry's payload, written into its segment). */
extern crc32c_copy_fn crc32c_copy;
/* The same for four independent buffers at once: the instruction's latency is
 * hidden by running the chains side by side, which is how a batch of short
 * entries gets written. */
extern crc32c_copy4_fn crc32c_copy4;

uint32_t crc32c_portable(uint32_t reg, const uint8_t *p, size_t n);
/* NULL when the CPU lacks the instruction. */
crc32c_fn crc32c_hardware(void);

static inline uint32_t crc32c_value(const void *p, size_t n)
{
    return ~crc32c_extend(0xFFFFFFFFu, (const uint8_t *)p, n);
}

static inline uint32_t crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* Masked checksum of a 64-byte file header's first 60 bytes. */
static inline uint32_t crc32c_header(const void *header)
{
    return crc32c_mask(crc32c_value(header, 60));
}

#endif
