/*
** test_sync.c: mutex, semaphore, event and condition variable (sync.c),
** and the contract every wait shares (wait.c): a wait ends with exactly
** one of granted, timed out and cancelled, and a wait that timed out or
** was cancelled has left its queue.
**
** The park-based forms (_begin/_end) are test_sync_park.c's.
**
** Most tests run in a "driver" task on scheduler 0 of a four-scheduler
** runtime. Where the order of events matters, the tasks involved share
** scheduler 0 with the driver: scheduling there is cooperative, so once a
** task has announced that it is about to wait and the driver has yielded,
** the task is parked, without any sleep. Cross-scheduler and host-thread
** cases prove parking by watching the scheduler go idle (su_await_idle).
*/
#include "internal.h"
#include "sync-util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSCHED 4

static ums_runtime_t *rt;

/* Spawns on the caller's scheduler (scheduler 0 when called by main). */
static ums_task_t spawn_here(ums_task_fn fn, void *arg) {
  int s = ums_current_sched();
  return su_spawn(rt, s < 0 ? 0 : s, fn, arg);
}

/* Runs fn as the driver task on scheduler 0 and waits for it. */
static void drive(const char *name, ums_task_fn fn) {
  int64_t t0 = ums_now();
  su_join(rt, su_spawn(rt, 0, fn, NULL));
  printf("  %-44s ok (%.1f ms)\n", name, (double)(ums_now() - t0) / 1e6);
  fflush(stdout);
}

/* ====================================================================== */
/* Mutex                                                                   */
/* ====================================================================== */

static void *try_unlock_fn(void *arg) {
  ums_mutex_t *m = arg;
  CHECK_EQ(ums_mutex_unlock(m), UMS_EPERM);
  CHECK_EQ(ums_mutex_trylock(m), UMS_EBUSY);
  return NULL;
}

static void *mutex_basic(void *unused) {
  ums_mutex_t *m = ums_mutex_new();
  CHECK(m != NULL);
  CHECK_EQ(ums_mutex_unlock(m), UMS_EPERM); /* not locked at all */
  CHECK_OK(ums_mutex_lock(m, UMS_FOREVER));
  CHECK_EQ(ums_mutex_lock(m, UMS_FOREVER), UMS_EDEADLK);
  CHECK_EQ(ums_mutex_lock(m, ums_deadline(MS)), UMS_EDEADLK);
  CHECK_EQ(ums_mutex_trylock(m), UMS_EBUSY);
  CHECK_EQ(ums_mutex_delete(m), UMS_EBUSY); /* owned */
  /* Another task, on this and on another scheduler, is not the owner. */
  su_join(rt, spawn_here(try_unlock_fn, m));
  su_join(rt, su_spawn(rt, 1, try_unlock_fn, m));
  CHECK_OK(ums_mutex_unlock(m));
  CHECK_EQ(ums_mutex_unlock(m), UMS_EPERM);
  CHECK_OK(ums_mutex_trylock(m));
  CHECK_EQ(ums_mutex_trylock(m), UMS_EBUSY);
  CHECK_OK(ums_mutex_unlock(m));
  CHECK_OK(ums_mutex_lock(m, ums_deadline(-1)));
  CHECK_OK(ums_mutex_unlock(m));
  /* A lock that can be granted at once succeeds even past its deadline. */
  CHECK_OK(ums_mutex_lock(m, ums_now() - MS));
  CHECK_OK(ums_mutex_unlock(m));
  CHECK_OK(ums_mutex_delete(m));
  return NULL;
}

/* The host side: a host thread is an owner of its own. */
static void *host_unlock_fn(void *arg) {
  ums_mutex_t *m = arg;
  CHECK_EQ(ums_mutex_unlock(m), UMS_EPERM);
  return NULL;
}

static void mutex_host_basic(void) {
  ums_mutex_t *m = ums_mutex_new();
  CHECK(m != NULL);
  CHECK_OK(ums_mutex_lock(m, UMS_FOREVER));
  CHECK_EQ(ums_mutex_lock(m, UMS_FOREVER), UMS_EDEADLK);
  CHECK_EQ(ums_mutex_trylock(m), UMS_EBUSY);
  su_join(rt, su_spawn(rt, 2, try_unlock_fn, m)); /* a task: EPERM */
  pthread_t th;
  CHECK_OK(pthread_create(&th, NULL, host_unlock_fn, m)); /* other thread */
  CHECK_OK(pthread_join(th, NULL));
  CHECK_OK(ums_mutex_unlock(m));
  CHECK_EQ(ums_mutex_unlock(m), UMS_EPERM);
  CHECK_OK(ums_mutex_delete(m));
  printf("  %-44s ok\n", "mutex: host-thread ownership");
}

/* FIFO handoff: five tasks queue in a known order; each unlock hands the
** mutex straight to the next one in that order. */
static ums_mutex_t *fifo_m;
static _Atomic int fifo_arrived;
static int fifo_order[5], fifo_n; /* under fifo_m */

static void *fifo_waiter(void *arg) {
  int id = (int)(intptr_t)arg;
  atomic_fetch_add(&fifo_arrived, 1);
  CHECK_OK(ums_mutex_lock(fifo_m, UMS_FOREVER));
  fifo_order[fifo_n++] = id;
  CHECK_OK(ums_yield()); /* hold it across a switch: no barging in */
  CHECK_OK(ums_mutex_unlock(fifo_m));
  return NULL;
}

static void *mutex_fifo(void *unused) {
  ums_task_t t[5];
  fifo_m = ums_mutex_new();
  fifo_n = 0;
  atomic_store(&fifo_arrived, 0);
  CHECK_OK(ums_mutex_lock(fifo_m, UMS_FOREVER));
  for (int i = 0; i < 5; i++) {
    t[i] = spawn_here(fifo_waiter, (void *)(intptr_t)i);
    su_settle();
    CHECK_EQ(atomic_load(&fifo_arrived), i + 1); /* i is parked now */
  }
  CHECK_OK(ums_mutex_unlock(fifo_m));
  /* Ownership went to waiter 0 at the unlock, before it ran: no barging. */
  CHECK_EQ(ums_mutex_trylock(fifo_m), UMS_EBUSY);
  CHECK_EQ(ums_mutex_unlock(fifo_m), UMS_EPERM);
  for (int i = 0; i < 5; i++) su_join(rt, t[i]);
  CHECK_EQ(fifo_n, 5);
  for (int i = 0; i < 5; i++) CHECK_EQ(fifo_order[i], i);
  CHECK_OK(ums_mutex_delete(fifo_m));
  return NULL;
}

/* A lock whose deadline passes returns UMS_ETIMEDOUT and leaves the
** queue: the next unlock must skip it and go to the waiter behind. */
static ums_mutex_t *to_m;
static _Atomic int to_arrived;
static _Atomic int to_second_got;

static void *timed_locker(void *arg) {
  atomic_fetch_add(&to_arrived, 1);
  int64_t d = ums_deadline(20 * MS);
  CHECK_EQ(ums_mutex_lock(to_m, d), UMS_ETIMEDOUT);
  CHECK(ums_now() >= d);
  CHECK_EQ(ums_mutex_unlock(to_m), UMS_EPERM); /* it owns nothing */
  return NULL;
}

