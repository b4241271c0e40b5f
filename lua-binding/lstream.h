/*
** lstream.h: the buffered stream shared by ums.fs files (lfs.c) and
** ums.net connections (lnet.c). One implementation of io's reading and
** writing: the buffer, the read formats ("l", "L", "n", "a", a count),
** buffered writes, lines, setvbuf, and the lock that keeps one method at
** a time on a file (one reading and one writing method at a time on a
** socket), over the runtime's deferred I/O calls
** (ums_fs_*_begin for files, ums_net_recv_begin / ums_net_send_begin for
** sockets). lstream.c holds the engine (see its head comment); lfs.c
** opens files into streams and lnet.c sockets, with lstream_new, and each
** adds what only its kind has.
*/
#ifndef LSTREAM_H
#define LSTREAM_H

#include "lums.h"
#include "lwaitq.h"

#define BUF_SIZE (64 * 1024)
/* Largest single transfer asked of the runtime. */
#define CHUNK_MAX ((size_t)16 * 1024 * 1024)
#define FILE_MT "ums.fs.file"

/* A step's answer besides a result count: it asked for an I/O. */
#define STEP_IO (-1)
/* A sub-operation's answer while its I/O is asked for (no real result is
** this small). */
#define AGAIN INT64_MIN

/* setvbuf's modes: "full" (written when the buffer fills, on flush, read
** and close), "line" (also at the end of a write call that wrote a
** newline), "no" (at the end of every write call). */
enum { LSTREAM_FULL, LSTREAM_LINE, LSTREAM_NO };

typedef struct lfile lfile;
typedef struct lop lop;

enum { IO_READ, IO_WRITE, IO_CLOSE, IO_FSYNC, IO_OPEN };

/* The one I/O a step asks for. */
typedef struct lio {
  int kind;              /* IO_* */
  int fd;
  ums_buf_t *buf;        /* read, write: the file's buffer or the
                            method's accumulator; the request holds its
                            own reference until it really ends */
  size_t pos, len;
  int64_t off;           /* >= 0, or UMS_FS_CUR */
  bool at_pos;           /* read, write: at the file's position (off is
                            kpos, or UMS_FS_CUR while it is not known) */
  bool take;             /* a socket's read without a buffer: the runtime
                            takes one when data comes (op.taken) */
  const char *path;      /* open: anchored on the caller's Lua stack */
  int flags, mode;       /* open */
} lio;

/* The sides of a stream a method takes (lmethod.sides). A socket's two
** directions are independent: a reading method and a writing method may
** run at once, each holding its side. A file's methods all share its
** position and its one buffer: a file has one lock (side 0), whatever
** its methods say. */
enum { LSIDE_READ = 1, LSIDE_WRITE = 2, LSIDE_BOTH = 3 };

/* A method: how it runs once it holds the file. */
typedef struct lmethod {
  /* Sets up op from the arguments on the stack (NULL: nothing to do). */
  void (*init)(lua_State *L, lop *o);
  /* Runs the method on: returns STEP_IO after asking for an I/O, or the
  ** number of results pushed once it has ended (its error, if any, in
  ** op.err). Steps again after each I/O, with the answer in op.res. */
  int (*step)(lua_State *L, lop *o);
  /* After the file is given back: the call's results (may raise). */
  int (*done)(lua_State *L, lfile *f, int nres, int64_t err);
  /* A closed file is fine (the step copes): no "closed file" error. */
  bool closed_ok;
  /* The sides of a socket it takes (LSIDE_*). */
  int sides;
} lmethod;

