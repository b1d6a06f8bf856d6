/* What the wire parsers' files link against but the fuzz target never calls. */
#include "../../libgmsfs/internal.h"
#include "../../src/fs/fs.h"

#include <stdlib.h>

int gm_error(gmsfs *g, int e, const char *fmt, ...) { (void)g; (void)fmt; return e; }
int meta_path(const struct meta_node *n, char *buf, size_t size) { abort(); }
struct meta_node *meta_root(struct meta_store *s, enum meta_area a) { abort(); }
int meta_walk(struct meta_node *d, int (*fn)(struct meta_node *, void *), void *arg) { abort(); }
void vmm_buf_get(struct vmm_buf *b) { abort(); }
void vmm_buf_put(struct vmm_buf *b) { abort(); }
int vmm_export(struct vmm_buf *b, bool ro, bool *owned) { abort(); }
