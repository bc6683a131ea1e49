#include "kernels/gemm_lt.h"

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda_check.h"

namespace perftrain::kernels {

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kDefault: return "DEFAULT";
    case GemmEpilogue::kBias: return "BIAS";
    case GemmEpilogue::kGeluAuxBias: return "GELU_AUX_BIAS";
    case GemmEpilogue::kDGelu: return "DGELU";
    case GemmEpilogue::kDGeluBGrad: return "DGELU_BGRAD";
  }
  return "?";
}

const char* gemm_dtype_name(GemmDtype t) {
  switch (t) {
    case GemmDtype::kF32: return "f32";
    case GemmDtype::kBF16: return "bf16";
    case GemmDtype::kF16: return "f16";
    case GemmDtype::kE4M3: return "e4m3";
    case GemmDtype::kE5M2: return "e5m2";
  }
  return "?";
}

size_t gemm_dtype_size(GemmDtype t) {
  if (gemm_is_fp8(t)) return 1;
  return t == GemmDtype::kF32 ? 4 : 2;
}

namespace {

cudaDataType_t cuda_type(GemmDtype t) {
  switch (t) {
    case GemmDtype::kF32: return CUDA_R_32F;
    case GemmDtype::kBF16: return CUDA_R_16BF;
    case GemmDtype::kF16: return CUDA_R_16F;
    case GemmDtype::kE4M3: return CUDA_R_8F_E4M3;
    case GemmDtype::kE5M2: return CUDA_R_8F_E5M2;
  }
  return CUDA_R_32F;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kDefault: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGelu: return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::kDGeluBGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool uses_bias(GemmEpilogue e) {
  return e == GemmEpilogue::kBias || e == GemmEpilogue::kGeluAuxBias || e == GemmEpilogue::kDGeluBGrad;
}

bool uses_aux(GemmEpilogue e) {
  return e == GemmEpilogue::kGeluAuxBias || e == GemmEpilogue::kDGelu || e == GemmEpilogue::kDGeluBGrad;
}

// Largest power of two (up to 256, cuBLASLt's default assumption) dividing
// the address: the heuristic picks kernels by it, so it is part of the key.
uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 256;
  uint32_t a = 1;
  while (a < 256 && (v & a) == 0) a <<= 1;
  return a;
}

void validate(const GemmArgs& g) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("gemm_lt: " + why + " (" + gemm_describe(g) + ")");
  };
  if (g.m <= 0 || g.n <= 0 || g.k <= 0) fail("sizes must be positive");
  if (g.a == nullptr || g.b == nullptr || g.d == nullptr) fail("A, B and D must be non-null");
  if (gemm_is_fp8(g.ab_type)) {
    if (!gemm_is_fp8(g.b_fp8_type)) fail("an fp8 product needs an fp8 B (b_fp8_type)");
    if (g.d_type != GemmDtype::kBF16 && g.d_type != GemmDtype::kF32) fail("an fp8 product writes a bf16 or f32 D");
    if (g.a_scale_inv == nullptr || g.b_scale_inv == nullptr) fail("an fp8 product needs both scale_inv pointers");
  } else if (g.d_type != g.ab_type && g.d_type != GemmDtype::kF32) {
    fail("D must have the dtype of A/B or be f32");
  }
  if (uses_bias(g.epilogue) && g.bias == nullptr) fail("the epilogue needs a bias pointer");
  if (uses_aux(g.epilogue) && g.aux == nullptr) fail("the epilogue needs an aux pointer");
}

