/*
** lcopy.c: values out of one Lua VM into C memory (an lmsg), and from
** there into another VM. Work submitted to another scheduler, its
** results, and the values sent through shared channels cross VMs this
** way: the sending VM's thread encodes, the receiving VM's thread
** decodes, and in between the message is plain malloc'ed memory that no
** VM owns, so no VM ever touches another's objects.
**
** The encoding is a byte stream (native byte order: a message never
** leaves the process), one tag byte per value:
**   'n' nil, 'f' false, 't' true
**   'i' int64 (an integer)            'd' double (a float)
**   's' size_t length, the bytes
**   'T' uint32 array size hint, then key and value pairs, then 'e':
**       a table, which gets the next id
**   'F' size_t length, lua_dump output: a Lua function, the next id
**   'r' uint32 id: the table or function with that id again (a shared
**       reference or a cycle)
**   'o' uint32 index into m->refs: a shared object, by reference
** Ids are given in the order tables and functions are first met, by the
** encoder and the decoder alike.
**
** A C host's values (ums_lua_value_t, ums-lua.h) use the same encoding:
** lcopy_from_values writes it without a VM, lcopy_to_values reads it back
** into C values, so host arguments and results go through the same
** requests as Lua's.
*/
#include "lproxy.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deeper nesting is refused. The encoder and the decoder walk tables with
** an array of open tables rather than by recursion, so that a copy needs
** the same C stack at any depth: a copy made at the bottom of a task's
** smallest stack (under Lua's own limit of nested C calls) must not
** overflow it. */
#define MAX_DEPTH 200


/* ---------------------------------------------------------------------- */
/* Messages                                                                */
/* ---------------------------------------------------------------------- */

void lcopy_clear(lmsg *m) {
  for (uint32_t i = 0; i < m->nrefs; i++) lshared_unref(m->refs[i]);
  free(m->refs);
  if (m->data != m->inl) free(m->data);
}

void lcopy_free(lmsg *m) {
  if (!m) return;
  lcopy_clear(m);
  free(m);
}

void lcopy_move(lmsg *dst, lmsg *src) {
  /* Only the used part of the inline buffer is worth copying. */
  memcpy(dst, src, offsetof(lmsg, inl));
  if (src->data == src->inl) {
    memcpy(dst->inl, src->inl, src->len);
    dst->data = dst->inl;
  }
}

/* ---------------------------------------------------------------------- */
/* Encoding                                                                */
/* ---------------------------------------------------------------------- */

typedef struct enc {
  lua_State *L;
  lmsg *m;
  int seen;              /* stack index: table or function -> id */
  uint32_t nids;
  int globals;           /* stack index: the global table */
  /* The path to the value being encoded: path[d] is the stack index of
  ** the key that leads from level d - 1 to level d, or 0 where the value
  ** at level d is itself a key (it is shown as "[key]"). */
  int path[MAX_DEPTH + 1];
  /* The tables being walked, outermost first: open[j] is at depth j. */
  struct {
    int t;               /* stack index of the table */
    int step;            /* E_NEXT, E_VALUE or E_POP: what comes next */
  } open[MAX_DEPTH];
  int nopen;
  const char *root;
  bool indexed;
  int top;               /* which top-level value (0-based) */
  char *err;
  size_t errsz;
  bool failed;
} enc;

/* Makes room for `more` bytes in m, which has less; false when out of
** memory. Out of line: msg_put, inlined into its callers with a constant
** size, stays a few moves for the scalars of every message. */
static __attribute__((noinline)) bool msg_grow(lmsg *m, size_t more) {
  size_t cap = m->cap * 2;
  while (cap < m->len + more) cap *= 2;
  char *p;
  if (m->data == m->inl) {
    p = malloc(cap);
    if (p) memcpy(p, m->inl, m->len);
  } else {
    p = realloc(m->data, cap);
  }
  if (!p) return false;
  m->data = p;
  m->cap = cap;
  return true;
}

/* Appends n bytes to m; false when out of memory. */
static inline bool msg_put(lmsg *m, const void *p, size_t n) {
  if (m->len + n > m->cap && !msg_grow(m, n)) return false;
  memcpy(m->data + m->len, p, n);
  m->len += n;
  return true;
}

/* Makes m an empty message for n values. */
static void msg_init(lmsg *m, int n) {
  m->data = m->inl;
  m->len = 0;
  m->cap = sizeof m->inl;
  m->refs = NULL;
  m->nrefs = m->caprefs = 0;
  m->nvalues = n;
  m->nids = 0;
}

/* An empty message for n values; NULL when out of memory. */
static lmsg *msg_new(int n) {
  lmsg *m = malloc(sizeof *m);
  if (m) msg_init(m, n);
  return m;
}

static void put(enc *e, const void *p, size_t n) {
  if (!msg_put(e->m, p, n)) luaL_error(e->L, "not enough memory");
}

static void put_tag(enc *e, char tag) { put(e, &tag, 1); }

static void put_u32(enc *e, uint32_t v) { put(e, &v, sizeof v); }

static void put_size(enc *e, size_t v) { put(e, &v, sizeof v); }

static int dump_writer(lua_State *L, const void *p, size_t n, void *ud) {
  (void)L;
  return msg_put(((enc *)ud)->m, p, n) ? 0 : 1;
}

static void add_ref(enc *e, lshared *o) {
  lmsg *m = e->m;
  if (m->nrefs == m->caprefs) {
    uint32_t cap = m->caprefs ? m->caprefs * 2 : 4;
    lshared **r = realloc(m->refs, cap * sizeof *r);
    if (!r) luaL_error(e->L, "not enough memory");
    m->refs = r;
    m->caprefs = cap;
  }
  lshared_ref(o);
  m->refs[m->nrefs++] = o;
}

/* Appends to buf (size n, at *len) as much of s as fits. */
static void append(char *buf, size_t n, size_t *len, const char *s) {
  while (*s && *len + 1 < n) buf[(*len)++] = *s++;
  buf[*len] = '\0';
}

static bool is_name(const char *s, size_t len) {
  if (len == 0 || len > 40) return false;
  if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') ||
        s[0] == '_'))
    return false;
  for (size_t i = 1; i < len; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_'))
      return false;
  }
  return true;
}

