/*
** lstream.c: the buffered stream under ums.fs files (lfs.c) and ums.net
** connections (lnet.c): one implementation of Lua's io reading and
** writing (the read formats, buffered writes, lines, setvbuf, flush,
** close), of the positioned methods of files (seek, sync, pread, pwrite,
** read_into), and of the lock that keeps one method at a time on a
** stream. A file's I/O is the runtime's file calls (io_uring, or the I/O
** pool); a socket's is recv and send with the method's deadline
** (lfile.sock). Either way a task that waits parks only itself while its
** scheduler runs the others.
**
** Waiting. A call that needs the kernel is written as a state machine: a
** method's step runs until it needs one I/O, describes it (lop.io) and
** returns STEP_IO; the driver (method_loop) starts that I/O with the
** runtime's deferred form (ums_fs_*_begin) and then
**   - where Lua can yield (the task's own coroutine: lums_can_yield),
**     yields the coroutine with a continuation (io_k) that ends the
**     request (ums_fs_end) and steps the method again. A task waiting for
**     the kernel then holds no worker and no C stack, and costs no fiber
**     switch;
**   - elsewhere (a table.sort comparator, a C call without continuation,
**     the user's own coroutine), waits on the task's worker (ums_park_wait
**     binds it while another worker runs the scheduler:
**     docs/design/architecture.md), then loops: it never recurses, so a
**     long read in such a place costs one C frame however many requests
**     it takes.
** Outside a task (the main thread outside ums.run) the runtime's blocking
** calls are plain system calls, made in the same loop.
**
** A method holds its side of the stream (the lock) from its first step
** to its last, so its progress lives in the stream (lside.op) and
** survives the yields; results it has produced wait on the Lua stack.
**
** A stream is shared by the tasks that hold it: the lock (a FIFO of
** parked tasks per side) keeps one method at a time on a file's buffer,
** so a log file written by many tasks gets whole writes, in order. A
** socket has two sides, each with its own lock, method and buffer: one
** reading method (read, lines, recv) and one writing method (write,
** send, flush) may run at once, so a task may wait for what its peer
** sends while another writes to it; close takes both. A file's methods
** share its position and buffer: it has one lock (side 0).
**
** Closing a socket that other tasks' methods hold or wait for ends those
** methods (begin_close): their requests are cancelled in the kernel and
** they return the failure "closed"; the close takes both sides once
** their holders have given them back, and only then closes the
** descriptor. A close (of a file or a socket) whose task is cancelled
** while it waits for them still happens, exactly once: the stream makes
** it when the last holder gives them back (close_left_now).
**
** Buffering is stdio's: one buffer per file, holding either read-ahead
** (the file's position, lfile.kpos, is ahead of the logical one by the
** unread bytes) or pending writes (behind it by the pending bytes). Reads
** and writes larger than the buffer go straight between the kernel and a
** page-aligned ums_buf (the method's accumulator), then one copy into (or
** from) the Lua string. A socket's two directions are independent: its
** read-ahead and its pending writes have a buffer each (a raw send
** takes no write buffer, so a connection that only sends and receives
** keeps none while it waits). A socket's read buffer exists only while
** it holds unread bytes: a read that finds it empty receives into one
** the runtime takes when the data comes (sub_fill), and a method that
** leaves it empty gives it back (drop_empty_buf), so a connection that
** waits, for its peer or for anything else, holds no read buffer
** either. A read sends what earlier writes left
** buffered when no other task is writing
** (flush_first); a read that times out keeps what it received for the
** next one (keep_after_timeout).
**
** Exit. As C stdio does for its streams, the process's exit writes what
** every open file of every VM still buffers (not sockets, whose send
** could block): each file is on a list of
** the process (open_files) from its making to its __gc, and an atexit
** handler (flush_at_exit) walks it. exit() may run on any thread while
** the files' own threads still run (a scheduler thread calling the C
** exit, directly or through a C function), so the handler touches a
** file only after taking it from its owner: the file's hold word says
** whether a method has it (then its bytes belong to the I/O in flight
** and the handler leaves it) or is free (then the handler takes it for
** the time of a plain write(), never through another thread's ring).
*/
#define _GNU_SOURCE
#include "lstream.h"
#include "lcdata.h"
#include "lpark.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

/* read("a") goes through the file buffer up to this much, then straight
** into the accumulator in growing chunks. */
#define ALL_BUFFERED (16 * (size_t)BUF_SIZE)
/* The longest numeral read("n") accepts (liolib's L_MAXLENNUM). */
#define MAXNUM 200

static const char file_tag = 0;

enum { FILE_FREE, FILE_HELD, FILE_EXIT };

/* Every file of every VM, from new_file to lstream_gc, for flush_at_exit. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static lfile *open_files;   /* [open_lock] */

/* Takes f's hold for a method of its own VM's thread. Taken already, it
** stays taken: outside tasks nothing else can use the file (a method
** left by a collected coroutine counts for nothing). The exit handler
** gives it back after one write. */
static void hold_take(lfile *f) {
  int seen = atomic_load(&f->hold);
  for (;;) {
    if (seen == FILE_EXIT) {
      sched_yield();
      seen = atomic_load(&f->hold);
    } else if (atomic_compare_exchange_weak(&f->hold, &seen, FILE_HELD)) {
      return;
    }
  }
}

/* Gives back a hold taken by hold_take; leaves the exit handler's. */
static void hold_give(lfile *f) {
  int held = FILE_HELD;
  atomic_compare_exchange_strong(&f->hold, &held, FILE_FREE);
}

static bool held(lfile *f) { return atomic_load(&f->hold) == FILE_HELD; }

static void open_add(lfile *f) {
  pthread_mutex_lock(&open_lock);
  f->prev_open = NULL;
  f->next_open = open_files;
  if (open_files) open_files->prev_open = f;
  open_files = f;
  pthread_mutex_unlock(&open_lock);
}

/* Unlists f before its memory goes: the exit handler, which walks the
** list under the lock, never sees a freed file. */
static void open_remove(lfile *f) {
  pthread_mutex_lock(&open_lock);
  if (f->prev_open) f->prev_open->next_open = f->next_open;
  else if (open_files == f) open_files = f->next_open;
  if (f->next_open) f->next_open->prev_open = f->prev_open;
  f->prev_open = f->next_open = NULL;
  pthread_mutex_unlock(&open_lock);
}

/* ---------------------------------------------------------------------- */
/* Errors                                                                  */
/* ---------------------------------------------------------------------- */

/* Pushes nil, "what: message", errno (positive) as io does; returns 3. */
static int push_fail(lua_State *L, const char *what, int64_t err) {
  lua_pushnil(L);
  if (what)
    lua_pushfstring(L, "%s: %s", what, strerror((int)-err));
  else
    lua_pushstring(L, strerror((int)-err));
  lua_pushinteger(L, (lua_Integer)-err);
  return 3;
}

/* A runtime call failed with err: a cancelled task raises core.CANCELLED
** (as every wait does); any other failure is a result. */
void lstream_check_cancel(lua_State *L, int64_t err) {
  if (err == UMS_ECANCELED && lums_cur_task) lums_raise_cancelled(L);
}

/* A call failed with err: a cancelled task raises core.CANCELLED, any
** other failure is the result nil, "what: message", errno. */
int lstream_fail(lua_State *L, const char *what, int64_t err) {
  lstream_check_cancel(L, err);
  return push_fail(L, what, err);
}

/* A method on f ended with err (the method still holds its sides). A
** request the task gave up (it was cancelled while the kernel or a pool
** thread worked on the stream's buffer) may still write into that buffer
** or move the kernel's position later: the stream stops using the
** buffers of the sides the method holds (the request holds its own
** reference) and forgets what they held. A socket's other side may be
** another task's method's, and is left alone. */
static void forget_buffers(lop *o) {
  lfile *f = o->f;
  if (!f->sock) {
    ums_buf_release(f->buf);
    f->buf = NULL;
    /* The read-ahead goes; the position goes back to the logical one. */
    if (f->pos_known) f->kpos -= (int64_t)(f->rlen - f->rpos);
    f->rpos = f->rlen = f->wlen = 0;
    return;
  }
  if (o->sides & LSIDE_READ) {
    ums_buf_release(f->buf);
    f->buf = NULL;
    f->rpos = f->rlen = 0;
  }
  if (o->sides & LSIDE_WRITE) {
    ums_buf_release(f->wbuf);
    f->wbuf = NULL;
    f->wlen = 0;
  }
}

/* A socket's failures: strerror in lower case, but "timeout" for the
** deadline and "closed" for EBADF, which a socket stream, owning its
** descriptor, meets only when its close ended the call. */
int lstream_push_netfail(lua_State *L, int64_t err) {
  char msg[128];
  if (err == UMS_ETIMEDOUT) {
    snprintf(msg, sizeof msg, "timeout");
  } else if (err == UMS_EBADF) {
    snprintf(msg, sizeof msg, "closed");
  } else {
    snprintf(msg, sizeof msg, "%s", strerror((int)-err));
    msg[0] = (char)tolower((unsigned char)msg[0]);
  }
  lua_pushnil(L);
  lua_pushstring(L, msg);
  lua_pushinteger(L, (lua_Integer)-err);
  return 3;
}

/* A cancelled task raises core.CANCELLED (forget_buffers has run);
** otherwise the result nil, message, errno. */
static int file_fail(lua_State *L, lfile *f, int64_t err) {
  lstream_check_cancel(L, err);
  if (f->sock) return lstream_push_netfail(L, err);
  return push_fail(L, NULL, err);
}

/* ---------------------------------------------------------------------- */
/* The lock                                                                */
/* ---------------------------------------------------------------------- */

/* The sides method m takes on f: a file has one lock, side 0. */
static int sides_of(lfile *f, const lmethod *m) {
  return f->sock ? m->sides : LSIDE_READ;
}

/* The side of index i in a set of LSIDE_* bits. */
static bool has_side(int sides, int i) { return (sides & (1 << i)) != 0; }

/* The op of a method holding sides: that of the first side it holds. */
static lop *op_of(lfile *f, int sides) {
  return &f->side[has_side(sides, 0) ? 0 : 1].op;
}

/* The first of sides that a method holds, or NULL when all are free. */
static lside *busy_side(lfile *f, int sides) {
  for (int i = 0; i < 2; i++)
    if (has_side(sides, i) && f->side[i].busy) return &f->side[i];
  return NULL;
}

/* The first task still waiting for side s tries again. Returns whether
** one was woken (then it is about to take the side). */
static bool side_wake(lside *s) {
  return lums_q_wake(&s->waiters, 0) != NULL;
}

static void close_left_now(lfile *f);

/* Takes sides (all free). Side 0 is a file's hold for the exit handler;
** a socket is not the exit handler's (it is not on open_files), so its
** methods skip the hold's atomic exchanges. */
static void sides_take(lfile *f, int sides) {
  for (int i = 0; i < 2; i++) {
    if (!has_side(sides, i)) continue;
    f->side[i].busy = true;
    if (i == 0 && !f->sock) hold_take(f);
  }
}

/* Gives sides back; the first waiter of each tries again. When nobody
** does, a close left by a cancelled closer is made now. */
static void sides_give(lfile *f, int sides) {
  bool woke = false;
  for (int i = 0; i < 2; i++) {
    if (!has_side(sides, i)) continue;
    f->side[i].busy = false;
    if (i == 0 && !f->sock) hold_give(f);
    woke |= side_wake(&f->side[i]);
  }
  if (!woke) close_left_now(f);
}

