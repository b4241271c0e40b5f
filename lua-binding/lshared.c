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
** the sender encodes into an lmsg, the receiver decodes it into its VM.
**
** Waits. A task that must wait allocates an lswait, begins its park and
** queues the waiter, all under the object's lock, then yields (or blocks
** its worker where Lua cannot yield) through lums_park_finish, with the
** waiter as the continuation's context. A waker, under the same lock,
** takes waiters off the queue and ends their parks with ums_unpark, which
** puts a task of another scheduler on that scheduler's completion list;
** an unpark that fails means that park already ended (timeout, cancel),
** and the waker drops that waiter and tries the next. The woken task's
** continuation takes the lock once more to leave the queue (if a timeout
** ended its park, it is still on it) and to take what it was handed. The
** lock orders every access to a waiter between the two threads, and the
** park protocol (exactly one of unpark, timeout and cancel wins) decides
** the outcome.
**
** Lock order: an object's lock, then the runtime's task locks inside
** ums_unpark and ums_park_begin. No two object locks are ever held at
** once.
*/
#define _GNU_SOURCE /* clock_gettime */
#include "lvm.h"
#include "lpark.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Outcomes of a wait on a shared object. */
enum { GRANTED = 0, CLOSED = 1 };

/* ---------------------------------------------------------------------- */
/* Waiters                                                                 */
/* ---------------------------------------------------------------------- */

static void q_push(lswaitq *q, lswait *w) {
  w->q = q;
  w->next = NULL;
  w->prev = q->tail;
  if (q->tail)
    q->tail->next = w;
  else
    q->head = w;
  q->tail = w;
}

static void q_unlink(lswait *w) {
  lswaitq *q = w->q;
  if (!q) return;
  if (w->prev)
    w->prev->next = w->next;
  else
    q->head = w->next;
  if (w->next)
    w->next->prev = w->prev;
  else
    q->tail = w->prev;
  w->q = NULL;
  w->prev = w->next = NULL;
}

/* What a wait on o is, for ums.tasks() and ums.waits(): a send is the
** only wait that carries a message. */
static int wait_type(const lshared *o, bool sending) {
  static const struct { const char *kind; int type; } types[] = {
      {"ums.shared.mutex", UMS_WAIT_MUTEX},
      {"ums.shared.semaphore", UMS_WAIT_SEMAPHORE},
      {"ums.shared.event", UMS_WAIT_EVENT},
      {"ums.shared.waitgroup", UMS_WAIT_WAITGROUP},
      {"ums.work", UMS_WAIT_JOIN}};
  if (strcmp(o->kind->name, "ums.shared.channel") == 0)
    return sending ? UMS_WAIT_CHAN_SEND : UMS_WAIT_CHAN_RECV;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (strcmp(o->kind->name, types[i].kind) == 0) return types[i].type;
  return UMS_WAIT_PARK;
}

/* Besides the lock, a failed wait_begin gives up msg (freed). */
static lswait *wait_begin_msg(lua_State *L, ltask *me, lshared *o,
                              lswaitq *q, int64_t deadline, lmsg *msg) {
  lswait *w = malloc(sizeof *w);
  int rc = w ? lums_park_try_begin_wait(me, deadline, 0,
                                        wait_type(o, msg != NULL), o,
                                        &w->tok)
             : UMS_ENOMEM;
  if (rc) {
    pthread_mutex_unlock(&o->lock);
    free(w);
    lcopy_free(msg);
    if (rc == UMS_ECANCELED) lums_raise_cancelled(L);
    luaL_error(L, "ums: cannot wait: %s", ums_strerror(rc));
  }
  w->obj = o;
  w->rt = me->run->rt;
  w->task = ums_self();
  w->msg = msg;
  q_push(q, w);
  return w;
}

lswait *lshared_wait_begin(lua_State *L, ltask *me, lshared *o, lswaitq *q,
                           int64_t deadline) {
  return wait_begin_msg(L, me, o, q, deadline, NULL);
}

