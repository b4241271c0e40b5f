/*
** ldisp.h: where requests run (ldisp.c). Requests wait in per-scheduler
** queues until a dispatcher (a C step task, at most one per scheduler)
** starts them; a request goes to the queue the runtime's placement
** policy picks (ums_runtime_place), or to the one ums.submit_on names,
** and an idle scheduler steals what has not started from a busy one
** (one named with submit_on only after a grace: ldisp.c).
*/
#ifndef LDISP_H
#define LDISP_H

#include "lreq.h"

#include <stdlib.h>

typedef struct lreqq {
  ums_list_t list;       /* of lreq.qlink, FIFO */
  int n;
} lreqq;

/* The dispatchers' state of a run: embedded in it (lrun.disp), one entry
** per scheduler in each array, all guarded by the run's request lock
** (lrun.reqs.lock). */
typedef struct ldispatch {
  lreqq *q;              /* requests not started */
  bool *running;         /* a dispatcher exists */
  bool *refused;         /* its VM could not be set up (or its init
                            module failed), so it takes no work and its
                            queue is empty */
  int nrefused;          /* how many have refused */
  const char *refusal;   /* the latest refusal's message (a VM slot's
                            init_err, freed with the run) */
  int64_t *extra;        /* scratch for placement: what each scheduler
                            has beyond its tasks */
  bool *graced;          /* its dispatcher is parked waiting out the steal
                            grace of another's request (ldisp.c) */
  ums_park_token_t *grace; /* that park, while graced */
} ldispatch;

/* Allocates d's arrays for n schedulers (d zeroed); false when out of
** memory (ldispatch_free then frees what was made). Inline so that the
** run (lvm.c), which makes and frees it, does not call into ldisp.c. */
static inline bool ldispatch_init(ldispatch *d, int n) {
  d->q = (lreqq *)calloc((size_t)n, sizeof *d->q);
  d->running = (bool *)calloc((size_t)n, sizeof *d->running);
  d->refused = (bool *)calloc((size_t)n, sizeof *d->refused);
  d->extra = (int64_t *)calloc((size_t)n, sizeof *d->extra);
  d->graced = (bool *)calloc((size_t)n, sizeof *d->graced);
  d->grace = (ums_park_token_t *)calloc((size_t)n, sizeof *d->grace);
  return d->q && d->running && d->refused && d->extra && d->graced &&
         d->grace;
}

static inline void ldispatch_free(ldispatch *d) {
  free(d->q);
  free(d->running);
  free(d->refused);
  free(d->extra);
  free(d->graced);
  free(d->grace);
}

/* Queues r, filled by its maker (rt, run, the work, state R_QUEUED,
** sched -1) and holding its maker's reference, on scheduler target (< 0:
** where the runtime's placement puts it, here winning ties; here may be
** -1), and starts dispatchers. Takes the run's reference and hold.
** Returns 0, or UMS_ESHUTDOWN when the run is ending (r is then finished
** cancelled). Any thread. */
LUMS_HIDDEN int lums_req_queue(lrun *v, lreq *r, int target, int here);
/* Cancels r: one not started never starts (finished cancelled here, on
** the calling thread); a running one sees ums.CANCELLED at its next wait
** (or quantum). false once done. Any thread. */
LUMS_HIDDEN bool lums_req_cancel(lreq *r);
/* After ums_runtime_shutdown (no scheduler thread is left): ends the
** requests never started, and those whose task was cancelled before it
** began, cancelled. */
LUMS_HIDDEN void lums_disp_close(lrun *v);

#endif
