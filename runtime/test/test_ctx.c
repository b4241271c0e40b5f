/*
** test_ctx.c: the context switch (ctx-*.S + ctx.c, or ctx-ucontext.c).
**
** Fibers here are bare contexts on stacks from stack.c, driven by hand:
** no scheduler is involved. Every check runs in every build (asm,
** ucontext, ASan, TSan), since the sanitizer annotations live in the ctx
** layer and these tests are what exercises them.
*/

#include "internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                              \
    }                                                                          \
  } while (0)

static ums__stack_pool_t pool;
static ums__ctx_t main_ctx;

typedef struct fiber {
  ums__ctx_t ctx;
  ums__stack_t stack;
} fiber_t;

static void fiber_make(fiber_t *f, void (*fn)(void *), void *arg) {
  memset(f, 0, sizeof *f);
  if (ums__stack_alloc(&pool, &f->stack) != 0 ||
      ums__ctx_make(&f->ctx, f->stack.lo, f->stack.size, fn, arg) != 0) {
    fprintf(stderr, "fiber_make failed\n");
    exit(1);
  }
}

static void fiber_drop(fiber_t *f) {
  ums__ctx_destroy(&f->ctx);
  ums__stack_free(&pool, &f->stack);
}

/* ---------------------------------------------------------------------- */
/* Callee-saved registers                                                  */
/* ---------------------------------------------------------------------- */

/* long regs_survive(ums__ctx_t *from, ums__ctx_t *to, long seed): loads a
** pattern derived from seed into every callee-saved register, calls
** ums__ctx_switch(from, to), and returns how many registers no longer
** hold their pattern when it returns. The two sides of a switch use
** different seeds, so a register the switch forgets shows up. Written in
** assembly because the compiler decides which registers C code uses. */
#if defined(__x86_64__)
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".type regs_survive, @function\n"
        "regs_survive:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $24, %rsp\n" /* seed slot; rsp 16-aligned */
        "  movq %rdx, (%rsp)\n"
        "  movq %rdx, %rbx\n"
        "  leaq 1(%rdx), %rbp\n"
        "  leaq 2(%rdx), %r12\n"
        "  leaq 3(%rdx), %r13\n"
        "  leaq 4(%rdx), %r14\n"
        "  leaq 5(%rdx), %r15\n"
        "  call ums__ctx_switch@PLT\n"
        "  movq (%rsp), %rdx\n"
        "  xorl %eax, %eax\n"
        "  cmpq %rdx, %rbx\n"
        "  setne %cl\n"
        "  movzbl %cl, %ecx\n"
        "  addq %rcx, %rax\n"
        "  leaq 1(%rdx), %rsi\n"
        "  cmpq %rsi, %rbp\n"
        "  setne %cl\n"
        "  addq %rcx, %rax\n"
        "  leaq 2(%rdx), %rsi\n"
        "  cmpq %rsi, %r12\n"
        "  setne %cl\n"
        "  addq %rcx, %rax\n"
        "  leaq 3(%rdx), %rsi\n"
        "  cmpq %rsi, %r13\n"
        "  setne %cl\n"
        "  addq %rcx, %rax\n"
        "  leaq 4(%rdx), %rsi\n"
        "  cmpq %rsi, %r14\n"
        "  setne %cl\n"
        "  addq %rcx, %rax\n"
        "  leaq 5(%rdx), %rsi\n"
        "  cmpq %rsi, %r15\n"
        "  setne %cl\n"
        "  addq %rcx, %rax\n"
        "  addq $24, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size regs_survive, .-regs_survive\n"
        ".popsection\n");
#define HAVE_REGS_SURVIVE 1
#elif defined(__aarch64__)
/* x19-x29 and d8-d15 (x29 too: the switch must restore the frame
** pointer even though nothing here uses it as one). */
/* clang-format off */
#define RS_CHECK(reg, off)                                                    \
  "  add x9, x2, #" #off "\n"                                                 \
  "  cmp " #reg ", x9\n"                                                      \
  "  cinc x0, x0, ne\n"
