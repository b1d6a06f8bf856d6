/* The wire codec alone (common/wire_msgpack.c): what one side packs the other parses back,
 * and bytes built here by hand that no daemon or library would send are refused.
 * Seeds for the fuzzer are in tests/fuzz/wire-seeds. */
#include "tap.h"
#include "wire.h"
#include "wire_msgpack.h"

#include <errno.h>
#include <stdlib.h>

static uint8_t buf[8192];
static size_t n;
static char why[256];

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
static void alloc_item(const char *path, uint64_t size, uint64_t aligned, const char *tag, uint64_t fd)
{
	b1(0x86);
	str("path"), str(path);
	str("size"), num(size);
	str("aligned"), num(aligned);
	str("tag"), str(tag);
	str("fd"), num(fd);
	str("fdoff"), num(0);
}
/* A manifest header with `na` allocations to follow and then `nc` chunks. */
static void head(uint64_t total, uint64_t first, int last, int na)
{
	n = 0;
	b1(0x88);
	str("v"), num(2);
	str("err"), num(0);
	str("total"), num(total);
	str("nentries"), num(0);
	str("first"), num(first);
	str("last"), b1(last ? 0xc3 : 0xc2);
	str("allocs"), b1((uint8_t)(0x90 | na));
}
static void no_meta(void) { str("meta"), b1(0x90); }

static int parse(struct wire_reply *r)
{
	return wire_parse_reply(buf, n, r, why, sizeof why);
}

static void replies(void)
{
	struct wire_reply r;
	head(2, 0, 1, 2);
	alloc_item("w/a", 100, 4096, "weights", 0);
	alloc_item("w/b", 4096, 4096, "default", 1);
	no_meta();
	size_t good = n;
	is_int(parse(&r), 0, "a two-allocation manifest parses");
	ok(r.manifest && r.nallocs == 2 && r.total == 2 && r.last && !strcmp(r.allocs[0].path, "w/a") &&
	   r.allocs[0].size == 100 && r.allocs[0].aligned == 4096 && !strcmp(r.allocs[0].tag, "weights") &&
	   r.allocs[1].fd == 1, "its fields");
	wire_reply_free(&r);

	int truncated_ok = 0;
	for (n = 0; n < good; n++)
		truncated_ok += parse(&r) == 0;
	is_int(truncated_ok, 0, "every truncation of it is refused");
	n = good;
	b1(0xc0);
	is_int(parse(&r), -EPROTO, "trailing bytes are refused");

	n = 0; /* a generation with no manifest to show it */
	b1(0x83);
	str("v"), num(2);
	str("err"), num(0);
	str("gen"), num(7);
	is_int(parse(&r), -EPROTO, "a generation outside a manifest is refused");

	head(3, 0, 1, 2);
	alloc_item("w/a", 100, 4096, "t", 0);
	alloc_item("w/b", 100, 4096, "t", 0);
	no_meta();
	is_int(parse(&r), -EPROTO, "a last message with fewer allocations than the total");
	head(2, 2, 0, 1);
	alloc_item("w/a", 100, 4096, "t", 0);
	no_meta();
	is_int(parse(&r), -EPROTO, "first + allocations beyond the total");
	head(1, 0, 1, 1);
	alloc_item("w/a", 0, 4096, "t", 0);
	no_meta();
	is_int(parse(&r), -EPROTO, "size 0");
	head(1, 0, 1, 1);
	alloc_item("w/a", 8192, 4096, "t", 0);
	no_meta();
	is_int(parse(&r), -EPROTO, "aligned below size");
	head(1, 0, 1, 1);
	alloc_item("w/../x", 1, 1, "t", 0);
	no_meta();
	is_int(parse(&r), -EPROTO, "a path with ..");
	head(1, 0, 1, 1);
	alloc_item("w/a", 1, 1, "t", 253);
	no_meta();
	is_int(parse(&r), -EPROTO, "a descriptor index past what a message can carry");
	head(1, 0, 1, 1);
	b1(0x86);
	str("path"), b1(0xa3), put("a\0b", 3);
	str("size"), num(1), str("aligned"), num(1), str("tag"), str("t"), str("fd"), num(0), str("fdoff"), num(0);
	no_meta();
	is_int(parse(&r), -EPROTO, "a NUL inside a path");
	head(1, 0, 1, 1);
	b1(0x87);
	str("path"), str("x"), str("size"), num(1), str("aligned"), num(1), str("tag"), str("t"), str("fd"), num(0);
	str("fdoff"), num(0), str("evil"), num(1);
	no_meta();
	is_int(parse(&r), -EPROTO, "an unknown key");
	head(1, 0, 1, 1);
	b1(0x86);
	str("path"), str("x"), str("path"), str("y"), str("size"), num(1), str("aligned"), num(1), str("tag"), str("t");
	str("fd"), num(0);
	no_meta();
	is_int(parse(&r), -EPROTO, "a repeated key");

	/* A container that declares 2^32-1 elements: refused before msgpack-c allocates for them. */
	head(1, 0, 1, 0);
	n--;
	b1(0xdd), b1(0xff), b1(0xff), b1(0xff), b1(0xff);
	is_int(parse(&r), -EPROTO, "a declared count larger than the message");
	n = 0;
	for (int i = 0; i < 20; i++)
		b1(0x91);
	b1(0x00);
	is_int(parse(&r), -EPROTO, "nesting 20 deep");

	n = 0;
	b1(0x83), str("v"), num(2), str("err"), num(13), str("msg"), str("unknown ticket");
	is_int(parse(&r), 0, "an error reply parses");
	ok(r.err == 13 && !strcmp(r.msg, "unknown ticket") && !r.manifest, "with its errno and text");
	n = 0;
	b1(0x82), str("v"), num(1), str("err"), num(0);
	is_int(parse(&r), -EPROTO, "another version");
	n = 0;
	b1(0x83), str("v"), num(2), str("err"), num(5), str("total"), num(1);
	is_int(parse(&r), -EPROTO, "an error with part of a manifest");
}

