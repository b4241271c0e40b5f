/*
** lums.c: the ums.core Lua module. Lua tasks are coroutines run as ums
** step tasks; every wait is a park (ums_park_begin) that ends either with
** lua_yieldk back to the step function (the fast path: the task's own
** coroutine, where Lua can yield) or, where Lua cannot yield (a C call
** without continuation, a metamethod, the user's own coroutine), with
** ums_park_wait, which binds the worker to the task while another worker
** runs the scheduler (docs/design/architecture.md, "Tasks, workers and
** the cooperative rule"; docs/design/trace.md follows one task).
**
** This file holds a task's life cycle (spawn, step, finish, the pool of
** coroutines), runs (ums.run) and the module setup; the quantum and its
** monitor are lquantum.c's, parking lpark.c's, the Lua calls on tasks and
** their handles ltask.c's ("Binding files" in
** docs/design/architecture.md).
**
** Threads: each VM of a run belongs to one scheduler (the caller's VM to
** scheduler 0, the others to theirs: lvm.c) and its tasks run there; the
** main thread is blocked inside core.run for the whole run, so a VM is
** only ever touched by one thread at a time. Each VM's own Lua thread
** (r->SL) does the binding's Lua work on the scheduler side (results,
** tracebacks); the main thread's stack is never touched while the run is
** in progress.
**
** See CORE-API.md for the Lua-facing contract.
*/
#define _GNU_SOURCE
#include "lums.h"
#include "lalloc.h"
#include "lintr.h"
#include "lpark.h"
#include "lstats.h"
#include "ltask.h"
#include "lvm.h"

#include <dlfcn.h>
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUN_KEY "ums.run"
#define CONFIG_KEY "ums.config"
#define ONERROR_KEY "ums.on_error"
#define ERRORS_KEY "ums.errors"
/* What a VM keeps between its runs (lkept, below). */
#define KEPT_KEY "ums.kept"
#define FAILED_MT "ums.task.failed"

/* Lua's C stack needs room for LUAI_MAXCCALLS nested C calls; fiber stacks
** for Lua runs are larger than the C default. Untouched pages cost nothing. */
#define LUA_STACK_SIZE (1024 * 1024)
/* Finished coroutines kept for reuse. */
#define POOL_MAX 4096
/* Of those, how many a VM keeps for its next run: enough for the tasks
** of a test, without holding a big run's coroutines for the process. */
#define KEPT_POOL_MAX 64

/* A VM's ltask records are made LTASK_CHUNK at a time (ltask.h) and
** numbered across their chunks (ltask.slot): a spawn takes one off a
** free list or bumps a count instead of calling malloc, and a task's end
** puts it back instead of calling free. The slot also names the record's
** two entries in its chunk's anchor thread (ltask.h), which keep its
** coroutine and its live handle from the collector; storing at a known
** index costs a fraction of luaL_ref and luaL_unref, which look for a
** free registry slot in Lua. A chunk's entries are made with the chunk
** (nil when empty), so that storing a task's values never allocates. */

/* What a VM keeps from one run to the next, in a registry userdata
** (KEPT_KEY) whose user value anchors SL: the scheduler-side thread, its
** ltask records with the anchor table, and up to KEPT_POOL_MAX pooled
** tasks. Between runs the VM's thread owns them; during a run its lvmrun
** does (lums_vmrun_new takes the pool, lums_vmrun_free gives it back, and
** the run's tasks take and give back records), and they are freed with
** the VM. */
struct lkept {
  lua_State *SL;
  ltask **pool;
  int npool, cappool;
  ltask **chunks;        /* capchunks entries: nchunks chunks of
                            LTASK_CHUNK records, then NULL */
  lua_State **athreads;  /* capchunks entries: each chunk's anchor
                            thread (ltask.h), which the anchor table
                            anchors */
  int nchunks, capchunks;
  int nslots;            /* records handed out so far, in use or free */
  int *free;             /* slots of free records (no coroutine), taken
                            last in, first out; room for every record of
                            capchunks chunks, so that freeing never
                            fails */
  int nfree;
  int anchors;           /* registry ref of the anchor table: the
                            chunks' anchor threads at 1..nchunks */
};

/* ---------------------------------------------------------------------- */
/* Helpers                                                                 */
/* ---------------------------------------------------------------------- */

