/*
** lchan.c: ums.channel and ums.select for the tasks of one run, in C.
**
** Values pass by reference, as Lua values do, and never through a table
** on the way: a parked sender leaves its value on its own Lua stack, where
** the receiver copies it from; a receiver that parks gets the value pushed
** onto its stack by the sender, above its waiting frame, where its
** continuation finds it. Both threads belong to one VM, whose one
** scheduler thread runs them all, so this is plain single-threaded
** API use (the way lua_resume's arguments are pushed onto a coroutine).
**
** Their parks are local (UMS_PARK_LOCAL): the waiters' tokens stay in the
** queues of this VM, whose thread alone ends them, so the runtime ends
** them without a lock.
**
** A waker unparks before it moves a value: a failed unpark means that park
** already ended (timed out, cancelled, another case of its select won), so
** the waiter is stale and is dropped. After a successful unpark the woken
** task is runnable but cannot run before the waker parks or ends, so the
** value it is handed, or the one it offered, is sure to be where it looks.
**
** Channel state: a ring of `size` slots (the userdata's user value, a
** table) holding `count` values from slot `head`; recvq holds receivers
** (only while the buffer is empty), sendq holds senders (only while it is
** full). A value taken from a full buffer is replaced by the first parked
** sender's, so the order of sends is kept across buffer and parked senders.
**
** The channel Lua code holds is a table, like ums.mutex and the other sync.lua
** objects: [1] is its state (a full userdata, lchan), and send and recv are its
** own fields; the other methods come from the metatable's __index. That is for
** the method call: ch:send(v) on a userdata goes through its metatable
** (luaV_finishget: __index found in the metatable, then the method in __index,
** two hash lookups outside the VM's inline path), on a table with the method as
** its own field it is one hash lookup inline in the VM. A message is one send
** and one receive, so the lookups are a sizeable share of a message's cost. The
** own send and recv are C closures whose upvalues are the state: they read it
** without looking [1] up or checking it, only comparing self with the table the
** state belongs to (another channel as self is served as the metatable's
** methods serve it), and the closure, on the stack while the call waits,
** anchors the state. They are made by the channel's BIND_AFTER-th send or recv
** through the metatable, not by ums.channel: two closures more per channel cost
** more than a channel used for a message or two (a reply channel per request)
** spends on lookups. The metatable's methods replace self on their stack with
** the state (chan_open), which anchors it the same way, whatever the table's
** [1] is changed to.
*/
#include "lums.h"
#include "lpark.h"
#include "lvm.h"

#include <math.h>
#include <string.h>

#define CHAN_MT "ums.channel"
/* The channel metatable is kept under this address too (for creation). */
static const char chan_mt_key = 0;
/* Every channel starts with this address: telling a channel from other
** values costs a type check, a size check and one compare, where
** luaL_checkudata looks the metatable up in the registry by name on every
** call. Only C code that copies a channel's bytes
** could forge it; Lua code cannot. */
static const char chan_tag = 0;

enum { GRANTED = 0, CLOSED = 1 };
/* What an operation that does not park found. */
enum { DONE, WOULD_BLOCK, IS_CLOSED };

typedef struct lchan {
  const char *tag;       /* &chan_tag */
  const void *self;      /* the channel table: what tostring shows, and
                            what waits on it report (ums.waits) */
  unsigned unbound;      /* sends and recvs through the metatable, up to
                            BIND_AFTER (then its own are bound) */
  lwaitq recvq, sendq;   /* parked receivers / senders, FIFO */
  lua_Integer size;      /* buffer slots; 0: unbuffered */
  lua_Integer head;      /* slot of the oldest buffered value (1-based) */
  lua_Integer count;     /* values in the buffer */
  bool closed;
} lchan;

/* ---------------------------------------------------------------------- */
/* Wait queues                                                             */
/* ---------------------------------------------------------------------- */

/* Copies the value at index idx of L onto the stack of waiter r; with
** vtop, the value is at the top of L and is moved (popped) instead. A
** plain receive (kase 0) parked in l_recv, whose frame uses one of the
** LUA_MINSTACK slots a C function is guaranteed, so it has room; a
** select may have used them all. */
static void give(lua_State *L, int idx, bool vtop, lwait *r) {
  if (r->kase != 0) lua_checkstack(r->L, 1);
  if (!vtop) lua_pushvalue(L, idx);
  lua_xmove(L, r->L, 1);
}

