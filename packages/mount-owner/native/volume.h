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
#include <dirent.h>
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

/* The kernel's INIT request of a connection, kept to replay to a resumed session. */
#define INIT_MAX 256

/* How the session reads /dev/fuse: readers park for a graceful handover (io.c). */
struct io_state {
	int stop_fd; /* eventfd: wakes the readers that wait for a request */
	pthread_mutex_t lock;
	pthread_cond_t changed;
	atomic_bool stopping;
	bool ended; /* the session's loop returned */
	int active; /* readers in a read, or serving what they read */
	unsigned char init[INIT_MAX];
	size_t init_len;
};

/* Descriptors of files and directories opened by an earlier server of the connection (handles.c). */
struct foreign_handle {
	uint64_t fh;
	int fd;
	struct dir_handle *dir;
	struct foreign_handle *next;
};

struct volume {
	struct fuse_session *se;
	pthread_t loop;
	char *mountpoint;
	struct node root;
	ino_t root_ino;
	dev_t dev;
	struct node_table nodes;
	/* Taken over from an earlier server: ids and handles it gave out are found again. */
	bool resumed;
	struct io_state io;
	pthread_mutex_t foreign_lock;
	struct foreign_handle *foreign;

	/* The kernel keeps written pages until a flush sends them (ops.c op_init). */
	atomic_bool writeback;
	atomic_int writers; /* files of this incarnation open for writing */
	/* The flusher's thread and its stop (flush.c); worker threads take the lock, never wait under it. */
	pthread_mutex_t flush_lock;
	pthread_cond_t flush_wake;
	bool flushing;
	bool flush_stopped;
	pthread_t flusher;
	/* A sync under way holds it; an unmount closes syncs first (flush.c sync_close). */
	pthread_mutex_t sync_lock;
	bool sync_closed;

	/* Epoch fence: set once, never cleared. */
	atomic_bool fenced;
	_Atomic int64_t serve_until_ms; /* on serving_clock_ms() */
	atomic_uint refused_pending; /* refusals JS has not been told of */
	napi_threadsafe_function on_fenced;

	/* The thread that fences at the lease's end (deadline.c). */
	struct {
		int timer; /* timerfd on CLOCK_BOOTTIME */
		int wake; /* eventfd: the end moved, or stop */
		atomic_bool stopped;
		bool started;
		pthread_t thread;
	} deadline;

	/* Guards ended and the invalidation passes against the loop's end (fence.c). */
	pthread_mutex_t life;
	pthread_cond_t invalidated;
	bool ended;
	bool invalidating; /* the invalidator thread runs */
	uint64_t passes_asked, passes_done;
	uint64_t inodes_done; /* the last pass whose inodes were dropped */
	uint64_t fence_pass; /* the pass the fence asked for; 0 if none runs */
	/* Resumed: the kernel may cache ids an earlier server gave out, found by walking the tree. */
	bool stale_ids;

	atomic_int refs; /* the loop thread and the JS handle */

