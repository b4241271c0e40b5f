/*
** net.c: sockets (ums.h, "Sockets") and readiness waits (ums_wait_fd).
**
** A socket operation is an I/O request like a file's (io.c): the same
** struct, the same start/collect halves, the same one-outcome CAS and the
** same reference rules, so timeouts, cancellation and the deferred form
** work as they do for files. Only where the operation waits differs:
**
**   backend      how the operation waits           who completes it
**   io-uring.c   non-blocking system call, then    s's pass, reaping the
**                the kernel's socket opcodes       CQE
**                (ACCEPT, CONNECT, RECV, SEND,
**                RECVMSG, SENDMSG, POLL_ADD)
**   io-poll.c    non-blocking system call, then    s's pass or idle wait,
**                readiness from s's epoll set      retrying the call
**   host thread  non-blocking system call, then    the calling thread
**                poll(2) up to the deadline
**
** In a task the first, non-blocking call is io.c's (start), the same for
** both backends: a ready socket answers there, without the kernel's
** queue or the epoll set, and the deferred form then leaves no park at
** all (its _begin returns 1).
**
** Every socket this file makes is non-blocking (SOCK_NONBLOCK, also for
** accepted ones), which the readiness backend needs and io_uring does not
** mind: its socket opcodes wait for readiness in the kernel whatever the
** file's flags. Sends carry MSG_NOSIGNAL, so a peer that has gone makes
** a send fail with EPIPE instead of raising SIGPIPE.
**
** The calls that never wait (socket, bind, listen, shutdown, the options
** and names) are the plain system calls on the calling thread.
*/
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ThreadSanitizer keeps a record per descriptor number, made by the
** intercepted call that creates a descriptor and dropped by close(2).
** The ring accepts and closes sockets where it cannot see, so a number
** the ring gave to an accepted socket may still carry the record of an
** earlier descriptor of another thread, and the scheduler's first
** intercepted recv or send on it would be reported as a race with that
** thread. Under TSan the sends and receives go around its interceptors;
** everywhere else they are the libc calls. */
#if defined(UMS_TSAN)
#include <sys/syscall.h>
#define SOCK_RECV(fd, b, n, fl) \
  syscall(SYS_recvfrom, (fd), (b), (n), (fl), NULL, NULL)
#define SOCK_SEND(fd, b, n, fl) \
  syscall(SYS_sendto, (fd), (b), (n), (fl), NULL, 0)
#define SOCK_RECVMSG(fd, m, fl) syscall(SYS_recvmsg, (fd), (m), (fl))
#define SOCK_SENDMSG(fd, m, fl) syscall(SYS_sendmsg, (fd), (m), (fl))
#else
#define SOCK_RECV recv
#define SOCK_SEND send
#define SOCK_RECVMSG recvmsg
#define SOCK_SENDMSG sendmsg
#endif

/* ---------------------------------------------------------------------- */
/* The system calls                                                        */
/* ---------------------------------------------------------------------- */

/* Every system call here is retried after EINTR: none of them has done
** anything when it fails so (a connect that was interrupted goes on in
** the background, which the EALREADY case below covers). */
#define NOINTR(expr)                                   \
  __extension__({                                      \
    long rv_;                                          \
    do rv_ = (long)(expr);                             \
    while (rv_ < 0 && errno == EINTR);                 \
    rv_ < 0 ? (int64_t)(errno == EWOULDBLOCK ? -EAGAIN \
                                             : -errno) \
            : (int64_t)rv_;                            \
  })

uint32_t ums__net_events(const ums__io_req_t *r) {
  switch (r->op) {
    case UMS__IO_ACCEPT: case UMS__IO_RECV: case UMS__IO_RECVMSG:
      return POLLIN;
    case UMS__IO_CONNECT: case UMS__IO_SEND: case UMS__IO_SENDMSG:
      return POLLOUT;
    default:
      return r->events;
  }
}

/* "Not ready" for every call but connect, whose EAGAIN (a Unix
** listener's full backlog) is its result. */
static int64_t wait_if_again(int64_t rc) {
  return rc == -EAGAIN ? UMS__NET_WAIT : rc;
}

/* One send that does not wait: bytes sent, UMS_EAGAIN when the socket
** has no room, or the error. */
static int64_t send_nowait(int fd, const void *data, size_t len, int flags) {
  return NOINTR(SOCK_SEND(fd, data, len, flags | MSG_DONTWAIT | MSG_NOSIGNAL));
}

