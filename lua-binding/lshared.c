/*
** lshared.c: objects that every VM of a run may use: ums.shared.channel,
** mutex, semaphore, event and waitgroup (also made by the plain
** constructors with {shared = true}: init.lua).
**
** An object is a C struct (struct lshared first) with an atomic reference
** count and a mutex over its state; nothing in it is a Lua value. Each VM
** that has the object holds one proxy userdata for it, and the proxy holds
** one reference (lproxy.c). Objects
** travel between VMs inside copied values (lcopy.c), which hold a
** reference of their own while in flight. Channel values are copied too:
** the sender encodes into an lmsg, the receiver decodes it into its VM,
** and the runtime's channel moves them (the channel's section).
**
** The mutex, semaphore, event and wait group are the runtime's objects
** (sync.c) behind the reference count, waited on with their park-based
** forms (ums.h: _begin, then _end in the continuation): their waiters,
** Lua's and C's alike, are on the runtime object's one queue. A work
** request's join (lwork.c) waits on a runtime event the same way.
**
** A channel's waits are the runtime channel's own (chan.c): a task that
** must wait begins its park on the channel's queue with the park-based
** forms (ums_chan_send_begin/_recv_begin), and yields (or blocks its
** worker where Lua cannot yield) until the other side ends it.
**
** Lock order: an object's lock, then the runtime's task locks inside
** ums_unpark and ums_park_begin, or (a wait group) the lock of its
** runtime event. No two shared objects' locks are ever held at once.
*/
#include "lvm.h"
#include "lpark.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Outcomes of a wait on a shared object. */
enum { GRANTED = 0, CLOSED = 1 };

/* ---------------------------------------------------------------------- */
/* Waiters                                                                 */
/* ---------------------------------------------------------------------- */

/* The current task for a wait that must park, or raises (after
** releasing o's lock and freeing msg) outside tasks. */
static ltask *wait_task(lua_State *L, lshared *o, const char *fname,
                        lmsg *msg) {
  ltask *me = lums_cur_task;
  if (!me || !me->vmrun) {
    pthread_mutex_unlock(&o->lock);
    lcopy_free(msg);
    lums_need_task(L, fname);
  }
  return me;
}

static int push_timeout(lua_State *L) {
  lua_pushnil(L);
  lua_pushliteral(L, "timeout");
  return 2;
}

static int push_closed(lua_State *L) {
  lua_pushnil(L);
  lua_pushliteral(L, "closed");
  return 2;
}

/* Returns what a wait that ended with outcome r gives back when granted
** means `true`: raises on cancellation. */
static int push_wait_result(lua_State *L, int r) {
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (r < 0) return push_timeout(L);
  lua_pushboolean(L, 1);
  return 1;
}

static int64_t check_count(lua_State *L, int idx, const char *fname) {
  int isint;
  lua_Integer n = lua_tointegerx(L, idx, &isint);
  if (!isint) {
    if (lua_type(L, idx) != LUA_TNUMBER) lums_typeerr(L, idx, fname, "number");
    lums_argerr(L, idx, fname, "number has no integer representation");
  }
  return (int64_t)n;
}


/* ---------------------------------------------------------------------- */
/* Channel                                                                 */
/* ---------------------------------------------------------------------- */

/*
** A shared channel is the runtime's channel (runtime/src/chan.c, where
** its protocol is described) of encoded values: the sender encodes into
** an lmsg, the runtime moves it (lcopy_move: a short value sits inline
** and the message points at it), the receiver decodes it into its VM.
** Here are only the encoding, the parks of the calling task and the Lua
** results. A send or receive first tries without waiting; one that must
** wait goes through the runtime's park-based calls, with what the other
** side may touch while the task is parked (the value of a send, the
** destination of an unbuffered receive) in memory of its own, since the
** C stack does not survive the yield.
*/

static void msg_move(void *dst, void *src) { lcopy_move(dst, src); }
static void msg_clear(void *m) { lcopy_clear(m); }
static const ums_chan_ops_t msg_ops = {msg_move, msg_clear};

