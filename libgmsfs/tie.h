/* tie: a KV cache's pages tied to the weights that computed them (tie.c). */
#ifndef GMSFS_LIB_TIE_H
#define GMSFS_LIB_TIE_H

#include "internal.h"

/* At a keep, before its commit: the tie's note beside a mapped page (alloc, or the first
 * one mapped), or the note deleted where the tie was taken back.  0 or -errno. */
int tie_put(gmsfs *g, const char *alloc);

#endif
