/*
** test_net.c: sockets (net.c) and readiness waits (ums_wait_fd) on the
** backend in force. ctest runs it as test_net (io_uring where the kernel
** allows it), test_net_pool (UMS_IO=pool: epoll readiness), and under
** strace: io_uring_setup failing (ENOSYS: the runtime falls back to the
** pool backend) and system calls interrupted (EINTR) on either backend.
** --expect-backend=uring|pool fails the run if the runtime chose
** otherwise; --quick runs the subset the strace runs use.
**
** Addresses are local only: 127.0.0.1, ::1 and Unix paths in a temporary
** directory. Every wait has a generous bound; nothing measures speed.
*/
#include "internal.h"
#include "test-util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/un.h>

#define PTR(x) ((void *)(uintptr_t)(x))
#define SEC UMS_NSEC_PER_SEC

static char dir[200];
static int expect_backend = -1;
static ums_runtime_t *rt;
static int unix_seq;

static ums_task_t spawn_on(int sched, ums_task_fn fn, void *arg) {
  return tu_spawn_named(rt, sched % ums_runtime_schedulers(rt), "net", fn,
                        arg);
}

static void *join(ums_task_t t) {
  void *res = NULL;
  int status = 1;
  CHECK_RC(ums_task_join(rt, t, ums_deadline(60 * SEC), &res, &status), 0);
  CHECK_RC(status, 0);
  return res;
}

static uint64_t io_pending(void) { return tu_stats_sum(rt, io_pending); }

/* ====================================================================== */
/* Addresses                                                               */
/* ====================================================================== */

/* One local address of a family, with port 0 (or a fresh Unix path) for
** a listener to bind; after the bind, the address to connect to. */
typedef struct addr {
  int family;
  struct sockaddr_storage ss;
  socklen_t len;
} addr_t;

static const int families[] = {AF_INET, AF_INET6, AF_UNIX};

static const char *family_name(int f) {
  return f == AF_INET ? "127.0.0.1" : f == AF_INET6 ? "::1" : "unix";
}

static addr_t local_addr(int family) {
  addr_t a = {.family = family};
  memset(&a.ss, 0, sizeof a.ss);
  if (family == AF_INET) {
    struct sockaddr_in *s = (struct sockaddr_in *)&a.ss;
    s->sin_family = AF_INET;
    s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.len = sizeof *s;
  } else if (family == AF_INET6) {
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)&a.ss;
    s->sin6_family = AF_INET6;
    s->sin6_addr = in6addr_loopback;
    a.len = sizeof *s;
  } else {
    struct sockaddr_un *s = (struct sockaddr_un *)&a.ss;
    s->sun_family = AF_UNIX;
    snprintf(s->sun_path, sizeof s->sun_path, "%.90s/s%d", dir,
             __atomic_fetch_add(&unix_seq, 1, __ATOMIC_RELAXED));
    a.len = sizeof *s;
  }
  return a;
}

/* A bound socket of type on a fresh local address of family; *a becomes
** its address (the port the kernel chose). */
static int bound(int family, int type, addr_t *a) {
  *a = local_addr(family);
  int fd = ums_net_socket(family, type, 0);
  CHECK_GE(fd, 0);
  if (family != AF_UNIX) {
    int one = 1;
    CHECK_RC(ums_net_setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one,
                                sizeof one), 0);
  }
  CHECK_RC(ums_net_bind(fd, (struct sockaddr *)&a->ss, a->len), 0);
  a->len = sizeof a->ss;
  CHECK_RC(ums_net_getsockname(fd, (struct sockaddr *)&a->ss, &a->len), 0);
  CHECK_EQ(a->ss.ss_family, family);
  return fd;
}

static int listener(int family, int backlog, addr_t *a) {
  int fd = bound(family, SOCK_STREAM, a);
  CHECK_RC(ums_net_listen(fd, backlog), 0);
  return fd;
}

/* A connected pair through a listener: *srv is the accepted side. The
** calls are made from the caller, in a task or on a host thread. */
static int connected(int family, int *srv) {
  addr_t a;
  int l = listener(family, 8, &a);
  int c = ums_net_socket(family, SOCK_STREAM, 0);
  CHECK_GE(c, 0);
  int64_t dl = ums_deadline(10 * SEC);
  /* A local TCP connect completes once the kernel's handshake has; the
  ** accept then finds it queued. */
  CHECK_RC(ums_net_connect(c, (struct sockaddr *)&a.ss, a.len, dl), 0);
  *srv = ums_net_accept(l, NULL, NULL, dl);
  CHECK_GE(*srv, 0);
  CHECK_RC(ums_net_close(l, dl), 0);
  return c;
}

/* Closes every descriptor listed, each close checked where it is
** called. */
#define CLOSE_ALL(dl, ...)                                                   \
  do {                                                                       \
    const int fds_[] = {__VA_ARGS__};                                        \
    for (size_t i_ = 0; i_ < sizeof fds_ / sizeof *fds_; i_++)               \
      CHECK_RC(ums_net_close(fds_[i_], (dl)), 0);                            \
  } while (0)

static void fill(ums_buf_t *b, size_t n, uint8_t seed) {
  uint8_t *p = ums_buf_data(b);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed + i * 7);
}

static bool same(const ums_buf_t *b, size_t n, uint8_t seed) {
  const uint8_t *p = ums_buf_data(b);
  for (size_t i = 0; i < n; i++)
    if (p[i] != (uint8_t)(seed + i * 7)) return false;
  return true;
}

/* Sends all of b[0, n) and returns 0, or the first error. */
static int64_t send_all(int fd, ums_buf_t *b, size_t n, int64_t dl) {
  size_t done = 0;
  while (done < n) {
    int64_t k = ums_net_send(fd, b, done, n - done, 0, dl);
    if (k < 0) return k;
    CHECK_GT(k, 0);
    done += (size_t)k;
  }
  return 0;
}

/* Receives until the end of the stream into b; returns the count. */
static int64_t recv_all(int fd, ums_buf_t *b, int64_t dl) {
  size_t got = 0, cap = ums_buf_size(b);
  for (;;) {
    CHECK_LT(got, cap);
    int64_t k = ums_net_recv(fd, b, got, cap - got, 0, dl);
    if (k < 0) return k;
    if (k == 0) return (int64_t)got;
    got += (size_t)k;
  }
}

/* ====================================================================== */
/* The backend in force                                                    */
/* ====================================================================== */

static void test_backend(void) {
  ums_config_t c;
  ums_runtime_config(rt, &c);
  printf("   backend: %s\n",
         c.io_backend == UMS_IO_URING ? "io_uring" : "pool (epoll)");
  if (expect_backend >= 0) CHECK_EQ(c.io_backend, expect_backend);
}

/* ====================================================================== */
/* Streams: every call, each family, tasks and host threads                */
/* ====================================================================== */

#define ECHO_BYTES (512u << 10)

typedef struct echo {
  int family;
  addr_t addr;        /* the listener's */
  int lfd;
  _Atomic int ready;
} echo_t;

/* Accepts one connection, receives until its end (the client's
** shutdown), sends everything back and closes. */
static void *echo_server(void *arg) {
  echo_t *e = arg;
  int64_t dl = ums_deadline(30 * SEC);
  struct sockaddr_storage peer;
  socklen_t plen = sizeof peer;
  int fd = ums_net_accept(e->lfd, (struct sockaddr *)&peer, &plen, dl);
  CHECK_GE(fd, 0);
  CHECK_EQ(peer.ss_family, e->family);
  /* Accepted descriptors are non-blocking and close-on-exec. */
  CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK);
  CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  ums_buf_t *b = ums_buf_new(ECHO_BYTES + 4096);
  int64_t n = recv_all(fd, b, dl);
  CHECK_EQ(n, ECHO_BYTES);
  CHECK_RC((int)send_all(fd, b, (size_t)n, dl), 0);
  ums_buf_release(b);
  CHECK_RC(ums_net_close(fd, dl), 0);
  return PTR(1);
}

/* Connects, checks both names, sends ECHO_BYTES, half-closes and reads
** them back. In a task or on a host thread. */
static void *echo_client(void *arg) {
  echo_t *e = arg;
  int64_t dl = ums_deadline(30 * SEC);
  int fd = ums_net_socket(e->family, SOCK_STREAM, 0);
  CHECK_GE(fd, 0);
  CHECK_RC(ums_net_connect(fd, (struct sockaddr *)&e->addr.ss, e->addr.len,
                           dl), 0);
  struct sockaddr_storage peer, me;
  socklen_t plen = sizeof peer, mlen = sizeof me;
  CHECK_RC(ums_net_getpeername(fd, (struct sockaddr *)&peer, &plen), 0);
  CHECK_RC(ums_net_getsockname(fd, (struct sockaddr *)&me, &mlen), 0);
  CHECK_EQ(peer.ss_family, e->family);
  if (e->family != AF_UNIX) {
    CHECK_EQ(plen, e->addr.len);
    CHECK(memcmp(&peer, &e->addr.ss, plen) == 0);
    int one = 1, got = 0;
    socklen_t glen = sizeof got;
    CHECK_RC(ums_net_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
                                sizeof one), 0);
    CHECK_RC(ums_net_getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &got, &glen),
             0);
    CHECK_NE(got, 0);
  }
  ums_buf_t *b = ums_buf_new(ECHO_BYTES + 4096);
  fill(b, ECHO_BYTES, (uint8_t)e->family);
  CHECK_RC((int)send_all(fd, b, ECHO_BYTES, dl), 0);
  /* Half-close: the server sees the end and still answers. */
  CHECK_RC(ums_net_shutdown(fd, SHUT_WR), 0);
  memset(ums_buf_data(b), 0, ECHO_BYTES);
  CHECK_EQ(recv_all(fd, b, dl), ECHO_BYTES);
  CHECK(same(b, ECHO_BYTES, (uint8_t)e->family));
  ums_buf_release(b);
  CHECK_RC(ums_net_close(fd, dl), 0);
  return PTR(1);
}

