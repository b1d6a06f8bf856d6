/* ops_xattr: the attributes of allocations (tag), entries (alloc, offset, size,
 * private) and a store's directory (quota, priority: tier.c).  Unknown user. names answer ENODATA, never ENOSYS: the kernel would stop
 * asking.  Names of the namespaces gmsfs keeps nothing in (security., system., trusted.)
 * answer ENOTSUP, as a kernel filesystem without their handlers does: ls -l then asks once
 * per mount for a file's SELinux label and ACL, not twice per file. */
#include "ops.h"
#include "content.h"
#include "named.h"
#include "lock.h"
#include "caller.h"
#include "store.h"
#include "tier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

enum xattr { X_NONE, X_TAG, X_ALLOC, X_OFFSET, X_SIZE, X_PRIVATE, X_NOTE };

static enum xattr xattr_of(const struct meta_node *m, const char *name)
{
	if (m->kind == META_ALLOC)
		return !strcmp(name, GMSFS_XATTR_TAG) ? X_TAG : X_NONE;
	if (m->kind != META_ENTRY)
		return X_NONE;
	if (!strcmp(name, GMSFS_XATTR_ALLOC))
		return X_ALLOC;
	if (!strcmp(name, GMSFS_XATTR_OFFSET))
		return X_OFFSET;
	if (!strcmp(name, GMSFS_XATTR_SIZE))
		return X_SIZE;
	if (!strcmp(name, GMSFS_XATTR_PRIVATE))
		return X_PRIVATE;
	return !strcmp(name, GMSFS_XATTR_NOTE) ? X_NOTE : X_NONE;
}

/* The value's length (written into buf when it fits), or -ENODATA when it has none, as
 * o's view shows it (a caller outside a writer session sees the last commit's). */
static int xattr_value(const struct obj *o, enum xattr x, char *buf, size_t size)
{
	struct meta_fields f;
	if (o->committed)
		meta_committed_fields(o->m, &f);
	else
		meta_live_fields(o->m, &f);
	switch (x) {
	case X_TAG:
		return snprintf(buf, size, "%s", f.str ? f.str : "");
	case X_ALLOC:
		return f.str ? snprintf(buf, size, "%s", f.str) : -ENODATA;
	case X_OFFSET:
		return snprintf(buf, size, "%llu", (unsigned long long)f.offset);
	case X_SIZE:
		return f.extent ? snprintf(buf, size, "%llu", (unsigned long long)f.extent) : -ENODATA;
	case X_PRIVATE:
		return f.flags & GMSFS_ENTRY_PRIVATE ? snprintf(buf, size, "1") : -ENODATA;
	case X_NOTE:
		return f.flags & GMSFS_ENTRY_NOTE ? snprintf(buf, size, "1") : -ENODATA;
	default:
		return -ENODATA;
	}
}

static bool user_name(const char *name)
{
	return !strncmp(name, "user.", 5);
}

static bool store_dir(const struct obj *o)
{
	return o->f && o->f->kind == FS_STORE;
}

/* A store's quota and priority: set by whoever may write the store (its lock file's
 * mode), read by all. */
static int may_set_store(fuse_req_t req, struct store *st)
{
	struct stat lock_attr;
	node_attr(st->fs, &(struct obj){ .f = &st->files[FS_LOCK - FS_LOCK], .st = st }, &lock_attr);
	return caller_may(req, lock_attr.st_mode, 2);
}

