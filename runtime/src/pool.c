/*
** pool.c: a pool of OS threads, the "hidden scheduler" onto which work
** that would block a scheduler goes (docs/design/architecture.md). File
** I/O uses one when io_uring is unavailable or does not support an
** operation; blocking C calls will use another, so nothing here knows
** about I/O: a work item is a run() function that completes its own
** owner.
**
** Growth. A thread starts the moment work finds no thread awake to take
** it, up to core threads (the CPU count, for the C-call pool). More
** threads help only when the ones there are blocked (in a sleep, a read,
** a lock): then the CPUs sit idle while work waits. When they are busy
** computing, or when the work is short, more threads only add context
** switches: 64 trivial calls in flight on 64 threads of a 2-CPU machine
** make every handoff a futex wake. So beyond core a
** monitor thread looks every grow_ns while work is queued: if the oldest
** queued work has waited that long, it starts one thread per busy thread
** blocked in its work: at two looks in a row in the same work (not
** merely the same, reused, record), asleep in the kernel's view
** (/proc/self/task/<tid>/stat) and on a CPU for less than half of the
** last tick (its CPU-time clock). A thread computing on a crowded machine
** is runnable, not asleep, so it is not mistaken for a blocked one (two
** looks: nor when one look catches it in a page fault). With every
** thread blocked that doubles the pool per tick, so 64 blocked calls get
** their threads within a few milliseconds; never more than are queued or
** than max. Go's sysmon and .NET's starvation check make the same bet;
** the kernel's view of the threads makes it without guessing. Threads
** beyond core end after idle_timeout without work. A thread that ends
** cannot join itself, so it stays on the list until the next thread
** start or the pool's destruction joins it: no thread outlives the pool.
**
** Handoff. Waking a thread asleep on a condition variable costs tens of
** microseconds on a small VM (a futex round trip, bench/bench_core's
** spin_handoff and condvar_handoff floors), more than most blocking C
** calls take, and a submitter that takes the
** pool's lock contends with the threads taking work. So a submitter
** takes no lock and makes no system call while work flows: it pushes its
** work onto `incoming` with one CAS and looks at `nawake`, the threads
** that will look at the queue again without a wake-up (running work,
** spinning for it, or woken and on their way). If there is one, that is
** all (with 64 calls in flight on 2 CPUs, one thread running them back to
** back keeps up with the scheduler that makes them, and a second thread
** would take the scheduler's CPU). Only when nobody is awake does the
** submitter take the lock, to wake a sleeper or start a thread. An idle
** thread first spins for spin_ns, watching incoming, before it sleeps
** (at most MAX_SPINNERS at once, so an idle pool burns at most that many
** CPUs, for at most spin_ns after its last work).
**
** Relying on awake threads leaves one case to the monitor: they may be
** blocked in their work, or too few for it. So while any thread is awake
** the monitor looks every grow_ns; when the oldest queued work has waited
** that long, it wakes a sleeper per queued work, or starts threads up to
** core, at once (beyond core, the blocked-thread rule above decides). A
** call queued behind a blocked one thus waits a tick or two (1-2 ms) for
** a thread that sleeps, rather than every call paying for a wake-up. The
** monitor sleeps when nothing is queued and no thread is awake, or
** nothing has been queued for MON_IDLE_LOOKS ticks: an idle pool, or one
** whose threads are all in long calls with nothing behind them, costs
** nothing.
**
** Slots. A submitter that waits for its work by spinning (preempt.c: a
** lone C call whose scheduler has nothing else to do) pays for every
** cache line the handoff moves between its CPU and the pool thread's, one
** way and back: the queue's head, then the work. So a pool may have slots
** (ums__pool_set_slots), works each owned by one submitter (a scheduler)
** that the threads look at besides the queue: the spinning thread polls
** their `posts` words too, and a finishing thread looks at them after
** the queue. The owner posts its slot (ums__pool_post) by counting a post
** in the work itself, which it lays out with its data on one cache line;
** a thread takes it, under the pool's lock, by counting the post taken in
** the pool's own slot_taken. So a pool thread writes nothing into the
** work before it runs it, and for a lone call the work's one line is all
** that moves, as in a bare two-thread handoff (a claim written into that
** line would take it from the poster spinning on it, once more each
** way). A post relies on an awake thread like a push does (below); one
** that finds none takes its slot back and submits it, and a poster that
** stops waiting (its spin ends) takes back a slot not yet taken, under
** the lock, and submits it, so a slot is never left to a blocked thread
** or to the monitor, which does not look at slots. Threads take slots
** after the queue (oldest work first), in turn from the slot after the
** last one taken.
**
** No work is lost between a submitter that relies on an awake thread and
** a thread that goes to sleep: the submitter's push (or post) and its load
** of nawake, and the sleeper's decrement of nawake and its loads of
** incoming and the slots, are sequentially consistent, so at least one sees the other (and
** likewise for mon_asleep and the monitor).
**
** Exhaustion. Work that waits while every thread the pool may have runs
** other work (max threads, or a thread start failed) waits for one of
** them to end; when those are blocked waiting for the queued work (a
** read whose writer is queued behind it), nothing ever will. The pool
** cannot tell that from slow work, so it says what it sees: the
** runtime's monitor looks (ums__pool_exhaustion) and reports an episode
** once, with the oldest queued work's task and what it runs. The pool's
** monitor, which ticks while work is queued, wakes the runtime's monitor
** for it (cfg.on_wait), since that one sleeps while every scheduler is
** idle, as they are when all their tasks wait for the pool.
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
/* Looks in a row with nothing queued after which the monitor sleeps even
** though threads are awake: with 64 calls in flight the queue is empty at
** most looks (one thread keeps up), and a monitor that slept at the first
** would be woken by a submitter, a system call, every few ticks. */
#define MON_IDLE_LOOKS 16

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
  atomic_init(&p->incoming, NULL);
  atomic_init(&p->nawake, 0);
  atomic_init(&p->mon_asleep, true);
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

