/*
** ums.h: the public C API of ums, a user-mode scheduler.
** Copyright (c) 2026 the ums authors; MIT license, see LICENSE.
**
** A runtime owns N cooperative schedulers (default: one per CPU). Each
** scheduler is run by one OS thread and carries tasks on C fibers
** ("workers"). Tasks yield cooperatively; every wait can carry a deadline
** and can be cancelled. docs/design/architecture.md describes the
** architecture, docs/c-api.md indexes this header.
**
** Conventions:
**   - Functions return 0 or a negative UMS_E* code (see ums_strerror).
**   - Time is absolute CLOCK_MONOTONIC nanoseconds (ums_now()); a deadline
**     of UMS_FOREVER never expires. ums_deadline(ns) is "ns from now",
**     read from a fresh clock.
**   - Waits ("may park") may be called from a task, where they park only
**     that task, or from any other thread (a "host thread"), where they
**     block that OS thread. Waits return UMS_ETIMEDOUT at the deadline and
**     UMS_ECANCELED once the calling task has been cancelled: a cancelled
**     task is refused every wait that would park it, while calls that
**     complete at once (an uncontended lock, a set event, joining a
**     finished task) still succeed, so that cleanup code can run.
*/
#ifndef UMS_H
#define UMS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* UMS_VERSION_MAJOR, _MINOR, _PATCH and _STRING, generated from the
** project's version. */
#include "ums-version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && __GNUC__ >= 4
#define UMS_API __attribute__((visibility("default")))
#else
#define UMS_API
#endif

/* ====================================================================== */
/* Errors                                                                  */
/* ====================================================================== */

/* Error codes are negative errno values where one fits, so that code that
** already speaks errno reads them naturally. */
#define UMS_ERRNO_MAP(X)                                                     \
  X(EINVAL, -22, "invalid argument")                                         \
  X(ENOMEM, -12, "out of memory")                                            \
  X(EAGAIN, -11, "resource temporarily unavailable")                         \
  X(ETIMEDOUT, -110, "timed out")                                            \
  X(ECANCELED, -125, "task cancelled")                                       \
  X(ESRCH, -3, "no such task")                                               \
  X(EPERM, -1, "operation not permitted")                                    \
  X(EDEADLK, -35, "operation would deadlock")                                \
  X(EBUSY, -16, "resource busy")                                             \
  X(EPIPE, -32, "channel closed")                                            \
  X(ESHUTDOWN, -108, "runtime is shutting down")                             \
  X(ENOTSUP, -95, "operation not supported")                                 \
  X(EMFILE, -24, "too many tasks")                                           \
  X(ERANGE, -34, "value out of range")                                       \
  X(ENOENT, -2, "no such file or directory")                                 \
  X(EINTR, -4, "interrupted system call")                                    \
  X(EIO, -5, "input/output error")                                           \
  X(EBADF, -9, "bad file descriptor")                                        \
  X(EACCES, -13, "permission denied")                                        \
  X(EFAULT, -14, "bad address")                                              \
  X(EEXIST, -17, "file exists")                                              \
  X(EXDEV, -18, "invalid cross-device link")                                 \
  X(ENOTDIR, -20, "not a directory")                                         \
  X(EISDIR, -21, "is a directory")                                           \
  X(ENFILE, -23, "too many open files in system")                            \
  X(EFBIG, -27, "file too large")                                            \
  X(ENOSPC, -28, "no space left on device")                                  \
  X(ESPIPE, -29, "illegal seek")                                             \
  X(EROFS, -30, "read-only file system")                                     \
  X(ENAMETOOLONG, -36, "file name too long")                                 \
  X(ENOSYS, -38, "function not implemented")                                 \
  X(ENOTEMPTY, -39, "directory not empty")                                   \
  X(ELOOP, -40, "too many levels of symbolic links")                         \
  X(EOVERFLOW, -75, "value too large for defined data type")

enum {
#define UMS__ERR_ENUM(name, value, text) UMS_##name = (value),
  UMS_ERRNO_MAP(UMS__ERR_ENUM)
#undef UMS__ERR_ENUM
};

/* Alias: a send to or a receive from a closed, drained channel. */
#define UMS_ECLOSED UMS_EPIPE

/* A readable message for an error code; never NULL. Negative errno values
** outside the map (file I/O passes the kernel's codes through) get the C
** library's strerror text. */
UMS_API const char *ums_strerror(int err);
/* The code's name ("UMS_ETIMEDOUT"); "UMS_E?" for unknown codes. */
UMS_API const char *ums_err_name(int err);

/* ====================================================================== */
/* Time                                                                    */
/* ====================================================================== */

#define UMS_FOREVER INT64_MAX
#define UMS_NSEC_PER_SEC INT64_C(1000000000)
#define UMS_NSEC_PER_MSEC INT64_C(1000000)
#define UMS_NSEC_PER_USEC INT64_C(1000)

/* CLOCK_MONOTONIC in nanoseconds; inside a task of a runtime with a
** virtual clock, that runtime's virtual time (see "Virtual clock"). */
UMS_API int64_t ums_now(void);
/* A deadline ns nanoseconds from now (ums_now()); UMS_FOREVER when ns < 0
** or the sum overflows. */
UMS_API int64_t ums_deadline(int64_t ns);

/* ====================================================================== */
/* Runtime                                                                 */
/* ====================================================================== */

typedef struct ums_runtime ums_runtime_t;

struct ums_stall; /* see "Observability" */
struct ums_pool_exhausted; /* see "Observability" */

/* The smallest ums_config_t.stack_size accepted. A worker's stack holds
** the runtime's own frames (the scheduler pass runs on it), a signal's
** frame (several KiB on x86-64 with AVX-512), and glibc's stdio writing a
** report to unbuffered stderr (a BUFSIZ buffer on the stack), besides the
** task's own code: 64 KiB leaves the task most of it. */
#define UMS_STACK_SIZE_MIN (64 * 1024)

/* Configuration; zero-initialise and set what you need. Zero means the
** default shown. */
typedef struct ums_config {
  int schedulers;               /* schedulers (OS threads); default: CPUs */
  int max_workers;              /* active tasks per scheduler; 0: unbounded */
  size_t stack_size;            /* bytes per C task stack; default 256 KiB,
                                   at least UMS_STACK_SIZE_MIN */
  int64_t worker_idle_timeout;  /* ns before an idle worker is trimmed;
                                   default 10 s; negative: never trim */
  int idle_workers_kept;        /* idle workers never trimmed per scheduler;
                                   default 16 */
  int io_backend;               /* UMS_IO_AUTO (default), UMS_IO_URING or
                                   UMS_IO_POOL; see "File I/O" */
  int io_pool_threads;          /* most threads of the I/O pool; default 64 */
  int preempt_threads;          /* most threads of the C-call pool (see
                                   "Going preemptive"); default 10000 */
  int clock;                    /* UMS_CLOCK_REAL (default) or
                                   UMS_CLOCK_VIRTUAL; see "Virtual clock" */
  int stats;                    /* UMS_STATS_ON (default), UMS_STATS_OFF
                                   (no wait timing nor CPU sampling) or
                                   UMS_STATS_PRECISE (waits timed to the
                                   nanosecond, at a clock reading per
                                   park); see "Observability". With the
                                   default, UMS_STATS=off|on|precise in the
                                   environment chooses */
  int64_t stall_threshold;      /* ns a busy scheduler may go without
                                   passing through its loop before the
                                   monitor reports a stall; default 1 s;
                                   negative: no stall detection */
  void (*on_stall)(const struct ums_stall *stall, void *arg);
                                /* called on the monitor thread for each
                                   stall; NULL: one line on stderr */
  void *on_stall_arg;           /* passed to on_stall */
  void (*on_pool_exhausted)(const struct ums_pool_exhausted *ex,
                            void *arg);
                                /* called on the monitor thread once per
                                   exhaustion episode of a pool (see
                                   "Observability"; stall_threshold is
                                   its threshold too); NULL: one line on
                                   stderr */
  void *on_pool_exhausted_arg;  /* passed to on_pool_exhausted */
  void (*on_deadlock)(ums_runtime_t *rt, int sched, void *arg);
                                /* called when nothing in the runtime can
                                   wake its tasks any more (see
                                   "Deadlocks"); NULL: no detection */
  void *on_deadlock_arg;        /* passed to on_deadlock */
  int keep_threads;             /* idle threads (schedulers', the
                                   monitor's) this runtime's shutdown may
                                   leave parked for the process, for later
                                   runtimes to reuse instead of creating
                                   their own (see "Runtime"); default 0:
                                   every thread ends with the runtime */
  int run_on_caller;            /* nonzero: scheduler 0 gets no thread of
                                   its own; the thread that called
                                   ums_runtime_new runs it inside
                                   ums_runtime_run and
                                   ums_runtime_shutdown (see "Running on
                                   the caller's thread"); needs
                                   schedulers = 1 */
} ums_config_t;

/* Clocks (ums_config_t.clock). */
enum { UMS_CLOCK_REAL = 0, UMS_CLOCK_VIRTUAL = 1 };

/* ums_config_t.stats. */
enum {
  UMS_STATS_DEFAULT = 0,
  UMS_STATS_ON = 1,
  UMS_STATS_OFF = 2,
  UMS_STATS_PRECISE = 3
};

/* File I/O backends (ums_config_t.io_backend). AUTO uses io_uring when the
** kernel lets the process set up a ring and the thread pool otherwise;
** with AUTO, UMS_IO=pool (or UMS_IO=uring) in the environment chooses
** instead. URING fails ums_runtime_new when a ring cannot be set up (the
** error is the kernel's: UMS_ENOSYS, UMS_EPERM, ...). ums_runtime_config
** reports the backend in force, never AUTO. */
enum { UMS_IO_AUTO = 0, UMS_IO_URING = 1, UMS_IO_POOL = 2 };

/* Bounds of ums_config_t's settings besides UMS_STACK_SIZE_MIN (0 always
** means the default; the other integer settings may be anything from 0 to
** INT_MAX). The Lua binding's ums.config checks against these same bounds
** (with UMS_LUA_STACK_SIZE_MIN for Lua's stacks). */
#define UMS_SCHEDULERS_MAX 1024
#define UMS_STACK_SIZE_MAX ((size_t)1 << 30)

