/*
** sync.c: mutex, semaphore, event and condition variable.
**
** Each object has one spinlock guarding its state and its FIFO wait
** queue. Waiters are granted in the critical section (ums__waiter_finish)
** and woken after it (ums__wake), so no system call or fiber switch
** happens under a lock. A waiter's payload (w->data) is read before the
** grant: once granted, a host thread's waiter may vanish. And once a
** waker has woken anyone it never touches the object again, since the
** woken party may free it: several grants are gathered in a wake list
** and run after the one unlock.
**
** Every wait also has a park-based form (_begin/_end) for step tasks,
** which have no stack to wait on: _begin takes the object at once (0) or
** puts the task's own park waiter on the object's queue (1), a queued park
** (park.c), and _end reads how that park ended. The queue, the grant and
** the handoff are the blocking form's: a granter cannot tell the two kinds
** of waiter apart.
*/
#include "internal.h"

#include <stdlib.h>

/* Who holds a mutex: the task, or for a host thread, the address of a
** thread-local byte (unique per live thread). */
static _Thread_local char host_token;

static void *holder(void) {
  ums__task_t *t = ums__task_current();
  return t ? (void *)t : (void *)&host_token;
}

/* The id of the task a waiter or the caller is, for observers; 0 for a
** host thread. */
static uint64_t task_id(ums__task_t *t) {
  return t ? atomic_load_explicit(&t->id, memory_order_relaxed) : 0;
}

/* Whether a park-based wait whose object is not available gives up at
** once: its deadline has passed (a poll). Read only when the wait would
** park, so the fast paths read no clock. */
static bool deadline_passed(int64_t deadline) {
  return deadline != UMS_FOREVER && deadline <= ums_now();
}

/* Grants the first waiter of q (if any) with outcome and wakes it after
** unlocking l. Returns whether one was granted. */
static bool grant_one_unlock(ums__lock_t *l, ums__wq_t *q, int outcome) {
  ums__wake_t wk;
  bool any = ums__wq_grant_first(q, outcome, &wk) != NULL;
  ums__unlock(l);
  if (any) ums__wake(&wk);
  return any;
}

/* Grants every waiter of q, then unlocks l and wakes them. Call with l
** held. */
static void grant_all_unlock(ums__lock_t *l, ums__wq_t *q, int outcome) {
  ums__wakelist_t wl;
  ums__wakelist_init(&wl);
  ums__wq_grant_all(q, outcome, &wl);
  ums__unlock(l);
  ums__wakelist_run(&wl);
}

/* ====================================================================== */
/* Mutex                                                                   */
/* ====================================================================== */

struct ums_mutex {
  ums__lock_t lock;
  void *owner;     /* [lock] holder() of the owner, or NULL */
  uint64_t owner_id; /* [lock] the owner's task id (0: a host thread),
                      reported as the blocker of its waiters */
  ums__wq_t wq;    /* [lock] waiters; w->data = their holder() */
};

ums_mutex_t *ums_mutex_new(void) { return calloc(1, sizeof(ums_mutex_t)); }

/* Frees m unless a task waits on it, or (unless held_ok) someone holds
** it. */
static int mutex_delete(ums_mutex_t *m, bool held_ok) {
  if (!m) return UMS_EINVAL;
  ums__lock(&m->lock);
  bool busy = m->wq.n || (!held_ok && m->owner);
  ums__unlock(&m->lock);
  if (busy) return UMS_EBUSY;
  free(m);
  return 0;
}

int ums_mutex_delete(ums_mutex_t *m) { return mutex_delete(m, false); }

int ums_mutex_delete_held(ums_mutex_t *m) { return mutex_delete(m, true); }

static int mutex_lock(ums_mutex_t *m, int64_t deadline, bool cancellable) {
  void *self = holder();
  ums__waiter_t w;
  ums__lock(&m->lock);
  if (!m->owner) {
    m->owner = self;
    m->owner_id = task_id(ums__task_current());
    ums__unlock(&m->lock);
    return 0;
  }
  if (m->owner == self) {
    ums__unlock(&m->lock);
    return UMS_EDEADLK;
  }
  if (cancellable) {
    int r = ums__waiter_init(&w, &m->wq, &m->lock);
    if (r) {
      ums__unlock(&m->lock);
      return r;
    }
  } else {
    ums__waiter_init_nocancel(&w, &m->wq, &m->lock);
  }
  w.data = self;
  w.type = UMS_WAIT_MUTEX;
  w.obj = m;
  w.blocker = m->owner_id;
  ums__wq_push(&m->wq, &w);
  /* On success the unlocker has already made us the owner (direct
  ** handoff), so nobody can barge in between. */
  return ums__wait(&w, deadline);
}

