/*
** io-uring.c: the io_uring backend, the scheduler's "I/O list"
** (docs/design/io.md).
**
** Each scheduler owns one ring and only its thread touches it (one
** submitter per ring), because only that thread runs its tasks. A request
** becomes a submission entry (SQE) and its task parks. Entries are not
** sent one system call each: they wait for the batch to be due, which is
** when the pass finds the run queue empty, or after as many passes as
** there were runnable tasks when the batch's first entry was queued (at
** most BATCH_MAX), so a busy scheduler still submits within one round of
** its run queue. Completions (CQEs) are reaped at every pass by reading
** the ring's head and tail, with no system call when there are none (the
** io_uring analogue of HasOverlappedIoCompleted).
**
** The idle wait is io_uring_enter itself: it submits what is queued and
** sleeps until the first CQE or the next timer. A wake-up from another
** thread must end it, so a read of an eventfd is kept armed in the ring
** and ums__ring_wake writes to that eventfd (only for the one waker that
** moved the scheduler from idle to woken; see ums__sched_wake).
**
** Sockets wait for readiness. A socket call is first made at once on the
** scheduler thread (io.c, try_first); one that is not ready waits in the
** ring as a poll for its readiness, and when the poll fires the call is
** made again here, on this thread, for a caller that still waits. Had the
** kernel's own receive (or send, or accept) waited instead, a caller
** whose deadline passed, or who was cancelled, between the data's arrival
** and the kernel's cancel would have had its bytes or its connection
** taken and dropped with the abandoned result: a stream with a hole, a
** send the caller believes unsent. A poll takes nothing, and the caller
** gives up (collect) on this same thread, so the call is either made for
** a caller that waits or not made at all. An accept on a blocking
** listener and a connect still wait as the kernel's operations (their
** calls would block here).
**
** user_data: a request's address; the address with bit 0 set for the
** kernel cancel of that request; the address of ring->wake_buf for the
** eventfd read; LIBURING_UDATA_TIMEOUT for liburing's own timeouts on
** kernels without IORING_FEAT_EXT_ARG.
**
** Kept rings. Setting a ring up and tearing it down (its mappings, the
** TLB shootdowns of unmapping them in a process with several threads,
** its eventfd) is a large part of a short run's start and stop, and a
** program may start many short runs (a test framework runs one per
** test). So a ring whose scheduler has ended goes, drained and idle, to a
** process-wide cache of at most RING_CACHE_MAX rings, and the next
** scheduler set up takes it from there. The cache is the process's: its
** rings and their two descriptors each stay open until the process ends.
** A ring is only cached once its scheduler's thread has drained it and
** every thread that could wake it is gone (ums__ring_free's contract),
** so nothing of one runtime reaches the next through it but a wake-up
** counted on its eventfd after the drain, which costs the next scheduler
** one spurious pass at most. A child made by fork shares the cached
** rings' memory with the parent's kernel rings: it closes its copies and
** makes its own.
*/
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(UMS_HAVE_LIBURING)

#include <fcntl.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/stat.h>

#define RING_ENTRIES 256
#define CQ_ENTRIES (4 * RING_ENTRIES)
#define BATCH_MAX 64
#define DRAIN_RETRY_NS (10 * UMS_NSEC_PER_MSEC)
/* A read this large is a "big read" (see big_read). */
#define BIG_READ (256u << 10)

/* What the ring is known to do, per enum ums__io_op. */
enum { OP_NO = 0, OP_YES = 1, OP_ASSUMED = 2 /* no probe: try, and learn
                                                from -EINVAL */ };

struct ums__ring {
  struct io_uring ring;        /* [owner] */
  int efd;                     /* [const] wake-up eventfd */
  uint64_t wake_buf;           /* [the kernel, while wake_armed] */
  bool wake_armed;             /* [owner] the eventfd read is in the ring */
  bool draining;               /* [owner] a cancel-everything is in flight */
  uint32_t kernel_refs;        /* [owner] requests and cancels queued or in
                                  the kernel, not yet reaped */
  uint32_t budget;             /* [owner] passes before the batch is due */
  /* [owner] requests with work left for after reap, FIFO (after_reap;
  ** what may go on it is said at after_push). */
  ums__io_req_t *after_head, *after_tail;
  bool async_ok;               /* [const] IOSQE_ASYNC is known (a kernel
                                  with the opcode probe, 5.6 on, has it) */
  uint32_t big_reads;          /* [owner] big reads queued or in the kernel,
                                  not yet reaped */
  uint8_t ops[UMS__IO_NOPS];   /* [owner] OP_NO / OP_YES / OP_ASSUMED */
};

