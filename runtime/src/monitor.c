/*
** monitor.c: the scheduler monitor, one thread per runtime (SQL Server's
** scheduler monitor, which reports a "non-yielding scheduler", error
** 17883).
**
** Every tick (10 ms, less for a short stall threshold) while some
** scheduler is busy, it looks at each scheduler's count of task switches
** (and of preemptive calls completed by a spin at the call site, which
** save a switch each):
**   - a busy scheduler whose count has not moved for stall_threshold has
**     not passed through its loop: the task it runs is stuck in a
**     blocking call or in code that never yields. It is reported once
**     (ums_config_t.on_stall, else a line on stderr) and counted in the
**     scheduler's stalls; the count moving again ends the stall;
**   - with stats on, the CPU time the scheduler's thread used since the
**     last tick is credited to the task it is running: tasks' CPU time,
**     sampled the way top(1) samples processes, at no cost to the switch
**     itself (a 10 ms tick attributes a tick's CPU to whoever runs at its
**     end; the sum over tasks is the threads' true CPU time).
** A scheduler in its idle wait is never reported and credits nobody.
**
** It also looks at the two thread pools (pool.c, "Exhaustion"): a pool
** whose every possible thread runs a call while the oldest queued call
** has waited stall_threshold is reported once per episode
** (ums_config_t.on_pool_exhausted, else a line on stderr), with the task
** that made that call and what it calls. The tasks waiting for such a
** pool are parked and their schedulers idle, so the monitor keeps ticking
** while a pool has work queued, and a pool's own monitor wakes it when
** work waits at the pool's bound.
**
** Not every scheduler that does not move is stalled by its task: on an
** oversubscribed machine (the 2-vCPU VMs this runs on are often shared)
** the kernel may not run its thread for a while. So before it reports,
** the monitor asks the kernel: a thread blocked in a system call (state S
** or D in /proc/self/task/<tid>/stat) is stalled by its task, and so is
** one that used CPU time without passing through its loop (a task that
** computes without yielding); a runnable thread that got next to no CPU
** is only waiting for one, and is looked at again at the next tick.
**
** Between looks, while stats are on, it moves the wait clock forward
** every millisecond (CLOCK_TICK_NS): the time waits are measured on
** (waitstats.c). A binding may add looks of its own at a period of its
** choosing (ums_runtime_watch: the Lua binding's quantum), made on the
** same schedule: while some scheduler is busy.
**
** When every scheduler is idle the monitor sleeps on a futex instead of
** ticking ("no CPU while idle"), and the first scheduler to leave its
** idle wait wakes it (ums__monitor_busy). That hand-off is the usual
** store-then-load pairing: the scheduler stores idle_state = 0 and then
** loads `asleep`; the monitor stores `asleep` = 1 and then loads every
** idle_state; all four are sequentially consistent, so one of them sees
** the other and the monitor never sleeps through a busy scheduler.
*/
#include "internal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TICK_NS (10 * UMS_NSEC_PER_MSEC)
#define MIN_TICK_NS UMS_NSEC_PER_MSEC
/* The wait clock's tick (waitstats.c): its resolution. */
#define CLOCK_TICK_NS UMS_NSEC_PER_MSEC

/* CPU time a stuck thread must have used since it last moved to count
** as computing rather than starved. A yielding loop passes through the
** scheduler every few microseconds of CPU. */
#define SPIN_CPU_NS (5 * UMS_NSEC_PER_MSEC)

/* What the monitor remembers of one scheduler. [monitor thread] */
struct ums__monitor_slot {
  uint64_t seq;       /* task switches when last seen moving */
  int64_t since;      /* when that was (or when it was last idle) */
  int64_t cpu_since;  /* the thread's CPU time then; -1: unknown */
  int64_t cpu_last;   /* its CPU time at the last tick; -1: unknown */
  bool reported;      /* the stall at seq has been reported */
  bool has_clock;
  clockid_t clock;    /* the thread's CPU-time clock */
  int stat_fd;        /* /proc/self/task/<tid>/stat, opened when needed;
                         -1: not yet or not available */
};

static int64_t thread_cpu(const ums__monitor_slot_t *sl) {
  struct timespec ts;
  if (!sl->has_clock || clock_gettime(sl->clock, &ts) != 0) return -1;
  return (int64_t)ts.tv_sec * UMS_NSEC_PER_SEC + ts.tv_nsec;
}

