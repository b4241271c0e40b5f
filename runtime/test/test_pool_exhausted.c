/*
** test_pool_exhausted.c: a C-call pool whose every thread is blocked in
** a call while more calls wait is reported by the monitor, once per
** episode, with the task that made the oldest waiting call and what that
** call runs; ums_runtime_pool_stats shows the episode while it lasts and
** counts it after; the episode ends when the queue drains, and the next
** one is reported anew. The reports come while every scheduler is idle
** (all its tasks wait for the pool), which is when the monitor sleeps
** otherwise.
**
** Calls block in read(2) on a pipe each; the test writes to the pipes to
** let them go, so nothing depends on timing but the generous hang bounds.
*/
#include "internal.h"
#include "test-util.h"

#include <errno.h>

#define MAX_THREADS 2
#define CALLS 4 /* two run, two wait */

static ums_runtime_t *rt;
static int pipes[CALLS][2];

/* Reports, copied by the callback on the monitor thread. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int nreports;
static ums_pool_exhausted_t last;

static void on_exhausted(const ums_pool_exhausted_t *ex, void *arg) {
  CHECK_PTR_EQ(arg, (void *)&lock);
  pthread_mutex_lock(&lock);
  nreports++;
  last = *ex;
  pthread_mutex_unlock(&lock);
}

static int reports(void) {
  pthread_mutex_lock(&lock);
  int n = nreports;
  pthread_mutex_unlock(&lock);
  return n;
}

static _Atomic int in_read; /* calls that reached their read */

static void read_one(void *arg) {
  atomic_fetch_add(&in_read, 1);
  char c;
  ssize_t r;
  do r = read((int)(intptr_t)arg, &c, 1);
  while (r < 0 && errno == EINTR);
}

/* A task: one blocking read on its pipe, made through a prepared call
** named "read_pipe". */
static void *reader(void *arg) {
  ums_preempt_call_t *call;
  CHECK_RC(ums_preempt_prepare(&call, NULL), 0);
  ums_preempt_set_what(call, "read_pipe");
  CHECK_RC(ums_preempt_begin_prepared(call, read_one, arg, NULL, UMS_FOREVER,
                                      0),
           0);
  ums_park_wait();
  CHECK_RC(ums_preempt_end(call), 0);
  return NULL;
}

static ums_pool_stats_t preempt_pool(void) {
  ums_pool_stats_t rows[2];
  CHECK_EQ(ums_runtime_pool_stats(rt, rows, 2), 2);
  CHECK_STR_EQ(rows[0].name, "preemptive");
  return rows[0];
}

