/*
** ltask.h: a task. struct ltask is the record a live task's run keeps
** (lums.c's life cycle: spawn, step, finish); struct lhandle is its
** handle, the userdata Lua code holds for it (ums.spawn's result,
** ums.self()), which the life cycle fills in and ltask.c reads: the
** handle's methods, the joins that wait for a task's end, and the current
** task's waits.
*/
/* Outside the guard: struct ltask embeds lpark.h's lpark_task, and
** lpark.h's inline calls need struct ltask. lpark.h declares lpark_task,
** includes this header, then defines its calls: whichever of the two a
** file includes first, each finds what it needs complete. */
#include "lpark.h"

#ifndef LTASK_H
#define LTASK_H

#include "lums.h"
#include "lccall.h"
#include "lfs.h"
#include "lreq.h"
#include "lquantum.h"
#include "lvm.h"
#include "lwaitq.h"

enum { T_NEW, T_LIVE, T_DONE };

/* A live task: everything its run needs while it runs or waits. Not a
** Lua object: ltasks are records of their VM's slab (lums.c, struct
** lkept), pooled with their coroutines (lvmrun.pool) and recycled, so a
** stale pointer to one is only ever used together with a park token,
** whose task id the runtime checks. Scheduler thread only. The task's
** life cycle (lums.c) owns the record; each embedded struct is declared,
** and its members touched, by the file its comment names. */
struct ltask {
  lhandle *h;            /* its handle (h->id: its runtime id); NULL while
                            pooled */
  lvmrun *vmrun;         /* its VM's part of a run; NULL while pooled */
  lua_State *co;         /* its coroutine (kept while pooled) */
  int slot;              /* [const] its number in the VM's slab: the VM's
                            anchor table holds co at LUMS_ANCHOR_CO(slot)
                            and, while the task is live, its handle at
                            LUMS_ANCHOR_HANDLE(slot) */
  int nargs;             /* arguments waiting for the first resume */
  lpark_task park;       /* lpark.h: its park */
  bool finish_pending;   /* ended with a park begun: finish next step */
  int finish_st, finish_nres;
  lwaitq joiners;        /* ltask.c: the tasks waiting for its end (join,
                            wait_end), each on its own ltask.wait; the
                            life cycle (lums.c) wakes them all when it
                            ends, so it is empty while the record is
                            pooled */
  lwait wait;            /* lwaitq.h: its place on a wait queue (a
                            channel's side, a stream's lock, the joiners
                            of the task it joins) */
  lffi_task ffi;         /* lccall.h: its ums.ffi calls */
  lfs_task fs;           /* lfs.h: its ums.fs calls */
  lreq_task req;         /* lreq.h: the work request it runs */
  lqhook hook;           /* lquantum.c: the user's hook while ums has
                            its own on co */
};

/* A task's handle: the full userdata Lua code holds (ums.spawn's result,
** ums.self()). It outlives the task, so it keeps only the outcome; it is
** kept small (one user value, 40 bytes) because one is allocated and
** collected per task. */
struct lhandle {
  const char *tag;       /* &lums_task_tag: tells a task handle apart */
  ltask *t;              /* the live task; NULL once done */
  ums_task_t id;         /* runtime id, kept after the end */
  uint8_t state;         /* T_NEW, T_LIVE, T_DONE */
  bool ok;               /* done: ended normally */
  bool cancelled;        /* done: ended by cancellation */
  bool joined;           /* its outcome was taken by a join */
  bool nomem;            /* done with an error whose value and traceback
                            could not be kept for lack of memory: it
                            reads as "out of memory", with no traceback */
  int nres;              /* done ok: number of results */
};

/* Where a task's values sit in its VM's anchor table (ltask.slot). */
#define LUMS_ANCHOR_CO(slot) (2 * (lua_Integer)(slot) + 1)
#define LUMS_ANCHOR_HANDLE(slot) (2 * (lua_Integer)(slot) + 2)

/* Pushes the handle of live task t (ums.self()'s result). */
static inline void lums_push_handle(lua_State *L, const ltask *t) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->vmrun->anchors);
  lua_rawgeti(L, -1, LUMS_ANCHOR_HANDLE(t->slot));
  lua_replace(L, -2);
}

/* Whether the quantum monitor has found task t's running step past its
** quantum (lquantum.h). */
static inline bool lums_quantum_due(ltask *t) {
  lvmrun *r = t->vmrun;
  return r && lums_quantum_past(&r->q);
}


#define LUMS_TASK_MT "ums.task"
/* The message of a task the runtime cannot run for lack of memory, made
** when the module opens: ending such a task must not need memory for it. */
#define LUMS_NOMEM_KEY "ums.nomem"

/* Every task userdata starts with this address (see lchan.c's chan_tag
** for why not luaL_checkudata). */
LUMS_HIDDEN extern const char lums_task_tag;

/* The handle's one user value, created when first needed: a table with
** the results at 1..nres, and the fields below. */
#define X_ERR "err"        /* done with an error: the error value */
#define X_TB "traceback"   /* done with an error: its traceback */
#define X_LOCALS "locals"  /* task-local storage */
#define X_NAME "name"      /* the task's name */


/* A task handle's user values: 1, its extras table (the X_* fields and
** the results), made when first needed; 2, the result of a task that
** ended with exactly one, kept there instead of in a table so that the
** usual "return a value" end allocates nothing. */
#define LUMS_HANDLE_UVS 2
#define LUMS_UV_RESULT 2

/* Pushes the extras table of the handle at idx, creating it if needed
** with room for narr results (a table grown one result at a time costs
** a resize per result: more than the rest of a task's end). Inline: a
** task's end fills it. */
static inline void lums_handle_extras(lua_State *L, int idx, int narr) {
  if (lua_getiuservalue(L, idx, 1) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_createtable(L, narr, 0);
    lua_pushvalue(L, -1);
    lua_setiuservalue(L, idx < 0 ? idx - 2 : idx, 1);
  }
}

/* Pushes the error and the traceback of the failed task whose handle h is
** at idx (the traceback nil for a task that ran out of memory). */
LUMS_HIDDEN void lums_handle_push_failure(lua_State *L, int idx, lhandle *h);
/* Pushes the outcome of the finished task whose handle h is at idx, as
** join returns it, and marks it joined; returns the number of values. */
LUMS_HIDDEN int lums_handle_push_outcome(lua_State *L, int idx, lhandle *h);

/* The handle at idx, or NULL if it is no task handle. */
LUMS_HIDDEN lhandle *lums_to_task(lua_State *L, int idx);
/* The same, raising the usual bad-argument error for anything else. */
LUMS_HIDDEN lhandle *lums_check_task(lua_State *L, int idx);

/* Pushes the task metatable (LUMS_TASK_MT), with the handle methods in
** its __index, creating it on the first call in a VM. */
LUMS_HIDDEN void lums_task_metatable(lua_State *L);
/* Adds self, yield, sleep, run_until_idle, park_begin, park_wait, unpark,
** wait_end and take_unjoined to the module table at the top. */
LUMS_HIDDEN void lums_open_task(lua_State *L);

#endif
