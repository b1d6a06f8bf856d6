/* loadlib: a safetensors checkpoint into a writer's handle (gmsfs_load, <gmsfs/load.h>):
 * every tensor packed into slabs as PyTorch's allocator would place them
 * (GMSFS_TORCH_ALIGN-aligned), copied, an entry "torch/NAME" per tensor (its extent, and
 * {dtype, shape, stride, storage_offset, param, source} as gmsfs(5) "Tensors" says), no
 * commit.  Every header is checked before the store is touched.  What gmsfs-load runs,
 * and what a Python engine calls in its own process (gmsfs.load). */
#include "copy.h"
#include "json.h"
#include "layout_hash.h"
#include "store_files.h"
#include "safetensors.h"

#include <gmsfs/gmsfs.h>
#include <gmsfs/load.h>
#include <gmsfs/torch.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ALIGN GMSFS_TORCH_ALIGN

struct placed {
	const struct st_file *f;
	const struct st_tensor *t;
	size_t slab;
	uint64_t off;
};

struct job {
	const char *store;
	struct st_file *files;
	size_t nfiles;
	struct placed *p;
	size_t n;
	uint64_t *slab_size;
	size_t nslabs;
	uint64_t bytes;
	bool progress, verbose, digest, commit;
	double t0, t_start, t_begin;
	char *source;  /* the note GMSFS_LOAD_SOURCE_NOTE: the checkpoint's files */
	uint64_t **dig; /* per slab, its pieces' xxh3 as they passed (NULL: GMSFS_LOAD_NO_DIGEST) */
	uint64_t *dig_all; /* what dig points into */
	char err[1024];
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* The checkpoint's files, each checked. */
static int open_files(struct job *j, const char *path)
{
	struct stat s;
	char **names = NULL;
	size_t n = 0;
	int e = 0;
	if (stat(path, &s)) {
		snprintf(j->err, sizeof j->err, "%s: %s", path, strerror(errno));
		return -errno;
	}
	if (S_ISDIR(s.st_mode)) {
		char idx[4096], one[4096];
		snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", path);
		snprintf(one, sizeof one, "%s/model.safetensors", path);
		if (!access(idx, R_OK)) {
			e = st_index(idx, &names, &n, j->err, sizeof j->err);
		} else if (!access(one, R_OK)) {
			names = calloc(1, sizeof *names);
			e = names && (names[0] = strdup(one)) ? (n = 1, 0) : -ENOMEM;
		} else {
			snprintf(j->err, sizeof j->err, "%s: no model.safetensors.index.json or model.safetensors", path);
			return -ENOENT;
		}
	} else {
		names = calloc(1, sizeof *names);
		e = names && (names[0] = strdup(path)) ? (n = 1, 0) : -ENOMEM;
	}
	if (!e && !(j->files = calloc(n ? n : 1, sizeof *j->files)))
		e = -ENOMEM;
	for (size_t i = 0; !e && i < n; i++, j->nfiles++)
		e = st_open(names[i], &j->files[i], j->err, sizeof j->err);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (e == -ENOMEM)
		snprintf(j->err, sizeof j->err, "out of memory");
	return e;
}

static int by_path(const void *a, const void *b)
{
	return strcmp((*(const struct st_file *const *)a)->path, (*(const struct st_file *const *)b)->path);
}

/* A file's own digest where its publisher named it: a Hugging Face hub cache's files are
 * links to blobs named by their SHA-256 (snapshots/REV/NAME -> ../../blobs/HEX).  Written
 * as `, "sha256": "HEX"`, or nothing. */
static void hub_digest(FILE *out, const char *path)
{
	char t[4096];
	ssize_t n = readlink(path, t, sizeof t - 1);
	if (n <= 0)
		return;
	t[n] = 0;
	const char *base = strrchr(t, '/');
	if (!base || base - t < 5 || strncmp(base - 5, "blobs", 5) || (base - t > 5 && base[-6] != '/'))
		return;
	base++;
	if (strlen(base) != 64 || strspn(base, "0123456789abcdef") != 64)
		return;
	fprintf(out, ", \"sha256\": \"%s\"", base);
}

/* The checkpoint's files as the source note says them: [{"name", "size", "mtime_ns",
 * "ino"[, "sha256"]}, ...], by name (a file's name without its folder).  A file changed in
 * place gets a new mtime; one replaced, a new inode; a hub's, its SHA-256 (hub_digest). */
static int source_of(struct job *j)
{
	const struct st_file **f = calloc(j->nfiles + 1, sizeof *f);
	size_t len = 0;
	FILE *out = f ? open_memstream(&j->source, &len) : NULL;
	if (!out) {
		free(f);
		snprintf(j->err, sizeof j->err, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < j->nfiles; i++)
		f[i] = &j->files[i];
	qsort(f, j->nfiles, sizeof *f, by_path);
	int e = 0;
	fputc('[', out);
	for (size_t i = 0; i < j->nfiles && !e; i++) {
		struct stat s;
		const char *slash = strrchr(f[i]->path, '/');
		if (stat(f[i]->path, &s)) {
			e = -errno;
			snprintf(j->err, sizeof j->err, "%s: %s", f[i]->path, strerror(errno));
			break;
		}
		fputs(i ? ", {\"name\": " : "{\"name\": ", out);
		js_write_str(out, slash ? slash + 1 : f[i]->path);
		fprintf(out, ", \"size\": %llu, \"mtime_ns\": %llu, \"ino\": %llu", (unsigned long long)s.st_size,
			(unsigned long long)s.st_mtim.tv_sec * 1000000000ull + (unsigned long long)s.st_mtim.tv_nsec,
			(unsigned long long)s.st_ino);
		hub_digest(out, f[i]->path);
		fputc('}', out);
	}
	fputc(']', out);
	if (fclose(out) && !e) {
		snprintf(j->err, sizeof j->err, "out of memory");
		e = -ENOMEM;
	}
	free(f);
	return e;
}

/* The source note of a load committed as generation gen: {"generation", "files"}.  A
 * later commit (a refit in place, a version flipped to) moves the generation past it:
 * the bytes may not be the files' any more. */
static char *note_of(const struct job *j, uint64_t gen)
{
	char *v = NULL;
	return asprintf(&v, "{\"generation\": %llu, \"files\": %s}", (unsigned long long)gen, j->source) < 0 ? NULL : v;
}

/* A store whose last commit holds allocations: GMSFS_LOAD_HELD when its source note is
 * this checkpoint's, of that commit, and the store is not torn; with GMSFS_LOAD_REPLACE
 * its allocations freed (their entries go with them) and 0; else -EEXIST, said. */
static int held(struct job *j, gmsfs *g, bool replace)
{
	struct gmsfs_meta m = { 0 };
	char torn[8] = "", *want = note_of(j, gmsfs_generation(g));
	bool noted = !gmsfs_meta_get(g, GMSFS_LOAD_SOURCE_NOTE, &m);
	bool same = noted && want && m.value_len == strlen(want) && !memcmp(m.value, want, m.value_len) &&
		    !sf_field(j->store, "state", "torn", torn, sizeof torn) && !strcmp(torn, "0");
	gmsfs_meta_free(&m);
	free(want);
	if (same)
		return GMSFS_LOAD_HELD;
	if (!replace) {
		snprintf(j->err, sizeof j->err, "%s holds allocations already, %s: load into an empty store, or replace "
			 "them (gmsfs-load --replace)", j->store, noted ? "of another checkpoint, of files changed "
			 "since, or committed again since (its note " GMSFS_LOAD_SOURCE_NOTE " says which)"
							    : "of no checkpoint gmsfs-load recorded");
		return -EEXIST;
	}
	int e = gmsfs_import_all(g);
	const struct gmsfs_mapping *list;
	size_t n = e ? 0 : gmsfs_mappings(g, &list);
	char **names = calloc(n + 1, sizeof *names);
	for (size_t i = 0; !e && i < n; i++)
		e = (names[i] = strdup(list[i].name)) ? 0 : -ENOMEM;
	for (size_t i = 0; !e && i < n; i++) /* by name: the list changes as they go */
		e = gmsfs_free_name(g, names[i]);
	for (size_t i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
	if (e)
		snprintf(j->err, sizeof j->err, "replacing what %s holds: %s", j->store, gmsfs_errmsg(g));
	return e;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct placed *)a)->t->name, ((const struct placed *)b)->t->name);
}

