/* libFuzzer: the safetensors header check (and the JSON reader under it).  The input is a
 * whole file: 8 bytes of header length, the header, the data.  Anything is either a
 * checked description whose every tensor lies inside the data, or an error. */
#include "../../loader/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 8)
		return 0;
	uint64_t len = 0;
	for (int i = 7; i >= 0; i--)
		len = len << 8 | data[i];
	if (len > size - 8)
		len = size - 8; /* st_open refuses it; the parser still gets what is there */
	struct st_file f;
	char err[512];
	if (!st_parse("fuzz", (const char *)data + 8, (size_t)len, size, &f, err, sizeof err)) {
		for (size_t i = 0; i < f.n; i++)
			if (f.t[i].begin > f.t[i].end || f.t[i].end > f.data_len || f.data_start + f.data_len != size)
				abort();
		st_free(&f);
	}
	return 0;
}
