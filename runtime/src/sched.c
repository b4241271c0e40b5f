/*
** sched.c: schedulers, the scheduler pass and the runtime's life cycle.
**
** There is no scheduler thread to wake: whichever context runs out of
** work (a task that parks or yields, a worker whose task ended) runs the
** pass itself and switches straight to the next task (a worker performs
** the scheduler's work itself, as in UMS; docs/design/architecture.md).
** The scheduler thread's own context only starts the first task and, at
** exit, tears down. A runtime made with run_on_caller has no scheduler
** thread: the caller's context plays that part inside ums_runtime_run,
** and the pass returns to it when asked to pause (a flag every pass
** looks at, set by ums_runtime_pause or at the caller's deadline).
**
** The pass, in order: deliver cancellations; submit and reap I/O (the
** ring's part: io-uring.c); expire timers; drain the completion list; pick
** the next runnable task; if none, the idle wait, which is a futex wait on
** idle_state or, with a ring, io_uring_enter (so that an I/O completion
** ends it too).
*/
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Thread_local ums__sched_t *ums__tls_sched UMS__TLS_IE;

#define DEFAULT_STACK_SIZE (256 * 1024)
#define DEFAULT_IDLE_TIMEOUT (10 * UMS_NSEC_PER_SEC)
#define DEFAULT_IDLE_KEPT 16
#define DEFAULT_IO_POOL_THREADS 64
/* Threads of the C-call pool beyond one per CPU start only for calls
** queued behind blocked ones and end when idle, so a high bound costs
** nothing until calls block; it is high so that tasks whose blocked calls
** wait for each other's (a reader and its writer) get a thread each, as
** Go allows 10,000 threads for blocked calls. */
#define DEFAULT_PREEMPT_THREADS 10000
#define DEFAULT_STALL_THRESHOLD UMS_NSEC_PER_SEC
/* How long an idle pool thread, and a scheduler with preemptive calls in
** flight, spin before they sleep. A futex wake-up costs tens of
** microseconds round trip on a small VM, a spinning handoff a small
** fraction of that; spinning about as long as the sleep would cost bounds
** the waste to 2x of the optimum (the classic competitive-spinning
** argument).
** bench/bench_preempt.c measures both settings. */
#define PREEMPT_POOL_SPIN_NS (50 * UMS_NSEC_PER_USEC)
#define SCHED_SPIN_NS UMS__SCHED_SPIN_NS
/* With a virtual clock, how long the idle wait sleeps at most while file
** I/O or a preemptive call is in flight. The pool thread that completes
** one posts the task first and lowers the in-flight count after, so the
** wake-up for the post can come before the count drops; a bounded sleep
** notices the drop without a wake-up of its own. Only while something is
** in flight: a virtual runtime with nothing in flight sleeps without a
** deadline (or moves its clock). */
#define VCLOCK_INFLIGHT_POLL_NS (1 * UMS_NSEC_PER_MSEC)

static inline void set_relaxed_int(_Atomic int *a, int v) {
  atomic_store_explicit(a, v, memory_order_relaxed);
}

static inline void set_relaxed(_Atomic uint32_t *a, uint32_t v) {
  atomic_store_explicit(a, v, memory_order_relaxed);
}

/* ---------------------------------------------------------------------- */
/* Queues                                                                  */
/* ---------------------------------------------------------------------- */

void ums__sched_push_runnable(ums__sched_t *s, ums__task_t *t) {
  t->next = NULL;
  if (s->runq_tail)
    s->runq_tail->next = t;
  else
    s->runq_head = t;
  s->runq_tail = t;
  set_relaxed(&s->nrunnable, ++s->runq_n);
}

static void urgent_push(ums__sched_t *s, ums__task_t *t) {
  t->next = NULL;
  if (s->urgent_tail)
    s->urgent_tail->next = t;
  else
    s->urgent_head = t;
  s->urgent_tail = t;
  set_relaxed(&s->nrunnable, ++s->runq_n);
}

static ums__task_t *runq_pop(ums__sched_t *s) {
  ums__task_t *t = s->urgent_head;
  if (t && (s->urgent_streak < UMS__URGENT_STREAK || !s->runq_head)) {
    s->urgent_head = t->next;
    if (!s->urgent_head) s->urgent_tail = NULL;
    s->urgent_streak++;
  } else if ((t = s->runq_head) != NULL) {
    s->runq_head = t->next;
    if (!s->runq_head) s->runq_tail = NULL;
    s->urgent_streak = 0;
  } else {
    return NULL;
  }
  set_relaxed(&s->nrunnable, --s->runq_n);
  return t;
}

static void pending_push(ums__sched_t *s, ums__task_t *t) {
  ums_list_push_back(&s->pending, &t->pend);
  set_relaxed(&s->npending,
              atomic_load_explicit(&s->npending, memory_order_relaxed) + 1);
}

/* Takes t off the pending list, wherever it is on it. */
static void pending_unlink(ums__sched_t *s, ums__task_t *t) {
  ums_list_remove(&s->pending, &t->pend);
  set_relaxed(&s->npending,
              atomic_load_explicit(&s->npending, memory_order_relaxed) - 1);
}

static ums__task_t *pending_pop(ums__sched_t *s) {
  ums_link_t *l = ums_list_pop_front(&s->pending);
  if (!l) return NULL;
  set_relaxed(&s->npending,
              atomic_load_explicit(&s->npending, memory_order_relaxed) - 1);
  return UMS_CONTAINER_OF(l, ums__task_t, pend);
}

void ums__sched_start_now(ums__sched_t *s, ums__task_t *t) {
  /* The end of its wait for a worker, if it had one. */
  if (t->state == UMS__T_PENDING) ums__wait_ready(t);
  set_relaxed(&s->nactive,
              atomic_load_explicit(&s->nactive, memory_order_relaxed) + 1);
  t->state = UMS__T_RUNNABLE;
  ums__sched_push_runnable(s, t);
}

void ums__sched_admit(ums__sched_t *s, ums__task_t *t) {
  /* A cancel that arrived before the task did ends it here: it must not
  ** queue for a worker it will never use. (A step task is stepped once
  ** all the same, so its binding can let go of it.) */
  if (atomic_load(&t->cancelled) && !t->step) {
    t->status = UMS_ECANCELED;
    ums__task_finish(t);
    return;
  }
  /* One timer per task at most: reserving here keeps waits from
  ** allocating. If even that fails, the task ends before it starts: a C
  ** task here, a step task at its pick (fail_task), where its binding is
  ** told, rather than inside the spawn that admitted it. */
  if (s->nlocal + 1 > s->timers.cap &&
      ums__timer_heap_reserve(&s->timers, s->nlocal + 1) != 0) {
    if (!t->step) {
      t->status = UMS_ENOMEM;
      ums__task_finish(t);
      return;
    }
    t->start_err = UMS_ENOMEM;
  }
  s->nlocal++;
  UMS__COUNT(s, tasks_spawned);
  int max = s->rt->cfg.max_workers;
  /* A task that cannot run needs no worker: it ends at its pick. */
  if (max > 0 && !atomic_load(&t->cancelled) && !t->start_err &&
      atomic_load_explicit(&s->nactive, memory_order_relaxed) >= (uint32_t)max) {
    t->state = UMS__T_PENDING;
    ums__wait_begin_pending(s, t);
    pending_push(s, t);
    return;
  }
  ums__sched_start_now(s, t);
}

void ums__sched_cancel_pending(ums__sched_t *s, ums__task_t *t) {
  pending_unlink(s, t);
  if (t->step) {
    /* Stepped once, past max_workers, so its binding can let go. */
    ums__sched_start_now(s, t);
    return;
  }
  s->nlocal--;
  t->status = UMS_ECANCELED;
  ums__task_finish(t);
}

