// Shared by every hetserve kernel: fused activations and the work-group sizes kernels declare.
// Sizes of tensors are always kernel arguments, so one binary serves every shape (FPGAs need
// that); work-group sizes are compile-time so FPGA compilers can size their pipelines.
#ifndef WG_1D
#define WG_1D 64
#endif

#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_LEAKY_RELU 2
#define ACT_CLIP 3
#define ACT_SIGMOID 4
#define ACT_HARD_SIGMOID 5  // max(0, min(1, a * x + b))
#define ACT_HARD_SWISH 6    // x * hard_sigmoid(x) with a = 1/6, b = 1/2
#define ACT_SILU 7          // x * sigmoid(x): EfficientNet's Swish, Sigmoid and Mul in ONNX

inline float activate(float x, int act, float a, float b) {
    switch (act) {
    case ACT_RELU: return fmax(x, 0.0f);
    case ACT_LEAKY_RELU: return x >= 0.0f ? x : a * x;
    case ACT_CLIP: return fmin(fmax(x, a), b);
    case ACT_SIGMOID: return 1.0f / (1.0f + exp(-x));
    case ACT_HARD_SIGMOID: return clamp(fma(a, x, b), 0.0f, 1.0f);
    case ACT_HARD_SWISH: return x * clamp(fma(x, 1.0f / 6.0f, 0.5f), 0.0f, 1.0f);
    case ACT_SILU: return x / (1.0f + exp(-x));
    default: return x;
    }
}
