/*
** bench_core.c: the cost of the ums core next to its floors, in one run.
**
** Every figure is measured several times (--reps, default 5) and reported
** as the median and the best repetition; compare figures within one run,
** because this kind of VM drifts by 20% or more between runs. Time comes
** from clock_gettime(CLOCK_MONOTONIC); nothing is pinned to a CPU.
**
** Floors (no scheduler involved):
**   ctx_switch        one switch between two contexts with the runtime's own
**                     ums__ctx_make/ums__ctx_switch (internal.h), ping-
**                     ponging on one thread; ns per switch. Both contexts
**                     switch from the same call site, as the scheduler's
**                     tasks do, so the CPU predicts every return.
**   condvar_handoff   two threads passing a turn through a pthread mutex
**                     and condition variable; ns per one-way handoff (one
**                     thread wakes the other). On a VM this is mostly the
**                     cost of waking a sleeping thread.
**   timer_floor       how late a plain thread wakes from a futex wait with
**                     an absolute CLOCK_MONOTONIC deadline 2 ms ahead (the
**                     way a scheduler's idle wait sleeps); median of 20
**                     waits per repetition, in microseconds. Kernel timer
**                     slack and the VM's wake-up cost are in it.
**   spin_handoff      the same handoff through an atomic word: the waiter
**                     spins briefly, then sleeps on a futex; ns per one-way
**                     handoff. What a cross-thread wake can cost when the
**                     other side is still awake.
**
** The ums core:
**   yield             two tasks on one scheduler (schedulers = 1) each
**                     calling ums_yield() in a loop; ns per yield, where
**                     one yield is one switch from one task to the other.
**                     "ratio" is yield / ctx_switch: the scheduler's
**                     overhead per switch. The notes give the fiber
**                     switches the runtime counted per yield.
**   spawn_join        one task spawns a batch of tasks (empty function) on
**                     its own scheduler and joins them all, batch after
**                     batch; tasks per second.
**   spawn_detached    the same with detached tasks, each bumping an atomic
**                     counter that the spawner waits on (yielding) after
**                     each batch; tasks per second.
**   timer_parked_*    the same many tasks, all started and asleep before a
**                     common t0, with deadlines 10-200 ms after it: the
**                     timers' own lateness, without the spawn burst.
**   timer_*           many tasks (100,000 by default) each sleep a random
**                     10-200 ms with ums_sleep(); each records its wake time
**                     (ums_now()) minus its requested deadline (ums_now()
**                     before the call + the duration). Reports p50, p99 and
**                     max lateness, and the earliest wake relative to the
**                     deadline. An early wake (negative lateness) is a
**                     bug: they are counted, and any makes the program
**                     fail. The tasks start in one burst, so the tail
**                     includes timers that fire while the schedulers are
**                     still starting the rest (the notes say how long
**                     starting them all took); timer_p99_after is the p99
**                     of the timers due after the last task started.
**   chan_same_sched   two tasks on one scheduler passing an int back and
**                     forth through two unbuffered ums_chan; ns per
**                     message (one send matched by one receive).
**   chan_cross_sched  the same with the tasks on two schedulers; compare
**                     with condvar_handoff and spin_handoff.
**
** Usage: bench_core [--quick] [--json] [--reps N]
**   --quick  small counts, for a smoke test (ctest: bench_core_smoke)
**   --json   one JSON object on stdout instead of the table
** Exits 1 if any ums call fails or a timer fires early.
*/
#include "ums.h"
#include "internal.h" /* ums__ctx_*: the raw context switch floor */

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ====================================================================== */
/* Settings and helpers                                                    */
/* ====================================================================== */

typedef struct settings {
  int reps;
  bool json;
  bool quick;
  long ctx_switches;     /* round trips (2 switches each) */
  double handoff_budget; /* seconds per repetition, cross-thread floors */
  long handoff_max;      /* round trips cap per repetition */
  long yields;           /* total yields (both tasks) */
  long spawns;           /* tasks per repetition */
  int spawn_batch;
  int timer_tasks;
  int timer_reps;
  double chan_budget; /* seconds per repetition */
  long chan_max;      /* round trips cap per repetition */
} settings_t;

static settings_t S;
static int failures;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CPU time of the calling thread: a task reads its scheduler thread's. */
static int64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void fail(const char *what, int rc) {
  fprintf(stderr, "bench_core: %s: %s (%s)\n", what, ums_err_name(rc),
          ums_strerror(rc));
  failures++;
}