static int do_getxattr(fuse_req_t req, struct fs *fs, fuse_ino_t ino, const char *name, char *val, size_t size)
{
	struct obj o = {0};
	if (!user_name(name))
		return node_resolve(fs, ino, &o) ?: -ENOTSUP;
	int e = ops_resolve(req, fs, ino, &o);
	if (e)
		return e;
	if (store_dir(&o) && !strcmp(name, GMSFS_XATTR_VERSIONS))
		return snprintf(val, size, "%u", o.st->versions.allowed);
	if (store_dir(&o) && !strcmp(name, GMSFS_XATTR_CONTENT))
		return content_xattr_get(o.st, val, size);
	if (store_dir(&o) && !strcmp(name, GMSFS_XATTR_VERSION))
		return named_xattr_get(o.st, val, size);
	if (store_dir(&o))
		return tier_xattr_get(o.st, name, val, size);
	return o.m ? xattr_value(&o, xattr_of(o.m, name), val, size) : -ENODATA;
}

/* getxattr's and listxattr's reply: n bytes of buf (-errno: the error), the size alone
 * when the caller asked it (size 0), ERANGE when its buffer is short. */
static void reply_xattr(fuse_req_t req, const char *buf, int n, size_t size)
{
	if (n < 0)
		return (void)fuse_reply_err(req, -n);
	if (!size)
		return (void)fuse_reply_xattr(req, (size_t)n);
	if ((size_t)n > size)
		return (void)fuse_reply_err(req, ERANGE);
	fuse_reply_buf(req, buf, (size_t)n);
}

void fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct fs *fs = fs_of(req);
	char val[GMSFS_PATH_MAX + 2];
	pthread_mutex_lock(&fs->mu);
	int n = do_getxattr(req, fs, ino, name, val, sizeof val);
	pthread_mutex_unlock(&fs->mu);
	reply_xattr(req, val, n, size);
}

static int do_listxattr(fuse_req_t req, struct fs *fs, fuse_ino_t ino, char *list, size_t size)
{
	static const char *const names[] = { [X_TAG] = GMSFS_XATTR_TAG, [X_ALLOC] = GMSFS_XATTR_ALLOC,
					     [X_OFFSET] = GMSFS_XATTR_OFFSET, [X_SIZE] = GMSFS_XATTR_SIZE,
					     [X_PRIVATE] = GMSFS_XATTR_PRIVATE, [X_NOTE] = GMSFS_XATTR_NOTE };
	struct obj o = {0};
	int e = ops_resolve(req, fs, ino, &o);
	size_t n = 0;
	char tmp[64];
	if (!e && store_dir(&o)) {
		static const char *const store_names[] = { GMSFS_XATTR_QUOTA, GMSFS_XATTR_PRIORITY, GMSFS_XATTR_MIN,
							   GMSFS_XATTR_RESERVED, GMSFS_XATTR_VERSIONS, GMSFS_XATTR_CONTENT,
							   GMSFS_XATTR_VERSION };
		for (size_t i = 0; i < sizeof store_names / sizeof *store_names; i++) {
			size_t l = strlen(store_names[i]) + 1;
			const char *sn = store_names[i];
			int got = !strcmp(sn, GMSFS_XATTR_CONTENT)   ? content_xattr_get(o.st, tmp, sizeof tmp)
				  : !strcmp(sn, GMSFS_XATTR_VERSION)  ? named_xattr_get(o.st, tmp, sizeof tmp)
				  : !strcmp(sn, GMSFS_XATTR_VERSIONS) ? 0
								      : tier_xattr_get(o.st, sn, tmp, sizeof tmp);
			if (got < 0)
				continue;
			if (n + l <= size)
				memcpy(list + n, store_names[i], l);
			n += l;
		}
		return (int)n;
	}
	if (e || !o.m)
		return e;
	for (enum xattr x = X_TAG; x <= X_NOTE; x++) {
		if (xattr_of(o.m, names[x]) != x || xattr_value(&o, x, tmp, sizeof tmp) < 0)
			continue;
		size_t l = strlen(names[x]) + 1;
		if (n + l <= size)
			memcpy(list + n, names[x], l);
		n += l;
	}
	return (int)n;
}

void fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct fs *fs = fs_of(req);
	char list[320];
	pthread_mutex_lock(&fs->mu);
	int n = do_listxattr(req, fs, ino, list, sizeof list);
	pthread_mutex_unlock(&fs->mu);
	reply_xattr(req, list, n, size);
}

