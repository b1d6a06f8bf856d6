/* net: one connection between gmsfs-peer's two sides, through UCX's stream API (nt_):
 * TCP, or shared memory and RDMA where UCX finds them (UCX_TLS says which).  Every wait
 * has a deadline: a peer that stops sending or reading costs a connection its timeout,
 * never a hang. */
#ifndef GMSFS_LOADER_NET_H
#define GMSFS_LOADER_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct nt_conn;
struct nt_listener;

/* Listen on addr (an IPv4 or IPv6 address, or "" for any) and port. */
int nt_listen(const char *addr, uint16_t port, struct nt_listener **out, char *err, size_t errlen);
/* The next peer, waiting up to timeout_ms (-1: as long as it takes): -ETIMEDOUT if none.
 * peer: its address, as words.  The connection has a UCX worker of its own: another
 * thread than the listener's may move it (one thread at a time), and close it. */
int nt_accept(struct nt_listener *l, int timeout_ms, struct nt_conn **out, char *peer, size_t peerlen, char *err,
	      size_t errlen);
void nt_listener_close(struct nt_listener *l);
/* Connect to host:port (a name or an address). */
int nt_connect(const char *host, uint16_t port, int timeout_ms, struct nt_conn **out, char *err, size_t errlen);
/* Whether nothing was ever received on c (a connection refused shows only as a send or
 * receive that fails: UCX connects in the background). */
bool nt_never_answered(const struct nt_conn *c);
/* Send or receive exactly len bytes within timeout_ms of inactivity: 0, -ETIMEDOUT, or
 * -ECONNRESET (the peer went). */
int nt_send(struct nt_conn *c, const void *buf, size_t len, int timeout_ms, char *err, size_t errlen);
int nt_recv(struct nt_conn *c, void *buf, size_t len, int timeout_ms, char *err, size_t errlen);
/* The same, started: *op (NULL when done at once) until nt_finish waits for it, each
 * started one finished, in order, also after an error.  Sends and receives keep their
 * order on the connection. */
int nt_send_start(struct nt_conn *c, const void *buf, size_t len, void **op, char *err, size_t errlen);
int nt_recv_start(struct nt_conn *c, void *buf, size_t len, void **op, char *err, size_t errlen);
int nt_finish(struct nt_conn *c, void *op, const char *what, int timeout_ms, char *err, size_t errlen);
/* Move what started along, without waiting: a side that waits for something else (a
 * lane, lane.h) calls it meanwhile, so that the socket never idles. */
void nt_progress(struct nt_conn *c);
/* A frame (net_wire.h): its 4-byte length, at most max, then its body (malloc'ed). */
int nt_recv_frame(struct nt_conn *c, size_t max, void **body, size_t *len, int timeout_ms, char *err, size_t errlen);
/* The last word said: wait (up to timeout_ms) for the peer to close first, so that what
 * was sent is received before the connection ends (a close of ours could overtake it). */
void nt_await_close(struct nt_conn *c, int timeout_ms);
void nt_close(struct nt_conn *c);

#endif
