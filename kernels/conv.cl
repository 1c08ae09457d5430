// Convolution as im2col + GEMM (gemm.cl): col[z][k][n] for z = batch * groups + group,
// k = (channel in group, ky, kx), n = (oy, ox); zero where the window leaves the input.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void im2col(__global const float* x, __global float* col, const int total,
            const int c_per_group, const int h, const int w, const int oh, const int ow,
            const int kh, const int kw, const int sh, const int sw, const int ph, const int pw,
            const int dh, const int dw) {
    const int i = get_global_id(0);
    if (i >= total) return;
    const int n_cols = oh * ow, k_rows = c_per_group * kh * kw;
    const int n = i % n_cols, k = (i / n_cols) % k_rows, z = i / (n_cols * k_rows);
    const int ox = n % ow, oy = n / ow;
    const int kx = k % kw, ky = (k / kw) % kh, c = k / (kw * kh);
    const int iy = oy * sh - ph + ky * dh, ix = ox * sw - pw + kx * dw;
    col[i] = (iy >= 0 && iy < h && ix >= 0 && ix < w)
                 ? x[(z * c_per_group + c) * h * w + iy * w + ix] : 0.0f;
}