static void *patient_locker(void *arg) {
  atomic_fetch_add(&to_arrived, 1);
  CHECK_OK(ums_mutex_lock(to_m, UMS_FOREVER));
  atomic_store(&to_second_got, 1);
  CHECK_OK(ums_mutex_unlock(to_m));
  return NULL;
}

static void *mutex_timeout(void *unused) {
  to_m = ums_mutex_new();
  atomic_store(&to_arrived, 0);
  atomic_store(&to_second_got, 0);
  CHECK_OK(ums_mutex_lock(to_m, UMS_FOREVER));
  /* Alone: times out, then unlock must leave the mutex free. */
  su_join(rt, spawn_here(timed_locker, NULL));
  CHECK_OK(ums_mutex_unlock(to_m));
  CHECK_OK(ums_mutex_trylock(to_m)); /* not handed to the gone waiter */
  /* Timed-out waiter ahead of a patient one on another scheduler. */
  ums_task_t a = spawn_here(timed_locker, NULL);
  su_settle();
  ums_task_t b = su_spawn(rt, 1, patient_locker, NULL);
  su_await(&to_arrived, 3);
  su_join(rt, a);
  CHECK_EQ(atomic_load(&to_second_got), 0);
  CHECK_OK(ums_mutex_unlock(to_m));
  su_join(rt, b);
  CHECK_EQ(atomic_load(&to_second_got), 1);
  CHECK_OK(ums_mutex_delete(to_m)); /* wq.n == 0 and no owner */
  return NULL;
}

/* Mutual exclusion with a plain counter: 8 tasks on 4 schedulers, 100,000
** increments in all, yielding inside the critical section now and then so
** that others pile up on the queue. `inside` catches two holders at once
** directly; the counter catches lost updates; TSan checks that the
** handoff orders memory. */
#define MX_TASKS 8
#define MX_TOTAL 100000
static ums_mutex_t *mx_m;
static long mx_counter;
static _Atomic int mx_inside;

static void mx_body(int iters, int yield_every) {
  for (int i = 0; i < iters; i++) {
    CHECK_OK(ums_mutex_lock(mx_m, UMS_FOREVER));
    CHECK_EQ(atomic_exchange(&mx_inside, 1), 0);
    long v = mx_counter;
    if (i % yield_every == 0) ums_yield();
    mx_counter = v + 1;
    atomic_store(&mx_inside, 0);
    CHECK_OK(ums_mutex_unlock(mx_m));
    su_watchdog_progress();
  }
}

static void *mx_task(void *arg) {
  mx_body((int)(intptr_t)arg, 97);
  return NULL;
}

static void mutex_exclusion(void) {
  int64_t t0 = ums_now();
  ums_task_t t[MX_TASKS];
  mx_m = ums_mutex_new();
  mx_counter = 0;
  /* Every hand-off waits for a wake-up across threads, which a loaded
  ** machine delays: stuck is no hand-off for 30 s. */
  su_watchdog_start("mutex: exclusion", 30);
  for (int i = 0; i < MX_TASKS; i++)
    t[i] = su_spawn(rt, i % NSCHED, mx_task,
                    (void *)(intptr_t)(MX_TOTAL / MX_TASKS));
  for (int i = 0; i < MX_TASKS; i++) su_join_watched(rt, t[i]);
  su_watchdog_stop();
  CHECK_EQ(mx_counter, MX_TOTAL);
  CHECK_OK(ums_mutex_delete(mx_m));
  printf("  %-44s ok (%.1f ms)\n", "mutex: exclusion, 8 tasks x 4 scheds",
         (double)(ums_now() - t0) / 1e6);
}

static void *mx_host(void *arg) {
  mx_body((int)(intptr_t)arg, 13);
  return NULL;
}

static void mutex_host_contention(void) {
  int64_t t0 = ums_now();
  enum { HOSTS = 2, TASKS = 6, ITERS = 5000 };
  pthread_t th[HOSTS];
  ums_task_t t[TASKS];
  mx_m = ums_mutex_new();
  mx_counter = 0;
  su_watchdog_start("mutex: host threads + tasks contending", 30);
  for (int i = 0; i < TASKS; i++)
    t[i] = su_spawn(rt, i % NSCHED, mx_task, (void *)(intptr_t)ITERS);
  for (int i = 0; i < HOSTS; i++)
    CHECK_OK(pthread_create(&th[i], NULL, mx_host, (void *)(intptr_t)ITERS));
  mx_body(ITERS, 29); /* main takes part too */
  for (int i = 0; i < HOSTS; i++) CHECK_OK(pthread_join(th[i], NULL));
  for (int i = 0; i < TASKS; i++) su_join_watched(rt, t[i]);
  su_watchdog_stop();
  CHECK_EQ(mx_counter, (long)(HOSTS + TASKS + 1) * ITERS);
  CHECK_OK(ums_mutex_delete(mx_m));
  printf("  %-44s ok (%.1f ms)\n", "mutex: host threads + tasks contending",
         (double)(ums_now() - t0) / 1e6);
}

/* ====================================================================== */
/* Semaphore                                                               */
/* ====================================================================== */

static ums_sem_t *sm_s;
static _Atomic int sm_arrived, sm_woken;
static int sm_order[8];

static void *sem_waiter(void *arg) {
  atomic_fetch_add(&sm_arrived, 1);
  CHECK_OK(ums_sem_acquire(sm_s, UMS_FOREVER));
  sm_order[atomic_fetch_add(&sm_woken, 1)] = (int)(intptr_t)arg;
  return NULL;
}

static void *sem_basic(void *unused) {
  CHECK(ums_sem_new(-1) == NULL);
  ums_sem_t *s = ums_sem_new(3);
  CHECK(s != NULL);
  CHECK_EQ(ums_sem_value(s), 3);
  CHECK_OK(ums_sem_acquire(s, UMS_FOREVER));
  CHECK_OK(ums_sem_acquire(s, ums_now() - 1)); /* available: no wait */
  CHECK_OK(ums_sem_tryacquire(s));
  CHECK_EQ(ums_sem_value(s), 0);
  CHECK_EQ(ums_sem_tryacquire(s), UMS_EAGAIN);
  int64_t d = ums_deadline(10 * MS);
  CHECK_EQ(ums_sem_acquire(s, d), UMS_ETIMEDOUT);
  CHECK(ums_now() >= d);
  CHECK_EQ(ums_sem_value(s), 0);
  CHECK_OK(ums_sem_release(s, 2));
  CHECK_EQ(ums_sem_value(s), 2);
  CHECK_EQ(ums_sem_release(s, 0), UMS_EINVAL);
  CHECK_EQ(ums_sem_release(s, -1), UMS_EINVAL);
  CHECK_EQ(ums_sem_release(s, INT64_MIN), UMS_EINVAL);
  CHECK_EQ(ums_sem_value(s), 2);
  CHECK_OK(ums_sem_delete(s));

  /* Overflow: value + n > INT64_MAX is refused and changes nothing. */
  s = ums_sem_new(INT64_MAX);
  CHECK(s != NULL);
  CHECK_EQ(ums_sem_release(s, 1), UMS_ERANGE);
  CHECK_EQ(ums_sem_value(s), INT64_MAX);
  CHECK_OK(ums_sem_tryacquire(s));
  CHECK_EQ(ums_sem_release(s, 2), UMS_ERANGE);
  CHECK_OK(ums_sem_release(s, 1));
  CHECK_EQ(ums_sem_value(s), INT64_MAX);
  CHECK_OK(ums_sem_delete(s));
  s = ums_sem_new(0);
  CHECK_OK(ums_sem_release(s, INT64_MAX));
  CHECK_EQ(ums_sem_release(s, 1), UMS_ERANGE);
  CHECK_EQ(ums_sem_value(s), INT64_MAX);
  CHECK_OK(ums_sem_delete(s));
  return NULL;
}

