// int8 inference for models quantized to QDQ ONNX (onnxruntime.quantization): int8 weights with
// one scale per output channel (zero point 0), activations quantized with one scale and zero
// point per tensor as ONNX QuantizeLinear does (round half to even, saturate). Stored activation
// codes are signed chars q' = q - shift (shift 128 for uint8 tensors), so one kernel serves
// uint8 and int8 activations: zq, lo, hi below are already shifted. Products are int8 x int8,
// accumulated in int32; the epilogue turns the sum into fp32 with the per-channel scale, adds
// the bias, applies the fused activation and, where the model re-quantizes the output, rounds
// it onto the output's grid (ONNX Q then DQ), so results match onnxruntime's QDQ execution.
#define QUANTIZE(v) ((char)clamp((int)rint((v) / qscale) + zq, lo, hi))

// Quantizing im2col (conv.cl's IM2COL): the padding is the zero point.
#define PAD ((char)zq)
#define QUANT_ARGS , const float qscale, const int zq, const int lo, const int hi
IM2COL(im2col_q8, char, QUANTIZE, QUANT_ARGS)
#undef PAD

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void quantize_q8(__global const float* x, __global char* out, const int total,
                 const float qscale, const int zq, const int lo, const int hi) {
    const int i = get_global_id(0);
    if (i < total) out[i] = QUANTIZE(x[i]);
}

// ONNX QuantizeLinear then DequantizeLinear of one tensor: y = (sat(rint(x / s) + z) - z) * s.
inline float fake_quant(float x, const float s, const int z, const int lo, const int hi) {
    return (float)(clamp((int)rint(x / s) + z, lo, hi) - z) * s;
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void fake_quant_f32(__global const float* x, __global float* out, const int total,
                    const float s, const int z, const int lo, const int hi) {
    const int i = get_global_id(0);
    if (i < total) out[i] = fake_quant(x[i], s, z, lo, hi);
}

// C = epilogue(sum_k A[m][k] * B[k][n]), batched over z = batch * groups + group like gemm.cl.
// The channel is the row m (`per_row`: convolutions, weights are A) or the column n (fully
// connected layers, weights are B); for it, `scale` is activation scale x weight scale and
// `offset` the activation's zero point times the weights' sum over k, which the int32 sum of
// products minus `offset` turns into the sum with the zero point removed.
#define GEMM_Q8_ARGS                                                                          \
    __global const char *A, __global const char *B, __global const float *scale,             \
        __global const int *offset, __global const float *bias, __global float *C,           \
        const int M, const int N, const int K, const int lda, const int ldb, const int ldc,  \
        const int groups, const int a_batch, const int a_group, const int b_batch,           \
        const int b_group, const int c_batch, const int c_group, const int per_row,          \
        const int has_bias, const int act, const float alpha, const float beta,              \
        const int requant, const float out_scale, const int out_zero, const int out_lo,      \
        const int out_hi

inline float q8_epilogue(const int acc, const int m, const int n, const int g, const int M,
                         __global const float* scale, __global const int* offset,
                         __global const float* bias, const int per_row, const int has_bias,
                         const int act, const float alpha, const float beta, const int requant,
                         const float out_scale, const int out_zero, const int out_lo,
                         const int out_hi) {
    const int ch = per_row ? g * M + m : n;
    float r = (float)(acc - offset[ch]) * scale[ch];
    if (has_bias) r += bias[ch];
    r = activate(r, act, alpha, beta);
    return requant ? fake_quant(r, out_scale, out_zero, out_lo, out_hi) : r;
}

#define Q8_TM 4
// A work-item owns Q8_TM rows x VN columns: VN int8 codes of B widened to one int vector per
// k, each row's A code broadcast into it; the last, partial column tile one scalar at a time.
__kernel __attribute__((reqd_work_group_size(GEMM_WG, 1, 1)))
void gemm_q8(GEMM_Q8_ARGS) {
    const int n0 = get_global_id(0) * VN, m0 = get_global_id(1) * Q8_TM, z = get_global_id(2);
    if (m0 >= M || n0 >= N) return;
    const int bi = z / groups, g = z % groups;
    A += bi * a_batch + g * a_group;
    B += bi * b_batch + g * b_group;
    C += bi * c_batch + g * c_group;
    const int rows = min(Q8_TM, M - m0);
    if (n0 + VN <= N) {
        CAT(int, VN) acc[Q8_TM];
        for (int t = 0; t < Q8_TM; ++t) acc[t] = (CAT(int, VN))(0);
        for (int k = 0; k < K; ++k) {
            const CAT(int, VN) b = CAT(convert_int, VN)(CAT(vload, VN)(0, B + k * ldb + n0));
            for (int t = 0; t < Q8_TM; ++t)
                acc[t] += (int)A[min(m0 + t, M - 1) * lda + k] * b;
        }
        for (int t = 0; t < rows; ++t) {
            int lanes[VN];
            CAT(vstore, VN)(acc[t], 0, lanes);
            for (int j = 0; j < VN; ++j)
                C[(m0 + t) * ldc + n0 + j] = q8_epilogue(
                    lanes[j], m0 + t, n0 + j, g, M, scale, offset, bias, per_row, has_bias, act,
                    alpha, beta, requant, out_scale, out_zero, out_lo, out_hi);
        }
        return;
    }
    for (int t = 0; t < rows; ++t) {
        for (int n = n0; n < N; ++n) {
            int acc = 0;
            for (int k = 0; k < K; ++k) acc += (int)A[(m0 + t) * lda + k] * (int)B[k * ldb + n];
            C[(m0 + t) * ldc + n] = q8_epilogue(acc, m0 + t, n, g, M, scale, offset, bias,
                                                per_row, has_bias, act, alpha, beta, requant,
                                                out_scale, out_zero, out_lo, out_hi);
        }
    }
}
