/*
** io.c: file I/O requests, from the public calls to their completion.
**
** A call builds a request (arguments copied, buffer references taken),
** begins a park of the calling task, hands the request to a backend and
** waits on the park:
**
**   backend      where the system call runs      who completes the park
**   io-uring.c   the kernel, via s's own ring    s's pass, reaping the CQE
**   io-pool.c    a thread of the runtime's pool  that pool thread (through
**                                                s's completion list)
**
** Exactly one of "completed" and "abandoned" decides a request: the
** completer stores the result and then moves the state from INFLIGHT to
** DONE; a caller whose wait ended otherwise (timeout, cancel) moves it from
** INFLIGHT to ABANDONED. Whoever loses the CAS knows the other side's
** decision: a caller that finds DONE takes the real result; a completer
** that finds ABANDONED releases what the result holds (closes an opened
** fd, frees a directory list). The park's own protocol (park.c) settles
** which of unpark, timeout and cancel ends the wait; the two layers never
** disagree because the caller looks at the request's state only after its
** wait has ended.
**
** Memory: see the reference rules on ums__io_req_t (internal.h).
*/
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* ---------------------------------------------------------------------- */
/* Requests                                                                */
/* ---------------------------------------------------------------------- */

/* A new request holding the caller's reference only; submission adds the
** operation's. */
static ums__io_req_t *req_new(int op) {
  ums__io_req_t *r = malloc(sizeof *r);
  if (!r) return NULL;
  /* The inline arrays are the bulk of the struct; zero only the head. */
  memset(r, 0, offsetof(ums__io_req_t, iov_inline));
  r->op = op;
  r->fd = -1;
  atomic_store_explicit(&r->refs, 1, memory_order_relaxed);
  atomic_store_explicit(&r->state, UMS__IO_INFLIGHT, memory_order_relaxed);
  return r;
}

static void req_free(ums__io_req_t *r) {
  for (int i = 0; i < r->iovcnt; i++) ums_buf_release(r->bufs[i]);
  if (r->bufs != r->bufs_inline) free(r->bufs);
  if (r->iov != r->iov_inline) free(r->iov);
  if (r->path && (r->path < r->path_inline ||
                  r->path >= r->path_inline + UMS__IO_INLINE_PATH))
    free(r->path);
  if (r->path2 && (r->path2 < r->path_inline ||
                   r->path2 >= r->path_inline + UMS__IO_INLINE_PATH))
    free(r->path2);
  free(r->stx);
  if (r->list) ums_dirlist_free(r->list);
  free(r);
}

void ums__io_req_unref(ums__io_req_t *r) {
  if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1)
    req_free(r);
}

/* Copies one or two paths into the request, inline when they fit. */
static int req_paths(ums__io_req_t *r, const char *a, const char *b) {
  size_t la = strlen(a) + 1, lb = b ? strlen(b) + 1 : 0;
  if (la + lb <= UMS__IO_INLINE_PATH) {
    r->path = memcpy(r->path_inline, a, la);
    if (b) r->path2 = memcpy(r->path_inline + la, b, lb);
    return 0;
  }
  if (!(r->path = malloc(la))) return UMS_ENOMEM;
  memcpy(r->path, a, la);
  if (b) {
    if (!(r->path2 = malloc(lb))) return UMS_ENOMEM;
    memcpy(r->path2, b, lb);
  }
  return 0;
}

