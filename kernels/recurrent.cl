// One time step of a recurrent layer (LSTM, GRU, RNN) for every direction and sample at once.
// The input projections of all steps come from one GEMM before the first step (xw, with the
// input biases and those recurrent biases that add to them); a step adds the hidden state's
// projection through R, transposed to (directions, hidden, gates * hidden) so that
// neighbouring work-items read neighbouring values, applies the gates and writes the new state
// and its row of Y. Work-item (j, d * tiles + tile) runs unit j for the SAMPLES samples of a
// tile, so that each value of R it loads serves all of them (R is read once per tile and step,
// not once per sample).
// The hidden state alternates between two buffers (h_in -> h_out: every unit reads all of
// h_in); c is each unit's own and is updated in place after the first step.
// Strides say where step t of sample b lies in xw (x_t, x_b), in Y (y_t, y_d, y_b) and in a
// state (s_d, s_b), so layouts 0 and 1 share the kernels. A sample's steps past its sequence
// length write zeros to Y and carry the state over (ONNX's sequence_lens); a sequence of
// length 0 ends in zero states, as in ONNX Runtime.
#define SAMPLES 4  // recurrent_lowering.SAMPLES
#define RECURRENT_ARGS                                                                        \
    __global const DATA *xw, __global const DATA *rt, __global const int *lens,               \
        __global const DATA *h_in, __global DATA *h_out, __global DATA *y, const int H,       \
        const int batch, const int step, const int first_reverse, const int x_t,              \
        const int x_b, const int y_t, const int y_d, const int y_b, const int s_d,            \
        const int s_b

// Declares j, d, the tile's first sample b0 and its size n, and the direction's R^T for a cell
// of GATES gates.
#define TILE_PROLOGUE(GATES)                                                                  \
    const int tiles = (batch + SAMPLES - 1) / SAMPLES, j = get_global_id(0);                  \
    if (j >= H) return;                                                                       \
    const int d = get_global_id(1) / tiles, b0 = get_global_id(1) % tiles * SAMPLES;          \
    const int n = min(SAMPLES, batch - b0);                                                   \
    const __global DATA* r = rt + d * H * (GATES) * H;

// In a cell's per-sample function: the state index s, this step's time t, the row of xw and
// the sample's previous state h; a padding step is finished here.
#define SAMPLE_PROLOGUE(GATES, CARRY)                                                         \
    const int s = d * s_d + b * s_b + j, len = lens[b];                                       \
    if (step >= len) {                                                                        \
        STORE_DATA(0.0f, y, step * y_t + d * y_d + b * y_b + j);                              \
        STORE_DATA(len ? LOAD_DATA(h_in, s) : 0.0f, h_out, s);                                \
        CARRY                                                                                 \
        return;                                                                               \
    }                                                                                         \
    const int t = d >= first_reverse ? len - 1 - step : step;                                 \
    const __global DATA* x = xw + t * x_t + b * x_b + d * (GATES) * H;                        \
    const __global DATA* h = h_in + d * s_d + b * s_b;
// A cell's per-sample function's parameters, and the arguments that pass them on.
#define SAMPLE_ARGS                                                                           \
    __global const DATA *xw, __global const int *lens, __global const DATA *h_in,            \
        __global DATA *h_out, __global DATA *y, const int H, const int step,                  \
        const int first_reverse, const int x_t, const int x_b, const int y_t, const int y_d,  \
        const int y_b, const int s_d, const int s_b, const int j, const int d, const int b
#define SAMPLE_PASS(i)                                                                        \
    xw, lens, h_in, h_out, y, H, step, first_reverse, x_t, x_b, y_t, y_d, y_b, s_d, s_b, j,   \
        d, b0 + (i)

#define SIGMOID(v) activate((v), ACT_SIGMOID, 0.0f, 0.0f)

// The states' projections onto unit j of GATES gates from g0, for the n samples whose states
// start at `h`, s_b apart: acc[g * SAMPLES + i] = sum over k of h_i[k] R[(g0 + g) * H + j][k],
// R read from R^T (H rows of G * H) once for all the samples.
#define RECURRENT_DOTS(acc, GATES, h, g0, G)                                                  \
    for (int q = 0; q < (GATES) * SAMPLES; ++q) acc[q] = 0.0f;                                \
    for (int k = 0; k < H; ++k) {                                                             \
        float hk[SAMPLES];                                                                    \
        for (int i = 0; i < SAMPLES; ++i) hk[i] = i < n ? LOAD_DATA(h, i * s_b + k) : 0.0f;   \
        for (int g = 0; g < (GATES); ++g) {                                                   \
            const float rv = LOAD_DATA(r, k * (G) * H + ((g0) + g) * H + j);                  \
            for (int i = 0; i < SAMPLES; ++i)                                                 \
                acc[g * SAMPLES + i] = fma(hk[i], rv, acc[g * SAMPLES + i]);                  \
        }                                                                                     \
    }

inline void store_hidden(const float v, __global DATA* h_out, __global DATA* y, const int s,
                         const int t, const int d, const int b, const int j, const int y_t,
                         const int y_d, const int y_b) {
    STORE_DATA(v, h_out, s);
    STORE_DATA(v, y, t * y_t + d * y_d + b * y_b + j);
}

