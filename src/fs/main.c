/* gmsfs: one daemon and one mount per GPU.  See gmsfs(8). */
#include "fs.h"
#include "handover.h"
#include "inval.h"
#include "keep.h"
#include "log.h"
#include "mnt.h"
#include "store.h"
#include "tier.h"
#include "wait.h"
#include "export/export.h"
#include "fault.h"
#include "size.h"
#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <limits.h>
#include <xxhash.h>

struct options {
	int allow_other;
	char *backend;
	char *device;
	char *socket;
	char *max_bytes;
	char *host_bytes;
	int host_ahead;        /* make committed stores' host memory ahead of their first move out
	                        * (1, the default; 0: no_host_ahead; -1: not said) */
	char *mover;           /* the cuda backend's copy helper for the host tier */
	char *fsname;          /* the mount's source, as mount(8) and fstab name it */
	int ready_fd;
	int detach_fd;         /* without -f: where the waiting parent learns that the mount is live */
	int max_threads;
	int takeover;          /* take the stores of the daemon serving the mount point over */
	char *state;           /* keep what a restart needs here (and in the service manager) */
	unsigned fdstore;      /* descriptors the service manager keeps (FileDescriptorStoreMax=) */
	/* Where a start's time went (the serving line says it): its beginning, the device
	 * opened, the stores handed over or restored. */
	uint64_t t_begin, t_device, t_stores;
};

