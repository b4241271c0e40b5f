/*
** test_waits.c: what tasks wait for and the wait statistics
** (ums_runtime_waits, ums_task_info's wait fields): every wait type the
** runtime knows shows up under its name when a task really parks on it,
** of about the right length; a task blocked on a mutex names the mutex
** and its holder; a task woken while its scheduler is busy shows the
** difference as signal wait; yields are never timed; a reset starts
** afresh; with stats off nothing is timed but the types are still there;
** and the readers are safe from any thread while the counted waits run.
**
** Time bounds are generous (this runs on noisy 2-vCPU VMs and under the
** sanitizers): a lower bound a wait cannot beat, an upper bound that only
** a hang would break.
*/
#include "test-util.h"
#include "internal.h" /* ums__stamp_now, the clock under the figures */

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <stdatomic.h>

#define PTR(n) ((void *)(uintptr_t)(n))
#define MS UMS_NSEC_PER_MSEC

static ums_runtime_t *rt;

static ums_wait_stats_t waits_of(int type) {
  ums_wait_stats_t rows[UMS_WAIT_NTYPES];
  CHECK_EQ(ums_runtime_waits(rt, rows, UMS_WAIT_NTYPES), UMS_WAIT_NTYPES);
  CHECK_EQ(rows[type].type, type);
  CHECK_STR_EQ(rows[type].name, ums_wait_type_name(type));
  return rows[type];
}

/* Polls until task t is suspended in a wait of this type (or fails). */
static ums_task_info_t wait_until_waiting(ums_task_t t, int type) {
  ums_task_info_t info;
  int64_t until = ums_deadline(10 * UMS_NSEC_PER_SEC);
  for (;;) {
    CHECK_RC(ums_task_info(rt, t, &info), 0);
    if (info.state == UMS_TASK_SUSPENDED && info.wait_type == type)
      return info;
    if (ums_now() > until)
      tu_fail(__FILE__, __LINE__, "task never waited on %s (state %s, %s)",
              ums_wait_type_name(type), ums_task_state_name(info.state),
              ums_wait_type_name(info.wait_type));
    usleep(1000);
  }
}

/* ====================================================================== */
/* Names                                                                   */
/* ====================================================================== */

static void test_names(void) {
  static const char *const want[UMS_WAIT_NTYPES] = {
      "none",         "park",         "sleep",     "mutex",
      "semaphore",    "event",        "cond",      "channel_send",
      "channel_recv", "select",       "join",      "waitgroup",
      "file_io",      "preemptive",   "pending_worker", "network"};
  for (int i = 0; i < UMS_WAIT_NTYPES; i++)
    CHECK_STR_EQ(ums_wait_type_name(i), want[i]);
  CHECK(ums_wait_type_name(-1) == NULL);
  CHECK(ums_wait_type_name(UMS_WAIT_NTYPES) == NULL);
  CHECK_STR_EQ(ums_task_state_name(UMS_TASK_PENDING), "pending");
  CHECK_STR_EQ(ums_task_state_name(UMS_TASK_SUSPENDED), "suspended");
  CHECK_STR_EQ(ums_task_state_name(UMS_TASK_DONE), "done");
  CHECK(ums_task_state_name(0) == NULL);
  CHECK(ums_task_state_name(UMS_TASK_DONE + 1) == NULL);
}

/* ====================================================================== */
/* A sleep                                                                 */
/* ====================================================================== */

