/*
** ums-lua.h: ums for C code that works with Lua states.
**
** One header, grown by audience, each in its own section below:
**
**   - C modules (section "Going preemptive from a lua_CFunction"): a
**     lua_CFunction in any shared object loaded with `require` hands a
**     blocking piece of work to ums's hidden preemptive pool (the C-call
**     pool behind ums_preempt, runtime/PREEMPT.md) and resumes the calling
**     task through a continuation with the results. Only the calling task
**     waits; its scheduler keeps running the others.
**   - C hosts that embed ums with Lua VMs will get their section here too;
**     it follows the same rules (one function table, versioned, append
**     only).
**
** Why a function table. Lua loads C modules with dlopen(RTLD_LOCAL), so a
** third-party module cannot link against the symbols of ums.core (the
** `ums` module's C part). Instead, ums.core publishes a table of function
** pointers (ums_lua_api_t) in the Lua registry, under UMS_LUA_API_KEY,
** when it is loaded into a Lua state; the static inline functions of this
** header fetch it from the registry of the state they are given, check
** its version, and call through it. A module therefore needs only
** <lua.h>, <lauxlib.h> and this header, links against nothing of ums,
** and fails with a clear Lua error when `ums` is not loaded or too old.
**
** Rules of the table. Members are only ever appended; a member is never
** changed or removed. UMS_LUA_API_VERSION counts the versions; `size` is
** sizeof (ums_lua_api_t) as ums.core was built, so a header may check
** that a member it calls is inside the table it got. The table is
** static data of ums.core, which stays mapped until the process exits.
*/
#ifndef UMS_LUA_H
#define UMS_LUA_H

#include <lauxlib.h>
#include <lua.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ====================================================================== */
/* The function table                                                      */
/* ====================================================================== */

/* Registry key (LUA_REGISTRYINDEX) of a light userdata pointing at the
** ums_lua_api_t of the ums.core loaded into that Lua state. */
#define UMS_LUA_API_KEY "ums.lua_api"

/* The version this header was written for. Version 1: ums_lua_preempt. */
#define UMS_LUA_API_VERSION 1

/* ---- Going preemptive: the types (see the section below) ---- */

/* What a work function gets besides its own data: a view of the call it
** runs for. Valid while the work function runs; owned by ums.core. */
typedef struct ums_lua_work ums_lua_work_t;
struct ums_lua_work {
  uint32_t size;  /* sizeof (ums_lua_work_t) as ums.core made it */
  /* Nonzero once the calling task has given up on the call (timeout or
  ** cancellation): the results will be dropped, so the work may stop at
  ** its next convenient point. Callable from the work's thread, any
  ** number of times. Use ums_lua_abandoned(). */
  int (*abandoned)(const ums_lua_work_t *w);
};

/* The work: runs on a pool thread (or, outside a task, on the calling
** thread) with the data the lua_CFunction prepared. It must not touch any
** Lua state. */
typedef void (*ums_lua_work_fn)(void *ud, const ums_lua_work_t *w);

/* Frees the work's data. Called exactly once per ums_lua_preempt call,
** on whichever thread lets go of ud last (see "Ownership of ud"). */
typedef void (*ums_lua_release_fn)(void *ud);

/* The continuation: runs in Lua on the calling task's scheduler with the
** stack the lua_CFunction had when it called ums_lua_preempt, and returns
** the number of results it pushed, like a lua_CFunction. status is
** UMS_LUA_OK (the work ran to its end; ud holds its results) or
** UMS_LUA_TIMEOUT (the timeout passed first; ud is NULL, because the work
** still uses it). */
typedef int (*ums_lua_cont_fn)(lua_State *L, int status, void *ud);

/* Continuation status. */
#define UMS_LUA_OK 0
#define UMS_LUA_TIMEOUT 1

/* ums_lua_preempt flags. UMS_LUA_ERRNO: errno is cleared before the work
** runs, and the continuation finds errno as the work left it (when status
** is UMS_LUA_OK). */
#define UMS_LUA_ERRNO 1

/* No timeout (any negative number means none). */
#define UMS_LUA_NOTIMEOUT (-1.0)

typedef struct ums_lua_api {
  uint32_t version;  /* the highest UMS_LUA_API_VERSION ums.core provides */
  uint32_t size;     /* sizeof (ums_lua_api_t) as ums.core was built */
  /* ---- version 1 ---- */
  int (*preempt)(lua_State *L, ums_lua_work_fn work, void *ud,
                 ums_lua_release_fn release, ums_lua_cont_fn k,
                 double timeout, int flags);
} ums_lua_api_t;

