/*
** lquantum.c: the quantum of Lua tasks. Cooperative by default: the
** monitor thread marks a step that has run for a whole quantum, and the
** task yields at its next call that can wait (the yield points,
** LUMS_YIELD_POINT). With preemption on (ums.config{preempt = true}),
** the monitor also signals the VM's thread, whose handler sets a count
** hook on the running coroutine (qhook), the way lua.c handles Ctrl-C;
** until that happens no hook is set, so Lua runs at full speed (any
** count hook sends every instruction through the hook machinery in Lua
** 5.4). Go preempts goroutines with the same signal. The same hook
** delivers stall reports (lstats.c) and keeps the user's own hooks
** working (debug.gethook and debug.sethook as a task sees them).
**
** Threads: a VM's lquantum is written by its scheduler thread (the Lua
** thread) and read by the run's monitor thread (struct lmonitor); the
** signal handler runs on the Lua thread. Each field says which.
*/
#define _GNU_SOURCE
#include "lquantum.h"
#include "lums.h"
#include "lstats.h"
#include "ltask.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define QUANTUM_SIGNAL SIGURG
#ifdef LUMS_QUANTUM_POLL
#define QUANTUM_POLL_COUNT 1000
#endif
/* Hook period while a preemption waits for a point where it may yield. */
#define QUANTUM_RETRY_COUNT 100

_Thread_local ltask *lums_cur_task;

/* The VM whose tasks this scheduler thread runs, for the signal handler.
** Initial-exec like lums_cur_task: the first use of a dlopen'ed module's
** dynamic TLS may allocate, which a signal handler must not do. */
static _Thread_local lquantum *thread_quantum
    __attribute__((tls_model("initial-exec")));

/* The nopreempt chunks of one VM (core.nopreempt_chunk), in a userdata
** under this registry key. The sources are compared by address; their
** functions are anchored in the registry, which keeps them alive. */
#define NOPREEMPT_KEY "ums.nopreempt.sources"
#define NOPREEMPT_MAX 8
struct lnopreempt {
  const char *src[NOPREEMPT_MAX];
  int n;
};

typedef struct qwatch qwatch;

/* What the quantum's looks (quantum_look, on the runtime's monitor
** thread) watch: every VM of one run. Made and freed by the run's owner
** (lums.c's run, or lhost.c for a hosted run). */
struct lmonitor {
  ums_runtime_t *rt;               /* [const] */
  int n;                           /* [const] VMs the run may have */
  int64_t quantum;                 /* [const] ns */
  _Atomic(lquantum *) *vm;         /* [n; each set once by
                                      lums_quantum_init, before the VM's
                                      first step] */
  qwatch *watch;                   /* [n; the monitor thread's] */
  /* Without preemption the looks start with the run's second task (a
  ** lone task has nobody to yield to). */
  _Atomic bool deferred;
};

