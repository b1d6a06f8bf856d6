/* The client side of the export: ioctl for a ticket, then the ticket for
 * descriptors over the daemon's socket.  The manifest parser trusts nothing. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define XP_PATH_MAX 4096
#define XP_TAG_MAX 255

static bool key_is(const msgpack_object *k, const char *name)
{
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(name) &&
	       !memcmp(k->via.str.ptr, name, k->via.str.size);
}

static int get_u64(const msgpack_object *o, uint64_t *out)
{
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return -1;
	*out = o->via.u64;
	return 0;
}

/* A string without NUL bytes, of 0..max bytes, copied. */
static char *get_str(const msgpack_object *o, size_t max)
{
	if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > max || memchr(o->via.str.ptr, 0, o->via.str.size))
		return NULL;
	return strndup(o->via.str.ptr, o->via.str.size);
}

static int parse_entry(const msgpack_object *o, struct xp_entry *e)
{
	if (o->type != MSGPACK_OBJECT_MAP)
		return -1;
	*e = (struct xp_entry){ .fd = -1 };
	bool has_size = false, has_aligned = false;
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
		if (key_is(k, "path") && !e->path)
			e->path = get_str(v, XP_PATH_MAX);
		else if (key_is(k, "tag") && !e->tag)
			e->tag = get_str(v, XP_TAG_MAX);
		else if (key_is(k, "size") && !has_size)
			has_size = !get_u64(v, &e->size);
		else if (key_is(k, "aligned") && !has_aligned)
			has_aligned = !get_u64(v, &e->aligned);
		else
			goto bad;
	}
	if (e->path && e->path[0] && e->tag && has_size && has_aligned && e->size && e->aligned >= e->size)
		return 0;
bad:
	free(e->path);
	free(e->tag);
	e->path = e->tag = NULL;
	return -1;
}

void xp_manifest_free(struct xp_manifest *m)
{
	for (size_t i = 0; i < m->n; i++) {
		free(m->v[i].path);
		free(m->v[i].tag);
	}
	free(m->v);
	m->v = NULL;
	m->n = 0;
}

static uint64_t be(const uint8_t *p, int n)
{
	uint64_t v = 0;
	while (n--)
		v = v << 8 | *p++;
	return v;
}

/* Walk one msgpack object at *off, checking what msgpack-c would trust: a container
 * may not declare more elements than bytes remain (msgpack-c allocates for the
 * declared count first), nesting stays shallow.  0 or -1. */
static int precheck(const uint8_t *p, size_t len, size_t *off, int depth)
{
	if (*off >= len || depth > 8)
		return -1;
	uint8_t b = p[(*off)++];
	uint64_t n = 0, skip = 0;
	int lenbytes = 0;
	bool container = false;
	if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
		return 0;
	if ((b & 0xf0) == 0x80 || (b & 0xf0) == 0x90) {
		n = (uint64_t)(b & 0x0f) * ((b & 0xf0) == 0x80 ? 2 : 1);
		container = true;
	} else if ((b & 0xe0) == 0xa0) {
		skip = b & 0x1f;
	} else {
		switch (b) {
		case 0xc4: case 0xd9: lenbytes = 1; break;
		case 0xc5: case 0xda: lenbytes = 2; break;
		case 0xc6: case 0xdb: lenbytes = 4; break;
		case 0xc7: lenbytes = 1, skip = 1; break;
		case 0xc8: lenbytes = 2, skip = 1; break;
		case 0xc9: lenbytes = 4, skip = 1; break;
		case 0xca: skip = 4; break;
		case 0xcb: skip = 8; break;
		case 0xcc: case 0xd0: skip = 1; break;
		case 0xcd: case 0xd1: skip = 2; break;
		case 0xce: case 0xd2: skip = 4; break;
		case 0xcf: case 0xd3: skip = 8; break;
		case 0xd4: skip = 2; break;
		case 0xd5: skip = 3; break;
		case 0xd6: skip = 5; break;
		case 0xd7: skip = 9; break;
		case 0xd8: skip = 17; break;
		case 0xdc: lenbytes = 2, container = true; break;
		case 0xdd: lenbytes = 4, container = true; break;
		case 0xde: lenbytes = 2, container = true; break;
		case 0xdf: lenbytes = 4, container = true; break;
		default: return -1; /* 0xc1: never used */
		}
		if (lenbytes) {
			if (len - *off < (size_t)lenbytes)
				return -1;
			uint64_t v = be(p + *off, lenbytes);
			*off += (size_t)lenbytes;
			if (container)
				n = b >= 0xde ? 2 * v : v;
			else
				skip += v;
		}
	}
	if (container) {
		if (n > len - *off)
			return -1;
		for (uint64_t i = 0; i < n; i++)
			if (precheck(p, len, off, depth + 1))
				return -1;
		return 0;
	}
	if (skip > len - *off)
		return -1;
	*off += (size_t)skip;
	return 0;
}

