/* common: what the scenarios share (scenario.h). */
#include "scenario.h"
const char *store;
const char *self; /* /proc/self/exe, for the children */

/* ---- memory: host pointers are read directly; device pointers through the driver ---- */

#ifdef GMSFS_HAVE_CUDA
struct cu_api cu;
#endif
bool cuda;

void mem_init(void)
{
	const char *e = getenv("GMSFS_SCENARIO_CUDA");
	if (!e || strcmp(e, "1"))
		return;
#ifdef GMSFS_HAVE_CUDA
	cuda = true;
	char err[256] = "";
	const char *d = getenv("GMSFS_SCENARIO_DEVICE");
	if (cu_load(&cu, err, sizeof err) || cu_primary_ctx(&cu, d ? atoi(d) : 0, NULL, NULL)) {
		fprintf(stderr, "gmsfs-scenario: no CUDA context %s\n", err);
		exit(3);
	}
#else
	fprintf(stderr, "gmsfs-scenario: built without cuda.h\n");
	exit(3);
#endif
}

int mem_write(void *dst, const void *src, size_t n)
{
#ifdef GMSFS_HAVE_CUDA
	if (cuda)
		return cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, n) ? -EIO : 0;
#endif
	memcpy(dst, src, n);
	return 0;
}

int mem_read(void *dst, const void *src, size_t n)
{
#ifdef GMSFS_HAVE_CUDA
	if (cuda) {
		CUresult r = cu.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, n);
		if (r)
			fprintf(stderr, "cuMemcpyDtoH from %p: %s\n", src, cu_name(&cu, r));
		return r ? -EIO : 0;
	}
#endif
	memcpy(dst, src, n);
	return 0;
}

/* Write into a mapping the way a buggy reader would; 0 if it went through. */
int mem_poke(void *dst, size_t n)
{
#ifdef GMSFS_HAVE_CUDA
	if (cuda) {
		CUresult r = cu.cuMemsetD8((CUdeviceptr)(uintptr_t)dst, 0x5a, n);
		return r ? -EACCES : (cu.cuCtxSynchronize() ? -EIO : 0);
	}
#endif
	/* A writable mapping of the descriptor, as mprotect would make it. */
	return mprotect(dst, n, PROT_READ | PROT_WRITE) == 0 ? 0 : -errno;
}

/* Bytes in use where allocations live: shared memory on the host, device memory on a GPU. */
long long mem_used(void)
{
#ifdef GMSFS_HAVE_CUDA
	if (cuda) {
		size_t free_b = 0, total = 0;
		cu.cuMemGetInfo(&free_b, &total);
		return (long long)(total - free_b);
	}
#endif
	/* The host backend: the pages of the daemon's memfds (its pid in the mount's device
	 * file), not the machine's Shmem, which the other tests of a run two at a time move. */
	char dev[4200], line[256], fds[64];
	snprintf(dev, sizeof dev, "%s/../device", store);
	FILE *f = fopen(dev, "r");
	long pid = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "pid: %ld", &pid) == 1)
			break;
	if (f)
		fclose(f);
	snprintf(fds, sizeof fds, "/proc/%ld/fd", pid);
	DIR *d = pid > 0 ? opendir(fds) : NULL;
	struct dirent *x;
	long long used = d ? 0 : -1;
	while (d && (x = readdir(d))) {
		char fd[320], to[256];
		struct stat st;
		snprintf(fd, sizeof fd, "%s/%s", fds, x->d_name);
		ssize_t n = readlink(fd, to, sizeof to - 1);
		if (n > 0 && (to[n] = '\0', !strncmp(to, "/memfd:", 7)) && !stat(fd, &st))
			used += (long long)st.st_blocks * 512;
	}
	if (d)
		closedir(d);
	return used;
}


int e_;

void msleep(int ms)
{
	nanosleep(&(struct timespec){ ms / 1000, (long)(ms % 1000) * 1000000L }, NULL);
}

/* The store's state file into buf, NUL-terminated; false if it cannot be read. */
bool read_state(char *buf, size_t size)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/state", store);
	int fd = open(path, O_RDONLY);
	ssize_t n = fd < 0 ? -1 : read(fd, buf, size - 1);
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	return true;
}