static void echo_family(int family, bool host_client) {
  echo_t e = {.family = family};
  e.lfd = listener(family, 16, &e.addr);
  ums_task_t srv = spawn_on(0, echo_server, &e);
  if (host_client) {
    CHECK(echo_client(&e) == PTR(1));
  } else {
    ums_task_t cli = spawn_on(1, echo_client, &e);
    CHECK(join(cli) == PTR(1));
  }
  CHECK(join(srv) == PTR(1));
  CHECK_RC(ums_net_close(e.lfd, UMS_FOREVER), 0);
}

static void test_stream(void) {
  for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
    printf("   %s: tasks, then a host-thread client\n",
           family_name(families[i]));
    echo_family(families[i], false);
    echo_family(families[i], true);
  }
  CHECK_EQ(io_pending(), 0);
}

/* A server task on one scheduler and a client on the other, both in
** tasks, many connections at once: every task waits on a socket at some
** point. */
typedef struct many {
  int lfd;
  addr_t addr;
  _Atomic int served;
} many_t;

static void *many_serve_one(void *arg) {
  int fd = (int)(intptr_t)arg;
  ums_buf_t *b = ums_buf_new(64);
  int64_t dl = ums_deadline(30 * SEC);
  int64_t n = ums_net_recv(fd, b, 0, 64, 0, dl);
  CHECK_EQ(n, 8);
  CHECK_EQ(ums_net_send(fd, b, 0, 8, 0, dl), 8);
  ums_buf_release(b);
  CHECK_RC(ums_net_close(fd, dl), 0);
  return NULL;
}

static void *many_acceptor(void *arg) {
  many_t *m = arg;
  ums_task_t t[64];
  for (int i = 0; i < 64; i++) {
    int fd = ums_net_accept(m->lfd, NULL, NULL, ums_deadline(30 * SEC));
    CHECK_GE(fd, 0);
    t[i] = spawn_on(0, many_serve_one, PTR(fd));
  }
  for (int i = 0; i < 64; i++) join(t[i]);
  return NULL;
}

static void *many_client(void *arg) {
  many_t *m = arg;
  int64_t dl = ums_deadline(30 * SEC);
  int fd = ums_net_socket(m->addr.family, SOCK_STREAM, 0);
  CHECK_GE(fd, 0);
  CHECK_RC(ums_net_connect(fd, (struct sockaddr *)&m->addr.ss, m->addr.len,
                           dl), 0);
  /* Let the servers wait in their receive first. */
  CHECK_RC(ums_sleep(tu_ms(5)), 0);
  ums_buf_t *b = ums_buf_new(64);
  memcpy(ums_buf_data(b), "12345678", 8);
  CHECK_EQ(ums_net_send(fd, b, 0, 8, 0, dl), 8);
  memset(ums_buf_data(b), 0, 8);
  CHECK_EQ(ums_net_recv(fd, b, 0, 64, MSG_WAITALL, dl), 8);
  CHECK(memcmp(ums_buf_data(b), "12345678", 8) == 0);
  CHECK_EQ(ums_net_recv(fd, b, 0, 64, 0, dl), 0);
  ums_buf_release(b);
  CHECK_RC(ums_net_close(fd, dl), 0);
  atomic_fetch_add(&m->served, 1);
  return NULL;
}

static void test_many(void) {
  many_t m = {0};
  m.lfd = listener(AF_INET, 128, &m.addr);
  ums_task_t acc = spawn_on(0, many_acceptor, &m);
  ums_task_t c[64];
  for (int i = 0; i < 64; i++) c[i] = spawn_on(1, many_client, &m);
  for (int i = 0; i < 64; i++) join(c[i]);
  join(acc);
  CHECK_EQ(atomic_load(&m.served), 64);
  CHECK_RC(ums_net_close(m.lfd, UMS_FOREVER), 0);
  CHECK_EQ(io_pending(), 0);
}

/* ====================================================================== */
/* Datagrams                                                               */
/* ====================================================================== */

typedef struct dgram {
  int family;
  int fd;             /* the receiver's */
  addr_t addr;        /* its address */
  addr_t from;        /* the sender's bound address, written before
                         from_set */
  atomic_int from_set;  /* from is written: the receiver, which finds the
                           datagrams through the kernel, learns it here
                           (ThreadSanitizer sees no order through the
                           kernel) */
  atomic_int timed_out; /* the receiver's first call has timed out */
} dgram_t;

static void *dgram_receiver(void *arg) {
  dgram_t *d = arg;
  ums_buf_t *b = ums_buf_new(2048);
  /* Nothing sent yet: the deadline. */
  CHECK_RC((int)ums_net_recvfrom(d->fd, b, 0, 2048, 0, NULL, NULL,
                                 ums_deadline(tu_ms(30))),
           UMS_ETIMEDOUT);
  atomic_store(&d->timed_out, 1);
  for (int i = 0; i < 3; i++) {
    struct sockaddr_storage from;
    socklen_t flen = sizeof from;
    int64_t n = ums_net_recvfrom(d->fd, b, 0, 2048, 0,
                                 (struct sockaddr *)&from, &flen,
                                 ums_deadline(30 * SEC));
    CHECK_EQ(n, 100 + i);
    CHECK(same(b, (size_t)n, (uint8_t)i));
    CHECK_EQ(atomic_load(&d->from_set), 1);  /* sent after it was set */
    CHECK_EQ(from.ss_family, d->family);
    CHECK_EQ(flen, d->from.len);
    CHECK(memcmp(&from, &d->from.ss, flen) == 0);
    /* Answer the sender at the address it came from. */
    CHECK_EQ(ums_net_sendto(d->fd, b, 0, (size_t)n, 0,
                            (struct sockaddr *)&from, flen,
                            ums_deadline(30 * SEC)),
             n);
  }
  ums_buf_release(b);
  return PTR(1);
}

/* The sender in its own function: its socket is bound so the receiver
** can check the source address and answer it. */
static void *dgram_sender2(void *arg) {
  dgram_t *d = arg;
  int64_t dl = ums_deadline(30 * SEC);
  addr_t me;
  int fd = bound(d->family, SOCK_DGRAM, &me);
  d->from = me;
  atomic_store(&d->from_set, 1);
  ums_buf_t *b = ums_buf_new(2048);
  /* Past the receiver's timeout: waited for rather than slept past, so
  ** that a scheduler held up longer than the sleep by a loaded machine
  ** cannot let the first datagram reach the call meant to time out. */
  while (!atomic_load(&d->timed_out)) CHECK_RC(ums_sleep(tu_ms(1)), 0);
  for (int i = 0; i < 3; i++) {
    fill(b, 100 + (size_t)i, (uint8_t)i);
    CHECK_EQ(ums_net_sendto(fd, b, 0, 100 + (size_t)i, 0,
                            (struct sockaddr *)&d->addr.ss, d->addr.len, dl),
             100 + i);
    memset(ums_buf_data(b), 0, 200);
    struct sockaddr_storage from;
    socklen_t flen = sizeof from;
    CHECK_EQ(ums_net_recvfrom(fd, b, 0, 2048, 0, (struct sockaddr *)&from,
                              &flen, dl),
             100 + i);
    CHECK(same(b, 100 + (size_t)i, (uint8_t)i));
  }
  /* A connected datagram socket: sendto without an address, recv. */
  CHECK_RC(ums_net_connect(fd, (struct sockaddr *)&d->addr.ss, d->addr.len,
                           dl), 0);
  ums_buf_release(b);
  CHECK_RC(ums_net_close(fd, dl), 0);
  return PTR(1);
}

static void test_dgram(void) {
  for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
    printf("   %s\n", family_name(families[i]));
    dgram_t d = {.family = families[i]};
    d.fd = bound(families[i], SOCK_DGRAM, &d.addr);
    ums_task_t s = spawn_on(1, dgram_sender2, &d);
    ums_task_t r = spawn_on(0, dgram_receiver, &d);
    CHECK(join(r) == PTR(1));
    CHECK(join(s) == PTR(1));
    CHECK_RC(ums_net_close(d.fd, UMS_FOREVER), 0);
  }
  CHECK_EQ(io_pending(), 0);
}

/* ====================================================================== */
/* Timeouts and cancellation: connect, accept, recv, send                  */
/* ====================================================================== */

enum { OP_CONNECT, OP_ACCEPT, OP_RECV, OP_SEND, OP_WAIT_FD, OP_N };
static const char *const op_names[OP_N] = {"connect", "accept", "recv",
                                           "send", "wait_fd"};

/* One operation that cannot complete, set up on a host thread; the task
** runs it with the deadline and reports the result. */
typedef struct stuck {
  int op;
  int family;
  int64_t timeout;    /* ns; < 0: none (the test cancels the task) */
  int fds[80];        /* to close afterwards */
  int nfds;
  int fd;             /* the one the operation uses */
  addr_t addr;        /* connect: the full listener's */
  _Atomic int started;
  int64_t result;
} stuck_t;