/* Starts the schedulers. cfg may be NULL. On failure returns NULL and, if
** err is not NULL, stores the reason (UMS_EAGAIN when a thread could not be
** created, UMS_ENOMEM, UMS_EINVAL for a bad configuration or a bad value
** of one of the environment variables the runtime reads (UMS_IO,
** UMS_STATS, UMS_STACK_GUARD, UMS_STAMP_CLOCK), the kernel's error when
** io_backend is UMS_IO_URING and no ring can be set up); no thread is left
** running, and ums_runtime_error() says why in words. */
UMS_API ums_runtime_t *ums_runtime_new(const ums_config_t *cfg, int *err);

/* Why the last ums_runtime_new of the calling thread failed, in words
** that name the setting or the thread: "schedulers = 5000 is out of range
** (0: one per CPU, or 1 to 1024)", "cannot create the thread of scheduler
** 1: Resource temporarily unavailable"; "" after a success. Valid until
** the thread's next ums_runtime_new. */
UMS_API const char *ums_runtime_error(void);

/* Stops accepting work (spawns fail with UMS_ESHUTDOWN), waits until every
** task has finished or the deadline passes, then cancels the tasks left
** (they see UMS_ECANCELED at their next wait point, and every wait after
** that fails the same way) and waits for them to end; finally joins every
** thread and frees the runtime and everything it owns (with keep_threads =
** n, up to n of its scheduler and monitor threads, at most 8 for the
** process, park instead, every signal blocked, for a later
** ums_runtime_new to reuse; they are joined at process exit, and a child
** made by fork has none). Joinable tasks that were never joined are
** released. Must not be called from a task of this
** runtime (returns UMS_EDEADLK and does nothing). Returns 0, or
** UMS_ETIMEDOUT when tasks had to be cancelled at the deadline; in both
** cases rt is freed. Host threads may be inside calls on rt (a join, a
** ums_event_set that lets the last task end) while it runs: shutdown waits
** for those calls to leave the runtime before freeing it. A call that
** starts after shutdown has returned is a use after free. */
UMS_API int ums_runtime_shutdown(ums_runtime_t *rt, int64_t deadline);

/* Running on the caller's thread. A runtime made with run_on_caller has
** no scheduler thread: its one scheduler runs only while the thread that
** made it is inside ums_runtime_run (or ums_runtime_shutdown, which runs
** it until its tasks have ended, cancelling them at the deadline). A
** short run then costs no hand-off between threads, which a host that
** starts one runtime per request or per test would otherwise pay at
** every start and stop. Everything else works as with a thread of its
** own, the monitor's stall reports included; a host thread that wants a
** task's result outside ums_runtime_run must not block waiting for it
** (nothing would run the task).
**
** ums_runtime_run runs the scheduler until ums_runtime_pause has been
** called since the last return, or the real-time deadline passes
** (checked at each pass of the scheduler and in its idle wait: a task
** that never reaches a wait point keeps the thread until it does, as it
** keeps a scheduler thread). Tasks not finished stay as they are for the
** next call.
** Returns 0 after a pause, UMS_ETIMEDOUT at the deadline, UMS_EINVAL for
** a runtime without run_on_caller, UMS_EPERM on another thread than the
** one that made it, UMS_EDEADLK from inside a task. */
UMS_API int ums_runtime_run(ums_runtime_t *rt, int64_t deadline);

/* Makes ums_runtime_run return at its next pass (or the next call return
** at once, if none is in progress): any thread, a task included, a signal
** handler not. No effect on a runtime without run_on_caller. */
UMS_API void ums_runtime_pause(ums_runtime_t *rt);

/* Number of schedulers. */
UMS_API int ums_runtime_schedulers(const ums_runtime_t *rt);

/* The configuration in force (defaults filled in). */
UMS_API void ums_runtime_config(const ums_runtime_t *rt, ums_config_t *out);

/* ---------------------------------------------------------------------- */
/* Virtual clock                                                           */
/* ---------------------------------------------------------------------- */
/*
** With cfg.clock = UMS_CLOCK_VIRTUAL, time inside the runtime is virtual,
** for tests and simulations: it starts at 0 when the runtime is created
** (so every run reads the same times), and stands still while any task
** can run. When nothing is runnable, no file I/O or preemptive call of its
** tasks is in flight and no ums_wait_idle waiter is left to wake, the
** scheduler sets the clock to the earliest timer's deadline at once
** instead of sleeping: an hour of sleeps and timeouts passes in
** microseconds, and tasks wake in deadline order (ties in the order they
** went to sleep), the same on every run.
**
**   - Only the runtime's own threads see virtual time: ums_now(),
**     ums_deadline() and every deadline computed inside a task. Host
**     threads, pool threads and the C functions run by ums_preempt live in
**     real time; a host thread's wait on the runtime (a join from main)
**     takes a real deadline. ums_runtime_now() reads the virtual clock
**     from anywhere.
**   - While file I/O or a preemptive call of its tasks is in flight, time
**     does not move: the scheduler really waits for the completion (its
**     deadline, in virtual time, cannot pass meanwhile).
**   - A wake-up that comes from a host thread (an event it sets, a task it
**     cancels or spawns) is not waited for: if every task is blocked and a
**     timer is armed, the clock moves on. With no timer armed, the
**     scheduler sleeps until such a wake-up, without using CPU.
**   - It needs exactly one scheduler: schedulers = 0 means 1, more is
**     refused (UMS_EINVAL), because two schedulers cannot agree on when
**     "nothing can run" holds without stopping each other.
*/

/* The runtime's clock: ums_now() for a real clock, the virtual time for a
** virtual one. Any thread. */
UMS_API int64_t ums_runtime_now(const ums_runtime_t *rt);

/* ====================================================================== */
/* Tasks                                                                   */
/* ====================================================================== */

/* A task handle: an id with a generation, never reused while the runtime
** lives, so a handle to a finished and recycled task is detected
** (UMS_ESRCH) rather than reaching another task. 0 is never a task. */
typedef uint64_t ums_task_t;

typedef void *(*ums_task_fn)(void *arg);

#define UMS_ANY_SCHED (-1)

/* Spawn options; zero-initialise. */
typedef struct ums_spawn_opts {
  int sched;        /* scheduler index, or UMS_ANY_SCHED (least loaded) */
  int detached;     /* nonzero: nobody joins; the task is released when it
                       ends */
  const char *name; /* copied (up to 31 bytes); may be NULL */
} ums_spawn_opts_t;

/* Starts fn(arg) as a new task on a C fiber. opts may be NULL (joinable,
** least-loaded scheduler). Callable from any thread. A joinable task keeps
** its result until ums_task_join or ums_task_detach; the runtime releases
** it at shutdown otherwise. When the scheduler already runs max_workers
** tasks, the new one waits (FIFO) and starts as a worker frees up. Returns
** 0 and stores the handle in *out (may be NULL), or UMS_ESHUTDOWN,
** UMS_EINVAL (bad scheduler index), UMS_ENOMEM. */
UMS_API int ums_task_spawn(ums_runtime_t *rt, const ums_spawn_opts_t *opts,
                           ums_task_fn fn, void *arg, ums_task_t *out);

/* Waits until the task ends, then stores its result (the return value of
** fn, or what ums_exit passed) and its status (0; UMS_ECANCELED if it was
** cancelled before it started; or what ums_exit passed), and releases the
** handle. May park. Returns 0, UMS_ETIMEDOUT (the task keeps running and
** stays joinable), UMS_ECANCELED (the caller was cancelled), UMS_ESRCH
** (no such task: already joined, detached or recycled), UMS_EBUSY
** (somebody else is joining it), UMS_EDEADLK (joining oneself). result and
** status may be NULL. */
UMS_API int ums_task_join(ums_runtime_t *rt, ums_task_t t, int64_t deadline,
                          void **result, int *status);

/* Gives up the right to join; the task is released when it ends. */
UMS_API int ums_task_detach(ums_runtime_t *rt, ums_task_t t);

/* Requests cancellation. The task sees UMS_ECANCELED at its next wait point
** (at once if it is waiting now, in which case it is unlinked from what it
** waited on), and every wait that would park it after that fails the same
** way. A task that has not started never runs. Callable from any thread. Returns 0 or
** UMS_ESRCH (no such task, or it finished and its handle was joined or
** detached). Cancelling a finished, still joinable task is harmless. */
UMS_API int ums_task_cancel(ums_runtime_t *rt, ums_task_t t);

/* The calling task's handle; 0 outside a task. */
UMS_API ums_task_t ums_self(void);
/* The runtime of the calling task; NULL outside a task. */
UMS_API ums_runtime_t *ums_current_runtime(void);
/* The index of the scheduler running the calling task; -1 outside one. */
UMS_API int ums_current_sched(void);
/* Nonzero when the calling task has been cancelled. */
UMS_API int ums_cancelled(void);

/* Lets other runnable tasks run; the caller stays runnable. Returns 0 or
** UMS_ECANCELED. Outside a task: sched_yield(), returns 0. */
UMS_API int ums_yield(void);
/* Parks the caller for ns nanoseconds (from a fresh clock reading); ns <= 0
** is ums_yield(). A task whose timer comes due while others run goes ahead
** of the run queue; one due already when it parks (a sleep shorter than a
** task switch) goes to its back, as a yield does. Returns 0 or
** UMS_ECANCELED. Outside a task, sleeps the
** thread (there, ums_sleep_until(UMS_FOREVER) is refused with UMS_EINVAL:
** nothing could ever wake it). */
UMS_API int ums_sleep(int64_t ns);
UMS_API int ums_sleep_until(int64_t deadline);
/* Parks the calling task until its scheduler is idle: no other task is
** runnable and no file I/O or preemptive call of its tasks is in flight
** (tasks waiting for a timer count as blocked). With a virtual clock this
** is "run until idle": it returns before the clock moves. Returns 0,
** UMS_ETIMEDOUT, UMS_ECANCELED, or UMS_EPERM outside a task. Several
** tasks may wait; they all wake at the same idle moment. */
UMS_API int ums_wait_idle(int64_t deadline);
/* Ends the calling task now with this result and status; never returns.
** The fiber's stack is abandoned, so only call it where nothing on the
** stack needs cleaning up. Aborts the process outside a C task. */
UMS_API void ums_exit(void *result, int status) __attribute__((noreturn));

