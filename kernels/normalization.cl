// Normalizations over rows (LayerNormalization, InstanceNormalization, GroupNormalization),
// reductions of rows (ReduceSum, ReduceMean, ReduceL2, ReduceMax over adjacent axes) and 2-D
// Resize. A row is normalized by one work-group of WG_1D work-items: each sums a strided
// share of the row, and the shares meet in a local-memory tree of log2(WG_1D) fixed steps
// (WG_1D is a power of two), so FPGA compilers see fixed trip counts in the reduction.

// The sum (or with `take_max` the maximum) over the work-group of each work-item's `v`,
// returned to every work-item.
inline float group_reduce(float v, __local float* scratch, const int take_max) {
    const int lid = get_local_id(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG_1D / 2; s > 0; s >>= 1) {
        if (lid < s) {
            const float other = scratch[lid + s];
            scratch[lid] = take_max ? fmax(scratch[lid], other) : scratch[lid] + other;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);  // every work-item has read it before scratch is reused
    return total;
}

// A row is `cols` values `inner` apart: x viewed as (outer, cols, inner), row r at
// (r / inner, :, r % inner). inner is 1 for trailing axes; a LayerNorm over the channels of an
// NCHW tensor (the ConvNeXt authors' channels-first LayerNorm) has inner = h * w.
inline int row_start(const int row, const int cols, const int inner) {
    return (row / inner) * cols * inner + row % inner;
}

// Writes row `row` normalized: act((x - mean) * inv * scale[c] + bias[c]) for j = first,
// first + step, ... < cols, where c = ((row % period) * cols + j) / stride.
inline void store_normalized(__global const DATA* x, __global const DATA* scale,
                             __global const DATA* bias, __global DATA* out, const int row,
                             const int cols, const int inner, const int period,
                             const int stride, const float mean, const float inv,
                             const int first, const int step, const int act, const float a,
                             const float b) {
    const int offset = (row % period) * cols, start = row_start(row, cols, inner);
    for (int j = first; j < cols; j += step) {
        const int c = (offset + j) / stride, i = start + j * inner;
        const float v = (LOAD_DATA(x, i) - mean) * inv;
        STORE_DATA(activate(fma(v, LOAD_DATA(scale, c), LOAD_DATA(bias, c)), act, a, b), out, i);
    }
}

// out = act((x - mean) / sqrt(var + eps) * scale[c] + bias[c]) over rows of `cols` values, one
// work-group per row (GPUs, FPGAs); mean and variance in two passes (no cancellation in
// E[x^2] - E[x]^2). The affine index c of value j of row r is ((r % period) * cols + j) /
// stride: LayerNormalization (per value of the row): period 1, stride 1;
// InstanceNormalization (per channel, a row is one channel's plane): period C, stride cols;
// GroupNormalization (per channel, a row is one group's channels): period groups, stride the
// plane's size.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void norm_rows(__global const DATA* x, __global const DATA* scale, __global const DATA* bias,
               __global DATA* out, const int cols, const int inner, const int period,
               const int stride, const float eps, const int act, const float a, const float b) {
    __local float scratch[WG_1D];
    const int row = get_group_id(0), lid = get_local_id(0);
    const int start = row_start(row, cols, inner);
    float part = 0.0f;
    for (int j = lid; j < cols; j += WG_1D) part += LOAD_DATA(x, start + j * inner);
    const float mean = group_reduce(part, scratch, 0) / cols;
    part = 0.0f;
    for (int j = lid; j < cols; j += WG_1D) {
        const float d = LOAD_DATA(x, start + j * inner) - mean;
        part = fma(d, d, part);
    }
    const float inv = rsqrt(group_reduce(part, scratch, 0) / cols + eps);
    store_normalized(x, scale, bias, out, row, cols, inner, period, stride, mean, inv, lid, WG_1D,
                     act, a, b);
}

