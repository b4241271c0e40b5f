/*
** io-pool.c: the thread-pool I/O backend. A request runs as the plain
** system call on a thread of the runtime's I/O pool (pool.c), which then
** completes it; ums__io_complete hands the task back through its
** scheduler's completion list. The same executor serves calls made
** outside any task, on the caller's own thread, and operations io_uring
** does not have (listing a directory).
**
** EINTR: a call interrupted by some signal is restarted, unless the pool
** interrupted it on purpose because its caller gave up (then the result is
** the EINTR, which nobody reads).
*/
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool interrupted(ums__io_req_t *r) {
  return ums__pool_interrupted(&r->work);
}

#define RETRY(r, expr)                                             \
  __extension__({                                                  \
    int64_t rv_;                                                   \
    do rv_ = (int64_t)(expr);                                      \
    while (rv_ < 0 && errno == EINTR && !interrupted(r));          \
    rv_ < 0 ? (int64_t)-errno : rv_;                               \
  })

static int64_t rw_exec(ums__io_req_t *r) {
  bool cur = r->off == UMS_FS_CUR;
  const struct iovec *v = r->iov;
  switch (r->op) {
    case UMS__IO_READ:
      return cur ? RETRY(r, read(r->fd, v->iov_base, v->iov_len))
                 : RETRY(r, pread(r->fd, v->iov_base, v->iov_len, r->off));
    case UMS__IO_WRITE:
      return cur ? RETRY(r, write(r->fd, v->iov_base, v->iov_len))
                 : RETRY(r, pwrite(r->fd, v->iov_base, v->iov_len, r->off));
    case UMS__IO_READV:
      return cur ? RETRY(r, readv(r->fd, v, r->iovcnt))
                 : RETRY(r, preadv(r->fd, v, r->iovcnt, r->off));
    default: /* UMS__IO_WRITEV */
      return cur ? RETRY(r, writev(r->fd, v, r->iovcnt))
                 : RETRY(r, pwritev(r->fd, v, r->iovcnt, r->off));
  }
}

