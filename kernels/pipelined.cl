// The convolution path in the style FPGA OpenCL compilers pipeline best, built only with
// -DPIPELINED: three single work-item kernels (loops the compiler pipelines, ideally at one
// iteration per clock) chained by FIFOs. pipe_conv_feed streams each output pixel's window in
// im2col order (never storing it), pipe_conv_mac keeps one window on chip and streams one sum
// per output channel, pipe_conv_drain adds bias and activation and stores NCHW.
// The FIFOs are Intel FPGA channels (-DINTEL_CHANNELS, cl_intel_channels), AMD/Xilinx pipes
// (-DXILINX_PIPES), or else, where neither exists (PoCL, Oclgrind), a buffer in global memory
// that the stages fill and drain one after the other on an in-order queue: the same loops, so
// the stages' logic is tested where the hardware is absent.
#ifdef PIPELINED
#ifndef PIPE_DEPTH
#define PIPE_DEPTH 512
#endif
#ifndef PIPE_MAX_K
// The longest window (channels x kh x kw) kept on chip: ResNet-50's 512 x 3 x 3.
#define PIPE_MAX_K 4608
#endif

#if defined(INTEL_CHANNELS)
#pragma OPENCL EXTENSION cl_intel_channels : enable
channel float col_fifo __attribute__((depth(PIPE_DEPTH)));
channel float sum_fifo __attribute__((depth(PIPE_DEPTH)));
#define FIFO_ARG(name)
#define FIFO_COUNTER(name)
#define FIFO_WRITE(name, v) write_channel_intel(name, v)
#define FIFO_READ(name, var) var = read_channel_intel(name)
#elif defined(XILINX_PIPES)
pipe float col_fifo __attribute__((xcl_reqd_pipe_depth(PIPE_DEPTH)));
pipe float sum_fifo __attribute__((xcl_reqd_pipe_depth(PIPE_DEPTH)));
#define FIFO_ARG(name)
#define FIFO_COUNTER(name)
#define FIFO_WRITE(name, v) { const float v_ = (v); write_pipe_block(name, &v_); }
#define FIFO_READ(name, var) read_pipe_block(name, &var)
#else
#define FIFO_ARG(name) , __global float* restrict name
#define FIFO_COUNTER(name) int name##_n = 0;
#define FIFO_WRITE(name, v) name[name##_n++] = (v)
#define FIFO_READ(name, var) var = name[name##_n++]
#endif

// samples x groups planes of c_per_group channels; each output pixel's window, k = (c, ky, kx).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pipe_conv_feed(__global const float* restrict x FIFO_ARG(col_fifo), const int planes,
                    const int c_per_group, const int h, const int w, const int oh,
                    const int ow, const int kh, const int kw, const int sh, const int sw,
                    const int ph, const int pw, const int dh, const int dw) {
    FIFO_COUNTER(col_fifo)
    for (int z = 0; z < planes; ++z) {
        __global const float* in = x + z * c_per_group * h * w;
        for (int oy = 0; oy < oh; ++oy) {
            for (int ox = 0; ox < ow; ++ox) {
                for (int c = 0; c < c_per_group; ++c) {
                    for (int ky = 0; ky < kh; ++ky) {
                        const int iy = oy * sh - ph + ky * dh;
                        for (int kx = 0; kx < kw; ++kx) {
                            const int ix = ox * sw - pw + kx * dw;
                            const bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
                            FIFO_WRITE(col_fifo, inside ? in[(c * h + iy) * w + ix] : 0.0f);
                        }
                    }
                }
            }
        }
    }
}

// For each window: the K values into on-chip memory, then M dot products with the group's
// weights (row-major M x K), one sum per output channel into the next FIFO.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pipe_conv_mac(__global const float* restrict weights FIFO_ARG(col_fifo)
                   FIFO_ARG(sum_fifo), const int planes, const int groups, const int pixels,
                   const int M, const int K) {
    FIFO_COUNTER(col_fifo)
    FIFO_COUNTER(sum_fifo)
    __local float window[PIPE_MAX_K];
    for (int z = 0; z < planes; ++z) {
        __global const float* wg = weights + (z % groups) * M * K;
        for (int p = 0; p < pixels; ++p) {
            for (int k = 0; k < K; ++k) FIFO_READ(col_fifo, window[k]);
            for (int m = 0; m < M; ++m) {
                float acc = 0.0f;
                for (int k = 0; k < K; ++k) acc = fma(wg[m * K + k], window[k], acc);
                FIFO_WRITE(sum_fifo, acc);
            }
        }
    }
}

// Sums arrive pixel by pixel, channel by channel; stored NCHW with bias and activation.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pipe_conv_drain(__global const float* restrict bias, __global float* restrict out
                     FIFO_ARG(sum_fifo), const int planes, const int groups, const int pixels,
                     const int M, const int has_bias, const int act, const float a,
                     const float b) {
    FIFO_COUNTER(sum_fifo)
    for (int z = 0; z < planes; ++z) {
        const int g = z % groups;
        for (int p = 0; p < pixels; ++p) {
            for (int m = 0; m < M; ++m) {
                float r;
                FIFO_READ(sum_fifo, r);
                if (has_bias) r += bias[g * M + m];
                out[(z * M + m) * pixels + p] = activate(r, act, a, b);
            }
        }
    }
}
#endif
