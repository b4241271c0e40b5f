/*
** internal.h: the runtime's internal vocabulary, shared by the files of
** runtime/src. Names with the ums__ prefix cross files; statics inside a
** file have bare names. Every struct member says which thread may touch
** it:
**   [owner]  only the thread currently running the owning scheduler;
**   [lock]   under the named lock;
**   [atomic] any thread, through atomics;
**   [const]  written before the object is shared, read-only after.
*/
#ifndef UMS_INTERNAL_H
#define UMS_INTERNAL_H

#include "ums-binding.h"
#include "ums-list.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define UMS__CACHELINE 64
#define UMS__ALIGNED __attribute__((aligned(UMS__CACHELINE)))

/* Memory for n bytes starting on a cache line, rounded up to whole lines
** (C11's aligned_alloc wants a multiple of the alignment); free() frees
** it. For objects whose type has UMS__ALIGNED members or whose first
** line two threads share. */
static inline void *ums__cacheline_alloc(size_t n) {
  return aligned_alloc(UMS__CACHELINE,
                       (n + UMS__CACHELINE - 1) & ~(size_t)(UMS__CACHELINE - 1));
}
/* Zeroed memory for large tables of which a short runtime touches a few
** pages (the runtime itself with its chunk index, the task table's
** chunks), page-aligned (so cache-line aligned too), or NULL. It comes
** from the kernel, zeroed page by page as it is touched, or from a region
** of the same size a previous runtime gave back (pages.c): calloc from the
** heap would clear every byte on each runtime's start. The caller gives
** it back with ums__pages_free(p, n, zeroed): zeroed says p is all zero
** again (the caller cleared what it used), so that it may be kept. */
void *ums__pages_alloc(size_t n);
void ums__pages_free(void *p, size_t n, bool zeroed);
#define UMS__LIKELY(x) __builtin_expect(!!(x), 1)
#define UMS__UNLIKELY(x) __builtin_expect(!!(x), 0)
/* For internal symbols on a hot path: the runtime is linked into a shared
** Lua module, where a default-visibility symbol is reached through the
** PLT or the GOT. */
#define UMS__HIDDEN __attribute__((visibility("hidden")))
#define UMS__CONTAINER_OF(p, type, member) \
  ((type *)((char *)(p) - offsetof(type, member)))

typedef struct ums__sched ums__sched_t;
typedef struct ums__task ums__task_t;
typedef struct ums__worker ums__worker_t;
typedef struct ums__waiter ums__waiter_t;

/* ====================================================================== */
/* Spinlock (its slow path: clock.c)                                      */
/* ====================================================================== */

/* A test-and-test-and-set lock for the short critical sections of wait
** queues. Holders never block or make system calls while holding one;
** a spinner that waits long gives its CPU away with sched_yield, because
** on an oversubscribed VM the holder may have been preempted. */
typedef struct { _Atomic int locked; } ums__lock_t;

void ums__lock_slow(ums__lock_t *l);

static inline void ums__lock(ums__lock_t *l) {
  if (UMS__LIKELY(!atomic_exchange_explicit(&l->locked, 1,
                                            memory_order_acquire)))
    return;
  ums__lock_slow(l);
}
static inline bool ums__trylock(ums__lock_t *l) {
  return !atomic_load_explicit(&l->locked, memory_order_relaxed) &&
         !atomic_exchange_explicit(&l->locked, 1, memory_order_acquire);
}
static inline void ums__unlock(ums__lock_t *l) {
  atomic_store_explicit(&l->locked, 0, memory_order_release);
}

/* One step of a spin-wait: tells the CPU (and a hyperthread sibling) that
** this is a busy loop. */
static inline void ums__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Adaptive spinning (pool.c, sched.c). A spin-wait for another thread
** pays only when that thread runs on another CPU and answers within a few
** microseconds; on a crowded machine the spinner holds the very CPU its
** partner waits for, and a round trip takes longer with the spin than
** without it. Each spin site
** keeps a running average of how long its spins took, a miss counting as
** twice the limit; above a quarter of the limit it sleeps at once, and
** spins anyway every UMS__SPIN_PROBE-th time to notice calmer times. */
#define UMS__SPIN_PROBE 32
typedef struct ums__spin_gauge {
  int64_t avg;      /* ns */
  uint32_t skipped; /* sleeps without a spin since the last probe */
} ums__spin_gauge_t;

static inline bool ums__spin_worth(ums__spin_gauge_t *g, int64_t limit) {
  if (g->avg <= limit / 4) return true;
  if (++g->skipped < UMS__SPIN_PROBE) return false;
  g->skipped = 0;
  return true;
}

static inline void ums__spin_note(ums__spin_gauge_t *g, int64_t took,
                                  bool hit, int64_t limit) {
  g->avg += ((hit ? took : 2 * limit) - g->avg) / 8;
}

/* ====================================================================== */
/* Clock and futex (clock.c)                                               */
/* ====================================================================== */

/* The clock the runtime's code reads: real CLOCK_MONOTONIC, except on the
** thread of a scheduler whose runtime has a virtual clock, where it is
** that runtime's virtual time. Anything that measures real waiting (spins,
** the idle wait's kernel timeouts) reads ums__clock_real instead. */
int64_t ums__clock_now(void);
int64_t ums__clock_real(void);
/* Moves rt's virtual clock forward to `to` (never back). [owner of the
** runtime's one scheduler] */
void ums__clock_advance(ums_runtime_t *rt, int64_t to);
/* Blocks while *addr == expected, until woken or the absolute monotonic
** deadline (UMS_FOREVER: none). Returns 0, or -ETIMEDOUT, -EAGAIN, -EINTR
** as the kernel says; callers always re-check their condition. */
int ums__futex_wait(_Atomic uint32_t *addr, uint32_t expected,
                    int64_t deadline);
void ums__futex_wake(_Atomic uint32_t *addr, int n);

/* ====================================================================== */
/* The runtime's OS threads (thread.c)                                     */
/* ====================================================================== */

/* A thread of the runtime's own (a scheduler's, the monitor's), created
** or taken from the idle threads kept for the process. */
typedef struct ums__thread ums__thread_t;

/* Runs fn(arg) on a thread, with signal mask *mask (NULL: the caller's)
** and, if name is not NULL, that thread name. Returns 0 and the thread
** in *out, UMS_EAGAIN or UMS_ENOMEM. The caller owns the thread until it
** passes it to ums__thread_join. */
int ums__thread_start(ums__thread_t **out, void *(*fn)(void *), void *arg,
                      const sigset_t *mask, const char *name);
/* Waits for fn to return. Then, while fewer than keep (and the process's
** bound) are kept, the thread parks for a later ums__thread_start;
** otherwise it exits and is joined. Either way th is no longer the
** caller's. */
void ums__thread_join(ums__thread_t *th, int keep);
/* ums__thread_join, for a role whose function may be skipped: if the
** thread has not taken fn yet, it never will (a kept thread that has not
** woken up yet costs no wait). */
void ums__thread_stop(ums__thread_t *th, int keep);
/* The thread's pthread handle, while the caller owns it. */
pthread_t ums__thread_handle(const ums__thread_t *th);
/* Idle threads kept for the process right now. */
int ums__thread_kept(void);

/* ====================================================================== */
/* The stamp clock (stamp.c): cheap readings for statistics               */
/* ====================================================================== */

/* Monotonic nanoseconds for timing waits, where a reading must cost as
** little as possible: the CPU's time stamp counter (x86-64: rdtsc when
** the kernel itself uses it as its clocksource; aarch64: cntvct_el0)
** scaled to nanoseconds, with clock_gettime as the fallback and until the
** counter's rate has been measured against CLOCK_MONOTONIC (done once per
** process, over the first ~100 ms of readings). Only differences of
** stamps mean anything; do not mix them with ums__clock_now() readings.
** UMS_STAMP_CLOCK=gettime in the environment forces the fallback. */
typedef struct ums__stamp_clock {
  _Atomic int ready;           /* 1 once the fields below are set */
  uint64_t tsc0;               /* [const once ready] counter at ns0 */
  int64_t ns0;                 /* [const once ready] */
  uint64_t mult;               /* [const once ready] ns per tick << 32 */
} ums__stamp_clock_t;

extern ums__stamp_clock_t ums__stamp UMS__HIDDEN;

UMS__HIDDEN int64_t ums__stamp_slow(void);

static inline uint64_t ums__stamp_ticks(void) {
#if defined(__x86_64__)
  return __builtin_ia32_rdtsc();
#elif defined(__aarch64__)
  uint64_t v;
  __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(v));
  return v;
#else
  return 0;
#endif
}

static inline int64_t ums__stamp_now(void) {
  if (UMS__LIKELY(atomic_load_explicit(&ums__stamp.ready,
                                       memory_order_acquire))) {
    uint64_t d = ums__stamp_ticks() - ums__stamp.tsc0;
    return ums__stamp.ns0 +
           (int64_t)(((unsigned __int128)d * ums__stamp.mult) >> 32);
  }
  return ums__stamp_slow();
}

/* ====================================================================== */
/* Context switch (ctx.c + ctx-x86_64.S / ctx-aarch64.S, or ctx-ucontext.c) */
/* ====================================================================== */

/* An execution context. The layout is private to the ctx-* file in the
** build; only the members named here are shared. */
typedef struct ums__ctx {
  void *sp;              /* asm backends: saved stack pointer */
  void *uc;              /* ucontext backend: its ucontext_t (heap) */
  void *tsan_fiber;      /* TSan builds: the fiber handle */
  const void *stack_lo;  /* sanitizer annotations: stack bounds */
  size_t stack_size;
  void *asan_fake;       /* ASan: fake stack saved across a switch */
  void (*fn)(void *);    /* entry point and argument of a fresh context */
  void *arg;
} ums__ctx_t;

/* Describes the calling thread's own context (the scheduler thread's
** stack), so that it can be switched away from and back to. */
int ums__ctx_init_main(ums__ctx_t *ctx);
/* Prepares ctx to start fn(arg) on [stack_lo, stack_lo + size) at the next
** switch to it, on a clean frame at the top of the stack. fn must never
** return (it switches away for good). May be called again on the same
** memory to restart the context, but never on the running context. A
** ums__ctx_t must be zeroed before its first ctx_make or ctx_init_main:
** on a restart, leftover sanitizer state is reused, and garbage there
** cannot be told from it. fn == NULL marks a main context. */
int ums__ctx_make(ums__ctx_t *ctx, void *stack_lo, size_t size,
                  void (*fn)(void *), void *arg);
/* Saves the current context into from and resumes to. Returns when some
** context switches back to from. */
void ums__ctx_switch(ums__ctx_t *from, ums__ctx_t *to);
/* Releases what ctx_make or ctx_init_main allocated (ucontext, TSan) and
** zeroes ctx. Never on the running context; a main context's own TSan
** fiber is left alone. */
void ums__ctx_destroy(ums__ctx_t *ctx);
/* "asm-x86_64", "asm-aarch64" or "ucontext". */
const char *ums__ctx_kind(void);

/* ====================================================================== */
/* Stacks (stack.c)                                                        */
/* ====================================================================== */

/* A fiber stack with a guard page below it. Stacks are carved from large
** slab mappings; guard pages are installed with MADV_GUARD_INSTALL where
** the kernel has it (Linux 6.13+), which does not split the mapping, so
** 100,000 stacks cost a handful of VMAs instead of 200,000 (the default
** vm.max_map_count is 65,530). Older kernels fall back to mprotect guard
** pages, two VMAs per stack. */
typedef struct ums__stack {
  void *lo;                  /* lowest usable byte (just above the guard) */
  size_t size;               /* usable bytes */
  struct ums__slab *slab;    /* the slab it was carved from */
  uint32_t index;            /* its slot in the slab */
} ums__stack_t;

/* Per-scheduler stack allocator. [owner] */
typedef struct ums__stack_pool {
  size_t stack_size;         /* usable size, page multiple */
  size_t slot_size;          /* stack_size + guard */
  ums_list_t slabs;          /* of struct ums__slab: slabs with at least
                                one free slot first */
  size_t nslabs;
  size_t in_use;             /* stacks handed out */
  int guard_mode;            /* 0 unknown, 1 madvise guard, 2 mprotect */
} ums__stack_pool_t;

