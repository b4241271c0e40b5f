/*
** ldisp.c: where submitted work runs. Requests (lreq.c) wait in
** per-scheduler queues until a dispatcher starts them. A request goes to
** the queue the runtime's placement policy picks (ums_runtime_place, the
** rule ums_task_spawn uses: the fewest tasks, counting each scheduler's
** queued requests too), or to the one ums.submit_on names.
**
** Stealing. A dispatcher is a C step task, at most one per scheduler,
** that exists while any queue holds work: each step it starts one
** request if its scheduler has nothing else runnable, taking the oldest
** request of its own queue or, when that is empty, stealing the oldest of
** the longest other queue; otherwise it yields and looks again after the
** others have run. So a scheduler keeps at most one runnable request of
** its own at a time (more may wait: a request that parks makes room for
** the next), and a scheduler with nothing to do takes work that has not
** started yet from a busy one. Once started, a request is a task of its
** VM and stays there. SQL Server never moves a connection: two heavy
** connections on one scheduler leave another CPU idle. Here the unstarted
** ones move. A request passed over for STARVE_NS starts anyway, so a
** scheduler whose tasks keep yielding cannot starve its queue.
**
** The steal grace. A request whose caller named its scheduler
** (ums.submit_on) is left to that scheduler for a while. The usual reason
** a scheduler has not started such a request yet is that it is about to:
** the task that queued it is still on its way to its next wait
** (submit_on(0, f), submit_on(1, g), then the joins), or the scheduler
** was asleep or spinning and is on its way (queueing the request posted
** its dispatcher to it; on a loaded machine its thread may wait a
** scheduler tick or more for a CPU). A thief that took the request
** meanwhile would move the work to a VM that is cold for it, against its
** caller's choice, and make submit_on useless for spreading work. So
** another scheduler steals such a request only when its owner has shown
** it is busy with something else:
**   - never in the first STEAL_GRACE_NS after it was queued (Go's
**     runqsteal waits for a running P's runnext the same way), nor while
**     its scheduler is in its idle wait (it is waking up for it);
**   - once the owner has picked another task since a thief first looked
**     (it runs tasks queued ahead of its dispatcher);
**   - or once it has been queued for STUCK_NS while its owner picked
**     nothing: one long computation that never yields, so the queue of a
**     scheduler stuck that way is still emptied by the others.
** A request the placement policy put somewhere (ums.submit) has no grace:
** any scheduler will do for it, and a free thief is the quickest.
** A thief that finds no request it may steal, but some it may later,
** parks its dispatcher until the first time one may be (while an owner
** is waking up, a grace later): its scheduler sleeps in its idle wait
** meanwhile, no polling. Work queued for the
** thief's own scheduler ends that park at once (lums_req_queue; exactly
** one of that unpark and the deadline ends a park, ums.h "Step tasks and
** parking", and an unpark that loses finds the park over).
**
** Every queued request and every dispatcher holds the run (lrun.live): a
** dispatcher must be able to spawn, which nothing may once
** ums_runtime_shutdown begins. On a failed run dispatchers start nothing
** more (lums_run_stop), and the requests never started are cancelled by
** lums_disp_close.
*/
#include "lvm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A request passed over this long by a busy scheduler starts anyway. */
#define STARVE_NS (100 * UMS_NSEC_PER_MSEC)
/* Another scheduler leaves a request named for a scheduler this long to
** it. Far longer than a task takes from its submit to its next wait, also
** on a loaded machine or under a sanitizer; short beside any work worth
** moving to another core. */
#define STEAL_GRACE_NS (1 * UMS_NSEC_PER_MSEC)
/* A running scheduler that has picked no task for this long, a request
** named for it waiting, is stuck in one task (or its thread has had no
** CPU): a quantum or two, far less than STARVE_NS. */
#define STUCK_NS (10 * UMS_NSEC_PER_MSEC)

#define REQ_OF_Q(l) UMS_LIST_ENTRY(l, lreq, qlink)

static void q_push(lreqq *q, lreq *r) {
  ums_list_push_back(&q->list, &r->qlink);
  q->n++;
}

