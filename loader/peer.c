/* peer: a committed store copied into an empty one on another mount (gmsfs_copy, load.h):
 * the source under a read lock, the target in one writer session, the bytes device to
 * device (the target's GPU reads the source's over NVLink or PCIe where the two may reach
 * each other, else through pinned host memory), then the entries and the commit, which
 * must give the source's layout hash.  Anything that fails before the commit leaves the
 * target as it was (its session rolls back) and the source untouched. */
#include "copy.h"
#include "store_files.h"
#include "clock.h"

#include <gmsfs/gmsfs.h>
#include <gmsfs/load.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef GMSFS_HAVE_CUDA
static int cu_said(struct cu_api *cu, CUresult r, const char *what, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s: %s", what, cu_name(cu, r));
	return -EIO;
}

/* Through the host: each piece out of the source's GPU into a pinned buffer, then in. */
static int staged(struct cu_api *cu, CUcontext a, CUcontext b, char *pinned, size_t room, void *const *dst,
		  const struct gmsfs_mapping *v, size_t n, char *err, size_t errlen)
{
	CUresult r = CUDA_SUCCESS;
	for (size_t i = 0; !r && i < n; i++)
		for (uint64_t at = 0; !r && at < v[i].size; at += room) {
			uint64_t len = v[i].size - at < room ? v[i].size - at : room;
			if (!(r = cu->cuCtxSetCurrent(a)))
				r = cu->cuMemcpyDtoH(pinned, (CUdeviceptr)(uintptr_t)v[i].ptr + at, len);
			if (!r && !(r = cu->cuCtxSetCurrent(b)))
				r = cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst[i] + at, pinned, len);
		}
	return r ? cu_said(cu, r, "a copy through host memory", err, errlen) : 0;
}

