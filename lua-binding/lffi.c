/*
** lffi.c: ums.ffi, C functions called from Lua through libffi, following
** LuaJIT's FFI conventions where they fit:
**
**   ffi.cdef[[ int usleep(unsigned int usec); ]]   declare (a small parser)
**   ffi.C.usleep(1000)                              the process's symbols
**   local m = ffi.load("m"); m.sqrt(2)              a shared library
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
** which holds a reference on every buffer passed); both are dropped by
** ums_preempt's release callback when the caller gave up, or by the
** caller once it has read the results. Buffers are ums_buf_t (reference counted),
** so a buffer collected by Lua while a detached call writes into it stays
** allocated until the call is done.
**
** Threads: everything here runs on the Lua thread of the run (the
** scheduler thread) or the main thread outside runs, except fcall_run and
** fcall_free, which run on a pool thread and touch only the fcall, the
** request, the bound function's reference count and buffers' reference
** counts.
*/
#define _GNU_SOURCE
#include "lums.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <ffi.h>
#include <float.h>
#include <limits.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define NS_MT "ums.ffi.namespace"
#define BUF_MT "ums.ffi.buffer"
#define PTR_MT "ums.ffi.pointer"
#define FN_MT "ums.ffi.function"
#define DECLS_KEY "ums.ffi.decls"
#define C_KEY "ums.ffi.C"

/* Most arguments of one call, variadic ones included. */
#define MAXARGS 32
#define NAME_MAX_LEN 63
/* Largest ffi.buffer. */
#define BUF_MAX ((lua_Integer)1 << 31)
/* The cache line, for what a pool thread and the Lua thread must not
** share (the binding sees only the runtime's public headers). */
#define CACHELINE 64

/* ---------------------------------------------------------------------- */
/* Types                                                                   */
/* ---------------------------------------------------------------------- */

enum kind {
  K_VOID, K_BOOL, K_I8, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_U64,
  K_FLOAT, K_DOUBLE,
  K_PTR,   /* a pointer: buffer, pointer or nil in; a pointer out */
  K_CPTR,  /* a pointer to const: a string too */
  K_CSTR   /* const char *: string in, string out */
};

static const char *const kind_names[] = {
    "void", "bool", "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t",
    "uint32_t", "int64_t", "uint64_t", "float", "double", "pointer",
    "const pointer", "const char *"};

static ffi_type *kind_ffi(int k) {
  switch (k) {
    case K_VOID: return &ffi_type_void;
    case K_BOOL: return &ffi_type_uint8;
    case K_I8: return &ffi_type_sint8;
    case K_U8: return &ffi_type_uint8;
    case K_I16: return &ffi_type_sint16;
    case K_U16: return &ffi_type_uint16;
    case K_I32: return &ffi_type_sint32;
    case K_U32: return &ffi_type_uint32;
    case K_I64: return &ffi_type_sint64;
    case K_U64: return &ffi_type_uint64;
    case K_FLOAT: return &ffi_type_float;
    case K_DOUBLE: return &ffi_type_double;
    default: return &ffi_type_pointer;
  }
}

/* The integer kind of a C type of `size` bytes. */
static int int_kind(size_t size, bool is_unsigned) {
  switch (size) {
    case 1: return is_unsigned ? K_U8 : K_I8;
    case 2: return is_unsigned ? K_U16 : K_I16;
    case 4: return is_unsigned ? K_U32 : K_I32;
    default: return is_unsigned ? K_U64 : K_I64;
  }
}

/* A parsed function declaration. Plain data: a bound function copies it. */
typedef struct fdecl {
  char name[NAME_MAX_LEN + 1];
  char sym[NAME_MAX_LEN + 1]; /* the symbol: name, or __asm__("sym") */
  int ret;                  /* enum kind */
  int nargs;                /* fixed arguments */
  int args[MAXARGS];
  bool variadic;
  bool inlined;             /* called directly, never preemptive */
} fdecl;

/* ---------------------------------------------------------------------- */
/* The declaration parser                                                  */
/* ---------------------------------------------------------------------- */

