/* gmsfs-peer: committed stores served to peers, and pulled from them, through UCX.
 *
 *   gmsfs-peer serve MOUNT --listen [ADDR:]PORT --token FILE --allow NAME[,NAME...] [--peers N] [-t SECONDS]
 *   gmsfs-peer pull gmsfs://HOST:PORT/NAME STORE --token FILE [--stripes N] [-t SECONDS] [-q]
 */
#include "pull.h"
#include "serve.h"

#include <gmsfs/load.h> /* struct gmsfs_report */

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int usage(void)
{
	fprintf(stderr, "usage: gmsfs-peer serve MOUNT --listen [ADDR:]PORT --token FILE --allow NAME[,NAME...] "
			"[--peers N] [-t SECONDS]\n"
			"       gmsfs-peer pull gmsfs://HOST:PORT/NAME STORE --token FILE [--stripes N] [-t SECONDS] [-q]\n");
	return 2;
}

static int seconds(const char *s, int *ms)
{
	char *end;
	double v = strtod(s, &end);
	if (end == s || *end || !(v > 0) || v > 86400)
		return -1;
	*ms = (int)(v * 1000);
	return 0;
}

/* A count given to an option: 1 to max in decimal, else -1. */
static long count_arg(const char *s, long max)
{
	char *end;
	long v = strtol(s, &end, 10);
	return end == s || *end || v < 1 || v > max ? -1 : v;
}

/* [ADDR:]PORT, ADDR an IPv4 address, a name, or [IPv6]. */
static int listen_at(const char *s, char *addr, size_t addrlen, uint16_t *port)
{
	const char *colon = strrchr(s, ':'), *p = colon ? colon + 1 : s;
	char *end;
	unsigned long v = strtoul(p, &end, 10);
	if (end == p || *end || !v || v > 65535)
		return -1;
	size_t n = colon ? (size_t)(colon - s) : 0;
	if (n && s[0] == '[' && s[n - 1] == ']')
		s++, n -= 2;
	if (n >= addrlen)
		return -1;
	memcpy(addr, s, n);
	addr[n] = '\0';
	*port = (uint16_t)v;
	return 0;
}

static int split_allow(char *list, struct sv_options *o)
{
	for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (strcmp(t, "*") && !nw_store_name_ok(t))
			return -1;
		char **v = realloc(o->allow, (o->nallow + 1) * sizeof *v);
		if (!v)
			return -1;
		o->allow = v;
		o->allow[o->nallow++] = t;
	}
	return o->nallow ? 0 : -1;
}

/* serve ends on SIGTERM or SIGINT with status 0, as gmsfs-peer(1) says: a pull under way
 * loses its connection and leaves its target uncommitted; the read locks go with the
 * process.  (Only write(2) and _exit here: a signal handler's.) */
static void stop_serving(int sig)
{
	static const char msg[] = "gmsfs-peer: stopped serving (SIGTERM or SIGINT)\n";
	ssize_t w = write(2, msg, sizeof msg - 1);
	(void)w;
	(void)sig;
	_exit(0);
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return usage();
	const char *verb = argv[1], *token_file = NULL, *pos[2] = { 0 };
	char *listen = NULL, *allow = NULL, err[1024];
	int timeout_ms = 30000, npos = 0, peers = 4, stripes = 0;
	bool quiet = false;
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--token") && i + 1 < argc)
			token_file = argv[++i];
		else if (!strcmp(argv[i], "--listen") && i + 1 < argc)
			listen = argv[++i];
		else if (!strcmp(argv[i], "--allow") && i + 1 < argc)
			allow = argv[++i];
		else if (!strcmp(argv[i], "--peers") && i + 1 < argc) {
			if ((peers = (int)count_arg(argv[++i], SV_PEERS_MAX)) < 0) {
				fprintf(stderr, "gmsfs-peer: --peers %s: peers served at once, 1 to %d\n", argv[i],
					SV_PEERS_MAX);
				return 2;
			}
		} else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
			if (seconds(argv[++i], &timeout_ms)) {
				fprintf(stderr, "gmsfs-peer: -t %s: seconds, more than 0\n", argv[i]);
				return 2;
			}
		} else if (!strcmp(argv[i], "--stripes") && i + 1 < argc && !strcmp(verb, "pull")) {
			if ((stripes = (int)count_arg(argv[++i], NW_STRIPES_MAX)) < 0) {
				fprintf(stderr, "gmsfs-peer: --stripes %s: connections a pull, 1 to %d\n", argv[i],
					NW_STRIPES_MAX);
				return 2;
			}
		} else if (!strcmp(argv[i], "-q"))
			quiet = true;
		else if (argv[i][0] == '-' || npos == 2)
			return usage();
		else
			pos[npos++] = argv[i];
	}
	if (!token_file) {
		fprintf(stderr, "gmsfs-peer: --token FILE: the token both sides share\n");
		return 2;
	}
	static struct sv_options o;
	char addr[256];
	if ((strcmp(verb, "serve") && strcmp(verb, "pull")) || (!strcmp(verb, "serve") && npos != 1) ||
	    (!strcmp(verb, "pull") && npos != 2))
		return usage();
	int e = sv_read_token(token_file, o.token, &o.token_len, err, sizeof err);
	if (e) {
		fprintf(stderr, "gmsfs-peer: %s\n", err);
		return 1;
	}
	if (!strcmp(verb, "serve")) {
		if (!listen || listen_at(listen, addr, sizeof addr, &o.port)) {
			fprintf(stderr, "gmsfs-peer: --listen [ADDR:]PORT\n");
			return 2;
		}
		if (!allow || split_allow(allow, &o)) {
			fprintf(stderr, "gmsfs-peer: --allow NAME[,NAME...]: the stores served (* for all)\n");
			return 2;
		}
		o.mount = pos[0];
		o.addr = addr;
		o.timeout_ms = timeout_ms;
		o.peers = peers;
		struct sigaction sa = { .sa_handler = stop_serving };
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGINT, &sa, NULL);
		return sv_serve(&o) ? 1 : 0;
	}
	struct gmsfs_report r = GMSFS_REPORT;
	e = pl_pull(pos[0], pos[1], o.token, o.token_len, timeout_ms, (uint32_t)stripes, !quiet && isatty(2), &r, err,
		    sizeof err);
	if (e) {
		fprintf(stderr, "gmsfs-peer: pull: %s\n", err[0] ? err : strerror(-e));
		return 1;
	}
	if (!quiet)
		printf("pulled %s into %s: %s\n", pos[0], pos[1], r.how);
	return 0;
}