/* ====================================================================== */
/* Step tasks and parking (for language bindings)                          */
/* ====================================================================== */
/*
** A step task has no stack of its own. The scheduler calls step(arg) on
** whichever worker runs its pass, and the return value says what the task
** does next. The Lua binding runs each coroutine this way, so a parked
** coroutine costs its Lua thread, not a C stack.
**
** Inside a step, the blocking calls of this header still work: they bind
** the worker to the task until the wait ends, and another worker takes
** over the scheduler (docs/design/architecture.md, "Tasks, workers and
** the cooperative rule"). That is the path for waits
** where the step cannot return (Lua inside a C call).
*/

enum {
  UMS_STEP_DONE = 0,   /* the task has ended */
  UMS_STEP_YIELD = 1,  /* runnable again at once, after the others */
  UMS_STEP_PARK = 2    /* parked by ums_park_begin; stepped again once the
                          park ends */
};

typedef int (*ums_step_fn)(void *arg);

/* Like ums_task_spawn, for a step task. The result is stored by
** ums_step_set_result before the step returns UMS_STEP_DONE. Unlike a C
** task, a step task cancelled before it started is still stepped once (if
** need be past max_workers), with ums_cancelled() true, so that its
** binding can release what it holds for it; it should end at once. */
UMS_API int ums_task_spawn_step(ums_runtime_t *rt,
                                const ums_spawn_opts_t *opts,
                                ums_step_fn step, void *arg,
                                ums_task_t *out);
/* Sets the calling task's result and status, reported to its joiner. */
UMS_API void ums_step_set_result(void *result, int status);
/* In a step: 0, or why the runtime cannot run the task any further
** (UMS_ENOMEM: no worker, worker stack or timer could be had for it). Such
** a task, started or not, is stepped once more on a stack that is not its
** own, so that its binding can release what it holds for it: the step
** must end the task at once (UMS_STEP_DONE, no park begun). Every wait
** and ums_yield fail with that error meanwhile. The joiner sees the
** error as the task's status, whatever the step set. */
UMS_API int ums_step_error(void);

/* A park: the building block for waits implemented outside the runtime.
** ums_park_begin starts a park of the calling task and fills a token that
** another party (any thread) passes to ums_unpark to end it. Exactly one
** of ums_unpark, the deadline (UMS_ETIMEDOUT) and a cancellation
** (UMS_ECANCELED) ends each park. Then either
**   - a step returns UMS_STEP_PARK: the task is stepped again once the
**     park has ended, and ums_park_result() gives the outcome; or
**   - ums_park_wait() blocks the calling worker until it ends (C tasks, or
**     a step that cannot return now), returning the outcome.
** ums_park_begin fails with UMS_ECANCELED when the task was cancelled, and
** with UMS_EPERM outside a task. Outcomes given to ums_unpark must be >= 0
** (the UMS_E* codes are the runtime's). */
typedef struct ums_park_token {
  uint64_t task;   /* the parked task's handle */
  uint64_t seq;    /* which of its parks */
} ums_park_token_t;

UMS_API int ums_park_begin(int64_t deadline, ums_park_token_t *token);
/* The same with flags: UMS_PARK_NOCANCEL makes a park that cancellation
** does not end (it still ends by unpark or deadline), and that a task
** already cancelled may begin: for waits that must complete, such as a
** condition variable's re-lock of its mutex. In a deadlock that the
** handler's cancels do not resolve, the detector ends it with
** UMS_EDEADLK (see "Deadlocks"). */
#define UMS_PARK_NOCANCEL 1
UMS_API int ums_park_begin_ex(int64_t deadline, int flags,
                              ums_park_token_t *token);
/* The same, saying what the task waits for, for ums_runtime_tasks and the
** wait statistics (see "Observability"): type is a UMS_WAIT_* value,
** object the address of what it waits on (an identity, never
** dereferenced; may be NULL) and blocker the task that holds it, if
** known (0: none). ums_park_begin and _ex describe their parks as
** UMS_WAIT_PARK. UMS_EINVAL for a type out of range. */
UMS_API int ums_park_begin_wait(int64_t deadline, int flags, int type,
                                const void *object, ums_task_t blocker,
                                ums_park_token_t *token);
UMS_API int ums_park_wait(void);
/* The outcome of the calling task's last park. */
UMS_API int ums_park_result(void);
/* Begins a park (as ums_park_begin) that the task's scheduler ends with
** outcome 0 once it is idle (see ums_wait_idle): the step-task form of
** ums_wait_idle. Also UMS_ENOMEM. */
UMS_API int ums_park_begin_idle(int64_t deadline, ums_park_token_t *token);
/* Ends the park with outcome. Returns 0, or UMS_ESRCH when that park has
** already ended (or the task is gone), UMS_EINVAL for a negative outcome,
** UMS_EPERM for the token of a local park (UMS_PARK_LOCAL, a binding's
** flag: ums-binding.h) from any thread but its task's scheduler's. Callable from any thread. */
UMS_API int ums_unpark(ums_runtime_t *rt, ums_park_token_t token,
                       int outcome);

/* ====================================================================== */
/* Synchronisation                                                          */
/* ====================================================================== */
/*
** All primitives work across schedulers and from host threads. Each has
** its own FIFO wait queue; a wait ends with exactly one of "granted",
** "timed out" (UMS_ETIMEDOUT) and "cancelled" (UMS_ECANCELED). Objects are
** created with _new and freed with _delete; deleting an object that still
** has waiters is a programming error (UMS_EBUSY, nothing freed).
*/

typedef struct ums_mutex ums_mutex_t;
typedef struct ums_sem ums_sem_t;
typedef struct ums_event ums_event_t;
typedef struct ums_cond ums_cond_t;
typedef struct ums_chan ums_chan_t;

/* Mutex: FIFO, not recursive, ownership handed directly to the next
** waiter on unlock (no barging, so no waiter starves). */
UMS_API ums_mutex_t *ums_mutex_new(void);
UMS_API int ums_mutex_delete(ums_mutex_t *m);
UMS_API int ums_mutex_lock(ums_mutex_t *m, int64_t deadline);
UMS_API int ums_mutex_trylock(ums_mutex_t *m);  /* 0 or UMS_EBUSY */
UMS_API int ums_mutex_unlock(ums_mutex_t *m);   /* UMS_EPERM: not owner */
/* 1 while someone (a task or a host thread) holds m, else 0. */
UMS_API int ums_mutex_is_locked(ums_mutex_t *m);

/* Counting semaphore. */
UMS_API ums_sem_t *ums_sem_new(int64_t initial);
UMS_API int ums_sem_delete(ums_sem_t *s);
UMS_API int ums_sem_acquire(ums_sem_t *s, int64_t deadline);
UMS_API int ums_sem_tryacquire(ums_sem_t *s);   /* 0 or UMS_EAGAIN */
UMS_API int ums_sem_release(ums_sem_t *s, int64_t n);
UMS_API int64_t ums_sem_value(ums_sem_t *s);

/* Event: manual reset (set wakes every waiter and stays set until reset)
** or auto reset (set wakes one waiter, or stays set until one waiter
** consumes it). */
UMS_API ums_event_t *ums_event_new(int manual_reset, int initially_set);
UMS_API int ums_event_delete(ums_event_t *e);
UMS_API int ums_event_set(ums_event_t *e);
UMS_API int ums_event_reset(ums_event_t *e);
UMS_API int ums_event_wait(ums_event_t *e, int64_t deadline);
UMS_API int ums_event_is_set(ums_event_t *e);

/* Condition variable over a ums mutex. ums_cond_wait returns with the
** mutex held again, also on timeout and cancellation: taking it back is a
** wait that cancellation does not end. One exception: UMS_EDEADLK, when
** the deadlock detector found that nothing could ever hand the mutex
** back (its holder ended, or waits for this task; see "Deadlocks"): the
** caller does not hold the mutex then. */
UMS_API ums_cond_t *ums_cond_new(void);
UMS_API int ums_cond_delete(ums_cond_t *c);
UMS_API int ums_cond_wait(ums_cond_t *c, ums_mutex_t *m, int64_t deadline);
UMS_API int ums_cond_signal(ums_cond_t *c);
UMS_API int ums_cond_broadcast(ums_cond_t *c);

/* Park-based forms, for step tasks (and any task that would rather not
** block its worker): the same waits, in two halves around a park (see
** "Step tasks and parking"). _begin returns 0 when the object was taken
** at once (no park begun: the wait is over, successfully), 1 when a park
** of the calling task was begun on the object's queue, or an error with
** no park begun: those of the blocking form, UMS_ETIMEDOUT at once when
** the object is not available and the deadline has passed (a poll; a cond
** wait, which always lets the mutex go, parks and times out instead),
** UMS_EBUSY when the task has a park begun already, UMS_EPERM outside a
** task. After a 1, the task ends the park as any other (its step returns
** UMS_STEP_PARK and is stepped again once the park has ended, or it calls
** ums_park_wait()) and then calls _end, which gives the outcome of the
** wait as the blocking form would have returned it: 0 (the mutex is the
** task's, the unit or the event's signal was handed to it), UMS_ETIMEDOUT
** or UMS_ECANCELED; UMS_EBUSY while the park goes on, UMS_EINVAL when the
** task's last park was not that wait. Between the halves, the object
** counts the task among its waiters exactly as a blocked one: granters
** hand it the mutex or the unit in FIFO order. The park's token is not
** for ums_unpark (UMS_EPERM): only the object, the deadline and a cancel
** end it.
**
** ums_cond_wait_end may return 1: the wait has ended, and a park to take
** the mutex back was begun (one that cancellation does not end); end it
** like the first, then call ums_cond_wait_end again, which returns the
** wait's outcome with the mutex held (or UMS_EDEADLK, as ums_cond_wait). */
UMS_API int ums_mutex_lock_begin(ums_mutex_t *m, int64_t deadline);
UMS_API int ums_mutex_lock_end(ums_mutex_t *m);
UMS_API int ums_sem_acquire_begin(ums_sem_t *s, int64_t deadline);
UMS_API int ums_sem_acquire_end(ums_sem_t *s);
UMS_API int ums_event_wait_begin(ums_event_t *e, int64_t deadline);
UMS_API int ums_event_wait_end(ums_event_t *e);
UMS_API int ums_cond_wait_begin(ums_cond_t *c, ums_mutex_t *m,
                                int64_t deadline);
UMS_API int ums_cond_wait_end(ums_cond_t *c, ums_mutex_t *m);

