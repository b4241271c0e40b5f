/*
** ums-binding.h: what the language bindings built in this tree use beyond
** ums.h. Not installed: a C host or a C module needs none of it (ums.h's
** ums_preempt and ums_preempt_begin/_end, and ums-lua.h, are their
** interface). What is here exists for the Lua binding's hot paths: a park
** that never leaves its scheduler thread (lchan.c's channels) and the
** preemptive call's fast paths (lext.c, lccall.c), whose cost is a few
** cache lines moved between two threads. The calls are exported from libums so that
** libums-lua, a separate shared object, can call them; the contract is
** written here, next to the declarations.
** Copyright (c) 2026 the ums authors; MIT license, see LICENSE.
*/
#ifndef UMS_BINDING_H
#define UMS_BINDING_H

#include "ums.h"
#include "ums-list.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The runtime's monitor thread (ums.h, stall_threshold) also makes a
** binding's periodic looks, so that a runtime has one monitor thread: the
** Lua binding's quantum finds there the steps that ran past it.
** ums_runtime_watch sets fn(arg, now) once, on the thread that made rt,
** before rt's first task, and starts the monitor if the configuration
** did not need one (returns 0 or UMS_EAGAIN). fn runs on the monitor
** thread every `period` ns while some scheduler is busy (never while all
** are idle), until every task has ended at the shutdown; now is the
** monotonic clock in ns. ums_runtime_watch_period changes the period
** (0: no looks) from any thread. arg stays the binding's and must
** outlive rt's shutdown. */
typedef void (*ums_watch_fn)(void *arg, int64_t now);
UMS_API int ums_runtime_watch(ums_runtime_t *rt, ums_watch_fn fn, void *arg,
                              int64_t period);
UMS_API void ums_runtime_watch_period(ums_runtime_t *rt, int64_t period);

/* A flag of ums_park_begin_ex and ums_park_begin_wait (ums.h).
** UMS_PARK_LOCAL makes a park whose token never leaves the task's
** scheduler thread: only code running on that thread (its other tasks,
** the task's own timer and cancel) ends it, so ums_unpark ends it without
** a lock. Elsewhere ums_unpark refuses the park's token with UMS_EPERM
** (a stale one with UMS_ESRCH, as always). For waits on objects only that
** scheduler's tasks use, such as the Lua binding's channels. */
#define UMS_PARK_LOCAL 2

/* For a binding's objects built on the runtime's (ums.h,
** "Synchronisation"). ums_event_wait_begin_as is ums_event_wait_begin
** with the wait described as `type` on `object` (as ums_park_begin_wait
** describes a park), for objects made of an event, such as the Lua
** binding's wait group and its work requests' join; end it with
** ums_event_wait_end. ums_mutex_delete_held frees m even while a task
** holds it, which a binding whose tasks may end holding a mutex needs
** when the mutex's last user lets go: UMS_EBUSY only while tasks wait on
** it. */
UMS_API int ums_event_wait_begin_as(ums_event_t *e, int64_t deadline,
                                    int type, const void *object);
UMS_API int ums_mutex_delete_held(ums_mutex_t *m);

/* ums_preempt_begin with ums_preempt's spin at the call site: returns 1
** when the call returned during that spin (no park was begun: the caller
** skips the park and calls ums_preempt_end at once, which returns 0), 0
** when the park was begun as by ums_preempt_begin, or an error as
** ums_preempt_begin; UMS_ECANCELED also when the task was cancelled
** during the spin, the call then detached (release(arg) runs on the pool
** once fn has returned). Language bindings use it to skip the yield and
** resume a coroutine needs when it parks. */
UMS_API int ums_preempt_begin_spin(ums_preempt_fn fn, void *arg,
                                   ums_preempt_fn release, int64_t deadline,
                                   ums_preempt_call_t **call);