int lshared_wait_end(lswait *w, lmsg **msg) {
  lshared *o = w->obj;
  pthread_mutex_lock(&o->lock);
  q_unlink(w);
  lmsg *m = w->msg;
  w->msg = NULL;
  pthread_mutex_unlock(&o->lock);
  int r = ums_park_result();
  free(w);
  if (msg)
    *msg = m;
  else
    lcopy_free(m);
  return r;
}

lswait *lshared_grant(lswaitq *q, int outcome, lmsg *msg) {
  lswait *w;
  while ((w = q->head) != NULL) {
    q_unlink(w);
    if (msg) w->msg = msg;
    if (ums_unpark(w->rt, w->tok, outcome) == 0) return w;
    if (msg) w->msg = NULL;
  }
  return NULL;
}

void lshared_grant_all(lswaitq *q, int outcome) {
  while (lshared_grant(q, outcome, NULL)) {
  }
}

/* The current task for a wait that must park, or raises (after
** releasing o's lock and freeing msg) outside tasks. */
static ltask *wait_task(lua_State *L, lshared *o, const char *fname,
                        lmsg *msg) {
  ltask *me = lums_cur_task;
  if (!me || !me->run) {
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

static int simple_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return push_wait_result(L, lshared_wait_end((lswait *)ctx, NULL));
}

/* With o locked: queues the current task on q and parks; the wait
** returns true when granted, nil, "timeout" or raises CANCELLED. */
static int park_simple(lua_State *L, lshared *o, lswaitq *q,
                       int64_t deadline, const char *fname) {
  ltask *me = wait_task(L, o, fname, NULL);
  lswait *w = lshared_wait_begin(L, me, o, q, deadline);
  pthread_mutex_unlock(&o->lock);
  return lums_park_finish(L, me, (lua_KContext)w, simple_k);
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

/* A ring of `nslots` encoded values holding `count` (at most `cap`) from
** `head`; recvq holds receivers (only while the ring is empty), sendq
** senders with their value in their waiter (only while it is full). A
** value taken from a full ring is replaced by the first parked sender's,
** which keeps the order of sends. The ring grows by doubling as values
** arrive, up to `cap`: a capacity is a bound, not a reservation, as for
** the plain channel's buffer table. */
typedef struct schan {
  lshared h;
  lswaitq recvq, sendq;  /* [h.lock] */
  lmsg **ring;           /* [h.lock] */
  size_t nslots;         /* [h.lock] slots in ring, at most cap */
  size_t cap;            /* [const] */
  size_t head;           /* [h.lock] */
  _Atomic size_t count;  /* [h.lock] to write; any thread may read it to
                            spin on (spin_for) */
  bool closed;           /* [h.lock] */
  _Atomic int32_t spin_misses; /* [atomic] how the spins fare (spin_for) */
  _Atomic uint32_t spin_skips; /* [atomic] */
  _Atomic int send_sched;      /* [atomic] the scheduler of the latest
                                  sender, -1 before the first */
  _Atomic int recv_sched;      /* [atomic] the same for receivers */
} schan;

/* Remembers the caller's scheduler as the latest of one side: a spin
** pays only when the other side runs on another scheduler. Written only
** when it changes, so a steady stream does not dirty the line. */
static inline void note_side(_Atomic int *side) {
  int me = ums_current_sched();
  if (atomic_load_explicit(side, memory_order_relaxed) != me)
    atomic_store_explicit(side, me, memory_order_relaxed);
}

static inline size_t count_of(schan *c) {
  return atomic_load_explicit(&c->count, memory_order_relaxed);
}

static inline void count_set(schan *c, size_t n) {
  atomic_store_explicit(&c->count, n, memory_order_relaxed);
}

static void chan_destroy(lshared *o) {
  schan *c = (schan *)o;
  for (size_t i = 0; i < count_of(c); i++)
    lcopy_free(c->ring[(c->head + i) % c->nslots]);
  free(c->ring);
  free(c);
}

static const luaL_Reg chan_methods[];
static const lshared_kind chan_kind = {"ums.shared.channel", chan_destroy,
                                       chan_methods};

static schan *check_chan(lua_State *L, const char *fname) {
  return (schan *)lshared_check(L, 1, &chan_kind, fname);
}

/* Encodes the value at idx for a send, or raises "bad argument ... to
** 'fname' (value.path: what)". */
static lmsg *encode_value(lua_State *L, int idx, const char *fname) {
  char err[256];
  int bad;
  lmsg *m = lcopy_encode(L, idx, 1, "value", false, err, sizeof err, &bad);
  if (!m) lums_argerr(L, idx, fname, err);
  return m;
}

static void ring_push(schan *c, lmsg *m) {
  size_t n = count_of(c);
  c->ring[(c->head + n) % c->nslots] = m;
  count_set(c, n + 1);
}

static lmsg *ring_pop(schan *c) {
  lmsg *m = c->ring[c->head];
  c->head = (c->head + 1) % c->nslots;
  count_set(c, count_of(c) - 1);
  return m;
}

/* Makes room for one more value in a ring that is full but below cap.
** With the lock held; false when memory runs out. */
static bool ring_grow(schan *c) {
  size_t n = c->nslots < 4 ? 4 : c->nslots;
  if (n > c->cap / 2) n = c->cap;
  else n *= 2;
  lmsg **ring = malloc(n * sizeof *ring);
  if (!ring) return false;
  for (size_t i = 0; i < count_of(c); i++)
    ring[i] = c->ring[(c->head + i) % c->nslots];
  free(c->ring);
  c->ring = ring;
  c->nslots = n;
  c->head = 0;
  return true;
}

/* Takes the value of the first parked sender whose park has not ended,
** ending that park. NULL if there is none. */
static lmsg *take_sender(schan *c) {
  lswait *s;
  while ((s = c->sendq.head) != NULL) {
    q_unlink(s);
    if (ums_unpark(s->rt, s->tok, GRANTED) == 0) {
      lmsg *m = s->msg;
      s->msg = NULL;
      return m;
    }
  }
  return NULL;
}

/* Without parking: hands m to a waiting receiver or the ring. With the
** lock held; false if it would block (m is still the caller's). */
static bool send_now(schan *c, lmsg *m) {
  if (lshared_grant(&c->recvq, GRANTED, m)) return true;
  /* Without memory to grow the ring the channel acts as if it were full:
  ** the sender parks (or try_send fails) until a receiver makes room,
  ** which keeps every value and the order of sends. */
  size_t n = count_of(c);
  if (n < c->cap && (n < c->nslots || ring_grow(c))) {
    ring_push(c, m);
    return true;
  }
  return false;
}

/* Without parking: the next value, or NULL. With the lock held. */
static lmsg *recv_now(schan *c) {
  if (count_of(c) > 0) {
    lmsg *m = ring_pop(c);
    lmsg *s = take_sender(c);
    if (s) ring_push(c, s);
    return m;
  }
  return take_sender(c);
}

/* How long a task spins, outside the lock, for a buffered channel to
** get a value (or room) before it parks. A task of another scheduler
** filling (or draining) the buffer answers within a message's cost; a
** park and its unpark cost several, and a wake-up per message besides,
** so a receiver a little faster than its sender would park for every
** value. The spin is far shorter than what a task runs between two
** waits anyway. Only for a peer that last ran on another scheduler (one
** on this scheduler cannot run meanwhile), and each channel keeps a
** score of misses: when spins stop paying (the other side is slow),
** tasks park at once and spin again only every SPIN_PROBE-th time. */
#define SPIN_NS 3000
#define SPIN_PROBE 32
#define SPIN_MISS_MAX 8

/* A bound on the spin besides the clock. */
#define SPIN_MAX_LOOPS 100000

/* Real time: ums_now is virtual time in a run with a virtual clock, which
** does not move while a task spins. */
static int64_t real_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* With c unlocked: spins until the ring holds a value (want_room false)
** or has room, up to SPIN_NS. Returns whether it saw that; the caller
** then takes the lock and tries again. */
static bool spin_for(schan *c, bool want_room) {
  int peer = atomic_load_explicit(want_room ? &c->recv_sched : &c->send_sched,
                                  memory_order_relaxed);
  if (peer < 0 || peer == ums_current_sched()) return false;
  if (atomic_load_explicit(&c->spin_misses, memory_order_relaxed) >=
      SPIN_MISS_MAX) {
    if (atomic_fetch_add_explicit(&c->spin_skips, 1, memory_order_relaxed) %
            SPIN_PROBE != 0)
      return false;
  }
  int64_t until = real_now() + SPIN_NS;
  bool seen = false;
  for (unsigned i = 1; i <= SPIN_MAX_LOOPS; i++) {
    size_t n = count_of(c);
    if (want_room ? n < c->cap : n > 0) {
      seen = true;
      break;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
    if ((i & 31) == 0 && real_now() >= until) break;
  }
  int32_t misses =
      atomic_load_explicit(&c->spin_misses, memory_order_relaxed);
  misses = seen ? (misses > 0 ? misses - 1 : 0)
                : (misses < 2 * SPIN_MISS_MAX ? misses + 2 : misses);
  atomic_store_explicit(&c->spin_misses, misses, memory_order_relaxed);
  return seen;
}

int lums_shared_channel(lua_State *L) {
  lua_Integer size = 0;
  if (!lua_isnoneornil(L, 1)) {
    size = check_count(L, 1, "channel");
    if (size < 0) lums_argerr(L, 1, "channel", "size must not be negative");
    if (size > (lua_Integer)(SIZE_MAX / sizeof(lmsg *) / 2))
      lums_argerr(L, 1, "channel", "size too large");
  }
  schan *c = lshared_new(L, sizeof *c, &chan_kind);
  /* The ring is allocated by the first buffered send. */
  c->cap = (size_t)size;
  atomic_init(&c->send_sched, -1);
  atomic_init(&c->recv_sched, -1);
  return 1;
}

static int send_k(lua_State *L, int status, lua_KContext ctx) {
  lmsg *m;
  (void)status;
  int r = lshared_wait_end((lswait *)ctx, &m);
  lcopy_free(m);  /* not taken: the send did not happen */
  if (r == CLOSED) return push_closed(L);
  return push_wait_result(L, r);
}

/* ch:send(v [, timeout]) -> true | nil, "timeout" | nil, "closed" */
static int chan_send(lua_State *L) {
  LUMS_YIELD_POINT(L, chan_send);
  schan *c = check_chan(L, "send");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 3, "send", &poll);
  lua_settop(L, 2);
  lmsg *m = encode_value(L, 2, "send");
  if (c->cap > 0) note_side(&c->send_sched);
  for (bool spun = false;; spun = true) {
    pthread_mutex_lock(&c->h.lock);
    if (c->closed) {
      pthread_mutex_unlock(&c->h.lock);
      lcopy_free(m);
      return push_closed(L);
    }
    if (send_now(c, m)) {
      pthread_mutex_unlock(&c->h.lock);
      lua_pushboolean(L, 1);
      return 1;
    }
    /* Full: a receiver elsewhere may make room in a moment. Whatever the
    ** spin saw, the state is looked at again under the lock: while it was
    ** released, receivers may have emptied the ring and parked. */
    if (spun || poll || c->cap == 0 || c->sendq.head) break;
    pthread_mutex_unlock(&c->h.lock);
    spin_for(c, true);
  }
  if (poll) {
    pthread_mutex_unlock(&c->h.lock);
    lcopy_free(m);
    return push_timeout(L);
  }
  ltask *me = wait_task(L, &c->h, "channel:send", m);
  lswait *w = wait_begin_msg(L, me, &c->h, &c->sendq, deadline, m);
  pthread_mutex_unlock(&c->h.lock);
  return lums_park_finish(L, me, (lua_KContext)w, send_k);
}

static int recv_k(lua_State *L, int status, lua_KContext ctx) {
  lmsg *m;
  (void)status;
  int r = lshared_wait_end((lswait *)ctx, &m);
  if (r == GRANTED && m) return lcopy_decode_free(L, m);
  lcopy_free(m);
  if (r == CLOSED) return push_closed(L);
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  return push_timeout(L);
}

/* ch:recv([timeout]) -> v | nil, "timeout" | nil, "closed" */
static int chan_recv(lua_State *L) {
  LUMS_YIELD_POINT(L, chan_recv);
  schan *c = check_chan(L, "recv");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "recv", &poll);
  lua_settop(L, 1);
  if (c->cap > 0) note_side(&c->recv_sched);
  pthread_mutex_lock(&c->h.lock);
  lmsg *m = recv_now(c);
  /* Empty: a sender elsewhere may fill it in a moment. */
  if (!m && !poll && !c->closed && c->cap > 0 && !c->recvq.head) {
    pthread_mutex_unlock(&c->h.lock);
    spin_for(c, false);
    pthread_mutex_lock(&c->h.lock);
    m = recv_now(c);
  }
  if (m) {
    pthread_mutex_unlock(&c->h.lock);
    return lcopy_decode_free(L, m);
  }
  if (c->closed) {
    pthread_mutex_unlock(&c->h.lock);
    return push_closed(L);
  }
  if (poll) {
    pthread_mutex_unlock(&c->h.lock);
    return push_timeout(L);
  }
  ltask *me = wait_task(L, &c->h, "channel:recv", NULL);
  lswait *w = lshared_wait_begin(L, me, &c->h, &c->recvq, deadline);
  pthread_mutex_unlock(&c->h.lock);
  return lums_park_finish(L, me, (lua_KContext)w, recv_k);
}

/* ch:try_send(v) -> true | false, "full" | false, "closed" */
static int chan_try_send(lua_State *L) {
  schan *c = check_chan(L, "try_send");
  lua_settop(L, 2);
  lmsg *m = encode_value(L, 2, "try_send");
  pthread_mutex_lock(&c->h.lock);
  bool closed = c->closed, sent = !closed && send_now(c, m);
  pthread_mutex_unlock(&c->h.lock);
  lua_pushboolean(L, sent);
  if (sent) return 1;
  lcopy_free(m);
  if (closed)
    lua_pushliteral(L, "closed");
  else
    lua_pushliteral(L, "full");
  return 2;
}

/* ch:try_recv() -> true, v | false, nil, "empty" | false, nil, "closed" */
static int chan_try_recv(lua_State *L) {
  schan *c = check_chan(L, "try_recv");
  lua_settop(L, 1);
  pthread_mutex_lock(&c->h.lock);
  lmsg *m = recv_now(c);
  bool closed = c->closed;
  pthread_mutex_unlock(&c->h.lock);
  if (m) {
    lua_pushboolean(L, 1);
    lcopy_decode_free(L, m);
    return 2;
  }
  lua_pushboolean(L, 0);
  lua_pushnil(L);
  if (closed)
    lua_pushliteral(L, "closed");
  else
    lua_pushliteral(L, "empty");
  return 3;
}

/* ch:close() -> true | nil, "closed". Parked receivers and senders get
** nil, "closed"; values already in the ring can still be received. */
static int chan_close(lua_State *L) {
  schan *c = check_chan(L, "close");
  pthread_mutex_lock(&c->h.lock);
  bool was = c->closed;
  if (!was) {
    c->closed = true;
    lshared_grant_all(&c->recvq, CLOSED);
    lshared_grant_all(&c->sendq, CLOSED);
  }
  pthread_mutex_unlock(&c->h.lock);
  if (was) return push_closed(L);
  lua_pushboolean(L, 1);
  return 1;
}

static int chan_len(lua_State *L) {
  schan *c = check_chan(L, "len");
  pthread_mutex_lock(&c->h.lock);
  size_t n = count_of(c);
  pthread_mutex_unlock(&c->h.lock);
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

static int chan_cap(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)check_chan(L, "cap")->cap);
  return 1;
}

