/*
** task.c: the task table, spawning, joining, cancelling and the
** current-task calls (ums_self, ums_yield, ums_sleep, ums_exit).
**
** A task's memory is type-stable: tasks live in chunks that are freed only
** with the runtime, and a handle carries a generation. Any thread may look
** a handle up; it re-checks the id under the task's lock before acting.
**
** References (t->refs): one while the task is alive (dropped when it
** finishes), one for the handle unless detached (dropped by join or
** detach), one while a cancel request is queued to its scheduler. The last
** reference recycles the task.
*/
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Local free lists are capped so tasks spawned on one scheduler and
** finished on another do not pile up on one side. */
#define LOCAL_FREE_MAX 4096
/* Records a scheduler moves at once between the table and its own free
** list: fresh ones taken when its list is empty, freed ones given back
** when its list is full. */
#define FRESH_BATCH 32

/* Adds a chunk of fresh tasks, handed out from rt->fresh on. Its zeroed
** pages stay untouched until then: a short runtime faults in the few it
** uses. [table_lock] */
static int grow_table(ums_runtime_t *rt) {
  uint32_t base = atomic_load_explicit(&rt->nslots, memory_order_relaxed);
  if (base / UMS__TASK_CHUNK >= UMS__TASK_MAX_CHUNKS) return UMS_EMFILE;
  ums__task_t *chunk = ums__pages_alloc(UMS__TASK_CHUNK * sizeof *chunk);
  if (!chunk) return UMS_ENOMEM;
  atomic_store_explicit(&rt->chunks[base / UMS__TASK_CHUNK], chunk,
                        memory_order_release);
  atomic_store_explicit(&rt->nslots, base + UMS__TASK_CHUNK,
                        memory_order_release);
  return 0;
}

/* A free task record, reset, or NULL when out of memory. Static and
** inline: task_spawn_impl is its one caller, and a spawn is hot. */
static inline ums__task_t *task_alloc(ums_runtime_t *rt) {
  ums__sched_t *s = ums__sched_current();
  ums__task_t *t = NULL;
  if (s && s->rt == rt && s->free_tasks) {
    t = s->free_tasks;
    s->free_tasks = t->next;
    s->nfree_tasks--;
  } else {
    pthread_mutex_lock(&rt->table_lock);
    if ((t = rt->free_tasks) != NULL) {
      rt->free_tasks = t->next;
    } else if (rt->fresh < atomic_load_explicit(&rt->nslots,
                                                memory_order_relaxed) ||
               grow_table(rt) == 0) {
      t = ums__task_at(rt, rt->fresh);
      t->slot = rt->fresh++;
      /* The rest of the batch goes to the caller's own free list (its
      ** local list is empty, or the first branch would have served). A
      ** fresh record is zero: UMS__T_FREE, id 0, as task_free leaves one. */
      if (s && s->rt == rt) {
        uint32_t n = atomic_load_explicit(&rt->nslots, memory_order_relaxed);
        for (int i = 1; i < FRESH_BATCH && rt->fresh < n; i++) {
          ums__task_t *f = ums__task_at(rt, rt->fresh);
          f->slot = rt->fresh++;
          f->next = s->free_tasks;
          s->free_tasks = f;
          s->nfree_tasks++;
        }
      }
    }
    pthread_mutex_unlock(&rt->table_lock);
    if (!t) return NULL;
  }
  t->next = NULL;
  t->pend.prev = t->pend.next = NULL;
  t->inbox_next = t->cancel_next = NULL;
  t->worker = NULL;
  t->wait = NULL;
  ums__wait_timer_init(t);
  t->result = NULL;
  t->status = 0;
  t->start_err = 0;
  t->done = t->joining = t->detached = t->started = false;
  t->park_pending = false;
  atomic_store_explicit(&t->park.state, 0, memory_order_relaxed);
  /* The park waiter's identity never changes while the task lives, so
  ** ums_park_begin_wait leaves it alone. */
  t->park.link.prev = t->park.link.next = NULL;
  t->park.linked = false;
  t->park.wq = NULL;
  t->park.lock = &t->lock;
  t->park.task = t;
  ums_list_init(&t->joiners.list);
  t->joiners.n = 0;
  t->name[0] = '\0';
  t->spawner = 0;
  atomic_store_explicit(&t->obs, UMS__OBS(UMS_TASK_PENDING, UMS_WAIT_NONE),
                        memory_order_relaxed);
  atomic_store_explicit(&t->wait_since, 0, memory_order_relaxed);
  atomic_store_explicit(&t->cpu_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&t->cancelled, 0, memory_order_relaxed);
  atomic_store_explicit(&t->cancel_queued, 0, memory_order_relaxed);
  atomic_store_explicit(&t->break_wait, 0, memory_order_relaxed);
  return t;
}