/* Packed by the daemon's side, parsed by the library's: entries in chunks. */
static void round_trip(void)
{
	struct wire_alloc a[2] = { { .path = "layers/0/w", .tag = "weights", .size = 100, .aligned = 4096, .fd = 0 },
				   { .path = "layers/1/w", .tag = "weights", .size = 4096, .aligned = 4096, .fd = 0,
				     .fd_offset = 4096 } };
	uint8_t val[300];
	for (int i = 0; i < 300; i++)
		val[i] = (uint8_t)i;
	struct wire_chunk c[3] = {
		{ .key = "t/a", .alloc = "layers/0/w", .offset = 16, .size = 64, .flags = GMSFS_ENTRY_PRIVATE,
		  .value_len = 300, .voff = 0, .bytes = val, .nbytes = 200 },
		{ .key = "t/a", .value_len = 300, .voff = 200, .bytes = val + 200, .nbytes = 100 },
		{ .key = "t/b", .alloc = "", .value_len = 0, .voff = 0, .bytes = NULL, .nbytes = 0 },
	};
	struct wire_head h = { .manifest = true, .total = 2, .nentries = 2, .first = 0, .last = true };
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	is_int(wire_pack_reply(&sb, &h, a, 2, c, 3), 0, "a manifest with two allocations and chunked entries packs");
	ok(sb.size <= WIRE_HEAD_COST + wire_alloc_cost(a[0].path, a[0].tag) + wire_alloc_cost(a[1].path, a[1].tag) +
			      wire_chunk_cost("t/a", "layers/0/w", 200) + wire_chunk_cost("t/a", "", 100) +
			      wire_chunk_cost("t/b", "", 0),
	   "within the cost the sender budgets for (%zu bytes)", sb.size);
	struct wire_reply r;
	is_int(wire_parse_reply(sb.data, sb.size, &r, why, sizeof why), 0, "and parses back");
	ok(r.nallocs == 2 && r.allocs[1].fd_offset == 4096 && r.nchunks == 3, "allocations and chunks");
	ok(r.chunks[0].offset == 16 && r.chunks[0].size == 64 && r.chunks[0].flags == GMSFS_ENTRY_PRIVATE &&
	   r.chunks[0].value_len == 300 && r.chunks[0].nbytes == 200 && !memcmp(r.chunks[0].bytes, val, 200) &&
	   r.chunks[1].voff == 200 && !memcmp(r.chunks[1].bytes, val + 200, 100) && r.chunks[2].alloc[0] == '\0',
	   "the entry's fields and both chunks of its value");
	wire_reply_free(&r);
	msgpack_sbuffer_destroy(&sb);

	struct wire_head e = { .err = EINVAL, .msg = "entries[3] (k): allocation 'x' does not exist" };
	msgpack_sbuffer_init(&sb);
	wire_pack_reply(&sb, &e, NULL, 0, NULL, 0);
	is_int(wire_parse_reply(sb.data, sb.size, &r, why, sizeof why), 0, "an error reply round trips");
	ok(r.err == EINVAL && !strcmp(r.msg, e.msg), "its errno and text");
	msgpack_sbuffer_destroy(&sb);

	/* A flip's manifest says the generation it shows; a plain reply cannot. */
	struct wire_head f = { .manifest = true, .total = 0, .last = true, .has_gen = true, .gen = 42 };
	msgpack_sbuffer_init(&sb);
	is_int(wire_pack_reply(&sb, &f, NULL, 0, NULL, 0), 0, "a manifest with its generation packs");
	is_int(wire_parse_reply(sb.data, sb.size, &r, why, sizeof why), 0, "and parses back");
	ok(r.manifest && r.has_gen && r.gen == 42 && !r.nallocs, "its generation, no allocation");
	wire_reply_free(&r);
	msgpack_sbuffer_destroy(&sb);
	struct wire_head plain = {0};
	msgpack_sbuffer_init(&sb);
	wire_pack_reply(&sb, &plain, NULL, 0, NULL, 0);
	ok(wire_parse_reply(sb.data, sb.size, &r, why, sizeof why) == 0 && !r.has_gen, "none without it");
	wire_reply_free(&r);
	msgpack_sbuffer_destroy(&sb);
}