/* A number from the store's state file, -1 if absent. */
long state_val(const char *key)
{
	char buf[2048];
	if (!read_state(buf, sizeof buf))
		return -1;
	char pat[64];
	snprintf(pat, sizeof pat, "\n%s: ", key);
	char *p = strstr(buf, pat);
	if (!p && !strncmp(buf, pat + 1, strlen(pat + 1)))
		p = buf - 1;
	return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

/* Does the store's state file hold text? */
bool state_has(const char *text)
{
	char buf[4096];
	return read_state(buf, sizeof buf) && strstr(buf, text);
}

bool state_is(const char *s)
{
	char buf[64];
	return read_state(buf, sizeof buf) && !strncmp(buf + 7, s, strlen(s)) && buf[7 + strlen(s)] == '\n';
}

bool wait_for(long (*f)(const char *), const char *key, long want, int ms)
{
	for (int t = 0; t < ms; t += 10, msleep(10))
		if (f(key) == want)
			return true;
	return false;
}

/* ---- children that hold a connection until told to let go ---- */



/* Close every inherited descriptor but keep: a sibling's pipe ends would keep
 * it from ever seeing EOF. */
void close_others(int keep1, int keep2)
{
	for (int fd = 3; fd < 1024; fd++)
		if (fd != keep1 && fd != keep2)
			close(fd);
}

/* __hold STORE MODE TIMEOUT IN OUT: connect, report {result, lock} on OUT, hold until IN closes. */
int role_hold(char **argv)
{
	int in = atoi(argv[5]), out = atoi(argv[6]);
	gmsfs *g;
	int e = gmsfs_connect(&g, store, atoi(argv[3]), atoi(argv[4]));
	int msg[2] = { e, e ? 0 : gmsfs_lock_mode(g) };
	if (write(out, msg, sizeof msg) != sizeof msg)
		return 3;
	char c;
	if (read(in, &c, 1) < 0)
		return 3;
	gmsfs_disconnect(g);
	return 0;
}

/* A child (this program again) that connects and reports, then holds until released. */
struct kid spawn(int mode, int timeout_ms)
{
	int a[2], b[2];
	if (pipe(a) || pipe(b))
		abort();
	struct kid k = { fork(), a[1], b[0] };
	if (k.pid == 0) {
		close_others(a[0], b[1]);
		char m[16], t[16], in[16], out[16];
		snprintf(m, sizeof m, "%d", mode);
		snprintf(t, sizeof t, "%d", timeout_ms);
		snprintf(in, sizeof in, "%d", a[0]);
		snprintf(out, sizeof out, "%d", b[1]);
		execl(self, self, "__hold", store, m, t, in, out, (char *)NULL);
		_exit(127);
	}
	close(a[0]);
	close(b[1]);
	return k;
}

/* The child's connect result within ms: 0 or -errno; 1 while it still waits. */
int kid_result(struct kid *k, int ms, int *lock)
{
	struct pollfd p = { k->from, POLLIN, 0 };
	if (poll(&p, 1, ms) <= 0)
		return 1;
	int msg[2];
	if (read(k->from, msg, sizeof msg) != sizeof msg)
		return -EPIPE;
	if (lock)
		*lock = msg[1];
	return msg[0];
}

void kid_release(struct kid *k)
{
	close(k->to);
	close(k->from);
	waitpid(k->pid, NULL, 0);
}

/* ---- layouts ---- */

uint8_t byte_of(int k, uint64_t i, int salt)
{
	return (uint8_t)(k * 7 + i * 13 + (uint64_t)salt);
}

int fill(void *p, int k, uint64_t size, int salt)
{
	uint8_t *b = malloc(size);
	for (uint64_t i = 0; i < size; i++)
		b[i] = byte_of(k, i, salt);
	int e = mem_write(p, b, size);
	free(b);
	CHECK(e == 0, "writing %llu bytes", (unsigned long long)size);
	return 0;
}

/* A writer's layout: n allocations named w/K of size bytes, filled, one entry each. */
int build(gmsfs *g, int n, uint64_t size, int salt)
{
	for (int k = 0; k < n; k++) {
		char name[32], key[32];
		uint8_t *p;
		snprintf(name, sizeof name, "w/%d", k);
		snprintf(key, sizeof key, "t/%d", k);
		CALL(g, gmsfs_create(g, name, size, k % 2 ? "odd" : "even", (void **)&p));
		if (fill(p, k, size, salt))
			return 1;
		CALL(g, gmsfs_meta_put(g, key, name, (uint64_t)k % size, name, strlen(name)));
	}
	return 0;
}

int publish(int n, uint64_t size, int salt, char hash[33])
{
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 5000));
	if (build(g, n, size, salt))
		return 1;
	CALL(g, gmsfs_commit(g));
	if (hash)
		CALL(g, gmsfs_layout_hash(g, hash));
	gmsfs_disconnect(g);
	return 0;
}

/* The first of size bytes at p (mapped memory) that is not fill(k, salt)'s: size when
 * none is, UINT64_MAX when they cannot be read. */
uint64_t first_bad(const void *p, int k, uint64_t size, int salt)
{
	uint8_t *b = malloc(size);
	uint64_t bad = b && mem_read(b, p, size) == 0 ? size : UINT64_MAX;
	for (uint64_t i = 0; bad == size && i < size; i++)
		if (b[i] != byte_of(k, i, salt))
			bad = i;
	free(b);
	return bad;
}

/* Every mapping of g holds the bytes of build(salt). */
int verify(gmsfs *g, int n, int salt)
{
	const struct gmsfs_mapping *m;
	size_t count = gmsfs_mappings(g, &m);
	CHECK(count == (size_t)n, "%zu mappings, expected %d", count, n);
	for (size_t j = 0; j < count; j++) {
		int k = atoi(m[j].name + 2);
		uint64_t bad = first_bad(m[j].ptr, k, m[j].size, salt);
		CHECK(bad == m[j].size, "%s byte %llu", m[j].name, (unsigned long long)bad);
		CHECK(!strcmp(m[j].tag, k % 2 ? "odd" : "even"), "%s tag %s", m[j].name, m[j].tag);
	}
	return 0;
}

/* ---- scenarios ---- */

/* __reader STORE DONE GO: import all, check every byte and that writing is refused,
 * report on DONE, hold until GO closes. */
int role_reader(char **argv)
{
	int done = atoi(argv[3]), go = atoi(argv[4]);
	gmsfs *g;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RO, 5000));
	CALL(g, gmsfs_import_all(g));
	if (verify(g, 64, 1))
		return 1;
	const struct gmsfs_mapping *m;
	gmsfs_mappings(g, &m);
	/* Read-only: a write through the mapping (a writable mapping on the host) is refused. */
	CHECK(mem_poke(m[0].ptr, m[0].aligned) != 0, "a reader wrote into its mapping");
	CHECK(!m[0].writable, "the reader's mapping says writable");
	if (verify(g, 64, 1))
		return 1;
	char c = 'x';
	CHECK(write(done, &c, 1) == 1 && read(go, &c, 1) == 0, "report");
	gmsfs_disconnect(g);
	return 0;
}

