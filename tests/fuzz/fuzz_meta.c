/* libFuzzer target: every input parser of a store (names, allocation paths,
 * offsets, extents, the private flag, tags, value writes, batches of entries, the
 * content hash's attribute: what it takes, written again, reads back the same)
 * driven by arbitrary bytes, removals, then commit and rollback.  Invariants: no crash, no leak, a refused call
 * changes nothing, a committed hash survives any rollback.  The nodes a and e stay (the loop points at them). */
#include "../../src/meta/meta.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void release(void *buf, void *ctx) { free(buf); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct meta_store *s = meta_store_new(release, NULL);
	struct meta_node *a = NULL, *e = NULL;
	meta_create(meta_root(s, META_AREA_ALLOCS), "a", META_ALLOC, &a);
	meta_alloc_size(a, 4096, 4096, malloc(1));
	meta_create(meta_root(s, META_AREA_META), "e", META_ENTRY, &e);
	meta_entry_set_alloc(e, "a", 1);
	char err[512], hash[33];
	if (meta_commit(s, err, sizeof err))
		abort();
	memcpy(hash, meta_hash_hex(s), sizeof hash);

	/* Records: op byte, length byte, bytes. */
	size_t i = 0;
	while (i + 2 <= size) {
		uint8_t op = data[i], len = data[i + 1];
		i += 2;
		if (len > size - i)
			len = (uint8_t)(size - i);
		char buf[257];
		memcpy(buf, data + i, len);
		buf[len] = '\0';
		i += len;
		uint64_t before = e->offset, extent = e->extent;
		struct meta_node *n;
		const char *one[1] = { buf };
		uint8_t d0[16], d1[16];
		switch (op % 16) {
		case 0:
			if (meta_entry_set_offset(e, buf, len) && e->offset != before)
				abort();
			break;
		case 1:
			if (!meta_entry_set_alloc(e, buf, len) && !gmsfs_path_valid(e->alloc, strlen(e->alloc)))
				abort();
			break;
		case 2: meta_set_tag(a, buf, len); break;
		case 3: meta_create(meta_root(s, META_AREA_ALLOCS), buf, op & 8 ? META_DIR : META_ALLOC, &n); break;
		case 4: meta_create(meta_root(s, META_AREA_META), buf, META_ENTRY, &n); break;
		case 5: meta_entry_write(e, (uint64_t)op << 12, buf, len); break;
		case 6: meta_commit(s, err, sizeof err); memcpy(hash, meta_hash_hex(s), sizeof hash); break;
		case 8:
			if (meta_entry_set_extent(e, buf, len) && e->extent != extent)
				abort();
			break;
		case 9: meta_entry_set_flag(e, GMSFS_ENTRY_PRIVATE, buf, len); break;
		case 10: {
			/* A batch of two: one good, one from the bytes; refused means unchanged. */
			struct entry_rec p[2] = { { .key = "ok", .alloc = "a", .value = "v", .value_len = 1 },
						 { .key = buf, .alloc = "a", .offset = before, .size = len, .value = buf,
						   .value_len = len } };
			meta_layout_hash(s, d0);
			if (meta_put_entries(s, p, 2, err, sizeof err)) {
				meta_layout_hash(s, d1);
				if (memcmp(d0, d1, 16))
					abort();
			}
			break;
		}
		case 11: /* a node by name, in either area, or a directory left empty */
			n = meta_lookup(meta_root(s, op & 8 ? META_AREA_META : META_AREA_ALLOCS), buf);
			if (n && n != a && n != e)
				meta_remove(n);
			break;
		case 12:
		case 13:
			if (!strcmp(buf, op % 16 == 12 ? "e" : "a") || (e->alloc && !strcmp(buf, e->alloc)))
				break; /* freeing e's allocation would remove e */
			meta_layout_hash(s, d0);
			if ((op % 16 == 12 ? meta_delete_entries : meta_free_allocs)(s, one, 1, err, sizeof err)) {
				meta_layout_hash(s, d1);
				if (memcmp(d0, d1, 16))
					abort();
			}
			break;
		case 14: {
			uint64_t g, g2;
			uint8_t h[16], h2[16];
			char again[64];
			if (meta_content_parse(buf, len, &g, h))
				break;
			int at = snprintf(again, sizeof again, "%llu ", (unsigned long long)g);
			for (int k = 0; k < 16; k++)
				at += snprintf(again + at, sizeof again - (size_t)at, "%02x", h[k]);
			if (meta_content_parse(again, (size_t)at, &g2, h2) || g2 != g || memcmp(h, h2, 16))
				abort();
			break;
		}
		case 15: { /* a version name and its "GENERATION NAME": read back as written */
			uint64_t g, g2;
			char name[META_VERSION_NAME_MAX + 1], name2[META_VERSION_NAME_MAX + 1], again[96];
			if (!meta_version_name(buf, len, name) && (strlen(name) > META_VERSION_NAME_MAX || strchr(name, ' ')))
				abort();
			if (meta_version_parse(buf, len, &g, name))
				break;
			int at = snprintf(again, sizeof again, "%llu %s", (unsigned long long)g, name);
			if (!g || meta_version_parse(again, (size_t)at, &g2, name2) || g2 != g || strcmp(name, name2))
				abort();
			break;
		}
		case 7:
			meta_rollback(s);
			if (strcmp(hash, meta_hash_hex(s)))
				abort();
			uint8_t d[16];
			char hex[33];
			meta_layout_hash(s, d);
			for (int k = 0; k < 16; k++)
				sprintf(hex + 2 * k, "%02x", d[k]);
			if (strcmp(hex, hash)) /* after rollback the live layout is the committed one */
				abort();
			e = meta_resolve(s, META_AREA_META, "e");
			a = meta_resolve(s, META_AREA_ALLOCS, "a");
			if (!e || !a)
				abort();
			break;
		}
	}
	meta_store_free(s);
	return 0;
}
