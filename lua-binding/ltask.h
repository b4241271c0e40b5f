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
  lua_State *co;         /* its coroutine (kept while pooled); NULL for a
                            task spawned with none pooled until its first
                            step (lums.c, start_co), while its coroutine's
                            anchor entry holds its start: its function, or
                            a table of it and its nargs arguments */
  lua_State *anchor;     /* [const] the anchor thread of its slab chunk
                            (below): its stack holds co at index aidx
                            and, while the task is live, its handle at
                            aidx + 1 */
  int aidx;              /* [const] LUMS_ANCHOR_CO(slot) */
  int slot;              /* [const] its number in the VM's slab */
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

/* Where a task that ended with exactly one result keeps it
** (lhandle.res): a value the collector need not see is copied into the
** handle itself, so that the usual end (`return value`) neither finds
** the handle's Lua value nor stores anything in Lua; any other value
** goes to the handle's extras (below) at 1. */
enum { RES_EXTRAS, RES_NIL, RES_BOOL, RES_INT, RES_FLT, RES_LUD };

/* A task's handle: the full userdata Lua code holds (ums.spawn's result,
** ums.self()). It outlives the task, so it keeps only the outcome; it is
** kept small (no user value, 48 bytes) because one is allocated and
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
  bool extras;           /* its metatable is its own extras table (below) */
  uint8_t res;           /* done ok with one result: where it is (RES_*) */
  int nres;              /* done ok: number of results */
  union {                /* the one result, unless res is RES_EXTRAS */
    lua_Integer i;
    lua_Number n;
    void *p;
    int b;
  } r;
};

/* A VM's ltask records are made LTASK_CHUNK at a time (lums.c, struct
** lkept), and each chunk has an anchor thread: a Lua thread that never
** runs, whose stack holds the values the chunk's records keep from the
** collector (their coroutines, or a task's start while it has none, and
** live tasks' handles) at fixed
** indices, 2 a record from 2 on, with a nil at LUMS_ANCHOR_NIL that
** clears an entry by lua_copy. Storing into a stack slot (lua_xmove
** above the top, then lua_copy) costs a fraction of lua_rawseti into a
** table, which also rehashes as the table grows; the stack is made with
** the chunk, with two free slots above its top for lua_xmove, so
** storing never allocates. The VM's anchor table (lvmrun.anchors) holds the chunks'
** anchor threads at 1, 2, ... */
#define LTASK_CHUNK 256
#define LUMS_ANCHOR_NIL 1
#define LUMS_ANCHOR_CO(slot) (2 + 2 * ((slot) % LTASK_CHUNK))
#define LUMS_ANCHOR_TOP (LUMS_ANCHOR_NIL + 2 * LTASK_CHUNK)

/* Pushes the value at anchor index idx of t's chunk onto L. */
static inline void lums_push_anchored(lua_State *L, const ltask *t,
                                      int idx) {
  lua_pushvalue(t->anchor, idx);
  lua_xmove(t->anchor, L, 1);
}

/* Pushes the handle of live task t (ums.self()'s result). */
static inline void lums_push_handle(lua_State *L, const ltask *t) {
  lums_push_anchored(L, t, t->aidx + 1);
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

/* A handle's extras: a table made when first needed, with the results of
** a task that ended with more than one, or with one the handle cannot
** hold itself (lhandle.res), at 1..nres, and the fields below.
**
** Handles have no user value: the collector traverses a full userdata
** with user values on its own, after the gray list, and that costs more
** than the rest of a task's life; one without them it marks at once,
** with its metatable. So the extras table is the handle's own
** metatable: it starts as a copy of the fields of the metatable the
** handle shares (LUMS_TASK_MT, or lums.c's metatable of failed handles),
** so the handle's methods and __name stay, and holds the X_* fields and
** the results beside them. The collector reaches it from the handle as
** it reaches any metatable, and it goes with the handle; nothing else
** refers to it, so no table of the VM is keyed by handles (a weak-keyed
** one is an ephemeron table, which the collector re-traverses to
** convergence at every cycle, and a run short of memory makes one cycle
** per failed allocation). A handle without extras (lhandle.extras false)
** shares its metatable with every other. A failed handle's finalizer
** goes into its own metatable too (lums.c, keep_protected). Lua code
** that calls getmetatable on a handle sees its extras. */
#define X_ERR "err"        /* done with an error: the error value */
#define X_TB "traceback"   /* done with an error: its traceback */
#define X_LOCALS "locals"  /* task-local storage */
#define X_NAME "name"      /* the task's name */

/* Pushes the extras table of the handle at idx (nil if it has none);
** returns its type. Allocates nothing. */
static inline int lums_handle_get_extras(lua_State *L, int idx) {
  const lhandle *h = (const lhandle *)lua_touserdata(L, idx);
  if (!h->extras) {
    lua_pushnil(L);
    return LUA_TNIL;
  }
  lua_getmetatable(L, idx);
  return LUA_TTABLE;
}

/* Pushes the extras table of the handle at idx, creating it if needed
** with room for narr results (a table grown one result at a time costs
** a resize per result: more than the rest of a task's end). */
LUMS_HIDDEN void lums_handle_extras(lua_State *L, int idx, int narr);

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

/* Reads the arguments of a park from idx on, as core.park_begin takes
** them: timeout, nocancel, wait type (a value of core.WAIT), object (any
** value; its address names it) and blocker (a task handle or nil).
** Raises on a bad one. */
typedef struct lpark_args {
  int64_t deadline;
  int flags;
  int type;
  const void *object;
  ums_task_t blocker;
} lpark_args;
LUMS_HIDDEN lpark_args lums_check_park_args(lua_State *L, int idx);

/* Pushes the task metatable (LUMS_TASK_MT), with the handle methods in
** its __index, creating it on the first call in a VM. */
LUMS_HIDDEN void lums_task_metatable(lua_State *L);
/* Adds self, yield, sleep, run_until_idle, park_begin, park_wait, unpark,
** wait_end and take_unjoined to the module table at the top. */
LUMS_HIDDEN void lums_open_task(lua_State *L);

#endif
