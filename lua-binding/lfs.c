/*
** lfs.c: ums.fs, files for tasks. The methods follow Lua's io library
** (read formats, write, lines, seek, flush, close) so code ports by
** changing io.open to ums.fs.open; every system call goes through the
** runtime's file I/O (io_uring, or the I/O pool), so a task that reads or
** writes parks only itself while its scheduler runs the others.
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
**     binds it while another worker runs the scheduler, DESIGN.md section
**     4), then loops: it never recurses, so a long read in such a place
**     costs one C frame however many requests it takes.
** Outside a task (the main thread outside ums.run) the runtime's blocking
** calls are plain system calls, made in the same loop.
**
** A method holds its file (the file lock) from its first step to its
** last, so its progress lives in the file (lfile.op) and survives the
** yields; results it has produced wait on the Lua stack. The calls that
** have no file (stat, remove, rename, mkdir, dir) make one request at a
** time, carried to their continuation as its context.
**
** A file is shared by the tasks that hold it: the file lock (a FIFO of
** parked tasks) keeps one method at a time on its buffer, so a log file
** written by many tasks gets whole writes, in order.
**
** Buffering is stdio's: one buffer per file, holding either read-ahead
** (the file's position, lfile.kpos, is ahead of the logical one by the
** unread bytes) or pending writes (behind it by the pending bytes). Reads
** and writes larger than the buffer go straight between the kernel and a
** page-aligned ums_buf (the method's accumulator), then one copy into (or
** from) the Lua string.
**
** Exit. As C stdio does for its streams, the process's exit writes what
** every open file of every VM still buffers: each file is on a list of
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

#define FILE_MT "ums.fs.file"
/* Largest single transfer asked of the runtime. */
#define CHUNK_MAX ((size_t)16 * 1024 * 1024)
/* read("a") goes through the file buffer up to this much, then straight
** into the accumulator in growing chunks. */
#define ALL_BUFFERED (16 * (size_t)BUF_SIZE)
/* The longest numeral read("n") accepts (liolib's L_MAXLENNUM). */
#define MAXNUM 200

/* A step's answer besides a result count: it asked for an I/O. */
#define STEP_IO (-1)
/* A sub-operation's answer while its I/O is asked for (no real result is
** this small). */
#define AGAIN INT64_MIN

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
static void check_cancel(lua_State *L, int64_t err) {
  if (err == UMS_ECANCELED && lums_cur_task) lums_raise_cancelled(L);
}

/* A call failed with err: a cancelled task raises core.CANCELLED, any
** other failure is the result nil, "what: message", errno. */
static int fail(lua_State *L, const char *what, int64_t err) {
  check_cancel(L, err);
  return push_fail(L, what, err);
}

/* A method on f failed with err after giving f back. A request the task
** gave up (it was cancelled while the kernel or a pool thread worked on
** the file's buffer) may still write into that buffer or move the
** kernel's position later: the file stops using the buffer (the request
** holds its own reference) and forgets what it held. Then a cancelled
** task raises core.CANCELLED. */
static void file_check_cancel(lua_State *L, lfile *f, int64_t err) {
  if (err != UMS_ECANCELED) return;
  hold_take(f);
  if (f->buf) {
    ums_buf_release(f->buf);
    f->buf = NULL;
  }
  /* The read-ahead goes; the position goes back to the logical one. */
  if (f->pos_known) f->kpos -= (int64_t)(f->rlen - f->rpos);
  f->rpos = f->rlen = f->wlen = 0;
  hold_give(f);
  check_cancel(L, err);
}

int lstream_push_netfail(lua_State *L, int64_t err) {
  char msg[128];
  if (err == UMS_ETIMEDOUT) {
    snprintf(msg, sizeof msg, "timeout");
  } else {
    snprintf(msg, sizeof msg, "%s", strerror((int)-err));
    msg[0] = (char)tolower((unsigned char)msg[0]);
  }
  lua_pushnil(L);
  lua_pushstring(L, msg);
  lua_pushinteger(L, (lua_Integer)-err);
  return 3;
}

/* file_check_cancel, then the result nil, message, errno. */
static int file_fail(lua_State *L, lfile *f, int64_t err) {
  file_check_cancel(L, f, err);
  if (f->sock) return lstream_push_netfail(L, err);
  return push_fail(L, NULL, err);
}

/* ---------------------------------------------------------------------- */
/* The file lock                                                           */
/* ---------------------------------------------------------------------- */

/* Gives the file back; the first waiter still waiting tries again. */
static void file_unlock(lfile *f) {
  hold_give(f);
  f->owner = NULL;
  lwait *w;
  while ((w = f->waiters.head) != NULL) {
    lums_q_unlink(w);
    if (lums_unpark(w->task, w->tok, 0)) break;
  }
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
  memset(o, 0, sizeof *o);
}

/* Starts the I/O the step asked for (a task): 0, or the error of the
** begin (then nothing was started). */
static int io_begin(lfile *f) {
  lop *o = &f->op;
  lio *io = &o->io;
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
static int64_t io_now(lfile *f) {
  lio *io = &f->op.io;
  if (f->sock && io->kind == IO_READ)
    return ums_net_recv(io->fd, io->buf, io->pos, io->len, 0,
                        f->op.deadline);
  if (f->sock && io->kind == IO_WRITE)
    return ums_net_send(io->fd, io->buf, io->pos, io->len, 0,
                        f->op.deadline);
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
static void track_pos(lfile *f) {
  lop *o = &f->op;
  if ((o->io.kind != IO_READ && o->io.kind != IO_WRITE) || !o->io.at_pos)
    return;
  if (o->res >= 0)
    f->kpos += o->res;
  else if (o->io.off == UMS_FS_CUR)
    f->pos_known = false;
}

/* The request's park has ended: its result answers the step. */
static void io_end(lfile *f) {
  lop *o = &f->op;
  o->res = ums_fs_end(o->req);
  o->req = NULL;
  o->answered = true;
  track_pos(f);
}

static int method_loop(lua_State *L, lfile *f);
static bool reads(const lmethod *m);

/* A socket's method timed out. What it had received and not returned
** stays for the next read: the bytes a format gathered (op.acc, for a
** reading method) go back in front of the unread read-ahead. The request
** that timed out may still hold the buffer (the kernel may yet write into
** it, or read from it for a send), so the bytes move to a new buffer and
** the stream lets go of the old one; pending writes are dropped, as after
** any failed flush. Out of memory, the bytes are lost. */
static void keep_after_timeout(lfile *f) {
  lop *o = &f->op;
  size_t gathered = reads(o->m) ? o->acclen : 0;
  size_t unread = f->buf ? f->rlen - f->rpos : 0;
  size_t keep = gathered + unread;
  ums_buf_t *b = ums_buf_new(keep > BUF_SIZE ? keep : BUF_SIZE);
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
  f->wlen = 0;
  o->acclen = 0;
}

/* Continuation of a yield for an I/O. The file is anchored on this
** thread's stack by the running method, so its address is the context. */
static int io_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  lfile *f = (lfile *)ctx;
  io_end(f);
  return method_loop(L, f);
}

/* The method has ended: gives the file back, then the call's results. */
static int method_end(lua_State *L, lfile *f, int nres) {
  lop *o = &f->op;
  const lmethod *m = o->m;
  int64_t err = o->err, wrote = o->wrote;
  bool werr = o->werr;
  if (f->sock && err == UMS_ETIMEDOUT) keep_after_timeout(f);
  op_clear(o);
  file_unlock(f);
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

/* Steps the method holding f until it ends, making the I/O it asks for. */
static int method_loop(lua_State *L, lfile *f) {
  lop *o = &f->op;
  ltask *me = f->owner;
  for (;;) {
    int n = o->m->step(L, f);
    if (n != STEP_IO) return method_end(L, f, n);
    if (!me) {
      o->res = io_now(f);
      o->answered = true;
      track_pos(f);
      continue;
    }
    int rc = io_begin(f);
    if (rc) {
      /* Nothing started (a cancelled task, a park begun by ums.park_begin
      ** in the way): the step gets the error as its answer. */
      o->res = rc;
      o->answered = true;
      track_pos(f);
      continue;
    }
    if (lums_can_yield(L, me))
      return lums_park_finish(L, me, (lua_KContext)f, io_k);
    lums_before_block(me);
    ums_park_wait();
    lums_become_current(me);
    io_end(f);
  }
}

static int method_start(lua_State *L, lfile *f, const lmethod *m);
static const lmethod m_tbc;

/* Continuation of a yield waiting for the file (the file is the method's
** self, at index 1). */
static int lock_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  ltask *me = lums_cur_task;
  lums_q_unlink(&me->wait);
  if (ums_park_result() == UMS_ECANCELED) return lums_raise_cancelled(L);
  return method_start(L, lstream_to(L, 1), (const lmethod *)ctx);
}

/* Continuation of a yield at the quantum, before the file was taken. */
static int quantum_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return method_start(L, lstream_to(L, 1), (const lmethod *)ctx);
}