/* A non-blocking connect in progress has ended when the socket is
** writable; SO_ERROR then says how. */
static int64_t connect_result(ums__io_req_t *r) {
  struct pollfd p = {r->fd, POLLOUT, 0};
  int64_t n = NOINTR(poll(&p, 1, 0));
  if (n < 0) return n;
  if (n == 0) return UMS__NET_WAIT;
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(r->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
    return -errno;
  r->connecting = false;
  return -err;
}

/* ---------------------------------------------------------------------- */
/* Receives that take their buffer                                         */
/* ---------------------------------------------------------------------- */

/* A connection that waits for its peer (a server's idle keep-alive
** connection, a client waiting for a reply) must not hold a read buffer
** while it waits: with thousands of them the buffers' touched pages
** would be most of the server's memory. So a receive may leave the
** buffer to the runtime (ums_net_recv_take): the request carries no
** buffer while it waits, and each try (the first one at the call, the
** one after the ring's poll or the epoll set's readiness, the pool's)
** takes a buffer of the asked length from its thread's cache, receives
** into it, and keeps it in the request (bufs[0], iov[0]) only when data
** came; otherwise the buffer goes back at once. A try is made at most
** once per readiness, so a waiting request never holds one. The caller
** takes the buffer from a request that ended with data
** (ums_net_recv_take_end); one whose caller has gone frees it with the
** request.
**
** What came and fits in the smallest class (TAKE_SMALL) moves to a
** buffer of that class, and the big one goes back to the cache at once:
** a scheduler that reaps many ready receives in one pass, each kept
** until its task runs, then holds that many small buffers instead of as
** many big ones (more of those than the cache keeps would go to malloc
** and free on every pass), and the kernel copies every receive into the
** big buffer at the cache's head, the same few cache lines each time.
** It is one receive of the asked length all the same, so a datagram is
** never cut short. */
#define TAKE_SMALL ((size_t)1 << UMS__BUF_MIN_SHIFT)

static int64_t recv_taking(ums__io_req_t *r) {
  size_t len = r->iov[0].iov_len;
  ums_buf_t *b = ums_buf_new(len);
  if (!b) return UMS_ENOMEM;
  int64_t rc = wait_if_again(NOINTR(SOCK_RECV(r->fd, ums_buf_data(b), len,
                                              r->flags | MSG_DONTWAIT)));
  if (rc <= 0) {
    ums_buf_release(b);
    return rc;
  }
  if ((size_t)rc <= TAKE_SMALL && len > TAKE_SMALL) {
    /* Out of memory for the small one, the big one serves. */
    ums_buf_t *small = ums_buf_new(TAKE_SMALL);
    if (small) {
      memcpy(ums_buf_data(small), ums_buf_data(b), (size_t)rc);
      ums_buf_release(b);
      b = small;
    }
  }
  r->bufs[0] = b;
  r->iov[0].iov_base = ums_buf_data(b);
  return rc;
}

int64_t ums__net_try(ums__io_req_t *r) {
  const struct iovec *v = r->iov;
  switch (r->op) {
    case UMS__IO_ACCEPT:
      r->addrlen = sizeof r->addr;
      return wait_if_again(NOINTR(accept4(r->fd, (struct sockaddr *)&r->addr,
                                          &r->addrlen,
                                          SOCK_CLOEXEC | SOCK_NONBLOCK)));
    case UMS__IO_CONNECT: {
      if (r->connecting) return connect_result(r);
      int64_t rc = NOINTR(connect(r->fd, (struct sockaddr *)&r->addr,
                                  r->addrlen));
      /* In progress: EINPROGRESS at first, EALREADY when an interrupted
      ** attempt (EINTR above) goes on in the background. */
      if (rc == -EINPROGRESS || rc == -EALREADY) {
        r->connecting = true;
        return UMS__NET_WAIT;
      }
      return rc;
    }
    case UMS__IO_RECV:
      if (r->take_buf) return recv_taking(r);
      return wait_if_again(NOINTR(SOCK_RECV(r->fd, v->iov_base, v->iov_len,
                                            r->flags | MSG_DONTWAIT)));
    case UMS__IO_SEND:
      return wait_if_again(send_nowait(r->fd, v->iov_base, v->iov_len,
                                       r->flags));
    case UMS__IO_RECVMSG:
      r->msg.msg_namelen = sizeof r->addr;
      return wait_if_again(
          NOINTR(SOCK_RECVMSG(r->fd, &r->msg, r->flags | MSG_DONTWAIT)));
    case UMS__IO_SENDMSG:
      return wait_if_again(NOINTR(SOCK_SENDMSG(
          r->fd, &r->msg, r->flags | MSG_DONTWAIT | MSG_NOSIGNAL)));
    case UMS__IO_POLL: {
      struct pollfd p = {r->fd, (short)r->events, 0};
      int64_t n = NOINTR(poll(&p, 1, 0));
      if (n < 0) return n;
      if (p.revents & POLLNVAL) return UMS_EBADF;
      return n ? p.revents : UMS__NET_WAIT;
    }
    default:
      return UMS_EINVAL;
  }
}

int64_t ums__net_exec(ums__io_req_t *r) {
  for (;;) {
    int64_t res = ums__net_try(r);
    if (res != UMS__NET_WAIT) return res;
    int ms = -1;
    if (r->deadline != UMS_FOREVER) {
      int64_t left = r->deadline - ums__clock_now();
      if (left <= 0) return UMS_ETIMEDOUT;
      /* Rounded up: waking before the deadline would only wait again. */
      int64_t m = (left + UMS_NSEC_PER_MSEC - 1) / UMS_NSEC_PER_MSEC;
      ms = m > 1000000 ? 1000000 : (int)m;
    }
    struct pollfd p = {r->fd, (short)ums__net_events(r), 0};
    if (poll(&p, 1, ms) < 0 && errno == EINTR &&
        ums__pool_interrupted(&r->work))
      /* On the I/O pool: the caller gave up and the pool interrupted us. */
      return UMS_ECANCELED;
  }
}

/* ---------------------------------------------------------------------- */
/* Receives that wait first                                                */
/* ---------------------------------------------------------------------- */

/* A receive is tried at once (io.c, try_first) so that a socket that is
** ready answers without any wait. In an exchange of requests and answers
** (an echo, a remote call, HTTP keep-alive), though, the receive that
** follows a send almost never finds the answer there yet: its try is a
** system call made only to learn EAGAIN, and the call then waits for
** readiness all the same. So each scheduler keeps, per descriptor
** number, a level learned from its receives there: a receive that was
** tried, found nothing and then got its data by waiting raises it (up to
** HINT_LEVEL_MAX), and the next 2^level - 1 receives on the descriptor go
** straight to the readiness wait (the ring's poll, the epoll set), whose
** check costs no system call of its own; a try that answers sets it back
** to 0. A descriptor read in exchanges then spends one try in
** 2^HINT_LEVEL_MAX receives, and one read as a stream, which every try
** answers, one trip through the wait when its reader catches up. A
** receive whose deadline is near (or past: LuaSocket's non-blocking mode)
** always tries, so data there at the call is never reported as a
** timeout. Near is judged against the latest clock reading made on the
** scheduler's thread (sched.clock_seen) rather than a reading of its own:
** a deadline is computed from the clock just before its call
** (ums_deadline: the binding's per-call timeouts, LuaSocket's zero), so
** that reading is at most the deadline's own timeout behind it, and a
** timeout under 2 ms is near however long the task ran since. A deadline
** computed long before its receive may have passed unseen; its receive
** then waits first and may end at its deadline with the data unread. It
** is a hint only, never a result: a number reused by another
** socket inherits a level that costs it a few waits at most, and a close
** through the runtime (cancel_fd) clears it.
**
** A hint is a byte: the level in bits 4-6, the receives left to wait
** first in bits 0-3. */
#define HINT_LEVEL_MAX 4
#define HINT_LEFT 15u
#define HINT_NEAR_NS (2 * UMS_NSEC_PER_MSEC)

static bool hinted_op(int op) {
  return op == UMS__IO_RECV || op == UMS__IO_RECVMSG;
}

bool ums__net_wait_first(ums__sched_t *s, const ums__io_req_t *r,
                         int64_t deadline) {
  if (!hinted_op(r->op) || (uint32_t)r->fd >= s->net_nhints) return false;
  uint8_t *h = &s->net_hints[r->fd];
  if ((*h & HINT_LEFT) == 0) return false;
  if (deadline != UMS_FOREVER && deadline - s->clock_seen < HINT_NEAR_NS)
    return false;
  (*h)--;
  return true;
}

void ums__net_tried(ums__sched_t *s, ums__io_req_t *r, int64_t res) {
  if (!hinted_op(r->op)) return;
  if (res == UMS__NET_WAIT)
    r->net_learn = true;
  else if ((uint32_t)r->fd < s->net_nhints)
    s->net_hints[r->fd] = 0;
}

void ums__net_waited(ums__sched_t *s, const ums__io_req_t *r, int64_t res) {
  /* Only data (or the end of the stream) teaches: a timeout or a cancel
  ** says nothing about the next exchange. */
  if (res < 0 || r->fd < 0) return;
  uint32_t fd = (uint32_t)r->fd;
  if (fd >= s->net_nhints) {
    uint32_t n = s->net_nhints ? s->net_nhints : 64;
    while (n <= fd) n *= 2;
    uint8_t *v = realloc(s->net_hints, n);
    if (!v) return;  /* a hint lost, nothing else */
    memset(v + s->net_nhints, 0, n - s->net_nhints);
    s->net_hints = v;
    s->net_nhints = n;
  }
  unsigned level = s->net_hints[fd] >> 4;
  if (level < HINT_LEVEL_MAX) level++;
  s->net_hints[fd] = (uint8_t)(level << 4 | ((1u << level) - 1));
}

/* ---------------------------------------------------------------------- */
/* Building requests                                                       */
/* ---------------------------------------------------------------------- */

/* A socket request on fd with one buffer range (buf may be NULL for
** accept, connect and poll), flags, and an address to copy (connect,
** sendto). */
static int mk_net(ums__io_req_t **out, int op, int fd, ums_buf_t *buf,
                  size_t pos, size_t len, int flags,
                  const struct sockaddr *addr, socklen_t addrlen,
                  int64_t deadline) {
  if (fd < 0) return UMS_EBADF;
  if (addr && addrlen > sizeof(struct sockaddr_storage)) return UMS_EINVAL;
  ums__io_req_t *r = ums__io_req_new(op);
  if (!r) return UMS_ENOMEM;
  if (op != UMS__IO_ACCEPT && op != UMS__IO_CONNECT && op != UMS__IO_POLL) {
    if (len > UMS_FS_MAX_RW) len = UMS_FS_MAX_RW;
    ums_iov_t v = {buf, pos, len};
    int rc = ums__io_req_iov(r, &v, 1);
    if (rc) {
      ums__io_req_unref(r);
      return rc;
    }
  }
  r->fd = fd;
  r->flags = flags;
  r->deadline = deadline;
  if (addr) {
    memcpy(&r->addr, addr, addrlen);
    r->addrlen = addrlen;
  }
  if (op == UMS__IO_RECVMSG || op == UMS__IO_SENDMSG) {
    memset(&r->msg, 0, sizeof r->msg);
    r->msg.msg_iov = r->iov;
    r->msg.msg_iovlen = 1;
    r->msg.msg_name = &r->addr;
    r->msg.msg_namelen = op == UMS__IO_SENDMSG ? r->addrlen
                                               : sizeof r->addr;
    /* sendto without an address: a connected socket's peer. */
    if (op == UMS__IO_SENDMSG && !addr) r->msg.msg_name = NULL;
  }
  *out = r;
  return 0;
}

/* A receive of up to len bytes whose buffer its tries take
** (recv_taking): one iovec entry without a buffer until data comes. */
static int mk_recv_take(ums__io_req_t **out, int fd, size_t len, int flags,
                        int64_t deadline) {
  if (fd < 0) return UMS_EBADF;
  if (len == 0) return UMS_EINVAL;
  ums__io_req_t *r = ums__io_req_new(UMS__IO_RECV);
  if (!r) return UMS_ENOMEM;
  r->iov = r->iov_inline;
  r->bufs = r->bufs_inline;
  r->iov[0].iov_base = NULL;
  r->iov[0].iov_len = len > UMS_FS_MAX_RW ? UMS_FS_MAX_RW : len;
  r->bufs[0] = NULL;
  r->iovcnt = 1;
  r->take_buf = true;
  r->fd = fd;
  r->flags = flags;
  r->deadline = deadline;
  *out = r;
  return 0;
}

/* The buffer of a receive that took it, for its caller: r's when res
** says data came, else NULL. The caller holds a reference on r. */
static ums_buf_t *take_out(ums__io_req_t *r, int64_t res) {
  if (res <= 0) return NULL;
  ums_buf_t *b = r->bufs[0];
  r->bufs[0] = NULL;
  return b;
}

/* Copies the address an accept or a recvfrom received to the caller: at
** most *len bytes, *len set to the address's whole length, as accept(2)
** does. */
static void addr_out(const ums__io_req_t *r, struct sockaddr *addr,
                     socklen_t *len) {
  if (!addr || !len) return;
  socklen_t have = r->op == UMS__IO_RECVMSG ? r->msg.msg_namelen
                                            : r->addrlen;
  memcpy(addr, &r->addr, have < *len ? have : *len);
  *len = have;
}

/* The blocking form of every waiting call: runs r, copies the address on
** success, drops the caller's reference. */
static int64_t net_run(ums__io_req_t *r, struct sockaddr *addr,
                       socklen_t *len) {
  int64_t res = ums__io_run(r, r->deadline);
  if (res >= 0) addr_out(r, addr, len);
  ums__io_req_unref(r);
  return res;
}

/* ---------------------------------------------------------------------- */
/* The public calls                                                        */
/* ---------------------------------------------------------------------- */

#define SYS(expr) ((expr) < 0 ? -errno : 0)

int ums_net_socket(int domain, int type, int protocol) {
  int fd = socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol);
  return fd < 0 ? -errno : fd;
}