/* release(n) wakes n waiters, in FIFO order, and banks the rest. */
static void *sem_release_n(void *unused) {
  ums_task_t t[5];
  sm_s = ums_sem_new(0);
  atomic_store(&sm_arrived, 0);
  atomic_store(&sm_woken, 0);
  for (int i = 0; i < 5; i++) {
    t[i] = spawn_here(sem_waiter, (void *)(intptr_t)i);
    su_settle();
    CHECK_EQ(atomic_load(&sm_arrived), i + 1);
  }
  CHECK_EQ(atomic_load(&sm_woken), 0);
  CHECK_EQ(ums_sem_delete(sm_s), UMS_EBUSY);
  CHECK_OK(ums_sem_release(sm_s, 3));
  CHECK_EQ(ums_sem_value(sm_s), 0); /* all three went to waiters */
  su_settle();
  CHECK_EQ(atomic_load(&sm_woken), 3);
  for (int i = 0; i < 3; i++) CHECK_EQ(sm_order[i], i);
  CHECK_OK(ums_sem_release(sm_s, 4));
  su_settle();
  CHECK_EQ(atomic_load(&sm_woken), 5);
  CHECK_EQ(sm_order[3], 3);
  CHECK_EQ(sm_order[4], 4);
  CHECK_EQ(ums_sem_value(sm_s), 2);
  for (int i = 0; i < 5; i++) su_join(rt, t[i]);
  CHECK_OK(ums_sem_tryacquire(sm_s));
  CHECK_OK(ums_sem_tryacquire(sm_s));
  CHECK_EQ(ums_sem_tryacquire(sm_s), UMS_EAGAIN);
  CHECK_OK(ums_sem_delete(sm_s));
  return NULL;
}

/* Cross-scheduler and host: units are neither lost nor duplicated. */
#define SEM_UNITS 20000
static _Atomic long sm_taken;

static void *sem_consumer(void *arg) {
  for (;;) {
    CHECK_OK(ums_sem_acquire(sm_s, UMS_FOREVER));
    long n = atomic_fetch_add(&sm_taken, 1) + 1;
    if (n >= SEM_UNITS) return NULL;
    if (n % 64 == 0) ums_yield();
  }
}

static void sem_cross(void) {
  int64_t t0 = ums_now();
  ums_task_t t[NSCHED];
  sm_s = ums_sem_new(0);
  atomic_store(&sm_taken, 0);
  for (int i = 0; i < NSCHED; i++) t[i] = su_spawn(rt, i, sem_consumer, NULL);
  for (int i = 0; i < SEM_UNITS; i += 4) CHECK_OK(ums_sem_release(sm_s, 4));
  /* Consumers stop once SEM_UNITS have been taken; the others wait on. */
  int64_t give_up = ums_deadline(30 * UMS_NSEC_PER_SEC);
  while (atomic_load(&sm_taken) < SEM_UNITS) {
    CHECK(ums_now() < give_up);
    ums_sleep(100 * US);
  }
  /* The one that took unit SEM_UNITS has returned; one more unit each
  ** for the others. */
  CHECK_OK(ums_sem_release(sm_s, NSCHED - 1));
  for (int i = 0; i < NSCHED; i++) su_join(rt, t[i]);
  CHECK_EQ(atomic_load(&sm_taken), SEM_UNITS + NSCHED - 1);
  CHECK_EQ(ums_sem_value(sm_s), 0);
  CHECK_OK(ums_sem_delete(sm_s));
  printf("  %-44s ok (%.1f ms)\n", "sem: 20,000 units host -> 4 scheds",
         (double)(ums_now() - t0) / 1e6);
}

/* ====================================================================== */
/* Event                                                                   */
/* ====================================================================== */

static ums_event_t *ev_e;
static _Atomic int ev_arrived, ev_woken;
static int ev_order[8];

static void *event_waiter(void *arg) {
  atomic_fetch_add(&ev_arrived, 1);
  CHECK_OK(ums_event_wait(ev_e, UMS_FOREVER));
  ev_order[atomic_fetch_add(&ev_woken, 1)] = (int)(intptr_t)arg;
  return NULL;
}

static void park_event_waiters(ums_task_t *t, int n) {
  atomic_store(&ev_arrived, 0);
  atomic_store(&ev_woken, 0);
  for (int i = 0; i < n; i++) {
    t[i] = spawn_here(event_waiter, (void *)(intptr_t)i);
    su_settle();
    CHECK_EQ(atomic_load(&ev_arrived), i + 1);
  }
  CHECK_EQ(atomic_load(&ev_woken), 0);
}

static void *event_manual(void *unused) {
  ums_task_t t[3];
  int64_t d;
  ev_e = ums_event_new(1, 0);
  CHECK(ev_e != NULL);
  CHECK_EQ(ums_event_is_set(ev_e), 0);
  d = ums_deadline(10 * MS);
  CHECK_EQ(ums_event_wait(ev_e, d), UMS_ETIMEDOUT);
  CHECK(ums_now() >= d);
  park_event_waiters(t, 3);
  CHECK_EQ(ums_event_delete(ev_e), UMS_EBUSY);
  CHECK_OK(ums_event_set(ev_e));
  su_settle();
  CHECK_EQ(atomic_load(&ev_woken), 3); /* all of them */
  for (int i = 0; i < 3; i++) su_join(rt, t[i]);
  CHECK_EQ(ums_event_is_set(ev_e), 1); /* stays set */
  CHECK_OK(ums_event_wait(ev_e, UMS_FOREVER));
  CHECK_OK(ums_event_wait(ev_e, ums_now() - 1));
  CHECK_EQ(ums_event_is_set(ev_e), 1);
  CHECK_OK(ums_event_set(ev_e)); /* setting a set event: no change */
  CHECK_EQ(ums_event_is_set(ev_e), 1);
  CHECK_OK(ums_event_reset(ev_e));
  CHECK_EQ(ums_event_is_set(ev_e), 0);
  CHECK_OK(ums_event_reset(ev_e));
  CHECK_EQ(ums_event_wait(ev_e, ums_deadline(5 * MS)), UMS_ETIMEDOUT);
  CHECK_OK(ums_event_delete(ev_e));

  /* Initially set; waiters on every scheduler, set from another one. */
  ev_e = ums_event_new(1, 1);
  CHECK_EQ(ums_event_is_set(ev_e), 1);
  CHECK_OK(ums_event_wait(ev_e, UMS_FOREVER));
  CHECK_OK(ums_event_reset(ev_e));
  atomic_store(&ev_arrived, 0);
  atomic_store(&ev_woken, 0);
  ums_task_t x[NSCHED - 1];
  for (int i = 1; i < NSCHED; i++)
    x[i - 1] = su_spawn(rt, i, event_waiter, (void *)(intptr_t)i);
  su_await(&ev_arrived, NSCHED - 1);
  for (int i = 1; i < NSCHED; i++) su_await_idle(rt, i);
  CHECK_EQ(atomic_load(&ev_woken), 0);
  CHECK_OK(ums_event_set(ev_e));
  for (int i = 1; i < NSCHED; i++) su_join(rt, x[i - 1]);
  CHECK_EQ(atomic_load(&ev_woken), NSCHED - 1);
  CHECK_OK(ums_event_delete(ev_e));
  return NULL;
}