/* Runs method m on f for the caller: takes the file (waiting for it while
** another task's method holds it; outside tasks nothing else can run, so
** it is free), then steps the method to its end. A task that waited may
** find that the holder closed the file meanwhile: it then raises as for
** any closed file, having touched nothing. A cancelled task raises while
** it waits, holding nothing. */
static int method_start(lua_State *L, lfile *f, const lmethod *m) {
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
  while (held(f) && me) {
    lwait *w = &me->wait;
    int r = ums_park_begin(UMS_FOREVER, &w->tok);
    if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
    if (r)
      return luaL_error(L, "ums.fs: cannot wait for the file: %s",
                        ums_strerror(r));
    w->task = me;
    w->L = L;
    w->kase = 0;
    lums_q_push(&f->waiters, w);
    if (lums_can_yield(L, me))
      return lums_park_finish(L, me, (lua_KContext)m, lock_k);
    lums_before_block(me);
    r = ums_park_wait();
    lums_become_current(me);
    lums_q_unlink(w);
    if (r == UMS_ECANCELED) return lums_raise_cancelled(L);
  }
  if (f->fd < 0 && !m->closed_ok) {
    file_unlock(f);  /* the next waiter finds out for itself */
    return luaL_error(L, "attempt to use a closed file");
  }
  hold_take(f);
  f->owner = me;
  op_clear(&f->op);
  f->op.m = m;
  f->op.deadline = f->sock ? ums_deadline(f->timeout) : UMS_FOREVER;
  if (m->init) m->init(L, f);
  return method_loop(L, f);
}

