/* text: the content of the files that cat reads.  Called under fs->mu, so every number
 * of one text is of one moment.  *out is malloc'ed. */
#ifndef GMSFS_FS_TEXT_H
#define GMSFS_FS_TEXT_H

#include "fs.h"

struct store;
int text_device(struct fs *fs, char **out, size_t *len);
/* status.json and metrics (Prometheus text format): every store and the device. */
int text_status_json(struct fs *fs, char **out, size_t *len);
int text_metrics(struct fs *fs, char **out, size_t *len);
int text_state(struct store *st, char **out, size_t *len);
int text_hash(struct store *st, char **out, size_t *len);
int text_tier(struct store *st, char **out, size_t *len);
/* The committed generation (0: none) and a newline. */
int text_generation(struct store *st, char **out, size_t *len);

#endif