// The heuristic's choice depends on the device, not on the handle (ATen
// gives each thread its own handle: the autograd thread's differs from the
// forward's, and a plan serves both).
int64_t current_device() {
  int device = 0;
  PERFTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// Everything the descriptors and the heuristic's choice depend on.
using PlanKey = std::array<int64_t, 21>;

PlanKey key_of(const GemmArgs& g, const GemmContext& ctx) {
  const bool bias = uses_bias(g.epilogue), aux = uses_aux(g.epilogue);
  return {g.m,
          g.n,
          g.k,
          g.trans_a,
          g.trans_b,
          int64_t(g.ab_type),
          int64_t(g.d_type),
          int64_t(g.epilogue),
          bias ? int64_t(g.bias_type) : -1,
          alignment(g.a),
          alignment(g.b),
          alignment(g.d),
          bias ? alignment(g.bias) : 0,
          aux ? alignment(g.aux) : 0,
          int64_t(ctx.workspace_bytes),
          alignment(ctx.workspace),
          current_device(),
          g.accumulate,
          gemm_is_fp8(g.ab_type) ? int64_t(g.b_fp8_type) : -1,
          gemm_is_fp8(g.ab_type) && g.fast_accum,
          gemm_is_fp8(g.ab_type) ? int64_t(std::min(alignment(g.a_scale_inv), alignment(g.b_scale_inv))) : 0};
}

// The most algorithms tuning asks the heuristic for.
constexpr int kMaxCandidates = 16;

// Descriptors, layouts and the chosen algorithm for one configuration; or,
// when cuBLASLt has none, the reason (so a refused configuration is not
// queried again on every call).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  std::string refusal;
  // The heuristic's ranking (algo = candidates[0] until tuned).
  std::vector<cublasLtMatmulAlgo_t> candidates;
  bool tuned = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  PERFTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

// The pointers live in the descriptor: set per call (the plan is shared by
// every call with the same key).
void set_pointers(const Plan& p, const GemmArgs& g) {
  if (uses_bias(g.epilogue)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (uses_aux(g.epilogue)) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  if (gemm_is_fp8(g.ab_type)) {  // cuBLAS's A/B are our B/A
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.b_scale_inv);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.a_scale_inv);
  }
}

// Why cuBLASLt cannot run this fp8 product (the header's list), or "".
std::string fp8_refusal(const GemmArgs& g) {
  if (g.trans_a || !g.trans_b) return "fp8 products take both operands K-major: A [m, k] and B stored [n, k] (TN)";
  if (g.ab_type == GemmDtype::kE5M2 && g.b_fp8_type == GemmDtype::kE5M2) return "E5M2 x E5M2 has no fp8 kernel";
  if (g.m % 16 != 0 || g.n % 16 != 0 || g.k % 16 != 0) return "fp8 products need m, n and k multiples of 16";
  if (alignment(g.a) < 16 || alignment(g.b) < 16 || alignment(g.d) < 16)
    return "fp8 products need 16-byte aligned A, B and D";
  if (alignment(g.a_scale_inv) < 16 || alignment(g.b_scale_inv) < 16)
    return "fp8 products need 16-byte aligned scale_inv pointers";
  if (g.epilogue != GemmEpilogue::kDefault && g.epilogue != GemmEpilogue::kBias)
    return "fp8 products take the DEFAULT and BIAS epilogues only";
  if (g.accumulate) return "fp8 products do not accumulate into D";
  return "";
}