void ums__sched_task_ended(ums__sched_t *s) {
  s->nlocal--;
  set_relaxed(&s->nactive,
              atomic_load_explicit(&s->nactive, memory_order_relaxed) - 1);
  int max = s->rt->cfg.max_workers;
  if (!ums_list_empty(&s->pending) &&
      (max <= 0 ||
       atomic_load_explicit(&s->nactive, memory_order_relaxed) < (uint32_t)max))
    ums__sched_start_now(s, pending_pop(s));
}

/* ---------------------------------------------------------------------- */
/* The completion list and wake-ups                                        */
/* ---------------------------------------------------------------------- */

void ums__sched_wake(ums__sched_t *s) {
  /* Pairs with idle_wait: it stores idle_state = 1 and then looks at the
  ** lists; we pushed to a list and then look at idle_state. Both sides
  ** are sequentially consistent, so at least one sees the other. Only the
  ** one waker that moves 1 -> 2 pays for the system call. */
  uint32_t idle = 1;
  if (atomic_load(&s->idle_state) == 1 &&
      atomic_compare_exchange_strong(&s->idle_state, &idle, 2)) {
    if (s->ring)
      ums__ring_wake(s);
    else if (atomic_load_explicit(&s->poller, memory_order_acquire))
      ums__poller_wake(s);
    else
      ums__futex_wake(&s->idle_state, 1);
  }
}

void ums__sched_inflight_done(ums__sched_t *s, _Atomic uint32_t *count) {
  /* Sequentially consistent, as are block's store of idle_state and its
  ** loads of the counts (stuck_now): either it sees the count at zero,
  ** or we see it idle and wake it. */
  if (atomic_fetch_sub(count, 1) == 1) ums__sched_wake(s);
}

/* Once t is on the list it may run, end, and let a shutdown on another
** thread proceed; the in-flight count keeps s alive until the wake-up is
** done. (Taken before the push, while t still holds the runtime open.) */
void ums__sched_post(ums__sched_t *s, ums__task_t *t) {
  ums_runtime_t *rt = s->rt;
  ums__rt_enter(rt);
  ums__task_t *head = atomic_load_explicit(&s->inbox, memory_order_relaxed);
  do {
    t->inbox_next = head;
  } while (!atomic_compare_exchange_weak(&s->inbox, &head, t));
  ums__sched_wake(s);
  ums__rt_leave(rt);
}

void ums__sched_post_cancel(ums__sched_t *s, ums__task_t *t) {
  ums_runtime_t *rt = s->rt;
  ums__rt_enter(rt);
  ums__task_t *head = atomic_load_explicit(&s->cancels, memory_order_relaxed);
  do {
    t->cancel_next = head;
  } while (!atomic_compare_exchange_weak(&s->cancels, &head, t));
  ums__sched_wake(s);
  ums__rt_leave(rt);
}

void ums__task_ready(ums__task_t *t) {
  ums__sched_t *s = t->sched;
  ums__wait_ready(t);
  if (ums__sched_current() == s) {
    t->state = UMS__T_RUNNABLE;
    if (s->expiring)
      urgent_push(s, t);
    else
      ums__sched_push_runnable(s, t);
  } else {
    ums__sched_post(s, t);
  }
}

/* The lists are LIFO stacks; reversing keeps arrival order. */
static ums__task_t *reverse(ums__task_t *t, size_t link_off) {
  ums__task_t *prev = NULL;
  while (t) {
    ums__task_t **link = (ums__task_t **)((char *)t + link_off);
    ums__task_t *next = *link;
    *link = prev;
    prev = t;
    t = next;
  }
  return prev;
}

static void drain_cancels(ums__sched_t *s) {
  ums__task_t *t = atomic_exchange(&s->cancels, NULL);
  t = reverse(t, offsetof(ums__task_t, cancel_next));
  while (t) {
    ums__task_t *next = t->cancel_next;
    ums__task_deliver_cancel(t);
    atomic_store(&t->cancel_queued, 0);
    ums__task_unref(s->rt, t);
    t = next;
  }
}

static void drain_inbox(ums__sched_t *s) {
  ums__task_t *t = atomic_exchange(&s->inbox, NULL);
  t = reverse(t, offsetof(ums__task_t, inbox_next));
  while (t) {
    ums__task_t *next = t->inbox_next;
    if (t->state == UMS__T_NEW) {
      ums__sched_admit(s, t);
    } else {
      t->state = UMS__T_RUNNABLE;
      ums__sched_push_runnable(s, t);
    }
    t = next;
  }
}

/* ---------------------------------------------------------------------- */
/* The pass                                                                */
/* ---------------------------------------------------------------------- */

static int64_t idle_timeout(const ums__sched_t *s) {
  return s->rt->cfg.worker_idle_timeout;
}

/* Advances the trim epoch when due and frees workers that stayed idle for
** a whole epoch. Runs only on the way into the idle wait, where the clock
** is read anyway. */
static void maybe_trim(ums__sched_t *s, int64_t now) {
  if (idle_timeout(s) < 0) return;
  if (now < s->next_trim) return;
  s->trim_epoch++;
  s->next_trim = now + idle_timeout(s);
  /* The free worker running this idle wait is one of the idle workers
  ** kept (stats count it as idle too). */
  int keep = s->rt->cfg.idle_workers_kept;
  if (s->cur && !s->cur->task && keep > 0) keep--;
  ums__worker_trim(s, s->trim_epoch - 1, keep);
}

/* Work of this scheduler's tasks is on a pool thread (a preemptive call
** or file I/O on the I/O pool): its completion comes through the inbox,
** worth spinning for. Ring I/O is not: its wait is io_uring_enter. */
static bool pool_work_pending(ums__sched_t *s) {
  return atomic_load_explicit(&s->preempt_pending, memory_order_relaxed) ||
         atomic_load_explicit(&s->io_pool_pending, memory_order_relaxed);
}

/* Before the idle wait of a scheduler whose tasks have work on a pool
** thread (preemptive calls, file I/O on the I/O pool): the pool thread
** that finishes one posts its task to the completion list, and catching
** that by spinning costs far less than the futex wake-up it would need
** once we sleep. Returns true when something arrived. idle_state stays 0 meanwhile, so posters make no system call.
** now and deadline are real time (ums__clock_real). */
static bool spin_for_completion(ums__sched_t *s, int64_t now,
                                int64_t deadline) {
  if (!pool_work_pending(s) ||
      !ums__spin_worth(&s->spin, SCHED_SPIN_NS))
    return false;
  int64_t until = now + SCHED_SPIN_NS;
  if (until > deadline) until = deadline;
  for (unsigned i = 1;; i++) {
    if (ums__sched_posted(s)) {
      ums__spin_note(&s->spin, ums__clock_real() - now, true, SCHED_SPIN_NS);
      return true;
    }
    ums__cpu_relax();
    if ((i & 63) == 0) {
      if (ums__clock_real() >= until || !pool_work_pending(s)) {
        ums__spin_note(&s->spin, 0, false, SCHED_SPIN_NS);
        return false;
      }
      /* On a crowded machine the pool thread we wait for may be waiting
      ** for this very CPU. */
      if ((i & 255) == 0) sched_yield();
    }
  }
}

/* File I/O or a preemptive call of this scheduler's tasks has not
** completed yet. Acquire loads: both counters drop after their task was
** posted, so a zero here means that post is visible in the inbox. */
static bool work_in_flight(ums__sched_t *s) {
  return atomic_load_explicit(&s->io_pending, memory_order_acquire) ||
         atomic_load_explicit(&s->preempt_pending, memory_order_acquire);
}

