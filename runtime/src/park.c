/*
** park.c: step tasks' parking, and ums_park_* for C tasks.
**
** Each task embeds one park waiter (t->park) guarded by t->lock. It sits
** on no queue: ums_unpark, the task's timer and a cancellation all take
** t->lock and race for the same state word, so exactly one ends the park
** (the protocol of wait.c). The winner makes the task runnable exactly
** once; the task's own side only ever parks it, never queues it, which is
** what keeps a step that was unparked before it returned from being run
** twice.
*/
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

int ums_park_begin(int64_t deadline, ums_park_token_t *token) {
  return ums_park_begin_ex(deadline, 0, token);
}

int ums_park_begin_ex(int64_t deadline, int flags, ums_park_token_t *token) {
  return ums_park_begin_wait(deadline, flags, UMS_WAIT_PARK, NULL, 0, token);
}

int ums_park_begin_wait(int64_t deadline, int flags, int type,
                        const void *object, ums_task_t blocker,
                        ums_park_token_t *token) {
  ums__task_t *t = ums__task_current();
  if (!t) return UMS_EPERM;
  if (flags & ~UMS_PARK_NOCANCEL) return UMS_EINVAL;
  if (type <= UMS_WAIT_NONE || type >= UMS_WAIT_NTYPES) return UMS_EINVAL;
  if (t->park_pending) return UMS_EBUSY;
  ums__lock(&t->lock);
  if (flags & UMS_PARK_NOCANCEL) {
    ums__waiter_init_nocancel(&t->park, NULL, &t->lock);
  } else {
    int r = ums__waiter_init(&t->park, NULL, &t->lock);
    if (r) {
      ums__unlock(&t->lock);
      return r;
    }
  }
  t->park.type = (uint8_t)type;
  t->park.obj = object;
  t->park.blocker = blocker;
  t->park_seq++;
  if (token) {
    token->task = atomic_load_explicit(&t->id, memory_order_relaxed);
    token->seq = t->park_seq;
  }
  ums__unlock(&t->lock);
  t->park_deadline = deadline;
  t->park_pending = true;
  return 0;
}

/* Parks the running task until its park ends. Whoever ended the park (an
** unpark that came before this call included) queued the task exactly
** once, so the task always goes through the scheduler to take that one
** wake-up; returning early would leave it queued for the next wait. */
static int park_consume(ums__task_t *t, int64_t deadline) {
  t->park_pending = false;
  /* A cancel delivered while the task was running (itself, or another
  ** task of its scheduler) left it to this wait point. */
  if (atomic_load(&t->cancelled) && !t->park.nocancel)
    ums__waiter_abort(&t->park, UMS_ECANCELED);
  ums__lock(&t->lock);
  return ums__wait(&t->park, deadline);
}

int ums_park_wait(void) {
  ums__task_t *t = ums__task_current();
  if (!t || !t->park_pending) return UMS_EINVAL;
  return park_consume(t, t->park_deadline);
}

void ums__park_drop(ums__task_t *t) {
  ums__waiter_abort(&t->park, UMS_ECANCELED);
  t->park.nocancel = false;
  park_consume(t, UMS_FOREVER);
}

void ums__park_undo(ums__task_t *t) {
  /* Ended like any park, under the lock, so that a stale token or
  ** token_live (sched.c) sees a settled park; but the wake-up is not
  ** delivered: nobody parked, nothing must be queued. */
  ums__wake_t unused;
  ums__lock(&t->lock);
  ums__waiter_finish(&t->park, 0, &unused);
  ums__unlock(&t->lock);
  t->park_pending = false;
}

int ums_park_result(void) {
  ums__task_t *t = ums__task_current();
  if (!t) return UMS_EPERM;
  uint32_t st = atomic_load_explicit(&t->park.state, memory_order_acquire);
  return st == UMS__WAITING ? UMS_EBUSY : (int)st;
}

int ums_unpark(ums_runtime_t *rt, ums_park_token_t token, int outcome) {
  if (!rt || outcome < 0) return UMS_EINVAL;
  bool ext = ums__rt_enter_ext(rt);
  int r = UMS_ESRCH;
  ums__task_t *t = ums__task_lookup(rt, token.task);
  if (t) {
    ums__wake_t wk;
    bool won = false;
    ums__lock(&t->lock);
    if (atomic_load_explicit(&t->id, memory_order_relaxed) == token.task &&
        t->park_seq == token.seq)
      won = ums__waiter_finish(&t->park, outcome, &wk);
    ums__unlock(&t->lock);
    if (won) {
      ums__wake(&wk);
      r = 0;
    }
  }
  ums__rt_leave_ext(rt, ext);
  return r;
}

void ums__park_after_step(ums__sched_t *s, ums__task_t *t) {
  ums__wake_t wk;
  bool wake = false;
  t->park_pending = false;
  ums__lock(&t->lock);
  if (atomic_load_explicit(&t->park.state, memory_order_relaxed) ==
      UMS__WAITING) {
    t->wait = &t->park;
    t->state = UMS__T_PARKED;
    ums__wait_begin(s, t, &t->park);
    /* A cancel that came while the step ran found it running and left it
    ** to the next wait point: this is it. */
    if (atomic_load(&t->cancelled) && !t->park.nocancel)
      wake = ums__waiter_finish(&t->park, UMS_ECANCELED, &wk);
    else if (t->park_deadline != UMS_FOREVER)
      ums__timer_arm(&s->timers, &t->timer, t->park_deadline);
  }
  /* Otherwise the park already ended and its winner queued the task. */
  ums__unlock(&t->lock);
  if (wake) ums__wake(&wk);
}

void ums__step_misuse(ums__task_t *t, const char *what) {
  fprintf(stderr, "ums: step task %s: %s\n",
          t->name[0] ? t->name : "(unnamed)", what);
  abort();
}
