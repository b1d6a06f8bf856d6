/* sharing: a range shared, one mapping let go, batched creates, request counts, bulk metadata. */
#include "scenario.h"

/* FUSE plus socket requests the daemon served for the store (reading state counts none). */
static long requests(void)
{
	return state_val("requests") + state_val("socket_requests");
}

/* Is address p in a mapping of this process (host backend)? */
static bool range_mapped(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "r");
	unsigned long lo, hi;
	bool in = false;
	char line[512];
	while (f && !in && fgets(line, sizeof line, f))
		in = sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi;
	if (f)
		fclose(f);
	return in;
}

/* The lowest address of g's mappings: where the range an import shares starts. */
static char *lowest(gmsfs *g)
{
	const struct gmsfs_mapping *m;
	size_t n = gmsfs_mappings(g, &m);
	char *lo = n ? m[0].ptr : NULL;
	for (size_t i = 0; i < n; i++)
		lo = (char *)m[i].ptr < lo ? m[i].ptr : lo;
	return lo;
}

/* An import maps each message's allocations side by side in one reservation: freeing
 * some leaves the others whole and writable, and the range goes back with the last. */
int sc_shared_range(void)
{
	enum { N = 5 };
	const uint64_t size = 3 << 20; /* not a multiple of the 2 MiB granularity */
	if (publish(N, size, 7, NULL))
		return 1;
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 5000));
	CALL(g, gmsfs_import_all(g));
	const struct gmsfs_mapping *m;
	size_t n = gmsfs_mappings(g, &m);
	CHECK(n == N, "%zu mappings", n);
	char *lo = lowest(g);
	int touching = 0;
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < n; j++)
			touching += (char *)m[j].ptr + m[j].aligned == m[i].ptr;
	CHECK(touching == N - 1, "%d of %d mappings follow another directly", touching, N);
	struct gmsfs_mapping w1, w2, w3;
	CALL(g, gmsfs_find(g, "w/1", &w1));
	CALL(g, gmsfs_find(g, "w/2", &w2));
	CALL(g, gmsfs_find(g, "w/3", &w3));
	CALL(g, gmsfs_free(g, w1.ptr));
	CALL(g, gmsfs_free(g, w3.ptr));
	/* The last commit's bytes come read-only to their writer, until it says it writes them. */
	CALL(g, gmsfs_protect(g, "w/2", 1));
	if (verify(g, N - 2, 7) || fill(w2.ptr, 2, size, 9)) /* the rest: whole, and w/2 writable */
		return 1;
	CALL(g, gmsfs_commit(g));
	bool host = gmsfs_backend(g) == GMSFS_BACKEND_HOST;
	CHECK(!host || range_mapped(lo), "the range went with two of five");

	gmsfs *r;
	CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 5000));
	CALL(r, gmsfs_import_all(r));
	struct gmsfs_mapping r2;
	CALL(r, gmsfs_find(r, "w/2", &r2));
	uint64_t bad = first_bad(r2.ptr, 2, size, 9);
	CHECK(bad == size, "the reader's w/2 differs at byte %llu", (unsigned long long)bad);
	gmsfs_disconnect(r);

	gmsfs_disconnect(g);
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 5000));
	CALL(g, gmsfs_import_all(g));
	n = gmsfs_mappings(g, &m);
	CHECK(n == N - 2, "%zu mappings", n);
	lo = m[0].ptr;
	while (gmsfs_mappings(g, &m))
		CALL(g, gmsfs_free(g, m[0].ptr));
	CHECK(!host || !range_mapped(lo), "the range stayed after its last mapping");
	CALL(g, gmsfs_commit(g));
	gmsfs_disconnect(g);
	return 0;
}

/* gmsfs_unmap: one mapping of a range an import shares goes, the others stay whole;
 * imported again it holds its bytes; the range goes with its last mapping; and a writer's
 * allocation let go before its commit is committed with the bytes written into it. */