#define RS_CHECK_D(dreg, off)                                                 \
  "  add x9, x2, #" #off "\n"                                                 \
  "  fmov x10, " #dreg "\n"                                                   \
  "  cmp x10, x9\n"                                                           \
  "  cinc x0, x0, ne\n"
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".type regs_survive, %function\n"
        "regs_survive:\n"
        "  stp x29, x30, [sp, #-176]!\n"
        "  stp x19, x20, [sp, #16]\n"
        "  stp x21, x22, [sp, #32]\n"
        "  stp x23, x24, [sp, #48]\n"
        "  stp x25, x26, [sp, #64]\n"
        "  stp x27, x28, [sp, #80]\n"
        "  stp d8, d9, [sp, #96]\n"
        "  stp d10, d11, [sp, #112]\n"
        "  stp d12, d13, [sp, #128]\n"
        "  stp d14, d15, [sp, #144]\n"
        "  str x2, [sp, #160]\n"
        "  mov x19, x2\n"
        "  add x20, x2, #1\n"
        "  add x21, x2, #2\n"
        "  add x22, x2, #3\n"
        "  add x23, x2, #4\n"
        "  add x24, x2, #5\n"
        "  add x25, x2, #6\n"
        "  add x26, x2, #7\n"
        "  add x27, x2, #8\n"
        "  add x28, x2, #9\n"
        "  add x29, x2, #10\n"
        "  add x9, x2, #11\n  fmov d8, x9\n"
        "  add x9, x2, #12\n  fmov d9, x9\n"
        "  add x9, x2, #13\n  fmov d10, x9\n"
        "  add x9, x2, #14\n  fmov d11, x9\n"
        "  add x9, x2, #15\n  fmov d12, x9\n"
        "  add x9, x2, #16\n  fmov d13, x9\n"
        "  add x9, x2, #17\n  fmov d14, x9\n"
        "  add x9, x2, #18\n  fmov d15, x9\n"
        "  bl ums__ctx_switch\n"
        "  ldr x2, [sp, #160]\n"
        "  mov x0, #0\n"
        RS_CHECK(x19, 0) RS_CHECK(x20, 1) RS_CHECK(x21, 2)
        RS_CHECK(x22, 3) RS_CHECK(x23, 4) RS_CHECK(x24, 5)
        RS_CHECK(x25, 6) RS_CHECK(x26, 7) RS_CHECK(x27, 8)
        RS_CHECK(x28, 9) RS_CHECK(x29, 10)
        RS_CHECK_D(d8, 11) RS_CHECK_D(d9, 12) RS_CHECK_D(d10, 13)
        RS_CHECK_D(d11, 14) RS_CHECK_D(d12, 15) RS_CHECK_D(d13, 16)
        RS_CHECK_D(d14, 17) RS_CHECK_D(d15, 18)
        "  ldp x19, x20, [sp, #16]\n"
        "  ldp x21, x22, [sp, #32]\n"
        "  ldp x23, x24, [sp, #48]\n"
        "  ldp x25, x26, [sp, #64]\n"
        "  ldp x27, x28, [sp, #80]\n"
        "  ldp d8, d9, [sp, #96]\n"
        "  ldp d10, d11, [sp, #112]\n"
        "  ldp d12, d13, [sp, #128]\n"
        "  ldp d14, d15, [sp, #144]\n"
        "  ldp x29, x30, [sp], #176\n"
        "  ret\n"
        ".size regs_survive, .-regs_survive\n"
        ".popsection\n");
/* clang-format on */
#define HAVE_REGS_SURVIVE 1
#endif

#if HAVE_REGS_SURVIVE
long regs_survive(ums__ctx_t *from, ums__ctx_t *to, long seed);

#define REG_ROUNDS 1000
static long fiber_reg_errors;

static void regs_fiber(void *arg) {
  fiber_t *self = arg;
  for (long k = 0;; k++)
    fiber_reg_errors +=
        regs_survive(&self->ctx, &main_ctx, 0x5a5a5a5a00000000 + k * 64);
}

static void test_registers(void) {
  fiber_t f;
  long errors = 0;
  fiber_make(&f, regs_fiber, &f);
  for (long k = 0; k < REG_ROUNDS; k++)
    errors += regs_survive(&main_ctx, &f.ctx, 0x1234567800000000 + k * 64);
  CHECK(errors == 0);
  CHECK(fiber_reg_errors == 0);
  fiber_drop(&f);
}
#else
static void test_registers(void) {}
#endif

/* ---------------------------------------------------------------------- */
/* Floating point: values and control state                                */
/* ---------------------------------------------------------------------- */

