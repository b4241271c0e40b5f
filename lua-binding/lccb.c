/*
** lccb.c: ums.ffi's callbacks: a Lua function where a declaration has a
** function pointer becomes a C function pointer (a libffi closure), as in
** LuaJIT. Either given directly to an inline call (a callback made for the
** call, collected with its object once Lua drops it) or made once with
** ffi.cast("int (*)(const void *, const void *)", fn) (a callback object
** with :set(fn) and :free(), freed when collected).
**
** Where a callback may run. Lua can run only on the thread of the VM, in
** the Lua thread that is inside the call: so a callback runs Lua only
** during an inline call (or a call outside tasks) of its own VM, on the
** calling thread (lcbframe). A preemptive call, which runs on a pool
** thread, refuses Lua functions and callback objects as arguments before
** it starts (lcconv.c). Reached anywhere else (a pool thread through a
** pointer stored in a struct, another thread, after its call returned) a
** callback runs nothing, returns zero and says so on stderr.
**
** Errors. An error raised by the Lua function must not unwind through the
** foreign function's C frames (longjmp past them would skip their cleanup
** and leave qsort's or zlib's state half-done): the handler runs the
** function under lua_pcall, returns zero to C, keeps the first error, and
** makes later callbacks of that call return zero without running Lua; the
** caller raises the error once the foreign call returned (lffi_cb_leave).
**
** Ownership. A callback object owns its closure and a registry reference
** to its Lua function; both are freed by :free() or its __gc. C must not
** call a callback after that (as in LuaJIT, keep the object referenced
** while C may call it).
**
** Threads: the Lua thread of the VM, except cb_handler, which runs on
** whatever thread C calls it from and touches Lua only when that thread is
** inside an inline call of the callback's VM.
*/
#define _GNU_SOURCE
#include "lccb.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lcdata.h"
#include "ltask.h"

typedef struct lcb {
  ffi_closure *closure;    /* NULL once freed */
  void *code;              /* the C function pointer */
  lua_State *main;         /* its VM's main thread */
  int fn;                  /* registry reference to the Lua function */
  fdecl sig;
  ffi_cif cif;
  ffi_type *atypes[LFFI_MAXARGS];
} lcb;

/* The inline call this thread is in outside tasks; a task's is in its
** ltask, since a task that waits inside a callback hands the thread to
** other tasks that may make inline calls of their own. */
static _Thread_local lcbframe *host_frame
    __attribute__((tls_model("initial-exec")));

static lcbframe **frame_slot(void) {
  ltask *t = lums_cur_task;
  return t && t->vmrun ? (lcbframe **)&t->ffi.cbframe : &host_frame;
}

void lffi_cb_enter(lcbframe *fr, lua_State *L) {
  lcbframe **slot = frame_slot();
  fr->L = L;
  fr->prev = *slot;
  fr->err = LUA_NOREF;
  fr->failed = false;
  *slot = fr;
}

void lffi_cb_leave(lcbframe *fr) {
  *frame_slot() = fr->prev;
  if (!fr->failed) return;
  lua_State *L = fr->L;
  if (fr->err == LUA_NOREF)
    luaL_error(L, "ums.ffi: callback: Lua stack overflow");
  lua_rawgeti(L, LUA_REGISTRYINDEX, fr->err);
  luaL_unref(L, LUA_REGISTRYINDEX, fr->err);
  lua_error(L);
}

/* Says once per process that a callback was reached where it cannot run
** Lua. */
static void report_unreachable(const lcb *cb) {
  static atomic_int said;
  if (atomic_exchange(&said, 1)) return;
  char msg[160];
  int n = snprintf(msg, sizeof msg,
                   "ums.ffi: callback '%s' called outside an inline call "
                   "of its VM's thread: it returned 0\n", cb->sig.name);
  if (n > 0) {
    ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n
                                                     : sizeof msg - 1);
    (void)w;
  }
}

/* One callback in progress. */
typedef struct cbcall {
  lcb *cb;
  void *ret;
  void **args;
} cbcall;

static void push_arg(lua_State *L, int k, void *p) {
  switch (k) {
    case K_BOOL: lua_pushboolean(L, *(uint8_t *)p != 0); break;
    case K_I8: lua_pushinteger(L, *(int8_t *)p); break;
    case K_U8: lua_pushinteger(L, *(uint8_t *)p); break;
    case K_I16: lua_pushinteger(L, *(int16_t *)p); break;
    case K_U16: lua_pushinteger(L, *(uint16_t *)p); break;
    case K_I32: lua_pushinteger(L, *(int32_t *)p); break;
    case K_U32: lua_pushinteger(L, *(uint32_t *)p); break;
    case K_I64: lua_pushinteger(L, (lua_Integer) * (int64_t *)p); break;
    case K_U64: lua_pushinteger(L, (lua_Integer) * (uint64_t *)p); break;
    case K_FLOAT: lua_pushnumber(L, *(float *)p); break;
    case K_DOUBLE: lua_pushnumber(L, *(double *)p); break;
    case K_CSTR: {
      const char *s = *(const char **)p;
      if (s) lua_pushstring(L, s);
      else lua_pushnil(L);
      break;
    }
    default: lffi_push_ptr(L, *(void **)p); break;
  }
}