/* One allocation in pieces in a manifest: packs, parses back; a count that does not
 * match the sizes, a first piece not where fd and fdoff say, a descriptor past the
 * message's are refused. */
static int pieces_parse(const struct wire_alloc *a, struct wire_reply *r)
{
	struct wire_head h = { .manifest = true, .total = 1, .first = 0, .last = true };
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	int e = wire_pack_reply(&sb, &h, a, 1, NULL, 0);
	if (!e)
		e = wire_parse_reply(sb.data, sb.size, r, why, sizeof why);
	msgpack_sbuffer_destroy(&sb);
	return e;
}

static void pieces(void)
{
	struct wire_piece p[3] = { { .fd = 0 }, { .fd = 1 }, { .fd = 2, .fd_offset = 4096 } };
	struct wire_alloc a = { .path = "w", .tag = "default", .size = 5 << 20, .aligned = 5 << 20, .fd = 0,
				.fd_offset = 0, .piece = 2 << 20, .pieces = p, .npieces = 3 };
	struct wire_reply r;
	is_int(pieces_parse(&a, &r), 0, "an allocation in three pieces round trips");
	ok(r.nallocs == 1 && r.allocs[0].npieces == 3 && r.allocs[0].piece == 2 << 20 && r.allocs[0].pieces[1].fd == 1 &&
	   r.allocs[0].pieces[2].fd_offset == 4096, "each piece's descriptor and offset");
	wire_reply_free(&r);
	a.npieces = 2;
	is_int(pieces_parse(&a, &r), -EPROTO, "two pieces of 2 MiB for 5 MiB");
	a.npieces = 3, a.piece = 1 << 20;
	is_int(pieces_parse(&a, &r), -EPROTO, "three pieces of 1 MiB for 5 MiB");
	a.piece = 2 << 20, p[0].fd = 1;
	is_int(pieces_parse(&a, &r), -EPROTO, "a first piece that is not fd's");
	p[0].fd = 0, p[2].fd = GMSFS_FDS_PER_MSG;
	is_int(pieces_parse(&a, &r), -EPROTO, "a piece's descriptor past a message's");
	p[2].fd = 2, a.piece = 0;
	is_int(pieces_parse(&a, &r), -EPROTO, "pieces of size 0");
}

