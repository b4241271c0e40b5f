/*
** ldisp.c: where submitted work runs. A request (lreq.c) is a work item
** of the runtime (ums-binding.h, "Work items"): queued for the scheduler
** ums.submit_on names, or where the runtime's placement puts it
** (ums.submit, a host's request), and started by the scheduler the
** runtime gives it to: its own when that one is free, another that
** steals it when its own is busy (after a grace for a named one: the
** runtime's rules, work.c). Once started, a request is a task of that
** scheduler's VM and stays there.
**
** Starting (req_start) runs on the scheduler's thread between two tasks,
** in none: it spawns the request's task in the VM, which is cheap. The
** first request of a scheduler also makes its VM and runs the init
** module, which is Lua code of any depth: that runs in a task of its own
** (a step task, "ums.vmstart"), on a fresh stack, which then hands the
** request back to the runtime for that scheduler, whose start finds the
** VM ready (or refused) like any other's.
**
** A scheduler whose VM cannot be set up (or whose init module failed)
** refuses work for good (UMS_WORK_REFUSE): the runtime passes its
** requests on, and when every scheduler has refused, each request ends
** with the latest refusal's error.
**
** Every queued request holds the run (lrun.live), so core.run does not
** shut the runtime down under it; its start lets go of that hold. On a
** failed run (lums_run_stop) a request given to a scheduler is cancelled
** instead of started; those the runtime never gave out are ended by
** ums_runtime_shutdown (UMS_WORK_ENDED).
*/
#include "lvm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQ_OF_W(w) UMS_CONTAINER_OF(w, lreq, work)

/* Starts request r on scheduler s, whose VM is ready: a new task of that
** VM. On s's thread, in no task. */
static void start_in(lrun *v, lvmrun *vm, lreq *r) {
  /* Lua code may run here outside any task (finalizers): ums waits must
  ** see "not inside a task", not a task blocked on another worker of
  ** this thread. */
  ltask *prev = lums_cur_task;
  lums_cur_task = NULL;
  lua_State *L = vm->SL;
  lua_pushcfunction(L, lums_req_start);
  lua_pushlightuserdata(L, vm);
  lua_pushlightuserdata(L, r);
  if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
    char buf[256];
    snprintf(buf, sizeof buf, "ums.submit: cannot start the work: %s",
             lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
    lua_pop(L, 1);
    /* The runtime refused the task because the run is being shut down:
    ** that is a cancellation, not an error of the work. */
    if (atomic_load(&v->stopping))
      lums_req_finish(r, O_CANCELLED, NULL, "the run ended before it started");
    else
      lums_req_fail(r, buf);
  }
  lums_cur_task = prev;
}

/* Whether r may start: false (and r is finished cancelled) when a cancel
** came after the runtime gave it out, or the run failed. Else r is
** R_STARTING on s. */
static bool claim(lrun *v, lreq *r, int s) {
  pthread_mutex_lock(&r->h.lock);
  bool cancel = r->cancel_req;
  bool stopping = !cancel && atomic_load(&v->stopping);
  if (!cancel && !stopping) {
    r->state = R_STARTING;
    r->sched = s;
  }
  pthread_mutex_unlock(&r->h.lock);
  if (cancel)
    lums_req_finish(r, O_CANCELLED, NULL, "cancelled before it started");
  else if (stopping)
    lums_req_finish(r, O_CANCELLED, NULL, "the run ended before it started");
  return !cancel && !stopping;
}

/* A scheduler could not set up its VM (err says why; it lives as long as
** v): the request it was given stays queued, and the runtime passes it
** on. */
static int refuse(lrun *v, const char *err) {
  pthread_mutex_lock(&v->reqs.lock);
  v->disp.refusal = err;
  pthread_mutex_unlock(&v->reqs.lock);
  return UMS_WORK_REFUSE;
}

/* The "ums.vmstart" task of scheduler s: makes s's VM (and runs the init
** module) for request r, then queues r for s again, whose start finds
** the VM ready or refused for good (req_start). A VM that cannot be had
** for now (memory) fails r. One step. */
typedef struct vmstart {
  lrun *v;
  lreq *r;
  int sched;
} vmstart;