static void q_remove(lreqq *q, lreq *r) {
  ums_list_remove(&q->list, &r->qlink);
  q->n--;
}

static void refuse(lrun *v, int s, lreq *r, const char *err);

/* Starts request r, just taken off a queue, on scheduler s: in s's VM
** (made if need be) as a new task. Releases the queue's hold on the
** run. On s's thread, in its dispatcher. */
static void start_request(lrun *v, int s, lreq *r) {
  pthread_mutex_lock(&r->h.lock);
  bool cancel = r->cancel_req;
  if (!cancel) {
    r->state = R_STARTING;
    r->sched = s;
  }
  pthread_mutex_unlock(&r->h.lock);
  const char *err = NULL;
  if (cancel) {
    lums_req_finish(r, O_CANCELLED, NULL, "cancelled before it started");
  } else {
    /* Lua code runs here outside any task (the init module, finalizers):
    ** ums waits must see "not inside a task", not a task blocked on
    ** another worker of this thread. */
    ltask *prev = lums_cur_task;
    lums_cur_task = NULL;
    bool refused = false;
    lvmrun *vm = lums_run_ready(v, s, &err, &refused);
    /* A VM that cannot be set up, or whose init module failed, stays so:
    ** its scheduler refuses work from now on and r goes elsewhere. */
    if (refused) {
      refuse(v, s, r, err);
      err = NULL;
    } else if (vm) {
      lua_State *L = vm->SL;
      lua_pushcfunction(L, lums_req_start);
      lua_pushlightuserdata(L, vm);
      lua_pushlightuserdata(L, r);
      if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        char buf[256];
        snprintf(buf, sizeof buf, "ums.submit: cannot start the work: %s",
                 lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
        lua_pop(L, 1);
        /* The runtime refused the task because the run is being shut
        ** down: that is a cancellation, not an error of the work. */
        if (atomic_load(&v->stopping))
          lums_req_finish(r, O_CANCELLED, NULL,
                          "the run ended before it started");
        else
          lums_req_fail(r, buf);
      }
    }
    lums_cur_task = prev;
    if (err) lums_req_fail(r, err);
  }
  lums_run_release(v);
}

/* A dispatcher: a step task of its own scheduler. [owner: the task] */
typedef struct ldisp_task {
  lrun *v;               /* [const] */
  int sched;             /* [const] */
  int64_t busy_since;    /* [owner] when it first found the scheduler
                            busy since it last started work; 0: not */
  ums_sched_stats_t *rows; /* [owner] a row per scheduler of scratch */
} ldisp_task;

/* Whether scheduler d->sched should start a request now: nothing else is
** runnable there, or the queue has been passed over for STARVE_NS. */
static bool sched_free(ldisp_task *d) {
  int s = d->sched;
  ums_runtime_stats(d->v->rt, d->rows, s + 1);
  if (d->rows[s].runnable == 0) return true;
  int64_t now = ums_now();
  if (d->busy_since == 0) {
    d->busy_since = now;
    return false;
  }
  return now - d->busy_since >= STARVE_NS;
}

/* Whether dispatcher d may steal r, the oldest request of another
** scheduler's queue, now (the rules above). If not, lowers *wake to when
** it may look again. [v->reqs.lock] */
static bool may_steal(ldisp_task *d, lreq *r, int64_t *wake) {
  lrun *v = d->v;
  /* A scheduler without a dispatcher (its spawn failed) gets to nothing. */
  if (!r->named || !v->disp.running[r->home]) return true;
  int64_t now = ums_runtime_now(v->rt);
  ums_runtime_stats(v->rt, d->rows, r->home + 1);
  const ums_sched_stats_t *row = &d->rows[r->home];
  if (!r->looked) {
    r->looked = true;
    r->picks = row->context_switches;
  }
  int64_t again = r->queued_at + STEAL_GRACE_NS;
  if (now >= again) {
    if (row->idle)
      again = now + STEAL_GRACE_NS;
    else if (row->context_switches != r->picks ||
             now >= r->queued_at + STUCK_NS)
      return true;
    else
      again = r->queued_at + STUCK_NS;
  }
  if (again < *wake) *wake = again;
  return false;
}

