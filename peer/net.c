/* net: a connection through UCX's stream API (net.h).  A listener's worker serves the
 * connections it accepts; a connect has a context and a worker of its own. */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

#define NT_QUEUE 16 /* connection requests waiting for an accept; more are rejected */

struct nt_listener {
	ucp_context_h ctx;
	ucp_worker_h worker;
	ucp_listener_h listener;
	ucp_conn_request_h queue[NT_QUEUE];
	size_t queued;
};

struct nt_conn {
	ucp_context_h ctx; /* owned by a connect; NULL when accepted (the listener's) */
	ucp_worker_h worker; /* its own: a connection is moved by one thread, each by its own */
	ucp_ep_h ep;
	ucs_status_t failed; /* the peer went (the endpoint's error), or a wait ran out */
	bool answered;       /* a receive completed: somebody is there */
};

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int said(char *err, size_t errlen, int e, const char *what, ucs_status_t s)
{
	snprintf(err, errlen, "%s: %s", what, ucs_status_string(s));
	return e;
}

static int new_worker(ucp_context_h ctx, ucp_worker_h *worker, char *err, size_t errlen)
{
	ucp_worker_params_t wp = { .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS,
				   .thread_mode = UCS_THREAD_MODE_SINGLE,
				   .events = UCP_WAKEUP_TX | UCP_WAKEUP_RX };
	ucs_status_t s = ucp_worker_create(ctx, &wp, worker);
	return s == UCS_OK ? 0 : said(err, errlen, -EIO, "a UCX worker", s);
}

/* listening: a server killed mid-pull leaves its port's connections in TIME_WAIT, and
 * UCX binds its listener without SO_REUSEADDR unless told (CM_REUSEADDR): a new server
 * would be refused the port for a minute ("Device is busy"). */
static int context(ucp_context_h *ctx, ucp_worker_h *worker, bool listening, char *err, size_t errlen)
{
	ucp_config_t *cfg;
	ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
	if (s != UCS_OK)
		return said(err, errlen, -EIO, "UCX configuration", s);
	if (listening && !getenv("UCX_CM_REUSEADDR"))
		ucp_config_modify(cfg, "CM_REUSEADDR", "y"); /* an older UCX without it listens as before */
	/* Workers of one context in several threads: a listener's connections each have one. */
	ucp_params_t p = { .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
			   .features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP, .mt_workers_shared = 1 };
	s = ucp_init(&p, cfg, ctx);
	ucp_config_release(cfg);
	if (s != UCS_OK)
		return said(err, errlen, -EIO, "UCX", s);
	int e = new_worker(*ctx, worker, err, errlen);
	if (e)
		ucp_cleanup(*ctx);
	return e;
}

#define NT_SPIN_NS 200000 /* polled this long before sleeping on the descriptor (ucx_perftest only polls): a sleep per socket event costs rate */

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Progress the worker; with nothing done for a while, sleep on its descriptor up to ms.
 * Did anything happen? */
static bool progress(ucp_worker_h w, int ms)
{
	int64_t end = 0;
	for (unsigned i = 0;; i++) {
		if (ucp_worker_progress(w))
			return true;
		if (i % 64)
			continue;
		int64_t t = now_ns();
		if (!end)
			end = t + NT_SPIN_NS;
		else if (t >= end)
			break;
	}
	if (ms <= 0)
		return false;
	int fd;
	if (ucp_worker_get_efd(w, &fd) != UCS_OK || ucp_worker_arm(w) != UCS_OK)
		return true; /* busy: more to progress */
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms < 50 ? ms : 50) > 0;
}

static void on_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct nt_conn *c = arg;
	if (c->failed == UCS_OK)
		c->failed = status;
}

