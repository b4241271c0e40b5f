/*
** stress_wake_timeout.c: a wake racing a timeout.
**
** A waiter task on scheduler 0 waits with a deadline D = now + X while a
** releaser on scheduler 1 (a task, or in every fourth iteration a host
** thread) releases at about D. Both sides sleep in their scheduler's (or
** thread's) timed futex wait, so the waiter's timer and the release land
** within microseconds of each other. Each iteration ends in exactly one
** of two outcomes, and the resource must agree with it:
**
**   semaphore: acquire returned 0        -> the unit is gone (value 0)
**              acquire timed out         -> the unit is still there
**   auto event: wait returned 0          -> the signal was consumed
**               wait timed out           -> the event is still set
**   channel:   recv returned 0           -> it holds the sent value, and
**                                           nothing is left to receive
**              recv timed out            -> its buffer is untouched and the
**                                           value is still receivable
**   mutex:     lock returned 0           -> the waiter owns it
**              lock timed out            -> the unlock left it free, not
**                                           handed to the departed waiter
**
** Anything else (another code, a unit lost or received twice) fails. The
** release time is steered around the point where both outcomes are
** equally likely: each "granted" moves it later, each "timed out" earlier,
** plus some jitter, so most iterations sit right in the race window
** whatever the machine's wake-up latency is. Both outcomes must be seen.
**
** X starts small and grows only if the releaser cannot keep up (the
** steering pins the release at its earliest, D - X, so it arrives late
** anyway): a loaded machine makes the run slower, not one-sided.
**
** Iterations: 100,000 per primitive, in every build.
*/
#include "internal.h"
#include "sync-util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* Iterations per primitive: 30,000 by default (each outcome about 15,000
** times, with the race steered to the deadline), or UMS_STRESS_ITERS for a
** longer soak. */
static int64_t ITERS = 30000;
/* The deadline's first distance: enough for the releaser to wake on "go"
** and get to its own timed sleep before D. */
#define X0_NS ((SANITIZED ? 150 : 100) * US)
#define X_MAX_NS (20 * MS)
static int64_t x_ns = X0_NS;
#define JITTER_NS (15 * US)
#define STEP_NS (1 * US)

enum { V_SEM, V_EVENT, V_CHAN, V_MUTEX, V_N };
static const char *const variant_name[V_N] = {
    "sem acquire vs release", "auto event wait vs set", "chan recv vs send",
    "mutex lock vs unlock"};

typedef struct go {
  int64_t release_at;
  int64_t seq;
  int variant;
  int stop;
} go_t;

static ums_runtime_t *rt;
static ums_sem_t *sem;
static ums_event_t *ev;
static ums_chan_t *ch;                /* unbuffered int64_t: the race */
static ums_chan_t *go_task, *go_host; /* go_t to each releaser */
static ums_chan_t *done;              /* int64_t seq back to the waiter */
static ums_mutex_t *mtx;
static ums_sem_t *held; /* V_MUTEX: the releaser holds mtx */

/* Outcome counts, [variant][releaser 0 task / 1 host][0 granted, 1 t/o]. */
static long counts[V_N][2][2];

static void release(const go_t *g) {
  switch (g->variant) {
  case V_SEM:
    CHECK_OK(ums_sem_release(sem, 1));
    break;
  case V_EVENT:
    CHECK_OK(ums_event_set(ev));
    break;
  case V_CHAN:
    /* Blocks until the waiter takes it: at once if it is still waiting,
    ** after its second receive if it timed out. */
    CHECK_OK(ums_chan_send(ch, &g->seq, UMS_FOREVER));
    break;
  case V_MUTEX:
    CHECK_OK(ums_mutex_unlock(mtx));
    break;
  }
}

