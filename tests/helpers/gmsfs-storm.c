/* gmsfs-storm: many processes at a store at once, for the tests of locks under load.
 *
 *   gmsfs-storm reopen STORE N          N times: open lock for reading, close, open it
 *                                       for writing at once: "edeadlk=K stuck=J"
 *   gmsfs-storm opens STORE PROCS SECS  PROCS processes open, write, commit, abort and
 *                                       close at random for SECS seconds while a monitor
 *                                       reads state: never a writer with readers
 *   gmsfs-storm libwriter STORE SEED    libgmsfs writer in a loop: connect, build a
 *                                       layout of its own seed, commit (for SIGKILL)
 *   gmsfs-storm libinplace STORE SEED   libgmsfs writer in a loop: connect, write a seed
 *                                       of its own over the committed w* in place, commit
 *                                       (killed mid-write: the store is TORN)
 *   gmsfs-storm libimporter STORE SEED  libgmsfs writer in a loop: connect, import the
 *                                       last commit (read-only to it), read it, make one
 *                                       allocation of its own, leave without commit
 *                                       (killed anywhere: never TORN)
 *   gmsfs-storm libreader STORE         libgmsfs reader in a loop: connect, import,
 *                                       check every byte against the seed in meta/seed
 * A blocking open that has not returned after 10 s counts as stuck (SIGALRM). */
#include <gmsfs/gmsfs.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

static const char *store;

static void on_alarm(int sig) { (void)sig; }

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int open_in(const char *name, int flags)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", store, name);
	alarm(10);
	int fd = open(path, flags | O_CLOEXEC, 0644);
	int e = errno;
	alarm(0);
	errno = e;
	return fd;
}

/* Counters shared by the storm's processes. */
struct counts {
	long ops, edeadlk, stuck, unexpected, violations;
	char first[200];
};

static void count(struct counts *c, int e, const char *what)
{
	if (e == EDEADLK)
		__atomic_add_fetch(&c->edeadlk, 1, __ATOMIC_RELAXED);
	else if (e == EINTR)
		__atomic_add_fetch(&c->stuck, 1, __ATOMIC_RELAXED);
	else {
		if (__atomic_add_fetch(&c->unexpected, 1, __ATOMIC_RELAXED) == 1)
			snprintf(c->first, sizeof c->first, "%s: %s", what, strerror(e));
	}
}

static int reopen(int n)
{
	struct counts c = {0};
	for (int i = 0; i < n; i++) {
		int fd = open_in("lock", O_RDONLY);
		if (fd < 0) {
			count(&c, errno, "read open");
			continue;
		}
		close(fd);
		if ((fd = open_in("lock", O_WRONLY)) < 0) {
			count(&c, errno, "write open");
			continue;
		}
		close(fd);
	}
	printf("edeadlk=%ld stuck=%ld unexpected=%ld %s\n", c.edeadlk, c.stuck, c.unexpected, c.first);
	return c.edeadlk || c.stuck || c.unexpected;
}

/* One random step of a storm process. */
static void step(struct counts *c, unsigned *seed, int id)
{
	int fd, op = rand_r(seed) % 5;
	char name[64];
	switch (op) {
	case 0: /* a reader */
	case 1:
		if ((fd = open_in("lock", O_RDONLY | (op ? O_NONBLOCK : 0))) < 0) {
			if (!(op && errno == EAGAIN))
				count(c, errno, "read open");
			return;
		}
		usleep(rand_r(seed) % 2000);
		close(fd);
		break;
	case 2: /* a writer that commits or aborts an entry of its own */
	case 3:
		if ((fd = open_in("lock", O_WRONLY)) < 0)
			return count(c, errno, "write open");
		snprintf(name, sizeof name, "meta/p%d", id);
		int m = open_in(name, O_WRONLY | O_CREAT | O_TRUNC);
		if (m < 0 || write(m, "v", 1) != 1 || fsetxattr(m, "user.gms.alloc", "a", 1, 0))
			count(c, errno, "entry");
		if (m >= 0)
			close(m);
		int k = open_in(op == 2 ? "commit" : "abort", O_WRONLY);
		if (k < 0 || write(k, "1", 1) != 1)
			count(c, errno, op == 2 ? "commit" : "abort");
		if (k >= 0)
			close(k);
		close(fd);
		break;
	default: /* close a read handle, write at once */
		if ((fd = open_in("lock", O_RDONLY)) < 0)
			return count(c, errno, "read open");
		close(fd);
		if ((fd = open_in("lock", O_WRONLY)) < 0)
			return count(c, errno, "write open after close");
		close(fd);
	}
	__atomic_add_fetch(&c->ops, 1, __ATOMIC_RELAXED);
}