typedef struct lexer {
  lua_State *L;
  const char *src, *p;
  char tok[NAME_MAX_LEN + 1];  /* identifier, string literal's contents,
                                  or punctuation: "(", "..." */
  bool ident;
  bool str;                    /* tok is a string literal's contents */
  bool eof;
} lexer;

static int parse_error(lexer *x, const char *what) {
  int line = 1;
  for (const char *q = x->src; q < x->p; q++) line += *q == '\n';
  return luaL_error(x->L, "ums.ffi.cdef: line %d: %s near '%s'", line, what,
                    x->eof ? "<eof>" : x->tok);
}

static void skip_space(lexer *x) {
  for (;;) {
    while (isspace((unsigned char)*x->p)) x->p++;
    if (x->p[0] == '/' && x->p[1] == '/') {
      while (*x->p && *x->p != '\n') x->p++;
    } else if (x->p[0] == '/' && x->p[1] == '*') {
      const char *end = strstr(x->p + 2, "*/");
      x->p = end ? end + 2 : x->p + strlen(x->p);
    } else {
      return;
    }
  }
}

static void next(lexer *x) {
  skip_space(x);
  x->ident = false;
  x->str = false;
  x->eof = false;
  const char *p = x->p;
  if (*p == '"') {
    size_t n = strcspn(p + 1, "\"\n");
    if (p[1 + n] != '"' || n > NAME_MAX_LEN) {
      snprintf(x->tok, sizeof x->tok, "%.20s", p);
      parse_error(x, "bad string literal");
    }
    memcpy(x->tok, p + 1, n);
    x->tok[n] = 0;
    x->str = true;
    x->p = p + n + 2;
    return;
  }
  if (!*p) {
    x->eof = true;
    x->tok[0] = 0;
    return;
  }
  if (isalpha((unsigned char)*p) || *p == '_') {
    size_t n = 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '_') n++;
    if (n > NAME_MAX_LEN) {
      snprintf(x->tok, sizeof x->tok, "%.20s...", p);
      parse_error(x, "name too long");
    }
    memcpy(x->tok, p, n);
    x->tok[n] = 0;
    x->ident = true;
    x->p = p + n;
    return;
  }
  if (p[0] == '.' && p[1] == '.' && p[2] == '.') {
    strcpy(x->tok, "...");
    x->p = p + 3;
    return;
  }
  x->tok[0] = *p;
  x->tok[1] = 0;
  x->p = p + 1;
}

static bool is(lexer *x, const char *s) { return strcmp(x->tok, s) == 0; }

static void expect(lexer *x, const char *s) {
  if (!is(x, s)) {
    char what[32];
    snprintf(what, sizeof what, "'%s' expected", s);
    parse_error(x, what);
  }
  next(x);
}

/* Skips __attribute__((...)). */
static bool skip_attribute(lexer *x) {
  if (!x->ident || !is(x, "__attribute__")) return false;
  next(x);
  if (!is(x, "(")) parse_error(x, "'(' expected");
  int depth = 0;
  do {
    if (x->eof) parse_error(x, "unbalanced parentheses");
    if (is(x, "(")) depth++;
    if (is(x, ")")) depth--;
    next(x);
  } while (depth > 0);
  return true;
}

/* Typedef names the parser knows, with their kinds. */
static int typedef_kind(const char *s) {
  static const struct { const char *name; int kind; } t[] = {
      {"int8_t", K_I8},     {"uint8_t", K_U8},     {"int16_t", K_I16},
      {"uint16_t", K_U16},  {"int32_t", K_I32},    {"uint32_t", K_U32},
      {"int64_t", K_I64},   {"uint64_t", K_U64},   {"bool", K_BOOL},
      {"_Bool", K_BOOL},    {NULL, 0}};
  for (int i = 0; t[i].name; i++)
    if (strcmp(s, t[i].name) == 0) return t[i].kind;
  if (strcmp(s, "size_t") == 0) return int_kind(sizeof(size_t), true);
  if (strcmp(s, "ssize_t") == 0) return int_kind(sizeof(ssize_t), false);
  if (strcmp(s, "intptr_t") == 0) return int_kind(sizeof(intptr_t), false);
  if (strcmp(s, "uintptr_t") == 0) return int_kind(sizeof(uintptr_t), true);
  if (strcmp(s, "ptrdiff_t") == 0) return int_kind(sizeof(ptrdiff_t), false);
  if (strcmp(s, "off_t") == 0) return int_kind(sizeof(off_t), false);
  if (strcmp(s, "time_t") == 0) return int_kind(sizeof(time_t), false);
  if (strcmp(s, "pid_t") == 0) return int_kind(sizeof(pid_t), false);
  if (strcmp(s, "uid_t") == 0) return int_kind(sizeof(uid_t), true);
  if (strcmp(s, "gid_t") == 0) return int_kind(sizeof(gid_t), true);
  if (strcmp(s, "mode_t") == 0) return int_kind(sizeof(mode_t), true);
  return -1;
}

