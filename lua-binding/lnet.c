/*
** lnet.c: ums.net, sockets for tasks (docs/lua-api.md, "Sockets").
**
** A connection is a buffered stream (lstream.h): the reading, writing,
** lines and setvbuf of ums.fs files, with recv and send for its I/O and
** a lock per direction (one reading and one writing method at a time; a
** close from another task ends them). This file adds what only sockets have:
** making them (resolve, connect, listen, accept, datagram sockets),
** their options and addresses, shutdown, and timeouts.
**
** Waiting. Every call that waits starts one request of the runtime's
** deferred form (ums_net_*_begin, ums_net_getaddrinfo_begin), which
** begins a park of the task, and ends it with lums_park_finish: the
** coroutine yields with a continuation, so a task waiting on a socket
** holds no worker and no C stack. A call made of several requests
** (connect: the resolution, then a connect per address until one
** succeeds) keeps its progress in a userdata of its own (lnet_op) on the
** task's stack, whose finalizer frees what a collected coroutine left.
*/
#define _GNU_SOURCE
#include "lstream.h"
#include "lpark.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <net/if.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define CONN_MT "ums.net.conn"
#define SERVER_MT "ums.net.server"
#define UDP_MT "ums.net.udp"
#define OP_MT "ums.net.op"

/* recvfrom's default and largest datagram. */
#define DGRAM_DEFAULT 65536
#define DGRAM_MAX (1 << 20)

/* ---------------------------------------------------------------------- */
/* Arguments and results                                                   */
/* ---------------------------------------------------------------------- */

/* An optional timeout in seconds at idx: its deadline (nil: none). */
static int64_t opt_deadline(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx)) return UMS_FOREVER;
  lua_Number t = luaL_checknumber(L, idx);
  luaL_argcheck(L, t >= 0 && t == t, idx, "timeout must not be negative");
  if (t > 1e9) return UMS_FOREVER;
  return ums_deadline((int64_t)(t * 1e9));
}

/* A timeout in seconds at idx as nanoseconds (nil: -1, none). */
static int64_t opt_timeout_ns(lua_State *L, int idx) {
  if (lua_isnoneornil(L, idx)) return -1;
  lua_Number t = luaL_checknumber(L, idx);
  luaL_argcheck(L, t >= 0 && t == t, idx, "timeout must not be negative");
  if (t > 1e9) return -1;
  return (int64_t)(t * 1e9);
}

/* Field k of the options table at idx (absent: nil pushed). */
static int opt_field(lua_State *L, int idx, const char *k) {
  if (lua_isnoneornil(L, idx)) {
    lua_pushnil(L);
    return LUA_TNIL;
  }
  return lua_getfield(L, idx, k);
}

/* The options table at idx, if any: a table whose every key is one of
** names (a NULL-terminated list), so that a misspelt option raises rather
** than being ignored. */
static void check_opts(lua_State *L, int idx, const char *const *names) {
  if (lua_isnoneornil(L, idx)) return;
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                   : NULL;
    int i = 0;
    while (k && names[i] && strcmp(k, names[i]) != 0) i++;
    if (!k || !names[i]) {
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      for (int j = 0; names[j]; j++) {
        if (j) luaL_addstring(&b, ", ");
        luaL_addstring(&b, names[j]);
      }
      luaL_pushresult(&b);
      luaL_argerror(L, idx,
                    k ? lua_pushfstring(L, "unknown option '%s' (options: %s)",
                                        k, lua_tostring(L, -1))
                      : lua_pushfstring(L, "option names must be strings "
                                        "(options: %s)", lua_tostring(L, -1)));
    }
  }
}

/* The options each call takes (README.md, "ums.net"). */
static const char *const resolve_opts[] = {"family", "socktype", "passive",
                                           "timeout", NULL};
static const char *const connect_opts[] = {"timeout", "family", "nodelay",
                                           "io_timeout", "wait", NULL};
static const char *const connect_unix_opts[] = {"timeout", "io_timeout",
                                                "wait", NULL};
static const char *const listen_opts[] = {"backlog", "reuseaddr", "reuseport",
                                          "family", NULL};
static const char *const listen_unix_opts[] = {"backlog", NULL};
static const char *const udp_opts[] = {"family", "timeout", NULL};

/* opts.family at idx: AF_INET, AF_INET6, or dflt when absent. */
static int opt_family(lua_State *L, int idx, int argn, int dflt) {
  int fam = dflt;
  if (opt_field(L, idx, "family") != LUA_TNIL) {
    const char *f = lua_tostring(L, -1);
    if (f && strcmp(f, "inet") == 0)
      fam = AF_INET;
    else if (f && strcmp(f, "inet6") == 0)
      fam = AF_INET6;
    else
      luaL_argerror(L, argn, "family must be \"inet\" or \"inet6\"");
  }
  lua_pop(L, 1);
  return fam;
}

static bool opt_bool(lua_State *L, int idx, const char *k, bool dflt) {
  bool v = dflt;
  if (opt_field(L, idx, k) != LUA_TNIL) v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* opts[k] as a timeout in seconds (ns; -1: none). */
static int64_t opt_seconds(lua_State *L, int idx, const char *k, int argn) {
  int64_t ns = -1;
  if (opt_field(L, idx, k) != LUA_TNIL) {
    if (!lua_isnumber(L, -1) || lua_tonumber(L, -1) < 0)
      luaL_argerror(L, argn, lua_pushfstring(L, "%s must be a number of "
                                                "seconds", k));
    lua_Number t = lua_tonumber(L, -1);
    ns = t > 1e9 ? -1 : (int64_t)(t * 1e9);
  }
  lua_pop(L, 1);
  return ns;
}

/* The port at idx: an integer 0..65535 or a string (a service). Pushes
** it as a string for getaddrinfo. */
static const char *check_port(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TSTRING) return lua_tostring(L, idx);
  lua_Integer p = luaL_checkinteger(L, idx);
  luaL_argcheck(L, p >= 0 && p <= 65535, idx, "port out of range");
  return lua_pushfstring(L, "%d", (int)p);
}

static const char *family_name(int fam) {
  switch (fam) {
    case AF_INET: return "inet";
    case AF_INET6: return "inet6";
    case AF_UNIX: return "unix";
    default: return "unknown";
  }
}

