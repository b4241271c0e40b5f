/*
** preempt.c: going preemptive. A task hands a blocking C call to the
** runtime's C-call pool (pool.c, rt->preempt_pool) and parks; the pool
** thread runs it and unparks the task, which its own scheduler then
** resumes (docs/design/preempt.md).
**
** A call is a small heap record shared by two references: the caller's
** (dropped by ums_preempt_end) and the pool's (dropped when the work has
** ended). Exactly one of "returned" and "given up" decides it, with one
** CAS on state, as for file I/O requests (io.c):
**   - the pool thread, after fn returned, moves INFLIGHT -> DONE and, if
**     it won, pushes the call onto its scheduler's calls_done, whose pass
**     unparks the caller (ums__preempt_reap); if it lost, the caller had
**     given up and the pool thread calls release(arg);
**   - the caller, once its park has ended, moves INFLIGHT -> ABANDONED:
**     if it won, its park ended by deadline or cancel and the call goes on
**     detached; if it lost, fn has returned (the unpark may still be on
**     its way, or may have lost to the deadline) and the result is 0.
** The caller looks at the state only after its park has ended, so the
** park's own exactly-one-outcome protocol (park.c) and this one never
** disagree. A pool thread that finds a call already ABANDONED before it
** starts skips fn.
**
** Spinning at the call site (ums_preempt, ums_preempt_begin_spin). When
** the caller's scheduler has nothing else to do (nothing runnable,
** pending or posted, no other call or file I/O in flight, no timer or
** deadline due within the spin), parking would only lead
** to its idle spin (sched.c) waiting for this very call, at the price of
** a park, a switch (for Lua, a yield and a resume) and an unpark through
** the completion list. So the caller submits the call in state SPIN,
** with no park begun, and spins on state itself:
**   - the pool thread, after fn returned, moves SPIN -> DONE: the caller
**     sees it and takes the result, and the pool's reference with it
**     (that CAS is the pool thread's last touch of the record); nobody
**     unparks, nothing is queued;
**   - the caller leaving the spin (budget spent, a task posted to its
**     scheduler, a cancel) first begins its park, storing the token in
**     the record, then moves SPIN -> INFLIGHT with a release CAS, which
**     publishes the token to the pool thread's acquire CAS of INFLIGHT
**     -> DONE; from there on it is the protocol above;
**   - if that CAS finds DONE, the call returned meanwhile: the caller
**     ends its park with ums__park_undo, which queues nothing (the token
**     was never published, no timer is armed, and a cancel does not end
**     the park of a running task), and takes the result;
**   - if the park cannot begin (the task was cancelled), the caller
**     moves SPIN -> ABANDONED instead; losing to DONE, it takes the
**     result as if it had not noticed the cancel.
** So the pool thread's single CAS from whatever it finds decides between
** "the caller sees DONE" (SPIN), "unpark" (INFLIGHT) and "release"
** (ABANDONED), and every state is left by exactly one CAS.
**
** Who touches what: state by both sides, by CAS only (the caller's spin
** loads it with acquire, to see fn's writes); token by the caller before
** it publishes INFLIGHT, by the pool thread only after its CAS saw
** INFLIGHT; next_done by the pool thread that pushes the call, then by
** the scheduler that reaps it; everything else is constant once
** submitted. The scheduler's preempt_pending counts a call from its
** submit, or, for a SPIN call, from the moment its caller stops spinning
** (before its CAS); it is lowered after the caller's unpark for a call
** found INFLIGHT (by the scheduler, in ums__preempt_reap) and after the
** release for one found ABANDONED (by the pool thread).
**
** Records and slots (docs/design/preempt.md, "One cache line for a lone call").
** A scheduler keeps freed records for its next calls, and has one more of its
** own, its slot record (call_lone), which is a slot of the C-call pool (pool.c,
** "Slots"): a spinning caller whose slot record is free (refs 0) posts it
** instead of pushing it onto the queue, so that the pool thread spinning for
** work finds it on the record's own line; when the spin ends unanswered, the
** caller takes the post back if no thread took it and queues the record
** (call_unpost). ums_preempt_prepare hands out a record before its call begins,
** so that the caller can put the call's data in its inline area, on that same
** line.
*/
#include "internal.h"

#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum { CALL_INFLIGHT = 0, CALL_DONE = 1, CALL_ABANDONED = 2, CALL_SPIN = 3 };

