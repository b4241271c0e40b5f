/*
** lfs.c: ums.fs, the file system for tasks: opening files (ums.fs.open,
** ums.fs.lines), whole files (readfile, writefile), and the calls that
** take a path (stat, remove, rename, mkdir, dir). A file is a buffered
** stream (lstream.c): its methods follow Lua's io library (read formats,
** write, lines, seek, flush, setvbuf, close) so code ports by changing
** io.open to ums.fs.open; every system call goes through the runtime's
** file I/O (io_uring, or the I/O pool), so a task that waits for one
** parks only itself while its scheduler runs the others.
**
** Opening is a method of a stream made before its descriptor (m_open,
** through lstream_start); the calls that have no file make one request
** at a time, carried to their continuation as its context.
*/
#define _GNU_SOURCE
#include "lfs.h"
#include "lstream.h"
#include "lpark.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Opens op.path for a file made before its descriptor: 0 or an error. */
static int64_t sub_open(lop *o) {
  lfile *f = o->f;
  int64_t r;
  if (lstream_answer(o, &r)) {
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

/* Pushes a file whose descriptor its open method will set. */
static lfile *new_file(lua_State *L, bool rd, bool wr) {
  return lstream_new(L, -1, rd, wr, false, FILE_MT);
}

/* Stack: path, ..., the new file. */
static int step_open(lua_State *L, lop *o) {
  (void)L;
  int64_t r = sub_open(o);
  if (r == AGAIN) return STEP_IO;
  o->err = r;
  return 1;  /* the file, on top */
}

static int done_open(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  if (err) return lstream_fail(L, lua_tostring(L, 1), err);
  return nres;
}

static void open_init(lua_State *L, lop *o);

static const lmethod m_open = {open_init, step_open,
                               done_open, true, LSIDE_BOTH};

/* The open's path, flags and mode: the path at index 1; the flags and
** mode from the file's access and the method. */
static void open_init(lua_State *L, lop *o) {
  lfile *f = o->f;
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
  return lstream_start(L, new_file(L, rd, wr), &m_open);
}

/* ums.fs.lines(path, ...) -> iterator that closes the file at its end;
** raises when the file cannot be opened, as io.lines does. */
static int done_lines_open(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  (void)nres;
  if (err) {
    lstream_check_cancel(L, err);
    return luaL_error(L, "%s: %s", lua_tostring(L, 1),
                      strerror((int)-err));
  }
  lua_replace(L, 1);  /* the file, in place of the path */
  lstream_push_lines(L, 1, 2, true);
  lua_pushnil(L);
  lua_pushnil(L);
  lua_pushvalue(L, 1);  /* to-be-closed value of the generic for */
  return 4;
}

static const lmethod m_lines_open = {open_init, step_open,
                                     done_lines_open, true, LSIDE_BOTH};

static int fs_lines(lua_State *L) {
  luaL_checkstring(L, 1);
  lfile *f = new_file(L, true, false);
  return lstream_start(L, f, &m_lines_open);
}

/* ums.fs.readfile(path) through the file: what ums_fs_readfile leaves
** (a file larger than its buffer, or one that cannot be read at an
** offset: then its descriptor, already open). Stack: path, file. */
static int step_readfile(lua_State *L, lop *o) {
  lfile *f = o->f;
  int64_t r;
  switch (o->phase) {
    case 0:
      r = f->fd >= 0 ? 0 : sub_open(o);
      if (r == AGAIN) return STEP_IO;
      if (!r) r = lstream_ensure_buf(f);
      if (r) {
        o->err = r;
        if (f->fd < 0) return 0;
        o->phase = 2;  /* opened, no buffer: close it */
        break;
      }
      o->phase = 1;
      lstream_next_item(o);
      /* fall through */
    case 1:
      r = lstream_fmt_all(L, o);
      if (r == AGAIN) return STEP_IO;
      if (r < 0) o->err = r;
      o->phase = 2;
      lstream_next_item(o);
      break;
  }
  r = lstream_sub_close(o);
  if (r == AGAIN) return STEP_IO;
  if (!o->err) o->err = r;
  return 1;
}

static int done_path_result(lua_State *L, lfile *f, int nres, int64_t err) {
  (void)f;
  if (err) return lstream_fail(L, lua_tostring(L, 1), err);
  return nres;
}

static const lmethod m_readfile = {open_init, step_readfile,
                                   done_path_result, true, LSIDE_BOTH};

/* ums.fs.readfile(path) -> string | nil, msg, errno. A file that fits
** in BUF_SIZE, nearly every small file, is one request of the runtime
** (ums_fs_readfile: open, read, read at the end, close; on io_uring one
** chain, so the task parks once instead of four times), read into a
** page-aligned buffer and copied once into the string.
**
** Who holds the caller's buffer reference while the task is parked: in a task,
** the task itself (lfs_task.readbuf), not a Lua object: a userdata with a __gc
** per call cost an allocation, a metatable and a finalizer call per file, and
** every object with a finalizer costs the collector more. The call's end
** releases it. A raise between (no memory for the string) leaves it in the slot
** until the task ends (lfs_task_end). While the slot is taken (by that, or by a
** readfile of this task that a finalizer run from inside this one interrupted)
** a call uses a box on the stack instead, collected if it raises, as it does
** outside a task. The request holds its own reference while it runs either
** way. */
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
  if (r != UMS_EFBIG && r != UMS_ESPIPE)
    return lstream_fail(L, lua_tostring(L, 1), r);
  /* Larger than the buffer, or a stream: through a file, as io would. */
  lua_settop(L, 1);
  lfile *f = new_file(L, true, false);  /* closes it if we raise */
  if (r == UMS_ESPIPE) f->fd = fd;
  return lstream_start(L, f, &m_readfile);
}

/* The continuation of a call whose buffer the task holds. */
static int readfile_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  int fd = -1;
  int64_t r = ums_fs_readfile_end((ums_fs_req_t *)ctx, &fd);
  return readfile_result(L, r, fd, &lums_cur_task->fs.readbuf);
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
  if (me && !me->fs.readbuf) {
    owner = &me->fs.readbuf;
  } else {
    rfbuf *box = (rfbuf *)lua_newuserdatauv(L, sizeof *box, 0);
    box->b = NULL;
    luaL_setmetatable(L, RFBUF_MT);
    owner = &box->b;
  }
  if (!(*owner = ums_buf_new(BUF_SIZE)))
    return lstream_fail(L, path, UMS_ENOMEM);
  int fd = -1;
  if (!me) {
    int64_t r = ums_fs_readfile(path, *owner, &fd, UMS_FOREVER);
    return readfile_result(L, r, fd, owner);
  }
  ums_fs_req_t *req;
  int rc = ums_fs_readfile_begin(path, *owner, UMS_FOREVER, &req);
  if (rc) return readfile_result(L, rc, -1, owner);
  return lums_park_finish(L, me, (lua_KContext)req,
                          owner == &me->fs.readbuf ? readfile_k
                                                   : readfile_box_k);
}

