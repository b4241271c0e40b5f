/*
** lsocket.c: what ums.socket (stdlib/ums/socket.lua, LuaSocket's API
** over ums.net) needs below Lua, as core.socket:
**
**   buffered(conn) -> n    bytes an ums.net connection has read ahead
**                          (LuaSocket's dirty(): select must not wait
**                          for the descriptor while they are there)
**   ready(fd, what)        whether the descriptor is readable ("r") or
**                          writable ("w") now, without waiting
**   wait(fd, what [, t])   parks the task until the descriptor is
**                          readable ("r") or writable ("w"): true, or
**                          nil, "timeout" (select's readiness)
**
** buffered reads the connection's stream (lstream.h); wait is the C
** modules' ums_lua_wait_fd (ums-lua.h: the runtime's readiness request on
** the sockets' io_uring poll or epoll set): the task holds no worker
** while it waits, and a task cancelled or timed out takes nothing from
** the socket.
*/
#include "lstream.h"
#include "ums-lua.h"

#include <errno.h>
#include <poll.h>

static int l_buffered(lua_State *L) {
  lfile *f = lstream_to(L, 1);
  luaL_argcheck(L, f != NULL && f->sock, 1, "ums.net.conn expected");
  /* A method in progress owns the buffer; it reports what it leaves. */
  size_t n = 0;
  if (f->buf && atomic_load(&f->hold) == 0 /* FILE_FREE */)
    n = f->rlen - f->rpos;
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

static const char *const whats[] = {"r", "w", NULL};
static const int events[] = {POLLIN, POLLOUT};

/* poll(2) with a zero timeout: select's first look, and all of a select
** with a zero timeout. It never parks: a select that finds something
** ready, or has a zero timeout, returns without a task switch (the
** cooperative rule: only a call that waits lets other tasks run), and it
** also works outside a task. */
static int l_ready(lua_State *L) {
  struct pollfd p = {(int)luaL_checkinteger(L, 1), 0, 0};
  p.events = (short)events[luaL_checkoption(L, 2, NULL, whats)];
  int n;
  do n = poll(&p, 1, 0); while (n < 0 && errno == EINTR);
  /* A hang-up or an error is readiness too: the next call reports it. */
  lua_pushboolean(L, n > 0 && p.revents != 0);
  return 1;
}

/* The wait's end: readiness, or the timeout (revents 0). */
static int wait_done(lua_State *L, int revents, void *ctx) {
  (void)ctx;
  if (revents == 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int l_wait(lua_State *L) {
  int fd = (int)luaL_checkinteger(L, 1);
  int what = luaL_checkoption(L, 2, NULL, whats);
  double t = luaL_optnumber(L, 3, UMS_LUA_NOTIMEOUT);
  luaL_argcheck(L, t == t, 3, "timeout is NaN");
  return ums_lua_wait_fd(L, fd, events[what], t, wait_done, NULL);
}

void lums_open_socket(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"buffered", l_buffered},
      {"ready", l_ready},
      {"wait", l_wait},
      {NULL, NULL}};
  luaL_newlib(L, fns);
  lua_setfield(L, -2, "socket");
}