/* The whole listing in one allocation: the list, then the entries, then
** the names. Built in two growing arrays and packed at the end. */
static int64_t readdir_exec(ums__io_req_t *r) {
  DIR *d;
  do d = opendir(r->path);
  while (!d && errno == EINTR && !interrupted(r));
  if (!d) return -errno;
  ums_dirent_t *ents = NULL;
  char *names = NULL;
  size_t n = 0, cap = 0, nbytes = 0, ncap = 0;
  int64_t err = 0;
  for (;;) {
    errno = 0;
    struct dirent *e = readdir(d);
    if (!e) {
      err = errno ? -errno : 0;
      break;
    }
    if (e->d_name[0] == '.' &&
        (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
      continue;
    size_t len = strlen(e->d_name) + 1;
    if (n == cap) {
      cap = cap ? cap * 2 : 32;
      ums_dirent_t *p = realloc(ents, cap * sizeof *ents);
      if (!p) { err = UMS_ENOMEM; break; }
      ents = p;
    }
    if (nbytes + len > ncap) {
      ncap = (ncap ? ncap * 2 : 1024) + len;
      char *p = realloc(names, ncap);
      if (!p) { err = UMS_ENOMEM; break; }
      names = p;
    }
    memcpy(names + nbytes, e->d_name, len);
    /* Offsets for now; pointers once the block's address is known. */
    ents[n].name = (const char *)(uintptr_t)nbytes;
    ents[n].type = e->d_type;
    ents[n].ino = e->d_ino;
    n++;
    nbytes += len;
  }
  closedir(d);
  if (!err) {
    size_t head = sizeof(ums_dirlist_t), body = n * sizeof(ums_dirent_t);
    ums_dirlist_t *list = malloc(head + body + nbytes);
    if (!list) {
      err = UMS_ENOMEM;
    } else {
      list->count = n;
      list->entries = (ums_dirent_t *)((char *)list + head);
      char *base = (char *)list->entries + body;
      if (nbytes) memcpy(base, names, nbytes);
      for (size_t i = 0; i < n; i++) {
        list->entries[i] = ents[i];
        list->entries[i].name = base + (uintptr_t)ents[i].name;
      }
      r->list = list;
    }
  }
  free(ents);
  free(names);
  return err;
}

/* A whole file into the request's buffer (ums.h, ums_fs_readfile): reads
** at offsets until the buffer is full, a read returns 0 or a short read
** ends at the file's size; a full buffer is checked with one byte more. Anything but a regular file (or a
** directory, whose read fails) is left open for the caller, nothing read
** from it, as io-uring.c does. */
static int64_t readfile_exec(ums__io_req_t *r) {
  int fd = (int)RETRY(r, openat(AT_FDCWD, r->path, r->flags));
  if (fd < 0) return fd;
  int64_t what = ums__io_readfile_kind(r, fd);
  if (what) return what;
  char *p = r->iov[0].iov_base;
  size_t cap = r->iov[0].iov_len, got = 0;
  int64_t res;
  for (;;) {
    int64_t n = got < cap ? RETRY(r, pread(fd, p + got, cap - got,
                                           (off_t)got))
                          : RETRY(r, pread(fd, r->scratch, 1, (off_t)got));
    if (n < 0) {
      res = n;
      break;
    }
    if (n == 0) {
      res = (int64_t)got;
      break;
    }
    if (got == cap) {
      res = UMS_EFBIG;
      break;
    }
    got += (size_t)n;
    /* A read short of the buffer that ends at the size the fstat gave:
    ** the end (a regular file's read is short only there), found
    ** without one more read. A size of 0 says nothing (procfs). */
    if (r->chain_size > 0 && got == (size_t)r->chain_size && got < cap) {
      res = (int64_t)got;
      break;
    }
  }
  if (close(fd) != 0 && res >= 0) res = -errno;
  return res;
}

int64_t ums__io_exec(ums__io_req_t *r) {
  switch (r->op) {
    case UMS__IO_OPEN:
      return RETRY(r, openat(AT_FDCWD, r->path, r->flags, r->mode));
    case UMS__IO_CLOSE:
      /* Never retried: after EINTR the descriptor is gone on Linux. */
      return close(r->fd) == 0 ? 0 : -errno;
    case UMS__IO_READ:
    case UMS__IO_WRITE:
    case UMS__IO_READV:
    case UMS__IO_WRITEV:
      return rw_exec(r);
    case UMS__IO_FSYNC:
      return (r->flags & UMS_FS_DATASYNC) ? RETRY(r, fdatasync(r->fd))
                                          : RETRY(r, fsync(r->fd));
    case UMS__IO_STATX:
      return RETRY(r, statx(r->fd, r->path, r->flags,
                            STATX_BASIC_STATS | STATX_BTIME, r->stx));
    case UMS__IO_UNLINK:
      return RETRY(r, unlinkat(AT_FDCWD, r->path, r->flags));
    case UMS__IO_RENAME:
      return RETRY(r, renameat(AT_FDCWD, r->path, AT_FDCWD, r->path2));
    case UMS__IO_MKDIR:
      return RETRY(r, mkdirat(AT_FDCWD, r->path, (mode_t)r->mode));
    case UMS__IO_READDIR:
      return readdir_exec(r);
    case UMS__IO_READFILE:
      return readfile_exec(r);
    case UMS__IO_ACCEPT: case UMS__IO_CONNECT: case UMS__IO_RECV:
    case UMS__IO_SEND: case UMS__IO_RECVMSG: case UMS__IO_SENDMSG:
    case UMS__IO_POLL:
      return ums__net_exec(r);
    default:
      return UMS_EINVAL;
  }
}

static void pool_run(ums__pool_work_t *w) {
  ums__io_req_t *r = UMS__CONTAINER_OF(w, ums__io_req_t, work);
  /* r may be gone once completed; its scheduler outlives the pool. */
  ums__sched_t *s = r->sched;
  /* Given up while still queued: not starting at all is the best end
  ** (a cancelled write writes nothing). */
  if (interrupted(r))
    ums__io_complete(r, UMS_ECANCELED);
  else
    ums__io_complete(r, ums__io_exec(r));
  /* After the completion's unpark, so that the scheduler's idle spin
  ** (sched.c) keeps watching until the task is on its completion list. */
  if (s) ums__sched_inflight_done(s, &s->io_pool_pending);
}

/* The system call an operation makes, for reports. */
static const char *op_name(int op) {
  static const char *const names[UMS__IO_NOPS] = {
      [UMS__IO_OPEN] = "open",       [UMS__IO_CLOSE] = "close",
      [UMS__IO_READ] = "read",       [UMS__IO_WRITE] = "write",
      [UMS__IO_READV] = "readv",     [UMS__IO_WRITEV] = "writev",
      [UMS__IO_FSYNC] = "fsync",     [UMS__IO_STATX] = "statx",
      [UMS__IO_UNLINK] = "unlink",   [UMS__IO_RENAME] = "rename",
      [UMS__IO_MKDIR] = "mkdir",     [UMS__IO_READDIR] = "readdir",
      [UMS__IO_READFILE] = "readfile", [UMS__IO_ACCEPT] = "accept",
      [UMS__IO_CONNECT] = "connect", [UMS__IO_RECV] = "recv",
      [UMS__IO_SEND] = "send",       [UMS__IO_RECVMSG] = "recvmsg",
      [UMS__IO_SENDMSG] = "sendmsg", [UMS__IO_POLL] = "poll"};
  return op >= 0 && op < UMS__IO_NOPS ? names[op] : NULL;
}

void ums__io_pool_submit(ums_runtime_t *rt, ums__io_req_t *r) {
  r->work.run = pool_run;
  /* For the pool's exhaustion report. */
  ums__task_t *t = ums__task_current();
  r->work.task = t ? atomic_load_explicit(&t->id, memory_order_relaxed) : 0;
  r->work.what = op_name(r->op);
  if (r->sched)
    atomic_fetch_add_explicit(&r->sched->io_pool_pending, 1,
                              memory_order_relaxed);
  if (ums__pool_submit(&rt->io_pool, &r->work) != 0)
    /* No pool thread at all and none can start: run it here, blocking
    ** this scheduler for its length, rather than fail a request that
    ** the system call itself could serve. */
    pool_run(&r->work);
}