/* Takes the next request for scheduler s: the oldest of its own queue,
** else the oldest of the longest other queue whose oldest may be stolen
** (may_steal; d NULL: any). NULL when there is none; then *wake is when
** a young request of another queue comes of age (UMS_FOREVER: none
** waits). [v->reqs.lock] */
static lreq *take_request(lrun *v, int s, ldisp_task *d, int64_t *wake) {
  lreqq *qs = v->disp.q;
  lreqq *q = &qs[s];
  *wake = UMS_FOREVER;
  if (ums_list_empty(&q->list)) {
    int best = -1;
    for (int i = 0; i < v->nsched; i++)
      if (i != s && qs[i].n > 0 && (best < 0 || qs[i].n > qs[best].n) &&
          (!d || may_steal(d, REQ_OF_Q(qs[i].list.head), wake)))
        best = i;
    if (best < 0) return NULL;
    *wake = UMS_FOREVER;
    q = &qs[best];
  }
  lreq *r = REQ_OF_Q(q->list.head);
  q_remove(q, r);
  r->queued = false;
  return r;
}

static void disp_end(ldisp_task *d) {
  lrun *v = d->v;
  free(d->rows);
  free(d);
  lums_run_release(v);
}

static int disp_spawn(lrun *v, int s);

/* The runtime cannot run dispatcher d any further (ums_step_error: no
** worker could be had for it). The request it would have started next
** fails with that error instead, and a new dispatcher takes over the
** queue: it runs once memory is back, or fails the next request the same
** way, so every queued request ends. If not even that can be spawned, the
** requests left in d's queue fail now: none may wait for a dispatcher
** that never comes. */
static int disp_fail(ldisp_task *d, int err) {
  lrun *v = d->v;
  int s = d->sched;
  const char *msg = ums_strerror(err);
  int64_t wake;
  pthread_mutex_lock(&v->reqs.lock);
  v->disp.graced[s] = false;
  lreq *r = take_request(v, s, NULL, &wake);
  if (!r) v->disp.running[s] = false;
  pthread_mutex_unlock(&v->reqs.lock);
  if (r) {
    lums_req_fail(r, msg);
    if (disp_spawn(v, s) != 0) {
      for (;;) {
        pthread_mutex_lock(&v->reqs.lock);
        r = v->disp.running[s] ? NULL : REQ_OF_Q(v->disp.q[s].list.head);
        if (r) {
          q_remove(&v->disp.q[s], r);
          r->queued = false;
        }
        pthread_mutex_unlock(&v->reqs.lock);
        if (!r) break;
        lums_req_fail(r, msg);
      }
    }
  }
  disp_end(d);
  return UMS_STEP_DONE;
}

static int disp_step(void *arg) {
  ldisp_task *d = arg;
  lrun *v = d->v;
  int s = d->sched;
  int err = ums_step_error();
  if (err) return disp_fail(d, err);
  /* Cancelled: the run is being torn down. Stopping: it failed. Either
  ** way the requests left are cancelled by lums_disp_close. */
  bool cancelled = ums_cancelled() || atomic_load(&v->stopping);
  if (!cancelled && !sched_free(d)) return UMS_STEP_YIELD;
  int64_t wake = UMS_FOREVER;
  pthread_mutex_lock(&v->reqs.lock);
  /* Whatever ended a grace park (work for s, or the deadline), it is over:
  ** nobody may unpark its token any more. */
  v->disp.graced[s] = false;
  lreq *r = cancelled || v->disp.refused[s] ? NULL
                                            : take_request(v, s, d, &wake);
  if (!r && wake != UMS_FOREVER) {
    /* Only requests named for other schedulers, which may not be stolen
    ** yet: wait until one may, or for work of s's own. A park that cannot begin (the run is
    ** being cancelled, or memory is short) leaves the requests to their
    ** own schedulers, which always have dispatchers while they have work. */
    if (ums_park_begin(wake, &v->disp.grace[s]) == 0) {
      v->disp.graced[s] = true;
      pthread_mutex_unlock(&v->reqs.lock);
      return UMS_STEP_PARK;
    }
  }
  if (!r) v->disp.running[s] = false;
  pthread_mutex_unlock(&v->reqs.lock);
  if (!r) {
    disp_end(d);
    return UMS_STEP_DONE;
  }
  d->busy_since = 0;
  start_request(v, s, r);
  return UMS_STEP_YIELD;
}

