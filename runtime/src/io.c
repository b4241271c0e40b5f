/*
** io.c: I/O requests (files; sockets build theirs in net.c), from the
** public calls to their completion.
**
** Every call in a task goes through two halves (ums.h, "deferred form"):
**
**   start    build the request (arguments copied, buffer references
**            taken), begin a park of the calling task, hand the request
**            to a backend;
**   collect  once the park has ended, settle the request's fate and take
**            its result.
**
** The blocking calls (ums_fs_read, ...) are start, ums_park_wait, collect;
** the _begin/_end pairs let a step task end the park by returning
** UMS_STEP_PARK instead, so that no worker is held while the kernel works
** (the Lua binding yields its coroutine there).
**
**   backend      where the system call runs      who completes the park
**   io-uring.c   the kernel, via s's own ring    s's pass, reaping the CQE
**   io-pool.c    a thread of the runtime's pool  that pool thread (through
**                                                s's completion list)
**   io-poll.c    sockets without a ring: s's     s's pass or idle wait
**                thread, when epoll says ready   (net.c has the calls)
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
** wait has ended (collect refuses to run before that).
**
** Memory: see the reference rules on struct ums_fs_req (internal.h).
** Request structs come from a per-scheduler cache (like buffers, buf.c):
** the last reference dropped on a scheduler thread keeps the struct there
** for the next request, so a task's read costs no malloc.
*/
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

_Static_assert(sizeof(struct statx) <=
                   sizeof(((ums__io_req_t *)0)->stx_space),
               "stx_space must hold a struct statx");

/* Request structs a scheduler keeps: enough for a few hundred requests in
** flight, about 100 KiB at most. */
#define REQ_CACHE_MAX 256u

/* ---------------------------------------------------------------------- */
/* Requests                                                                */
/* ---------------------------------------------------------------------- */

/* A new request holding the caller's reference only; submission adds the
** operation's. From this scheduler's cache when it has one. */
ums__io_req_t *ums__io_req_new(int op) {
  ums__sched_t *s = ums__sched_current();
  ums__io_req_t *r = s ? s->reqs.head : NULL;
  if (r) {
    UMS__UNPOISON(r, sizeof *r);
    s->reqs.head = r->cache_next;
    s->reqs.n--;
  } else if (!(r = malloc(sizeof *r))) {
    return NULL;
  }
  /* Zero only the head: the socket address, the message header and the
  ** inline room, the bulk of the struct, are written before they are
  ** read (internal.h). */
  memset(r, 0, offsetof(ums__io_req_t, addr));
  r->op = op;
  r->fd = -1;
  atomic_store_explicit(&r->refs, 1, memory_order_relaxed);
  atomic_store_explicit(&r->state, UMS__IO_INFLIGHT, memory_order_relaxed);
  return r;
}

static bool inline_path(const ums__io_req_t *r, const char *p) {
  return p >= r->path_inline && p < r->path_inline + UMS__IO_INLINE_PATH;
}

static void req_free(ums__io_req_t *r) {
  if (r->iovcnt) {
    for (int i = 0; i < r->iovcnt; i++) ums_buf_release(r->bufs[i]);
    if (r->bufs != r->bufs_inline) free(r->bufs);
    if (r->iov != r->iov_inline) free(r->iov);
  }
  if (r->path && !inline_path(r, r->path)) free(r->path);
  if (r->path2 && !inline_path(r, r->path2)) free(r->path2);
  if (r->list) ums_dirlist_free(r->list);
  /* The last reference may go on a pool thread (an abandoned request), or
  ** after this scheduler emptied its cache at exit (it no longer runs
  ** then): only a scheduler thread keeps the struct. */
  ums__sched_t *s = ums__sched_current();
  if (s && s->reqs.n < REQ_CACHE_MAX) {
    r->cache_next = s->reqs.head;
    s->reqs.head = r;
    s->reqs.n++;
    UMS__POISON(r, sizeof *r);
    return;
  }
  free(r);
}

void ums__io_req_unref(ums__io_req_t *r) {
  if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1)
    req_free(r);
}

