/*
 * The backing inodes the kernel holds, by node id. Each keeps an O_PATH
 * descriptor, which also pins the inode: its st_ino cannot be reused, so the
 * id stays unambiguous until the kernel forgets it.
 */
#include "volume.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIRST_SIZE 1024

int nodes_init(struct node_table *t)
{
	t->buckets = calloc(FIRST_SIZE, sizeof(*t->buckets));
	if (t->buckets == NULL)
		return ENOMEM;
	t->size = FIRST_SIZE;
	t->count = 0;
	return pthread_mutex_init(&t->lock, NULL);
}

static void node_free(struct node *n)
{
	close(n->fd);
	free(n->name);
	free(n);
}

void nodes_destroy(struct node_table *t)
{
	for (size_t i = 0; i < t->size; i++) {
		struct node *n = t->buckets[i];
		while (n != NULL) {
			struct node *next = n->next;
			node_free(n);
			n = next;
		}
	}
	free(t->buckets);
	pthread_mutex_destroy(&t->lock);
}

static struct node **slot(struct node_table *t, fuse_ino_t id)
{
	struct node **at = &t->buckets[id % t->size];
	while (*at != NULL && (*at)->id != id)
		at = &(*at)->next;
	return at;
}

/* Doubles the buckets when full; a failed allocation only leaves chains longer. */
static void grow(struct node_table *t)
{
	size_t size = t->size * 2;
	struct node **buckets = calloc(size, sizeof(*buckets));
	if (buckets == NULL)
		return;
	for (size_t i = 0; i < t->size; i++) {
		struct node *n = t->buckets[i];
		while (n != NULL) {
			struct node *next = n->next;
			n->next = buckets[n->id % size];
			buckets[n->id % size] = n;
			n = next;
		}
	}
	free(t->buckets);
	t->buckets = buckets;
	t->size = size;
}

struct node *node_get(struct volume *v, fuse_ino_t id)
{
	if (id == FUSE_ROOT_ID)
		return &v->root;
	pthread_mutex_lock(&v->nodes.lock);
	struct node *n = *slot(&v->nodes, id);
	pthread_mutex_unlock(&v->nodes.lock);
	return n;
}

/* The root answers to FUSE_ROOT_ID; any other inode to its st_ino. */
static int node_id(struct volume *v, const struct stat *st, fuse_ino_t *id)
{
	if (st->st_dev != v->dev)
		return EXDEV; /* another file system mounted inside the tree */
	if (st->st_ino == v->root_ino) {
		*id = FUSE_ROOT_ID;
		return 0;
	}
	if (st->st_ino == FUSE_ROOT_ID)
		return EIO; /* would alias the root */
	*id = st->st_ino;
	return 0;
}

static void name_entry(struct node *n, fuse_ino_t parent, const char *name)
{
	if (n->name != NULL && n->parent == parent && strcmp(n->name, name) == 0)
		return;
	char *copy = strdup(name);
	if (copy == NULL)
		return; /* only the fence's entry invalidation misses it */
	free(n->name);
	n->name = copy;
	n->parent = parent;
}

static int insert(struct volume *v, struct node **at, int fd, fuse_ino_t id, fuse_ino_t parent,
		  const char *name)
{
	struct node *n = calloc(1, sizeof(*n));
	if (n == NULL)
		return ENOMEM;
	n->id = id;
	n->fd = fd;
	n->nlookup = 1;
	name_entry(n, parent, name);
	*at = n;
	if (++v->nodes.count > v->nodes.size)
		grow(&v->nodes);
	return 0;
}

int node_remember(struct volume *v, int fd, const struct stat *st, fuse_ino_t parent,
		  const char *name, fuse_ino_t *id)
{
	int err = node_id(v, st, id);
	if (err != 0 || *id == FUSE_ROOT_ID) {
		close(fd);
		return err;
	}
	pthread_mutex_lock(&v->nodes.lock);
	struct node **at = slot(&v->nodes, *id);
	bool known = *at != NULL;
	if (known) {
		(*at)->nlookup++;
		name_entry(*at, parent, name);
	} else {
		err = insert(v, at, fd, *id, parent, name);
	}
	pthread_mutex_unlock(&v->nodes.lock);
	if (known || err != 0)
		close(fd);
	return err;
}

int node_adopt(struct volume *v, int fd, fuse_ino_t id, fuse_ino_t parent, const char *name)
{
	pthread_mutex_lock(&v->nodes.lock);
	struct node **at = slot(&v->nodes, id);
	bool known = *at != NULL;
	int err = known ? 0 : insert(v, at, fd, id, parent, name);
	pthread_mutex_unlock(&v->nodes.lock);
	if (known || err != 0)
		close(fd);
	return err;
}

void node_forget(struct volume *v, fuse_ino_t id, uint64_t nlookup)
{
	if (id == FUSE_ROOT_ID)
		return;
	pthread_mutex_lock(&v->nodes.lock);
	struct node **at = slot(&v->nodes, id);
	struct node *gone = NULL;
	if (*at != NULL) {
		struct node *n = *at;
		n->nlookup = n->nlookup > nlookup ? n->nlookup - nlookup : 0;
		if (n->nlookup == 0) {
			*at = n->next;
			v->nodes.count--;
			gone = n;
		}
	}
	pthread_mutex_unlock(&v->nodes.lock);
	if (gone != NULL)
		node_free(gone);
}

void node_moved(struct volume *v, int dir_fd, fuse_ino_t parent, const char *name)
{
	struct stat st;
	fuse_ino_t id;
	if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == -1 || node_id(v, &st, &id) != 0 ||
	    id == FUSE_ROOT_ID)
		return;
	pthread_mutex_lock(&v->nodes.lock);
	struct node *n = *slot(&v->nodes, id);
	if (n != NULL)
		name_entry(n, parent, name);
	pthread_mutex_unlock(&v->nodes.lock);
}

static void snapshot_one(struct entry_ref *ref, const struct node *n)
{
	ref->id = n->id;
	ref->parent = n->parent;
	ref->name = n->name != NULL ? strdup(n->name) : NULL;
}

size_t nodes_snapshot(struct volume *v, struct entry_ref **out)
{
	pthread_mutex_lock(&v->nodes.lock);
	size_t count = 0;
	struct entry_ref *refs = calloc(v->nodes.count + 1, sizeof(*refs));
	if (refs != NULL) {
		snapshot_one(&refs[count++], &v->root);
		for (size_t i = 0; i < v->nodes.size; i++)
			for (struct node *n = v->nodes.buckets[i]; n != NULL; n = n->next)
				snapshot_one(&refs[count++], n);
	}
	pthread_mutex_unlock(&v->nodes.lock);
	*out = refs;
	return count;
}