/* type := {qualifier | specifier}+ {'*' {qualifier}}
** Returns the kind; *named says whether a typedef name or 'void'/'char'...
** was seen (a type is required). */
static int parse_type(lexer *x) {
  int n_signed = 0, n_unsigned = 0, n_char = 0, n_short = 0, n_int = 0,
      n_long = 0, n_float = 0, n_double = 0, n_void = 0, tdef = -1;
  bool is_const = false, any = false, spec = false;
  for (;;) {
    if (!x->ident) break;
    if (skip_attribute(x)) continue;
    if (is(x, "const")) {
      is_const = true;
      any = true;
      next(x);
      continue;
    }
    else if (is(x, "volatile")) {
      any = true;
      next(x);
      continue;
    }
    else if (is(x, "struct") || is(x, "enum") || is(x, "union"))
      parse_error(x, "struct, union and enum types are not supported (use "
                     "a pointer type such as void *)");
    else if (is(x, "signed")) n_signed++;
    else if (is(x, "unsigned")) n_unsigned++;
    else if (is(x, "char")) n_char++;
    else if (is(x, "short")) n_short++;
    else if (is(x, "int")) n_int++;
    else if (is(x, "long")) n_long++;
    else if (is(x, "float")) n_float++;
    else if (is(x, "double")) n_double++;
    else if (is(x, "void")) n_void++;
    else if (!spec && typedef_kind(x->tok) >= 0)
      tdef = typedef_kind(x->tok);
    else
      break; /* the declarator's name */
    any = spec = true;
    next(x);
  }
  if (!any) parse_error(x, "type expected");
  int base;
  int nspec = n_char + n_short + n_int + n_float + n_double + n_void +
              (tdef >= 0) + (n_long > 0);
  if (n_signed + n_unsigned > 1 || n_char > 1 || n_short > 1 || n_int > 1 ||
      n_long > 2 || n_float > 1 || n_double > 1 || n_void > 1 ||
      (n_short && n_long) || (n_int && (n_char)))
    parse_error(x, "invalid combination of type specifiers");
  if (tdef >= 0) {
    if (nspec > 1 || n_signed || n_unsigned)
      parse_error(x, "invalid combination of type specifiers");
    base = tdef;
  } else if (n_void) {
    if (nspec > 1 || n_signed || n_unsigned)
      parse_error(x, "invalid combination of type specifiers");
    base = K_VOID;
  } else if (n_float || n_double) {
    if (n_long && n_double) parse_error(x, "long double is not supported");
    if (nspec > 1 || n_signed || n_unsigned)
      parse_error(x, "invalid combination of type specifiers");
    base = n_float ? K_FLOAT : K_DOUBLE;
  } else if (n_char) {
    if (nspec > 1) parse_error(x, "invalid combination of type specifiers");
    /* Plain char is signed on x86 and unsigned on aarch64. */
    base = int_kind(1, n_unsigned || (!n_signed && (char)-1 > 0));
  } else if (n_short) {
    base = int_kind(sizeof(short), n_unsigned);
  } else if (n_long == 1) {
    base = int_kind(sizeof(long), n_unsigned);
  } else if (n_long == 2) {
    base = int_kind(sizeof(long long), n_unsigned);
  } else if (n_int || n_signed || n_unsigned) {
    base = int_kind(sizeof(int), n_unsigned);
  } else {
    parse_error(x, "type expected");
    return K_VOID;
  }
  int depth = 0;
  while (is(x, "*")) {
    depth++;
    next(x);
    while (x->ident && (is(x, "const") || is(x, "restrict") ||
                        is(x, "__restrict") || is(x, "volatile")))
      next(x);
  }
  if (depth == 0) return base;
  if (depth == 1 && is_const && (base == K_I8 || base == K_U8)) return K_CSTR;
  if (depth == 1 && is_const) return K_CPTR;
  return K_PTR;
}

