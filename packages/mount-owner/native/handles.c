/*
 * File handles (fi->fh) that a restarted server still understands. The kernel
 * keeps the fh of every open file across a handover, so each names the
 * server incarnation that opened it: an fh of this incarnation holds the
 * backing descriptor (or the directory stream) itself; one of an earlier
 * incarnation holds the open flags, and the file is reopened by its node
 * on first use, once, and kept until the kernel releases it.
 *
 *   63..48 incarnation   47..40 open flags (files)   31..0 descriptor (files)
 *   47..0 the dir_handle's address (directories: user addresses fit in 47 bits)
 */
#include "volume.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#define INCARNATION_SHIFT 48
#define FLAGS_SHIFT 40
#define LOW_BITS ((UINT64_C(1) << INCARNATION_SHIFT) - 1)

static uint16_t incarnation = 1;

void handles_set_incarnation(uint16_t value)
{
	incarnation = value;
}

/* The flags a reopen must repeat; creation and truncation happened already. */
static const int kept_flags[] = { O_APPEND, O_DIRECT, O_DSYNC, O_SYNC, O_NOATIME };
#define KEPT_FLAGS (sizeof(kept_flags) / sizeof(kept_flags[0]))

static uint64_t pack_flags(int flags)
{
	uint64_t packed = flags & O_ACCMODE;
	for (size_t i = 0; i < KEPT_FLAGS; i++)
		if ((flags & kept_flags[i]) == kept_flags[i])
			packed |= 4u << i;
	return packed;
}

static int unpack_flags(uint64_t packed)
{
	int flags = packed & O_ACCMODE;
	for (size_t i = 0; i < KEPT_FLAGS; i++)
		if (packed & (4u << i))
			flags |= kept_flags[i];
	return flags;
}

static uint64_t tagged(uint64_t low)
{
	return ((uint64_t)incarnation << INCARNATION_SHIFT) | (low & LOW_BITS);
}

static bool ours(uint64_t fh)
{
	return fh >> INCARNATION_SHIFT == incarnation;
}

uint64_t file_handle(int fd, int flags)
{
	return tagged((pack_flags(flags) << FLAGS_SHIFT) | (uint32_t)fd);
}

uint64_t dir_handle(struct dir_handle *d)
{
	return tagged((uintptr_t)d);
}

/*
 * With the writeback cache the kernel reads pages of a write-only file to fill
 * them, and appends at the size it keeps: a backing O_APPEND would put its
 * writes elsewhere.
 */
int backing_flags(const struct volume *v, int flags)
{
	if (!v->writeback)
		return flags;
	if ((flags & O_ACCMODE) == O_WRONLY)
		flags = (flags & ~O_ACCMODE) | O_RDWR;
	return flags & ~O_APPEND;
}

static bool writes(uint64_t fh)
{
	return ((fh & LOW_BITS) >> FLAGS_SHIFT & O_ACCMODE) != O_RDONLY;
}

/* The flusher runs while a file is open for writing (an earlier incarnation's once reopened). */
void count_writer(struct volume *v, uint64_t fh, int delta)
{
	if (ours(fh) && writes(fh))
		add_writers(v, delta);
}

void foreign_writer(struct volume *v, uint64_t fh, int delta)
{
	if (writes(fh))
		add_writers(v, delta);
}

/* O_NOFOLLOW would refuse the magic link. */
int reopen(const struct node *n, int flags)
{
	char path[PROC_PATH_SIZE];
	return open(proc_path(path, n->fd), flags & ~(O_NOFOLLOW | O_CREAT | O_EXCL));
}

int open_dir(int dir_fd, struct dir_handle **out)
{
	struct dir_handle *d = calloc(1, sizeof(*d));
	if (d == NULL)
		return ENOMEM;
	int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY);
	if (fd == -1 || (d->dp = fdopendir(fd)) == NULL) {
		int err = errno;
		if (fd != -1)
			close(fd);
		free(d);
		return err;
	}
	*out = d;
	return 0;
}

void close_dir(struct dir_handle *d)
{
	closedir(d->dp);
	free(d);
}

