/*
** lsocket.c: what ums.socket (stdlib/ums/socket.lua, LuaSocket's API
** over ums.net) needs below Lua, as core.socket:
**
**   buffered(conn) -> n    bytes an ums.net connection has read ahead
**                          (LuaSocket's dirty(): select must not wait
**                          for the descriptor while they are there)
**   connected(conn) -> true | false | nil, msg, code
**                          whether a connection handed over while being
**                          made (ums.net.connect's wait = false) is made,
**                          still in progress, or failed (its error,
**                          which the kernel then forgets); never waits
**   select(rfds, wfds [, t])
**                          LuaSocket's select over descriptors: the
**                          positions in rfds and in wfds of those that
**                          are ready, as two arrays; both empty when t
**                          (seconds, default none) passed first
**
** buffered reads the connection's stream (lstream.h). select looks at
** every descriptor with one poll(2) (so a select that finds something
** ready, or has a zero timeout, returns without a task switch: the
** cooperative rule) and, when none is ready, waits once for all of them;
** the task holds no worker while it waits, and a task cancelled or timed
** out takes nothing from the sockets:
**   - one descriptor: the C modules' ums_lua_wait_fd on it (ums-lua.h:
**     the runtime's readiness request on the sockets' io_uring poll or
**     epoll set);
**   - up to SEL_SET_MAX: that wait on an epoll set of them made for the
**     call (its owner is the call: a userdata on its stack, closed when
**     the wait ends, and by its finalizer when the task is cancelled
**     meanwhile); when the kernel refuses the set (no descriptor free),
**     as for more:
**   - more: poll(2) of them all on the C-call pool (going preemptive, as
**     for a blocking C call: one pool thread per such select, none per
**     socket), since the kernel's cost of an epoll set grows with every
**     descriptor added while poll(2) registers none; the pool thread
**     polls in slices of SEL_SLICE_MS to see when the task gave up.
** A program that selects over a thousand sockets thus costs one park per
** call, not one per socket.
*/
#define _GNU_SOURCE /* clock_gettime */
#include "lstream.h"
#include "ums-lua.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

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

static int l_connected(lua_State *L) {
  lfile *f = lstream_to(L, 1);
  luaL_argcheck(L, f != NULL && f->sock, 1, "ums.net.conn expected");
  if (f->fd < 0) return lstream_push_netfail(L, UMS_ECLOSED);
  int err = 0;
  socklen_t len = sizeof err;
  int rc = ums_net_getsockopt(f->fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (rc || err) return lstream_push_netfail(L, rc ? rc : -err);
  struct sockaddr_storage ss;
  len = sizeof ss;
  if (ums_net_getpeername(f->fd, (struct sockaddr *)&ss, &len) == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  /* Not connected and no error: in progress until the socket becomes
  ** writable or hung up (an end without an error left to report). */
  struct pollfd p = {.fd = f->fd, .events = POLLOUT};
  int n;
  do n = poll(&p, 1, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) return lstream_push_netfail(L, -errno);
  if (n == 0 || !(p.revents & (POLLOUT | POLLHUP | POLLERR))) {
    lua_pushboolean(L, 0);
    return 1;
  }
  return lstream_push_netfail(L, -ENOTCONN);
}

/* ---- select ---- */

/* The call's state, a userdata at SEL_STATE of its stack: the poll(2)
** entries (the read list's, then the write list's) and the epoll set the
** wait uses when there are several. The set is the call's own: closed
** when the wait ends, or by __gc/__close if the task is cancelled (or the
** call raises) meanwhile, after the runtime has let go of it. */
#define SEL_STATE 4
#define SEL_MT "ums.socket.select"
typedef struct {
  int ep;              /* the epoll set, or -1 */
  int nr, n;           /* entries of the read list, of both */
  double deadline;     /* sel_now() seconds, or < 0: none */
  struct pollfd p[];
} lselect;

/* The runtime's clock in seconds (the virtual one under a virtual run). */
static double sel_now(void) { return (double)ums_now() * 1e-9; }

static void sel_close_set(lselect *s) {
  if (s->ep >= 0) {
    close(s->ep);
    s->ep = -1;
  }
}

static int sel_gc(lua_State *L) {
  sel_close_set(luaL_checkudata(L, 1, SEL_MT));
  return 0;
}

/* The n descriptors of list (an array of integers) into p. */
static void sel_fds(lua_State *L, int list, int n, struct pollfd *p,
                    short ev) {
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, list, i + 1);
    int ok;
    lua_Integer fd = lua_tointegerx(L, -1, &ok);
    if (!ok || fd < 0 || fd > INT32_MAX)
      luaL_error(L, "select: descriptor %d of argument #%d is not a "
                 "non-negative integer", i + 1, list);
    lua_pop(L, 1);
    p[i] = (struct pollfd){(int)fd, ev, 0};
  }
}

