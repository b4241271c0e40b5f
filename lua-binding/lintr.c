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
** A run that ends within a few milliseconds (a test framework starts one
** per test) never needs the watcher: the handler is installed when the
** run starts, and the watcher thread only once the run has lasted
** LUMS_INTR_WATCH_DELAY (lums_intr_watch_late, called by run() while it
** waits). A Ctrl-C before that waits on the semaphore for the watcher,
** at most that delay; one in a run that ended first is owed to the
** caller, as below. A second Ctrl-C needs no watcher: the handler itself
** ends the process.
**
** The watcher lives until the runtime has shut down, since <close>
** handlers of cancelled tasks run during the shutdown. Once the run's
** outcome is settled (lums_intr_settle, before the shutdown) it cancels
** nothing more: a
** first Ctrl-C after that is owed to the caller, and lums_intr_end raises
** it once the caller's handler is back.
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
  sem_t sem;             /* posted by on_sigint and by lums_intr_end */
  atomic_int signals;    /* [atomic] SIGINTs counted by on_sigint */
  atomic_bool stop;      /* [atomic] the watcher is to end */
  bool watching;         /* the watcher thread runs [owner] */
  pthread_t thread;      /* [owner] */
  lvms *vms;             /* [const while the watcher runs] */
  pthread_mutex_t lock;  /* orders the watcher's cancel and the settle */
  bool settled;          /* [lock] the run's outcome is known: cancel
                            nothing more */
  bool fired;            /* [lock] a first Ctrl-C interrupted the run */
  bool owed;             /* [lock] a first Ctrl-C came once settled */
};

/* One state for the process, never freed: a handler that began just
** before its run ended may still touch it. */
static lintr the_intr = {.lock = PTHREAD_MUTEX_INITIALIZER};
static pthread_once_t sem_once = PTHREAD_ONCE_INIT;
static bool sem_ok;

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

static void sem_setup(void) { sem_ok = sem_init(&the_intr.sem, 0, 0) == 0; }

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
  atomic_store(&in->stop, false);
  in->watching = false;
  in->vms = NULL;
  in->settled = in->fired = in->owed = false;
  return in;
}

/* The first Ctrl-C: interrupts the run, or is owed to the caller once
** the run is settled. */
static void interrupt(lintr *in) {
  pthread_mutex_lock(&in->lock);
  if (in->settled) {
    in->owed = true;
  } else {
    in->fired = true;
    lums_vms_interrupt(in->vms);
  }
  pthread_mutex_unlock(&in->lock);
}

/* The watcher: see the top of this file. */
static void *watch(void *arg) {
  lintr *in = arg;
  pthread_setname_np(pthread_self(), "ums-sigint");
  for (;;) {
    while (sem_wait(&in->sem) != 0 && errno == EINTR) {}
    if (atomic_load(&in->stop)) return NULL;
    interrupt(in);
  }
}

void lums_intr_watch(lintr *in, lvms *vms) {
  if (!in) return;
  in->vms = vms;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
}

void lums_intr_watch_late(lintr *in) {
  if (!in || in->watching) return;
  if (pthread_create(&in->thread, NULL, watch, in) != 0) {
    /* No watcher: Ctrl-C goes to the caller's handler again (one
    ** already counted is owed to it, lums_intr_end). */
    sigaction(SIGINT, &in->old, NULL);
    return;
  }
  in->watching = true;
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
  if (in->watching) {
    atomic_store(&in->stop, true);
    sem_post(&in->sem);
    pthread_join(in->thread, NULL);
  }
  /* After a Ctrl-C the default action stays (a second one ends the
  ** process, as after lua.c's first); otherwise the caller's handler
  ** comes back, and gets a Ctrl-C that came once the run was settled. */
  if (in->fired) set_default();
  else sigaction(SIGINT, &in->old, NULL);
  atomic_store(&owner, NULL);
  bool owed = !in->fired && (in->owed || atomic_load(&in->signals) > 0);
  if (owed) raise(SIGINT);
}