/* Appends one path step, the key at stack index k of L, to buf. */
static void append_key(lua_State *L, char *buf, size_t bufsz, size_t *len,
                       int k) {
  char tmp[96];
  switch (lua_type(L, k)) {
    case LUA_TSTRING: {
      size_t n;
      const char *s = lua_tolstring(L, k, &n);
      if (is_name(s, n)) {
        snprintf(tmp, sizeof tmp, ".%s", s);
      } else {
        /* Quoted, printable bytes only, cut at 32. */
        char q[40];
        size_t j = 0;
        for (size_t i = 0; i < n && j < 32; i++)
          q[j++] = (s[i] >= 32 && s[i] < 127 && s[i] != '"' && s[i] != '\\')
                       ? s[i] : '?';
        q[j] = '\0';
        snprintf(tmp, sizeof tmp, "[\"%s%s\"]", q, n > 32 ? "..." : "");
      }
      break;
    }
    case LUA_TNUMBER:
      if (lua_isinteger(L, k))
        snprintf(tmp, sizeof tmp, "[%lld]", (long long)lua_tointeger(L, k));
      else
        snprintf(tmp, sizeof tmp, "[%.14g]", (double)lua_tonumber(L, k));
      break;
    case LUA_TBOOLEAN:
      snprintf(tmp, sizeof tmp, "[%s]", lua_toboolean(L, k) ? "true" : "false");
      break;
    default:
      snprintf(tmp, sizeof tmp, "[<%s>]", luaL_typename(L, k));
      break;
  }
  append(buf, bufsz, len, tmp);
}

/* Records the failure "<path to the value at depth>: <what>". A path too
** long for err loses its middle ("..."), never the description. */
static void fail(enc *e, int depth, const char *what) {
  char path[512];
  size_t len = 0, keep;
  char tmp[64];
  e->failed = true;
  path[0] = '\0';
  append(path, sizeof path, &len, e->root);
  if (e->indexed) {
    snprintf(tmp, sizeof tmp, "[%d]", e->top + 1);
    append(path, sizeof path, &len, tmp);
  }
  keep = len;  /* the root always stays */
  for (int d = 1; d <= depth; d++) {
    size_t before = len;
    if (e->path[d] == 0)
      append(path, sizeof path, &len, "[<key>]");
    else
      append_key(e->L, path, sizeof path, &len, e->path[d]);
    if (len == before) break;  /* full */
  }
  size_t wlen = strlen(what) + 2;
  size_t room = e->errsz > wlen + 1 ? e->errsz - wlen - 1 : 0;
  len = 0;
  e->err[0] = '\0';
  if (strlen(path) <= room) {
    append(e->err, e->errsz, &len, path);
  } else if (room > keep + 3) {
    /* root ... tail of the path */
    size_t tail = room - keep - 3;
    memcpy(e->err, path, keep);
    memcpy(e->err + keep, "...", 3);
    memcpy(e->err + keep + 3, path + strlen(path) - tail, tail);
    len = room;
    e->err[len] = '\0';
  }
  append(e->err, e->errsz, &len, ": ");
  append(e->err, e->errsz, &len, what);
}

/* The __name of the metatable of the value at idx, or NULL. */
static const char *mt_name(lua_State *L, int idx) {
  const char *name = NULL;
  if (luaL_getmetafield(L, idx, "__name") != LUA_TNIL) {
    if (lua_type(L, -1) == LUA_TSTRING) name = lua_tostring(L, -1);
    lua_pop(L, 1);  /* the metatable keeps the string alive */
  }
  return name;
}