/* Channel of fixed-size elements. capacity 0 is unbuffered (a send
** completes when a receiver takes the value). After close, sends fail with
** UMS_ECLOSED, receives drain the buffer and then fail with UMS_ECLOSED.
** Values are copied (elem_size bytes) from/to the caller's memory. Send
** and receive take no lock while a buffered channel has room or a value,
** or while an unbuffered channel's receiver on another scheduler is
** spinning for a sender; a woken waiter looks again, so a parked sender's
** value enters the buffer when it runs. A party that received a value or
** saw the close may delete the channel at once. */
UMS_API ums_chan_t *ums_chan_new(size_t elem_size, size_t capacity);
/* Elements that cannot move with memcpy (they point into themselves):
** move(dst, src) moves src's element into dst (src is then forgotten, not
** cleared); clear(e) releases an element still in the channel at delete.
** Either may be NULL (memcpy; nothing to release). A send moves the
** caller's element into the channel only when it succeeds. */
typedef struct ums_chan_ops {
  void (*move)(void *dst, void *src);
  void (*clear)(void *elem);
} ums_chan_ops_t;
UMS_API ums_chan_t *ums_chan_new_ex(size_t elem_size, size_t capacity,
                                    const ums_chan_ops_t *ops);
UMS_API int ums_chan_delete(ums_chan_t *ch);
UMS_API int ums_chan_send(ums_chan_t *ch, const void *elem, int64_t deadline);
UMS_API int ums_chan_recv(ums_chan_t *ch, void *elem, int64_t deadline);
UMS_API int ums_chan_try_send(ums_chan_t *ch, const void *elem); /* EAGAIN */
UMS_API int ums_chan_try_recv(ums_chan_t *ch, void *elem);       /* EAGAIN */
UMS_API int ums_chan_close(ums_chan_t *ch);
UMS_API int ums_chan_closed(ums_chan_t *ch);  /* 1 once closed */
/* Park-based forms, for step tasks (and C tasks): _begin does what the
** blocking call does, but where that call would wait it begins the
** task's park on the channel's queue and returns 1; the task then parks
** (its step returns UMS_STEP_PARK, or ums_park_wait()) and, once the park
** has ended, calls _end with the same arguments, which returns what the
** blocking call would have, or 1 when it began another park (a woken
** party of a buffered channel looks again and may find the room or the
** value taken). Each park ends with exactly one of the channel's wake-up,
** the deadline and a cancel; token (may be NULL) is the park's, which
** ums_unpark refuses from anyone but the task itself. While a task is
** parked on an unbuffered channel the other side moves its element in or
** out, so elem must stay valid and untouched until the operation ends; a
** buffered channel touches elem only inside the calls. */
UMS_API int ums_chan_send_begin(ums_chan_t *ch, void *elem, int64_t deadline,
                                ums_park_token_t *token);
UMS_API int ums_chan_send_end(ums_chan_t *ch, void *elem, int64_t deadline,
                              ums_park_token_t *token);
UMS_API int ums_chan_recv_begin(ums_chan_t *ch, void *elem, int64_t deadline,
                                ums_park_token_t *token);
UMS_API int ums_chan_recv_end(ums_chan_t *ch, void *elem, int64_t deadline,
                              ums_park_token_t *token);
UMS_API size_t ums_chan_len(ums_chan_t *ch);
UMS_API size_t ums_chan_cap(ums_chan_t *ch);

/* ====================================================================== */
/* File I/O                                                                */
/* ====================================================================== */
/*
** Each call parks only the calling task while the kernel works; the
** task's scheduler keeps running its other tasks. With the io_uring backend
** every scheduler owns a ring: requests become submission entries, sent in
** one batch per scheduler pass, and completions are reaped at every pass
** without a system call when there are none. With the pool backend (or for
** an operation the ring does not support, such as listing a directory) a
** pool of OS threads makes the plain system call and hands the task back
** through its scheduler's completion list. Both give the same results.
** docs/design/io.md describes the design.
**
** Results are the kernel's: >= 0 on success, a negative errno value
** (UMS_ENOENT, UMS_EBADF, UMS_EISDIR, ...) on failure. Every call takes an
** absolute deadline (UMS_FOREVER: none) and returns UMS_ETIMEDOUT when it
** passes, or UMS_ECANCELED when the task is cancelled, like every other
** wait; the request then goes on without the caller (see "Ownership").
** When the operation completed before the task could notice the timeout,
** its real result is returned instead.
**
** Outside a task (a host thread), each call makes the system call on the
** calling thread and blocks it; the deadline is not applied there.
**
** Ownership. A request may still be running in the kernel or on a pool
** thread after its caller gave up (timeout or cancel), so nothing the
** request touches may belong to the caller's stack or be freed by it:
**   - Paths, flags and small structs are copied into the request when the
**     call starts; the caller's copies may go away as soon as it returns.
**   - Data goes through ums_buf_t buffers, owned by reference count. A
**     request holds a reference on every buffer it reads into or writes
**     from until it really ends; ums_buf_release after a timeout only
**     drops the caller's reference, and the request's completion frees
**     the buffer. The bytes of a read that timed out are unspecified.
**   - Results (a stat struct, a directory list, an fd) are copied to the
**     caller only when the call returns them. A descriptor opened by a
**     request whose caller gave up is closed by the runtime; a directory
**     list is freed by it.
**   - A timed-out or cancelled io_uring request is also cancelled in the
**     kernel (IORING_OP_ASYNC_CANCEL, best effort), and a pool request is
**     interrupted with a signal, repeated every millisecond until it has
**     ended (best effort only if the application owns SIGRTMIN+5);
**     ums_runtime_shutdown waits
**     for every request to end before it frees rings and buffers.
*/

/* A reference-counted I/O buffer. Its data starts on a page boundary (the
** kernel copies into a page-aligned buffer several times faster than into
** one that starts a few bytes into a page) and is at least `size` bytes.
** Buffers freed inside a task go to a small per-scheduler cache by size
** class, so a loop that takes and releases a buffer per read does not
** allocate. Callable from any thread; a buffer is not tied to a runtime.
** The reference count is atomic; the data is not synchronised: do not
** write into a buffer while a request reads from it, or read it while a
** request fills it. */
typedef struct ums_buf ums_buf_t;

/* A new buffer with one reference (the caller's); NULL when out of memory
** or size is 0. */
UMS_API ums_buf_t *ums_buf_new(size_t size);
/* Takes one more reference. */
UMS_API void ums_buf_retain(ums_buf_t *b);
/* Drops one reference; the last one frees the buffer (or caches it). NULL
** is ignored. */
UMS_API void ums_buf_release(ums_buf_t *b);
UMS_API void *ums_buf_data(const ums_buf_t *b);
/* The usable size asked for in ums_buf_new. */
UMS_API size_t ums_buf_size(const ums_buf_t *b);

/* File offsets for read and write: >= 0 is an absolute position (pread and
** pwrite semantics: the file position does not move); UMS_FS_CUR uses and
** advances the file position (read and write semantics, for pipes and
** other streams). Any other negative offset is UMS_EINVAL. */
#define UMS_FS_CUR (-1)

/* Largest transfer of one call; longer ones are short, as read(2)'s. */
#define UMS_FS_MAX_RW ((size_t)0x7ffff000)

/* Opens path with open(2) flags (O_CLOEXEC is always added) and mode.
** Returns the descriptor or a negative error. */
UMS_API int ums_fs_open(const char *path, int flags, int mode,
                        int64_t deadline);
/* Closes fd. After a timeout or cancel the descriptor is closed (or being
** closed) all the same: do not use it again. */
UMS_API int ums_fs_close(int fd, int64_t deadline);

/* Reads up to len bytes at offset into buf's data at [pos, pos + len).
** Returns the bytes read (0 at end of file) or a negative error;
** UMS_EINVAL when buf is NULL or the range does not fit in buf. */
UMS_API int64_t ums_fs_read(int fd, ums_buf_t *buf, size_t pos, size_t len,
                            int64_t offset, int64_t deadline);
/* Writes len bytes of buf's data at [pos, pos + len) at offset. Returns
** the bytes written or a negative error. Fewer bytes than len means the
** write stopped short (ENOSPC, EFBIG past RLIMIT_FSIZE): what was
** returned is in the file, and a write of the rest (at offset + count,
** or at UMS_FS_CUR, which the short write moved by count) returns the
** error. On io_uring a write at UMS_FS_CUR to a file that can seek (and
** is not in append mode) is made with write(2) on the I/O pool: io_uring
** would leave the file position unchanged after a short write. A caller
** that keeps its own position and passes offsets stays on the ring. */
UMS_API int64_t ums_fs_write(int fd, ums_buf_t *buf, size_t pos, size_t len,
                             int64_t offset, int64_t deadline);

/* Scatter/gather: each element is a range of a buffer. The array is
** copied; at most UMS_FS_IOV_MAX elements. */
typedef struct ums_iov {
  ums_buf_t *buf;
  size_t pos;
  size_t len;
} ums_iov_t;
#define UMS_FS_IOV_MAX 1024
UMS_API int64_t ums_fs_readv(int fd, const ums_iov_t *iov, int iovcnt,
                             int64_t offset, int64_t deadline);
UMS_API int64_t ums_fs_writev(int fd, const ums_iov_t *iov, int iovcnt,
                              int64_t offset, int64_t deadline);

/* fsync(2); with UMS_FS_DATASYNC, fdatasync(2). */
#define UMS_FS_DATASYNC 1
UMS_API int ums_fs_fsync(int fd, int flags, int64_t deadline);

/* What stat returns (from statx(2)). Times are nanoseconds since the
** epoch. btime is 0 when the filesystem does not record it. */
typedef struct ums_stat {
  uint64_t dev;       /* device of the filesystem (makedev(major, minor)) */
  uint64_t ino;
  uint32_t mode;      /* type and permission bits, as st_mode */
  uint32_t nlink;
  uint32_t uid, gid;
  uint64_t rdev;      /* device, for device files */
  uint64_t size;      /* bytes */
  uint64_t blocks;    /* 512-byte blocks allocated */
  uint32_t blksize;   /* preferred I/O size */
  int64_t atime, mtime, ctime, btime;
} ums_stat_t;

/* Stats path, following a final symbolic link unless flags has
** UMS_FS_NOFOLLOW (lstat). *out is written only on success. */
#define UMS_FS_NOFOLLOW 1
UMS_API int ums_fs_stat(const char *path, int flags, ums_stat_t *out,
                        int64_t deadline);
UMS_API int ums_fs_fstat(int fd, ums_stat_t *out, int64_t deadline);

