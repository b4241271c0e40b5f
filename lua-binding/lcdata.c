/*
** lcdata.c: ums.ffi's memory seen from Lua: cdata (typed C objects made by
** ffi.new, with field and index access), ums.ffi.buffer (untyped bytes),
** ums.ffi.pointer (an address, owning nothing), and ffi.string, copy, fill
** and istype over them.
**
** Ownership. Cdata and buffers live in a reference-counted ums_buf_t. A
** cdata or buffer holds one reference, dropped at __gc; a cdata for a
** field or element of another (s.inner, a[2] of an array of structs)
** holds its own reference on the same memory; a call that passes one
** holds another until the call is over (lccall.c), so memory a detached
** call writes into outlives the Lua value. A pointer stored into a cdata
** does not keep its target alive: the caller keeps it referenced, as in
** LuaJIT.
**
** Bounds. Field access checks the name against the type; an index on an
** array cdata is checked against its element count; ffi.string, copy and
** fill are bounded by a cdata's or buffer's size. A pointer carries no
** size and is not checked.
**
** Threads: the Lua thread of the run, or the main thread outside runs.
*/
#define _GNU_SOURCE
#include "lcdata.h"

#include <stdint.h>
#include <string.h>

#include "lccb.h"
#include "lcdecl.h"

/* Largest ffi.buffer. */
#define BUF_MAX ((lua_Integer)1 << 31)

ums_buf_t *lums_test_buf(lua_State *L, int idx, size_t *size) {
  lbuf *u = lffi_to_buf(L, idx);
  if (!u || !u->b) return NULL;
  *size = u->size;
  return u->b;
}

/* ffi.buffer(n) -> a zero-filled buffer of n bytes */
static int l_buffer(lua_State *L) {
  lua_Integer n = luaL_checkinteger(L, 1);
  luaL_argcheck(L, n > 0 && n <= BUF_MAX, 1, "size out of range");
  lbuf *u = (lbuf *)lua_newuserdatauv(L, sizeof *u, 0);
  u->b = NULL;
  u->size = (size_t)n;
  luaL_setmetatable(L, LFFI_BUF_MT);
  u->b = ums_buf_new((size_t)n);
  if (!u->b) return luaL_error(L, "ums.ffi.buffer: out of memory");
  memset(ums_buf_data(u->b), 0, (size_t)n);
  return 1;
}

static int buf_gc(lua_State *L) {
  lbuf *u = lffi_to_buf(L, 1);
  if (u && u->b) {
    ums_buf_release(u->b);
    u->b = NULL;
  }
  return 0;
}

static int buf_len(lua_State *L) {
  lbuf *u = luaL_checkudata(L, 1, LFFI_BUF_MT);
  lua_pushinteger(L, (lua_Integer)u->size);
  return 1;
}

static int buf_tostring(lua_State *L) {
  lbuf *u = luaL_checkudata(L, 1, LFFI_BUF_MT);
  lua_pushfstring(L, "ums.ffi.buffer (%d bytes): %p", (int)u->size,
                  u->b ? ums_buf_data(u->b) : NULL);
  return 1;
}

static int ptr_tostring(lua_State *L) {
  lptr *u = luaL_checkudata(L, 1, LFFI_PTR_MT);
  lua_pushfstring(L, "ums.ffi.pointer: %p", u->p);
  return 1;
}

/* The address the value at idx stands for: an ums.ffi.pointer's, or a
** cdata's (a pointer cdata's target). False for anything else. */
static bool address_of(lua_State *L, int idx, void **out) {
  lptr *p = lffi_to_ptr(L, idx);
  if (p) {
    *out = p->p;
    return true;
  }
  lcdata *c = (lcdata *)luaL_testudata(L, idx, LFFI_CDATA_MT);
  if (c) {
    *out = c->p;
    return true;
  }
  return false;
}