/* An image's allocation with the host memory made ahead for its pieces (a takeover's). */
static int standby_parse(const struct wire_alloc *a, struct wire_alloc *out, uint64_t nfds)
{
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	int e = wire_pack_image_alloc(&sb, a);
	if (!e)
		e = wire_parse_image_alloc(sb.data + 4, sb.size - 4, out, nfds); /* past the record's length */
	msgpack_sbuffer_destroy(&sb);
	return e;
}

static void standby(void)
{
	struct wire_piece p[3] = { { .fd = 0 }, { .fd = 1 }, { .fd = 2 } };
	struct wire_piece sp[3] = { { .fd = 3 }, { .fd = WIRE_NO_FD }, { .fd = 4, .fd_offset = 8192 } };
	struct wire_alloc a = { .path = "w", .tag = "default", .size = 5 << 20, .aligned = 5 << 20, .piece = 2 << 20,
				.pieces = p, .npieces = 3, .standby = sp, .nstandby = 3 }, r;
	is_int(standby_parse(&a, &r, 5), 0, "an image's allocation with standby memory round trips");
	ok(r.nstandby == 3 && r.standby[0].fd == 3 && r.standby[1].fd == WIRE_NO_FD && r.standby[2].fd == 4 &&
	   r.standby[2].fd_offset == 8192, "each piece's standby descriptor and offset, or none");
	wire_alloc_free(&r);
	is_int(standby_parse(&a, &r, 4), -EINVAL, "a standby descriptor past the image's");
	a.nstandby = 2;
	is_int(standby_parse(&a, &r, 5), -EINVAL, "standby for two pieces of three");
	a.npieces = 0, a.pieces = NULL, a.piece = 0, a.nstandby = 1;
	is_int(standby_parse(&a, &r, 5), 0, "one piece, one standby");
	wire_alloc_free(&r);
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	wire_pack_alloc(&pk, &a);
	struct wire_alloc m;
	msgpack_unpacked u;
	msgpack_unpacked_init(&u);
	msgpack_unpack_next(&u, sb.data, sb.size, NULL);
	memset(&m, 0, sizeof m);
	is_int(wire_parse_alloc(&u.data, &m, 5, false), -1, "standby in a manifest (not an image) is refused");
	wire_alloc_free(&m);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&sb);
}