/* UMS_STACK_GUARD=mprotect in the environment forces the mprotect guard
** (to test the fallback on a kernel that has the madvise one). */
int ums__stack_pool_init(ums__stack_pool_t *p, size_t stack_size);
/* Frees every slab (empty ones may be kept for the next pool: stack.c);
** every stack must have been freed. */
void ums__stack_pool_destroy(ums__stack_pool_t *p);
int ums__stack_alloc(ums__stack_pool_t *p, ums__stack_t *out);
/* Returns the stack; its memory is given back to the kernel
** (MADV_DONTNEED), and a slab left empty is unmapped. */
void ums__stack_free(ums__stack_pool_t *p, ums__stack_t *st);
/* The guard method in use: "madvise", "mprotect" or "unknown". */
const char *ums__stack_guard_kind(const ums__stack_pool_t *p);

/* ====================================================================== */
/* Timers (timer.c)                                                        */
/* ====================================================================== */

typedef struct ums__timer ums__timer_t;
typedef void (*ums__timer_cb)(ums__sched_t *s, ums__timer_t *t);

/* A timer node embedded in its owner (a task), so arming never allocates
** beyond the heap array, which is reserved ahead (one slot per task). */
struct ums__timer {
  int64_t deadline;          /* [owner] absolute monotonic ns */
  uint64_t seq;              /* [owner] arm order, breaks deadline ties */
  uint32_t index;            /* [owner] heap slot + 1; 0 when not armed */
  ums__timer_cb cb;          /* [owner] run by the scheduler pass */
};

/* A binary min-heap of timer pointers ordered by (deadline, arm order). */
typedef struct ums__timer_heap {
  ums__timer_t **nodes;      /* [owner] */
  uint32_t n, cap;           /* [owner] */
  uint64_t seq;              /* [owner] arms so far */
  uint64_t looked;           /* [owner] seq when ums__timer_expire last
                                began: timers armed from it on are fresh */
} ums__timer_heap_t;

void ums__timer_heap_init(ums__timer_heap_t *h);
void ums__timer_heap_destroy(ums__timer_heap_t *h);
/* Makes room for at least n armed timers. */
int ums__timer_heap_reserve(ums__timer_heap_t *h, uint32_t n);
void ums__timer_arm(ums__timer_heap_t *h, ums__timer_t *t, int64_t deadline);
void ums__timer_disarm(ums__timer_heap_t *h, ums__timer_t *t);
static inline bool ums__timer_armed(const ums__timer_t *t) {
  return t->index != 0;
}
/* The earliest deadline, or UMS_FOREVER. */
static inline int64_t ums__timer_next(const ums__timer_heap_t *h) {
  return h->n ? h->nodes[0]->deadline : UMS_FOREVER;
}
/* Pops every timer due at now and runs its callback. Returns how many.
** A timer armed since the previous call that is due already was due when
** it was armed (the scheduler looks between every two steps): the task
** it wakes queues as a yield does, not ahead of the run queue. */
int ums__timer_expire(ums__sched_t *s, ums__timer_heap_t *h, int64_t now);

/* ====================================================================== */
/* Waits (wait.c)                                                          */
/* ====================================================================== */

/* Outcome values of a waiter's state. 0 means granted; negative values are
** UMS_E* codes (UMS_ETIMEDOUT, UMS_ECANCELED, UMS_ECLOSED, ...). */
#define UMS__WAITING 0x80000000u  /* no outcome is INT_MIN */

/* A FIFO of waiters, guarded by the lock of the object that owns it. */
typedef struct ums__wq {
  ums_list_t list;             /* [lock] of ums__waiter_t.link */
  _Atomic size_t n;            /* [lock] to write; any thread may read
                                  it (a channel's lock-free paths) */
} ums__wq_t;

/* One wait of one task (or host thread) on one queue. It lives on the
** waiting stack (the task's fiber stack or the host thread's stack), so
** waiting never allocates.
**
** Exactly one outcome wins: every state change from UMS__WAITING is a CAS
** made while holding *lock (when the wait is on a queue), and the winner
** unlinks the waiter. The waker captures what it needs to wake (task or
** futex address) before the CAS, because a host thread may return and pop
** its stack frame as soon as it sees the new state. */
struct ums__waiter {
  ums_link_t link;             /* [lock] on wq's list */
  ums__wq_t *wq;               /* [const during the wait] NULL: no queue */
  ums__lock_t *lock;           /* [const] the lock guarding wq, or NULL */
  _Atomic uint32_t state;      /* [atomic] UMS__WAITING or the outcome as
                                  (uint32_t)code */
  ums__task_t *task;           /* [const] the waiting task; NULL: a host
                                  thread blocked on a futex on &state */
  void *data;                  /* [lock] primitive-specific payload */
  int64_t aux;                 /* [lock] primitive-specific */
  bool linked;                 /* [lock] on wq now */
  bool nocancel;               /* [const] cancellation waits for the end of
                                  this wait (a condition variable's
                                  relock) */
  /* What the wait is, for observers (waitstats.c); set by the primitive after
  ** ums__waiter_init, which makes it UMS_WAIT_PARK with no object. */
  uint8_t type;                /* [const during the wait] UMS_WAIT_* */
  const void *obj;             /* [const during the wait] */
  uint64_t blocker;            /* [const during the wait] a task id */
};

/* Queue and unlink w, with q's lock held. n changes only under that lock,
** so a plain load and store update it: other threads only read it, and
** an atomic store is all they need to see whole values. */
static inline void ums__wq_push(ums__wq_t *q, ums__waiter_t *w) {
  ums_list_push_back(&q->list, &w->link);
  atomic_store_explicit(
      &q->n, atomic_load_explicit(&q->n, memory_order_relaxed) + 1,
      memory_order_relaxed);
  w->linked = true;
}
static inline void ums__wq_remove(ums__wq_t *q, ums__waiter_t *w) {
  if (!w->linked) return;
  ums_list_remove(&q->list, &w->link);
  w->linked = false;
  atomic_store_explicit(
      &q->n, atomic_load_explicit(&q->n, memory_order_relaxed) - 1,
      memory_order_relaxed);
}
static inline ums__waiter_t *ums__wq_first(const ums__wq_t *q) {
  return UMS_LIST_ENTRY(q->list.head, ums__waiter_t, link);
}

/* What a waker needs after the lock is released. */
typedef struct ums__wake {
  ums__task_t *task;
  _Atomic uint32_t *futex;
} ums__wake_t;

/* ums__waiter_init, ums__waiter_init_nocancel: prepare a wait by the
** caller (below, after the task). */

/* Parks the caller until an outcome wins or the deadline passes (then
** UMS_ETIMEDOUT). Call with *w->lock held and w already pushed on its wq;
** the lock is released. Returns the outcome (0 or a UMS_E* code). */
int ums__wait(ums__waiter_t *w, int64_t deadline);

/* Tries to end the wait with outcome (0 = granted). Call with *w->lock
** held. On success unlinks w, fills *wk, returns true; the caller must call
** ums__wake(wk) after releasing the lock. */
static inline bool ums__waiter_finish(ums__waiter_t *w, int outcome,
                                      ums__wake_t *wk) {
  if (atomic_load_explicit(&w->state, memory_order_relaxed) != UMS__WAITING)
    return false;
  /* Read everything the wake needs before publishing the outcome: a host
  ** thread may return, and its stack frame (w) die, right after. */
  wk->task = w->task;
  wk->futex = w->task ? NULL : &w->state;
  if (w->wq) ums__wq_remove(w->wq, w);
  atomic_store_explicit(&w->state, (uint32_t)outcome, memory_order_release);
  return true;
}

/* Pops waiters from q until one can be granted; returns it (unlinked,
** outcome set, *wk filled) or NULL. Call with the lock held. */
ums__waiter_t *ums__wq_grant_first(ums__wq_t *q, int outcome,
                                   ums__wake_t *wk);

/* ums__wake: wakes what ums__waiter_finish captured (below, after
** ums__task_ready). */

/* Wake-ups gathered under an object's lock and run after the last unlock.
** A woken waiter may free the object at once (a completion semaphore on
** its stack), so a waker granting several waiters must not touch the
** object between wakes. Tasks chain through t->wake_next; host threads'
** futex addresses go in a small array, and past its size are woken at
** once (a system call under the lock, rare and still correct). */
#define UMS__WAKELIST_FUTEX 8
typedef struct ums__wakelist {
  ums__task_t *head, *tail;
  _Atomic uint32_t *futex[UMS__WAKELIST_FUTEX];
  int nfutex;
} ums__wakelist_t;

static inline void ums__wakelist_init(ums__wakelist_t *wl) {
  wl->head = wl->tail = NULL;
  wl->nfutex = 0;
}
void ums__wakelist_add(ums__wakelist_t *wl, const ums__wake_t *wk);
void ums__wakelist_run(ums__wakelist_t *wl);
/* Grants every waiter of q with outcome into wl. Call with the lock held. */
void ums__wq_grant_all(ums__wq_t *q, int outcome, ums__wakelist_t *wl);

/* Ends a wait from the outside (timeout or cancel): takes w->lock if any,
** tries the outcome, wakes. Called by the owner scheduler. */
void ums__waiter_abort(ums__waiter_t *w, int outcome);
/* The task's wait timer (t->timer), which wait.c owns: one per task, armed
** when a wait with a deadline begins (ums__wait for fibers,
** ums__park_after_step for step tasks), fired by the scheduler's timer
** heap (ums__wait_timeout ends the wait with UMS_ETIMEDOUT), and stopped
** when the wait ends or the task finishes. ums__wait_timer_init,
** _arm and _stop are inline (after the scheduler's struct, below): a
** spawn and every timed wait pass through them. [owner] */
void ums__wait_timeout(ums__sched_t *s, ums__timer_t *tm);

/* ====================================================================== */
/* Tasks (task.c)                                                          */
/* ====================================================================== */

enum ums__task_state {
  UMS__T_FREE = 0,    /* on a free list */
  UMS__T_NEW,         /* spawned, on its way to its scheduler's inbox */
  UMS__T_PENDING,     /* waiting for a worker slot (max_workers) */
  UMS__T_RUNNABLE,    /* in the runnable queue or the completion list */
  UMS__T_RUNNING,
  UMS__T_PARKED,      /* waiting */
  UMS__T_DONE         /* finished; result kept for the joiner */
};

#define UMS__TASK_NAME_MAX 32

struct ums__task {
  /* Identity and joining: any thread. */
  _Atomic uint64_t id;         /* [atomic] handle; 0 while free. Set to
                                  0 under lock (retiring), to a new id by
                                  the spawner without it (task.c); read
                                  under lock: ums__task_id_locked */
  ums__lock_t lock;            /* guards joiners, done, joined */
  _Atomic int refs;            /* [atomic] alive + handle + queued cancel */
  _Atomic int cancelled;       /* [atomic] cancel requested (sticky) */
  _Atomic int cancel_queued;   /* [atomic] on the sched's cancel list */
  _Atomic int break_wait;      /* [atomic] the deadlock detector asks to
                                  end a wait that cancellation cannot end
                                  (sched.c, "Deadlocks"); delivered with
                                  the cancels, cleared on delivery */
  bool done;                   /* [lock] finished */
  bool joining;                /* [lock] a joiner is waiting */
  bool detached;               /* [lock] no handle reference */
  ums__wq_t joiners;           /* [lock] */

  /* Links. */
  ums__task_t *next;           /* [owner] run queue, free list */
  ums_link_t pend;             /* [owner] on the pending list (a cancel
                                  unlinks it from the middle) */
  ums__task_t *inbox_next;     /* [atomic via the inbox push] */
  ums__task_t *cancel_next;    /* [atomic via the cancel list push] */
  ums__task_t *wake_next;      /* [the winning waker] wake list */

