// One time step of a recurrent layer (LSTM, GRU, RNN) for every direction and sample at once:
// work-item (j, d * batch + b) updates hidden unit j. The input projections of all steps come
// from one GEMM before the first step (xw, with the input biases and those recurrent biases
// that add to them); a step adds the hidden state's projection through R, transposed to
// (directions, hidden, gates * hidden) so that neighbouring work-items read neighbouring
// values, applies the gates and writes the new state and its row of Y.
// The hidden state alternates between two buffers (h_in -> h_out: every unit reads all of
// h_in); c is each unit's own and is updated in place after the first step.
// Strides say where step t of sample b lies in xw (x_t, x_b), in Y (y_t, y_d, y_b) and in a
// state (s_d, s_b), so layouts 0 and 1 share the kernels. A sample's steps past its sequence
// length write zeros to Y and carry the state over (ONNX's sequence_lens); a sequence of
// length 0 ends in zero states, as in ONNX Runtime.
#define RECURRENT_ARGS                                                                        \
    __global const DATA *xw, __global const DATA *rt, __global const int *lens,               \
        __global const DATA *h_in, __global DATA *h_out, __global DATA *y, const int H,       \
        const int batch, const int step, const int first_reverse, const int x_t,              \
        const int x_b, const int y_t, const int y_d, const int y_b, const int s_d,            \
        const int s_b

// Declares j, d, b, the state index s, this step's time t (-1: past the sequence), the row of
// xw and the direction's R^T; a padding step is finished here.
#define RECURRENT_PROLOGUE(GATES, CARRY)                                                      \
    const int j = get_global_id(0), d = get_global_id(1) / batch, b = get_global_id(1) % batch; \
    if (j >= H) return;                                                                       \
    const int s = d * s_d + b * s_b + j, len = lens[b];                                       \
    if (step >= len) {                                                                        \
        STORE_DATA(0.0f, y, step * y_t + d * y_d + b * y_b + j);                              \
        STORE_DATA(len ? LOAD_DATA(h_in, s) : 0.0f, h_out, s);                                \
        CARRY                                                                                 \
        return;                                                                               \
    }                                                                                         \
    const int t = d >= first_reverse ? len - 1 - step : step;                                 \
    const __global DATA* x = xw + t * x_t + b * x_b + d * (GATES) * H;                        \
    const __global DATA* r = rt + d * H * (GATES) * H;                                        \
    const __global DATA* h = h_in + d * s_d + b * s_b;

#define SIGMOID(v) activate((v), ACT_SIGMOID, 0.0f, 0.0f)

// The hidden state's projection onto unit j of gate g: sum over k of h[k] R[g * H + j][k],
// read from R^T (H rows of G * H).
inline float recurrent_dot(const __global DATA* h, const __global DATA* r, const int H,
                           const int G, const int g, const int j) {
    float acc = 0.0f;
    for (int k = 0; k < H; ++k)
        acc = fma(LOAD_DATA(h, k), LOAD_DATA(r, k * G * H + g * H + j), acc);
    return acc;
}

inline void store_hidden(const float v, __global DATA* h_out, __global DATA* y, const int s,
                         const int t, const int d, const int b, const int j, const int y_t,
                         const int y_d, const int y_b) {
    STORE_DATA(v, h_out, s);
    STORE_DATA(v, y, t * y_t + d * y_d + b * y_b + j);
}

// Gates i, o, f, c (ONNX's order); peepholes p (i, o, f per direction) where has_p.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void lstm_step(RECURRENT_ARGS, __global const DATA* c_in, __global DATA* c_out,
               __global const DATA* p, const int has_p) {
    RECURRENT_PROLOGUE(4, STORE_DATA(len ? LOAD_DATA(c_in, s) : 0.0f, c_out, s);)
    const float c_prev = LOAD_DATA(c_in, s);
    const __global DATA* pd = p + d * 3 * H;
    const float pi = has_p ? LOAD_DATA(pd, j) : 0.0f, po = has_p ? LOAD_DATA(pd, H + j) : 0.0f,
                pf = has_p ? LOAD_DATA(pd, 2 * H + j) : 0.0f;
    const float i = SIGMOID(LOAD_DATA(x, j) + recurrent_dot(h, r, H, 4, 0, j) + pi * c_prev);
    const float f = SIGMOID(LOAD_DATA(x, 2 * H + j) + recurrent_dot(h, r, H, 4, 2, j)
                            + pf * c_prev);
    const float g = tanh(LOAD_DATA(x, 3 * H + j) + recurrent_dot(h, r, H, 4, 3, j));
    const float c = fma(f, c_prev, i * g);
    const float o = SIGMOID(LOAD_DATA(x, H + j) + recurrent_dot(h, r, H, 4, 1, j) + po * c);
    STORE_DATA(c, c_out, s);
    store_hidden(o * tanh(c), h_out, y, s, t, d, b, j, y_t, y_d, y_b);
}

// GRU with linear_before_reset 0 needs the reset gate of every unit before any unit's
// candidate: this launch writes r * h_prev (rh) for the gru_step after it.
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void gru_reset(RECURRENT_ARGS, __global DATA* rh) {
    RECURRENT_PROLOGUE(3, )
    const float reset = SIGMOID(LOAD_DATA(x, H + j) + recurrent_dot(h, r, H, 3, 1, j));
    STORE_DATA(reset * LOAD_DATA(h, j), rh, s);
}

// Gates z, r, h. linear_before_reset 1: the candidate's recurrent part is r * (h R_h + Rb_h),
// with Rb_h (rbh) kept out of xw; 0: it is (r * h) R_h, from gru_reset's rh (Rb_h in xw).
__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void gru_step(RECURRENT_ARGS, __global const DATA* rh, __global const DATA* rbh,
              const int linear_before_reset) {
    RECURRENT_PROLOGUE(3, )
    const float z = SIGMOID(LOAD_DATA(x, j) + recurrent_dot(h, r, H, 3, 0, j));
    float candidate;
    if (linear_before_reset) {
        const float reset = SIGMOID(LOAD_DATA(x, H + j) + recurrent_dot(h, r, H, 3, 1, j));
        candidate = reset * (recurrent_dot(h, r, H, 3, 2, j) + LOAD_DATA(rbh, d * H + j));
    } else {
        candidate = recurrent_dot(rh + d * s_d + b * s_b, r, H, 3, 2, j);
    }
    const float n = tanh(LOAD_DATA(x, 2 * H + j) + candidate);
    store_hidden(fma(z, LOAD_DATA(h, j) - n, n), h_out, y, s, t, d, b, j, y_t, y_d, y_b);
}

__kernel __attribute__((reqd_work_group_size(WG_1D, 1, 1)))
void rnn_step(RECURRENT_ARGS) {
    RECURRENT_PROLOGUE(1, )
    const float v = tanh(LOAD_DATA(x, j) + recurrent_dot(h, r, H, 1, 0, j));
    store_hidden(v, h_out, y, s, t, d, b, j, y_t, y_d, y_b);
}
