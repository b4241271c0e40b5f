/*
** pool.c: a pool of OS threads, the "hidden scheduler" onto which work
** that would block a scheduler goes (seed 000, "Hidden Schedulers"). File
** I/O uses one when io_uring is unavailable or does not support an
** operation; blocking C calls will use another, so nothing here knows
** about I/O: a work item is a run() function that completes its own
** owner.
**
** Growth. Up to core threads (the CPU count, for the C-call pool) start
** the moment work finds no idle thread. More threads help only when the
** ones there are blocked (in a sleep, a read, a lock): then the CPUs sit
** idle while work waits. When they are busy computing, or when the work
** is short, more threads only add context switches: 64 trivial calls in
** flight on 64 threads of a 2-CPU machine ran 6x slower than on 2 (each
** handoff a futex wake). So beyond core a monitor thread, started the
** first time work queues beyond core, looks every grow_ns while work is
** queued: if the oldest queued work has waited that long, it starts one
** thread per busy thread blocked in its work: at two looks in a row in
** the same work (not merely the same, reused, record), asleep in the
** kernel's view (/proc/self/task/<tid>/stat) and on a CPU for less than
** half of the last tick (its CPU-time clock). A thread computing on a
** crowded machine is runnable, not asleep, so it is not mistaken for a
** blocked one (two looks: nor when one look catches it in a page fault).
** With every thread blocked that doubles the pool per tick,
** so 64 blocked calls get their threads within a few milliseconds; never
** more than are queued or than max. It sleeps when nothing is queued: an
** unsaturated pool costs nothing. Go's sysmon and .NET's starvation check
** make the same bet; the kernel's view of the threads makes it without
** guessing. Threads beyond core end after idle_timeout without work. A
** thread that ends cannot join itself, so it stays on the list until the
** next thread start or the pool's destruction joins it: no thread
** outlives the pool.
**
** Handoff: waking a thread asleep on a condition variable costs tens of
** microseconds on a small VM (a futex round trip was measured at ~80 us),
** which is more than most blocking C calls take. So an idle thread may
** first spin for spin_ns, watching queued_hint, before it sleeps; work
** queued meanwhile is taken without any system call on either side. At
** most MAX_SPINNERS threads spin at once, so an idle pool of many threads
** burns at most that many CPUs, for at most spin_ns after its last work.
** A submitter signals the condition variable only when there is more
** queued work than spinning threads to take it. Better still, the spinner
** opens a slot (p->slot) that a submitter fills with one CAS, without the
** pool's lock: the spinner closes it with a CAS when it stops spinning,
** so a work item put there is always taken, by exactly the thread that
** opened it (a submitter that finds it closed queues as before).
**
** Interrupts: a run() blocked in a system call (a read from a pipe nobody
** writes to) is woken with a signal whose handler does nothing, installed
** without SA_RESTART, so the call fails with EINTR; run() then sees its
** work marked interrupted and gives up instead of retrying. A signal can
** land just before the thread enters the call and be lost, so the monitor
** sends it again every tick (grow_ns) while the interrupted work runs on
** (th->interrupting), and destroy repeats it until the work has ended.
** (Without a monitor thread, if none could start, an interrupt is best
** effort.)
*/
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
  _Atomic bool in_work;          /* [atomic] inside run() right now; unlike
                                    current, false while it waits for the
                                    pool's lock after the work */
  bool exited;                   /* [pool lock] left its loop */
  ums__pool_thread_t *next;      /* [pool lock] */
  pid_t tid;                     /* [pool lock] set when it starts; 0
                                    before */
  clockid_t cpu_clock;           /* [const] its CPU-time clock */
  bool has_clock;                /* [const] */
  uint64_t works;                /* [pool lock] works it has started:
                                    tells one work from a later one in
                                    the same (reused) record */
  const ums__pool_work_t *seen_work; /* [pool lock] what it ran at the
                                    monitor's last look (compared only) */
  uint64_t seen_works;           /* [pool lock] works then */
  uint32_t blocked_looks;        /* [pool lock] looks in a row that found
                                    it blocked in the same work */
  bool interrupting;             /* [pool lock] its current work was
                                    interrupted (counted in
                                    p->interrupting until the work ends) */
  int64_t seen_cpu;              /* [pool lock] its CPU time then */
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

