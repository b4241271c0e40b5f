/*
** lffi.c: ums.ffi, C functions called from Lua through libffi, following
** LuaJIT's FFI conventions where they fit:
**
**   ffi.cdef[[ int usleep(unsigned int usec); ]]   declare (a small parser)
**   ffi.C.usleep(1000)                              the process's symbols
**   local m = ffi.load("m"); m.sqrt(2)              a shared library
**
** This file is the module: cdef, namespaces and library loads. The rest is
** split by job, after LuaJIT's lj_cparse/lj_cdata/lj_cconv/lj_ccall:
**   lcdecl.c  the C types and the declaration parser
**   lcdata.c  buffers and pointers
**   lccb.c    callbacks: Lua functions as C function pointers
**   lcconv.c  marshalling between Lua values and C values
**   lccall.c  bound functions and calls, preemptive and inline (its top
**             comment states who owns what while a call is in flight)
** Each depends only on those above it; this file on all of them.
**
** Threads: the Lua thread of the run, or the main thread outside runs,
** except load_run and load_release, which run on a pool thread and touch
** only their lload.
*/
#define _GNU_SOURCE
#include "lums.h"
#include "lext.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lccall.h"
#include "lccb.h"
#include "lcdata.h"
#include "lcdecl.h"
#include "ltask.h"

#define NS_MT "ums.ffi.namespace"
#define DECLS_KEY "ums.ffi.decls"
#define C_KEY "ums.ffi.C"

/* ---------------------------------------------------------------------- */
/* cdef and namespaces                                                     */
/* ---------------------------------------------------------------------- */

/* ffi.cdef(decls [, {inline = true, interruptible = true}]) */
static int l_cdef(lua_State *L) {
  const char *src = luaL_checkstring(L, 1);
  bool inlined = false, interruptible = false;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "inline");
    inlined = lua_toboolean(L, -1);
    lua_getfield(L, 2, "interruptible");
    interruptible = lua_toboolean(L, -1);
    lua_pop(L, 2);
    luaL_argcheck(L, !(inlined && interruptible), 2,
                  "an inline call cannot be interruptible");
  }
  /* Parse everything first: a malformed declaration declares nothing. */
  lffi_parse(L, src, inlined, interruptible);
  int pending = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, DECLS_KEY);
  lua_pushnil(L);
  while (lua_next(L, pending)) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, -4);
  }
  return 0;
}

typedef struct lns {
  flib *lib;               /* reference held; NULL: ffi.C */
} lns;

static int ns_index(lua_State *L) {
  lns *ns = luaL_checkudata(L, 1, NS_MT);
  const char *name = luaL_checkstring(L, 2);
  lua_getiuservalue(L, 1, 1); /* the cache */
  if (lua_getfield(L, -1, name) != LUA_TNIL) return 1;
  lua_pop(L, 1);
  const char *where = ns->lib ? ns->lib->name : "C";
  lua_Integer v;
  if (lffi_const(L, name, &v)) {
    /* An enum constant, as in LuaJIT: not cached, a number is cheap. */
    lua_pushinteger(L, v);
    return 1;
  }
  lua_getfield(L, LUA_REGISTRYINDEX, DECLS_KEY);
  lua_getfield(L, -1, name);
  fdecl *d = (fdecl *)lua_touserdata(L, -1);
  if (!d)
    return luaL_error(L, "ums.ffi: missing declaration for symbol '%s' "
                         "(declare it with ums.ffi.cdef)", name);
  dlerror();
  void *addr = dlsym(ns->lib ? ns->lib->handle : RTLD_DEFAULT, d->sym);
  if (!addr)
    return luaL_error(L, "ums.ffi: undefined symbol '%s' in %s", d->sym,
                      where);
  ffn *f = aligned_alloc(LFFI_CACHELINE, sizeof *f); /* a multiple of it */
  if (!f) return luaL_error(L, "ums.ffi: out of memory");
  memset(f, 0, sizeof *f);
  atomic_store(&f->refs, 1);
  f->d = *d;
  f->addr = addr;
  if (!lffi_fn_describe(f)) {
    free(f);
    return luaL_error(L, "ums.ffi: out of memory");
  }
  if (!d->variadic &&
      ffi_prep_cif(&f->cif, FFI_DEFAULT_ABI, (unsigned)d->nargs, f->rtype,
                   f->atypes) != FFI_OK) {
    lffi_fn_free_types(f);
    free(f);
    return luaL_error(L, "ums.ffi: libffi cannot prepare '%s'", name);
  }
  if (ns->lib) {
    atomic_fetch_add(&ns->lib->refs, 1);
    f->lib = ns->lib;
  }
  lffi_push_function(L, f);
  lua_pushvalue(L, -1);
  lua_setfield(L, -5, name); /* into the cache */
  return 1;
}

