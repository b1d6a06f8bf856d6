/* The cuda backend: CUDA VMM on one device, opened by vmm_cuda_open.c.  The daemon calls
 * cuInit and nothing that needs a context: cuMemCreate (pinned device memory, POSIX-fd
 * handle type) and cuMemExportToShareableHandle work without one.  Each
 * allocation is exported once; its descriptor is kept and sent to every client
 * (one fd imports in any number of processes).  The daemon never maps. */
#include "vmm.h"

#ifdef GMSFS_HAVE_CUDA
#include "vmm_cuda_open.h"
#include "fdpass.h"
#include "../mover/mover.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int create_with(struct vmm_pool *pool, uint64_t aligned, const CUmemAllocationProp *prop,
		       struct vmm_buf **out)
{
	struct vmm *v = pool->vmm;
	struct cuda_priv *p = v->priv;
	struct cu_api *cu = &p->cu;
	int e = cuda_driver_ready(p);
	if (e) {
		fprintf(stderr, "gmsfs: %s: no allocation: the device did not open behind the start (said above)\n",
			v->dev.uuid);
		return e;
	}
	struct cuda_buf *cb = calloc(1, sizeof *cb);
	if (!cb)
		return -ENOMEM;
	CUresult r = cu->cuMemCreate(&cb->h, aligned, prop, 0);
	if (r != CUDA_SUCCESS) {
		free(cb);
		fprintf(stderr, "gmsfs: cuMemCreate of %llu bytes: %s\n", (unsigned long long)aligned, cu_name(cu, r));
		return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOSPC : -EIO;
	}
	int fd = -1;
	errno = 0;
	r = cu->cuMemExportToShareableHandle(&fd, cb->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS) {
		/* Out of descriptors (one is kept per allocation): the driver's dup saw EMFILE. */
		int e = errno == EMFILE || errno == ENFILE ? -errno : r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOSPC : -EIO;
		cu->cuMemRelease(cb->h);
		free(cb);
		fprintf(stderr, "gmsfs: cuMemExportToShareableHandle: %s\n", cu_name(cu, r));
		return e;
	}
	cb->b.fd = fd;
	*out = &cb->b;
	if (prop == &p->prop)
		atomic_store_explicit(&p->released, false, memory_order_relaxed);
	return 0;
}

static int cuda_create(struct vmm_pool *pool, uint64_t aligned, struct vmm_buf **out)
{
	return create_with(pool, aligned, &((struct cuda_priv *)pool->vmm->priv)->prop, out);
}

static int cuda_create_host(struct vmm_pool *pool, uint64_t aligned, struct vmm_buf **out)
{
	struct cuda_priv *p = pool->vmm->priv;
	int e = create_with(pool, aligned, &p->host_prop, out);
	if (!e)
		((struct cuda_buf *)*out)->key = atomic_fetch_add(&p->next_key, 1) + 1;
	return e;
}

static void cuda_swap(struct vmm_buf *a, struct vmm_buf *b)
{
	struct cuda_buf *x = (struct cuda_buf *)a, *y = (struct cuda_buf *)b;
	CUmemGenericAllocationHandle h = x->h;
	int fd = a->fd;
	uint64_t key = x->key;
	x->h = y->h, a->fd = b->fd, x->key = y->key;
	y->h = h, b->fd = fd, y->key = key;
}

/* ---- the copy helper (src/mover): the daemon has no context to copy with ---- */

/* The helper gone (killed if it still ran: it is out of step), or, leave, let go: its
 * socket closed, it lingers a while and ends alone (mover.c), with nobody waiting. */
static void mover_stop_or_leave(struct cuda_priv *p, bool leave)
{
	if (p->mover_sock < 0)
		return;
	close(p->mover_sock);
	if (!leave) {
		kill(p->mover_pid, SIGKILL);
		waitpid(p->mover_pid, NULL, 0);
	}
	p->mover_sock = -1;
	pthread_mutex_lock(&p->forget_mu);
	p->nforget = 0; /* what it kept mapped went with it */
	p->unstay = false;
	pthread_mutex_unlock(&p->forget_mu);
}

static void mover_stop(struct cuda_priv *p)
{
	mover_stop_or_leave(p, false);
}