/* One declaration, up to and including its ';'. */
static void parse_decl(lexer *x, fdecl *d, bool inlined) {
  memset(d, 0, sizeof *d);
  d->inlined = inlined;
  for (;;) {
    if (x->ident && (is(x, "UMS_INLINE"))) {
      d->inlined = true;
      next(x);
    } else if (x->ident && (is(x, "extern") || is(x, "static") ||
                            is(x, "inline") || is(x, "__inline"))) {
      next(x);
    } else if (!skip_attribute(x)) {
      break;
    }
  }
  if (x->ident && is(x, "typedef"))
    parse_error(x, "typedef is not supported (declare functions only)");
  d->ret = parse_type(x);
  if (!x->ident) parse_error(x, "function name expected");
  strcpy(d->name, x->tok);
  next(x);
  if (!is(x, "(")) parse_error(x, "'(' expected (only functions can be declared)");
  next(x);
  if (is(x, "void") && x->p[strspn(x->p, " \t\r\n")] == ')') {
    next(x); /* (void) */
  } else if (!is(x, ")")) {
    for (;;) {
      if (is(x, "...")) {
        if (d->nargs == 0)
          parse_error(x, "'...' needs a fixed argument before it");
        d->variadic = true;
        next(x);
        break;
      }
      if (d->nargs == MAXARGS) parse_error(x, "too many arguments");
      int k = parse_type(x);
      if (k == K_VOID) parse_error(x, "argument of type void");
      if (x->ident) next(x); /* its name */
      if (is(x, "[")) {      /* T name[] or T name[N]: a pointer */
        while (!x->eof && !is(x, "]")) next(x);
        expect(x, "]");
        k = K_PTR;
      }
      d->args[d->nargs++] = k;
      if (!is(x, ",")) break;
      next(x);
    }
  }
  expect(x, ")");
  strcpy(d->sym, d->name);
  for (;;) {
    if (skip_attribute(x)) continue;
    if (x->ident && (is(x, "__asm__") || is(x, "__asm") || is(x, "asm"))) {
      /* A symbol name different from the declared one (as in LuaJIT). */
      next(x);
      expect(x, "(");
      if (!x->str || !x->tok[0]) parse_error(x, "symbol name expected");
      strcpy(d->sym, x->tok);
      next(x);
      expect(x, ")");
      continue;
    }
    break;
  }
  expect(x, ";");
}

/* ---------------------------------------------------------------------- */
/* Libraries and bound functions (shared with pool threads)               */
/* ---------------------------------------------------------------------- */

/* A library handle; the last reference closes it, possibly on a pool
** thread (a detached call still runs its code until then). */
typedef struct flib {
  _Atomic int refs;
  void *handle;            /* NULL: the process (RTLD_DEFAULT) */
  char name[];
} flib;

static void lib_unref(flib *l) {
  if (l && atomic_fetch_sub(&l->refs, 1) == 1) {
    if (l->handle) dlclose(l->handle);
    free(l);
  }
}

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
  ffi_type *atypes[MAXARGS];
  _Atomic int refs __attribute__((aligned(CACHELINE)));
} ffn;

static void fn_unref(ffn *f) {
  if (atomic_fetch_sub(&f->refs, 1) == 1) {
    lib_unref(f->lib);
    free(f);
  }
}

/* ---------------------------------------------------------------------- */
/* Buffers and pointers                                                    */
/* ---------------------------------------------------------------------- */

typedef struct lbuf {
  ums_buf_t *b;            /* one reference, dropped at __gc */
  size_t size;
} lbuf;

typedef struct lptr {
  void *p;
} lptr;

static lbuf *to_buf(lua_State *L, int idx) {
  return (lbuf *)luaL_testudata(L, idx, BUF_MT);
}

