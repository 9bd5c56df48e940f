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
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#define FLUSH_INTERVAL_MS 1000
/* The kernel's own writeback sends a page at most this long after its write (dirty_expire_centisecs). */
#define KERNEL_EXPIRE_MS 30000

/*
 * syncfs through the mountpoint, if it is still this mount: 0, ENODEV when it
 * no longer is (unmounted: the unmount sent every page), or syncfs's error.
 * The descriptor lives only for the sync, and the unmount waits for a sync
 * under way (js_unmount), so an unmount is never made lazy by one.
 */
static int sync_mount(struct volume *v)
{
	pthread_mutex_lock(&v->sync_lock);
	int err = v->sync_closed ? ENODEV : 0;
	int fd = err == 0 ? open(v->mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	if (err == 0 && fd == -1)
		err = errno == ENOENT || errno == ENOTCONN ? ENODEV : errno;
	struct statfs sf;
	struct stat st;
	if (fd != -1 && (fstatfs(fd, &sf) != 0 || fstat(fd, &st) != 0))
		err = errno;
	else if (fd != -1 && (sf.f_type != FUSE_SUPER_MAGIC || st.st_ino != v->root_ino))
		err = ENODEV;
	else if (fd != -1 && syncfs(fd) != 0)
		err = errno;
	if (fd != -1)
		close(fd);
	pthread_mutex_unlock(&v->sync_lock);
	return err;
}

void sync_close(struct volume *v)
{
	pthread_mutex_lock(&v->sync_lock);
	v->sync_closed = true;
	pthread_mutex_unlock(&v->sync_lock);
}

struct timespec after_ms(int ms)
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
		/* A failed flush leaves the pages to the next one or the kernel's own writeback. */
		(void)sync_mount(v);
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

/* A sync JavaScript asked for: syncfs may wait on the disk, so it runs off the main thread. */
struct sync_request {
	napi_async_work work;
	napi_deferred deferred;
	struct volume *v;
	int err;
};

static void sync_execute(napi_env env, void *data)
{
	(void)env;
	struct sync_request *r = data;
	r->err = sync_mount(r->v);
}

static void sync_complete(napi_env env, napi_status status, void *data)
{
	struct sync_request *r = data;
	napi_value result;
	if (status == napi_ok && (r->err == 0 || r->err == ENODEV)) {
		napi_get_boolean(env, r->err == 0, &result);
		napi_resolve_deferred(env, r->deferred, result);
	} else {
		int err = status == napi_ok ? r->err : EIO;
		napi_value code, message;
		const char *name = strerrorname_np(err);
		napi_create_string_utf8(env, name != NULL ? name : "EIO", NAPI_AUTO_LENGTH, &code);
		napi_create_string_utf8(env, strerror(err), NAPI_AUTO_LENGTH, &message);
		napi_create_error(env, code, message, &result);
		napi_reject_deferred(env, r->deferred, result);
	}
	napi_delete_async_work(env, r->work);
	volume_put(r->v);
	free(r);
}

/* syncMount(handle): true once the mount's pages reached the backing tree, false when it is no longer mounted. */
napi_value js_sync_mount(napi_env env, napi_callback_info info)
{
	struct volume *v = volume_arg(env, info, NULL, "syncMount");
	if (v == NULL)
		return NULL;
	struct sync_request *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return throw_errno(env, ENOMEM, "syncMount");
	napi_value promise, name;
	r->v = v;
	if (napi_create_promise(env, &r->deferred, &promise) != napi_ok ||
	    napi_create_string_utf8(env, "gitcsi_sync_mount", NAPI_AUTO_LENGTH, &name) != napi_ok ||
	    napi_create_async_work(env, NULL, name, sync_execute, sync_complete, r, &r->work) != napi_ok) {
		free(r);
		return throw_errno(env, EINVAL, "syncMount");
	}
	atomic_fetch_add(&v->refs, 1); /* the request's, dropped when it completes */
	if (napi_queue_async_work(env, r->work) != napi_ok) {
		volume_put(v);
		napi_delete_async_work(env, r->work);
		free(r);
		return throw_errno(env, EINVAL, "syncMount");
	}
	return promise;
}
