/* libFuzzer: gmsfs-peer's messages (peer/net_wire.c), a peer's untrusted input.  The
 * first byte picks the parser (hello, layout, trailer); the rest is a frame's body.
 * Anything is either an error or a message whose every field is within its limits, and
 * packed again it parses to the same message. */
#include "../../peer/net_wire.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_hello(const uint8_t *d, size_t n)
{
	struct nw_hello h, h2;
	char why[256];
	if (nw_parse_hello(d, n, &h, why, sizeof why))
		return;
	if (!h.token_len || h.token_len > NW_TOKEN_MAX || !nw_store_name_ok(h.store) || !h.stripes ||
	    h.stripes > NW_STRIPES_MAX || h.stripe >= h.stripes)
		abort();
	void *f;
	size_t len;
	if (nw_pack_hello(&h, &f, &len))
		return;
	if (nw_parse_hello((char *)f + 4, len - 4, &h2, why, sizeof why) || h2.token_len != h.token_len ||
	    memcmp(h2.token, h.token, h.token_len) || strcmp(h2.store, h.store) || h2.stripe != h.stripe ||
	    h2.stripes != h.stripes)
		abort();
	free(f);
}

/* Each count of stripes cuts every byte once: the segments of stripes 0..count-1, in order,
 * are the allocations with bytes end to end. */
static void check_stripes(const struct nw_layout *l)
{
	for (uint32_t count = 1; count <= NW_STRIPES_MAX; count++) {
		size_t i = 0;
		uint64_t at = 0;
		for (uint32_t k = 0; k < count; k++) {
			struct nw_segment *s;
			size_t ns;
			if (nw_stripe(l, k, count, &s, &ns))
				return;
			for (size_t j = 0; j < ns; j++) {
				while (i < l->nallocs && at == l->allocs[i].size)
					i++, at = 0;
				if (i == l->nallocs || s[j].i != i || s[j].at != at || !s[j].len ||
				    s[j].len > l->allocs[i].size - at)
					abort();
				at += s[j].len;
			}
			free(s);
		}
		while (i < l->nallocs && at == l->allocs[i].size)
			i++, at = 0;
		if (i != l->nallocs)
			abort();
		uint32_t c = nw_stripes_for(l, count);
		if (!c || c > count || c > l->stripes)
			abort();
	}
}

static void check_layout(const uint8_t *d, size_t n)
{
	struct nw_layout l, l2;
	char why[256];
	if (nw_parse_layout(d, n, &l, why, sizeof why))
		return;
	if (l.nallocs > NW_ALLOCS_MAX || l.nentries > NW_ENTRIES_MAX || (!l.error && strlen(l.hash) != 32))
		abort();
	for (size_t i = 0; i < l.nallocs; i++)
		if (!l.allocs[i].name[0] || l.allocs[i].size > (1ull << 48))
			abort();
	if (!l.error && (!l.stripes || l.stripes > NW_STRIPES_MAX))
		abort();
	if (l.version[0] && !nw_version_name_ok(l.version))
		abort();
	if (!l.error && l.nallocs <= 64)
		check_stripes(&l);
	void *f;
	size_t len;
	if (!nw_pack_layout(&l, &f, &len)) {
		if (nw_parse_layout((char *)f + 4, len - 4, &l2, why, sizeof why) || l2.error != l.error ||
		    l2.nallocs != l.nallocs || l2.nentries != l.nentries || l2.stripes != l.stripes ||
		    strcmp(l2.version, l.version) || strcmp(l2.content, l.content))
			abort();
		for (size_t i = 0; i < l.nentries; i++)
			if (l2.entries[i].value_len != l.entries[i].value_len ||
			    memcmp(l2.entries[i].value, l.entries[i].value, l.entries[i].value_len))
				abort();
		nw_layout_free(&l2);
		free(f);
	}
	nw_layout_free(&l);
}

static void check_trailer(const uint8_t *d, size_t n)
{
	uint64_t v[8];
	char why[256];
	for (size_t k = 0; k <= 8; k++)
		nw_parse_trailer(d, n, v, k, why, sizeof why);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	switch (data[0] % 3) {
	case 0:
		check_hello(data + 1, size - 1);
		break;
	case 1:
		check_layout(data + 1, size - 1);
		break;
	default:
		check_trailer(data + 1, size - 1);
	}
	return 0;
}