static const int opcode_of[UMS__IO_NOPS] = {
    [UMS__IO_OPEN] = IORING_OP_OPENAT,     [UMS__IO_CLOSE] = IORING_OP_CLOSE,
    [UMS__IO_READ] = IORING_OP_READ,       [UMS__IO_WRITE] = IORING_OP_WRITE,
    [UMS__IO_READV] = IORING_OP_READV,     [UMS__IO_WRITEV] = IORING_OP_WRITEV,
    [UMS__IO_FSYNC] = IORING_OP_FSYNC,     [UMS__IO_STATX] = IORING_OP_STATX,
    [UMS__IO_UNLINK] = IORING_OP_UNLINKAT, [UMS__IO_RENAME] = IORING_OP_RENAMEAT,
    [UMS__IO_MKDIR] = IORING_OP_MKDIRAT,   [UMS__IO_READDIR] = -1,
    [UMS__IO_READFILE] = -1, /* a chain: see "Whole small files" */
    [UMS__IO_ACCEPT] = IORING_OP_ACCEPT,
    [UMS__IO_CONNECT] = IORING_OP_CONNECT,
    [UMS__IO_RECV] = IORING_OP_RECV,       [UMS__IO_SEND] = IORING_OP_SEND,
    [UMS__IO_RECVMSG] = IORING_OP_RECVMSG,
    [UMS__IO_SENDMSG] = IORING_OP_SENDMSG,
    [UMS__IO_POLL] = IORING_OP_POLL_ADD,
};

#define CANCEL_ALL_UD ((uint64_t)2)
#define CANCEL_FD_UD ((uint64_t)4)

static inline uint64_t wake_ud(const ums__ring_t *rg) {
  return (uint64_t)(uintptr_t)&rg->wake_buf;
}

/* The process's kept rings (see "Kept rings" at the top). */
#define RING_CACHE_MAX 8