#define OPT(t, p) { t, offsetof(struct options, p), 1 }
enum { KEY_ALLOW_OTHER };
static const struct fuse_opt option_spec[] = {
	FUSE_OPT_KEY("allow_other", KEY_ALLOW_OTHER),
	OPT("backend=%s", backend),
	OPT("device=%s", device),
	OPT("socket=%s", socket),
	OPT("max_bytes=%s", max_bytes),
	OPT("host_bytes=%s", host_bytes),
	OPT("host_ahead", host_ahead),
	{ "no_host_ahead", offsetof(struct options, host_ahead), 0 },
	OPT("mover=%s", mover),
	OPT("fsname=%s", fsname),
	OPT("ready_fd=%d", ready_fd),
	OPT("max_threads=%d", max_threads),
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
	       "    -o mover=PATH          the cuda backend's copy helper (default: gmsfs-mover beside gmsfs,\n"
	       "                           or ../lib/gmsfs/gmsfs-mover)\n"
	       "    -o socket=PATH         export socket (default: /run/gmsfs/gmsfs-PID.sock as root)\n"
	       "    -o ready_fd=N          write a newline to fd N once the mount is live\n"
	       "    -o max_threads=N       worker threads (default 256); waiting opens hold none\n"
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
static const char *mover_path(const char *asked)
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
static int parse_options(struct fuse_args *args, struct options *opts, struct fuse_cmdline_opts *cmd,
			 uint64_t *max_bytes, const char *prog)
{
	if (fuse_opt_parse(args, opts, option_spec, option_seen) || fuse_parse_cmdline(args, cmd))
		return 2;
	if (cmd->show_help) {
		usage(prog);
		return -1;
	}
	if (cmd->show_version) {
		printf("gmsfs %s\n", GMSFS_VERSION);
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
	if (opts->max_threads && (opts->max_threads < 2 || opts->max_threads > 100000)) {
		fprintf(stderr, "gmsfs: max_threads=%d: between 2 and 100000\n", opts->max_threads);
		return 2;
	}
	return 0;
}

/* Takeover: what the command line leaves unset comes from the daemon replaced (its
 * device file's options line), so that a replacement changes the binary, not the
 * mount's budgets, name or socket.  0, or 2 (the old options do not parse). */
static int inherit_options(struct options *o, struct fuse_args *args, const struct handover_peer *peer,
			   uint64_t *max_bytes)
{
	struct options old = { .ready_fd = -1, .detach_fd = -1, .host_ahead = -1 };
	char *argv[] = { "gmsfs", "-o", (char *)peer->options, NULL };
	struct fuse_args a = FUSE_ARGS_INIT(peer->options[0] ? 3 : 1, argv);
	if (fuse_opt_parse(&a, &old, option_spec, option_seen)) {
		fprintf(stderr, "gmsfs: takeover: the old daemon's options (%s) do not parse\n", peer->options);
		return 2;
	}
	fuse_opt_free_args(&a);
#define TAKE(f) do { if (!o->f && old.f) { o->f = old.f; old.f = NULL; } } while (0)
	TAKE(max_bytes);
	TAKE(host_bytes);
	TAKE(mover);
	TAKE(socket);
	TAKE(fsname);
#undef TAKE
	if (!o->fsname && peer->fsname[0] && !(o->fsname = strdup(peer->fsname))) /* an older daemon's: its source */
		return 2;
	if (!o->max_threads)
		o->max_threads = old.max_threads;
	if (o->host_ahead < 0)
		o->host_ahead = old.host_ahead;
	if (old.allow_other && !o->allow_other) {
		o->allow_other = 1;
		if (fuse_opt_add_arg(args, "-oallow_other"))
			return 2;
	}
	free(old.max_bytes);
	free(old.host_bytes);
	free(old.mover);
	free(old.socket);
	free(old.fsname);
	free(old.backend);
	free(old.device);
	free(old.state);
	if (o->max_bytes && (size_parse(o->max_bytes, max_bytes) || !*max_bytes))
		return 2;
	if (peer->options[0])
		fprintf(stderr, "gmsfs: takeover: keeping the old daemon's options where none are given: %s\n",
			peer->options);
	return 0;
}

/* The daemon's options as gmsfs -o takes them (the device file's "options:" line): the
 * budgets in effect and what was given, for a successor to keep.  NULL: out of memory. */
static char *options_text(const struct fs *fs, const struct options *o)
{
	char *t = NULL, kv[4200];
	int e = 0;
	snprintf(kv, sizeof kv, "max_bytes=%llu", (unsigned long long)fs->vmm->max_bytes);
	e |= fuse_opt_add_opt_escaped(&t, kv);
	snprintf(kv, sizeof kv, "host_bytes=%llu", (unsigned long long)fs->vmm->host_bytes);
	e |= fuse_opt_add_opt_escaped(&t, kv);
	e |= fuse_opt_add_opt(&t, o->host_ahead ? "host_ahead" : "no_host_ahead");
	if (o->allow_other)
		e |= fuse_opt_add_opt(&t, "allow_other");
	if (o->max_threads != 256) {
		snprintf(kv, sizeof kv, "max_threads=%d", o->max_threads);
		e |= fuse_opt_add_opt(&t, kv);
	}
	const struct { const char *key, *value; } given[] = {
		{ "fsname", o->fsname }, { "socket", o->socket }, { "mover", o->mover },
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

/* Host mounts given no device= stay apart (metrics, gmsfsctl, GMS's sockets): the machine's
 * id, then a hash of the mount point, the same at each start on it (state=, takeover). */
static void host_apart(struct vmm *v, const char *mountpoint)
{
	char real[PATH_MAX], machine[17];
	const char *p = realpath(mountpoint, real) ? real : mountpoint;
	snprintf(machine, sizeof machine, "%s", v->dev.uuid + strlen("host-"));
	snprintf(v->dev.uuid, sizeof v->dev.uuid, "host-%s-%016llx", machine,
		 (unsigned long long)XXH3_64bits(p, strlen(p)));
}

/* Allocations may hold descriptors: allow as many as the hard limit. */
static void raise_nofile(void)
{
	struct rlimit nofile;
	if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur < nofile.rlim_max) {
		nofile.rlim_cur = nofile.rlim_max;
		setrlimit(RLIMIT_NOFILE, &nofile);
	}
}

/* systemd's readiness (Type=notify), without libsystemd: one datagram of "READY=1" to
 * $NOTIFY_SOCKET (a path, or an abstract name after '@').  Nothing when it is unset. */
static void notify_systemd(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	size_t n = path ? strlen(path) : 0;
	if (!n || n >= sizeof a.sun_path || (path[0] != '/' && path[0] != '@'))
		return;
	memcpy(a.sun_path, path, n);
	if (path[0] == '@')
		a.sun_path[0] = '\0';
	int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return;
	if (sendto(s, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&a,
		   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0)
		perror("gmsfs: NOTIFY_SOCKET");
	close(s);
}

/* SIG_BLOCK or SIG_UNBLOCK the signals that stop the daemon (libfuse handles them). */
static void stop_signals(int how)
{
	sigset_t stops;
	sigemptyset(&stops);
	sigaddset(&stops, SIGTERM);
	sigaddset(&stops, SIGINT);
	sigaddset(&stops, SIGHUP);
	pthread_sigmask(how, &stops, NULL);
}

/* Without -f: fork before anything else, since neither threads (the socket's, the
 * waiters') nor a CUDA driver survive a fork.  The parent waits until the child's mount
 * is live (exit 0) or the child gives up (its errors on the same stderr; exit 1). */
static int background(int *detach_fd)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC))
		return -errno;
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0) {
		close(p[1]);
		char ok;
		_exit(read(p[0], &ok, 1) == 1 ? 0 : 1);
	}
	close(p[0]);
	setsid();
	*detach_fd = p[1];
	return 0;
}

