/* image: a committed store as records and descriptors, and back (image.h). */
#include "image.h"
#include "content.h"
#include "named.h"
#include "lock.h"
#include "store.h"
#include "tier.h"
#include "grow.h"
#include "why.h"
#include "wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- packing ---- */

struct walk {
	msgpack_sbuffer dirs, allocs, entries;
	uint64_t ndirs, nallocs, nentries;
	struct image_fds *fds;
	size_t base;                /* this image's first descriptor in fds */
	uint32_t *slot;             /* by descriptor number: its index + 1 in this image, 0: none yet */
	size_t nslot;
	bool host;                  /* the head's tier: host when any allocation is there */
	bool standby;               /* the host memory made ahead too (image_pack_opts) */
};

static int fd_index(struct walk *w, int fd, uint32_t *out)
{
	if ((size_t)fd >= w->nslot) {
		size_t n = (size_t)fd + 1 > 2 * w->nslot ? (size_t)fd + 1 : 2 * w->nslot;
		uint32_t *s = realloc(w->slot, n * sizeof *s);
		if (!s)
			return -ENOMEM;
		memset(s + w->nslot, 0, (n - w->nslot) * sizeof *s);
		w->slot = s, w->nslot = n;
	}
	if (!w->slot[fd]) {
		if (GROW(w->fds->v, w->fds->n, w->fds->cap, 16))
			return -ENOMEM;
		w->fds->v[w->fds->n++] = fd;
		w->slot[fd] = (uint32_t)(w->fds->n - w->base);
	}
	*out = w->slot[fd] - 1;
	return 0;
}

/* One committed allocation: its memory as it is now, piece by piece (a store mid-switch
 * has some on each tier: those not where the head says, say). */
static int walk_alloc(struct walk *w, struct meta_node *k, const char *path, const struct meta_fields *f)
{
	if (!k->buf)
		return -EIO; /* committed allocations are sized */
	size_t n = vmm_npieces(k->buf);
	struct wire_piece p[GMSFS_PIECES_MAX], sp[GMSFS_PIECES_MAX];
	uint32_t nstandby = 0;
	for (size_t i = 0; i < n; i++) {
		const struct vmm_buf *b = vmm_piece(k->buf, i);
		uint32_t fd;
		int e = fd_index(w, b->fd, &fd);
		if (e || (e = GROW(w->fds->refs, w->fds->nrefs, w->fds->refs_cap, 64)))
			return e;
		w->fds->refs[w->fds->nrefs++] = (struct image_ref){ b->fd, b->offset };
		p[i] = (struct wire_piece){ fd, b->offset, b->host == w->host ? WIRE_TIER_STORE
							 : b->host ? WIRE_TIER_HOST : WIRE_TIER_DEVICE };
		sp[i] = (struct wire_piece){ .fd = WIRE_NO_FD, .tier = WIRE_TIER_HOST };
		if (w->standby && b->standby && !b->host) { /* the host memory made ahead for it */
			if ((e = fd_index(w, b->standby->fd, &sp[i].fd)) ||
			    (e = GROW(w->fds->refs, w->fds->nrefs, w->fds->refs_cap, 64)))
				return e;
			w->fds->refs[w->fds->nrefs++] = (struct image_ref){ b->standby->fd, b->standby->offset };
			sp[i].fd_offset = b->standby->offset;
			nstandby = (uint32_t)n;
		}
	}
	struct wire_alloc a = { .path = (char *)path, .tag = (char *)(f->str ? f->str : "default"), .size = f->size,
				.aligned = f->aligned, .fd = p[0].fd, .fd_offset = p[0].fd_offset,
				.tier = n == 1 ? p[0].tier : WIRE_TIER_STORE, .piece = n > 1 ? vmm_piece(k->buf, 0)->size : 0,
				.pieces = n > 1 ? p : NULL, .npieces = n > 1 ? (uint32_t)n : 0,
				.standby = nstandby ? sp : NULL, .nstandby = nstandby };
	w->nallocs++;
	return wire_pack_image_alloc(&w->allocs, &a);
}

