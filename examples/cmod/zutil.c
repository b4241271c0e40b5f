/*
** zutil.c: an example C module for ums (runtime/include/ums-lua.h). Its
** functions make blocking calls (file reads, zlib) on ums's preemptive
** pool, so that only the calling task waits:
**
**   local zutil = require "zutil"       -- after require "ums"
**   zutil.crc32_file(path [, timeout])  -> crc, bytes
**                                        | nil, "path: message", errno
**                                        | nil, "timeout"
**   zutil.compress(s [, level [, timeout]])   -> zlib stream
**                                              | nil, "timeout"
**   zutil.uncompress(z, size [, timeout])     -> s (at most size bytes)
**                                              | nil, message | nil, "timeout"
**   zutil.pending()  -> requests whose data is not yet released (tests)
**
** A plain C module: it is built against <lua.h> and ums-lua.h only and
** links nothing of ums (Lua loads it with RTLD_LOCAL; ums-lua.h reaches
** ums.core through the registry). Each function follows the same shape:
** check and copy the arguments into a heap request, `return
** ums_lua_preempt(...)`, do the blocking part in a work function that
** never touches Lua, and push the results in a continuation.
*/
#define _GNU_SOURCE
#include "ums-lua.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* Requests allocated and not yet released, on any thread: lets tests see
** that every request is freed, also those whose caller gave up. */
static atomic_long live;

static void *req_new(lua_State *L, size_t size) {
  void *r = calloc(1, size);
  if (!r) luaL_error(L, "zutil: out of memory");
  atomic_fetch_add(&live, 1);
  return r;
}

static void req_free(void *r) {
  free(r);
  atomic_fetch_sub(&live, 1);
}

/* ---------------------------------------------------------------------- */
/* crc32_file                                                              */
/* ---------------------------------------------------------------------- */

#define CHUNK (64 * 1024)

/* Owned by ums_lua_preempt from the call on (released by crc_release). */
typedef struct crc_req {
  uLong crc;                   /* work: the result */
  lua_Integer bytes;           /* work: bytes read */
  int failed;                  /* work: open or read failed (errno says
                                  why: UMS_LUA_ERRNO) */
  unsigned char buf[CHUNK];
  char path[];                 /* a copy: the Lua string may be collected
                                  while a detached work still reads it */
} crc_req;

static void crc_work(void *ud, const ums_lua_work_t *w) {
  crc_req *r = ud;
  int fd = open(r->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    r->failed = 1;
    return;
  }
  r->crc = crc32(0L, Z_NULL, 0);
  /* Between chunks, stop early once the caller has given up: a detached
  ** request should not hold a pool thread for the rest of a big file. */
  while (!ums_lua_abandoned(w)) {
    ssize_t n = read(fd, r->buf, sizeof r->buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      r->failed = 1;
      break;
    }
    r->crc = crc32(r->crc, r->buf, (uInt)n);
    r->bytes += n;
  }
  int err = errno;
  close(fd);
  errno = err;  /* the continuation reports the read's errno, not close's */
}

static int crc_k(lua_State *L, int status, void *ud) {
  crc_req *r = ud;
  if (status == UMS_LUA_TIMEOUT) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  if (r->failed) {
    int err = errno;  /* the work's (UMS_LUA_ERRNO) */
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", r->path, strerror(err));
    lua_pushinteger(L, err);
    return 3;
  }
  lua_pushinteger(L, (lua_Integer)r->crc);
  lua_pushinteger(L, r->bytes);
  return 2;
}

/* zutil.crc32_file(path [, timeout]) */
static int l_crc32_file(lua_State *L) {
  size_t len;
  const char *path = luaL_checklstring(L, 1, &len);
  luaL_argcheck(L, strlen(path) == len, 1, "path contains a NUL byte");
  double timeout = ums_lua_opttimeout(L, 2);
  crc_req *r = req_new(L, sizeof *r + len + 1);
  memcpy(r->path, path, len + 1);
  return ums_lua_preempt(L, crc_work, r, req_free, crc_k, timeout,
                         UMS_LUA_ERRNO);
}

/* ---------------------------------------------------------------------- */
/* compress, uncompress                                                    */
/* ---------------------------------------------------------------------- */

/* Owned by ums_lua_preempt from the call on (released by zreq_release). */
typedef struct zreq {
  int level;                   /* compress: zlib level */
  int rc;                      /* work: zlib's result */
  uLongf outlen;               /* in: room in out; work: bytes written */
  unsigned char *out;          /* malloc'ed with the request, freed by
                                  zreq_release */
  size_t inlen;
  unsigned char in[];          /* a copy of the input */
} zreq;

