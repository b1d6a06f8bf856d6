/* intern: counted strings, one copy per store of each. */
#ifndef GMSFS_META_INTERN_H
#define GMSFS_META_INTERN_H
#include <stddef.h>

struct meta_str;  /* intern.c */
struct meta_strtab { void **v; size_t n, cap; }; /* struct meta_str *, by content (common/probe.h) */

/* p's len bytes, interned in t (NULL t: a string of its own); NULL: out of memory. */
char *meta_intern(struct meta_strtab *t, const char *p, size_t len);
char *meta_ref(char *p);                   /* one more reference; p may be NULL */
void meta_unref(char *p);                  /* the last frees; p may be NULL */
void meta_strtab_free(struct meta_strtab *t); /* strings still held outlive it */

#endif
