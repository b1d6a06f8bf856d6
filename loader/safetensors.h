/* safetensors: the file format (an 8-byte little-endian header length, a JSON header
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
 * data), checked whole before anything is used: header length, JSON, known dtypes,
 * shapes that match sizes, offsets inside the data and not overlapping.  Errors name the
 * file and the tensor.  And the index of a sharded checkpoint
 * (model.safetensors.index.json: {"weight_map": {name: shard}}). */
#ifndef GMSFS_LOADER_SAFETENSORS_H
#define GMSFS_LOADER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_HEADER_MAX (100u << 20) /* as the safetensors library refuses larger headers */
#define ST_DIMS_MAX 16

struct st_tensor {
	char *name;
	const char *dtype;      /* safetensors' name: "BF16", "F32", ... */
	const char *torch;      /* PyTorch's: "bfloat16", "float32", ... */
	unsigned itemsize;
	unsigned ndim;
	uint64_t shape[ST_DIMS_MAX];
	uint64_t begin, end;    /* in the data, after the header */
};

struct st_file {
	char *path;
	uint64_t data_start;    /* 8 + header length */
	uint64_t data_len;
	struct st_tensor *t;
	size_t n;
};

/* Read and check path's header (the data is not read). */
int st_open(const char *path, struct st_file *f, char *err, size_t errlen);
/* The same from a header already in memory, for a file of file_size bytes (the fuzzer). */
int st_parse(const char *path, const char *json, size_t len, uint64_t file_size, struct st_file *f, char *err,
	     size_t errlen);
void st_free(struct st_file *f);

/* The shard files of an index, each once, as paths in the index's folder. */
int st_index(const char *index_path, char ***files, size_t *n, char *err, size_t errlen);

/* A dtype by its safetensors name, or by its PyTorch name; NULL if unknown. */
const char *st_torch_name(const char *dtype, unsigned *itemsize);
const char *st_dtype_of_torch(const char *torch, unsigned *itemsize);

#endif