static void force_close(struct nt_conn *c)
{
	if (!c->ep)
		return;
	ucp_request_param_t p = { .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE };
	ucs_status_ptr_t r = ucp_ep_close_nbx(c->ep, &p);
	int64_t end = now_ms() + 1000;
	while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS && now_ms() < end)
		progress(c->worker, 10);
	if (UCS_PTR_IS_PTR(r))
		ucp_request_free(r);
	c->ep = NULL;
}

/* ---- listening ---- */

static void on_conn(ucp_conn_request_h req, void *arg)
{
	struct nt_listener *l = arg;
	if (l->queued < NT_QUEUE)
		l->queue[l->queued++] = req;
	else
		ucp_listener_reject(l->listener, req);
}

static int sockaddr_of(const char *host, uint16_t port, bool passive, struct sockaddr_storage *ss, socklen_t *len,
		       char *err, size_t errlen)
{
	char ps[8];
	snprintf(ps, sizeof ps, "%u", port);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0 };
	struct addrinfo *ai;
	int r = getaddrinfo(host && host[0] ? host : NULL, ps, &hints, &ai);
	if (r) {
		snprintf(err, errlen, "%s: %s", host && host[0] ? host : "any address", gai_strerror(r));
		return -EINVAL;
	}
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return 0;
}

int nt_listen(const char *addr, uint16_t port, struct nt_listener **out, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	struct nt_listener *l = calloc(1, sizeof *l);
	if (!l)
		return -ENOMEM;
	int e = sockaddr_of(addr, port, true, &ss, &sl, err, errlen);
	if (!e && !(e = context(&l->ctx, &l->worker, true, err, errlen))) {
		ucp_listener_params_t p = {
			.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
			.sockaddr = { .addr = (struct sockaddr *)&ss, .addrlen = sl },
			.conn_handler = { .cb = on_conn, .arg = l },
		};
		ucs_status_t s = ucp_listener_create(l->worker, &p, &l->listener);
		if (s != UCS_OK) {
			e = said(err, errlen, s == UCS_ERR_BUSY ? -EADDRINUSE : -EIO, "listening", s);
			ucp_worker_destroy(l->worker);
			ucp_cleanup(l->ctx);
		}
	}
	if (e) {
		free(l);
		return e;
	}
	*out = l;
	return 0;
}

int nt_accept(struct nt_listener *l, int timeout_ms, struct nt_conn **out, char *peer, size_t peerlen, char *err,
	      size_t errlen)
{
	int64_t end = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
	while (!l->queued) {
		int64_t left = end - now_ms();
		if (left <= 0)
			return -ETIMEDOUT;
		progress(l->worker, left > 1000 ? 1000 : (int)left);
	}
	ucp_conn_request_h req = l->queue[0];
	memmove(l->queue, l->queue + 1, --l->queued * sizeof *l->queue);
	snprintf(peer, peerlen, "a peer");
	ucp_conn_request_attr_t a = { .field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR };
	if (ucp_conn_request_query(req, &a) == UCS_OK) {
		char host[INET6_ADDRSTRLEN] = "?";
		const struct sockaddr *sa = (const struct sockaddr *)&a.client_address;
		if (sa->sa_family == AF_INET)
			inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, host, sizeof host);
		else if (sa->sa_family == AF_INET6)
			inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, host, sizeof host);
		snprintf(peer, peerlen, "%s", host);
	}
	struct nt_conn *c = calloc(1, sizeof *c);
	if (!c) {
		ucp_listener_reject(l->listener, req);
		return -ENOMEM;
	}
	/* Its own worker: the thread that serves it moves it alone (UCX accepts a request on
	 * another worker than the listener's). */
	int e = new_worker(l->ctx, &c->worker, err, errlen);
	if (e) {
		ucp_listener_reject(l->listener, req);
		free(c);
		return e;
	}
	ucp_ep_params_t p = {
		.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
			      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
		.conn_request = req, .err_mode = UCP_ERR_HANDLING_MODE_PEER, .err_handler = { .cb = on_error, .arg = c },
	};
	ucs_status_t s = ucp_ep_create(c->worker, &p, &c->ep);
	if (s != UCS_OK) {
		ucp_worker_destroy(c->worker);
		free(c);
		return said(err, errlen, -EIO, "accepting", s);
	}
	*out = c;
	return 0;
}