  /* Execution: the owner scheduler. */
  ums__sched_t *sched;         /* [const after placement] */
  ums__worker_t *worker;       /* [owner] NULL until started */
  int state;                   /* [owner] enum ums__task_state */
  ums__waiter_t *wait;         /* [owner] the current wait, or NULL */
  ums__timer_t timer;          /* [owner] deadline of the current wait */
  ums_task_fn fn;              /* [const] C task: runs on its own worker */
  ums_step_fn step;            /* [const] step task: stepped on any worker */
  void *arg;                   /* [const] */
  bool started;                /* [owner] picked to run at least once */
  int start_err;               /* [owner] why the task cannot run (a step
                                  task's last step: sched.c), else 0 */
  bool live_own;               /* [owner; the spawner before placement]
                                  counted in its scheduler's nlive_own
                                  instead of rt->live (task.c) */

  /* Parking (park.c): a waiter embedded in the task, so a step task can
  ** park with no stack frame to hold its wait record. */
  ums__waiter_t park;          /* [state: atomic, changed from WAITING
                                  only under t->lock, or for a local park
                                  (UMS_PARK_LOCAL) only by the owner's
                                  thread; the rest: owner]
                                  task, lock and wq are set once, when
                                  the task is allocated */
  _Atomic uint64_t park_seq;   /* [atomic; written by the owner] sequence
                                  of the current park; its top bit is
                                  UMS__PARK_SEQ_LOCAL */
  int64_t park_deadline;       /* [owner] */
  bool park_pending;           /* [owner] begun, not yet waited or parked */
  void *result;                /* [owner, then lock once done] */
  int status;                  /* [owner, then lock once done] */
  uint32_t slot;               /* [const] index in the runtime's table */
  uint32_t gen;                /* [the spawner of the free record]
                                  generation of the current id */
  char name[UMS__TASK_NAME_MAX]; /* [lock; before the id is published, the
                                  spawner] */
  uint64_t spawner;            /* [lock; before the id is published, the
                                  spawner] the spawning task's id, 0: a
                                  host thread */

  /* Observation (waitstats.c, stats.c, monitor.c). Written by the owner
  ** scheduler (obs and ready_at also by the task's waker, before it hands
  ** the task over; cpu_ns by the monitor), read by any thread with
  ** relaxed loads: a reader holds t->lock, which keeps the task from
  ** being recycled, so it sees one task's values, if not one instant's. */
  _Atomic uint32_t obs;        /* UMS__OBS(UMS_TASK_*, UMS_WAIT_*): its
                                  state, and the wait in progress or the
                                  one it was woken from until it runs; one
                                  word, so that a switch stores both at
                                  once */
  _Atomic(const void *) wait_obj;
  _Atomic uint64_t wait_blocker;
  _Atomic int64_t wait_since;  /* stamp when the wait began; 0: untimed */
  _Atomic int64_t ready_at;    /* stamp when it was woken; 0: not yet */
  _Atomic int64_t cpu_ns;      /* sampled running time */
};

/* The task table: chunks of tasks that are never freed while the runtime
** lives (type-stable memory), so any thread can look a handle up and
** compare its generation without a lock. */
#define UMS__TASK_CHUNK 1024
#define UMS__TASK_MAX_CHUNKS 16384   /* 16 M tasks */

/* Handle layout: generation in the high 32 bits (never 0), slot low. */
static inline uint32_t ums__id_slot(uint64_t id) { return (uint32_t)id; }

/* Drops one reference; the last one recycles the task. */
void ums__task_unref(ums_runtime_t *rt, ums__task_t *t);
/* ums__task_lookup (below, after the runtime's struct): finds a live task
** by handle, or NULL. The pointer is type-stable; the caller re-checks
** t->id under t->lock before trusting it. */
static inline ums__task_t *ums__task_lookup(ums_runtime_t *rt, uint64_t id);
/* Marks t finished (result and status set), wakes its joiner. [owner] */
void ums__task_finish(ums__task_t *t);
/* Delivers a pending cancellation to a parked task, or the break that
** ums__task_break asked for. [owner] */
void ums__task_deliver_cancel(ums__task_t *t);
/* Ends task id's wait with UMS_EDEADLK if it is one that cancellation
** cannot end (UMS_PARK_NOCANCEL), without cancelling the task: for the
** deadlock detector only, when nothing else could ever end that wait.
** Any thread inside the runtime. Returns 0 or UMS_ESRCH. */
int ums__task_break(ums_runtime_t *rt, ums_task_t id);

/* t's id, read by a thread that holds t->lock to check that t is still
** the task it looked up. Acquire, not relaxed: the spawner publishes a
** new id without the lock (task_spawn_impl), so a lock holder that sees
** the new id must also see the record's initialisation, which the
** spawner wrote before. An id seen under the lock is stable: it only
** changes to 0 under the lock, and from 0 only once the record is free. */
static inline uint64_t ums__task_id_locked(ums__task_t *t) {
  return atomic_load_explicit(&t->id, memory_order_acquire);
}

/* Whether token names the park t is in now: t is in a park, of that
** task and that sequence. Call with t->lock held, so that no one else can
** end the park meanwhile. The owner begins a park without the lock
** (ums_park_begin_wait stores the sequence, then the state with release):
** reading the state first, with acquire, means that a WAITING seen here
** comes with its park's sequence, so a stale token never matches a newer
** park. (t's own thread may call it without the lock: nothing changes
** t's state under it then but other threads' unparks, which hold it.) */
/* The top bit of a park's sequence (and so of its token) says the park is
** local (UMS_PARK_LOCAL): the token alone tells ums_unpark which way to
** go, before it reads anything of the task. The count below it advances
** by one a park, local or not. */
#define UMS__PARK_SEQ_LOCAL ((uint64_t)1 << 63)
/* The next bit says the park is queued (ums__park_begin_queued): only the
** object's granters, the task's timer and its cancel end it. */
#define UMS__PARK_SEQ_QUEUED ((uint64_t)1 << 62)

static inline bool ums__park_is(ums__task_t *t, ums_park_token_t token) {
  return atomic_load_explicit(&t->park.state, memory_order_acquire) ==
             UMS__WAITING &&
         atomic_load_explicit(&t->id, memory_order_relaxed) == token.task &&
         atomic_load_explicit(&t->park_seq, memory_order_relaxed) ==
             token.seq;
}

/* Begins the running task's park as a wait on an object's queue: t->park
** goes on q, guarded by lock, which the caller holds (and releases after,
** before the task parks). The object's granters end it like any waiter
** (ums__wq_grant_first/_all: 0 is granted), and so do the deadline
** (UMS_ETIMEDOUT) and a cancel (UMS_ECANCELED; not with
** UMS_PARK_NOCANCEL, the only flag): exactly one wins, under lock. The
** task then ends the park as any other (its step returns UMS_STEP_PARK and
** reads ums_park_result() when stepped again, or ums_park_wait()). type,
** object and blocker describe the wait (ums_park_begin_wait). *wp (if
** wp) is the waiter, for the caller's payload (w->data, w->aux) under
** lock; *token (if token) its park's token, which ums_unpark accepts only
** from the task itself. Returns 0, or as ums_park_begin_wait (UMS_EPERM
** outside a task, UMS_EBUSY with a park begun, UMS_ECANCELED), with
** nothing queued. (park.c) */
int ums__park_begin_queued(ums__wq_t *q, ums__lock_t *lock, int64_t deadline,
                           int flags, int type, const void *object,
                           ums_task_t blocker, ums__waiter_t **wp,
                           ums_park_token_t *token);
/* The begin half of every park-based wait on an object (sync.c, chan.c):
** with lock held, begins the queued park on q with the waiter's payload
** (data, aux) and releases lock whatever happens. Returns 1 (parked) or
** ums__park_begin_queued's error, with nothing queued. (park.c) */
int ums__park_on(ums__wq_t *q, ums__lock_t *lock, int64_t deadline,
                 int flags, int type, const void *object, ums_task_t blocker,
                 void *data, int64_t aux, ums_park_token_t *token);
/* The end half: how the current task's park on q ended (0 granted, or
** the error that ended it); UMS_EBUSY while it goes on, UMS_EINVAL when
** the task's last park was not on q, UMS_EPERM outside a task. *w (if
** w) is the park's waiter, for its payload. (park.c) */
int ums__park_outcome(const ums__wq_t *q, ums__waiter_t **w);

/* After a step returned UMS_STEP_PARK: parks t unless its park has
** already ended (then its winner has queued it). [owner] (park.c) */
void ums__park_after_step(ums__sched_t *s, ums__task_t *t);
/* Ends the running task's begun park (UMS_ECANCELED unless it already
** ended) and takes the wake-up that queued. [owner] (park.c) */
void ums__park_drop(ums__task_t *t);
/* Ends the running task's begun park that nobody else can end yet: its
** token was never handed out, no timer is armed and, the task running,
** no cancel ends it. Unlike ums__park_drop nothing is queued, so the task
** goes on without a pass through the scheduler. [owner] (park.c) */
void ums__park_undo(ums__task_t *t);
/* Whether the running task t may begin a park with flags now: 0, or what
** ums_park_begin_ex would refuse it with (UMS_EBUSY inside a park it has
** begun, UMS_ECANCELED when cancelled, its start error). For work done
** before a park that it may spare. [owner] (park.c) */
int ums__park_may_begin(const ums__task_t *t, int flags);
/* Reports a step function breaking the step protocol and aborts
** (park.c). */
void ums__step_misuse(ums__task_t *t, const char *what)
    __attribute__((noreturn));

/* ====================================================================== */
/* Workers (worker.c)                                                      */
/* ====================================================================== */

/* A C fiber. A worker either carries a task (bound) or sits in its
** scheduler's idle pool. An idle worker has no live context: it is
** restarted from the top when it gets work, so a finished task's frames
** never matter. */
struct ums__worker {
  ums__ctx_t ctx;              /* [owner] */
  ums__stack_t stack;          /* [owner] */
  ums__task_t *task;           /* [owner] the task it carries, or NULL */
  ums_link_t idle;             /* [owner] on the idle pool */
  uint64_t idle_epoch;         /* [owner] trim epoch when it went idle */
  ums__sched_t *sched;         /* [const] */
  sigjmp_buf exit_jb;          /* [owner] where ums_exit unwinds to */
};

/* Binds t to w (w->task, t->worker) and counts w as busy. */
void ums__worker_bind(ums__sched_t *s, ums__worker_t *w, ums__task_t *t);
/* An idle worker from the pool, or a new one; NULL if out of memory. */
ums__worker_t *ums__worker_get(ums__sched_t *s);
/* Puts w in the idle pool. */
void ums__worker_put(ums__sched_t *s, ums__worker_t *w);
/* Frees idle workers that went idle before epoch `before`, keeping the
** `keep` most recently used. Returns how many were freed. */
int ums__worker_trim(ums__sched_t *s, uint64_t before, int keep);
/* Frees every idle worker (at teardown). */
void ums__worker_free_all(ums__sched_t *s);
/* The fiber entry point: runs w->task, then the next unstarted task, and
** so on; never returns. */
void ums__worker_main(void *arg);

/* ====================================================================== */
/* Thread pool (pool.c): a hidden scheduler of OS threads                  */
/* ====================================================================== */

/* A unit of work for the pool, embedded in its owner (an I/O request).
** run() executes on a pool thread and is responsible for completing the
** owner (through its scheduler's completion list); it may free the work,
** so the pool never touches it after run() returns. */
typedef struct ums__pool_work ums__pool_work_t;
struct ums__pool_work {
  /* First what a pool thread reads of a posted slot (ums__pool_post), so
  ** that an owner can keep it on one cache line with its own data. */
  void (*run)(ums__pool_work_t *w);  /* [const] */
  _Atomic uint32_t posts;            /* [atomic, written by the owner]
                                        slots only: how many times it was
                                        posted (ums__pool_post) */
  _Atomic int interrupted;           /* [atomic] set by ums__pool_interrupt;
                                        read through ums__pool_interrupted */
  ums__pool_work_t *next;            /* [pool lock] queue link */
  int64_t queued_at;                 /* [pool lock] when it was queued */
  /* For the exhaustion report (ums__pool_exhaustion), written by the
  ** submitter before it queues the work and read under the pool's lock
  ** only while the work is queued. */
  uint64_t task;                     /* the task waiting for it; 0: none
                                        known */
  const char *what;                  /* what it runs ("read", a C
                                        function's name); NULL: unknown.
                                        Kept alive by the work's owner
                                        until run() has returned */
};

