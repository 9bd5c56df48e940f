/*
 * The N-API face of the FUSE server. JavaScript mounts, unmounts, moves the
 * lease's end and fences; it never runs per operation.
 */
#include "volume.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

/* libfuse's worker threads per session; the machine has few cores. */
#define MAX_THREADS 8
#define NAPI_OK(env, call)                                                                         \
	do {                                                                                       \
		if ((call) != napi_ok)                                                             \
			return throw_errno(env, EINVAL, #call " failed");                         \
	} while (0)

napi_value throw_errno(napi_env env, int err, const char *what)
{
	char message[512];
	snprintf(message, sizeof(message), "%s: %s", what, strerror(err));
	const char *code = strerrorname_np(err);
	napi_throw_error(env, code != NULL ? code : "EIO", message);
	return NULL;
}

static void volume_free(struct volume *v)
{
	nodes_destroy(&v->nodes);
	foreign_destroy(v);
	io_destroy(&v->io);
	deadline_close(v);
	if (v->root.fd >= 0)
		close(v->root.fd);
	pthread_cond_destroy(&v->flush_wake);
	pthread_mutex_destroy(&v->flush_lock);
	pthread_mutex_destroy(&v->sync_lock);
	pthread_mutex_destroy(&v->life);
	pthread_cond_destroy(&v->invalidated);
	free(v->mountpoint);
	free(v);
}

void volume_put(struct volume *v)
{
	if (atomic_fetch_sub(&v->refs, 1) == 1)
		volume_free(v);
}

static void tell_refused(napi_env env, napi_value callback, void *context, void *data)
{
	(void)data;
	struct volume *v = context;
	unsigned count = atomic_exchange(&v->refused_pending, 0);
	napi_value argv[1], undefined;
	if (env == NULL || napi_create_uint32(env, count, &argv[0]) != napi_ok ||
	    napi_get_undefined(env, &undefined) != napi_ok)
		return;
	napi_call_function(env, undefined, callback, 1, argv, NULL);
}

/* The callback is the loop thread's reference: released when the session ends. */
static void release_loop_ref(napi_env env, void *data, void *hint)
{
	(void)env;
	(void)hint;
	volume_put(data);
}

static void *serve(void *arg)
{
	struct volume *v = arg;
	struct fuse_loop_config *config = fuse_loop_cfg_create();
	fuse_loop_cfg_set_clone_fd(config, 1);
	fuse_loop_cfg_set_max_threads(config, MAX_THREADS);
	fuse_session_loop_mt(v->se, config);
	io_end(&v->io);
	fuse_loop_cfg_destroy(config);
	flush_stop(v);
	deadline_stop(v);
	fence_join(v);
	fuse_session_destroy(v->se);
	napi_release_threadsafe_function(v->on_fenced, napi_tsfn_release);
	return NULL;
}

/*
 * Threads of ours start with every signal blocked, as libfuse's workers do:
 * Node's main thread takes the signals.
 */
int start_thread(pthread_t *thread, void *(*run)(void *), void *arg)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int err = pthread_create(thread, NULL, run, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return err;
}

/* libfuse splits -o at unescaped commas: escaped, a name cannot add options. */
static char *mount_options(const char *fsname)
{
	const char *prefix = "allow_other,default_permissions,fsname=";
	char *opts = malloc(strlen(prefix) + 2 * strlen(fsname) + 1);
	if (opts == NULL)
		return NULL;
	char *at = stpcpy(opts, prefix);
	for (const char *c = fsname; *c != '\0'; c++) {
		if (*c == ',' || *c == '\\')
			*at++ = '\\';
		*at++ = *c;
	}
	*at = '\0';
	return opts;
}

/* A server that died leaves an ENOTCONN mount; the new one goes on top of nothing. */
static void clear_dead_mount(const char *mountpoint)
{
	struct stat st;
	if (stat(mountpoint, &st) == -1 && errno == ENOTCONN)
		umount2(mountpoint, MNT_DETACH);
}

static int open_backing(struct volume *v, const char *backing)
{
	struct stat st;
	v->root.fd = open(backing, O_PATH | O_DIRECTORY);
	if (v->root.fd == -1 || fstat(v->root.fd, &st) == -1)
		return errno;
	v->root.id = FUSE_ROOT_ID;
	v->root_ino = st.st_ino;
	v->dev = st.st_dev;
	return 0;
}

/* Mounts a new connection, or takes over a kept one (fd) and replays its INIT. */
static int start_session(struct volume *v, const char *fsname, int fd, const unsigned char *init, size_t init_len)
{
	char *opts = mount_options(fsname);
	if (opts == NULL)
		return ENOMEM;
	char *argv[] = { "git-csi", "-o", opts, NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, argv);
	v->se = fuse_session_new(&args, &gitcsi_ops, sizeof(gitcsi_ops), v);
	fuse_opt_free_args(&args);
	free(opts);
	if (v->se == NULL)
		return EINVAL;
	if (fd == -1) {
		clear_dead_mount(v->mountpoint);
		if (fuse_session_mount(v->se, v->mountpoint) != 0) {
			fuse_session_destroy(v->se);
			return EIO;
		}
		fd = fuse_session_fd(v->se);
	}
	int err = -fuse_session_custom_io(v->se, &gitcsi_io, fd);
	if (err == 0 && init != NULL)
		io_replay_init(v, init, init_len);
	/* The flusher and the deadline first: they go if the loop cannot start. */
	if (err == 0)
		err = flush_start(v);
	if (err == 0 && (err = deadline_start(v)) != 0)
		flush_stop(v);
	if (err == 0 && (err = start_thread(&v->loop, serve, v)) != 0) {
		deadline_stop(v);
		flush_stop(v);
	}
	if (err != 0) {
		fuse_session_unmount(v->se);
		fuse_session_destroy(v->se);
		return err;
	}
	pthread_detach(v->loop);
	return 0;
}

static char *string_arg(napi_env env, napi_value value)
{
	size_t len;
	if (napi_get_value_string_utf8(env, value, NULL, 0, &len) != napi_ok)
		return NULL;
	char *s = malloc(len + 1);
	if (s != NULL)
		napi_get_value_string_utf8(env, value, s, len + 1, &len);
	return s;
}

static int64_t ms_arg(napi_env env, napi_value value)
{
	double ms;
	if (napi_get_value_double(env, value, &ms) != napi_ok || ms >= (double)INT64_MAX)
		return INT64_MAX;
	return (int64_t)ms;
}

static struct volume *volume_new(napi_env env, napi_value mountpoint, napi_value serve_until)
{
	struct volume *v = calloc(1, sizeof(*v));
	if (v == NULL)
		return NULL;
	v->root.fd = -1;
	v->deadline.timer = v->deadline.wake = -1;
	v->mountpoint = string_arg(env, mountpoint);
	atomic_init(&v->serve_until_ms, ms_arg(env, serve_until));
	atomic_init(&v->refs, 1);
	pthread_mutex_init(&v->life, NULL);
	pthread_cond_init(&v->invalidated, NULL);
	pthread_mutex_init(&v->flush_lock, NULL);
	pthread_cond_init(&v->flush_wake, NULL);
	pthread_mutex_init(&v->sync_lock, NULL);
	pthread_mutex_init(&v->foreign_lock, NULL);
	if (v->mountpoint == NULL || nodes_init(&v->nodes) != 0) {
		free(v->mountpoint);
		free(v);
		return NULL;
	}
	if (io_init(&v->io) != 0) {
		nodes_destroy(&v->nodes);
		free(v->mountpoint);
		free(v);
		return NULL;
	}
	return v;
}

static napi_status fenced_callback(napi_env env, struct volume *v, napi_value fn)
{
	napi_value name;
	napi_status status = napi_create_string_utf8(env, "onFenced", NAPI_AUTO_LENGTH, &name);
	if (status == napi_ok)
		status = napi_create_threadsafe_function(env, fn, NULL, name, 0, 1, v, release_loop_ref,
							 v, tell_refused, &v->on_fenced);
	if (status == napi_ok)
		status = napi_unref_threadsafe_function(env, v->on_fenced);
	return status;
}

static void release_js_ref(napi_env env, void *data, void *hint)
{
	(void)env;
	(void)hint;
	volume_put(data);
}

/* A kept connection to take over: its descriptor and the INIT the kernel sent it. */
struct kept {
	int fd;
	unsigned char init[INIT_MAX];
	size_t init_len;
};

static int kept_arg(napi_env env, napi_value fd, napi_value init, struct kept *k)
{
	void *data;
	if (napi_get_value_int32(env, fd, &k->fd) != napi_ok || k->fd < 0 ||
	    napi_get_buffer_info(env, init, &data, &k->init_len) != napi_ok || k->init_len == 0 ||
	    k->init_len > INIT_MAX)
		return EINVAL;
	memcpy(k->init, data, k->init_len);
	return 0;
}

/*
 * mount(mountpoint, backing, fsname, serveUntilMs, onFenced(refused)) -> handle
 * resume(mountpoint, backing, fsname, serveUntilMs, onFenced, fd, init) -> handle
 */
static napi_value start(napi_env env, napi_callback_info info, bool resume)
{
	size_t argc = 7;
	napi_value argv[7], handle;
	struct kept k = { .fd = -1 };
	NAPI_OK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
	if (resume && kept_arg(env, argv[5], argv[6], &k) != 0)
		return throw_errno(env, EINVAL, "resume: fd and init must name a kept connection");
	struct volume *v = volume_new(env, argv[0], argv[3]);
	if (v == NULL)
		return throw_errno(env, ENOMEM, "mount");
	v->resumed = resume;
	v->stale_ids = resume;
	char *backing = string_arg(env, argv[1]);
	char *fsname = string_arg(env, argv[2]);
	int err = backing == NULL || fsname == NULL ? EINVAL : open_backing(v, backing);
	if (err == 0 && fenced_callback(env, v, argv[4]) != napi_ok)
		err = EINVAL;
	if (err == 0) {
		atomic_fetch_add(&v->refs, 1); /* the loop's, dropped with the callback */
		err = start_session(v, fsname, k.fd, resume ? k.init : NULL, k.init_len);
		if (err != 0)
			napi_release_threadsafe_function(v->on_fenced, napi_tsfn_release);
	}
	free(backing);
	free(fsname);
	if (err != 0) {
		volume_put(v);
		return throw_errno(env, err, resume ? "resume" : "mount");
	}
	/* What the kernel cached from the earlier server goes before anything can move the tree. */
	if (resume)
		invalidate(v);
	NAPI_OK(env, napi_create_external(env, v, release_js_ref, NULL, &handle));
	return handle;
}

static napi_value js_mount(napi_env env, napi_callback_info info)
{
	return start(env, info, false);
}

static napi_value js_resume(napi_env env, napi_callback_info info)
{
	return start(env, info, true);
}

struct volume *volume_arg(napi_env env, napi_callback_info info, napi_value *rest, const char *call)
{
	size_t argc = 2;
	napi_value argv[2];
	void *v = NULL;
	if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok ||
	    napi_get_value_external(env, argv[0], &v) != napi_ok) {
		char what[64];
		snprintf(what, sizeof(what), "%s: not a mount handle", call);
		throw_errno(env, EINVAL, what);
		return NULL;
	}
	if (rest != NULL)
		*rest = argv[1];
	return v;
}