void lums_quantum_init(lquantum *q, lua_State *L, lmonitor *m, int sched,
                       int64_t quantum, bool preempt,
                       void (*stall_hook)(lua_State *, ltask *)) {
  q->quantum = quantum;
  q->preempt = preempt;
  q->stall_hook = stall_hook;
  /* No step is past its quantum yet (step_seq counts from 0). */
  atomic_store(&q->preempt_seq, UINT64_MAX);
  lua_getfield(L, LUA_REGISTRYINDEX, NOPREEMPT_KEY);
  q->nopreempt = (lnopreempt *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (m && sched >= 0 && sched < m->n) {
    q->watch = m;
    atomic_store_explicit(&m->vm[sched], q, memory_order_release);
  }
}

void lums_quantum_bind_thread(lquantum *q) {
  q->lua_thread = pthread_self();
  thread_quantum = q;
  atomic_store(&q->lua_thread_known, 1);
}

void lums_quantum_leave_thread(void) {
  lums_cur_task = NULL;
  thread_quantum = NULL;
}

static void qhook(lua_State *L, lua_Debug *ar);

/* Makes t current again on this thread: after a blocking wait, other
** steps have run on other workers of this thread meanwhile. */
void lums_before_block(ltask *t) {
  if (t && t->vmrun)
    atomic_store_explicit(&t->vmrun->q.running_co, NULL, memory_order_relaxed);
}

void lums_become_current(ltask *t) {
  lums_cur_task = t;
  if (t->vmrun) {
    atomic_store_explicit(&t->vmrun->q.running_co, t->co, memory_order_relaxed);
  }
}

/* Chunks the quantum never interrupts (core.nopreempt_chunk): Lua code
** that relies on running atomically between its waits, such as ums.sync.
** Only the function running now is looked at, so that the check costs the
** same at any stack depth: a nopreempt chunk is atomic in its own
** functions and in the C functions it calls (a count hook fires in Lua
** functions only), not in Lua functions of other chunks it calls.
** Each VM has its own list (struct lnopreempt), read by its own thread.
** A chunk is known by its source name's text: Lua interns only short
** strings, so a module loaded again from a path longer than that (an
** install under /usr/local/share/lua/5.4/, a reload by busted's
** insulate) has the same name in a new string. */
static bool same_source(const char *a, const char *b) {
  return a == b || strcmp(a, b) == 0;
}

static bool in_nopreempt_chunk(lua_State *L, const lnopreempt *np) {
  lua_Debug d;
  if (!np || np->n == 0 || !lua_getstack(L, 0, &d)) return false;
  lua_getinfo(L, "S", &d);
  for (int i = 0; i < np->n; i++)
    if (same_source(d.source, np->src[i])) return true;
  return false;
}

/* core.nopreempt_chunk(): the calling function's chunk is never preempted. */
static int l_nopreempt_chunk(lua_State *L) {
  lua_Debug d;
  if (!lua_getstack(L, 1, &d) || !lua_getinfo(L, "Sf", &d))
    return luaL_error(L, "ums.nopreempt_chunk: no calling function");
  lua_getfield(L, LUA_REGISTRYINDEX, NOPREEMPT_KEY);
  lnopreempt *np = (lnopreempt *)lua_touserdata(L, -1);
  lua_pop(L, 1);  /* the registry anchors it */
  if (!np) return luaL_error(L, "ums.nopreempt_chunk: ums.core not open");
  for (int i = 0; i < np->n; i++)
    if (same_source(np->src[i], d.source)) return 0;
  if (np->n == NOPREEMPT_MAX)
    return luaL_error(L, "ums.nopreempt_chunk: too many chunks");
  lua_getfield(L, LUA_REGISTRYINDEX, "ums.nopreempt");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, "ums.nopreempt");
  }
  lua_pushvalue(L, -2);  /* the function: keeps its Proto's source alive */
  lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
  np->src[np->n++] = d.source;
  return 0;
}

/* ums's own hook on a task's coroutine (qhook, for a preemption or a
** stall report) comes and goes; the user's hook stays. hook_arm puts
** qhook on t->co as a count hook of `count`, first saving in t the
** hook the user has there; qhook forwards the user's events to it and
** calls it at its own count. lums_hook_disarm puts the user's hook back. They
** run on the Lua thread, hook_arm also in the signal handler (lua_sethook
** is what lua.c's own SIGINT handler calls); t->hook.uhook is kept after a
** disarm so that a signal between the two stores still saves the user's
** hook, not ums's. */
static void hook_set(lua_State *L, ltask *t) {
  int n = t->hook.qleft;
  int mask = LUA_MASKCOUNT;
  if (t->hook.uhook) {
    mask |= t->hook.umask & ~LUA_MASKCOUNT;
    if ((t->hook.umask & LUA_MASKCOUNT) && t->hook.ucount > 0 &&
        t->hook.uleft < n)
      n = t->hook.uleft;
  }
  lua_sethook(L, qhook, mask, n);
}

static void hook_arm(lua_State *L, ltask *t, int count) {
  if (lua_gethook(L) != qhook) {
    t->hook.uhook = lua_gethook(L);
    t->hook.umask = lua_gethookmask(L);
    t->hook.ucount = lua_gethookcount(L);
    t->hook.uleft = t->hook.ucount;
  }
  t->hook.qleft = count;
  hook_set(L, t);
}

#ifdef LUMS_QUANTUM_POLL
/* A qhook left on by its own yield (lums_hook_step_end) stays as it is:
** setting a hook resets its count, and the resumed instruction must see
** the count run out to erase Lua's mark. */
void lums_quantum_poll(ltask *t) {
  if (lua_gethook(t->co) != qhook) hook_arm(t->co, t, QUANTUM_POLL_COUNT);
}
#endif