/* __eq of pointers and cdata: the same address, as LuaJIT compares
** pointer cdata (two reads of one pointer field are equal). */
static int ptr_eq(lua_State *L) {
  void *a, *b;
  lua_pushboolean(L, address_of(L, 1, &a) && address_of(L, 2, &b) &&
                         a == b);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Cdata: typed C objects                                                  */
/* ---------------------------------------------------------------------- */

/* Pushes a cdata of type t at p inside b (taking a reference on b; NULL:
** memory it does not own). Its user value holds its ffi.gc finalizer. */
static lcdata *push_cdata(lua_State *L, const ctype *t, ums_buf_t *b,
                          char *p) {
  lcdata *c = (lcdata *)lua_newuserdatauv(L, sizeof *c, 1);
  c->t = t;
  c->b = b;
  c->p = p;
  if (b) ums_buf_retain(b);
  luaL_setmetatable(L, LFFI_CDATA_MT);
  return c;
}

/* Raises "what: msg" for a value that does not fit where it goes. */
static int value_error(lua_State *L, const char *what, const char *msg) {
  return luaL_error(L, "%s (%s)", what, msg);
}

static void store(lua_State *L, int idx, const ctype *t, char *q,
                  const char *what);

/* Stores the Lua value at idx into the integer or float kind k at q. */
static void store_prim(lua_State *L, int idx, int k, char *q,
                       const char *what) {
  if (k == K_BOOL) {
    if (!lua_isboolean(L, idx)) value_error(L, what, "boolean expected");
    *(uint8_t *)q = (uint8_t)lua_toboolean(L, idx);
    return;
  }
  if (lua_type(L, idx) != LUA_TNUMBER)
    value_error(L, what, lua_pushfstring(L, "number expected, got %s",
                                         luaL_typename(L, idx)));
  if (k == K_FLOAT || k == K_DOUBLE) {
    lua_Number n = lua_tonumber(L, idx);
    if (k == K_DOUBLE)
      memcpy(q, &n, sizeof n);
    else {
      float f = (float)n;
      memcpy(q, &f, sizeof f);
    }
    return;
  }
  int isint;
  lua_Integer n = lua_tointegerx(L, idx, &isint);
  if (!isint) value_error(L, what, "number has no integer representation");
  int64_t lo, hi;
  lffi_kind_range(k, &lo, &hi);
  if (n < lo || n > hi)
    value_error(L, what, lua_pushfstring(L, "number %I out of range for %s",
                                         n, lffi_kind_names[k]));
  switch (k) {
    case K_I8: case K_U8: *(uint8_t *)q = (uint8_t)n; break;
    case K_I16: case K_U16: {
      uint16_t v = (uint16_t)n;
      memcpy(q, &v, sizeof v);
      break;
    }
    case K_I32: case K_U32: {
      uint32_t v = (uint32_t)n;
      memcpy(q, &v, sizeof v);
      break;
    }
    default: memcpy(q, &n, sizeof n); break;
  }
}

/* Stores a table's values into an array (t[1] is element 0) or a struct
** (by field name). */
static void store_table(lua_State *L, int idx, const ctype *t, char *q,
                        const char *what) {
  idx = lua_absindex(L, idx);
  if (t->tag == CT_ARRAY) {
    lua_Integer n = (lua_Integer)luaL_len(L, idx);
    if ((lua_Unsigned)n > t->count)
      value_error(L, what, lua_pushfstring(L, "%I values for %s", n,
                                           t->name));
    for (lua_Integer i = 0; i < n; i++) {
      lua_geti(L, idx, i + 1);
      store(L, -1, t->elem, q + (size_t)i * t->elem->size, what);
      lua_pop(L, 1);
    }
    return;
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    const cfield *f = lua_type(L, -2) == LUA_TSTRING
                          ? lffi_field(t, lua_tostring(L, -2))
                          : NULL;
    if (!f)
      value_error(L, what, lua_pushfstring(L, "'%s' has no field '%s'",
                                           t->name,
                                           luaL_tolstring(L, -2, NULL)));
    store(L, -1, f->type, q + f->offset, what);
    lua_pop(L, 1);
  }
}

/* Stores the Lua value at idx as a t at q. */
static void store(lua_State *L, int idx, const ctype *t, char *q,
                  const char *what) {
  switch (t->tag) {
    case CT_PRIM:
      if (t->kind == K_VOID) value_error(L, what, "cannot store a void");
      store_prim(L, idx, t->kind, q, what);
      return;
    case CT_ENUM:
      store_prim(L, idx, t->kind, q, what);
      return;
    case CT_PTR: {
      void *p;
      lbuf *b;
      lptr *r;
      lcdata *c;
      if (lua_isnil(L, idx)) p = NULL;
      else if ((r = lffi_to_ptr(L, idx)) != NULL) p = r->p;
      else if ((b = lffi_to_buf(L, idx)) != NULL) p = ums_buf_data(b->b);
      else if ((c = lffi_to_cdata(L, idx)) != NULL) p = c->p;
      else if ((p = lffi_cb_code(L, idx, NULL)) != NULL) {
        /* A callback object (ffi.cast): C may call it while the object
        ** lives. A bare function is refused: nothing would keep its
        ** callback alive. */
      } else {
        value_error(L, what, lua_pushfstring(L, "pointer, buffer, cdata, "
                                             "callback or nil expected, "
                                             "got %s",
                                             luaL_typename(L, idx)));
        return;
      }
      memcpy(q, &p, sizeof p);
      return;
    }
    case CT_ARRAY:
    case CT_STRUCT:
    case CT_UNION: {
      lcdata *c = lffi_to_cdata(L, idx);
      if (c && c->t == t) {
        memmove(q, c->p, t->size);
      } else if (lua_istable(L, idx)) {
        store_table(L, idx, t, q, what);
      } else if (t->tag == CT_ARRAY && lua_type(L, idx) == LUA_TSTRING &&
                 t->elem->size == 1) {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        if (n > t->count)
          value_error(L, what, "string longer than the array");
        memcpy(q, s, n);
      } else {
        value_error(L, what, lua_pushfstring(L, "%s or table expected, got "
                                             "%s", t->name,
                                             luaL_typename(L, idx)));
      }
      return;
    }
    default:
      value_error(L, what, "cannot store a function");
  }
}

/* Pushes the t at q, a part of c's memory: a number, boolean or pointer
** for a scalar, a cdata sharing c's memory for an aggregate. */
static void load(lua_State *L, const lcdata *c, const ctype *t, char *q) {
  switch (t->tag) {
    case CT_PRIM:
    case CT_ENUM:
      switch (t->kind) {
        case K_BOOL: lua_pushboolean(L, *(uint8_t *)q != 0); return;
        case K_I8: lua_pushinteger(L, *(int8_t *)q); return;
        case K_U8: lua_pushinteger(L, *(uint8_t *)q); return;
        default: break;
      }
      {
        union { int16_t i16; uint16_t u16; int32_t i32; uint32_t u32;
                int64_t i64; float f; double d; } v;
        memcpy(&v, q, t->size);
        switch (t->kind) {
          case K_I16: lua_pushinteger(L, v.i16); return;
          case K_U16: lua_pushinteger(L, v.u16); return;
          case K_I32: lua_pushinteger(L, v.i32); return;
          case K_U32: lua_pushinteger(L, v.u32); return;
          case K_FLOAT: lua_pushnumber(L, v.f); return;
          case K_DOUBLE: lua_pushnumber(L, v.d); return;
          default: lua_pushinteger(L, (lua_Integer)v.i64); return;
        }
      }
    case CT_PTR: {
      void *p;
      memcpy(&p, q, sizeof p);
      /* A pointer to a declared type reads as a pointer cdata of that
      ** type (as ffi.cast makes it), so that p.field and p[i] work on
      ** what C returned, as in LuaJIT; a void or function pointer stays
      ** an ums.ffi.pointer. NULL reads as nil either way. */
      if (p && t->elem && t->elem->tag != CT_FUNC)
        push_cdata(L, t, NULL, p);
      else
        lffi_push_ptr(L, p);
      return;
    }
    default:
      push_cdata(L, t, c->b, q);
      return;
  }
}

/* The element or field of c that key k names, or raises. */
static const ctype *locate(lua_State *L, lcdata *c, int k, char **q) {
  const ctype *t = c->t;
  if (t->tag == CT_ARRAY) {
    int isint;
    lua_Integer i = lua_tointegerx(L, k, &isint);
    if (!isint)
      luaL_error(L, "ums.ffi: index of %s must be an integer, got %s",
                 t->name, luaL_typename(L, k));
    if (i < 0 || (lua_Unsigned)i >= t->count)
      luaL_error(L, "ums.ffi: index %I out of bounds for %s", i, t->name);
    *q = c->p + (size_t)i * t->elem->size;
    return t->elem;
  }
  if (t->tag == CT_STRUCT || t->tag == CT_UNION) {
    const char *name = lua_tostring(L, k);
    const cfield *f = name ? lffi_field(t, name) : NULL;
    if (!f)
      luaL_error(L, "ums.ffi: '%s' has no field '%s'", t->name,
                 luaL_tolstring(L, k, NULL));
    *q = c->p + f->offset;
    return f->type;
  }
  if (t->tag == CT_PTR) {
    /* A pointer cdata (ffi.cast): p is its target. An integer indexes
    ** the elements it points to, a name a field of the struct it points
    ** to. Bounded by the memory behind it where that is a cdata's or a
    ** buffer's, unchecked otherwise. */
    const ctype *e = t->elem;
    if (!c->p) luaL_error(L, "ums.ffi: NULL %s dereferenced", t->name);
    if (!e || !e->complete)
      luaL_error(L, "ums.ffi: cannot index a %s (incomplete target)",
                 t->name);
    char *q0;
    const ctype *r;
    if (lua_type(L, k) == LUA_TSTRING) {
      const cfield *f = lffi_field(e, lua_tostring(L, k));
      if (!f)
        luaL_error(L, "ums.ffi: '%s' has no field '%s'", e->name,
                   lua_tostring(L, k));
      q0 = c->p;
      *q = c->p + f->offset;
      r = f->type;
    } else {
      int isint;
      lua_Integer i = lua_tointegerx(L, k, &isint);
      if (!isint)
        luaL_error(L, "ums.ffi: index of %s must be an integer, got %s",
                   t->name, luaL_typename(L, k));
      q0 = c->p + (ptrdiff_t)i * (ptrdiff_t)e->size;
      *q = q0;
      r = e;
    }
    if (c->b) {
      char *lo = ums_buf_data(c->b), *hi = lo + ums_buf_size(c->b);
      if (q0 < lo || q0 > hi || (size_t)(hi - q0) < e->size)
        luaL_error(L, "ums.ffi: %s access out of bounds of its memory",
                   t->name);
    }
    return r;
  }
  luaL_error(L, "ums.ffi: cannot index a cdata of type %s", t->name);
  return NULL;
}

static int cdata_index(lua_State *L) {
  lcdata *c = luaL_checkudata(L, 1, LFFI_CDATA_MT);
  char *q;
  const ctype *t = locate(L, c, 2, &q);
  load(L, c, t, q);
  return 1;
}

static int cdata_newindex(lua_State *L) {
  lcdata *c = luaL_checkudata(L, 1, LFFI_CDATA_MT);
  char *q;
  const ctype *t = locate(L, c, 2, &q);
  const char *what = lua_pushfstring(L, "ums.ffi: bad value for %s[%s]",
                                     c->t->name, luaL_tolstring(L, 2, NULL));
  store(L, 3, t, q, what);
  return 0;
}

static int cdata_gc(lua_State *L) {
  lcdata *c = luaL_checkudata(L, 1, LFFI_CDATA_MT);
  if (lua_getiuservalue(L, 1, 1) == LUA_TFUNCTION) {
    /* The ffi.gc finalizer, on this VM's thread, before the memory goes. */
    lua_pushvalue(L, 1);
    lua_call(L, 1, 0);
  }
  if (c->b) {
    ums_buf_release(c->b);
    c->b = NULL;
  }
  return 0;
}

static int cdata_tostring(lua_State *L) {
  lcdata *c = luaL_checkudata(L, 1, LFFI_CDATA_MT);
  lua_pushfstring(L, "cdata<%s>: %p", c->t->name, (void *)c->p);
  return 1;
}

static int cdata_len(lua_State *L) {
  lcdata *c = luaL_checkudata(L, 1, LFFI_CDATA_MT);
  if (c->t->tag != CT_ARRAY)
    return luaL_error(L, "ums.ffi: length of a cdata of type %s",
                      c->t->name);
  lua_pushinteger(L, (lua_Integer)c->t->count);
  return 1;
}

lcdata *lffi_new_cdata(lua_State *L, const ctype *t) {
  size_t size = t->size ? t->size : 1;
  ums_buf_t *b = ums_buf_new(size);
  if (!b) {
    luaL_error(L, "ums.ffi: out of memory");
    return NULL;
  }
  memset(ums_buf_data(b), 0, size);
  lcdata *c = push_cdata(L, t, b, ums_buf_data(b));
  ums_buf_release(b); /* the cdata holds it */
  return c;
}

lcdata *lffi_push_cdata_buf(lua_State *L, const ctype *t, ums_buf_t *b) {
  lcdata *c = push_cdata(L, t, b, ums_buf_data(b));
  ums_buf_release(b); /* the cdata holds it */
  return c;
}

void lffi_store(lua_State *L, int idx, const ctype *t, char *q,
                const char *what) {
  store(L, idx, t, q, what);
}

/* ffi.new(ct [, nelem] [, init]) -> a zero-filled cdata of type ct; nelem
** sizes a variable-length array type (T[?]); init as an assignment. */
static int l_new(lua_State *L) {
  const ctype *t = lffi_check_ctype(L, 1);
  int init = 2;
  if (t->tag == CT_ARRAY && t->vla) {
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n >= 0 && (t->elem->size == 0 ||
                                (lua_Unsigned)n <= BUF_MAX / t->elem->size),
                  2, "element count out of range");
    t = lffi_array_of(L, t->elem, (size_t)n);
    init = 3;
  }
  if (!t->complete)
    return luaL_argerror(L, 1, lua_pushfstring(L, "'%s' is incomplete",
                                               t->name));
  if (t->tag == CT_FUNC)
    return luaL_argerror(L, 1, "cannot create a function");
  if ((lua_Integer)t->size > BUF_MAX)
    return luaL_argerror(L, 1, "type too large");
  lcdata *c = lffi_new_cdata(L, t);
  if (!lua_isnoneornil(L, init)) {
    const char *what = lua_pushfstring(L, "bad argument #%d to "
                                       "'ums.ffi.new'", init);
    store(L, init, t, c->p, what);
    lua_pop(L, 1);
  }
  return 1;
}

