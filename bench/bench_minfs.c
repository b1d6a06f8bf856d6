/* bench-minfs MOUNTPOINT: the baseline for gmsfs's control files, a minimal low-level
 * FUSE file system (after libfuse's hello_ll.c) served the way gmsfs serves: the
 * multi-threaded loop, a cloned /dev/fuse per worker, 16 idle workers kept.
 *
 *   /state   0444, its text made when it is read (direct_io), as gmsfs's state is
 *   /lock    0644, open and release answered at once
 *
 * Runs in the foreground until unmounted; bench-control times the same operations
 * here and on gmsfs. */
#define FUSE_USE_VERSION 312 /* fuse_session_loop_mt with a fuse_loop_config, as gmsfs */
#include <fuse_lowlevel.h>

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { INO_ROOT = FUSE_ROOT_ID, INO_STATE, INO_LOCK };

static atomic_ulong reads;

static int attr_of(fuse_ino_t ino, struct stat *s)
{
	memset(s, 0, sizeof *s);
	s->st_ino = ino;
	s->st_nlink = 1;
	switch (ino) {
	case INO_ROOT:
		s->st_mode = S_IFDIR | 0755;
		s->st_nlink = 2;
		return 0;
	case INO_STATE:
		s->st_mode = S_IFREG | 0444;
		return 0;
	case INO_LOCK:
		s->st_mode = S_IFREG | 0644;
		return 0;
	}
	return -ENOENT;
}

static void mf_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e = { .entry_timeout = 3600, .attr_timeout = 3600 };
	if (parent != INO_ROOT)
		return (void)fuse_reply_err(req, ENOENT);
	e.ino = !strcmp(name, "state") ? INO_STATE : !strcmp(name, "lock") ? INO_LOCK : 0;
	if (!e.ino)
		return (void)fuse_reply_err(req, ENOENT);
	attr_of(e.ino, &e.attr);
	fuse_reply_entry(req, &e);
}

static void mf_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	struct stat s;
	int e = attr_of(ino, &s);
	if (e)
		return (void)fuse_reply_err(req, -e);
	fuse_reply_attr(req, &s, 3600);
}

static void mf_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ino == INO_ROOT)
		return (void)fuse_reply_err(req, EISDIR);
	if (ino == INO_STATE && (fi->flags & O_ACCMODE) != O_RDONLY)
		return (void)fuse_reply_err(req, EACCES);
	fi->direct_io = ino == INO_STATE;
	fuse_reply_open(req, fi);
}

static void mf_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	char text[256];
	int n = ino == INO_STATE ? snprintf(text, sizeof text,
					     "state: COMMITTED\nwriter: 0\nreaders: 1\nwaiting_writers: 0\n"
					     "waiting_readers: 0\ngeneration: %lu\n",
					     (unsigned long)atomic_fetch_add(&reads, 1)) :
				   0;
	if (off >= n)
		return (void)fuse_reply_buf(req, NULL, 0);
	fuse_reply_buf(req, text + off, (size_t)n - (size_t)off < size ? (size_t)n - (size_t)off : size);
}

static void mf_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static const struct fuse_lowlevel_ops mf_ops = {
	.lookup = mf_lookup,
	.getattr = mf_getattr,
	.open = mf_open,
	.read = mf_read,
	.release = mf_release,
};

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s MOUNTPOINT\n", argv[0]);
		return 2;
	}
	char *args_v[] = { argv[0], "-ofsname=minfs,subtype=minfs,default_permissions", NULL };
	struct fuse_args args = FUSE_ARGS_INIT(2, args_v);
	struct fuse_session *se = fuse_session_new(&args, &mf_ops, sizeof mf_ops, NULL);
	int ret = 1;
	if (!se)
		return 1;
	if (fuse_set_signal_handlers(se) || fuse_session_mount(se, argv[1]))
		goto out;
	struct fuse_loop_config *cfg = fuse_loop_cfg_create();
	fuse_loop_cfg_set_clone_fd(cfg, 1);
	fuse_loop_cfg_set_max_threads(cfg, 256);
	fuse_loop_cfg_set_idle_threads(cfg, 16);
	ret = fuse_session_loop_mt(se, cfg) ? 1 : 0;
	fuse_loop_cfg_destroy(cfg);
	fuse_session_unmount(se);
out:
	fuse_remove_signal_handlers(se);
	fuse_session_destroy(se);
	return ret;
}