typedef struct schan {
  lshared h;
  ums_chan_t *ch;        /* [const] */
  bool buffered;         /* [const] */
} schan;

static void chan_destroy(lshared *o) {
  schan *c = (schan *)o;
  /* The last reference: nobody waits, and the values still inside are
  ** cleared by msg_clear. */
  ums_chan_delete(c->ch);
  free(c);
}

static const luaL_Reg chan_methods[];
static const lshared_kind chan_kind = {"ums.shared.channel", chan_destroy,
                                       chan_methods};

static schan *check_chan(lua_State *L, const char *fname) {
  return (schan *)lshared_check(L, 1, &chan_kind, fname);
}

int lums_shared_channel(lua_State *L) {
  lua_Integer size = 0;
  if (!lua_isnoneornil(L, 1)) {
    size = check_count(L, 1, "channel");
    if (size < 0) lums_argerr(L, 1, "channel", "size must not be negative");
    if (size > (lua_Integer)(SIZE_MAX / sizeof(lmsg) / 2))
      lums_argerr(L, 1, "channel", "size too large");
  }
  ums_chan_t *ch = ums_chan_new_ex(sizeof(lmsg), (size_t)size, &msg_ops);
  if (!ch) luaL_error(L, "ums: out of memory");
  schan *c = lshared_new(L, sizeof *c, &chan_kind);
  c->ch = ch;
  c->buffered = size > 0;
  return 1;
}

/* Encodes the value at idx for a send into m (the caller's memory), or
** raises "bad argument ... to 'fname' (value.path: what)". */
static void encode_value(lua_State *L, int idx, const char *fname, lmsg *m) {
  if (lcopy_encode_scalars(L, idx, 1, m)) return;
  char err[256];
  int bad;
  lmsg *h = lcopy_encode(L, idx, 1, "value", false, err, sizeof err, &bad);
  if (!h) lums_argerr(L, idx, fname, err);
  lcopy_move(m, h);
  free(h);
}

/* Pushes what a wait that ended with r (not 0) gives back: nil,
** "closed" or nil, "timeout"; raises on cancellation, outside a task
** (fname) and when the wait could not begin. */
static int push_failed(lua_State *L, int r, const char *fname) {
  switch (r) {
    case UMS_ECLOSED: return push_closed(L);
    case UMS_ETIMEDOUT: return push_timeout(L);
    case UMS_ECANCELED: return lums_raise_cancelled(L);
    case UMS_EPERM: lums_need_task(L, fname); return 0;
    default: return luaL_error(L, "ums: cannot wait: %s", ums_strerror(r));
  }
}

/* Stack of a send that waits: 1 the channel, 2 the value, 3 the
** deadline. ctx is the heap message (ours until the send succeeds). */
static int send_k(lua_State *L, int status, lua_KContext ctx);

/* Finishes a send whose _begin or _end returned r: parks again while it
** returns 1, where Lua cannot yield by looping here rather than from
** inside send_k (which would grow the C stack a level per lost race). */
static int send_after(lua_State *L, schan *c, lmsg *h, int r) {
  while (r == 1) {
    ltask *me = lums_cur_task;
    if (lums_can_yield(L, me))
      return lums_park_finish(L, me, (lua_KContext)h, send_k);
    lums_park_block_wait(me);
    r = ums_chan_send_end(c->ch, h, (int64_t)lua_tointeger(L, 3), NULL);
  }
  if (r == 0) {
    free(h); /* its value moved into the channel */
    lua_pushboolean(L, 1);
    return 1;
  }
  lcopy_free(h);
  return push_failed(L, r, "channel:send");
}

static int send_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  schan *c = (schan *)lshared_test(L, 1);
  lmsg *h = (lmsg *)ctx;
  int r = ums_chan_send_end(c->ch, h, (int64_t)lua_tointeger(L, 3), NULL);
  return send_after(L, c, h, r);
}

