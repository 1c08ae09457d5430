// Shared by every hetserve kernel: fused activations and the work-group sizes kernels declare.
// Sizes of tensors are always kernel arguments, so one binary serves every shape (FPGAs need
// that); work-group sizes are compile-time so FPGA compilers can size their pipelines.
#ifndef WG_1D
#define WG_1D 64
#endif
#ifndef VN  // the vector width of the GEMM tiles and vector copies (launch.VN)
#define VN 16
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

// How tensors are stored. Built with -DHALF_STORAGE (an fp16 model, on any device): every
// tensor and weight is a 16-bit half in memory, halving the traffic, and is converted to float
// on load and rounded on store (to nearest even: OpenCL C's default rounding mode; the
// _rte forms measured 1.7x slower on PoCL) by vload_half/vstore_half, which are core OpenCL
// (no cl_khr_fp16 needed). Arithmetic stays float, except in the local-memory tiles with
// -DHALF_COMPUTE (devices that announce cl_khr_fp16; gemm.cl). Kernels that only move values
// copy them as BITS of the same width. DATA pointers are read with LOAD_DATA and written with
// STORE_DATA.
#ifdef HALF_COMPUTE
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#ifndef HALF_STORAGE
#define HALF_STORAGE
#endif
#endif
#ifdef HALF_STORAGE
#define DATA half
#define BITS ushort
#define LOAD_DATA(p, i) vload_half((i), (p))
#define STORE_DATA(v, p, i) vstore_half((v), (i), (p))
#define VLOAD_DATA(n, p) CAT(vload_half, n)(0, (p))
#define VSTORE_DATA(n, v, p) CAT(vstore_half, n)((v), 0, (p))
#else
#define DATA float
#define BITS float
#define LOAD_DATA(p, i) ((p)[i])
#define STORE_DATA(v, p, i) ((p)[i] = (v))
#define VLOAD_DATA(n, p) CAT(vload, n)(0, (p))
#define VSTORE_DATA(n, v, p) CAT(vstore, n)((v), 0, (p))
#endif

// The storage a program was built for, as a kernel the engine requires (program_cache.py): a
// precompiled FPGA binary built for the other storage is refused at load, naming this kernel,
// instead of reading halves as floats.
#ifdef HALF_STORAGE
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void storage_fp16(void) {}
#else
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void storage_fp32(void) {}
#endif

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_LEAKY_RELU 2
#define ACT_CLIP 3
#define ACT_SIGMOID 4
#define ACT_HARD_SIGMOID 5  // max(0, min(1, a * x + b))
#define ACT_HARD_SWISH 6    // x * hard_sigmoid(x) with a = 1/6, b = 1/2
#define ACT_SILU 7          // x * sigmoid(x): EfficientNet's Swish, Sigmoid and Mul in ONNX
#define ACT_GELU 8          // x * Phi(x) = x (1 + erf(x / sqrt(2))) / 2: transformers' exact GELU
#define ACT_GELU_TANH 9     // x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2

inline float activate(float x, int act, float a, float b) {
    switch (act) {
    case ACT_RELU: return fmax(x, 0.0f);
    case ACT_LEAKY_RELU: return x >= 0.0f ? x : a * x;
    case ACT_CLIP: return fmin(fmax(x, a), b);
    case ACT_SIGMOID: return 1.0f / (1.0f + exp(-x));
    case ACT_HARD_SIGMOID: return clamp(fma(a, x, b), 0.0f, 1.0f);
    case ACT_HARD_SWISH: return x * clamp(fma(x, 1.0f / 6.0f, 0.5f), 0.0f, 1.0f);
    case ACT_SILU: return x / (1.0f + exp(-x));
    case ACT_GELU: return 0.5f * x * (1.0f + erf(x * M_SQRT1_2_F));
    case ACT_GELU_TANH:
        return 0.5f * x * (1.0f + tanh(0.7978845608f * fma(0.044715f * x, x * x, x)));
    default: return x;
    }
}
