/*
** ctx-x86_64.S: the stack switch for x86-64 System V (Linux, ELF).
**
** Only what C cannot express lives here; ctx.c wraps it with the
** sanitizer annotations and the public ums__ctx_* names.
**
** A suspended context is nothing but its stack pointer: the switch pushes
** the callee-saved state onto the stack it is leaving and pops it from
** the stack it enters. Caller-saved registers need no saving, because
** the switch is an ordinary call as far as the compiler is concerned.
** The frame, from the saved stack pointer upwards:
**
**   +0   MXCSR (4 bytes), x87 control word (2 bytes), 2 bytes unused
**   +8   r15
**   +16  r14
**   +24  r13
**   +32  r12
**   +40  rbx
**   +48  rbp
**   +56  return address
**
** MXCSR and the x87 control word are callee-saved control bits in the
** ABI (rounding mode, exception masks, flush-to-zero): a fiber that
** changes its rounding mode must not change the scheduler's.
*/

  .text

/* void *ums__ctx_jump(void **save_sp, void *to_sp, void *pass)
**   rdi      rsi      rdx
** Saves the current context, stores its stack pointer in *save_sp and
** resumes the context whose stack pointer is to_sp. Returns, in the
** resumed context, the pass argument of the jump that resumed it; ctx.c
** passes the context being left, which the sanitizer annotations need. */
  .globl ums__ctx_jump
  .hidden ums__ctx_jump
  .type ums__ctx_jump, @function
  .p2align 4
ums__ctx_jump:
  .cfi_startproc
  pushq %rbp
  .cfi_adjust_cfa_offset 8
  pushq %rbx
  .cfi_adjust_cfa_offset 8
  pushq %r12
  .cfi_adjust_cfa_offset 8
  pushq %r13
  .cfi_adjust_cfa_offset 8
  pushq %r14
  .cfi_adjust_cfa_offset 8
  pushq %r15
  .cfi_adjust_cfa_offset 8
  /* Seven pushes from a call site put rsp back on a 16-byte boundary. */
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  stmxcsr (%rsp)
  fnstcw 4(%rsp)

  movq %rsp, (%rdi)
  movq %rsi, %rsp

  /* From here on the CFI no longer describes the frame being popped (it
  ** is another context's), which only matters to a debugger stopped on
  ** one of the next few instructions. */
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  movq %rdx, %rax
  ret
  .cfi_endproc
  .size ums__ctx_jump, .-ums__ctx_jump

/* void *ums__ctx_prepare(void *stack_hi, void *ctx,
**                        void (*boot)(void *ctx, void *prev))
** Writes, just below stack_hi, a frame that ums__ctx_jump pops as if the
** fresh context had suspended itself; its return address is ctx_start,
** which calls boot(ctx, prev) with prev the pass argument of that first
** jump. The control words are copied from the calling thread, as a new
** thread inherits them. Returns the stack pointer to jump to. */
  .globl ums__ctx_prepare
  .hidden ums__ctx_prepare
  .type ums__ctx_prepare, @function
  .p2align 4
ums__ctx_prepare:
  .cfi_startproc
  movq %rdi, %rax
  andq $-16, %rax
  /* The frame (64 bytes) sits 16 bytes below the aligned top, so that
  ** ctx_start runs with rsp on a 16-byte boundary, as a call site must;
  ** the 16 bytes above hold a zero return address for stack walkers. */
  subq $80, %rax
  stmxcsr (%rax)
  fnstcw 4(%rax)
  movw $0, 6(%rax)
  xorl %ecx, %ecx
  movq %rcx, 8(%rax)          /* r15 */
  movq %rcx, 16(%rax)         /* r14 */
  movq %rdx, 24(%rax)         /* r13: boot */
  movq %rsi, 32(%rax)         /* r12: ctx */
  movq %rcx, 40(%rax)         /* rbx */
  movq %rcx, 48(%rax)         /* rbp: ends frame-pointer chains */
  leaq ctx_start(%rip), %rdx
  movq %rdx, 56(%rax)
  movq %rcx, 64(%rax)
  movq %rcx, 72(%rax)
  ret
  .cfi_endproc
  .size ums__ctx_prepare, .-ums__ctx_prepare

/* Entered by the ret of the first jump into a context, with the pass
** argument in rax. boot never returns; the ud2 makes a bug loud. */
  .type ctx_start, @function
  .p2align 4
ctx_start:
  .cfi_startproc
  /* The outermost frame: unwinders (gdb, the sanitizers' slow unwinder)
  ** stop here instead of wandering into the stack's padding. */
  .cfi_undefined rip
  movq %r12, %rdi
  movq %rax, %rsi
  callq *%r13
  ud2
  .cfi_endproc
  .size ctx_start, .-ctx_start

  .section .note.GNU-stack, "", @progbits
