/* ops: the FUSE operations, by family (ops_tree.c, ops_file.c, ops_xattr.c,
 * ops_ioctl.c, on what they share: ops_handle.h); ops.c puts them in the table. */
#ifndef GMSFS_FS_OPS_H
#define GMSFS_FS_OPS_H

#include "fs.h"
#include "node.h"
#include "ops_handle.h"

void fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
void fs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets);
void fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi);
void fs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode);
void fs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent, const char *newname,
	       unsigned int flags);
void fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void fs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void fs_statfs(fuse_req_t req, fuse_ino_t ino);

void fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi);
void fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
void fs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off, struct fuse_file_info *fi);
void fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_poll(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct fuse_pollhandle *ph);

void fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void fs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags);
void fs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

void fs_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg, struct fuse_file_info *fi,
	      unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz);

#endif
