/*
** test_pool.c: the thread pool (pool.c) through its internal interface:
** threads start on demand up to the maximum, idle ones end after the
** timeout, an interrupt ends a work item blocked in a system call,
** destroy waits for every work item and joins every thread, and slots
** (posted works) run exactly once whether a thread takes them or their
** owner takes them back.
*/
#include "internal.h"
#include "test-util.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>

typedef struct job {
  ums__pool_work_t work;
  int fd;                    /* read from it (blocks), or -1 */
  _Atomic int *gate;         /* spin-wait until nonzero, or NULL */
  _Atomic int *running, *max_running, *done;
  int result;
} job_t;

/* Reads one byte from fd, retrying on EINTR until w is interrupted:
** the byte count, or -errno. */
static int read_until_interrupted(ums__pool_work_t *w, int fd) {
  char c;
  ssize_t r;
  do r = read(fd, &c, 1);
  while (r < 0 && errno == EINTR && !ums__pool_interrupted(w));
  return r < 0 ? -errno : (int)r;
}

static void job_run(ums__pool_work_t *w) {
  job_t *j = UMS__CONTAINER_OF(w, job_t, work);
  int now = atomic_fetch_add(j->running, 1) + 1;
  int seen = atomic_load(j->max_running);
  while (now > seen && !atomic_compare_exchange_weak(j->max_running, &seen, now)) {
  }
  if (j->gate)
    while (!atomic_load(j->gate)) usleep(100);
  if (j->fd >= 0) j->result = read_until_interrupted(w, j->fd);
  atomic_fetch_sub(j->running, 1);
  atomic_fetch_add(j->done, 1);
}

static _Atomic int running, max_running, done, gate;

static void init_job(job_t *j, int fd, _Atomic int *g) {
  memset(j, 0, sizeof *j);
  j->work.run = job_run;
  j->fd = fd;
  j->gate = g;
  j->running = &running;
  j->max_running = &max_running;
  j->done = &done;
}

static void reset(void) {
  atomic_store(&running, 0);
  atomic_store(&max_running, 0);
  atomic_store(&done, 0);
  atomic_store(&gate, 0);
}

static int pool_init(ums__pool_t *p, uint32_t core, uint32_t max,
                     int64_t idle_timeout) {
  ums__pool_cfg_t c = {.name = "test-pool", .core = core, .max = max,
                       .idle_timeout = idle_timeout};
  return ums__pool_init(p, &c);
}

/* Up to core, threads start as soon as queued work waits for the ones
** there are (the monitor's tick), with no need to see them blocked. */
static void test_core_at_once(void) {
  int base = tu_thread_baseline();
  reset();
  ums__pool_t p;
  CHECK_RC(pool_init(&p, 4, 4, -1), 0);
  CHECK_EQ(ums__pool_threads(&p), 0); /* none until there is work */
  job_t jobs[16];
  for (int i = 0; i < 16; i++) {
    init_job(&jobs[i], -1, &gate);
    CHECK_RC(ums__pool_submit(&p, &jobs[i].work), 0);
  }
  CHECK_GE(ums__pool_threads(&p), 1); /* the first at once */
  WAIT_UNTIL(atomic_load(&running) == 4, 5000);
  CHECK_EQ(ums__pool_threads(&p), 4);
  CHECK_EQ(ums__pool_grown(&p), 0); /* core, not growth */
  CHECK_EQ(tu_thread_count(), base + 4 + 1); /* and the monitor */
  usleep(20000);
  CHECK_EQ(atomic_load(&max_running), 4); /* never past the maximum */
  atomic_store(&gate, 1);
  WAIT_UNTIL(atomic_load(&done) == 16, 5000);
  ums__pool_destroy(&p);
  CHECK_THREADS(base);
}

