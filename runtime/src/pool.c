/*
** pool.c: a pool of OS threads, the "hidden scheduler" onto which work
** that would block a scheduler goes (seed 000, "Hidden Schedulers"). File
** I/O uses one when io_uring is unavailable or does not support an
** operation; blocking C calls will use another, so nothing here knows
** about I/O: a work item is a run() function that completes its own
** owner.
**
** Threads start on demand (when work is queued and no thread is idle), up
** to max, and end after idle_timeout without work. A thread that ends
** cannot join itself, so it stays on the list until the next thread start
** or the pool's destruction joins it: no thread outlives the pool.
**
** Handoff: waking a thread asleep on a condition variable costs tens of
** microseconds on a small VM (a futex round trip was measured at ~80 us),
** which is more than most blocking C calls take. So an idle thread may
** first spin for spin_ns, watching queued_hint, before it sleeps; work
** queued meanwhile is taken without any system call on either side. At
** most MAX_SPINNERS threads spin at once, so an idle pool of many threads
** burns at most that many CPUs, for at most spin_ns after its last work.
** A submitter signals the condition variable only when there is more
** queued work than spinning threads to take it.
**
** Interrupts: a run() blocked in a system call (a read from a pipe nobody
** writes to) is woken with a signal whose handler does nothing, installed
** without SA_RESTART, so the call fails with EINTR; run() then sees its
** work marked interrupted and gives up instead of retrying. A signal can
** land just before the thread enters the call and be lost, which is why
** an interrupt is best effort, and why destroy repeats it until the work
** has ended.
*/
#include "internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A real-time signal nobody else in the process is likely to use (the Lua
** binding's quantum uses SIGURG). Its handler is installed only if the
** signal still has its default action; if somebody else owns it, the pool
** does not send it (interrupts then only take effect between calls). */
#define POOL_SIGNAL (SIGRTMIN + 5)
#define DESTROY_RETRY_NS (5 * UMS_NSEC_PER_MSEC)
/* Threads that may spin for work at the same time. */
#define MAX_SPINNERS 1

struct ums__pool_thread {
  pthread_t thread;
  ums__pool_t *pool;
  ums__pool_work_t *current;     /* [pool lock] the work it runs, or NULL.
                                    Compared, never dereferenced: run() may
                                    have freed it already */
  _Atomic int stop;              /* [atomic] destroy interrupts whatever
                                    this thread runs */
  bool exited;                   /* [pool lock] left its loop */
  ums__pool_thread_t *next;      /* [pool lock] */
};

static pthread_once_t signal_once = PTHREAD_ONCE_INIT;
static _Thread_local ums__pool_thread_t *pool_self;
static bool signal_ok;

static void on_pool_signal(int sig) { (void)sig; }

static void install_signal(void) {
  struct sigaction old, sa;
  if (sigaction(POOL_SIGNAL, NULL, &old) != 0) return;
  if (old.sa_handler != SIG_DFL) return;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_pool_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0; /* no SA_RESTART: the point is to end the call */
  signal_ok = sigaction(POOL_SIGNAL, &sa, NULL) == 0;
}

static void abs_deadline(struct timespec *ts, int64_t ns_from_now) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  int64_t t = (int64_t)ts->tv_sec * UMS_NSEC_PER_SEC + ts->tv_nsec;
  t = ns_from_now > INT64_MAX - t ? INT64_MAX : t + ns_from_now;
  ts->tv_sec = t / UMS_NSEC_PER_SEC;
  ts->tv_nsec = t % UMS_NSEC_PER_SEC;
}

