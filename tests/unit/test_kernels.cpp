// Unit tests for every CPU kernel in kernels/*/.
//
// Each kernel is compared with a naive fp64 reference written here; each fp64 backward reference is in turn
// compared with central finite differences of the fp64 forward reference, of the objective
// L = sum(out * R) for a fixed random R (so dout = R). A kernel's gradient is therefore checked against
// mathematics that nobody had to derive twice. Also covered: bit-for-bit determinism (repeat runs, and 1 vs
// 2 vs 3 threads where a header promises it), += versus = on every output, the softmax_xent padding
// contract, AdamW against torch.optim.AdamW's formula, and the fast math helpers against libm.
//
// Set GPT2_TEST_VERBOSE=1 to print every measured error (useful when retuning a tolerance).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/adamw/adamw.hpp"
#include "kernels/attention/attention.hpp"
#include "kernels/attention/tile_order.hpp"
#include "kernels/common/cpu_math.hpp"
#include "kernels/encoder/encoder.hpp"
#include "kernels/gelu/gelu.hpp"
#include "kernels/gemm/gemm.hpp"
#include "kernels/layernorm/layernorm.hpp"
#include "kernels/reduce/reduce.hpp"
#include "kernels/softmax_xent/softmax_xent.hpp"

namespace gpt2::kernels {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;
using Tokens = std::vector<int32_t>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Tolerances. fp32 kernel vs fp64 reference: relative L2 error, and max |error| relative to max |reference|.
constexpr double kRel = 1e-5;
constexpr double kMax = 1e-4;
// fp64 reference gradient vs fp64 central differences.
constexpr double kFdRel = 1e-6;
constexpr double kFdMax = 1e-6;
// Coordinates probed by finite differences per tensor (all of them when the tensor is smaller). The matrix
// products are linear in each argument, and their fp64 forward is the costly one: fewer probes there.
constexpr size_t kFdCoords = 160;
constexpr size_t kFdCoordsGemm = 40;

// ---------------------------------------------------------------------------------------------------------
// Data, comparisons, threads

Vec randn(size_t n, uint64_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(mean, scale);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tokens random_tokens(size_t n, int V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  Tokens t(n);
  for (int32_t& x : t) x = dist(rng);
  return t;
}

DVec to_double(const Vec& v) {
  return DVec(v.begin(), v.end());
}

Vec to_float(const DVec& v) {
  Vec f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  return f;
}

bool verbose() {
  static const bool v = std::getenv("GPT2_TEST_VERBOSE") != nullptr;
  return v;
}

// got vs ref: ||got - ref|| / ||ref|| <= rel_tol and max|got - ref| <= max_tol * max|ref| (scaled to the data,
// so one pair of numbers fits logits and gradients alike). Non-finite values in got always fail.
template <class T>
::testing::AssertionResult close_to(const std::string& what, const T* got, const double* ref, size_t n, double rel_tol,
                                    double max_tol) {
  long double diff2 = 0.0L, ref2 = 0.0L;
  double max_abs = 0.0, ref_max = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]);
    if (!std::isfinite(g)) {
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << g << " (reference " << ref[i] << ")";
    }
    const double d = std::fabs(g - ref[i]);
    diff2 += static_cast<long double>(d) * d;
    ref2 += static_cast<long double>(ref[i]) * ref[i];
    if (d > max_abs) {
      max_abs = d;
      worst = i;
    }
    ref_max = std::max(ref_max, std::fabs(ref[i]));
  }
  const double rel = std::sqrt(static_cast<double>(ref2 > 0.0L ? diff2 / ref2 : diff2));
  const double scale = ref_max > 0.0 ? ref_max : 1.0;
  if (verbose()) {
    std::printf("    %-40s n=%-8zu rel_l2=%.2e  max_abs/max_ref=%.2e\n", what.c_str(), n, rel, max_abs / scale);
  }
  if (rel <= rel_tol && max_abs <= max_tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": rel_l2 " << rel << " (tol " << rel_tol << "), max_abs " << max_abs
                                       << " at [" << worst << "] got " << static_cast<double>(got[worst]) << " ref "
                                       << ref[worst] << " (bound " << max_tol << " * max|ref| " << ref_max << ")";
}

template <class T>
::testing::AssertionResult close_to(const std::string& what, const std::vector<T>& got, const DVec& ref,
                                    double rel_tol = kRel, double max_tol = kMax) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs " << ref.size();
  }
  return close_to(what, got.data(), ref.data(), ref.size(), rel_tol, max_tol);
}

template <class T>
::testing::AssertionResult bit_equal(const std::string& what, const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": size " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << what << ": first difference at [" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// got - base, in fp64: what a += kernel added on top of a prefilled buffer.
DVec minus(const Vec& got, const Vec& base) {
  DVec d(got.size());
  for (size_t i = 0; i < got.size(); ++i) d[i] = static_cast<double>(got[i]) - static_cast<double>(base[i]);
  return d;
}

// Sets the thread count of our OpenMP pool and OpenBLAS's for one scope.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(omp_get_max_threads()) { set_cpu_threads(n); }
  ~ScopedThreads() { set_cpu_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

constexpr int kThreadCounts[] = {1, 2, 3};

// ---------------------------------------------------------------------------------------------------------
// Finite differences (fp64)

std::vector<size_t> sample_indices(size_t n, size_t max_count, uint64_t seed) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  if (n <= max_count) return idx;
  std::mt19937_64 rng(seed);
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(max_count);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// sum(out * R), accumulated in long double so that rounding in the many terms a perturbation does not touch
// stays far below the difference quotient's resolution.
double objective(const DVec& out, const DVec& R) {
  long double s = 0.0L;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<long double>(out[i]) * R[i];
  return static_cast<double>(s);
}

// analytic (the fp64 reference gradient of sum(forward(x) * R)) against central differences of forward at
// up to kFdCoords coordinates of x. The step is 1e-5 relative: truncation error ~h^2, rounding ~1e-16/h.
template <class Forward>
::testing::AssertionResult matches_finite_differences(const std::string& what, const Forward& forward, DVec x,
                                                      const DVec& R, const DVec& analytic, uint64_t seed,
                                                      size_t max_coords = kFdCoords) {
  if (analytic.size() != x.size()) return ::testing::AssertionFailure() << what << ": gradient size mismatch";
  const std::vector<size_t> idx = sample_indices(x.size(), max_coords, seed);
  DVec fd, an;
  for (size_t i : idx) {
    const double x0 = x[i];
    const double h = 1e-5 * std::max(1.0, std::fabs(x0));
    const double xp = x0 + h, xm = x0 - h;
    x[i] = xp;
    const double lp = objective(forward(x), R);
    x[i] = xm;
    const double lm = objective(forward(x), R);
    x[i] = x0;
    fd.push_back((lp - lm) / (xp - xm));
    an.push_back(analytic[i]);
  }
  return close_to(what + " vs finite differences", an.data(), fd.data(), fd.size(), kFdRel, kFdMax);
}

// ---------------------------------------------------------------------------------------------------------
// Naive fp64 references, written from the formulas in the kernel headers

namespace ref {

DVec encoder_forward(const Tokens& inp, const DVec& wte, const DVec& wpe, int B, int T, int C) {
  DVec out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const size_t bt = static_cast<size_t>(b) * T + t;
        out[bt * C + c] = wte[static_cast<size_t>(inp[bt]) * C + c] + wpe[static_cast<size_t>(t) * C + c];
      }
  return out;
}

// Accumulates (+=) into dwte and dwpe.
void encoder_backward(DVec& dwte, DVec& dwpe, const DVec& dout, const Tokens& inp, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        const size_t bt = static_cast<size_t>(b) * T + t;
        dwte[static_cast<size_t>(inp[bt]) * C + c] += dout[bt * C + c];
        dwpe[static_cast<size_t>(t) * C + c] += dout[bt * C + c];
      }
}

struct LayerNormOut {
  DVec out, mean, rstd;
};

LayerNormOut layernorm_forward(const DVec& x, const DVec& w, const DVec& b, int N, int C) {
  LayerNormOut r{DVec(x.size()), DVec(N), DVec(N)};
  const double eps = static_cast<double>(kLayerNormEps);
  for (int i = 0; i < N; ++i) {
    const double* xi = x.data() + static_cast<size_t>(i) * C;
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += xi[c];
    m /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (xi[c] - m) * (xi[c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) r.out[static_cast<size_t>(i) * C + c] = (xi[c] - m) * s * w[c] + b[c];
    r.mean[i] = m;
    r.rstd[i] = s;
  }
  return r;
}

struct LayerNormGrads {
  DVec dinp, dweight, dbias;
};

LayerNormGrads layernorm_backward(const DVec& dout, const DVec& x, const DVec& w, int N, int C) {
  const DVec zeros(C, 0.0);
  const LayerNormOut st = layernorm_forward(x, w, zeros, N, C);
  LayerNormGrads g{DVec(x.size(), 0.0), DVec(C, 0.0), DVec(C, 0.0)};
  for (int i = 0; i < N; ++i) {
    const size_t off = static_cast<size_t>(i) * C;
    double mean_dn = 0.0, mean_dn_xhat = 0.0;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[off + c] - st.mean[i]) * st.rstd[i];
      const double dn = dout[off + c] * w[c];
      mean_dn += dn;
      mean_dn_xhat += dn * xhat;
      g.dbias[c] += dout[off + c];
      g.dweight[c] += dout[off + c] * xhat;
    }
    mean_dn /= C;
    mean_dn_xhat /= C;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[off + c] - st.mean[i]) * st.rstd[i];
      const double dn = dout[off + c] * w[c];
      g.dinp[off + c] = st.rstd[i] * (dn - mean_dn - xhat * mean_dn_xhat);
    }
  }
  return g;
}

// out = inp @ w + bias; bias may be empty.
DVec linear_forward(const DVec& inp, const DVec& w, const DVec& bias, int N, int IC, int OC) {
  DVec out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < IC; ++i) s += inp[static_cast<size_t>(n) * IC + i] * w[static_cast<size_t>(i) * OC + o];
      out[static_cast<size_t>(n) * OC + o] = s;
    }
  return out;
}

struct LinearGrads {
  DVec dinp, dw, dbias;
};

LinearGrads linear_backward(const DVec& dout, const DVec& inp, const DVec& w, int N, int IC, int OC) {
  LinearGrads g{DVec(inp.size(), 0.0), DVec(w.size(), 0.0), DVec(OC, 0.0)};
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const double d = dout[static_cast<size_t>(n) * OC + o];
      g.dbias[o] += d;
      for (int i = 0; i < IC; ++i) {
        g.dinp[static_cast<size_t>(n) * IC + i] += d * w[static_cast<size_t>(i) * OC + o];
        g.dw[static_cast<size_t>(i) * OC + o] += d * inp[static_cast<size_t>(n) * IC + i];
      }
    }
  return g;
}

