/* gmsfs-load [-q] [-v] [-t SECONDS] [--slab BYTES] [--replace] [--no-digest] STORE FILE.safetensors | DIR
 *
 * One writer session: gmsfs_load (loadlib.c: every tensor of the checkpoint packed into
 * slabs, an entry "torch/NAME" per tensor, the checkpoint's files in a note), then
 * commit, the daemon told the bytes' content hash (hashed as they passed); a store that holds the checkpoint already is left as it is (no copy, no
 * commit).  Any error leaves the store at its last commit.  On a terminal, progress;
 * quiet otherwise.  See gmsfs-load(1). */
#include "unheld.h"

#include <gmsfs/gmsfs.h>
#include <gmsfs/load.h>
#include <gmsfs/torch.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int usage(void)
{
	fprintf(stderr, "usage: gmsfs-load [-q] [-v] [-t SECONDS] [--slab BYTES] [--replace] [--no-digest] STORE "
		"FILE.safetensors|DIR\n");
	return 2;
}

static int run(int argc, char **argv)
{
	unsigned flags = GMSFS_LOAD_COMMIT | (isatty(2) ? GMSFS_LOAD_PROGRESS : 0);
	bool quiet = false;
	uint64_t slab = GMSFS_TORCH_SLAB_BYTES;
	int timeout_ms = 60000, i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		char *end;
		if (!strcmp(argv[i], "-q")) {
			flags &= ~GMSFS_LOAD_PROGRESS;
			quiet = true;
		} else if (!strcmp(argv[i], "--replace")) {
			flags |= GMSFS_LOAD_REPLACE;
		} else if (!strcmp(argv[i], "--no-digest")) {
			flags |= GMSFS_LOAD_NO_DIGEST;
		} else if (!strcmp(argv[i], "-v")) {
			flags |= GMSFS_LOAD_VERBOSE;
		} else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
			double t = strtod(argv[++i], &end);
			if (end == argv[i] || *end || !(t >= 0 && t <= 86400)) /* nan too */
				return usage();
			timeout_ms = (int)(t * 1000);
		} else if (!strcmp(argv[i], "--slab") && i + 1 < argc) {
			slab = strtoull(argv[++i], &end, 10);
			if (*end || slab < GMSFS_TORCH_ALIGN || argv[i][0] == '-')
				return usage();
		} else {
			return usage();
		}
	}
	if (argc - i != 2)
		return usage();
	const char *store = argv[i], *path = argv[i + 1];
	char err[1024] = "";
	gmsfs *g = NULL;
	struct gmsfs_load_options o = GMSFS_LOAD_OPTIONS;
	o.flags = flags;
	o.slab_bytes = slab;
	/* Its copies go one way: one hardware work queue for its context, the driver's default
	 * being 8 (where the caller left it unset; loader/copy_cuda.h, cpc_one_queue, says why). */
	setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 0);
	int e = gmsfs_load_context(store); /* libgmsfs maps in the current context */
	if (e)
		snprintf(err, sizeof err, "%s", gmsfs_errmsg(NULL));
	if (!e && (e = gmsfs_connect(&g, store, GMSFS_RW, timeout_ms)))
		snprintf(err, sizeof err, "%s", g ? gmsfs_errmsg(g) : gmsfs_strerror(e));
	bool held = false;
	if (!e && (e = gmsfs_load(g, path, &o)) == GMSFS_LOAD_HELD)
		held = true, e = 0; /* the last commit stands: no new generation of the same bytes */
	else if (e && !err[0])
		snprintf(err, sizeof err, "%s", gmsfs_errmsg(g));
	if (held && !quiet)
		printf("%s holds %s already (the same files, sizes, times and inodes): nothing copied\n", store, path);
	gmsfs_disconnect(g); /* without a commit (an error): rolled back */
	if (e) {
		fprintf(stderr, "gmsfs-load: %s\n", err[0] ? err : gmsfs_strerror(e));
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	return unheld_run(run, argc, argv); /* a daemon that does not answer holds a child, not the command */
}
