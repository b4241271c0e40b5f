/*
** test_dns.c: name resolution (dns.c, ums_net_getaddrinfo).
**
** The C library's getaddrinfo is interposed here (this program's own
** definition comes first for every caller): it records the thread and the
** host of each call, and makes names ending in ".slow.test" a lookup that
** takes SLOW_MS, so that timeouts and cancellation meet a lookup that is
** really in flight ("held.slow.test" runs until the test lets it end, so
** that a caller's timeout meets it in flight however slowly a loaded
** machine runs the caller); every name is then answered as 127.0.0.1 by
** the real
** getaddrinfo. Numeric hosts and /etc/hosts names must be answered on the
** task's own thread, the rest on the C-call pool's.
*/
#include "internal.h"
#include "test-util.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>

#define SEC UMS_NSEC_PER_SEC
#define MSEC UMS_NSEC_PER_MSEC
#define SLOW_MS 400

static ums_runtime_t *rt;

/* What the interposed getaddrinfo saw last, and the slow lookups still
** running. */
static _Atomic(pthread_t) last_thread;
static char last_host[256];        /* [written before calls ends] */
static atomic_int calls, slow_running, slow_done, held_release;
static pthread_mutex_t last_lock = PTHREAD_MUTEX_INITIALIZER;

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *,
                      struct addrinfo **);

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && strcmp(s + n - m, tail) == 0;
}

int getaddrinfo(const char *host, const char *service,
                const struct addrinfo *hints, struct addrinfo **res) {
  static gai_fn real;
  if (!real) real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
  pthread_mutex_lock(&last_lock);
  atomic_store(&last_thread, pthread_self());
  snprintf(last_host, sizeof last_host, "%s", host ? host : "(null)");
  pthread_mutex_unlock(&last_lock);
  atomic_fetch_add(&calls, 1);
  if (host && ends_with(host, ".slow.test")) {
    atomic_fetch_add(&slow_running, 1);
    if (strcmp(host, "held.slow.test") == 0) {
      /* Bounded, so that a failing test still ends. */
      for (int i = 0; i < 30000 && !atomic_load(&held_release); i++)
        usleep(1000);
    } else {
      usleep(SLOW_MS * 1000);
    }
    struct addrinfo h = {0};
    if (hints) h = *hints;
    h.ai_flags |= AI_NUMERICHOST;
    int rc = real("127.0.0.1", service, &h, res);
    atomic_fetch_sub(&slow_running, 1);
    atomic_fetch_add(&slow_done, 1);
    return rc;
  }
  return real(host, service, hints, res);
}

static void last_host_is(const char *want) {
  pthread_mutex_lock(&last_lock);
  CHECK_STR_EQ(last_host, want);
  pthread_mutex_unlock(&last_lock);
}

/* The first IPv4 address of res, as text. */
static const char *first_v4(const struct addrinfo *res, char *buf) {
  for (; res; res = res->ai_next) {
    if (res->ai_family != AF_INET) continue;
    const struct sockaddr_in *in = (const void *)res->ai_addr;
    return inet_ntop(AF_INET, &in->sin_addr, buf, INET_ADDRSTRLEN);
  }
  return "";
}

static void *numeric_here(void *arg) {
  (void)arg;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
  struct addrinfo *res = NULL;
  char buf[INET_ADDRSTRLEN];
  int before = atomic_load(&calls);
  /* Numeric: on this thread. */
  CHECK_RC(ums_net_getaddrinfo("127.0.0.1", "80", &hints, &res, NULL,
                               UMS_FOREVER), 0);
  CHECK(pthread_equal(atomic_load(&last_thread), pthread_self()));
  CHECK_STR_EQ(first_v4(res, buf), "127.0.0.1");
  freeaddrinfo(res);
  CHECK_RC(ums_net_getaddrinfo("::1", NULL, &hints, &res, NULL,
                               UMS_FOREVER), 0);
  CHECK(pthread_equal(atomic_load(&last_thread), pthread_self()));
  CHECK_EQ(res->ai_family, AF_INET6);
  freeaddrinfo(res);
  /* /etc/hosts names "localhost" (Debian's always does): its numeric
  ** address is what reaches getaddrinfo, on this thread. */
  CHECK_RC(ums_net_getaddrinfo("localhost", "80", &hints, &res, NULL,
                               UMS_FOREVER), 0);
  CHECK(pthread_equal(atomic_load(&last_thread), pthread_self()));
  CHECK(strcmp(first_v4(res, buf), "127.0.0.1") == 0 ||
        res->ai_family == AF_INET6);
  freeaddrinfo(res);
  CHECK_GE(atomic_load(&calls) - before, 3);
  /* The deferred form says it needed no park. */
  ums_dns_req_t *req;
  CHECK_RC(ums_net_getaddrinfo_begin("127.0.0.1", "1", &hints, UMS_FOREVER,
                                     &req), 1);
  CHECK_RC(ums_net_getaddrinfo_end(req, &res, NULL), 0);
  freeaddrinfo(res);
  /* A family the address is not: no address. */
  hints.ai_family = AF_INET6;
  int eai = 0;
  CHECK_RC(ums_net_getaddrinfo("127.0.0.1", "80", &hints, &res, &eai,
                               UMS_FOREVER), UMS_ENOENT);
  CHECK(eai != 0);
  return NULL;
}

