// GEMM for fully connected layers and convolutions: C = act(A x B + bias), row-major, batched
// over z = batch * groups + group with a stride per batch and per group for each operand.
// A work-item owns a TM x VN register tile: VN contiguous columns loaded as one vector per k
// (PoCL maps float16 onto AVX-512 registers) and TM rows each broadcast from A.
#ifndef VN
#define VN 16
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define VEC CAT(float, VN)
#define VLOAD CAT(vload, VN)
#define VSTORE CAT(vstore, VN)
#ifndef GEMM_WG
#define GEMM_WG 8
#endif

#define BIAS_NONE 0
#define BIAS_ROW 1
#define BIAS_COL 2

inline void gemm_tile(__global const float* A, __global const float* B,
                      __global const float* bias, __global float* C, const int M, const int N,
                      const int K, const int lda, const int ldb, const int ldc, const int groups,
                      const int a_batch, const int a_group, const int b_batch, const int b_group,
                      const int c_batch, const int c_group, const int bias_mode, const int act,
                      const float alpha, const float beta, const int tm) {
    const int n0 = get_global_id(0) * VN, m0 = get_global_id(1) * tm, z = get_global_id(2);
    if (n0 >= N || m0 >= M) return;
    const int bi = z / groups, g = z % groups;
    A += bi * a_batch + g * a_group;
    B += bi * b_batch + g * b_group;
    C += bi * c_batch + g * c_group;
    // Rows past M repeat the last row (never stored), so the tile stays branch-free.
    __global const float* rows[8];
    for (int t = 0; t < tm; ++t) rows[t] = A + min(m0 + t, M - 1) * lda;
    if (n0 + VN <= N) {
        VEC acc[8];
        for (int t = 0; t < tm; ++t) acc[t] = (VEC)(0.0f);
        for (int k = 0; k < K; ++k) {
            const VEC bv = VLOAD(0, B + k * ldb + n0);
            for (int t = 0; t < tm; ++t) acc[t] = mad((VEC)(rows[t][k]), bv, acc[t]);
        }
        for (int t = 0; t < tm && m0 + t < M; ++t) {
            VEC r = acc[t];
            if (bias_mode == BIAS_ROW) r += (VEC)(bias[g * M + m0 + t]);
            else if (bias_mode == BIAS_COL) r += VLOAD(0, bias + n0);
            float out[VN];
            VSTORE(r, 0, out);
            for (int j = 0; j < VN; ++j) out[j] = activate(out[j], act, alpha, beta);
            VSTORE(VLOAD(0, out), 0, C + (m0 + t) * ldc + n0);
        }
        return;
    }
    // The last, partial column tile.
    for (int t = 0; t < tm && m0 + t < M; ++t) {
        for (int n = n0; n < N; ++n) {
            float s = 0.0f;
            for (int k = 0; k < K; ++k) s = mad(rows[t][k], B[k * ldb + n], s);
            if (bias_mode == BIAS_ROW) s += bias[g * M + m0 + t];
            else if (bias_mode == BIAS_COL) s += bias[n];
            C[(m0 + t) * ldc + n] = activate(s, act, alpha, beta);
        }
    }
}

#define GEMM_ARGS                                                                              \
    __global const float *A, __global const float *B, __global const float *bias,             \
        __global float *C, const int M, const int N, const int K, const int lda,              \
        const int ldb, const int ldc, const int groups, const int a_batch, const int a_group, \
        const int b_batch, const int b_group, const int c_batch, const int c_group,           \
        const int bias_mode, const int act, const float alpha, const float beta
#define GEMM_PASS A, B, bias, C, M, N, K, lda, ldb, ldc, groups, a_batch, a_group, b_batch, \
    b_group, c_batch, c_group, bias_mode, act, alpha, beta

// Eight rows per work-item: convolutions and batched fully connected layers.
__kernel __attribute__((reqd_work_group_size(GEMM_WG, 1, 1)))
void gemm8(GEMM_ARGS) { gemm_tile(GEMM_PASS, 8); }

// One row per work-item: a single sample through a fully connected layer, depthwise groups.
__kernel __attribute__((reqd_work_group_size(GEMM_WG, 1, 1)))
void gemm1(GEMM_ARGS) { gemm_tile(GEMM_PASS, 1); }
