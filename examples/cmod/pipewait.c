/*
** pipewait: an example C module that does its own I/O on descriptors it
** owns (a pipe here; a database driver's socket in real life) and parks
** the calling ums task until one is ready with ums_lua_wait_fd, the way a
** binding of such a library would. Built like zutil: against <lua.h> and
** ums-lua.h only.
**
**   local pw = require "pipewait"
**   local r, w = pw.pipe()          -- non-blocking descriptors
**   pw.write(w, "hello")            -- -> bytes written
**   pw.read(r [, timeout])          -- waits; -> data | "" at the end |
**                                   --    nil, "timeout"
**   pw.close(fd)
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "ums-lua.h"

#define READ_MAX 65536

static int pw_pipe(lua_State *L) {
  int p[2];
  if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0)
    return luaL_error(L, "pipe: %s", strerror(errno));
  lua_pushinteger(L, p[0]);
  lua_pushinteger(L, p[1]);
  return 2;
}

/* Stack: fd, timeout. One non-blocking read; when nothing is there, waits
** for the pipe with ums_lua_wait_fd and tries again in the continuation. */
static int read_k(lua_State *L, int revents, void *ctx);

static int try_read(lua_State *L) {
  int fd = (int)lua_tointeger(L, 1);
  luaL_Buffer b;
  char *p = luaL_buffinitsize(L, &b, READ_MAX);
  ssize_t n;
  do n = read(fd, p, READ_MAX);
  while (n < 0 && errno == EINTR);
  if (n >= 0) {
    luaL_pushresultsize(&b, (size_t)n);
    return 1;
  }
  if (errno != EAGAIN) return luaL_error(L, "read: %s", strerror(errno));
  lua_pop(L, 1);  /* the buffer */
  return ums_lua_wait_fd(L, fd, POLLIN, ums_lua_opttimeout(L, 2), read_k,
                         NULL);
}

static int read_k(lua_State *L, int revents, void *ctx) {
  (void)ctx;
  if (revents == 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  return try_read(L);
}

/* pipewait.read(fd [, timeout]) */
static int pw_read(lua_State *L) {
  luaL_checkinteger(L, 1);
  ums_lua_opttimeout(L, 2);
  lua_settop(L, 2);
  return try_read(L);
}

static int pw_write(lua_State *L) {
  int fd = (int)luaL_checkinteger(L, 1);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  ssize_t n;
  do n = write(fd, s, len);
  while (n < 0 && errno == EINTR);
  if (n < 0) return luaL_error(L, "write: %s", strerror(errno));
  lua_pushinteger(L, n);
  return 1;
}

static int pw_close(lua_State *L) {
  close((int)luaL_checkinteger(L, 1));
  return 0;
}

int luaopen_pipewait(lua_State *L) {
  static const luaL_Reg funcs[] = {{"pipe", pw_pipe},
                                   {"read", pw_read},
                                   {"write", pw_write},
                                   {"close", pw_close},
                                   {NULL, NULL}};
  ums_lua_check(L, "pipewait");
  luaL_newlib(L, funcs);
  return 1;
}
