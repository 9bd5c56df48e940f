/*
 * The flusher. With the writeback cache a write stays in the kernel's pages
 * until a close, an fsync or the kernel's own writeback (up to 30 s later)
 * sends it here. The git worker sees the backing tree only, so an application
 * that keeps a file open and writes would wait that long for its commit.
 * While a file is open for writing, the flusher syncs the mount once a
 * second: the write reaches the backing tree within a second, then the
 * worker's quiesce runs as it did before the cache.
 */
#include "volume.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#define FLUSH_INTERVAL_MS 1000
/* The kernel's own writeback sends a page at most this long after its write (dirty_expire_centisecs). */
#define KERNEL_EXPIRE_MS 30000

/*
 * syncfs through the mountpoint, if it is still this mount: a flush that
 * cannot open it leaves the pages to the kernel's own writeback, no loss.
 * The descriptor lives only for the sync, so an unmount is never kept busy
 * for long (and js_unmount stops the flusher first).
 */
static void sync_mount(const struct volume *v)
{
	int fd = open(v->mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd == -1)
		return;
	struct statfs sf;
	struct stat st;
	if (fstatfs(fd, &sf) == 0 && sf.f_type == FUSE_SUPER_MAGIC && fstat(fd, &st) == 0 && st.st_ino == v->root_ino)
		syncfs(fd);
	close(fd);
}

static struct timespec after_ms(int ms)
{
	struct timespec at;
	clock_gettime(CLOCK_REALTIME, &at);
	at.tv_sec += ms / 1000;
	at.tv_nsec += (long)(ms % 1000) * 1000000;
	if (at.tv_nsec >= 1000000000) {
		at.tv_sec++;
		at.tv_nsec -= 1000000000;
	}
	return at;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Pages may wait in the kernel: a file is open for writing, or a resumed server's first 30 s. */
static bool flush_due(struct volume *v, int64_t always_until)
{
	return atomic_load(&v->writeback) && (atomic_load(&v->writers) > 0 || now_ms() < always_until);
}

/*
 * A resumed server counts an earlier one's writer once the kernel uses its
 * handle; pages written before the handover may wait for the kernel's own
 * writeback until then, so it flushes for that long whatever the count.
 * With nothing due the thread sleeps until a writer opens: an idle node
 * wakes it never.
 */
static void *flush_loop(void *arg)
{
	struct volume *v = arg;
	int64_t always_until = v->resumed ? now_ms() + KERNEL_EXPIRE_MS : 0;
	pthread_mutex_lock(&v->flush_lock);
	while (!v->flush_stopped) {
		while (!v->flush_stopped && !flush_due(v, always_until))
			pthread_cond_wait(&v->flush_wake, &v->flush_lock);
		struct timespec at = after_ms(FLUSH_INTERVAL_MS);
		while (!v->flush_stopped && pthread_cond_timedwait(&v->flush_wake, &v->flush_lock, &at) != ETIMEDOUT)
			;
		if (v->flush_stopped)
			break;
		pthread_mutex_unlock(&v->flush_lock);
		sync_mount(v);
		pthread_mutex_lock(&v->flush_lock);
	}
	pthread_mutex_unlock(&v->flush_lock);
	return NULL;
}

void add_writers(struct volume *v, int delta)
{
	if (atomic_fetch_add(&v->writers, delta) == 0 && delta > 0) {
		pthread_mutex_lock(&v->flush_lock);
		pthread_cond_broadcast(&v->flush_wake);
		pthread_mutex_unlock(&v->flush_lock);
	}
}

int flush_start(struct volume *v)
{
	pthread_mutex_lock(&v->flush_lock);
	int err = start_thread(&v->flusher, flush_loop, v);
	v->flushing = err == 0;
	pthread_mutex_unlock(&v->flush_lock);
	return err;
}

void flush_stop(struct volume *v)
{
	pthread_mutex_lock(&v->flush_lock);
	v->flush_stopped = true;
	pthread_cond_broadcast(&v->flush_wake);
	bool join = v->flushing;
	v->flushing = false;
	pthread_mutex_unlock(&v->flush_lock);
	if (join)
		pthread_join(v->flusher, NULL);
}