int ums_mutex_lock(ums_mutex_t *m, int64_t deadline) {
  if (!m) return UMS_EINVAL;
  return mutex_lock(m, deadline, true);
}

/* The mutex fast path: takes m for self if free. Call with m->lock held;
** returns 0 (taken), UMS_EDEADLK (self holds it) or 1 (busy). */
static int mutex_take(ums_mutex_t *m, void *self) {
  if (!m->owner) {
    m->owner = self;
    m->owner_id = task_id(ums__task_current());
    return 0;
  }
  return m->owner == self ? UMS_EDEADLK : 1;
}

/* Begins a lock with a queued park (flags: 0 or UMS_PARK_NOCANCEL), aux
** kept in the park for the caller. */
static int mutex_lock_begin(ums_mutex_t *m, int64_t deadline, int flags,
                            int64_t aux) {
  void *self = holder();
  ums__lock(&m->lock);
  int r = mutex_take(m, self);
  if (r <= 0) {
    ums__unlock(&m->lock);
    return r;
  }
  if (deadline_passed(deadline)) {
    ums__unlock(&m->lock);
    return UMS_ETIMEDOUT;
  }
  /* Granted means the unlocker made us the owner, as for ums_mutex_lock. */
  return ums__park_on(&m->wq, &m->lock, deadline, flags, UMS_WAIT_MUTEX, m,
                      m->owner_id, self, aux, NULL);
}

int ums_mutex_lock_begin(ums_mutex_t *m, int64_t deadline) {
  if (!m) return UMS_EINVAL;
  return mutex_lock_begin(m, deadline, 0, 0);
}

int ums_mutex_lock_end(ums_mutex_t *m) {
  if (!m) return UMS_EINVAL;
  return ums__park_outcome(&m->wq, NULL);
}

int ums_mutex_is_locked(ums_mutex_t *m) {
  if (!m) return UMS_EINVAL;
  ums__lock(&m->lock);
  int v = m->owner != NULL;
  ums__unlock(&m->lock);
  return v;
}

int ums_mutex_trylock(ums_mutex_t *m) {
  if (!m) return UMS_EINVAL;
  int r = UMS_EBUSY;
  ums__lock(&m->lock);
  if (!m->owner) {
    m->owner = holder();
    m->owner_id = task_id(ums__task_current());
    r = 0;
  }
  ums__unlock(&m->lock);
  return r;
}

int ums_mutex_unlock(ums_mutex_t *m) {
  if (!m) return UMS_EINVAL;
  ums__lock(&m->lock);
  if (m->owner != holder()) {
    ums__unlock(&m->lock);
    return UMS_EPERM;
  }
  ums__waiter_t *next = ums__wq_first(&m->wq);
  m->owner = next ? next->data : NULL;
  m->owner_id = next ? task_id(next->task) : 0;
  grant_one_unlock(&m->lock, &m->wq, 0);
  return 0;
}

/* ====================================================================== */
/* Semaphore                                                               */
/* ====================================================================== */

struct ums_sem {
  ums__lock_t lock;
  int64_t value;   /* [lock] > 0 only while nobody waits */
  ums__wq_t wq;    /* [lock] */
};

ums_sem_t *ums_sem_new(int64_t initial) {
  if (initial < 0) return NULL;
  ums_sem_t *s = calloc(1, sizeof *s);
  if (s) s->value = initial;
  return s;
}

int ums_sem_delete(ums_sem_t *s) {
  if (!s) return UMS_EINVAL;
  ums__lock(&s->lock);
  bool busy = s->wq.n != 0;
  ums__unlock(&s->lock);
  if (busy) return UMS_EBUSY;
  free(s);
  return 0;
}

int ums_sem_acquire(ums_sem_t *s, int64_t deadline) {
  if (!s) return UMS_EINVAL;
  ums__waiter_t w;
  ums__lock(&s->lock);
  if (s->value > 0) {
    s->value--;
    ums__unlock(&s->lock);
    return 0;
  }
  int r = ums__waiter_init(&w, &s->wq, &s->lock);
  if (r) {
    ums__unlock(&s->lock);
    return r;
  }
  w.type = UMS_WAIT_SEMAPHORE;
  w.obj = s;
  ums__wq_push(&s->wq, &w);
  return ums__wait(&w, deadline);
}

int ums_sem_acquire_begin(ums_sem_t *s, int64_t deadline) {
  if (!s) return UMS_EINVAL;
  ums__lock(&s->lock);
  if (s->value > 0) {
    s->value--;
    ums__unlock(&s->lock);
    return 0;
  }
  if (deadline_passed(deadline)) {
    ums__unlock(&s->lock);
    return UMS_ETIMEDOUT;
  }
  /* Granted means a release handed us its unit. */
  return ums__park_on(&s->wq, &s->lock, deadline, 0, UMS_WAIT_SEMAPHORE, s,
                      0, NULL, 0, NULL);
}

