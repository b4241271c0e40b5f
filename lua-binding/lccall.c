/*
** lccall.c: ums.ffi's calls of bound functions.
**
** By default a call goes preemptive (docs/design/preempt.md): the arguments are
** marshalled into a request, the call runs on the runtime's C-call pool, the
** task parks (yielding its coroutine where Lua can yield, otherwise binding its
** worker) and resumes with the results. A declaration marked UMS_INLINE (or a
** cdef made with {inline = true}) is called directly on the scheduler, for
** functions known not to block. Outside a task every call is made directly.
**
** Ownership. A preemptive call may outlive its caller's interest (timeout,
** cancel): the runtime then detaches it, and everything the call reads or
** writes must stay valid until it returns on the pool thread. A call's
** fcall lives in its call record's inline area (ums_preempt_prepare),
** which the runtime keeps until the call is over: it holds a reference on
** the bound function (whose cif and library handle it uses) and, for a
** call with arguments, a heap request (the cif of a variadic call, the
** argument values and pointer array, copies of the string arguments,
** which holds a reference on the memory of every buffer and cdata
** passed); both are dropped by ums_preempt's release callback when the
** caller gave up, or by the caller once it has read the results. That
** memory is an ums_buf_t (reference counted, lcdata.c), so a buffer or
** cdata collected by Lua while a detached call writes into it stays
** allocated until the call is done.
**
** Threads: everything here runs on the Lua thread of the run (the
** scheduler thread) or the main thread outside runs, except fcall_run and
** fcall_free, which run on a pool thread and touch only the fcall, the
** request, the bound function's reference count and buffers' reference
** counts.
*/
#define _GNU_SOURCE
#include "lccall.h"
#include "lext.h"
#include "ltask.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lccb.h"
#include "lcconv.h"
#include "lcdata.h"

#define LFFI_FN_MT "ums.ffi.function"

void lffi_lib_unref(flib *l) {
  if (l && atomic_fetch_sub(&l->refs, 1) == 1) {
    if (l->handle) dlclose(l->handle);
    free(l);
  }
}

void lffi_fn_free_types(ffn *f) {
  if (f->d.ret == K_STRUCT) free(f->rtype);
  f->rtype = NULL;
  for (int i = 0; i < f->d.nargs; i++) {
    if (f->d.args[i] == K_STRUCT) free(f->atypes[i]);
    f->atypes[i] = NULL;
  }
}

bool lffi_fn_describe(ffn *f) {
  const fdecl *d = &f->d;
  f->rtype = d->ret == K_STRUCT ? lffi_struct_ffi(d->rett)
                                : lffi_kind_ffi(d->ret);
  bool ok = f->rtype != NULL;
  for (int i = 0; i < d->nargs; i++) {
    f->atypes[i] = d->args[i] == K_STRUCT ? lffi_struct_ffi(d->argt[i])
                                          : lffi_kind_ffi(d->args[i]);
    ok = ok && f->atypes[i];
  }
  if (!ok) lffi_fn_free_types(f);
  return ok;
}

void lffi_fn_unref(ffn *f) {
  if (atomic_fetch_sub(&f->refs, 1) == 1) {
    lffi_lib_unref(f->lib);
    lffi_fn_free_types(f);
    free(f);
  }
}

/* A call's arguments and their conversions: see "Ownership" at the top.
** A preemptive call's results go to its fcall; a direct call's here. What
** the pool thread reads comes first, within one cache line of a heap
** request (allocated aligned to one). */
typedef struct freq {
  ffn *f;                      /* reference held */
  ffi_cif *cif;                /* &f->cif or &vcif */
  void *rbuf;                  /* a struct result's bytes, 16-aligned in
                                  the strings area; NULL: into ret */
  rval ret;
  int err;                     /* errno right after the call */
  bool heap;                   /* a heap request holding references */
  char *strings;               /* copies of the string arguments, in the
                                  same allocation (heap requests) */
  lvmrun *cache;               /* the VM whose request cache it came from
                                  and may go back to; NULL: malloc'ed to
                                  its own size */
  void *avalues[LFFI_MAXARGS];
  ffi_cif vcif;                /* a variadic call's own cif */
  margs a;
} freq;

