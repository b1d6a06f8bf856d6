/* vmm_facts: what a daemon knew of its device (vmm.h, struct vmm_known), in the device
 * file's words, for the next daemon's start:
 *
 *   backend: cuda
 *   index: 0
 *   uuid: GPU-0d7e54b1-...
 *   name: NVIDIA H200
 *   total_bytes: 150109880320
 *   granularity: 2097152
 *   env: visible=(unset) order=(unset)
 *
 * Read as input: each value checked, a file that fails gives no facts (the daemon then
 * opens the device before it serves, as without them). */
#include "vmm.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FACTS_MAX 8192 /* a device file is about 900 bytes */

/* A value of at most size - 1 printable characters: 0, else -EINVAL. */
static int text_value(const char *v, char *to, size_t size)
{
	size_t n = strlen(v);
	if (n >= size)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!isprint((unsigned char)v[i]))
			return -EINVAL;
	memcpy(to, v, n + 1);
	return 0;
}

/* A decimal number, all of v: 0, else -EINVAL. */
static int number_value(const char *v, uint64_t *to)
{
	if (!isdigit((unsigned char)v[0]) || strlen(v) > 20)
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	if (*end || errno)
		return -EINVAL;
	*to = n;
	return 0;
}

/* A GPU uuid as the driver's is written (uuid_text): GPU- and 36 of hex and dashes. */
static bool uuid_valid(const char *u)
{
	if (strncmp(u, "GPU-", 4) || strlen(u) != 40)
		return false;
	for (const char *c = u + 4; *c; c++)
		if (!isxdigit((unsigned char)*c) && *c != '-')
			return false;
	return true;
}

static int take(struct vmm_known *k, const char *key, const char *v, bool *cuda, unsigned *have)
{
	uint64_t n = 0;
	if (!strcmp(key, "backend"))
		return *cuda = !strcmp(v, "cuda"), 0;
	if (!strcmp(key, "index"))
		return number_value(v, &n) || n > 1023 ? -EINVAL : (k->dev.index = (int)n, *have |= 1, 0);
	if (!strcmp(key, "uuid"))
		return !uuid_valid(v) || text_value(v, k->dev.uuid, sizeof k->dev.uuid) ? -EINVAL : (*have |= 2, 0);
	if (!strcmp(key, "name"))
		return text_value(v, k->dev.name, sizeof k->dev.name) ? -EINVAL : (*have |= 4, 0);
	if (!strcmp(key, "total_bytes"))
		return number_value(v, &n) || !n ? -EINVAL : (k->dev.total_bytes = n, *have |= 8, 0);
	if (!strcmp(key, "granularity"))
		return number_value(v, &n) || !n || (n & (n - 1)) ? -EINVAL : (k->dev.granularity = n, *have |= 16, 0);
	if (!strcmp(key, "env"))
		return text_value(v, k->env, sizeof k->env);
	return 0; /* a device file's other lines */
}

int vmm_facts_parse(const char *text, struct vmm_known *k)
{
	memset(k, 0, sizeof *k);
	char *copy = strndup(text, FACTS_MAX);
	if (!copy)
		return -ENOMEM;
	bool cuda = false;
	unsigned have = 0;
	int e = 0;
	char *save = NULL;
	for (char *line = strtok_r(copy, "\n", &save); line && !e; line = strtok_r(NULL, "\n", &save)) {
		char *v = strstr(line, ": ");
		if (!v)
			continue;
		*v = '\0';
		e = take(k, line, v + 2, &cuda, &have);
	}
	free(copy);
	if (!e && (!cuda || have != 31 || k->dev.granularity > k->dev.total_bytes))
		e = -EINVAL;
	if (e)
		memset(k, 0, sizeof *k);
	k->dev.backend = e ? NULL : "cuda";
	return e;
}

