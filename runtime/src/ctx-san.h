/*
** ctx-san.h: what every context-switch backend tells the sanitizers, in
** one place (ctx.c for the assembly switch, ctx-ucontext.c). Without these
** annotations ASan and TSan report nonsense after the first switch. All
** of it compiles to nothing in a build without sanitizers.
*/
#ifndef UMS_CTX_SAN_H
#define UMS_CTX_SAN_H

#include "internal.h"

/* CMake defines UMS_ASAN / UMS_TSAN for sanitizer builds; a build that
** passes -fsanitize by hand gets the annotations too. */
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

/* A thread's own context: TSan already has a fiber for it. */
static inline void ctx_san_init_main(ums__ctx_t *ctx) {
#if UMS_TSAN
  ctx->tsan_fiber = __tsan_get_current_fiber();
#else
  ctx->tsan_fiber = NULL;
#endif
}

/* A context (re)started on [stack_lo, stack_lo + size). 0 or UMS_ENOMEM. */
static inline int ctx_san_make(ums__ctx_t *ctx, void *stack_lo,
                               size_t size) {
#if UMS_ASAN
  /* The stack may hold the redzones of frames that never returned: those
  ** of this context's previous run, or of another worker that had the
  ** same stack before stack.c recycled it. */
  ASAN_UNPOISON_MEMORY_REGION(stack_lo, size);
#else
  (void)stack_lo;
  (void)size;
#endif
#if UMS_TSAN
  /* A restart gets a new fiber: reusing the old one would keep the
  ** previous run's unfinished frames on TSan's shadow call stack, which
  ** would grow with every restart. The old run is never resumed, so its
  ** fiber can go. */
  if (ctx->tsan_fiber) __tsan_destroy_fiber(ctx->tsan_fiber);
  ctx->tsan_fiber = __tsan_create_fiber(0);
  if (!ctx->tsan_fiber) return UMS_ENOMEM;
#else
  (void)ctx;
#endif
  return 0;
}

/* Just before the switch from -> to. The fake stack of from is saved even
** when from is leaving for good: nothing here knows that, and a restart
** adopts it (ctx_san_finish in the new run's first frame). */
static inline void ctx_san_start(ums__ctx_t *from, ums__ctx_t *to) {
#if UMS_TSAN
  __tsan_switch_to_fiber(to->tsan_fiber, 0);
#endif
#if UMS_ASAN
  __sanitizer_start_switch_fiber(&from->asan_fake, to->stack_lo,
                                 to->stack_size);
#endif
  (void)from;
  (void)to;
}

/* After every landing in self, coming from prev. ASan reports the bounds
** of the stack just left: those ctx_make recorded, except for a thread's
** main context, whose bounds are learned this way the first time it is
** left. On a restart, asan_fake holds the previous run's fake stack, and
** adopting it keeps one per context instead of leaking one per restart
** (ASan can only free the running fiber's). */
static inline void ctx_san_finish(ums__ctx_t *self, ums__ctx_t *prev) {
#if UMS_ASAN
  __sanitizer_finish_switch_fiber(self->asan_fake, &prev->stack_lo,
                                  &prev->stack_size);
#endif
  (void)self;
  (void)prev;
}

/* A context going away. A thread's own fiber (fn == NULL marks a main
** context) belongs to TSan; only ours are destroyed. A fake stack in
** asan_fake cannot be freed from here (it exists only with
** detect_stack_use_after_return=1). */
static inline void ctx_san_destroy(ums__ctx_t *ctx) {
#if UMS_TSAN
  if (ctx->fn && ctx->tsan_fiber) __tsan_destroy_fiber(ctx->tsan_fiber);
#else
  (void)ctx;
#endif
}

#endif /* UMS_CTX_SAN_H */