/* A preemptive call, in its call record's inline area
** (ums_preempt_prepare): on the cache line the pool thread reads first
** and the Lua thread reads the results from. A call without arguments
** needs nothing else: its request is the bound function itself (one
** reference held), whose cif it uses; one with arguments (or a variadic
** one) has a heap request for them. The pool thread writes ret and err;
** the Lua thread copies the area back once the call has returned
** (ums_preempt_end_copy). */
typedef struct fcall {
  void *req;                   /* ffn * (!heap) or freq * (heap) */
  rval ret;
  int err;                     /* errno right after the call */
  uint8_t heap;                /* a byte, not a bool: l_call compares it
                                  before storing, and a fresh area holds
                                  anything */
} fcall;
_Static_assert(sizeof(fcall) <= UMS_PREEMPT_AREA_SIZE,
               "fcall fits a call record's inline area");

/* String bytes a cached request has room for (lffi_vm). */
#define FREQ_CACHED_STRBYTES 256
/* Requests a VM keeps. */
#define FREQ_CACHE_MAX 256

void lffi_vm_free(lffi_vm *v) {
  for (int i = 0; i < v->nfree; i++) free(v->free[i]);
  free(v->free);
  v->free = NULL;
  v->nfree = v->capfree = 0;
}

/* Frees a heap request: ums_preempt's release callback (on a pool thread,
** once a detached call has returned), or the caller after the results. */
static void freq_free(void *arg) {
  freq *r = arg;
  for (int i = 0; i < r->a.n; i++)
    if (r->a.bufs[i]) ums_buf_release(r->a.bufs[i]);
  lffi_fn_unref(r->f);
  /* Back to its VM's cache only on that VM's own thread (a pool thread
  ** frees a detached call's request). */
  lvmrun *vm = r->cache;
  ltask *t = lums_cur_task;
  lffi_vm *c = vm ? &vm->ffi : NULL;
  if (c && t && t->vmrun == vm && c->nfree < FREQ_CACHE_MAX) {
    if (c->nfree == c->capfree) {
      int cap = c->capfree ? 2 * c->capfree : 16;
      void **v = realloc(c->free, (size_t)cap * sizeof *v);
      if (!v) {
        free(r);
        return;
      }
      c->free = v;
      c->capfree = cap;
    }
    c->free[c->nfree++] = r;
    return;
  }
  free(r);
}

/* Points the request's argument array at its values (a struct
** argument's bytes where they are); prepares a variadic call's cif.
** Returns false when libffi refuses the signature. */
static bool freq_prepare(freq *r) {
  const fdecl *d = &r->f->d;
  for (int i = 0; i < r->a.n; i++)
    r->avalues[i] = i < d->nargs && d->args[i] == K_STRUCT
                        ? (void *)r->a.strs[i]
                        : &r->a.vals[i];
  if (!d->variadic) {
    r->cif = &r->f->cif;
    return true;
  }
  for (int i = 0; i < d->nargs; i++) r->a.types[i] = r->f->atypes[i];
  r->cif = &r->vcif;
  return ffi_prep_cif_var(&r->vcif, FFI_DEFAULT_ABI, (unsigned)d->nargs,
                          (unsigned)r->a.n, r->f->rtype,
                          r->a.types) == FFI_OK;
}

/* The C function this thread is in, for the fatal-signal report.
** Initial-exec, so the signal handler never makes glibc allocate a
** dlopen'ed module's TLS block. */
static _Thread_local const char *calling
    __attribute__((tls_model("initial-exec")));

/* Calls f, which takes no arguments and is not variadic, into *ret as
** ffi_call would (an integer result in a whole ffi_arg, whose bits beyond
** the C type push_result ignores). Where the C ABI returns every integer
** and pointer in one register whatever its width (x86-64, AArch64), a
** plain call through a pointer of the matching class does it without
** libffi's argument classification, a noticeable share of a call as
** short as getpid's. */
static void call_nullary(const ffn *f, ffi_cif *cif, rval *ret) {
#if defined(__x86_64__) || defined(__aarch64__)
  switch (f->d.ret) {
    case K_VOID: ((void (*)(void))f->addr)(); return;
    case K_DOUBLE: ret->d = ((double (*)(void))f->addr)(); return;
    case K_FLOAT: break; /* rare: libffi */
    default: ret->a = ((ffi_arg (*)(void))f->addr)(); return;
  }
#endif
  ffi_call(cif, FFI_FN(f->addr), ret, NULL);
}

/* The call itself: on a pool thread, or directly. */
static void freq_run(void *arg) {
  freq *r = arg;
  calling = r->f->d.name;
  errno = 0;
  if (r->rbuf)
    ffi_call(r->cif, FFI_FN(r->f->addr), r->rbuf, r->avalues);
  else if (r->a.n == 0 && !r->f->d.variadic)
    call_nullary(r->f, r->cif, &r->ret);
  else
    ffi_call(r->cif, FFI_FN(r->f->addr), &r->ret, r->avalues);
  r->err = errno;
  calling = NULL;
}