/* Why the userdata or table at idx cannot be copied, with a hint for the
** ums objects that have a shared counterpart. */
static void fail_object(enc *e, int depth, int idx, bool table) {
  char what[160];
  const char *name = mt_name(e->L, idx);
  static const char *const shareable[] = {
      "ums.channel", "ums.mutex", "ums.semaphore", "ums.event",
      "ums.waitgroup", NULL};
  for (int i = 0; name && shareable[i]; i++) {
    if (strcmp(name, shareable[i]) == 0) {
      snprintf(what, sizeof what,
               "%s is not shared (create it with {shared = true} or "
               "ums.shared.%s)", name, name + 4);
      fail(e, depth, what);
      return;
    }
  }
  if (name && strcmp(name, "ums.task") == 0) {
    fail(e, depth, "ums.task (a task stays in its VM; submit work with "
                   "ums.submit and pass its handle)");
    return;
  }
  if (table)
    snprintf(what, sizeof what, "table with a metatable%s%s%s",
             name ? " (" : "", name ? name : "", name ? ")" : "");
  else
    snprintf(what, sizeof what, "userdata%s%s%s", name ? " (" : "",
             name ? name : "", name ? ")" : "");
  fail(e, depth, what);
}

/* Checks the upvalues of the Lua function at idx: only _ENV may cross,
** and it becomes the receiving VM's global table (lua_load puts that in
** the first upvalue of what it loads, and a function whose only upvalue
** is _ENV has it first). Whatever _ENV held here (the global table, or a
** sandbox such as Busted's) stays behind. */
static bool check_upvalues(enc *e, int depth, int idx) {
  lua_State *L = e->L;
  char bad[128];
  size_t len = 0;
  const char *name;
  bad[0] = '\0';
  for (int i = 1; (name = lua_getupvalue(L, idx, i)) != NULL; i++) {
    /* A function loaded from a stripped chunk has no upvalue names: its
    ** only upvalue is taken for _ENV if it holds the global table. */
    bool anon = name[0] == '\0' || strcmp(name, "(no name)") == 0;
    bool env = i == 1 && (strcmp(name, "_ENV") == 0 ||
                          (anon && lua_rawequal(L, -1, e->globals)));
    lua_pop(L, 1);
    if (env) continue;
    if (len) append(bad, sizeof bad, &len, ", ");
    append(bad, sizeof bad, &len, anon ? "?" : name);
  }
  if (len) {
    char what[192];
    snprintf(what, sizeof what, "function with upvalues (%s)", bad);
    fail(e, depth, what);
    return false;
  }
  return true;
}

/* A table or function met before is written as a reference. */
static bool put_seen(enc *e, int idx) {
  lua_State *L = e->L;
  lua_pushvalue(L, idx);
  if (lua_rawget(L, e->seen) == LUA_TNUMBER) {
    uint32_t id = (uint32_t)lua_tointeger(L, -1);
    lua_pop(L, 1);
    put_tag(e, 'r');
    put_u32(e, id);
    return true;
  }
  lua_pop(L, 1);
  return false;
}

static void mark_seen(enc *e, int idx) {
  lua_State *L = e->L;
  lua_pushvalue(L, idx);
  lua_pushinteger(L, e->nids++);
  lua_rawset(L, e->seen);
}

/* What the walk of an open table does next. */
enum { E_NEXT, E_VALUE, E_POP };

/* Writes the table's header and opens it: encode_walk writes its pairs.
** The table's traversal key is the top of the Lua stack while it is
** open. */
static void open_table(enc *e, int idx, int depth) {
  lua_State *L = e->L;
  if (put_seen(e, idx)) return;
  if (lua_getmetatable(L, idx)) {
    lua_pop(L, 1);
    fail_object(e, depth, idx, true);
    return;
  }
  if (depth >= MAX_DEPTH) {
    fail(e, depth, "tables nested too deeply");
    return;
  }
  luaL_checkstack(L, 6, "tables nested too deeply");
  mark_seen(e, idx);
  put_tag(e, 'T');
  lua_Unsigned n = lua_rawlen(L, idx);
  put_u32(e, n > 0xffffffu ? 0xffffffu : (uint32_t)n);
  lua_pushnil(L);
  e->open[e->nopen].t = idx;
  e->open[e->nopen].step = E_NEXT;
  e->nopen++;
}

static void encode_function(enc *e, int idx, int depth) {
  lua_State *L = e->L;
  if (put_seen(e, idx)) return;
  if (lua_iscfunction(L, idx)) {
    fail(e, depth, "C function");
    return;
  }
  if (!check_upvalues(e, depth, idx)) return;
  mark_seen(e, idx);
  put_tag(e, 'F');
  size_t at = e->m->len;
  put_size(e, 0);  /* the length, patched below */
  lua_pushvalue(L, idx);
  int st = lua_dump(L, dump_writer, e, 0);
  lua_pop(L, 1);
  if (st != 0) luaL_error(L, "not enough memory");
  size_t n = e->m->len - at - sizeof n;
  memcpy(e->m->data + at, &n, sizeof n);
}