/* ffi.cast(ct, v): a pointer type gives a pointer cdata to v's address
** (a pointer, cdata, buffer, integer or nil), which keeps v's memory
** alive when v is a cdata or buffer; a number type gives the number
** converted as C would (integers wrap, floats truncate). */
static int l_cast(lua_State *L) {
  const ctype *t = lffi_check_ctype(L, 1);
  if (t->tag == CT_PTR && lua_type(L, 2) == LUA_TFUNCTION) {
    lffi_cb_new(L, t, 2);
    return 1;
  }
  if (t->tag == CT_PTR) {
    char *p = NULL;
    ums_buf_t *b = NULL;
    lcdata *c;
    lbuf *u;
    lptr *r;
    if (lua_isnoneornil(L, 2)) {
      p = NULL;
    } else if ((c = lffi_to_cdata(L, 2)) != NULL) {
      p = c->p;
      b = c->b;
    } else if ((u = lffi_to_buf(L, 2)) != NULL) {
      p = ums_buf_data(u->b);
      b = u->b;
    } else if ((r = lffi_to_ptr(L, 2)) != NULL) {
      p = r->p;
    } else if (lua_isinteger(L, 2)) {
      p = (char *)(intptr_t)lua_tointeger(L, 2);
    } else {
      return luaL_typeerror(L, 2, "pointer, cdata, buffer, integer or nil");
    }
    push_cdata(L, t, b, p);
    return 1;
  }
  if (t->tag != CT_PRIM && t->tag != CT_ENUM)
    return luaL_argerror(L, 1, lua_pushfstring(L, "cannot cast to %s",
                                               t->name));
  int k = t->kind;
  lua_Integer n;
  lcdata *c = lffi_to_cdata(L, 2);
  lptr *r = c ? NULL : lffi_to_ptr(L, 2);
  if (c || r) {
    n = (lua_Integer)(intptr_t)(c ? c->p : r->p);
  } else if (k == K_FLOAT || k == K_DOUBLE) {
    lua_Number x = luaL_checknumber(L, 2);
    lua_pushnumber(L, k == K_FLOAT ? (lua_Number)(float)x : x);
    return 1;
  } else if (k == K_BOOL) {
    lua_pushboolean(L, lua_isinteger(L, 2) ? lua_tointeger(L, 2) != 0
                                           : luaL_checknumber(L, 2) != 0);
    return 1;
  } else if (lua_isinteger(L, 2)) {
    n = lua_tointeger(L, 2);
  } else {
    lua_Number x = luaL_checknumber(L, 2);
    luaL_argcheck(L, x >= -0x1p63 && x < 0x1p63, 2,
                  "number out of range for an integer");
    n = (lua_Integer)x;
  }
  switch (k) {
    case K_I8: n = (int8_t)n; break;
    case K_U8: n = (uint8_t)n; break;
    case K_I16: n = (int16_t)n; break;
    case K_U16: n = (uint16_t)n; break;
    case K_I32: n = (int32_t)n; break;
    case K_U32: n = (uint32_t)n; break;
    default: break;
  }
  if (k == K_FLOAT || k == K_DOUBLE)
    lua_pushnumber(L, (lua_Number)n);
  else if (k == K_BOOL)
    lua_pushboolean(L, n != 0);
  else
    lua_pushinteger(L, n);
  return 1;
}

