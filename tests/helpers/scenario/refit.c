/* refit: tensors copied in by name, pause and resume, versions and flips. */
#include "scenario.h"

/* Does allocation name of g hold build(salt)'s bytes, at the address it had? */
static int holds(gmsfs *g, const char *name, int k, int salt, void *was)
{
	struct gmsfs_mapping m;
	CALL(g, gmsfs_find(g, name, &m));
	CHECK(!was || m.ptr == was, "%s moved from %p to %p", name, was, m.ptr);
	uint8_t *p = malloc(m.size);
	CHECK(p && mem_read(p, m.ptr, m.size) == 0, "reading %s", name);
	uint64_t bad = m.size;
	for (uint64_t i = 0; i < m.size && bad == m.size; i++)
		if (p[i] != byte_of(k, i, salt))
			bad = i;
	int got = bad < m.size ? p[bad] : -1;
	free(p);
	CHECK(bad == m.size, "%s byte %llu is %d, not salt %d's %d (salt 1's: %d)", name, (unsigned long long)bad, got,
	      salt, byte_of(k, bad, salt), byte_of(k, bad, 1));
	return 0;
}

/* A trainer's tensors by name: every difference refused first, both sides said, nothing
 * written; then the bytes, from its own memory (here: the slab's far end). */
int sc_refit_by_name(void)
{
	static const char *vals[] = {
		"{\"dtype\": \"float32\", \"shape\": [4, 4], \"stride\": [4, 1], \"storage_offset\": 0, \"param\": true}",
		"{\"dtype\": \"bfloat16\", \"shape\": [8], \"stride\": [1], \"storage_offset\": 0, \"param\": true}",
		"{\"dtype\": \"float32\", \"shape\": [2, 2], \"stride\": [1, 2], \"storage_offset\": 0, \"param\": false}",
	};
	gmsfs *g;
	uint8_t *slab;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 5000));
	CALL(g, gmsfs_create(g, "torch/slab", 4096, "torch", (void **)&slab));
	if (fill(slab, 0, 4096, 1))
		return 1;
	struct gmsfs_entry v[] = {
		{ "torch/w", "torch/slab", 0, 64, 0, vals[0], strlen(vals[0]) },
		{ "torch/b", "torch/slab", 512, 16, 0, vals[1], strlen(vals[1]) },
		{ "torch/t", "torch/slab", 1024, 16, 0, vals[2], strlen(vals[2]) },
	};
	CALL(g, gmsfs_meta_put_many(g, v, 3));
	CALL(g, gmsfs_commit(g));
	gmsfs_disconnect(g);
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW_DATA, 5000));
	void *p;
	CALL(g, gmsfs_import(g, "torch/slab", &p));
	const char *src = (const char *)p + 2048; /* the source: memory of the store's device */
	int64_t s44[] = { 4, 4 }, s28[] = { 2, 8 }, s8[] = { 8 }, s22[] = { 2, 2 };
	struct gmsfs_tensor bad[] = {
		{ "w", "float32", s28, 2, src }, { "b", "float16", s8, 1, src }, { "nope", "float32", s8, 1, src },
	};
	int e = gmsfs_refit(g, bad, 3);
	const char *why = gmsfs_errmsg(g);
	CHECK(e == -EINVAL && strstr(why, "3 tensor(s) do not match, nothing was written") &&
	      strstr(why, "size mismatch for w: the store has shape [4, 4], the source has shape [2, 8]") &&
	      strstr(why, "dtype mismatch for b: the store has bfloat16, the source has float16") &&
	      strstr(why, "nope: the store has no such tensor"), "%d %s", e, why);
	struct gmsfs_tensor junk[] = { { "w", "float32", s44, 17, src }, { "b", "bfloat16", NULL, 1, src },
				       { "b", "bfloat16", s8, 1, NULL } };
	for (int i = 0; i < 3; i++) {
		e = gmsfs_refit(g, &junk[i], 1);
		CHECK(e == -EINVAL && strstr(gmsfs_errmsg(g), "the source's"), "junk %d: %d %s", i, e, gmsfs_errmsg(g));
	}
	struct gmsfs_tensor strided = { "t", "float32", s22, 2, src };
	e = gmsfs_refit(g, &strided, 1);
	CHECK(e == -EOPNOTSUPP && strstr(gmsfs_errmsg(g), "not contiguous"), "%d %s", e, gmsfs_errmsg(g));
	if (holds(g, "torch/slab", 0, 1, p)) /* nothing was written */
		return 1;
	struct gmsfs_tensor good[] = { { "w", "float32", s44, 2, src }, { "b", "bfloat16", s8, 1, src + 64 } };
	CALL(g, gmsfs_refit(g, good, 2));
	CALL(g, gmsfs_commit(g));
	gmsfs_disconnect(g);
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 5000));
	CALL(g, gmsfs_import(g, "torch/slab", &p));
	uint8_t got[4096];
	CHECK(mem_read(got, p, sizeof got) == 0, "reading the slab");
	for (int i = 0; i < 4096; i++) {
		int from = i < 64 ? 2048 + i : i >= 512 && i < 528 ? 2048 + 64 + i - 512 : i;
		CHECK(got[i] == byte_of(0, (uint64_t)from, 1), "slab byte %d", i);
	}
	gmsfs_disconnect(g);
	return 0;
}