/* Beyond core, blocked threads make the monitor start more, up to max;
** idle ones end after the timeout, down to core. */
static void test_grow_when_blocked_and_trim(void) {
  int base = tu_thread_baseline();
  reset();
  ums__pool_t p;
  CHECK_RC(pool_init(&p, 1, 4, tu_ms(50)), 0);
  job_t jobs[16];
  for (int i = 0; i < 16; i++) {
    init_job(&jobs[i], -1, &gate); /* sleeps until the gate opens */
    CHECK_RC(ums__pool_submit(&p, &jobs[i].work), 0);
  }
  WAIT_UNTIL(atomic_load(&running) == 4, 5000);
  CHECK_EQ(ums__pool_threads(&p), 4);
  CHECK_EQ(ums__pool_grown(&p), 3);
  CHECK_EQ(tu_thread_count(), base + 4 + 1); /* and the monitor */
  usleep(20000);
  CHECK_EQ(atomic_load(&max_running), 4); /* never past the maximum */
  atomic_store(&gate, 1);
  WAIT_UNTIL(atomic_load(&done) == 16, 5000);
  /* Idle past the timeout: every thread beyond core ends (and is joined
  ** by the next start or by destroy). */
  WAIT_UNTIL(ums__pool_threads(&p) == 1, 5000);
  usleep(100000);
  CHECK_EQ(ums__pool_threads(&p), 1); /* core stays */
  /* Work after the trim is served again. */
  job_t again;
  init_job(&again, -1, NULL);
  CHECK_RC(ums__pool_submit(&p, &again.work), 0);
  WAIT_UNTIL(atomic_load(&done) == 17, 5000);
  ums__pool_destroy(&p);
  CHECK_THREADS(base);
}

/* Work that computes gains nothing from more threads than CPUs, whatever
** it waits in the queue, and work that moves gains nothing either: the
** monitor starts none. */
typedef struct spin_job {
  ums__pool_work_t work;
  int64_t ns;
  _Atomic int *done;
} spin_job_t;

static void spin_run(ums__pool_work_t *w) {
  spin_job_t *j = UMS__CONTAINER_OF(w, spin_job_t, work);
  int64_t until = ums_now() + j->ns;
  while (ums_now() < until) {
  }
  atomic_fetch_add(j->done, 1);
}

static void test_no_growth_when_computing_or_moving(void) {
  int base = tu_thread_baseline();
  reset();
  ums__pool_t p;
  CHECK_RC(pool_init(&p, 1, 8, -1), 0);
  spin_job_t jobs[6];
  for (int i = 0; i < 6; i++) {
    jobs[i] = (spin_job_t){.work.run = spin_run, .ns = tu_ms(30),
                           .done = &done};
    CHECK_RC(ums__pool_submit(&p, &jobs[i].work), 0);
  }
  WAIT_UNTIL(atomic_load(&done) == 6, 10000);
  CHECK_EQ(ums__pool_grown(&p), 0);
  CHECK_EQ(ums__pool_threads(&p), 1);

  /* 20,000 short items, queued faster than one thread takes them. */
  enum { SHORT = 20000 };
  spin_job_t *many = calloc(SHORT, sizeof *many);
  CHECK(many != NULL);
  atomic_store(&done, 0);
  for (int i = 0; i < SHORT; i++) {
    many[i] = (spin_job_t){.work.run = spin_run, .ns = 0, .done = &done};
    CHECK_RC(ums__pool_submit(&p, &many[i].work), 0);
  }
  WAIT_UNTIL(atomic_load(&done) == SHORT, 10000);
  CHECK_EQ(ums__pool_grown(&p), 0);
  ums__pool_destroy(&p);
  free(many);
  CHECK_THREADS(base);
}

/* The spinner: work submitted before, while and after a thread spins
** for it (some of it in the instant the spin ends and the thread goes to
** sleep) runs exactly once each, and some of it came during a spin. */
typedef struct once_job {
  ums__pool_work_t work;
  _Atomic int runs;
} once_job_t;