/* A yield from a hook leaves a mark on the coroutine's running function
** (Lua's CIST_HOOKYIELD) that tells the count or line hook of the
** instruction run again at the resume that it was called already; Lua
** erases it there only if the hook is still on then. After qhook
** yielded, then, qhook stays (its count ran out: it sees the resumed
** instruction): a mark left on would swallow the first event of a line
** or count hook the user sets later in that function. */
void lums_hook_step_end(lua_State *L, ltask *t) {
  if (t->hook.yielded)
    t->hook.yielded = false;
  else
    lums_hook_disarm(L, t);
}

void lums_hook_disarm(lua_State *L, ltask *t) {
  t->hook.qsig = 0;
  t->hook.busy = 0;
  t->hook.deferred = 0;
  if (lua_gethook(L) == qhook)
    lua_sethook(L, t->hook.uhook, t->hook.umask, t->hook.ucount);
}

/* debug.gethook and debug.sethook as a task sees them: while qhook is on
** the running task's coroutine, the hook, mask and count the user set
** there are read and written, and qhook stays. The debug library's own
** functions (upvalue 1) do the work, with the user's hook put back for
** the time of the call.
**
** A C function of the debug library is called in this function's own
** frame, not through lua_call: Lua code then sees one call, as without
** ums. A hook set by debug.sethook gets the events Lua gives it (its
** first is the return from sethook, named "sethook" as the caller named
** it), an argument error names the function the caller called, and a
** profiler that counts calls and returns stays balanced. Anything else
** found in debug.sethook before lums_open is called with lua_pcall.
**
** The quantum's signal handler puts qhook on the task's coroutine
** (hook_arm) whenever it fires. While one of these functions is at the
** hook it leaves that to the function (hook.busy, see quantum_signal):
** otherwise a gethook could read qhook and its count, and a sethook
** would overwrite the qhook just armed, losing the preemption, or be
** interrupted between its stores, leaving a hook with another hook's
** mask. The handler runs on this thread, so compiler fences order the
** flag with the hook's fields. A sethook whose arguments it refuses
** raises before touching the hook: it runs without the flag, so that the
** error cannot leave the handler deferring. Only a memory error inside
** the debug library's function can; the step's end clears the flag
** (lums_hook_disarm), as does the task's end. */

/* Whether debug.sethook, given what is on L's stack, goes as far as
** setting a hook: its own checks (ldblib.c's db_sethook), in its order. */
static bool sethook_sets(lua_State *L) {
  int arg = lua_isthread(L, 1) ? 1 : 0;
  if (lua_isnoneornil(L, arg + 1)) return true;
  if (!lua_isstring(L, arg + 2) || !lua_isfunction(L, arg + 1))
    return false;
  if (lua_isnoneornil(L, arg + 3)) return true;
  int isnum;
  (void)lua_tointegerx(L, arg + 3, &isnum);
  return isnum;
}

static int hook_call(lua_State *L, bool setting) {
  lua_CFunction f = lua_tocfunction(L, lua_upvalueindex(1));
  lua_State *L1 = lua_isthread(L, 1) ? lua_tothread(L, 1) : L;
  ltask *t = lums_cur_task;
  bool own = t && L1 == t->co;
  if (f && (!own || (setting && !sethook_sets(L)))) return f(L);
  if (own) {
    t->hook.busy = 1;
    atomic_signal_fence(memory_order_seq_cst);
  }
  bool swap = own && lua_gethook(L1) == qhook;
  if (swap) lua_sethook(L1, t->hook.uhook, t->hook.umask, t->hook.ucount);
  int st = LUA_OK, nres;
  if (f) {
    nres = f(L);
  } else {
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    /* Protected, so that an error cannot leave the handler deferring. */
    st = lua_pcall(L, n, LUA_MULTRET, 0);
    nres = lua_gettop(L);
  }
  if (swap) {
    /* qhook had an errand (a preemption, a look): it goes on, over
    ** whatever hook the user has now. A gethook leaves the user's hook
    ** as it was; a sethook's new one is saved by hook_arm. */
    if (setting)
      hook_arm(L1, t, t->hook.qleft > 0 ? t->hook.qleft : 1);
    else if (lua_gethook(L1) == t->hook.uhook)
      hook_set(L1, t);
  }
  if (own) {
    atomic_signal_fence(memory_order_seq_cst);
    t->hook.busy = 0;
    atomic_signal_fence(memory_order_seq_cst);
    /* A signal that came during the call: its errand is done now. One
    ** that comes after the flag was cleared arms qhook itself. */
    if (t->hook.deferred) {
      t->hook.deferred = 0;
      hook_arm(L1, t, 1);
    }
  }
  if (st != LUA_OK) return lua_error(L);
  return nres;
}

