/*
** test_lcopy.c: the copy of values between VMs (lcopy.c) needs the same
** C stack at any nesting depth. A task may copy values deep in its own
** stack (under nested pcalls or callbacks), so the encoder and the
** decoder must not grow the stack per level: here they run on a thread
** whose whole stack is smaller than what one C frame per level of a table
** nested to the copy's limit would take, with tables nested in values and
** in keys.
*/
#define _GNU_SOURCE
#include "lvm.h"
#include "test-util.h"

#include <lualib.h>
#include <pthread.h>
#include <string.h>

/* Far below the ~85 KiB a recursive walk of 199 levels takes. */
#define SMALL_STACK (48 * 1024)

static const char *const chunk =
    "local depth, in_keys = ...\n"
    "local t = {}\n"
    "local c = t\n"
    "for i = 1, depth do\n"
    "  local n = {v = i}\n"
    "  if in_keys then c[n] = true else c[1] = n end\n"
    "  c = n\n"
    "end\n"
    "return t\n";

static const char *const measure =
    "local t, in_keys = ...\n"
    "local d = 0\n"
    "while true do\n"
    "  local n\n"
    "  if in_keys then\n"
    "    for k, v in pairs(t) do if type(k) == 'table' then n = k end end\n"
    "  else\n"
    "    n = t[1]\n"
    "  end\n"
    "  if not n then return d end\n"
    "  d = d + 1\n"
    "  assert(n.v == d)\n"
    "  t = n\n"
    "end\n";

/* Builds a table nested depth deep, copies it through a message and back,
** and returns the depth of the copy; -1 when the encoder refused it (err
** then says why). */
static int round_trip(lua_State *L, int depth, int in_keys, char *err,
                      size_t errsz) {
  CHECK(luaL_loadstring(L, chunk) == LUA_OK);
  lua_pushinteger(L, depth);
  lua_pushboolean(L, in_keys);
  CHECK(lua_pcall(L, 2, 1, 0) == LUA_OK);
  int bad = -1;
  lmsg *m = lcopy_encode(L, -1, 1, "args", true, err, errsz, &bad);
  lua_pop(L, 1);
  if (!m) {
    CHECK(bad == 0);
    return -1;
  }
  CHECK(luaL_loadstring(L, measure) == LUA_OK);
  CHECK(lcopy_decode_free(L, m) == 1);
  lua_pushboolean(L, in_keys);
  CHECK(lua_pcall(L, 2, 1, 0) == LUA_OK);
  int got = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  return got;
}

static void *on_small_stack(void *arg) {
  (void)arg;
  lua_State *L = luaL_newstate();
  CHECK(L != NULL);
  luaL_openlibs(L);
  char err[256];
  for (int in_keys = 0; in_keys <= 1; in_keys++) {
    CHECK_EQ(round_trip(L, 40, in_keys, err, sizeof err), 40);
    CHECK_EQ(round_trip(L, 199, in_keys, err, sizeof err), 199);
    CHECK_EQ(round_trip(L, 300, in_keys, err, sizeof err), -1);
    CHECK(strncmp(err, "args[1]", 7) == 0);
    CHECK(strstr(err, ": tables nested too deeply") != NULL);
  }
  lua_close(L);
  return NULL;
}

int main(void) {
  pthread_attr_t attr;
  pthread_t th;
  CHECK(pthread_attr_init(&attr) == 0);
  CHECK(pthread_attr_setstacksize(&attr, SMALL_STACK) == 0);
  CHECK(pthread_create(&th, &attr, on_small_stack, NULL) == 0);
  CHECK(pthread_join(th, NULL) == 0);
  pthread_attr_destroy(&attr);
  printf("test_lcopy: ok\n");
  return 0;
}
