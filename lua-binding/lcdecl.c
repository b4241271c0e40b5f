/*
** lcdecl.c: ums.ffi's C types and declaration parser. ffi.cdef takes what
** a C header holds, as the preprocessor gives it: function prototypes,
** typedefs, struct, union and enum declarations (named, nested,
** anonymous members, arrays, pointers to pointers, function pointers with
** their signatures, for callbacks) and extern variables (accepted, not
** bound), with the
** header noise that does not change layout (const, volatile, restrict,
** __extension__, __attribute__, __asm__ names). Layout is C's for this
** ABI: each field at the next multiple of its alignment, a struct's size a
** multiple of its largest alignment. Not supported: bit fields, long
** double, packed or aligned attributes' effect, unions by value in calls.
** ffi.typeof, sizeof, alignof and offsetof live here too.
**
** Threads: the Lua thread of the VM whose types these are.
*/
#define _GNU_SOURCE
#include "lcdecl.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

const char *const lffi_kind_names[] = {
    "void", "bool", "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t",
    "uint32_t", "int64_t", "uint64_t", "float", "double", "pointer",
    "const pointer", "const char *", "struct"};

/* The integer kind of a C type of `size` bytes. */
static int int_kind(size_t size, bool is_unsigned) {
  switch (size) {
    case 1: return is_unsigned ? K_U8 : K_I8;
    case 2: return is_unsigned ? K_U16 : K_I16;
    case 4: return is_unsigned ? K_U32 : K_I32;
    default: return is_unsigned ? K_U64 : K_I64;
  }
}

typedef struct lexer {
  lua_State *L;
  const char *src, *p;
  char tok[LFFI_NAME_MAX + 1];  /* identifier, string literal's contents,
                                  or punctuation: "(", "..." */
  bool ident;
  bool str;                    /* tok is a string literal's contents */
  bool num;                    /* tok is an integer constant: numval */
  bool eof;
  lua_Integer numval;
  int ptypes, pconsts;         /* stack indices of the types and constants
                                  this cdef declares (0: none) */
  int arg;                     /* a type name given as argument arg of a
                                  Lua call: errors name it; 0: a cdef */
  int in_sig;                  /* inside a function pointer's parameters:
                                  what a callback cannot take marks the
                                  signature unusable instead of raising */
  bool sig_bad;
} lexer;

