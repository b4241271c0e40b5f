/*
** chan.c: channels of fixed-size elements, buffered or not, for tasks of
** any scheduler and host threads.
**
** Elements. A channel moves elements of elem_size bytes. By default a
** move is a memcpy; a channel made with ums_chan_new_ex moves them with
** the caller's ops->move instead, for elements that point into
** themselves (an encoded Lua value keeps short data inline and points
** at it), and clears the ones still inside at delete with ops->clear. A
** send moves the caller's element into the channel only when it
** succeeds; a receive moves one into the caller's memory.
**
** Unbuffered channels are a rendezvous. A sender hands its element to a
** parked receiver (recvq, whose waiter's data is where the element goes)
** or parks on sendq with data pointing at its element for a receiver to
** take, under the lock. A receiver whose sender last ran on another
** scheduler first spins for a while as the channel's `spinner` (a record
** on its stack, which stays put because it does not yield meanwhile),
** and a sender hands the element to it without the lock: it claims the
** spinner with a compare-and-swap, moves its element to the spinner's
** destination and publishes the spinner's state. Neither side parks,
** takes the lock or allocates. The rule for the spinner is at struct
** spinner.
**
** Buffered channels keep up to RING_MAX elements in a ring of slots,
** Vyukov's bounded multi-producer multi-consumer queue: a sender claims
** the slot at `tail` with a compare-and-swap, moves its element in and
** publishes it through the slot's sequence number; a receiver claims
** the slot at `head` the same way and moves the element out. Neither
** takes the lock nor allocates while the ring has room or an element.
** The lock orders the parked waiters and the spill.
**
** A capacity is a bound, not a reservation: a channel with a capacity
** beyond RING_MAX keeps the elements beyond the ring in the spill, a ring
** of elements under the lock that grows by doubling. While the spill
** holds elements every send goes to it, which keeps each sender's
** elements in order, and receivers take from it once the ring is empty.
**
** Close is the low bit of `tail`, set with one atomic OR under the lock:
** a sender whose compare-and-swap succeeds sent before the close, so
** after it no element enters the ring, and a receiver that sees the bit
** and no claimed slot past `head` knows the channel is drained.
**
** Wake-ups. A wake-up of a buffered channel hands nothing over: it tells
** the waiter to look again. A waiter whose park ends otherwise (timeout,
** cancel: exactly one outcome wins, wait.c) therefore loses nothing, and
** the waker grants the next waiter instead. The flag that tells a
** lock-free side that someone waits lives in the word that side changes
** anyway, so "claim a slot" and "see the waiter" are one atomic step:
** a receiver about to park sets T_RWAIT in `tail` with a compare-and-
** swap that succeeds only while the ring is empty with no slot claimed,
** after queueing itself under the lock; every sender's claim of a slot
** reads the flag, and a sender that saw it takes the lock once it has
** published and grants one receiver. Senders waiting for room set
** H_SWAIT in `head` the same way while the ring is full, and receivers'
** claims read it. Either the parking side's compare-and-swap fails (the
** other side claimed first: it looks again) or the other side's claim
** sees the flag. Only a waker clears a flag, under the lock, when the
** queue it guards is empty; a flag left by a waiter that timed out costs
** one needless look under the lock.
**
** Who may free the channel. ums_chan_delete succeeds once no party waits
** and no call is inside the channel, and a party that got an element
** (or a close) may delete it at once. A side between its lock-free move
** and the wake-up it owes counts itself in `waking` before the move is
** visible and leaves it under the lock, which delete takes and waits on;
** a receiver that spins for a hand-off (recv_spin) reads the channel
** until it stops spinning, also after a sender handed it its element, so
** a sender claims it by leaving SPIN_CLAIMED in ch->spinner, which the
** receiver clears as its last touch and delete waits on; every other
** path's last touch of the channel is releasing its lock or publishing a
** spinner's state, after which it touches only its stack.
**
** Lock order: the channel's lock, then the task locks inside the wait
** protocol. No other lock is taken under it.
*/
#include "internal.h"

#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The lock-free steps sit on every message's path, below two or three
** calls already: inlined into their callers, and the slow paths kept
** out of line. */
#define FAST static inline __attribute__((always_inline))
#define SLOW static __attribute__((noinline))

/* Slots in a buffered channel's ring, at most. */
#define RING_MAX 256

/* Keeps the positions of the two sides on their own cache lines. */
#define LINE 64

/* tail: next send position << 2 | T_RWAIT | T_CLOSED. */
#define T_CLOSED ((size_t)1)
#define T_RWAIT ((size_t)2)
#define T_POS(t) ((t) >> 2)
/* head: next receive position << 1 | H_SWAIT. */
#define H_SWAIT ((size_t)1)
#define H_POS(h) ((h) >> 1)

/* A slot of the ring: the sequence number, then the element at offset
** ch->slot_hdr. seq is 2 pos when the slot is free for the send at pos,
** 2 pos + 1 when it holds the element sent at pos: doubled, so that with
** one slot "holds the element of pos" and "free for pos + 1" differ. */
typedef struct slot {
  _Atomic size_t seq; /* [atomic] */
} slot;