static void test_sleep(void) {
  rt = tu_runtime_new(1);
  ums_wait_stats_t before = waits_of(UMS_WAIT_SLEEP);
  CHECK_EQ(before.count, 0);
  ums_task_t t = tu_spawn_named(rt, 0, "sleeper", tu_sleep_ms, PTR(100));
  ums_task_info_t info = wait_until_waiting(t, UMS_WAIT_SLEEP);
  CHECK_EQ(info.id, t);
  CHECK_STR_EQ(info.name, "sleeper");
  CHECK_EQ(info.sched, 0);
  CHECK(info.wait_object == NULL);
  CHECK_EQ(info.blocker, 0);
  CHECK_GE(info.wait_ns, 0);
  CHECK_LT(info.wait_ns, 5 * UMS_NSEC_PER_SEC);
  tu_join_ok(rt, t);
  ums_wait_stats_t w = waits_of(UMS_WAIT_SLEEP);
  CHECK_EQ(w.count, 1);
  CHECK_GE(w.total_ns, 95 * MS);
  CHECK_LT(w.total_ns, 3 * UMS_NSEC_PER_SEC);
  CHECK_EQ(w.max_ns, w.total_ns);
  CHECK_GE(w.signal_ns, 0);
  CHECK_LE(w.signal_ns, w.total_ns);
  /* Nothing else waited. */
  for (int i = 1; i < UMS_WAIT_NTYPES; i++)
    if (i != UMS_WAIT_SLEEP && i != UMS_WAIT_JOIN) CHECK_EQ(waits_of(i).count, 0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* A mutex, and who holds it                                               */
/* ====================================================================== */

typedef struct hold {
  ums_mutex_t *m;
  ums_event_t *held;    /* set once the holder has the mutex */
  ums_event_t *release; /* the holder unlocks when this is set */
} hold_t;

static void *holder_fn(void *arg) {
  hold_t *h = arg;
  CHECK_RC(ums_mutex_lock(h->m, UMS_FOREVER), 0);
  CHECK_RC(ums_event_set(h->held), 0);
  CHECK_RC(ums_event_wait(h->release, UMS_FOREVER), 0);
  CHECK_RC(ums_mutex_unlock(h->m), 0);
  return NULL;
}

static void *locker_fn(void *arg) {
  hold_t *h = arg;
  CHECK_RC(ums_mutex_lock(h->m, UMS_FOREVER), 0);
  CHECK_RC(ums_mutex_unlock(h->m), 0);
  return NULL;
}

static void test_mutex_holder(void) {
  rt = tu_runtime_new(2);
  hold_t h = {ums_mutex_new(), ums_event_new(1, 0), ums_event_new(1, 0)};
  ums_task_t a = tu_spawn_named(rt, 0, "holder", holder_fn, &h);
  CHECK_RC(ums_event_wait(h.held, UMS_FOREVER), 0);
  /* The waiter runs on the other scheduler: the holder's id crosses. */
  ums_task_t b = tu_spawn_named(rt, 1, "locker", locker_fn, &h);
  ums_task_info_t info = wait_until_waiting(b, UMS_WAIT_MUTEX);
  CHECK_PTR_EQ(info.wait_object, h.m);
  CHECK_EQ(info.blocker, a);
  CHECK_EQ(info.sched, 1);
  /* And the holder is itself waiting, on the event. */
  ums_task_info_t ia = wait_until_waiting(a, UMS_WAIT_EVENT);
  CHECK_PTR_EQ(ia.wait_object, h.release);
  usleep(50 * 1000);
  CHECK_RC(ums_event_set(h.release), 0);
  tu_join_ok(rt, a);
  tu_join_ok(rt, b);
  ums_wait_stats_t w = waits_of(UMS_WAIT_MUTEX);
  CHECK_EQ(w.count, 1);
  CHECK_GE(w.total_ns, 45 * MS);
  CHECK_EQ(waits_of(UMS_WAIT_EVENT).count, 1);
  tu_runtime_shutdown(rt);
  ums_mutex_delete(h.m);
  ums_event_delete(h.held);
  ums_event_delete(h.release);
}

/* ====================================================================== */
/* Every other type                                                        */
/* ====================================================================== */

typedef struct objs {
  ums_sem_t *sem;
  ums_event_t *ev;
  ums_mutex_t *m;
  ums_cond_t *cond;
  ums_chan_t *ch;
  atomic_int flag;
} objs_t;

static void *sem_fn(void *arg) {
  return PTR(ums_sem_acquire(((objs_t *)arg)->sem, UMS_FOREVER));
}
static void *cond_fn(void *arg) {
  objs_t *o = arg;
  CHECK_RC(ums_mutex_lock(o->m, UMS_FOREVER), 0);
  while (!atomic_load(&o->flag))
    CHECK_RC(ums_cond_wait(o->cond, o->m, UMS_FOREVER), 0);
  CHECK_RC(ums_mutex_unlock(o->m), 0);
  return NULL;
}
static void *recv_fn(void *arg) {
  int v;
  return PTR(ums_chan_recv(((objs_t *)arg)->ch, &v, UMS_FOREVER));
}
static void *send_fn(void *arg) {
  int v = 7;
  return PTR(ums_chan_send(((objs_t *)arg)->ch, &v, UMS_FOREVER));
}
static void *join_fn(void *arg) {
  ums_task_t t = (ums_task_t)(uintptr_t)arg;
  return PTR(ums_task_join(rt, t, UMS_FOREVER, NULL, NULL));
}
static void *park_fn(void *arg) {
  ums_park_token_t tok;
  int type = (int)(uintptr_t)arg;
  CHECK_RC(type ? ums_park_begin_wait(UMS_FOREVER, 0, type, &rt, 42, &tok)
                : ums_park_begin(UMS_FOREVER, &tok),
           0);
  return PTR(ums_park_wait());
}
static void usleep_fn(void *arg) { usleep((useconds_t)(uintptr_t)arg); }
static void *preempt_fn(void *arg) {
  return PTR(ums_preempt(usleep_fn, arg, NULL, UMS_FOREVER));
}
static void *io_fn(void *arg) {
  (void)arg;
  int fd = ums_fs_open("/dev/null", O_RDONLY, 0, UMS_FOREVER);
  CHECK_GE(fd, 0);
  return PTR(ums_fs_close(fd, UMS_FOREVER));
}

/* Waits for a socket that never becomes readable, and gives up. */
static void *net_fn(void *arg) {
  int fd = (int)(intptr_t)arg;
  return PTR(ums_wait_fd(fd, POLLIN, UMS_FOREVER));
}

/* Runs fn as a task and checks that it waits on `type` (on `obj` when not
** NULL) until release() lets it go, and that the wait is then counted. */
static void expect_wait(const char *what, ums_task_fn fn, void *arg,
                        int type, const void *obj,
                        void (*release)(objs_t *, ums_task_t), objs_t *o) {
  printf("   %s\n", what);
  uint64_t n0 = waits_of(type).count;
  ums_task_t t = tu_spawn_named(rt, 0, what, fn, arg);
  ums_task_info_t info = wait_until_waiting(t, type);
  if (obj) CHECK_PTR_EQ(info.wait_object, obj);
  if (release) release(o, t);
  void *res = PTR(1);
  CHECK_RC(ums_task_join(rt, t, ums_deadline(10 * UMS_NSEC_PER_SEC), &res,
                         NULL),
           0);
  CHECK_EQ((intptr_t)res, 0);
  CHECK_EQ(waits_of(type).count, n0 + 1);
}

static void rel_sem(objs_t *o, ums_task_t t) {
  (void)t;
  CHECK_RC(ums_sem_release(o->sem, 1), 0);
}
static void rel_cond(objs_t *o, ums_task_t t) {
  (void)t;
  CHECK_RC(ums_mutex_lock(o->m, UMS_FOREVER), 0);
  atomic_store(&o->flag, 1);
  CHECK_RC(ums_cond_signal(o->cond), 0);
  CHECK_RC(ums_mutex_unlock(o->m), 0);
}
static void rel_recv(objs_t *o, ums_task_t t) {
  (void)t;
  int v = 1;
  CHECK_RC(ums_chan_send(o->ch, &v, UMS_FOREVER), 0);
}
static void rel_send(objs_t *o, ums_task_t t) {
  (void)t;
  int v;
  CHECK_RC(ums_chan_recv(o->ch, &v, UMS_FOREVER), 0);
}
static void rel_ev(objs_t *o, ums_task_t t) {
  (void)t;
  CHECK_RC(ums_event_set(o->ev), 0);
}
/* A park is ended by its token; the test finds the sequence by trying. */
static void rel_park(objs_t *o, ums_task_t t) {
  (void)o;
  for (uint64_t seq = 1; seq < 1000; seq++)
    if (ums_unpark(rt, (ums_park_token_t){t, seq}, 0) == 0) return;
  tu_fail(__FILE__, __LINE__, "no park to end");
}

static void *event_fn(void *arg) {
  return PTR(ums_event_wait(((objs_t *)arg)->ev, UMS_FOREVER));
}

static void test_every_type(void) {
  rt = tu_runtime_new(1);
  objs_t o = {ums_sem_new(0), ums_event_new(0, 0), ums_mutex_new(),
              ums_cond_new(), ums_chan_new(sizeof(int), 0), 0};
  expect_wait("semaphore", sem_fn, &o, UMS_WAIT_SEMAPHORE, o.sem, rel_sem,
              &o);
  expect_wait("event", event_fn, &o, UMS_WAIT_EVENT, o.ev, rel_ev, &o);
  expect_wait("cond", cond_fn, &o, UMS_WAIT_COND, o.cond, rel_cond, &o);
  expect_wait("channel_recv", recv_fn, &o, UMS_WAIT_CHAN_RECV, o.ch,
              rel_recv, &o);
  expect_wait("channel_send", send_fn, &o, UMS_WAIT_CHAN_SEND, o.ch,
              rel_send, &o);
  expect_wait("park", park_fn, PTR(0), UMS_WAIT_PARK, NULL, rel_park, &o);
  /* A described park: its type, object and blocker as given. */
  {
    ums_task_t t =
        tu_spawn_named(rt, 0, "described", park_fn, PTR(UMS_WAIT_SELECT));
    ums_task_info_t info = wait_until_waiting(t, UMS_WAIT_SELECT);
    CHECK_PTR_EQ(info.wait_object, &rt);
    CHECK_EQ(info.blocker, 42);
    rel_park(&o, t);
    tu_join_ok(rt, t);
    CHECK_EQ(waits_of(UMS_WAIT_SELECT).count, 1);
  }
  /* Joining a task names it as object and blocker. */
  {
    ums_task_t sleeper =
        tu_spawn_named(rt, 0, "sleeper", tu_sleep_ms, PTR(100));
    ums_task_t j =
        tu_spawn_named(rt, 0, "joiner", join_fn, (void *)(uintptr_t)sleeper);
    ums_task_info_t info = wait_until_waiting(j, UMS_WAIT_JOIN);
    CHECK_EQ(info.blocker, sleeper);
    tu_join_ok(rt, j);
    CHECK_GE(waits_of(UMS_WAIT_JOIN).count, 1);
  }
  expect_wait("preemptive", preempt_fn, PTR(300000), UMS_WAIT_PREEMPT, NULL,
              NULL, &o);
  /* File I/O may complete before the test sees it waiting; count only. */
  {
    uint64_t n0 = waits_of(UMS_WAIT_FILE_IO).count;
    tu_join_ok(rt, tu_spawn_named(rt, 0, "io", io_fn, NULL));
    CHECK_GE(waits_of(UMS_WAIT_FILE_IO).count, n0 + 1);
  }
  /* A socket wait is a network wait, not file I/O. */
  {
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    ums_task_t t = tu_spawn_named(rt, 0, "net", net_fn, PTR(sv[0]));
    wait_until_waiting(t, UMS_WAIT_NET);
    CHECK_RC(ums_task_cancel(rt, t), 0);
    void *res = NULL;
    CHECK_RC(ums_task_join(rt, t, ums_deadline(10 * UMS_NSEC_PER_SEC), &res,
                           NULL), 0);
    CHECK_EQ((int)(intptr_t)res, UMS_ECANCELED);
    CHECK_GE(waits_of(UMS_WAIT_NET).count, 1);
    close(sv[0]);
    close(sv[1]);
  }
  /* A bad type is refused; a park outside a task too. */
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin_wait(UMS_FOREVER, 0, UMS_WAIT_SLEEP, NULL, 0, &tok),
           UMS_EPERM);
  tu_runtime_shutdown(rt);
  ums_sem_delete(o.sem);
  ums_event_delete(o.ev);
  ums_mutex_delete(o.m);
  ums_cond_delete(o.cond);
  ums_chan_delete(o.ch);
}

static void *bad_type_fn(void *arg) {
  (void)arg;
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin_wait(UMS_FOREVER, 0, UMS_WAIT_NONE, NULL, 0, &tok),
           UMS_EINVAL);
  CHECK_RC(ums_park_begin_wait(UMS_FOREVER, 0, UMS_WAIT_NTYPES, NULL, 0,
                               &tok),
           UMS_EINVAL);
  return NULL;
}