/* Pushes onto L the value parked sender s offered. A plain send (kase 0)
** parked in l_send with its value on top of its stack, where nothing
** reads it once the send is granted (send_k): it is moved. */
static void take(lwait *s, lua_State *L) {
  if (s->kase == 0) {
    lua_xmove(s->L, L, 1);
    return;
  }
  lua_checkstack(s->L, 1);
  lua_pushvalue(s->L, s->vidx);
  lua_xmove(s->L, L, 1);
}

/* ---------------------------------------------------------------------- */
/* Telling a channel                                                       */
/* ---------------------------------------------------------------------- */

/* If the value at idx is a channel (a table whose [1] is a channel
** state), pushes its state userdata and returns it; else NULL, nothing
** pushed. */
static lchan *push_state(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TTABLE) return NULL;
  lua_rawgeti(L, idx, 1);
  /* lua_rawlen is 0 for anything but a full userdata (or a string or a
  ** table, which lua_touserdata answers NULL for). */
  lchan *ch = (lchan *)lua_touserdata(L, -1);
  if (!ch || lua_rawlen(L, -1) != sizeof *ch || ch->tag != &chan_tag) {
    lua_pop(L, 1);
    return NULL;
  }
  return ch;
}

/* The state of the channel at idx, or NULL; the stack is left as is. */
static lchan *to_chan(lua_State *L, int idx) {
  lchan *ch = push_state(L, idx);
  if (ch) lua_pop(L, 1);
  return ch;
}

/* If the value at (absolute) idx is a channel, replaces it with its state
** userdata, which every function below works on (its buffer is the
** userdata's user value) and which the stack slot then anchors, and
** returns the state; else NULL. */
static lchan *chan_open(lua_State *L, int idx) {
  lchan *ch = push_state(L, idx);
  if (ch) lua_replace(L, idx);
  return ch;
}

/* chan_open for self (idx 1) of method fname, raising if it is no
** channel. */
static lchan *check_chan(lua_State *L, int idx, const char *fname) {
  lchan *ch = chan_open(L, idx);
  if (!ch) lums_typeerr(L, idx, fname, CHAN_MT);
  return ch;
}

/* ---------------------------------------------------------------------- */
/* Moving values without parking                                           */
/* ---------------------------------------------------------------------- */

/* Appends the value on top of L to ch's buffer (popped); the buffer
** table is at index buf. */
static void buf_push(lua_State *L, lchan *ch, int buf) {
  lua_Integer slot = (ch->head + ch->count - 1) % ch->size + 1;
  lua_rawseti(L, buf, slot);
  ch->count++;
}

/* Sends the value at index v of L (ch at index chi) without parking.
** With vtop, v is the top of L, and a value handed to a parked receiver
** is moved off L's stack rather than copied. */
/* The handoff to a parked receiver, if there is one: ch open, nothing
** buffered (receivers wait only on an empty buffer). Inline: the bound
** send's fast path is this. */
static inline bool send_to_waiter(lua_State *L, lchan *ch, int v,
                                  bool vtop) {
  lwait *r = lums_q_wake(&ch->recvq, GRANTED);
  if (r) give(L, v, vtop, r);
  return r != NULL;
}

/* The handoff from a parked sender of an unbuffered or empty channel, if
** there is one: its value is pushed on L. Inline: the bound recv's fast
** path is this. */
static inline bool recv_from_waiter(lua_State *L, lchan *ch) {
  lwait *s = lums_q_wake(&ch->sendq, GRANTED);
  if (s) take(s, L);
  return s != NULL;
}

static int send_now(lua_State *L, lchan *ch, int chi, int v, bool vtop) {
  if (ch->closed) return IS_CLOSED;
  if (send_to_waiter(L, ch, v, vtop)) return DONE;
  if (ch->count < ch->size) {
    lua_getiuservalue(L, chi, 1);
    lua_pushvalue(L, v);
    buf_push(L, ch, lua_gettop(L) - 1);
    lua_pop(L, 1);
    return DONE;
  }
  return WOULD_BLOCK;
}