static void once_run(ums__pool_work_t *w) {
  once_job_t *j = UMS__CONTAINER_OF(w, once_job_t, work);
  atomic_fetch_add(&j->runs, 1);
  atomic_fetch_add(&done, 1);
}

static void test_spin_handoff(void) {
  int base = tu_thread_baseline();
  reset();
  enum { N = 5000 };
  const int64_t spin_ns = 50 * 1000;
  ums__pool_t p;
  ums__pool_cfg_t c = {.name = "test-pool", .core = 1, .max = 1,
                       .idle_timeout = -1, .spin_ns = spin_ns};
  CHECK_RC(ums__pool_init(&p, &c), 0);
  once_job_t *jobs = calloc(N, sizeof *jobs);
  CHECK(jobs != NULL);
  unsigned seed = 12345;
  for (int i = 0; i < N; i++) {
    jobs[i].work.run = once_run;
    CHECK_RC(ums__pool_submit(&p, &jobs[i].work), 0);
    /* Busy: a sleep would let every spin run out. */
    int64_t limit = ums_now() + 10 * UMS_NSEC_PER_SEC;
    while (atomic_load(&done) != i + 1) {
      CHECK(ums_now() < limit);
      sched_yield();
    }
    /* Mostly well inside the spin (which keeps spinning worth it for the
    ** pool's gauge), one in four within 20% of its end. */
    seed = seed * 1103515245 + 12345;
    int64_t r = (int64_t)(seed >> 8);
    int64_t delay = (r & 3) ? r % (spin_ns / 8)
                            : spin_ns - spin_ns / 5 + r % (2 * spin_ns / 5);
    int64_t until = ums_now() + delay;
    while (ums_now() < until) {
    }
  }
  for (int i = 0; i < N; i++) CHECK_EQ(atomic_load(&jobs[i].runs), 1);
  uint64_t handed = ums__pool_handed(&p);
  printf("   %llu of %d came during a spin\n", (unsigned long long)handed, N);
  CHECK_GT(handed, 0);
  ums__pool_destroy(&p);
  free(jobs);
  CHECK_THREADS(base);
}

/* A submitter relies on a thread that is awake: work submitted while the
** only awake thread runs the previous one (a scheduler with many calls in
** flight) wakes no sleeper and starts no thread; the awake thread runs it
** all, back to back. (Each wake-up would cost the submitter a system call
** and the sleeper a context switch.) Each work here runs until the next
** one is submitted, so every submit finds the awake thread in its work,
** however the threads are scheduled. */
typedef struct chain_job {
  ums__pool_work_t work;
  int i, n;
} chain_job_t;

static _Atomic int chain_submitted;

static void chain_run(ums__pool_work_t *w) {
  chain_job_t *j = UMS__CONTAINER_OF(w, chain_job_t, work);
  while (j->i + 1 < j->n && atomic_load(&chain_submitted) < j->i + 2)
    sched_yield();
  atomic_fetch_add(&done, 1);
}