static lvmrun *get_run(lua_State *L) {
  lvmrun *r;
  lua_getfield(L, LUA_REGISTRYINDEX, RUN_KEY);
  r = (lvmrun *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  return r;
}

/* ---------------------------------------------------------------------- */
/* Task life cycle                                                         */
/* ---------------------------------------------------------------------- */

static ltask *slot_record(lkept *k, int slot) {
  return &k->chunks[slot / LTASK_CHUNK][slot % LTASK_CHUNK];
}

/* Pushes a new anchor thread (ltask.h) onto L: every entry nil, with
** room for the two values above them that take_task puts there before
** it stores them. Raises when out of memory. */
static lua_State *push_anchor_thread(lua_State *L) {
  lua_State *A = lua_newthread(L);
  if (!lua_checkstack(A, LUMS_ANCHOR_TOP + 2))
    luaL_error(L, "ums.spawn: out of memory");
  lua_settop(A, LUMS_ANCHOR_TOP);
  return A;
}

/* Adds a chunk of LTASK_CHUNK records to k. Raises when out of memory,
** leaving k as it was but for room made for the chunk (and its anchor
** thread in the anchor table, which the next chunk's replaces). */
static void grow_slab(lua_State *L, lkept *k) {
  /* First the anchor thread, whose lua_newthread may run finalizers, and
  ** one of them may spawn and grow k itself: k is read after it, and
  ** nothing after it runs any. */
  lua_State *A = push_anchor_thread(L);
  int c = k->nchunks;
  /* Anchored before the chunk is made: lua_rawseti may raise. */
  lua_rawgeti(L, LUA_REGISTRYINDEX, k->anchors);
  lua_insert(L, -2);
  lua_rawseti(L, -2, c + 1);
  lua_pop(L, 1);
  if (k->nchunks == k->capchunks) {
    int cap = k->capchunks ? k->capchunks * 2 : 4;
    int *f = realloc(k->free, (size_t)cap * LTASK_CHUNK * sizeof *f);
    if (!f) luaL_error(L, "ums.spawn: out of memory");
    k->free = f;
    lua_State **a = realloc(k->athreads, (size_t)cap * sizeof *a);
    if (!a) luaL_error(L, "ums.spawn: out of memory");
    k->athreads = a;
    ltask **cs = realloc(k->chunks, (size_t)cap * sizeof *cs);
    if (!cs) luaL_error(L, "ums.spawn: out of memory");
    for (int i = k->capchunks; i < cap; i++) cs[i] = NULL;
    k->chunks = cs;
    k->capchunks = cap;
  }
  ltask *chunk = malloc(LTASK_CHUNK * sizeof *chunk);
  if (!chunk) luaL_error(L, "ums.spawn: out of memory");
  LUMS_POISON(chunk, LTASK_CHUNK * sizeof *chunk);
  k->athreads[c] = A;
  k->chunks[k->nchunks++] = chunk;
}

/* Takes an ltask with a reset coroutine from the pool, or makes one,
** and anchors the value at the top of L, the new task's handle, in its
** entry. The handle moves to the top of the ltask's anchor thread, one
** slot above LUMS_ANCHOR_TOP, where the caller takes it back: moved
** there, not copied, it is stored with one lua_copy and leaves L
** without a rotation. L is the caller's thread, running protected: the
** coroutine and its record are made there, so that running out of
** memory raises in the caller rather than on r->SL, which no protected
** call covers.
**
** nvals: the values the caller moves onto the coroutine, which has room
** for them on return.
**
** lazy (the pool being empty): no coroutine is made; the value below
** the handle on L, the task's start (task_new), takes the coroutine's
** entry and t->co stays NULL until the task's first step (start_co). */
static ltask *take_task(lua_State *L, lvmrun *r, int nvals, bool lazy) {
  if (r->npool) {
    /* lua_xmove does not grow the coroutine's stack, which a failed
    ** task's end shrank (lua_resetthread). */
    if (!lua_checkstack(r->pool[r->npool - 1]->co, nvals))
      luaL_error(L, "ums.spawn: out of memory");
    ltask *t = r->pool[--r->npool];
    lua_xmove(L, t->anchor, 1);
    lua_copy(t->anchor, -1, t->aidx + 1);
    return t;
  }
  lkept *k = r->kept;
  lua_State *co = NULL;
  if (lazy)
    lua_rotate(L, -2, 1);  /* the start above the handle, where co goes */
  else if (!lua_checkstack(co = lua_newthread(L), nvals))
    luaL_error(L, "ums.spawn: out of memory");
  /* After lua_newthread, which may run finalizers, and one of them may
  ** spawn and take the free records there were. Nothing below runs any
  ** (grow_slab's own may, but k is read after it), so the slot chosen
  ** here is still free when it is taken. grow_slab is the last call
  ** that may raise. */
  if (k->nfree == 0 && k->nslots == k->nchunks * LTASK_CHUNK) grow_slab(L, k);
  int slot = k->nfree ? k->free[k->nfree - 1] : k->nslots;
  lua_State *A = k->athreads[slot / LTASK_CHUNK];
  int aidx = LUMS_ANCHOR_CO(slot);
  /* The handle and the coroutine (or the start) above it, together: the
  ** coroutine is stored and dropped, the handle stored and left on
  ** top. */
  lua_xmove(L, A, 2);
  lua_copy(A, -1, aidx);
  lua_pop(A, 1);
  lua_copy(A, -1, aidx + 1);
  if (k->nfree)
    k->nfree--;
  else
    k->nslots++;
  ltask *t = slot_record(k, slot);
  LUMS_UNPOISON(t, sizeof *t);
  memset(t, 0, sizeof *t);
  t->slot = slot;
  t->co = co;
  t->anchor = A;
  t->aidx = aidx;
  return t;
}

/* Gives t's record back to its VM, unanchoring its coroutine and its
** handle. */
static void free_task(lvmrun *r, ltask *t) {
  lkept *k = r->kept;
  int slot = t->slot;
  lua_copy(t->anchor, LUMS_ANCHOR_NIL, t->aidx);
  lua_copy(t->anchor, LUMS_ANCHOR_NIL, t->aidx + 1);
  LUMS_POISON(t, sizeof *t);
  k->free[k->nfree++] = slot;
}

/* Makes room for one more ltask in r's pool, up to POOL_MAX: false when
** there is none (full, or no memory for a larger array). */
static bool grow_pool(lvmrun *r) {
  if (r->cappool >= POOL_MAX) return false;
  int cap = r->cappool ? r->cappool * 2 : 64;
  if (cap > POOL_MAX) cap = POOL_MAX;
  void *p = realloc(r->pool, (size_t)cap * sizeof *r->pool);
  if (!p) return false;
  r->pool = p;
  r->cappool = cap;
  return true;
}

/* Pools t, whose coroutine has ended normally or been reset by
** task_finish: a function pushed on that coroutine starts at the next
** lua_resume, which costs much less than creating a thread. This
** unanchors the handle t had. empty: the caller knows the coroutine's
** stack is empty. */
static void give_back_task(lvmrun *r, ltask *t, bool empty) {
  lfs_task_end(&t->fs);
  /* A full pool (many tasks live at once, then ending): the ltask and its
  ** coroutine go at once, with none of the reset below, which only a
  ** pooled one needs. A task that never had a coroutine (start_co
  ** failed) has nothing to pool: every pooled ltask has one. */
  if (!t->co || (r->npool == r->cappool && !grow_pool(r))) {
    free_task(r, t);
    return;
  }
  /* A coroutine that returned nothing has nothing left on its stack (the
  ** usual end, empty): no call needed. */
  if (!empty) lua_settop(t->co, 0);
  /* A hook, the user's or ums's (set while a <close> of a failed task
  ** waited), goes with the task that set it: cleared here, where the
  ** coroutine's state is in the cache, not at the next spawn. */
  if (lua_gethook(t->co)) lua_sethook(t->co, NULL, 0, 0);
  t->hook.uhook = NULL;
  t->hook.busy = t->hook.deferred = 0;
  t->hook.yielded = false;
  lua_copy(t->anchor, LUMS_ANCHOR_NIL, t->aidx + 1);
  /* Back to what take_task hands out: zero but for the coroutine and its
  ** slot. Field by field, not a memset of the whole ltask plus
  ** a copy of what it keeps: this runs once per task. finish_st and
  ** finish_nres are written before they are read; the joiners were all
  ** woken (task_finish), and the wait is off every queue once the task
  ** has ended. */
  t->h = NULL;
  t->vmrun = NULL;
  t->nargs = 0;
  t->finish_pending = false;
  lpark_task_reset(&t->park);
  lums_wait_reset(&t->wait);
  lffi_task_reset(&t->ffi);
  lreq_task_reset(&t->req);
  r->pool[r->npool++] = t;
}

static int new_thread(lua_State *L) {
  lua_newthread(L);
  return 1;
}

/* Gives t, spawned lazily (take_task), its coroutine at its first step:
** a pooled ltask's, whose record is freed, or a new one. Its start, the
** function alone or a table of the function and its t->nargs arguments
** (task_new), moves from its entry onto the coroutine, unpacked, and the
** coroutine takes the entry. Runs on the scheduler, where only r->SL
** may allocate, protected. False when out of memory: t keeps no
** coroutine, and the caller ends it (task_finish reads its end as "out
** of memory"). */
static __attribute__((noinline)) bool start_co(lvmrun *r, ltask *t) {
  lua_State *A = t->anchor, *co;
  if (r->npool) {
    ltask *p = r->pool[--r->npool];
    co = p->co;
    lums_push_anchored(A, p, p->aidx);
    free_task(r, p);
  } else {
    lua_State *SL = r->SL;
    if (!lua_checkstack(SL, 2)) return false;
    lua_pushcfunction(SL, new_thread);
    if (lua_pcall(SL, 0, 1, 0) != LUA_OK) {
      lua_pop(SL, 1);  /* a memory error: the only one it raises */
      return false;
    }
    co = lua_tothread(SL, -1);
    lua_xmove(SL, A, 1);
  }
  /* A holds the coroutine one slot above its top, and has room for the
  ** start above it (ltask.h). */
  lua_pushvalue(A, t->aidx);
  lua_xmove(A, co, 1);
  lua_replace(A, t->aidx);
  t->co = co;
  int n = t->nargs;
  if (n > 0) {
    /* Many arguments may need memory for co's stack. A failure leaves
    ** the table on co, which task_fail's end clears. */
    if (!lua_checkstack(co, n + 1)) return false;
    for (int i = 1; i <= n + 1; i++) lua_rawgeti(co, 1, i);
    lua_remove(co, 1);
  }
  return true;
}

/* A task of r's VM was created / has finished: see lvmrun.nlive. */
static void run_task_added(lvmrun *r) {
  if (r->nlive++ == 0) lums_run_hold(r->run);
}

static void run_task_ended(lvmrun *r) {
  if (--r->nlive == 0) lums_run_release(r->run);
}

/* What keep_outcome does on r->SL that may allocate, protected: nothing
** else on the scheduler protects r->SL, and a memory error raised there
** would unwind into the main thread's handler. None of it may wait
** (another step could then push onto r->SL above it). */
typedef struct lkeep {
  ltask *t;
  int st, nres;
  bool closed;  /* after the coroutine was closed: the failed-handle
                   bookkeeping; before: the outcome */
} lkeep;

static int keep_protected(lua_State *SL) {
  lkeep *k = (lkeep *)lua_touserdata(SL, 1);
  ltask *t = k->t;
  lua_State *co = t->co;
  lums_push_handle(SL, t);
  if (k->closed) {
    /* Nobody may ever join it: its handle now has a finalizer that
    ** reports the error if it is collected unjoined, and the run reports
    ** it at its end if it is still unjoined then (the set is weak, so it
    ** does not keep the handle alive). */
    lua_getfield(SL, LUA_REGISTRYINDEX, FAILED_MT);
    if (t->h->extras) {
      /* Its own metatable takes the finalizer, and is set again so that
      ** Lua sees it has one. */
      lua_getfield(SL, -1, "__gc");
      lua_getmetatable(SL, -3);
      lua_insert(SL, -2);
      lua_setfield(SL, -2, "__gc");
      lua_replace(SL, -2);
    }
    lua_setmetatable(SL, -2);
    lua_getfield(SL, LUA_REGISTRYINDEX, ERRORS_KEY);
    lua_pushvalue(SL, -2);
    lua_pushboolean(SL, 1);
    lua_rawset(SL, -3);
    return 0;
  }
  lums_handle_extras(SL, -1, k->st == LUA_OK ? k->nres : 0);
  if (k->st == LUA_OK) {
    /* lua_xmove does not grow SL's stack: a task may return more values
    ** than it has room for. */
    luaL_checkstack(SL, k->nres, "too many results");
    lua_xmove(co, SL, k->nres);
    /* With i values left above it, the table is at -(i + 1). */
    for (int i = k->nres; i >= 1; i--) lua_rawseti(SL, -(i + 1), i);
    return 0;
  }
  /* The traceback of the coroutine at the error, before it is closed. */
  /* lua_tostring would turn a number error into a string in place. */
  const char *msg =
      lua_type(co, -1) == LUA_TSTRING ? lua_tostring(co, -1) : NULL;
  luaL_traceback(SL, co, msg, 0);
  lua_setfield(SL, -2, X_TB);
  lua_pushvalue(co, -1);
  lua_xmove(co, SL, 1);  /* the error value, identity kept */
  lua_setfield(SL, -2, X_ERR);
  return 0;
}

static bool keep_run(lua_State *SL, lkeep *k) {
  if (!lua_checkstack(SL, 3)) return false;
  lua_pushcfunction(SL, keep_protected);
  lua_pushlightuserdata(SL, k);
  if (lua_pcall(SL, 1, 0, 0) == LUA_OK) return true;
  lua_pop(SL, 1);  /* a memory error: the only one these calls raise */
  return false;
}

/* Whether the value at the top of co is core.CANCELLED. */
static bool top_is_cancelled(lua_State *co) {
  if (lua_gettop(co) == 0 || !lua_checkstack(co, 1)) return false;
  lums_push_cancelled(co);
  bool c = lua_rawequal(co, -1, -2);
  lua_pop(co, 1);
  return c;
}

/* Copies the one result at the top of co into h when it is a value the
** collector need not see (lhandle.res); false for any other. The value
** stays on co, which give_back_task empties. */
static inline bool keep_plain(lhandle *h, lua_State *co) {
  switch (lua_type(co, -1)) {
    case LUA_TNUMBER:
      if (lua_isinteger(co, -1)) {
        h->res = RES_INT;
        h->r.i = lua_tointeger(co, -1);
      } else {
        h->res = RES_FLT;
        h->r.n = lua_tonumber(co, -1);
      }
      return true;
    case LUA_TBOOLEAN:
      h->res = RES_BOOL;
      h->r.b = lua_toboolean(co, -1);
      return true;
    case LUA_TNIL:
      h->res = RES_NIL;
      return true;
    case LUA_TLIGHTUSERDATA:
      h->res = RES_LUD;
      h->r.p = lua_touserdata(co, -1);
      return true;
    default:
      return false;
  }
}

/* task_finish for any end but the usual ones (no result, or one that
** keep_plain keeps): results, an error, a cancellation: keeps the
** outcome in the handle and closes the
** coroutine. An outcome that cannot be kept for lack of memory becomes
** the error "out of memory" (h->nomem). Out of line, so that the usual
** end needs no stack frame of its size. */
static __attribute__((noinline)) void keep_outcome(ltask *t, int st,
                                                   int nres) {
  lvmrun *r = t->vmrun;
  lhandle *h = t->h;
  lua_State *SL = r->SL, *co = t->co;
  lkeep k = {t, st, nres, false};
  if (st == LUA_OK) {
    h->ok = true;
    h->nres = nres;
    h->res = RES_EXTRAS;
    if (nres > 0 && !keep_run(SL, &k)) {
      h->ok = false;
      h->nres = 0;
      h->nomem = true;
    } else {
      return;
    }
  } else if (!co) {
    /* A lazy spawn's task that got no coroutine (start_co): nothing was
    ** kept, and its end reads as "out of memory". */
    h->ok = false;
    h->nomem = true;
  } else {
    h->ok = false;
    h->nomem = !keep_run(SL, &k);
    bool cancelled = top_is_cancelled(co);
    /* Close pending to-be-closed variables now, with the error still on
    ** the coroutine (their __close gets it), while the task is current
    ** (they may wait, on the blocking path): an error they raise replaces
    ** the original, as in plain Lua. */
    if (lua_resetthread(co) != LUA_OK) {
      cancelled = top_is_cancelled(co);
      if (!h->nomem && lua_checkstack(SL, 4)) {
        /* X_ERR is already in the extras: setting it allocates nothing. */
        lums_push_handle(SL, t);
        lums_handle_get_extras(SL, -1);
        lua_xmove(co, SL, 1);
        lua_setfield(SL, -2, X_ERR);
        lua_pop(SL, 2);
      }
    }
    lua_settop(co, 0);
    h->cancelled = cancelled && !h->nomem;
  }
  /* The run has failed: work not started yet never starts now. */
  if (h == r->main) lums_run_stop(r->run);
  if (!h->cancelled) {
    k.closed = true;
    keep_run(SL, &k);
  }
}

/* The task's coroutine ended with status st: keep its outcome in the
** handle, close the coroutine, wake joiners, pool the ltask. Runs on the
** scheduler. */
static void task_finish(ltask *t, int st, int nres) {
  lvmrun *r = t->vmrun;
  lhandle *h = t->h;
  bool empty = st == LUA_OK && nres == 0;
  if (empty || (st == LUA_OK && nres == 1 && keep_plain(h, t->co))) {
    /* The usual ends: nothing to keep but the flag and a plain result
    ** (the handle itself is not needed on the stack). */
    h->ok = true;
    h->nres = nres;
  } else {
    keep_outcome(t, st, nres);
  }
  h->state = T_DONE;
  h->t = NULL;
  lums_q_wake_all(&t->joiners, 0);
  /* core.run, running the scheduler itself, looks at the run again. */
  if (h == r->main) ums_runtime_pause(r->rt);
  give_back_task(r, t, empty);
  run_task_ended(r);  /* last: the run may end now */
}

/* The runtime cannot run t any further (ums_step_error: no worker or
** timer could be had for it): t ends here, started or not, with the
** runtime's message as its error, raised as it were where t stands, so
** that its joiner or ums.on_error sees it. This runs on a stack that is
** not t's, where no wait can begin (the runtime refuses them). */
static __attribute__((noinline)) void task_fail(ltask *t, int err) {
  bool fresh = t->h->state == T_NEW;
  /* A lazy spawn's task not started yet ends as out of memory with no
  ** coroutine when that is its error: asking for memory then would only
  ** make the VM collect in vain (a refused allocation collects in full
  ** and tries again). For any other error it gets a coroutine to end
  ** on, with that error. */
  if (fresh && !t->co && err != UMS_ENOMEM) start_co(t->vmrun, t);
  lua_State *co = t->co;
  /* A task back from a park that a timeout or cancel ended does not
  ** resume, so its continuation cannot take its wait off the queue it
  ** was on (lwaitq.h): that is done here, while its coroutine still
  ** holds what it waited on. */
  lums_q_unlink(&t->wait);
  if (fresh) t->h->state = T_LIVE;
  if (!co) {
    /* Only a lazy spawn's task has none, and it runs no work request
    ** (lums_task_start's are never lazy). */
    task_finish(t, LUA_ERRMEM, 0);
    return;
  }
  lums_req_task_failed(t, fresh, ums_strerror(err));
  if (fresh) lua_settop(co, 0);  /* the function and its arguments */
  if (err == UMS_ENOMEM)
    lua_getfield(co, LUA_REGISTRYINDEX, LUMS_NOMEM_KEY);
  else
    lua_pushstring(co, ums_strerror(err));
  task_finish(t, LUA_ERRRUN, 0);
}

/* lua_resume as ThreadSanitizer must see it. A coroutine leaves the C
** functions it is in by longjmp (a yield from C, an error), and Debian's
** interpreter jumps with __longjmp_chk, which TSan does not intercept:
** the binding's frames that the jump abandons stay on the fiber's shadow
** call stack, a few per yield, until it overflows and TSan crashes.
** Here the step's own jump, from after lua_resume back to a setjmp
** before it, both seen by TSan, unwinds that stack to this frame. The
** jump is bound to the symbol longjmp itself, which TSan intercepts:
** with _FORTIFY_SOURCE the name would mean __longjmp_chk as well. */
#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
extern void lums_tsan_longjmp(jmp_buf env, int val) __asm__("longjmp")
    __attribute__((noreturn));
static __attribute__((noinline)) int resume(lua_State *co, int nargs,
                                            int *nres) {
  jmp_buf back;
  volatile int st = LUA_OK;
  if (setjmp(back) == 0) {
    st = lua_resume(co, NULL, nargs, nres);
    lums_tsan_longjmp(back, 1);
  }
  return st;
}
#else
#define resume(co, nargs, nres) lua_resume((co), NULL, (nargs), (nres))
#endif

static int task_step(void *arg) {
  ltask *t = arg;
  ltask *prev = lums_cur_task;
  int nargs = 0, nres = 0, st;
  /* A stall report whose step ended before it ran Lua again: delivered
  ** here, outside any task (the handler cannot wait). */
  if (lums_stall_pending(&t->vmrun->stall))
    lums_stall_flush(t->vmrun, t->vmrun->SL);
  lums_cur_task = t;
  if (t->finish_pending) {
    /* It ended with a park begun last step (below). */
    t->finish_pending = false;
    task_finish(t, t->finish_st, t->finish_nres);
    lums_cur_task = prev;
    return UMS_STEP_DONE;
  }
  int err = ums_step_error();
  if (__builtin_expect(err != 0, 0)) {
    task_fail(t, err);
    lums_cur_task = prev;
    return UMS_STEP_DONE;
  }
  if (!atomic_load_explicit(&t->vmrun->q.lua_thread_known,
                            memory_order_relaxed))
    lums_quantum_bind_thread(&t->vmrun->q);
  if (t->h->state == T_NEW) {
    if (!t->co && !start_co(t->vmrun, t)) {
      task_fail(t, UMS_ENOMEM);
      lums_cur_task = prev;
      return UMS_STEP_DONE;
    }
    t->h->state = T_LIVE;
    if (ums_cancelled()) {
      /* Cancelled before it started: it never runs. */
      lua_settop(t->co, 0);
      lums_push_cancelled(t->co);
      task_finish(t, LUA_ERRRUN, 0);
      lums_cur_task = prev;
      return UMS_STEP_DONE;
    }
    nargs = t->nargs;
  }
  t->park.parking = false;
  lvmrun *r = t->vmrun;
  lums_quantum_step(&r->q, t->co);
#ifdef LUMS_QUANTUM_POLL
  if ((r->q.preempt && r->q.quantum > 0) || lums_stall_vm_state(&r->stall))
    lums_quantum_poll(t);
#endif
  st = resume(t->co, nargs, &nres);
  atomic_store_explicit(&r->q.running_co, NULL, memory_order_relaxed);
  /* A preemption signalled just as the step ended set a hook nobody
  ** needs any more: the user's is put back. */
  if (st == LUA_YIELD) lums_hook_step_end(t->co, t);
  if (t->park.begun && !(st == LUA_YIELD && t->park.parking)) {
    /* The step ends (the task ended, or a bare coroutine.yield) between
    ** park_begin and park_wait: end that park on the task's behalf. The
    ** unpark queues the task, so the step must say PARK; a task that
    ** ended is finished when it is stepped again. */
    t->park.begun = false;
    ums_unpark(r->rt, t->park.tok, 0);
    if (st == LUA_YIELD) {
      lua_pop(t->co, nres);
    } else {
      t->finish_pending = true;
      t->finish_st = st;
      t->finish_nres = nres;
    }
    lums_cur_task = prev;
    return UMS_STEP_PARK;
  }
  if (st == LUA_YIELD) {
    lums_cur_task = prev;
    /* A wait yields no values: only a bare coroutine.yield in the task
    ** body leaves some to drop. */
    if (nres) lua_pop(t->co, nres);
    return t->park.parking ? UMS_STEP_PARK : UMS_STEP_YIELD;
  }
  task_finish(t, st, nres);
  lums_cur_task = prev;
  return UMS_STEP_DONE;
}

/* Creates a task running the function at index `first` with the values
** above it as arguments (all popped); its handle is left at `first`, the
** top of the stack. It pushes up to 3 values above the arguments: L must
** have room for them (a C function such as l_spawn has LUA_MINSTACK). L
** is the caller's thread; mt is the index of the task metatable. The
** task runs on r's scheduler, where r's VM lives. */
static lhandle *task_new(lua_State *L, lvmrun *r, int first, bool joinable,
                         int mt, bool lazy) {
  int n = lua_gettop(L) - first;  /* arguments */
  /* Lazy, with no pooled coroutine: the task gets one at its first step
  ** (start_co), so that tasks spawned but not started yet hold none,
  ** and those that start after others ended reuse theirs. Its start is
  ** the function alone, or a table of the function and its arguments,
  ** made first, as the handle: running out of memory in either raises
  ** with nothing taken that the collector cannot get back. */
  lazy = lazy && r->npool == 0;
  if (lazy && n > 0) {
    lua_createtable(L, n + 1, 0);
    lua_insert(L, first);
    for (int i = n + 1; i >= 1; i--) lua_rawseti(L, first, i);
  }
  lhandle *h = (lhandle *)lua_newuserdatauv(L, sizeof *h, 0);
  memset(h, 0, sizeof *h);
  h->tag = &lums_task_tag;
  lua_pushvalue(L, mt);
  lua_setmetatable(L, -2);
  ltask *t = take_task(L, r, n + 1, lazy);
  /* The function and arguments go onto the coroutine (or are in the
  ** coroutine's entry already, lazy); the handle, on top of the anchor
  ** thread (take_task), comes back to `first`. */
  if (t->co) lua_xmove(L, t->co, n + 1);
  lua_xmove(t->anchor, L, 1);
  t->nargs = n;
  h->t = t;
  t->h = h;
  t->vmrun = r;
  /* Detached: the binding keeps each task's outcome in its handle, so
  ** the runtime may recycle the task's slot as soon as it ends (a
  ** joinable one would stay allocated until the run's end). Only the
  ** run's first task is joined, by core.run itself. The id goes straight
  ** into the handle: the runtime stores it before the task can start,
  ** and for the run's first task the scheduler thread may start it (and
  ** ums.self() read the id) before this call returns. */
  run_task_added(r);  /* ended by task_finish */
  int rc;
  if (joinable) {
    ums_spawn_opts_t opts = {r->sched, 0, NULL};
    /* The main thread must not write anything the task may read once
    ** the spawn has started it. */
    r->main = h;
    rc = ums_task_spawn_step(r->rt, &opts, task_step, t, &h->id);
  } else {
    /* Usually on r's scheduler thread (a task's ums.spawn): the
    ** runtime's short path there, its general spawn elsewhere. */
    rc = ums_task_spawn_step_here(r->rt, r->sched, task_step, t, &h->id);
  }
  if (rc) {
    h->t = NULL;
    h->state = T_DONE;
    give_back_task(r, t, false);
    run_task_ended(r);
    luaL_error(L, "ums.spawn: %s", ums_strerror(rc));
  }
  return h;
}

void lums_task_start(lvmrun *r, int nargs) {
  lua_State *L = r->SL;
  lums_monitor_want(&r->q);
  int first = lua_gettop(L) - nargs;
  luaL_checkstack(L, 4, "ums.spawn");  /* the metatable, then task_new's */
  luaL_getmetatable(L, LUMS_TASK_MT);
  lua_insert(L, first);  /* below the function, which moves to first + 1 */
  task_new(L, r, first + 1, false, first, false);
  lua_settop(L, first - 1);
}

/* core.spawn(fn, ...) -> task */
static int l_spawn(lua_State *L) {
  if (lua_type(L, 1) != LUA_TFUNCTION) luaL_checktype(L, 1, LUA_TFUNCTION);
  ltask *me = lums_cur_task;
  if (!me || !me->vmrun)
    return luaL_error(L, "ums.spawn: not inside a task (call it from a "
                         "function run by ums.run or ums.spawn)");
  lums_monitor_want(&me->vmrun->q);
  task_new(L, me->vmrun, 1, false, lua_upvalueindex(1), true);
  return 1;  /* the handle, alone on the stack */
}

/* Current-task calls                                                      */
/* ---------------------------------------------------------------------- */

/* core.io_backend() -> "uring" | "pool" in force for the run; nil
** outside a run. */
static int l_io_backend(lua_State *L) {
  ltask *t = lums_cur_task;
  if (!t || !t->vmrun) {
    lua_pushnil(L);
    return 1;
  }
  ums_config_t c;
  ums_runtime_config(t->vmrun->rt, &c);
  if (c.io_backend == UMS_IO_URING)
    lua_pushliteral(L, "uring");
  else
    lua_pushliteral(L, "pool");
  return 1;
}

static int l_now(lua_State *L) {
  lua_pushnumber(L, (lua_Number)ums_now() / 1e9);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Runs                                                                    */
/* ---------------------------------------------------------------------- */

static int config_int(lua_State *L, int cfg, const char *key, int dflt) {
  int v = dflt;
  if (lua_getfield(L, cfg, key) != LUA_TNIL) v = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  return v;
}

static double config_num(lua_State *L, int cfg, const char *key,
                         double dflt) {
  double v = dflt;
  if (lua_getfield(L, cfg, key) != LUA_TNIL) v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

/* A fresh, empty set of failed handles (weak keys). */
static void new_errors_set(lua_State *L) {
  lua_newtable(L);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, ERRORS_KEY);
}

/* Calls the error handler for the failed task whose handle is at the top
** of the stack (popped), unless somebody joined it or it was reported. */
static void report_error(lua_State *L) {
  lhandle *h = (lhandle *)lua_touserdata(L, -1);
  if (h->joined || h->cancelled || h->ok || h->state != T_DONE) {
    lua_pop(L, 1);
    return;
  }
  h->joined = true;
  lua_getfield(L, LUA_REGISTRYINDEX, ONERROR_KEY);
  lums_handle_push_failure(L, -2, h);
  lua_pushvalue(L, -4);
  if (lua_pcall(L, 3, 0, 0) != LUA_OK) {
    fprintf(stderr, "ums: error in the on_error handler: %s\n",
            lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

/* __gc of a failed task's handle: nobody can join it any more. */
static int failed_task_gc(lua_State *L) {
  lua_settop(L, 1);
  report_error(L);
  return 0;
}

/* Calls the error handler for every failed task nobody joined that is
** still referenced at the end of a run (the others were reported when
** they were collected). Main thread, after the runtime is gone. */
static void report_errors(lua_State *L, lhandle *main) {
  lua_getfield(L, LUA_REGISTRYINDEX, ERRORS_KEY);
  int errs = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, errs)) {
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    if (lua_touserdata(L, -1) == main)
      lua_pop(L, 1);
    else
      report_error(L);
  }
  /* Emptied in place rather than replaced: a run per test would otherwise
  ** leave two tables per run to the collector. */
  lua_pushnil(L);
  while (lua_next(L, errs)) {
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_pushnil(L);
    lua_rawset(L, errs);
  }
  lua_pop(L, 1);
}

void lums_report_errors(lua_State *L) { report_errors(L, NULL); }

static lkept *push_kept(lua_State *L);

/* Frees every chunk of k's records. */
static void free_slab(lkept *k) {
  for (int i = 0; i < k->nchunks; i++) {
    LUMS_UNPOISON(k->chunks[i], LTASK_CHUNK * sizeof(ltask));
    free(k->chunks[i]);
  }
  free(k->chunks);
  free(k->athreads);
  free(k->free);
  k->chunks = NULL;
  k->athreads = NULL;
  k->free = NULL;
  k->nchunks = k->capchunks = k->nslots = k->nfree = 0;
}

/* Makes a new anchor table with the anchor thread of one chunk. */
static int new_anchors(lua_State *L) {
  lua_createtable(L, 4, 0);
  push_anchor_thread(L);
  lua_rawseti(L, -2, 1);
  return 1;
}

/* At the end of a run that made more records than one chunk: the VM
** keeps its pooled records only (at most KEPT_POOL_MAX, all in a new
** first chunk, renumbered, with a new anchor table), so that a run with
** many tasks at once leaves neither its records nor an anchor table of
** their size behind. Every task has ended by now, so no record is in use
** but the pooled ones, whose addresses only r->pool holds. When memory
** is short, everything stays as it is. */
static void compact_slab(lvmrun *r, lkept *k) {
  lua_State *SL = r->SL;
  if (k->nchunks <= 1 || k->nslots - k->nfree != r->npool ||
      !lua_checkstack(SL, 4))
    return;
  ltask **chunks = calloc(4, sizeof *chunks);
  lua_State **athreads = calloc(4, sizeof *athreads);
  int *fr = malloc(4 * LTASK_CHUNK * sizeof *fr);
  ltask *c = malloc(LTASK_CHUNK * sizeof *c);
  lua_pushcfunction(SL, new_anchors);
  if (!chunks || !athreads || !fr || !c ||
      lua_pcall(SL, 0, 1, 0) != LUA_OK) {
    lua_settop(SL, 0);
    free(chunks);
    free(athreads);
    free(fr);
    free(c);
    return;
  }
  lua_rawgeti(SL, -1, 1);
  lua_State *A = lua_tothread(SL, -1);
  lua_pop(SL, 1);
  for (int i = 0; i < r->npool; i++) {
    ltask *t = r->pool[i];
    lums_push_anchored(A, t, t->aidx);
    lua_replace(A, LUMS_ANCHOR_CO(i));
    c[i] = *t;
    c[i].slot = i;
    c[i].anchor = A;
    c[i].aidx = LUMS_ANCHOR_CO(i);
    r->pool[i] = &c[i];
  }
  LUMS_POISON(c + r->npool, (LTASK_CHUNK - r->npool) * sizeof *c);
  lua_rawseti(SL, LUA_REGISTRYINDEX, r->anchors);
  free_slab(k);
  chunks[0] = c;
  athreads[0] = A;
  k->chunks = chunks;
  k->athreads = athreads;
  k->capchunks = 4;
  k->nchunks = 1;
  k->nslots = r->npool;
  k->free = fr;
}

lvmrun *lums_vmrun_new(lua_State *L, lrun *run, ums_runtime_t *rt, int sched,
                   int64_t quantum) {
  lvmrun *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->rt = rt;
  r->run = run;
  r->sched = sched;
  /* Every VM shares the run's stall state, which the main VM made (set
  ** after this for the main VM itself). */
  lvmrun *m = run ? lums_run_at(run, 0) : NULL;
  lums_stall_vm_init(&r->stall, m ? lums_stall_vm_state(&m->stall) : NULL,
                     L);
  /* A VM that runs one short run after another (a test framework, one
  ** per test) takes its scheduler-side thread and its pooled tasks from
  ** the previous run: what each run would otherwise allocate is what the
  ** collector must then trace, a cost that grows with the heap. */
  lkept *k = push_kept(L);
  r->kept = k;
  r->anchors = k->anchors;
  if (k->SL && lua_status(k->SL) == LUA_OK) {
    r->SL = k->SL;
  } else {
    k->SL = r->SL = lua_newthread(L);
    lua_setiuservalue(L, -2, 1);
  }
  r->pool = k->pool;
  r->npool = k->npool;
  r->cappool = k->cappool;
  k->pool = NULL;
  k->npool = k->cappool = 0;
  lua_pop(L, 1);
  lua_pushlightuserdata(L, r);
  lua_setfield(L, LUA_REGISTRYINDEX, RUN_KEY);
  /* Last: from here on, until lums_vmrun_free, the VM's small blocks (a
  ** task handle per spawn) are recycled without malloc/free. */
  r->alloc = lums_alloc_install(L);
  /* The run's monitor (lums_run_monitor) watches the VM from here on. */
  lums_quantum_init(&r->q, L, run ? lums_run_monitor(run) : NULL, sched,
                    quantum, run && lums_run_preempt(run), lums_stall_hook);
  return r;
}

void lums_vmrun_free(lua_State *L, lvmrun *r, bool close_vm) {
  /* The VM lives on: its next run takes the thread and some of the
  ** pooled tasks back (lums_vmrun_new). With close_vm, the pooled records
  ** go with the VM (kept_gc). */
  lkept *k = close_vm ? NULL : r->kept;
  if (k) {
    lua_settop(r->SL, 0);
    if (r->npool > KEPT_POOL_MAX) {
      for (int i = KEPT_POOL_MAX; i < r->npool; i++)
        free_task(r, r->pool[i]);
      r->npool = KEPT_POOL_MAX;
    }
    compact_slab(r, k);
    k->pool = r->pool;
    k->npool = r->npool;
    k->cappool = r->cappool;
    r->pool = NULL;
    r->npool = 0;
  }
  free(r->pool);
  lffi_vm_free(&r->ffi);
  lums_alloc_remove(close_vm ? NULL : L, r->alloc);
  if (!close_vm) {
    lua_pushnil(L);
    lua_setfield(L, LUA_REGISTRYINDEX, RUN_KEY);
  }
  free(r);
}

static void run_free(lua_State *L, lvmrun *r) { lums_vmrun_free(L, r, false); }

/* The VM is closing: its kept tasks' coroutines go with it, their
** records here (the anchor table dies with the VM). */
static int kept_gc(lua_State *L) {
  lkept *k = (lkept *)lua_touserdata(L, 1);
  free(k->pool);
  k->pool = NULL;
  k->npool = k->cappool = 0;
  free_slab(k);
  k->SL = NULL;
  return 0;
}

/* Pushes the userdata of what L's VM keeps between runs, making it if
** the VM has none yet. */
static lkept *push_kept(lua_State *L) {
  if (lua_getfield(L, LUA_REGISTRYINDEX, KEPT_KEY) == LUA_TUSERDATA)
    return (lkept *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  lkept *k = lua_newuserdatauv(L, sizeof *k, 1);
  memset(k, 0, sizeof *k);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, kept_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_newtable(L);
  k->anchors = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, KEPT_KEY);
  return k;
}

/* os.exit while a run is in progress, in any VM of the run. Lua's own
** would close the state from this task, freeing the VM under the run's
** other threads and under the main thread still inside core.run. Instead
** the request is kept (the first one wins), the run is cancelled, and
** core.run calls the real os.exit with the same status on the main
** thread once every runtime thread is gone, so finalizers and <close>
** variables still run and the status is kept. */
static void swap_os_exit(lua_State *L, bool install);

static int run_os_exit(lua_State *L) {
  ltask *t = lums_cur_task;
  if (t && t->vmrun && lums_run_hosted(t->vmrun->run))
    return luaL_error(L, "os.exit: not available in work run by a C host "
                         "(raise an error or return instead)");
  if (!t || !t->vmrun) {
    /* Not from a task (a finalizer on the main thread): the real one. */
    lua_getfield(L, LUA_REGISTRYINDEX, "ums.os_exit");
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 0);
    return 0;
  }
  /* The status as the real os.exit reads it. */
  int code;
  if (lua_isboolean(L, 1))
    code = lua_toboolean(L, 1) ? EXIT_SUCCESS : EXIT_FAILURE;
  else
    code = (int)luaL_optinteger(L, 1, EXIT_SUCCESS);
  lums_run_request_exit(t->vmrun->run, code, lua_toboolean(L, 2));
  return lums_raise_cancelled(L);
}

void lums_swap_os_exit(lua_State *L, bool install) {
  swap_os_exit(L, install);
}

/* Swaps os.exit for run_os_exit (install) or back (the saved one). */
static void swap_os_exit(lua_State *L, bool install) {
  if (lua_getglobal(L, "os") != LUA_TTABLE) {
    lua_pop(L, 1);
    return;
  }
  if (install) {
    lua_getfield(L, -1, "exit");
    lua_setfield(L, LUA_REGISTRYINDEX, "ums.os_exit");
    lua_pushcfunction(L, run_os_exit);
  } else {
    lua_getfield(L, LUA_REGISTRYINDEX, "ums.os_exit");
  }
  lua_setfield(L, -2, "exit");
  lua_pop(L, 1);
}

/* core.limits: {min, max} of each numeric setting of ums.config, by its
** Lua name: the runtime's bounds (ums.h) for the settings it checks, so
** that ums.config refuses what ums_runtime_new would, with the same
** numbers. Seconds are bounded where they still fit the runtime's
** nanoseconds. */
static void push_limits(lua_State *L) {
  static const struct {
    const char *name;
    lua_Number min, max;
  } lim[] = {
      {"schedulers", 1, UMS_SCHEDULERS_MAX},
      {"max_workers", 0, INT_MAX},
      {"stack_size", (lua_Number)UMS_LUA_STACK_SIZE_MIN,
       (lua_Number)UMS_STACK_SIZE_MAX},
      {"idle_workers_kept", 0, INT_MAX},
      {"io_threads", 0, INT_MAX},
      {"preempt_threads", 0, INT_MAX},
      {"seconds", 0, LUMS_MAX_SECONDS},
  };
  lua_createtable(L, 0, (int)(sizeof lim / sizeof lim[0]));
  for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++) {
    lua_createtable(L, 2, 0);
    if (lim[i].max == (lua_Number)(lua_Integer)lim[i].max) {
      lua_pushinteger(L, (lua_Integer)lim[i].min);
      lua_rawseti(L, -2, 1);
      lua_pushinteger(L, (lua_Integer)lim[i].max);
    } else {
      lua_pushnumber(L, lim[i].min);
      lua_rawseti(L, -2, 1);
      lua_pushnumber(L, lim[i].max);
    }
    lua_rawseti(L, -2, 2);
    lua_setfield(L, -2, lim[i].name);
  }
}

/* core.run(fn, ...) and core.run_limit: limit is a real time in seconds
** after which the run is cancelled (0: none). */
/* Registry key of the Lua function that runs ums.run's function as a task
** of the current run (stdlib/ums/init.lua). */
#define RUN_IN_TASK_KEY "ums.run_in_task"

/* The waits of run() for a runtime whose one scheduler this thread runs
** (ums_runtime_run): it runs the scheduler until the first task has
** ended and, if that went well, until the run is quiet, as the joins and
** lums_run_wait_quiet of a threaded run wait; the task's end, the run's
** quiet, an exit and Ctrl-C pause it for a look (task_finish, lvm.c).
** The time limit cancels the first task at until, as there. Returns
** whether the limit was reached; the first task has ended then too, and
** the runtime is left for ums_runtime_shutdown to run until its other
** tasks end. */
static bool run_here(lvmrun *r, lhandle *main, int64_t until) {
  bool over = false;
  for (;;) {
    if (main->state == T_DONE &&
        (over || !main->ok || lums_run_quiet(r->run)))
      return over;
    int rr = ums_runtime_run(r->rt, until);
    if (rr == UMS_ETIMEDOUT && !over) {
      /* Past the limit: as a threaded run's, the first task is
      ** cancelled, or, once it has ended, nothing more starts. */
      over = true;
      if (main->state != T_DONE) ums_task_cancel(r->rt, main->id);
      else lums_run_stop(r->run);
      until = UMS_FOREVER;
    }
  }
}

static int run(lua_State *L, double limit) {
  /* Named as ums.run whatever the call looks like (pcall(ums.run, x)
  ** would otherwise be 'ums.run', ums.run(x) 'run'). */
  if (lua_type(L, 1) != LUA_TFUNCTION)
    return luaL_error(L, "bad argument #1 to 'run' (function expected, got "
                      "%s)", luaL_typename(L, 1));
  if (get_run(L))
    return luaL_error(L, "ums.run: a run is already in progress "
                         "(ums.run cannot be nested; use ums.spawn)");
  lua_getfield(L, LUA_REGISTRYINDEX, CONFIG_KEY);
  int cfgi = lua_gettop(L);
  ums_config_t cfg = {0};
  cfg.schedulers = config_int(L, cfgi, "schedulers", 1);
  cfg.max_workers = config_int(L, cfgi, "max_workers", 0);
  cfg.stack_size = (size_t)config_int(L, cfgi, "stack_size", LUA_STACK_SIZE);
  if (cfg.stack_size < UMS_LUA_STACK_SIZE_MIN)
    return luaL_error(L, "ums.run: stack_size %d is below the minimum, %d "
                         "bytes", (int)cfg.stack_size,
                      UMS_LUA_STACK_SIZE_MIN);
  double idle = config_num(L, cfgi, "worker_idle_timeout", 10.0);
  cfg.worker_idle_timeout = idle < 0 ? -1 : (int64_t)(idle * 1e9);
  cfg.idle_workers_kept = config_int(L, cfgi, "idle_workers_kept", 16);
  double quantum = config_num(L, cfgi, "quantum", 0.004);
  lua_getfield(L, cfgi, "preempt");
  bool preempt = lua_toboolean(L, -1);
  lua_pop(L, 1);
  /* "auto" (io_uring when the kernel allows it, else the pool; UMS_IO in
  ** the environment may choose), "uring" or "pool" (init.lua checks). */
  cfg.io_backend = UMS_IO_AUTO;
  if (lua_getfield(L, cfgi, "io") == LUA_TSTRING) {
    const char *io = lua_tostring(L, -1);
    if (strcmp(io, "uring") == 0) cfg.io_backend = UMS_IO_URING;
    else if (strcmp(io, "pool") == 0) cfg.io_backend = UMS_IO_POOL;
  }
  lua_pop(L, 1);
  cfg.io_pool_threads = config_int(L, cfgi, "io_threads", 0);
  cfg.preempt_threads = config_int(L, cfgi, "preempt_threads", 0);
  cfg.clock = UMS_CLOCK_REAL;
  if (lua_getfield(L, cfgi, "clock") == LUA_TSTRING &&
      strcmp(lua_tostring(L, -1), "virtual") == 0)
    cfg.clock = UMS_CLOCK_VIRTUAL;
  lua_pop(L, 1);
  /* stats: a boolean or "precise" (nil: the runtime's default, from
  ** UMS_STATS); stall_threshold: seconds, 0 turns stall detection off
  ** (init.lua checks both). */
  int stype = lua_getfield(L, cfgi, "stats");
  if (stype == LUA_TBOOLEAN)
    cfg.stats = lua_toboolean(L, -1) ? UMS_STATS_ON : UMS_STATS_OFF;
  else if (stype == LUA_TSTRING && strcmp(lua_tostring(L, -1), "precise") == 0)
    cfg.stats = UMS_STATS_PRECISE;
  lua_pop(L, 1);
  double stall = config_num(L, cfgi, "stall_threshold", 1.0);
  cfg.stall_threshold = stall > 0 ? (int64_t)(stall * 1e9) : -1;
  /* deadlock = false: a run whose tasks C code wakes from its own threads
  ** (init.lua checks the setting). */
  lua_getfield(L, cfgi, "deadlock");
  bool detect = lua_isnil(L, -1) || lua_toboolean(L, -1);
  lua_pop(L, 2);  /* the setting and the configuration */
  /* The stall state exists before the runtime, whose monitor may call
  ** lums_stall_cb from its first tick; it learns the VMs below. */
  lstall *stall_state = NULL;
  if (cfg.stall_threshold > 0) {
    stall_state = lums_stall_new(L, cfg.stall_threshold);
    cfg.on_stall = lums_stall_cb;
    cfg.on_stall_arg = stall_state;
  }
  if (cfg.clock == UMS_CLOCK_VIRTUAL && cfg.schedulers > 1) {
    lums_stall_free(stall_state);
    return luaL_error(L, "ums.run: clock = \"virtual\" needs schedulers = 1 "
                         "(got %d)", cfg.schedulers);
  }
  ldeadlock *deadlock = NULL;
  if (detect && (deadlock = lums_deadlock_new()) != NULL) {
    cfg.on_deadlock = lums_deadlock_cb;
    cfg.on_deadlock_arg = deadlock;
  }

  /* A program may start many runs (a test framework, one per test): the
  ** runtime's threads stay parked for the next one (docs/lua-api.md,
  ** "What a run keeps for the process"). */
  cfg.keep_threads = cfg.schedulers > 0 ? cfg.schedulers + 1 : INT_MAX;
  /* With one scheduler this thread runs it (run_here): a run then starts
  ** and stops without waking any other thread. */
  cfg.run_on_caller = cfg.schedulers == 1;

  int err;
  lintr *intr = lums_intr_block();
  ums_runtime_t *rt = ums_runtime_new(&cfg, &err);
  if (!rt) {
    lums_intr_end(intr);
    lums_stall_free(stall_state);
    lums_deadlock_free(deadlock);
    return luaL_error(L, "ums.run: cannot start the runtime: %s",
                      ums_runtime_error());
  }
  /* The main VM is the VM of scheduler 0; lvm.c makes the others. */
  lrun *run = lums_run_new(L, rt, &lums_vm_ops_module);
  if (run) lums_run_set_preempt(run, preempt);
  /* The quantum's looks watch every VM of the run, each from its
  ** making; without preemption they start with the second task. The run
  ** owns them and frees them once the runtime's threads are gone. */
  int64_t qns = quantum > 0 ? (int64_t)(quantum * 1e9) : 0;
  int merr = 0;
  lmonitor *mon = run ? lums_monitor_new(rt, lums_run_count(run), qns,
                                         !preempt, stall_state != NULL,
                                         &merr) : NULL;
  if (mon) lums_run_set_monitor(run, mon);
  lvmrun *r = mon ? lums_vmrun_new(L, run, rt, 0, qns) : NULL;
  if (!r) {
    /* No task has started: the run ends as one that never began. */
    ums_runtime_shutdown(rt, 0);
    lums_intr_end(intr);
    lums_monitor_free(mon);
    if (run) lums_run_close(L, run);
    lums_stall_free(stall_state);
    lums_deadlock_free(deadlock);
    if (merr)
      return luaL_error(L, "ums.run: cannot create the monitor thread: %s "
                        "(quantum = 0 and stall_threshold = 0 run without "
                        "one)", ums_strerror(merr));
    return luaL_error(L, "ums.run: out of memory");
  }
  lums_stall_vm_set(&r->stall, stall_state);
  lums_run_set_main(run, r);
  lums_stall_attach(stall_state, run);
  lums_deadlock_attach(deadlock, run);

  swap_os_exit(L, true);
  /* After this the scheduler thread may be running Lua (its collector
  ** walks this thread's stack too): this thread must not touch the VM
  ** until the run is over. task_new leaves the handle alone at index 1. */
  lhandle *main = task_new(L, r, 1, true, lua_upvalueindex(1), false);
  lums_intr_watch(intr, run);
  /* From here until the runtime is shut down, the VM belongs to the
  ** scheduler: this thread runs it (run_here), or only waits. */
  /* The limit is real time, also when the run's clock is virtual: it
  ** bounds a test that never blocks, where virtual time stands still. */
  bool over = false;
  int64_t until = limit > 0 ? ums_deadline((int64_t)(limit * 1e9)) :
                  UMS_FOREVER;
  if (cfg.run_on_caller) {
    over = run_here(r, main, until);
  } else {
    int jr = ums_task_join(r->rt, main->id, until, NULL, NULL);
    if (jr == UMS_ETIMEDOUT) {
      over = true;
      ums_task_cancel(r->rt, main->id);
      ums_task_join(r->rt, main->id, UMS_FOREVER, NULL, NULL);
    }
  }
  /* Its outcome goes to our caller (results, or the error raised again):
  ** never to on_error, whenever its handle is collected. */
  main->joined = true;
  /* Tasks and submitted work still running may start more (spawn,
  ** submit): only once all of it has ended may the runtime stop taking
  ** work. An os.exit (in any VM) ends the wait at once; the limit ends it
  ** as it ends the first task's. */
  if (main->ok && !over) {
    if (!lums_run_wait_quiet(run, until)) {
      over = true;
      lums_run_stop(run);
    }
  }
  /* Ctrl-C may cancel the run until its outcome is settled here. */
  bool interrupted = lums_intr_settle(intr);
  int exit_code;
  bool exit_close;
  bool exiting = lums_run_exit_requested(run, &exit_code, &exit_close);
  ums_runtime_shutdown(r->rt, main->ok && !exiting && !over && !interrupted ?
                       UMS_FOREVER : 0);
  r->rt = NULL;
  if (cfg.run_on_caller) {
    /* This thread ran the steps: it runs Lua of its own again. A step
    ** that another step's worker interrupted (a task blocked on its
    ** worker) restores the task it found current, which may have ended
    ** by then (the quantum's signal handler and l_run look at these). */
    lums_quantum_leave_thread();
  }
  lums_intr_end(intr);
  lums_monitor_free(mon);
  /* A report the main VM never got to (the run ended first). */
  if (lums_stall_pending(&r->stall)) lums_stall_flush(r, L);
  swap_os_exit(L, false);
  /* Every scheduler thread has been joined: the other VMs are this
  ** thread's to close, and work never started is cancelled. */
  lums_run_close(L, run);
  /* The runtime's monitor and every VM but this one are gone. */
  lums_stall_free(stall_state);
  lums_stall_vm_set(&r->stall, NULL);
  /* The report's writer was a scheduler thread, joined by now. */
  char *stuck = lums_deadlock_take(deadlock);
  lums_deadlock_free(deadlock);
  if (exiting) {
    free(stuck);
    /* Every runtime thread is gone: the real os.exit may close the VM. */
    run_free(L, r);
    lua_getglobal(L, "os");
    lua_getfield(L, -1, "exit");
    lua_pushinteger(L, exit_code);
    lua_pushboolean(L, exit_close);
    lua_call(L, 2, 0);
  }
  run_free(L, r);
  report_errors(L, main);
  /* lua.c's message for Ctrl-C; the traceback shows where ums.run was. */
  if (interrupted) {
    free(stuck);
    lua_pushliteral(L, "interrupted!");
    return lua_error(L);
  }
  if (stuck) {
    /* Every task was cancelled to end the run: the report is its
    ** outcome, whatever the first task's was. */
    lua_pushstring(L, stuck);
    free(stuck);
    return lua_error(L);
  }
  if (over)
    return luaL_error(L, "ums.run: time limit of %f s reached; every task "
                         "was cancelled", limit);
  if (main->ok) {
    int n = lums_handle_push_outcome(L, 1, main);
    return n - 1;  /* drop the leading true */
  }
  /* Raise the main task's error, keeping its identity; a string gets the
  ** task's traceback, which the caller's own traceback would not show. */
  lums_handle_push_failure(L, 1, main);
  if (lua_type(L, -2) != LUA_TSTRING || lua_isnil(L, -1)) lua_pop(L, 1);
  return lua_error(L);
}

static int run_in_task_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  return lua_gettop(L);
}

