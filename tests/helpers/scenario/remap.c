/* remap: frees, unmap and remap, a layout changed or rebuilt, reallocate. */
#include "scenario.h"

int sc_free_removes(void)
{
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 1000));
	void *a, *b;
	CALL(g, gmsfs_create(g, "d/a", 4096, NULL, &a));
	CALL(g, gmsfs_create(g, "d/b", 4096, NULL, &b));
	CALL(g, gmsfs_meta_put(g, "x", "d/a", 0, "", 0));
	CALL(g, gmsfs_meta_put(g, "y", "d/b", 0, "", 0));
	CALL(g, gmsfs_meta_put(g, "n/z", "d/a", 10, "", 0));
	CALL(g, gmsfs_free(g, a));
	char path[4200];
	snprintf(path, sizeof path, "%s/allocs/d/a", store);
	CHECK(access(path, F_OK) < 0 && errno == ENOENT, "allocs/d/a gone");
	char **keys;
	size_t n;
	CALL(g, gmsfs_meta_list(g, "", &keys, &n));
	CHECK(n == 1 && !strcmp(keys[0], "y"), "%zu keys left, first %s", n, n ? keys[0] : "-");
	gmsfs_list_free(keys, n);
	struct gmsfs_mapping m;
	CHECK(gmsfs_find(g, "d/a", &m) == -ENOENT && gmsfs_find(g, "d/b", &m) == 0, "mapping table");
	CHECK(gmsfs_free(g, a) == -ENOENT, "double free");
	CALL(g, gmsfs_commit(g));
	CHECK(state_val("allocations") == 1, "one allocation committed");
	gmsfs_disconnect(g);
	return 0;
}

static int remember(gmsfs *g, void **addr, int n)
{
	const struct gmsfs_mapping *m;
	CHECK(gmsfs_mappings(g, &m) == (size_t)n, "mappings");
	for (int i = 0; i < n; i++)
		addr[i] = m[i].ptr;
	return 0;
}

static int same_addresses(gmsfs *g, void **addr, int n)
{
	const struct gmsfs_mapping *m;
	CHECK(gmsfs_mappings(g, &m) == (size_t)n, "mappings");
	for (int i = 0; i < n; i++)
		CHECK(m[i].ptr == addr[i], "%s moved from %p to %p", m[i].name, addr[i], m[i].ptr);
	return 0;
}

int sc_remap_same(void)
{
	if (publish(4, 8192, 6, NULL))
		return 1;
	gmsfs *g;
	void *addr[4];
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 1000));
	CALL(g, gmsfs_import_all(g));
	if (remember(g, addr, 4))
		return 1;
	CALL(g, gmsfs_unmap_all(g));
	CHECK(gmsfs_lock_mode(g) == 0 && wait_for(state_val, "readers", 0, 2000), "lock released");
	/* A writer may come and go meanwhile, changing nothing. */
	gmsfs *w;
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW, 1000));
	gmsfs_disconnect(w);
	CALL(g, gmsfs_remap_all(g, 1000));
	CHECK(gmsfs_lock_mode(g) == GMSFS_RO, "read lock again");
	if (same_addresses(g, addr, 4) || verify(g, 4, 6))
		return 1;
	gmsfs_disconnect(g);
	return 0;
}

/* commit_unmap_all: published as by commit, the writer unmapped with its addresses kept
 * and no lock; remap_all maps the committed layout there, read-only.  A reader's call
 * is refused and leaves its mappings. */
int sc_commit_unmap_all(void)
{
	gmsfs *g;
	void *addr[3];
	char h[33], rh[33];
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 1000));
	if (build(g, 3, 8192, 9) || remember(g, addr, 3))
		return 1;
	CALL(g, gmsfs_commit_unmap_all(g));
	CHECK(gmsfs_lock_mode(g) == 0 && gmsfs_generation(g) == 1, "lock %d, generation %llu", gmsfs_lock_mode(g),
	      (unsigned long long)gmsfs_generation(g));
	CHECK(wait_for(state_val, "writer", 0, 2000) && state_val("generation") == 1, "committed, lock given back");
	gmsfs *r;
	CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 1000));
	CALL(r, gmsfs_import_all(r));
	if (verify(r, 3, 9))
		return 1;
	CALL(r, gmsfs_layout_hash(r, rh));
	CHECK(gmsfs_commit_unmap_all(r) == -EPERM && gmsfs_lock_mode(r) == GMSFS_RO, "a reader's call");
	if (verify(r, 3, 9))
		return 1;
	gmsfs_disconnect(r);
	CALL(g, gmsfs_remap_all(g, 1000));
	CALL(g, gmsfs_layout_hash(g, h));
	CHECK(gmsfs_lock_mode(g) == GMSFS_RO && !strcmp(h, rh), "lock %d, hash %s (a reader's %s)", gmsfs_lock_mode(g),
	      h, rh);
	if (same_addresses(g, addr, 3) || verify(g, 3, 9))
		return 1;
	const struct gmsfs_mapping *m;
	gmsfs_mappings(g, &m);
	CHECK(!m[0].writable && mem_poke(m[0].ptr, m[0].aligned) != 0, "remapped read-only");
	gmsfs_disconnect(g);
	return 0;
}

