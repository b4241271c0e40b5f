/*
** test_deadlock.c: ums_config_t.on_deadlock. The three shapes of a stuck
** program (an auto-reset event set once with two waiters, two mutexes
** taken in opposite orders, a channel nobody writes) are reported once,
** with every blocked task visible to the callback, which ends them by
** cancelling. What is only slow (a sleep before the wake-up, a blocking
** C call in flight) is never reported. A wake-up from a host thread is
** beyond what the runtime sees: the callback is told, and it is the
** host's to judge (it does nothing here, and the task completes).
*/
#include "test-util.h"

#include <stdatomic.h>

#define NSCHED 2

static atomic_int calls;      /* on_deadlock calls */
static atomic_int blocked;    /* suspended tasks its last call saw */
static atomic_int with_obj;   /* of them, with a wait object */
static atomic_int cancel_on;  /* cancel every task from the callback */

static ums_task_t seen[16];

static int visit(const ums_task_info_t *info, void *arg) {
  (void)arg;
  /* A parked task may show as runnable "after a wait" to a reader that
  ** compares its wait stamps (ums_task_info_t.wait_type): it still
  ** waits. */
  if (info->state == UMS_TASK_DONE || info->wait_type == UMS_WAIT_NONE)
    return 0;
  int n = atomic_fetch_add(&blocked, 1);
  CHECK_LT(n, 16);
  seen[n] = info->id;
  if (info->wait_object) atomic_fetch_add(&with_obj, 1);
  return 0;
}

/* Looks first, cancels after: a cancelled task that lets go of a mutex
** would wake the other before the walk reached it. */
static void on_deadlock(ums_runtime_t *rt, int sched, void *arg) {
  (void)arg;
  CHECK(sched >= 0 && sched < NSCHED);
  atomic_store(&blocked, 0);
  atomic_store(&with_obj, 0);
  ums_runtime_tasks(rt, visit, NULL);
  if (atomic_load(&cancel_on))
    for (int i = 0; i < atomic_load(&blocked); i++)
      ums_task_cancel(rt, seen[i]);
  atomic_fetch_add(&calls, 1);
}

static ums_runtime_t *start(void) {
  atomic_store(&calls, 0);
  atomic_store(&blocked, 0);
  atomic_store(&with_obj, 0);
  ums_config_t cfg = {.schedulers = NSCHED, .on_deadlock = on_deadlock};
  return tu_runtime_new_cfg(&cfg);
}

/* Joins t within a generous bound; returns what its wait returned. */
#define join_status(rt, t) join_status_at(__LINE__, rt, t)
static int join_status_at(int line, ums_runtime_t *rt, ums_task_t t) {
  void *res = NULL;
  int status = 1;
  int rc = ums_task_join(rt, t, ums_deadline(20 * UMS_NSEC_PER_SEC), &res,
                         &status);
  if (rc != 0) tu_fail(__FILE__, line, "join returned %d", rc);
  return status ? status : (int)(intptr_t)res;
}

/* The tasks of a shape, spawned by one task of the runtime: spawned one
** by one from this (host) thread, the first could be reported before the
** others exist, since the runtime cannot see a host thread about to
** spawn. */
typedef struct shape {
  ums_runtime_t *rt;
  int n;
  struct { int sched; const char *name; ums_task_fn fn; void *arg; } t[4];
  ums_task_t id[4];
} shape_t;

static void *spawn_shape(void *arg) {
  shape_t *sh = arg;
  for (int i = 0; i < sh->n; i++)
    sh->id[i] = tu_spawn_named_at(__FILE__, __LINE__, sh->rt, sh->t[i].sched,
                                  sh->t[i].name, sh->t[i].fn, sh->t[i].arg);
  return NULL;
}

static void start_shape(shape_t *sh) {
  ums_task_t starter = tu_spawn_named_at(__FILE__, __LINE__, sh->rt, 0,
                                         "starter", spawn_shape, sh);
  CHECK_EQ(join_status(sh->rt, starter), 0);
}

/* ---- the event set once, two waiters ---------------------------------- */

static ums_event_t *ev;

