/*
 * Epoch fencing. Once the epoch no longer holds the volume every request is
 * answered EIO here, in the worker thread, without asking JavaScript; and the
 * kernel is told to drop what it cached (pages, attributes, entries), so a
 * descriptor opened before the loss reads EIO too and stat asks us again;
 * a refusal is answered after that, so nothing cached outlives a first EIO.
 * The same invalidation, without the pages, follows a tree move behind the
 * mount (InvalidateMount).
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

/* How long a refusal waits for the fence's pass before it answers all the same. */
#define FENCE_PASS_WAIT_MS 2000

static void await_fence_pass(struct volume *v);

/* JavaScript learns of refusals in batches: one queued call carries them all. */
static void report_refusal(struct volume *v)
{
	if (atomic_fetch_add(&v->refused_pending, 1) == 0)
		napi_call_threadsafe_function(v->on_fenced, NULL, napi_tsfn_nonblocking);
}

static bool refuse(fuse_req_t req, bool settle)
{
	struct volume *v = fuse_req_userdata(req);
	if (!atomic_load(&v->fenced)) {
		/* The lease's end fences at once, whether or not JS timers ran. */
		if (serving_clock_ms() < atomic_load(&v->serve_until_ms))
			return false;
		fence(v);
	}
	report_refusal(v);
	if (settle)
		await_fence_pass(v);
	fuse_reply_err(req, EIO);
	return true;
}

bool refused(fuse_req_t req)
{
	return refuse(req, true);
}

/* With the writeback cache a WRITE is the kernel's writeback, which the fence's pass may wait for. */
bool write_refused(fuse_req_t req)
{
	return refuse(req, false);
}

/* The longest the kernel keeps an entry or attributes: an unbounded lease (no epoch) still rechecks. */
#define CACHE_MAX_MS 90000

/*
 * How long the kernel may answer from its cache: never past the lease's end,
 * so a cached answer never outlives the serving time it was given in. A tree
 * move behind the mount and the fence invalidate what the kernel cached.
 */
double cache_seconds(fuse_req_t req)
{
	struct volume *v = fuse_req_userdata(req);
	int64_t left = atomic_load(&v->serve_until_ms) - serving_clock_ms();
	if (left <= 0)
		return 0;
	return (double)(left < CACHE_MAX_MS ? left : CACHE_MAX_MS) / 1000;
}

/*
 * One pass over every id the kernel holds: first each inode (attributes, and
 * for a fenced pass its pages, dirty ones included, whose writeback is
 * refused; after a tree move the attributes suffice, since git replaces each
 * file it rewrites), then each entry. Entries come last because dropping one
 * takes its directory's lock, which a lookup waiting on a worker may hold;
 * once the inodes are done no cached answer is left, as every operation
 * then asks for attributes again.
 */
static void invalidate_known(struct volume *v, bool fenced, uint64_t asked)
{
	struct entry_ref *refs;
	size_t count = nodes_snapshot(v, &refs);
	for (size_t i = 0; i < count; i++)
		fuse_lowlevel_notify_inval_inode(v->se, refs[i].id, fenced ? 0 : -1, 0);
	pthread_mutex_lock(&v->life);
	v->inodes_done = asked;
	pthread_cond_broadcast(&v->invalidated);
	pthread_mutex_unlock(&v->life);
	for (size_t i = 0; i < count; i++) {
		if (refs[i].name != NULL)
			fuse_lowlevel_notify_inval_entry(v->se, refs[i].parent, refs[i].name,
							 strlen(refs[i].name));
		free(refs[i].name);
	}
	free(refs);
}

/*
 * Runs in its own thread, detached and holding a reference: the kernel may
 * wait in an invalidation for a request a worker thread must answer, so a
 * worker never invalidates. Passes go on until none was asked for since the
 * last began, so a fence during a move's pass gets a fenced pass of its own.
 */
static void *invalidator(void *arg)
{
	struct volume *v = arg;
	pthread_mutex_lock(&v->life);
	while (v->passes_done < v->passes_asked) {
		uint64_t asked = v->passes_asked;
		bool walk = v->stale_ids;
		v->stale_ids = false;
		pthread_mutex_unlock(&v->life);
		if (walk)
			invalidate_tree(v);
		invalidate_known(v, atomic_load(&v->fenced), asked);
		pthread_mutex_lock(&v->life);
		v->passes_done = asked;
	}
	v->invalidating = false;
	pthread_cond_broadcast(&v->invalidated);
	pthread_mutex_unlock(&v->life);
	volume_put(v);
	return NULL;
}

/* Asks for a pass, holding life; its number, or 0 once the session ended (nothing is cached any more). */
static uint64_t ask_pass(struct volume *v)
{
	pthread_t thread;
	uint64_t asked = v->ended ? 0 : ++v->passes_asked;
	if (asked != 0 && !v->invalidating) {
		atomic_fetch_add(&v->refs, 1);
		if (start_thread(&thread, invalidator, v) == 0) {
			pthread_detach(thread);
			v->invalidating = true;
		} else {
			atomic_fetch_sub(&v->refs, 1);
			v->passes_asked--;
			asked = 0;
		}
	}
	return asked;
}

static uint64_t ask_invalidation(struct volume *v)
{
	pthread_mutex_lock(&v->life);
	uint64_t asked = ask_pass(v);
	pthread_mutex_unlock(&v->life);
	return asked;
}

/* Until the pass numbered `asked` is over (or every pass, for UINT64_MAX). */
static void await_invalidation(struct volume *v, uint64_t asked)
{
	pthread_mutex_lock(&v->life);
	while (v->invalidating && v->passes_done < asked)
		pthread_cond_wait(&v->invalidated, &v->life);
	pthread_mutex_unlock(&v->life);
}

/* Not from a worker thread: the kernel drops every entry and attribute it cached. */
void invalidate(struct volume *v)
{
	await_invalidation(v, ask_invalidation(v));
}

/* The fenced flag and its pass's number change together, so a refusal that saw the one finds the other. */
void fence(struct volume *v)
{
	pthread_mutex_lock(&v->life);
	if (!atomic_exchange(&v->fenced, true))
		v->fence_pass = ask_pass(v);
	pthread_mutex_unlock(&v->life);
}

/*
 * A refusal is answered once the fence's pass dropped the inodes the kernel
 * cached, so after an application's first EIO no cached page or attribute
 * answers it. Bounded: the pass may wait in the kernel for a read's locked
 * page, whose worker may be this one.
 */
static void await_fence_pass(struct volume *v)
{
	struct timespec until = after_ms(FENCE_PASS_WAIT_MS);
	pthread_mutex_lock(&v->life);
	while (v->invalidating && v->inodes_done < v->fence_pass &&
	       pthread_cond_timedwait(&v->invalidated, &v->life, &until) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&v->life);
}

/* Waits for the invalidation, if one ran; the caller then sees no cached page. */
void fence_settle(struct volume *v)
{
	await_invalidation(v, UINT64_MAX);
}

/* The session must outlive an invalidation in flight; none starts after this. */
void fence_join(struct volume *v)
{
	pthread_mutex_lock(&v->life);
	v->ended = true;
	pthread_mutex_unlock(&v->life);
	fence_settle(v);
}