static int chan_closed(lua_State *L) {
  schan *c = check_chan(L, "closed");
  pthread_mutex_lock(&c->h.lock);
  bool closed = c->closed;
  pthread_mutex_unlock(&c->h.lock);
  lua_pushboolean(L, closed);
  return 1;
}

static const luaL_Reg chan_methods[] = {
    {"send", chan_send},         {"recv", chan_recv},
    {"try_send", chan_try_send}, {"try_recv", chan_try_recv},
    {"close", chan_close},       {"len", chan_len},
    {"cap", chan_cap},           {"closed", chan_closed},
    {NULL, NULL}};

/* ---------------------------------------------------------------------- */
/* Mutex                                                                   */
/* ---------------------------------------------------------------------- */

/* FIFO, not recursive, owned by a task (of any VM); unlock hands it to
** the first waiter, so nobody barges in. A task that ends holding it
** leaves it locked, as in C. */
typedef struct smutex {
  lshared h;
  ums_task_t owner;      /* [h.lock] 0: unlocked */
  lswaitq q;             /* [h.lock] */
} smutex;

static void plain_destroy(lshared *o) { free(o); }

static const luaL_Reg mutex_methods[];
static const lshared_kind mutex_kind = {"ums.shared.mutex", plain_destroy,
                                        mutex_methods};