static void *event_auto(void *unused) {
  ums_task_t t[3];
  ev_e = ums_event_new(0, 0);
  CHECK(ev_e != NULL);
  park_event_waiters(t, 3);
  /* Each set wakes exactly one waiter, the longest waiting, and is used
  ** up by it. */
  for (int k = 1; k <= 3; k++) {
    CHECK_OK(ums_event_set(ev_e));
    CHECK_EQ(ums_event_is_set(ev_e), 0);
    su_settle();
    CHECK_EQ(atomic_load(&ev_woken), k);
    CHECK_EQ(ev_order[k - 1], k - 1);
  }
  for (int i = 0; i < 3; i++) su_join(rt, t[i]);

  /* A set with nobody waiting is kept for the next waiter, which takes
  ** it without waiting. */
  CHECK_OK(ums_event_set(ev_e));
  CHECK_EQ(ums_event_is_set(ev_e), 1);
  CHECK_OK(ums_event_wait(ev_e, ums_now() - 1));
  CHECK_EQ(ums_event_is_set(ev_e), 0);
  CHECK_EQ(ums_event_wait(ev_e, ums_deadline(5 * MS)), UMS_ETIMEDOUT);

  /* Two sets, one waiter: one is consumed, the other kept. */
  park_event_waiters(t, 1);
  CHECK_OK(ums_event_set(ev_e));
  CHECK_OK(ums_event_set(ev_e));
  su_join(rt, t[0]);
  CHECK_EQ(atomic_load(&ev_woken), 1);
  CHECK_EQ(ums_event_is_set(ev_e), 1);
  CHECK_OK(ums_event_wait(ev_e, ums_now() - 1));
  CHECK_EQ(ums_event_is_set(ev_e), 0);

  /* Reset drops a kept signal. */
  CHECK_OK(ums_event_set(ev_e));
  CHECK_OK(ums_event_reset(ev_e));
  CHECK_EQ(ums_event_wait(ev_e, ums_deadline(2 * MS)), UMS_ETIMEDOUT);
  CHECK_OK(ums_event_delete(ev_e));

  ev_e = ums_event_new(0, 1); /* auto, initially set */
  CHECK_EQ(ums_event_is_set(ev_e), 1);
  CHECK_OK(ums_event_wait(ev_e, UMS_FOREVER));
  CHECK_EQ(ums_event_is_set(ev_e), 0);
  CHECK_OK(ums_event_delete(ev_e));
  return NULL;
}

/* ====================================================================== */
/* Condition variable                                                      */
/* ====================================================================== */

static ums_cond_t *cv_c;
static ums_mutex_t *cv_m;
static _Atomic int cv_arrived, cv_woken, cv_returned;
static int cv_rc;

static void *cond_waiter(void *arg) {
  CHECK_OK(ums_mutex_lock(cv_m, UMS_FOREVER));
  atomic_fetch_add(&cv_arrived, 1);
  CHECK_OK(ums_cond_wait(cv_c, cv_m, UMS_FOREVER));
  atomic_fetch_add(&cv_woken, 1);
  CHECK_OK(ums_mutex_unlock(cv_m)); /* held on return */
  return NULL;
}

static void *cond_signal_one(void *unused) {
  ums_task_t t[3];
  cv_c = ums_cond_new();
  cv_m = ums_mutex_new();
  CHECK(cv_c && cv_m);
  /* A signal or broadcast with no waiter is lost, not kept. */
  CHECK_OK(ums_cond_signal(cv_c));
  CHECK_OK(ums_cond_broadcast(cv_c));
  CHECK_OK(ums_mutex_lock(cv_m, UMS_FOREVER));
  int64_t d = ums_deadline(5 * MS);
  CHECK_EQ(ums_cond_wait(cv_c, cv_m, d), UMS_ETIMEDOUT);
  CHECK(ums_now() >= d);
  CHECK_OK(ums_mutex_unlock(cv_m)); /* held again after the timeout */

  atomic_store(&cv_arrived, 0);
  atomic_store(&cv_woken, 0);
  for (int i = 0; i < 3; i++) {
    t[i] = spawn_here(cond_waiter, NULL);
    su_settle();
    CHECK_EQ(atomic_load(&cv_arrived), i + 1);
  }
  /* The waiters gave the mutex up while waiting. */
  CHECK_OK(ums_mutex_trylock(cv_m));
  CHECK_OK(ums_mutex_unlock(cv_m));
  CHECK_EQ(ums_cond_delete(cv_c), UMS_EBUSY);
  CHECK_OK(ums_cond_signal(cv_c));
  su_settle();
  CHECK_EQ(atomic_load(&cv_woken), 1);
  CHECK_OK(ums_cond_signal(cv_c));
  su_settle();
  CHECK_EQ(atomic_load(&cv_woken), 2);
  CHECK_OK(ums_cond_broadcast(cv_c));
  for (int i = 0; i < 3; i++) su_join(rt, t[i]);
  CHECK_EQ(atomic_load(&cv_woken), 3);

  /* Broadcast wakes every waiter, on every scheduler. */
  atomic_store(&cv_arrived, 0);
  atomic_store(&cv_woken, 0);
  ums_task_t x[2 * NSCHED];
  for (int i = 0; i < 2 * NSCHED; i++)
    x[i] = su_spawn(rt, i % NSCHED, cond_waiter, NULL);
  su_await(&cv_arrived, 2 * NSCHED);
  for (int i = 1; i < NSCHED; i++) su_await_idle(rt, i);
  su_settle();
  CHECK_EQ(atomic_load(&cv_woken), 0);
  CHECK_OK(ums_mutex_lock(cv_m, UMS_FOREVER));
  CHECK_OK(ums_cond_broadcast(cv_c));
  /* Woken, but they need the mutex back first. */
  su_settle();
  CHECK_EQ(atomic_load(&cv_woken), 0);
  CHECK_OK(ums_mutex_unlock(cv_m));
  for (int i = 0; i < 2 * NSCHED; i++) su_join(rt, x[i]);
  CHECK_EQ(atomic_load(&cv_woken), 2 * NSCHED);
  CHECK_OK(ums_cond_delete(cv_c));
  CHECK_OK(ums_mutex_delete(cv_m));
  return NULL;
}

/* The mutex comes back before cond_wait returns, whatever the outcome: a
** waiter whose timeout fires, or which is cancelled, while somebody else
** holds the mutex must wait for it and return holding it. */
static void *cond_late_waiter(void *arg) {
  int64_t d = arg ? ums_deadline(20 * MS) : UMS_FOREVER;
  CHECK_OK(ums_mutex_lock(cv_m, UMS_FOREVER));
  atomic_fetch_add(&cv_arrived, 1);
  cv_rc = ums_cond_wait(cv_c, cv_m, d);
  atomic_store(&cv_returned, 1);
  CHECK_OK(ums_mutex_unlock(cv_m)); /* 0 only for the owner */
  return NULL;
}

