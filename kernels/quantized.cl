// int8 inference for models quantized to QDQ ONNX (onnxruntime.quantization): int8 weights with
// one scale per output channel (zero point 0), activations quantized with one scale and zero
// point per tensor as ONNX QuantizeLinear does (round half to even, saturate). Stored activation
// codes are signed chars q' = q - shift (shift 128 for uint8 tensors), so one kernel serves
// uint8 and int8 activations: zq, lo, hi below are already shifted. Products are int8 x int8,
// accumulated in int32; the epilogue turns the sum into fp32 with the per-channel scale, adds
// the bias, applies the fused activation and, where the model re-quantizes the output, rounds
// it onto the output's grid (ONNX Q then DQ), so results match onnxruntime's QDQ execution.
#define QUANTIZE(v) ((char)clamp((int)rint((v) / qscale) + zq, lo, hi))
#define COMMA ,

// im2col of int8 codes (conv.cl's IM2COL): the padding is the zero point.
#define PAD ((char)zq)
IM2COL(im2col_q8, char, COMMA const int zq)
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

// A work-item owns an 8-row x VN-column tile like gemm_tile: VN int8 codes of B widened to one int
// vector per k, each row's A code broadcast into it; the epilogue works on whole vectors. The
// last, partial column tile goes one scalar at a time.
#define IVEC CAT(int, VN)
#define Q8_ROW(t) __global const char* a##t = A + min(m0 + t, M - 1) * lda; IVEC c##t = (IVEC)(0);
#define Q8_MAC(t) c##t += (int)a##t[k] * b;
#define Q8_STORE(t) q8_store_row(c##t, C, scale, offset, bias, g, M, m0 + t, n0, ldc,        \
                                 per_row, has_bias, act, alpha, beta, requant, out_scale,    \
                                 out_zero, out_lo, out_hi);

inline void q8_store_row(IVEC acc, __global float* C, __global const float* scale,
                         __global const int* offset, __global const float* bias, const int g,
                         const int M, const int m, const int n0, const int ldc,
                         const int per_row, const int has_bias, const int act,
                         const float alpha, const float beta, const int requant,
                         const float out_scale, const int out_zero, const int out_lo,
                         const int out_hi) {
    if (m >= M) return;
    VEC r;
    if (per_row) {
        const int ch = g * M + m;
        r = CAT(convert_float, VN)(acc - offset[ch]) * scale[ch] + (has_bias ? bias[ch] : 0.0f);
    } else {
        r = CAT(convert_float, VN)(acc - VLOAD(0, offset + n0)) * VLOAD(0, scale + n0);
        if (has_bias) r += VLOAD(0, bias + n0);
    }
    r = activate_vec(r, act, alpha, beta);
    if (requant) {
        const IVEC q = clamp(CAT(CAT(convert_int, VN), _sat_rte)(r / out_scale) + out_zero,
                             (IVEC)(out_lo), (IVEC)(out_hi));
        r = CAT(convert_float, VN)(q - out_zero) * out_scale;
    }
    VSTORE(r, 0, C + m * ldc + n0);
}

__kernel __attribute__((reqd_work_group_size(GEMM_WG, 1, 1)))
void gemm_q8(GEMM_Q8_ARGS) {
    const int n0 = get_global_id(0) * VN, m0 = get_global_id(1) * 8, z = get_global_id(2);
    if (m0 >= M || n0 >= N) return;
    const int bi = z / groups, g = z % groups;
    A += bi * a_batch + g * a_group;
    B += bi * b_batch + g * b_group;
    C += bi * c_batch + g * c_group;
    if (n0 + VN <= N) {
        Q8_ROW(0) Q8_ROW(1) Q8_ROW(2) Q8_ROW(3) Q8_ROW(4) Q8_ROW(5) Q8_ROW(6) Q8_ROW(7)
        for (int k = 0; k < K; ++k) {
            const IVEC b = CAT(convert_int, VN)(CAT(vload, VN)(0, B + k * ldb + n0));
            Q8_MAC(0) Q8_MAC(1) Q8_MAC(2) Q8_MAC(3) Q8_MAC(4) Q8_MAC(5) Q8_MAC(6) Q8_MAC(7)
        }
        Q8_STORE(0) Q8_STORE(1) Q8_STORE(2) Q8_STORE(3) Q8_STORE(4) Q8_STORE(5) Q8_STORE(6)
        Q8_STORE(7)
        return;
    }
    for (int m = m0; m < min(m0 + 8, M); ++m) {
        for (int n = n0; n < N; ++n) {
            int acc = 0;
            for (int k = 0; k < K; ++k) acc += (int)A[m * lda + k] * (int)B[k * ldb + n];
            C[m * ldc + n] = q8_epilogue(acc, m, n, g, M, scale, offset, bias, per_row,
                                         has_bias, act, alpha, beta, requant, out_scale,
                                         out_zero, out_lo, out_hi);
        }
    }
}