void ums__io_req_cache_clear(ums__io_req_cache_t *c) {
  while (c->head) {
    ums__io_req_t *r = c->head;
    UMS__UNPOISON(r, sizeof *r);
    c->head = r->cache_next;
    free(r);
  }
  c->n = 0;
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

/* Whether v is a range of its buffer that keeps the total of a request's
** ranges, total before it, within a signed size (like readv(2)). */
static inline bool iov_ok(const ums_iov_t *v, size_t total) {
  return v->buf && v->pos <= v->buf->size &&
         v->len <= v->buf->size - v->pos && v->len <= UMS_FS_MAX_RW - total;
}

/* Entry i of r's iovec is v, whose buffer r holds a reference to. */
static inline void iov_set(ums__io_req_t *r, int i, const ums_iov_t *v) {
  r->iov[i].iov_base = (char *)v->buf->data + v->pos;
  r->iov[i].iov_len = v->len;
  ums_buf_retain(v->buf);
  r->bufs[i] = v->buf;
}

/* Takes buffer references and builds the iovec array. One range (every
** socket call, most file calls) goes straight to the inline room. */
int ums__io_req_iov(ums__io_req_t *r, const ums_iov_t *iov, int n) {
  if (n <= 0 || n > UMS_FS_IOV_MAX || !iov) return UMS_EINVAL;
  if (n == 1) {
    if (!iov_ok(iov, 0)) return UMS_EINVAL;
    r->iov = r->iov_inline;
    r->bufs = r->bufs_inline;
    iov_set(r, 0, iov);
    r->iovcnt = 1;
    return 0;
  }
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (!iov_ok(&iov[i], total)) return UMS_EINVAL;
    total += iov[i].len;
  }
  if (n <= UMS__IO_INLINE_IOV) {
    r->iov = r->iov_inline;
    r->bufs = r->bufs_inline;
  } else {
    r->iov = malloc(sizeof *r->iov * (size_t)n);
    r->bufs = malloc(sizeof *r->bufs * (size_t)n);
    if (!r->iov || !r->bufs) {
      free(r->iov);
      free(r->bufs);
      r->iov = NULL;
      r->bufs = NULL;
      return UMS_ENOMEM;
    }
  }
  for (int i = 0; i < n; i++) iov_set(r, i, &iov[i]);
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
  if ((r->op == UMS__IO_OPEN || r->op == UMS__IO_ACCEPT) && r->res >= 0)
    close((int)r->res);
  if (r->op == UMS__IO_READFILE && r->res == UMS_ESPIPE && r->fd >= 0)
    close(r->fd);
}

int64_t ums__io_readfile_kind(ums__io_req_t *r, int fd) {
  /* statx rather than fstat: the ring opens and closes this descriptor
  ** where ThreadSanitizer cannot see it, and its fstat interceptor would
  ** leave a record of the number that no close clears, so that another
  ** thread's next descriptor of that number (a pool thread's opendir)
  ** would look like a race at its close. statx is not intercepted. */
  struct statx stx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_SIZE, &stx) != 0) {
    int64_t err = -errno;
    close(fd);
    return err;
  }
  mode_t mode = stx.stx_mode;
  r->chain_size = S_ISREG(mode) ? (int64_t)stx.stx_size : 0;
  if (S_ISREG(mode) || S_ISDIR(mode)) return 0;
  r->fd = fd;
  return UMS_ESPIPE;
}

/* A readfile's result for its caller: a descriptor left open (UMS_ESPIPE)
** goes to *fd, or is closed when the caller does not take it. */
static int64_t readfile_take(ums__io_req_t *r, int64_t res, int *fd) {
  if (res == UMS_ESPIPE && r->fd >= 0) {
    if (fd)
      *fd = r->fd;
    else
      close(r->fd);
    r->fd = -1;
  }
  return res;
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
      ums__sched_inflight_done(s, &s->io_pending);
    }
    return;
  }
  drop_result(r);
  /* Nobody waits for this one, but the scheduler may have gone idle
  ** counting it: the last one wakes it (ums__sched_inflight_done). */
  if (s) ums__sched_inflight_done(s, &s->io_pending);
  ums__io_req_unref(r);
}