static void set_awake(ums__pool_t *p, uint32_t n) {
  atomic_store(&p->nawake, n); /* sequentially consistent: see the top */
}

/* Appends w to the FIFO. [lock] */
static void fifo_push(ums__pool_t *p, ums__pool_work_t *w, int64_t now) {
  w->next = NULL;
  w->queued_at = now;
  if (p->tail)
    p->tail->next = w;
  else
    p->head = w;
  p->tail = w;
  p->nqueued++;
}

/* Takes what submitters pushed, oldest first: returns the oldest and
** queues the rest (stamped now: the monitor's measure of waiting starts
** here, at most a tick late); with keep_first false, queues all of it.
** NULL if nothing was pushed. [lock] */
static ums__pool_work_t *take_incoming(ums__pool_t *p, bool keep_first) {
  /* A load first: the exchange would take the line from the submitter
  ** even when there is nothing to take, and its next push take it back. */
  if (!atomic_load_explicit(&p->incoming, memory_order_relaxed)) return NULL;
  ums__pool_work_t *w =
      atomic_exchange_explicit(&p->incoming, NULL, memory_order_acquire);
  if (!w) return NULL;
  ums__pool_work_t *prev = NULL; /* reversed: oldest first */
  while (w) {
    ums__pool_work_t *next = w->next;
    w->next = prev;
    prev = w;
    w = next;
  }
  ums__pool_work_t *first = keep_first ? prev : NULL;
  if (keep_first) prev = prev->next;
  if (prev) {
    int64_t now = ums__clock_now();
    while (prev) {
      ums__pool_work_t *next = prev->next;
      fifo_push(p, prev, now);
      prev = next;
    }
    atomic_store_explicit(&p->queued_hint, p->nqueued, memory_order_relaxed);
  }
  return first;
}

/* Whether a slot is posted and not taken. Sequentially consistent loads
** of posts: a sleeper's half of ums__pool_post's store and load (see the
** top). Exact under the lock; a hint without it (the spinner's). */
static bool slot_posted(ums__pool_t *p) {
  for (uint32_t i = 0; i < p->nslots; i++)
    if (atomic_load(&p->slots[i]->posts) !=
        atomic_load_explicit(&p->slot_taken[i], memory_order_relaxed))
      return true;
  return false;
}

