/*
** test_lcopy.c: the copy of values between VMs (lcopy.c) needs the same
** C stack at any nesting depth. A task may copy values deep in its own
** stack (under nested pcalls or callbacks), so the encoder and the
** decoder must not grow the stack per level: here they run on a thread
** whose whole stack is smaller than what one C frame per level of a table
** nested to the copy's limit would take, with tables nested in values and
** in keys. Also: plain scalars cross without the general walk
** (test_scalars), also into and out of the caller's memory
** (test_in_place).
*/
#define _GNU_SOURCE
#include "lvm.h"
#include "test-util.h"

#include <lualib.h>
#include <math.h>
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

/* Scalars (nil, booleans, numbers, strings) cross without the general
** walk: encoding them, and decoding all but strings, makes no Lua call
** (the walk runs in a protected call, which a call hook sees). Every
** value comes back exactly: integers stay integers, floats keep their
** sign and bits, strings their bytes. A message with a table among its
** values takes the general walk and comes back as well. */
static int ncalls;
static void count_calls(lua_State *L, lua_Debug *ar) {
  (void)L;
  (void)ar;
  ncalls++;
}

static void test_scalars(void) {
  lua_State *L = luaL_newstate();
  CHECK(L != NULL);
  luaL_openlibs(L);
  char err[256];
  int bad = -1;
  lua_pushnil(L);
  lua_pushboolean(L, 1);
  lua_pushboolean(L, 0);
  lua_pushinteger(L, LUA_MININTEGER);
  lua_pushnumber(L, -0.0);
  lua_pushnumber(L, 3.0);
  lua_sethook(L, count_calls, LUA_MASKCALL, 0);
  ncalls = 0;
  lmsg *m = lcopy_encode(L, 1, 6, "args", true, err, sizeof err, &bad);
  CHECK(m != NULL);
  CHECK_EQ(ncalls, 0);
  lua_settop(L, 0);
  CHECK_EQ(lcopy_decode_free(L, m), 6);
  CHECK_EQ(ncalls, 0);
  lua_sethook(L, NULL, 0, 0);
  CHECK(lua_isnil(L, 1));
  CHECK(lua_isboolean(L, 2) && lua_toboolean(L, 2));
  CHECK(lua_isboolean(L, 3) && !lua_toboolean(L, 3));
  CHECK(lua_isinteger(L, 4) && lua_tointeger(L, 4) == LUA_MININTEGER);
  CHECK(!lua_isinteger(L, 5) && lua_tonumber(L, 5) == 0.0 &&
        signbit(lua_tonumber(L, 5)));
  CHECK(!lua_isinteger(L, 6) && lua_tonumber(L, 6) == 3.0);
  lua_settop(L, 0);

  /* Strings: encoded without a call; a string of any size comes back. */
  static const char bytes[] = "a\0b";
  lua_pushlstring(L, bytes, 3);
  lua_pushliteral(L, "");
  luaL_Buffer b;
  char *big = luaL_buffinitsize(L, &b, 100000);
  memset(big, 'x', 100000);
  luaL_pushresultsize(&b, 100000);
  lua_sethook(L, count_calls, LUA_MASKCALL, 0);
  ncalls = 0;
  m = lcopy_encode(L, 1, 3, "args", true, err, sizeof err, &bad);
  CHECK(m != NULL);
  CHECK_EQ(ncalls, 0);
  lua_sethook(L, NULL, 0, 0);
  lua_settop(L, 0);
  CHECK_EQ(lcopy_decode_free(L, m), 3);
  size_t len;
  const char *str = lua_tolstring(L, 1, &len);
  CHECK(len == 3 && memcmp(str, bytes, 3) == 0);
  CHECK(lua_rawlen(L, 2) == 0 && lua_type(L, 2) == LUA_TSTRING);
  str = lua_tolstring(L, 3, &len);
  CHECK(len == 100000 && str[0] == 'x' && str[99999] == 'x');
  lua_settop(L, 0);

  /* A table among scalars: the general walk, same values. */
  lua_pushinteger(L, 7);
  lua_createtable(L, 1, 0);
  lua_pushliteral(L, "in");
  lua_rawseti(L, -2, 1);
  lua_pushliteral(L, "s");
  m = lcopy_encode(L, 1, 3, "args", true, err, sizeof err, &bad);
  CHECK(m != NULL);
  lua_settop(L, 0);
  CHECK_EQ(lcopy_decode_free(L, m), 3);
  CHECK(lua_isinteger(L, 1) && lua_tointeger(L, 1) == 7);
  CHECK(lua_rawgeti(L, 2, 1) == LUA_TSTRING);
  CHECK(strcmp(lua_tostring(L, -1), "in") == 0);
  CHECK(strcmp(lua_tostring(L, 3), "s") == 0);
  lua_close(L);
}

/* Messages in the caller's memory (a shared channel's slots): scalars are
** encoded in place, a short one inside the message itself, and a moved
** message decodes to the same values from its new place. */
static void test_in_place(void) {
  lua_State *L = luaL_newstate();
  CHECK(L != NULL);
  lmsg a, slots[2];
  lua_pushliteral(L, "short");
  CHECK(lcopy_encode_scalars(L, 1, 1, &a));
  CHECK(a.data == a.inl);
  lcopy_move(&slots[1], &a);
  memset(&a, 0xa5, sizeof a);  /* a is forgotten: nothing may point in it */
  CHECK(slots[1].data == slots[1].inl);
  lua_settop(L, 0);
  CHECK_EQ(lcopy_decode_clear(L, &slots[1]), 1);
  CHECK(strcmp(lua_tostring(L, 1), "short") == 0);
  lua_settop(L, 0);

  /* A long string leaves the inline buffer; the move keeps its data. */
  luaL_Buffer b;
  char *big = luaL_buffinitsize(L, &b, 1000);
  memset(big, 'y', 1000);
  luaL_pushresultsize(&b, 1000);
  lua_pushinteger(L, 42);
  CHECK(lcopy_encode_scalars(L, 1, 2, &a));
  CHECK(a.data != a.inl);
  lcopy_move(&slots[0], &a);
  lua_settop(L, 0);
  CHECK_EQ(lcopy_decode_clear(L, &slots[0]), 2);
  CHECK(lua_rawlen(L, 1) == 1000 && lua_tostring(L, 1)[999] == 'y');
  CHECK(lua_tointeger(L, 2) == 42);
  lua_settop(L, 0);

  /* Not scalars: false, nothing written. */
  lua_newtable(L);
  memset(&a, 0x5a, sizeof a);
  CHECK(!lcopy_encode_scalars(L, 1, 1, &a));
  CHECK(a.nvalues == (int)0x5a5a5a5a);
  lua_close(L);
}

int main(void) {
  test_scalars();
  test_in_place();
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