static void *cond_outcome_holds_mutex(void *unused) {
  cv_c = ums_cond_new();
  cv_m = ums_mutex_new();
  for (int cancel = 0; cancel <= 1; cancel++) {
    atomic_store(&cv_arrived, 0);
    atomic_store(&cv_returned, 0);
    cv_rc = 1;
    ums_task_t t = spawn_here(cond_late_waiter, cancel ? NULL : (void *)1);
    su_settle();
    CHECK_EQ(atomic_load(&cv_arrived), 1);
    CHECK_OK(ums_mutex_lock(cv_m, UMS_FOREVER)); /* free while it waits */
    if (cancel)
      CHECK_OK(ums_task_cancel(rt, t));
    else
      ums_sleep(40 * MS); /* its deadline passes while we hold cv_m */
    su_settle();
    CHECK_EQ(atomic_load(&cv_returned), 0); /* stuck on the relock */
    CHECK_EQ(ums_task_join(rt, t, ums_deadline(MS), NULL, NULL), UMS_ETIMEDOUT);
    /* It has left the cond's queue for the mutex's, and never touches the
    ** cond again (ASan would tell). */
    CHECK_OK(ums_cond_delete(cv_c));
    cv_c = ums_cond_new();
    CHECK_OK(ums_mutex_unlock(cv_m));
    su_join(rt, t);
    CHECK_EQ(cv_rc, cancel ? UMS_ECANCELED : UMS_ETIMEDOUT);
  }
  CHECK_OK(ums_cond_delete(cv_c));
  CHECK_OK(ums_mutex_delete(cv_m));
  return NULL;
}

/* Producer/consumer over a bounded ring with two condition variables and
** predicate loops, producers and consumers spread over every scheduler. */
#define PC_PER_PRODUCER 10000
#define PC_PRODUCERS 4
#define PC_CONSUMERS 4
#define PC_RING 8
static struct {
  ums_mutex_t *m;
  ums_cond_t *not_empty, *not_full;
  int ring[PC_RING];
  int head, count;
  int last[PC_PRODUCERS]; /* last index popped per producer */
  unsigned char seen[PC_PRODUCERS * PC_PER_PRODUCER];
  long received;
} pc;

static void pc_put(int v) {
  CHECK_OK(ums_mutex_lock(pc.m, UMS_FOREVER));
  while (pc.count == PC_RING)
    CHECK_OK(ums_cond_wait(pc.not_full, pc.m, UMS_FOREVER));
  pc.ring[(pc.head + pc.count) % PC_RING] = v;
  pc.count++;
  CHECK_OK(ums_cond_signal(pc.not_empty));
  CHECK_OK(ums_mutex_unlock(pc.m));
}

static void *pc_producer(void *arg) {
  int p = (int)(intptr_t)arg;
  for (int i = 0; i < PC_PER_PRODUCER; i++) pc_put(p * PC_PER_PRODUCER + i);
  return NULL;
}

static void *pc_consumer(void *arg) {
  for (;;) {
    CHECK_OK(ums_mutex_lock(pc.m, UMS_FOREVER));
    while (pc.count == 0)
      CHECK_OK(ums_cond_wait(pc.not_empty, pc.m, UMS_FOREVER));
    int v = pc.ring[pc.head];
    pc.head = (pc.head + 1) % PC_RING;
    pc.count--;
    if (v >= 0) {
      int p = v / PC_PER_PRODUCER, i = v % PC_PER_PRODUCER;
      CHECK_EQ(pc.seen[v], 0);
      pc.seen[v] = 1;
      CHECK(i > pc.last[p]); /* one producer's items stay in order */
      pc.last[p] = i;
      pc.received++;
    }
    CHECK_OK(ums_cond_signal(pc.not_full));
    CHECK_OK(ums_mutex_unlock(pc.m));
    if (v < 0) return NULL;
  }
}

static void cond_producer_consumer(void) {
  int64_t t0 = ums_now();
  ums_task_t prod[PC_PRODUCERS], cons[PC_CONSUMERS];
  memset(&pc, 0, sizeof pc);
  pc.m = ums_mutex_new();
  pc.not_empty = ums_cond_new();
  pc.not_full = ums_cond_new();
  for (int p = 0; p < PC_PRODUCERS; p++) pc.last[p] = -1;
  for (int i = 0; i < PC_CONSUMERS; i++)
    cons[i] = su_spawn(rt, (i + 1) % NSCHED, pc_consumer, NULL);
  for (int p = 0; p < PC_PRODUCERS; p++)
    prod[p] = su_spawn(rt, p % NSCHED, pc_producer, (void *)(intptr_t)p);
  for (int p = 0; p < PC_PRODUCERS; p++) su_join(rt, prod[p]);
  for (int i = 0; i < PC_CONSUMERS; i++) pc_put(-1); /* from this host */
  for (int i = 0; i < PC_CONSUMERS; i++) su_join(rt, cons[i]);
  CHECK_EQ(pc.received, PC_PRODUCERS * PC_PER_PRODUCER);
  CHECK_EQ(pc.count, 0);
  for (int p = 0; p < PC_PRODUCERS; p++)
    CHECK_EQ(pc.last[p], PC_PER_PRODUCER - 1);
  CHECK_OK(ums_cond_delete(pc.not_empty));
  CHECK_OK(ums_cond_delete(pc.not_full));
  CHECK_OK(ums_mutex_delete(pc.m));
  printf("  %-44s ok (%.1f ms)\n", "cond: producer/consumer, 4+4 over 4",
         (double)(ums_now() - t0) / 1e6);
}

/* ====================================================================== */
/* Misuse                                                                  */
/* ====================================================================== */