/* Reads and writes the FP control state the switch must keep per
** context: MXCSR and the x87 control word, or FPCR. The test's own
** inline assembly avoids libm's fenv functions (the test links no
** libm). */
#if defined(__x86_64__)
typedef struct {
  uint32_t mxcsr;
  uint16_t x87;
} fpctl_t;
static fpctl_t fpctl_get(void) {
  fpctl_t c;
  __asm__ volatile("stmxcsr %0" : "=m"(c.mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(c.x87));
  return c;
}
static void fpctl_set(fpctl_t c) {
  __asm__ volatile("ldmxcsr %0" : : "m"(c.mxcsr));
  __asm__ volatile("fldcw %0" : : "m"(c.x87));
}
static bool fpctl_eq(fpctl_t a, fpctl_t b) {
  return a.mxcsr == b.mxcsr && a.x87 == b.x87;
}
/* Round toward +inf in both units, and flush-to-zero in SSE. */
static fpctl_t fpctl_odd(fpctl_t c) {
  c.mxcsr = (c.mxcsr & ~0x6000u) | 0x4000u | 0x8000u;
  c.x87 = (uint16_t)((c.x87 & ~0x0C00u) | 0x0800u);
  return c;
}
#define HAVE_FPCTL 1
#elif defined(__aarch64__)
typedef struct {
  uint64_t fpcr;
} fpctl_t;
static fpctl_t fpctl_get(void) {
  fpctl_t c;
  __asm__ volatile("mrs %0, fpcr" : "=r"(c.fpcr));
  return c;
}
static void fpctl_set(fpctl_t c) {
  __asm__ volatile("msr fpcr, %0" : : "r"(c.fpcr));
}
static bool fpctl_eq(fpctl_t a, fpctl_t b) { return a.fpcr == b.fpcr; }
/* Round toward +inf (RMode 01) and flush-to-zero (FZ). */
static fpctl_t fpctl_odd(fpctl_t c) {
  c.fpcr = (c.fpcr & ~(UINT64_C(3) << 22)) | (UINT64_C(1) << 22) |
           (UINT64_C(1) << 24);
  return c;
}
#define HAVE_FPCTL 1
#endif

#if HAVE_FPCTL
static int fpctl_fiber_errors;

static void fpctl_fiber(void *arg) {
  fiber_t *self = arg;
  fpctl_t odd = fpctl_odd(fpctl_get());
  fpctl_set(odd);
  for (;;) {
    ums__ctx_switch(&self->ctx, &main_ctx);
    if (!fpctl_eq(fpctl_get(), odd)) fpctl_fiber_errors++;
  }
}

static void test_fp_control(void) {
  fiber_t f;
  fpctl_t mine = fpctl_get();
  fiber_make(&f, fpctl_fiber, &f);
  for (int k = 0; k < 10; k++) {
    ums__ctx_switch(&main_ctx, &f.ctx);
    CHECK(fpctl_eq(fpctl_get(), mine));
  }
  CHECK(fpctl_fiber_errors == 0);
  fiber_drop(&f);

  /* A fresh context inherits the control state of the thread that made
  ** it, like a new thread. */
  fpctl_t odd = fpctl_odd(mine);
  fpctl_set(odd);
  fiber_make(&f, fpctl_fiber, &f);
  fpctl_set(mine);
  fpctl_fiber_errors = 0;
  ums__ctx_switch(&main_ctx, &f.ctx);
  ums__ctx_switch(&main_ctx, &f.ctx);
  CHECK(fpctl_fiber_errors == 0);
  CHECK(fpctl_eq(fpctl_get(), mine));
  fiber_drop(&f);
}
#else
static void test_fp_control(void) {}
#endif

/* Double arithmetic with a switch after every step. The same function
** computes the reference without switches: any FP register or state
** the switch clobbers changes the result. */
#define FP_STEPS 2000
#define FP_FIBERS 3

typedef struct fp_job {
  fiber_t f;
  double seed;
  double result;
  bool done;
} fp_job_t;

static double fp_work(double seed, ums__ctx_t *self) {
  double a = seed, b = 1.0 / seed, c = seed * seed, d = 0.0;
  for (int k = 1; k <= FP_STEPS; k++) {
    a = a * 1.0000001 + b / k;
    b = b * 0.9999999 + c / (k + 1.5);
    c = c * 0.5 + a * 1e-3;
    d += a * b - c / (a + 1.0);
    if (self) ums__ctx_switch(self, &main_ctx);
  }
  return a + b + c + d;
}

static void fp_fiber(void *arg) {
  fp_job_t *j = arg;
  j->result = fp_work(j->seed, &j->f.ctx);
  j->done = true;
  ums__ctx_switch(&j->f.ctx, &main_ctx);
  abort(); /* never resumed */
}

static void test_fp_values(void) {
  fp_job_t jobs[FP_FIBERS];
  for (int i = 0; i < FP_FIBERS; i++) {
    jobs[i].seed = 1.5 + i * 0.25;
    jobs[i].done = false;
    fiber_make(&jobs[i].f, fp_fiber, &jobs[i]);
  }
  /* Interleave the fibers, with main doing its own FP work between
  ** switches so that every switch crosses live FP state. */
  double mine = 0.0;
  for (bool any = true; any;) {
    any = false;
    for (int i = 0; i < FP_FIBERS; i++) {
      if (jobs[i].done) continue;
      any = true;
      mine = mine * 0.75 + 1.0 / (i + 1.0);
      ums__ctx_switch(&main_ctx, &jobs[i].f.ctx);
    }
  }
  for (int i = 0; i < FP_FIBERS; i++) {
    double want = fp_work(jobs[i].seed, NULL);
    CHECK(memcmp(&want, &jobs[i].result, sizeof want) == 0);
    fiber_drop(&jobs[i].f);
  }
  CHECK(mine > 0.0);
}

/* ---------------------------------------------------------------------- */
/* Ping-pong between main and several fibers                               */
/* ---------------------------------------------------------------------- */

#define PP_FIBERS 3
#define PP_ROUNDS 1000

static fiber_t pp[PP_FIBERS];
static long pp_value; /* the message in flight */
static int pp_errors;

/* Fiber i takes the value from its left neighbour (main for fiber 0),
** checks it, and passes it on (fiber PP_FIBERS-1 back to main), so the
** ring exercises switches between fibers, not only to and from main. */
static void pp_fiber(void *arg) {
  int i = (int)(intptr_t)arg;
  ums__ctx_t *next = i + 1 < PP_FIBERS ? &pp[i + 1].ctx : &main_ctx;
  for (long round = 0;; round++) {
    if (pp_value != round * 1000 + i) pp_errors++;
    pp_value++;
    ums__ctx_switch(&pp[i].ctx, next);
  }
}

static void test_ping_pong(void) {
  for (int i = 0; i < PP_FIBERS; i++)
    fiber_make(&pp[i], pp_fiber, (void *)(intptr_t)i);
  for (long round = 0; round < PP_ROUNDS; round++) {
    pp_value = round * 1000;
    ums__ctx_switch(&main_ctx, &pp[0].ctx);
    CHECK(pp_value == round * 1000 + PP_FIBERS);
  }
  CHECK(pp_errors == 0);
  for (int i = 0; i < PP_FIBERS; i++) fiber_drop(&pp[i]);
}

/* ---------------------------------------------------------------------- */
/* Restarting a context on the same stack                                  */
/* ---------------------------------------------------------------------- */

#define RESTARTS 1000

static int restart_runs;
static void *restart_frame; /* frame address of the first run's entry */
static int restart_errors;

/* Does some stack work, then leaves for good mid-function, as a worker
** whose task ended does; the frames it leaves behind are never resumed. */
static void restart_fiber(void *arg) {
  fiber_t *self = arg;
  volatile char buf[512];
  void *frame = __builtin_frame_address(0);
  if (restart_runs == 0)
    restart_frame = frame;
  else if (frame != restart_frame)
    restart_errors++; /* not run from the top of the stack */
  restart_runs++;
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (char)(i + restart_runs);
  ums__ctx_switch(&self->ctx, &main_ctx);
  /* A restarted context must never come back here. */
  restart_errors += 1000;
  ums__ctx_switch(&self->ctx, &main_ctx);
}

static void test_restart(void) {
  fiber_t f;
  fiber_make(&f, restart_fiber, &f);
  ums__ctx_switch(&main_ctx, &f.ctx);
  CHECK(restart_runs == 1);
  for (int k = 0; k < RESTARTS; k++) {
    CHECK(ums__ctx_make(&f.ctx, f.stack.lo, f.stack.size, restart_fiber, &f) ==
          0);
    ums__ctx_switch(&main_ctx, &f.ctx);
  }
  CHECK(restart_runs == RESTARTS + 1);
  CHECK(restart_errors == 0);
  fiber_drop(&f);
}

/* ---------------------------------------------------------------------- */
/* Deep recursion                                                          */
/* ---------------------------------------------------------------------- */

/* Recursion stops this close to the bottom of the stack: room for the
** switch itself and, in sanitizer builds, the runtime calls it makes. */
#define DEEP_MARGIN 4096

static const char *deep_lo;
static const char *deep_bottom; /* the deepest frame reached */
static long deep_max;
static int deep_errors;
static fiber_t deep;

__attribute__((noinline)) static long deep_recurse(long depth) {
  volatile unsigned char buf[200];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(depth + i);
  long below;
  char *frame = __builtin_frame_address(0);
  if (frame - deep_lo > DEEP_MARGIN) {
    below = deep_recurse(depth + 1);
  } else {
    /* The deepest point: switch away and back with the stack nearly
    ** full. */
    deep_max = depth;
    deep_bottom = frame;
    ums__ctx_switch(&deep.ctx, &main_ctx);
    below = 0;
  }
  for (size_t i = 0; i < sizeof buf; i++)
    if (buf[i] != (unsigned char)(depth + i)) deep_errors++;
  return below + 1; /* not a tail call: the frames stay live */
}

static void deep_fiber(void *arg) {
  deep_lo = deep.stack.lo;
  long n = deep_recurse(1);
  if (n != deep_max) deep_errors++;
  ums__ctx_switch(&deep.ctx, &main_ctx);
  abort();
}

static void test_deep_recursion(void) {
  fiber_make(&deep, deep_fiber, NULL);
  ums__ctx_switch(&main_ctx, &deep.ctx); /* at the deepest point */
  /* Most of the stack is in use, and still the switch works. */
  CHECK(deep_max > 10);
  CHECK(deep_bottom >= deep_lo &&
        (size_t)(deep_bottom - deep_lo) <= DEEP_MARGIN + 1024);
  ums__ctx_switch(&main_ctx, &deep.ctx); /* unwound */
  CHECK(deep_errors == 0);
  fiber_drop(&deep);
}

/* ---------------------------------------------------------------------- */
/* Many switches                                                           */
/* ---------------------------------------------------------------------- */

#define MANY_SWITCHES 1000000L

static long many_count;

static void many_fiber(void *arg) {
  fiber_t *self = arg;
  for (;;) {
    many_count++;
    ums__ctx_switch(&self->ctx, &main_ctx);
  }
}

static void test_many_switches(void) {
  fiber_t f;
  fiber_make(&f, many_fiber, &f);
  /* Each round trip is two switches. */
  for (long k = 0; k < MANY_SWITCHES / 2; k++)
    ums__ctx_switch(&main_ctx, &f.ctx);
  CHECK(many_count == MANY_SWITCHES / 2);
  fiber_drop(&f);
}

/* ---------------------------------------------------------------------- */

static void dummy_fn(void *arg) { (void)arg; }

static void test_interface(void) {
  const char *kind = ums__ctx_kind();
  CHECK(kind != NULL);
  CHECK(strcmp(kind, "asm-x86_64") == 0 || strcmp(kind, "asm-aarch64") == 0 ||
        strcmp(kind, "ucontext") == 0);
#if UMS_CTX_UCONTEXT
  CHECK(strcmp(kind, "ucontext") == 0);
#endif
  ums__ctx_t c;
  memset(&c, 0, sizeof c);
  char small[64];
  CHECK(ums__ctx_make(&c, NULL, 65536, dummy_fn, NULL) == UMS_EINVAL);
  CHECK(ums__ctx_make(&c, small, sizeof small, dummy_fn, NULL) == UMS_EINVAL);
  ums__ctx_destroy(&c);
}

int main(void) {
  if (ums__stack_pool_init(&pool, 64 * 1024) != 0 ||
      ums__ctx_init_main(&main_ctx) != 0) {
    fprintf(stderr, "setup failed\n");
    return 1;
  }
  test_interface();
  test_ping_pong();
  test_registers();
  test_fp_control();
  test_fp_values();
  test_restart();
  test_deep_recursion();
  test_many_switches();

  /* Teardown: every stack came back, and the pool lets go of it all. */
  CHECK(pool.in_use == 0);
  ums__stack_pool_destroy(&pool);
  CHECK(pool.nslabs == 0);
  ums__ctx_destroy(&main_ctx);

  if (failures) {
    fprintf(stderr, "test_ctx: %d check(s) failed (%s)\n", failures,
            ums__ctx_kind());
    return 1;
  }
  printf("test_ctx: ok (%s)\n", ums__ctx_kind());
  return 0;
}