static int mutex_new(lua_State *L) {
  lshared_new(L, sizeof(smutex), &mutex_kind);
  return 1;
}

/* m:lock([timeout]) -> true | nil, "timeout" | nil, msg (already ours) */
static int mutex_lock(lua_State *L) {
  LUMS_YIELD_POINT(L, mutex_lock);
  smutex *m = (smutex *)lshared_check(L, 1, &mutex_kind, "lock");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "lock", &poll);
  ums_task_t me = ums_self();
  if (!me) lums_need_task(L, "mutex:lock");
  pthread_mutex_lock(&m->h.lock);
  if (m->owner == 0) {
    m->owner = me;
    pthread_mutex_unlock(&m->h.lock);
    lua_pushboolean(L, 1);
    return 1;
  }
  if (m->owner == me) {
    pthread_mutex_unlock(&m->h.lock);
    lua_pushnil(L);
    lua_pushliteral(L, "would deadlock: the mutex is already locked by this "
                       "task");
    return 2;
  }
  if (poll) {
    pthread_mutex_unlock(&m->h.lock);
    return push_timeout(L);
  }
  /* Granted means unlock made us the owner. */
  return park_simple(L, &m->h, &m->q, deadline, "mutex:lock");
}

/* m:trylock() -> true | false */
static int mutex_trylock(lua_State *L) {
  smutex *m = (smutex *)lshared_check(L, 1, &mutex_kind, "trylock");
  ums_task_t me = ums_self();
  if (!me) lums_need_task(L, "mutex:trylock");
  pthread_mutex_lock(&m->h.lock);
  bool ok = m->owner == 0;
  if (ok) m->owner = me;
  pthread_mutex_unlock(&m->h.lock);
  lua_pushboolean(L, ok);
  return 1;
}