/* gmsfs_refit on a store with versions, beside a reader: a slab its tensors write whole is
 * made for the next version without a copy of the last commit's bytes (version_overwrites),
 * one with bytes no tensor covers is copied first; the reader reads the last commit. */
int sc_refit_whole(void)
{
	static const char *val = "{\"dtype\": \"float32\", \"shape\": [128], \"stride\": [1], \"storage_offset\": 0, "
				 "\"param\": true}";
	gmsfs *g;
	void *p, *q;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 5000));
	CALL(g, gmsfs_create(g, "torch/whole", 1024, "torch", &p)); /* w0 and w1: every byte */
	CALL(g, gmsfs_create(g, "torch/part", 1024, "torch", &q));  /* w2 alone: half */
	void *src; /* the source, memory of the store's device: read, never written */
	CALL(g, gmsfs_create(g, "src", 2048, NULL, &src));
	if (fill(p, 0, 1024, 1) || fill(q, 1, 1024, 1) || fill(src, 5, 2048, 2))
		return 1;
	struct gmsfs_entry v[] = {
		{ "torch/w0", "torch/whole", 0, 512, 0, val, strlen(val) },
		{ "torch/w1", "torch/whole", 512, 512, 0, val, strlen(val) },
		{ "torch/w2", "torch/part", 0, 512, 0, val, strlen(val) },
	};
	CALL(g, gmsfs_meta_put_many(g, v, 3));
	CALL(g, gmsfs_commit(g));
	gmsfs_disconnect(g);
	CHECK(!setxattr(store, "user.gms.versions", "2", 1, 0), "versions: %s", strerror(errno));
	struct kid r = spawn(GMSFS_RO, 5000);
	CHECK(kid_result(&r, 5000, NULL) == 0, "the reader holds the last commit");
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW_DATA, 0)); /* beside the reader: at once */
	CALL(g, gmsfs_import(g, "src", &src)); /* its copy for the next version, the same bytes */
	int64_t s128[] = { 128 };
	struct gmsfs_tensor t[] = { { "w0", "float32", s128, 1, (char *)src },
				    { "w1", "float32", s128, 1, (char *)src + 512 },
				    { "w2", "float32", s128, 1, (char *)src + 1024 } };
	CALL(g, gmsfs_refit(g, t, 3));
	struct gmsfs_mapping sm;
	CALL(g, gmsfs_find(g, "src", &sm)); /* src and part copied, each an aligned slab */
	CHECK(state_val("version_copies") == 3 && state_val("version_overwrites") == 1 &&
	      state_val("version_copied_bytes") == 2 * (long)sm.aligned, "copies %ld overwrites %ld copied %ld",
	      state_val("version_copies"), state_val("version_overwrites"), state_val("version_copied_bytes"));
	CALL(g, gmsfs_commit(g));
	gmsfs_disconnect(g);
	kid_release(&r);
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 5000));
	CALL(g, gmsfs_import(g, "torch/whole", &p));
	CALL(g, gmsfs_import(g, "torch/part", &q));
	uint8_t a[1024], b[1024];
	CHECK(mem_read(a, p, sizeof a) == 0 && mem_read(b, q, sizeof b) == 0, "reading the slabs");
	for (int i = 0; i < 1024; i++) {
		CHECK(a[i] == byte_of(5, (uint64_t)i, 2), "whole byte %d", i);
		CHECK(b[i] == (i < 512 ? byte_of(5, (uint64_t)(1024 + i), 2) : byte_of(1, (uint64_t)i, 1)), "part byte %d", i);
	}
	gmsfs_disconnect(g);
	return 0;
}