static void keep(stuck_t *s, int fd) {
  CHECK_LT(s->nfds, 80);
  s->fds[s->nfds++] = fd;
}

/* A listener with the smallest backlog that never accepts, filled up
** until a connect cannot complete: that one is the stuck operation's
** socket, made anew. */
static void setup_connect(stuck_t *s) {
  int l = listener(s->family, 0, &s->addr);
  keep(s, l);
  for (int i = 0; i < 64; i++) {
    int c = ums_net_socket(s->family, SOCK_STREAM, 0);
    CHECK_GE(c, 0);
    keep(s, c);
    int rc = ums_net_connect(c, (struct sockaddr *)&s->addr.ss, s->addr.len,
                             ums_deadline(tu_ms(100)));
    if (rc == UMS_ETIMEDOUT) break;
    CHECK_RC(rc, 0);
    CHECK_LT(i, 63);
  }
  s->fd = ums_net_socket(s->family, SOCK_STREAM, 0);
  CHECK_GE(s->fd, 0);
  keep(s, s->fd);
}

static void setup(stuck_t *s) {
  int srv;
  switch (s->op) {
    case OP_CONNECT:
      setup_connect(s);
      break;
    case OP_ACCEPT:
      s->fd = listener(s->family, 4, &s->addr);
      keep(s, s->fd);
      break;
    case OP_RECV:
    case OP_WAIT_FD:
      s->fd = connected(s->family, &srv);
      keep(s, s->fd);
      keep(s, srv);
      break;
    case OP_SEND: {
      /* A peer that never reads: small buffers on both sides, filled. */
      s->fd = connected(s->family, &srv);
      keep(s, s->fd);
      keep(s, srv);
      int small = 4096;
      CHECK_RC(ums_net_setsockopt(s->fd, SOL_SOCKET, SO_SNDBUF, &small,
                                  sizeof small), 0);
      CHECK_RC(ums_net_setsockopt(srv, SOL_SOCKET, SO_RCVBUF, &small,
                                  sizeof small), 0);
      ums_buf_t *b = ums_buf_new(65536);
      fill(b, 65536, 1);
      for (;;) {
        ssize_t k = send(s->fd, ums_buf_data(b), 65536,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue; /* strace's, in the fault runs */
        if (k < 0) {
          CHECK(errno == EAGAIN || errno == EWOULDBLOCK);
          break;
        }
      }
      ums_buf_release(b);
      break;
    }
  }
}

static void *run_stuck(void *arg) {
  stuck_t *s = arg;
  int64_t dl = s->timeout < 0 ? UMS_FOREVER : ums_deadline(s->timeout);
  ums_buf_t *b = ums_buf_new(65536);
  atomic_store(&s->started, 1);
  switch (s->op) {
    case OP_CONNECT:
      s->result = ums_net_connect(s->fd, (struct sockaddr *)&s->addr.ss,
                                  s->addr.len, dl);
      break;
    case OP_ACCEPT:
      s->result = ums_net_accept(s->fd, NULL, NULL, dl);
      break;
    case OP_RECV:
      s->result = ums_net_recv(s->fd, b, 0, 65536, 0, dl);
      break;
    case OP_SEND:
      s->result = ums_net_send(s->fd, b, 0, 65536, 0, dl);
      break;
    case OP_WAIT_FD:
      s->result = ums_wait_fd(s->fd, POLLIN, dl);
      break;
  }
  /* The request may still be in the kernel: the buffer is its too. */
  ums_buf_release(b);
  return PTR(1);
}

static void finish(stuck_t *s) {
  /* A given-up request ends in the kernel (or leaves the epoll set)
  ** without the caller: the in-flight count comes back to zero. */
  WAIT_UNTIL(io_pending() == 0, 10000);
  for (int i = 0; i < s->nfds; i++) CHECK_RC(close(s->fds[i]), 0);
}

static void test_timeouts(void) {
  for (int op = 0; op < OP_N; op++)
    for (size_t f = 0; f < sizeof families / sizeof *families; f++) {
      stuck_t s = {.op = op, .family = families[f], .timeout = tu_ms(50)};
      setup(&s);
      int64_t t0 = ums_now();
      CHECK(tu_in_task(rt, (int)f % 2, run_stuck, &s) == PTR(1));
      if (s.result != UMS_ETIMEDOUT)
        tu_fail(__FILE__, __LINE__, "%s on %s: %" PRId64 " (%s)",
                op_names[op], family_name(families[f]), s.result,
                ums_err_name((int)s.result));
      /* Never early. */
      CHECK_GE(ums_now() - t0, tu_ms(50));
      /* The same on a host thread, where the call waits in poll(2). */
      t0 = ums_now();
      s.timeout = tu_ms(30);
      run_stuck(&s);
      if (s.result != UMS_ETIMEDOUT)
        tu_fail(__FILE__, __LINE__, "host %s on %s: %" PRId64 " (%s)",
                op_names[op], family_name(families[f]), s.result,
                ums_err_name((int)s.result));
      CHECK_GE(ums_now() - t0, tu_ms(30));
      finish(&s);
    }
}

static void test_cancel(void) {
  for (int op = 0; op < OP_N; op++)
    for (size_t f = 0; f < sizeof families / sizeof *families; f++) {
      stuck_t s = {.op = op, .family = families[f], .timeout = -1};
      setup(&s);
      ums_task_t t = spawn_on((int)f, run_stuck, &s);
      /* A Unix connect to a full backlog mostly sleeps between its tries
      ** (ums.h): nothing is in flight then. */
      bool retrying = op == OP_CONNECT && families[f] == AF_UNIX;
      WAIT_UNTIL(atomic_load(&s.started) && (retrying || io_pending() == 1),
                 10000);
      /* Parked in the operation, not about to enter it. */
      usleep(retrying ? 40000 : 2000);
      CHECK_RC(ums_task_cancel(rt, t), 0);
      CHECK(join(t) == PTR(1));
      if (s.result != UMS_ECANCELED)
        tu_fail(__FILE__, __LINE__, "%s on %s: %" PRId64 " (%s)",
                op_names[op], family_name(families[f]), s.result,
                ums_err_name((int)s.result));
      finish(&s);
    }
}

/* An accept whose caller gave up while a connection arrives: the
** connection is closed by the runtime, never leaked. After the loop the
** descriptor count is what it was. */
static void *accept_short(void *arg) {
  int lfd = *(int *)arg;
  int fd = ums_net_accept(lfd, NULL, NULL, ums_deadline(tu_ms(1)));
  if (fd >= 0) CHECK_RC(ums_net_close(fd, UMS_FOREVER), 0);
  return NULL;
}

static void test_accept_abandoned(void) {
  int before = tu_fd_count();
  addr_t a;
  int lfd = listener(AF_INET, 64, &a);
  for (int i = 0; i < 50; i++) {
    ums_task_t t = spawn_on(i, accept_short, &lfd);
    int c = ums_net_socket(AF_INET, SOCK_STREAM, 0);
    CHECK_RC(ums_net_connect(c, (struct sockaddr *)&a.ss, a.len,
                             ums_deadline(10 * SEC)), 0);
    join(t);
    CHECK_RC(close(c), 0);
  }
  WAIT_UNTIL(io_pending() == 0, 10000);
  /* Connections nobody accepted are in the listener's queue; closing it
  ** drops them. */
  CHECK_RC(close(lfd), 0);
  WAIT_UNTIL(tu_fd_count() == before, 10000);
}

/* ====================================================================== */
/* Reset, SIGPIPE                                                          */
/* ====================================================================== */

typedef struct pair {
  int family;
  int a, b;
  _Atomic int started;
  int64_t result;
} pair_t;

static void *recv_one(void *arg) {
  pair_t *p = arg;
  ums_buf_t *b = ums_buf_new(4096);
  atomic_store(&p->started, 1);
  p->result = ums_net_recv(p->a, b, 0, 4096, 0, ums_deadline(30 * SEC));
  ums_buf_release(b);
  return PTR(1);
}

static void reset_by_peer(int fd) {
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  CHECK_RC(ums_net_setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
  CHECK_RC(ums_net_close(fd, UMS_FOREVER), 0);
}

static void test_reset(void) {
  for (int f = 0; f < 2; f++) {
    /* The receiver waits in its recv when the reset comes. */
    pair_t p = {.family = families[f]};
    p.a = connected(p.family, &p.b);
    ums_task_t t = spawn_on(f, recv_one, &p);
    WAIT_UNTIL(atomic_load(&p.started) && io_pending() == 1, 10000);
    usleep(2000);
    reset_by_peer(p.b);
    CHECK(join(t) == PTR(1));
    CHECK_RC((int)p.result, -ECONNRESET);
    CHECK_RC(ums_net_close(p.a, UMS_FOREVER), 0);
    /* The reset came before the recv. */
    p.a = connected(p.family, &p.b);
    reset_by_peer(p.b);
    usleep(2000);
    CHECK(tu_in_task(rt, f, recv_one, &p) == PTR(1));
    CHECK_RC((int)p.result, -ECONNRESET);
    CHECK_RC(ums_net_close(p.a, UMS_FOREVER), 0);
  }
}

static void *send_to_gone(void *arg) {
  pair_t *p = arg;
  ums_buf_t *b = ums_buf_new(65536);
  fill(b, 65536, 3);
  int64_t res = 0;
  /* The first sends may still be accepted by the kernel; one fails. */
  for (int i = 0; i < 100 && res >= 0; i++)
    res = ums_net_send(p->a, b, 0, 65536, 0, ums_deadline(30 * SEC));
  p->result = res;
  ums_buf_release(b);
  return PTR(1);
}

static void test_no_sigpipe(void) {
  /* The default action of SIGPIPE ends the process: a send that raised it
  ** would end the test here. */
  signal(SIGPIPE, SIG_DFL);
  for (size_t f = 0; f < sizeof families / sizeof *families; f++) {
    pair_t p = {.family = families[f]};
    p.a = connected(p.family, &p.b);
    CHECK_RC(close(p.b), 0);
    CHECK(tu_in_task(rt, (int)f % 2, send_to_gone, &p) == PTR(1));
    if (p.result != -EPIPE && p.result != -ECONNRESET)
      tu_fail(__FILE__, __LINE__, "%s: %" PRId64, family_name(p.family),
              p.result);
    CHECK_RC(ums_net_close(p.a, UMS_FOREVER), 0);
  }
}

/* ====================================================================== */
/* Descriptors: cycles, EMFILE                                             */
/* ====================================================================== */

typedef struct cycles {
  int family;
  int n;
  int lfd;
  addr_t addr;
} cycles_t;

static void *cycle_server(void *arg) {
  cycles_t *c = arg;
  ums_buf_t *b = ums_buf_new(16);
  for (int i = 0; i < c->n; i++) {
    int64_t dl = ums_deadline(30 * SEC);
    int fd = ums_net_accept(c->lfd, NULL, NULL, dl);
    CHECK_GE(fd, 0);
    CHECK_EQ(ums_net_recv(fd, b, 0, 16, 0, dl), 1);
    CHECK_EQ(ums_net_recv(fd, b, 0, 16, 0, dl), 0);
    CHECK_RC(ums_net_close(fd, dl), 0);
  }
  ums_buf_release(b);
  return NULL;
}

static void *cycle_client(void *arg) {
  cycles_t *c = arg;
  ums_buf_t *b = ums_buf_new(16);
  for (int i = 0; i < c->n; i++) {
    int64_t dl = ums_deadline(30 * SEC);
    int fd = ums_net_socket(c->family, SOCK_STREAM, 0);
    CHECK_GE(fd, 0);
    CHECK_RC(ums_net_connect(fd, (struct sockaddr *)&c->addr.ss, c->addr.len,
                             dl), 0);
    CHECK_EQ(ums_net_send(fd, b, 0, 1, 0, dl), 1);
    if (c->family != AF_UNIX) {
      /* No TIME_WAIT left behind on the client's side: thousands of them
      ** would use up the local ports for the next runs. */
      struct linger lg = {.l_onoff = 1, .l_linger = 0};
      CHECK_RC(ums_net_shutdown(fd, SHUT_WR), 0);
      ums_buf_t *z = ums_buf_new(16);
      CHECK_EQ(ums_net_recv(fd, z, 0, 16, 0, dl), 0);
      ums_buf_release(z);
      CHECK_RC(ums_net_setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg),
               0);
    }
    CHECK_RC(ums_net_close(fd, dl), 0);
  }
  ums_buf_release(b);
  return NULL;
}

static void test_fd_cycles(void) {
#if defined(TU_TSAN)
  const int total = 2000;
#else
  const int total = 10000;
#endif
  int before = tu_fd_count();
  int per[2] = {total / 2, total / 2};
  int fam[2] = {AF_UNIX, AF_INET};
  for (int i = 0; i < 2; i++) {
    cycles_t c = {.family = fam[i], .n = per[i]};
    c.lfd = listener(fam[i], 128, &c.addr);
    ums_task_t s = spawn_on(0, cycle_server, &c);
    ums_task_t k = spawn_on(1, cycle_client, &c);
    join(k);
    join(s);
    CHECK_RC(ums_net_close(c.lfd, UMS_FOREVER), 0);
  }
  printf("   %d connect/accept/close cycles\n", total);
  CHECK_EQ(tu_fd_count(), before);
}

/* EMFILE on accept: the call fails (it does not retry by itself, which
** would spin), the connection stays queued, and the listener serves it
** once a descriptor is free. */
typedef struct emfile {
  int lfd;
  int64_t first, second;
} emfile_t;

static void *accept_twice(void *arg) {
  emfile_t *e = arg;
  e->first = ums_net_accept(e->lfd, NULL, NULL, ums_deadline(10 * SEC));
  return PTR(1);
}

static void test_emfile(void) {
  addr_t a;
  emfile_t e = {0};
  e.lfd = listener(AF_INET, 8, &a);
  int c = ums_net_socket(AF_INET, SOCK_STREAM, 0);
  CHECK_RC(ums_net_connect(c, (struct sockaddr *)&a.ss, a.len,
                           ums_deadline(10 * SEC)), 0);
  struct rlimit old;
  CHECK_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  int n = tu_fd_count();
  struct rlimit low = {(rlim_t)n + 16, old.rlim_max};
  CHECK_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  int fill_fds[32], nfill = 0;
  for (;;) {
    int fd = dup(0);
    if (fd < 0) {
      CHECK_EQ(errno, EMFILE);
      break;
    }
    CHECK_LT(nfill, 32);
    fill_fds[nfill++] = fd;
  }
  CHECK(tu_in_task(rt, 0, accept_twice, &e) == PTR(1));
  CHECK_RC((int)e.first, UMS_EMFILE);
  CHECK(tu_in_task(rt, 1, accept_twice, &e) == PTR(1));
  CHECK_RC((int)e.first, UMS_EMFILE);
  for (int i = 0; i < nfill; i++) close(fill_fds[i]);
  CHECK_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  CHECK(tu_in_task(rt, 0, accept_twice, &e) == PTR(1));
  CHECK_GE(e.first, 0);
  CHECK_RC(close((int)e.first), 0);
  CHECK_RC(close(c), 0);
  CHECK_RC(close(e.lfd), 0);
}

/* ====================================================================== */
/* ums_wait_fd, the deferred form                                          */
/* ====================================================================== */

typedef struct waitfd {
  int fd;
  int events;
  int64_t timeout;
  _Atomic int started;
  int result;
} waitfd_t;

static void *wait_one(void *arg) {
  waitfd_t *w = arg;
  atomic_store(&w->started, 1);
  w->result = ums_wait_fd(w->fd, w->events, w->timeout < 0
                                                ? UMS_FOREVER
                                                : ums_deadline(w->timeout));
  return PTR(1);
}

static void test_wait_fd(void) {
  int p[2];
  CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
  /* Not ready: the deadline. */
  waitfd_t w = {.fd = p[0], .events = POLLIN, .timeout = tu_ms(30)};
  CHECK(tu_in_task(rt, 0, wait_one, &w) == PTR(1));
  CHECK_RC(w.result, UMS_ETIMEDOUT);
  /* Made ready while it waits, by a host thread. */
  for (int s = 0; s < 2; s++) {
    waitfd_t r = {.fd = p[0], .events = POLLIN, .timeout = -1};
    ums_task_t t = spawn_on(s, wait_one, &r);
    WAIT_UNTIL(atomic_load(&r.started) && io_pending() == 1, 10000);
    usleep(2000);
    CHECK_EQ(write(p[1], "x", 1), 1);
    CHECK(join(t) == PTR(1));
    CHECK_EQ(r.result, POLLIN);
    char ch;
    CHECK_EQ(read(p[0], &ch, 1), 1);
  }
  /* Ready at once; the write end of a pipe. */
  waitfd_t o = {.fd = p[1], .events = POLLOUT, .timeout = tu_ms(10000)};
  CHECK(tu_in_task(rt, 1, wait_one, &o) == PTR(1));
  CHECK_EQ(o.result, POLLOUT);
  /* The other end gone: POLLHUP whatever was asked. */
  CHECK_RC(close(p[1]), 0);
  waitfd_t h = {.fd = p[0], .events = POLLIN, .timeout = tu_ms(10000)};
  CHECK(tu_in_task(rt, 0, wait_one, &h) == PTR(1));
  CHECK(h.result & POLLHUP);
  CHECK_RC(close(p[0]), 0);
  /* An eventfd, the shape C libraries hand out; and a host thread. */
  int efd = eventfd(0, EFD_CLOEXEC);
  CHECK_RC(ums_wait_fd(efd, POLLIN, ums_deadline(tu_ms(20))), UMS_ETIMEDOUT);
  CHECK_EQ(ums_wait_fd(efd, POLLOUT, ums_deadline(10 * SEC)), POLLOUT);
  waitfd_t e = {.fd = efd, .events = POLLIN, .timeout = -1};
  ums_task_t t = spawn_on(1, wait_one, &e);
  WAIT_UNTIL(atomic_load(&e.started) && io_pending() == 1, 10000);
  uint64_t one = 1;
  CHECK_EQ(write(efd, &one, sizeof one), (ssize_t)sizeof one);
  CHECK(join(t) == PTR(1));
  CHECK_EQ(e.result, POLLIN);
  CHECK_RC(close(efd), 0);
  /* Misuse. */
  CHECK_RC(ums_wait_fd(-1, POLLIN, UMS_FOREVER), UMS_EBADF);
  CHECK_RC(ums_wait_fd(0, 0, UMS_FOREVER), UMS_EINVAL);
  CHECK_EQ(io_pending(), 0);
}

/* A deadline that has already passed answers a ready descriptor as both
** backends' zero timeout should (LuaSocket's non-blocking mode): the call
** is made once, at once, and only a descriptor that is not ready gets
** UMS_ETIMEDOUT. */
static void *expired_ok(void *arg) {
  int family = *(int *)arg;
  int srv;
  int c = connected(family, &srv);
  int64_t past = ums_now() - 1;
  CHECK_RC(ums_wait_fd(srv, POLLIN, past), UMS_ETIMEDOUT);
  CHECK_EQ(ums_wait_fd(c, POLLOUT, past), POLLOUT);
  ums_buf_t *b = ums_buf_new(64);
  memcpy(ums_buf_data(b), "ping", 4);
  CHECK_RC(ums_net_recv(srv, b, 8, 8, 0, past), UMS_ETIMEDOUT);
  CHECK_EQ(ums_net_send(c, b, 0, 4, 0, past), 4);
  /* Once the data has reached the peer (loopback TCP may take a moment
  ** after the send returned), the expired calls see it. */
  CHECK_EQ(ums_wait_fd(srv, POLLIN, ums_deadline(10 * SEC)), POLLIN);
  CHECK_EQ(ums_wait_fd(srv, POLLIN, past), POLLIN);
  CHECK_EQ(ums_net_recv(srv, b, 8, 8, 0, past), 4);
  CHECK(memcmp((char *)ums_buf_data(b) + 8, "ping", 4) == 0);
  /* A queued connection on a non-blocking listener. */
  addr_t a;
  int l = listener(family, 8, &a);
  CHECK_RC(ums_net_accept(l, NULL, NULL, past), UMS_ETIMEDOUT);
  int d = ums_net_socket(family, SOCK_STREAM, 0);
  CHECK_RC(ums_net_connect(d, (struct sockaddr *)&a.ss, a.len,
                           ums_deadline(10 * SEC)), 0);
  CHECK_EQ(ums_wait_fd(l, POLLIN, ums_deadline(10 * SEC)), POLLIN);
  int e = ums_net_accept(l, NULL, NULL, past);
  CHECK_GE(e, 0);
  ums_buf_release(b);
  int64_t dl = ums_deadline(10 * SEC);
  int fds[] = {c, srv, l, d, e};
  for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
    CHECK_RC(ums_net_close(fds[i], dl), 0);
  return PTR(1);
}

static void test_expired(void) {
  for (size_t f = 0; f < sizeof families / sizeof *families; f++)
    CHECK(tu_in_task(rt, (int)f % 2, expired_ok, (void *)&families[f]) ==
          PTR(1));
  CHECK_EQ(io_pending(), 0);
}

/* Deferred form. A call whose socket is ready answers in its _begin (1,
** no park left begun: ums_park_wait has none to wait for) and is ended at
** once; one that is not ready begins a park (0), waited on, then ended. */
static void *deferred_ok(void *arg) {
  int family = *(int *)arg;
  int srv;
  int c = connected(family, &srv);
  int64_t dl = ums_deadline(10 * SEC);
  ums_buf_t *b = ums_buf_new(64);
  memcpy(ums_buf_data(b), "hello", 5);
  ums_fs_req_t *q = NULL;
  /* Nothing to receive yet: the receive waits, here up to its deadline. */
  CHECK_RC(ums_net_recv_begin(srv, b, 8, 56, 0,
                              ums_deadline(20 * UMS_NSEC_PER_MSEC), &q), 0);
  CHECK_RC(ums_park_wait(), UMS_ETIMEDOUT);
  CHECK_EQ(ums_fs_end(q), UMS_ETIMEDOUT);
  CHECK_RC(ums_net_send_begin(c, b, 0, 5, 0, dl, &q), 1);
  CHECK_RC(ums_park_wait(), UMS_EINVAL);
  CHECK_EQ(ums_net_end(q, NULL, NULL), 5);
  CHECK_RC(ums_net_recv_begin(srv, b, 8, 56, 0, dl, &q), 1);
  CHECK_EQ(ums_fs_end(q), 5);
  CHECK(memcmp((char *)ums_buf_data(b) + 8, "hello", 5) == 0);
  /* Datagrams with the sender's address. */
  addr_t ra, sa;
  int r = bound(family, SOCK_DGRAM, &ra);
  int s = bound(family, SOCK_DGRAM, &sa);
  CHECK_RC(ums_net_sendto_begin(s, b, 0, 5, 0, (struct sockaddr *)&ra.ss,
                                ra.len, dl, &q), 1);
  CHECK_EQ(ums_net_end(q, NULL, NULL), 5);
  CHECK_RC(ums_net_recvfrom_begin(r, b, 16, 48, 0, dl, &q), 1);
  struct sockaddr_storage from;
  socklen_t flen = sizeof from;
  CHECK_EQ(ums_net_end(q, (struct sockaddr *)&from, &flen), 5);
  CHECK_EQ(flen, sa.len);
  CHECK(memcmp(&from, &sa.ss, flen) == 0);
  /* Readiness. */
  CHECK_RC(ums_wait_fd_begin(r, POLLOUT, dl, &q), 1);
  CHECK_EQ(ums_net_end(q, NULL, NULL), POLLOUT);
  ums_buf_release(b);
  CLOSE_ALL(dl, r, s, c, srv);
  return PTR(1);
}

/* A send or receive whose socket is ready is refused as a park would be,
** before its system call: inside a park the task has begun (UMS_EBUSY)
** and in a cancelled task (UMS_ECANCELED), nothing moves. ums_net_send_now
** too, which has no park of its own. */
static void *deferred_refused(void *arg) {
  int family = *(int *)arg;
  int srv;
  int c = connected(family, &srv);
  int64_t dl = ums_deadline(10 * SEC);
  ums_buf_t *b = ums_buf_new(64);
  memcpy(ums_buf_data(b), "hello", 5);
  ums_fs_req_t *q = NULL;
  CHECK_EQ(ums_net_send(c, b, 0, 5, 0, dl), 5);
  CHECK_RC(ums_wait_fd(srv, POLLIN, dl), POLLIN);
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin(dl, &tok), 0);
  CHECK_RC(ums_net_send_begin(c, b, 0, 5, 0, dl, &q), UMS_EBUSY);
  CHECK_EQ(ums_net_send_now(c, "inpark", 6, 0), UMS_EBUSY);
  CHECK_RC(ums_net_recv_begin(srv, b, 8, 56, 0, dl, &q), UMS_EBUSY);
  CHECK_RC(ums_unpark(rt, tok, 7), 0);
  CHECK_RC(ums_park_wait(), 7);
  CHECK_RC(ums_task_cancel(rt, ums_self()), 0);
  CHECK_RC(ums_net_send_begin(c, b, 0, 5, 0, dl, &q), UMS_ECANCELED);
  CHECK_EQ(ums_net_send_now(c, "cancel", 6, 0), UMS_ECANCELED);
  CHECK_RC(ums_net_recv_begin(srv, b, 8, 56, 0, dl, &q), UMS_ECANCELED);
  /* The five bytes sent first are still there, alone. */
  char got[16];
  ssize_t k;
  /* EINTR: strace's, in the fault runs. */
  while ((k = recv(srv, got, sizeof got, MSG_DONTWAIT)) < 0 && errno == EINTR)
    ;
  CHECK_EQ(k, 5);
  while ((k = recv(c, got, sizeof got, MSG_DONTWAIT)) < 0 && errno == EINTR)
    ;
  CHECK_EQ(k, -1);
  ums_buf_release(b);
  /* A cancelled task's close still closes (ums_fs_close), reporting the
  ** cancel where it would have waited (the ring's close). */
  int rc = ums_net_close(c, dl);
  CHECK(rc == 0 || rc == UMS_ECANCELED);
  rc = ums_net_close(srv, dl);
  CHECK(rc == 0 || rc == UMS_ECANCELED);
  CHECK_EQ(fcntl(c, F_GETFD), -1);
  CHECK_EQ(fcntl(srv, F_GETFD), -1);
  return PTR(1);
}

