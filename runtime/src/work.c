/*
** work.c: work items (ums-binding.h), work that has not started yet and
** may start on any scheduler. Each scheduler keeps its items in two FIFOs
** (ums__sched_t.work_named and work_free) under its work_lock; its pass
** starts its own oldest item when nothing else is runnable, or once that
** item has been passed over for UMS_WORK_STARVE_NS (ums__work_starving),
** and otherwise steals from the others (steal below). Starting an item
** calls its start on the scheduler that took it; the binding's work
** becomes a task there and never moves again. SQL Server never moves a
** connection, so two heavy ones on one scheduler leave another CPU idle;
** here what has not started moves to where a CPU is free.
**
** The steal grace. An item queued for a scheduler by name is left to
** that scheduler for a while: the usual reason it has not started such an
** item yet is that it is about to (the task that queued it is on its way
** to its next wait, or the scheduler was asleep or spinning and is on its
** way: queueing woke it; on a loaded machine its thread may wait a
** scheduler tick or more for a CPU). A thief that took the item meanwhile
** would move the work away from what its caller chose. So another
** scheduler steals it only once its owner has shown it is busy with
** something else:
**   - never in the first UMS_WORK_GRACE_NS after it was queued (Go's
**     runqsteal waits for a running P's runnext the same way), nor while
**     its scheduler sleeps in its idle wait (it is waking up for it);
**   - once the owner has picked another task since a thief first looked;
**   - or once it has been queued for UMS_WORK_STUCK_NS while its owner
**     picked nothing: one long computation that never yields.
** An item the placement put somewhere (UMS_ANY_SCHED) has no grace: any
** scheduler will do for it, and a free thief is the quickest. A thief
** that finds nothing it may steal yet, but some it may later, sleeps in
** its idle wait until then (s->work_look); an item queued meanwhile wakes
** it (ums__work_ready is part of the idle wait's handshake).
**
** Who is woken. Queueing an item wakes its scheduler if it sleeps, and,
** when that scheduler is not asleep (busy running tasks, or the caller's
** own), one sleeping scheduler more that takes work, which steals it if
** the owner stays busy. A scheduler's idle wait ends while its own queue
** holds items, a placed item waits anywhere, or an item was queued since
** it last looked at the queues (rt->work_seq against s->work_seen:
** ums__work_ready), so no steal is missed by a scheduler that was on its
** way to sleep (spinning, say) when the item was queued: the waker pushes
** and counts and then looks at idle_state; the sleeper stores idle_state
** and then looks at the counts (all sequentially consistent).
**
** Exactly one start per item. An item belongs to whoever unlinks it from
** its queue under the queue's lock: a scheduler that takes it (and calls
** start), ums_work_cancel (start is never called), a refusal that moves it
** (and queues it again), or the shutdown's end (ums__work_end, which calls
** start with UMS_WORK_ENDED). One work_lock at a time is held, never two.
** w->home is read without the lock by ums_work_cancel only to know which
** lock to take, and checked again under it.
*/
#include "internal.h"

#include <stdlib.h>

#define GRACE_NS UMS_WORK_GRACE_NS
#define STUCK_NS UMS_WORK_STUCK_NS
#define STARVE_NS UMS_WORK_STARVE_NS

#define WORK_OF(l) UMS_LIST_ENTRY(l, ums_work_t, link)

/* Counts w in (d = 1) or out of (d = -1) the queues of s, and keeps s's
** UMS__ATTN_WORK with whether its own queue holds any. [s->work_lock] */
static void q_count(ums__sched_t *s, const ums_work_t *w, int d) {
  uint32_t n = atomic_fetch_add(&s->nwork, (uint32_t)d) + (uint32_t)d;
  if (d > 0 && n == 1)
    atomic_fetch_or(&s->attn, UMS__ATTN_WORK);
  else if (d < 0 && n == 0)
    atomic_fetch_and(&s->attn, ~UMS__ATTN_WORK);
  atomic_fetch_add(&s->rt->nwork, (uint32_t)d);
  if (!w->named) {
    atomic_fetch_add(&s->nwork_free, (uint32_t)d);
    atomic_fetch_add(&s->rt->nwork_free, (uint32_t)d);
  }
}

/* Puts w at the end of its queue on s. [s->work_lock] */
static void q_push(ums__sched_t *s, ums_work_t *w) {
  ums_list_push_back(w->named ? &s->work_named : &s->work_free, &w->link);
  __atomic_store_n(&w->home, s->id, __ATOMIC_RELAXED);
  w->queued = true;
  q_count(s, w, 1);
}

/* Takes w off its queue on s. [s->work_lock] */
static void q_unlink(ums__sched_t *s, ums_work_t *w) {
  ums_list_remove(w->named ? &s->work_named : &s->work_free, &w->link);
  w->queued = false;
  q_count(s, w, -1);
}

/* s's oldest item, of either queue, or NULL. [s->work_lock] */
static ums_work_t *q_oldest(ums__sched_t *s) {
  ums_work_t *a = WORK_OF(s->work_named.head);
  ums_work_t *b = WORK_OF(s->work_free.head);
  if (!a) return b;
  if (!b) return a;
  return b->queued_at < a->queued_at ? b : a;
}