// Gates i, o, f, c (ONNX's order; hr: their recurrent products); peepholes p (i, o, f per
// direction) where has_p.
inline void lstm_sample(SAMPLE_ARGS, const float* hr, __global const DATA* c_in,
                        __global DATA* c_out, __global const DATA* p, const int has_p) {
    SAMPLE_PROLOGUE(4, STORE_DATA(len ? LOAD_DATA(c_in, s) : 0.0f, c_out, s);)
    const float c_prev = LOAD_DATA(c_in, s);
    const __global DATA* pd = p + d * 3 * H;
    const float pi = has_p ? LOAD_DATA(pd, j) : 0.0f, po = has_p ? LOAD_DATA(pd, H + j) : 0.0f,
                pf = has_p ? LOAD_DATA(pd, 2 * H + j) : 0.0f;
    const float i = SIGMOID(LOAD_DATA(x, j) + hr[0] + pi * c_prev);
    const float f = SIGMOID(LOAD_DATA(x, 2 * H + j) + hr[2 * SAMPLES] + pf * c_prev);
    const float g = tanh(LOAD_DATA(x, 3 * H + j) + hr[3 * SAMPLES]);
    const float c = fma(f, c_prev, i * g);
    const float o = SIGMOID(LOAD_DATA(x, H + j) + hr[SAMPLES] + po * c);
    STORE_DATA(c, c_out, s);
    store_hidden(o * tanh(c), h_out, y, s, t, d, b, j, y_t, y_d, y_b);
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void lstm_step(RECURRENT_ARGS, __global const DATA* c_in, __global DATA* c_out,
               __global const DATA* p, const int has_p) {
    TILE_PROLOGUE(4)
    float acc[4 * SAMPLES];
    RECURRENT_DOTS(acc, 4, h_in + d * s_d + b0 * s_b, 0, 4)
    for (int i = 0; i < n; ++i)
        lstm_sample(SAMPLE_PASS(i), acc + i, c_in, c_out, p, has_p);
}

// GRU with linear_before_reset 0 needs the reset gate of every unit before any unit's
// candidate: this launch writes r * h_prev (rh) for the gru_step after it.
inline void gru_reset_sample(SAMPLE_ARGS, const float hr, __global DATA* rh) {
    SAMPLE_PROLOGUE(3, )
    STORE_DATA(SIGMOID(LOAD_DATA(x, H + j) + hr) * LOAD_DATA(h, j), rh, s);
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void gru_reset(RECURRENT_ARGS, __global DATA* rh) {
    TILE_PROLOGUE(3)
    float acc[SAMPLES];
    RECURRENT_DOTS(acc, 1, h_in + d * s_d + b0 * s_b, 1, 3)
    for (int i = 0; i < n; ++i) gru_reset_sample(SAMPLE_PASS(i), acc[i], rh);
}

// Gates z, r, h (hr: their recurrent products). linear_before_reset 1: the candidate's
// recurrent part is r * (h R_h + Rb_h), with Rb_h (rbh) kept out of xw; 0: it is (r * h) R_h,
// from gru_reset's rh (Rb_h in xw), and hr[SAMPLES] (r's) is unused.
inline void gru_sample(SAMPLE_ARGS, const float* hr, __global const DATA* rbh,
                       const int linear_before_reset) {
    SAMPLE_PROLOGUE(3, )
    const float z = SIGMOID(LOAD_DATA(x, j) + hr[0]);
    const float candidate =
        linear_before_reset ? SIGMOID(LOAD_DATA(x, H + j) + hr[SAMPLES])
                                  * (hr[2 * SAMPLES] + LOAD_DATA(rbh, d * H + j))
                            : hr[2 * SAMPLES];
    const float n = tanh(LOAD_DATA(x, 2 * H + j) + candidate);
    store_hidden(fma(z, LOAD_DATA(h, j) - n, n), h_out, y, s, t, d, b, j, y_t, y_d, y_b);
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void gru_step(RECURRENT_ARGS, __global const DATA* rh, __global const DATA* rbh,
              const int linear_before_reset) {
    TILE_PROLOGUE(3)
    float acc[3 * SAMPLES];
    if (linear_before_reset) {
        RECURRENT_DOTS(acc, 3, h_in + d * s_d + b0 * s_b, 0, 3)
    } else {  // z from h, the candidate from r * h
        RECURRENT_DOTS(acc, 1, h_in + d * s_d + b0 * s_b, 0, 3)
        float cand[SAMPLES];
        RECURRENT_DOTS(cand, 1, rh + d * s_d + b0 * s_b, 2, 3)
        for (int i = 0; i < SAMPLES; ++i) acc[2 * SAMPLES + i] = cand[i];
    }
    for (int i = 0; i < n; ++i)
        gru_sample(SAMPLE_PASS(i), acc + i, rbh, linear_before_reset);
}

inline void rnn_sample(SAMPLE_ARGS, const float hr) {
    SAMPLE_PROLOGUE(1, )
    store_hidden(tanh(LOAD_DATA(x, j) + hr), h_out, y, s, t, d, b, j, y_t, y_d, y_b);
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void rnn_step(RECURRENT_ARGS) {
    TILE_PROLOGUE(1)
    float acc[SAMPLES];
    RECURRENT_DOTS(acc, 1, h_in + d * s_d + b0 * s_b, 0, 1)
    for (int i = 0; i < n; ++i) rnn_sample(SAMPLE_PASS(i), acc[i]);
}