static struct {
  pthread_mutex_t lock;
  ums__ring_t *rings[RING_CACHE_MAX];  /* [lock] */
  int n;                               /* [lock] */
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void ring_close(ums__ring_t *rg) {
  io_uring_queue_exit(&rg->ring);
  close(rg->efd);
  free(rg);
}

/* In a child made by fork: the cached rings are the parent's kernel
** rings, mapped shared; only the forking thread lives on, so nothing
** holds the lock. */
static void cache_after_fork(void) {
  pthread_mutex_init(&cache.lock, NULL);
  for (int i = 0; i < cache.n; i++) ring_close(cache.rings[i]);
  cache.n = 0;
}

static void cache_setup(void) {
  pthread_atfork(NULL, NULL, cache_after_fork);
}

static ums__ring_t *cache_take(void) {
  ums__ring_t *rg = NULL;
  pthread_mutex_lock(&cache.lock);
  if (cache.n > 0) rg = cache.rings[--cache.n];
  pthread_mutex_unlock(&cache.lock);
  return rg;
}

/* Keeps rg for a later scheduler; false if the cache is full. */
static bool cache_put(ums__ring_t *rg) {
  pthread_once(&cache_once, cache_setup);
  bool kept = false;
  pthread_mutex_lock(&cache.lock);
  if (cache.n < RING_CACHE_MAX) {
    cache.rings[cache.n++] = rg;
    kept = true;
  }
  pthread_mutex_unlock(&cache.lock);
  return kept;
}

int ums__ring_new(ums__sched_t *s, const ums__ring_t *probe_from) {
  ums__ring_t *rg = cache_take();
  if (rg) {
    /* Drained when it was cached: only what the kernel taught it stays. */
    if (probe_from) {
      memcpy(rg->ops, probe_from->ops, sizeof rg->ops);
      rg->async_ok = probe_from->async_ok;
    }
    s->ring = rg;
    return 0;
  }
  rg = calloc(1, sizeof *rg);
  if (!rg) return UMS_ENOMEM;
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  /* Cooperative task work: a socket that becomes ready on another CPU
  ** (a loopback peer's send runs our receive's wake-up there) queues the
  ** receive's completion work for this thread without interrupting it,
  ** and this thread runs it at its next entry into the kernel; the flag
  ** says when such work waits (see task_work_due). Kernels before 5.19
  ** refuse the flags: the ring is then set up without them. */
  p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP |
            IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
  p.cq_entries = CQ_ENTRIES;
  int r = io_uring_queue_init_params(RING_ENTRIES, &rg->ring, &p);
  if (r == -EINVAL) {
    memset(&p, 0, sizeof p);
    p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_CLAMP;
    p.cq_entries = CQ_ENTRIES;
    r = io_uring_queue_init_params(RING_ENTRIES, &rg->ring, &p);
  }
  if (r < 0) {
    free(rg);
    return r;
  }
  /* A blocking eventfd: on a non-blocking file, io_uring reports -EAGAIN
  ** instead of waiting for data. */
  rg->efd = eventfd(0, EFD_CLOEXEC);
  if (rg->efd < 0) {
    r = -errno;
    io_uring_queue_exit(&rg->ring);
    free(rg);
    return r;
  }
  if (probe_from) {
    memcpy(rg->ops, probe_from->ops, sizeof rg->ops);
    rg->async_ok = probe_from->async_ok;
  } else {
    struct io_uring_probe *pr = io_uring_get_probe_ring(&rg->ring);
    for (int op = 0; op < UMS__IO_NOPS; op++)
      rg->ops[op] = opcode_of[op] < 0 ? OP_NO
                    : !pr ? OP_ASSUMED
                    : io_uring_opcode_supported(pr, opcode_of[op]) ? OP_YES
                                                                   : OP_NO;
    /* The wake-up needs READ, giving up on a request needs ASYNC_CANCEL:
    ** without them the ring cannot serve as this scheduler's idle wait. */
    bool usable = !pr || (io_uring_opcode_supported(pr, IORING_OP_READ) &&
                          io_uring_opcode_supported(pr, IORING_OP_ASYNC_CANCEL));
    rg->async_ok = pr != NULL;
    /* Readfile is a chain of these (see "Whole small files"). */
    rg->ops[UMS__IO_READFILE] =
        rg->ops[UMS__IO_OPEN] == OP_YES && rg->ops[UMS__IO_READ] == OP_YES &&
                rg->ops[UMS__IO_CLOSE] == OP_YES
            ? OP_YES
            : OP_NO;
    if (pr) io_uring_free_probe(pr);
    if (!usable) {
      ring_close(rg);
      return UMS_ENOTSUP;
    }
  }
  s->ring = rg;
  return 0;
}

void ums__ring_free(ums__ring_t *rg) {
  if (!rg) return;
  /* A ring with anything of its scheduler's left in it (a start that
  ** failed before its thread ran is not: it never held anything) is
  ** not reused. */
  bool idle = rg->kernel_refs == 0 && !rg->wake_armed && !rg->draining &&
              !rg->after_head && rg->big_reads == 0 &&
              io_uring_sq_ready(&rg->ring) == 0 &&
              io_uring_cq_ready(&rg->ring) == 0 &&
              !io_uring_cq_has_overflow(&rg->ring);
  if (idle) {
    rg->budget = 0;
    if (cache_put(rg)) return;
  }
  ring_close(rg);
}

bool ums__ring_supports(const ums__ring_t *rg, int op) {
  return rg->ops[op] != OP_NO;
}

static void handle_cqe(ums__sched_t *s, uint64_t ud, int res);

/* Big reads side by side go to the kernel's workers. The kernel serves a
** read of cached pages inline, on the thread that submits it: this
** scheduler's. One big read at a time is best served so (a hand-off to a
** kernel worker per read costs more than it gives to one task reading a
** big file, bench_fs.lua), but several in flight would all copy on this
** one CPU while the others idle (many tasks reading one file). So a big
** read queued while another is
** queued or in flight is marked IOSQE_ASYNC: the first copies inline, the
** rest on the kernel's workers, on any CPU. */
static bool big_read(const ums__io_req_t *r) {
  return r->op == UMS__IO_READ && r->iov[0].iov_len >= BIG_READ;
}

/* Whether the kernel holds completion work for this thread that only an
** entry into the kernel runs (cooperative task work, set up in
** ums__ring_new): a completion waits there, not yet in the CQ ring. */
static bool task_work_due(const ums__ring_t *rg) {
  return IO_URING_READ_ONCE(*rg->ring.sq.kflags) & IORING_SQ_TASKRUN;
}

/* Reaps every completion there is. The peek reads the ring's head and
** tail: no system call unless the kernel had to keep CQEs aside because
** the completion ring overflowed. Returns how many were reaped. */
static unsigned reap(ums__sched_t *s) {
  ums__ring_t *rg = s->ring;
  unsigned total = 0;
  for (;;) {
    struct io_uring_cqe *cqe;
    unsigned head, n = 0;
    io_uring_for_each_cqe(&rg->ring, head, cqe) {
      uint64_t ud = cqe->user_data;
      int res = cqe->res;
      /* Release the slot before handling: handling never reaps again. */
      io_uring_cq_advance(&rg->ring, 1);
      handle_cqe(s, ud, res);
      n++;
    }
    total += n;
    if (!io_uring_cq_has_overflow(&rg->ring)) break;
    io_uring_get_events(&rg->ring);
  }
  return total;
}

/* Submits everything queued. Retries what the kernel says to retry:
** -EINTR (a signal), -EAGAIN (no memory for now) and -EBUSY (the
** completion ring is full: reap first). */
static void submit_now(ums__sched_t *s) {
  ums__ring_t *rg = s->ring;
  int spins = 0;
  while (io_uring_sq_ready(&rg->ring)) {
    int r = io_uring_submit(&rg->ring);
    UMS__COUNT(s, io_submits);
    if (r >= 0 || r == -EINTR) continue;
    if (r == -EAGAIN || r == -EBUSY) {
      if (!reap(s) && ++spins > 16) sched_yield();
      continue;
    }
    /* Anything else means the ring itself is broken (it was set up and
    ** probed, so this is not an unsupported operation). The entries stay
    ** queued and the next pass tries again. */
    break;
  }
  rg->budget = 0;
}

/* A free SQE; when the submission ring is full, submits and retries. */
static struct io_uring_sqe *get_sqe(ums__sched_t *s) {
  ums__ring_t *rg = s->ring;
  for (;;) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&rg->ring);
    if (sqe) return sqe;
    submit_now(s);
    if (!io_uring_sq_space_left(&rg->ring)) sched_yield();
  }
}

