/*
** test-util.h: what every unit test shares: assertions that say where
** and with which values they failed, polling with a time limit, and a
** runtime life cycle that ends by proving the teardown was clean (the
** shutdown returned 0 and every thread the runtime started is gone).
**
** A failed check prints file:line and exits with status 1 through _exit:
** checks also run on scheduler threads and inside tasks, where exit()'s
** handlers would race with the threads still running.
*/
#ifndef UMS_TEST_UTIL_H
#define UMS_TEST_UTIL_H

#include "ums.h"

#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* TU_TSAN: defined in a ThreadSanitizer build (gcc defines
** __SANITIZE_THREAD__, clang answers __has_feature). */
#if defined(__SANITIZE_THREAD__)
#define TU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TU_TSAN 1
#endif
#endif

/* ====================================================================== */
/* Assertions                                                              */
/* ====================================================================== */

__attribute__((noreturn, format(printf, 3, 4))) static inline void
tu_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s:%d: ", file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
  fflush(stdout);
  _exit(1);
}

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) tu_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);       \
  } while (0)

/* Integer comparisons; both sides are evaluated once. */
#define CHECK_OP_(a, op, b)                                                    \
  do {                                                                         \
    intmax_t a_ = (intmax_t)(a), b_ = (intmax_t)(b);                           \
    if (!(a_ op b_))                                                           \
      tu_fail(__FILE__, __LINE__, "CHECK(%s %s %s) failed: %jd vs %jd", #a,    \
              #op, #b, a_, b_);                                                \
  } while (0)
#define CHECK_EQ(a, b) CHECK_OP_(a, ==, b)
#define CHECK_NE(a, b) CHECK_OP_(a, !=, b)
#define CHECK_LT(a, b) CHECK_OP_(a, <, b)
#define CHECK_LE(a, b) CHECK_OP_(a, <=, b)
#define CHECK_GT(a, b) CHECK_OP_(a, >, b)
#define CHECK_GE(a, b) CHECK_OP_(a, >=, b)

/* Return codes, printed with their names. */
#define CHECK_RC(a, b)                                                         \
  do {                                                                         \
    int a_ = (a), b_ = (b);                                                    \
    if (a_ != b_)                                                              \
      tu_fail(__FILE__, __LINE__,                                              \
              "CHECK_RC(%s, %s) failed: %d (%s) vs "                           \
              "%d (%s)",                                                       \
              #a, #b, a_, ums_err_name(a_), b_, ums_err_name(b_));             \
  } while (0)

#define CHECK_PTR_EQ(a, b)                                                     \
  do {                                                                         \
    const void *a_ = (a), *b_ = (b);                                           \
    if (a_ != b_)                                                              \
      tu_fail(__FILE__, __LINE__, "CHECK_PTR_EQ(%s, %s) failed: %p vs %p", #a, \
              #b, a_, b_);                                                     \
  } while (0)

#define CHECK_STR_EQ(a, b)                                                     \
  do {                                                                         \
    const char *a_ = (a), *b_ = (b);                                           \
    if (!a_ || !b_ || strcmp(a_, b_) != 0)                                     \
      tu_fail(__FILE__, __LINE__,                                              \
              "CHECK_STR_EQ(%s, %s) failed: "                                  \
              "\"%s\" vs \"%s\"",                                              \
              #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)");                 \
  } while (0)

/* Polls cond every millisecond until it holds; fails after ms. The limit
** is generous on purpose: it bounds a hang, it does not measure speed. */
#define WAIT_UNTIL(cond, ms)                                                   \
  do {                                                                         \
    int64_t until_ = ums_deadline((int64_t)(ms)*UMS_NSEC_PER_MSEC);            \
    while (!(cond)) {                                                          \
      if (ums_now() > until_)                                                  \
        tu_fail(__FILE__, __LINE__,                                            \
                "timed out after %d ms waiting for "                           \
                "%s",                                                          \
                (int)(ms), #cond);                                             \
      usleep(1000);                                                            \
    }                                                                          \
  } while (0)

/* ====================================================================== */
/* Time                                                                    */
/* ====================================================================== */

static inline int64_t tu_ms(int64_t ms) { return ms * UMS_NSEC_PER_MSEC; }

/* Milliseconds since `start` (a ums_now() reading). */
static inline int64_t tu_elapsed_ms(int64_t start) {
  return (ums_now() - start) / UMS_NSEC_PER_MSEC;
}

/* ====================================================================== */
/* Threads                                                                 */
/* ====================================================================== */

/* Threads of this process, from /proc/self/task. */
/* CPUs this process may run on. */
static inline int tu_cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* Entries of a /proc directory, "." and ".." aside. */
static inline int tu_dir_entries(const char *path) {
  DIR *d = opendir(path);
  if (!d) tu_fail(__FILE__, __LINE__, "cannot open %s", path);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static inline int tu_thread_count(void) {
  return tu_dir_entries("/proc/self/task");
}

/* Open descriptors of the process. */
static inline int tu_fd_count(void) {
  return tu_dir_entries("/proc/self/fd") - 1; /* the one opendir holds */
}

static inline void *tu_tid_thread(void *arg) {
  *(pid_t *)arg = gettid();
  return NULL;
}

/* The thread count to come back to after every runtime is gone. The
** first call starts and joins one thread, so that helper threads a
** sanitizer starts lazily at the first pthread_create are counted in. */
static inline int tu_thread_baseline(void) {
  static int baseline = -1;
  if (baseline < 0) {
    pthread_t th;
    pid_t tid = 0;
    char path[64];
    if (pthread_create(&th, NULL, tu_tid_thread, &tid) != 0)
      tu_fail(__FILE__, __LINE__, "pthread_create failed");
    pthread_join(th, NULL);
    /* A joined thread may stay listed in /proc for a moment. */
    snprintf(path, sizeof path, "/proc/self/task/%d", (int)tid);
    for (int i = 0; i < 5000 && access(path, F_OK) == 0; i++) usleep(1000);
    baseline = tu_thread_count();
  }
  return baseline;
}

/* Waits (up to 5 s) until the process is back to `want` threads. A thread
** that pthread_join has reaped can stay listed briefly (longer under a
** tracer), hence the polling. */
#define CHECK_THREADS(want) WAIT_UNTIL(tu_thread_count() == (want), 5000)

/* ====================================================================== */
/* Runtime life cycle                                                      */
/* ====================================================================== */

/* Runtimes started by tu_runtime_new and not shut down yet. */
static int tu_live_runtimes;

static inline ums_runtime_t *tu_runtime_new_cfg_at(const char *file, int line,
                                                   const ums_config_t *cfg) {
  tu_thread_baseline();
  int err = 1;
  ums_runtime_t *rt = ums_runtime_new(cfg, &err);
  if (!rt)
    tu_fail(file, line, "ums_runtime_new failed: %d (%s)", err,
            ums_err_name(err));
  if (err != 0)
    tu_fail(file, line, "ums_runtime_new succeeded but set err = %d", err);
  tu_live_runtimes++;
  return rt;
}

/* Shuts rt down, asserts that the shutdown returned 0 within a generous
** limit (a hang is reported as UMS_ETIMEDOUT) and, once no runtime is
** left, that every thread the runtimes started has been joined. */
static inline void tu_runtime_shutdown_at(const char *file, int line,
                                          ums_runtime_t *rt) {
  int r = ums_runtime_shutdown(rt, ums_deadline(10 * UMS_NSEC_PER_SEC));
  if (r != 0)
    tu_fail(file, line, "ums_runtime_shutdown returned %d (%s)", r,
            ums_err_name(r));
  if (--tu_live_runtimes == 0) {
    int want = tu_thread_baseline();
    int64_t until = ums_deadline(5 * UMS_NSEC_PER_SEC);
    while (tu_thread_count() != want) {
      if (ums_now() > until)
        tu_fail(file, line, "%d threads left after shutdown, expected %d",
                tu_thread_count(), want);
      usleep(1000);
    }
  }
}

#define tu_runtime_new_cfg(cfg) tu_runtime_new_cfg_at(__FILE__, __LINE__, cfg)
#define tu_runtime_shutdown(rt) tu_runtime_shutdown_at(__FILE__, __LINE__, rt)

/* A runtime with n schedulers and every other setting at its default. */
#define tu_runtime_new(n)                                                      \
  tu_runtime_new_cfg_at(__FILE__, __LINE__, &(ums_config_t){.schedulers = (n)})

/* ====================================================================== */
/* Tasks                                                                   */
/* ====================================================================== */

/* Spawns fn(arg) named `name` on scheduler sched of rt. */
static inline ums_task_t tu_spawn_named_at(const char *file, int line,
                                           ums_runtime_t *rt, int sched,
                                           const char *name, ums_task_fn fn,
                                           void *arg) {
  ums_spawn_opts_t o = {.sched = sched, .name = name};
  ums_task_t t = 0;
  int r = ums_task_spawn(rt, &o, fn, arg, &t);
  if (r != 0)
    tu_fail(file, line, "ums_task_spawn returned %d (%s)", r, ums_err_name(r));
  return t;
}

/* Joins t within 20 s and asserts that it ended normally. */
static inline void tu_join_ok_at(const char *file, int line, ums_runtime_t *rt,
                                 ums_task_t t) {
  int status = 1;
  int r =
      ums_task_join(rt, t, ums_deadline(20 * UMS_NSEC_PER_SEC), NULL, &status);
  if (r != 0)
    tu_fail(file, line, "ums_task_join returned %d (%s)", r, ums_err_name(r));
  if (status != 0)
    tu_fail(file, line, "the task ended with status %d (%s)", status,
            ums_err_name(status));
}

#define tu_spawn_named(rt, sched, name, fn, arg)                               \
  tu_spawn_named_at(__FILE__, __LINE__, rt, sched, name, fn, arg)
#define tu_join_ok(rt, t) tu_join_ok_at(__FILE__, __LINE__, rt, t)

/* Runs fn(arg) as a task on scheduler `sched`, waits for it (without a
** bound) and returns its result. */
static inline void *tu_in_task(ums_runtime_t *rt, int sched, ums_task_fn fn,
                               void *arg) {
  ums_spawn_opts_t o = {.sched = sched};
  ums_task_t t;
  void *res = NULL;
  CHECK_RC(ums_task_spawn(rt, &o, fn, arg, &t), 0);
  CHECK_RC(ums_task_join(rt, t, UMS_FOREVER, &res, NULL), 0);
  return res;
}

/* Task bodies; arg is a count cast to a pointer. */
static inline void *tu_spin_ms(void *arg) { /* computes, never yields */
  int64_t until = ums_now() + (int64_t)(uintptr_t)arg * UMS_NSEC_PER_MSEC;
  while (ums_now() < until) {
  }
  return NULL;
}

static inline void *tu_sleep_ms(void *arg) {
  CHECK_RC(ums_sleep((int64_t)(uintptr_t)arg * UMS_NSEC_PER_MSEC), 0);
  return NULL;
}

static inline void *tu_yield_n(void *arg) {
  for (int i = 0; i < (int)(uintptr_t)arg; i++) CHECK_RC(ums_yield(), 0);
  return NULL;
}

/* ====================================================================== */
/* Counters                                                                */
/* ====================================================================== */

#define TU_MAX_SCHEDS 64

/* One scheduler's row. */
static inline ums_sched_stats_t tu_stats(ums_runtime_t *rt, int sched) {
  ums_sched_stats_t rows[TU_MAX_SCHEDS];
  int n = ums_runtime_stats(rt, rows, TU_MAX_SCHEDS);
  if (sched < 0 || sched >= n || sched >= TU_MAX_SCHEDS)
    tu_fail(__FILE__, __LINE__, "no scheduler %d (runtime has %d)", sched, n);
  return rows[sched];
}

/* The sum of one counter over every scheduler, e.g.
** tu_stats_sum(rt, pending). */
#define tu_stats_sum(rt, field)                                                \
  __extension__({                                                              \
    ums_sched_stats_t rows_[TU_MAX_SCHEDS];                                    \
    int n_ = ums_runtime_stats((rt), rows_, TU_MAX_SCHEDS);                    \
    uint64_t sum_ = 0;                                                         \
    for (int i_ = 0; i_ < n_ && i_ < TU_MAX_SCHEDS; i_++)                      \
      sum_ += rows_[i_].field;                                                 \
    sum_;                                                                      \
  })

/* ====================================================================== */
/* Running                                                                 */
/* ====================================================================== */

/* Runs one test function, naming it first so a failure is easy to place. */
#define RUN(fn)                                                                \
  do {                                                                         \
    printf("-- %s\n", #fn);                                                    \
    fflush(stdout);                                                            \
    int64_t start_ = ums_now();                                                \
    fn();                                                                      \
    printf("   ok (%" PRId64 " ms)\n", tu_elapsed_ms(start_));                 \
    fflush(stdout);                                                            \
  } while (0)

#endif /* UMS_TEST_UTIL_H */