static int set_value(struct meta_node *m, enum xattr x, const char *value, size_t size)
{
	switch (x) {
	case X_TAG:
		return meta_set_tag(m, value, size);
	case X_ALLOC:
		return meta_entry_set_alloc(m, value, size);
	case X_OFFSET:
		return meta_entry_set_offset(m, value, size);
	case X_SIZE:
		return meta_entry_set_extent(m, value, size);
	case X_PRIVATE:
		return meta_entry_set_flag(m, GMSFS_ENTRY_PRIVATE, value, size);
	default:
		return meta_entry_set_flag(m, GMSFS_ENTRY_NOTE, value, size);
	}
}

/* user.gms.versions: "1" or "2"; not changed while a session beside readers runs or
 * readers are on the version before (either would lose its meaning). */
static int set_versions(struct store *st, const char *value, size_t size)
{
	unsigned n = size == 1 && (value[0] == '1' || value[0] == '2') ? (unsigned)(value[0] - '0') : 0;
	if (!n) {
		store_error(st, "%s: %.*s: 1 or 2", GMSFS_XATTR_VERSIONS, (int)(size < 32 ? size : 32), value);
		return -EINVAL;
	}
	if (n == st->versions.allowed)
		return 0;
	if (store_lock(st)->fsm.beside || store_lock(st)->fsm.prev_held) {
		store_error(st, "%s: a session beside the readers runs, or readers are on the version before: "
				"set it once they have flipped", GMSFS_XATTR_VERSIONS);
		return -EBUSY;
	}
	if (st->fs->handing_over)
		return -EAGAIN;
	st->versions.allowed = n;
	store_notify(st);
	store_changed(st, "xattr"); /* a failure says why in last_error; the next image has it */
	return 0;
}

/* user.gms.version: the name a member of the writer session gives the commit it will
 * make (gmsfs(5), NAMED VERSIONS); anyone else is refused, as a write of STORE/commit is. */
static int name_commit(fuse_req_t req, struct store *st, const char *value, size_t size, bool drop)
{
	pid_t tgid;
	int e = caller_tgid(req, &tgid);
	if (e || (e = lock_is_member(st, tgid)) < 0)
		return e;
	if (!e) {
		store_error(st, "%s: only a member of the writer session names the commit it makes", GMSFS_XATTR_VERSION);
		return -EPERM;
	}
	if (drop)
		named_drop_pending(st);
	return drop ? 0 : named_set_pending(st, value, size);
}

static int do_setxattr(fuse_req_t req, struct fs *fs, fuse_ino_t ino, const char *name, const char *value,
		       size_t size, int flags)
{
	struct obj o = {0};
	int e = node_resolve(fs, ino, &o);
	if (e)
		return e;
	if (store_dir(&o) && !strcmp(name, GMSFS_XATTR_VERSIONS)) {
		if (flags & XATTR_CREATE)
			return -EEXIST; /* it always exists: 1 unless set */
		return may_set_store(req, o.st) ?: set_versions(o.st, value, size);
	}
	if (store_dir(&o) && !strcmp(name, GMSFS_XATTR_CONTENT)) {
		/* The hash of the committed bytes, as a client that may write the store computed
		 * it (gmsfs(5), CONTENT HASH): whoever could change the bytes may say what they are. */
		if (flags & (XATTR_CREATE | XATTR_REPLACE))
			return -EINVAL;
		if (!(e = may_set_store(req, o.st) ?: content_xattr_set(o.st, value, size))) {
			store_notify(o.st);
			store_changed(o.st, "xattr");
		}
		return e;
	}
	if (store_dir(&o) && !strcmp(name, GMSFS_XATTR_VERSION))
		return flags & (XATTR_CREATE | XATTR_REPLACE) ? -EINVAL : name_commit(req, o.st, value, size, false);
	if (store_dir(&o) && tier_xattr_known(name)) {
		char tmp[32];
		bool exists = tier_xattr_get(o.st, name, tmp, sizeof tmp) >= 0;
		if ((flags & XATTR_CREATE) && exists)
			return -EEXIST;
		if ((flags & XATTR_REPLACE) && !exists)
			return -ENODATA;
		if (!(e = may_set_store(req, o.st) ?: tier_xattr_set(o.st, name, value, size)))
			store_changed(o.st, "xattr");
		return e;
	}
	enum xattr x = o.m ? xattr_of(o.m, name) : X_NONE;
	if (x == X_NONE)
		return -ENOTSUP;
	if (!o.m->linked)
		return -ESTALE;
	if ((e = lock_check_change(req, o.st, NULL)))
		return e;
	char tmp[2];
	bool exists = xattr_value(&o, x, tmp, sizeof tmp) >= 0;
	if ((flags & XATTR_CREATE) && exists)
		return -EEXIST;
	if ((flags & XATTR_REPLACE) && !exists)
		return -ENODATA;
	if (!(e = set_value(o.m, x, value, size)))
		store_notify(o.st);
	return e;
}