/* Takes a posted slot, in turn from the one after the last taken; NULL if
** none is posted. [lock] */
static ums__pool_work_t *take_slot(ums__pool_t *p) {
  for (uint32_t k = 0; k < p->nslots; k++) {
    uint32_t i = p->slot_turn + k < p->nslots ? p->slot_turn + k
                                               : p->slot_turn + k - p->nslots;
    /* Acquire: what the owner wrote before its post. */
    uint32_t n = atomic_load_explicit(&p->slots[i]->posts,
                                      memory_order_acquire);
    if (n != atomic_load_explicit(&p->slot_taken[i], memory_order_relaxed)) {
      atomic_store_explicit(&p->slot_taken[i], n, memory_order_relaxed);
      p->slot_turn = i + 1 < p->nslots ? i + 1 : 0;
      p->slot_takes++;
      return p->slots[i];
    }
  }
  return NULL;
}

/* The next work for a pool thread: the FIFO's head, else the oldest
** pushed, else a posted slot. [lock] */
static ums__pool_work_t *next_work(ums__pool_t *p) {
  ums__pool_work_t *w = p->head;
  if (!w) {
    w = take_incoming(p, true);
    return w || !p->nslots ? w : take_slot(p);
  }
  p->head = w->next;
  if (!p->head) p->tail = NULL;
  p->nqueued--;
  atomic_store_explicit(&p->queued_hint, p->nqueued, memory_order_relaxed);
  return w;
}

static bool work_waiting(ums__pool_t *p) {
  return atomic_load_explicit(&p->incoming, memory_order_relaxed) ||
         atomic_load_explicit(&p->queued_hint, memory_order_relaxed) ||
         slot_posted(p);
}