/* What a call that returns during its caller's spin touches on both
** threads (state, fn, arg, the inline area, and the pool's run and posts
** words of a posted slot) is its first cache line: records are allocated
** aligned to one. For a lone call through the scheduler's slot record
** (call_lone), with its data in the area, that line is all that moves
** between the two CPUs. The rest, the pool's queue link included, only
** matters to calls that park or queue. */
struct ums_preempt_call {
  _Atomic int state;           /* [atomic] CALL_* */
  ums_preempt_fn fn;           /* [const once begun] */
  void *arg;                   /* [const pointer once begun] the data: the
                                  caller's until it gives up, then
                                  release's */
  union {                      /* [the caller's, then as arg] */
    unsigned char bytes[UMS_PREEMPT_AREA_SIZE];
    uint64_t align;
  } area;
  ums__pool_work_t work;       /* [pool] run, posted and interrupted on
                                  the first line, the queue link after */
  _Atomic uint32_t refs;       /* [atomic] caller + pool */
  const char *what;            /* [caller until begun, then const] what fn
                                  is (ums_preempt_set_what), for reports;
                                  next to refs, which every call writes */
  bool lone;                   /* [const] its scheduler's slot record:
                                  never freed before the scheduler; free
                                  for another call when refs is 0 */
  bool interrupt;              /* [caller until begun, then const]
                                  UMS_PREEMPT_INTERRUPT: giving up
                                  interrupts fn (call_give_up) */
  ums__sched_t *sched;         /* [const] the caller's scheduler */
  ums_preempt_fn release;      /* [const once begun] */
  ums_park_token_t token;      /* [caller until state is INFLIGHT, then
                                  const] the caller's park */
  ums_preempt_call_t *next_free; /* [owner of sched] in its call_free */
  ums_preempt_call_t *next_done; /* [the pushing pool thread, then the
                                    owner of sched] in its calls_done */
};

_Static_assert(offsetof(struct ums_preempt_call, work.interrupted) +
                       sizeof(int) <= UMS__CACHELINE,
               "a spun call's fields share the record's first line");

/* Records a scheduler keeps for its next calls. */
#define CALL_CACHE_MAX 256
/* The spin at the call site: as long as the idle scheduler's. */
#define CALL_SPIN_NS UMS__SCHED_SPIN_NS

static void call_unref(ums_preempt_call_t *c) {
  if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
    return;
  /* The slot record is free again (its owner reads refs with acquire). */
  if (c->lone) return;
  /* Back to its scheduler's cache when that scheduler drops the last
  ** reference (the caller, the usual case); a pool thread frees. */
  ums__sched_t *s = c->sched;
  if (ums__sched_current() == s && s->ncall_free < CALL_CACHE_MAX) {
    c->next_free = s->call_free;
    s->call_free = c;
    s->ncall_free++;
    return;
  }
  free(c);
}

static void call_run(ums__pool_work_t *w);

int ums__preempt_sched_init(ums__sched_t *s) {
  ums_preempt_call_t *c = ums__cacheline_alloc(sizeof *c);
  if (!c) return UMS_ENOMEM;
  memset(c, 0, sizeof *c);
  c->lone = true;
  c->sched = s;
  c->work.run = call_run;
  s->call_lone = c;
  return 0;
}

void ums__preempt_sched_destroy(ums__sched_t *s) {
  free(s->call_lone);
  s->call_lone = NULL;
}

ums__pool_work_t *ums__preempt_slot(ums__sched_t *s) {
  return &s->call_lone->work;
}

void ums__preempt_cache_clear(ums__sched_t *s) {
  while (s->call_free) {
    ums_preempt_call_t *c = s->call_free;
    s->call_free = c->next_free;
    free(c);
  }
  s->ncall_free = 0;
}