/* Pushes addr, port, family (unix: path, nil, "unix"); returns 3. */
static int push_addr(lua_State *L, const struct sockaddr *sa,
                     socklen_t len) {
  char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
  switch (sa->sa_family) {
    case AF_INET: {
      const struct sockaddr_in *in = (const void *)sa;
      inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
      lua_pushstring(L, host);
      lua_pushinteger(L, ntohs(in->sin_port));
      break;
    }
    case AF_INET6: {
      const struct sockaddr_in6 *in6 = (const void *)sa;
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
      lua_pushstring(L, host);
      lua_pushinteger(L, ntohs(in6->sin6_port));
      break;
    }
    case AF_UNIX: {
      const struct sockaddr_un *un = (const void *)sa;
      size_t off = offsetof(struct sockaddr_un, sun_path);
      size_t n = len > off ? len - off : 0;
      if (n > 0 && un->sun_path[0] != '\0')
        n = strnlen(un->sun_path, n);
      lua_pushlstring(L, un->sun_path, n);
      lua_pushnil(L);
      break;
    }
    default:
      lua_pushnil(L);
      lua_pushnil(L);
  }
  lua_pushstring(L, family_name(sa->sa_family));
  return 3;
}

/* A numeric address (no lookup) into ss: true, or false when host is not
** a numeric address of family fam (AF_UNSPEC: either). */
static bool numeric_addr(const char *host, int port, int fam,
                         struct sockaddr_storage *ss, socklen_t *len) {
  memset(ss, 0, sizeof *ss);
  struct sockaddr_in *in = (void *)ss;
  struct sockaddr_in6 *in6 = (void *)ss;
  if (fam != AF_INET6 && inet_pton(AF_INET, host, &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)port);
    *len = sizeof *in;
    return true;
  }
  if (fam != AF_INET && inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    *len = sizeof *in6;
    return true;
  }
  return false;
}

/* A Unix address for the path at idx. */
static socklen_t unix_addr(lua_State *L, int idx, struct sockaddr_un *un) {
  size_t n;
  const char *path = luaL_checklstring(L, idx, &n);
  luaL_argcheck(L, n > 0 && n < sizeof un->sun_path, idx,
                "path empty or too long for a Unix socket");
  memset(un, 0, sizeof *un);
  un->sun_family = AF_UNIX;
  memcpy(un->sun_path, path, n);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
}

/* A runtime failure: a cancelled task raises core.CANCELLED (as every
** wait does), anything else is nil, message, errno. */
static int net_fail(lua_State *L, int64_t err) {
  if (err == UMS_ECANCELED && lums_cur_task) lums_raise_cancelled(L);
  return lstream_push_netfail(L, err);
}

/* A resolution failure: nil, gai_strerror's words (lower case), code. */
static int dns_fail(lua_State *L, int rc, int eai) {
  if (rc == UMS_ECANCELED || rc == UMS_ETIMEDOUT || !eai ||
      eai == EAI_SYSTEM || eai == EAI_MEMORY)
    return net_fail(L, rc);
  char msg[128];
  snprintf(msg, sizeof msg, "%s", gai_strerror(eai));
  msg[0] = (char)tolower((unsigned char)msg[0]);
  lua_pushnil(L);
  lua_pushstring(L, msg);
  lua_pushinteger(L, -rc);
  return 3;
}

/* ---------------------------------------------------------------------- */
/* A call of several requests                                              */
/* ---------------------------------------------------------------------- */

enum { OP_CONNECT, OP_LISTEN, OP_RESOLVE };

/* The progress of connect, listen or resolve, in a userdata on the
** calling task's stack: touched only by that task. */
typedef struct lnet_op {
  int kind;                 /* OP_* */
  struct addrinfo *res;     /* the resolved addresses (freed by __gc) */
  struct addrinfo *cur;     /* connect: the address being tried */
  int fd;                   /* connect: the socket being connected (-1:
                               none; closed by __gc) */
  int64_t deadline;         /* the whole call's */
  int64_t last_err;         /* connect: the last address's failure */
  bool nodelay;
  bool nowait;              /* connect: hand the connection over while it
                               is being made (opts.wait = false) */
  int64_t io_timeout;       /* the new connection's (ns; -1: none) */
  int backlog;              /* listen */
  bool reuseaddr, reuseport;
  ums_dns_req_t *dreq;      /* the resolution in flight */
  ums_fs_req_t *req;        /* connect: the request in flight */
} lnet_op;

static int op_gc(lua_State *L) {
  lnet_op *op = luaL_checkudata(L, 1, OP_MT);
  if (op->fd >= 0) close(op->fd);
  op->fd = -1;
  if (op->res) freeaddrinfo(op->res);
  op->res = op->cur = NULL;
  return 0;
}

static lnet_op *new_op(lua_State *L, int kind) {
  lnet_op *op = lua_newuserdatauv(L, sizeof *op, 0);
  memset(op, 0, sizeof *op);
  op->kind = kind;
  op->fd = -1;
  op->deadline = UMS_FOREVER;
  op->io_timeout = -1;
  luaL_setmetatable(L, OP_MT);
  return op;
}

static int after_resolve(lua_State *L, lnet_op *op);

/* A listening socket. Touched only by the tasks of its VM. */
typedef struct lserver {
  int fd;                /* -1 once closed */
  int family;            /* AF_INET, AF_INET6, AF_UNIX */
} lserver;

/* Pushes a server over fd (which it owns from here; -1: set later). */
static lserver *new_server(lua_State *L, int fd, int family) {
  lserver *s = lua_newuserdatauv(L, sizeof *s, 0);
  s->fd = fd;
  s->family = family;
  luaL_setmetatable(L, SERVER_MT);
  return s;
}

/* The resolution has ended. */
static int resolved(lua_State *L, lnet_op *op) {
  int eai = 0;
  ums_dns_req_t *req = op->dreq;
  op->dreq = NULL;
  int rc = ums_net_getaddrinfo_end(req, &op->res, &eai);
  if (rc) return dns_fail(L, rc, eai);
  return after_resolve(L, op);
}

/* The continuations' context is the op, anchored on the task's stack. */
static int resolve_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return resolved(L, (lnet_op *)ctx);
}

/* Resolves host/service with hints for op (at the top of the stack),
** then goes on with after_resolve. */
static int start_resolve(lua_State *L, lnet_op *op, const char *host,
                         const char *service, const struct addrinfo *hints) {
  ltask *me = lums_cur_task;
  int rc = ums_net_getaddrinfo_begin(host, service, hints, op->deadline,
                                     &op->dreq);
  if (rc < 0) return net_fail(L, rc);
  if (rc == 1) return resolved(L, op);
  return lums_park_finish(L, me, (lua_KContext)op, resolve_k);
}

/* ---------------------------------------------------------------------- */
/* resolve                                                                 */
/* ---------------------------------------------------------------------- */

static int push_addrinfo(lua_State *L, const struct addrinfo *res) {
  lua_newtable(L);
  int n = 0;
  for (const struct addrinfo *a = res; a; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    lua_createtable(L, 0, 4);
    push_addr(L, a->ai_addr, a->ai_addrlen);
    lua_setfield(L, -4, "family");
    lua_setfield(L, -3, "port");
    lua_setfield(L, -2, "addr");
    lua_pushstring(L, a->ai_socktype == SOCK_DGRAM ? "dgram" : "stream");
    lua_setfield(L, -2, "socktype");
    lua_rawseti(L, -2, ++n);
  }
  return 1;
}