/* Starts a dispatcher on scheduler s, whose v->disp.running[s] the
** caller set. Returns 0 or the spawn's error (v->disp.running[s] is then
** cleared again). */
static int disp_spawn(lrun *v, int s) {
  ldisp_task *d = calloc(1, sizeof *d);
  ums_sched_stats_t *rows = calloc((size_t)v->nsched, sizeof *rows);
  int rc = UMS_ENOMEM;
  if (d && rows) {
    d->v = v;
    d->sched = s;
    d->rows = rows;
    lums_run_hold(v);
    ums_spawn_opts_t opts = {s, 1, "ums.dispatch"};
    rc = ums_task_spawn_step(v->rt, &opts, disp_step, d, NULL);
    if (rc == 0) return 0;
    lums_run_release(v);
  }
  free(d);
  free(rows);
  pthread_mutex_lock(&v->reqs.lock);
  v->disp.running[s] = false;
  pthread_mutex_unlock(&v->reqs.lock);
  return rc;
}

/* Where the runtime's placement policy (ums_runtime_place) puts a
** request: the fewest tasks plus queued requests, among the schedulers
** that have not refused work; the caller's own (here; -1: none, a host
** thread) wins ties. -1 when every scheduler has refused. [reqs.lock] */
static int place(lrun *v, int here) {
  ldispatch *d = &v->disp;
  for (int i = 0; i < v->nsched; i++)
    /* A dispatcher is not work of its scheduler's. */
    d->extra[i] = d->refused[i] ? UMS_PLACE_SKIP
                                : d->q[i].n - (d->running[i] ? 1 : 0);
  return ums_runtime_place(v->rt, here, d->extra);
}

/* Marks, with v->reqs.lock held, the schedulers that have no dispatcher and
** take work as getting one, in spawn[]; spawn_marked starts them once the
** lock is released. A dispatcher on every such scheduler: the target's
** starts a request, an idle one may steal it. */
static void mark_dispatchers(lrun *v, bool *spawn) {
  for (int i = 0; i < v->nsched; i++) {
    spawn[i] = !v->disp.running[i] && !v->disp.refused[i];
    if (spawn[i]) v->disp.running[i] = true;
  }
}

/* Returns 0 or the first spawn's error. */
static int spawn_marked(lrun *v, const bool *spawn) {
  int rc = 0;
  for (int i = 0; i < v->nsched; i++) {
    if (!spawn[i]) continue;
    int e = disp_spawn(v, i);
    if (e && !rc) rc = e;
  }
  return rc;
}

/* Scheduler s could not set up its VM (err says why; it lives as long as
** v): from now on s takes no work, what is queued for s moves to the
** schedulers that take work, and so does r, which s's dispatcher had
** taken. When no scheduler takes work any more, r and every queued
** request end with the error, and so does every later request
** (lums_req_queue). r carries its queue's hold, which start_request
** releases; a requeued r gets a new one. On s's thread. */
static void refuse(lrun *v, int s, lreq *r, const char *err) {
  bool spawn[v->nsched];
  ums_list_t doomed = {NULL, NULL};  /* requests to fail, by qlink */
  pthread_mutex_lock(&r->h.lock);
  bool cancel = r->cancel_req;
  if (!cancel) {
    r->state = R_QUEUED;
    r->sched = -1;
  }
  pthread_mutex_lock(&v->reqs.lock);
  if (!v->disp.refused[s]) {
    v->disp.refused[s] = true;
    v->disp.nrefused++;
  }
  v->disp.refusal = err;
  int t = place(v, -1);
  if (t >= 0) {
    lreq *q;
    while ((q = REQ_OF_Q(v->disp.q[s].list.head)) != NULL) {
      q_remove(&v->disp.q[s], q);
      q->home = place(v, -1);
      q->named = false;
      q_push(&v->disp.q[q->home], q);
    }
    if (!cancel) {
      lums_run_hold(v);  /* the new queue's */
      r->home = t;
      r->named = false;
      r->queued = true;
      q_push(&v->disp.q[t], r);
    }
    mark_dispatchers(v, spawn);
  } else {
    for (int i = 0; i < v->nsched; i++) {
      lreq *q;
      while ((q = REQ_OF_Q(v->disp.q[i].list.head)) != NULL) {
        q_remove(&v->disp.q[i], q);
        q->queued = false;
        ums_list_push_back(&doomed, &q->qlink);
      }
    }
    memset(spawn, 0, sizeof spawn);
  }
  pthread_mutex_unlock(&v->reqs.lock);
  pthread_mutex_unlock(&r->h.lock);
  if (cancel)
    lums_req_finish(r, O_CANCELLED, NULL, "cancelled before it started");
  else if (t < 0)
    lums_req_fail(r, err);
  for (ums_link_t *l; (l = ums_list_pop_front(&doomed)) != NULL;) {
    lreq *q = REQ_OF_Q(l);
    lums_req_fail(q, err);
    lums_run_release(v);  /* its queue's hold */
  }
  (void)spawn_marked(v, spawn);
}