/* Receives without parking: on DONE the value is pushed on L. */
static int recv_now(lua_State *L, lchan *ch, int chi) {
  if (ch->count > 0) {
    lua_getiuservalue(L, chi, 1);
    int buf = lua_gettop(L);
    lua_rawgeti(L, buf, ch->head);
    lua_pushnil(L);
    lua_rawseti(L, buf, ch->head);
    ch->head = ch->head % ch->size + 1;
    ch->count--;
    /* A slot came free: the first parked sender's value moves in behind
    ** the others. */
    lwait *s = lums_q_wake(&ch->sendq, GRANTED);
    if (s) {
      take(s, L);
      buf_push(L, ch, buf);
    }
    lua_remove(L, buf);
    return DONE;
  }
  if (recv_from_waiter(L, ch)) return DONE;
  return ch->closed ? IS_CLOSED : WOULD_BLOCK;
}

static int push_closed(lua_State *L) {
  lua_pushnil(L);
  lua_pushliteral(L, "closed");
  return 2;
}

static int push_timeout(lua_State *L) {
  lua_pushnil(L);
  lua_pushliteral(L, "timeout");
  return 2;
}

/* Queues the current task's own waiter on q of ch and parks: the common
** tail of send and recv; type says which (UMS_WAIT_CHAN_*). */
static int park_on(lua_State *L, ltask *me, lchan *ch, lwaitq *q, int type,
                   int64_t deadline, int vidx, lua_KFunction k) {
  lwait *w = lums_q_park_begin(L, me, q, deadline, UMS_PARK_LOCAL, type,
                               ch->self, 0);
  w->L = L;
  w->vidx = vidx;
  return lums_park_finish(L, me, 0, k);
}

/* The park of the current task's own waiter ended: returns the outcome
** (>= 0), or raises core.CANCELLED / returns -1 on timeout, with the
** waiter off its queue either way. */
static int wait_outcome(lua_State *L) {
  int r = ums_park_result();
  if (r >= 0) return r;
  lums_q_unlink(&lums_cur_task->wait);
  if (r == UMS_ECANCELED) lums_raise_cancelled(L);
  return -1;
}

/* ---------------------------------------------------------------------- */
/* Channel methods                                                         */
/* ---------------------------------------------------------------------- */

static int l_bound_send(lua_State *L);
static int l_bound_recv(lua_State *L);

/* core.channel([size [, opts]]); opts {shared = true} makes a channel
** every VM of a run may use instead (lshared.c). */
static int l_channel(lua_State *L) {
  lua_Integer size = 0;
  if (!lua_isnoneornil(L, 2)) {
    if (!lua_istable(L, 2)) lums_typeerr(L, 2, "channel", "table");
    bool shared = false;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
      if (lua_type(L, -2) != LUA_TSTRING ||
          strcmp(lua_tostring(L, -2), "shared") != 0)
        lums_argerr(L, 2, "channel",
                    lua_pushfstring(L, "unknown option '%s'",
                                    luaL_tolstring(L, -2, NULL)));
      if (!lua_isboolean(L, -1))
        lums_argerr(L, 2, "channel",
                    lua_pushfstring(L, "option 'shared' must be "
                                    "a boolean, got %s",
                                    lums_typename(L, -1)));
      shared = lua_toboolean(L, -1);
      lua_pop(L, 1);
    }
    if (shared) {
      lua_settop(L, 1);
      return lums_shared_channel(L);
    }
  }
  if (!lua_isnoneornil(L, 1)) {
    int isint;
    size = lua_tointegerx(L, 1, &isint);
    if (!isint) {
      if (lua_type(L, 1) != LUA_TNUMBER)
        lums_typeerr(L, 1, "channel", "number");
      lums_argerr(L, 1, "channel", "number has no integer representation");
    }
    if (size < 0) lums_argerr(L, 1, "channel", "size must not be negative");
  }
  lua_settop(L, 0);
  lua_createtable(L, 1, 0);  /* the channel: [1] (send and recv later) */
  lchan *ch = (lchan *)lua_newuserdatauv(L, sizeof *ch, 1);
  memset(ch, 0, sizeof *ch);
  ch->tag = &chan_tag;
  ch->self = lua_topointer(L, 1);
  ch->size = size;
  ch->head = 1;
  if (size > 0) {
    lua_createtable(L, size < 64 ? (int)size : 64, 0);
    lua_setiuservalue(L, -2, 1);
  }
  lua_rawseti(L, 1, 1);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &chan_mt_key);
  lua_setmetatable(L, 1);
  return 1;
}

