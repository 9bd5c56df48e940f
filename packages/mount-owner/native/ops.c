/*
 * The FUSE operations, served by libfuse's worker threads directly on the
 * backing tree by descriptor. The kernel checks permissions (the mount has
 * default_permissions); here requests run as root, except that entries are
 * created with the caller's fsuid and fsgid so the backing file system gives
 * them the caller's owner and the setgid parent's group as a local one would.
 */
#include "volume.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/fsuid.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

/* A full-size write is a stream's (ops.c op_write_buf). */
#define WRITE_BEHIND_BYTES (1 << 20)

static struct volume *volume_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* A node the kernel names, or the request answered ESTALE. */
static struct node *node_or_stale(fuse_req_t req, fuse_ino_t ino)
{
	struct node *n = node_get(volume_of(req), ino);
	if (n == NULL && volume_of(req)->resumed)
		n = node_recover(volume_of(req), ino);
	if (n == NULL)
		fuse_reply_err(req, ESTALE);
	return n;
}

/* The node of a request this epoch may serve, or NULL once the request was answered (fenced, or stale). */
static struct node *served_node(fuse_req_t req, fuse_ino_t ino)
{
	return refused(req) ? NULL : node_or_stale(req, ino);
}

/* The inode behind an O_PATH descriptor, by path: chmod, truncate and open have no form for one. */
const char *proc_path(char buf[PROC_PATH_SIZE], int fd)
{
	snprintf(buf, PROC_PATH_SIZE, "/proc/self/fd/%d", fd);
	return buf;
}

static void reply_result(fuse_req_t req, int res)
{
	fuse_reply_err(req, res == -1 ? errno : 0);
}

/*
 * Each worker thread gets its own umask of 0: the kernel already applied the
 * caller's umask to the modes it sends, and the process umask is Node's.
 */
static void own_umask(void)
{
	static __thread bool done;
	if (done)
		return;
	if (unshare(CLONE_FS) == 0)
		umask(0);
	done = true;
}

/*
 * Changing fsuid away from 0 drops the file capabilities. The kernel already
 * checked the caller's access with all its groups, which this thread lacks, so
 * the backing file system's own check is bypassed again; CAP_FSETID stays off
 * so a setgid bit the caller may not set is still stripped.
 */
static void keep_dac_override(void)
{
	struct __user_cap_header_struct head = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct data[2];
	if (syscall(SYS_capget, &head, data) != 0)
		return;
	uint32_t wanted = (1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH);
	data[0].effective |= data[0].permitted & wanted;
	syscall(SYS_capset, &head, data);
}

static void become_caller(fuse_req_t req)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	own_umask();
	setfsgid(ctx->gid);
	setfsuid(ctx->uid);
	if (ctx->uid != 0)
		keep_dac_override();
}

/* Back to root: the kernel restores the file capabilities with fsuid 0. */
static void become_server(void)
{
	setfsuid(0);
	setfsgid(0);
}

static int stat_fd(int fd, struct stat *st)
{
	return fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
}

/* Looks name up under parent and counts it as handed out; 0 or an errno. */
static int find_entry(fuse_req_t req, fuse_ino_t parent, int parent_fd, const char *name,
		      struct fuse_entry_param *e)
{
	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return EINVAL; /* the kernel resolves these; ".." could climb out */
	int fd = openat(parent_fd, name, O_PATH | O_NOFOLLOW);
	if (fd == -1)
		return errno;
	memset(e, 0, sizeof(*e));
	if (stat_fd(fd, &e->attr) == -1) {
		int err = errno;
		close(fd);
		return err;
	}
	e->attr_timeout = cache_seconds(req);
	e->entry_timeout = entry_seconds(req);
	return node_remember(volume_of(req), fd, &e->attr, parent, name, &e->ino);
}

