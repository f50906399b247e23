#define MEDFAST_KERNEL_ISA generic
#define MEDFAST_KERNEL_FLOATS 4
#include "direct_conv_kernel.inc"