/* The pool's side: runs fn unless the caller has already given up, then
** settles the call. Runs on a pool thread (or on the caller's own thread
** when the pool could not start one). */
static void call_run(ums__pool_work_t *w) {
  ums_preempt_call_t *c = UMS__CONTAINER_OF(w, ums_preempt_call_t, work);
  if (atomic_load_explicit(&c->state, memory_order_acquire) !=
      CALL_ABANDONED)
    c->fn(c->arg);
  /* One CAS from whatever state the caller left: SPIN (it spins, and
  ** sees DONE), INFLIGHT (it parked: unpark it), or ABANDONED (it gave
  ** up: release). The caller may move SPIN -> INFLIGHT or ABANDONED and
  ** INFLIGHT -> ABANDONED meanwhile; a failed CAS reloads seen. */
  int seen = atomic_load_explicit(&c->state, memory_order_acquire);
  while (seen != CALL_ABANDONED &&
         !atomic_compare_exchange_weak_explicit(&c->state, &seen, CALL_DONE,
                                                memory_order_acq_rel,
                                                memory_order_acquire)) {
  }
  if (seen == CALL_SPIN) {
    /* The caller still spins: it sees DONE and takes the result. It
    ** never counted the call in preempt_pending, which only says when an
    ** idle scheduler should spin for a completion. Our reference goes to
    ** the caller with the CAS, our last touch of c (take_spun): a
    ** decrement here would pull the line back from the spinning caller
    ** once more. */
    return;
  }
  /* Not before: for a spun call, a line the pool thread need not read. */
  ums__sched_t *s = c->sched;
  if (seen == CALL_INFLIGHT) {
    /* The caller's scheduler unparks it (ums__preempt_reap), with our
    ** reference: the task, its lock and its park stay on that
    ** scheduler's CPU, and calls that return together are reaped in one
    ** pass. The scheduler outlives this: the runtime destroys the pool
    ** before its schedulers. */
    ums_preempt_call_t *head =
        atomic_load_explicit(&s->calls_done, memory_order_relaxed);
    do {
      c->next_done = head;
    } while (!atomic_compare_exchange_weak_explicit(
        &s->calls_done, &head, c, memory_order_release,
        memory_order_relaxed));
    ums__sched_wake(s);
    return;
  } else {
    /* ABANDONED, by a caller that gave up parked or spinning. */
    if (c->release) c->release(c->arg);
    call_unref(c);
  }
  /* After the release, so that the count covers the call until its end;
  ** the scheduler may have gone idle counting it. */
  ums__sched_inflight_done(s, &s->preempt_pending);
}

void ums__preempt_reap(ums__sched_t *s) {
  ums_preempt_call_t *c =
      atomic_exchange_explicit(&s->calls_done, NULL, memory_order_acquire);
  /* A LIFO stack: reversed, the callers wake in the order their calls
  ** returned. */
  ums_preempt_call_t *prev = NULL;
  while (c) {
    ums_preempt_call_t *next = c->next_done;
    c->next_done = prev;
    prev = c;
    c = next;
  }
  bool owner = ums__sched_current() == s;
  for (c = prev; c; c = prev) {
    prev = c->next_done;
    /* A stale token (the park already ended by its deadline or a cancel)
    ** is refused, and the caller then finds DONE. At teardown every task
    ** has ended: only the pool's reference is left to drop. */
    if (owner) ums_unpark(s->rt, c->token, 0);
    call_unref(c);
    /* After the unpark: the idle wait spins while the count is up. */
    atomic_fetch_sub_explicit(&s->preempt_pending, 1, memory_order_release);
  }
}

/* The caller saw DONE that the pool thread's CAS made from SPIN: that
** CAS was its last touch of c, and handed its reference over (call_run).
** [caller, after an acquire load of DONE] */
static void take_spun(ums_preempt_call_t *c) {
  atomic_store_explicit(&c->refs, 1, memory_order_relaxed);
}

/* A record for a call on s, held by the caller alone (refs 1), not
** begun: the scheduler's slot record when it is free, else one from the
** cache or the heap. NULL: no memory. [owner] */
static ums_preempt_call_t *call_get(ums__sched_t *s) {
  ums_preempt_call_t *c = s->call_lone;
  /* Acquire: the last call's pool thread is done with it (call_unref). */
  if (!c || atomic_load_explicit(&c->refs, memory_order_acquire) != 0) {
    if ((c = s->call_free)) {
      s->call_free = c->next_free;
      s->ncall_free--;
    } else if ((c = ums__cacheline_alloc(sizeof *c))) {
      c->lone = false;
      c->sched = s;
      c->work.run = call_run; /* for good: records serve calls only */
    } else {
      return NULL;
    }
  }
  atomic_store_explicit(&c->refs, 1, memory_order_relaxed);
  c->what = NULL;
  c->interrupt = false;
  return c;
}

/* The caller has just moved c to ABANDONED (and still holds its
** reference, so c is not reused meanwhile): an interruptible call's pool
** thread is signalled out of its system call. A call not yet started, or
** already returned, has no thread to signal; one queued is skipped
** (call_run). [owner] */
static void call_give_up(ums_preempt_call_t *c) {
  if (c->interrupt)
    ums__pool_interrupt(&c->sched->rt->preempt_pool, &c->work);
}