/* m:unlock() -> true; raises unless the calling task holds it. */
static int mutex_unlock(lua_State *L) {
  smutex *m = (smutex *)lshared_check(L, 1, &mutex_kind, "unlock");
  ums_task_t me = ums_self();
  if (!me) lums_need_task(L, "mutex:unlock");
  pthread_mutex_lock(&m->h.lock);
  ums_task_t owner = m->owner;
  if (owner == me) {
    lswait *w = lshared_grant(&m->q, GRANTED, NULL);
    m->owner = w ? w->task : 0;
  }
  pthread_mutex_unlock(&m->h.lock);
  if (owner != me)
    return luaL_error(L, owner == 0
                             ? "ums.mutex:unlock: the mutex is not locked"
                             : "ums.mutex:unlock: the mutex is locked by "
                               "another task");
  lua_pushboolean(L, 1);
  return 1;
}

static const luaL_Reg mutex_methods[] = {{"lock", mutex_lock},
                                         {"trylock", mutex_trylock},
                                         {"unlock", mutex_unlock},
                                         {NULL, NULL}};

/* ---------------------------------------------------------------------- */
/* Semaphore                                                               */
/* ---------------------------------------------------------------------- */

/* Release hands units straight to waiters, FIFO: a positive count means
** nobody is waiting. */
typedef struct ssem {
  lshared h;
  int64_t count;         /* [h.lock] */
  lswaitq q;             /* [h.lock] */
} ssem;

