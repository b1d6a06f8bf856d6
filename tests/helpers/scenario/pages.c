/* pages: an elastic store's pages and its minimum, a cache kept past its engine. */
#include "scenario.h"

/* A number from DIR/FILE's "key: value" lines, -1 if absent. */
static long long file_val(const char *dir, const char *file, const char *key)
{
	char path[4200], buf[4096], pat[64];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	int fd = open(path, O_RDONLY);
	ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	snprintf(pat, sizeof pat, "\n%s: ", key);
	char *p = strstr(buf, pat);
	return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* Within the store's minimum (16 pages): made at reserve, held in this process when
 * unmapped and mapped again at other places, each still its own memory; past it, made
 * and given back as any. */
int sc_pages_min(gmsfs *g, uint64_t page, const uint64_t *idx)
{
	gmsfs_pages *p;
	CHECK(!setxattr(store, "user.gms.min", "33554432", 8, 0), "min: %s", strerror(errno));
	CALL(g, gmsfs_pages_reserve(g, 32 * page, page, &p));
	CHECK(state_val("used") == (long)(16 * page) && gmsfs_pages_mapped(p) == 0, "made at reserve: used %ld",
	      state_val("used"));
	char *base = gmsfs_pages_base(p);
	CALL(g, gmsfs_pages_map(p, idx, 16, 0));
	for (uint64_t i = 0; i < 16; i++)
		CHECK(!mem_write(base + i * page, &i, 8), "write page %llu", (unsigned long long)i);
	CALL(g, gmsfs_pages_unmap(p, idx + 8, 8));
	CALL(g, gmsfs_pages_map(p, idx + 16, 16, 0)); /* 8 held, 8 new */
	CHECK(state_val("used") == (long)(24 * page), "used %ld", state_val("used"));
	for (uint64_t i = 16, v = 0; i < 32; i++)
		CHECK(!mem_write(base + i * page, &i, 8) && !mem_read(&v, base + i * page, 8) && v == i, "page %llu",
		      (unsigned long long)i);
	for (uint64_t i = 0, v = 0; i < 8; i++) /* the held ones were not these */
		CHECK(!mem_read(&v, base + i * page, 8) && v == i, "page %llu holds %llu", (unsigned long long)i,
		      (unsigned long long)v);
	CALL(g, gmsfs_pages_unmap(p, idx + 16, 16)); /* 8 held (to the minimum), 8 given back */
	CHECK(state_val("used") == (long)(16 * page) && gmsfs_pages_mapped(p) == 8, "unmapped: used %ld",
	      state_val("used"));
	CALL(g, gmsfs_pages_free(p));
	CHECK(state_val("used") == 0 && !removexattr(store, "user.gms.min"), "after free: used %ld", state_val("used"));
	return 0;
}

/* Pages (elastic stores): 64 placed in one request, each its own memory; unmapped and
 * mapped again in batches; within a minimum (sc_pages_min); then, with a third store's
 * minimum holding all but 8 pages' room, a lower-priority store's pages asked back for a
 * higher one's growth (never the other way), and given back by its engine. */
int sc_pages(void)
{
	const uint64_t page = 2ull << 20;
	char low[4200], high[4200], held[4200], mnt[4200], text[32];
	snprintf(low, sizeof low, "%s-low", store);
	snprintf(high, sizeof high, "%s-high", store);
	snprintf(held, sizeof held, "%s-min", store);
	snprintf(mnt, sizeof mnt, "%s", store);
	*strrchr(mnt, '/') = '\0';
	CHECK(!mkdir(low, 0755) && !mkdir(high, 0755) && !mkdir(held, 0755), "mkdir: %s", strerror(errno));
	CHECK(!setxattr(high, "user.gms.priority", "5", 1, 0), "priority: %s", strerror(errno));
	gmsfs *g, *gl, *gh;
	gmsfs_pages *p, *pl, *ph;
	uint64_t idx[64], want;
	for (uint64_t i = 0; i < 64; i++)
		idx[i] = i;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 2000));
	CALL(g, gmsfs_pages_reserve(g, 64 * page, page, &p));
	CALL(g, gmsfs_pages_map(p, idx, 64, 0));
	char *base = gmsfs_pages_base(p);
	for (uint64_t i = 0; i < 64; i++)
		CHECK(!mem_write(base + i * page + page - 8, &i, 8), "write page %llu", (unsigned long long)i);
	for (uint64_t i = 0, v; i < 64; i++)
		CHECK(!mem_read(&v, base + i * page + page - 8, 8) && v == i, "page %llu holds %llu", (unsigned long long)i,
		      (unsigned long long)v);
	CALL(g, gmsfs_pages_unmap(p, idx + 16, 32));
	CHECK(gmsfs_pages_mapped(p) == 32 && state_val("used") == (long)(32 * page) && state_val("peak") == (long)(64 * page),
	      "used %ld, peak %ld", state_val("used"), state_val("peak"));
	CHECK(gmsfs_pages_map(p, idx, 1, 0) == -EEXIST, "a mapped page again");
	CALL(g, gmsfs_pages_map(p, idx + 16, 32, 0));
	CALL(g, gmsfs_pages_free(p));
	CHECK(state_val("used") == 0 && gmsfs_pages_free(p) == -EINVAL, "after free: used %ld", state_val("used"));
	if (sc_pages_min(g, page, idx))
		return 1;
	/* Room for 8 pages only: the rest is a third store's minimum. */
	long long total = file_val(mnt, "device", "total_bytes"), used = file_val(mnt, "device", "used_bytes");
	snprintf(text, sizeof text, "%lld", total - used - (long long)(8 * page));
	CHECK(!setxattr(held, "user.gms.min", text, strlen(text), 0), "min %s: %s", text, strerror(errno));
	CALL(gl, gmsfs_connect(&gl, low, GMSFS_RW, 2000));
	CALL(gh, gmsfs_connect(&gh, high, GMSFS_RW, 2000));
	CALL(gl, gmsfs_pages_reserve(gl, 16 * page, page, &pl));
	CALL(gh, gmsfs_pages_reserve(gh, 16 * page, page, &ph));
	CHECK(gmsfs_pages_map(pl, idx, 9, 0) == -ENOSPC, "9 pages past the room");
	CALL(gl, gmsfs_pages_map(pl, idx, 8, 0));
	CHECK(gmsfs_pages_map(ph, idx, 2, 0) == -ENOSPC, "no room, no wait");
	CALL(gl, gmsfs_pages_reclaim(pl, &want));
	CHECK(want == 2 * page && file_val(low, "state", "reclaim") == (long long)(2 * page), "low asked %llu",
	      (unsigned long long)want);
	CALL(gl, gmsfs_pages_unmap(pl, idx + 6, 2)); /* its engine gives them back */
	CALL(gh, gmsfs_pages_map(ph, idx, 2, 0));
	CALL(gl, gmsfs_pages_reclaim(pl, &want));
	CHECK(want == 0, "low still asked %llu", (unsigned long long)want);
	CHECK(gmsfs_pages_map(pl, idx + 6, 1, 200) == -ENOSPC, "low's growth asks nobody");
	CALL(gh, gmsfs_pages_reclaim(ph, &want));
	CHECK(want == 0 && gmsfs_pages_mapped(ph) == 2, "high asked %llu", (unsigned long long)want);
	gmsfs_disconnect(gl);
	gmsfs_disconnect(gh);
	gmsfs_disconnect(g);
	/* A session ends at the files' release, which the kernel sends after close returns. */
	int t = 0;
	for (; t < 10000 && (file_val(low, "state", "used") || file_val(high, "state", "used")); t += 10)
		msleep(10);
	CHECK(t < 10000, "pages left: low %lld, high %lld", file_val(low, "state", "used"),
	      file_val(high, "state", "used"));
	CHECK(!removexattr(held, "user.gms.min") && !rmdir(low) && !rmdir(high) && !rmdir(held), "cleanup: %s",
	      strerror(errno));
	return 0;
}