int xp_parse(const void *buf, size_t len, struct xp_manifest *m, char *why, size_t whylen)
{
	*m = (struct xp_manifest){0};
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	size_t off = 0;
	int e = -EPROTO;
	const char *reason = "not one msgpack map";
	size_t pre = 0;
	if (precheck(buf, len, &pre, 0) || pre != len)
		goto out;
	if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len ||
	    u.data.type != MSGPACK_OBJECT_MAP)
		goto out;
	const msgpack_object_map *map = &u.data.via.map;
	uint64_t v = 0, err = 0;
	bool has_v = false, has_err = false, has_total = false, has_first = false, has_last = false;
	const msgpack_object *allocs = NULL;
	reason = "bad field";
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object *k = &map->ptr[i].key, *val = &map->ptr[i].val;
		if (key_is(k, "v") && !has_v)
			has_v = !get_u64(val, &v);
		else if (key_is(k, "err") && !has_err)
			has_err = !get_u64(val, &err);
		else if (key_is(k, "msg") && val->type == MSGPACK_OBJECT_STR)
			snprintf(m->msg, sizeof m->msg, "%.*s", (int)(val->via.str.size < 255 ? val->via.str.size : 255),
				 val->via.str.ptr);
		else if (key_is(k, "total") && !has_total)
			has_total = !get_u64(val, &m->total);
		else if (key_is(k, "first") && !has_first)
			has_first = !get_u64(val, &m->first);
		else if (key_is(k, "last") && !has_last && val->type == MSGPACK_OBJECT_BOOLEAN)
			has_last = true, m->last = val->via.boolean;
		else if (key_is(k, "allocs") && !allocs && val->type == MSGPACK_OBJECT_ARRAY)
			allocs = val;
		else
			goto out;
	}
	if (!has_v || v != 1 || !has_err || err > 4095) {
		reason = "missing version or error field";
		goto out;
	}
	if (err) {
		m->err = (int)err;
		e = 0;
		goto out;
	}
	reason = "missing or inconsistent counts";
	if (!has_total || !has_first || !has_last || !allocs || allocs->via.array.size > GMSFS_FDS_PER_MSG ||
	    m->first > m->total || allocs->via.array.size > m->total - m->first ||
	    (m->last && m->first + allocs->via.array.size != m->total))
		goto out;
	m->v = calloc(allocs->via.array.size ? allocs->via.array.size : 1, sizeof *m->v);
	if (!m->v) {
		e = -ENOMEM;
		goto out;
	}
	reason = "bad allocation entry";
	for (uint32_t i = 0; i < allocs->via.array.size; i++) {
		if (parse_entry(&allocs->via.array.ptr[i], &m->v[i]))
			goto out;
		m->n++;
	}
	e = 0;
out:
	msgpack_unpacked_destroy(&u);
	if (e) {
		xp_manifest_free(m);
		snprintf(why, whylen, "%s", e == -EPROTO ? reason : strerror(-e));
	}
	return e;
}

void xp_free(struct xp_entry *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i].path);
		free(v[i].tag);
		if (v[i].fd >= 0)
			close(v[i].fd);
	}
	free(v);
}