static const luaL_Reg sem_methods[];
static const lshared_kind sem_kind = {"ums.shared.semaphore", plain_destroy,
                                      sem_methods};

static int sem_new(lua_State *L) {
  int64_t n = check_count(L, 1, "semaphore");
  if (n < 0)
    lums_argerr(L, 1, "semaphore", "initial value must not be negative");
  ssem *s = lshared_new(L, sizeof(ssem), &sem_kind);
  s->count = n;  /* not yet visible to any other thread */
  return 1;
}

/* s:acquire([timeout]) -> true | nil, "timeout" */
static int sem_acquire(lua_State *L) {
  LUMS_YIELD_POINT(L, sem_acquire);
  ssem *s = (ssem *)lshared_check(L, 1, &sem_kind, "acquire");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "acquire", &poll);
  pthread_mutex_lock(&s->h.lock);
  if (s->count > 0) {
    s->count--;
    pthread_mutex_unlock(&s->h.lock);
    lua_pushboolean(L, 1);
    return 1;
  }
  if (poll) {
    pthread_mutex_unlock(&s->h.lock);
    return push_timeout(L);
  }
  return park_simple(L, &s->h, &s->q, deadline, "semaphore:acquire");
}

/* s:release([n]) -> true | nil, msg (the value would overflow) */
static int sem_release(lua_State *L) {
  ssem *s = (ssem *)lshared_check(L, 1, &sem_kind, "release");
  int64_t n = 1;
  if (!lua_isnoneornil(L, 2)) {
    n = check_count(L, 2, "release");
    if (n < 1) lums_argerr(L, 2, "release", "count must be positive");
  }
  pthread_mutex_lock(&s->h.lock);
  if (n > INT64_MAX - s->count) {
    pthread_mutex_unlock(&s->h.lock);
    lua_pushnil(L);
    lua_pushliteral(L, "semaphore value out of range");
    return 2;
  }
  while (n > 0 && lshared_grant(&s->q, GRANTED, NULL)) n--;
  s->count += n;
  pthread_mutex_unlock(&s->h.lock);
  lua_pushboolean(L, 1);
  return 1;
}

