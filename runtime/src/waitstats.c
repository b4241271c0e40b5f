/*
** waitstats.c: what tasks wait for, and wait statistics (SQL Server's
** sys.dm_os_waiting_tasks and sys.dm_os_wait_stats).
**
** A wait has three moments: the task parks (ums__wait_begin), something
** makes it runnable (ums__wait_ready, on whichever thread woke it), and
** its scheduler picks it (ums__obs_pick). The wait lasts from the first
** to the third; the signal wait, from the second to the third, is the
** time the task was ready but its scheduler busy. Their fast paths are
** inline, in internal.h; this file has the slow paths and the readers.
**
** What a task waits for lives in its own record (t->obs, wait_obj,
** wait_blocker, the stamps), where any thread can read it under the
** task's lock (stats.c), never in the waiter, which may be on a stack.
**
** Cost is the point of the design: stats are meant to stay on. Only waits
** that park are timed (a yield is counted by the scheduler, never timed),
** every figure is written by the scheduler that owns it with relaxed
** stores (readers add the schedulers up; nothing is locked), and no
** clock is read on the switch: waits are timed on the wait clock
** (rt->wait_clock), a word of stamp-clock time that the monitor thread
** moves forward every millisecond while a scheduler is busy, and that a
** scheduler leaving its idle wait moves forward itself (the monitor may
** have slept meanwhile). Reading the time stamp counter on every park
** would be a sizeable share of a channel message between two C tasks
** (bench/RESULTS.md, "Observability's cost"); loading the word costs one
** load of a line that changes once a millisecond.
** Its resolution is the tick: a wait that starts and ends within one
** tick counts 0, one that spans a tick boundary counts the time between
** ticks, so a wait of length d is counted, on average over where the
** ticks fall, as d (the way the kernel's tick accounting charges CPU
** time); a long wait is right to a tick, plus how late the monitor thread
** was scheduled on a crowded machine. UMS_STATS_PRECISE reads the stamp
** clock instead (ums__stamp_sched). On the wait clock each of the three
** moments loads the word, which is cheaper than carrying a reading
** along; on the stamp clock (precise) readings are reused along the path
** a switch takes:
**   - the park's stamp is kept in s->now_hint and stands for "now" when
**     the pass that follows picks the next task, which is microseconds
**     later at most (the idle wait drops it);
**   - that pick's stamp is kept in s->seg_start, the start of the picked
**     task's turn, and stands for the ready time of every task it wakes
**     on its own scheduler (overstating their signal wait by at most the
**     part of the turn before the wake);
**   - a wake from another thread reads the clock, since it hands the task
**     over through the completion list anyway.
** A ping-pong through a channel thus reads the stamp clock once per
** message.
*/
#include "internal.h"

#define LOADR(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define STORER(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)

static const char *const wait_names[UMS_WAIT_NTYPES] = {
    [UMS_WAIT_NONE] = "none",
    [UMS_WAIT_PARK] = "park",
    [UMS_WAIT_SLEEP] = "sleep",
    [UMS_WAIT_MUTEX] = "mutex",
    [UMS_WAIT_SEMAPHORE] = "semaphore",
    [UMS_WAIT_EVENT] = "event",
    [UMS_WAIT_COND] = "cond",
    [UMS_WAIT_CHAN_SEND] = "channel_send",
    [UMS_WAIT_CHAN_RECV] = "channel_recv",
    [UMS_WAIT_SELECT] = "select",
    [UMS_WAIT_JOIN] = "join",
    [UMS_WAIT_WAITGROUP] = "waitgroup",
    [UMS_WAIT_FILE_IO] = "file_io",
    [UMS_WAIT_PREEMPT] = "preemptive",
    [UMS_WAIT_PENDING_WORKER] = "pending_worker",
    [UMS_WAIT_NET] = "network",
};

const char *ums_wait_type_name(int type) {
  return type >= 0 && type < UMS_WAIT_NTYPES ? wait_names[type] : NULL;
}

/* ---------------------------------------------------------------------- */
/* The three moments (their fast paths are inline, in internal.h)         */
/* ---------------------------------------------------------------------- */

