// hetserve's FPGA convolution pipeline, in PipeCNN's form (FPT 2017): four single work-item
// kernels joined by channels (Intel) or pipes (AMD/Xilinx), each on its own queue, which the
// host runs once per layer from its layer table:
//
//   fpga_read --conv_in--> fpga_conv --conv_out--> fpga_pool --pool_out--> fpga_write
//   (line buffer: VEC      (weight buffer; VEC x    (max pool over a        (NCHW stores)
//    inputs a clock)        LANE MACs a clock,       row buffer, or pass)
//                           + bias, act)
//
// A fully connected layer is a 1x1 convolution of a 1x1 image. Every loop that carries data is
// a flat loop the compiler pipelines at one iteration per clock (II = 1): nested counters are
// stepped by hand, the VEC x LANE array and the per-lane work are fully unrolled, and float sums
// go through a shift register so the loop-carried add never waits for the adder's latency.
// There is no division or modulo in any datapath: ring positions are stepped with one compare.
//
// Compile-time parameters (a board profile's, kernels/boards/*.toml; `hetserve fpga build`):
//   VEC, LANE      the MAC array: VEC input channels x LANE output channels a clock
//   PIPE_DEPTH     shift-register depth of the float accumulation (the adder's latency)
//   WEIGHT_BUF     on-chip weights, in VEC x LANE words: a layer's kh * kw * ceil(C / VEC)
//   LINE_BUF       on-chip input rows, in VEC words: (kh + stride) * width * ceil(C / VEC)
//   POOL_BUF       on-chip conv output rows for pooling, in LANE words: pool kh * width
//   CHANNEL_DEPTH  the FIFOs' depth
//   Q8             int8 x int8 products summed in int32 (a QDQ model's layers); else float
//   HALF_STORAGE   tensors and weights stored as fp16 in DDR, computed in float
//   ACT_LEAKY      LeakyRelu compiled into the epilogue (ReLU and Clip are a max and a min)
// Sizes of layers are run-time arguments: one binary runs every layer of a model.
#ifndef VEC
#define VEC 8
#endif
#ifndef LANE
#define LANE 16
#endif
#ifndef PIPE_DEPTH
#define PIPE_DEPTH 6
#endif
#ifndef WEIGHT_BUF
#define WEIGHT_BUF 1024
#endif
#ifndef LINE_BUF
#define LINE_BUF 8192
#endif
#ifndef POOL_BUF
#define POOL_BUF 256
#endif
#ifndef CHANNEL_DEPTH
#define CHANNEL_DEPTH 8
#endif

#ifdef HALF_STORAGE
#define DATA half
#define LOAD(p, i) vload_half((i), (p))
#define STORE(v, p, i) vstore_half((v), (i), (p))
#else
#define DATA float
#define LOAD(p, i) ((p)[i])
#define STORE(v, p, i) ((p)[i] = (v))
#endif

#ifdef Q8
typedef char mac_t;    // int8 codes of activations and weights
typedef int acc_t;     // exact sums: an integer add closes its loop in one clock
#define WEIGHT char
#define LOAD_WEIGHT(p, i) ((p)[i])
#define ACC_ZERO 0
#else
typedef float mac_t;
typedef float acc_t;
#define WEIGHT DATA
#define LOAD_WEIGHT(p, i) LOAD(p, i)
#define ACC_ZERO 0.0f
#endif

#define ACT_RELU 1
#define ACT_LEAKY_RELU 2
#define ACT_CLIP 3

typedef struct { mac_t d[VEC]; } conv_in_t;                        // one clock's inputs
typedef struct { float v[LANE]; } lanes_t;                         // one output pixel's lanes

#if defined(XILINX_PIPES)
pipe conv_in_t conv_in __attribute__((xcl_reqd_pipe_depth(CHANNEL_DEPTH)));
pipe lanes_t conv_out __attribute__((xcl_reqd_pipe_depth(CHANNEL_DEPTH)));
pipe lanes_t pool_out __attribute__((xcl_reqd_pipe_depth(CHANNEL_DEPTH)));
#define WRITE_FIFO(name, v) write_pipe_block(name, &(v))
#define READ_FIFO(name, var) read_pipe_block(name, &(var))
#else
#pragma OPENCL EXTENSION cl_intel_channels : enable
channel conv_in_t conv_in __attribute__((depth(CHANNEL_DEPTH)));
channel lanes_t conv_out __attribute__((depth(CHANNEL_DEPTH)));
channel lanes_t pool_out __attribute__((depth(CHANNEL_DEPTH)));
#define WRITE_FIFO(name, v) write_channel_intel(name, v)
#define READ_FIFO(name, var) var = read_channel_intel(name)
#endif