/* Spins without the lock until work is pushed or queued, or spin_ns
** passes. Returns how long it spun until work came, or -1 if none did;
** the caller then takes the lock and looks (the loads only say when
** looking is worth it). */
static int64_t spin_for_work(ums__pool_t *p) {
  int64_t start = ums__clock_now(), until = start + p->cfg.spin_ns;
  int64_t seen = start; /* the last clock reading */
  for (unsigned i = 1;; i++) {
    /* No clock reading between the work's arrival and its run: how long
    ** the spin took, to the last reading (64 pauses). */
    if (work_waiting(p)) return seen - start;
    ums__cpu_relax();
    /* A clock reading costs far more than a pause, so the clock is read
    ** every 64 pauses only. Now and then give the CPU to whoever waits
    ** for it: on a crowded machine that may be the very thread that would
    ** hand us work. */
    if ((i & 63) == 0) {
      if ((seen = ums__clock_now()) >= until)
        return work_waiting(p) ? seen - start : -1;
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

  /* Counted in nawake by start_thread: it looks at the queue first. */
  pthread_mutex_lock(&p->lock);
  self->tid = gettid();
  for (;;) {
    ums__pool_work_t *w = next_work(p);
    if (w) goto run;
    if (p->stopping) break;
    if (p->cfg.spin_ns && !spun && p->nspinning < MAX_SPINNERS &&
        ums__spin_worth(&p->spin, p->cfg.spin_ns)) {
      /* Awake all along: submitters rely on it, without a wake-up. */
      p->nidle++;
      p->nspinning++;
      pthread_mutex_unlock(&p->lock);
      int64_t took = spin_for_work(p);
      pthread_mutex_lock(&p->lock);
      p->nspinning--;
      p->nidle--;
      ums__spin_note(&p->spin, took, took >= 0, p->cfg.spin_ns);
      spun = true;
      if (took >= 0) p->handed++;
      continue;
    }
    /* To sleep: no longer awake, then one more look at incoming (the
    ** other half of the submitter's push and load, at the top). */
    set_awake(p, atomic_load_explicit(&p->nawake, memory_order_relaxed) - 1);
    if (atomic_load(&p->incoming) || slot_posted(p)) {
      set_awake(p, atomic_load_explicit(&p->nawake, memory_order_relaxed) + 1);
      continue;
    }
    p->nidle++;
    p->nsleeping++;
    int r = 0;
    if (p->cfg.idle_timeout < 0 || p->nthreads <= p->cfg.core) {
      pthread_cond_wait(&p->work_cv, &p->lock);
    } else {
      struct timespec ts;
      abs_deadline(&ts, p->cfg.idle_timeout);
      r = pthread_cond_timedwait(&p->work_cv, &p->lock, &ts);
    }
    p->nsleeping--;
    p->nidle--;
    /* A waker counted the thread it signalled; any other return (a
    ** timeout, a broadcast, a spurious one) counts itself. */
    if (p->wakes_pending)
      p->wakes_pending--;
    else
      set_awake(p, atomic_load_explicit(&p->nawake, memory_order_relaxed) + 1);
    /* Trimmed down to core, never below. */
    if (r == ETIMEDOUT && !p->head && !atomic_load(&p->incoming) &&
        !slot_posted(p) && p->nthreads > p->cfg.core)
      break;
    continue;
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
  set_awake(p, atomic_load_explicit(&p->nawake, memory_order_relaxed) - 1);
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
  p->cannot_grow = r != 0;
  if (r != 0) {
    free(th);
    /* Threads start on demand, long after the runtime did: the pool goes
    ** on with what it has (with none, submit_slow's callers run the work
    ** themselves), and says so once rather than lose throughput without
    ** a word. */
    if (!p->told_thread) {
      p->told_thread = true;
      fprintf(stderr, "ums: the %s pool cannot create a thread (%s): its "
              "work %s\n", p->cfg.name, strerror(r),
              p->nthreads ? "waits for the threads it has"
                          : "runs on its callers' threads");
      fflush(stderr);
    }
    return UMS_EAGAIN;
  }
  th->has_clock = pthread_getcpuclockid(th->thread, &th->cpu_clock) == 0;
  th->next = p->threads;
  p->threads = th;
  p->nthreads++;
  set_awake(p, atomic_load_explicit(&p->nawake, memory_order_relaxed) + 1);
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
  /* Nothing queued, nothing to grow for: no look at the threads (each
  ** costs a CPU clock and a /proc read per busy thread, and the monitor
  ** now also looks every tick while a thread is merely awake). The next
  ** look with work queued starts afresh, as after the monitor's sleep. */
  if (!p->head) {
    p->sampled_at = 0;
    return;
  }
  /* Threads not in a work (idle, between works, or started and not yet
  ** at the queue) each take queued work without help: a thread started
  ** at an earlier tick that has not reached the queue yet (thread starts
  ** are slow on a crowded machine) must not be started again at every
  ** tick, or a pool with a high bound overshoots to it. */
  uint32_t working = 0;
  for (ums__pool_thread_t *th = p->threads; th; th = th->next)
    if (!th->exited && th->current &&
        atomic_load_explicit(&th->in_work, memory_order_relaxed))
      working++;
  uint32_t coming = p->nthreads - working;
  if (coming >= p->nqueued || p->nthreads >= p->cfg.max) return;
  /* At most this many threads may start: the looks below (a clock and a
  ** /proc read each, under the pool's lock) stop once that many threads
  ** are found blocked, so that a tick costs no more with a thousand
  ** blocked threads than the growth it can do. The threads not looked
  ** at keep their last sample: their next look spans more time, which
  ** only makes a computing thread less likely to pass for blocked. */
  uint32_t need = p->nqueued - coming;
  if (need > p->cfg.max - p->nthreads) need = p->cfg.max - p->nthreads;
  int64_t now = ums__clock_now();
  int64_t interval = p->sampled_at ? now - p->sampled_at : 0;
  uint32_t blocked = 0;
  for (ums__pool_thread_t *th = p->threads; th && blocked < need;
       th = th->next) {
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
  /* Sleepers and threads up to core first (wake_stuck). */
  if (p->nsleeping > p->wakes_pending || p->nthreads < p->cfg.core) return;
  /* As many as are blocked: the CPUs they leave idle are worth a thread
  ** each, and with everything blocked this doubles the pool per tick. */
  uint32_t k = blocked < need ? blocked : need;
  if (k > p->cfg.max - p->nthreads) k = p->cfg.max - p->nthreads;
  while (k-- > 0 && start_thread(p) == 0) p->grown++;
}

/* Wakes a sleeper, counting it awake at once (so that the next
** submitter relies on it) and as a pending wake it will not count again.
** [lock] */
static void wake_sleeper(ums__pool_t *p) {
  p->wakes_pending++;
  p->woken++;
  set_awake(p, atomic_load_explicit(&p->nawake, memory_order_relaxed) + 1);
  pthread_cond_signal(&p->work_cv);
}

/* The monitor's look at queued work: if the oldest has waited a tick,
** the awake threads are blocked or too few for it. A sleeper per queued
** work, else threads up to core, at once; beyond core grow_check
** decides. [lock] */
static void wake_stuck(ums__pool_t *p) {
  if (!p->head || ums__clock_now() - p->head->queued_at < p->cfg.grow_ns)
    return;
  uint32_t want = p->nqueued;
  while (want > 0 && p->nsleeping > p->wakes_pending) {
    wake_sleeper(p);
    want--;
  }
  while (want > 0 && p->nthreads < p->cfg.core && start_thread(p) == 0)
    want--;
}

/* Every thread the pool may have for now runs work. [lock] */
static bool at_bound(ums__pool_t *p) {
  return !p->nidle && (p->nthreads >= p->cfg.max || p->cannot_grow);
}

/* The runtime's monitor is told while work waits at the bound for a
** tick (it decides whether that is an exhaustion). [lock] */
static void tell_waiting(ums__pool_t *p) {
  if (p->cfg.on_wait && p->head && at_bound(p) &&
      ums__clock_now() - p->head->queued_at >= p->cfg.grow_ns)
    p->cfg.on_wait(p->cfg.on_wait_arg);
}

/* Whether the monitor may sleep: nothing is queued, and no thread is
** awake to be relied on, or nothing has been queued for MON_IDLE_LOOKS
** looks in a row (a thread blocked for long with nothing behind it needs
** no watching; a submitter that relies on it then wakes the monitor,
** finding it asleep). Its store of mon_asleep comes before, the loads
** here after (the other half of the submitter's, at the top). [lock] */
static bool monitor_idle(ums__pool_t *p) {
  return !p->head && !p->interrupting && !atomic_load(&p->incoming) &&
         (p->idle_looks >= MON_IDLE_LOOKS || !atomic_load(&p->nawake));
}

static void *monitor_main(void *arg) {
  ums__pool_t *p = arg;
  char name[16];
  snprintf(name, sizeof name, "%.10s-mon", p->cfg.name);
  pthread_setname_np(pthread_self(), name);
  pthread_mutex_lock(&p->lock);
  while (!p->stopping) {
    take_incoming(p, false);
    atomic_store(&p->mon_asleep, true);
    if (monitor_idle(p)) {
      /* Until a submitter relies on a thread again, or queues work
      ** beyond the threads there are. */
      p->sampled_at = 0;
      pthread_cond_wait(&p->mon_cv, &p->lock);
      atomic_store(&p->mon_asleep, false);
      p->idle_looks = 0;
      continue;
    }
    atomic_store(&p->mon_asleep, false);
    if (!p->sampled_at) grow_check(p); /* the first sample */
    struct timespec ts;
    abs_deadline(&ts, p->cfg.grow_ns);
    pthread_cond_timedwait(&p->mon_cv, &p->lock, &ts);
    if (p->stopping) break;
    take_incoming(p, false);
    p->idle_looks = p->head || p->interrupting ? 0 : p->idle_looks + 1;
    wake_stuck(p);
    grow_check(p);
    tell_waiting(p);
    if (p->interrupting && signal_ok)
      for (ums__pool_thread_t *th = p->threads; th; th = th->next)
        if (th->interrupting && th->current && !th->exited)
          pthread_kill(th->thread, POOL_SIGNAL);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

/* Makes sure the monitor watches: starts it the first time, wakes it if
** it sleeps. Returns false if there is no monitor and none can start.
** [lock] */
static bool wake_monitor(ums__pool_t *p) {
  if (p->mon_started) {
    if (atomic_load_explicit(&p->mon_asleep, memory_order_relaxed))
      pthread_cond_signal(&p->mon_cv);
    return true;
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int r = pthread_create(&p->monitor, NULL, monitor_main, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r != 0) {
    /* The pool works without it, with less: the next submitter tries
    ** again; the loss is said once. */
    if (!p->told_monitor) {
      p->told_monitor = true;
      fprintf(stderr, "ums: the %s pool cannot create its monitor thread "
              "(%s): until it can, the pool does not grow past its awake "
              "threads nor repeat interrupts of blocked work\n",
              p->cfg.name, strerror(r));
      fflush(stderr);
    }
    return false;
  }
  p->mon_started = true;
  return true;
}

/* Takes w back out of the FIFO (it was pushed, and no thread can take
** it). [lock] */
static void fifo_remove(ums__pool_t *p, ums__pool_work_t *w) {
  ums__pool_work_t **link = &p->head, *prev = NULL;
  while (*link && *link != w) {
    prev = *link;
    link = &(*link)->next;
  }
  if (!*link) return;
  *link = w->next;
  if (p->tail == w) p->tail = prev;
  p->nqueued--;
  atomic_store_explicit(&p->queued_hint, p->nqueued, memory_order_relaxed);
}

/* The submitter found no thread awake, or the monitor not watching. */
static int submit_slow(ums__pool_t *p, ums__pool_work_t *w) {
  pthread_mutex_lock(&p->lock);
  take_incoming(p, false);
  /* With a single thread there is nothing for a monitor to do but
  ** repeat interrupts (signal_runner starts it for those). */
  bool watch = p->cfg.max > 1;
  if (!atomic_load_explicit(&p->nawake, memory_order_relaxed)) {
    /* Nobody awake: every thread sleeps, or none is left. */
    if (p->nsleeping > p->wakes_pending) {
      wake_sleeper(p);
    } else if (p->nthreads < p->cfg.max && start_thread(p) != 0 &&
               p->nthreads == 0) {
      /* No thread at all and none can start: the caller runs w. */
      fifo_remove(p, w);
      pthread_mutex_unlock(&p->lock);
      return UMS_EAGAIN;
    }
  }
  /* Without a monitor (none can start) the awake threads are all there
  ** is: queued work waits for them. */
  if (watch) wake_monitor(p);
  pthread_mutex_unlock(&p->lock);
  return 0;
}

int ums__pool_set_slots(ums__pool_t *p, ums__pool_work_t *const *slots,
                        uint32_t n) {
  ums__pool_work_t **v = malloc((n ? n : 1) * sizeof *v);
  _Atomic uint32_t *taken = malloc((n ? n : 1) * sizeof *taken);
  if (!v || !taken) {
    free(v);
    free(taken);
    return UMS_ENOMEM;
  }
  for (uint32_t i = 0; i < n; i++) {
    v[i] = slots[i];
    atomic_init(&taken[i],
                atomic_load_explicit(&v[i]->posts, memory_order_relaxed));
  }
  free(p->slots);
  free((void *)p->slot_taken);
  p->slots = v;
  p->slot_taken = taken;
  p->nslots = n;
  return 0;
}

bool ums__pool_post(ums__pool_t *p, uint32_t i) {
  ums__pool_work_t *w = p->slots[i];
  /* Stored only if set: a store into the line a thread polls may cost a
  ** round trip (see "Slots"). */
  if (atomic_load_explicit(&w->interrupted, memory_order_relaxed))
    atomic_store_explicit(&w->interrupted, 0, memory_order_relaxed);
  /* Sequentially consistent, as a push and its load of nawake (see the
  ** top): a thread awake now will look at the slots before it sleeps. */
  atomic_store(&w->posts,
               atomic_load_explicit(&w->posts, memory_order_relaxed) + 1);
  if (atomic_load(&p->nawake)) return true;
  /* Nobody awake: back, unless a thread took it meanwhile. */
  return !ums__pool_unpost(p, i);
}

bool ums__pool_unpost(ums__pool_t *p, uint32_t i) {
  pthread_mutex_lock(&p->lock);
  uint32_t n = atomic_load_explicit(&p->slots[i]->posts,
                                    memory_order_relaxed);
  bool back = n != atomic_load_explicit(&p->slot_taken[i],
                                        memory_order_relaxed);
  /* Counted as taken: no thread takes it now. */
  if (back) {
    atomic_store_explicit(&p->slot_taken[i], n, memory_order_relaxed);
    p->slot_backs++;
  }
  pthread_mutex_unlock(&p->lock);
  return back;
}

int ums__pool_submit(ums__pool_t *p, ums__pool_work_t *w) {
  atomic_store_explicit(&w->interrupted, 0, memory_order_relaxed);
  ums__pool_work_t *head =
      atomic_load_explicit(&p->incoming, memory_order_relaxed);
  do {
    w->next = head;
  } while (!atomic_compare_exchange_weak(&p->incoming, &head, w));
  /* Sequentially consistent, after the push: see the top of the file. An
  ** awake thread will take w; the monitor watches for it being blocked. */
  if (atomic_load(&p->nawake) &&
      (p->cfg.max == 1 || !atomic_load(&p->mon_asleep)))
    return 0;
  return submit_slow(p, w);
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
  free(p->slots);
  free((void *)p->slot_taken);
  p->slots = NULL;
  p->slot_taken = NULL;
  p->nslots = 0;
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
  take_incoming(p, false); /* queued, whether pushed or in the FIFO */
  out->queued = p->nqueued;
  out->threads = p->nthreads;
  /* Spinning threads count as idle (they wait for work). */
  out->idle = p->nidle;
  out->active = p->nthreads > p->nidle ? p->nthreads - p->nidle : 0;
  out->completed = p->completed;
  out->max = p->cfg.max;
  out->exhausted = p->exhausted;
  out->episodes = p->episodes;
  out->oldest_wait_ns =
      p->head ? ums__clock_now() - p->head->queued_at : 0;
  out->longest_wait_ns = p->oldest_wait_max;
  pthread_mutex_unlock(&p->lock);
}

int ums__pool_exhaustion(ums__pool_t *p, int64_t threshold,
                         ums__pool_exhaust_t *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&p->lock);
  take_incoming(p, false);
  int64_t wait = p->head ? ums__clock_now() - p->head->queued_at : 0;
  if (wait < 0) wait = 0;
  int begins = 0;
  if (!p->head || p->nidle) {
    p->exhausted = false; /* drained, or a thread is free: it ended */
  } else if (at_bound(p) && wait >= threshold) {
    if (!p->exhausted) {
      p->exhausted = true;
      p->episodes++;
      begins = 1;
    }
    if (wait > p->oldest_wait_max) p->oldest_wait_max = wait;
  }
  out->threads = p->nthreads;
  out->active = p->nthreads - p->nidle;
  out->queued = p->nqueued;
  out->max = p->cfg.max;
  out->episodes = p->episodes;
  out->oldest_wait_ns = wait;
  if (p->head) {
    /* The work is queued, so its owner keeps what alive (internal.h). */
    out->oldest_task = p->head->task;
    if (p->head->what)
      snprintf(out->oldest_what, sizeof out->oldest_what, "%s",
               p->head->what);
  }
  pthread_mutex_unlock(&p->lock);
  return begins;
}

bool ums__pool_has_queued(ums__pool_t *p) {
  return work_waiting(p);
}

bool ums__pool_exhausted_hint(ums__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  bool e = p->exhausted;
  pthread_mutex_unlock(&p->lock);
  return e;
}

uint64_t ums__pool_handed(ums__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t n = p->handed;
  pthread_mutex_unlock(&p->lock);
  return n;
}

void ums__pool_slot_counts(ums__pool_t *p, uint64_t *takes,
                           uint64_t *backs) {
  pthread_mutex_lock(&p->lock);
  *takes = p->slot_takes;
  *backs = p->slot_backs;
  pthread_mutex_unlock(&p->lock);
}

uint64_t ums__pool_woken(ums__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t n = p->woken;
  pthread_mutex_unlock(&p->lock);
  return n;
}

uint64_t ums__pool_grown(ums__pool_t *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t n = p->grown;
  pthread_mutex_unlock(&p->lock);
  return n;
}
