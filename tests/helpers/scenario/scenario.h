/* scenario.h: what gmsfs-scenario's files share (tests/helpers/gmsfs-scenario.c runs them
 * by name): the store and this program's path, memory reached as the backend has it
 * (directly on the host, through the driver on cuda), checks, child processes (roles),
 * and every scenario.  One file per family: locks.c, remap.c, memory.c, faults.c,
 * sharing.c, pages.c, refit.c; common.c the helpers. */
#ifndef GMSFS_TEST_SCENARIO_H
#define GMSFS_TEST_SCENARIO_H

#include <gmsfs/gmsfs.h>

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef GMSFS_HAVE_CUDA
#include "cuda_api.h"
extern struct cu_api cu;
#endif
extern const char *store;
extern const char *self; /* /proc/self/exe, for the children */
extern bool cuda;
extern int e_;

#define CHECK(c, ...)                                                               \
	do {                                                                        \
		if (!(c)) {                                                         \
			fprintf(stderr, "FAIL line %d: %s: ", __LINE__, #c);        \
			fprintf(stderr, __VA_ARGS__);                               \
			fputc('\n', stderr);                                        \
			return 1;                                                   \
		}                                                                   \
	} while (0)
#define CALL(g, x) CHECK((e_ = (x)) == 0, "%s (%s)", gmsfs_strerror(e_), gmsfs_errmsg(g))

struct kid {
	pid_t pid;
	int to, from; /* parent writes to `to` to release; the child reports on `from` */
};

/* common.c: memory as the backend has it, the state file, child processes (roles), the
 * allocations a scenario builds and checks. */
void mem_init(void);
int mem_write(void *dst, const void *src, size_t n);
int mem_read(void *dst, const void *src, size_t n);
int mem_poke(void *dst, size_t n);
long long mem_used(void);
void msleep(int ms);
bool read_state(char *buf, size_t size);
long state_val(const char *key);
bool state_has(const char *text);
bool state_is(const char *s);
bool wait_for(long (*f)(const char *), const char *key, long want, int ms);
void close_others(int keep1, int keep2);
int role_hold(char **argv);
struct kid spawn(int mode, int timeout_ms);
int kid_result(struct kid *k, int ms, int *lock);
void kid_release(struct kid *k);
uint8_t byte_of(int k, uint64_t i, int salt);
int fill(void *p, int k, uint64_t size, int salt);
uint64_t first_bad(const void *p, int k, uint64_t size, int salt);
int build(gmsfs *g, int n, uint64_t size, int salt);
int publish(int n, uint64_t size, int salt, char hash[33]);
int verify(gmsfs *g, int n, int salt);
int role_reader(char **argv);
/* The scenarios and their roles, by family (locks.c, remap.c, memory.c, faults.c,
 * sharing.c, pages.c, refit.c). */
int sc_readers64(void);
int sc_commit_publishes(void);
int sc_abort_on_disconnect(void);
int sc_rw_or_ro(void);
int sc_writer_blocks_readers(void);
int sc_rw_or_ro_timeout(void);
int sc_signal_wait(void);
int sc_reader_after_writer_timeout(void);
int sc_several_readers(void);
int sc_reader_rw_calls_fail(void);
int sc_one_rw_per_session(void);
int sc_bad_args(void);
int sc_bad_offset(void);
int sc_free_removes(void);
int sc_remap_same(void);
int sc_commit_unmap_all(void);
int sc_remap_changed(void);
int sc_remap_removed(void);
int sc_remap_rebuilt(void);
int sc_reallocate(void);
int sc_spaces(void);
int sc_graph_pool(void);
int role_hog(int argc, char **argv);
int sc_dead_holder_memory(void);
int sc_importer_killed(void);
int sc_abort_cycles(void);
int sc_daemon_killed(void);
int sc_shared_range(void);
int sc_unmap_one(void);
int sc_create_many(void);
int sc_requests(void);
int sc_bulk_meta(void);
int sc_pages_min(gmsfs *g, uint64_t page, const uint64_t *idx);
int sc_pages(void);
int role_kept(char **argv);
int sc_kept(void);
int sc_refit_by_name(void);
int sc_refit_whole(void);
int sc_pause_resume(void);
int role_flipper(char **argv);
int sc_versions_flip(void);
int sc_commit_version_unmap(void);
int sc_commit_disconnect(void);

#endif