/* ---- kept caches (gmsfs(5), KEPT) ---- */

/* __kept STORE: an engine that maps pages 0..7 of 16, writes 100 + i into each, keeps
 * them with records "page i", clears page 3's record (a keep), maps page 12 and dies. */
int role_kept(char **argv)
{
	const uint64_t page = 2ull << 20;
	uint64_t idx[9] = { 0, 1, 2, 3, 4, 5, 6, 7, 12 };
	struct gmsfs_page_record rec[8], clear = { .idx = 3 };
	char text[8][16];
	gmsfs *g;
	gmsfs_pages *p;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 2000));
	CALL(g, gmsfs_pages_reserve(g, 16 * page, page, &p));
	CALL(g, gmsfs_pages_map(p, idx, 8, 0));
	char *base = gmsfs_pages_base(p);
	for (uint64_t i = 0; i < 8; i++) {
		uint64_t v = 100 + i;
		CHECK(!mem_write(base + i * page + page - 8, &v, 8), "write page %llu", (unsigned long long)i);
		snprintf(text[i], sizeof text[i], "page %d", (int)i);
		rec[i] = (struct gmsfs_page_record){ .idx = i, .data = text[i], .len = strlen(text[i]) };
	}
	CALL(g, gmsfs_pages_keep(p, rec, 8));
	CALL(g, gmsfs_pages_keep(p, &clear, 1));
	CALL(g, gmsfs_pages_map(p, idx + 8, 1, 0));
	_exit(0); /* a crash: nothing said to the daemon */
}

