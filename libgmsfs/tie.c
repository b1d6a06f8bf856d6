/* tie: a KV cache's pages tied to the weights that computed them (gmsfs_pages_tie,
 * libgmsfs(3) KEPT).  The weights are named by their store (its path and inode), the
 * commit the engine's read lock holds (layout hash and generation: any change of bytes is
 * a commit) and, where the daemon knows it, the content hash; each keep puts that text
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

#include "pages_held.h"

/* The text that names the weights w holds: "store PATH\nino N\nlayout_hash HEX\n
 * generation N\ncontent_hash HEX|unknown\n".  0 or -errno (said in g). */
static int identity(gmsfs *g, gmsfs *w, char **out)
{
	char path[PATH_MAX], hash[33], content[33];
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
	if (asprintf(out, "store %s\nino %llu\nlayout_hash %s\ngeneration %" PRIu64 "\ncontent_hash %s\n", path,
		     (unsigned long long)st.st_ino, hash, gen, content) < 0)
		return gm_error(g, -ENOMEM, "out of memory");
	return 0;
}

int gmsfs_pages_tie(gmsfs *g, gmsfs *weights)
{
	if (!g)
		return -EINVAL;
	char *id = NULL;
	int e = weights ? identity(g, weights, &id) : 0;
	if (e)
		return e;
	g->untied = !weights && g->tie;
	free(g->tie);
	g->tie = id;
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
	static const char *const same[] = { "store", "ino", "layout_hash", "generation" };
	char a[PATH_MAX], b[PATH_MAX];
	for (size_t i = 0; !e && i < sizeof same / sizeof same[0]; i++) {
		field(kept, same[i], a, sizeof a);
		field(now, same[i], b, sizeof b);
		if (strcmp(a, b))
			e = -ESTALE;
	}
	field(kept, "content_hash", a, sizeof a); /* where both are known, they agree too */
	field(now ? now : "", "content_hash", b, sizeof b);
	if (!e && strcmp(a, "unknown") && strcmp(b, "unknown") && strcmp(a, b))
		e = -ESTALE;
	if (e == -ESTALE) {
		char ks[PATH_MAX], kg[32], ns[PATH_MAX], ng[32];
		field(kept, "store", ks, sizeof ks), field(kept, "generation", kg, sizeof kg);
		field(now, "store", ns, sizeof ns), field(now, "generation", ng, sizeof ng);
		gm_error(g, -ESTALE, "the kept pages were computed with the weights of %s at commit %s; these are %s at "
			 "commit %s: other weights, the pages are not theirs", ks, kg, ns, ng);
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