/* Writes the value at idx, at the given depth; a table is only opened. */
static void encode_value(enc *e, int idx, int depth) {
  lua_State *L = e->L;
  switch (lua_type(L, idx)) {
    case LUA_TNIL:
      put_tag(e, 'n');
      break;
    case LUA_TBOOLEAN:
      put_tag(e, lua_toboolean(L, idx) ? 't' : 'f');
      break;
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx)) {
        int64_t v = (int64_t)lua_tointeger(L, idx);
        put_tag(e, 'i');
        put(e, &v, sizeof v);
      } else {
        double v = (double)lua_tonumber(L, idx);
        put_tag(e, 'd');
        put(e, &v, sizeof v);
      }
      break;
    case LUA_TSTRING: {
      size_t n;
      const char *s = lua_tolstring(L, idx, &n);
      put_tag(e, 's');
      put_size(e, n);
      put(e, s, n);
      break;
    }
    case LUA_TTABLE:
      open_table(e, idx, depth);
      break;
    case LUA_TFUNCTION:
      encode_function(e, idx, depth);
      break;
    case LUA_TUSERDATA: {
      lshared *o = lshared_test(L, idx);
      if (!o) {
        fail_object(e, depth, idx, false);
        break;
      }
      put_tag(e, 'o');
      put_u32(e, e->m->nrefs);
      add_ref(e, o);
      break;
    }
    case LUA_TLIGHTUSERDATA:
      fail(e, depth, "light userdata");
      break;
    case LUA_TTHREAD:
      fail(e, depth, "thread (a coroutine)");
      break;
    default:
      fail(e, depth, luaL_typename(L, idx));
      break;
  }
}

/* Writes the top-level value at idx and everything it holds. The pairs
** of the innermost open table come next; a key or value that is a table
** opens it on top, and its walk resumes once that one is closed. The Lua
** stack mirrors e->open: each open table has its traversal key (and,
** from E_VALUE on, the value) above those of the tables around it. */
static void encode(enc *e, int idx) {
  lua_State *L = e->L;
  e->nopen = 0;
  encode_value(e, idx, 0);
  while (e->nopen > 0 && !e->failed) {
    int depth = e->nopen;  /* the depth of the open table's pairs */
    int t = e->open[depth - 1].t;
    switch (e->open[depth - 1].step) {
      case E_NEXT:
        if (!lua_next(L, t)) {
          put_tag(e, 'e');
          e->nopen--;
          break;
        }
        e->open[depth - 1].step = E_VALUE;
        e->path[depth] = 0;
        encode_value(e, lua_gettop(L) - 1, depth);
        break;
      case E_VALUE: {
        int k = lua_gettop(L) - 1;
        e->open[depth - 1].step = E_POP;
        e->path[depth] = k;
        encode_value(e, k + 1, depth);
        break;
      }
      default: /* E_POP */
        lua_pop(L, 1);
        e->open[depth - 1].step = E_NEXT;
        break;
    }
  }
}

/* The encoding proper, in a protected call: (e, values...). */
static int encode_all(lua_State *L) {
  enc *e = (enc *)lua_touserdata(L, 1);
  int n = lua_gettop(L) - 1;
  e->L = L;
  lua_pushglobaltable(L);
  e->globals = lua_gettop(L);
  /* Scalars need no table of seen objects; most messages are scalars. */
  for (int i = 0; i < n; i++) {
    int t = lua_type(L, 2 + i);
    if ((t == LUA_TTABLE || t == LUA_TFUNCTION) && !e->seen) {
      lua_newtable(L);
      e->seen = lua_gettop(L);
    }
  }
  for (int i = 0; i < n && !e->failed; i++) {
    e->top = i;
    e->path[0] = 0;
    encode(e, 2 + i);
  }
  return 0;
}

/* Whether the n values from first are all nil, booleans, numbers or
** strings: those are written by put_scalars, without the general walk. */
static bool all_scalars(lua_State *L, int first, int n) {
  for (int i = 0; i < n; i++) {
    int t = lua_type(L, first + i);
    if (t != LUA_TNIL && t != LUA_TBOOLEAN && t != LUA_TNUMBER &&
        t != LUA_TSTRING)
      return false;
  }
  return true;
}

