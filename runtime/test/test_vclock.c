/*
** test_vclock.c: the virtual clock (ums.h, "Virtual clock") and
** ums_wait_idle: configuration rules, an hour of sleeps passing at once
** and exactly, wake order by deadline and the same on every run, timeouts
** of the primitives, time standing still while a preemptive call or a
** file read is in flight (with both I/O backends), run-until-idle in both
** clocks, the bounded list of idle waiters, and a virtual runtime with
** nothing to do sleeping without CPU.
**
** Time is never measured against a tight bound here: virtual durations
** are checked exactly (they are numbers the runtime computes), and real
** time only against limits that a hang would break and a slow machine
** would not (a virtual hour must not take a real minute).
**
** Tasks report into memory the test owns; the host reads it after
** joining the task (a join orders the task's writes before its return)
** or after the runtime is shut down.
*/
#include "internal.h"
#include "test-util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <time.h>

#define HOUR (3600 * UMS_NSEC_PER_SEC)
#define SEC UMS_NSEC_PER_SEC
/* A virtual hour must not take a real minute: it takes microseconds, and
** a runtime that slept for real would take the hour. */
#define REAL_LIMIT_MS 60000

static ums_runtime_t *rt;

static ums_runtime_t *virtual_runtime(int io_backend) {
  ums_config_t cfg = {.clock = UMS_CLOCK_VIRTUAL, .io_backend = io_backend};
  return tu_runtime_new_cfg(&cfg);
}

static ums_task_t spawn(ums_task_fn fn, void *arg) {
  ums_spawn_opts_t o = {.sched = 0};
  ums_task_t t = 0;
  CHECK_RC(ums_task_spawn(rt, &o, fn, arg, &t), 0);
  return t;
}

static void *join(ums_task_t t) {
  void *res = NULL;
  CHECK_RC(ums_task_join(rt, t, ums_deadline(tu_ms(REAL_LIMIT_MS)), &res,
                         NULL),
           0);
  return res;
}

static void real_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

/* ====================================================================== */
/* Configuration                                                           */
/* ====================================================================== */