int ums_sem_acquire_end(ums_sem_t *s) {
  if (!s) return UMS_EINVAL;
  return ums__park_outcome(&s->wq, NULL);
}

int ums_sem_tryacquire(ums_sem_t *s) {
  if (!s) return UMS_EINVAL;
  int r = UMS_EAGAIN;
  ums__lock(&s->lock);
  if (s->value > 0) {
    s->value--;
    r = 0;
  }
  ums__unlock(&s->lock);
  return r;
}

int ums_sem_release(ums_sem_t *s, int64_t n) {
  if (!s || n <= 0) return UMS_EINVAL;
  ums__lock(&s->lock);
  if (s->value > INT64_MAX - n) {
    ums__unlock(&s->lock);
    return UMS_ERANGE;
  }
  /* Each unit goes to the first waiter, if any; the rest is banked. */
  ums__wakelist_t wl;
  ums__wake_t wk;
  ums__wakelist_init(&wl);
  while (n > 0 && ums__wq_grant_first(&s->wq, 0, &wk)) {
    n--;
    ums__wakelist_add(&wl, &wk);
  }
  s->value += n;
  ums__unlock(&s->lock);
  ums__wakelist_run(&wl);
  return 0;
}

int64_t ums_sem_value(ums_sem_t *s) {
  if (!s) return UMS_EINVAL;
  ums__lock(&s->lock);
  int64_t v = s->value;
  ums__unlock(&s->lock);
  return v;
}

/* ====================================================================== */
/* Event                                                                   */
/* ====================================================================== */

struct ums_event {
  ums__lock_t lock;
  bool manual;     /* [const] */
  bool set;        /* [lock] */
  ums__wq_t wq;    /* [lock] */
};

ums_event_t *ums_event_new(int manual_reset, int initially_set) {
  ums_event_t *e = calloc(1, sizeof *e);
  if (e) {
    e->manual = manual_reset != 0;
    e->set = initially_set != 0;
  }
  return e;
}

int ums_event_delete(ums_event_t *e) {
  if (!e) return UMS_EINVAL;
  ums__lock(&e->lock);
  bool busy = e->wq.n != 0;
  ums__unlock(&e->lock);
  if (busy) return UMS_EBUSY;
  free(e);
  return 0;
}

int ums_event_set(ums_event_t *e) {
  if (!e) return UMS_EINVAL;
  ums__lock(&e->lock);
  if (e->manual) {
    e->set = true;
    grant_all_unlock(&e->lock, &e->wq, 0);
    return 0;
  }
  /* Auto reset: hand the signal to one waiter, or keep it for the next. */
  ums__wake_t wk;
  if (ums__wq_grant_first(&e->wq, 0, &wk)) {
    ums__unlock(&e->lock);
    ums__wake(&wk);
  } else {
    e->set = true;
    ums__unlock(&e->lock);
  }
  return 0;
}

int ums_event_reset(ums_event_t *e) {
  if (!e) return UMS_EINVAL;
  ums__lock(&e->lock);
  e->set = false;
  ums__unlock(&e->lock);
  return 0;
}

int ums_event_wait(ums_event_t *e, int64_t deadline) {
  if (!e) return UMS_EINVAL;
  ums__waiter_t w;
  ums__lock(&e->lock);
  if (e->set) {
    if (!e->manual) e->set = false;
    ums__unlock(&e->lock);
    return 0;
  }
  int r = ums__waiter_init(&w, &e->wq, &e->lock);
  if (r) {
    ums__unlock(&e->lock);
    return r;
  }
  w.type = UMS_WAIT_EVENT;
  w.obj = e;
  ums__wq_push(&e->wq, &w);
  return ums__wait(&w, deadline);
}

int ums_event_wait_begin(ums_event_t *e, int64_t deadline) {
  return ums_event_wait_begin_as(e, deadline, UMS_WAIT_EVENT, e);
}

int ums_event_wait_begin_as(ums_event_t *e, int64_t deadline, int type,
                            const void *object) {
  if (!e || type <= UMS_WAIT_NONE || type >= UMS_WAIT_NTYPES)
    return UMS_EINVAL;
  ums__lock(&e->lock);
  if (e->set) {
    if (!e->manual) e->set = false;
    ums__unlock(&e->lock);
    return 0;
  }
  if (deadline_passed(deadline)) {
    ums__unlock(&e->lock);
    return UMS_ETIMEDOUT;
  }
  /* Granted means a set came (for an auto-reset event, consumed for us). */
  return ums__park_on(&e->wq, &e->lock, deadline, 0, type, object, 0, NULL,
                      0, NULL);
}

int ums_event_wait_end(ums_event_t *e) {
  if (!e) return UMS_EINVAL;
  return ums__park_outcome(&e->wq, NULL);
}

