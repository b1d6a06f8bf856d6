/* version: named versions, a client's side (gmsfs(5), NAMED VERSIONS).  The daemon keeps
 * the names: a member of the writer session names its commit (user.gms.version, set on
 * the store directory), and STORE/version and STORE/versions say what is committed;
 * polling STORE/version wakes at each commit.  A name is checked here before it is asked
 * for, and by the daemon. */
#include "internal.h"
#include "version_name.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

/* What the open file fd says now (read at offset 0: the daemon makes its text again),
 * NUL-terminated in buf: its length, or -errno. */
static ssize_t read_now(int fd, char *buf, size_t size)
{
	ssize_t n = pread(fd, buf, size - 1, 0);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return n;
}

/* The same of the store directory dir's file name. */
static ssize_t read_store_file(const char *dir, const char *name, char *buf, size_t size)
{
	char path[4096];
	if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
		return -ENAMETOOLONG;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = read_now(fd, buf, size);
	close(fd);
	return n;
}

/* In STORE/versions' text ("GENERATION NAME STATE" lines): the generation of the commit
 * named name (0: none), and the name of generation gen into of (may be NULL). */
static uint64_t find(const char *text, const char *name, uint64_t gen, char *of)
{
	uint64_t found = 0;
	for (const char *line = text; *line;) {
		unsigned long long g;
		char n[GMSFS_VERSION_NAME_MAX + 1];
		if (sscanf(line, "%llu %64s", &g, n) == 2) {
			if (name && !strcmp(n, name))
				found = g;
			if (of && g == gen)
				strcpy(of, n);
		}
		const char *nl = strchr(line, '\n');
		line = nl ? nl + 1 : line + strlen(line);
	}
	return found;
}

static int name_refused(gmsfs *g, const char *name, int e)
{
	return gm_error(g, e, "commit_version %s: %s", name,
			e == -EINVAL ? "not a version name: " GMSFS_VERSION_NAME_WORDS
			: e == -EEXIST ? "a commit of the store had that name (STORE/versions): a name is a store's once"
				       : strerror(-e));
}

/* A daemon from before COMMIT_NAMED: the name first (user.gms.version), then the commit;
 * a failed commit takes the name back. */
static int commit_named_apart(gmsfs *g, const char *name, bool unmap)
{
	if (setxattr(g->dir, GMSFS_XATTR_VERSION, name, strlen(name), 0))
		return name_refused(g, name, -errno);
	int e = gm_commit(g, unmap);
	if (e)
		removexattr(g->dir, GMSFS_XATTR_VERSION); /* nothing committed: no name kept for another */
	return e;
}

/* gmsfs_commit_version, and with unmap its _unmap_all: the name goes with the commit, in
 * its round trip (a setxattr of user.gms.version before it was 0.3-0.8 ms on an H200's
 * host, most of a group refit's commit). */
static int commit_named(gmsfs *g, const char *name, bool unmap)
{
	if (!g)
		return -EINVAL;
	if (!name || !gmsfs_version_name_valid(name, strlen(name)))
		return gm_error(g, -EINVAL, "commit_version: a name is " GMSFS_VERSION_NAME_WORDS);
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	if (!g->names_apart) {
		e = gm_commit_named(g, unmap, name);
		if (e == -EINVAL && strstr(g->err, "unknown op"))
			g->names_apart = true; /* an older daemon, its connection dropped: the next call binds again */
		else if (e == -EEXIST)
			return name_refused(g, name, e);
	}
	if (g->names_apart)
		e = commit_named_apart(g, name, unmap);
	return e ? e : unmap ? gm_unmap_committed(g) : 0;
}

int gmsfs_commit_version(gmsfs *g, const char *name)
{
	return commit_named(g, name, false);
}

int gmsfs_commit_version_unmap_all(gmsfs *g, const char *name)
{
	return commit_named(g, name, true);
}

/* The daemon's COMMIT_LEAVE gives back what the writer's UNLOCKs would have (an INFO, the
 * lock file's UNLOCK and the directory's: three FUSE round trips after the commit's own);
 * its lock file's close is the one left.  A daemon that predates the op: the commit, then
 * the disconnect's own UNLOCKs. */
int gmsfs_commit_disconnect(gmsfs *g, const char *version)
{
	if (!g)
		return -EINVAL;
	if (version && !gmsfs_version_name_valid(version, strlen(version)))
		return gm_error(g, -EINVAL, "commit_disconnect: a name is " GMSFS_VERSION_NAME_WORDS);
	int e = gm_need_lock(g, GMSFS_RW);
	if (e)
		return e;
	double t0 = 0, t1 = 0;
	if (!g->leave_apart) {
		e = gm_commit_request(g, version, true, &t0, &t1);
		if (e == -EINVAL && strstr(g->err, "unknown op"))
			g->leave_apart = true; /* its connection dropped: the next call binds again */
	}
	if (g->leave_apart)
		e = version ? gmsfs_commit_version_unmap_all(g, version) : gmsfs_commit_unmap_all(g);
	else if (e == -EEXIST && version)
		return name_refused(g, version, e);
	if (e)
		return e; /* nothing committed: g as it was */
	g->left = !g->leave_apart;
	bool apart = g->leave_apart; /* g is freed below */
	double t2 = t0 ? gm_us() : 0;
	gmsfs_disconnect(g);
	if (t0 && !apart)
		fprintf(stderr, "gmsfs commit_disconnect: %.0f us: queued work drained %.0f us, committed and left %.0f us, "
			"disconnected %.0f us (from %.0f)\n", gm_us() - t0, t1 - t0, t2 - t1, gm_us() - t2, gm_trace_clock(t0));
	return 0;
}