static int mover_start(struct vmm *v, struct cuda_priv *p, char *err, size_t errlen)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv))
		return snprintf(err, errlen, "socketpair: %s", strerror(errno)), -errno;
	pid_t pid = fork();
	if (pid == 0) {
		/* Only descriptor 3 passes: the helper sees none of the daemon's memory. */
		if (dup2(sv[1], MOVER_FD) == MOVER_FD) {
			signal(SIGPIPE, SIG_DFL);
			sigset_t none; /* the daemon's threads block its stop signals: not the helper */
			sigemptyset(&none);
			sigprocmask(SIG_SETMASK, &none, NULL);
			if (((struct cuda_priv *)v->priv)->mover_stays)
				execl(v->helper, "gmsfs-mover", v->dev.uuid, "stay", (char *)NULL);
			else
				execl(v->helper, "gmsfs-mover", v->dev.uuid, (char *)NULL);
		}
		_exit(127);
	}
	close(sv[1]);
	if (pid < 0) {
		close(sv[0]);
		return snprintf(err, errlen, "fork: %s", strerror(errno)), -errno;
	}
	p->mover_sock = sv[0];
	p->mover_pid = pid;
	return 0;
}

/* mover_mu held: the keys of host memory freed since, told to the helper, which unmaps
 * what it kept of them (until then that memory stays pinned for its mapping); and, once
 * no host memory is left, that it may end when idle (MOVER_UNSTAY). */
static int send_forgets(struct cuda_priv *p)
{
	int e = 0;
	pthread_mutex_lock(&p->forget_mu);
	for (size_t i = 0; i < p->nforget && !e && p->mover_sock >= 0; i++) {
		struct mover_copy c = { .magic = MOVER_MAGIC, .flags = MOVER_FORGET, .src_key = p->forget[i] };
		e = send(p->mover_sock, &c, sizeof c, MSG_NOSIGNAL) == sizeof c ? 0 : -EPIPE;
	}
	p->nforget = 0;
	if (p->unstay && !e && p->mover_sock >= 0) {
		struct mover_copy c = { .magic = MOVER_MAGIC, .flags = MOVER_UNSTAY };
		e = send(p->mover_sock, &c, sizeof c, MSG_NOSIGNAL) == sizeof c ? 0 : -EPIPE;
		p->mover_stays = false;
	}
	p->unstay = false;
	pthread_mutex_unlock(&p->forget_mu);
	return e;
}

/* mover_mu let go, what was said meanwhile told first (a helper left idle would not hear
 * of it until the next move). */
static void mover_unlock(struct cuda_priv *p)
{
	if (send_forgets(p))
		mover_stop(p);
	pthread_mutex_unlock(&p->mover_mu);
}

static uint64_t key_of(const struct vmm_buf *b)
{
	return ((const struct cuda_buf *)b)->key;
}

/* A batch sent to the helper: 0, or -errno when it was gone. */
static int mover_send(struct cuda_priv *p, struct vmm_buf *const *src, struct vmm_buf *const *dst, size_t n)
{
	int e = send_forgets(p);
	if (e)
		return e;
	for (size_t i = 0; i < n; i++) {
		/* A host source stays (on standby for the next move out, or the store's own if the
		 * move fails): the mover may unmap it after answering. */
		struct mover_copy c = { MOVER_MAGIC, i + 1 == n, src[i]->size, src[i]->host ? MOVER_SOURCE_STAYS : 0, 0,
					key_of(src[i]), key_of(dst[i]) };
		int fds[2] = { src[i]->fd, dst[i]->fd };
		int e = fdpass_send(p->mover_sock, &c, sizeof c, fds, 2);
		if (e)
			return e;
	}
	return 0;
}

/* One batch through the helper: -EPIPE when it was gone (it ends when idle), and
 * cuda_copy starts it again and sends the batch again (a copy can be done twice). */
static int mover_batch(struct cuda_priv *p, struct vmm_buf *const *src, struct vmm_buf *const *dst, size_t n,
		       struct mover_reply *rep)
{
	int e = mover_send(p, src, dst, n);
	if (e)
		return e;
	ssize_t k = recv(p->mover_sock, rep, sizeof *rep, 0);
	return k == sizeof *rep ? 0 : -EPIPE;
}

/* The answer's error, with why. */
static int reply_error(struct mover_reply *rep, char *err, size_t errlen)
{
	if (!rep->error)
		return 0;
	rep->why[sizeof rep->why - 1] = '\0';
	snprintf(err, errlen, "gmsfs-mover: %s", rep->why);
	return -rep->error;
}

