/*
** ctx-ucontext.c: the portable context switch, on getcontext, makecontext
** and swapcontext. It serves the architectures without a hand-written
** switch and every TSan build. swapcontext saves the signal mask with a
** system call, so a switch costs some 30 times the assembly one.
**
** A context must be zeroed (or ums__ctx_destroy'ed) before its first
** ums__ctx_make or ums__ctx_init_main: a restart reuses the ucontext_t
** and finds the sanitizer state of the previous run in the struct.
*/

#include "ctx-san.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define CTX_MIN_STACK 4096

#if UMS_ASAN
/* The context being left by the switch in progress on this thread.
** swapcontext carries no value across, unlike ums__ctx_jump, so the
** landing side finds it here. */
static _Thread_local ums__ctx_t *switching_from;
#endif

static inline void finish_switch(ums__ctx_t *self) {
#if UMS_ASAN
  ctx_san_finish(self, switching_from);
#else
  (void)self;
#endif
}

/* makecontext passes int arguments only, so the context pointer arrives
** in two 32-bit halves. */
static void ctx_boot(int hi, int lo) {
  uint64_t bits = (uint64_t)(uint32_t)hi << 32 | (uint32_t)lo;
  ums__ctx_t *self = (ums__ctx_t *)(uintptr_t)bits;

  finish_switch(self);
  self->fn(self->arg);
  /* uc_link is NULL: returning would end the thread. fn must switch away
  ** for good instead. */
  abort();
}

int ums__ctx_init_main(ums__ctx_t *ctx) {
  /* The ucontext_t is filled by the first switch away from the thread. */
  ucontext_t *uc = calloc(1, sizeof *uc);
  if (!uc) return UMS_ENOMEM;
  ctx->sp = NULL;
  ctx->uc = uc;
  ctx->stack_lo = NULL;
  ctx->stack_size = 0;
  ctx->asan_fake = NULL;
  ctx->fn = NULL; /* marks a main context for ctx_destroy */
  ctx->arg = NULL;
  ctx_san_init_main(ctx);
  return 0;
}

int ums__ctx_make(ums__ctx_t *ctx, void *stack_lo, size_t size,
                  void (*fn)(void *), void *arg) {
  if (!stack_lo || size < CTX_MIN_STACK || !fn) return UMS_EINVAL;

  /* A restart reuses the ucontext_t; ctx_destroy frees it. */
  if (!ctx->uc && !(ctx->uc = malloc(sizeof(ucontext_t)))) return UMS_ENOMEM;
  ucontext_t *uc = ctx->uc;
  /* makecontext wants a context from getcontext. This one is never
  ** resumed where getcontext returns: makecontext points it at ctx_boot. */
  if (getcontext(uc) != 0) return UMS_ENOMEM;
  int r = ctx_san_make(ctx, stack_lo, size);
  if (r) return r;

  uc->uc_stack.ss_sp = stack_lo;
  uc->uc_stack.ss_size = size;
  uc->uc_stack.ss_flags = 0;
  uc->uc_link = NULL;
  uint64_t bits = (uint64_t)(uintptr_t)ctx;
  makecontext(uc, (void (*)(void))ctx_boot, 2, (int)(uint32_t)(bits >> 32),
              (int)(uint32_t)bits);

  ctx->sp = NULL;
  ctx->stack_lo = stack_lo;
  ctx->stack_size = size;
  ctx->fn = fn;
  ctx->arg = arg;
  return 0;
}

void ums__ctx_switch(ums__ctx_t *from, ums__ctx_t *to) {
#if UMS_ASAN
  switching_from = from;
#endif
  ctx_san_start(from, to);
  /* swapcontext fails only for a bad pointer. */
  swapcontext(from->uc, to->uc);
  finish_switch(from);
}

void ums__ctx_destroy(ums__ctx_t *ctx) {
  ctx_san_destroy(ctx);
  free(ctx->uc);
  memset(ctx, 0, sizeof *ctx);
}

const char *ums__ctx_kind(void) { return "ucontext"; }
