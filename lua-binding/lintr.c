/*
** lintr.c: Ctrl-C (SIGINT) while ums.run runs.
**
** lua5.4's SIGINT handler sets a hook on its main Lua state, which then
** raises "interrupted!" at its next instruction. While ums.run waits for
** its tasks, that state runs no Lua: the hook never fires, the run goes
** on, and only a second Ctrl-C (the handler restores the default action)
** ends the process, without running anything of the tasks.
**
** So, while a run is in progress, SIGINT is blocked in the thread that
** called ums.run before the run's threads are made (they inherit the
** mask), and a watcher thread of the run takes it with sigwaitinfo. No
** signal handler of ours ever runs: the watcher is an ordinary thread and
** may take locks. On the first SIGINT it restores the default action and
** cancels the run as os.exit does (lums_vms_interrupt): every task is
** cancelled, their <close> handlers run, and ums.run raises
** "interrupted!". On a second SIGINT it unblocks SIGINT in itself and
** raises it: the default action ends the process, as after lua.c's
** first Ctrl-C.
**
** The watcher lives until the runtime has shut down, since <close>
** handlers of cancelled tasks run during the shutdown and a second Ctrl-C
** must still end them. Once the run's outcome is settled
** (lums_intr_settle, before the shutdown) it cancels nothing more: a
** first Ctrl-C after that is owed to the caller, and lums_intr_end raises
** it in the caller's thread once its mask is back.
**
** Only a run whose caller has a SIGINT handler is watched (lua5.4 has one
** while it runs a script, busted's runs included): with the default
** action Ctrl-C ends the process and with SIG_IGN it is ignored, as the
** host chose; a caller that blocks SIGINT keeps it blocked. After a run
** that was not interrupted the caller's mask is restored and its handler
** was never touched, so lua5.4 behaves as before outside ums.run.
*/
#define _GNU_SOURCE
#include "lums.h"
#include "lvm.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct lintr {
  sigset_t oldmask;      /* the caller's mask [caller] */
  bool watching;         /* the watcher thread runs [caller] */
  pthread_t thread;      /* [caller] */
  lvms *vms;             /* [const while the watcher runs] */
  pthread_mutex_t lock;  /* orders the watcher's cancel and the settle */
  bool settled;          /* [lock] the run's outcome is known: cancel
                            nothing more */
  bool fired;            /* [lock] a first Ctrl-C interrupted the run */
  bool owed;             /* [lock] a first Ctrl-C came once settled */
  atomic_bool stop;      /* [atomic] the watcher is to end */
};

static bool has_handler(const struct sigaction *act) {
  if (act->sa_flags & SA_SIGINFO) return act->sa_sigaction != NULL;
  return act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN;
}

static void sigint_set(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
}

static void sigint_default(void) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGINT, &dfl, NULL);
}

lintr *lums_intr_block(void) {
  struct sigaction act;
  if (sigaction(SIGINT, NULL, &act) != 0 || !has_handler(&act)) return NULL;
  lintr *in = calloc(1, sizeof *in);
  if (!in) return NULL;  /* Ctrl-C then goes to the caller's handler */
  sigset_t set;
  sigint_set(&set);
  if (pthread_sigmask(SIG_BLOCK, &set, &in->oldmask) != 0 ||
      sigismember(&in->oldmask, SIGINT)) {  /* blocked: the caller's choice */
    free(in);
    return NULL;
  }
  pthread_mutex_init(&in->lock, NULL);
  atomic_init(&in->stop, false);
  return in;
}

/* A real Ctrl-C came: interrupts the run, or ends the process if one
** came before, or is owed to the caller once the run is settled. */
static void on_sigint(lintr *in) {
  pthread_mutex_lock(&in->lock);
  bool second = in->fired || in->owed;
  if (!second && in->settled) {
    in->owed = true;  /* for the caller's handler, which stays */
  } else if (!second) {
    sigint_default();
    in->fired = true;
    lums_vms_interrupt(in->vms);
  }
  pthread_mutex_unlock(&in->lock);
  if (second) {
    sigset_t set;
    sigint_set(&set);
    sigint_default();
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(SIGINT);
  }
}

/* The watcher: see the top of this file. */
static void *watch(void *arg) {
  lintr *in = arg;
  sigset_t set;
  sigint_set(&set);
  for (;;) {
    siginfo_t si;
    if (sigwaitinfo(&set, &si) < 0) continue;  /* EINTR */
    if (!atomic_load(&in->stop)) {
      on_sigint(in);
      continue;
    }
    /* lums_intr_end's own SIGINT for this thread, and perhaps a real one
    ** for the process (each kind is pending at most once): two taken
    ** mean a real one came. */
    int taken = 1;
    struct timespec now = {0, 0};
    while (sigtimedwait(&set, &si, &now) == SIGINT) taken++;
    if (taken > 1) on_sigint(in);
    return NULL;
  }
}

void lums_intr_watch(lintr *in, lvms *vms) {
  if (!in) return;
  in->vms = vms;
  in->watching = pthread_create(&in->thread, NULL, watch, in) == 0;
  /* No watcher: Ctrl-C goes to the caller's handler, as without ums. */
  if (!in->watching) pthread_sigmask(SIG_SETMASK, &in->oldmask, NULL);
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
    pthread_kill(in->thread, SIGINT);
    pthread_join(in->thread, NULL);
  }
  /* The default action set by a first Ctrl-C stays, as after lua.c's own
  ** handler; a SIGINT that came once the watcher was gone is delivered
  ** now, and one owed to the caller is raised for its handler. */
  pthread_sigmask(SIG_SETMASK, &in->oldmask, NULL);
  if (in->owed) raise(SIGINT);
  pthread_mutex_destroy(&in->lock);
  free(in);
}
