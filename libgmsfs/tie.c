/* tie: a KV cache's pages tied to the weights that computed them (gmsfs_pages_tie,
 * libgmsfs(3) KEPT).  The weights are named by their store (its path and inode), the
 * commit the engine's read lock holds (layout hash and generation: any change of bytes is
 * a commit; its version name, where it has one) and, where the daemon knows it, the
 * content hash; each keep puts that text
 * in a note beside a mapped page, and an adopter compares it with its own weights before
 * it takes the pages: pages computed by other weights are never reused silently. */
#include "tie.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include "pages_held.h"

/* The version name of the commit w holds, from user.gms.version ("GENERATION NAME": the
 * store's last commit), into name; "none" where that is another commit or has none. */
static void version_of(gmsfs *w, char name[GMSFS_VERSION_NAME_MAX + 1])
{
	char v[GMSFS_VERSION_NAME_MAX + 32];
	unsigned long long gen;
	ssize_t n = getxattr(w->dir, GMSFS_XATTR_VERSION, v, sizeof v - 1);
	v[n > 0 ? n : 0] = '\0';
	if (n <= 0 || sscanf(v, "%llu %64s", &gen, name) != 2 || gen != gmsfs_generation(w))
		snprintf(name, GMSFS_VERSION_NAME_MAX + 1, "none");
}

/* The text that names the weights w holds: "store PATH\nino N\nlayout_hash HEX\n
 * generation N\nversion NAME|none\ncontent_hash HEX|unknown\n".  0 or -errno (said in g). */
static int identity(gmsfs *g, gmsfs *w, char **out)
{
	char path[PATH_MAX], hash[33], content[33], version[GMSFS_VERSION_NAME_MAX + 1];
	struct stat st;
	if (!realpath(w->dir, path) || stat(path, &st))
		return gm_error(g, -errno, "pages_tie: %s: %s", w->dir, strerror(errno));
	if (!w->lock)
		return gm_error(g, -EINVAL, "pages_tie: the weights' handle holds no lock (its commit is not fixed)");
	int e = gmsfs_layout_hash(w, hash);
	if (e)
		return gm_error(g, e, "pages_tie: the weights' layout hash: %s", gmsfs_errmsg(w));
	uint64_t gen = gmsfs_generation(w);
	if (gmsfs_content_hash(w, content)) /* the daemon's word, for this very commit */
		snprintf(content, sizeof content, "unknown");
	version_of(w, version);
	if (asprintf(out, "store %s\nino %llu\nlayout_hash %s\ngeneration %" PRIu64 "\nversion %s\ncontent_hash %s\n",
		     path, (unsigned long long)st.st_ino, hash, gen, version, content) < 0)
		return gm_error(g, -ENOMEM, "out of memory");
	return 0;
}

/* A line's value in an identity text ("" when it has none). */
static void field(const char *text, const char *key, char *out, size_t len)
{
	size_t k = strlen(key);
	out[0] = '\0';
	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (!strncmp(l, key, k) && l[k] == ' ') {
			const char *end = strchr(l, '\n');
			size_t n = end ? (size_t)(end - l - k - 1) : strlen(l + k + 1);
			snprintf(out, len, "%.*s", (int)(n < len ? n : len - 1), l + k + 1);
			return;
		}
}

/* Do identity texts a and b name the same weights: the store, its commit?  (Their version
 * names are the commits'; their content hashes, where both are known, must agree too.) */
static bool same_weights(const char *a, const char *b)
{
	static const char *const same[] = { "store", "ino", "layout_hash", "generation" };
	char x[PATH_MAX], y[PATH_MAX];
	for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
		field(a, same[i], x, sizeof x);
		field(b, same[i], y, sizeof y);
		if (strcmp(x, y))
			return false;
	}
	field(a, "content_hash", x, sizeof x);
	field(b, "content_hash", y, sizeof y);
	return !strcmp(x, "unknown") || !strcmp(y, "unknown") || !strcmp(x, y);
}

/* The weights changed under the pages mapped now: each is old, and its record (the
 * engine's word on its bytes, computed with the weights before) is cleared at the next
 * keep, which puts its entry again (PG_ENTRY dropped). */
