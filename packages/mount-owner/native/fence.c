/*
 * Epoch fencing. Once the epoch no longer holds the volume every request is
 * answered EIO here, in the worker thread, without asking JavaScript; and the
 * kernel is told to drop what it cached (pages, attributes, entries), so a
 * descriptor opened before the loss reads EIO too and stat asks us again.
 */
#include "volume.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * The clock a lease's serving time is kept on: no wall clock step moves it,
 * and unlike CLOCK_MONOTONIC it goes on while the machine is suspended, so a
 * node that wakes up finds its serving time over.
 */
int64_t serving_clock_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_BOOTTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* JavaScript learns of refusals in batches: one queued call carries them all. */
static void report_refusal(struct volume *v)
{
	if (atomic_fetch_add(&v->refused_pending, 1) == 0)
		napi_call_threadsafe_function(v->on_fenced, NULL, napi_tsfn_nonblocking);
}

bool refused(fuse_req_t req)
{
	struct volume *v = fuse_req_userdata(req);
	if (!atomic_load(&v->fenced)) {
		/* The lease's end fences at once, whether or not JS timers ran. */
		if (serving_clock_ms() < atomic_load(&v->serve_until_ms))
			return false;
		fence(v);
	}
	report_refusal(v);
	fuse_reply_err(req, EIO);
	return true;
}

/*
 * Runs in its own thread: the kernel may wait in an invalidation for a request
 * that a worker thread must answer, so a worker never invalidates.
 */
static void *invalidate_all(void *arg)
{
	struct volume *v = arg;
	struct entry_ref *refs;
	size_t count = nodes_snapshot(v, &refs);
	for (size_t i = 0; i < count; i++) {
		fuse_lowlevel_notify_inval_inode(v->se, refs[i].id, 0, 0);
		if (refs[i].name != NULL)
			fuse_lowlevel_notify_inval_entry(v->se, refs[i].parent, refs[i].name,
							 strlen(refs[i].name));
		free(refs[i].name);
	}
	free(refs);
	return NULL;
}

void fence(struct volume *v)
{
	if (atomic_exchange(&v->fenced, true))
		return;
	pthread_mutex_lock(&v->life);
	if (!v->ended && !v->invalidating && start_thread(&v->invalidation, invalidate_all, v) == 0)
		v->invalidating = true;
	pthread_mutex_unlock(&v->life);
}

/* Waits for the invalidation, if one ran; the caller then sees no cached page. */
void fence_settle(struct volume *v)
{
	pthread_mutex_lock(&v->life);
	if (v->invalidating) {
		pthread_join(v->invalidation, NULL);
		v->invalidating = false;
	}
	pthread_mutex_unlock(&v->life);
}

/* The session must outlive an invalidation in flight; none starts after this. */
void fence_join(struct volume *v)
{
	fence_settle(v);
	pthread_mutex_lock(&v->life);
	v->ended = true;
	pthread_mutex_unlock(&v->life);
}