static void reply_entry(fuse_req_t req, fuse_ino_t parent, int parent_fd, const char *name)
{
	struct fuse_entry_param e;
	int err = find_entry(req, parent, parent_fd, name, &e);
	if (err != 0)
		fuse_reply_err(req, err);
	else if (fuse_reply_entry(req, &e) == -ENOENT)
		node_forget(volume_of(req), e.ino, 1); /* the caller was interrupted: no forget will come */
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct volume *v = userdata;
	/* Writes kill setuid/setgid bits in the kernel: ours run as root, which keeps them. */
	conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;
	/*
	 * Writeback cache: writes stay in the kernel's pages until an fsync, a
	 * close or the flusher (flush.c) send them, in large batches. The kernel
	 * then trusts its own size and mtime of a cached file. That holds with the
	 * git worker: git replaces a file it rewrites (a new inode, found at once:
	 * the tree move invalidates the kernel's entries), never writes one in place. A fence drops the
	 * dirty pages too: their writeback is refused, so a write after the
	 * lease's end never reaches the tree, and fsync or close report EIO.
	 */
	conn->want |= conn->capable & FUSE_CAP_WRITEBACK_CACHE;
	v->writeback = (conn->want & FUSE_CAP_WRITEBACK_CACHE) != 0;
	/* Lookups and creates in one directory, and reads of one file, run in parallel. */
	conn->want |= conn->capable & (FUSE_CAP_PARALLEL_DIROPS | FUSE_CAP_ASYNC_READ);
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	if (conn->capable & FUSE_CAP_SPLICE_MOVE)
		conn->want |= FUSE_CAP_SPLICE_MOVE;
	/* 1 MiB writes (the kernel's 256-page limit) rather than 128 KiB: a quarter of the round trips. */
	conn->max_write = 1 << 20;
	conn->time_gran = 1;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct node *p = served_node(req, parent);
	if (p != NULL)
		reply_entry(req, parent, p->fd, name);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	node_forget(volume_of(req), ino, nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	for (size_t i = 0; i < count; i++)
		node_forget(volume_of(req), forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	struct node *n = served_node(req, ino);
	struct stat st;
	if (n == NULL)
		return;
	if (stat_fd(n->fd, &st) == -1)
		fuse_reply_err(req, errno);
	else
		fuse_reply_attr(req, &st, cache_seconds(req));
}

static struct timespec time_to_set(int to_set, int set, int now, struct timespec value)
{
	if (to_set & now)
		return (struct timespec){ .tv_nsec = UTIME_NOW };
	if (to_set & set)
		return value;
	return (struct timespec){ .tv_nsec = UTIME_OMIT };
}

/* Symlinks have no /proc path to write through: their times go by AT_EMPTY_PATH. */
static int set_times(const struct node *n, const struct stat *attr, int to_set, int fd)
{
	struct timespec times[2] = {
		time_to_set(to_set, FUSE_SET_ATTR_ATIME, FUSE_SET_ATTR_ATIME_NOW, attr->st_atim),
		time_to_set(to_set, FUSE_SET_ATTR_MTIME, FUSE_SET_ATTR_MTIME_NOW, attr->st_mtim),
	};
	if (fd != -1)
		return futimens(fd, times);
	struct stat st;
	if (stat_fd(n->fd, &st) == -1)
		return -1;
	if (S_ISLNK(st.st_mode))
		return utimensat(n->fd, "", times, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
	char path[PROC_PATH_SIZE];
	return utimensat(AT_FDCWD, proc_path(path, n->fd), times, 0);
}

static int set_mode(const struct node *n, mode_t mode, int fd)
{
	char path[PROC_PATH_SIZE];
	return fd != -1 ? fchmod(fd, mode) : chmod(proc_path(path, n->fd), mode);
}

static int set_size(const struct node *n, off_t size, int fd)
{
	char path[PROC_PATH_SIZE];
	return fd != -1 ? ftruncate(fd, size) : truncate(proc_path(path, n->fd), size);
}

/* chown before chmod: a chown clears setuid and setgid, a mode set with it keeps them. */
static int apply_attr(const struct node *n, const struct stat *attr, int to_set, int fd)
{
	if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
		uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1;
		gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1;
		if (fchownat(n->fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == -1)
			return -1;
	}
	if ((to_set & FUSE_SET_ATTR_MODE) && set_mode(n, attr->st_mode, fd) == -1)
		return -1;
	if ((to_set & FUSE_SET_ATTR_SIZE) && set_size(n, attr->st_size, fd) == -1)
		return -1;
	if ((to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) && set_times(n, attr, to_set, fd) == -1)
		return -1;
	return 0;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct node *n = served_node(req, ino);
	struct stat st;
	if (n == NULL)
		return;
	int fd = fi != NULL ? file_fd(req, ino, fi) : -1;
	if ((fi != NULL && fd == -1) || apply_attr(n, attr, to_set, fd) == -1 || stat_fd(n->fd, &st) == -1)
		fuse_reply_err(req, errno);
	else
		fuse_reply_attr(req, &st, cache_seconds(req));
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct node *n = served_node(req, ino);
	char buf[PATH_MAX + 1];
	if (n == NULL)
		return;
	ssize_t len = readlinkat(n->fd, "", buf, sizeof(buf));
	if (len == -1)
		fuse_reply_err(req, errno);
	else if (len == sizeof(buf))
		fuse_reply_err(req, ENAMETOOLONG);
	else {
		buf[len] = '\0';
		fuse_reply_readlink(req, buf);
	}
}

enum make_kind { MAKE_NODE, MAKE_DIR, MAKE_SYMLINK };

struct make {
	enum make_kind kind;
	mode_t mode;
	dev_t rdev;
	const char *target;
};

static int make_entry(int parent_fd, const char *name, const struct make *m)
{
	switch (m->kind) {
	case MAKE_DIR:
		return mkdirat(parent_fd, name, m->mode);
	case MAKE_SYMLINK:
		return symlinkat(m->target, parent_fd, name);
	default:
		return mknodat(parent_fd, name, m->mode, m->rdev);
	}
}

/* mknod, mkdir and symlink: made as the caller, then looked up. */
static void make_and_reply(fuse_req_t req, fuse_ino_t parent, const char *name, const struct make *m)
{
	struct node *p = served_node(req, parent);
	if (p == NULL)
		return;
	become_caller(req);
	int res = make_entry(p->fd, name, m);
	int err = errno;
	become_server();
	if (res == -1)
		fuse_reply_err(req, err);
	else
		reply_entry(req, parent, p->fd, name);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	make_and_reply(req, parent, name, &(struct make){ .kind = MAKE_NODE, .mode = mode, .rdev = rdev });
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	make_and_reply(req, parent, name, &(struct make){ .kind = MAKE_DIR, .mode = mode });
}

static void op_symlink(fuse_req_t req, const char *target, fuse_ino_t parent, const char *name)
{
	make_and_reply(req, parent, name, &(struct make){ .kind = MAKE_SYMLINK, .target = target });
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct node *n = served_node(req, ino);
	struct node *p = n != NULL ? node_or_stale(req, newparent) : NULL;
	if (p == NULL)
		return;
	if (linkat(n->fd, "", p->fd, newname, AT_EMPTY_PATH) == -1)
		fuse_reply_err(req, errno);
	else
		reply_entry(req, newparent, p->fd, newname);
}

static void remove_entry(fuse_req_t req, fuse_ino_t parent, const char *name, int flags)
{
	struct node *p = served_node(req, parent);
	if (p != NULL)
		reply_result(req, unlinkat(p->fd, name, flags));
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_entry(req, parent, name, 0);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	remove_entry(req, parent, name, AT_REMOVEDIR);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	struct node *p = served_node(req, parent);
	struct node *q = p != NULL ? node_or_stale(req, newparent) : NULL;
	if (q == NULL)
		return;
	/* RENAME_NOREPLACE and RENAME_EXCHANGE pass through; the kernel refuses the rest. */
	if (renameat2(p->fd, name, q->fd, newname, flags) == -1) {
		fuse_reply_err(req, errno);
		return;
	}
	/* The kernel moved its entries: a tree move's invalidation must find them under the new names. */
	node_moved(volume_of(req), q->fd, newparent, newname);
	if (flags & RENAME_EXCHANGE)
		node_moved(volume_of(req), p->fd, parent, name);
	fuse_reply_err(req, 0);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct node *n = served_node(req, ino);
	if (n == NULL)
		return;
	int flags = backing_flags(volume_of(req), fi->flags);
	int fd = reopen(n, flags);
	if (fd == -1) {
		fuse_reply_err(req, errno);
		return;
	}
	fi->fh = file_handle(fd, flags);
	count_writer(volume_of(req), fi->fh, 1);
	if (fuse_reply_open(req, fi) == -ENOENT)
		release_file(volume_of(req), fi); /* the caller was interrupted: no release follows */
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct node *p = served_node(req, parent);
	if (p == NULL)
		return;
	int flags = backing_flags(volume_of(req), fi->flags);
	become_caller(req);
	int fd = openat(p->fd, name, (flags | O_CREAT) & ~O_NOFOLLOW, mode);
	int err = errno;
	become_server();
	struct fuse_entry_param e;
	if (fd != -1)
		err = find_entry(req, parent, p->fd, name, &e);
	if (fd == -1 || err != 0) {
		if (fd != -1)
			close(fd);
		fuse_reply_err(req, err);
		return;
	}
	fi->fh = file_handle(fd, flags);
	count_writer(volume_of(req), fi->fh, 1);
	if (fuse_reply_create(req, &e, fi) == -ENOENT) {
		/* the caller was interrupted: neither a release nor a forget will come */
		release_file(volume_of(req), fi);
		node_forget(volume_of(req), e.ino, 1);
	}
}

/* The open file's descriptor, or the request answered with why there is none. */
static int fd_or_reply(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	int fd = file_fd(req, ino, fi);
	if (fd == -1)
		fuse_reply_err(req, errno);
	return fd;
}

/* The open directory's stream, or the request answered with why there is none. */
static struct dir_handle *dir_or_reply(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dir_handle *d = dir_of(req, ino, fi);
	if (d == NULL)
		fuse_reply_err(req, errno);
	return d;
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	if (refused(req))
		return;
	int fd = fd_or_reply(req, ino, fi);
	if (fd == -1)
		return;
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
	buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	buf.buf[0].fd = fd;
	buf.buf[0].pos = off;
	fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

static void op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in, off_t off,
			 struct fuse_file_info *fi)
{
	if (write_refused(req))
		return;
	int fd = fd_or_reply(req, ino, fi);
	if (fd == -1)
		return;
	struct fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in));
	out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	out.buf[0].fd = fd;
	out.buf[0].pos = off;
	ssize_t written = fuse_buf_copy(&out, in, 0);
	if (written < 0)
		fuse_reply_err(req, -written);
	else
		fuse_reply_write(req, written);
	/*
	 * Write-behind, after the reply: a stream's pages start for the disk now,
	 * while the next arrive, not all at its fsync. A local file waits for the
	 * fsync too, but is not also copied through the server. Only when data
	 * reach the disk changes; a failure shows at the fsync as it would.
	 */
	if (written >= WRITE_BEHIND_BYTES)
		sync_file_range(fd, off, written, SYNC_FILE_RANGE_WRITE);
}

/* Never refused: the backing descriptor must close whatever the epoch. */
static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	release_file(volume_of(req), fi);
	fuse_reply_err(req, 0);
}

