/*
** ums-lua.h: ums for C code that works with Lua states.
** Copyright (c) 2026 the ums authors; MIT license, see LICENSE.
**
** One header, grown by audience, each in its own section below:
**
**   - C modules (section "Going preemptive from a lua_CFunction"): a
**     lua_CFunction in any shared object loaded with `require` hands a
**     blocking piece of work to ums's hidden preemptive pool (the C-call
**     pool behind ums_preempt, docs/design/preempt.md) and resumes the calling
**     task through a continuation with the results. Only the calling task
**     waits; its scheduler keeps running the others.
**   - C hosts (section "Embedding: a C host runs Lua work"): a program
**     that links libums-lua and libums (`pkg-config --cflags --libs ums`)
**     creates a runtime with a Lua VM per scheduler and submits Lua work
**     to it from any of its threads. Those are ordinary exported
**     functions, not the table below: a host links against them.
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

#include "ums.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ====================================================================== */
/* The function table                                                      */
/* ====================================================================== */

/* Registry key (LUA_REGISTRYINDEX) of a light userdata pointing at the
** ums_lua_api_t of the ums.core loaded into that Lua state. */
#define UMS_LUA_API_KEY "ums.lua_api"

/* The version this header was written for. Version 1: ums_lua_preempt;
** version 2: ums_lua_wait_fd. */
#define UMS_LUA_API_VERSION 2

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

/* ---- Waiting for a descriptor: the types (see the section below) ---- */

/* The continuation of ums_lua_wait_fd: revents is poll(2)'s (> 0: the
** events asked for that are ready, POLLHUP and POLLERR whatever was
** asked), or 0 when the timeout passed first. ctx is the caller's. */
typedef int (*ums_lua_fd_cont_fn)(lua_State *L, int revents, void *ctx);