// logits = inp @ wte^T
DVec lm_head_forward(const DVec& inp, const DVec& wte, int N, int C, int Vp) {
  DVec out(static_cast<size_t>(N) * Vp);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < Vp; ++v) {
      double s = 0.0;
      for (int c = 0; c < C; ++c) s += inp[static_cast<size_t>(n) * C + c] * wte[static_cast<size_t>(v) * C + c];
      out[static_cast<size_t>(n) * Vp + v] = s;
    }
  return out;
}

struct LmHeadGrads {
  DVec dinp, dwte;
};

LmHeadGrads lm_head_backward(const DVec& dlogits, const DVec& inp, const DVec& wte, int N, int C, int Vp) {
  LmHeadGrads g{DVec(inp.size(), 0.0), DVec(wte.size(), 0.0)};
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < Vp; ++v) {
      const double d = dlogits[static_cast<size_t>(n) * Vp + v];
      for (int c = 0; c < C; ++c) {
        g.dinp[static_cast<size_t>(n) * C + c] += d * wte[static_cast<size_t>(v) * C + c];
        g.dwte[static_cast<size_t>(v) * C + c] += d * inp[static_cast<size_t>(n) * C + c];
      }
    }
  return g;
}

struct AttentionOut {
  DVec out, att;
};

AttentionOut attention_forward(const DVec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  AttentionOut r{DVec(static_cast<size_t>(B) * T * C, 0.0), DVec(static_cast<size_t>(B) * NH * T * T, 0.0)};
  auto q = [&](int b, int t, int h) { return qkv.data() + (static_cast<size_t>(b) * T + t) * 3 * C + h * hs; };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double* a = r.att.data() + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        double maxv = -std::numeric_limits<double>::infinity();
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0.0;
          for (int i = 0; i < hs; ++i) dot += q(b, t, h)[i] * q(b, t2, h)[C + i];
          a[t2] = dot * scale;
          maxv = std::max(maxv, a[t2]);
        }
        double sum = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) sum += (a[t2] = std::exp(a[t2] - maxv));
        for (int t2 = 0; t2 <= t; ++t2) a[t2] /= sum;
        double* o = r.out.data() + (static_cast<size_t>(b) * T + t) * C + h * hs;
        for (int t2 = 0; t2 <= t; ++t2)
          for (int i = 0; i < hs; ++i) o[i] += a[t2] * q(b, t2, h)[2 * C + i];
      }
  return r;
}

DVec attention_backward(const DVec& dout, const DVec& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const DVec att = attention_forward(qkv, B, T, C, NH).att;
  DVec dqkv(qkv.size(), 0.0);
  auto at = [&](int b, int t, int h) { return (static_cast<size_t>(b) * T + t) * 3 * C + h * hs; };
  DVec datt(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const double* a = att.data() + ((static_cast<size_t>(b) * NH + h) * T + t) * T;
        const double* dO = dout.data() + (static_cast<size_t>(b) * T + t) * C + h * hs;
        // out_t = sum_t2 a[t2] v_t2
        for (int t2 = 0; t2 <= t; ++t2) {
          datt[t2] = 0.0;
          for (int i = 0; i < hs; ++i) {
            datt[t2] += dO[i] * qkv[at(b, t2, h) + 2 * C + i];
            dqkv[at(b, t2, h) + 2 * C + i] += a[t2] * dO[i];
          }
        }
        // a = softmax(s): ds = a * (datt - sum(a * datt));  s[t2] = scale * q_t . k_t2
        double sum_a_datt = 0.0;
        for (int t2 = 0; t2 <= t; ++t2) sum_a_datt += a[t2] * datt[t2];
        for (int t2 = 0; t2 <= t; ++t2) {
          const double ds = a[t2] * (datt[t2] - sum_a_datt) * scale;
          for (int i = 0; i < hs; ++i) {
            dqkv[at(b, t, h) + i] += ds * qkv[at(b, t2, h) + C + i];
            dqkv[at(b, t2, h) + C + i] += ds * qkv[at(b, t, h) + i];
          }
        }
      }
  return dqkv;
}

constexpr double kPi = 3.14159265358979323846;
constexpr double kGeluCubic = 0.044715;

double gelu(double x) {
  const double u = std::sqrt(2.0 / kPi) * (x + kGeluCubic * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

double gelu_grad(double x) {
  const double k = std::sqrt(2.0 / kPi);
  const double th = std::tanh(k * (x + kGeluCubic * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * kGeluCubic * x * x);
}

// losses[i] = logsumexp(logits[i, :V]) - logits[i, target]
DVec softmax_xent_losses(const DVec& logits, const Tokens& targets, int N, int V, int Vp) {
  DVec losses(N);
  for (int i = 0; i < N; ++i) {
    const double* x = logits.data() + static_cast<size_t>(i) * Vp;
    const double maxv = *std::max_element(x, x + V);
    long double sum = 0.0L;
    for (int j = 0; j < V; ++j) sum += std::exp(x[j] - maxv);
    losses[i] = static_cast<double>(std::log(sum)) + maxv - x[targets[i]];
  }
  return losses;
}

// Gradient of dloss * sum_i losses[i] with respect to logits (N,Vp); zero in the padding columns.
DVec softmax_xent_grad(const DVec& logits, const Tokens& targets, int N, int V, int Vp, double dloss) {
  DVec g(logits.size(), 0.0);
  for (int i = 0; i < N; ++i) {
    const double* x = logits.data() + static_cast<size_t>(i) * Vp;
    const double maxv = *std::max_element(x, x + V);
    double sum = 0.0;
    for (int j = 0; j < V; ++j) sum += std::exp(x[j] - maxv);
    for (int j = 0; j < V; ++j) g[static_cast<size_t>(i) * Vp + j] = dloss * std::exp(x[j] - maxv) / sum;
    g[static_cast<size_t>(i) * Vp + targets[i]] -= dloss;
  }
  return g;
}

// torch.optim.AdamW (single tensor, no amsgrad, no maximize), in fp64:
//   param.mul_(1 - lr * wd); exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
//   step_size = lr / (1 - beta1^t); denom = exp_avg_sq.sqrt() / sqrt(1 - beta2^t) + eps
//   param.addcdiv_(exp_avg, denom, value=-step_size)
// with grad = grad_scale * raw gradient (clipping folded in).
struct AdamWState {
  DVec params, m, v;
};

void adamw_step(AdamWState& s, const Vec& grads, const AdamWStep& h) {
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(h.step));
  for (size_t i = 0; i < grads.size(); ++i) {
    const double g = static_cast<double>(h.grad_scale) * grads[i];
    s.params[i] *= 1.0 - lr * wd;
    s.m[i] += (g - s.m[i]) * (1.0 - b1);
    s.v[i] = b2 * s.v[i] + (1.0 - b2) * g * g;
    const double denom = std::sqrt(s.v[i]) / std::sqrt(bc2) + eps;
    s.params[i] -= (lr / bc1) * s.m[i] / denom;
  }
}

}  // namespace ref

// ---------------------------------------------------------------------------------------------------------
// Shapes: round ones and awkward ones (not multiples of any block or vector width)

struct AttnShape {
  int B, T, C, NH;
};
void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B" << s.B << "_T" << s.T << "_C" << s.C << "_NH" << s.NH;
}
std::string name_of(const ::testing::TestParamInfo<AttnShape>& info) {
  return ::testing::PrintToString(info.param);
}
const AttnShape kAttnShapes[] = {{1, 1, 8, 1}, {2, 5, 12, 3}, {3, 37, 72, 4}, {4, 64, 128, 4}};

struct RowShape {
  int N, C;
};
void PrintTo(const RowShape& s, std::ostream* os) {
  *os << "N" << s.N << "_C" << s.C;
}
std::string name_of_rows(const ::testing::TestParamInfo<RowShape>& info) {
  return ::testing::PrintToString(info.param);
}
// C = 33 and 72 straddle the 32-channel blocks of layernorm backward; 63/65 the 64-blocks of bias_backward.
const RowShape kLayerNormShapes[] = {{1, 8}, {7, 12}, {37, 72}, {256, 128}, {3, 33}, {4, 768}};
const RowShape kBiasShapes[] = {{1, 1}, {7, 63}, {37, 64}, {256, 65}, {33, 200}, {256, 768}};

struct LinearShape {
  int N, IC, OC;
};
void PrintTo(const LinearShape& s, std::ostream* os) {
  *os << "N" << s.N << "_IC" << s.IC << "_OC" << s.OC;
}
std::string name_of_linear(const ::testing::TestParamInfo<LinearShape>& info) {
  return ::testing::PrintToString(info.param);
}
const LinearShape kLinearShapes[] = {{1, 8, 24},      {7, 12, 36}, {37, 72, 216},
                                     {256, 128, 512}, {5, 33, 17}, {64, 768, 65}};

struct VocabShape {
  int N, C, V, Vp;
};
void PrintTo(const VocabShape& s, std::ostream* os) {
  *os << "N" << s.N << "_C" << s.C << "_V" << s.V << "_Vp" << s.Vp;
}
std::string name_of_vocab(const ::testing::TestParamInfo<VocabShape>& info) {
  return ::testing::PrintToString(info.param);
}
// C is unused by softmax_xent; V == Vp (no padding) is covered too.
const VocabShape kVocabShapes[] = {
    {1, 8, 50, 128}, {7, 12, 50, 128}, {37, 72, 257, 384}, {64, 128, 257, 384}, {5, 16, 128, 128}};

// ---------------------------------------------------------------------------------------------------------
// encoder

class Encoder : public ::testing::TestWithParam<AttnShape> {
 protected:
  // Few tokens, so rows of dwte collect many (b,t) and some rows none.
  static constexpr int kV = 11;
  int maxT() const { return GetParam().T + 3; }
};

