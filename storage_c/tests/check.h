/* check.h - the smallest test harness: CHECK aborts the test with a message. */
#ifndef COMET_CHECK_H
#define COMET_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                       \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);      \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define CHECK_OK(expr)                                                                    \
    do {                                                                                  \
        long long rc_ = (long long)(expr);                                                \
        if (rc_ < 0) {                                                                    \
            fprintf(stderr, "%s:%d: %s returned %lld (%s: %s)\n", __FILE__, __LINE__,     \
                    #expr, rc_, comet_strerror((int)rc_), comet_last_error());            \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define RUN(test)                                                                         \
    do {                                                                                  \
        fprintf(stderr, "  %s\n", #test);                                                 \
        test();                                                                           \
    } while (0)

#endif