static void *wait_event(void *arg) {
  (void)arg;
  return (void *)(intptr_t)ums_event_wait(ev, UMS_FOREVER);
}

static void *set_event(void *arg) {
  (void)arg;
  return (void *)(intptr_t)ums_event_set(ev);
}

static void test_event(void) {
  ums_runtime_t *rt = start();
  atomic_store(&cancel_on, 1);
  ev = ums_event_new(0, 0);
  shape_t sh = {rt, 3, {{0, "a", wait_event, NULL},
                       {1, "b", wait_event, NULL},
                       {1, "setter", set_event, NULL}}, {0}};
  start_shape(&sh);
  ums_task_t a = sh.id[0], b = sh.id[1], s = sh.id[2];
  /* One waiter gets the event; the other can never be woken. */
  WAIT_UNTIL(atomic_load(&calls) == 1, 20000);
  CHECK_EQ(atomic_load(&blocked), 1);
  CHECK_EQ(atomic_load(&with_obj), 1);
  CHECK_EQ(join_status(rt, a) + join_status(rt, b), UMS_ECANCELED);
  CHECK_EQ(join_status(rt, s), 0);
  tu_runtime_shutdown(rt);
  CHECK_EQ(atomic_load(&calls), 1);
  ums_event_delete(ev);
}

/* ---- two mutexes in opposite orders ----------------------------------- */

static ums_mutex_t *m1, *m2;
static ums_event_t *both;   /* manual: both tasks hold their first mutex */
static atomic_int holding;

static void *lock_two(void *arg) {
  ums_mutex_t *first = arg ? m1 : m2, *second = arg ? m2 : m1;
  CHECK_RC(ums_mutex_lock(first, UMS_FOREVER), 0);
  if (atomic_fetch_add(&holding, 1) == 1) ums_event_set(both);
  ums_event_wait(both, UMS_FOREVER);
  int rc = ums_mutex_lock(second, UMS_FOREVER);
  if (rc == 0) ums_mutex_unlock(second);
  ums_mutex_unlock(first);
  return (void *)(intptr_t)rc;
}

static void test_mutexes(void) {
  ums_runtime_t *rt = start();
  atomic_store(&cancel_on, 1);
  atomic_store(&holding, 0);
  m1 = ums_mutex_new();
  m2 = ums_mutex_new();
  both = ums_event_new(1, 0);
  shape_t sh = {rt, 2, {{0, "ab", lock_two, (void *)1},
                       {1, "ba", lock_two, NULL}}, {0}};
  start_shape(&sh);
  ums_task_t a = sh.id[0], b = sh.id[1];
  /* The walk may catch one of the two between its park and the moment
  ** it shows as suspended: each report lists what it saw, and the
  ** cancels end the shape whatever the number of reports. */
  WAIT_UNTIL(atomic_load(&calls) >= 1, 20000);
  CHECK_GE(atomic_load(&blocked), 1);
  CHECK_EQ(atomic_load(&with_obj), atomic_load(&blocked));
  /* A cancelled task lets go of its first mutex, which may grant the
  ** other its second before that one's cancel arrives. */
  int ra = join_status(rt, a), rb = join_status(rt, b);
  CHECK(ra == 0 || ra == UMS_ECANCELED);
  CHECK(rb == 0 || rb == UMS_ECANCELED);
  CHECK(ra + rb != 0);
  tu_runtime_shutdown(rt);
  ums_mutex_delete(m1);
  ums_mutex_delete(m2);
  ums_event_delete(both);
}

/* ---- a channel nobody writes ------------------------------------------ */

static ums_chan_t *ch;

static void *recv_one(void *arg) {
  (void)arg;
  int v;
  return (void *)(intptr_t)ums_chan_recv(ch, &v, UMS_FOREVER);
}

static void test_channel(void) {
  ums_runtime_t *rt = start();
  atomic_store(&cancel_on, 1);
  ch = ums_chan_new(sizeof(int), 0);
  ums_task_t a = tu_spawn_named_at(__FILE__, __LINE__, rt, 1, "reader",
                                   recv_one, NULL);
  WAIT_UNTIL(atomic_load(&calls) == 1, 20000);
  CHECK_EQ(atomic_load(&blocked), 1);
  CHECK_EQ(join_status(rt, a), UMS_ECANCELED);
  tu_runtime_shutdown(rt);
  ums_chan_delete(ch);
}

