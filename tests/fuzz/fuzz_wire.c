/* libFuzzer target for both ends of the export socket: the daemon's request
 * parser and the library's manifest parser.  Whatever it accepts must be
 * consistent: counts within bounds, strings NUL-free, sizes non-zero. */
#include "../../libgmsfs/internal.h"
#include "../../src/fs/fs.h"

#include <assert.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char why[256];
	struct gmsfs_sock_req req;
	if (export_parse_request(data, size, &req, why, sizeof why) == 0)
		assert(size == sizeof req && req.magic == GMSFS_SOCK_MAGIC && !req.reserved);

	struct xp_manifest m;
	if (xp_parse(data, size, &m, why, sizeof why) == 0) {
		assert(m.n <= GMSFS_FDS_PER_MSG);
		if (!m.err) {
			assert(m.first <= m.total && m.n <= m.total - m.first);
			for (size_t i = 0; i < m.n; i++) {
				assert(m.v[i].path && m.v[i].path[0] && m.v[i].tag);
				assert(m.v[i].size && m.v[i].aligned >= m.v[i].size && m.v[i].fd == -1);
			}
		}
		xp_manifest_free(&m);
	}
	return 0;
}