typedef struct ums_lua_api {
  uint32_t version;  /* the highest UMS_LUA_API_VERSION ums.core provides */
  uint32_t size;     /* sizeof (ums_lua_api_t) as ums.core was built */
  /* ---- version 1 ---- */
  int (*preempt)(lua_State *L, ums_lua_work_fn work, void *ud,
                 ums_lua_release_fn release, ums_lua_cont_fn k,
                 double timeout, int flags);
  /* ---- version 2 ---- */
  int (*wait_fd)(lua_State *L, int fd, int events, double timeout,
                 ums_lua_fd_cont_fn k, void *ctx);
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

/* ====================================================================== */
/* Waiting for a descriptor from a lua_CFunction                           */
/* ====================================================================== */
/*
** A binding of a C library that does its own I/O on descriptors it owns
** (a database driver's socket, curl's multi interface, an inotify or
** event descriptor) parks the calling task until one of them is ready,
** without a thread: the function ends with
**   return ums_lua_wait_fd(L, fd, POLLIN, timeout, k, ctx);
** and k(L, revents, ctx) runs in the task once fd is ready (revents > 0)
** or the timeout passed (revents 0), then makes the library's
** non-blocking call and pushes the results (or waits again, ending with
** ums_lua_wait_fd once more). events are poll(2)'s (POLLIN, POLLOUT,
** POLLPRI from <poll.h>).
**
** The wait is the runtime's ums_wait_fd (ums.h, "Sockets"): on the
** scheduler's io_uring (a poll request) or its epoll set; the task yields
** its coroutine where Lua can yield (where it cannot, it keeps its worker,
** bound, as ums_lua_preempt does), and holds no pool thread. The
** descriptor is not changed (its O_NONBLOCK stays the module's) and must
** stay open until k runs. When the task is cancelled during the wait,
** ums.CANCELLED is raised in it (k does not run). Outside a task, poll(2)
** on the calling thread, then k.
**
** Stack and errors as for ums_lua_preempt's continuation: k sees the
** stack the function had when it called ums_lua_wait_fd and may raise.
** ctx is passed through untouched (it may point into a userdata of that
** stack, which keeps it alive). A bad descriptor or no event asked for
** raises "<function>: <strerror>". Raises if ums is not loaded into L or
** is older than version 2. */
static inline int ums_lua_wait_fd(lua_State *L, int fd, int events,
                                  double timeout, ums_lua_fd_cont_fn k,
                                  void *ctx) {
  const ums_lua_api_t *api = ums_lua_api_get(
      L, 2, offsetof(ums_lua_api_t, wait_fd) + sizeof(void (*)(void)));
  if (api == NULL) return ums_lua_api_error(L, ums_lua_pushfname(L), 2);
  return api->wait_fd(L, fd, events, timeout, k, ctx);
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

/* ====================================================================== */
/* Embedding: a C host runs Lua work                                       */
/* ====================================================================== */
/*
** A host is a C program that owns a ums runtime whose schedulers run Lua.
** Each scheduler gets its own Lua VM, made on that scheduler's thread the
** first time it starts Lua work; the host itself owns no VM and never
** touches one (its setup function runs inside each new VM, on that VM's
** thread). Work requests go from any host thread to the least-loaded
** scheduler and come back as C values:
**
**   ums_lua_host_t *h = ums_lua_host_new(&cfg, &err);
**   ums_lua_value_t args[2] = {ums_lua_integer(2), ums_lua_integer(40)};
**   ums_lua_req_t *req;
**   ums_lua_submit(h, "mymod.add", args, 2, NULL, &req);
**   const ums_lua_result_t *res;
**   if (ums_lua_req_wait(req, ums_deadline(UMS_NSEC_PER_SEC), &res) == 0)
**     ... res->status, res->values[0].u.integer ...
**   ums_lua_req_free(req);
**   ums_lua_host_delete(h);   (or ums_lua_host_shutdown first)
**
** The same runtime runs the host's own C tasks (ums_task_spawn on
** ums_lua_host_runtime(h)), with every wait, timer, file call and
** preemptive call of ums.h; and Lua code in the VMs may `require "ums"`
** and use all of it (ums.spawn, ums.submit, channels, ums.fs, ums.ffi):
** the VMs are given this library's own module, never a second copy from
** package.cpath.
**
** Errors: functions return 0 or a negative UMS_E* code (ums.h);
** ums_lua_last_error() says why in words, on the thread that failed.
*/

/* ---- Values ---- */

/* The types of the values that cross between the host and Lua. */
enum {
  UMS_LUA_TNIL = 0,
  UMS_LUA_TBOOLEAN,
  UMS_LUA_TINTEGER,   /* a Lua integer (math.type "integer") */
  UMS_LUA_TFLOAT,     /* a Lua float: 1.0 stays a float */
  UMS_LUA_TSTRING,    /* bytes, any content; also NUL-terminated */
  UMS_LUA_TTABLE      /* key/value pairs of these types */
};

typedef struct ums_lua_value ums_lua_value_t;
typedef struct ums_lua_field ums_lua_field_t;

/* A value. Whoever holds one owns its string or table memory and frees
** it with ums_lua_value_free (a value made by a constructor below, or one
** taken out of a result with ums_lua_value_copy). Plain struct: copying
** it copies the ownership, not the memory. */
struct ums_lua_value {
  int type;                               /* UMS_LUA_T* */
  union {
    int boolean;                          /* 0 or 1 */
    int64_t integer;
    double number;
    struct {
      char *ptr;                          /* len bytes and a NUL */
      size_t len;
    } string;
    struct {
      ums_lua_field_t *fields;            /* n pairs, in no set order */
      size_t n, cap;
    } table;
  } u;
};

struct ums_lua_field {
  ums_lua_value_t key, value;
};

/* Constructors. Scalars and empty tables allocate nothing. */
static inline ums_lua_value_t ums_lua_nil(void) {
  ums_lua_value_t v;
  memset(&v, 0, sizeof v);
  return v;
}
static inline ums_lua_value_t ums_lua_boolean(int b) {
  ums_lua_value_t v = ums_lua_nil();
  v.type = UMS_LUA_TBOOLEAN;
  v.u.boolean = b != 0;
  return v;
}
static inline ums_lua_value_t ums_lua_integer(int64_t i) {
  ums_lua_value_t v = ums_lua_nil();
  v.type = UMS_LUA_TINTEGER;
  v.u.integer = i;
  return v;
}
static inline ums_lua_value_t ums_lua_float(double d) {
  ums_lua_value_t v = ums_lua_nil();
  v.type = UMS_LUA_TFLOAT;
  v.u.number = d;
  return v;
}
/* An empty table (allocates nothing until a field is set). */
static inline ums_lua_value_t ums_lua_table(void) {
  ums_lua_value_t v = ums_lua_nil();
  v.type = UMS_LUA_TTABLE;
  return v;
}
/* A copy of the NUL-terminated s, or of len bytes at s; a nil value when
** s is NULL or memory runs out. */
UMS_API ums_lua_value_t ums_lua_string(const char *s);
UMS_API ums_lua_value_t ums_lua_lstring(const char *s, size_t len);
/* Sets t[key] = value, taking both (they are t's now, also on failure,
** when they are freed). A key set twice: Lua sees the last value.
** Returns 0, UMS_EINVAL (t is not a table; key is nil or NaN) or
** UMS_ENOMEM. */
UMS_API int ums_lua_table_set(ums_lua_value_t *t, ums_lua_value_t key,
                              ums_lua_value_t value);
/* The same with a string key (copied). */
UMS_API int ums_lua_table_setfield(ums_lua_value_t *t, const char *key,
                                   ums_lua_value_t value);
/* Lookups for reading results: the value of the field with this string
** key or integer key, or NULL (t not a table, or no such field). The
** pointer is into t. */
UMS_API const ums_lua_value_t *ums_lua_table_getfield(
    const ums_lua_value_t *t, const char *key);
UMS_API const ums_lua_value_t *ums_lua_table_geti(const ums_lua_value_t *t,
                                                  int64_t i);
/* A deep copy of v into *out: 0 or UMS_ENOMEM (*out is then nil). */
UMS_API int ums_lua_value_copy(const ums_lua_value_t *v,
                               ums_lua_value_t *out);
/* Frees what v owns and makes it nil. NULL is ignored. */
UMS_API void ums_lua_value_free(ums_lua_value_t *v);

/* ---- The host ---- */

typedef struct ums_lua_host ums_lua_host_t;

/* Runs in each new Lua VM, on the thread of its scheduler `sched` (0 to
** schedulers - 1), after the standard libraries, package.path/cpath and
** `require "ums"`, and before the init module and any work: the place to
** register the host's C functions (package.preload, globals), adjust
** package.path, load configuration. It may raise a Lua error (luaL_error)
** or return nonzero: the VM is then refused and that scheduler takes no
** work from then on (what is queued for it goes to the others); once
** every scheduler has refused, every request ends with the error of one
** of them. It must not call back into the host API on the same host
** (submitting is fine, waiting is not). */
typedef int (*ums_lua_setup_fn)(lua_State *L, int sched, void *arg);

/* The smallest stack_size a host (and ums.config) accepts. Lua allows
** 200 nested C calls (LUAI_MAXCCALLS) before it raises "C stack
** overflow", and a task's worker stack must hold them: a string.gsub
** callback is the costliest level, about 2 KiB (its match state and
** buffer), so 200 of them with a load or a copy on top take about
** 420 KiB; the rest is margin for other compilers' frames and the
** runtime's own (UMS_STACK_SIZE_MIN). */
#define UMS_LUA_STACK_SIZE_MIN (512 * 1024)

/* Configuration; zero-initialise and set what you need. */
typedef struct ums_lua_host_config {
  ums_config_t runtime;        /* schedulers, workers, I/O, stats... as
                                  for ums_runtime_new (0: defaults);
                                  stack_size defaults to 1 MiB here, and
                                  is at least UMS_LUA_STACK_SIZE_MIN */
  const char *path;            /* package.path of every VM; NULL: Lua's
                                  default (LUA_PATH_5_4 / LUA_PATH) */
  const char *cpath;           /* package.cpath, the same way */
  const char *init;            /* a module required in every VM after
                                  setup, before its first work; NULL */
  ums_lua_setup_fn setup;      /* NULL: none */
  void *setup_arg;
  double quantum;              /* seconds a Lua task may compute before it
                                  yields at its next call that can wait
                                  (anywhere, and sees a cancellation, with
                                  preempt): 0 gives 4 ms, negative turns
                                  it off. With preempt, a monitor thread
                                  signals a scheduler thread with SIGURG
                                  when a step runs past it: the handler
                                  is installed unless the process has
                                  one */
  int preempt;                 /* 0: a task past its quantum yields at its
                                  next call that can wait (UMS_PREEMPT=1
                                  in the environment: as 1); 1: also
                                  between any two Lua instructions;
                                  negative: never between instructions */
} ums_lua_host_config_t;

/* Starts the runtime (no VM yet: each is made when its scheduler first
** gets work). cfg may be NULL. NULL on failure, with *err (if not NULL)
** set as ums_runtime_new sets it, or UMS_EINVAL for a bad config (a
** virtual clock with more than one scheduler, a stack_size below
** UMS_LUA_STACK_SIZE_MIN). Any thread. */
UMS_API ums_lua_host_t *ums_lua_host_new(const ums_lua_host_config_t *cfg,
                                         int *err);

/* The runtime, for the host's own C tasks (ums_task_spawn), waits and
** stats (ums_runtime_stats, ums_runtime_tasks, ums_runtime_waits); NULL
** once ums_lua_host_shutdown has begun. Do not pass it to
** ums_runtime_shutdown: ums_lua_host_shutdown does that. */
UMS_API ums_runtime_t *ums_lua_host_runtime(ums_lua_host_t *h);

/* Work requests as a whole (the schedulers' own figures are in
** ums_runtime_stats). */
typedef struct ums_lua_host_stats {
  uint64_t submitted;          /* accepted by ums_lua_submit*, total */
  uint64_t ok;                 /* ended with results */
  uint64_t errors;             /* ended with an error */
  uint64_t cancelled;          /* ended cancelled (also by shutdown) */
  uint64_t in_flight;          /* submitted and not ended yet */
  int vms;                     /* Lua VMs made so far */
  int schedulers;
} ums_lua_host_stats_t;

/* Fills *out: 0, UMS_EINVAL (NULL). Any thread, also after shutdown
** (the totals stay). */
UMS_API int ums_lua_host_stats(ums_lua_host_t *h, ums_lua_host_stats_t *out);

/* Stops taking work (submits fail with UMS_ESHUTDOWN), lets the requests
** and tasks there are run until the absolute deadline (ums_now() clock;
** UMS_FOREVER: until they end; 0: not at all), then cancels what is
** left: requests not started end cancelled at once, running ones see
** ums.CANCELLED at their next wait (or quantum), C tasks UMS_ECANCELED.
** When it returns, every request has ended and its callback has been
** called exactly once, every runtime thread is joined and every VM is
** closed; h itself stays valid (its calls fail with UMS_ESHUTDOWN, the
** stats stay) until ums_lua_host_delete. Any host thread, not a task of
** h (UMS_EDEADLK). Returns 0, UMS_ETIMEDOUT when something had to be
** cancelled, UMS_ESHUTDOWN when a shutdown already began (it waits for
** that one to end first). Lua code that never yields and runs with the
** quantum off, or a C call that never returns, makes it wait forever. */
UMS_API int ums_lua_host_shutdown(ums_lua_host_t *h, int64_t deadline);

/* Shuts down if that has not been done (deadline UMS_FOREVER) and frees
** h. No other thread may be inside a call on h or on one of its requests,
** nor make one after, except ums_lua_req_wait and ums_lua_req_free
** (request handles outlive their host) and ums_lua_req_cancel, which
** returns UMS_ESRCH for an ended request without touching its host. */
UMS_API void ums_lua_host_delete(ums_lua_host_t *h);

/* ---- Work requests ---- */

typedef struct ums_lua_req ums_lua_req_t;

/* How a request ended (ums_lua_result_t.status). */
enum {
  UMS_LUA_REQ_OK = 0,          /* values hold the function's results */
  UMS_LUA_REQ_ERROR = 1,       /* error and traceback say what happened */
  UMS_LUA_REQ_CANCELLED = 2    /* ums_lua_req_cancel or the shutdown;
                                  error says which */
};

/* A request's outcome. Owned by the request: valid while a handle to it
** is held (in the callback: while the callback runs). */
typedef struct ums_lua_result {
  int status;                  /* UMS_LUA_REQ_* */
  int nvalues;
  const ums_lua_value_t *values;  /* OK: the results (nvalues of them) */
  const char *error;           /* ERROR: the error value as text (a
                                  non-string error: its type); CANCELLED:
                                  why; OK: NULL */
  const char *traceback;       /* ERROR: the traceback in the VM where it
                                  was raised, starting with the message
                                  as luaL_traceback writes it ("" if
                                  none); CANCELLED while it ran: where;
                                  else NULL */
  int sched;                   /* the scheduler it ran on; -1: none */
} ums_lua_result_t;

/* Called once per request, when it ends: on the scheduler thread that ran
** it, or on the thread that cancelled it before it started (the caller of
** ums_lua_req_cancel or ums_lua_host_shutdown). It must not block for
** long (it holds up a scheduler), nor wait on its own request; it may
** submit more work and free handles. req is valid during the call. */
typedef void (*ums_lua_done_fn)(ums_lua_req_t *req,
                                const ums_lua_result_t *res, void *arg);

/* Submit options; NULL means: least-loaded scheduler, no callback. */
typedef struct ums_lua_submit_opts {
  int sched;                   /* the scheduler whose queue takes it:
                                  UMS_ANY_SCHED (the least-loaded one) or
                                  an index (0 is scheduler 0, not "any");
                                  an idle scheduler may still take it
                                  before it starts, as for ums.submit_on */
  ums_lua_done_fn done;        /* NULL: none */
  void *done_arg;
} ums_lua_submit_opts_t;

/* Submits a call of the Lua function `fname` ("module.function": the
** VM does require "module" and calls its field "function"; "a.b.c" is
** field c of module "a.b") with nargs copied arguments. Any thread,
** tasks of h included. On success returns 0 and, if req is not NULL,
** stores a handle the caller owns (ums_lua_req_free). Needs req or a
** callback (else nobody would see the outcome: UMS_EINVAL). Fails with
** UMS_EINVAL (NULL h or fname, a name without a module or a function
** part, nargs < 0, args NULL with nargs > 0, a bad value: an unknown
** type, a nil or NaN table key; a scheduler index out of range),
** UMS_ENOMEM, UMS_ESHUTDOWN. A function the VM cannot find is not known
** here: the request ends with that error. The arguments stay the
** caller's. */
UMS_API int ums_lua_submit(ums_lua_host_t *h, const char *fname,
                           const ums_lua_value_t *args, int nargs,
                           const ums_lua_submit_opts_t *opts,
                           ums_lua_req_t **req);

/* The same for a chunk of Lua source (len bytes; text only), loaded in
** the VM that runs it and called with the arguments as `...`. chunkname
** names it in messages and tracebacks (NULL: "=(host chunk)"). A syntax
** error ends the request with that error. */
UMS_API int ums_lua_submit_chunk(ums_lua_host_t *h, const char *source,
                                 size_t len, const char *chunkname,
                                 const ums_lua_value_t *args, int nargs,
                                 const ums_lua_submit_opts_t *opts,
                                 ums_lua_req_t **req);

/* Waits until req has ended or the absolute deadline passes (UMS_FOREVER:
** no limit; 0: just look). Returns 0 and stores the outcome in *res (may
** be NULL), UMS_ETIMEDOUT, UMS_EINVAL (NULL req), UMS_ECANCELED (the
** calling task was cancelled). From a host thread it blocks the thread;
** from a C task it parks only the task. When it returns 0 the request's
** callback has returned. */
UMS_API int ums_lua_req_wait(ums_lua_req_t *req, int64_t deadline,
                             const ums_lua_result_t **res);

/* Cancels req: 0 if it had not ended (one not started never starts and
** ends cancelled now, its callback called on this thread; a running one
** sees ums.CANCELLED at its next wait, or at its quantum if it computes,
** and ends cancelled unless it catches it), UMS_ESRCH once it has ended,
** UMS_EINVAL (NULL). Any thread. During a shutdown's grace period it
** cancels as usual; after it, it returns 0 and leaves the cancelling to
** the shutdown. */
UMS_API int ums_lua_req_cancel(ums_lua_req_t *req);

/* Lets go of the handle. The request goes on (its callback still comes);
** its memory is freed once nothing holds it. NULL is ignored. Any
** thread, also after the host's shutdown. */
UMS_API void ums_lua_req_free(ums_lua_req_t *req);

/* Why the last failed ums_lua_* call of this thread failed, in words
** ("ums_lua_submit: args[2].opts: table key is nil"); "" if none. Valid
** until this thread's next ums_lua_* call. */
UMS_API const char *ums_lua_last_error(void);

/* ---- Lua states of the host's own ---- */

/* The ums.core module of this library, as a lua_CFunction: what require
** "ums.core" runs. A host that makes Lua states of its own (outside any
** ums_lua_host) and wants `require "ums"` in them should preload it, so
** that they use this copy of ums rather than load ums/core.so from
** package.cpath (a host linked with the static libraries would otherwise
** get two copies of the runtime state):
**   ums_lua_preload(L);   (package.preload["ums.core"] = ums_lua_open)
** The VMs of an ums_lua_host get it without asking. */
UMS_API int ums_lua_open(lua_State *L);
UMS_API void ums_lua_preload(lua_State *L);

#ifdef __cplusplus
}
#endif
#endif /* UMS_LUA_H */