/* task_free past the local cap, or on a thread of no scheduler of rt:
** the record, with the FRESH_BATCH - 1 most recent of the local list when
** it is full, goes to the shared list, so that a burst of ends past the
** cap takes the table lock once per batch, not once per task. Cold and
** out of line: task_free, inlined into every unref, stays small. */
static __attribute__((noinline, cold)) void task_free_shared(
    ums_runtime_t *rt, ums__sched_t *s, ums__task_t *t) {
  ums__task_t *last = t;  /* t..last go to the shared list */
  if (s && s->rt == rt) {
    t->next = s->free_tasks;
    for (int i = 1; i < FRESH_BATCH; i++) last = last->next;
    s->free_tasks = last->next;
    s->nfree_tasks -= FRESH_BATCH - 1;
  }
  pthread_mutex_lock(&rt->table_lock);
  last->next = rt->free_tasks;
  rt->free_tasks = t;
  pthread_mutex_unlock(&rt->table_lock);
}

static void task_free(ums_runtime_t *rt, ums__task_t *t) {
  ums__sched_t *s = ums__sched_current();
  t->state = UMS__T_FREE;
  if (s && s->rt == rt && s->nfree_tasks < LOCAL_FREE_MAX) {
    t->next = s->free_tasks;
    s->free_tasks = t;
    s->nfree_tasks++;
    return;
  }
  task_free_shared(rt, s, t);
}

void ums__task_unref(ums_runtime_t *rt, ums__task_t *t) {
  if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1)
    return;
  /* Retire the handle under the lock so that a concurrent join or cancel
  ** that looked the task up either sees the old id and finishes first, or
  ** sees 0 and reports UMS_ESRCH. */
  ums__lock(&t->lock);
  atomic_store_explicit(&t->id, 0, memory_order_release);
  ums__unlock(&t->lock);
  task_free(rt, t);
}

/* ---------------------------------------------------------------------- */
/* Spawning and placement                                                  */
/* ---------------------------------------------------------------------- */

/* The placement policy (ums_runtime_place, ums-binding.h): the fewest
** live tasks plus extra[i], here's own winning ties, then the lowest
** index. The scan stops at a scheduler with nothing to do: no other can
** do better, and the spawn path pays for no more loads than it needs. */
static inline int place(ums_runtime_t *rt, int here, const int64_t *extra) {
  int best = -1;
  int64_t best_n = 0;
  if (here >= 0 && !(extra && extra[here] == UMS_PLACE_SKIP)) {
    best = here;
    best_n = ums__sched_load(&rt->scheds[here]) + (extra ? extra[here] : 0);
  }
  for (int i = 0; i < rt->nsched && (best < 0 || best_n > 0); i++) {
    if (extra && extra[i] == UMS_PLACE_SKIP) continue;
    int64_t n = ums__sched_load(&rt->scheds[i]) + (extra ? extra[i] : 0);
    if (best < 0 || n < best_n) {
      best = i;
      best_n = n;
    }
  }
  return best;
}

int ums_runtime_place(ums_runtime_t *rt, int here, const int64_t *extra) {
  if (!rt || here < -1 || here >= rt->nsched) return -1;
  return place(rt, here, extra);
}

/* Where a task spawned with UMS_ANY_SCHED goes: the caller's own
** scheduler wins ties, which keeps related tasks together. */
static ums__sched_t *least_loaded(ums_runtime_t *rt) {
  ums__sched_t *here = ums__sched_current();
  int h = (here && here->rt == rt) ? here->id : 0;
  return &rt->scheds[place(rt, h, NULL)];
}

/* s->ntasks_own += d. [owner] */
static inline void ntasks_own_add(ums__sched_t *s, int64_t d) {
  atomic_store_explicit(&s->ntasks_own,
      atomic_load_explicit(&s->ntasks_own, memory_order_relaxed) + d,
      memory_order_relaxed);
}