static void null_arguments(void) {
  char buf[8] = {0};
  ums_mutex_t *m = ums_mutex_new();
  ums_chan_t *ch = ums_chan_new(sizeof(int), 1);
  CHECK_EQ(ums_mutex_delete(NULL), UMS_EINVAL);
  CHECK_EQ(ums_mutex_lock(NULL, UMS_FOREVER), UMS_EINVAL);
  CHECK_EQ(ums_mutex_trylock(NULL), UMS_EINVAL);
  CHECK_EQ(ums_mutex_unlock(NULL), UMS_EINVAL);
  CHECK_EQ(ums_sem_delete(NULL), UMS_EINVAL);
  CHECK_EQ(ums_sem_acquire(NULL, UMS_FOREVER), UMS_EINVAL);
  CHECK_EQ(ums_sem_tryacquire(NULL), UMS_EINVAL);
  CHECK_EQ(ums_sem_release(NULL, 1), UMS_EINVAL);
  CHECK_EQ(ums_sem_value(NULL), UMS_EINVAL);
  CHECK_EQ(ums_event_delete(NULL), UMS_EINVAL);
  CHECK_EQ(ums_event_set(NULL), UMS_EINVAL);
  CHECK_EQ(ums_event_reset(NULL), UMS_EINVAL);
  CHECK_EQ(ums_event_wait(NULL, UMS_FOREVER), UMS_EINVAL);
  CHECK_EQ(ums_event_is_set(NULL), UMS_EINVAL);
  CHECK_EQ(ums_cond_delete(NULL), UMS_EINVAL);
  CHECK_EQ(ums_cond_wait(NULL, m, UMS_FOREVER), UMS_EINVAL);
  CHECK_EQ(ums_cond_signal(NULL), UMS_EINVAL);
  CHECK_EQ(ums_cond_broadcast(NULL), UMS_EINVAL);
  CHECK_EQ(ums_chan_delete(NULL), UMS_EINVAL);
  CHECK_EQ(ums_chan_send(NULL, buf, UMS_FOREVER), UMS_EINVAL);
  CHECK_EQ(ums_chan_recv(NULL, buf, UMS_FOREVER), UMS_EINVAL);
  CHECK_EQ(ums_chan_try_send(NULL, buf), UMS_EINVAL);
  CHECK_EQ(ums_chan_try_recv(NULL, buf), UMS_EINVAL);
  CHECK_EQ(ums_chan_close(NULL), UMS_EINVAL);
  CHECK_EQ(ums_chan_len(NULL), 0);
  CHECK_EQ(ums_chan_cap(NULL), 0);
  /* A NULL element where elem_size > 0 is refused too. */
  CHECK_EQ(ums_chan_send(ch, NULL, UMS_FOREVER), UMS_EINVAL);
  CHECK_EQ(ums_chan_recv(ch, NULL, UMS_FOREVER), UMS_EINVAL);
  CHECK_EQ(ums_chan_try_send(ch, NULL), UMS_EINVAL);
  CHECK_EQ(ums_chan_try_recv(ch, NULL), UMS_EINVAL);
  CHECK_EQ(ums_chan_len(ch), 0);
  ums_cond_t *c = ums_cond_new();
  CHECK_EQ(ums_cond_wait(c, NULL, UMS_FOREVER), UMS_EINVAL);
  /* A cond wait with a mutex the caller does not hold is refused and
  ** leaves nothing on the queue. */
  CHECK_EQ(ums_cond_wait(c, m, UMS_FOREVER), UMS_EPERM);
  CHECK_OK(ums_cond_delete(c));
  CHECK_OK(ums_chan_delete(ch));
  CHECK_OK(ums_mutex_delete(m));
  printf("  %-44s ok\n", "NULL arguments -> UMS_EINVAL");
}

/* ====================================================================== */
/* Every wait: cancellation and timeout unlink the waiter                  */
/* ====================================================================== */
/*
** One table of the seven waits. For each, a case sets up an object on
** which the wait must block, starts a waiter (a task, or a host thread for
** the timeouts), ends its wait by cancel or deadline, and then proves the
** waiter left the queue with an operation that would have gone to a
** waiter still queued (an unlock, a release, a set, a try_send/try_recv,
** a second join) and by deleting the object, which returns UMS_EBUSY
** while anyone waits. In the ASan build the deletes also make any later
** touch of the object by the runtime a use-after-free.
*/

enum { K_MUTEX, K_SEM, K_EVENT, K_COND, K_SEND, K_RECV, K_JOIN, K_N };
static const char *const kind_name[K_N] = {
    "mutex lock", "sem acquire", "event wait", "cond wait",
    "chan send",  "chan recv",   "task join"};

typedef struct wcase {
  int kind;
  ums_mutex_t *m;
  ums_sem_t *s;
  ums_event_t *e;
  ums_cond_t *c;
  ums_chan_t *ch;
  ums_event_t *target_ev; /* K_JOIN: what the joined task waits for */
  ums_task_t target;      /* K_JOIN */
  int64_t timeout;        /* relative; -1: forever */
  int64_t deadline;       /* set by the waiter */
  _Atomic int arrived;
  int rc;
  int cond_unlock_rc; /* K_COND: unlock after the wait (0 = was held) */
  int64_t returned_at;
} wcase_t;

static void *join_target(void *arg) {
  CHECK_OK(ums_event_wait(arg, UMS_FOREVER));
  return (void *)0x5a;
}

/* The blocking set-up. The caller (task or host) holds the mutex. */
static void wcase_setup(wcase_t *w, int kind, int64_t timeout) {
  memset(w, 0, sizeof *w);
  w->kind = kind;
  w->timeout = timeout;
  w->rc = 1;
  switch (kind) {
  case K_MUTEX:
    w->m = ums_mutex_new();
    CHECK_OK(ums_mutex_lock(w->m, UMS_FOREVER));
    break;
  case K_SEM:
    w->s = ums_sem_new(0);
    break;
  case K_EVENT:
    w->e = ums_event_new(0, 0);
    break;
  case K_COND:
    w->c = ums_cond_new();
    w->m = ums_mutex_new();
    break;
  case K_SEND:
  case K_RECV:
    w->ch = ums_chan_new(sizeof(int64_t), 0);
    break;
  case K_JOIN:
    w->target_ev = ums_event_new(1, 0);
    w->target = su_spawn(rt, 3, join_target, w->target_ev);
    break;
  }
}

static int wcase_wait(wcase_t *w) {
  int64_t v = 7;
  int r = 1;
  if (w->kind == K_COND) CHECK_OK(ums_mutex_lock(w->m, UMS_FOREVER));
  w->deadline = w->timeout < 0 ? UMS_FOREVER : ums_deadline(w->timeout);
  atomic_store(&w->arrived, 1);
  switch (w->kind) {
  case K_MUTEX:
    r = ums_mutex_lock(w->m, w->deadline);
    break;
  case K_SEM:
    r = ums_sem_acquire(w->s, w->deadline);
    break;
  case K_EVENT:
    r = ums_event_wait(w->e, w->deadline);
    break;
  case K_COND:
    r = ums_cond_wait(w->c, w->m, w->deadline);
    w->cond_unlock_rc = ums_mutex_unlock(w->m);
    break;
  case K_SEND:
    r = ums_chan_send(w->ch, &v, w->deadline);
    break;
  case K_RECV:
    r = ums_chan_recv(w->ch, &v, w->deadline);
    CHECK_EQ(v, 7); /* untouched */
    break;
  case K_JOIN:
    r = ums_task_join(rt, w->target, w->deadline, NULL, NULL);
    break;
  }
  w->returned_at = ums_now();
  return r;
}

static void *wcase_task(void *arg) {
  wcase_t *w = arg;
  w->rc = wcase_wait(w);
  return NULL;
}

static void *wcase_thread(void *arg) { return wcase_task(arg); }

