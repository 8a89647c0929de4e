/* Start-up code, exception vectors, register-window spilling and a windowed-ABI setjmp/longjmp for
 * MicroPython on QEMU's `-M sim -cpu de233_fpu` Xtensa machine.
 *
 * QEMU's sim machine starts at the reset vector 0xfe000000 whatever the ELF entry point says; its
 * RAM there is only 32 MB, so the image lives in low RAM (0x0 + -m size) and a stub at the reset
 * vector jumps to _start. Native code that MicroPython's xtensawin emitter writes on the GC heap must
 * be in the same 1 GB region as the firmware (retw keeps the top two bits of the PC), which it is.
 */
#define PS_WOE      (1 << 18)
#define PS_UM       (1 << 5)
#define PS_INTLEVEL 15

/* ---- reset vector (at 0xfe000000 by the linker script) ---- */
    .section .reset.text, "ax"
    .global _reset
    .begin no-transform
_reset:
    j       1f
    .align  4
.Lstart_addr:
    .word   _start
1:
    l32r    a0, .Lstart_addr
    jx      a0
    .end no-transform

/* ---- exception vectors (VECBASE points here) ---- */
    .section .vectors.text, "ax"
    .align  1024
    .global _vector_base
    .begin no-transform
_vector_base:
    .org    0x00
_WindowOverflow4:
    s32e    a0, a5, -16
    s32e    a1, a5, -12
    s32e    a2, a5, -8
    s32e    a3, a5, -4
    rfwo

    .org    0x40
_WindowUnderflow4:
    l32e    a0, a5, -16
    l32e    a1, a5, -12
    l32e    a2, a5, -8
    l32e    a3, a5, -4
    rfwu

    .org    0x80
_WindowOverflow8:
    s32e    a0, a9, -16
    l32e    a0, a1, -12
    s32e    a2, a9, -8
    s32e    a1, a9, -12
    s32e    a3, a9, -4
    s32e    a4, a0, -32
    s32e    a5, a0, -28
    s32e    a6, a0, -24
    s32e    a7, a0, -20
    rfwo

    .org    0xc0
_WindowUnderflow8:
    l32e    a1, a9, -12
    l32e    a0, a9, -16
    l32e    a7, a1, -12
    l32e    a2, a9, -8
    l32e    a4, a7, -32
    l32e    a3, a9, -4
    l32e    a5, a7, -28
    l32e    a6, a7, -24
    l32e    a7, a7, -20
    rfwu

    .org    0x100
_WindowOverflow12:
    s32e    a0, a13, -16
    l32e    a0, a1, -12
    s32e    a1, a13, -12
    s32e    a2, a13, -8
    s32e    a3, a13, -4
    s32e    a4, a0, -48
    s32e    a5, a0, -44
    s32e    a6, a0, -40
    s32e    a7, a0, -36
    s32e    a8, a0, -32
    s32e    a9, a0, -28
    s32e    a10, a0, -24
    s32e    a11, a0, -20
    rfwo

    .org    0x140
_WindowUnderflow12:
    l32e    a1, a13, -12
    l32e    a0, a13, -16
    l32e    a11, a1, -12
    l32e    a2, a13, -8
    l32e    a4, a11, -48
    l32e    a8, a11, -32
    l32e    a3, a13, -4
    l32e    a5, a11, -44
    l32e    a6, a11, -40
    l32e    a7, a11, -36
    l32e    a9, a11, -28
    l32e    a10, a11, -24
    l32e    a11, a11, -20
    rfwu

    /* Any other exception (illegal instruction, load/store error, ...) is fatal: xt_fatal prints
       the cause and address through semihosting and exits. */
    .org    0x300
_KernelExceptionVector:
    movi    a0, 1
    j       _fatal_exception
    .org    0x340
_UserExceptionVector:
    wsr     a0, excsave1
    rsr     a0, exccause
    bnei    a0, 5, 1f               /* 5: alloca (movsp with the caller's window spilled) */
    j       _alloca_exception
1:  movi    a0, 0
    j       _fatal_exception
    .org    0x3c0
