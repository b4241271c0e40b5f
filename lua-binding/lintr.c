/*
** lintr.c: Ctrl-C (SIGINT) while ums.run runs.
**
** lua5.4's SIGINT handler sets a hook on its main Lua state, which then
** raises "interrupted!" at its next instruction. While ums.run runs its
** tasks, that state runs no Lua of its own: the hook never fires, the
** run goes on, and only a second Ctrl-C (the handler restores the default
** action) ends the process, without running anything of the tasks.
**
** So, while a run is in progress, ums's own handler (on_sigint) takes
** SIGINT's place. It runs on whichever thread the signal lands and does
** only what a handler may: it counts the signal and posts a semaphore. A
** watcher thread waits on that semaphore and, being an ordinary thread,
** may take locks: it cancels the run as os.exit does
** (lums_run_interrupt); every task is cancelled, their <close> handlers
** run, and ums.run raises "interrupted!". A second SIGINT makes the
** handler restore the default action and raise the signal again, which
** ends the process, as after lua.c's first Ctrl-C.
**
** The watcher is one thread for the process, started by the first
** watched run before any of its tasks exists, and it lives until the
** process ends, every signal blocked. A run per test then costs no
** thread, and no run ever creates one while its tasks run: the thread
** that called ums.run may be running them itself, and creating a thread
** waits for the dynamic loader's lock, which a C call of a task on the
** pool (dlopen of a FIFO) may hold until another task runs.
**
** The watcher cancels only the run that owns SIGINT, and only for a
** signal that run counted: a post that a run's end left behind finds the
** next run's count at zero and is dropped. Once the run's outcome is
** settled (lums_intr_settle, before the shutdown) it cancels nothing
** more: a first Ctrl-C after that is owed to the caller, and
** lums_intr_end raises it once the caller's handler is back.
**
** Only a run whose caller has a SIGINT handler is watched (lua5.4 has one
** while it runs a script, busted's runs included): with the default
** action Ctrl-C ends the process and with SIG_IGN it is ignored, as the
** host chose. One run at a time owns the signal (a host may run several
** VMs' runs at once on several threads). No signal mask changes, so
** processes started from tasks get Ctrl-C as usual. After a run that was
** not interrupted the caller's handler is put back, so lua5.4 behaves as
** before outside ums.run; after an interrupted one the default action
** stays, as after lua.c's own first Ctrl-C.
*/
#define _GNU_SOURCE
#include "lums.h"
#include "lintr.h"
#include "lvm.h"

#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct lintr {
  struct sigaction old;  /* the caller's handler [owner] */
  sem_t sem;             /* posted by on_sigint */
  atomic_int signals;    /* [atomic] SIGINTs counted by on_sigint */
  pthread_mutex_t lock;  /* orders the watcher's cancel, the start and the
                            settle */
  bool active;           /* [lock] a run owns SIGINT */
  lrun *run;             /* [lock] its run, once it has a first task */
  bool early;            /* [lock] a Ctrl-C came before that */
  bool settled;          /* [lock] the run's outcome is known: cancel
                            nothing more */
  bool fired;            /* [lock] a first Ctrl-C interrupted the run */
};

/* One state for the process, never freed: a handler that began just
** before its run ended may still touch it, and the watcher always
** does. */
static lintr the_intr = {.lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t watcher_once = PTHREAD_ONCE_INIT;
static bool watcher_ok;

/* The run that owns SIGINT (&the_intr), or NULL. [atomic; taken by
** lums_intr_block, given back by lums_intr_end, read by on_sigint] */
static _Atomic(lintr *) owner;

static void set_default(void) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGINT, &dfl, NULL);
}

/* The handler: async-signal-safe calls only (atomics, sem_post,
** sigaction, raise). SIGINT is blocked while it runs, so the raise of a
** second one takes effect, by the default action, as it returns. */
static void on_sigint(int sig) {
  int saved = errno;
  lintr *in = atomic_load(&owner);
  if (!in || atomic_fetch_add(&in->signals, 1) > 0) {
    set_default();
    raise(sig);
  } else {
    sem_post(&in->sem);
  }
  errno = saved;
}

static bool has_handler(const struct sigaction *act) {
  if (act->sa_flags & SA_SIGINFO) return act->sa_sigaction != NULL;
  return act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN;
}

/* The first Ctrl-C of the run that owns SIGINT: interrupts it, or is
** owed to the caller once the run is settled, or waits for the run's
** first task (lums_intr_watch). A post no run counted is dropped. */
static void interrupt(lintr *in) {
  pthread_mutex_lock(&in->lock);
  if (!in->active || atomic_load(&in->signals) == 0 || in->fired ||
      in->settled) {
    /* Left behind by a run that has ended, a second post, or owed to the
    ** caller (lums_intr_end raises it). */
  } else if (!in->run) {
    in->early = true;
  } else {
    in->fired = true;
    lums_run_interrupt(in->run);
  }
  pthread_mutex_unlock(&in->lock);
}

/* The watcher: see the top of this file. */
static void *watch(void *arg) {
  lintr *in = arg;
  pthread_setname_np(pthread_self(), "ums-sigint");
  for (;;) {
    while (sem_wait(&in->sem) != 0 && errno == EINTR) {}
    interrupt(in);
  }
  return NULL;
}

static void watcher_start(void) {
  if (sem_init(&the_intr.sem, 0, 0) != 0) return;
  /* Every signal blocked: the watcher runs no handler, and a signal for
  ** the process goes to a thread that may. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t th;
  watcher_ok = pthread_create(&th, NULL, watch, &the_intr) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (watcher_ok) pthread_detach(th);
}

lintr *lums_intr_block(void) {
  struct sigaction act;
  if (sigaction(SIGINT, NULL, &act) != 0 || !has_handler(&act) ||
      act.sa_handler == on_sigint)
    return NULL;
  /* Without a watcher Ctrl-C stays with the caller's handler. */
  pthread_once(&watcher_once, watcher_start);
  lintr *in = &the_intr, *none = NULL;
  if (!watcher_ok || !atomic_compare_exchange_strong(&owner, &none, in))
    return NULL;  /* another run owns SIGINT */
  in->old = act;
  pthread_mutex_lock(&in->lock);
  atomic_store(&in->signals, 0);
  in->active = true;
  in->run = NULL;
  in->early = in->settled = in->fired = false;
  pthread_mutex_unlock(&in->lock);
  return in;
}

void lums_intr_watch(lintr *in, lrun *run) {
  if (!in) return;
  pthread_mutex_lock(&in->lock);
  in->run = run;
  if (in->early) {
    in->fired = true;
    lums_run_interrupt(run);
  }
  pthread_mutex_unlock(&in->lock);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

bool lums_intr_settle(lintr *in) {
  if (!in) return false;
  pthread_mutex_lock(&in->lock);
  in->settled = true;
  bool fired = in->fired;
  pthread_mutex_unlock(&in->lock);
  return fired;
}

void lums_intr_end(lintr *in) {
  if (!in) return;
  /* After a Ctrl-C the default action stays (a second one ends the
  ** process, as after lua.c's first); otherwise the caller's handler
  ** comes back, and gets a Ctrl-C that came once the run was settled
  ** (the watcher may not have seen it yet: the count says). */
  pthread_mutex_lock(&in->lock);
  in->active = false;
  bool fired = in->fired;
  pthread_mutex_unlock(&in->lock);
  if (fired) set_default();
  else sigaction(SIGINT, &in->old, NULL);
  atomic_store(&owner, NULL);
  if (!fired && atomic_load(&in->signals) > 0) raise(SIGINT);
}