// The same, one work-item per row (CPUs: PoCL runs a work-group's work-items as vector lanes,
// where the barriers of the work-group reduction cost more than they share).
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void norm_rows_serial(__global const DATA* x, __global const DATA* scale,
                      __global const DATA* bias, __global DATA* out, const int rows,
                      const int cols, const int inner, const int period, const int stride,
                      const float eps, const int act, const float a, const float b) {
    const int row = get_global_id(0);
    if (row >= rows) return;
    const int start = row_start(row, cols, inner);
    float sum = 0.0f;
    for (int j = 0; j < cols; ++j) sum += LOAD_DATA(x, start + j * inner);
    const float mean = sum / cols;
    float squares = 0.0f;
    for (int j = 0; j < cols; ++j) {
        const float d = LOAD_DATA(x, start + j * inner) - mean;
        squares = fma(d, d, squares);
    }
    store_normalized(x, scale, bias, out, row, cols, inner, period, stride, mean,
                     rsqrt(squares / cols + eps), 0, 1, act, a, b);
}

// One value per row (of `cols` values `inner` apart, as the normalizations' rows): the sum, the
// mean (MLP-Mixer's and LeViT's mean over tokens), the L2 norm (Swin V2's cosine attention
// normalizes q and k by it) or the maximum.
#define REDUCE_SUM 0
#define REDUCE_L2 1
#define REDUCE_MAX 2
#define REDUCE_MEAN 3
inline float reduce_step(const float part, const float v, const int op) {
    return op == REDUCE_MAX ? fmax(part, v) : op == REDUCE_L2 ? fma(v, v, part) : part + v;
}

inline float reduce_result(const float total, const int cols, const int op) {
    return op == REDUCE_L2 ? sqrt(total) : op == REDUCE_MEAN ? total / cols : total;
}

// One work-group per row (GPUs, FPGAs).
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void reduce_rows(__global const DATA* x, __global DATA* out, const int cols, const int inner,
                 const int op) {
    __local float scratch[WG_1D];
    const int row = get_group_id(0), lid = get_local_id(0);
    const int start = row_start(row, cols, inner);
    float part = op == REDUCE_MAX ? -INFINITY : 0.0f;
    for (int j = lid; j < cols; j += WG_1D)
        part = reduce_step(part, LOAD_DATA(x, start + j * inner), op);
    const float total = group_reduce(part, scratch, op == REDUCE_MAX);
    if (lid == 0) STORE_DATA(reduce_result(total, cols, op), out, row);
}

// One work-item per row (CPUs, as norm_rows_serial).
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void reduce_rows_serial(__global const DATA* x, __global DATA* out, const int rows,
                        const int cols, const int inner, const int op) {
    const int row = get_global_id(0);
    if (row >= rows) return;
    const int start = row_start(row, cols, inner);
    float total = op == REDUCE_MAX ? -INFINITY : 0.0f;
    for (int j = 0; j < cols; ++j) total = reduce_step(total, LOAD_DATA(x, start + j * inner), op);
    STORE_DATA(reduce_result(total, cols, op), out, row);
}

// 2-D Resize of (n * c) planes: output pixel (oy, ox) is the sum over `taps` x `taps` input
// pixels (ys[oy taps + ty], xs[ox taps + tx]) weighted by yw[oy taps + ty] * xw[ox taps + tx].
// The host computes these tables for the ONNX mode (nearest: 1 tap of weight 1, linear: 2,
// cubic: 4) and coordinate transformation, so one kernel without mode branches serves every
// mode; taps <= 4, a bound FPGA compilers can unroll. Dimensions: the output pixel, the plane.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void resize2d(__global const DATA* x, __global DATA* out, __global const int* ys,
              __global const float* yw, __global const int* xs, __global const float* xw,
              const int taps, const int h, const int w, const int oh, const int ow) {
    const int p = get_global_id(0), plane = get_global_id(1);
    if (p >= oh * ow) return;
    const int oy = p / ow, ox = p % ow;
    __global const DATA* in = x + plane * h * w;
    float sum = 0.0f;
    for (int ty = 0; ty < taps; ++ty) {
        const int row = ys[oy * taps + ty] * w;
        float across = 0.0f;
        for (int tx = 0; tx < taps; ++tx)
            across = fma(xw[ox * taps + tx], LOAD_DATA(in, row + xs[ox * taps + tx]), across);
        sum = fma(yw[oy * taps + ty], across, sum);
    }
    STORE_DATA(sum, out, plane * oh * ow + p);
}