int ums_net_bind(int fd, const struct sockaddr *addr, socklen_t len) {
  return SYS(bind(fd, addr, len));
}

int ums_net_listen(int fd, int backlog) { return SYS(listen(fd, backlog)); }

int ums_net_shutdown(int fd, int how) { return SYS(shutdown(fd, how)); }

int ums_net_getsockopt(int fd, int level, int name, void *val,
                       socklen_t *len) {
  return SYS(getsockopt(fd, level, name, val, len));
}

int ums_net_setsockopt(int fd, int level, int name, const void *val,
                       socklen_t len) {
  return SYS(setsockopt(fd, level, name, val, len));
}

int ums_net_getsockname(int fd, struct sockaddr *addr, socklen_t *len) {
  return SYS(getsockname(fd, addr, len));
}

int ums_net_getpeername(int fd, struct sockaddr *addr, socklen_t *len) {
  return SYS(getpeername(fd, addr, len));
}

/* Ends scheduler s's requests on fd with UMS_EBADF: on the ring, by a
** cancel of every request on fd (their completions, -ECANCELED, are
** reported as UMS_EBADF); in the epoll set, at once. */
static void cancel_fd(ums__sched_t *s, int fd) {
  if ((uint32_t)fd < s->net_nhints) s->net_hints[fd] = 0;
  if (s->ring) ums__ring_cancel_fd(s, fd);
  if (ums__poller_of(s)) ums__poller_forget(s, fd);
}

