/*
** io-poll.c: readiness for sockets without io_uring (the pool backend).
**
** Each scheduler owns an epoll set, touched only by its thread. A socket
** request first tries its system call without blocking (io.c, start, as
** on the ring); when the descriptor is not ready it waits here, costing
** its task's park and nothing else: no pool thread, no C stack of its
** own. The set is waited on in the scheduler's idle wait (epoll_pwait2
** instead of the futex the pool backend otherwise sleeps on), and looked
** at without waiting in the pass while requests wait, batched as the
** ring's submissions are. A
** ready descriptor's requests run their system call again on this
** thread; one that finds it not ready after all waits again.
**
** Several requests may wait on one descriptor (a reader and a writer):
** each descriptor has one record, indexed by its number, listing them,
** and is armed once for the union of their events, EPOLLONESHOT, so that
** a ready descriptor nobody waits for any more wakes nothing. The kernel
** drops a descriptor from the set at its last close; the record then only
** believes it is there, which the MOD-then-ADD below absorbs.
**
** Wake-ups from other threads (ums__sched_wake) write an eventfd that is
** in the set, the counterpart of the ring's eventfd read. The set is made
** at the scheduler's first socket request; until then its idle wait is
** the futex one.
*/
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define EVENTS_MAX 64
#define BATCH_MAX 64
#define WAKE_KEY UINT64_MAX

/* One descriptor's waiting requests. [owner] */
typedef struct pfd {
  ums_list_t reqs;       /* of ums__io_req_t.poll_link */
  bool added;        /* in the epoll set, as far as this record knows */
} pfd_t;

struct ums__poller {
  int epfd;          /* [const] */
  int efd;           /* [const] wake-up eventfd, in the set */
  pfd_t *fds;        /* [owner] by descriptor number */
  size_t nfds;       /* [owner] */
  uint32_t waiting;  /* [owner] requests in the lists */
  uint32_t budget;   /* [owner] passes before the next look */
};

int ums__poller_new(ums__sched_t *s) {
  if (ums__poller_of(s)) return 0;
  ums__poller_t *p = calloc(1, sizeof *p);
  if (!p) return UMS_ENOMEM;
  p->epfd = epoll_create1(EPOLL_CLOEXEC);
  p->efd = p->epfd < 0 ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  struct epoll_event ev = {.events = EPOLLIN, .data.u64 = WAKE_KEY};
  if (p->efd < 0 || epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->efd, &ev) != 0) {
    int e = -errno;
    ums__poller_free(p);
    return e;
  }
  /* Release: a waker that finds the scheduler idle after this (the
  ** idle_state handshake orders it) writes the set's eventfd rather than
  ** the futex (sched.c, ums__sched_wake). */
  atomic_store_explicit(&s->poller, p, memory_order_release);
  return 0;
}

void ums__poller_free(ums__poller_t *p) {
  if (!p) return;
  if (p->efd >= 0) close(p->efd);
  if (p->epfd >= 0) close(p->epfd);
  free(p->fds);
  free(p);
}

static pfd_t *record(ums__poller_t *p, int fd) {
  if ((size_t)fd >= p->nfds) {
    size_t n = p->nfds ? p->nfds : 64;
    while (n <= (size_t)fd) n *= 2;
    pfd_t *v = realloc(p->fds, n * sizeof *v);
    if (!v) return NULL;
    memset(v + p->nfds, 0, (n - p->nfds) * sizeof *v);
    p->fds = v;
    p->nfds = n;
  }
  return &p->fds[fd];
}

#define REQ(l) UMS_LIST_ENTRY(l, ums__io_req_t, poll_link)

static void unlink_req(ums__poller_t *p, pfd_t *d, ums__io_req_t *r) {
  ums_list_remove(&d->reqs, &r->poll_link);
  p->waiting--;
}

/* Arms d for what its requests wait for. Returns 0 or -errno. */
static int arm(ums__poller_t *p, int fd, pfd_t *d) {
  uint32_t want = 0;
  for (ums__io_req_t *r = REQ(d->reqs.head); r; r = REQ(r->poll_link.next))
    want |= ums__net_events(r);
  struct epoll_event ev = {.events = want | EPOLLONESHOT,
                           .data.u64 = (uint64_t)fd};
  int op = d->added ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
  int rc = epoll_ctl(p->epfd, op, fd, &ev);
  /* The set dropped it at a close, or holds it from before the record
  ** was reset: the other operation. */
  if (rc != 0 && ((op == EPOLL_CTL_MOD && errno == ENOENT) ||
                  (op == EPOLL_CTL_ADD && errno == EEXIST)))
    rc = epoll_ctl(p->epfd, op == EPOLL_CTL_MOD ? EPOLL_CTL_ADD
                                                : EPOLL_CTL_MOD,
                   fd, &ev);
  if (rc != 0) return -errno;
  d->added = true;
  return 0;
}