/* Hands c to the pool's queue, or runs it here when the pool has no
** thread and can start none (rather than fail a call that could be made,
** this blocks the scheduler for its length; its unpark then ends a park
** not yet waited on, which the park protocol allows, and a spinning
** caller finds DONE at once). The submit's release CAS (or the queue's
** lock) publishes the record to the pool thread. */
static void call_queue(ums__sched_t *s, ums_preempt_call_t *c) {
  /* Who waits and for what, for the pool's exhaustion report; only
  ** queued calls need it, not one a spinning thread takes from a slot. */
  ums__task_t *t = ums__task_current();
  c->work.task = t ? atomic_load_explicit(&t->id, memory_order_relaxed) : 0;
  c->work.what = c->what;
  if (ums__pool_submit(&s->rt->preempt_pool, &c->work) != 0)
    call_run(&c->work);
}

/* Hands c to the pool. A call in state SPIN is not counted in
** preempt_pending until its caller stops spinning: the pool thread lowers
** the count only for calls it finds INFLIGHT or ABANDONED, so that a call
** completed by the spin touches that shared word (a cache line the pool
** thread would pull over) on neither side. The slot record of a spinning
** caller is posted (pool.c, "Slots"): returns true then, and the caller
** must take it back (call_unpost) when it stops spinning. */
static bool call_submit(ums__sched_t *s, ums_preempt_call_t *c) {
  UMS__COUNT(s, preempt_calls);
  if (atomic_load_explicit(&c->state, memory_order_relaxed) != CALL_SPIN) {
    atomic_fetch_add_explicit(&s->preempt_pending, 1, memory_order_relaxed);
  } else if (c->lone &&
             ums__pool_post(&s->rt->preempt_pool, (uint32_t)s->id)) {
    return true;
  }
  call_queue(s, c);
  return false;
}

/* The caller of a posted slot record stops spinning: a record no pool
** thread has taken yet goes to the queue like any other call (state still
** SPIN: the pool thread's CAS decides as ever), so that it never waits on
** a thread blocked in a long call, which only the queue's monitor sees.
** [owner] */
static void call_unpost(ums__sched_t *s, ums_preempt_call_t *c) {
  if (ums__pool_unpost(&s->rt->preempt_pool, (uint32_t)s->id))
    call_queue(s, c);
}

/* Whether t may wait for a call of its own by spinning (see the top of
** the file): its scheduler has nothing else to do, and nothing that is
** due within the spin. Sets *limit to when the spin must end at the
** latest (UMS_FOREVER: the spin's own budget). [owner] */
static bool spin_allowed(ums__sched_t *s, ums__task_t *t, int64_t deadline,
                         int64_t *limit) {
  if (s->rt->vclock || s->runq_n || !ums_list_empty(&s->pending) || s->nidle_waiters ||
      t->park_pending ||
      atomic_load_explicit(&t->cancelled, memory_order_relaxed) ||
      ums__sched_posted(s) ||
      /* Other calls or file I/O in flight: their completions will want
      ** the scheduler, and with many calls queued ahead of ours a spin
      ** would only hold a CPU the pool threads need. io_uring
      ** completions, besides, arrive in the ring, which only the pass
      ** reaps. */
      atomic_load_explicit(&s->preempt_pending, memory_order_relaxed) ||
      atomic_load_explicit(&s->io_pending, memory_order_relaxed))
    return false;
  *limit = ums__timer_next(&s->timers);
  if (deadline < *limit) *limit = deadline;
  if (*limit != UMS_FOREVER && *limit - ums__clock_now() <= CALL_SPIN_NS)
    return false;
  /* Last: it counts the spins it lets through. */
  return ums__spin_worth(&s->call_spin, CALL_SPIN_NS);
}