/* The last task's end while stopping wakes the shutdown that waits for
** it; a runtime whose caller runs its scheduler has nobody waiting: the
** caller returns from running it instead (sched.c, run_live). */
static void live_dec(ums_runtime_t *rt) {
  if (atomic_fetch_sub(&rt->live, 1) == 1 && atomic_load(&rt->stopping)) {
    if (rt->cfg.run_on_caller) ums_runtime_pause(rt);
    else ums__futex_wake(&rt->live, INT_MAX);
  }
}

static void live_sub(ums_runtime_t *rt, ums__sched_t *s, bool own);

/* Counts a task about to be spawned onto s (own: by s's own thread) in
** rt->live, or returns false when the runtime is shutting down. The
** count comes before the look at `stopping`: shutdown sets `stopping` and
** then waits for `live` to reach zero, so either it sees this task or
** this spawn sees `stopping` (both are sequentially consistent). Tasks
** s's thread spawns onto s share one unit of `live` while there are any
** (nlive_own): a spawn that finds others there relies on their unit,
** which only this thread can give back, so it needs no read-modify-write
** of its own (nor does the finish of any but the last), and shutdown
** still cannot see zero while the task lives. */
static bool live_add(ums_runtime_t *rt, ums__sched_t *s, bool own) {
  if (!own || s->nlive_own++ == 0) atomic_fetch_add(&rt->live, 1);
  if (UMS__UNLIKELY(atomic_load(&rt->stopping))) {
    live_sub(rt, s, own);
    return false;
  }
  return true;
}

/* Takes back what live_add counted. */
static void live_sub(ums_runtime_t *rt, ums__sched_t *s, bool own) {
  if (!own || --s->nlive_own == 0) live_dec(rt);
}

/* Spawns a task onto s, which the caller has chosen (own: s is the
** calling thread's own scheduler): what every spawn does once its
** options are checked and its scheduler placed. Inline into its two
** callers, the general spawn and ums_task_spawn_step_here, so that the
** latter pays for none of the checks it does not need. */
static inline __attribute__((always_inline)) int
spawn_on(ums_runtime_t *rt, ums__sched_t *s, bool own, ums_task_fn fn,
         ums_step_fn step, void *arg, bool detached, const char *name,
         ums_task_t *out) {
  if (!live_add(rt, s, own)) return UMS_ESHUTDOWN;
  ums__task_t *t = task_alloc(rt);
  if (!t) {
    live_sub(rt, s, own);
    return UMS_ENOMEM;
  }
  t->live_own = own;
  t->sched = s;
  t->fn = fn;
  t->step = step;
  t->arg = arg;
  t->detached = detached;
  t->state = UMS__T_NEW;
  if (name) {
    strncpy(t->name, name, UMS__TASK_NAME_MAX - 1);
    t->name[UMS__TASK_NAME_MAX - 1] = '\0';
  }
  ums__task_t *parent = ums__task_current();
  if (parent && parent->sched->rt == rt)
    t->spawner = atomic_load_explicit(&parent->id, memory_order_relaxed);
  atomic_store_explicit(&t->refs, detached ? 1 : 2, memory_order_relaxed);
  if (own)
    ntasks_own_add(s, 1);
  else
    atomic_fetch_add_explicit(&s->ntasks_in, 1, memory_order_relaxed);

  /* Publishing the id needs no lock. The record came off a free list, so
  ** it was retired: its id was set to 0 under t->lock (ums__task_unref,
  ** ums__task_finish) before it was freed, and nobody has seen the new
  ** id yet. So a thread that looked up an older id and takes the lock
  ** after the retirement sees 0 or the new id, never its own, and gives
  ** up (ESRCH) without touching anything else; one that holds the lock
  ** from before the retirement cannot exist, since retiring takes it.
  ** A thread that sees the new id (ums__task_lookup, ums__task_id_locked:
  ** acquire) sees the initialisation above, which this release store
  ** publishes. gen is only ever touched here, by the one spawner of the
  ** free record, so a plain store does: a locked exchange would stall on
  ** the cold stores of the initialisation. */
  t->gen = t->gen + 1 ? t->gen + 1 : 1;
  uint64_t id = ((uint64_t)t->gen << 32) | t->slot;
  atomic_store_explicit(&t->id, id, memory_order_release);
  if (out) *out = id;

  if (own)
    ums__sched_admit(s, t);
  else
    ums__sched_post(s, t);
  return 0;
}