/* ch:send(v [, timeout]) -> true | nil, "timeout" | nil, "closed" */
static int chan_send(lua_State *L) {
  LUMS_YIELD_POINT(L, chan_send);
  schan *c = check_chan(L, "send");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 3, "send", &poll);
  lua_settop(L, 2);
  lmsg m;
  encode_value(L, 2, "send", &m);
  int r = ums_chan_try_send(c->ch, &m);
  if (r == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  if (r != UMS_EAGAIN || poll) {
    lcopy_clear(&m);
    return r == UMS_EAGAIN ? push_timeout(L) : push_failed(L, r, "send");
  }
  lmsg *h = malloc(sizeof *h);
  if (!h) {
    lcopy_clear(&m);
    return luaL_error(L, "ums: out of memory");
  }
  lcopy_move(h, &m);
  lua_pushinteger(L, (lua_Integer)deadline);
  r = ums_chan_send_begin(c->ch, h, deadline, NULL);
  return send_after(L, c, h, r);
}

/* Stack of a receive that waits: 1 the channel, 2 the deadline. ctx is
** the heap destination of an unbuffered channel's receive, NULL for a
** buffered one (whose parked receivers are told to look again, so its
** destination is only touched inside the calls). */
static int recv_k(lua_State *L, int status, lua_KContext ctx);

/* Finishes a receive whose _begin or _end returned r into dst (h, or
** the caller's stack for a buffered channel). */
static int recv_after(lua_State *L, schan *c, lmsg *h, lmsg *dst,
                      int r) {
  while (r == 1) {
    ltask *me = lums_cur_task;
    if (lums_can_yield(L, me))
      return lums_park_finish(L, me, (lua_KContext)h, recv_k);
    lums_park_block_wait(me);
    r = ums_chan_recv_end(c->ch, dst, (int64_t)lua_tointeger(L, 2), NULL);
  }
  if (r == 0) {
    if (h) return lcopy_decode_free(L, h);
    return lcopy_decode_clear(L, dst);
  }
  free(h); /* holds nothing: no value moved in */
  return push_failed(L, r, "channel:recv");
}

static int recv_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  schan *c = (schan *)lshared_test(L, 1);
  lmsg *h = (lmsg *)ctx, m;
  lmsg *dst = h ? h : &m;
  int r = ums_chan_recv_end(c->ch, dst, (int64_t)lua_tointeger(L, 2), NULL);
  return recv_after(L, c, h, dst, r);
}

/* ch:recv([timeout]) -> v | nil, "timeout" | nil, "closed" */
static int chan_recv(lua_State *L) {
  LUMS_YIELD_POINT(L, chan_recv);
  schan *c = check_chan(L, "recv");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "recv", &poll);
  lua_settop(L, 1);
  lmsg m;
  if (poll) {
    int r = ums_chan_try_recv(c->ch, &m);
    if (r == 0) return lcopy_decode_clear(L, &m);
    return r == UMS_EAGAIN ? push_timeout(L) : push_failed(L, r, "recv");
  }
  /* An unbuffered channel's sender moves its value into a parked
  ** receiver's destination, which must outlive the yield. */
  lmsg *h = NULL;
  if (!c->buffered && !(h = malloc(sizeof *h)))
    return luaL_error(L, "ums: out of memory");
  lmsg *dst = h ? h : &m;
  lua_pushinteger(L, (lua_Integer)deadline);
  int r = ums_chan_recv_begin(c->ch, dst, deadline, NULL);
  return recv_after(L, c, h, dst, r);
}

/* ch:try_send(v) -> true | false, "full" | false, "closed" */
static int chan_try_send(lua_State *L) {
  schan *c = check_chan(L, "try_send");
  lua_settop(L, 2);
  lmsg m;
  encode_value(L, 2, "try_send", &m);
  int r = ums_chan_try_send(c->ch, &m);
  if (r != 0) lcopy_clear(&m);
  lua_pushboolean(L, r == 0);
  if (r == 0) return 1;
  if (r == UMS_ECLOSED)
    lua_pushliteral(L, "closed");
  else
    lua_pushliteral(L, "full");
  return 2;
}