int lums_req_queue(lrun *v, lreq *r, int target, int here) {
  bool spawn[v->nsched];
  lshared_ref(&r->h);  /* the run's, until done */
  lums_run_hold(v);    /* the queue's, until started or cancelled */
  pthread_mutex_lock(&v->reqs.lock);
  /* A scheduler that refused work passes what is meant for it on. */
  r->named = target >= 0 && !v->disp.refused[target];
  if (!r->named) target = place(v, here);
  ums_list_push_front(&v->reqs.active, &r->llink);
  if (target < 0) {
    /* Every scheduler refused: the work fails as theirs did. */
    const char *err = v->disp.refusal;
    pthread_mutex_unlock(&v->reqs.lock);
    lums_req_fail(r, err);
    lums_run_release(v);
    return 0;
  }
  r->home = target;
  r->queued = true;
  if (r->named) {
    r->queued_at = ums_runtime_now(v->rt);
    r->looked = false;
  }
  q_push(&v->disp.q[target], r);
  mark_dispatchers(v, spawn);
  /* Its scheduler's dispatcher, waiting out another's grace, starts it now
  ** rather than at the end of that grace. */
  bool unpark = v->disp.graced[target];
  v->disp.graced[target] = false;
  ums_park_token_t tok = v->disp.grace[target];
  pthread_mutex_unlock(&v->reqs.lock);
  if (unpark) (void)ums_unpark(v->rt, tok, 0);
  int rc = spawn_marked(v, spawn);
  if (rc == UMS_ESHUTDOWN) {
    /* The run is ending: nothing will start it. */
    pthread_mutex_lock(&v->reqs.lock);
    bool was = r->queued;
    if (was) {
      q_remove(&v->disp.q[r->home], r);
      r->queued = false;
    }
    pthread_mutex_unlock(&v->reqs.lock);
    if (was) {
      lums_req_finish(r, O_CANCELLED, NULL, "the run is ending");
      lums_run_release(v);
      return UMS_ESHUTDOWN;
    }
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
    default: /* R_QUEUED: still in its queue, or taken by a dispatcher */
      pthread_mutex_lock(&v->reqs.lock);
      if (r->queued) {
        q_remove(&v->disp.q[r->home], r);
        r->queued = false;
        dequeued = true;
      }
      pthread_mutex_unlock(&v->reqs.lock);
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
  /* Requests never started: the run ended first. */
  for (int i = 0; v->disp.q && i < v->nsched; i++) {
    lreq *r;
    while ((r = REQ_OF_Q(v->disp.q[i].list.head)) != NULL) {
      q_remove(&v->disp.q[i], r);
      r->queued = false;
      lums_req_finish(r, O_CANCELLED, NULL, "the run ended before it started");
    }
  }
  /* Requests whose task was cancelled before it began. */
  while (!ums_list_empty(&v->reqs.active))
    lums_req_finish(REQ_OF_L(v->reqs.active.head), O_CANCELLED, NULL,
               "the run ended before it started");

}
