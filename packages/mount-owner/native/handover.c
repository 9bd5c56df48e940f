/*
 * The N-API face of the handover: a mount's /dev/fuse descriptor and INIT go
 * to the keeper, a restarted mount owner takes them back, and a graceful stop
 * parks the readers so that no request is left half served.
 */
#include "keeper.h"
#include "volume.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The keeper answers at once; a keeper that hangs must not hang the mount owner. */
#define KEEPER_TIMEOUT_S 5
#define INIT_TIMEOUT_MS 10000

static int dial(const char *path, int *out)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(addr.sun_path))
		return ENAMETOOLONG;
	strcpy(addr.sun_path, path);
	int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (sock == -1)
		return errno;
	struct timeval timeout = { .tv_sec = KEEPER_TIMEOUT_S };
	setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
	setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
	if (connect(sock, (struct sockaddr *)&addr, sizeof(addr)) == -1) {
		int err = errno;
		close(sock);
		return err;
	}
	*out = sock;
	return 0;
}

static int string_value(napi_env env, napi_value value, char *buf, size_t size)
{
	size_t len;
	if (napi_get_value_string_utf8(env, value, buf, size, &len) != napi_ok || len + 1 >= size)
		return EINVAL;
	return 0;
}

/* keep(handle, socketPath, key): the keeper holds the connection from now on too. */
static napi_value js_keep(napi_env env, napi_callback_info info)
{
	size_t argc = 3;
	napi_value argv[3];
	void *v = NULL;
	static struct keeper_message m;
	char path[108];
	if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || napi_get_value_external(env, argv[0], &v) != napi_ok ||
	    string_value(env, argv[1], path, sizeof(path)) != 0 || string_value(env, argv[2], m.key, sizeof(m.key)) != 0)
		return throw_errno(env, EINVAL, "keep: a mount handle, the keeper's socket path and a key");
	struct volume *vol = v;
	int err = io_wait_init(&vol->io, INIT_TIMEOUT_MS);
	if (err != 0)
		return throw_errno(env, err, "keep: the connection's INIT");
	m.op = 'P';
	m.fd = fuse_session_fd(vol->se);
	pthread_mutex_lock(&vol->io.lock);
	memcpy(m.init, vol->io.init, vol->io.init_len);
	m.init_len = vol->io.init_len;
	pthread_mutex_unlock(&vol->io.lock);
	int sock;
	err = dial(path, &sock);
	if (err == 0) {
		err = keeper_send(sock, &m);
		close(sock);
	}
	return err != 0 ? throw_errno(env, err, path) : NULL;
}

static napi_status kept_entry(napi_env env, const struct keeper_message *m, napi_value *out)
{
	napi_value key, fd, init;
	void *data;
	napi_status status = napi_create_object(env, out);
	if (status == napi_ok)
		status = napi_create_string_utf8(env, m->key, NAPI_AUTO_LENGTH, &key);
	if (status == napi_ok)
		status = napi_create_int32(env, m->fd, &fd);
	if (status == napi_ok)
		status = napi_create_buffer_copy(env, m->init_len, m->init, &data, &init);
	if (status == napi_ok)
		status = napi_set_named_property(env, *out, "key", key);
	if (status == napi_ok)
		status = napi_set_named_property(env, *out, "fd", fd);
	if (status == napi_ok)
		status = napi_set_named_property(env, *out, "init", init);
	return status;
}

/* Receives the keeper's answer to 'T' into list; 0 or an errno. */
static int receive_kept(napi_env env, int sock, napi_value list)
{
	static struct keeper_message m;
	for (uint32_t i = 0;; i++) {
		int err = keeper_receive(sock, &m);
		if (err != 0)
			return err;
		if (m.op == 'E')
			return 0;
		napi_value entry;
		if (m.op != 'K' || m.fd < 0 || kept_entry(env, &m, &entry) != napi_ok || napi_set_element(env, list, i, entry) != napi_ok) {
			if (m.fd >= 0)
				close(m.fd);
			return EPROTO;
		}
	}
}

/* take(socketPath) -> [{ key, fd, init }]: the connections the keeper holds. */
static napi_value js_take(napi_env env, napi_callback_info info)
{
	size_t argc = 1;
	napi_value argv[1], list;
	char path[108];
	if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || string_value(env, argv[0], path, sizeof(path)) != 0)
		return throw_errno(env, EINVAL, "take: the keeper's socket path");
	if (napi_create_array(env, &list) != napi_ok)
		return throw_errno(env, ENOMEM, "take");
	int sock;
	int err = dial(path, &sock);
	if (err == 0) {
		struct keeper_message ask = { .op = 'T', .fd = -1 };
		err = keeper_send(sock, &ask);
		if (err == 0)
			err = receive_kept(env, sock, list);
		close(sock);
	}
	return err != 0 ? throw_errno(env, err, path) : list;
}

/* quiesce(handle): no request is taken any more, and every one taken is answered. */
static napi_value js_quiesce(napi_env env, napi_callback_info info)
{
	struct volume *v = volume_arg(env, info, NULL, "quiesce");
	if (v == NULL)
		return NULL;
	/* A sync in flight needs the readers: it ends first, and none starts after. */
	flush_stop(v);
	io_quiesce(&v->io);
	return NULL;
}

/* setIncarnation(n): 1..65535, unlike every earlier mount owner's whose handles may still be open. */
static napi_value js_set_incarnation(napi_env env, napi_callback_info info)
{
	size_t argc = 1;
	napi_value argv[1];
	uint32_t n;
	if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || napi_get_value_uint32(env, argv[0], &n) != napi_ok || n == 0 || n > UINT16_MAX)
		return throw_errno(env, EINVAL, "setIncarnation: an integer from 1 to 65535");
	handles_set_incarnation((uint16_t)n);
	return NULL;
}

napi_value handover_exports(napi_env env, napi_value exports)
{
	napi_property_descriptor props[] = {
		{ "keep", NULL, js_keep, NULL, NULL, NULL, napi_default, NULL },
		{ "take", NULL, js_take, NULL, NULL, NULL, napi_default, NULL },
		{ "quiesce", NULL, js_quiesce, NULL, NULL, NULL, napi_default, NULL },
		{ "setIncarnation", NULL, js_set_incarnation, NULL, NULL, NULL, napi_default, NULL },
	};
	napi_define_properties(env, exports, sizeof(props) / sizeof(props[0]), props);
	return exports;
}
