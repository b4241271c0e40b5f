/*
** lfs.c: ums.fs, files for tasks. The methods follow Lua's io library
** (read formats, write, lines, seek, flush, close) so code ports by
** changing io.open to ums.fs.open; every system call goes through the
** runtime's file I/O (io_uring, or the I/O pool), so a task that reads or
** writes parks only itself while its scheduler runs the others.
**
** Waiting: an I/O call parks the task on the worker it runs on (the
** runtime's ums_fs_* calls park with ums_park_wait, which binds the worker
** and lets another worker run the scheduler, DESIGN.md section 4). That
** works from every context, yieldable or not, at the price of a C stack
** per request in flight. Outside a task (the main thread outside ums.run)
** the same calls are plain system calls.
**
** A file is shared by the tasks that hold it: a per-file lock (a FIFO of
** parked tasks) keeps one method at a time on its buffer, so a log file
** written by many tasks gets whole writes, in order.
**
** Buffering is stdio's: one buffer per file, holding either read-ahead
** (the kernel's file position is ahead of the logical one by the unread
** bytes) or pending writes (behind it by the pending bytes). Reads and
** writes that are larger than the buffer go straight between the kernel
** and a page-aligned ums_buf, then one copy into (or from) the Lua string.
*/
#define _GNU_SOURCE
#include "lums.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_MT "ums.fs.file"
#define BUF_SIZE (64 * 1024)
/* Largest single transfer asked of the runtime. */
#define CHUNK_MAX ((size_t)16 * 1024 * 1024)

static const char file_tag = 0;

typedef struct lfile {
  const char *tag;       /* &file_tag */
  int fd;                /* -1 once closed */
  bool readable, writable;
  bool eof;              /* the last read hit end of file */
  ums_buf_t *buf;        /* BUF_SIZE bytes, made on first use */
  size_t rpos, rlen;     /* unread read-ahead: buf[rpos, rlen) */
  size_t wlen;           /* pending writes: buf[0, wlen) */
  bool busy;             /* a method is using the file */
  ltask *owner;          /* the task whose method holds it (NULL outside
                            tasks) */
  lwaitq waiters;        /* tasks waiting for it, FIFO */
} lfile;

/* ---------------------------------------------------------------------- */
/* Errors                                                                  */
/* ---------------------------------------------------------------------- */

/* Pushes nil, "what: message", errno (positive) as io does; returns 3. */
static int push_fail(lua_State *L, const char *what, int err) {
  lua_pushnil(L);
  if (what)
    lua_pushfstring(L, "%s: %s", what, strerror(-err));
  else
    lua_pushstring(L, strerror(-err));
  lua_pushinteger(L, -err);
  return 3;
}

/* A runtime call failed with err: a cancelled task raises core.CANCELLED
** (as every wait does); any other failure is a result. */
static void check_cancel(lua_State *L, int err) {
  if (err == UMS_ECANCELED && lums_cur_task) lums_raise_cancelled(L);
}

/* A call failed with err: a cancelled task raises core.CANCELLED, any
** other failure is the result nil, "what: message", errno. */
static int fail(lua_State *L, const char *what, int err) {
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
  if (f->buf) {
    ums_buf_release(f->buf);
    f->buf = NULL;
  }
  f->rpos = f->rlen = f->wlen = 0;
  f->eof = false;
  check_cancel(L, (int)err);
}

/* file_check_cancel, then the result nil, message, errno. */
static int file_fail(lua_State *L, lfile *f, int64_t err) {
  file_check_cancel(L, f, err);
  return push_fail(L, NULL, (int)err);
}

/* After a call that may have parked task me on its worker, other steps
** ran on this thread meanwhile: me is the current task again. me is NULL
** outside tasks. */
static void resumed(ltask *me) {
  if (me) lums_become_current(me);
}

/* ---------------------------------------------------------------------- */
/* Runtime calls (they park only the calling task)                         */
/* ---------------------------------------------------------------------- */

static int64_t do_read(ltask *me, int fd, ums_buf_t *b, size_t pos,
                       size_t len, int64_t offset) {
  int64_t r;
  do {
    lums_before_block(me);
    r = ums_fs_read(fd, b, pos, len, offset, UMS_FOREVER);
    resumed(me);
  } while (r == UMS_EINTR || r == UMS_EAGAIN);
  return r;
}

/* Writes all of b[pos, pos + len); returns 0 or an error. */
static int64_t do_write_all(ltask *me, int fd, ums_buf_t *b, size_t pos,
                            size_t len, int64_t offset) {
  while (len > 0) {
    lums_before_block(me);
    int64_t r = ums_fs_write(fd, b, pos, len, offset, UMS_FOREVER);
    resumed(me);
    if (r == UMS_EINTR || r == UMS_EAGAIN) continue;
    if (r < 0) return r;
    if (r == 0) return UMS_EIO;
    pos += (size_t)r;
    len -= (size_t)r;
    if (offset >= 0) offset += r;
  }
  return 0;
}

