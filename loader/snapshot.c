/* gmsfs-snapshot save [--gms] STORE DIR | restore STORE DIR [-t SECONDS] [-q] [-v]
 * gmsfs-snapshot save|restore STORE DIR STORE DIR... (every pair at once, a thread each)
 * gmsfs-snapshot save --all DIR [MOUNT...] | restore --all DIR [MOUNT...]
 * gmsfs-snapshot copy SOURCE TARGET [-t SECONDS] [-q]
 *
 * One store in gmsfs-snapshot's own format (snap.c) or GMS's (--gms, and restore of a
 * folder with gms_metadata.json: gms_format.c); --all: every committed store of every
 * gmsfs mount (or of the mounts named), DIR/<GPU uuid>/<store>, a thread a GPU (GPUs at
 * once, a GPU's stores one after another), and back into the mounts of those GPUs; copy:
 * a store from another mount's (gmsfs_copy, peer.c).  See gmsfs-load(1). */
#include "copy_cuda.h"
#include "gms_format.h"
#include "snap.h"
#include "clock.h"
#include "store_files.h"
#include "unheld.h"

#include <gmsfs/gmsfs.h>
#include <gmsfs/load.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One GPU's mount for --all: its stores, saved or restored one after another. */
struct gpu {
	char mount[4096], uuid[128];
	const char *dir; /* DIR */
	bool save, quiet;
	int timeout_ms;
	int failed;
};

/* The gmsfs mounts of /proc/self/mounts (octal escapes undone), at most cap. */
static size_t mounts(char (*out)[4096], size_t cap)
{
	FILE *f = fopen("/proc/self/mounts", "re");
	char line[8192];
	size_t n = 0;
	while (f && n < cap && fgets(line, sizeof line, f)) {
		char dev[4096], path[4096], type[64];
		if (sscanf(line, "%4095s %4095s %63s", dev, path, type) != 3 || strcmp(type, "fuse.gmsfs"))
			continue;
		size_t k = 0;
		for (const char *p = path; *p && k + 1 < sizeof out[n]; p++)
			if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] && p[3])
				out[n][k++] = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0')), p += 3;
			else
				out[n][k++] = *p;
		out[n++][k] = '\0';
	}
	if (f)
		fclose(f);
	return n;
}

static bool is_dir(const char *path)
{
	struct stat st;
	return !stat(path, &st) && S_ISDIR(st.st_mode);
}

/* One store: said on stdout when done (unless quiet), on stderr when it failed. */
static void one(struct gpu *g, const char *store, const char *dir)
{
	char err[8400] = "";
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int e;
	if (g->save)
		e = snap_save(store, dir, g->timeout_ms, true, err, sizeof err);
	else if (!gmsfmt_is(dir))
		e = snap_restore(store, dir, g->timeout_ms, true, err, sizeof err);
	else if (snap_version)
		e = -EINVAL, snprintf(err, sizeof err, "--version: GMS's snapshots are restored as GMS wrote them, unnamed");
	else
		e = gmsfmt_restore(store, dir, g->timeout_ms, err, sizeof err);
	if (e) {
		fprintf(stderr, "gmsfs-snapshot: %s: %s\n", store, err[0] ? err : strerror(-e));
		g->failed++;
	} else if (!g->quiet) {
		printf("%s %s %s, in %.3f s\n", store, g->save ? "->" : "<-", dir, clock_since_s(&t0));
	}
}

static void *gpu_main(void *arg)
{
	struct gpu *g = arg;
	char from[4096 + 256], path[8800], state[32];
	snprintf(from, sizeof from, g->save ? "%s" : "%s/%s", g->save ? g->mount : g->dir, g->uuid);
	DIR *d = opendir(from);
	struct dirent *x;
	while (d && (x = readdir(d))) {
		if (x->d_name[0] == '.')
			continue;
		char store[8800], into[8800];
		snprintf(store, sizeof store, "%s/%s", g->mount, x->d_name);
		snprintf(into, sizeof into, "%s/%s/%s", g->dir, g->uuid, x->d_name);
		snprintf(path, sizeof path, "%s/%s", from, x->d_name);
		if (!is_dir(path))
			continue;
		if (g->save && (sf_field(store, "state", "state", state, sizeof state) || strcmp(state, "COMMITTED")))
			continue; /* nothing committed: nothing to keep */
		if (!g->save && mkdir(store, 0755) && errno != EEXIST) {
			fprintf(stderr, "gmsfs-snapshot: %s: %s\n", store, strerror(errno));
			g->failed++;
			continue;
		}
		one(g, store, into);
	}
	if (d)
		closedir(d);
	return NULL;
}

/* restore --all: the GPUs DIR holds that no mount here serves, each said: 1 each. */
static int skipped(const char *dir, const struct gpu *g, size_t n)
{
	DIR *d = opendir(dir);
	struct dirent *x;
	int missed = 0;
	while (d && (x = readdir(d))) {
		char sub[8800];
		snprintf(sub, sizeof sub, "%s/%s", dir, x->d_name);
		if (x->d_name[0] == '.' || !is_dir(sub))
			continue;
		size_t i = 0;
		while (i < n && strcmp(g[i].uuid, x->d_name))
			i++;
		if (i == n) {
			fprintf(stderr, "gmsfs-snapshot: %s: no mount here serves GPU %s: its stores were not restored\n", sub,
				x->d_name);
			missed++;
		}
	}
	if (d)
		closedir(d);
	return missed;
}