static void queued(ums__sched_t *s) {
  ums__ring_t *rg = s->ring;
  /* The first entry of a batch sets when it is due: after the tasks that
  ** are runnable now have had their turn. */
  if (io_uring_sq_ready(&rg->ring) == 1)
    rg->budget = s->runq_n < BATCH_MAX ? s->runq_n : BATCH_MAX;
}

/* ---------------------------------------------------------------------- */
/* Whole small files                                                       */
/* ---------------------------------------------------------------------- */

/* ums_fs_readfile as a few entries driven by this scheduler's pass, so
** that its task parks once per file instead of once per open, read and
** close (each park costs a coroutine switch, a pass and a request, and
** for a small file those parks would cost more user time than the
** kernel's own work on it).
**
** Stage 1: OPENAT. Then (after_reap: reap must not submit, submitting
** may reap) a statx(2) on this thread says what was opened:
**   - a regular file (or a directory, whose read gives EISDIR): stage 2,
**     a READ of the whole buffer at offset 0, a READ of one byte at the
**     buffer's end (0: the file fits; more: it is larger) and the CLOSE,
**     hard-linked so that each runs whatever the one before gave (a short
**     read "fails" a plain link); when the statx's size fits the buffer,
**     only the READ and the CLOSE (a read that returns exactly that size
**     has found the end; another count starts the request over, reading
**     to the end this time);
**   - anything else (a FIFO, a terminal): no read at all, since io_uring
**     reads a stream whatever the offset: the descriptor goes to the
**     caller with UMS_ESPIPE, and the stream loses nothing.
** The request completes when its last stage has: the result is the
** caller's.
**
** Entries carry the request's address with a tag in bits 1-2 (bit 0 marks
** a cancel's own completion; requests are malloc'ed, 16-byte aligned). */
enum { CH_OPEN, CH_READ, CH_NEXT, CH_CLOSE };
#define CH_TAG_MASK ((uint64_t)6)

static inline uint64_t chain_tag(int tag) { return (uint64_t)tag << 1; }

static void chain_sqe(struct io_uring_sqe *sqe, ums__io_req_t *r, int tag,
                      unsigned flags) {
  sqe->flags |= (uint8_t)flags;
  sqe->user_data = (uint64_t)(uintptr_t)r | chain_tag(tag);
}

static void chain_start(ums__sched_t *s, ums__io_req_t *r) {
  ums__ring_t *rg = s->ring;
  if ((uintptr_t)r & CH_TAG_MASK) {
    /* Not aligned for tags (never with glibc's malloc): the pool. */
    r->on_ring = false;
    ums__io_pool_submit(s->rt, r);
    return;
  }
  r->chain_stage = 1;
  r->chain_left = 1;
  struct io_uring_sqe *sqe = get_sqe(s);
  io_uring_prep_openat(sqe, AT_FDCWD, r->path, r->flags, 0);
  chain_sqe(sqe, r, CH_OPEN, 0);
  rg->kernel_refs++;
  queued(s);
}

/* Queues r for after_reap, the pass's step that follows reap. A request
** goes there when the handling of its CQE would have to submit, which
** reap must not do (get_sqe may reap when the ring is full, and reap is
** not reentrant): a readfile chain whose stage has completed (its next
** stage, or its result) and a socket's readiness poll that fired for a
** call that still found nothing (ring_ready: the poll again). Only
** requests of this ring, on its owner's thread, each at most once: the
** link is the request's own. */
static void after_push(ums__ring_t *rg, ums__io_req_t *r) {
  r->after_next = NULL;
  if (rg->after_tail)
    rg->after_tail->after_next = r;
  else
    rg->after_head = r;
  rg->after_tail = r;
}

static void chain_cqe(ums__sched_t *s, ums__io_req_t *r, int tag, int res) {
  r->chain_res[tag] = res;
  if (--r->chain_left > 0) return;
  after_push(s->ring, r);
}

