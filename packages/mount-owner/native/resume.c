/*
 * Node ids an earlier server gave out. The kernel keeps every id it looked up
 * across a handover; an id is the backing inode's st_ino (the root's is
 * FUSE_ROOT_ID), so the resumed server finds an id it does not know by
 * walking the backing tree for that inode, once per id: the kernel forgets an
 * inode all at once, so the node is counted as one lookup. A file unlinked
 * while open before the handover is not in the tree any more: its id answers
 * ESTALE.
 */
#include "volume.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

struct found {
	int fd;
	fuse_ino_t parent;
	char name[NAME_MAX + 1];
};

static bool is_dot(const char *name)
{
	return strcmp(name, ".") == 0 || strcmp(name, "..") == 0;
}

static bool find_in(struct volume *v, int dir_fd, fuse_ino_t dir_id, fuse_ino_t id, struct found *out);

/* The entry, if it is the inode sought: opened O_PATH, its parent and name noted. */
static bool match(struct volume *v, int dir_fd, fuse_ino_t dir_id, const char *name, fuse_ino_t id, struct found *out)
{
	int fd = openat(dir_fd, name, O_PATH | O_NOFOLLOW);
	struct stat st;
	if (fd == -1)
		return false;
	if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == v->dev) {
		if (st.st_ino == id) {
			out->fd = fd;
			out->parent = dir_id;
			strcpy(out->name, name);
			return true;
		}
		if (S_ISDIR(st.st_mode) && find_in(v, fd, st.st_ino, id, out)) {
			close(fd);
			return true;
		}
	}
	close(fd);
	return false;
}

static bool find_in(struct volume *v, int dir_fd, fuse_ino_t dir_id, fuse_ino_t id, struct found *out)
{
	struct dir_handle *d;
	if (open_dir(dir_fd, &d) != 0)
		return false;
	bool found = false;
	struct dirent *e;
	while (!found && (e = readdir(d->dp)) != NULL)
		/* d_ino is st_ino on the local file systems a tree lives on; directories are searched whatever it says. */
		if (!is_dot(e->d_name) && (e->d_ino == id || e->d_type == DT_DIR || e->d_type == DT_UNKNOWN))
			found = match(v, dir_fd, dir_id, e->d_name, id, out);
	close_dir(d);
	return found;
}

struct node *node_recover(struct volume *v, fuse_ino_t id)
{
	struct found f;
	if (id == FUSE_ROOT_ID || !find_in(v, v->root.fd, FUSE_ROOT_ID, id, &f))
		return NULL;
	if (node_adopt(v, f.fd, id, f.parent, f.name) != 0)
		return NULL;
	return node_get(v, id);
}

/* Every entry under a directory of the tree, its inode, and what a directory holds in turn. */
static void invalidate_dir(struct volume *v, int dir_fd, fuse_ino_t dir_id)
{
	struct dir_handle *d;
	struct dirent *e;
	if (open_dir(dir_fd, &d) != 0)
		return;
	while ((e = readdir(d->dp)) != NULL) {
		if (is_dot(e->d_name))
			continue;
		fuse_lowlevel_notify_inval_entry(v->se, dir_id, e->d_name, strlen(e->d_name));
		int fd = openat(dir_fd, e->d_name, O_PATH | O_NOFOLLOW);
		struct stat st;
		if (fd == -1)
			continue;
		if (fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == v->dev &&
		    st.st_ino != FUSE_ROOT_ID) {
			fuse_lowlevel_notify_inval_inode(v->se, st.st_ino, -1, 0);
			if (S_ISDIR(st.st_mode))
				invalidate_dir(v, fd, st.st_ino);
		}
		close(fd);
	}
	close_dir(d);
}

/*
 * A resumed server knows none of the ids the kernel cached from an earlier
 * one; ids are st_ino, so a walk of the tree names them all. The tree cannot
 * move before it is over: SyncMount refuses until the connection is served.
 */
void invalidate_tree(struct volume *v)
{
	fuse_lowlevel_notify_inval_inode(v->se, FUSE_ROOT_ID, -1, 0);
	invalidate_dir(v, v->root.fd, FUSE_ROOT_ID);
}
