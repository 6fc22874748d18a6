/*
 * compress.c - zstd frames: compression for the JSON ingest path, decompression
 * of flagged entries on the read path.
 *
 * Writers of lists of payloads compress in Python with the zstandard package
 * (outside any lock, with the GIL released); comet_ingest, which splits the
 * events itself, compresses here before it takes the shard lock.  Readers
 * decompress here, straight into the
 * caller's buffer, so that the batch read returns final payloads and the
 * Arrow path stays zero-copy.  Frames must record their content size
 * (zstandard does by default), which tells the reader how much room to make.
 * One context per thread and direction avoids an allocation per entry.
 */
#include <pthread.h>
#include <zstd.h>

#include "log.h"

static pthread_key_t dctx_key;
static pthread_once_t dctx_once = PTHREAD_ONCE_INIT;

static void free_dctx(void *p)
{
    ZSTD_freeDCtx(p);
}

static void make_key(void)
{
    pthread_key_create(&dctx_key, free_dctx);
}

static ZSTD_DCtx *thread_dctx(void)
{
    pthread_once(&dctx_once, make_key);
    ZSTD_DCtx *d = pthread_getspecific(dctx_key);
    if (!d) {
        d = ZSTD_createDCtx();
        if (d)
            pthread_setspecific(dctx_key, d);
    }
    return d;
}

int64_t compress_frame_size(const uint8_t *src, size_t len)
{
    unsigned long long n = ZSTD_getFrameContentSize(src, len);
    if (n == ZSTD_CONTENTSIZE_UNKNOWN || n == ZSTD_CONTENTSIZE_ERROR || n > INT64_MAX)
        return -1;
    return (int64_t)n;
}

int64_t decompress_frame(uint8_t *dst, size_t cap, const uint8_t *src, size_t len)
{
    ZSTD_DCtx *d = thread_dctx();
    if (!d)
        return set_error(COMET_E_NOMEM, "cannot allocate a zstd context");
    size_t n = ZSTD_decompressDCtx(d, dst, cap, src, len);
    if (ZSTD_isError(n))
        return set_error(COMET_E_DECOMPRESS, "zstd: %s", ZSTD_getErrorName(n));
    return (int64_t)n;
}

static pthread_key_t cctx_key;
static pthread_once_t cctx_once = PTHREAD_ONCE_INIT;

static void free_cctx(void *p)
{
    ZSTD_freeCCtx(p);
}

static void make_ckey(void)
{
    pthread_key_create(&cctx_key, free_cctx);
}

size_t compress_bound(size_t len)
{
    return ZSTD_compressBound(len);
}

int64_t compress_frame(uint8_t *dst, size_t cap, const uint8_t *src, size_t len, int level)
{
    pthread_once(&cctx_once, make_ckey);
    ZSTD_CCtx *c = pthread_getspecific(cctx_key);
    if (!c) {
        c = ZSTD_createCCtx();
        if (!c)
            return set_error(COMET_E_NOMEM, "cannot allocate a zstd context");
        pthread_setspecific(cctx_key, c);
    }
    size_t n = ZSTD_compressCCtx(c, dst, cap, src, len, level);
    if (ZSTD_isError(n))
        return set_error(COMET_E_IO, "zstd: %s", ZSTD_getErrorName(n));
    return (int64_t)n;
}