static int ns_newindex(lua_State *L) {
  return luaL_error(L, "ums.ffi: cannot assign to a library namespace");
}

static int ns_tostring(lua_State *L) {
  lns *ns = luaL_checkudata(L, 1, NS_MT);
  lua_pushfstring(L, "ums.ffi.namespace (%s)", ns->lib ? ns->lib->name : "C");
  return 1;
}

static int ns_gc(lua_State *L) {
  lns *ns = luaL_checkudata(L, 1, NS_MT);
  lffi_lib_unref(ns->lib);
  ns->lib = NULL;
  return 0;
}

static void push_namespace(lua_State *L, flib *lib) {
  lns *ns = (lns *)lua_newuserdatauv(L, sizeof *ns, 1);
  ns->lib = lib;
  luaL_setmetatable(L, NS_MT);
  lua_newtable(L);
  lua_setiuservalue(L, -2, 1);
}

/* Debian installs some lib<name>.so as GNU ld scripts (libm.so is one):
** dlopen cannot read them, so, like LuaJIT, take the first library of
** their GROUP ( ... ) line. Returns a malloc'ed path or NULL. */
static char *ld_script_target(const char *path) {
  FILE *fp = fopen(path, "r");
  if (!fp) return NULL;
  char line[512], *res = NULL;
  while (!res && fgets(line, sizeof line, fp)) {
    const char *g = strstr(line, "GROUP");
    if (!g && !(g = strstr(line, "INPUT"))) continue;
    const char *p = strchr(g, '(');
    if (!p) continue;
    p++;
    while (*p == ' ') p++;
    size_t n = strcspn(p, " )\n");
    if (n) res = strndup(p, n);
  }
  fclose(fp);
  return res;
}

static void *try_open(const char *name, char *err, size_t errlen) {
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
  const char *e = dlerror();
  if (err[0] == 0) {
    /* dlerror starts with the name, which the caller's message already
    ** gives. */
    const char *why = e ? e : "unknown error";
    size_t n = strlen(name);
    if (strncmp(why, name, n) == 0 && strncmp(why + n, ": ", 2) == 0)
      why += n + 2;
    snprintf(err, errlen, "%s", why);
  }
  if (e && strstr(e, "invalid ELF header") && name[0] == '/') {
    char *target = ld_script_target(name);
    if (target) {
      h = dlopen(target, RTLD_NOW | RTLD_LOCAL);
      free(target);
    }
  }
  return h;
}

/* Opens a library by name: as given, then (a name without '/') as
** lib<name>.so, as LuaJIT does, then the target of an ld script by that
** name where the linker looks. NULL with the first error in err. */
static void *open_library(const char *name, char *err, size_t errlen) {
  void *h = try_open(name, err, errlen);
  if (h || strchr(name, '/')) return h;
  size_t n = strlen(name) + sizeof "lib.so";
  char *buf = malloc(n);
  if (!buf) return NULL;
  snprintf(buf, n, "lib%s.so", name);
  h = try_open(buf, err, errlen);
  free(buf);
  /* An ld script is found only by path: look where the linker does. */
  static const char *const dirs[] = {"/usr/lib/x86_64-linux-gnu",
                                     "/usr/lib/aarch64-linux-gnu",
                                     "/lib/x86_64-linux-gnu",
                                     "/usr/lib64", "/usr/lib", NULL};
  for (int i = 0; !h && dirs[i]; i++) {
    n = strlen(dirs[i]) + strlen(name) + sizeof "/lib.so";
    char *path = malloc(n);
    if (!path) break;
    snprintf(path, n, "%s/lib%s.so", dirs[i], name);
    if (access(path, R_OK) == 0) {
      char *target = ld_script_target(path);
      if (target) {
        h = dlopen(target, RTLD_NOW | RTLD_LOCAL);
        free(target);
      }
    }
    free(path);
  }
  return h;
}

