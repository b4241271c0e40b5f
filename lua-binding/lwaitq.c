/*
** lwaitq.c: core.waitq, the lwaitq of lwaitq.h as a Lua value, for the
** standard library's objects written in Lua (ums.sync's mutex,
** semaphore, event, condition variable and wait group; ums.group;
** ums.workqueue). Each waiter is its task's own lwait (ltask.wait), so a
** wait allocates nothing, and the protocol is lwaitq.h's.
*/
#include "lwaitq.h"
#include "lpark.h"

/* Every waitq userdata starts with this address: a check cheaper than
** luaL_checkudata's metatable look-up, on the path of every wait. */
static const char waitq_tag = 0;

#define WAITQ_MT "ums.waitq"

typedef struct lwaitq_ud {
  const char *tag;       /* &waitq_tag */
  lwaitq q;              /* its waiters; the userdata owns the queue, and
                            a queued task keeps the userdata alive (its
                            wait's frame holds it) */
} lwaitq_ud;

static lwaitq *check_waitq(lua_State *L, const char *fname) {
  lwaitq_ud *u = (lwaitq_ud *)lua_touserdata(L, 1);
  if (!u || lua_rawlen(L, 1) != sizeof *u || u->tag != &waitq_tag)
    lums_typeerr(L, 1, fname, WAITQ_MT);
  return &u->q;
}

/* An outcome argument at idx (default 0), as core.unpark takes it. */
static int check_outcome(lua_State *L, int idx, const char *fname) {
  lua_Integer o = luaL_optinteger(L, idx, 0);
  if (o < 0 || o > 0x7fffffff)
    lums_argerr(L, idx, fname, "outcome must be a non-negative integer");
  return (int)o;
}

/* core.waitq() -> q */
static int l_waitq(lua_State *L) {
  lwaitq_ud *u = (lwaitq_ud *)lua_newuserdatauv(L, sizeof *u, 0);
  u->tag = &waitq_tag;
  ums_list_init(&u->q.list);
  luaL_setmetatable(L, WAITQ_MT);
  return 1;
}

/* Begins the current task's park, described by the arguments from 2 on
** as core.park_begin's (timeout, nocancel, wait type, object, blocker),
** and queues its waiter on q: raises core.CANCELLED, with nothing
** queued, if the task was cancelled. */
static ltask *wait_begin(lua_State *L, lwaitq *q, const char *fname) {
  ltask *me = lums_need_task(L, fname);
  if (me->park.begun)
    return luaL_error(L, "ums.%s: a park is already in progress", fname),
           NULL;
  /* Local (UMS_PARK_LOCAL), as a channel's or a join's: a waitq is a
  ** value of this VM, so every waker of its queue is a task of this VM,
  ** running on this VM's scheduler thread. */
  lpark_args a = lums_check_park_args(L, 2);
  lums_q_park_begin(L, me, q, a.deadline, a.flags | UMS_PARK_LOCAL, a.type,
                    a.object, a.blocker);
  return me;
}

/* The end of a queued wait: the outcome a waker gave, or nil, "timeout";
** on a timeout or a cancellation the waiter leaves its queue first. */
static int wait_k(lua_State *L, int status, lua_KContext ctx) {
  int r = ums_park_result();
  (void)status;
  (void)ctx;
  if (r < 0) lums_q_unlink(&lums_cur_task->wait);
  return lums_push_park_result(L, r);
}

/* core.waitq_wait(q [, timeout [, nocancel [, wait_type [, object
** [, blocker]]]]]) -> outcome | nil, "timeout" */
static int l_waitq_wait(lua_State *L) {
  ltask *me = wait_begin(L, check_waitq(L, "waitq_wait"), "waitq_wait");
  return lums_park_finish(L, me, 0, wait_k);
}

/* core.waitq_wait_begin(q, ...): waitq_wait's first half, for a caller
** that has something to do once it is queued and before it parks (a
** condition wait gives up its mutex there); core.waitq_wait_end() is the
** second. Nothing may yield between the two. */
static int l_waitq_wait_begin(lua_State *L) {
  wait_begin(L, check_waitq(L, "waitq_wait_begin"), "waitq_wait_begin");
  return 0;
}

static int l_waitq_wait_end(lua_State *L) {
  ltask *me = lums_need_task(L, "waitq_wait_end");
  if (!me->park.begun)
    return luaL_error(L, "ums.waitq_wait_end: no wait begun (call "
                         "core.waitq_wait_begin first)");
  return lums_park_finish(L, me, 0, wait_k);
}

/* core.waitq_wake(q [, outcome]) -> task | nil: ends the park of the
** first live waiter with outcome (default 0) and returns its task. */
static int l_waitq_wake(lua_State *L) {
  lwaitq *q = check_waitq(L, "waitq_wake");
  int outcome = check_outcome(L, 2, "waitq_wake");
  lwait *w = lums_q_wake(q, outcome);
  if (w)
    lums_push_handle(L, w->task);
  else
    lua_pushnil(L);
  return 1;
}

/* core.waitq_wake_all(q [, outcome]) -> n: the number of tasks woken. */
static int l_waitq_wake_all(lua_State *L) {
  lwaitq *q = check_waitq(L, "waitq_wake_all");
  int outcome = check_outcome(L, 2, "waitq_wake_all");
  lua_pushinteger(L, lums_q_wake_all(q, outcome));
  return 1;
}

/* core.waitq_len(q) -> n: waiters queued, stale ones included (for specs
** that check what waits leave behind). */
static int l_waitq_len(lua_State *L) {
  lua_pushinteger(L, lums_q_len(check_waitq(L, "waitq_len")));
  return 1;
}

void lums_open_waitq(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"waitq", l_waitq},
      {"waitq_wait", l_waitq_wait},
      {"waitq_wait_begin", l_waitq_wait_begin},
      {"waitq_wait_end", l_waitq_wait_end},
      {"waitq_wake", l_waitq_wake},
      {"waitq_wake_all", l_waitq_wake_all},
      {"waitq_len", l_waitq_len},
      {NULL, NULL}};
  luaL_newmetatable(L, WAITQ_MT);
  lua_pop(L, 1);
  luaL_setfuncs(L, funcs, 0);
}
