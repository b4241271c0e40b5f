/*
** floor_resume.c: the bench_floor Lua module, floors for bench_ums.lua that
** plain Lua cannot measure.
**
**   bench_floor.resume_yield(n) -> seconds
**       A C loop calls lua_resume n times on one coroutine whose body is a
**       C function that yields (lua_yieldk, with itself as continuation)
**       every time it is resumed: n x (lua_resume + lua_yield), no Lua
**       code in between. The floor for one task switch driven from C.
**   bench_floor.resume_lua_yield(n) -> seconds
**       The same C loop, but the coroutine body is a Lua loop calling a C
**       function that yields (as a ums task calling ums.yield does): the
**       floor for a switch when the task body is Lua.
**   bench_floor.now() -> monotonic seconds (CLOCK_MONOTONIC)
**   bench_floor.read_file(path, chunk) -> bytes
**       The file I/O floor: read(2) into one buffer in a loop until the end
**       of the file, one thread, no Lua in between (bench_fs.lua).
**   bench_floor.small_files(paths) -> files
**       The small-file floor: each path in the array opened, read whole
**       with read(2) and closed, one after the other, one thread.
**   bench_floor.thread_handoff(n, spin) -> seconds
**       The raw thread handoff: this thread hands a trivial call (getpid)
**       to a helper thread and waits for its answer, n round trips. With
**       spin false both sides sleep on a condition variable (what a naive
**       thread pool does); with spin true both busy-poll an atomic word
**       (the physical floor of a cross-thread round trip, two cache-line
**       transfers). The floors for bench_ffi.lua.
**   bench_struct_call(struct bench_pt p, struct bench_pt *out) -> int
**       Not a Lua function: a C function for bench_ffi.lua to bind with
**       ums.ffi (ffi.load of this file), as trivial as getpid but with a
**       struct passed by value and one written through an out-parameter.
**
** Built as a plain shared object, not linked against liblua (lua5.4
** exports the API).
*/
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int l_now(lua_State *L) {
  lua_pushnumber(L, now_s());
  return 1;
}

/* The C body: yields forever, resuming in its own continuation. */
static int body_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return lua_yieldk(L, 0, ctx, body_k);
}

static int body(lua_State *L) { return body_k(L, LUA_OK, 0); }

/* A C function called from Lua that yields (no results, no continuation
** needed: lua_yield returns to the Lua caller on resume). */
static int c_yield(lua_State *L) { return lua_yield(L, 0); }

/* Resumes co n times; every resume must end in a yield. */
static double drive(lua_State *L, lua_State *co, lua_Integer n) {
  int nres;
  double t0 = now_s();
  for (lua_Integer i = 0; i < n; i++) {
    int st = lua_resume(co, L, 0, &nres);
    if (st != LUA_YIELD) {
      luaL_error(L, "bench_floor: coroutine did not yield: %s",
                 lua_tostring(co, -1));
    }
    if (nres) lua_pop(co, nres);
  }
  return now_s() - t0;
}

static int l_resume_yield(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0, 1, "count must not be negative");
  lua_State *co = lua_newthread(L);
  lua_pushcfunction(co, body);
  lua_pushnumber(L, drive(L, co, n));
  return 1;
}

static const char LUA_BODY[] =
    "local y = ... ; return function() while true do y() end end";

static int l_resume_lua_yield(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n >= 0, 1, "count must not be negative");
  lua_State *co = lua_newthread(L);
  if (luaL_loadstring(co, LUA_BODY) != LUA_OK) {
    lua_xmove(co, L, 1);
    return lua_error(L);
  }
  lua_pushcfunction(co, c_yield);
  lua_call(co, 1, 1); /* the body function, ready to be resumed */
  lua_pushnumber(L, drive(L, co, n));
  return 1;
}