/* The committed nodes below dir, pre-order: directories, allocations, entries. */
static int walk_committed(struct walk *w, struct meta_node *dir, int area)
{
	struct meta_node **kids;
	size_t n;
	int e = meta_committed_children(dir, &kids, &n);
	for (size_t i = 0; i < n && !e; i++) {
		struct meta_node *k = kids[i];
		char path[GMSFS_PATH_MAX + 1];
		struct meta_fields f;
		if ((e = meta_path(k, path, sizeof path)))
			break;
		meta_committed_fields(k, &f);
		if (k->kind == META_DIR) {
			w->ndirs++;
			if (!(e = wire_pack_image_dir(&w->dirs, area, path)))
				e = walk_committed(w, k, area);
		} else if (k->kind == META_ALLOC) {
			e = walk_alloc(w, k, path, &f);
		} else {
			struct entry_rec x = { .key = path, .alloc = (char *)(f.str ? f.str : ""), .offset = f.offset,
					       .size = f.extent, .flags = f.flags, .value = (void *)f.value,
					       .value_len = f.value_len };
			w->nentries++;
			e = wire_pack_image_entry(&w->entries, &x);
		}
	}
	free(kids);
	return e;
}

/* Whether any committed allocation below dir is on the host tier. */
static bool any_host(struct meta_node *dir)
{
	struct meta_node **kids;
	size_t n;
	bool host = false;
	if (meta_committed_children(dir, &kids, &n))
		return false;
	for (size_t i = 0; i < n && !host; i++) {
		struct vmm_buf *b = kids[i]->kind == META_ALLOC ? kids[i]->buf : NULL;
		host = kids[i]->kind == META_DIR && any_host(kids[i]);
		for (size_t j = 0; b && j < vmm_npieces(b) && !host; j++)
			host = vmm_piece(b, j)->host;
	}
	free(kids);
	return host;
}

/* b's memory, piece by piece, a reference each. */
static int push_pieces(struct vmm_buf *b, struct vmm_bufs *out)
{
	int e = 0;
	for (size_t i = 0; i < vmm_npieces(b) && !e; i++)
		if (!(e = vmm_bufs_push(out, vmm_piece(b, i))))
			vmm_buf_get(vmm_piece(b, i));
	return e;
}

static int committed_bufs(struct meta_node *dir, struct vmm_bufs *out)
{
	struct meta_node **kids;
	size_t n;
	int e = meta_committed_children(dir, &kids, &n);
	for (size_t i = 0; i < n && !e; i++) {
		if (kids[i]->kind == META_DIR)
			e = committed_bufs(kids[i], out);
		else if (kids[i]->kind == META_ALLOC && kids[i]->buf)
			e = push_pieces(kids[i]->buf, out);
	}
	free(kids);
	return e;
}

int image_committed_bufs(struct store *st, struct vmm_bufs *out)
{
	if (!st->meta || !store_lock(st)->fsm.committed)
		return 0;
	int e = committed_bufs(meta_root(st->meta, META_AREA_ALLOCS), out);
	if (e)
		vmm_bufs_release(out);
	return e;
}

static int append(msgpack_sbuffer *sb, const msgpack_sbuffer *part)
{
	return part->size && msgpack_sbuffer_write(sb, part->data, part->size) ? -ENOMEM : 0;
}