/* Takes buffer references and builds the iovec array. */
static int req_iov(ums__io_req_t *r, const ums_iov_t *iov, int n) {
  if (n <= 0 || n > UMS_FS_IOV_MAX || !iov) return UMS_EINVAL;
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    const ums_iov_t *v = &iov[i];
    if (!v->buf || v->pos > v->buf->size || v->len > v->buf->size - v->pos)
      return UMS_EINVAL;
    /* Like readv(2): the total must fit in a signed size. */
    if (v->len > UMS_FS_MAX_RW - total) return UMS_EINVAL;
    total += v->len;
  }
  if (n > UMS__IO_INLINE_IOV) {
    r->iov = malloc(sizeof *r->iov * (size_t)n);
    r->bufs = malloc(sizeof *r->bufs * (size_t)n);
    if (!r->iov || !r->bufs) {
      free(r->iov);
      free(r->bufs);
      r->iov = NULL;
      r->bufs = NULL;
      return UMS_ENOMEM;
    }
  } else {
    r->iov = r->iov_inline;
    r->bufs = r->bufs_inline;
  }
  for (int i = 0; i < n; i++) {
    r->iov[i].iov_base = (char *)iov[i].buf->data + iov[i].pos;
    r->iov[i].iov_len = iov[i].len;
    ums_buf_retain(iov[i].buf);
    r->bufs[i] = iov[i].buf;
  }
  r->iovcnt = n;
  return 0;
}

/* A request that never started. */
static int req_fail(ums__io_req_t *r, int err) {
  ums__io_req_unref(r);
  return err;
}

/* Releases what a result owns when nobody will take it. */
static void drop_result(ums__io_req_t *r) {
  if (r->op == UMS__IO_OPEN && r->res >= 0) close((int)r->res);
}

void ums__io_complete(ums__io_req_t *r, int64_t res) {
  ums__sched_t *s = r->sched;
  r->res = res;
  int expect = UMS__IO_INFLIGHT;
  if (atomic_compare_exchange_strong(&r->state, &expect, UMS__IO_DONE)) {
    /* The caller is (still) waiting. Copy what the unpark needs: once our
    ** reference is gone the caller may take the result and free r. A
    ** stale token (the caller's wait already ended by its deadline) is
    ** refused by ums_unpark, and the caller then finds DONE. */
    ums_park_token_t token = r->token;
    ums__io_req_unref(r);
    if (s) {
      ums_unpark(s->rt, token, 0);
      /* After the unpark (release): a virtual clock may move once this
      ** count is zero, and must then find the task in the inbox (sched.c,
      ** work_in_flight). s outlives this: the pool is destroyed first. */
      atomic_fetch_sub_explicit(&s->io_pending, 1, memory_order_release);
    }
    return;
  }
  drop_result(r);
  if (s) atomic_fetch_sub_explicit(&s->io_pending, 1, memory_order_relaxed);
  ums__io_req_unref(r);
}

/* ---------------------------------------------------------------------- */
/* Running a request                                                       */
/* ---------------------------------------------------------------------- */

static bool use_ring(ums__sched_t *s, int op) {
  return s->ring && ums__ring_supports(s->ring, op);
}

/* Runs r for the caller and returns its result. The caller's reference
** stays with the caller, who copies results out of r and then drops it. */
static int64_t run(ums__io_req_t *r, int64_t deadline) {
  ums__task_t *t = ums__task_current();
  if (!t) {
    /* A host thread: the system call right here. */
    r->res = ums__io_exec(r);
    return r->res;
  }
  ums__sched_t *s = t->sched;
  /* Fails with UMS_ECANCELED for a cancelled task, UMS_EBUSY inside a
  ** park the task has begun itself. */
  int rc = ums_park_begin(deadline, &r->token);
  if (rc) return rc;
  r->sched = s;
  atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->io_pending, 1, memory_order_relaxed);
  UMS__COUNT(s, io_requests);
  if (use_ring(s, r->op)) {
    r->on_ring = true;
    ums__ring_submit(s, r);
  } else {
    ums__io_pool_submit(s->rt, r);
  }
  rc = ums_park_wait();

  int expect = UMS__IO_INFLIGHT;
  if (atomic_compare_exchange_strong(&r->state, &expect,
                                     UMS__IO_ABANDONED)) {
    /* Timed out or cancelled while the operation runs on: it finishes
    ** without us, and its completion releases what it produced. */
    if (r->on_ring)
      ums__ring_cancel(s, r);
    else
      ums__pool_interrupt(&s->rt->io_pool, &r->work);
    return rc;
  }
  return r->res;
}