/* Writes scalars as encode_value does. Nothing here can raise (reading a
** string does not convert it), so it needs no protected call, which is
** most of what a message of one number costs; false when memory runs
** out. */
static bool put_scalars(lua_State *L, lmsg *m, int first, int n) {
  for (int i = 0; i < n; i++) {
    int idx = first + i;
    char tag;
    bool ok;
    switch (lua_type(L, idx)) {
      case LUA_TNIL:
        tag = 'n';
        ok = msg_put(m, &tag, 1);
        break;
      case LUA_TBOOLEAN:
        tag = lua_toboolean(L, idx) ? 't' : 'f';
        ok = msg_put(m, &tag, 1);
        break;
      case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
          int64_t v = (int64_t)lua_tointeger(L, idx);
          tag = 'i';
          ok = msg_put(m, &tag, 1) && msg_put(m, &v, sizeof v);
        } else {
          double v = (double)lua_tonumber(L, idx);
          tag = 'd';
          ok = msg_put(m, &tag, 1) && msg_put(m, &v, sizeof v);
        }
        break;
      default: { /* LUA_TSTRING (all_scalars) */
        size_t len;
        const char *str = lua_tolstring(L, idx, &len);
        tag = 's';
        ok = msg_put(m, &tag, 1) && msg_put(m, &len, sizeof len) &&
             msg_put(m, str, len);
        break;
      }
    }
    if (!ok) return false;
  }
  return true;
}

bool lcopy_encode_scalars(lua_State *L, int first, int n, lmsg *m) {
  first = lua_absindex(L, first);
  if (!all_scalars(L, first, n)) return false;
  msg_init(m, n);
  if (!put_scalars(L, m, first, n)) {
    lcopy_clear(m);
    luaL_error(L, "not enough memory");
  }
  return true;
}

lmsg *lcopy_encode(lua_State *L, int first, int n, const char *root,
                   bool indexed, char *err, size_t errsz, int *bad) {
  first = lua_absindex(L, first);
  luaL_checkstack(L, n + 2, "too many values to copy");
  lmsg *m = msg_new(n);
  if (!m) luaL_error(L, "not enough memory");
  if (all_scalars(L, first, n)) {
    if (!put_scalars(L, m, first, n)) {
      lcopy_free(m);
      luaL_error(L, "not enough memory");
    }
    return m;
  }
  enc e;
  e.m = m;
  e.nids = 0;
  e.root = root;
  e.indexed = indexed;
  e.err = err;
  e.errsz = errsz;
  e.failed = false;
  e.seen = 0;
  /* Protected, so that a memory error raised by the Lua API half-way
  ** cannot leak m: it is freed here and the error raised again. */
  lua_pushcfunction(L, encode_all);
  lua_pushlightuserdata(L, &e);
  for (int i = 0; i < n; i++) lua_pushvalue(L, first + i);
  if (lua_pcall(L, n + 1, 0, 0) != LUA_OK) {
    lcopy_free(m);
    lua_error(L);
  }
  if (e.failed) {
    *bad = e.top;
    lcopy_free(m);
    return NULL;
  }
  m->nids = e.nids;
  return m;
}

/* ---------------------------------------------------------------------- */
/* Decoding                                                                */
/* ---------------------------------------------------------------------- */

typedef struct dec {
  lua_State *L;
  const lmsg *m;
  const char *p, *end;
  int ids;               /* stack index: id + 1 -> table or function */
  lua_Integer nids;
  /* The tables being filled, outermost first (as the encoder's). */
  struct {
    int t;               /* stack index of the table */
    bool has_key;        /* its next key is on the stack, the value next */
  } open[MAX_DEPTH];
  int nopen;
} dec;

static void get(dec *d, void *out, size_t n) {
  if ((size_t)(d->end - d->p) < n) luaL_error(d->L, "ums: corrupt message");
  memcpy(out, d->p, n);
  d->p += n;
}

static char get_tag(dec *d) {
  char c;
  get(d, &c, 1);
  return c;
}

typedef struct chunk {
  const char *p;
  size_t n;
} chunk;

static const char *chunk_reader(lua_State *L, void *ud, size_t *size) {
  chunk *c = ud;
  (void)L;
  *size = c->n;
  c->n = 0;
  return *size ? c->p : NULL;
}

static void new_id(dec *d) {
  lua_pushvalue(d->L, -1);
  lua_rawseti(d->L, d->ids, ++d->nids);
}