/* ch:try_recv() -> true, v | false, nil, "empty" | false, nil, "closed" */
static int chan_try_recv(lua_State *L) {
  schan *c = check_chan(L, "try_recv");
  lua_settop(L, 1);
  lmsg m;
  int r = ums_chan_try_recv(c->ch, &m);
  if (r == 0) {
    lua_pushboolean(L, 1);
    lcopy_decode_clear(L, &m);
    return 2;
  }
  lua_pushboolean(L, 0);
  lua_pushnil(L);
  if (r == UMS_ECLOSED)
    lua_pushliteral(L, "closed");
  else
    lua_pushliteral(L, "empty");
  return 3;
}

/* ch:close() -> true | nil, "closed". Parked receivers and senders get
** nil, "closed" (receivers of a buffered channel once it is drained);
** values already sent can still be received. */
static int chan_close(lua_State *L) {
  schan *c = check_chan(L, "close");
  if (ums_chan_close(c->ch) != 0) return push_closed(L);
  lua_pushboolean(L, 1);
  return 1;
}

static int chan_len(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)ums_chan_len(check_chan(L, "len")->ch));
  return 1;
}

static int chan_cap(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)ums_chan_cap(check_chan(L, "cap")->ch));
  return 1;
}

static int chan_closed(lua_State *L) {
  lua_pushboolean(L, ums_chan_closed(check_chan(L, "closed")->ch));
  return 1;
}

static const luaL_Reg chan_methods[] = {
    {"send", chan_send},         {"recv", chan_recv},
    {"try_send", chan_try_send}, {"try_recv", chan_try_recv},
    {"close", chan_close},       {"len", chan_len},
    {"cap", chan_cap},           {"closed", chan_closed},
    {NULL, NULL}};

/* ---------------------------------------------------------------------- */
/* Mutex, semaphore, event and wait group: the runtime's objects          */
/* ---------------------------------------------------------------------- */

/* Each is a runtime object (ums.h, "Synchronisation") behind the shared
** object's reference count: a task of any VM waits on it with its
** park-based form, in the one FIFO queue of that object, and Lua's
** outcomes are the runtime's. */

/* After a park-based _begin (r): 0 taken at once, 1 a park begun (the
** task yields, or blocks where Lua cannot yield, and k calls the _end
** half), else the wait is over without a park. */
static int begun(lua_State *L, int r, ltask *me, lua_KContext ctx,
                 lua_KFunction k) {
  if (r == 1) return lums_park_finish(L, me, ctx, k);
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (r == UMS_ETIMEDOUT) return push_timeout(L);
  if (r != 0) return luaL_error(L, "ums: cannot wait: %s", ums_strerror(r));
  lua_pushboolean(L, 1);
  return 1;
}

/* The deadline a park-based _begin takes for a Lua timeout: a poll is a
** deadline that has passed. */
static int64_t begin_deadline(int64_t deadline, bool poll) {
  return poll ? 0 : deadline;
}

/* FIFO, not recursive, owned by a task (of any VM); unlock hands it to
** the first waiter, so nobody barges in. A task that ends holding it
** leaves it locked, as in C. */
typedef struct smutex {
  lshared h;
  ums_mutex_t *m;        /* [const] */
} smutex;

static const luaL_Reg mutex_methods[];
static void mutex_destroy(lshared *o) {
  /* No task waits: each would hold a reference. */
  ums_mutex_delete_held(((smutex *)o)->m);
  free(o);
}
static const lshared_kind mutex_kind = {"ums.shared.mutex", mutex_destroy,
                                        mutex_methods};

static int mutex_new(lua_State *L) {
  smutex *m = lshared_new(L, sizeof(smutex), &mutex_kind);
  if (!(m->m = ums_mutex_new())) return luaL_error(L, "ums: out of memory");
  return 1;
}