static void test_numeric_and_hosts(void) {
  tu_in_task(rt, 0, numeric_here, NULL);
}

static void *lookup_on_pool(void *arg) {
  (void)arg;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
  struct addrinfo *res = NULL;
  char buf[INET_ADDRSTRLEN];
  CHECK_RC(ums_net_getaddrinfo("a.slow.test", "443", &hints, &res, NULL,
                               ums_deadline(30 * SEC)), 0);
  CHECK(!pthread_equal(atomic_load(&last_thread), pthread_self()));
  last_host_is("a.slow.test");
  CHECK_STR_EQ(first_v4(res, buf), "127.0.0.1");
  CHECK_EQ(ntohs(((struct sockaddr_in *)res->ai_addr)->sin_port), 443);
  freeaddrinfo(res);
  return NULL;
}

/* Counts the ticks of a task that runs while the lookup waits. */
static atomic_int ticks;
static void *ticker(void *arg) {
  (void)arg;
  for (int i = 0; i < 5; i++) {
    ums_sleep(10 * MSEC);
    atomic_fetch_add(&ticks, 1);
  }
  return NULL;
}

static void test_pool_lookup(void) {
  /* The scheduler keeps running other tasks while the lookup waits. */
  atomic_store(&ticks, 0);
  ums_spawn_opts_t o = {.sched = 0};
  ums_task_t tk, tl;
  CHECK_RC(ums_task_spawn(rt, &o, ticker, NULL, &tk), 0);
  CHECK_RC(ums_task_spawn(rt, &o, lookup_on_pool, NULL, &tl), 0);
  CHECK_RC(ums_task_join(rt, tk, ums_deadline(30 * SEC), NULL, NULL), 0);
  /* All five ticks while the lookup (SLOW_MS) still runs. */
  CHECK_EQ(atomic_load(&ticks), 5);
  CHECK_RC(ums_task_join(rt, tl, ums_deadline(30 * SEC), NULL, NULL), 0);
}

static void *lookup_times_out(void *arg) {
  (void)arg;
  struct addrinfo *res = (struct addrinfo *)1;
  int done = atomic_load(&slow_done);
  atomic_store(&held_release, 0);
  /* The lookup is held, so the deadline ends the wait however late; it
  ** is long enough for a pool thread to start the lookup first (a call
  ** given up before it starts is skipped, and slow_done would not move). */
  CHECK_RC(ums_net_getaddrinfo("held.slow.test", "80", NULL, &res, NULL,
                               ums_deadline(300 * MSEC)), UMS_ETIMEDOUT);
  /* It gave up while the lookup ran; *res is untouched. */
  CHECK_EQ(atomic_load(&slow_done), done);
  CHECK(res == (struct addrinfo *)1);
  atomic_store(&held_release, 1);
  return NULL;
}

static void *lookup_waits(void *arg) {
  (void)arg;
  struct addrinfo *res = NULL;
  int rc = ums_net_getaddrinfo("c.slow.test", "80", NULL, &res, NULL,
                               UMS_FOREVER);
  if (rc == 0) freeaddrinfo(res);
  return (void *)(intptr_t)rc;
}

static void test_timeout_and_cancel(void) {
  int done = atomic_load(&slow_done);
  tu_in_task(rt, 0, lookup_times_out, NULL);
  /* The detached lookup ends on its own; the pool frees its request and
  ** its list (LeakSanitizer checks in the ASan build). */
  WAIT_UNTIL(atomic_load(&slow_done) == done + 1, 10000);
  /* Cancelled while the lookup runs. */
  ums_spawn_opts_t o = {.sched = 1};
  ums_task_t t;
  CHECK_RC(ums_task_spawn(rt, &o, lookup_waits, NULL, &t), 0);
  WAIT_UNTIL(atomic_load(&slow_running) == 1, 10000);
  CHECK_RC(ums_task_cancel(rt, t), 0);
  void *res = NULL;
  CHECK_RC(ums_task_join(rt, t, ums_deadline(30 * SEC), &res, NULL), 0);
  CHECK_EQ((int)(intptr_t)res, UMS_ECANCELED);
  CHECK_EQ(atomic_load(&slow_running), 1);
  WAIT_UNTIL(atomic_load(&slow_running) == 0, 10000);
}

static void test_outside_task(void) {
  struct addrinfo *res = NULL;
  CHECK_RC(ums_net_getaddrinfo("127.0.0.1", "7", NULL, &res, NULL,
                               UMS_FOREVER), 0);
  freeaddrinfo(res);
  ums_dns_req_t *req;
  CHECK_RC(ums_net_getaddrinfo_begin("127.0.0.1", "7", NULL, UMS_FOREVER,
                                     &req), UMS_EPERM);
  CHECK_RC(ums_net_getaddrinfo(NULL, NULL, NULL, &res, NULL, UMS_FOREVER),
           UMS_EINVAL);
  CHECK_RC(ums_net_getaddrinfo("127.0.0.1", "7", NULL, NULL, NULL,
                               UMS_FOREVER), UMS_EINVAL);
}

int main(void) {
  rt = tu_runtime_new(2);
  RUN(test_outside_task);
  RUN(test_numeric_and_hosts);
  RUN(test_pool_lookup);
  RUN(test_timeout_and_cancel);
  tu_runtime_shutdown(rt);
  return 0;
}