/* The engine's pages adopted by the next writer at the same indices, bytes and records
 * as it kept them; what it mapped after its last keep gone; the store COMMITTED, not
 * TORN; the adopter frees them and keeps: the memory comes back. */
int sc_kept(void)
{
	const uint64_t page = 2ull << 20;
	pid_t pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (!pid) {
		execl(self, self, "__kept", store, (char *)NULL);
		_exit(127);
	}
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status), "the engine: status %d",
	      status);
	gmsfs *g;
	gmsfs_pages *p;
	uint64_t n = 0, v;
	CALL(g, gmsfs_connect(&g, store, GMSFS_RW, 5000)); /* its session ends at the release */
	CHECK(file_val(store, "state", "torn") == 0 && file_val(store, "state", "used") == (long long)(8 * page),
	      "after the death: torn %lld, used %lld", file_val(store, "state", "torn"), file_val(store, "state", "used"));
	CALL(g, gmsfs_pages_adopt(g, 16 * page, 0, &p, &n));
	CHECK(n == 8 && gmsfs_pages_size(p) == page && gmsfs_pages_count(p) == 16 && gmsfs_pages_mapped(p) == 8,
	      "adopted %llu", (unsigned long long)n);
	char *base = gmsfs_pages_base(p);
	for (uint64_t i = 0; i < 8; i++) {
		const void *d;
		size_t len;
		char want[16];
		snprintf(want, sizeof want, "page %d", (int)i);
		CHECK(!mem_read(&v, base + i * page + page - 8, 8) && v == 100 + i, "page %llu holds %llu",
		      (unsigned long long)i, (unsigned long long)v);
		CALL(g, gmsfs_pages_record(p, i, &d, &len));
		CHECK(i == 3 ? !d && !len : len == strlen(want) && !memcmp(d, want, len), "page %llu's record",
		      (unsigned long long)i);
	}
	const void *d;
	size_t len;
	CHECK(gmsfs_pages_record(p, 12, &d, &len) == -ENOENT, "the page mapped after the last keep is gone");
	gmsfs_pages *more;
	CHECK(gmsfs_pages_adopt(g, 16 * page, page, &more, &n) == 0 && n == 0 && gmsfs_pages_mapped(more) == 0,
	      "nothing more kept: an empty range");
	CALL(g, gmsfs_pages_free(more));
	CALL(g, gmsfs_pages_free(p));
	CALL(g, gmsfs_commit_layout(g));
	gmsfs_disconnect(g);
	CHECK(file_val(store, "state", "used") == 0, "dropped: used %lld", file_val(store, "state", "used"));
	return 0;
}

/* ---- refit, pause, versions (gmsfs(5): LOCKS, Pause, Versions) ---- */
