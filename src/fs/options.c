/* options: the daemon's -o options (options.h). */
#include "options.h"
#include "size.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OPT(t, p) { t, offsetof(struct options, p), 1 }
enum { KEY_ALLOW_OTHER };
static const struct fuse_opt option_spec[] = {
	FUSE_OPT_KEY("allow_other", KEY_ALLOW_OTHER),
	OPT("backend=%s", backend),
	OPT("device=%s", device),
	OPT("socket=%s", socket),
	OPT("max_bytes=%s", max_bytes),
	OPT("host_bytes=%s", host_bytes),
	OPT("piece_bytes=%s", piece_bytes),
	OPT("host_ahead", host_ahead),
	{ "no_host_ahead", offsetof(struct options, host_ahead), 0 },
	OPT("next_ahead", next_ahead),
	{ "no_next_ahead", offsetof(struct options, next_ahead), 0 },
	OPT("mover=%s", mover),
	OPT("fsname=%s", fsname),
	OPT("ready_fd=%d", ready_fd),
	OPT("max_threads=%d", max_threads),
	OPT("gpu=%d", gpu),
	OPT("takeover", takeover),
	OPT("state=%s", state),
	OPT("fdstore=%u", fdstore),
	FUSE_OPT_END
};

static void usage(const char *prog)
{
	printf("usage: %s [-f] [-d] [-o OPTIONS] MOUNTPOINT\n\n"
	       "gmsfs options:\n"
	       "    -o backend=cuda|host   where memory comes from (default: cuda if a VMM GPU is found, else host)\n"
	       "    -o device=INDEX|UUID   which device (default 0)\n"
	       "    -o max_bytes=N[KMGT]   most memory the stores may hold (default: all of the device)\n"
	       "    -o host_bytes=N[KMGT]  most host memory the host tier may hold (default: half of the machine's)\n"
	       "    -o no_host_ahead       no host memory made ahead of a store's first move out (made by default)\n"
	       "    -o no_next_ahead       no device memory made ahead of a store's next version between refits\n"
	       "                           (made by default, where user.gms.versions is 2)\n"
	       "    -o piece_bytes=N[KMGT] allocations larger than this are pieces of this size, which move one at\n"
	       "                           a time (default 1G; 0: never)\n"
	       "    -o mover=PATH          the cuda backend's copy helper (default: gmsfs-mover beside gmsfs,\n"
	       "                           or ../lib/gmsfs/gmsfs-mover)\n"
	       "    -o socket=PATH         export socket (default: /run/gmsfs/gmsfs-PID.sock as root)\n"
	       "    -o ready_fd=N          write a newline to fd N once the mount is live\n"
	       "    -o max_threads=N       worker threads (default 256); waiting opens hold none\n"
	       "    -o gpu=N               the GPU's number in the metrics' gpu label, as nvidia-smi and\n"
	       "                           dcgm-exporter number it (default: the device's index; gmsfs-node\n"
	       "                           gives its place in nvidia-smi's list)\n"
	       "    -o takeover            replace the daemon serving MOUNTPOINT: its stores come over, with\n"
	       "                           no copy (root; backend and device default to that daemon's)\n"
	       "    -o state=DIR           under systemd (FileDescriptorStoreMax=): keep every store across a\n"
	       "                           restart or a crash (images in DIR, memory in systemd's fd store)\n"
	       "    -o fdstore=N           descriptors systemd keeps (its FileDescriptorStoreMax=; default 16384)\n"
	       "    -o allow_other         let other users in (needs user_allow_other or root)\n\n",
	       prog);
	fuse_cmdline_help();
	fuse_lowlevel_help();
}

/* allow_other is the kernel's, kept for it; the socket's mode follows it. */
static int option_seen(void *data, const char *arg, int key, struct fuse_args *out)
{
	if (key == KEY_ALLOW_OTHER)
		((struct options *)data)->allow_other = 1;
	return 1;
}

/* The copy helper: as asked, else beside this binary (a build tree), else where the
 * package puts it (../lib/gmsfs from bin/). */
const char *options_mover(const char *asked)
{
	static char path[4096];
	if (asked)
		return asked;
	char exe[4000];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0)
		return "/usr/lib/gmsfs/gmsfs-mover";
	exe[n] = '\0';
	char *slash = strrchr(exe, '/');
	*slash = '\0';
	snprintf(path, sizeof path, "%s/gmsfs-mover", exe);
	if (access(path, X_OK))
		snprintf(path, sizeof path, "%s/../lib/gmsfs/gmsfs-mover", exe);
	return path;
}

