// GEMM for fully connected layers and convolutions: C = act(A x B + bias), row-major, batched
// over z = batch * groups + group with a stride per batch and per group for each operand.
// A work-item owns a TM x VN register tile: VN contiguous columns of B loaded as one vector per
// k (two ymm registers with AVX2, one zmm with AVX-512), each of the TM rows of A broadcast
// into it.
// Dimension 0 of the range walks the tiles along whichever operand is larger (`rows_first`:
// row tiles, when B is the larger), so the work-items running together share that operand's
// slice in cache and it is read from memory about once.
#define VEC CAT(float, VN)
#define VLOAD CAT(vload, VN)
#define VSTORE CAT(vstore, VN)
#ifndef GEMM_WG
#define GEMM_WG 4
#endif

#define BIAS_NONE 0
#define BIAS_ROW 1
#define BIAS_COL 2

#define GEMM_ARGS                                                                              \
    __global const DATA *A, __global const DATA *B, __global const DATA *bias,                \
        __global DATA *C, const int M, const int N, const int K, const int lda,               \
        const int ldb, const int ldc, const int groups, const int a_batch, const int a_group, \
        const int b_batch, const int b_group, const int c_batch, const int c_group,           \
        const int bias_mode, const int act, const float alpha, const float beta,           \
        const int rows_first

inline VEC activate_vec(VEC x, const int act, const float a, const float b) {
    switch (act) {
    case ACT_RELU: return fmax(x, (VEC)(0.0f));
    case ACT_LEAKY_RELU: return select(x * a, x, x >= (VEC)(0.0f));
    case ACT_CLIP: return fmin(fmax(x, (VEC)(a)), (VEC)(b));
    case ACT_SIGMOID: return (VEC)(1.0f) / ((VEC)(1.0f) + exp(-x));
    case ACT_HARD_SIGMOID: return clamp(x * a + b, 0.0f, 1.0f);
    case ACT_HARD_SWISH: return x * clamp(x * (1.0f / 6.0f) + 0.5f, 0.0f, 1.0f);
    case ACT_SILU: return x / ((VEC)(1.0f) + exp(-x));
    case ACT_GELU: return 0.5f * x * (1.0f + erf(x * M_SQRT1_2_F));
    case ACT_GELU_TANH:
        return 0.5f * x * (1.0f + tanh(0.7978845608f * fma(0.044715f * x, x * x, x)));
    default: return x;
    }
}

// The local tiles' type (gemm_local, conv_local). With -DHALF_COMPUTE (an fp16 model on a
// device with cl_khr_fp16) they hold halves, taking half the local memory, and each tile's
// products are summed in half arithmetic; the tiles' sums are added in float, so a long dot
// product (MNIST's 9216) keeps about float's accuracy. Otherwise float throughout.
#ifdef HALF_COMPUTE
#define MAC_T half
#define LOAD_MAC(p, i) ((p)[i])
#else
#define MAC_T float
#define LOAD_MAC(p, i) LOAD_DATA(p, i)
#endif

// im2col's element for row k = (channel, ky, kx) of the window whose top-left is (iy0, ix0).
inline MAC_T implicit_col(__global const DATA* x, const int k, const int iy0, const int ix0,
                          const int h, const int w, const int kh, const int kw, const int dh,
                          const int dw) {
    const int kx = k % kw, ky = (k / kw) % kh, c = k / (kw * kh);
    const int iy = iy0 + ky * dh, ix = ix0 + kx * dw;
    return iy >= 0 && iy < h && ix >= 0 && ix < w ? LOAD_MAC(x, (c * h + iy) * w + ix) : 0;
}

// Stores one finished row of a tile: bias, activation, vector store.
inline void store_row(VEC r, __global DATA* C, __global const DATA* bias, const int g,
                      const int M, const int m, const int n0, const int ldc,
                      const int bias_mode, const int act, const float alpha, const float beta) {
    if (m >= M) return;
    if (bias_mode == BIAS_ROW) r += (VEC)(LOAD_DATA(bias, g * M + m));
    else if (bias_mode == BIAS_COL) r += VLOAD_DATA(VN, bias + n0);
    VSTORE_DATA(VN, activate_vec(r, act, alpha, beta), C + m * ldc + n0);
}

// The last, partial column tile, one scalar at a time.
inline void gemm_edge(__global const DATA* A, __global const DATA* B,
                      __global const DATA* bias, __global DATA* C, const int M, const int N,
                      const int K, const int lda, const int ldb, const int ldc, const int g,
                      const int m0, const int tm, const int n0, const int bias_mode,
                      const int act, const float alpha, const float beta) {
    for (int m = m0; m < min(m0 + tm, M); ++m) {
        for (int n = n0; n < N; ++n) {
            float s = 0.0f;
            for (int k = 0; k < K; ++k)
                s = fma(LOAD_DATA(A, m * lda + k), LOAD_DATA(B, k * ldb + n), s);
            if (bias_mode == BIAS_ROW) s += LOAD_DATA(bias, g * M + m);
            else if (bias_mode == BIAS_COL) s += LOAD_DATA(bias, n);
            STORE_DATA(activate(s, act, alpha, beta), C, m * ldc + n);
        }
    }
}

