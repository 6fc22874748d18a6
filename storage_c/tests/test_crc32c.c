/* CRC32C: published test vectors through both implementations, and the two
 * implementations agreeing on every length and alignment (the hardware path
 * switches to three interleaved lanes above 768 bytes). */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "comet.h"

static void vectors(int impl)
{
    uint8_t buf[48];
    CHECK(comet_crc32c(0, "123456789", 9, impl) == 0xE3069283u);
    CHECK(comet_crc32c(0, "", 0, impl) == 0);
    memset(buf, 0, 32);
    CHECK(comet_crc32c(0, buf, 32, impl) == 0x8A9136AAu);
    memset(buf, 0xFF, 32);
    CHECK(comet_crc32c(0, buf, 32, impl) == 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    CHECK(comet_crc32c(0, buf, 32, impl) == 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    CHECK(comet_crc32c(0, buf, 32, impl) == 0x113FDB5Cu);
    /* iSCSI read command PDU (RFC 3720, B.4) */
    static const uint8_t pdu[48] = {0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                    0x14, 0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,
                                    0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0};
    CHECK(comet_crc32c(0, pdu, 48, impl) == 0xD9963A56u);
    /* continuing over pieces equals one pass */
    CHECK(comet_crc32c(comet_crc32c(0, "12345", 5, impl), "6789", 4, impl) == 0xE3069283u);
}

static void test_portable_vectors(void)
{
    vectors(1);
}

static void test_hardware_vectors(void)
{
    if (!comet_crc32c_hw_available()) {
        fprintf(stderr, "    (no CRC instruction on this CPU: hardware path not tested)\n");
        return;
    }
    vectors(2);
}

static void test_paths_agree(void)
{
    static uint8_t buf[20000];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof buf; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
    for (size_t len = 0; len < 3000; len += (len < 100 ? 1 : 37))
        for (size_t align = 0; align < 8; align++)
            CHECK(comet_crc32c(7, buf + align, len, 1) == comet_crc32c(7, buf + align, len, 0));
    CHECK(comet_crc32c(0, buf, sizeof buf - 3, 1) == comet_crc32c(0, buf, sizeof buf - 3, 0));
}

int main(void)
{
    RUN(test_portable_vectors);
    RUN(test_hardware_vectors);
    RUN(test_paths_agree);
    return 0;
}