static void test_awake_thread_relied_on(void) {
  int base = tu_thread_baseline();
  reset();
  ums__pool_t p;
  ums__pool_cfg_t c = {.name = "test-pool", .core = 2, .max = 2,
                       .idle_timeout = -1, .spin_ns = 50 * 1000};
  CHECK_RC(ums__pool_init(&p, &c), 0);
  /* Both threads, then both asleep. */
  job_t two[2];
  for (int i = 0; i < 2; i++) {
    init_job(&two[i], -1, &gate);
    CHECK_RC(ums__pool_submit(&p, &two[i].work), 0);
  }
  WAIT_UNTIL(atomic_load(&running) == 2, 5000);
  atomic_store(&gate, 1);
  WAIT_UNTIL(atomic_load(&done) == 2, 5000);
  CHECK_EQ(ums__pool_threads(&p), 2);
  ums_pool_stats_t st;
  do {
    usleep(1000);
    ums__pool_stats(&p, &st);
  } while (st.idle != 2);
  uint64_t woken0 = ums__pool_woken(&p);
  enum { N = 20000 };
  chain_job_t *jobs = calloc(N, sizeof *jobs);
  CHECK(jobs != NULL);
  atomic_store(&done, 0);
  atomic_store(&chain_submitted, 0);
  for (int i = 0; i < N; i++) {
    /* At most two in flight: the one running and the one queued. */
    int64_t limit = ums_now() + 10 * UMS_NSEC_PER_SEC;
    while (atomic_load(&done) < i - 1) {
      CHECK(ums_now() < limit);
      sched_yield();
    }
    jobs[i] = (chain_job_t){.work.run = chain_run, .i = i, .n = N};
    CHECK_RC(ums__pool_submit(&p, &jobs[i].work), 0);
    atomic_store(&chain_submitted, i + 1);
  }
  WAIT_UNTIL(atomic_load(&done) == N, 10000);
  uint64_t woken = ums__pool_woken(&p) - woken0;
  printf("   %llu wake-ups for %d submits\n", (unsigned long long)woken, N);
  /* The first submit finds nobody awake and wakes one; after that only a
  ** work left waiting a whole tick (a thread preempted that long on a
  ** crowded machine) brings the monitor to wake the other: a few, or on
  ** a machine crowded enough (a sanitizer build among other tests), a
  ** few hundred. Waking a sleeper for every submit that finds the only
  ** awake thread busy would make it about N. */
  CHECK_LT(woken, N / 10);
  ums__pool_destroy(&p);
  free(jobs);
  CHECK_THREADS(base);
}

/* The monitor sleeps when a thread stays in one long work with nothing
** queued behind it; work submitted then, which relies on that busy
** thread, wakes the monitor, and gets a thread of its own. */
static void test_blocked_thread_monitor_sleeps(void) {
  int base = tu_thread_baseline();
  reset();
  ums__pool_t p;
  CHECK_RC(pool_init(&p, 2, 2, -1), 0);
  job_t blocked, after;
  init_job(&blocked, -1, &gate);
  CHECK_RC(ums__pool_submit(&p, &blocked.work), 0);
  WAIT_UNTIL(atomic_load(&running) == 1, 5000);
  WAIT_UNTIL(atomic_load(&p.mon_asleep), 5000);
  init_job(&after, -1, NULL);
  CHECK_RC(ums__pool_submit(&p, &after.work), 0);
  WAIT_UNTIL(atomic_load(&done) == 1, 5000); /* the gate is still shut */
  CHECK_EQ(ums__pool_threads(&p), 2);
  atomic_store(&gate, 1);
  WAIT_UNTIL(atomic_load(&done) == 2, 5000);
  ums__pool_destroy(&p);
  CHECK_THREADS(base);
}

/* An interrupt that lands before the work enters its system call is
** lost; the monitor sends it again until the work ends. The work here
** makes that happen every time: it computes until it sees itself
** interrupted (the first signal's handler runs meanwhile, to no effect),
** then reads a pipe nobody writes to. One interrupt call, no repeat by
** the caller: only the pool's own repeat can end that read. */
static _Atomic int late_started;
static void late_run(ums__pool_work_t *w) {
  job_t *j = UMS__CONTAINER_OF(w, job_t, work);
  atomic_store(&late_started, 1);
  while (!ums__pool_interrupted(w)) {
  }
  int64_t until = ums_now() + tu_ms(20);
  while (ums_now() < until) {
  }
  j->result = read_until_interrupted(w, j->fd);
  atomic_fetch_add(j->done, 1);
}