/* The caller's spin for c, in state SPIN. Returns true when c is DONE;
** false, without a clock reading after the last, when the spin should
** end: its budget is spent (by limit too), something was posted to the
** scheduler, the task was cancelled. [owner] */
static bool spin_for_call(ums__sched_t *s, ums__task_t *t,
                          ums_preempt_call_t *c, int64_t limit) {
  int64_t start = 0, until = 0;
  for (unsigned i = 1;; i++) {
    if (atomic_load_explicit(&c->state, memory_order_acquire) == CALL_DONE) {
      /* Most calls return before the first clock reading: a hit well
      ** under the limit, whatever it took exactly (as in sched.c). */
      ums__spin_note(&s->call_spin, start ? ums__clock_real() - start : 0,
                     true, CALL_SPIN_NS);
      return true;
    }
    if (ums__sched_posted(s) ||
        atomic_load_explicit(&t->cancelled, memory_order_relaxed))
      return false;
    ums__cpu_relax();
    /* The clock only every 64 pauses: a reading costs many pauses. */
    if ((i & 63) == 0) {
      int64_t now = ums__clock_real();
      if (!start) {
        start = now;
        until = now + CALL_SPIN_NS;
        if (limit != UMS_FOREVER && limit < until) until = limit;
      } else if (now >= until) {
        ums__spin_note(&s->call_spin, 0, false, CALL_SPIN_NS);
        return false;
      }
      /* On a crowded machine the pool thread we wait for may be waiting
      ** for this very CPU. */
      if ((i & 255) == 0) sched_yield();
    }
  }
}

/* Begins the call c (held by the caller alone, refs 1) and, when the
** scheduler has nothing else to do, spins for it. Returns 1: the call has
** returned (c is DONE, no park begun); 0: the park is begun and c is
** INFLIGHT (or already DONE, the unpark on its way); or an error, with
** release(arg) called or left to the pool, and c released. */
static int call_start(ums__task_t *t, ums_preempt_call_t *c,
                      ums_preempt_fn fn, void *arg, ums_preempt_fn release,
                      int64_t deadline, bool spin) {
  ums__sched_t *s = t->sched;
  int64_t limit = UMS_FOREVER;
  int rc;
  bool spinning = spin && spin_allowed(s, t, deadline, &limit);
  /* Written just before the submit, and only if they change (the same
  ** function and area call after call, from a binding): a pool thread
  ** spinning on the slot reads this line meanwhile, and every store
  ** that comes after it has taken the line back costs a round trip. */
  if (c->fn != fn) c->fn = fn;
  if (c->arg != arg) c->arg = arg;
  c->release = release;
  if (spinning) {
    atomic_store_explicit(&c->refs, 2, memory_order_relaxed);
    atomic_store_explicit(&c->state, CALL_SPIN, memory_order_relaxed);
    bool posted = call_submit(s, c);
    if (spin_for_call(s, t, c, limit)) {
      take_spun(c);
      UMS__COUNT(s, preempt_spun);
      return 1;
    }
    /* Leaving the spin: off the slot if no thread took it, the park,
    ** then INFLIGHT, which publishes its token to the pool thread. The
    ** call counts as in flight from then on; the increment comes before
    ** the CAS, so the pool thread's decrement, which follows its CAS,
    ** comes after it. */
    if (posted) call_unpost(s, c);
    int expect = CALL_SPIN;
    rc = ums_park_begin_wait(deadline, 0, UMS_WAIT_PREEMPT, NULL, 0,
                             &c->token);
    atomic_fetch_add_explicit(&s->preempt_pending, 1, memory_order_relaxed);
    if (rc == 0) {
      if (atomic_compare_exchange_strong_explicit(
              &c->state, &expect, CALL_INFLIGHT, memory_order_acq_rel,
              memory_order_acquire))
        return 0;
      /* DONE came meanwhile: nobody will end this park but us. */
      ums__park_undo(t);
    } else if (atomic_compare_exchange_strong_explicit(
                   &c->state, &expect, CALL_ABANDONED, memory_order_acq_rel,
                   memory_order_acquire)) {
      /* Cancelled while spinning: the call goes on detached and the pool
      ** thread calls release(arg). */
      call_give_up(c);
      call_unref(c);
      return rc;
    }
    /* The pool thread found SPIN: it will not lower the count. */
    take_spun(c);
    atomic_fetch_sub_explicit(&s->preempt_pending, 1, memory_order_relaxed);
    UMS__COUNT(s, preempt_spun);
    return 1;
  }

  atomic_store_explicit(&c->state, CALL_INFLIGHT, memory_order_relaxed);
  if ((rc = ums_park_begin_wait(deadline, 0, UMS_WAIT_PREEMPT, NULL, 0,
                                &c->token)) != 0) {
    /* Never submitted: release first (arg may be in the area), then
    ** the record back to the cache. */
    if (release) release(arg);
    call_unref(c);
    return rc;
  }
  atomic_store_explicit(&c->refs, 2, memory_order_relaxed);
  call_submit(s, c);
  return 0;
}