static void test_deferred(void) {
  for (size_t f = 0; f < sizeof families / sizeof *families; f++) {
    CHECK(tu_in_task(rt, (int)f % 2, deferred_ok, (void *)&families[f]) == PTR(1));
    CHECK(tu_in_task(rt, (int)f % 2, deferred_refused,
                     (void *)&families[f]) == PTR(1));
  }
  CHECK_EQ(io_pending(), 0);
}

/* A descriptor closed with ums_net_close while a task of the same
** scheduler waits on it: that wait ends with UMS_EBADF on both backends
** (the ring's operation is cancelled in the kernel, the epoll set's
** request ended). */
static void *close_other(void *arg) {
  pair_t *p = arg;
  CHECK_RC(ums_net_close(p->a, UMS_FOREVER), 0);
  return PTR(1);
}

/* The same with the deferred form: the closing task parks on the ring's
** close (1: the epoll backend closed it at once). */
static void *close_begin_other(void *arg) {
  pair_t *p = arg;
  ums_fs_req_t *q = NULL;
  int rc = ums_net_close_begin(p->a, UMS_FOREVER, &q);
  if (rc == 0) {
    CHECK_RC(ums_park_wait(), 0);
    rc = (int)ums_fs_end(q);
  } else {
    CHECK_EQ(rc, 1);
    rc = 0;
  }
  CHECK_RC(rc, 0);
  return PTR(1);
}

