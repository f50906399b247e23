#define MEDFAST_KERNEL_ISA avx2
#define MEDFAST_KERNEL_FLOATS 8
#include "direct_conv_kernel.inc"