lfile *lstream_to(lua_State *L, int idx) {
  lfile *f = (lfile *)lua_touserdata(L, idx);
  if (!f || lua_rawlen(L, idx) != sizeof *f || f->tag != &file_tag)
    return NULL;
  return f;
}

lfile *lstream_check(lua_State *L, int idx, const char *mt) {
  lfile *f = lstream_to(L, idx);
  if (!f) luaL_checkudata(L, idx, mt);  /* raises */
  if (f->fd < 0)
    luaL_error(L, f->sock ? "attempt to use a closed connection"
                          : "attempt to use a closed file");
  return f;
}

/* A socket's method that can wait runs only inside a task, as every
** other wait of ums; raises "ums.net.<name>: not inside a task". */
static void sock_need_task(lua_State *L, lfile *f, const char *name) {
  if (f->sock) lums_need_task(L, name);
}

/* The open file at idx (a method's self); raises for anything else. */
static lfile *check_file(lua_State *L, int idx) {
  return lstream_check(L, idx, FILE_MT);
}

/* ---------------------------------------------------------------------- */
/* The driver                                                              */
/* ---------------------------------------------------------------------- */

/* Forgets the method's state; drops the accumulator. */
static void op_clear(lop *o) {
  ums_buf_release(o->acc);
  ums_buf_release(o->taken);
  memset(o, 0, sizeof *o);
}

/* Starts the I/O the step asked for (a task): 0, the error of the begin
** (then nothing was started), or 1 when it is done already: with o->req
** set, a socket's send or receive that answered at once (ums.h, the
** sockets' deferred form), to end without waiting; without, the result
** 0 (a socket closed at once by ums_net_close_begin). */
static int io_begin(lop *o) {
  lfile *f = o->f;
  lio *io = &o->io;
  if (f->sock && io->kind == IO_CLOSE)
    return ums_net_close_begin(io->fd, UMS_FOREVER, &o->req);
  if (f->sock && io->kind == IO_READ && io->take)
    return ums_net_recv_take_begin(io->fd, io->len, 0, o->deadline,
                                   &o->req);
  if (f->sock && io->kind == IO_READ)
    return ums_net_recv_begin(io->fd, io->buf, io->pos, io->len, 0,
                              o->deadline, &o->req);
  if (f->sock && io->kind == IO_WRITE)
    return ums_net_send_begin(io->fd, io->buf, io->pos, io->len, 0,
                              o->deadline, &o->req);
  switch (io->kind) {
    case IO_READ:
      return ums_fs_read_begin(io->fd, io->buf, io->pos, io->len, io->off,
                               UMS_FOREVER, &o->req);
    case IO_WRITE:
      return ums_fs_write_begin(io->fd, io->buf, io->pos, io->len, io->off,
                                UMS_FOREVER, &o->req);
    case IO_CLOSE:
      return ums_fs_close_begin(io->fd, UMS_FOREVER, &o->req);
    case IO_FSYNC:
      return ums_fs_fsync_begin(io->fd, 0, UMS_FOREVER, &o->req);
    default:
      return ums_fs_open_begin(io->path, io->flags, io->mode, UMS_FOREVER,
                               &o->req);
  }
}

/* The same I/O made outside a task: the plain system call. */
static int64_t io_now(lop *o) {
  lfile *f = o->f;
  lio *io = &o->io;
  if (f->sock && io->kind == IO_READ && io->take)
    return ums_net_recv_take(io->fd, io->len, 0, o->deadline, &o->taken);
  if (f->sock && io->kind == IO_READ)
    return ums_net_recv(io->fd, io->buf, io->pos, io->len, 0,
                        o->deadline);
  if (f->sock && io->kind == IO_WRITE)
    return ums_net_send(io->fd, io->buf, io->pos, io->len, 0,
                        o->deadline);
  if (f->sock && io->kind == IO_CLOSE)
    return ums_net_close(io->fd, UMS_FOREVER);
  switch (io->kind) {
    case IO_READ:
      return ums_fs_read(io->fd, io->buf, io->pos, io->len, io->off,
                         UMS_FOREVER);
    case IO_WRITE:
      return ums_fs_write(io->fd, io->buf, io->pos, io->len, io->off,
                          UMS_FOREVER);
    case IO_CLOSE:
      return ums_fs_close(io->fd, UMS_FOREVER);
    case IO_FSYNC:
      return ums_fs_fsync(io->fd, 0, UMS_FOREVER);
    default:
      return ums_fs_open(io->path, io->flags, io->mode, UMS_FOREVER);
  }
}

/* A read or write at the file position has answered (op.res): moves
** the position by what it moved. One that failed at an explicit offset
** moved nothing. */
static void track_pos(lop *o) {
  lfile *f = o->f;
  if ((o->io.kind != IO_READ && o->io.kind != IO_WRITE) || !o->io.at_pos)
    return;
  if (o->res >= 0)
    f->kpos += o->res;
  else if (o->io.off == UMS_FS_CUR)
    f->pos_known = false;
}

/* The request's park has ended: its result answers the step. */
static void io_end(lop *o) {
  o->res = o->io.take ? ums_net_recv_take_end(o->req, &o->taken)
                      : ums_fs_end(o->req);
  o->req = NULL;
  o->answered = true;
  track_pos(o);
}

static int method_loop(lua_State *L, lop *o);
static bool reads(const lmethod *m);

/* A socket's method timed out. What it had received and not returned
** stays for the next read: the bytes a format gathered (op.acc, for a
** reading method) go back in front of the unread read-ahead. The request
** that timed out may still hold the buffer (the kernel may yet write into
** it, or read from it for a send), so the bytes move to a new buffer and
** the stream lets go of the old one; pending writes are dropped, as after
** any failed flush. Only the sides the method holds are touched. Out of
** memory, the bytes are lost. */
static void keep_after_timeout(lop *o) {
  lfile *f = o->f;
  if (o->sides & LSIDE_WRITE) {
    ums_buf_release(f->wbuf);
    f->wbuf = NULL;
    f->wlen = 0;
  }
  if (!(o->sides & LSIDE_READ)) return;
  size_t gathered = reads(o->m) ? o->acclen : 0;
  size_t unread = f->buf ? f->rlen - f->rpos : 0;
  size_t keep = gathered + unread;
  /* Nothing to keep: no buffer, as for a read that waits (sub_fill). */
  ums_buf_t *b =
      keep ? ums_buf_new(keep > BUF_SIZE ? keep : BUF_SIZE) : NULL;
  if (b) {
    char *d = ums_buf_data(b);
    if (gathered) memcpy(d, ums_buf_data(o->acc), gathered);
    if (unread)
      memcpy(d + gathered, (char *)ums_buf_data(f->buf) + f->rpos, unread);
  }
  ums_buf_release(f->buf);
  f->buf = b;
  f->rpos = 0;
  f->rlen = b ? keep : 0;
  o->acclen = 0;
}

/* A socket's read buffer exists only while it holds unread bytes: a
** connection that waits (for its peer, or its task for anything else)
** holds none, and a read that waits reads into one the runtime takes
** when the data comes (sub_fill). Empty, it goes back to the scheduler's
** cache, whence the next read takes it again without a malloc. */
static void drop_empty_buf(lfile *f) {
  if (f->buf && f->rpos == f->rlen) {
    ums_buf_release(f->buf);
    f->buf = NULL;
    f->rpos = f->rlen = 0;
  }
}

/* Continuation of a yield for an I/O. The stream (and so its op) is
** anchored on this thread's stack by the running method, so the op's
** address is the context. */
static int io_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  lop *o = (lop *)ctx;
  io_end(o);
  return method_loop(L, o);
}

/* The method has ended: gives its sides back, then the call's results. */
static int method_end(lua_State *L, lop *o, int nres) {
  lfile *f = o->f;
  const lmethod *m = o->m;
  int64_t err = o->err, wrote = o->wrote;
  bool werr = o->werr;
  int sides = o->sides;
  if (err == UMS_ECANCELED) forget_buffers(o);
  if (f->sock && err == UMS_ETIMEDOUT) keep_after_timeout(o);
  if (f->sock && (sides & LSIDE_READ)) drop_empty_buf(f);
  /* Only the accumulator goes now: nothing reads an op whose side is
  ** free, and the next method's start clears it (op_clear). */
  ums_buf_release(o->acc);
  o->acc = NULL;
  sides_give(f, sides);
  int n = m->done(L, f, nres, err);
  /* A write failed: a failure result (nil, message, errno; the methods
  ** that raise instead never get here) says how many bytes the method
  ** wrote into the file before it, as a fourth value. */
  if (err && werr && n == 3 && lua_isnil(L, -3)) {
    lua_pushinteger(L, (lua_Integer)wrote);
    n++;
  }
  return n;
}

static bool closes(const lmethod *m);
static int flush_first(lop *o);
static void begin_close(lfile *f);

/* Continuation of a yield at the quantum after an I/O answered at once:
** the step takes the answer. */
static int loop_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return method_loop(L, (lop *)ctx);
}

/* Steps the method holding o until it ends, making the I/O it asks for.
** Once a socket's close has begun, another method starts no I/O: the
** step gets UMS_EBADF ("closed") as its answer. */
static int method_loop(lua_State *L, lop *o) {
  lfile *f = o->f;
  ltask *me = o->owner;
  for (;;) {
    int n = o->m->step(L, o);
    if (n != STEP_IO) return method_end(L, o, n);
    if (f->closing && !closes(o->m)) {
      o->res = UMS_EBADF;
      o->answered = true;
      continue;
    }
    if (!me) {
      o->res = io_now(o);
      o->answered = true;
      track_pos(o);
      continue;
    }
    int rc = io_begin(o);
    if (rc > 0 && o->req) {
      /* A socket that was ready answered at once: no park to end. Still a
      ** point where the quantum is checked, as for a method served from
      ** the buffer: a socket that always has data must not keep its
      ** task running past it. */
      io_end(o);
      if (lums_quantum_due(me)) {
        int y = lums_quantum_yield(L, (lua_KContext)o, loop_k);
        if (y >= 0) return y;
      }
      continue;
    }
    if (rc) {
      /* Nothing started (a cancelled task, a park begun by ums.park_begin
      ** in the way): the step gets the error as its answer; or nothing
      ** to wait for: the answer 0. */
      o->res = rc > 0 ? 0 : rc;
      o->answered = true;
      track_pos(o);
      continue;
    }
    if (lums_can_yield(L, me))
      return lums_park_finish(L, me, (lua_KContext)o, io_k);
    lums_park_block_wait(me);
    io_end(o);
  }
}

static int start(lua_State *L, lfile *f, const lmethod *m,
                 int64_t deadline);
static const lmethod m_close, m_tbc;
static bool writes(const lmethod *m);

/* A socket's method gave up waiting for its sides, having touched
** nothing: at its deadline (UMS_ETIMEDOUT), or because a close ended the
** connection meanwhile (UMS_EBADF). The method's failure result (a
** writing method's says it wrote nothing). */
static int lock_fail(lua_State *L, lfile *f, const lmethod *m,
                     int64_t err) {
  int n = m->done(L, f, 0, err);
  if (writes(m) && n == 3 && lua_isnil(L, -3)) {
    lua_pushinteger(L, 0);
    n++;
  }
  return n;
}