typedef struct ums__pool_thread ums__pool_thread_t;

/* How a pool grows (pool.c has the reasoning). Up to core threads start
** the moment work finds no idle thread; beyond core, up to max, only when
** the oldest queued work has waited grow_ns while busy threads were
** blocked (neither on a CPU nor waiting for one: more threads help),
** checked every grow_ns by a monitor thread. A thread idle for idle_timeout ends
** (negative: never) unless it is one of the first core. Exited threads
** are joined by the next thread start or by ums__pool_destroy, so none
** outlives the pool. */
typedef struct ums__pool_cfg {
  const char *name;     /* thread name prefix (kept, not copied) */
  uint32_t core;        /* started on demand; 0 or > max: max */
  uint32_t max;         /* 0: 1 */
  int64_t idle_timeout; /* ns; negative: never trim */
  int64_t spin_ns;      /* an idle thread spins that long for new work
                           before it sleeps; 0: it sleeps at once */
  int64_t grow_ns;      /* the monitor's tick; 0: 1 ms */
  void (*on_wait)(void *arg); /* called by the pool's monitor, under the
                           pool's lock, at each tick while the pool has
                           max threads, none idle, and work queued for
                           a tick: the runtime's monitor watches for
                           exhaustion then (it may sleep otherwise).
                           Must not take the pool's lock. NULL: none */
  void *on_wait_arg;
} ums__pool_cfg_t;

typedef struct ums__pool {
  /* What submitters touch, on a line of its own (pool.c, "Handoff"). */
  _Atomic(ums__pool_work_t *) incoming UMS__ALIGNED; /* [atomic] work
                                        pushed without the lock: a LIFO
                                        stack, moved whole to the FIFO by
                                        whoever takes the lock next */
  _Atomic uint32_t nawake;           /* [atomic, written under lock]
                                        threads that will look at the
                                        queue again without a wake-up:
                                        running work, spinning, or woken
                                        and on their way */
  _Atomic bool mon_asleep;           /* [atomic, written under lock] the
                                        monitor is not watching (asleep,
                                        or not started) */
  ums__pool_work_t **slots;          /* [const once set] ums__pool_post */
  _Atomic uint32_t *slot_taken;      /* [atomic, written under lock] per
                                        slot, the posts taken (by a thread,
                                        or back by the owner): it waits
                                        while its posts differ */
  uint32_t nslots;                   /* [const once set] */
  pthread_mutex_t lock UMS__ALIGNED;
  pthread_cond_t work_cv;            /* work queued, or stopping */
  pthread_cond_t exit_cv;            /* a thread ended (for destroy) */
  pthread_cond_t mon_cv;             /* wakes the monitor */
  ums__pool_work_t *head, *tail;     /* [lock] FIFO of queued work */
  uint32_t nqueued;                  /* [lock] */
  _Atomic uint32_t queued_hint;      /* [atomic, written under lock] a copy
                                        of nqueued that spinning threads
                                        read without the lock */
  uint32_t nthreads;                 /* [lock] threads alive */
  uint32_t nidle;                    /* [lock] threads waiting for work,
                                        spinning ones included */
  uint32_t nspinning;                /* [lock] threads spinning for work */
  uint32_t nsleeping;                /* [lock] threads asleep on work_cv */
  uint32_t wakes_pending;            /* [lock] sleepers signalled (and
                                        counted in nawake) that have not
                                        returned from their wait yet */
  ums__pool_thread_t *threads;       /* [lock] every thread not yet joined */
  bool stopping;                     /* [lock] destroy has begun */
  /* The monitor (started the first time a submitter relies on threads
  ** that are awake, or on growth beyond core). */
  pthread_t monitor;                 /* [lock] valid if mon_started */
  bool mon_started;                  /* [lock] */
  bool told_thread, told_monitor;    /* [lock] a failure to create a
                                        thread, or the monitor, was
                                        reported on stderr (once each) */
  uint32_t interrupting;             /* [lock] threads whose work was
                                        interrupted and runs on: the
                                        monitor signals them again every
                                        tick until it ends */
  int64_t sampled_at;                /* [lock] the monitor's last look at
                                        its threads' times; 0: none */
  uint32_t idle_looks;               /* [lock] the monitor's looks in a row
                                        that found nothing queued */
  uint64_t grown;                    /* [lock] threads the monitor started */
  uint64_t completed;                /* [lock] work run to its end */
  uint64_t handed;                   /* [lock] work that came while a
                                        thread spun for it */
  uint64_t woken;                    /* [lock] sleepers woken for work */
  uint32_t slot_turn;                /* [lock] the slot to look at first */
  uint64_t slot_takes;               /* [lock] posts a thread took */
  uint64_t slot_backs;               /* [lock] posts taken back by their
                                        owner (ums__pool_unpost) */
  /* Exhaustion (ums__pool_exhaustion): every thread there may be is
  ** running work and work has waited past the runtime's threshold. */
  bool exhausted;                    /* [lock] an episode is under way */
  bool cannot_grow;                  /* [lock] the last thread start
                                        failed: the pool is at its bound
                                        for now, whatever max says */
  uint64_t episodes;                 /* [lock] episodes since the start */
  int64_t oldest_wait_max;           /* [lock] the longest wait seen by a
                                        look in an episode, ns */
  ums__spin_gauge_t spin;            /* [lock] how the spinners fare */
  ums__pool_cfg_t cfg;               /* [const] normalised */
} ums__pool_t;

int ums__pool_init(ums__pool_t *p, const ums__pool_cfg_t *cfg);
/* Queues w. Returns 0, or UMS_EAGAIN when the pool has no thread and
** cannot start one (the caller then runs the work itself). Any thread. */
int ums__pool_submit(ums__pool_t *p, ums__pool_work_t *w);
/* Gives the pool its slots: n works, each owned by one submitter, that
** idle and finishing pool threads look at besides the queue, so that a
** submitter posting one (ums__pool_post) hands its work to a spinning
** thread through the work's own cache line. Before any submit; the array
** is copied, the works must outlive the pool. Returns 0 or UMS_ENOMEM. */
int ums__pool_set_slots(ums__pool_t *p, ums__pool_work_t *const *slots,
                        uint32_t n);
/* Posts slot i (not posted now) for a pool thread awake now to take.
** Returns true if it is posted (a thread will take it, or may have
** already); false, with it not posted, when no thread is awake: the
** caller then submits the work (ums__pool_submit). A thread awake may be
** blocked in a long work: a poster that waits for its work takes it back
** (ums__pool_unpost) when it stops waiting and submits it. A pool thread
** writes nothing into the work before run(). [the slot's owner] */
bool ums__pool_post(ums__pool_t *p, uint32_t i);
/* Takes posted slot i back. Returns true if no thread had taken it (the
** work is the owner's again, not queued anywhere); false if a thread has
** taken it and runs it (or has run it). Takes the pool's lock. [the
** slot's owner] */
bool ums__pool_unpost(ums__pool_t *p, uint32_t i);
/* Marks w interrupted and, if a pool thread runs it now, signals that
** thread so that a blocking system call fails with EINTR, and again every
** tick of the pool's monitor until the work has ended (a signal that lands
** just before the call is lost). The caller must keep w alive during the
** call. */
void ums__pool_interrupt(ums__pool_t *p, ums__pool_work_t *w);
/* In run(): whether the work has been interrupted (by its owner, or by
** the pool's destruction), so that a system call failing with EINTR must
** not be restarted. */
bool ums__pool_interrupted(const ums__pool_work_t *w);
/* Waits until every queued and running work has ended (interrupting the
** running ones every few milliseconds), then joins every thread. */
void ums__pool_destroy(ums__pool_t *p);
/* Threads alive (for tests). */
uint32_t ums__pool_threads(ums__pool_t *p);
/* Threads the monitor started beyond core (for tests). */
uint64_t ums__pool_grown(ums__pool_t *p);
/* Work that came while a thread spun for it (for tests). */
uint64_t ums__pool_handed(ums__pool_t *p);
/* Posts of slots that threads took, and that their owners took back (for
** tests). */
void ums__pool_slot_counts(ums__pool_t *p, uint64_t *takes, uint64_t *backs);
/* Sleepers woken for work (for tests). */
uint64_t ums__pool_woken(ums__pool_t *p);
/* Fills a row of ums_runtime_pool_stats. */
void ums__pool_stats(ums__pool_t *p, ums_pool_stats_t *out);
/* The runtime monitor's look at the pool (monitor.c): fills *out and
** returns 1 when an exhaustion episode begins with this look (every
** thread the pool may have is running work, and the oldest queued work
** has waited threshold ns or more), 0 otherwise. An episode ends when
** nothing is queued any more (or a thread is idle); the next one is
** counted anew. out->oldest_task and out->oldest_what describe the
** oldest queued work; what points at the owner's string, valid only
** while that work is queued: the caller copies it under the lock, so
** out->oldest_what is a copy in out. */
typedef struct ums__pool_exhaust {
  uint64_t threads, active, queued, max, episodes;
  int64_t oldest_wait_ns;
  uint64_t oldest_task;
  char oldest_what[64];
} ums__pool_exhaust_t;
int ums__pool_exhaustion(ums__pool_t *p, int64_t threshold,
                         ums__pool_exhaust_t *out);
/* Whether work is queued or pushed, without the lock (a hint). */
bool ums__pool_has_queued(ums__pool_t *p);
/* Whether an exhaustion episode is under way (the monitor looks once more
** after the queue drained, to end it). Takes the pool's lock. */
bool ums__pool_exhausted_hint(ums__pool_t *p);

/* ====================================================================== */
/* I/O buffers (buf.c)                                                     */
/* ====================================================================== */

/* Objects kept in a cache (buffers, I/O requests) are poisoned in ASan
** builds, so that a stale pointer into one is reported. */
#if defined(UMS_ASAN)
#include <sanitizer/asan_interface.h>
#define UMS__POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UMS__UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define UMS__POISON(p, n) ((void)(p), (void)(n))
#define UMS__UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Size classes of the per-scheduler buffer cache: 4 KiB << 0..10 (4 KiB to
** 4 MiB). Larger buffers are never cached. */
#define UMS__BUF_CLASSES 11
#define UMS__BUF_MIN_SHIFT 12

typedef struct ums__buf_block ums__buf_block_t;
struct ums_buf {
  _Atomic uint32_t refs;       /* [atomic] */
  int cls;                     /* [const] size class, or -1: not cacheable */
  size_t size;                 /* [const] usable size asked for */
  size_t cap;                  /* [const] bytes allocated at data */
  void *data;                  /* [const] page-aligned */
  ums_buf_t *next;             /* [owner of the cache] cache link */
  ums__buf_block_t *block;     /* [const] the block data is carved from (and
                                  this header lives in), or NULL: data and
                                  header are allocations of their own */
};

typedef struct ums__buf_cache {
  ums_buf_t *head[UMS__BUF_CLASSES]; /* [owner] */
  uint32_t n[UMS__BUF_CLASSES];      /* [owner] */
} ums__buf_cache_t;

/* Frees every cached buffer. [owner, at teardown] */
void ums__buf_cache_clear(ums__buf_cache_t *c);

/* ====================================================================== */
/* I/O requests (io.c, io-pool.c, io-uring.c; io-poll.c, net.c)           */
/* ====================================================================== */

enum ums__io_op {
  UMS__IO_OPEN, UMS__IO_CLOSE, UMS__IO_READ, UMS__IO_WRITE, UMS__IO_READV,
  UMS__IO_WRITEV, UMS__IO_FSYNC, UMS__IO_STATX, UMS__IO_UNLINK,
  UMS__IO_RENAME, UMS__IO_MKDIR, UMS__IO_READDIR, UMS__IO_READFILE,
  /* Sockets (net.c) and readiness (ums_wait_fd). */
  UMS__IO_ACCEPT, UMS__IO_CONNECT, UMS__IO_RECV, UMS__IO_SEND,
  UMS__IO_RECVMSG, UMS__IO_SENDMSG, UMS__IO_POLL,
  UMS__IO_NOPS
};

