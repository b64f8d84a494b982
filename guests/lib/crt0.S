/* guests/lib/crt0.S: guest entry at the first byte of the image (CPL3, 64-bit).
 * rdi = vCPU index, rsi = vCPU count, rdx = guest argument, rsp = this vCPU's stack. */
  .section .text.entry, "ax"
  .globl _start
_start:
  andq $-16, %rsp
  xorl %ebp, %ebp
  call guest_main
  movl %eax, %edi
  call debug_exit
1:
  int3
  jmp 1b