/* ---------------------------------------------------------------------- */
/* Starting and collecting                                                 */
/* ---------------------------------------------------------------------- */

/* Whether r is a write at the file position of a file that has one.
** io_uring leaves such a file's position where it was after a short
** write (ENOSPC, EFBIG past RLIMIT_FSIZE), so the caller's next write at
** the position would land on the bytes it has just written, and a short
** count would be all it ever saw. write(2) moves the position by what it
** wrote (and serialises writers on it): these writes go to the pool. A
** stream (pipe, socket, terminal) has no position to lose, and a file
** opened with O_APPEND writes at its end wherever the position is (its
** next write after a short one fails as it should): both stay on the
** ring. lseek(2) and fcntl(2) on the scheduler thread never block; a bad
** descriptor goes to the pool, which reports it. */
static bool write_at_position(const ums__io_req_t *r) {
  if ((r->op != UMS__IO_WRITE && r->op != UMS__IO_WRITEV) ||
      r->off != UMS_FS_CUR)
    return false;
  if (lseek(r->fd, 0, SEEK_CUR) < 0 && errno == ESPIPE) return false;
  int fl = fcntl(r->fd, F_GETFL);
  return fl < 0 || !(fl & O_APPEND);
}

static bool use_ring(ums__sched_t *s, const ums__io_req_t *r) {
  return s->ring && ums__ring_supports(s->ring, r->op) &&
         !write_at_position(r);
}

/* Sockets without io_uring wait for readiness in the scheduler's epoll
** set, never on a pool thread each. (A ring that lacks one of the socket
** opcodes sends that operation to the pool, where it waits in poll(2):
** only kernels older than the socket opcodes, 5.5 and 5.6, get there.) */
static bool use_poller(ums__sched_t *s, const ums__io_req_t *r) {
  return !s->ring && ums__io_is_net(r->op);
}

enum { BACKEND_POOL, BACKEND_RING, BACKEND_POLLER };

/* Where r waits on s: decided once per request, since use_ring may make
** system calls. */
static int backend_of(ums__sched_t *s, const ums__io_req_t *r) {
  if (use_poller(s, r)) return BACKEND_POLLER;
  return use_ring(s, r) ? BACKEND_RING : BACKEND_POOL;
}

/* Whether a socket request's system call is made at once on the
** scheduler thread, before anything waits, so that a socket that is ready
** answers without a trip through the kernel's queue or the epoll set:
** what the readiness servers people compare us with do. Only what then
** waits differs between the backends: the ring's own operation (its
** kernel side tries the call again before it waits) or the epoll set.
** On the ring, only calls that cannot block: every send and receive
** carries MSG_DONTWAIT, an accept needs a non-blocking listener (the
** listeners ums_net_socket makes are), and a connect once begun belongs
** to the kernel. The epoll backend makes every socket call first
** (net.c). A call on a ring that lacks the operation goes to the pool,
** which makes it there. A receive whose descriptor's recent receives
** all had to wait skips its try and waits for readiness at once (net.c,
** "Receives that wait first"). backend: backend_of's answer for r. */
static bool try_first(int backend, const ums__io_req_t *r) {
  if (backend == BACKEND_POLLER) return true;
  if (backend != BACKEND_RING) return false;
  switch (r->op) {
    case UMS__IO_RECV: case UMS__IO_SEND: case UMS__IO_RECVMSG:
    case UMS__IO_SENDMSG: case UMS__IO_POLL:
      return true;
    case UMS__IO_ACCEPT: {
      int fl = fcntl(r->fd, F_GETFL);
      return fl >= 0 && (fl & O_NONBLOCK);
    }
    default:
      return false;
  }
}

/* Makes r's system call now, on the scheduler thread (try_first): its
** result, or UMS__NET_WAIT when r must wait. */
static int64_t try_now(ums__sched_t *s, ums__io_req_t *r, int64_t deadline) {
  int64_t res = ums__net_try(r);
  ums__net_tried(s, r, res);
  /* Not ready past the deadline: the deadline's answer, without an
  ** operation left in the kernel that could still take data after its
  ** caller has gone (a zero timeout is LuaSocket's non-blocking mode). */
  if (res == UMS__NET_WAIT && deadline != UMS_FOREVER &&
      deadline <= ums__clock_now())
    res = UMS_ETIMEDOUT;
  return res;
}

