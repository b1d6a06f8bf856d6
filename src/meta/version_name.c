/* Version names (gmsfs(5), NAMED VERSIONS): the words a commit may carry (a trainer's
 * step, a checkpoint's tag), and "GENERATION NAME", the form user.gms.version and a
 * store's image give them.  Untrusted input: fuzzed (tests/fuzz/fuzz_meta.c). */
#include "meta.h"
#include "version_name.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int meta_version_name(const char *value, size_t size, char name[META_VERSION_NAME_MAX + 1])
{
	if (size && value[size - 1] == '\n')
		size--;
	if (!gmsfs_version_name_valid(value, size))
		return -EINVAL;
	memcpy(name, value, size);
	name[size] = '\0';
	return 0;
}

int meta_version_parse(const char *value, size_t size, uint64_t *gen, char name[META_VERSION_NAME_MAX + 1])
{
	char text[32];
	const char *sp = memchr(value, ' ', size);
	size_t glen = sp ? (size_t)(sp - value) : 0;
	if (!glen || glen >= sizeof text)
		return -EINVAL;
	memcpy(text, value, glen);
	text[glen] = '\0';
	for (size_t i = 0; i < glen; i++)
		if (text[i] < '0' || text[i] > '9')
			return -EINVAL;
	errno = 0;
	unsigned long long g = strtoull(text, NULL, 10);
	if (errno || !g || (glen > 1 && text[0] == '0'))
		return -EINVAL; /* a name is a commit's: generation 1 on; one way to write each */
	int e = meta_version_name(sp + 1, size - glen - 1, name);
	if (!e)
		*gen = g;
	return e;
}