UMS_API int ums_fs_unlink(const char *path, int64_t deadline);
UMS_API int ums_fs_rmdir(const char *path, int64_t deadline);
UMS_API int ums_fs_rename(const char *from, const char *to,
                          int64_t deadline);
UMS_API int ums_fs_mkdir(const char *path, int mode, int64_t deadline);

/* A directory listing: every entry but "." and "..", in the order the
** filesystem returns them. One allocation holds the list, the entries and
** the names; free it with ums_dirlist_free. */
typedef struct ums_dirent {
  const char *name;
  int type;           /* d_type: DT_REG, DT_DIR, DT_LNK, ...; DT_UNKNOWN
                         when the filesystem does not say */
  uint64_t ino;
} ums_dirent_t;
typedef struct ums_dirlist {
  size_t count;
  ums_dirent_t *entries;
} ums_dirlist_t;

/* Lists the directory at path. On success stores a list the caller owns
** in *out and returns 0; otherwise *out is untouched. (io_uring has no
** directory operation: this always runs on the pool.) */
UMS_API int ums_fs_readdir(const char *path, ums_dirlist_t **out,
                           int64_t deadline);
UMS_API void ums_dirlist_free(ums_dirlist_t *list);

/* Reads a whole file in one request: opens path for reading, reads it
** from its start into buf's data at [0, size), and closes it. With
** io_uring the scheduler's pass drives the steps (the open; then the
** read, a read that finds the end and the close, linked in the kernel):
** the task parks once, where open, read and close would park three or
** four times. Returns:
**   >= 0          the file's length: the whole file is in buf;
**   UMS_EFBIG     the file holds more than buf's size (or grew while it
**                 was read, or, on io_uring, a read came back short
**                 before the end); nothing is returned, the file is
**                 closed: read it with ums_fs_open and ums_fs_read;
**   UMS_ESPIPE    not a regular file (a FIFO, a terminal, a device):
**                 nothing was read from it, and it is left open for the
**                 caller, its descriptor in *fd (the caller closes it),
**                 so a stream loses nothing;
**   another negative error, of the open or a read (the file is closed).
** *fd is written only with UMS_ESPIPE; fd may be NULL, and the file is
** then closed. Ownership, timeouts and cancellation are those of every
** call (a descriptor left to a caller who gave up is closed by the
** runtime); only the open can block for long (a FIFO without a writer)
** and only it is cancelled in the kernel. A read that comes back short
** before the end of a regular file (Linux's do not) reads as the end. */
UMS_API int64_t ums_fs_readfile(const char *path, ums_buf_t *buf, int *fd,
                                int64_t deadline);

/* Deferred form: each call above in two halves, for step tasks that must
** not block their worker while the kernel works (a language binding
** yields its coroutine in between, as with ums_preempt_begin).
**
** A _begin call begins a park of the calling task (ums_park_begin, with
** the call's deadline), starts the request and returns at once, storing
** it in *req. The caller then ends that park like any other (its step
** returns UMS_STEP_PARK, or it calls ums_park_wait) and, once the park
** has ended, ends the request with exactly one end call: ums_fs_end, or
** ums_fs_stat_end / ums_fs_readdir_end to take a stat or a directory list
** as well. The end call returns what the blocking call would have
** returned (its real result when the operation completed, also past the
** deadline; UMS_ETIMEDOUT or UMS_ECANCELED when the park ended first, the
** request then going on without the caller as described under
** "Ownership") and frees the caller's part of the request. The task must
** not begin another park between the two halves.
**
** _begin fails, starting nothing and leaving *req untouched, with the
** blocking call's argument errors (UMS_EINVAL, UMS_EBADF), UMS_EPERM
** outside a task (a host thread calls the blocking form), UMS_EBUSY when
** the task has a park begun already, UMS_ECANCELED when the task was
** cancelled, UMS_ENOMEM. Like ums_fs_close, ums_fs_close_begin in a
** cancelled task closes fd at once and returns UMS_ECANCELED.
**
** Ownership is that of the blocking calls: arguments are copied by
** _begin, and a buffer is referenced by the request until the operation
** really ends, so the caller may release its own reference at any time;
** it must not look at the data before the end call has returned a
** success. An end call that cannot end the request yet leaves it alone
** and says why: UMS_EBUSY while its park has not ended (end the park,
** then call again), UMS_EPERM from another task than the one that began
** it, UMS_EINVAL for NULL or (ums_fs_stat_end, ums_fs_readdir_end) a
** request of another kind. */
typedef struct ums_fs_req ums_fs_req_t;

UMS_API int ums_fs_open_begin(const char *path, int flags, int mode,
                              int64_t deadline, ums_fs_req_t **req);
UMS_API int ums_fs_close_begin(int fd, int64_t deadline, ums_fs_req_t **req);
UMS_API int ums_fs_read_begin(int fd, ums_buf_t *buf, size_t pos, size_t len,
                              int64_t offset, int64_t deadline,
                              ums_fs_req_t **req);
UMS_API int ums_fs_write_begin(int fd, ums_buf_t *buf, size_t pos,
                               size_t len, int64_t offset, int64_t deadline,
                               ums_fs_req_t **req);
UMS_API int ums_fs_readv_begin(int fd, const ums_iov_t *iov, int iovcnt,
                               int64_t offset, int64_t deadline,
                               ums_fs_req_t **req);
UMS_API int ums_fs_writev_begin(int fd, const ums_iov_t *iov, int iovcnt,
                                int64_t offset, int64_t deadline,
                                ums_fs_req_t **req);
UMS_API int ums_fs_fsync_begin(int fd, int flags, int64_t deadline,
                               ums_fs_req_t **req);
UMS_API int ums_fs_stat_begin(const char *path, int flags, int64_t deadline,
                              ums_fs_req_t **req);
UMS_API int ums_fs_fstat_begin(int fd, int64_t deadline, ums_fs_req_t **req);
UMS_API int ums_fs_unlink_begin(const char *path, int64_t deadline,
                                ums_fs_req_t **req);
UMS_API int ums_fs_rmdir_begin(const char *path, int64_t deadline,
                               ums_fs_req_t **req);
UMS_API int ums_fs_rename_begin(const char *from, const char *to,
                                int64_t deadline, ums_fs_req_t **req);
UMS_API int ums_fs_mkdir_begin(const char *path, int mode, int64_t deadline,
                               ums_fs_req_t **req);
UMS_API int ums_fs_readdir_begin(const char *path, int64_t deadline,
                                 ums_fs_req_t **req);
UMS_API int ums_fs_readfile_begin(const char *path, ums_buf_t *buf,
                                  int64_t deadline, ums_fs_req_t **req);

/* Ends any request: its result (for stat and readdir requests, 0 or the
** error; the stat or the list is dropped). */
UMS_API int64_t ums_fs_end(ums_fs_req_t *req);
/* Ends a stat or fstat request; *out is written only when the result is
** 0. */
UMS_API int ums_fs_stat_end(ums_fs_req_t *req, ums_stat_t *out);
/* Ends a readdir request; on 0 the caller owns the list stored in *out
** (ums_dirlist_free), otherwise *out is untouched. */
UMS_API int ums_fs_readdir_end(ums_fs_req_t *req, ums_dirlist_t **out);
/* Ends a readfile request, as ums_fs_readfile returns (fd as there;
** ums_fs_end closes a descriptor left to the caller). UMS_EINVAL for a
** request of another kind. */
UMS_API int64_t ums_fs_readfile_end(ums_fs_req_t *req, int *fd);

/* ====================================================================== */
/* Sockets                                                                 */
/* ====================================================================== */
/*
** Sockets are I/O requests like files: the same request, deadline,
** cancellation, ownership and deferred form as "File I/O" above, and the
** kernel's results (-errno: UMS_ECONNREFUSED, ECONNRESET, EPIPE, ...
** pass through; ums_strerror names them). TCP and UDP over IPv4 and IPv6,
** Unix stream and datagram sockets; addresses are the C library's
** (struct sockaddr_in, sockaddr_in6, sockaddr_un).
**
** Backends (docs/design/io.md, "Network"). With io_uring a call is the
** kernel's socket operation on the scheduler's ring (IORING_OP_ACCEPT,
** CONNECT, RECV, SEND, RECVMSG, SENDMSG, POLL_ADD); a timed-out or
** cancelled one is cancelled in the kernel. Without io_uring sockets are
** non-blocking: a call makes its system call at once, and when the socket
** is not ready its task waits in the scheduler's epoll set, which the
** scheduler waits on when idle: no thread per blocked socket, a waiting
** task costs its park. Outside a task (a host thread) each call blocks its
** thread, waiting with poll(2) up to the deadline (UMS_ETIMEDOUT).
**
** Descriptors made here (ums_net_socket, ums_net_accept) are
** non-blocking and close-on-exec. Sends never raise SIGPIPE
** (MSG_NOSIGNAL): a send to a peer that has gone returns UMS_EPIPE. A
** system call interrupted by a signal is restarted (no UMS_EINTR).
**
** Buffers: a receive fills, and a send reads, buf's data at [pos, pos +
** len), held by reference until the operation has really ended, as for
** files: after a timeout or a cancel the caller may release its
** reference, and must not read what a timed-out receive left in it. A
** timed-out send may have sent part of the data: a stream socket's
** position in the stream is then unknown (close it). A timed-out connect
** leaves the socket unusable (close it), as connect(2) does.
**
** One operation of each direction at a time per socket is the usual use
** (a reader and a writer task may share one); several receives on one
** stream socket at once get the data in an unspecified split.
*/

/* The calls that never wait, made on the calling thread: 0 (or the
** descriptor) or -errno. ums_net_socket adds SOCK_NONBLOCK and
** SOCK_CLOEXEC to type. */
UMS_API int ums_net_socket(int domain, int type, int protocol);
UMS_API int ums_net_bind(int fd, const struct sockaddr *addr, socklen_t len);
UMS_API int ums_net_listen(int fd, int backlog);
/* how: SHUT_RD, SHUT_WR, SHUT_RDWR. A half-closed stream still receives. */
UMS_API int ums_net_shutdown(int fd, int how);
UMS_API int ums_net_getsockopt(int fd, int level, int name, void *val,
                               socklen_t *len);
UMS_API int ums_net_setsockopt(int fd, int level, int name, const void *val,
                               socklen_t len);
UMS_API int ums_net_getsockname(int fd, struct sockaddr *addr,
                                socklen_t *len);