int image_pack(struct store *st, msgpack_sbuffer *sb, struct image_fds *fds, const struct image_pack_opts *o)
{
	if (!st->meta)
		return -ENOENT;
	/* Each allocation's memory as it is now (fs->mu held): a store that moves is named
	 * where it was until it has moved, and a switch's, piece by piece. */
	bool committed = store_lock(st)->fsm.committed;
	struct walk w = { .fds = fds, .base = fds->n, .host = committed && any_host(meta_root(st->meta, META_AREA_ALLOCS)),
			  .standby = o->standby };
	msgpack_sbuffer_init(&w.dirs);
	msgpack_sbuffer_init(&w.allocs);
	msgpack_sbuffer_init(&w.entries);
	/* A store with nothing committed is its name, quota and priority (generation 0). */
	int e = committed ? walk_committed(&w, meta_root(st->meta, META_AREA_ALLOCS), 0) : 0;
	if (!e && committed)
		e = walk_committed(&w, meta_root(st->meta, META_AREA_META), 1);
	struct vmm *v = st->fs->vmm;
	struct wire_image h = { .store = st->name, .device = v->dev.uuid, .backend = (char *)v->dev.backend,
				.generation = committed ? store_lock(st)->fsm.generation : 0, .commits = store_lock(st)->commits,
				.quota = atomic_load(&st->pool->quota), .priority = st->tier.priority,
				.min = atomic_load(&st->pool->min), .host = w.host, .versions = st->versions.allowed,
				/* A session writing in place: torn if it never commits (lock_in_place). */
				.torn = committed && (store_lock(st)->fsm.torn || store_lock(st)->fsm.in_place),
				.ndirs = w.ndirs, .nallocs = w.nallocs, .nentries = w.nentries, .nfds = fds->n - w.base };
	meta_hash(st->meta, h.hash);
	const char *unknown;
	const uint8_t *content = committed ? content_known(st, &unknown) : NULL;
	if (content)
		h.has_content = true, memcpy(h.content, content, sizeof h.content);
	h.named = named_history(st);
	struct lock_reader *readers = NULL;
	size_t nreaders = 0;
	if (!e && o->readers && !(e = lock_readers(st, &readers, &nreaders)) && nreaders &&
	    !(h.readers = calloc(nreaders, sizeof *h.readers)))
		e = -ENOMEM;
	for (size_t i = 0; !e && i < nreaders; i++)
		h.readers[h.nreaders++] = (struct wire_reader){ .pid = (uint32_t)readers[i].pid, .start = readers[i].start,
								.count = readers[i].handles + readers[i].inherited,
								.writer = readers[i].writer };
	free(readers);
	const char **names = NULL;
	const char *(*fdname)(void *arg, int fd) = o->fdname;
	void *arg = o->arg;
	if (!e && fdname) {
		if (!(names = calloc(h.nfds ? h.nfds : 1, sizeof *names)))
			e = -ENOMEM;
		/* Copies: a later fdname may move the table the earlier names live in (a store of
		 * a thousand CUDA allocations wrote an empty name, and no restart could read it). */
		for (uint64_t i = 0; !e && i < h.nfds; i++) {
			const char *name = fdname(arg, fds->v[w.base + i]);
			if (!name)
				e = -ENOSPC; /* the service manager's store is full */
			else if (!(names[i] = strdup(name)))
				e = -ENOMEM;
		}
		h.fdnames = (char **)names;
	}
	if (!e)
		e = wire_pack_image(sb, &h);
	if (!e && !(e = append(sb, &w.dirs)) && !(e = append(sb, &w.allocs)))
		e = append(sb, &w.entries);
	for (uint64_t i = 0; names && i < h.nfds; i++)
		free((char *)names[i]);
	free(names);
	free(h.readers);
	free(h.named);
	free(w.slot);
	msgpack_sbuffer_destroy(&w.dirs);
	msgpack_sbuffer_destroy(&w.allocs);
	msgpack_sbuffer_destroy(&w.entries);
	if (e)
		fds->n = w.base;
	return e;
}

void image_fds_free(struct image_fds *f)
{
	free(f->v);
	free(f->refs);
	memset(f, 0, sizeof *f);
}

/* ---- restoring ---- */

int image_head(const uint8_t *buf, size_t len, size_t off, struct wire_image *h, char *why, size_t whylen)
{
	const void *rec;
	size_t n;
	if (wire_image_next(buf, len, &off, &rec, &n)) {
		snprintf(why, whylen, "no image here: the data ends");
		return -EINVAL;
	}
	return wire_parse_image(rec, n, h, why, whylen);
}