static void test_close_while_waiting(void) {
  ums_fs_req_t *q = NULL;
  CHECK_RC(ums_net_close_begin(-1, UMS_FOREVER, &q), UMS_EBADF);
  CHECK_RC(ums_net_close_begin(0, UMS_FOREVER, NULL), UMS_EINVAL);
  for (int deferred = 0; deferred < 2; deferred++) {
    pair_t p = {.family = AF_INET};
    p.a = connected(p.family, &p.b);
    /* Outside a task there is no park to begin. */
    CHECK_RC(ums_net_close_begin(p.a, UMS_FOREVER, &q), UMS_EPERM);
    ums_task_t t = spawn_on(0, recv_one, &p);
    WAIT_UNTIL(atomic_load(&p.started) && io_pending() == 1, 10000);
    usleep(2000);
    CHECK(tu_in_task(rt, 0, deferred ? close_begin_other : close_other,
                     &p) == PTR(1));
    CHECK(join(t) == PTR(1));
    CHECK_RC((int)p.result, UMS_EBADF);
    /* Closed: the number is free (nothing else opens one meanwhile). */
    CHECK(fcntl(p.a, F_GETFD) < 0 && errno == EBADF);
    CHECK_RC(ums_net_close(p.b, UMS_FOREVER), 0);
  }
}