int ums__pool_init(ums__pool_t *p, const ums__pool_cfg_t *cfg) {
  memset(p, 0, sizeof *p);
  p->cfg = *cfg;
  if (!p->cfg.max) p->cfg.max = 1;
  if (!p->cfg.core || p->cfg.core > p->cfg.max) p->cfg.core = p->cfg.max;
  if (p->cfg.spin_ns < 0) p->cfg.spin_ns = 0;
  if (p->cfg.grow_ns <= 0) p->cfg.grow_ns = UMS_NSEC_PER_MSEC;
  if (!p->cfg.name) p->cfg.name = "ums-pool";
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (pthread_mutex_init(&p->lock, NULL) != 0) return UMS_ENOMEM;
  if (pthread_cond_init(&p->work_cv, &ca) != 0 ||
      pthread_cond_init(&p->exit_cv, &ca) != 0 ||
      pthread_cond_init(&p->mon_cv, &ca) != 0) {
    pthread_condattr_destroy(&ca);
    return UMS_ENOMEM;
  }
  pthread_condattr_destroy(&ca);
  atomic_init(&p->slot, UMS__POOL_SLOT_CLOSED);
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

/* Closes the slot the spinner watched; returns the work a submitter put
** there meanwhile, if any (then the spinner must run it). */
static ums__pool_work_t *close_slot(ums__pool_t *p) {
  ums__pool_work_t *w = NULL;
  if (atomic_compare_exchange_strong_explicit(&p->slot, &w,
                                              UMS__POOL_SLOT_CLOSED,
                                              memory_order_acquire,
                                              memory_order_acquire))
    return NULL;
  /* Only the spinner moves the slot away from a work item. */
  atomic_store_explicit(&p->slot, UMS__POOL_SLOT_CLOSED, memory_order_relaxed);
  return w;
}

/* Spins without the lock, the slot open, until a submitter hands work
** through the slot (returned), work is queued, the pool stops or spin_ns
** passes; *took is how long it spun, negative if nothing came. Returns
** NULL otherwise, with the slot closed: the caller then takes the lock
** and looks again (the hint only says when looking is worth it). */
static ums__pool_work_t *spin_for_work(ums__pool_t *p, int64_t *took) {
  int64_t start = ums__clock_now(), until = start + p->cfg.spin_ns;
  int64_t seen = start; /* the last clock reading */
  for (unsigned i = 1;; i++) {
    ums__pool_work_t *w =
        atomic_load_explicit(&p->slot, memory_order_acquire);
    if (w || atomic_load_explicit(&p->queued_hint, memory_order_relaxed)) {
      /* No clock reading between the work's arrival and its run: how
      ** long the spin took, to the last reading (64 pauses). */
      *took = seen - start;
      return close_slot(p);
    }
    ums__cpu_relax();
    /* The clock costs ~45 ns here; a pause is ~40 cycles or more. Now and
    ** then give the CPU to whoever waits for it: on a crowded machine that
    ** may be the very thread that would hand us work. */
    if ((i & 63) == 0) {
      if ((seen = ums__clock_now()) >= until) {
        *took = -1;
        ums__pool_work_t *late = close_slot(p);
        if (late) *took = ums__clock_now() - start;
        return late;
      }
      if ((i & 255) == 0) sched_yield();
    }
  }
}

static void *pool_main(void *arg) {
  ums__pool_thread_t *self = arg;
  ums__pool_t *p = self->pool;
  pool_self = self;
  char name[16];
  snprintf(name, sizeof name, "%s", p->cfg.name);
  pthread_setname_np(pthread_self(), name);
  bool spun = false; /* spun since the last work: sleep next */

  pthread_mutex_lock(&p->lock);
  self->tid = gettid();
  for (;;) {
    ums__pool_work_t *w = p->head;
    if (w) {
      p->head = w->next;
      if (!p->head) p->tail = NULL;
      p->nqueued--;
      atomic_store_explicit(&p->queued_hint, p->nqueued, memory_order_relaxed);
    } else {
      if (p->stopping) break;
      if (p->cfg.spin_ns && !spun && p->nspinning < MAX_SPINNERS &&
          ums__spin_worth(&p->spin, p->cfg.spin_ns)) {
        /* Counted as idle, so a submitter relies on it rather than start
        ** a thread, and as spinning, so it does not signal either. With
        ** one spinner at most (MAX_SPINNERS) the slot is its alone. */
        p->nidle++;
        p->nspinning++;
        atomic_store_explicit(&p->slot, NULL, memory_order_release);
        pthread_mutex_unlock(&p->lock);
        int64_t took;
        w = spin_for_work(p, &took);
        pthread_mutex_lock(&p->lock);
        p->nspinning--;
        p->nidle--;
        ums__spin_note(&p->spin, took, took >= 0, p->cfg.spin_ns);
        spun = true;
        if (!w) continue;
        p->handed++;
        goto run;
      }
      p->nidle++;
      int r = 0;
      if (p->cfg.idle_timeout < 0 || p->nthreads <= p->cfg.core) {
        pthread_cond_wait(&p->work_cv, &p->lock);
      } else {
        struct timespec ts;
        abs_deadline(&ts, p->cfg.idle_timeout);
        r = pthread_cond_timedwait(&p->work_cv, &p->lock, &ts);
      }
      p->nidle--;
      /* Trimmed down to core, never below. */
      if (r == ETIMEDOUT && !p->head && p->nthreads > p->cfg.core) break;
      continue;
    }
  run:
    self->current = w;
    self->works++;
    pthread_mutex_unlock(&p->lock);
    atomic_store_explicit(&self->in_work, true, memory_order_relaxed);
    w->run(w); /* may free w */
    atomic_store_explicit(&self->in_work, false, memory_order_relaxed);
    pthread_mutex_lock(&p->lock);
    self->current = NULL;
    if (self->interrupting) {
      self->interrupting = false;
      p->interrupting--;
    }
    p->completed++;
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
  th->has_clock = pthread_getcpuclockid(th->thread, &th->cpu_clock) == 0;
  th->next = p->threads;
  p->threads = th;
  p->nthreads++;
  return 0;
}

/* Whether the thread is blocked right now (sleeping, or in an
** uninterruptible wait), from the kernel's view of it: a thread computing
** on a crowded machine is runnable, not blocked. False if unknown (no
** procfs, the thread is ending). [lock] */
static bool thread_asleep(ums__pool_thread_t *th) {
  if (!th->tid) return false;
  /* Opened for each look, not kept: looks are rare (only at a thread in
  ** the same work since the last look, off the CPU), and a descriptor
  ** kept per pool thread would show in the process's own count of them. */
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)th->tid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[128]; /* "tid (comm) S ...": comm is at most 15 bytes */
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  const char *end = strrchr(buf, ')');
  return end && end[1] == ' ' && (end[2] == 'S' || end[2] == 'D');
}

static int64_t thread_cpu(const ums__pool_thread_t *th) {
  struct timespec ts;
  if (!th->has_clock || clock_gettime(th->cpu_clock, &ts) != 0) return -1;
  return (int64_t)ts.tv_sec * UMS_NSEC_PER_SEC + ts.tv_nsec;
}

/* The monitor's look, every grow_ns while work is queued. Counts the busy
** threads blocked in their work: running the same work as at the last
** look, asleep now, and on a CPU for less than half the time since (a
** thread that computes, even one waiting for a CPU on a crowded machine,
** is not blocked; one that waits for the pool's lock after its work is
** not in its work: in_work). [lock] */
static void grow_check(ums__pool_t *p) {
  int64_t now = ums__clock_now();
  int64_t interval = p->sampled_at ? now - p->sampled_at : 0;
  uint32_t blocked = 0;
  for (ums__pool_thread_t *th = p->threads; th; th = th->next) {
    const ums__pool_work_t *was = th->seen_work;
    uint64_t was_works = th->seen_works;
    int64_t cpu0 = th->seen_cpu;
    th->seen_work = th->exited ? NULL : th->current;
    th->seen_works = th->works;
    if (!th->seen_work ||
        !atomic_load_explicit(&th->in_work, memory_order_relaxed)) {
      th->seen_work = NULL; /* between works (maybe asleep on our lock) */
      th->blocked_looks = 0;
      continue;
    }
    th->seen_cpu = thread_cpu(th);
    /* The same work: the same record and no work started since (records
    ** are reused: a thread that ran a thousand short works through one
    ** record since the last look is not stuck in it). */
    if (interval && was == th->seen_work && was_works == th->works &&
        cpu0 >= 0 &&
        th->seen_cpu >= 0 && 2 * (th->seen_cpu - cpu0) < interval &&
        thread_asleep(th)) {
      /* Blocked at two looks in a row: a computing thread caught once in
      ** a page fault or behind a kernel lock on a crowded machine is
      ** not (one look put a 30 ms computation to sleep under ASan at
      ** load 13). */
      if (++th->blocked_looks >= 2) blocked++;
    } else {
      th->blocked_looks = 0;
    }
  }
  p->sampled_at = now;
  if (!blocked || !p->head || p->nthreads >= p->cfg.max) return;
  if (now - p->head->queued_at < p->cfg.grow_ns) return; /* moving */
  /* As many as are blocked: the CPUs they leave idle are worth a thread
  ** each, and with everything blocked this doubles the pool per tick. */
  uint32_t k = blocked;
  if (k > p->nqueued) k = p->nqueued;
  if (k > p->cfg.max - p->nthreads) k = p->cfg.max - p->nthreads;
  while (k-- > 0 && start_thread(p) == 0) p->grown++;
}

static void *monitor_main(void *arg) {
  ums__pool_t *p = arg;
  char name[16];
  snprintf(name, sizeof name, "%.10s-mon", p->cfg.name);
  pthread_setname_np(pthread_self(), name);
  pthread_mutex_lock(&p->lock);
  while (!p->stopping) {
    if ((!p->head || p->nthreads >= p->cfg.max) && !p->interrupting) {
      /* Nothing waits, or nothing can be done: sleep until a submitter
      ** queues work beyond the threads there are. */
      p->mon_asleep = true;
      p->sampled_at = 0;
      pthread_cond_wait(&p->mon_cv, &p->lock);
      p->mon_asleep = false;
      continue;
    }
    if (!p->sampled_at) grow_check(p); /* the first sample */
    struct timespec ts;
    abs_deadline(&ts, p->cfg.grow_ns);
    pthread_cond_timedwait(&p->mon_cv, &p->lock, &ts);
    if (p->stopping) break;
    grow_check(p);
    if (p->interrupting && signal_ok)
      for (ums__pool_thread_t *th = p->threads; th; th = th->next)
        if (th->interrupting && th->current && !th->exited)
          pthread_kill(th->thread, POOL_SIGNAL);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

/* Work queued beyond core and beyond the idle threads: the monitor's
** business. Returns false if there is no monitor and none can start.
** [lock] */
static bool wake_monitor(ums__pool_t *p) {
  if (p->mon_started) {
    if (p->mon_asleep) pthread_cond_signal(&p->mon_cv);
    return true;
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int r = pthread_create(&p->monitor, NULL, monitor_main, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r != 0) return false;
  p->mon_started = true;
  return true;
}

int ums__pool_submit(ums__pool_t *p, ums__pool_work_t *w) {
  w->next = NULL;
  atomic_store_explicit(&w->interrupted, 0, memory_order_relaxed);
  /* A spinning thread's open slot: the work goes to it without the lock,
  ** the clock or a wake-up, two cache lines in all (slot and work). */
  ums__pool_work_t *open = NULL;
  if (atomic_load_explicit(&p->slot, memory_order_relaxed) == NULL &&
      atomic_compare_exchange_strong_explicit(&p->slot, &open, w,
                                              memory_order_release,
                                              memory_order_relaxed))
    return 0;
  pthread_mutex_lock(&p->lock);
  /* One more thread when every idle one already has queued work to take:
  ** at once up to core; beyond, the monitor decides (or, if it cannot
  ** run, at once up to max). If none can start, the work still queues as
  ** long as some thread is alive to take it in turn. */
  if (p->nqueued + 1 > p->nidle && p->nthreads < p->cfg.max &&
      (p->nthreads < p->cfg.core || !wake_monitor(p)) &&
      start_thread(p) != 0 && p->nthreads == 0) {
    pthread_mutex_unlock(&p->lock);
    return UMS_EAGAIN;
  }
  w->queued_at = ums__clock_now();
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
    if (th->current == w && !th->exited) {
      pthread_kill(th->thread, POOL_SIGNAL);
      /* Again every tick until the work ends: this one may be lost. */
      if (!th->interrupting && !p->stopping) {
        th->interrupting = true;
        p->interrupting++;
        wake_monitor(p);
      }
    }
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
  if (p->mon_started) {
    pthread_cond_signal(&p->mon_cv);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->monitor, NULL); /* it starts no thread once stopping */
    pthread_mutex_lock(&p->lock);
    p->mon_started = false;
  }
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
  pthread_cond_destroy(&p->mon_cv);
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

void ums__pool_stats(ums__pool_t *p, ums_pool_stats_t *out) {
  out->name = p->cfg.name;
  pthread_mutex_lock(&p->lock);
  out->queued = p->nqueued;
  out->threads = p->nthreads;
  /* Spinning threads count as idle (they wait for work). */
  out->idle = p->nidle;
  out->active = p->nthreads > p->nidle ? p->nthreads - p->nidle : 0;
  out->completed = p->completed;
  pthread_mutex_unlock(&p->lock);
}

uint64_t ums__pool_handed(ums__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t n = p->handed;
  pthread_mutex_unlock(&p->lock);
  return n;
}

uint64_t ums__pool_grown(ums__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t n = p->grown;
  pthread_mutex_unlock(&p->lock);
  return n;
}
