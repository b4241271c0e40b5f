/*
** lcdata.c: ums.ffi.buffer and ums.ffi.pointer, and ffi.string, which reads
** either. A buffer holds one reference on its ums_buf_t, dropped at __gc;
** a call that passes it holds another until the call is over (lccall.c),
** so memory a detached call writes into outlives the Lua value.
**
** Threads: the Lua thread of the run, or the main thread outside runs.
*/
#define _GNU_SOURCE
#include "lcdata.h"

#include <stdint.h>
#include <string.h>

/* Largest ffi.buffer. */
#define BUF_MAX ((lua_Integer)1 << 31)

ums_buf_t *lums_test_buf(lua_State *L, int idx, size_t *size) {
  lbuf *u = lffi_to_buf(L, idx);
  if (!u || !u->b) return NULL;
  *size = u->size;
  return u->b;
}

/* ffi.buffer(n) -> a zero-filled buffer of n bytes */
static int l_buffer(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n > 0 && n <= BUF_MAX, 1, "size out of range");
  lbuf *u = (lbuf *)lua_newuserdatauv(L, sizeof *u, 0);
  u->b = NULL;
  u->size = (size_t)n;
  luaL_setmetatable(L, LFFI_BUF_MT);
  u->b = ums_buf_new((size_t)n);
  if (!u->b) return luaL_error(L, "ums.ffi.buffer: out of memory");
  memset(ums_buf_data(u->b), 0, (size_t)n);
  return 1;
}

static int buf_gc(lua_State *L) {
  lbuf *u = lffi_to_buf(L, 1);
  if (u && u->b) {
    ums_buf_release(u->b);
    u->b = NULL;
  }
  return 0;
}

static int buf_len(lua_State *L) {
  lbuf *u = luaL_checkudata(L, 1, LFFI_BUF_MT);
  lua_pushinteger(L, (lua_Integer)u->size);
  return 1;
}

static int buf_tostring(lua_State *L) {
  lbuf *u = luaL_checkudata(L, 1, LFFI_BUF_MT);
  lua_pushfstring(L, "ums.ffi.buffer (%d bytes): %p", (int)u->size,
                  u->b ? ums_buf_data(u->b) : NULL);
  return 1;
}

void lffi_push_ptr(lua_State *L, void *p) {
  if (!p) {
    lua_pushnil(L);
    return;
  }
  lptr *u = (lptr *)lua_newuserdatauv(L, sizeof *u, 0);
  u->p = p;
  luaL_setmetatable(L, LFFI_PTR_MT);
}

static int ptr_tostring(lua_State *L) {
  lptr *u = luaL_checkudata(L, 1, LFFI_PTR_MT);
  lua_pushfstring(L, "ums.ffi.pointer: %p", u->p);
  return 1;
}

static int ptr_eq(lua_State *L) {
  lptr *a = lffi_to_ptr(L, 1), *b = lffi_to_ptr(L, 2);
  lua_pushboolean(L, a && b && a->p == b->p);
  return 1;
}

/* ffi.string(buf | ptr [, len]) -> string */
static int l_string(lua_State *L) {
  lbuf *b = lffi_to_buf(L, 1);
  lptr *p = b ? NULL : lffi_to_ptr(L, 1);
  if (!b && !p)
    return luaL_typeerror(L, 1, "ums.ffi.buffer or ums.ffi.pointer");
  const char *data = b ? ums_buf_data(b->b) : p->p;
  if (lua_isnoneornil(L, 2)) {
    size_t n = b ? strnlen(data, b->size) : strlen(data);
    lua_pushlstring(L, data, n);
    return 1;
  }
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_argcheck(L, n >= 0, 2, "length must not be negative");
  if (b)
    luaL_argcheck(L, (lua_Unsigned)n <= b->size, 2,
                  "length beyond the end of the buffer");
  lua_pushlstring(L, data, (size_t)n);
  return 1;
}

void lffi_open_cdata(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"buffer", l_buffer}, {"string", l_string}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  if (luaL_newmetatable(L, LFFI_BUF_MT)) {
    lua_pushcfunction(L, buf_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, buf_len);
    lua_setfield(L, -2, "__len");
    lua_pushcfunction(L, buf_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, LFFI_PTR_MT)) {
    lua_pushcfunction(L, ptr_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushcfunction(L, ptr_eq);
    lua_setfield(L, -2, "__eq");
  }
  lua_pop(L, 1);
}
