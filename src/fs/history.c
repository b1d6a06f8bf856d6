/* history: a store's last lock events (history.h). */
#include "history.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

const char HISTORY_RW[] = "rw_connected", HISTORY_DATA[] = "data_connected", HISTORY_COMMITTED[] = "committed",
	   HISTORY_KEPT[] = "kept", HISTORY_ABORTED[] = "aborted", HISTORY_LEFT[] = "left", HISTORY_TORN[] = "torn";

void history_begin(struct store *st, const char *kind, pid_t pid)
{
	st->history.leader = pid;
	history_add(st, kind);
}

void history_add(struct store *st, const char *kind)
{
	struct store_history *h = &st->history;
	struct store_event *e = &h->ev[h->seq % STORE_HISTORY_KEEP];
	*e = (struct store_event){ .seq = ++h->seq, .kind = kind, .pid = h->leader,
				   .generation = store_lock(st)->fsm.generation };
	clock_gettime(CLOCK_REALTIME, &e->when);
}

int history_text(const struct store *st, char **out, size_t *len)
{
	const struct store_history *h = &st->history;
	char *text = NULL;
	size_t size = 0;
	FILE *fp = open_memstream(&text, &size);
	if (!fp)
		return -ENOMEM;
	uint64_t first = h->seq > STORE_HISTORY_KEEP ? h->seq - STORE_HISTORY_KEEP : 0;
	for (uint64_t i = first; i < h->seq; i++) {
		const struct store_event *e = &h->ev[i % STORE_HISTORY_KEEP];
		fprintf(fp, "%llu %lld.%06ld %s %d %llu\n", (unsigned long long)e->seq, (long long)e->when.tv_sec,
			e->when.tv_nsec / 1000, e->kind, (int)e->pid, (unsigned long long)e->generation);
	}
	if (fclose(fp)) {
		free(text);
		return -ENOMEM;
	}
	*out = text;
	*len = size;
	return 0;
}