/* Who decided a request's fate: the completion or the caller giving up
** (one CAS from INFLIGHT, so exactly one of them wins). */
enum { UMS__IO_INFLIGHT = 0, UMS__IO_DONE = 1, UMS__IO_ABANDONED = 2 };

#define UMS__IO_INLINE_IOV 4
#define UMS__IO_INLINE_PATH 96

/* One file operation: the public ums_fs_req_t (ums.h, "deferred form").
** Shared by reference count: one reference for the caller (dropped when it
** has taken the result or given up: ums_fs_end), one for the operation
** (dropped when it completed: its CQE was reaped, or the pool thread
** finished), one per kernel cancel request in flight (dropped at its CQE:
** a request is never freed, and its address never reused as a user_data,
** while the kernel may still match a cancel against it). The last
** reference dropped on a scheduler thread puts the struct in that
** scheduler's request cache (io.c), elsewhere it is freed. */
typedef struct ums_fs_req ums__io_req_t;
struct ums_fs_req {
  _Atomic uint32_t refs;        /* [atomic] */
  _Atomic int state;            /* [atomic] UMS__IO_INFLIGHT/DONE/ABANDONED */
  int op;                       /* [const] enum ums__io_op */
  bool on_ring;                 /* [const once submitted] else on the pool */
  bool on_poller;               /* [const once submitted] waiting for
                                   readiness in its scheduler's poller
                                   (io-poll.c) */
  ums__sched_t *sched;          /* [const] scheduler of the caller (NULL:
                                   a host thread) */
  ums_park_token_t token;       /* [const once submitted] the caller's park */
  int64_t res;                  /* [the completer, before state leaves
                                   INFLIGHT; then the winner] result */

  /* Arguments, [const] once submitted. */
  int fd;
  int flags;
  int mode;
  int64_t off;
  char *path, *path2;           /* copies; may point into inline_path */
  struct iovec *iov;            /* iovcnt entries; may point to iov_inline */
  ums_buf_t **bufs;             /* iovcnt references held */
  int iovcnt;

  /* Results beyond res, written by the completer before the state CAS. */
  void *stx;                    /* struct statx for UMS__IO_STATX: points
                                   to stx_space */
  ums_dirlist_t *list;          /* UMS__IO_READDIR; owned by the request
                                   until the caller takes it */

  ums__pool_work_t work;        /* pool backend */
  ums__io_req_t *cache_next;    /* [owner of the cache] while cached */

  /* UMS__IO_READFILE on a ring (io-uring.c, "Whole small files"), [the
  ** ring's owner]: the stage, the entries still in the kernel for it, each
  ** entry's result by its tag, and one byte for the read that finds the
  ** end (also the pool's). A readfile leaves a descriptor it hands back (UMS_ESPIPE)
  ** in fd. */
  int chain_stage;              /* 1: open and read; 2: what follows */
  int chain_left;
  int32_t chain_res[4];         /* by tag: open, read, the second step
                                   (read at the end, or the descriptor's
                                   install), close */
  int64_t chain_size;           /* a regular file's size by the statx
                                   after its open (ums__io_readfile_kind;
                                   0 for a directory), also the pool's */
  bool chain_short;             /* stage 2 without the read at the end:
                                   the size fits the buffer */
  bool chain_full;              /* a short stage 2 read other than the
                                   size: the retry reads to the end */
  char scratch[8];

  /* Sockets (net.c) and readiness, [const] once submitted except where
  ** said. A deadline for the calls of host threads, which wait with
  ** poll(2). addrlen: the length of addr (below), 0 without one. */
  int64_t deadline;
  socklen_t addrlen;
  uint32_t events;              /* POLL: POLLIN, POLLOUT, ... */
  bool connecting;              /* [the executor] a non-blocking connect
                                   is in progress: wait, then SO_ERROR */
  bool take_buf;                /* [const] a receive that holds no buffer
                                   while it waits: its executor takes one
                                   (bufs[0], iov[0]) for each try and keeps
                                   it only when data came (net.c,
                                   "Receives that take their buffer") */
  bool net_learn;               /* [const once submitted] a receive that was
                                   tried at once and found nothing: its
                                   result teaches its descriptor's hint
                                   (net.c, "Receives that wait first") */
  /* [the ring's owner] the request's place in its ring's list of work
  ** for after reap (io-uring.c, after_push): readfile chains and
  ** sockets' polls. */
  ums__io_req_t *after_next;
  bool ring_ready;              /* [const once submitted] a call that is
                                   tried at once (or would be, but for its
                                   hint), on a ring: waits there for
                                   readiness (a poll) and makes its call
                                   again on the scheduler thread
                                   (io-uring.c, "Sockets wait for
                                   readiness") */
  /* [the poller's owner] the request's place among those waiting on the
  ** same descriptor (io-poll.c). */
  ums_link_t poll_link;

  /* Not zeroed when a request is made (io.c: req_new): each is written
  ** before it is read, by the builder of the operations that use it
  ** (net.c, mk_net) or by the kernel. The address is the one to connect
  ** or send to, or the one accept and recvfrom fill in (the completer
  ** writes it and addrlen before the state CAS). */
  struct sockaddr_storage addr;
  struct msghdr msg;            /* RECVMSG, SENDMSG: over iov and addr */

  /* Inline room, not zeroed either. A stat has no buffers, a read or
  ** write no statx. */
  union {
    struct {
      struct iovec iov_inline[UMS__IO_INLINE_IOV];
      ums_buf_t *bufs_inline[UMS__IO_INLINE_IOV];
    };
    uint64_t stx_space[32];     /* a struct statx (256 bytes; io.c checks) */
  };
  char path_inline[UMS__IO_INLINE_PATH];
};

/* Free request structs kept by a scheduler, so that a task's request
** costs no malloc once the cache is warm. Bounded (io.c). */
typedef struct ums__io_req_cache {
  ums__io_req_t *head;          /* [owner] */
  uint32_t n;                   /* [owner] */
} ums__io_req_cache_t;

/* Frees every cached request. [owner, at teardown, after the ring has
** been drained] */
void ums__io_req_cache_clear(ums__io_req_cache_t *c);

/* A readfile has opened fd: 0 when it is a regular file or a directory
** (read it; a directory's read fails), else the request's result: the
** statx's error (fd closed), or UMS_ESPIPE with fd left in r->fd for the
** caller (a stream: nothing may be read from it first). Any thread.
** (io.c) */
int64_t ums__io_readfile_kind(ums__io_req_t *r, int fd);

/* Ends r with result res: the caller gets it if it is still waiting,
** otherwise (abandoned) the result's resources are released. Drops the
** operation's reference. Any thread. (io.c) */
void ums__io_complete(ums__io_req_t *r, int64_t res);
/* Drops one reference; the last frees r and the buffer references. */
void ums__io_req_unref(ums__io_req_t *r);
/* Runs r with plain system calls on the calling thread and returns the
** result (io-pool.c). Used by pool threads and by host-thread calls. */
int64_t ums__io_exec(ums__io_req_t *r);
/* Internal halves of the public calls (io.c), for net.c: a new request
** holding the caller's reference; the buffer references and iovec;
** the blocking form (the caller's reference stays with the caller); the
** first half of the deferred form (on failure r is released). */
ums__io_req_t *ums__io_req_new(int op);
int ums__io_req_iov(ums__io_req_t *r, const ums_iov_t *iov, int n);
int64_t ums__io_run(ums__io_req_t *r, int64_t deadline);
int ums__io_begin(ums__io_req_t *r, int64_t deadline, ums_fs_req_t **out);
/* ums_fs_end without dropping the caller's reference, for the socket
** calls that take more than the result from r (an address, a buffer):
** 0 with the result in *res, or the error of an end refused (r left
** alone then). */
int ums__io_settle(ums__io_req_t *r, int64_t *res);
/* Whether op is a socket operation or a readiness wait. */
static inline bool ums__io_is_net(int op) {
  return op >= UMS__IO_ACCEPT && op <= UMS__IO_POLL;
}
/* Socket operations (net.c). ums__net_try makes r's system call without
** blocking and returns its result, UMS__NET_WAIT when the descriptor is
** not ready (a connect's own EAGAIN is a result: see ums_net_connect)
** (any thread; the readiness backends call it on the scheduler's
** thread). ums__net_exec blocks until r is done, waiting with poll(2)
** up to r->deadline (host threads, and the I/O pool for an operation the
** ring lacks). ums__net_events is what r waits for (POLLIN, POLLOUT). */
#define UMS__NET_WAIT INT64_MIN
int64_t ums__net_try(ums__io_req_t *r);
int64_t ums__net_exec(ums__io_req_t *r);
uint32_t ums__net_events(const ums__io_req_t *r);
/* Receives that wait first (net.c), [s's thread]: whether r, which could
** be tried at once, waits for readiness first instead; what its try gave
** (res, UMS__NET_WAIT included); what it got after it waited. */
bool ums__net_wait_first(ums__sched_t *s, const ums__io_req_t *r,
                         int64_t deadline);
void ums__net_tried(ums__sched_t *s, ums__io_req_t *r, int64_t res);
void ums__net_waited(ums__sched_t *s, const ums__io_req_t *r, int64_t res);

/* The readiness backend without io_uring (io-poll.c): an epoll set per
** scheduler, touched only by its thread except ums__poller_wake (any
** thread), waited on in its idle wait. */
typedef struct ums__poller ums__poller_t;
/* Makes s's set unless it has one. Returns 0 or -errno. [owner] */
int ums__poller_new(ums__sched_t *s);
void ums__poller_free(ums__poller_t *p);
/* Takes r, whose park has begun and whose call was just tried and found
** not ready (io.c, start): completes it when its descriptor becomes
** ready. [owner] */
void ums__poller_submit(ums__sched_t *s, ums__io_req_t *r);
/* r was abandoned by its caller: it stops waiting and is completed
** (its result dropped). [owner] */
void ums__poller_cancel(ums__sched_t *s, ums__io_req_t *r);
/* fd is about to be closed: its waiting requests end with UMS_EBADF and
** it leaves the epoll set. [owner] */
void ums__poller_forget(ums__sched_t *s, int fd);
/* The pass's step and the idle wait, as ums__ring_poll and
** ums__ring_wait. [owner] */
void ums__poller_poll(ums__sched_t *s);
void ums__poller_wait(ums__sched_t *s, int64_t deadline, int64_t now);
void ums__poller_wake(ums__sched_t *s);

/* Runs r on the runtime's I/O pool; completes it inline on the calling
** thread if the pool has no thread and cannot start one. (io-pool.c) */
void ums__io_pool_submit(ums_runtime_t *rt, ums__io_req_t *r);

/* The io_uring backend (io-uring.c). The ring is touched only by its
** scheduler's thread, except ums__ring_wake (any thread) and
** ums__ring_free (at runtime teardown, no scheduler thread left). */
typedef struct ums__ring ums__ring_t;

/* Sets up a ring for s. Returns 0 or a negative errno (UMS_ENOSYS when
** built without liburing). The first ring probes the opcodes; `probe`
** carries the result to the others (NULL for the first). */
int ums__ring_new(ums__sched_t *s, const ums__ring_t *probe_from);
/* Ends the use of a ring: a drained one is kept for a later ums__ring_new
** (the process keeps up to a few, io-uring.c "Kept rings"), any other is
** closed. */
void ums__ring_free(ums__ring_t *ring);
/* Whether the ring was probed to support op. */
bool ums__ring_supports(const ums__ring_t *ring, int op);
/* Queues r's submission entry. [owner] */
void ums__ring_submit(ums__sched_t *s, ums__io_req_t *r);
/* Queues a kernel cancel of r, which its caller abandoned (a readfile
** chain: of its open, the one step that may block). [owner] */
void ums__ring_cancel(ums__sched_t *s, ums__io_req_t *r);
/* Queues a kernel cancel of every operation on fd, which is about to be
** closed (ums_net_close); they complete with UMS_EBADF. [owner] */
void ums__ring_cancel_fd(ums__sched_t *s, int fd);
/* The pass's I/O step: submits queued entries when their batch is due
** and reaps every completion, without a system call when there is none.
** [owner] */
void ums__ring_poll(ums__sched_t *s);
/* The idle wait on the ring: submits queued entries and sleeps until a
** completion (I/O or a wake-up) or the deadline. [owner] */
void ums__ring_wait(ums__sched_t *s, int64_t deadline, int64_t now);
/* Makes the scheduler's ring wait return. Any thread. */
void ums__ring_wake(ums__sched_t *s);
/* At scheduler exit: cancels what is left in the kernel and reaps until
** nothing is. [owner] */
void ums__ring_drain(ums__sched_t *s);