static bool wake_pending(ums__sched_t *s) {
  return atomic_load(&s->inbox) || atomic_load(&s->calls_done) ||
         atomic_load(&s->cancels) || atomic_load(&s->rt->exiting) ||
         ums__work_ready(s);
}

/* ---------------------------------------------------------------------- */
/* Deadlocks (ums.h, "Deadlocks")                                          */
/* ---------------------------------------------------------------------- */

/* Whether nothing of s's own can end its idle wait: no timer, no I/O or
** preemptive call in flight, no idle waiter to wake. Then only another
** scheduler's task, or a thread outside the runtime, can. [owner] */
static bool stuck_now(ums__sched_t *s) {
  /* Sequentially consistent loads of the counts, after the store of
  ** idle_state: see ums__sched_inflight_done. */
  return s->rt->cfg.on_deadlock && s->timers.n == 0 &&
         s->work_look == UMS_FOREVER &&
         s->nidle_waiters == 0 && !atomic_load(&s->io_pending) &&
         !atomic_load(&s->preempt_pending) &&
         !atomic_load(&s->io_pool_pending) &&
         !atomic_load(&s->rt->exiting);
}

/* Calls fn(rt, id) for every task the runtime holds (ums_task_cancel,
** ums__task_break: each checks the id again under the task's lock). */
static void for_each_task(ums_runtime_t *rt,
                          int (*fn)(ums_runtime_t *, ums_task_t)) {
  uint32_t n = atomic_load(&rt->nslots);
  for (uint32_t slot = 0; slot < n; slot++) {
    ums__task_t *chunk = atomic_load(&rt->chunks[slot / UMS__TASK_CHUNK]);
    uint64_t id = atomic_load(&chunk[slot % UMS__TASK_CHUNK].id);
    if (id) fn(rt, id);
  }
}

/* The handler has seen this state and nothing has run since: what is
** still parked is in waits that its cancels could not end. Those begun
** with UMS_PARK_NOCANCEL (the mutex taken back at the end of a
** condition wait) would never end at all: they end with UMS_EDEADLK.
** Every live task is asked; each scheduler delivers the break to its own
** tasks with the cancels, and a task in any other wait ignores it. */
static void break_nocancel_waits(ums_runtime_t *rt) {
  for_each_task(rt, ums__task_break);
}

/* Called by a scheduler that has just gone stuck, with idle_state = 1
** and no wake-up pending: if every scheduler is stuck too, nothing
** inside the runtime can wake a task any more. The wakers the runtime
** knows are its schedulers' tasks (a task that posts a wake-up does so
** before its scheduler goes stuck, so the post is seen below), pool
** threads (they post before the in-flight counts drop, so a zero count
** is read first, then the lists) and timers (none armed on a stuck
** scheduler). Two readings of every stuck_seq that agree mean that no
** scheduler ran a task between them: the lists read in between were
** the state, not a moment of a change. Returns true when it acted
** (called the handler, or broke waits): the caller then looks at its
** lists again instead of sleeping. */
static bool deadlock_check(ums__sched_t *self) {
  ums_runtime_t *rt = self->rt;
  uint64_t sum = 0, again = 0;
  for (int i = 0; i < rt->nsched; i++) {
    ums__sched_t *x = &rt->scheds[i];
    if (!atomic_load(&x->stuck)) return false;
    sum += atomic_load(&x->stuck_seq);
  }
  for (int i = 0; i < rt->nsched; i++) {
    ums__sched_t *x = &rt->scheds[i];
    if (work_in_flight(x) || atomic_load(&x->io_pool_pending) ||
        wake_pending(x))
      return false;
  }
  for (int i = 0; i < rt->nsched; i++) {
    ums__sched_t *x = &rt->scheds[i];
    if (!atomic_load(&x->stuck)) return false;
    again += atomic_load(&x->stuck_seq);
  }
  /* Each stuck_seq only grows: equal sums mean equal counts. */
  if (again != sum || atomic_load(&rt->live) == 0) return false;
  uint64_t prev = atomic_load(&rt->deadlock_state);
  if (prev == sum) {
    uint64_t broken = atomic_load(&rt->deadlock_broken);
    if (broken == sum ||
        !atomic_compare_exchange_strong(&rt->deadlock_broken, &broken, sum))
      return false;
    /* Not stuck from here: what the break or the handler delivers on the
    ** spot is runnable here, and another scheduler must not count this
    ** one as stuck while it runs that (it would report a state that is
    ** already gone). */
    atomic_store(&self->stuck, 0);
    break_nocancel_waits(rt);
    return true;
  }
  if (!atomic_compare_exchange_strong(&rt->deadlock_state, &prev, sum))
    return false;
  atomic_store(&self->stuck, 0);
  rt->cfg.on_deadlock(rt, self->id, rt->cfg.on_deadlock_arg);
  return true;
}

static bool go_stuck(ums__sched_t *s) {
  uint64_t picks = atomic_load_explicit(&s->counters.context_switches,
                                        memory_order_relaxed);
  if (picks != s->stuck_picks) {
    s->stuck_picks = picks;
    atomic_store(&s->stuck_seq, atomic_load_explicit(
                     &s->stuck_seq, memory_order_relaxed) + 1);
  }
  atomic_store(&s->stuck, 1);
  return deadlock_check(s);
}

/* Sleeps until a wake-up, an I/O completion or the real-time deadline.
** now is a real clock reading (the ring takes its timeout relative). */
static void block(ums__sched_t *s, int64_t deadline, int64_t now) {
  /* A stamp from before the idle wait cannot stand for "now" after it. */
  s->now_hint = 0;
  atomic_store(&s->idle_state, 1);
  if (wake_pending(s)) {
    atomic_store(&s->idle_state, 0);
    ums__monitor_busy(s->rt);
    return;
  }
  UMS__COUNT(s, idle_waits);
  atomic_store_explicit(&s->is_idle, 1, memory_order_relaxed);
  /* After idle_state = 1: what on_deadlock posts here wakes us. What the
  ** handler (or a break) did on this thread posts nothing: a cancel
  ** delivered on the spot, or one that changed nothing, which the next
  ** pass finds stuck again and then breaks. So after it acted, no wait:
  ** the pass looks again. */
  bool stuck = stuck_now(s);
  bool acted = stuck && go_stuck(s);
  if (!acted) {
    if (s->ring)
      ums__ring_wait(s, deadline, now);
    else if (ums__poller_of(s))
      ums__poller_wait(s, deadline, now);
    else
      ums__futex_wait(&s->idle_state, 1, deadline);
  }
  if (stuck) atomic_store(&s->stuck, 0);
  atomic_store_explicit(&s->is_idle, 0, memory_order_relaxed);
  atomic_store(&s->idle_state, 0);
  /* The monitor may have slept through the wait (every scheduler idle):
  ** the wait clock stopped with it, and what this pass stamps must not
  ** predate the wait. */
  if (s->rt->wait_clock_ticks) ums__wait_clock_advance(s->rt, ums__stamp_now());
  ums__monitor_busy(s->rt);
}

/* The real time at which the caller of a scheduler it runs
** (ums_runtime_run) wants it back, UMS_FOREVER for any other; once that
** has passed (now, real time), asks the pass to return to it. */
static int64_t run_until(ums__sched_t *s, int64_t now) {
  int64_t until = atomic_load_explicit(&s->run_deadline,
                                       memory_order_relaxed);
  if (UMS__UNLIKELY(until <= now)) atomic_fetch_or(&s->attn, UMS__ATTN_PAUSE);
  return until;
}

