/*
 * crc32c.c - CRC32C with a hardware path and a portable fallback.
 *
 * The hardware path uses the SSE4.2 crc32 instruction on x86-64 and the CRC
 * extension on AArch64, eight bytes per instruction.  The instruction has a
 * latency of three cycles but a throughput of one, so one dependency chain
 * leaves two thirds of the unit idle; long buffers are therefore cut into
 * three blocks whose CRCs run interleaved and are then combined with a linear
 * "shift by n zero bytes" operator (CRC is linear over GF(2)).  Entries are
 * usually short, so the combination only starts above a few hundred bytes.
 *
 * The portable path is slicing-by-8 over tables built at load time.
 * The choice is made once, by a constructor, from the CPU's feature bits.
 */
#include "crc32c.h"

#include <string.h>

#include "comet.h"

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];

static void build_tables(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int t = 1; t < 8; t++)
            table[t][b] = (table[t - 1][b] >> 8) ^ table[0][table[t - 1][b] & 0xFF];
}

uint32_t crc32c_portable(uint32_t reg, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        reg = (reg >> 8) ^ table[0][(reg ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= reg;
        reg = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
              table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^
              table[2][(w >> 40) & 0xFF] ^ table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        reg = (reg >> 8) ^ table[0][(reg ^ *p++) & 0xFF];
    return reg;
}

/* ---- shift operator: the register after n zero bytes, as four byte tables -- */

#define BLOCK 256u /* bytes per interleaved lane and step */

static uint32_t shift_table[4][256]; /* shift by BLOCK bytes */

static uint32_t shift_slow(uint32_t reg, size_t zero_bytes)
{
    while (zero_bytes--)
        reg = (reg >> 8) ^ table[0][reg & 0xFF];
    return reg;
}

static void build_shift_tables(void)
{
    uint32_t basis[32];
    for (int i = 0; i < 32; i++)
        basis[i] = shift_slow(1u << i, BLOCK);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int bit = 0; bit < 8; bit++)
                if (b & (1u << bit))
                    v ^= basis[8 * k + bit];
            shift_table[k][b] = v;
        }
}

static inline uint32_t shift_block(uint32_t reg)
{
    return shift_table[0][reg & 0xFF] ^ shift_table[1][(reg >> 8) & 0xFF] ^
           shift_table[2][(reg >> 16) & 0xFF] ^ shift_table[3][reg >> 24];
}

/* ---- hardware ------------------------------------------------------------- */

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#define HW_TARGET __attribute__((target("sse4.2")))
#define HW_STEP64(r, w) ((uint32_t)_mm_crc32_u64((r), (w)))
#define HW_STEP32(r, w) _mm_crc32_u32((r), (w))
#define HW_STEP16(r, w) _mm_crc32_u16((r), (w))
#define HW_STEP8(r, b) _mm_crc32_u8((r), (b))
static int cpu_has_crc(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    return (c & bit_SSE4_2) != 0;
}
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#define HW_TARGET __attribute__((target("+crc")))
#define HW_STEP64(r, w) __crc32cd((r), (w))
#define HW_STEP32(r, w) __crc32cw((r), (w))
#define HW_STEP16(r, w) __crc32ch((r), (w))
#define HW_STEP8(r, b) __crc32cb((r), (b))
static int cpu_has_crc(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
}
#endif

static uint32_t crc32c_portable_copy(uint32_t reg, uint8_t *dst, const uint8_t *src, size_t n)
{
    if (n)
        memcpy(dst, src, n);
    return crc32c_portable(reg, src, n);
}

static void crc32c_portable_copy4(uint32_t reg[4], uint8_t *const dst[4],
                                  const uint8_t *const src[4], size_t n)
{
    for (int k = 0; k < 4; k++)
        reg[k] = crc32c_portable_copy(reg[k], dst[k], src[k], n);
}

#ifdef HW_TARGET
/* Unaligned 8-byte loads are cheap on both architectures: no alignment loop. */
HW_TARGET static uint32_t crc32c_hw(uint32_t reg, const uint8_t *p, size_t n)
{
    /* Three lanes of BLOCK bytes each, combined after every step. */
    while (n >= 3 * BLOCK) {
        uint32_t r1 = 0, r2 = 0;
        const uint8_t *end = p + BLOCK;
        while (p < end) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p, 8);
            memcpy(&w1, p + BLOCK, 8);
            memcpy(&w2, p + 2 * BLOCK, 8);
            reg = HW_STEP64(reg, w0);
            r1 = HW_STEP64(r1, w1);
            r2 = HW_STEP64(r2, w2);
            p += 8;
        }
        reg = shift_block(shift_block(reg) ^ r1) ^ r2;
        p += 2 * BLOCK;
        n -= 3 * BLOCK;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        reg = HW_STEP64(reg, w);
        p += 8;
        n -= 8;
    }
    if (n >= 4) {
        uint32_t w;
        memcpy(&w, p, 4);
        reg = HW_STEP32(reg, w);
        p += 4;
        n -= 4;
    }
    if (n >= 2) {
        uint16_t w;
        memcpy(&w, p, 2);
        reg = HW_STEP16(reg, w);
        p += 2;
        n -= 2;
    }
    if (n)
        reg = HW_STEP8(reg, *p);
    return reg;
}