/* Where the placement puts an item: the fewest tasks plus queued items
** among the schedulers that take work, here winning ties. -1 when every
** scheduler has refused. */
static int place_item(ums_runtime_t *rt, int here) {
  int64_t extra[rt->nsched];
  for (int i = 0; i < rt->nsched; i++) {
    ums__sched_t *x = &rt->scheds[i];
    extra[i] = atomic_load_explicit(&x->work_refused, memory_order_relaxed)
                   ? UMS_PLACE_SKIP
                   : atomic_load_explicit(&x->nwork, memory_order_relaxed);
  }
  return ums_runtime_place(rt, here, extra);
}

/* After w was queued on t: wakes t if it sleeps, and one sleeping
** scheduler that takes work if t is not asleep (see the top). */
static void wake_for(ums_runtime_t *rt, ums__sched_t *t) {
  ums__sched_t *cur = ums__sched_current();
  if (t != cur && atomic_load(&t->idle_state) != 0) {
    ums__sched_wake(t);
    return;
  }
  for (int i = 0; i < rt->nsched; i++) {
    ums__sched_t *x = &rt->scheds[i];
    if (x == t || x == cur ||
        atomic_load_explicit(&x->work_refused, memory_order_relaxed))
      continue;
    if (atomic_load(&x->idle_state) == 1) {
      ums__sched_wake(x);
      return;
    }
  }
}

/* Queues w: for scheduler sched, or placed (sched < 0), here winning
** ties. When every scheduler has refused, w's start is called with
** UMS_WORK_REFUSED instead. */
static void enqueue(ums_runtime_t *rt, ums_work_t *w, int sched, int here) {
  bool named = sched >= 0;
  for (;;) {
    int target = sched;
    if (named && atomic_load(&rt->scheds[sched].work_refused)) named = false;
    if (!named) target = place_item(rt, here);
    if (target < 0) {
      w->queued = false;
      w->start(w, UMS_WORK_REFUSED);
      return;
    }
    ums__sched_t *t = &rt->scheds[target];
    w->named = named;
    w->looked = false;
    w->queued_at = ums__clock_real();
    ums__lock(&t->work_lock);
    /* Checked again under the lock the refusal takes to empty the
    ** queue: no item enters a queue that was emptied for good. */
    if (atomic_load_explicit(&t->work_refused, memory_order_relaxed)) {
      ums__unlock(&t->work_lock);
      named = false;
      continue;
    }
    q_push(t, w);
    ums__unlock(&t->work_lock);
    atomic_fetch_add(&rt->work_seq, 1);
    wake_for(rt, t);
    return;
  }
}

int ums_work_queue(ums_runtime_t *rt, ums_work_t *w, int sched) {
  if (!rt || !w || !w->start || sched < UMS_ANY_SCHED || sched >= rt->nsched)
    return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  int rc = UMS_ESHUTDOWN;
  if (!atomic_load(&rt->stopping)) {
    ums__sched_t *here = ums__sched_current();
    enqueue(rt, w, sched, here && here->rt == rt ? here->id : -1);
    rc = 0;
  }
  ums__rt_leave_ext(rt, ext);
  return rc;
}

bool ums_work_cancel(ums_runtime_t *rt, ums_work_t *w) {
  if (!rt || !w) return false;
  bool ext = ums__rt_enter_ext(rt);
  bool took = false;
  for (;;) {
    int h = __atomic_load_n(&w->home, __ATOMIC_RELAXED);
    if (h < 0 || h >= rt->nsched) break;
    ums__sched_t *s = &rt->scheds[h];
    ums__lock(&s->work_lock);
    bool here = w->queued && __atomic_load_n(&w->home, __ATOMIC_RELAXED) == h;
    bool moved = w->queued && !here;
    if (here) {
      q_unlink(s, w);
      took = true;
    }
    ums__unlock(&s->work_lock);
    if (!moved) break;
  }
  ums__rt_leave_ext(rt, ext);
  return took;
}

/* Whether a thief may steal w, the oldest named item of o's queue, now
** (the rules at the top); if not, lowers *look to when it may look
** again. [o->work_lock] */
static bool may_steal(ums__sched_t *o, ums_work_t *w, int64_t now,
                      int64_t *look) {
  uint64_t picks = atomic_load_explicit(&o->counters.context_switches,
                                        memory_order_relaxed);
  if (!w->looked) {
    w->looked = true;
    w->picks = picks;
  }
  int64_t again = w->queued_at + GRACE_NS;
  if (now >= again) {
    if (atomic_load_explicit(&o->is_idle, memory_order_relaxed))
      again = now + GRACE_NS;
    else if (picks != w->picks || now >= w->queued_at + STUCK_NS)
      return true;
    else
      again = w->queued_at + STUCK_NS;
  }
  if (again < *look) *look = again;
  return false;
}

