/*
** lintr.h: Ctrl-C during ums.run (see the top of lintr.c).
*/
#ifndef LINTR_H
#define LINTR_H

#include "lums.h"

/* run() calls lums_intr_block first (NULL: Ctrl-C is not watched; every call
** below accepts it), lums_intr_watch once the first task exists,
** lums_intr_settle before the runtime shuts down (true: Ctrl-C interrupted
** the run; nothing is cancelled after it) and lums_intr_end, which gives
** SIGINT back, on every way out once the runtime's threads are gone. All on
** the thread that called ums.run. */
typedef struct lintr lintr;
LUMS_HIDDEN lintr *lums_intr_block(void);
LUMS_HIDDEN void lums_intr_watch(lintr *in, lrun *run);
LUMS_HIDDEN bool lums_intr_settle(lintr *in);
LUMS_HIDDEN void lums_intr_end(lintr *in);

#endif