/* A directory of area at path, and its parents. */
static int make_dirs(struct meta_store *ms, int area, const char *path)
{
	struct meta_node *dir = meta_root(ms, area ? META_AREA_META : META_AREA_ALLOCS);
	char name[GMSFS_PATH_MAX + 1];
	for (const char *p = path; *p;) {
		size_t n = strcspn(p, "/");
		memcpy(name, p, n);
		name[n] = '\0';
		struct meta_node *k = meta_lookup(dir, name);
		int e = 0;
		if (!k)
			e = meta_create(dir, name, META_DIR, &k);
		else if (k->kind != META_DIR)
			e = -ENOTDIR;
		if (e)
			return e;
		dir = k;
		p += n + (p[n] == '/');
	}
	return 0;
}

struct restore {
	struct wire_image h;
	struct meta_new_alloc *v;
	struct wire_alloc *a;
	struct entry_rec *x;
	size_t na, nx;
};

static void restore_free(struct restore *r)
{
	for (size_t i = 0; i < r->na; i++) {
		if (r->v[i].buf && !r->v[i].node)
			vmm_buf_put(r->v[i].buf);
		wire_alloc_free(&r->a[i]);
	}
	entry_recs_clear(r->x, r->nx);
	free(r->v);
	free(r->a);
	free(r->x);
	wire_image_free(&r->h);
}

/* The host memory the daemon before made ahead for piece i of a (if any) as its standby
 * here: only slower without it (made again), so a failure is said, not returned. */
static void adopt_standby(struct store *st, const struct wire_alloc *a, size_t i, const int *fds, struct vmm_buf *b,
			  image_adopted_fn *adopted, void *arg)
{
	const struct wire_piece *k = &a->standby[i];
	if (k->fd == WIRE_NO_FD || b->host)
		return;
	int e = vmm_adopt_standby(b, fds[k->fd], k->fd_offset);
	if (e) {
		fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: allocs/%s: the host memory the daemon before had on standby is "
					   "not kept: %s\n", st->name, a->path, strerror(-e));
		return;
	}
	st->tier.standby = true;
	st->tier.standby_untouched = true; /* this daemon's copier has not used it yet (tier.c) */
	if (adopted)
		adopted(arg, st, k->fd, b->standby->fd);
}

/* An image's allocation as a buffer of this daemon's: its memory at fds, piece by piece. */
static int adopt_alloc(struct store *st, const struct wire_image *h, const struct wire_alloc *a, const int *fds,
		       image_adopted_fn *adopted, void *arg, struct vmm_buf **out, char *why, size_t whylen)
{
	struct wire_piece one = { a->fd, a->fd_offset, a->tier };
	size_t n = a->npieces ? a->npieces : 1, made = 0;
	const struct wire_piece *p = a->npieces ? a->pieces : &one;
	struct vmm_buf *v[GMSFS_PIECES_MAX];
	int e = 0;
	for (; made < n && !e; made += !e) {
		const struct wire_piece *k = &p[made];
		bool host = k->tier == WIRE_TIER_STORE ? h->host : k->tier == WIRE_TIER_HOST;
		uint64_t size = n == 1 ? a->aligned : made + 1 < n ? a->piece : a->aligned - a->piece * (n - 1);
		if ((e = vmm_adopt(st->pool, fds[k->fd], k->fd_offset, size, host, &v[made])))
			why_fmt(why, whylen, e, "allocs/%s: its memory (descriptor %u, %llu bytes at %llu): %s", a->path,
				k->fd, (unsigned long long)size, (unsigned long long)k->fd_offset, strerror(-e));
		else if (adopted)
			adopted(arg, st, k->fd, v[made]->fd);
	}
	for (size_t i = 0; !e && a->nstandby && i < n; i++)
		adopt_standby(st, a, i, fds, v[i], adopted, arg);
	if (!e && n > 1 && (e = vmm_compound(v, n, out)))
		why_fmt(why, whylen, e, "allocs/%s: its %zu pieces do not make one allocation", a->path, n);
	else if (!e && n == 1)
		*out = v[0];
	for (size_t i = 0; e && i < made; i++)
		vmm_buf_put(v[i]);
	return e;
}