/* Pushes the next value; a table is pushed empty and opened, and decode
** fills it. Returns whether the value pushed is whole. */
static bool decode_value(dec *d) {
  lua_State *L = d->L;
  luaL_checkstack(L, 4, "tables nested too deeply");
  char tag = get_tag(d);
  switch (tag) {
    case 'n':
      lua_pushnil(L);
      break;
    case 'f':
    case 't':
      lua_pushboolean(L, tag == 't');
      break;
    case 'i': {
      int64_t v;
      get(d, &v, sizeof v);
      lua_pushinteger(L, (lua_Integer)v);
      break;
    }
    case 'd': {
      double v;
      get(d, &v, sizeof v);
      lua_pushnumber(L, (lua_Number)v);
      break;
    }
    case 's': {
      size_t n;
      get(d, &n, sizeof n);
      if ((size_t)(d->end - d->p) < n) luaL_error(L, "ums: corrupt message");
      lua_pushlstring(L, d->p, n);
      d->p += n;
      break;
    }
    case 'T': {
      uint32_t narr;
      get(d, &narr, sizeof narr);
      /* The encoder opens fewer tables than this. */
      if (d->nopen >= MAX_DEPTH) luaL_error(L, "ums: corrupt message");
      lua_createtable(L, (int)(narr > 1u << 20 ? 1u << 20 : narr), 0);
      new_id(d);
      d->open[d->nopen].t = lua_gettop(L);
      d->open[d->nopen].has_key = false;
      d->nopen++;
      return false;
    }
    case 'F': {
      size_t n;
      get(d, &n, sizeof n);
      if ((size_t)(d->end - d->p) < n) luaL_error(L, "ums: corrupt message");
      chunk c = {d->p, n};
      d->p += n;
      /* A binary chunk keeps its own source name (tracebacks point at
      ** the original file and lines); load puts the global table into
      ** its first upvalue, which can only be _ENV (lcopy_encode). */
      if (lua_load(L, chunk_reader, &c, "=(copied function)", "b") != LUA_OK)
        lua_error(L);
      new_id(d);
      break;
    }
    case 'r': {
      uint32_t id;
      get(d, &id, sizeof id);
      lua_rawgeti(L, d->ids, (lua_Integer)id + 1);
      break;
    }
    case 'o': {
      uint32_t i;
      get(d, &i, sizeof i);
      if (i >= d->m->nrefs) luaL_error(L, "ums: corrupt message");
      lshared_push(L, d->m->refs[i]);
      break;
    }
    default:
      luaL_error(L, "ums: corrupt message");
  }
  return true;
}

/* Pushes the next top-level value, whole. A whole value goes into the
** innermost open table: as its key, or, with the key, as a pair. */
static void decode(dec *d) {
  lua_State *L = d->L;
  d->nopen = 0;
  bool whole = decode_value(d);
  while (d->nopen > 0) {
    int i = d->nopen - 1;
    if (whole) {
      if (d->open[i].has_key) lua_rawset(L, d->open[i].t);
      d->open[i].has_key = !d->open[i].has_key;
    }
    if (!d->open[i].has_key && d->p < d->end && *d->p == 'e') {
      d->p++;
      d->nopen--;
      whole = true;
      continue;
    }
    whole = decode_value(d);
  }
}

static int decode_all(lua_State *L) {
  return lcopy_decode(L, (const lmsg *)lua_touserdata(L, 1));
}

/* Pushes m's values when they are nil, booleans and numbers
** only: pushing those cannot raise, so no protected call is needed.
** Returns the count, or -1 (nothing pushed) for anything else, or when
** the stack has no room. */
static int decode_numbers(lua_State *L, const lmsg *m) {
  if (m->nids || m->nrefs || !lua_checkstack(L, m->nvalues + 1)) return -1;
  const char *p = m->data, *end = m->data + m->len;
  for (int i = 0; i < m->nvalues; i++) {
    if (p >= end) return -1;
    char tag = *p;
    size_t need = tag == 'i' || tag == 'd' ? 1 + sizeof(int64_t) : 1;
    if ((tag != 'n' && tag != 'f' && tag != 't' && tag != 'i' && tag != 'd') ||
        (size_t)(end - p) < need)
      return -1;
    p += need;
  }
  p = m->data;
  for (int i = 0; i < m->nvalues; i++) {
    char tag = *p++;
    if (tag == 'i') {
      int64_t v;
      memcpy(&v, p, sizeof v);
      p += sizeof v;
      lua_pushinteger(L, (lua_Integer)v);
    } else if (tag == 'd') {
      double v;
      memcpy(&v, p, sizeof v);
      p += sizeof v;
      lua_pushnumber(L, (lua_Number)v);
    } else if (tag == 'n') {
      lua_pushnil(L);
    } else {
      lua_pushboolean(L, tag == 't');
    }
  }
  return m->nvalues;
}

int lcopy_decode_clear(lua_State *L, lmsg *m) {
  int n = decode_numbers(L, m);
  if (n >= 0) {
    lcopy_clear(m);
    return n;
  }
  int base = lua_gettop(L);
  if (!lua_checkstack(L, 2)) {
    lcopy_clear(m);
    luaL_error(L, "stack overflow (too many values)");
  }
  /* Protected, so that m is released also when decoding raises. */
  lua_pushcfunction(L, decode_all);
  lua_pushlightuserdata(L, m);
  int st = lua_pcall(L, 1, LUA_MULTRET, 0);
  lcopy_clear(m);
  if (st != LUA_OK) lua_error(L);
  return lua_gettop(L) - base;
}

int lcopy_decode_free(lua_State *L, lmsg *m) {
  /* A copy on the C stack, so that m's memory goes back before decoding
  ** can raise. */
  lmsg local;
  lcopy_move(&local, m);
  free(m);
  return lcopy_decode_clear(L, &local);
}

