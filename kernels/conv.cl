// Convolution as im2col + GEMM (gemm.cl): col[z][k][n] for z = batch * groups + group,
// k = (channel in group, ky, kx), n = (oy, ox); `pad` where the window leaves the input.
// A work-item fills one row k of one z: index arithmetic once per row, not per element.
// Two instances: tensors of floats or halves, copied as their bits (pad 0 is the same in both),
// and int8 codes (quantized.cl), where the padding is the input's zero point.
#define IM2COL(NAME, T, EXTRA_ARGS)                                                            \
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))                                   \
void NAME(__global const T* x, __global T* col, const int c_per_group, const int h,          \
          const int w, const int oh, const int ow, const int kh, const int kw, const int sh,  \
          const int sw, const int ph, const int pw, const int dh, const int dw EXTRA_ARGS) {  \
    const int k = get_global_id(0), z = get_global_id(1);                                    \
    if (k >= c_per_group * kh * kw) return;                                                   \
    const int kx = k % kw, ky = (k / kw) % kh, c = k / (kw * kh);                             \
    __global const T* plane = x + (z * c_per_group + c) * h * w;                             \
    __global T* row = col + (z * c_per_group * kh * kw + k) * oh * ow;                       \
    /* Output columns whose input column lies inside the row: [ox_lo, ox_hi); padding        \
       elsewhere, and a plain strided copy between (a vectorizable one for stride 1). */      \
    const int off = kx * dw - pw;                                                             \
    const int ox_lo = clamp((-off + sw - 1) / sw, 0, ow);                                     \
    const int ox_hi = clamp(off >= w ? 0 : (w - 1 - off) / sw + 1, ox_lo, ow);                \
    for (int oy = 0; oy < oh; ++oy) {                                                         \
        const int iy = oy * sh - ph + ky * dh;                                                \
        __global T* out = row + oy * ow;                                                      \
        if (iy < 0 || iy >= h) {                                                              \
            for (int ox = 0; ox < ow; ++ox) out[ox] = PAD;                                    \
            continue;                                                                         \
        }                                                                                     \
        __global const T* in = plane + iy * w + off;                                          \
        for (int ox = 0; ox < ox_lo; ++ox) out[ox] = PAD;                                     \
        if (sw == 1) {                                                                        \
            for (int ox = ox_lo; ox < ox_hi; ++ox) out[ox] = in[ox];                          \
        } else {                                                                              \
            for (int ox = ox_lo; ox < ox_hi; ++ox) out[ox] = in[ox * sw];                     \
        }                                                                                     \
        for (int ox = ox_hi; ox < ow; ++ox) out[ox] = PAD;                                    \
    }                                                                                         \
}

#define PAD 0
IM2COL(im2col, BITS, )
#undef PAD

// Depthwise convolution (groups = input channels, `mult` output channels each) on GPUs and
// FPGAs, directly: a work-item computes one output pixel of one output channel (dimension 0:
// the pixel, so neighbours read neighbouring inputs; dimension 1: sample x output channel).
// Through the local tiles it would be one-row GEMMs in 32- or 64-row tiles.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void conv_depthwise(__global const DATA* x, __global const DATA* wt,
                    __global const DATA* bias, __global DATA* out, const int c_in,
                    const int mult, const int h, const int w, const int oh, const int ow,
                    const int kh, const int kw, const int sh, const int sw, const int ph,
                    const int pw, const int dh, const int dw, const int has_bias,
                    const int act, const float a, const float b) {
    const int p = get_global_id(0), nc = get_global_id(1);
    if (p >= oh * ow) return;
    const int c_out = c_in * mult, oc = nc % c_out, n = nc / c_out;
    const int oy = p / ow, ox = p % ow;
    __global const DATA* plane = x + (n * c_in + oc / mult) * h * w;
    __global const DATA* k = wt + oc * kh * kw;
    float acc = has_bias ? LOAD_DATA(bias, oc) : 0.0f;
    for (int ky = 0; ky < kh; ++ky) {
        const int iy = oy * sh - ph + ky * dh;
        if (iy < 0 || iy >= h) continue;
        for (int kx = 0; kx < kw; ++kx) {
            const int ix = ox * sw - pw + kx * dw;
            if (ix >= 0 && ix < w)
                acc = fma(LOAD_DATA(k, ky * kw + kx), LOAD_DATA(plane, iy * w + ix), acc);
        }
    }
    STORE_DATA(activate(acc, act, a, b), out, nc * oh * ow + p);
}

// ConvTranspose (a decoder's upsampling) gathered per output pixel: each work-item sums, over
// its group's input channels and the kernel taps whose stride grid lands on its pixel, input x
// weight, then bias and a fused activation. Weights as ONNX stores them, (C_in, C_out / group,
// kh, kw); pads are the output's crop at the start (ph, pw). Every stride, dilation, group and
// output padding: the caller sizes the output (oh, ow). A 1-D one runs with h = kh = 1.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void conv_transpose(__global const DATA* x, __global const DATA* wt,
                    __global const DATA* bias, __global DATA* out, const int c_in,
                    const int c_out, const int groups, const int h, const int w, const int oh,
                    const int ow, const int kh, const int kw, const int sh, const int sw,
                    const int ph, const int pw, const int dh, const int dw, const int has_bias,
                    const int act, const float a, const float b) {
    const int p = get_global_id(0), nc = get_global_id(1);
    if (p >= oh * ow) return;
    const int oc = nc % c_out, n = nc / c_out;
    const int cg_in = c_in / groups, cg_out = c_out / groups;
    const int g = oc / cg_out, m = oc % cg_out;
    const int oy = p / ow, ox = p % ow;
    float acc = has_bias ? LOAD_DATA(bias, oc) : 0.0f;
    for (int c = 0; c < cg_in; ++c) {
        const int ic = g * cg_in + c;
        __global const DATA* plane = x + (n * c_in + ic) * h * w;
        __global const DATA* k = wt + (ic * cg_out + m) * kh * kw;
        for (int ky = 0; ky < kh; ++ky) {
            const int ty = oy + ph - ky * dh;
            if (ty < 0 || ty % sh != 0 || ty / sh >= h) continue;
            for (int kx = 0; kx < kw; ++kx) {
                const int tx = ox + pw - kx * dw;
                if (tx < 0 || tx % sw != 0 || tx / sw >= w) continue;
                acc = fma(LOAD_DATA(k, ky * kw + kx), LOAD_DATA(plane, ty / sh * w + tx / sw),
                          acc);
            }
        }
    }
    STORE_DATA(activate(acc, act, a, b), out, nc * oh * ow + p);
}