#define GEMM_PROLOGUE(TM)                                                                     \
    const int g0 = get_global_id(0), g1 = get_global_id(1), z = get_global_id(2);            \
    const int m0 = (rows_first ? g0 : g1) * TM, n0 = (rows_first ? g1 : g0) * VN;            \
    if (m0 >= M || n0 >= N) return;                                                           \
    const int bi = z / groups, g = z % groups;                                                \
    A += bi * a_batch + g * a_group;                                                          \
    B += bi * b_batch + g * b_group;                                                          \
    C += bi * c_batch + g * c_group;                                                          \
    if (n0 + VN > N) {                                                                        \
        gemm_edge(A, B, bias, C, M, N, K, lda, ldb, ldc, g, m0, TM, n0, bias_mode, act,      \
                  alpha, beta);                                                               \
        return;                                                                               \
    }

// Rows past M repeat the last row (never stored), so the tile stays branch-free.
#define ROW(t) __global const DATA* a##t = A + min(m0 + t, M - 1) * lda; VEC c##t = (VEC)(0.0f);
#define FMA(t) c##t = fma((VEC)(LOAD_DATA(a##t, k)), b, c##t);
#define STORE(t) store_row(c##t, C, bias, g, M, m0 + t, n0, ldc, bias_mode, act, alpha, beta);

// TM rows per work-item (a build macro, launch.Build.rows): convolutions and batched fully
// connected layers. The TM x VN accumulators must stay in registers with room for B's vector
// and the broadcast: 6 x 16 on AVX2 (12 of its 16 ymm registers, the shape of BLAS kernels
// for AVX2), 8 x 16 with AVX-512's 32 registers.
#ifndef TM
#define TM 8
#endif
#if TM == 6
#define EACH_ROW(X) X(0) X(1) X(2) X(3) X(4) X(5)
#elif TM == 8
#define EACH_ROW(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#else
#error "TM must be 6 or 8"
#endif
__kernel __attribute__((reqd_work_group_size(GEMM_WG, 1, 1)))
void gemm_tile(GEMM_ARGS) {
    GEMM_PROLOGUE(TM)
    EACH_ROW(ROW)
    for (int k = 0; k < K; ++k) {
        const VEC b = VLOAD_DATA(VN, B + k * ldb + n0);
        EACH_ROW(FMA)
    }
    EACH_ROW(STORE)
}

// One row per work-item: a single sample through a fully connected layer, depthwise groups.
__kernel __attribute__((reqd_work_group_size(GEMM_WG, 1, 1)))
void gemm1(GEMM_ARGS) {
    GEMM_PROLOGUE(1)
    ROW(0)
    for (int k = 0; k < K; ++k) {
        const VEC b = VLOAD_DATA(VN, B + k * ldb + n0);
        FMA(0)
    }
    STORE(0)
}

// The same GEMM with local-memory tiling, for GPUs and FPGAs: a work-group stages TS x TS tiles
// of A and B in local memory and each work-item accumulates WPT rows of one column in registers
// (zero-filled past the edges, so every work-item reaches every barrier). TS and WPT come from
// the build (launch.LocalTiling: sized from the device's work-group and local-memory limits).
#ifndef TS
#define TS 32
#endif
#ifndef WPT
#define WPT 8
#endif
#define RTS (TS / WPT)

// The body of gemm_local and conv_local; LOAD_B(k, n) reads B's element k, n (in range).
#define LOCAL_TILED_GEMM(LOAD_B)                                                              \
    __local MAC_T a_tile[TS][TS], b_tile[TS][TS];                                             \
    float acc[WPT];                                                                           \
    for (int t = 0; t < WPT; ++t) acc[t] = 0.0f;                                              \
    for (int k0 = 0; k0 < K; k0 += TS) {                                                      \
        for (int t = 0; t < WPT; ++t) {                                                       \
            const int r = ty + t * RTS, m = m_base + r;                                       \
            a_tile[r][tx] = (m < M && k0 + tx < K) ? LOAD_MAC(A, m * lda + k0 + tx) : 0;      \
            b_tile[r][tx] = (k0 + r < K && n < N) ? LOAD_B(k0 + r, n) : 0;                    \
        }                                                                                     \
        barrier(CLK_LOCAL_MEM_FENCE);                                                         \
        MAC_T part[WPT];                                                                      \
        for (int t = 0; t < WPT; ++t) part[t] = 0;                                            \
        for (int kk = 0; kk < TS; ++kk) {                                                     \
            const MAC_T b = b_tile[kk][tx];                                                   \
            for (int t = 0; t < WPT; ++t) part[t] = fma(a_tile[ty + t * RTS][kk], b, part[t]); \
        }                                                                                     \
        for (int t = 0; t < WPT; ++t) acc[t] += part[t];                                      \
        barrier(CLK_LOCAL_MEM_FENCE);                                                         \
    }                                                                                         \
    for (int t = 0; t < WPT; ++t) {                                                           \
        const int m = m_base + ty + t * RTS;                                                  \
        if (m >= M || n >= N) continue;                                                       \
        float s = acc[t];                                                                     \
        if (bias_mode == BIAS_ROW) s += LOAD_DATA(bias, g * M + m);                           \
        else if (bias_mode == BIAS_COL) s += LOAD_DATA(bias, n);                              \
        STORE_DATA(activate(s, act, alpha, beta), C, m * ldc + n);                            \
    }

