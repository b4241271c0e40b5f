/*
** lcconv.c: ums.ffi's conversions between Lua values and C values: each
** argument range-checked against its declared kind (variadic ones typed
** by their value after C's default promotions), and a result pushed back
** by its kind.
**
** Threads: the Lua thread of the caller only.
*/
#include "lcconv.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

#include "lccb.h"
#include "lcdata.h"

static int arg_error(lua_State *L, const fdecl *f, int i, const char *msg) {
  return luaL_error(L, "bad argument #%d to '%s' (%s)", i, f->name, msg);
}

static int arg_type_error(lua_State *L, const fdecl *f, int i, int idx,
                          const char *want) {
  const char *got = luaL_typename(L, idx);
  if (lffi_to_buf(L, idx)) got = "ums.ffi.buffer";
  else if (lffi_to_cdata(L, idx)) got = "ums.ffi.cdata";
  else if (lffi_to_ptr(L, idx)) got = "ums.ffi.pointer";
  lua_pushfstring(L, "%s expected, got %s", want, got);
  return arg_error(L, f, i, lua_tostring(L, -1));
}

/* Lua value at idx -> an integer of kind k, range-checked. */
static void conv_int(lua_State *L, const fdecl *f, int i, int idx, int k,
                     cval *v) {
  if (lua_type(L, idx) != LUA_TNUMBER) {
    arg_type_error(L, f, i, idx, "number");
    return;
  }
  int isint;
  lua_Integer n = lua_tointegerx(L, idx, &isint);
  if (!isint) {
    arg_error(L, f, i, "number has no integer representation");
    return;
  }
  int64_t lo, hi;
  lffi_kind_range(k, &lo, &hi);
  if (n < lo || n > hi) {
    lua_pushfstring(L, "number %I out of range for %s", n, lffi_kind_names[k]);
    arg_error(L, f, i, lua_tostring(L, -1));
    return;
  }
  switch (k) {
    case K_I8: v->i8 = (int8_t)n; break;
    case K_U8: v->u8 = (uint8_t)n; break;
    case K_I16: v->i16 = (int16_t)n; break;
    case K_U16: v->u16 = (uint16_t)n; break;
    case K_I32: v->i32 = (int32_t)n; break;
    case K_U32: v->u32 = (uint32_t)n; break;
    case K_I64: v->i64 = (int64_t)n; break;
    default: v->u64 = (uint64_t)n; break;
  }
}

/* A pointer argument (kinds K_PTR, K_CPTR, K_CSTR). */
static void conv_ptr(lua_State *L, const fdecl *f, int i, int idx, int k,
                     margs *a, bool pool) {
  cval *v = &a->vals[i - 1];
  lbuf *b;
  lptr *p;
  lcdata *c;
  const ctype *t = i <= f->nargs ? f->argt[i - 1] : NULL;
  if (lua_type(L, idx) == LUA_TFUNCTION ||
      luaL_testudata(L, idx, LFFI_CB_MT)) {
    bool is_cb = lua_type(L, idx) != LUA_TFUNCTION || lffi_fnptr_sig(t);
    if (pool && is_cb) {
      /* Refused before the call starts: a pool thread cannot run Lua. */
      lua_pushfstring(L, "a Lua callback cannot run on a pool thread: "
                         "declare '%s' UMS_INLINE to call it on the "
                         "scheduler", f->name);
      arg_error(L, f, i, lua_tostring(L, -1));
    }
    v->p = is_cb ? lffi_cb_code(L, idx, t) : NULL;
    if (!v->p)
      arg_type_error(L, f, i, idx, "ums.ffi.buffer, ums.ffi.pointer, cdata "
                                   "or nil (the parameter is not a "
                                   "function pointer)");
  } else if (lua_isnil(L, idx)) {
    v->p = NULL;
  } else if ((b = lffi_to_buf(L, idx)) != NULL) {
    v->p = ums_buf_data(b->b);
    a->bufs[i - 1] = b->b;
  } else if ((c = lffi_to_cdata(L, idx)) != NULL) {
    /* Held like a buffer: the same memory, the same reference rule. */
    v->p = c->p;
    a->bufs[i - 1] = c->b;
  } else if ((p = lffi_to_ptr(L, idx)) != NULL) {
    v->p = p->p;
  } else if (lua_type(L, idx) == LUA_TSTRING) {
    if (k == K_PTR)
      arg_error(L, f, i,
                "string where a buffer is needed (the parameter is not "
                "const: pass an ums.ffi.buffer)");
    a->strs[i - 1] = lua_tolstring(L, idx, &a->slens[i - 1]);
    v->p = (void *)a->strs[i - 1];
  } else {
    arg_type_error(L, f, i, idx,
                   k == K_PTR ? "ums.ffi.buffer, ums.ffi.pointer, cdata or "
                                "nil"
                              : "string, ums.ffi.buffer, ums.ffi.pointer, "
                                "cdata or nil");
  }
}