/* Device to device: on one GPU, or the target's reading the source's (peer access). */
static int device_copy(struct cp *from, struct cp *to, void *const *dst, const struct gmsfs_mapping *v, size_t n,
		       char *how, size_t howlen, char *err, size_t errlen)
{
	struct cu_api *cu, *cu2;
	CUcontext a, b;
	char *pinned, *pinned2;
	size_t room, room2;
	if (cp_cuda(from, &cu, &a, &pinned, &room) || cp_cuda(to, &cu2, &b, &pinned2, &room2)) {
		snprintf(err, errlen, "one store is on a GPU and the other on the host backend: copy through a snapshot");
		return -EINVAL;
	}
	CUdevice da, db;
	int can = 0;
	CUresult r = cu->cuCtxSetCurrent(a);
	if (!r && !(r = cu->cuCtxGetDevice(&da)) && !(r = cu->cuCtxSetCurrent(b)) && !(r = cu->cuCtxGetDevice(&db)) &&
	    da != db)
		r = cu->cuDeviceCanAccessPeer(&can, db, da);
	if (r)
		return cu_said(cu, r, "the GPUs", err, errlen);
	if (da != db && !can) {
		snprintf(how, howlen, "through pinned host memory (GPU %d cannot reach GPU %d's memory)", (int)db, (int)da);
		return staged(cu, a, b, pinned2, room2, dst, v, n, err, errlen);
	}
	/* The target's GPU reads the source's mappings: granted to it, read only. */
	CUmemAccessDesc acc = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, db }, .flags = CU_MEM_ACCESS_FLAGS_PROT_READ };
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (size_t i = 0; da != db && !r && i < n; i++)
		if (v[i].aligned)
			r = cu->cuMemSetAccess((CUdeviceptr)(uintptr_t)v[i].ptr, v[i].aligned, &acc, 1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (r)
		return cu_said(cu, r, "access for the target's GPU", err, errlen);
	CUstream s = NULL;
	if (!(r = cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)))
		for (size_t i = 0; !r && i < n; i++)
			if (v[i].size)
				r = cu->cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst[i], (CUdeviceptr)(uintptr_t)v[i].ptr,
							  v[i].size, s);
	if (s) {
		CUresult r2 = cu->cuStreamSynchronize(s);
		r = r ? r : r2;
		cu->cuStreamDestroy(s);
	}
	if (da == db)
		snprintf(how, howlen, "device to device on GPU %d", (int)da);
	else
		/* The grants are the driver mapping the memory for the other GPU (about 0.65 ms a GiB
		 * on H200s, the first time in a process; copies stall meanwhile): said apart. */
		snprintf(how, howlen, "peer to peer: GPU %d reads GPU %d's memory (NVLink or PCIe), granted in %.4f s",
			 (int)db, (int)da,
			 (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	return r ? cu_said(cu, r, "the copy", err, errlen) : 0;
}
#endif

static int copy_bytes(struct cp *from, struct cp *to, void *const *dst, const struct gmsfs_mapping *v, size_t n,
		      int backend_from, int backend_to, char *how, size_t howlen, char *err, size_t errlen)
{
	if (backend_from == GMSFS_BACKEND_HOST && backend_to == GMSFS_BACKEND_HOST) {
		for (size_t i = 0; i < n; i++)
			memcpy(dst[i], v[i].ptr, v[i].size);
		snprintf(how, howlen, "host memory to host memory");
		return 0;
	}
#ifdef GMSFS_HAVE_CUDA
	return device_copy(from, to, dst, v, n, how, howlen, err, errlen);
#else
	snprintf(err, errlen, "a store on a GPU, and this build has no CUDA support");
	return -ENOTSUP;
#endif
}

/* What the source holds, as the target's create_many and meta_put_many take it. */
static int layout_of(const struct gmsfs_mapping *v, size_t na, char **keys, const struct gmsfs_meta *m, size_t ne,
		     struct gmsfs_new **nv, struct gmsfs_entry **ev)
{
	*nv = calloc(na + 1, sizeof **nv);
	*ev = calloc(ne + 1, sizeof **ev);
	if (!*nv || !*ev)
		return -ENOMEM;
	for (size_t i = 0; i < na; i++)
		(*nv)[i] = (struct gmsfs_new){ .name = v[i].name, .tag = v[i].tag, .size = v[i].size };
	for (size_t i = 0; i < ne; i++)
		(*ev)[i] = (struct gmsfs_entry){ .key = keys[i], .alloc = m[i].alloc ? m[i].alloc : "",
						 .offset = m[i].offset, .size = m[i].size, .flags = m[i].flags,
						 .value = m[i].value, .value_len = m[i].value_len };
	return 0;
}

/* What the copy moved, into out: allocations, bytes and, copied, the bytes' own time (what
 * a peer copy of them costs the driver) after how the bytes went. */
static void report(struct gmsfs_report *out, const struct gmsfs_mapping *v, size_t na, bool copied)
{
	uint64_t bytes = 0;
	for (size_t i = 0; copied && i < na; i++)
		bytes += v[i].size;
	out->allocations = na;
	out->bytes = bytes;
	size_t said = strlen(out->how);
	if (copied && said < sizeof out->how)
		snprintf(out->how + said, sizeof out->how - said, "; %llu bytes in %.4f s", (unsigned long long)bytes,
			 out->bytes_seconds);
}

static int copy_store(const char *src, const char *dst, int timeout_ms, struct gmsfs_report *out, char *err,
		      size_t errlen)
{
	char *how = out->how;
	size_t howlen = sizeof out->how;
	struct cp *from = NULL, *to = NULL;
	gmsfs *gs = NULL, *gd = NULL;
	char **keys = NULL, hash[33], got[33];
	struct gmsfs_meta *m = NULL;
	struct gmsfs_new *nv = NULL;
	struct gmsfs_entry *ev = NULL;
	size_t ne = 0, na = 0;
	const struct gmsfs_mapping *v = NULL;
	how[0] = err[0] = '\0';
	/* A target that holds a committed layout is refused at once, before any wait (source
	 * and target swapped: the empty source's read lock would wait for a first commit);
	 * checked again under its lock below. */
	int e = sf_allocations(dst) > 0 ? -EEXIST : 0;
	if (e)
		snprintf(err, errlen, "%s holds allocations already: copy into an empty store", dst);
	/* Each side connects and maps in its own GPU's context (cp_open makes it current). */
	if (!e)
		e = cp_open(src, &from, err, errlen);
	if (!e && (e = gmsfs_connect(&gs, src, GMSFS_RO, timeout_ms)))
		snprintf(err, errlen, "%s: %s", src, gs ? gmsfs_errmsg(gs) : gmsfs_strerror(e));
	if (!e && ((e = gmsfs_import_all(gs)) || (e = gmsfs_meta_get_all(gs, "", &keys, &m, &ne)) ||
		   (e = gmsfs_layout_hash(gs, hash))))
		snprintf(err, errlen, "%s: %s", src, gmsfs_errmsg(gs));
	char content[33]; /* the source's, where its daemon knows it for the commit read: the bytes copied are it */
	bool known = !e && !gmsfs_content_hash(gs, content);
	if (!e)
		na = gmsfs_mappings(gs, &v);
	if (!e)
		e = cp_open(dst, &to, err, errlen);
	if (!e && (e = gmsfs_connect(&gd, dst, GMSFS_RW, timeout_ms)))
		snprintf(err, errlen, "%s: %s", dst, gd ? gmsfs_errmsg(gd) : gmsfs_strerror(e));
	if (!e && sf_allocations(dst) != 0)
		e = -EEXIST, snprintf(err, errlen, "%s holds allocations already: copy into an empty store", dst);
	if (!e && (e = layout_of(v, na, keys, m, ne, &nv, &ev)))
		snprintf(err, errlen, "out of memory");
	if (!e && na && (e = gmsfs_create_many(gd, nv, na)))
		snprintf(err, errlen, "%s: %s", dst, gmsfs_errmsg(gd));
	void **ptrs = e ? NULL : calloc(na + 1, sizeof *ptrs);
	for (size_t i = 0; ptrs && i < na; i++)
		ptrs[i] = nv[i].ptr;
	if (!e && !ptrs)
		e = -ENOMEM, snprintf(err, errlen, "out of memory");
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (!e)
		e = copy_bytes(from, to, ptrs, v, na, gmsfs_backend(gs), gmsfs_backend(gd), how, howlen, err, errlen);
	out->bytes_seconds = clock_since_s(&t0);
	report(out, v, na, !e);
	free(ptrs);
	if (!e && ne && (e = gmsfs_meta_put_many(gd, ev, ne)))
		snprintf(err, errlen, "%s: %s", dst, gmsfs_errmsg(gd));
	if (!e && (e = gmsfs_commit(gd)))
		snprintf(err, errlen, "%s: commit: %s", dst, gmsfs_errmsg(gd));
	if (!e && (e = gmsfs_layout_hash(gd, got)))
		snprintf(err, errlen, "%s: %s", dst, gmsfs_errmsg(gd));
	if (!e && strcmp(got, hash))
		e = -EIO, snprintf(err, errlen, "copied, but %s's layout hash is %s, not the source's %s", dst, got, hash);
	if (!e)
		memcpy(out->layout_hash, got, sizeof got);
	uint64_t gen = e ? 0 : gmsfs_generation(gd);
	free(nv);
	free(ev);
	if (keys)
		gmsfs_meta_free_all(keys, m, ne);
	gmsfs_disconnect(gd); /* without a commit: the target's session rolls back */
	if (!e && known) /* once its session is over; a refusal leaves it unknown */
		sf_set_content_hash(dst, gen, content);
	gmsfs_disconnect(gs);
	cp_close(to);
	cp_close(from);
	return e;
}

GMSFS_API int gmsfs_copy(const char *src, const char *dst, const struct gmsfs_copy_options *opt,
			 struct gmsfs_report *out)
{
	struct gmsfs_copy_options o = GMSFS_COPY_OPTIONS;
	struct gmsfs_report r = GMSFS_REPORT;
	gmsfs_seterr(NULL, 0, NULL);
	if (!src || !dst)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_copy: no source or no target");
	if (opt && opt->size != sizeof o)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_copy: options of %u bytes: this libgmsfs-load knows %zu "
				    "(set .size, or start from GMSFS_COPY_OPTIONS)", opt->size, sizeof o);
	if (out && out->size != sizeof r)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_copy: a report of %u bytes: this libgmsfs-load knows %zu "
				    "(start from GMSFS_REPORT)", out->size, sizeof r);
	if (opt)
		o = *opt;
	if (o.flags || o.reserved)
		return gmsfs_seterr(NULL, -EINVAL, "gmsfs_copy: flags 0x%x, reserved 0x%x: none is known yet, both 0",
				    o.flags, o.reserved);
	char err[1024] = "";
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int e = copy_store(src, dst, o.timeout_ms, &r, err, sizeof err);
	r.seconds = clock_since_s(&t0);
	if (e)
		return gmsfs_seterr(NULL, e, "%s", err[0] ? err : gmsfs_strerror(e));
	if (out)
		*out = r;
	return 0;
}