/* A receiver spinning on an unbuffered channel. It registers itself with
** a compare-and-swap from NULL, so only while no other receiver spins,
** and only when it saw no parked sender and no close. Whoever swaps it
** out of ch->spinner (to SPIN_CLAIMED) owns it until it publishes state:
** a sender (which then moves its element to dst) or close; the receiver
** owns dst again from the moment it sees SPIN_GOT. A receiver whose spin
** ends withdraws with a swap back to NULL; if someone else's swap came
** first it clears SPIN_CLAIMED instead and waits for state, which that
** side publishes right after (it holds no lock meanwhile).
**
** An element of up to SPIN_INLINE bytes goes into the spinner's own buf,
** beside the state the sender publishes, so the lines the receiver reads
** back are the ones it spins on; the receiver then moves it into its own
** memory. A larger one goes straight to the receiver's memory. */
#define SPIN_INLINE 128

typedef struct spinner {
  _Atomic int state; /* [atomic] SPIN_*: published by the claimer */
  void *dst;         /* [const] where the element goes: buf, or the
                        receiver's memory */
  /* [the claimer until SPIN_GOT, then the receiver] */
  _Alignas(max_align_t) unsigned char buf[SPIN_INLINE];
} spinner;

enum { SPIN_WAITING, SPIN_GOT, SPIN_CLOSED };

/* ch->spinner while a claimed receiver may still read the channel: no
** spinner to claim or register as, and no delete yet ("Who may free the
** channel", at the top). */
#define SPIN_CLAIMED ((spinner *)1)

/* Outcomes of an attempt that does not park. */
enum { PUT_OK, PUT_FULL, PUT_CLOSED };

struct ums_chan {
  size_t elem;                 /* [const] element size */
  size_t cap;                  /* [const] capacity in elements */
  size_t nring;                /* [const] slots: min(cap, RING_MAX) */
  size_t slot_hdr, stride;     /* [const] a slot's layout */
  ums_chan_ops_t ops;          /* [const] NULL members: memcpy, nothing */
  unsigned char *ring;         /* [const] NULL when unbuffered */
  char pad0[LINE];
  _Atomic size_t tail;         /* [atomic] see T_* */
  char pad1[LINE];
  _Atomic size_t head;         /* [atomic] see H_* */
  char pad2[LINE];
  ums__lock_t lock;
  ums__wq_t sendq, recvq;      /* [lock] (their n: any thread reads) */
  unsigned char *spill;        /* [lock] elements beyond the ring */
  size_t spill_slots;          /* [lock] */
  size_t spill_head;           /* [lock] */
  _Atomic size_t nspill;       /* [lock] to write; any thread reads */
  _Atomic size_t waking;       /* [atomic] sides that owe a wake-up and
                                  still touch the channel (top) */
  _Atomic int32_t spin_misses; /* [atomic] how the spins fare (spin_until) */
  _Atomic uint32_t spin_skips; /* [atomic] */
  /* [atomic] the scheduler of the latest sender, NULL before the first
  ** or for a host thread; the same for receivers */
  _Atomic(ums__sched_t *) send_sched, recv_sched;
  char pad3[LINE];
  /* [atomic] a receiver of an unbuffered channel spinning for an
  ** element; on a line of its own, the one line both sides write per
  ** element */
  _Atomic(spinner *) spinner;
  char pad4[LINE];
};

/* ---------------------------------------------------------------------- */
/* Elements and slots                                                      */
/* ---------------------------------------------------------------------- */

/* Moves an element of elem bytes with move (NULL: memcpy). */
static inline void move_as(void (*move)(void *, void *), size_t elem,
                           void *dst, void *src) {
  if (move) {
    move(dst, src);
    return;
  }
  /* Words and pointers, the usual elements, are copied in place: the call
  ** to memcpy would cost more than the copy. */
  switch (elem) {
    case 0: return;
    case 4: memcpy(dst, src, 4); return;
    case 8: memcpy(dst, src, 8); return;
    default: memcpy(dst, src, elem);
  }
}

static inline void move_elem(ums_chan_t *ch, void *dst, void *src) {
  move_as(ch->ops.move, ch->elem, dst, src);
}

static inline void clear_elem(ums_chan_t *ch, void *e) {
  if (ch->ops.clear) ch->ops.clear(e);
}

static inline slot *slot_at(ums_chan_t *ch, size_t pos) {
  return (slot *)(ch->ring + (pos % ch->nring) * ch->stride);
}

static inline void *slot_elem(ums_chan_t *ch, slot *s) {
  return (unsigned char *)s + ch->slot_hdr;
}

static inline void *spill_elem(ums_chan_t *ch, size_t i) {
  return ch->spill + ((ch->spill_head + i) % ch->spill_slots) * ch->elem;
}

