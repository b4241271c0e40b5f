/*
** ctx-aarch64.S: the stack switch for AArch64 (AAPCS64, Linux, ELF).
**
** Only what C cannot express lives here; ctx.c wraps it with the
** sanitizer annotations and the public ums__ctx_* names.
**
** A suspended context is nothing but its stack pointer: the switch stores
** the callee-saved state on the stack it is leaving and loads it from the
** stack it enters. Caller-saved registers need no saving, because the
** switch is an ordinary call as far as the compiler is concerned. The
** frame (176 bytes, keeping sp 16-byte aligned), from the saved sp up:
**
**   +0   x19 x20 x21 x22 x23 x24 x25 x26 x27 x28
**   +80  x29 (frame pointer), x30 (return address)
**   +96  d8 .. d15 (only the low 64 bits are callee-saved)
**   +160 fpcr, 8 bytes unused
**
** FPCR holds the rounding mode, flush-to-zero and trap enables, which the
** ABI treats as callee-saved: a fiber that changes its rounding mode
** must not change the scheduler's.
*/

  .text

/* void *ums__ctx_jump(void **save_sp, void *to_sp, void *pass)
**   x0       x1       x2
** Saves the current context, stores its stack pointer in *save_sp and
** resumes the context whose stack pointer is to_sp. Returns, in the
** resumed context, the pass argument of the jump that resumed it; ctx.c
** passes the context being left, which the sanitizer annotations need. */
  .globl ums__ctx_jump
  .hidden ums__ctx_jump
  .type ums__ctx_jump, %function
  .p2align 4
ums__ctx_jump:
  .cfi_startproc
  sub sp, sp, #176
  .cfi_adjust_cfa_offset 176
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mrs x9, fpcr
  str x9, [sp, #160]

  mov x10, sp
  str x10, [x0]
  mov sp, x1

  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  /* Writing FPCR can stall the pipeline on some cores, and the two
  ** contexts nearly always agree, so write it only when they differ. */
  ldr x10, [sp, #160]
  cmp x9, x10
  b.eq 1f
  msr fpcr, x10
1:
  add sp, sp, #176
  mov x0, x2
  ret
  .cfi_endproc
  .size ums__ctx_jump, .-ums__ctx_jump

/* void *ums__ctx_prepare(void *stack_hi, void *ctx,
**                        void (*boot)(void *ctx, void *prev))
** Writes, just below stack_hi, a frame that ums__ctx_jump loads as if the
** fresh context had suspended itself; its return address is ctx_start,
** which calls boot(ctx, prev) with prev the pass argument of that first
** jump. FPCR is copied from the calling thread, as a new thread inherits
** it. Returns the stack pointer to jump to. */
  .globl ums__ctx_prepare
  .hidden ums__ctx_prepare
  .type ums__ctx_prepare, %function
  .p2align 4
ums__ctx_prepare:
  .cfi_startproc
  and x0, x0, #~15
  /* The frame sits 16 bytes below the aligned top; the 16 bytes above
  ** stay zero, a null frame record for stack walkers. */
  sub x0, x0, #192
  stp xzr, xzr, [x0, #176]
  stp x1, x2, [x0, #0]        /* x19: ctx, x20: boot */
  stp xzr, xzr, [x0, #16]
  stp xzr, xzr, [x0, #32]
  stp xzr, xzr, [x0, #48]
  stp xzr, xzr, [x0, #64]
  adr x9, ctx_start
  stp xzr, x9, [x0, #80]      /* x29: ends frame chains, x30: ctx_start */
  stp xzr, xzr, [x0, #96]
  stp xzr, xzr, [x0, #112]
  stp xzr, xzr, [x0, #128]
  stp xzr, xzr, [x0, #144]
  mrs x9, fpcr
  stp x9, xzr, [x0, #160]
  ret
  .cfi_endproc
  .size ums__ctx_prepare, .-ums__ctx_prepare

/* Entered by the ret of the first jump into a context, with the pass
** argument in x0. boot never returns; the brk makes a bug loud. */
  .type ctx_start, %function
  .p2align 4
ctx_start:
  .cfi_startproc
  /* The outermost frame: unwinders stop here. */
  .cfi_undefined x30
  mov x1, x0
  mov x0, x19
  blr x20
  brk #0x3c
  .cfi_endproc
  .size ctx_start, .-ctx_start

  .section .note.GNU-stack, "", %progbits