/* --all: every mount named (none: every gmsfs mount), a thread each. */
static int all(bool save, const char *dir, char **named, int nnamed, int timeout_ms, bool quiet)
{
	static char found[64][4096];
	size_t n = nnamed ? 0 : mounts(found, 64);
	for (int i = 0; i < nnamed && n < 64; i++)
		snprintf(found[n++], sizeof found[0], "%s", named[i]);
	struct gpu *g = calloc(n + 1, sizeof *g);
	pthread_t *t = calloc(n + 1, sizeof *t);
	int failed = 0;
	if (!g || !t)
		return fprintf(stderr, "gmsfs-snapshot: out of memory\n"), 1;
	int me = save ? sf_mkdir(dir) : 0;
	if (me)
		return fprintf(stderr, "gmsfs-snapshot: %s: %s\n", dir, strerror(-me)), 1;
	for (size_t i = 0; i < n; i++) {
		g[i] = (struct gpu){ .dir = dir, .save = save, .quiet = quiet, .timeout_ms = timeout_ms };
		snprintf(g[i].mount, sizeof g[i].mount, "%s", found[i]);
		char sub[8800];
		if (sf_field(found[i], "device", "uuid", g[i].uuid, sizeof g[i].uuid)) {
			fprintf(stderr, "gmsfs-snapshot: %s: not a gmsfs mount (no device file)\n", found[i]);
			failed++;
			continue;
		}
		snprintf(sub, sizeof sub, "%s/%s", dir, g[i].uuid);
		if (save && (me = sf_mkdir(sub))) {
			fprintf(stderr, "gmsfs-snapshot: %s: %s\n", sub, strerror(-me));
			failed++;
			continue;
		}
		if (!save && !is_dir(sub)) { /* nothing of this GPU's in DIR */
			if (!quiet)
				printf("%s (GPU %s): nothing of it in %s\n", found[i], g[i].uuid, dir);
			continue;
		}
		if (pthread_create(&t[i], NULL, gpu_main, &g[i]))
			gpu_main(&g[i]);
	}
	for (size_t i = 0; i < n; i++) {
		if (t[i])
			pthread_join(t[i], NULL);
		failed += g[i].failed;
	}
	if (!save)
		failed += skipped(dir, g, n);
	free(g);
	free(t);
	return failed ? 1 : 0;
}

/* save|restore STORE DIR STORE DIR...: every pair at once, a thread each, in this one
 * process (a group's ranks, gmsfsctl group: one process makes its devices' contexts, where
 * a process a rank would each make its own), each said as --all says a store. */
struct pair {
	struct gpu g;
	const char *store, *dir;
};

static void *pair_main(void *arg)
{
	struct pair *p = arg;
	one(&p->g, p->store, p->dir);
	return NULL;
}

/* The path a pair writes (a save's DIR, a restore's STORE) named twice: two threads would
 * write one snapshot, or one would wait out -t for the other's store.  Compared as given,
 * and as the kernel resolves them where both exist. */
static bool named_twice(char **pos, size_t n, bool save)
{
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++) {
			const char *a = pos[2 * i + save], *b = pos[2 * j + save];
			char ra[4096], rb[4096];
			if (!strcmp(a, b) || (realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb))) {
				fprintf(stderr, "gmsfs-snapshot: %s and %s: one %s named twice\n", a, b, save ? "DIR" : "STORE");
				return true;
			}
		}
	return false;
}

static int pairs(bool save, char **pos, size_t n, int timeout_ms, bool quiet)
{
	if (named_twice(pos, n, save))
		return 2;
	struct pair *p = calloc(n, sizeof *p);
	pthread_t *t = calloc(n, sizeof *t);
	bool *started = calloc(n, sizeof *started);
	int failed = 0;
	if (!p || !t || !started)
		return fprintf(stderr, "gmsfs-snapshot: out of memory\n"), 1;
	for (size_t i = 0; i < n; i++) {
		p[i] = (struct pair){ .g = { .save = save, .quiet = quiet, .timeout_ms = timeout_ms },
				      .store = pos[2 * i], .dir = pos[2 * i + 1] };
		if (!(started[i] = !pthread_create(&t[i], NULL, pair_main, &p[i])))
			pair_main(&p[i]); /* no thread: in turn */
	}
	for (size_t i = 0; i < n; i++) {
		if (started[i])
			pthread_join(t[i], NULL);
		failed += p[i].g.failed;
	}
	free(p);
	free(t);
	free(started);
	return failed ? 1 : 0;
}