static struct foreign_handle **foreign_slot(struct volume *v, uint64_t fh)
{
	struct foreign_handle **at = &v->foreign;
	while (*at != NULL && (*at)->fh != fh)
		at = &(*at)->next;
	return at;
}

/* Opens an earlier incarnation's handle anew: a file by its flags, a directory as a stream. */
static int open_foreign(fuse_req_t req, fuse_ino_t ino, uint64_t fh, bool dir, struct foreign_handle *h)
{
	struct volume *v = fuse_req_userdata(req);
	struct node *n = node_get(v, ino);
	if (n == NULL)
		n = node_recover(v, ino);
	if (n == NULL)
		return ESTALE;
	h->fh = fh;
	h->fd = -1;
	if (dir)
		return open_dir(n->fd, &h->dir);
	h->fd = reopen(n, unpack_flags((fh & LOW_BITS) >> FLAGS_SHIFT));
	return h->fd == -1 ? errno : 0;
}

static void foreign_free(struct foreign_handle *h)
{
	if (h->dir != NULL)
		close_dir(h->dir);
	if (h->fd != -1)
		close(h->fd);
	free(h);
}

/* The kept reopen of an earlier incarnation's handle; two requests racing keep one. */
static struct foreign_handle *foreign(fuse_req_t req, fuse_ino_t ino, uint64_t fh, bool dir)
{
	struct volume *v = fuse_req_userdata(req);
	pthread_mutex_lock(&v->foreign_lock);
	struct foreign_handle *known = *foreign_slot(v, fh);
	pthread_mutex_unlock(&v->foreign_lock);
	if (known != NULL)
		return known;
	struct foreign_handle *h = calloc(1, sizeof(*h));
	int err = h == NULL ? ENOMEM : open_foreign(req, ino, fh, dir, h);
	if (err != 0) {
		free(h);
		errno = err;
		return NULL;
	}
	pthread_mutex_lock(&v->foreign_lock);
	struct foreign_handle **at = foreign_slot(v, fh);
	if (*at == NULL) {
		if (!dir)
			foreign_writer(v, fh, 1);
		*at = h;
		h = NULL;
	}
	known = *at;
	pthread_mutex_unlock(&v->foreign_lock);
	if (h != NULL)
		foreign_free(h);
	return known;
}

int file_fd(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ours(fi->fh))
		return (int)(uint32_t)fi->fh;
	struct foreign_handle *h = foreign(req, ino, fi->fh, false);
	return h != NULL ? h->fd : -1;
}

struct dir_handle *dir_of(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ours(fi->fh))
		return (struct dir_handle *)(uintptr_t)(fi->fh & LOW_BITS);
	struct foreign_handle *h = foreign(req, ino, fi->fh, true);
	return h != NULL ? h->dir : NULL;
}

/* An earlier incarnation's handle never used since the handover has nothing to close. */
static void release_foreign(struct volume *v, uint64_t fh)
{
	pthread_mutex_lock(&v->foreign_lock);
	struct foreign_handle **at = foreign_slot(v, fh);
	struct foreign_handle *h = *at;
	if (h != NULL)
		*at = h->next;
	pthread_mutex_unlock(&v->foreign_lock);
	if (h != NULL && h->dir == NULL)
		foreign_writer(v, fh, -1);
	if (h != NULL)
		foreign_free(h);
}

void release_file(struct volume *v, struct fuse_file_info *fi)
{
	count_writer(v, fi->fh, -1);
	if (ours(fi->fh))
		close((int)(uint32_t)fi->fh);
	else
		release_foreign(v, fi->fh);
}

void release_dir(struct volume *v, struct fuse_file_info *fi)
{
	if (ours(fi->fh))
		close_dir((struct dir_handle *)(uintptr_t)(fi->fh & LOW_BITS));
	else
		release_foreign(v, fi->fh);
}

void foreign_destroy(struct volume *v)
{
	while (v->foreign != NULL) {
		struct foreign_handle *h = v->foreign;
		v->foreign = h->next;
		foreign_free(h);
	}
	pthread_mutex_destroy(&v->foreign_lock);
}