/* Never a writer together with readers, in any state the daemon shows. */
static void monitor(struct counts *c, double until)
{
	char path[4200], buf[2048];
	snprintf(path, sizeof path, "%s/state", store);
	while (now() < until) {
		int fd = open(path, O_RDONLY);
		ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
		if (fd >= 0)
			close(fd);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		char *w = strstr(buf, "\nwriter: "), *r = strstr(buf, "\nreaders: ");
		if (w && r && atol(w + 9) && atol(r + 10))
			__atomic_add_fetch(&c->violations, 1, __ATOMIC_RELAXED);
	}
}

static int opens(int procs, int secs)
{
	struct counts *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	double until = now() + secs;
	for (int i = 0; i <= procs; i++)
		if (fork() == 0) {
			if (i == procs) {
				monitor(c, until);
				_exit(0);
			}
			unsigned seed = (unsigned)getpid();
			while (now() < until)
				step(c, &seed, i);
			_exit(0);
		}
	while (wait(NULL) > 0)
		;
	printf("ops=%ld edeadlk=%ld stuck=%ld unexpected=%ld violations=%ld %s\n", c->ops, c->edeadlk, c->stuck,
	       c->unexpected, c->violations, c->first);
	return c->edeadlk || c->stuck || c->unexpected || c->violations || !c->ops;
}

/* ---- libgmsfs roles for the kill storm: bytes that tell whose they are ---- */

static uint8_t pattern(unsigned seed, int k, uint64_t i)
{
	return (uint8_t)(seed * 131 + (unsigned)k * 7 + i * 13);
}

/* Every allocation of the store, by name (the writer's own view of allocs/). */
static bool free_all(gmsfs *g)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/allocs", store);
	DIR *d = opendir(path);
	char names[64][256];
	size_t n = 0;
	for (struct dirent *x; d && n < 64 && (x = readdir(d));) /* all first: frees move the listing */
		if (x->d_name[0] != '.')
			snprintf(names[n++], sizeof names[0], "%s", x->d_name);
	bool ok = d != NULL;
	if (d)
		closedir(d);
	for (size_t i = 0; ok && i < n; i++)
		ok = !gmsfs_free_name(g, names[i]);
	return ok;
}

static int libwriter(unsigned seed)
{
	for (unsigned round = 0;; round++) {
		gmsfs *g;
		if (gmsfs_connect(&g, store, GMSFS_RW, -1)) {
			gmsfs_disconnect(g);
			usleep(1000);
			continue;
		}
		unsigned s = seed * 1000 + round;
		/* Start from scratch: the committed layout is another writer's, freed by name,
		 * never mapped (so nothing of it is written in place: its kill leaves no TORN
		 * store).  A step that fails ends the session uncommitted: a seed put on another
		 * writer's w0 would be this helper's fault, not the daemon's. */
		bool ok = free_all(g);
		int n = 1 + (int)(s % 4);
		for (int k = 0; ok && k < n; k++) {
			char name[32];
			uint8_t *p;
			uint64_t size = 4096 * (1 + (s + (unsigned)k) % 8);
			snprintf(name, sizeof name, "w%d", k);
			if (gmsfs_create(g, name, size, NULL, (void **)&p)) {
				ok = k > 0; /* what it made is whole: committed as it is */
				break;
			}
			for (uint64_t i = 0; i < size; i++)
				p[i] = pattern(s, k, i);
		}
		char v[16];
		int len = snprintf(v, sizeof v, "%u", s);
		if (ok && !gmsfs_meta_put(g, "seed", "w0", 0, v, (size_t)len))
			gmsfs_commit(g);
		gmsfs_disconnect(g);
	}
	return 0;
}

static int libinplace(unsigned seed)
{
	for (unsigned round = 0;; round++) {
		gmsfs *g;
		if (gmsfs_connect(&g, store, GMSFS_RW, -1) || gmsfs_import_all(g)) {
			gmsfs_disconnect(g);
			usleep(1000);
			continue;
		}
		unsigned s = seed * 1000 + round;
		const struct gmsfs_mapping *m;
		size_t n = gmsfs_mappings(g, &m);
		for (size_t j = 0; j < n; j++) {
			if (m[j].name[0] != 'w')
				continue; /* a shell writer's */
			uint8_t *p = m[j].ptr;
			int k = atoi(m[j].name + 1);
			if (gmsfs_protect(g, m[j].name, 1)) /* said before the first byte */
				break;
			for (uint64_t i = 0; i < m[j].size; i++)
				p[i] = pattern(s, k, i);
		}
		char v[16];
		int len = snprintf(v, sizeof v, "%u", s);
		if (!gmsfs_meta_put(g, "seed", "w0", 0, v, (size_t)len))
			gmsfs_commit(g);
		gmsfs_disconnect(g);
	}
	return 0;
}

