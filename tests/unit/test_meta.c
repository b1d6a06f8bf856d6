/* meta: the test vector, order independence, every field moving the digest,
 * validation (extents included), rollback, batches that change all or nothing, and
 * memory released exactly once. */
#include "../../src/meta/meta.h"
#include "tap.h"

#include <errno.h>
#include <stdlib.h>
#include <xxhash.h>

static int released; /* buffers handed back through the hook */
static void release_buf(void *buf, void *ctx) { (void)ctx; free(buf); released++; }

static struct meta_node *mk(struct meta_store *s, enum meta_area a, const char *path, enum meta_kind kind)
{
	/* mkdir -p of the parents, then the leaf. */
	char buf[256];
	snprintf(buf, sizeof buf, "%s", path);
	struct meta_node *dir = meta_root(s, a), *n = NULL;
	char *save, *tok = strtok_r(buf, "/", &save);
	while (tok) {
		char *next = strtok_r(NULL, "/", &save);
		n = meta_lookup(dir, tok);
		if (!n && meta_create(dir, tok, next ? META_DIR : kind, &n))
			return NULL;
		dir = n;
		tok = next;
	}
	return n;
}

static struct meta_node *alloc(struct meta_store *s, const char *path, uint64_t size, const char *tag)
{
	struct meta_node *n = mk(s, META_AREA_ALLOCS, path, META_ALLOC);
	if (n && size)
		meta_alloc_size(n, size, (size + 4095) & ~4095ull, malloc(1));
	if (n && tag)
		meta_set_tag(n, tag, strlen(tag));
	return n;
}

static struct meta_node *entry(struct meta_store *s, const char *key, const char *a, const char *off, const char *val)
{
	struct meta_node *n = mk(s, META_AREA_META, key, META_ENTRY);
	if (n && a)
		meta_entry_set_alloc(n, a, strlen(a));
	if (n && off)
		meta_entry_set_offset(n, off, strlen(off));
	if (n && val)
		meta_entry_write(n, 0, val, strlen(val));
	return n;
}

/* The vector's entry also has an extent of 64 bytes and is private. */
static struct meta_node *vector_entry(struct meta_store *s, const char *key, const char *a, const char *off,
				      const char *val, const char *extent, const char *priv)
{
	struct meta_node *n = entry(s, key, a, off, val);
	if (n) {
		meta_entry_set_extent(n, extent, strlen(extent));
		meta_entry_set_flag(n, GMSFS_ENTRY_PRIVATE, priv, strlen(priv));
	}
	return n;
}

static char hex[33];
static const char *hash(struct meta_store *s)
{
	uint8_t d[16];
	if (meta_layout_hash(s, d))
		return "error";
	for (int i = 0; i < 16; i++)
		sprintf(hex + 2 * i, "%02x", d[i]);
	return hex;
}

static struct meta_store *vector(int order)
{
	struct meta_store *s = meta_store_new(release_buf, NULL);
	if (order == 0) {
		alloc(s, "w/a", 4096, "weights");
		alloc(s, "w/b", 100, NULL);
		vector_entry(s, "cfg/k", "w/a", "16", "hello", "64", "1");
	} else {
		vector_entry(s, "cfg/k", "w/a", "16", "hello", "64", "1");
		alloc(s, "w/b", 100, "default");
		alloc(s, "w/a", 4096, "weights");
	}
	return s;
}

#define VECTOR "bbef1f4b892576134837a2dbf79ceecd"

