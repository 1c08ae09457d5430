// Pooling over NCHW: a work-item computes one output pixel (dimension 0: the pixel in its
// plane, so neighbours read neighbouring inputs; dimension 1: the plane). Padding never counts
// toward a max; for averages `count_pad` says whether padded cells count (ONNX
// count_include_pad); (ph, pw) pad the start of each axis, (eh, ew) its end.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void pool2d(__global const DATA* x, __global DATA* out, const int nc, const int h,
            const int w, const int oh, const int ow, const int kh, const int kw,
            const int sh, const int sw, const int ph, const int pw, const int eh, const int ew,
            const int dh, const int dw, const int is_max, const int count_pad) {
    const int p = get_global_id(0), c = get_global_id(1);
    if (p >= oh * ow) return;
    const int ox = p % ow, oy = p / ow;
    __global const DATA* plane = x + c * h * w;
    {
        float acc = is_max ? -INFINITY : 0.0f;
        int count = 0;
        for (int ky = 0; ky < kh; ++ky) {
            const int iy = oy * sh - ph + ky * dh;
            for (int kx = 0; kx < kw; ++kx) {
                const int ix = ox * sw - pw + kx * dw;
                if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
                    // A cell beyond the input; it counts only when it is explicit padding.
                    if (count_pad && iy < h + eh && ix < w + ew) ++count;
                    continue;
                }
                const float v = LOAD_DATA(plane, iy * w + ix);
                acc = is_max ? fmax(acc, v) : acc + v;
                ++count;
            }
        }
        STORE_DATA(is_max ? acc : acc / (float)count, out, c * oh * ow + p);
    }
}

// The max or mean of a kh x kw window (dilations dh, dw) lying wholly inside a plane w wide.
inline float window_value(__global const DATA* window, const int w, const int kh, const int kw,
                          const int dh, const int dw, const int is_max) {
    float acc = is_max ? -INFINITY : 0.0f;
    for (int ky = 0; ky < kh; ++ky) {
        for (int kx = 0; kx < kw; ++kx) {
            const float v = LOAD_DATA(window, ky * dh * w + kx * dw);
            acc = is_max ? fmax(acc, v) : acc + v;
        }
    }
    return is_max ? acc : acc / (float)(kh * kw);
}

// The same where every window lies inside the input (no padding, no ceil_mode overhang, as in
// most 2x2 and 3x3 pools): no bounds checks, and a loop PoCL runs about twice as fast.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void pool2d_valid(__global const DATA* x, __global DATA* out, const int h, const int w,
                  const int oh, const int ow, const int kh, const int kw, const int sh,
                  const int sw, const int dh, const int dw, const int is_max) {
    const int p = get_global_id(0), c = get_global_id(1);
    if (p >= oh * ow) return;
    const int ox = p % ow, oy = p / ow;
    STORE_DATA(window_value(x + (c * h + oy * sh) * w + ox * sw, w, kh, kw, dh, dw, is_max),
               out, c * oh * ow + p);
}

// The same on CPUs (the lowering's register-tile path): a work-item computes one output row
// (dimension 0: plane x output row), so no division per output (measured on PoCL: MNIST's 2x2
// pool 0.17 -> 0.10 ms per slice of 8). GPUs and FPGAs keep a work-item per pixel.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void pool2d_rows(__global const DATA* x, __global DATA* out, const int rows, const int h,
                 const int w, const int oh, const int ow, const int kh, const int kw,
                 const int sh, const int sw, const int dh, const int dw, const int is_max) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int c = r / oh, oy = r - c * oh;
    __global const DATA* in = x + (c * h + oy * sh) * w;
    for (int ox = 0; ox < ow; ++ox)
        STORE_DATA(window_value(in + ox * sw, w, kh, kw, dh, dw, is_max), out, r * ow + ox);
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void global_avg_pool(__global const DATA* x, __global DATA* out, const int nc,
                     const int hw) {
    const int i = get_global_id(0);
    if (i >= nc) return;
    __global const DATA* plane = x + i * hw;
    float acc = 0.0f;
    for (int j = 0; j < hw; ++j) acc += LOAD_DATA(plane, j);
    STORE_DATA(acc / (float)hw, out, i);
}

// Local response normalization across channels (ONNX LRN); dimensions: pixel, channel, batch.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void lrn(__global const DATA* x, __global DATA* out, const int c, const int hw,
         const int size, const float alpha, const float beta, const float bias) {
    const int p = get_global_id(0), ch = get_global_id(1), b = get_global_id(2);
    if (p >= hw) return;
    const int lo = max(0, ch - (size - 1) / 2), hi = min(c - 1, ch + size / 2);
    __global const DATA* base = x + b * c * hw + p;
    float sq = 0.0f;
    for (int j = lo; j <= hi; ++j) sq = fma(LOAD_DATA(base, j * hw), LOAD_DATA(base, j * hw), sq);
    STORE_DATA(LOAD_DATA(base, ch * hw) * exp(-beta * log(bias + alpha / (float)size * sq)), out,
          (b * c + ch) * hw + p);
}

// Softmax over one axis: one work-item per row of `cols` values `inner` apart (1 for the last
// axis; ResNeSt's softmax over its radix, axis 1 of 4, has inner = h * w).
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void softmax_rows(__global const DATA* x, __global DATA* out, const int rows,
                  const int cols, const int inner) {
    const int r = get_global_id(0);
    if (r >= rows) return;
    const int start = (r / inner) * cols * inner + r % inner;
    float m = -INFINITY;
    for (int j = 0; j < cols; ++j) m = fmax(m, LOAD_DATA(x, start + j * inner));
    float s = 0.0f;
    for (int j = 0; j < cols; ++j) s += exp(LOAD_DATA(x, start + j * inner) - m);
    for (int j = 0; j < cols; ++j) {
        const int i = start + j * inner;
        STORE_DATA(exp(LOAD_DATA(x, i) - m) / s, out, i);
    }
}