static int task_spawn_impl(ums_runtime_t *rt, const ums_spawn_opts_t *opts,
                           ums_task_fn fn, ums_step_fn step, void *arg,
                           ums_task_t *out) {
  static const ums_spawn_opts_t defaults = {UMS_ANY_SCHED, 0, NULL};
  if (!opts) opts = &defaults;
  if (!rt || (!fn && !step)) return UMS_EINVAL;
  if (opts->sched != UMS_ANY_SCHED &&
      (opts->sched < 0 || opts->sched >= rt->nsched))
    return UMS_EINVAL;

  ums__sched_t *s = opts->sched == UMS_ANY_SCHED ? least_loaded(rt)
                                                 : &rt->scheds[opts->sched];
  /* A task placed on the spawner's own scheduler ends on this thread. */
  bool own = ums__sched_current() == s;
  return spawn_on(rt, s, own, fn, step, arg, opts->detached != 0,
                  opts->name, out);
}

/* ---------------------------------------------------------------------- */
/* Finishing, joining, detaching                                           */
/* ---------------------------------------------------------------------- */

/* The rest of ums__task_finish when somebody besides the task is
** involved: a joiner to wake, or a reference other than the task's own (a
** handle not detached, a queued cancel). Called with t->lock held and
** t->done set; releases the lock. Out of line, so that the usual end (a
** detached task nobody else holds) needs no stack frame of its size. */
static __attribute__((noinline)) void finish_shared(ums__task_t *t,
                                                    ums__sched_t *s) {
  ums__wake_t wk;
  bool wake = ums__wq_grant_first(&t->joiners, 0, &wk) != NULL;
  ums__unlock(&t->lock);
  if (wake) ums__wake(&wk);
  ntasks_own_add(s, -1);
  live_sub(s->rt, s, t->live_own);
  ums__task_unref(s->rt, t);
}

void ums__task_finish(ums__task_t *t) {
  ums__sched_t *s = t->sched;
  t->state = UMS__T_DONE;
  ums__wait_timer_stop(s, t);
  ums__lock(&t->lock);
  t->done = true;
  if (!ums_list_empty(&t->joiners.list) ||
      atomic_load_explicit(&t->refs, memory_order_acquire) != 1) {
    finish_shared(t, s);
    return;
  }
  /* Only the task's own reference left and nobody waiting (a detached
  ** task nobody is cancelling, the usual end of a binding's task): retire
  ** it in this critical section rather than in ums__task_unref's, which
  ** would take the lock again. References are only ever added under the
  ** lock, and with one left nobody else holds one to drop. */
  atomic_store_explicit(&t->refs, 0, memory_order_relaxed);
  atomic_store_explicit(&t->id, 0, memory_order_release);
  ums__unlock(&t->lock);
  ntasks_own_add(s, -1);
  live_sub(s->rt, s, t->live_own);
  task_free(s->rt, t);
}

static int task_join_impl(ums_runtime_t *rt, ums_task_t id, int64_t deadline,
                  void **result, int *status) {
  ums__task_t *t = ums__task_lookup(rt, id);
  if (!t) return UMS_ESRCH;
  if (t == ums__task_current()) return UMS_EDEADLK;
  ums__lock(&t->lock);
  if (ums__task_id_locked(t) != id ||
      t->detached) {
    ums__unlock(&t->lock);
    return UMS_ESRCH;
  }
  if (!t->done) {
    if (t->joining) {
      ums__unlock(&t->lock);
      return UMS_EBUSY;
    }
    ums__waiter_t w;
    int r = ums__waiter_init(&w, &t->joiners, &t->lock);
    if (r) {
      ums__unlock(&t->lock);
      return r;
    }
    t->joining = true;
    w.type = UMS_WAIT_JOIN;
    w.obj = t;
    w.blocker = id;
    ums__wq_push(&t->joiners, &w);
    r = ums__wait(&w, deadline);
    /* Our handle reference keeps t from being recycled meanwhile. */
    ums__lock(&t->lock);
    t->joining = false;
    if (r) {
      ums__unlock(&t->lock);
      return r;
    }
  }
  if (result) *result = t->result;
  if (status) *status = t->status;
  t->detached = true;
  ums__unlock(&t->lock);
  ums__task_unref(rt, t);
  return 0;
}