/* A file's tensors kind by kind (dtype, then shape), each kind in the file's order: a
 * model's layers of one kind lie side by side, one step apart, so that a reader makes
 * each run of them as one strided view (gmsfs_torch_manifest's groups), where the file's
 * order (layer by layer) would break the runs at every slab's end. */
static int by_kind(const void *a, const void *b)
{
	const struct st_tensor *x = *(const struct st_tensor *const *)a, *y = *(const struct st_tensor *const *)b;
	int c = strcmp(x->dtype, y->dtype);
	if (c || x->ndim != y->ndim)
		return c ? c : x->ndim < y->ndim ? -1 : 1;
	for (unsigned d = 0; d < x->ndim; d++)
		if (x->shape[d] != y->shape[d])
			return x->shape[d] < y->shape[d] ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* Slabs and offsets, kind by kind in each file; j->p stays in the files' order (the
 * copies read each file from its start to its end).  Names once. */
static int place(struct job *j, uint64_t slab_bytes)
{
	size_t total = 0, most = 0;
	for (size_t i = 0; i < j->nfiles; i++) {
		total += j->files[i].n;
		most = j->files[i].n > most ? j->files[i].n : most;
	}
	j->p = calloc(total ? total : 1, sizeof *j->p);
	j->slab_size = calloc(total + 1, sizeof *j->slab_size);
	const struct st_tensor **order = calloc(most ? most : 1, sizeof *order);
	if (!j->p || !j->slab_size || !order) {
		free(order);
		return -ENOMEM;
	}
	uint64_t used = 0;
	for (size_t i = 0; i < j->nfiles; i++) {
		const struct st_file *f = &j->files[i];
		for (size_t k = 0; k < f->n; k++)
			order[k] = &f->t[k];
		qsort(order, f->n, sizeof *order, by_kind);
		for (size_t k = 0; k < f->n; k++) {
			const struct st_tensor *t = order[k];
			uint64_t len = t->end - t->begin, at = (used + ALIGN - 1) / ALIGN * ALIGN;
			if (!j->nslabs || (at + len > slab_bytes && used)) {
				j->nslabs++;
				at = 0;
			}
			j->p[j->n + (size_t)(t - f->t)] = (struct placed){ f, t, j->nslabs - 1, at };
			used = at + len;
			if (j->slab_size[j->nslabs - 1] < used)
				j->slab_size[j->nslabs - 1] = used;
			j->bytes += len;
		}
		j->n += f->n;
	}
	free(order);
	struct placed *v = malloc((j->n ? j->n : 1) * sizeof *v);
	if (!v)
		return -ENOMEM;
	memcpy(v, j->p, j->n * sizeof *v);
	qsort(v, j->n, sizeof *v, by_name);
	for (size_t i = 1; i < j->n; i++)
		if (!strcmp(v[i].t->name, v[i - 1].t->name)) {
			snprintf(j->err, sizeof j->err, "tensor %s is in both %s and %s", v[i].t->name, v[i - 1].f->path,
				 v[i].f->path);
			free(v);
			return -EINVAL;
		}
	free(v);
	return 0;
}