/* Makes CALLS blocking calls, in an order that makes the oldest waiting
** one known; lets them go once the report came. */
static void episode(int seq) {
  ums_task_t t[CALLS];
  atomic_store(&in_read, 0);
  for (int i = 0; i < CALLS; i++) {
    CHECK_EQ(pipe(pipes[i]), 0);
    char name[16];
    snprintf(name, sizeof name, "reader%d", i);
    t[i] = tu_spawn_named(rt, 0, name, reader,
                          (void *)(intptr_t)pipes[i][0]);
    /* The first MAX_THREADS hold the threads (each in its read), then
    ** the third queues first: it is the oldest waiter. */
    if (i < MAX_THREADS)
      WAIT_UNTIL(atomic_load(&in_read) == i + 1, 10000);
    else if (i == MAX_THREADS)
      WAIT_UNTIL(preempt_pool().queued == 1, 10000);
  }
  WAIT_UNTIL(reports() == seq, 10000);
  pthread_mutex_lock(&lock);
  ums_pool_exhausted_t ex = last;
  pthread_mutex_unlock(&lock);
  CHECK_STR_EQ(ex.pool, "preemptive");
  CHECK_EQ(ex.seq, (uint64_t)seq);
  CHECK_EQ(ex.max, MAX_THREADS);
  CHECK_EQ(ex.threads, MAX_THREADS);
  CHECK_EQ(ex.active, MAX_THREADS);
  /* The last call may come after the report (a slow machine). */
  CHECK_GE(ex.queued, 1);
  CHECK_LE(ex.queued, CALLS - MAX_THREADS);
  CHECK_EQ(ex.task, t[MAX_THREADS]);
  CHECK_STR_EQ(ex.name, "reader2");
  CHECK_STR_EQ(ex.what, "read_pipe");
  CHECK_GE(ex.oldest_wait_ns, tu_ms(50));

  WAIT_UNTIL(preempt_pool().queued == CALLS - MAX_THREADS, 10000);
  ums_pool_stats_t st = preempt_pool();
  CHECK_EQ(st.exhausted, 1);
  CHECK_EQ(st.episodes, (uint64_t)seq);
  CHECK_EQ(st.max, MAX_THREADS);
  CHECK_EQ(st.queued, CALLS - MAX_THREADS);
  CHECK_GE(st.oldest_wait_ns, tu_ms(50));
  CHECK_GE(st.longest_wait_ns, tu_ms(50));

  /* Still one report while the episode lasts: several more ticks. */
  usleep(200 * 1000);
  CHECK_EQ(reports(), seq);

  for (int i = 0; i < CALLS; i++) CHECK_EQ(write(pipes[i][1], "x", 1), 1);
  for (int i = 0; i < CALLS; i++) tu_join_ok(rt, t[i]);
  for (int i = 0; i < CALLS; i++) {
    close(pipes[i][0]);
    close(pipes[i][1]);
  }
  /* Drained: the episode ends (the monitor's next look). */
  WAIT_UNTIL(preempt_pool().exhausted == 0, 10000);
  st = preempt_pool();
  CHECK_EQ(st.episodes, (uint64_t)seq);
  CHECK_EQ(st.queued, 0);
  CHECK_EQ(st.oldest_wait_ns, 0);
  CHECK_EQ(reports(), seq);
}

static void test_reported_once_per_episode(void) {
  ums_config_t cfg = {.schedulers = 1,
                      .preempt_threads = MAX_THREADS,
                      .stall_threshold = tu_ms(50),
                      .on_pool_exhausted = on_exhausted,
                      .on_pool_exhausted_arg = &lock};
  rt = tu_runtime_new_cfg(&cfg);
  episode(1);
  episode(2);
  tu_runtime_shutdown(rt);
}

/* Calls queued behind running ones that are not at the pool's bound (it
** may grow) are no exhaustion: nothing is reported. */
static void test_not_at_bound(void) {
  nreports = 0;
  ums_config_t cfg = {.schedulers = 1,
                      .preempt_threads = 64,
                      .stall_threshold = tu_ms(50),
                      .on_pool_exhausted = on_exhausted,
                      .on_pool_exhausted_arg = &lock};
  rt = tu_runtime_new_cfg(&cfg);
  ums_task_t t[CALLS];
  for (int i = 0; i < CALLS; i++) {
    CHECK_EQ(pipe(pipes[i]), 0);
    t[i] = tu_spawn_named(rt, 0, "reader", reader,
                          (void *)(intptr_t)pipes[i][0]);
  }
  /* The pool grows a thread per blocked call. */
  WAIT_UNTIL(preempt_pool().active == CALLS, 10000);
  usleep(300 * 1000);
  CHECK_EQ(reports(), 0);
  CHECK_EQ(preempt_pool().episodes, 0);
  for (int i = 0; i < CALLS; i++) CHECK_EQ(write(pipes[i][1], "x", 1), 1);
  for (int i = 0; i < CALLS; i++) tu_join_ok(rt, t[i]);
  for (int i = 0; i < CALLS; i++) {
    close(pipes[i][0]);
    close(pipes[i][1]);
  }
  tu_runtime_shutdown(rt);
}

/* The default bound is far above the old 64: 100 blocked calls each get a
** thread. */
static void test_default_bound(void) {
  rt = tu_runtime_new(1);
  ums_pool_stats_t st = preempt_pool();
  CHECK_GE(st.max, 1000);
  tu_runtime_shutdown(rt);
}

int main(void) {
  test_reported_once_per_episode();
  test_not_at_bound();
  test_default_bound();
  printf("test_pool_exhausted: ok\n");
  return 0;
}