_DoubleExceptionVector:
    movi    a0, 2
    j       _fatal_double
    .end no-transform

    /* The alloca exception: MOVSP found the caller's registers spilled to the stack. Load them
       back with the matching underflow handler (chosen by the call size in the caller's return
       address) and return to the MOVSP, which then succeeds. As in Cadence's reference vectors:
       PS.OWB is moved along with the window rotation so that rfwu returns to this window. */
    .align  4
_alloca_exception:
    rsr     a0, windowbase
    rotw    -1
    rsr     a2, ps
    extui   a3, a2, 8, 4
    xor     a3, a3, a4
    rsr     a4, excsave1
    slli    a3, a3, 8
    xor     a2, a2, a3
    wsr     a2, ps
    rsync
    bbci.l  a4, 31, _WindowUnderflow4
    rotw    -1
    bbci.l  a8, 30, _WindowUnderflow8
    rotw    -1
    j       _WindowUnderflow12

    .align  4
_fatal_double:
    rsr     a3, depc
    j       1f
    .align  4
_fatal_exception:
    rsr     a3, epc1
1:  rsr     a2, exccause
    rsr     a4, excvaddr
    mov     a5, a0
    rsr     a6, windowbase
    movi    a7, 1
    ssl     a6
    sll     a7, a7
    wsr     a7, windowstart
    rsync
    movi    a1, _fatal_stack_top
    movi    a0, 0
    movi    a7, PS_WOE | PS_UM | PS_INTLEVEL
    wsr     a7, ps
    rsync
    mov     a10, a2
    mov     a11, a3
    mov     a12, a4
    mov     a13, a5
    call8   xt_fatal
1:  j       1b

/* ---- start-up ---- */
    .text
    .global _start
    .align  4
_start:
    movi    a0, _vector_base
    wsr     a0, vecbase
    movi    a0, 0
    wsr     a0, windowbase
    rsync
    movi    a0, 1
    wsr     a0, windowstart
    movi    a0, PS_WOE | PS_UM | PS_INTLEVEL
    wsr     a0, ps
    rsync
    movi    a0, 0xff                /* enable the coprocessors: the FPU is coprocessor 0 */
    wsr     a0, cpenable
    rsync
    /* The first frame: its caller's stack pointer (read by the overflow handlers from the save
       area below its sp) points at the top of the stack, so that spilling this frame writes into
       the 64 bytes reserved there. */
    movi    a2, _stack_top
    addi    a1, a2, -64
    addi    a3, a1, -16
    s32i    a2, a3, 4
    movi    a0, 0
    /* clear .bss */
    movi    a2, _bss_start
    movi    a3, _bss_end
    movi    a4, 0
2:  bgeu    a2, a3, 3f
    s32i    a4, a2, 0
    addi    a2, a2, 4
    j       2b
3:
    call8   xt_main
4:  j       4b

/* ---- xt_spill_windows(): write every live register window of the callers to its stack save
   area, so that the garbage collector, which scans the C stack, sees every pointer. A chain of
   call12s rotates through all 16 windows (64 physical registers); each entry overflows the oldest
   live window. Each level needs `entry a1, 48`: a call12 callee's frame must leave room for the
   caller's extra save area. ---- */
    .global xt_spill_windows
    .align  4
xt_spill_windows:
    entry   a1, 48
    call12  .Lspill1
    retw
    .align  4
.Lspill1:
    entry   a1, 48
    call12  .Lspill2
    retw
    .align  4
.Lspill2:
    entry   a1, 48
    call12  .Lspill3
    retw
    .align  4
.Lspill3:
    entry   a1, 48
    call12  .Lspill4
    retw
    .align  4
.Lspill4:
    entry   a1, 48
    call12  .Lspill5
    retw
    .align  4
.Lspill5:
    entry   a1, 48
    call12  .Lspill6
    retw
    .align  4
.Lspill6:
    entry   a1, 48
    retw