/* {"dtype":...,"shape":[...],"stride":[...],"storage_offset":0,"source":"..."} */
static char *value_of(const struct placed *p)
{
	char *s = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&s, &len);
	if (!f)
		return NULL;
	const struct st_tensor *t = p->t;
	fprintf(f, "{\"dtype\":\"%s\",\"shape\":[", t->torch);
	for (unsigned d = 0; d < t->ndim; d++)
		fprintf(f, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
	fputs("],\"stride\":[", f);
	for (unsigned d = 0; d < t->ndim; d++) {
		uint64_t stride = 1;
		for (unsigned k = d + 1; k < t->ndim; k++)
			stride *= t->shape[k];
		fprintf(f, "%s%llu", d ? "," : "", (unsigned long long)stride);
	}
	fputs("],\"storage_offset\":0,\"param\":true,\"source\":", f);
	const char *base = strrchr(p->f->path, '/');
	js_write_str(f, base ? base + 1 : p->f->path);
	fputc('}', f);
	return fclose(f) ? (free(s), NULL) : s;
}

/* cp_run's progress, on a terminal: bytes, rate, time left. */
static void show(void *arg, uint64_t done)
{
	const struct job *j = arg;
	double dt = now_s() - j->t0, rate = dt > 0 ? (double)done / dt : 0;
	fprintf(stderr, "\r%s: %.2f of %.2f GB, %.2f GB/s, %.0f s left   ", j->store, done / 1e9, j->bytes / 1e9,
		rate / 1e9, rate > 0 ? (double)(j->bytes - done) / rate : 0.0);
}