/* One interrupt call, no repeat by the caller, must end the read: a
** work blocked in read() (plain), or one that reaches read() only after
** its first signal has come and gone (late_run). */
static void interrupt_case(bool late) {
  int base = tu_thread_baseline();
  reset();
  atomic_store(&late_started, 0);
  int fds[2];
  CHECK_EQ(pipe(fds), 0);
  ums__pool_t p;
  CHECK_RC(pool_init(&p, 2, 2, -1), 0);
  job_t j;
  init_job(&j, fds[0], NULL);
  if (late) j.work.run = late_run;
  CHECK_RC(ums__pool_submit(&p, &j.work), 0);
  if (late) {
    WAIT_UNTIL(atomic_load(&late_started) == 1, 5000);
  } else {
    WAIT_UNTIL(atomic_load(&running) == 1, 5000);
    usleep(10000); /* into the read, most likely */
  }
  ums__pool_interrupt(&p, &j.work);
  int64_t t0 = ums_now();
  /* 5 s: a read left blocked would wait forever; data frees it then. */
  while (atomic_load(&done) == 0 && ums_now() - t0 < tu_ms(5000))
    usleep(1000);
  if (atomic_load(&done) == 0) {
    CHECK_EQ(write(fds[1], "x", 1), 1);
    WAIT_UNTIL(atomic_load(&done) == 1, 5000);
  }
  printf("   the read ended after %.1f ms\n", (ums_now() - t0) / 1e6);
  CHECK_EQ(atomic_load(&done), 1);
  CHECK_RC(j.result, -EINTR);
  ums__pool_destroy(&p);
  CHECK_THREADS(base);
  close(fds[0]);
  close(fds[1]);
}

static void test_interrupt(void) { interrupt_case(false); }
static void test_interrupt_repeated(void) { interrupt_case(true); }

static void test_destroy_waits(void) {
  int base = tu_thread_baseline();
  reset();
  int fds[2];
  CHECK_EQ(pipe(fds), 0);
  ums__pool_t p;
  CHECK_RC(pool_init(&p, 2, 2, -1), 0);
  /* Two blocked reads and queued work behind them: destroy interrupts
  ** the reads, lets the queue drain, and joins. */
  job_t blocked[2], queued[6];
  for (int i = 0; i < 2; i++) {
    init_job(&blocked[i], fds[0], NULL);
    CHECK_RC(ums__pool_submit(&p, &blocked[i].work), 0);
  }
  for (int i = 0; i < 6; i++) {
    init_job(&queued[i], -1, NULL);
    CHECK_RC(ums__pool_submit(&p, &queued[i].work), 0);
  }
  WAIT_UNTIL(atomic_load(&running) == 2, 5000);
  ums__pool_destroy(&p);
  CHECK_EQ(atomic_load(&done), 8);
  CHECK_EQ(atomic_load(&max_running), 2);
  CHECK_THREADS(base);
  close(fds[0]);
  close(fds[1]);
}

/* A fault in the work is the pool thread's own: its signal must not be
** blocked (Linux would reset a blocked SIGSEGV to the default action, so
** no crash handler could ever report it), while signals meant for the
** host stay blocked. */
typedef struct mask_job {
  ums__pool_work_t work;
  sigset_t mask;
  _Atomic int done;
} mask_job_t;

static void mask_run(ums__pool_work_t *w) {
  mask_job_t *j = UMS__CONTAINER_OF(w, mask_job_t, work);
  pthread_sigmask(SIG_BLOCK, NULL, &j->mask);
  atomic_store(&j->done, 1);
}

static void test_fault_signals_unblocked(void) {
  int base = tu_thread_baseline();
  ums__pool_t p;
  CHECK_RC(pool_init(&p, 1, 1, -1), 0);
  mask_job_t j = {.work.run = mask_run};
  CHECK_RC(ums__pool_submit(&p, &j.work), 0);
  WAIT_UNTIL(atomic_load(&j.done), 5000);
  ums__pool_destroy(&p);
  CHECK(!sigismember(&j.mask, SIGSEGV));
  CHECK(!sigismember(&j.mask, SIGBUS));
  CHECK(!sigismember(&j.mask, SIGFPE));
  CHECK(!sigismember(&j.mask, SIGILL));
  CHECK(sigismember(&j.mask, SIGINT));
  CHECK(sigismember(&j.mask, SIGTERM));
  CHECK_THREADS(base);
}