int ums_preempt_prepare(ums_preempt_call_t **call, void **area) {
  ums__task_t *t = ums__task_current();
  if (!call) return UMS_EINVAL;
  if (!t) return UMS_EPERM;
  ums_preempt_call_t *c = call_get(t->sched);
  if (!c) return UMS_ENOMEM;
  *call = c;
  if (area) *area = c->area.bytes;
  return 0;
}

void ums_preempt_set_what(ums_preempt_call_t *call, const char *what) {
  if (call) call->what = what;
}

void *ums_preempt_area(ums_preempt_call_t *call) {
  return call ? call->area.bytes : NULL;
}

void ums_preempt_discard(ums_preempt_call_t *call) {
  if (call) call_unref(call);
}

int ums_preempt_begin_prepared(ums_preempt_call_t *call, ums_preempt_fn fn,
                               void *arg, ums_preempt_fn release,
                               int64_t deadline, int flags) {
  ums__task_t *t = ums__task_current();
  if (!call || !fn || !t || t->sched != call->sched) {
    /* release first: arg may be in the area. call_unref frees a record
    ** on a thread not its scheduler's. */
    if (release) release(arg);
    if (call) call_unref(call);
    return !t ? UMS_EPERM : UMS_EINVAL;
  }
  call->interrupt = (flags & UMS_PREEMPT_INTERRUPT) != 0;
  return call_start(t, call, fn, arg, release, deadline,
                    (flags & UMS_PREEMPT_SPIN) != 0);
}

static int begin(ums_preempt_fn fn, void *arg, ums_preempt_fn release,
                 int64_t deadline, bool spin, ums_preempt_call_t **call) {
  ums__task_t *t = ums__task_current();
  if (!fn || !call) {
    if (release) release(arg);
    return UMS_EINVAL;
  }
  if (!t) {
    if (release) release(arg);
    return UMS_EPERM;
  }
  ums_preempt_call_t *c = call_get(t->sched);
  if (!c) {
    if (release) release(arg);
    return UMS_ENOMEM;
  }
  /* Stored only on success: on failure *call may be inside arg, which
  ** release may have freed (or a pool thread may free at any moment). */
  int rc = call_start(t, c, fn, arg, release, deadline, spin);
  if (rc >= 0) *call = c;
  return rc;
}

int ums_preempt_begin(ums_preempt_fn fn, void *arg, ums_preempt_fn release,
                      int64_t deadline, ums_preempt_call_t **call) {
  return begin(fn, arg, release, deadline, false, call);
}

int ums_preempt_begin_spin(ums_preempt_fn fn, void *arg,
                           ums_preempt_fn release, int64_t deadline,
                           ums_preempt_call_t **call) {
  return begin(fn, arg, release, deadline, true, call);
}

int ums_preempt_end_copy(ums_preempt_call_t *c, void *out, size_t n) {
  /* Refused without ending the call: it is still the caller's to end. */
  if (!c || n > UMS_PREEMPT_AREA_SIZE || (n && !out)) return UMS_EINVAL;
  int rc = 0, expect = CALL_INFLIGHT;
  /* The usual case, DONE, is final: a load (acquire: fn's writes are
  ** visible) spares the CAS. */
  if (atomic_load_explicit(&c->state, memory_order_acquire) != CALL_DONE &&
      atomic_compare_exchange_strong(&c->state, &expect, CALL_ABANDONED)) {
    /* The park ended without the call's unpark: by its deadline or a
    ** cancellation. The call goes on detached; release frees arg. */
    rc = ums_park_result();
    if (rc >= 0) rc = UMS_ECANCELED; /* a foreign unpark: still given up */
    call_give_up(c);
  } else if (n) {
    /* fn has returned: the area is the caller's until the unref. */
    memcpy(out, c->area.bytes, n);
  }
  call_unref(c);
  return rc;
}

int ums_preempt_end(ums_preempt_call_t *c) {
  return ums_preempt_end_copy(c, NULL, 0);
}

int ums_preempt(ums_preempt_fn fn, void *arg, ums_preempt_fn release,
                int64_t deadline) {
  if (!fn) {
    if (release) release(arg);
    return UMS_EINVAL;
  }
  ums__task_t *t = ums__task_current();
  if (!t) {
    fn(arg);
    return 0;
  }
  ums_preempt_call_t *c = call_get(t->sched);
  if (!c) {
    if (release) release(arg);
    return UMS_ENOMEM;
  }
  int rc = call_start(t, c, fn, arg, release, deadline, true);
  if (rc < 0) return rc;
  if (rc == 0) ums_park_wait();
  return ums_preempt_end(c);
}