/* Begins the calling task's park and hands r to its backend. r keeps the
** caller's reference either way; on failure nothing was started.
**
** A socket call that may answer at once (try_first) is made before any
** backend sees r. With direct (the deferred form), it is made before the
** park too, once the checks of a park's beginning have passed: when it
** answers, r is complete, no park was begun and start returns 1, so the
** caller takes the result at once (not a connect's, whose deferred form
** always parks: ums.h), without the switch through its scheduler that
** an unpark would queue. r's token then names the task's last park,
** which has ended, so ending r does not wait. The binding checks the
** quantum there as at any call that need not wait. Without direct (the
** blocking form, whose C callers have no quantum), the park is begun
** first and r completes as from a backend, and the task passes through
** its scheduler, letting the others run. */
static int start(ums__io_req_t *r, int64_t deadline, bool direct) {
  ums__task_t *t = ums__task_current();
  if (!t) return UMS_EPERM;
  ums__sched_t *s = t->sched;
  int backend = backend_of(s, r);
  if (backend == BACKEND_POLLER) {
    int e = ums__poller_new(s);
    if (e) return e;
  }
  int type = ums__io_is_net(r->op) ? UMS_WAIT_NET : UMS_WAIT_FILE_IO;
  r->sched = s;
  bool tryable = try_first(backend, r);
  bool try = tryable && !ums__net_wait_first(s, r, deadline);
  int64_t res = UMS__NET_WAIT;
  if (try && direct && r->op != UMS__IO_CONNECT) {
    /* What ums_park_begin_wait would refuse is refused before the call
    ** is made: a cancelled task sends and receives nothing. */
    int rc = ums__park_may_begin(t, 0);
    if (rc) return rc;
    UMS__COUNT(s, io_requests);
    res = try_now(s, r, deadline);
    if (res != UMS__NET_WAIT) {
      r->token.task = atomic_load_explicit(&t->id, memory_order_relaxed);
      r->token.seq = atomic_load_explicit(&t->park_seq, memory_order_relaxed);
      r->res = res;
      atomic_store_explicit(&r->state, UMS__IO_DONE, memory_order_relaxed);
      return 1;
    }
    try = false;  /* tried: it waits */
  } else {
    UMS__COUNT(s, io_requests);
  }
  /* Fails with UMS_ECANCELED for a cancelled task, UMS_EBUSY inside a
  ** park the task has begun itself; after a try that found nothing, that
  ** try took nothing. */
  int rc = ums_park_begin_wait(deadline, 0, type, NULL, 0, &r->token);
  if (rc) return rc;
  if (try) res = try_now(s, r, deadline);
  atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->io_pending, 1, memory_order_relaxed);
  if (res != UMS__NET_WAIT) {
    ums__io_complete(r, res);
  } else if (backend == BACKEND_RING) {
    r->on_ring = true;
    /* A call that may be tried at once cannot block: the ring waits for
    ** readiness and the call is made here (a poll itself is already
    ** one), whether it was tried above or its hint said to wait first
    ** (net.c, "Receives that wait first"). */
    r->ring_ready = tryable && r->op != UMS__IO_POLL;
    ums__ring_submit(s, r);
  } else if (backend == BACKEND_POLLER) {
    /* Tried above, or waiting first: it waits for readiness. */
    r->on_poller = true;
    ums__poller_submit(s, r);
  } else {
    ums__io_pool_submit(s->rt, r);
  }
  return 0;
}

/* Whether t may collect r now: r is t's, and the park r began has ended.
** Returns 0 or the reason it may not. */
static int check_end(ums__io_req_t *r, ums__task_t *t) {
  if (!t || atomic_load_explicit(&t->id, memory_order_relaxed) != r->token.task)
    return UMS_EPERM;
  /* t->park_seq is written only by t itself. A later park means r's has
  ** ended. */
  if (atomic_load_explicit(&t->park_seq, memory_order_relaxed) ==
          r->token.seq &&
      (t->park_pending ||
       atomic_load_explicit(&t->park.state, memory_order_acquire) ==
           UMS__WAITING))
    return UMS_EBUSY;
  return 0;
}