int sc_unmap_one(void)
{
	enum { N = 4 };
	const uint64_t size = 3 << 20;
	if (publish(N, size, 5, NULL))
		return 1;
	gmsfs *r;
	CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 5000));
	CALL(r, gmsfs_import_all(r));
	const struct gmsfs_mapping *m;
	char *lo = lowest(r);
	struct gmsfs_mapping w1;
	CALL(r, gmsfs_unmap(r, "w/1"));
	CHECK(gmsfs_find(r, "w/1", &w1) == -ENOENT, "w/1 is still the handle's");
	CHECK(gmsfs_unmap(r, "w/1") == -ENOENT && strstr(gmsfs_errmsg(r), "maps no such"), "w/1 again: %s",
	      gmsfs_errmsg(r));
	CHECK(gmsfs_unmap(r, "../w") == -EINVAL, "a bad name: %s", gmsfs_errmsg(r));
	if (verify(r, N - 1, 5)) /* the others whole */
		return 1;
	void *p;
	CALL(r, gmsfs_import(r, "w/1", &p));
	if (verify(r, N, 5)) /* mapped again, with its bytes */
		return 1;
	while (gmsfs_mappings(r, &m))
		CALL(r, gmsfs_unmap(r, m[0].name));
	bool host = gmsfs_backend(r) == GMSFS_BACKEND_HOST;
	CHECK(!host || !range_mapped(lo), "the range stayed after its last mapping");
	gmsfs_disconnect(r);

	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 5000));
	CALL(g, gmsfs_import_all(g));
	struct gmsfs_mapping w2;
	CALL(g, gmsfs_find(g, "w/2", &w2));
	CALL(g, gmsfs_protect(g, "w/2", 1));
	if (fill(w2.ptr, 2, size, 6))
		return 1;
	CALL(g, gmsfs_unmap(g, "w/2")); /* written (mem_write waits for it): let go before the commit */
	CALL(g, gmsfs_commit(g));
	gmsfs_disconnect(g);
	CALL(r, gmsfs_connect(&r, store, GMSFS_RO, 5000));
	CALL(r, gmsfs_import(r, "w/2", &p));
	uint64_t bad = first_bad(p, 2, size, 6);
	CHECK(bad == size, "w/2 as committed differs at byte %llu", (unsigned long long)bad);
	gmsfs_disconnect(r);
	return 0;
}

static long vm_size(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmSize: %ld kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	return kb * 1024L;
}

/* gmsfs_create_many: one request for many, all or nothing, never touching what was
 * there: a bad entry, a name the committed layout has, and (host) a client that cannot
 * map what the daemon made each leave the layout as it was. */
int sc_create_many(void)
{
	if (publish(1, 4096, 3, NULL)) /* w/0 */
		return 1;
	enum { N = 40 };
	static struct gmsfs_new v[N];
	static char names[N][32];
	for (int k = 0; k < N; k++) {
		snprintf(names[k], sizeof names[k], "m/%d", k);
		v[k] = (struct gmsfs_new){ .name = names[k], .size = (uint64_t)(k + 1) << 16, .tag = k % 2 ? "odd" : NULL };
	}
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 5000));
	v[7].name = "bad//name";
	CHECK(gmsfs_create_many(g, v, N) == -EINVAL && strstr(gmsfs_errmsg(g), "bad//name"), "a bad name: %s",
	      gmsfs_errmsg(g));
	v[7].name = "w/0"; /* committed, not imported by this handle */
	CHECK(gmsfs_create_many(g, v, N) == -EEXIST, "a committed name: %s", gmsfs_errmsg(g));
	v[7].name = names[7];
	struct gmsfs_mapping nm;
	CHECK(gmsfs_create(g, "no/ptr", 4096, NULL, NULL) == 0 && gmsfs_find(g, "no/ptr", &nm) == 0 && nm.ptr,
	      "create with no place for the pointer: %s", gmsfs_errmsg(g));
	CHECK(gmsfs_free(g, nm.ptr) == 0, "and free it");
	if (gmsfs_backend(g) == GMSFS_BACKEND_HOST) {
		/* The daemon makes them; this process cannot reserve the room: they go again. */
		struct rlimit was, low;
		getrlimit(RLIMIT_AS, &was);
		low = was;
		low.rlim_cur = (rlim_t)vm_size() + (16 << 20);
		CHECK(setrlimit(RLIMIT_AS, &low) == 0, "setrlimit");
		int e = gmsfs_create_many(g, v, N);
		setrlimit(RLIMIT_AS, &was);
		CHECK(e == -ENOMEM && strstr(gmsfs_errmsg(g), "reserving"), "%s: %s", gmsfs_strerror(e), gmsfs_errmsg(g));
	}
	/* One the daemon cannot make, the last: none of the others stays, here or there. */
	v[N - 1].size = 1ull << 60;
	int full = gmsfs_create_many(g, v, N);
	CHECK(full == -ENOSPC && strstr(gmsfs_errmsg(g), names[N - 1]), "%s: %s", gmsfs_strerror(full), gmsfs_errmsg(g));
	CHECK(state_has("\nlast_error: allocs/m/39: 1152921504606846976 bytes"), "state's last_error does not say why");
	v[N - 1].size = (uint64_t)N << 16;
	const struct gmsfs_mapping *m;
	CHECK(gmsfs_mappings(g, &m) == 0, "a failed create left mappings");
	CALL(g, gmsfs_create_many(g, v, N));
	for (int k = 0; k < N; k++) {
		struct gmsfs_mapping x;
		CALL(g, gmsfs_find(g, names[k], &x));
		CHECK(x.ptr == v[k].ptr && x.size == v[k].size && x.writable && !strcmp(x.tag, k % 2 ? "odd" : "default"),
		      "%s", names[k]);
		if (fill(v[k].ptr, k, v[k].size, 5))
			return 1;
	}
	CALL(g, gmsfs_commit(g));
	gmsfs_disconnect(g);

	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 5000));
	CALL(g, gmsfs_import_all(g));
	CHECK(gmsfs_mappings(g, &m) == N + 1, "%zu mappings, expected %d", gmsfs_mappings(g, &m), N + 1);
	for (int k = 0; k < N; k++) {
		struct gmsfs_mapping x;
		CALL(g, gmsfs_find(g, names[k], &x));
		uint8_t *b = malloc(x.size);
		CHECK(mem_read(b, x.ptr, x.size) == 0, "reading %s", names[k]);
		uint64_t bad = x.size;
		for (uint64_t i = 0; i < x.size && bad == x.size; i++)
			if (b[i] != byte_of(k, i, 5))
				bad = i;
		free(b);
		CHECK(bad == x.size, "%s differs at byte %llu", names[k], (unsigned long long)bad);
	}
	gmsfs_disconnect(g);
	return 0;
}