static int l_gethook(lua_State *L) { return hook_call(L, false); }

static int l_sethook(lua_State *L) { return hook_call(L, true); }

static void wrap_hook_fn(lua_State *L, const char *name, lua_CFunction f) {
  if (lua_getfield(L, -1, name) == LUA_TFUNCTION &&
      lua_tocfunction(L, -1) != f) {
    lua_pushcclosure(L, f, 1);
    lua_setfield(L, -2, name);
  } else {
    lua_pop(L, 1);
  }
}

static void wrap_debug_hooks(lua_State *L) {
  int top = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
  if (lua_getfield(L, -1, "debug") == LUA_TTABLE) {
    wrap_hook_fn(L, "gethook", l_gethook);
    wrap_hook_fn(L, "sethook", l_sethook);
  }
  lua_settop(L, top);
}

/* ums's errand once its count has run out: a stall report, then, with
** preempt on and the step past its quantum, a yield. It yields only from
** the task's own coroutine, where Lua can yield, outside a begun park and
** outside nopreempt chunks; elsewhere it checks again shortly. */
static void quantum_fire(lua_State *L, ltask *t, bool at_line) {
  lvmrun *r = t->vmrun;
  if (lums_stall_pending(&r->stall)) r->q.stall_hook(L, t);
  if (!r->q.preempt || !lums_quantum_due(t)) {
#ifdef LUMS_QUANTUM_POLL
    hook_arm(L, t, QUANTUM_POLL_COUNT);
#else
    lums_hook_disarm(L, t);
#endif
    return;
  }
  /* A task that computes without ever waiting learns of its cancellation
  ** here, the first time its quantum runs out; raising is allowed even
  ** where yielding is not. */
  if (ums_cancelled() && !t->park.begun &&
      !in_nopreempt_chunk(L, r->q.nopreempt)) {
    lums_hook_disarm(L, t);
    lums_raise_cancelled(L);
    return;
  }
  if (t->park.begun || !lua_isyieldable(L) ||
      in_nopreempt_chunk(L, r->q.nopreempt)) {
    hook_arm(L, t, QUANTUM_RETRY_COUNT);
    return;
  }
  /* Lua calls the line hook of an instruction after its count hook, and
  ** after a yield from either it runs the instruction again with no hook
  ** at all: a yield at the count event would take the user's line event
  ** with it. With the user's line hook on, the yield waits for the next
  ** line event (qsig), which qhook hands to the user's hook first. */
  if (!at_line && t->hook.uhook && (t->hook.umask & LUA_MASKLINE)) {
    t->hook.qsig = 1;
    hook_arm(L, t, QUANTUM_RETRY_COUNT);
    return;
  }
  /* qhook stays until the step has ended (task_step puts the user's hook
  ** back): Lua may still call the line hook before it leaves, and only
  ** qhook knows to do nothing then. */
  atomic_fetch_add_explicit(&r->q.preemptions, 1, memory_order_relaxed);
  ums_quantum_expired();
  t->park.parking = false;
  t->hook.yielded = true;
  lua_yield(L, 0);
}