/* The records after the head into st; why says which one failed. */
static int restore_records(struct fs *fs, struct store *st, struct restore *r, const uint8_t *buf, size_t len,
			   size_t *off, const int *fds, image_adopted_fn *adopted, void *arg, char *why, size_t whylen)
{
	const void *rec;
	size_t n;
	int e = 0;
	for (uint64_t i = 0; i < r->h.ndirs; i++) {
		int area;
		char *path = NULL;
		if (wire_image_next(buf, len, off, &rec, &n) || wire_parse_image_dir(rec, n, &area, &path))
			return why_fmt(why, whylen, -EINVAL, "directory %llu of %llu: a bad record", (unsigned long long)i,
				       (unsigned long long)r->h.ndirs);
		e = make_dirs(st->meta, area, path);
		free(path);
		if (e)
			return why_fmt(why, whylen, e, "directory %llu: %s", (unsigned long long)i, strerror(-e));
	}
	/* Counts come from the file: the arrays grow as records are read, never ahead of them. */
	size_t cap = 0;
	for (uint64_t i = 0; i < r->h.nallocs; i++) {
		if (GROW(r->a, r->na, cap, 64) || !(r->v = realloc(r->v, cap * sizeof *r->v)))
			return -ENOMEM;
		struct wire_alloc *a = &r->a[r->na];
		r->v[r->na] = (struct meta_new_alloc){0};
		if (wire_image_next(buf, len, off, &rec, &n) || wire_parse_image_alloc(rec, n, a, r->h.nfds))
			return why_fmt(why, whylen, -EINVAL, "allocation %llu of %llu: a bad record", (unsigned long long)i,
				       (unsigned long long)r->h.nallocs);
		r->na++;
		struct vmm_buf *b;
		if ((e = adopt_alloc(st, &r->h, a, fds, adopted, arg, &b, why, whylen)))
			return e;
		r->v[r->na - 1] = (struct meta_new_alloc){ .path = a->path, .tag = a->tag, .size = a->size,
							   .aligned = a->aligned, .buf = b };
	}
	if ((e = meta_create_allocs(st->meta, r->v, r->na, why, whylen)))
		return e;
	cap = 0;
	for (uint64_t i = 0; i < r->h.nentries; i++) {
		if (GROW(r->x, r->nx, cap, 64))
			return -ENOMEM;
		if (wire_image_next(buf, len, off, &rec, &n) || wire_parse_image_entry(rec, n, &r->x[r->nx]))
			return why_fmt(why, whylen, -EINVAL, "entry %llu of %llu: a bad record", (unsigned long long)i,
				       (unsigned long long)r->h.nentries);
		r->nx++;
	}
	if ((e = meta_put_entries(st->meta, r->x, r->nx, why, whylen)))
		return e;
	char err[400];
	if ((e = meta_commit(st->meta, err, sizeof err)))
		return why_fmt(why, whylen, e, "its commit: %s", err);
	uint8_t hash[GMSFS_HASH_LEN];
	if (!meta_hash(st->meta, hash) || memcmp(hash, r->h.hash, sizeof hash))
		return why_fmt(why, whylen, -EBADMSG, "its layout hash is %s, the image says another: refused",
			       meta_hash_hex(st->meta));
	(void)fs;
	return 0;
}

/* A minimum as it was, where the mount still has room for it (a restart with a smaller
 * max_bytes may not): else the store comes back without one, and says so. */
static void restore_min(struct store *st, uint64_t min)
{
	uint64_t quota = atomic_load(&st->pool->quota);
	if (!min || ((!quota || min <= quota) && !vmm_pool_set_min(st->pool, min)))
		return;
	if (quota && min > quota)
		store_error(st, "user.gms.min: %llu is not held after the restart: it is above the quota, %llu",
			    (unsigned long long)min, (unsigned long long)quota);
	else
		store_error(st, "user.gms.min: %llu is not held after the restart: with the other stores' minimums it "
				"would pass the mount's %llu bytes",
			    (unsigned long long)min, (unsigned long long)st->fs->vmm->max_bytes);
	fuse_log(FUSE_LOG_WARNING, "gmsfs: %s: %s\n", st->name, st->last_error);
}