// An input as the MAC array takes it: the float, or (Q8) its int8 code on the input's grid,
// rint(x / scale) + zero.
inline mac_t to_mac(const float x, const float inv_scale, const int zero) {
#ifdef Q8
    return (mac_t)clamp((int)rint(x * inv_scale) + zero, -128, 127);
#else
    return x;
#endif
}

// One VEC word of the line buffer: channels cw * VEC on of input row iy, column ix, into `slot`
// of the ring; channels past c read 0 (their weights are 0).
inline void load_word(mac_t line_buf[LINE_BUF][VEC], __global const DATA* restrict xs,
                      const int slot, const int iy, const int ix, const int cw, const int c,
                      const int cv, const int w, const int plane, const float inv_scale,
                      const int zero) {
    #pragma unroll
    for (int v = 0; v < VEC; ++v) {
        const int ch = cw * VEC + v;
        line_buf[(slot * w + ix) * cv + cw][v] =
            ch < c ? to_mac(LOAD(xs, ch * plane + iy * w + ix), inv_scale, zero) : 0;
    }
}

// Reads one layer's inputs for `batch` samples of `groups` groups, once for each block of LANE
// output channels: each input row is loaded into the line buffer once per block and reused by
// the kh x kw window positions and the output pixels that cover it, and each window is streamed
// to the MAC array a VEC word a clock. The line buffer is a ring of kh + sh rows: while one
// output row's windows stream from kh rows, the rows of the next output row load into the
// others, in the same flat loop. x: NCHW, `c_total` channels, a group's `c` from channel g * c;
// padding reads `pad_code` (0, or Q8's zero point).
__kernel __attribute__((max_global_work_dim(0)))
void fpga_read(__global const DATA* restrict x, const int batch, const int groups,
               const int blocks, const int c, const int cv, const int c_total, const int h,
               const int w, const int oh, const int ow, const int kh, const int kw, const int sh,
               const int sw, const int ph, const int pw, const int ring, const float inv_scale,
               const int pad_code) {
    mac_t line_buf[LINE_BUF][VEC];
    const int window = kh * kw * cv;
    const int plane = h * w;
    const int row_words = w * cv;
    // Rows loaded for the next output row: those of its window not already in the ring.
    const int new_rows = sh < kh ? sh : kh;
    const int new_from = sh < kh ? kh : sh;  // the first, relative to this row's first
    for (int g = 0; g < groups; ++g) {
        for (int blk = 0; blk < blocks; ++blk) {
            for (int n = 0; n < batch; ++n) {
                __global const DATA* xs = x + (n * c_total + g * c) * plane;
                // The prologue: the first output row's window rows.
                int slot0 = 0;  // the ring slot of this output row's first input row
                int row0 = -ph;
                {
                    int r = 0, cw = 0, ix = 0, slot = 0;
                    for (int i = 0; i < kh * row_words; ++i) {
                        const int iy = row0 + r;
                        if (iy >= 0 && iy < h)
                            load_word(line_buf, xs, slot, iy, ix, cw, c, cv, w, plane,
                                      inv_scale, pad_code);
                        if (++ix == w) {
                            ix = 0;
                            if (++cw == cv) {
                                cw = 0;
                                ++r;
                                if (++slot == ring) slot = 0;
                            }
                        }
                    }
                }
                for (int oy = 0; oy < oh; ++oy) {
                    const int streams = ow * window;
                    const int loads = oy + 1 < oh ? new_rows * row_words : 0;
                    const int steps = streams > loads ? streams : loads;
                    // Stream counters: pixel ox, window position (ky, kx, cw).
                    int ox = 0, ky = 0, kx = 0, cw = 0;
                    int sslot = slot0;  // slot of row0 + ky
                    // Load counters: row r of the new ones, channel word lc, column lx.
                    int lr = 0, lc = 0, lx = 0;
                    int lslot = slot0 + new_from;
                    if (lslot >= ring) lslot -= ring;
                    for (int i = 0; i < steps; ++i) {
                        if (i < streams) {
                            const int iy = row0 + ky, ix = ox * sw - pw + kx;
                            const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
                            conv_in_t word;
                            #pragma unroll
                            for (int v = 0; v < VEC; ++v)
                                word.d[v] = inside ? line_buf[(sslot * w + ix) * cv + cw][v]
                                                   : (mac_t)pad_code;
                            WRITE_FIFO(conv_in, word);
                            if (++cw == cv) {
                                cw = 0;
                                if (++kx == kw) {
                                    kx = 0;
                                    if (++sslot == ring) sslot = 0;
                                    if (++ky == kh) {
                                        ky = 0;
                                        sslot = slot0;
                                        ++ox;
                                    }
                                }
                            }
                        }
                        if (i < loads) {
                            const int iy = row0 + new_from + lr;
                            if (iy >= 0 && iy < h)
                                load_word(line_buf, xs, lslot, iy, lx, lc, c, cv, w, plane,
                                          inv_scale, pad_code);
                            if (++lx == w) {
                                lx = 0;
                                if (++lc == cv) {
                                    lc = 0;
                                    ++lr;
                                    if (++lslot == ring) lslot = 0;
                                }
                            }
                        }
                    }
                    row0 += sh;
                    slot0 += sh;  // sh < ring
                    if (slot0 >= ring) slot0 -= ring;
                }
            }
        }
    }
}

