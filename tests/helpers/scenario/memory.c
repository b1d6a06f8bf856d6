/* memory: virtual spaces, CUDA graph pools. */
#include "scenario.h"

/* The bytes at p are allocation k's of salt. */
static int bytes_are(const void *p, int k, uint64_t size, int salt, const char *what)
{
	uint8_t *b = malloc(size);
	CHECK(b && mem_read(b, p, size) == 0, "reading %s", what);
	uint64_t bad = size;
	for (uint64_t i = 0; i < size && bad == size; i++)
		if (b[i] != byte_of(k, i, salt))
			bad = i;
	free(b);
	CHECK(bad == size, "%s: byte %llu differs", what, (unsigned long long)bad);
	return 0;
}

/* Virtual spaces: an allocation at two more addresses, one memory seen from each; asleep
 * and awake at the same addresses; reallocate_all followed; a reader's space; refusals
 * (a name not imported, a freed space, a handle asleep, freeing an allocation a space
 * maps).  Spaces left at disconnect are freed by it (ASan and valgrind run this). */
int sc_spaces(void)
{
	const uint64_t size = 1 << 21;
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 1000));
	if (build(g, 2, size, 3))
		return 1;
	struct gmsfs_mapping w0;
	CALL(g, gmsfs_find(g, "w/0", &w0));
	gmsfs_space *s1, *s2, *s3;
	void *a, *b, *again, *p;
	CALL(g, gmsfs_space_new(g, &s1));
	CALL(g, gmsfs_space_new(g, &s2));
	CHECK(gmsfs_space_handle(s1) == g, "the space's handle");
	CALL(g, gmsfs_space_map(s1, "w/0", &a));
	CALL(g, gmsfs_space_map(s2, "w/0", &b));
	CALL(g, gmsfs_space_map(s1, "w/0", &again));
	CHECK(a != w0.ptr && b != w0.ptr && a != b && again == a, "three addresses, one per space: %p %p %p", w0.ptr, a, b);
	if (bytes_are(a, 0, size, 3, "w/0 in space 1") || bytes_are(b, 0, size, 3, "w/0 in space 2"))
		return 1;
	if (fill(a, 0, size, 4) || bytes_are(w0.ptr, 0, size, 4, "w/0 written through space 1") ||
	    bytes_are(b, 0, size, 4, "space 2 after a write through space 1"))
		return 1;
	int e = gmsfs_space_map(s1, "w/9", &p);
	CHECK(e == -ENOENT && strstr(gmsfs_errmsg(g), "w/9"), "a name not imported: %s", gmsfs_strerror(e));
	e = gmsfs_free(g, w0.ptr);
	CHECK(e == -EBUSY && strstr(gmsfs_errmsg(g), "space"), "freeing what a space maps: %s", gmsfs_strerror(e));
	CALL(g, gmsfs_space_free(s2));
	CHECK(gmsfs_space_free(s2) == -EINVAL && strstr(gmsfs_errmsg(g), "freed already"), "a second free");
	CHECK(gmsfs_space_map(s2, "w/0", &p) == -EINVAL, "a map in a freed space");
	CALL(g, gmsfs_commit(g));
	CALL(g, gmsfs_unmap_all(g));
	CHECK(gmsfs_space_map(s1, "w/1", &p) == -EINVAL && gmsfs_space_new(g, &s3) == -EINVAL,
	      "asleep: no map, no new space");
	CALL(g, gmsfs_remap_all(g, 1000));
	CALL(g, gmsfs_space_map(s1, "w/0", &again));
	CHECK(again == a, "awake: the space's address again");
	if (bytes_are(a, 0, size, 4, "w/0 in space 1 after remap_all"))
		return 1;
	CALL(g, gmsfs_unmap_all(g));
	CALL(g, gmsfs_reallocate_all(g, 1000));
	CALL(g, gmsfs_find(g, "w/0", &w0));
	if (fill(w0.ptr, 0, size, 5) || bytes_are(a, 0, size, 5, "space 1 over the reallocated w/0"))
		return 1;
	CALL(g, gmsfs_commit(g));
	gmsfs *r;
	CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 1000));
	CALL(r, gmsfs_import_all(r));
	CALL(r, gmsfs_space_new(r, &s3));
	CALL(r, gmsfs_space_map(s3, "w/0", &p));
	if (bytes_are(p, 0, size, 5, "a reader's space"))
		return 1;
	gmsfs_disconnect(r); /* its space goes with it */
	gmsfs_disconnect(g);
	return 0;
}

/* The graph pool: captures in spaces of their own over the same chunks; the memory of
 * the largest; a span that refuses; the spaces asleep and awake with the handle. */
int sc_graph_pool(void)
{
	const uint64_t chunk = 2u << 20, mib = 1u << 20;
	int dev = getenv("GMSFS_SCENARIO_DEVICE") ? atoi(getenv("GMSFS_SCENARIO_DEVICE")) : 0;
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 1000));
	CALL(g, gmsfs_graph_use(g, chunk, 64 * mib));
	CHECK(!gmsfs_graph_alloc(4096, dev, NULL), "before a capture begins: NULL");
	CALL(g, gmsfs_graph_begin());
	char *a = gmsfs_graph_alloc(3 * mib, dev, NULL), *a2 = gmsfs_graph_alloc(1000, dev, NULL);
	CHECK(a && a2 == a + 3 * mib && gmsfs_graph_bytes() == 2 * chunk, "a capture of 3 MiB: two chunks, one run "
	      "of addresses (%p %p, %llu bytes)", (void *)a, (void *)a2, (unsigned long long)gmsfs_graph_bytes());
	if (fill(a, 0, 3 * mib, 7))
		return 1;
	CALL(g, gmsfs_graph_begin());
	char *b = gmsfs_graph_alloc(mib, dev, NULL);
	CHECK(b && b != a && gmsfs_graph_bytes() == 2 * chunk, "a smaller capture: new addresses, no new memory");
	if (bytes_are(b, 0, mib, 7, "the second capture over the first one's memory"))
		return 1;
	CALL(g, gmsfs_graph_begin());
	char *c = gmsfs_graph_alloc(5 * mib, dev, NULL);
	CHECK(c && gmsfs_graph_bytes() == 3 * chunk, "a larger one: the pool grows to it (%llu bytes)",
	      (unsigned long long)gmsfs_graph_bytes());
	CHECK(!gmsfs_graph_alloc(64 * mib, dev, NULL), "past the capture's span: NULL");
	if (bytes_are(c, 0, 3 * mib, 7, "the third capture"))
		return 1;
	/* Asleep and awake: every capture's addresses stay, over the same bytes. */
	CALL(g, gmsfs_commit(g));
	CALL(g, gmsfs_unmap_all(g));
	CALL(g, gmsfs_remap_all(g, 1000));
	if (bytes_are(a, 0, 3 * mib, 7, "the first capture after remap_all") ||
	    bytes_are(b, 0, mib, 7, "the second after remap_all"))
		return 1;
	CHECK(gmsfs_graph_use(g, chunk, 0) == -EPERM, "a read lock makes no pool");
	CALL(g, gmsfs_graph_use(NULL, 0, 0));
	gmsfs_disconnect(g);
	return 0;
}