/* 0: go on; otherwise the exit status (help and version: 0, bad options: 2). */
/* What is left for libfuse (its -o options), tried on a session made and dropped: an
 * unknown option is bad usage (exit 2) before anything is done, not a failure later. */
static bool fuse_knows(const struct fuse_args *args)
{
	static const struct fuse_lowlevel_ops none;
	struct fuse_args copy = FUSE_ARGS_INIT(0, NULL);
	bool ok = true;
	for (int i = 0; ok && i < args->argc; i++)
		ok = !fuse_opt_add_arg(&copy, args->argv[i]);
	struct fuse_session *se = ok ? fuse_session_new(&copy, &none, sizeof none, NULL) : NULL;
	if (se)
		fuse_session_destroy(se);
	fuse_opt_free_args(&copy);
	return se != NULL; /* libfuse said which option it did not know */
}

int options_parse(struct fuse_args *args, struct options *opts, struct fuse_cmdline_opts *cmd, uint64_t *max_bytes,
		  const char *prog)
{
	if (fuse_opt_parse(args, opts, option_spec, option_seen) || fuse_parse_cmdline(args, cmd))
		return 2;
	if (cmd->show_help) {
		usage(prog);
		return -1;
	}
	if (cmd->show_version) {
		printf("gmsfs %s\n", GMSFS_VERSION);
		fflush(stdout); /* first: libfuse's own lines come from fusermount3 too */
		fuse_lowlevel_version();
		return -1;
	}
	if (!cmd->mountpoint) {
		fprintf(stderr, "gmsfs: no mountpoint (see %s --help)\n", prog);
		return 2;
	}
	if (opts->max_bytes && (size_parse(opts->max_bytes, max_bytes) || !*max_bytes)) {
		fprintf(stderr, "gmsfs: max_bytes=%s: not a size (digits, then K, M, G or T; more than 0)\n",
			opts->max_bytes);
		return 2;
	}
	uint64_t host_bytes;
	if (opts->host_bytes && (size_parse(opts->host_bytes, &host_bytes) || !host_bytes)) {
		fprintf(stderr, "gmsfs: host_bytes=%s: not a size (digits, then K, M, G or T; more than 0)\n",
			opts->host_bytes);
		return 2;
	}
	uint64_t piece_bytes;
	if (opts->piece_bytes && size_parse(opts->piece_bytes, &piece_bytes)) {
		fprintf(stderr, "gmsfs: piece_bytes=%s: not a size (digits, then K, M, G or T; 0: never in pieces)\n",
			opts->piece_bytes);
		return 2;
	}
	if (opts->gpu < -1 || opts->gpu > 4095) {
		fprintf(stderr, "gmsfs: gpu=%d: a GPU's number, 0 to 4095\n", opts->gpu);
		return 2;
	}
	if (opts->max_threads && (opts->max_threads < 2 || opts->max_threads > 100000)) {
		fprintf(stderr, "gmsfs: max_threads=%d: between 2 and 100000\n", opts->max_threads);
		return 2;
	}
	return fuse_knows(args) ? 0 : 2;
}

/* Takeover: what the command line leaves unset comes from the daemon replaced (its
 * device file's options line), so that a replacement changes the binary, not the
 * mount's budgets, name or socket.  0, or 2 (the old options do not parse). */
