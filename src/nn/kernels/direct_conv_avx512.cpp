#define MEDFAST_KERNEL_ISA avx512
#define MEDFAST_KERNEL_FLOATS 16
#include "direct_conv_kernel.inc"