int ums_net_cancel(int fd) {
  if (fd < 0) return UMS_EBADF;
  if (!ums__task_current()) return UMS_EPERM;
  cancel_fd(ums__sched_current(), fd);
  return 0;
}

/* Whether s may close fd at once, on its own thread: on the epoll
** backend close(2) of a socket returns at once unless SO_LINGER holds it
** for a time; only then is it worth a trip to the I/O pool. On the ring
** the close is the ring's, after the cancel. */
static bool close_at_once(ums__sched_t *s, int fd) {
  if (!ums__poller_of(s)) return false;
  struct linger lg = {0, 0};
  socklen_t len = sizeof lg;
  return getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &len) != 0 ||
         !lg.l_onoff || lg.l_linger == 0;
}

int ums_net_close(int fd, int64_t deadline) {
  if (fd < 0) return UMS_EBADF;
  /* This scheduler's requests on fd end with UMS_EBADF: the epoll set
  ** forgets a descriptor at its last close, and its waiters would wait
  ** for ever; an operation in the ring would keep the socket open. */
  ums__sched_t *s = ums__task_current() ? ums__sched_current() : NULL;
  if (s) {
    cancel_fd(s, fd);
    if (close_at_once(s, fd))
      return close(fd) == 0 || errno == EINTR ? 0 : -errno;
  }
  return ums_fs_close(fd, deadline);
}