int lcopy_decode(lua_State *L, const lmsg *m) {
  luaL_checkstack(L, m->nvalues + 4, "too many values");
  dec d;
  d.L = L;
  d.m = m;
  d.p = m->data;
  d.end = m->data + m->len;
  d.nids = 0;
  d.ids = 0;
  if (m->nids) {  /* only tables and functions need the table of ids */
    lua_createtable(L, (int)(m->nids > 1024 ? 1024 : m->nids), 0);
    d.ids = lua_gettop(L);
  }
  for (int i = 0; i < m->nvalues; i++) decode(&d);
  if (d.ids) lua_remove(L, d.ids);
  return m->nvalues;
}

/* ---------------------------------------------------------------------- */
/* A C host's values (ums-lua.h), without a VM                             */
/* ---------------------------------------------------------------------- */

typedef struct henc {
  lmsg *m;
  uint32_t nids;
  char *err;
  size_t errsz;
  const char *root;
  int top;               /* which top-level value (0-based) */
} henc;

/* Records "<root>[top]: <what>"; false, for the callers' returns. */
static bool hfail(henc *e, const char *what) {
  snprintf(e->err, e->errsz, "%s[%d]: %s", e->root, e->top + 1, what);
  return false;
}

static bool hput_tag(henc *e, char tag) {
  return msg_put(e->m, &tag, 1) || hfail(e, "out of memory");
}

static bool hencode(henc *e, const ums_lua_value_t *v, int depth) {
  lmsg *m = e->m;
  switch (v->type) {
    case UMS_LUA_TNIL:
      return hput_tag(e, 'n');
    case UMS_LUA_TBOOLEAN:
      return hput_tag(e, v->u.boolean ? 't' : 'f');
    case UMS_LUA_TINTEGER:
      return (hput_tag(e, 'i') &&
              msg_put(m, &v->u.integer, sizeof v->u.integer)) ||
             hfail(e, "out of memory");
    case UMS_LUA_TFLOAT:
      return (hput_tag(e, 'd') &&
              msg_put(m, &v->u.number, sizeof v->u.number)) ||
             hfail(e, "out of memory");
    case UMS_LUA_TSTRING: {
      size_t n = v->u.string.len;
      if (!v->u.string.ptr && n) return hfail(e, "string without bytes");
      return (hput_tag(e, 's') && msg_put(m, &n, sizeof n) &&
              msg_put(m, v->u.string.ptr, n)) ||
             hfail(e, "out of memory");
    }
    case UMS_LUA_TTABLE: {
      if (depth >= MAX_DEPTH) return hfail(e, "tables nested too deeply");
      if (v->u.table.n && !v->u.table.fields)
        return hfail(e, "table without fields");
      uint32_t hint = 0;
      e->nids++;
      if (!hput_tag(e, 'T') || !msg_put(m, &hint, sizeof hint))
        return hfail(e, "out of memory");
      for (size_t i = 0; i < v->u.table.n; i++) {
        const ums_lua_field_t *f = &v->u.table.fields[i];
        if (f->key.type == UMS_LUA_TNIL) return hfail(e, "table key is nil");
        if (f->key.type == UMS_LUA_TFLOAT && f->key.u.number != f->key.u.number)
          return hfail(e, "table key is NaN");
        if (!hencode(e, &f->key, depth + 1) ||
            !hencode(e, &f->value, depth + 1))
          return false;
      }
      return hput_tag(e, 'e');
    }
    default: {
      char what[64];
      snprintf(what, sizeof what, "unknown value type %d", v->type);
      return hfail(e, what);
    }
  }
}

lmsg *lcopy_from_values(const ums_lua_value_t *v, int n, const char *root,
                        char *err, size_t errsz) {
  lmsg *m = msg_new(n);
  if (!m) {
    snprintf(err, errsz, "out of memory");
    return NULL;
  }
  henc e = {m, 0, err, errsz, root, 0};
  for (int i = 0; i < n; i++) {
    e.top = i;
    if (!hencode(&e, &v[i], 0)) {
      lcopy_free(m);
      return NULL;
    }
  }
  m->nids = e.nids;
  return m;
}

/* Reading a message back into host values. A reference ('r') to a table
** met before is read again from where that table starts, with the same
** ids given in the same order (ids count tables and functions in the
** order they are met, and a table's inner ones follow its own), unless
** that table is still open: a cycle, which C values cannot hold. */
typedef struct hdec {
  const lmsg *m;
  size_t *at;            /* id -> offset of its 'T' or 'F' */
  bool *open;            /* id -> a table being read, enclosing this one */
  uint32_t known;        /* ids met so far */
  size_t budget;         /* values left before "too large" */
  char *err;
  size_t errsz;
  const char *root;
  int top;
} hdec;

/* Values one message may expand to (references read again). */
#define HOST_BUDGET ((size_t)1 << 24)