/* ffi.gc(cdata, fn | nil) -> cdata: fn(cdata) runs when the cdata is
** collected (on its VM's thread), before its memory is released; nil
** removes it. */
static int l_gc(lua_State *L) {
  luaL_checkudata(L, 1, LFFI_CDATA_MT);
  if (!lua_isnil(L, 2)) luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  lua_setiuservalue(L, 1, 1);
  return 1;
}

/* The bytes a cdata, buffer or pointer argument spans (SIZE_MAX: a
** pointer, unknown), or raises. */
static char *span(lua_State *L, int arg, size_t *size) {
  lcdata *c = lffi_to_cdata(L, arg);
  if (c) {
    if (!c->b) { /* a pointer cdata to memory it does not own */
      *size = SIZE_MAX;
      return c->p;
    }
    char *lo = ums_buf_data(c->b), *hi = lo + ums_buf_size(c->b);
    *size = c->p >= lo && c->p <= hi ? (size_t)(hi - c->p) : 0;
    if (c->t->tag != CT_PTR && c->t->size < *size) *size = c->t->size;
    return c->p;
  }
  lbuf *b = lffi_to_buf(L, arg);
  if (b) {
    *size = b->size;
    return ums_buf_data(b->b);
  }
  lptr *p = lffi_to_ptr(L, arg);
  if (p) {
    *size = SIZE_MAX;
    return p->p;
  }
  luaL_typeerror(L, arg, "ums.ffi.buffer or ums.ffi.pointer or cdata");
  return NULL;
}