/* The kernel's state letter for the scheduler's thread ('R', 'S', 'D',
** ...), or 0 when unknown. */
static char thread_state(ums__sched_t *s, ums__monitor_slot_t *sl) {
  if (sl->stat_fd < 0) {
    int tid = atomic_load_explicit(&s->tid, memory_order_relaxed);
    if (!tid) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    if ((sl->stat_fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) return 0;
  }
  char buf[128]; /* "tid (comm) S ...": comm is at most 15 bytes */
  ssize_t n = pread(sl->stat_fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *end = strrchr(buf, ')');
  return end && end[1] == ' ' ? end[2] : 0;
}

/* Whether a scheduler that has not moved since sl->since is stuck in its
** task, rather than waiting for a CPU. When the kernel cannot tell (no
** procfs, no CPU clock), it is taken as stuck. */
static bool stuck(ums__sched_t *s, ums__monitor_slot_t *sl, int64_t cpu) {
  if (cpu >= 0 && sl->cpu_since >= 0 && cpu - sl->cpu_since >= SPIN_CPU_NS)
    return true; /* computing without passing through its loop */
  char st = thread_state(s, sl);
  return st != 'R';
}

/* Copies t's name if t is still the task with that id. */
static bool task_name(ums_runtime_t *rt, uint64_t id, char *out) {
  ums__task_t *t = ums__task_lookup(rt, id);
  out[0] = '\0';
  if (!t) return false;
  ums__lock(&t->lock);
  bool same = ums__task_id_locked(t) == id;
  if (same) memcpy(out, t->name, UMS__TASK_NAME_MAX);
  ums__unlock(&t->lock);
  return same;
}

static void credit(ums_runtime_t *rt, uint64_t id, int64_t ns) {
  ums__task_t *t = ums__task_lookup(rt, id);
  if (!t) return;
  /* Under the lock: a task that ended meanwhile may have been recycled,
  ** and its successor must not inherit the tick. */
  ums__lock(&t->lock);
  if (ums__task_id_locked(t) == id)
    atomic_fetch_add_explicit(&t->cpu_ns, ns, memory_order_relaxed);
  ums__unlock(&t->lock);
}

static void report(ums_runtime_t *rt, ums__sched_t *s, uint64_t running,
                   int64_t stalled) {
  ums__monitor_t *m = &rt->monitor;
  ums_stall_t st = {.sched = s->id, .stalled_ns = stalled};
  if (running && task_name(rt, running, st.name)) st.task = running;
  st.seq = atomic_fetch_add(&m->nstalls, 1) + 1;
  atomic_store_explicit(&s->stalls,
      atomic_load_explicit(&s->stalls, memory_order_relaxed) + 1,
      memory_order_relaxed);
  if (rt->cfg.on_stall) {
    rt->cfg.on_stall(&st, rt->cfg.on_stall_arg);
    return;
  }
  if (st.task)
    fprintf(stderr,
            "ums: scheduler %d has not passed through its loop for %.3f s:"
            " task %llu%s%s%s does not yield (non-yielding scheduler)\n",
            st.sched, (double)st.stalled_ns / 1e9,
            (unsigned long long)st.task, st.name[0] ? " '" : "", st.name,
            st.name[0] ? "'" : "");
  else
    fprintf(stderr,
            "ums: scheduler %d has not passed through its loop for %.3f s"
            " (non-yielding scheduler)\n",
            st.sched, (double)st.stalled_ns / 1e9);
  fflush(stderr);
}

static void report_pool(ums_runtime_t *rt, const char *pool,
                        const ums__pool_exhaust_t *x) {
  ums_pool_exhausted_t ex = {.pool = pool,
                             .threads = x->threads,
                             .active = x->active,
                             .queued = x->queued,
                             .max = x->max,
                             .oldest_wait_ns = x->oldest_wait_ns,
                             .seq = x->episodes};
  memcpy(ex.what, x->oldest_what, sizeof ex.what);
  if (x->oldest_task && task_name(rt, x->oldest_task, ex.name))
    ex.task = x->oldest_task;
  if (rt->cfg.on_pool_exhausted) {
    rt->cfg.on_pool_exhausted(&ex, rt->cfg.on_pool_exhausted_arg);
    return;
  }
  char who[96] = "";
  if (ex.task)
    snprintf(who, sizeof who, "; the oldest, of task %llu%s%s%s,",
             (unsigned long long)ex.task, ex.name[0] ? " '" : "", ex.name,
             ex.name[0] ? "'" : "");
  char what[80] = "";
  if (ex.what[0]) snprintf(what, sizeof what, " calls %s and", ex.what);
  fprintf(stderr,
          "ums: the %s pool is exhausted: %llu of its %llu threads run "
          "calls and %llu wait%s%s has waited %.3f s (raise %s, or give "
          "the calls a deadline)\n",
          pool, (unsigned long long)ex.active, (unsigned long long)ex.max,
          (unsigned long long)ex.queued, who, what,
          (double)ex.oldest_wait_ns / 1e9,
          strcmp(pool, "io") == 0 ? "io_pool_threads" : "preempt_threads");
  fflush(stderr);
}

/* The pools' look at each tick. Returns whether one has work queued or
** an episode to end (the monitor then keeps ticking, idle schedulers or
** not). */
static bool look_at_pools(ums_runtime_t *rt, int64_t threshold) {
  static const char *const names[2] = {"preemptive", "io"};
  ums__pool_t *pools[2] = {&rt->preempt_pool, &rt->io_pool};
  bool queued = false;
  for (int i = 0; i < 2; i++) {
    if (!pools[i]->cfg.max) continue;
    /* Looked at once more after it drained, to end its episode. */
    if (!ums__pool_has_queued(pools[i]) &&
        !ums__pool_exhausted_hint(pools[i]))
      continue;
    queued = true;
    ums__pool_exhaust_t x;
    if (ums__pool_exhaustion(pools[i], threshold, &x))
      report_pool(rt, names[i], &x);
  }
  return queued;
}

/* In its idle wait, or run by its caller and the caller is away. */
static bool sched_idle(ums__sched_t *s) {
  return atomic_load(&s->idle_state) != 0 || atomic_load(&s->away) != 0;
}

/* Sleeps until a scheduler gets busy or the monitor is stopped. Returns
** at once if one is busy already. */
static void sleep_until_busy(ums_runtime_t *rt) {
  ums__monitor_t *m = &rt->monitor;
  uint32_t w = atomic_load(&m->word);
  atomic_store(&m->asleep, 1);
  for (int i = 0; i < rt->nsched; i++) {
    if (!sched_idle(&rt->scheds[i])) {
      atomic_store(&m->asleep, 0);
      return;
    }
  }
  while (atomic_load(&m->asleep) && !atomic_load(&m->stop)) {
    ums__futex_wait(&m->word, w, UMS_FOREVER);
    w = atomic_load(&m->word);
  }
}

static void moved(ums__monitor_slot_t *sl, uint64_t seq, int64_t now,
                  int64_t cpu) {
  sl->seq = seq;
  sl->since = now;
  sl->cpu_since = cpu;
  sl->reported = false;
}

/* What moves while a scheduler passes through its loop: its task
** switches, and the preemptive calls its tasks waited for by spinning at
** the call site (preempt.c), which stand in for the switches they saved
** (a task looping on such calls, with nothing else runnable, is not
** stalling anybody). */
static uint64_t progress(ums__sched_t *s) {
  return atomic_load_explicit(&s->counters.context_switches,
                              memory_order_relaxed) +
         atomic_load_explicit(&s->counters.preempt_spun,
                              memory_order_relaxed);
}

static void reset_slots(ums_runtime_t *rt, int64_t now) {
  for (int i = 0; i < rt->nsched; i++) {
    ums__monitor_slot_t *sl = &rt->monitor.slots[i];
    sl->cpu_last = thread_cpu(sl);
    moved(sl, progress(&rt->scheds[i]), now, sl->cpu_last);
  }
}

static void *monitor_main(void *arg) {
  ums_runtime_t *rt = arg;
  ums__monitor_t *m = &rt->monitor;
  int64_t threshold = rt->cfg.stall_threshold;
  bool clock = rt->wait_clock_ticks;
  int64_t last = ums__clock_real();
  int64_t watch_next = last;
  reset_slots(rt, last);
  while (!atomic_load(&m->stop)) {
    uint32_t w = atomic_load(&m->word);
    /* Between looks, the wait clock's ticks (waitstats.c) and the
    ** binding's looks. */
    int64_t wake = last + m->tick;
    if (clock) {
      int64_t t = ums__clock_real() + CLOCK_TICK_NS;
      if (t < wake) wake = t;
    }
    int64_t period = atomic_load_explicit(&m->watch_period,
                                          memory_order_acquire);
    if (period > 0 && watch_next < wake) wake = watch_next;
    ums__futex_wait(&m->word, w, wake);
    if (atomic_load(&m->stop)) break;
    int64_t now = ums__clock_real();
    if (clock) ums__wait_clock_advance(rt, ums__stamp_now());
    /* Also while the shutdown cancels the tasks: a task that computes
    ** learns of its cancellation from the binding's look. */
    /* Acquire: watch_fn and watch_arg were stored before the period. */
    period = atomic_load_explicit(&m->watch_period, memory_order_acquire);
    if (period > 0 && now >= watch_next) {
      m->watch_fn(m->watch_arg, now);
      watch_next = now + period;
    }
    if (now < last + m->tick) continue;
    last = now;
    /* Schedulers leaving their loops at shutdown are not stalled. */
    if (atomic_load(&rt->exiting)) continue;
    bool busy = false;
    for (int i = 0; i < rt->nsched; i++) {
      ums__sched_t *s = &rt->scheds[i];
      ums__monitor_slot_t *sl = &m->slots[i];
      uint64_t seq = progress(s);
      int64_t cpu = thread_cpu(sl);
      int64_t used = cpu >= 0 && sl->cpu_last >= 0 ? cpu - sl->cpu_last : 0;
      sl->cpu_last = cpu;
      /* The task picked last ran until now, or until the scheduler went
      ** idle since the last tick: either way the CPU is its. */
      uint64_t running = atomic_load_explicit(&s->running,
                                              memory_order_relaxed);
      if (s->timing && running && used > 0) credit(rt, running, used);
      if (sched_idle(s)) {
        moved(sl, seq, now, cpu);
        continue;
      }
      busy = true;
      if (seq != sl->seq) {
        moved(sl, seq, now, cpu);
      } else if (threshold >= 0 && !sl->reported &&
                 now - sl->since >= threshold && stuck(s, sl, cpu)) {
        sl->reported = true;
        report(rt, s, running, now - sl->since);
      }
    }
    if (threshold >= 0 && look_at_pools(rt, threshold)) busy = true;
    if (!busy) {
      sleep_until_busy(rt);
      if (clock) ums__wait_clock_advance(rt, ums__stamp_now());
      last = ums__clock_real();
      reset_slots(rt, last);
    }
  }
  return NULL;
}

int ums__monitor_start(ums_runtime_t *rt) {
  ums__monitor_t *m = &rt->monitor;
  int64_t threshold = rt->cfg.stall_threshold;
  m->tick = TICK_NS;
  if (threshold >= 0 && threshold / 4 < m->tick) m->tick = threshold / 4;
  if (m->tick < MIN_TICK_NS) m->tick = MIN_TICK_NS;
  m->slots = calloc((size_t)rt->nsched, sizeof *m->slots);
  if (!m->slots) return UMS_ENOMEM;
  for (int i = 0; i < rt->nsched; i++) {
    ums__monitor_slot_t *sl = &m->slots[i];
    sl->stat_fd = -1;
    /* A scheduler without a thread of its own runs on the caller's,
    ** which is starting the monitor now. */
    ums__thread_t *th = rt->scheds[i].thread;
    sl->has_clock = pthread_getcpuclockid(
        th ? ums__thread_handle(th) : pthread_self(), &sl->clock) == 0;
  }
  /* The monitor never runs a signal handler meant for a scheduler or the
  ** host (the Lua binding's quantum signal, a pool interrupt). */
  sigset_t all;
  sigfillset(&all);
  int r = ums__thread_start(&m->thread, monitor_main, rt, &all,
                            "ums-monitor");
  if (r != 0) {
    free(m->slots);
    m->slots = NULL;
    return r;
  }
  m->started = true;
  return 0;
}

int ums_runtime_watch(ums_runtime_t *rt, ums_watch_fn fn, void *arg,
                      int64_t period) {
  ums__monitor_t *m = &rt->monitor;
  m->watch_fn = fn;
  m->watch_arg = arg;
  atomic_store(&m->watch_period, period > 0 ? period : 0);
  if (m->started) return 0;
  /* The configuration needed no monitor (no stall reports, no sampling):
  ** it starts now, before any task, on the thread that made rt. */
  return ums__monitor_start(rt);
}

void ums_runtime_watch_period(ums_runtime_t *rt, int64_t period) {
  ums__monitor_t *m = &rt->monitor;
  atomic_store(&m->watch_period, period > 0 ? period : 0);
  /* A monitor waiting for its next tick recomputes its wake-up; one asleep
  ** because every scheduler is idle stays so. */
  atomic_fetch_add(&m->word, 1);
  ums__futex_wake(&m->word, 1);
}

void ums__monitor_wake(ums_runtime_t *rt) {
  ums__monitor_t *m = &rt->monitor;
  if (atomic_exchange(&m->asleep, 0)) {
    atomic_fetch_add(&m->word, 1);
    ums__futex_wake(&m->word, 1);
  }
}

void ums__monitor_stop_begin(ums_runtime_t *rt) {
  ums__monitor_t *m = &rt->monitor;
  /* Once is enough: the shutdown begins it, runtime_free ends it. */
  if (!m->started || atomic_load(&m->stop)) return;
  atomic_store(&m->stop, 1);
  atomic_store(&m->asleep, 0);
  atomic_fetch_add(&m->word, 1);
  ums__futex_wake(&m->word, 1);
}

void ums__monitor_stop(ums_runtime_t *rt) {
  ums__monitor_t *m = &rt->monitor;
  if (!m->started) return;
  ums__monitor_stop_begin(rt);
  /* A runtime that ends before its monitor got a CPU never needed it. */
  ums__thread_stop(m->thread, rt->cfg.keep_threads);
  m->thread = NULL;
  m->started = false;
  for (int i = 0; i < rt->nsched; i++)
    if (m->slots[i].stat_fd >= 0) close(m->slots[i].stat_fd);
  free(m->slots);
  m->slots = NULL;
}