/* ums.net.resolve(host [, service [, hints]]) -> array | nil, msg, code */
static int net_resolve(lua_State *L) {
  const char *host = luaL_optstring(L, 1, NULL);
  lua_settop(L, 3);
  const char *service = NULL;
  if (!lua_isnoneornil(L, 2)) service = check_port(L, 2);
  check_opts(L, 3, resolve_opts);
  luaL_argcheck(L, host || service, 1, "host or service expected");
  lums_need_task(L, "net.resolve");
  struct addrinfo hints = {0};
  hints.ai_family = opt_family(L, 3, 3, AF_UNSPEC);
  hints.ai_socktype = SOCK_STREAM;
  if (opt_field(L, 3, "socktype") != LUA_TNIL) {
    const char *st = lua_tostring(L, -1);
    if (st && strcmp(st, "dgram") == 0)
      hints.ai_socktype = SOCK_DGRAM;
    else if (!st || strcmp(st, "stream") != 0)
      luaL_argerror(L, 3, "socktype must be \"stream\" or \"dgram\"");
  }
  lua_pop(L, 1);
  if (opt_bool(L, 3, "passive", false)) hints.ai_flags |= AI_PASSIVE;
  int64_t t = opt_seconds(L, 3, "timeout", 3);
  lnet_op *op = new_op(L, OP_RESOLVE);
  op->deadline = ums_deadline(t);
  return start_resolve(L, op, host, service, &hints);
}

/* ---------------------------------------------------------------------- */
/* Connections                                                             */
/* ---------------------------------------------------------------------- */

static void set_nodelay(int fd, bool on) {
  int v = on;
  ums_net_setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v);
}

/* Pushes a connection over fd (which it owns from here). A connection is
** written out at the end of every write call (setvbuf "no") until the
** program asks for more buffering. */
static lfile *new_conn(lua_State *L, int fd, int64_t io_timeout) {
  lfile *f = lstream_new(L, fd, true, true, true, CONN_MT);
  f->timeout = io_timeout;
  f->vbuf = LSTREAM_NO;
  return f;
}

static int connect_next(lua_State *L, lnet_op *op);

/* Pushes op's socket, connected or being connected to op->cur, as the
** call's connection. op keeps the descriptor until the connection owns
** it (new_conn may raise for memory before). */
static void push_connected(lua_State *L, lnet_op *op) {
  if (op->cur->ai_family != AF_UNIX) set_nodelay(op->fd, op->nodelay);
  new_conn(L, op->fd, op->io_timeout);
  op->fd = -1;
}

static int connect_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  lnet_op *op = (lnet_op *)ctx;
  int64_t r = ums_net_end(op->req, NULL, NULL);
  op->req = NULL;
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);  /* __gc closes */
  if (r == 0) {
    push_connected(L, op);
    return 1;
  }
  close(op->fd);
  op->fd = -1;
  op->last_err = r;
  op->cur = op->cur->ai_next;
  /* The whole call's deadline is the last word. */
  if (r == UMS_ETIMEDOUT) return net_fail(L, r);
  return connect_next(L, op);
}

/* Tries op->cur and the addresses after it in order. */
static int connect_next(lua_State *L, lnet_op *op) {
  ltask *me = lums_cur_task;
  for (; op->cur; op->cur = op->cur->ai_next) {
    struct addrinfo *a = op->cur;
    int fd = ums_net_socket(a->ai_family, SOCK_STREAM, 0);
    if (fd < 0) {
      op->last_err = fd;
      continue;
    }
    op->fd = fd;
    if (op->nowait) {
      /* The connection is handed over while the kernel makes it: its
      ** reads and writes wait for it as for any data, and fail with its
      ** error. An interrupted connect(2) goes on in the kernel too. */
      int e = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
      if (e == 0 || e == EINPROGRESS || e == EINTR) {
        push_connected(L, op);
        lua_pushboolean(L, e != 0);  /* still being made */
        return 2;
      }
      close(fd);
      op->fd = -1;
      op->last_err = -e;
      continue;
    }
    int rc = ums_net_connect_begin(fd, a->ai_addr, a->ai_addrlen,
                                   op->deadline, &op->req);
    if (rc == 0) return lums_park_finish(L, me, (lua_KContext)op,
                                         connect_k);
    close(fd);
    op->fd = -1;
    if (rc == UMS_ECANCELED) return lums_raise_cancelled(L);
    op->last_err = rc;
  }
  return net_fail(L, op->last_err ? op->last_err : UMS_ENOENT);
}

static int after_resolve(lua_State *L, lnet_op *op) {
  switch (op->kind) {
    case OP_RESOLVE:
      return push_addrinfo(L, op->res);
    case OP_CONNECT:
      op->cur = op->res;
      return connect_next(L, op);
    default: {
      /* listen: the first address that binds. */
      int64_t err = UMS_ENOENT;
      for (struct addrinfo *a = op->res; a; a = a->ai_next) {
        int fd = ums_net_socket(a->ai_family, SOCK_STREAM, 0);
        if (fd < 0) {
          err = fd;
          continue;
        }
        int on = 1;
        if (op->reuseaddr)
          ums_net_setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
        if (op->reuseport)
          ums_net_setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
        int rc = ums_net_bind(fd, a->ai_addr, a->ai_addrlen);
        if (!rc) rc = ums_net_listen(fd, op->backlog);
        if (rc) {
          close(fd);
          err = rc;
          continue;
        }
        op->fd = fd;  /* until the server owns it */
        new_server(L, fd, a->ai_family);
        op->fd = -1;
        return 1;
      }
      return net_fail(L, err);
    }
  }
}

/* ums.net.connect(host, port [, opts]) -> conn | nil, msg, code */
static int net_connect(lua_State *L) {
  const char *host = luaL_checkstring(L, 1);
  lua_settop(L, 3);
  const char *port = check_port(L, 2);
  check_opts(L, 3, connect_opts);
  struct addrinfo hints = {0};
  hints.ai_family = opt_family(L, 3, 3, AF_UNSPEC);
  hints.ai_socktype = SOCK_STREAM;
  int64_t t = opt_seconds(L, 3, "timeout", 3);
  bool nodelay = opt_bool(L, 3, "nodelay", true);
  bool nowait = !opt_bool(L, 3, "wait", true);
  int64_t io_timeout = opt_seconds(L, 3, "io_timeout", 3);
  lums_need_task(L, "net.connect");
  lnet_op *op = new_op(L, OP_CONNECT);
  op->deadline = ums_deadline(t);
  op->nodelay = nodelay;
  op->nowait = nowait;
  op->io_timeout = io_timeout;
  return start_resolve(L, op, host, port, &hints);
}