static void mark_old(gmsfs *g)
{
	for (gmsfs_pages *q = g->pages; q; q = q->next)
		for (uint64_t i = 0; !q->freed && i < q->count; i++)
			if (q->mapped[i] & PG_MAPPED) {
				q->mapped[i] = (uint8_t)((q->mapped[i] | PG_OLD) & ~PG_ENTRY);
				pg_forget_record(q, i);
			}
}

int gmsfs_pages_tie(gmsfs *g, gmsfs *weights)
{
	if (!g)
		return -EINVAL;
	char *id = NULL;
	int e = weights ? identity(g, weights, &id) : 0;
	if (e)
		return e;
	if (g->tie && id && !same_weights(g->tie, id))
		mark_old(g);
	g->untied = !weights && g->tie;
	free(g->tie);
	g->tie = id;
	return 0;
}

int gmsfs_pages_old(gmsfs_pages *p, uint64_t *idx, size_t cap, size_t *n)
{
	if (!p || !n || (cap && !idx))
		return -EINVAL;
	*n = 0;
	for (uint64_t i = 0; !p->freed && i < p->count; i++)
		if ((p->mapped[i] & (PG_MAPPED | PG_OLD)) == (PG_MAPPED | PG_OLD)) {
			if (*n < cap)
				idx[*n] = i;
			(*n)++;
		}
	return 0;
}

int gmsfs_pages_tied(gmsfs *g, gmsfs *weights)
{
	if (!g || !weights)
		return g ? gm_error(g, -EINVAL, "pages_tied: no weights") : -EINVAL;
	struct gmsfs_meta m = { 0 };
	char **keys = NULL;
	size_t kept_pages = 0;
	if (gmsfs_meta_get(g, GMSFS_PAGES_WEIGHTS_NOTE, &m)) {
		int e = gmsfs_meta_list(g, GMSFS_PAGES_PREFIX, &keys, &kept_pages);
		gmsfs_list_free(keys, kept_pages);
		if (e || !kept_pages) /* nothing kept: nothing computed by other weights */
			return e;
		return gm_error(g, -ENOENT, "the kept pages were kept without gmsfs_pages_tie: nothing says which "
				"weights computed them");
	}
	char *kept = strndup(m.value, m.value_len), *now = NULL;
	gmsfs_meta_free(&m);
	int e = kept ? identity(g, weights, &now) : gm_error(g, -ENOMEM, "out of memory");
	if (!e && !same_weights(kept, now))
		e = -ESTALE;
	if (e == -ESTALE) {
		char ks[PATH_MAX], kg[32], kv[80], ns[PATH_MAX], ng[32], nv[80];
		field(kept, "store", ks, sizeof ks), field(kept, "generation", kg, sizeof kg), field(kept, "version", kv, sizeof kv);
		field(now, "store", ns, sizeof ns), field(now, "generation", ng, sizeof ng), field(now, "version", nv, sizeof nv);
		gm_error(g, -ESTALE, "the kept pages were computed with the weights of %s at commit %s (version %s); these "
			 "are %s at commit %s (version %s): other weights, the pages are not theirs", ks, kg,
			 kv[0] ? kv : "none", ns, ng, nv[0] ? nv : "none");
	}
	free(kept);
	free(now);
	return e;
}

int tie_put(gmsfs *g, const char *alloc)
{
	if (g->untied) {
		int e = gmsfs_meta_delete(g, GMSFS_PAGES_WEIGHTS_NOTE);
		if (e && e != -ENOENT)
			return e;
		g->untied = false;
	}
	if (!g->tie)
		return 0;
	char name[96] = "";
	for (gmsfs_pages *q = g->pages; !alloc && q; q = q->next)
		for (uint64_t i = 0; !q->freed && i < q->count && !alloc; i++)
			if (q->mapped[i] & PG_MAPPED) {
				snprintf(name, sizeof name, "%s/%" PRIu64, q->prefix, q->name[i]);
				alloc = name;
			}
	if (!alloc)
		return 0; /* no page: nothing kept to tie */
	struct gmsfs_entry note = { .key = GMSFS_PAGES_WEIGHTS_NOTE, .alloc = alloc, .flags = GMSFS_ENTRY_NOTE,
				    .value = g->tie, .value_len = strlen(g->tie) };
	return gmsfs_meta_put_many(g, &note, 1);
}
