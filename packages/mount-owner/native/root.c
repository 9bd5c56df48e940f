/*
 * A read-only volume that follows its ref serves each new commit from a
 * directory of its own, and the mount's root switches to it in one step.
 * The root keeps its descriptor number: dup3 points it at the new directory,
 * so a worker that reads the root mid-request uses the old directory or the
 * new one, never a closed or reused descriptor. A file already open keeps its
 * own descriptor into the old tree, and reads what it opened.
 *
 * Once a mount follows, the kernel caches no entry: every path walk asks the
 * server, so no lookup after a switch finds an entry of the tree before it,
 * and a file read after another never comes from an older commit. Attributes
 * and pages stay cached: a commit's files never change, and a new commit's
 * files are new inodes.
 */
#include "volume.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

double entry_seconds(fuse_req_t req)
{
	struct volume *v = fuse_req_userdata(req);
	return atomic_load(&v->follows) ? 0 : cache_seconds(req);
}

static int switch_root(struct volume *v, const char *backing)
{
	int fd = open(backing, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd == -1)
		return errno;
	struct stat st;
	int err = fstat(fd, &st) == -1 ? errno : 0;
	/* Node ids are inode numbers of the backing file system: another one could alias them. */
	if (err == 0 && st.st_dev != v->dev)
		err = EXDEV;
	/* Before the switch: no entry of the new tree is ever cached. */
	if (err == 0)
		atomic_store(&v->follows, true);
	if (err == 0 && dup3(fd, v->root.fd, O_CLOEXEC) == -1)
		err = errno;
	close(fd);
	if (err == 0)
		__atomic_store_n(&v->root_ino, st.st_ino, __ATOMIC_SEQ_CST);
	return err;
}

/* switchRoot(handle, backing): the mount serves backing from now on; what the kernel cached of the old root goes. */
napi_value js_switch_root(napi_env env, napi_callback_info info)
{
	napi_value arg;
	struct volume *v = volume_arg(env, info, &arg, "switchRoot");
	if (v == NULL)
		return NULL;
	char backing[PATH_MAX];
	size_t len;
	if (napi_get_value_string_utf8(env, arg, backing, sizeof(backing), &len) != napi_ok || len >= sizeof(backing) - 1)
		return throw_errno(env, EINVAL, "switchRoot: backing must be a path");
	int err = switch_root(v, backing);
	if (err != 0)
		return throw_errno(env, err, backing);
	invalidate(v);
	return NULL;
}