/* An item of another scheduler's queue for s: the oldest placed item of
** the longest queue of placed items, else the oldest named item, whose
** grace is over, of the longest queue of named items. NULL when there is
** none; then s->work_look is when one may be. [owner] */
static ums_work_t *steal(ums__sched_t *s) {
  ums_runtime_t *rt = s->rt;
  while (atomic_load_explicit(&rt->nwork_free, memory_order_relaxed)) {
    ums__sched_t *best = NULL;
    uint32_t best_n = 0;
    for (int i = 0; i < rt->nsched; i++) {
      ums__sched_t *o = &rt->scheds[i];
      uint32_t n = atomic_load_explicit(&o->nwork_free, memory_order_relaxed);
      if (o != s && n > best_n) {
        best = o;
        best_n = n;
      }
    }
    if (!best) break;
    ums__lock(&best->work_lock);
    ums_work_t *w = WORK_OF(best->work_free.head);
    if (w) q_unlink(best, w);
    ums__unlock(&best->work_lock);
    if (w) return w;
  }
  int64_t now = ums__clock_real();
  for (;;) {
    int64_t look = UMS_FOREVER;
    ums__sched_t *best = NULL;
    uint32_t best_n = 0;
    for (int i = 0; i < rt->nsched; i++) {
      ums__sched_t *o = &rt->scheds[i];
      if (o == s) continue;
      uint32_t n = atomic_load_explicit(&o->nwork, memory_order_relaxed) -
                   atomic_load_explicit(&o->nwork_free, memory_order_relaxed);
      if (n == 0 || n > UINT32_MAX / 2 || n <= best_n) continue;
      ums__lock(&o->work_lock);
      ums_work_t *w = WORK_OF(o->work_named.head);
      bool ok = w && may_steal(o, w, now, &look);
      ums__unlock(&o->work_lock);
      if (ok) {
        best = o;
        best_n = n;
      }
    }
    if (!best) {
      s->work_look = look;
      return NULL;
    }
    ums__lock(&best->work_lock);
    ums_work_t *w = WORK_OF(best->work_named.head);
    bool ok = w && may_steal(best, w, now, &look);
    if (ok) q_unlink(best, w);
    ums__unlock(&best->work_lock);
    if (ok) return w;
    /* Taken or cancelled meanwhile: look again. */
  }
}

/* Scheduler s cannot take work (w's start said so): it never gets an item
** again; its queue, and w, go to the schedulers that take work. [owner] */
static void refuse(ums__sched_t *s, ums_work_t *w) {
  ums_runtime_t *rt = s->rt;
  ums_list_t moved = {NULL, NULL};
  ums__lock(&s->work_lock);
  atomic_store(&s->work_refused, 1);
  for (ums_work_t *x; (x = q_oldest(s)) != NULL;) {
    q_unlink(s, x);
    ums_list_push_back(&moved, &x->link);
  }
  ums__unlock(&s->work_lock);
  enqueue(rt, w, UMS_ANY_SCHED, -1);
  for (ums_link_t *l; (l = ums_list_pop_front(&moved)) != NULL;)
    enqueue(rt, WORK_OF(l), UMS_ANY_SCHED, -1);
}

/* Calls w's start on s, in no task. [owner] */
static void start(ums__sched_t *s, ums_work_t *w) {
  ums__task_t *prev = s->cur_task;
  s->cur_task = NULL;
  int r = w->start(w, s->id);
  s->cur_task = prev;
  if (r == UMS_WORK_REFUSE) refuse(s, w);
}

bool ums__work_starving(ums__sched_t *s) {
  if (atomic_load_explicit(&s->work_refused, memory_order_relaxed)) return false;
  int64_t now = ums__clock_real();
  if (s->work_starve_at == 0) {
    s->work_starve_at = now + STARVE_NS;
    return false;
  }
  return now >= s->work_starve_at;
}

bool ums__work_take(ums__sched_t *s, bool starving) {
  ums_runtime_t *rt = s->rt;
  s->work_look = UMS_FOREVER;
  /* Before any queue is read: an item queued from now on is news. */
  if (!starving) s->work_seen = atomic_load(&rt->work_seq);
  if (atomic_load_explicit(&s->work_refused, memory_order_relaxed) ||
      atomic_load(&rt->stopping))
    return false;
  ums_work_t *w = NULL;
  if (atomic_load_explicit(&s->nwork, memory_order_relaxed)) {
    ums__lock(&s->work_lock);
    if ((w = q_oldest(s)) != NULL) q_unlink(s, w);
    ums__unlock(&s->work_lock);
  }
  if (!w && !starving && rt->nsched > 1) w = steal(s);
  if (!w) return false;
  s->work_starve_at = 0;
  start(s, w);
  return true;
}

void ums__work_end(ums_runtime_t *rt) {
  for (int i = 0; i < rt->nsched; i++) {
    ums__sched_t *s = &rt->scheds[i];
    for (;;) {
      ums__lock(&s->work_lock);
      ums_work_t *w = q_oldest(s);
      if (w) q_unlink(s, w);
      ums__unlock(&s->work_lock);
      if (!w) break;
      w->start(w, UMS_WORK_ENDED);
    }
  }
}