static void batches(struct meta_store *s)
{
	char err[512];
	const char *before = strdup(hash(s));
	/* Allocations: the second is given twice, so nothing is made and every buffer stays ours. */
	released = 0;
	struct meta_new_alloc na[3] = {
		{ .path = "b/x", .size = 10, .aligned = 4096, .buf = malloc(1) },
		{ .path = "b/y/z", .tag = "kv", .size = 20, .aligned = 4096, .buf = malloc(1) },
		{ .path = "b/x", .size = 10, .aligned = 4096, .buf = malloc(1) },
	};
	is_int(meta_create_allocs(s, na, 3, err, sizeof err), -EEXIST, "a batch naming one allocation twice is refused");
	ok(strstr(err, "allocs[2] (b/x)") != NULL, "the error names it: %s", err);
	is_str(hash(s), before, "and the layout is as it was");
	ok(!meta_resolve(s, META_AREA_ALLOCS, "b"), "the directories it made are gone");
	is_int(released, 0, "no buffer was released: the caller keeps them");
	free(na[2].buf);
	is_int(meta_create_allocs(s, na, 2, err, sizeof err), 0, "two new allocations in one batch");
	ok(na[1].node && !strcmp(na[1].node->tag, "kv") && na[1].node->size == 20, "sized and tagged");
	struct meta_new_alloc clash = { .path = "w/a/sub", .size = 1, .aligned = 1 };
	is_int(meta_create_allocs(s, &clash, 1, err, sizeof err), -ENOTDIR, "a parent that is an allocation");

	/* Entries: the third is bad, so none of them is put. */
	struct entry_rec p[3] = {
		{ .key = "m/1", .alloc = "b/x", .offset = 0, .size = 10, .value = "one", .value_len = 3 },
		{ .key = "cfg/k", .alloc = "b/y/z", .offset = 4, .value = "replaced", .value_len = 8 },
		{ .key = "m/3", .alloc = "b/x", .offset = 5, .size = 6, .value = "", .value_len = 0 },
	};
	const char *mid = strdup(hash(s));
	is_int(meta_put_entries(s, p, 3, err, sizeof err), -EINVAL, "a batch with an extent past its allocation");
	ok(strstr(err, "entries[2] (m/3)") != NULL, "the error names the entry: %s", err);
	is_str(hash(s), mid, "and nothing changed");
	ok(!meta_resolve(s, META_AREA_META, "m"), "not even a directory");
	p[2].size = 5;
	p[2].flags = 4;
	is_int(meta_put_entries(s, p, 3, err, sizeof err), -EINVAL, "an unknown flag");
	p[2].flags = GMSFS_ENTRY_PRIVATE;
	p[1].alloc = "b/none";
	is_int(meta_put_entries(s, p, 3, err, sizeof err), -EINVAL, "an allocation that does not exist");
	ok(strstr(err, "entries[1] (cfg/k)") && strstr(err, "b/none"), "named: %s", err);
	p[1].alloc = "b/y/z";
	is_int(meta_put_entries(s, p, 3, err, sizeof err), 0, "the corrected batch is put whole");
	struct meta_node *k = meta_resolve(s, META_AREA_META, "cfg/k"), *m3 = meta_resolve(s, META_AREA_META, "m/3");
	ok(k && k->value_len == 8 && !memcmp(k->value, "replaced", 8) && !strcmp(k->alloc, "b/y/z") && k->offset == 4 &&
	   k->extent == 0 && k->flags == 0, "an existing key is replaced, every field");
	ok(m3 && m3->extent == 5 && m3->flags == GMSFS_ENTRY_PRIVATE, "a new one has its extent and flags");

	const char *del[2] = { "m/1", "m/nope" };
	is_int(meta_delete_entries(s, del, 2, err, sizeof err), -ENOENT, "deleting a key that does not exist");
	ok(meta_resolve(s, META_AREA_META, "m/1") != NULL, "refused whole: m/1 is still there");
	is_int(meta_delete_entries(s, del, 1, err, sizeof err), 0, "deleting m/1");

	const char *gone[1] = { "b/x" };
	is_int(meta_free_allocs(s, gone, 1, err, sizeof err), 0, "freeing b/x");
	ok(!meta_resolve(s, META_AREA_ALLOCS, "b/x") && !meta_resolve(s, META_AREA_META, "m/3") &&
	   meta_resolve(s, META_AREA_META, "cfg/k"), "takes the entries naming it, and only those");
	const char *none[1] = { "b/none" };
	is_int(meta_free_allocs(s, none, 1, err, sizeof err), -ENOENT, "freeing what does not exist");
	const char *trailing[] = { "w/a/" };
	is_int(meta_free_allocs(s, trailing, 1, err, sizeof err), -EINVAL, "free: a path with a trailing / is refused");
	is_int(meta_delete_entries(s, trailing, 1, err, sizeof err), -EINVAL, "delete: a key with a trailing / is refused");
	meta_rollback(s);
	is_str(hash(s), VECTOR, "a rollback undoes every batch (and all since the commit)");
	free((void *)before);
	free((void *)mid);
}


