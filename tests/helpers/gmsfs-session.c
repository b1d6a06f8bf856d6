/* gmsfs-session: begin a writer session one way, use it as its member would, commit.
 * For the tests of every way a session starts (gmsfs(5), LOCKS; tests/26-sessions.bats).
 *
 *   gmsfs-session WAY STORE
 *
 * WAY: lock-wronly, lock-rdwr (open STORE/lock; then allocs/x is created in the session),
 * creat-alloc-rdwr, creat-alloc-wronly, creat-meta-rdwr, creat-meta-wronly (open(2) with
 * O_CREAT of allocs/x or meta/e), alloc-wronly (O_WRONLY of allocs/x, committed by an
 * earlier run).
 * Each check prints "ok WHAT" or "FAIL WHAT: why" and a failure ends it (status 1);
 * at the end "committed". */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

static const char *store;

static void check(int ok, const char *what, ...)
{
	char text[256];
	va_list ap;
	va_start(ap, what);
	vsnprintf(text, sizeof text, what, ap);
	va_end(ap);
	if (ok) {
		printf("ok %s\n", text);
		return;
	}
	printf("FAIL %s: %s\n", text, strerror(errno));
	exit(1);
}

static const char *at(const char *rel)
{
	static char paths[4][4096];
	static int next;
	char *p = paths[next++ % 4];
	snprintf(p, sizeof paths[0], "%s/%s", store, rel);
	return p;
}

/* What a member does with a file it has open (fd, path rel): its attributes by
 * descriptor and by name, a size, a write and a read back. */
static void use(int fd, const char *rel, int is_alloc, int readable)
{
	struct stat a, b;
	check(!fstat(fd, &a) && S_ISREG(a.st_mode), "fstat %s", rel);
	check(!stat(at(rel), &b) && b.st_ino == a.st_ino, "stat %s (same inode as fstat)", rel);
	off_t size = is_alloc ? (a.st_size ? a.st_size : 8192) : 3;
	if (!is_alloc || !a.st_size) /* an allocation's size is set once */
		check(!ftruncate(fd, size), "ftruncate %s %lld", rel, (long long)size);
	check(!fstat(fd, &a) && a.st_size == size, "fstat %s: size %lld", rel, (long long)size);
	const char *data = is_alloc ? "hello" : "{1}";
	size_t len = strlen(data);
	check(pwrite(fd, data, len, 0) == (ssize_t)len, "write %s", rel);
	int rfd = readable ? fd : open(at(rel), O_RDONLY);
	check(rfd >= 0, "open %s O_RDONLY (a member's read)", rel);
	char buf[16] = { 0 };
	check(pread(rfd, buf, len, 0) == (ssize_t)len && !memcmp(buf, data, len), "read %s back", rel);
	if (rfd != fd)
		close(rfd);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: gmsfs-session WAY STORE\n");
		return 2;
	}
	const char *way = argv[1];
	store = argv[2];
	int fd = -1, is_alloc = 1, readable = 1;
	const char *rel = "allocs/x";
	if (!strcmp(way, "lock-wronly") || !strcmp(way, "lock-rdwr")) {
		int l = open(at("lock"), way[5] == 'w' ? O_WRONLY : O_RDWR);
		check(l >= 0, "open lock");
		struct stat s;
		check(!fstat(l, &s), "fstat lock");
		fd = open(at(rel), O_CREAT | O_RDWR | O_EXCL, 0644);
		check(fd >= 0, "create %s in the session", rel);
	} else if (!strncmp(way, "creat-", 6)) {
		int meta = !strncmp(way + 6, "meta", 4);
		readable = !!strstr(way, "rdwr");
		is_alloc = !meta;
		rel = meta ? "meta/e" : "allocs/x";
		fd = open(at(rel), O_CREAT | (readable ? O_RDWR : O_WRONLY), 0644);
		check(fd >= 0, "open %s O_CREAT|%s (begins the session)", rel, readable ? "O_RDWR" : "O_WRONLY");
	} else if (!strcmp(way, "alloc-wronly")) {
		readable = 0; /* allocs/x, as an earlier run committed it */
		fd = open(at(rel), O_WRONLY);
		check(fd >= 0, "open %s O_WRONLY (begins the session)", rel);
	} else {
		fprintf(stderr, "gmsfs-session: unknown way %s\n", way);
		return 2;
	}
	use(fd, rel, is_alloc, readable);
	/* Directories and more files, made in the session by the same member (d2/ when the
	 * store was committed by an earlier run, with d/). */
	const char *d = !strcmp(way, "alloc-wronly") ? "d2" : "d";
	char ad[64], md[64], y_rel[64], w_rel[64], y_name[64];
	snprintf(ad, sizeof ad, "allocs/%s", d);
	snprintf(md, sizeof md, "meta/%s", d);
	snprintf(y_rel, sizeof y_rel, "allocs/%s/y", d);
	snprintf(w_rel, sizeof w_rel, "meta/%s/w", d);
	snprintf(y_name, sizeof y_name, "%s/y", d);
	check(!mkdir(at(ad), 0755), "mkdir %s", ad);
	check(!mkdir(at(md), 0755), "mkdir %s", md);
	int y = open(at(y_rel), O_CREAT | O_RDWR, 0644);
	check(y >= 0, "create %s", y_rel);
	use(y, y_rel, 1, 1);
	int e = open(at(w_rel), O_CREAT | O_WRONLY | O_TRUNC, 0644);
	check(e >= 0, "create %s", w_rel);
	use(e, w_rel, 0, 0);
	/* Entries name an allocation (and are a commit's to check). */
	check(!setxattr(at(w_rel), "user.gms.alloc", y_name, strlen(y_name), 0), "setxattr %s", w_rel);
	if (!is_alloc)
		check(!setxattr(at(rel), "user.gms.alloc", y_name, strlen(y_name), 0), "setxattr %s", rel);
	close(y);
	close(e);
	int c = open(at("commit"), O_WRONLY);
	check(c >= 0 && write(c, "\n", 1) == 1, "commit");
	close(c);
	close(fd);
	printf("committed\n");
	return 0;
}