/* Settles r once its park has ended and returns its result. The caller's
** reference stays with the caller, who copies results out of r and then
** drops it. */
static int64_t collect(ums__io_req_t *r, ums__task_t *t) {
  /* The usual case, the completer's unpark ended the park: DONE is
  ** final, so a load (acquire: the result is visible) spares the CAS. */
  int expect = atomic_load_explicit(&r->state, memory_order_acquire);
  if (expect == UMS__IO_DONE ||
      !atomic_compare_exchange_strong(&r->state, &expect,
                                      UMS__IO_ABANDONED)) {
    /* DONE: the operation finished first. */
    if (r->net_learn) ums__net_waited(t->sched, r, r->res);
    return r->res;
  }
  /* Timed out or cancelled while the operation runs on: it finishes
  ** without us, and its completion releases what it produced. */
  int rc = atomic_load_explicit(&t->park_seq, memory_order_relaxed) ==
                   r->token.seq
               ? ums_park_result()
               : UMS_ECANCELED;
  if (rc >= 0) rc = UMS_ECANCELED;  /* a foreign unpark: given up all the
                                       same */
  ums__sched_t *s = r->sched;
  if (r->on_ring)
    ums__ring_cancel(s, r);
  else if (r->on_poller)
    ums__poller_cancel(s, r);
  else
    ums__pool_interrupt(&s->rt->io_pool, &r->work);
  return rc;
}

/* The blocking form: runs r for the caller and returns its result. The
** caller's reference stays with the caller. */
int64_t ums__io_run(ums__io_req_t *r, int64_t deadline) {
  ums__task_t *t = ums__task_current();
  if (!t) {
    /* A host thread: the system call right here. */
    r->res = ums__io_exec(r);
    return r->res;
  }
  int rc = start(r, deadline, false);
  if (rc) return rc;
  ums_park_wait();
  return collect(r, t);
}

static int64_t simple(ums__io_req_t *r, int64_t deadline) {
  int64_t res = ums__io_run(r, deadline);
  ums__io_req_unref(r);
  return res;
}

/* The first half of the deferred form: r is the caller's on success (0,
** or 1 when a socket call answered at once and no park is left). */
int ums__io_begin(ums__io_req_t *r, int64_t deadline, ums_fs_req_t **out) {
  int rc = start(r, deadline, true);
  if (rc < 0) return req_fail(r, rc);
  *out = r;
  return rc;
}

int ums__io_settle(ums__io_req_t *r, int64_t *res) {
  ums__task_t *t = ums__task_current();
  int rc = check_end(r, t);
  if (!rc) *res = collect(r, t);
  return rc;
}

int64_t ums_fs_end(ums_fs_req_t *r) {
  if (!r) return UMS_EINVAL;
  int64_t res;
  int rc = ums__io_settle(r, &res);
  if (rc) return rc;
  if (r->op == UMS__IO_READFILE) res = readfile_take(r, res, NULL);
  ums__io_req_unref(r);
  return res;
}

/* ---------------------------------------------------------------------- */
/* Building requests                                                       */
/* ---------------------------------------------------------------------- */

/* Each builder checks the arguments, makes the request and stores it in
** *out, or returns an error with nothing made. */

static int mk_open(ums__io_req_t **out, const char *path, int flags,
                   int mode) {
  if (!path) return UMS_EINVAL;
  ums__io_req_t *r = ums__io_req_new(UMS__IO_OPEN);
  if (!r) return UMS_ENOMEM;
  int rc = req_paths(r, path, NULL);
  if (rc) return req_fail(r, rc);
  r->flags = flags | O_CLOEXEC;
  r->mode = mode;
  *out = r;
  return 0;
}

/* A cancelled task may not wait, but the close it asks for must still
** happen (ums.h: the descriptor is closed all the same); close(2) does not
** block for long, so it runs right here. Returns 1 when it did. */
static int close_cancelled(int fd) {
  if (!ums__task_current() || !ums_cancelled()) return 0;
  close(fd);
  return 1;
}