/*
 * Unmounts the mountpoint; the session ends once no bind of it is left. The
 * worker threads never need this thread, so waiting here cannot deadlock.
 */
static napi_value js_unmount(napi_env env, napi_callback_info info)
{
	struct volume *v = volume_arg(env, info, NULL, "unmount");
	if (v == NULL)
		return NULL;
	/* The unmount syncs the mount itself; a sync's descriptor would make it lazy. */
	flush_stop(v);
	sync_close(v);
	int res = umount2(v->mountpoint, 0);
	if (res == -1 && errno == EBUSY)
		res = umount2(v->mountpoint, MNT_DETACH);
	/* EINVAL: nothing is mounted there any more. */
	if (res == -1 && errno != EINVAL)
		return throw_errno(env, errno, v->mountpoint);
	return NULL;
}

static napi_value js_serve_until(napi_env env, napi_callback_info info)
{
	napi_value ms;
	struct volume *v = volume_arg(env, info, &ms, "serveUntil");
	if (v == NULL)
		return NULL;
	atomic_store(&v->serve_until_ms, ms_arg(env, ms));
	deadline_moved(v);
	return NULL;
}

static napi_value js_fence(napi_env env, napi_callback_info info)
{
	struct volume *v = volume_arg(env, info, NULL, "fence");
	if (v == NULL)
		return NULL;
	fence(v);
	fence_settle(v);
	return NULL;
}