/* A reader's connect + import_all + meta_get of every key of 1000 allocations and 1000
 * entries, and a writer's bulk put of the 1000: at most 4 daemon requests each. */
int sc_requests(void)
{
	enum { N = 1000 };
	gmsfs *w;
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW, 5000));
	static struct gmsfs_entry v[N];
	static char keys[N][48], names[N][32];
	for (int i = 0; i < N; i++) {
		void *p;
		snprintf(names[i], sizeof names[i], "layers/%d/w", i);
		snprintf(keys[i], sizeof keys[i], "params/layers.%d.weight", i);
		CALL(w, gmsfs_create(w, names[i], 4096, "weights", &p));
		v[i] = (struct gmsfs_entry){ .key = keys[i], .alloc = names[i], .offset = (uint64_t)i % 512, .size = 512,
					     .value = keys[i], .value_len = strlen(keys[i]) };
	}
	long r0 = requests();
	CALL(w, gmsfs_meta_put_many(w, v, N));
	long put = requests() - r0;
	printf("# bulk put of %d entries: %ld daemon requests\n", N, put);
	CHECK(put <= 4, "the bulk put took %ld requests", put);
	CALL(w, gmsfs_commit(w));
	gmsfs_disconnect(w);

	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 5000));
	r0 = requests();
	CALL(g, gmsfs_import_all(g));
	for (int i = 0; i < N; i++) {
		struct gmsfs_meta m;
		CALL(g, gmsfs_meta_get(g, keys[i], &m));
		struct gmsfs_mapping map;
		CALL(g, gmsfs_find(g, names[i], &map));
		CHECK(!strcmp(m.alloc, names[i]) && m.offset == (uint64_t)i % 512 && m.size == 512 &&
		      m.value_len == strlen(keys[i]) && !memcmp(m.value, keys[i], m.value_len) &&
		      m.ptr == (char *)map.ptr + m.offset, "%s", keys[i]);
		gmsfs_meta_free(&m);
	}
	char **list;
	size_t n;
	CALL(g, gmsfs_meta_list(g, "params/layers.99", &list, &n));
	CHECK(n == 11 && !strcmp(list[0], "params/layers.99.weight"), "%zu keys under params/layers.99", n);
	gmsfs_list_free(list, n);
	long read = requests() - r0;
	printf("# import_all + %d meta_get + meta_list: %ld daemon requests\n", N, read);
	CHECK(read <= 4, "the reader took %ld requests", read);
	/* A reader's layout cannot change while it holds its lock: importing again is free
	 * (materialize calls import_all), and after a sleep and a wake it asks again. */
	r0 = requests();
	CALL(g, gmsfs_import_all(g));
	CHECK(requests() == r0, "a second import_all under the same lock took %ld requests", requests() - r0);
	CALL(g, gmsfs_unmap_all(g));
	CALL(g, gmsfs_remap_all(g, 5000));
	r0 = requests();
	CALL(g, gmsfs_import_all(g));
	CHECK(requests() > r0, "an import_all after a wake asked the daemon");
	gmsfs_disconnect(g);
	return 0;
}