void fs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	int e = do_setxattr(req, fs, ino, name, value, size, flags);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, -e);
}

/* Back to the defaults: tag "default", no allocation, offset 0, no size, not private. */
static int do_removexattr(fuse_req_t req, struct fs *fs, fuse_ino_t ino, const char *name)
{
	struct obj o = {0};
	int e = node_resolve(fs, ino, &o);
	if (e)
		return e;
	if (store_dir(&o) && !strcmp(name, GMSFS_XATTR_VERSIONS))
		return may_set_store(req, o.st) ?: set_versions(o.st, "1", 1);
	if (store_dir(&o) && !strcmp(name, GMSFS_XATTR_CONTENT)) {
		if ((e = may_set_store(req, o.st)))
			return e;
		content_forget(o.st);
		store_notify(o.st);
		store_changed(o.st, "xattr");
		return 0;
	}
	if (store_dir(&o) && !strcmp(name, GMSFS_XATTR_VERSION))
		return name_commit(req, o.st, NULL, 0, true);
	if (store_dir(&o) && tier_xattr_known(name)) {
		if (!(e = may_set_store(req, o.st) ?: tier_xattr_remove(o.st, name)))
			store_changed(o.st, "xattr");
		return e;
	}
	char tmp[2];
	enum xattr x = o.m ? xattr_of(o.m, name) : X_NONE;
	if (x == X_NONE || xattr_value(&o, x, tmp, sizeof tmp) < 0)
		return user_name(name) ? -ENODATA : -ENOTSUP;
	if (!o.m->linked)
		return -ESTALE;
	if ((e = lock_check_change(req, o.st, NULL)))
		return e;
	switch (x) {
	case X_TAG:
		e = meta_set_tag(o.m, "default", 7);
		break;
	case X_ALLOC:
		e = meta_entry_unset(o.m, META_ATTR_ALLOC);
		break;
	case X_OFFSET:
		e = meta_entry_unset(o.m, META_ATTR_OFFSET);
		break;
	case X_SIZE:
		e = meta_entry_unset(o.m, META_ATTR_EXTENT);
		break;
	case X_PRIVATE:
		e = meta_entry_unset(o.m, META_ATTR_PRIVATE);
		break;
	default:
		e = meta_entry_unset(o.m, META_ATTR_NOTE);
		break;
	}
	if (!e)
		store_notify(o.st);
	return e;
}

void fs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct fs *fs = fs_of(req);
	pthread_mutex_lock(&fs->mu);
	int e = do_removexattr(req, fs, ino, name);
	pthread_mutex_unlock(&fs->mu);
	fuse_reply_err(req, -e);
}
