/*
** lccall.h: ums.ffi's libraries, bound functions and calls (lccall.c).
** Libraries and bound functions are shared with pool threads: see
** "Ownership" at the top of lccall.c.
*/
#ifndef LCCALL_H
#define LCCALL_H

#include <stdatomic.h>

#include "lcdecl.h"

/* The cache line, for what a pool thread and the Lua thread must not
** share (the binding sees only the runtime's public headers). */
#define LFFI_CACHELINE 64

/* ums.ffi's state of one task, embedded in its ltask (ltask.ffi). Its
** members are ums.ffi's; the task's life cycle (lums.c) only clears it,
** with lffi_task_reset, before the record runs another task. Scheduler
** thread. */
typedef struct lffi_task {
  int err;               /* lccall.c: errno right after its last call */
  void *cbframe;         /* lccb.c: the inline call it is in, whose
                            callbacks run Lua on its thread */
} lffi_task;

static inline void lffi_task_reset(lffi_task *f) {
  f->err = 0;
  f->cbframe = NULL;
}

/* ums.ffi's state of one VM, embedded in its lvmrun (lvmrun.ffi): the
** freed call requests of the standard size, kept for the next calls of
** this VM's tasks (lccall.c), since a request is larger than malloc's
** per-thread cache takes. lccall.c owns it; the VM's part of a run
** (lums.c) frees it with lffi_vm_free when the run ends. [Lua thread] */
typedef struct lffi_vm {
  void **free;
  int nfree, capfree;
} lffi_vm;

/* Frees the requests v keeps. */
LUMS_HIDDEN void lffi_vm_free(lffi_vm *v);

/* A library handle; the last reference closes it, possibly on a pool
** thread (a detached call still runs its code until then). */
typedef struct flib {
  _Atomic int refs;
  void *handle;            /* NULL: the process (RTLD_DEFAULT) */
  char name[];
} flib;

/* A declaration bound to an address. Immutable once made, so pool threads
** read it without locks; reference counted: its userdata holds one, every
** call in flight one. The count has a cache line of its own (ffn is
** allocated aligned to one): the Lua thread moves it on every call, and on
** the name's or the cif's line it would take that line from the pool
** thread each time, to be fetched back by the next call. */
typedef struct ffn {
  fdecl d;
  void *addr;
  flib *lib;               /* reference held; NULL for ffi.C */
  ffi_cif cif;             /* prepared once (not for variadic functions,
                              whose cif depends on each call) */
  ffi_type *rtype;         /* the result's type */
  ffi_type *atypes[LFFI_MAXARGS]; /* a struct's is lffi_struct_ffi's
                                     block, owned and freed with f */
  _Atomic int refs __attribute__((aligned(LFFI_CACHELINE)));
} ffn;

/* Fills f->rtype and f->atypes from f->d, on the Lua thread that owns
** f->d's ctypes; false when out of memory (what was made is freed). */
LUMS_HIDDEN bool lffi_fn_describe(ffn *f);
/* Frees the struct types lffi_fn_describe made: for a function never
** bound, and at the last reference (any thread: f owns them). */
LUMS_HIDDEN void lffi_fn_free_types(ffn *f);

/* Drop one reference; the last one closes the library or frees the
** function (dropping its library reference). Any thread. */
LUMS_HIDDEN void lffi_lib_unref(flib *l);
LUMS_HIDDEN void lffi_fn_unref(ffn *f);

/* Pushes the Lua function calling f, taking over the caller's reference. */
LUMS_HIDDEN void lffi_push_function(lua_State *L, ffn *f);

/* Installs the fatal-signal report, creates the bound functions'
** metatable and adds errno and timeout to the ffi table at the top. */
LUMS_HIDDEN void lffi_open_call(lua_State *L);

#endif