/* ums.net.connect_unix(path [, opts]) -> conn | nil, msg, code */
static int net_connect_unix(lua_State *L) {
  struct sockaddr_un un;
  socklen_t len = unix_addr(L, 1, &un);
  check_opts(L, 2, connect_unix_opts);
  int64_t t = opt_seconds(L, 2, "timeout", 2);
  int64_t io_timeout = opt_seconds(L, 2, "io_timeout", 2);
  bool nowait = !opt_bool(L, 2, "wait", true);
  lums_need_task(L, "net.connect_unix");
  lnet_op *op = new_op(L, OP_CONNECT);
  op->deadline = ums_deadline(t);
  op->io_timeout = io_timeout;
  op->nowait = nowait;
  /* One address, made as getaddrinfo makes its lists (freeaddrinfo frees
  ** each node and its address). */
  struct addrinfo *a = calloc(1, sizeof *a + sizeof un);
  if (!a) return net_fail(L, UMS_ENOMEM);
  a->ai_family = AF_UNIX;
  a->ai_socktype = SOCK_STREAM;
  a->ai_addr = (struct sockaddr *)(a + 1);
  a->ai_addrlen = len;
  memcpy(a->ai_addr, &un, sizeof un);
  op->res = op->cur = a;
  return connect_next(L, op);
}

/* ---------------------------------------------------------------------- */
/* Servers                                                                 */
/* ---------------------------------------------------------------------- */

static lserver *check_server(lua_State *L, int idx) {
  lserver *s = luaL_checkudata(L, idx, SERVER_MT);
  if (s->fd < 0) luaL_error(L, "attempt to use a closed server");
  return s;
}

/* ums.net.listen(host, port [, opts]) -> server | nil, msg, code */
static int net_listen(lua_State *L) {
  const char *host = luaL_optstring(L, 1, NULL);
  lua_settop(L, 3);
  const char *port = check_port(L, 2);
  check_opts(L, 3, listen_opts);
  struct addrinfo hints = {0};
  hints.ai_family = opt_family(L, 3, 3, AF_UNSPEC);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  int backlog = SOMAXCONN;
  if (opt_field(L, 3, "backlog") != LUA_TNIL) {
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0)
      luaL_argerror(L, 3, "backlog must be a non-negative integer");
    lua_Integer b = lua_tointeger(L, -1);
    backlog = b > INT32_MAX ? INT32_MAX : (int)b;
  }
  lua_pop(L, 1);
  bool reuseaddr = opt_bool(L, 3, "reuseaddr", true);
  bool reuseport = opt_bool(L, 3, "reuseport", false);
  /* A numeric host or none needs no task: only a lookup waits. */
  struct sockaddr_storage ss;
  socklen_t sl;
  if (host && !numeric_addr(host, 0, AF_UNSPEC, &ss, &sl))
    lums_need_task(L, "net.listen");
  lnet_op *op = new_op(L, OP_LISTEN);
  op->backlog = backlog;
  op->reuseaddr = reuseaddr;
  op->reuseport = reuseport;
  if (!lums_cur_task || !lums_cur_task->vmrun) {
    int eai = 0;
    int rc = ums_net_getaddrinfo(host, port, &hints, &op->res, &eai,
                                 UMS_FOREVER);
    if (rc) return dns_fail(L, rc, eai);
    return after_resolve(L, op);
  }
  return start_resolve(L, op, host, port, &hints);
}

/* ums.net.listen_unix(path [, opts]) -> server | nil, msg, code */
static int net_listen_unix(lua_State *L) {
  struct sockaddr_un un;
  socklen_t len = unix_addr(L, 1, &un);
  check_opts(L, 2, listen_unix_opts);
  int backlog = SOMAXCONN;
  if (opt_field(L, 2, "backlog") != LUA_TNIL) {
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0)
      luaL_argerror(L, 2, "backlog must be a non-negative integer");
    backlog = (int)lua_tointeger(L, -1);
  }
  lua_pop(L, 1);
  /* The server first, so that no allocation can fail once the socket
  ** exists. */
  lserver *srv = new_server(L, -1, AF_UNIX);
  int fd = ums_net_socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return net_fail(L, fd);
  int rc = ums_net_bind(fd, (struct sockaddr *)&un, len);
  if (!rc) rc = ums_net_listen(fd, backlog);
  if (rc) {
    close(fd);
    return net_fail(L, rc);
  }
  srv->fd = fd;
  return 1;
}

/* accept: a descriptor limit (EMFILE, ENFILE) leaves the connection in
** the listener's queue and nothing says when a descriptor frees up, so
** the call waits and tries again, from ACCEPT_BACKOFF_MIN doubling up to
** ACCEPT_BACKOFF_MAX, until its deadline (then the limit's error): a
** server loop neither spins nor loses its listener. */
#define ACCEPT_BACKOFF_MIN (1 * UMS_NSEC_PER_MSEC)
#define ACCEPT_BACKOFF_MAX (100 * UMS_NSEC_PER_MSEC)

/* The accept's progress, at index 2 of its stack (the server at 1). */
typedef struct {
  int64_t deadline;
  int64_t backoff;
  int64_t last_err;
} laccept;

static int accept_start(lua_State *L, laccept *a);
static int accept_again_k(lua_State *L, int status, lua_KContext ctx);

static int accept_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  laccept *a = lua_touserdata(L, 2);
  int fd = (int)ums_net_end((ums_fs_req_t *)ctx, NULL, NULL);
  if (fd >= 0) {
    lserver *s = lua_touserdata(L, 1);
    if (s->family != AF_UNIX) set_nodelay(fd, true);
    /* The connection server_accept made before: nothing to allocate
    ** with a descriptor in hand. */
    lfile *f = lua_touserdata(L, 3);
    f->fd = fd;
    lua_settop(L, 3);
    return 1;
  }
  if (fd == UMS_EMFILE || fd == UMS_ENFILE) {
    a->last_err = fd;
    int64_t now = ums_now();
    if (a->deadline != UMS_FOREVER && now >= a->deadline)
      return net_fail(L, fd);
    a->backoff = a->backoff ? a->backoff * 2 : ACCEPT_BACKOFF_MIN;
    if (a->backoff > ACCEPT_BACKOFF_MAX) a->backoff = ACCEPT_BACKOFF_MAX;
    int64_t until = now + a->backoff;
    if (a->deadline != UMS_FOREVER && until > a->deadline)
      until = a->deadline;
    ums_park_token_t tok;
    ltask *me = lums_cur_task;
    lums_park_begin(L, me, until, 0, &tok);
    return lums_park_finish(L, me, 0, accept_again_k);
  }
  if (fd == UMS_ETIMEDOUT && a->last_err) return net_fail(L, a->last_err);
  return net_fail(L, fd);
}

