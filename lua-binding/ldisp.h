/*
** ldisp.h: where requests run (ldisp.c). A request is a work item of the
** runtime (ums-binding.h, "Work items"): queued where the runtime's
** placement puts it, or on the scheduler ums.submit_on names, and started
** by whichever scheduler the runtime gives it to, its own or one that
** steals it, as a task of that scheduler's VM.
*/
#ifndef LDISP_H
#define LDISP_H

#include "lreq.h"

/* What the run keeps of its requests' placement: embedded in it
** (lrun.disp). */
typedef struct ldispatch {
  const char *refusal;   /* [lrun.reqs.lock] the latest refusal's message
                            (a VM slot's init_err, freed with the run),
                            for requests no scheduler will take */
} ldispatch;

/* Queues r, filled by its maker (rt, run, the work, state R_QUEUED,
** sched -1) and holding its maker's reference, on scheduler target (< 0:
** where the runtime's placement puts it), and takes the run's reference
** and hold for it. Returns 0, or UMS_ESHUTDOWN when the runtime is
** shutting down (r is then finished cancelled). Any thread. */
LUMS_HIDDEN int lums_req_queue(lrun *v, lreq *r, int target);
/* Cancels r: one not started never starts (finished cancelled here, on
** the calling thread); a running one sees ums.CANCELLED at its next wait
** (or quantum). false once done. Any thread. */
LUMS_HIDDEN bool lums_req_cancel(lreq *r);
/* After ums_runtime_shutdown (no scheduler thread is left, and the
** runtime has ended the requests it never gave to a scheduler): ends
** those whose task was cancelled before it began, cancelled. */
LUMS_HIDDEN void lums_disp_close(lrun *v);

#endif