/* -v: where the time goes, one line per phase on stderr. */
static void phase(struct job *j, const char *what)
{
	double t = now_s();
	if (j->verbose)
		fprintf(stderr, "gmsfs-load: %-32s %8.1f ms\n", what, (t - j->t_start) * 1e3);
	j->t_start = t;
}

static int by_slab(const void *a, const void *b)
{
	const struct placed *x = *(const struct placed *const *)a, *y = *(const struct placed *const *)b;
	return x->slab != y->slab ? (x->slab < y->slab ? -1 : 1) : x->off < y->off ? -1 : x->off > y->off;
}

/* A slab's piece before it is queued: its parts, and the file bytes it starts with. */
struct piece {
	size_t slab, part, nparts;
	uint64_t at;
	int file;
	uint64_t off;
};

static int by_first_byte(const void *a, const void *b)
{
	const struct piece *x = a, *y = b;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* A slab piece's parts: the tensors of slab s that lie in [at, end), from *t on (sorted by
 * slab and offset; *t moves past those that end before at). */
static size_t parts_of(const struct job *j, const struct placed *const *o, size_t *t, size_t s, uint64_t at,
		       uint64_t end, const int *file, struct cp_part *out)
{
	size_t n = 0;
	while (*t < j->n && (o[*t]->slab < s ||
			     (o[*t]->slab == s && o[*t]->off + (o[*t]->t->end - o[*t]->t->begin) <= at)))
		(*t)++;
	for (size_t u = *t; u < j->n && o[u]->slab == s && o[u]->off < end; u++) {
		uint64_t off = o[u]->off, hi = off + (o[u]->t->end - o[u]->t->begin), lo = off > at ? off : at;
		hi = hi < end ? hi : end;
		if (hi > lo)
			out[n++] = (struct cp_part){ file[o[u]->f - j->files], (uint32_t)(lo - at),
						     o[u]->f->data_start + o[u]->t->begin + (lo - off), hi - lo };
	}
	return n;
}

/* Every slab queued piece by piece (CP_PIECE bytes, a slab's last shorter): a piece's
 * tensors read into host memory, the bytes between them zeros, the piece hashed there and
 * copied whole (the content hash with no second pass).  Pieces in the order of the file
 * bytes they start with: each file is read from its start to its end. */