static bool hdfail(hdec *d, const char *what) {
  snprintf(d->err, d->errsz, "%s[%d]: %s", d->root, d->top + 1, what);
  return false;
}

static bool hget(hdec *d, size_t *pos, void *out, size_t n) {
  if (d->m->len - *pos < n) return hdfail(d, "corrupt message");
  memcpy(out, d->m->data + *pos, n);
  *pos += n;
  return true;
}

static bool hdecode(hdec *d, size_t *pos, uint32_t *id,
                    ums_lua_value_t *out, int depth);

static bool hdecode_table(hdec *d, size_t *pos, uint32_t *id,
                          ums_lua_value_t *out, int depth) {
  uint32_t hint, me = (*id)++;
  if (me >= d->m->nids) return hdfail(d, "corrupt message");
  d->at[me] = *pos - 1;
  if (me >= d->known) d->known = me + 1;
  if (!hget(d, pos, &hint, sizeof hint)) return false;
  if (depth >= MAX_DEPTH) return hdfail(d, "tables nested too deeply");
  d->open[me] = true;
  *out = ums_lua_table();
  for (;;) {
    if (*pos < d->m->len && d->m->data[*pos] == 'e') {
      (*pos)++;
      break;
    }
    ums_lua_field_t f;
    f.key = f.value = ums_lua_nil();
    if (!hdecode(d, pos, id, &f.key, depth + 1) ||
        !hdecode(d, pos, id, &f.value, depth + 1)) {
      ums_lua_value_free(&f.key);
      ums_lua_value_free(&f.value);
      return false;
    }
    if (ums_lua_table_set(out, f.key, f.value) != 0)
      return hdfail(d, "out of memory");
  }
  d->open[me] = false;
  return true;
}

static bool hdecode(hdec *d, size_t *pos, uint32_t *id,
                    ums_lua_value_t *out, int depth) {
  char tag;
  *out = ums_lua_nil();
  if (d->budget == 0) return hdfail(d, "too many values");
  d->budget--;
  if (!hget(d, pos, &tag, 1)) return false;
  switch (tag) {
    case 'n':
      return true;
    case 'f':
    case 't':
      *out = ums_lua_boolean(tag == 't');
      return true;
    case 'i': {
      int64_t v;
      if (!hget(d, pos, &v, sizeof v)) return false;
      *out = ums_lua_integer(v);
      return true;
    }
    case 'd': {
      double v;
      if (!hget(d, pos, &v, sizeof v)) return false;
      *out = ums_lua_float(v);
      return true;
    }
    case 's': {
      size_t n;
      if (!hget(d, pos, &n, sizeof n)) return false;
      if (d->m->len - *pos < n) return hdfail(d, "corrupt message");
      *out = ums_lua_lstring(d->m->data + *pos, n);
      *pos += n;
      return out->type == UMS_LUA_TSTRING || hdfail(d, "out of memory");
    }
    case 'T':
      return hdecode_table(d, pos, id, out, depth);
    case 'r': {
      uint32_t ref;
      if (!hget(d, pos, &ref, sizeof ref)) return false;
      if (ref >= d->known) return hdfail(d, "corrupt message");
      if (d->open[ref])
        return hdfail(d, "a table that contains itself (a cycle cannot "
                         "reach the host)");
      if (d->m->data[d->at[ref]] != 'T')
        return hdfail(d, "a function cannot reach the host");
      size_t again = d->at[ref] + 1;
      uint32_t rid = ref;
      return hdecode_table(d, &again, &rid, out, depth);
    }
    case 'F':
      return hdfail(d, "a function cannot reach the host");
    case 'o':
      return hdfail(d, "a ums shared object cannot reach the host");
    default:
      return hdfail(d, "corrupt message");
  }
}

int lcopy_to_values(const lmsg *m, ums_lua_value_t **out, const char *root,
                    char *err, size_t errsz) {
  *out = NULL;
  if (m->nvalues == 0) return 0;
  ums_lua_value_t *v = calloc((size_t)m->nvalues, sizeof *v);
  hdec d = {m, NULL, NULL, 0, HOST_BUDGET, err, errsz, root, 0};
  if (m->nids) {
    d.at = calloc(m->nids, sizeof *d.at);
    d.open = calloc(m->nids, sizeof *d.open);
  }
  bool ok = v && (!m->nids || (d.at && d.open));
  if (!ok) snprintf(err, errsz, "out of memory");
  size_t pos = 0;
  uint32_t id = 0;
  int i;
  for (i = 0; ok && i < m->nvalues; i++) {
    d.top = i;
    ok = hdecode(&d, &pos, &id, &v[i], 0);
  }
  free(d.at);
  free(d.open);
  if (!ok) {
    for (int j = 0; v && j < i; j++) ums_lua_value_free(&v[j]);
    free(v);
    return -1;
  }
  *out = v;
  return 0;
}