int sc_remap_changed(void)
{
	if (publish(2, 4096, 0, NULL))
		return 1;
	gmsfs *g, *w;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 1000));
	CALL(g, gmsfs_import_all(g));
	CALL(g, gmsfs_unmap_all(g));
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW, 1000));
	void *p;
	CALL(w, gmsfs_create(w, "w/new", 4096, NULL, &p));
	CALL(w, gmsfs_commit(w));
	gmsfs_disconnect(w);
	int e = gmsfs_remap_all(g, 1000);
	CHECK(e == -ESTALE, "remap after a new structure: %s", gmsfs_strerror(e));
	CHECK(gmsfs_lock_mode(g) == 0 && wait_for(state_val, "readers", 0, 2000), "no lock kept");
	gmsfs_disconnect(g);
	return 0;
}

/* A sleeping reader keeps its store's directory open to lock it again: where that is no
 * longer the store the path names, remap_all goes by the path, as a new connect would. */
int sc_remap_removed(void)
{
	if (publish(2, 4096, 0, NULL))
		return 1;
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 1000));
	CALL(g, gmsfs_import_all(g));
	CALL(g, gmsfs_unmap_all(g));
	CHECK(rmdir(store) == 0, "rmdir of the store a sleeping reader had: %s", strerror(errno));
	int e = gmsfs_remap_all(g, 1000);
	CHECK(e == -ENOENT, "remap after the store went: %s", gmsfs_strerror(e));
	CHECK(mkdir(store, 0755) == 0, "mkdir: %s", strerror(errno));
	if (publish(3, 4096, 0, NULL))
		return 1;
	e = gmsfs_remap_all(g, 1000);
	CHECK(e == -ESTALE, "remap after the store was made again, another layout: %s", gmsfs_strerror(e));
	CHECK(gmsfs_lock_mode(g) == 0 && wait_for(state_val, "readers", 0, 2000), "no lock kept");
	gmsfs_disconnect(g);
	return 0;
}

int sc_remap_rebuilt(void)
{
	if (publish(3, 4096, 7, NULL))
		return 1;
	gmsfs *g, *w;
	void *addr[3];
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 1000));
	CALL(g, gmsfs_import_all(g));
	if (remember(g, addr, 3))
		return 1;
	CALL(g, gmsfs_unmap_all(g));
	/* The same structure, rebuilt from scratch with new content. */
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW, 1000));
	CALL(w, gmsfs_import_all(w));
	const struct gmsfs_mapping *m;
	while (gmsfs_mappings(w, &m))
		CALL(w, gmsfs_free(w, m[0].ptr));
	if (build(w, 3, 4096, 8))
		return 1;
	CALL(w, gmsfs_commit(w));
	gmsfs_disconnect(w);
	CALL(g, gmsfs_remap_all(g, 1000));
	if (same_addresses(g, addr, 3) || verify(g, 3, 8))
		return 1;
	gmsfs_disconnect(g);
	return 0;
}

int sc_reallocate(void)
{
	gmsfs *g;
	void *addr[3];
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 1000));
	if (build(g, 3, 4096, 9))
		return 1;
	CALL(g, gmsfs_commit(g));
	if (remember(g, addr, 3))
		return 1;
	long used = state_val("aligned_bytes");
	CALL(g, gmsfs_unmap_all(g));
	CALL(g, gmsfs_reallocate_all(g, 1000));
	CHECK(gmsfs_lock_mode(g) == GMSFS_RW, "write lock");
	if (same_addresses(g, addr, 3))
		return 1;
	const struct gmsfs_mapping *m;
	gmsfs_mappings(g, &m);
	for (int i = 0; i < 3; i++) {
		uint8_t first = 1;
		CHECK(m[i].writable && mem_read(&first, m[i].ptr, 1) == 0, "%s is writable", m[i].name);
		CHECK(cuda || first == 0, "%s is fresh memory", m[i].name); /* device memory comes uninitialized */
		if (fill(m[i].ptr, atoi(m[i].name + 2), m[i].size, 10))
			return 1;
	}
	CALL(g, gmsfs_commit(g));
	CHECK(state_val("aligned_bytes") == used, "old memory released at commit: %ld, was %ld", state_val("aligned_bytes"), used);
	gmsfs_disconnect(g);
	gmsfs *r;
	CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 1000));
	CALL(r, gmsfs_import_all(r));
	if (verify(r, 3, 10))
		return 1;
	gmsfs_disconnect(r);
	return 0;
}
