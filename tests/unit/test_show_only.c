/* test_show_only: cpc_show_only (loader/copy_cuda.c), which shows a command only its
 * stores' GPUs before cuInit, on stand-in mounts (a folder with a "device" file as a
 * mount root has, a store below it): each store's GPU once, in order; nothing set for a
 * store off a GPU, one whose mount cannot be read, or where the caller set the variable.
 * And cpc_one_queue: one work queue, unless the caller chose. */
#include "copy_cuda.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char top[] = "/tmp/gmsfs-show-only.XXXXXX";

/* top/NAME/device saying backend and uuid, and its store top/NAME/s: that store's path. */
static const char *mount_of(const char *name, const char *backend, const char *uuid)
{
	static char stores[8][4200];
	static int n;
	char *store = stores[n++ % 8], path[4300];
	snprintf(store, sizeof stores[0], "%s/%s", top, name);
	mkdir(store, 0700);
	snprintf(path, sizeof path, "%s/device", store);
	FILE *f = fopen(path, "w");
	if (f) {
		fprintf(f, "index: 0\nbackend: %s\nuuid: %s\n", backend, uuid);
		fclose(f);
	}
	strcat(store, "/s");
	mkdir(store, 0700);
	return store;
}

int main(void)
{
	if (!mkdtemp(top))
		return perror("mkdtemp"), 1;
	const char *a = mount_of("a", "cuda", "GPU-0a"), *b = mount_of("b", "cuda", "GPU-0b"),
		   *h = mount_of("h", "host", "host-1"), *odd = mount_of("odd", "cuda", "GPU-1,GPU-2");
	char gone[4300];
	snprintf(gone, sizeof gone, "%s/gone/s", top);

	unsetenv("CUDA_VISIBLE_DEVICES");
	const char *two[] = { b, a, b };
	is_str(cpc_show_only(two, 3), "GPU-0b,GPU-0a", "two stores on two GPUs and one again: each GPU once, in order");
	is_str(getenv("CUDA_VISIBLE_DEVICES"), "GPU-0b,GPU-0a", "  and set so for the driver");

	ok(!cpc_show_only(&a, 1), "set already (the caller's, or an earlier call's): left as it is");
	is_str(getenv("CUDA_VISIBLE_DEVICES"), "GPU-0b,GPU-0a", "  unchanged");
	setenv("CUDA_VISIBLE_DEVICES", "", 1);
	ok(!cpc_show_only(&a, 1) && !strcmp(getenv("CUDA_VISIBLE_DEVICES"), ""), "set empty by the caller: left as it is");

	unsetenv("CUDA_VISIBLE_DEVICES");
	const char *mixed[] = { a, h };
	ok(!cpc_show_only(mixed, 2) && !getenv("CUDA_VISIBLE_DEVICES"), "a store on the host backend: nothing set");
	const char *lost[] = { a, gone };
	ok(!cpc_show_only(lost, 2) && !getenv("CUDA_VISIBLE_DEVICES"), "a store whose mount cannot be read: nothing set");
	ok(!cpc_show_only(&odd, 1) && !getenv("CUDA_VISIBLE_DEVICES"), "a uuid with a comma in it: nothing set");
	ok(!cpc_show_only(NULL, 0) && !getenv("CUDA_VISIBLE_DEVICES"), "no store: nothing set");
	is_str(cpc_show_only(&a, 1), "GPU-0a", "one store: its GPU alone");

	unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
	cpc_one_queue();
	is_str(getenv("CUDA_DEVICE_MAX_CONNECTIONS"), "1", "one hardware work queue where the caller set none");
	setenv("CUDA_DEVICE_MAX_CONNECTIONS", "4", 1);
	cpc_one_queue();
	is_str(getenv("CUDA_DEVICE_MAX_CONNECTIONS"), "4", "  the caller's own left as it is");

	char cmd[200];
	snprintf(cmd, sizeof cmd, "rm -rf %s", top);
	return system(cmd) ? 1 : tap_done();
}