static int mutex_lock_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  /* Granted means unlock made us the owner. */
  return push_wait_result(L, ums_mutex_lock_end((ums_mutex_t *)ctx));
}

/* m:lock([timeout]) -> true | nil, "timeout" | nil, msg (already ours) */
static int mutex_lock(lua_State *L) {
  LUMS_YIELD_POINT(L, mutex_lock);
  smutex *m = (smutex *)lshared_check(L, 1, &mutex_kind, "lock");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "lock", &poll);
  ltask *me = lums_need_task(L, "mutex:lock");
  int r = ums_mutex_lock_begin(m->m, begin_deadline(deadline, poll));
  if (r == UMS_EDEADLK) {
    lua_pushnil(L);
    lua_pushliteral(L, "would deadlock: the mutex is already locked by this "
                       "task");
    return 2;
  }
  return begun(L, r, me, (lua_KContext)m->m, mutex_lock_k);
}

/* m:trylock() -> true | false */
static int mutex_trylock(lua_State *L) {
  smutex *m = (smutex *)lshared_check(L, 1, &mutex_kind, "trylock");
  lums_need_task(L, "mutex:trylock");
  lua_pushboolean(L, ums_mutex_trylock(m->m) == 0);
  return 1;
}

/* m:unlock() -> true; raises unless the calling task holds it. */
static int mutex_unlock(lua_State *L) {
  smutex *m = (smutex *)lshared_check(L, 1, &mutex_kind, "unlock");
  lums_need_task(L, "mutex:unlock");
  if (ums_mutex_unlock(m->m) != 0)
    return luaL_error(L, ums_mutex_is_locked(m->m) == 1
                             ? "ums.mutex:unlock: the mutex is locked by "
                               "another task"
                             : "ums.mutex:unlock: the mutex is not locked");
  lua_pushboolean(L, 1);
  return 1;
}

static const luaL_Reg mutex_methods[] = {{"lock", mutex_lock},
                                         {"trylock", mutex_trylock},
                                         {"unlock", mutex_unlock},
                                         {NULL, NULL}};

/* Release hands units straight to waiters, FIFO: a positive count means
** nobody is waiting. */
typedef struct ssem {
  lshared h;
  ums_sem_t *s;          /* [const] */
} ssem;

static const luaL_Reg sem_methods[];
static void sem_destroy(lshared *o) {
  ums_sem_delete(((ssem *)o)->s);
  free(o);
}
static const lshared_kind sem_kind = {"ums.shared.semaphore", sem_destroy,
                                      sem_methods};

static int sem_new(lua_State *L) {
  int64_t n = check_count(L, 1, "semaphore");
  if (n < 0)
    lums_argerr(L, 1, "semaphore", "initial value must not be negative");
  ssem *s = lshared_new(L, sizeof(ssem), &sem_kind);
  if (!(s->s = ums_sem_new(n))) return luaL_error(L, "ums: out of memory");
  return 1;
}

static int sem_acquire_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return push_wait_result(L, ums_sem_acquire_end((ums_sem_t *)ctx));
}

/* s:acquire([timeout]) -> true | nil, "timeout" */
static int sem_acquire(lua_State *L) {
  LUMS_YIELD_POINT(L, sem_acquire);
  ssem *s = (ssem *)lshared_check(L, 1, &sem_kind, "acquire");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "acquire", &poll);
  if (ums_sem_tryacquire(s->s) == 0) {
    lua_pushboolean(L, 1);
    return 1;
  }
  if (poll) return push_timeout(L);
  ltask *me = lums_need_task(L, "semaphore:acquire");
  int r = ums_sem_acquire_begin(s->s, deadline);
  return begun(L, r, me, (lua_KContext)s->s, sem_acquire_k);
}

