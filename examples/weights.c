/* gmsfs-example: publish "weights" as a writer, import them as a reader.
 *
 *   gmsfs-example write STORE [COUNT [BYTES]]   create, fill, describe, commit
 *   gmsfs-example read STORE                    import all, check every byte
 *
 * Build against an installed libgmsfs: cc weights.c $(pkg-config --cflags --libs gmsfs) */
#include <gmsfs/gmsfs.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Word w of layer k: anything that tells layers and offsets apart. */
static uint64_t pattern(uint64_t k, uint64_t w)
{
	return (k << 40) ^ (w * 0x9e3779b97f4a7c15ull);
}

static int fail(gmsfs *g, const char *what, int e)
{
	fprintf(stderr, "gmsfs-example: %s: %s (%s)\n", what, gmsfs_strerror(e), g ? gmsfs_errmsg(g) : "");
	gmsfs_disconnect(g);
	return 1;
}

static int writer(const char *store, int count, uint64_t bytes)
{
	gmsfs *g;
	int e = gmsfs_connect(&g, store, GMSFS_RW, 10000);
	if (e)
		return fail(g, "connect", e);
	for (int k = 0; k < count; k++) {
		char name[64], key[64];
		uint64_t *p;
		snprintf(name, sizeof name, "layers/%d/weight", k);
		if ((e = gmsfs_create(g, name, bytes, "weights", (void **)&p)))
			return fail(g, name, e);
		for (uint64_t w = 0; w < bytes / 8; w++)
			p[w] = pattern((uint64_t)k, w);
		/* The tensor's description lives next to it: dtype and shape as the value. */
		snprintf(key, sizeof key, "tensors/layer%d", k);
		char value[64];
		int n = snprintf(value, sizeof value, "u64[%" PRIu64 "]", bytes / 8);
		if ((e = gmsfs_meta_put(g, key, name, 0, value, (size_t)n)))
			return fail(g, key, e);
	}
	if ((e = gmsfs_commit(g)))
		return fail(g, "commit", e);
	char hash[33];
	gmsfs_layout_hash(g, hash);
	printf("committed %d allocations of %" PRIu64 " bytes, layout %s\n", count, bytes, hash);
	gmsfs_disconnect(g);
	return 0;
}

/* The layer a key like "tensors/layer12" describes, or -1 for any other key. */
static int layer_of(const char *key)
{
	int k, end = 0;
	if (sscanf(key, "tensors/layer%d%n", &k, &end) != 1 || key[end] || k < 0)
		return -1;
	return k;
}

static int reader(const char *store)
{
	gmsfs *g;
	int e = gmsfs_connect(&g, store, GMSFS_RO, 10000);
	if (e)
		return fail(g, "connect", e);
	if ((e = gmsfs_import_all(g))) /* every allocation and every entry, one round trip */
		return fail(g, "import_all", e);
	char **keys;
	size_t nkeys, bad = 0;
	if ((e = gmsfs_meta_list(g, "tensors/", &keys, &nkeys)))
		return fail(g, "meta_list", e);
	/* Each tensor entry says where its words are: check them, and nothing else. */
	for (size_t i = 0; i < nkeys; i++) {
		struct gmsfs_meta md;
		struct gmsfs_mapping m;
		int k = layer_of(keys[i]);
		if (k < 0 || gmsfs_meta_get(g, keys[i], &md))
			continue;
		if (md.alloc && !gmsfs_find(g, md.alloc, &m)) {
			const uint64_t *p = m.ptr;
			for (uint64_t w = md.offset / 8; w < m.size / 8; w++)
				bad += p[w] != pattern((uint64_t)k, w - md.offset / 8);
		}
		if (i < 3)
			printf("  %s -> %s+%" PRIu64 " %.*s\n", keys[i], md.alloc ? md.alloc : "-", md.offset,
			       (int)md.value_len, (char *)md.value);
		gmsfs_meta_free(&md);
	}
	const struct gmsfs_mapping *m;
	size_t n = gmsfs_mappings(g, &m);
	char hash[33];
	gmsfs_layout_hash(g, hash);
	printf("imported %zu allocations (%" PRIu64 " bytes), %zu metadata entries, %zu bad words, layout %s\n", n,
	       gmsfs_total_bytes(g), nkeys, bad, hash);
	gmsfs_list_free(keys, nkeys);
	gmsfs_disconnect(g);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "write"))
		return writer(argv[2], argc > 3 ? atoi(argv[3]) : 8, argc > 4 ? strtoull(argv[4], NULL, 0) : 1 << 20);
	if (argc == 3 && !strcmp(argv[1], "read"))
		return reader(argv[2]);
	fprintf(stderr, "usage: %s write STORE [COUNT [BYTES]] | read STORE\n", argv[0]);
	return 2;
}