/* The table of the ums.core loaded into L, or NULL when there is none or
** it lacks version `version` or has fewer than `need` bytes. */
static inline const ums_lua_api_t *ums_lua_api_get(lua_State *L,
                                                   uint32_t version,
                                                   size_t need) {
  const ums_lua_api_t *api;
  lua_getfield(L, LUA_REGISTRYINDEX, UMS_LUA_API_KEY);
  api = (const ums_lua_api_t *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (api == NULL || api->version < version || api->size < need)
    return NULL;
  return api;
}

/* Raises the error for a missing or too old table, naming `who`. */
static inline int ums_lua_api_error(lua_State *L, const char *who,
                                    uint32_t version) {
  const ums_lua_api_t *api;
  lua_getfield(L, LUA_REGISTRYINDEX, UMS_LUA_API_KEY);
  api = (const ums_lua_api_t *)lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (api == NULL)
    return luaL_error(L, "%s: ums is not loaded in this Lua state "
                         "(require \"ums\" before using this module)",
                      who);
  return luaL_error(L, "%s: the loaded ums provides C extension API "
                       "version %d, this module needs version %d (update "
                       "ums)", who, (int)api->version, (int)version);
}

/* Pushes the name of the running C function, for error messages, and
** returns it: the name its caller used ("crc32_file"), else where a
** loaded module holds it ("zutil.crc32_file", as luaL_argerror finds
** it), else "?". */
static inline const char *ums_lua_pushfname(lua_State *L) {
  lua_Debug ar;
  int fn;
  luaL_checkstack(L, 8, NULL);
  if (!lua_getstack(L, 0, &ar) || !lua_getinfo(L, "nf", &ar))
    return lua_pushliteral(L, "?");
  if (ar.name) {
    lua_pop(L, 1);
    return lua_pushstring(L, ar.name);
  }
  fn = lua_gettop(L);
  if (lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE) != LUA_TTABLE) {
    lua_settop(L, fn - 1);
    return lua_pushliteral(L, "?");
  }
  lua_pushnil(L);
  while (lua_next(L, fn + 1)) {          /* modname, module */
    if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TTABLE) {
      lua_pushnil(L);
      while (lua_next(L, -2)) {          /* field, value */
        if (lua_type(L, -2) == LUA_TSTRING && lua_rawequal(L, -1, fn)) {
          const char *mod = lua_tostring(L, -4);
          const char *field = lua_tostring(L, -2);
          if (strcmp(mod, LUA_GNAME) == 0)
            lua_pushstring(L, field);
          else
            lua_pushfstring(L, "%s.%s", mod, field);
          lua_replace(L, fn);
          lua_settop(L, fn);
          return lua_tostring(L, fn);
        }
        lua_pop(L, 1);
      }
    }
    lua_pop(L, 1);
  }
  lua_settop(L, fn - 1);
  return lua_pushliteral(L, "?");
}

/* For a module's luaopen_ function: raises "<who>: ums is not loaded ..."
** unless the ums loaded into L provides everything this header declares,
** so that a module loaded without ums fails at `require`, not at its
** first call. Returns the version ums.core provides. */
static inline int ums_lua_check(lua_State *L, const char *who) {
  const ums_lua_api_t *api =
      ums_lua_api_get(L, UMS_LUA_API_VERSION, sizeof(ums_lua_api_t));
  if (api == NULL) return ums_lua_api_error(L, who, UMS_LUA_API_VERSION);
  return (int)api->version;
}

