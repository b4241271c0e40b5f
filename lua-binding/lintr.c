/*
** lintr.c: Ctrl-C (SIGINT) while ums.run runs.
**
** lua5.4's SIGINT handler sets a hook on its main Lua state, which then
** raises "interrupted!" at its next instruction. While ums.run waits for
** its tasks, that state runs no Lua: the hook never fires, the run goes
** on, and only a second Ctrl-C (the handler restores the default action)
** ends the process, without running anything of the tasks.
**
** So, while a run is in progress, ums's own handler (on_sigint) takes
** SIGINT's place. It runs on whichever thread the signal lands and does
** only what a handler may: it counts the signal and posts a semaphore. A
** watcher thread of the run waits on that semaphore and, being an
** ordinary thread, may take locks: it cancels the run as os.exit does
** (lums_vms_interrupt); every task is cancelled, their <close> handlers
** run, and ums.run raises "interrupted!". A second SIGINT makes the
** handler restore the default action and raise the signal again, which
** ends the process, as after lua.c's first Ctrl-C.
**
** The watcher is one thread for the process, started by the first
** watched run and kept, parked on the semaphore, for the runs after it
** (a thread started and joined per run would cost each run a thread
** start and two wake-ups). It blocks every signal, so a signal meant for
** the process never lands on it, and it runs only code of this module,
** which lums_open pins in memory, so it may outlive lua_close; a child
** made by fork has no watcher and starts its own. It acts for the run
** that owns SIGINT only while that run is being watched (from
** lums_intr_watch to lums_intr_end, under `lock`), and only if a SIGINT
** was counted for that run, so a post left over from an earlier run (a
** handler that posted after its run ended) interrupts nothing.
**
** SIGINT stays ours until the runtime has shut down, since <close>
** handlers of cancelled tasks run during the shutdown and a second Ctrl-C
** must still end them (the handler does that itself). Once the run's
** outcome is settled (lums_intr_settle, before the shutdown) the watcher
** cancels nothing more: a first Ctrl-C after that is owed to the caller,
** and lums_intr_end raises it once the caller's handler is back.
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
#include "lvm.h"

#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

struct lintr {
  struct sigaction old;  /* the caller's handler [owner] */
  sem_t sem;             /* posted by on_sigint */
  atomic_int signals;    /* [atomic] SIGINTs counted by on_sigint for the
                            run that owns SIGINT */
  pthread_mutex_t lock;  /* orders the watcher's cancel, the settle and
                            the end of the watch */
  lvms *vms;             /* [lock] the run being watched, or NULL */
  bool settled;          /* [lock] the run's outcome is known: cancel
                            nothing more */
  bool fired;            /* [lock] a first Ctrl-C interrupted the run */
  bool owed;             /* [lock] a first Ctrl-C came once settled */
};

/* One state for the process, never freed: a handler that began just
** before its run ended may still touch it, and so may the watcher. */
static lintr the_intr = {.lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t sem_once = PTHREAD_ONCE_INIT;
static bool sem_ok;
/* The watcher thread runs. [touched only by the thread that owns SIGINT
** (lums_intr_watch), and by fork's child handler] */
static bool watcher_started;

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

/* In a child made by fork only the forking thread lives on: no watcher,
** and a lock the watcher held at the fork would stay held. */
static void after_fork_child(void) {
  watcher_started = false;
  pthread_mutex_init(&the_intr.lock, NULL);
}

static void sem_setup(void) {
  sem_ok = sem_init(&the_intr.sem, 0, 0) == 0 &&
           pthread_atfork(NULL, NULL, after_fork_child) == 0;
}

lintr *lums_intr_block(void) {
  struct sigaction act;
  if (sigaction(SIGINT, NULL, &act) != 0 || !has_handler(&act) ||
      act.sa_handler == on_sigint)
    return NULL;
  pthread_once(&sem_once, sem_setup);
  lintr *in = &the_intr, *none = NULL;
  if (!sem_ok || !atomic_compare_exchange_strong(&owner, &none, in))
    return NULL;  /* another run owns SIGINT */
  while (sem_trywait(&in->sem) == 0) {}  /* a previous run's late post */
  in->old = act;
  atomic_store(&in->signals, 0);
  pthread_mutex_lock(&in->lock);
  in->vms = NULL;
  in->settled = in->fired = in->owed = false;
  pthread_mutex_unlock(&in->lock);
  return in;
}

/* The first Ctrl-C of the run being watched: interrupts it, or is owed
** to the caller once the run is settled. A post with no SIGINT counted
** for the run in force is an earlier run's, and does nothing. */
static void interrupt(lintr *in) {
  pthread_mutex_lock(&in->lock);
  if (!in->vms || atomic_load(&in->signals) == 0) {
    /* no run watched, or a stale post */
  } else if (in->settled) {
    in->owed = true;
  } else if (!in->fired) {
    in->fired = true;
    lums_vms_interrupt(in->vms);
  }
  pthread_mutex_unlock(&in->lock);
}

/* The watcher: see the top of this file. It never ends. */
static void *watch(void *arg) {
  lintr *in = arg;
  pthread_setname_np(pthread_self(), "ums-sigint");
  for (;;) {
    while (sem_wait(&in->sem) != 0 && errno == EINTR) {}
    interrupt(in);
  }
  return NULL;
}

/* Starts the process's watcher if it is not running. Returns whether it
** runs. */
static bool start_watcher(lintr *in) {
  if (watcher_started) return true;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_t thread;
  int e = pthread_attr_init(&attr);
  if (e == 0) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    e = pthread_create(&thread, &attr, watch, in);
    pthread_attr_destroy(&attr);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  watcher_started = e == 0;
  return watcher_started;
}

void lums_intr_watch(lintr *in, lvms *vms) {
  if (!in) return;
  if (!start_watcher(in))
    return;  /* no watcher: Ctrl-C goes to the caller's handler */
  pthread_mutex_lock(&in->lock);
  in->vms = vms;
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
  /* Once the lock is released the watcher is not using the run's VMs,
  ** and it will not again: the caller may free them. */
  pthread_mutex_lock(&in->lock);
  in->vms = NULL;
  pthread_mutex_unlock(&in->lock);
  /* After a Ctrl-C the default action stays (a second one ends the
  ** process, as after lua.c's first); otherwise the caller's handler
  ** comes back, and gets a Ctrl-C that came once the run was settled. */
  if (in->fired) set_default();
  else sigaction(SIGINT, &in->old, NULL);
  atomic_store(&owner, NULL);
  bool owed = !in->fired && (in->owed || atomic_load(&in->signals) > 0);
  if (owed) raise(SIGINT);
}
