// Convolution as im2col + GEMM (gemm.cl): col[z][k][n] for z = batch * groups + group,
// k = (channel in group, ky, kx), n = (oy, ox); zero where the window leaves the input.
// A work-item fills one row k of one z: index arithmetic once per row, not per element.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void im2col(__global const float* x, __global float* col, const int c_per_group, const int h,
            const int w, const int oh, const int ow, const int kh, const int kw, const int sh,
            const int sw, const int ph, const int pw, const int dh, const int dw) {
    const int k = get_global_id(0), z = get_global_id(1);
    if (k >= c_per_group * kh * kw) return;
    const int kx = k % kw, ky = (k / kw) % kh, c = k / (kw * kh);
    __global const float* plane = x + (z * c_per_group + c) * h * w;
    __global float* row = col + (z * c_per_group * kh * kw + k) * oh * ow;
    for (int oy = 0; oy < oh; ++oy) {
        const int iy = oy * sh - ph + ky * dh;
        __global float* out = row + oy * ow;
        if (iy < 0 || iy >= h) {
            for (int ox = 0; ox < ow; ++ox) out[ox] = 0.0f;
            continue;
        }
        __global const float* in = plane + iy * w;
        for (int ox = 0; ox < ow; ++ox) {
            const int ix = ox * sw - pw + kx * dw;
            out[ox] = (ix >= 0 && ix < w) ? in[ix] : 0.0f;
        }
    }
}