int ums_net_close_begin(int fd, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  if (fd < 0) return UMS_EBADF;
  if (!ums__task_current()) return UMS_EPERM;
  ums__sched_t *s = ums__sched_current();
  cancel_fd(s, fd);
  if (close_at_once(s, fd))
    return close(fd) == 0 || errno == EINTR ? 1 : -errno;
  return ums_fs_close_begin(fd, deadline, req);
}

int ums_net_accept(int fd, struct sockaddr *addr, socklen_t *len,
                   int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_net(&r, UMS__IO_ACCEPT, fd, NULL, 0, 0, 0, NULL, 0, deadline);
  return rc ? rc : (int)net_run(r, addr, len);
}

/* A Unix stream listener whose backlog is full makes a non-blocking
** connect fail with EAGAIN, and nothing tells when to try again: poll(2)
** says such a socket is writable at once. A blocking connect(2) would
** wait in the kernel; here the task sleeps a little, longer each time,
** and tries again, up to its deadline. */
#define CONNECT_RETRY_MIN (UMS_NSEC_PER_MSEC / 2)
#define CONNECT_RETRY_MAX (16 * UMS_NSEC_PER_MSEC)

int ums_net_connect(int fd, const struct sockaddr *addr, socklen_t len,
                    int64_t deadline) {
  if (!addr) return UMS_EINVAL;
  for (int64_t pause = CONNECT_RETRY_MIN;; pause *= 2) {
    ums__io_req_t *r;
    int rc = mk_net(&r, UMS__IO_CONNECT, fd, NULL, 0, 0, 0, addr, len,
                    deadline);
    if (!rc) rc = (int)net_run(r, NULL, NULL);
    if (rc != UMS_EAGAIN || addr->sa_family != AF_UNIX) return rc;
    if (pause > CONNECT_RETRY_MAX) pause = CONNECT_RETRY_MAX;
    int64_t now = ums_now();
    if (deadline != UMS_FOREVER && now >= deadline) return UMS_ETIMEDOUT;
    int64_t until = deadline != UMS_FOREVER && deadline - now < pause
                        ? deadline
                        : now + pause;
    rc = ums_sleep_until(until);
    if (rc) return rc;
  }
}