/* The layout hash the plain way, for the encoding in gmsfs(5): every path gathered,
 * sorted, and each field given to XXH3 as it comes. */
struct ref_item { char path[GMSFS_PATH_MAX + 1]; const struct meta_node *n; };
struct ref_items { struct ref_item *v; size_t n; enum meta_kind kind; };

static int ref_gather(struct meta_node *n, void *arg)
{
	struct ref_items *it = arg;
	if (n->kind == it->kind)
		meta_path(n, it->v[it->n++].path, sizeof it->v->path), it->v[it->n - 1].n = n;
	return 0;
}

static int ref_by_path(const void *a, const void *b)
{
	return strcmp(((const struct ref_item *)a)->path, ((const struct ref_item *)b)->path);
}

static void ref_u(XXH3_state_t *st, uint64_t v, int bytes)
{
	uint8_t b[8];
	for (int i = 0; i < bytes; i++)
		b[i] = v >> (8 * i);
	XXH3_128bits_update(st, b, (size_t)bytes);
}

static void ref_bytes(XXH3_state_t *st, const char *p, size_t len)
{
	ref_u(st, len, 4);
	XXH3_128bits_update(st, p, len);
}

static const char *ref_hash(struct meta_store *s, size_t most)
{
	struct ref_items a = { calloc(most, sizeof *a.v), 0, META_ALLOC }, e = { calloc(most, sizeof *e.v), 0, META_ENTRY };
	meta_walk(meta_root(s, META_AREA_ALLOCS), ref_gather, &a);
	meta_walk(meta_root(s, META_AREA_META), ref_gather, &e);
	qsort(a.v, a.n, sizeof *a.v, ref_by_path);
	qsort(e.v, e.n, sizeof *e.v, ref_by_path);
	XXH3_state_t *st = XXH3_createState();
	XXH3_128bits_reset(st);
	XXH3_128bits_update(st, "GMSFSLH2", 8);
	ref_u(st, a.n, 8);
	for (size_t i = 0; i < a.n; i++) {
		ref_bytes(st, a.v[i].path, strlen(a.v[i].path));
		ref_u(st, a.v[i].n->size, 8);
		ref_bytes(st, a.v[i].n->tag ? a.v[i].n->tag : "", a.v[i].n->tag ? strlen(a.v[i].n->tag) : 0);
	}
	ref_u(st, e.n, 8);
	for (size_t i = 0; i < e.n; i++) {
		const struct meta_node *n = e.v[i].n;
		ref_bytes(st, e.v[i].path, strlen(e.v[i].path));
		ref_bytes(st, n->alloc ? n->alloc : "", n->alloc ? strlen(n->alloc) : 0);
		ref_u(st, n->offset, 8);
		ref_u(st, n->extent, 8);
		ref_u(st, n->flags, 4);
		ref_bytes(st, n->value ? n->value : "", n->value_len);
	}
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
	XXH3_freeState(st);
	free(a.v), free(e.v);
	for (int i = 0; i < 16; i++)
		sprintf(hex + 2 * i, "%02x", c.digest[i]);
	return hex;
}

/* Thousands of items whose encoding crosses the hash's buffer many times, names that sort
 * differently as paths than as names ("a.b" before "a/x"), and values of every length up
 * to one larger than that buffer: the same hash as the plain way. */