/* ums.fs.writefile(path, s) -> true | nil, msg, errno (truncates). Stack:
** path, s, file. */
static int step_writefile(lua_State *L, lop *o) {
  lfile *f = o->f;
  int64_t r;
  switch (o->phase) {
    case 0:
      r = sub_open(o);
      if (r == AGAIN) return STEP_IO;
      if (!r) r = lstream_ensure_buf(f);
      if (r) {
        o->err = r;
        if (f->fd < 0) return 0;
        o->phase = 2;
        break;
      }
      o->phase = 1;
      lstream_next_item(o);
      /* fall through */
    case 1: {
      size_t len;
      const char *s = lua_tolstring(L, 2, &len);
      r = lstream_write_bytes(o, s, len);
      if (r == AGAIN) return STEP_IO;
      if (r < 0) o->err = r;
      o->phase = 2;
      lstream_next_item(o);
      break;
    }
  }
  r = lstream_sub_close(o);
  if (r == AGAIN) return STEP_IO;
  if (!o->err) o->err = r;
  lua_pushboolean(L, 1);
  return 1;
}

static const lmethod m_writefile = {open_init, step_writefile,
                                    done_path_result, true, LSIDE_BOTH};

static int fs_writefile(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  lua_settop(L, 2);
  lfile *f = new_file(L, false, true);
  return lstream_start(L, f, &m_writefile);
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
  if (r < 0) return lstream_fail(L, lua_tostring(L, 1), r);
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
  if (r < 0) return lstream_fail(L, lua_tostring(L, 1), r);
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
  if (r < 0) return lstream_fail(L, lua_tostring(L, 1), r);
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
  pthread_once(&once, lstream_init);
  static const luaL_Reg methods[] = {
      {"read", lstream_read},     {"write", lstream_write},
      {"lines", lstream_lines},   {"seek", lstream_seek},
      {"flush", lstream_flush},   {"close", lstream_close},
      {"pread", lstream_pread},   {"pwrite", lstream_pwrite},
      {"sync", lstream_sync},
      {"read_into", lstream_read_into}, {"pread_into", lstream_pread_into},
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
    lua_pushcfunction(L, lstream_file_tostring);
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
