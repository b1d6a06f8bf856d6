/* test_facts: a device's facts as a daemon keeps them for the next start (src/vmm/vmm_facts.c):
 * written and read back whole; a daemon's device file read as facts (a takeover's);
 * each value checked, and text that fails gives no facts, whatever its bytes (a mutation
 * loop over a good file); which device= and environment they fit. */
#include "../../src/vmm/vmm.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *GOOD = "backend: cuda\nindex: 1\nuuid: GPU-0d7e54b1-2a3c-4d5e-8f90-a1b2c3d4e5f6\n"
			  "name: NVIDIA H200\ntotal_bytes: 150109880320\ngranularity: 2097152\n"
			  "env: visible=(unset) order=(unset)\n";

static int parses(const char *text)
{
	struct vmm_known k;
	return !vmm_facts_parse(text, &k);
}

/* GOOD with the line starting with key replaced by line ("": removed). */
static const char *with(const char *key, const char *line)
{
	static char out[1024];
	const char *at = strstr(GOOD, key), *end = strchr(at, '\n') + 1;
	snprintf(out, sizeof out, "%.*s%s%s", (int)(at - GOOD), GOOD, line, end);
	return out;
}

int main(void)
{
	unsetenv("CUDA_VISIBLE_DEVICES");
	unsetenv("CUDA_DEVICE_ORDER");
	struct vmm_known k;
	ok(!vmm_facts_parse(GOOD, &k), "a kept file parses");
	ok(k.dev.index == 1 && !strcmp(k.dev.uuid, "GPU-0d7e54b1-2a3c-4d5e-8f90-a1b2c3d4e5f6") &&
		   !strcmp(k.dev.name, "NVIDIA H200") && k.dev.total_bytes == 150109880320ull &&
		   k.dev.granularity == 2097152 && !strcmp(k.env, "visible=(unset) order=(unset)") &&
		   !strcmp(k.dev.backend, "cuda"),
	   "  every fact as written");

	char dir[] = "/tmp/gmsfs-facts.XXXXXX", path[64];
	if (!mkdtemp(dir))
		return perror("mkdtemp"), 1;
	snprintf(path, sizeof path, "%s/device", dir);
	struct vmm v = { .dev = k.dev };
	ok(!vmm_facts_write(path, &v), "written");
	struct vmm_known back;
	ok(!vmm_facts_read(path, &back) && !memcmp(&back.dev.uuid, &k.dev.uuid, sizeof k.dev.uuid) &&
		   back.dev.index == 1 && back.dev.total_bytes == k.dev.total_bytes && !strcmp(back.env, k.env) &&
		   !strcmp(back.path, path),
	   "  and read back whole, with where it came from");
	struct stat st;
	ok(!stat(path, &st) && (st.st_mode & 077) == 0, "  readable by its owner alone");
	ok(vmm_facts_read("/nonexistent/device", &back) == -ENOENT, "no file: -ENOENT");
	FILE *f = fopen(path, "w");
	fwrite("backend: cuda\nindex: 0\0x\n", 1, 25, f);
	fclose(f);
	ok(vmm_facts_read(path, &back) == -EINVAL && !back.dev.uuid[0], "a NUL inside: refused, nothing kept");
	unlink(path);
	rmdir(dir);

	/* A daemon's device file (what a takeover reads): its other lines are not facts. */
	ok(parses("index: 0\ngpu: 3\nuuid: GPU-0d7e54b1-2a3c-4d5e-8f90-a1b2c3d4e5f6\nname: NVIDIA H200\nbackend: cuda\n"
		  "total_bytes: 1000000000\nused_bytes: 5\ngranularity: 2097152\nversion: 0.9\noptions: a,b\n"),
	   "a device file parses (no env: a takeover reads the old daemon's)");
	ok(!parses(with("backend", "backend: host\n")), "the host backend: no facts");
	ok(!parses(with("backend", "")), "no backend: none");
	ok(!parses(with("uuid", "")), "no uuid: none");
	ok(!parses(with("uuid", "uuid: GPU-0d7e54b1\n")), "a uuid cut short: none");
	ok(!parses(with("uuid", "uuid: GPU-0d7e54b1-2a3c-4d5e-8f90-a1b2c3d4e5fg\n")), "a uuid not of hex: none");
	ok(!parses(with("index", "index: 1024\n")), "an index past 1023: none");
	ok(!parses(with("index", "index: -1\n")), "a negative index: none");
	ok(!parses(with("index", "index: 1x\n")), "an index with more after it: none");
	ok(!parses(with("total_bytes", "total_bytes: 0\n")), "no bytes: none");
	ok(!parses(with("total_bytes", "total_bytes: 99999999999999999999999\n")), "bytes past 64 bits: none");
	ok(!parses(with("granularity", "granularity: 3000000\n")), "a granularity not a power of two: none");
	ok(!parses(with("granularity", "granularity: 274877906944\n")), "a granularity past the device: none");
	ok(!parses(with("name", "name: \x01odd\n")), "a name with a control character: none");
	char longname[300] = "name: ";
	memset(longname + 6, 'a', 200);
	strcpy(longname + 206, "\n");
	ok(!parses(with("name", longname)), "a name past 127 bytes: none");

	/* Whatever the bytes, text fails whole or gives valid facts. */
	char buf[512];
	int bad = 0;
	srand(7);
	for (int i = 0; i < 20000; i++) {
		size_t n = strlen(GOOD);
		memcpy(buf, GOOD, n + 1);
		for (int j = 0; j < 1 + rand() % 4; j++)
			buf[rand() % n] = (char)(rand() % 256 ? rand() % 256 : '\n');
		if (!vmm_facts_parse(buf, &k) &&
		    (k.dev.index > 1023 || strncmp(k.dev.uuid, "GPU-", 4) || !k.dev.granularity || !k.dev.total_bytes ||
		     (k.dev.granularity & (k.dev.granularity - 1)) || k.dev.granularity > k.dev.total_bytes))
			bad++;
		if (vmm_facts_parse(buf, &k) && (k.dev.uuid[0] || k.env[0]))
			bad++;
	}
	is_int(bad, 0, "20000 mutations of a kept file: each fails whole or gives valid facts");

	/* Which start they fit. */
	vmm_facts_parse(GOOD, &k);
	ok(vmm_facts_fit(&k, NULL, "1", 0) && vmm_facts_fit(&k, "cuda", k.dev.uuid, 0), "device= by index or uuid: fits");
	ok(!vmm_facts_fit(&k, NULL, NULL, 0), "no device= (the first) against index 1: does not");
	ok(!vmm_facts_fit(&k, NULL, "0", 0) && !vmm_facts_fit(&k, NULL, "GPU-0", 0), "another device: does not");
	ok(!vmm_facts_fit(&k, "host", "1", 0), "backend=host: does not");
	ok(vmm_facts_fit(&k, NULL, "1", 1000) && !vmm_facts_fit(&k, NULL, "1", 150109880321ull),
	   "max_bytes within the device: fits; past it: does not");
	setenv("CUDA_VISIBLE_DEVICES", "1,0", 1);
	ok(!vmm_facts_fit(&k, NULL, "1", 0), "another CUDA_VISIBLE_DEVICES (another index for it): does not");
	char env[256];
	vmm_facts_env("0, 1", NULL, env, sizeof env);
	is_str(env, "visible=0,?1 order=(unset)", "a value's spaces kept as '?': one line, one word");
	return tap_done();
}