#define CHECK(expr)                                                            \
  do {                                                                         \
    int rc_ = (expr);                                                          \
    if (rc_ != 0) {                                                            \
      fail(#expr, rc_);                                                        \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static ums_runtime_t *runtime_cfg(int schedulers, int stats) {
  ums_config_t cfg = {.schedulers = schedulers, .stats = stats};
  int err = 0;
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  if (!rt) {
    fail("ums_runtime_new", err);
    exit(1);
  }
  return rt;
}

static ums_runtime_t *runtime(int schedulers) {
  return runtime_cfg(schedulers, UMS_STATS_DEFAULT);
}

static void shutdown_rt(ums_runtime_t *rt) {
  int rc = ums_runtime_shutdown(rt, ums_deadline(10 * UMS_NSEC_PER_SEC));
  if (rc) fail("ums_runtime_shutdown", rc);
}

/* Runs fn(arg) as a task on scheduler `sched` and waits for it from this
** (host) thread. */
static void *run_task(ums_runtime_t *rt, int sched, ums_task_fn fn, void *arg) {
  ums_spawn_opts_t opts = {.sched = sched, .name = "bench"};
  ums_task_t t;
  void *result = NULL;
  CHECK(ums_task_spawn(rt, &opts, fn, arg, &t));
  CHECK(ums_task_join(rt, t, UMS_FOREVER, &result, NULL));
  return result;
}

static uint64_t total_switches(ums_runtime_t *rt) {
  ums_sched_stats_t rows[64];
  int n = ums_runtime_stats(rt, rows, 64);
  uint64_t sum = 0;
  for (int i = 0; i < n && i < 64; i++) sum += rows[i].fiber_switches;
  return sum;
}

/* ====================================================================== */
/* Results                                                                 */
/* ====================================================================== */

/* One row of the report. lower_better: times (best = min); otherwise
** rates (best = max). */
typedef struct result {
  const char *name;
  const char *unit;
  bool lower_better;
  double median, best;
  const char *ratio_to; /* name of the row the ratio is against */
  double ratio;         /* median / ratio_to's median; 0: none */
  char notes[160];
} result_t;

#define MAX_RESULTS 32
static result_t results[MAX_RESULTS];
static int nresults;

static result_t *add_result(const char *name, const char *unit,
                            bool lower_better, double *samples, int n) {
  if (nresults == MAX_RESULTS) {
    fprintf(stderr, "bench_core: more than %d results\n", MAX_RESULTS);
    exit(1);
  }
  result_t *r = &results[nresults++];
  memset(r, 0, sizeof *r);
  r->name = name;
  r->unit = unit;
  r->lower_better = lower_better;
  r->median = median(samples, n); /* sorts samples */
  r->best = lower_better ? samples[0] : samples[n - 1];
  return r;
}

static const result_t *find_result(const char *name) {
  for (int i = 0; i < nresults; i++)
    if (strcmp(results[i].name, name) == 0) return &results[i];
  return NULL;
}

static void set_ratio(result_t *r, const char *to) {
  const result_t *base = find_result(to);
  if (base && base->median > 0) {
    r->ratio_to = to;
    r->ratio = r->median / base->median;
  }
}

/* ====================================================================== */
/* a. Raw context switch                                                   */
/* ====================================================================== */

static ums__ctx_t ctx_main, ctx_other;

/* Both contexts switch from this one loop, so every switch returns to the
** call site it left from and the CPU predicts the return, as it does for
** the scheduler's switches. (Switching from two different call sites costs
** a return misprediction per switch, about 5 ns here.) */
static __attribute__((noinline)) void ctx_bounce(long n, ums__ctx_t *self,
                                                 ums__ctx_t *peer) {
  for (long i = 0; i < n; i++) ums__ctx_switch(self, peer);
}

static void ctx_other_main(void *arg) {
  (void)arg;
  for (;;) ctx_bounce(LONG_MAX, &ctx_other, &ctx_main);
}

static void bench_ctx_switch(void) {
  const size_t stack_size = 64 * 1024, page = 4096;
  char *map = mmap(NULL, stack_size + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (map == MAP_FAILED) {
    perror("bench_core: mmap");
    exit(1);
  }
  mprotect(map, page, PROT_NONE); /* guard page */

  double samples[64];
  for (int rep = 0; rep < S.reps; rep++) {
    memset(&ctx_main, 0, sizeof ctx_main);
    memset(&ctx_other, 0, sizeof ctx_other);
    if (ums__ctx_init_main(&ctx_main) != 0 ||
        ums__ctx_make(&ctx_other, map + page, stack_size, ctx_other_main,
                      NULL) != 0) {
      fprintf(stderr, "bench_core: ums__ctx_make failed\n");
      exit(1);
    }
    ctx_bounce(1, &ctx_main, &ctx_other); /* first entry, not timed */
    long n = S.ctx_switches;
    int64_t t0 = now_ns();
    ctx_bounce(n, &ctx_main, &ctx_other);
    int64_t t1 = now_ns();
    samples[rep] = (double)(t1 - t0) / (double)(2 * n);
    /* ctx_other is abandoned mid-loop; its stack holds nothing to free. */
    ums__ctx_destroy(&ctx_other);
    ums__ctx_destroy(&ctx_main);
  }
  munmap(map, stack_size + page);
  result_t *r = add_result("ctx_switch", "ns/switch", true, samples, S.reps);
  snprintf(r->notes, sizeof r->notes, "%s, %ld switches/rep", ums__ctx_kind(),
           2 * S.ctx_switches);
}

/* ====================================================================== */
/* b. Cross-thread handoff floors                                          */
/* ====================================================================== */

/* The driver (this thread) and a partner thread pass a turn back and
** forth. The driver stops after handoff_max round trips or when the time
** budget is spent, whichever comes first, then hands over once more with
** `stop` set. */

typedef struct handoff {
  /* condvar variant */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int turn; /* [mu] 0: driver's turn, 1: partner's turn */
  /* spin-then-futex variant */
  _Atomic uint32_t word;        /* 0: driver's turn, 1: partner's turn */
  _Atomic uint32_t sleeping[2]; /* a side is (about to be) in futex_wait */
  _Atomic bool stop;
} handoff_t;

static void cv_wait_for(handoff_t *h, int want) {
  pthread_mutex_lock(&h->mu);
  while (h->turn != want) pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
}

static void cv_give(handoff_t *h, int to) {
  pthread_mutex_lock(&h->mu);
  h->turn = to;
  pthread_cond_signal(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

static void *cv_partner(void *arg) {
  handoff_t *h = arg;
  for (;;) {
    cv_wait_for(h, 1);
    if (atomic_load(&h->stop)) return NULL;
    cv_give(h, 0);
  }
}

static long futex_op(_Atomic uint32_t *addr, int op, uint32_t val) {
  return syscall(SYS_futex, (uint32_t *)addr, op | FUTEX_PRIVATE_FLAG, val,
                 NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

#define SPIN_LIMIT 4000

/* Waits until word == want: spins, then sleeps on the futex. The sleeping
** flag and the word are both accessed seq_cst, so either the giver sees
** the flag and wakes us, or we see the new word before sleeping. */
static void spin_wait_for(handoff_t *h, uint32_t want, int side) {
  for (int i = 0; i < SPIN_LIMIT; i++) {
    if (atomic_load_explicit(&h->word, memory_order_acquire) == want) return;
    cpu_relax();
  }
  for (;;) {
    atomic_store(&h->sleeping[side], 1);
    uint32_t cur = atomic_load(&h->word);
    if (cur == want) break;
    futex_op(&h->word, FUTEX_WAIT, cur);
  }
  atomic_store(&h->sleeping[side], 0);
}

static void spin_give(handoff_t *h, uint32_t to, int other_side) {
  atomic_store(&h->word, to);
  if (atomic_load(&h->sleeping[other_side])) futex_op(&h->word, FUTEX_WAKE, 1);
}

static void *spin_partner(void *arg) {
  handoff_t *h = arg;
  for (;;) {
    spin_wait_for(h, 1, 1);
    if (atomic_load(&h->stop)) return NULL;
    spin_give(h, 0, 0);
  }
}

/* Returns ns per one-way handoff. */
static double handoff_once(bool spin) {
  handoff_t h;
  memset(&h, 0, sizeof h);
  pthread_mutex_init(&h.mu, NULL);
  pthread_cond_init(&h.cv, NULL);
  pthread_t th;
  if (pthread_create(&th, NULL, spin ? spin_partner : cv_partner, &h)) {
    fprintf(stderr, "bench_core: pthread_create failed\n");
    exit(1);
  }
  int64_t budget = (int64_t)(S.handoff_budget * 1e9);
  int64_t t0 = now_ns(), t1 = t0;
  long n = 0;
  while (n < S.handoff_max) {
    if (spin) {
      spin_give(&h, 1, 1);
      spin_wait_for(&h, 0, 0);
    } else {
      cv_give(&h, 1);
      cv_wait_for(&h, 0);
    }
    n++;
    if ((n & 63) == 0 && (t1 = now_ns()) - t0 >= budget) break;
  }
  t1 = now_ns();
  atomic_store(&h.stop, true);
  if (spin)
    spin_give(&h, 1, 1);
  else
    cv_give(&h, 1);
  pthread_join(th, NULL);
  pthread_cond_destroy(&h.cv);
  pthread_mutex_destroy(&h.mu);
  return (double)(t1 - t0) / (double)(2 * n);
}

static void bench_handoffs(void) {
  double samples[64];
  for (int rep = 0; rep < S.reps; rep++) samples[rep] = handoff_once(false);
  result_t *r =
      add_result("condvar_handoff", "ns/handoff", true, samples, S.reps);
  snprintf(r->notes, sizeof r->notes, "pthread mutex+cond, 2 threads");
  set_ratio(r, "ctx_switch");

  for (int rep = 0; rep < S.reps; rep++) samples[rep] = handoff_once(true);
  r = add_result("spin_handoff", "ns/handoff", true, samples, S.reps);
  snprintf(r->notes, sizeof r->notes, "spin %d pauses, then futex", SPIN_LIMIT);
  set_ratio(r, "ctx_switch");
}

/* ====================================================================== */
/* b2. Timer floor                                                         */
/* ====================================================================== */

/* The futex word nobody ever changes: every wait ends at its deadline. */
static _Atomic uint32_t never_set;

static void bench_timer_floor(void) {
  enum { WAITS = 20 };
  double samples[64];
  for (int rep = 0; rep < S.reps; rep++) {
    double late[WAITS];
    for (int i = 0; i < WAITS; i++) {
      int64_t deadline = now_ns() + 2 * UMS_NSEC_PER_MSEC;
      struct timespec ts = {(time_t)(deadline / 1000000000),
                            (long)(deadline % 1000000000)};
      while (now_ns() < deadline)
        syscall(SYS_futex, (uint32_t *)&never_set,
                FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, 0, &ts, NULL,
                FUTEX_BITSET_MATCH_ANY);
      late[i] = (double)(now_ns() - deadline) / 1e3;
    }
    samples[rep] = median(late, WAITS);
  }
  result_t *r = add_result("timer_floor", "us late", true, samples, S.reps);
  snprintf(r->notes, sizeof r->notes,
           "thread, futex wait to an absolute deadline, median of %d", WAITS);
}

/* ====================================================================== */
/* c. Yield                                                                */
/* ====================================================================== */

typedef struct yield_run {
  long per_task;
  int64_t start[2], end[2];
  int64_t cpu_start[2], cpu_end[2]; /* the scheduler thread's CPU time */
} yield_run_t;

typedef struct yield_arg {
  yield_run_t *run;
  int index;
} yield_arg_t;

static void *yielder(void *arg) {
  yield_arg_t *a = arg;
  long n = a->run->per_task;
  a->run->start[a->index] = now_ns();
  a->run->cpu_start[a->index] = thread_cpu_ns();
  for (long i = 0; i < n; i++)
    if (ums_yield() != 0) {
      fail("ums_yield", UMS_ECANCELED);
      break;
    }
  a->run->cpu_end[a->index] = thread_cpu_ns();
  a->run->end[a->index] = now_ns();
  return NULL;
}

/* Spawns both yielders from a task on their scheduler, so that both are
** queued before either runs and every yield finds the other runnable. */
static void *yield_driver(void *arg) {
  yield_arg_t *args = arg;
  ums_spawn_opts_t opts = {.sched = ums_current_sched(), .name = "yielder"};
  ums_task_t t[2];
  for (int i = 0; i < 2; i++)
    CHECK(
        ums_task_spawn(ums_current_runtime(), &opts, yielder, &args[i], &t[i]));
  for (int i = 0; i < 2; i++)
    CHECK(ums_task_join(ums_current_runtime(), t[i], UMS_FOREVER, NULL, NULL));
  return NULL;
}

/* One repetition of the yield benchmark on rt: ns per yield (wall), and
** in *cpu the scheduler thread's CPU ns per yield (both tasks run on it). */
static double yield_rep(ums_runtime_t *rt, double *switches_per_yield,
                        double *cpu) {
  yield_run_t run = {.per_task = S.yields / 2};
  yield_arg_t args[2] = {{&run, 0}, {&run, 1}};
  uint64_t sw0 = total_switches(rt);
  run_task(rt, 0, yield_driver, args);
  uint64_t sw1 = total_switches(rt);
  int64_t t0 = run.start[0] < run.start[1] ? run.start[0] : run.start[1];
  int64_t t1 = run.end[0] > run.end[1] ? run.end[0] : run.end[1];
  int64_t c0 = run.cpu_start[0] < run.cpu_start[1] ? run.cpu_start[0]
                                                   : run.cpu_start[1];
  int64_t c1 = run.cpu_end[0] > run.cpu_end[1] ? run.cpu_end[0]
                                               : run.cpu_end[1];
  long total = 2 * run.per_task;
  *switches_per_yield = (double)(sw1 - sw0) / (double)total;
  *cpu = (double)(c1 - c0) / (double)total;
  return (double)(t1 - t0) / (double)total;
}

/* The cost of stats, for the notes of a stats-off row: medians of the
** per-repetition ratios of the scheduler thread's CPU time (on this
** shared VM, wall time also counts the time other jobs held the CPU),
** default (wait clock) / off and precise / off. */
static void note_stats_cost(result_t *off, const double *on_cpu,
                            const double *precise_cpu, const double *off_cpu,
                            int n) {
  double r[64], p[64];
  for (int i = 0; i < n; i++) {
    r[i] = off_cpu[i] > 0 ? on_cpu[i] / off_cpu[i] : 0;
    p[i] = off_cpu[i] > 0 ? precise_cpu[i] / off_cpu[i] : 0;
  }
  snprintf(off->notes, sizeof off->notes,
           "wait stats and CPU sampling off (UMS_STATS_OFF); CPU time "
           "on/off %.3f, precise/off %.3f (medians of per-rep ratios)",
           median(r, n), median(p, n));
}

static void bench_yield(void) {
  double samples[64], off[64], ignored[64];
  double cpu_on[64], cpu_off[64], cpu_precise[64];
  double switches_per_yield = 0, ignored_sw;
  /* Stats on (the default), off and precise, repetitions interleaved. */
  ums_runtime_t *rt = runtime(1), *rt_off = runtime_cfg(1, UMS_STATS_OFF),
                *rt_precise = runtime_cfg(1, UMS_STATS_PRECISE);
  for (int rep = 0; rep < S.reps; rep++) {
    samples[rep] = yield_rep(rt, &switches_per_yield, &cpu_on[rep]);
    off[rep] = yield_rep(rt_off, &ignored_sw, &cpu_off[rep]);
    ignored[rep] = yield_rep(rt_precise, &ignored_sw, &cpu_precise[rep]);
  }
  shutdown_rt(rt);
  shutdown_rt(rt_off);
  shutdown_rt(rt_precise);
  (void)ignored;
  result_t *r = add_result("yield", "ns/yield", true, samples, S.reps);
  snprintf(r->notes, sizeof r->notes,
           "2 tasks, 1 scheduler, %ld yields/rep; %.2f fiber switches/yield",
           S.yields, switches_per_yield);
  set_ratio(r, "ctx_switch");
  r = add_result("yield_stats_off", "ns/yield", true, off, S.reps);
  set_ratio(r, "ctx_switch");
  note_stats_cost(r, cpu_on, cpu_precise, cpu_off, S.reps);
}

/* ====================================================================== */
/* d. Spawn                                                                */
/* ====================================================================== */

static _Atomic long detached_done;

static void *empty_task(void *arg) { return arg; }

static void *counting_task(void *arg) {
  atomic_fetch_add_explicit(&detached_done, 1, memory_order_relaxed);
  return NULL;
}

typedef struct spawn_run {
  bool detached;
  double seconds;
} spawn_run_t;

static void *spawner(void *arg) {
  spawn_run_t *run = arg;
  ums_runtime_t *rt = ums_current_runtime();
  int batch = S.spawn_batch;
  ums_task_t *tasks = malloc(sizeof *tasks * (size_t)batch);
  if (!tasks) {
    fail("malloc", UMS_ENOMEM);
    exit(1);
  }
  ums_spawn_opts_t opts = {.sched = ums_current_sched(),
                           .detached = run->detached};
  atomic_store(&detached_done, 0);
  long spawned = 0;
  int64_t t0 = now_ns();
  while (spawned < S.spawns) {
    int n = (int)(S.spawns - spawned < batch ? S.spawns - spawned : batch);
    if (run->detached) {
      for (int i = 0; i < n; i++)
        CHECK(ums_task_spawn(rt, &opts, counting_task, NULL, NULL));
      spawned += n;
      while (atomic_load_explicit(&detached_done, memory_order_relaxed) <
             spawned)
        CHECK(ums_yield());
    } else {
      for (int i = 0; i < n; i++)
        CHECK(ums_task_spawn(rt, &opts, empty_task, NULL, &tasks[i]));
      for (int i = 0; i < n; i++)
        CHECK(ums_task_join(rt, tasks[i], UMS_FOREVER, NULL, NULL));
      spawned += n;
    }
  }
  run->seconds = (double)(now_ns() - t0) / 1e9;
  free(tasks);
  return NULL;
}

static void bench_spawn(void) {
  double samples[64];
  ums_runtime_t *rt = runtime(1);
  for (int detached = 0; detached < 2; detached++) {
    for (int rep = 0; rep < S.reps; rep++) {
      spawn_run_t run = {.detached = detached};
      run_task(rt, 0, spawner, &run);
      samples[rep] = (double)S.spawns / run.seconds;
    }
    result_t *r = add_result(detached ? "spawn_detached" : "spawn_join",
                             "tasks/s", false, samples, S.reps);
    snprintf(r->notes, sizeof r->notes,
             "1 scheduler, batches of %d, %ld tasks/rep", S.spawn_batch,
             S.spawns);
  }
  shutdown_rt(rt);
}

/* ====================================================================== */
/* e. Timer lateness                                                       */
/* ====================================================================== */

typedef struct sleep_arg {
  int64_t duration; /* ns */
  int64_t until;    /* parked mode: absolute deadline; 0: sleep duration */
  int64_t started;  /* when the task first ran */
  int64_t lateness; /* wake - deadline */
  int rc;
} sleep_arg_t;

static void *sleeping_task(void *arg) {
  sleep_arg_t *a = arg;
  a->started = ums_now();
  int64_t deadline = a->until ? a->until : a->started + a->duration;
  a->rc = a->until ? ums_sleep_until(deadline) : ums_sleep(a->duration);
  a->lateness = ums_now() - deadline;
  return NULL;
}

typedef struct timer_run {
  sleep_arg_t *args;
  int n;
} timer_run_t;

static void *timer_driver(void *arg) {
  timer_run_t *run = arg;
  ums_runtime_t *rt = ums_current_runtime();
  ums_task_t *tasks = malloc(sizeof *tasks * (size_t)run->n);
  if (!tasks) {
    fail("malloc", UMS_ENOMEM);
    exit(1);
  }
  ums_spawn_opts_t opts = {.sched = UMS_ANY_SCHED};
  for (int i = 0; i < run->n; i++)
    CHECK(ums_task_spawn(rt, &opts, sleeping_task, &run->args[i], &tasks[i]));
  for (int i = 0; i < run->n; i++)
    CHECK(ums_task_join(rt, tasks[i], UMS_FOREVER, NULL, NULL));
  free(tasks);
  return NULL;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng_next(void) {
  /* xorshift64*: reproducible durations from run to run. */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1du;
}

static void bench_timers(void) {
  int n = S.timer_tasks, reps = S.timer_reps;
  double p50[64], p99[64], pmax[64], after99[64];
  long nafter = 0; /* timers due after the burst, last rep */
  int64_t earliest = INT64_MAX, worst = INT64_MIN;
  long early = 0, errors = 0;
  int64_t spread = 0; /* longest time from first to last task start */
  sleep_arg_t *args = calloc((size_t)n, sizeof *args);
  int64_t *lat = malloc(sizeof *lat * (size_t)n);
  int64_t *qlat = malloc(sizeof *qlat * (size_t)n);
  if (!args || !lat || !qlat) {
    fail("malloc", UMS_ENOMEM);
    exit(1);
  }
  ums_runtime_t *rt = runtime(0);
  int nsched = ums_runtime_schedulers(rt);
  for (int rep = 0; rep < reps; rep++) {
    for (int i = 0; i < n; i++) {
      args[i].duration = (10 + (int64_t)(rng_next() % 191)) * UMS_NSEC_PER_MSEC;
      args[i].lateness = 0;
      args[i].rc = 0;
    }
    timer_run_t run = {args, n};
    run_task(rt, 0, timer_driver, &run);
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (int i = 0; i < n; i++) {
      if (args[i].started < first) first = args[i].started;
      if (args[i].started > last) last = args[i].started;
      if (args[i].rc != 0) {
        if (errors++ == 0) fail("ums_sleep", args[i].rc);
      }
      lat[i] = args[i].lateness;
      if (lat[i] < 0) early++;
    }
    if (last - first > spread) spread = last - first;
    /* Timers due once every task has started: lateness without the
    ** burst. */
    long nq = 0;
    for (int i = 0; i < n; i++)
      if (args[i].started + args[i].duration > last)
        qlat[nq++] = args[i].lateness;
    qsort(qlat, (size_t)nq, sizeof *qlat, cmp_i64);
    after99[rep] = nq ? (double)qlat[(size_t)nq * 99 / 100] / 1e3 : 0;
    nafter = nq;
    qsort(lat, (size_t)n, sizeof *lat, cmp_i64);
    p50[rep] = (double)lat[n / 2] / 1e3;
    p99[rep] = (double)lat[(size_t)n * 99 / 100] / 1e3;
    pmax[rep] = (double)lat[n - 1] / 1e3;
    if (lat[0] < earliest) earliest = lat[0];
    if (lat[n - 1] > worst) worst = lat[n - 1];
  }
  /* Parked: every task is started and asleep before the first deadline,
  ** so the figures are the timers' own, without the spawn burst (first
  ** starts fault in fresh stack pages, ~4 us each). All deadlines fall
  ** 10-200 ms after a common t0, chosen well after the burst ends. */
  double pk50[64], pk99[64], pkmax[64];
  long late_starts = 0;
  for (int rep = 0; rep < reps; rep++) {
    int64_t t0 = ums_now() + spread + 300 * UMS_NSEC_PER_MSEC;
    for (int i = 0; i < n; i++) {
      args[i].duration = (10 + (int64_t)(rng_next() % 191)) * UMS_NSEC_PER_MSEC;
      args[i].until = t0 + args[i].duration;
      args[i].lateness = 0;
      args[i].rc = 0;
    }
    timer_run_t run = {args, n};
    run_task(rt, 0, timer_driver, &run);
    for (int i = 0; i < n; i++) {
      if (args[i].rc != 0 && errors++ == 0) fail("ums_sleep_until", args[i].rc);
      if (args[i].started >= t0) late_starts++;
      lat[i] = args[i].lateness;
      if (lat[i] < 0) early++;
      if (lat[i] < earliest) earliest = lat[i];
    }
    qsort(lat, (size_t)n, sizeof *lat, cmp_i64);
    pk50[rep] = (double)lat[n / 2] / 1e3;
    pk99[rep] = (double)lat[(size_t)n * 99 / 100] / 1e3;
    pkmax[rep] = (double)lat[n - 1] / 1e3;
    for (int i = 0; i < n; i++) args[i].until = 0;
  }
  shutdown_rt(rt);
  free(args);
  free(lat);
  free(qlat);

  result_t *r = add_result("timer_parked_p50", "us late", true, pk50, reps);
  snprintf(r->notes, sizeof r->notes,
           "%d tasks all asleep first, deadlines 10-200 ms after t0", n);
  set_ratio(r, "timer_floor");
  r = add_result("timer_parked_p99", "us late", true, pk99, reps);
  snprintf(r->notes, sizeof r->notes,
           "target <= 1000 us; %ld tasks started after t0 (should be 0)",
           late_starts);
  r = add_result("timer_parked_max", "us late", true, pkmax, reps);
  snprintf(r->notes, sizeof r->notes, "worst of the parked runs");

  r = add_result("timer_p50", "us late", true, p50, reps);
  snprintf(r->notes, sizeof r->notes,
           "%d tasks sleeping 10-200 ms, %d schedulers, %d reps", n, nsched,
           reps);
  set_ratio(r, "timer_floor");
  r = add_result("timer_p99", "us late", true, p99, reps);
  snprintf(r->notes, sizeof r->notes,
           "tasks started over up to %.1f ms (spawn burst)",
           (double)spread / 1e6);
  r = add_result("timer_p99_after", "us late", true, after99, reps);
  snprintf(r->notes, sizeof r->notes,
           "p99 of the timers due after the last start (%ld, last rep)",
           nafter);
  r = add_result("timer_max", "us late", true, pmax, reps);
  snprintf(r->notes, sizeof r->notes, "worst of all reps %.1f us",
           (double)worst / 1e3);
  double e[1] = {(double)earliest / 1e3};
  r = add_result("timer_earliest", "us late", true, e, 1);
  snprintf(r->notes, sizeof r->notes,
           "min over all reps; %ld early wakes of %ld (must be 0)", early,
           (long)n * reps);
  if (early) {
    fprintf(stderr,
            "bench_core: %ld timers fired early (earliest %" PRId64
            " ns before the deadline)\n",
            early, -earliest);
    failures++;
  }
  if (errors) failures++;
}

/* ====================================================================== */
/* f. Channel ping-pong                                                    */
/* ====================================================================== */

typedef struct chan_run {
  ums_chan_t *ab, *ba; /* unbuffered channels of int */
  long rounds;
  double ns_per_msg;
  double cpu_per_msg; /* the driver's thread's CPU ns per message (the
                         whole run's, with both tasks on one scheduler) */
} chan_run_t;

/* Echoes every value back; -1 ends it. */
static void *chan_echo(void *arg) {
  chan_run_t *run = arg;
  int v;
  for (;;) {
    CHECK(ums_chan_recv(run->ab, &v, UMS_FOREVER));
    if (v < 0) return NULL;
    CHECK(ums_chan_send(run->ba, &v, UMS_FOREVER));
  }
}

static void *chan_driver(void *arg) {
  chan_run_t *run = arg;
  int64_t budget = (int64_t)(S.chan_budget * 1e9);
  int64_t t0 = now_ns(), t1 = t0, c0 = thread_cpu_ns();
  long n = 0;
  int v = 0;
  while (n < S.chan_max) {
    CHECK(ums_chan_send(run->ab, &v, UMS_FOREVER));
    CHECK(ums_chan_recv(run->ba, &v, UMS_FOREVER));
    v = (v + 1) & 0x3fffffff;
    n++;
    if ((n & 63) == 0 && (t1 = now_ns()) - t0 >= budget) break;
  }
  t1 = now_ns();
  run->cpu_per_msg = (double)(thread_cpu_ns() - c0) / (double)(2 * n);
  v = -1;
  CHECK(ums_chan_send(run->ab, &v, UMS_FOREVER));
  run->rounds = n;
  run->ns_per_msg = (double)(t1 - t0) / (double)(2 * n);
  return NULL;
}

static double chan_rep(ums_runtime_t *rt, int cross, long *rounds,
                       double *cpu) {
  chan_run_t run = {.ab = ums_chan_new(sizeof(int), 0),
                    .ba = ums_chan_new(sizeof(int), 0)};
  if (!run.ab || !run.ba) {
    fail("ums_chan_new", UMS_ENOMEM);
    exit(1);
  }
  ums_spawn_opts_t opts = {.sched = cross ? 1 : 0, .name = "echo"};
  ums_task_t echo;
  CHECK(ums_task_spawn(rt, &opts, chan_echo, &run, &echo));
  run_task(rt, 0, chan_driver, &run);
  CHECK(ums_task_join(rt, echo, UMS_FOREVER, NULL, NULL));
  CHECK(ums_chan_delete(run.ab));
  CHECK(ums_chan_delete(run.ba));
  *rounds = run.rounds;
  *cpu = run.cpu_per_msg;
  return run.ns_per_msg;
}

/* Channel messages on one scheduler with stats on and off, interleaved. */
static void bench_chan_stats(void) {
  double on[64], off[64], precise[64];
  double cpu_on[64], cpu_off[64], cpu_precise[64];
  long rounds;
  ums_runtime_t *rt = runtime(1), *rt_off = runtime_cfg(1, UMS_STATS_OFF),
                *rt_precise = runtime_cfg(1, UMS_STATS_PRECISE);
  for (int rep = 0; rep < S.reps; rep++) {
    on[rep] = chan_rep(rt, 0, &rounds, &cpu_on[rep]);
    off[rep] = chan_rep(rt_off, 0, &rounds, &cpu_off[rep]);
    precise[rep] = chan_rep(rt_precise, 0, &rounds, &cpu_precise[rep]);
  }
  shutdown_rt(rt);
  shutdown_rt(rt_off);
  shutdown_rt(rt_precise);
  result_t *r = add_result("chan_same_stats_off", "ns/msg", true, off,
                           S.reps);
  set_ratio(r, "ctx_switch");
  note_stats_cost(r, cpu_on, cpu_precise, cpu_off, S.reps);
  (void)on;
  (void)precise;
}

static void bench_chan(void) {
  double samples[64];
  ums_runtime_t *rt = runtime(2);
  for (int cross = 0; cross < 2; cross++) {
    long rounds = 0;
    double cpu; /* only meaningful on one scheduler: unused here */
    for (int rep = 0; rep < S.reps; rep++)
      samples[rep] = chan_rep(rt, cross, &rounds, &cpu);
    result_t *r = add_result(cross ? "chan_cross_sched" : "chan_same_sched",
                             "ns/msg", true, samples, S.reps);
    set_ratio(r, cross ? "condvar_handoff" : "ctx_switch");
    const result_t *spin = find_result("spin_handoff");
    if (cross && spin && spin->median > 0)
      snprintf(r->notes, sizeof r->notes,
               "unbuffered, %ld round trips (last rep); %.3gx spin_handoff",
               rounds, r->median / spin->median);
    else
      snprintf(r->notes, sizeof r->notes,
               "unbuffered, %ld round trips (last rep)", rounds);
  }
  shutdown_rt(rt);
}

/* ====================================================================== */
/* Report                                                                  */
/* ====================================================================== */

static void print_table(void) {
  printf("ums bench_core: median and best of %d reps%s (ctx: %s)\n\n", S.reps,
         S.quick ? ", --quick" : "", ums__ctx_kind());
  printf("%-17s %12s %12s %-10s %-22s %s\n", "figure", "median", "best", "unit",
         "ratio (median)", "notes");
  for (int i = 0; i < nresults; i++) {
    const result_t *r = &results[i];
    char ratio[40] = "";
    if (r->ratio_to)
      snprintf(ratio, sizeof ratio, r->ratio < 1 ? "%.2fx %s" : "%.1fx %s",
               r->ratio, r->ratio_to);
    printf("%-17s %12.1f %12.1f %-10s %-22s %s\n", r->name, r->median, r->best,
           r->unit, ratio, r->notes);
  }
}

static void print_json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      printf("\\u%04x", *s);
    else
      putchar(*s);
  }
  putchar('"');
}

static void print_json(void) {
  printf("{\"benchmark\":\"bench_core\",\"reps\":%d,\"quick\":%s,"
         "\"ctx\":\"%s\",\"failures\":%d,\"results\":[",
         S.reps, S.quick ? "true" : "false", ums__ctx_kind(), failures);
  for (int i = 0; i < nresults; i++) {
    const result_t *r = &results[i];
    printf("%s\n {\"name\":", i ? "," : "");
    print_json_string(r->name);
    printf(",\"unit\":");
    print_json_string(r->unit);
    printf(",\"median\":%.3f,\"best\":%.3f,\"lower_is_better\":%s", r->median,
           r->best, r->lower_better ? "true" : "false");
    if (r->ratio_to) {
      printf(",\"ratio_to\":");
      print_json_string(r->ratio_to);
      printf(",\"ratio\":%.3f", r->ratio);
    }
    printf(",\"notes\":");
    print_json_string(r->notes);
    printf("}");
  }
  printf("\n]}\n");
}

static void usage(FILE *f) {
  fprintf(f, "usage: bench_core [--quick] [--json] [--reps N]\n");
}

int main(int argc, char **argv) {
  S = (settings_t){
      .reps = 5,
      .ctx_switches = 10000000,
      .handoff_budget = 1.0,
      .handoff_max = 1000000,
      .yields = 10000000,
      .spawns = 1000000,
      .spawn_batch = 1000,
      .timer_tasks = 100000,
      .timer_reps = 3,
      .chan_budget = 1.0,
      .chan_max = 2000000,
  };
  int reps = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      S.quick = true;
    } else if (strcmp(argv[i], "--json") == 0) {
      S.json = true;
    } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = atoi(argv[++i]);
      if (reps < 1 || reps > 64) {
        usage(stderr);
        return 2;
      }
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (S.quick) {
    S.reps = 3;
    S.ctx_switches = 100000;
    S.handoff_budget = 0.05;
    S.handoff_max = 2000;
    S.yields = 100000;
    S.spawns = 10000;
    S.spawn_batch = 500;
    S.timer_tasks = 2000;
    S.timer_reps = 1;
    S.chan_budget = 0.05;
    S.chan_max = 5000;
  }
  if (reps) S.reps = reps;
  if (!S.json) setvbuf(stdout, NULL, _IOLBF, 0);

  bench_ctx_switch();
  bench_handoffs();
  bench_timer_floor();
  bench_yield();
  bench_spawn();
  bench_timers();
  bench_chan();
  bench_chan_stats();

  if (S.json)
    print_json();
  else
    print_table();
  if (failures) {
    fprintf(stderr, "bench_core: %d failure(s)\n", failures);
    return 1;
  }
  return 0;
}