/* The idle wait of a runtime with a virtual clock: time moves only here,
** and only when nothing can happen without it. */
static void idle_wait_virtual(ums__sched_t *s) {
  maybe_trim(s, ums__clock_now());
  int64_t now = ums__clock_real();
  int64_t until = run_until(s, now);
  if (until <= now) return;
  if (work_in_flight(s)) {
    if (spin_for_completion(s, now, until)) return;
    now = ums__clock_real();
    int64_t poll = now + VCLOCK_INFLIGHT_POLL_NS;
    block(s, poll < until ? poll : until, now);
    return;
  }
  int64_t next = ums__timer_next(&s->timers);
  if (next == UMS_FOREVER) {
    /* Nothing will happen by itself: only another thread can wake a
    ** task now. No deadline (but the caller's), so no CPU meanwhile. */
    block(s, until, now);
    return;
  }
  /* A wake-up posted since the pass drained the lists goes first. */
  if (wake_pending(s)) return;
  ums__clock_advance(s->rt, next);
}

/* The first moments of that spin, before any clock reading (a reading
** costs many pauses, and a round trip takes two): most preemptive calls
** complete within a few microseconds. Only with no timer armed, so
** nothing can be due. Returns true when something arrived. */
#define QUICK_SPINS 128
static bool spin_quick(ums__sched_t *s) {
  if (s->timers.n || !pool_work_pending(s) ||
      !ums__spin_worth(&s->spin, SCHED_SPIN_NS))
    return false;
  for (unsigned i = 0; i < QUICK_SPINS; i++) {
    if (ums__sched_posted(s)) {
      /* A hit well under the limit, whatever it took exactly. */
      ums__spin_note(&s->spin, 0, true, SCHED_SPIN_NS);
      return true;
    }
    ums__cpu_relax();
  }
  return false;
}

/* Whether another scheduler of s's runtime is running tasks: neither in
** its idle wait nor spinning itself. Only such a peer posts work here
** soon; an idle runtime has none, so it never spins. Relaxed: a wrong
** answer costs one spin or one sleep, never a lost wake-up (the poster
** still wakes a scheduler that went to sleep). */
static bool peer_busy(const ums__sched_t *s) {
  const ums_runtime_t *rt = s->rt;
  for (int i = 0; i < rt->nsched; i++) {
    ums__sched_t *x = &rt->scheds[i];
    if (x == s) continue;
    /* A peer that is about to run (woken, or spinning with a post
    ** waiting) counts as busy. */
    if (ums__sched_posted(x) ||
        (!atomic_load_explicit(&x->is_idle, memory_order_relaxed)
             ? !atomic_load_explicit(&x->spinning, memory_order_relaxed)
             : atomic_load_explicit(&x->idle_state, memory_order_relaxed) ==
                   2))
      return true;
  }
  return false;
}

/* Before the idle wait, while another scheduler runs tasks: what those
** tasks hand to this scheduler's tasks (a message, an unpark, a join)
** comes through the inbox, and catching it by spinning saves the futex or
** ring wake-up on both sides (idle_state stays 0, so the poster makes no
** system call either). Bounded as Go bounds its spinning threads: a short
** while, at most two spinners (one for every four schedulers past
** eight), and only while the spins pay (the gauge: on a host that steals
** the CPU, or with peers that post rarely, the spins miss and it sleeps
** at once). An idle runtime has no busy peer, so it never spins. A
** scheduler with I/O in flight does not spin: the ring's completions
** reach it only in its kernel wait. Returns true when something arrived.
** deadline is real time. */
static bool spin_for_peers(ums__sched_t *s, int64_t deadline) {
  ums_runtime_t *rt = s->rt;
  if (rt->nsched < 2 ||
      atomic_load_explicit(&s->io_pending, memory_order_relaxed) ||
      !peer_busy(s) ||
      !ums__spin_worth(&s->peer_spin, UMS__SCHED_PEER_SPIN_NS))
    return false;
  uint32_t most = rt->nsched > 8 ? (uint32_t)rt->nsched / 4 : 2;
  uint32_t n = atomic_load_explicit(&rt->nspinning, memory_order_relaxed);
  do {
    if (n >= most) return false;
  } while (!atomic_compare_exchange_weak(&rt->nspinning, &n, n + 1));
  set_relaxed_int(&s->spinning, 1);
  int64_t start = ums__clock_real();
  int64_t until = start + UMS__SCHED_PEER_SPIN_NS;
  if (until > deadline) until = deadline;
  bool hit = false;
  for (unsigned i = 1;; i++) {
    if (ums__sched_posted(s)) {
      hit = true;
      break;
    }
    ums__cpu_relax();
    if ((i & 63) == 0) {
      if (ums__clock_real() >= until || !peer_busy(s)) break;
      /* On a crowded machine the peer we wait for may be waiting for
      ** this very CPU. */
      if ((i & 255) == 0) sched_yield();
    }
  }
  set_relaxed_int(&s->spinning, 0);
  UMS__COUNT(s, peer_spins);
  if (hit) UMS__COUNT(s, peer_spin_hits);
  atomic_fetch_sub(&rt->nspinning, 1);
  /* The gauge keeps the success ratio, not the time a hit took: a hit
  ** however late saves two system calls and a sleeping thread's wake-up,
  ** so spinning pays while few spins miss. */
  ums__spin_note(&s->peer_spin, 0, hit, UMS__SCHED_PEER_SPIN_NS);
  return hit;
}

static void idle_wait(ums__sched_t *s) {
  if (s->rt->vclock) {
    idle_wait_virtual(s);
    return;
  }
  if (spin_quick(s)) return;
  ums_runtime_t *rt = s->rt;
  int64_t now = ums__clock_now();
  maybe_trim(s, now);
  int64_t until = run_until(s, now);
  if (until <= now) return;
  int64_t deadline = ums__timer_next(&s->timers);
  if (until < deadline) deadline = until;
  /* Real time, as ums__clock_now is without a virtual clock. */
  if (s->work_look < deadline) deadline = s->work_look;
  if (idle_timeout(s) >= 0 &&
      s->nidle + (s->cur && !s->cur->task) >
          (uint32_t)rt->cfg.idle_workers_kept &&
      s->next_trim < deadline)
    deadline = s->next_trim;
  if (deadline <= now) return;
  if (spin_for_completion(s, now, deadline)) return;
  if (spin_for_peers(s, deadline)) return;
  now = ums__clock_now();
  block(s, deadline, now);
}

/* ---------------------------------------------------------------------- */
/* Idle waiters (ums_wait_idle)                                            */
/* ---------------------------------------------------------------------- */

/* Whether the park of tok has not ended yet. */
static bool token_live(ums_runtime_t *rt, ums_park_token_t tok) {
  ums__task_t *t = ums__task_lookup(rt, tok.task);
  if (!t) return false;
  ums__lock(&t->lock);
  bool live = ums__park_is(t, tok);
  ums__unlock(&t->lock);
  return live;
}

int ums_park_begin_idle(int64_t deadline, ums_park_token_t *token) {
  ums__task_t *t = ums__task_current();
  if (!t) return UMS_EPERM;
  ums__sched_t *s = t->sched;
  if (s->nidle_waiters == s->cap_idle_waiters) {
    /* Parks that ended without the scheduler going idle (timeouts,
    ** cancels) leave stale tokens; drop them before growing, so the
    ** array stays as large as the live waiters at most. */
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->nidle_waiters; i++)
      if (token_live(s->rt, s->idle_waiters[i]))
        s->idle_waiters[n++] = s->idle_waiters[i];
    s->nidle_waiters = n;
  }
  if (s->nidle_waiters == s->cap_idle_waiters) {
    uint32_t cap = s->cap_idle_waiters ? 2 * s->cap_idle_waiters : 8;
    ums_park_token_t *w = realloc(s->idle_waiters, cap * sizeof *w);
    if (!w) return UMS_ENOMEM;
    s->idle_waiters = w;
    s->cap_idle_waiters = cap;
  }
  ums_park_token_t tok;
  int r = ums_park_begin(deadline, &tok);
  if (r) return r;
  s->idle_waiters[s->nidle_waiters++] = tok;
  if (token) *token = tok;
  return 0;
}