UMS_API int ums_net_getpeername(int fd, struct sockaddr *addr,
                                socklen_t *len);

/* Closes fd as ums_fs_close does. Requests of the calling task's
** scheduler still waiting for fd's readiness (the epoll backend) end with
** UMS_EBADF first. End or cancel other tasks' operations on fd before
** closing it: an operation the kernel is running (io_uring) keeps the
** socket open until it ends. */
UMS_API int ums_net_close(int fd, int64_t deadline);

/* Ends the operations on fd that tasks of the calling task's scheduler
** wait on (receives, sends, accepts, connects, ums_wait_fd), each with
** UMS_EBADF, without closing fd: for a close from another task than the
** ones using the socket. Returns 0 at once (UMS_EBADF for a negative fd,
** UMS_EPERM outside a task); each waiting task resumes once the kernel
** has let go of its operation (io_uring: when the cancelled request's
** completion comes; epoll: at once). Close fd only after those tasks
** have resumed (join them, or wait for them to give the socket back):
** until then the kernel may still use the descriptor. An operation that
** completed first keeps its result; one begun after the call is not
** ended. Other schedulers' operations on fd are not ended. */
UMS_API int ums_net_cancel(int fd);

/* Waits for a connection on the listening socket fd and returns its
** descriptor (non-blocking, close-on-exec). When addr is not NULL the
** peer's address is copied there, at most *len bytes, and *len is set to
** its length (accept(2)'s convention). A connection accepted for a caller
** who gave up is closed by the runtime. UMS_EMFILE (here the process's
** descriptor limit, although ums_strerror words it for tasks) and
** UMS_ENFILE are returned, never retried by the runtime, and leave the
** connection in the listener's queue: wait (or free descriptors) before
** accepting again, or the caller's loop spins. */
UMS_API int ums_net_accept(int fd, struct sockaddr *addr, socklen_t *len,
                           int64_t deadline);
/* Connects fd to addr (copied). Returns 0 or -errno (UMS_ECONNREFUSED,
** UMS_ETIMEDOUT for the deadline, ...). A Unix stream listener whose
** backlog is full makes connect(2) on a non-blocking socket fail with
** EAGAIN, and nothing signals when to try again: ums_net_connect then
** sleeps (0.5 ms, doubling up to 16 ms) and tries again until the
** deadline, as a blocking connect would wait; ums_net_connect_begin
** returns that UMS_EAGAIN to its caller. */
UMS_API int ums_net_connect(int fd, const struct sockaddr *addr,
                            socklen_t len, int64_t deadline);
/* Receives up to len bytes into buf's data at [pos, pos + len); returns
** the count, 0 at the end of a stream (the peer shut its side down), or
** -errno (UMS_ECONNRESET when the peer reset the connection). flags:
** recv(2)'s (MSG_PEEK, MSG_WAITALL, ...). */
UMS_API int64_t ums_net_recv(int fd, ums_buf_t *buf, size_t pos, size_t len,
                             int flags, int64_t deadline);
/* A receive that holds no buffer while it waits, for connections that
** spend most of their life waiting for their peer: receives up to len
** bytes (len > 0) into a new buffer the runtime takes (ums_buf_new(len),
** from the scheduler's cache) only once data is there, and hands it to
** the caller in *buf (one reference, the caller's; its data starts with
** the bytes received). Up to 4 KiB received with a len above that come
** in a buffer of 4 KiB (ums_buf_size says so), so that many connections
** holding a short message each hold no big buffer. Returns what
** ums_net_recv would; *buf is set only for a count > 0, else NULL. */
UMS_API int64_t ums_net_recv_take(int fd, size_t len, int flags,
                                  int64_t deadline, ums_buf_t **buf);
/* Sends up to len bytes of buf's data at [pos, pos + len); returns the
** count, which may be less than len on a stream socket (send the rest
** with another call), or -errno (UMS_EPIPE, UMS_ECONNRESET). */
UMS_API int64_t ums_net_send(int fd, ums_buf_t *buf, size_t pos, size_t len,
                             int flags, int64_t deadline);
/* Datagrams: recvfrom copies the sender's address as ums_net_accept
** does; sendto sends to addr (copied; NULL: a connected socket's peer). A
** datagram longer than len is truncated (MSG_TRUNC in flags returns its
** real length). */
UMS_API int64_t ums_net_recvfrom(int fd, ums_buf_t *buf, size_t pos,
                                 size_t len, int flags, struct sockaddr *addr,
                                 socklen_t *alen, int64_t deadline);
UMS_API int64_t ums_net_sendto(int fd, ums_buf_t *buf, size_t pos, size_t len,
                               int flags, const struct sockaddr *addr,
                               socklen_t alen, int64_t deadline);

/* Readiness of a descriptor the caller owns (a C library's socket, a
** pipe, an eventfd), for C modules and hosts whose library does its own
** I/O: parks the calling task until fd is ready for events (POLLIN,
** POLLOUT, POLLPRI from <poll.h>) and returns poll(2)'s revents (> 0;
** POLLHUP and POLLERR are reported whatever events says), or
** UMS_ETIMEDOUT, UMS_ECANCELED, UMS_EBADF, UMS_EINVAL (no event asked
** for). Uses the sockets' machinery: IORING_OP_POLL_ADD on io_uring (a
** give-up removes it from the kernel), the scheduler's epoll set
** otherwise. The descriptor is not changed (its O_NONBLOCK stays the
** caller's) and must stay open until the call has returned. Outside a
** task it is poll(2) with the deadline. */
UMS_API int ums_wait_fd(int fd, int events, int64_t deadline);

/* Deferred form of the waiting calls (see "File I/O", deferred form): the
** same arguments, the request in *req. End it with ums_net_end, which
** returns what the blocking call would and, for accept and recvfrom,
** copies the peer's address as they do (addr may be NULL); ums_fs_end
** ends these requests too, without the address. Every _begin here but
** connect's (and accept's on a blocking listener) tries its system call
** at once, without blocking, and returns
** 1 when that answered (the socket was ready, or failed, or the deadline
** has passed): the request is done and no park is left begun, so the
** caller skips the park and ends the request at once. 0 means a park was
** begun as for files. A receive on a descriptor whose receives have
** recently found nothing when tried and then got their data by waiting
** (an exchange of requests and answers) may skip the try and wait for
** readiness at once, returning 0 although data may be there; one whose
** deadline is less than 2 ms away or past always tries. "Away" is judged
** against the scheduler thread's latest clock reading (the one
** ums_deadline made), so a deadline computed long before its call, with
** no clock reading since, may pass unseen: compute it just before the
** call. A binding that yields its coroutine at its quantum does so there
** too, as at any call that need not wait. */
UMS_API int ums_net_accept_begin(int fd, int64_t deadline,
                                 ums_fs_req_t **req);
UMS_API int ums_net_connect_begin(int fd, const struct sockaddr *addr,
                                  socklen_t len, int64_t deadline,
                                  ums_fs_req_t **req);
UMS_API int ums_net_recv_begin(int fd, ums_buf_t *buf, size_t pos,
                               size_t len, int flags, int64_t deadline,
                               ums_fs_req_t **req);
/* Deferred ums_net_recv_take, ended by ums_net_recv_take_end (which
** returns the result and sets *buf as ums_net_recv_take does; UMS_EINVAL
** for a request of another call) or by ums_fs_end (the buffer then goes
** with the request). */
UMS_API int ums_net_recv_take_begin(int fd, size_t len, int flags,
                                    int64_t deadline, ums_fs_req_t **req);
UMS_API int64_t ums_net_recv_take_end(ums_fs_req_t *req, ums_buf_t **buf);
UMS_API int ums_net_send_begin(int fd, ums_buf_t *buf, size_t pos,
                               size_t len, int flags, int64_t deadline,
                               ums_fs_req_t **req);
UMS_API int ums_net_recvfrom_begin(int fd, ums_buf_t *buf, size_t pos,
                                   size_t len, int flags, int64_t deadline,
                                   ums_fs_req_t **req);
UMS_API int ums_net_sendto_begin(int fd, ums_buf_t *buf, size_t pos,
                                 size_t len, int flags,
                                 const struct sockaddr *addr, socklen_t alen,
                                 int64_t deadline, ums_fs_req_t **req);
UMS_API int ums_wait_fd_begin(int fd, int events, int64_t deadline,
                              ums_fs_req_t **req);
/* Deferred ums_net_close: returns 1 when fd is closed already (no park
** begun, *req untouched: the epoll backend closes a socket that does not
** linger at once), 0 after beginning a park whose request (the ring's
** close, or the pool's for a lingering socket) ends with ums_fs_end, or
** an error with nothing begun (UMS_EINVAL for a NULL req, UMS_EBADF,
** UMS_EPERM outside a task, and those of ums_fs_close_begin). fd is gone
** in every case but UMS_EINVAL, UMS_EBADF, UMS_EPERM, UMS_EBUSY and
** UMS_ENOMEM. Like ums_net_close, it first ends this scheduler's
** operations on fd (ums_net_cancel). */
UMS_API int ums_net_close_begin(int fd, int64_t deadline,
                                ums_fs_req_t **req);
UMS_API int64_t ums_net_end(ums_fs_req_t *req, struct sockaddr *addr,
                            socklen_t *len);

/* Name resolution: getaddrinfo(3) that never blocks a scheduler. Numeric
** hosts, a NULL host and names in /etc/hosts are answered on the calling
** thread without a lookup; other names go to the C-call pool ("Going
** preemptive"), where the C library's getaddrinfo runs while the task
** parks (docs/design/io.md, "Name resolution"). hints: getaddrinfo's (only
** ai_flags, ai_family, ai_socktype, ai_protocol are read; NULL: none).
** Returns 0 and the list in *res (the caller frees it with
** freeaddrinfo), or UMS_ENOENT (no such name, or no address of the
** family asked for), UMS_EAGAIN (a temporary failure of the name
** service), UMS_EINVAL (bad hints, family or service; host and service
** both NULL), UMS_ENOMEM, another -errno (EAI_SYSTEM), UMS_ETIMEDOUT,
** UMS_ECANCELED. When eai is not NULL it gets getaddrinfo's own result
** (for gai_strerror; 0 when the call did not end with one). A lookup whose
** caller gave up goes on detached on the pool, which frees its request
** and list when getaddrinfo returns. Outside a task, the C library's call
** on the calling thread (no deadline). */
struct addrinfo;  /* <netdb.h> */
UMS_API int ums_net_getaddrinfo(const char *host, const char *service,
                                const struct addrinfo *hints,
                                struct addrinfo **res, int *eai,
                                int64_t deadline);

