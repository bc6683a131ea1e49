// The sm_90a emulation (sm90_emu.cpp) where the three sm_90a kernels do not take it, by small
// kernels of this file on the emulator (`run.sh sm90_check.cpp`, no kernel of src/):
// - TMA boxes partly out of bounds (zero-filled on load, clipped on store, negative
//   coordinates too) with the 128-, 64- and 32-byte swizzles and none, against the swizzle
//   written out;
// - stmatrix and ldmatrix x4, plain and .trans: the stored bytes against the fragment layout,
//   and ldmatrix reading back what stmatrix wrote (.trans is what the attention backward uses);
// - wgmma with operands in the other canonical layouts (K-major with the 64- and 32-byte
//   swizzles and none; A MN-major), loaded by TMA with the matching swizzle, against float64.
// Exit 1 on any failure.
#include "sm90_check.h"

// One box loaded at (c0, c1), its shared bytes dumped, stored back at the same place.
__global__ void tma_kernel(const __grid_constant__ CUtensorMap in, const __grid_constant__ CUtensorMap out, int c0,
                           int c1, uint32_t bytes, unsigned char* dump) {
  unsigned char* smem = aligned_smem(emu::dynamic_smem());
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 32768);
  if (threadIdx.x == 0) s9::mbar_init(bar, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    s9::mbar_arrive_expect_tx(bar, bytes);
    s9::tma_load_2d(smem, &in, bar, c0, c1);
  }
  s9::mbar_wait(bar, 0);
  if (threadIdx.x == 0) {
    memcpy(dump, smem, bytes);
    s9::tma_store_2d(&out, smem, c0, c1);
    s9::tma_store_wait_read<0>();
  }
}

static void tma_case(int swizzle, int box_cols, int c0, int c1) {
  const int rows = 100, cols = 72, box_rows = 64;
  const std::string where = "tma swizzle " + std::to_string(swizzle) + " box " + std::to_string(box_cols) + " at (" +
                            std::to_string(c0) + "," + std::to_string(c1) + ")";
  std::vector<bf16> src(rows * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) src[r * cols + c] = fromd<bf16>(value(r, c));
  auto out = nans<bf16>(rows * cols);
  const uint32_t bytes = box_rows * box_cols * 2;
  std::vector<unsigned char> dump(bytes);
  const CUtensorMap in_map = map_of(src.data(), rows, cols, box_rows, box_cols, swizzle);
  const CUtensorMap out_map = map_of(out.data(), rows, cols, box_rows, box_cols, swizzle);
  emu::launch(tma_kernel, dim3(1), dim3(32), 32768 + 1024 + 64, in_map, out_map, c0, c1, bytes, dump.data());
  int bad = 0;
  for (int r = 0; r < box_rows; ++r)
    for (int c = 0; c < box_cols; ++c) {
      const int gr = c1 + r, gc = c0 + c;
      const bool in = gr >= 0 && gr < rows && gc >= 0 && gc < cols;
      bf16 got;
      memcpy(&got, &dump[swizzled((r * box_cols + c) * 2, swizzle)], 2);
      bad += tod(got) != (in ? value(gr, gc) : 0.0);
    }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const bool in_box = r >= c1 && r < c1 + box_rows && c >= c0 && c < c0 + box_cols;
      const double got = tod(out[r * cols + c]);
      bad += in_box ? got != value(r, c) : !std::isnan(got);
    }
  pad_intact("tma out", out);
  if (bad) { ++fails; printf("FAIL %s: %d elements wrong\n", where.c_str(), bad); }
}

// stmatrix x4 of lane-numbered fragments at rows 16 bytes apart, then ldmatrix x4 back.
__global__ void matrix_kernel(bool st_trans, bool ld_trans, unsigned char* dump, uint32_t* back) {
  unsigned char* smem = aligned_smem(emu::dynamic_smem());
  const int lane = threadIdx.x;
  uint32_t r[4];
  for (int i = 0; i < 4; ++i) r[i] = uint32_t(2 * (32 * i + lane)) | uint32_t(2 * (32 * i + lane) + 1) << 16;
  const uint32_t at = s9::smem_u32(smem) + 16 * lane;  // lane L: row L % 8 of matrix L / 8
  emu::sm90::stmatrix_x4(at, r, st_trans);
  __syncthreads();
  if (lane == 0) memcpy(dump, smem, 512);
  emu::sm90::ldmatrix_x4(at, back + 4 * lane, ld_trans);
}

static void matrix_case(bool st_trans, bool ld_trans) {
  const std::string where = std::string("stmatrix") + (st_trans ? ".trans" : "") + " ldmatrix" + (ld_trans ? ".trans" : "");
  std::vector<unsigned char> dump(512);
  std::vector<uint32_t> back(128);
  emu::launch(matrix_kernel, dim3(1), dim3(32), 2048, st_trans, ld_trans, dump.data(), back.data());
  // Element (row, col) of matrix i is held by lane 4 row + col / 2, half col % 2, as code
  // 2 (32 i + lane) + half; stored at row (col with .trans: the transpose) of matrix i.
  auto code = [](int i, int row, int col) { return uint16_t(2 * (32 * i + 4 * row + col / 2) + col % 2); };
  int bad = 0;
  for (int i = 0; i < 4; ++i)
    for (int row = 0; row < 8; ++row)
      for (int col = 0; col < 8; ++col) {
        const int sr = st_trans ? col : row, sc = st_trans ? row : col;
        uint16_t got;
        memcpy(&got, &dump[(8 * i + sr) * 16 + 2 * sc], 2);
        bad += got != code(i, row, col);
        // ldmatrix of the same kind gives the fragments back; of the other kind, the transposes.
        const int lr = ld_trans == st_trans ? row : col, lc = ld_trans == st_trans ? col : row;
        const uint32_t reg = back[4 * (4 * lr + lc / 2) + i];
        bad += uint16_t(reg >> (16 * (lc % 2))) != code(i, row, col);
      }
  if (bad) { ++fails; printf("FAIL %s: %d elements wrong\n", where.c_str(), bad); }
}