int options_inherit(struct options *o, struct fuse_args *args, const struct handover_peer *peer, uint64_t *max_bytes)
{
	struct options old = { .ready_fd = -1, .detach_fd = -1, .host_ahead = -1, .next_ahead = -1, .gpu = -1 };
	char *argv[] = { "gmsfs", "-o", (char *)peer->options, NULL };
	struct fuse_args a = FUSE_ARGS_INIT(peer->options[0] ? 3 : 1, argv);
	if (fuse_opt_parse(&a, &old, option_spec, option_seen)) {
		fprintf(stderr, "gmsfs: takeover: the old daemon's options (%s) do not parse\n", peer->options);
		return 2;
	}
	fuse_opt_free_args(&a);
	/* Its stores kept by a service manager (systemd, gmsfs-keeper), which this daemon,
	 * started by hand, is not under: it would serve them and keep none. */
	if (old.state)
		fprintf(stderr, "gmsfs: takeover: the daemon serving this mount keeps its stores under a service manager "
				"(state=%s): a daemon taking over would keep none across its own restart; restart it "
				"through its manager instead (systemctl restart, or kill it and gmsfs-node or "
				"gmsfs-keeper --exec starts it again with every store)\n", old.state);
	bool kept = old.state;
#define TAKE(f) do { if (!o->f && old.f) { o->f = old.f; old.f = NULL; } } while (0)
	TAKE(max_bytes);
	TAKE(host_bytes);
	TAKE(piece_bytes);
	TAKE(mover);
	TAKE(socket);
	TAKE(fsname);
#undef TAKE
	/* A default socket (gmsfs-PID.sock) keeps its name too: the new daemon listens beside
	 * it and takes the name once the old one has ended, as for a socket= given. */
	if (!o->socket && peer->socket[0] && !(o->socket = strdup(peer->socket)))
		return 2;
	if (!o->fsname && peer->fsname[0] && !(o->fsname = strdup(peer->fsname))) /* an older daemon's: its source */
		return 2;
	if (!o->max_threads)
		o->max_threads = old.max_threads;
	if (o->host_ahead < 0)
		o->host_ahead = old.host_ahead;
	if (o->next_ahead < 0)
		o->next_ahead = old.next_ahead;
	if (o->gpu < 0)
		o->gpu = old.gpu;
	if (old.allow_other && !o->allow_other) {
		o->allow_other = 1;
		if (fuse_opt_add_arg(args, "-oallow_other"))
			return 2;
	}
	free(old.max_bytes);
	free(old.host_bytes);
	free(old.piece_bytes);
	free(old.mover);
	free(old.socket);
	free(old.fsname);
	free(old.backend);
	free(old.device);
	free(old.state);
	if (kept)
		return 2;
	if (o->max_bytes && (size_parse(o->max_bytes, max_bytes) || !*max_bytes))
		return 2;
	if (peer->options[0])
		fprintf(stderr, "gmsfs: takeover: keeping the old daemon's options where none are given: %s\n",
			peer->options);
	return 0;
}

/* The daemon's options as gmsfs -o takes them (the device file's "options:" line): the
 * budgets in effect and what was given, for a successor to keep.  NULL: out of memory. */
char *options_text(const struct fs *fs, const struct options *o)
{
	char *t = NULL, kv[4200];
	int e = 0;
	snprintf(kv, sizeof kv, "max_bytes=%llu", (unsigned long long)fs->vmm->max_bytes);
	e |= fuse_opt_add_opt_escaped(&t, kv);
	snprintf(kv, sizeof kv, "host_bytes=%llu", (unsigned long long)fs->vmm->host_bytes);
	e |= fuse_opt_add_opt_escaped(&t, kv);
	snprintf(kv, sizeof kv, "piece_bytes=%llu", (unsigned long long)fs->vmm->piece_bytes);
	e |= fuse_opt_add_opt_escaped(&t, kv);
	e |= fuse_opt_add_opt(&t, o->host_ahead ? "host_ahead" : "no_host_ahead");
	if (!o->next_ahead) /* said only when off: a gmsfs before it takes the line over still */
		e |= fuse_opt_add_opt(&t, "no_next_ahead");
	if (o->allow_other)
		e |= fuse_opt_add_opt(&t, "allow_other");
	if (o->gpu >= 0) {
		snprintf(kv, sizeof kv, "gpu=%d", o->gpu);
		e |= fuse_opt_add_opt(&t, kv);
	}
	if (o->max_threads != 256) {
		snprintf(kv, sizeof kv, "max_threads=%d", o->max_threads);
		e |= fuse_opt_add_opt(&t, kv);
	}
	const struct { const char *key, *value; } given[] = {
		{ "fsname", o->fsname }, { "socket", o->socket }, { "mover", o->mover },
		{ "state", o->state }, /* a takeover refuses it (options_inherit) */
	};
	for (size_t i = 0; i < sizeof given / sizeof given[0]; i++)
		if (given[i].value) {
			snprintf(kv, sizeof kv, "%s=%s", given[i].key, given[i].value);
			e |= fuse_opt_add_opt_escaped(&t, kv);
		}
	if (e) {
		free(t);
		return NULL;
	}
	return t;
}

void options_free(struct options *o)
{
	free(o->backend);
	free(o->device);
	free(o->socket);
	free(o->max_bytes);
	free(o->host_bytes);
	free(o->piece_bytes);
	free(o->mover);
	free(o->fsname);
	free(o->state);
}