static void qhook(lua_State *L, lua_Debug *ar) {
  ltask *t = lums_cur_task;
  if (!t || L != t->co || !t->vmrun) {
    /* A coroutine the task made while qhook was on it inherited qhook
    ** (lua_newthread copies the hook): it gets the hook qhook stood for,
    ** as it would have inherited it without ums. */
    if (t && t->vmrun && L != t->co)
      lua_sethook(L, t->hook.uhook, t->hook.umask, t->hook.ucount);
    else
      lua_sethook(L, NULL, 0, 0);
    return;
  }
  /* Lua calls the line hook after a count hook that yielded, before it
  ** leaves: nothing may run then. Without a line hook of the user's
  ** nothing is lost (quantum_fire). */
  if (lua_status(L) == LUA_YIELD) return;
  int ran = ar->event == LUA_HOOKCOUNT ? lua_gethookcount(L) : 0;
  if (t->hook.uhook &&
      (ar->event != LUA_HOOKCOUNT ||
       ((t->hook.umask & LUA_MASKCOUNT) && t->hook.ucount > 0 &&
        (t->hook.uleft -= ran) <= 0))) {
    if (ar->event == LUA_HOOKCOUNT) t->hook.uleft = t->hook.ucount;
    t->hook.uhook(L, ar);
    /* The user's hook may have set another: that one is the user's now. */
    if (lua_gethook(L) != qhook) {
      hook_arm(L, t, t->hook.qleft - ran > 0 ? t->hook.qleft - ran : 1);
      return;
    }
  }
  if (ar->event != LUA_HOOKCOUNT) {
    /* The count the signal handler set may be lost: with a line hook on,
    ** Lua decrements the hook count at every instruction, and a store
    ** made between its read and its write is overwritten. The next line
    ** event carries the errand then (a line hook may yield, as a count
    ** hook may). */
    if (ar->event == LUA_HOOKLINE && t->hook.qsig) {
      t->hook.qsig = 0;
      quantum_fire(L, t, true);
    }
    return;
  }
  if ((t->hook.qleft -= ran) > 0) {
    hook_set(L, t);
    return;
  }
  t->hook.qsig = 0;
  quantum_fire(L, t, false);
}

int lums_quantum_again_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return ((lua_CFunction)ctx)(L);
}

int lums_quantum_yield(lua_State *L, lua_KContext ctx, lua_KFunction k) {
  ltask *t = lums_cur_task;
  lvmrun *r = t->vmrun;
  if (t->park.begun) return -1;
  atomic_fetch_add_explicit(&r->q.preemptions, 1, memory_order_relaxed);
  ums_quantum_expired();
  if (L == t->co && lua_isyieldable(L)) {
    t->park.parking = false;
    return lua_yieldk(L, 0, ctx, k);
  }
  /* Where Lua cannot yield, the task's worker yields instead (as
  ** ums.yield does there) and the call goes on afterwards. The task's
  ** time then counts as a new step, for the monitor and for the next
  ** yield point alike. */
  lums_before_block(t);
  (void)ums_yield();
  lums_become_current(t);
  atomic_store_explicit(
      &r->q.step_seq,
      atomic_load_explicit(&r->q.step_seq, memory_order_relaxed) + 1,
      memory_order_relaxed);
  return -1;
}

/* core.quantum_point(): the yield point of a wait written in Lua (ums.sync),
** called before it looks at its object, on the path that need not wait
** too. */
static int l_quantum_point(lua_State *L) {
  LUMS_YIELD_POINT(L, l_quantum_point);
  return 0;
}

/* Runs on the Lua thread, anywhere in it: arms qhook on the running
** task's coroutine (see hook_arm). */
static void quantum_signal(int sig) {
  lquantum *q = thread_quantum;
  ltask *t = lums_cur_task;
  (void)sig;
  if (!q || !t) return;
  lua_State *co = atomic_load_explicit(&q->running_co, memory_order_relaxed);
  if (co && co == t->co) {
    t->hook.qsig = 1;
    if (t->hook.busy)
      t->hook.deferred = 1;  /* hook_call arms qhook once it is done */
    else
      hook_arm(co, t, 1);
  }
}

/* What the looks remember of one VM between them. */
struct qwatch {
  uint64_t seen_seq, signalled_seq;
  int64_t seen_at;
};

/* One look at VM v (see quantum_look). A step past its quantum is
** marked (preempt_seq), which its next call that can wait reads; with
** preempt on it is also signalled, to yield at any instruction. */
static void quantum_check(lquantum *v, qwatch *w, int64_t now,
                          int64_t period) {
  uint64_t seq = atomic_load_explicit(&v->step_seq, memory_order_relaxed);
  bool running = atomic_load_explicit(&v->running_co,
                                      memory_order_relaxed) != NULL;
  if (seq != w->seen_seq || !running) {
    w->seen_seq = seq;
    w->seen_at = now;
  } else if (now - w->seen_at >= v->quantum - period / 2 &&
             seq != w->signalled_seq &&
             atomic_load(&v->lua_thread_known)) {
    w->signalled_seq = seq;
    atomic_store_explicit(&v->preempt_seq, seq, memory_order_relaxed);
#ifndef LUMS_QUANTUM_POLL
    if (v->preempt) pthread_kill(v->lua_thread, QUANTUM_SIGNAL);
#endif
  }
}