/* Answers fsync and fsyncdir on the handle's descriptor; -1: the request was answered already. */
static void reply_sync(fuse_req_t req, int fd, int datasync)
{
	if (fd != -1)
		reply_result(req, datasync ? fdatasync(fd) : fsync(fd));
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	if (refused(req))
		return;
	reply_sync(req, fd_or_reply(req, ino, fi), datasync);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
			 struct fuse_file_info *fi)
{
	if (refused(req))
		return;
	int fd = fd_or_reply(req, ino, fi);
	if (fd != -1)
		reply_result(req, fallocate(fd, mode, offset, length));
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct node *n = served_node(req, ino);
	struct dir_handle *d = NULL;
	if (n == NULL)
		return;
	int err = open_dir(n->fd, &d);
	if (err != 0) {
		fuse_reply_err(req, err);
		return;
	}
	fi->fh = dir_handle(d);
	if (fuse_reply_open(req, fi) == -ENOENT)
		close_dir(d);
}

/* Fills buf with entries from the stream; returns the bytes used. */
static size_t fill_entries(fuse_req_t req, struct dir_handle *d, char *buf, size_t size)
{
	size_t used = 0;
	for (;;) {
		if (d->pending == NULL && (d->pending = readdir(d->dp)) == NULL)
			return used;
		struct stat st = { .st_ino = d->pending->d_ino, .st_mode = DTTOIF(d->pending->d_type) };
		off_t next = telldir(d->dp);
		size_t len = fuse_add_direntry(req, buf + used, size - used, d->pending->d_name, &st, next);
		if (len > size - used)
			return used; /* kept for the next call */
		used += len;
		d->offset = next;
		d->pending = NULL;
	}
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	if (refused(req))
		return;
	struct dir_handle *d = dir_or_reply(req, ino, fi);
	if (d == NULL)
		return;
	char *buf = malloc(size);
	if (buf == NULL) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (off != d->offset) {
		seekdir(d->dp, off);
		d->offset = off;
		d->pending = NULL;
	}
	errno = 0;
	size_t used = fill_entries(req, d, buf, size);
	if (used == 0 && errno != 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	release_dir(volume_of(req), fi);
	fuse_reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	if (refused(req))
		return;
	struct dir_handle *d = dir_or_reply(req, ino, fi);
	reply_sync(req, d != NULL ? dirfd(d->dp) : -1, datasync);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	(void)ino;
	if (refused(req))
		return;
	struct statvfs st;
	if (fstatvfs(volume_of(req)->root.fd, &st) == -1)
		fuse_reply_err(req, errno);
	else
		fuse_reply_statfs(req, &st);
}

const struct fuse_lowlevel_ops gitcsi_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.readlink = op_readlink,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.symlink = op_symlink,
	.link = op_link,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.rename = op_rename,
	.open = op_open,
	.create = op_create,
	.read = op_read,
	.write_buf = op_write_buf,
	/*
	 * No flush: the kernel writes a closing file's cached pages before it
	 * would send FLUSH, so a close has nothing more to push; told ENOSYS once,
	 * the kernel stops sending it, a round trip less per close. Locks are the
	 * kernel's, released without it.
	 */
	.release = op_release,
	.fsync = op_fsync,
	.fallocate = op_fallocate,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.releasedir = op_releasedir,
	.fsyncdir = op_fsyncdir,
	.statfs = op_statfs,
};