/* ffi.copy(dst, src, len) or ffi.copy(dst, str): bounds-checked for a
** cdata or buffer destination or source. */
static int l_copy(lua_State *L) {
  size_t dn, sn;
  char *dst = span(L, 1, &dn);
  const char *src;
  if (lua_type(L, 2) == LUA_TSTRING) {
    src = lua_tolstring(L, 2, &sn);
    sn++; /* its terminating zero */
  } else {
    src = span(L, 2, &sn);
    luaL_checkinteger(L, 3);
  }
  lua_Integer len = luaL_optinteger(L, 3, (lua_Integer)sn);
  luaL_argcheck(L, len >= 0, 3, "length must not be negative");
  size_t n = (size_t)len;
  luaL_argcheck(L, n <= sn, 3, "length beyond the end of the source");
  luaL_argcheck(L, n <= dn, 3, "length beyond the end of the destination");
  memmove(dst, src, n);
  return 0;
}

/* ffi.fill(dst, len [, byte]) */
static int l_fill(lua_State *L) {
  size_t dn = 0;
  char *dst = span(L, 1, &dn);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_argcheck(L, n >= 0, 2, "length must not be negative");
  luaL_argcheck(L, (lua_Unsigned)n <= dn, 2,
                "length beyond the end of the destination");
  lua_Integer v = luaL_optinteger(L, 3, 0);
  memset(dst, (int)(v & 0xff), (size_t)n);
  return 0;
}