/* The result of a chain whose stage 2 has completed. */
static int64_t chain_result(const ums__io_req_t *r) {
  const int32_t *res = r->chain_res;
  int64_t out;
  /* Only the cancel-everything of a draining ring cancels a close: the
  ** descriptor (stage 1's result) is then closed here. */
  if (res[CH_CLOSE] == -ECANCELED) close(res[CH_OPEN]);
  if (res[CH_READ] < 0)
    out = res[CH_READ];
  else if (res[CH_NEXT] < 0)
    out = res[CH_NEXT];
  else
    out = res[CH_NEXT] > 0 ? UMS_EFBIG : res[CH_READ];
  return out >= 0 && res[CH_CLOSE] < 0 ? res[CH_CLOSE] : out;
}

/* Stage 1 has ended with the file open as fd: stage 2, or the result
** (> INT64_MIN: the request is done with it). */
static int64_t chain_stage2(ums__sched_t *s, ums__io_req_t *r, int fd) {
  ums__ring_t *rg = s->ring;
  int64_t what = ums__io_readfile_kind(r, fd);
  if (what) return what;
  size_t len = r->iov[0].iov_len;
  r->chain_stage = 2;
  int64_t size = r->chain_size;
  /* When the file fits, by its size, a read of the whole buffer that
  ** gives exactly that size has found the end (a regular file's read is
  ** short only there; procfs files say 0 and take the long way), so no
  ** read at the end. Any other count (the file changed since the statx)
  ** reads it again the long way (after_reap). */
  r->chain_short = !r->chain_full && size > 0 && (uint64_t)size < len;
  r->chain_left = r->chain_short ? 2 : 3;
  if (r->chain_short) r->chain_res[CH_NEXT] = 0;
  if (io_uring_sq_space_left(&rg->ring) < (unsigned)r->chain_left)
    submit_now(s);
  struct io_uring_sqe *sqe = get_sqe(s);
  io_uring_prep_read(sqe, fd, r->iov[0].iov_base, (unsigned)len, 0);
  chain_sqe(sqe, r, CH_READ, IOSQE_IO_HARDLINK);
  if (!r->chain_short) {
    sqe = get_sqe(s);
    io_uring_prep_read(sqe, fd, r->scratch, 1, (uint64_t)len);
    chain_sqe(sqe, r, CH_NEXT, IOSQE_IO_HARDLINK);
  }
  sqe = get_sqe(s);
  io_uring_prep_close(sqe, fd);
  chain_sqe(sqe, r, CH_CLOSE, 0);
  rg->kernel_refs += (unsigned)r->chain_left;
  queued(s);
  return INT64_MIN;
}

/* Runs what reap left for after it (after_push): submits a socket's
** poll again, starts the next stage of a chain or completes it. */
static void after_reap(ums__sched_t *s) {
  ums__ring_t *rg = s->ring;
  ums__io_req_t *r;
  while ((r = rg->after_head) != NULL) {
    rg->after_head = r->after_next;
    if (!rg->after_head) rg->after_tail = NULL;
    if (r->ring_ready) {
      /* A socket whose readiness did not hold: wait for it again, if
      ** its caller still waits. */
      if (atomic_load_explicit(&r->state, memory_order_relaxed) ==
          UMS__IO_INFLIGHT)
        ums__ring_submit(s, r);
      else
        ums__io_complete(r, UMS_ECANCELED);
      continue;
    }
    int64_t res;
    if (r->chain_stage == 2 && r->chain_short &&
        r->chain_res[CH_READ] >= 0 && r->chain_res[CH_CLOSE] >= 0 &&
        r->chain_res[CH_READ] != r->chain_size) {
      /* The short chain's read disagrees with the size (the file
      ** changed, or a file system reads short): again, to the end. */
      r->chain_full = true;
      chain_start(s, r);
      continue;
    }
    if (r->chain_stage == 2)
      res = chain_result(r);
    else if (r->chain_res[CH_OPEN] < 0)
      res = r->chain_res[CH_OPEN];
    else if ((res = chain_stage2(s, r, r->chain_res[CH_OPEN])) == INT64_MIN)
      continue;
    ums__io_complete(r, res);
  }
}