int64_t ums_net_recv(int fd, ums_buf_t *buf, size_t pos, size_t len,
                     int flags, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_net(&r, UMS__IO_RECV, fd, buf, pos, len, flags, NULL, 0,
                  deadline);
  return rc ? rc : net_run(r, NULL, NULL);
}

int64_t ums_net_recv_take(int fd, size_t len, int flags, int64_t deadline,
                          ums_buf_t **buf) {
  if (!buf) return UMS_EINVAL;
  *buf = NULL;
  ums__io_req_t *r;
  int rc = mk_recv_take(&r, fd, len, flags, deadline);
  if (rc) return rc;
  int64_t res = ums__io_run(r, deadline);
  *buf = take_out(r, res);
  ums__io_req_unref(r);
  return res;
}

int64_t ums_net_send(int fd, ums_buf_t *buf, size_t pos, size_t len,
                     int flags, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_net(&r, UMS__IO_SEND, fd, buf, pos, len, flags, NULL, 0,
                  deadline);
  return rc ? rc : net_run(r, NULL, NULL);
}

int64_t ums_net_recvfrom(int fd, ums_buf_t *buf, size_t pos, size_t len,
                         int flags, struct sockaddr *addr, socklen_t *alen,
                         int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_net(&r, UMS__IO_RECVMSG, fd, buf, pos, len, flags, NULL, 0,
                  deadline);
  return rc ? rc : net_run(r, addr, alen);
}

int64_t ums_net_sendto(int fd, ums_buf_t *buf, size_t pos, size_t len,
                       int flags, const struct sockaddr *addr,
                       socklen_t alen, int64_t deadline) {
  ums__io_req_t *r;
  int rc = mk_net(&r, UMS__IO_SENDMSG, fd, buf, pos, len, flags, addr, alen,
                  deadline);
  return rc ? rc : net_run(r, NULL, NULL);
}

int ums_wait_fd(int fd, int events, int64_t deadline) {
  if (!(events & (POLLIN | POLLOUT | POLLPRI))) return UMS_EINVAL;
  ums__io_req_t *r;
  int rc = mk_net(&r, UMS__IO_POLL, fd, NULL, 0, 0, 0, NULL, 0, deadline);
  if (rc) return rc;
  r->events = (uint32_t)events;
  return (int)net_run(r, NULL, NULL);
}