static inline bool is_closed(ums_chan_t *ch) {
  return atomic_load_explicit(&ch->tail, memory_order_acquire) & T_CLOSED;
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

ums_chan_t *ums_chan_new_ex(size_t elem_size, size_t capacity,
                            const ums_chan_ops_t *ops) {
  if (elem_size > SIZE_MAX / 4) return NULL;
  size_t nring = capacity < RING_MAX ? capacity : RING_MAX;
  size_t align = _Alignof(max_align_t);
  size_t hdr = round_up(sizeof(slot), align);
  size_t stride = round_up(hdr + elem_size, align);
  if (elem_size && capacity > SIZE_MAX / elem_size) return NULL;
  ums_chan_t *ch = aligned_alloc(LINE, round_up(sizeof *ch, LINE));
  if (!ch) return NULL;
  memset(ch, 0, sizeof *ch);
  ch->elem = elem_size;
  ch->cap = capacity;
  ch->nring = nring;
  ch->slot_hdr = hdr;
  ch->stride = stride;
  if (ops) ch->ops = *ops;
  if (nring) {
    ch->ring = malloc(nring * stride);
    if (!ch->ring) {
      free(ch);
      return NULL;
    }
    for (size_t i = 0; i < nring; i++)
      atomic_init(&slot_at(ch, i)->seq, 2 * i);
  }
  atomic_init(&ch->send_sched, NULL);
  atomic_init(&ch->recv_sched, NULL);
  return ch;
}

ums_chan_t *ums_chan_new(size_t elem_size, size_t capacity) {
  return ums_chan_new_ex(elem_size, capacity, NULL);
}

/* Moves the oldest published element into dst; false if there is none
** (the ring is empty, or its oldest slot is claimed but not yet
** published). With *woke set when the claim saw H_SWAIT: the caller
** then owes a wake-up and is counted in ch->waking. */
FAST bool ring_take(ums_chan_t *ch, void *dst, bool *woke) {
  size_t h = atomic_load_explicit(&ch->head, memory_order_relaxed);
  for (;;) {
    size_t pos = H_POS(h);
    slot *s = slot_at(ch, pos);
    size_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (seq == 2 * pos + 1) {
      /* The flag stays: only a waker under the lock clears it. */
      if (atomic_compare_exchange_weak_explicit(
              &ch->head, &h, ((pos + 1) << 1) | (h & H_SWAIT),
              memory_order_acq_rel, memory_order_relaxed)) {
        *woke = h & H_SWAIT;
        if (*woke) atomic_fetch_add(&ch->waking, 1);
        move_elem(ch, dst, slot_elem(ch, s));
        atomic_store_explicit(&s->seq, 2 * (pos + ch->nring),
                              memory_order_release);
        return true;
      }
    } else if ((ptrdiff_t)(seq - (2 * pos + 1)) < 0) {
      return false;
    } else {
      h = atomic_load_explicit(&ch->head, memory_order_relaxed);
    }
  }
}

/* Moves src into a free slot: PUT_OK, PUT_FULL or PUT_CLOSED (src still
** the caller's). *woke as in ring_take, for T_RWAIT. */
FAST int ring_put(ums_chan_t *ch, void *src, bool *woke) {
  size_t t = atomic_load_explicit(&ch->tail, memory_order_relaxed);
  for (;;) {
    if (t & T_CLOSED) return PUT_CLOSED;
    size_t pos = T_POS(t);
    slot *s = slot_at(ch, pos);
    size_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (seq == 2 * pos) {
      /* The flag stays: only a waker under the lock clears it. */
      if (atomic_compare_exchange_weak_explicit(
              &ch->tail, &t, ((pos + 1) << 2) | (t & T_RWAIT),
              memory_order_acq_rel, memory_order_relaxed)) {
        *woke = t & T_RWAIT;
        if (*woke) atomic_fetch_add(&ch->waking, 1);
        move_elem(ch, slot_elem(ch, s), src);
        atomic_store_explicit(&s->seq, 2 * pos + 1, memory_order_release);
        return PUT_OK;
      }
    } else if ((ptrdiff_t)(seq - 2 * pos) < 0) {
      return PUT_FULL; /* the slot still holds the element of a lap ago */
    } else {
      t = atomic_load_explicit(&ch->tail, memory_order_relaxed);
    }
  }
}

/* Whether a receive would find something: a published element at head,
** or elements in the spill. */
static bool has_value(ums_chan_t *ch) {
  size_t pos = H_POS(atomic_load_explicit(&ch->head, memory_order_relaxed));
  size_t seq = atomic_load_explicit(&slot_at(ch, pos)->seq,
                                    memory_order_acquire);
  return seq == 2 * pos + 1 ||
         atomic_load_explicit(&ch->nspill, memory_order_relaxed) > 0;
}

/* Whether a send would find room (or the close). */
static bool has_room(ums_chan_t *ch) {
  size_t t = atomic_load_explicit(&ch->tail, memory_order_relaxed);
  if (t & T_CLOSED) return true;
  size_t nspill = atomic_load_explicit(&ch->nspill, memory_order_relaxed);
  if (nspill > 0) return nspill < ch->cap - ch->nring;
  size_t pos = T_POS(t);
  return atomic_load_explicit(&slot_at(ch, pos)->seq,
                              memory_order_acquire) == 2 * pos ||
         ch->cap > ch->nring;
}

/* Elements in the ring, claimed slots included. */
static size_t ring_len(ums_chan_t *ch) {
  size_t h = H_POS(atomic_load_explicit(&ch->head, memory_order_acquire));
  size_t t = T_POS(atomic_load_explicit(&ch->tail, memory_order_acquire));
  return t > h ? t - h : 0;
}

/* Whether a closed buffered channel is drained: no published element and
** no slot claimed before the close still being filled. */
static bool drained(ums_chan_t *ch) {
  return ring_len(ch) == 0 &&
         atomic_load_explicit(&ch->nspill, memory_order_relaxed) == 0;
}

/* Grants the first waiter of q (look again) and clears flag in *word
** when q is left empty. With the lock held. */
static bool grant_look(ums__wq_t *q, _Atomic size_t *word, size_t flag,
                       ums__wake_t *wk) {
  bool any = ums__wq_grant_first(q, 0, wk) != NULL;
  if (atomic_load_explicit(&q->n, memory_order_relaxed) == 0)
    atomic_fetch_and_explicit(word, ~flag, memory_order_relaxed);
  return any;
}

/* Pays the wake-up a lock-free move owed (ring_put, ring_take): grants
** one waiter of q under the lock, then leaves ch->waking, the last touch
** of the channel. */
SLOW void pay_wake(ums_chan_t *ch, ums__wq_t *q, _Atomic size_t *word,
                     size_t flag) {
  ums__wake_t wk;
  ums__lock(&ch->lock);
  bool any = grant_look(q, word, flag, &wk);
  atomic_fetch_sub(&ch->waking, 1);
  ums__unlock(&ch->lock);
  if (any) ums__wake(&wk);
}

/* Makes room for one more element in the spill. With the lock held;
** false when memory runs out. */
static bool spill_grow(ums_chan_t *ch) {
  size_t n = ch->spill_slots < 4 ? 4 : ch->spill_slots * 2;
  size_t most = ch->cap - ch->nring;
  if (n > most) n = most;
  unsigned char *spill = malloc(n * (ch->elem ? ch->elem : 1));
  if (!spill) return false;
  size_t used = atomic_load_explicit(&ch->nspill, memory_order_relaxed);
  for (size_t i = 0; i < used; i++)
    move_elem(ch, spill + i * ch->elem, spill_elem(ch, i));
  free(ch->spill);
  ch->spill = spill;
  ch->spill_slots = n;
  ch->spill_head = 0;
  return true;
}

/* Without parking: moves src into a buffered channel. PUT_FULL leaves
** src the caller's; so does PUT_CLOSED. */
FAST int put_now(ums_chan_t *ch, void *src) {
  bool woke;
  if (atomic_load_explicit(&ch->nspill, memory_order_relaxed) == 0) {
    int r = ring_put(ch, src, &woke);
    if (r == PUT_OK && woke) pay_wake(ch, &ch->recvq, &ch->tail, T_RWAIT);
    if (r != PUT_FULL || ch->cap == ch->nring) return r;
  }
  ums__lock(&ch->lock);
  if (is_closed(ch)) {
    ums__unlock(&ch->lock);
    return PUT_CLOSED;
  }
  size_t n = atomic_load_explicit(&ch->nspill, memory_order_relaxed);
  /* The ring may have made room meanwhile, but once elements are in the
  ** spill the ring takes none until it is empty. Without memory to grow
  ** the spill the channel acts as if it were full. */
  int r = PUT_FULL;
  if (n == 0) {
    r = ring_put(ch, src, &woke);
    if (r == PUT_OK && woke) atomic_fetch_sub(&ch->waking, 1);
  }
  if (r == PUT_FULL && n < ch->cap - ch->nring &&
      (n < ch->spill_slots || spill_grow(ch))) {
    move_elem(ch, spill_elem(ch, n), src);
    atomic_store_explicit(&ch->nspill, n + 1, memory_order_relaxed);
    r = PUT_OK;
  }
  ums__wake_t wk;
  bool any = r == PUT_OK && grant_look(&ch->recvq, &ch->tail, T_RWAIT, &wk);
  ums__unlock(&ch->lock);
  if (any) ums__wake(&wk);
  return r;
}

/* Without parking: moves the next element of a buffered channel into
** dst; false if there is none. */
FAST bool take_now(ums_chan_t *ch, void *dst) {
  bool woke;
  if (ring_take(ch, dst, &woke)) {
    if (woke) pay_wake(ch, &ch->sendq, &ch->head, H_SWAIT);
    return true;
  }
  if (atomic_load_explicit(&ch->nspill, memory_order_relaxed) == 0)
    return false;
  ums__lock(&ch->lock);
  size_t n = atomic_load_explicit(&ch->nspill, memory_order_relaxed);
  bool ok = ring_take(ch, dst, &woke);
  if (ok && woke) atomic_fetch_sub(&ch->waking, 1);
  /* The spill's elements are newer than any in the ring, but a slot
  ** claimed before the spill began may still be unpublished with older
  ** elements behind it: the spill waits until the ring is empty. */
  if (!ok && n > 0 && ring_len(ch) == 0) {
    move_elem(ch, dst, spill_elem(ch, 0));
    ch->spill_head = (ch->spill_head + 1) % ch->spill_slots;
    atomic_store_explicit(&ch->nspill, n - 1, memory_order_relaxed);
    ok = true;
  }
  ums__wake_t wk;
  bool any = ok && grant_look(&ch->sendq, &ch->head, H_SWAIT, &wk);
  ums__unlock(&ch->lock);
  if (any) ums__wake(&wk);
  return ok;
}

/* With the lock held, for a receiver of a buffered channel that found
** nothing: sets T_RWAIT and returns true when the ring is empty with no
** slot claimed and the spill is empty, so that a sender's next claim sees
** the flag; false when the receiver must look again instead. */
static bool may_park_recv(ums_chan_t *ch) {
  if (atomic_load_explicit(&ch->nspill, memory_order_relaxed) > 0)
    return false;
  size_t t = atomic_load_explicit(&ch->tail, memory_order_relaxed);
  for (;;) {
    if (t & T_CLOSED) return false;
    size_t h = atomic_load_explicit(&ch->head, memory_order_acquire);
    if (T_POS(t) != H_POS(h)) return false;
    if (t & T_RWAIT) return true;
    if (atomic_compare_exchange_weak_explicit(&ch->tail, &t, t | T_RWAIT,
                                              memory_order_acq_rel,
                                              memory_order_relaxed))
      return true;
  }
}

/* The same for a sender that found no room: with the spill in use, it
** waits for a receiver to take from the spill (under the lock); with the
** ring alone, it sets H_SWAIT while the ring is full. */
static bool may_park_send(ums_chan_t *ch) {
  size_t n = atomic_load_explicit(&ch->nspill, memory_order_relaxed);
  if (n > 0) return n >= ch->cap - ch->nring || n >= ch->spill_slots;
  size_t h = atomic_load_explicit(&ch->head, memory_order_relaxed);
  for (;;) {
    size_t t = atomic_load_explicit(&ch->tail, memory_order_acquire);
    if (t & T_CLOSED) return false;
    if (T_POS(t) - H_POS(h) < ch->nring) return false;
    if (h & H_SWAIT) return true;
    if (atomic_compare_exchange_weak_explicit(&ch->head, &h, h | H_SWAIT,
                                              memory_order_acq_rel,
                                              memory_order_relaxed))
      return true;
  }
}

/* ---------------------------------------------------------------------- */
/* Spinning                                                                */
/* ---------------------------------------------------------------------- */

/* How long a party spins, outside the lock, for the other side before it
** parks. A party of another scheduler answers within an element's cost;
** a park and its unpark cost several, and a wake-up per element besides,
** so a receiver a little faster than its sender would park for every
** element. Only for a peer that last ran on another scheduler (one on
** this scheduler cannot run meanwhile), and each channel keeps a score
** of misses: when spins stop paying (the other side is slow), parties
** park at once and spin again only every SPIN_PROBE-th time. */
#define SPIN_NS 3000
#define SPIN_PROBE 32
#define SPIN_MISS_MAX 8

/* A bound on the spin besides the clock. */
#define SPIN_MAX_LOOPS 100000

/* Remembers the caller's scheduler (me) as the latest of one side.
** Written only when it changes, so a steady stream does not dirty the
** line. */
static inline void note_side(_Atomic(ums__sched_t *) *side,
                             ums__sched_t *me) {
  if (atomic_load_explicit(side, memory_order_relaxed) != me)
    atomic_store_explicit(side, me, memory_order_relaxed);
}

/* Whether a spin may pay for a party of scheduler me: the peer runs on
** another scheduler, and spins have been paying (or this one probes
** whether they pay again). */
static inline bool spin_worth(ums_chan_t *ch,
                              _Atomic(ums__sched_t *) *peer_side,
                              ums__sched_t *me) {
  ums__sched_t *peer = atomic_load_explicit(peer_side, memory_order_relaxed);
  if (!peer || peer == me) return false;
  if (atomic_load_explicit(&ch->spin_misses, memory_order_relaxed) >=
      SPIN_MISS_MAX) {
    if (atomic_fetch_add_explicit(&ch->spin_skips, 1, memory_order_relaxed) %
            SPIN_PROBE != 0)
      return false;
  }
  return true;
}

/* The spin of spin_until, once spin_worth said yes. */
static bool spin_loop(ums_chan_t *ch, bool (*ready)(ums_chan_t *, void *),
                      void *arg) {
  /* The clock starts at the first check rather than before the loop: a
  ** peer that answers within a few turns costs no clock reading. */
  int64_t until = 0;
  bool seen = false;
  for (unsigned i = 1; i <= SPIN_MAX_LOOPS; i++) {
    if (ready(ch, arg)) {
      seen = true;
      break;
    }
    ums__cpu_relax();
    if ((i & 31) == 0) {
      int64_t now = ums__clock_real();
      if (until == 0)
        until = now + SPIN_NS;
      else if (now >= until)
        break;
    }
  }
  /* Written only when it changes: while spins pay, the line stays
  ** shared between the two sides instead of moving at every element. */
  int32_t was = atomic_load_explicit(&ch->spin_misses, memory_order_relaxed);
  int32_t misses = seen ? (was > 0 ? was - 1 : 0)
                        : (was < 2 * SPIN_MISS_MAX ? was + 2 : was);
  if (misses != was)
    atomic_store_explicit(&ch->spin_misses, misses, memory_order_relaxed);
  return seen;
}

/* Spins until ready(ch, arg), up to SPIN_NS of real time (a virtual
** clock does not move while a party spins), when the peer (the latest
** party of the other side) runs on another scheduler. Returns whether it
** saw that; the caller then tries again. */
static bool spin_until(ums_chan_t *ch, _Atomic(ums__sched_t *) *peer_side,
                       bool (*ready)(ums_chan_t *, void *), void *arg) {
  return spin_worth(ch, peer_side, ums__sched_current()) &&
         spin_loop(ch, ready, arg);
}

static bool ready_room(ums_chan_t *ch, void *arg) {
  (void)arg;
  return has_room(ch);
}

static bool ready_value(ums_chan_t *ch, void *arg) {
  (void)arg;
  return has_value(ch) || is_closed(ch);
}

/* A spinner's spin ends when a sender handed it an element (or close
** ended it), and also when a sender that found no spinner parked instead
** or the channel was closed before the spinner registered. What its spin
** misses, the look under the lock after it finds. */
static bool ready_handed(ums_chan_t *ch, void *arg) {
  return atomic_load_explicit(&((spinner *)arg)->state,
                              memory_order_acquire) != SPIN_WAITING ||
         atomic_load_explicit(&ch->sendq.n, memory_order_relaxed) > 0 ||
         is_closed(ch);
}

/* ---------------------------------------------------------------------- */
/* Unbuffered hand-offs                                                    */
/* ---------------------------------------------------------------------- */

/* Takes the spinner of ch, if one is registered, out of the channel
** (leaving SPIN_CLAIMED for the receiver to clear): the caller then owns
** it until it publishes its state. */
static inline spinner *claim_spinner(ums_chan_t *ch) {
  spinner *sp = atomic_load_explicit(&ch->spinner, memory_order_relaxed);
  while (sp && sp != SPIN_CLAIMED &&
         !atomic_compare_exchange_weak_explicit(&ch->spinner, &sp,
                                                SPIN_CLAIMED,
                                                memory_order_seq_cst,
                                                memory_order_relaxed)) {
  }
  return sp == SPIN_CLAIMED ? NULL : sp;
}

/* Moves src to sp, a spinner the caller claimed, and publishes it: the
** caller's last touch of sp. */
static inline void give_spinner(ums_chan_t *ch, spinner *sp, void *src) {
  move_elem(ch, sp->dst, src);
  atomic_store_explicit(&sp->state, SPIN_GOT, memory_order_release);
}

/* Without the lock: moves src to the receiver spinning on an unbuffered
** channel. PUT_FULL when none spins. The close check comes after the
** claim, so that a send either sees the close or took the spinner before
** close could. */
FAST int send_to_spinner(ums_chan_t *ch, void *src) {
  spinner *sp = claim_spinner(ch);
  if (!sp) return PUT_FULL;
  if (atomic_load_explicit(&ch->tail, memory_order_seq_cst) & T_CLOSED) {
    atomic_store_explicit(&sp->state, SPIN_CLOSED, memory_order_release);
    return PUT_CLOSED;
  }
  give_spinner(ch, sp, src);
  return PUT_OK;
}

/* With the lock held: hands src to a waiting receiver of an unbuffered
** channel (parked or spinning); PUT_FULL when there is none. *wake says
** whether wk holds a receiver to wake after the unlock. */
FAST int send_locked(ums_chan_t *ch, void *src, ums__wake_t *wk,
                     bool *wake) {
  *wake = false;
  if (is_closed(ch)) return PUT_CLOSED;
  ums__waiter_t *r;
  while ((r = ums__wq_first(&ch->recvq)) != NULL) {
    /* The element goes in before the grant publishes the outcome. A
    ** waiter whose state changed has left the queue in the same critical
    ** section (wait.c), so the check only guards the invariant. */
    if (atomic_load_explicit(&r->state, memory_order_relaxed) ==
        UMS__WAITING) {
      move_elem(ch, r->data, src);
      if (ums__waiter_finish(r, 0, wk)) {
        *wake = true;
        return PUT_OK;
      }
    }
    ums__wq_remove(&ch->recvq, r);
  }
  spinner *sp = claim_spinner(ch);
  if (!sp) return PUT_FULL;
  give_spinner(ch, sp, src);
  return PUT_OK;
}

/* With the lock held: takes the element of the first parked sender of an
** unbuffered channel into dst; false if there is none. */
FAST bool recv_locked(ums_chan_t *ch, void *dst, ums__wake_t *wk) {
  ums__waiter_t *s;
  while ((s = ums__wq_first(&ch->sendq)) != NULL) {
    if (atomic_load_explicit(&s->state, memory_order_relaxed) ==
        UMS__WAITING) {
      move_elem(ch, dst, s->data);
      if (ums__waiter_finish(s, 0, wk)) return true;
    }
    ums__wq_remove(&ch->sendq, s);
  }
  return false;
}

/* The spin of a receiver of an unbuffered channel that saw no parked
** sender and no close: registers as the channel's spinner, spins for a
** sender to hand the element to dst, then withdraws unless one did.
** Returns false when nothing ended the receive (it could not register,
** or withdrew: the caller looks under the lock), true with *rc set when
** a sender handed it an element (0) or close ended it (UMS_ECLOSED). */
SLOW bool recv_spin(ums_chan_t *ch, void *dst, int *rc) {
  /* Once a sender has claimed it, the receiver touches only its stack
  ** ("Who may free the channel", at the top): what moving the element
  ** out of buf needs is read now. */
  void (*move)(void *, void *) = ch->ops.move;
  size_t elem = ch->elem;
  _Alignas(LINE) spinner sp;
  atomic_init(&sp.state, SPIN_WAITING);
  sp.dst = elem <= SPIN_INLINE ? sp.buf : dst;
  spinner *none = NULL;
  if (!atomic_compare_exchange_strong_explicit(&ch->spinner, &none, &sp,
                                               memory_order_seq_cst,
                                               memory_order_relaxed))
    return false;
  /* A sender that parks meanwhile (it found no spinner) is seen by the
  ** spin, and after it the receiver looks for parked senders under the
  ** lock. */
  spin_loop(ch, ready_handed, &sp);
  spinner *mine = &sp;
  if (atomic_compare_exchange_strong_explicit(&ch->spinner, &mine, NULL,
                                              memory_order_seq_cst,
                                              memory_order_relaxed))
    return false;
  /* Claimed (mine is SPIN_CLAIMED): the last touch of the channel, after
  ** which the sender, once it published the state, may delete it. */
  atomic_store_explicit(&ch->spinner, NULL, memory_order_release);
  /* Claimed: the claimer publishes state next, holding no lock. */
  int st;
  while ((st = atomic_load_explicit(&sp.state, memory_order_acquire)) ==
         SPIN_WAITING)
    sched_yield();
  if (st == SPIN_GOT && sp.dst != dst) move_as(move, elem, dst, sp.buf);
  *rc = st == SPIN_GOT ? 0 : UMS_ECLOSED;
  return true;
}

/* ---------------------------------------------------------------------- */
/* Blocking calls                                                          */
/* ---------------------------------------------------------------------- */

/* How a call waits: a blocking call parks in ums__wait and gets the
** outcome; a _begin/_end call begins the task's park on the queue and
** returns PARKED, and its _end reads the outcome after the park. Passed
** by value into inlined paths, so that each entry point's form is known
** where it is compiled. */
#define PARKED 1
typedef struct how {
  bool begin;               /* the park-based form */
  ums_park_token_t *token;  /* its park's token, for the caller (or NULL) */
} how_t;

#define BLOCKING ((how_t){false, NULL})
#define BEGIN(token) ((how_t){true, (token)})

/* Queues the caller on q (with the lock held) and waits, or begins its
** park there; the lock is released. Returns the outcome, PARKED, or the
** error of a wait that cannot begin. data is where the other side of an
** unbuffered channel moves the element to or from. */
FAST int wait_on(ums_chan_t *ch, ums__wq_t *q, void *data, int type,
                 int64_t deadline, how_t how) {
  if (how.begin)
    return ums__park_on(q, &ch->lock, deadline, 0, type, ch, 0, data, 0,
                        how.token);
  ums__waiter_t w;
  int r = ums__waiter_init(&w, q, &ch->lock);
  if (r) {
    ums__unlock(&ch->lock);
    return r;
  }
  w.data = data;
  w.type = (uint8_t)type;
  w.obj = ch;
  ums__wq_push(q, &w);
  return ums__wait(&w, deadline);
}

static int send_buffered(ums_chan_t *ch, void *src, int64_t deadline,
                         bool poll, how_t how) {
  for (int looks = 0;; looks++) {
    int r = put_now(ch, src);
    if (r == PUT_FULL && !poll && looks == 0 &&
        spin_until(ch, &ch->recv_sched, ready_room, NULL))
      r = put_now(ch, src);
    if (r == PUT_OK) return 0;
    if (r == PUT_CLOSED) return UMS_ECLOSED;
    if (poll) return UMS_EAGAIN;
    ums__lock(&ch->lock);
    if (!may_park_send(ch)) {
      /* A receiver claimed a slot and is still moving its element out,
      ** or the close: look again. */
      ums__unlock(&ch->lock);
      if (looks > 0) sched_yield();
      continue;
    }
    r = wait_on(ch, &ch->sendq, NULL, UMS_WAIT_CHAN_SEND, deadline, how);
    if (r != 0) return r; /* PARKED, ECLOSED, ETIMEDOUT, ECANCELED */
    looks = 0;
  }
}

static int recv_buffered(ums_chan_t *ch, void *dst, int64_t deadline,
                         bool poll, how_t how) {
  for (int looks = 0;; looks++) {
    if (take_now(ch, dst)) return 0;
    if (is_closed(ch)) {
      if (drained(ch)) return UMS_ECLOSED;
      /* A send claimed a slot before the close and is still filling it:
      ** it takes no longer than a move. */
      if (poll) return UMS_EAGAIN;
      sched_yield();
      continue;
    }
    if (!poll && looks == 0 &&
        spin_until(ch, &ch->send_sched, ready_value, NULL))
      continue;
    if (poll) return UMS_EAGAIN;
    ums__lock(&ch->lock);
    if (!may_park_recv(ch)) {
      ums__unlock(&ch->lock);
      if (looks > 1) sched_yield();
      continue;
    }
    int r = wait_on(ch, &ch->recvq, NULL, UMS_WAIT_CHAN_RECV, deadline, how);
    /* Granted or closed: look again (a close still lets the ring
    ** drain). */
    if (r == PARKED || (r < 0 && r != UMS_ECLOSED)) return r;
    looks = 0;
  }
}

FAST int send_unbuffered(ums_chan_t *ch, void *src, int64_t deadline,
                         bool poll, how_t how) {
  int r = send_to_spinner(ch, src);
  if (r == PUT_OK) return 0;
  if (r == PUT_CLOSED) return UMS_ECLOSED;
  ums__wake_t wk;
  bool wake;
  ums__lock(&ch->lock);
  r = send_locked(ch, src, &wk, &wake);
  if (r != PUT_FULL || poll) {
    ums__unlock(&ch->lock);
    if (wake) ums__wake(&wk);
    return r == PUT_OK ? 0 : r == PUT_CLOSED ? UMS_ECLOSED : UMS_EAGAIN;
  }
  return wait_on(ch, &ch->sendq, src, UMS_WAIT_CHAN_SEND, deadline, how);
}

/* me: the caller's scheduler. */
FAST int recv_unbuffered(ums_chan_t *ch, void *dst, int64_t deadline,
                         bool poll, how_t how, ums__sched_t *me) {
  int rc;
  if (!poll && spin_worth(ch, &ch->send_sched, me) &&
      atomic_load_explicit(&ch->sendq.n, memory_order_relaxed) == 0 &&
      !is_closed(ch) && recv_spin(ch, dst, &rc))
    return rc;
  ums__wake_t wk;
  ums__lock(&ch->lock);
  if (recv_locked(ch, dst, &wk)) {
    ums__unlock(&ch->lock);
    ums__wake(&wk);
    return 0;
  }
  bool closed = is_closed(ch);
  if (closed || poll) {
    ums__unlock(&ch->lock);
    return closed ? UMS_ECLOSED : UMS_EAGAIN;
  }
  return wait_on(ch, &ch->recvq, dst, UMS_WAIT_CHAN_RECV, deadline, how);
}

FAST int chan_send(ums_chan_t *ch, void *elem, int64_t deadline, bool poll,
                   how_t how) {
  if (!ch || (!elem && ch->elem)) return UMS_EINVAL;
  note_side(&ch->send_sched, ums__sched_current());
  return ch->ring ? send_buffered(ch, elem, deadline, poll, how)
                  : send_unbuffered(ch, elem, deadline, poll, how);
}

FAST int chan_recv(ums_chan_t *ch, void *elem, int64_t deadline, bool poll,
                   how_t how) {
  if (!ch || (!elem && ch->elem)) return UMS_EINVAL;
  ums__sched_t *me = ums__sched_current();
  note_side(&ch->recv_sched, me);
  return ch->ring ? recv_buffered(ch, elem, deadline, poll, how)
                  : recv_unbuffered(ch, elem, deadline, poll, how, me);
}

int ums_chan_send(ums_chan_t *ch, const void *elem, int64_t deadline) {
  return chan_send(ch, (void *)elem, deadline, false, BLOCKING);
}

int ums_chan_recv(ums_chan_t *ch, void *elem, int64_t deadline) {
  return chan_recv(ch, elem, deadline, false, BLOCKING);
}

int ums_chan_try_send(ums_chan_t *ch, const void *elem) {
  return chan_send(ch, (void *)elem, 0, true, BLOCKING);
}

int ums_chan_try_recv(ums_chan_t *ch, void *elem) {
  return chan_recv(ch, elem, 0, true, BLOCKING);
}

/* ---------------------------------------------------------------------- */
/* Park-based calls                                                        */
/* ---------------------------------------------------------------------- */

/* The same paths, with the park begun on the channel's queue instead of
** waited for (ums__park_begin_queued): the task's own park waiter sits on
** sendq or recvq, and every granter above ends it as it ends a blocking
** waiter. An unbuffered channel's parked side has its element moved by
** the other side (hence elem must outlive the park); a buffered one's
** wake-up is "look again", which _end does, perhaps beginning another
** park. */

int ums_chan_send_begin(ums_chan_t *ch, void *elem, int64_t deadline,
                        ums_park_token_t *token) {
  return chan_send(ch, elem, deadline, false, BEGIN(token));
}

int ums_chan_send_end(ums_chan_t *ch, void *elem, int64_t deadline,
                      ums_park_token_t *token) {
  if (!ch || (!elem && ch->elem)) return UMS_EINVAL;
  int r = ums__park_outcome(&ch->sendq, NULL);
  if (!ch->ring || r != 0) return r;
  return send_buffered(ch, elem, deadline, false, BEGIN(token));
}

int ums_chan_recv_begin(ums_chan_t *ch, void *elem, int64_t deadline,
                        ums_park_token_t *token) {
  return chan_recv(ch, elem, deadline, false, BEGIN(token));
}

int ums_chan_recv_end(ums_chan_t *ch, void *elem, int64_t deadline,
                      ums_park_token_t *token) {
  if (!ch || (!elem && ch->elem)) return UMS_EINVAL;
  int r = ums__park_outcome(&ch->recvq, NULL);
  if (!ch->ring || (r != 0 && r != UMS_ECLOSED)) return r;
  return recv_buffered(ch, elem, deadline, false, BEGIN(token));
}

int ums_chan_close(ums_chan_t *ch) {
  if (!ch) return UMS_EINVAL;
  ums__lock(&ch->lock);
  if (atomic_fetch_or_explicit(&ch->tail, T_CLOSED, memory_order_acq_rel) &
      T_CLOSED) {
    ums__unlock(&ch->lock);
    return UMS_ECLOSED;
  }
  spinner *sp = claim_spinner(ch);
  if (sp) atomic_store_explicit(&sp->state, SPIN_CLOSED, memory_order_release);
  /* Parked receivers of an unbuffered channel and parked senders learn
  ** of the close now; parked receivers of a buffered one look again and
  ** drain it first. A woken party may free the channel, so the wake-ups
  ** run after the last touch of it. */
  ums__wakelist_t wl;
  ums__wakelist_init(&wl);
  ums__wq_grant_all(&ch->recvq, UMS_ECLOSED, &wl);
  ums__wq_grant_all(&ch->sendq, UMS_ECLOSED, &wl);
  ums__unlock(&ch->lock);
  ums__wakelist_run(&wl);
  return 0;
}

int ums_chan_closed(ums_chan_t *ch) { return ch && is_closed(ch); }

size_t ums_chan_len(ums_chan_t *ch) {
  if (!ch || !ch->ring) return 0;
  size_t n = ring_len(ch) +
             atomic_load_explicit(&ch->nspill, memory_order_relaxed);
  return n > ch->cap ? ch->cap : n;
}

size_t ums_chan_cap(ums_chan_t *ch) { return ch ? ch->cap : 0; }

int ums_chan_delete(ums_chan_t *ch) {
  if (!ch) return UMS_EINVAL;
  ums__lock(&ch->lock);
  /* A side that moved its element and owes a wake-up leaves `waking`
  ** under this lock, a claimed spinner clears SPIN_CLAIMED without it:
  ** wait for both (neither holds another lock). */
  while (atomic_load(&ch->waking) != 0 ||
         atomic_load(&ch->spinner) == SPIN_CLAIMED) {
    ums__unlock(&ch->lock);
    sched_yield();
    ums__lock(&ch->lock);
  }
  bool busy = atomic_load(&ch->sendq.n) || atomic_load(&ch->recvq.n) ||
              atomic_load(&ch->spinner);
  ums__unlock(&ch->lock);
  if (busy) return UMS_EBUSY;
  if (ch->ring) {
    size_t h = H_POS(atomic_load(&ch->head));
    size_t t = T_POS(atomic_load(&ch->tail));
    for (size_t pos = h; pos < t; pos++)
      clear_elem(ch, slot_elem(ch, slot_at(ch, pos)));
    free(ch->ring);
  }
  size_t n = atomic_load(&ch->nspill);
  for (size_t i = 0; i < n; i++) clear_elem(ch, spill_elem(ch, i));
  free(ch->spill);
  free(ch);
  return 0;
}