void ums__ring_submit(ums__sched_t *s, ums__io_req_t *r) {
  ums__ring_t *rg = s->ring;
  if (r->op == UMS__IO_READFILE) {
    r->chain_full = false;
    chain_start(s, r);
    return;
  }
  struct io_uring_sqe *sqe = get_sqe(s);
  /* UMS_FS_CUR (-1) is io_uring's "use the file position" too. */
  uint64_t off = (uint64_t)r->off;
  switch (r->ring_ready ? UMS__IO_POLL : r->op) {
    case UMS__IO_OPEN:
      io_uring_prep_openat(sqe, AT_FDCWD, r->path, r->flags,
                           (mode_t)r->mode);
      break;
    case UMS__IO_CLOSE:
      io_uring_prep_close(sqe, r->fd);
      break;
    case UMS__IO_READ:
      io_uring_prep_read(sqe, r->fd, r->iov[0].iov_base,
                         (unsigned)r->iov[0].iov_len, off);
      break;
    case UMS__IO_WRITE:
      io_uring_prep_write(sqe, r->fd, r->iov[0].iov_base,
                          (unsigned)r->iov[0].iov_len, off);
      break;
    case UMS__IO_READV:
      io_uring_prep_readv(sqe, r->fd, r->iov, (unsigned)r->iovcnt, off);
      break;
    case UMS__IO_WRITEV:
      io_uring_prep_writev(sqe, r->fd, r->iov, (unsigned)r->iovcnt, off);
      break;
    case UMS__IO_FSYNC:
      io_uring_prep_fsync(sqe, r->fd,
                          (r->flags & UMS_FS_DATASYNC) ? IORING_FSYNC_DATASYNC
                                                       : 0);
      break;
    case UMS__IO_STATX:
      io_uring_prep_statx(sqe, r->fd, r->path, r->flags,
                          STATX_BASIC_STATS | STATX_BTIME, r->stx);
      break;
    case UMS__IO_UNLINK:
      io_uring_prep_unlinkat(sqe, AT_FDCWD, r->path, r->flags);
      break;
    case UMS__IO_RENAME:
      io_uring_prep_renameat(sqe, AT_FDCWD, r->path, AT_FDCWD, r->path2, 0);
      break;
    case UMS__IO_MKDIR:
      io_uring_prep_mkdirat(sqe, AT_FDCWD, r->path, (mode_t)r->mode);
      break;
    /* Sockets (net.c). The kernel waits for readiness itself, whatever
    ** the socket's O_NONBLOCK; sends never raise SIGPIPE. */
    case UMS__IO_ACCEPT:
      r->addrlen = sizeof r->addr;
      io_uring_prep_accept(sqe, r->fd, (struct sockaddr *)&r->addr,
                           &r->addrlen, SOCK_CLOEXEC | SOCK_NONBLOCK);
      break;
    case UMS__IO_CONNECT:
      io_uring_prep_connect(sqe, r->fd, (struct sockaddr *)&r->addr,
                            r->addrlen);
      break;
    case UMS__IO_RECV:
      io_uring_prep_recv(sqe, r->fd, r->iov[0].iov_base, r->iov[0].iov_len,
                         r->flags);
      break;
    case UMS__IO_SEND:
      io_uring_prep_send(sqe, r->fd, r->iov[0].iov_base, r->iov[0].iov_len,
                         r->flags | MSG_NOSIGNAL);
      break;
    case UMS__IO_RECVMSG:
      io_uring_prep_recvmsg(sqe, r->fd, &r->msg, (unsigned)r->flags);
      break;
    case UMS__IO_SENDMSG:
      io_uring_prep_sendmsg(sqe, r->fd, &r->msg,
                            (unsigned)r->flags | MSG_NOSIGNAL);
      break;
    case UMS__IO_POLL:
      io_uring_prep_poll_add(sqe, r->fd, ums__net_events(r));
      break;
    default:
      abort(); /* ums__ring_supports said no */
  }
  if (big_read(r) && rg->big_reads++ > 0 && rg->async_ok)
    sqe->flags |= IOSQE_ASYNC;
  sqe->user_data = (uint64_t)(uintptr_t)r;
  rg->kernel_refs++;
  queued(s);
}

void ums__ring_cancel(ums__sched_t *s, ums__io_req_t *r) {
  ums__ring_t *rg = s->ring;
  /* A readfile chain can block only in its open (a file system that
  ** hangs): that entry is the one to cancel, while it may still run. */
  uint64_t target = (uint64_t)(uintptr_t)r;
  if (r->op == UMS__IO_READFILE) {
    if (r->chain_stage != 1) return;
    target |= chain_tag(CH_OPEN);
  }
  /* The cancel holds a reference: r's address must not be reused for
  ** another request while the kernel may still match this cancel. */
  atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
  struct io_uring_sqe *sqe = get_sqe(s);
  io_uring_prep_cancel64(sqe, target, 0);
  sqe->user_data = (uint64_t)(uintptr_t)r | 1;
  rg->kernel_refs++;
  queued(s);
  /* A socket operation whose caller has gone must stop before anything
  ** else reaches its socket: left for the batch, an accept on a blocking
  ** listener waiting in the kernel would take the connection meant for
  ** the caller's next call, and the runtime would close it with the
  ** abandoned result. The kernel cancels an operation that waits for
  ** readiness during the submission itself. A poll (ring_ready) takes
  ** nothing: it can wait for the batch. */
  if (ums__io_is_net(r->op) && !r->ring_ready) submit_now(s);
}