/* The answer to the I/O the calling sub-operation asked for, if it has
** come. A read or write interrupted before it moved anything (EINTR, or
** EAGAIN on a non-blocking descriptor) is not an answer: the caller finds
** none and asks for the same I/O again. */
static bool op_answer(lfile *f, int64_t *res) {
  lop *o = &f->op;
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
static int64_t ask_rw(lfile *f, int kind, ums_buf_t *b, size_t pos,
                      size_t len, int64_t off) {
  bool at_pos = off == UMS_FS_CUR;
  if (at_pos && f->pos_known) off = f->kpos;
  f->op.io = (lio){.kind = kind, .fd = f->fd, .buf = b, .pos = pos,
                   .len = len, .off = off, .at_pos = at_pos};
  return AGAIN;
}

/* The next format or argument starts from scratch. */
static void op_next_item(lop *o) {
  o->sub = 0;
  o->done = 0;
  o->acclen = 0;
  o->hit_eof = false;
  o->sized = false;
}

/* ---------------------------------------------------------------------- */
/* Buffers                                                                 */
/* ---------------------------------------------------------------------- */

static int64_t ensure_buf(lfile *f) {
  if (!f->buf && !(f->buf = ums_buf_new(BUF_SIZE))) return UMS_ENOMEM;
  return 0;
}

/* Makes room for `need` bytes in all in the accumulator, keeping what it
** holds. */
static int64_t acc_reserve(lfile *f, size_t need) {
  lop *o = &f->op;
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

static int64_t acc_add(lfile *f, const char *p, size_t n) {
  lop *o = &f->op;
  if (n == 0) return 0;
  int64_t r = acc_reserve(f, o->acclen + n);
  if (r) return r;
  memcpy((char *)ums_buf_data(o->acc) + o->acclen, p, n);
  o->acclen += n;
  return 0;
}

/* Pushes the accumulator's bytes as a string and empties it. */
static void push_acc(lua_State *L, lfile *f) {
  lop *o = &f->op;
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

/* Writes the pending bytes buf[0, wlen): 0, or an error (they are dropped
** then). */
static int64_t sub_flush(lfile *f) {
  lop *o = &f->op;
  int64_t r;
  if (op_answer(f, &r)) {
    if (r <= 0) {
      f->wlen = o->wdone = 0;
      o->werr = true;
      return r < 0 ? r : UMS_EIO;
    }
    o->wdone += (size_t)r;
    o->wrote += r;
  }
  if (o->wdone < f->wlen)
    return ask_rw(f, IO_WRITE, f->buf, o->wdone, f->wlen - o->wdone,
                  UMS_FS_CUR);
  f->wlen = o->wdone = 0;
  return 0;
}

/* Writes acc[0, acclen) at off (UMS_FS_CUR: at the file position): 0 or
** an error. */
static int64_t sub_write_acc(lfile *f, int64_t off) {
  lop *o = &f->op;
  int64_t r;
  if (op_answer(f, &r)) {
    if (r <= 0) {
      o->werr = true;
      return r < 0 ? r : UMS_EIO;
    }
    o->wpos += (size_t)r;
    o->wrote += r;
  }
  if (o->wpos < o->acclen)
    return ask_rw(f, IO_WRITE, o->acc, o->wpos, o->acclen - o->wpos,
                  off < 0 ? UMS_FS_CUR : off + (int64_t)o->wpos);
  o->wpos = 0;
  return 0;
}

/* Reads into the file buffer after its unread bytes (moved to its start
** first; the caller leaves room): > 0 bytes, 0 at end of file, or an
** error. */
static int64_t sub_fill(lfile *f) {
  int64_t r;
  if (op_answer(f, &r)) {
    if (r > 0) f->rlen += (size_t)r;
    if (r == 0) f->op.hit_eof = true;
    return r;
  }
  if (f->rpos > 0) {
    char *data = ums_buf_data(f->buf);
    memmove(data, data + f->rpos, f->rlen - f->rpos);
    f->rlen -= f->rpos;
    f->rpos = 0;
  }
  return ask_rw(f, IO_READ, f->buf, f->rlen, ums_buf_size(f->buf) - f->rlen,
                UMS_FS_CUR);
}

/* Writes the pending bytes with plain system calls (no park): for __gc,
** and for a task that was cancelled, whose runtime calls would all fail
** with UMS_ECANCELED before doing anything. At kpos when it is known,
** like every write at the position. */
static int64_t flush_plain(lfile *f) {
  const char *p = f->buf ? ums_buf_data(f->buf) : NULL;
  size_t n = f->wlen;
  f->wlen = 0;
  while (n > 0) {
    ssize_t w = f->sock        ? send(f->fd, p, n, MSG_NOSIGNAL)
                : f->pos_known ? pwrite(f->fd, p, n, (off_t)f->kpos)
                               : write(f->fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      f->op.werr = true;
      return w < 0 ? -errno : UMS_EIO;
    }
    if (f->pos_known) f->kpos += w;
    f->op.wrote += w;
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
static int64_t sub_close(lfile *f) {
  lop *o = &f->op;
  int64_t r;
  if (o->sub == 0) {
    o->sub = 1;
    if (f->owner && ums_cancelled()) {
      o->err2 = flush_plain(f);
      goto plain;
    }
  }
  if (o->sub == 1) {
    r = sub_flush(f);
    if (r == AGAIN) return r;
    o->err2 = r;
    /* cancelled during the flush: the close goes the plain way */
    if (r == UMS_ECANCELED && f->owner) goto plain;
    if (f->sharers > 0) {
      r = 0;
      goto hand_over;
    }
    if (f->sock) goto sock;
    o->sub = 2;
    o->io = (lio){.kind = IO_CLOSE, .fd = f->fd};
    f->fd = -1;
    return AGAIN;
  }
  if (!op_answer(f, &r)) r = UMS_EIO;  /* a close is answered, always */
  ums_buf_release(f->buf);
  f->buf = NULL;
  return o->err2 ? o->err2 : r;
plain:
  if (f->sharers > 0) {
    r = 0;
    goto hand_over;
  }
  r = close(f->fd) == 0 ? 0 : -errno;
  f->fd = -1;
  ums_buf_release(f->buf);
  f->buf = NULL;
  return o->err2 ? o->err2 : r;
sock:
  /* ums_net_close, not a close request: it also ends what this
  ** scheduler still has waiting on the descriptor. It parks only for a
  ** socket that lingers, on the task's worker. */
  if (f->owner) lums_before_block(f->owner);
  r = ums_net_close(f->fd, UMS_FOREVER);
  if (f->owner) lums_become_current(f->owner);
  f->fd = -1;
  ums_buf_release(f->buf);
  f->buf = NULL;
  return o->err2 ? o->err2 : r;
hand_over:
  /* pread_into calls of other tasks still use the descriptor: closing it
  ** now would let a new open reuse its number under them. The file is
  ** closed for Lua at once; the last reader closes the descriptor. */
  f->orphan_fd = f->fd;
  f->fd = -1;
  ums_buf_release(f->buf);
  f->buf = NULL;
  return o->err2 ? o->err2 : r;
}

/* Opens op.path for a file made before its descriptor: 0 or an error. */
static int64_t sub_open(lfile *f) {
  lop *o = &f->op;
  int64_t r;
  if (op_answer(f, &r)) {
    if (r < 0) return r;
    f->fd = (int)r;
    f->append = (o->oflags & O_APPEND) != 0;
    f->kpos = 0;
    /* A stream cannot seek (ESPIPE): it keeps the kernel's position. */
    f->pos_known = !f->append && lseek(f->fd, 0, SEEK_CUR) == 0;
    return 0;
  }
  o->io = (lio){.kind = IO_OPEN, .path = o->path, .flags = o->oflags,
                .mode = o->omode};
  return AGAIN;
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
static int64_t fmt_line(lua_State *L, lfile *f, bool keep) {
  lop *o = &f->op;
  for (;;) {
    if (f->rpos == f->rlen) {
      int64_t r = sub_fill(f);
      if (r == AGAIN || r < 0) return r;
      if (r == 0) {
        bool any = o->acclen > 0;
        push_acc(L, f);
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
        int64_t r = acc_add(f, data, k + (keep ? 1 : 0));
        if (r) return r;
        push_acc(L, f);
      }
      f->rpos += k + 1;
      return 1;
    }
    int64_t r = acc_add(f, data, avail);
    if (r) return r;
    f->rpos = f->rlen;
  }
}

enum { COUNT_START = 0, COUNT_DIRECT, COUNT_GATHER };

/* Up to n bytes (n > 0). A big count with nothing read ahead goes
** straight from the kernel into one page-aligned buffer of n bytes, then
** one copy into the string. */
static int64_t fmt_count(lua_State *L, lfile *f, size_t n) {
  lop *o = &f->op;
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
      if ((r = acc_reserve(f, n))) return r;
    } else {
      o->sub = COUNT_GATHER;
      if ((r = acc_add(f, data + f->rpos, avail))) return r;
      f->rpos = f->rlen;
    }
  }
  if (o->sub == COUNT_DIRECT) {
    /* Until n bytes or the end of file; an error after some data ends
    ** the read with that data. */
    if (op_answer(f, &r)) {
      if (r > 0) o->acclen += (size_t)r;
      if (r < 0 && o->acclen == 0) return r;
      if (r <= 0) n = o->acclen;
    }
    if (o->acclen < n)
      return ask_rw(f, IO_READ, o->acc, o->acclen, n - o->acclen,
                    UMS_FS_CUR);
    if (o->acclen == 0) {
      lua_pushnil(L);
      return 0;
    }
    push_acc(L, f);
    return 1;
  }
  /* COUNT_GATHER: small pieces through the file buffer, big ones
  ** straight into the accumulator. */
  while (o->acclen < n) {
    size_t want = n - o->acclen;
    if (want < BUF_SIZE) {
      if (f->rpos == f->rlen) {
        r = sub_fill(f);
        if (r == AGAIN || r < 0) return r;
        if (r == 0) break;
      }
      size_t avail = f->rlen - f->rpos;
      size_t k = avail < want ? avail : want;
      if ((r = acc_add(f, data + f->rpos, k))) return r;
      f->rpos += k;
    } else {
      if (op_answer(f, &r)) {
        if (r < 0) return r;
        if (r == 0) break;
        o->acclen += (size_t)r;
        continue;
      }
      size_t chunk = want < CHUNK_MAX ? want : CHUNK_MAX;
      if ((r = acc_reserve(f, o->acclen + chunk))) return r;
      return ask_rw(f, IO_READ, o->acc, o->acclen, chunk, UMS_FS_CUR);
    }
  }
  bool any = o->acclen > 0;
  push_acc(L, f);
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
static int64_t fmt_all(lua_State *L, lfile *f) {
  lop *o = &f->op;
  char *data = ums_buf_data(f->buf);
  int64_t r;
  if (!o->sized) {
    o->sized = true;
    o->end_at = known_end(f);
  }
  while (o->sub == 0) {
    if (f->rlen - f->rpos == ums_buf_size(f->buf)) {
      /* Full: its bytes go to the accumulator. */
      if ((r = acc_add(f, data + f->rpos, f->rlen - f->rpos))) return r;
      f->rpos = f->rlen;
      if (o->acclen >= ALL_BUFFERED) {
        o->sub = 1;
        o->done = ALL_BUFFERED;
        break;
      }
    }
    r = sub_fill(f);
    if (r == AGAIN || r < 0) return r;
    if (r == 0 || (f->pos_known && f->kpos == o->end_at &&
                   (size_t)r < o->io.len)) {
      size_t avail = f->rlen - f->rpos;
      if (o->acclen == 0) {
        lua_pushlstring(L, data + f->rpos, avail);
      } else {
        if ((r = acc_add(f, data + f->rpos, avail))) return r;
        push_acc(L, f);
      }
      f->rpos = f->rlen;
      return 1;
    }
  }
  if (op_answer(f, &r)) {
    if (r < 0) return r;
    if (r == 0 || (f->pos_known && f->kpos == o->end_at &&
                   (size_t)r < o->io.len)) {
      o->acclen += (size_t)r;
      push_acc(L, f);
      return 1;
    }
    o->acclen += (size_t)r;
    if (o->done < CHUNK_MAX) o->done *= 2;
  }
  if ((r = acc_reserve(f, o->acclen + o->done))) return r;
  return ask_rw(f, IO_READ, o->acc, o->acclen, o->done, UMS_FS_CUR);
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

static int64_t fmt_number(lua_State *L, lfile *f) {
  lop *o = &f->op;
  int64_t r;
  if (o->sub == 0) {
    /* Skip white space. */
    for (;;) {
      if (f->rpos == f->rlen) {
        r = sub_fill(f);
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
    r = sub_fill(f);
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

static int64_t read_format(lua_State *L, lfile *f, int i) {
  if (lua_type(L, i) == LUA_TNUMBER) {
    size_t n = (size_t)lua_tointeger(L, i);
    if (n > 0) return fmt_count(L, f, n);
    /* io's test for end of file */
    if (f->rpos == f->rlen) {
      int64_t r = sub_fill(f);
      if (r == AGAIN || r < 0) return r;
    }
    lua_pushliteral(L, "");
    return f->rpos < f->rlen;
  }
  const char *p = lua_tostring(L, i);
  if (*p == '*') p++;
  switch (*p) {
    case 'n': return fmt_number(L, f);
    case 'a': return fmt_all(L, f);
    default: return fmt_line(L, f, *p == 'L');
  }
}

/* Stack: file, then the formats (read, lines) or values (write). */
static void items_init(lua_State *L, lfile *f) {
  f->op.i = 2;
  f->op.last = lua_gettop(L);
}

/* file:read(...) with the formats of io: "n", "l", "L", "a" (with or
** without a leading '*'), or a byte count. */
static int step_read(lua_State *L, lfile *f) {
  lop *o = &f->op;
  if (o->phase == 0) {
    /* Nothing pending. */
    int64_t r = sub_flush(f);
    if (r == AGAIN) return STEP_IO;
    if (!r) r = ensure_buf(f);
    if (r) {
      o->err = r;
      return 0;
    }
    o->phase = 1;
    o->first = lua_gettop(L) + 1;
  }
  while (o->i <= o->last) {
    int64_t r = read_format(L, f, o->i);
    if (r == AGAIN) return STEP_IO;
    if (r < 0) {
      o->err = r;
      return 0;
    }
    op_next_item(o);
    o->i++;
    if (r == 0) {
      /* fail: io returns nil for the format that failed, and stops */
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

static const lmethod m_read = {items_init, step_read, done_result, false};

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
  return method_start(L, f, &m_read);
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

/* Writes s[done, len) in chunks, each copied into the accumulator (a
** page-aligned buffer the kernel can own), at off + done (off < 0: at the
** file position). Progress in op.done. */
static int64_t write_chunks(lfile *f, const char *s, size_t len,
                            int64_t off) {
  lop *o = &f->op;
  for (;;) {
    if (o->acclen == 0) {
      if (o->done == len) return 0;
      size_t chunk = len - o->done < CHUNK_MAX ? len - o->done : CHUNK_MAX;
      int64_t r = acc_reserve(f, chunk);
      if (r) return r;
      memcpy(ums_buf_data(o->acc), s + o->done, chunk);
      o->acclen = chunk;
    }
    int64_t r = sub_write_acc(f, off < 0 ? off : off + (int64_t)o->done);
    if (r) return r;
    o->done += o->acclen;
    o->acclen = 0;
  }
}

/* Appends s to the pending writes, writing out what does not fit; big
** strings go out directly. */
static int64_t write_bytes(lfile *f, const char *s, size_t len) {
  lop *o = &f->op;
  char *data = ums_buf_data(f->buf);
  /* A socket's read-ahead holds the buffer (step_write). */
  if (o->sub == 0 && f->rpos < f->rlen) o->sub = 2;
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
      int64_t r = sub_flush(f);
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
      return write_chunks(f, s, len, UMS_FS_CUR);
  }
}

/* Stack: file, values; the values were checked. */
static int step_write(lua_State *L, lfile *f) {
  lop *o = &f->op;
  if (o->phase == 0) {
    /* No read-ahead: a file's position goes back to the logical one. A
    ** socket's read-ahead is the other direction's and stays: while it
    ** is there, writes go out unbuffered (write_bytes). */
    if (!f->sock)
      drop_readahead(f);
    else if (f->rpos == f->rlen)
      f->rpos = f->rlen = 0;
    int64_t r = ensure_buf(f);
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
    int64_t r = write_bytes(f, s, len);
    if (r == AGAIN) return STEP_IO;
    if (r < 0) {
      o->err = r;
      return 0;
    }
    if (f->vbuf == LSTREAM_LINE && memchr(s, '\n', len)) o->flush_end = true;
    op_next_item(o);
    o->i++;
  }
  if (f->vbuf == LSTREAM_NO || o->flush_end) {
    int64_t r = sub_flush(f);
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

static const lmethod m_write = {items_init, step_write, done_write, false};

/* file:write(...): strings and numbers, as io's. Returns the file. */
int lstream_write(lua_State *L) {
  lfile *f = check_file(L, 1);
  sock_need_task(L, f, "net.write");
  int nargs = lua_gettop(L);
  for (int i = 2; i <= nargs; i++) {
    if (lua_type(L, i) != LUA_TNUMBER) luaL_checkstring(L, i);
  }
  if (!f->writable) return push_fail(L, NULL, UMS_EBADF);
  return method_start(L, f, &m_write);
}

/* ---------------------------------------------------------------------- */
/* flush, seek, sync                                                       */
/* ---------------------------------------------------------------------- */

static int step_flush(lua_State *L, lfile *f) {
  int64_t r = sub_flush(f);
  if (r == AGAIN) return STEP_IO;
  f->op.err = r;
  if (!r) lua_pushboolean(L, 1);
  return 1;
}

static const lmethod m_flush = {NULL, step_flush, done_result, false};

/* file:flush() -> true | nil, msg, errno (io's result, not the file) */
int lstream_flush(lua_State *L) {
  lfile *f = check_file(L, 1);
  sock_need_task(L, f, "net.flush");
  return method_start(L, f, &m_flush);
}

/* Stack: file, whence (an option index, pushed by f_seek), offset. */
static int step_seek(lua_State *L, lfile *f) {
  static const int mode[] = {SEEK_SET, SEEK_CUR, SEEK_END};
  int64_t r = sub_flush(f);
  if (r == AGAIN) return STEP_IO;
  if (r) {
    f->op.err = r;
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
      f->op.err = UMS_EINVAL;
      return 0;
    }
    pos = f->kpos + off;
  } else {
    pos = lseek(f->fd, (off_t)off, mode[op]);
    if (pos < 0) {
      /* Nothing moved. */
      f->op.err = -errno;
      return 0;
    }
  }
  f->kpos = pos;
  f->pos_known = !f->append;
  lua_pushinteger(L, (lua_Integer)pos);
  return 1;
}

static const lmethod m_seek = {NULL, step_seek, done_result, false};

/* file:seek([whence [, offset]]) -> position */
static int f_seek(lua_State *L) {
  static const char *const modenames[] = {"set", "cur", "end", NULL};
  lfile *f = check_file(L, 1);
  int op = luaL_checkoption(L, 2, "cur", modenames);
  lua_Integer off = luaL_optinteger(L, 3, 0);
  lua_settop(L, 1);
  lua_pushinteger(L, op);
  lua_pushinteger(L, off);
  return method_start(L, f, &m_seek);
}

/* Phase 0 of a method that wants this file's pending writes in the
** kernel before its own I/O (program order, as pread(2) after write(2) on
** the descriptor): STEP_IO while they go out, 0 with the error in op.err,
** or 1 once they are out (phase 1). */
static int flush_first(lfile *f) {
  lop *o = &f->op;
  int64_t r = sub_flush(f);
  if (r == AGAIN) return STEP_IO;
  if (r) {
    o->err = r;
    return 0;
  }
  o->phase = 1;
  return 1;
}

/* file:sync() -> true: pending writes out, then fsync. */
static int step_sync(lua_State *L, lfile *f) {
  lop *o = &f->op;
  int64_t r;
  if (o->phase == 0) {
    int st = flush_first(f);
    if (st != 1) return st;
    o->io = (lio){.kind = IO_FSYNC, .fd = f->fd};
    return STEP_IO;
  }
  if (!op_answer(f, &r)) r = UMS_EIO;
  if (r) {
    o->err = r;
    return 0;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static const lmethod m_sync = {NULL, step_sync, done_result, false};

static int f_sync(lua_State *L) {
  lfile *f = check_file(L, 1);
  return method_start(L, f, &m_sync);
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
** leaves the descriptor to the last reader (sub_close), so its number is
** not reused under them. Outside a task, or when the file is busy,
** m_read_into runs under the lock.
**
** pread (a string) stays under the lock: it needs a buffer of its own per
** read, and 64 of them in flight at once (64 tasks, 1 MiB each) put every
** byte through a 64 MiB working set twice (the kernel's copy, then the
** string's): 0.33-0.38x the C read loop against 0.62-0.67x one at a time
** (bench_fs.lua big64, one VM on scheduler 0). */

enum { SH_FILE = 1, SH_BUF, SH_N, SH_OFF, SH_DONE, SH_FD };

static bool can_share(lfile *f) {
  return lums_cur_task && !held(f) && f->wlen == 0 && !f->waiters.head;
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
  if (res < 0) return fail(L, NULL, res);
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
    lums_before_block(me);
    ums_park_wait();
    lums_become_current(me);
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
static int step_pread(lua_State *L, lfile *f) {
  lop *o = &f->op;
  size_t n = (size_t)lua_tointeger(L, 2);
  lua_Integer off = lua_tointeger(L, 3);
  int64_t r;
  if (o->phase == 0) {
    int st = flush_first(f);
    if (st != 1) return st;
  } else if (op_answer(f, &r)) {
    if (r < 0) {
      o->err = r;
      return 0;
    }
    if (r == 0) goto out;
    o->acclen += (size_t)r;
  }
  if (o->acclen < n && off <= LUA_MAXINTEGER - (lua_Integer)o->acclen) {
    size_t want = n - o->acclen < CHUNK_MAX ? n - o->acclen : CHUNK_MAX;
    if ((r = acc_reserve(f, o->acclen + want))) {
      o->err = r;
      return 0;
    }
    ask_rw(f, IO_READ, o->acc, o->acclen, want,
           (int64_t)off + (int64_t)o->acclen);
    return STEP_IO;
  }
out:
  if (o->acclen == 0)
    lua_pushnil(L);
  else
    push_acc(L, f);
  return 1;
}

static const lmethod m_pread = {NULL, step_pread, done_result, false};

/* file:pread(n, offset) -> string (shorter only at the end of the file;
** nil when offset is at or past it) | nil, msg, errno. Does not move the
** file's position. */
static int f_pread(lua_State *L) {
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
  return method_start(L, f, &m_pread);
}

/* Stack: file, s, offset. */
static int step_pwrite(lua_State *L, lfile *f) {
  lop *o = &f->op;
  size_t len;
  const char *s = lua_tolstring(L, 2, &len);
  int64_t r;
  if (o->phase == 0) {
    /* Program order: this file's pending writes go out first, and its
    ** read-ahead, which the write may change, is dropped. */
    r = sub_flush(f);
    if (r == AGAIN) return STEP_IO;
    drop_readahead(f);
    if (r) {
      o->err = r;
      return 0;
    }
    o->phase = 1;
  }
  r = write_chunks(f, s, len, (int64_t)lua_tointeger(L, 3));
  if (r == AGAIN) return STEP_IO;
  if (r) {
    o->err = r;
    return 0;
  }
  lua_pushinteger(L, (lua_Integer)len);
  return 1;
}

static const lmethod m_pwrite = {NULL, step_pwrite, done_result, false};

/* file:pwrite(s, offset) -> bytes written | nil, msg, errno */
static int f_pwrite(lua_State *L) {
  lfile *f = check_file(L, 1);
  luaL_checkstring(L, 2);
  lua_Integer off = luaL_checkinteger(L, 3);
  luaL_argcheck(L, off >= 0, 3, "offset must not be negative");
  if (!f->writable) return push_fail(L, NULL, UMS_EBADF);
  lua_settop(L, 3);
  return method_start(L, f, &m_pwrite);
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
static int step_read_into(lua_State *L, lfile *f) {
  lop *o = &f->op;
  size_t cap;
  ums_buf_t *b = lums_test_buf(L, 2, &cap);
  size_t n = (size_t)lua_tointeger(L, 3);
  int64_t off = (int64_t)lua_tointeger(L, 4);
  int64_t r;
  if (o->phase == 0) {
    int st = flush_first(f);
    if (st != 1) return st;
    if (off < 0 && f->rpos < f->rlen) {
      /* What was read ahead comes first, as with any read. */
      size_t k = f->rlen - f->rpos < n ? f->rlen - f->rpos : n;
      memcpy(ums_buf_data(b), (char *)ums_buf_data(f->buf) + f->rpos, k);
      f->rpos += k;
      o->done = k;
    }
  } else if (op_answer(f, &r)) {
    if (r < 0 && o->done == 0) {
      o->err = r;
      return 0;
    }
    if (r <= 0) goto out;
    o->done += (size_t)r;
  }
  if (o->done < n && (off < 0 || off <= INT64_MAX - (int64_t)o->done)) {
    ask_rw(f, IO_READ, b, o->done, n - o->done,
           off < 0 ? UMS_FS_CUR : off + (int64_t)o->done);
    return STEP_IO;
  }
out:
  lua_pushinteger(L, (lua_Integer)o->done);
  return 1;
}

static const lmethod m_read_into = {NULL, step_read_into, done_result,
                                    false};

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
  return method_start(L, f, &m_read_into);
}

/* file:read_into(buf [, n]) -> bytes read into buf[0, n) (n defaults to
** #buf; 0 at the end of the file) | nil, msg, errno. Reads at the file
** position and moves it, after what file:read has read ahead. */
static int f_read_into(lua_State *L) {
  lfile *f = check_file(L, 1);
  lua_Integer n = check_into(L);
  return start_into(L, f, n, -1);
}

/* file:pread_into(buf, n, offset) -> bytes read into buf[0, n) (n nil:
** #buf; 0 at or past the end of the file) | nil, msg, errno. Does not
** move the file's position. */
static int f_pread_into(lua_State *L) {
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

static int step_close(lua_State *L, lfile *f) {
  (void)L;
  /* another task may have closed it while this one waited (__close) */
  if (f->fd < 0 && f->op.sub == 0) return 0;
  int64_t r = sub_close(f);
  if (r == AGAIN) return STEP_IO;
  f->op.err = r;
  return 0;
}

static int done_close(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  (void)nres;
  if (err) return fail(L, NULL, err);  /* closed all the same */
  lua_pushboolean(L, 1);
  return 1;
}

static const lmethod m_close = {NULL, step_close, done_close, false};

int lstream_close(lua_State *L) {
  lfile *f = check_file(L, 1);
  return method_start(L, f, &m_close);
}

/* __close (a <close> variable going out of scope): file:close, which may
** wait like any method; an error closing is raised. */
static int done_tbc(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  (void)nres;
  if (err) {
    check_cancel(L, err);
    return luaL_error(L, "ums.fs: closing the file: %s",
                      strerror((int)-err));
  }
  return 0;
}

static const lmethod m_tbc = {NULL, step_close, done_tbc, true};

int lstream_tbc(lua_State *L) {
  lfile *f = lstream_to(L, 1);
  if (!f || f->fd < 0) return 0;
  lua_settop(L, 1);
  return method_start(L, f, &m_tbc);
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
    if (!f->sock) flush_plain(f);
    close(f->fd);
    f->fd = -1;
  }
  /* Only a reader whose coroutine was collected mid-read leaves this. */
  if (f->orphan_fd >= 0) {
    close(f->orphan_fd);
    f->orphan_fd = -1;
  }
  ums_buf_release(f->buf);
  f->buf = NULL;
  op_clear(&f->op);
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
    if (f->fd >= 0 && f->wlen > 0) flush_plain(f);
    atomic_store(&f->hold, FILE_FREE);
  }
  pthread_mutex_unlock(&open_lock);
}

static void register_flush_at_exit(void) { atexit(flush_at_exit); }

static int f_tostring(lua_State *L) {
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

/* ---------------------------------------------------------------------- */
/* Raw reads and writes of sockets                                         */
/* ---------------------------------------------------------------------- */

/* Stack: stream, max. What the buffer holds, else one receive into it:
** up to max bytes, nil at the end of the stream. */
static int step_recv(lua_State *L, lfile *f) {
  lop *o = &f->op;
  if (o->phase == 0) {
    int st = flush_first(f);
    if (st != 1) return st;
    int64_t r = ensure_buf(f);
    if (r) {
      o->err = r;
      return 0;
    }
  }
  if (f->rpos == f->rlen) {
    int64_t r = sub_fill(f);
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
  size_t max = (size_t)lua_tointeger(L, 2);
  size_t avail = f->rlen - f->rpos;
  size_t k = avail < max ? avail : max;
  lua_pushlstring(L, (char *)ums_buf_data(f->buf) + f->rpos, k);
  f->rpos += k;
  return 1;
}

static const lmethod m_recv = {NULL, step_recv, done_result, false};

/* conn:recv([max]) -> string | nil (end of stream) | nil, msg, errno */
int lstream_recv(lua_State *L) {
  lfile *f = check_file(L, 1);
  lua_Integer max = luaL_optinteger(L, 2, BUF_SIZE);
  luaL_argcheck(L, max > 0, 2, "size must be positive");
  sock_need_task(L, f, "net.recv");
  lua_settop(L, 1);
  lua_pushinteger(L, max);
  return method_start(L, f, &m_recv);
}

/* Stack: stream, data, i, j (checked). Pending writes first, then
** data[i, j] unbuffered; the result counts data's bytes only. */
static int step_send(lua_State *L, lfile *f) {
  lop *o = &f->op;
  if (o->phase == 0) {
    int st = flush_first(f);
    if (st != 1) return st;
    o->wrote = 0;
  }
  size_t len;
  const char *s = lua_tolstring(L, 2, &len);
  size_t i = (size_t)lua_tointeger(L, 3), j = (size_t)lua_tointeger(L, 4);
  int64_t r = write_chunks(f, s + i - 1, j - i + 1, UMS_FS_CUR);
  if (r == AGAIN) return STEP_IO;
  if (r) {
    o->err = r;
    return 0;
  }
  lua_pushinteger(L, (lua_Integer)o->wrote);
  return 1;
}

static const lmethod m_send = {NULL, step_send, done_result, false};

/* conn:send(data [, i [, j]]) -> count | nil, msg, errno, sent; i and j
** as string.sub's. */
int lstream_send(lua_State *L) {
  lfile *f = check_file(L, 1);
  size_t len;
  luaL_checklstring(L, 2, &len);
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
  return method_start(L, f, &m_send);
}

/* conn:drain() -> what the read buffer holds ("" when nothing, or while
** another task's method has the stream), without waiting. */
int lstream_drain(lua_State *L) {
  lfile *f = check_file(L, 1);
  if (held(f) || !f->buf || f->rpos == f->rlen) {
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
static void lines_init(lua_State *L, lfile *f) {
  items_init(L, f);
  f->op.close_at_end = lua_toboolean(L, lua_upvalueindex(3));
}

static int step_lines(lua_State *L, lfile *f) {
  lop *o = &f->op;
  if (o->phase != PH_CLOSING) {
    int n = step_read(L, f);
    if (n == STEP_IO || o->err) return n;
    if (n >= 1 && !lua_isnil(L, o->first)) return n;
    /* End of file (or a format that failed). */
    lua_settop(L, o->first - 1);
    if (!o->close_at_end || f->fd < 0) return 0;
    o->phase = PH_CLOSING;
    op_next_item(o);
  }
  if (sub_close(f) == AGAIN) return STEP_IO;
  return 0;  /* an error closing is not the loop's business */
}

static int done_lines(lua_State *L, lfile *f, int nres, int64_t err) {
  if (err) {
    file_check_cancel(L, f, err);
    return luaL_error(L, "%s", strerror((int)-err));
  }
  return nres;
}

static const lmethod m_lines = {lines_init, step_lines, done_lines, false};

/* Whether m gathers received bytes in op.acc (keep_after_timeout). */
static bool reads(const lmethod *m) { return m == &m_read || m == &m_lines; }

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
  return method_start(L, f, &m_lines);
}

static void push_lines(lua_State *L, int file, int first, bool close) {
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
  push_lines(L, 1, 2, false);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Opening, and whole files                                                */
/* ---------------------------------------------------------------------- */

/* io's modes: r, w, a, optionally +, then any number of b. */
static bool parse_mode(const char *m, int *flags, bool *rd, bool *wr) {
  int acc;
  switch (*m++) {
    case 'r': acc = O_RDONLY; *flags = 0; *rd = true; *wr = false; break;
    case 'w': acc = O_WRONLY; *flags = O_CREAT | O_TRUNC; *rd = false;
              *wr = true; break;
    case 'a': acc = O_WRONLY; *flags = O_CREAT | O_APPEND; *rd = false;
              *wr = true; break;
    default: return false;
  }
  if (*m == '+') {
    m++;
    acc = O_RDWR;
    *rd = *wr = true;
  }
  while (*m == 'b') m++;
  *flags |= acc;
  return *m == '\0';
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

/* Pushes a file whose descriptor its open method will set. */
static lfile *new_file(lua_State *L, bool rd, bool wr) {
  return lstream_new(L, -1, rd, wr, false, FILE_MT);
}

/* Stack: path, ..., the new file. */
static int step_open(lua_State *L, lfile *f) {
  (void)L;
  int64_t r = sub_open(f);
  if (r == AGAIN) return STEP_IO;
  f->op.err = r;
  return 1;  /* the file, on top */
}

static int done_open(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  if (err) return fail(L, lua_tostring(L, 1), err);
  return nres;
}

static void open_init(lua_State *L, lfile *f);

static const lmethod m_open = {open_init, step_open, done_open, true};

/* The open's path, flags and mode: the path at index 1; the flags and
** mode from the file's access and the method. */
static void open_init(lua_State *L, lfile *f) {
  lop *o = &f->op;
  o->path = lua_tostring(L, 1);
  o->omode = 0666;
  if (o->m == &m_open) {
    bool rd, wr;
    parse_mode(luaL_optstring(L, 2, "r"), &o->oflags, &rd, &wr);
  } else if (f->writable) {
    o->oflags = O_WRONLY | O_CREAT | O_TRUNC;
  } else {
    o->oflags = O_RDONLY;
  }
}

/* ums.fs.open(path [, mode]) -> file | nil, msg, errno */
static int fs_open(lua_State *L) {
  luaL_checkstring(L, 1);
  const char *mode = luaL_optstring(L, 2, "r");
  int flags = 0;
  bool rd = false, wr = false;
  luaL_argcheck(L, parse_mode(mode, &flags, &rd, &wr), 2, "invalid mode");
  lua_settop(L, 2);
  return method_start(L, new_file(L, rd, wr), &m_open);
}

/* ums.fs.lines(path, ...) -> iterator that closes the file at its end;
** raises when the file cannot be opened, as io.lines does. */
static int done_lines_open(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  (void)nres;
  if (err) {
    check_cancel(L, err);
    return luaL_error(L, "%s: %s", lua_tostring(L, 1),
                      strerror((int)-err));
  }
  lua_replace(L, 1);  /* the file, in place of the path */
  push_lines(L, 1, 2, true);
  lua_pushnil(L);
  lua_pushnil(L);
  lua_pushvalue(L, 1);  /* to-be-closed value of the generic for */
  return 4;
}

static const lmethod m_lines_open = {open_init, step_open, done_lines_open,
                                     true};

static int fs_lines(lua_State *L) {
  luaL_checkstring(L, 1);
  lfile *f = new_file(L, true, false);
  return method_start(L, f, &m_lines_open);
}

/* ums.fs.readfile(path) through the file: what ums_fs_readfile leaves
** (a file larger than its buffer, or one that cannot be read at an
** offset: then its descriptor, already open). Stack: path, file. */
static int step_readfile(lua_State *L, lfile *f) {
  lop *o = &f->op;
  int64_t r;
  switch (o->phase) {
    case 0:
      r = f->fd >= 0 ? 0 : sub_open(f);
      if (r == AGAIN) return STEP_IO;
      if (!r) r = ensure_buf(f);
      if (r) {
        o->err = r;
        if (f->fd < 0) return 0;
        o->phase = 2;  /* opened, no buffer: close it */
        break;
      }
      o->phase = 1;
      op_next_item(o);
      /* fall through */
    case 1:
      r = fmt_all(L, f);
      if (r == AGAIN) return STEP_IO;
      if (r < 0) o->err = r;
      o->phase = 2;
      op_next_item(o);
      break;
  }
  r = sub_close(f);
  if (r == AGAIN) return STEP_IO;
  if (!o->err) o->err = r;
  return 1;
}

static int done_path_result(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  if (err) return fail(L, lua_tostring(L, 1), err);
  return nres;
}

static const lmethod m_readfile = {open_init, step_readfile,
                                   done_path_result, true};

/* ums.fs.readfile(path) -> string | nil, msg, errno. A file that fits
** in BUF_SIZE, nearly every small file, is one request of the runtime
** (ums_fs_readfile: open, read, read at the end, close; on io_uring one
** chain, so the task parks once instead of four times), read into a
** page-aligned buffer and copied once into the string.
**
** Who holds the caller's buffer reference while the task is parked: in a
** task, the task itself (ltask.rfbuf), not a Lua object: a userdata with
** a __gc per call cost an allocation, a metatable and a finalizer call
** per file, and every object with a finalizer costs the collector more
** (callgrind, 64 tasks reading 4 KiB files: 5,975 -> 4,310 instructions
** per file). The call's end releases it. A raise between (no memory for
** the string) leaves it in the slot until the task ends
** (give_back_task). While the slot is taken (by that, or by a readfile
** of this task that a finalizer run from inside this one interrupted) a
** call uses a box on the stack instead, collected if it raises, as it
** does outside a task. The request holds its own reference while it
** runs either way. */
#define RFBUF_MT "ums.fs.readbuf"

typedef struct rfbuf {
  ums_buf_t *b;
} rfbuf;

static int rfbuf_gc(lua_State *L) {
  rfbuf *box = (rfbuf *)luaL_checkudata(L, 1, RFBUF_MT);
  ums_buf_release(box->b);
  box->b = NULL;
  return 0;
}

/* r is ums_fs_readfile's result into *owner's buffer, fd its descriptor.
** *owner holds the caller's reference, dropped here after the copy (a
** raise in it leaves the buffer with its owner). Stack: path at 1. */
static int readfile_result(lua_State *L, int64_t r, int fd,
                           ums_buf_t **owner) {
  ums_buf_t *b = *owner;
  if (r >= 0) lua_pushlstring(L, ums_buf_data(b), (size_t)r);
  *owner = NULL;
  ums_buf_release(b);
  if (r >= 0) return 1;
  if (r != UMS_EFBIG && r != UMS_ESPIPE) return fail(L, lua_tostring(L, 1), r);
  /* Larger than the buffer, or a stream: through a file, as io would. */
  lua_settop(L, 1);
  lfile *f = new_file(L, true, false);  /* closes it if we raise */
  if (r == UMS_ESPIPE) f->fd = fd;
  return method_start(L, f, &m_readfile);
}

/* The continuation of a call whose buffer the task holds. */
static int readfile_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  int fd = -1;
  int64_t r = ums_fs_readfile_end((ums_fs_req_t *)ctx, &fd);
  return readfile_result(L, r, fd, &lums_cur_task->rfbuf);
}

/* The continuation of a call whose buffer a box holds. Stack: path, box. */
static int readfile_box_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  int fd = -1;
  int64_t r = ums_fs_readfile_end((ums_fs_req_t *)ctx, &fd);
  return readfile_result(L, r, fd, &((rfbuf *)lua_touserdata(L, 2))->b);
}

static int fs_readfile(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  lua_settop(L, 1);
  ltask *me = lums_cur_task;
  ums_buf_t **owner;
  if (me && !me->rfbuf) {
    owner = &me->rfbuf;
  } else {
    rfbuf *box = (rfbuf *)lua_newuserdatauv(L, sizeof *box, 0);
    box->b = NULL;
    luaL_setmetatable(L, RFBUF_MT);
    owner = &box->b;
  }
  if (!(*owner = ums_buf_new(BUF_SIZE))) return fail(L, path, UMS_ENOMEM);
  int fd = -1;
  if (!me) {
    int64_t r = ums_fs_readfile(path, *owner, &fd, UMS_FOREVER);
    return readfile_result(L, r, fd, owner);
  }
  ums_fs_req_t *req;
  int rc = ums_fs_readfile_begin(path, *owner, UMS_FOREVER, &req);
  if (rc) return readfile_result(L, rc, -1, owner);
  return lums_park_finish(L, me, (lua_KContext)req,
                          owner == &me->rfbuf ? readfile_k : readfile_box_k);
}

/* ums.fs.writefile(path, s) -> true | nil, msg, errno (truncates). Stack:
** path, s, file. */
static int step_writefile(lua_State *L, lfile *f) {
  lop *o = &f->op;
  int64_t r;
  switch (o->phase) {
    case 0:
      r = sub_open(f);
      if (r == AGAIN) return STEP_IO;
      if (!r) r = ensure_buf(f);
      if (r) {
        o->err = r;
        if (f->fd < 0) return 0;
        o->phase = 2;
        break;
      }
      o->phase = 1;
      op_next_item(o);
      /* fall through */
    case 1: {
      size_t len;
      const char *s = lua_tolstring(L, 2, &len);
      r = write_bytes(f, s, len);
      if (r == AGAIN) return STEP_IO;
      if (r < 0) o->err = r;
      o->phase = 2;
      op_next_item(o);
      break;
    }
  }
  r = sub_close(f);
  if (r == AGAIN) return STEP_IO;
  if (!o->err) o->err = r;
  lua_pushboolean(L, 1);
  return 1;
}

static const lmethod m_writefile = {open_init, step_writefile,
                                    done_path_result, true};

static int fs_writefile(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  lua_settop(L, 2);
  lfile *f = new_file(L, false, true);
  return method_start(L, f, &m_writefile);
}

/* ---------------------------------------------------------------------- */
/* The file system: one request at a time, the request as the context of  */
/* the continuation                                                        */
/* ---------------------------------------------------------------------- */

/* Waits for req, begun by the current task me, then k(L, LUA_YIELD, req):
** by yielding where Lua can, else on the worker. */
static int await(lua_State *L, ltask *me, ums_fs_req_t *req,
                 lua_KFunction k) {
  return lums_park_finish(L, me, (lua_KContext)req, k);
}

static const char *type_name(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "file";
    case S_IFDIR: return "directory";
    case S_IFLNK: return "link";
    case S_IFIFO: return "fifo";
    case S_IFSOCK: return "socket";
    case S_IFCHR: return "char device";
    case S_IFBLK: return "block device";
    default: return "other";
  }
}

static void set_time(lua_State *L, const char *k, int64_t ns) {
  lua_pushnumber(L, (lua_Number)ns / 1e9);
  lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, lua_Integer v) {
  lua_pushinteger(L, v);
  lua_setfield(L, -2, k);
}

/* stat's result (the path at index 1). */
static int stat_result(lua_State *L, int r, const ums_stat_t *st) {
  if (r < 0) return fail(L, lua_tostring(L, 1), r);
  lua_createtable(L, 0, 14);
  lua_pushstring(L, type_name(st->mode));
  lua_setfield(L, -2, "type");
  set_int(L, "size", (lua_Integer)st->size);
  set_int(L, "mode", (lua_Integer)(st->mode & 07777));
  set_int(L, "ino", (lua_Integer)st->ino);
  set_int(L, "dev", (lua_Integer)st->dev);
  set_int(L, "nlink", (lua_Integer)st->nlink);
  set_int(L, "uid", (lua_Integer)st->uid);
  set_int(L, "gid", (lua_Integer)st->gid);
  set_int(L, "blocks", (lua_Integer)st->blocks);
  set_int(L, "blksize", (lua_Integer)st->blksize);
  set_time(L, "atime", st->atime);
  set_time(L, "mtime", st->mtime);
  set_time(L, "ctime", st->ctime);
  return 1;
}

static int stat_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  ums_stat_t st;
  int r = ums_fs_stat_end((ums_fs_req_t *)ctx, &st);
  return stat_result(L, r, &st);
}

/* ums.fs.stat(path [, nofollow]) -> table | nil, msg, errno */
static int fs_stat(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  int flags = lua_toboolean(L, 2) ? UMS_FS_NOFOLLOW : 0;
  ltask *me = lums_cur_task;
  ums_stat_t st;
  if (!me) {
    int r = ums_fs_stat(path, flags, &st, UMS_FOREVER);
    return stat_result(L, r, &st);
  }
  ums_fs_req_t *req;
  int r = ums_fs_stat_begin(path, flags, UMS_FOREVER, &req);
  if (r) return stat_result(L, r, &st);
  return await(L, me, req, stat_k);
}

/* true, or the failure (the path at index 1). */
static int result(lua_State *L, int64_t r) {
  if (r < 0) return fail(L, lua_tostring(L, 1), r);
  lua_pushboolean(L, 1);
  return 1;
}

static int result_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  return result(L, ums_fs_end((ums_fs_req_t *)ctx));
}

/* remove: the rmdir's answer; the unlink's error is at the top. */
static int remove2_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  int64_t r2 = ums_fs_end((ums_fs_req_t *)ctx);
  int64_t r = lua_tointeger(L, -1);
  return result(L, r2 != UMS_ENOTDIR ? r2 : r);
}

/* remove: a directory's unlink fails with EISDIR (EPERM on some
** systems): then it is an rmdir. */
static int remove_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  int64_t r = ums_fs_end((ums_fs_req_t *)ctx);
  if (r != UMS_EISDIR && r != UMS_EPERM) return result(L, r);
  ums_fs_req_t *req;
  int rc = ums_fs_rmdir_begin(lua_tostring(L, 1), UMS_FOREVER, &req);
  if (rc) return result(L, rc != UMS_ENOTDIR ? rc : r);
  lua_settop(L, 1);
  lua_pushinteger(L, (lua_Integer)r);
  return await(L, lums_cur_task, req, remove2_k);
}

/* ums.fs.remove(path): a file, or an empty directory (as os.remove) */
static int fs_remove(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  ltask *me = lums_cur_task;
  if (!me) {
    int r = ums_fs_unlink(path, UMS_FOREVER);
    if (r == UMS_EISDIR || r == UMS_EPERM) {
      int r2 = ums_fs_rmdir(path, UMS_FOREVER);
      if (r2 != UMS_ENOTDIR) r = r2;
    }
    return result(L, r);
  }
  ums_fs_req_t *req;
  int r = ums_fs_unlink_begin(path, UMS_FOREVER, &req);
  if (r) return result(L, r);
  return await(L, me, req, remove_k);
}

static int fs_rename(lua_State *L) {
  const char *from = luaL_checkstring(L, 1);
  const char *to = luaL_checkstring(L, 2);
  ltask *me = lums_cur_task;
  if (!me) return result(L, ums_fs_rename(from, to, UMS_FOREVER));
  ums_fs_req_t *req;
  int r = ums_fs_rename_begin(from, to, UMS_FOREVER, &req);
  if (r) return result(L, r);
  return await(L, me, req, result_k);
}

static int fs_mkdir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  lua_Integer mode = luaL_optinteger(L, 2, 0777);
  luaL_argcheck(L, mode >= 0 && mode <= 07777, 2, "invalid mode");
  ltask *me = lums_cur_task;
  if (!me) return result(L, ums_fs_mkdir(path, (int)mode, UMS_FOREVER));
  ums_fs_req_t *req;
  int r = ums_fs_mkdir_begin(path, (int)mode, UMS_FOREVER, &req);
  if (r) return result(L, r);
  return await(L, me, req, result_k);
}

/* dir iterator: upvalues the list (a table of names) and the next index */
static int dir_iter(lua_State *L) {
  lua_Integer i = lua_tointeger(L, lua_upvalueindex(2));
  lua_pushinteger(L, i + 1);
  lua_replace(L, lua_upvalueindex(2));
  lua_rawgeti(L, lua_upvalueindex(1), i);
  return 1;
}

static int dir_result(lua_State *L, int r, ums_dirlist_t *list) {
  if (r < 0) return fail(L, lua_tostring(L, 1), r);
  lua_createtable(L, (int)(list->count < INT_MAX ? list->count : 0), 0);
  for (size_t i = 0; i < list->count; i++) {
    lua_pushstring(L, list->entries[i].name);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  ums_dirlist_free(list);
  lua_pushinteger(L, 1);
  lua_pushcclosure(L, dir_iter, 2);
  return 1;
}

static int dir_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  ums_dirlist_t *list = NULL;
  int r = ums_fs_readdir_end((ums_fs_req_t *)ctx, &list);
  return dir_result(L, r, list);
}

/* ums.fs.dir(path) -> iterator over the names ("." and ".." left out) |
** nil, msg, errno. The directory is read whole when dir is called. */
static int fs_dir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  ltask *me = lums_cur_task;
  ums_dirlist_t *list = NULL;
  int r;
  if (!me) {
    r = ums_fs_readdir(path, &list, UMS_FOREVER);
    return dir_result(L, r, list);
  }
  ums_fs_req_t *req;
  r = ums_fs_readdir_begin(path, UMS_FOREVER, &req);
  if (r) return dir_result(L, r, NULL);
  return await(L, me, req, dir_k);
}

/* ums.fs.type(v) -> "file" | "closed file" | nil, as io.type */
static int fs_type(lua_State *L) {
  luaL_checkany(L, 1);
  lfile *f = lstream_to(L, 1);
  if (!f)
    lua_pushnil(L);
  else if (f->fd < 0)
    lua_pushliteral(L, "closed file");
  else
    lua_pushliteral(L, "file");
  return 1;
}

void lums_open_fs(lua_State *L) {
  /* Once per process: the module stays mapped until the exit (lums.c pins
  ** it), so the handler is there when exit() calls it. */
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_flush_at_exit);
  static const luaL_Reg methods[] = {
      {"read", lstream_read},   {"write", lstream_write}, {"lines", lstream_lines},
      {"seek", f_seek},   {"flush", lstream_flush}, {"close", lstream_close},
      {"pread", f_pread}, {"pwrite", f_pwrite}, {"sync", f_sync},
      {"read_into", f_read_into}, {"pread_into", f_pread_into},
      {"setvbuf", lstream_setvbuf},
      {NULL, NULL}};
  static const luaL_Reg funcs[] = {
      {"open", fs_open},           {"lines", fs_lines},
      {"readfile", fs_readfile},   {"writefile", fs_writefile},
      {"stat", fs_stat},           {"remove", fs_remove},
      {"rename", fs_rename},       {"mkdir", fs_mkdir},
      {"dir", fs_dir},             {"type", fs_type},
      {NULL, NULL}};
  if (luaL_newmetatable(L, FILE_MT)) {
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, lstream_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, lstream_tbc);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, f_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, RFBUF_MT)) {
    lua_pushcfunction(L, rfbuf_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);

  luaL_newlib(L, funcs);
  lua_setfield(L, -2, "fs");
}