/* Deferred form. ums_net_getaddrinfo_begin returns 1 when the answer is
** already there (no park begun: call ums_net_getaddrinfo_end at once), 0
** after beginning a park of the calling task (end it, then call
** ums_net_getaddrinfo_end), or an error (UMS_EPERM outside a task,
** UMS_EINVAL, UMS_ENOMEM, UMS_ECANCELED, UMS_EBUSY) with nothing begun.
** The end call returns what ums_net_getaddrinfo would and frees the
** request. */
typedef struct ums_dns_req ums_dns_req_t;
UMS_API int ums_net_getaddrinfo_begin(const char *host, const char *service,
                                      const struct addrinfo *hints,
                                      int64_t deadline, ums_dns_req_t **req);
UMS_API int ums_net_getaddrinfo_end(ums_dns_req_t *req,
                                    struct addrinfo **res, int *eai);

/* ====================================================================== */
/* Going preemptive                                                        */
/* ====================================================================== */
/*
** A task that must make a blocking C call (a library without an async
** interface, a long computation) hands it to the runtime's hidden
** scheduler for C calls: a pool of OS threads, separate from the file I/O
** pool. Only the calling task parks; its scheduler keeps running the
** others, and the task resumes on its own scheduler through its
** completion list when the call has returned. Threads start on demand,
** one per CPU as calls wait for them; more, up to
** ums_config_t.preempt_threads, only while those are blocked in their
** calls and calls wait (short or computing calls gain nothing from more
** threads than CPUs); threads beyond one per CPU
** end after worker_idle_timeout without work. docs/design/preempt.md
** describes the design.
**
** A call is never killed. When the caller's wait ends first (the deadline
** passed, or the task was cancelled) the call is detached: it runs to its
** end on the pool thread without the caller, or, if no thread had taken
** it yet, never starts.
**
** Ownership of arg. It is the caller's again only when the call returns
** 0: fn(arg) has then run to its end and everything it wrote into *arg
** is visible. On every other return arg belongs to the runtime, which
** calls release(arg) exactly once, when nothing touches arg any more: on
** a pool thread after fn(arg) has returned (or instead of fn, if the call
** never started), or before ums_preempt returns if the call could not
** start at all (UMS_ECANCELED for a task already cancelled, UMS_ENOMEM,
** UMS_EINVAL). So arg (and whatever fn reads or writes) must not live on
** the caller's stack unless release is NULL and the caller never gives
** up (deadline UMS_FOREVER in a task that is never cancelled). release
** may be NULL when arg needs no freeing.
**
** ums_runtime_shutdown waits for detached calls still running; it
** interrupts their system calls with a signal (they fail with EINTR) every
** few milliseconds meanwhile, as it does for file I/O. A call that never
** returns makes the shutdown wait forever: a thread cannot be killed.
*/

typedef void (*ums_preempt_fn)(void *arg);

/* Runs fn(arg) on the C-call pool; parks the calling task until it has
** returned or the deadline passes. Returns 0 (fn ran), UMS_ETIMEDOUT or
** UMS_ECANCELED (the call is detached; see "Ownership of arg"),
** UMS_ENOMEM, UMS_EINVAL (fn is NULL). When fn(arg) returned before the
** task noticed its deadline or cancellation, the result is 0. Outside a
** task (a host thread) fn(arg) runs right here and the result is 0; the
** deadline is not applied there.
**
** Spinning at the call site. When the task's scheduler has nothing else
** to do (no other task runnable or pending, nothing posted to it, no
** timer and not the call's own deadline due within the spin, the task
** not cancelled, no other preemptive call or file I/O of its tasks in
** flight), the task does not park at
** once: it waits for the call by spinning where it called, for at most
** about 50 us (less, or not at all, while such spins keep missing: a
** crowded machine). fn still runs on a pool thread. A call that returns
** meanwhile costs no park, switch or wake-up (counted in
** ums_sched_stats_t.preempt_spun); anything else that wants the
** scheduler (a task posted to it, a cancel) or the end of the spin makes
** the task park as above. Results and ownership are the same either
** way. */
UMS_API int ums_preempt(ums_preempt_fn fn, void *arg, ums_preempt_fn release,
                        int64_t deadline);

/* The same call in two halves, for step tasks that cannot block their
** worker (language bindings: the Lua binding yields the coroutine between
** them). ums_preempt_begin begins a park of the calling task (see
** ums_park_begin) and hands fn(arg) to the pool; the caller then ends
** that park like any other (a step returns UMS_STEP_PARK, or
** ums_park_wait()) and, once the park has ended, calls ums_preempt_end,
** which returns what ums_preempt would have and frees *call. The task
** must not begin another park in between. ums_preempt_begin returns 0 and
** stores the call in *call, or UMS_EPERM outside a task, UMS_EBUSY when a
** park is already begun, UMS_ECANCELED, UMS_ENOMEM, UMS_EINVAL; on every
** error release(arg) has been called (see "Ownership of arg"). */
typedef struct ums_preempt_call ums_preempt_call_t;
UMS_API int ums_preempt_begin(ums_preempt_fn fn, void *arg,
                              ums_preempt_fn release, int64_t deadline,
                              ums_preempt_call_t **call);
UMS_API int ums_preempt_end(ums_preempt_call_t *call);

/* The fast paths of the split form (spinning at the call site, the call's
** data inside its record) are for the language bindings built with the
** runtime: runtime/include/ums-binding.h, which is not installed. */

/* ====================================================================== */
/* Observability: counters, tasks, wait statistics, the monitor            */
/* ====================================================================== */
/*
** Modelled on SQL Server's DBCC SQLPERF(umsstats) and its successors
** sys.dm_os_schedulers, sys.dm_os_tasks, sys.dm_os_waiting_tasks and
** sys.dm_os_wait_stats. Everything here may be called from any thread
** (a task of any scheduler, or a host thread) while the runtime runs. The
** figures are written by the threads they describe without locks and read
** without stopping anyone, so a row is a near-consistent snapshot, not an
** atomic one.
**
** What it costs. Counters are plain increments by the owning scheduler.
** A wait is timed only when the task really parks (a yield is counted,
** never timed), on the wait clock: a word the monitor thread (below) sets
** every millisecond while a scheduler is busy, so timing a wait costs two
** loads of it. Its resolution is a millisecond: a wait shorter than that
** counts as 0 or 1 ms, with the chance of its length, so totals over many
** waits are right on average and a single wait is right to +-1 ms.
** (Reading a real clock on each park, even the CPU's time stamp counter,
** would be a sizeable share of a channel message.)
** UMS_STATS_PRECISE times each wait to the nanosecond instead, with one
** reading of the stamp clock (the time stamp counter calibrated against
** CLOCK_MONOTONIC; clock_gettime where there is none) per park. A task's
** CPU time is sampled by the monitor, never measured on the switch.
** ums_config_t.stats = UMS_STATS_OFF (or UMS_STATS=off) turns the timing
** and the sampling off; counts and states are kept. A runtime on the
** virtual clock times its waits on that clock (a sleep of 10 s shows as
** 10 s); CPU time and stalls are always real.
**
** The monitor. One thread per runtime looks at every scheduler every
** 10 ms while one of them is busy (it sleeps while all are idle). It
** credits the CPU time each busy scheduler's thread used since the last
** look to the task it is running (the task's CPU time, sampled as top(1)
** does) and reports a scheduler that has not passed through its loop for
** stall_threshold: a task stuck in a blocking call or in code that never
** yields (SQL Server's non-yielding scheduler, error 17883), but not a
** thread that merely waits for a CPU on a crowded machine. Each stall is reported once, to
** ums_config_t.on_stall on the monitor thread, between stall_threshold
** and stall_threshold plus a tick after the scheduler last passed
** through its loop. An idle scheduler is never reported.
*/

/* Deadlocks. With ums_config_t.on_deadlock set, the runtime calls it
** when every task it has is parked and nothing the runtime knows of can
** end a park: every scheduler is in its idle wait with no timer armed
** (no sleep, no wait with a deadline), no file I/O and no preemptive
** call of its tasks in flight, no ums_wait_idle waiter, and nothing
** posted to it (wake-ups, cancels, spawns). The decision is taken by the
** last scheduler to go idle, from two readings of every scheduler's
** state that must agree, so a wake-up on its way is never taken for a
** deadlock. It is called once per such state, on that scheduler's
** thread, inside its pass (not in a task): it may inspect tasks
** (ums_runtime_tasks), cancel them or spawn, but must not wait.
**
** If the handler's response changes nothing (no task runs after it, and
** every scheduler finds the same state again), what is left parked is in
** waits that cancellation cannot end: a park begun with
** UMS_PARK_NOCANCEL, or the mutex taken back at the end of
** ums_cond_wait. Nothing could ever end those, so the runtime ends them,
** once per state, with UMS_EDEADLK (the task is not cancelled by that).
**
** The runtime cannot see wake-ups that come from outside it: a host
** thread that will unpark a token, cancel, set an event or spawn; a C
** library thread holding a park token. That is why detection is an
** opt-in: a host whose own threads wake tasks treats the call as "idle
** with tasks parked", not necessarily as a deadlock. */

/* What a task waits for. */
enum {
  UMS_WAIT_NONE = 0,        /* not waiting */
  UMS_WAIT_PARK,            /* a park that did not say (ums_park_begin) */
  UMS_WAIT_SLEEP,
  UMS_WAIT_MUTEX,
  UMS_WAIT_SEMAPHORE,
  UMS_WAIT_EVENT,
  UMS_WAIT_COND,
  UMS_WAIT_CHAN_SEND,
  UMS_WAIT_CHAN_RECV,
  UMS_WAIT_SELECT,          /* several channel operations at once */
  UMS_WAIT_JOIN,
  UMS_WAIT_WAITGROUP,
  UMS_WAIT_FILE_IO,
  UMS_WAIT_PREEMPT,         /* a blocking C call on the C-call pool */
  UMS_WAIT_PENDING_WORKER,  /* spawned past max_workers, waiting (FIFO)
                               for a worker */
  UMS_WAIT_NET,             /* a socket operation (ums_net_*) or a
                               descriptor's readiness (ums_wait_fd) */
  UMS_WAIT_NTYPES
};