/* Requests: packed by the library, parsed by the daemon. */
static void requests(void)
{
	struct gmsfs_sock_req hd, out;
	uint8_t t[16] = { 1, 2, 3 };
	wire_req_init(&hd, GMSFS_OP_REDEEM, t, 0, 0);
	is_int(wire_req_parse(&hd, sizeof hd, &out, why, sizeof why), 0, "a REDEEM header parses");
	is_int(wire_req_parse(&hd, sizeof hd - 1, &out, why, sizeof why), -EINVAL, "a short header");
	hd.flags = 2;
	is_int(wire_req_parse(&hd, sizeof hd, &out, why, sizeof why), -EINVAL, "unknown flags");
	wire_req_init(&hd, GMSFS_OP_MAX + 1, t, 0, 0);
	is_int(wire_req_parse(&hd, sizeof hd, &out, why, sizeof why), -EINVAL, "an unknown op");
	wire_req_init(&hd, GMSFS_OP_REDEEM, t, 0, 0);
	hd.version = 1;
	is_int(wire_req_parse(&hd, sizeof hd, &out, why, sizeof why), -EINVAL, "another version");
	wire_req_init(&hd, GMSFS_OP_EXPORT, t, 0, 0);
	is_int(wire_req_parse(&hd, sizeof hd, &out, why, sizeof why), -EINVAL, "a ticket on an op that takes none");
	wire_req_init(&hd, GMSFS_OP_COMMIT, NULL, 0, 4);
	uint8_t m[40];
	memcpy(m, &hd, sizeof hd);
	is_int(wire_req_parse(m, sizeof hd + 4, &out, why, sizeof why), -EINVAL, "a body on COMMIT");
	wire_req_init(&hd, GMSFS_OP_META_PUT, NULL, 0, 5);
	memcpy(m, &hd, sizeof hd);
	is_int(wire_req_parse(m, sizeof hd + 4, &out, why, sizeof why), -EINVAL, "a body shorter than the header says");

	struct wire_body b;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	struct wire_alloc ca[2] = { { .path = "a/b", .size = 10, .tag = "kv" }, { .path = "c", .size = 1 } };
	wire_pack_create(&sb, ca, 2);
	is_int(wire_parse_body(GMSFS_OP_CREATE, sb.data, sb.size, &b, why, sizeof why), 0, "a CREATE body round trips");
	ok(b.nallocs == 2 && !strcmp(b.allocs[0].path, "a/b") && b.allocs[0].size == 10 && !strcmp(b.allocs[0].tag, "kv") &&
	   !b.allocs[1].tag, "with its paths, sizes and tags");
	wire_body_free(&b);
	is_int(wire_parse_body(GMSFS_OP_META_PUT, sb.data, sb.size, &b, why, sizeof why), -EINVAL,
	       "the same body for another op is refused");
	msgpack_sbuffer_clear(&sb);
	struct wire_alloc bad = { .path = "a//b", .size = 10 };
	wire_pack_create(&sb, &bad, 1);
	is_int(wire_parse_body(GMSFS_OP_CREATE, sb.data, sb.size, &b, why, sizeof why), -EINVAL, "a doubled / in a path");
	msgpack_sbuffer_clear(&sb);
	bad = (struct wire_alloc){ .path = "a", .size = 0 };
	wire_pack_create(&sb, &bad, 1);
	is_int(wire_parse_body(GMSFS_OP_CREATE, sb.data, sb.size, &b, why, sizeof why), -EINVAL, "size 0");

	msgpack_sbuffer_clear(&sb);
	struct entry_rec ent = { .key = "t/x", .alloc = "a/b", .offset = 8, .size = 2, .flags = 1,
				  .value = (uint8_t *)"fp16", .value_len = 4 };
	wire_pack_entries(&sb, &ent, 1);
	is_int(wire_parse_body(GMSFS_OP_META_PUT, sb.data, sb.size, &b, why, sizeof why), 0, "a META_PUT body round trips");
	ok(b.nentries == 1 && !strcmp(b.entries[0].key, "t/x") && b.entries[0].offset == 8 && b.entries[0].size == 2 &&
	   b.entries[0].flags == 1 && b.entries[0].value_len == 4 && !memcmp(b.entries[0].value, "fp16", 4),
	   "with every field");
	wire_body_free(&b);
	msgpack_sbuffer_clear(&sb);
	ent.flags = 4; /* past GMSFS_ENTRY_FLAGS (private 1, note 2) */
	wire_pack_entries(&sb, &ent, 1);
	is_int(wire_parse_body(GMSFS_OP_META_PUT, sb.data, sb.size, &b, why, sizeof why), -EINVAL, "an unknown flag");

	msgpack_sbuffer_clear(&sb);
	const char *names[2] = { "x", "y/z" };
	wire_pack_names(&sb, GMSFS_K_KEYS, names, 2);
	is_int(wire_parse_body(GMSFS_OP_META_DELETE, sb.data, sb.size, &b, why, sizeof why), 0, "a META_DELETE body");
	ok(b.nnames == 2 && !strcmp(b.names[1], "y/z"), "with its keys");
	wire_body_free(&b);
	is_int(wire_parse_body(GMSFS_OP_FREE, sb.data, sb.size, &b, why, sizeof why), -EINVAL,
	       "keys where FREE wants paths");

	msgpack_sbuffer_clear(&sb);
	wire_pack_export(&sb, NULL, 0, false, true);
	is_int(wire_parse_body(GMSFS_OP_EXPORT, sb.data, sb.size, &b, why, sizeof why), 0, "an EXPORT body");
	ok(!b.fds && b.meta && !b.has_names, "metadata only, the whole layout");
	ok(!b.overwrite, "not said: no overwrite");
	wire_body_free(&b);
	msgpack_sbuffer_clear(&sb);
	wire_pack_export_overwrite(&sb, names, 2);
	is_int(wire_parse_body(GMSFS_OP_EXPORT, sb.data, sb.size, &b, why, sizeof why), 0, "an EXPORT body with overwrite");
	ok(b.overwrite && b.fds && !b.meta && b.nnames == 2 && !strcmp(b.names[0], "x"), "overwrite, descriptors, its names");
	wire_body_free(&b);
	msgpack_sbuffer_destroy(&sb);
	n = 0; /* overwrite is a boolean: 1 is refused, as a repeated one is */
	b1(0x81), str("overwrite"), b1(0x01);
	is_int(wire_parse_body(GMSFS_OP_EXPORT, buf, n, &b, why, sizeof why), -EINVAL, "an overwrite that is not a boolean");
	n = 0;
	b1(0x82), str("overwrite"), b1(0xc3), str("overwrite"), b1(0xc3);
	is_int(wire_parse_body(GMSFS_OP_EXPORT, buf, n, &b, why, sizeof why), -EINVAL, "overwrite twice");

	msgpack_sbuffer_init(&sb);
	wire_pack_commit_named(&sb, "step-1200");
	wire_req_init(&hd, GMSFS_OP_COMMIT_NAMED, NULL, 0, (uint32_t)sb.size);
	uint8_t whole[64];
	memcpy(whole, &hd, sizeof hd);
	memcpy(whole + sizeof hd, sb.data, sb.size);
	is_int(wire_req_parse(whole, sizeof hd + sb.size, &out, why, sizeof why), 0, "a COMMIT_NAMED header with its body");
	is_int(wire_parse_body(GMSFS_OP_COMMIT_NAMED, sb.data, sb.size, &b, why, sizeof why), 0, "a COMMIT_NAMED body");
	ok(b.version && !strcmp(b.version, "step-1200"), "with its name");
	wire_body_free(&b);
	is_int(wire_parse_body(GMSFS_OP_COMMIT, sb.data, sb.size, &b, why, sizeof why), -EINVAL,
	       "the same body on COMMIT is refused");
	msgpack_sbuffer_clear(&sb);
	wire_pack_commit_named(&sb, "-step");
	is_int(wire_parse_body(GMSFS_OP_COMMIT_NAMED, sb.data, sb.size, &b, why, sizeof why), -EINVAL,
	       "a name that starts with '-' (%s)", why);
	msgpack_sbuffer_clear(&sb);
	wire_pack_commit_named(&sb, "a b");
	is_int(wire_parse_body(GMSFS_OP_COMMIT_NAMED, sb.data, sb.size, &b, why, sizeof why), -EINVAL, "a name with a space");
	msgpack_sbuffer_destroy(&sb);
	is_int(wire_parse_body(GMSFS_OP_COMMIT_NAMED, "\x80", 1, &b, why, sizeof why), -EINVAL, "no name");
	n = 0;
	b1(0x81), str("name"), b1(0xa3), b1('a'), b1(0), b1('b');
	is_int(wire_parse_body(GMSFS_OP_COMMIT_NAMED, buf, n, &b, why, sizeof why), -EINVAL, "a name with a NUL in it");
	n = 0;
	b1(0x81), str("name"), b1(0x07);
	is_int(wire_parse_body(GMSFS_OP_COMMIT_NAMED, buf, n, &b, why, sizeof why), -EINVAL, "a name that is a number");
	n = 0;
	b1(0x82), str("name"), b1(0xa1), b1('a'), str("name"), b1(0xa1), b1('b');
	is_int(wire_parse_body(GMSFS_OP_COMMIT_NAMED, buf, n, &b, why, sizeof why), -EINVAL, "a name twice");
	/* COMMIT_LEAVE: COMMIT_NAMED's body, its name optional. */
	n = 0;
	b1(0x80);
	is_int(wire_parse_body(GMSFS_OP_COMMIT_LEAVE, buf, n, &b, why, sizeof why), 0, "a COMMIT_LEAVE body without a name");
	ok(!b.version, "names none");
	wire_body_free(&b);
	msgpack_sbuffer_init(&sb);
	wire_pack_commit_named(&sb, NULL);
	ok(sb.size == 1 && (uint8_t)sb.data[0] == 0x80, "packed without a name: an empty map");
	msgpack_sbuffer_clear(&sb);
	wire_pack_commit_named(&sb, "step-7");
	is_int(wire_parse_body(GMSFS_OP_COMMIT_LEAVE, sb.data, sb.size, &b, why, sizeof why), 0, "a COMMIT_LEAVE body named");
	ok(b.version && !strcmp(b.version, "step-7"), "with its name");
	wire_body_free(&b);
	msgpack_sbuffer_destroy(&sb);
	n = 0;
	b1(0x81), str("name"), b1(0xa2), b1('-'), b1('a');
	is_int(wire_parse_body(GMSFS_OP_COMMIT_LEAVE, buf, n, &b, why, sizeof why), -EINVAL, "COMMIT_LEAVE: not a name");
	n = 0;
	b1(0x81), str("paths"), b1(0x90);
	is_int(wire_parse_body(GMSFS_OP_COMMIT_LEAVE, buf, n, &b, why, sizeof why), -EINVAL, "COMMIT_LEAVE: an unknown field");
	is_int(wire_parse_body(GMSFS_OP_COMMIT_LEAVE, "", 0, &b, why, sizeof why), -EINVAL, "COMMIT_LEAVE: no body at all");

	n = 0;
	b1(0x81), str("allocs"), b1(0xdd), b1(0x7f), b1(0xff), b1(0xff), b1(0xff);
	is_int(wire_parse_body(GMSFS_OP_CREATE, buf, n, &b, why, sizeof why), -EINVAL,
	       "a CREATE body declaring 2^31 allocations in 12 bytes");
}