static int result_error(lua_State *L, const lcb *cb, const char *msg) {
  return luaL_error(L, "bad result from callback '%s' (%s)", cb->sig.name,
                    msg);
}

/* The Lua result at idx into ret, as libffi wants a closure's result:
** integers narrower than a register widened to a whole ffi_arg. */
static void store_result(lua_State *L, const lcb *cb, int idx, void *ret) {
  int k = cb->sig.ret;
  switch (k) {
    case K_VOID: return;
    case K_BOOL:
      if (!lua_isboolean(L, idx))
        result_error(L, cb, lua_pushfstring(L, "boolean expected, got %s",
                                            luaL_typename(L, idx)));
      *(ffi_arg *)ret = (ffi_arg)lua_toboolean(L, idx);
      return;
    case K_FLOAT:
    case K_DOUBLE:
      if (lua_type(L, idx) != LUA_TNUMBER)
        result_error(L, cb, lua_pushfstring(L, "number expected, got %s",
                                            luaL_typename(L, idx)));
      if (k == K_FLOAT) *(float *)ret = (float)lua_tonumber(L, idx);
      else *(double *)ret = (double)lua_tonumber(L, idx);
      return;
    case K_PTR:
    case K_CPTR:
    case K_CSTR: {
      lptr *p;
      lcdata *c;
      lbuf *b;
      void *v;
      if (lua_isnil(L, idx)) v = NULL;
      else if ((p = lffi_to_ptr(L, idx)) != NULL) v = p->p;
      else if ((c = lffi_to_cdata(L, idx)) != NULL) v = c->p;
      else if ((b = lffi_to_buf(L, idx)) != NULL) v = ums_buf_data(b->b);
      else {
        result_error(L, cb, lua_pushfstring(L, "pointer, cdata, buffer or "
                                            "nil expected, got %s",
                                            luaL_typename(L, idx)));
        return;
      }
      *(void **)ret = v;
      return;
    }
    default: {
      if (lua_type(L, idx) != LUA_TNUMBER)
        result_error(L, cb, lua_pushfstring(L, "number expected, got %s",
                                            luaL_typename(L, idx)));
      int isint;
      lua_Integer n = lua_tointegerx(L, idx, &isint);
      if (!isint) result_error(L, cb, "number has no integer representation");
      int64_t lo, hi;
      lffi_kind_range(k, &lo, &hi);
      if (n < lo || n > hi)
        result_error(L, cb, lua_pushfstring(L, "number %I out of range for "
                                            "%s", n, lffi_kind_names[k]));
      if (k == K_I8 || k == K_I16 || k == K_I32 || k == K_I64)
        *(ffi_sarg *)ret = (ffi_sarg)n;
      else
        *(ffi_arg *)ret = (ffi_arg)n;
      return;
    }
  }
}

/* Under lua_pcall: calls the Lua function with the C arguments. */
static int cb_body(lua_State *L) {
  cbcall *c = lua_touserdata(L, 1);
  lcb *cb = c->cb;
  luaL_checkstack(L, cb->sig.nargs + 2, "callback arguments");
  lua_rawgeti(L, LUA_REGISTRYINDEX, cb->fn);
  for (int i = 0; i < cb->sig.nargs; i++)
    push_arg(L, cb->sig.args[i], c->args[i]);
  lua_call(L, cb->sig.nargs, 1);
  store_result(L, cb, -1, c->ret);
  return 0;
}

static lua_State *main_of(lua_State *L) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lua_State *m = lua_tothread(L, -1);
  lua_pop(L, 1);
  return m;
}

static void cb_handler(ffi_cif *cif, void *ret, void **args, void *ud) {
  lcb *cb = ud;
  (void)cif;
  if (cb->sig.ret != K_VOID) memset(ret, 0, sizeof(ffi_arg));
  /* A pool thread is never a scheduler thread: lums_cur_task is NULL
  ** there, and so is its host frame. */
  lcbframe *fr = *frame_slot();
  if (!fr || !cb->closure) {
    report_unreachable(cb);
    return;
  }
  if (fr->failed) return;
  lua_State *L = fr->L;
  if (!lua_checkstack(L, 4)) {
    fr->failed = true;
    return;
  }
  if (main_of(L) != cb->main) {
    report_unreachable(cb);
    return;
  }
  cbcall c = {cb, ret, args};
  lua_pushcfunction(L, cb_body);
  lua_pushlightuserdata(L, &c);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    /* Raised by lffi_cb_leave once the foreign call returned. */
    fr->failed = true;
    fr->err = luaL_ref(L, LUA_REGISTRYINDEX);
    if (cb->sig.ret != K_VOID) memset(ret, 0, sizeof(ffi_arg));
  }
}