/* core.run(fn, ...). Called from a task, a run cannot be nested: fn runs
** as a task of the current run, joined (stdlib/ums/init.lua registers
** that function). ums.run is this function itself, so that its errors
** name the caller's line. */
static int l_run(lua_State *L) {
  ltask *t = lums_cur_task;
  if (t && t->h) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, RUN_IN_TASK_KEY) ==
        LUA_TFUNCTION) {
      lua_insert(L, 1);
      lua_callk(L, lua_gettop(L) - 1, LUA_MULTRET, 0, run_in_task_k);
      return lua_gettop(L);
    }
    lua_pop(L, 1);
  }
  return run(L, 0);
}

/* core.run_limit(seconds, fn, ...): core.run, cancelled after that many
** real seconds (then it raises "ums.run: time limit ..."). */
static int l_run_limit(lua_State *L) {
  lua_Number limit = luaL_checknumber(L, 1);
  luaL_argcheck(L, limit > 0, 1, "time limit must be a positive number");
  lua_remove(L, 1);
  return run(L, limit);
}

/* core.config([tbl]) */
static int l_config(lua_State *L) {
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, LUA_REGISTRYINDEX, CONFIG_KEY);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_settable(L, 2);
    }
    lua_pop(L, 1);
  }
  lua_getfield(L, LUA_REGISTRYINDEX, CONFIG_KEY);
  return 1;
}