static int send_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  int r = wait_outcome(L);
  if (r < 0) return push_timeout(L);
  if (r == CLOSED) return push_closed(L);
  lua_pushboolean(L, 1);
  return 1;
}

/* ch:send(v [, timeout]) -> true | nil, "timeout" | nil, "closed", on
** the channel state ch, whose userdata is at index chi (its buffer is its
** user value). */
static __attribute__((noinline)) int send_on(lua_State *L, lchan *ch,
                                             int chi) {
  /* No timeout (the usual call) needs no look at argument 3. */
  bool poll = false;
  int64_t deadline = UMS_FOREVER;
  int top = lua_gettop(L);
  if (top != 2) {
    if (top > 2) deadline = lums_opt_timeout(L, 3, "send", &poll);
    lua_settop(L, 2);
  }
  int st = send_now(L, ch, chi, 2, true);
  if (st == DONE) {
    lua_pushboolean(L, 1);
    return 1;
  }
  if (st == IS_CLOSED) return push_closed(L);
  if (poll) return push_timeout(L);
  ltask *me = lums_need_task(L, "channel:send");
  return park_on(L, me, ch, &ch->sendq, UMS_WAIT_CHAN_SEND, deadline, 2,
                 send_k);
}

static int recv_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  (void)ctx;
  int r = wait_outcome(L);
  if (r < 0) return push_timeout(L);
  if (r == CLOSED) return push_closed(L);
  return 1;  /* the sender pushed the value on top */
}

/* ch:recv([timeout]) -> v | nil, "timeout" | nil, "closed"; ch and chi
** as for send_on. */
static __attribute__((noinline)) int recv_on(lua_State *L, lchan *ch,
                                             int chi) {
  bool poll = false;
  int64_t deadline = UMS_FOREVER;
  if (lua_gettop(L) != 1) {
    deadline = lums_opt_timeout(L, 2, "recv", &poll);
    lua_settop(L, 1);
  }
  int st = recv_now(L, ch, chi);
  if (st == DONE) return 1;
  if (st == IS_CLOSED) return push_closed(L);
  if (poll) return push_timeout(L);
  ltask *me = lums_need_task(L, "channel:recv");
  return park_on(L, me, ch, &ch->recvq, UMS_WAIT_CHAN_RECV, deadline, 0,
                 recv_k);
}

/* Sends and receives through the metatable after which a channel's own
** send and recv are bound. */
#define BIND_AFTER 4

/* Sets field name of the channel table at 1 to f bound to ch, whose
** userdata is on top: upvalue 1 its address, upvalue 2 the userdata. */
static void bind_method(lua_State *L, lchan *ch, const char *name,
                        lua_CFunction f) {
  int st = lua_gettop(L);
  lua_pushstring(L, name);
  lua_pushlightuserdata(L, ch);
  lua_pushvalue(L, st);
  lua_pushcclosure(L, f, 2);
  lua_rawset(L, 1);
}

/* check_chan for the metatable's send and recv (fname): the channel's
** BIND_AFTER-th makes its own send and recv, bound to its state, when
** self is the table the state was made for. */
static lchan *check_chan_bind(lua_State *L, const char *fname) {
  lchan *ch = push_state(L, 1);  /* the state, on top */
  if (!ch) lums_typeerr(L, 1, fname, CHAN_MT);
  if (ch->unbound < BIND_AFTER && ++ch->unbound == BIND_AFTER &&
      lua_topointer(L, 1) == ch->self) {
    bind_method(L, ch, "send", l_bound_send);
    bind_method(L, ch, "recv", l_bound_recv);
  }
  lua_replace(L, 1);
  return ch;
}