int vmm_facts_read(const char *path, struct vmm_known *k)
{
	memset(k, 0, sizeof *k);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	char buf[FACTS_MAX + 1];
	ssize_t n = read(fd, buf, sizeof buf);
	int e = n < 0 ? -errno : n > FACTS_MAX ? -EINVAL : 0;
	close(fd);
	if (e)
		return e;
	buf[n] = '\0';
	if (strlen(buf) != (size_t)n) /* a NUL inside */
		return -EINVAL;
	if ((e = vmm_facts_parse(buf, k)))
		return e;
	if (strlen(path) >= sizeof k->path)
		return memset(k, 0, sizeof *k), -ENAMETOOLONG;
	snprintf(k->path, sizeof k->path, "%s", path);
	return 0;
}

int vmm_facts_write(const char *path, const struct vmm *v)
{
	char tmp[4200], env[256];
	if (snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid()) >= (int)sizeof tmp)
		return -ENAMETOOLONG;
	vmm_facts_env(getenv("CUDA_VISIBLE_DEVICES"), getenv("CUDA_DEVICE_ORDER"), env, sizeof env);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600); /* the daemon's, as its images are */
	FILE *f = fd < 0 ? NULL : fdopen(fd, "w");
	if (!f) {
		int e = -errno;
		if (fd >= 0)
			close(fd), unlink(tmp);
		return e;
	}
	fprintf(f, "backend: %s\nindex: %d\nuuid: %s\nname: %s\ntotal_bytes: %" PRIu64 "\ngranularity: %" PRIu64
		   "\nenv: %s\n", v->dev.backend, v->dev.index, v->dev.uuid, v->dev.name, v->dev.total_bytes,
		v->dev.granularity, env);
	int e = fclose(f) ? -errno : 0;
	if (!e && rename(tmp, path))
		e = -errno;
	if (e)
		unlink(tmp);
	return e;
}

/* A value as facts keep it: (unset), or its printable characters ('?' for others). */
static void env_value(const char *v, char *out, size_t size)
{
	snprintf(out, size, "%s", v ? v : "(unset)");
	for (char *c = out; *c; c++)
		if (!isprint((unsigned char)*c) || *c == ' ')
			*c = '?';
}

void vmm_facts_env(const char *visible, const char *order, char *out, size_t size)
{
	char a[112], b[112];
	env_value(visible, a, sizeof a);
	env_value(order, b, sizeof b);
	snprintf(out, size, "visible=%s order=%s", a, b);
}

int vmm_facts_env_of(pid_t pid, char *out, size_t size)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t cap = 1 << 20, got = 0;
	char *buf = malloc(cap + 1);
	ssize_t n = 1;
	while (buf && got < cap && (n = read(fd, buf + got, cap - got)) > 0)
		got += (size_t)n;
	close(fd);
	if (!buf || n < 0 || got == cap) { /* unread, or more than a megabyte: not known */
		free(buf);
		return buf ? -EIO : -ENOMEM;
	}
	buf[got] = '\0';
	const char *visible = NULL, *order = NULL;
	for (char *c = buf; c < buf + got; c += strlen(c) + 1) {
		if (!strncmp(c, "CUDA_VISIBLE_DEVICES=", 21))
			visible = c + 21;
		else if (!strncmp(c, "CUDA_DEVICE_ORDER=", 18))
			order = c + 18;
	}
	vmm_facts_env(visible, order, out, size);
	free(buf);
	return 0;
}

bool vmm_facts_fit(const struct vmm_known *k, const char *backend, const char *device, uint64_t max_bytes)
{
	char env[256];
	vmm_facts_env(getenv("CUDA_VISIBLE_DEVICES"), getenv("CUDA_DEVICE_ORDER"), env, sizeof env);
	if (!k || !k->dev.uuid[0] || (backend && strcmp(backend, "cuda")) || strcmp(k->env, env) ||
	    max_bytes > k->dev.total_bytes)
		return false;
	if (!device)
		return k->dev.index == 0;
	if (device[0] && strspn(device, "0123456789") == strlen(device))
		return strlen(device) < 5 && atoi(device) == k->dev.index;
	return !strcmp(device, k->dev.uuid);
}