/* The mount is live: let the parent go, leave its terminal, and say what happens in
 * syslog from now on. */
static void detach(int fd)
{
	if (fd < 0)
		return;
	if (chdir("/"))
		perror("gmsfs: chdir /");
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		if (null > 2)
			close(null);
	}
	log_to_syslog();
	if (write(fd, "", 1) != 1)
		return; /* the parent is gone: nobody to tell */
	close(fd);
}

/* The mount; a takeover's beneath the old daemon's, on a /dev/fuse of its own, then the
 * old one lifted.  0 or -1. */
static int mount_here(struct fs *fs, const struct fuse_cmdline_opts *cmd, const struct options *opts,
		      struct handover_peer *peer)
{
	if (!peer)
		return fuse_session_mount(fs->se, cmd->mountpoint);
	char err[300], devpath[32];
	int devfd, e = mnt_beneath(cmd->mountpoint, opts->fsname ? opts->fsname : "gmsfs", opts->allow_other, &devfd,
				   err, sizeof err);
	bool lifted = false;
	if (e == -ENOSYS || e == -EINVAL) {
		/* No mount beneath here (Linux before 6.5, or a checker that does not know
		 * fsopen): the old mount goes first, and the mount point is empty for as long
		 * as the mount takes. */
		fprintf(stderr, "gmsfs: takeover: %s: the old mount is lifted first\n", err);
		lifted = !mnt_lift(cmd->mountpoint);
		e = lifted ? 0 : -EBUSY;
		peer->mounted_by_libfuse = true;
	} else if (!e) {
		snprintf(devpath, sizeof devpath, "/dev/fd/%d", devfd);
	}
	if (e || fuse_session_mount(fs->se, lifted ? cmd->mountpoint : devpath)) {
		if (e)
			fprintf(stderr, "gmsfs: takeover: %s\n", err);
		handover_finish(fs, peer, cmd->mountpoint, false, NULL, 0);
		return -1;
	}
	if (handover_finish(fs, peer, cmd->mountpoint, true, err, sizeof err))
		fprintf(stderr, "gmsfs: takeover: %s (serving anyway)\n", err);
	return 0;
}

/* libfuse's loop until a signal (SIGTERM, SIGINT, SIGHUP: its number) or an unmount (0)
 * ends it, or -errno.  Those signals were blocked in main() for the helper threads'
 * sake: this thread alone takes them. */
static int serve_loop(struct fs *fs, const struct options *opts)
{
	struct fuse_loop_config *cfg = fuse_loop_cfg_create();
	if (!cfg)
		return -ENOMEM;
	fuse_loop_cfg_set_clone_fd(cfg, 1);
	fuse_loop_cfg_set_max_threads(cfg, (unsigned)opts->max_threads);
	fuse_loop_cfg_set_idle_threads(cfg, 16);
	stop_signals(SIG_UNBLOCK);
	int r = fuse_session_loop_mt(fs->se, cfg);
	fuse_loop_cfg_destroy(cfg);
	return r;
}