/* Pushes the positions of the ready entries of p[from, to) as an array. */
static void sel_push_ready(lua_State *L, const lselect *s, int from,
                           int to) {
  lua_createtable(L, 0, 0);
  lua_Integer k = 0;
  for (int i = from; i < to; i++)
    if (s->p[i].revents) {
      lua_pushinteger(L, i - from + 1);
      lua_rawseti(L, -2, ++k);
    }
}

/* The call's results from the entries' revents: the ready positions of
** the read list, then of the write list. */
static int sel_results(lua_State *L, const lselect *s) {
  sel_push_ready(L, s, 0, s->nr);
  sel_push_ready(L, s, s->nr, s->n);
  return 2;
}

/* One look at every descriptor (a hang-up, an error or a closed
** descriptor counts as ready: the next call reports it). Pushes the two
** arrays and returns true when something is ready. */
static bool sel_look(lua_State *L, lselect *s) {
  int r;
  do r = poll(s->p, (nfds_t)s->n, 0); while (r < 0 && errno == EINTR);
  if (r < 0) luaL_error(L, "select: %s", strerror(errno));
  if (r == 0) return false;
  sel_results(L, s);
  return true;
}

static int sel_timeout(lua_State *L) {
  lua_createtable(L, 0, 0);
  lua_createtable(L, 0, 0);
  return 2;
}

static int sel_wait(lua_State *L, lselect *s);

static int sel_woken(lua_State *L, int revents, void *ctx) {
  lselect *s = ctx;
  sel_close_set(s);
  if (sel_look(L, s)) return 2;
  /* Woken by what another task took first, or the timeout. */
  if (revents == 0 || (s->deadline >= 0 && sel_now() >= s->deadline))
    return sel_timeout(L);
  return sel_wait(L, s);
}

/* The pool's poll: a copy of the entries (the task may give up and its
** stack go while the thread still polls); owned by the call
** (ums_lua_preempt releases it). */
#define SEL_SET_MAX 16
#define SEL_SLICE_MS 100
typedef struct {
  int n;
  int err;           /* poll(2)'s errno when it failed, else 0 */
  int64_t deadline;  /* CLOCK_MONOTONIC ns, for a call outside a task */
  struct pollfd p[];
} lselect_work;

static int64_t real_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sel_poll_work(void *ud, const ums_lua_work_t *w) {
  lselect_work *sw = ud;
  while (!ums_lua_abandoned(w)) {
    int slice = SEL_SLICE_MS;
    if (sw->deadline >= 0) {
      int64_t left = sw->deadline - real_now();
      if (left <= 0) return;
      if (left < (int64_t)slice * 1000000) slice = (int)(left / 1000000) + 1;
    }
    int r = poll(sw->p, (nfds_t)sw->n, slice);
    if (r > 0) return;
    if (r < 0 && errno != EINTR) {
      sw->err = errno;
      return;
    }
  }
}

static int sel_polled(lua_State *L, int status, void *ud) {
  lselect *s = lua_touserdata(L, SEL_STATE);
  if (status == UMS_LUA_OK) {
    /* The pool's poll answered for the same entries: its revents are
    ** the look (none set when it stopped at the deadline). */
    lselect_work *sw = ud;
    if (sw->err) luaL_error(L, "select: %s", strerror(sw->err));
    bool any = false;
    for (int i = 0; i < s->n; i++) {
      s->p[i].revents = sw->p[i].revents;
      any |= sw->p[i].revents != 0;
    }
    if (any) return sel_results(L, s);
  }
  return sel_woken(L, status == UMS_LUA_OK, s);
}