/* A reader pauses: a data-only writer of the same process goes past it and writes in
 * place; a writer that could replace the memory waits; the reader resumes with no map,
 * the new bytes at its old addresses. */
int sc_pause_resume(void)
{
	if (publish(3, 8192, 1, NULL))
		return 1;
	gmsfs *r, *w;
	CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 5000));
	CALL(r, gmsfs_import_all(r));
	const struct gmsfs_mapping *m;
	gmsfs_mappings(r, &m);
	void *was[3] = { m[0].ptr, m[1].ptr, m[2].ptr };
	CALL(r, gmsfs_pause(r));
	CHECK(gmsfs_pause(r) == -EINVAL && gmsfs_lock_mode(r) == 0, "a second pause");
	CHECK(state_val("paused") == 1 && state_is("COMMITTED"), "paused %ld", state_val("paused"));
	int e = gmsfs_connect(&w, store, GMSFS_RW, 0);
	CHECK(e == -EAGAIN, "a writer that could replace the memory: %d", e);
	gmsfs_disconnect(w);
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW_DATA, 0));
	CALL(w, gmsfs_import_all(w));
	const struct gmsfs_mapping *wm;
	size_t n = gmsfs_mappings(w, &wm);
	for (size_t k = 0; k < n; k++)
		if (fill(wm[k].ptr, atoi(wm[k].name + 2), wm[k].size, 2))
			return 1;
	CALL(w, gmsfs_commit(w)); /* (a resume now would join this process's own session) */
	gmsfs_disconnect(w);
	CALL(r, gmsfs_resume(r, GMSFS_RO, 5000));
	CHECK(gmsfs_lock_mode(r) == GMSFS_RO && gmsfs_generation(r) == 2, "lock %d generation %llu",
	      gmsfs_lock_mode(r), (unsigned long long)gmsfs_generation(r));
	for (int k = 0; k < 3; k++) {
		char name[8];
		snprintf(name, sizeof name, "w/%d", k);
		if (holds(r, name, k, 2, was[k]))
			return 1;
	}
	CHECK(gmsfs_resume(r, GMSFS_RO, 0) == -EINVAL, "a resume not paused");
	gmsfs_disconnect(r);
	CHECK(wait_for(state_val, "paused", 0, 2000), "paused after disconnect");
	return 0;
}

/* __flipper STORE DONE GO: import all, report on DONE, on GO's byte flip to the commit
 * named v2 (gmsfs(5), NAMED VERSIONS): one allocation (w/1) changed, mapped again where
 * it was; the others untouched. */
int role_flipper(char **argv)
{
	int done = atoi(argv[3]), go = atoi(argv[4]);
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 5000));
	CALL(g, gmsfs_import_all(g));
	const struct gmsfs_mapping *m;
	gmsfs_mappings(g, &m);
	void *was[3] = { m[0].ptr, m[1].ptr, m[2].ptr };
	char c = 'x';
	CHECK(write(done, &c, 1) == 1 && read(go, &c, 1) == 1, "report");
	if (holds(g, "w/1", 1, 1, was[1])) /* committed beside it: not flipped yet, untouched */
		return 1;
	size_t changed = 0;
	char name[GMSFS_VERSION_NAME_MAX + 1];
	CHECK(gmsfs_version_name(g, name) == -ENODATA && !name[0], "the first commit has no name: \"%s\"", name);
	CHECK(gmsfs_wait_version(store, "v2", 0) == 0 && gmsfs_wait_version(store, "v3", 0) == -ETIMEDOUT,
	      "the last commit is v2, not v3");
	CHECK(gmsfs_flip_to(g, "v3", &changed) == -ENOENT && gmsfs_generation(g) == 1, "no v3: nothing changed");
	CALL(g, gmsfs_flip_to(g, "v2", &changed));
	CHECK(changed == 1 && gmsfs_generation(g) == 2, "changed %zu, generation %llu", changed,
	      (unsigned long long)gmsfs_generation(g));
	CHECK(gmsfs_version_name(g, name) == 0 && !strcmp(name, "v2"), "it holds v2: \"%s\"", name);
	int bad = holds(g, "w/0", 0, 1, was[0]) || holds(g, "w/1", 1, 2, was[1]) || holds(g, "w/2", 2, 1, was[2]);
	gmsfs_disconnect(g);
	return bad;
}

