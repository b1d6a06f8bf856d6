/* tier_stats: the host tier's counters, kept by the moves (tier_move.c, tier_room.c)
 * under fs->mu and read through tier_stats_read (tier.h). */
#ifndef GMSFS_FS_TIER_STATS_H
#define GMSFS_FS_TIER_STATS_H

#include <stdint.h>

struct tier_stats {
	uint64_t moves_out, moves_in, bytes_out, bytes_in, evictions, failures;
	uint64_t host_bytes, host_used, host_standby;
};

#endif