/* ---- a condition wait whose mutex nobody will hand back --------------- */

/* The waiter's condition wait is signalled by a task that holds the
** mutex and then ends holding it: taking the mutex back is a wait that
** cancellation does not end, and nothing can end it otherwise. The
** handler's cancels (or none) change nothing: the detector then ends
** that wait with UMS_EDEADLK, and the waiter does not hold the mutex. */
static ums_mutex_t *cm;
static ums_cond_t *cc;
static ums_event_t *locked;

static void *cond_waiter(void *arg) {
  (void)arg;
  CHECK_RC(ums_mutex_lock(cm, UMS_FOREVER), 0);
  ums_event_set(locked);
  int rc = ums_cond_wait(cc, cm, UMS_FOREVER);
  if (rc == UMS_EDEADLK) CHECK_RC(ums_mutex_unlock(cm), UMS_EPERM);
  return (void *)(intptr_t)rc;
}

static void *lock_and_end(void *arg) {
  (void)arg;
  ums_event_wait(locked, UMS_FOREVER);
  /* Granted once the waiter's condition wait lets go of the mutex, with
  ** the waiter on the condition's queue. */
  CHECK_RC(ums_mutex_lock(cm, UMS_FOREVER), 0);
  CHECK_RC(ums_cond_signal(cc), 0);
  return NULL;
}

static void cond_case(int cancel) {
  ums_runtime_t *rt = start();
  atomic_store(&cancel_on, cancel);
  cm = ums_mutex_new();
  cc = ums_cond_new();
  locked = ums_event_new(1, 0);
  shape_t sh = {rt, 2, {{0, "waiter", cond_waiter, NULL},
                       {1, "holder", lock_and_end, NULL}}, {0}};
  start_shape(&sh);
  CHECK_EQ(join_status(rt, sh.id[1]), 0);
  CHECK_EQ(join_status(rt, sh.id[0]), UMS_EDEADLK);
  /* The handler counts its call last: the other scheduler may have
  ** broken the wait meanwhile. */
  WAIT_UNTIL(atomic_load(&calls) >= 1, 20000);
  tu_runtime_shutdown(rt);
  ums_cond_delete(cc);
  ums_event_delete(locked);
  /* ums_mutex_delete refuses a locked mutex, and this one stays locked
  ** by its ended holder: its memory is ums_mutex_new's calloc. */
  free(cm);
}

static void test_cond_relock(void) {
  cond_case(1);
  cond_case(0);
}

/* ---- slow, not stuck: a sleep, then the wake-up ------------------------ */

static void *sleep_then_set(void *arg) {
  (void)arg;
  ums_sleep(tu_ms(200));
  ums_event_set(ev);
  return NULL;
}

static void test_sleep_not_reported(void) {
  ums_runtime_t *rt = start();
  atomic_store(&cancel_on, 0);
  ev = ums_event_new(0, 0);
  shape_t sh = {rt, 2, {{0, "waiter", wait_event, NULL},
                       {1, "sleeper", sleep_then_set, NULL}}, {0}};
  start_shape(&sh);
  ums_task_t w = sh.id[0], s = sh.id[1];
  CHECK_EQ(join_status(rt, w), 0);
  CHECK_EQ(join_status(rt, s), 0);
  tu_runtime_shutdown(rt);
  CHECK_EQ(atomic_load(&calls), 0);
  ums_event_delete(ev);
}

/* ---- slow, not stuck: a blocking C call in flight ---------------------- */

static void blocking_sleep(void *arg) {
  (void)arg;
  usleep(200 * 1000);
}

static void blocking_sleep_long(void *arg) {
  (void)arg;
  usleep(300 * 1000);
}

static void *call_then_set(void *arg) {
  (void)arg;
  CHECK_RC(ums_preempt(blocking_sleep, NULL, NULL, UMS_FOREVER), 0);
  ums_event_set(ev);
  return NULL;
}