/* Runs again every request on d that ev may have made ready, completing
** those that are done, and arms d again for the rest. err: the
** descriptor cannot be waited on (epoll_ctl's error): the requests that
** are still not ready end with it. */
static void dispatch(ums__poller_t *p, int fd, pfd_t *d, uint32_t ev,
                     int err) {
  ums__io_req_t *next;
  for (ums__io_req_t *r = REQ(d->reqs.head); r; r = next) {
    next = REQ(r->poll_link.next);
    if (!err && !(ev & (ums__net_events(r) | EPOLLERR | EPOLLHUP)))
      continue;
    int64_t res = ums__net_try(r);
    if (res == UMS__NET_WAIT) {
      if (!err) continue;
      res = err;
    }
    unlink_req(p, d, r);
    ums__io_complete(r, res);
  }
  if (!ums_list_empty(&d->reqs) && !err) {
    int e = arm(p, fd, d);
    if (e) dispatch(p, fd, d, 0, e);
  }
}

void ums__poller_submit(ums__sched_t *s, ums__io_req_t *r) {
  ums__poller_t *p = ums__poller_of(s);
  pfd_t *d = record(p, r->fd);
  if (!d) {
    ums__io_complete(r, UMS_ENOMEM);
    return;
  }
  ums_list_push_front(&d->reqs, &r->poll_link);
  p->waiting++;
  int e = arm(p, r->fd, d);
  if (e) dispatch(p, r->fd, d, 0, e);
}

void ums__poller_cancel(ums__sched_t *s, ums__io_req_t *r) {
  ums__poller_t *p = ums__poller_of(s);
  /* Completed meanwhile (and so unlinked): nothing is left to stop. */
  pfd_t *d = (size_t)r->fd < p->nfds ? &p->fds[r->fd] : NULL;
  bool linked = false;
  if (d)
    for (ums_link_t *x = d->reqs.head; x && !linked; x = x->next)
      linked = x == &r->poll_link;
  if (!linked) return;
  unlink_req(p, d, r);
  /* The caller has marked r abandoned: this drops the operation's
  ** reference and whatever a result would hold. */
  ums__io_complete(r, UMS_ECANCELED);
}

void ums__poller_forget(ums__sched_t *s, int fd) {
  ums__poller_t *p = ums__poller_of(s);
  if (fd < 0 || (size_t)fd >= p->nfds) return;
  pfd_t *d = &p->fds[fd];
  if (d->added) epoll_ctl(p->epfd, EPOLL_CTL_DEL, fd, NULL);
  d->added = false;
  ums__io_req_t *r;
  while ((r = REQ(d->reqs.head)) != NULL) {
    unlink_req(p, d, r);
    ums__io_complete(r, UMS_EBADF);
  }
}

static void drain_wake(ums__poller_t *p) {
  uint64_t v;
  while (read(p->efd, &v, sizeof v) < 0 && errno == EINTR) {
  }
}

/* Handles what one epoll_wait returned. */
static void handle(ums__poller_t *p, const struct epoll_event *evs, int n) {
  for (int i = 0; i < n; i++) {
    uint64_t key = evs[i].data.u64;
    if (key == WAKE_KEY) {
      drain_wake(p);
      continue;
    }
    int fd = (int)key;
    if ((size_t)fd < p->nfds && !ums_list_empty(&p->fds[fd].reqs))
      dispatch(p, fd, &p->fds[fd], evs[i].events, 0);
  }
}

void ums__poller_poll(ums__sched_t *s) {
  ums__poller_t *p = ums__poller_of(s);
  if (p->waiting == 0) return;
  /* Like the ring's batch: a busy scheduler looks once per round of its
  ** run queue, an idle one at once (its idle wait follows). */
  if (p->budget > 0 && s->runq_n > 0) {
    p->budget--;
    return;
  }
  struct epoll_event evs[EVENTS_MAX];
  int n = epoll_wait(p->epfd, evs, EVENTS_MAX, 0);
  if (n > 0) handle(p, evs, n);
  p->budget = s->runq_n < BATCH_MAX ? s->runq_n : BATCH_MAX;
}

void ums__poller_wait(ums__sched_t *s, int64_t deadline, int64_t now) {
  ums__poller_t *p = ums__poller_of(s);
  struct timespec ts, *tsp = NULL;
  if (deadline != UMS_FOREVER) {
    int64_t d = deadline > now ? deadline - now : 0;
    ts.tv_sec = d / UMS_NSEC_PER_SEC;
    ts.tv_nsec = d % UMS_NSEC_PER_SEC;
    tsp = &ts;
  }
  struct epoll_event evs[EVENTS_MAX];
  int n = epoll_pwait2(p->epfd, evs, EVENTS_MAX, tsp, NULL);
  if (n < 0 && errno == ENOSYS) {
    /* Before Linux 5.11: milliseconds, rounded up so as not to wake
    ** before the timer. */
    int ms = -1;
    if (tsp) {
      int64_t d = deadline > now ? deadline - now : 0;
      int64_t m = (d + UMS_NSEC_PER_MSEC - 1) / UMS_NSEC_PER_MSEC;
      ms = m > 1000000 ? 1000000 : (int)m;
    }
    n = epoll_wait(p->epfd, evs, EVENTS_MAX, ms);
  }
  /* Errors (EINTR) just end the wait: the pass looks at everything. */
  if (n > 0) handle(p, evs, n);
  p->budget = 0;
}

void ums__poller_wake(ums__sched_t *s) {
  uint64_t one = 1;
  ums__poller_t *p = atomic_load_explicit(&s->poller, memory_order_acquire);
  while (write(p->efd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}
