/*
** worker.c: workers are C fibers that carry tasks. Each scheduler keeps
** a pool of idle ones; the pool is a list whose head is the most recently
** used worker (its stack is warm), and trimming frees from the tail.
** All functions are [owner] only.
*/
#include "internal.h"

#include <stdlib.h>

static void set_counts(ums__sched_t *s) {
  atomic_store_explicit(&s->nidle_workers, s->nidle, memory_order_relaxed);
  atomic_store_explicit(&s->nworkers_all, s->nworkers, memory_order_relaxed);
}

#define IDLE_WORKER(l) UMS_LIST_ENTRY(l, ums__worker_t, idle)

static void idle_unlink(ums__sched_t *s, ums__worker_t *w) {
  ums_list_remove(&s->idle, &w->idle);
  s->nidle--;
}

static void worker_delete(ums__sched_t *s, ums__worker_t *w) {
  ums__ctx_destroy(&w->ctx);
  ums__stack_free(&s->stacks, &w->stack);
  free(w);
  s->nworkers--;
}

void ums__worker_bind(ums__sched_t *s, ums__worker_t *w, ums__task_t *t) {
  w->task = t;
  t->worker = w;
  atomic_store_explicit(&s->nworkers_busy, ++s->nbusy, memory_order_relaxed);
}

static void unbind(ums__sched_t *s, ums__worker_t *w, ums__task_t *t) {
  t->worker = NULL;
  w->task = NULL;
  atomic_store_explicit(&s->nworkers_busy, --s->nbusy, memory_order_relaxed);
}

ums__worker_t *ums__worker_get(ums__sched_t *s) {
  ums__worker_t *w = IDLE_WORKER(s->idle.head);
  if (w) {
    idle_unlink(s, w);
    set_counts(s);
    return w;
  }
  w = calloc(1, sizeof *w);
  if (!w) return NULL;
  if (ums__stack_alloc(&s->stacks, &w->stack) != 0) {
    free(w);
    return NULL;
  }
  w->sched = s;
  s->nworkers++;
  set_counts(s);
  return w;
}

void ums__worker_put(ums__sched_t *s, ums__worker_t *w) {
  w->task = NULL;
  w->idle_epoch = s->trim_epoch;
  ums_list_push_front(&s->idle, &w->idle);
  s->nidle++;
  set_counts(s);
}

int ums__worker_trim(ums__sched_t *s, uint64_t before, int keep) {
  int freed = 0;
  /* The current worker is never in the pool, so none freed here is the
  ** stack we are running on. */
  ums__worker_t *w;
  while (s->nidle > (uint32_t)keep && (w = IDLE_WORKER(s->idle.tail)) &&
         w->idle_epoch < before) {
    idle_unlink(s, w);
    worker_delete(s, w);
    freed++;
  }
  set_counts(s);
  return freed;
}

void ums__worker_free_all(ums__sched_t *s) {
  ums__worker_t *w;
  while ((w = IDLE_WORKER(s->idle.head)) != NULL) {
    idle_unlink(s, w);
    worker_delete(s, w);
  }
  set_counts(s);
}

/* Runs one step of a step task. Returns true when the task has ended;
** otherwise the task was parked or queued and w is free again. */
static bool run_step(ums__sched_t *s, ums__worker_t *w, ums__task_t *t) {
  if (t->wait == &t->park) {
    /* Back from a park that ended: its timer may still be armed. */
    t->wait = NULL;
    ums__wait_timer_stop(s, t);
  }
  int r = t->step(t->arg);
  if (r == UMS_STEP_DONE) {
    if (t->park_pending)
      ums__step_misuse(t, "returned UMS_STEP_DONE with a park begun");
    return true;
  }
  unbind(s, w, t);
  s->cur_task = NULL;
  if (r == UMS_STEP_PARK) {
    if (!t->park_pending)
      ums__step_misuse(t, "returned UMS_STEP_PARK without ums_park_begin");
    ums__park_after_step(s, t);
  } else if (r == UMS_STEP_YIELD) {
    if (t->park_pending)
      ums__step_misuse(t, "returned UMS_STEP_YIELD with a park begun");
    UMS__COUNT(s, yields);
    t->state = UMS__T_RUNNABLE;
    ums__obs_yield(t);
    ums__sched_push_runnable(s, t);
  } else {
    ums__step_misuse(t, "returned an unknown UMS_STEP_* value");
  }
  return false;
}

/* Runs a C task's function; ums_exit unwinds to this frame. Kept out of
** line so no local of the loop lives across the sigsetjmp. */
static __attribute__((noinline)) void run_fn(ums__worker_t *w,
                                             ums__task_t *t) {
  if (sigsetjmp(w->exit_jb, 0) == 0) t->result = t->fn(t->arg);
}

void ums__worker_main(void *arg) {
  ums__worker_t *w = arg;
  ums__sched_t *s = w->sched;
  for (;;) {
    ums__task_t *t = w->task;
    bool ended = true;
    s->cur_task = t;
    t->state = UMS__T_RUNNING;
    if (!t->started) {
      t->started = true;
      /* Past the shutdown deadline nothing starts, even a task whose own
      ** cancel is still on its way. */
      if (atomic_load_explicit(&s->rt->cancel_all, memory_order_relaxed))
        atomic_store(&t->cancelled, 1);
      /* A C task cancelled before it started never runs. A step task is
      ** still stepped once: its binding holds resources for it and decides
      ** (ums_cancelled() tells it). */
      if (!t->step &&
          atomic_load_explicit(&t->cancelled, memory_order_relaxed)) {
        t->status = UMS_ECANCELED;
        goto end;
      }
    }
    if (t->step) {
      ended = run_step(s, w, t);
    } else {
      run_fn(w, t);
      /* A C task that returned (or exited) with a park begun: end it
      ** here, or an unpark would queue the finished task. */
      if (t->park_pending) ums__park_drop(t);
    }
  end:
    if (ended) {
      /* A return, ums_exit and a last step all arrive here. */
      unbind(s, w, t);
      s->cur_task = NULL;
      ums__sched_task_ended(s);
      ums__task_finish(t);  /* may recycle t */
    }
    /* Runs other tasks; returns only when a new task is bound to w. */
    ums__sched_schedule(s);
  }
}
