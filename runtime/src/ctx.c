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

#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* CMake defines UMS_ASAN / UMS_TSAN for sanitizer builds; a build that
** passes -fsanitize by hand gets the annotations too, because without
** them the sanitizers report nonsense after the first switch. */
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

/* The assembly primitives; see the .S files for the frame they use. */
void *ums__ctx_jump(void **save_sp, void *to_sp, void *pass);
void *ums__ctx_prepare(void *stack_hi, void *ctx,
                       void (*boot)(void *ctx, void *prev));

/* The smallest stack we accept: the initial frame, the boot function and
** a little room for fn's first frames. Real stacks come from stack.c and
** are at least 16 KiB. */
#define CTX_MIN_STACK 1024

/* Called after every landing in a context: the jump that got us here
** passed prev, the context it left. */
static inline void finish_switch(ums__ctx_t *self, ums__ctx_t *prev) {
#if UMS_ASAN
  /* ASan reports the bounds of the stack just left. They are the ones
  ** ctx_make recorded, except for a thread's main context, whose bounds
  ** are learned this way the first time it is left. */
  __sanitizer_finish_switch_fiber(self->asan_fake, &prev->stack_lo,
                                  &prev->stack_size);
#else
  (void)self;
  (void)prev;
#endif
}

/* The first code a fresh context runs, called by ctx_start. */
static void ctx_boot(void *self_, void *prev) {
  ums__ctx_t *self = self_;

  /* On a restart, asan_fake holds the fake stack the previous run saved
  ** when it last switched away. Adopting it keeps one fake stack per
  ** context instead of leaking one per restart (ASan can only free the
  ** fake stack of the fiber that is running). */
  finish_switch(self, prev);
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

#if UMS_ASAN
  /* The stack may hold the redzones of frames that never returned: those
  ** of this context's previous run, or of another worker that had the
  ** same stack before stack.c recycled it. */
  ASAN_UNPOISON_MEMORY_REGION(stack_lo, size);
#endif
#if UMS_TSAN
  /* A restart gets a new fiber: reusing the old one would keep the
  ** previous run's unfinished frames on TSan's shadow call stack, which
  ** would grow with every restart. The old run is never resumed, so its
  ** fiber can go. */
  if (ctx->tsan_fiber) __tsan_destroy_fiber(ctx->tsan_fiber);
  ctx->tsan_fiber = __tsan_create_fiber(0);
  if (!ctx->tsan_fiber) return UMS_ENOMEM;
#endif

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
#if UMS_TSAN
  __tsan_switch_to_fiber(to->tsan_fiber, 0);
#endif
#if UMS_ASAN
  /* The fake stack of from is saved even when from is leaving for good:
  ** nothing here knows that, and ctx_boot reuses it on a restart. */
  __sanitizer_start_switch_fiber(&from->asan_fake, to->stack_lo,
                                 to->stack_size);
  ums__ctx_t *prev = ums__ctx_jump(&from->sp, to->sp, from);
  finish_switch(from, prev);
#else
  /* Without sanitizers this compiles to a tail jump. */
  ums__ctx_jump(&from->sp, to->sp, from);
#endif
}

void ums__ctx_destroy(ums__ctx_t *ctx) {
#if UMS_TSAN
  /* A thread's own fiber belongs to TSan; only ours are destroyed. */
  if (ctx->fn && ctx->tsan_fiber) __tsan_destroy_fiber(ctx->tsan_fiber);
#endif
  /* The fake stack in asan_fake, if any, cannot be freed from here (ASan
  ** frees only the running fiber's); it exists only with
  ** detect_stack_use_after_return=1. Zeroing makes the struct ready for
  ** another ctx_make. */
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