/* ====================================================================== */
/* Going preemptive from a lua_CFunction                                   */
/* ====================================================================== */
/*
** A lua_CFunction that must make a blocking call (a read, a library
** without an async interface, a long computation) splits itself in three:
**
**   1. the function itself checks and copies its Lua arguments into a
**      heap struct `ud` (everything the work will read, and room for what
**      it will write), then ends with
**        return ums_lua_preempt(L, work, ud, release, k, timeout, flags);
**   2. work(ud, w) runs on a pool thread and never touches Lua;
**   3. k(L, status, ud) runs back in the task, in Lua, and pushes the
**      results from ud (status UMS_LUA_OK) or reports the timeout (status
**      UMS_LUA_TIMEOUT, ud NULL); ud is released after k returns or
**      raises.
**
** Inside a task, only the calling task waits: it yields its coroutine
** where Lua can yield, and where it cannot (inside table.sort's
** comparator, a metamethod, a C call without continuation, the user's own
** coroutine) it keeps its worker, bound, while another worker runs its
** scheduler. Either way the caller sees an ordinary function call.
** Outside a task (plain Lua, no ums.run), work runs right away on the
** calling thread and k follows; the timeout does not apply there.
**
** Timeout and cancellation. timeout is in seconds (a negative number:
** none). When it passes before the work returns, the call is detached,
** never killed (a thread cannot safely be stopped in foreign code): the
** work runs to its end on the pool thread without the caller, and k runs
** at once with UMS_LUA_TIMEOUT. When the task is cancelled during the
** call, the call is detached the same way and ums.CANCELLED is raised in
** the task (k does not run), which then unwinds as at any ums wait.
** ums_lua_abandoned(w) tells a long work that it may stop early. When the
** work returned before the task noticed its timeout or cancellation, k
** runs with UMS_LUA_OK.
**
** Ownership of ud. ums_lua_preempt takes ud and calls release(ud) exactly
** once (release may be NULL), when nothing uses ud any more:
**   - after k has returned or raised, when the work ran to its end (the
**     release runs when the C function's frame is closed: at its return,
**     or as its error unwinds, like a <close> variable);
**   - on the pool thread after the work returned, when the caller gave up
**     (timeout or cancellation): k never sees ud then;
**   - before ums_lua_preempt raises, when the call cannot start (bad
**     arguments to ums_lua_preempt, out of memory, the task was already
**     cancelled, ums not loaded).
** So ud must be heap memory owned by nothing else, and release must be
** callable from any thread. Everything the work reads must be inside ud
** (or live as long as it): Lua strings may be collected while a detached
** work still runs, so copy them.
**
** Errors. k may raise like any lua_CFunction (luaL_error, luaL_argerror):
** the error goes up through the caller's pcall or ends the task, and
** reaches its joiner or the runtime's error handler; ud is still
** released. Errors of ums_lua_preempt itself are raised naming the Lua
** function ("crc32_file: out of memory").
**
** Stack. k sees the values the lua_CFunction had on its stack when it
** called ums_lua_preempt, at the same indices (its arguments, typically),
** in a frame of its own: it may pop them. k may call Lua, wait on ums
** objects and raise; it must not be called directly by the module.
**
** Threads. The lua_CFunction and k run on the Lua state's thread (the
** task's scheduler thread); work and, after a timeout or cancellation,
** release run on a pool thread. Whatever work wrote into ud is visible to
** k. The work must not block forever: ums_runtime_shutdown (the end of
** ums.run) waits for detached work, interrupting its system calls with a
** signal every few milliseconds (they fail with EINTR).
*/

/* Runs work(ud) on the preemptive pool and continues with k; see above.
** Call it as `return ums_lua_preempt(...)`: like lua_yieldk, it does not
** return to its caller when the task yields; otherwise it returns what k
** returned. Raises if ums is not loaded into L (after releasing ud). */
static inline int ums_lua_preempt(lua_State *L, ums_lua_work_fn work,
                                  void *ud, ums_lua_release_fn release,
                                  ums_lua_cont_fn k, double timeout,
                                  int flags) {
  const ums_lua_api_t *api = ums_lua_api_get(
      L, 1, offsetof(ums_lua_api_t, preempt) + sizeof(void (*)(void)));
  if (api == NULL) {
    /* ud is still ours: release it before raising. */
    if (release) release(ud);
    return ums_lua_api_error(L, ums_lua_pushfname(L), 1);
  }
  return api->preempt(L, work, ud, release, k, timeout, flags);
}

/* Nonzero once the caller has given up on the call w runs for. */
static inline int ums_lua_abandoned(const ums_lua_work_t *w) {
  return w->abandoned(w);
}

/* An optional timeout argument: nil or none gives UMS_LUA_NOTIMEOUT; a
** number must not be negative (or NaN): a Lua argument error otherwise. */
static inline double ums_lua_opttimeout(lua_State *L, int arg) {
  lua_Number s;
  if (lua_isnoneornil(L, arg)) return UMS_LUA_NOTIMEOUT;
  s = luaL_checknumber(L, arg);
  luaL_argcheck(L, s >= 0, arg, "timeout must be a non-negative number");
  return (double)s;
}

#ifdef __cplusplus
}
#endif
#endif /* UMS_LUA_H */