/* ---------------------------------------------------------------------- */
/* The public calls                                                        */
/* ---------------------------------------------------------------------- */

static int64_t simple(ums__io_req_t *r, int64_t deadline) {
  int64_t res = run(r, deadline);
  ums__io_req_unref(r);
  return res;
}

int ums_fs_open(const char *path, int flags, int mode, int64_t deadline) {
  if (!path) return UMS_EINVAL;
  ums__io_req_t *r = req_new(UMS__IO_OPEN);
  if (!r) return UMS_ENOMEM;
  int rc = req_paths(r, path, NULL);
  if (rc) return req_fail(r, rc);
  r->flags = flags | O_CLOEXEC;
  r->mode = mode;
  return (int)simple(r, deadline);
}

int ums_fs_close(int fd, int64_t deadline) {
  if (fd < 0) return UMS_EBADF;
  /* A cancelled task may not wait, but the close it asks for must still
  ** happen (ums.h: the descriptor is closed all the same); close(2) does
  ** not block for long, so it runs right here. */
  if (ums__task_current() && ums_cancelled()) {
    close(fd);
    return UMS_ECANCELED;
  }
  ums__io_req_t *r = req_new(UMS__IO_CLOSE);
  if (!r) return UMS_ENOMEM;
  r->fd = fd;
  return (int)simple(r, deadline);
}

static int check_offset(int64_t offset) {
  return offset < 0 && offset != UMS_FS_CUR ? UMS_EINVAL : 0;
}

static int64_t rw(int op, int fd, const ums_iov_t *iov, int n, int64_t offset,
                  int64_t deadline) {
  if (fd < 0) return UMS_EBADF;
  if (check_offset(offset)) return UMS_EINVAL;
  ums__io_req_t *r = req_new(op);
  if (!r) return UMS_ENOMEM;
  int rc = req_iov(r, iov, n);
  if (rc) return req_fail(r, rc);
  r->fd = fd;
  r->off = offset;
  return simple(r, deadline);
}

int64_t ums_fs_read(int fd, ums_buf_t *buf, size_t pos, size_t len,
                    int64_t offset, int64_t deadline) {
  if (len > UMS_FS_MAX_RW) len = UMS_FS_MAX_RW;
  ums_iov_t v = {buf, pos, len};
  return rw(UMS__IO_READ, fd, &v, 1, offset, deadline);
}

int64_t ums_fs_write(int fd, ums_buf_t *buf, size_t pos, size_t len,
                     int64_t offset, int64_t deadline) {
  if (len > UMS_FS_MAX_RW) len = UMS_FS_MAX_RW;
  ums_iov_t v = {buf, pos, len};
  return rw(UMS__IO_WRITE, fd, &v, 1, offset, deadline);
}

int64_t ums_fs_readv(int fd, const ums_iov_t *iov, int iovcnt, int64_t offset,
                     int64_t deadline) {
  return rw(UMS__IO_READV, fd, iov, iovcnt, offset, deadline);
}

int64_t ums_fs_writev(int fd, const ums_iov_t *iov, int iovcnt,
                      int64_t offset, int64_t deadline) {
  return rw(UMS__IO_WRITEV, fd, iov, iovcnt, offset, deadline);
}

int ums_fs_fsync(int fd, int flags, int64_t deadline) {
  if (flags & ~UMS_FS_DATASYNC) return UMS_EINVAL;
  if (fd < 0) return UMS_EBADF;
  ums__io_req_t *r = req_new(UMS__IO_FSYNC);
  if (!r) return UMS_ENOMEM;
  r->fd = fd;
  r->flags = flags;
  return (int)simple(r, deadline);
}