/* The waiter has gone: prove it left the queue, then free everything. */
static void wcase_check_gone(wcase_t *w) {
  int64_t v = 9;
  void *res = NULL;
  switch (w->kind) {
  case K_MUTEX:
    /* A queued waiter would be handed the mutex by this unlock. */
    CHECK_OK(ums_mutex_unlock(w->m));
    CHECK_OK(ums_mutex_trylock(w->m));
    CHECK_OK(ums_mutex_unlock(w->m));
    CHECK_OK(ums_mutex_delete(w->m));
    break;
  case K_SEM:
    CHECK_EQ(ums_sem_value(w->s), 0);
    CHECK_OK(ums_sem_release(w->s, 1)); /* banked, not granted */
    CHECK_EQ(ums_sem_value(w->s), 1);
    CHECK_OK(ums_sem_tryacquire(w->s));
    CHECK_OK(ums_sem_delete(w->s));
    break;
  case K_EVENT:
    CHECK_OK(ums_event_set(w->e)); /* kept, not consumed */
    CHECK_EQ(ums_event_is_set(w->e), 1);
    CHECK_OK(ums_event_delete(w->e));
    break;
  case K_COND:
    CHECK_EQ(w->cond_unlock_rc, 0); /* the wait returned holding it */
    CHECK_OK(ums_cond_signal(w->c));
    CHECK_OK(ums_cond_delete(w->c));
    CHECK_OK(ums_mutex_trylock(w->m));
    CHECK_OK(ums_mutex_unlock(w->m));
    CHECK_OK(ums_mutex_delete(w->m));
    break;
  case K_SEND:
    CHECK_EQ(ums_chan_try_recv(w->ch, &v), UMS_EAGAIN); /* not delivered */
    CHECK_EQ(v, 9);
    CHECK_OK(ums_chan_delete(w->ch));
    break;
  case K_RECV:
    CHECK_EQ(ums_chan_try_send(w->ch, &v), UMS_EAGAIN); /* nobody there */
    CHECK_OK(ums_chan_delete(w->ch));
    break;
  case K_JOIN:
    /* Still joinable, and not "being joined" (UMS_EBUSY). */
    CHECK_EQ(ums_task_join(rt, w->target, ums_deadline(MS), NULL, NULL),
             UMS_ETIMEDOUT);
    CHECK_OK(ums_event_set(w->target_ev));
    CHECK_OK(ums_task_join(rt, w->target, UMS_FOREVER, &res, NULL));
    CHECK(res == (void *)0x5a);
    CHECK_EQ(ums_task_join(rt, w->target, UMS_FOREVER, NULL, NULL), UMS_ESRCH);
    CHECK_OK(ums_event_delete(w->target_ev));
    break;
  }
}

/* Mode A: cancelled by a task on the waiter's own scheduler (delivered
** at once). Mode C: by a task on another scheduler (queued delivery). */
static int cancel_same_sched;

/* Names each case as it starts, so a failure's output says which. */
static void case_start(int k) {
  printf("%s%s", k ? ", " : "    ", kind_name[k]);
  if (k == K_N - 1) printf("\n");
  fflush(stdout);
}

static void *cancel_from_task(void *arg) {
  wcase_t w;
  for (int k = 0; k < K_N; k++) {
    case_start(k);
    wcase_setup(&w, k, -1);
    ums_task_t t = su_spawn(rt, cancel_same_sched ? 0 : 1, wcase_task, &w);
    if (cancel_same_sched) {
      su_settle();
      CHECK_EQ(atomic_load(&w.arrived), 1);
    } else {
      su_await(&w.arrived, 1);
      su_await_idle(rt, 1);
    }
    CHECK_EQ(w.rc, 1); /* still waiting */
    CHECK_EQ(ums_task_join(rt, t, 0, NULL, NULL), UMS_ETIMEDOUT);
    CHECK_OK(ums_task_cancel(rt, t));
    su_join(rt, t); /* it ran: status 0 */
    CHECK_EQ(w.rc, UMS_ECANCELED);
    wcase_check_gone(&w);
    /* Joined: the handle is released. Until the owner scheduler drops the
    ** task's last reference the id may still resolve, and cancelling a
    ** finished task is harmless (0); after that, UMS_ESRCH. */
    int rc = ums_task_cancel(rt, t);
    CHECK(rc == 0 || rc == UMS_ESRCH);
  }
  return NULL;
}

/* Mode B: cancelled from a host thread, with a deadline armed; after the
** objects are freed we wait past that deadline, so a timer left armed on
** a freed wait would fire (and ASan would see it). */
static void cancel_from_host(void) {
  wcase_t w[K_N];
  ums_task_t t[K_N];
  for (int k = 0; k < K_N; k++) {
    case_start(k);
    wcase_setup(&w[k], k, 500 * MS);
    t[k] = su_spawn(rt, 1, wcase_task, &w[k]);
    su_await(&w[k].arrived, 1);
    su_await_idle(rt, 1);
    CHECK_OK(ums_task_cancel(rt, t[k]));
    su_join(rt, t[k]);
    CHECK_EQ(w[k].rc, UMS_ECANCELED);
    CHECK(w[k].returned_at < w[k].deadline);
    wcase_check_gone(&w[k]);
  }
  ums_sleep(600 * MS);
  printf("  %-44s ok\n", "every wait: cancel from host, deadline armed");
}

/* Modes D and E: a deadline ends the wait of a task, or of a host thread.
** The timeout never fires early. */
static void timeouts(int host_waiter) {
  wcase_t w;
  for (int k = 0; k < K_N; k++) {
    case_start(k);
    wcase_setup(&w, k, 20 * MS);
    if (host_waiter) {
      pthread_t th;
      CHECK_OK(pthread_create(&th, NULL, wcase_thread, &w));
      CHECK_OK(pthread_join(th, NULL));
    } else {
      su_join(rt, su_spawn(rt, 2, wcase_task, &w));
    }
    CHECK_EQ(w.rc, UMS_ETIMEDOUT);
    CHECK(w.returned_at >= w.deadline);
    CHECK(w.returned_at - w.deadline < 10 * UMS_NSEC_PER_SEC);
    wcase_check_gone(&w);
  }
  printf("  %-44s ok\n", host_waiter ? "every wait: timeout of a host thread"
                                     : "every wait: timeout of a task");
}

/* A cancelled task fails every later wait at once, also when it waits on
** nothing (sleep) or a wait could be granted at once. */
static void *sticky_cancel_fn(void *arg) {
  ums_sem_t *s = arg;
  CHECK_EQ(ums_sem_acquire(s, UMS_FOREVER), UMS_ECANCELED);
  CHECK(ums_cancelled());
  CHECK_EQ(ums_sem_acquire(s, UMS_FOREVER), UMS_ECANCELED);
  CHECK_EQ(ums_sleep(MS), UMS_ECANCELED);
  CHECK_EQ(ums_yield(), UMS_ECANCELED);
  return NULL;
}

static void *sticky_cancel(void *unused) {
  ums_sem_t *s = ums_sem_new(0);
  ums_task_t t = spawn_here(sticky_cancel_fn, s);
  su_settle();
  CHECK_OK(ums_task_cancel(rt, t));
  su_join(rt, t);
  CHECK_EQ(ums_sem_value(s), 0);
  CHECK_OK(ums_sem_delete(s));
  return NULL;
}

/* ====================================================================== */
/* The last user frees the object                                          */
/* ====================================================================== */
/*
** The completion pattern: a waiter is woken (or finds the object already
** signalled), knows it is now the object's only user, and deletes it at
** once, while the waker may still be returning from its call. This is
** what the header's rule allows (no waiter is left, so _delete frees),
** and what POSIX promises for sem_post and pthread_cond_broadcast. The
** waker must not touch the object after the wake that lets the last user
** go. A waker task on scheduler 1 races a waiter that alternates between
** a task on scheduler 0 and this host thread. In the ASan build a touch
** after the free is reported at once; in other builds it corrupts the
** heap or spins forever on the freed lock word (hence the watchdog).
*/

enum {
  L_SEM,
  L_EV_MANUAL,
  L_EV_MANUAL_UNPARKED,
  L_EV_AUTO,
  L_COND_BCAST,
  L_COND_SIGNAL,
  L_MUTEX,
  L_N
};
static const char *const lifetime_name[L_N] = {
    "sem release(1)",
    "manual event set, waiter parked",
    "manual event set, waiter not parked",
    "auto event set",
    "cond broadcast",
    "cond signal",
    "mutex unlock"};

