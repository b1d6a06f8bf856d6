/* text: the content of the files that cat reads: device, state, layout_hash. */
#include "fs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int text_device(struct fs *fs, char **out, size_t *len)
{
	const struct vmm *v = fs->vmm;
	int n = asprintf(out,
			 "index: %d\nuuid: %s\nname: %s\nbackend: %s\ntotal_bytes: %llu\nused_bytes: %llu\n"
			 "granularity: %llu\nversion: %s\n",
			 v->dev.index, v->dev.uuid, v->dev.name, v->dev.backend,
			 (unsigned long long)v->max_bytes, (unsigned long long)atomic_load(&v->used_bytes),
			 (unsigned long long)v->dev.granularity, GMSFS_VERSION);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

int text_state(struct store *st, char **out, size_t *len)
{
	struct meta_stats s = {0};
	if (st->meta)
		meta_stats(st->meta, &s);
	const struct fsm *f = &st->fsm;
	int n = asprintf(out,
			 "state: %s\nreaders: %u\nwriter: %d\nwaiting_writers: %u\nwaiting_readers: %u\n"
			 "generation: %llu\nallocations: %llu\nentries: %llu\nbytes: %llu\naligned_bytes: %llu\n"
			 "layout_hash: %s\nrequests: %llu\nsocket_requests: %llu\nlast_error: %s\n",
			 st->removed ? "REMOVED" : fsm_state_name(fsm_state(f)), f->readers, (int)f->leader,
			 f->waiting_writers, f->waiting_readers, (unsigned long long)f->generation,
			 (unsigned long long)s.allocations, (unsigned long long)s.entries,
			 (unsigned long long)s.bytes, (unsigned long long)s.aligned_bytes,
			 st->meta ? meta_hash_hex(st->meta) : "", (unsigned long long)st->requests,
			 (unsigned long long)st->socket_requests, st->last_error);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

int text_hash(struct store *st, char **out, size_t *len)
{
	const char *h = st->meta ? meta_hash_hex(st->meta) : "";
	int n = asprintf(out, h[0] ? "%s\n" : "%s", h);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}
