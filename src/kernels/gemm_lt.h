// Matrix products on Tensor Cores through cuBLASLt, with the fused epilogues
// a transformer's linear layers need (bias, GELU with its saved input, the
// GELU gradient with the bias gradient), for row-major matrices:
//
//   D[m, n] = epilogue(op(A)[m, k] · op(B)[k, n])
//   A is stored [m, k] (or [k, m] when trans_a), B [k, n] (or [n, k] when
//   trans_b), D [m, n]; all dense row-major (leading dimension = row length).
//
// cuBLAS is column-major. A row-major R x C matrix is, byte for byte, the
// column-major C x R matrix (its transpose) with leading dimension C. So the
// row-major product D = op(A) op(B) is computed as the column-major product
//   D^T[n, m] = op(B)^T[n, k] · op(A)^T[k, m]
// i.e. cuBLAS's "A" is our B and cuBLAS's "B" is our A, with cuBLAS sizes
// (m_c, n_c, k_c) = (n, m, k):
//   our B stored [k, n] -> col-major n x k, ld n, op N   (trans_b: k x n, ld k, op T)
//   our A stored [m, k] -> col-major k x m, ld k, op N   (trans_a: m x k, ld m, op T)
//   our D stored [m, n] -> col-major n x m, ld n
// What the epilogues mean in row-major terms follows from that:
//   BIAS / GELU_AUX_BIAS: bias has length n (cuBLAS "rows of D"): one value
//     per output column, added to every row.
//   GELU_AUX_BIAS: aux is the pre-activation, same shape as D ([m, n],
//     leading dimension n, which cuBLASLt requires to be a multiple of 8),
//     stored in D's dtype. cuBLASLt's GELU is the tanh form.
//   DGELU_BGRAD: D = (op(A) op(B)) * gelu'(aux) and the bias gradient, of
//     length n, is D summed over its m rows.
// (Weight-gradient products take their bias gradients from
// kernels/column_sums, not from cuBLASLt's BGRADB: see there.)
//
// Precision: bf16/fp16 inputs multiply with fp32 accumulation (compute
// CUBLAS_COMPUTE_32F) into D of the input dtype or fp32; fp32 inputs use
// TF32 Tensor Cores (CUBLAS_COMPUTE_32F_FAST_TF32) into fp32 D.
//
// fp8 products (ab_type kE4M3 or kE5M2; issue 39): D = a_scale_inv *
// b_scale_inv * (A B^T) (+ bias), fp32 accumulation, bf16 or fp32 D. What
// cuBLASLt takes on Hopper (cuBLAS's cublasLtMatmul fp8 requirements), and
// what gemm_lt checks before asking it (else GemmUnsupported, naming the
// rule):
//   - "TN" only: both operands K-major. In our row-major terms A [m, k]
//     (trans_a false) and B stored [n, k] (trans_b true): D = A B^T.
//   - A and B each E4M3 or E5M2, not both E5M2 (E4M3 x E4M3 forward,
//     E5M2 x E4M3 or E4M3 x E5M2 for gradients); b_fp8_type is B's.
//   - m, n and k multiples of 16, A, B and D 16-byte aligned (cuBLASLt's
//     fp8 kernels need 16-byte aligned leading dimensions and pointers; the
//     same rule as torch._scaled_mm's).
//   - the scales: device floats (a_scale_inv, b_scale_inv; non-null, 16-byte
//     aligned: on the H100 cuBLASLt returned NOT_SUPPORTED for a scale 4 or 8
//     bytes past a boundary), each operand's dequantisation factor (1 / the
//     scale it was cast with).
//   - epilogue kDefault or kBias (cuBLASLt's fp8 table takes a bf16 bias,
//     also with an fp32 D; the heuristic refuses what it does not take:
//     GemmUnsupported); no accumulate.
//   - fast_accum: CUBLASLT_MATMUL_DESC_FAST_ACCUM, faster, with fewer
//     promotions of the partial sums to fp32: on for the forward, off for
//     gradients (as TransformerEngine and torchao do).
//
// Cost per call after the first with the same shapes: descriptors, layouts
// and the chosen algorithm are cached per (shapes, dtypes, epilogue,
// transposes, pointer alignments, workspace, device), so a call is two
// attribute sets and one cublasLtMatmul launch. No allocation, no sync:
// capturable in a CUDA graph once the cache is warm (a first call inside a
// capture only queries the heuristic on the host, which is also safe).
//
// Algorithm choice: cuBLASLt's heuristic ranks algorithms by a model, and
// its first pick is not always the fastest (it was 2x off for DiT's DGELU
// product with k = 384). With GemmContext::tune_candidates > 1 the first
// eligible call of a configuration times the heuristic's top candidates on
// the caller's own buffers and keeps the fastest, when it beats the first
// pick by more than 3% (so near-ties keep the heuristic's choice and runs
// stay reproducible). Eligible: not inside a graph capture and not
// accumulating (timing would add into D several times).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace perftrain::kernels {

