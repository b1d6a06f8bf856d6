/* intern: the strings that many nodes repeat (an entry's allocation path, an
 * allocation's tag), kept once per store and counted: a million entries that name
 * one allocation hold one copy of its path.  A node's field points at the bytes,
 * so readers see a plain string; only meta_ref and meta_unref know the header. */
#include "intern.h"
#include "hash.h"
#include "probe.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct meta_str {
	struct meta_strtab *tab; /* the store's table; NULL once the store is gone */
	uint32_t refs;
	uint32_t len;
	char s[];
};

static struct meta_str *str_of(const char *p)
{
	return (struct meta_str *)(p - offsetof(struct meta_str, s));
}

static uint64_t str_home(const void *p, const void *ctx)
{
	const struct meta_str *x = p;
	return name_hash_len(x->s, x->len);
}

static struct meta_str *str_new(struct meta_strtab *t, const char *p, size_t len)
{
	struct meta_str *x = malloc(sizeof *x + len + 1);
	if (!x)
		return NULL;
	*x = (struct meta_str){ .tab = t, .refs = 1, .len = (uint32_t)len };
	memcpy(x->s, p, len);
	x->s[len] = '\0';
	return x;
}

char *meta_intern(struct meta_strtab *t, const char *p, size_t len)
{
	if (!t) { /* a node out of every store: a string of its own */
		struct meta_str *x = str_new(NULL, p, len);
		return x ? x->s : NULL;
	}
	if ((t->n + 1) * 4 > t->cap * 3 && probe_grow(&t->v, &t->cap, 16, str_home, NULL)) /* at most 3/4 full */
		return NULL;
	size_t mask = t->cap - 1, i = name_hash_len(p, len) & mask;
	for (; t->v[i]; i = (i + 1) & mask) {
		struct meta_str *x = t->v[i];
		if (x->len == len && !memcmp(x->s, p, len)) {
			x->refs++;
			return x->s;
		}
	}
	struct meta_str *x = str_new(t, p, len);
	if (!x)
		return NULL;
	t->v[i] = x;
	t->n++;
	return x->s;
}

char *meta_ref(char *p)
{
	if (p)
		str_of(p)->refs++;
	return p;
}

void meta_unref(char *p)
{
	if (!p)
		return;
	struct meta_str *x = str_of(p);
	if (--x->refs)
		return;
	struct meta_strtab *t = x->tab;
	if (t) {
		size_t mask = t->cap - 1, i = str_home(x, NULL) & mask;
		while (t->v[i] != x)
			i = (i + 1) & mask;
		probe_del(t->v, t->cap, i, str_home, NULL);
		t->n--;
	}
	free(x);
}

void meta_strtab_free(struct meta_strtab *t)
{
	/* Nodes that outlive their store (the kernel still knows them) keep their strings. */
	for (size_t i = 0; i < t->cap; i++)
		if (t->v[i])
			((struct meta_str *)t->v[i])->tab = NULL;
	free(t->v);
	*t = (struct meta_strtab){0};
}
