/* gmsfs-scenario NAME STORE: one multi-process scenario of libgmsfs against a
 * live mount (the ones of GMS's runtime tests, and more).  Exit 0 when every
 * check holds; otherwise the first failed check is printed.  Run by
 * tests/70-libgmsfs.bats on the host backend and by tests/gpu/run.sh on the
 * cuda backend (GMSFS_SCENARIO_CUDA=1: every process makes a CUDA context and
 * reaches the bytes through the driver).  Child processes are this program
 * exec'd again (a CUDA context does not survive fork). */
#include "scenario/scenario.h"

static const struct {
	const char *name;
	int (*fn)(void);
} scenarios[] = {
	{ "readers64", sc_readers64 },
	{ "commit_publishes", sc_commit_publishes },
	{ "abort_on_disconnect", sc_abort_on_disconnect },
	{ "rw_or_ro", sc_rw_or_ro },
	{ "writer_blocks_readers", sc_writer_blocks_readers },
	{ "rw_or_ro_timeout", sc_rw_or_ro_timeout },
	{ "reader_after_writer_timeout", sc_reader_after_writer_timeout },
	{ "signal_wait", sc_signal_wait },
	{ "several_readers", sc_several_readers },
	{ "reader_rw_calls_fail", sc_reader_rw_calls_fail },
	{ "bad_offset", sc_bad_offset },
	{ "free_removes", sc_free_removes },
	{ "remap_same", sc_remap_same },
	{ "commit_unmap_all", sc_commit_unmap_all },
	{ "remap_changed", sc_remap_changed },
	{ "remap_rebuilt", sc_remap_rebuilt },
	{ "remap_removed", sc_remap_removed },
	{ "reallocate", sc_reallocate },
	{ "dead_holder_memory", sc_dead_holder_memory },
	{ "abort_cycles", sc_abort_cycles },
	{ "daemon_killed", sc_daemon_killed },
	{ "importer_killed", sc_importer_killed },
	{ "requests", sc_requests },
	{ "one_rw_per_session", sc_one_rw_per_session },
	{ "bad_args", sc_bad_args },
	{ "bulk_meta", sc_bulk_meta },
	{ "shared_range", sc_shared_range },
	{ "unmap_one", sc_unmap_one },
	{ "create_many", sc_create_many },
	{ "spaces", sc_spaces },
	{ "graph_pool", sc_graph_pool },
	{ "pages", sc_pages },
	{ "refit_by_name", sc_refit_by_name },
	{ "refit_whole", sc_refit_whole },
	{ "pause_resume", sc_pause_resume },
	{ "versions_flip", sc_versions_flip },
	{ "commit_version_unmap", sc_commit_version_unmap },
	{ "commit_disconnect", sc_commit_disconnect },
	{ "kept", sc_kept },
};

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s SCENARIO STORE\nscenarios:", argv[0]);
		for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++)
			fprintf(stderr, " %s", scenarios[i].name);
		fputc('\n', stderr);
		return 2;
	}
	store = argv[2];
	self = "/proc/self/exe";
	static char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n > 0) {
		exe[n] = '\0';
		self = exe;
	}
	mem_init();
	if (!strcmp(argv[1], "__hold") && argc == 7)
		return role_hold(argv);
	if (!strcmp(argv[1], "__reader") && argc == 5)
		return role_reader(argv);
	if (!strcmp(argv[1], "__flipper") && argc == 5)
		return role_flipper(argv);
	if (!strcmp(argv[1], "__hog") && (argc == 5 || argc == 6))
		return role_hog(argc, argv);
	if (!strcmp(argv[1], "__kept") && argc == 3)
		return role_kept(argv);
	for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++)
		if (!strcmp(argv[1], scenarios[i].name))
			return scenarios[i].fn();
	fprintf(stderr, "unknown scenario %s\n", argv[1]);
	return 2;
}