/* Rounds per kind (su_more_rounds): LIFETIME_ITERS, fewer on a machine
** too loaded to run them in LIFETIME_BUDGET_S, as each round waits for
** wake-ups across threads. */
#define LIFETIME_ITERS 20000
#define LIFETIME_BUDGET_S 5
/* Hand-offs between waiter and waker go through their own channels (not
** spins, which crawl on an oversubscribed machine). */
static ums_chan_t *lt_obj;   /* void *: the object, waiter -> waker */
static ums_sem_t *lt_locked; /* L_MUTEX: the waker holds the mutex */
static ums_mutex_t *lt_m;    /* L_COND_*: the waiter's mutex */
static int lt_kind;

/* Serves objects until it is sent NULL, after the last round. */
static void *lt_waker(void *arg) {
  for (;;) {
    void *o = NULL;
    CHECK_OK(ums_chan_recv(lt_obj, &o, UMS_FOREVER));
    if (!o) break;
    switch (lt_kind) {
    case L_SEM:
      CHECK_OK(ums_sem_release(o, 1));
      break;
    case L_EV_MANUAL:
    case L_EV_MANUAL_UNPARKED:
    case L_EV_AUTO:
      CHECK_OK(ums_event_set(o));
      break;
    case L_COND_BCAST:
    case L_COND_SIGNAL:
      /* The mutex is free only once the waiter is queued on the cond;
      ** then signal without holding it. */
      CHECK_OK(ums_mutex_lock(lt_m, UMS_FOREVER));
      CHECK_OK(ums_mutex_unlock(lt_m));
      if (lt_kind == L_COND_BCAST)
        CHECK_OK(ums_cond_broadcast(o));
      else
        CHECK_OK(ums_cond_signal(o));
      break;
    case L_MUTEX:
      CHECK_OK(ums_mutex_lock(o, UMS_FOREVER));
      CHECK_OK(ums_sem_release(lt_locked, 1));
      /* Let the waiter queue up, so that (usually) the unlock hands the
      ** mutex over rather than finding it free. */
      CHECK_OK(ums_sleep(20 * US));
      CHECK_OK(ums_mutex_unlock(o));
      break;
    }
  }
  return NULL;
}

/* One waiter's turn: make the object, hand it over, wait, delete it. */
static void lt_one(void) {
  switch (lt_kind) {
  case L_SEM: {
    ums_sem_t *s = ums_sem_new(0);
    CHECK_OK(ums_chan_send(lt_obj, &s, UMS_FOREVER));
    CHECK_OK(ums_sem_acquire(s, UMS_FOREVER));
    CHECK_OK(ums_sem_delete(s));
    break;
  }
  case L_EV_MANUAL:
  case L_EV_MANUAL_UNPARKED:
  case L_EV_AUTO: {
    ums_event_t *e = ums_event_new(lt_kind != L_EV_AUTO, 0);
    CHECK_OK(ums_chan_send(lt_obj, &e, UMS_FOREVER));
    if (lt_kind == L_EV_MANUAL_UNPARKED)
      while (!ums_event_is_set(e)) ums_yield();
    CHECK_OK(ums_event_wait(e, UMS_FOREVER));
    CHECK_OK(ums_event_delete(e));
    break;
  }
  case L_COND_BCAST:
  case L_COND_SIGNAL: {
    /* Broadcast or signal without holding the mutex, which is allowed. */
    ums_cond_t *c = ums_cond_new();
    ums_mutex_t *m = ums_mutex_new();
    CHECK_OK(ums_mutex_lock(m, UMS_FOREVER));
    lt_m = m;
    CHECK_OK(ums_chan_send(lt_obj, &c, UMS_FOREVER));
    CHECK_OK(ums_cond_wait(c, m, UMS_FOREVER));
    CHECK_OK(ums_mutex_unlock(m));
    CHECK_OK(ums_cond_delete(c));
    CHECK_OK(ums_mutex_delete(m));
    break;
  }
  case L_MUTEX: {
    /* The waker locks it first (lt_mutex_waker), we queue behind, its
    ** unlock hands it to us, and we free it. */
    ums_mutex_t *m = ums_mutex_new();
    CHECK_OK(ums_chan_send(lt_obj, &m, UMS_FOREVER));
    CHECK_OK(ums_sem_acquire(lt_locked, UMS_FOREVER));
    CHECK_OK(ums_mutex_lock(m, UMS_FOREVER));
    CHECK_OK(ums_mutex_unlock(m));
    CHECK_OK(ums_mutex_delete(m));
    break;
  }
  }
}

static void *lt_waiter_task(void *arg) {
  lt_one();
  return NULL;
}

static void last_user_frees(void) {
  lt_obj = ums_chan_new(sizeof(void *), 1);
  lt_locked = ums_sem_new(0);
  for (lt_kind = 0; lt_kind < L_N; lt_kind++) {
    int64_t t0 = ums_now();
    int64_t until = t0 + (int64_t)LIFETIME_BUDGET_S * UMS_NSEC_PER_SEC;
    su_watchdog_start(lifetime_name[lt_kind], 30);
    ums_task_t w = su_spawn(rt, 1, lt_waker, NULL);
    int i = 0;
    for (; su_more_rounds(i, LIFETIME_ITERS, until); i++) {
      if (i % 2)
        lt_one(); /* this host thread */
      else
        su_join(rt, su_spawn(rt, 0, lt_waiter_task, NULL));
      su_watchdog_progress();
    }
    void *none = NULL;
    CHECK_OK(ums_chan_send(lt_obj, &none, UMS_FOREVER));
    su_join(rt, w);
    su_watchdog_stop();
    printf("  last user frees: %-36s ok (%d rounds, %.1f ms)\n",
           lifetime_name[lt_kind], i, (double)(ums_now() - t0) / 1e6);
  }
  CHECK_OK(ums_chan_delete(lt_obj));
  CHECK_OK(ums_sem_delete(lt_locked));
}

/* ====================================================================== */

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("test_sync: %d schedulers\n", NSCHED);
  rt = su_runtime(NSCHED, 0);

  drive("mutex: lock/trylock/unlock, EDEADLK, EPERM", mutex_basic);
  mutex_host_basic();
  drive("mutex: FIFO handoff, no barging", mutex_fifo);
  drive("mutex: deadline passes, waiter unlinked", mutex_timeout);
  mutex_exclusion();
  mutex_host_contention();

  drive("sem: counts, timeout, ERANGE, EINVAL", sem_basic);
  drive("sem: release(n) wakes n in FIFO order", sem_release_n);
  sem_cross();

  drive("event: manual reset", event_manual);
  drive("event: auto reset", event_auto);

  drive("cond: signal wakes one, broadcast all", cond_signal_one);
  drive("cond: timeout/cancel return holding mutex", cond_outcome_holds_mutex);
  cond_producer_consumer();

  null_arguments();

  cancel_same_sched = 1;
  drive("every wait: cancel, same scheduler", cancel_from_task);
  cancel_same_sched = 0;
  drive("every wait: cancel, other scheduler", cancel_from_task);
  cancel_from_host();
  timeouts(0);
  timeouts(1);
  drive("cancel is sticky", sticky_cancel);

  /* Last, so that everything above has reported if this one fails. */
  last_user_frees();

  su_teardown(rt);
  printf("test_sync: ok\n");
  return 0;
}