static void close_fds(const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
}

/* Receive the replies to one request: manifests with their descriptors. */
static int receive(gmsfs *g, int sock, struct xp_entry **out, size_t *nout)
{
	char *buf = malloc(GMSFS_MANIFEST_MAX + 1);
	struct xp_entry *v = NULL;
	size_t n = 0, total = 0;
	int e = 0;
	if (!buf)
		return gm_error(g, -ENOMEM, "export: out of memory");
	for (;;) {
		union {
			char b[CMSG_SPACE(sizeof(int) * GMSFS_FDS_PER_MSG)];
			struct cmsghdr align;
		} u;
		struct iovec iov = { buf, GMSFS_MANIFEST_MAX + 1 };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b };
		ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
		if (r <= 0) {
			e = gm_error(g, r < 0 ? -errno : -EPROTO, "export socket: %s",
				     r < 0 ? strerror(errno) : "daemon closed the connection");
			break;
		}
		int fds[GMSFS_FDS_PER_MSG];
		size_t nfds = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
				size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				if (nfds + k > GMSFS_FDS_PER_MSG)
					k = GMSFS_FDS_PER_MSG - nfds; /* cannot happen: the kernel caps it */
				memcpy(fds + nfds, CMSG_DATA(c), k * sizeof(int));
				nfds += k;
			}
		struct xp_manifest m;
		char why[128];
		if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
			close_fds(fds, nfds);
			e = gm_error(g, -EPROTO, "export socket: reply truncated");
			break;
		}
		if ((e = xp_parse(buf, (size_t)r, &m, why, sizeof why))) {
			close_fds(fds, nfds);
			gm_error(g, e, "export socket: malformed reply: %s", why);
			break;
		}
		if (m.err) {
			close_fds(fds, nfds);
			e = gm_error(g, -m.err, "export refused: %s", m.msg[0] ? m.msg : strerror(m.err));
			break;
		}
		if (nfds != m.n || m.first != n || (n && m.total != total)) {
			close_fds(fds, nfds);
			xp_manifest_free(&m);
			e = gm_error(g, -EPROTO, "export socket: %zu descriptors for %zu entries", nfds, m.n);
			break;
		}
		if (!n) {
			total = m.total;
			v = calloc(total ? total : 1, sizeof *v);
			if (!v) {
				close_fds(fds, nfds);
				xp_manifest_free(&m);
				e = gm_error(g, -ENOMEM, "export: out of memory");
				break;
			}
		}
		for (size_t i = 0; i < m.n; i++) {
			v[n] = m.v[i];
			v[n++].fd = fds[i];
		}
		free(m.v);
		if (m.last)
			break;
	}
	free(buf);
	if (e) {
		xp_free(v, n);
		return e;
	}
	*out = v;
	*nout = n;
	return 0;
}

int xp_fetch(gmsfs *g, int fd, unsigned long cmd, struct xp_entry **v, size_t *n)
{
	struct gmsfs_ioc io = { .size = sizeof io };
	if (ioctl(fd, cmd, &io) < 0)
		return gm_error(g, -errno, "export ioctl: %s", strerror(errno));
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	memcpy(a.sun_path, io.socket, sizeof a.sun_path - 1);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return gm_error(g, -errno, "export socket: %s", strerror(errno));
	if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
		int e = -errno;
		close(s);
		return gm_error(g, e, "export socket %s: %s", a.sun_path, strerror(-e));
	}
	struct gmsfs_sock_req req = { .magic = GMSFS_SOCK_MAGIC, .version = GMSFS_SOCK_VERSION, .op = GMSFS_SOCK_OP_REDEEM };
	memcpy(req.ticket, io.ticket, sizeof req.ticket);
	int e = 0;
	if (send(s, &req, sizeof req, MSG_NOSIGNAL) != (ssize_t)sizeof req)
		e = gm_error(g, -errno, "export socket: %s", strerror(errno));
	else
		e = receive(g, s, v, n);
	close(s);
	return e;
}