static int mk_close(ums__io_req_t **out, int fd) {
  ums__io_req_t *r = ums__io_req_new(UMS__IO_CLOSE);
  if (!r) return UMS_ENOMEM;
  r->fd = fd;
  *out = r;
  return 0;
}

static int mk_rw(ums__io_req_t **out, int op, int fd, const ums_iov_t *iov,
                 int n, int64_t offset) {
  if (fd < 0) return UMS_EBADF;
  if (offset < 0 && offset != UMS_FS_CUR) return UMS_EINVAL;
  ums__io_req_t *r = ums__io_req_new(op);
  if (!r) return UMS_ENOMEM;
  int rc = ums__io_req_iov(r, iov, n);
  if (rc) return req_fail(r, rc);
  r->fd = fd;
  r->off = offset;
  *out = r;
  return 0;
}

static int mk_one(ums__io_req_t **out, int op, int fd, ums_buf_t *buf,
                  size_t pos, size_t len, int64_t offset) {
  if (len > UMS_FS_MAX_RW) len = UMS_FS_MAX_RW;
  ums_iov_t v = {buf, pos, len};
  return mk_rw(out, op, fd, &v, 1, offset);
}

static int mk_fsync(ums__io_req_t **out, int fd, int flags) {
  if (flags & ~UMS_FS_DATASYNC) return UMS_EINVAL;
  if (fd < 0) return UMS_EBADF;
  ums__io_req_t *r = ums__io_req_new(UMS__IO_FSYNC);
  if (!r) return UMS_ENOMEM;
  r->fd = fd;
  r->flags = flags;
  *out = r;
  return 0;
}

static int mk_stat(ums__io_req_t **out, int fd, const char *path,
                   int flags) {
  ums__io_req_t *r = ums__io_req_new(UMS__IO_STATX);
  if (!r) return UMS_ENOMEM;
  int rc = req_paths(r, path ? path : "", NULL);
  if (rc) return req_fail(r, rc);
  r->stx = r->stx_space;
  memset(r->stx_space, 0, sizeof r->stx_space);
  r->fd = fd;
  r->flags = flags;
  *out = r;
  return 0;
}

static int mk_path_stat(ums__io_req_t **out, const char *path, int flags) {
  if (!path || (flags & ~UMS_FS_NOFOLLOW)) return UMS_EINVAL;
  return mk_stat(out, AT_FDCWD, path,
                 (flags & UMS_FS_NOFOLLOW) ? AT_SYMLINK_NOFOLLOW : 0);
}

static int mk_fstat(ums__io_req_t **out, int fd) {
  if (fd < 0) return UMS_EBADF;
  return mk_stat(out, fd, NULL, AT_EMPTY_PATH);
}

/* unlink, rmdir (unlinkat with AT_REMOVEDIR), rename, mkdir, readdir. */
static int mk_path(ums__io_req_t **out, int op, const char *a, const char *b,
                   int mode, int flags) {
  if (!a || (op == UMS__IO_RENAME && !b)) return UMS_EINVAL;
  ums__io_req_t *r = ums__io_req_new(op);
  if (!r) return UMS_ENOMEM;
  int rc = req_paths(r, a, b);
  if (rc) return req_fail(r, rc);
  r->mode = mode;
  r->flags = flags;
  *out = r;
  return 0;
}