/* ---- Slots (pool.c, "Slots") ---- */

typedef struct slot_job {
  ums__pool_work_t work;
  _Atomic int runs;
} slot_job_t;

static void slot_run(ums__pool_work_t *w) {
  slot_job_t *j = UMS__CONTAINER_OF(w, slot_job_t, work);
  atomic_fetch_add(&j->runs, 1);
}

static void slot_counts(ums__pool_t *p, uint64_t *takes, uint64_t *backs) {
  ums__pool_slot_counts(p, takes, backs);
}

/* A post relies on a thread awake now, as a push does: refused when none
** is (no thread yet, or every one asleep); accepted while the only thread
** is blocked in a work, and then left alone until the owner takes it back
** (never run after that), or taken by that thread once its work ends. */
static void test_slot_post(void) {
  int base = tu_thread_baseline();
  reset();
  ums__pool_t p;
  ums__pool_cfg_t c = {.name = "test-pool", .core = 1, .max = 1,
                       .idle_timeout = -1, .spin_ns = 50 * 1000};
  CHECK_RC(ums__pool_init(&p, &c), 0);
  slot_job_t sj[2] = {{.work.run = slot_run}, {.work.run = slot_run}};
  ums__pool_work_t *ws[2] = {&sj[0].work, &sj[1].work};
  CHECK_RC(ums__pool_set_slots(&p, ws, 2), 0);
  uint64_t takes, backs;

  /* No thread: refused, and no thread started for it. */
  CHECK(!ums__pool_post(&p, 0));
  CHECK_EQ(ums__pool_threads(&p), 0);

  /* The only thread blocked in a work: accepted, not taken; back. */
  job_t blocked;
  init_job(&blocked, -1, &gate);
  CHECK_RC(ums__pool_submit(&p, &blocked.work), 0);
  WAIT_UNTIL(atomic_load(&running) == 1, 5000);
  CHECK(ums__pool_post(&p, 0));
  usleep(20 * 1000);
  CHECK_EQ(atomic_load(&sj[0].runs), 0);
  CHECK(ums__pool_unpost(&p, 0));
  /* Again, left posted: the thread takes it when its work ends. */
  CHECK(ums__pool_post(&p, 1));
  atomic_store(&gate, 1);
  WAIT_UNTIL(atomic_load(&sj[1].runs) == 1, 5000);
  CHECK(!ums__pool_unpost(&p, 1)); /* taken: not the owner's to take */
  usleep(20 * 1000);
  CHECK_EQ(atomic_load(&sj[0].runs), 0); /* taken back: never run */
  CHECK_EQ(atomic_load(&sj[1].runs), 1);
  slot_counts(&p, &takes, &backs);
  CHECK_EQ(takes, 1);
  CHECK_EQ(backs, 2); /* the refused post and the one taken back */

  /* The thread asleep (its spin over): refused. */
  for (;;) {
    pthread_mutex_lock(&p.lock);
    uint32_t sleeping = p.nsleeping;
    pthread_mutex_unlock(&p.lock);
    if (sleeping == 1) break;
    usleep(1000);
  }
  CHECK(!ums__pool_post(&p, 0));
  usleep(20 * 1000);
  CHECK_EQ(atomic_load(&sj[0].runs), 0);
  ums__pool_destroy(&p);
  CHECK_THREADS(base);
}

/* Two owners post their slots over and over, each waiting for its work a
** random while (now within a thread's spin, now past it, so that threads
** also sleep between posts) and taking it back when it has not run: every
** post runs exactly once, by a thread or, taken back, through the queue.
** Under TSan: the take (under the lock) against the owner's take back,
** and the post against a thread going to sleep. */
#ifdef TU_TSAN
#define SLOT_ROUNDS 1500
#else
#define SLOT_ROUNDS 10000
#endif