static void test_config(void) {
  int err = 0;
  ums_config_t two = {.schedulers = 2, .clock = UMS_CLOCK_VIRTUAL};
  CHECK(ums_runtime_new(&two, &err) == NULL);
  CHECK_RC(err, UMS_EINVAL);
  ums_config_t bad = {.clock = 7};
  err = 0;
  CHECK(ums_runtime_new(&bad, &err) == NULL);
  CHECK_RC(err, UMS_EINVAL);

  /* schedulers = 0 means one scheduler, not one per CPU. */
  rt = virtual_runtime(UMS_IO_AUTO);
  CHECK_EQ(ums_runtime_schedulers(rt), 1);
  ums_config_t c;
  ums_runtime_config(rt, &c);
  CHECK_EQ(c.clock, UMS_CLOCK_VIRTUAL);
  CHECK_EQ(c.schedulers, 1);
  /* Starts at 0, whatever the real clock says. */
  CHECK_EQ(ums_runtime_now(rt), 0);
  tu_runtime_shutdown(rt);

  rt = tu_runtime_new(1);
  ums_runtime_config(rt, &c);
  CHECK_EQ(c.clock, UMS_CLOCK_REAL);
  int64_t a = ums_now(), b = ums_runtime_now(rt), d = ums_now();
  CHECK(a <= b && b <= d);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* An hour passes at once, exactly                                         */
/* ====================================================================== */

typedef struct hour_rec {
  int64_t before, after, deadline_seen;
  int rc;
} hour_rec_t;

static void *sleep_hour(void *arg) {
  hour_rec_t *h = arg;
  h->before = ums_now();
  h->deadline_seen = ums_deadline(HOUR) - h->before;
  h->rc = ums_sleep(HOUR);
  h->after = ums_now();
  return NULL;
}

static void test_hour(void) {
  rt = virtual_runtime(UMS_IO_AUTO);
  int64_t real0 = ums_now();
  hour_rec_t h = {0};
  join(spawn(sleep_hour, &h));
  CHECK_RC(h.rc, 0);
  CHECK_EQ(h.deadline_seen, HOUR);
  CHECK_EQ(h.after - h.before, HOUR);
  /* Nothing else was armed: the clock stopped where the sleep ended. */
  CHECK_EQ(h.before, 0);
  CHECK_EQ(ums_runtime_now(rt), HOUR);
  CHECK_LT(tu_elapsed_ms(real0), REAL_LIMIT_MS);
  /* The host's clock is real: ums_now() there is not the runtime's. */
  CHECK_GT(ums_now(), real0);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Wake order: by deadline, ties in sleep order, the same on every run     */
/* ====================================================================== */

#define NSLEEPERS 200

typedef struct order_log {
  int n;
  int who[NSLEEPERS];
  int64_t late[NSLEEPERS];   /* virtual wake time minus deadline */
  int64_t at[NSLEEPERS];     /* virtual wake time minus the start */
  int64_t start;
} order_log_t;

typedef struct sleeper {
  order_log_t *log;
  int id;
  int64_t ns;
} sleeper_t;

static sleeper_t sleepers[NSLEEPERS];

static void *sleeper_main(void *arg) {
  sleeper_t *s = arg;
  int64_t deadline = ums_deadline(s->ns);
  CHECK_RC(ums_sleep_until(deadline), 0);
  order_log_t *log = s->log;
  int64_t now = ums_now();
  log->who[log->n] = s->id;
  log->late[log->n] = now - deadline;
  log->at[log->n] = now - log->start;
  log->n++;
  return NULL;
}

static void *spawn_sleepers(void *arg) {
  order_log_t *log = arg;
  log->start = ums_now();
  ums_task_t t[NSLEEPERS];
  /* Spawned from inside the runtime, so every sleeper starts (and arms
  ** its timer) before the clock can move: a host thread's spawns could
  ** straddle a jump. */
  for (int i = 0; i < NSLEEPERS; i++) t[i] = spawn(sleeper_main, &sleepers[i]);
  for (int i = 0; i < NSLEEPERS; i++)
    CHECK_RC(ums_task_join(rt, t[i], UMS_FOREVER, NULL, NULL), 0);
  return NULL;
}

static void run_sleepers(order_log_t *log) {
  uint64_t x = 0x9e3779b97f4a7c15u;
  for (int i = 0; i < NSLEEPERS; i++) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    /* 0 to 59 minutes in whole minutes: many ties. */
    sleepers[i] = (sleeper_t){log, i, (int64_t)((x * 0x2545f4914f6cdd1du) >>
                                                58) % 60 * 60 * SEC};
  }
  rt = virtual_runtime(UMS_IO_AUTO);
  int64_t real0 = ums_now();
  join(spawn(spawn_sleepers, log));
  CHECK_LT(tu_elapsed_ms(real0), REAL_LIMIT_MS);
  tu_runtime_shutdown(rt);
}

static void test_wake_order(void) {
  static order_log_t a, b;
  run_sleepers(&a);
  CHECK_EQ(a.n, NSLEEPERS);
  for (int i = 0; i < NSLEEPERS; i++) {
    CHECK_EQ(a.late[i], 0); /* never late, never early */
    CHECK_EQ(a.at[i], sleepers[a.who[i]].ns);
    if (i > 0) {
      const sleeper_t *p = &sleepers[a.who[i - 1]], *q = &sleepers[a.who[i]];
      CHECK(p->ns < q->ns || (p->ns == q->ns && p->id < q->id));
    }
  }
  run_sleepers(&b);
  CHECK_EQ(b.n, NSLEEPERS);
  for (int i = 0; i < NSLEEPERS; i++) {
    CHECK_EQ(a.who[i], b.who[i]);
    CHECK_EQ(a.at[i], b.at[i]);
  }
}

/* ====================================================================== */
/* Timeouts of the primitives                                              */
/* ====================================================================== */

typedef struct timeouts {
  int ev, sem, chan, join;
  int64_t t_ev, t_sem, t_chan, t_join;
} timeouts_t;

static void *forever(void *arg) {
  (void)arg;
  ums_sleep(UMS_FOREVER);
  return NULL;
}

static void *wait_timeouts(void *arg) {
  timeouts_t *r = arg;
  ums_event_t *e = ums_event_new(1, 0);
  ums_sem_t *s = ums_sem_new(0);
  ums_chan_t *c = ums_chan_new(sizeof(int), 0);
  int v;
  int64_t t0 = ums_now();
  r->ev = ums_event_wait(e, ums_deadline(10 * SEC));
  r->t_ev = ums_now() - t0;
  r->sem = ums_sem_acquire(s, ums_deadline(5 * SEC));
  r->t_sem = ums_now() - t0;
  r->chan = ums_chan_recv(c, &v, ums_deadline(2 * SEC));
  r->t_chan = ums_now() - t0;
  ums_task_t f = spawn(forever, NULL);
  r->join = ums_task_join(rt, f, ums_deadline(HOUR), NULL, NULL);
  r->t_join = ums_now() - t0;
  ums_task_cancel(rt, f);
  CHECK_RC(ums_task_join(rt, f, UMS_FOREVER, NULL, NULL), 0);
  ums_event_delete(e);
  ums_sem_delete(s);
  ums_chan_delete(c);
  return NULL;
}

static void test_timeouts(void) {
  rt = virtual_runtime(UMS_IO_AUTO);
  timeouts_t r = {0};
  join(spawn(wait_timeouts, &r));
  CHECK_RC(r.ev, UMS_ETIMEDOUT);
  CHECK_RC(r.sem, UMS_ETIMEDOUT);
  CHECK_RC(r.chan, UMS_ETIMEDOUT);
  CHECK_RC(r.join, UMS_ETIMEDOUT);
  CHECK_EQ(r.t_ev, 10 * SEC);
  CHECK_EQ(r.t_sem, 15 * SEC);
  CHECK_EQ(r.t_chan, 17 * SEC);
  CHECK_EQ(r.t_join, 17 * SEC + HOUR);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Time stands still while a preemptive call is in flight                  */
/* ====================================================================== */

typedef struct held {
  _Atomic int call_done;   /* set by the C call as it returns */
  int rc1, rc2;
  int64_t t0, t1, t2;      /* the caller's clock around its calls */
  int64_t woke;            /* when the sleeper woke */
  int done_when_woke;      /* the call had returned by then */
} held_t;

static void slow_call(void *arg) {
  held_t *h = arg;
  real_sleep_ms(100);
  atomic_store(&h->call_done, 1);
}

static void *preempt_caller(void *arg) {
  held_t *h = arg;
  h->t0 = ums_now();
  h->rc1 = ums_preempt(slow_call, h, NULL, UMS_FOREVER);
  h->t1 = ums_now();
  /* A deadline 10 ms (virtual) away cannot pass during 100 ms (real) of
  ** call: the clock does not move while it is in flight. */
  atomic_store(&h->call_done, 0);
  h->rc2 = ums_preempt(slow_call, h, NULL, ums_deadline(tu_ms(10)));
  h->t2 = ums_now();
  return NULL;
}

static void *held_sleeper(void *arg) {
  held_t *h = arg;
  ums_sleep(SEC);
  h->woke = ums_now();
  h->done_when_woke = atomic_load(&h->call_done);
  return NULL;
}

static void *preempt_pair(void *arg) {
  ums_task_t a = spawn(preempt_caller, arg);
  ums_task_t b = spawn(held_sleeper, arg);
  CHECK_RC(ums_task_join(rt, a, UMS_FOREVER, NULL, NULL), 0);
  CHECK_RC(ums_task_join(rt, b, UMS_FOREVER, NULL, NULL), 0);
  return NULL;
}

static void test_preempt_holds_clock(void) {
  rt = virtual_runtime(UMS_IO_AUTO);
  held_t h = {0};
  join(spawn(preempt_pair, &h));
  CHECK_RC(h.rc1, 0);
  CHECK_RC(h.rc2, 0);
  CHECK_EQ(h.t1, h.t0);
  CHECK_EQ(h.t2, h.t0);
  /* The sleeper's second could only pass once both calls had returned. */
  CHECK_EQ(h.done_when_woke, 1);
  CHECK_EQ(h.woke, h.t0 + SEC);
  tu_runtime_shutdown(rt);
}

/* ====================================================================== */
/* Time stands still while a file read is in flight                        */
/* ====================================================================== */

typedef struct pipe_read {
  int fd;
  int64_t n;
  char data[16];
  int64_t t0, t1, woke;
  _Atomic int written;     /* the host wrote the pipe */
  int written_when_woke;
} pipe_read_t;

static void *pipe_reader(void *arg) {
  pipe_read_t *p = arg;
  ums_buf_t *buf = ums_buf_new(sizeof p->data);
  CHECK(buf != NULL);
  p->t0 = ums_now();
  /* Deadline 1 s (virtual); the data comes after 100 ms (real). */
  p->n = ums_fs_read(p->fd, buf, 0, sizeof p->data, UMS_FS_CUR,
                     ums_deadline(SEC));
  p->t1 = ums_now();
  if (p->n > 0) memcpy(p->data, ums_buf_data(buf), (size_t)p->n);
  ums_buf_release(buf);
  return NULL;
}

static void *pipe_sleeper(void *arg) {
  pipe_read_t *p = arg;
  ums_sleep(SEC / 2);
  p->woke = ums_now();
  p->written_when_woke = atomic_load(&p->written);
  return NULL;
}

static void *pipe_pair(void *arg) {
  ums_task_t a = spawn(pipe_reader, arg);
  ums_task_t b = spawn(pipe_sleeper, arg);
  CHECK_RC(ums_task_join(rt, a, UMS_FOREVER, NULL, NULL), 0);
  CHECK_RC(ums_task_join(rt, b, UMS_FOREVER, NULL, NULL), 0);
  return NULL;
}

static void io_holds_clock(int backend) {
  int fds[2];
  CHECK_EQ(pipe(fds), 0);
  rt = virtual_runtime(backend);
  pipe_read_t p = {.fd = fds[0]};
  ums_task_t t = spawn(pipe_pair, &p);
  real_sleep_ms(100);
  atomic_store(&p.written, 1);
  CHECK_EQ(write(fds[1], "hello", 5), 5);
  join(t);
  CHECK_EQ(p.n, 5);
  CHECK(memcmp(p.data, "hello", 5) == 0);
  CHECK_EQ(p.t1, p.t0);
  CHECK_EQ(p.written_when_woke, 1);
  CHECK_EQ(p.woke, p.t0 + SEC / 2);
  tu_runtime_shutdown(rt);
  close(fds[0]);
  close(fds[1]);
}

static void test_io_holds_clock_pool(void) { io_holds_clock(UMS_IO_POOL); }
static void test_io_holds_clock_auto(void) { io_holds_clock(UMS_IO_AUTO); }

/* ====================================================================== */
/* ums_wait_idle                                                           */
/* ====================================================================== */

#define NCHILD 3
#define NYIELD 50

typedef struct idle_run {
  ums_event_t *go;
  int yields[NCHILD];
  int slept;               /* the 5 s sleeper has woken */
  int seen[NCHILD];        /* yields seen when wait_idle returned */
  int slept_seen;
  int64_t t0, t_idle, t_after;
  int rc_idle;
  bool real;
} idle_run_t;

static idle_run_t *idle_cur;

static void *yield_then_wait(void *arg) {
  int i = (int)(intptr_t)arg;
  for (int k = 0; k < NYIELD; k++) {
    idle_cur->yields[i]++;
    ums_yield();
  }
  CHECK_RC(ums_event_wait(idle_cur->go, UMS_FOREVER), 0);
  return NULL;
}

/* 5 s with the virtual clock; with the real one, until cancelled (the
** test must not wait 5 real seconds, nor count on finishing before). */
static void *sleep5(void *arg) {
  (void)arg;
  if (ums_sleep(idle_cur->real ? UMS_FOREVER : 5 * SEC) == 0)
    idle_cur->slept = 1;
  return NULL;
}

static void *idle_parent(void *arg) {
  idle_run_t *r = arg;
  ums_task_t t[NCHILD + 1];
  r->t0 = ums_now();
  for (int i = 0; i < NCHILD; i++)
    t[i] = spawn(yield_then_wait, (void *)(intptr_t)i);
  t[NCHILD] = spawn(sleep5, NULL);
  r->rc_idle = ums_wait_idle(UMS_FOREVER);
  r->t_idle = ums_now();
  for (int i = 0; i < NCHILD; i++) r->seen[i] = r->yields[i];
  r->slept_seen = r->slept;
  ums_event_set(r->go);
  if (r->real) ums_task_cancel(rt, t[NCHILD]);
  for (int i = 0; i <= NCHILD; i++)
    CHECK_RC(ums_task_join(rt, t[i], UMS_FOREVER, NULL, NULL), 0);
  r->t_after = ums_now();
  return NULL;
}

static void wait_idle_in(int clock) {
  ums_config_t cfg = {.schedulers = 1, .clock = clock};
  rt = tu_runtime_new_cfg(&cfg);
  idle_run_t r = {0};
  r.real = clock == UMS_CLOCK_REAL;
  r.go = ums_event_new(1, 0);
  idle_cur = &r;
  join(spawn(idle_parent, &r));
  CHECK_RC(r.rc_idle, 0);
  for (int i = 0; i < NCHILD; i++) CHECK_EQ(r.seen[i], NYIELD);
  /* Idle means blocked, timers included: the sleeper had not woken. */
  CHECK_EQ(r.slept_seen, 0);
  if (clock == UMS_CLOCK_VIRTUAL) {
    CHECK_EQ(r.t_idle, r.t0);            /* before the clock moved */
    CHECK_EQ(r.t_after, r.t0 + 5 * SEC); /* then exactly the sleep */
  }
  tu_runtime_shutdown(rt);
  ums_event_delete(r.go);
}

static void test_wait_idle_virtual(void) { wait_idle_in(UMS_CLOCK_VIRTUAL); }
static void test_wait_idle_real(void) { wait_idle_in(UMS_CLOCK_REAL); }

/* A busy task keeps the scheduler from ever being idle: a wait for idle
** with a deadline times out (real clock; with a virtual one the deadline
** could never come), and its stale entries do not pile up. */
static _Atomic int spin_stop;

static void *busy_yielder(void *arg) {
  (void)arg;
  while (!atomic_load(&spin_stop)) ums_yield();
  return NULL;
}

typedef struct idle_timeout {
  int rc_first;
  int rc_later;            /* any result but UMS_ETIMEDOUT of 100 more */
  uint32_t cap;
} idle_timeout_t;

static void *idle_timeouts(void *arg) {
  idle_timeout_t *r = arg;
  ums_task_t b = spawn(busy_yielder, NULL);
  r->rc_first = ums_wait_idle(ums_deadline(tu_ms(20)));
  for (int i = 0; i < 100; i++) {
    int rc = ums_wait_idle(ums_deadline(0));
    if (rc != UMS_ETIMEDOUT) r->rc_later = rc;
  }
  r->cap = ums__sched_current()->cap_idle_waiters;
  atomic_store(&spin_stop, 1);
  CHECK_RC(ums_task_join(rt, b, UMS_FOREVER, NULL, NULL), 0);
  return NULL;
}

static void test_wait_idle_timeout(void) {
  rt = tu_runtime_new(1);
  atomic_store(&spin_stop, 0);
  idle_timeout_t r = {0, 0, 0};
  join(spawn(idle_timeouts, &r));
  CHECK_RC(r.rc_first, UMS_ETIMEDOUT);
  CHECK_RC(r.rc_later, 0);
  CHECK_LE(r.cap, 16);
  tu_runtime_shutdown(rt);
  /* Outside a task there is no scheduler to be idle. */
  CHECK_RC(ums_wait_idle(UMS_FOREVER), UMS_EPERM);
  ums_park_token_t tok;
  CHECK_RC(ums_park_begin_idle(UMS_FOREVER, &tok), UMS_EPERM);
}

/* ====================================================================== */
/* Nothing to do and no timer: sleep, no CPU, the clock stays              */
/* ====================================================================== */

static _Atomic int waiting_for_event;

static void *wait_event(void *arg) {
  int64_t t0 = ums_now();
  atomic_store(&waiting_for_event, 1);
  CHECK_RC(ums_event_wait(arg, UMS_FOREVER), 0);
  return (void *)(intptr_t)(ums_now() - t0);
}

static void test_blocked_without_timer(void) {
  rt = virtual_runtime(UMS_IO_AUTO);
  ums_event_t *e = ums_event_new(1, 0);
  ums_task_t t = spawn(wait_event, e);
  WAIT_UNTIL(atomic_load(&waiting_for_event) && tu_stats(rt, 0).idle, 10000);
  int64_t v0 = ums_runtime_now(rt);
  uint64_t w0 = tu_stats(rt, 0).idle_waits;
  real_sleep_ms(50);
  /* One idle wait without a deadline: not a loop of short ones. */
  CHECK_LE(tu_stats(rt, 0).idle_waits - w0, 2);
  CHECK_EQ(ums_runtime_now(rt), v0);
  ums_event_set(e);
  CHECK_EQ((intptr_t)join(t), 0);
  tu_runtime_shutdown(rt);
  ums_event_delete(e);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  RUN(test_config);
  RUN(test_hour);
  RUN(test_wake_order);
  RUN(test_timeouts);
  RUN(test_preempt_holds_clock);
  RUN(test_io_holds_clock_pool);
  RUN(test_io_holds_clock_auto);
  RUN(test_wait_idle_virtual);
  RUN(test_wait_idle_real);
  RUN(test_wait_idle_timeout);
  RUN(test_blocked_without_timer);
  printf("all vclock tests passed\n");
  return 0;
}