static int libimporter(unsigned seed)
{
	for (unsigned round = 0;; round++) {
		gmsfs *g;
		void *mine;
		if (gmsfs_connect(&g, store, GMSFS_RW, -1) || gmsfs_import_all(g)) {
			gmsfs_disconnect(g);
			usleep(1000);
			continue;
		}
		const struct gmsfs_mapping *m;
		size_t n = gmsfs_mappings(g, &m);
		volatile unsigned sum = 0;
		for (size_t j = 0; j < n; j++) /* reads the old model, as a publisher does */
			for (uint64_t i = 0; i < m[j].size; i += 512)
				sum += ((const volatile uint8_t *)m[j].ptr)[i];
		char name[32];
		snprintf(name, sizeof name, "imp%u", seed % 1000);
		if (!gmsfs_create(g, name, 4096, NULL, &mine))
			memset(mine, (int)(round + sum), 4096);
		usleep(1000 * (round % 5));
		gmsfs_disconnect(g); /* without commit: rolls back, never torn */
	}
	return 0;
}

static int libreader(void)
{
	for (;;) {
		gmsfs *g;
		struct gmsfs_meta md;
		if (gmsfs_connect(&g, store, GMSFS_RO, -1) || gmsfs_import_all(g) || gmsfs_meta_get(g, "seed", &md)) {
			gmsfs_disconnect(g);
			usleep(1000);
			continue;
		}
		/* The value is its bytes, not a C string: strtoul on it read the heap after it,
		 * and a digit there made another seed (valgrind: "0 bytes after a block"). */
		char digits[16] = "";
		memcpy(digits, md.value, md.value_len < sizeof digits - 1 ? md.value_len : sizeof digits - 1);
		unsigned s = (unsigned)strtoul(digits, NULL, 10);
		const struct gmsfs_mapping *m;
		size_t n = gmsfs_mappings(g, &m);
		for (size_t j = 0; j < n; j++) {
			if (m[j].name[0] != 'w')
				continue; /* a shell writer's */
			const uint8_t *p = m[j].ptr;
			int k = atoi(m[j].name + 1);
			for (uint64_t i = 0; i < m[j].size; i++)
				if (p[i] != pattern(s, k, i)) {
					uint64_t zeros = 0;
					for (uint64_t z = 0; z < m[j].size; z++)
						zeros += !p[z];
					uint64_t other = 0; /* bytes in the pattern of another seed (that of byte 0) */
					for (uint64_t z = 0; z < m[j].size; z++)
						other += p[z] == (uint8_t)(p[0] + z * 13);
					fprintf(stderr,
						"libreader: %s byte %llu is not seed %u's (0x%02x, want 0x%02x; size %llu, "
						"%llu zero bytes, %llu another seed's; generation %llu; %zu mappings)\n",
						m[j].name, (unsigned long long)i, s, p[i], pattern(s, k, i),
						(unsigned long long)m[j].size, (unsigned long long)zeros,
						(unsigned long long)other, (unsigned long long)gmsfs_generation(g), n);
					return 1;
				}
		}
		gmsfs_meta_free(&md);
		gmsfs_disconnect(g);
	}
}

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_alarm }; /* no SA_RESTART: a stuck open returns EINTR */
	sigaction(SIGALRM, &sa, NULL);
	if (argc < 3) {
		fprintf(stderr, "usage: see the top of gmsfs-storm.c\n");
		return 2;
	}
	store = argv[2];
	if (!strcmp(argv[1], "reopen") && argc == 4)
		return reopen(atoi(argv[3]));
	if (!strcmp(argv[1], "opens") && argc == 5)
		return opens(atoi(argv[3]), atoi(argv[4]));
	if (!strcmp(argv[1], "libwriter") && argc == 4)
		return libwriter((unsigned)atoi(argv[3]));
	if (!strcmp(argv[1], "libinplace") && argc == 4)
		return libinplace((unsigned)atoi(argv[3]));
	if (!strcmp(argv[1], "libimporter") && argc == 4)
		return libimporter((unsigned)atoi(argv[3]));
	if (!strcmp(argv[1], "libreader"))
		return libreader();
	fprintf(stderr, "usage: see the top of gmsfs-storm.c\n");
	return 2;
}
