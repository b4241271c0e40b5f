/*
** bench_preempt.c: the round trip of a trivial call made preemptive
** (ums_preempt), next to its floors, in one run. Medians of --reps runs
** (default 5); compare within one run (the VM drifts 20% run to run).
**
**   direct          the trivial function called directly; ns per call
**   condvar_rt      a round trip to another thread and back through a
**                   pthread mutex + condition variable (the thread sleeps
**                   between calls): what a pool without spinning pays;
**                   us per round trip
**   preempt_1       one task calling ums_preempt(trivial) in a loop (one
**                   call in flight); us per call, round trip
**   preempt_1_nospin  the same with the pool's spin turned off (the
**                   scheduler still spins): the pool-side handoff's worth
**   preempt_64      64 tasks each calling in a loop (64 in flight, pool
**                   of 64 threads); calls per second
*/
#include "internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reps = 5;
static int quick;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static _Atomic uint64_t sink;
static void trivial(void *arg) {
  atomic_fetch_add_explicit(&sink, (uintptr_t)arg, memory_order_relaxed);
}

/* ---- direct ---- */
static double run_direct(void) {
  int n = quick ? 100000 : 10000000;
  int64_t t0 = ums_now();
  for (int i = 0; i < n; i++) trivial((void *)(uintptr_t)i);
  return (double)(ums_now() - t0) / n;
}

/* ---- condvar round trip ---- */
static pthread_mutex_t cv_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_req = PTHREAD_COND_INITIALIZER,
                      cv_done = PTHREAD_COND_INITIALIZER;
static int cv_state; /* 0 idle, 1 request, 2 done, 3 stop */

static void *cv_server(void *arg) {
  pthread_mutex_lock(&cv_lock);
  for (;;) {
    while (cv_state != 1 && cv_state != 3)
      pthread_cond_wait(&cv_req, &cv_lock);
    if (cv_state == 3) break;
    trivial(NULL);
    cv_state = 2;
    pthread_cond_signal(&cv_done);
  }
  pthread_mutex_unlock(&cv_lock);
  return NULL;
}

static double run_condvar(void) {
  int n = quick ? 200 : 5000;
  pthread_t th;
  cv_state = 0;
  pthread_create(&th, NULL, cv_server, NULL);
  int64_t t0 = ums_now();
  for (int i = 0; i < n; i++) {
    pthread_mutex_lock(&cv_lock);
    cv_state = 1;
    pthread_cond_signal(&cv_req);
    while (cv_state != 2) pthread_cond_wait(&cv_done, &cv_lock);
    pthread_mutex_unlock(&cv_lock);
  }
  double us = (double)(ums_now() - t0) / n / 1e3;
  pthread_mutex_lock(&cv_lock);
  cv_state = 3;
  pthread_cond_signal(&cv_req);
  pthread_mutex_unlock(&cv_lock);
  pthread_join(th, NULL);
  return us;
}

/* ---- preempt ---- */
typedef struct loop {
  int n;
  int64_t ns;
} loop_t;

static void *caller(void *arg) {
  loop_t *l = arg;
  int64_t t0 = ums_now();
  for (int i = 0; i < l->n; i++)
    if (ums_preempt(trivial, (void *)(uintptr_t)1, NULL, UMS_FOREVER) != 0)
      abort();
  l->ns = ums_now() - t0;
  return NULL;
}

/* Per-call microseconds with `tasks` callers on one scheduler; *rate gets
** calls per second over all of them. */
static double run_preempt(int tasks, bool pool_spin, double *rate) {
  ums_config_t cfg = {.schedulers = 1, .preempt_threads = 64};
  int err;
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  if (!rt) abort();
  /* Before any call: no pool thread exists yet, and the first submit's
  ** lock orders this store before every read. */
  if (!pool_spin) rt->preempt_pool.cfg.spin_ns = 0;
  int n = quick ? 200 : (tasks == 1 ? 20000 : 2000);
  loop_t *l = calloc((size_t)tasks, sizeof *l);
  ums_task_t *t = calloc((size_t)tasks, sizeof *t);
  /* Warm up: start the pool's threads. */
  loop_t warm = {.n = 100};
  ums_task_t w;
  ums_task_spawn(rt, NULL, caller, &warm, &w);
  ums_task_join(rt, w, UMS_FOREVER, NULL, NULL);
  int64_t t0 = ums_now();
  for (int i = 0; i < tasks; i++) {
    l[i].n = n;
    ums_task_spawn(rt, NULL, caller, &l[i], &t[i]);
  }
  for (int i = 0; i < tasks; i++)
    ums_task_join(rt, t[i], UMS_FOREVER, NULL, NULL);
  int64_t wall = ums_now() - t0;
  *rate = (double)n * tasks / ((double)wall / 1e9);
  double us = (double)l[0].ns / n / 1e3;
  free(l);
  free(t);
  ums_runtime_shutdown(rt, UMS_FOREVER);
  return us;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = 1;
      reps = 1;
    } else if (strncmp(argv[i], "--reps=", 7) == 0) {
      reps = atoi(argv[i] + 7);
      if (reps < 1) reps = 1;
    }
  }
  double direct[64], cv[64], p1[64], p1ns[64], p64[64], r64[64], dummy;
  if (reps > 64) reps = 64;
  for (int r = 0; r < reps; r++) {
    direct[r] = run_direct();
    cv[r] = run_condvar();
    p1[r] = run_preempt(1, true, &dummy);
    p1ns[r] = run_preempt(1, false, &dummy);
    p64[r] = run_preempt(64, true, &r64[r]);
  }
  double d = median(direct, reps), c = median(cv, reps),
         a = median(p1, reps), b = median(p1ns, reps),
         rate = median(r64, reps);
  (void)p64;
  printf("%-18s %10.1f ns\n", "direct", d);
  printf("%-18s %10.2f us\n", "condvar_rt", c);
  printf("%-18s %10.2f us   (%.1fx condvar_rt)\n", "preempt_1", a, c / a);
  printf("%-18s %10.2f us\n", "preempt_1_nospin", b);
  printf("%-18s %10.0f calls/s (%.2f us per call)\n", "preempt_64", rate,
         1e6 / rate);
  printf("(medians of %d runs)\n", reps);
  return 0;
}