/* Converts the statx result the completer left in r->stx. */
static void stat_out(const struct statx *x, ums_stat_t *out) {
#define TS(t) ((int64_t)(t).tv_sec * UMS_NSEC_PER_SEC + (t).tv_nsec)
  memset(out, 0, sizeof *out);
  out->dev = makedev(x->stx_dev_major, x->stx_dev_minor);
  out->ino = x->stx_ino;
  out->mode = x->stx_mode;
  out->nlink = x->stx_nlink;
  out->uid = x->stx_uid;
  out->gid = x->stx_gid;
  out->rdev = makedev(x->stx_rdev_major, x->stx_rdev_minor);
  out->size = x->stx_size;
  out->blocks = x->stx_blocks;
  out->blksize = x->stx_blksize;
  out->atime = TS(x->stx_atime);
  out->mtime = TS(x->stx_mtime);
  out->ctime = TS(x->stx_ctime);
  out->btime = (x->stx_mask & STATX_BTIME) ? TS(x->stx_btime) : 0;
#undef TS
}

static int do_stat(int fd, const char *path, int flags, ums_stat_t *out,
                   int64_t deadline) {
  if (!out) return UMS_EINVAL;
  ums__io_req_t *r = req_new(UMS__IO_STATX);
  if (!r) return UMS_ENOMEM;
  int rc = req_paths(r, path ? path : "", NULL);
  if (!rc && !(r->stx = calloc(1, sizeof(struct statx)))) rc = UMS_ENOMEM;
  if (rc) return req_fail(r, rc);
  r->fd = fd;
  r->flags = flags;
  int64_t res = run(r, deadline);
  if (res == 0) stat_out(r->stx, out);
  ums__io_req_unref(r);
  return (int)res;
}

int ums_fs_stat(const char *path, int flags, ums_stat_t *out,
                int64_t deadline) {
  if (!path || (flags & ~UMS_FS_NOFOLLOW)) return UMS_EINVAL;
  return do_stat(AT_FDCWD, path,
                 (flags & UMS_FS_NOFOLLOW) ? AT_SYMLINK_NOFOLLOW : 0, out,
                 deadline);
}

int ums_fs_fstat(int fd, ums_stat_t *out, int64_t deadline) {
  if (fd < 0) return UMS_EBADF;
  return do_stat(fd, NULL, AT_EMPTY_PATH, out, deadline);
}

static int path_op(int op, const char *a, const char *b, int mode,
                   int64_t deadline) {
  if (!a || (op == UMS__IO_RENAME && !b)) return UMS_EINVAL;
  ums__io_req_t *r = req_new(op);
  if (!r) return UMS_ENOMEM;
  int rc = req_paths(r, a, b);
  if (rc) return req_fail(r, rc);
  r->mode = mode;
  return (int)simple(r, deadline);
}

int ums_fs_unlink(const char *path, int64_t deadline) {
  return path_op(UMS__IO_UNLINK, path, NULL, 0, deadline);
}

int ums_fs_rmdir(const char *path, int64_t deadline) {
  /* unlinkat(AT_REMOVEDIR): the same operation with a flag. */
  if (!path) return UMS_EINVAL;
  ums__io_req_t *r = req_new(UMS__IO_UNLINK);
  if (!r) return UMS_ENOMEM;
  int rc = req_paths(r, path, NULL);
  if (rc) return req_fail(r, rc);
  r->flags = AT_REMOVEDIR;
  return (int)simple(r, deadline);
}

int ums_fs_rename(const char *from, const char *to, int64_t deadline) {
  return path_op(UMS__IO_RENAME, from, to, 0, deadline);
}

int ums_fs_mkdir(const char *path, int mode, int64_t deadline) {
  return path_op(UMS__IO_MKDIR, path, NULL, mode, deadline);
}

int ums_fs_readdir(const char *path, ums_dirlist_t **out, int64_t deadline) {
  if (!path || !out) return UMS_EINVAL;
  ums__io_req_t *r = req_new(UMS__IO_READDIR);
  if (!r) return UMS_ENOMEM;
  int rc = req_paths(r, path, NULL);
  if (rc) return req_fail(r, rc);
  int64_t res = run(r, deadline);
  if (res == 0) {
    *out = r->list;
    r->list = NULL;
  }
  ums__io_req_unref(r);
  return (int)res;
}

void ums_dirlist_free(ums_dirlist_t *list) { free(list); }