/* The split form with the call's data inside its record. A call that
** returns while its caller spins costs what its cache lines cost to move
** between the caller's CPU and the pool thread's, one way and back: the
** record and, separately, whatever arg points to. The record has an
** inline area on the same line as everything the pool thread reads first
** (and, for a scheduler's lone call, the line the pool thread hands it
** over by): data kept there travels with the call.
**
** ums_preempt_prepare takes a call record for the calling task and
** stores it in *call and, if area is not NULL, its inline area in *area:
** UMS_PREEMPT_AREA_SIZE bytes aligned to 8, of unspecified contents. The
** caller fills it (typically with fn's arguments and room for its
** results) and begins the call with ums_preempt_begin_prepared, arg
** usually pointing into the area; or gives the record back unused with
** ums_preempt_discard. Returns 0, UMS_EPERM outside a task, UMS_ENOMEM,
** UMS_EINVAL (call is NULL). ums_preempt_area(call) is the area again.
**
** ums_preempt_begin_prepared begins the call in the record: with flags
** UMS_PREEMPT_SPIN as ums_preempt_begin_spin, with 0 as
** ums_preempt_begin, with the same results, from the task that prepared
** it; on every error release(arg) has been called (or will be, as for
** ums_preempt_begin_spin) and the record is no longer the caller's. With
** UMS_PREEMPT_INTERRUPT too, a caller that gives up (deadline, cancel)
** also interrupts fn: the pool thread running it gets a signal whose
** handler does nothing, installed without SA_RESTART and sent again every
** pool tick until fn returns, so a system call blocked in fn fails with
** EINTR and the thread comes back. Only for an fn that returns on EINTR
** and leaves nothing half-done that way (a read or a wait, not a write
** whose partial count matters); without it a detached call runs to its
** end.
**
** The area belongs to the call as arg does (see "Ownership of arg"): to
** fn while it runs; to the caller again when the call returns 0; to
** release once the call is detached. ums_preempt_end_copy is
** ums_preempt_end that, when it returns 0, first copies the area's first
** n bytes to out: after ums_preempt_end returns the area is gone with the
** record. With n > UMS_PREEMPT_AREA_SIZE (or out NULL and n > 0) it
** returns UMS_EINVAL and leaves the call as it was, still to be ended. */
#define UMS_PREEMPT_AREA_SIZE 24
enum { UMS_PREEMPT_SPIN = 1, UMS_PREEMPT_INTERRUPT = 2 };
UMS_API int ums_preempt_prepare(ums_preempt_call_t **call, void **area);
UMS_API void *ums_preempt_area(ums_preempt_call_t *call);
UMS_API void ums_preempt_discard(ums_preempt_call_t *call);
UMS_API int ums_preempt_begin_prepared(ums_preempt_call_t *call,
                                       ums_preempt_fn fn, void *arg,
                                       ums_preempt_fn release,
                                       int64_t deadline, int flags);
UMS_API int ums_preempt_end_copy(ums_preempt_call_t *call, void *out,
                                 size_t n);

/* Names what a prepared call runs (a C function's name), for the report
** of an exhausted pool (ums_pool_exhausted_t.what). what is not copied:
** it must stay valid until the call has returned and been released
** (keep it with what arg holds). NULL: unknown. Before
** ums_preempt_begin_prepared; a record reused for the next call keeps
** no name from the last one. */
UMS_API void ums_preempt_set_what(ums_preempt_call_t *call,
                                  const char *what);

/* ums_task_spawn_step (ums.h) with the options {sched, detached, no
** name}, for a binding's tasks spawned by a task of scheduler `sched`
** onto that scheduler, its usual spawn: called on that scheduler's
** thread, it skips the checks and the placement the general spawn makes
** (the arguments are trusted); called anywhere else, it is the general
** spawn. Same results as ums_task_spawn_step. */
UMS_API int ums_task_spawn_step_here(ums_runtime_t *rt, int sched,
                                     ums_step_fn step, void *arg,
                                     ums_task_t *out);

/* A socket send made now from the caller's own bytes, for a binding
** whose bytes stay put for the whole call (a Lua string on the calling
** task's stack): one send(2) with MSG_DONTWAIT | MSG_NOSIGNAL (and
** flags), on the calling task's scheduler thread, with no request, no
** park and no copy. Returns the bytes sent (possibly fewer than len),
** UMS_EAGAIN when the socket has no room (nothing sent: the caller then
** waits through ums_net_send_begin, whose own try comes first), a send's
** error, UMS_ECANCELED for a cancelled task (nothing sent, as
** ums_net_send_begin refuses), or UMS_EPERM outside a task. */
UMS_API int64_t ums_net_send_now(int fd, const void *data, size_t len,
                                 int flags);

/* The runtime's placement policy, for a binding that keeps work of its
** own per scheduler before that work becomes tasks (work items below use
** it, with each scheduler's queued items as extra): the
** scheduler with the fewest live tasks plus extra[i] (extra: one entry
** per scheduler, or NULL for none) is chosen, here's own winning ties (a
** scheduler index; -1: none), then the lowest index. A scheduler whose
** extra is UMS_PLACE_SKIP is never chosen. ums_task_spawn places a task
** with UMS_ANY_SCHED by the same rule, with here its own scheduler.
** Returns the index, or -1 when every scheduler is skipped. Any thread:
** the loads are read without a lock, so the choice is as of some moment
** during the call. */
#define UMS_PLACE_SKIP INT64_MIN
UMS_API int ums_runtime_place(ums_runtime_t *rt, int here,
                              const int64_t *extra);