/* A preemptive call, on a pool thread. */
static void fcall_run(void *arg) {
  fcall *c = arg;
  ffn *f;
  ffi_cif *cif;
  void **avalues;
  void *rbuf = NULL;
  if (c->heap) {
    freq *r = c->req;
    f = r->f;
    cif = r->cif;
    avalues = r->avalues;
    rbuf = r->rbuf;
  } else {
    f = c->req;
    cif = &f->cif;
    avalues = NULL;
  }
  calling = f->d.name;
  errno = 0;
  /* The results into the area together, right before the runtime's
  ** DONE: the Lua thread spins on that line, and a store made after it
  ** took the line back would cost a round trip. */
  rval ret;
  if (rbuf)
    ffi_call(cif, FFI_FN(f->addr), rbuf, avalues);
  else if (c->heap)
    ffi_call(cif, FFI_FN(f->addr), &ret, avalues);
  else
    call_nullary(f, cif, &ret);
  int err = errno;
  calling = NULL;
  c->ret = ret;
  c->err = err;
}

/* Drops what a preemptive call holds: ums_preempt's release callback (on
** a pool thread, once a detached call has returned), or the caller after
** the results. */
static void fcall_release(void *req, bool heap) {
  if (heap)
    freq_free(req);
  else
    lffi_fn_unref(req);
}

static void fcall_free(void *arg) {
  fcall *c = arg;
  fcall_release(c->req, c->heap);
}

/* A C function that crashes takes the process with it (nothing can
** safely continue after a fault in foreign code), but first says which
** function it was: on a pool thread the default action would end the
** process without a word. Installed only over the default action, once
** per process; it resets itself (SA_RESETHAND) and raises the signal
** again, so the process still dies of it (core dump included). */
static void put(char *buf, size_t *n, size_t cap, const char *s) {
  while (*s && *n + 1 < cap) buf[(*n)++] = *s++;
}

static void on_fatal_signal(int sig) {
  const char *fn = calling;
  if (fn) {
    const char *name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGFPE ? "SIGFPE" : sig == SIGILL ? "SIGILL"
                     : "SIGABRT";
    char msg[256];
    size_t n = 0;
    put(msg, &n, sizeof msg, "ums.ffi: fatal signal ");
    put(msg, &n, sizeof msg, name);
    put(msg, &n, sizeof msg, " in C function '");
    put(msg, &n, sizeof msg, fn);
    put(msg, &n, sizeof msg, "'\n");
    ssize_t w = write(2, msg, n);
    (void)w;
  }
  raise(sig);
}

static void install_fatal_handlers(void) {
  static atomic_int done;
  if (atomic_exchange(&done, 1)) return;
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old, sa;
    if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL ||
        (old.sa_flags & SA_SIGINFO))
      continue;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, NULL);
  }
}

/* Room for a heap request and strbytes of strings, its first cache line
** its own (see freq). */
static freq *freq_alloc(size_t strbytes) {
  size_t n = (sizeof(freq) + strbytes + LFFI_CACHELINE - 1) &
             ~(size_t)(LFFI_CACHELINE - 1);
  return aligned_alloc(LFFI_CACHELINE, n);
}

/* Struct bytes in a request's strings area start 16-aligned, as libffi
** and the C ABI may expect of them. */
static char *align16(char *p) {
  return (char *)(((uintptr_t)p + 15) & ~(uintptr_t)15);
}

static bool is_struct_arg(const fdecl *d, int i) {
  return i < d->nargs && d->args[i] == K_STRUCT;
}