/* A close's task was cancelled while it waited for its sides, or as it
** was about to (a method of another task holds them). The descriptor
** must be closed all the same, and only once the holders have given the
** sides back (their requests may still use it): the close is left to
** the stream (close_left_now), and a socket's holders have already been
** told to end (begin_close). Other methods just raise. */
static int cancelled_waiting(lua_State *L, lfile *f, const lmethod *m) {
  if (closes(m) && f->fd >= 0) {
    f->close_left = true;
    close_left_now(f);
  }
  return lums_raise_cancelled(L);
}

/* Continuation of a yield waiting for a side (the stream is the method's
** self, at index 1). */
static int lock_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  ltask *me = lums_cur_task;
  lums_q_unlink(&me->wait);
  int r = ums_park_result();
  const lmethod *m = (const lmethod *)ctx;
  lfile *f = lstream_to(L, 1);
  if (r == UMS_ECANCELED) return cancelled_waiting(L, f, m);
  if (r == UMS_ETIMEDOUT) return lock_fail(L, f, m, UMS_ETIMEDOUT);
  return start(L, f, m, me->wait.deadline);
}

/* Continuation of a yield at the quantum, before the file was taken. */
static int quantum_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return lstream_start(L, lstream_to(L, 1), (const lmethod *)ctx);
}

/* Runs method m on f for the caller: takes its sides (waiting while
** another task's method holds one of them; outside tasks nothing else can
** run, so they are free), then steps the method to its end. A socket's
** method but close has the connection's timeout for the whole call, its
** wait for its sides included: one that times out waiting returns its
** timeout failure, having touched nothing. A close waits as long as it
** takes (a <close> must close). A task that waited may find that the
** holder closed the stream meanwhile: it then raises as for any closed
** file, having touched nothing, or, for a socket, returns the failure
** "closed". A cancelled task raises while it waits, holding nothing. */
int lstream_start(lua_State *L, lfile *f, const lmethod *m) {
  ltask *me = lums_cur_task;
  /* A method served from the buffer need not wait: a yield point all the
  ** same (LUMS_YIELD_POINT_K's check), for a method of the file at index
  ** 1, as quantum_k finds it. Not for open, readfile and writefile (their
  ** file is new and always waits for the kernel), nor for a <close> of the
  ** file, which may run while an error unwinds the task. */
  if (me && lums_quantum_due(me) && m != &m_tbc && lstream_to(L, 1) == f) {
    int n = lums_quantum_yield(L, (lua_KContext)m, quantum_k);
    if (n >= 0) return n;
  }
  bool timed = f->sock && !closes(m);
  return start(L, f, m, timed ? ums_deadline(f->timeout) : UMS_FOREVER);
}

/* lstream_start after the quantum's yield point, with the deadline of the
** call's wait for the stream. A method takes all its sides at once, when
** all are free: a task never holds one side while it waits for the
** other, so two tasks cannot wait for each other. A waiter woken for a
** side that waits on for another leaves the first to the next waiter. */
static int start(lua_State *L, lfile *f, const lmethod *m,
                 int64_t deadline) {
  ltask *me = lums_cur_task;
  int sides = sides_of(f, m);
  lside *s;
  while (me && (s = busy_side(f, sides)) != NULL) {
    for (int i = 0; i < 2; i++)
      if (has_side(sides, i) && !f->side[i].busy) side_wake(&f->side[i]);
    lwait *w = &me->wait;
    int r = ums_park_begin(deadline, &w->tok);
    if (r == UMS_ECANCELED) return cancelled_waiting(L, f, m);
    if (r)
      return luaL_error(L, "ums.fs: cannot wait for the file: %s",
                        ums_strerror(r));
    w->task = me;
    w->L = L;
    w->kase = 0;
    w->deadline = deadline;
    lums_q_push(&s->waiters, w);
    if (lums_can_yield(L, me))
      return lums_park_finish(L, me, (lua_KContext)m, lock_k);
    lums_park_block_wait(me);
    r = ums_park_result();
    lums_q_unlink(w);
    if (r == UMS_ECANCELED) return cancelled_waiting(L, f, m);
    if (r == UMS_ETIMEDOUT) return lock_fail(L, f, m, UMS_ETIMEDOUT);
  }
  if (f->fd < 0 && !m->closed_ok) {
    /* The next waiters find out for themselves. */
    for (int i = 0; i < 2; i++)
      if (has_side(sides, i)) side_wake(&f->side[i]);
    if (f->sock) return lock_fail(L, f, m, UMS_EBADF);
    return luaL_error(L, "attempt to use a closed file");
  }
  sides_take(f, sides);
  lop *o = op_of(f, sides);
  op_clear(o);
  o->f = f;
  o->m = m;
  o->sides = sides;
  o->owner = me;
  if (!f->sock)
    o->deadline = UMS_FOREVER;
  else if (deadline != UMS_FOREVER)
    o->deadline = deadline;
  else
    o->deadline = ums_deadline(f->timeout);
  if (m->init) m->init(L, o);
  return method_loop(L, o);
}

/* The answer to the I/O the calling sub-operation asked for, if it has
** come. A read or write interrupted before it moved anything (EINTR, or
** EAGAIN on a non-blocking descriptor) is not an answer: the caller finds
** none and asks for the same I/O again. */
bool lstream_answer(lop *o, int64_t *res) {
  if (!o->answered) return false;
  o->answered = false;
  if ((o->io.kind == IO_READ || o->io.kind == IO_WRITE) &&
      (o->res == UMS_EINTR || o->res == UMS_EAGAIN))
    return false;
  *res = o->res;
  return true;
}

/* Asks for a read or write of b[pos, pos + len) at off (UMS_FS_CUR: at
** the file's position, kpos when it is known). Returns AGAIN. */
static int64_t ask_rw(lop *o, int kind, ums_buf_t *b, size_t pos,
                      size_t len, int64_t off) {
  lfile *f = o->f;
  bool at_pos = off == UMS_FS_CUR;
  if (at_pos && f->pos_known) off = f->kpos;
  o->io = (lio){.kind = kind, .fd = f->fd, .buf = b, .pos = pos,
                   .len = len, .off = off, .at_pos = at_pos};
  return AGAIN;
}

/* The next format or argument starts from scratch. */
void lstream_next_item(lop *o) {
  o->sub = 0;
  o->done = 0;
  o->acclen = 0;
  o->hit_eof = false;
  o->sized = false;
}

/* ---------------------------------------------------------------------- */
/* Buffers                                                                 */
/* ---------------------------------------------------------------------- */

int64_t lstream_ensure_buf(lfile *f) {
  if (!f->buf && !(f->buf = ums_buf_new(BUF_SIZE))) return UMS_ENOMEM;
  return 0;
}

/* The buffer of pending writes: a socket's own, a file's one buffer. */
static ums_buf_t *wbuf_of(lfile *f) { return f->sock ? f->wbuf : f->buf; }

static int64_t ensure_wbuf(lfile *f) {
  if (!f->sock) return lstream_ensure_buf(f);
  if (!f->wbuf && !(f->wbuf = ums_buf_new(BUF_SIZE))) return UMS_ENOMEM;
  return 0;
}

/* Lets go of the stream's buffers (a request may still hold them). */
static void release_buffers(lfile *f) {
  ums_buf_release(f->buf);
  ums_buf_release(f->wbuf);
  f->buf = f->wbuf = NULL;
}

/* Makes room for `need` bytes in all in the accumulator, keeping what it
** holds. */
static int64_t acc_reserve(lop *o, size_t need) {
  size_t cap = o->acc ? ums_buf_size(o->acc) : 0;
  if (need <= cap) return 0;
  size_t ncap = cap * 2 > need ? cap * 2 : need;
  if (ncap < 4096) ncap = 4096;
  ums_buf_t *b = ums_buf_new(ncap);
  if (!b) return UMS_ENOMEM;
  if (o->acclen) memcpy(ums_buf_data(b), ums_buf_data(o->acc), o->acclen);
  ums_buf_release(o->acc);
  o->acc = b;
  return 0;
}

static int64_t acc_add(lop *o, const char *p, size_t n) {
  if (n == 0) return 0;
  int64_t r = acc_reserve(o, o->acclen + n);
  if (r) return r;
  memcpy((char *)ums_buf_data(o->acc) + o->acclen, p, n);
  o->acclen += n;
  return 0;
}

/* Pushes the accumulator's bytes as a string and empties it. */
static void push_acc(lua_State *L, lop *o) {
  if (o->acclen)
    lua_pushlstring(L, ums_buf_data(o->acc), o->acclen);
  else
    lua_pushliteral(L, "");
  o->acclen = 0;
}

/* ---------------------------------------------------------------------- */
/* Sub-operations: each returns AGAIN while its I/O is asked for, and is   */
/* called again (from the same place of its step) until it returns        */
/* anything else.                                                         */
/* ---------------------------------------------------------------------- */

/* Writes the pending bytes wbuf_of(f)[0, wlen): 0, or an error (they are
** dropped then). */
static int64_t sub_flush(lop *o) {
  lfile *f = o->f;
  int64_t r;
  if (lstream_answer(o, &r)) {
    if (r <= 0) {
      f->wlen = o->wdone = 0;
      o->werr = true;
      return r < 0 ? r : UMS_EIO;
    }
    o->wdone += (size_t)r;
    o->wrote += r;
  }
  if (o->wdone < f->wlen)
    return ask_rw(o, IO_WRITE, wbuf_of(f), o->wdone, f->wlen - o->wdone,
                  UMS_FS_CUR);
  f->wlen = o->wdone = 0;
  return 0;
}

/* Writes acc[0, acclen) at off (UMS_FS_CUR: at the file position): 0 or
** an error. */
static int64_t sub_write_acc(lop *o, int64_t off) {
  int64_t r;
  if (lstream_answer(o, &r)) {
    if (r <= 0) {
      o->werr = true;
      return r < 0 ? r : UMS_EIO;
    }
    o->wpos += (size_t)r;
    o->wrote += r;
  }
  if (o->wpos < o->acclen)
    return ask_rw(o, IO_WRITE, o->acc, o->wpos, o->acclen - o->wpos,
                  off < 0 ? UMS_FS_CUR : off + (int64_t)o->wpos);
  o->wpos = 0;
  return 0;
}

/* Reads into the file buffer after its unread bytes (moved to its start
** first; the caller leaves room): > 0 bytes, 0 at end of file, or an
** error. The buffer may be another one afterwards: callers take its data
** pointer again.
**
** A socket whose buffer is empty gives it back while it waits and reads
** into one the runtime takes when the data comes (ums_net_recv_take):
** a connection waiting for its peer holds no read buffer. After any
** answer the stream has a buffer again, as the reading methods expect. */
static int64_t sub_fill(lop *o) {
  lfile *f = o->f;
  int64_t r;
  if (lstream_answer(o, &r)) {
    if (o->io.take) {
      if (o->taken) {
        ums_buf_release(f->buf);
        f->buf = o->taken;
        o->taken = NULL;
      } else {
        int64_t e = lstream_ensure_buf(f);
        if (e) return e;
      }
    }
    if (r > 0) f->rlen += (size_t)r;
    if (r == 0) o->hit_eof = true;
    return r;
  }
  if (f->sock && f->rpos == f->rlen) {
    drop_empty_buf(f);
    ask_rw(o, IO_READ, NULL, 0, BUF_SIZE, UMS_FS_CUR);
    o->io.take = true;
    return AGAIN;
  }
  if (f->rpos > 0) {
    char *data = ums_buf_data(f->buf);
    memmove(data, data + f->rpos, f->rlen - f->rpos);
    f->rlen -= f->rpos;
    f->rpos = 0;
  }
  return ask_rw(o, IO_READ, f->buf, f->rlen, ums_buf_size(f->buf) - f->rlen,
                UMS_FS_CUR);
}