static int l_on_error(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  lua_settop(L, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, ONERROR_KEY);
  return 0;
}

/* Prints as lua.c reports an error: a string with its traceback, which
** begins with it; another value as a number, by its __tostring, or as
** "(error object is a T value)", then the traceback. */
static int default_on_error(lua_State *L) {
  const char *tb = lua_tostring(L, 2);
  const char *msg;
  if (lua_type(L, 1) == LUA_TSTRING) {
    msg = tb ? tb : lua_tostring(L, 1);
    tb = NULL;
  } else if (lua_type(L, 1) == LUA_TNUMBER) {
    msg = lua_pushfstring(L, "%s", luaL_tolstring(L, 1, NULL));
  } else if (luaL_callmeta(L, 1, "__tostring") &&
             lua_type(L, -1) == LUA_TSTRING) {
    msg = lua_tostring(L, -1);
  } else {
    msg = lua_pushfstring(L, "(error object is a %s value)",
                          luaL_typename(L, 1));
  }
  fprintf(stderr, "ums: error in a task nobody joined: %s%s%s\n", msg,
          tb ? "\n" : "", tb ? tb : "");
  fflush(stderr);
  return 0;
}

static int cancelled_tostring(lua_State *L) {
  lua_pushliteral(L, "task cancelled");
  return 1;
}

