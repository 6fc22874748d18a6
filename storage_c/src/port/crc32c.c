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
static int cpu_has_crc(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    return (c & bit_SSE4_2) != 0;
}
#elif defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
static int cpu_has_crc(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
}
#endif

void crc32c_portable4(uint32_t reg[4], const uint8_t *const p[4], const size_t n[4])
{
    for (int k = 0; k < 4; k++)
        reg[k] = crc32c_portable(reg[k], p[k], n[k]);
}

#ifdef CRC32C_HW_TARGET
/* Unaligned 8-byte loads are cheap on both architectures: no alignment loop. */
CRC32C_HW_TARGET static uint32_t crc32c_hw(uint32_t reg, const uint8_t *p, size_t n)
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
            reg = CRC32C_STEP64(reg, w0);
            r1 = CRC32C_STEP64(r1, w1);
            r2 = CRC32C_STEP64(r2, w2);
            p += 8;
        }
        reg = shift_block(shift_block(reg) ^ r1) ^ r2;
        p += 2 * BLOCK;
        n -= 3 * BLOCK;
    }
    return crc32c_hw_short(reg, p, n);
}

crc32c_fn crc32c_hardware(void)
{
    return cpu_has_crc() ? crc32c_hw : NULL;
}

static crc32c4_fn crc32c_hardware4(void)
{
    return cpu_has_crc() ? crc32c_hw_four : NULL;
}
#else
crc32c_fn crc32c_hardware(void)
{
    return NULL;
}

static crc32c4_fn crc32c_hardware4(void)
{
    return NULL;
}
#endif

crc32c_fn crc32c_extend = crc32c_portable;
crc32c4_fn crc32c_extend4 = crc32c_portable4;
int crc32c_hw_ok;

__attribute__((constructor)) static void crc32c_init(void)
{
    build_tables();
    build_shift_tables();
    crc32c_fn hw = crc32c_hardware();
    crc32c4_fn hw4 = crc32c_hardware4();
    crc32c_extend = hw ? hw : crc32c_portable;
    crc32c_extend4 = hw4 ? hw4 : crc32c_portable4;
    crc32c_hw_ok = hw != NULL;
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