static int cuda_copy(struct vmm *v, struct vmm_buf *const *src, struct vmm_buf *const *dst, size_t n, char *err,
		     size_t errlen)
{
	struct cuda_priv *p = v->priv;
	struct mover_reply rep = {0};
	int e = 0;
	pthread_mutex_lock(&p->mover_mu);
	for (int attempt = 0; attempt < 2; attempt++) {
		if (p->mover_sock < 0 && (e = mover_start(v, p, err, errlen)))
			break;
		if (!(e = mover_batch(p, src, dst, n, &rep)))
			break;
		mover_stop(p); /* it ended (idle, or it failed to start): once more, afresh */
		snprintf(err, errlen, "the copy helper %s ended without an answer (see the daemon's log)", v->helper);
	}
	mover_unlock(p);
	return e ? e : reply_error(&rep, err, errlen);
}

/* A switch's batches, two in flight (vmm.h): the helper is the switch's from the first
 * send until every batch sent is answered.  A failure is said; the switch then drains
 * what is in flight and copies again through cuda_copy, which starts a new helper. */
static int cuda_copy_send(struct vmm *v, struct vmm_buf *const *src, struct vmm_buf *const *dst, size_t n, char *err,
			  size_t errlen)
{
	struct cuda_priv *p = v->priv;
	int e = 0;
	if (!p->in_flight++) {
		pthread_mutex_lock(&p->mover_mu);
		if (p->mover_sock < 0)
			e = mover_start(v, p, err, errlen);
	}
	if (!e && (e = mover_send(p, src, dst, n)))
		snprintf(err, errlen, "the copy helper %s ended without an answer (see the daemon's log)", v->helper);
	return e;
}

static int cuda_copy_recv(struct vmm *v, char *err, size_t errlen)
{
	struct cuda_priv *p = v->priv;
	struct mover_reply rep = {0};
	int e = p->mover_sock >= 0 && recv(p->mover_sock, &rep, sizeof rep, 0) == sizeof rep ? 0 : -EPIPE;
	if (e) {
		mover_stop(p); /* gone, or out of step: the next copy starts a new one */
		snprintf(err, errlen, "the copy helper %s ended without an answer (see the daemon's log)", v->helper);
	}
	if (!--p->in_flight)
		mover_unlock(p);
	return e ? e : reply_error(&rep, err, errlen);
}

/* host_ahead: the helper started now and kept running (its context costs device memory,
 * and nvidia-smi lists it), so that a first move copies at once. */
static void cuda_copies_ready(struct vmm *v)
{
	struct cuda_priv *p = v->priv;
	char err[256];
	pthread_mutex_lock(&p->mover_mu);
	pthread_mutex_lock(&p->forget_mu);
	p->unstay = false; /* host memory again: a MOVER_UNSTAY not sent yet is moot */
	pthread_mutex_unlock(&p->forget_mu);
	/* One started before runs without "stay": told to stay (what it keeps mapped, too). */
	struct mover_copy c = { .magic = MOVER_MAGIC, .flags = MOVER_STAY };
	if (!p->mover_stays && p->mover_sock >= 0 && send(p->mover_sock, &c, sizeof c, MSG_NOSIGNAL) != sizeof c)
		mover_stop(p);
	p->mover_stays = true;
	if (p->mover_sock < 0 && mover_start(v, p, err, sizeof err))
		fprintf(stderr, "gmsfs: %s\n", err);
	pthread_mutex_unlock(&p->mover_mu);
}

/* Each buffer copied onto itself by the helper (its two mappings of one allocation): the
 * bytes stay what they are, and the memory's first use is over before a move needs it. */
static int cuda_touch(struct vmm *v, struct vmm_buf *const *bufs, size_t n, char *err, size_t errlen)
{
	return cuda_copy(v, bufs, bufs, n, err, errlen);
}

/* Host memory freed: the helper may keep it mapped, so it is told (now, if nobody is
 * using the helper, else before its next batch). */
static void forget_key(struct cuda_priv *p, uint64_t key)
{
	pthread_mutex_lock(&p->forget_mu);
	if (p->nforget == p->forget_cap) {
		size_t cap = p->forget_cap ? 2 * p->forget_cap : 64;
		uint64_t *v = realloc(p->forget, cap * sizeof *v);
		if (v)
			p->forget = v, p->forget_cap = cap;
	}
	if (p->nforget < p->forget_cap)
		p->forget[p->nforget++] = key;
	pthread_mutex_unlock(&p->forget_mu);
	if (!pthread_mutex_trylock(&p->mover_mu))
		mover_unlock(p);
}

/* No host memory is left: nothing needs a helper that stays (its context holds device
 * memory), so it is told to end when idle (now, or when whoever uses it lets go). */