/* ---------------------------------------------------------------------- */
/* The file lock                                                           */
/* ---------------------------------------------------------------------- */

/* Takes the file for this method. Outside a task nothing else can run, so
** it is free. A cancelled task raises here, holding nothing. */
static void file_lock(lua_State *L, lfile *f) {
  ltask *me = lums_cur_task;
  while (f->busy && me) {
    lwait *w = &me->wait;
    int r = ums_park_begin(UMS_FOREVER, &w->tok);
    if (r == UMS_ECANCELED) lums_raise_cancelled(L);
    if (r) luaL_error(L, "ums.fs: cannot wait for the file: %s",
                      ums_strerror(r));
    w->task = me;
    w->L = L;
    w->kase = 0;
    lums_q_push(&f->waiters, w);
    lums_before_block(me);
    r = ums_park_wait();
    resumed(me);
    lums_q_unlink(w);
    if (r == UMS_ECANCELED) lums_raise_cancelled(L);
  }
  f->busy = true;
  f->owner = me;
}

/* Gives the file back; the first waiter still waiting tries again. */
static void file_unlock(lfile *f) {
  f->busy = false;
  f->owner = NULL;
  lwait *w;
  while ((w = f->waiters.head) != NULL) {
    lums_q_unlink(w);
    if (lums_unpark(w->task, w->tok, 0)) break;
  }
}

/* file_lock for a method of an open file: a task that waited for the file
** may find that the one holding it closed it meanwhile; it then raises as
** for any closed file, having touched nothing. */
static void method_lock(lua_State *L, lfile *f) {
  file_lock(L, f);
  if (f->fd < 0) {
    file_unlock(f);
    luaL_error(L, "attempt to use a closed file");
  }
}

/* ---------------------------------------------------------------------- */
/* Buffer                                                                  */
/* ---------------------------------------------------------------------- */

static lfile *to_file(lua_State *L, int idx) {
  lfile *f = (lfile *)lua_touserdata(L, idx);
  if (!f || lua_rawlen(L, idx) != sizeof *f || f->tag != &file_tag)
    return NULL;
  return f;
}

/* The open file at idx (a method's self); raises for anything else. */
static lfile *check_file(lua_State *L, int idx) {
  lfile *f = to_file(L, idx);
  if (!f) luaL_checkudata(L, idx, FILE_MT);  /* raises */
  if (f->fd < 0) luaL_error(L, "attempt to use a closed file");
  return f;
}

static int ensure_buf(lfile *f) {
  if (!f->buf && !(f->buf = ums_buf_new(BUF_SIZE))) return UMS_ENOMEM;
  return 0;
}

/* Writes the pending bytes. */
static int64_t flush_writes(lfile *f) {
  if (f->wlen == 0) return 0;
  size_t n = f->wlen;
  f->wlen = 0;
  return do_write_all(f->owner, f->fd, f->buf, 0, n, UMS_FS_CUR);
}

/* Drops unread read-ahead, moving the kernel's position back to the
** logical one (a stream cannot move back: its read-ahead is lost, as with
** stdio). */
static void drop_readahead(lfile *f) {
  size_t unread = f->rlen - f->rpos;
  f->rpos = f->rlen = 0;
  if (unread) lseek(f->fd, -(off_t)unread, SEEK_CUR);
}

/* Before a write: no read-ahead. */
static int64_t to_write_mode(lfile *f) {
  drop_readahead(f);
  return ensure_buf(f);
}

/* Before a read: nothing pending. */
static int64_t to_read_mode(lfile *f) {
  int64_t r = flush_writes(f);
  if (r) return r;
  return ensure_buf(f);
}

/* Refills an empty read buffer: > 0 bytes, 0 at end of file, or < 0. */
static int64_t refill(lfile *f) {
  f->rpos = f->rlen = 0;
  int64_t r = do_read(f->owner, f->fd, f->buf, 0, BUF_SIZE, UMS_FS_CUR);
  if (r > 0) f->rlen = (size_t)r;
  if (r == 0) f->eof = true;
  return r;
}

/* Next byte, without consuming it: the byte, or -1 at end of file or on
** an error (then stored in *err). */
static int64_t peek(lfile *f, int64_t *err) {
  if (f->rpos == f->rlen) {
    int64_t r = refill(f);
    if (r < 0) {
      *err = r;
      return -1;
    }
    if (r == 0) return -1;
  }
  return ((unsigned char *)ums_buf_data(f->buf))[f->rpos];
}

