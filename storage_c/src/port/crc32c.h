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

typedef void (*crc32c4_fn)(uint32_t reg[4], const uint8_t *const p[4], const size_t n[4]);

/* The implementation chosen at load time: hardware if the CPU has it. */
extern crc32c_fn crc32c_extend;
/* Extends four registers, each over its own buffer, at once: the
 * instruction's latency is hidden by running the chains side by side, which
 * is how a batch of short entries gets checksummed. */
extern crc32c4_fn crc32c_extend4;

/* Nonzero when the CPU has the instruction (known once loaded): callers that
 * inline the kernels below choose their hardware path with it. */
extern int crc32c_hw_ok;

uint32_t crc32c_portable(uint32_t reg, const uint8_t *p, size_t n);
void crc32c_portable4(uint32_t reg[4], const uint8_t *const p[4], const size_t n[4]);
/* NULL when the CPU lacks the instruction. */
crc32c_fn crc32c_hardware(void);

/* The hardware kernels, inline so that a hot loop elsewhere (log/entry.c)
 * can have them without a call: a function of the same target may inline
 * them, and must run only when crc32c_hw_ok. */
#if defined(__x86_64__)
#include <nmmintrin.h>
#define CRC32C_HW_TARGET __attribute__((target("sse4.2")))
#define CRC32C_STEP64(r, w) ((uint32_t)_mm_crc32_u64((r), (w)))
#define CRC32C_STEP32(r, w) _mm_crc32_u32((r), (w))
#define CRC32C_STEP16(r, w) _mm_crc32_u16((r), (w))
#define CRC32C_STEP8(r, b) _mm_crc32_u8((r), (b))
#elif defined(__aarch64__)
#include <arm_acle.h>
#define CRC32C_HW_TARGET __attribute__((target("+crc")))
#define CRC32C_STEP64(r, w) __crc32cd((r), (w))
#define CRC32C_STEP32(r, w) __crc32cw((r), (w))
#define CRC32C_STEP16(r, w) __crc32ch((r), (w))
#define CRC32C_STEP8(r, b) __crc32cb((r), (b))
#endif

#ifdef CRC32C_HW_TARGET
#include <string.h>

/* One chain, 8 bytes per step: short buffers (crc32c_extend interleaves
 * three chains over long ones). */
CRC32C_HW_TARGET static inline uint32_t crc32c_hw_short(uint32_t reg, const uint8_t *p, size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        reg = CRC32C_STEP64(reg, w);
    }
    if (n >= 4) {
        uint32_t w;
        memcpy(&w, p, 4);
        reg = CRC32C_STEP32(reg, w);
        p += 4;
        n -= 4;
    }
    if (n >= 2) {
        uint16_t w;
        memcpy(&w, p, 2);
        reg = CRC32C_STEP16(reg, w);
        p += 2;
        n -= 2;
    }
    if (n)
        reg = CRC32C_STEP8(reg, *p);
    return reg;
}

/* Four buffers at once, each of its own length: the instruction's latency
 * (three cycles, one per cycle issued) is hidden by running four chains side
 * by side over their common length; each finishes alone (a few bytes:
 * entries of a batch are usually of similar sizes). */
CRC32C_HW_TARGET static inline void crc32c_hw_four(uint32_t reg[4], const uint8_t *const p[4],
                                                   const size_t n[4])
{
    size_t common = n[0];
    for (int k = 1; k < 4; k++)
        if (n[k] < common)
            common = n[k];
    uint32_t r0 = reg[0], r1 = reg[1], r2 = reg[2], r3 = reg[3];
    const uint8_t *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
    size_t i = 0;
    for (; i + 8 <= common; i += 8) {
        uint64_t w0, w1, w2, w3;
        memcpy(&w0, p0 + i, 8);
        memcpy(&w1, p1 + i, 8);
        memcpy(&w2, p2 + i, 8);
        memcpy(&w3, p3 + i, 8);
        r0 = CRC32C_STEP64(r0, w0);
        r1 = CRC32C_STEP64(r1, w1);
        r2 = CRC32C_STEP64(r2, w2);
        r3 = CRC32C_STEP64(r3, w3);
    }
    reg[0] = crc32c_hw_short(r0, p0 + i, n[0] - i);
    reg[1] = crc32c_hw_short(r1, p1 + i, n[1] - i);
    reg[2] = crc32c_hw_short(r2, p2 + i, n[2] - i);
    reg[3] = crc32c_hw_short(r3, p3 + i, n[3] - i);
}
#endif

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
