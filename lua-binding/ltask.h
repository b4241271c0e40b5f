/*
** ltask.h: tasks as Lua sees them (ltask.c): the current task's waits,
** and task handles, the userdata Lua code holds for a task (ums.spawn's
** result, ums.self()), with their methods and the joins that wait for a
** task's end. The task's life cycle (spawn, step, finish) fills the
** handle in; these read it.
*/
#ifndef LTASK_H
#define LTASK_H

#include "lums.h"

#define LUMS_TASK_MT "ums.task"
/* The message of a task the runtime cannot run for lack of memory, made
** when the module opens: ending such a task must not need memory for it. */
#define LUMS_NOMEM_KEY "ums.nomem"

/* Every task userdata starts with this address (see lchan.c's chan_tag
** for why not luaL_checkudata). */
LUMS_HIDDEN extern const char lums_task_tag;

/* A handle's extras: a table made when first needed, with the results of
** a task that ended with more than one, or with one the handle cannot
** hold itself (lhandle.res), at 1..nres, and the fields below. Handles
** have no user value: a full userdata with one is traversed by the
** collector on its own, and that cost more than the rest of a task's
** life; the extras sit instead in a table of the VM, weak in its keys
** (LUMS_EXTRAS_KEY), so that a handle and its extras go together. */
#define X_ERR "err"        /* done with an error: the error value */
#define X_TB "traceback"   /* done with an error: its traceback */
#define X_LOCALS "locals"  /* task-local storage */
#define X_NAME "name"      /* the task's name */
#define LUMS_EXTRAS_KEY "ums.extras"

/* Pushes the extras table of the handle at idx (nil if it has none);
** returns its type. Allocates nothing. */
static inline int lums_handle_get_extras(lua_State *L, int idx) {
  idx = lua_absindex(L, idx);
  lua_getfield(L, LUA_REGISTRYINDEX, LUMS_EXTRAS_KEY);
  lua_pushvalue(L, idx);
  int type = lua_rawget(L, -2);
  lua_remove(L, -2);
  return type;
}

/* Pushes the extras table of the handle at idx, creating it if needed
** with room for narr results (a table grown one result at a time costs
** a resize per result: more than the rest of a task's end). */
static inline void lums_handle_extras(lua_State *L, int idx, int narr) {
  idx = lua_absindex(L, idx);
  if (lums_handle_get_extras(L, idx) != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, LUMS_EXTRAS_KEY);
    lua_createtable(L, narr, 0);
    lua_pushvalue(L, idx);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4);
    lua_remove(L, -2);
  }
}

/* Wakes every task joining t (t has ended). Inline: every task's end
** passes here. */
static inline void lums_task_wake_joiners(ltask *t) {
  for (int i = 0; i < t->njoiners; i++)
    ums_unpark(t->vmrun->rt, t->joiners[i].tok, 0);
  t->njoiners = 0;
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
