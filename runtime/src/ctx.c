/*
** ctx.c: the C side of the hand-written context switch, shared by
** ctx-x86_64.S and ctx-aarch64.S. The assembly only moves registers and
** stack pointers; this file owns the ums__ctx_* interface and tells the
** sanitizers about every switch, so that callers need not.
**
** A context must be zeroed (or ums__ctx_destroy'ed) before its first
** ums__ctx_make or ums__ctx_init_main: a restart finds the sanitizer state
** of the previous run in the struct and must tell it from garbage.
*/

#include "ctx-san.h"

#include <stdlib.h>
#include <string.h>

/* The assembly primitives; see the .S files for the frame they use. */
void *ums__ctx_jump(void **save_sp, void *to_sp, void *pass);
void *ums__ctx_prepare(void *stack_hi, void *ctx,
                       void (*boot)(void *ctx, void *prev));

/* The smallest stack we accept: the initial frame, the boot function and
** a little room for fn's first frames. Real stacks come from stack.c and
** are at least 16 KiB. */
#define CTX_MIN_STACK 1024

/* The first code a fresh context runs, called by ctx_start. */
static void ctx_boot(void *self_, void *prev) {
  ums__ctx_t *self = self_;
  ctx_san_finish(self, prev);
  self->fn(self->arg);
  /* fn must switch away for good instead of returning: there is no
  ** frame to return to. */
  abort();
}

int ums__ctx_init_main(ums__ctx_t *ctx) {
  ctx->sp = NULL;
  ctx->uc = NULL;
  ctx->stack_lo = NULL; /* ASan fills these in the first time the */
  ctx->stack_size = 0;  /* thread's stack is left */
  ctx->asan_fake = NULL;
  ctx->fn = NULL; /* marks a main context for ctx_destroy */
  ctx->arg = NULL;
  ctx_san_init_main(ctx);
  return 0;
}

int ums__ctx_make(ums__ctx_t *ctx, void *stack_lo, size_t size,
                  void (*fn)(void *), void *arg) {
  if (!stack_lo || size < CTX_MIN_STACK || !fn) return UMS_EINVAL;

  int r = ctx_san_make(ctx, stack_lo, size);
  if (r) return r;

  ctx->uc = NULL;
  ctx->stack_lo = stack_lo;
  ctx->stack_size = size;
  ctx->fn = fn;
  ctx->arg = arg;
  /* asan_fake is kept: see ctx_boot. */
  ctx->sp = ums__ctx_prepare((char *)stack_lo + size, ctx, ctx_boot);
  return 0;
}

void ums__ctx_switch(ums__ctx_t *from, ums__ctx_t *to) {
#if UMS_ASAN || UMS_TSAN
  ctx_san_start(from, to);
  ums__ctx_t *prev = ums__ctx_jump(&from->sp, to->sp, from);
  ctx_san_finish(from, prev);
#else
  /* Without sanitizers this compiles to a tail jump. */
  ums__ctx_jump(&from->sp, to->sp, from);
#endif
}

void ums__ctx_destroy(ums__ctx_t *ctx) {
  ctx_san_destroy(ctx);
  /* Zeroing makes the struct ready for another ctx_make. */
  memset(ctx, 0, sizeof *ctx);
}

const char *ums__ctx_kind(void) {
#if defined(__x86_64__)
  return "asm-x86_64";
#elif defined(__aarch64__)
  return "asm-aarch64";
#else
#error "ctx.c is for the assembly backends; build ctx-ucontext.c instead"
#endif
}