static void test_bad_type(void) {
  rt = tu_runtime_new(1);
  tu_join_ok(rt, tu_spawn_named(rt, 0, "bad", bad_type_fn, NULL));
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Pending worker                                                          */
/* ====================================================================== */

static void test_pending_worker(void) {
  ums_config_t cfg = {.schedulers = 1, .max_workers = 1};
  rt = tu_runtime_new_cfg(&cfg);
  ums_task_t a = tu_spawn_named(rt, 0, "first", tu_sleep_ms, PTR(100));
  ums_task_t b = tu_spawn_named(rt, 0, "second", tu_sleep_ms, PTR(1));
  /* b waits for a's worker: pending, in a pending_worker wait. */
  ums_task_info_t info;
  int64_t until = ums_deadline(5 * UMS_NSEC_PER_SEC);
  do {
    CHECK_RC(ums_task_info(rt, b, &info), 0);
    CHECK_LT(ums_now(), until);
  } while (info.wait_type != UMS_WAIT_PENDING_WORKER);
  CHECK_EQ(info.state, UMS_TASK_PENDING);
  tu_join_ok(rt, a);
  tu_join_ok(rt, b);
  ums_wait_stats_t w = waits_of(UMS_WAIT_PENDING_WORKER);
  CHECK_EQ(w.count, 1);
  CHECK_GE(w.total_ns, 80 * MS);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Signal wait: woken, but the scheduler is busy                           */
/* ====================================================================== */

static void test_signal_wait(void) {
  rt = tu_runtime_new(1);
  /* The waiter is woken from this thread 20 ms into the hog's 200 ms on
  ** its scheduler, and runs only once the hog is done: most of its wait is
  ** spent runnable. (A timer that fires while its scheduler is busy is
  ** different: it is late, which the wait shows, but the task is woken
  ** only when the scheduler gets to it.) */
  objs_t o = {.ev = ums_event_new(0, 0)};
  ums_task_t w = tu_spawn_named(rt, 0, "waiter", event_fn, &o);
  wait_until_waiting(w, UMS_WAIT_EVENT);
  ums_task_t h = tu_spawn_named(rt, 0, "hog", tu_spin_ms, PTR(200));
  /* The event is set once the hog runs: set earlier (a loaded machine
  ** may start the hog late), the waiter would run first. */
  ums_task_info_t info;
  WAIT_UNTIL(ums_task_info(rt, h, &info) == 0 &&
                 info.state == UMS_TASK_RUNNING,
             5000);
  usleep(20 * 1000);
  CHECK_RC(ums_event_set(o.ev), 0);
  CHECK_RC(ums_task_info(rt, w, &info), 0);
  if (info.state == UMS_TASK_RUNNABLE) CHECK_GE(info.runnable_ns, 0);
  tu_join_ok(rt, h);
  tu_join_ok(rt, w);
  ums_wait_stats_t st = waits_of(UMS_WAIT_EVENT);
  CHECK_EQ(st.count, 1);
  CHECK_GE(st.total_ns, 150 * MS);
  CHECK_GE(st.signal_ns, 100 * MS);
  CHECK_LE(st.signal_ns, st.total_ns);
  tu_runtime_shutdown(rt);
  ums_event_delete(o.ev);
}

/* ====================================================================== */
/* Yields are counted, never timed; resets                                 */
/* ====================================================================== */

static void test_yields_and_reset(void) {
  rt = tu_runtime_new(1);
  ums_task_t a = tu_spawn_named(rt, 0, "y1", tu_yield_n, PTR(500));
  ums_task_t b = tu_spawn_named(rt, 0, "y2", tu_yield_n, PTR(500));
  tu_join_ok(rt, a);
  tu_join_ok(rt, b);
  CHECK_GE(tu_stats(rt, 0).yields, 1000);
  uint64_t waits = 0;
  for (int i = 1; i < UMS_WAIT_NTYPES; i++)
    if (i != UMS_WAIT_JOIN) waits += waits_of(i).count;
  CHECK_EQ(waits, 0);

  tu_join_ok(rt, tu_spawn_named(rt, 0, "s", tu_sleep_ms, PTR(20)));
  CHECK_EQ(waits_of(UMS_WAIT_SLEEP).count, 1);
  CHECK_RC(ums_runtime_waits_reset(rt), 0);
  ums_wait_stats_t w = waits_of(UMS_WAIT_SLEEP);
  CHECK_EQ(w.count, 0);
  CHECK_EQ(w.total_ns, 0);
  CHECK_EQ(w.max_ns, 0);
  tu_join_ok(rt, tu_spawn_named(rt, 0, "s", tu_sleep_ms, PTR(30)));
  w = waits_of(UMS_WAIT_SLEEP);
  CHECK_EQ(w.count, 1);
  CHECK_GE(w.total_ns, 25 * MS);
  CHECK_EQ(w.max_ns, w.total_ns);
  CHECK_RC(ums_runtime_waits_reset(NULL), UMS_EINVAL);
  CHECK_RC(ums_runtime_waits(NULL, NULL, 0), UMS_EINVAL);
  tu_runtime_shutdown(rt);
}

/* A runtime of one scheduler with the given stats setting, in force. */
static ums_runtime_t *stats_runtime(int stats) {
  ums_config_t cfg = {.schedulers = 1, .stats = stats};
  ums_runtime_t *r = tu_runtime_new_cfg(&cfg);
  ums_config_t c;
  ums_runtime_config(r, &c);
  CHECK_EQ(c.stats, stats);
  return r;
}

/* ====================================================================== */
/* Stats off                                                               */
/* ====================================================================== */

static void test_stats_off(void) {
  rt = stats_runtime(UMS_STATS_OFF);
  ums_task_t t = tu_spawn_named(rt, 0, "sleeper", tu_sleep_ms, PTR(50));
  ums_task_info_t info = wait_until_waiting(t, UMS_WAIT_SLEEP);
  CHECK_EQ(info.wait_ns, -1);
  CHECK_EQ(info.runnable_ns, -1);
  CHECK_EQ(info.cpu_ns, -1);
  tu_join_ok(rt, t);
  CHECK_EQ(waits_of(UMS_WAIT_SLEEP).count, 0);
  tu_runtime_shutdown(rt);
  /* A bad value is refused. */
  int err = 0;
  ums_config_t cfg = {.schedulers = 1, .stats = UMS_STATS_PRECISE + 1};
  CHECK(ums_runtime_new(&cfg, &err) == NULL);
  CHECK_RC(err, UMS_EINVAL);
  cfg.stats = -1;
  CHECK(ums_runtime_new(&cfg, &err) == NULL);
  CHECK_RC(err, UMS_EINVAL);
}

/* ====================================================================== */
/* The wait clock, and precise stats                                       */
/* ====================================================================== */

/* Two tasks passing a message back and forth for `ms` of real time: at
** any moment one of them at least is in a channel wait. */
typedef struct pingpong {
  ums_chan_t *ab, *ba;
  int64_t until;
  _Atomic long msgs;
} pingpong_t;

static void *ping_fn(void *arg) {
  pingpong_t *p = arg;
  int v = 1;
  while (ums_now() < p->until) {
    CHECK_RC(ums_chan_send(p->ab, &v, UMS_FOREVER), 0);
    CHECK_RC(ums_chan_recv(p->ba, &v, UMS_FOREVER), 0);
    atomic_fetch_add(&p->msgs, 2);
  }
  v = 0;
  CHECK_RC(ums_chan_send(p->ab, &v, UMS_FOREVER), 0);
  return NULL;
}

static void *pong_fn(void *arg) {
  pingpong_t *p = arg;
  for (;;) {
    int v;
    CHECK_RC(ums_chan_recv(p->ab, &v, UMS_FOREVER), 0);
    if (!v) return NULL;
    CHECK_RC(ums_chan_send(p->ba, &v, UMS_FOREVER), 0);
  }
}

/* Runs the ping-pong for 300 ms and checks that the channel waits add up
** to about that time, whatever the clock: each wait is far shorter than
** the wait clock's tick, but the ticks that fall inside waits add up. */
static void check_pingpong_total(void) {
  pingpong_t p = {.ab = ums_chan_new(sizeof(int), 0),
                  .ba = ums_chan_new(sizeof(int), 0)};
  CHECK(p.ab && p.ba);
  CHECK_RC(ums_runtime_waits_reset(rt), 0);
  int64_t t0 = ums_now();
  p.until = t0 + 300 * MS;
  ums_task_t a = tu_spawn_named(rt, 0, "ping", ping_fn, &p);
  ums_task_t b = tu_spawn_named(rt, 0, "pong", pong_fn, &p);
  tu_join_ok(rt, a);
  tu_join_ok(rt, b);
  int64_t elapsed = ums_now() - t0;
  ums_wait_stats_t r = waits_of(UMS_WAIT_CHAN_RECV),
                   sd = waits_of(UMS_WAIT_CHAN_SEND);
  int64_t total = r.total_ns + sd.total_ns;
  printf("   %ld messages, channel waits %.1f ms of %.1f ms, max %.3f ms\n",
          atomic_load(&p.msgs), total / 1e6, elapsed / 1e6,
          (r.max_ns > sd.max_ns ? r.max_ns : sd.max_ns) / 1e6);
  CHECK_GE(r.count + sd.count, 100);
  CHECK_GE(total, elapsed / 2);
  CHECK_LE(total, elapsed * 5 / 2);
  ums_chan_delete(p.ab);
  ums_chan_delete(p.ba);
}

static void test_wait_clock(void) {
  rt = tu_runtime_new(1);
  ums_config_t c;
  ums_runtime_config(rt, &c);
  CHECK_EQ(c.stats, UMS_STATS_ON);
  /* It moves while a scheduler is busy, though no park reads a clock. */
  check_pingpong_total();
  /* Idle for 300 ms: the monitor sleeps and the wait clock with it. A
  ** 20 ms sleep that starts right after must not be counted from where
  ** the clock stopped. */
  usleep(300 * 1000);
  CHECK_RC(ums_runtime_waits_reset(rt), 0);
  tu_join_ok(rt, tu_spawn_named(rt, 0, "sleeper", tu_sleep_ms, PTR(20)));
  ums_wait_stats_t w = waits_of(UMS_WAIT_SLEEP);
  CHECK_EQ(w.count, 1);
  CHECK_GE(w.total_ns, 18 * MS);
  CHECK_LT(w.total_ns, 200 * MS);
  /* Never backwards, and within a few ticks of the stamp clock while a
  ** task computes. */
  ums_task_t h = tu_spawn_named(rt, 0, "hog", tu_spin_ms, PTR(100));
  int64_t prev = atomic_load(&rt->wait_clock.ns), lag_max = 0;
  for (int i = 0; i < 50; i++) {
    usleep(1000);
    int64_t wc = atomic_load(&rt->wait_clock.ns), now = ums__stamp_now();
    CHECK_GE(wc, prev);
    CHECK_LE(wc, now);
    if (now - wc > lag_max) lag_max = now - wc;
    prev = wc;
  }
  tu_join_ok(rt, h);
  printf("   wait clock at most %.2f ms behind\n", lag_max / 1e6);
  tu_runtime_shutdown(rt);
}

/* A 30 ms sleep, with what its wait is timed against. The wait runs from
** the park's stamp (t->wait_since), taken after the deadline is computed,
** to the stamp of the wake that the deadline's timer makes: what the
** runtime promises is that this end is not before the deadline, not that
** the wait lasts 30 ms, since the park may come well after the call on a
** crowded machine. */
typedef struct timed_sleep {
  int64_t called;   /* stamp clock: before ums_sleep_until */
  int64_t deadline; /* the runtime's clock (CLOCK_MONOTONIC) */
  int64_t parked;   /* stamp clock: the park, where the wait starts */
  int64_t resumed;  /* stamp clock: once the task runs again */
  /* The stamp clock minus the runtime's clock, within +- skew: two
  ** readings of the latter bracket one of the former. Zero on the
  ** gettime fallback, which is the runtime's clock itself. */
  int64_t offset, skew;
} timed_sleep_t;

static void *timed_sleeper(void *arg) {
  timed_sleep_t *p = arg;
  p->called = ums__stamp_now();
  p->deadline = ums_deadline(30 * MS);
  CHECK_RC(ums_sleep_until(p->deadline), 0);
  p->resumed = ums__stamp_now();
  p->parked = atomic_load(&ums__task_current()->wait_since);
  int64_t c0 = ums_now(), st = ums__stamp_now(), c1 = ums_now();
  p->offset = st - (c0 + (c1 - c0) / 2);
  p->skew = (c1 - c0) / 2 + 1;
  return NULL;
}

static void test_precise(void) {
  rt = stats_runtime(UMS_STATS_PRECISE);
  check_pingpong_total();
  /* Each wait is timed: a ping-pong's waits are microseconds, never a
  ** tick, and none is zero-length on average. */
  ums_wait_stats_t r = waits_of(UMS_WAIT_CHAN_RECV),
                   sd = waits_of(UMS_WAIT_CHAN_SEND);
  CHECK_GT(r.count + sd.count, 0);
  CHECK_GT(r.total_ns + sd.total_ns, 0);
  CHECK_LT((r.total_ns + sd.total_ns) / (r.count + sd.count), 1 * MS);
  timed_sleep_t p = {0};
  tu_join_ok(rt, tu_spawn_named(rt, 0, "sleeper", timed_sleeper, &p));
  ums_wait_stats_t w = waits_of(UMS_WAIT_SLEEP);
  CHECK_EQ(w.count, 1);
  int64_t ended = p.parked + w.total_ns;
  printf("   a 30 ms sleep: parked %.3f ms after the call, timed %.3f ms, "
         "ended %.3f ms after its deadline\n", (p.parked - p.called) / 1e6,
         w.total_ns / 1e6, (ended - p.offset - p.deadline) / 1e6);
  /* The wait starts at the park, after the call; it ends at or after
  ** the deadline (on the stamp clock), and before the task runs again. */
  CHECK_GE(p.parked, p.called);
  CHECK_GE(ended, p.deadline + p.offset - p.skew);
  CHECK_LE(ended, p.resumed);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* A virtual clock                                                         */
/* ====================================================================== */

static void test_virtual_clock(void) {
  /* Waits last what the tasks saw: 5 s of virtual time, in no real time
  ** to speak of. */
  ums_config_t cfg = {.schedulers = 1, .clock = UMS_CLOCK_VIRTUAL};
  rt = tu_runtime_new_cfg(&cfg);
  int64_t real0 = ums_now();
  tu_join_ok(rt, tu_spawn_named(rt, 0, "sleeper", tu_sleep_ms, PTR(5000)));
  CHECK_LT(ums_now() - real0, 3 * UMS_NSEC_PER_SEC);
  ums_wait_stats_t w = waits_of(UMS_WAIT_SLEEP);
  CHECK_EQ(w.count, 1);
  CHECK_GE(w.total_ns, 5 * UMS_NSEC_PER_SEC);
  CHECK_LT(w.total_ns, 5 * UMS_NSEC_PER_SEC + 100 * MS);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* The stamp clock                                                         */
/* ====================================================================== */

static void test_stamp_clock(void) {
  /* Monotonic, and in step with CLOCK_MONOTONIC over 200 ms (once
  ** calibrated, it is the counter scaled; before, the clock itself). */
  int64_t s0 = ums__stamp_now(), c0 = ums_now();
  int64_t prev = s0;
  for (int i = 0; i < 200; i++) {
    usleep(1000);
    int64_t s = ums__stamp_now();
    CHECK_GE(s, prev);
    prev = s;
  }
  int64_t ds = ums__stamp_now() - s0, dc = ums_now() - c0;
  CHECK_GE(ds, dc - dc / 20 - MS);
  CHECK_LE(ds, dc + dc / 20 + MS);
  printf("   stamp clock: %s\n",
         atomic_load(&ums__stamp.ready) ? "time stamp counter" : "clock_gettime");
}

/* ====================================================================== */
/* Readers while everything runs                                           */
/* ====================================================================== */

typedef struct churn {
  ums_chan_t *ch;
  atomic_int stop;
  atomic_long reads;
} churn_t;

static void *pinger_fn(void *arg) {
  churn_t *c = arg;
  int v = 0;
  while (!atomic_load(&c->stop))
    if (ums_chan_send(c->ch, &v, ums_deadline(50 * MS)) == UMS_ECANCELED) break;
  return NULL;
}
static void *ponger_fn(void *arg) {
  churn_t *c = arg;
  int v;
  while (!atomic_load(&c->stop))
    if (ums_chan_recv(c->ch, &v, ums_deadline(50 * MS)) == UMS_ECANCELED) break;
  return NULL;
}

static int count_visit(const ums_task_info_t *info, void *arg) {
  CHECK_NE(info->id, 0);
  CHECK(info->state >= UMS_TASK_PENDING && info->state <= UMS_TASK_DONE);
  CHECK(info->wait_type >= 0 && info->wait_type < UMS_WAIT_NTYPES);
  (*(int *)arg)++;
  return 0;
}

static void read_everything(churn_t *c) {
  ums_sched_stats_t rows[4];
  ums_pool_stats_t pools[2];
  ums_wait_stats_t w[UMS_WAIT_NTYPES];
  int n = 0;
  CHECK_EQ(ums_runtime_stats(rt, rows, 4), 2);
  CHECK_EQ(ums_runtime_pool_stats(rt, pools, 2), 2);
  CHECK_EQ(ums_runtime_waits(rt, w, UMS_WAIT_NTYPES), UMS_WAIT_NTYPES);
  CHECK_GE(ums_runtime_tasks(rt, count_visit, &n), 0);
  atomic_fetch_add(&c->reads, 1);
}

static void *reader_fn(void *arg) {
  churn_t *c = arg;
  while (!atomic_load(&c->stop)) {
    read_everything(c);
    CHECK_RC(ums_yield(), 0);
  }
  return NULL;
}

static void *host_reader(void *arg) {
  churn_t *c = arg;
  while (!atomic_load(&c->stop)) {
    read_everything(c);
    if (atomic_load(&c->reads) % 16 == 0) ums_runtime_waits_reset(rt);
  }
  return NULL;
}

static void test_readers_race(void) {
  rt = tu_runtime_new(2);
  churn_t c = {ums_chan_new(sizeof(int), 0), 0, 0};
  ums_task_t ts[6];
  ts[0] = tu_spawn_named(rt, 0, "ping", pinger_fn, &c);
  ts[1] = tu_spawn_named(rt, 1, "pong", ponger_fn, &c);
  ts[2] = tu_spawn_named(rt, 0, "ping2", pinger_fn, &c);
  ts[3] = tu_spawn_named(rt, 1, "pong2", ponger_fn, &c);
  ts[4] = tu_spawn_named(rt, 0, "reader0", reader_fn, &c);
  ts[5] = tu_spawn_named(rt, 1, "reader1", reader_fn, &c);
  pthread_t th;
  CHECK_EQ(pthread_create(&th, NULL, host_reader, &c), 0);
  usleep(300 * 1000);
  atomic_store(&c.stop, 1);
  pthread_join(th, NULL);
  for (int i = 0; i < 6; i++) tu_join_ok(rt, ts[i]);
  CHECK_GE(atomic_load(&c.reads), 3);
  CHECK_GE(waits_of(UMS_WAIT_CHAN_RECV).count + waits_of(UMS_WAIT_CHAN_SEND).count, 1);
  tu_runtime_shutdown(rt);
  ums_chan_delete(c.ch);
}

int main(void) {
  RUN(test_names);
  RUN(test_stamp_clock);
  RUN(test_sleep);
  RUN(test_mutex_holder);
  RUN(test_every_type);
  RUN(test_bad_type);
  RUN(test_pending_worker);
  RUN(test_signal_wait);
  RUN(test_yields_and_reset);
  RUN(test_stats_off);
  RUN(test_wait_clock);
  RUN(test_precise);
  RUN(test_virtual_clock);
  RUN(test_readers_race);
  return 0;
}