static int accept_again_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  if (ums_park_result() == UMS_ECANCELED) return lums_raise_cancelled(L);
  laccept *a = lua_touserdata(L, 2);
  return accept_start(L, a);
}

static int accept_start(lua_State *L, laccept *a) {
  lserver *s = lua_touserdata(L, 1);
  if (s->fd < 0) return net_fail(L, UMS_EBADF);
  ums_fs_req_t *req;
  int rc = ums_net_accept_begin(s->fd, a->deadline, &req);
  if (rc > 0) return lums_answered_now(L, (lua_KContext)req, accept_k);
  if (rc) return net_fail(L, rc);
  return lums_park_finish(L, lums_cur_task, (lua_KContext)req, accept_k);
}

/* server:accept([timeout]) -> conn | nil, msg, code */
static int server_accept(lua_State *L) {
  check_server(L, 1);
  int64_t deadline = opt_deadline(L, 2);
  lums_need_task(L, "net.accept");
  lua_settop(L, 1);
  laccept *a = lua_newuserdatauv(L, sizeof *a, 0);
  memset(a, 0, sizeof *a);
  a->deadline = deadline;
  new_conn(L, -1, -1);  /* 3: the connection, given its descriptor then */
  return accept_start(L, a);
}

/* close() of an object that owns the descriptor *fdp (servers and
** datagram sockets): the object forgets it first, so a second close and
** the collector find nothing to close. A cancelled task's close still
** closes (ums.h), so UMS_ECANCELED is not a failure here. */
static int fd_close(lua_State *L, int *fdp) {
  if (*fdp >= 0) {
    int fd = *fdp;
    *fdp = -1;
    int rc = ums_net_close(fd, UMS_FOREVER);
    if (rc && rc != UMS_ECANCELED) return net_fail(L, rc);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* The collector's close: it cannot wait, so close(2) on this thread. */
static int fd_gc(int *fdp) {
  if (*fdp >= 0) close(*fdp);
  *fdp = -1;
  return 0;
}

static int server_close(lua_State *L) {
  return fd_close(L, &((lserver *)luaL_checkudata(L, 1, SERVER_MT))->fd);
}

static int server_gc(lua_State *L) {
  return fd_gc(&((lserver *)luaL_checkudata(L, 1, SERVER_MT))->fd);
}

/* server:setbacklog(n) -> true | nil, msg, code: listen(2) again, which
** changes the queue of connections not yet accepted. */
static int server_setbacklog(lua_State *L) {
  lserver *s = check_server(L, 1);
  lua_Integer b = luaL_checkinteger(L, 2);
  luaL_argcheck(L, b >= 0, 2, "backlog must be a non-negative integer");
  int rc = ums_net_listen(s->fd, b > INT32_MAX ? INT32_MAX : (int)b);
  if (rc) return net_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int server_fileno(lua_State *L) {
  lua_pushinteger(L, check_server(L, 1)->fd);
  return 1;
}

static int sock_name(lua_State *L, int fd, bool peer) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  int rc = peer ? ums_net_getpeername(fd, (struct sockaddr *)&ss, &len)
                : ums_net_getsockname(fd, (struct sockaddr *)&ss, &len);
  if (rc) return net_fail(L, rc);
  return push_addr(L, (struct sockaddr *)&ss, len);
}

static int server_getsockname(lua_State *L) {
  return sock_name(L, check_server(L, 1)->fd, false);
}

static int server_tostring(lua_State *L) {
  lserver *s = luaL_checkudata(L, 1, SERVER_MT);
  if (s->fd < 0) {
    lua_pushliteral(L, "ums.net.server (closed)");
    return 1;
  }
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(s->fd, (struct sockaddr *)&ss, &len) != 0) {
    lua_pushfstring(L, "ums.net.server (%d)", s->fd);
    return 1;
  }
  push_addr(L, (struct sockaddr *)&ss, len);
  if (lua_isnil(L, -2))
    lua_pushfstring(L, "ums.net.server (%s)", lua_tostring(L, -3));
  else
    lua_pushfstring(L, "ums.net.server (%s:%d)", lua_tostring(L, -3),
                    (int)lua_tointeger(L, -2));
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Connection methods of sockets                                           */
/* ---------------------------------------------------------------------- */

static lfile *check_conn(lua_State *L, int idx) {
  return lstream_check(L, idx, CONN_MT);
}

/* conn:settimeout(t): every later waiting method's (nil: none). */
static int conn_settimeout(lua_State *L) {
  lfile *f = check_conn(L, 1);
  f->timeout = opt_timeout_ns(L, 2);
  lua_settop(L, 1);
  return 1;
}

static int conn_gettimeout(lua_State *L) {
  lfile *f = check_conn(L, 1);
  if (f->timeout < 0)
    lua_pushnil(L);
  else
    lua_pushnumber(L, (lua_Number)f->timeout / 1e9);
  return 1;
}

static int shutdown_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  /* Above the connection, the flush's results (none for "r"): true, or
  ** its failure (nil, message, errno, written), which is the result. */
  if (lua_gettop(L) >= 2 && lua_isnil(L, 2)) return lua_gettop(L) - 1;
  lfile *f = lstream_to(L, 1);
  if (!f || f->fd < 0) return luaL_error(L, "attempt to use a closed "
                                            "connection");
  int rc = ums_net_shutdown(f->fd, (int)ctx);
  if (rc) return net_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* conn:shutdown("r"|"w"|"rw") -> true | nil, msg, code. Flushes first
** for "w" and "rw". */
static int conn_shutdown(lua_State *L) {
  static const char *const modes[] = {"r", "w", "rw", NULL};
  static const int how[] = {SHUT_RD, SHUT_WR, SHUT_RDWR};
  lfile *f = check_conn(L, 1);
  int m = how[luaL_checkoption(L, 2, "rw", modes)];
  lua_settop(L, 1);
  if (m == SHUT_RD) return shutdown_k(L, LUA_OK, m);
  lums_need_task(L, "net.shutdown");
  (void)f;
  lua_pushcfunction(L, lstream_flush);
  lua_pushvalue(L, 1);
  lua_callk(L, 1, LUA_MULTRET, m, shutdown_k);
  return shutdown_k(L, LUA_OK, m);
}

/* Socket options by name: level, option, kind. */
enum { OPT_BOOL, OPT_INT, OPT_LINGER };
static const struct {
  const char *name;
  int level, opt, kind;
} options[] = {
    {"nodelay", IPPROTO_TCP, TCP_NODELAY, OPT_BOOL},
    {"keepalive", SOL_SOCKET, SO_KEEPALIVE, OPT_BOOL},
    {"reuseaddr", SOL_SOCKET, SO_REUSEADDR, OPT_BOOL},
    {"reuseport", SOL_SOCKET, SO_REUSEPORT, OPT_BOOL},
    {"broadcast", SOL_SOCKET, SO_BROADCAST, OPT_BOOL},
    {"linger", SOL_SOCKET, SO_LINGER, OPT_LINGER},
    {"sndbuf", SOL_SOCKET, SO_SNDBUF, OPT_INT},
    {"rcvbuf", SOL_SOCKET, SO_RCVBUF, OPT_INT},
    {NULL, 0, 0, 0}};

static int find_option(lua_State *L, int idx) {
  const char *name = luaL_checkstring(L, idx);
  for (int i = 0; options[i].name; i++)
    if (strcmp(options[i].name, name) == 0) return i;
  return luaL_argerror(L, idx,
                       lua_pushfstring(L, "invalid option '%s'", name));
}

/* sock:setoption(name, value) -> true | nil, msg, code */
static int set_option(lua_State *L, int fd) {
  int i = find_option(L, 2);
  int rc;
  if (options[i].kind == OPT_LINGER) {
    struct linger lg = {0, 0};
    if (lua_toboolean(L, 3)) {
      lua_Integer s = luaL_checkinteger(L, 3);
      luaL_argcheck(L, s >= 0 && s <= INT32_MAX, 3,
                    "linger must be a number of seconds or false");
      lg.l_onoff = 1;
      lg.l_linger = (int)s;
    }
    rc = ums_net_setsockopt(fd, options[i].level, options[i].opt, &lg,
                            sizeof lg);
  } else {
    int v;
    if (options[i].kind == OPT_BOOL) {
      luaL_checkany(L, 3);
      v = lua_toboolean(L, 3);
    } else {
      lua_Integer n = luaL_checkinteger(L, 3);
      luaL_argcheck(L, n >= 0 && n <= INT32_MAX, 3, "size out of range");
      v = (int)n;
    }
    rc = ums_net_setsockopt(fd, options[i].level, options[i].opt, &v,
                            sizeof v);
  }
  if (rc) return net_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* sock:getoption(name) -> value | nil, msg, code */
static int get_option(lua_State *L, int fd) {
  int i = find_option(L, 2);
  if (options[i].kind == OPT_LINGER) {
    struct linger lg = {0, 0};
    socklen_t len = sizeof lg;
    int rc = ums_net_getsockopt(fd, options[i].level, options[i].opt, &lg,
                                &len);
    if (rc) return net_fail(L, rc);
    if (lg.l_onoff)
      lua_pushinteger(L, lg.l_linger);
    else
      lua_pushboolean(L, 0);
    return 1;
  }
  int v = 0;
  socklen_t len = sizeof v;
  int rc = ums_net_getsockopt(fd, options[i].level, options[i].opt, &v,
                              &len);
  if (rc) return net_fail(L, rc);
  if (options[i].kind == OPT_BOOL)
    lua_pushboolean(L, v != 0);
  else
    lua_pushinteger(L, v);
  return 1;
}

static int conn_setoption(lua_State *L) {
  return set_option(L, check_conn(L, 1)->fd);
}
static int conn_getoption(lua_State *L) {
  return get_option(L, check_conn(L, 1)->fd);
}
static int conn_getsockname(lua_State *L) {
  return sock_name(L, check_conn(L, 1)->fd, false);
}
static int conn_getpeername(lua_State *L) {
  return sock_name(L, check_conn(L, 1)->fd, true);
}
static int conn_fileno(lua_State *L) {
  lua_pushinteger(L, check_conn(L, 1)->fd);
  return 1;
}

/* "addr:port" of fd's own or peer address, pushed. */
static void push_endpoint(lua_State *L, int fd, bool peer) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  int rc = peer ? getpeername(fd, (struct sockaddr *)&ss, &len)
                : getsockname(fd, (struct sockaddr *)&ss, &len);
  if (rc != 0) {
    lua_pushliteral(L, "?");
    return;
  }
  int top = lua_gettop(L);
  push_addr(L, (struct sockaddr *)&ss, len);
  if (lua_isnil(L, top + 2))
    lua_pushvalue(L, top + 1);
  else if (ss.ss_family == AF_INET6)
    lua_pushfstring(L, "[%s]:%d", lua_tostring(L, top + 1),
                    (int)lua_tointeger(L, top + 2));
  else
    lua_pushfstring(L, "%s:%d", lua_tostring(L, top + 1),
                    (int)lua_tointeger(L, top + 2));
  lua_replace(L, top + 1);
  lua_settop(L, top + 1);
}

static int conn_tostring(lua_State *L) {
  lfile *f = lstream_to(L, 1);
  if (!f) return luaL_typeerror(L, 1, CONN_MT);
  if (f->fd < 0) {
    lua_pushliteral(L, "ums.net.conn (closed)");
    return 1;
  }
  push_endpoint(L, f->fd, false);
  push_endpoint(L, f->fd, true);
  lua_pushfstring(L, "ums.net.conn (%s -> %s)", lua_tostring(L, -2),
                  lua_tostring(L, -1));
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Datagram sockets                                                        */
/* ---------------------------------------------------------------------- */

/* A datagram socket: no stream, one request at a time per call. Touched
** only by the tasks of its VM. */
typedef struct ludp {
  int fd;                /* -1 once closed */
  int family;
  int64_t timeout;       /* per call, ns; -1: none */
} ludp;

static ludp *check_udp(lua_State *L, int idx) {
  ludp *u = luaL_checkudata(L, idx, UDP_MT);
  if (u->fd < 0) luaL_error(L, "attempt to use a closed socket");
  return u;
}

static int new_udp(lua_State *L, int family, int64_t timeout) {
  /* The object first, so that no allocation can fail once the socket
  ** exists. */
  ludp *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->fd = -1;
  u->family = family;
  u->timeout = timeout;
  luaL_setmetatable(L, UDP_MT);
  int fd = ums_net_socket(family, SOCK_DGRAM, 0);
  if (fd < 0) return net_fail(L, fd);
  u->fd = fd;
  return 1;
}

/* ums.net.udp([opts]) -> udp | nil, msg, code */
static int net_udp(lua_State *L) {
  check_opts(L, 1, udp_opts);
  int fam = opt_family(L, 1, 1, AF_INET);
  int64_t t = opt_seconds(L, 1, "timeout", 1);
  return new_udp(L, fam, t);
}

/* ums.net.udp_unix([path]) -> udp | nil, msg, code */
static int net_udp_unix(lua_State *L) {
  struct sockaddr_un un;
  socklen_t len = 0;
  if (!lua_isnoneornil(L, 1)) len = unix_addr(L, 1, &un);
  if (new_udp(L, AF_UNIX, -1) != 1 || lua_isnil(L, -1)) return 3;
  if (len) {
    ludp *u = lua_touserdata(L, -1);
    int rc = ums_net_bind(u->fd, (struct sockaddr *)&un, len);
    if (rc) return net_fail(L, rc);  /* the socket is collected */
  }
  return 1;
}

/* The address host, port (or a Unix path) at idx for u. */
static socklen_t udp_addr(lua_State *L, ludp *u, int idx,
                          struct sockaddr_storage *ss) {
  if (u->family == AF_UNIX)
    return unix_addr(L, idx, (struct sockaddr_un *)ss);
  const char *host = luaL_checkstring(L, idx);
  lua_Integer port = luaL_checkinteger(L, idx + 1);
  luaL_argcheck(L, port >= 0 && port <= 65535, idx + 1, "port out of range");
  socklen_t len = 0;  /* set by numeric_addr, or luaL_argerror raises */
  if (strcmp(host, "*") == 0)
    host = u->family == AF_INET6 ? "::" : "0.0.0.0";
  else if (strcmp(host, "localhost") == 0)
    host = u->family == AF_INET6 ? "::1" : "127.0.0.1";
  if (!numeric_addr(host, (int)port, u->family, ss, &len))
    luaL_argerror(L, idx, "numeric address of the socket's family "
                          "expected (see ums.net.resolve)");
  return len;
}

static int udp_bind(lua_State *L) {
  ludp *u = check_udp(L, 1);
  struct sockaddr_storage ss;
  socklen_t len = udp_addr(L, u, 2, &ss);
  int rc = ums_net_bind(u->fd, (struct sockaddr *)&ss, len);
  if (rc) return net_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* Sets u's peer to sa (AF_UNSPEC: none): true | nil, msg, code. A
** datagram connect never waits (connect(2) only records the peer). */
static int udp_set_peer(lua_State *L, ludp *u, const struct sockaddr *sa,
                        socklen_t len) {
  int rc = connect(u->fd, sa, len) == 0 ? 0 : -errno;
  if (rc) return net_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int udp_connect(lua_State *L) {
  ludp *u = check_udp(L, 1);
  struct sockaddr_storage ss;
  socklen_t len = udp_addr(L, u, 2, &ss);
  return udp_set_peer(L, u, (struct sockaddr *)&ss, len);
}

/* udp:disconnect(): forgets the peer (connect(2) to AF_UNSPEC), so that
** sendto and recvfrom take any address again. */
static int udp_disconnect(lua_State *L) {
  struct sockaddr sa = {.sa_family = AF_UNSPEC};
  return udp_set_peer(L, check_udp(L, 1), &sa, sizeof sa);
}

static int udp_send_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  int64_t r = ums_net_end((ums_fs_req_t *)ctx, NULL, NULL);
  if (r < 0) return net_fail(L, r);
  lua_pushinteger(L, (lua_Integer)r);
  return 1;
}

/* Sends data (at idx) to ss (NULL: the connected peer). */
static int udp_send_to(lua_State *L, ludp *u, int idx,
                       const struct sockaddr_storage *ss, socklen_t len,
                       const char *what) {
  size_t n;
  const char *data = luaL_checklstring(L, idx, &n);
  lums_need_task(L, what);
  ums_buf_t *b = ums_buf_new(n ? n : 1);
  if (!b) return net_fail(L, UMS_ENOMEM);
  memcpy(ums_buf_data(b), data, n);
  ums_fs_req_t *req;
  int rc = ums_net_sendto_begin(u->fd, b, 0, n, 0,
                                (const struct sockaddr *)ss, len,
                                ums_deadline(u->timeout), &req);
  /* The request holds its own reference until it really ends. */
  ums_buf_release(b);
  if (rc > 0) return lums_answered_now(L, (lua_KContext)req, udp_send_k);
  if (rc) return net_fail(L, rc);
  return lums_park_finish(L, lums_cur_task, (lua_KContext)req, udp_send_k);
}

/* udp:sendto(data, host, port) -> count | nil, msg, code */
static int udp_sendto(lua_State *L) {
  ludp *u = check_udp(L, 1);
  struct sockaddr_storage ss;
  socklen_t len = udp_addr(L, u, 3, &ss);
  return udp_send_to(L, u, 2, &ss, len, "net.sendto");
}

/* udp:send(data) -> count | nil, msg, code (a connected socket) */
static int udp_send(lua_State *L) {
  ludp *u = check_udp(L, 1);
  return udp_send_to(L, u, 2, NULL, 0, "net.send");
}

/* The receive's buffer, anchored at the top of the stack while the
** request runs (the request holds a reference of its own). */
typedef struct {
  ums_buf_t *buf;
  bool from;             /* recvfrom: push the sender too */
  ums_fs_req_t *req;     /* in flight */
} lrecv;

static int lrecv_gc(lua_State *L) {
  lrecv *r = lua_touserdata(L, 1);
  ums_buf_release(r->buf);
  r->buf = NULL;
  return 0;
}

static int udp_recv_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  lrecv *r = (lrecv *)ctx;  /* anchored on the task's stack */
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  int64_t n = ums_net_end(r->req, (struct sockaddr *)&ss, &len);
  r->req = NULL;
  if (n < 0) return net_fail(L, n);
  lua_pushlstring(L, ums_buf_data(r->buf), (size_t)n);
  if (!r->from) return 1;
  push_addr(L, (struct sockaddr *)&ss, len);
  lua_pop(L, 1);  /* the family */
  return 3;
}

static int udp_recv_from(lua_State *L, bool from) {
  ludp *u = check_udp(L, 1);
  lua_Integer size = luaL_optinteger(L, 2, DGRAM_DEFAULT);
  luaL_argcheck(L, size > 0 && size <= DGRAM_MAX, 2, "size out of range");
  lums_need_task(L, from ? "net.recvfrom" : "net.recv");
  lrecv *r = lua_newuserdatauv(L, sizeof *r, 0);
  r->buf = NULL;
  r->from = from;
  r->req = NULL;
  luaL_setmetatable(L, "ums.net.recvbuf");
  if (!(r->buf = ums_buf_new((size_t)size))) return net_fail(L, UMS_ENOMEM);
  int rc = ums_net_recvfrom_begin(u->fd, r->buf, 0, (size_t)size, 0,
                                  ums_deadline(u->timeout), &r->req);
  if (rc > 0) return lums_answered_now(L, (lua_KContext)r, udp_recv_k);
  if (rc) return net_fail(L, rc);
  return lums_park_finish(L, lums_cur_task, (lua_KContext)r, udp_recv_k);
}

/* udp:recvfrom([size]) -> data, host, port | nil, msg, code */
static int udp_recvfrom(lua_State *L) { return udp_recv_from(L, true); }
/* udp:recv([size]) -> data | nil, msg, code */
static int udp_recv(lua_State *L) { return udp_recv_from(L, false); }

static int udp_settimeout(lua_State *L) {
  ludp *u = check_udp(L, 1);
  u->timeout = opt_timeout_ns(L, 2);
  lua_settop(L, 1);
  return 1;
}

static int udp_gettimeout(lua_State *L) {
  ludp *u = check_udp(L, 1);
  if (u->timeout < 0)
    lua_pushnil(L);
  else
    lua_pushnumber(L, (lua_Number)u->timeout / 1e9);
  return 1;
}

static int udp_setoption(lua_State *L) {
  return set_option(L, check_udp(L, 1)->fd);
}
static int udp_getoption(lua_State *L) {
  return get_option(L, check_udp(L, 1)->fd);
}
static int udp_getsockname(lua_State *L) {
  return sock_name(L, check_udp(L, 1)->fd, false);
}
static int udp_getpeername(lua_State *L) {
  return sock_name(L, check_udp(L, 1)->fd, true);
}
static int udp_fileno(lua_State *L) {
  lua_pushinteger(L, check_udp(L, 1)->fd);
  return 1;
}

static int udp_close(lua_State *L) {
  return fd_close(L, &((ludp *)luaL_checkudata(L, 1, UDP_MT))->fd);
}

static int udp_gc(lua_State *L) {
  return fd_gc(&((ludp *)luaL_checkudata(L, 1, UDP_MT))->fd);
}

static int udp_tostring(lua_State *L) {
  ludp *u = luaL_checkudata(L, 1, UDP_MT);
  if (u->fd < 0)
    lua_pushliteral(L, "ums.net.udp (closed)");
  else
    lua_pushfstring(L, "ums.net.udp (%d)", u->fd);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* The module                                                              */
/* ---------------------------------------------------------------------- */

static void new_type(lua_State *L, const char *mt, const luaL_Reg *methods,
                     lua_CFunction gc, lua_CFunction close,
                     lua_CFunction tostring) {
  if (luaL_newmetatable(L, mt)) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, close);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
}

static int server_tbc(lua_State *L) {
  server_close(L);
  return 0;
}

static int udp_tbc(lua_State *L) {
  udp_close(L);
  return 0;
}

/* Raises the soft limit on open descriptors to the hard one, once per
** process, as a server that holds many connections needs (Debian's
** default soft limit is 1024). UMS_NOFILE=keep in the environment leaves
** it alone, for programs that pass descriptors to select(2), whose sets
** stop at FD_SETSIZE (1024). */
static void raise_nofile(void) {
  const char *keep = getenv("UMS_NOFILE");
  if (keep && strcmp(keep, "keep") == 0) return;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
    return;
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

void lums_open_net(lua_State *L) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, raise_nofile);
  static const luaL_Reg conn_methods[] = {
      {"read", lstream_read},         {"write", lstream_write},
      {"lines", lstream_lines},       {"flush", lstream_flush},
      {"close", lstream_close},       {"setvbuf", lstream_setvbuf},
      {"recv", lstream_recv},         {"send", lstream_send},
      {"drain", lstream_drain},       {"settimeout", conn_settimeout},
      {"gettimeout", conn_gettimeout}, {"shutdown", conn_shutdown},
      {"setoption", conn_setoption},  {"getoption", conn_getoption},
      {"getsockname", conn_getsockname},
      {"getpeername", conn_getpeername},
      {"fileno", conn_fileno},        {NULL, NULL}};
  static const luaL_Reg server_methods[] = {
      {"accept", server_accept},   {"close", server_close},
      {"fileno", server_fileno},   {"getsockname", server_getsockname},
      {"setbacklog", server_setbacklog},
      {NULL, NULL}};
  static const luaL_Reg udp_methods[] = {
      {"bind", udp_bind},           {"connect", udp_connect},
      {"disconnect", udp_disconnect},
      {"sendto", udp_sendto},       {"recvfrom", udp_recvfrom},
      {"send", udp_send},           {"recv", udp_recv},
      {"settimeout", udp_settimeout}, {"gettimeout", udp_gettimeout},
      {"setoption", udp_setoption}, {"getoption", udp_getoption},
      {"getsockname", udp_getsockname},
      {"getpeername", udp_getpeername},
      {"close", udp_close},         {"fileno", udp_fileno},
      {NULL, NULL}};
  static const luaL_Reg funcs[] = {
      {"resolve", net_resolve},       {"connect", net_connect},
      {"connect_unix", net_connect_unix},
      {"listen", net_listen},         {"listen_unix", net_listen_unix},
      {"udp", net_udp},               {"udp_unix", net_udp_unix},
      {NULL, NULL}};
  new_type(L, CONN_MT, conn_methods, lstream_gc, lstream_tbc, conn_tostring);
  new_type(L, SERVER_MT, server_methods, server_gc, server_tbc,
           server_tostring);
  new_type(L, UDP_MT, udp_methods, udp_gc, udp_tbc, udp_tostring);
  if (luaL_newmetatable(L, OP_MT)) {
    lua_pushcfunction(L, op_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, "ums.net.recvbuf")) {
    lua_pushcfunction(L, lrecv_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);

  lua_pushcfunction(L, lstream_buffers);
  lua_setfield(L, -2, "stream_buffers");

  luaL_newlib(L, funcs);
  /* ums.net.errno: the names of the codes failures return. */
  static const struct {
    const char *name;
    int code;
  } codes[] = {{"EAGAIN", EAGAIN},           {"EADDRINUSE", EADDRINUSE},
               {"EADDRNOTAVAIL", EADDRNOTAVAIL},
               {"EAFNOSUPPORT", EAFNOSUPPORT}, {"EBADF", EBADF},
               {"ECONNABORTED", ECONNABORTED},
               {"ECONNREFUSED", ECONNREFUSED},
               {"ECONNRESET", ECONNRESET},   {"EHOSTUNREACH", EHOSTUNREACH},
               {"EINVAL", EINVAL},           {"EMFILE", EMFILE},
               {"ENETUNREACH", ENETUNREACH}, {"ENFILE", ENFILE},
               {"ENOENT", ENOENT},           {"ENOMEM", ENOMEM},
               {"ENOTCONN", ENOTCONN},       {"EPIPE", EPIPE},
               {"ETIMEDOUT", ETIMEDOUT},     {"EACCES", EACCES},
               {"EMSGSIZE", EMSGSIZE},       {NULL, 0}};
  lua_createtable(L, 0, 24);
  for (int i = 0; codes[i].name; i++) {
    lua_pushinteger(L, codes[i].code);
    lua_setfield(L, -2, codes[i].name);
  }
  lua_setfield(L, -2, "errno");
  lua_setfield(L, -2, "net");
}