void nt_listener_close(struct nt_listener *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->queued; i++)
		ucp_listener_reject(l->listener, l->queue[i]);
	ucp_listener_destroy(l->listener);
	ucp_worker_destroy(l->worker);
	ucp_cleanup(l->ctx);
	free(l);
}

/* ---- connecting ---- */

int nt_connect(const char *host, uint16_t port, int timeout_ms, struct nt_conn **out, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	struct nt_conn *c = calloc(1, sizeof *c);
	if (!c)
		return -ENOMEM;
	int e = sockaddr_of(host, port, false, &ss, &sl, err, errlen);
	if (!e && !(e = context(&c->ctx, &c->worker, false, err, errlen))) {
		ucp_ep_params_t p = {
			.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER |
				      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
			.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
			.sockaddr = { .addr = (struct sockaddr *)&ss, .addrlen = sl },
			.err_mode = UCP_ERR_HANDLING_MODE_PEER,
			.err_handler = { .cb = on_error, .arg = c },
		};
		ucs_status_t s = ucp_ep_create(c->worker, &p, &c->ep);
		if (s != UCS_OK)
			e = said(err, errlen, -ECONNREFUSED, "connecting", s);
	}
	if (e) {
		nt_close(c);
		return e;
	}
	*out = c;
	return 0;
}

/* ---- moving bytes ---- */

/* Wait for r (a send's or a receive's) while bytes move: timeout_ms with nothing
 * happening ends it.  0, or -errno with err said. */
static int wait_for(struct nt_conn *c, ucs_status_ptr_t r, int timeout_ms, const char *what, char *err,
		    size_t errlen)
{
	bool receive = !strcmp(what, "receiving");
	if (UCS_PTR_IS_ERR(r))
		return said(err, errlen, -ECONNRESET, what, UCS_PTR_STATUS(r));
	if (!r) {
		c->answered |= receive;
		return 0;
	}
	int64_t end = now_ms() + timeout_ms;
	ucs_status_t s;
	while ((s = ucp_request_check_status(r)) == UCS_INPROGRESS && c->failed == UCS_OK) {
		int64_t left = end - now_ms();
		if (left <= 0) {
			c->failed = UCS_ERR_TIMED_OUT;
			break;
		}
		if (progress(c->worker, (int)(left > 1000 ? 1000 : left)))
			end = now_ms() + timeout_ms;
	}
	if (s == UCS_INPROGRESS) { /* the peer went, or the time ran out: the request ends with the endpoint */
		force_close(c);
		int64_t end2 = now_ms() + 1000;
		while (ucp_request_check_status(r) == UCS_INPROGRESS && now_ms() < end2)
			progress(c->worker, 10);
		s = c->failed;
	}
	ucp_request_free(r);
	if (s == UCS_OK) {
		c->answered |= receive;
		return 0;
	}
	if (s == UCS_ERR_TIMED_OUT)
		return said(err, errlen, -ETIMEDOUT, what, s);
	return said(err, errlen, -ECONNRESET, what, s);
}

int nt_send_start(struct nt_conn *c, const void *buf, size_t len, void **op, char *err, size_t errlen)
{
	*op = NULL;
	if (!c->ep || c->failed != UCS_OK)
		return said(err, errlen, -ECONNRESET, "sending", c->failed ? c->failed : UCS_ERR_NOT_CONNECTED);
	ucp_request_param_t p = { .op_attr_mask = 0 };
	ucs_status_ptr_t r = ucp_stream_send_nbx(c->ep, buf, len, &p);
	if (UCS_PTR_IS_ERR(r))
		return said(err, errlen, -ECONNRESET, "sending", UCS_PTR_STATUS(r));
	*op = r;
	return 0;
}

