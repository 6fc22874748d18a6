/*
 * names.c - the names in a data directory: the stream and group names a
 * caller gives (checked before anything is made of them) and the names of a
 * shard's segment and index files (FORMAT.md, "Directory layout").
 *
 * They sit apart, at the bottom of log/, because files at every level name
 * things: opening a stream and retention's walk of the directory check stream
 * names, the groups check group names, and a segment's file and its index
 * share one naming rule.
 */
#include <inttypes.h>
#include <stdio.h>

#include "log.h"

int comet_validate_stream_name(const char *name, size_t len)
{
    if (!name)
        return set_error(COMET_E_STREAM_NAME, "stream name is missing");
    if (len == 0)
        return set_error(COMET_E_STREAM_NAME, "stream name is empty");
    if (len > COMET_STREAM_NAME_MAX)
        return set_error(COMET_E_STREAM_NAME, "stream name is longer than %d characters",
                         COMET_STREAM_NAME_MAX);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (alnum || (i > 0 && (c == '.' || c == '_' || c == '-')))
            continue;
        if (i == 0 && (c == '.' || c == '_' || c == '-'))
            return set_error(COMET_E_STREAM_NAME,
                             "stream name '%.*s' must start with a letter or a digit", (int)len,
                             name);
        if (c == '/')
            return set_error(COMET_E_STREAM_NAME, "stream name '%.*s' contains '/'", (int)len,
                             name);
        if (c == 0)
            return set_error(COMET_E_STREAM_NAME, "stream name contains a NUL byte");
        return set_error(COMET_E_STREAM_NAME,
                         "stream name '%.*s' contains byte 0x%02x; allowed: A-Z a-z 0-9 . _ -",
                         (int)len, name, c);
    }
    return 0;
}

int comet_validate_group_name(const char *name, size_t len)
{
    if (!name || len == 0)
        return set_error(COMET_E_GROUP_NAME, "group name is empty");
    if (len > GROUP_NAME_MAX)
        return set_error(COMET_E_GROUP_NAME,
                         "group name '%.*s...' is %zu bytes; the limit is %d (names are never cut)",
                         20, name, len, GROUP_NAME_MAX);
    if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'))
        return set_error(COMET_E_GROUP_NAME, "group name '%.*s' names a directory, not a group",
                         (int)len, name); /* a group's name is a path segment of comet ship's */
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '_' || c == '-')
            continue;
        return set_error(COMET_E_GROUP_NAME,
                         "group name '%.*s' contains byte 0x%02x; allowed: A-Z a-z 0-9 . _ -",
                         (int)len, name, c);
    }
    return 0;
}

void segment_path(char *out, const char *dir, uint64_t base, const char *suffix)
{
    /* dir is bounded by stream and shard path checks; the name is 24 bytes */
    snprintf(out, COMET_PATH_MAX, "%s/%020" PRIu64 "%s", dir, base, suffix);
}