int image_restore(struct fs *fs, const uint8_t *buf, size_t len, size_t *off, const int *fds, size_t nfds,
		  image_adopted_fn *adopted, void *arg, struct store **out, char *why, size_t whylen)
{
	struct restore r = {0};
	const void *rec;
	size_t n;
	if (wire_image_next(buf, len, off, &rec, &n))
		return why_fmt(why, whylen, -EINVAL, "no image here: the data ends");
	int e = wire_parse_image(rec, n, &r.h, why, whylen);
	if (e)
		return e;
	struct vmm *v = fs->vmm;
	char name[300];
	snprintf(name, sizeof name, "%s", r.h.store);
	if (strcmp(r.h.device, v->dev.uuid) || strcmp(r.h.backend, v->dev.backend))
		e = why_fmt(why, whylen, -EXDEV, "store %s: made on %s (%s), this daemon serves %s (%s)", name,
			    r.h.device, r.h.backend, v->dev.uuid, v->dev.backend);
	else if (r.h.nfds > nfds)
		e = why_fmt(why, whylen, -EBADF, "store %s: its memory is in %llu descriptors, %zu came", name,
			    (unsigned long long)r.h.nfds, nfds);
	else if (r.h.priority < TIER_PRIORITY_MIN || r.h.priority > TIER_PRIORITY_MAX)
		e = why_fmt(why, whylen, -EINVAL, "store %s: priority %lld out of range", name, (long long)r.h.priority);
	else if (!r.h.generation && (r.h.ndirs || r.h.nallocs || r.h.nentries || r.h.nfds || r.h.host || r.h.torn))
		e = why_fmt(why, whylen, -EINVAL, "store %s: records for a store with nothing committed", name);
	else if (r.h.torn && r.h.nreaders)
		e = why_fmt(why, whylen, -EINVAL, "store %s: torn, yet with readers", name);
	struct store *st = NULL;
	if (!e && (e = store_create(fs, r.h.store, &st)))
		why_fmt(why, whylen, e, "store %s: %s", name, e == -EEXIST ? "one of that name is here already" : strerror(-e));
	if (!e && r.h.generation) {
		char what[400] = "";
		if ((e = restore_records(fs, st, &r, buf, len, off, fds, adopted, arg, what, sizeof what)))
			why_fmt(why, whylen, e, "store %s: %s", name, what[0] ? what : strerror(-e));
	}
	if (!e) {
		lock_restore(st, r.h.generation, r.h.torn, r.h.commits);
		atomic_store(&st->pool->quota, r.h.quota);
		st->tier.priority = (int)r.h.priority;
		st->versions.allowed = r.h.versions > 1 ? 2 : 1;
		st->tier.at = r.h.host ? TIER_HOST : TIER_DEVICE;
		restore_min(st, r.h.min);
		if (r.h.has_content)
			content_restore(st, r.h.generation, r.h.content);
		if (r.h.named)
			named_restore(st, r.h.named, strlen(r.h.named));
		if (r.h.torn)
			store_error(st, "TORN since before the restart: a writer's session wrote into generation %llu's bytes "
					"in place and did not commit; reads and imports are refused (EUCLEAN) until a "
					"writer commits", (unsigned long long)r.h.generation);
		for (uint64_t i = 0; i < r.h.nreaders; i++) {
			struct lock_reader rd = { .pid = (pid_t)r.h.readers[i].pid, .start = r.h.readers[i].start,
						  .handles = r.h.readers[i].count, .writer = r.h.readers[i].writer };
			lock_inherit(st, &rd, 1);
		}
		*out = st;
	}
	restore_free(&r);
	if (e && st)
		store_remove(fs, name); /* nobody knows it yet: freed at once, its memory with it */
	return e;
}
