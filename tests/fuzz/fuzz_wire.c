/* libFuzzer target for the wire codec (common/wire_msgpack.c), linked alone: request headers
 * and bodies as the daemon parses them, replies as the library parses them, and store
 * images (a state file, a handover) record by record as the daemon reads them.  What
 * it accepts must be consistent: counts within bounds, paths valid, sizes sane. */
#include "wire.h"
#include "version_name.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char why[256];
	struct gmsfs_sock_req req;
	if (wire_req_parse(data, size, &req, why, sizeof why) == 0)
		assert(size == sizeof req + req.body_len && req.magic == GMSFS_SOCK_MAGIC && req.op >= GMSFS_OP_REDEEM &&
		       req.op <= GMSFS_OP_MAX && !(req.flags & ~GMSFS_REQ_MORE));

	for (int op = GMSFS_OP_EXPORT; op <= GMSFS_OP_MAX; op++) {
		struct wire_body b;
		if (wire_parse_body((enum gmsfs_op)op, data, size, &b, why, sizeof why))
			continue;
		for (size_t i = 0; i < b.nallocs; i++)
			assert(gmsfs_path_valid(b.allocs[i].path, strlen(b.allocs[i].path)) && b.allocs[i].size);
		for (size_t i = 0; i < b.nentries; i++)
			assert(gmsfs_path_valid(b.entries[i].key, strlen(b.entries[i].key)) &&
			       b.entries[i].value_len <= GMSFS_VALUE_MAX && !(b.entries[i].flags & ~GMSFS_ENTRY_FLAGS));
		for (size_t i = 0; i < b.nnames; i++)
			assert(gmsfs_path_valid(b.names[i], strlen(b.names[i])));
		assert(!b.version || ((op == GMSFS_OP_COMMIT_NAMED || op == GMSFS_OP_COMMIT_LEAVE) &&
				      gmsfs_version_name_valid(b.version, strlen(b.version))));
		assert(op != GMSFS_OP_COMMIT_NAMED || b.version);
		wire_body_free(&b);
	}

	struct wire_reply r;
	if (wire_parse_reply(data, size, &r, why, sizeof why) == 0) {
		assert(r.nallocs <= GMSFS_FDS_PER_MSG);
		if (r.manifest) {
			assert(!r.err && r.first <= r.total && r.nallocs <= r.total - r.first);
			for (size_t i = 0; i < r.nallocs; i++)
				assert(r.allocs[i].path && r.allocs[i].tag && r.allocs[i].size &&
				       r.allocs[i].aligned >= r.allocs[i].size && r.allocs[i].fd < GMSFS_FDS_PER_MSG);
			for (size_t i = 0; i < r.nchunks; i++)
				assert(r.chunks[i].key && r.chunks[i].voff + r.chunks[i].nbytes <= GMSFS_VALUE_MAX);
		}
		wire_reply_free(&r);
	}
	/* An image: the head, then records of every kind, as many as parse. */
	size_t off = 0;
	const void *rec;
	size_t n;
	struct wire_image h;
	if (!wire_image_next(data, size, &off, &rec, &n) && !wire_parse_image(rec, n, &h, why, sizeof why)) {
		assert(h.store && h.device && h.backend && h.nfds <= (1u << 20));
		for (uint64_t i = 0; h.fdnames && i < h.nfds; i++)
			assert(h.fdnames[i][0] && !strchr(h.fdnames[i], ':'));
		while (!wire_image_next(data, size, &off, &rec, &n)) {
			int area;
			char *path;
			struct wire_alloc a;
			struct entry_rec x;
			if (!wire_parse_image_dir(rec, n, &area, &path)) {
				assert((area == 0 || area == 1) && gmsfs_path_valid(path, strlen(path)));
				free(path);
			}
			if (!wire_parse_image_alloc(rec, n, &a, h.nfds)) {
				assert(a.size && a.aligned >= a.size && a.fd < h.nfds);
				assert(!a.nstandby || a.nstandby == (a.npieces ? a.npieces : 1));
				for (uint32_t i = 0; i < a.nstandby; i++)
					assert(a.standby[i].fd == WIRE_NO_FD || a.standby[i].fd < h.nfds);
				wire_alloc_free(&a);
			}
			if (!wire_parse_image_entry(rec, n, &x)) {
				assert(x.value_len <= GMSFS_VALUE_MAX);
				free(x.key);
				free(x.alloc);
				free(x.value);
			}
		}
		wire_image_free(&h);
	}
	return 0;
}