/* Work items: work that has not started yet and may start on any
** scheduler, for a binding whose work needs the scheduler it runs on
** before it can become a task (the Lua binding's submitted requests,
** which start in that scheduler's VM). The runtime keeps them in one
** queue per scheduler and starts them where the cores are free
** (work.c):
**   - a scheduler starts the oldest item of its own queue when it has no
**     runnable task left, or once that item has waited
**     UMS_WORK_STARVE_NS while its tasks kept it busy;
**   - a scheduler with nothing runnable and an empty queue steals the
**     oldest item of the longest other queue, in this order: items
**     queued with UMS_ANY_SCHED at once; items queued for a named
**     scheduler only once that scheduler has shown it is busy with
**     something else: never in the first UMS_WORK_GRACE_NS nor while it
**     sleeps in its idle wait (it is on its way), then once it has picked
**     another task since a thief first looked, or after UMS_WORK_STUCK_NS
**     with no pick at all (one task that never yields). A thief that may
**     steal later sleeps until then; no scheduler polls.
** Once started, the item's work is the binding's (it usually spawns a
** task on that scheduler), and nothing moves it any more.
**
** start(w, sched) is called exactly once for every item queued, unless
** ums_work_cancel took it back:
**   - sched >= 0: scheduler sched took it; on that scheduler's thread,
**     between two tasks and inside none (ums_self() is 0, waits fail with
**     UMS_EPERM), on the stack of whatever ran last: it must be short and
**     never wait. A spawn onto sched from here is local. It returns 0, or
**     UMS_WORK_REFUSE when this scheduler cannot take such work (its
**     binding could not set it up): the runtime then never gives sched an
**     item again, moves sched's queue to the schedulers that take work,
**     and queues w there too (the start of w comes later, elsewhere);
**   - sched == UMS_WORK_REFUSED: every scheduler has refused, on the
**     thread of the last refusal or of the ums_work_queue that finds them
**     all refused; the return value is ignored;
**   - sched == UMS_WORK_ENDED: the runtime shut down before any scheduler
**     took it (items are not handed out once ums_runtime_shutdown has
**     begun); on the thread of ums_runtime_shutdown, after the schedulers
**     have stopped; the return value is ignored.
** The caller owns w (fills start, then leaves the other members to the
** runtime) and keeps it alive until its start is called or
** ums_work_cancel returns true. */
typedef struct ums_work ums_work_t;
typedef int (*ums_work_fn)(ums_work_t *w, int sched);
#define UMS_WORK_REFUSE 1
#define UMS_WORK_ENDED (-1)
#define UMS_WORK_REFUSED (-2)
#define UMS_WORK_GRACE_NS (1 * UMS_NSEC_PER_MSEC)
#define UMS_WORK_STUCK_NS (10 * UMS_NSEC_PER_MSEC)
#define UMS_WORK_STARVE_NS (100 * UMS_NSEC_PER_MSEC)
struct ums_work {
  ums_work_fn start;     /* [const: the caller's] */
  /* The runtime's, guarded by the lock of the queue it is in. */
  ums_link_t link;       /* in its scheduler's queue */
  int64_t queued_at;     /* when it was queued (real clock, ns) */
  uint64_t picks;        /* named: its scheduler's task picks when a thief
                            first looked */
  int home;              /* the scheduler whose queue holds it */
  bool named;            /* queued for a scheduler its caller named */
  bool looked;           /* named: a thief has looked at it */
  bool queued;           /* in a queue (false once taken or cancelled) */
};
/* Queues w for scheduler sched, or with UMS_ANY_SCHED where the runtime's
** placement puts it (ums_runtime_place, counting each scheduler's queued
** items as its tasks, the caller's own scheduler winning ties). A
** scheduler that refused work passes a named item on as if placed. Any
** thread. Returns 0 (start will be called), UMS_EINVAL (NULL, no start,
** a bad index) or UMS_ESHUTDOWN (the shutdown has begun; start will not
** be called). */
UMS_API int ums_work_queue(ums_runtime_t *rt, ums_work_t *w, int sched);
/* Takes w back if no scheduler has taken it yet: true, and its start is
** never called; false when it was taken (its start runs or has run) or
** was never queued. Any thread. */
UMS_API bool ums_work_cancel(ums_runtime_t *rt, ums_work_t *w);

#ifdef __cplusplus
}
#endif

#endif