/* A tree move behind the mount: the kernel asks again for every entry and attribute it cached. */
static napi_value js_invalidate(napi_env env, napi_callback_info info)
{
	struct volume *v = volume_arg(env, info, NULL, "invalidate");
	if (v != NULL)
		invalidate(v);
	return NULL;
}

static napi_value js_clock_ms(napi_env env, napi_callback_info info)
{
	(void)info;
	napi_value ms;
	napi_create_double(env, (double)serving_clock_ms(), &ms);
	return ms;
}

static napi_value init(napi_env env, napi_value exports)
{
	napi_property_descriptor props[] = {
		{ "mount", NULL, js_mount, NULL, NULL, NULL, napi_default, NULL },
		{ "unmount", NULL, js_unmount, NULL, NULL, NULL, napi_default, NULL },
		{ "serveUntil", NULL, js_serve_until, NULL, NULL, NULL, napi_default, NULL },
		{ "fence", NULL, js_fence, NULL, NULL, NULL, napi_default, NULL },
		{ "invalidate", NULL, js_invalidate, NULL, NULL, NULL, napi_default, NULL },
		{ "syncMount", NULL, js_sync_mount, NULL, NULL, NULL, napi_default, NULL },
		{ "resume", NULL, js_resume, NULL, NULL, NULL, napi_default, NULL },
		{ "clockMs", NULL, js_clock_ms, NULL, NULL, NULL, napi_default, NULL },
		{ "switchRoot", NULL, js_switch_root, NULL, NULL, NULL, napi_default, NULL },
	};
	napi_define_properties(env, exports, sizeof(props) / sizeof(props[0]), props);
	return handover_exports(env, exports);
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
