/* store_files: see store_files.h. */
#include "store_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int sf_mkdir(const char *dir)
{
	return mkdir(dir, 0700) && errno != EEXIST ? -errno : 0;
}

static int made(const char *path, int trunc)
{
	char dir[4096];
	const char *slash = strrchr(path, '/');
	snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
	struct stat d, f;
	if (stat(dir[0] ? dir : "/", &d))
		return -errno;
	mode_t mode = d.st_mode & 0666;
	int fd = open(path, O_WRONLY | O_CREAT | trunc | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	if (!fstat(fd, &f) && (f.st_mode & 0777 & ~mode) && fchmod(fd, f.st_mode & mode)) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

int sf_create(const char *path)
{
	return made(path, O_TRUNC);
}

int sf_overwrite(const char *path)
{
	return made(path, 0);
}

FILE *sf_fcreate(const char *path)
{
	int fd = sf_create(path);
	FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
	if (fd < 0)
		errno = -fd;
	else if (!f)
		close(fd);
	return f;
}