/* s:release([n]) -> true | nil, msg (the value would overflow) */
static int sem_release(lua_State *L) {
  ssem *s = (ssem *)lshared_check(L, 1, &sem_kind, "release");
  int64_t n = 1;
  if (!lua_isnoneornil(L, 2)) {
    n = check_count(L, 2, "release");
    if (n < 1) lums_argerr(L, 2, "release", "count must be positive");
  }
  if (ums_sem_release(s->s, n) == UMS_ERANGE) {
    lua_pushnil(L);
    lua_pushliteral(L, "semaphore value out of range");
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int sem_value(lua_State *L) {
  ssem *s = (ssem *)lshared_check(L, 1, &sem_kind, "value");
  lua_pushinteger(L, (lua_Integer)ums_sem_value(s->s));
  return 1;
}

static const luaL_Reg sem_methods[] = {{"acquire", sem_acquire},
                                       {"release", sem_release},
                                       {"value", sem_value},
                                       {NULL, NULL}};

/* Manual reset: set wakes every waiter and stays set until reset. Auto
** reset: set wakes one waiter, or stays set until one wait consumes it. */
typedef struct sevent {
  lshared h;
  ums_event_t *e;        /* [const] */
} sevent;

static const luaL_Reg event_methods[];
static void event_destroy(lshared *o) {
  ums_event_delete(((sevent *)o)->e);
  free(o);
}
static const lshared_kind event_kind = {"ums.shared.event", event_destroy,
                                        event_methods};

static int event_new(lua_State *L) {
  if (!lua_isnoneornil(L, 1) && !lua_isboolean(L, 1))
    lums_typeerr(L, 1, "event", "boolean");
  bool manual = lua_toboolean(L, 1);
  sevent *e = lshared_new(L, sizeof(sevent), &event_kind);
  if (!(e->e = ums_event_new(manual, 0)))
    return luaL_error(L, "ums: out of memory");
  return 1;
}

static int event_set(lua_State *L) {
  sevent *e = (sevent *)lshared_check(L, 1, &event_kind, "set");
  ums_event_set(e->e);
  lua_pushboolean(L, 1);
  return 1;
}

static int event_reset(lua_State *L) {
  sevent *e = (sevent *)lshared_check(L, 1, &event_kind, "reset");
  ums_event_reset(e->e);
  lua_pushboolean(L, 1);
  return 1;
}

static int event_is_set(lua_State *L) {
  sevent *e = (sevent *)lshared_check(L, 1, &event_kind, "is_set");
  lua_pushboolean(L, ums_event_is_set(e->e) == 1);
  return 1;
}

static int event_wait_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return push_wait_result(L, ums_event_wait_end((ums_event_t *)ctx));
}

/* e:wait([timeout]) -> true | nil, "timeout" */
static int event_wait(lua_State *L) {
  LUMS_YIELD_POINT(L, event_wait);
  sevent *e = (sevent *)lshared_check(L, 1, &event_kind, "wait");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "wait", &poll);
  ltask *me = lums_cur_task;
  bool task = me && me->vmrun;
  /* Outside a task only a set event or a poll has an answer. */
  int r = ums_event_wait_begin(e->e, task ? begin_deadline(deadline, poll)
                                          : 0);
  if (r == UMS_ETIMEDOUT && !task && !poll) lums_need_task(L, "event:wait");
  return begun(L, r, me, (lua_KContext)e->e, event_wait_k);
}

static const luaL_Reg event_methods[] = {{"set", event_set},
                                         {"reset", event_reset},
                                         {"is_set", event_is_set},
                                         {"wait", event_wait},
                                         {NULL, NULL}};

/* A counter and a manual-reset event that is set exactly while the
** counter is 0: a wait is a wait on the event. Both change together
** under h.lock, and a wait begins under it too (lock order: h.lock, then
** the event's), so no wait begins on a stale event. */
typedef struct swg {
  lshared h;
  int64_t count;         /* [h.lock] */
  ums_event_t *zero;     /* [const] set iff count == 0 (under h.lock) */
} swg;

static const luaL_Reg wg_methods[];
static void wg_destroy(lshared *o) {
  ums_event_delete(((swg *)o)->zero);
  free(o);
}
static const lshared_kind wg_kind = {"ums.shared.waitgroup", wg_destroy,
                                     wg_methods};