static int l_read_file(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  size_t chunk = (size_t)luaL_checkinteger(L, 2);
  void *buf;
  if (posix_memalign(&buf, 4096, chunk)) return luaL_error(L, "no memory");
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    free(buf);
    return luaL_error(L, "cannot open %s", path);
  }
  long long total = 0;
  ssize_t r;
  while ((r = read(fd, buf, chunk)) > 0) total += r;
  close(fd);
  free(buf);
  if (r < 0) return luaL_error(L, "read failed");
  lua_pushinteger(L, (lua_Integer)total);
  return 1;
}

static int l_small_files(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer n = luaL_len(L, 1);
  char buf[65536];
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 1, i);
    int fd = open(lua_tostring(L, -1), O_RDONLY);
    lua_pop(L, 1);
    if (fd < 0) return luaL_error(L, "cannot open file %d", (int)i);
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
  }
  lua_pushinteger(L, n);
  return 1;
}

/* One round trip at a time between the caller and a helper thread. */
typedef struct handoff {
  pthread_mutex_t lock;
  pthread_cond_t cv;
  _Atomic long req, done; /* sequence numbers */
  _Atomic long result;
  bool spin;
  long n;
} handoff_t;

static void handoff_wait(handoff_t *h, _Atomic long *word, long want) {
  if (h->spin) {
    /* (a yield now and then, so that a crowded machine does not turn a
    ** spin into a wait for the other side's time slice) */
    for (unsigned i = 1;
         atomic_load_explicit(word, memory_order_acquire) != want; i++)
      if ((i & 4095) == 0) sched_yield();
    return;
  }
  pthread_mutex_lock(&h->lock);
  while (atomic_load_explicit(word, memory_order_acquire) != want)
    pthread_cond_wait(&h->cv, &h->lock);
  pthread_mutex_unlock(&h->lock);
}

static void handoff_post(handoff_t *h, _Atomic long *word, long v) {
  if (h->spin) {
    atomic_store_explicit(word, v, memory_order_release);
    return;
  }
  pthread_mutex_lock(&h->lock);
  atomic_store_explicit(word, v, memory_order_release);
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->lock);
}

static void *handoff_helper(void *arg) {
  handoff_t *h = arg;
  for (long i = 1; i <= h->n; i++) {
    handoff_wait(h, &h->req, i);
    atomic_store_explicit(&h->result, (long)getpid(), memory_order_relaxed);
    handoff_post(h, &h->done, i);
  }
  return NULL;
}

static int l_thread_handoff(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n > 0, 1, "positive count expected");
  handoff_t h = {.spin = lua_toboolean(L, 2), .n = (long)n};
  pthread_mutex_init(&h.lock, NULL);
  pthread_cond_init(&h.cv, NULL);
  pthread_t th;
  if (pthread_create(&th, NULL, handoff_helper, &h) != 0)
    return luaL_error(L, "thread_handoff: cannot start a thread");
  double t0 = now_s();
  for (long i = 1; i <= h.n; i++) {
    handoff_post(&h, &h.req, i);
    handoff_wait(&h, &h.done, i);
  }
  double t = now_s() - t0;
  pthread_join(th, NULL);
  pthread_cond_destroy(&h.cv);
  pthread_mutex_destroy(&h.lock);
  lua_pushnumber(L, t);
  return 1;
}

struct bench_pt {
  int x, y;
  double w;
};

int bench_struct_call(struct bench_pt p, struct bench_pt *out);
int bench_struct_call(struct bench_pt p, struct bench_pt *out) {
  out->x = p.y;
  out->y = p.x;
  out->w = p.w;
  return p.x + p.y;
}

int luaopen_bench_floor(lua_State *L) {
  static const luaL_Reg funcs[] = {{"resume_yield", l_resume_yield},
                                   {"resume_lua_yield", l_resume_lua_yield},
                                   {"now", l_now},
                                   {"read_file", l_read_file},
                                   {"small_files", l_small_files},
                                   {"thread_handoff", l_thread_handoff},
                                   {NULL, NULL}};
  luaL_newlib(L, funcs);
  return 1;
}
