/*
 * How the session reads and writes /dev/fuse. Each worker thread reads its
 * own cloned descriptor, so a request it read when the process dies is
 * answered by the kernel (ECONNABORTED) and never waits for a server that is
 * gone; a request not yet read stays queued in the connection for the next
 * server. For a graceful handover the readers park: none takes another
 * request, and io_quiesce returns once every request read was answered.
 * The first request of a connection, the kernel's INIT, is kept: a resumed
 * session is told it again, as libfuse answers nothing before an INIT.
 */
#include "volume.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* The session this thread serves a request of, between its read and its next one. */
static __thread struct io_state *serving;

int io_init(struct io_state *io)
{
	io->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (io->stop_fd == -1)
		return errno;
	pthread_mutex_init(&io->lock, NULL);
	pthread_cond_init(&io->changed, NULL);
	return 0;
}

void io_destroy(struct io_state *io)
{
	close(io->stop_fd);
	pthread_cond_destroy(&io->changed);
	pthread_mutex_destroy(&io->lock);
}

static void set_active(struct io_state *io, int delta)
{
	pthread_mutex_lock(&io->lock);
	io->active += delta;
	pthread_cond_broadcast(&io->changed);
	pthread_mutex_unlock(&io->lock);
}

/* A parked reader never reads again: the process ends, the next server reads. */
static void park(struct io_state *io)
{
	pthread_mutex_lock(&io->lock);
	for (;;)
		pthread_cond_wait(&io->changed, &io->lock);
}

/* Entering a read: the request this thread read before is answered. False once stopping. */
static bool begin_read(struct io_state *io)
{
	pthread_mutex_lock(&io->lock);
	if (serving == io)
		io->active--;
	serving = NULL;
	bool go = !atomic_load(&io->stopping);
	if (go)
		io->active++;
	pthread_cond_broadcast(&io->changed);
	pthread_mutex_unlock(&io->lock);
	return go;
}

static void keep_init(struct io_state *io, const void *buf, ssize_t len)
{
	const struct fuse_in_header *in = buf;
	if ((size_t)len < sizeof(*in) || in->opcode != FUSE_INIT || (size_t)len > INIT_MAX)
		return;
	pthread_mutex_lock(&io->lock);
	memcpy(io->init, buf, len);
	io->init_len = len;
	pthread_cond_broadcast(&io->changed);
	pthread_mutex_unlock(&io->lock);
}

/* The clone descriptors libfuse opens block; a reader must not sleep inside read(). */
static void nonblocking(int fd)
{
	static __thread int done = -1;
	if (done == fd)
		return;
	int flags = fcntl(fd, F_GETFL);
	if (flags != -1 && !(flags & O_NONBLOCK))
		fcntl(fd, F_SETFL, flags | O_NONBLOCK);
	done = fd;
}

/*
 * Reads without blocking, and waits in poll for a request or the stop: a
 * stop always finds a reader between requests. A request read just as the
 * stop came is served first; the reader is counted active until it is.
 */
static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
	struct volume *v = userdata;
	struct io_state *io = &v->io;
	if (!begin_read(io))
		park(io);
	nonblocking(fd);
	for (;;) {
		if (atomic_load(&io->stopping)) {
			set_active(io, -1);
			park(io);
		}
		ssize_t res = read(fd, buf, len);
		if (res > 0) {
			serving = io;
			if (io->init_len == 0)
				keep_init(io, buf, res);
			return res;
		}
		if (res == -1 && errno == EAGAIN) {
			struct pollfd fds[2] = { { .fd = fd, .events = POLLIN }, { .fd = io->stop_fd, .events = POLLIN } };
			if (poll(fds, 2, -1) == -1 && errno != EINTR)
				break;
		} else if (res == 0 || errno != EINTR) {
			if (res == 0)
				errno = ENODEV; /* the connection is gone */
			break;
		}
	}
	int err = errno;
	set_active(io, -1);
	errno = err;
	return -1;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	(void)userdata;
	return writev(fd, iov, count);
}

static ssize_t io_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len, unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

const struct fuse_custom_io gitcsi_io = {
	.read = io_read,
	.writev = io_writev,
	.splice_send = io_splice_send,
};

void io_quiesce(struct io_state *io)
{
	pthread_mutex_lock(&io->lock);
	atomic_store(&io->stopping, true);
	uint64_t one = 1;
	/* A failed write means the counter is set already: the readers wake anyway. */
	ssize_t ignored = write(io->stop_fd, &one, sizeof(one));
	(void)ignored;
	while (io->active > 0 && !io->ended)
		pthread_cond_wait(&io->changed, &io->lock);
	pthread_mutex_unlock(&io->lock);
}

/* The session's loop ended (its readers may have been cancelled mid-wait): nothing is left to quiesce. */
void io_end(struct io_state *io)
{
	pthread_mutex_lock(&io->lock);
	io->ended = true;
	pthread_cond_broadcast(&io->changed);
	pthread_mutex_unlock(&io->lock);
}

int io_wait_init(struct io_state *io, int timeout_ms)
{
	struct timespec until = after_ms(timeout_ms);
	pthread_mutex_lock(&io->lock);
	int err = 0;
	while (io->init_len == 0 && err == 0)
		err = pthread_cond_timedwait(&io->changed, &io->lock, &until);
	pthread_mutex_unlock(&io->lock);
	return io->init_len > 0 ? 0 : ETIMEDOUT;
}

/*
 * libfuse takes the connection's parameters from the INIT; its reply goes to
 * the kernel, which answered that INIT long ago and drops it (ENOENT).
 */
void io_replay_init(struct volume *v, const unsigned char *init, size_t len)
{
	unsigned char copy[INIT_MAX];
	memcpy(copy, init, len);
	memcpy(v->io.init, init, len);
	v->io.init_len = len;
	struct fuse_buf buf = { .size = len, .mem = copy };
	fuse_session_process_buf(v->se, &buf);
}