/* A heap request owning copies of everything the call touches: string
** arguments, struct arguments (by value: a later change to the cdata
** does not reach the call) and room for a struct result. */
static freq *freq_copy(lua_State *L, ffn *f, const margs *a,
                       lvmrun *vmrun) {
  size_t strbytes = 0;
  for (int i = 0; i < a->n; i++)
    if (a->strs[i])
      strbytes += is_struct_arg(&f->d, i) ? a->slens[i] + 15
                                          : a->slens[i] + 1;
  size_t rsize = 0;
  if (f->d.ret == K_STRUCT) {
    rsize = (f->d.rett->size + 15) & ~(size_t)15;
    strbytes += rsize + 15;
  }
  freq *r;
  lvmrun *cache = NULL;
  if (strbytes <= FREQ_CACHED_STRBYTES) {
    cache = vmrun;
    r = vmrun->ffi.nfree ? vmrun->ffi.free[--vmrun->ffi.nfree]
                         : freq_alloc(FREQ_CACHED_STRBYTES);
  } else {
    r = freq_alloc(strbytes);
  }
  if (!r) {
    luaL_error(L, "%s: out of memory", f->d.name);
    return NULL;
  }
  r->cache = cache;
  r->f = f;
  /* The arguments only: the arrays are sized for LFFI_MAXARGS. */
  r->a.n = a->n;
  size_t n = (size_t)a->n;
  if (n) { /* five library calls for nothing, otherwise */
    memcpy(r->a.types, a->types, n * sizeof a->types[0]);
    memcpy(r->a.vals, a->vals, n * sizeof a->vals[0]);
    memcpy(r->a.bufs, a->bufs, n * sizeof a->bufs[0]);
    memcpy(r->a.strs, a->strs, n * sizeof a->strs[0]);
    memcpy(r->a.slens, a->slens, n * sizeof a->slens[0]);
  }
  r->heap = true;
  r->err = 0;
  r->strings = (char *)(r + 1);
  char *s = r->strings;
  for (int i = 0; i < a->n; i++) {
    if (a->strs[i] && is_struct_arg(&f->d, i)) {
      s = align16(s);
      memcpy(s, a->strs[i], a->slens[i]);
      r->a.strs[i] = s;
      s += a->slens[i];
    } else if (a->strs[i]) {
      memcpy(s, a->strs[i], a->slens[i] + 1);
      r->a.vals[i].p = s;
      r->a.strs[i] = s;
      s += a->slens[i] + 1;
    }
    if (a->bufs[i]) ums_buf_retain(a->bufs[i]);
  }
  r->rbuf = rsize ? align16(s) : NULL;
  atomic_fetch_add(&f->refs, 1);
  return r;
}

/* ---------------------------------------------------------------------- */
/* Calls                                                                   */
/* ---------------------------------------------------------------------- */

/* errno of the last call made outside tasks, per thread: the init module
** of a new VM runs outside tasks too, on its scheduler's thread (lvm.c). */
static _Thread_local int host_errno;

static void save_errno(int err) {
  ltask *t = lums_cur_task;
  if (t && t->vmrun)
    t->ffi.err = err;
  else
    host_errno = err;
}

typedef struct fbox {
  ffn *f;                  /* reference held */
} fbox;

static ffn *upvalue_fn(lua_State *L) {
  return ((fbox *)lua_touserdata(L, lua_upvalueindex(1)))->f;
}

/* In l_call's frame: its upvalues are the function's. */
static int call_k(lua_State *L, int status, lua_KContext ctx) {
  ffn *f = upvalue_fn(L);
  fcall res;
  (void)status;
  int rc = lums_preempt_settle_copy(L, (ums_preempt_call_t *)ctx,
                                    f->d.name, &res, sizeof res);
  if (rc == 0) {
    save_errno(res.err);
    if (f->d.ret == K_STRUCT) {
      /* Copied out of the request (which holds the bytes) into memory
      ** of its own, so the request is released before anything here can
      ** raise. */
      freq *r = res.req;
      const ctype *t = f->d.rett;
      ums_buf_t *b = ums_buf_new(t->size);
      if (!b) {
        fcall_release(res.req, res.heap);
        return luaL_error(L, "%s: out of memory", f->d.name);
      }
      memcpy(ums_buf_data(b), r->rbuf, t->size);
      fcall_release(res.req, res.heap);
      lffi_push_cdata_buf(L, t, b);
      return 1;
    }
    /* The upvalue holds f for push_result. */
    fcall_release(res.req, res.heap);
    return lffi_push_result(L, &f->d, &res.ret,
                            !lua_isnone(L, lua_upvalueindex(2)));
  }
  /* Timed out: the request is the runtime's now (fcall_free runs when the
  ** call returns). */
  lua_pushnil(L);
  lua_pushliteral(L, "timeout");
  return 2;
}