static int vmstart_step(void *arg) {
  vmstart b = *(vmstart *)arg;
  free(arg);
  int err = ums_step_error();
  const char *msg = err ? ums_strerror(err) : NULL;
  if (!err) {
    ltask *prev = lums_cur_task;
    lums_cur_task = NULL;
    bool refused = false;
    if (lums_run_ready(b.v, b.sched, &msg, &refused) || refused) msg = NULL;
    lums_cur_task = prev;
  }
  /* The queue's hold stays with the request while it is queued again. */
  if (msg) {
    lums_req_fail(b.r, msg);
    lums_run_release(b.v);
  } else if (ums_work_queue(b.v->rt, &b.r->work, b.sched) != 0) {
    lums_req_finish(b.r, O_CANCELLED, NULL, "the run ended before it started");
    lums_run_release(b.v);
  }
  return UMS_STEP_DONE;
}

/* The work item's start (ums_work_fn): see the top. */
static int req_start(ums_work_t *w, int s) {
  lreq *r = REQ_OF_W(w);
  lrun *v = r->run;
  if (s == UMS_WORK_ENDED) {
    lums_req_finish(r, O_CANCELLED, NULL, "the run ended before it started");
  } else if (s == UMS_WORK_REFUSED) {
    pthread_mutex_lock(&v->reqs.lock);
    const char *err = v->disp.refusal;
    pthread_mutex_unlock(&v->reqs.lock);
    lums_req_fail(r, err ? err : "ums: no scheduler takes work");
  } else if (!lums_run_vm_ready(v, s)) {
    const char *msg = lums_run_refusal(v, s);
    if (msg) return refuse(v, msg);
    vmstart *b = malloc(sizeof *b);
    int rc = UMS_ENOMEM;
    if (b) {
      *b = (vmstart){v, r, s};
      ums_spawn_opts_t opts = {s, 1, "ums.vmstart"};
      rc = ums_task_spawn_step(v->rt, &opts, vmstart_step, b, NULL);
      if (rc == 0) return 0;  /* the task has the hold now */
      free(b);
    }
    if (rc == UMS_ESHUTDOWN || atomic_load(&v->stopping))
      lums_req_finish(r, O_CANCELLED, NULL,
                      "the run ended before it started");
    else
      lums_req_fail(r, ums_strerror(rc));
  } else if (claim(v, r, s)) {
    start_in(v, atomic_load_explicit(&v->vm[s], memory_order_relaxed), r);
  }
  lums_run_release(v);  /* the queue's */
  return 0;
}

int lums_req_queue(lrun *v, lreq *r, int target) {
  lshared_ref(&r->h);  /* the run's, until done */
  lums_run_hold(v);    /* the queue's, until started or cancelled */
  pthread_mutex_lock(&v->reqs.lock);
  ums_list_push_front(&v->reqs.active, &r->llink);
  pthread_mutex_unlock(&v->reqs.lock);
  r->work.start = req_start;
  int rc = ums_work_queue(v->rt, &r->work, target >= 0 ? target
                                                       : UMS_ANY_SCHED);
  if (rc != 0) {
    /* The runtime is shutting down: nothing will start it. */
    lums_req_finish(r, O_CANCELLED, NULL, "the run is ending");
    lums_run_release(v);
    return UMS_ESHUTDOWN;
  }
  return 0;
}

bool lums_req_cancel(lreq *r) {
  lrun *v = r->run;
  bool dequeued = false, ok = true;
  ums_task_t task = 0;
  pthread_mutex_lock(&r->h.lock);
  switch (r->state) {
    case R_DONE:
      ok = false;
      break;
    case R_RUNNING:
      task = r->task;
      break;
    case R_STARTING:
      r->cancel_req = true;
      break;
    default: /* R_QUEUED: in the runtime's queue, or being given out */
      dequeued = ums_work_cancel(r->rt, &r->work);
      if (!dequeued) r->cancel_req = true;
      break;
  }
  pthread_mutex_unlock(&r->h.lock);
  if (dequeued) {
    /* Off its queue, nobody else can start it now. */
    lums_req_finish(r, O_CANCELLED, NULL, "cancelled before it started");
    lums_run_release(v);
  }
  if (task) ums_task_cancel(r->rt, task);
  return ok;
}

void lums_disp_close(lrun *v) {
  /* Requests whose task was cancelled before it began. */
  while (!ums_list_empty(&v->reqs.active))
    lums_req_finish(REQ_OF_L(v->reqs.active.head), O_CANCELLED, NULL,
                    "the run ended before it started");
}
