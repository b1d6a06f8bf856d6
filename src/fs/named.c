/* named: a store's named versions (named.h). */
#include "named.h"
#include "version_name.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const struct store_name *last_named(const struct store *st)
{
	return st->named.n ? &st->named.past[st->named.n - 1] : NULL;
}

const char *named_current(const struct store *st, const char **why)
{
	const struct fsm *f = &store_lock(st)->fsm;
	const struct store_name *l = last_named(st);
	*why = !f->committed ? "nothing is committed"
	       : f->torn     ? "the store is torn: a writer wrote into its bytes and did not commit"
	       : !l || l->generation != f->generation ? "the last commit was not named"
						     : NULL;
	return *why ? NULL : l->name;
}

int named_text(const struct store *st, char **out, size_t *len)
{
	const char *why, *name = named_current(st, &why);
	int n = name ? asprintf(out, "%s\n", name) : asprintf(out, "none: %s\n", why);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

int named_list_text(const struct store *st, char **out, size_t *len)
{
	const struct fsm *f = &store_lock(st)->fsm;
	const struct store_versions *v = &st->versions;
	char *text = NULL;
	size_t size = 0;
	FILE *fp = open_memstream(&text, &size);
	if (!fp)
		return -ENOMEM;
	for (size_t i = 0; i < st->named.n; i++) {
		const struct store_name *p = &st->named.past[i];
		fprintf(fp, "%llu %s ", (unsigned long long)p->generation, p->name);
		if (f->committed && !f->torn && p->generation == f->generation)
			fputs("serving\n", fp);
		else if (f->prev_held && v->prev_handles && p->generation == v->prev_generation)
			fprintf(fp, "held %u\n", v->prev_handles);
		else
			fputs("gone\n", fp);
	}
	if (fclose(fp)) {
		free(text);
		return -ENOMEM;
	}
	*out = text;
	*len = size;
	return 0;
}

void named_json(const struct store *st, FILE *f)
{
	const char *why, *name = named_current(st, &why);
	if (name) /* a name's characters need no escape */
		fprintf(f, ", \"version\": \"%s\"", name);
	else
		fputs(", \"version\": null", f);
}

int named_xattr_get(const struct store *st, char *buf, size_t size)
{
	const char *why, *name = named_current(st, &why);
	if (!name)
		return -ENODATA;
	return snprintf(buf, size, "%llu %s", (unsigned long long)store_lock(st)->fsm.generation, name);
}

int named_set_pending(struct store *st, const char *value, size_t size)
{
	char name[META_VERSION_NAME_MAX + 1];
	if (meta_version_name(value, size, name)) {
		store_error(st, "%s: a version name is " GMSFS_VERSION_NAME_WORDS, GMSFS_XATTR_VERSION);
		return -EINVAL;
	}
	for (size_t i = 0; i < st->named.n; i++)
		if (!strcmp(st->named.past[i].name, name)) {
			store_error(st, "%s: %s was committed as generation %llu: a name is the store's once",
				    GMSFS_XATTR_VERSION, name, (unsigned long long)st->named.past[i].generation);
			return -EEXIST;
		}
	memcpy(st->named.pending, name, sizeof name);
	return 0;
}

void named_drop_pending(struct store *st)
{
	st->named.pending[0] = '\0';
}

static void add(struct store *st, uint64_t generation, const char *name)
{
	struct store_named *n = &st->named;
	char copy[META_VERSION_NAME_MAX + 1]; /* name may be n->pending */
	snprintf(copy, sizeof copy, "%s", name);
	if (n->n == STORE_NAMED_KEEP) /* the oldest goes */
		memmove(&n->past[0], &n->past[1], (STORE_NAMED_KEEP - 1) * sizeof n->past[0]);
	else
		n->n++;
	n->past[n->n - 1].generation = generation;
	memcpy(n->past[n->n - 1].name, copy, sizeof copy);
}

void named_commit(struct store *st)
{
	if (st->named.pending[0])
		add(st, store_lock(st)->fsm.generation, st->named.pending);
	named_drop_pending(st);
}

char *named_history(const struct store *st)
{
	char *text = NULL;
	size_t size = 0;
	if (!st->named.n)
		return NULL;
	FILE *fp = open_memstream(&text, &size);
	if (!fp)
		return NULL;
	for (size_t i = 0; i < st->named.n; i++)
		fprintf(fp, "%llu %s\n", (unsigned long long)st->named.past[i].generation, st->named.past[i].name);
	if (fclose(fp)) {
		free(text);
		return NULL;
	}
	return text;
}

void named_restore(struct store *st, const char *text, size_t len)
{
	st->named.n = 0;
	for (size_t at = 0; at < len;) {
		const char *nl = memchr(text + at, '\n', len - at);
		size_t l = nl ? (size_t)(nl - (text + at)) : len - at;
		uint64_t gen;
		char name[META_VERSION_NAME_MAX + 1];
		/* Oldest first, each later than the one before and none after the image's
		 * commit: anything else is not an image's. */
		if (!meta_version_parse(text + at, l, &gen, name) && gen <= store_lock(st)->fsm.generation &&
		    (!st->named.n || gen > last_named(st)->generation))
			add(st, gen, name);
		at += l + 1;
	}
}
