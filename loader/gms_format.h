/* gms_format: snapshots in the format of NVIDIA Dynamo's GPU Memory Service (its
 * gms-storage-client save and restore), both ways, for gmsfs-snapshot (gmsfs-load(1)
 * says what maps to what, and what cannot). */
#ifndef GMSFS_LOADER_GMS_FORMAT_H
#define GMSFS_LOADER_GMS_FORMAT_H

#include <stdbool.h>
#include <stddef.h>

/* Does dir hold a GMS snapshot (gms_metadata.json beside manifest.json)? */
bool gmsfmt_is(const char *dir);
/* store's committed layout into dir as GMS writes one; 0 or -errno with err. */
int gmsfmt_save(const char *store, const char *dir, int timeout_ms, char *err, size_t errlen);
/* A GMS snapshot into the empty store, as GMS's restore fills a server; 0 or -errno. */
int gmsfmt_restore(const char *store, const char *dir, int timeout_ms, char *err, size_t errlen);

#endif
