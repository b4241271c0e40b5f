/*
** stats.c: the readers of the observability calls (ums.h,
** "Observability"): per-scheduler counters, the hidden pools, and tasks.
** Owners write what is read here with relaxed atomic stores; readers take
** a near-consistent snapshot without stopping anyone. A task is read
** under its own lock, which keeps it from being recycled meanwhile (see
** ums__task_unref), never under a scheduler's.
*/
#include "internal.h"

#include <string.h>

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

/* ---------------------------------------------------------------------- */
/* Schedulers and pools                                                    */
/* ---------------------------------------------------------------------- */

int ums_runtime_stats(ums_runtime_t *rt, ums_sched_stats_t *rows, int n) {
  if (!rt) return UMS_EINVAL;
  for (int i = 0; i < rt->nsched && i < n && rows; i++) {
    ums__sched_t *s = &rt->scheds[i];
    ums_sched_stats_t *r = &rows[i];
    memset(r, 0, sizeof *r);
    /* A worker with no task counts as idle whether it sits in the pool or
    ** is the one running the scheduler's idle wait. */
    uint32_t all = LOAD(s->nworkers_all), busy = LOAD(s->nworkers_busy);
    r->id = i;
    r->idle = LOAD(s->is_idle);
    r->context_switches = LOAD(s->counters.context_switches);
    r->yields = LOAD(s->counters.yields);
    r->idle_waits = LOAD(s->counters.idle_waits);
    r->tasks_spawned = LOAD(s->counters.tasks_spawned);
    int64_t nt = ums__sched_load(s);
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
    r->preempt_spun = LOAD(s->counters.preempt_spun);
    r->hidden = 0;
    r->fiber_switches = LOAD(s->counters.fiber_switches);
    r->quantum_expiries = LOAD(s->counters.quantum_expiries);
    r->stalls = LOAD(s->stalls);
    int64_t load = ums__sched_load(s);
    r->load_factor = load > 0 ? (uint64_t)load : 0;
    /* The task picked last, unless the scheduler is idle now. */
    uint64_t id = LOAD(s->running);
    if (id && !r->idle) {
      ums__task_t *t = ums__task_lookup(rt, id);
      if (t) {
        ums__lock(&t->lock);
        if (ums__task_id_locked(t) == id) {
          r->running = id;
          memcpy(r->running_name, t->name, sizeof r->running_name);
        }
        ums__unlock(&t->lock);
      }
    }
  }
  return rt->nsched;
}

int ums_runtime_pool_stats(ums_runtime_t *rt, ums_pool_stats_t *rows,
                           int n) {
  if (!rt || n < 0 || (n && !rows)) return UMS_EINVAL;
  if (n > 0) {
    ums__pool_stats(&rt->preempt_pool, &rows[0]);
    rows[0].name = "preemptive";
  }
  if (n > 1) {
    ums__pool_stats(&rt->io_pool, &rows[1]);
    rows[1].name = "io";
  }
  return 2;
}

/* ---------------------------------------------------------------------- */
/* Tasks                                                                   */
/* ---------------------------------------------------------------------- */

static const char *const state_names[] = {
    [UMS_TASK_PENDING] = "pending",   [UMS_TASK_RUNNABLE] = "runnable",
    [UMS_TASK_RUNNING] = "running",   [UMS_TASK_SUSPENDED] = "suspended",
    [UMS_TASK_DONE] = "done",
};

const char *ums_task_state_name(int state) {
  return state >= UMS_TASK_PENDING && state <= UMS_TASK_DONE
             ? state_names[state]
             : NULL;
}

/* Copies what is known of t into *out if t is still the task `id` (any
** id when id is 0). Returns false if it is not (any more), or if it has
** finished and nobody may join it: gone, as far as its caller knows. */
static bool read_task(ums__task_t *t, uint64_t id, ums_task_info_t *out) {
  ums__lock(&t->lock);
  uint64_t cur = ums__task_id_locked(t);
  if (!cur || (id && cur != id) || (t->done && t->detached)) {
    ums__unlock(&t->lock);
    return false;
  }
  memset(out, 0, sizeof *out);
  out->id = cur;
  out->spawner = t->spawner;
  memcpy(out->name, t->name, sizeof out->name);
  /* Kept for after the unlock: from then on the record may be recycled
  ** and re-placed by another spawn. */
  ums__sched_t *sched = t->sched;
  out->sched = sched->id;
  bool timing = sched->timing;
  uint32_t obs = LOAD(t->obs);
  int state = t->done ? UMS_TASK_DONE : UMS__OBS_STATE(obs);
  int type = UMS__OBS_TYPE(obs);
  const void *obj = LOAD(t->wait_obj);
  uint64_t blocker = LOAD(t->wait_blocker);
  int64_t since = LOAD(t->wait_since), ready = LOAD(t->ready_at);
  int64_t cpu = LOAD(t->cpu_ns);
  ums__unlock(&t->lock);
  /* After the task's own stamps, on its scheduler's clock. */
  int64_t now = timing ? ums__stamp_sched(sched) : 0;

  /* Woken, not yet running: its waker stamped it (with stats on; the
  ** stamp is what tells, so that a wake-up stores nothing else). */
  if (state == UMS_TASK_SUSPENDED && timing && ready > since)
    state = UMS_TASK_RUNNABLE;
  out->state = state;
  out->wait_ns = out->runnable_ns = -1;
  out->cpu_ns = timing ? cpu : -1;
  /* The wait fields of a task that runs or has ended are leftovers. */
  if (type != UMS_WAIT_NONE && state != UMS_TASK_RUNNING &&
      state != UMS_TASK_DONE) {
    out->wait_type = type;
    out->wait_object = obj;
    out->blocker = blocker;
    if (timing) {
      out->wait_ns = now > since ? now - since : 0;
      out->runnable_ns = ready > since && now > ready ? now - ready : 0;
    }
  }
  return true;
}

int ums_runtime_tasks(ums_runtime_t *rt, ums_task_visit_fn fn, void *arg) {
  if (!rt || !fn) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  int seen = 0;
  uint32_t n = atomic_load_explicit(&rt->nslots, memory_order_acquire);
  for (uint32_t slot = 0; slot < n; slot++) {
    ums__task_t *chunk = atomic_load_explicit(
        &rt->chunks[slot / UMS__TASK_CHUNK], memory_order_acquire);
    ums__task_t *t = &chunk[slot % UMS__TASK_CHUNK];
    if (!atomic_load_explicit(&t->id, memory_order_acquire)) continue;
    ums_task_info_t info;
    if (!read_task(t, 0, &info)) continue;
    seen++;
    if (fn(&info, arg)) break;
  }
  ums__rt_leave_ext(rt, ext);
  return seen;
}

int ums_task_info(ums_runtime_t *rt, ums_task_t id, ums_task_info_t *out) {
  if (!rt || !out) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  ums__task_t *t = ums__task_lookup(rt, id);
  int r = t && read_task(t, id, out) ? 0 : UMS_ESRCH;
  ums__rt_leave_ext(rt, ext);
  return r;
}

int ums_task_set_name(ums_runtime_t *rt, ums_task_t id, const char *name) {
  if (!rt) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  int r = UMS_ESRCH;
  ums__task_t *t = ums__task_lookup(rt, id);
  if (t) {
    ums__lock(&t->lock);
    if (ums__task_id_locked(t) == id) {
      memset(t->name, 0, sizeof t->name);
      if (name) strncpy(t->name, name, UMS__TASK_NAME_MAX - 1);
      r = 0;
    }
    ums__unlock(&t->lock);
  }
  ums__rt_leave_ext(rt, ext);
  return r;
}