/* A store with versions: a data-only writer beside a reader copies the one allocation
 * it imports; the reader flips to it when it chooses. */
int sc_versions_flip(void)
{
	if (publish(3, 8192, 1, NULL))
		return 1;
	CHECK(!setxattr(store, "user.gms.versions", "2", 1, 0), "versions: %s", strerror(errno));
	int done[2], go[2], st;
	CHECK(!pipe(done) && !pipe(go), "pipes");
	pid_t r = fork();
	if (r == 0) {
		close_others(done[1], go[0]);
		char d[16], g[16];
		snprintf(d, sizeof d, "%d", done[1]);
		snprintf(g, sizeof g, "%d", go[0]);
		execl(self, self, "__flipper", store, d, g, (char *)NULL);
		_exit(127);
	}
	close(done[1]);
	close(go[0]);
	char c;
	CHECK(read(done[0], &c, 1) == 1, "the reader reports");
	gmsfs *w;
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW_DATA, 0)); /* beside the reader: at once */
	void *p;
	CALL(w, gmsfs_import(w, "w/1", &p));
	CHECK(state_val("version_copies") == 1, "copies %ld", state_val("version_copies"));
	/* Its copy written, then at once committed: cuMemcpyHtoD returns before its DMA lands,
	 * and the commit waits for it (it publishes those bytes, then makes the mapping
	 * read-only: a DMA still on its way would fault). */
	if (fill(p, 1, 8192, 2))
		return 1;
	CHECK(gmsfs_commit_version(w, "bad name") == -EINVAL, "a bad name refused");
	CALL(w, gmsfs_commit_version(w, "v2"));
	gmsfs_disconnect(w);
	CHECK(state_val("prev_handles") == 1, "prev_handles %ld", state_val("prev_handles"));
	gmsfs *n; /* a reader that comes now maps the new version */
	CALL(n, gmsfs_connect(&n, store, GMSFS_RO, 5000));
	CALL(n, gmsfs_import_all(n));
	if (holds(n, "w/1", 1, 2, NULL) || holds(n, "w/0", 0, 1, NULL))
		return 1;
	gmsfs_disconnect(n);
	CHECK(write(go[1], "x", 1) == 1, "go");
	CHECK(waitpid(r, &st, 0) == r && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the reader's flip: %d", st);
	CHECK(wait_for(state_val, "prev_handles", 0, 2000), "the version before let go");
	return 0;
}

/* gmsfs_commit_version_unmap_all: a name taken is refused before anything is committed or
 * unmapped (the session and its writable mapping go on); then the named commit, every
 * mapping gone and the lock given back; a reader sees the bytes under that name. */