std::unique_ptr<Plan> make_plan(const GemmArgs& g, const GemmContext& ctx) {
  auto p = std::make_unique<Plan>();
  const bool fp8 = gemm_is_fp8(g.ab_type);
  if (fp8) p->refusal = fp8_refusal(g);
  if (!p->refusal.empty()) return p;
  if (uses_aux(g.epilogue) && g.n % 8 != 0) {
    p->refusal = "the GELU aux matrix needs a leading dimension (n) that is a multiple of 8";
    return p;
  }
  const cublasComputeType_t compute =
      g.ab_type == GemmDtype::kF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;  // fp8: 32F
  PERFTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
  // cuBLAS's A is our B and its B our A (see the header).
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(g.epilogue));
  if (uses_bias(g.epilogue) && g.bias_type != g.d_type) {
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(cuda_type(g.bias_type)));
  }
  if (uses_aux(g.epilogue)) set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(g.n));
  if (fp8) set_desc(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(g.fast_accum ? 1 : 0));
  set_pointers(*p, g);

  // cuBLAS's A is our B: its dtype is B's (b_fp8_type for fp8).
  const cudaDataType_t at = cuda_type(g.ab_type), bt = cuda_type(fp8 ? g.b_fp8_type : g.ab_type),
                       dt = cuda_type(g.d_type);
  const uint64_t m = g.m, n = g.n, k = g.k;
  if (g.trans_b) {
    PERFTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, bt, k, n, int64_t(k)));
  } else {
    PERFTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, bt, n, k, int64_t(n)));
  }
  if (g.trans_a) {
    PERFTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, at, m, k, int64_t(m)));
  } else {
    PERFTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, at, k, m, int64_t(k)));
  }
  PERFTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, dt, n, m, int64_t(n)));

  cublasLtMatmulPreference_t pref = nullptr;
  PERFTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    PERFTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
  };
  set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(ctx.workspace_bytes));
  // cuBLAS's A/B are our B/A.
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(g.b));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(g.a));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(g.d));
  set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(g.d));

  const int wanted = std::max(1, std::min(ctx.tune_candidates, kMaxCandidates));
  std::array<cublasLtMatmulHeuristicResult_t, kMaxCandidates> results{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.handle, p->desc, p->a, p->b, p->d, p->d, pref, wanted,
                                                           results.data(), &found);
  for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p->candidates.push_back(results[i].algo);
  }
  if (p->candidates.empty()) {
    p->refusal = st != CUBLAS_STATUS_SUCCESS
                     ? "cublasLtMatmulAlgoGetHeuristic refused it (status " + std::to_string(int(st)) + ")"
                     : "cublasLtMatmulAlgoGetHeuristic found no algorithm";
    return p;
  }
  p->algo = p->candidates[0];
  p->ok = true;
  return p;
}

cublasStatus_t launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const GemmArgs& g, const GemmContext& ctx) {
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  // cuBLAS's A/B are our B/A; C = D (read only when accumulating).
  return cublasLtMatmul(ctx.handle, p.desc, &alpha, g.b, p.a, g.a, p.b, &beta, g.d, p.d, g.d, p.d, &algo,
                        ctx.workspace, ctx.workspace_bytes, ctx.stream);
}

std::vector<GemmTuneRecord>& tune_records() {
  static auto* records = new std::vector<GemmTuneRecord>();
  return *records;
}

// Mean milliseconds of one product with `algo` over enough repeats to last
// about a millisecond, after one untimed run; infinity if it will not run.
double time_algo(const Plan& p, const cublasLtMatmulAlgo_t& algo, const GemmArgs& g, const GemmContext& ctx,
                 cudaEvent_t start, cudaEvent_t stop) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto timed = [&](int repeats) {
    PERFTRAIN_CUDA_CHECK(cudaEventRecord(start, ctx.stream));
    for (int r = 0; r < repeats; ++r) {
      if (launch(p, algo, g, ctx) != CUBLAS_STATUS_SUCCESS) return kInf;
    }
    PERFTRAIN_CUDA_CHECK(cudaEventRecord(stop, ctx.stream));
    PERFTRAIN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    PERFTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return double(ms) / repeats;
  };
  if (launch(p, algo, g, ctx) != CUBLAS_STATUS_SUCCESS) return kInf;
  const double once = timed(1);
  if (once == kInf) return kInf;
  return timed(std::clamp(int(1.0 / std::max(once, 1e-3)), 3, 50));
}