static void big_layout_hash(void)
{
	struct meta_store *s = meta_store_new(release_buf, NULL);
	char err[512], name[64], *v = malloc(200000);
	const char *parts[] = { "a", "a.b", "a-c", "a0", "b", "A" };
	for (int i = 0; i < 200000; i++)
		v[i] = (char)('a' + i % 26);
	struct meta_new_alloc w[2] = { { .path = "w/a", .size = 4096, .aligned = 4096, .buf = malloc(1) },
				       { .path = "w/b", .tag = "kv", .size = 64, .aligned = 4096, .buf = malloc(1) } };
	int made = 2 * !meta_create_allocs(s, w, 2, err, sizeof err);
	for (int i = 0; i < 3000; i++) {
		snprintf(name, sizeof name, "%s/%s/%d", parts[i % 6], parts[(i / 6) % 6], i);
		struct entry_rec p = { .key = name, .alloc = i % 7 ? "w/a" : "w/b", .offset = (uint64_t)(i % 50),
				      .size = i % 3 ? 10 : 0, .flags = i % 5 ? 0 : GMSFS_ENTRY_PRIVATE,
				      .value = v, .value_len = i == 1234 ? 200000 : (uint32_t)(i % 301) };
		made += !meta_put_entries(s, &p, 1, err, sizeof err);
	}
	for (int i = 0; i < 500; i++) {
		snprintf(name, sizeof name, "%s/%d", parts[i % 6], i);
		struct meta_new_alloc a = { .path = name, .tag = i % 2 ? "t" : NULL, .size = 100 + (uint64_t)i,
					    .aligned = 4096, .buf = malloc(1) };
		made += !meta_create_allocs(s, &a, 1, err, sizeof err);
	}
	is_int(made, 3502, "3000 entries and 502 allocations, paths that sort unlike their names");
	char want[33];
	snprintf(want, sizeof want, "%s", ref_hash(s, 4000));
	is_str(hash(s), want, "the layout hash equals the plain way's, value of 200,000 bytes included");
	meta_store_free(s);
	free(v);
}

/* Version names (gmsfs(5), NAMED VERSIONS): what a commit may be called, and its
 * "GENERATION NAME". */
static void version_names(void)
{
	char name[META_VERSION_NAME_MAX + 1];
	uint64_t g = 0;
	ok(!meta_version_name("step-1200\n", 10, name) && !strcmp(name, "step-1200"), "a name, its newline dropped");
	ok(!meta_version_name("v1.2_rc+3:a@b", 13, name), "dots, underscores, dashes, colons, pluses, at signs");
	const char *bad[] = { "", "-step", ".hidden", "a b", "a/b", "tab\t", "\n" };
	int refused = 0;
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
		refused += meta_version_name(bad[i], strlen(bad[i]), name) == -EINVAL;
	is_int(refused, 7, "empty, a leading dash or dot, spaces, slashes, control characters: refused");
	char longest[META_VERSION_NAME_MAX + 2];
	memset(longest, 'x', sizeof longest);
	ok(!meta_version_name(longest, META_VERSION_NAME_MAX, name) &&
		   meta_version_name(longest, META_VERSION_NAME_MAX + 1, name) == -EINVAL, "64 characters at most");
	ok(!meta_version_parse("12 step-1200", 12, &g, name) && g == 12 && !strcmp(name, "step-1200"),
	   "\"GENERATION NAME\"");
	const char *badv[] = { "0 a", "012 a", "12", "12 ", " 12 a", "x a", "99999999999999999999999 a", "1 a b" };
	refused = 0;
	for (size_t i = 0; i < sizeof badv / sizeof *badv; i++)
		refused += meta_version_parse(badv[i], strlen(badv[i]), &g, name) == -EINVAL;
	is_int(refused, 8, "generation 0, leading zeros, no name, an overflow, two words: refused");
}

