/*
 * gitcsi-fd-keeper SOCKET: holds the /dev/fuse descriptors of the mount
 * owner's FUSE connections, outside its container, so that a restart of the
 * mount owner (crash, SIGKILL, upgrade) does not end a connection: the kernel
 * keeps one while any process holds its descriptor. It never reads a request.
 * A connection the kernel ended (unmounted, aborted) polls POLLERR and is let
 * go. The mount owner keeps its own copy, so a restart of the keeper loses
 * nothing either: the mount owner gives it every connection again.
 */
#include "keeper.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct held {
	char *key;
	int fd;
	unsigned char init[KEEPER_INIT_MAX];
	size_t init_len;
};

static struct held *held;
static size_t count, capacity;

/* A JSON string: a volume id is the kubelet's, and may hold any character. */
static void json_string(const char *s)
{
	fputc('"', stderr);
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(stderr, "\\%c", c);
		else if (c < 0x20)
			fprintf(stderr, "\\u%04x", c);
		else
			fputc(c, stderr);
	}
	fputc('"', stderr);
}

/* One JSON log line, as the services write them; field names a value (a volume, the socket). */
static void say(const char *level, const char *message, const char *field, const char *value)
{
	fprintf(stderr, "{\"level\":\"%s\",\"service\":\"fd-keeper\",\"operation\":\"fuse_keep\",\"message\":\"%s\"", level, message);
	if (value != NULL) {
		fprintf(stderr, ",\"%s\":", field);
		json_string(value);
	}
	fprintf(stderr, ",\"held\":%zu}\n", count);
}

static void drop(size_t i, const char *why)
{
	say("info", why, "volume", held[i].key);
	close(held[i].fd);
	free(held[i].key);
	held[i] = held[--count];
}

static int put(struct keeper_message *m)
{
	for (size_t i = 0; i < count; i++)
		if (strcmp(held[i].key, m->key) == 0) {
			close(held[i].fd);
			held[i].fd = m->fd;
			memcpy(held[i].init, m->init, m->init_len);
			held[i].init_len = m->init_len;
			return 0;
		}
	if (count == capacity) {
		size_t more = capacity ? capacity * 2 : 16;
		struct held *grown = realloc(held, more * sizeof(*held));
		if (grown == NULL)
			return ENOMEM;
		held = grown;
		capacity = more;
	}
	char *key = strdup(m->key);
	if (key == NULL)
		return ENOMEM;
	held[count] = (struct held){ .key = key, .fd = m->fd, .init_len = m->init_len };
	memcpy(held[count].init, m->init, m->init_len);
	count++;
	say("info", "keeping a FUSE connection", "volume", key);
	return 0;
}

static void give_all(int client)
{
	static struct keeper_message m;
	for (size_t i = 0; i < count; i++) {
		m.op = 'K';
		strcpy(m.key, held[i].key);
		memcpy(m.init, held[i].init, held[i].init_len);
		m.init_len = held[i].init_len;
		m.fd = held[i].fd;
		if (keeper_send(client, &m) != 0)
			return;
	}
	m = (struct keeper_message){ .op = 'E', .fd = -1 };
	keeper_send(client, &m);
}

/* One client, one request: the mount owner dials for each. */
static void serve_client(int client)
{
	static struct keeper_message m;
	struct timeval timeout = { .tv_sec = 5 };
	setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
	if (keeper_receive(client, &m) != 0)
		return;
	if (m.op == 'P' && m.fd >= 0 && m.key[0] != '\0') {
		if (put(&m) != 0) {
			close(m.fd);
			say("error", "out of memory: a connection is not kept", "volume", m.key);
		}
	} else if (m.op == 'T') {
		give_all(client);
	} else {
		if (m.fd >= 0)
			close(m.fd);
		say("warn", "a request the keeper does not know", NULL, NULL);
	}
}

static int listen_on(const char *path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(addr.sun_path)) {
		fprintf(stderr, "gitcsi-fd-keeper: socket path %s is longer than %zu bytes\n", path, sizeof(addr.sun_path) - 1);
		return -1;
	}
	strcpy(addr.sun_path, path);
	int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	unlink(path); /* a socket a dead keeper left */
	mode_t old = umask(0077);
	int res = sock == -1 ? -1 : bind(sock, (struct sockaddr *)&addr, sizeof(addr));
	umask(old);
	if (res == -1 || listen(sock, 16) == -1) {
		fprintf(stderr, "gitcsi-fd-keeper: cannot listen on %s: %s\n", path, strerror(errno));
		return -1;
	}
	return sock;
}

/*
 * In its container the keeper is process 1, and the kernel ignores a signal
 * process 1 has no handler for: without one, SIGTERM was ignored and every
 * replacement of the node plugin waited out the grace period (60 s) with no
 * git worker renewing the leases. Leaving at once is safe: the mount owner
 * holds its own copy of every connection.
 */
static volatile sig_atomic_t stopping;

static void stop(int sig)
{
	(void)sig;
	stopping = 1;
}

/* SIGTERM and SIGINT are blocked but while the keeper waits: one never slips in between its check and the wait. */
static void handle_stop_signals(sigset_t *while_waiting)
{
	struct sigaction action = { .sa_handler = stop };
	sigemptyset(&action.sa_mask);
	sigaction(SIGTERM, &action, NULL);
	sigaction(SIGINT, &action, NULL);
	sigset_t blocked;
	sigemptyset(&blocked);
	sigaddset(&blocked, SIGTERM);
	sigaddset(&blocked, SIGINT);
	sigprocmask(SIG_BLOCK, &blocked, while_waiting);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gitcsi-fd-keeper SOCKET\n\nHolds the mount owner's FUSE descriptors so that a restart of it keeps every mount.\n");
		return 2;
	}
	int sock = listen_on(argv[1]);
	if (sock == -1)
		return 1;
	signal(SIGPIPE, SIG_IGN);
	sigset_t while_waiting;
	handle_stop_signals(&while_waiting);
	say("info", "listening", "socket", argv[1]);
	for (;;) {
		struct pollfd *fds = calloc(count + 1, sizeof(*fds));
		if (fds == NULL)
			return 1;
		fds[0] = (struct pollfd){ .fd = sock, .events = POLLIN };
		for (size_t i = 0; i < count; i++)
			fds[i + 1] = (struct pollfd){ .fd = held[i].fd }; /* errors only: the keeper never reads */
		size_t polled = count;
		if (ppoll(fds, polled + 1, NULL, &while_waiting) == -1 && errno != EINTR)
			return 1;
		if (stopping) {
			say("info", "stopping: the mount owner's copies keep every mount", NULL, NULL);
			return 0;
		}
		for (size_t i = polled; i > 0; i--)
			if (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL))
				drop(i - 1, "the FUSE connection ended; letting it go");
		if (fds[0].revents & POLLIN) {
			int client = accept4(sock, NULL, NULL, SOCK_CLOEXEC);
			if (client != -1) {
				serve_client(client);
				close(client);
			}
		}
		free(fds);
	}
}