int ums_wait_idle(int64_t deadline) {
  int r = ums_park_begin_idle(deadline, NULL);
  return r ? r : ums_park_wait();
}

/* Called when nothing is runnable: if nothing is in flight either, ends
** every idle waiter's park. Returns true when that made a task runnable. */
static bool wake_idle_waiters(ums__sched_t *s) {
  if (work_in_flight(s) || wake_pending(s)) return false;
  bool woke = false;
  uint32_t n = s->nidle_waiters;
  s->nidle_waiters = 0;
  for (uint32_t i = 0; i < n; i++)
    if (ums_unpark(s->rt, s->idle_waiters[i], 0) == 0) woke = true;
  return woke;
}

/* Housekeeping plus the pick; NULL only when the runtime is exiting and
** this scheduler has no task left. */
static ums__task_t *next_runnable(ums__sched_t *s) {
  s->seg_start = -1; /* the turn has ended: in the pass (waitstats.c) */
  for (;;) {
    /* Only a scheduler run by its caller is ever asked to pause
    ** (ums_runtime_run); checked first, so that tasks that keep yielding
    ** cannot hold the caller past its deadline. */
    uint32_t attn = atomic_load_explicit(&s->attn, memory_order_relaxed);
    if (UMS__UNLIKELY(attn & (UMS__ATTN_DEADLINE | UMS__ATTN_PAUSE))) {
      if (attn & UMS__ATTN_DEADLINE) run_until(s, ums__clock_real());
      if ((atomic_load_explicit(&s->attn, memory_order_relaxed) &
           UMS__ATTN_PAUSE) &&
          (atomic_fetch_and(&s->attn, ~UMS__ATTN_PAUSE) & UMS__ATTN_PAUSE))
        return NULL;
    }
    if (atomic_load_explicit(&s->cancels, memory_order_relaxed))
      drain_cancels(s);
    if (s->ring) ums__ring_poll(s);
    if (ums__poller_of(s)) ums__poller_poll(s);
    /* The clock is read only when some timer could be due. */
    if (s->timers.n) ums__timer_expire(s, &s->timers, ums__clock_now());
    set_relaxed(&s->ntimers, s->timers.n);
    if (atomic_load_explicit(&s->calls_done, memory_order_relaxed))
      ums__preempt_reap(s);
    if (atomic_load_explicit(&s->inbox, memory_order_relaxed))
      drain_inbox(s);
    ums__task_t *t = runq_pop(s);
    if (t) {
      /* Work items of its own wait while tasks keep it busy: the oldest
      ** starts anyway once passed over long enough (work.c). */
      if (UMS__UNLIKELY(attn & UMS__ATTN_WORK) && ums__work_starving(s))
        ums__work_take(s, true);
      return t;
    }
    if (atomic_load(&s->rt->exiting) && s->nlocal == 0) return NULL;
    if (s->nidle_waiters && wake_idle_waiters(s)) continue;
    /* Nothing runnable: start a work item, its own or another's. */
    if (atomic_load_explicit(&s->rt->nwork, memory_order_relaxed)) {
      if (ums__work_take(s, false)) continue;
    } else {
      s->work_look = UMS_FOREVER;
    }
    idle_wait(s);
  }
}

/* Ends t, which cannot run for lack of memory (err: no worker, stack or
** timer could be had for it), so that whoever joins it sees err. A step
** task, started or not, is stepped once more all the same, on the stack
** of this pass, with ums_step_error() returning err, so that its binding
** learns of the end and lets go of what it holds for the task; every
** wait fails with err meanwhile, so nothing binds this stack (another
** task's, or the thread's own) to it. */
static void fail_task(ums__sched_t *s, ums__task_t *t, int err) {
  t->start_err = err;
  /* Back from a park that ended, if it was one (ums__task_finish disarms
  ** its timer). */
  t->wait = NULL;
  if (t->step) {
    ums__task_t *prev = s->cur_task;
    s->cur_task = t;
    t->state = UMS__T_RUNNING;
    t->started = true;
    if (t->step(t->arg) != UMS_STEP_DONE)
      ums__step_misuse(t, "did not end at once on ums_step_error()");
    if (t->park_pending)
      ums__step_misuse(t, "returned UMS_STEP_DONE with a park begun");
    s->cur_task = prev;
  }
  t->status = err;
  ums__sched_task_ended(s);
  ums__task_finish(t);
}

static inline void switch_to(ums__sched_t *s, ums__worker_t *self,
                             ums__worker_t *to) {
  s->cur = to;
  UMS__COUNT(s, fiber_switches);
  ums__ctx_switch(self ? &self->ctx : &s->main_ctx, &to->ctx);
}

void ums__sched_schedule(ums__sched_t *s) {
  ums__worker_t *self = s->cur;
  for (;;) {
    ums__task_t *t = next_runnable(s);
    if (t) ums__obs_pick(s, t);
    if (!t) {
      /* Exiting, or pausing for the caller (ums_runtime_run): get back to
      ** the thread's own context. A free worker joins the pool first, so
      ** that teardown frees it or the next pass takes it. A worker bound
      ** to its parked task (only when pausing) stays with it: the pass
      ** that picks the task again resumes it here, as after switch_to. */
      if (self) {
        bool bound = self->task != NULL;
        if (!bound) ums__worker_put(s, self);
        s->cur = NULL;
        ums__ctx_switch(&self->ctx, &s->main_ctx);
        if (bound) return;
      }
      return;
    }
    if (t->worker) {
      /* A started task, parked on its own worker. */
      s->cur_task = t;
      t->state = UMS__T_RUNNING;
      if (t->worker == self) return;
      if (self && !self->task) ums__worker_put(s, self);
      switch_to(s, self, t->worker);
      /* Resumed: our own task was picked again. (A free worker that went
      ** to the pool is restarted from the top, never resumed here.) */
      return;
    }
    if (UMS__UNLIKELY(t->start_err)) {
      fail_task(s, t, t->start_err);
      continue;
    }
    /* A task that has not started, or a step task between two steps: a
    ** free worker takes it on the spot. */
    if (self && !self->task) {
      ums__worker_bind(s, self, t);
      return;
    }
    ums__worker_t *w = ums__worker_get(s);
    if (!w || ums__ctx_make(&w->ctx, w->stack.lo, w->stack.size,
                            ums__worker_main, w) != 0) {
      if (w) ums__worker_put(s, w);
      fail_task(s, t, UMS_ENOMEM);
      continue;
    }
    ums__worker_bind(s, w, t);
    switch_to(s, self, w);
    return;
  }
}

/* ---------------------------------------------------------------------- */
/* Scheduler threads and the runtime                                       */
/* ---------------------------------------------------------------------- */

/* What the scheduler's own thread lets go of once its loop has returned
** for good: every task has ended and every worker is in the pool. What
** the ring still holds was abandoned; it must end before the ring and the
** buffers it references go. [owner] */
static void sched_teardown(ums__sched_t *s) {
  if (s->ring) ums__ring_drain(s);
  ums__io_req_cache_clear(&s->reqs);
  free(s->net_hints);
  s->net_hints = NULL;
  s->net_nhints = 0;
  ums__buf_cache_clear(&s->bufs);
  ums__preempt_cache_clear(s);
  ums__worker_free_all(s);
  ums__ctx_destroy(&s->main_ctx);
}