int main(void)
{
	char err[512];
	struct meta_store *s = vector(0);
	is_str(hash(s), VECTOR, "test vector (also in gmsfs(5), recomputed there with xxhsum -H2)");
	struct meta_store *t = vector(1);
	is_str(hash(t), VECTOR, "same layout built in another order, same hash");
	meta_store_free(t);
	big_layout_hash();

	/* Each field moves the digest. */
	struct { const char *what; void (*change)(struct meta_store *); } cases[] = {
		{ "allocation size", NULL }, { "allocation path", NULL }, { "tag", NULL },
		{ "key", NULL }, { "entry's allocation", NULL }, { "offset", NULL }, { "value", NULL },
		{ "extent size", NULL }, { "private flag", NULL },
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct meta_store *u = meta_store_new(release_buf, NULL);
		alloc(u, i == 1 ? "w/A" : "w/a", 4096, i == 2 ? "weightz" : "weights");
		alloc(u, "w/b", i == 0 ? 101 : 100, NULL);
		vector_entry(u, i == 3 ? "cfg/K" : "cfg/k", i == 4 ? "w/b" : (i == 1 ? "w/A" : "w/a"),
			     i == 5 ? "17" : "16", i == 6 ? "hellO" : "hello", i == 7 ? "63" : "64", i == 8 ? "0" : "1");
		ok(strcmp(hash(u), VECTOR) != 0, "changing the %s changes the hash", cases[i].what);
		meta_store_free(u);
	}
	{
		/* A note (GMSFS_ENTRY_NOTE) is left out, whatever it says; the same entry
		 * without the flag is hashed. */
		struct meta_store *u = vector(0);
		struct meta_node *n = entry(u, "gms/ids", NULL, "0", "token-1");
		meta_entry_set_flag(n, GMSFS_ENTRY_NOTE, "1", 1);
		is_str(hash(u), VECTOR, "a note leaves the hash as it is");
		meta_entry_write(n, 0, "token-2", 7);
		is_str(hash(u), VECTOR, "so does a note's new value");
		meta_entry_set_flag(n, GMSFS_ENTRY_NOTE, "0", 1);
		ok(strcmp(hash(u), VECTOR) != 0, "the same entry, not a note, moves it");
		meta_store_free(u);
	}
	struct meta_store *empty = meta_store_new(release_buf, NULL);
	ok(strcmp(hash(empty), VECTOR) != 0, "the empty layout has its own hash");
	is_str(meta_hash_hex(empty), "", "no committed hash before the first commit");
	meta_store_free(empty);

	/* Commit publishes the hash; a bad entry is refused and names itself. */
	is_int(meta_commit(s, err, sizeof err), 0, "commit of the vector");
	is_str(meta_hash_hex(s), VECTOR, "committed hash");
	struct meta_node *bad = entry(s, "bad/past", "w/b", "100", "x");
	is_int(meta_commit(s, err, sizeof err), -EINVAL, "offset == size is refused");
	ok(strstr(err, "meta/bad/past") != NULL, "the error names the entry: %s", err);
	meta_entry_set_alloc(bad, "w/nope", 6);
	is_int(meta_commit(s, err, sizeof err), -EINVAL, "missing allocation is refused");
	ok(strstr(err, "w/nope") != NULL, "the error names the allocation: %s", err);
	is_str(meta_hash_hex(s), VECTOR, "refused commit leaves the committed hash");
	{
		/* Extents, on a store of their own: offset + size must stay inside. */
		struct meta_store *x = vector(0);
		struct meta_node *e = entry(x, "bad/past", "w/b", "90", "x");
		meta_entry_set_extent(e, "10", 2);
		is_int(meta_commit(x, err, sizeof err), 0, "an extent that ends at the allocation's end is accepted");
		meta_entry_set_extent(e, "11", 2);
		is_int(meta_commit(x, err, sizeof err), -EINVAL, "offset + size past the end is refused");
		ok(strstr(err, "meta/bad/past") && strstr(err, "size 11"), "the error names the entry and its size: %s", err);
		meta_entry_set_extent(e, "18446744073709551615", 20);
		is_int(meta_commit(x, err, sizeof err), -EINVAL, "an extent that would wrap around is refused");
		meta_store_free(x);
	}
	meta_entry_set_offset(bad, "99", 2);
	struct meta_node *unsized = alloc(s, "w/unsized", 0, NULL);
	meta_entry_set_alloc(bad, "w/b", 3);
	is_int(meta_commit(s, err, sizeof err), -EINVAL, "an allocation never sized is refused");
	ok(strstr(err, "w/unsized") != NULL, "the error names it: %s", err);
	(void)unsized;

	/* Rollback: back to exactly the committed layout; new memory freed once. */
	released = 0;
	struct meta_node *extra = alloc(s, "new/big", 1 << 20, NULL);
	meta_hold(extra); /* an open handle on it */
	struct meta_node *a = meta_resolve(s, META_AREA_ALLOCS, "w/a");
	meta_set_tag(a, "changed", 7);
	struct meta_node *k = meta_resolve(s, META_AREA_META, "cfg/k");
	meta_entry_write(k, 0, "HELLO, longer", 13);
	is_int(meta_remove(meta_resolve(s, META_AREA_ALLOCS, "w/b")), 0, "remove w/b in the session");
	ok(meta_resolve(s, META_AREA_ALLOCS, "w/b") == NULL, "w/b is gone from the live layout");
	meta_rollback(s);
	is_str(hash(s), VECTOR, "rollback restores the committed layout");
	ok(meta_resolve(s, META_AREA_ALLOCS, "w/b") != NULL, "removed allocation is back");
	ok(meta_resolve(s, META_AREA_ALLOCS, "w/unsized") == NULL, "allocation of the session is gone");
	ok(meta_resolve(s, META_AREA_META, "bad") == NULL, "directory of the session is gone");
	is_int(released, 0, "memory still held by an open handle stays");
	ok(!extra->linked, "the held node is out of the layout (its handle answers ESTALE)");
	meta_drop(extra);
	is_int(released, 1, "memory released when the handle goes, exactly once");
	struct meta_stats st;
	meta_stats(s, &st);
	is_int(st.allocations, 2, "two allocations counted");
	is_int(st.entries, 1, "one entry counted");
	is_int(st.bytes, 4196, "bytes counted");

	/* A rollback that finds nothing changed does nothing (a writer that opens and closes
	 * costs O(1)); so every single kind of change must count as one. */
	for (int c = 0; c < 13; c++) {
		struct meta_store *u = vector(0);
		is_int(meta_commit(u, err, sizeof err), 0, "change %d: committed", c);
		meta_rollback(u);
		is_str(hash(u), VECTOR, "change %d: a rollback with nothing changed keeps the layout", c);
		struct meta_node *ka = meta_resolve(u, META_AREA_ALLOCS, "w/a");
		struct meta_node *kk = meta_resolve(u, META_AREA_META, "cfg/k");
		switch (c) {
		case 0: meta_set_tag(ka, "other", 5); break;
		case 1: meta_entry_set_alloc(kk, "w/b", 3); break;
		case 2: meta_entry_set_offset(kk, "8", 1); break;
		case 3: meta_entry_set_extent(kk, "8", 1); break;
		case 4: meta_entry_set_flag(kk, GMSFS_ENTRY_PRIVATE, "0", 1); break;
		case 5: meta_entry_write(kk, 0, "J", 1); break;
		case 6: meta_entry_truncate(kk, 2); break;
		case 7: meta_remove(kk); break;
		case 8: alloc(u, "w/new", 10, NULL); break;
		case 9: meta_entry_unset(kk, META_ATTR_ALLOC); break;   /* removexattr */
		case 10: meta_entry_unset(kk, META_ATTR_OFFSET); break;
		case 11: meta_entry_unset(kk, META_ATTR_EXTENT); break;
		case 12: meta_entry_unset(kk, META_ATTR_PRIVATE); break;
		}
		ok(strcmp(hash(u), VECTOR) != 0, "change %d moves the live layout", c);
		meta_rollback(u);
		is_str(hash(u), VECTOR, "change %d alone is undone by a rollback", c);
		meta_store_free(u);
	}

	/* The undo log: a commit keeps no copy of the store; a committed node's first change
	 * saves its fields, sharing the strings (copy on write), and a write never touches
	 * what a rollback returns to. */
	{
		struct meta_store *u = vector(0);
		struct meta_node *kk = meta_resolve(u, META_AREA_META, "cfg/k");
		struct meta_node *ka = meta_resolve(u, META_AREA_ALLOCS, "w/a");
		ok((kk->marks & META_NEW) && (ka->marks & META_NEW), "undo: before the first commit every node is new");
		is_int(meta_commit(u, err, sizeof err), 0, "undo: committed");
		ok(!kk->marks && !ka->marks && !ka->parent->marks, "undo: a commit leaves no marks and no record");
		const char *was = kk->value, *path = kk->alloc;
		is_int(meta_entry_set_offset(kk, "8", 1), 0, "undo: a first change");
		ok((kk->marks & (META_SHARED_VALUE | META_SAVED)) == (META_SHARED_VALUE | META_SAVED) && kk->value == was &&
		   kk->alloc == path, "undo: it saved the entry's fields, sharing its value and allocation path");
		is_int(meta_entry_write(kk, 1, "E", 1), 0, "undo: write into a shared value");
		ok(kk->value != was && !(kk->marks & META_SHARED_VALUE) && !memcmp(kk->value, "hEllo", 5),
		   "undo: the write went to a copy of it");
		is_int(meta_commit(u, err, sizeof err), 0, "undo: a second commit");
		ok(!kk->marks, "undo: the commit gave the strings back (valgrind and ASan: each freed once)");
		char second[33];
		snprintf(second, sizeof second, "%s", hash(u));
		meta_entry_truncate(kk, 1);
		meta_entry_write(kk, 3, "Z", 1);
		meta_entry_set_alloc(kk, "w/b", 3);
		meta_set_tag(ka, "other", 5);
		ok(!(kk->marks & META_SHARED_VALUE), "undo: every change let go of what it shared");
		struct meta_node *nd;
		is_int(meta_create(meta_root(u, META_AREA_META), "newdir", META_DIR, &nd), 0, "undo: a new directory");
		ok((nd->marks & META_NEW) && (meta_root(u, META_AREA_META)->marks & META_GREW), "undo: marked new, its parent grew");
		is_int(meta_create(nd, "e", META_ENTRY, NULL), 0, "undo: an entry in it");
		is_int(meta_remove(ka), 0, "undo: a committed allocation removed");
		is_int(meta_remove(meta_resolve(u, META_AREA_META, "cfg/k")), 0, "undo: and a committed entry");
		is_int(meta_remove(meta_resolve(u, META_AREA_META, "cfg")), 0, "undo: and its directory");
		meta_rollback(u);
		is_str(hash(u), second, "undo: the rollback returns to the last commit");
		ok(meta_resolve(u, META_AREA_META, "cfg/k") == kk && meta_resolve(u, META_AREA_ALLOCS, "w/a") == ka,
		   "undo: the same nodes are back");
		ok(!memcmp(kk->value, "hEllo", 5) && kk->value_len == 5 && !strcmp(ka->tag, "weights") && !kk->marks &&
		   !ka->marks, "undo: value, length and tag as committed, no marks left");
		ok(meta_resolve(u, META_AREA_META, "newdir") == NULL, "undo: the new directory is gone");
		meta_rollback(u);
		is_str(hash(u), second, "undo: and again");
		meta_store_free(u);
	}

	/* A committed entry unlinked while a handle holds it, then written through the handle:
	 * its save follows its removal in the log; commit and rollback free it once. */
	for (int again = 0; again < 2; again++) {
		struct meta_store *u = vector(0);
		is_int(meta_commit(u, err, sizeof err), 0, "undo: committed (%d)", again);
		struct meta_node *kk = meta_resolve(u, META_AREA_META, "cfg/k");
		meta_hold(kk);
		is_int(meta_remove(kk), 0, "undo: a held entry removed");
		is_int(meta_entry_write(kk, 0, "X", 1), 0, "undo: and written through its handle");
		meta_drop(kk);
		if (again) {
			meta_rollback(u);
			is_str(hash(u), VECTOR, "undo: the rollback brings it back as committed");
		} else {
			is_int(meta_commit(u, err, sizeof err), 0, "undo: the commit lets it go (valgrind, ASan: once)");
		}
		meta_store_free(u);
	}

	/* Interned strings: the entries that name one allocation share one copy of its path,
	 * the allocations one copy of a tag; a node the kernel still knows keeps its own past
	 * the store's end (valgrind and ASan: every copy freed once). */
	{
		struct meta_store *u = vector(0);
		struct meta_graveyard g = {0};
		meta_set_graveyard(u, &g);
		struct meta_node *k1 = meta_resolve(u, META_AREA_META, "cfg/k");
		struct meta_node *k2 = entry(u, "cfg/k2", "w/a", "0", "x");
		ok(k1->alloc == k2->alloc && !strcmp(k2->alloc, "w/a"), "intern: two entries naming w/a share its path");
		struct meta_node *b = meta_resolve(u, META_AREA_ALLOCS, "w/b"), *c = alloc(u, "w/c", 10, NULL);
		ok(b->tag == c->tag && !strcmp(c->tag, "default"), "intern: two allocations share the tag default");
		is_int(meta_entry_set_alloc(k2, "w/b", 3), 0, "intern: a change");
		ok(k1->alloc != k2->alloc && !strcmp(k1->alloc, "w/a") && !strcmp(k2->alloc, "w/b"),
		   "intern: moves that entry alone");
		meta_lookup_ref(k2);
		meta_store_free(u);
		ok(!strcmp(k2->alloc, "w/b"), "intern: a node out of every store still reads its path");
		meta_forget(k2, 1);
		is_int(g.n, 0, "intern: and goes at its last forget");
		meta_graveyard_free(&g);
	}

	/* Validation of names, paths, offsets, tags, sizes. */
	struct meta_node *root = meta_root(s, META_AREA_ALLOCS), *n;
	is_int(meta_create(root, "..", META_ALLOC, &n), -EINVAL, "'..' refused");
	is_int(meta_create(root, "a/b", META_ALLOC, &n), -EINVAL, "'/' in a name refused");
	char longname[300];
	memset(longname, 'x', 299);
	longname[299] = 0;
	is_int(meta_create(root, longname, META_ALLOC, &n), -ENAMETOOLONG, "name over NAME_MAX refused");
	is_int(meta_create(root, "w", META_DIR, &n), -EEXIST, "existing name refused");
	is_int(meta_create(root, "e", META_ENTRY, &n), -EPERM, "an entry under allocs/ refused");
	is_int(meta_create(meta_root(s, META_AREA_META), "x", META_ALLOC, &n), -EPERM, "an allocation under meta/ refused");
	const char *badpaths[] = { "", "/abs", "a//b", "a/", "./a", "a/../b", ".." };
	for (size_t i = 0; i < sizeof badpaths / sizeof *badpaths; i++)
		is_int(meta_entry_set_alloc(k, badpaths[i], strlen(badpaths[i])), -EINVAL, "alloc path '%s' refused", badpaths[i]);
	ok(gmsfs_path_valid("a/b.c/d", 7), "a plain nested path is fine");
	const char *badoff[] = { "", "-1", "12a", " 1", "0x10", "99999999999999999999", "123456789012345678901" };
	for (size_t i = 0; i < sizeof badoff / sizeof *badoff; i++)
		is_int(meta_entry_set_offset(k, badoff[i], strlen(badoff[i])), -EINVAL, "offset '%s' refused", badoff[i]);
	is_int(k->offset, 16, "refused offsets changed nothing");
	is_int(meta_entry_set_flag(k, GMSFS_ENTRY_PRIVATE, "2", 1), -EINVAL, "private '2' refused");
	is_int(meta_entry_set_flag(k, GMSFS_ENTRY_PRIVATE, "11", 2), -EINVAL, "private '11' refused");
	is_int(meta_entry_set_extent(k, "1e3", 3), -EINVAL, "size '1e3' refused");
	is_int(k->extent, 64, "refused sizes changed nothing");
	is_int(meta_set_tag(a, "", 0), -EINVAL, "empty tag refused");
	is_int(meta_set_tag(a, "a\nb", 3), -EINVAL, "control character in a tag refused");
	is_int(meta_alloc_size(a, 8192, 8192, NULL), -EPERM, "a second size refused");
	is_int(meta_entry_write(k, GMSFS_VALUE_MAX, "x", 1), -EFBIG, "value past the limit refused");
	is_int(meta_remove(meta_resolve(s, META_AREA_ALLOCS, "w")), -ENOTEMPTY, "non-empty directory stays");

	/* Many names: the directory index grows and deletes correctly. */
	struct meta_node *big;
	meta_create(root, "many", META_DIR, &big);
	char name[32];
	int made = 0, found = 0, gone = 0;
	for (int i = 0; i < 5000; i++) {
		snprintf(name, sizeof name, "t%d", i);
		made += meta_create(big, name, META_ALLOC, NULL) == 0;
	}
	for (int i = 0; i < 5000; i += 2) {
		snprintf(name, sizeof name, "t%d", i);
		meta_remove(meta_lookup(big, name));
	}
	for (int i = 0; i < 5000; i++) {
		snprintf(name, sizeof name, "t%d", i);
		if (i % 2)
			found += meta_lookup(big, name) != NULL;
		else
			gone += meta_lookup(big, name) == NULL;
	}
	is_int(made, 5000, "5000 names created");
	is_int(found, 2500, "the odd ones are found after removing the even ones");
	is_int(gone, 2500, "the even ones are gone");
	is_int(big->nkids, 2500, "2500 children listed");

	batches(s);
	version_names();

	released = 0;
	meta_store_free(s);
	is_int(released, 2, "freeing the store releases the committed memory");
	return tap_done();
}
