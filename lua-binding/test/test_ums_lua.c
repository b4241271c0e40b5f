/*
** test_ums_lua.c: ums-lua.h from a C module's side, against the real
** ums.core loaded by `require` into a real Lua state, with real pool
** threads: the function table and its checks (ums not loaded, a table too
** old or too short), and ums_lua_preempt's contract: where the work runs,
** the stack the continuation sees, errno, and above all that release(ud)
** runs exactly once and never before the work and the continuation are
** done with ud (outside a task, in a task, where Lua cannot yield, after a
** timeout, after a cancel, when the continuation raises, when the call
** cannot start).
**
** Usage: test_ums_lua <dir holding ums/core.so>
*/
#define _GNU_SOURCE
#include "ums-lua.h"

#include <errno.h>
#include <lualib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#define CHECK(cond)                                                       \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__,    \
              #cond);                                                     \
      _exit(1);                                                           \
    }                                                                     \
  } while (0)

/* Requests released so far, and works that saw their caller give up:
** written on pool threads, read by the Lua thread. */
static atomic_int started, released;
/* Long works (sleep_ms >= 1000) that started, are running now, and saw
** their caller give up. A given-up work that no pool thread had taken yet
** is skipped by the runtime, so not every given-up work starts. */
static atomic_int long_started, long_running, saw_abandoned;

/* One request; owned by ums_lua_preempt from the call on. */
typedef struct req {
  lua_Integer in, out;
  int sleep_ms;        /* the work sleeps this long, in 1 ms slices */
  int set_errno;       /* the work leaves errno = EDOM */
  int released_at;     /* `released` when the call started */
  pthread_t caller;    /* the thread of the lua_CFunction */
  int same_thread;     /* work: ran on the caller's thread */
  unsigned char canary[64];
} req;

static void req_release(void *ud) {
  req *r = ud;
  /* ASan would also catch a second release or a use after this. */
  memset(r->canary, 0xdd, sizeof r->canary);
  free(r);
  atomic_fetch_add(&released, 1);
}

static void work(void *ud, const ums_lua_work_t *w) {
  req *r = ud;
  CHECK(w->size >= sizeof *w);
  r->same_thread = pthread_equal(r->caller, pthread_self());
  bool is_long = r->sleep_ms >= 1000;
  if (is_long) {
    atomic_fetch_add(&long_started, 1);
    atomic_fetch_add(&long_running, 1);
  }
  for (int i = 0; i < r->sleep_ms; i++) {
    if (ums_lua_abandoned(w)) {
      atomic_fetch_add(&saw_abandoned, 1);
      break;
    }
    usleep(1000);
  }
  if (is_long) atomic_fetch_sub(&long_running, 1);
  r->out = r->in * 2;
  /* Written after the caller may have given up: must still be ours. */
  memset(r->canary, 0xaa, sizeof r->canary);
  if (r->set_errno) errno = EDOM;
}