/* ====================================================================== */
/* Schedulers and the runtime (sched.c)                                    */
/* ====================================================================== */

/* Counters written by the owner with relaxed stores (plain moves on the
** common CPUs), read by any thread. */
typedef struct ums__counters {
  _Atomic uint64_t context_switches; /* task switches (picks) */
  _Atomic uint64_t fiber_switches;
  _Atomic uint64_t yields;
  _Atomic uint64_t idle_waits;
  _Atomic uint64_t tasks_spawned;
  _Atomic uint64_t io_requests;
  _Atomic uint64_t io_submits;
  _Atomic uint64_t preempt_calls;
  _Atomic uint64_t quantum_expiries;
  _Atomic uint64_t preempt_spun;
  _Atomic uint64_t peer_spins;     /* idle waits that spun for a peer */
  _Atomic uint64_t peer_spin_hits; /* of those, the ones that caught a post */
} ums__counters_t;

/* One wait type's aggregate on one scheduler (waitstats.c). */
typedef struct ums__waitstat {
  _Atomic uint64_t count;
  _Atomic int64_t total_ns, max_ns, signal_ns;
} ums__waitstat_t;

#define UMS__COUNT(s, field)                                              \
  atomic_store_explicit(&(s)->counters.field,                             \
      atomic_load_explicit(&(s)->counters.field, memory_order_relaxed) + 1, \
      memory_order_relaxed)

struct ums__sched {
  /* Shared with other threads. */
  _Atomic(ums__task_t *) inbox UMS__ALIGNED; /* [atomic] completion list:
                                  a LIFO stack pushed with CAS, drained
                                  whole and reversed by the owner */
  _Atomic(ums__task_t *) cancels; /* [atomic] tasks with a cancel to deliver */
  /* Preemptive calls that returned while their caller was parked
  ** (preempt.c): a LIFO stack of call records pushed with CAS by pool
  ** threads, drained whole by the owner, who unparks the callers. The
  ** pool thread touches neither the task nor the inbox, so the task's
  ** cache lines stay with its scheduler. */
  _Atomic(struct ums_preempt_call *) calls_done; /* [atomic] */
  _Atomic uint32_t idle_state; /* [atomic] 0 running, 1 idle, 2 woken */
  /* What the pass must look at besides its lists (UMS__ATTN_*), in one
  ** word so that a pass with none of them reads one. [atomic] */
  _Atomic uint32_t attn;
  /* Work items placed or named here (work.c), in two FIFOs: those queued
  ** for this scheduler by name, which other schedulers steal only after
  ** a grace, and those the placement put here, which any may take. */
  ums__lock_t work_lock;
  ums_list_t work_named;       /* [work_lock] of ums_work_t.link */
  ums_list_t work_free;        /* [work_lock] of ums_work_t.link */
  _Atomic uint32_t nwork;      /* [atomic, written under work_lock] items
                                  in both */
  _Atomic uint32_t nwork_free; /* [atomic, written under work_lock] */
  _Atomic int work_refused;    /* [atomic, written under its work_lock]
                                  it takes no items any more */
  /* Live tasks placed here, in two parts so that a spawn and a finish on
  ** the owner's thread (the usual case) make no read-modify-write: other
  ** threads' spawns add to ntasks_in; the owner adds its own spawns to
  ** ntasks_own and takes every finish off it, with plain stores. Their
  ** sum is the count (ums__sched_load); ntasks_own alone may go below
  ** zero. */
  _Atomic int64_t ntasks_in;   /* [atomic] */
  _Atomic int64_t ntasks_own;  /* [atomic, owner writes] */
  _Atomic uint32_t nrunnable;  /* [atomic, owner writes] for stats */
  _Atomic uint32_t nactive;    /* [atomic, owner writes] started tasks */
  _Atomic uint32_t npending;   /* [atomic, owner writes] waiting spawns */
  _Atomic uint32_t nidle_workers; /* [atomic, owner writes] */
  _Atomic uint32_t nworkers_all;  /* [atomic, owner writes] */
  _Atomic uint32_t nworkers_busy; /* [atomic, owner writes] carrying a task */
  _Atomic uint32_t ntimers;       /* [atomic, owner writes] */
  _Atomic int is_idle;            /* [atomic, owner writes] */
  _Atomic uint32_t io_pending;    /* [atomic] requests of this scheduler's
                                     tasks not yet completed */
  ums__spin_gauge_t spin;         /* [owner] how its completion spins fare */
  ums__spin_gauge_t peer_spin;    /* [owner] how its spins for another
                                     scheduler's post fare */
  _Atomic int spinning;           /* [atomic, owner writes] 1 while its idle
                                     wait spins for a peer's post: such a
                                     scheduler is not busy to the others */
  _Atomic uint32_t preempt_pending; /* [atomic] preemptive calls of this
                                     scheduler's tasks not yet returned;
                                     while nonzero the idle wait spins
                                     first (a completion is likely soon) */
  _Atomic uint32_t io_pool_pending; /* [atomic] file I/O of this
                                     scheduler's tasks handed to the I/O
                                     pool and not yet posted back: spun
                                     for like preempt_pending */
  /* Deadlock detection (sched.c, "Deadlocks"). stuck is 1 while the
  ** owner sits in an idle wait that nothing of its own can end (no
  ** timer, nothing in flight); stuck_seq counts the times it went stuck
  ** after running a task since the last time, so that two readings of
  ** it that agree mean nothing ran in between. */
  _Atomic int stuck;           /* [atomic, owner writes] */
  _Atomic uint64_t stuck_seq;  /* [atomic, owner writes] */
  uint64_t stuck_picks;        /* [owner] context_switches when last
                                  stuck */
  ums__counters_t counters;
  _Atomic uint64_t running;    /* [atomic, owner writes] id of the task
                                  picked last (the monitor's view) */
  _Atomic uint64_t stalls;     /* [atomic, the monitor writes] */
  /* Wait statistics (waitstats.c): totals since the runtime started, which
  ** a reset does not touch (it moves the readers' baseline instead), so
  ** the owner writes them without checking for one. */
  ums__waitstat_t waits[UMS_WAIT_NTYPES]; /* [atomic, owner writes; a
                                  reset zeroes max_ns] */
  ums__waitstat_t waits_base[UMS_WAIT_NTYPES]; /* [rt->waits_lock] the
                                  totals at the last reset */

  /* Owner only. */
  ums__task_t *runq_head UMS__ALIGNED, *runq_tail; /* [owner] */
  /* Tasks whose timer woke them go before the run queue (a late timer is
  ** the lateness users see, and a spawn burst can queue 100,000 tasks not
  ** yet started), but at most UMS__URGENT_STREAK in a row, so the run
  ** queue never starves (docs/design/architecture.md, "The scheduler
  ** pass"). */
  ums__task_t *urgent_head, *urgent_tail; /* [owner] */
  uint32_t urgent_streak;      /* [owner] urgent picks in a row */
  int64_t work_look;           /* [owner] when an item of another queue
                                  may be stolen next (real clock);
                                  UMS_FOREVER: none waits (work.c) */
  uint32_t work_seen;          /* [owner] rt->work_seq when it last
                                  looked at the queues */
  int64_t work_starve_at;      /* [owner] when its own oldest item starts
                                  though tasks are runnable; 0: not
                                  counting (work.c) */
  bool expiring;               /* [owner] inside timer expiry */
  ums_list_t pending;          /* [owner] FIFO of ums__task_t.pend beyond
                                  max_workers */
  ums__timer_heap_t timers;    /* [owner] */
  ums__worker_t *cur;          /* [owner] running worker; NULL: the thread's
                                  own context */
  ums__task_t *cur_task;       /* [owner] running task or NULL */
  ums__ctx_t main_ctx;         /* [owner] the scheduler thread's context */
  ums_list_t idle;             /* [owner] idle pool of ums__worker_t.idle:
                                  head is the most recently used */
  ums__stack_pool_t stacks;    /* [owner] */
  ums__task_t *free_tasks;     /* [owner] local task free list */
  uint32_t nfree_tasks;        /* [owner] */
  uint32_t nlocal;             /* [owner] tasks admitted, not ended */
  uint32_t nlive_own;          /* [owner] unfinished tasks spawned onto
                                  this scheduler by its own thread; while
                                  there are any, they hold one unit of
                                  rt->live together (task.c) */
  uint32_t runq_n;             /* [owner] */
  uint32_t nworkers;           /* [owner] workers in existence */
  uint32_t nidle;              /* [owner] workers in the idle pool */
  uint32_t nbusy;              /* [owner] workers carrying a task */
  uint64_t trim_epoch;         /* [owner] advanced every idle timeout */
  int64_t next_trim;           /* [owner] when the epoch advances next */
  ums__ring_t *ring;           /* [const pointer; the ring itself: owner]
                                  NULL: the pool backend */
  /* The pool backend's readiness for sockets (io-poll.c), made at the
  ** first socket request, so that a program without sockets keeps the
  ** futex idle wait and no descriptors. [atomic pointer, written once
  ** by the owner; the set itself: owner] */
  _Atomic(ums__poller_t *) poller;
  ums__buf_cache_t bufs;       /* [owner] I/O buffer cache */
  /* Call records of preemptive calls that ended here (preempt.c), kept
  ** for the next: with many calls in flight malloc's per-thread cache
  ** runs dry. Freed when the scheduler's thread ends. */
  struct ums_preempt_call *call_free; /* [owner] */
  struct ums_preempt_call *call_lone; /* [const] its slot record in the
                                  C-call pool (preempt.c), for a call its
                                  caller spins for; freed after the pool */
  uint32_t ncall_free;         /* [owner] */
  ums__spin_gauge_t call_spin; /* [owner] how spins at the call site of
                                  a preemptive call fare (preempt.c) */
  /* Stamps (waitstats.c) reused so that most switches read no clock. */
  int64_t now_hint;            /* [owner] the stamp of the park that
                                  started this pass, for the next pick; 0:
                                  none */
  int64_t seg_start;           /* [owner] when the running task's turn
                                  began, if that was stamped; 0: unknown */
  bool timing;                 /* [const] stats on: waits are timed */
  const _Atomic int64_t *wait_clock; /* [const] &rt->wait_clock.ns */
  uint8_t stamps;              /* [const] the clock waits are timed on:
                                  UMS__STAMPS_WAIT_CLOCK (stats on),
                                  _PRECISE or _VIRTUAL (waits last what
                                  the tasks saw) */
  /* Parks to end when the scheduler goes idle (ums_wait_idle). Tokens,
  ** not task pointers: one whose park already ended (timeout, cancel) is
  ** refused by ums_unpark and simply dropped. */
  ums_park_token_t *idle_waiters; /* [owner] */
  uint32_t nidle_waiters, cap_idle_waiters; /* [owner] */
  ums__io_req_cache_t reqs;    /* [owner] I/O request cache */
  /* [owner] by descriptor number, what this scheduler's receives on it
  ** have taught (net.c, "Receives that wait first"); grown on demand. */
  uint8_t *net_hints;
  uint32_t net_nhints;         /* [owner] */
  /* [owner] the latest clock reading made on this scheduler's thread
  ** (clock.c): the pass's when a timer could be due, a deadline being
  ** computed. The "near" test of those receives reads it instead of the
  ** clock. */
  int64_t clock_seen;