/* A library load. dlopen runs on the C-call pool, not on the task's
** scheduler thread: it may block (on the loader's lock, the file system,
** a library's constructors), and it needs more stack than a task may
** have (glibc copies the name and each path it tries onto the stack).
** Owned by l_load until the call is begun, then by the call: the caller
** gets it back once the call returned (load_k), or, if the task was
** cancelled meanwhile, the runtime passes it to load_release on the pool
** thread after dlopen returned. */
typedef struct lload {
  ums_preempt_call_t *call;  /* [Lua thread] the call in flight */
  void *handle;              /* [pool thread, then the owner] */
  char err[512];             /* [pool thread, then the owner] */
  char name[];               /* [const] */
} lload;

static void load_run(void *arg) {
  lload *r = arg;
  r->err[0] = '\0';
  r->handle = open_library(r->name, r->err, sizeof r->err);
  if (!r->handle && !r->err[0])
    snprintf(r->err, sizeof r->err, "out of memory");
}

/* The caller gave up on the load: nobody will use the library. */
static void load_release(void *arg) {
  lload *r = arg;
  if (r->handle) dlclose(r->handle);
  free(r);
}

/* Pushes the namespace of a finished load and frees r, or raises. */
static int load_done(lua_State *L, lload *r) {
  void *h = r->handle;
  if (!h) {
    lua_pushfstring(L, "ums.ffi.load: cannot load library '%s': %s",
                    r->name, r->err);
    free(r);
    return lua_error(L);
  }
  size_t len = strlen(r->name);
  flib *lib = malloc(sizeof *lib + len + 1);
  if (!lib) {
    load_release(r);
    return luaL_error(L, "ums.ffi.load: out of memory");
  }
  atomic_store(&lib->refs, 1);
  lib->handle = h;
  memcpy(lib->name, r->name, len + 1);
  free(r);
  push_namespace(L, lib);
  return 1;
}

static int load_k(lua_State *L, int status, lua_KContext ctx) {
  lload *r = (lload *)ctx;
  (void)status;
  /* Returns 0 (no deadline, so never a timeout) or raises when the task
  ** was cancelled, r then being the runtime's. */
  lums_preempt_settle(L, r->call, "ums.ffi.load");
  return load_done(L, r);
}

/* ffi.load(name) -> namespace. */
static int l_load(lua_State *L) {
  size_t len;
  const char *name = luaL_checklstring(L, 1, &len);
  lload *r = malloc(sizeof *r + len + 1);
  if (!r) return luaL_error(L, "ums.ffi.load: out of memory");
  memcpy(r->name, name, len + 1);
  r->handle = NULL;
  r->call = NULL;
  ltask *t = lums_cur_task;
  if (!t || !t->vmrun) {
    /* Outside a task: the main thread's stack, and nothing to stall. */
    load_run(r);
    return load_done(L, r);
  }
  return lums_preempt_start(L, t, "ums.ffi.load", load_run, r, load_release,
                            UMS_FOREVER, &r->call, (lua_KContext)r, load_k);
}

void lums_open_ffi(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"cdef", l_cdef}, {"load", l_load}, {NULL, NULL}};
  if (luaL_newmetatable(L, NS_MT)) {
    lua_pushcfunction(L, ns_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, ns_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, ns_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushcfunction(L, ns_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  if (lua_getfield(L, LUA_REGISTRYINDEX, DECLS_KEY) != LUA_TTABLE) {
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, DECLS_KEY);
  }
  lua_pop(L, 1);

  luaL_newlib(L, funcs);
  lffi_open_types(L);
  lffi_open_cdata(L);
  lffi_open_call(L);
  lffi_open_cb(L);
  if (lua_getfield(L, LUA_REGISTRYINDEX, C_KEY) != LUA_TUSERDATA) {
    lua_pop(L, 1);
    push_namespace(L, NULL);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, C_KEY);
  }
  lua_setfield(L, -2, "C");
  lua_setfield(L, -2, "ffi");
}
