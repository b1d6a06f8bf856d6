/* content: a store's content hash, as a client told it (content.h). */
#include "content.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const uint8_t *content_known(const struct store *st, const char **why)
{
	const struct fsm *f = &store_lock(st)->fsm;
	const struct store_content *c = &st->content;
	*why = !f->committed ? "nothing is committed"
	       : f->torn     ? "the store is torn: a writer wrote into its bytes and did not commit"
	       : f->in_place ? "a writer session writes into its bytes in place"
	       : f->leader && f->kept ? "an engine's kept session writes its pages (gmsfs(5), KEPT)"
	       : !c->set     ? "not computed for this commit (gmsfsctl digest STORE computes it)"
	       : c->generation != f->generation ? "committed again since it was computed (gmsfsctl digest STORE)"
					     : NULL;
	return *why ? NULL : c->hash;
}

static void hex_of(const uint8_t *h, char out[2 * GMSFS_HASH_LEN + 1])
{
	for (int i = 0; i < GMSFS_HASH_LEN; i++)
		snprintf(out + 2 * i, 3, "%02x", h[i]);
}

int content_text(const struct store *st, char **out, size_t *len)
{
	const char *why;
	const uint8_t *h = content_known(st, &why);
	char hex[2 * GMSFS_HASH_LEN + 1];
	if (h)
		hex_of(h, hex);
	int n = h ? asprintf(out, "%s\n", hex) : asprintf(out, "unknown: %s\n", why);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

void content_json(const struct store *st, FILE *f)
{
	const char *why;
	const uint8_t *h = content_known(st, &why);
	char hex[2 * GMSFS_HASH_LEN + 1];
	if (h) {
		hex_of(h, hex);
		fprintf(f, ", \"content_hash\": \"%s\"", hex);
	} else { /* why is one of content_known's words: nothing to escape */
		fprintf(f, ", \"content_hash\": null, \"content_hash_why\": \"%s\"", why);
	}
}

void content_label(const struct store *st, char out[2 * GMSFS_HASH_LEN + 1])
{
	const char *why;
	const uint8_t *h = content_known(st, &why);
	if (h)
		hex_of(h, out);
	else
		snprintf(out, 2 * GMSFS_HASH_LEN + 1, "unknown");
}

int content_xattr_get(const struct store *st, char *buf, size_t size)
{
	const char *why;
	const uint8_t *h = content_known(st, &why);
	if (!h)
		return -ENODATA;
	char hex[2 * GMSFS_HASH_LEN + 1];
	hex_of(h, hex);
	return snprintf(buf, size, "%llu %s", (unsigned long long)st->content.generation, hex);
}

int content_xattr_set(struct store *st, const char *value, size_t size)
{
	uint8_t h[GMSFS_HASH_LEN];
	uint64_t gen = 0;
	if (meta_content_parse(value, size, &gen, h)) {
		store_error(st, "%s: \"GENERATION HEX\" (the commit it was computed on, then 32 lowercase hex digits)",
			    GMSFS_XATTR_CONTENT);
		return -EINVAL;
	}
	const struct fsm *f = &store_lock(st)->fsm;
	if (!f->committed || gen != f->generation) {
		store_error(st, "%s: computed on generation %llu, the store's is %llu: compute it again", GMSFS_XATTR_CONTENT,
			    (unsigned long long)gen, (unsigned long long)f->generation);
		return -ESTALE;
	}
	if (f->torn) {
		store_error(st, "%s: the store is torn: its bytes are not the commit's", GMSFS_XATTR_CONTENT);
		return -EUCLEAN;
	}
	if (f->leader) {
		store_error(st, "%s: a writer session runs: the bytes may change under it", GMSFS_XATTR_CONTENT);
		return -EBUSY;
	}
	st->content = (struct store_content){ .set = true, .generation = gen };
	memcpy(st->content.hash, h, sizeof h);
	return 0;
}

void content_forget(struct store *st)
{
	st->content.set = false;
}

void content_restore(struct store *st, uint64_t generation, const uint8_t hash[GMSFS_HASH_LEN])
{
	if (!generation || generation != store_lock(st)->fsm.generation)
		return;
	st->content = (struct store_content){ .set = true, .generation = generation };
	memcpy(st->content.hash, hash, GMSFS_HASH_LEN);
}