/* Before any thread and the driver's cuInit: the driver shown only the stores named (copy:
 * both; pairs: each STORE; --all: every GPU), and a save or restore, which copies one way
 * over PCIe where one queue keeps up, one work queue a context (a copy between GPUs needs
 * the driver's several: with one, 17.2 GB over NVLink took 0.123 s against 0.054 s). */
static void driver_settings(char **pos, int n, bool several, bool every)
{
	const char *stores[128];
	size_t ns = 0;
	for (int i = 1; !every && i < n && ns < 128; i += several ? 2 : 1)
		if (several || i == 1 || pos[0][0] == 'c')
			stores[ns++] = pos[i];
	const char *shown = cpc_show_only(stores, ns);
	if (shown && snap_verbose)
		fprintf(stderr, "gmsfs-snapshot: shown only %s (CUDA_VISIBLE_DEVICES)\n", shown);
	if (strcmp(pos[0], "copy"))
		cpc_one_queue();
}

static int run(int argc, char **argv)
{
	int timeout_ms = 60000;
	bool quiet = false, gms = false, every = false;
	int n = 0;
	char *pos[256];
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-q"))
			quiet = true;
		else if (!strcmp(argv[i], "-v"))
			snap_verbose = true;
		else if (!strcmp(argv[i], "--gms"))
			gms = true;
		else if (!strcmp(argv[i], "--all"))
			every = true;
		else if (!strcmp(argv[i], "--version") && i + 1 < argc)
			snap_version = argv[++i];
		else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
			char *end; /* seconds, 0 to a day: nan, inf, a negative or a typo refused (exit 2) */
			double v = strtod(argv[++i], &end);
			if (end == argv[i] || *end || !(v >= 0 && v <= 86400)) {
				fprintf(stderr, "gmsfs-snapshot: -t %s: seconds from 0 to 86400\n", argv[i]);
				return 2;
			}
			timeout_ms = (int)(v * 1000);
		} else if (n < 256)
			pos[n++] = argv[i];
		else
			n = 257;
	}
	bool verb = n >= 1 && (!strcmp(pos[0], "save") || !strcmp(pos[0], "restore") || !strcmp(pos[0], "copy"));
	/* Several STORE DIR pairs: save and restore only, not --gms. */
	bool several = verb && !every && n >= 5 && n <= 255 && n % 2 && strcmp(pos[0], "copy") && !gms;
	if (!verb || (every ? n < 2 || n > 64 || !strcmp(pos[0], "copy") || gms : n != 3 && !several) ||
	    (gms && pos[0][0] != 's') || (snap_version && (every || strcmp(pos[0], "restore")))) {
		fprintf(stderr, "usage: gmsfs-snapshot save [--gms] STORE DIR [-t SECONDS] [-q] [-v]\n"
				"       gmsfs-snapshot restore STORE DIR [--version NAME] [-t SECONDS] [-q] [-v]\n"
				"       gmsfs-snapshot save|restore STORE DIR STORE DIR... [--version NAME] [-t SECONDS] [-q]\n"
				"       gmsfs-snapshot save|restore --all DIR [MOUNT...] [-t SECONDS] [-q]\n"
				"       gmsfs-snapshot copy SOURCE TARGET [-t SECONDS] [-q]\n");
		return 2;
	}
	driver_settings(pos, n, several, every);
	if (every)
		return all(pos[0][0] == 's', pos[1], pos + 2, n - 2, timeout_ms, quiet);
	if (several)
		return pairs(pos[0][0] == 's', pos + 1, (size_t)(n - 1) / 2, timeout_ms, quiet);
	char err[8400] = "";
	struct gmsfs_report r = GMSFS_REPORT;
	struct gmsfs_copy_options o = GMSFS_COPY_OPTIONS;
	o.timeout_ms = timeout_ms;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int e;
	if (!strcmp(pos[0], "copy")) {
		if ((e = gmsfs_copy(pos[1], pos[2], &o, &r)))
			snprintf(err, sizeof err, "%s", gmsfs_errmsg(NULL));
	} else if (pos[0][0] == 's') {
		e = gms ? gmsfmt_save(pos[1], pos[2], timeout_ms, err, sizeof err)
			: snap_save(pos[1], pos[2], timeout_ms, quiet, err, sizeof err);
	} else if (snap_version && gmsfmt_is(pos[2])) {
		e = -EINVAL, snprintf(err, sizeof err, "--version: GMS's snapshots are restored as GMS wrote them, unnamed");
	} else { /* a GMS snapshot is known by its gms_metadata.json */
		e = gmsfmt_is(pos[2]) ? gmsfmt_restore(pos[1], pos[2], timeout_ms, err, sizeof err)
				      : snap_restore(pos[1], pos[2], timeout_ms, quiet, err, sizeof err);
	}
	if (!e && r.how[0] && !quiet)
		printf("%s -> %s: %s, in %.3f s\n", pos[1], pos[2], r.how, clock_since_s(&t0));
	if (e) {
		fprintf(stderr, "gmsfs-snapshot: %s\n", err[0] ? err : strerror(-e));
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	return unheld_run(run, argc, argv); /* a daemon that does not answer holds a child, not the command */
}
