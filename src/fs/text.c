/* text: the content of the files that cat reads: device, status.json, metrics, state,
 * layout_hash.  Called under fs->mu, so every number of one text is of one moment. */
#include "text.h"
#include "content.h"
#include "named.h"
#include "export/export.h"
#include "keep.h"
#include "store.h"
#include "tier.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

int text_device(struct fs *fs, char **out, size_t *len)
{
	const struct vmm *v = fs->vmm;
	int n = asprintf(out,
			 "index: %d\ngpu: %d\nuuid: %s\nname: %s\nbackend: %s\ntotal_bytes: %llu\nused_bytes: %llu\n"
			 "granularity: %llu\nversion: %s\nhost_bytes: %llu\nhost_used_bytes: %llu\n"
			 "host_standby_bytes: %llu\nhost_standby_unused_bytes: %llu\npages_spare_bytes: %llu\n"
			 "releasing_bytes: %llu\nsocket: %s\npid: %d\noptions: %s\n"
			 /* the names before 0.3 (kept one release, gmsfs(5)): */
			 "host_kept_bytes: %llu\npages_kept_bytes: %llu\n",
			 v->dev.index, v->dev.gpu, v->dev.uuid, v->dev.name, v->dev.backend,
			 (unsigned long long)v->max_bytes, (unsigned long long)atomic_load(&v->used_bytes),
			 (unsigned long long)v->dev.granularity, GMSFS_VERSION, (unsigned long long)v->host_bytes,
			 (unsigned long long)atomic_load(&v->host_used), (unsigned long long)atomic_load(&v->host_standby),
			 (unsigned long long)tier_standby_unused(fs), (unsigned long long)atomic_load(&v->pages_spare),
			 (unsigned long long)(atomic_load(&v->releasing) + atomic_load(&v->host_releasing)),
			 export_socket(fs), (int)getpid(),
			 fs->options ? fs->options : "", (unsigned long long)atomic_load(&v->host_standby),
			 (unsigned long long)atomic_load(&v->pages_spare));
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

int text_state(struct store *st, char **out, size_t *len)
{
	struct meta_stats s = {0};
	if (st->meta)
		meta_stats(st->meta, &s);
	const struct fsm *f = &store_lock(st)->fsm;
	int n = asprintf(out,
			 "state: %s\nreaders: %u\nwriter: %d\nwaiting_writers: %u\nwaiting_readers: %u\n"
			 "generation: %llu\ntorn: %d\ndata_only: %d\nkept: %d\npaused: %u\nversions: %u\nbeside: %d\nprev_handles: %u\n"
			 "prev_generation: %llu\nversion_copies: %llu\nversion_copied_bytes: %llu\nversion_overwrites: %llu\nflips: %llu\nallocations: %llu\nentries: %llu\nbytes: %llu\n"
			 "aligned_bytes: %llu\n"
			 "layout_hash: %s\nrequests: %llu\nsocket_requests: %llu\ntier: %s\nquota: %llu\n"
			 "priority: %d\nmin: %llu\nreserved: %llu\nused: %llu\npeak: %llu\nreclaim: %llu\n"
			 "pages_spare: %llu\nlast_error: %s\npages_kept: %llu\n" /* pages_kept: pages_spare's name before 0.3 */
			 "read_handles: %u\n",
			 st->removed ? "REMOVED" : fsm_state_name(fsm_state(f)), store_readers(st), (int)f->leader,
			 f->waiting_writers, f->waiting_readers, (unsigned long long)f->generation, f->torn,
			 f->data, f->kept, f->paused, st->versions.allowed, f->beside,
			 st->versions.prev_handles, (unsigned long long)(f->prev_held ? st->versions.prev_generation : 0),
			 (unsigned long long)st->versions.copies, (unsigned long long)st->versions.copied_bytes,
			 (unsigned long long)st->versions.overwrites, (unsigned long long)st->versions.flips, (unsigned long long)s.allocations, (unsigned long long)s.entries,
			 (unsigned long long)s.bytes, (unsigned long long)s.aligned_bytes,
			 st->meta ? meta_hash_hex(st->meta) : "", (unsigned long long)st->requests,
			 (unsigned long long)st->socket_requests, store_tier_name(&st->tier),
			 (unsigned long long)atomic_load(&st->pool->quota), st->tier.priority,
			 (unsigned long long)atomic_load(&st->pool->min), (unsigned long long)st->tier.reserved,
			 (unsigned long long)atomic_load(&st->pool->used), (unsigned long long)atomic_load(&st->pool->peak),
			 (unsigned long long)tier_reclaim_left(st), (unsigned long long)atomic_load(&st->pool->pages_spare),
			 st->last_error, (unsigned long long)atomic_load(&st->pool->pages_spare), f->readers);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

int text_tier(struct store *st, char **out, size_t *len)
{
	int n = asprintf(out, "%s\n", store_tier_name(&st->tier));
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

int text_generation(struct store *st, char **out, size_t *len)
{
	int n = asprintf(out, "%llu\n", (unsigned long long)store_lock(st)->fsm.generation);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

int text_hash(struct store *st, char **out, size_t *len)
{
	const char *h = st->meta ? meta_hash_hex(st->meta) : "";
	int n = asprintf(out, h[0] ? "%s\n" : "%s", h);
	if (n < 0)
		return -ENOMEM;
	*len = (size_t)n;
	return 0;
}

/* ---- status.json and metrics: every store, as Triton reports its regions ---- */

static int by_name(const void *a, const void *b)
{
	return strcmp((*(struct store *const *)a)->name, (*(struct store *const *)b)->name);
}

/* The stores in name order (stable output), then those removed while held (deferred:
 * their memory is still there); NULL and *n 0 when there are none. */
static struct store **sorted_stores(struct fs *fs, size_t *n, int *e)
{
	const struct store_table *t = fs->stores;
	size_t held = 0;
	for (size_t i = 0; i < t->nremoved; i++)
		held += t->removed[i]->meta != NULL;
	*n = t->n + held;
	*e = 0;
	if (!*n)
		return NULL;
	struct store **v = malloc(*n * sizeof *v);
	if (!v) {
		*e = -ENOMEM;
		return NULL;
	}
	memcpy(v, t->v, t->n * sizeof *v);
	qsort(v, t->n, sizeof *v, by_name);
	for (size_t i = 0, k = t->n; i < t->nremoved; i++)
		if (t->removed[i]->meta)
			v[k++] = t->removed[i];
	return v;
}

/* The stores in name order and a stream onto *out; NULL (nothing to free) if out of memory. */
static FILE *begin(struct fs *fs, struct store ***st, size_t *n, int *e, char **out, size_t *len)
{
	*st = sorted_stores(fs, n, e);
	FILE *f = open_memstream(out, len);
	if (!f)
		free(*st);
	return f;
}

/* A JSON string: quotes, backslashes and control characters escaped; other bytes as
 * they are (names are paths, last_error is the daemon's own text). */
static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", f);
		else if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

static int finish(FILE *f, char **out, size_t *len, int e)
{
	if (fclose(f) || e) {
		free(*out);
		*out = NULL;
		return e ? e : -ENOMEM;
	}
	return 0;
}

int text_status_json(struct fs *fs, char **out, size_t *len)
{
	const struct vmm *v = fs->vmm;
	int e;
	size_t n;
	struct store **st;
	FILE *f = begin(fs, &st, &n, &e, out, len);
	if (!f)
		return -ENOMEM;
	fputs("{\"version\": ", f);
	json_str(f, GMSFS_VERSION);
	fprintf(f, ",\n \"device\": {\"index\": %d, \"gpu\": %d, \"uuid\": ", v->dev.index, v->dev.gpu);
	json_str(f, v->dev.uuid);
	fputs(", \"name\": ", f);
	json_str(f, v->dev.name);
	fputs(", \"backend\": ", f);
	json_str(f, v->dev.backend);
	struct tier_stats ts;
	tier_stats_read(fs, &ts);
	fprintf(f, ", \"total_bytes\": %llu, \"used_bytes\": %llu, \"granularity\": %llu, \"host_bytes\": %llu, "
		   "\"host_used_bytes\": %llu, \"host_standby_bytes\": %llu, \"pages_spare_bytes\": %llu, "
		   "\"host_kept_bytes\": %llu, \"pages_kept_bytes\": %llu, " /* their names before 0.3 */
		   "\"moves_to_host\": %llu, \"moves_to_device\": %llu, \"evictions\": %llu, \"move_failures\": %llu},\n \"stores\": [",
		(unsigned long long)v->max_bytes, (unsigned long long)atomic_load(&v->used_bytes),
		(unsigned long long)v->dev.granularity, (unsigned long long)ts.host_bytes,
		(unsigned long long)ts.host_used, (unsigned long long)ts.host_standby,
		(unsigned long long)atomic_load(&v->pages_spare), (unsigned long long)ts.host_standby,
		(unsigned long long)atomic_load(&v->pages_spare), (unsigned long long)ts.moves_out,
		(unsigned long long)ts.moves_in, (unsigned long long)ts.evictions, (unsigned long long)ts.failures);
	for (size_t i = 0; i < n; i++) {
		struct store *s = st[i];
		struct meta_stats m = {0};
		if (s->meta)
			meta_stats(s->meta, &m);
		const struct fsm *q = &store_lock(s)->fsm;
		fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
		json_str(f, s->name);
		fputs(", \"state\": ", f);
		json_str(f, s->removed ? "REMOVED" : fsm_state_name(fsm_state(q)));
		fprintf(f, ", \"removing\": %s, \"tier\": ", s->removed ? "true" : "false");
		json_str(f, store_tier_name(&s->tier));
		fprintf(f, ", \"quota\": %llu, \"priority\": %d", (unsigned long long)atomic_load(&s->pool->quota),
			s->tier.priority);
		fprintf(f, ", \"min\": %llu, \"reserved\": %llu, \"used\": %llu, \"peak\": %llu, \"reclaim\": %llu, "
			   "\"pages_spare\": %llu, \"pages_kept\": %llu, \"pieces\": %u",
			(unsigned long long)atomic_load(&s->pool->min), (unsigned long long)s->tier.reserved,
			(unsigned long long)atomic_load(&s->pool->used), (unsigned long long)atomic_load(&s->pool->peak),
			(unsigned long long)tier_reclaim_left(s), (unsigned long long)atomic_load(&s->pool->pages_spare),
			(unsigned long long)atomic_load(&s->pool->pages_spare), atomic_load(&s->pool->pieces));
		fprintf(f,
			", \"readers\": %u, \"read_handles\": %u, \"writer\": %d, \"waiting_writers\": %u, "
			"\"waiting_readers\": %u, "
			"\"generation\": %llu, \"torn\": %d, \"allocations\": %llu, \"entries\": %llu, \"bytes\": %llu, "
			"\"aligned_bytes\": %llu, \"layout_hash\": ",
			store_readers(s), q->readers, (int)q->leader, q->waiting_writers, q->waiting_readers,
			(unsigned long long)q->generation, q->torn, (unsigned long long)m.allocations,
			(unsigned long long)m.entries, (unsigned long long)m.bytes, (unsigned long long)m.aligned_bytes);
		json_str(f, s->meta ? meta_hash_hex(s->meta) : "");
		content_json(s, f);
		named_json(s, f);
		fprintf(f,
			", \"commits\": %llu, \"aborts\": %llu, \"lock_waits\": %llu, \"exports\": %llu, "
			"\"requests\": %llu, \"socket_requests\": %llu, \"last_error\": ",
			(unsigned long long)store_lock(s)->commits, (unsigned long long)store_lock(s)->aborts,
			(unsigned long long)store_lock(s)->waits, (unsigned long long)s->exports,
			(unsigned long long)s->requests, (unsigned long long)s->socket_requests);
		json_str(f, s->last_error);
		fputc('}', f);
	}
	fputs(n ? "\n ]" : "]", f);
	keep_status(fs, f);
	fputs("\n}\n", f);
	free(st);
	return finish(f, out, len, e);
}

/* A label value: backslash, double quote and newline escaped, as the text format says. */
static void label(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fprintf(f, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

enum metric_kind { GAUGE, COUNTER };

static void header(FILE *f, const char *name, enum metric_kind k, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, k == GAUGE ? "gauge" : "counter");
}

/* The device's labels, on every series: device (the uuid, as before), and gpu and UUID as
 * dcgm-exporter names them, so that dashboards join gmsfs's series with the GPU's.  The
 * metrics of several mounts (one per GPU) in one scrape stay distinct series. */
static void dev_labels(FILE *f, const struct vmm *v)
{
	fputs("device=", f);
	label(f, v->dev.uuid);
	fprintf(f, ",gpu=\"%d\",UUID=", v->dev.gpu);
	label(f, v->dev.uuid);
}

static void sample(FILE *f, const char *name, const struct store *s, const char *extra, const char *val,
		   unsigned long long n)
{
	fprintf(f, "%s{", name);
	dev_labels(f, s->fs->vmm);
	fputs(",store=", f);
	label(f, s->name);
	if (extra) {
		fprintf(f, ",%s=", extra);
		label(f, val);
	}
	fprintf(f, "} %llu\n", n);
}

/* A series of the mount: its device, and where the bytes went (to=) if to is set. */
static void device_sample(FILE *f, const char *name, const struct vmm *v, const char *to, unsigned long long n)
{
	fprintf(f, "%s{", name);
	dev_labels(f, v);
	if (to)
		fprintf(f, ",to=\"%s\"", to);
	fprintf(f, "} %llu\n", n);
}

/* Where each store's memory is, its quota and priority (tier.c), and the mount's host tier. */
static void tier_series(FILE *f, struct fs *fs, struct store **st, size_t n)
{
	const struct vmm *v = fs->vmm;
	header(f, "gmsfs_store_quota_bytes", GAUGE, "The store's quota (user.gms.quota); 0: none.");
	for (size_t i = 0; i < n; i++)
		sample(f, "gmsfs_store_quota_bytes", st[i], NULL, NULL, atomic_load(&st[i]->pool->quota));
	header(f, "gmsfs_store_used_bytes", GAUGE, "Bytes the store's allocations hold, on either tier.");
	for (size_t i = 0; i < n; i++)
		sample(f, "gmsfs_store_used_bytes", st[i], NULL, NULL, atomic_load(&st[i]->pool->used));
	header(f, "gmsfs_store_min_bytes", GAUGE, "Bytes kept free for the store while it holds less (user.gms.min).");
	for (size_t i = 0; i < n; i++)
		sample(f, "gmsfs_store_min_bytes", st[i], NULL, NULL, atomic_load(&st[i]->pool->min));
	header(f, "gmsfs_store_reserved_bytes", GAUGE, "Address space the store's engine set aside for pages (user.gms.reserved).");
	for (size_t i = 0; i < n; i++)
		sample(f, "gmsfs_store_reserved_bytes", st[i], NULL, NULL, st[i]->tier.reserved);
	header(f, "gmsfs_store_peak_bytes", GAUGE, "The most bytes the store's allocations have held.");
	for (size_t i = 0; i < n; i++)
		sample(f, "gmsfs_store_peak_bytes", st[i], NULL, NULL, atomic_load(&st[i]->pool->peak));
	header(f, "gmsfs_store_reclaim_bytes", GAUGE, "Bytes the store is asked to give back for another's growth.");
	for (size_t i = 0; i < n; i++)
		sample(f, "gmsfs_store_reclaim_bytes", st[i], NULL, NULL, tier_reclaim_left(st[i]));
	header(f, "gmsfs_store_priority", GAUGE, "The store's priority (user.gms.priority).");
	for (size_t i = 0; i < n; i++) {
		fputs("gmsfs_store_priority{", f); /* signed: not through sample() */
		dev_labels(f, v);
		fputs(",store=", f);
		label(f, st[i]->name);
		fprintf(f, "} %d\n", st[i]->tier.priority);
	}
	header(f, "gmsfs_store_tier", GAUGE, "1 for where the store's memory is, 0 for the others.");
	for (size_t i = 0; i < n; i++) {
		for (enum tier_at k = TIER_DEVICE; k <= TIER_TO_DEVICE; k++)
			sample(f, "gmsfs_store_tier", st[i], "tier", store_tier_at_name(k), st[i]->tier.at == k);
	}
	header(f, "gmsfs_store_moves_total", COUNTER, "Moves of the store between the device and the host tier.");
	for (size_t i = 0; i < n; i++) {
		sample(f, "gmsfs_store_moves_total", st[i], "to", "host", st[i]->tier.moves_out);
		sample(f, "gmsfs_store_moves_total", st[i], "to", "device", st[i]->tier.moves_in);
	}
	header(f, "gmsfs_store_removing", GAUGE, "1 for a store removed while held: freed when its last holder leaves.");
	for (size_t i = 0; i < n; i++)
		sample(f, "gmsfs_store_removing", st[i], NULL, NULL, st[i]->removed);
	struct tier_stats ts;
	tier_stats_read(fs, &ts);
	header(f, "gmsfs_host_tier_bytes", GAUGE, "Host memory the host tier may hold (host_bytes).");
	device_sample(f, "gmsfs_host_tier_bytes", v, NULL, ts.host_bytes);
	header(f, "gmsfs_host_tier_used_bytes", GAUGE, "Host memory the host tier holds.");
	device_sample(f, "gmsfs_host_tier_used_bytes", v, NULL, ts.host_used);
	header(f, "gmsfs_host_tier_standby_bytes", GAUGE,
	       "Of the host tier's use: host memory on standby from stores' last move in, for their next move out.");
	device_sample(f, "gmsfs_host_tier_standby_bytes", v, NULL, ts.host_standby);
	header(f, "gmsfs_host_tier_kept_bytes", GAUGE, "gmsfs_host_tier_standby_bytes under its name before 0.3 (kept one "
						       "release).");
	device_sample(f, "gmsfs_host_tier_kept_bytes", v, NULL, ts.host_standby);
	header(f, "gmsfs_tier_bytes_moved_total", COUNTER, "Bytes moved between the device and the host tier.");
	device_sample(f, "gmsfs_tier_bytes_moved_total", v, "host", ts.bytes_out);
	device_sample(f, "gmsfs_tier_bytes_moved_total", v, "device", ts.bytes_in);
	header(f, "gmsfs_evictions_total", COUNTER, "Idle stores moved to the host tier to make room for a create.");
	device_sample(f, "gmsfs_evictions_total", v, NULL, ts.evictions);
	header(f, "gmsfs_tier_move_failures_total", COUNTER, "Moves that failed (last_error says why).");
	device_sample(f, "gmsfs_tier_move_failures_total", v, NULL, ts.failures);
	int armed = keep_armed(fs);
	if (armed >= 0) {
		header(f, "gmsfs_keep_armed", GAUGE, "1 while every store is kept across a restart (state=), 0 when the "
						     "service manager's descriptor store went or refused one, or the state directory "
						     "does not answer (status.json says why).");
		device_sample(f, "gmsfs_keep_armed", v, NULL, (unsigned long long)armed);
	}
}

/* What each store holds, as labels: its committed layout hash, its content hash and the
 * last commit's version name. */
static void info_series(FILE *f, struct fs *fs, struct store **st, size_t n)
{
	header(f, "gmsfs_store_info", GAUGE, "1, labelled with the store's committed layout hash (\"\" before a "
					     "commit), its content hash (\"unknown\" where it is not known) and "
					     "the last commit's version name (\"\" where it has none).");
	for (size_t i = 0; i < n; i++) {
		char content[2 * GMSFS_HASH_LEN + 1];
		content_label(st[i], content);
		fputs("gmsfs_store_info{", f);
		dev_labels(f, fs->vmm);
		fputs(",store=", f);
		label(f, st[i]->name);
		fputs(",layout_hash=", f);
		label(f, st[i]->meta ? meta_hash_hex(st[i]->meta) : "");
		const char *why, *version = named_current(st[i], &why);
		fprintf(f, ",content_hash=\"%s\",version=\"%s\"} 1\n", content, version ? version : "");
	}
}

int text_metrics(struct fs *fs, char **out, size_t *len)
{
	static const enum fsm_state states[] = { FSM_EMPTY, FSM_RW, FSM_COMMITTED, FSM_RO, FSM_TORN };
	const struct vmm *v = fs->vmm;
	int e;
	size_t n;
	struct store **st;
	FILE *f = begin(fs, &st, &n, &e, out, len);
	if (!f)
		return -ENOMEM;
	struct meta_stats *m = calloc(n ? n : 1, sizeof *m);
	if (!m)
		e = -ENOMEM;
	for (size_t i = 0; m && i < n; i++)
		if (st[i]->meta)
			meta_stats(st[i]->meta, &m[i]);

	header(f, "gmsfs_store_state", GAUGE, "1 for the state the store is in, 0 for the others (REMOVED: removed "
					      "while held, as status.json says).");
	for (size_t i = 0; m && i < n; i++) {
		bool removed = st[i]->removed;
		for (size_t k = 0; k < sizeof states / sizeof *states; k++)
			sample(f, "gmsfs_store_state", st[i], "state", fsm_state_name(states[k]),
			       !removed && fsm_state(&store_lock(st[i])->fsm) == states[k]);
		sample(f, "gmsfs_store_state", st[i], "state", "REMOVED", removed);
	}
	header(f, "gmsfs_store_readers", GAUGE, "Processes holding a read lock.");
	for (size_t i = 0; m && i < n; i++)
		sample(f, "gmsfs_store_readers", st[i], NULL, NULL, store_readers(st[i]));
	header(f, "gmsfs_store_writer", GAUGE, "1 while a writer session holds the store.");
	for (size_t i = 0; m && i < n; i++)
		sample(f, "gmsfs_store_writer", st[i], NULL, NULL, store_lock(st[i])->fsm.leader != 0);
	header(f, "gmsfs_store_waiting", GAUGE, "Opens and lock calls waiting, by the lock they want.");
	for (size_t i = 0; m && i < n; i++) {
		sample(f, "gmsfs_store_waiting", st[i], "lock", "read", store_lock(st[i])->fsm.waiting_readers);
		sample(f, "gmsfs_store_waiting", st[i], "lock", "write", store_lock(st[i])->fsm.waiting_writers);
	}
	header(f, "gmsfs_store_allocations", GAUGE, "Allocations in the layout the store shows.");
	for (size_t i = 0; m && i < n; i++)
		sample(f, "gmsfs_store_allocations", st[i], NULL, NULL, m[i].allocations);
	header(f, "gmsfs_store_entries", GAUGE, "Metadata entries in the layout the store shows.");
	for (size_t i = 0; m && i < n; i++)
		sample(f, "gmsfs_store_entries", st[i], NULL, NULL, m[i].entries);
	header(f, "gmsfs_store_bytes", GAUGE, "Bytes of its allocations, as the device holds them (aligned).");
	for (size_t i = 0; m && i < n; i++)
		sample(f, "gmsfs_store_bytes", st[i], NULL, NULL, m[i].aligned_bytes);
	tier_series(f, fs, st, m ? n : 0);
	info_series(f, fs, st, m ? n : 0);
	header(f, "gmsfs_store_commits_total", COUNTER, "Commits published.");
	for (size_t i = 0; m && i < n; i++)
		sample(f, "gmsfs_store_commits_total", st[i], NULL, NULL, store_lock(st[i])->commits);
	header(f, "gmsfs_store_aborts_total", COUNTER,
	       "Writer sessions that ended without a commit (closed or crashed): rolled back.");
	for (size_t i = 0; m && i < n; i++)
		sample(f, "gmsfs_store_aborts_total", st[i], NULL, NULL, store_lock(st[i])->aborts);
	header(f, "gmsfs_store_lock_waits_total", COUNTER, "Opens and lock calls that had to wait.");
	for (size_t i = 0; m && i < n; i++)
		sample(f, "gmsfs_store_lock_waits_total", st[i], NULL, NULL, store_lock(st[i])->waits);
	header(f, "gmsfs_store_exports_total", COUNTER, "Export requests served (imports).");
	for (size_t i = 0; m && i < n; i++)
		sample(f, "gmsfs_store_exports_total", st[i], NULL, NULL, st[i]->exports);
	header(f, "gmsfs_device_used_bytes", GAUGE, "Device memory the stores hold.");
	fputs("gmsfs_device_used_bytes{", f);
	dev_labels(f, v);
	fprintf(f, "} %llu\n", (unsigned long long)atomic_load(&v->used_bytes));
	header(f, "gmsfs_device_total_bytes", GAUGE, "Device memory the stores may hold (max_bytes).");
	fputs("gmsfs_device_total_bytes{", f);
	dev_labels(f, v);
	fprintf(f, "} %llu\n", (unsigned long long)v->max_bytes);
	header(f, "gmsfs_kernel_nodes", GAUGE,
	       "Layout nodes the kernel holds (lookups, readdirplus) or an open directory's listing names; "
	       "one out of every store is freed at its forget.");
	fputs("gmsfs_kernel_nodes{", f);
	dev_labels(f, v);
	fprintf(f, "} %zu\n", fs->grave.known);
	free(m);
	free(st);
	return finish(f, out, len, e);
}