int gmsfs_version_name(gmsfs *g, char *name)
{
	if (!g || !name)
		return -EINVAL;
	name[0] = '\0';
	char text[4096];
	ssize_t n = read_store_file(g->dir, "versions", text, sizeof text);
	if (n < 0)
		return gm_error(g, (int)n, "version_name: reading %s/versions: %s", g->dir, strerror((int)-n));
	find(text, NULL, g->info.generation, name);
	return name[0] ? 0 : -ENODATA;
}

/* The generation of the store's last commit where name is its name (user.gms.version,
 * "GENERATION NAME": one round trip); 0 where it is another, has none, or none is. */
static uint64_t last_named(gmsfs *g, const char *name, char *last, size_t size)
{
	ssize_t l = getxattr(g->dir, GMSFS_XATTR_VERSION, last, size - 1);
	last[l > 0 ? l : 0] = '\0';
	unsigned long long gen = 0;
	char n[GMSFS_VERSION_NAME_MAX + 1] = "";
	return l > 0 && sscanf(last, "%llu %64s", &gen, n) == 2 && !strcmp(n, name) ? gen : 0;
}

int gmsfs_flip_to(gmsfs *g, const char *name, size_t *changed)
{
	if (changed)
		*changed = 0;
	if (!g || !name)
		return -EINVAL;
	if (g->lock != GMSFS_RO)
		return gm_error(g, -EINVAL, "flip_to: a reader's call");
	/* The last commit's name first: a flip to the newest needs no read of STORE/versions
	 * (an open, a read and a close: 0.3-0.5 ms of a 2 ms flip on a GPU host). */
	char last[96];
	double t0 = gm_tracing() ? gm_us() : 0;
	uint64_t gen = last_named(g, name, last, sizeof last);
	if (t0)
		fprintf(stderr, "gmsfs_flip_to: the last commit's name asked in %.0f us (from %.0f)\n", gm_us() - t0,
			gm_trace_clock(t0));
	if (!gen) { /* another: whether a commit had the name, and whether g holds it */
		char text[4096];
		ssize_t n = read_store_file(g->dir, "versions", text, sizeof text);
		if (n < 0)
			return gm_error(g, (int)n, "flip_to: reading %s/versions: %s", g->dir, strerror((int)-n));
		uint64_t had = find(text, name, 0, NULL);
		if (!had)
			return gm_error(g, -ENOENT, "flip_to %s: no commit of %s had that name", name, g->dir);
		if (had == g->info.generation)
			return 0;
		return gm_error(g, -ESTALE, "flip_to %s: the store's last commit is another (%s)", name,
				last[0] ? last : "one with no name");
	}
	if (gen == g->info.generation)
		return 0;
	int e = gmsfs_flip(g, changed);
	if (!e && g->info.generation != gen) /* only a reader from before a daemon restart can meet this */
		return gm_error(g, -ESTALE, "flip_to %s: the store was committed again meanwhile (generation %llu)", name,
				(unsigned long long)g->info.generation);
	return e;
}

int gmsfs_wait_version(const char *store, const char *name, int timeout_ms)
{
	if (!store || !name || !gmsfs_version_name_valid(name, strlen(name)))
		return -EINVAL;
	char path[4096], text[4096];
	if (snprintf(path, sizeof path, "%s/version", store) >= (int)sizeof path)
		return -ENAMETOOLONG;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int64_t end = timeout_ms >= 0 ? gm_now_ms() + timeout_ms : 0;
	int e;
	for (;;) {
		ssize_t n = read_now(fd, text, sizeof text);
		if (n < 0) {
			e = (int)n;
			break;
		}
		if (n > 0 && text[n - 1] == '\n')
			text[n - 1] = '\0';
		if (!strcmp(text, name)) {
			e = 0;
			break;
		}
		if ((n = read_store_file(store, "versions", text, sizeof text)) >= 0 && find(text, name, 0, NULL)) {
			e = -ESTALE; /* named once, committed past since */
			break;
		}
		int left = timeout_ms < 0 ? -1 : (int)(end - gm_now_ms());
		if (timeout_ms >= 0 && left <= 0) {
			e = -ETIMEDOUT;
			break;
		}
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, left) < 0 && errno != EINTR) {
			e = -errno;
			break;
		}
	}
	close(fd);
	return e;
}