/* Mount, say so, serve until unmounted or signalled.  The exit status. */
static int serve(struct fs *fs, struct fuse_args *args, const struct fuse_cmdline_opts *cmd, const struct options *opts,
		 struct handover_peer *peer)
{
	int ret = 1;
	/* fsname: the source mount(8) compares with fstab's (a GPU uuid from mount.gmsfs). */
	char *o = NULL, *fsname = NULL;
	if (asprintf(&fsname, "fsname=%s", opts->fsname ? opts->fsname : "gmsfs") < 0 ||
	    fuse_opt_add_opt_escaped(&o, fsname) || fuse_opt_add_opt(&o, "subtype=gmsfs,default_permissions") ||
	    fuse_opt_add_arg(args, "-o") || fuse_opt_add_arg(args, o)) {
		free(fsname);
		free(o);
		return 1;
	}
	free(fsname);
	free(o);
	fs->se = fuse_session_new(args, &fs_ops, sizeof fs_ops, fs);
	if (!fs->se)
		return 1;
	if (wait_start(fs)) {
		fprintf(stderr, "gmsfs: no thread for waiting opens\n");
		goto out_session_only;
	}
	uint64_t host_bytes = 0;
	if (opts->host_bytes)
		size_parse(opts->host_bytes, &host_bytes); /* checked by parse_options */
	fs->vmm->helper = mover_path(opts->mover);
	if (tier_start(fs, host_bytes, opts->host_ahead)) {
		fprintf(stderr, "gmsfs: no thread for the host tier\n");
		goto out_session;
	}
	if (!(fs->options = options_text(fs, opts)))
		goto out_tier;
	if (inval_start(fs)) {
		fprintf(stderr, "gmsfs: no thread for the kernel's notices\n");
		goto out_tier;
	}
	if (fuse_set_signal_handlers(fs->se))
		goto out_inval;
	if (mount_here(fs, cmd, opts, peer))
		goto out_signals;
	if (peer && peer->socket_final[0]) /* the old daemon is gone: its socket's name is this one's */
		export_rename(fs, peer->socket_final);
	if (opts->ready_fd >= 0) {
		if (write(opts->ready_fd, "\n", 1) != 1)
			perror("gmsfs: ready_fd");
		close(opts->ready_fd);
	}
	notify_systemd("READY=1\nSTATUS=serving");
	detach(opts->detach_fd); /* from here on, detached, what is said goes to syslog */
	uint64_t now = clock_mono_ns();
	fprintf(stderr, "gmsfs: %s on %s (backend %s, %llu bytes, socket %s; serving %.1f ms after the start: "
			"the device %.1f, the stores %.1f, the mount %.1f)\n",
		fs->vmm->dev.name, cmd->mountpoint, fs->vmm->dev.backend, (unsigned long long)fs->vmm->max_bytes,
		export_socket(fs), (double)(now - opts->t_begin) / 1e6, (double)(opts->t_device - opts->t_begin) / 1e6,
		(double)(opts->t_stores - opts->t_device) / 1e6, (double)(now - opts->t_stores) / 1e6);
	int r = serve_loop(fs, opts);
	if (r > 0)
		fprintf(stderr, "gmsfs: %s: %s, unmounting\n", cmd->mountpoint, strsignal(r));
	else
		fprintf(stderr, "gmsfs: %s: %s\n", cmd->mountpoint, r ? strerror(-r) : "unmounted, ending");
	ret = r < 0 ? 1 : 0;
	/* A successor that lifted this mount ends the loop: the handover ends the process
	 * (and this thread must not unmount, which would lift the successor's mount). */
	pthread_mutex_lock(&fs->mu);
	while (fs->handing_over)
		pthread_cond_wait(&fs->tier_wake, &fs->mu);
	pthread_mutex_unlock(&fs->mu);
	notify_systemd("STOPPING=1");
	fuse_session_unmount(fs->se);
	if (peer && !peer->mounted_by_libfuse && r > 0) /* mnt_beneath's: libfuse knows no mount point */
		mnt_lift(cmd->mountpoint);
out_signals:
	fuse_remove_signal_handlers(fs->se);
out_inval:
	inval_stop(fs);
out_tier:
	tier_stop(fs); /* a move under way ends first: nothing is left half moved */
out_session:
	wait_stop(fs); /* parked requests are answered before their session goes */
out_session_only:
	fuse_session_destroy(fs->se);
	fs->se = NULL;
	return ret;
}

/* Everything before the mount: the mount point (or the daemon to replace), the device,
 * the socket, the stores (handed over, or restored from state=).  0 or -errno and err. */