static void zreq_release(void *ud) {
  zreq *r = ud;
  free(r->out);
  req_free(r);
}

static zreq *zreq_new(lua_State *L, const char *s, size_t len,
                      size_t outlen) {
  zreq *r = req_new(L, sizeof *r + len);
  memcpy(r->in, s, len);
  r->inlen = len;
  r->outlen = (uLongf)outlen;
  /* At least one byte: malloc(0) may return NULL. */
  r->out = malloc(outlen ? outlen : 1);
  if (!r->out) {
    zreq_release(r);
    luaL_error(L, "zutil: out of memory");
  }
  return r;
}

static void compress_work(void *ud, const ums_lua_work_t *w) {
  zreq *r = ud;
  (void)w;
  r->rc = compress2(r->out, &r->outlen, r->in, (uLong)r->inlen, r->level);
}

static void uncompress_work(void *ud, const ums_lua_work_t *w) {
  zreq *r = ud;
  (void)w;
  uLong inlen = (uLong)r->inlen;
  r->rc = uncompress2(r->out, &r->outlen, r->in, &inlen);
}

static int push_timeout(lua_State *L) {
  lua_pushnil(L);
  lua_pushliteral(L, "timeout");
  return 2;
}

static int compress_k(lua_State *L, int status, void *ud) {
  zreq *r = ud;
  if (status == UMS_LUA_TIMEOUT) return push_timeout(L);
  if (r->rc != Z_OK)
    /* compressBound is always enough: only Z_MEM_ERROR is left. */
    return luaL_error(L, "zutil.compress: %s", zError(r->rc));
  lua_pushlstring(L, (const char *)r->out, r->outlen);
  return 1;
}

static int uncompress_k(lua_State *L, int status, void *ud) {
  zreq *r = ud;
  if (status == UMS_LUA_TIMEOUT) return push_timeout(L);
  switch (r->rc) {
    case Z_OK:
      lua_pushlstring(L, (const char *)r->out, r->outlen);
      return 1;
    case Z_BUF_ERROR:
      /* uncompress2 says Z_BUF_ERROR only when the output is full (a
      ** truncated input is Z_DATA_ERROR). The caller said how big the
      ** data is, and it was wrong: a programming error, raised from the
      ** continuation; it reaches the task's pcall or its joiner like any
      ** error. */
      return luaL_error(L, "zutil.uncompress: the data is larger than "
                           "size (%I bytes)",
                        (lua_Integer)lua_tointeger(L, 2));
    case Z_MEM_ERROR:
      return luaL_error(L, "zutil.uncompress: %s", zError(r->rc));
    default:
      break;
  }
  lua_pushnil(L);
  lua_pushfstring(L, "zutil.uncompress: %s", zError(r->rc));
  return 2;
}

/* zutil.compress(s [, level [, timeout]]) */
static int l_compress(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  lua_Integer level = luaL_optinteger(L, 2, Z_DEFAULT_COMPRESSION);
  luaL_argcheck(L, level >= -1 && level <= 9, 2, "level must be -1..9");
  double timeout = ums_lua_opttimeout(L, 3);
  zreq *r = zreq_new(L, s, len, compressBound((uLong)len));
  r->level = (int)level;
  return ums_lua_preempt(L, compress_work, r, zreq_release, compress_k,
                         timeout, 0);
}

/* Largest size uncompress accepts. */
#define UNCOMPRESS_MAX ((lua_Integer)1 << 30)

/* zutil.uncompress(z, size [, timeout]) */
static int l_uncompress(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  lua_Integer size = luaL_checkinteger(L, 2);
  luaL_argcheck(L, size >= 0 && size <= UNCOMPRESS_MAX, 2,
                "size must be 0..2^30");
  double timeout = ums_lua_opttimeout(L, 3);
  zreq *r = zreq_new(L, s, len, (size_t)size);
  return ums_lua_preempt(L, uncompress_work, r, zreq_release, uncompress_k,
                         timeout, 0);
}

/* zutil.pending() */
static int l_pending(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)atomic_load(&live));
  return 1;
}

int luaopen_zutil(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"crc32_file", l_crc32_file}, {"compress", l_compress},
      {"uncompress", l_uncompress}, {"pending", l_pending},
      {NULL, NULL}};
  /* Fail at require, with a clear message, when ums is not loaded. */
  ums_lua_check(L, "zutil");
  luaL_newlib(L, funcs);
  return 1;
}
