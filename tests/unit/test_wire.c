/* The two parsers of the export socket, on bytes built here by hand: the daemon's
 * request parser and the library's manifest parser (seeds in tests/fuzz/wire-seeds). */
#include "../../libgmsfs/internal.h"
#include "../../src/fs/fs.h"
#include "tap.h"

#include <errno.h>
#include <stdlib.h>

static uint8_t buf[8192];
static size_t n;

static void put(const void *p, size_t len) { memcpy(buf + n, p, len); n += len; }
static void b1(uint8_t v) { buf[n++] = v; }
static void str(const char *s) { b1((uint8_t)(0xa0 | strlen(s))); put(s, strlen(s)); }
static void num(uint64_t v)
{
	if (v < 128)
		return b1((uint8_t)v);
	b1(0xcf);
	for (int i = 7; i >= 0; i--)
		b1((uint8_t)(v >> (8 * i)));
}
static void entry(const char *path, uint64_t size, uint64_t aligned, const char *tag)
{
	b1(0x84);
	str("path"), str(path);
	str("size"), num(size);
	str("aligned"), num(aligned);
	str("tag"), str(tag);
}
/* A manifest header with `count` entries to follow. */
static void head(uint64_t total, uint64_t first, int last, int count)
{
	n = 0;
	b1(0x86);
	str("v"), num(1);
	str("err"), num(0);
	str("total"), num(total);
	str("first"), num(first);
	str("last"), b1(last ? 0xc3 : 0xc2);
	str("allocs"), b1((uint8_t)(0x90 | count));
}

static int parse(struct xp_manifest *m)
{
	char why[128];
	return xp_parse(buf, n, m, why, sizeof why);
}

int main(void)
{
	struct xp_manifest m;
	head(2, 0, 1, 2);
	entry("w/a", 100, 4096, "weights");
	entry("w/b", 4096, 4096, "");
	size_t good = n;
	is_int(parse(&m), 0, "a two-entry manifest parses");
	ok(m.n == 2 && m.total == 2 && m.last && !strcmp(m.v[0].path, "w/a") && m.v[0].size == 100 &&
	   m.v[0].aligned == 4096 && !strcmp(m.v[0].tag, "weights") && m.v[1].tag[0] == '\0', "its fields");
	xp_manifest_free(&m);

	int truncated_ok = 0;
	for (n = 0; n < good; n++)
		truncated_ok += parse(&m) == 0;
	is_int(truncated_ok, 0, "every truncation of it is refused");
	n = good;
	b1(0xc0);
	is_int(parse(&m), -EPROTO, "trailing bytes are refused");

	head(3, 0, 1, 2);
	entry("w/a", 100, 4096, "t");
	entry("w/b", 100, 4096, "t");
	is_int(parse(&m), -EPROTO, "last message with fewer entries than total");
	head(2, 2, 0, 1);
	entry("w/a", 100, 4096, "t");
	is_int(parse(&m), -EPROTO, "first + entries beyond total");
	head(1, 0, 1, 1);
	entry("w/a", 0, 4096, "t");
	is_int(parse(&m), -EPROTO, "size 0");
	head(1, 0, 1, 1);
	entry("w/a", 8192, 4096, "t");
	is_int(parse(&m), -EPROTO, "aligned below size");
	head(1, 0, 1, 1);
	entry("", 1, 1, "t");
	is_int(parse(&m), -EPROTO, "empty path");
	head(1, 0, 1, 1);
	b1(0x84);
	str("path"), b1(0xa3), put("a\0b", 3);
	str("size"), num(1), str("aligned"), num(1), str("tag"), str("t");
	is_int(parse(&m), -EPROTO, "a NUL inside a path");
	head(1, 0, 1, 1);
	b1(0x85);
	str("path"), str("x"), str("size"), num(1), str("aligned"), num(1), str("tag"), str("t"), str("evil"), num(1);
	is_int(parse(&m), -EPROTO, "an unknown key");

	/* A container that declares 2^32-1 elements: refused before msgpack-c allocates for them. */
	head(1, 0, 1, 0);
	n--;
	b1(0xdd), b1(0xff), b1(0xff), b1(0xff), b1(0xff);
	is_int(parse(&m), -EPROTO, "a declared count larger than the message");
	n = 0;
	for (int i = 0; i < 20; i++)
		b1(0x91);
	b1(0x00);
	is_int(parse(&m), -EPROTO, "nesting 20 deep");

	n = 0;
	b1(0x83), str("v"), num(1), str("err"), num(13), str("msg"), str("unknown ticket");
	is_int(parse(&m), 0, "an error reply parses");
	ok(m.err == 13 && !strcmp(m.msg, "unknown ticket"), "with its errno and text");

	/* The daemon's side. */
	struct gmsfs_sock_req r = { .magic = GMSFS_SOCK_MAGIC, .version = GMSFS_SOCK_VERSION, .op = GMSFS_SOCK_OP_REDEEM }, out;
	char why[128];
	is_int(export_parse_request(&r, sizeof r, &out, why, sizeof why), 0, "a request parses");
	is_int(export_parse_request(&r, sizeof r - 1, &out, why, sizeof why), -EINVAL, "a short request");
	r.reserved = 1;
	is_int(export_parse_request(&r, sizeof r, &out, why, sizeof why), -EINVAL, "reserved bits set");
	r.reserved = 0, r.op = 2;
	is_int(export_parse_request(&r, sizeof r, &out, why, sizeof why), -EINVAL, "an unknown op");
	r.op = 1, r.version = 2;
	is_int(export_parse_request(&r, sizeof r, &out, why, sizeof why), -EINVAL, "another version");
	return tap_done();
}