	/* The root switches between commits' trees; the kernel caches no entry (root.c). */
	atomic_bool follows;
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
/* A node an earlier server gave out: counted once, whatever the kernel's count (it forgets all at once). */
int node_adopt(struct volume *v, int fd, fuse_ino_t id, fuse_ino_t parent, const char *name);
struct entry_ref {
	fuse_ino_t id;
	fuse_ino_t parent;
	char *name;
};
/* A copy of every id (and its last entry) handed out, for invalidation. */
size_t nodes_snapshot(struct volume *v, struct entry_ref **out);
/* The kernel renamed an entry: the node there takes that name, for invalidation. */
void node_moved(struct volume *v, int dir_fd, fuse_ino_t parent, const char *name);

/* resume.c */
/* The node for an id an earlier server gave out, found again in the backing tree; NULL if gone. */
struct node *node_recover(struct volume *v, fuse_ino_t id);
/* Invalidates every inode and entry of the backing tree, whichever server gave it out. */
void invalidate_tree(struct volume *v);

/* io.c */
extern const struct fuse_custom_io gitcsi_io;
int io_init(struct io_state *io);
void io_destroy(struct io_state *io);
/* Readers stop taking requests; returns once none is in flight, or the session ended. */
void io_quiesce(struct io_state *io);
void io_end(struct io_state *io);
/* Waits for the connection's INIT to have been read; 0 or ETIMEDOUT. */
int io_wait_init(struct io_state *io, int timeout_ms);
/* Tells a resumed session the INIT the kernel sent its connection. */
void io_replay_init(struct volume *v, const unsigned char *init, size_t len);

/* handles.c: fh values name the server incarnation that opened them */
struct dir_handle {
	DIR *dp;
	off_t offset;
	struct dirent *pending;
};
void handles_set_incarnation(uint16_t incarnation);
uint64_t file_handle(int fd, int flags);
uint64_t dir_handle(struct dir_handle *d);
/* The backing descriptor of an open file; -1 with errno set. */
int file_fd(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
struct dir_handle *dir_of(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void release_file(struct volume *v, struct fuse_file_info *fi);
void release_dir(struct volume *v, struct fuse_file_info *fi);
void foreign_destroy(struct volume *v);
int open_dir(int dir_fd, struct dir_handle **out);
void close_dir(struct dir_handle *d);
/* Reopens a node through /proc with the caller's flags. */
int reopen(const struct node *n, int flags);
/* The flags to open the backing file with for the caller's. */
int backing_flags(const struct volume *v, int flags);
void count_writer(struct volume *v, uint64_t fh, int delta);
void foreign_writer(struct volume *v, uint64_t fh, int delta);

/* flush.c */
/* Starts sending the kernel's dirty pages of the mount to the backing tree every second. */
int flush_start(struct volume *v);
/* Stops the flusher and waits for it; any thread but a worker's. */
void flush_stop(struct volume *v);
/* Files open for writing, counted up or down; the first wakes the flusher. */
void add_writers(struct volume *v, int delta);
/* CLOCK_REALTIME ms from now, for pthread_cond_timedwait. */
struct timespec after_ms(int ms);
/* No sync starts any more; one under way is waited for. */
void sync_close(struct volume *v);
napi_value js_sync_mount(napi_env env, napi_callback_info info);

/* ops.c */
#define PROC_PATH_SIZE 32
const char *proc_path(char buf[PROC_PATH_SIZE], int fd);
extern const struct fuse_lowlevel_ops gitcsi_ops;

/* deadline.c */
int deadline_start(struct volume *v);
void deadline_moved(struct volume *v);
void deadline_stop(struct volume *v);
void deadline_close(struct volume *v);

/* fence.c */
int64_t serving_clock_ms(void);
/* True (and the request answered EIO) once the epoch no longer holds the volume; after the fence's pass dropped the cached inodes. */
bool refused(fuse_req_t req);
/* The same for a WRITE, answered at once: with the writeback cache the pass may be waiting for it. */
bool write_refused(fuse_req_t req);
/* The entry and attribute timeout of a reply. */
double cache_seconds(fuse_req_t req);
void fence(struct volume *v);
void invalidate(struct volume *v);
void fence_settle(struct volume *v);
void fence_join(struct volume *v);

void volume_put(struct volume *v);
napi_value throw_errno(napi_env env, int err, const char *what);
/* The volume a JS handle names (argument 0), or NULL with the call's error thrown; rest gets argument 1. */
struct volume *volume_arg(napi_env env, napi_callback_info info, napi_value *rest, const char *call);

/* root.c */
/* The entry timeout of a reply: none once the mount follows a ref. */
double entry_seconds(fuse_req_t req);
napi_value js_switch_root(napi_env env, napi_callback_info info);

/* handover.c: the kept descriptors, over the keeper's socket */
napi_value handover_exports(napi_env env, napi_value exports);
int start_thread(pthread_t *thread, void *(*run)(void *), void *arg);

#endif