static void *sched_thread(void *arg) {
  ums__sched_t *s = arg;
  ums__tls_sched = s;
  atomic_store_explicit(&s->tid, gettid(), memory_order_relaxed);
  if (ums__ctx_init_main(&s->main_ctx) != 0) abort();
  s->cur = NULL;
  ums__sched_schedule(s);
  sched_teardown(s);
  ums__tls_sched = NULL;
  return NULL;
}

static int sched_init(ums_runtime_t *rt, ums__sched_t *s, int id) {
  memset(s, 0, sizeof *s);
  s->id = id;
  s->rt = rt;
  s->timing = rt->cfg.stats != UMS_STATS_OFF;
  s->wait_clock = &rt->wait_clock.ns;
  s->stamps = rt->cfg.clock == UMS_CLOCK_VIRTUAL ? UMS__STAMPS_VIRTUAL
              : rt->cfg.stats == UMS_STATS_PRECISE ? UMS__STAMPS_PRECISE
                                                   : UMS__STAMPS_WAIT_CLOCK;
  ums__timer_heap_init(&s->timers);
  s->next_trim = 0;
  atomic_init(&s->run_deadline, UMS_FOREVER);
  s->work_look = UMS_FOREVER;
  int e = ums__preempt_sched_init(s);
  if (e == 0 && (e = ums__stack_pool_init(&s->stacks, rt->cfg.stack_size)))
    ums__preempt_sched_destroy(s);
  return e;
}

static void sched_destroy(ums__sched_t *s) {
  ums__ring_free(s->ring);
  s->ring = NULL;
  ums__poller_free(ums__poller_of(s));
  atomic_store_explicit(&s->poller, NULL, memory_order_relaxed);
  free(s->idle_waiters);
  s->idle_waiters = NULL;
  ums__stack_pool_destroy(&s->stacks);
  ums__timer_heap_destroy(&s->timers);
  ums__preempt_sched_destroy(s);
}

static int cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* Each scheduler's slot record becomes a slot of the C-call pool
** (pool.c, "Slots"; preempt.c). */
/* A pool's work waits at its bound: the runtime's monitor decides
** whether that is an exhaustion (monitor.c), and may be asleep. */
static void pool_waits(void *arg) { ums__monitor_wake(arg); }

static int preempt_slots(ums_runtime_t *rt) {
  ums__pool_work_t **v = malloc((size_t)rt->nsched * sizeof *v);
  if (!v) return UMS_ENOMEM;
  for (int i = 0; i < rt->nsched; i++) v[i] = ums__preempt_slot(&rt->scheds[i]);
  int e = ums__pool_set_slots(&rt->preempt_pool, v, (uint32_t)rt->nsched);
  free(v);
  return e;
}

/* Tasks of a chunk that runtime_free clears for the next runtime, rather
** than giving the chunk back to the kernel. */
#define CHUNK_CLEAR_MAX 64

static void runtime_free(ums_runtime_t *rt) {
  ums__monitor_stop(rt);
  /* Pool work left now was abandoned by tasks that have ended; the pool
  ** waits for it (it references schedulers and buffers) and joins its
  ** threads. */
  if (rt->preempt_pool.cfg.max) ums__pool_destroy(&rt->preempt_pool);
  if (rt->io_pool.cfg.max) ums__pool_destroy(&rt->io_pool);
  /* Calls that returned after their caller had ended and its scheduler
  ** had stopped reaping: the pool's references. */
  for (int i = 0; i < rt->nsched; i++) ums__preempt_reap(&rt->scheds[i]);
  for (int i = 0; i < rt->nsched; i++) sched_destroy(&rt->scheds[i]);
  size_t bytes = sizeof(ums__sched_t) * (size_t)rt->cfg.schedulers;
  memset(rt->scheds, 0, bytes);
  ums__pages_free(rt->scheds, bytes, true);
  /* Chunks are added in order (task.c, grow_table): those past nslots
  ** were never allocated, and a short run has one. Tasks are handed out
  ** in slot order: those below rt->fresh are all a chunk has used, and
  ** a chunk that used few is cleared for the next runtime (pages.c). */
  uint32_t nchunks = atomic_load_explicit(&rt->nslots, memory_order_relaxed) /
                     UMS__TASK_CHUNK;
  for (uint32_t i = 0; i < nchunks; i++) {
    ums__task_t *chunk = atomic_load_explicit(&rt->chunks[i],
                                              memory_order_relaxed);
    uint32_t used = rt->fresh - i * UMS__TASK_CHUNK;
    if (used > UMS__TASK_CHUNK) used = UMS__TASK_CHUNK;
    bool clear = used <= CHUNK_CLEAR_MAX;
    if (clear) memset(chunk, 0, used * sizeof *chunk);
    ums__pages_free(chunk, UMS__TASK_CHUNK * sizeof *chunk, clear);
    atomic_store_explicit(&rt->chunks[i], NULL, memory_order_relaxed);
  }
  pthread_mutex_destroy(&rt->table_lock);
  pthread_mutex_destroy(&rt->waits_lock);
  /* All zero again but the chunk index (cleared above) and the members
  ** around it. */
  memset(rt, 0, offsetof(ums_runtime_t, chunks));
  memset((char *)rt + sizeof rt->chunks + offsetof(ums_runtime_t, chunks), 0,
         sizeof *rt - sizeof rt->chunks - offsetof(ums_runtime_t, chunks));
  ums__pages_free(rt, sizeof *rt, true);
}

/* Stops and joins the first n scheduler threads. */
static void stop_threads(ums_runtime_t *rt, int n) {
  atomic_store(&rt->exiting, 1);
  for (int i = 0; i < n; i++) ums__sched_wake(&rt->scheds[i]);
  for (int i = 0; i < n; i++) {
    if (rt->scheds[i].thread)
      ums__thread_join(rt->scheds[i].thread, rt->cfg.keep_threads);
    rt->scheds[i].thread = NULL;
  }
}

/* Chooses the I/O backend and sets up one ring per scheduler. With AUTO,
** any failure (ENOSYS: no io_uring; EPERM: forbidden by seccomp or
** io_uring_disabled; ENOMEM: locked-memory limits) means the pool. */
static int io_setup(ums_runtime_t *rt) {
  int want = rt->cfg.io_backend;
  if (want == UMS_IO_AUTO) {
    const char *env = getenv("UMS_IO");
    if (env && strcmp(env, "pool") == 0) want = UMS_IO_POOL;
    if (env && strcmp(env, "uring") == 0) want = UMS_IO_URING;
  }
  rt->io_backend = UMS_IO_POOL;
  if (want != UMS_IO_POOL) {
    int e = 0;
    for (int i = 0; i < rt->nsched && !e; i++)
      e = ums__ring_new(&rt->scheds[i], i ? rt->scheds[0].ring : NULL);
    if (!e) {
      rt->io_backend = UMS_IO_URING;
    } else {
      for (int i = 0; i < rt->nsched; i++) {
        ums__ring_free(rt->scheds[i].ring);
        rt->scheds[i].ring = NULL;
      }
      if (want == UMS_IO_URING) return e;
    }
  }
  rt->cfg.io_backend = rt->io_backend;
  return 0;
}

/* ums_runtime_error's words, on the thread that called ums_runtime_new. */
static _Thread_local char start_error[256];

const char *ums_runtime_error(void) { return start_error; }

/* Records why the start fails and returns e. */
static int start_fail(int e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(start_error, sizeof start_error, fmt, ap);
  va_end(ap);
  return e;
}

