/* vmm_internal: what the files of src/vmm share beyond vmm.h (their layers: src/vmm/layers). */
#ifndef GMSFS_VMM_INTERNAL_H
#define GMSFS_VMM_INTERNAL_H

#include "vmm.h"

/* vmm_release.c: fn(arg) run on the releaser thread (now, where there is none). */
int vmm_release_open(struct vmm *v);
void vmm_release_close(struct vmm *v);
void vmm_release_later(struct vmm *v, void (*fn)(void *arg), void *arg);

/* vmm_account.c */
int vmm_mins_open(struct vmm *v);
void vmm_mins_close(struct vmm *v);
/* n bytes more of used, within limit (0: none); false changes nothing. */
bool vmm_reserve(atomic_uint_fast64_t *used, uint64_t limit, uint64_t n);
/* n bytes of the device for pool: within max_bytes less held (bytes held outside
 * used_bytes), less what the other pools' minimums still lack. */
bool vmm_device_take(struct vmm *v, struct vmm_pool *pool, uint64_t n, uint64_t held);
void vmm_note_peak(struct vmm_pool *pool);

/* vmm_kept.c: the device's list of pools that keep pages, and a pool's end. */
int vmm_kept_open(struct vmm *v);
void vmm_kept_close(struct vmm *v);
void vmm_kept_pool_end(struct vmm_pool *p);
/* Kept pages given up until n bytes have gone; false when none were kept. */
bool vmm_give_up_kept(struct vmm *v, uint64_t n);
/* b's last reference went: kept for its pool (true), or to be released as any buffer. */
bool vmm_keep_page(struct vmm_buf *b);
/* A page of aligned bytes pool keeps, off its list (NULL: none); vmm_kept_return puts
 * one taken and not used back (still counted in pages_kept meanwhile). */
struct vmm_buf *vmm_kept_take(struct vmm_pool *pool, uint64_t aligned);
void vmm_kept_return(struct vmm_buf *b);

/* vmm_buf.c: n bytes of the device for pool, kept pages given up where the room is theirs. */
bool vmm_device_reserve(struct vmm *v, struct vmm_pool *pool, uint64_t n);

#endif