static void cb_release(lua_State *L, lcb *cb) {
  if (!cb->closure) return;
  ffi_closure_free(cb->closure);
  cb->closure = NULL;
  cb->code = NULL;
  luaL_unref(L, LUA_REGISTRYINDEX, cb->fn);
  cb->fn = LUA_NOREF;
}

void lffi_cb_new(lua_State *L, const ctype *t, int idx) {
  idx = lua_absindex(L, idx);
  const fdecl *sig = lffi_fnptr_sig(t);
  if (!sig) {
    luaL_argerror(L, 1, lua_pushfstring(L, "'%s' cannot take a Lua "
                                        "callback (not a pointer to a "
                                        "function, or one that is variadic "
                                        "or passes structs by value)",
                                        t->name));
    return;
  }
  luaL_checktype(L, idx, LUA_TFUNCTION);
  lcb *cb = (lcb *)lua_newuserdatauv(L, sizeof *cb, 0);
  memset(cb, 0, sizeof *cb);
  cb->fn = LUA_NOREF;
  luaL_setmetatable(L, LFFI_CB_MT);
  cb->sig = *sig;
  cb->main = main_of(L);
  for (int i = 0; i < sig->nargs; i++)
    cb->atypes[i] = lffi_kind_ffi(sig->args[i]);
  if (ffi_prep_cif(&cb->cif, FFI_DEFAULT_ABI, (unsigned)sig->nargs,
                   lffi_kind_ffi(sig->ret), cb->atypes) != FFI_OK) {
    luaL_error(L, "ums.ffi: libffi cannot prepare callback '%s'", sig->name);
    return;
  }
  void *code;
  ffi_closure *cl = ffi_closure_alloc(sizeof *cl, &code);
  if (!cl) {
    luaL_error(L, "ums.ffi: out of memory (callback)");
    return;
  }
  if (ffi_prep_closure_loc(cl, &cb->cif, cb_handler, cb, code) != FFI_OK) {
    ffi_closure_free(cl);
    luaL_error(L, "ums.ffi: libffi cannot make callback '%s'", sig->name);
    return;
  }
  lua_pushvalue(L, idx);
  cb->fn = luaL_ref(L, LUA_REGISTRYINDEX);
  cb->closure = cl;
  cb->code = code;
}

void *lffi_cb_code(lua_State *L, int idx, const ctype *t) {
  lcb *cb = luaL_testudata(L, idx, LFFI_CB_MT);
  if (cb) {
    if (!cb->closure) luaL_error(L, "ums.ffi: use of a freed callback");
    return cb->code;
  }
  if (lua_type(L, idx) != LUA_TFUNCTION || !lffi_fnptr_sig(t)) return NULL;
  lffi_cb_new(L, t, idx);
  return ((lcb *)lua_touserdata(L, -1))->code;
}

static lcb *check_cb(lua_State *L) {
  lcb *cb = luaL_checkudata(L, 1, LFFI_CB_MT);
  if (!cb->closure) luaL_error(L, "ums.ffi: use of a freed callback");
  return cb;
}

/* cb:free(): C must not call it any more. */
static int cb_free(lua_State *L) {
  cb_release(L, check_cb(L));
  return 0;
}

/* cb:set(fn): the Lua function it calls from now on. */
static int cb_set(lua_State *L) {
  lcb *cb = check_cb(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  lua_rawseti(L, LUA_REGISTRYINDEX, cb->fn);
  return 0;
}

static int cb_gc(lua_State *L) {
  cb_release(L, luaL_checkudata(L, 1, LFFI_CB_MT));
  return 0;
}

static int cb_tostring(lua_State *L) {
  lcb *cb = luaL_checkudata(L, 1, LFFI_CB_MT);
  if (cb->closure)
    lua_pushfstring(L, "ums.ffi.callback (%s): %p", cb->sig.name, cb->code);
  else
    lua_pushfstring(L, "ums.ffi.callback (%s): freed", cb->sig.name);
  return 1;
}

void lffi_open_cb(lua_State *L) {
  if (luaL_newmetatable(L, LFFI_CB_MT)) {
    static const luaL_Reg methods[] = {
        {"free", cb_free}, {"set", cb_set}, {NULL, NULL}};
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, cb_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, cb_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
}