TEST_P(Encoder, ForwardEqualsReferenceExactly) {
  const auto [B, T, C, NH] = GetParam();
  (void)NH;
  const Vec wte = randn(static_cast<size_t>(kV) * C, 1), wpe = randn(static_cast<size_t>(maxT()) * C, 2);
  const Tokens inp = random_tokens(static_cast<size_t>(B) * T, kV, 3);
  Vec out(static_cast<size_t>(B) * T * C, kNaN);
  encoder_forward_cpu(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  // One fp32 addition per element: the fp64 sum rounded to fp32 is exactly what it must produce.
  const Vec expect = to_float(ref::encoder_forward(inp, to_double(wte), to_double(wpe), B, T, C));
  EXPECT_TRUE(bit_equal("out", out, expect));
  Vec again(out.size(), kNaN);
  encoder_forward_cpu(again.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_TRUE(bit_equal("out, second run", out, again));
}

TEST_P(Encoder, BackwardAccumulatesAndMatchesReference) {
  const auto [B, T, C, NH] = GetParam();
  (void)NH;
  const Tokens inp = random_tokens(static_cast<size_t>(B) * T, kV, 4);
  const Vec dout = randn(static_cast<size_t>(B) * T * C, 5);
  const Vec dwte0 = randn(static_cast<size_t>(kV) * C, 6), dwpe0 = randn(static_cast<size_t>(maxT()) * C, 7);
  Vec dwte = dwte0, dwpe = dwpe0;
  encoder_backward_cpu(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);

  DVec dwte_ref = to_double(dwte0), dwpe_ref = to_double(dwpe0);
  ref::encoder_backward(dwte_ref, dwpe_ref, to_double(dout), inp, B, T, C);
  EXPECT_TRUE(close_to("dwte (+=)", dwte, dwte_ref, 1e-6, 1e-5));
  EXPECT_TRUE(close_to("dwpe (+=)", dwpe, dwpe_ref, 1e-6, 1e-5));

  // Rows that no (b,t) touches keep their exact bits: unused tokens of dwte, positions >= T of dwpe.
  for (int v = 0; v < kV; ++v) {
    if (std::find(inp.begin(), inp.end(), v) != inp.end()) continue;
    for (int c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(v) * C + c;
      ASSERT_EQ(dwte[i], dwte0[i]) << "untouched dwte row " << v;
    }
  }
  for (size_t i = static_cast<size_t>(T) * C; i < dwpe.size(); ++i) ASSERT_EQ(dwpe[i], dwpe0[i]) << "dwpe row >= T";
}

TEST_P(Encoder, ReferenceBackwardMatchesFiniteDifferences) {
  const auto [B, T, C, NH] = GetParam();
  (void)NH;
  const Tokens inp = random_tokens(static_cast<size_t>(B) * T, kV, 8);
  const DVec wte = to_double(randn(static_cast<size_t>(kV) * C, 9));
  const DVec wpe = to_double(randn(static_cast<size_t>(maxT()) * C, 10));
  const DVec R = to_double(randn(static_cast<size_t>(B) * T * C, 11));
  DVec dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  ref::encoder_backward(dwte, dwpe, R, inp, B, T, C);
  EXPECT_TRUE(matches_finite_differences(
      "dwte", [&](const DVec& x) { return ref::encoder_forward(inp, x, wpe, B, T, C); }, wte, R, dwte, 12));
  EXPECT_TRUE(matches_finite_differences(
      "dwpe", [&](const DVec& x) { return ref::encoder_forward(inp, wte, x, B, T, C); }, wpe, R, dwpe, 13));
}

TEST_P(Encoder, BackwardIsDeterministicAcrossRunsAndThreadCounts) {
  const auto [B, T, C, NH] = GetParam();
  (void)NH;
  const Tokens inp = random_tokens(static_cast<size_t>(B) * T, kV, 14);
  const Vec dout = randn(static_cast<size_t>(B) * T * C, 15);
  const Vec dwte0 = randn(static_cast<size_t>(kV) * C, 16), dwpe0 = randn(static_cast<size_t>(maxT()) * C, 17);
  auto run = [&](int threads, Vec& dwte, Vec& dwpe) {
    ScopedThreads guard(threads);
    dwte = dwte0;
    dwpe = dwpe0;
    encoder_backward_cpu(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
  };
  Vec dwte1, dwpe1;
  run(1, dwte1, dwpe1);
  for (int threads : kThreadCounts) {
    for (int rep = 0; rep < 2; ++rep) {
      Vec dwte, dwpe;
      run(threads, dwte, dwpe);
      EXPECT_TRUE(bit_equal("dwte, threads=" + std::to_string(threads), dwte, dwte1));
      EXPECT_TRUE(bit_equal("dwpe, threads=" + std::to_string(threads), dwpe, dwpe1));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Encoder, ::testing::ValuesIn(kAttnShapes), name_of);

// The CUDA backward's plan (encoder_backward_plan, host code): positions grouped by token id, ascending
// within each token.
TEST(EncoderPlan, GroupsPositionsByTokenInOrder) {
  const std::vector<int32_t> tokens = {5, 2, 5, 0, 2, 5, 9};
  std::vector<int32_t> plan = {42};  // stale contents are replaced
  const int U = encoder_backward_plan(tokens.data(), static_cast<int>(tokens.size()), &plan);
  EXPECT_EQ(U, 4);
  const std::vector<int32_t> expected = {0, 1, 3, 6, 7,         // row_start (U+1)
                                         0, 2, 5, 9,            // row_token (U), ascending
                                         3, 1, 4, 0, 2, 5, 6};  // positions, ascending per token
  EXPECT_EQ(plan, expected);
  EXPECT_EQ(encoder_backward_plan(tokens.data(), 0, &plan), 0);
  EXPECT_EQ(plan, std::vector<int32_t>({0}));
}

// Against the plan built with std::stable_sort (how it was built until 2026-12-02): GPT-2's vocabulary at a
// 124M micro-batch, ids that need the radix sort's second pass (>= 65536, up to INT32_MAX), one token
// repeated everywhere, and sizes around the digit count.
TEST(EncoderPlan, EqualsAStableComparisonSort) {
  auto reference = [](const std::vector<int32_t>& t) {
    std::vector<int32_t> order(t.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return t[x] < t[y]; });
    std::vector<int32_t> starts, tokens;
    for (size_t j = 0; j < order.size(); ++j)
      if (j == 0 || t[order[j]] != t[order[j - 1]]) {
        starts.push_back(static_cast<int32_t>(j));
        tokens.push_back(t[order[j]]);
      }
    starts.push_back(static_cast<int32_t>(t.size()));
    std::vector<int32_t> plan = starts;
    plan.insert(plan.end(), tokens.begin(), tokens.end());
    plan.insert(plan.end(), order.begin(), order.end());
    return plan;
  };
  std::mt19937 rng(7);
  struct Case {
    int n;
    int64_t max_id;  // ids uniform in [0, max_id]
  };
  for (const Case c : {Case{16384, 50256}, Case{1000, 65535}, Case{1000, 65536}, Case{5000, 200000},
                       Case{3000, std::numeric_limits<int32_t>::max()}, Case{777, 0}, Case{65537, 40}}) {
    std::uniform_int_distribution<int64_t> id(0, c.max_id);
    std::vector<int32_t> t(static_cast<size_t>(c.n));
    for (int32_t& x : t) x = static_cast<int32_t>(id(rng));
    if (c.n > 2) t[1] = static_cast<int32_t>(c.max_id);  // the largest id present
    std::vector<int32_t> plan;
    const int U = encoder_backward_plan(t.data(), c.n, &plan);
    const std::vector<int32_t> want = reference(t);
    EXPECT_EQ(plan, want) << "n " << c.n << ", ids up to " << c.max_id;
    EXPECT_EQ(static_cast<size_t>(2 * U + 1 + c.n), want.size());
  }
}

// ---------------------------------------------------------------------------------------------------------
// layernorm

class LayerNorm : public ::testing::TestWithParam<RowShape> {};

// Inputs look like a residual stream: an offset (which the two-pass variance must not mind) and spread.
Vec layernorm_input(int N, int C, uint64_t seed) {
  return randn(static_cast<size_t>(N) * C, seed, 2.0f, 3.0f);
}

TEST_P(LayerNorm, ForwardMatchesReference) {
  const auto [N, C] = GetParam();
  const Vec x = layernorm_input(N, C, 20), w = randn(C, 21, 0.5f, 1.0f), b = randn(C, 22, 0.5f);
  Vec out(static_cast<size_t>(N) * C, kNaN), mean(N, kNaN), rstd(N, kNaN);
  layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  const ref::LayerNormOut r = ref::layernorm_forward(to_double(x), to_double(w), to_double(b), N, C);
  EXPECT_TRUE(close_to("out", out, r.out));
  EXPECT_TRUE(close_to("mean", mean, r.mean));
  EXPECT_TRUE(close_to("rstd", rstd, r.rstd));

  Vec out2(out.size(), kNaN), mean2(N, kNaN), rstd2(N, kNaN);
  layernorm_forward_cpu(out2.data(), mean2.data(), rstd2.data(), x.data(), w.data(), b.data(), N, C);
  EXPECT_TRUE(bit_equal("out, second run", out2, out));
  EXPECT_TRUE(bit_equal("mean, second run", mean2, mean));
  EXPECT_TRUE(bit_equal("rstd, second run", rstd2, rstd));
}

TEST_P(LayerNorm, ResidualForwardIsAddThenLayerNorm) {
  const auto [N, C] = GetParam();
  const size_t n = static_cast<size_t>(N) * C;
  const Vec a = layernorm_input(N, C, 23), bb = randn(n, 24), w = randn(C, 25, 0.5f, 1.0f), b = randn(C, 26, 0.5f);
  Vec residual(n, kNaN), out(n, kNaN), mean(N, kNaN), rstd(N, kNaN);
  residual_layernorm_forward_cpu(residual.data(), out.data(), mean.data(), rstd.data(), a.data(), bb.data(), w.data(),
                                 b.data(), N, C);
  Vec sum(n);
  for (size_t i = 0; i < n; ++i) sum[i] = a[i] + bb[i];
  EXPECT_TRUE(bit_equal("residual = a + b", residual, sum));

  // Same bits as the unfused pair, and the fp64 reference on a + b.
  Vec out_u(n, kNaN), mean_u(N, kNaN), rstd_u(N, kNaN);
  layernorm_forward_cpu(out_u.data(), mean_u.data(), rstd_u.data(), sum.data(), w.data(), b.data(), N, C);
  EXPECT_TRUE(bit_equal("out vs layernorm_forward_cpu", out, out_u));
  EXPECT_TRUE(bit_equal("mean vs layernorm_forward_cpu", mean, mean_u));
  EXPECT_TRUE(bit_equal("rstd vs layernorm_forward_cpu", rstd, rstd_u));
  DVec sum_d(n);
  for (size_t i = 0; i < n; ++i) sum_d[i] = static_cast<double>(a[i]) + static_cast<double>(bb[i]);
  const ref::LayerNormOut r = ref::layernorm_forward(sum_d, to_double(w), to_double(b), N, C);
  EXPECT_TRUE(close_to("out", out, r.out));
  EXPECT_TRUE(close_to("mean", mean, r.mean));
  EXPECT_TRUE(close_to("rstd", rstd, r.rstd));
}

struct LayerNormBackwardCase {
  Vec x, w, b, dout, mean, rstd;
};

LayerNormBackwardCase layernorm_backward_case(int N, int C, uint64_t seed) {
  LayerNormBackwardCase k{layernorm_input(N, C, seed),
                          randn(C, seed + 1, 0.5f, 1.0f),
                          randn(C, seed + 2, 0.5f),
                          randn(static_cast<size_t>(N) * C, seed + 3),
                          Vec(N),
                          Vec(N)};
  Vec out(static_cast<size_t>(N) * C);
  layernorm_forward_cpu(out.data(), k.mean.data(), k.rstd.data(), k.x.data(), k.w.data(), k.b.data(), N, C);
  return k;
}

TEST_P(LayerNorm, BackwardMatchesReferenceAndAccumulates) {
  const auto [N, C] = GetParam();
  const size_t n = static_cast<size_t>(N) * C;
  const LayerNormBackwardCase k = layernorm_backward_case(N, C, 30);
  auto run = [&](Vec& dinp, Vec& dw, Vec& db) {
    layernorm_backward_cpu(dinp.data(), dw.data(), db.data(), k.dout.data(), k.x.data(), k.w.data(), k.mean.data(),
                           k.rstd.data(), N, C);
  };
  Vec dinp(n, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  run(dinp, dw, db);
  const ref::LayerNormGrads g = ref::layernorm_backward(to_double(k.dout), to_double(k.x), to_double(k.w), N, C);
  EXPECT_TRUE(close_to("dinp", dinp, g.dinp));
  EXPECT_TRUE(close_to("dweight", dw, g.dweight));
  EXPECT_TRUE(close_to("dbias", db, g.dbias));

  // All three outputs are documented as +=: on prefilled buffers they add the same gradient.
  const Vec dinp0 = randn(n, 34), dw0 = randn(C, 35), db0 = randn(C, 36);
  Vec dinp_acc = dinp0, dw_acc = dw0, db_acc = db0;
  run(dinp_acc, dw_acc, db_acc);
  EXPECT_TRUE(close_to("dinp (+=)", minus(dinp_acc, dinp0), to_double(dinp), 1e-6, 1e-5));
  EXPECT_TRUE(close_to("dweight (+=)", minus(dw_acc, dw0), to_double(dw), 1e-6, 1e-5));
  EXPECT_TRUE(close_to("dbias (+=)", minus(db_acc, db0), to_double(db), 1e-6, 1e-5));
}

TEST_P(LayerNorm, ReferenceBackwardMatchesFiniteDifferences) {
  const auto [N, C] = GetParam();
  const DVec x = to_double(layernorm_input(N, C, 40)), w = to_double(randn(C, 41, 0.5f, 1.0f));
  const DVec b = to_double(randn(C, 42, 0.5f)), R = to_double(randn(static_cast<size_t>(N) * C, 43));
  const ref::LayerNormGrads g = ref::layernorm_backward(R, x, w, N, C);
  EXPECT_TRUE(matches_finite_differences(
      "dinp", [&](const DVec& v) { return ref::layernorm_forward(v, w, b, N, C).out; }, x, R, g.dinp, 44));
  EXPECT_TRUE(matches_finite_differences(
      "dweight", [&](const DVec& v) { return ref::layernorm_forward(x, v, b, N, C).out; }, w, R, g.dweight, 45));
  EXPECT_TRUE(matches_finite_differences(
      "dbias", [&](const DVec& v) { return ref::layernorm_forward(x, w, v, N, C).out; }, b, R, g.dbias, 46));
}

TEST_P(LayerNorm, BackwardIsDeterministicAcrossRunsAndThreadCounts) {
  const auto [N, C] = GetParam();
  const size_t n = static_cast<size_t>(N) * C;
  const LayerNormBackwardCase k = layernorm_backward_case(N, C, 50);
  const Vec dinp0 = randn(n, 54), dw0 = randn(C, 55), db0 = randn(C, 56);
  auto run = [&](int threads, Vec& dinp, Vec& dw, Vec& db) {
    ScopedThreads guard(threads);
    dinp = dinp0;
    dw = dw0;
    db = db0;
    layernorm_backward_cpu(dinp.data(), dw.data(), db.data(), k.dout.data(), k.x.data(), k.w.data(), k.mean.data(),
                           k.rstd.data(), N, C);
  };
  Vec dinp1, dw1, db1;
  run(1, dinp1, dw1, db1);
  for (int threads : kThreadCounts) {
    for (int rep = 0; rep < 2; ++rep) {
      Vec dinp, dw, db;
      run(threads, dinp, dw, db);
      const std::string t = ", threads=" + std::to_string(threads);
      EXPECT_TRUE(bit_equal("dinp" + t, dinp, dinp1));
      EXPECT_TRUE(bit_equal("dweight" + t, dw, dw1));
      EXPECT_TRUE(bit_equal("dbias" + t, db, db1));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNorm, ::testing::ValuesIn(kLayerNormShapes), name_of_rows);

// ---------------------------------------------------------------------------------------------------------
// gemm: linear layers

class Linear : public ::testing::TestWithParam<LinearShape> {};

TEST_P(Linear, ForwardMatchesReferenceWithAndWithoutBias) {
  const auto [N, IC, OC] = GetParam();
  const Vec inp = randn(static_cast<size_t>(N) * IC, 60), w = randn(static_cast<size_t>(IC) * OC, 61, 0.1f);
  const Vec bias = randn(OC, 62);
  for (const bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with bias" : "without bias");
    // NaN prefill: the output is overwritten, never read (beta = 0 must not propagate NaN).
    Vec out(static_cast<size_t>(N) * OC, kNaN);
    linear_forward_cpu(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, IC, OC);
    const DVec r = ref::linear_forward(to_double(inp), to_double(w), with_bias ? to_double(bias) : DVec{}, N, IC, OC);
    EXPECT_TRUE(close_to("out", out, r));
    Vec again(out.size(), 12345.0f);
    linear_forward_cpu(again.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, IC, OC);
    EXPECT_TRUE(bit_equal("out, second run", again, out));
  }
}

TEST_P(Linear, BackwardMatchesReferenceWithDocumentedAccumulation) {
  const auto [N, IC, OC] = GetParam();
  const Vec inp = randn(static_cast<size_t>(N) * IC, 63), w = randn(static_cast<size_t>(IC) * OC, 64, 0.1f);
  const Vec dout = randn(static_cast<size_t>(N) * OC, 65);
  const ref::LinearGrads g = ref::linear_backward(to_double(dout), to_double(inp), to_double(w), N, IC, OC);

  // dinp is overwritten (NaN prefill must vanish); dw and dbias accumulate.
  const Vec dw0 = randn(w.size(), 66), db0 = randn(OC, 67);
  Vec dinp(inp.size(), kNaN), dw = dw0, db = db0;
  linear_backward_cpu(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC, OC);
  EXPECT_TRUE(close_to("dinp", dinp, g.dinp));
  EXPECT_TRUE(close_to("dw (+=)", minus(dw, dw0), g.dw));
  EXPECT_TRUE(close_to("dbias (+=)", minus(db, db0), g.dbias));

  // From zero: the precise error of dw and dbias.
  Vec dw_z(w.size(), 0.0f), db_z(OC, 0.0f);
  linear_backward_cpu(dinp.data(), dw_z.data(), db_z.data(), dout.data(), inp.data(), w.data(), N, IC, OC);
  EXPECT_TRUE(close_to("dw", dw_z, g.dw));
  EXPECT_TRUE(close_to("dbias", db_z, g.dbias));

  // nullptr dinp / dbias: skipped, and dw gets the same bits.
  Vec dw_n = dw0;
  linear_backward_cpu(nullptr, dw_n.data(), nullptr, dout.data(), inp.data(), w.data(), N, IC, OC);
  EXPECT_TRUE(bit_equal("dw with nullptr dinp and dbias", dw_n, dw));
}

TEST_P(Linear, ReferenceBackwardMatchesFiniteDifferences) {
  const auto [N, IC, OC] = GetParam();
  const DVec inp = to_double(randn(static_cast<size_t>(N) * IC, 70));
  const DVec w = to_double(randn(static_cast<size_t>(IC) * OC, 71, 0.1f)), bias = to_double(randn(OC, 72));
  const DVec R = to_double(randn(static_cast<size_t>(N) * OC, 73));
  const ref::LinearGrads g = ref::linear_backward(R, inp, w, N, IC, OC);
  EXPECT_TRUE(matches_finite_differences(
      "dinp", [&](const DVec& v) { return ref::linear_forward(v, w, bias, N, IC, OC); }, inp, R, g.dinp, 74,
      kFdCoordsGemm));
  EXPECT_TRUE(matches_finite_differences(
      "dw", [&](const DVec& v) { return ref::linear_forward(inp, v, bias, N, IC, OC); }, w, R, g.dw, 75,
      kFdCoordsGemm));
  EXPECT_TRUE(matches_finite_differences(
      "dbias", [&](const DVec& v) { return ref::linear_forward(inp, w, v, N, IC, OC); }, bias, R, g.dbias, 76,
      kFdCoordsGemm));
}

// gemm.hpp promises bit-for-bit repeatable results. That holds for a fixed thread count only: OpenBLAS's
// 1-thread and 2-thread paths sum some elements in different orders (seen with OpenBLAS 0.3.21 on AMD EPYC:
// ~1/3 of the elements of a 37x72x216 product differ in the last bits), so no cross-count check here.
TEST_P(Linear, IsRepeatableForEachThreadCount) {
  const auto [N, IC, OC] = GetParam();
  const Vec inp = randn(static_cast<size_t>(N) * IC, 77), w = randn(static_cast<size_t>(IC) * OC, 78, 0.1f);
  const Vec bias = randn(OC, 79), dout = randn(static_cast<size_t>(N) * OC, 80), dw0 = randn(w.size(), 81);
  struct Result {
    Vec out, dinp, dw, db;
  };
  auto run = [&]() {
    Result r{Vec(static_cast<size_t>(N) * OC), Vec(inp.size()), dw0, Vec(OC, 0.5f)};
    linear_forward_cpu(r.out.data(), inp.data(), w.data(), bias.data(), N, IC, OC);
    linear_backward_cpu(r.dinp.data(), r.dw.data(), r.db.data(), dout.data(), inp.data(), w.data(), N, IC, OC);
    return r;
  };
  for (int threads : kThreadCounts) {
    ScopedThreads guard(threads);
    const Result r1 = run();
    for (int rep = 0; rep < 2; ++rep) {
      const Result r = run();
      const std::string t = ", threads=" + std::to_string(threads);
      EXPECT_TRUE(bit_equal("out" + t, r.out, r1.out));
      EXPECT_TRUE(bit_equal("dinp" + t, r.dinp, r1.dinp));
      EXPECT_TRUE(bit_equal("dw" + t, r.dw, r1.dw));
      EXPECT_TRUE(bit_equal("dbias" + t, r.db, r1.db));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Linear, ::testing::ValuesIn(kLinearShapes), name_of_linear);

// ---------------------------------------------------------------------------------------------------------
// gemm: bias_backward

class BiasBackward : public ::testing::TestWithParam<RowShape> {};

TEST_P(BiasBackward, AccumulatesColumnSums) {
  const auto [N, OC] = GetParam();
  const Vec dout = randn(static_cast<size_t>(N) * OC, 90);
  DVec sums(OC, 0.0);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < OC; ++j) sums[j] += dout[static_cast<size_t>(i) * OC + j];
  Vec db(OC, 0.0f);
  bias_backward_cpu(db.data(), dout.data(), N, OC);
  EXPECT_TRUE(close_to("dbias", db, sums));
  const Vec db0 = randn(OC, 91);
  Vec acc = db0;
  bias_backward_cpu(acc.data(), dout.data(), N, OC);
  DVec expect(OC);
  for (int j = 0; j < OC; ++j) expect[j] = db0[j] + sums[j];
  EXPECT_TRUE(close_to("dbias (+=)", acc, expect));
}

TEST_P(BiasBackward, IsDeterministicAcrossRunsAndThreadCounts) {
  const auto [N, OC] = GetParam();
  const Vec dout = randn(static_cast<size_t>(N) * OC, 92), db0 = randn(OC, 93);
  auto run = [&](int threads) {
    ScopedThreads guard(threads);
    Vec db = db0;
    bias_backward_cpu(db.data(), dout.data(), N, OC);
    return db;
  };
  const Vec r1 = run(1);
  for (int threads : kThreadCounts)
    for (int rep = 0; rep < 2; ++rep)
      EXPECT_TRUE(bit_equal("dbias, threads=" + std::to_string(threads), run(threads), r1));
}

INSTANTIATE_TEST_SUITE_P(Shapes, BiasBackward, ::testing::ValuesIn(kBiasShapes), name_of_rows);

// ---------------------------------------------------------------------------------------------------------
// gemm: tied LM head

class LmHead : public ::testing::TestWithParam<VocabShape> {};

// wte (Vp,C) with the padded vocabulary rows zero, as the model keeps them.
Vec padded_wte(int V, int Vp, int C, uint64_t seed) {
  Vec wte = randn(static_cast<size_t>(Vp) * C, seed, 0.1f);
  std::fill(wte.begin() + static_cast<std::ptrdiff_t>(V) * C, wte.end(), 0.0f);
  return wte;
}

TEST_P(LmHead, ForwardMatchesReferenceAndPaddingLogitsAreZero) {
  const auto [N, C, V, Vp] = GetParam();
  const Vec inp = randn(static_cast<size_t>(N) * C, 100), wte = padded_wte(V, Vp, C, 101);
  Vec logits(static_cast<size_t>(N) * Vp, kNaN);
  lm_head_forward_cpu(logits.data(), inp.data(), wte.data(), N, C, Vp);
  EXPECT_TRUE(close_to("logits", logits, ref::lm_head_forward(to_double(inp), to_double(wte), N, C, Vp)));
  for (int i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) ASSERT_EQ(logits[static_cast<size_t>(i) * Vp + j], 0.0f) << "padding logit " << j;
  Vec again(logits.size(), kNaN);
  lm_head_forward_cpu(again.data(), inp.data(), wte.data(), N, C, Vp);
  EXPECT_TRUE(bit_equal("logits, second run", again, logits));
}

TEST_P(LmHead, BackwardMatchesReferenceWithDocumentedAccumulation) {
  const auto [N, C, V, Vp] = GetParam();
  const Vec inp = randn(static_cast<size_t>(N) * C, 102), wte = padded_wte(V, Vp, C, 103);
  // Gradient as softmax_xent leaves it: zero in the padding columns.
  Vec dlogits = randn(static_cast<size_t>(N) * Vp, 104);
  for (int i = 0; i < N; ++i)
    std::fill(dlogits.begin() + static_cast<std::ptrdiff_t>(i) * Vp + V,
              dlogits.begin() + static_cast<std::ptrdiff_t>(i + 1) * Vp, 0.0f);
  const ref::LmHeadGrads g = ref::lm_head_backward(to_double(dlogits), to_double(inp), to_double(wte), N, C, Vp);

  const Vec dwte0 = padded_wte(V, Vp, C, 105);  // accumulated gradient, padding rows zero
  Vec dinp(inp.size(), kNaN), dwte = dwte0;
  lm_head_backward_cpu(dinp.data(), dwte.data(), dlogits.data(), inp.data(), wte.data(), N, C, Vp);
  EXPECT_TRUE(close_to("dinp (overwritten)", dinp, g.dinp));
  EXPECT_TRUE(close_to("dwte (+=)", minus(dwte, dwte0), g.dwte));
  for (size_t i = static_cast<size_t>(V) * C; i < dwte.size(); ++i) ASSERT_EQ(dwte[i], 0.0f) << "padding row of dwte";

  Vec dwte_z(wte.size(), 0.0f);
  lm_head_backward_cpu(dinp.data(), dwte_z.data(), dlogits.data(), inp.data(), wte.data(), N, C, Vp);
  EXPECT_TRUE(close_to("dwte", dwte_z, g.dwte));

  Vec dinp2(inp.size(), kNaN), dwte2 = dwte0;
  lm_head_backward_cpu(dinp2.data(), dwte2.data(), dlogits.data(), inp.data(), wte.data(), N, C, Vp);
  EXPECT_TRUE(bit_equal("dinp, second run", dinp2, dinp));
  EXPECT_TRUE(bit_equal("dwte, second run", dwte2, dwte));
}

TEST_P(LmHead, ReferenceBackwardMatchesFiniteDifferences) {
  const auto [N, C, V, Vp] = GetParam();
  const DVec inp = to_double(randn(static_cast<size_t>(N) * C, 106)), wte = to_double(padded_wte(V, Vp, C, 107));
  const DVec R = to_double(randn(static_cast<size_t>(N) * Vp, 108));
  const ref::LmHeadGrads g = ref::lm_head_backward(R, inp, wte, N, C, Vp);
  EXPECT_TRUE(matches_finite_differences(
      "dinp", [&](const DVec& v) { return ref::lm_head_forward(v, wte, N, C, Vp); }, inp, R, g.dinp, 109,
      kFdCoordsGemm));
  EXPECT_TRUE(matches_finite_differences(
      "dwte", [&](const DVec& v) { return ref::lm_head_forward(inp, v, N, C, Vp); }, wte, R, g.dwte, 110,
      kFdCoordsGemm));
}

INSTANTIATE_TEST_SUITE_P(Shapes, LmHead, ::testing::ValuesIn(kVocabShapes), name_of_vocab);

// ---------------------------------------------------------------------------------------------------------
// attention

class Attention : public ::testing::TestWithParam<AttnShape> {};

// Scale 1.5 makes the attention rows neither uniform nor one-hot.
Vec attention_qkv(int B, int T, int C, uint64_t seed) {
  return randn(static_cast<size_t>(B) * T * 3 * C, seed, 1.5f);
}

TEST_P(Attention, ForwardMatchesReferenceAndMasksTheFuture) {
  const auto [B, T, C, NH] = GetParam();
  const Vec qkv = attention_qkv(B, T, C, 120);
  Vec out(static_cast<size_t>(B) * T * C, kNaN), att(static_cast<size_t>(B) * NH * T * T, kNaN);
  attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, C, NH);
  const ref::AttentionOut r = ref::attention_forward(to_double(qkv), B, T, C, NH);
  EXPECT_TRUE(close_to("out", out, r.out));
  EXPECT_TRUE(close_to("att", att, r.att));
  for (int bh = 0; bh < B * NH; ++bh)
    for (int t = 0; t < T; ++t) {
      const float* a = att.data() + (static_cast<size_t>(bh) * T + t) * T;
      for (int t2 = t + 1; t2 < T; ++t2) ASSERT_EQ(a[t2], 0.0f) << "att above the diagonal, t=" << t << " t2=" << t2;
      double sum = 0.0;
      for (int t2 = 0; t2 <= t; ++t2) sum += a[t2];
      ASSERT_NEAR(sum, 1.0, 1e-5) << "att row (bh=" << bh << ", t=" << t << ") is not a distribution";
    }
  Vec out2(out.size(), kNaN), att2(att.size(), kNaN);
  attention_forward_cpu(out2.data(), att2.data(), qkv.data(), B, T, C, NH);
  EXPECT_TRUE(bit_equal("out, second run", out2, out));
  EXPECT_TRUE(bit_equal("att, second run", att2, att));
}

TEST_P(Attention, BackwardMatchesReferenceAndOverwrites) {
  const auto [B, T, C, NH] = GetParam();
  const Vec qkv = attention_qkv(B, T, C, 121), dout = randn(static_cast<size_t>(B) * T * C, 122);
  Vec out(dout.size()), att(static_cast<size_t>(B) * NH * T * T);
  attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, C, NH);
  Vec dqkv(qkv.size(), kNaN);  // overwritten: the NaN prefill must disappear
  attention_backward_cpu(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  const DVec g = ref::attention_backward(to_double(dout), to_double(qkv), B, T, C, NH);
  EXPECT_TRUE(close_to("dqkv", dqkv, g));
  // Per part, so that a wrong dq cannot hide behind a larger dv.
  const size_t rows = static_cast<size_t>(B) * T;
  for (int part = 0; part < 3; ++part) {
    Vec got;
    DVec want;
    for (size_t r = 0; r < rows; ++r)
      for (int c = 0; c < C; ++c) {
        got.push_back(dqkv[r * 3 * C + static_cast<size_t>(part) * C + c]);
        want.push_back(g[r * 3 * C + static_cast<size_t>(part) * C + c]);
      }
    // With T == 1 the softmax is constant: dq and dk are exactly zero.
    if (T == 1 && part < 2) {
      for (float v : got) ASSERT_EQ(v, 0.0f);
      continue;
    }
    EXPECT_TRUE(close_to(std::string("d") + "qkv"[part], got, want));
  }
}

TEST_P(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  const auto [B, T, C, NH] = GetParam();
  const DVec qkv = to_double(attention_qkv(B, T, C, 123)), R = to_double(randn(static_cast<size_t>(B) * T * C, 124));
  const DVec g = ref::attention_backward(R, qkv, B, T, C, NH);
  EXPECT_TRUE(matches_finite_differences(
      "dqkv", [&](const DVec& v) { return ref::attention_forward(v, B, T, C, NH).out; }, qkv, R, g, 125));
}

TEST_P(Attention, BackwardIsDeterministicAcrossRunsAndThreadCounts) {
  const auto [B, T, C, NH] = GetParam();
  const Vec qkv = attention_qkv(B, T, C, 126), dout = randn(static_cast<size_t>(B) * T * C, 127);
  Vec out(dout.size()), att(static_cast<size_t>(B) * NH * T * T);
  attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, C, NH);
  auto run = [&](int threads) {
    ScopedThreads guard(threads);
    Vec dqkv(qkv.size(), kNaN);
    attention_backward_cpu(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
    return dqkv;
  };
  const Vec r1 = run(1);
  for (int threads : kThreadCounts)
    for (int rep = 0; rep < 2; ++rep)
      EXPECT_TRUE(bit_equal("dqkv, threads=" + std::to_string(threads), run(threads), r1));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Attention, ::testing::ValuesIn(kAttnShapes), name_of);

// The mma.sync attention kernels' block order (kernels/attention/tile_order.hpp): every tile exactly once,
// groups of heads one after the other with sizes that differ by at most one, and inside a group rank by
// rank (heaviest first), each rank's roles in turn, each role over all the group's heads.
TEST(AttentionTileOrder, EveryTileOnceHeaviestFirstInGroupsOfHeads) {
  using namespace kernels::attention_order;
  for (int heads : {1, 2, 5, 12, 96, 97}) {
    for (int ranks : {1, 3, 16}) {
      for (int roles : {1, 2}) {
        for (int groups : {1, 2, 3, 7, 32, 97}) {
          if (groups > heads) continue;
          const TileOrder o{heads, ranks, roles, groups};
          SCOPED_TRACE("heads=" + std::to_string(heads) + " ranks=" + std::to_string(ranks) +
                       " roles=" + std::to_string(roles) + " groups=" + std::to_string(groups));
          // the groups: consecutive heads, covering all, sizes within one of each other, larger ones first
          int next = 0;
          for (int g = 0; g < groups; ++g) {
            const TileGroup tg = tile_group(o, g);
            ASSERT_EQ(tg.first, next) << "group " << g;
            ASSERT_TRUE(tg.count == heads / groups || tg.count == heads / groups + 1) << "group " << g;
            if (g > 0) {
              ASSERT_LE(tg.count, tile_group(o, g - 1).count) << "group " << g;
            }
            next += tg.count;
          }
          ASSERT_EQ(next, heads);
          std::vector<int> group_of(static_cast<size_t>(heads));
          for (int g = 0; g < groups; ++g)
            for (int k = 0; k < tile_group(o, g).count; ++k) group_of[static_cast<size_t>(tile_group(o, g).first + k)] = g;

          ASSERT_EQ(tile_blocks(o), static_cast<long>(heads) * ranks * roles);
          std::vector<int> seen(static_cast<size_t>(tile_blocks(o)), 0);
          TileSlot prev{-1, -1, -1};
          for (int blk = 0; blk < tile_blocks(o); ++blk) {
            const TileSlot s = tile_slot(o, blk);
            ASSERT_TRUE(s.rank >= 0 && s.rank < ranks && s.role >= 0 && s.role < roles && s.head >= 0 && s.head < heads)
                << "block " << blk;
            ++seen[(static_cast<size_t>(s.head) * ranks + s.rank) * roles + s.role];
            const int g = group_of[static_cast<size_t>(s.head)];
            if (blk == 0) {
              ASSERT_TRUE(s.rank == 0 && s.role == 0 && s.head == 0);
            } else {
              const int prev_g = group_of[static_cast<size_t>(prev.head)];
              if (g == prev_g) {
                const bool later = s.rank > prev.rank || (s.rank == prev.rank && s.role > prev.role) ||
                                   (s.rank == prev.rank && s.role == prev.role && s.head == prev.head + 1);
                ASSERT_TRUE(later) << "block " << blk << " (rank " << s.rank << ", role " << s.role << ", head " << s.head
                                   << ") after (rank " << prev.rank << ", role " << prev.role << ", head " << prev.head
                                   << ")";
              } else {
                ASSERT_EQ(g, prev_g + 1) << "block " << blk << ": groups one after the other";
                ASSERT_TRUE(prev.rank == ranks - 1 && s.rank == 0 && s.role == 0 && s.head == tile_group(o, g).first)
                    << "block " << blk << ": a group starts at its first head's heaviest tile once the last ends";
              }
            }
            prev = s;
          }
          for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "tile " << i;
        }
      }
    }
  }
}

TEST(AttentionTileOrder, GroupsHoldWhatL2Keeps) {
  using namespace kernels::attention_order;
  const long head_fwd = 3l * 1024 * 64 * 2, head_bwd = 4l * 1024 * 64 * 2;  // GPT-2 124M: q, k, v (+ dout) of a head
  EXPECT_EQ(tile_groups(96, head_bwd, 0), 2);   // B = 8: at most 80 heads a group (40 MiB / 512 KiB): 48 each
  EXPECT_EQ(tile_groups(192, head_bwd, 0), 3);  // B = 16: 64 each
  EXPECT_EQ(tile_groups(96, head_fwd, 0), 1);   // at most 106 a group: all of B = 8's heads in one
  EXPECT_EQ(tile_groups(200, head_fwd, 0), 2);  // 100 each
  EXPECT_EQ(tile_groups(12, head_bwd, 0), 1);   // fewer heads than a group holds
  EXPECT_EQ(tile_groups(768, 0, 0), 1);         // no bound (the backward): one group
  EXPECT_EQ(tile_groups(5, kTileGroupBytes * 4, 0), 5);  // a head larger than the budget: alone
  EXPECT_EQ(tile_groups(96, head_bwd, 1), 96);           // at most 1 head a group: each head alone
  EXPECT_EQ(tile_groups(96, head_bwd, 96), 1);           // one group over every head
  EXPECT_EQ(tile_groups(96, head_bwd, 1000), 1);
  EXPECT_EQ(tile_groups(10, head_bwd, 3), 4);  // 3, 3, 2, 2
  for (int heads = 1; heads <= 400; ++heads) {
    for (long head_bytes : {head_fwd, head_bwd, 5l << 20, 40l << 20}) {
      const int groups = tile_groups(heads, head_bytes, 0);
      const long cap = std::min<long>(heads, std::max(1l, kTileGroupBytes / head_bytes));
      ASSERT_EQ(groups, (heads + cap - 1) / cap) << heads << " heads of " << head_bytes << " bytes: as few as fit";
      const TileGroup largest = tile_group(TileOrder{heads, 1, 1, groups}, 0);
      if (largest.count > 1) {
        ASSERT_LE(largest.count * head_bytes, kTileGroupBytes) << heads << " heads of " << head_bytes << " bytes";
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// gelu

class Gelu : public ::testing::TestWithParam<long> {};

// Normal values plus the tails, where tanh saturates.
Vec gelu_input(long n, uint64_t seed) {
  Vec x = randn(static_cast<size_t>(n), seed, 2.0f);
  const float tails[] = {-12.0f, -6.5f, 0.0f, 5.0f, 11.0f};
  for (size_t i = 0; i < std::size(tails) && i < x.size(); ++i) x[x.size() - 1 - i] = tails[i];
  return x;
}

TEST_P(Gelu, ForwardAndBackwardMatchReference) {
  const long n = GetParam();
  const Vec x = gelu_input(n, 130), dout = randn(static_cast<size_t>(n), 131);
  DVec y_ref(x.size()), dx_ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    y_ref[i] = ref::gelu(x[i]);
    dx_ref[i] = ref::gelu_grad(x[i]) * dout[i];
  }
  Vec y(x.size(), kNaN), dx(x.size(), kNaN);
  gelu_forward_cpu(y.data(), x.data(), n);
  gelu_backward_cpu(dx.data(), x.data(), dout.data(), n);
  EXPECT_TRUE(close_to("out", y, y_ref));
  EXPECT_TRUE(close_to("dinp", dx, dx_ref));

  // dinp may alias dout.
  Vec inplace = dout;
  gelu_backward_cpu(inplace.data(), x.data(), inplace.data(), n);
  EXPECT_TRUE(bit_equal("dinp aliasing dout", inplace, dx));

  Vec y2(x.size(), kNaN), dx2(x.size(), kNaN);
  gelu_forward_cpu(y2.data(), x.data(), n);
  gelu_backward_cpu(dx2.data(), x.data(), dout.data(), n);
  EXPECT_TRUE(bit_equal("out, second run", y2, y));
  EXPECT_TRUE(bit_equal("dinp, second run", dx2, dx));
}

TEST_P(Gelu, ReferenceBackwardMatchesFiniteDifferences) {
  const long n = GetParam();
  const DVec x = to_double(gelu_input(n, 132)), R = to_double(randn(static_cast<size_t>(n), 133));
  DVec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) g[i] = ref::gelu_grad(x[i]) * R[i];
  auto forward = [](const DVec& v) {
    DVec y(v.size());
    for (size_t i = 0; i < v.size(); ++i) y[i] = ref::gelu(v[i]);
    return y;
  };
  EXPECT_TRUE(matches_finite_differences("dinp", forward, x, R, g, 134));
}

INSTANTIATE_TEST_SUITE_P(Sizes, Gelu, ::testing::Values(1L, 7L, 37L, 1000L, 4097L));

// Every x on a fine grid over [-10, 10]: value and slope, pointwise.
TEST(GeluDense, MatchesReferenceOnAFineGrid) {
  Vec x;
  for (double v = -10.0; v <= 10.0; v += 1.0 / 1024) x.push_back(static_cast<float>(v));
  const long n = static_cast<long>(x.size());
  const Vec ones(x.size(), 1.0f);
  Vec y(x.size()), dx(x.size());
  gelu_forward_cpu(y.data(), x.data(), n);
  gelu_backward_cpu(dx.data(), x.data(), ones.data(), n);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(y[i], ref::gelu(x[i]), 2e-6 * std::max(1.0, std::fabs(static_cast<double>(x[i])))) << "x=" << x[i];
    ASSERT_NEAR(dx[i], ref::gelu_grad(x[i]), 2e-6 * std::max(1.0, std::fabs(static_cast<double>(x[i]))))
        << "x=" << x[i];
  }
}

// ---------------------------------------------------------------------------------------------------------
// softmax_xent

class SoftmaxXent : public ::testing::TestWithParam<VocabShape> {};

struct XentCase {
  Vec logits;  // (N,Vp), padding columns zero
  Tokens targets;
};

XentCase xent_case(int N, int V, int Vp, uint64_t seed, float scale = 3.0f, float offset = 0.0f) {
  XentCase k{randn(static_cast<size_t>(N) * Vp, seed, scale, offset),
             random_tokens(static_cast<size_t>(N), V, seed + 1)};
  for (int i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) k.logits[static_cast<size_t>(i) * Vp + j] = 0.0f;
  return k;
}

void fill_padding(Vec& logits, int N, int V, int Vp, float value) {
  for (int i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) logits[static_cast<size_t>(i) * Vp + j] = value;
}

TEST_P(SoftmaxXent, LossOnlyMatchesReferenceAndLeavesLogitsAlone) {
  const auto [N, C, V, Vp] = GetParam();
  (void)C;
  const XentCase k = xent_case(N, V, Vp, 140);
  Vec logits = k.logits, losses(N, kNaN);
  softmax_xent_cpu(losses.data(), logits.data(), k.targets.data(), N, V, Vp, 1.0f, false);
  EXPECT_TRUE(close_to("losses", losses, ref::softmax_xent_losses(to_double(k.logits), k.targets, N, V, Vp)));
  EXPECT_TRUE(bit_equal("logits untouched without write_grad", logits, k.logits));
}

TEST_P(SoftmaxXent, GradientMatchesReferenceWithZeroPadding) {
  const auto [N, C, V, Vp] = GetParam();
  (void)C;
  const XentCase k = xent_case(N, V, Vp, 141);
  const float dloss = 1.0f / (3.0f * static_cast<float>(N));  // a mean over a 3-micro-step batch, say
  Vec losses_only(N, kNaN), scratch = k.logits;
  softmax_xent_cpu(losses_only.data(), scratch.data(), k.targets.data(), N, V, Vp, dloss, false);

  Vec grad = k.logits, losses(N, kNaN);
  fill_padding(grad, N, V, Vp, 3.0e38f);  // whatever the padding held, it becomes exactly 0
  softmax_xent_cpu(losses.data(), grad.data(), k.targets.data(), N, V, Vp, dloss, true);
  const DVec g = ref::softmax_xent_grad(to_double(k.logits), k.targets, N, V, Vp, dloss);
  EXPECT_TRUE(close_to("dlogits", grad, g));
  for (int i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) {
      const float v = grad[static_cast<size_t>(i) * Vp + j];
      ASSERT_TRUE(v == 0.0f && !std::signbit(v)) << "padding gradient [" << i << "," << j << "] = " << v;
    }
  EXPECT_TRUE(bit_equal("losses with and without write_grad", losses, losses_only));

  Vec grad2 = k.logits, losses2(N, kNaN);
  softmax_xent_cpu(losses2.data(), grad2.data(), k.targets.data(), N, V, Vp, dloss, true);
  EXPECT_TRUE(bit_equal("dlogits, second run", grad2, grad));
  EXPECT_TRUE(bit_equal("losses, second run", losses2, losses));
}

// Padding columns never reach the loss or the gradient, whatever they hold.
TEST_P(SoftmaxXent, PaddingIsNeverRead) {
  const auto [N, C, V, Vp] = GetParam();
  (void)C;
  const XentCase k = xent_case(N, V, Vp, 142);
  Vec base_grad = k.logits, base_losses(N);
  softmax_xent_cpu(base_losses.data(), base_grad.data(), k.targets.data(), N, V, Vp, 1.0f, true);
  const float poison[] = {3.0e38f, -3.0e38f, std::numeric_limits<float>::infinity(), kNaN, 1.0e4f};
  for (const float p : poison) {
    SCOPED_TRACE("padding = " + std::to_string(p));
    for (const bool write_grad : {false, true}) {
      Vec logits = k.logits, losses(N, kNaN);
      fill_padding(logits, N, V, Vp, p);
      softmax_xent_cpu(losses.data(), logits.data(), k.targets.data(), N, V, Vp, 1.0f, write_grad);
      EXPECT_TRUE(bit_equal("losses", losses, base_losses));
      if (write_grad) {
        EXPECT_TRUE(bit_equal("dlogits", logits, base_grad));
      }
    }
  }
}

// Large logits (a +1000 offset, fp32 spacing 6e-5 there) stay finite and match the fp64 reference on the
// same fp32 values: the max subtraction keeps exp in range.
TEST_P(SoftmaxXent, LargeLogitsAreStable) {
  const auto [N, C, V, Vp] = GetParam();
  (void)C;
  const XentCase k = xent_case(N, V, Vp, 143, 30.0f, 1000.0f);
  Vec grad = k.logits, losses(N, kNaN);
  softmax_xent_cpu(losses.data(), grad.data(), k.targets.data(), N, V, Vp, 1.0f, true);
  EXPECT_TRUE(close_to("losses", losses, ref::softmax_xent_losses(to_double(k.logits), k.targets, N, V, Vp)));
  EXPECT_TRUE(close_to("dlogits", grad, ref::softmax_xent_grad(to_double(k.logits), k.targets, N, V, Vp, 1.0)));
}

TEST_P(SoftmaxXent, ReferenceGradientMatchesFiniteDifferences) {
  const auto [N, C, V, Vp] = GetParam();
  (void)C;
  const XentCase k = xent_case(N, V, Vp, 144);
  const DVec logits = to_double(k.logits);
  const double dloss = 0.37;
  const DVec g = ref::softmax_xent_grad(logits, k.targets, N, V, Vp, dloss);
  // Objective dloss * sum_i losses[i]: "out" = losses, R = dloss everywhere.
  const DVec R(N, dloss);
  EXPECT_TRUE(matches_finite_differences(
      "dlogits", [&](const DVec& v) { return ref::softmax_xent_losses(v, k.targets, N, V, Vp); }, logits, R, g, 145));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SoftmaxXent, ::testing::ValuesIn(kVocabShapes), name_of_vocab);

// ---------------------------------------------------------------------------------------------------------
// adamw

struct AdamWCase {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
};
void PrintTo(const AdamWCase& c, std::ostream* os) {
  *os << "lr" << c.lr << "_b1_" << c.beta1 << "_b2_" << c.beta2 << "_eps" << c.eps << "_wd" << c.weight_decay << "_gs"
      << c.grad_scale;
}

class AdamW : public ::testing::TestWithParam<AdamWCase> {};

// Several steps from zero moments, with the gradient scale changing from step to step (tiny ones too), on
// awkward sizes. Parameters start at GPT-2's init scale (0.02) so the fp32 parameter spacing stays far
// below the size of an update, and the update itself is what gets compared.
TEST_P(AdamW, MatchesTorchFormulaOverSeveralSteps) {
  const AdamWCase hc = GetParam();
  const float grad_scales[] = {1.0f, 0.1f, 3.0f, 1e-3f, 1.0f, 0.5f};
  for (const long n : {1L, 7L, 1001L, 65537L}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const size_t un = static_cast<size_t>(n);
    const Vec p0 = randn(un, 150, 0.02f);
    Vec p = p0, m(un, 0.0f), v(un, 0.0f);
    ref::AdamWState r{to_double(p0), DVec(un, 0.0), DVec(un, 0.0)};
    for (long step = 1; step <= static_cast<long>(std::size(grad_scales)); ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const Vec grads = randn(un, 150 + static_cast<uint64_t>(step), grad_scales[step - 1]);
      const AdamWStep s{hc.lr, hc.beta1, hc.beta2, hc.eps, hc.weight_decay, hc.grad_scale, step};
      adamw_update_cpu(p.data(), grads.data(), m.data(), v.data(), n, s);
      ref::adamw_step(r, grads, s);
      DVec update_ref(un);
      for (size_t i = 0; i < un; ++i) update_ref[i] = r.params[i] - p0[i];
      EXPECT_TRUE(close_to("params - params0", minus(p, p0), update_ref));
      EXPECT_TRUE(close_to("params", p, r.params, 1e-6, 1e-5));
      EXPECT_TRUE(close_to("m", m, r.m));
      EXPECT_TRUE(close_to("v", v, r.v));
    }
  }
}

// Bias correction late in training (step 1000, warm moments): one step from the kernel's own fp32 state.
TEST_P(AdamW, MatchesTorchFormulaLateInTraining) {
  const AdamWCase hc = GetParam();
  const size_t n = 4099;
  const Vec p0 = randn(n, 160, 0.02f), m0 = randn(n, 161, 0.01f), grads = randn(n, 163);
  Vec v0 = randn(n, 162, 1e-4f);
  for (float& x : v0) x = x * x + 1e-9f;
  for (const long step : {999L, 1000L, 20000L}) {
    SCOPED_TRACE("step " + std::to_string(step));
    Vec p = p0, m = m0, v = v0;
    const AdamWStep s{hc.lr, hc.beta1, hc.beta2, hc.eps, hc.weight_decay, hc.grad_scale, step};
    adamw_update_cpu(p.data(), grads.data(), m.data(), v.data(), static_cast<long>(n), s);
    ref::AdamWState r{to_double(p0), to_double(m0), to_double(v0)};
    ref::adamw_step(r, grads, s);
    DVec update_ref(n);
    for (size_t i = 0; i < n; ++i) update_ref[i] = r.params[i] - p0[i];
    EXPECT_TRUE(close_to("params - params0", minus(p, p0), update_ref));
    EXPECT_TRUE(close_to("m", m, r.m));
    EXPECT_TRUE(close_to("v", v, r.v));
  }
}

TEST_P(AdamW, IsDeterministic) {
  const AdamWCase hc = GetParam();
  const size_t n = 70001;
  const Vec p0 = randn(n, 170, 0.02f), grads = randn(n, 171);
  const AdamWStep s{hc.lr, hc.beta1, hc.beta2, hc.eps, hc.weight_decay, hc.grad_scale, 1};
  auto run = [&](int threads) {
    ScopedThreads guard(threads);
    Vec p = p0, m(n, 0.0f), v(n, 0.0f);
    adamw_update_cpu(p.data(), grads.data(), m.data(), v.data(), static_cast<long>(n), s);
    return p;
  };
  const Vec r1 = run(1);
  for (int threads : kThreadCounts)
    EXPECT_TRUE(bit_equal("params, threads=" + std::to_string(threads), run(threads), r1));
}

INSTANTIATE_TEST_SUITE_P(Hyperparameters, AdamW,
                         ::testing::Values(AdamWCase{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f},
                                           AdamWCase{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f},
                                           AdamWCase{3e-3f, 0.8f, 0.99f, 1e-6f, 0.5f, 0.25f}));

// grad_scale multiplies the gradient first: scaling by 1/2 in the kernel equals halving the gradient
// beforehand (exact in fp32), bit for bit.
TEST(AdamWScale, GradScaleEqualsPrescaledGradient) {
  const size_t n = 1031;
  const Vec p0 = randn(n, 180, 0.02f), grads = randn(n, 181);
  Vec half(n);
  for (size_t i = 0; i < n; ++i) half[i] = grads[i] * 0.5f;
  Vec pa = p0, ma(n, 0.0f), va(n, 0.0f), pb = p0, mb(n, 0.0f), vb(n, 0.0f);
  for (long step = 1; step <= 3; ++step) {
    adamw_update_cpu(pa.data(), grads.data(), ma.data(), va.data(), static_cast<long>(n),
                     AdamWStep{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step});
    adamw_update_cpu(pb.data(), half.data(), mb.data(), vb.data(), static_cast<long>(n),
                     AdamWStep{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step});
  }
  EXPECT_TRUE(bit_equal("params", pa, pb));
  EXPECT_TRUE(bit_equal("m", ma, mb));
  EXPECT_TRUE(bit_equal("v", va, vb));
}

// With a zero gradient and zero moments only the decoupled decay acts: params *= 1 - lr * wd.
TEST(AdamWScale, ZeroGradientOnlyDecays) {
  const size_t n = 257;
  const Vec p0 = randn(n, 182), zeros(n, 0.0f);
  Vec p = p0, m(n, 0.0f), v(n, 0.0f);
  const AdamWStep s{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
  adamw_update_cpu(p.data(), zeros.data(), m.data(), v.data(), static_cast<long>(n), s);
  DVec expect(n);
  for (size_t i = 0; i < n; ++i) expect[i] = p0[i] * (1.0 - 0.01 * 0.1);
  EXPECT_TRUE(close_to("params", p, expect, 1e-7, 1e-7));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(m[i], 0.0f);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], 0.0f);
}

// ---------------------------------------------------------------------------------------------------------
// reduce

const long kReduceSizes[] = {0, 1, 7, 16383, 16384, 16385, 100003, (1L << 20) + 3};

TEST(Reduce, SumSquaresMatchesReference) {
  for (const long n : kReduceSizes) {
    const Vec x = randn(static_cast<size_t>(n), 190, 3.0f);
    long double want = 0.0L;
    for (float v : x) want += static_cast<long double>(v) * v;
    const double got = sum_squares_cpu(x.data(), n);
    if (n == 0) {
      EXPECT_EQ(got, 0.0);
      continue;
    }
    EXPECT_NEAR(got, static_cast<double>(want), 1e-13 * static_cast<double>(want)) << "n=" << n;
  }
}

TEST(Reduce, SumSquaresIsDeterministicAcrossThreadCounts) {
  for (const long n : kReduceSizes) {
    const Vec x = randn(static_cast<size_t>(n), 191, 3.0f);
    auto run = [&](int threads) {
      ScopedThreads guard(threads);
      return std::vector<double>{sum_squares_cpu(x.data(), n)};
    };
    const std::vector<double> r1 = run(1);
    for (int threads : kThreadCounts)
      for (int rep = 0; rep < 2; ++rep)
        EXPECT_TRUE(bit_equal("n=" + std::to_string(n) + ", threads=" + std::to_string(threads), run(threads), r1));
  }
}

TEST(Reduce, ScaleMultipliesEveryElement) {
  for (const long n : {1L, 7L, 16385L, 100003L}) {
    const Vec x0 = randn(static_cast<size_t>(n), 192);
    for (const float a : {0.0f, 0.37f, -2.0f, 1.0f}) {
      Vec x = x0, expect(x0.size());
      for (size_t i = 0; i < x0.size(); ++i) expect[i] = x0[i] * a;  // one rounding, as the fp64 product rounded
      scale_cpu(x.data(), a, n);
      EXPECT_TRUE(bit_equal("n=" + std::to_string(n) + ", a=" + std::to_string(a), x, expect));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Thread-count independence of the remaining non-BLAS kernels: each output element is computed by one
// thread in a fixed order, so 1, 2 and 3 threads must agree bit for bit.

TEST(ThreadCount, ForwardKernelsDoNotDependOnIt) {
  const int B = 3, T = 37, C = 72, NH = 4, V = 11, Vocab = 257, Vp = 384;
  const size_t n = static_cast<size_t>(B) * T * C, N = static_cast<size_t>(B) * T;
  const Tokens inp = random_tokens(N, V, 200), targets = random_tokens(N, Vocab, 201);
  const Vec wte = randn(static_cast<size_t>(V) * C, 202), wpe = randn(static_cast<size_t>(T) * C, 203);
  const Vec x = layernorm_input(static_cast<int>(N), C, 204), y = randn(n, 205), w = randn(C, 206), b = randn(C, 207);
  const Vec qkv = attention_qkv(B, T, C, 208), logits0 = randn(N * Vp, 209, 3.0f);
  auto run = [&](int threads) {
    ScopedThreads guard(threads);
    std::vector<Vec> r;
    Vec out(n), mean(N), rstd(N), res(n), att(static_cast<size_t>(B) * NH * T * T), losses(N);
    encoder_forward_cpu(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    r.push_back(out);
    layernorm_forward_cpu(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), static_cast<int>(N), C);
    r.insert(r.end(), {out, mean, rstd});
    residual_layernorm_forward_cpu(res.data(), out.data(), mean.data(), rstd.data(), x.data(), y.data(), w.data(),
                                   b.data(), static_cast<int>(N), C);
    r.insert(r.end(), {res, out, mean, rstd});
    attention_forward_cpu(out.data(), att.data(), qkv.data(), B, T, C, NH);
    r.insert(r.end(), {out, att});
    gelu_forward_cpu(out.data(), x.data(), static_cast<long>(n));
    r.push_back(out);
    gelu_backward_cpu(out.data(), x.data(), y.data(), static_cast<long>(n));
    r.push_back(out);
    Vec logits = logits0;
    softmax_xent_cpu(losses.data(), logits.data(), targets.data(), static_cast<int>(N), Vocab, Vp, 0.01f, true);
    r.insert(r.end(), {losses, logits});
    Vec scaled = y;
    scale_cpu(scaled.data(), 0.3f, static_cast<long>(n));
    r.push_back(scaled);
    return r;
  };
  const std::vector<Vec> r1 = run(1);
  for (int threads : kThreadCounts) {
    const std::vector<Vec> r = run(threads);
    for (size_t k = 0; k < r.size(); ++k)
      EXPECT_TRUE(bit_equal("output " + std::to_string(k) + ", threads=" + std::to_string(threads), r[k], r1[k]));
  }
}

// ---------------------------------------------------------------------------------------------------------
// cpu_math: fast_expf / fast_tanhf against libm in fp64

TEST(CpuMath, FastExpfRelativeErrorOnDenseRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  auto check = [&](float x) {
    const double want = std::exp(static_cast<double>(x));
    const double err = std::fabs(static_cast<double>(cpu::fast_expf(x)) - want) / want;
    if (!(err <= worst)) {
      worst = err;
      worst_x = x;
    }
  };
  for (double x = -87.0; x <= 88.0; x += 1.0 / 8192) check(static_cast<float>(x));
  // Every float in a few windows where the Cody-Waite reduction switches n, and around 0.
  for (const float c : {-0.5f * 0.6931472f, 0.5f * 0.6931472f, 0.0f, 10.5f * 0.6931472f, -60.5f * 0.6931472f}) {
    float x = c;
    for (int i = 0; i < 20000; ++i) x = std::nextafter(x, -1e30f);
    for (int i = 0; i < 40000; ++i, x = std::nextafter(x, 1e30f)) check(x);
  }
  EXPECT_LE(worst, 3e-7) << "worst at x=" << worst_x;
  if (verbose()) std::printf("    fast_expf worst relative error %.3e at x=%.9g\n", worst, worst_x);
}

TEST(CpuMath, FastExpfClampsInsteadOfOverflowingBelow) {
  for (const float x : {-87.31f, -88.0f, -100.0f, -1e30f, -std::numeric_limits<float>::infinity()}) {
    const float y = cpu::fast_expf(x);
    EXPECT_TRUE(std::isfinite(y) && y >= 0.0f && y < 1.3e-38f) << "fast_expf(" << x << ") = " << y;
  }
  EXPECT_EQ(cpu::fast_expf(0.0f), 1.0f);
}

// The top of the documented range [-87.3, 88.3]: beyond 127.5 * ln 2 (about 88.376) the reduction would pick
// n = 128 and 2^n would overflow the exponent field (+inf where exp(x) is finite), so the clamp must stay
// below it; above the range the result is the finite clamped value.
TEST(CpuMath, FastExpfTopOfDocumentedRange) {
  for (const float x : {88.31f, 88.376f, 88.7f, 1e30f, std::numeric_limits<float>::infinity()})
    EXPECT_TRUE(std::isfinite(cpu::fast_expf(x))) << "fast_expf(" << x << ")";
  for (float x = 88.0f; x <= 88.3f; x = std::nextafter(x, 100.0f)) {
    const double want = std::exp(static_cast<double>(x));
    const float got = cpu::fast_expf(x);
    ASSERT_TRUE(std::isfinite(got)) << "fast_expf(" << x << ") = " << got << ", exp = " << want;
    ASSERT_LE(std::fabs(got - want) / want, 3e-7) << "x=" << x;
  }
}

TEST(CpuMath, FastTanhfAbsoluteErrorOnDenseRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (double xd = -20.0; xd <= 20.0; xd += 1.0 / 65536) {
    const float x = static_cast<float>(xd);
    const double err = std::fabs(static_cast<double>(cpu::fast_tanhf(x)) - std::tanh(static_cast<double>(x)));
    if (!(err <= worst)) {
      worst = err;
      worst_x = x;
    }
  }
  EXPECT_LE(worst, 1e-6) << "worst at x=" << worst_x;
  if (verbose()) std::printf("    fast_tanhf worst absolute error %.3e at x=%.9g\n", worst, worst_x);
}

TEST(CpuMath, FastTanhfSaturatesAndIsZeroAtZero) {
  EXPECT_EQ(cpu::fast_tanhf(0.0f), 0.0f);
  for (const float x : {20.0f, 45.0f, 100.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(cpu::fast_tanhf(x), 1.0f) << "x=" << x;
    EXPECT_EQ(cpu::fast_tanhf(-x), -1.0f) << "x=" << -x;
  }
}

}  // namespace
}  // namespace gpt2::kernels
