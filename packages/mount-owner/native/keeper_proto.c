/* The keeper's messages, for the keeper and the mount owner alike. */
#include "keeper.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int keeper_send(int sock, const struct keeper_message *m)
{
	unsigned char buf[KEEPER_MESSAGE_MAX];
	size_t key_len = strlen(m->key);
	if (key_len > KEEPER_KEY_MAX || m->init_len > KEEPER_INIT_MAX)
		return EINVAL;
	buf[0] = (unsigned char)m->op;
	buf[1] = key_len >> 8;
	buf[2] = key_len & 0xff;
	memcpy(buf + 3, m->key, key_len);
	memcpy(buf + 3 + key_len, m->init, m->init_len);
	struct iovec iov = { buf, 3 + key_len + m->init_len };
	union {
		char space[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (m->fd >= 0) {
		msg.msg_control = control.space;
		msg.msg_controllen = sizeof(control.space);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &m->fd, sizeof(int));
	}
	return sendmsg(sock, &msg, MSG_NOSIGNAL) == -1 ? errno : 0;
}

static int received_fd(struct msghdr *msg)
{
	int fd = -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int)))
			memcpy(&fd, CMSG_DATA(c), sizeof(int));
	return fd;
}

int keeper_receive(int sock, struct keeper_message *m)
{
	unsigned char buf[KEEPER_MESSAGE_MAX];
	struct iovec iov = { buf, sizeof(buf) };
	union {
		char space[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} control;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space, .msg_controllen = sizeof(control.space) };
	ssize_t len = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
	if (len == -1)
		return errno;
	if (len == 0)
		return ENODATA;
	m->fd = received_fd(&msg);
	size_t key_len = len >= 3 ? (size_t)buf[1] << 8 | buf[2] : 0;
	if (len < 1 || (len >= 3 && 3 + key_len > (size_t)len) || key_len > KEEPER_KEY_MAX || (msg.msg_flags & MSG_TRUNC)) {
		if (m->fd >= 0)
			close(m->fd);
		return EPROTO;
	}
	m->op = (char)buf[0];
	memcpy(m->key, buf + 3, key_len);
	m->key[key_len] = '\0';
	m->init_len = len >= 3 ? (size_t)len - 3 - key_len : 0;
	if (m->init_len > KEEPER_INIT_MAX) {
		if (m->fd >= 0)
			close(m->fd);
		return EPROTO;
	}
	memcpy(m->init, buf + 3 + key_len, m->init_len);
	return 0;
}