// Times the plan's candidates on g's buffers and keeps the fastest when it
// beats the heuristic's first pick by more than 3% (see the header).
void tune(Plan& p, const GemmArgs& g, const GemmContext& ctx) {
  p.tuned = true;
  if (p.candidates.size() < 2) return;
  cudaEvent_t start = nullptr, stop = nullptr;
  PERFTRAIN_CUDA_CHECK(cudaEventCreate(&start));
  PERFTRAIN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (const auto& algo : p.candidates) ms.push_back(time_algo(p, algo, g, ctx, start, stop));
  PERFTRAIN_CUDA_CHECK(cudaEventDestroy(start));
  PERFTRAIN_CUDA_CHECK(cudaEventDestroy(stop));
  const size_t best = size_t(std::min_element(ms.begin(), ms.end()) - ms.begin());
  const size_t chosen = ms[best] < 0.97 * ms[0] ? best : 0;
  p.algo = p.candidates[chosen];
  tune_records().push_back({gemm_describe(g), int(ms.size()), int(chosen), ms[0], ms[chosen]});
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  PERFTRAIN_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

std::mutex& plans_mutex() {
  static std::mutex m;
  return m;
}

// Never destroyed: cuBLASLt may be gone by the time static destructors run.
std::map<PlanKey, std::unique_ptr<Plan>>& plans() {
  static auto* map = new std::map<PlanKey, std::unique_ptr<Plan>>();
  return *map;
}

// The plan for g (built on first use). Call with plans_mutex() held.
Plan& plan_for(const GemmArgs& g, const GemmContext& ctx) {
  auto& map = plans();
  const PlanKey key = key_of(g, ctx);
  auto it = map.find(key);
  if (it == map.end()) it = map.emplace(key, make_plan(g, ctx)).first;
  return *it->second;
}

void check_context(const GemmArgs& g, const GemmContext& ctx) {
  if (ctx.handle == nullptr) throw std::invalid_argument("gemm_lt: null cublasLt handle (" + gemm_describe(g) + ")");
  if (ctx.workspace_bytes > 0 && ctx.workspace == nullptr)
    throw std::invalid_argument("gemm_lt: workspace_bytes > 0 with a null workspace");
}

}  // namespace

std::string gemm_describe(const GemmArgs& g) {
  std::string s = std::string(gemm_epilogue_name(g.epilogue)) + " m=" + std::to_string(g.m) +
                  " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) + " A=" + gemm_dtype_name(g.ab_type) +
                  (g.trans_a ? "^T" : "") + " B=" +
                  gemm_dtype_name(gemm_is_fp8(g.ab_type) ? g.b_fp8_type : g.ab_type) + (g.trans_b ? "^T" : "") +
                  " D=" + gemm_dtype_name(g.d_type) + (g.accumulate ? " (D +=)" : "");
  if (uses_bias(g.epilogue)) s += std::string(" bias=") + gemm_dtype_name(g.bias_type);
  if (gemm_is_fp8(g.ab_type) && g.fast_accum) s += " fast-accum";
  return s;
}

std::vector<GemmTuneRecord> gemm_tune_records() {
  std::lock_guard<std::mutex> lock(plans_mutex());
  return tune_records();
}

void gemm_add_tune_record(GemmTuneRecord record) {
  std::lock_guard<std::mutex> lock(plans_mutex());
  tune_records().push_back(std::move(record));
}

bool gemm_lt_supported(const GemmArgs& g, const GemmContext& ctx) {
  validate(g);
  check_context(g, ctx);
  std::lock_guard<std::mutex> lock(plans_mutex());
  return plan_for(g, ctx).ok;
}

void gemm_lt(const GemmArgs& g, const GemmContext& ctx) {
  validate(g);
  check_context(g, ctx);
  std::lock_guard<std::mutex> lock(plans_mutex());
  Plan& p = plan_for(g, ctx);
  if (!p.ok) throw GemmUnsupported("cuBLASLt cannot run " + gemm_describe(g) + ": " + p.refusal);
  set_pointers(p, g);
  if (!p.tuned && ctx.tune_now && ctx.tune_candidates > 1 && !g.accumulate && !capturing(ctx.stream)) {
    tune(p, g, ctx);
  }
  const cublasStatus_t st = launch(p, p.algo, g, ctx);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    // The heuristic offered it but the launch refused: remember, so the
    // caller's fallback is taken at once next time.
    p.ok = false;
    p.refusal = "cublasLtMatmul returned CUBLAS_STATUS_NOT_SUPPORTED";
    throw GemmUnsupported("cuBLASLt cannot run " + gemm_describe(g) + ": " + p.refusal);
  }
  PERFTRAIN_CUBLAS_CHECK(st);
}

}  // namespace perftrain::kernels