/* A declared function. Upvalue 1: its fbox; upvalue 2 (ffi.timeout's
** wrappers): the timeout in seconds. */
static int l_call(lua_State *L) {
  ffn *f = upvalue_fn(L);
  bool timed = !lua_isnone(L, lua_upvalueindex(2));
  margs a;
  ltask *t = lums_cur_task;
  bool direct = !t || !t->vmrun || f->d.inlined;
  lffi_marshal(L, &f->d, 1, &a, !direct);
  if (direct) {
    /* Directly, on this thread: the Lua values outlive the call, so the
    ** request lives on this stack and points into them. */
    freq r;
    r.f = f;
    r.a = a;
    r.heap = false;
    r.cache = NULL;
    /* A struct result: its cdata first (nothing raises after the call
    ** but the results), and a 16-aligned return buffer rounded up to 16
    ** bytes, as libffi may store whole registers. */
    _Alignas(16) char rsmall[64];
    char *rheap = NULL;
    lcdata *res = NULL;
    r.rbuf = NULL;
    if (f->d.ret == K_STRUCT) {
      size_t rs = (f->d.rett->size + 15) & ~(size_t)15;
      res = lffi_new_cdata(L, f->d.rett);
      r.rbuf = rs <= sizeof rsmall ? rsmall : (rheap = aligned_alloc(16, rs));
      if (!r.rbuf) return luaL_error(L, "%s: out of memory", f->d.name);
    }
    if (!freq_prepare(&r)) {
      free(rheap);
      return luaL_error(L, "%s: libffi cannot prepare this call",
                        f->d.name);
    }
    lcbframe fr;
    lffi_cb_enter(&fr, L);
    freq_run(&r);
    save_errno(r.err);
    if (res) {
      memcpy(res->p, r.rbuf, f->d.rett->size);
      free(rheap);
    }
    /* Raises what a callback raised, now that C is done. */
    lffi_cb_leave(&fr);
    if (res) return 1;
    return lffi_push_result(L, &f->d, &r.ret, timed);
  }
  int64_t deadline = UMS_FOREVER;
  if (timed) {
    lua_Number s = lua_tonumber(L, lua_upvalueindex(2));
    if (s <= 1e9) deadline = ums_deadline((int64_t)(s * 1e9));
  }
  /* The request: the bound function for a call without arguments,
  ** else a heap copy of them. */
  bool heap = a.n > 0 || f->d.variadic || f->d.ret == K_STRUCT;
  void *req;
  if (heap) {
    freq *r = freq_copy(L, f, &a, t->vmrun);
    if (!freq_prepare(r)) {
      freq_free(r);
      return luaL_error(L, "%s: libffi cannot prepare this call",
                        f->d.name);
    }
    req = r;
  } else {
    atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
    req = f;
  }
  ums_preempt_call_t *call;
  fcall *c;
  int rc = ums_preempt_prepare(&call, (void **)&c);
  if (rc != 0) {
    fcall_release(req, heap);
    return luaL_error(L, "%s: %s", f->d.name, ums_strerror(rc));
  }
  /* Stored only if changed (calls in a row of one function reuse the
  ** scheduler's slot record): the pool thread polls this line. */
  if (c->req != req) c->req = req;
  if (c->heap != heap) c->heap = heap;
  /* The name lives in f, which the request holds until its release. */
  ums_preempt_set_what(call, f->d.name);
  /* On failure the runtime releases the request through fcall_free. */
  return lums_preempt_start_prepared(L, t, f->d.name, call, fcall_run, c,
                                     fcall_free, deadline,
                                     f->d.interruptible,
                                     (lua_KContext)call, call_k);
}

static int fbox_gc(lua_State *L) {
  fbox *b = (fbox *)lua_touserdata(L, 1);
  if (b->f) {
    lffi_fn_unref(b->f);
    b->f = NULL;
  }
  return 0;
}

/* Pushes the Lua function for f (taking over the caller's reference). */
void lffi_push_function(lua_State *L, ffn *f) {
  fbox *b = (fbox *)lua_newuserdatauv(L, sizeof *b, 0);
  b->f = f;
  luaL_setmetatable(L, LFFI_FN_MT);
  lua_pushcclosure(L, l_call, 1);
}

/* ffi.timeout(f, seconds) -> a function calling f that returns nil,
** "timeout" when the call has not returned within seconds (the call goes
** on detached). */
static int l_timeout(lua_State *L) {
  if (lua_tocfunction(L, 1) != l_call)
    return luaL_typeerror(L, 1, "function from an ums.ffi namespace");
  lua_Number s = luaL_checknumber(L, 2);
  luaL_argcheck(L, s == s, 2, LUMS_NAN_TIMEOUT);
  luaL_argcheck(L, s >= 0, 2, "timeout must not be negative");
  lua_getupvalue(L, 1, 1);
  lua_pushnumber(L, s);
  lua_pushcclosure(L, l_call, 2);
  return 1;
}

/* ffi.errno() -> errno saved right after the calling task's last call */
static int l_errno(lua_State *L) {
  ltask *t = lums_cur_task;
  lua_pushinteger(L, t && t->vmrun ? t->ffi.err : host_errno);
  return 1;
}

void lffi_open_call(lua_State *L) {
  install_fatal_handlers();
  static const luaL_Reg funcs[] = {
      {"errno", l_errno}, {"timeout", l_timeout}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
  if (luaL_newmetatable(L, LFFI_FN_MT)) {
    lua_pushcfunction(L, fbox_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
}