/* Looks every half quantum at the step running in each VM of the run
** (the runtime's monitor thread calls it, while some scheduler is busy);
** once the same step has been seen for a whole quantum, marks it, once
** (a step blocked in a long C call is not signalled again, so it sees at
** most one EINTR). A step is thus found past its quantum between one and
** one and a half quanta after it began. */
static void quantum_look(void *arg, int64_t now) {
  lmonitor *m = arg;
  int64_t period = m->quantum / 2;
  for (int i = 0; i < m->n; i++) {
    lquantum *v = atomic_load_explicit(&m->vm[i], memory_order_acquire);
    if (v) quantum_check(v, &m->watch[i], now, period);
  }
}

static void install_quantum_signal(void) {
  static atomic_int done;
  if (atomic_exchange(&done, 1)) return;
  struct sigaction old, sa;
  sigaction(QUANTUM_SIGNAL, NULL, &old);
  if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) return;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = quantum_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(QUANTUM_SIGNAL, &sa, NULL);
}

lmonitor *lums_monitor_new(ums_runtime_t *rt, int nsched, int64_t quantum,
                           bool defer, bool stall, int *err) {
  lmonitor *m = calloc(1, sizeof *m);
  *err = 0;
  if (!m) return NULL;
  size_t n = (size_t)(nsched > 0 ? nsched : 1);
  m->vm = calloc(n, sizeof *m->vm);
  m->watch = calloc(n, sizeof *m->watch);
  if (!m->vm || !m->watch) {
    lums_monitor_free(m);
    return NULL;
  }
  m->rt = rt;
  m->n = nsched;
  m->quantum = quantum;
  /* The signal also serves stall reports (lums_request_hook). */
  if (quantum <= 0 && !stall) return m;
  install_quantum_signal();
  if (quantum <= 0) return m;
  /* Without preemption the looks only mark a step past its quantum for
  ** the yield points, which matters once another task may want to run:
  ** lums_monitor_want starts them then, so that a run of one task (a
  ** test body) pays for none. */
  atomic_store(&m->deferred, defer);
  int e = ums_runtime_watch(rt, quantum_look, m, defer ? 0 : quantum / 2);
  if (e) {
    /* Without the looks a task that computes is never made to yield,
    ** cannot be cancelled and is never reached by a stall report's
    ** hook, so the caller refuses to run rather than go on without. */
    *err = e;
    lums_monitor_free(m);
    return NULL;
  }
  return m;
}

void lums_monitor_want(lquantum *q) {
  lmonitor *m = q->watch;
  if (m && atomic_load_explicit(&m->deferred, memory_order_relaxed) &&
      atomic_exchange(&m->deferred, false))
    ums_runtime_watch_period(m->rt, m->quantum / 2);
}

void lums_monitor_free(lmonitor *m) {
  if (!m) return;
  free(m->vm);
  free(m->watch);
  free(m);
}

void lums_request_hook(lquantum *q) {
#ifndef LUMS_QUANTUM_POLL
  /* With preemption, the quantum monitor has signalled this long step
  ** already, and its hook (qhook) looks for stall reports: a second
  ** signal would only interrupt a blocking call once more. Under TSan the
  ** poll hook of every step looks for them. */
  if (!(q->preempt && q->quantum > 0) &&
      atomic_load(&q->lua_thread_known))
    pthread_kill(q->lua_thread, QUANTUM_SIGNAL);
#else
  (void)q;
#endif
}

void lums_open_quantum(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"nopreempt_chunk", l_nopreempt_chunk},
      {"quantum_point", l_quantum_point},
      {NULL, NULL}};
  wrap_debug_hooks(L);
  if (lua_getfield(L, LUA_REGISTRYINDEX, NOPREEMPT_KEY) == LUA_TNIL) {
    lnopreempt *np = lua_newuserdatauv(L, sizeof *np, 0);
    memset(np, 0, sizeof *np);
    lua_setfield(L, LUA_REGISTRYINDEX, NOPREEMPT_KEY);
  }
  lua_pop(L, 1);
  luaL_setfuncs(L, funcs, 0);
}