// A (64 x 16) and B (64 x 16, N = 64) loaded by TMA in the given layout, one wgmma, D out.
// kmajor_swizzle: 128, 64, 32 or 0 (K-major rows of span bytes, or 16-byte core-matrix rows in
// boxes of 8 columns); a_mn: A from A^T [16][64] MN-major with the 128-byte swizzle instead.
__global__ void wgmma_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                             int swizzle, bool a_mn, float* d_out) {
  unsigned char* smem = aligned_smem(emu::dynamic_smem());
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 16384);
  const uint32_t sa = s9::smem_u32(smem), sb = sa + 8192;
  const int cols = swizzle ? swizzle / 2 : 8, boxes = std::max(16 / cols, 1);  // boxes along K
  const uint32_t b_bytes = 64 * cols * 2 * boxes, a_bytes = a_mn ? 16 * 64 * 2 : b_bytes;
  if (threadIdx.x == 0) s9::mbar_init(bar, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    s9::mbar_arrive_expect_tx(bar, a_bytes + b_bytes);
    for (int k = 0; k < boxes; ++k) {
      if (!a_mn) s9::tma_load_2d(smem + k * 64 * cols * 2, &a_map, bar, k * cols, 0);
      s9::tma_load_2d(smem + 8192 + k * 64 * cols * 2, &b_map, bar, k * cols, 0);
    }
    if (a_mn) s9::tma_load_2d(smem, &a_map, bar, 0, 0);
  }
  s9::mbar_wait(bar, 0);
  // Descriptors: start >> 4, LBO, SBO, layout (1: 128-byte, 2: 64-byte, 3: 32-byte swizzle).
  auto desc = [](uint32_t start, uint32_t lbo, uint32_t sbo, int layout) {
    return uint64_t(start >> 4) | uint64_t(lbo >> 4) << 16 | uint64_t(sbo >> 4) << 32 | uint64_t(layout) << 62;
  };
  const int layout = swizzle == 128 ? 1 : swizzle == 64 ? 2 : swizzle == 32 ? 3 : 0;
  // No swizzle: core matrices of 8 rows x 16 bytes; the next 8 rows 128 bytes on (SBO), the
  // next 8 columns of K in the next box, 64 rows x 16 bytes on (LBO).
  const uint64_t db = swizzle ? desc(sb, 16, 8 * swizzle, layout) : desc(sb, 64 * 16, 128, 0);
  const uint64_t da = a_mn ? desc(sa, 1024, 1024, 1) : swizzle ? desc(sa, 16, 8 * swizzle, layout) : desc(sa, 64 * 16, 128, 0);
  float d[32];
  emu::sm90::wgmma(64, d, nullptr, da, db, a_mn ? 1 : 0, 0, 0);
  s9::wgmma_commit();
  s9::wgmma_wait<0>();
  const int t = threadIdx.x, row = 16 * (t / 32) + (t % 32) / 4;
  for (int i = 0; i < 32; ++i) d_out[(row + 8 * ((i >> 1) & 1)) * 64 + 8 * (i >> 2) + 2 * (t % 4) + (i & 1)] = d[i];
}

static void wgmma_case(int swizzle, bool a_mn) {
  const std::string where = std::string("wgmma K-major B, swizzle ") + std::to_string(swizzle) + (a_mn ? ", A MN-major" : "");
  const int cols = swizzle ? swizzle / 2 : 8;  // K columns a TMA box holds
  const int kcols = std::max(cols, 16);        // columns of the global A and B (K = 16 used)
  std::vector<bf16> a(64 * kcols), b(64 * kcols), at(16 * 64);
  std::vector<double> ref(64 * 64, 0.0);
  for (int i = 0; i < 64 * kcols; ++i) { a[i] = fromd<bf16>((i * 37 % 61) / 8.0 - 3.5); b[i] = fromd<bf16>((i * 53 % 59) / 8.0 - 3.5); }
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < 16; ++k) at[k * 64 + m] = a[m * kcols + k];
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n)
      for (int k = 0; k < 16; ++k) ref[m * 64 + n] += tod(a[m * kcols + k]) * tod(b[n * kcols + k]);
  const CUtensorMap a_map = a_mn ? map_of(at.data(), 16, 64, 16, 64, 128) : map_of(a.data(), 64, kcols, 64, cols, swizzle);
  const CUtensorMap b_map = map_of(b.data(), 64, kcols, 64, cols, swizzle);
  auto d = nans<float>(64 * 64);
  emu::launch(wgmma_kernel, dim3(1), dim3(128), 16384 + 1024 + 64, a_map, b_map, swizzle, a_mn, d.data());
  close("d", where, d.data(), ref, 1e-6);
}

int main() {
  for (int sw : {128, 64, 32, 0}) {
    const int box = sw ? sw / 2 : 8;
    tma_case(sw, box, 40, 60);   // past the last column and row
    tma_case(sw, box, -4, -3);   // before the first
  }
  for (bool st : {false, true})
    for (bool ld : {false, true}) matrix_case(st, ld);
  for (int sw : {128, 64, 32, 0}) wgmma_case(sw, false);
  wgmma_case(128, true);
  return finish();
}