static int parse_error(lexer *x, const char *what) {
  if (x->arg)
    return luaL_argerror(x->L, x->arg,
                         lua_pushfstring(x->L, "%s near '%s' in '%s'", what,
                                         x->eof ? "<eof>" : x->tok, x->src));
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
  x->num = false;
  x->eof = false;
  const char *p = x->p;
  if (*p == '"') {
    size_t n = strcspn(p + 1, "\"\n");
    if (p[1 + n] != '"' || n > LFFI_NAME_MAX) {
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
    if (n > LFFI_NAME_MAX) {
      snprintf(x->tok, sizeof x->tok, "%.20s...", p);
      parse_error(x, "name too long");
    }
    memcpy(x->tok, p, n);
    x->tok[n] = 0;
    x->ident = true;
    x->p = p + n;
    return;
  }
  if (isdigit((unsigned char)*p)) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 0);
    size_t n = (size_t)(end - p);
    while (end[0] == 'u' || end[0] == 'U' || end[0] == 'l' || end[0] == 'L')
      end++;
    snprintf(x->tok, sizeof x->tok, "%.*s", (int)(n > 40 ? 40 : n), p);
    if (errno || v > (unsigned long long)LUA_MAXINTEGER ||
        isalnum((unsigned char)*end) || *end == '_' || *end == '.')
      parse_error(x, "bad integer constant");
    x->num = true;
    x->numval = (lua_Integer)v;
    x->p = end;
    return;
  }
  if ((p[0] == '<' && p[1] == '<') || (p[0] == '>' && p[1] == '>')) {
    x->tok[0] = p[0];
    x->tok[1] = p[1];
    x->tok[2] = 0;
    x->p = p + 2;
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

/* Skips __attribute__((...)). One that changes layout is refused: the
** layout computed without it would be silently wrong. */
static bool skip_attribute(lexer *x) {
  if (!x->ident || (!is(x, "__attribute__") && !is(x, "__attribute")))
    return false;
  next(x);
  if (!is(x, "(")) parse_error(x, "'(' expected");
  int depth = 0;
  do {
    if (x->eof) parse_error(x, "unbalanced parentheses");
    if (is(x, "(")) depth++;
    if (is(x, ")")) depth--;
    if (x->ident && (is(x, "packed") || is(x, "__packed__") ||
                     is(x, "aligned") || is(x, "__aligned__")))
      parse_error(x, "attribute changes layout: not supported");
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
/* ---------------------------------------------------------------------- */
/* Types                                                                   */
/* ---------------------------------------------------------------------- */

/* Every ctype is a full userdata anchored in the registry for the VM's
** life (ANCHOR_KEY maps its address to it), so ctypes point at each other
** with plain pointers. TYPES_KEY maps a type's name ("int32_t",
** "struct timespec", a typedef name) to its ctype, CONSTS_KEY an enum
** constant's name to its value. */
#define ANCHOR_KEY "ums.ffi.anchor"
#define TYPES_KEY "ums.ffi.types"
#define CONSTS_KEY "ums.ffi.consts"
/* Type names given to typeof, sizeof, new... and variable-length array
** sizes, with their ctypes: a name is parsed once, so a loop calling
** ffi.new("T *[1]") makes its types once. */
#define NAMES_KEY "ums.ffi.typenames"
/* Most fields of one struct or union. */
#define MAXFIELDS 256

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Names a type; a name too long for messages is cut short. */
static void set_name(ctype *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->name, sizeof t->name, fmt, ap);
  va_end(ap);
}

/* Anchors the userdata at the top for the VM's life and pops it. */
static void anchor(lua_State *L, const void *p) {
  lua_getfield(L, LUA_REGISTRYINDEX, ANCHOR_KEY);
  lua_pushvalue(L, -2);
  lua_rawsetp(L, -2, p);
  lua_pop(L, 2);
}

/* A new ctype, anchored, zeroed. */
static ctype *ctype_new(lua_State *L, int tag) {
  ctype *t = (ctype *)lua_newuserdatauv(L, sizeof *t, 0);
  memset(t, 0, sizeof *t);
  t->tag = tag;
  luaL_setmetatable(L, LFFI_CTYPE_MT);
  anchor(L, t);
  return t;
}

void lffi_push_ctype(lua_State *L, const ctype *t) {
  lua_getfield(L, LUA_REGISTRYINDEX, ANCHOR_KEY);
  lua_rawgetp(L, -1, t);
  lua_remove(L, -2);
}

/* The ctype of a kind of value (K_I8..K_DOUBLE, K_VOID, K_BOOL). */
static const ctype *prim_type(lua_State *L, int kind) {
  const char *name = lffi_kind_names[kind];
  lua_getfield(L, LUA_REGISTRYINDEX, TYPES_KEY);
  ctype *t;
  if (lua_getfield(L, -1, name) == LUA_TUSERDATA) {
    t = (ctype *)lua_touserdata(L, -1);
    lua_pop(L, 2);
    return t;
  }
  lua_pop(L, 1);
  t = ctype_new(L, CT_PRIM);
  t->kind = kind;
  static const unsigned char sizes[] = {0, 1, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8};
  t->size = sizes[kind];
  t->align = kind == K_VOID ? 1 : t->size;
  t->complete = kind != K_VOID;
  set_name(t, "%s", name);
  lffi_push_ctype(L, t);
  lua_setfield(L, -2, name);
  lua_pop(L, 1);
  return t;
}

/* The pointer type to target (NULL: void *). */
static const ctype *ptr_type(lua_State *L, const ctype *target,
                             bool to_const) {
  ctype *t = ctype_new(L, CT_PTR);
  t->elem = target;
  t->to_const = to_const;
  t->size = t->align = sizeof(void *);
  t->complete = true;
  set_name(t, "%s%s *", to_const ? "const " : "",
           target ? target->name : "void");
  return t;
}

static const ctype *array_type(lua_State *L, const ctype *elem, size_t n,
                               bool vla) {
  ctype *t = ctype_new(L, CT_ARRAY);
  t->elem = elem;
  t->count = n;
  t->vla = vla;
  t->size = elem->size * n;
  t->align = elem->align;
  t->complete = !vla;
  if (vla)
    set_name(t, "%s[?]", elem->name);
  else
    set_name(t, "%s[%zu]", elem->name, n);
  return t;
}

/* The ctype cached under the key at the top (popped), or NULL. */
static const ctype *cached(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, NAMES_KEY);
  lua_pushvalue(L, -2);
  const ctype *t = lua_rawget(L, -2) == LUA_TUSERDATA ? lua_touserdata(L, -1)
                                                      : NULL;
  lua_pop(L, 3);
  return t;
}

/* Caches t under the key at the top (popped). */
static void cache(lua_State *L, const ctype *t) {
  lua_getfield(L, LUA_REGISTRYINDEX, NAMES_KEY);
  lua_insert(L, -2);
  lffi_push_ctype(L, t);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

const ctype *lffi_array_of(lua_State *L, const ctype *elem, size_t n) {
  lua_pushfstring(L, "%p[%I]", (const void *)elem, (lua_Integer)n);
  const ctype *t = cached(L);
  if (t) return t;
  t = array_type(L, elem, n, false);
  lua_pushfstring(L, "%p[%I]", (const void *)elem, (lua_Integer)n);
  cache(L, t);
  return t;
}

/* ---------------------------------------------------------------------- */
/* The parser                                                              */
/* ---------------------------------------------------------------------- */

/* Looks a type name up among this cdef's new types, then the VM's. */
static const ctype *find_type(lexer *x, const char *name) {
  lua_State *L = x->L;
  const ctype *t = NULL;
  if (x->ptypes && lua_getfield(L, x->ptypes, name) == LUA_TUSERDATA)
    t = lua_touserdata(L, -1);
  if (x->ptypes) lua_pop(L, 1);
  if (t) return t;
  lua_getfield(L, LUA_REGISTRYINDEX, TYPES_KEY);
  if (lua_getfield(L, -1, name) == LUA_TUSERDATA) t = lua_touserdata(L, -1);
  lua_pop(L, 2);
  return t;
}

static void add_type(lexer *x, const char *name, const ctype *t) {
  if (!x->ptypes) parse_error(x, "undeclared type (declare it with cdef)");
  lffi_push_ctype(x->L, t);
  lua_setfield(x->L, x->ptypes, name);
}

static bool find_const(lexer *x, const char *name, lua_Integer *v) {
  lua_State *L = x->L;
  bool found = false;
  if (x->pconsts && lua_getfield(L, x->pconsts, name) == LUA_TNUMBER) {
    *v = lua_tointeger(L, -1);
    found = true;
  }
  if (x->pconsts) lua_pop(L, 1);
  if (found) return true;
  lua_getfield(L, LUA_REGISTRYINDEX, CONSTS_KEY);
  if (lua_getfield(L, -1, name) == LUA_TNUMBER) {
    *v = lua_tointeger(L, -1);
    found = true;
  }
  lua_pop(L, 2);
  return found;
}

/* Skips the header noise that changes nothing here; true if it did. */
static bool skip_noise(lexer *x) {
  if (!x->ident) return false;
  if (skip_attribute(x)) return true;
  if (is(x, "__extension__") || is(x, "restrict") || is(x, "__restrict") ||
      is(x, "__restrict__") || is(x, "volatile") || is(x, "__volatile__") ||
      is(x, "__inline") || is(x, "__inline__")) {
    next(x);
    return true;
  }
  return false;
}

static lua_Integer const_expr(lexer *x, int prec);

static lua_Integer const_primary(lexer *x) {
  lua_Integer v;
  if (x->num) {
    v = x->numval;
    next(x);
  } else if (is(x, "(")) {
    next(x);
    v = const_expr(x, 0);
    expect(x, ")");
  } else if (is(x, "-")) {
    next(x);
    v = (lua_Integer)(0u - (lua_Unsigned)const_primary(x));
  } else if (is(x, "+")) {
    next(x);
    v = const_primary(x);
  } else if (is(x, "~")) {
    next(x);
    v = ~const_primary(x);
  } else if (is(x, "!")) {
    next(x);
    v = !const_primary(x);
  } else if (x->ident && find_const(x, x->tok, &v)) {
    next(x);
  } else {
    parse_error(x, "constant expression expected");
    return 0;
  }
  return v;
}

/* Binary operators by precedence, C's, for integer constants. */
static int binop_prec(lexer *x) {
  static const struct { const char *op; int prec; } ops[] = {
      {"|", 1}, {"^", 2}, {"&", 3}, {"<<", 4}, {">>", 4}, {"+", 5},
      {"-", 5}, {"*", 6}, {"/", 6}, {"%", 6}, {NULL, 0}};
  for (int i = 0; ops[i].op; i++)
    if (is(x, ops[i].op)) return ops[i].prec;
  return 0;
}

static lua_Integer const_expr(lexer *x, int prec) {
  lua_Integer a = const_primary(x);
  for (;;) {
    int p = binop_prec(x);
    if (p == 0 || p <= prec) return a;
    char op = x->tok[0];
    next(x);
    lua_Integer b = const_expr(x, p);
    lua_Unsigned ua = (lua_Unsigned)a, ub = (lua_Unsigned)b;
    switch (op) {
      case '|': a = a | b; break;
      case '^': a = a ^ b; break;
      case '&': a = a & b; break;
      case '<':
      case '>':
        if (b < 0 || b > 63) parse_error(x, "shift out of range");
        a = op == '<' ? (lua_Integer)(ua << b) : a >> b;
        break;
      case '+': a = (lua_Integer)(ua + ub); break;
      case '-': a = (lua_Integer)(ua - ub); break;
      case '*': a = (lua_Integer)(ua * ub); break;
      default:
        if (b == 0) parse_error(x, "division by zero");
        if (a == LUA_MININTEGER && b == -1) parse_error(x, "overflow");
        a = op == '/' ? a / b : a % b;
        break;
    }
  }
}

static const ctype *parse_record(lexer *x, bool is_union);
static const ctype *parse_enum(lexer *x);
static const ctype *func_type(lexer *x, const ctype *ret, const char *name);

/* specifiers := {qualifier | specifier}+; *is_const: a const among them. */
static const ctype *parse_base(lexer *x, bool *is_const) {
  int n_signed = 0, n_unsigned = 0, n_char = 0, n_short = 0, n_int = 0,
      n_long = 0, n_float = 0, n_double = 0, n_void = 0, tdef = -1;
  const ctype *user = NULL;
  bool any = false, spec = false;
  *is_const = false;
  for (;;) {
    if (!x->ident) break;
    if (skip_noise(x)) continue;
    if (is(x, "const") || is(x, "__const")) {
      *is_const = true;
      any = true;
      next(x);
      continue;
    }
    if (!spec && (is(x, "struct") || is(x, "union"))) {
      user = parse_record(x, is(x, "union"));
      any = spec = true;
      continue;
    }
    if (!spec && is(x, "enum")) {
      user = parse_enum(x);
      any = spec = true;
      continue;
    }
    if (is(x, "signed") || is(x, "__signed__")) n_signed++;
    else if (is(x, "unsigned")) n_unsigned++;
    else if (is(x, "char")) n_char++;
    else if (is(x, "short")) n_short++;
    else if (is(x, "int")) n_int++;
    else if (is(x, "long")) n_long++;
    else if (is(x, "float")) n_float++;
    else if (is(x, "double")) n_double++;
    else if (is(x, "void")) n_void++;
    else if (!spec && (user = find_type(x, x->tok)) != NULL) {
      /* A typedef name, this cdef's or an earlier one's. */
    } else if (!spec && typedef_kind(x->tok) >= 0)
      tdef = typedef_kind(x->tok);
    else
      break; /* the declarator's name */
    any = spec = true;
    next(x);
  }
  if (!any) parse_error(x, "type expected");
  int nspec = n_char + n_short + n_int + n_float + n_double + n_void +
              (tdef >= 0) + (n_long > 0) + (user != NULL);
  if (n_signed + n_unsigned > 1 || n_char > 1 || n_short > 1 || n_int > 1 ||
      n_long > 2 || n_float > 1 || n_double > 1 || n_void > 1 ||
      (n_short && n_long) || (n_int && (n_char)))
    parse_error(x, "invalid combination of type specifiers");
  int base;
  if (user || tdef >= 0 || n_void) {
    if (nspec > 1 || n_signed || n_unsigned)
      parse_error(x, "invalid combination of type specifiers");
    if (user) return user;
    base = tdef >= 0 ? tdef : K_VOID;
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
    return NULL;
  }
  return prim_type(x->L, base);
}

/* A declarator's result: its name ("" for an abstract one) and type. */
typedef struct declarator {
  char name[LFFI_NAME_MAX + 1];
  const ctype *type;
  bool func;               /* name(...): a function, at its '(' */
  bool flex;               /* T name[]: no size */
} declarator;

/* Skips a balanced parenthesised list whose '(' is the current token. */
static void skip_parens(lexer *x) {
  int depth = 0;
  do {
    if (x->eof) parse_error(x, "unbalanced parentheses");
    if (is(x, "(")) depth++;
    if (is(x, ")")) depth--;
    next(x);
  } while (depth > 0);
}

/* declarator := {'*' {qualifier}} (name | '(' '*' name ')' '(' ... ')')
**               {'[' [expr | '?'] ']'} ['(' params ')']
** A pointer to a function points to a CT_FUNC with its signature
** (func_type); a function itself, at the top of a declaration, is left to
** the caller (d->func). */
static void parse_declarator(lexer *x, const ctype *base, bool is_const,
                             declarator *d, bool abstract) {
  lua_State *L = x->L;
  const ctype *t = base;
  bool tconst = is_const;
  memset(d, 0, sizeof *d);
  while (is(x, "*")) {
    next(x);
    t = ptr_type(L, t->tag == CT_PRIM && t->kind == K_VOID ? NULL : t,
                 tconst);
    tconst = false;
    for (;;) {
      if (x->ident && (is(x, "const") || is(x, "__const"))) {
        tconst = true;
        next(x);
      } else if (!skip_noise(x)) {
        break;
      }
    }
  }
  if (is(x, "(") && !x->str) {
    /* A function pointer: (*name) or (*) then its parameters. */
    next(x);
    if (!is(x, "*") && !is(x, "^"))
      parse_error(x, "'*' expected (a pointer to a function)");
    next(x);
    for (;;) {
      if (x->ident && (is(x, "const") || is(x, "__const")))
        next(x);
      else if (!skip_noise(x))
        break;
    }
    if (x->ident) {
      snprintf(d->name, sizeof d->name, "%s", x->tok);
      next(x);
    }
    expect(x, ")");
    if (!is(x, "(")) parse_error(x, "'(' expected (a function's parameters)");
    d->type = ptr_type(L, func_type(x, t, d->name), false);
    return;
  }
  if (x->ident && !abstract) {
    snprintf(d->name, sizeof d->name, "%s", x->tok);
    next(x);
  }
  while (skip_noise(x)) {
  }
  if (is(x, "(") && d->name[0]) {
    d->func = true;
    d->type = t;
    return;
  }
  /* Arrays: the dimensions apply from the innermost out. */
  size_t dims[8];
  bool vla = false;
  int ndims = 0;
  while (is(x, "[")) {
    next(x);
    if (ndims == 8) parse_error(x, "too many array dimensions");
    if (is(x, "]")) {
      dims[ndims++] = 0; /* T name[]: flexible, or a pointer parameter */
    } else if (is(x, "?")) {
      if (ndims != 0) parse_error(x, "only the first dimension can be '?'");
      vla = true;
      dims[ndims++] = 0;
      next(x);
    } else {
      lua_Integer n = const_expr(x, 0);
      if (n < 0 || n > (lua_Integer)1 << 40)
        parse_error(x, "array size out of range");
      dims[ndims++] = (size_t)n;
    }
    expect(x, "]");
  }
  for (int i = ndims - 1; i >= 0; i--) {
    if (!t->complete) parse_error(x, "array of an incomplete type");
    if (t->size && dims[i] > ((size_t)1 << 40) / t->size)
      parse_error(x, "array too large");
    t = array_type(L, t, dims[i], i == 0 && vla);
  }
  d->type = t;
  d->flex = ndims > 0 && dims[0] == 0 && !vla;
}

/* struct-or-union [name] ['{' {field-declaration} '}']: the current token
** is 'struct' or 'union'. */
static const ctype *parse_record(lexer *x, bool is_union) {
  lua_State *L = x->L;
  next(x);
  while (skip_noise(x)) {
  }
  char key[LFFI_NAME_MAX + 8] = "";
  if (x->ident) {
    snprintf(key, sizeof key, "%s %s", is_union ? "union" : "struct", x->tok);
    next(x);
  }
  ctype *t = key[0] ? (ctype *)find_type(x, key) : NULL;
  if (key[0]) {
    /* Tags share one name space: struct X and union X cannot both be. */
    char other[sizeof key];
    snprintf(other, sizeof other, "%s%s", is_union ? "struct" : "union",
             strchr(key, ' '));
    if (find_type(x, other))
      parse_error(x, "declared as a different kind of tag");
  }
  if (!is(x, "{")) {
    if (!key[0]) parse_error(x, "struct or union name or '{' expected");
    if (!t) { /* A forward declaration: incomplete until defined. */
      t = ctype_new(L, is_union ? CT_UNION : CT_STRUCT);
      set_name(t, "%s", key);
      t->align = 1;
      add_type(x, key, t);
    }
    return t;
  }
  if (t && t->complete) parse_error(x, "redefinition of a struct or union");
  next(x);
  cfield *fs = (cfield *)lua_newuserdatauv(L, MAXFIELDS * sizeof *fs, 0);
  int scratch = lua_gettop(L);
  int n = 0;
  size_t size = 0, align = 1;
  while (!is(x, "}")) {
    if (x->eof) parse_error(x, "'}' expected");
    bool c;
    const ctype *base = parse_base(x, &c);
    if (is(x, ";")) {
      /* An anonymous struct or union member: its fields are ours. */
      if (base->tag != CT_STRUCT && base->tag != CT_UNION)
        parse_error(x, "field name expected");
      size_t off = is_union ? 0 : align_up(size, base->align);
      for (int i = 0; i < base->nfields; i++) {
        if (n == MAXFIELDS) parse_error(x, "too many fields");
        fs[n] = base->fields[i];
        fs[n++].offset += off;
      }
      size = is_union ? (base->size > size ? base->size : size)
                      : off + base->size;
      if (base->align > align) align = base->align;
      next(x);
      continue;
    }
    for (;;) {
      declarator d;
      parse_declarator(x, base, c, &d, false);
      if (d.func) parse_error(x, "a field cannot be a function");
      if (!d.name[0]) parse_error(x, "field name expected");
      if (is(x, ":")) parse_error(x, "bit fields are not supported");
      const ctype *ft = d.type;
      if (!ft->complete && !d.flex)
        parse_error(x, "field of an incomplete type");
      if (n == MAXFIELDS) parse_error(x, "too many fields");
      for (int i = 0; i < n; i++)
        if (strcmp(fs[i].name, d.name) == 0)
          parse_error(x, "duplicate field");
      size_t off = is_union ? 0 : align_up(size, ft->align);
      snprintf(fs[n].name, sizeof fs[n].name, "%s", d.name);
      fs[n].type = ft;
      fs[n].offset = off;
      n++;
      if (is_union) {
        if (ft->size > size) size = ft->size;
      } else {
        size = off + ft->size;
      }
      if (ft->align > align) align = ft->align;
      while (skip_noise(x)) {
      }
      if (!is(x, ",")) break;
      next(x);
    }
    expect(x, ";");
  }
  next(x);
  while (skip_noise(x)) {
  }
  /* A self-reference inside the body declared the tag forward: the
  ** definition completes that ctype in place, so pointers made to it
  ** before see the fields. */
  ctype *r = key[0] ? (ctype *)find_type(x, key) : NULL;
  if (!r) {
    r = ctype_new(L, is_union ? CT_UNION : CT_STRUCT);
    set_name(r, "%s",
             key[0] ? key
                    : is_union ? "union <anonymous>" : "struct <anonymous>");
    if (key[0]) add_type(x, key, r);
  }
  cfield *keep = NULL;
  if (n) {
    keep = (cfield *)lua_newuserdatauv(L, (size_t)n * sizeof *fs, 0);
    memcpy(keep, fs, (size_t)n * sizeof *fs);
    anchor(L, keep);
  }
  lua_remove(L, scratch);
  r->fields = keep;
  r->nfields = n;
  r->align = align;
  r->size = align_up(size, align);
  r->complete = true;
  return r;
}

/* enum [name] ['{' name ['=' expr] {',' ...} '}'] */
static const ctype *parse_enum(lexer *x) {
  lua_State *L = x->L;
  next(x);
  while (skip_noise(x)) {
  }
  char key[LFFI_NAME_MAX + 8] = "";
  if (x->ident) {
    snprintf(key, sizeof key, "enum %s", x->tok);
    next(x);
  }
  const ctype *old = key[0] ? find_type(x, key) : NULL;
  if (!is(x, "{")) {
    if (!key[0]) parse_error(x, "enum name or '{' expected");
    if (old) return old;
  } else {
    if (old) parse_error(x, "redefinition of an enum");
    next(x);
    lua_Integer v = 0;
    while (!is(x, "}")) {
      if (!x->ident) parse_error(x, "enumerator name expected");
      char name[LFFI_NAME_MAX + 1];
      snprintf(name, sizeof name, "%s", x->tok);
      lua_Integer dummy;
      if (find_const(x, name, &dummy))
        parse_error(x, "redefinition of a constant");
      next(x);
      while (skip_noise(x)) {
      }
      if (is(x, "=")) {
        next(x);
        v = const_expr(x, 0);
      }
      if (v < INT32_MIN || v > UINT32_MAX)
        parse_error(x, "enumerator value out of range for int");
      if (!x->pconsts)
        parse_error(x, "enum body in a type name (declare it with cdef)");
      lua_pushinteger(L, v);
      lua_setfield(L, x->pconsts, name);
      v++;
      if (!is(x, ",")) break;
      next(x);
    }
    expect(x, "}");
  }
  while (skip_noise(x)) {
  }
  ctype *t = ctype_new(L, CT_ENUM);
  t->kind = K_I32;
  t->size = t->align = 4;
  t->complete = true;
  set_name(t, "%s", key[0] ? key : "enum <anonymous>");
  if (key[0]) add_type(x, key, t);
  return t;
}

/* Most scalar members (array elements counted one by one) of a struct
** passed by value: libffi describes it member by member. */
#define BYVAL_MAXLEAVES 4096

/* The scalar members t stands for in libffi's element list. */
static size_t leaf_count(const ctype *t) {
  size_t n = 1;
  while (t->tag == CT_ARRAY) {
    n *= t->count;
    t = t->elem;
  }
  return n;
}

/* Why a struct cannot be passed by value, or NULL. libffi lays a struct
** out from its element list alone, so the list must give C's layout: each
** member right after the one before, at its own alignment. Anonymous
** members (flattened into their parent by the parser) and unions break
** that, and are refused rather than passed with a wrong layout. */
static const char *byval_problem(const ctype *t, size_t *leaves) {
  if (t->tag == CT_UNION) return "union passed by value is not supported";
  if (!t->complete) return "struct passed by value is incomplete";
  if (t->size == 0) return "empty struct passed by value";
  size_t pos = 0;
  for (int i = 0; i < t->nfields; i++) {
    const cfield *f = &t->fields[i];
    const ctype *base = f->type;
    while (base->tag == CT_ARRAY) base = base->elem;
    if (base->tag == CT_STRUCT || base->tag == CT_UNION) {
      const char *why = byval_problem(base, leaves);
      if (why) return why;
    }
    if (f->offset != align_up(pos, f->type->align))
      return "struct with anonymous or overlapping members passed by "
             "value is not supported (pass a pointer)";
    pos = f->offset + f->type->size;
    *leaves += leaf_count(f->type);
    if (*leaves > BYVAL_MAXLEAVES)
      return "struct passed by value has too many members";
  }
  return NULL;
}

/* The kind a parameter or result of type t passes as; *st is the struct's
** type for K_STRUCT. */
static int param_kind(lexer *x, const ctype *t, const ctype **st) {
  *st = NULL;
  switch (t->tag) {
    case CT_PRIM: return t->kind;
    case CT_ENUM: return t->kind;
    case CT_ARRAY: return K_PTR; /* T name[N] is a pointer */
    case CT_PTR: {
      const ctype *e = t->elem;
      if (t->to_const && e && e->tag == CT_PRIM &&
          (e->kind == K_I8 || e->kind == K_U8))
        return K_CSTR;
      return t->to_const ? K_CPTR : K_PTR;
    }
    case CT_STRUCT:
    case CT_UNION: {
      if (x->in_sig) { /* a callback does not take structs by value */
        x->sig_bad = true;
        return K_PTR;
      }
      size_t leaves = 0;
      const char *why = byval_problem(t, &leaves);
      if (why) parse_error(x, why);
      *st = t;
      return K_STRUCT;
    }
    default:
      if (x->in_sig) {
        x->sig_bad = true;
        return K_PTR;
      }
      parse_error(x, "a function passed by value (pass a pointer)");
      return K_VOID;
  }
}

/* A function's parameters, the current token being its '('. */
static void parse_params(lexer *x, fdecl *d) {
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
      if (d->nargs == LFFI_MAXARGS) parse_error(x, "too many arguments");
      bool c;
      const ctype *base = parse_base(x, &c);
      declarator pd;
      parse_declarator(x, base, c, &pd, false);
      const ctype *st = NULL;
      /* A parameter of function type is a pointer to it, as in C. */
      if (pd.func) pd.type = ptr_type(x->L, func_type(x, pd.type, pd.name),
                                      false);
      int k = param_kind(x, pd.type, &st);
      if (k == K_VOID) parse_error(x, "argument of type void");
      d->argt[d->nargs] = k == K_PTR && lffi_fnptr_sig(pd.type) ? pd.type
                                                                 : st;
      d->args[d->nargs++] = k;
      if (!is(x, ",")) break;
      next(x);
    }
  }
  expect(x, ")");
}

