/*
** lstats.c: observability for Lua: ums.stats(), ums.tasks(), ums.waits(),
** ums.waits_reset(), task:info() and stall reports (ums.on_stall), over
** the runtime's calls (ums.h, "Observability").
**
** Everything but tracebacks comes from the runtime, which keeps what may
** be read across threads (names, states, waits, CPU time) in its own task
** records: so these calls will not need the VM of the tasks they list
** once tasks live in several VMs. A traceback can only come from a task's
** own VM, and only from the thread running it.
**
** Stall reports. The runtime's monitor thread finds a stalled scheduler
** and calls lums_stall_cb there. That thread must not touch a VM (the
** stalled scheduler's thread is inside its VM, stalled or not), so the
** report waits in the run's lstall and the VM of that scheduler is asked
** for a hook (lums_request_hook, the quantum's signal): as soon as the
** stalled task runs Lua code again, the hook takes its traceback and
** delivers the report. With the default handler the monitor thread itself
** prints the report's one line, once it has the traceback's first frame or
** after a short wait for it (a task stuck in a blocking C call never
** reaches Lua), so the line comes out within the time the issue allows
** (twice the threshold) in every case. A Lua handler (ums.on_stall(fn),
** set in the stalled scheduler's VM: each VM has its own, like its own
** globals) runs on that VM's thread: from the hook, inside the stalled
** task (it must not wait), or, when the stalled step ended without
** running Lua again, at the VM's next step or the end of the run, without
** a traceback.
*/
#define _GNU_SOURCE
#include "lums.h"
#include "lstats.h"
#include "ltask.h"
#include "lvm.h"

#include <errno.h>
#include <lauxlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ONSTALL_KEY "ums.on_stall"
#define TB_MAX 4096
/* How long the monitor thread waits for the traceback's first frame before
** it prints the default line without one: at most half the threshold. */
#define WHERE_WAIT_MAX (500 * UMS_NSEC_PER_MSEC)

/* ---------------------------------------------------------------------- */
/* Stall reports                                                           */
/* ---------------------------------------------------------------------- */

enum { ST_NONE, ST_WANT, ST_HAVE, ST_DONE };

struct lstall {
  pthread_mutex_t lock;
  pthread_cond_t cond;         /* the hook captured a traceback */
  int state;                   /* [lock] ST_* of the latest report */
  ums_stall_t report;          /* [lock] the latest report */
  lvmrun *target;              /* [lock] the VM of its scheduler, or NULL */
  char tb[TB_MAX];             /* [lock] its traceback; "" when none */
  char tb_out[TB_MAX];         /* [the monitor thread] a copy to print */
  _Atomic(lrun *) run;         /* [atomic] the run's VMs, once made */
  int64_t where_wait;          /* [const] see WHERE_WAIT_MAX */
};

bool lums_stall_has_handler(lua_State *L) {
  bool yes = lua_getfield(L, LUA_REGISTRYINDEX, ONSTALL_KEY) == LUA_TFUNCTION;
  lua_pop(L, 1);
  return yes;
}

lstall *lums_stall_new(lua_State *L, int64_t threshold) {
  /* Not calloc: the two traceback buffers make up nearly all of the
  ** struct, and zeroing them would be most of what a short run costs.
  ** Every field is set below; tb holds "" until a report fills it, and
  ** tb_out is written before it is read. */
  lstall *s = malloc(sizeof *s);
  if (!s) return NULL; /* no reports, rather than no run */
  s->state = ST_NONE;
  memset(&s->report, 0, sizeof s->report);
  s->target = NULL;
  s->tb[0] = '\0';
  s->tb_out[0] = '\0';
  atomic_init(&s->run, NULL);
  pthread_mutex_init(&s->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cond, &ca);
  pthread_condattr_destroy(&ca);
  s->where_wait = threshold / 2 < WHERE_WAIT_MAX ? threshold / 2
                                                 : WHERE_WAIT_MAX;
  (void)L;
  return s;
}

void lums_stall_attach(lstall *s, lrun *run) {
  if (s) atomic_store(&s->run, run);
}