int ums_event_is_set(ums_event_t *e) {
  if (!e) return UMS_EINVAL;
  ums__lock(&e->lock);
  int v = e->set;
  ums__unlock(&e->lock);
  return v;
}

/* ====================================================================== */
/* Condition variable                                                      */
/* ====================================================================== */

struct ums_cond {
  ums__lock_t lock;
  ums__wq_t wq;    /* [lock] */
};

ums_cond_t *ums_cond_new(void) { return calloc(1, sizeof(ums_cond_t)); }

int ums_cond_delete(ums_cond_t *c) {
  if (!c) return UMS_EINVAL;
  ums__lock(&c->lock);
  bool busy = c->wq.n != 0;
  ums__unlock(&c->lock);
  if (busy) return UMS_EBUSY;
  free(c);
  return 0;
}

int ums_cond_wait(ums_cond_t *c, ums_mutex_t *m, int64_t deadline) {
  if (!c || !m) return UMS_EINVAL;
  /* Only the owner may wait; checked first, so that once we are queued the
  ** unlock below cannot fail (nobody else can take m from us). */
  ums__lock(&m->lock);
  bool owner = m->owner == holder();
  ums__unlock(&m->lock);
  if (!owner) return UMS_EPERM;
  ums__waiter_t w;
  ums__lock(&c->lock);
  int r = ums__waiter_init(&w, &c->wq, &c->lock);
  if (r) {
    ums__unlock(&c->lock);
    return r;
  }
  /* Queue first, then release the mutex: a signaller must hold the mutex
  ** to change the predicate, so it cannot signal before we are on the
  ** queue. The cond's lock is dropped around the unlock, whose wake-up may
  ** be a system call; a signal that lands in between has set our state,
  ** and ums__wait then returns (or reschedules us) at once. */
  w.type = UMS_WAIT_COND;
  w.obj = c;
  ums__wq_push(&c->wq, &w);
  ums__unlock(&c->lock);
  if (ums_mutex_unlock(m) != 0) abort();  /* owner checked above */
  ums__lock(&c->lock);
  r = ums__wait(&w, deadline);
  /* The mutex comes back whatever happened; a cancel that arrives now is
  ** seen at the next wait point instead. Only the deadlock detector ends
  ** this wait otherwise (UMS_EDEADLK: the caller does not hold m). */
  int relock = mutex_lock(m, UMS_FOREVER, false);
  return relock ? relock : r;
}

int ums_cond_wait_begin(ums_cond_t *c, ums_mutex_t *m, int64_t deadline) {
  if (!c || !m) return UMS_EINVAL;
  ums__lock(&m->lock);
  bool owner = m->owner == holder();
  ums__unlock(&m->lock);
  if (!owner) return UMS_EPERM;
  /* As in ums_cond_wait: on the queue first, then the mutex goes, so a
  ** signaller (who must hold the mutex to change the predicate) cannot
  ** signal before we wait. A poll still lets the mutex go and takes it
  ** back, as a wait that times out at once would. */
  ums__lock(&c->lock);
  int r = ums__park_on(&c->wq, &c->lock, deadline, 0, UMS_WAIT_COND, c, 0,
                       NULL, 0, NULL);
  if (r < 0) return r;
  if (ums_mutex_unlock(m) != 0) abort();  /* owner checked above */
  return 1;
}

int ums_cond_wait_end(ums_cond_t *c, ums_mutex_t *m) {
  if (!c || !m) return UMS_EINVAL;
  ums__waiter_t *w;
  int r = ums__park_outcome(&m->wq, &w);
  if (r != UMS_EINVAL) {
    /* The re-lock's park ended: the mutex is ours (granted), or the
    ** deadlock detector ended it (UMS_EDEADLK); aux holds the wait's own
    ** outcome. */
    return r ? r : (int)w->aux;
  }
  r = ums__park_outcome(&c->wq, NULL);
  if (r == UMS_EBUSY || r == UMS_EINVAL || r == UMS_EPERM) return r;
  /* The wait ended (signalled, timed out or cancelled); the mutex comes
  ** back whatever happened, through a park that cancellation does not
  ** end. */
  int relock = mutex_lock_begin(m, UMS_FOREVER, UMS_PARK_NOCANCEL, r);
  return relock == 0 ? r : relock;
}

int ums_cond_signal(ums_cond_t *c) {
  if (!c) return UMS_EINVAL;
  ums__lock(&c->lock);
  grant_one_unlock(&c->lock, &c->wq, 0);
  return 0;
}

int ums_cond_broadcast(ums_cond_t *c) {
  if (!c) return UMS_EINVAL;
  ums__lock(&c->lock);
  grant_all_unlock(&c->lock, &c->wq, 0);
  return 0;
}