void ums__ring_cancel_fd(ums__sched_t *s, int fd) {
  ums__ring_t *rg = s->ring;
  if (rg->kernel_refs == 0) return;
  /* Holds no reference: its completion touches no request. Before the
  ** close in the same ring, so the operations end before the descriptor
  ** goes (IORING_ASYNC_CANCEL_FD needs Linux 5.19; before that the
  ** cancel fails and the operations run on until their socket's peer
  ** ends them). */
  struct io_uring_sqe *sqe = get_sqe(s);
  io_uring_prep_cancel_fd(sqe, fd, IORING_ASYNC_CANCEL_ALL);
  sqe->user_data = CANCEL_FD_UD;
  queued(s);
}

static void handle_cqe(ums__sched_t *s, uint64_t ud, int res) {
  ums__ring_t *rg = s->ring;
  if (ud == LIBURING_UDATA_TIMEOUT) return;
  if (ud == wake_ud(rg)) {
    rg->wake_armed = false;
    return;
  }
  if (ud == CANCEL_ALL_UD) {
    rg->draining = false;
    return;
  }
  /* A close's cancel of the operations on its descriptor: the
  ** operations' own CQEs say what became of them. */
  if (ud == CANCEL_FD_UD) return;
  rg->kernel_refs--;
  if (ud & 1) {
    /* A cancel's own completion; its result (found, -ENOENT, -EALREADY)
    ** does not matter: the request's CQE comes (or came) anyway. */
    ums__io_req_unref((ums__io_req_t *)(uintptr_t)(ud & ~(uint64_t)1));
    return;
  }
  ums__io_req_t *r = (ums__io_req_t *)(uintptr_t)(ud & ~CH_TAG_MASK);
  if (r->op == UMS__IO_READFILE) {
    chain_cqe(s, r, (int)((ud & CH_TAG_MASK) >> 1), res);
    return;
  }
  if (big_read(r)) rg->big_reads--;
  if (r->ring_ready && res >= 0) {
    /* Ready: the call itself, here, for a caller that still waits; none
    ** for one that has gone (collect, on this thread, abandoned it), so
    ** that nothing is taken from the socket on its behalf. Not ready
    ** after all (another reader was first): the poll again, after reap. */
    int64_t v = UMS_ECANCELED;
    if (atomic_load_explicit(&r->state, memory_order_relaxed) ==
        UMS__IO_INFLIGHT) {
      v = ums__net_try(r);
      if (v == UMS__NET_WAIT) {
        after_push(rg, r);
        return;
      }
    }
    ums__io_complete(r, v);
    return;
  }
  /* A socket operation cancelled while its caller still waits: only
  ** ums__ring_cancel_fd does that, for a close of its descriptor. */
  if (res == -ECANCELED && ums__io_is_net(r->op)) res = UMS_EBADF;
  bool unknown_op = res == -EINVAL && rg->ops[r->op] == OP_ASSUMED;
  if (unknown_op) rg->ops[r->op] = OP_NO;
  /* -EOPNOTSUPP: this file or this kernel does not do it through the
  ** ring; the plain system call on the pool may. Nothing was done, so
  ** running the request again is safe. */
  if ((unknown_op || res == -EOPNOTSUPP) &&
      atomic_load(&r->state) == UMS__IO_INFLIGHT) {
    r->on_ring = false;
    ums__io_pool_submit(s->rt, r);
    return;
  }
  ums__io_complete(r, res);
}

void ums__ring_poll(ums__sched_t *s) {
  ums__ring_t *rg = s->ring;
  /* No request or cancel queued or in the kernel, and none left for
  ** after reap: this pass has nothing to submit, and nothing to reap
  ** but the idle wait's own entries (the wake-up read, a wait's timeout),
  ** which ums__ring_wait reaps before it waits again. Every pass comes
  ** here (a channel message between two tasks is one pass), and this
  ** look touches no memory shared with the kernel. */
  if (rg->kernel_refs == 0 && !rg->after_head) return;
  if (io_uring_sq_ready(&rg->ring)) {
    if (rg->budget == 0 || s->runq_n == 0)
      submit_now(s);
    else
      rg->budget--;
  }
  /* Completion work the kernel keeps for this thread runs at its next
  ** system call; a pass that makes none (tasks that only compute and
  ** yield) enters the kernel for it, or the completions would wait for
  ** the run queue to empty. */
  if (!io_uring_cq_ready(&rg->ring) && task_work_due(rg))
    io_uring_get_events(&rg->ring);
  if (io_uring_cq_ready(&rg->ring) || io_uring_cq_has_overflow(&rg->ring))
    reap(s);
  if (rg->after_head) after_reap(s);
}

