/* The elementwise chains of `dvm bench ops` as hand-fused C loops: every element goes through
 * the whole chain in vector registers, with no intermediate tile in memory. `dvm bench floor`
 * compiles this file twice and times it beside the CPU VM; it is a measuring stick, not part
 * of DVM's execution path.
 *
 *   (default)  the CPU VM's own float32 math (vm/cpu_math.py): the same exp polynomial and
 *              one-step scaling, the same tanh and sigmoid formulas, straight-line code with
 *              selects; compiled -O3 -march=native -ffp-contract=fast. What a static compiler
 *              makes of the same arithmetic: the floor for an interpreter of it.
 *   -DLIBMVEC  libm's expf / tanhf / erff, compiled -ffast-math so that GCC calls glibc's
 *              vector math (libmvec, <= 4 ULP in its documented range, specials not IEEE-exact
 *              under -ffast-math): what a static compiler with a vendor vector math library reaches.
 *
 * bias_gelu has no default form here (the VM's GELU is an erfc with hi/lo exponent splitting,
 * ~80 lines of cpu_math); its LIBMVEC form is 0.5 x (1 + erf(x / sqrt 2)).
 * Threads: OpenMP, static schedule; dvm_floor_threads sets their number.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

void dvm_floor_threads(int n) { omp_set_num_threads(n); }

#ifdef LIBMVEC
int dvm_floor_has_bias_gelu(void) { return 1; }
static inline float ex(float x) { return expf(x); }
static inline float th(float x) { return tanhf(x); }
static inline float sg(float x) { return 1.0f / (1.0f + expf(-x)); }
#else
int dvm_floor_has_bias_gelu(void) { return 0; }
static inline float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* e^r on |r| <= ln2/2 (cpu_math._exp_poly) */
static inline float exp_poly(float r) {
    float p = (((1.3814611593261361e-3f * r + 8.368710055947304e-3f) * r + 4.166838899254799e-2f) * r
               + 1.666652113199234e-1f) * r + 4.999999403953552e-1f;
    return p * r * r + r + 1.0f;
}

/* cpu_math._exp_one_step on the clamped argument (exp_into's in-range path) */
static inline float ex(float x) {
    float xc = x > 88.0f ? 88.0f : (x < -86.5f ? -86.5f : x);
    float t = xc * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f - n * -2.12194440e-4f;
    return bits_f(f_bits(exp_poly(r)) + (f_bits(t) << 23));
}

/* cpu_math._sigmoid_given(x, exp(-|x|)) */
static inline float sg(float x) {
    float e = ex(-fabsf(x));
    float d = 1.0f + e;
    return x >= 0 ? 1.0f / d : e / d;
}

/* cpu_math.tanhf: odd polynomial below 0.625, else 1 - 2 / (exp(2|x|) + 1) */
static inline float th(float x) {
    float a = fabsf(x);
    a = a < 9.5f ? a : 9.5f;
    float big = 1.0f - 2.0f / (ex(a + a) + 1.0f);
    big = x > 0 ? big : -big;
    float z = x * x;
    float small = (((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                     + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z) * x + x;
    return a < 0.625f ? small : big;
}
#endif

/* |tanh(x * sigmoid(1.702 x) + 0.1)^2 - 0.5|   (bench_encode.chain8) */
void dvm_floor_chain8(float *restrict o, const float *restrict a, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; k++) {
        float x = a[k];
        float t = th(x * sg(x * 1.702f) + 0.1f);
        o[k] = fabsf(t * t - 0.5f);
    }
}

/* tanh(exp(a*b) + a) * b */
void dvm_floor_tanh_exp(float *restrict o, const float *restrict a, const float *restrict b, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; k++)
        o[k] = th(ex(a[k] * b[k]) + a[k]) * b[k];
}

/* a * sigmoid(a) * b */
void dvm_floor_silu_mul(float *restrict o, const float *restrict a, const float *restrict b, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < n; k++)
        o[k] = a[k] * sg(a[k]) * b[k];
}

/* GELU(x + bias), bias broadcast over rows of `cols` elements */
void dvm_floor_bias_gelu(float *restrict o, const float *restrict x, const float *restrict bias,
                         int64_t rows, int64_t cols) {
#ifdef LIBMVEC
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *restrict orow = o + r * cols;
        const float *restrict xrow = x + r * cols;
        for (int64_t c = 0; c < cols; c++) {
            float v = xrow[c] + bias[c];
            orow[c] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
        }
    }
#else
    (void)o; (void)x; (void)bias; (void)rows; (void)cols;
#endif
}