static bool sel_make_set(lselect *s);

static int sel_wait(lua_State *L, lselect *s) {
  double t = UMS_LUA_NOTIMEOUT;
  if (s->deadline >= 0) {
    t = s->deadline - sel_now();
    if (t <= 0) return sel_timeout(L);
  }
  if (s->n == 1)
    return ums_lua_wait_fd(L, s->p[0].fd, s->p[0].events, t, sel_woken, s);
  if (s->n <= SEL_SET_MAX && sel_make_set(s))
    return ums_lua_wait_fd(L, s->ep, POLLIN, t, sel_woken, s);
  size_t size = (size_t)s->n * sizeof(struct pollfd);
  lselect_work *sw = malloc(sizeof *sw + size);
  if (!sw) luaL_error(L, "select: not enough memory");
  sw->n = s->n;
  sw->err = 0;
  sw->deadline = t < 0 ? -1 : real_now() + (int64_t)(t * 1e9);
  memcpy(sw->p, s->p, size);
  return ums_lua_preempt(L, sel_poll_work, sw, free, sel_polled, t, 0);
}

/* The epoll set of s's descriptors, in s->ep: true, or false (nothing
** left open) when the kernel refuses one (no descriptor free, out of
** memory or watches): the pool's poll needs neither. */
static bool sel_make_set(lselect *s) {
  s->ep = epoll_create1(EPOLL_CLOEXEC);
  if (s->ep < 0) return false;
  for (int i = 0; i < s->n; i++) {
    struct epoll_event e = {0};
    e.events = s->p[i].events == POLLIN ? EPOLLIN : EPOLLOUT;
    e.data.fd = s->p[i].fd;
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, s->p[i].fd, &e) == 0) continue;
    if (errno == EEXIST) {
      /* In both lists: wake for either. */
      e.events = EPOLLIN | EPOLLOUT;
      if (epoll_ctl(s->ep, EPOLL_CTL_MOD, s->p[i].fd, &e) == 0) continue;
    }
    /* A descriptor epoll refuses (a regular file: always ready, so the
    ** look above found it) or one closed since the look: the next look
    ** reports it. */
    if (errno != EPERM && errno != EBADF) {
      sel_close_set(s);
      return false;
    }
  }
  return true;
}

static int l_select(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  double t = luaL_optnumber(L, 3, UMS_LUA_NOTIMEOUT);
  luaL_argcheck(L, t == t, 3, "timeout is NaN");
  lua_settop(L, 3);
  int nr = (int)lua_rawlen(L, 1), nw = (int)lua_rawlen(L, 2);
  lselect *s = lua_newuserdatauv(
      L, sizeof *s + (size_t)(nr + nw) * sizeof(struct pollfd), 0);
  s->ep = -1;
  s->nr = nr;
  s->n = nr + nw;
  s->deadline = t < 0 ? -1.0 : sel_now() + t;
  luaL_setmetatable(L, SEL_MT);
  lua_toclose(L, SEL_STATE);
  sel_fds(L, 1, nr, s->p, POLLIN);
  sel_fds(L, 2, nw, s->p + nr, POLLOUT);
  if (sel_look(L, s)) return 2;
  /* A zero timeout only looks; no descriptor, nothing to wait for (the
  ** Lua side sleeps out LuaSocket's timeout then). */
  if (t == 0 || s->n == 0) return sel_timeout(L);
  return sel_wait(L, s);
}

void lums_open_socket(lua_State *L) {
  if (luaL_newmetatable(L, SEL_MT)) {
    lua_pushcfunction(L, sel_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, sel_gc);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
  static const luaL_Reg fns[] = {
      {"buffered", l_buffered},
      {"connected", l_connected},
      {"select", l_select},
      {NULL, NULL}};
  luaL_newlib(L, fns);
  lua_setfield(L, -2, "socket");
}