static int wg_new(lua_State *L) {
  swg *g = lshared_new(L, sizeof(swg), &wg_kind);
  if (!(g->zero = ums_event_new(1, 1)))
    return luaL_error(L, "ums: out of memory");
  return 1;
}

static int wg_change(lua_State *L, swg *g, int64_t n, const char *fname) {
  pthread_mutex_lock(&g->h.lock);
  int64_t c = g->count;
  bool bad = n < 0 ? c + n < 0 : c > INT64_MAX - n;
  if (!bad && n != 0) {
    g->count = c + n;
    if (g->count == 0)
      ums_event_set(g->zero);
    else if (c == 0)
      ums_event_reset(g->zero);
  }
  pthread_mutex_unlock(&g->h.lock);
  if (bad)
    return luaL_error(L, "ums.waitgroup:%s: the counter would become %s",
                      fname, n < 0 ? "negative" : "too large");
  lua_pushboolean(L, 1);
  return 1;
}

static int wg_add(lua_State *L) {
  swg *g = (swg *)lshared_check(L, 1, &wg_kind, "add");
  return wg_change(L, g, check_count(L, 2, "add"), "add");
}

static int wg_done(lua_State *L) {
  swg *g = (swg *)lshared_check(L, 1, &wg_kind, "done");
  return wg_change(L, g, -1, "done");
}

static int wg_wait_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return push_wait_result(L, ums_event_wait_end((ums_event_t *)ctx));
}

/* g:wait([timeout]) -> true | nil, "timeout" */
static int wg_wait(lua_State *L) {
  LUMS_YIELD_POINT(L, wg_wait);
  swg *g = (swg *)lshared_check(L, 1, &wg_kind, "wait");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "wait", &poll);
  pthread_mutex_lock(&g->h.lock);
  if (g->count == 0) {
    pthread_mutex_unlock(&g->h.lock);
    lua_pushboolean(L, 1);
    return 1;
  }
  if (poll) {
    pthread_mutex_unlock(&g->h.lock);
    return push_timeout(L);
  }
  ltask *me = wait_task(L, &g->h, "waitgroup:wait", NULL);
  int r = ums_event_wait_begin_as(g->zero, deadline, UMS_WAIT_WAITGROUP, g);
  pthread_mutex_unlock(&g->h.lock);
  return begun(L, r, me, (lua_KContext)g->zero, wg_wait_k);
}

static int wg_count(lua_State *L) {
  swg *g = (swg *)lshared_check(L, 1, &wg_kind, "count");
  pthread_mutex_lock(&g->h.lock);
  int64_t c = g->count;
  pthread_mutex_unlock(&g->h.lock);
  lua_pushinteger(L, (lua_Integer)c);
  return 1;
}

static const luaL_Reg wg_methods[] = {{"add", wg_add},
                                      {"done", wg_done},
                                      {"wait", wg_wait},
                                      {"count", wg_count},
                                      {NULL, NULL}};

/* ---------------------------------------------------------------------- */
/* Registration                                                            */
/* ---------------------------------------------------------------------- */

/* Adds `shared` (the constructors) to the module table at the top, and
** the proxy metatables and cache (lproxy.c) to this VM's registry. */
void lums_open_shared(lua_State *L) {
  static const luaL_Reg ctors[] = {{"channel", lums_shared_channel},
                                   {"mutex", mutex_new},
                                   {"semaphore", sem_new},
                                   {"event", event_new},
                                   {"waitgroup", wg_new},
                                   {NULL, NULL}};
  lshared_open_proxies(L);
  lshared_register(L, &chan_kind);
  lshared_register(L, &mutex_kind);
  lshared_register(L, &sem_kind);
  lshared_register(L, &event_kind);
  lshared_register(L, &wg_kind);
  luaL_newlib(L, ctors);
  lua_setfield(L, -2, "shared");
}