// The MAC array: for each block of LANE output channels the block's weights are loaded from
// DDR into the weight buffer once, next to the array, and reused by every output pixel of every
// sample. Each clock, LANE dot products of the VEC inputs that arrive, accumulated over a
// pixel's window (kh * kw * cv clocks) in a shift register of PIPE_DEPTH partial sums a lane.
// At the end of a window: scale and shift per output channel (float: 1 and the bias; Q8: the
// input's times the weights' scale, and the bias less the zero point's share), the activation,
// and with Q8 the rounding onto the output's int8 grid (`requant`).
// weights: [group][block][ky][kx][cv][LANE][VEC], zero past the group's channels.
__kernel __attribute__((max_global_work_dim(0)))
void fpga_conv(__global const WEIGHT* restrict weights, __global const float* restrict scale,
               __global const float* restrict shift, const int batch, const int groups,
               const int blocks, const int pixels, const int window, const int act,
               const float a, const float b, const int requant, const float out_scale,
               const float out_inv, const int out_zero, const int out_lo, const int out_hi) {
    mac_t weight_buf[WEIGHT_BUF][LANE][VEC];
    __global const WEIGHT* wp = weights;
    for (int gb = 0; gb < groups * blocks; ++gb) {
        for (int t = 0; t < window; ++t) {  // a LANE x VEC word a clock
            #pragma unroll
            for (int l = 0; l < LANE; ++l) {
                #pragma unroll
                for (int v = 0; v < VEC; ++v)
                    weight_buf[t][l][v] = (mac_t)LOAD_WEIGHT(wp, (t * LANE + l) * VEC + v);
            }
        }
        wp += window * LANE * VEC;
        float lane_scale[LANE], lane_shift[LANE];
        #pragma unroll
        for (int l = 0; l < LANE; ++l) {
            lane_scale[l] = scale[gb * LANE + l];
            lane_shift[l] = shift[gb * LANE + l];
        }
        acc_t sums[LANE][PIPE_DEPTH + 1];
        #pragma unroll
        for (int l = 0; l < LANE; ++l) {
            #pragma unroll
            for (int j = 0; j <= PIPE_DEPTH; ++j) sums[l][j] = ACC_ZERO;
        }
        int t = 0;
        for (int i = 0; i < batch * pixels * window; ++i) {
            conv_in_t word;
            READ_FIFO(conv_in, word);
            #pragma unroll
            for (int l = 0; l < LANE; ++l) {
                acc_t dot = ACC_ZERO;
                #pragma unroll
                for (int v = 0; v < VEC; ++v) dot += (acc_t)word.d[v] * (acc_t)weight_buf[t][l][v];
                sums[l][PIPE_DEPTH] = sums[l][0] + dot;
                #pragma unroll
                for (int j = 0; j < PIPE_DEPTH; ++j) sums[l][j] = sums[l][j + 1];
            }
            if (++t == window) {  // the pixel's window is summed
                t = 0;
                lanes_t out;
                #pragma unroll
                for (int l = 0; l < LANE; ++l) {
                    acc_t total = ACC_ZERO;
                    #pragma unroll
                    for (int j = 0; j < PIPE_DEPTH; ++j) {
                        total += sums[l][j];
                        sums[l][j] = ACC_ZERO;
                    }
                    sums[l][PIPE_DEPTH] = ACC_ZERO;
                    float y = (float)total * lane_scale[l] + lane_shift[l];
                    if (act == ACT_RELU) y = fmax(y, 0.0f);
                    if (act == ACT_CLIP) y = fmin(fmax(y, a), b);
#ifdef ACT_LEAKY
                    if (act == ACT_LEAKY_RELU && y < 0.0f) y *= a;
#endif
#ifdef Q8
                    if (requant) {
                        const int q = clamp((int)rint(y * out_inv) + out_zero, out_lo, out_hi);
                        y = (float)(q - out_zero) * out_scale;
                    }
#endif
                    out.v[l] = y;
                }
                WRITE_FIFO(conv_out, out);
            }
        }
    }
}