int nt_recv_start(struct nt_conn *c, void *buf, size_t len, void **op, char *err, size_t errlen)
{
	*op = NULL;
	if (!len)
		return 0;
	/* A peer that went after sending: what it sent is still there to receive. */
	if (!c->ep)
		return said(err, errlen, -ECONNRESET, "receiving", c->failed ? c->failed : UCS_ERR_NOT_CONNECTED);
	size_t got = 0;
	ucp_request_param_t p = { .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_STREAM_RECV_FLAG_WAITALL };
	ucs_status_ptr_t r = ucp_stream_recv_nbx(c->ep, buf, len, &got, &p);
	if (UCS_PTR_IS_ERR(r))
		return said(err, errlen, -ECONNRESET, "receiving", UCS_PTR_STATUS(r));
	*op = r;
	return 0;
}

bool nt_never_answered(const struct nt_conn *c)
{
	return c && !c->answered;
}

void nt_progress(struct nt_conn *c)
{
	if (c->ep && c->failed == UCS_OK)
		ucp_worker_progress(c->worker);
}

int nt_finish(struct nt_conn *c, void *op, const char *what, int timeout_ms, char *err, size_t errlen)
{
	return wait_for(c, op, timeout_ms, what, err, errlen);
}

int nt_send(struct nt_conn *c, const void *buf, size_t len, int timeout_ms, char *err, size_t errlen)
{
	void *op;
	int e = nt_send_start(c, buf, len, &op, err, errlen);
	return e ? e : wait_for(c, op, timeout_ms, "sending", err, errlen);
}

int nt_recv(struct nt_conn *c, void *buf, size_t len, int timeout_ms, char *err, size_t errlen)
{
	void *op;
	int e = nt_recv_start(c, buf, len, &op, err, errlen);
	return e ? e : wait_for(c, op, timeout_ms, "receiving", err, errlen);
}

int nt_recv_frame(struct nt_conn *c, size_t max, void **body, size_t *len, int timeout_ms, char *err, size_t errlen)
{
	uint8_t head[4];
	int e = nt_recv(c, head, sizeof head, timeout_ms, err, errlen);
	if (e)
		return e;
	size_t n = (size_t)head[0] | (size_t)head[1] << 8 | (size_t)head[2] << 16 | (size_t)head[3] << 24;
	if (!n || n > max) {
		snprintf(err, errlen, "a message of %zu bytes (at most %zu)", n, max);
		return -EPROTO;
	}
	if (!(*body = malloc(n)))
		return -ENOMEM;
	if ((e = nt_recv(c, *body, n, timeout_ms, err, errlen))) {
		free(*body);
		*body = NULL;
		return e;
	}
	*len = n;
	return 0;
}

void nt_await_close(struct nt_conn *c, int timeout_ms)
{
	uint8_t b;
	char err[128];
	if (c && c->ep && c->failed == UCS_OK)
		nt_recv(c, &b, 1, timeout_ms, err, sizeof err); /* ends as the peer goes, or with the time */
}

void nt_close(struct nt_conn *c)
{
	if (!c)
		return;
	if (c->ep) { /* a flush first: what was sent reaches the peer */
		ucp_request_param_t p = { .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = 0 };
		if (c->failed != UCS_OK)
			p.flags = UCP_EP_CLOSE_FLAG_FORCE;
		ucs_status_ptr_t r = ucp_ep_close_nbx(c->ep, &p);
		int64_t end = now_ms() + 2000;
		while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS && now_ms() < end)
			progress(c->worker, 10);
		if (UCS_PTR_IS_PTR(r))
			ucp_request_free(r);
	}
	if (c->worker)
		ucp_worker_destroy(c->worker);
	if (c->ctx)
		ucp_cleanup(c->ctx);
	free(c);
}