void lums_stall_free(lstall *s) {
  if (!s) return;
  pthread_cond_destroy(&s->cond);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

/* The first frame of a traceback ("file:line: in ..."), into out. */
static void first_frame(const char *tb, char *out, size_t n) {
  out[0] = '\0';
  const char *p = strstr(tb, "\n\t");
  if (!p) return;
  p += 2;
  size_t len = strcspn(p, "\n");
  if (len >= n) len = n - 1;
  memcpy(out, p, len);
  out[len] = '\0';
}

static void print_report(const ums_stall_t *st, const char *tb) {
  char where[256];
  first_frame(tb, where, sizeof where);
  fprintf(stderr,
          "ums: scheduler %d stalled: task %llu%s%s%s has not yielded for "
          "%.2f s (non-yielding scheduler)%s%s\n",
          st->sched, (unsigned long long)st->task, st->name[0] ? " '" : "",
          st->name, st->name[0] ? "'" : "", (double)st->stalled_ns / 1e9,
          where[0] ? ", at " : ", in a C call", where);
  fflush(stderr);
}

static void deadline_in(struct timespec *ts, int64_t ns) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  int64_t t = ts->tv_nsec + ns;
  ts->tv_sec += t / UMS_NSEC_PER_SEC;
  ts->tv_nsec = t % UMS_NSEC_PER_SEC;
}

/* The monitor thread. */
void lums_stall_cb(const ums_stall_t *st, void *arg) {
  lstall *s = arg;
  if (!s) return;
  /* The VM of the stalled scheduler, if it has one yet (a scheduler runs
  ** Lua only once a task of its VM has started). */
  lrun *run = atomic_load(&s->run);
  lvmrun *r = run && st->sched < lums_run_count(run)
                ? lums_run_at(run, st->sched)
                : NULL;
  pthread_mutex_lock(&s->lock);
  s->report = *st;
  s->target = r;
  s->tb[0] = '\0';
  s->state = ST_WANT;
  if (r) atomic_store(&r->stall.pending, 1);
  pthread_mutex_unlock(&s->lock);
  if (r) {
    lums_request_hook(&r->q);
    if (atomic_load(&r->stall.has_handler)) return;
  }

  /* The default handler: one line, from here. */
  struct timespec ts;
  deadline_in(&ts, s->where_wait);
  pthread_mutex_lock(&s->lock);
  while (s->state == ST_WANT && s->report.seq == st->seq &&
         pthread_cond_timedwait(&s->cond, &s->lock, &ts) != ETIMEDOUT) {
  }
  bool print = s->report.seq == st->seq && s->state != ST_DONE;
  ums_stall_t rep = s->report;
  memcpy(s->tb_out, s->tb, sizeof s->tb_out);
  if (print) {
    s->state = ST_DONE;
    if (r) atomic_store(&r->stall.pending, 0);
  }
  pthread_mutex_unlock(&s->lock);
  if (print) print_report(&rep, s->tb_out);
}

/* Calls the Lua handler with an info table. The traceback (or nil) is at
** the top of L's stack, popped; the task's handle is pushed when t is the
** stalled task. */
static void call_handler(lua_State *L, const ums_stall_t *st, ltask *t) {
  luaL_checkstack(L, 8, "ums: stall report");
  int tb = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, ONSTALL_KEY);
  if (!lua_isfunction(L, -1)) {
    lua_pop(L, 2);
    return;
  }
  lua_createtable(L, 0, 7);
  lua_pushinteger(L, st->sched);
  lua_setfield(L, -2, "scheduler");
  lua_pushinteger(L, (lua_Integer)st->task);
  lua_setfield(L, -2, "id");
  lua_pushstring(L, st->name);
  lua_setfield(L, -2, "name");
  lua_pushnumber(L, (lua_Number)st->stalled_ns / 1e9);
  lua_setfield(L, -2, "duration");
  lua_pushinteger(L, (lua_Integer)st->seq);
  lua_setfield(L, -2, "seq");
  lua_pushvalue(L, tb);
  lua_setfield(L, -2, "traceback");
  if (t && t->h && t->h->id == st->task) {
    lums_push_handle(L, t);
    lua_setfield(L, -2, "task");
  }
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    fprintf(stderr, "ums: error in the on_stall handler: %s\n",
            lua_tostring(L, -1));
    fflush(stderr);
    lua_pop(L, 1);
  }
  lua_pop(L, 1); /* the traceback */
}

