/*
** stats.c: the per-scheduler counters. Owners write them with relaxed
** atomic stores; readers here take a near-consistent snapshot without
** stopping anyone.
*/
#include "internal.h"

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

int ums_runtime_stats(ums_runtime_t *rt, ums_sched_stats_t *rows, int n) {
  if (!rt) return UMS_EINVAL;
  for (int i = 0; i < rt->nsched && i < n && rows; i++) {
    ums__sched_t *s = &rt->scheds[i];
    ums_sched_stats_t *r = &rows[i];
    /* A worker with no task counts as idle whether it sits in the pool or
    ** is the one running the scheduler's idle wait. */
    uint32_t all = LOAD(s->nworkers_all), busy = LOAD(s->nworkers_busy);
    r->id = i;
    r->idle = LOAD(s->is_idle);
    r->context_switches = LOAD(s->counters.context_switches);
    r->yields = LOAD(s->counters.yields);
    r->idle_waits = LOAD(s->counters.idle_waits);
    r->tasks_spawned = LOAD(s->counters.tasks_spawned);
    int64_t nt = LOAD(s->ntasks);
    r->tasks = nt > 0 ? (uint64_t)nt : 0;
    r->runnable = LOAD(s->nrunnable);
    r->workers_active = busy;
    r->workers_idle = all > busy ? all - busy : 0;
    r->pending = LOAD(s->npending);
    r->timers = LOAD(s->ntimers);
    r->io_pending = LOAD(s->io_pending);
    r->io_requests = LOAD(s->counters.io_requests);
    r->io_submits = LOAD(s->counters.io_submits);
    r->preempt_pending = LOAD(s->preempt_pending);
    r->preempt_calls = LOAD(s->counters.preempt_calls);
  }
  return rt->nsched;
}