/* Checks the environment variables the runtime reads (an empty one counts
** as unset): a bad value is refused as a bad setting is, rather than
** ignored. Returns 0 or UMS_EINVAL with the reason recorded. */
static int check_env(void) {
  static const struct {
    const char *name;
    const char *allowed[4];  /* NULL-terminated */
    const char *words;
  } vars[] = {
      {"UMS_IO", {"auto", "uring", "pool", NULL}, "auto, uring or pool"},
      {"UMS_STATS", {"on", "off", "precise", NULL}, "on, off or precise"},
      {"UMS_STACK_GUARD", {"mprotect", NULL}, "mprotect"},
      {"UMS_STAMP_CLOCK", {"gettime", NULL}, "gettime"},
  };
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i].name);
    if (!v || !*v) continue;
    bool ok = false;
    for (int j = 0; vars[i].allowed[j] && !ok; j++)
      ok = strcmp(v, vars[i].allowed[j]) == 0;
    if (!ok)
      return start_fail(UMS_EINVAL, "environment variable %s=%.64s: must "
                        "be %s", vars[i].name, v, vars[i].words);
  }
  return 0;
}

/* Checks a configuration against the bounds in ums.h. Returns 0 or
** UMS_EINVAL with the reason recorded, naming the setting. */
static int check_config(const ums_config_t *c) {
  if (c->schedulers < 0 || c->schedulers > UMS_SCHEDULERS_MAX)
    return start_fail(UMS_EINVAL, "schedulers = %d is out of range (0: one "
                      "per CPU, or 1 to %d)", c->schedulers,
                      UMS_SCHEDULERS_MAX);
  if (c->stack_size != 0 && (c->stack_size < UMS_STACK_SIZE_MIN ||
                             c->stack_size > UMS_STACK_SIZE_MAX))
    return start_fail(UMS_EINVAL, "stack_size = %zu is out of range (0: the "
                      "default, or %zu to %zu)", c->stack_size,
                      UMS_STACK_SIZE_MIN, UMS_STACK_SIZE_MAX);
  static const char *const ints[] = {"max_workers", "idle_workers_kept",
                                     "io_pool_threads", "preempt_threads",
                                     "keep_threads"};
  const int vals[] = {c->max_workers, c->idle_workers_kept,
                      c->io_pool_threads, c->preempt_threads,
                      c->keep_threads};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    if (vals[i] < 0)
      return start_fail(UMS_EINVAL, "%s = %d is negative", ints[i], vals[i]);
  if (c->io_backend < UMS_IO_AUTO || c->io_backend > UMS_IO_POOL)
    return start_fail(UMS_EINVAL, "io_backend = %d is not UMS_IO_AUTO, "
                      "UMS_IO_URING or UMS_IO_POOL", c->io_backend);
  if (c->stats < UMS_STATS_DEFAULT || c->stats > UMS_STATS_PRECISE)
    return start_fail(UMS_EINVAL, "stats = %d is not one of UMS_STATS_*",
                      c->stats);
  if (c->clock != UMS_CLOCK_REAL && c->clock != UMS_CLOCK_VIRTUAL)
    return start_fail(UMS_EINVAL, "clock = %d is not UMS_CLOCK_REAL or "
                      "UMS_CLOCK_VIRTUAL", c->clock);
  if (c->clock == UMS_CLOCK_VIRTUAL && c->schedulers > 1)
    return start_fail(UMS_EINVAL, "clock = UMS_CLOCK_VIRTUAL needs "
                      "schedulers = 1 (got %d)", c->schedulers);
  if (c->run_on_caller && c->schedulers > 1)
    return start_fail(UMS_EINVAL, "run_on_caller needs schedulers = 1 "
                      "(got %d)", c->schedulers);
  return 0;
}

ums_runtime_t *ums_runtime_new(const ums_config_t *cfg, int *err) {
  ums_config_t c = {0};
  int e = 0;
  start_error[0] = '\0';
  if (cfg) c = *cfg;
  if ((e = check_config(&c)) != 0 || (e = check_env()) != 0) goto fail;
  if (c.run_on_caller) c.run_on_caller = 1;
  int ncpu = cpu_count();
  if (c.schedulers == 0)
    c.schedulers = c.clock == UMS_CLOCK_VIRTUAL || c.run_on_caller ? 1 :
                   ncpu;
  if (c.stack_size == 0) c.stack_size = DEFAULT_STACK_SIZE;
  if (c.worker_idle_timeout == 0) c.worker_idle_timeout = DEFAULT_IDLE_TIMEOUT;
  if (c.idle_workers_kept == 0) c.idle_workers_kept = DEFAULT_IDLE_KEPT;
  if (c.io_pool_threads == 0) c.io_pool_threads = DEFAULT_IO_POOL_THREADS;
  if (c.preempt_threads == 0) c.preempt_threads = DEFAULT_PREEMPT_THREADS;
  if (c.stall_threshold == 0) c.stall_threshold = DEFAULT_STALL_THRESHOLD;
  if (c.stats == UMS_STATS_DEFAULT) {
    const char *env = getenv("UMS_STATS");
    c.stats = !env                           ? UMS_STATS_ON
              : strcmp(env, "off") == 0      ? UMS_STATS_OFF
              : strcmp(env, "precise") == 0 ? UMS_STATS_PRECISE
                                             : UMS_STATS_ON;
  }

  /* Aligned as its cache-line members (the wait clock, the pools'
  ** submission lines) say, and zeroed: most of it is the task table's
  ** chunk index, of which a short runtime uses one entry. */
  ums_runtime_t *rt = ums__pages_alloc(sizeof *rt);
  if (!rt) {
    e = start_fail(UMS_ENOMEM, "out of memory");
    goto fail;
  }
  rt->cfg = c;
  rt->vclock = c.clock == UMS_CLOCK_VIRTUAL;
  rt->wait_clock_ticks = c.stats == UMS_STATS_ON && !rt->vclock;
  atomic_init(&rt->wait_clock.ns, ums__stamp_now());
  atomic_init(&rt->vnow, 0);
  pthread_mutex_init(&rt->table_lock, NULL);
  pthread_mutex_init(&rt->waits_lock, NULL);
  /* From pages.c rather than the heap: freed and allocated again per
  ** runtime, a block this size and alignment would split the heap's free
  ** space around the host's own objects that are not freed yet (a Lua
  ** heap that is rarely collected), and every malloc would then walk
  ** more fragments. */
  size_t bytes = sizeof(ums__sched_t) * (size_t)c.schedulers;
  rt->scheds = ums__pages_alloc(bytes);
  if (!rt->scheds) {
    pthread_mutex_destroy(&rt->table_lock);
    pthread_mutex_destroy(&rt->waits_lock);
    ums__pages_free(rt, sizeof *rt, false);
    e = start_fail(UMS_ENOMEM, "out of memory");
    goto fail;
  }
  rt->nsched = c.schedulers;
  for (int i = 0; i < rt->nsched; i++) {
    if ((e = sched_init(rt, &rt->scheds[i], i)) != 0) {
      rt->nsched = i;
      runtime_free(rt);
      start_fail(e, "cannot set up scheduler %d: %s", i, ums_strerror(e));
      goto fail;
    }
  }
  /* Both pools start a thread per CPU at once and more only when those
  ** are blocked in their work (pool.c's monitor: a read from a slow disk
  ** is, a read of cached pages is not), and hand work to a spinning
  ** thread first. A pool grown at once to its bound would spend its
  ** time on the pool's lock and wake-ups: 64 threads reading cached small
  ** files on 2 CPUs mostly wait for each other. */
  ums__pool_cfg_t io_cfg = {.name = "ums-io",
                            .core = (uint32_t)ncpu,
                            .max = (uint32_t)c.io_pool_threads,
                            .idle_timeout = c.worker_idle_timeout,
                            .spin_ns = PREEMPT_POOL_SPIN_NS};
  ums__pool_cfg_t pre_cfg = {.name = "ums-preempt",
                             .core = (uint32_t)ncpu,
                             .max = (uint32_t)c.preempt_threads,
                             .idle_timeout = c.worker_idle_timeout,
                             .spin_ns = PREEMPT_POOL_SPIN_NS,
                             .on_wait = pool_waits,
                             .on_wait_arg = rt};
  io_cfg.on_wait = pool_waits;
  io_cfg.on_wait_arg = rt;
  if ((e = ums__pool_init(&rt->io_pool, &io_cfg)) != 0 ||
      (e = ums__pool_init(&rt->preempt_pool, &pre_cfg)) != 0 ||
      (e = preempt_slots(rt)) != 0) {
    runtime_free(rt);
    start_fail(e, "cannot set up the thread pools: %s", ums_strerror(e));
    goto fail;
  }
  if ((e = io_setup(rt)) != 0) {
    runtime_free(rt);
    start_fail(e, "cannot set up an io_uring ring (io backend \"uring\"): "
               "%s", ums_strerror(e));
    goto fail;
  }
  /* The caller's scheduler starts when it first calls ums_runtime_run. */
  if (c.run_on_caller) {
    rt->caller = pthread_self();
    atomic_store(&rt->scheds[0].away, 1);
    atomic_store_explicit(&rt->scheds[0].tid, gettid(),
                          memory_order_relaxed);
  }
  for (int i = c.run_on_caller ? 1 : 0; i < rt->nsched; i++) {
    ums__sched_t *s = &rt->scheds[i];
    int r = ums__thread_start(&s->thread, sched_thread, s, NULL,
                              "ums-sched");
    if (r != 0) {
      stop_threads(rt, i);
      runtime_free(rt);
      e = start_fail(r, "cannot create the thread of scheduler %d: %s", i,
                     strerror(r == UMS_ENOMEM ? ENOMEM : EAGAIN));
      goto fail;
    }
  }
  /* Only when it has something to do: stall detection, or sampling. A
  ** runtime without the monitor it was asked for would lose stall reports
  ** and CPU times without a word: it does not start. */
  if ((c.stall_threshold >= 0 || c.stats != UMS_STATS_OFF) &&
      (e = ums__monitor_start(rt)) != 0) {
    stop_threads(rt, rt->nsched);
    runtime_free(rt);
    start_fail(e, "cannot create the monitor thread (stall reports, CPU "
               "sampling): %s", ums_strerror(e));
    goto fail;
  }
  if (err) *err = 0;
  return rt;

fail:
  if (!start_error[0]) start_fail(e, "%s", ums_strerror(e));
  if (err) *err = e;
  return NULL;
}