static int mk_readfile(ums__io_req_t **out, const char *path,
                       ums_buf_t *buf) {
  if (!path || !buf) return UMS_EINVAL;
  ums__io_req_t *r = ums__io_req_new(UMS__IO_READFILE);
  if (!r) return UMS_ENOMEM;
  int rc = req_paths(r, path, NULL);
  ums_iov_t v = {buf, 0, buf->size < UMS_FS_MAX_RW ? buf->size
                                                   : UMS_FS_MAX_RW};
  if (!rc) rc = ums__io_req_iov(r, &v, 1);
  if (rc) return req_fail(r, rc);
  r->flags = O_RDONLY | O_CLOEXEC;
  *out = r;
  return 0;
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

/* ---------------------------------------------------------------------- */
/* The public calls: blocking form                                         */
/* ---------------------------------------------------------------------- */

int ums_fs_open(const char *path, int flags, int mode, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_open(&r, path, flags, mode);
  return rc ? rc : (int)simple(r, deadline);
}

int ums_fs_close(int fd, int64_t deadline) {
  if (fd < 0) return UMS_EBADF;
  if (close_cancelled(fd)) return UMS_ECANCELED;
  ums__io_req_t *r;
  int rc = mk_close(&r, fd);
  return rc ? rc : (int)simple(r, deadline);
}

int64_t ums_fs_read(int fd, ums_buf_t *buf, size_t pos, size_t len,
                    int64_t offset, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_one(&r, UMS__IO_READ, fd, buf, pos, len, offset);
  return rc ? rc : simple(r, deadline);
}

int64_t ums_fs_write(int fd, ums_buf_t *buf, size_t pos, size_t len,
                     int64_t offset, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_one(&r, UMS__IO_WRITE, fd, buf, pos, len, offset);
  return rc ? rc : simple(r, deadline);
}

int64_t ums_fs_readv(int fd, const ums_iov_t *iov, int iovcnt, int64_t offset,
                     int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_rw(&r, UMS__IO_READV, fd, iov, iovcnt, offset);
  return rc ? rc : simple(r, deadline);
}

int64_t ums_fs_writev(int fd, const ums_iov_t *iov, int iovcnt,
                      int64_t offset, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_rw(&r, UMS__IO_WRITEV, fd, iov, iovcnt, offset);
  return rc ? rc : simple(r, deadline);
}

int ums_fs_fsync(int fd, int flags, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_fsync(&r, fd, flags);
  return rc ? rc : (int)simple(r, deadline);
}

static int stat_run(ums__io_req_t *r, ums_stat_t *out, int64_t deadline) {
  int64_t res = ums__io_run(r, deadline);
  if (res == 0) stat_out(r->stx, out);
  ums__io_req_unref(r);
  return (int)res;
}

int ums_fs_stat(const char *path, int flags, ums_stat_t *out,
                int64_t deadline) {
  if (!out) return UMS_EINVAL;
  ums__io_req_t *r;
  int rc = mk_path_stat(&r, path, flags);
  return rc ? rc : stat_run(r, out, deadline);
}

int ums_fs_fstat(int fd, ums_stat_t *out, int64_t deadline) {
  if (fd < 0) return UMS_EBADF;
  if (!out) return UMS_EINVAL;
  ums__io_req_t *r;
  int rc = mk_fstat(&r, fd);
  return rc ? rc : stat_run(r, out, deadline);
}

int ums_fs_unlink(const char *path, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_path(&r, UMS__IO_UNLINK, path, NULL, 0, 0);
  return rc ? rc : (int)simple(r, deadline);
}

int ums_fs_rmdir(const char *path, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_path(&r, UMS__IO_UNLINK, path, NULL, 0, AT_REMOVEDIR);
  return rc ? rc : (int)simple(r, deadline);
}

int ums_fs_rename(const char *from, const char *to, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_path(&r, UMS__IO_RENAME, from, to, 0, 0);
  return rc ? rc : (int)simple(r, deadline);
}

int ums_fs_mkdir(const char *path, int mode, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_path(&r, UMS__IO_MKDIR, path, NULL, mode, 0);
  return rc ? rc : (int)simple(r, deadline);
}

int ums_fs_readdir(const char *path, ums_dirlist_t **out, int64_t deadline) {
  if (!out) return UMS_EINVAL;
  ums__io_req_t *r;
  int rc = mk_path(&r, UMS__IO_READDIR, path, NULL, 0, 0);
  if (rc) return rc;
  int64_t res = ums__io_run(r, deadline);
  if (res == 0) {
    *out = r->list;
    r->list = NULL;
  }
  ums__io_req_unref(r);
  return (int)res;
}

int64_t ums_fs_readfile(const char *path, ums_buf_t *buf, int *fd,
                        int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_readfile(&r, path, buf);
  if (rc) return rc;
  int64_t res = readfile_take(r, ums__io_run(r, deadline), fd);
  ums__io_req_unref(r);
  return res;
}

void ums_dirlist_free(ums_dirlist_t *list) { free(list); }

/* ---------------------------------------------------------------------- */
/* The public calls: deferred form                                         */
/* ---------------------------------------------------------------------- */

/* Every _begin: rc is the builder's; on success r goes to begin. */
#define BEGIN(rc, r, deadline, out) \
  ((rc) ? (rc) : ums__io_begin((r), (deadline), (out)))

int ums_fs_open_begin(const char *path, int flags, int mode,
                      int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_open(&r, path, flags, mode);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_close_begin(int fd, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  if (fd < 0) return UMS_EBADF;
  if (close_cancelled(fd)) return UMS_ECANCELED;
  ums__io_req_t *r = NULL;
  int rc = mk_close(&r, fd);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_read_begin(int fd, ums_buf_t *buf, size_t pos, size_t len,
                      int64_t offset, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_one(&r, UMS__IO_READ, fd, buf, pos, len, offset);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_write_begin(int fd, ums_buf_t *buf, size_t pos, size_t len,
                       int64_t offset, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_one(&r, UMS__IO_WRITE, fd, buf, pos, len, offset);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_readv_begin(int fd, const ums_iov_t *iov, int iovcnt,
                       int64_t offset, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_rw(&r, UMS__IO_READV, fd, iov, iovcnt, offset);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_writev_begin(int fd, const ums_iov_t *iov, int iovcnt,
                        int64_t offset, int64_t deadline,
                        ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_rw(&r, UMS__IO_WRITEV, fd, iov, iovcnt, offset);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_fsync_begin(int fd, int flags, int64_t deadline,
                       ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_fsync(&r, fd, flags);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_stat_begin(const char *path, int flags, int64_t deadline,
                      ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_path_stat(&r, path, flags);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_fstat_begin(int fd, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_fstat(&r, fd);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_unlink_begin(const char *path, int64_t deadline,
                        ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_path(&r, UMS__IO_UNLINK, path, NULL, 0, 0);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_rmdir_begin(const char *path, int64_t deadline,
                       ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_path(&r, UMS__IO_UNLINK, path, NULL, 0, AT_REMOVEDIR);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_rename_begin(const char *from, const char *to, int64_t deadline,
                        ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_path(&r, UMS__IO_RENAME, from, to, 0, 0);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_mkdir_begin(const char *path, int mode, int64_t deadline,
                       ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_path(&r, UMS__IO_MKDIR, path, NULL, mode, 0);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_readdir_begin(const char *path, int64_t deadline,
                         ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_path(&r, UMS__IO_READDIR, path, NULL, 0, 0);
  return BEGIN(rc, r, deadline, req);
}

int ums_fs_readfile_begin(const char *path, ums_buf_t *buf, int64_t deadline,
                          ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_readfile(&r, path, buf);
  return BEGIN(rc, r, deadline, req);
}

int64_t ums_fs_readfile_end(ums_fs_req_t *r, int *fd) {
  if (!r || r->op != UMS__IO_READFILE) return UMS_EINVAL;
  ums__task_t *t = ums__task_current();
  int rc = check_end(r, t);
  if (rc) return rc;
  int64_t res = readfile_take(r, collect(r, t), fd);
  ums__io_req_unref(r);
  return res;
}

int ums_fs_stat_end(ums_fs_req_t *r, ums_stat_t *out) {
  if (!r || !out || r->op != UMS__IO_STATX) return UMS_EINVAL;
  ums__task_t *t = ums__task_current();
  int rc = check_end(r, t);
  if (rc) return rc;
  int64_t res = collect(r, t);
  if (res == 0) stat_out(r->stx, out);
  ums__io_req_unref(r);
  return (int)res;
}

int ums_fs_readdir_end(ums_fs_req_t *r, ums_dirlist_t **out) {
  if (!r || !out || r->op != UMS__IO_READDIR) return UMS_EINVAL;
  ums__task_t *t = ums__task_current();
  int rc = check_end(r, t);
  if (rc) return rc;
  int64_t res = collect(r, t);
  if (res == 0) {
    *out = r->list;
    r->list = NULL;
  }
  ums__io_req_unref(r);
  return (int)res;
}