/* The metatable's send and recv, for any channel. */
static int l_send(lua_State *L) {
  LUMS_YIELD_POINT(L, l_send);
  return send_on(L, check_chan_bind(L, "send"), 1);
}

static int l_recv(lua_State *L) {
  LUMS_YIELD_POINT(L, l_recv);
  return recv_on(L, check_chan_bind(L, "recv"), 1);
}

/* ch.send and ch.recv, the channel table's own fields once bound: the
** state is the closure's upvalue 2, which the closure, on the stack while
** it runs and waits, anchors; upvalue 1 is the state's address as a light
** userdata, which lua_touserdata reads in fewer instructions than a full
** userdata's (no block offset to work out). Another channel as self
** (a.send(b, v)) is served as the metatable's send serves it.
**
** Each handles the call that completes at once with a parked partner
** (every other call of two tasks passing messages) itself, and leaves
** the rest to send_on and recv_on, kept out of line: in one function
** the other ways' registers are saved and restored on every call. */
static __attribute__((noinline)) int bound_other(lua_State *L, lchan *ch,
                                                 bool send) {
  if (lua_topointer(L, 1) != ch->self) {
    ch = check_chan(L, 1, send ? "send" : "recv");
    return send ? send_on(L, ch, 1) : recv_on(L, ch, 1);
  }
  return send ? send_on(L, ch, lua_upvalueindex(2))
              : recv_on(L, ch, lua_upvalueindex(2));
}

/* The waits of a bound send and recv without timeout that found nothing
** to take or give (and the channel open). */
static __attribute__((noinline)) int bound_send_park(lua_State *L,
                                                     lchan *ch) {
  ltask *me = lums_need_task(L, "channel:send");
  return park_on(L, me, ch, &ch->sendq, UMS_WAIT_CHAN_SEND, UMS_FOREVER, 2,
                 send_k);
}

static __attribute__((noinline)) int bound_recv_park(lua_State *L,
                                                     lchan *ch) {
  ltask *me = lums_need_task(L, "channel:recv");
  return park_on(L, me, ch, &ch->recvq, UMS_WAIT_CHAN_RECV, UMS_FOREVER, 0,
                 recv_k);
}

static int l_bound_send(lua_State *L) {
  LUMS_YIELD_POINT(L, l_bound_send);
  lchan *ch = (lchan *)lua_touserdata(L, lua_upvalueindex(1));
  if (__builtin_expect(lua_topointer(L, 1) != ch->self ||
                       lua_gettop(L) != 2, 0))
    return bound_other(L, ch, true);
  if (!ch->closed) {
    if (send_to_waiter(L, ch, 2, true)) {
      lua_pushboolean(L, 1);
      return 1;
    }
    if (ch->count == ch->size) return bound_send_park(L, ch);
  }
  return send_on(L, ch, lua_upvalueindex(2));
}

static int l_bound_recv(lua_State *L) {
  LUMS_YIELD_POINT(L, l_bound_recv);
  lchan *ch = (lchan *)lua_touserdata(L, lua_upvalueindex(1));
  if (__builtin_expect(lua_topointer(L, 1) != ch->self ||
                       lua_gettop(L) != 1, 0))
    return bound_other(L, ch, false);
  if (ch->count == 0) {
    if (recv_from_waiter(L, ch)) return 1;
    if (!ch->closed) return bound_recv_park(L, ch);
  }
  return recv_on(L, ch, lua_upvalueindex(2));
}

/* ch:try_send(v) -> true | false, "full" | false, "closed" */
static int l_try_send(lua_State *L) {
  lchan *ch = check_chan(L, 1, "try_send");
  lua_settop(L, 2);
  int st = send_now(L, ch, 1, 2, true);
  lua_pushboolean(L, st == DONE);
  if (st == DONE) return 1;
  if (st == IS_CLOSED)
    lua_pushliteral(L, "closed");
  else
    lua_pushliteral(L, "full");
  return 2;
}