/* ---------------------------------------------------------------------- */
/* The deferred form                                                       */
/* ---------------------------------------------------------------------- */

int ums_net_accept_begin(int fd, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_net(&r, UMS__IO_ACCEPT, fd, NULL, 0, 0, 0, NULL, 0, deadline);
  return rc ? rc : ums__io_begin(r, deadline, req);
}

int ums_net_connect_begin(int fd, const struct sockaddr *addr, socklen_t len,
                          int64_t deadline, ums_fs_req_t **req) {
  if (!req || !addr) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_net(&r, UMS__IO_CONNECT, fd, NULL, 0, 0, 0, addr, len,
                  deadline);
  return rc ? rc : ums__io_begin(r, deadline, req);
}

int ums_net_recv_begin(int fd, ums_buf_t *buf, size_t pos, size_t len,
                       int flags, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_net(&r, UMS__IO_RECV, fd, buf, pos, len, flags, NULL, 0,
                  deadline);
  return rc ? rc : ums__io_begin(r, deadline, req);
}

int ums_net_recv_take_begin(int fd, size_t len, int flags, int64_t deadline,
                            ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_recv_take(&r, fd, len, flags, deadline);
  return rc ? rc : ums__io_begin(r, deadline, req);
}

int ums_net_send_begin(int fd, ums_buf_t *buf, size_t pos, size_t len,
                       int flags, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_net(&r, UMS__IO_SEND, fd, buf, pos, len, flags, NULL, 0,
                  deadline);
  return rc ? rc : ums__io_begin(r, deadline, req);
}

int64_t ums_net_send_now(int fd, const void *data, size_t len, int flags) {
  ums__task_t *t = ums__task_current();
  if (!t) return UMS_EPERM;
  /* As at the try of a request's start (io.c): a cancelled task sends
  ** nothing. */
  int rc = ums__park_may_begin(t, 0);
  if (rc) return rc;
  int64_t n = send_nowait(fd, data, len, flags);
  if (n != UMS_EAGAIN) UMS__COUNT(t->sched, io_requests);
  return n;
}

int ums_net_recvfrom_begin(int fd, ums_buf_t *buf, size_t pos, size_t len,
                           int flags, int64_t deadline, ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_net(&r, UMS__IO_RECVMSG, fd, buf, pos, len, flags, NULL, 0,
                  deadline);
  return rc ? rc : ums__io_begin(r, deadline, req);
}

int ums_net_sendto_begin(int fd, ums_buf_t *buf, size_t pos, size_t len,
                         int flags, const struct sockaddr *addr,
                         socklen_t alen, int64_t deadline,
                         ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_net(&r, UMS__IO_SENDMSG, fd, buf, pos, len, flags, addr, alen,
                  deadline);
  return rc ? rc : ums__io_begin(r, deadline, req);
}

int ums_wait_fd_begin(int fd, int events, int64_t deadline,
                      ums_fs_req_t **req) {
  if (!req) return UMS_EINVAL;
  if (!(events & (POLLIN | POLLOUT | POLLPRI))) return UMS_EINVAL;
  ums__io_req_t *r = NULL;
  int rc = mk_net(&r, UMS__IO_POLL, fd, NULL, 0, 0, 0, NULL, 0, deadline);
  if (rc) return rc;
  r->events = (uint32_t)events;
  return ums__io_begin(r, deadline, req);
}

int64_t ums_net_end(ums_fs_req_t *req, struct sockaddr *addr,
                    socklen_t *len) {
  if (!req) return UMS_EINVAL;
  if (!ums__io_is_net(req->op)) return UMS_EINVAL;
  /* The address is read once the request is settled, before the
  ** caller's reference goes. An end refused leaves the request alone. */
  int64_t res;
  int rc = ums__io_settle(req, &res);
  if (rc) return rc;
  if (res >= 0) addr_out(req, addr, len);
  ums__io_req_unref(req);
  return res;
}

int64_t ums_net_recv_take_end(ums_fs_req_t *req, ums_buf_t **buf) {
  if (!req || !buf || !req->take_buf) return UMS_EINVAL;
  *buf = NULL;
  /* As ums_net_end: the buffer is taken from the settled request. */
  int64_t res;
  int rc = ums__io_settle(req, &res);
  if (rc) return rc;
  *buf = take_out(req, res);
  ums__io_req_unref(req);
  return res;
}