static int queue_pieces(struct job *j, struct cp *c, const struct gmsfs_new *v, const int *file)
{
	size_t np = 0;
	for (size_t s = 0; s < j->nslabs; s++)
		np += (size_t)((v[s].size + CP_PIECE - 1) / CP_PIECE);
	const struct placed **o = malloc((j->n + 1) * sizeof *o);
	struct cp_part *parts = malloc((j->n + np + 1) * sizeof *parts);
	struct piece *pc = malloc((np + 1) * sizeof *pc);
	uint64_t *flat = j->dig_all = calloc(np + 1, sizeof *flat);
	int e = o && parts && pc && flat && (j->dig = calloc(j->nslabs + 1, sizeof *j->dig)) ? 0 : -ENOMEM;
	for (size_t i = 0; !e && i < j->n; i++)
		o[i] = &j->p[i];
	if (!e)
		qsort(o, j->n, sizeof *o, by_slab);
	size_t k = 0, npart = 0, t = 0;
	for (size_t s = 0; !e && s < j->nslabs; s++) {
		j->dig[s] = flat + k;
		for (uint64_t at = 0; at < v[s].size; at += CP_PIECE, k++) {
			uint64_t end = at + CP_PIECE < v[s].size ? at + CP_PIECE : v[s].size;
			size_t n = parts_of(j, o, &t, s, at, end, file, parts + npart);
			pc[k] = (struct piece){ s, npart, n, at, n ? parts[npart].file : -1, n ? parts[npart].off : 0 };
			npart += n;
		}
	}
	if (!e)
		qsort(pc, np, sizeof *pc, by_first_byte);
	for (size_t i = 0; !e && i < np; i++) {
		uint64_t len = v[pc[i].slab].size - pc[i].at < CP_PIECE ? v[pc[i].slab].size - pc[i].at : CP_PIECE;
		e = cp_add_piece(c, (char *)v[pc[i].slab].ptr + pc[i].at, len, parts + pc[i].part, pc[i].nparts,
				 &j->dig[pc[i].slab][pc[i].at / CP_PIECE]);
	}
	free(o);
	free(parts);
	free(pc);
	return e;
}

/* After the commit of the slabs (GMSFS_LOAD_COMMIT): the daemon told their bytes' content
 * hash, from the pieces' hashes the copies made, when the commit holds the slabs and
 * nothing else (another allocation's bytes were not hashed).  Not told: it stays unknown
 * (gmsfsctl digest computes it), said with -v. */
static void tell_content(struct job *j, gmsfs *g, const struct gmsfs_new *v)
{
	char layout[33], hex[33] = "";
	const char **names = calloc(j->nslabs + 1, sizeof *names);
	uint64_t *sizes = calloc(j->nslabs + 1, sizeof *sizes);
	int e = names && sizes ? 0 : -ENOMEM;
	const char *why = NULL;
	for (size_t i = 0; !e && i < j->nslabs; i++)
		names[i] = v[i].name, sizes[i] = v[i].size;
	if (!e && sf_allocations(j->store) != (long)j->nslabs)
		e = -ESTALE, why = "the commit holds allocations besides the slabs, whose bytes were not hashed";
	if (!e)
		e = gmsfs_layout_hash(g, layout);
	if (!e)
		e = lh_content_of(layout, names, sizes, j->dig, j->nslabs, hex);
	if (!e)
		e = sf_set_content_hash(j->store, gmsfs_generation(g), hex);
	if (j->verbose && e)
		fprintf(stderr, "gmsfs-load: the content hash not told to the daemon: %s\n", why ? why : strerror(-e));
	else if (j->verbose)
		fprintf(stderr, "gmsfs-load: content hash %s\n", hex);
	free(names);
	free(sizes);
}

/* Create the slabs, copy, put the entries: all or nothing (the caller commits, or with
 * GMSFS_LOAD_COMMIT this does, and tells the daemon the bytes' content hash). */
