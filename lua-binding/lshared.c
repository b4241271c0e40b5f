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
** the sender encodes into an lmsg, the receiver decodes it into its VM;
** a buffered channel moves them through a lock-free ring and takes its
** lock only for waiters (the rule is at the channel's section).
**
** The mutex, semaphore, event and wait group are the runtime's objects
** (sync.c) behind the reference count, waited on with their park-based
** forms (ums.h: _begin, then _end in the continuation): their waiters,
** Lua's and C's alike, are on the runtime object's one queue. A work
** request's join (lwork.c) waits on a runtime event the same way.
**
** Channel waits. A task that must wait allocates an lswait, begins its park and
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
** ums_unpark and ums_park_begin, or (a wait group) the lock of its
** runtime event. No two shared objects' locks are ever held at once.
*/
#define _GNU_SOURCE /* clock_gettime */
#include "lvm.h"
#include "lpark.h"

#include <inttypes.h>
#include <sched.h>
#include <stddef.h>
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
  ums_list_push_back(&q->list, &w->link);
  atomic_fetch_add_explicit(&q->n, 1, memory_order_relaxed);
}

static void q_unlink(lswait *w) {
  lswaitq *q = w->q;
  if (!q) return;
  ums_list_remove(&q->list, &w->link);
  atomic_fetch_sub_explicit(&q->n, 1, memory_order_relaxed);
  w->q = NULL;
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
  w->rt = me->vmrun->rt;
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
  while ((w = lshared_first(q)) != NULL) {
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
** An unbuffered channel is a rendezvous: a sender hands its encoded
** value to a parked receiver (recvq) and unparks it, or parks on sendq
** with the value in its waiter for a receiver to take, under the lock.
** A receiver whose sender last ran on another scheduler first spins for
** a while as the channel's `spinner` (a cell on its C stack, which stays
** put because the task does not yield meanwhile), and a sender hands the
** value to it without the lock: it claims the spinner with a
** compare-and-swap, moves its encoded value into the spinner's inline
** message and publishes its state; the receiver sees the state and
** decodes. Neither side parks, takes the lock or allocates. The rule for
** the spinner is at struct spinner.
**
** A buffered channel keeps its values in a ring of preallocated slots,
** Vyukov's bounded multi-producer multi-consumer queue: a sender claims
** the slot at `tail` with a compare-and-swap, moves its encoded value
** into the slot's inline message and publishes it through the slot's
** sequence number; a receiver claims the slot at `head` the same way and
** moves the value out. Neither takes the lock nor allocates while the
** ring has room or a value, and scalars are encoded straight into the
** sender's message (lcopy_encode_scalars), so a number or a short
** string crosses without malloc. The lock orders only the parked
** waiters and the spill.
**
** A capacity is a bound, not a reservation: the ring has at most
** RING_MAX slots, and a channel with a larger capacity keeps the values
** beyond the ring in the spill, a ring of message pointers under the
** lock that grows by doubling. While the spill holds values every send
** goes to it, which keeps each sender's values in order, and receivers
** take from it once the ring is empty.
**
** Close is the low bit of `tail`, set with one atomic OR: a sender whose
** compare-and-swap succeeds sent before the close, so after it no value
** enters the ring, and a receiver that sees the bit and no claimed slot
** past `head` knows the channel is drained.
**
** Wake-ups follow Dekker's pattern, with a seq_cst fence on both sides
** between the write and the read. A receiver that finds nothing queues
** itself on recvq under the lock (q_push counts it in recvq.n), then
** looks at the ring once more; a sender publishes its value, then reads
** recvq.n, and takes the lock to wake a receiver only when it is not
** zero. So either the receiver's second look sees the value or the
** sender sees the receiver. Senders waiting for room and receivers
** making it do the same through sendq. A wake-up hands nothing over: it
** tells the waiter to look again (GRANTED; CLOSED after a close). A
** value therefore stays in the ring until a running receiver takes it,
** and a waiter whose park ends otherwise (timeout, cancel: exactly one
** of them wins, wait-protocol.md) loses nothing; the waker then wakes
** the next waiter instead (lshared_grant).
*/

/* Slots in a buffered channel's ring, at most. */
#define RING_MAX 256

typedef struct slot {
  _Atomic size_t seq;    /* [atomic] 2 pos when free for the send at
                            pos, 2 pos + 1 when it holds the value sent
                            at pos: doubled, so that with one slot "holds
                            the value of pos" and "free for pos + 1"
                            differ */
  lmsg m;                /* [the side that claimed the slot] */
} slot;

/* Keeps the positions of the two sides on their own cache lines. */
#define LINE 64

typedef struct schan {
  lshared h;
  size_t cap;            /* [const] */
  size_t nring;          /* [const] slots in ring: min(cap, RING_MAX) */
  slot *ring;            /* [const] NULL when unbuffered */
  char pad0[LINE];
  _Atomic size_t tail;   /* [atomic] next send position << 1 | closed */
  char pad1[LINE];
  _Atomic size_t head;   /* [atomic] next receive position */
  char pad2[LINE];
  lswaitq recvq, sendq;  /* [h.lock] (their n: any thread reads) */
  lmsg **spill;          /* [h.lock] values beyond the ring */
  size_t spill_slots;    /* [h.lock] */
  size_t spill_head;     /* [h.lock] */
  _Atomic size_t nspill; /* [h.lock] to write; any thread may read it */
  _Atomic int32_t spin_misses; /* [atomic] how the spins fare (spin_for) */
  _Atomic uint32_t spin_skips; /* [atomic] */
  _Atomic int send_sched;      /* [atomic] the scheduler of the latest
                                  sender, -1 before the first */
  _Atomic int recv_sched;      /* [atomic] the same for receivers */
  char pad3[LINE];
  /* [atomic] a receiver of an unbuffered channel spinning for a value;
  ** on a line of its own, the one line both sides write per message */
  _Atomic(struct spinner *) spinner;
  char pad4[LINE];
} schan;

/* A receiver spinning on an unbuffered channel. It registers itself with
** a compare-and-swap from NULL, so only while no other receiver spins,
** and only when it saw no parked sender and no close. Whoever swaps it out of c->spinner owns it
** until it publishes state: a sender (which then moves its value into m)
** or close; the receiver owns m from the moment it sees SPIN_GOT. A
** receiver whose spin ends withdraws with the same swap, and if someone
** else's swap came first it waits for state, which that side publishes
** right after (it holds no lock meanwhile). */
typedef struct spinner {
  _Atomic int state;     /* [atomic] SPIN_*: published by the claimer */
  lmsg m;                /* [the claimer until SPIN_GOT, then the
                            receiver] the value handed over */
} spinner;

enum { SPIN_WAITING, SPIN_GOT, SPIN_CLOSED };

/* Outcomes of a send that does not park. */
enum { PUT_OK, PUT_FULL, PUT_CLOSED };

/* Remembers the caller's scheduler as the latest of one side: a spin
** pays only when the other side runs on another scheduler. Written only
** when it changes, so a steady stream does not dirty the line. */
static inline void note_side(_Atomic int *side) {
  int me = ums_current_sched();
  if (atomic_load_explicit(side, memory_order_relaxed) != me)
    atomic_store_explicit(side, me, memory_order_relaxed);
}

static inline bool is_closed(schan *c) {
  return atomic_load_explicit(&c->tail, memory_order_acquire) & 1;
}

/* The full barrier between a side's write and its read of the other
** side's state (the top of this section). TSan does not model fences, and
** GCC warns about that; the values that cross are ordered by the slots'
** sequence numbers and the lock, which it does model, so the warning is
** silenced here rather than the fence replaced. */
static inline void full_fence(void) {
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wtsan"
#endif
  atomic_thread_fence(memory_order_seq_cst);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
}

/* With the ring: moves m (the caller's) into a free slot; false if the
** ring is full or closed (m is still the caller's). */
static bool ring_put(schan *c, lmsg *m) {
  size_t t = atomic_load_explicit(&c->tail, memory_order_relaxed);
  for (;;) {
    if (t & 1) return false;
    size_t pos = t >> 1;
    slot *s = &c->ring[pos % c->nring];
    size_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (seq == 2 * pos) {
      if (atomic_compare_exchange_weak_explicit(&c->tail, &t, t + 2,
                                                memory_order_relaxed,
                                                memory_order_relaxed)) {
        lcopy_move(&s->m, m);
        atomic_store_explicit(&s->seq, 2 * pos + 1, memory_order_release);
        return true;
      }
    } else if ((ptrdiff_t)(seq - 2 * pos) < 0) {
      return false;  /* the slot still holds the value of a lap ago */
    } else {
      t = atomic_load_explicit(&c->tail, memory_order_relaxed);
    }
  }
}

/* Moves the oldest published value into out; false if there is none
** (the ring is empty, or its oldest slot is claimed but not yet
** published). */
static bool ring_take(schan *c, lmsg *out) {
  size_t pos = atomic_load_explicit(&c->head, memory_order_relaxed);
  for (;;) {
    slot *s = &c->ring[pos % c->nring];
    size_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (seq == 2 * pos + 1) {
      if (atomic_compare_exchange_weak_explicit(&c->head, &pos, pos + 1,
                                                memory_order_relaxed,
                                                memory_order_relaxed)) {
        lcopy_move(out, &s->m);
        atomic_store_explicit(&s->seq, 2 * (pos + c->nring),
                              memory_order_release);
        return true;
      }
    } else if ((ptrdiff_t)(seq - (2 * pos + 1)) < 0) {
      return false;
    } else {
      pos = atomic_load_explicit(&c->head, memory_order_relaxed);
    }
  }
}

/* Values in the ring, claimed slots included. */
static size_t ring_len(schan *c) {
  size_t h = atomic_load_explicit(&c->head, memory_order_acquire);
  size_t t = atomic_load_explicit(&c->tail, memory_order_acquire) >> 1;
  return t > h ? t - h : 0;
}

/* Whether a receive would find something: a published value at head,
** or values in the spill. */
static bool has_value(schan *c) {
  size_t pos = atomic_load_explicit(&c->head, memory_order_relaxed);
  size_t seq = atomic_load_explicit(&c->ring[pos % c->nring].seq,
                                    memory_order_acquire);
  return seq == 2 * pos + 1 ||
         atomic_load_explicit(&c->nspill, memory_order_relaxed) > 0;
}

/* Whether a send would find room (or the close). */
static bool has_room(schan *c) {
  size_t t = atomic_load_explicit(&c->tail, memory_order_relaxed);
  if (t & 1) return true;
  size_t nspill = atomic_load_explicit(&c->nspill, memory_order_relaxed);
  if (nspill > 0) return nspill < c->cap - c->nring;
  size_t pos = t >> 1;
  return atomic_load_explicit(&c->ring[pos % c->nring].seq,
                              memory_order_acquire) == 2 * pos ||
         c->cap > c->nring;
}

/* After a send or a receive: wakes one waiter of q (to look again) when
** there is one. The fence pairs with the one a waiter makes between
** queueing itself and its second look (see the top of this section). */
static void wake_one(schan *c, lswaitq *q) {
  full_fence();
  if (atomic_load_explicit(&q->n, memory_order_relaxed) == 0) return;
  pthread_mutex_lock(&c->h.lock);
  lshared_grant(q, GRANTED, NULL);
  pthread_mutex_unlock(&c->h.lock);
}

/* Makes room for one more value in the spill. With the lock held; false
** when memory runs out. */
static bool spill_grow(schan *c) {
  size_t n = c->spill_slots < 4 ? 4 : c->spill_slots * 2;
  size_t most = c->cap - c->nring;
  if (n > most) n = most;
  lmsg **spill = malloc(n * sizeof *spill);
  if (!spill) return false;
  size_t used = atomic_load_explicit(&c->nspill, memory_order_relaxed);
  for (size_t i = 0; i < used; i++)
    spill[i] = c->spill[(c->spill_head + i) % c->spill_slots];
  free(c->spill);
  c->spill = spill;
  c->spill_slots = n;
  c->spill_head = 0;
  return true;
}

/* Without parking: moves m (the caller's; cleared unless PUT_FULL) into
** a buffered channel. */
static int put_now(schan *c, lmsg *m) {
  if (atomic_load_explicit(&c->nspill, memory_order_relaxed) == 0) {
    if (ring_put(c, m)) {
      wake_one(c, &c->recvq);
      return PUT_OK;
    }
    if (is_closed(c)) {
      lcopy_clear(m);
      return PUT_CLOSED;
    }
    if (c->cap == c->nring) return PUT_FULL;
  }
  pthread_mutex_lock(&c->h.lock);
  if (is_closed(c)) {
    pthread_mutex_unlock(&c->h.lock);
    lcopy_clear(m);
    return PUT_CLOSED;
  }
  size_t n = atomic_load_explicit(&c->nspill, memory_order_relaxed);
  /* The ring may have made room meanwhile, but once values are in the
  ** spill the ring takes none until it is empty. Without memory to grow
  ** the spill the channel acts as if it were full. */
  bool ok = n == 0 && ring_put(c, m);
  if (!ok && n < c->cap - c->nring && (n < c->spill_slots || spill_grow(c))) {
    lmsg *h = malloc(sizeof *h);
    if (h) {
      lcopy_move(h, m);
      c->spill[(c->spill_head + n) % c->spill_slots] = h;
      atomic_store_explicit(&c->nspill, n + 1, memory_order_relaxed);
      ok = true;
    }
  }
  if (ok) lshared_grant(&c->recvq, GRANTED, NULL);
  pthread_mutex_unlock(&c->h.lock);
  return ok ? PUT_OK : PUT_FULL;
}

/* Without parking: moves the next value of a buffered channel into out;
** false if there is none. */
static bool take_now(schan *c, lmsg *out) {
  if (!ring_take(c, out)) {
    if (atomic_load_explicit(&c->nspill, memory_order_relaxed) == 0)
      return false;
    pthread_mutex_lock(&c->h.lock);
    size_t n = atomic_load_explicit(&c->nspill, memory_order_relaxed);
    bool ok = ring_take(c, out);
    if (!ok && n > 0) {
      lmsg *h = c->spill[c->spill_head];
      c->spill_head = (c->spill_head + 1) % c->spill_slots;
      atomic_store_explicit(&c->nspill, n - 1, memory_order_relaxed);
      lcopy_move(out, h);
      free(h);
      ok = true;
    }
    if (ok) lshared_grant(&c->sendq, GRANTED, NULL);
    pthread_mutex_unlock(&c->h.lock);
    return ok;
  }
  wake_one(c, &c->sendq);
  return true;
}

/* Whether a closed buffered channel is drained: no published value and
** no slot claimed before the close still being filled. */
static bool drained(schan *c) {
  size_t h = atomic_load_explicit(&c->head, memory_order_acquire);
  size_t t = atomic_load_explicit(&c->tail, memory_order_acquire) >> 1;
  return h == t &&
         atomic_load_explicit(&c->nspill, memory_order_relaxed) == 0;
}

static void chan_destroy(lshared *o) {
  schan *c = (schan *)o;
  lmsg m;
  if (c->ring) {
    while (ring_take(c, &m)) lcopy_clear(&m);
    free(c->ring);
  }
  size_t n = atomic_load_explicit(&c->nspill, memory_order_relaxed);
  for (size_t i = 0; i < n; i++)
    lcopy_free(c->spill[(c->spill_head + i) % c->spill_slots]);
  free(c->spill);
  free(c);
}

static const luaL_Reg chan_methods[];
static const lshared_kind chan_kind = {"ums.shared.channel", chan_destroy,
                                       chan_methods};

static schan *check_chan(lua_State *L, const char *fname) {
  return (schan *)lshared_check(L, 1, &chan_kind, fname);
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

/* m (the caller's) in memory of its own, for a waiter to carry; on
** failure clears m and raises. */
static lmsg *msg_to_heap(lua_State *L, lmsg *m) {
  lmsg *h = malloc(sizeof *h);
  if (!h) {
    lcopy_clear(m);
    luaL_error(L, "ums: out of memory");
  }
  lcopy_move(h, m);
  return h;
}

/* Takes the value of the first parked sender whose park has not ended,
** ending that park. NULL if there is none. Unbuffered channels. */
static lmsg *take_sender(schan *c) {
  lswait *s;
  while ((s = lshared_first(&c->sendq)) != NULL) {
    q_unlink(s);
    if (ums_unpark(s->rt, s->tok, GRANTED) == 0) {
      lmsg *m = s->msg;
      s->msg = NULL;
      return m;
    }
  }
  return NULL;
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

/* Spins until ready(c, arg), up to SPIN_NS, when the peer (the latest
** task of the other side) runs on another scheduler. Returns whether it
** saw that; the caller then tries again. */
static bool spin_until(schan *c, _Atomic int *peer_side,
                       bool (*ready)(schan *, void *), void *arg) {
  int peer = atomic_load_explicit(peer_side, memory_order_relaxed);
  if (peer < 0 || peer == ums_current_sched()) return false;
  if (atomic_load_explicit(&c->spin_misses, memory_order_relaxed) >=
      SPIN_MISS_MAX) {
    if (atomic_fetch_add_explicit(&c->spin_skips, 1, memory_order_relaxed) %
            SPIN_PROBE != 0)
      return false;
  }
  /* The clock starts at the first check rather than before the loop: a
  ** peer that answers within a few turns costs no clock reading. */
  int64_t until = 0;
  bool seen = false;
  for (unsigned i = 1; i <= SPIN_MAX_LOOPS; i++) {
    if (ready(c, arg)) {
      seen = true;
      break;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
    if ((i & 31) == 0) {
      int64_t now = real_now();
      if (until == 0)
        until = now + SPIN_NS;
      else if (now >= until)
        break;
    }
  }
  /* Written only when it changes: while spins pay, the line stays
  ** shared between the two sides instead of moving at every message. */
  int32_t was = atomic_load_explicit(&c->spin_misses, memory_order_relaxed);
  int32_t misses = seen ? (was > 0 ? was - 1 : 0)
                        : (was < 2 * SPIN_MISS_MAX ? was + 2 : was);
  if (misses != was)
    atomic_store_explicit(&c->spin_misses, misses, memory_order_relaxed);
  return seen;
}

static bool ready_room(schan *c, void *arg) {
  (void)arg;
  return has_room(c);
}

static bool ready_value(schan *c, void *arg) {
  (void)arg;
  return has_value(c) || is_closed(c);
}

/* A spinner's spin ends when a sender handed it a value (or close
** ended it), and also when a sender that found no spinner parked instead
** or the channel was closed before the spinner registered. The spinner
** reads those at every turn; what its spin misses, the look under the
** lock after it finds (chan_recv). */
static bool ready_handed(schan *c, void *arg) {
  return atomic_load_explicit(&((spinner *)arg)->state,
                              memory_order_acquire) != SPIN_WAITING ||
         atomic_load_explicit(&c->sendq.n, memory_order_relaxed) > 0 ||
         is_closed(c);
}

/* Spins until a buffered channel has a value (want_room false) or room. */
static bool spin_for(schan *c, bool want_room) {
  return want_room ? spin_until(c, &c->recv_sched, ready_room, NULL)
                   : spin_until(c, &c->send_sched, ready_value, NULL);
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
  c->cap = (size_t)size;
  c->nring = c->cap < RING_MAX ? c->cap : RING_MAX;
  if (c->nring > 0) {
    c->ring = malloc(c->nring * sizeof *c->ring);
    if (!c->ring) luaL_error(L, "ums: out of memory");
    for (size_t i = 0; i < c->nring; i++)
      atomic_init(&c->ring[i].seq, 2 * i);
  }
  atomic_init(&c->send_sched, -1);
  atomic_init(&c->recv_sched, -1);
  return 1;
}

/* Stack of a send: 1 the channel, 2 the value, 3 the deadline (kept for
** the looks again after a wake-up). */
static int send_buffered(lua_State *L, schan *c, lmsg *m, int64_t deadline,
                         bool poll);

/* What a wait to send w ended with: pushes the send's results and
** returns their number, or returns AGAIN with the value back in m when a
** buffered channel made room and the send must look again. */
#define AGAIN (-1)

static int send_woken(lua_State *L, schan *c, lswait *w, lmsg *m) {
  lmsg *h;
  int r = lshared_wait_end(w, &h);
  if (r == GRANTED && c->ring) {
    lcopy_move(m, h);
    free(h);
    return AGAIN;
  }
  lcopy_free(h);  /* not taken: the send did not happen */
  if (r == CLOSED) return push_closed(L);
  return push_wait_result(L, r);
}

static int send_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  schan *c = (schan *)lshared_test(L, 1);
  lmsg m;
  int n = send_woken(L, c, (lswait *)ctx, &m);
  if (n != AGAIN) return n;
  return send_buffered(L, c, &m, (int64_t)lua_tointeger(L, 3), false);
}

static int send_buffered(lua_State *L, schan *c, lmsg *m, int64_t deadline,
                         bool poll) {
  for (;;) {
    int r = put_now(c, m);
    if (r == PUT_FULL && !poll && spin_for(c, true)) r = put_now(c, m);
    if (r == PUT_OK) {
      lua_pushboolean(L, 1);
      return 1;
    }
    if (r == PUT_CLOSED) return push_closed(L);
    if (poll) {
      lcopy_clear(m);
      return push_timeout(L);
    }
    lmsg *h = msg_to_heap(L, m);
    pthread_mutex_lock(&c->h.lock);
    ltask *me = wait_task(L, &c->h, "channel:send", h);
    lswait *w = wait_begin_msg(L, me, &c->h, &c->sendq, deadline, h);
    full_fence();
    if (has_room(c)) {
      /* A receiver made room before it could see this waiter: end the
      ** park at once and look again. */
      q_unlink(w);
      ums_unpark(w->rt, w->tok, GRANTED);
    }
    pthread_mutex_unlock(&c->h.lock);
    if (lums_can_yield(L, me))
      return lums_park_finish(L, me, (lua_KContext)w, send_k);
    /* Where Lua cannot yield, a look again that finds the ring full once
    ** more (another sender took the room) loops here rather than
    ** parking again from inside send_k. */
    lums_park_block_wait(me);
    int n = send_woken(L, c, w, m);
    if (n != AGAIN) return n;
  }
}

/* Takes the spinner of c, if one is registered, out of the channel: the
** caller then owns it until it publishes its state. */
static spinner *claim_spinner(schan *c) {
  spinner *sp = atomic_load_explicit(&c->spinner, memory_order_relaxed);
  while (sp && !atomic_compare_exchange_weak_explicit(
                   &c->spinner, &sp, NULL, memory_order_seq_cst,
                   memory_order_relaxed)) {
  }
  return sp;
}

/* Without the lock: moves m (the caller's) to the receiver spinning on an
** unbuffered channel. PUT_FULL when none spins (m is still the
** caller's); PUT_CLOSED (m cleared) when the channel is closed. The
** close check comes after the claim, so that a send either sees the
** close or took the spinner before close could (chan_close). */
static int send_to_spinner(schan *c, lmsg *m) {
  spinner *sp = claim_spinner(c);
  if (!sp) return PUT_FULL;
  if (atomic_load_explicit(&c->tail, memory_order_seq_cst) & 1) {
    atomic_store_explicit(&sp->state, SPIN_CLOSED, memory_order_release);
    lcopy_clear(m);
    return PUT_CLOSED;
  }
  lcopy_move(&sp->m, m);
  atomic_store_explicit(&sp->state, SPIN_GOT, memory_order_release);
  return PUT_OK;
}

/* Without parking: hands h (the caller's until this succeeds) to a
** waiting receiver of an unbuffered channel. With the lock held; false
** if it would block. */
static bool send_now(schan *c, lmsg *h) {
  if (lshared_grant(&c->recvq, GRANTED, h)) return true;
  spinner *sp = claim_spinner(c);
  if (!sp) return false;
  lcopy_move(&sp->m, h);
  free(h);
  atomic_store_explicit(&sp->state, SPIN_GOT, memory_order_release);
  return true;
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
  if (c->ring) {
    lua_pushinteger(L, (lua_Integer)deadline);
    note_side(&c->send_sched);
    return send_buffered(L, c, &m, deadline, poll);
  }
  note_side(&c->send_sched);
  int r = send_to_spinner(c, &m);
  if (r != PUT_FULL) {
    if (r == PUT_CLOSED) return push_closed(L);
    lua_pushboolean(L, 1);
    return 1;
  }
  lmsg *h = msg_to_heap(L, &m);
  pthread_mutex_lock(&c->h.lock);
  if (is_closed(c)) {
    pthread_mutex_unlock(&c->h.lock);
    lcopy_free(h);
    return push_closed(L);
  }
  if (send_now(c, h)) {
    pthread_mutex_unlock(&c->h.lock);
    lua_pushboolean(L, 1);
    return 1;
  }
  if (poll) {
    pthread_mutex_unlock(&c->h.lock);
    lcopy_free(h);
    return push_timeout(L);
  }
  ltask *me = wait_task(L, &c->h, "channel:send", h);
  lswait *w = wait_begin_msg(L, me, &c->h, &c->sendq, deadline, h);
  pthread_mutex_unlock(&c->h.lock);
  return lums_park_finish(L, me, (lua_KContext)w, send_k);
}

/* Stack of a receive: 1 the channel, 2 the deadline. */
static int recv_buffered(lua_State *L, schan *c, int64_t deadline,
                         bool poll);

/* What a wait to receive w ended with: pushes the receive's results and
** returns their number, or returns AGAIN when a buffered channel's
** wake-up (a value, or the close) says to look again. */
static int recv_woken(lua_State *L, schan *c, lswait *w) {
  lmsg *h;
  int r = lshared_wait_end(w, &h);
  if (r == GRANTED && h) return lcopy_decode_free(L, h);
  lcopy_free(h);
  if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  if (r >= 0 && c->ring) return AGAIN;
  if (r == CLOSED) return push_closed(L);
  return push_timeout(L);
}

static int recv_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  schan *c = (schan *)lshared_test(L, 1);
  int n = recv_woken(L, c, (lswait *)ctx);
  if (n != AGAIN) return n;
  return recv_buffered(L, c, (int64_t)lua_tointeger(L, 2), false);
}

static int recv_buffered(lua_State *L, schan *c, int64_t deadline,
                         bool poll) {
  lmsg m;
  for (;;) {
    for (int spun = 0;; spun++) {
      if (take_now(c, &m)) return lcopy_decode_clear(L, &m);
      if (is_closed(c)) {
        if (drained(c)) return push_closed(L);
        /* A send claimed a slot before the close and is still filling
        ** it: it takes no longer than a copy. */
        if (poll) return push_timeout(L);
        sched_yield();
        continue;
      }
      if (poll || spun || !spin_for(c, false)) break;
    }
    if (poll) return push_timeout(L);
    pthread_mutex_lock(&c->h.lock);
    ltask *me = wait_task(L, &c->h, "channel:recv", NULL);
    lswait *w = lshared_wait_begin(L, me, &c->h, &c->recvq, deadline);
    full_fence();
    if (has_value(c) || is_closed(c)) {
      /* A sender published before it could see this waiter: end the
      ** park at once and look again. */
      q_unlink(w);
      ums_unpark(w->rt, w->tok, GRANTED);
    }
    pthread_mutex_unlock(&c->h.lock);
    if (lums_can_yield(L, me))
      return lums_park_finish(L, me, (lua_KContext)w, recv_k);
    /* Where Lua cannot yield, a look again that finds nothing (another
    ** receiver took the value) loops here rather than parking again
    ** from inside recv_k. */
    lums_park_block_wait(me);
    int n = recv_woken(L, c, w);
    if (n != AGAIN) return n;
  }
}

/* ch:recv([timeout]) -> v | nil, "timeout" | nil, "closed" */
static int chan_recv(lua_State *L) {
  LUMS_YIELD_POINT(L, chan_recv);
  schan *c = check_chan(L, "recv");
  bool poll;
  int64_t deadline = lums_opt_timeout(L, 2, "recv", &poll);
  lua_settop(L, 1);
  if (c->ring) {
    lua_pushinteger(L, (lua_Integer)deadline);
    note_side(&c->recv_sched);
    return recv_buffered(L, c, deadline, poll);
  }
  note_side(&c->recv_sched);
  spinner sp;
  atomic_init(&sp.state, SPIN_WAITING);
  spinner *none = NULL;
  if (!poll && atomic_load_explicit(&c->sendq.n, memory_order_relaxed) == 0 &&
      !is_closed(c) &&
      atomic_compare_exchange_strong_explicit(&c->spinner, &none, &sp,
                                              memory_order_seq_cst,
                                              memory_order_relaxed)) {
    /* No sender yet: spin as the channel's spinner for one to hand the
    ** value over, then withdraw unless one did. Registered without the
    ** lock: a sender that parks meanwhile (it found no spinner) is seen
    ** by the spin (ready_handed), and after the spin the receiver looks
    ** for parked senders under the lock as below. */
    spin_until(c, &c->send_sched, ready_handed, &sp);
    spinner *mine = &sp;
    if (!atomic_compare_exchange_strong_explicit(&c->spinner, &mine, NULL,
                                                 memory_order_seq_cst,
                                                 memory_order_relaxed)) {
      /* Claimed: the claimer publishes state next, holding no lock. */
      int st;
      while ((st = atomic_load_explicit(&sp.state, memory_order_acquire)) ==
             SPIN_WAITING)
        sched_yield();
      if (st == SPIN_GOT) return lcopy_decode_clear(L, &sp.m);
      return push_closed(L);
    }
  }
  pthread_mutex_lock(&c->h.lock);
  lmsg *m = take_sender(c);
  if (m) {
    pthread_mutex_unlock(&c->h.lock);
    return lcopy_decode_free(L, m);
  }
  if (is_closed(c)) {
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
  lmsg m;
  encode_value(L, 2, "try_send", &m);
  int r;
  if (c->ring) {
    r = put_now(c, &m);
    if (r == PUT_FULL) lcopy_clear(&m);
  } else if ((r = send_to_spinner(c, &m)) == PUT_FULL) {
    lmsg *h = msg_to_heap(L, &m);
    pthread_mutex_lock(&c->h.lock);
    r = is_closed(c) ? PUT_CLOSED : send_now(c, h) ? PUT_OK : PUT_FULL;
    pthread_mutex_unlock(&c->h.lock);
    if (r != PUT_OK) lcopy_free(h);
  }
  lua_pushboolean(L, r == PUT_OK);
  if (r == PUT_OK) return 1;
  if (r == PUT_CLOSED)
    lua_pushliteral(L, "closed");
  else
    lua_pushliteral(L, "full");
  return 2;
}

/* ch:try_recv() -> true, v | false, nil, "empty" | false, nil, "closed" */
static int chan_try_recv(lua_State *L) {
  schan *c = check_chan(L, "try_recv");
  lua_settop(L, 1);
  bool closed;
  if (c->ring) {
    lmsg m;
    if (take_now(c, &m)) {
      lua_pushboolean(L, 1);
      lcopy_decode_clear(L, &m);
      return 2;
    }
    closed = is_closed(c) && drained(c);
  } else {
    pthread_mutex_lock(&c->h.lock);
    lmsg *m = take_sender(c);
    closed = is_closed(c);
    pthread_mutex_unlock(&c->h.lock);
    if (m) {
      lua_pushboolean(L, 1);
      lcopy_decode_free(L, m);
      return 2;
    }
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
** nil, "closed" (receivers of a buffered channel once it is drained);
** values already sent can still be received. */
static int chan_close(lua_State *L) {
  schan *c = check_chan(L, "close");
  pthread_mutex_lock(&c->h.lock);
  bool was = atomic_fetch_or_explicit(&c->tail, 1, memory_order_acq_rel) & 1;
  if (!was) {
    spinner *sp = claim_spinner(c);
    if (sp)
      atomic_store_explicit(&sp->state, SPIN_CLOSED, memory_order_release);
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
  size_t n = 0;
  if (c->ring) {
    n = ring_len(c) + atomic_load_explicit(&c->nspill, memory_order_relaxed);
    if (n > c->cap) n = c->cap;
  }
  lua_pushinteger(L, (lua_Integer)n);
  return 1;
}

static int chan_cap(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)check_chan(L, "cap")->cap);
  return 1;
}

static int chan_closed(lua_State *L) {
  lua_pushboolean(L, is_closed(check_chan(L, "closed")));
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