int ums__pool_init(ums__pool_t *p, const char *name, uint32_t max,
                   int64_t idle_timeout, int64_t spin_ns) {
  memset(p, 0, sizeof *p);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (pthread_mutex_init(&p->lock, NULL) != 0) return UMS_ENOMEM;
  if (pthread_cond_init(&p->work_cv, &ca) != 0 ||
      pthread_cond_init(&p->exit_cv, &ca) != 0) {
    pthread_condattr_destroy(&ca);
    return UMS_ENOMEM;
  }
  pthread_condattr_destroy(&ca);
  p->max = max ? max : 1;
  p->idle_timeout = idle_timeout;
  p->spin_ns = spin_ns > 0 ? spin_ns : 0;
  p->name = name;
  pthread_once(&signal_once, install_signal);
  return 0;
}

/* Joins the threads that have left their loop. [lock, released around the
** joins: an exited thread touches nothing of the pool any more] */
static void join_exited(ums__pool_t *p) {
  ums__pool_thread_t **link = &p->threads, *done = NULL;
  while (*link) {
    ums__pool_thread_t *th = *link;
    if (th->exited) {
      *link = th->next;
      th->next = done;
      done = th;
    } else {
      link = &th->next;
    }
  }
  if (!done) return;
  pthread_mutex_unlock(&p->lock);
  while (done) {
    ums__pool_thread_t *next = done->next;
    pthread_join(done->thread, NULL);
    free(done);
    done = next;
  }
  pthread_mutex_lock(&p->lock);
}

/* Spins without the lock until work is queued, the pool stops or spin_ns
** passes. The caller then takes the lock and looks again: the hint only
** says when looking is worth it. */
static void spin_for_work(ums__pool_t *p) {
  int64_t until = ums__clock_now() + p->spin_ns;
  for (unsigned i = 1;; i++) {
    if (atomic_load_explicit(&p->queued_hint, memory_order_relaxed))
      return;
    ums__cpu_relax();
    /* The clock costs ~30 ns; a pause is ~40 cycles or more. */
    if ((i & 63) == 0 && ums__clock_now() >= until) return;
  }
}

static void *pool_main(void *arg) {
  ums__pool_thread_t *self = arg;
  ums__pool_t *p = self->pool;
  pool_self = self;
  char name[16];
  snprintf(name, sizeof name, "%s", p->name);
  pthread_setname_np(pthread_self(), name);
  bool spun = false; /* spun since the last work: sleep next */

  pthread_mutex_lock(&p->lock);
  for (;;) {
    ums__pool_work_t *w = p->head;
    if (!w) {
      if (p->stopping) break;
      if (p->spin_ns && !spun && p->nspinning < MAX_SPINNERS) {
        /* Counted as idle, so a submitter relies on it rather than start
        ** a thread, and as spinning, so it does not signal either. */
        p->nidle++;
        p->nspinning++;
        pthread_mutex_unlock(&p->lock);
        spin_for_work(p);
        pthread_mutex_lock(&p->lock);
        p->nspinning--;
        p->nidle--;
        spun = true;
        continue;
      }
      p->nidle++;
      int r = 0;
      if (p->idle_timeout < 0) {
        pthread_cond_wait(&p->work_cv, &p->lock);
      } else {
        struct timespec ts;
        abs_deadline(&ts, p->idle_timeout);
        r = pthread_cond_timedwait(&p->work_cv, &p->lock, &ts);
      }
      p->nidle--;
      if (r == ETIMEDOUT && !p->head) break;
      continue;
    }
    p->head = w->next;
    if (!p->head) p->tail = NULL;
    p->nqueued--;
    atomic_store_explicit(&p->queued_hint, p->nqueued, memory_order_relaxed);
    self->current = w;
    pthread_mutex_unlock(&p->lock);
    w->run(w); /* may free w */
    pthread_mutex_lock(&p->lock);
    self->current = NULL;
    spun = false; /* after work, another spin is worth it */
  }
  p->nthreads--;
  self->exited = true;
  pthread_cond_broadcast(&p->exit_cv);
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

/* [lock] */
static int start_thread(ums__pool_t *p) {
  join_exited(p);
  ums__pool_thread_t *th = calloc(1, sizeof *th);
  if (!th) return UMS_ENOMEM;
  th->pool = p;
  /* Pool threads never run the handler of a signal meant for a scheduler
  ** or the host: they start with everything blocked but our own, and but
  ** the signals of a fault in the work itself. Those are the thread's own
  ** and cannot be put off: POSIX leaves a blocked SIGSEGV undefined, and
  ** Linux then resets it to the default action, so a crash handler (a
  ** sanitizer's, the host's) would never run for a crash on a pool
  ** thread. */
  sigset_t all, old;
  sigfillset(&all);
  sigdelset(&all, POOL_SIGNAL);
  static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
                               SIGSYS};
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
    sigdelset(&all, faults[i]);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int r = pthread_create(&th->thread, NULL, pool_main, th);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r != 0) {
    free(th);
    return UMS_EAGAIN;
  }
  th->next = p->threads;
  p->threads = th;
  p->nthreads++;
  return 0;
}