/* ffi.istype(ct, obj) -> whether obj is a cdata of type ct */
static int l_istype(lua_State *L) {
  const ctype *t = lffi_check_ctype(L, 1);
  lcdata *c = lffi_to_cdata(L, 2);
  lua_pushboolean(L, c && (c->t == t || strcmp(c->t->name, t->name) == 0));
  return 1;
}

/* ffi.string(cdata | buf | ptr [, len]) -> string; bounded by a cdata's
** or buffer's size. */
static int l_string(lua_State *L) {
  size_t size = 0;  /* set by span, which raises otherwise */
  const char *data = span(L, 1, &size);
  if (lua_isnoneornil(L, 2)) {
    size_t n = size == SIZE_MAX ? strlen(data) : strnlen(data, size);
    lua_pushlstring(L, data, n);
    return 1;
  }
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_argcheck(L, n >= 0, 2, "length must not be negative");
  luaL_argcheck(L, (lua_Unsigned)n <= size, 2,
                "length beyond the end of the buffer");
  lua_pushlstring(L, data, (size_t)n);
  return 1;
}

void lffi_open_cdata(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"buffer", l_buffer}, {"string", l_string}, {"new", l_new},
      {"copy", l_copy},     {"fill", l_fill},     {"istype", l_istype},
      {"cast", l_cast},     {"gc", l_gc},         {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  if (luaL_newmetatable(L, LFFI_CDATA_MT)) {
    static const luaL_Reg mt[] = {
        {"__index", cdata_index}, {"__newindex", cdata_newindex},
        {"__gc", cdata_gc},       {"__tostring", cdata_tostring},
        {"__len", cdata_len},     {"__eq", ptr_eq},
        {NULL, NULL}};
    luaL_setfuncs(L, mt, 0);
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, LFFI_BUF_MT)) {
    lua_pushcfunction(L, buf_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, buf_len);
    lua_setfield(L, -2, "__len");
    lua_pushcfunction(L, buf_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, LFFI_PTR_MT)) {
    lua_pushcfunction(L, ptr_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushcfunction(L, ptr_eq);
    lua_setfield(L, -2, "__eq");
  }
  lua_pop(L, 1);
}