static int wait_live(ums_runtime_t *rt, int64_t deadline) {
  for (;;) {
    uint32_t n = atomic_load(&rt->live);
    if (n == 0) return 0;
    if (ums__futex_wait(&rt->live, n, deadline) == -ETIMEDOUT &&
        atomic_load(&rt->live) != 0)
      return UMS_ETIMEDOUT;
  }
}

/* wait_live for a runtime whose scheduler the caller runs: runs it until
** every task has ended (the last one pauses it: task.c, live_dec) or the
** deadline passes. */
static int run_live(ums_runtime_t *rt, int64_t deadline) {
  while (atomic_load(&rt->live) != 0) {
    if (ums_runtime_run(rt, deadline) == UMS_ETIMEDOUT &&
        atomic_load(&rt->live) != 0)
      return UMS_ETIMEDOUT;
  }
  return 0;
}

/* The caller's scheduler leaves its loop for good, on the caller's
** thread: a last pass takes what was posted to it, then it tears down as
** its thread would have. */
static void caller_exit(ums_runtime_t *rt) {
  ums__sched_t *s = &rt->scheds[0];
  if (!s->main_ready) {
    if (ums__ctx_init_main(&s->main_ctx) != 0) abort();
    s->main_ready = true;
  }
  ums__tls_sched = s;
  s->cur = NULL;
  ums__sched_schedule(s);
  sched_teardown(s);
  ums__tls_sched = NULL;
}

int ums_runtime_run(ums_runtime_t *rt, int64_t deadline) {
  if (!rt || !rt->cfg.run_on_caller) return UMS_EINVAL;
  if (ums__sched_current()) return UMS_EDEADLK;
  if (!pthread_equal(pthread_self(), rt->caller)) return UMS_EPERM;
  ums__sched_t *s = &rt->scheds[0];
  if (!s->main_ready) {
    if (ums__ctx_init_main(&s->main_ctx) != 0) return UMS_ENOMEM;
    s->main_ready = true;
  }
  atomic_store_explicit(&s->run_deadline, deadline, memory_order_relaxed);
  if (deadline != UMS_FOREVER) atomic_fetch_or(&s->attn, UMS__ATTN_DEADLINE);
  atomic_store(&s->away, 0);
  ums__monitor_busy(rt);
  ums__tls_sched = s;
  s->cur = NULL;
  /* Returns when the pass finds the pause asked for (by ums_runtime_pause,
  ** the deadline, or the end of the last task while stopping). */
  ums__sched_schedule(s);
  ums__tls_sched = NULL;
  atomic_store(&s->away, 1);
  atomic_fetch_and(&s->attn, ~UMS__ATTN_DEADLINE);
  atomic_store_explicit(&s->run_deadline, UMS_FOREVER, memory_order_relaxed);
  return deadline != UMS_FOREVER && ums__clock_real() >= deadline ?
         UMS_ETIMEDOUT : 0;
}

void ums_runtime_pause(ums_runtime_t *rt) {
  if (!rt || !rt->cfg.run_on_caller) return;
  ums__sched_t *s = &rt->scheds[0];
  atomic_fetch_or(&s->attn, UMS__ATTN_PAUSE);
  /* From another thread while the caller sits in its idle wait; from the
  ** scheduler itself this finds it busy and makes no system call. */
  ums__sched_wake(s);
}

int ums_runtime_shutdown(ums_runtime_t *rt, int64_t deadline) {
  if (!rt) return UMS_EINVAL;
  ums__sched_t *here = ums__sched_current();
  if (here && here->rt == rt) return UMS_EDEADLK;
  bool caller = rt->cfg.run_on_caller;
  if (caller && !pthread_equal(pthread_self(), rt->caller)) return UMS_EPERM;
  atomic_store(&rt->stopping, 1);
  int ret = caller ? run_live(rt, deadline) : wait_live(rt, deadline);
  if (ret) {
    atomic_store(&rt->cancel_all, 1);
    for_each_task(rt, ums_task_cancel);
    if (caller) run_live(rt, UMS_FOREVER);
    else wait_live(rt, UMS_FOREVER);
  }
  /* No task is left for the monitor to report on: it ends while the
  ** schedulers do, rather than after them. */
  ums__monitor_stop_begin(rt);
  stop_threads(rt, rt->nsched);
  if (caller) caller_exit(rt);
  /* Host threads may still be finishing a call that began while tasks
  ** were alive (a wake-up they posted, a join that just returned). */
  while (atomic_load(&rt->inflight)) sched_yield();
  /* Work items no scheduler took: the runtime stopped first. */
  ums__work_end(rt);
  runtime_free(rt);
  return ret;
}

int ums_runtime_schedulers(const ums_runtime_t *rt) {
  return rt ? rt->nsched : 0;
}

void ums_runtime_config(const ums_runtime_t *rt, ums_config_t *out) {
  if (rt && out) *out = rt->cfg;
}