/* Keep the module mapped until the process exits: Lua unloads C modules
** at lua_close (os.exit(code, true) does it), and a scheduler thread
** still running in the runtime's code at that moment would crash. */
static void pin_module(void) {
  Dl_info info;
  if (dladdr((void *)pin_module, &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

const lums_vm_ops lums_vm_ops_module = {
    lums_open,      lums_swap_os_exit, lums_vmrun_new,
    lums_vmrun_free,  lums_task_start,   lums_report_errors};

int lums_open(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"now", l_now},
      {"io_backend", l_io_backend},
      {"config", l_config},
      {"on_error", l_on_error},
      {"default_on_error", default_on_error},
      {NULL, NULL}};
  pin_module();

  lums_task_metatable(L);
  int task_mt = lua_gettop(L);

  lua_getfield(L, LUA_REGISTRYINDEX, LUMS_CANCELLED_KEY);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_newtable(L);
    lua_pushcfunction(L, cancelled_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, LUMS_CANCELLED_KEY);
  }
  int cancelled = lua_gettop(L);
  if (lua_getfield(L, LUA_REGISTRYINDEX, CONFIG_KEY) == LUA_TNIL) {
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, CONFIG_KEY);
  }
  lua_pop(L, 1);
  if (lua_getfield(L, LUA_REGISTRYINDEX, ONERROR_KEY) == LUA_TNIL) {
    lua_pushcfunction(L, default_on_error);
    lua_setfield(L, LUA_REGISTRYINDEX, ONERROR_KEY);
  }
  lua_pop(L, 1);
  lua_pushstring(L, ums_strerror(UMS_ENOMEM));
  lua_setfield(L, LUA_REGISTRYINDEX, LUMS_NOMEM_KEY);
  new_errors_set(L);
  push_kept(L);
  lua_pop(L, 1);
  /* The metatable of a failed task's handle: the same methods, and a
  ** finalizer that reports an error nobody joined. */
  if (luaL_newmetatable(L, FAILED_MT)) {
    lua_getfield(L, task_mt, "__index");
    lua_setfield(L, -2, "__index");
    lua_getfield(L, task_mt, "__tostring");
    lua_setfield(L, -2, "__tostring");
    lua_pushliteral(L, LUMS_TASK_MT);
    lua_setfield(L, -2, "__name");
    lua_pushcfunction(L, failed_task_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);

  luaL_newlib(L, funcs);
  /* The functions that create tasks get the task metatable as upvalue 1:
  ** cheaper than a registry lookup per spawn. */
  lua_pushvalue(L, task_mt);
  lua_pushcclosure(L, l_run, 1);
  lua_setfield(L, -2, "run");
  lua_pushvalue(L, task_mt);
  lua_pushcclosure(L, l_run_limit, 1);
  lua_setfield(L, -2, "run_limit");
  lua_pushvalue(L, task_mt);
  lua_pushcclosure(L, l_spawn, 1);
  lua_setfield(L, -2, "spawn");
  lums_open_quantum(L);
  lums_open_task(L);
  lums_open_chan(L);
  lums_open_waitq(L);
  lums_open_stats(L);
  lums_open_fs(L);
  lums_open_net(L);
  lums_open_socket(L);
  lums_open_ffi(L);
  lums_open_ext(L);
  lums_open_shared(L);
  lums_open_work(L);
  lua_pushvalue(L, cancelled);
  lua_setfield(L, -2, "CANCELLED");
  push_limits(L);
  lua_setfield(L, -2, "limits");
  lua_pushinteger(L, UMS_LUA_STACK_SIZE_MIN);
  lua_setfield(L, -2, "STACK_SIZE_MIN");
  lua_pushliteral(L, "ums " UMS_VERSION_STRING);
  lua_setfield(L, -2, "_VERSION");
  return 1;
}