/* A function type, the current token being its parameters' '(': ret is
** its result type, name the declarator's (for messages). Its signature is
** kept when a Lua callback can stand for the function. */
static const ctype *func_type(lexer *x, const ctype *ret, const char *name) {
  lua_State *L = x->L;
  ctype *f = ctype_new(L, CT_FUNC);
  f->align = 1;
  set_name(f, "%s()", ret->name);
  fdecl *d = (fdecl *)lua_newuserdatauv(L, sizeof *d, 0);
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name[0] ? name : "callback");
  anchor(L, d);
  bool outer_bad = x->sig_bad;
  x->sig_bad = false;
  x->in_sig++;
  if (ret->tag == CT_PRIM && ret->kind == K_VOID)
    d->ret = K_VOID;
  else
    d->ret = param_kind(x, ret, &d->rett);
  parse_params(x, d);
  x->in_sig--;
  if (!x->sig_bad && !d->variadic) f->sig = d;
  x->sig_bad = outer_bad;
  return f;
}

/* One declaration, up to and including its ';': a function prototype, a
** typedef, or a struct, union or enum declaration. Pushes an fdecl into
** the pending table for a function. */
static void parse_decl(lexer *x, int pending, bool inlined,
                       bool interruptible) {
  lua_State *L = x->L;
  bool is_typedef = false, is_extern = false, fn_inlined = inlined,
       fn_intr = interruptible;
  for (;;) {
    if (x->ident && (is(x, "UMS_INLINE"))) {
      fn_inlined = true;
      next(x);
    } else if (x->ident && (is(x, "UMS_INTERRUPTIBLE"))) {
      fn_intr = true;
      next(x);
    } else if (x->ident && is(x, "typedef")) {
      is_typedef = true;
      next(x);
    } else if (x->ident && is(x, "extern")) {
      is_extern = true;
      next(x);
    } else if (x->ident && (is(x, "static") || is(x, "inline"))) {
      next(x);
    } else if (!skip_noise(x)) {
      break;
    }
  }
  bool c;
  const ctype *base = parse_base(x, &c);
  if (is(x, ";")) {
    if (base->tag == CT_PRIM)
      parse_error(x, "declaration declares nothing");
    next(x);
    return;
  }
  for (;;) {
    declarator dd;
    parse_declarator(x, base, c, &dd, false);
    if (!dd.name[0]) parse_error(x, "name expected");
    if (is_typedef) {
      const ctype *t = dd.type;
      if (dd.func) {
        /* A function type, usable behind a pointer. */
        ctype *f = (ctype *)func_type(x, dd.type, dd.name);
        set_name(f, "%s", dd.name);
        t = f;
      }
      add_type(x, dd.name, t);
    } else if (!dd.func && is_extern) {
      /* A variable from a pasted header: accepted, not bound. */
      while (skip_noise(x)) {
      }
    } else {
      if (!dd.func)
        parse_error(x, "'(' expected (only functions, types and "
                       "constants can be declared)");
      fdecl *d = (fdecl *)lua_newuserdatauv(L, sizeof *d, 0);
      memset(d, 0, sizeof *d);
      d->inlined = fn_inlined;
      d->interruptible = fn_intr;
      if (fn_inlined && fn_intr)
        parse_error(x, "an inline call cannot be interruptible (it runs on "
                       "the scheduler)");
      snprintf(d->name, sizeof d->name, "%s", dd.name);
      if (dd.type->tag == CT_PRIM && dd.type->kind == K_VOID)
        d->ret = K_VOID;
      else
        d->ret = param_kind(x, dd.type, &d->rett);
      parse_params(x, d);
      strcpy(d->sym, d->name);
      for (;;) {
        if (skip_noise(x)) continue;
        if (x->ident &&
            (is(x, "__asm__") || is(x, "__asm") || is(x, "asm"))) {
          /* A symbol name different from the declared one (as in
          ** LuaJIT). */
          next(x);
          expect(x, "(");
          if (!x->str || !x->tok[0]) parse_error(x, "symbol name expected");
          strcpy(d->sym, x->tok);
          next(x);
          expect(x, ")");
          continue;
        }
        if (x->ident && (is(x, "__THROW") || is(x, "__wur") ||
                         is(x, "__nonnull"))) {
          next(x);
          if (is(x, "(")) skip_parens(x);
          continue;
        }
        break;
      }
      lua_setfield(L, pending, d->name);
    }
    if (!is(x, ",")) break;
    next(x);
  }
  expect(x, ";");
}