static lptr *to_ptr(lua_State *L, int idx) {
  return (lptr *)luaL_testudata(L, idx, PTR_MT);
}

ums_buf_t *lums_test_buf(lua_State *L, int idx, size_t *size) {
  lbuf *u = to_buf(L, idx);
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
  luaL_setmetatable(L, BUF_MT);
  u->b = ums_buf_new((size_t)n);
  if (!u->b) return luaL_error(L, "ums.ffi.buffer: out of memory");
  memset(ums_buf_data(u->b), 0, (size_t)n);
  return 1;
}

static int buf_gc(lua_State *L) {
  lbuf *u = to_buf(L, 1);
  if (u && u->b) {
    ums_buf_release(u->b);
    u->b = NULL;
  }
  return 0;
}

static int buf_len(lua_State *L) {
  lbuf *u = luaL_checkudata(L, 1, BUF_MT);
  lua_pushinteger(L, (lua_Integer)u->size);
  return 1;
}

static int buf_tostring(lua_State *L) {
  lbuf *u = luaL_checkudata(L, 1, BUF_MT);
  lua_pushfstring(L, "ums.ffi.buffer (%d bytes): %p", (int)u->size,
                  u->b ? ums_buf_data(u->b) : NULL);
  return 1;
}

static void push_ptr(lua_State *L, void *p) {
  if (!p) {
    lua_pushnil(L);
    return;
  }
  lptr *u = (lptr *)lua_newuserdatauv(L, sizeof *u, 0);
  u->p = p;
  luaL_setmetatable(L, PTR_MT);
}

static int ptr_tostring(lua_State *L) {
  lptr *u = luaL_checkudata(L, 1, PTR_MT);
  lua_pushfstring(L, "ums.ffi.pointer: %p", u->p);
  return 1;
}

static int ptr_eq(lua_State *L) {
  lptr *a = to_ptr(L, 1), *b = to_ptr(L, 2);
  lua_pushboolean(L, a && b && a->p == b->p);
  return 1;
}