/* ---- setjmp/longjmp for the windowed ABI (jmp_buf of 17 words, as picolibc's <setjmp.h>):
   the caller's registers a0..a3 from the save area below setjmp's sp, 0-8 more from the caller's
   extra save area, the 4 words of the save area below the caller's sp, and setjmp's return address.
   Both use `entry a1, 32`: a function that call8s needs 16 bytes of its own frame for its a4..a7.
   After spilling all windows, longjmp marks every window but its own invalid, copies the saved
   words back into the save areas, and returns to setjmp's caller through the underflow handler. */
    .global setjmp
    .align  4
setjmp:
    entry   a1, 32                 /* 16 for the caller's frame area + 16: this frame call8s */
    call8   xt_spill_windows       /* a2 (jmp_buf) survives a call8 */
    /* save area at (sp - 16): the caller's a0..a3 */
    addi    a5, a1, -16
    l32i    a3, a5, 0
    l32i    a6, a5, 4
    s32i    a3, a2, 0
    s32i    a6, a2, 4
    l32i    a3, a5, 8
    l32i    a6, a5, 12
    s32i    a3, a2, 8
    s32i    a6, a2, 12
    /* 0-8 words of the caller's extra save area */
    extui   a3, a0, 30, 2
    blti    a3, 2, .Lendsj
    l32i    a7, a1, 20             /* the caller's caller's sp, at (caller's sp - 12) */
    slli    a4, a3, 4
    sub     a5, a7, a4
    addi    a6, a2, 16
    addi    a7, a7, -16
.Lsjloop:
    l32i    a3, a5, 0
    l32i    a4, a5, 4
    s32i    a3, a6, 0
    s32i    a4, a6, 4
    l32i    a3, a5, 8
    l32i    a4, a5, 12
    s32i    a3, a6, 8
    s32i    a4, a6, 12
    addi    a5, a5, 16
    addi    a6, a6, 16
    blt     a5, a7, .Lsjloop
.Lendsj:
    /* the save area below the caller's sp (setjmp's sp + 32) */
    l32i    a3, a1, 16
    l32i    a4, a1, 20
    s32i    a3, a2, 48
    s32i    a4, a2, 52
    l32i    a3, a1, 24
    l32i    a4, a1, 28
    s32i    a3, a2, 56
    s32i    a4, a2, 60
    s32i    a0, a2, 64
    movi    a2, 0
    retw

    .global longjmp
    .align  4
longjmp:
    entry   a1, 32
    call8   xt_spill_windows       /* a2 (jmp_buf) and a3 (value) survive a call8 */
    /* invalidate every window but this one */
    rsr     a5, windowbase
    movi    a6, 1
    ssl     a5
    sll     a5, a6
    wsr     a5, windowstart
    rsync
    l32i    a0, a2, 64
    addi    a7, a1, -16
    l32i    a4, a2, 0
    l32i    a5, a2, 4
    s32i    a4, a7, 0
    s32i    a5, a7, 4
    l32i    a4, a2, 8
    l32i    a5, a2, 12
    s32i    a4, a7, 8
    s32i    a5, a7, 12
    extui   a7, a0, 30, 2
    blti    a7, 2, .Lendlj
    l32i    a8, a2, 52
    slli    a4, a7, 4
    sub     a6, a8, a4
    addi    a5, a2, 16
    addi    a8, a8, -16
.Lljloop:
    l32i    a7, a5, 0
    l32i    a4, a5, 4
    s32i    a7, a6, 0
    s32i    a4, a6, 4
    l32i    a7, a5, 8
    l32i    a4, a5, 12
    s32i    a7, a6, 8
    s32i    a4, a6, 12
    addi    a5, a5, 16
    addi    a6, a6, 16
    blt     a6, a8, .Lljloop
.Lendlj:
    l32i    a7, a2, 4
    addi    a7, a7, -16
    l32i    a4, a2, 48
    l32i    a5, a2, 52
    s32i    a4, a7, 0
    s32i    a5, a7, 4
    l32i    a4, a2, 56
    l32i    a5, a2, 60
    s32i    a4, a7, 8
    s32i    a5, a7, 12
    movi    a2, 1
    movnez  a2, a3, a3
    retw
