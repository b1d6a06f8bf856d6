/* gmsfs: one daemon and one mount per GPU.  See gmsfs(8). */
#include "fs.h"
#include "handover.h"
#include "inval.h"
#include "keep.h"
#include "log.h"
#include "memory.h"
#include "mnt.h"
#include "options.h"
#include "store.h"
#include "tier.h"
#include "wait.h"
#include "export/export.h"
#include "fdpass.h"
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

/* On the releaser thread, before each release of memory (vmm.h). */
static void release_fault(void)
{
	fault_point("release", "buf");
}

/* Allocations hold descriptors: allow as many as the hard limit, and make the table
 * for FDS_AHEAD of them now, while this process has one thread.  Linux grows a process's
 * descriptor table by doubling it, and where threads share the table each growth waits
 * for an RCU grace period (synchronize_rcu in expand_fdtable): 10-35 ms on the GPU host,
 * under fs->mu, each time a takeover (or a writer's creates) pass 64, 128, 256...
 * descriptors.  The table costs 8 bytes a slot (512 KiB for FDS_AHEAD). */
#define FDS_AHEAD 65536

static void raise_nofile(void)
{
	struct rlimit nofile;
	if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur < nofile.rlim_max) {
		nofile.rlim_cur = nofile.rlim_max;
		setrlimit(RLIMIT_NOFILE, &nofile);
	}
	if (getrlimit(RLIMIT_NOFILE, &nofile))
		return;
	rlim_t top = nofile.rlim_cur < FDS_AHEAD ? nofile.rlim_cur : FDS_AHEAD;
	int any = open("/dev/null", O_RDONLY | O_CLOEXEC), high = any >= 0 && top > 1 ?
				  fcntl(any, F_DUPFD_CLOEXEC, (int)(top - 1)) : -1;
	if (high >= 0)
		close(high); /* the table stays as large as it grew */
	if (any >= 0)
		close(any);
}

/* systemd's readiness (Type=notify), without libsystemd: one datagram of "READY=1" to
 * $NOTIFY_SOCKET (a path, or an abstract name after '@').  Nothing when it is unset. */
static void notify_systemd(const char *state)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	socklen_t alen = fdpass_notify_addr(&a);
	int s = alen ? socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0) : -1;
	if (s < 0)
		return;
	if (sendto(s, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&a, alen) < 0)
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

/* The daemon serves: where, and where its start's time went. */
static void say_serving(struct fs *fs, const struct fuse_cmdline_opts *cmd, const struct options *opts)
{
	uint64_t now = clock_mono_ns();
	fprintf(stderr, "gmsfs: %s on %s (backend %s, %llu bytes, socket %s; serving %.1f ms after the start: "
			"the device %.1f, the stores %.1f, the mount %.1f)\n",
		fs->vmm->dev.name, cmd->mountpoint, fs->vmm->dev.backend, (unsigned long long)fs->vmm->max_bytes,
		export_socket(fs), (double)(now - opts->t_begin) / 1e6, (double)(opts->t_device - opts->t_begin) / 1e6,
		(double)(opts->t_stores - opts->t_device) / 1e6, (double)(now - opts->t_stores) / 1e6);
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
		size_parse(opts->host_bytes, &host_bytes); /* checked by options_parse */
	fs->vmm->helper = options_mover(opts->mover);
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
	say_serving(fs, cmd, opts);
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
	if (!e && opts->takeover && options_inherit(opts, args, peer, &max_bytes))
		e = -EINVAL, snprintf(err, errlen, "takeover: the old daemon's options are not usable");
	if (!opts->max_threads)
		opts->max_threads = 256;
	if (opts->host_ahead < 0)
		opts->host_ahead = 1;
	if (opts->next_ahead < 0)
		opts->next_ahead = 1;
	fs->next_ahead = opts->next_ahead;
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
	/* The device's facts as the daemon before had them: then its driver opens behind the
	 * start, and the stores it kept are served at once. */
	struct vmm_known kept;
	struct vmm_known *known = opts->takeover ? (peer->known.dev.uuid[0] ? &peer->known : NULL)
				 : opts->state && !keep_device_facts(opts->state, &kept) ? &kept : NULL;
	if (known)
		known->busy_ns = &fs->busy_ns;
	if (!e && !(e = vmm_open(&fs->vmm, backend, device, known, max_bytes, err, errlen))) {
		opts->t_device = clock_mono_ns();
		uint64_t piece = VMM_PIECE_DEFAULT;
		if (opts->piece_bytes)
			size_parse(opts->piece_bytes, &piece); /* checked by options_parse; 0: never */
		fs->vmm->piece_bytes = vmm_align(fs->vmm, piece);
		fs->vmm->before_release = release_fault;
		if (opts->gpu >= 0)
			fs->vmm->dev.gpu = opts->gpu;
		if (!device && !strncmp(fs->vmm->dev.uuid, "host-", 5))
			host_apart(fs->vmm, cmd->mountpoint);
		e = export_start(fs, opts->socket ? socket_path : NULL, err, errlen);
	}
	if (!e && opts->takeover && opts->state)
		e = -EINVAL, snprintf(err, errlen, "takeover and state= do not go together: under systemd, a restart "
						    "keeps the stores (state=)");
	if (!e && opts->takeover)
		e = handover_take(fs, cmd->mountpoint, peer, err, errlen);
	if (!e && opts->state && !(e = keep_start(fs, opts->state, opts->fdstore, err, errlen)) && !fs->vmm->known)
		keep_device_remember(opts->state, fs->vmm);
	opts->t_stores = clock_mono_ns();
	return e;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd = {0};
	struct options opts = { .ready_fd = -1, .detach_fd = -1, .fdstore = 16384, .host_ahead = -1, .next_ahead = -1,
				.gpu = -1 }; /* max_threads 0: 256 */
	struct fs fs = {
		.mu = PTHREAD_MUTEX_INITIALIZER,
		.root = { FS_NODE_MAGIC, FS_ROOT, NULL },
		.device = { FS_NODE_MAGIC, FS_DEVICE, NULL },
		.status = { FS_NODE_MAGIC, FS_STATUS, NULL },
		.metrics = { FS_NODE_MAGIC, FS_METRICS, NULL },
		.make_memory = memory_make_waiting, /* the one door, for the modules below it too */
	};
	uint64_t max_bytes = 0;
	char err[256] = "";
	int ret = options_parse(&args, &opts, &cmd, &max_bytes, argv[0]);
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
		/* The heap's top is given back by malloc_trim (store_want_trim), not on every free:
		 * a socket reply's buffers (about 120 KB, made and freed per request) would
		 * otherwise be given back and faulted in again each time, 30-100 us of an
		 * import's round trip. */
		mallopt(M_TRIM_THRESHOLD, 64 << 20);
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
	options_free(&opts);
	log_end();
	return ret < 0 ? 0 : ret;
}