static void cuda_copies_unneeded(struct vmm *v)
{
	struct cuda_priv *p = v->priv;
	pthread_mutex_lock(&p->forget_mu);
	p->unstay = true;
	pthread_mutex_unlock(&p->forget_mu);
	if (!pthread_mutex_trylock(&p->mover_mu))
		mover_unlock(p);
}

static void cuda_release(struct vmm_buf *b)
{
	struct cuda_buf *cb = (struct cuda_buf *)b;
	struct cuda_priv *p = b->vmm->priv;
	if (cb->key && p->mover_sock >= 0)
		forget_key(p, cb->key);
	/* Memory a client still maps lives on (its imported handle); the rest is freed. */
	vmm_close_fd(b->vmm, b->fd);
	if (cb->h) {
		p->cu.cuMemRelease(cb->h);
		if (!cb->key)
			atomic_store_explicit(&p->released, true, memory_order_relaxed);
	}
	free(cb);
}

/* After device memory was released, and nothing made since: one page made and freed, so
 * that the next create does not pay for what the driver does behind a release (vmm.h,
 * settle).  Not where that page would pass max_bytes (the limit holds for a microsecond
 * too); a failure (the device full to the page) changes nothing. */
static void cuda_settle(struct vmm *v)
{
	struct cuda_priv *p = v->priv;
	CUmemGenericAllocationHandle h;
	uint64_t held = atomic_load(&v->used_bytes) + atomic_load(&v->pages_spare);
	if (atomic_exchange(&p->released, false) && held < v->max_bytes &&
	    v->max_bytes - held >= v->dev.granularity &&
	    p->cu.cuMemCreate(&h, v->dev.granularity, &p->prop, 0) == CUDA_SUCCESS)
		p->cu.cuMemRelease(h);
}

/* Memory another daemon made: the exported descriptor alone keeps it (as an open fd
 * keeps memory whose handle was released), and it is what clients import and the mover
 * maps; so nothing is imported here, and no context is needed. */
static int cuda_adopt(struct vmm_pool *pool, int fd, uint64_t offset, uint64_t aligned, bool host,
		      struct vmm_buf **out)
{
	if (offset)
		return -EINVAL; /* one allocation per descriptor */
	struct cuda_buf *cb = calloc(1, sizeof *cb);
	if (!cb)
		return -ENOMEM;
	if ((cb->b.fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
		int e = -errno;
		free(cb);
		return e;
	}
	if (host)
		cb->key = atomic_fetch_add(&((struct cuda_priv *)pool->vmm->priv)->next_key, 1) + 1;
	*out = &cb->b;
	return 0;
}

/* The same kept descriptor for everyone; readers get read-only mappings (the client
 * sets the access), since a CUDA fd carries no access mode. */
static int cuda_export(struct vmm_buf *b, bool read_only)
{
	return b->fd;
}

/* No context, no copies: the bytes are reached by mapping them (libgmsfs). */
static ssize_t cuda_no_io(struct vmm_buf *b, void *buf, size_t len, uint64_t off)
{
	return -EOPNOTSUPP;
}

static ssize_t cuda_no_write(struct vmm_buf *b, const void *buf, size_t len, uint64_t off)
{
	return -EOPNOTSUPP;
}

/* The daemon ends: the helper is let go before the buffers are (it is told nothing of
 * them: its mappings go when it ends, after the engines of the next daemon have mapped). */
static void cuda_leave(struct vmm *v)
{
	struct cuda_priv *p = v->priv;
	pthread_mutex_lock(&p->mover_mu);
	mover_stop_or_leave(p, true);
	pthread_mutex_unlock(&p->mover_mu);
}

static void cuda_close(struct vmm *v)
{
	struct cuda_priv *p = v->priv;
	if (p) {
		mover_stop_or_leave(p, true);
		cuda_priv_free(p);
	}
}

const struct vmm_ops vmm_cuda_ops = {
	.name = "cuda",
	.open = cuda_open,
	.open_known = cuda_open_known,
	.create = cuda_create,
	.release = cuda_release,
	.export_fd = cuda_export,
	.pread = cuda_no_io,
	.pwrite = cuda_no_write,
	.create_host = cuda_create_host,
	.copies_ready = cuda_copies_ready,
	.copies_unneeded = cuda_copies_unneeded,
	.settle = cuda_settle,
	.leave = cuda_leave,
	.touch = cuda_touch,
	.copy = cuda_copy,
	.copy_send = cuda_copy_send,
	.copy_recv = cuda_copy_recv,
	.swap = cuda_swap,
	.adopt = cuda_adopt,
	.close = cuda_close,
};
#endif
