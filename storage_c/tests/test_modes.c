/* Who may open what the core creates (FORMAT.md, "Modes"): its user alone
 * (0700, 0600) whatever the umask, or in a data directory shared with a group
 * (its set-group-ID bit) the group as well (02770, 0660), the umask's taking
 * of the group's write undone; a data directory left open to others is
 * closed at open.  Every lock the core takes can be taken against it by
 * anyone who can open the file, read-only included: these modes are what
 * keeps other users from doing so.  And group names that are path steps. */
#include <fcntl.h>
#include <sys/stat.h>

#include "util.h"

static int dirs_seen, files_seen, wrong;
static mode_t want_dir, want_file;

static int check_mode(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)ftw;
    mode_t mode = sb->st_mode & 07777;
    if (flag == FTW_D || flag == FTW_DP) {
        dirs_seen++;
        if (mode != want_dir) {
            fprintf(stderr, "    %s is %04o, not %04o\n", path, (unsigned)mode, (unsigned)want_dir);
            wrong++;
        }
    } else {
        files_seen++;
        if (mode != want_file) {
            fprintf(stderr, "    %s is %04o, not %04o\n", path, (unsigned)mode, (unsigned)want_file);
            wrong++;
        }
    }
    return 0;
}

/* Makes every kind of file of a data directory: stream, shards, segments and
 * indexes, state, offsets, keys, .slots. */
static void fill_data_dir(const char *data)
{
    comet_db *db = open_db(data, 1 << 20);
    CHECK_OK(comet_claim_slot(db, -1));
    comet_stream *s = open_stream(db, "ev", 2);
    CHECK_OK(comet_append(s, 0, "{}", 2, 0, -1, COMET_APPEND_WAIT));
    comet_group *g;
    CHECK_OK(comet_group_open(s, 0, "readers", 7, 1, &g));
    CHECK_OK(comet_close(db));
}

static void check_tree(const char *data, mode_t dir_mode, mode_t file_mode)
{
    want_dir = dir_mode;
    want_file = file_mode;
    dirs_seen = files_seen = wrong = 0;
    CHECK(nftw(data, check_mode, 16, FTW_PHYS) == 0);
    CHECK(dirs_seen >= 3 && files_seen >= 6); /* data, ev, shard-0000; .slots, stream.meta, state, offsets, a segment, its index */
    CHECK(wrong == 0);
}

/* A data directory made by the core (made_as 0) or by hand with mode made_as,
 * filled under umask mask: every directory dir_mode, every file file_mode. */
static void check_made(mode_t made_as, mode_t mask, mode_t dir_mode, mode_t file_mode)
{
    char *dir = scratch_dir();
    char data[512];
    snprintf(data, sizeof data, "%s/data", dir);
    if (made_as)
        CHECK(mkdir(data, 0700) == 0 && chmod(data, made_as) == 0);
    mode_t old = umask(mask);
    fill_data_dir(data);
    umask(old);
    check_tree(data, dir_mode, file_mode);
    rm_tree(dir);
}

static void test_what_the_core_creates_is_its_users_alone(void) { check_made(0, 022, 0700, 0600); }

/* The umask would take the group's write, and more: undone. */
static void test_a_shared_data_directory_gives_its_group_read_and_write(void)
{
    check_made(02770, 027, 02770, 0660);
}

static void test_a_data_directory_open_to_others_is_closed_at_open(void)
{
    char *dir = scratch_dir();
    char data[512];
    snprintf(data, sizeof data, "%s/data", dir);
    struct {
        mode_t before, after;
    } cases[] = {{0755, 0700}, {0777, 0700}, {0700, 0700}, {02775, 02770}, {02770, 02770}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(mkdir(data, 0700) == 0 && chmod(data, cases[i].before) == 0);
        comet_db *db = open_db(data, 1 << 20);
        CHECK_OK(comet_close(db));
        struct stat sb;
        CHECK(stat(data, &sb) == 0);
        CHECK((sb.st_mode & 07777) == cases[i].after);
        rm_tree(data);
    }
    rm_tree(dir);
}

static void test_group_names_that_are_path_steps_are_refused(void)
{
    CHECK(comet_validate_group_name(".", 1) == COMET_E_GROUP_NAME);
    CHECK(comet_validate_group_name("..", 2) == COMET_E_GROUP_NAME);
    CHECK(strstr(comet_last_error(), "names a directory") != NULL);
    CHECK_OK(comet_validate_group_name("...", 3));
    CHECK_OK(comet_validate_group_name(".a", 2));
}

int main(void)
{
    RUN(test_what_the_core_creates_is_its_users_alone);
    RUN(test_a_shared_data_directory_gives_its_group_read_and_write);
    RUN(test_a_data_directory_open_to_others_is_closed_at_open);
    RUN(test_group_names_that_are_path_steps_are_refused);
    return 0;
}