int ums__pool_submit(ums__pool_t *p, ums__pool_work_t *w) {
  w->next = NULL;
  atomic_store_explicit(&w->interrupted, 0, memory_order_relaxed);
  pthread_mutex_lock(&p->lock);
  /* One more thread when every idle one already has queued work to take.
  ** If none can start, the work still queues as long as some thread is
  ** alive to take it in turn. */
  if (p->nqueued + 1 > p->nidle && p->nthreads < p->max &&
      start_thread(p) != 0 && p->nthreads == 0) {
    pthread_mutex_unlock(&p->lock);
    return UMS_EAGAIN;
  }
  if (p->tail)
    p->tail->next = w;
  else
    p->head = w;
  p->tail = w;
  p->nqueued++;
  atomic_store_explicit(&p->queued_hint, p->nqueued, memory_order_relaxed);
  /* A spinning thread takes the work without a wake-up; a sleeper is
  ** woken only for what the spinners cannot take. */
  if (p->nqueued > p->nspinning) pthread_cond_signal(&p->work_cv);
  pthread_mutex_unlock(&p->lock);
  return 0;
}

/* [lock] */
static void signal_runner(ums__pool_t *p, ums__pool_work_t *w) {
  if (!signal_ok) return;
  for (ums__pool_thread_t *th = p->threads; th; th = th->next)
    if (th->current == w && !th->exited) pthread_kill(th->thread, POOL_SIGNAL);
}

void ums__pool_interrupt(ums__pool_t *p, ums__pool_work_t *w) {
  atomic_store(&w->interrupted, 1);
  pthread_mutex_lock(&p->lock);
  signal_runner(p, w);
  pthread_mutex_unlock(&p->lock);
}

void ums__pool_destroy(ums__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  p->stopping = true;
  pthread_cond_broadcast(&p->work_cv);
  while (p->nthreads > 0) {
    /* Whatever still runs now was abandoned by its caller (every task has
    ** ended): interrupt it, and again until it ends. */
    for (ums__pool_thread_t *th = p->threads; th; th = th->next)
      if (th->current && !th->exited) {
        atomic_store(&th->stop, 1);
        if (signal_ok) pthread_kill(th->thread, POOL_SIGNAL);
      }
    struct timespec ts;
    abs_deadline(&ts, DESTROY_RETRY_NS);
    pthread_cond_timedwait(&p->exit_cv, &p->lock, &ts);
  }
  join_exited(p);
  pthread_mutex_unlock(&p->lock);
  pthread_cond_destroy(&p->work_cv);
  pthread_cond_destroy(&p->exit_cv);
  pthread_mutex_destroy(&p->lock);
}

bool ums__pool_interrupted(const ums__pool_work_t *w) {
  return atomic_load_explicit(&w->interrupted, memory_order_relaxed) ||
         (pool_self && atomic_load_explicit(&pool_self->stop,
                                            memory_order_relaxed));
}

uint32_t ums__pool_threads(ums__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint32_t n = p->nthreads;
  pthread_mutex_unlock(&p->lock);
  return n;
}
