/*
** lfs.h: what ums.fs (lfs.c) keeps in each task.
*/
#ifndef LFS_H
#define LFS_H

#include "lums.h"

/* ums.fs's state of one task, embedded in its ltask (ltask.fs). lfs.c
** owns its members; the task's life cycle (lums.c) calls lfs_task_end
** when the task ends. Scheduler thread. */
typedef struct lfs_task {
  ums_buf_t *readbuf;    /* the buffer of the ums.fs.readfile the task is
                            in (the task's reference; the request holds
                            its own while it runs); released when the call
                            ends, or by lfs_task_end if a raise cut the
                            call short */
} lfs_task;

/* Releases what a call cut short by a raise left in f. */
static inline void lfs_task_end(lfs_task *f) {
  if (f->readbuf) {
    ums_buf_release(f->readbuf);
    f->readbuf = NULL;
  }
}

#endif
