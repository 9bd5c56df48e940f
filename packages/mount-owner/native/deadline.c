/*
 * The lease's end, watched in a thread of its own on CLOCK_BOOTTIME. The
 * kernel answers from its cache without asking, so the fence must come at
 * the end itself, not at the next request that reaches us; and a node that
 * wakes from suspend finds its serving time over at once, which a timer on
 * CLOCK_MONOTONIC (JavaScript's) would only see a suspend's length later.
 */
#include "volume.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

static void drain(int fd)
{
	uint64_t ignored;
	while (read(fd, &ignored, sizeof(ignored)) > 0)
		;
}

/*
 * Fires at `until`, set as a time from now; never for an end that never comes. So
 * the timer and serving_clock_ms() agree even where a process's clocks are
 * shifted (libfaketime in the clock tests); the timerfd counts suspend too.
 */
static void arm(struct volume *v, int64_t until)
{
	struct itimerspec at = { 0 };
	if (until != INT64_MAX) {
		int64_t left_ms = until - serving_clock_ms();
		at.it_value.tv_sec = left_ms / 1000;
		at.it_value.tv_nsec = (left_ms % 1000) * 1000000 + 1; /* never all zero: that disarms */
	}
	timerfd_settime(v->deadline.timer, 0, &at, NULL);
}

static void *watch(void *arg)
{
	struct volume *v = arg;
	struct pollfd fds[2] = { { .fd = v->deadline.timer, .events = POLLIN },
				 { .fd = v->deadline.wake, .events = POLLIN } };
	while (!atomic_load(&v->deadline.stopped) && !atomic_load(&v->fenced)) {
		int64_t until = atomic_load(&v->serve_until_ms);
		if (serving_clock_ms() >= until) {
			fence(v);
			/* JavaScript hears of it as of a refusal, with none counted. */
			napi_call_threadsafe_function(v->on_fenced, NULL, napi_tsfn_nonblocking);
			break;
		}
		arm(v, until);
		if (poll(fds, 2, -1) == -1 && errno != EINTR)
			break;
		drain(v->deadline.timer);
		drain(v->deadline.wake);
	}
	return NULL;
}

int deadline_start(struct volume *v)
{
	v->deadline.timer = timerfd_create(CLOCK_BOOTTIME, TFD_NONBLOCK | TFD_CLOEXEC);
	v->deadline.wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	int err = v->deadline.timer == -1 || v->deadline.wake == -1 ? errno : start_thread(&v->deadline.thread, watch, v);
	v->deadline.started = err == 0;
	return err;
}

/* The lease's end moved: the watcher reads it again. */
void deadline_moved(struct volume *v)
{
	uint64_t one = 1;
	/* Open until the volume is freed; a full counter means a wake is pending anyway. */
	if (v->deadline.wake >= 0 && write(v->deadline.wake, &one, sizeof(one)) == -1)
		return;
}

/* Before the session ends: the watcher calls into it. */
void deadline_stop(struct volume *v)
{
	if (!v->deadline.started)
		return;
	atomic_store(&v->deadline.stopped, true);
	deadline_moved(v);
	pthread_join(v->deadline.thread, NULL);
	v->deadline.started = false;
}

void deadline_close(struct volume *v)
{
	if (v->deadline.timer >= 0)
		close(v->deadline.timer);
	if (v->deadline.wake >= 0)
		close(v->deadline.wake);
}