/* The method running on a side of a stream. Touched only by the holder
** of that side (the task whose method holds it, or the host thread),
** from its first step to its last. */
struct lop {
  lfile *f;              /* the stream it runs on */
  const lmethod *m;
  int sides;             /* the sides it holds: its method's, and the
                            write side a socket's read takes to send
                            what is buffered (read_takes_writes) */
  ltask *owner;          /* the task whose method it is (NULL outside
                            tasks) */
  int phase;             /* the method's own progress */
  int sub;               /* progress inside the current format, argument
                            or close */
  int i, last;           /* read: the formats (stack indices); write: the
                            arguments */
  int first;             /* read: stack index of the first result */
  bool hit_eof;          /* read: a read in this format returned 0 */
  bool close_at_end;     /* lines: close the file at its end */
  bool flush_end;        /* write: flush at the end (setvbuf "line") */
  size_t done;           /* bytes of the current item done; read("a"):
                            the next chunk */
  bool sized;            /* read("a"): end_at was looked up */
  int64_t end_at;        /* read("a"): the file's size by fstat when the
                            format began (a regular file whose position
                            is known), else -1 */
  size_t wdone;          /* flush: pending bytes written so far */
  size_t wpos;           /* write_acc: accumulator bytes written so far */
  int64_t err;           /* the method's error (0: none) */
  int64_t deadline;      /* a socket's: when this call's I/O times out
                            (from lfile.timeout at the call's start,
                            its wait for the file included) */
  bool werr;             /* err is a write's: the result says how much
                            was written (wrote) */
  int64_t wrote;         /* bytes this method wrote into the file */
  int64_t err2;          /* close: the flush's error */
  const char *path;      /* open: the path (on the stack) */
  const char *src;       /* send: the bytes to send (in a string on the
                            stack) */
  size_t srclen;
  int oflags, omode;     /* open */
  ums_buf_t *acc;        /* data being gathered for a result, or a chunk
                            being written: the op's reference, dropped at
                            the method's end */
  size_t acclen;
  lio io;                /* the I/O asked for */
  bool answered;         /* res answers io, for the one who asked */
  int64_t res;
  ums_fs_req_t *req;     /* io in flight (a task), between begin and end */
  ums_buf_t *taken;      /* io.take answered with data: the buffer that
                            holds it, the op's reference until sub_fill
                            makes it the stream's */
};

/* One side of a stream: its lock (a FIFO of parked tasks) and the method
** holding it. [the VM's thread] */
typedef struct lside {
  bool busy;             /* a method holds it */
  lwaitq waiters;        /* tasks waiting for it, FIFO */
  lop op;                /* the method holding it, when it is the first
                            side that method holds */
} lside;

struct lfile {
  const char *tag;       /* &file_tag */
  int fd;                /* -1 once closed (and before an open ends) */
  bool readable, writable;
  ums_buf_t *buf;        /* BUF_SIZE bytes, made on first use; a
                            socket's goes while a read waits with it
                            empty (sub_fill) */
  size_t rpos, rlen;     /* unread read-ahead: buf[rpos, rlen) */
  size_t wlen;           /* pending writes: buf[0, wlen), or a socket's
                            wbuf[0, wlen) */
  ums_buf_t *wbuf;       /* a socket's pending writes, BUF_SIZE bytes,
                            made on first use (its read-ahead is the
                            read side's, in buf) */
  /* FILE_HELD while a method is using the file (side 0 is taken),
  ** FILE_EXIT while the exit handler writes its buffer, else FILE_FREE.
  ** [atomic; the VM's thread takes and gives it, the exit handler takes
  ** it only from FILE_FREE] */
  atomic_int hold;
  lfile *prev_open, *next_open;  /* open_files [open_lock] */
  /* Side 0 is a file's lock and a socket's read side; side 1 a
  ** socket's write side. A method takes its sides all at once, when all
  ** are free, so no task holds one while it waits for another. */
  lside side[2];
  /* A socket's close has begun while other tasks' methods held or
  ** waited for its sides: their I/O was cancelled (ums_net_cancel), and
  ** they end with "closed" without starting any more. */
  bool closing;
  /* A close whose task was cancelled while it waited for the sides: the
  ** close is left to the stream, made once no method holds or is about
  ** to take them (lstream.c, close_left). */
  bool close_left;
  int sharers;           /* pread_into calls in flight beside the file
                            lock ("Positional reads side by side") */
  int orphan_fd;         /* the descriptor of a file closed while sharers
                            read from it: the last of them closes it;
                            -1 when none */
  /* The file's position as the kernel would hold it (ahead of the
  ** logical one by the read-ahead, behind it by the pending writes),
  ** while pos_known: on a file that can seek and is not in append mode.
  ** This file keeps it itself, from the open on, and every read and write
  ** "at the position" is made at the explicit offset kpos: the kernel's
  ** own position is not used, because io_uring leaves it unchanged after
  ** a short write (a retry would then overwrite the file's start). The
  ** descriptor is this file's alone, so nothing else needs the kernel's
  ** position. A stream (pipe, socket, terminal) and a file in append mode
  ** (every write jumps to the end) use the kernel's position instead. */
  int64_t kpos;
  bool pos_known;
  bool append;           /* opened with O_APPEND */
  /* A connected socket (ums.net): its reads and writes are recv and send
  ** with the method's deadline, reading and writing are independent (a
  ** write keeps the read-ahead), its errors are worded for ums.net, it is
  ** not flushed at exit, and its finalizer closes without flushing. */
  bool sock;
  int64_t timeout;       /* a socket's per-call timeout in ns; -1: none */
  int vbuf;              /* LSTREAM_FULL, LSTREAM_LINE or LSTREAM_NO */
};