/* ch:try_recv() -> true, v | false, nil, "empty" | false, nil, "closed" */
static int l_try_recv(lua_State *L) {
  lchan *ch = check_chan(L, 1, "try_recv");
  lua_settop(L, 1);
  int st = recv_now(L, ch, 1);
  if (st == DONE) {
    lua_pushboolean(L, 1);
    lua_insert(L, -2);
    return 2;
  }
  lua_pushboolean(L, 0);
  lua_pushnil(L);
  if (st == IS_CLOSED)
    lua_pushliteral(L, "closed");
  else
    lua_pushliteral(L, "empty");
  return 3;
}

/* ch:close() -> true | nil, "closed". Parked receivers and senders get
** nil, "closed"; values already buffered can still be received. */
static int l_close(lua_State *L) {
  lchan *ch = check_chan(L, 1, "close");
  if (ch->closed) return push_closed(L);
  ch->closed = true;
  lums_q_wake_all(&ch->recvq, CLOSED);
  lums_q_wake_all(&ch->sendq, CLOSED);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_len(lua_State *L) {
  lua_pushinteger(L, check_chan(L, 1, "len")->count);
  return 1;
}

static int l_cap(lua_State *L) {
  lua_pushinteger(L, check_chan(L, 1, "cap")->size);
  return 1;
}

static int l_closed(lua_State *L) {
  lua_pushboolean(L, check_chan(L, 1, "closed")->closed);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* select                                                                  */
/* ---------------------------------------------------------------------- */

/* Stack of a select that parks: 1 cases, 2 timeout, 3 the waiters (a
** userdata of n lwait), then for each case i its channel (anchoring it
** while a waiter is on its queue) and, for a send, its value. */
enum { SEL_WAITERS = 3 };

/* Checks case i of the cases table at index `cases`: pushes the case
** table and returns its operation, "recv" or "send"; *ch is its channel. */
static const char *case_op(lua_State *L, int cases, int i, lchan **ch) {
  if (lua_rawgeti(L, cases, i) != LUA_TTABLE)
    lums_argerr(L, 1, "select",
                lua_pushfstring(L, "case %d: table expected, got %s", i,
                                lums_typename(L, -1)));
  lua_rawgeti(L, -1, 1);
  *ch = to_chan(L, -1);
  if (!*ch)
    lums_argerr(L, 1, "select",
                lua_pushfstring(L, "case %d: " CHAN_MT " expected, got %s",
                                i, lums_typename(L, -1)));
  lua_pop(L, 1);
  lua_rawgeti(L, -1, 2);
  const char *op = NULL;
  if (lua_type(L, -1) == LUA_TSTRING) {
    const char *s = lua_tostring(L, -1);
    if (strcmp(s, "recv") == 0)
      op = "recv";
    else if (strcmp(s, "send") == 0)
      op = "send";
  }
  if (!op) {
    if (lua_type(L, -1) == LUA_TSTRING)
      lums_argerr(L, 1, "select", lua_pushfstring(
          L, "case %d: operation must be \"recv\" or \"send\", got \"%s\"",
          i, lua_tostring(L, -1)));
    lums_argerr(L, 1, "select", lua_pushfstring(
        L, "case %d: operation must be \"recv\" or \"send\", got %s", i,
        lums_typename(L, -1)));
  }
  lua_pop(L, 1);
  return op;  /* the case table stays on the stack */
}

static int select_k(lua_State *L, int status, lua_KContext ctx) {
  int n = (int)ctx;
  (void)status;
  lwait *ws = (lwait *)lua_touserdata(L, SEL_WAITERS);
  for (int i = 0; i < n; i++) lums_q_unlink(&ws[i]);
  int r = ums_park_result();
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (r < 0) return push_timeout(L);
  int i = r / 2;
  if (r % 2 == CLOSED) {
    lua_pushinteger(L, i);
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 3;
  }
  if (ws[i - 1].vidx == 0) {  /* a receive: the value is on top */
    lua_pushinteger(L, i);
    lua_insert(L, -2);
    return 2;
  }
  lua_pushinteger(L, i);
  return 1;
}

/* core.select(cases [, timeout]): waits until one of the cases can
** proceed and performs exactly that one; when several are ready, the
** first in array order wins.
** cases: array of {ch, "recv"} and {ch, "send", v}.
** -> i, v (case i received v) | i (case i sent) |
**    i, nil, "closed" (case i's channel is closed) | nil, "timeout" */
static int l_select(lua_State *L) {
  LUMS_YIELD_POINT(L, l_select);
  if (!lua_istable(L, 1)) lums_typeerr(L, 1, "select", "table");
  lua_Integer len = luaL_len(L, 1);
  if (len <= 0) lums_argerr(L, 1, "select", "no cases");
  if (len > 100000)
    lums_argerr(L, 1, "select", "too many cases (at most 100000)");
  int n = (int)len;
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "select", &poll);
  lua_settop(L, 2);
  /* Check every case before doing any. */
  for (int i = 1; i <= n; i++) {
    lchan *ch;
    case_op(L, 1, i, &ch);
    lua_pop(L, 1);
  }
  for (int i = 1; i <= n; i++) {
    lchan *ch;
    const char *op = case_op(L, 1, i, &ch);
    int c = lua_gettop(L);
    lua_rawgeti(L, c, 1);  /* the channel, at c + 1 */
    chan_open(L, c + 1);   /* its state there (case_op checked it) */
    int st;
    if (op[0] == 'r') {
      st = recv_now(L, ch, c + 1);
      if (st == DONE) {
        lua_pushinteger(L, i);
        lua_insert(L, -2);
        return 2;
      }
    } else {
      lua_rawgeti(L, c, 3);  /* the value, at c + 2 */
      st = send_now(L, ch, c + 1, c + 2, false);
      if (st == DONE) {
        lua_pushinteger(L, i);
        return 1;
      }
    }
    if (st == IS_CLOSED) {
      lua_pushinteger(L, i);
      lua_pushnil(L);
      lua_pushliteral(L, "closed");
      return 3;
    }
    lua_settop(L, 2);
  }
  if (poll) return push_timeout(L);
  ltask *me = lums_need_task(L, "select");
  luaL_checkstack(L, 2 * n + 4, "too many cases");
  lwait *ws = (lwait *)lua_newuserdatauv(L, (size_t)n * sizeof *ws, 0);
  memset(ws, 0, (size_t)n * sizeof *ws);
  ums_park_token_t tok;
  lums_park_begin_wait(L, me, deadline, UMS_PARK_LOCAL, UMS_WAIT_SELECT, NULL,
                       0, &tok);
  for (int i = 1; i <= n; i++) {
    lchan *ch;
    const char *op = case_op(L, 1, i, &ch);
    lwait *w = &ws[i - 1];
    w->task = me;
    w->tok = tok;
    w->L = L;
    w->kase = i;
    lua_rawgeti(L, -1, 1);  /* anchor the channel's state */
    chan_open(L, lua_gettop(L));
    if (op[0] == 'r') {
      lua_remove(L, -2);
      w->vidx = 0;
      lums_q_push(&ch->recvq, w);
    } else {
      lua_rawgeti(L, -2, 3);
      lua_remove(L, -3);
      w->vidx = lua_gettop(L);
      lums_q_push(&ch->sendq, w);
    }
  }
  return lums_park_finish(L, me, (lua_KContext)n, select_k);
}

/* core.channel_queues(ch) -> receivers, senders queued (stale included):
** lets specs check that waits which ended without a grant leave nothing
** behind. */
static int l_channel_queues(lua_State *L) {
  lchan *ch = check_chan(L, 1, "channel_queues");
  lua_pushinteger(L, lums_q_len(&ch->recvq));
  lua_pushinteger(L, lums_q_len(&ch->sendq));
  return 2;
}

void lums_open_chan(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"send", l_send},         {"recv", l_recv},
      {"try_send", l_try_send}, {"try_recv", l_try_recv},
      {"close", l_close},       {"len", l_len},
      {"cap", l_cap},           {"closed", l_closed},
      {NULL, NULL}};
  if (luaL_newmetatable(L, CHAN_MT)) {
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
  }
  lua_rawsetp(L, LUA_REGISTRYINDEX, &chan_mt_key);
  lua_pushcfunction(L, l_channel);
  lua_setfield(L, -2, "channel");
  lua_pushcfunction(L, l_select);
  lua_setfield(L, -2, "select");
  lua_pushcfunction(L, l_channel_queues);
  lua_setfield(L, -2, "channel_queues");
}