  /* Constant. */
  int id;
  ums_runtime_t *rt;
  ums__thread_t *thread;       /* NULL until started (thread.c) */
  _Atomic int tid;             /* [atomic] the thread's kernel id, for the
                                  monitor; 0 until it has started */
  /* A scheduler run by its runtime's caller (ums_runtime_run); whether
  ** to return to the caller at the next pass is attn's UMS__ATTN_PAUSE,
  ** which the owner clears as it returns. */
  _Atomic int64_t run_deadline; /* [atomic, the caller writes] real time
                                  at which ums_runtime_run returns; the
                                  monitor reads it to pause a busy one */
  _Atomic int away;            /* [atomic, owner writes] 1 while its
                                  caller is outside ums_runtime_run: the
                                  monitor counts it as idle */
  bool main_ready;             /* [owner] main_ctx has been set up */
};

/* The scheduler monitor (monitor.c): one thread per runtime. */
typedef struct ums__monitor_slot ums__monitor_slot_t;
typedef struct ums__monitor {
  ums__thread_t *thread;       /* [const] NULL unless started */
  bool started;                /* [const] */
  _Atomic uint32_t word;       /* [atomic] futex word: bumped to wake it */
  _Atomic int asleep;          /* [atomic] waits for a scheduler to get
                                  busy (every scheduler was idle) */
  _Atomic int stop;            /* [atomic] */
  _Atomic uint64_t nstalls;    /* [atomic] stalls reported */
  int64_t tick;                /* [const] ns between looks */
  ums__monitor_slot_t *slots;  /* [monitor thread] one per scheduler */
  /* A binding's looks (ums_runtime_watch, ums-binding.h). */
  ums_watch_fn watch_fn;       /* [const once set, before the first task] */
  void *watch_arg;             /* [const, as watch_fn; the binding's] */
  _Atomic int64_t watch_period;  /* [atomic] ns; 0: no looks */
} ums__monitor_t;

struct ums_runtime {
  ums_config_t cfg;            /* [const] defaults filled in */
  int nsched;                  /* [const] */
  ums__sched_t *scheds;        /* [const] array of nsched */
  pthread_t caller;            /* [const] with cfg.run_on_caller: the
                                  thread that runs scheduler 0 */

  _Atomic int stopping;        /* [atomic] no new spawns */
  _Atomic int exiting;         /* [atomic] schedulers leave their loops */
  _Atomic int cancel_all;      /* [atomic] shutdown deadline passed: no task
                                  starts any more */
  _Atomic uint32_t inflight;   /* [atomic] calls from outside the runtime's
                                  own threads still touching it; shutdown
                                  frees nothing until this is zero */
  _Atomic uint32_t nspinning;  /* [atomic] schedulers spinning for a
                                  peer's post (sched.c, spin_for_peers) */
  /* Work items (work.c): the sums of the schedulers' counts. */
  _Atomic uint32_t nwork;      /* [atomic] items queued anywhere */
  _Atomic uint32_t nwork_free; /* [atomic] of them, placed ones */
  _Atomic uint32_t work_seq;   /* [atomic] items queued so far: a thief
                                  that has not looked since sleeps no more */
  _Atomic uint32_t live;       /* [atomic] unfinished tasks (those of
                                  sched.nlive_own count as one per
                                  scheduler); futex word */
  bool vclock;                 /* [const] the clock is virtual (clock.c) */
  /* The wait clock (waitstats.c): stamp-clock ns, at most a tick behind,
  ** moved forward only. Alone on its line: every scheduler reads it on
  ** each timed park, the monitor writes it once a millisecond. */
  struct {
    _Alignas(64) _Atomic int64_t ns;
    char pad[64 - sizeof(int64_t)];
  } wait_clock;
  bool wait_clock_ticks;       /* [const] the monitor keeps it: some
                                  scheduler times waits on it */
  _Atomic int64_t vnow;        /* [atomic, owner of scheduler 0 writes]
                                  the virtual time, ns */
  _Atomic uint64_t deadlock_state; /* [atomic] the sum of the schedulers'
                                  stuck_seq last reported to on_deadlock:
                                  each state is reported once */
  _Atomic uint64_t deadlock_broken; /* [atomic] the state whose waits that
                                  cancellation cannot end were ended with
                                  UMS_EDEADLK (once per state) */

  int io_backend;              /* [const] UMS_IO_URING or UMS_IO_POOL */
  ums__pool_t io_pool;         /* the hidden scheduler for file I/O */
  ums__pool_t preempt_pool;    /* the hidden scheduler for blocking C calls
                                  (preempt.c): separate from io_pool, so
                                  that slow C calls never delay file I/O
                                  and the other way round */
  ums__monitor_t monitor;      /* stalls and CPU sampling (monitor.c) */
  pthread_mutex_t waits_lock;  /* readers and resets of wait statistics */

  /* Task table. */
  _Atomic(ums__task_t *) chunks[UMS__TASK_MAX_CHUNKS]; /* [atomic] */
  _Atomic uint32_t nslots;     /* [atomic, written under table_lock] */
  pthread_mutex_t table_lock;  /* guards chunk creation and free_tasks */
  ums__task_t *free_tasks;     /* [table_lock] shared free list */
  uint32_t fresh;              /* [table_lock] slots [fresh, nslots) were
                                  never handed out (grow_table) */
};

/* The task in slot of rt's table, or NULL before its chunk exists. */
static inline ums__task_t *ums__task_at(ums_runtime_t *rt, uint32_t slot) {
  ums__task_t *chunk = atomic_load_explicit(
      &rt->chunks[slot / UMS__TASK_CHUNK], memory_order_acquire);
  return chunk ? &chunk[slot % UMS__TASK_CHUNK] : NULL;
}

/* Inline: every unpark starts with it (a channel message's among them). */
static inline ums__task_t *ums__task_lookup(ums_runtime_t *rt, uint64_t id) {
  if (!rt || id == 0) return NULL;
  uint32_t slot = ums__id_slot(id);
  if (slot >= atomic_load_explicit(&rt->nslots, memory_order_acquire))
    return NULL;
  ums__task_t *t = ums__task_at(rt, slot);
  if (!t || atomic_load_explicit(&t->id, memory_order_acquire) != id)
    return NULL;
  return t;
}

/* The task's wait timer (wait.c, declared under "Waits"). */
static inline void ums__wait_timer_init(ums__task_t *t) {
  t->timer.index = 0;
  t->timer.cb = ums__wait_timeout;
}
static inline void ums__wait_timer_arm(ums__sched_t *s, ums__task_t *t,
                                       int64_t deadline) {
  ums__timer_arm(&s->timers, &t->timer, deadline);
}
static inline void ums__wait_timer_stop(ums__sched_t *s, ums__task_t *t) {
  if (ums__timer_armed(&t->timer)) ums__timer_disarm(&s->timers, &t->timer);
}

/* Brackets the work a thread outside the runtime does on it (a host
** thread's spawn, join, cancel, or a wake-up it posts), so that a shutdown
** running concurrently, which may see the last task end in the middle of
** it, does not free the runtime under its feet. */
static inline void ums__rt_enter(ums_runtime_t *rt) {
  atomic_fetch_add(&rt->inflight, 1);
}
static inline void ums__rt_leave(ums_runtime_t *rt) {
  atomic_fetch_sub(&rt->inflight, 1);
}

/* The scheduler the calling thread runs, or NULL. Initial-exec: the
** runtime is often linked into a dlopen'ed Lua module, where the default
** model makes every access a __tls_get_addr call, several per task
** switch; one pointer fits glibc's static TLS surplus,
** which exists for such modules. */
#define UMS__TLS_IE __attribute__((tls_model("initial-exec")))
extern _Thread_local ums__sched_t *ums__tls_sched UMS__TLS_IE;

static inline ums__sched_t *ums__sched_current(void) { return ums__tls_sched; }

/* s's socket readiness set (io-poll.c), NULL before its first socket
** request. [owner] */
static inline ums__poller_t *ums__poller_of(ums__sched_t *s) {
  return atomic_load_explicit(&s->poller, memory_order_relaxed);
}

/* Brackets a public entry point with ums__rt_enter/leave unless the
** caller runs on one of rt's own schedulers (a task, the usual case),
** which needs none: shutdown joins those threads before it frees
** anything. Saves two atomic read-modify-writes per call. */
static inline bool ums__rt_enter_ext(ums_runtime_t *rt) {
  ums__sched_t *s = ums__tls_sched;
  if (s && s->rt == rt) return false;
  ums__rt_enter(rt);
  return true;
}
static inline void ums__rt_leave_ext(ums_runtime_t *rt, bool entered) {
  if (entered) ums__rt_leave(rt);
}
static inline ums__task_t *ums__task_current(void) {
  ums__sched_t *s = ums__tls_sched;
  return s ? s->cur_task : NULL;
}

/* Prepares a wait by the caller (the current task, or the host thread)
** that cancellation must not interrupt. Call with *lock held (lock may be
** NULL for a wait on no queue, such as a sleep). */
static inline void ums__waiter_init_nocancel(ums__waiter_t *w,
                                             ums__wq_t *wq,
                                             ums__lock_t *lock) {
  ums__task_t *t = ums__task_current();
  w->link.prev = w->link.next = NULL;
  w->linked = false;
  w->wq = wq;
  w->lock = lock;
  w->task = t;
  w->data = NULL;
  w->aux = 0;
  w->nocancel = true;
  w->type = UMS_WAIT_PARK;
  w->obj = NULL;
  w->blocker = 0;
  atomic_store_explicit(&w->state, UMS__WAITING, memory_order_relaxed);
}

/* The same for a wait that cancellation ends. Returns 0, or
** UMS_ECANCELED when the current task has been cancelled (UMS_EBUSY with
** a park begun, a step task's start error), in which case nothing was
** set up. */
static inline int ums__waiter_init(ums__waiter_t *w, ums__wq_t *wq,
                                   ums__lock_t *lock) {
  ums__task_t *t = ums__task_current();
  if (t && atomic_load_explicit(&t->cancelled, memory_order_relaxed))
    return UMS_ECANCELED;
  /* A begun park must end first: its unpark would queue the task while it
  ** waits here. (ums_park_begin itself initialises t->park before it sets
  ** park_pending.) */
  if (t && t->park_pending) return UMS_EBUSY;
  /* A step task's last step runs on a stack that is not its own. */
  if (t && UMS__UNLIKELY(t->start_err)) return t->start_err;
  ums__waiter_init_nocancel(w, wq, lock);
  w->nocancel = false;
  return 0;
}

#define UMS__URGENT_STREAK 64
/* Queues a runnable task. [owner] */
void ums__sched_push_runnable(ums__sched_t *s, ums__task_t *t);
/* Hands a task to s from another thread: completion list, plus a wake-up
** that costs a system call only when s is idle. */
void ums__sched_post(ums__sched_t *s, ums__task_t *t);
/* Queues a cancel request for delivery by s's next pass. */
void ums__sched_post_cancel(ums__sched_t *s, ums__task_t *t);
/* Wakes s if it is in its idle wait. */
void ums__sched_wake(ums__sched_t *s);
/* Lowers one of s's in-flight counts (io_pending, io_pool_pending,
** preempt_pending) from another thread, after what the operation posts.
** The last one wakes s if it is in its idle wait: s went to sleep
** counting the operation as a waker, and must look at its state again
** (a deadlock no longer hidden by it, an idle waiter to end). */
void ums__sched_inflight_done(ums__sched_t *s, _Atomic uint32_t *count);
/* Gives a new task to s (called on s's thread or via its inbox). [owner] */
void ums__sched_admit(ums__sched_t *s, ums__task_t *t);
/* The scheduler pass, run by the current context when it has nothing to
** do: the current task parked (state PARKED), yielded (already queued as
** RUNNABLE) or finished (its worker is free). Returns when the current
** context has work again: its own task was picked, or (free worker) a new
** task was bound to it. */
void ums__sched_schedule(ums__sched_t *s);
/* Takes a worker slot for t and queues it runnable. [owner] */
void ums__sched_start_now(ums__sched_t *s, ums__task_t *t);
/* A started task ended: account for it and start a pending spawn. */
void ums__sched_task_ended(ums__sched_t *s);
/* A task waiting for a worker slot (UMS__T_PENDING) was cancelled: takes
** it off the pending list and ends it without running (a step task is
** started instead, so that its binding steps it once and lets go).
** [owner] */
void ums__sched_cancel_pending(ums__sched_t *s, ums__task_t *t);
/* Makes a parked or new task runnable from any thread. */
void ums__task_ready(ums__task_t *t);

