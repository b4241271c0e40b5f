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

#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if !defined(UMS_ASAN) &&                                                      \
    (defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer))
#define UMS_ASAN 1
#endif
#if !defined(UMS_TSAN) &&                                                      \
    (defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer))
#define UMS_TSAN 1
#endif

#if UMS_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if UMS_TSAN
#include <sanitizer/tsan_interface.h>
#endif

#define CTX_MIN_STACK 4096

#if UMS_ASAN
/* The context being left by the switch in progress on this thread.
** swapcontext carries no value across, unlike ums__ctx_jump, so the
** landing side finds it here. */
static _Thread_local ums__ctx_t *switching_from;
#endif

static inline void finish_switch(ums__ctx_t *self) {
#if UMS_ASAN
  ums__ctx_t *prev = switching_from;
  /* ASan reports the bounds of the stack just left; see ctx.c. */
  __sanitizer_finish_switch_fiber(self->asan_fake, &prev->stack_lo,
                                  &prev->stack_size);
#else
  (void)self;
#endif
}

/* makecontext passes int arguments only, so the context pointer arrives
** in two 32-bit halves. */
static void ctx_boot(int hi, int lo) {
  uint64_t bits = (uint64_t)(uint32_t)hi << 32 | (uint32_t)lo;
  ums__ctx_t *self = (ums__ctx_t *)(uintptr_t)bits;

  /* On a restart asan_fake holds the previous run's fake stack, adopted
  ** here rather than leaked (see ctx.c). */
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
#if UMS_TSAN
  ctx->tsan_fiber = __tsan_get_current_fiber();
#else
  ctx->tsan_fiber = NULL;
#endif
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
#if UMS_TSAN
  /* A restart gets a new fiber; see ctx.c. */
  if (ctx->tsan_fiber) __tsan_destroy_fiber(ctx->tsan_fiber);
  ctx->tsan_fiber = __tsan_create_fiber(0);
#endif
#if UMS_ASAN
  /* Frames that never returned left their redzones on this stack. */
  ASAN_UNPOISON_MEMORY_REGION(stack_lo, size);
#endif

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
#if UMS_TSAN
  __tsan_switch_to_fiber(to->tsan_fiber, 0);
#endif
#if UMS_ASAN
  switching_from = from;
  __sanitizer_start_switch_fiber(&from->asan_fake, to->stack_lo,
                                 to->stack_size);
#endif
  /* swapcontext fails only for a bad pointer. */
  swapcontext(from->uc, to->uc);
  finish_switch(from);
}

void ums__ctx_destroy(ums__ctx_t *ctx) {
#if UMS_TSAN
  /* A thread's own fiber belongs to TSan; only ours are destroyed. */
  if (ctx->fn && ctx->tsan_fiber) __tsan_destroy_fiber(ctx->tsan_fiber);
#endif
  free(ctx->uc);
  memset(ctx, 0, sizeof *ctx);
}

const char *ums__ctx_kind(void) { return "ucontext"; }