/* Writes the pending bytes with plain system calls (no park): for __gc,
** the exit handler, and for a task that was cancelled, whose runtime
** calls would all fail with UMS_ECANCELED before doing anything. At kpos
** when it is known, like every write at the position. o: the method
** flushing, which counts what it wrote (NULL: none). */
static int64_t flush_plain(lfile *f, lop *o) {
  const char *p = wbuf_of(f) ? ums_buf_data(wbuf_of(f)) : NULL;
  size_t n = f->wlen;
  f->wlen = 0;
  while (n > 0) {
    ssize_t w = f->sock        ? send(f->fd, p, n, MSG_NOSIGNAL)
                : f->pos_known ? pwrite(f->fd, p, n, (off_t)f->kpos)
                               : write(f->fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (o) o->werr = true;
      return w < 0 ? -errno : UMS_EIO;
    }
    if (f->pos_known) f->kpos += w;
    if (o) o->wrote += w;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Flushes and closes: 0 or the first error. The descriptor is closed in
** every case (by the last pread_into still using it, if any). In a
** cancelled task (a <close> file unwound by the cancel, a close after
** catching it) the runtime refuses to park, so its calls would neither
** write nor close anything: plain system calls then, as in __gc. Uses
** op.sub. */
int64_t lstream_sub_close(lop *o) {
  lfile *f = o->f;
  int64_t r;
  if (o->sub == 0) {
    o->sub = 1;
    if (o->owner && ums_cancelled()) {
      o->err2 = flush_plain(f, o);
      goto plain;
    }
  }
  if (o->sub == 1) {
    r = sub_flush(o);
    if (r == AGAIN) return r;
    o->err2 = r;
    /* cancelled during the flush: the close goes the plain way */
    if (r == UMS_ECANCELED && o->owner) goto plain;
    if (f->sharers > 0) {
      r = 0;
      goto hand_over;
    }
    /* A socket's close is ums_net_close's (io_begin): it also ends what
    ** this scheduler still has waiting on the descriptor. */
    o->sub = 2;
    o->io = (lio){.kind = IO_CLOSE, .fd = f->fd};
    f->fd = -1;
    return AGAIN;
  }
  if (!lstream_answer(o, &r)) r = UMS_EIO;  /* a close is answered, always */
  release_buffers(f);
  return o->err2 ? o->err2 : r;
plain:
  if (f->sharers > 0) {
    r = 0;
    goto hand_over;
  }
  r = close(f->fd) == 0 ? 0 : -errno;
  f->fd = -1;
  release_buffers(f);
  return o->err2 ? o->err2 : r;
hand_over:
  /* pread_into calls of other tasks still use the descriptor: closing it
  ** now would let a new open reuse its number under them. The file is
  ** closed for Lua at once; the last reader closes the descriptor. */
  f->orphan_fd = f->fd;
  f->fd = -1;
  release_buffers(f);
  return o->err2 ? o->err2 : r;
}

/* Drops unread read-ahead, moving the position back to the logical one
** (a stream cannot move back: its read-ahead is lost, as with stdio). */
static void drop_readahead(lfile *f) {
  size_t unread = f->rlen - f->rpos;
  f->rpos = f->rlen = 0;
  if (!unread) return;
  if (f->pos_known) {
    f->kpos -= (int64_t)unread;
    return;
  }
  lseek(f->fd, -(off_t)unread, SEEK_CUR);
}

/* ---------------------------------------------------------------------- */
/* Reading: one format at a time. Each returns AGAIN, an error, or 1 (its */
/* value pushed) / 0 (it failed: something pushed, io's nil replaces it). */
/* ---------------------------------------------------------------------- */

/* A line; keep: keep the newline. At end of file, what was read is the
** last line (it fails when nothing was). */
static int64_t fmt_line(lua_State *L, lop *o, bool keep) {
  lfile *f = o->f;
  for (;;) {
    if (f->rpos == f->rlen) {
      int64_t r = sub_fill(o);
      if (r == AGAIN || r < 0) return r;
      if (r == 0) {
        bool any = o->acclen > 0;
        push_acc(L, o);
        return any;
      }
    }
    char *data = (char *)ums_buf_data(f->buf) + f->rpos;
    size_t avail = f->rlen - f->rpos;
    char *nl = memchr(data, '\n', avail);
    if (nl) {
      size_t k = (size_t)(nl - data);
      if (o->acclen == 0) {
        lua_pushlstring(L, data, k + (keep ? 1 : 0));
      } else {
        int64_t r = acc_add(o, data, k + (keep ? 1 : 0));
        if (r) return r;
        push_acc(L, o);
      }
      f->rpos += k + 1;
      return 1;
    }
    int64_t r = acc_add(o, data, avail);
    if (r) return r;
    f->rpos = f->rlen;
  }
}

enum { COUNT_START = 0, COUNT_DIRECT, COUNT_GATHER };

/* Up to n bytes (n > 0). A big count with nothing read ahead goes
** straight from the kernel into one page-aligned buffer of n bytes, then
** one copy into the string. */
static int64_t fmt_count(lua_State *L, lop *o, size_t n) {
  lfile *f = o->f;
  char *data = ums_buf_data(f->buf);
  int64_t r;
  if (o->sub == COUNT_START) {
    size_t avail = f->rlen - f->rpos;
    if (n <= avail) {
      lua_pushlstring(L, data + f->rpos, n);
      f->rpos += n;
      return 1;
    }
    if (n >= BUF_SIZE && avail == 0 && n <= CHUNK_MAX) {
      o->sub = COUNT_DIRECT;
      if ((r = acc_reserve(o, n))) return r;
    } else {
      o->sub = COUNT_GATHER;
      if ((r = acc_add(o, data + f->rpos, avail))) return r;
      f->rpos = f->rlen;
    }
  }
  if (o->sub == COUNT_DIRECT) {
    /* Until n bytes or the end of file. On a file an error after some
    ** data ends the read with that data, as io's read does; on a socket
    ** it is the method's failure (a timeout keeps the data for the next
    ** read: keep_after_timeout), as in COUNT_GATHER, so a short count is
    ** always the end of the stream. */
    if (lstream_answer(o, &r)) {
      if (r > 0) o->acclen += (size_t)r;
      if (r < 0 && (o->acclen == 0 || f->sock)) return r;
      if (r <= 0) n = o->acclen;
    }
    if (o->acclen < n)
      return ask_rw(o, IO_READ, o->acc, o->acclen, n - o->acclen,
                    UMS_FS_CUR);
    if (o->acclen == 0) {
      lua_pushnil(L);
      return 0;
    }
    push_acc(L, o);
    return 1;
  }
  /* COUNT_GATHER: small pieces through the file buffer, big ones
  ** straight into the accumulator. */
  while (o->acclen < n) {
    size_t want = n - o->acclen;
    if (want < BUF_SIZE) {
      if (f->rpos == f->rlen) {
        r = sub_fill(o);
        if (r == AGAIN || r < 0) return r;
        if (r == 0) break;
      }
      size_t avail = f->rlen - f->rpos;
      size_t k = avail < want ? avail : want;
      data = ums_buf_data(f->buf);  /* sub_fill may have changed it */
      if ((r = acc_add(o, data + f->rpos, k))) return r;
      f->rpos += k;
    } else {
      if (lstream_answer(o, &r)) {
        if (r < 0) return r;
        if (r == 0) break;
        o->acclen += (size_t)r;
        continue;
      }
      size_t chunk = want < CHUNK_MAX ? want : CHUNK_MAX;
      if ((r = acc_reserve(o, o->acclen + chunk))) return r;
      return ask_rw(o, IO_READ, o->acc, o->acclen, chunk, UMS_FS_CUR);
    }
  }
  bool any = o->acclen > 0;
  push_acc(L, o);
  return any;
}

/* The size of f's file by fstat(2) when it is a regular file whose
** position this file knows, else -1. */
static int64_t known_end(lfile *f) {
  struct stat st;
  if (!f->pos_known || fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode))
    return -1;
  return (int64_t)st.st_size;
}

/* The rest of the file: through the file buffer while it is small (a
** small file ends up whole in the buffer and costs one copy), then
** straight into the accumulator in growing chunks. Never fails but for
** an error.
**
** The end is where a read returns 0, or, on a regular file, where a read
** came back short exactly at the size fstat gave when the format began
** (a regular file's read is short only at its end): that spares the read
** that would return 0, a quarter of the requests of an open, read("a"),
** close of a small file. A file that changed size meanwhile does not
** match and is read to a 0 as before; ums_fs_readfile decides the same
** way. */
int64_t lstream_fmt_all(lua_State *L, lop *o) {
  lfile *f = o->f;
  char *data = ums_buf_data(f->buf);
  int64_t r;
  if (!o->sized) {
    o->sized = true;
    o->end_at = known_end(f);
  }
  while (o->sub == 0) {
    data = ums_buf_data(f->buf);  /* sub_fill may have changed it */
    if (f->buf && f->rlen - f->rpos == ums_buf_size(f->buf)) {
      /* Full: its bytes go to the accumulator. */
      if ((r = acc_add(o, data + f->rpos, f->rlen - f->rpos))) return r;
      f->rpos = f->rlen;
      if (o->acclen >= ALL_BUFFERED) {
        o->sub = 1;
        o->done = ALL_BUFFERED;
        break;
      }
    }
    r = sub_fill(o);
    if (r == AGAIN || r < 0) return r;
    if (r == 0 || (f->pos_known && f->kpos == o->end_at &&
                   (size_t)r < o->io.len)) {
      size_t avail = f->rlen - f->rpos;
      data = ums_buf_data(f->buf);
      if (o->acclen == 0) {
        lua_pushlstring(L, data + f->rpos, avail);
      } else {
        if ((r = acc_add(o, data + f->rpos, avail))) return r;
        push_acc(L, o);
      }
      f->rpos = f->rlen;
      return 1;
    }
  }
  if (lstream_answer(o, &r)) {
    if (r < 0) return r;
    if (r == 0 || (f->pos_known && f->kpos == o->end_at &&
                   (size_t)r < o->io.len)) {
      o->acclen += (size_t)r;
      push_acc(L, o);
      return 1;
    }
    o->acclen += (size_t)r;
    if (o->done < CHUNK_MAX) o->done *= 2;
  }
  if ((r = acc_reserve(o, o->acclen + o->done))) return r;
  return ask_rw(o, IO_READ, o->acc, o->acclen, o->done, UMS_FS_CUR);
}

/* The number reader of liolib, on this file's buffer: at most MAXNUM
** characters of what looks like a numeral, then lua_stringtonumber. The
** step first makes sure the buffer holds more than MAXNUM bytes (or the
** rest of the file), so the parse itself never needs the kernel. */
typedef struct {
  const unsigned char *p, *end;
  int c;
  int n;
  char buff[MAXNUM + 1];
} numbuf;

static bool nextc(numbuf *rn) {
  if (rn->n >= MAXNUM) {
    rn->buff[0] = '\0';
    return false;
  }
  rn->buff[rn->n++] = (char)rn->c;
  rn->p++;
  rn->c = rn->p < rn->end ? *rn->p : -1;
  return true;
}

static bool test2(numbuf *rn, const char *set) {
  if (rn->c == set[0] || rn->c == set[1]) return nextc(rn);
  return false;
}

static int readdigits(numbuf *rn, bool hex) {
  int count = 0;
  while (rn->c >= 0 && (hex ? isxdigit(rn->c) : isdigit(rn->c)) &&
         nextc(rn))
    count++;
  return count;
}

static bool is_space(int c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static bool has_space(lfile *f) {
  const unsigned char *d = ums_buf_data(f->buf);
  for (size_t i = f->rpos; i < f->rlen; i++)
    if (is_space(d[i])) return true;
  return false;
}

static int64_t fmt_number(lua_State *L, lop *o) {
  lfile *f = o->f;
  int64_t r;
  if (o->sub == 0) {
    /* Skip white space. */
    for (;;) {
      if (f->rpos == f->rlen) {
        r = sub_fill(o);
        if (r == AGAIN || r < 0) return r;
        if (r == 0) break;
      }
      const unsigned char *d = ums_buf_data(f->buf);
      while (f->rpos < f->rlen && is_space(d[f->rpos])) f->rpos++;
      if (f->rpos < f->rlen) break;
    }
    o->sub = 1;
  }
  /* A numeral holds no white space: one that is followed by some is
  ** whole, and a stream need not wait for more. */
  while (f->rlen - f->rpos <= MAXNUM && !o->hit_eof &&
         !has_space(f)) {
    r = sub_fill(o);
    if (r == AGAIN || r < 0) return r;
  }
  numbuf rn;
  int count = 0;
  bool hex = false;
  /* liolib's pair: the locale's decimal point, or '.'. Both must be real
  ** characters: test2 matches either, and a '\0' here would take a NUL
  ** byte of the file for a decimal point. */
  char decp[2];
  decp[0] = lua_getlocaledecpoint();
  decp[1] = '.';
  rn.p = (const unsigned char *)ums_buf_data(f->buf) + f->rpos;
  rn.end = (const unsigned char *)ums_buf_data(f->buf) + f->rlen;
  rn.c = rn.p < rn.end ? *rn.p : -1;
  rn.n = 0;
  test2(&rn, "-+");
  if (test2(&rn, "00")) {
    if (test2(&rn, "xX"))
      hex = true;
    else
      count = 1;
  }
  count += readdigits(&rn, hex);
  if (test2(&rn, decp)) count += readdigits(&rn, hex);
  if (count > 0 && test2(&rn, (hex ? "pP" : "eE"))) {
    test2(&rn, "-+");
    readdigits(&rn, false);
  }
  f->rpos = (size_t)(rn.p - (const unsigned char *)ums_buf_data(f->buf));
  rn.buff[rn.n] = '\0';
  if (lua_stringtonumber(L, rn.buff) == 0) {
    lua_pushnil(L);
    return 0;
  }
  return 1;
}

static int64_t read_format(lua_State *L, lop *o, int i) {
  lfile *f = o->f;
  if (lua_type(L, i) == LUA_TNUMBER) {
    size_t n = (size_t)lua_tointeger(L, i);
    if (n > 0) return fmt_count(L, o, n);
    /* io's test for end of file */
    if (f->rpos == f->rlen) {
      int64_t r = sub_fill(o);
      if (r == AGAIN || r < 0) return r;
    }
    lua_pushliteral(L, "");
    return f->rpos < f->rlen;
  }
  const char *p = lua_tostring(L, i);
  if (*p == '*') p++;
  switch (*p) {
    case 'n': return fmt_number(L, o);
    case 'a': return lstream_fmt_all(L, o);
    default: return fmt_line(L, o, *p == 'L');
  }
}

/* Stack: file, then the formats (read, lines) or values (write). */
static void items_init(lua_State *L, lop *o) {
  o->i = 2;
  o->last = lua_gettop(L);
}

/* file:read(...) with the formats of io: "n", "l", "L", "a" (with or
** without a leading '*'), or a byte count. */
static int step_read(lua_State *L, lop *o) {
  lfile *f = o->f;
  if (o->phase == 0) {
    /* Nothing pending. */
    int st = flush_first(o);
    if (st != 1) return st;
    int64_t r = lstream_ensure_buf(f);
    if (r) {
      o->err = r;
      return 0;
    }
    o->first = lua_gettop(L) + 1;
  }
  while (o->i <= o->last) {
    int64_t r = read_format(L, o, o->i);
    if (r == AGAIN) return STEP_IO;
    if (r < 0) {
      o->err = r;
      return 0;
    }
    lstream_next_item(o);
    o->i++;
    if (r == 0) {
      /* lstream_fail: io returns nil for the format that failed, and stops */
      lua_pop(L, 1);
      lua_pushnil(L);
      break;
    }
  }
  return lua_gettop(L) - o->first + 1;
}

static int done_result(lua_State *L, lfile *f, int nres, int64_t err) {
  if (err) return file_fail(L, f, err);
  return nres;
}

static const lmethod m_read = {items_init, step_read,
                               done_result, false, LSIDE_READ};

/* Checks the formats at [first, last] before the file is taken: nothing
** may raise while it is held but cancellation. */
static void check_formats(lua_State *L, int first, int last) {
  for (int i = first; i <= last; i++) {
    if (lua_type(L, i) == LUA_TNUMBER) {
      lua_Integer n = luaL_checkinteger(L, i);
      luaL_argcheck(L, n >= 0, i, "count must not be negative");
    } else {
      const char *p = luaL_checkstring(L, i);
      if (*p == '*') p++;
      luaL_argcheck(L, *p && strchr("nlLa", *p), i, "invalid format");
    }
  }
}

int lstream_read(lua_State *L) {
  lfile *f = check_file(L, 1);
  sock_need_task(L, f, "net.read");
  if (lua_gettop(L) == 1) lua_pushliteral(L, "l");
  int nargs = lua_gettop(L) - 1;
  check_formats(L, 2, nargs + 1);
  if (!f->readable) return push_fail(L, NULL, UMS_EBADF);
  luaL_checkstack(L, nargs + LUA_MINSTACK, "too many arguments");
  return lstream_start(L, f, &m_read);
}

/* ---------------------------------------------------------------------- */
/* Writing                                                                 */
/* ---------------------------------------------------------------------- */

/* The bytes of argument i (a string, or a number written as io does:
** integers with LUA_INTEGER_FMT, floats with LUA_NUMBER_FMT). The same
** each time it is asked, so a write can go on after a yield. */
static const char *item_bytes(lua_State *L, int i, char *num, size_t *len) {
  if (lua_type(L, i) == LUA_TNUMBER) {
    int k = lua_isinteger(L, i)
                ? snprintf(num, 64, LUA_INTEGER_FMT,
                           (LUAI_UACINT)lua_tointeger(L, i))
                : snprintf(num, 64, LUA_NUMBER_FMT,
                           (LUAI_UACNUMBER)lua_tonumber(L, i));
    *len = (size_t)k;
    return num;
  }
  return lua_tolstring(L, i, len);
}

/* A task's socket write goes straight from the caller's bytes (which
** stay on its stack for the whole call) when the socket has room now
** (ums_net_send_now): no buffer to copy into, no request. What it sends
** counts as done. Returns 0, or the send's error. */
static int64_t send_now(lop *o, const char *s, size_t len) {
  lfile *f = o->f;
  if (!o->owner || f->closing || o->done == len) return 0;
  int64_t n = ums_net_send_now(f->fd, s + o->done, len - o->done, 0);
  if (n == UMS_EAGAIN) return 0;
  if (n <= 0) {
    o->werr = true;
    return n < 0 ? n : UMS_EIO;
  }
  o->done += (size_t)n;
  o->wrote += n;
  return 0;
}

/* Writes s[done, len) at off + done (off < 0: at the file position).
** A socket's bytes go straight from s while it takes them (send_now);
** the rest goes in chunks, each copied into the accumulator (a
** page-aligned buffer the kernel can own while a request waits), except
** in a call that may not wait (a deadline passed: LuaSocket's
** non-blocking mode), which ends with the timeout instead of copying up
** to CHUNK_MAX bytes for a request that would time out at its try.
** Progress in op.done. */
static int64_t write_chunks(lop *o, const char *s, size_t len,
                            int64_t off) {
  for (;;) {
    if (o->acclen == 0) {
      if (o->f->sock) {
        int64_t e = send_now(o, s, len);
        if (e) return e;
        if (o->done < len && o->deadline != UMS_FOREVER &&
            o->deadline <= ums_now()) {
          o->werr = true;
          return UMS_ETIMEDOUT;
        }
      }
      if (o->done == len) return 0;
      size_t chunk = len - o->done < CHUNK_MAX ? len - o->done : CHUNK_MAX;
      int64_t r = acc_reserve(o, chunk);
      if (r) return r;
      memcpy(ums_buf_data(o->acc), s + o->done, chunk);
      o->acclen = chunk;
    }
    int64_t r = sub_write_acc(o, off < 0 ? off : off + (int64_t)o->done);
    if (r) return r;
    o->done += o->acclen;
    o->acclen = 0;
  }
}

/* Appends s to the pending writes, writing out what does not fit; big
** strings go out directly. */
int64_t lstream_write_bytes(lop *o, const char *s, size_t len) {
  lfile *f = o->f;
  char *data = ums_buf_data(wbuf_of(f));
  switch (o->sub) {
    case 0:
      if (f->wlen + len <= BUF_SIZE) {
        memcpy(data + f->wlen, s, len);
        f->wlen += len;
        return 0;
      }
      o->sub = 1;
      /* fall through */
    case 1: {
      int64_t r = sub_flush(o);
      if (r) return r;
      if (len <= BUF_SIZE) {
        memcpy(data, s, len);
        f->wlen = len;
        return 0;
      }
      o->sub = 2;
    }
      /* fall through */
    default:
      return write_chunks(o, s, len, UMS_FS_CUR);
  }
}

/* Stack: file, values; the values were checked. */
static int step_write(lua_State *L, lop *o) {
  lfile *f = o->f;
  if (o->phase == 0) {
    /* No read-ahead: a file's position goes back to the logical one. A
    ** socket's read-ahead is the read side's, in its own buffer. */
    if (!f->sock) drop_readahead(f);
    int64_t r = ensure_wbuf(f);
    if (r) {
      o->err = r;
      return 0;
    }
    o->phase = 1;
  }
  while (o->i <= o->last) {
    char num[64];
    size_t len;
    const char *s = item_bytes(L, o->i, num, &len);
    int64_t r = lstream_write_bytes(o, s, len);
    if (r == AGAIN) return STEP_IO;
    if (r < 0) {
      o->err = r;
      return 0;
    }
    if (f->vbuf == LSTREAM_LINE && memchr(s, '\n', len)) o->flush_end = true;
    lstream_next_item(o);
    o->i++;
  }
  if (f->vbuf == LSTREAM_NO || o->flush_end) {
    int64_t r = sub_flush(o);
    if (r == AGAIN) return STEP_IO;
    o->err = r;
  }
  return 0;
}

static int done_write(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)nres;
  if (err) return file_fail(L, f, err);
  lua_settop(L, 1);
  return 1;
}

static const lmethod m_write = {items_init, step_write,
                                done_write, false, LSIDE_WRITE};

/* file:write(...): strings and numbers, as io's. Returns the file. */
int lstream_write(lua_State *L) {
  lfile *f = check_file(L, 1);
  sock_need_task(L, f, "net.write");
  int nargs = lua_gettop(L);
  for (int i = 2; i <= nargs; i++) {
    if (lua_type(L, i) != LUA_TNUMBER) luaL_checkstring(L, i);
  }
  if (!f->writable) return push_fail(L, NULL, UMS_EBADF);
  return lstream_start(L, f, &m_write);
}

/* ---------------------------------------------------------------------- */
/* flush, seek, sync                                                       */
/* ---------------------------------------------------------------------- */

static int step_flush(lua_State *L, lop *o) {
  int64_t r = sub_flush(o);
  if (r == AGAIN) return STEP_IO;
  o->err = r;
  if (!r) lua_pushboolean(L, 1);
  return 1;
}

static const lmethod m_flush = {NULL, step_flush,
                                done_result, false, LSIDE_WRITE};

/* file:flush() -> true | nil, msg, errno (io's result, not the file) */
int lstream_flush(lua_State *L) {
  lfile *f = check_file(L, 1);
  sock_need_task(L, f, "net.flush");
  return lstream_start(L, f, &m_flush);
}

/* Stack: file, whence (an option index, pushed by lstream_seek), offset. */
static int step_seek(lua_State *L, lop *o) {
  lfile *f = o->f;
  static const int mode[] = {SEEK_SET, SEEK_CUR, SEEK_END};
  int64_t r = sub_flush(o);
  if (r == AGAIN) return STEP_IO;
  if (r) {
    o->err = r;
    return 0;
  }
  int op = (int)lua_tointeger(L, 2);
  lua_Integer off = lua_tointeger(L, 3);
  /* The position is now the logical one. */
  drop_readahead(f);
  int64_t pos;
  if (op == 1 && f->pos_known) {
    /* From the position this file keeps; lseek would start from the
    ** kernel's, which it does not use. */
    if ((off < 0 && f->kpos + off < 0) ||
        (off > 0 && f->kpos > INT64_MAX - off)) {
      o->err = UMS_EINVAL;
      return 0;
    }
    pos = f->kpos + off;
  } else {
    pos = lseek(f->fd, (off_t)off, mode[op]);
    if (pos < 0) {
      /* Nothing moved. */
      o->err = -errno;
      return 0;
    }
  }
  f->kpos = pos;
  f->pos_known = !f->append;
  lua_pushinteger(L, (lua_Integer)pos);
  return 1;
}

static const lmethod m_seek = {NULL, step_seek, done_result, false,
                               LSIDE_BOTH};

/* file:seek([whence [, offset]]) -> position */
int lstream_seek(lua_State *L) {
  static const char *const modenames[] = {"set", "cur", "end", NULL};
  lfile *f = check_file(L, 1);
  int op = luaL_checkoption(L, 2, "cur", modenames);
  lua_Integer off = luaL_optinteger(L, 3, 0);
  lua_settop(L, 1);
  lua_pushinteger(L, op);
  lua_pushinteger(L, off);
  return lstream_start(L, f, &m_seek);
}

/* Phase 0 of a method that wants this file's pending writes in the
** kernel before its own I/O (program order, as pread(2) after write(2) on
** the descriptor): STEP_IO while they go out, 0 with the error in op.err,
** or 1 once they are out (phase 1). */
static int flush_first(lop *o) {
  lfile *f = o->f;
  if (f->sock && !(o->sides & LSIDE_WRITE)) {
    /* A socket's reading method sends what earlier writes left in the
    ** buffer, as a file's does, when the write side is free: it takes
    ** that side for the flush. It never waits for it: a writer that
    ** holds it (or waits for it) owns those bytes. */
    if (f->wlen == 0 || f->side[1].busy || !ums_list_empty(&f->side[1].waiters.list)) {
      o->phase = 1;
      return 1;
    }
    sides_take(f, LSIDE_WRITE);
    o->sides |= LSIDE_WRITE;
  }
  int64_t r = sub_flush(o);
  if (r == AGAIN) return STEP_IO;
  if (f->sock && !(o->m->sides & LSIDE_WRITE)) {
    /* The flush is over: the read waits without the write side. */
    o->sides &= ~LSIDE_WRITE;
    sides_give(f, LSIDE_WRITE);
  }
  if (r) {
    o->err = r;
    return 0;
  }
  o->phase = 1;
  return 1;
}

/* file:sync() -> true: pending writes out, then fsync. */
static int step_sync(lua_State *L, lop *o) {
  lfile *f = o->f;
  int64_t r;
  if (o->phase == 0) {
    int st = flush_first(o);
    if (st != 1) return st;
    o->io = (lio){.kind = IO_FSYNC, .fd = f->fd};
    return STEP_IO;
  }
  if (!lstream_answer(o, &r)) r = UMS_EIO;
  if (r) {
    o->err = r;
    return 0;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static const lmethod m_sync = {NULL, step_sync, done_result, false,
                               LSIDE_BOTH};

int lstream_sync(lua_State *L) {
  lfile *f = check_file(L, 1);
  return lstream_start(L, f, &m_sync);
}

/* ---------------------------------------------------------------------- */
/* Positional reads side by side                                           */
/* ---------------------------------------------------------------------- */

/* A positional read into the caller's buffer changes nothing in the file
** object: not its position, not its buffer. When the file has no pending
** writes (which must reach the kernel first) and no method holds it or
** waits for it, a task's pread_into runs beside the file lock instead of
** taking it, so many tasks reading one file keep many reads in flight
** (the lock lets one at a time). Such a reader counts itself in
** f->sharers while it reads and carries its progress on its own stack
** (SH_* below); a close meanwhile closes the file for Lua at once and
** leaves the descriptor to the last reader (lstream_sub_close), so its
** number is not reused under them. Outside a task, or when the file is
** busy, m_read_into runs under the lock.
**
** pread (a string) stays under the lock: it needs a buffer of its own per
** read, and 64 of them in flight at once (64 tasks, 1 MiB each) put every
** byte through a 64 MiB working set twice (the kernel's copy, then the
** string's), where one read at a time keeps the buffer in the cache
** (bench_fs.lua's big64 shape). */

enum { SH_FILE = 1, SH_BUF, SH_N, SH_OFF, SH_DONE, SH_FD };

static bool can_share(lfile *f) {
  return lums_cur_task && !held(f) && f->wlen == 0 &&
         ums_list_empty(&f->side[0].waiters.list);
}

/* The reader leaves; the last one out closes a descriptor left to it. */
static void sharer_leave(lfile *f) {
  if (--f->sharers == 0 && f->orphan_fd >= 0) {
    close(f->orphan_fd);
    f->orphan_fd = -1;
  }
}

/* Ends a shared read with res (bytes, or an error). */
static int shared_end(lua_State *L, lfile *f, int64_t res) {
  sharer_leave(f);
  if (res < 0) return lstream_fail(L, NULL, res);
  lua_pushinteger(L, (lua_Integer)res);
  return 1;
}

static int shared_k(lua_State *L, int status, lua_KContext ctx);

/* Takes the answer r of the last read (AGAIN: none yet) and begins the
** next one, or ends the read. */
static int shared_step(lua_State *L, lfile *f, int64_t r) {
  ltask *me = lums_cur_task;
  size_t cap;
  ums_buf_t *b = lums_test_buf(L, SH_BUF, &cap);
  size_t n = (size_t)lua_tointeger(L, SH_N);
  int64_t off = (int64_t)lua_tointeger(L, SH_OFF);
  size_t done = (size_t)lua_tointeger(L, SH_DONE);
  int fd = (int)lua_tointeger(L, SH_FD);
  for (;;) {
    /* EINTR or EAGAIN before anything moved: the same read again. */
    if (r != AGAIN && r != UMS_EINTR && r != UMS_EAGAIN) {
      if (r < 0 && (done == 0 || r == UMS_ECANCELED))
        return shared_end(L, f, r);
      if (r <= 0) break;  /* the end, or an error after some data */
      done += (size_t)r;
    }
    if (done >= n || off > INT64_MAX - (int64_t)done) break;
    size_t want = n - done < CHUNK_MAX ? n - done : CHUNK_MAX;
    ums_fs_req_t *req;
    int rc = ums_fs_read_begin(fd, b, done, want, off + (int64_t)done,
                               UMS_FOREVER, &req);
    if (rc) {
      if (done == 0 || rc == UMS_ECANCELED) return shared_end(L, f, rc);
      break;
    }
    lua_pushinteger(L, (lua_Integer)done);
    lua_replace(L, SH_DONE);
    if (lums_can_yield(L, me))
      return lums_park_finish(L, me, (lua_KContext)req, shared_k);
    lums_park_block_wait(me);
    r = ums_fs_end(req);
  }
  return shared_end(L, f, (int64_t)done);
}

/* Continuation of a yield for a shared read: the request is the context,
** the file at SH_FILE. */
static int shared_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  int64_t r = ums_fs_end((ums_fs_req_t *)ctx);
  return shared_step(L, lstream_to(L, SH_FILE), r);
}

/* pread_into(buf, n, off) beside the lock: the buffer at index 2. */
static int shared_pread_into(lua_State *L, lfile *f, lua_Integer n,
                             lua_Integer off) {
  lua_settop(L, SH_BUF);
  lua_pushinteger(L, n);
  lua_pushinteger(L, off);
  lua_pushinteger(L, 0);
  lua_pushinteger(L, f->fd);
  f->sharers++;
  return shared_step(L, f, AGAIN);
}

/* ---------------------------------------------------------------------- */
/* Positional I/O                                                          */
/* ---------------------------------------------------------------------- */

/* Stack: file, n (> 0), offset. Reads of more than CHUNK_MAX go in
** several requests, straight into the accumulator. */
static int step_pread(lua_State *L, lop *o) {
  size_t n = (size_t)lua_tointeger(L, 2);
  lua_Integer off = lua_tointeger(L, 3);
  int64_t r;
  if (o->phase == 0) {
    int st = flush_first(o);
    if (st != 1) return st;
  } else if (lstream_answer(o, &r)) {
    if (r < 0) {
      o->err = r;
      return 0;
    }
    if (r == 0) goto out;
    o->acclen += (size_t)r;
  }
  if (o->acclen < n && off <= LUA_MAXINTEGER - (lua_Integer)o->acclen) {
    size_t want = n - o->acclen < CHUNK_MAX ? n - o->acclen : CHUNK_MAX;
    if ((r = acc_reserve(o, o->acclen + want))) {
      o->err = r;
      return 0;
    }
    ask_rw(o, IO_READ, o->acc, o->acclen, want,
           (int64_t)off + (int64_t)o->acclen);
    return STEP_IO;
  }
out:
  if (o->acclen == 0)
    lua_pushnil(L);
  else
    push_acc(L, o);
  return 1;
}

static const lmethod m_pread = {NULL, step_pread,
                                done_result, false, LSIDE_BOTH};

/* file:pread(n, offset) -> string (shorter only at the end of the file;
** nil when offset is at or past it) | nil, msg, errno. Does not move the
** file's position. */
int lstream_pread(lua_State *L) {
  lfile *f = check_file(L, 1);
  lua_Integer n = luaL_checkinteger(L, 2);
  lua_Integer off = luaL_checkinteger(L, 3);
  luaL_argcheck(L, n >= 0, 2, "count must not be negative");
  luaL_argcheck(L, off >= 0, 3, "offset must not be negative");
  if (!f->readable) return push_fail(L, NULL, UMS_EBADF);
  if (n == 0) {
    lua_pushliteral(L, "");
    return 1;
  }
  lua_settop(L, 3);
  return lstream_start(L, f, &m_pread);
}

/* Stack: file, s, offset. */
static int step_pwrite(lua_State *L, lop *o) {
  lfile *f = o->f;
  size_t len;
  const char *s = lua_tolstring(L, 2, &len);
  int64_t r;
  if (o->phase == 0) {
    /* Program order: this file's pending writes go out first, and its
    ** read-ahead, which the write may change, is dropped. */
    r = sub_flush(o);
    if (r == AGAIN) return STEP_IO;
    drop_readahead(f);
    if (r) {
      o->err = r;
      return 0;
    }
    o->phase = 1;
  }
  r = write_chunks(o, s, len, (int64_t)lua_tointeger(L, 3));
  if (r == AGAIN) return STEP_IO;
  if (r) {
    o->err = r;
    return 0;
  }
  lua_pushinteger(L, (lua_Integer)len);
  return 1;
}

static const lmethod m_pwrite = {NULL, step_pwrite,
                                 done_result, false, LSIDE_BOTH};

/* file:pwrite(s, offset) -> bytes written | nil, msg, errno */
int lstream_pwrite(lua_State *L) {
  lfile *f = check_file(L, 1);
  luaL_checkstring(L, 2);
  lua_Integer off = luaL_checkinteger(L, 3);
  luaL_argcheck(L, off >= 0, 3, "offset must not be negative");
  if (!f->writable) return push_fail(L, NULL, UMS_EBADF);
  lua_settop(L, 3);
  return lstream_start(L, f, &m_pwrite);
}

/* ---------------------------------------------------------------------- */
/* Reading into a buffer                                                   */
/* ---------------------------------------------------------------------- */

/* read_into and pread_into: the kernel writes straight into the caller's
** ums.ffi.buffer, and no Lua string is made, so a read costs the kernel's
** copy alone (a string result costs a second copy of every byte: Lua 5.4
** cannot make a string of memory it did not allocate). The request holds
** its own reference on the buffer (ums.h, "Ownership"): a task cancelled
** with a read in flight may drop the buffer at once, and the kernel or a
** pool thread still writes into live memory, freed when the request ends.
**
** Stack: file, buffer, n (> 0, at most the buffer's size), offset (>= 0,
** or -1: at the file position, after what is read ahead). Progress in
** op.done. Like pread, a read goes on until n bytes or the end of the
** file; an error after some data ends it with that data. */
static int step_read_into(lua_State *L, lop *o) {
  lfile *f = o->f;
  size_t cap;
  ums_buf_t *b = lums_test_buf(L, 2, &cap);
  size_t n = (size_t)lua_tointeger(L, 3);
  int64_t off = (int64_t)lua_tointeger(L, 4);
  int64_t r;
  if (o->phase == 0) {
    int st = flush_first(o);
    if (st != 1) return st;
    if (off < 0 && f->rpos < f->rlen) {
      /* What was read ahead comes first, as with any read. */
      size_t k = f->rlen - f->rpos < n ? f->rlen - f->rpos : n;
      memcpy(ums_buf_data(b), (char *)ums_buf_data(f->buf) + f->rpos, k);
      f->rpos += k;
      o->done = k;
    }
  } else if (lstream_answer(o, &r)) {
    if (r < 0 && o->done == 0) {
      o->err = r;
      return 0;
    }
    if (r <= 0) goto out;
    o->done += (size_t)r;
  }
  if (o->done < n && (off < 0 || off <= INT64_MAX - (int64_t)o->done)) {
    ask_rw(o, IO_READ, b, o->done, n - o->done,
           off < 0 ? UMS_FS_CUR : off + (int64_t)o->done);
    return STEP_IO;
  }
out:
  lua_pushinteger(L, (lua_Integer)o->done);
  return 1;
}

static const lmethod m_read_into = {NULL, step_read_into,
                                    done_result, false, LSIDE_BOTH};

/* The buffer at index 2 and the count at index 3 (nil: the buffer's
** size), checked before the file is taken. */
static lua_Integer check_into(lua_State *L) {
  size_t cap;
  if (!lums_test_buf(L, 2, &cap))
    luaL_typeerror(L, 2, "ums.ffi.buffer");
  lua_Integer n = luaL_optinteger(L, 3, (lua_Integer)cap);
  luaL_argcheck(L, n >= 0, 3, "count must not be negative");
  luaL_argcheck(L, (lua_Unsigned)n <= cap, 3,
                "count larger than the buffer");
  return n;
}

/* Pushes the count and offset of read_into/pread_into over the arguments
** and starts the method. */
static int start_into(lua_State *L, lfile *f, lua_Integer n,
                      lua_Integer off) {
  if (!f->readable) return push_fail(L, NULL, UMS_EBADF);
  if (n == 0) {
    lua_pushinteger(L, 0);
    return 1;
  }
  lua_settop(L, 2);
  lua_pushinteger(L, n);
  lua_pushinteger(L, off);
  return lstream_start(L, f, &m_read_into);
}

/* file:read_into(buf [, n]) -> bytes read into buf[0, n) (n defaults to
** #buf; 0 at the end of the file) | nil, msg, errno. Reads at the file
** position and moves it, after what file:read has read ahead. */
int lstream_read_into(lua_State *L) {
  lfile *f = check_file(L, 1);
  lua_Integer n = check_into(L);
  return start_into(L, f, n, -1);
}

/* file:pread_into(buf, n, offset) -> bytes read into buf[0, n) (n nil:
** #buf; 0 at or past the end of the file) | nil, msg, errno. Does not
** move the file's position. */
int lstream_pread_into(lua_State *L) {
  lfile *f = check_file(L, 1);
  lua_Integer n = check_into(L);
  lua_Integer off = luaL_checkinteger(L, 4);
  luaL_argcheck(L, off >= 0, 4, "offset must not be negative");
  if (f->readable && n > 0 && can_share(f))
    return shared_pread_into(L, f, n, off);
  return start_into(L, f, n, off);
}

/* ---------------------------------------------------------------------- */
/* Closing                                                                 */
/* ---------------------------------------------------------------------- */

static int step_close(lua_State *L, lop *o) {
  lfile *f = o->f;
  (void)L;
  /* another task may have closed it while this one waited (__close) */
  if (f->fd < 0 && o->sub == 0) return 0;
  int64_t r = lstream_sub_close(o);
  if (r == AGAIN) return STEP_IO;
  o->err = r;
  return 0;
}

static int done_close(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  (void)nres;
  if (err) return lstream_fail(L, NULL, err);  /* closed all the same */
  lua_pushboolean(L, 1);
  return 1;
}

static const lmethod m_close = {NULL, step_close,
                                done_close, false, LSIDE_BOTH};

int lstream_close(lua_State *L) {
  lfile *f = check_file(L, 1);
  begin_close(f);
  return lstream_start(L, f, &m_close);
}

/* __close (a <close> variable going out of scope): file:close, which may
** wait like any method; an error closing is raised. */
static int done_tbc(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  (void)nres;
  if (err) {
    lstream_check_cancel(L, err);
    return luaL_error(L, "ums.fs: closing the file: %s",
                      strerror((int)-err));
  }
  return 0;
}

static const lmethod m_tbc = {NULL, step_close, done_tbc, true,
                              LSIDE_BOTH};

/* Whether m closes the stream (method_loop lets it make its I/O once a
** close has begun: it is that close). */
static bool closes(const lmethod *m) { return m == &m_close || m == &m_tbc; }

/* A socket's close while other tasks' methods hold or wait for its sides
** (a reader blocked on a peer that sends nothing, a writer on one that
** reads nothing): it ends them instead of waiting behind them. From now
** on no other method starts an I/O on the connection (method_loop), and
** the requests in flight are cancelled; the close then waits for its
** sides as usual, which their holders give back once the kernel has
** ended their requests, each with the failure "closed" (UMS_EBADF). The
** descriptor is closed only after that, by the close itself, so its
** number is not reused while the kernel may still act on it. */
static void begin_close(lfile *f) {
  if (!f->sock || f->fd < 0 || f->closing) return;
  f->closing = true;
  if (f->side[0].busy || f->side[1].busy) ums_net_cancel(f->fd);
}

/* The close a cancelled closer left (lfile.close_left), once no method
** holds the sides a close takes and no task waits for them (a waiter
** ends its method and comes back here through sides_give; a later close
** of the stream's own makes the close instead, as usual). Plain system
** calls, as a cancelled task's close makes them (lstream_sub_close): the
** task that gives the sides back may not wait here. The bytes still
** buffered go out as far as they can without waiting. */
static void close_left_now(lfile *f) {
  if (!f->close_left || f->fd < 0) return;
  int sides = sides_of(f, &m_close);
  for (int i = 0; i < 2; i++)
    if (has_side(sides, i) &&
        (f->side[i].busy || !ums_list_empty(&f->side[i].waiters.list)))
      return;
  f->close_left = false;
  (void)flush_plain(f, NULL);
  if (f->sharers > 0) {
    /* As lstream_sub_close: the last pread_into closes it. */
    f->orphan_fd = f->fd;
  } else {
    /* Nothing of this stream's waits on the descriptor any more: the
    ** holders' requests have ended, and a socket request given up on was
    ** cancelled in the kernel at once (the runtime's rule). */
    close(f->fd);
  }
  f->fd = -1;
  release_buffers(f);
}

int lstream_tbc(lua_State *L) {
  lfile *f = lstream_to(L, 1);
  if (!f || f->fd < 0) return 0;
  lua_settop(L, 1);
  begin_close(f);
  return lstream_start(L, f, &m_tbc);
}

/* __gc: a file nobody closed is closed; pending writes go out first.
** Plain system calls, as io's __gc: a finalizer runs inside whatever
** allocated, and must not park that task (it may be half-way through a
** channel operation). Errors cannot be reported here. A file cannot be
** collected while a method runs on it (the method's stack holds it). */
int lstream_gc(lua_State *L) {
  lfile *f = lstream_to(L, 1);
  if (!f) return 0;
  open_remove(f);
  if (f->fd >= 0) {
    /* A socket is not flushed here: a send may have to wait, and a
    ** finalizer cannot. */
    if (!f->sock) flush_plain(f, NULL);
    close(f->fd);
    f->fd = -1;
  }
  /* Only a reader whose coroutine was collected mid-read leaves this. */
  if (f->orphan_fd >= 0) {
    close(f->orphan_fd);
    f->orphan_fd = -1;
  }
  release_buffers(f);
  op_clear(&f->side[0].op);
  op_clear(&f->side[1].op);
  return 0;
}

/* The atexit handler: writes what every file still buffers, as exit does
** for stdio streams. A file a method holds is left alone: its buffer
** belongs to that method's I/O, which may be in flight. The lock is held
** only here and around the list's updates, none of which calls out, so
** an exit on any thread finds it free or soon free; a thread that wants
** a file meanwhile waits only for one write. */
static void flush_at_exit(void) {
  pthread_mutex_lock(&open_lock);
  for (lfile *f = open_files; f; f = f->next_open) {
    int free_ = FILE_FREE;
    if (!atomic_compare_exchange_strong(&f->hold, &free_, FILE_EXIT))
      continue;
    if (f->fd >= 0 && f->wlen > 0) flush_plain(f, NULL);
    atomic_store(&f->hold, FILE_FREE);
  }
  pthread_mutex_unlock(&open_lock);
}

void lstream_init(void) { atexit(flush_at_exit); }

int lstream_file_tostring(lua_State *L) {
  lfile *f = lstream_to(L, 1);
  if (!f) return luaL_typeerror(L, 1, FILE_MT);
  if (f->fd < 0)
    lua_pushliteral(L, "ums.fs.file (closed)");
  else
    lua_pushfstring(L, "ums.fs.file (%p)", (void *)f);
  return 1;
}

/* file:setvbuf(mode [, size]) -> true, as io's. The size is a hint
** this stream does not take: its buffer stays BUF_SIZE bytes. */
int lstream_setvbuf(lua_State *L) {
  static const char *const modes[] = {"full", "line", "no", NULL};
  static const int mode[] = {LSTREAM_FULL, LSTREAM_LINE, LSTREAM_NO};
  lfile *f = check_file(L, 1);
  int op = luaL_checkoption(L, 2, NULL, modes);
  lua_Integer size = luaL_optinteger(L, 3, BUF_SIZE);
  luaL_argcheck(L, size >= 0, 3, "size must not be negative");
  f->vbuf = mode[op];
  lua_pushboolean(L, 1);
  return 1;
}

/* core.stream_buffers(stream) -> bytes of the read buffer and of the
** write buffer the stream holds (0 for one it holds none of), for specs
** that check what an idle connection keeps. */
int lstream_buffers(lua_State *L) {
  lfile *f = lstream_to(L, 1);
  if (!f) return luaL_typeerror(L, 1, "ums.net connection or ums.fs file");
  lua_pushinteger(L, (lua_Integer)ums_buf_size(f->buf));
  lua_pushinteger(L, (lua_Integer)ums_buf_size(f->wbuf));
  return 2;
}

/* ---------------------------------------------------------------------- */
/* Raw reads and writes of sockets                                         */
/* ---------------------------------------------------------------------- */

/* Stack: stream[, max] (checked; BUF_SIZE without it). What the buffer
** holds, else one receive into it: up to max bytes, nil at the end of the
** stream. */
static int step_recv(lua_State *L, lop *o) {
  lfile *f = o->f;
  if (o->phase == 0) {
    int st = flush_first(o);
    if (st != 1) return st;
  }
  /* Nothing read ahead (and then a socket has no buffer): sub_fill's
  ** receive takes one. */
  if (f->rpos == f->rlen) {
    int64_t r = sub_fill(o);
    if (r == AGAIN) return STEP_IO;
    if (r < 0) {
      o->err = r;
      return 0;
    }
    if (r == 0) {
      lua_pushnil(L);
      return 1;
    }
  }
  size_t max =
      lua_isnoneornil(L, 2) ? BUF_SIZE : (size_t)lua_tointeger(L, 2);
  size_t avail = f->rlen - f->rpos;
  size_t k = avail < max ? avail : max;
  lua_pushlstring(L, (char *)ums_buf_data(f->buf) + f->rpos, k);
  f->rpos += k;
  return 1;
}

static const lmethod m_recv = {NULL, step_recv, done_result, false,
                               LSIDE_READ};

/* conn:recv([max]) -> string | nil (end of stream) | nil, msg, errno */
int lstream_recv(lua_State *L) {
  lfile *f = check_file(L, 1);
  if (lua_gettop(L) == 1) {
    /* No size, the usual call: step_recv takes BUF_SIZE itself. */
    sock_need_task(L, f, "net.recv");
    return lstream_start(L, f, &m_recv);
  }
  lua_Integer max = luaL_optinteger(L, 2, BUF_SIZE);
  luaL_argcheck(L, max > 0, 2, "size must be positive");
  sock_need_task(L, f, "net.recv");
  lua_settop(L, 1);
  lua_pushinteger(L, max);
  return lstream_start(L, f, &m_recv);
}

/* Stack: stream, data[, i, j] (checked): the bytes to send are data[i, j],
** or the whole string without i and j (the string stays on the stack for
** the method's whole run). */
static void send_init(lua_State *L, lop *o) {
  size_t len;
  const char *s = lua_tolstring(L, 2, &len);
  if (lua_isnoneornil(L, 3)) {
    o->src = s;
    o->srclen = len;
    return;
  }
  size_t i = (size_t)lua_tointeger(L, 3), j = (size_t)lua_tointeger(L, 4);
  o->src = s + i - 1;
  o->srclen = j - i + 1;
}

/* Pending writes first, then the bytes send_init found, unbuffered; the
** result counts those bytes only. */
static int step_send(lua_State *L, lop *o) {
  if (o->phase == 0) {
    int st = flush_first(o);
    if (st != 1) return st;
    o->wrote = 0;
  }
  int64_t r = write_chunks(o, o->src, o->srclen, UMS_FS_CUR);
  if (r == AGAIN) return STEP_IO;
  if (r) {
    o->err = r;
    return 0;
  }
  lua_pushinteger(L, (lua_Integer)o->wrote);
  return 1;
}

static const lmethod m_send = {send_init, step_send,
                               done_result, false, LSIDE_WRITE};

/* conn:send(data [, i [, j]]) -> count | nil, msg, errno, sent; i and j
** as string.sub's. */
int lstream_send(lua_State *L) {
  lfile *f = check_file(L, 1);
  size_t len;
  luaL_checklstring(L, 2, &len);
  if (lua_gettop(L) == 2 && len > 0) {
    /* The whole string, the usual call: send_init needs no range. */
    sock_need_task(L, f, "net.send");
    return lstream_start(L, f, &m_send);
  }
  lua_Integer i = luaL_optinteger(L, 3, 1);
  lua_Integer j = luaL_optinteger(L, 4, -1);
  if (i < 0) i = (lua_Integer)len + i + 1 > 0 ? (lua_Integer)len + i + 1 : 1;
  if (i == 0) i = 1;
  if (j < 0) j = (lua_Integer)len + j + 1;
  if (j > (lua_Integer)len) j = (lua_Integer)len;
  sock_need_task(L, f, "net.send");
  if (i > j) {
    lua_pushinteger(L, 0);
    return 1;
  }
  lua_settop(L, 2);
  lua_pushinteger(L, i);
  lua_pushinteger(L, j);
  return lstream_start(L, f, &m_send);
}

/* conn:drain() -> what the read buffer holds ("" when nothing, or while
** another task's reading method has the read side), without waiting. */
int lstream_drain(lua_State *L) {
  lfile *f = check_file(L, 1);
  if (f->side[0].busy || !f->buf || f->rpos == f->rlen) {
    lua_pushliteral(L, "");
    return 1;
  }
  lua_pushlstring(L, (char *)ums_buf_data(f->buf) + f->rpos,
                  f->rlen - f->rpos);
  f->rpos = f->rlen = 0;
  return 1;
}

/* ---------------------------------------------------------------------- */
/* lines                                                                   */
/* ---------------------------------------------------------------------- */

#define PH_CLOSING 100

/* Stack: file, formats; upvalue 3 says whether to close at the end. */
static void lines_init(lua_State *L, lop *o) {
  items_init(L, o);
  o->close_at_end = lua_toboolean(L, lua_upvalueindex(3));
}

static int step_lines(lua_State *L, lop *o) {
  lfile *f = o->f;
  if (o->phase != PH_CLOSING) {
    int n = step_read(L, o);
    if (n == STEP_IO || o->err) return n;
    if (n >= 1 && !lua_isnil(L, o->first)) return n;
    /* End of file (or a format that failed). */
    lua_settop(L, o->first - 1);
    if (!o->close_at_end || f->fd < 0) return 0;
    o->phase = PH_CLOSING;
    lstream_next_item(o);
  }
  if (lstream_sub_close(o) == AGAIN) return STEP_IO;
  return 0;  /* an error closing is not the loop's business */
}

/* A failure raises, as io's lines does; a socket's is worded as its
** methods' results ("timeout", "closed"). */
static int done_lines(lua_State *L, lfile *f, int nres, int64_t err) {
  if (err) {
    lstream_check_cancel(L, err);
    if (!f->sock) return luaL_error(L, "%s", strerror((int)-err));
    lstream_push_netfail(L, err);
    return luaL_error(L, "%s", lua_tostring(L, -2));
  }
  return nres;
}

static const lmethod m_lines = {lines_init, step_lines,
                                done_lines, false, LSIDE_READ};

/* Whether m gathers received bytes in op.acc (keep_after_timeout). */
static bool reads(const lmethod *m) { return m == &m_read || m == &m_lines; }

/* Whether m's failure result says how much it wrote (method_end). */
static bool writes(const lmethod *m) {
  return m == &m_write || m == &m_send || m == &m_flush;
}

/* lines iterator: upvalues file, number of formats, close at end,
** formats... */
static int lines_iter(lua_State *L) {
  lfile *f = lstream_to(L, lua_upvalueindex(1));
  if (!f || f->fd < 0) return luaL_error(L, "file is already closed");
  int n = (int)lua_tointeger(L, lua_upvalueindex(2));
  lua_settop(L, 0);
  luaL_checkstack(L, n + LUA_MINSTACK, "too many arguments");
  lua_pushvalue(L, lua_upvalueindex(1));
  for (int i = 1; i <= n; i++) lua_pushvalue(L, lua_upvalueindex(3 + i));
  if (n == 0) lua_pushliteral(L, "l");
  check_formats(L, 2, lua_gettop(L));
  if (!f->readable) {
    push_fail(L, NULL, UMS_EBADF);
    return luaL_error(L, "%s", lua_tostring(L, -2));
  }
  return lstream_start(L, f, &m_lines);
}

void lstream_push_lines(lua_State *L, int file, int first, bool close) {
  int n = lua_gettop(L) - first + 1;
  luaL_argcheck(L, n <= 250, first, "too many arguments");
  lua_pushvalue(L, file);
  lua_pushinteger(L, n);
  lua_pushboolean(L, close);
  for (int i = 0; i < n; i++) lua_pushvalue(L, first + i);
  lua_pushcclosure(L, lines_iter, 3 + n);
}

/* file:lines(...) -> iterator reading with the formats (default "l") */
int lstream_lines(lua_State *L) {
  sock_need_task(L, check_file(L, 1), "net.lines");
  lstream_push_lines(L, 1, 2, false);
  return 1;
}


lfile *lstream_new(lua_State *L, int fd, bool rd, bool wr, bool sock,
                   const char *mt) {
  lfile *f = (lfile *)lua_newuserdatauv(L, sizeof *f, 0);
  memset(f, 0, sizeof *f);
  atomic_init(&f->hold, FILE_FREE);
  f->tag = &file_tag;
  f->fd = fd;
  f->orphan_fd = -1;
  f->readable = rd;
  f->writable = wr;
  f->sock = sock;
  f->timeout = -1;
  f->vbuf = LSTREAM_FULL;
  luaL_setmetatable(L, mt);
  /* Listed only now that its __gc is sure to run and unlist it. Sockets
  ** are not flushed at exit (a send may block), so not listed. */
  if (!sock) open_add(f);
  return f;
}
