/*
 * The keeper's protocol, on a SOCK_SEQPACKET unix socket: one message per
 * datagram, each naming a connection by key (the volume and its staging
 * path) and carrying its /dev/fuse descriptor (SCM_RIGHTS) and the INIT the
 * kernel sent it.
 *
 *   'P' key init + fd   keep (replacing what the key held)
 *   'T'                 take: the keeper answers 'K' key init + fd for each, then 'E'
 */
#ifndef GITCSI_KEEPER_H
#define GITCSI_KEEPER_H

#include <stddef.h>
#include <stdint.h>

#define KEEPER_KEY_MAX 4096
#define KEEPER_INIT_MAX 256
#define KEEPER_MESSAGE_MAX (1 + 2 + KEEPER_KEY_MAX + KEEPER_INIT_MAX)

struct keeper_message {
	char op;
	char key[KEEPER_KEY_MAX + 1];
	unsigned char init[KEEPER_INIT_MAX];
	size_t init_len;
	int fd; /* -1: none came */
};

/* Sends one message, with its descriptor if fd >= 0; 0 or an errno. */
int keeper_send(int sock, const struct keeper_message *m);
/* Receives one message; 0, ENODATA at the end of the stream, or an errno. */
int keeper_receive(int sock, struct keeper_message *m);

#endif