/* Wakes what ums__waiter_finish captured. Call without locks held. */
static inline void ums__wake(const ums__wake_t *wk) {
  if (wk->task)
    ums__task_ready(wk->task);
  else if (wk->futex)
    /* The address may belong to a frame that has already returned; a
    ** private futex wake does not touch the memory, so at worst another
    ** futex user sees a spurious wake-up, which all of them tolerate. */
    ums__futex_wake(wk->futex, 1);
}

/* The load placement compares (task.c's least_loaded), also reported as
** the scheduler's load factor. */
static inline int64_t ums__sched_load(const ums__sched_t *s) {
  return atomic_load_explicit(&s->ntasks_in, memory_order_relaxed) +
         atomic_load_explicit(&s->ntasks_own, memory_order_relaxed);
}

/* How long a scheduler with preemptive calls in flight spins before its
** idle wait sleeps (sched.c), and how long a task spins at the call site
** for a call of its own (preempt.c): see sched.c for the reasoning. */
#define UMS__SCHED_SPIN_NS (50 * UMS_NSEC_PER_USEC)
/* How long an idle scheduler spins for a post from another scheduler that
** is running tasks (sched.c, spin_for_peers). */
#define UMS__SCHED_PEER_SPIN_NS (50 * UMS_NSEC_PER_USEC)

/* What a spinning scheduler watches for: a task posted to it, a work item
** queued for it, a cancel, the runtime exiting. Relaxed: a hit is then
** drained with the lists' own ordering. Any thread may look; only the
** owner acts on it. */
static inline bool ums__sched_posted(ums__sched_t *s) {
  return atomic_load_explicit(&s->inbox, memory_order_relaxed) ||
         atomic_load_explicit(&s->nwork, memory_order_relaxed) ||
         atomic_load_explicit(&s->calls_done, memory_order_relaxed) ||
         atomic_load_explicit(&s->cancels, memory_order_relaxed) ||
         atomic_load_explicit(&s->rt->exiting, memory_order_relaxed);
}

/* ====================================================================== */
/* Work items (work.c, ums-binding.h)                                     */
/* ====================================================================== */

/* Bits of ums__sched_t.attn. */
#define UMS__ATTN_DEADLINE 1u  /* run_deadline is set (the caller's, by
                                  ums_runtime_run: written by the owner) */
#define UMS__ATTN_PAUSE 2u     /* return to the caller (ums_runtime_run) */
#define UMS__ATTN_WORK 4u      /* its own queue holds work items (set and
                                  cleared under work_lock, work.c) */

/* Whether s has an item of its own to start, may take a placed item from
** another queue, or has not looked at the queues since an item was
** queued: what ends its idle wait (work.c, "Who is woken"). [owner] */
static inline bool ums__work_ready(ums__sched_t *s) {
  ums_runtime_t *rt = s->rt;
  return atomic_load(&rt->nwork) &&
         !atomic_load_explicit(&s->work_refused, memory_order_relaxed) &&
         (atomic_load(&s->nwork) || atomic_load(&rt->nwork_free) ||
          atomic_load(&rt->work_seq) != s->work_seen) &&
         !atomic_load(&rt->stopping);
}
/* Called by s's pass when nothing is runnable (starving: its own oldest
** item only, when it has waited UMS_WORK_STARVE_NS): takes an item and
** starts it. Returns true when it started (or passed on) one; else sets
** s->work_look. [owner] */
bool ums__work_take(ums__sched_t *s, bool starving);
/* Whether s's own oldest item has waited UMS_WORK_STARVE_NS. [owner] */
bool ums__work_starving(ums__sched_t *s);
/* At the end of ums_runtime_shutdown: the items never taken get their
** start with UMS_WORK_ENDED. */
void ums__work_end(ums_runtime_t *rt);

/* ====================================================================== */
/* Preemptive calls (preempt.c)                                           */
/* ====================================================================== */

/* s's slot record (preempt.c): made with s, freed with it, after the
** pools. */
UMS__HIDDEN int ums__preempt_sched_init(ums__sched_t *s);
UMS__HIDDEN void ums__preempt_sched_destroy(ums__sched_t *s);
/* The pool work of s's slot record, for ums__pool_set_slots. */
UMS__HIDDEN ums__pool_work_t *ums__preempt_slot(ums__sched_t *s);
/* Frees the call records s keeps (preempt.c). [owner, at its end] */
UMS__HIDDEN void ums__preempt_cache_clear(ums__sched_t *s);
/* The pass's step for s->calls_done: unparks the caller of every call
** returned there, in the order they returned. [owner; or, once every
** pool thread has ended, the runtime's teardown] */
UMS__HIDDEN void ums__preempt_reap(ums__sched_t *s);

/* ====================================================================== */
/* Observation (waitstats.c, monitor.c, stats.c)                          */
/* ====================================================================== */

#define UMS__OBS(state, type) ((uint32_t)(state) | (uint32_t)(type) << 8)
#define UMS__OBS_STATE(obs) ((int)((obs)&0xff))
#define UMS__OBS_TYPE(obs) ((int)((obs) >> 8))
#define UMS__LOADR(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define UMS__STORER(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)

/* The clocks waits are timed on (ums__sched_t.stamps). */
enum {
  UMS__STAMPS_WAIT_CLOCK = 0, /* rt->wait_clock: one load */
  UMS__STAMPS_PRECISE = 1,    /* the stamp clock (UMS_STATS_PRECISE) */
  UMS__STAMPS_VIRTUAL = 2     /* the virtual clock */
};

/* A stamp on s's clock (waitstats.c has the reasoning): by default the wait
** clock, a word the monitor sets from the stamp clock every millisecond
** while a scheduler is busy; with UMS_STATS_PRECISE the stamp clock
** itself; on a virtual-clock runtime the virtual time, where a sleep of
** 10 s lasts 10 s of it. */
static inline int64_t ums__stamp_sched(const ums__sched_t *s) {
  if (UMS__LIKELY(s->stamps == UMS__STAMPS_WAIT_CLOCK))
    return atomic_load_explicit(s->wait_clock, memory_order_relaxed);
  if (s->stamps == UMS__STAMPS_VIRTUAL)
    return atomic_load_explicit(&s->rt->vnow, memory_order_relaxed);
  return ums__stamp_now();
}

/* Moves the wait clock forward to now (a stamp-clock reading), never
** back: the monitor at its ticks, a scheduler leaving its idle wait. Any
** thread. */
UMS__HIDDEN void ums__wait_clock_advance(ums_runtime_t *rt, int64_t now);

/* The three moments of a wait (waitstats.c has the reasoning). They run on
** every switch that parks, hence inline: the fast paths are a few stores
** and at most one clock reading. */

/* The running task t parks on w: publishes what it waits for and, with
** stats on, stamps the wait's start (kept as the next pick's "now"). Call
** before the wait can end, that is with w->lock (or t->lock, for a park)
** held. [owner] */
static inline void ums__wait_begin(ums__sched_t *s, ums__task_t *t,
                                   const ums__waiter_t *w) {
  UMS__STORER(t->wait_obj, w->obj);
  UMS__STORER(t->wait_blocker, w->blocker);
  UMS__STORER(t->obs, UMS__OBS(UMS_TASK_SUSPENDED, w->type));
  if (s->timing) {
    /* ready_at stays `now` for a task queued before it parked (a park
    ** unparked before the step returned): runnable all along. */
    int64_t now = ums__stamp_sched(s);
    UMS__STORER(t->wait_since, now);
    UMS__STORER(t->ready_at, now);
    /* A reading of the wait clock is cheaper than keeping it. */
    if (s->stamps != UMS__STAMPS_WAIT_CLOCK) s->now_hint = now;
  }
}

/* t, spawned past max_workers, waits for a worker. [owner] */
void ums__wait_begin_pending(ums__sched_t *s, ums__task_t *t);

/* A stamp for a wake on t's own scheduler when its waker's turn has none
** (waitstats.c). [owner] */
UMS__HIDDEN int64_t ums__wait_ready_stamp(ums__sched_t *s);

/* t was made runnable, by any thread: with stats on, records when, for
** its signal wait (and for readers, who tell a woken task from a waiting
** one by it). Called before t is handed to its scheduler. */
static inline void ums__wait_ready(ums__task_t *t) {
  ums__sched_t *s = t->sched;
  if (!s->timing) return;
  int64_t now;
  if (s->stamps == UMS__STAMPS_WAIT_CLOCK)
    now = ums__stamp_sched(s);
  else if (ums__sched_current() != s)
    now = ums__stamp_sched(s);
  else if ((now = s->seg_start) <= 0)
    now = ums__wait_ready_stamp(s);
  UMS__STORER(t->ready_at, now);
}

/* Adds a finished wait to s's statistics. [owner] */
static inline void ums__wait_record(ums__sched_t *s, int type, int64_t total,
                                    int64_t signal) {
  ums__waitstat_t *w = &s->waits[type];
  UMS__STORER(w->count, UMS__LOADR(w->count) + 1);
  /* On the wait clock most short waits last 0 ticks. */
  if (!(total | signal)) return;
  UMS__STORER(w->total_ns, UMS__LOADR(w->total_ns) + total);
  UMS__STORER(w->signal_ns, UMS__LOADR(w->signal_ns) + signal);
  if (total > UMS__LOADR(w->max_ns)) UMS__STORER(w->max_ns, total);
}

/* The scheduler picked t to run: counts the switch, publishes it, and
** ends t's wait if it had one. No clock is read unless t leaves a timed
** wait that the pass has no stamp for. [owner] */
static inline void ums__obs_pick(ums__sched_t *s, ums__task_t *t) {
  UMS__COUNT(s, context_switches);
  UMS__STORER(s->running, UMS__LOADR(t->id));
  uint32_t obs = UMS__LOADR(t->obs);
  UMS__STORER(t->obs, UMS__OBS(UMS_TASK_RUNNING, UMS_WAIT_NONE));
  if (!s->timing) return;
  int64_t now;
  if (s->stamps == UMS__STAMPS_WAIT_CLOCK) {
    /* One load: nothing to carry along the pass (waitstats.c). */
    if (!UMS__OBS_TYPE(obs)) return;
    now = ums__stamp_sched(s);
  } else {
    int64_t hint = s->now_hint;
    s->now_hint = 0;
    if (!UMS__OBS_TYPE(obs)) {
      s->seg_start = hint;
      return;
    }
    now = hint ? hint : ums__stamp_sched(s);
    s->seg_start = now;
  }
  /* Not clamped here, to keep the switch short: a stamp reused from
  ** earlier in the pass can precede a wake later in the same pass by a
  ** hair (a signal wait a hair below 0), and a waker's turn can begin
  ** before the wait did (a spawn admitted past max_workers in that turn:
  ** a signal wait above its wait). Readers clamp the sums. */
  ums__wait_record(s, UMS__OBS_TYPE(obs), now - UMS__LOADR(t->wait_since),
                   now - UMS__LOADR(t->ready_at));
}

/* The running task yields: it is runnable again. [owner] */
static inline void ums__obs_yield(ums__task_t *t) {
  UMS__STORER(t->obs, UMS__OBS(UMS_TASK_RUNNABLE, UMS_WAIT_NONE));
}

/* Starts and stops the monitor thread (with ums_runtime_new and before
** the runtime is freed). start returns 0 or UMS_EAGAIN. */
int ums__monitor_start(ums_runtime_t *rt);
void ums__monitor_stop(ums_runtime_t *rt);
/* Tells the monitor to end without waiting for it (ums__monitor_stop
** then joins it), so that it ends while the schedulers do. [the thread
** that shuts the runtime down] */
void ums__monitor_stop_begin(ums_runtime_t *rt);
void ums__monitor_wake(ums_runtime_t *rt);
/* A scheduler left its idle wait: wakes the monitor if it sleeps. The
** load pairs with the monitor's (monitor.c): after the scheduler's
** sequentially consistent store of idle_state = 0. */
static inline void ums__monitor_busy(ums_runtime_t *rt) {
  if (UMS__UNLIKELY(atomic_load(&rt->monitor.asleep))) ums__monitor_wake(rt);
}

#endif /* UMS_INTERNAL_H */