/* Checksums n bytes of src while copying them to dst, 8 at a time: the bytes
 * are loaded once, for both, which is what an entry's payload needs (it is
 * checksummed and written into the segment in the same pass). */
HW_TARGET static uint32_t crc32c_hw_copy(uint32_t reg, uint8_t *dst, const uint8_t *src,
                                         size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, src + i, 8);
        reg = HW_STEP64(reg, w);
        memcpy(dst + i, &w, 8);
    }
    if (i + 4 <= n) {
        uint32_t w;
        memcpy(&w, src + i, 4);
        reg = HW_STEP32(reg, w);
        memcpy(dst + i, &w, 4);
        i += 4;
    }
    if (i + 2 <= n) {
        uint16_t w;
        memcpy(&w, src + i, 2);
        reg = HW_STEP16(reg, w);
        memcpy(dst + i, &w, 2);
        i += 2;
    }
    if (i < n) {
        reg = HW_STEP8(reg, src[i]);
        dst[i] = src[i];
    }
    return reg;
}

/* Four copies at once: the checksum instruction's latency is hidden by
 * running four independent chains side by side. */
HW_TARGET static void crc32c_hw_copy4(uint32_t reg[4], uint8_t *const dst[4],
                                      const uint8_t *const src[4], size_t n)
{
    uint32_t r0 = reg[0], r1 = reg[1], r2 = reg[2], r3 = reg[3];
    const uint8_t *s0 = src[0], *s1 = src[1], *s2 = src[2], *s3 = src[3];
    uint8_t *d0 = dst[0], *d1 = dst[1], *d2 = dst[2], *d3 = dst[3];
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w0, w1, w2, w3;
        memcpy(&w0, s0 + i, 8);
        memcpy(&w1, s1 + i, 8);
        memcpy(&w2, s2 + i, 8);
        memcpy(&w3, s3 + i, 8);
        r0 = HW_STEP64(r0, w0);
        r1 = HW_STEP64(r1, w1);
        r2 = HW_STEP64(r2, w2);
        r3 = HW_STEP64(r3, w3);
        memcpy(d0 + i, &w0, 8);
        memcpy(d1 + i, &w1, 8);
        memcpy(d2 + i, &w2, 8);
        memcpy(d3 + i, &w3, 8);
    }
    reg[0] = crc32c_hw_copy(r0, d0 + i, s0 + i, n - i);
    reg[1] = crc32c_hw_copy(r1, d1 + i, s1 + i, n - i);
    reg[2] = crc32c_hw_copy(r2, d2 + i, s2 + i, n - i);
    reg[3] = crc32c_hw_copy(r3, d3 + i, s3 + i, n - i);
}

crc32c_fn crc32c_hardware(void)
{
    return cpu_has_crc() ? crc32c_hw : NULL;
}

static crc32c_copy_fn crc32c_hardware_copy(void)
{
    return cpu_has_crc() ? crc32c_hw_copy : NULL;
}

static crc32c_copy4_fn crc32c_hardware_copy4(void)
{
    return cpu_has_crc() ? crc32c_hw_copy4 : NULL;
}
#else
crc32c_fn crc32c_hardware(void)
{
    return NULL;
}

static crc32c_copy_fn crc32c_hardware_copy(void)
{
    return NULL;
}

static crc32c_copy4_fn crc32c_hardware_copy4(void)
{
    return NULL;
}
#endif

crc32c_fn crc32c_extend = crc32c_portable;
crc32c_copy_fn crc32c_copy = crc32c_portable_copy;
crc32c_copy4_fn crc32c_copy4 = crc32c_portable_copy4;

__attribute__((constructor)) static void crc32c_init(void)
{
    build_tables();
    build_shift_tables();
    crc32c_fn hw = crc32c_hardware();
    crc32c_copy_fn hw_copy = crc32c_hardware_copy();
    crc32c_copy4_fn hw_copy4 = crc32c_hardware_copy4();
    crc32c_extend = hw ? hw : crc32c_portable;
    crc32c_copy = hw_copy ? hw_copy : crc32c_portable_copy;
    crc32c_copy4 = hw_copy4 ? hw_copy4 : crc32c_portable_copy4;
}

uint32_t comet_crc32c(uint32_t crc, const void *data, size_t len, int impl)
{
    crc32c_fn fn = crc32c_extend;
    if (impl == 1)
        fn = crc32c_portable;
    else if (impl == 2) {
        fn = crc32c_hardware();
        if (!fn)
            return 0;
    }
    return ~fn(~crc, (const uint8_t *)data, len);
}

int comet_crc32c_hw_available(void)
{
    return crc32c_hardware() != NULL;
}