/* ---------------------------------------------------------------------- */
/* Reading                                                                 */
/* ---------------------------------------------------------------------- */

/* Reads up to n bytes into the luaL_Buffer; returns bytes read or an
** error. Big reads skip the file buffer. */
static int64_t read_count(lfile *f, luaL_Buffer *b, size_t n) {
  size_t got = 0;
  char *data = ums_buf_data(f->buf);
  size_t avail = f->rlen - f->rpos;
  if (avail) {
    size_t k = avail < n ? avail : n;
    luaL_addlstring(b, data + f->rpos, k);
    f->rpos += k;
    got = k;
  }
  while (got < n) {
    size_t want = n - got;
    if (want < BUF_SIZE) {
      int64_t r = refill(f);
      if (r < 0) return r;
      if (r == 0) break;
      size_t k = (size_t)r < want ? (size_t)r : want;
      luaL_addlstring(b, data, k);
      f->rpos = k;
      got += k;
    } else {
      size_t chunk = want < CHUNK_MAX ? want : CHUNK_MAX;
      ums_buf_t *big = ums_buf_new(chunk);
      if (!big) return UMS_ENOMEM;
      int64_t r = do_read(f->owner, f->fd, big, 0, chunk, UMS_FS_CUR);
      if (r > 0) luaL_addlstring(b, ums_buf_data(big), (size_t)r);
      ums_buf_release(big);
      if (r < 0) return r;
      if (r == 0) {
        f->eof = true;
        break;
      }
      got += (size_t)r;
    }
  }
  return (int64_t)got;
}

/* Reads a line into b; keep: keep the newline. Returns 1 if anything was
** read (a line, possibly without newline at the end of file), 0 at end of
** file, or an error. */
static int64_t read_line(lfile *f, luaL_Buffer *b, bool keep) {
  bool any = false;
  for (;;) {
    if (f->rpos == f->rlen) {
      int64_t r = refill(f);
      if (r < 0) return r;
      if (r == 0) return any;
    }
    char *data = ums_buf_data(f->buf) + f->rpos;
    size_t avail = f->rlen - f->rpos;
    char *nl = memchr(data, '\n', avail);
    if (nl) {
      size_t k = (size_t)(nl - data);
      luaL_addlstring(b, data, k + (keep ? 1 : 0));
      f->rpos += k + 1;
      return 1;
    }
    luaL_addlstring(b, data, avail);
    f->rpos = f->rlen;
    any = true;
  }
}

/* Reads the rest of the file into b: through the file buffer first (a
** small file costs no allocation), then, once the file proves big, in
** growing direct chunks. */
static int64_t read_all(lfile *f, luaL_Buffer *b) {
  size_t total = 0;
  char *data = ums_buf_data(f->buf);
  if (f->rpos < f->rlen) {
    luaL_addlstring(b, data + f->rpos, f->rlen - f->rpos);
    total = f->rlen - f->rpos;
    f->rpos = f->rlen;
  }
  while (total < 16 * (size_t)BUF_SIZE) {
    int64_t r = refill(f);
    if (r <= 0) return r;
    luaL_addlstring(b, data, (size_t)r);
    f->rpos = f->rlen;
    total += (size_t)r;
  }
  for (size_t chunk = 16 * (size_t)BUF_SIZE;; ) {
    int64_t r = read_count(f, b, chunk);
    if (r <= 0) return r;
    if (chunk < CHUNK_MAX) chunk *= 2;
  }
}

/* f:read(n) for a big n with nothing read ahead: straight from the kernel
** into one page-aligned buffer, then one copy into the string (a
** luaL_Buffer would copy twice). Pushes the string, or nothing at end of
** file; returns bytes read or an error. */
static int64_t read_direct(lua_State *L, lfile *f, size_t n) {
  if (n > CHUNK_MAX) n = CHUNK_MAX;
  ums_buf_t *big = ums_buf_new(n);
  if (!big) return UMS_ENOMEM;
  size_t got = 0;
  int64_t r = 0;
  while (got < n) {
    r = do_read(f->owner, f->fd, big, got, n - got, UMS_FS_CUR);
    if (r <= 0) break;
    got += (size_t)r;
  }
  if (r == 0) f->eof = true;
  if (got > 0) lua_pushlstring(L, ums_buf_data(big), got);
  ums_buf_release(big);
  if (r < 0 && got == 0) return r;
  return (int64_t)got;
}