void lffi_parse(lua_State *L, const char *src, bool inlined,
                bool interruptible) {
  lexer x = {.L = L, .src = src, .p = src};
  lua_newtable(L); /* the new functions */
  int pending = lua_gettop(L);
  lua_newtable(L);
  x.ptypes = lua_gettop(L);
  lua_newtable(L);
  x.pconsts = lua_gettop(L);
  next(&x);
  while (!x.eof) {
    if (is(&x, ";")) {
      next(&x);
      continue;
    }
    parse_decl(&x, pending, inlined, interruptible);
  }
  /* Everything parsed: the types and constants become the VM's. */
  static const char *const keys[] = {TYPES_KEY, CONSTS_KEY};
  for (int i = 0; i < 2; i++) {
    lua_getfield(L, LUA_REGISTRYINDEX, keys[i]);
    lua_pushnil(L);
    while (lua_next(L, i == 0 ? x.ptypes : x.pconsts)) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, -4);
    }
    lua_pop(L, 1);
  }
  /* A new declaration may change what a cached name means (a typedef
  ** declared again): the cache starts over. */
  lua_pushnil(L);
  if (lua_next(L, x.ptypes)) {
    lua_pop(L, 2);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, NAMES_KEY);
  }
  lua_pop(L, 2);
}

const ctype *lffi_parse_type(lua_State *L, const char *src, int arg) {
  lua_pushstring(L, src);
  const ctype *t = cached(L);
  if (t) return t;
  lexer x = {.L = L, .src = src, .p = src, .arg = arg};
  next(&x);
  bool c;
  const ctype *base = parse_base(&x, &c);
  declarator d;
  parse_declarator(&x, base, c, &d, true);
  if (!x.eof || d.func) parse_error(&x, "type name expected");
  lua_pushstring(L, src);
  cache(L, d.type);
  return d.type;
}

