// Elementwise kernels over up to 4-D tensors with numpy broadcasting: the caller passes the
// output's dims and each input's strides, 0 along a broadcast axis (higher ranks merged into
// 4 axes, elementwise_lowering.py). Dimension 0 of the range spans the last two axes,
// dimension 1 the first two: two divisions per element, not six.
#define OP_ADD 0
#define OP_SUB 1
#define OP_MUL 2
#define OP_DIV 3
#define OP_POW 4
#define OP_MAX 5
#define OP_MIN 6
#define OP_PRELU 7  // x >= 0 ? x : slope * x, the slope broadcast like any operand

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void binary4d(__global const DATA* x, __global const DATA* y, __global DATA* out,
              const int d1, const int d2, const int d3,
              const int xs0, const int xs1, const int xs2, const int xs3,
              const int ys0, const int ys1, const int ys2, const int ys3,
              const int op, const int act, const float a, const float b) {
    const int inner = get_global_id(0), outer = get_global_id(1);
    if (inner >= d2 * d3) return;
    const int i3 = inner % d3, i2 = inner / d3, i1 = outer % d1, i0 = outer / d1;
    const int i = outer * d2 * d3 + inner;
    const float u = LOAD_DATA(x, i0 * xs0 + i1 * xs1 + i2 * xs2 + i3 * xs3);
    const float v = LOAD_DATA(y, i0 * ys0 + i1 * ys1 + i2 * ys2 + i3 * ys3);
    float r;
    switch (op) {
    case OP_ADD: r = u + v; break;
    case OP_SUB: r = u - v; break;
    case OP_MUL: r = u * v; break;
    case OP_DIV: r = u / v; break;
    case OP_POW: r = pow(u, v); break;
    case OP_MAX: r = fmax(u, v); break;
    case OP_MIN: r = fmin(u, v); break;
    default: r = u >= 0.0f ? u : u * v; break;
    }
    STORE_DATA(activate(r, act, a, b), out, i);
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void activation(__global const DATA* x, __global DATA* out, const int total,
                const int act, const float a, const float b) {
    const int i = get_global_id(0);
    if (i < total) STORE_DATA(activate(LOAD_DATA(x, i), act, a, b), out, i);
}

// One-input math that is no fused activation (launch.UNARY): kept out of activate(), which
// every GEMM and convolution epilogue inlines, so those kernels do not carry its logic on FPGAs.
#define UNARY_NEG 0
#define UNARY_SQRT 1
#define UNARY_RECIPROCAL 2
#define UNARY_SQUARE 3
#define UNARY_ERF 4
#define UNARY_TANH 5
#define UNARY_EXP 6
#define UNARY_ABS 7
#define UNARY_LOG 8
#define UNARY_SOFTPLUS 9  // log(1 + exp(x)), without overflow for large x
#define UNARY_MISH 10     // x * tanh(softplus(x))

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void unary(__global const DATA* x, __global DATA* out, const int total, const int op) {
    const int i = get_global_id(0);
    if (i >= total) return;
    const float v = LOAD_DATA(x, i);
    float r;
    switch (op) {
    case UNARY_NEG: r = -v; break;
    case UNARY_SQRT: r = sqrt(v); break;
    case UNARY_RECIPROCAL: r = 1.0f / v; break;
    case UNARY_SQUARE: r = v * v; break;
    case UNARY_ERF: r = erf(v); break;
    case UNARY_TANH: r = tanh(v); break;
    case UNARY_EXP: r = exp(v); break;
    case UNARY_ABS: r = fabs(v); break;
    case UNARY_LOG: r = log(v); break;
    default: {
        const float softplus = fmax(v, 0.0f) + log1p(exp(-fabs(v)));
        r = op == UNARY_SOFTPLUS ? softplus : v * tanh(softplus);
    }
    }
    STORE_DATA(r, out, i);
}

// Concat's inputs, up to eight in one launch (DenseNet concatenates 5-25 inputs per layer):
// source k holds `outer` blocks of n_k values, written after the sources before it, from
// `dst_offset` of each block of `dst_stride`; `part` is the n_k's sum. Unused sources: n_k = 0.
#define CONCAT_PART(k) if (j < n##k) { dst[at] = s##k[o * n##k + j]; return; } j -= n##k;
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void concat_parts(__global BITS* dst, const int outer, const int part, const int dst_stride,
                  const int dst_offset,
                  __global const BITS* s0, const int n0, __global const BITS* s1, const int n1,
                  __global const BITS* s2, const int n2, __global const BITS* s3, const int n3,
                  __global const BITS* s4, const int n4, __global const BITS* s5, const int n5,
                  __global const BITS* s6, const int n6, __global const BITS* s7, const int n7) {
    const int i = get_global_id(0);
    if (i >= outer * part) return;
    const int o = i / part;
    int j = i % part;
    const int at = o * dst_stride + dst_offset + j;  // the sources are contiguous there
    CONCAT_PART(0) CONCAT_PART(1) CONCAT_PART(2) CONCAT_PART(3)
    CONCAT_PART(4) CONCAT_PART(5) CONCAT_PART(6) CONCAT_PART(7)
}

// A BatchNormalization that no convolution absorbs (DenseNet's BN -> ReLU -> Conv), folded at
// load time into one scale and shift per channel: out = act(x * scale[c] + shift[c]).
// Dimensions: the position in the channel's plane, then (sample, channel).
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void channel_affine(__global const DATA* x, __global const DATA* scale,
                    __global const DATA* shift, __global DATA* out, const int c,
                    const int hw, const int act, const float a, const float b) {
    const int p = get_global_id(0), nc = get_global_id(1);
    if (p >= hw) return;
    const int ch = nc % c, i = nc * hw + p;
    const float v = fma(LOAD_DATA(x, i), LOAD_DATA(scale, ch), LOAD_DATA(shift, ch));
    STORE_DATA(activate(v, act, a, b), out, i);
}

// The indices of an element of a rank-6 output (the first of `width` along the last axis) from
// the range (d5 / width, d4, d0 * d1 * d2 * d3): the two innermost come without a division.
// Declares i0..i5 and i, the element's flat index; work-items past d5 return.
#define OUTPUT_INDEX_6D(width)                                                                  \
    const int i5 = get_global_id(0) * (width), i4 = get_global_id(1);                           \
    if (i5 >= d5) return;                                                                        \
    int r = get_global_id(2);                                                                    \
    const int i = (r * d4 + i4) * d5 + i5;                                                       \
    const int i3 = r % d3; r /= d3;                                                              \
    const int i2 = r % d2; r /= d2;                                                              \
    const int i1 = r % d1, i0 = r / d1;

#define GATHER_ARGS                                                                             \
    __global const BITS *x, __global BITS *out, const int total, const int d1, const int d2,    \
        const int d3, const int d4, const int d5, const int s0, const int s1, const int s2,     \
        const int s3, const int s4, const int s5, const int offset

// A strided view of a tensor of rank <= 6 copied out contiguously: Transpose (strides
// permuted), Slice and Split (start offset, strides times steps), Expand and Tile (stride 0).
// out[i0..i5] = x[offset + sum(ik * sk)]; d1..d5 are the output's dims after the first.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void gather_strided(GATHER_ARGS) {
    OUTPUT_INDEX_6D(1)
    out[i] = x[offset + i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3 + i4 * s4 + i5 * s5];
}