/* The releaser, as a task on scheduler 1 or as a host thread. */
static void *releaser(void *arg) {
  ums_chan_t *in = arg;
  /* Timed sleeps end on time, not up to 50 us late: a tighter race. This
  ** sets the slack of the thread we run on (scheduler 1's, or ours). */
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  for (;;) {
    go_t g;
    CHECK_OK(ums_chan_recv(in, &g, UMS_FOREVER));
    if (g.stop) return NULL;
    if (g.variant == V_MUTEX) {
      CHECK_OK(ums_mutex_lock(mtx, UMS_FOREVER));
      CHECK_OK(ums_sem_release(held, 1));
    }
    CHECK_OK(ums_sleep_until(g.release_at));
    release(&g);
    CHECK_OK(ums_chan_send(done, &g.seq, UMS_FOREVER));
  }
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int64_t jitter(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (int64_t)(rng % (2 * JITTER_NS + 1)) - JITTER_NS;
}

/* One iteration; returns 1 when the wait timed out, 0 when granted. */
static int iteration(int variant, int host, int64_t seq, int64_t offset) {
  int64_t d = ums_deadline(x_ns), v = -1, got = -1;
  go_t g = {d + offset, seq, variant, 0};
  int r = 1, timed_out;
  CHECK_OK(ums_chan_send(host ? go_host : go_task, &g, UMS_FOREVER));
  switch (variant) {
  case V_SEM:
    r = ums_sem_acquire(sem, d);
    break;
  case V_EVENT:
    r = ums_event_wait(ev, d);
    break;
  case V_CHAN:
    r = ums_chan_recv(ch, &v, d);
    break;
  case V_MUTEX:
    CHECK_OK(ums_sem_acquire(held, UMS_FOREVER)); /* the releaser has it */
    r = ums_mutex_lock(mtx, d);
    break;
  }
  if (r != 0 && r != UMS_ETIMEDOUT) {
    fprintf(stderr, "iteration %lld (%s): wait returned %d %s\n",
            (long long)seq, variant_name[variant], r, ums_err_name(r));
    exit(1);
  }
  timed_out = r == UMS_ETIMEDOUT;
  if (timed_out) CHECK(ums_now() >= d); /* never early */

  switch (variant) {
  case V_SEM:
    CHECK_OK(ums_chan_recv(done, &got, UMS_FOREVER));
    if (timed_out) {
      /* The unit was not taken: it is still in the semaphore. */
      CHECK_EQ(ums_sem_value(sem), 1);
      CHECK_OK(ums_sem_tryacquire(sem));
    }
    CHECK_EQ(ums_sem_value(sem), 0);
    CHECK_EQ(ums_sem_tryacquire(sem), UMS_EAGAIN);
    break;
  case V_EVENT:
    CHECK_OK(ums_chan_recv(done, &got, UMS_FOREVER));
    if (timed_out) {
      CHECK_EQ(ums_event_is_set(ev), 1); /* the set was kept */
      CHECK_OK(ums_event_wait(ev, ums_now() - 1));
    }
    CHECK_EQ(ums_event_is_set(ev), 0);
    break;
  case V_CHAN:
    if (timed_out) {
      CHECK_EQ(v, -1); /* nothing was written to a timed-out receiver */
      CHECK_OK(ums_chan_recv(ch, &v, ums_deadline(10 * UMS_NSEC_PER_SEC)));
    }
    CHECK_EQ(v, seq);
    CHECK_OK(ums_chan_recv(done, &got, UMS_FOREVER));
    CHECK_EQ(ums_chan_try_recv(ch, &v), UMS_EAGAIN); /* not sent twice */
    break;
  case V_MUTEX:
    CHECK_OK(ums_chan_recv(done, &got, UMS_FOREVER));
    /* Timed out: free again. Granted: ours, so trylock is refused. */
    CHECK_EQ(ums_mutex_trylock(mtx), timed_out ? 0 : UMS_EBUSY);
    CHECK_OK(ums_mutex_unlock(mtx));
    CHECK_EQ(ums_mutex_unlock(mtx), UMS_EPERM);
    break;
  }
  CHECK_EQ(got, seq);
  return timed_out;
}

static void *waiter(void *arg) {
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  for (int variant = 0; variant < V_N; variant++) {
    int64_t t0 = ums_now();
    /* Start with the release at the deadline; steer from there. */
    int64_t center = 0, lo = INT64_MAX, hi = INT64_MIN;
    for (int64_t i = 0; i < ITERS; i++) {
      int host = (i % 4) == 3;
      int64_t offset = center + jitter();
      int t = iteration(variant, host, i, offset);
      counts[variant][host][t]++;
      center += t ? -STEP_NS : STEP_NS;
      if (center > x_ns) center = x_ns;
      if (center < -x_ns) {
        /* Even a release at once is late: give the releaser more time. */
        center = -x_ns;
        if (x_ns < X_MAX_NS) x_ns += x_ns / 8;
      }
      if (i > ITERS / 10) {
        if (center < lo) lo = center;
        if (center > hi) hi = center;
      }
    }
    long *c = &counts[variant][0][0];
    printf("  %-24s %ld iterations in %.1f s: granted %ld (task %ld, host "
           "%ld), timed out %ld (task %ld, host %ld); deadline now + "
           "%.0f us, release offset settled in [%+.1f, %+.1f] us\n",
           variant_name[variant], (long)ITERS, (double)(ums_now() - t0) / 1e9,
           c[0] + c[2], c[0], c[2], c[1] + c[3], c[1], c[3], (double)x_ns / 1e3,
           (double)lo / 1e3, (double)hi / 1e3);
    fflush(stdout);
    /* Both outcomes happened, or the race was never run. */
    CHECK(c[0] + c[2] > 0);
    CHECK(c[1] + c[3] > 0);
    CHECK_EQ(c[0] + c[1] + c[2] + c[3], ITERS);
  }
  go_t stop = {0, 0, 0, 1};
  CHECK_OK(ums_chan_send(go_task, &stop, UMS_FOREVER));
  CHECK_OK(ums_chan_send(go_host, &stop, UMS_FOREVER));
  return NULL;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *iters = getenv("UMS_STRESS_ITERS");
  if (iters) {
    char *end;
    long long n = strtoll(iters, &end, 10);
    if (*iters == '\0' || *end != '\0' || n < 100) {
      fprintf(stderr,
              "stress_wake_timeout: UMS_STRESS_ITERS must be a whole number "
              ">= 100, got '%s'\n", iters);
      return 2;
    }
    ITERS = n;
  }
  printf("stress_wake_timeout: %ld iterations per primitive%s\n", (long)ITERS,
         SANITIZED ? " (sanitizer build)" : "");
  rt = su_runtime(2, 0);
  sem = ums_sem_new(0);
  ev = ums_event_new(0, 0);
  ch = ums_chan_new(sizeof(int64_t), 0);
  go_task = ums_chan_new(sizeof(go_t), 0);
  go_host = ums_chan_new(sizeof(go_t), 0);
  done = ums_chan_new(sizeof(int64_t), 0);
  mtx = ums_mutex_new();
  held = ums_sem_new(0);
  CHECK(sem && ev && ch && go_task && go_host && done && mtx && held);

  pthread_t host;
  CHECK_OK(pthread_create(&host, NULL, releaser, go_host));
  ums_task_t r = su_spawn(rt, 1, releaser, go_task);
  ums_task_t w = su_spawn(rt, 0, waiter, NULL);
  /* The waiter runs the whole test: no 60-second bound (su_join) here. */
  int status = -1;
  CHECK_OK(ums_task_join(rt, w, UMS_FOREVER, NULL, &status));
  CHECK_EQ(status, 0);
  su_join(rt, r);
  CHECK_OK(pthread_join(host, NULL));

  CHECK_EQ(ums_sem_value(sem), 0);
  CHECK_EQ(ums_event_is_set(ev), 0);
  CHECK_EQ(ums_chan_len(ch), 0);
  CHECK_OK(ums_sem_delete(sem));
  CHECK_OK(ums_event_delete(ev));
  CHECK_OK(ums_chan_delete(ch));
  CHECK_OK(ums_chan_delete(go_task));
  CHECK_OK(ums_chan_delete(go_host));
  CHECK_OK(ums_chan_delete(done));
  CHECK_OK(ums_mutex_delete(mtx));
  CHECK_OK(ums_sem_delete(held));
  su_teardown(rt);
  printf("stress_wake_timeout: ok\n");
  return 0;
}