/* ---- The engine, for the files that make streams (lfs.c, lnet.c) ---- */

/* Once per process, before the first stream: the exit handler that
** writes what files still buffer (lstream.c, "Exit"). */
LUMS_HIDDEN void lstream_init(void);
/* Runs method m on f for the caller: takes the stream (waiting while
** another task's method holds it), then steps the method to its end. */
LUMS_HIDDEN int lstream_start(lua_State *L, lfile *f, const lmethod *m);
/* A runtime call failed with err: a cancelled task raises core.CANCELLED;
** lstream_fail pushes nil, "what: message", errno otherwise (returns 3). */
LUMS_HIDDEN void lstream_check_cancel(lua_State *L, int64_t err);
LUMS_HIDDEN int lstream_fail(lua_State *L, const char *what, int64_t err);
/* Sub-operations for a method's step (AGAIN while their I/O is asked
** for): the answer to the I/O asked for, the stream's buffer, a write
** through it, "a" to the end, flush and close. */
LUMS_HIDDEN bool lstream_answer(lop *o, int64_t *res);
LUMS_HIDDEN int64_t lstream_ensure_buf(lfile *f);
LUMS_HIDDEN int64_t lstream_write_bytes(lop *o, const char *s, size_t len);
LUMS_HIDDEN int64_t lstream_fmt_all(lua_State *L, lop *o);
LUMS_HIDDEN int64_t lstream_sub_close(lop *o);
/* The next format or argument starts from scratch. */
LUMS_HIDDEN void lstream_next_item(lop *o);
/* Pushes a lines iterator over the stream at index file with the formats
** from index first up; close: close it at the end. */
LUMS_HIDDEN void lstream_push_lines(lua_State *L, int file, int first,
                                    bool close);

/* Pushes a new stream over fd (-1: set later by its open) with
** metatable mt; sock: a socket (see lfile.sock). The stream owns fd. */
LUMS_HIDDEN lfile *lstream_new(lua_State *L, int fd, bool rd, bool wr,
                               bool sock, const char *mt);
/* The stream at idx, or NULL. */
LUMS_HIDDEN lfile *lstream_to(lua_State *L, int idx);
/* The open stream at idx (a method's self); raises for anything else,
** naming mt in a type error. */
LUMS_HIDDEN lfile *lstream_check(lua_State *L, int idx, const char *mt);
/* Pushes nil, message, errno for a failure of the runtime (err < 0) as
** ums.net words it: strerror in lower case, "timeout" for UMS_ETIMEDOUT;
** returns 3. */
LUMS_HIDDEN int lstream_push_netfail(lua_State *L, int64_t err);

/* The methods both kinds of stream have, as lua_CFunctions with the
** stream at index 1. */
LUMS_HIDDEN int lstream_read(lua_State *L);
LUMS_HIDDEN int lstream_write(lua_State *L);
LUMS_HIDDEN int lstream_lines(lua_State *L);
LUMS_HIDDEN int lstream_flush(lua_State *L);
LUMS_HIDDEN int lstream_close(lua_State *L);
LUMS_HIDDEN int lstream_setvbuf(lua_State *L);
LUMS_HIDDEN int lstream_gc(lua_State *L);
LUMS_HIDDEN int lstream_tbc(lua_State *L);
/* Methods of positioned streams (files): seek, sync, positional reads
** and writes, reads into a buffer, and __tostring. */
LUMS_HIDDEN int lstream_seek(lua_State *L);
LUMS_HIDDEN int lstream_sync(lua_State *L);
LUMS_HIDDEN int lstream_pread(lua_State *L);
LUMS_HIDDEN int lstream_pwrite(lua_State *L);
LUMS_HIDDEN int lstream_read_into(lua_State *L);
LUMS_HIDDEN int lstream_pread_into(lua_State *L);
LUMS_HIDDEN int lstream_file_tostring(lua_State *L);
/* Stream methods of sockets: the raw recv and send, and drain. */
LUMS_HIDDEN int lstream_recv(lua_State *L);
LUMS_HIDDEN int lstream_send(lua_State *L);
LUMS_HIDDEN int lstream_drain(lua_State *L);
LUMS_HIDDEN int lstream_buffers(lua_State *L);

#endif