static int task_detach_impl(ums_runtime_t *rt, ums_task_t id) {
  ums__task_t *t = ums__task_lookup(rt, id);
  if (!t) return UMS_ESRCH;
  ums__lock(&t->lock);
  if (ums__task_id_locked(t) != id ||
      t->detached) {
    ums__unlock(&t->lock);
    return UMS_ESRCH;
  }
  if (t->joining) {
    ums__unlock(&t->lock);
    return UMS_EBUSY;
  }
  t->detached = true;
  ums__unlock(&t->lock);
  ums__task_unref(rt, t);
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Cancellation                                                            */
/* ---------------------------------------------------------------------- */

/* Cancels task id, or with brk asks for the end of its wait that
** cancellation cannot end (ums__task_break) without cancelling it. Both
** are delivered by the task's scheduler, through its cancel list. */
static int task_cancel_impl(ums_runtime_t *rt, ums_task_t id, bool brk) {
  ums__task_t *t = ums__task_lookup(rt, id);
  if (!t) return UMS_ESRCH;
  ums__lock(&t->lock);
  if (ums__task_id_locked(t) != id) {
    ums__unlock(&t->lock);
    return UMS_ESRCH;
  }
  if (t->done) {
    /* A finished task whose handle was given up (joined or detached) is
    ** gone as far as the caller can tell, even if its slot has not been
    ** recycled yet; one still joinable is harmless to cancel. */
    bool gone = t->detached;
    ums__unlock(&t->lock);
    return gone ? UMS_ESRCH : 0;
  }
  if (brk)
    atomic_store(&t->break_wait, 1);
  else
    atomic_store(&t->cancelled, 1);
  bool queue = !atomic_exchange(&t->cancel_queued, 1);
  if (queue) atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
  ums__unlock(&t->lock);
  if (!queue) return 0;

  ums__sched_t *s = t->sched;
  if (ums__sched_current() == s) {
    ums__task_deliver_cancel(t);
    atomic_store(&t->cancel_queued, 0);
    ums__task_unref(rt, t);
  } else {
    ums__sched_post_cancel(s, t);
  }
  return 0;
}

void ums__task_deliver_cancel(ums__task_t *t) {
  ums__sched_t *s = t->sched;
  /* A break is for the wait the task is in now, if it is one that
  ** cancellation cannot end; never for a later one. */
  bool brk = atomic_exchange(&t->break_wait, 0);
  bool cancelled = atomic_load(&t->cancelled);
  switch (t->state) {
    case UMS__T_PARKED:
      if (t->wait && !t->wait->nocancel && cancelled)
        ums__waiter_abort(t->wait, UMS_ECANCELED);
      else if (t->wait && t->wait->nocancel && brk)
        ums__waiter_abort(t->wait, UMS_EDEADLK);
      break;
    case UMS__T_PENDING:
      if (!cancelled) break;
      /* It never got a worker: it ends without running. */
      ums__sched_cancel_pending(s, t);
      break;
    default:
      /* Runnable, running or not started: it sees the flag at its next
      ** wait point (or before it starts). */
      break;
  }
}

/* ---------------------------------------------------------------------- */
/* Entry points: bracketed for shutdown (see ums__rt_enter)                */
/* ---------------------------------------------------------------------- */

int ums_task_spawn(ums_runtime_t *rt, const ums_spawn_opts_t *opts,
                   ums_task_fn fn, void *arg, ums_task_t *out) {
  if (!rt) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  int r = fn ? task_spawn_impl(rt, opts, fn, NULL, arg, out) : UMS_EINVAL;
  ums__rt_leave_ext(rt, ext);
  return r;
}

int ums_task_spawn_step(ums_runtime_t *rt, const ums_spawn_opts_t *opts,
                        ums_step_fn step, void *arg, ums_task_t *out) {
  if (!rt) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  int r = step ? task_spawn_impl(rt, opts, NULL, step, arg, out) : UMS_EINVAL;
  ums__rt_leave_ext(rt, ext);
  return r;
}

int ums_task_spawn_step_here(ums_runtime_t *rt, int sched, ums_step_fn step,
                             void *arg, ums_task_t *out) {
  ums__sched_t *s = ums__sched_current();
  if (UMS__UNLIKELY(!s || s->rt != rt || s->id != sched || !step)) {
    ums_spawn_opts_t opts = {sched, 1, NULL};
    return ums_task_spawn_step(rt, &opts, step, arg, out);
  }
  /* On one of rt's scheduler threads, inside rt: no shutdown bracket
  ** (ums__rt_enter_ext takes none there either). */
  return spawn_on(rt, s, true, NULL, step, arg, true, NULL, out);
}

int ums_step_error(void) {
  ums__task_t *t = ums__task_current();
  return t ? t->start_err : 0;
}

void ums_step_set_result(void *result, int status) {
  ums__task_t *t = ums__task_current();
  if (!t) return;
  t->result = result;
  t->status = status;
}

int ums_task_join(ums_runtime_t *rt, ums_task_t id, int64_t deadline,
                  void **result, int *status) {
  if (!rt) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  int r = task_join_impl(rt, id, deadline, result, status);
  ums__rt_leave_ext(rt, ext);
  return r;
}

int ums_task_detach(ums_runtime_t *rt, ums_task_t id) {
  if (!rt) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  int r = task_detach_impl(rt, id);
  ums__rt_leave_ext(rt, ext);
  return r;
}

int ums_task_cancel(ums_runtime_t *rt, ums_task_t id) {
  if (!rt) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  int r = task_cancel_impl(rt, id, false);
  ums__rt_leave_ext(rt, ext);
  return r;
}

int ums__task_break(ums_runtime_t *rt, ums_task_t id) {
  return task_cancel_impl(rt, id, true);
}

/* ---------------------------------------------------------------------- */
/* The current task                                                        */
/* ---------------------------------------------------------------------- */

ums_task_t ums_self(void) {
  ums__task_t *t = ums__task_current();
  return t ? atomic_load_explicit(&t->id, memory_order_relaxed) : 0;
}

ums_runtime_t *ums_current_runtime(void) {
  ums__sched_t *s = ums__sched_current();
  return s ? s->rt : NULL;
}

int ums_current_sched(void) {
  ums__sched_t *s = ums__sched_current();
  return s ? s->id : -1;
}

int ums_cancelled(void) {
  ums__task_t *t = ums__task_current();
  return t && atomic_load_explicit(&t->cancelled, memory_order_relaxed);
}

int ums_yield(void) {
  ums__sched_t *s = ums__sched_current();
  ums__task_t *t = s ? s->cur_task : NULL;
  if (!t) {
    sched_yield();
    return 0;
  }
  if (atomic_load_explicit(&t->cancelled, memory_order_relaxed))
    return UMS_ECANCELED;
  if (t->park_pending) return UMS_EBUSY;  /* its unpark would queue it too */
  if (UMS__UNLIKELY(t->start_err)) return t->start_err;
  UMS__COUNT(s, yields);
  t->state = UMS__T_RUNNABLE;
  ums__obs_yield(t);
  ums__sched_push_runnable(s, t);
  ums__sched_schedule(s);
  return 0;
}

int ums_sleep_until(int64_t deadline) {
  ums__task_t *t = ums__task_current();
  if (!t) {
    if (deadline == UMS_FOREVER) return UMS_EINVAL;
    struct timespec ts = {deadline / UMS_NSEC_PER_SEC,
                          deadline % UMS_NSEC_PER_SEC};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
           EINTR) {
    }
    return 0;
  }
  ums__waiter_t w;
  int r = ums__waiter_init(&w, NULL, NULL);
  if (r) return r;
  w.type = UMS_WAIT_SLEEP;
  r = ums__wait(&w, deadline);
  return r == UMS_ETIMEDOUT ? 0 : r;
}

int ums_sleep(int64_t ns) {
  /* No time is a yield: the back of the run queue, where a wait whose
  ** timer is due at once would end too (timer.c), without the wait. */
  if (ns <= 0) return ums_yield();
  return ums_sleep_until(ums_deadline(ns));
}

void ums_exit(void *result, int status) {
  ums__task_t *t = ums__task_current();
  if (!t || !t->worker || t->step) abort();  /* only C tasks unwind */
  t->result = result;
  t->status = status;
  siglongjmp(t->worker->exit_jb, 1);
}