static void arm_wake(ums__sched_t *s) {
  ums__ring_t *rg = s->ring;
  if (rg->wake_armed) return;
  struct io_uring_sqe *sqe = get_sqe(s);
  io_uring_prep_read(sqe, rg->efd, &rg->wake_buf, sizeof rg->wake_buf, 0);
  sqe->user_data = wake_ud(rg);
  rg->wake_armed = true;
}

/* Submits what is queued and sleeps until a CQE or the deadline (given
** relative to now, the clock reading the caller made). Errors (-EINTR,
** -ETIME, -EBUSY...) just end the wait: the pass re-checks everything. */
static void enter_wait(ums__sched_t *s, int64_t deadline, int64_t now) {
  ums__ring_t *rg = s->ring;
  struct __kernel_timespec ts, *tsp = NULL;
  if (deadline != UMS_FOREVER) {
    int64_t d = deadline > now ? deadline - now : 0;
    ts.tv_sec = d / UMS_NSEC_PER_SEC;
    ts.tv_nsec = d % UMS_NSEC_PER_SEC;
    tsp = &ts;
  }
  struct io_uring_cqe *cqe;
  UMS__COUNT(s, io_submits);
  io_uring_submit_and_wait_timeout(&rg->ring, &cqe, 1, tsp, NULL);
  rg->budget = 0;
}

void ums__ring_wait(ums__sched_t *s, int64_t deadline, int64_t now) {
  /* With nothing of the tasks' in the ring, the passes since the last
  ** wait did not reap (ums__ring_poll), so the completion of the wake-up
  ** read may still be queued: taken here, or the read would never be
  ** armed again and every wait would end at once on it. Nothing else can
  ** be there. Whatever was reaped ends this wait without sleeping: it
  ** may be a wake-up that came after the pass looked at its lists (the
  ** poster saw idle_state 1), and sleeping now would lose it; at worst
  ** this costs one more pass. (With requests in the kernel the pass has
  ** reaped; what completed since then ends the wait at once, as
  ** before.) */
  if (s->ring->kernel_refs == 0 && reap(s) > 0) return;
  arm_wake(s);
  enter_wait(s, deadline, now);
}

void ums__ring_wake(ums__sched_t *s) {
  uint64_t one = 1;
  while (write(s->ring->efd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void ums__ring_drain(ums__sched_t *s) {
  ums__ring_t *rg = s->ring;
  submit_now(s);
  reap(s);
  after_reap(s);
  /* Every task has ended, so what is left was abandoned (or is the
  ** wake-up read): cancel it all, and again while something resists
  ** (a request that had not reached the point where it can be cancelled). */
  while (rg->kernel_refs || rg->wake_armed) {
    if (!rg->draining) {
      struct io_uring_sqe *sqe = get_sqe(s);
      io_uring_prep_cancel64(sqe, 0,
                             IORING_ASYNC_CANCEL_ANY | IORING_ASYNC_CANCEL_ALL);
      sqe->user_data = CANCEL_ALL_UD;
      rg->draining = true;
    }
    enter_wait(s, ums__clock_now() + DRAIN_RETRY_NS, ums__clock_now());
    reap(s);
    after_reap(s);
  }
  /* The last cancel-everything may still be in flight; it holds nothing. */
  while (rg->draining) {
    enter_wait(s, ums__clock_now() + DRAIN_RETRY_NS, ums__clock_now());
    reap(s);
  }
}

#else /* !UMS_HAVE_LIBURING */

/* Built without liburing: every runtime uses the pool backend. */
int ums__ring_new(ums__sched_t *s, const ums__ring_t *probe_from) {
  (void)s;
  (void)probe_from;
  return UMS_ENOSYS;
}
void ums__ring_free(ums__ring_t *rg) { (void)rg; }
bool ums__ring_supports(const ums__ring_t *rg, int op) {
  (void)rg;
  (void)op;
  return false;
}
void ums__ring_submit(ums__sched_t *s, ums__io_req_t *r) {
  (void)s;
  (void)r;
  abort();
}
void ums__ring_cancel(ums__sched_t *s, ums__io_req_t *r) {
  (void)s;
  (void)r;
  abort();
}
void ums__ring_poll(ums__sched_t *s) { (void)s; }
void ums__ring_cancel_fd(ums__sched_t *s, int fd) {
  (void)s;
  (void)fd;
}
void ums__ring_wait(ums__sched_t *s, int64_t deadline, int64_t now) {
  (void)s;
  (void)deadline;
  (void)now;
}
void ums__ring_wake(ums__sched_t *s) { (void)s; }
void ums__ring_drain(ums__sched_t *s) { (void)s; }

#endif