/* ffi.string(buf | ptr [, len]) -> string */
static int l_string(lua_State *L) {
  lbuf *b = to_buf(L, 1);
  lptr *p = b ? NULL : to_ptr(L, 1);
  if (!b && !p)
    return luaL_typeerror(L, 1, "ums.ffi.buffer or ums.ffi.pointer");
  const char *data = b ? ums_buf_data(b->b) : p->p;
  if (lua_isnoneornil(L, 2)) {
    size_t n = b ? strnlen(data, b->size) : strlen(data);
    lua_pushlstring(L, data, n);
    return 1;
  }
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_argcheck(L, n >= 0, 2, "length must not be negative");
  if (b)
    luaL_argcheck(L, (lua_Unsigned)n <= b->size, 2,
                  "length beyond the end of the buffer");
  lua_pushlstring(L, data, (size_t)n);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* Marshalling                                                             */
/* ---------------------------------------------------------------------- */

typedef union cval {
  int8_t i8; uint8_t u8; int16_t i16; uint16_t u16; int32_t i32;
  uint32_t u32; int64_t i64; uint64_t u64; float f; double d; void *p;
} cval;

/* The return buffer: ffi_call writes integers narrower than a register
** as a whole ffi_arg. */
typedef union rval {
  ffi_arg a; ffi_sarg s; int64_t i64; uint64_t u64; float f; double d;
  void *p;
} rval;

/* The arguments of one call, as converted on the Lua thread. */
typedef struct margs {
  int n;
  ffi_type *types[MAXARGS];    /* every argument's type (variadic too) */
  cval vals[MAXARGS];
  ums_buf_t *bufs[MAXARGS];    /* the buffer behind argument i, or NULL */
  const char *strs[MAXARGS];   /* a string argument i (in the Lua state) */
  size_t slens[MAXARGS];
} margs;

/* A call's arguments and their conversions: see "Ownership" at the top.
** A preemptive call's results go to its fcall; a direct call's here. What
** the pool thread reads comes first, within one cache line of a heap
** request (allocated aligned to one). */
typedef struct freq {
  ffn *f;                      /* reference held */
  ffi_cif *cif;                /* &f->cif or &vcif */
  rval ret;
  int err;                     /* errno right after the call */
  bool heap;                   /* a heap request holding references */
  char *strings;               /* copies of the string arguments, in the
                                  same allocation (heap requests) */
  lrun *cache;                 /* the VM whose request cache it came from
                                  and may go back to; NULL: malloc'ed to
                                  its own size */
  void *avalues[MAXARGS];
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

/* String bytes a cached request has room for (lrun.ffi_free). */
#define FREQ_CACHED_STRBYTES 256
/* Requests a VM keeps. */
#define FREQ_CACHE_MAX 256

static int arg_error(lua_State *L, const ffn *f, int i, const char *msg) {
  return luaL_error(L, "bad argument #%d to '%s' (%s)", i, f->d.name, msg);
}

static int arg_type_error(lua_State *L, const ffn *f, int i, int idx,
                          const char *want) {
  const char *got = luaL_typename(L, idx);
  if (to_buf(L, idx)) got = "ums.ffi.buffer";
  else if (to_ptr(L, idx)) got = "ums.ffi.pointer";
  lua_pushfstring(L, "%s expected, got %s", want, got);
  return arg_error(L, f, i, lua_tostring(L, -1));
}

/* Lua value at idx -> an integer of kind k, range-checked. */
static void conv_int(lua_State *L, const ffn *f, int i, int idx, int k,
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
  switch (k) {
    case K_I8: lo = INT8_MIN; hi = INT8_MAX; break;
    case K_U8: lo = 0; hi = UINT8_MAX; break;
    case K_I16: lo = INT16_MIN; hi = INT16_MAX; break;
    case K_U16: lo = 0; hi = UINT16_MAX; break;
    case K_I32: lo = INT32_MIN; hi = INT32_MAX; break;
    case K_U32: lo = 0; hi = UINT32_MAX; break;
    case K_I64: lo = INT64_MIN; hi = INT64_MAX; break;
    default: lo = 0; hi = INT64_MAX; break; /* K_U64 */
  }
  if (n < lo || n > hi) {
    lua_pushfstring(L, "number %I out of range for %s", n, kind_names[k]);
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
static void conv_ptr(lua_State *L, const ffn *f, int i, int idx, int k,
                     margs *a) {
  cval *v = &a->vals[i - 1];
  lbuf *b;
  lptr *p;
  if (lua_isnil(L, idx)) {
    v->p = NULL;
  } else if ((b = to_buf(L, idx)) != NULL) {
    v->p = ums_buf_data(b->b);
    a->bufs[i - 1] = b->b;
  } else if ((p = to_ptr(L, idx)) != NULL) {
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
                   k == K_PTR ? "ums.ffi.buffer, ums.ffi.pointer or nil"
                              : "string, ums.ffi.buffer, ums.ffi.pointer or "
                                "nil");
  }
}

/* Converts the Lua arguments at first.. into a. */
static void marshal(lua_State *L, const ffn *f, int first, margs *a) {
  int given = lua_gettop(L) - first + 1;
  const fdecl *d = &f->d;
  if (given < d->nargs || (!d->variadic && given > d->nargs))
    luaL_error(L, "wrong number of arguments to '%s' (%d%s expected, got %d)",
               d->name, d->nargs, d->variadic ? " or more" : "", given);
  if (given > MAXARGS)
    luaL_error(L, "too many arguments to '%s' (at most %d)", d->name,
               MAXARGS);
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
      else if (t == LUA_TSTRING || t == LUA_TNIL || to_buf(L, idx) ||
               to_ptr(L, idx))
        k = K_CPTR;
      else {
        arg_type_error(L, f, i, idx,
                       "number, boolean, string, buffer, pointer or nil");
        return;
      }
    }
    a->types[i - 1] = kind_ffi(k);
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
        conv_ptr(L, f, i, idx, k, a);
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

/* Frees a heap request: ums_preempt's release callback (on a pool thread,
** once a detached call has returned), or the caller after the results. */
static void freq_free(void *arg) {
  freq *r = arg;
  for (int i = 0; i < r->a.n; i++)
    if (r->a.bufs[i]) ums_buf_release(r->a.bufs[i]);
  fn_unref(r->f);
  /* Back to its VM's cache only on that VM's own thread (a pool thread
  ** frees a detached call's request). */
  lrun *c = r->cache;
  ltask *t = lums_cur_task;
  if (c && t && t->run == c && c->nffi_free < FREQ_CACHE_MAX) {
    if (c->nffi_free == c->capffi_free) {
      int cap = c->capffi_free ? 2 * c->capffi_free : 16;
      void **v = realloc(c->ffi_free, (size_t)cap * sizeof *v);
      if (!v) {
        free(r);
        return;
      }
      c->ffi_free = v;
      c->capffi_free = cap;
    }
    c->ffi_free[c->nffi_free++] = r;
    return;
  }
  free(r);
}

/* Points the request's argument array at its values; prepares a variadic
** call's cif. Returns false when libffi refuses the signature. */
static bool freq_prepare(freq *r) {
  for (int i = 0; i < r->a.n; i++) r->avalues[i] = &r->a.vals[i];
  if (!r->f->d.variadic) {
    r->cif = &r->f->cif;
    return true;
  }
  r->cif = &r->vcif;
  return ffi_prep_cif_var(&r->vcif, FFI_DEFAULT_ABI,
                          (unsigned)r->f->d.nargs, (unsigned)r->a.n,
                          kind_ffi(r->f->d.ret), r->a.types) == FFI_OK;
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
  if (r->a.n == 0 && !r->f->d.variadic)
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
  if (c->heap) {
    freq *r = c->req;
    f = r->f;
    cif = r->cif;
    avalues = r->avalues;
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
  if (c->heap)
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
    fn_unref(req);
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
  size_t n = (sizeof(freq) + strbytes + CACHELINE - 1) &
             ~(size_t)(CACHELINE - 1);
  return aligned_alloc(CACHELINE, n);
}

/* A heap request owning copies of everything the call touches. */
static freq *freq_copy(lua_State *L, ffn *f, const margs *a, lrun *run) {
  size_t strbytes = 0;
  for (int i = 0; i < a->n; i++)
    if (a->strs[i]) strbytes += a->slens[i] + 1;
  freq *r;
  lrun *cache = NULL;
  if (strbytes <= FREQ_CACHED_STRBYTES) {
    cache = run;
    r = run->nffi_free ? run->ffi_free[--run->nffi_free]
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
  /* The arguments only: the arrays are sized for MAXARGS. */
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
    if (a->strs[i]) {
      memcpy(s, a->strs[i], a->slens[i] + 1);
      r->a.vals[i].p = s;
      r->a.strs[i] = s;
      s += a->slens[i] + 1;
    }
    if (a->bufs[i]) ums_buf_retain(a->bufs[i]);
  }
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
  if (t && t->run)
    t->ffi_errno = err;
  else
    host_errno = err;
}

static int push_result(lua_State *L, const ffn *f, const rval *r,
                       bool void_true) {
  switch (f->d.ret) {
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
    default: push_ptr(L, r->p); break;
  }
  return 1;
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
    /* The upvalue holds f for push_result. */
    fcall_release(res.req, res.heap);
    return push_result(L, f, &res.ret, !lua_isnone(L, lua_upvalueindex(2)));
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
  marshal(L, f, 1, &a);
  ltask *t = lums_cur_task;
  if (!t || !t->run || f->d.inlined) {
    /* Directly, on this thread: the Lua values outlive the call, so the
    ** request lives on this stack and points into them. */
    freq r;
    r.f = f;
    r.a = a;
    r.heap = false;
    r.cache = NULL;
    if (!freq_prepare(&r))
      return luaL_error(L, "%s: libffi cannot prepare this call",
                        f->d.name);
    freq_run(&r);
    save_errno(r.err);
    return push_result(L, f, &r.ret, timed);
  }
  int64_t deadline = UMS_FOREVER;
  if (timed) {
    lua_Number s = lua_tonumber(L, lua_upvalueindex(2));
    if (s <= 1e9) deadline = ums_deadline((int64_t)(s * 1e9));
  }
  /* The request: the bound function for a call without arguments,
  ** else a heap copy of them. */
  bool heap = a.n > 0 || f->d.variadic;
  void *req;
  if (heap) {
    freq *r = freq_copy(L, f, &a, t->run);
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
                                     (lua_KContext)call, call_k);
}

static int fbox_gc(lua_State *L) {
  fbox *b = (fbox *)lua_touserdata(L, 1);
  if (b->f) {
    fn_unref(b->f);
    b->f = NULL;
  }
  return 0;
}

/* Pushes the Lua function for f (taking over the caller's reference). */
static void push_function(lua_State *L, ffn *f) {
  fbox *b = (fbox *)lua_newuserdatauv(L, sizeof *b, 0);
  b->f = f;
  luaL_setmetatable(L, FN_MT);
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
  lua_pushinteger(L, t && t->run ? t->ffi_errno : host_errno);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* cdef and namespaces                                                     */
/* ---------------------------------------------------------------------- */

/* ffi.cdef(decls [, {inline = true}]) */
static int l_cdef(lua_State *L) {
  const char *src = luaL_checkstring(L, 1);
  bool inlined = false;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "inline");
    inlined = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lexer x = {.L = L, .src = src, .p = src};
  next(&x);
  /* Parse everything first: a malformed declaration declares nothing. */
  int n = 0;
  lua_newtable(L);
  int pending = lua_gettop(L);
  while (!x.eof) {
    if (is(&x, ";")) {
      next(&x);
      continue;
    }
    fdecl *d = (fdecl *)lua_newuserdatauv(L, sizeof *d, 0);
    parse_decl(&x, d, inlined);
    lua_setfield(L, pending, d->name);
    n++;
  }
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
  ffn *f = aligned_alloc(CACHELINE, sizeof *f); /* a multiple of it */
  if (!f) return luaL_error(L, "ums.ffi: out of memory");
  memset(f, 0, sizeof *f);
  atomic_store(&f->refs, 1);
  f->d = *d;
  f->addr = addr;
  for (int i = 0; i < d->nargs; i++) f->atypes[i] = kind_ffi(d->args[i]);
  if (!d->variadic &&
      ffi_prep_cif(&f->cif, FFI_DEFAULT_ABI, (unsigned)d->nargs,
                   kind_ffi(d->ret), f->atypes) != FFI_OK) {
    free(f);
    return luaL_error(L, "ums.ffi: libffi cannot prepare '%s'", name);
  }
  if (ns->lib) {
    atomic_fetch_add(&ns->lib->refs, 1);
    f->lib = ns->lib;
  }
  push_function(L, f);
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
  lib_unref(ns->lib);
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
  if (!t || !t->run) {
    /* Outside a task: the main thread's stack, and nothing to stall. */
    load_run(r);
    return load_done(L, r);
  }
  return lums_preempt_start(L, t, "ums.ffi.load", load_run, r, load_release,
                            UMS_FOREVER, &r->call, (lua_KContext)r, load_k);
}

void lums_open_ffi(lua_State *L) {
  install_fatal_handlers();
  static const luaL_Reg funcs[] = {
      {"cdef", l_cdef},     {"load", l_load},     {"buffer", l_buffer},
      {"string", l_string}, {"errno", l_errno},   {"timeout", l_timeout},
      {NULL, NULL}};
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
  if (luaL_newmetatable(L, BUF_MT)) {
    lua_pushcfunction(L, buf_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, buf_len);
    lua_setfield(L, -2, "__len");
    lua_pushcfunction(L, buf_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, PTR_MT)) {
    lua_pushcfunction(L, ptr_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushcfunction(L, ptr_eq);
    lua_setfield(L, -2, "__eq");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, FN_MT)) {
    lua_pushcfunction(L, fbox_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  if (lua_getfield(L, LUA_REGISTRYINDEX, DECLS_KEY) != LUA_TTABLE) {
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, DECLS_KEY);
  }
  lua_pop(L, 1);

  luaL_newlib(L, funcs);
  if (lua_getfield(L, LUA_REGISTRYINDEX, C_KEY) != LUA_TUSERDATA) {
    lua_pop(L, 1);
    push_namespace(L, NULL);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, C_KEY);
  }
  lua_setfield(L, -2, "C");
  lua_setfield(L, -2, "ffi");
}
