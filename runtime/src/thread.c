/*
** thread.c: the runtime's own OS threads (a scheduler's, the monitor's),
** and the idle ones kept parked for the process between runtimes.
**
** A program may start many short runtimes one after another (a test
** framework starts one per test). Creating and joining an OS thread costs
** several times more than waking a parked one, and the pages of a
** fresh thread's stack fault in again every time (glibc gives them back
** when a thread exits). So a runtime configured with keep_threads > 0
** does not let its threads exit at shutdown: each one, once its function
** has returned, parks in a process-wide cache of at most KEEP_MAX idle
** threads, and the next runtime's ums__thread_start wakes one instead of
** creating one. Any kept thread can take any role: the role's signal mask
** and name are set each time it starts one. The cache is first in, first
** out: a runtime that starts its threads in the order the previous one
** joined them (schedulers, then the monitor) gives each the same role
** again, so that a thread keeps its name from run to run.
**
** A thread's life, on its record's futex word (state):
**   RUN   the starter handed it fn and arg (or created it so);
**   BUSY  the thread took them and runs fn;
**   DONE  fn returned, or the joiner took the role back before the thread
**         took it (ums__thread_stop): the thread touches nothing of the
**         runtime any more;
**   IDLE  the joiner put it in the cache: it waits for RUN or EXIT;
**   EXIT  it is to return, and be joined with pthread_join.
** Each transition is made by one side only (RUN: the starter; BUSY and
** DONE after BUSY: the thread; DONE from RUN, IDLE and EXIT: the joiner,
** or at process exit and fork, the cache; RUN leaves by one compare and
** swap, which one side wins), with sequentially consistent atomics, so
** everything fn did
** happens before ums__thread_join returns, and everything the starter set
** up happens before fn runs.
**
** Idle threads block every signal: a signal meant for the process goes to
** a thread that may run its handler (the host's), never to a parked one.
** They are joined at process exit (a destructor) and, since the Lua
** module pins itself in memory (lua-binding/lums.c, pin_module), never
** see their code unmapped. A child made by fork has none of its parent's
** threads: it forgets the cache and starts afresh.
*/
#include "internal.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* Idle threads the process keeps at most, whatever runtimes ask for. */
#define KEEP_MAX 8

enum { RUN = 1, DONE = 2, IDLE = 3, EXIT = 4, BUSY = 5 };

struct ums__thread {
  pthread_t handle;           /* [const] */
  _Atomic uint32_t state;     /* [atomic] futex word; see the top */
  void *(*fn)(void *);        /* [starter, before RUN] */
  void *arg;                  /* [starter, before RUN] */
  sigset_t mask;              /* [starter, before RUN] mask fn runs with */
  char name[16];              /* [starter, before RUN] "" keeps the name */
  char first_name[16];        /* [const] name's copy for the first role:
                                 the thread names itself with it as it
                                 starts, which may be after that role
                                 was taken back and name rewritten for
                                 the next one */
  ums__thread_t *next;        /* [cache.lock] in the cache */
};

static struct {
  pthread_mutex_t lock;
  ums__thread_t *idle;        /* [lock] parked threads, oldest first */
  ums__thread_t **tail;       /* [lock] where the next one is linked */
  int n;                      /* [lock] how many */
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER, .tail = &cache.idle};
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void block_all(void) {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, NULL);
}

/* Whether mask blocks every signal (as an idle thread's does). */
static bool blocks_all(const sigset_t *mask) {
  /* Signal by signal: sigfillset need not set the words of a sigset_t
  ** past the last signal, so two full sets may differ there. */
  sigset_t all;
  sigfillset(&all);
  for (int sig = 1; sig < NSIG; sig++)
    if (sigismember(&all, sig) == 1 && sigismember(mask, sig) != 1)
      return false;
  return true;
}

static void *thread_main(void *arg) {
  ums__thread_t *th = arg;
  /* A new thread starts with every signal blocked (ums__thread_start),
  ** and so does a kept one between roles: a role that blocks them all
  ** too (the monitor's) needs no change of mask either way. */
  bool all_blocked = true;
  char named[sizeof th->name] = "";  /* the name it has (set it once) */
  /* Named for its first role even if that is taken back before it
  ** begins (ums__thread_stop): threads keep the names they had. */
  if (th->first_name[0]) {
    pthread_setname_np(pthread_self(), th->first_name);
    memcpy(named, th->first_name, sizeof named);
  }
  for (;;) {
    uint32_t st;
    while ((st = atomic_load(&th->state)) == IDLE || st == DONE)
      ums__futex_wait(&th->state, st, UMS_FOREVER);
    if (st == EXIT) return NULL;
    if (!atomic_compare_exchange_strong(&th->state, &st, BUSY))
      continue;  /* taken back (ums__thread_stop) */
    if (!all_blocked || !blocks_all(&th->mask)) {
      pthread_sigmask(SIG_SETMASK, &th->mask, NULL);
      all_blocked = blocks_all(&th->mask);
    }
    if (th->name[0] && strcmp(th->name, named) != 0) {
      pthread_setname_np(pthread_self(), th->name);
      memcpy(named, th->name, sizeof named);
    }
    th->fn(th->arg);
    if (!all_blocked) block_all();
    all_blocked = true;
    atomic_store(&th->state, DONE);
    ums__futex_wake(&th->state, 1);
  }
}

