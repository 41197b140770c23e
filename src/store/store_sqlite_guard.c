/* The embedded store's files, watched: the key file, its -wal and -shm, and the lock file are
 * the ones the store opened, or the store is lost. A process that keeps writing to files
 * deleted under it keeps claims nobody else can read, while a second gateway started on the
 * same path makes new files and takes a new lock: two stores would answer for the same keys,
 * and the same call would run once on each. So the store compares the files at the path with
 * the ones it opened (device and inode, and the lock's link count) before every write batch and
 * every GUARD_CHECK_MS, and once they differ it refuses every operation until a restart: the
 * files at the path, and whoever holds their lock, are the store from then on.
 *
 * Before a write batch the comparison is four stat() calls, as many as the batch's own writes
 * at one client; so the writer first reads the files' inotify events instead: an unlink or a
 * rename over a file changes its link count (IN_ATTRIB) and a rename away moves it
 * (IN_MOVE_SELF), both queued before the call that did it returns. With no event there is
 * nothing to compare; with any (a chmod, a touch, a lost watch, a full queue) the files are
 * compared as before. */
#include "store_sqlite_int.h"

#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const suffixes[SQ_GUARD_FILES] = {"", "-wal", "-shm", ".lock"};

void sq_guard_init(sq_guard_t *g, const char *path, int lock_fd)
{
    memset(g, 0, sizeof(*g));
    for (int i = 0; i < SQ_GUARD_FILES; i++) {
        g->files[i].path = xasprintf("%s%s", path, suffixes[i]);
        struct stat st;
        /* the lock by its descriptor: that is the one held */
        int rc = i == SQ_GUARD_FILES - 1 ? fstat(lock_fd, &st) : stat(g->files[i].path, &st);
        if (rc == 0) {
            g->files[i].dev = st.st_dev;
            g->files[i].ino = st.st_ino;
            g->files[i].known = true;
        }
    }
    g->lock_fd = lock_fd;
    g->watch_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    for (int i = 0; i < SQ_GUARD_FILES && g->watch_fd >= 0; i++) {
        if (g->files[i].known && inotify_add_watch(g->watch_fd, g->files[i].path,
                                                   IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF) < 0) {
            /* cannot watch them all (the watch limit): compare before every batch */
            close(g->watch_fd);
            g->watch_fd = -1;
        }
    }
}

void sq_guard_free(sq_guard_t *g)
{
    if (g->watch_fd >= 0)
        close(g->watch_fd);
    for (int i = 0; i < SQ_GUARD_FILES; i++)
        free(g->files[i].path);
    memset(g, 0, sizeof(*g));
    g->watch_fd = -1;
}

bool sq_guard_check(const sq_guard_t *g, char *why, size_t len)
{
    struct stat st;
    if (g->lock_fd >= 0 && fstat(g->lock_fd, &st) == 0 && st.st_nlink == 0) {
        snprintf(why, len, "the lock file %s was deleted", g->files[SQ_GUARD_FILES - 1].path);
        return false;
    }
    for (int i = 0; i < SQ_GUARD_FILES; i++) {
        const sq_guard_file_t *f = &g->files[i];
        if (!f->known)
            continue;
        if (stat(f->path, &st) != 0) {
            if (errno != ENOENT)
                continue; /* cannot look (EACCES, EIO): a write will say what is wrong */
            snprintf(why, len, "%s was deleted", f->path);
            return false;
        }
        if (st.st_dev != f->dev || st.st_ino != f->ino) {
            snprintf(why, len, "%s was replaced by another file", f->path);
            return false;
        }
    }
    return true;
}

bool sq_guard_quick(sq_guard_t *g, char *why, size_t len)
{
    if (g->watch_fd < 0)
        return sq_guard_check(g, why, len);
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool events = false;
    for (;;) {
        ssize_t n = read(g->watch_fd, buf, sizeof(buf));
        if (n > 0) {
            events = true;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        /* the watch cannot be read: compare before every batch from now on */
        close(g->watch_fd);
        g->watch_fd = -1;
        events = true;
        break;
    }
    return !events || sq_guard_check(g, why, len);
}
