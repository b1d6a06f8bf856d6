/* ticket: FUSE cannot return a file descriptor, so an ioctl hands out a one-time
 * ticket bound to the handle, the caller's thread group and uid; the client presents
 * it on the socket (sock.c).  16 bytes from getrandom, compared in constant time,
 * spent on first use, revoked when the handle is released.  fs->mu held throughout. */
#include "fs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

int ticket_issue(struct fs *fs, struct fs_handle *h, enum ticket_kind kind, pid_t tgid, uid_t uid, uint8_t out[16])
{
	if (getrandom(h->ticket_bytes, sizeof h->ticket_bytes, 0) != (ssize_t)sizeof h->ticket_bytes)
		return -EAGAIN;
	if (h->ticket == TICKET_NONE) {
		h->tnext = fs->tickets;
		fs->tickets = h;
	}
	h->ticket = kind;
	h->ticket_tgid = tgid;
	h->ticket_uid = uid;
	memcpy(out, h->ticket_bytes, sizeof h->ticket_bytes);
	return 0;
}

void ticket_revoke(struct fs *fs, struct fs_handle *h)
{
	if (h->ticket == TICKET_NONE)
		return;
	for (struct fs_handle **p = &fs->tickets; *p; p = &(*p)->tnext)
		if (*p == h) {
			*p = h->tnext;
			break;
		}
	h->ticket = TICKET_NONE;
	h->tnext = NULL;
	explicit_bzero(h->ticket_bytes, sizeof h->ticket_bytes);
}

/* Compare without an early exit, so timing tells nothing about a ticket. */
static bool ticket_eq(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;
	for (int i = 0; i < 16; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

struct fs_handle *ticket_redeem(struct fs *fs, const uint8_t t[16], pid_t pid, uid_t uid, enum ticket_kind *kind,
				int *err, char *why, size_t whylen)
{
	struct fs_handle *h = fs->tickets;
	while (h && !ticket_eq(h->ticket_bytes, t))
		h = h->tnext;
	if (!h || fs->exiting) {
		snprintf(why, whylen, "unknown ticket (forged, already used, or its file was closed)");
		*err = -EACCES;
		return NULL;
	}
	if (h->ticket_tgid != pid || h->ticket_uid != uid) {
		snprintf(why, whylen, "ticket belongs to pid %d uid %u, presented by pid %d uid %u", (int)h->ticket_tgid,
			 (unsigned)h->ticket_uid, (int)pid, (unsigned)uid);
		*err = -EPERM;
		return NULL;
	}
	if (h->store->removed || h->hold == HOLD_NONE) {
		snprintf(why, whylen, "the store or the lock is gone");
		*err = -ENOENT;
		return NULL;
	}
	*kind = h->ticket;
	ticket_revoke(fs, h);
	return h;
}