static int sem_value(lua_State *L) {
  ssem *s = (ssem *)lshared_check(L, 1, &sem_kind, "value");
  pthread_mutex_lock(&s->h.lock);
  int64_t n = s->count;
  pthread_mutex_unlock(&s->h.lock);
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

static const luaL_Reg sem_methods[] = {{"acquire", sem_acquire},
                                       {"release", sem_release},
                                       {"value", sem_value},
                                       {NULL, NULL}};

/* ---------------------------------------------------------------------- */
/* Event                                                                   */
/* ---------------------------------------------------------------------- */

/* Manual reset: set wakes every waiter and stays set until reset. Auto
** reset: set wakes one waiter, or stays set until one wait consumes it. */
typedef struct sevent {
  lshared h;
  bool manual;           /* [const] */
  bool set;              /* [h.lock] */
  lswaitq q;             /* [h.lock] */
} sevent;

static const luaL_Reg event_methods[];
static const lshared_kind event_kind = {"ums.shared.event", plain_destroy,
                                        event_methods};

static int event_new(lua_State *L) {
  if (!lua_isnoneornil(L, 1) && !lua_isboolean(L, 1))
    lums_typeerr(L, 1, "event", "boolean");
  bool manual = lua_toboolean(L, 1);
  sevent *e = lshared_new(L, sizeof(sevent), &event_kind);
  e->manual = manual;
  return 1;
}

static int event_set(lua_State *L) {
  sevent *e = (sevent *)lshared_check(L, 1, &event_kind, "set");
  pthread_mutex_lock(&e->h.lock);
  if (e->manual) {
    e->set = true;
    lshared_grant_all(&e->q, GRANTED);
  } else if (!lshared_grant(&e->q, GRANTED, NULL)) {
    e->set = true;
  }
  pthread_mutex_unlock(&e->h.lock);
  lua_pushboolean(L, 1);
  return 1;
}

static int event_reset(lua_State *L) {
  sevent *e = (sevent *)lshared_check(L, 1, &event_kind, "reset");
  pthread_mutex_lock(&e->h.lock);
  e->set = false;
  pthread_mutex_unlock(&e->h.lock);
  lua_pushboolean(L, 1);
  return 1;
}

static int event_is_set(lua_State *L) {
  sevent *e = (sevent *)lshared_check(L, 1, &event_kind, "is_set");
  pthread_mutex_lock(&e->h.lock);
  bool set = e->set;
  pthread_mutex_unlock(&e->h.lock);
  lua_pushboolean(L, set);
  return 1;
}

/* e:wait([timeout]) -> true | nil, "timeout" */
static int event_wait(lua_State *L) {
  LUMS_YIELD_POINT(L, event_wait);
  sevent *e = (sevent *)lshared_check(L, 1, &event_kind, "wait");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "wait", &poll);
  pthread_mutex_lock(&e->h.lock);
  if (e->set) {
    if (!e->manual) e->set = false;
    pthread_mutex_unlock(&e->h.lock);
    lua_pushboolean(L, 1);
    return 1;
  }
  if (poll) {
    pthread_mutex_unlock(&e->h.lock);
    return push_timeout(L);
  }
  return park_simple(L, &e->h, &e->q, deadline, "event:wait");
}

static const luaL_Reg event_methods[] = {{"set", event_set},
                                         {"reset", event_reset},
                                         {"is_set", event_is_set},
                                         {"wait", event_wait},
                                         {NULL, NULL}};

/* ---------------------------------------------------------------------- */
/* Wait group                                                              */
/* ---------------------------------------------------------------------- */

typedef struct swg {
  lshared h;
  int64_t count;         /* [h.lock] */
  lswaitq q;             /* [h.lock] */
} swg;

static const luaL_Reg wg_methods[];
static const lshared_kind wg_kind = {"ums.shared.waitgroup", plain_destroy,
                                     wg_methods};

static int wg_new(lua_State *L) {
  lshared_new(L, sizeof(swg), &wg_kind);
  return 1;
}

static int wg_change(lua_State *L, swg *g, int64_t n, const char *fname) {
  pthread_mutex_lock(&g->h.lock);
  int64_t c = g->count;
  bool bad = n < 0 ? c + n < 0 : c > INT64_MAX - n;
  if (!bad) {
    g->count = c + n;
    if (g->count == 0) lshared_grant_all(&g->q, GRANTED);
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
  return park_simple(L, &g->h, &g->q, deadline, "waitgroup:wait");
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