void ums__wait_begin_pending(ums__sched_t *s, ums__task_t *t) {
  STORER(t->wait_obj, NULL);
  STORER(t->wait_blocker, 0);
  STORER(t->obs, UMS__OBS(UMS_TASK_PENDING, UMS_WAIT_PENDING_WORKER));
  if (s->timing) {
    STORER(t->wait_since, ums__stamp_sched(s));
    STORER(t->ready_at, 0);
  }
}

int64_t ums__wait_ready_stamp(ums__sched_t *s) {
  /* In the pass (seg_start < 0: a timer, a cancel or an I/O completion
  ** woke the task) or in a turn whose start was not stamped (0). A reading
  ** taken here serves the rest of that pass (as the pick's "now" too), or
  ** of that turn. */
  int64_t now = s->now_hint;
  if (!now) now = ums__stamp_sched(s);
  if (s->seg_start < 0)
    s->now_hint = now;
  else
    s->seg_start = now;
  return now;
}

void ums__wait_clock_advance(ums_runtime_t *rt, int64_t now) {
  int64_t cur = atomic_load_explicit(&rt->wait_clock.ns, memory_order_relaxed);
  while (now > cur &&
         !atomic_compare_exchange_weak_explicit(&rt->wait_clock.ns, &cur, now,
                                                memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

/* ---------------------------------------------------------------------- */
/* Readers                                                                 */
/* ---------------------------------------------------------------------- */

/* A reset cannot zero what owners write without a lock (an owner's next
** write would restore the old total), so it records the totals as a
** baseline that readers subtract. Only the maximum is zeroed in place: an
** owner that read the old maximum just before may then miss a wait that
** ended during the reset, which a reset in the middle of running waits
** cannot avoid anyway. */

int ums_runtime_waits(ums_runtime_t *rt, ums_wait_stats_t *rows, int n) {
  if (!rt || n < 0 || (n && !rows)) return UMS_EINVAL;
  if (n > UMS_WAIT_NTYPES) n = UMS_WAIT_NTYPES;
  for (int i = 0; i < n; i++)
    rows[i] = (ums_wait_stats_t){.type = i, .name = wait_names[i]};
  bool ext = ums__rt_enter_ext(rt);
  pthread_mutex_lock(&rt->waits_lock);
  for (int k = 0; k < rt->nsched; k++) {
    ums__sched_t *s = &rt->scheds[k];
    for (int i = 1; i < n; i++) {
      ums__waitstat_t *w = &s->waits[i], *b = &s->waits_base[i];
      rows[i].count += LOADR(w->count) - LOADR(b->count);
      rows[i].total_ns += LOADR(w->total_ns) - LOADR(b->total_ns);
      rows[i].signal_ns += LOADR(w->signal_ns) - LOADR(b->signal_ns);
      int64_t max = LOADR(w->max_ns);
      if (max > rows[i].max_ns) rows[i].max_ns = max;
    }
  }
  /* See ums__obs_pick: the figures are not clamped on the switch. */
  for (int i = 1; i < n; i++) {
    if (rows[i].total_ns < 0) rows[i].total_ns = 0;
    if (rows[i].signal_ns > rows[i].total_ns)
      rows[i].signal_ns = rows[i].total_ns;
    if (rows[i].signal_ns < 0) rows[i].signal_ns = 0;
  }
  pthread_mutex_unlock(&rt->waits_lock);
  ums__rt_leave_ext(rt, ext);
  return UMS_WAIT_NTYPES;
}

int ums_runtime_waits_reset(ums_runtime_t *rt) {
  if (!rt) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  pthread_mutex_lock(&rt->waits_lock);
  for (int k = 0; k < rt->nsched; k++) {
    ums__sched_t *s = &rt->scheds[k];
    for (int i = 1; i < UMS_WAIT_NTYPES; i++) {
      ums__waitstat_t *w = &s->waits[i], *b = &s->waits_base[i];
      STORER(b->count, LOADR(w->count));
      STORER(b->total_ns, LOADR(w->total_ns));
      STORER(b->signal_ns, LOADR(w->signal_ns));
      STORER(w->max_ns, 0);
    }
  }
  pthread_mutex_unlock(&rt->waits_lock);
  ums__rt_leave_ext(rt, ext);
  return 0;
}

void ums_quantum_expired(void) {
  ums__sched_t *s = ums__sched_current();
  if (s && s->cur_task) UMS__COUNT(s, quantum_expiries);
}