/* The wait type's name: "park", "sleep", "mutex", "semaphore", "event",
** "cond", "channel_send", "channel_recv", "select", "join", "waitgroup",
** "file_io", "preemptive", "pending_worker", "network" ("none" for
** UMS_WAIT_NONE);
** NULL out of range. */
UMS_API const char *ums_wait_type_name(int type);

/* Per-scheduler counters and state (sys.dm_os_schedulers). */
typedef struct ums_sched_stats {
  int id;
  int idle;                     /* nonzero while in the idle wait */
  uint64_t context_switches;    /* task switches: a task picked to run */
  uint64_t yields;              /* yields (ums_yield, UMS_STEP_YIELD) */
  uint64_t idle_waits;          /* times the scheduler blocked idle (SQL
                                   Server's idle switches) */
  uint64_t tasks_spawned;       /* tasks started here, total */
  uint64_t tasks;               /* live tasks (pending + active) */
  uint64_t runnable;            /* tasks in the runnable queue */
  uint64_t workers_active;      /* workers carrying a task */
  uint64_t workers_idle;        /* workers without a task */
  uint64_t pending;             /* spawns waiting for a worker (the FIFO
                                   beyond max_workers) */
  uint64_t timers;              /* armed timers */
  uint64_t io_pending;          /* file I/O requests of this scheduler's
                                   tasks in flight (either backend,
                                   abandoned ones included) */
  uint64_t io_requests;         /* file I/O requests started here, total */
  uint64_t io_submits;          /* io_uring_enter calls made to submit
                                   (several requests per call when
                                   batched); 0 with the pool backend */
  uint64_t preempt_pending;     /* preemptive calls of this scheduler's
                                   tasks not yet returned (detached ones
                                   included; not one its task still
                                   spins for at the call site) */
  uint64_t preempt_calls;       /* preemptive calls started here, total
                                   (SQL Server's preemptive switches) */
  /* Observability (below). */
  int hidden;                   /* 0: schedulers are visible; the hidden
                                   pools are in ums_runtime_pool_stats */
  uint64_t fiber_switches;      /* switches between C fibers (a step
                                   task's steps need none) */
  uint64_t quantum_expiries;    /* tasks made to yield because they ran
                                   past their quantum (ums_quantum_expired) */
  uint64_t stalls;              /* stalls the monitor reported */
  uint64_t load_factor;         /* the load placement compares (the
                                   scheduler with the least takes a spawn
                                   for UMS_ANY_SCHED) */
  uint64_t running;             /* the task running now or last (a handle),
                                   0 when idle or none */
  char running_name[32];        /* its name */
  /* Spinning at the call site (ums_preempt). */
  uint64_t preempt_spun;        /* of preempt_calls, those the calling task
                                   waited for by spinning where it called,
                                   without parking (see ums_preempt) */
} ums_sched_stats_t;

/* Fills up to n rows (one per scheduler) and returns the number of
** schedulers. */
UMS_API int ums_runtime_stats(ums_runtime_t *rt, ums_sched_stats_t *rows,
                              int n);

/* The hidden schedulers: the runtime's thread pools for blocking C calls
** and for file I/O (docs/design/preempt.md, docs/design/io.md). */
typedef struct ums_pool_stats {
  const char *name;             /* "preemptive" or "io" */
  uint64_t queued;              /* work waiting for a thread */
  uint64_t threads;             /* threads alive */
  uint64_t active;              /* threads running work */
  uint64_t idle;                /* threads waiting for work */
  uint64_t completed;           /* work run to its end, total */
  uint64_t max;                 /* the most threads it may have */
  int exhausted;                /* 1 while an exhaustion episode lasts
                                   (see ums_pool_exhausted_t) */
  uint64_t episodes;            /* exhaustion episodes reported, total */
  int64_t oldest_wait_ns;       /* how long the oldest queued work has
                                   waited; 0 when none is queued */
  int64_t longest_wait_ns;      /* the longest wait the monitor saw
                                   during an episode, ns */
} ums_pool_stats_t;

/* Fills up to n rows and returns the number of pools (2). */
UMS_API int ums_runtime_pool_stats(ums_runtime_t *rt, ums_pool_stats_t *rows,
                                   int n);

/* A task's state, as ums_runtime_tasks reports it (sys.dm_os_tasks). */
enum {
  UMS_TASK_PENDING = 1,   /* spawned, never run: waiting for a worker
                             (max_workers) or its first turn */
  UMS_TASK_RUNNABLE,      /* ready, waiting for its scheduler */
  UMS_TASK_RUNNING,
  UMS_TASK_SUSPENDED,     /* waiting (wait_type says for what) */
  UMS_TASK_DONE           /* finished, not yet joined */
};
/* "pending", "runnable", "running", "suspended", "done"; NULL out of
** range. */
UMS_API const char *ums_task_state_name(int state);

typedef struct ums_task_info {
  ums_task_t id;
  ums_task_t spawner;         /* the task that spawned it; 0: a host
                                 thread */
  int sched;                  /* its scheduler */
  int state;                  /* UMS_TASK_* */
  int wait_type;              /* UMS_WAIT_* while SUSPENDED, while
                                 RUNNABLE after a wait (the wait it is
                                 about to leave), and UMS_WAIT_PENDING_
                                 WORKER while waiting for a worker */
  const void *wait_object;    /* what it waits on (see ums_park_begin_wait) */
  ums_task_t blocker;         /* the task holding it, when known */
  int64_t wait_ns;            /* how long the wait has lasted so far; -1
                                 when not timed (stats off) */
  int64_t runnable_ns;        /* of that, how long it has been runnable
                                 (woken, waiting for its scheduler: the
                                 signal wait so far); -1 when not timed */
  int64_t cpu_ns;             /* CPU time its scheduler's thread used
                                 while running it, sampled by the monitor
                                 (each tick's CPU goes to the task running
                                 at the tick); -1 with stats off */
  char name[32];
} ums_task_info_t;

/* Calls fn(info, arg) for every task of rt that is alive or finished and
** not yet joined, in no particular order, without holding any lock of the
** runtime while fn runs (fn may call anything, spawn and stop tasks
** included, but not ums_runtime_shutdown). Stops early when fn returns
** nonzero. Returns the number of
** tasks visited, or UMS_EINVAL. Tasks spawned or ended meanwhile may or
** may not be seen. */
typedef int (*ums_task_visit_fn)(const ums_task_info_t *info, void *arg);
UMS_API int ums_runtime_tasks(ums_runtime_t *rt, ums_task_visit_fn fn,
                              void *arg);
/* One task: 0, or UMS_ESRCH when it has ended and been joined (or
** detached), UMS_EINVAL. */
UMS_API int ums_task_info(ums_runtime_t *rt, ums_task_t t,
                          ums_task_info_t *out);
/* Renames a task (copied, up to 31 bytes; NULL clears it). Any thread.
** 0 or UMS_ESRCH. */
UMS_API int ums_task_set_name(ums_runtime_t *rt, ums_task_t t,
                              const char *name);

/* Aggregated waits per type since the runtime started or the last reset
** (sys.dm_os_wait_stats), over every scheduler. A wait is counted when it
** ends (granted, timed out or cancelled) and the task runs again. total
** runs from the park to the moment the task runs again; signal is the
** part of it the task spent runnable, waiting for its scheduler after it
** was woken (SQL Server's signal wait: a high share means CPU pressure,
** not a slow resource). A task woken by another task of its own
** scheduler is taken as runnable from the start of its waker's turn, so
** no clock is read on that path; that overstates the signal wait by at
** most the part of the waker's turn before the wake. */
typedef struct ums_wait_stats {
  int type;                   /* UMS_WAIT_* (the row's index) */
  const char *name;           /* ums_wait_type_name(type) */
  uint64_t count;
  int64_t total_ns;
  int64_t max_ns;
  int64_t signal_ns;
} ums_wait_stats_t;

/* Fills up to n rows, row i for wait type i (row 0, UMS_WAIT_NONE, stays
** zero), and returns UMS_WAIT_NTYPES; all zero with stats off. */
UMS_API int ums_runtime_waits(ums_runtime_t *rt, ums_wait_stats_t *rows,
                              int n);
/* Starts the wait statistics afresh. Waits in progress are counted, whole,
** when they end. */
UMS_API int ums_runtime_waits_reset(ums_runtime_t *rt);

/* A stall the monitor found (ums_config_t.on_stall). */
typedef struct ums_stall {
  int sched;                  /* the scheduler */
  ums_task_t task;            /* the task it was running (0: none, the
                                 scheduler's own code) */
  char name[32];              /* its name */
  int64_t stalled_ns;         /* since the scheduler last passed through
                                 its loop */
  uint64_t seq;               /* stalls reported by this runtime, this one
                                 included */
} ums_stall_t;

/* A pool exhausted (ums_config_t.on_pool_exhausted): every thread the
** pool may have (its max, or fewer when the system refuses more) runs a
** call, and the oldest queued call has waited stall_threshold or more.
** When the running calls wait for the queued ones (a read whose writer
** is queued behind it), nothing will ever move: raise the pool's bound,
** or give those calls a deadline. Reported once per episode, between
** stall_threshold and stall_threshold plus a tick of the monitor after
** the oldest call was queued; the episode ends when nothing is queued
** or a thread is free. The pools' monitor wakes the runtime's monitor
** for it, also while every scheduler is idle. */
typedef struct ums_pool_exhausted {
  const char *pool;           /* "preemptive" or "io" */
  uint64_t threads;           /* threads alive */
  uint64_t active;            /* of those, running a call */
  uint64_t queued;            /* calls waiting for a thread */
  uint64_t max;               /* the pool's bound */
  int64_t oldest_wait_ns;     /* how long the oldest queued call has
                                 waited */
  ums_task_t task;            /* the task that made it (0: unknown) */
  char name[32];              /* that task's name */
  char what[64];              /* what it calls: the name given with
                                 ums_preempt_set_what, or the file
                                 operation ("read", ...); "" when unknown */
  uint64_t seq;               /* episodes of this pool, this one included */
} ums_pool_exhausted_t;

/* For language bindings: the calling task is being made to yield because
** it ran past its quantum; counted in ums_sched_stats_t.quantum_expiries.
** Does nothing outside a task. */
UMS_API void ums_quantum_expired(void);

#ifdef __cplusplus
}
#endif
#endif /* UMS_H */