__kernel __attribute__((reqd_work_group_size(TS, RTS, 1)))
void gemm_local(GEMM_ARGS) {
    const int tx = get_local_id(0), ty = get_local_id(1), z = get_global_id(2);
    const int n = get_group_id(0) * TS + tx, m_base = get_group_id(1) * TS;
    const int bi = z / groups, g = z % groups;
    A += bi * a_batch + g * a_group;
    B += bi * b_batch + g * b_group;
    C += bi * c_batch + g * c_group;
#define LOAD_B_MATRIX(k, n) LOAD_MAC(B, (k) * ldb + (n))
    LOCAL_TILED_GEMM(LOAD_B_MATRIX)
}

// Convolution as an implicit GEMM (no im2col buffer): B's element (k, n) is read from the input
// where im2col would have put it, k = (channel in group, ky, kx), n = (oy, ox), zero in the
// padding. z = sample * groups + group; A holds each group's weights (M rows of K).
__kernel __attribute__((reqd_work_group_size(TS, RTS, 1)))
void conv_local(__global const DATA* x, __global const DATA* A, __global const DATA* bias,
                __global DATA* C, const int M, const int N, const int K, const int groups,
                const int c_per_group, const int h, const int w, const int oh, const int ow,
                const int kh, const int kw, const int sh, const int sw, const int ph,
                const int pw, const int dh, const int dw, const int bias_mode, const int act,
                const float alpha, const float beta) {
    const int tx = get_local_id(0), ty = get_local_id(1), z = get_global_id(2);
    const int n = get_group_id(0) * TS + tx, m_base = get_group_id(1) * TS;
    const int g = z % groups, lda = K, ldc = N;
    A += g * M * K;
    C += z * M * N;
    x += z * c_per_group * h * w;
    // This work-item's column: one output pixel, the top-left of its window.
    const int iy0 = (n / ow) * sh - ph, ix0 = (n % ow) * sw - pw;
#define LOAD_B_IMPLICIT(k, n) implicit_col(x, k, iy0, ix0, h, w, kh, kw, dh, dw)
    LOCAL_TILED_GEMM(LOAD_B_IMPLICIT)
}
// One sample through a wide fully connected layer (M = 1, large K): too few column tiles to
// keep the cores busy, so K is split into `splits` chunks whose partial sums a second kernel
// adds up with the bias and activation. partial[s][n] for chunk s.
__kernel __attribute__((reqd_work_group_size(GEMM_WG, 1, 1)))
void gemv_partial(__global const DATA* a, __global const DATA* B, __global DATA* partial,
                  const int N, const int K, const int ldb, const int chunk) {
    const int n0 = get_global_id(0) * VN, s = get_global_id(1);
    if (n0 >= N) return;
    const int k_end = min(K, (s + 1) * chunk);
    if (n0 + VN <= N) {
        VEC acc = (VEC)(0.0f);
        for (int k = s * chunk; k < k_end; ++k)
            acc = fma((VEC)(LOAD_DATA(a, k)), VLOAD_DATA(VN, B + k * ldb + n0), acc);
        VSTORE_DATA(VN, acc, partial + s * N + n0);
        return;
    }
    for (int n = n0; n < N; ++n) {
        float acc = 0.0f;
        for (int k = s * chunk; k < k_end; ++k)
            acc = fma(LOAD_DATA(a, k), LOAD_DATA(B, k * ldb + n), acc);
        STORE_DATA(acc, partial, s * N + n);
    }
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void gemv_reduce(__global const DATA* partial, __global const DATA* bias,
                 __global DATA* out, const int N, const int splits, const int has_bias,
                 const int act, const float alpha, const float beta) {
    const int n = get_global_id(0);
    if (n >= N) return;
    float s = has_bias ? LOAD_DATA(bias, n) : 0.0f;
    for (int i = 0; i < splits; ++i) s += LOAD_DATA(partial, i * N + n);
    STORE_DATA(activate(s, act, alpha, beta), out, n);
}