/* ums_net_cancel from another task of the same scheduler: the waiting
** receive, send, accept or readiness wait ends with UMS_EBADF once the
** kernel has let go of it, and the descriptor stays open and usable. */
typedef struct cancel_arg {
  stuck_t *s;
  int rc;
} cancel_arg_t;

static void *cancel_other(void *arg) {
  cancel_arg_t *c = arg;
  c->rc = ums_net_cancel(c->s->fd);
  return PTR(1);
}

static void test_cancel_fd(void) {
  CHECK_RC(ums_net_cancel(-1), UMS_EBADF);
  static const int ops[] = {OP_ACCEPT, OP_RECV, OP_SEND, OP_WAIT_FD};
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
    for (size_t f = 0; f < sizeof families / sizeof *families; f++) {
      stuck_t s = {.op = ops[i], .family = families[f], .timeout = -1};
      setup(&s);
      /* Outside a task there is no scheduler to end anything on. */
      CHECK_RC(ums_net_cancel(s.fd), UMS_EPERM);
      ums_task_t t = spawn_on(0, run_stuck, &s);
      WAIT_UNTIL(atomic_load(&s.started) && io_pending() == 1, 10000);
      /* Parked in the operation, not about to enter it. */
      usleep(2000);
      cancel_arg_t c = {.s = &s, .rc = 1};
      CHECK(tu_in_task(rt, 0, cancel_other, &c) == PTR(1));
      CHECK_RC(c.rc, 0);
      CHECK(join(t) == PTR(1));
      if (s.result != UMS_EBADF)
        tu_fail(__FILE__, __LINE__, "%s on %s: %" PRId64 " (%s)",
                op_names[ops[i]], family_name(families[f]), s.result,
                ums_err_name((int)s.result));
      WAIT_UNTIL(io_pending() == 0, 10000);
      /* Still open, and the same operation waits again until its
      ** deadline. */
      CHECK(fcntl(s.fd, F_GETFD) >= 0);
      s.timeout = tu_ms(20);
      CHECK(tu_in_task(rt, 0, run_stuck, &s) == PTR(1));
      CHECK_RC((int)s.result, UMS_ETIMEDOUT);
      finish(&s);
    }
}

static void test_bad_input(void) {
  ums_buf_t *b = ums_buf_new(16);
  CHECK_RC((int)ums_net_recv(-1, b, 0, 16, 0, UMS_FOREVER), UMS_EBADF);
  CHECK_RC((int)ums_net_recv(0, b, 8, 16, 0, UMS_FOREVER), UMS_EINVAL);
  CHECK_RC((int)ums_net_send(0, NULL, 0, 16, 0, UMS_FOREVER), UMS_EINVAL);
  CHECK_RC(ums_net_connect(0, NULL, 0, UMS_FOREVER), UMS_EINVAL);
  CHECK_RC(ums_net_socket(12345, SOCK_STREAM, 0), -EAFNOSUPPORT);
  CHECK_RC(ums_net_listen(-1, 1), UMS_EBADF);
  CHECK_RC(ums_net_close(-1, UMS_FOREVER), UMS_EBADF);
  ums_buf_release(b);
}

/* ====================================================================== */

static void rm_tree(const char *path) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

/* ====================================================================== */
/* A receive that times out takes nothing                                  */
/* ====================================================================== */

/* A receiver whose every call has a deadline of a few microseconds reads
** a numbered stream that a sender on the other scheduler writes in
** bursts: every timeout races the data. A call that has timed out must
** leave the socket alone, so the stream arrives whole and in order; with
** take set, the calls are receives that take their buffer. */
enum { LOSS_MSGS = 20000 };

typedef struct loss {
  int rfd, sfd;
  bool take;
  _Atomic bool done;
  uint64_t bytes, timeouts;
} loss_t;

/* Enters the kernel between its yields, on the receiver's scheduler, so
** that whatever the kernel keeps for that thread to run (the completion
** work of a ring operation) runs between a receive's timeout and its
** caller's resumption. */
static void *loss_busy(void *arg) {
  loss_t *l = arg;
  while (!atomic_load(&l->done)) {
    (void)getppid();
    CHECK_RC(ums_yield(), 0);
  }
  return PTR(1);
}

static void *loss_sender(void *arg) {
  loss_t *l = arg;
  ums_buf_t *b = ums_buf_new(4);
  int64_t dl = ums_deadline(60 * SEC);
  for (uint32_t i = 0; i < LOSS_MSGS; i++) {
    uint8_t *p = ums_buf_data(b);
    p[0] = (uint8_t)(i >> 24);
    p[1] = (uint8_t)(i >> 16);
    p[2] = (uint8_t)(i >> 8);
    p[3] = (uint8_t)i;
    CHECK_EQ(ums_net_send(l->sfd, b, 0, 4, 0, dl), 4);
    if (i % 4 == 3) CHECK_RC(ums_sleep(20 * 1000), 0);
  }
  ums_buf_release(b);
  CHECK_RC(ums_net_shutdown(l->sfd, SHUT_WR), 0);
  return PTR(1);
}

static void *loss_receiver(void *arg) {
  loss_t *l = arg;
  ums_buf_t *b = l->take ? NULL : ums_buf_new(4096);
  for (;;) {
    int64_t dl = ums_deadline(25 * 1000), n;
    if (l->take) {
      ums_buf_release(b);
      b = NULL;
      n = ums_net_recv_take(l->rfd, 4096, 0, dl, &b);
      CHECK(n > 0 ? b != NULL : b == NULL);
    } else {
      n = ums_net_recv(l->rfd, b, 0, 4096, 0, dl);
    }
    if (n == UMS_ETIMEDOUT) {
      l->timeouts++;
      continue;
    }
    CHECK_GE(n, 0);
    if (n == 0) break;
    const uint8_t *p = ums_buf_data(b);
    for (int64_t k = 0; k < n; k++, l->bytes++) {
      uint32_t i = (uint32_t)(l->bytes / 4);
      uint8_t want = (uint8_t)(i >> (8 * (3 - l->bytes % 4)));
      if (p[k] != want) {
        fprintf(stderr, "byte %llu of the stream: %u, expected %u (%llu "
                "timeouts so far)\n", (unsigned long long)l->bytes,
                (unsigned)p[k], (unsigned)want,
                (unsigned long long)l->timeouts);
        CHECK(p[k] == want);
      }
    }
  }
  ums_buf_release(b);
  return PTR(1);
}

static void loss_run(bool take) {
  loss_t l = {0};
  l.take = take;
  l.rfd = connected(AF_INET, &l.sfd);
  ums_task_t r = spawn_on(0, loss_receiver, &l);
  ums_task_t busy = spawn_on(0, loss_busy, &l);
  ums_task_t s = spawn_on(1, loss_sender, &l);
  join(s);
  join(r);
  atomic_store(&l.done, true);
  join(busy);
  CHECK_EQ(l.bytes, (uint64_t)LOSS_MSGS * 4);
  /* The race was run: calls did time out between the bursts. */
  CHECK_GT(l.timeouts, 0);
  int64_t dl = ums_deadline(10 * SEC);
  CLOSE_ALL(dl, l.rfd, l.sfd);
}

static void test_timeout_takes_nothing(void) {
  loss_run(false);
  loss_run(true);
}

/* ====================================================================== */
/* Receives that wait first                                                */
/* ====================================================================== */

/* Every recv(2) the runtime makes in this program comes here first (the
** tests link the runtime statically), so a test can count the receives
** that found nothing. Under ThreadSanitizer the runtime receives with
** raw system calls (net.c), which nothing here sees. */
static _Atomic int recv_watch_fd[2] = {-1, -1};
static _Atomic uint64_t recv_calls, recv_again;