static void test_call_not_reported(void) {
  ums_runtime_t *rt = start();
  atomic_store(&cancel_on, 0);
  ev = ums_event_new(0, 0);
  shape_t sh = {rt, 2, {{0, "waiter", wait_event, NULL},
                       {1, "caller", call_then_set, NULL}}, {0}};
  start_shape(&sh);
  ums_task_t w = sh.id[0], c = sh.id[1];
  CHECK_EQ(join_status(rt, w), 0);
  CHECK_EQ(join_status(rt, c), 0);
  tu_runtime_shutdown(rt);
  CHECK_EQ(atomic_load(&calls), 0);
  ums_event_delete(ev);
}

/* ---- stuck behind a C call nobody waits for any more ------------------ */

/* The caller gives up on its call (a 10 ms deadline; the call goes on
** for 300 ms, detached) and then waits on a channel nobody writes. The
** scheduler goes idle while the call still counts as in flight, so not
** stuck yet; when the call ends, that count drops on the pool thread,
** which must wake the scheduler to find the deadlock. */
static void *give_up_then_recv(void *arg) {
  (void)arg;
  int rc = ums_preempt(blocking_sleep_long, NULL, NULL,
                       ums_deadline(10 * UMS_NSEC_PER_MSEC));
  CHECK_RC(rc, UMS_ETIMEDOUT);
  int v;
  return (void *)(intptr_t)ums_chan_recv(ch, &v, UMS_FOREVER);
}

static void test_abandoned_call_then_stuck(void) {
  ums_runtime_t *rt = start();
  atomic_store(&cancel_on, 1);
  ch = ums_chan_new(sizeof(int), 0);
  ums_task_t a = tu_spawn_named_at(__FILE__, __LINE__, rt, 0, "giver-up",
                                   give_up_then_recv, NULL);
  WAIT_UNTIL(atomic_load(&calls) == 1, 20000);
  CHECK_EQ(join_status(rt, a), UMS_ECANCELED);
  tu_runtime_shutdown(rt);
  ums_chan_delete(ch);
}

/* ---- a host thread wakes a task after 100 ms --------------------------- */

static void *host_sets(void *arg) {
  (void)arg;
  usleep(100 * 1000);
  ums_event_set(ev);
  return NULL;
}

static void test_host_wakeup(void) {
  ums_runtime_t *rt = start();
  atomic_store(&cancel_on, 0);
  ev = ums_event_new(0, 0);
  ums_task_t w = tu_spawn_named_at(__FILE__, __LINE__, rt, 0, "waiter",
                                   wait_event, NULL);
  pthread_t host;
  CHECK_EQ(pthread_create(&host, NULL, host_sets, NULL), 0);
  /* The callback does not end anything by itself: the host's wake-up
  ** lets the task finish normally. */
  CHECK_EQ(join_status(rt, w), 0);
  pthread_join(host, NULL);
  tu_runtime_shutdown(rt);
  /* Told at most once, while the host thread slept: the runtime cannot
  ** see it. */
  CHECK_LE(atomic_load(&calls), 1);
  ums_event_delete(ev);
}

/* ---- without the callback, no detection -------------------------------- */

static void test_off_by_default(void) {
  ums_runtime_t *rt = tu_runtime_new(NSCHED);
  ch = ums_chan_new(sizeof(int), 0);
  ums_task_t a = tu_spawn_named_at(__FILE__, __LINE__, rt, 0, "reader",
                                   recv_one, NULL);
  WAIT_UNTIL(tu_stats(rt, 0).idle && tu_stats(rt, 1).idle, 20000);
  usleep(50 * 1000);
  CHECK_RC(ums_task_cancel(rt, a), 0);
  CHECK_EQ(join_status(rt, a), UMS_ECANCELED);
  tu_runtime_shutdown(rt);
  ums_chan_delete(ch);
}

int main(void) {
  for (int i = 0; i < 20; i++) {
    test_event();
    test_mutexes();
    test_channel();
    test_cond_relock();
  }
  test_sleep_not_reported();
  test_call_not_reported();
  test_abandoned_call_then_stuck();
  test_host_wakeup();
  test_off_by_default();
  puts("test_deadlock: ok");
  return 0;
}