typedef struct slot_owner {
  ums__pool_t *p;
  uint32_t i;
  slot_job_t *j;
  unsigned seed;
  int queued;              /* rounds that went through the queue */
} slot_owner_t;

static void *slot_owner_main(void *arg) {
  slot_owner_t *o = arg;
  for (int r = 0; r < SLOT_ROUNDS; r++) {
    o->seed = o->seed * 1103515245u + 12345u;
    unsigned x = o->seed >> 8;
    if (!ums__pool_post(o->p, o->i)) {
      CHECK_RC(ums__pool_submit(o->p, &o->j->work), 0);
      o->queued++;
    } else {
      /* Wait up to 0-63 us for a thread to take and run it. */
      int64_t until = ums_now() + (int64_t)(x % 64) * 1000;
      while (atomic_load(&o->j->runs) == r && ums_now() < until)
        ums__cpu_relax();
      if (atomic_load(&o->j->runs) == r && ums__pool_unpost(o->p, o->i)) {
        CHECK_RC(ums__pool_submit(o->p, &o->j->work), 0);
        o->queued++;
      }
    }
    /* Busy: WAIT_UNTIL's sleeps would let every spin run out. */
    int64_t limit = ums_now() + 10 * UMS_NSEC_PER_SEC;
    while (atomic_load(&o->j->runs) != r + 1) {
      CHECK(ums_now() < limit);
      sched_yield();
    }
    /* Now and then long enough for the threads to go to sleep. */
    if (x % 64 == 0) usleep(200);
  }
  return NULL;
}

static void test_slots_exactly_once(void) {
  int base = tu_thread_baseline();
  ums__pool_t p;
  ums__pool_cfg_t c = {.name = "test-pool", .core = 2, .max = 2,
                       .idle_timeout = -1, .spin_ns = 50 * 1000};
  CHECK_RC(ums__pool_init(&p, &c), 0);
  slot_job_t sj[2] = {{.work.run = slot_run}, {.work.run = slot_run}};
  ums__pool_work_t *ws[2] = {&sj[0].work, &sj[1].work};
  CHECK_RC(ums__pool_set_slots(&p, ws, 2), 0);
  slot_owner_t o[2] = {{.p = &p, .i = 0, .j = &sj[0], .seed = 1},
                       {.p = &p, .i = 1, .j = &sj[1], .seed = 2}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    CHECK_RC(pthread_create(&th[i], NULL, slot_owner_main, &o[i]), 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  usleep(10 * 1000);
  uint64_t takes, backs;
  slot_counts(&p, &takes, &backs);
  printf("   %llu of %d posts taken by a thread, %llu taken back; "
         "%d + %d through the queue\n",
         (unsigned long long)takes, 2 * SLOT_ROUNDS,
         (unsigned long long)backs, o[0].queued, o[1].queued);
  for (int i = 0; i < 2; i++) CHECK_EQ(atomic_load(&sj[i].runs), SLOT_ROUNDS);
  /* Every round ran once: taken from its slot, or through the queue. */
  CHECK_EQ(takes + (uint64_t)o[0].queued + (uint64_t)o[1].queued,
           2 * SLOT_ROUNDS);
  CHECK_GT(takes, 0);
  ums__pool_destroy(&p);
  CHECK_THREADS(base);
}

int main(void) {
  RUN(test_core_at_once);
  RUN(test_grow_when_blocked_and_trim);
  RUN(test_no_growth_when_computing_or_moving);
  RUN(test_fault_signals_unblocked);
  RUN(test_interrupt);
  RUN(test_interrupt_repeated);
  RUN(test_spin_handoff);
  RUN(test_awake_thread_relied_on);
  RUN(test_blocked_thread_monitor_sleeps);
  RUN(test_destroy_waits);
  RUN(test_slot_post);
  RUN(test_slots_exactly_once);
  return 0;
}