static int load(struct job *j, gmsfs *g, struct cp *c)
{
	struct gmsfs_new *v = calloc(j->nslabs ? j->nslabs : 1, sizeof *v);
	char (*names)[48] = calloc(j->nslabs ? j->nslabs : 1, sizeof *names);
	struct gmsfs_entry *ent = calloc(j->n + 1, sizeof *ent);
	char **keys = calloc(j->n ? j->n : 1, sizeof *keys), **vals = calloc(j->n ? j->n : 1, sizeof *vals);
	int e = v && names && ent && keys && vals ? 0 : -ENOMEM;
	for (size_t i = 0; !e && i < j->nslabs; i++) {
		snprintf(names[i], sizeof names[i], GMSFS_TORCH_PREFIX "load%05zu", i);
		v[i] = (struct gmsfs_new){ .name = names[i], .size = j->slab_size[i] ? j->slab_size[i] : ALIGN, .tag = GMSFS_TORCH_TAG };
	}
	if (!e && j->nslabs && (e = gmsfs_create_many(g, v, j->nslabs)))
		snprintf(j->err, sizeof j->err, "%s", gmsfs_errmsg(g));
	phase(j, "slabs created and mapped");
	int *file = calloc(j->nfiles ? j->nfiles : 1, sizeof *file);
	if (!e && !file)
		e = -ENOMEM;
	for (size_t i = 0; !e && i < j->nfiles; i++)
		if ((file[i] = cp_file(c, j->files[i].path, j->err, sizeof j->err)) < 0)
			e = file[i];
	if (!e && j->digest)
		e = queue_pieces(j, c, v, file);
	for (size_t i = 0; !e && i < j->n; i++) {
		const struct placed *p = &j->p[i];
		uint64_t len = p->t->end - p->t->begin;
		if (!j->digest) /* each tensor as it lies, the bytes between them as the device gave them */
			e = cp_add(c, file[p->f - j->files], p->f->data_start + p->t->begin, (char *)v[p->slab].ptr + p->off,
				   len, NULL);
		if (!e && (asprintf(&keys[i], GMSFS_TORCH_PREFIX "%s", p->t->name) < 0 || !(vals[i] = value_of(p))))
			e = -ENOMEM;
		if (!e)
			ent[i] = (struct gmsfs_entry){ .key = keys[i], .alloc = names[p->slab], .offset = p->off, .size = len,
						       .value = vals[i], .value_len = strlen(vals[i]) };
	}
	char why[512];
	j->t0 = now_s();
	if (!e && (e = cp_run(c, j->progress ? show : NULL, j, why, sizeof why)))
		snprintf(j->err, sizeof j->err, "copying: %s", why);
	if (!e && j->verbose)
		fprintf(stderr, "gmsfs-load: %-32s %8.1f ms, %.2f GB/s, %.3f GB of it past the page cache\n",
			"bytes copied", (now_s() - j->t_start) * 1e3, j->bytes / (now_s() - j->t_start) / 1e9,
			cp_direct_bytes(c) / 1e9);
	j->t_start = now_s();
	if (j->progress && !e)
		fputc('\n', stderr);
	free(file);
	size_t nent = j->n;
	char *note = NULL; /* the checkpoint's files, beside its first slab, of the commit to come */
	if (!e && j->nslabs && !(note = note_of(j, gmsfs_generation(g) + 1)))
		e = -ENOMEM;
	if (!e && j->nslabs)
		ent[nent++] = (struct gmsfs_entry){ .key = GMSFS_LOAD_SOURCE_NOTE, .alloc = names[0], .flags = GMSFS_ENTRY_NOTE,
						    .value = note, .value_len = strlen(note) };
	if (!e && nent && (e = gmsfs_meta_put_many(g, ent, nent)))
		snprintf(j->err, sizeof j->err, "%s", gmsfs_errmsg(g));
	phase(j, "entries put");
	if (!e && j->commit && (e = gmsfs_commit(g)))
		snprintf(j->err, sizeof j->err, "commit: %s", gmsfs_errmsg(g));
	if (!e && j->commit && j->digest)
		tell_content(j, g, v);
	if (!e && j->commit)
		phase(j, "committed");
	free(note);
	for (size_t i = 0; keys && vals && i < j->n; i++) {
		free(keys[i]);
		free(vals[i]);
	}
	free(keys);
	free(vals);
	free(ent);
	free(names);
	free(v);
	if (e == -ENOMEM && !j->err[0])
		snprintf(j->err, sizeof j->err, "out of memory");
	return e;
}