ssize_t recv(int fd, void *buf, size_t n, int flags) {
  static ssize_t (*real)(int, void *, size_t, int);
  if (!real) real = (ssize_t(*)(int, void *, size_t, int))dlsym(RTLD_NEXT,
                                                               "recv");
  ssize_t k = real(fd, buf, n, flags);
  int e = errno;
  if (fd == atomic_load(&recv_watch_fd[0]) ||
      fd == atomic_load(&recv_watch_fd[1])) {
    atomic_fetch_add(&recv_calls, 1);
    if (k < 0 && (e == EAGAIN || e == EWOULDBLOCK))
      atomic_fetch_add(&recv_again, 1);
  }
  errno = e;
  return k;
}

enum { EXCHANGES = 2000 };

typedef struct exchange {
  int c, srv;
} exchange_t;

/* Answers every message with itself until the end of the stream. */
static void *echo_side(void *arg) {
  exchange_t *x = arg;
  ums_buf_t *b = ums_buf_new(64);
  int64_t dl = ums_deadline(60 * SEC);
  for (;;) {
    int64_t n = ums_net_recv(x->srv, b, 0, 64, 0, dl);
    CHECK_GE(n, 0);
    if (n == 0) break;
    CHECK_RC(send_all(x->srv, b, (size_t)n, dl), 0);
  }
  ums_buf_release(b);
  return PTR(1);
}

/* Sends a numbered 8-byte message and reads its echo, EXCHANGES times. */
static void *ask_side(void *arg) {
  exchange_t *x = arg;
  ums_buf_t *out = ums_buf_new(8), *in = ums_buf_new(8);
  int64_t dl = ums_deadline(60 * SEC);
  for (int i = 0; i < EXCHANGES; i++) {
    fill(out, 8, (uint8_t)i);
    CHECK_RC(send_all(x->c, out, 8, dl), 0);
    size_t got = 0;
    while (got < 8) {
      int64_t n = ums_net_recv(x->c, in, got, 8 - got, 0, dl);
      CHECK_GT(n, 0);
      got += (size_t)n;
    }
    CHECK(same(in, 8, (uint8_t)i));
  }
  CHECK_RC(ums_net_shutdown(x->c, SHUT_WR), 0);
  ums_buf_release(out);
  ums_buf_release(in);
  return PTR(1);
}

/* Two tasks of one scheduler exchange messages: each receive follows the
** task's own send, before its peer has run, so a receive tried at once
** would find nothing every time. Those receives learn to wait for
** readiness first: the ones that find nothing are a small part of the
** exchanges, where trying every one first would find nothing twice per
** exchange. */
static void test_exchange_waits_first(void) {
#if defined(__SANITIZE_THREAD__)
  fprintf(stderr, "  (skipped: the runtime's receives are raw system "
                  "calls under ThreadSanitizer)\n");
  return;
#endif
  exchange_t x;
  x.c = connected(AF_INET, &x.srv);
  atomic_store(&recv_calls, 0);
  atomic_store(&recv_again, 0);
  atomic_store(&recv_watch_fd[0], x.c);
  atomic_store(&recv_watch_fd[1], x.srv);
  ums_task_t e = spawn_on(0, echo_side, &x);
  ums_task_t a = spawn_on(0, ask_side, &x);
  CHECK(join(a) == PTR(1));
  CHECK(join(e) == PTR(1));
  atomic_store(&recv_watch_fd[0], -1);
  atomic_store(&recv_watch_fd[1], -1);
  uint64_t calls = atomic_load(&recv_calls), again = atomic_load(&recv_again);
  fprintf(stderr, "  %d exchanges: %" PRIu64 " receives, %" PRIu64
                  " found nothing\n", EXCHANGES, calls, again);
  /* Every exchange's two receives got data once. */
  CHECK_GE(calls, 2 * (uint64_t)EXCHANGES);
  CHECK_LT(again, (uint64_t)EXCHANGES / 2);
  int64_t dl = ums_deadline(10 * SEC);
  CLOSE_ALL(dl, x.c, x.srv);
}

/* Keeps its scheduler's run queue from emptying until told to stop, so
** that a wait for readiness is not looked at before the next pass's
** timers. */
static void *yielder(void *arg) {
  _Atomic bool *stop = arg;
  while (!atomic_load(stop)) CHECK_RC(ums_yield(), 0);
  return PTR(1);
}

/* Computes for ns of real time, through no call of the runtime (none
** reads its clock meanwhile). */
static void spin_real(int64_t ns) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t until = (int64_t)ts.tv_sec * SEC + ts.tv_nsec + ns;
  do clock_gettime(CLOCK_MONOTONIC, &ts);
  while ((int64_t)ts.tv_sec * SEC + ts.tv_nsec < until);
}

/* A receive whose deadline has passed (LuaSocket's non-blocking mode)
** or is near tries at once even where its descriptor's receives have
** learned to wait first: data already there is returned, never a
** timeout, also while other tasks keep the scheduler busy. */
static void *near_deadline_ok(void *arg) {
  (void)arg;
  exchange_t x;
  x.c = connected(AF_INET, &x.srv);
  _Atomic bool stop = false;
  ums_task_t y = spawn_on(0, yielder, &stop);
  ums_task_t e = spawn_on(0, echo_side, &x);
  ums_buf_t *b = ums_buf_new(8);
  int64_t dl = ums_deadline(10 * SEC);
  for (int i = 0; i < 200; i++) {
    /* Teaches x.c to wait first: each receive finds nothing at once. */
    fill(b, 8, (uint8_t)i);
    CHECK_RC(send_all(x.c, b, 8, dl), 0);
    CHECK_EQ(ums_net_recv(x.c, b, 0, 8, 0, dl), 8);
    CHECK(same(b, 8, (uint8_t)i));
    /* The echo is back before this receive, which must take it. */
    CHECK_RC(send_all(x.c, b, 8, dl), 0);
    CHECK_RC(ums_wait_fd(x.c, POLLIN, dl), POLLIN);
    int64_t timeout = i % 2 ? 0 : tu_ms(1);
    /* In half the rounds the task computes before it sets its deadline
    ** (long after its scheduler's pass last read the clock) and again
    ** after, past the deadline. */
    if (i % 4 < 2) spin_real(tu_ms(3));
    int64_t near = ums_deadline(timeout);
    if (i % 4 < 2) spin_real(tu_ms(3));
    CHECK_EQ(ums_net_recv(x.c, b, 0, 8, 0, near), 8);
  }
  CHECK_RC(ums_net_shutdown(x.c, SHUT_WR), 0);
  CHECK(join(e) == PTR(1));
  atomic_store(&stop, true);
  CHECK(join(y) == PTR(1));
  ums_buf_release(b);
  CLOSE_ALL(dl, x.c, x.srv);
  return PTR(1);
}

static void test_near_deadline_tries(void) {
  CHECK(tu_in_task(rt, 0, near_deadline_ok, NULL) == PTR(1));
}

/* A receive that takes its buffer (ums_net_recv_take) holds none while
** it waits, on either backend: data comes in a buffer of the asked
** length, in order; a timeout and the end of the stream hand none. */
typedef struct take_wait {
  ums_fs_req_t *_Atomic q;
  int fd;
  uint8_t seed;
} take_wait_t;

/* Sends 5 bytes on w->fd once w->q waits, after checking that it holds
** no buffer (the same scheduler: its thread owns the request). */
static void *take_sender(void *arg) {
  take_wait_t *w = arg;
  ums_fs_req_t *q;
  while (!(q = atomic_load(&w->q))) CHECK_RC(ums_yield(), 0);
  CHECK_RC(ums_sleep(tu_ms(5)), 0);
  CHECK(q->take_buf);
  CHECK(q->bufs[0] == NULL);
  CHECK(q->iov[0].iov_base == NULL);
  ums_buf_t *b = ums_buf_new(8);
  fill(b, 5, w->seed);
  CHECK_RC(send_all(w->fd, b, 5, ums_deadline(10 * SEC)), 0);
  ums_buf_release(b);
  return PTR(1);
}

static void *recv_take_ok(void *arg) {
  int family = *(int *)arg;
  int srv;
  int c = connected(family, &srv);
  int64_t dl = ums_deadline(10 * SEC);
  ums_buf_t *got = ums_buf_new(8);
  ums_buf_t *stale = got;
  CHECK_EQ(ums_net_recv_take(srv, 100, 0, ums_deadline(tu_ms(20)), &got),
           UMS_ETIMEDOUT);
  CHECK(got == NULL);
  ums_buf_release(stale);
  for (int i = 0; i < 4; i++) {
    take_wait_t w = {.fd = c, .seed = (uint8_t)(i * 13)};
    ums_task_t t = spawn_on(0, take_sender, &w);
    ums_fs_req_t *q = NULL;
    CHECK_RC(ums_net_recv_take_begin(srv, 100, 0, dl, &q), 0);
    atomic_store(&w.q, q);
    CHECK_RC(ums_park_wait(), 0);
    CHECK_EQ(ums_net_recv_take_end(q, &got), 5);
    CHECK(got != NULL);
    CHECK_EQ(ums_buf_size(got), 100);
    CHECK(same(got, 5, w.seed));
    ums_buf_release(got);
    CHECK(join(t) == PTR(1));
  }
  /* Data already there: the blocking form answers at once. */
  ums_buf_t *b = ums_buf_new(8);
  fill(b, 8, 3);
  CHECK_RC(send_all(c, b, 8, dl), 0);
  CHECK_RC(ums_wait_fd(srv, POLLIN, dl), POLLIN);
  CHECK_EQ(ums_net_recv_take(srv, 8, 0, dl, &got), 8);
  CHECK(same(got, 8, 3));
  ums_buf_release(got);
  /* A request of another call is refused; the end of the stream hands
  ** no buffer. */
  ums_fs_req_t *q = NULL;
  CHECK_RC(ums_net_send_begin(c, b, 0, 1, 0, dl, &q), 1);
  CHECK_EQ(ums_net_recv_take_end(q, &got), UMS_EINVAL);
  CHECK_EQ(ums_fs_end(q), 1);
  CHECK_EQ(ums_net_recv_take_end(NULL, &got), UMS_EINVAL);
  CHECK_EQ(ums_net_recv_take(srv, 0, 0, dl, &got), UMS_EINVAL);
  CHECK_RC(ums_net_shutdown(c, SHUT_WR), 0);
  CHECK_EQ(ums_net_recv_take(srv, 8, 0, dl, &got), 1);
  ums_buf_release(got);
  got = b;
  CHECK_EQ(ums_net_recv_take(srv, 8, 0, dl, &got), 0);
  CHECK(got == NULL);
  ums_buf_release(b);
  CLOSE_ALL(dl, c, srv);
  return PTR(1);
}