// The same where the last axis is contiguous in x (s5 = 1) and d5 a multiple of VN (attention's
// heads, a ViT's token transposes): VN values per work-item, as one vector (one value per
// work-item moved under 2 GB/s on PoCL).
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void gather_strided_vec(GATHER_ARGS) {
    OUTPUT_INDEX_6D(VN)
    CAT(vstore, VN)(CAT(vload, VN)(0, x + offset + i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3
                                        + i4 * s4 + i5), 0, out + i);
}

// Pad (rank <= 6): out[i] = x[i - begin], positions outside x taking `value` (mode constant;
// negative amounts crop) or mirrored (reflect: TResNet's blur pool), clamped (edge) or wrapped
// around (wrap) into it. d1..d5: the output's dims after the first; n0..n5: the input's;
// b0..b5: the amounts before each axis.
#define PAD_CONSTANT 0
#define PAD_REFLECT 1
#define PAD_EDGE 2
#define PAD_WRAP 3
inline int pad_source(const int j, const int n, const int mode) {
    switch (mode) {
    case PAD_REFLECT: return j < 0 ? -j : j >= n ? 2 * (n - 1) - j : j;
    case PAD_EDGE: return clamp(j, 0, n - 1);
    case PAD_WRAP: return (j % n + n) % n;
    default: return j;
    }
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void pad(__global const DATA* x, __global DATA* out, const int d1, const int d2, const int d3,
         const int d4, const int d5, const int n0, const int n1, const int n2, const int n3,
         const int n4, const int n5, const int b0, const int b1, const int b2, const int b3,
         const int b4, const int b5, const float value, const int mode) {
    OUTPUT_INDEX_6D(1)
    const int j0 = pad_source(i0 - b0, n0, mode), j1 = pad_source(i1 - b1, n1, mode),
              j2 = pad_source(i2 - b2, n2, mode), j3 = pad_source(i3 - b3, n3, mode),
              j4 = pad_source(i4 - b4, n4, mode), j5 = pad_source(i5 - b5, n5, mode);
    // One unsigned comparison per axis: a negative index wraps above the size.
    if ((uint)j0 < (uint)n0 && (uint)j1 < (uint)n1 && (uint)j2 < (uint)n2 && (uint)j3 < (uint)n3
            && (uint)j4 < (uint)n4 && (uint)j5 < (uint)n5)
        STORE_DATA(LOAD_DATA(x, ((((j0 * n1 + j1) * n2 + j2) * n3 + j3) * n4 + j4) * n5 + j5),
                   out, i);
    else
        STORE_DATA(value, out, i);
}