bool lffi_const(lua_State *L, const char *name, lua_Integer *v) {
  lexer x = {.L = L};
  return find_const(&x, name, v);
}

/* ---------------------------------------------------------------------- */
/* Structs for libffi                                                      */
/* ---------------------------------------------------------------------- */

/* Sizes (mem NULL) or fills one block holding a struct's ffi_type, its
** nested structs' and their element lists. */
typedef struct ffibuild {
  char *mem;
  size_t used;
} ffibuild;

static void *ffibuild_take(ffibuild *b, size_t n) {
  void *p = b->mem ? b->mem + b->used : NULL;
  b->used += align_up(n, _Alignof(max_align_t));
  return p;
}

static ffi_type *struct_ffi(ffibuild *b, const ctype *t);

/* The ffi_type of a scalar or struct member. */
static ffi_type *leaf_ffi(ffibuild *b, const ctype *t) {
  switch (t->tag) {
    case CT_STRUCT: return struct_ffi(b, t);
    case CT_PTR: return &ffi_type_pointer;
    default: return lffi_kind_ffi(t->kind); /* CT_PRIM, CT_ENUM */
  }
}

static ffi_type *struct_ffi(ffibuild *b, const ctype *t) {
  ffi_type *ft = ffibuild_take(b, sizeof *ft);
  size_t n = 0;
  for (int i = 0; i < t->nfields; i++) n += leaf_count(t->fields[i].type);
  ffi_type **el = ffibuild_take(b, (n + 1) * sizeof *el);
  size_t k = 0;
  for (int i = 0; i < t->nfields; i++) {
    const ctype *base = t->fields[i].type;
    while (base->tag == CT_ARRAY) base = base->elem;
    /* An array is its elements one by one, all of one type. */
    ffi_type *et = leaf_ffi(b, base);
    for (size_t j = leaf_count(t->fields[i].type); j > 0; j--)
      if (el) el[k++] = et;
  }
  if (ft) {
    el[k] = NULL;
    ft->size = 0; /* libffi computes size and alignment */
    ft->alignment = 0;
    ft->type = FFI_TYPE_STRUCT;
    ft->elements = el;
  }
  return ft;
}