/* put_many is all or nothing and names the bad entry; values up to 1 MiB travel in
 * chunks; private entries are copies of their extent. */
int sc_bulk_meta(void)
{
	gmsfs *w;
	uint8_t *p;
	CALL(w, gmsfs_connect(&w, store, GMSFS_RW, 5000));
	CALL(w, gmsfs_create(w, "slab", 1 << 20, NULL, (void **)&p));
	if (fill(p, 5, 1 << 20, 9))
		return 1;
	struct gmsfs_entry bad[3] = {
		{ .key = "a", .alloc = "slab", .offset = 0, .size = 16 },
		{ .key = "b", .alloc = "nope", .offset = 0 },
		{ .key = "c", .alloc = "slab", .offset = 0 },
	};
	CHECK(gmsfs_meta_put_many(w, bad, 3) == -EINVAL, "a batch naming a missing allocation");
	CHECK(strstr(gmsfs_errmsg(w), "entries[1] (b)") && strstr(gmsfs_errmsg(w), "nope"), "%s", gmsfs_errmsg(w));
	bad[1] = (struct gmsfs_entry){ .key = "b", .alloc = "slab", .offset = (1 << 20) - 8, .size = 9 };
	CHECK(gmsfs_meta_put_many(w, bad, 3) == -EINVAL, "an extent past the end");
	CHECK(strstr(gmsfs_errmsg(w), "entries[1] (b)"), "%s", gmsfs_errmsg(w));
	char **keys;
	size_t n;
	CALL(w, gmsfs_meta_list(w, NULL, &keys, &n));
	CHECK(n == 0, "%zu entries after refused batches", n);
	gmsfs_list_free(keys, n);
	static uint8_t big[GMSFS_VALUE_MAX], mid[100000];
	for (size_t i = 0; i < sizeof big; i++)
		big[i] = (uint8_t)(i * 31 + i / 4096);
	memcpy(mid, big + 7, sizeof mid);
	struct gmsfs_entry good[3] = {
		{ .key = "cfg/big", .alloc = "slab", .offset = 0, .value = big, .value_len = sizeof big },
		{ .key = "cfg/mid", .alloc = "slab", .offset = 1, .value = mid, .value_len = sizeof mid },
		{ .key = "buf/scale", .alloc = "slab", .offset = 4096, .size = 8192, .flags = GMSFS_ENTRY_PRIVATE,
		  .value = "f32[2048]", .value_len = 9 },
	};
	CALL(w, gmsfs_meta_put_many(w, good, 3));
	CALL(w, gmsfs_commit(w));
	gmsfs_disconnect(w);

	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 5000));
	CALL(g, gmsfs_import_all(g));
	struct gmsfs_meta m;
	CALL(g, gmsfs_meta_get(g, "cfg/big", &m));
	CHECK(m.value_len == sizeof big && !memcmp(m.value, big, sizeof big), "a 1 MiB value came whole");
	gmsfs_meta_free(&m);
	CALL(g, gmsfs_meta_get(g, "cfg/mid", &m));
	CHECK(m.value_len == sizeof mid && !memcmp(m.value, mid, sizeof mid), "a 100 KB value came whole");
	gmsfs_meta_free(&m);
	CALL(g, gmsfs_meta_get(g, "buf/scale", &m));
	struct gmsfs_mapping slab;
	CALL(g, gmsfs_find(g, "slab", &slab));
	CHECK(m.flags == GMSFS_ENTRY_PRIVATE && m.size == 8192 && m.ptr && m.ptr != (char *)slab.ptr + 4096,
	      "a private entry points at a copy of its own");
	uint8_t *shared = malloc(8192), *mine = malloc(8192);
	CHECK(mem_read(shared, (char *)slab.ptr + 4096, 8192) == 0 && mem_read(mine, m.ptr, 8192) == 0, "read both");
	CHECK(!memcmp(shared, mine, 8192), "the copy holds the extent's bytes");
	memset(mine, 0xab, 8192);
	CHECK(mem_write(m.ptr, mine, 8192) == 0, "the reader writes its copy");
	CHECK(mem_read(shared, (char *)slab.ptr + 4096, 8192) == 0 && shared[0] == byte_of(5, 4096, 9),
	      "the shared bytes are untouched");
	free(shared);
	free(mine);
	gmsfs_meta_free(&m);
	gmsfs_disconnect(g);
	return 0;
}