/* The number reader of liolib, on this file's buffer: at most 200
** characters of what looks like a numeral, then lua_stringtonumber. */
#define MAXNUM 200
typedef struct {
  lfile *f;
  int64_t err;
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
  rn->f->rpos++;
  rn->c = (int)peek(rn->f, &rn->err);
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

/* Pushes the number read, or nil (fail). Returns an I/O error or 0. */
static int64_t read_number(lua_State *L, lfile *f) {
  numbuf rn;
  int count = 0;
  bool hex = false;
  /* liolib's pair: the locale's decimal point, or '.'. Both must be real
  ** characters: test2 matches either, and a '\0' here would take a NUL
  ** byte of the file for a decimal point. */
  char decp[2];
  decp[0] = lua_getlocaledecpoint();
  decp[1] = '.';
  rn.f = f;
  rn.n = 0;
  rn.err = 0;
  do {
    rn.c = (int)peek(f, &rn.err);
    if (rn.err) return rn.err;
    if (rn.c >= 0 && (rn.c == ' ' || (rn.c >= '\t' && rn.c <= '\r')))
      f->rpos++;
    else
      break;
  } while (1);
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
  if (rn.err) return rn.err;
  rn.buff[rn.n] = '\0';
  if (lua_stringtonumber(L, rn.buff) == 0) lua_pushnil(L);
  return 0;
}

/* file:read(...) with the formats of io: "n", "l", "L", "a" (with or
** without a leading '*'), or a byte count. */
static int f_read(lua_State *L) {
  lfile *f = check_file(L, 1);
  int nargs = lua_gettop(L) - 1;
  if (nargs == 0) {
    lua_pushliteral(L, "l");
    nargs = 1;
  }
  /* Check every format first: nothing may raise while the file is held
  ** except cancellation. */
  for (int i = 2; i <= nargs + 1; i++) {
    if (lua_type(L, i) == LUA_TNUMBER) {
      lua_Integer n = luaL_checkinteger(L, i);
      luaL_argcheck(L, n >= 0, i, "count must not be negative");
    } else {
      const char *p = luaL_checkstring(L, i);
      if (*p == '*') p++;
      luaL_argcheck(L, *p && strchr("nlLa", *p), i, "invalid format");
    }
  }
  if (!f->readable) return push_fail(L, NULL, UMS_EBADF);
  luaL_checkstack(L, nargs + LUA_MINSTACK, "too many arguments");
  method_lock(L, f);
  int64_t err = to_read_mode(f);
  int first = lua_gettop(L) + 1, n;
  bool ok = err == 0;
  for (n = 2; ok && n <= nargs + 1; n++) {
    if (lua_type(L, n) == LUA_TNUMBER) {
      size_t count = (size_t)lua_tointeger(L, n);
      luaL_Buffer b;
      luaL_buffinit(L, &b);
      if (count == 0) {
        /* io's test for end of file */
        int64_t c = peek(f, &err);
        luaL_pushresult(&b);
        ok = err == 0 && c >= 0;
      } else if (count >= BUF_SIZE && f->rpos == f->rlen &&
                 count <= CHUNK_MAX) {
        luaL_pushresult(&b);  /* unused: drop it */
        lua_pop(L, 1);
        int64_t r = read_direct(L, f, count);
        if (r < 0) err = r;
        if (r <= 0) lua_pushnil(L);
        ok = r > 0;
      } else {
        int64_t r = read_count(f, &b, count);
        luaL_pushresult(&b);
        if (r < 0) err = r;
        ok = r > 0;
      }
    } else {
      const char *p = lua_tostring(L, n);
      if (*p == '*') p++;
      if (*p == 'n') {
        err = read_number(L, f);
        ok = err == 0 && !lua_isnil(L, -1);
      } else if (*p == 'a') {
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        err = read_all(f, &b);
        luaL_pushresult(&b);
        ok = err == 0;
      } else {
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        int64_t r = read_line(f, &b, *p == 'L');
        luaL_pushresult(&b);
        if (r < 0) err = r;
        ok = r > 0;
      }
    }
  }
  file_unlock(f);
  if (err) return file_fail(L, f, err);
  if (!ok) {
    lua_pop(L, 1);
    lua_pushnil(L);  /* fail: io returns nil for the format that failed */
  }
  return lua_gettop(L) - first + 1;
}

/* ---------------------------------------------------------------------- */
/* Writing                                                                 */
/* ---------------------------------------------------------------------- */

/* Appends s to the pending writes, writing out what does not fit. */
static int64_t write_bytes(lfile *f, const char *s, size_t len) {
  char *data = ums_buf_data(f->buf);
  if (f->wlen + len <= BUF_SIZE) {
    memcpy(data + f->wlen, s, len);
    f->wlen += len;
    return 0;
  }
  int64_t r = flush_writes(f);
  if (r) return r;
  if (len <= BUF_SIZE) {
    memcpy(data, s, len);
    f->wlen = len;
    return 0;
  }
  /* Big: one copy into a page-aligned buffer the kernel can own. */
  while (len > 0) {
    size_t chunk = len < CHUNK_MAX ? len : CHUNK_MAX;
    ums_buf_t *big = ums_buf_new(chunk);
    if (!big) return UMS_ENOMEM;
    memcpy(ums_buf_data(big), s, chunk);
    r = do_write_all(f->owner, f->fd, big, 0, chunk, UMS_FS_CUR);
    ums_buf_release(big);
    if (r) return r;
    s += chunk;
    len -= chunk;
  }
  return 0;
}

/* file:write(...): strings and numbers, as io's. Returns the file. */
static int f_write(lua_State *L) {
  lfile *f = check_file(L, 1);
  int nargs = lua_gettop(L);
  for (int i = 2; i <= nargs; i++) {
    if (lua_type(L, i) != LUA_TNUMBER) luaL_checkstring(L, i);
  }
  if (!f->writable) return push_fail(L, NULL, UMS_EBADF);
  method_lock(L, f);
  int64_t err = to_write_mode(f);
  for (int i = 2; err == 0 && i <= nargs; i++) {
    size_t len;
    const char *s;
    char num[64];
    if (lua_type(L, i) == LUA_TNUMBER) {
      /* io writes integers with LUA_INTEGER_FMT, floats with
      ** LUA_NUMBER_FMT */
      int k = lua_isinteger(L, i)
                  ? snprintf(num, sizeof num, LUA_INTEGER_FMT,
                             (LUAI_UACINT)lua_tointeger(L, i))
                  : snprintf(num, sizeof num, LUA_NUMBER_FMT,
                             (LUAI_UACNUMBER)lua_tonumber(L, i));
      s = num;
      len = (size_t)k;
    } else {
      s = lua_tolstring(L, i, &len);
    }
    err = write_bytes(f, s, len);
  }
  file_unlock(f);
  if (err) return file_fail(L, f, err);
  lua_settop(L, 1);
  return 1;
}

/* file:flush() -> true | nil, msg, errno (io's result, not the file) */
static int f_flush(lua_State *L) {
  lfile *f = check_file(L, 1);
  method_lock(L, f);
  int64_t err = flush_writes(f);
  file_unlock(f);
  if (err) return file_fail(L, f, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* file:seek([whence [, offset]]) -> position */
static int f_seek(lua_State *L) {
  static const int mode[] = {SEEK_SET, SEEK_CUR, SEEK_END};
  static const char *const modenames[] = {"set", "cur", "end", NULL};
  lfile *f = check_file(L, 1);
  int op = luaL_checkoption(L, 2, "cur", modenames);
  lua_Integer off = luaL_optinteger(L, 3, 0);
  method_lock(L, f);
  int64_t err = flush_writes(f);
  off_t pos = -1;
  if (!err) {
    /* The logical position is behind the kernel's by the read-ahead. */
    lua_Integer unread = (lua_Integer)(f->rlen - f->rpos);
    if (op == 1) off -= unread;
    f->rpos = f->rlen = 0;
    pos = lseek(f->fd, (off_t)off, mode[op]);
    if (pos < 0) err = -errno;
    f->eof = false;
  }
  file_unlock(f);
  if (err) return file_fail(L, f, err);
  lua_pushinteger(L, (lua_Integer)pos);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Positional I/O and sync                                                 */
/* ---------------------------------------------------------------------- */

/* file:pread(n, offset) -> string (shorter only at the end of the file;
** nil when offset is at or past it) | nil, msg, errno. Does not move the
** file's position. Reads of more than CHUNK_MAX go in several requests. */
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
  size_t want = (size_t)n < CHUNK_MAX ? (size_t)n : CHUNK_MAX;
  method_lock(L, f);
  ums_buf_t *b = ums_buf_new(want);
  if (!b) {
    file_unlock(f);
    return push_fail(L, NULL, UMS_ENOMEM);
  }
  luaL_Buffer lb;
  luaL_buffinit(L, &lb);
  size_t got = 0;
  /* This file's own pending writes come first, as they would with
  ** pread(2) after write(2) on the descriptor. */
  int64_t r = flush_writes(f);
  while (r == 0 && got < (size_t)n &&
         off <= LUA_MAXINTEGER - (lua_Integer)got) {
    size_t left = (size_t)n - got;
    r = do_read(f->owner, f->fd, b, 0, left < want ? left : want,
                (int64_t)off + (int64_t)got);
    if (r <= 0) break;
    luaL_addlstring(&lb, ums_buf_data(b), (size_t)r);
    got += (size_t)r;
    r = 0;
  }
  file_unlock(f);
  ums_buf_release(b);
  luaL_pushresult(&lb);
  if (r < 0) return file_fail(L, f, r);
  if (got == 0) lua_pushnil(L);
  return 1;
}

/* file:pwrite(s, offset) -> bytes written | nil, msg, errno */
static int f_pwrite(lua_State *L) {
  lfile *f = check_file(L, 1);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  lua_Integer off = luaL_checkinteger(L, 3);
  luaL_argcheck(L, off >= 0, 3, "offset must not be negative");
  if (!f->writable) return push_fail(L, NULL, UMS_EBADF);
  size_t done = 0;
  method_lock(L, f);
  /* Program order: this file's pending writes go out first, and its
  ** read-ahead, which the write may change, is dropped. */
  int64_t err = flush_writes(f);
  drop_readahead(f);
  while (done < len && !err) {
    size_t chunk = len - done < CHUNK_MAX ? len - done : CHUNK_MAX;
    ums_buf_t *b = ums_buf_new(chunk);
    if (!b) {
      err = UMS_ENOMEM;
      break;
    }
    memcpy(ums_buf_data(b), s + done, chunk);
    err = do_write_all(f->owner, f->fd, b, 0, chunk,
                       (int64_t)off + (int64_t)done);
    ums_buf_release(b);
    if (!err) done += chunk;
  }
  file_unlock(f);
  if (err) return file_fail(L, f, err);
  lua_pushinteger(L, (lua_Integer)done);
  return 1;
}

/* file:sync() -> true: pending writes out, then fsync. */
static int f_sync(lua_State *L) {
  lfile *f = check_file(L, 1);
  method_lock(L, f);
  int64_t err = flush_writes(f);
  if (!err) {
    lums_before_block(f->owner);
    err = ums_fs_fsync(f->fd, 0, UMS_FOREVER);
    resumed(f->owner);
  }
  file_unlock(f);
  if (err) return file_fail(L, f, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Opening and closing                                                     */
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

static lfile *new_file(lua_State *L, int fd, bool rd, bool wr) {
  lfile *f = (lfile *)lua_newuserdatauv(L, sizeof *f, 0);
  memset(f, 0, sizeof *f);
  f->tag = &file_tag;
  f->fd = fd;
  f->readable = rd;
  f->writable = wr;
  luaL_setmetatable(L, FILE_MT);
  return f;
}

/* ums.fs.open(path [, mode]) -> file | nil, msg, errno */
static int fs_open(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  const char *mode = luaL_optstring(L, 2, "r");
  int flags = 0;
  bool rd = false, wr = false;
  luaL_argcheck(L, parse_mode(mode, &flags, &rd, &wr), 2, "invalid mode");
  ltask *me = lums_cur_task;
  lums_before_block(me);
  int fd = ums_fs_open(path, flags, 0666, UMS_FOREVER);
  resumed(me);
  if (fd < 0) {
    return fail(L, path, (int)fd);
  }
  new_file(L, fd, rd, wr);
  return 1;
}

/* Writes the pending bytes with plain system calls (no park): for __gc,
** and for a task that was cancelled, whose runtime calls would all fail
** with UMS_ECANCELED before doing anything. */
static int64_t flush_plain(lfile *f) {
  const char *p = f->buf ? ums_buf_data(f->buf) : NULL;
  size_t n = f->wlen;
  f->wlen = 0;
  while (n > 0) {
    ssize_t w = write(f->fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    if (w == 0) return UMS_EIO;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Flushes and closes; returns 0 or the first error. The descriptor is
** closed in every case. In a cancelled task (a <close> file unwound by
** the cancel, a close after catching it) the runtime refuses to park, so
** its calls would neither write nor close anything: plain system calls
** then, as in __gc. */
static int64_t close_file(lfile *f) {
  bool plain = f->owner && ums_cancelled();
  int64_t err = plain ? flush_plain(f) : flush_writes(f);
  /* cancelled during the flush: the close goes the plain way */
  if (err == UMS_ECANCELED && f->owner) plain = true;
  int fd = f->fd;
  f->fd = -1;
  int r;
  if (plain) {
    r = close(fd) == 0 ? 0 : -errno;
  } else {
    lums_before_block(f->owner);
    r = ums_fs_close(fd, UMS_FOREVER);
    resumed(f->owner);
  }
  ums_buf_release(f->buf);
  f->buf = NULL;
  return err ? err : r;
}

static int f_close(lua_State *L) {
  lfile *f = check_file(L, 1);
  method_lock(L, f);
  int64_t err = close_file(f);
  file_unlock(f);
  if (err) return fail(L, NULL, (int)err);  /* closed all the same */
  lua_pushboolean(L, 1);
  return 1;
}

/* __gc: a file nobody closed is closed; pending writes go out first.
** Plain system calls, as io's __gc: a finalizer runs inside whatever
** allocated, and must not park that task (it may be half-way through a
** channel operation). Errors cannot be reported here. */
static int f_gc(lua_State *L) {
  lfile *f = to_file(L, 1);
  if (!f || f->fd < 0) return 0;
  flush_plain(f);
  close(f->fd);
  f->fd = -1;
  ums_buf_release(f->buf);
  f->buf = NULL;
  return 0;
}

/* __close (a <close> variable going out of scope): file:close, which may
** wait like any method; an error closing is raised. */
static int f_tbc(lua_State *L) {
  lfile *f = to_file(L, 1);
  if (!f || f->fd < 0) return 0;
  file_lock(L, f);
  /* another task may have closed it while this one waited */
  int64_t err = f->fd >= 0 ? close_file(f) : 0;
  file_unlock(f);
  if (err) {
    check_cancel(L, (int)err);
    return luaL_error(L, "ums.fs: closing the file: %s",
                      strerror((int)-err));
  }
  return 0;
}

static int f_tostring(lua_State *L) {
  lfile *f = to_file(L, 1);
  if (!f) return luaL_typeerror(L, 1, FILE_MT);
  if (f->fd < 0)
    lua_pushliteral(L, "ums.fs.file (closed)");
  else
    lua_pushfstring(L, "ums.fs.file (%p)", (void *)f);
  return 1;
}

/* lines iterator: upvalues file, number of formats, formats... */
static int lines_iter(lua_State *L) {
  lfile *f = to_file(L, lua_upvalueindex(1));
  if (!f || f->fd < 0) return luaL_error(L, "file is already closed");
  int n = (int)lua_tointeger(L, lua_upvalueindex(2));
  bool close_at_end = lua_toboolean(L, lua_upvalueindex(3));
  lua_settop(L, 0);
  lua_pushcfunction(L, f_read);
  lua_pushvalue(L, lua_upvalueindex(1));
  for (int i = 1; i <= n; i++) lua_pushvalue(L, lua_upvalueindex(3 + i));
  lua_call(L, n + 1, LUA_MULTRET);
  int got = lua_gettop(L);
  if (got >= 1 && !lua_isnil(L, 1)) return got;
  /* nil: end of file, or nil, msg, errno */
  if (got > 1 && lua_isstring(L, 2))
    return luaL_error(L, "%s", lua_tostring(L, 2));
  if (close_at_end) {
    file_lock(L, f);
    if (f->fd >= 0) close_file(f);
    file_unlock(f);
  }
  return 0;
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
static int f_lines(lua_State *L) {
  check_file(L, 1);
  push_lines(L, 1, 2, false);
  return 1;
}

/* ums.fs.lines(path, ...) -> iterator that closes the file at its end;
** raises when the file cannot be opened, as io.lines does. */
static int fs_lines(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  ltask *me = lums_cur_task;
  lums_before_block(me);
  int fd = ums_fs_open(path, O_RDONLY, 0, UMS_FOREVER);
  resumed(me);
  if (fd < 0) {
    check_cancel(L, fd);
    return luaL_error(L, "%s: %s", path, strerror(-fd));
  }
  new_file(L, fd, true, false);
  lua_replace(L, 1);
  push_lines(L, 1, 2, true);
  lua_pushnil(L);
  lua_pushnil(L);
  lua_pushvalue(L, 1);  /* to-be-closed value of the generic for */
  return 4;
}

/* ---------------------------------------------------------------------- */
/* Whole files and the file system                                         */
/* ---------------------------------------------------------------------- */

/* ums.fs.readfile(path) -> string | nil, msg, errno */
static int fs_readfile(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  ltask *me = lums_cur_task;
  lums_before_block(me);
  int fd = ums_fs_open(path, O_RDONLY, 0, UMS_FOREVER);
  resumed(me);
  if (fd < 0) {
    return fail(L, path, (int)fd);
  }
  lfile *f = new_file(L, fd, true, false);  /* closes it if we raise */
  file_lock(L, f);
  int64_t err = ensure_buf(f);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  if (!err) err = read_all(f, &b);
  luaL_pushresult(&b);
  int64_t cerr = close_file(f);
  file_unlock(f);
  if (!err) err = cerr;
  if (err) {
    return fail(L, path, (int)err);
  }
  return 1;
}

/* ums.fs.writefile(path, s) -> true | nil, msg, errno (truncates) */
static int fs_writefile(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  ltask *me = lums_cur_task;
  lums_before_block(me);
  int fd = ums_fs_open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666,
                       UMS_FOREVER);
  resumed(me);
  if (fd < 0) {
    return fail(L, path, (int)fd);
  }
  lfile *f = new_file(L, fd, false, true);
  file_lock(L, f);
  int64_t err = ensure_buf(f);
  if (!err) err = write_bytes(f, s, len);
  int64_t cerr = close_file(f);
  file_unlock(f);
  if (!err) err = cerr;
  if (err) {
    return fail(L, path, (int)err);
  }
  lua_pushboolean(L, 1);
  return 1;
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

/* ums.fs.stat(path [, nofollow]) -> table | nil, msg, errno */
static int fs_stat(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  int flags = lua_toboolean(L, 2) ? UMS_FS_NOFOLLOW : 0;
  ums_stat_t st;
  ltask *me = lums_cur_task;
  lums_before_block(me);
  int r = ums_fs_stat(path, flags, &st, UMS_FOREVER);
  resumed(me);
  if (r < 0) {
    return fail(L, path, (int)r);
  }
  lua_createtable(L, 0, 14);
  lua_pushstring(L, type_name(st.mode));
  lua_setfield(L, -2, "type");
  set_int(L, "size", (lua_Integer)st.size);
  set_int(L, "mode", (lua_Integer)(st.mode & 07777));
  set_int(L, "ino", (lua_Integer)st.ino);
  set_int(L, "dev", (lua_Integer)st.dev);
  set_int(L, "nlink", (lua_Integer)st.nlink);
  set_int(L, "uid", (lua_Integer)st.uid);
  set_int(L, "gid", (lua_Integer)st.gid);
  set_int(L, "blocks", (lua_Integer)st.blocks);
  set_int(L, "blksize", (lua_Integer)st.blksize);
  set_time(L, "atime", st.atime);
  set_time(L, "mtime", st.mtime);
  set_time(L, "ctime", st.ctime);
  return 1;
}

static int result(lua_State *L, int r, const char *path) {
  if (r < 0) {
    return fail(L, path, (int)r);
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* ums.fs.remove(path): a file, or an empty directory (as os.remove) */
static int fs_remove(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  ltask *me = lums_cur_task;
  lums_before_block(me);
  int r = ums_fs_unlink(path, UMS_FOREVER);
  resumed(me);
  if (r == UMS_EISDIR || r == UMS_EPERM) {
    lums_before_block(me);
    int r2 = ums_fs_rmdir(path, UMS_FOREVER);
    resumed(me);
    if (r2 != UMS_ENOTDIR) r = r2;
  }
  return result(L, r, path);
}

static int fs_rename(lua_State *L) {
  const char *from = luaL_checkstring(L, 1);
  const char *to = luaL_checkstring(L, 2);
  ltask *me = lums_cur_task;
  lums_before_block(me);
  int r = ums_fs_rename(from, to, UMS_FOREVER);
  resumed(me);
  return result(L, r, from);
}

static int fs_mkdir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  lua_Integer mode = luaL_optinteger(L, 2, 0777);
  luaL_argcheck(L, mode >= 0 && mode <= 07777, 2, "invalid mode");
  ltask *me = lums_cur_task;
  lums_before_block(me);
  int r = ums_fs_mkdir(path, (int)mode, UMS_FOREVER);
  resumed(me);
  return result(L, r, path);
}

/* dir iterator: upvalues the list (a table of names) and the next index */
static int dir_iter(lua_State *L) {
  lua_Integer i = lua_tointeger(L, lua_upvalueindex(2));
  lua_pushinteger(L, i + 1);
  lua_replace(L, lua_upvalueindex(2));
  lua_rawgeti(L, lua_upvalueindex(1), i);
  return 1;
}

/* ums.fs.dir(path) -> iterator over the names ("." and ".." left out) |
** nil, msg, errno. The directory is read whole when dir is called. */
static int fs_dir(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  ums_dirlist_t *list;
  ltask *me = lums_cur_task;
  lums_before_block(me);
  int r = ums_fs_readdir(path, &list, UMS_FOREVER);
  resumed(me);
  if (r < 0) {
    return fail(L, path, (int)r);
  }
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

/* ums.fs.type(v) -> "file" | "closed file" | nil, as io.type */
static int fs_type(lua_State *L) {
  luaL_checkany(L, 1);
  lfile *f = to_file(L, 1);
  if (!f)
    lua_pushnil(L);
  else if (f->fd < 0)
    lua_pushliteral(L, "closed file");
  else
    lua_pushliteral(L, "file");
  return 1;
}

void lums_open_fs(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"read", f_read},   {"write", f_write}, {"lines", f_lines},
      {"seek", f_seek},   {"flush", f_flush}, {"close", f_close},
      {"pread", f_pread}, {"pwrite", f_pwrite}, {"sync", f_sync},
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
    lua_pushcfunction(L, f_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, f_tbc);
    lua_setfield(L, -2, "__close");
    lua_pushcfunction(L, f_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_newlib(L, funcs);
  lua_setfield(L, -2, "fs");
}