/* f's continuation: out, same_thread, errno, arg 1 as it sees it. */
static int k(lua_State *L, int status, void *ud) {
  req *r = ud;
  if (status == UMS_LUA_TIMEOUT) {
    CHECK(ud == NULL);
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  CHECK(status == UMS_LUA_OK);
  int err = errno;
  /* ud is not released before the continuation is done with it. */
  CHECK(atomic_load(&released) >= r->released_at);
  CHECK(r->canary[0] == 0xaa && r->canary[63] == 0xaa);
  /* The stack the function had: its arguments. */
  CHECK(lua_tointeger(L, 1) == r->in);
  if (r->in < 0) return luaL_error(L, "negative input %d", (int)r->in);
  lua_settop(L, 0); /* popping below does not release ud */
  CHECK(r->canary[0] == 0xaa);
  lua_pushinteger(L, r->out);
  lua_pushboolean(L, r->same_thread);
  lua_pushinteger(L, err);
  return 3;
}

/* f(n [, timeout [, sleep_ms [, set_errno]]]) */
static int l_f(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  double timeout = ums_lua_opttimeout(L, 2);
  int sleep_ms = (int)luaL_optinteger(L, 3, 0);
  int set_errno = lua_toboolean(L, 4);
  req *r = calloc(1, sizeof *r);
  CHECK(r);
  atomic_fetch_add(&started, 1);
  r->in = n;
  r->sleep_ms = sleep_ms;
  r->set_errno = set_errno;
  r->released_at = atomic_load(&released);
  r->caller = pthread_self();
  return ums_lua_preempt(L, work, r, req_release, k, timeout,
                         set_errno ? UMS_LUA_ERRNO : 0);
}

/* fnull(): a call with no work function. */
static int l_fnull(lua_State *L) {
  req *r = calloc(1, sizeof *r);
  CHECK(r);
  atomic_fetch_add(&started, 1);
  return ums_lua_preempt(L, NULL, r, req_release, k, -1, 0);
}

/* check() -> the version ums.core provides, or raises. */
static int l_check(lua_State *L) {
  lua_pushinteger(L, ums_lua_check(L, "zz"));
  return 1;
}

static int l_released(lua_State *L) {
  lua_pushinteger(L, atomic_load(&released));
  return 1;
}

static int l_long_running(lua_State *L) {
  lua_pushinteger(L, atomic_load(&long_running));
  return 1;
}

static lua_State *new_state(void) {
  lua_State *L = luaL_newstate();
  CHECK(L);
  luaL_openlibs(L);
  lua_register(L, "f", l_f);
  lua_register(L, "fnull", l_fnull);
  lua_register(L, "check", l_check);
  lua_register(L, "released", l_released);
  lua_register(L, "long_running", l_long_running);
  lua_pushinteger(L, EDOM);
  lua_setglobal(L, "EDOM");
  return L;
}

/* Runs Lua code that must succeed. */
static void run(lua_State *L, const char *code) {
  if (luaL_dostring(L, code) != LUA_OK) {
    fprintf(stderr, "Lua error: %s\nin:\n%s\n", lua_tostring(L, -1), code);
    _exit(1);
  }
  lua_settop(L, 0);
}

/* Runs Lua code that must raise an error containing `want`. */
static void run_fails(lua_State *L, const char *code, const char *want) {
  if (luaL_dostring(L, code) == LUA_OK) {
    fprintf(stderr, "expected an error from:\n%s\n", code);
    _exit(1);
  }
  const char *msg = lua_tostring(L, -1);
  if (!msg || !strstr(msg, want)) {
    fprintf(stderr, "error '%s' does not contain '%s'\n", msg ? msg : "?",
            want);
    _exit(1);
  }
  lua_settop(L, 0);
}

/* ---- the function table ---- */

static void test_not_loaded(void) {
  lua_State *L = new_state();
  int before = atomic_load(&released);
  run_fails(L, "check()", "zz: ums is not loaded in this Lua state "
                          "(require \"ums\" before using this module)");
  /* The call cannot start: ud is released before the error. */
  run_fails(L, "f(1)", "f: ums is not loaded in this Lua state");
  CHECK(atomic_load(&released) == before + 1);
  lua_close(L);
}

static void test_too_old(void) {
  static const ums_lua_api_t v0 = {.version = 0,
                                   .size = sizeof(ums_lua_api_t)};
  /* Says version 1 but is shorter than the member f calls. */
  static const ums_lua_api_t short1 = {.version = 1, .size = 8};
  lua_State *L = new_state();
  int before = atomic_load(&released);
  lua_pushlightuserdata(L, (void *)&v0);
  lua_setfield(L, LUA_REGISTRYINDEX, UMS_LUA_API_KEY);
  /* check() asks for everything the header declares. */
  run_fails(L, "check()", "zz: the loaded ums provides C extension API "
                          "version 0, this module needs version 2 "
                          "(update ums)");
  run_fails(L, "f(1)", "f: the loaded ums provides C extension API "
                       "version 0");
  lua_pushlightuserdata(L, (void *)&short1);
  lua_setfield(L, LUA_REGISTRYINDEX, UMS_LUA_API_KEY);
  run_fails(L, "check()", "zz: the loaded ums provides");
  run_fails(L, "f(1)", "f: the loaded ums provides");
  CHECK(atomic_load(&released) == before + 2);
  lua_close(L);
}

static lua_State *state_with_ums(const char *dir) {
  lua_State *L = new_state();
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s/?.so", dir);
  lua_setfield(L, -2, "cpath");
  lua_pop(L, 1);
  run(L, "core = require 'ums.core'");
  return L;
}

static void test_table(const char *dir) {
  lua_State *L = state_with_ums(dir);
  lua_getfield(L, LUA_REGISTRYINDEX, UMS_LUA_API_KEY);
  const ums_lua_api_t *api = lua_touserdata(L, -1);
  lua_pop(L, 1);
  CHECK(api && api->version == UMS_LUA_API_VERSION);
  CHECK(api->size == sizeof(ums_lua_api_t) && api->preempt);
  run(L, "assert(check() == 2)");
  lua_close(L);
}

/* ---- ums_lua_preempt outside a task ---- */

static void test_outside(const char *dir) {
  lua_State *L = state_with_ums(dir);
  int before = atomic_load(&released);
  run(L, "local out, same = f(21)\n"
         "assert(out == 42 and same == true, 'runs inline')\n"
         "local _, _, e = f(1, nil, 0, true)\n"
         "assert(e == EDOM, 'errno kept: ' .. e)\n"
         "-- the timeout does not apply outside a task\n"
         "assert(f(5, 0, 20) == 10)\n"
         "local ok, err = pcall(f, -1)\n"
         "assert(not ok and err:find('negative input %-1'), err)\n");
  CHECK(atomic_load(&released) == before + 4);
  run_fails(L, "fnull()", "ums_lua_preempt (in 'fnull'): the work "
                          "function is NULL");
  CHECK(atomic_load(&released) == before + 5);
  lua_close(L);
}

/* ---- in tasks ---- */

static void test_in_tasks(const char *dir) {
  lua_State *L = state_with_ums(dir);
  run(L,
      "core.run(function()\n"
      "  local out, same, e = f(21, nil, 0, true)\n"
      "  assert(out == 42 and same == false, 'runs on a pool thread')\n"
      "  assert(e == EDOM)\n"
      "  -- where Lua cannot yield: the worker is bound\n"
      "  local t = {3, 1, 2}\n"
      "  table.sort(t, function(a, b) return f(a) < f(b) end)\n"
      "  assert(t[1] == 1 and t[3] == 3)\n"
      "  -- the continuation raises: the error reaches pcall and join\n"
      "  local ok, err = pcall(f, -1)\n"
      "  assert(not ok and err:find('negative input %-1'), err)\n"
      "  local bad = core.spawn(function() return f(-2) end)\n"
      "  local jok, jerr = bad:join()\n"
      "  assert(jok == false and jerr:find('negative input %-2'), jerr)\n"
      "  -- between park_begin and park_wait the call cannot start\n"
      "  core.park_begin(0)\n"
      "  ok, err = pcall(f, 1)\n"
      "  core.park_wait()\n"
      "  assert(not ok and err:find('f: cannot call between "
      "ums.park_begin and ums.park_wait', 1, true), err)\n"
      "end)\n");
  lua_close(L);
}

static void test_timeout_cancel(const char *dir) {
  lua_State *L = state_with_ums(dir);
  int before = atomic_load(&released);
  int seen = atomic_load(&saw_abandoned), began = atomic_load(&long_started);
  run(L,
      "core.config{preempt_threads = 1}\n"
      "core.run(function()\n"
      "  local function wait_released(n)\n"
      "    local limit = core.now() + 10\n"
      "    while released() < n and core.now() < limit do\n"
      "      core.sleep(0.002)\n"
      "    end\n"
      "    assert(released() == n, 'released ' .. released())\n"
      "  end\n"
      "  local r0 = released()\n"
      "  -- times out: k sees no ud; the work goes on, then is released\n"
      "  local t0 = core.now()\n"
      "  local none, msg = f(1, 0.02, 5000)\n"
      "  assert(none == nil and msg == 'timeout')\n"
      "  assert(core.now() - t0 < 2, 'the timeout did not end the wait')\n"
      "  wait_released(r0 + 1)\n"
      "  -- the one pool thread is free again\n"
      "  assert(f(4, 5) == 8)\n"
      "  -- cancelled during the call\n"
      "  local started = false\n"
      "  local t = core.spawn(function()\n"
      "    started = true\n"
      "    return f(1, nil, 5000)\n"
      "  end)\n"
      "  while not started do core.yield() end\n"
      "  -- cancelled once the work runs on the pool\n"
      "  local limit = core.now() + 10\n"
      "  while long_running() == 0 and core.now() < limit do\n"
      "    core.sleep(0.001)\n"
      "  end\n"
      "  assert(long_running() == 1, 'the work never started')\n"
      "  assert(t:cancel())\n"
      "  local ok, err = t:join(5)\n"
      "  assert(ok == false and err == core.CANCELLED, tostring(err))\n"
      "  wait_released(r0 + 3)\n"
      "  assert(f(4, 5) == 8)\n"
      "  -- where Lua cannot yield, timed out too\n"
      "  local res\n"
      "  table.sort({2, 1}, function(a, b)\n"
      "    res = {f(1, 0.02, 5000)}\n"
      "    return a < b\n"
      "  end)\n"
      "  assert(res[1] == nil and res[2] == 'timeout')\n"
      "  wait_released(r0 + 5)\n"
      "end)\n"
      "core.config{preempt_threads = 0}\n");
  CHECK(atomic_load(&released) == before + 5);
  /* Each given-up work that started stopped early on ums_lua_abandoned
  ** (the cancelled one surely started). */
  int long_works = atomic_load(&long_started) - began;
  CHECK(long_works >= 1 && long_works <= 3);
  CHECK(atomic_load(&saw_abandoned) == seen + long_works);
  lua_close(L);
}

/* Every request started has been released, exactly once. */
static void check_all_released(void) {
  CHECK(atomic_load(&released) == atomic_load(&started));
}

/* ---- the small-block cache in front of the VM's allocator (lalloc.c) ---- */

/* A host's allocator that counts: the bytes it has handed out and not
** got back, and its calls. Called only by the thread running the VM. */
typedef struct counting {
  size_t live;
  long calls;
} counting;

static counting counted;

static void *count_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  counting *c = ud;
  c->calls++;
  if (nsize == 0) {
    if (ptr) c->live -= osize;
    free(ptr);
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (p) c->live += nsize - (ptr ? osize : 0);
  return p;
}

/* The bytes the VM uses by its own count. */
static size_t lua_bytes(lua_State *L) {
  return (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024 +
         (size_t)lua_gc(L, LUA_GCCOUNTB, 0);
}

/* held() -> bytes the host's allocator has handed out beyond what the VM
** counts as in use: the blocks the cache holds. */
static int l_held(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)(counted.live - lua_bytes(L)));
  return 1;
}