enum class GemmDtype { kF32, kBF16, kF16, kE4M3, kE5M2 };

enum class GemmEpilogue {
  kDefault,      // D = op(A) op(B)
  kBias,         // D = op(A) op(B) + bias[n]
  kGeluAuxBias,  // aux = op(A) op(B) + bias[n];  D = gelu_tanh(aux)
  kDGelu,        // D = (op(A) op(B)) * gelu_tanh'(aux)
  kDGeluBGrad,   // kDGelu, and bias[n] (written) = sum over rows of D
};

const char* gemm_epilogue_name(GemmEpilogue e);
const char* gemm_dtype_name(GemmDtype t);
size_t gemm_dtype_size(GemmDtype t);
inline bool gemm_is_fp8(GemmDtype t) { return t == GemmDtype::kE4M3 || t == GemmDtype::kE5M2; }

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // [m, k], or [k, m] when trans_a
  bool trans_a = false;
  const void* b = nullptr;  // [k, n], or [n, k] when trans_b
  bool trans_b = false;
  GemmDtype ab_type = GemmDtype::kBF16;  // A and B share one dtype (fp8: A's)
  void* d = nullptr;                     // [m, n]
  GemmDtype d_type = GemmDtype::kBF16;   // ab_type, or kF32
  GemmEpilogue epilogue = GemmEpilogue::kDefault;
  // Bias (read) for kBias / kGeluAuxBias; bias gradient (written) for
  // kDGeluBGrad. Its dtype may differ from D's (e.g. fp32 with a
  // bf16 D) where cuBLASLt accepts it (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
  void* bias = nullptr;
  GemmDtype bias_type = GemmDtype::kF32;
  // GELU pre-activation [m, n] in D's dtype: written by kGeluAuxBias, read
  // by kDGelu / kDGeluBGrad. n must be a multiple of 8.
  void* aux = nullptr;
  // D += epilogue(op(A) op(B)) instead of D = ... (beta = 1, C = D): sums of
  // products without a separate add pass, e.g. dX = dQ Wq + dK Wk + dV Wv.
  bool accumulate = false;
  // fp8 products only (see above): B's fp8 dtype, each operand's
  // dequantisation factor (device float), the fast-accumulation flag.
  GemmDtype b_fp8_type = GemmDtype::kE4M3;
  const float* a_scale_inv = nullptr;
  const float* b_scale_inv = nullptr;
  bool fast_accum = false;
};

// Where and with what a product runs; owned by the caller.
struct GemmContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // device memory, 256-byte aligned
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  // How many of the heuristic's algorithms to time on a configuration's
  // first eligible call (0 or 1: take its first pick, time nothing).
  int tune_candidates = 0;
  // Whether this call may do that timing; false leaves the configuration on
  // the first pick until a later call with true (e.g. to keep the timing out
  // of a training run's first step).
  bool tune_now = true;
};

// cuBLASLt has no algorithm for this configuration (the heuristic returned
// none, or refused the descriptor). The message names the epilogue, the
// shapes and the dtypes. The caller may fall back to a plain product.
class GemmUnsupported : public std::runtime_error {
 public:
  explicit GemmUnsupported(const std::string& what) : std::runtime_error(what) {}
};

// Runs the product on ctx.stream. Throws std::invalid_argument on misuse
// (null pointers, non-positive sizes, a missing bias/aux for the epilogue,
// mismatched dtypes), GemmUnsupported when cuBLASLt has no algorithm, and
// std::runtime_error on any other cuBLAS failure.
void gemm_lt(const GemmArgs& args, const GemmContext& ctx);

// Whether gemm_lt(args, ctx) finds an algorithm (runs the same cached
// heuristic query; launches nothing; pointers only matter for alignment).
bool gemm_lt_supported(const GemmArgs& args, const GemmContext& ctx);

// What tuning chose for one configuration (for reports and logs).
struct GemmTuneRecord {
  std::string what;         // gemm_describe of the configuration
  int candidates = 0;       // algorithms timed
  int chosen = 0;           // index in the heuristic's ranking (0 = its first pick)
  double heuristic_ms = 0;  // time of the first pick
  double chosen_ms = 0;     // time of the chosen one
};
// Every configuration tuned so far in this process, in tuning order.
std::vector<GemmTuneRecord> gemm_tune_records();
// Adds a choice made above this layer between forms of one product (the ops'
// DGELU epilogue against a plain product and a separate pass), for reports.
void gemm_add_tune_record(GemmTuneRecord record);

// "GELU_AUX_BIAS m=8192 n=4608 k=1152 A=bf16^T B=bf16 D=bf16 bias=f32"
std::string gemm_describe(const GemmArgs& args);

}  // namespace perftrain::kernels