void lums_stall_vm_init(lstall_vm *v, lstall *s, lua_State *L) {
  v->state = s;
  atomic_store(&v->pending, 0);
  atomic_store(&v->has_handler, lums_stall_has_handler(L));
}

/* The Lua thread, in a hook in task t. */
void lums_stall_hook(lua_State *L, ltask *t) {
  lvmrun *r = t->vmrun;
  lstall *s = r->stall.state;
  if (!s) {
    atomic_store(&r->stall.pending, 0);
    return;
  }
  pthread_mutex_lock(&s->lock);
  bool want = s->state == ST_WANT && s->target == r;
  bool mine = want && s->report.task == t->h->id;
  pthread_mutex_unlock(&s->lock);
  if (!want) return;
  /* The traceback is built without the lock held: it allocates, and may
  ** raise. Level 0 is the function the hook interrupted. */
  if (mine)
    luaL_traceback(L, L, NULL, 0);
  else
    lua_pushnil(L);
  pthread_mutex_lock(&s->lock);
  bool call = false;
  ums_stall_t rep = s->report;
  if (s->state == ST_WANT && s->target == r) {
    const char *tb = lua_tostring(L, -1);
    snprintf(s->tb, sizeof s->tb, "%s", tb ? tb : "");
    s->state = ST_HAVE;
    pthread_cond_signal(&s->cond);
    if ((call = atomic_load(&r->stall.has_handler))) {
      s->state = ST_DONE;
      atomic_store(&r->stall.pending, 0);
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (call)
    call_handler(L, &rep, t);
  else
    lua_pop(L, 1);
}

void lums_stall_flush(lvmrun *r, lua_State *L) {
  lstall *s = r->stall.state;
  if (!s) {
    atomic_store(&r->stall.pending, 0);
    return;
  }
  pthread_mutex_lock(&s->lock);
  bool call = false;
  ums_stall_t rep = s->report;
  /* Without a Lua handler the monitor thread prints, and clears the flag
  ** once it has. */
  bool mine = s->target == r;
  if (mine && (s->state == ST_WANT || s->state == ST_HAVE) &&
      atomic_load(&r->stall.has_handler)) {
    call = true;
    s->state = ST_DONE;
  }
  /* Not (or no longer) this VM's: a newer report went to another one. */
  if (!mine || s->state == ST_DONE || s->state == ST_NONE)
    atomic_store(&r->stall.pending, 0);
  pthread_mutex_unlock(&s->lock);
  if (call) {
    lua_pushnil(L);
    call_handler(L, &rep, NULL);
  }
}

/* core.on_stall(fn | nil): fn(info) for each stall; nil: the default. */
static int l_on_stall(lua_State *L) {
  if (!lua_isnoneornil(L, 1)) luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, ONSTALL_KEY);
  /* This VM's run, also outside its tasks (an init module that sets a
  ** handler for the VM lums.c keeps under "ums.run"). */
  ltask *t = lums_cur_task;
  lvmrun *r = t && t->vmrun ? t->vmrun : NULL;
  if (!r) {
    lua_getfield(L, LUA_REGISTRYINDEX, "ums.run");
    r = (lvmrun *)lua_touserdata(L, -1);
    lua_pop(L, 1);
  }
  if (r) atomic_store(&r->stall.has_handler, lums_stall_has_handler(L));
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Readers                                                                 */
/* ---------------------------------------------------------------------- */

/* The runtime of the calling task's run, or NULL outside one. */
static ums_runtime_t *current_rt(void) {
  ltask *t = lums_cur_task;
  return t && t->vmrun ? t->vmrun->rt : NULL;
}

static int no_run(lua_State *L, const char *fname) {
  lua_pushnil(L);
  lua_pushfstring(L, "ums.%s: not inside a run", fname);
  return 2;
}

static void set_int(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

static void set_num(lua_State *L, const char *k, lua_Number v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

static void set_bool(lua_State *L, const char *k, bool v) {
  lua_pushboolean(L, v);
  lua_setfield(L, -2, k);
}

static void set_str(lua_State *L, const char *k, const char *v) {
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

/* core.stats() -> rows: one per scheduler, then one per hidden pool. */
static int l_stats(lua_State *L) {
  ums_runtime_t *rt = current_rt();
  if (!rt) return no_run(L, "stats");
  int n = ums_runtime_schedulers(rt);
  ums_sched_stats_t *rows =
      (ums_sched_stats_t *)lua_newuserdatauv(L, (size_t)n * sizeof *rows, 0);
  n = ums_runtime_stats(rt, rows, n);
  ums_pool_stats_t pools[2];
  int np = ums_runtime_pool_stats(rt, pools, 2);
  lua_createtable(L, n + np, 0);
  for (int i = 0; i < n; i++) {
    const ums_sched_stats_t *r = &rows[i];
    lua_createtable(L, 0, 25);
    set_int(L, "id", r->id);
    set_bool(L, "hidden", false);
    set_bool(L, "idle", r->idle != 0);
    set_int(L, "tasks", (lua_Integer)r->tasks);
    set_int(L, "runnable", (lua_Integer)r->runnable);
    set_int(L, "workers_active", (lua_Integer)r->workers_active);
    set_int(L, "workers_idle", (lua_Integer)r->workers_idle);
    set_int(L, "pending", (lua_Integer)r->pending);
    set_int(L, "io_pending", (lua_Integer)r->io_pending);
    set_int(L, "timers", (lua_Integer)r->timers);
    set_int(L, "context_switches", (lua_Integer)r->context_switches);
    set_int(L, "yields", (lua_Integer)r->yields);
    set_int(L, "idle_switches", (lua_Integer)r->idle_waits);
    set_int(L, "preemptive_switches", (lua_Integer)r->preempt_calls);
    set_int(L, "preemptive_spun", (lua_Integer)r->preempt_spun);
    set_int(L, "preempt_pending", (lua_Integer)r->preempt_pending);
    set_int(L, "quantum_expiries", (lua_Integer)r->quantum_expiries);
    set_int(L, "stalls", (lua_Integer)r->stalls);
    set_int(L, "load_factor", (lua_Integer)r->load_factor);
    set_int(L, "tasks_spawned", (lua_Integer)r->tasks_spawned);
    set_int(L, "fiber_switches", (lua_Integer)r->fiber_switches);
    set_int(L, "io_requests", (lua_Integer)r->io_requests);
    if (r->running) {
      set_int(L, "running", (lua_Integer)r->running);
      set_str(L, "running_name", r->running_name);
    }
    lua_rawseti(L, -2, i + 1);
  }
  for (int i = 0; i < np; i++) {
    const ums_pool_stats_t *p = &pools[i];
    lua_createtable(L, 0, 14);
    set_int(L, "id", n + i);
    set_bool(L, "hidden", true);
    set_str(L, "name", p->name);
    set_bool(L, "idle", p->active == 0 && p->queued == 0);
    set_int(L, "pending", (lua_Integer)p->queued);
    set_int(L, "threads", (lua_Integer)p->threads);
    set_int(L, "workers_active", (lua_Integer)p->active);
    set_int(L, "workers_idle", (lua_Integer)p->idle);
    set_int(L, "completed", (lua_Integer)p->completed);
    set_int(L, "max_threads", (lua_Integer)p->max);
    set_bool(L, "exhausted", p->exhausted != 0);
    set_int(L, "exhaustions", (lua_Integer)p->episodes);
    lua_pushnumber(L, (lua_Number)p->oldest_wait_ns / 1e9);
    lua_setfield(L, -2, "oldest_wait");
    lua_pushnumber(L, (lua_Number)p->longest_wait_ns / 1e9);
    lua_setfield(L, -2, "longest_wait");
    lua_rawseti(L, -2, n + i + 1);
  }
  return 1;
}

/* What tostring gives for the object a wait of this type is on (a Lua
** primitive's __name and address), so that Lua code can compare. */
static const char *object_kind(int type) {
  switch (type) {
    case UMS_WAIT_MUTEX: return "ums.mutex";
    case UMS_WAIT_SEMAPHORE: return "ums.semaphore";
    case UMS_WAIT_EVENT: return "ums.event";
    case UMS_WAIT_COND: return "ums.cond";
    case UMS_WAIT_CHAN_SEND:
    case UMS_WAIT_CHAN_RECV: return "ums.channel";
    case UMS_WAIT_WAITGROUP: return "ums.waitgroup";
    case UMS_WAIT_JOIN: return "ums.task";
    default: return "object";
  }
}

/* Fills the table at the top with what the runtime knows of a task. */
static void push_info_fields(lua_State *L, const ums_task_info_t *info) {
  set_int(L, "id", (lua_Integer)info->id);
  set_str(L, "name", info->name);
  set_int(L, "scheduler", info->sched);
  set_str(L, "state", ums_task_state_name(info->state));
  if (info->spawner) set_int(L, "spawner", (lua_Integer)info->spawner);
  if (info->cpu_ns >= 0) set_num(L, "cpu_time", (lua_Number)info->cpu_ns / 1e9);
  if (info->wait_type == UMS_WAIT_NONE) return;
  set_str(L, "wait_type", ums_wait_type_name(info->wait_type));
  if (info->wait_ns >= 0)
    set_num(L, "wait_time", (lua_Number)info->wait_ns / 1e9);
  if (info->runnable_ns >= 0)
    set_num(L, "runnable_time", (lua_Number)info->runnable_ns / 1e9);
  if (info->wait_object) {
    lua_pushfstring(L, "%s: %p", object_kind(info->wait_type),
                    info->wait_object);
    lua_setfield(L, -2, "wait_object");
  }
  if (info->blocker) set_int(L, "blocker", (lua_Integer)info->blocker);
}

static int visit_task(const ums_task_info_t *info, void *arg) {
  lua_State *L = arg;
  lua_createtable(L, 0, 12);
  push_info_fields(L, info);
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
  return 0;
}

/* core.tasks() -> one row per live task of the run. */
static int l_tasks(lua_State *L) {
  ums_runtime_t *rt = current_rt();
  if (!rt) return no_run(L, "tasks");
  lua_newtable(L);
  ums_runtime_tasks(rt, visit_task, L);
  return 1;
}

static int by_total(const void *a, const void *b) {
  const ums_wait_stats_t *x = a, *y = b;
  return (x->total_ns < y->total_ns) - (x->total_ns > y->total_ns);
}

/* core.waits() -> one row per wait type seen, longest total first. */
static int l_waits(lua_State *L) {
  ums_runtime_t *rt = current_rt();
  if (!rt) return no_run(L, "waits");
  ums_wait_stats_t rows[UMS_WAIT_NTYPES];
  int n = ums_runtime_waits(rt, rows, UMS_WAIT_NTYPES);
  qsort(rows, (size_t)n, sizeof rows[0], by_total);
  lua_createtable(L, n, 0);
  int k = 0;
  for (int i = 0; i < n; i++) {
    const ums_wait_stats_t *w = &rows[i];
    if (!w->count) continue;
    lua_createtable(L, 0, 7);
    set_str(L, "type", w->name);
    set_int(L, "count", (lua_Integer)w->count);
    set_num(L, "total", (lua_Number)w->total_ns / 1e9);
    set_num(L, "max", (lua_Number)w->max_ns / 1e9);
    set_num(L, "signal", (lua_Number)w->signal_ns / 1e9);
    set_num(L, "resource", (lua_Number)(w->total_ns - w->signal_ns) / 1e9);
    set_num(L, "average", (lua_Number)w->total_ns / 1e9 / (lua_Number)w->count);
    lua_rawseti(L, -2, ++k);
  }
  return 1;
}

static int l_waits_reset(lua_State *L) {
  ums_runtime_t *rt = current_rt();
  if (!rt) return no_run(L, "waits_reset");
  ums_runtime_waits_reset(rt);
  lua_pushboolean(L, 1);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Deadlock reports                                                        */
/* ---------------------------------------------------------------------- */

struct ldeadlock {
  _Atomic(lrun *) run;   /* set once the VMs exist; NULL before */
  char *report;          /* [the scheduler thread that reports; read by
                            the run's thread after every scheduler thread
                            was joined] the first report */
};

ldeadlock *lums_deadlock_new(void) { return calloc(1, sizeof(ldeadlock)); }

void lums_deadlock_attach(ldeadlock *d, lrun *run) {
  if (d) atomic_store(&d->run, run);
}

char *lums_deadlock_take(ldeadlock *d) {
  if (!d) return NULL;
  char *r = d->report;
  d->report = NULL;
  return r;
}

void lums_deadlock_free(ldeadlock *d) {
  if (!d) return;
  free(d->report);
  free(d);
}

typedef struct dl_rows {
  ums_task_info_t *v;
  size_t n, cap;
} dl_rows;

static int dl_visit(const ums_task_info_t *info, void *arg) {
  dl_rows *rows = arg;
  if (info->state == UMS_TASK_DONE) return 0;
  if (rows->n == rows->cap) {
    size_t cap = rows->cap ? 2 * rows->cap : 16;
    ums_task_info_t *v = realloc(rows->v, cap * sizeof *v);
    if (!v) return 1;
    rows->v = v;
    rows->cap = cap;
  }
  rows->v[rows->n++] = *info;
  return 0;
}

/* Whether the row is a blocked task. Nothing can run in the state
** reported, but a reader that compares a task's wait stamps may show a
** parked one as runnable "after a wait": its wait type says it waits. */
static bool blocked(const ums_task_info_t *t) {
  return t->state == UMS_TASK_SUSPENDED ||
         (t->state == UMS_TASK_RUNNABLE && t->wait_type != UMS_WAIT_NONE);
}

/* Leaves a table id -> coroutine of the live tasks of r's VM (L is a
** thread of it) on top: their handles and coroutines sit in the anchor
** threads of the VM's slab (ltask.h) while they live. */
static void push_coroutines(lua_State *L, lvmrun *r) {
  lua_newtable(L);
  int map = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, r->anchors);
  for (lua_Integer c = 1; lua_rawgeti(L, map + 1, c) == LUA_TTHREAD; c++) {
    lua_State *A = lua_tothread(L, -1);
    lua_pop(L, 1);
    for (int idx = LUMS_ANCHOR_CO(0) + 1; idx <= lua_gettop(A); idx += 2) {
      lhandle *h = lua_type(A, idx) == LUA_TUSERDATA
                       ? (lhandle *)lua_touserdata(A, idx) : NULL;
      if (h && lua_rawlen(A, idx) == sizeof *h &&
          h->tag == &lums_task_tag && h->t && h->t->co) {
        lums_push_anchored(L, h->t, h->t->aidx);
        lua_rawseti(L, map, (lua_Integer)h->id);
      }
    }
  }
  lua_pop(L, 2);
}

/* A report lists each blocked task in full up to DL_GROUPS different
** ways of being blocked: tasks that wait for the same thing with the same
** traceback (a hundred thousand tasks on one event, say) share one entry
** that counts them and names a few, so the report stays readable and its
** size does not grow with the number of tasks. */
#define DL_GROUPS 32
#define DL_IDS 8

static int cmp_id(const void *a, const void *b) {
  ums_task_t x = *(const ums_task_t *)a, y = *(const ums_task_t *)b;
  return x < y ? -1 : x > y;
}

/* Pushes how t waits, without its id, name or scheduler: the part of an
** entry that tasks blocked the same way share. ids holds the live tasks'
** ids, sorted. */
static void push_wait(lua_State *L, const ums_task_info_t *t,
                      const ums_task_t *ids, size_t n) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "waits: %s", ums_wait_type_name(t->wait_type));
  luaL_addvalue(&b);
  if (t->wait_object) {
    lua_pushfstring(L, " on %s: %p", object_kind(t->wait_type),
                    t->wait_object);
    luaL_addvalue(&b);
  }
  if (t->blocker) {
    lua_pushfstring(L, ", held by task %I", (lua_Integer)t->blocker);
    luaL_addvalue(&b);
    /* A holder that is not among the live tasks ended holding it. */
    if (!ids || !bsearch(&t->blocker, ids, n, sizeof *ids, cmp_id))
      luaL_addstring(&b, ", which has ended");
  }
  luaL_pushresult(&b);
}

/* Pushes t's traceback, indented for the report. map: id -> coroutine of
** this VM's tasks. */
static void push_trace(lua_State *L, int map, const ums_task_info_t *t) {
  if (lua_rawgeti(L, map, (lua_Integer)t->id) == LUA_TTHREAD) {
    luaL_traceback(L, lua_tothread(L, -1), NULL, 0);
    lua_remove(L, -2);
    luaL_gsub(L, lua_tostring(L, -1), "\n", "\n    ");
    lua_remove(L, -2);
  } else {
    lua_pop(L, 1);
    lua_pushfstring(L, "(its traceback is in the VM of scheduler %d)",
                    t->sched);
  }
}

/* Builds the report of rows' blocked tasks on L, a thread of r's VM;
** leaves it on the stack. */
static void push_report(lua_State *L, lvmrun *r, const dl_rows *rows) {
  int top = lua_gettop(L);
  luaL_checkstack(L, 8, "deadlock report");
  push_coroutines(L, r);
  int map = lua_gettop(L);
  size_t nblocked = 0;
  ums_task_t *ids = malloc((rows->n ? rows->n : 1) * sizeof *ids);
  for (size_t i = 0; i < rows->n; i++) {
    nblocked += blocked(&rows->v[i]);
    if (ids) ids[i] = rows->v[i].id;
  }
  if (ids) qsort(ids, rows->n, sizeof *ids, cmp_id);
  /* groups: key (wait and traceback) -> index into the entry arrays:
  ** first (row of the first task), count, and the next few ids. */
  lua_newtable(L);
  int groups = lua_gettop(L);
  size_t ngroups = 0, first[DL_GROUPS], count[DL_GROUPS] = {0};
  ums_task_t more[DL_GROUPS][DL_IDS];
  size_t ungrouped = 0;
  for (size_t i = 0; i < rows->n; i++) {
    const ums_task_info_t *t = &rows->v[i];
    if (!blocked(t)) continue;
    push_wait(L, t, ids, rows->n);
    lua_pushliteral(L, "\n    ");
    push_trace(L, map, t);
    lua_concat(L, 3);
    lua_pushvalue(L, -1);
    if (lua_rawget(L, groups) == LUA_TNUMBER) {
      size_t g = (size_t)lua_tointeger(L, -1);
      if (count[g] <= DL_IDS) more[g][count[g] - 1] = t->id;
      count[g]++;
      lua_pop(L, 2);
    } else if (ngroups < DL_GROUPS) {
      lua_pop(L, 1);
      lua_pushinteger(L, (lua_Integer)ngroups);
      lua_rawset(L, groups);
      first[ngroups] = i;
      count[ngroups++] = 1;
    } else {
      lua_pop(L, 2);
      ungrouped++;
    }
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "ums.run: deadlock: %I task(s) blocked, and nothing "
                  "can wake them (no timer, no I/O or C call in flight):",
                  (lua_Integer)nblocked);
  luaL_addvalue(&b);
  for (size_t g = 0; g < ngroups; g++) {
    const ums_task_info_t *t = &rows->v[first[g]];
    lua_pushfstring(L, "\n  task %I", (lua_Integer)t->id);
    luaL_addvalue(&b);
    if (t->name[0]) {
      lua_pushfstring(L, " '%s'", t->name);
      luaL_addvalue(&b);
    }
    lua_pushfstring(L, " (scheduler %d) ", t->sched);
    luaL_addvalue(&b);
    push_wait(L, t, ids, rows->n);
    lua_pushliteral(L, "\n    ");
    push_trace(L, map, t);
    lua_concat(L, 3);
    luaL_addvalue(&b);
    if (count[g] > 1) {
      lua_pushfstring(L, "\n  and %I more task(s) blocked the same way, "
                      "with the same traceback:",
                      (lua_Integer)(count[g] - 1));
      luaL_addvalue(&b);
      size_t shown = count[g] - 1 < DL_IDS ? count[g] - 1 : DL_IDS;
      for (size_t k = 0; k < shown; k++) {
        lua_pushfstring(L, " %I", (lua_Integer)more[g][k]);
        luaL_addvalue(&b);
      }
      if (count[g] - 1 > shown) luaL_addstring(&b, " ...");
    }
  }
  if (ungrouped) {
    lua_pushfstring(L, "\n  and %I more task(s) blocked in other ways "
                    "(ums.tasks() lists every task)", (lua_Integer)ungrouped);
    luaL_addvalue(&b);
  }
  luaL_pushresult(&b);
  free(ids);
  lua_replace(L, top + 1);
  lua_settop(L, top + 1);
}

/* Runs on the thread of scheduler sched, in its pass, while every
** scheduler of the run is idle and nothing can wake a task: this VM is
** this thread's, and the others do not run until something is posted to
** them (the cancels at the end). */
void lums_deadlock_cb(ums_runtime_t *rt, int sched, void *arg) {
  ldeadlock *d = arg;
  lrun *run = d ? atomic_load(&d->run) : NULL;
  lvmrun *vr = run ? lums_run_at(run, sched) : NULL;
  if (!vr) return;
  dl_rows rows = {0};
  ums_runtime_tasks(rt, dl_visit, &rows);
  if (!d->report) {
    lua_State *L = vr->SL;
    int top = lua_gettop(L);
    push_report(L, vr, &rows);
    size_t len;
    const char *text = lua_tolstring(L, -1, &len);
    d->report = malloc(len + 1);
    if (d->report) memcpy(d->report, text, len + 1);
    lua_settop(L, top);
  }
  /* After the report: a cancelled task may run at once. */
  for (size_t i = 0; i < rows.n; i++) ums_task_cancel(rt, rows.v[i].id);
  free(rows.v);
}

/* task:info() -> a table like a row of ums.tasks(), plus traceback. */
static int l_task_info(lua_State *L) {
  lhandle *h = lums_to_task(L, 1);
  if (!h)
    return luaL_typeerror(L, 1, "ums.task");
  lua_settop(L, 1);
  lua_createtable(L, 0, 14);
  ltask *me = lums_cur_task;
  ltask *t = h->t;
  ums_task_info_t info;
  if (h->state != T_DONE && t && t->vmrun &&
      ums_task_info(t->vmrun->rt, h->id, &info) == 0) {
    push_info_fields(L, &info);
    if (t == me) set_str(L, "state", "running");
    /* Only from the task's own VM, on the thread running it (the caller
    ** is a task of that run). */
    if (me && me->vmrun == t->vmrun) {
      if (t == me)
        luaL_traceback(L, L, NULL, 1);
      else if (t->co)
        luaL_traceback(L, t->co, NULL, 0);
      else  /* a lazy spawn's, not started: no frame, as on a new one */
        lua_pushliteral(L, "stack traceback:");
      lua_setfield(L, -2, "traceback");
    }
    return 1;
  }
  set_int(L, "id", (lua_Integer)h->id);
  if (lums_handle_get_extras(L, 1) == LUA_TTABLE)
    lua_getfield(L, -1, X_NAME);
  else
    lua_pushnil(L);
  lua_setfield(L, 2, "name");
  lua_settop(L, 2);
  /* Finished (a live handle the runtime no longer knows is finishing). */
  set_str(L, "state", h->state == T_DONE && !h->ok
                          ? (h->cancelled ? "cancelled" : "error")
                          : "done");
  return 1;
}

void lums_open_stats(lua_State *L) {
  static const luaL_Reg funcs[] = {{"stats", l_stats},
                                   {"tasks", l_tasks},
                                   {"waits", l_waits},
                                   {"waits_reset", l_waits_reset},
                                   {"on_stall", l_on_stall},
                                   {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  /* core.WAIT: wait type names to the values core.park_begin takes. */
  lua_createtable(L, 0, UMS_WAIT_NTYPES);
  for (int i = UMS_WAIT_NONE + 1; i < UMS_WAIT_NTYPES; i++) {
    lua_pushinteger(L, i);
    lua_setfield(L, -2, ums_wait_type_name(i));
  }
  lua_setfield(L, -2, "WAIT");
  /* task:info(), beside the task methods of ltask.c. */
  lums_task_metatable(L);
  lua_getfield(L, -1, "__index");
  lua_pushcfunction(L, l_task_info);
  lua_setfield(L, -2, "info");
  lua_pop(L, 2);
}