/* An image's readers: a kept session's leader (writer) packed and read back as such; its
 * named versions with it. */
static void image_readers(void)
{
	struct wire_reader r[2] = { { .pid = 5, .count = 2, .start = 9 }, { .pid = 6, .count = 1, .start = 10, .writer = 1 } };
	struct wire_image h = { .store = "kv", .device = "GPU-0", .backend = "host", .generation = 3, .readers = r,
				.nreaders = 2, .named = "1 step-1\n3 step-3\n" };
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	is_int(wire_pack_image(&sb, &h), 0, "an image with a reader and a kept session's leader");
	const void *rec;
	size_t off = 0, len;
	struct wire_image back = { 0 };
	char why[256] = "";
	ok(!wire_image_next(sb.data, sb.size, &off, &rec, &len) && !wire_parse_image(rec, len, &back, why, sizeof why),
	   "read back (%s)", why);
	ok(back.nreaders == 2 && back.readers[0].pid == 5 && back.readers[0].count == 2 && !back.readers[0].writer &&
	   back.readers[1].pid == 6 && back.readers[1].start == 10 && back.readers[1].writer == 1,
	   "the reader a reader, the leader a writer");
	ok(back.named && !strcmp(back.named, "1 step-1\n3 step-3\n"), "its named versions kept as written");
	wire_image_free(&back);
	msgpack_sbuffer_destroy(&sb);
}

int main(void)
{
	image_readers();
	replies();
	round_trip();
	pieces();
	standby();
	requests();
	return tap_done();
}