static int prepare(struct fs *fs, struct options *opts, struct fuse_args *args, const struct fuse_cmdline_opts *cmd,
		   struct handover_peer *peer, uint64_t max_bytes, char *err, size_t errlen)
{
	/* Before the device and the socket are touched: a second daemon changes nothing
	 * (but the one asked to take the first one's place). */
	int e = opts->takeover ? handover_peer(cmd->mountpoint, peer, err, errlen)
			       : mnt_prepare(cmd->mountpoint, err, errlen);
	if (!e && opts->takeover && inherit_options(opts, args, peer, &max_bytes))
		e = -EINVAL, snprintf(err, errlen, "takeover: the old daemon's options are not usable");
	if (!opts->max_threads)
		opts->max_threads = 256;
	if (opts->host_ahead < 0)
		opts->host_ahead = 1;
	fs->allow_other = opts->allow_other;
	if (!e)
		e = store_table_new(fs);
	const char *backend = opts->backend ? opts->backend : opts->takeover ? peer->backend : NULL;
	const char *device = opts->device ? opts->device : opts->takeover ? peer->uuid : NULL;
	/* The old daemon's socket path is its until it ends: this one listens beside it, and
	 * takes the name once the old one is gone (serve). */
	bool same_socket = opts->takeover && opts->socket && !strcmp(opts->socket, peer->socket);
	char socket_path[108];
	snprintf(socket_path, sizeof socket_path, "%s", opts->socket ? opts->socket : "");
	if (same_socket && snprintf(socket_path, sizeof socket_path, "%s.%d", opts->socket, (int)getpid()) >=
				   (int)sizeof socket_path)
		e = -ENAMETOOLONG, snprintf(err, errlen, "socket=%s: too long to stand beside itself during a takeover",
					     opts->socket);
	if (same_socket)
		snprintf(peer->socket_final, sizeof peer->socket_final, "%s", opts->socket);
	if (!e && !(e = vmm_open(&fs->vmm, backend, device, max_bytes, err, errlen))) {
		opts->t_device = clock_mono_ns();
		if (!device && !strncmp(fs->vmm->dev.uuid, "host-", 5))
			host_apart(fs->vmm, cmd->mountpoint);
		e = export_start(fs, opts->socket ? socket_path : NULL, err, errlen);
	}
	if (!e && opts->takeover && opts->state)
		e = -EINVAL, snprintf(err, errlen, "takeover and state= do not go together: under systemd, a restart "
						    "keeps the stores (state=)");
	if (!e && opts->takeover)
		e = handover_take(fs, cmd->mountpoint, peer, err, errlen);
	if (!e && opts->state)
		e = keep_start(fs, opts->state, opts->fdstore, err, errlen);
	opts->t_stores = clock_mono_ns();
	return e;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd = {0};
	struct options opts = { .ready_fd = -1, .detach_fd = -1, .fdstore = 16384, .host_ahead = -1 }; /* max_threads 0: 256 */
	struct fs fs = {
		.mu = PTHREAD_MUTEX_INITIALIZER,
		.root = { FS_NODE_MAGIC, FS_ROOT, NULL },
		.device = { FS_NODE_MAGIC, FS_DEVICE, NULL },
		.status = { FS_NODE_MAGIC, FS_STATUS, NULL },
		.metrics = { FS_NODE_MAGIC, FS_METRICS, NULL },
	};
	uint64_t max_bytes = 0;
	char err[256] = "";
	int ret = parse_options(&args, &opts, &cmd, &max_bytes, argv[0]);
	if (!ret && !cmd.foreground && background(&opts.detach_fd)) {
		perror("gmsfs: fork");
		ret = 1;
	}
	/* The signals that stop the daemon reach the main thread alone: libfuse's loop waits
	 * there for them (its workers block every signal), and one taken by a helper thread
	 * (the waiters', the socket's, the tier's) would end nothing.  Every thread started
	 * from here on keeps them blocked; serve() lets them in just before the loop, and a
	 * stop asked for meanwhile is taken then. */
	stop_signals(SIG_BLOCK);
	if (!ret) {
		/* One malloc arena: every request serialises on fs.mu anyway, and with one arena
		 * per worker thread the memory of a removed store stays spread over eight heaps
		 * that malloc_trim cannot give back (bench/scale.py: cycles). */
		mallopt(M_ARENA_MAX, 1);
		fault_init(); /* GMSFS_FAULT: a test's point to die at */
		raise_nofile();
		clock_gettime(CLOCK_REALTIME, &fs.started);
		opts.t_begin = clock_mono_ns();
		fs_busy(&fs); /* a start is busy: its engines come back now (tier.c's quiet mount) */
		struct handover_peer peer;
		int e = prepare(&fs, &opts, &args, &cmd, &peer, max_bytes, err, sizeof err);
		if (e) {
			fprintf(stderr, "gmsfs: %s\n", err[0] ? err : strerror(-e));
			ret = 1;
		} else {
			ret = serve(&fs, &args, &cmd, &opts, opts.takeover ? &peer : NULL);
		}
		export_stop(&fs);
		free(fs.options);
		keep_stop(&fs); /* before the stores go: the service manager keeps their memory */
		vmm_leave(fs.vmm); /* the copier let go first: it frees nothing of theirs under a restart */
		store_table_free(&fs);
		inval_free(&fs);
		vmm_close(fs.vmm);
	}
	free(cmd.mountpoint);
	fuse_opt_free_args(&args);
	free(opts.backend);
	free(opts.device);
	free(opts.socket);
	free(opts.max_bytes);
	free(opts.host_bytes);
	free(opts.mover);
	free(opts.fsname);
	free(opts.state);
	log_end();
	return ret < 0 ? 0 : ret;
}
