/* test_copy: where a piece of gmsfs-load's sits in its pinned buffer (cp_piece_shift), so
 * that its largest part's O_DIRECT read lands in place: for every page offset of the file
 * and many places of the part in the piece, the read starts on a page boundary inside the
 * buffer, the part's first byte is where the piece wants it, and the read widened to whole
 * pages ends inside the buffer (the GPU path, which the host backend never takes). */
#include "copy.h"
#include "tap.h"

#include <stdint.h>

int main(void)
{
	static const uint64_t ats[] = { 0, 1, 511, 512, 4095, 4096, 4097, 1u << 20, CP_PIECE - 4096, CP_PIECE - 1 };
	unsigned bad = 0, cases = 0;
	for (uint64_t delta = 0; delta < CP_PAGE; delta += 7)
		for (size_t i = 0; i < sizeof ats / sizeof *ats; i++)
			for (uint64_t len = 1; len <= CP_PIECE - ats[i]; len = len * 3 + 4093) {
				uint64_t off = 5 * CP_PAGE + delta, at = ats[i], shift = cp_piece_shift(off, at);
				int64_t start = (int64_t)(shift + at) - (int64_t)delta; /* the read's first page */
				uint64_t end = (uint64_t)start + ((delta + len + CP_PAGE - 1) & ~(CP_PAGE - 1));
				cases++;
				bad += shift >= CP_PAGE || start < 0 || start % (int64_t)CP_PAGE ||
				       (uint64_t)start + delta != shift + at || end > CP_BUF || shift + CP_PIECE > CP_BUF;
			}
	ok(!bad && cases > 1000, "every piece's largest part lands in place, its read within the buffer (%u cases, %u bad)",
	   cases, bad);
	return tap_done();
}