// Max pooling of the conv's output as it streams, row by row: the last `pk` rows are kept
// in a ring, and each pooled row is written as soon as its last conv row has come. With
// pk == 0 every pixel passes through.
__kernel __attribute__((max_global_work_dim(0)))
void fpga_pool(const int planes, const int oh, const int ow, const int pk, const int ps,
               const int pp, const int poh, const int pow_) {
    if (pk == 0) {
        for (int i = 0; i < planes * oh * ow; ++i) {
            lanes_t v;
            READ_FIFO(conv_out, v);
            WRITE_FIFO(pool_out, v);
        }
        return;
    }
    lanes_t rows[POOL_BUF];
    for (int z = 0; z < planes; ++z) {  // (group, block, sample) in the conv's order
        int slot = 0, py = 0;
        for (int oy = 0; oy < oh; ++oy) {
            for (int ox = 0; ox < ow; ++ox) READ_FIFO(conv_out, rows[slot * ow + ox]);
            // Pooled rows whose window ends at this conv row (or is cut by the bottom edge).
            for (int last = py * ps - pp + pk - 1;
                 py < poh && (last <= oy || oy == oh - 1); last += ps) {
                const int top = py * ps - pp;
                for (int px = 0; px < pow_; ++px) {
                    lanes_t m;
                    #pragma unroll
                    for (int l = 0; l < LANE; ++l) m.v[l] = -INFINITY;
                    for (int ky = 0; ky < pk; ++ky) {
                        const int r = top + ky;
                        int rs = slot - (oy - r);  // r's slot: at most pk - 1 rows back
                        if (rs < 0) rs += pk;
                        for (int kx = 0; kx < pk; ++kx) {
                            const int col = px * ps - pp + kx;
                            if (r >= 0 && r <= oy && col >= 0 && col < ow) {
                                #pragma unroll
                                for (int l = 0; l < LANE; ++l)
                                    m.v[l] = fmax(m.v[l], rows[rs * ow + col].v[l]);
                            }
                        }
                    }
                    WRITE_FIFO(pool_out, m);
                }
                ++py;
            }
            if (++slot == pk) slot = 0;
        }
    }
}

// Stores each pixel's LANE channels into NCHW (`m_total` channels; a group's `m` from channel
// g * m), skipping the lanes past m.
__kernel __attribute__((max_global_work_dim(0)))
void fpga_write(__global DATA* restrict out, const int batch, const int groups,
                const int blocks, const int m, const int m_total, const int pixels) {
    for (int g = 0; g < groups; ++g) {
        for (int blk = 0; blk < blocks; ++blk) {
            for (int n = 0; n < batch; ++n) {
                __global DATA* o = out + (n * m_total + g * m + blk * LANE) * pixels;
                for (int p = 0; p < pixels; ++p) {
                    lanes_t v;
                    READ_FIFO(pool_out, v);
                    #pragma unroll
                    for (int l = 0; l < LANE; ++l)
                        if (blk * LANE + l < m) STORE(v.v[l], o, l * pixels + p);
                }
            }
        }
    }
}