/* Ends a thread that is DONE or IDLE and frees its record. */
static void end_thread(ums__thread_t *th) {
  atomic_store(&th->state, EXIT);
  ums__futex_wake(&th->state, 1);
  pthread_join(th->handle, NULL);
  free(th);
}

/* In a child made by fork only the forking thread lives on: the records
** of the parent's idle threads describe nothing. */
static void cache_after_fork(void) {
  pthread_mutex_init(&cache.lock, NULL);
  while (cache.idle) {
    ums__thread_t *th = cache.idle;
    cache.idle = th->next;
    free(th);
  }
  cache.tail = &cache.idle;
  cache.n = 0;
}

static void cache_setup(void) {
  pthread_atfork(NULL, NULL, cache_after_fork);
}

/* At process exit (or if the code were ever unloaded), the idle threads
** are joined: nothing the runtime started outlives it unseen. */
__attribute__((destructor)) static void cache_clear(void) {
  pthread_mutex_lock(&cache.lock);
  ums__thread_t *list = cache.idle;
  cache.idle = NULL;
  cache.tail = &cache.idle;
  cache.n = 0;
  pthread_mutex_unlock(&cache.lock);
  while (list) {
    ums__thread_t *th = list;
    list = th->next;
    end_thread(th);
  }
}

int ums__thread_start(ums__thread_t **out, void *(*fn)(void *), void *arg,
                      const sigset_t *mask, const char *name) {
  ums__thread_t *th = NULL;
  pthread_mutex_lock(&cache.lock);
  if (cache.idle) {
    th = cache.idle;
    cache.idle = th->next;
    if (!cache.idle) cache.tail = &cache.idle;
    cache.n--;
  }
  pthread_mutex_unlock(&cache.lock);
  bool fresh = th == NULL;
  if (fresh && !(th = calloc(1, sizeof *th))) return UMS_ENOMEM;
  th->fn = fn;
  th->arg = arg;
  if (mask) th->mask = *mask;
  else pthread_sigmask(SIG_BLOCK, NULL, &th->mask);
  th->name[0] = '\0';
  if (name) {
    strncpy(th->name, name, sizeof th->name - 1);
    th->name[sizeof th->name - 1] = '\0';
  }
  atomic_store(&th->state, RUN);
  if (!fresh) {
    ums__futex_wake(&th->state, 1);
    *out = th;
    return 0;
  }
  /* A new thread starts with every signal blocked, as it parks; it sets
  ** the role's mask itself before fn. */
  memcpy(th->first_name, th->name, sizeof th->first_name);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int r = pthread_create(&th->handle, NULL, thread_main, th);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (r != 0) {
    free(th);
    return r == ENOMEM ? UMS_ENOMEM : UMS_EAGAIN;
  }
  *out = th;
  return 0;
}

void ums__thread_join(ums__thread_t *th, int keep) {
  uint32_t st;
  while ((st = atomic_load(&th->state)) == RUN || st == BUSY)
    ums__futex_wait(&th->state, st, UMS_FOREVER);
  if (keep > 0) {
    pthread_once(&cache_once, cache_setup);
    pthread_mutex_lock(&cache.lock);
    if (cache.n < keep && cache.n < KEEP_MAX) {
      atomic_store(&th->state, IDLE);
      th->next = NULL;
      *cache.tail = th;
      cache.tail = &th->next;
      cache.n++;
      th = NULL;
    }
    pthread_mutex_unlock(&cache.lock);
    if (!th) return;
  }
  end_thread(th);
}

void ums__thread_stop(ums__thread_t *th, int keep) {
  uint32_t run = RUN;
  atomic_compare_exchange_strong(&th->state, &run, DONE);
  ums__thread_join(th, keep);
}

pthread_t ums__thread_handle(const ums__thread_t *th) { return th->handle; }

int ums__thread_kept(void) {
  pthread_mutex_lock(&cache.lock);
  int n = cache.n;
  pthread_mutex_unlock(&cache.lock);
  return n;
}