/* A struct argument: a cdata of its type, or a table (or anything an
** assignment takes) stored into a new cdata left on the stack for the
** call. Its bytes are a->strs[i - 1], as long as the value they came
** from; a preemptive call copies them (lccall.c). */
static void conv_struct(lua_State *L, const fdecl *f, int i, int idx,
                        margs *a) {
  const ctype *t = f->argt[i - 1];
  lcdata *c = lffi_to_cdata(L, idx);
  if (!c || c->t != t) {
    if (!lua_istable(L, idx)) {
      arg_type_error(L, f, i, idx, t->name);
      return;
    }
    c = lffi_new_cdata(L, t);
    const char *what = lua_pushfstring(L, "bad argument #%d to '%s'", i,
                                       f->name);
    lffi_store(L, idx, t, c->p, what);
    lua_pop(L, 1);
  }
  a->strs[i - 1] = c->p;
  a->slens[i - 1] = t->size;
}

/* Converts the Lua arguments at first.. into a. */
void lffi_marshal(lua_State *L, const fdecl *f, int first, margs *a,
                  bool pool) {
  int given = lua_gettop(L) - first + 1;
  const fdecl *d = f;
  if (given < d->nargs || (!d->variadic && given > d->nargs))
    luaL_error(L, "wrong number of arguments to '%s' (%d%s expected, got %d)",
               d->name, d->nargs, d->variadic ? " or more" : "", given);
  if (given > LFFI_MAXARGS)
    luaL_error(L, "too many arguments to '%s' (at most %d)", d->name,
               LFFI_MAXARGS);
  a->n = given;
  for (int i = 1; i <= given; i++) {
    int idx = first + i - 1;
    cval *v = &a->vals[i - 1];
    a->bufs[i - 1] = NULL;
    a->strs[i - 1] = NULL;
    int k;
    if (i <= d->nargs) {
      k = d->args[i - 1];
    } else {
      /* A variadic argument: its type comes from the value, after C's
      ** default promotions (integers as int64_t, numbers as double). */
      int t = lua_type(L, idx);
      if (t == LUA_TNUMBER)
        k = lua_isinteger(L, idx) ? K_I64 : K_DOUBLE;
      else if (t == LUA_TBOOLEAN)
        k = K_I32;
      else if (t == LUA_TSTRING || t == LUA_TNIL || lffi_to_buf(L, idx) ||
               lffi_to_ptr(L, idx) || lffi_to_cdata(L, idx) ||
               luaL_testudata(L, idx, LFFI_CB_MT))
        k = K_CPTR;
      else {
        arg_type_error(L, f, i, idx,
                       "number, boolean, string, buffer, pointer or nil");
        return;
      }
    }
    a->types[i - 1] = lffi_kind_ffi(k);
    switch (k) {
      case K_BOOL:
        if (!lua_isboolean(L, idx)) arg_type_error(L, f, i, idx, "boolean");
        v->u8 = (uint8_t)lua_toboolean(L, idx);
        break;
      case K_FLOAT:
      case K_DOUBLE: {
        if (lua_type(L, idx) != LUA_TNUMBER)
          arg_type_error(L, f, i, idx, "number");
        lua_Number x = lua_tonumber(L, idx);
        if (k == K_DOUBLE) {
          v->d = (double)x;
        } else {
          if (isfinite(x) && (x > FLT_MAX || x < -FLT_MAX)) {
            lua_pushfstring(L, "number %f out of range for float", x);
            arg_error(L, f, i, lua_tostring(L, -1));
          }
          v->f = (float)x;
        }
        break;
      }
      case K_PTR:
      case K_CPTR:
      case K_CSTR:
        conv_ptr(L, f, i, idx, k, a, pool);
        break;
      case K_STRUCT:
        conv_struct(L, f, i, idx, a);
        break;
      default:
        if (i > d->nargs && k == K_I32)
          v->i32 = lua_toboolean(L, idx);
        else
          conv_int(L, f, i, idx, k, v);
        break;
    }
  }
}

int lffi_push_result(lua_State *L, const fdecl *f, const rval *r,
                     bool void_true) {
  switch (f->ret) {
    case K_VOID:
      if (!void_true) return 0;
      lua_pushboolean(L, 1);
      break;
    case K_BOOL: lua_pushboolean(L, (uint8_t)r->a != 0); break;
    case K_I8: lua_pushinteger(L, (int8_t)r->s); break;
    case K_U8: lua_pushinteger(L, (uint8_t)r->a); break;
    case K_I16: lua_pushinteger(L, (int16_t)r->s); break;
    case K_U16: lua_pushinteger(L, (uint16_t)r->a); break;
    case K_I32: lua_pushinteger(L, (int32_t)r->s); break;
    case K_U32: lua_pushinteger(L, (uint32_t)r->a); break;
    case K_I64: lua_pushinteger(L, (lua_Integer)r->i64); break;
    case K_U64: lua_pushinteger(L, (lua_Integer)r->u64); break;
    case K_FLOAT: lua_pushnumber(L, r->f); break;
    case K_DOUBLE: lua_pushnumber(L, r->d); break;
    case K_CSTR:
      if (r->p) lua_pushstring(L, (const char *)r->p);
      else lua_pushnil(L);
      break;
    default: lffi_push_ptr(L, r->p); break;
  }
  return 1;
}