/* calls() -> calls the host's allocator has had. */
static int l_calls(lua_State *L) {
  lua_pushinteger(L, counted.calls);
  return 1;
}

/* Tasks with results in test_alloc_cache. */
#define RESULT_TASKS "20000"

/* recycled(): a block freed through the VM's allocator during a run is
** the next block of its size handed out, and under ASan it is poisoned
** while the cache holds it (a use after the collector's free is still
** reported). */
static int l_recycled(lua_State *L) {
  void *ud;
  lua_Alloc f = lua_getallocf(L, &ud);
  void *p = f(ud, NULL, LUA_TUSERDATA, 48);
  CHECK(p);
  memset(p, 1, 48);
  f(ud, p, 48, 0);
#if defined(__SANITIZE_ADDRESS__)
  CHECK(__asan_address_is_poisoned((char *)p + 16));
#endif
  void *q = f(ud, NULL, LUA_TUSERDATA, 48);
  CHECK(q);
#if defined(__SANITIZE_ADDRESS__)
  CHECK(!__asan_address_is_poisoned((char *)q + 16));
#endif
  memset(q, 2, 48);
  f(ud, q, 48, 0);
  lua_pushboolean(L, p == q);
  return 1;
}

static void test_alloc_cache(const char *dir) {
  lua_State *L = lua_newstate(count_alloc, &counted);
  CHECK(L);
  luaL_openlibs(L);
  lua_register(L, "held", l_held);
  lua_register(L, "calls", l_calls);
  lua_register(L, "recycled", l_recycled);
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s/?.so", dir);
  lua_setfield(L, -2, "cpath");
  lua_pop(L, 1);
  run(L, "core = require 'ums.core'");
  CHECK(counted.live == lua_bytes(L));
  /* 20,000 tasks, each with a handle the collector frees: without the
  ** cache the host's allocator sees a malloc and a free for each (40,000
  ** calls); with it, most handles reuse blocks freed before. Then tasks
  ** whose results (strings, tables) put blocks of other sizes through
  ** the cache. */
  run(L,
      "core.run(function()\n"
      "  assert(recycled(), 'a freed block was not handed out again')\n"
      "  local function empty() end\n"
      "  local n0 = calls()\n"
      "  for i = 1, 20000 do assert(core.spawn(empty):join()) end\n"
      "  local used = calls() - n0\n"
      "  assert(used < 10000, 'the host allocator was called ' .. used .."
      " ' times for 20000 tasks')\n"
      "  assert(held() > 0, 'nothing cached')\n"
      "  for i = 1, " RESULT_TASKS " do\n"
      "    local t = core.spawn(function(x) return x, {x}, 'r' .. x end, i)\n"
      "    local ok, a, b, c = t:join()\n"
      "    assert(ok and a == i and b[1] == i and c == 'r' .. i)\n"
      "  end\n"
      "end)\n");
  /* After the run the host's allocator is the VM's again, and every block
  ** the cache held is back with it. */
  void *ud;
  CHECK(lua_getallocf(L, &ud) == count_alloc && ud == &counted);
  CHECK(counted.live == lua_bytes(L));
  /* A second run installs a fresh cache and gives it back the same way. */
  run(L, "core.run(function() for i = 1, 5000 do core.spawn(function() "
         "end) end end)");
  CHECK(lua_getallocf(L, &ud) == count_alloc && ud == &counted);
  CHECK(counted.live == lua_bytes(L));
  lua_close(L);
  CHECK(counted.live == 0);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <dir holding ums/core.so>\n", argv[0]);
    return 2;
  }
  test_not_loaded();
  check_all_released();
  test_too_old();
  check_all_released();
  test_table(argv[1]);
  test_outside(argv[1]);
  check_all_released();
  test_in_tasks(argv[1]);
  check_all_released();
  test_timeout_cancel(argv[1]);
  check_all_released();
  test_alloc_cache(argv[1]);
  printf("test_ums_lua: ok\n");
  return 0;
}