/* What a receive that takes its buffer hands over, around the smallest
** buffer class (4 KiB): every byte, in order; what fits in 4 KiB in a
** 4 KiB buffer, more in one of the asked length; a datagram longer than
** 4 KiB whole (one receive of the asked length, never cut at 4 KiB). */
static void *recv_take_sizes(void *arg) {
  int family = *(int *)arg;
  int srv;
  int c = connected(family, &srv);
  int64_t dl = ums_deadline(10 * SEC);
  enum { ASK = 65536 };
  static const size_t sizes[] = {1, 4095, 4096, 4097, 10000, ASK};
  ums_buf_t *src = ums_buf_new(ASK);
  static uint8_t got[ASK];
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t n = sizes[i];
    fill(src, n, (uint8_t)i);
    CHECK_RC(send_all(c, src, n, dl), 0);
    size_t have = 0;
    while (have < n) {
      ums_buf_t *b = NULL;
      int64_t k = ums_net_recv_take(srv, ASK, 0, dl, &b);
      CHECK(k > 0 && have + (size_t)k <= n);
      CHECK(b != NULL);
      CHECK_EQ(ums_buf_size(b), (size_t)k <= 4096 ? 4096 : ASK);
      memcpy(got + have, ums_buf_data(b), (size_t)k);
      have += (size_t)k;
      ums_buf_release(b);
    }
    CHECK(memcmp(got, ums_buf_data(src), n) == 0);
  }
  /* A 6,000-byte datagram. */
  addr_t ra, sa;
  int r = bound(family, SOCK_DGRAM, &ra);
  int s = bound(family, SOCK_DGRAM, &sa);
  fill(src, 6000, 77);
  CHECK_EQ(ums_net_sendto(s, src, 0, 6000, 0, (struct sockaddr *)&ra.ss,
                          ra.len, dl), 6000);
  ums_buf_t *b = NULL;
  CHECK_EQ(ums_net_recv_take(r, ASK, 0, dl, &b), 6000);
  CHECK(same(b, 6000, 77));
  ums_buf_release(b);
  ums_buf_release(src);
  CLOSE_ALL(dl, r, s, c, srv);
  return PTR(1);
}

/* A stream read in bulk: a receive that waits and then finds more than
** 4 KiB gets all of it, up to its length, in one buffer of that length
** (a receive design that waits with a small buffer must not cut a bulk
** stream into small reads). */
typedef struct {
  int fd;
  size_t n;
} late_send_t;

static void *send_late(void *arg) {
  late_send_t *ls = arg;
  CHECK_RC(ums_sleep(20 * UMS_NSEC_PER_MSEC), 0);
  ums_buf_t *b = ums_buf_new(ls->n);
  fill(b, ls->n, 5);
  CHECK_RC(send_all(ls->fd, b, ls->n, ums_deadline(10 * SEC)), 0);
  ums_buf_release(b);
  return NULL;
}

static void *recv_take_bulk(void *arg) {
  int family = *(int *)arg;
  int srv;
  int c = connected(family, &srv);
  int64_t dl = ums_deadline(10 * SEC);
  late_send_t ls = {c, 20000};
  ums_task_t t = spawn_on(0, send_late, &ls);
  ums_buf_t *b = NULL;
  CHECK_EQ(ums_net_recv_take(srv, 65536, 0, dl, &b), 20000);
  CHECK_EQ(ums_buf_size(b), 65536);
  CHECK(same(b, 20000, 5));
  ums_buf_release(b);
  join(t);
  CLOSE_ALL(dl, c, srv);
  return PTR(1);
}

/* ums_net_send_now: a send from the caller's bytes that answers now or
** not at all. Bytes it counts arrive; a socket without room answers
** UMS_EAGAIN having sent nothing. (Its refusals: deferred_refused.) */
static void *send_now_in_task(void *arg) {
  int family = *(int *)arg;
  int srv;
  int c = connected(family, &srv);
  int64_t dl = ums_deadline(10 * SEC);
  CHECK_EQ(ums_net_send_now(c, "hello", 5, 0), 5);
  ums_buf_t *b = ums_buf_new(65536);
  CHECK_EQ(ums_net_recv(srv, b, 0, 65536, 0, dl), 5);
  CHECK(memcmp(ums_buf_data(b), "hello", 5) == 0);
  CHECK_EQ(ums_net_send_now(-1, "x", 1, 0), UMS_EBADF);
  /* Fill the connection while its peer does not read: every byte counted
  ** is one the peer gets, and the last answer is UMS_EAGAIN. */
  static char chunk[65536];
  memset(chunk, 'z', sizeof chunk);
  int64_t total = 0, n = 0;
  for (int i = 0; i < 100000 && (n = ums_net_send_now(c, chunk, sizeof chunk,
                                                      0)) > 0;
       i++)
    total += n;
  CHECK_EQ(n, UMS_EAGAIN);
  CHECK(total > 0);
  int64_t got = 0;
  while (got < total) {
    int64_t k = ums_net_recv(srv, b, 0, 65536, 0, dl);
    CHECK(k > 0);
    for (int64_t i = 0; i < k; i++) CHECK(((char *)ums_buf_data(b))[i] == 'z');
    got += k;
  }
  CHECK_EQ(got, total);
  ums_buf_release(b);
  CLOSE_ALL(dl, c, srv);
  return PTR(1);
}

static void test_send_now(void) {
  CHECK_EQ(ums_net_send_now(0, "x", 1, 0), UMS_EPERM);
  for (size_t f = 0; f < sizeof families / sizeof *families; f++)
    CHECK(tu_in_task(rt, (int)f % 2, send_now_in_task,
                     (void *)&families[f]) == PTR(1));
  CHECK_EQ(io_pending(), 0);
}

static void test_recv_take(void) {
  for (size_t f = 0; f < sizeof families / sizeof *families; f++)
    CHECK(tu_in_task(rt, 0, recv_take_ok, (void *)&families[f]) == PTR(1));
  for (size_t f = 0; f < sizeof families / sizeof *families; f++)
    CHECK(tu_in_task(rt, 0, recv_take_sizes, (void *)&families[f]) ==
          PTR(1));
  for (size_t f = 0; f < sizeof families / sizeof *families; f++)
    CHECK(tu_in_task(rt, 0, recv_take_bulk, (void *)&families[f]) ==
          PTR(1));
  CHECK_EQ(io_pending(), 0);
}

int main(int argc, char **argv) {
  bool quick = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--expect-backend=uring") == 0)
      expect_backend = UMS_IO_URING;
    else if (strcmp(argv[i], "--expect-backend=pool") == 0)
      expect_backend = UMS_IO_POOL;
    else if (strcmp(argv[i], "--quick") == 0)
      quick = true;
    else {
      fprintf(stderr, "usage: %s [--expect-backend=uring|pool] [--quick]\n",
              argv[0]);
      return 2;
    }
  }
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/ums-test-net-XXXXXX", base ? base : "/tmp");
  CHECK(mkdtemp(dir) != NULL);
  rt = tu_runtime_new(2);
#define RUN_NET(fn)                                 \
  do {                                              \
    RUN(fn);                                        \
    WAIT_UNTIL(io_pending() == 0, 10000);           \
  } while (0)
  RUN(test_backend);
  RUN_NET(test_bad_input);
  RUN_NET(test_stream);
  RUN_NET(test_dgram);
  RUN_NET(test_timeouts);
  RUN_NET(test_cancel);
  RUN_NET(test_reset);
  RUN_NET(test_no_sigpipe);
  RUN_NET(test_wait_fd);
  RUN_NET(test_deferred);
  RUN_NET(test_recv_take);
  RUN_NET(test_send_now);
  RUN_NET(test_expired);
  if (!quick) {
    RUN_NET(test_timeout_takes_nothing);
    RUN_NET(test_exchange_waits_first);
    RUN_NET(test_near_deadline_tries);
    RUN_NET(test_many);
    RUN_NET(test_accept_abandoned);
    RUN_NET(test_close_while_waiting);
    RUN_NET(test_cancel_fd);
    RUN_NET(test_emfile);
    RUN_NET(test_fd_cycles);
  }
  CHECK_EQ(io_pending(), 0);
  tu_runtime_shutdown(rt);
  rm_tree(dir);
  return 0;
}