int sc_commit_version_unmap(void)
{
	if (publish(2, 8192, 1, NULL))
		return 1;
	gmsfs *w;
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW, 1000));
	CALL(w, gmsfs_commit_version(w, "v1"));
	gmsfs_disconnect(w);
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW_DATA, 1000));
	void *p;
	CALL(w, gmsfs_import(w, "w/1", &p));
	CALL(w, gmsfs_protect(w, "w/1", 1)); /* the last commit's bytes, written in place */
	if (fill(p, 1, 8192, 3))
		return 1;
	CHECK(gmsfs_commit_version_unmap_all(w, "v1") == -EEXIST, "a name taken: refused");
	CHECK(gmsfs_lock_mode(w) == GMSFS_RW && state_val("writer") != 0, "the session goes on");
	if (fill(p, 1, 8192, 4)) /* its mapping still there, still writable */
		return 1;
	CHECK(gmsfs_commit_version_unmap_all(NULL, "v2") == -EINVAL, "no handle");
	CHECK(gmsfs_commit_version_unmap_all(w, "bad name") == -EINVAL, "a bad name refused");
	CALL(w, gmsfs_commit_version_unmap_all(w, "v2"));
	CHECK(gmsfs_lock_mode(w) == 0, "the lock given back: mode %d", gmsfs_lock_mode(w));
	CHECK(wait_for(state_val, "writer", 0, 2000) && state_val("readers") == 0, "nobody holds the store");
	gmsfs_disconnect(w);
	gmsfs *r;
	char name[GMSFS_VERSION_NAME_MAX + 1];
	CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 1000));
	CALL(r, gmsfs_import_all(r));
	CHECK(gmsfs_version_name(r, name) == 0 && !strcmp(name, "v2"), "the reader holds v2: \"%s\"", name);
	int bad = holds(r, "w/1", 1, 4, NULL) || holds(r, "w/0", 0, 1, NULL);
	gmsfs_disconnect(r);
	return bad;
}

/* gmsfs_commit_soon, then gmsfs_commit_disconnect (COMMIT_LEAVE): a hint changes nothing
 * and gets no reply (the next call's reply is its own: a manifest); refusals leave the
 * handle whole; named or not, the commit made and the store free with g gone. */
int sc_commit_disconnect(void)
{
	if (publish(2, 8192, 1, NULL))
		return 1;
	gmsfs *w, *r;
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW, 1000));
	CALL(w, gmsfs_commit_version(w, "v1"));
	gmsfs_disconnect(w);
	CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 1000));
	CHECK(gmsfs_commit_soon(r) == -EPERM && gmsfs_commit_disconnect(r, NULL) == -EPERM, "a reader's: EPERM");
	CHECK(gmsfs_lock_mode(r) == GMSFS_RO, "the reader still holds its lock");
	gmsfs_disconnect(r);
	CHECK(gmsfs_commit_soon(NULL) == -EINVAL && gmsfs_commit_disconnect(NULL, NULL) == -EINVAL, "no handle");
	for (int round = 0; round < 2; round++) {
		CALL(w, gmsfs_connect(&w, store, GMSFS_RW_DATA, 1000));
		CALL(w, gmsfs_commit_soon(w)); /* before the import: its reply must be the import's */
		void *p;
		CALL(w, gmsfs_import(w, "w/1", &p));
		CALL(w, gmsfs_protect(w, "w/1", 1));
		if (fill(p, 1, 8192, 5 + round))
			return 1;
		if (!round) {
			CHECK(gmsfs_commit_disconnect(w, "bad name") == -EINVAL, "a bad name refused");
			CHECK(gmsfs_commit_disconnect(w, "v1") == -EEXIST, "a name taken refused");
			CHECK(gmsfs_lock_mode(w) == GMSFS_RW && state_val("writer") != 0, "the session goes on");
			if (fill(p, 1, 8192, 5)) /* its mapping still there, still writable */
				return 1;
		}
		CALL(w, gmsfs_commit_soon(w));
		int e = gmsfs_commit_disconnect(w, round ? NULL : "v2"); /* w is gone on success */
		CHECK(e == 0, "commit_disconnect: %s", gmsfs_strerror(e));
		CHECK(state_val("writer") == 0 && state_val("readers") == 0, "nobody holds the store at once");
		char name[GMSFS_VERSION_NAME_MAX + 1];
		CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 1000));
		CALL(r, gmsfs_import_all(r));
		int named = gmsfs_version_name(r, name);
		CHECK(round ? named == -ENODATA : named == 0 && !strcmp(name, "v2"), "round %d: named \"%s\"", round, name);
		int bad = holds(r, "w/1", 1, 5 + round, NULL) || holds(r, "w/0", 0, 1, NULL);
		gmsfs_disconnect(r);
		if (bad)
			return 1;
	}
	return 0;
}