ffi_type *lffi_struct_ffi(const ctype *t) {
  ffibuild b = {NULL, 0};
  struct_ffi(&b, t);
  b.mem = malloc(b.used);
  if (!b.mem) return NULL;
  b.used = 0;
  return struct_ffi(&b, t);
}

/* ---------------------------------------------------------------------- */
/* ffi.typeof, sizeof, alignof, offsetof                                   */
/* ---------------------------------------------------------------------- */

const ctype *lffi_check_ctype(lua_State *L, int arg) {
  if (lua_type(L, arg) == LUA_TSTRING)
    return lffi_parse_type(L, lua_tostring(L, arg), arg);
  const ctype *t = luaL_testudata(L, arg, LFFI_CTYPE_MT);
  const ctype **cd = luaL_testudata(L, arg, LFFI_CDATA_MT);
  if (cd) return *cd;
  if (!t) luaL_typeerror(L, arg, "C type name, ctype or cdata");
  return t;
}

/* ffi.typeof(ct) -> ctype */
static int l_typeof(lua_State *L) {
  lffi_push_ctype(L, lffi_check_ctype(L, 1));
  return 1;
}

/* ffi.sizeof(ct [, nelem]) -> bytes, or nil for an incomplete type (as in
** LuaJIT); nelem sizes a variable-length array type. */
static int l_sizeof(lua_State *L) {
  const ctype *t = lffi_check_ctype(L, 1);
  if (t->tag == CT_ARRAY && t->vla) {
    lua_Integer n = luaL_checkinteger(L, 2);
    luaL_argcheck(L, n >= 0 && (t->elem->size == 0 ||
                                (lua_Unsigned)n <= LUA_MAXINTEGER /
                                                       t->elem->size),
                  2, "element count out of range");
    lua_pushinteger(L, (lua_Integer)(t->elem->size * (size_t)n));
  } else if (!t->complete) {
    lua_pushnil(L);
  } else {
    lua_pushinteger(L, (lua_Integer)t->size);
  }
  return 1;
}