int gmsfs_load(gmsfs *g, const char *path, const struct gmsfs_load_options *opt)
{
	struct gmsfs_load_options o = GMSFS_LOAD_OPTIONS;
	if (!g)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_load: no handle");
	gmsfs_seterr(g, 0, NULL);
	if (opt && opt->size != sizeof o)
		return gmsfs_seterr(g, -EINVAL, "gmsfs_load: options of %u bytes: this libgmsfs-load knows %zu "
				    "(set .size, or start from GMSFS_LOAD_OPTIONS)", opt->size, sizeof o);
	if (opt)
		o = *opt;
	if (!path || (o.flags & ~GMSFS_LOAD_FLAGS))
		return gmsfs_seterr(g, -EINVAL, "gmsfs_load: no path, or flags 0x%x (GMSFS_LOAD_PROGRESS, "
				    "GMSFS_LOAD_VERBOSE, GMSFS_LOAD_REPLACE, GMSFS_LOAD_COMMIT and GMSFS_LOAD_NO_DIGEST "
				    "are known)", o.flags);
	if (o.slab_bytes && o.slab_bytes < GMSFS_TORCH_ALIGN)
		return gmsfs_seterr(g, -EINVAL, "gmsfs_load: slabs of %llu bytes: at least %llu (GMSFS_TORCH_ALIGN), "
				    "or 0 for %llu", (unsigned long long)o.slab_bytes,
				    (unsigned long long)GMSFS_TORCH_ALIGN, (unsigned long long)GMSFS_TORCH_SLAB_BYTES);
	if (gmsfs_lock_mode(g) != GMSFS_RW)
		return gmsfs_seterr(g, -EPERM, "gmsfs_load: the handle does not hold the writer session");
	struct job j = { .progress = o.flags & GMSFS_LOAD_PROGRESS, .verbose = o.flags & GMSFS_LOAD_VERBOSE,
			 .digest = !(o.flags & GMSFS_LOAD_NO_DIGEST), .commit = o.flags & GMSFS_LOAD_COMMIT };
	j.t_start = j.t_begin = now_s();
	j.store = gmsfs_store_path(g);
	struct cp *c = NULL;
	int e = open_files(&j, path);
	if (!e)
		e = source_of(&j);
	if (!e)
		e = place(&j, o.slab_bytes ? o.slab_bytes : GMSFS_TORCH_SLAB_BYTES);
	phase(&j, "headers read and checked");
	if (!e)
		e = cp_open(j.store, &c, j.err, sizeof j.err);
	phase(&j, "device opened (CUDA context)");
	if (!e && sf_allocations(j.store) != 0)
		e = held(&j, g, o.flags & GMSFS_LOAD_REPLACE);
	if (!e)
		e = load(&j, g, c);
	if (j.verbose)
		fprintf(stderr, "gmsfs-load: %-32s %8.1f ms\n", "in all", (now_s() - j.t_begin) * 1e3);
	cp_close(c);
	for (size_t k = 0; k < j.nfiles; k++)
		st_free(&j.files[k]);
	free(j.files);
	free(j.p);
	free(j.slab_size);
	free(j.source);
	free(j.dig);
	free(j.dig_all);
	if (e == GMSFS_LOAD_HELD)
		return e;
	return e ? gmsfs_seterr(g, e, "%s", j.err[0] ? j.err : gmsfs_strerror(e)) : 0;
}

int gmsfs_load_context(const char *store)
{
	static struct cp *kept; /* its context and the driver library stay for the process */
	struct cp *c;
	char err[1024] = "";
	gmsfs_seterr(NULL, 0, NULL);
	if (!store)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_load_context: no store");
	int e = cp_open(store, &c, err, sizeof err);
	if (e)
		return gmsfs_seterr(NULL, e, "%s", err[0] ? err : gmsfs_strerror(e));
	if (!kept)
		kept = c;
	else
		cp_close(c);
	return 0;
}
