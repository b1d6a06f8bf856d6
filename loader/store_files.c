/* store_files: see store_files.h. */
#include "store_files.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sf_field(const char *store, const char *name, const char *key, char *out, size_t len)
{
	char path[4096], line[512];
	snprintf(path, sizeof path, "%s/%s", store, name);
	FILE *f = fopen(path, "re");
	if (!f)
		return -errno;
	size_t klen = strlen(key);
	int e = -ENOENT;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, key, klen) && line[klen] == ':' && line[klen + 1] == ' ') {
			snprintf(out, len, "%s", line + klen + 2);
			out[strcspn(out, "\n")] = '\0';
			e = 0;
			break;
		}
	fclose(f);
	return e;
}

long sf_allocations(const char *store)
{
	char v[32], *end;
	if (sf_field(store, "state", "allocations", v, sizeof v))
		return -1;
	long n = strtol(v, &end, 10);
	return *end || end == v ? -1 : n;
}
