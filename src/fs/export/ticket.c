/* ticket: FUSE cannot return a file descriptor, so an ioctl hands out a one-time
 * ticket bound to the handle, the caller's thread group and uid; the client presents
 * it on the socket (sock.c).  GMSFS_TICKET_LEN bytes from getrandom, compared in
 * constant time, spent on first use, revoked when the handle is released.  fs->mu held
 * throughout. */
#include "export_internal.h"
#include "../store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int export_ticket(struct fs *fs, struct fs_handle *h, enum ticket_kind kind, pid_t tgid, uid_t uid,
		  uint8_t out[GMSFS_TICKET_LEN])
{
	struct export *ex = fs->ex;
	if (!h->x && !(h->x = calloc(1, sizeof *h->x)))
		return -ENOMEM;
	struct export_handle *x = h->x;
	x->h = h;
	if (getrandom(x->bytes, sizeof x->bytes, 0) != (ssize_t)sizeof x->bytes)
		return -EAGAIN;
	if (x->ticket == TICKET_NONE) {
		x->tnext = ex->tickets;
		ex->tickets = x;
	}
	x->ticket = kind;
	x->tgid = tgid;
	x->uid = uid;
	memcpy(out, x->bytes, sizeof x->bytes);
	if (kind == TICKET_CHANNEL)
		sock_expect(fs);
	return 0;
}

void ticket_revoke(struct fs *fs, struct export_handle *x)
{
	if (!x || x->ticket == TICKET_NONE)
		return;
	for (struct export_handle **p = &fs->ex->tickets; *p; p = &(*p)->tnext)
		if (*p == x) {
			*p = x->tnext;
			break;
		}
	x->ticket = TICKET_NONE;
	x->tnext = NULL;
	explicit_bzero(x->bytes, sizeof x->bytes);
}

void export_revoke(struct fs *fs, struct fs_handle *h)
{
	if (!h->x)
		return;
	ticket_revoke(fs, h->x);
	sock_unbind_all(h->x);
}

void export_handle_free(struct fs *fs, struct fs_handle *h)
{
	export_revoke(fs, h);
	free(h->x);
	h->x = NULL;
}

/* Compare without an early exit, so timing tells nothing about a ticket. */
static bool ticket_eq(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;
	for (int i = 0; i < GMSFS_TICKET_LEN; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

struct fs_handle *ticket_redeem(struct fs *fs, const uint8_t t[GMSFS_TICKET_LEN], pid_t pid, uid_t uid,
				enum ticket_kind *kind, int *err, char *why, size_t whylen)
{
	struct export_handle *x = fs->ex->tickets;
	while (x && !ticket_eq(x->bytes, t))
		x = x->tnext;
	if (!x || fs->ex->exiting) {
		snprintf(why, whylen, "unknown ticket (forged, already used, or its file was closed)");
		*err = -EACCES;
		return NULL;
	}
	if (x->tgid != pid || x->uid != uid) {
		snprintf(why, whylen, "ticket belongs to pid %d uid %u, presented by pid %d uid %u", (int)x->tgid,
			 (unsigned)x->uid, (int)pid, (unsigned)uid);
		*err = -EPERM;
		return NULL;
	}
	struct fs_handle *h = x->h;
	if (h->store->removed || h->hold == HOLD_NONE) {
		snprintf(why, whylen, "the store or the lock is gone");
		*err = -ENOENT;
		return NULL;
	}
	*kind = x->ticket;
	ticket_revoke(fs, x);
	return h;
}