/* ffi.alignof(ct) -> bytes */
static int l_alignof(lua_State *L) {
  const ctype *t = lffi_check_ctype(L, 1);
  lua_pushinteger(L, (lua_Integer)t->align);
  return 1;
}

const cfield *lffi_field(const ctype *t, const char *name) {
  if (t->tag != CT_STRUCT && t->tag != CT_UNION) return NULL;
  for (int i = 0; i < t->nfields; i++)
    if (strcmp(t->fields[i].name, name) == 0) return &t->fields[i];
  return NULL;
}

/* ffi.offsetof(ct, field) -> bytes; raises for a field the type lacks. */
static int l_offsetof(lua_State *L) {
  const ctype *t = lffi_check_ctype(L, 1);
  const char *name = luaL_checkstring(L, 2);
  if (t->tag != CT_STRUCT && t->tag != CT_UNION)
    return luaL_argerror(L, 1, lua_pushfstring(L, "'%s' is not a struct or "
                                               "union", t->name));
  if (!t->complete)
    return luaL_argerror(L, 1, lua_pushfstring(L, "'%s' is incomplete",
                                               t->name));
  const cfield *f = lffi_field(t, name);
  if (!f)
    return luaL_argerror(L, 2, lua_pushfstring(L, "'%s' has no field '%s'",
                                               t->name, name));
  lua_pushinteger(L, (lua_Integer)f->offset);
  return 1;
}

static int ctype_tostring(lua_State *L) {
  const ctype *t = luaL_checkudata(L, 1, LFFI_CTYPE_MT);
  lua_pushfstring(L, "ctype<%s>", t->name);
  return 1;
}

void lffi_open_types(lua_State *L) {
  static const char *const keys[] = {ANCHOR_KEY, TYPES_KEY, CONSTS_KEY,
                                     NAMES_KEY};
  for (int i = 0; i < 4; i++) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, keys[i]) != LUA_TTABLE) {
      lua_newtable(L);
      lua_setfield(L, LUA_REGISTRYINDEX, keys[i]);
    }
    lua_pop(L, 1);
  }
  if (luaL_newmetatable(L, LFFI_CTYPE_MT)) {
    lua_pushcfunction(L, ctype_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  static const luaL_Reg funcs[] = {
      {"typeof", l_typeof},   {"sizeof", l_sizeof}, {"alignof", l_alignof},
      {"offsetof", l_offsetof}, {NULL, NULL}};
  luaL_setfuncs(L, funcs, 0);
}
