/*
 * One staged volume served by our FUSE server: the backing tree, the table of
 * backing inodes the kernel holds, and the epoch fence.
 *
 * Node ids are the backing inodes' st_ino (the root answers to FUSE_ROOT_ID),
 * not pointers, so an id the kernel holds still names the same backing inode
 * in another process: see README.md "Keeping a mount across a restart".
 */
#ifndef GITCSI_VOLUME_H
#define GITCSI_VOLUME_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <node_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

/* A backing inode the kernel holds a lookup count on. */
struct node {
	fuse_ino_t id;
	int fd; /* O_PATH, never following a symlink */
	uint64_t nlookup;
	/* The last name the kernel looked it up by, to drop that entry when fenced. */
	fuse_ino_t parent;
	char *name;
	struct node *next; /* hash chain */
};

struct node_table {
	pthread_mutex_t lock;
	struct node **buckets;
	size_t size;
	size_t count;
};

struct volume {
	struct fuse_session *se;
	pthread_t loop;
	char *mountpoint;
	struct node root;
	ino_t root_ino;
	dev_t dev;
	struct node_table nodes;

	/* Epoch fence: set once, never cleared. */
	atomic_bool fenced;
	_Atomic int64_t serve_until_ms;
	atomic_uint refused_pending; /* refusals JS has not been told of */
	napi_threadsafe_function on_fenced;

	/* Guards ended and the invalidation thread against the loop's end. */
	pthread_mutex_t life;
	bool ended;
	bool invalidating;
	pthread_t invalidation;

	atomic_int refs; /* the loop thread and the JS handle */
};

/* node_table.c */
int nodes_init(struct node_table *t);
void nodes_destroy(struct node_table *t);
/* The node for an id the kernel holds; NULL only for an id it never had. */
struct node *node_get(struct volume *v, fuse_ino_t id);
/* Counts one more lookup of a backing inode; takes fd or closes it. */
int node_remember(struct volume *v, int fd, const struct stat *st, fuse_ino_t parent,
		  const char *name, fuse_ino_t *id);
void node_forget(struct volume *v, fuse_ino_t id, uint64_t nlookup);
struct entry_ref {
	fuse_ino_t id;
	fuse_ino_t parent;
	char *name;
};
/* A copy of every id (and its last entry) handed out, for invalidation. */
size_t nodes_snapshot(struct volume *v, struct entry_ref **out);

/* ops.c */
extern const struct fuse_lowlevel_ops gitcsi_ops;

/* fence.c */
/* True (and the request answered EIO) once the epoch no longer holds the volume. */
bool refused(fuse_req_t req);
void fence(struct volume *v);
void fence_settle(struct volume *v);
void fence_join(struct volume *v);

void volume_put(struct volume *v);
int start_thread(pthread_t *thread, void *(*run)(void *), void *arg);

#endif
