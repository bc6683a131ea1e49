// The sm_90a instructions of sm90_emu.h on the emulated block (PTX ISA semantics), the
// driver's cuTensorMapEncodeTiled, and the few CUDA runtime calls the kernels' host code
// makes (an sm_90 device with emu::sm_count SMs). README.md says what is emulated.
#include "sm90_emu.h"

#include "race.h"

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace emu::sm90 {
namespace {

// A tensor map as cuTensorMapEncodeTiled_emu keeps it in the CUtensorMap's 128 opaque bytes.
struct Map {
  uint64_t magic;
  unsigned char* base;
  uint64_t dims[3], strides[3];  // elements; bytes (strides[0] = the element size)
  uint32_t box[3];
  uint32_t rank, elem, swizzle, oob_nan;  // swizzle: 0 or its span in bytes (32, 64, 128)
};
static_assert(sizeof(Map) <= sizeof(CUtensorMap), "the emulated tensor map fits the opaque one");
constexpr uint64_t kMapMagic = 0x454d55544d415031ull;

struct WgmmaOp {
  int n;
  float* d;
  bool a_regs;
  uint32_t a[4];
  uint64_t desc_a, desc_b;
  int trans_a, trans_b, scale_d, group;
  uint32_t seq;          // the thread's how-manieth wgmma (race.h: the warp's issue clock)
  race::Site from;       // its source line
};
struct Store {
  Map map;
  uint32_t src;
  int coords[3], group;
  race::Clock issued;  // the issuing warp's clock (race.h): the box is read from issue to the wait
  race::Site from;
};
// A thread's asynchronous work in flight: wgmma ops (by commit group) and bulk stores.
struct Pending {
  std::vector<WgmmaOp> ops;
  int wgmma_groups = 0;
  uint32_t wgmma_issued = 0;
  std::vector<Store> stores;
  int bulk_groups = 0;
};
std::vector<Pending> pending;
// TMA and bulk loads issued and not yet landed, in issue order: they land once no fiber can
// run (as late as a GPU may, so a read not ordered by its mbarrier sees NaN), or at issue
// with emu::loads_land_early.
struct Load {
  Map map;
  uint32_t dst, bar;
  int coords[3];
  const void* src;  // a non-tensor bulk copy: src, with map.box[0] its bytes
  race::Clock issued;  // the issuing warp's clock and the load's own epoch (race.h)
  uint32_t epoch;
  int thread;
  race::Site from;
};
std::vector<Load> loads;
std::set<uint32_t> barriers_initialised;
// Shared bytes written through a wrapper (st.shared, stmatrix) and not yet fenced by their
// writer's fence.proxy.async: the writer + 1 per byte of the window, 0 when clean; each
// thread's written ranges since its last fence.
std::vector<uint16_t> unfenced;
std::vector<std::vector<std::pair<uint32_t, uint32_t>>> written;
std::map<const void*, int> smem_limit;  // cudaFuncSetAttribute(MaxDynamicSharedMemorySize)

[[noreturn]] void failf(const char* fmt, uint64_t a = 0, uint64_t b = 0, uint64_t c = 0) {
  char what[512];
  snprintf(what, sizeof what, fmt, (unsigned long long)a, (unsigned long long)b, (unsigned long long)c);
  fail(what);
}

// `bytes` of the dynamic shared memory at shared address addr, aligned to `align`.
unsigned char* shared(uint32_t addr, size_t bytes, size_t align, const char* who) {
  const size_t lo = kSmemOffset, hi = kSmemOffset + dynamic_smem_bytes();
  char what[256];
  if (addr < lo || addr + bytes > hi) {
    snprintf(what, sizeof what, "%s at shared address 0x%x (%zu bytes): outside the dynamic shared memory [0x%zx, 0x%zx)",
             who, addr, bytes, lo, hi);
    fail(what);
  }
  if (addr % align) {
    snprintf(what, sizeof what, "%s at shared address 0x%x: not %zu-byte aligned", who, addr, align);
    fail(what);
  }
  return reinterpret_cast<unsigned char*>(smem_window_base()) + addr;
}

// mbarrier state in its 8 bytes: phase << 31 | expected arrivals << 16 | pending arrivals, tx-count.
struct MbarState {
  uint32_t word;
  int32_t tx;
};
MbarState* mbar(uint32_t bar) {
  if (!barriers_initialised.count(bar)) failf("mbarrier at shared 0x%llx used before mbarrier.init", bar);
  return reinterpret_cast<MbarState*>(shared(bar, 8, 8, "mbarrier"));
}
void mbar_complete_if_done(MbarState* m) {
  if ((m->word & 0xFFFF) != 0 || m->tx != 0) return;
  const uint32_t expected = (m->word >> 16) & 0x7FFF;
  m->word = ((m->word ^ 0x80000000u) & 0x80000000u) | (expected << 16) | expected;
  note_progress();
}
void complete_tx(uint32_t bar, uint32_t bytes) {
  MbarState* m = mbar(bar);
  m->tx -= int32_t(bytes);
  mbar_complete_if_done(m);
}

const Map& map_of(const CUtensorMap* p) {
  const Map* m = reinterpret_cast<const Map*>(p);
  if (m->magic != kMapMagic) fail("a tensor map not made by cuTensorMapEncodeTiled");
  return *m;
}
// The shared address of box element i (elements in box order), with the map's swizzle applied to
// the address: 16-byte chunk bits [4, 4 + log2(span / 16)) XOR the bits from 7 up.
uint32_t box_address(const Map& m, uint32_t start, size_t i) {
  uint32_t a = start + uint32_t(i * m.elem);
  if (m.swizzle) a ^= ((a >> 7) & (m.swizzle / 16 - 1)) << 4;
  return a;
}
// Walks the box: f(element index in the box, global byte offset or -1 when out of bounds).
template <typename F>
void walk_box(const Map& m, const int* coords, F f) {
  size_t i = 0;
  const uint32_t b1 = m.rank > 1 ? m.box[1] : 1, b2 = m.rank > 2 ? m.box[2] : 1;
  for (uint32_t z = 0; z < b2; ++z)
    for (uint32_t y = 0; y < b1; ++y)
      for (uint32_t x = 0; x < m.box[0]; ++x, ++i) {
        const int64_t g[3] = {int64_t(coords[0]) + x, m.rank > 1 ? int64_t(coords[1]) + y : 0,
                              m.rank > 2 ? int64_t(coords[2]) + z : 0};
        int64_t off = 0;
        bool in = true;
        for (uint32_t r = 0; r < m.rank; ++r) {
          in &= g[r] >= 0 && uint64_t(g[r]) < m.dims[r];
          off += g[r] * int64_t(m.strides[r]);
        }
        f(i, in ? off : -1);
      }
}
size_t box_bytes(const Map& m) {
  size_t n = m.elem;
  for (uint32_t r = 0; r < m.rank; ++r) n *= m.box[r];
  return n;
}
void check_tma(const Map& m, uint32_t smem, int rank) {
  if (uint32_t(rank) != m.rank) failf("a %lluD TMA copy with a rank-%llu tensor map", rank, m.rank);
  if (smem % 128) failf("TMA box at shared 0x%llx: not 128-byte aligned", smem);
  shared(smem, box_bytes(m), 1, "TMA box");
}

void generic_write(uint32_t addr, uint32_t bytes, int thread) {
  for (uint32_t b = 0; b < bytes; ++b) unfenced[addr + b] = uint16_t(thread + 1);
  written[thread].push_back({addr, bytes});
}
// An async-proxy read (TMA store, wgmma operand) of bytes a thread wrote without a
// fence.proxy.async since: on a GPU it may read the old bytes.
void async_read(uint32_t addr, uint32_t bytes, const char* who) {
  for (uint32_t b = 0; b < bytes; ++b)
    if (unfenced[addr + b]) {
      char what[256];
      snprintf(what, sizeof what, "%s reads shared 0x%x, written by thread %d with no fence.proxy.async since", who,
               addr + b, unfenced[addr + b] - 1);
      fail(what);
    }
}
void async_write(uint32_t addr, uint32_t bytes) { memset(&unfenced[addr], 0, bytes * sizeof(uint16_t)); }

void do_store(const Store& s) {
  walk_box(s.map, s.coords, [&](size_t i, int64_t off) {
    const uint32_t at = box_address(s.map, s.src, i);
    if (off >= 0) memcpy(s.map.base + off, shared(at, s.map.elem, 1, "TMA store"), s.map.elem);
    async_read(at, s.map.elem, "a TMA store");
    race::async_read(at, s.map.elem, s.issued, thread_index(), race::kTmaStore, s.from);
  });
}

// The wgmma being retired (race.h): its warpgroup's clock at issue, first thread, source line.
struct Retiring { race::Clock issued; int thread; race::Site from; } retiring;
float bf16_at(uint32_t addr) {
  uint16_t h;
  memcpy(&h, shared(addr, 2, 2, "wgmma operand"), 2);
  async_read(addr, 2, "wgmma");
  race::async_read(addr, 2, retiring.issued, retiring.thread, race::kWgmma, retiring.from);
  const uint32_t u = uint32_t(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
float bf16_half(uint32_t reg, int hi) {
  const uint32_t u = (hi ? reg & 0xFFFF0000u : reg << 16);
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// Shared address of element (mn, k) of a wgmma operand by its descriptor: the canonical layouts
// (CUTLASS's GmmaDescriptor), K-major or MN-major, no swizzle or 32/64/128-byte swizzle.
uint32_t operand_address(uint64_t desc, int mn, int k, bool mn_major) {
  const uint32_t start = uint32_t(desc & 0x3FFF) << 4, lbo = uint32_t((desc >> 16) & 0x3FFF) << 4,
                 sbo = uint32_t((desc >> 32) & 0x3FFF) << 4;
  if ((desc >> 49) & 7) fail("wgmma descriptor with a base offset (not emulated)");
  const int layout = int(desc >> 62), sw = layout == 1 ? 3 : layout == 2 ? 2 : layout == 3 ? 1 : 0;
  const uint32_t span = 16u << sw;  // bytes of a swizzled row
  uint32_t off;
  if (!mn_major)
    off = sw == 0 ? (mn % 8) * 16 + (mn / 8) * sbo + (k / 8) * lbo + (k % 8) * 2
                  : (mn % 8) * span + (mn / 8) * sbo + (k / 8) * 16 + (k % 8) * 2;
  else {
    const uint32_t per = sw == 0 ? 8 : span / 2;  // MN elements in a row
    off = sw == 0 ? (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo
                  : (mn % per) * 2 + (mn / per) * lbo + (k % 8) * span + (k / 8) * sbo;
  }
  uint32_t a = start + off;
  if (sw) a ^= ((a >> 7) & ((1u << sw) - 1)) << 4;
  return a;
}
// D (64 x n) = A (64 x 16) B (16 x n) (+ D) for the 128 threads' op i, into their fragments:
// thread t = 32 w + l holds row 16 w + l / 4 (+ 8), columns 8 j + 2 (l % 4) (+ 1) in d[4 j ..].
void run_wgmma(const std::vector<const WgmmaOp*>& ops) {
  const WgmmaOp& o = *ops[0];
  static float A[64][16], B[256][16];
  for (int t = 0; t < 128; ++t) {
    const WgmmaOp& p = *ops[t];
    if (p.n != o.n || p.a_regs != o.a_regs || p.desc_b != o.desc_b || p.trans_b != o.trans_b ||
        p.scale_d != o.scale_d || (!o.a_regs && (p.desc_a != o.desc_a || p.trans_a != o.trans_a)))
      failf("threads of a warpgroup issued different wgmma (thread %llu of its warpgroup, shape n=%llu vs %llu)", t, p.n,
            o.n);
  }
  if (o.a_regs)
    for (int t = 0; t < 128; ++t) {
      const int r = 16 * (t / 32) + (t % 32) / 4, c = 2 * (t % 4);
      for (int q = 0; q < 4; ++q)
        for (int h = 0; h < 2; ++h) A[r + 8 * (q & 1)][c + 8 * (q >> 1) + h] = bf16_half(ops[t]->a[q], h);
    }
  else
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k) A[m][k] = bf16_at(operand_address(o.desc_a, m, k, o.trans_a));
  for (int n = 0; n < o.n; ++n)
    for (int k = 0; k < 16; ++k) B[n][k] = bf16_at(operand_address(o.desc_b, n, k, o.trans_b));
  for (int t = 0; t < 128; ++t) {
    float* d = ops[t]->d;
    for (int i = 0; i < o.n / 2; ++i) {
      const int row = 16 * (t / 32) + (t % 32) / 4 + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (t % 4) + (i & 1);
      double s = 0;
      for (int k = 0; k < 16; ++k) s += double(A[row][k]) * B[col][k];
      d[i] = o.scale_d ? d[i] + float(s) : float(s);
    }
  }
}

}  // namespace

uint32_t smem_addr(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), base = smem_window_base();
  if (a < base + kSmemOffset || a > base + kSmemOffset + dynamic_smem_bytes())
    fail("a shared address of a pointer outside the dynamic shared memory (static __shared__ is host memory here)");
  return uint32_t(a - base);
}

void mbar_init(uint32_t bar, uint32_t count) {
  if (count == 0 || count > 0x7FFF) failf("mbarrier.init with count %llu", count);
  MbarState* m = reinterpret_cast<MbarState*>(shared(bar, 8, 8, "mbarrier"));
  barriers_initialised.insert(bar);
  race::mbar_init(bar);
  m->word = (count << 16) | count;
  m->tx = 0;
}
void mbar_arrive(uint32_t bar, uint32_t expect_tx_bytes) {
  MbarState* m = mbar(bar);
  m->tx += int32_t(expect_tx_bytes);
  m->word -= 1;  // pending > 0 always: a phase completes (and refills it) as it reaches 0
  race::mbar_release(bar, thread_index() / 32);
  note_progress();
  mbar_complete_if_done(m);
}
void mbar_wait(uint32_t bar, uint32_t parity) {
  // try_wait.parity: the phase of this parity has completed once the current phase's differs.
  auto done = [&] { return (mbar(bar)->word >> 31) != (parity & 1); };
  if (done()) return race::mbar_acquire(bar, thread_index() / 32);
  char what[96];
  snprintf(what, sizeof what, "mbarrier.try_wait.parity %u at shared 0x%x", parity & 1, bar);
  while (!done()) yield(what);
  race::mbar_acquire(bar, thread_index() / 32);
  note_progress();
}

void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, const int* coords, int rank) {
  const Map& m = map_of(map);
  check_tma(m, dst, rank);
  mbar(bar);
  loads.push_back(Load{m, dst, bar, {coords[0], rank > 1 ? coords[1] : 0, rank > 2 ? coords[2] : 0}, nullptr,
                       race::issue(thread_index() / 32), race::tma_clock(), thread_index(), race::site()});
  if (loads_land_early) land_loads();
}
void land(const Load& l) {
  if (l.src) {
    memcpy(shared(l.dst, l.map.box[0], 16, "cp.async.bulk"), l.src, l.map.box[0]);
    async_write(l.dst, l.map.box[0]);
    race::tma_write(l.dst, l.map.box[0], l.issued, l.epoch, l.thread, race::kBulkLoad, l.from);
    race::mbar_release_tma(l.bar, l.issued, l.epoch);
    complete_tx(l.bar, l.map.box[0]);
    return;
  }
  const Map& m = l.map;
  walk_box(m, l.coords, [&](size_t i, int64_t off) {
    unsigned char* to = shared(box_address(m, l.dst, i), m.elem, 1, "TMA load");
    async_write(box_address(m, l.dst, i), m.elem);
    race::tma_write(box_address(m, l.dst, i), m.elem, l.issued, l.epoch, l.thread, race::kTmaLoad, l.from);
    if (off >= 0) memcpy(to, m.base + off, m.elem);
    else memset(to, m.oob_nan ? 0xFF : 0, m.elem);
  });
  race::mbar_release_tma(l.bar, l.issued, l.epoch);
  complete_tx(l.bar, uint32_t(box_bytes(m)));  // the whole box counts, out-of-bounds fill included
}
void tma_store(const CUtensorMap* map, uint32_t src, const int* coords, int rank) {
  const Map& m = map_of(map);
  check_tma(m, src, rank);
  Pending& p = pending[thread_index()];
  p.stores.push_back(Store{m, src, {coords[0], rank > 1 ? coords[1] : 0, rank > 2 ? coords[2] : 0}, p.bulk_groups,
                           race::issue(thread_index() / 32), race::site()});
}
void bulk_commit() { ++pending[thread_index()].bulk_groups; }
// The stores of all but the newest `keep` committed groups read shared memory now: a store
// reads its box as late as a GPU may, so a box rewritten before the wait shows.
void bulk_wait_read(int keep) {
  Pending& p = pending[thread_index()];
  size_t n = 0;
  while (n < p.stores.size() && p.stores[n].group < p.bulk_groups - keep) do_store(p.stores[n++]);
  p.stores.erase(p.stores.begin(), p.stores.begin() + n);
}
void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  if (bytes % 16 || reinterpret_cast<uintptr_t>(src) % 16) fail("cp.async.bulk: size and global address must be multiples of 16");
  shared(dst, bytes, 16, "cp.async.bulk");
  mbar(bar);
  Load l{};
  l.map.box[0] = bytes;
  l.dst = dst;
  l.bar = bar;
  l.src = src;
  l.issued = race::issue(thread_index() / 32);
  l.epoch = race::tma_clock();
  l.thread = thread_index();
  l.from = race::site();
  loads.push_back(l);
  if (loads_land_early) land_loads();
}
void load_shared(uint32_t addr, void* to, int bytes) {
  memcpy(to, shared(addr, bytes, bytes, "ld.shared"), bytes);
  race::read(addr, bytes, thread_index(), race::kLdShared);
}
void store_shared(uint32_t addr, const void* from, int bytes) {
  memcpy(shared(addr, bytes, bytes, "st.shared"), from, bytes);
  race::write(addr, bytes, thread_index(), race::kStShared);
  generic_write(addr, bytes, thread_index());
}

void wgmma(int n, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, int trans_a, int trans_b,
           int scale_d) {
  if (n < 8 || n > 256 || n % 8) fail("wgmma with N not a multiple of 8 in 8-256");
  Pending& p = pending[thread_index()];
  WgmmaOp op{n,      d,       a != nullptr, {0, 0, 0, 0},     desc_a,        desc_b,
             trans_a, trans_b, scale_d != 0, p.wgmma_groups, p.wgmma_issued++, race::site()};
  if (a) memcpy(op.a, a, sizeof op.a);
  race::wgmma_issued(thread_index(), op.seq);
  p.ops.push_back(op);
}
void wgmma_commit() { ++pending[thread_index()].wgmma_groups; }
// wgmma.wait_group: warpgroup-wide; the last thread there runs the ops of every group but the
// newest `keep` for all 128 (products run here, not at issue: an operand rewritten or an
// accumulator read before the wait shows).
void wgmma_wait(int keep) {
  collective(128, "wgmma.wait_group", &keep, [](void* const* args) {
    const int first = thread_index() / 128 * 128, k = *static_cast<int*>(args[0]);
    for (int t = 0; t < 128; ++t)
      if (*static_cast<int*>(args[t]) != k) fail("threads of a warpgroup at wgmma.wait_group with different counts");
    Pending& p0 = pending[first];
    size_t n = 0;
    while (n < p0.ops.size() && p0.ops[n].group < p0.wgmma_groups - k) ++n;
    for (int t = 1; t < 128; ++t) {
      const Pending& p = pending[first + t];
      if (p.wgmma_groups != p0.wgmma_groups || p.ops.size() != p0.ops.size())
        fail("threads of a warpgroup issued or committed different numbers of wgmma");
    }
    std::vector<const WgmmaOp*> ops(128);
    for (size_t i = 0; i < n; ++i) {
      for (int t = 0; t < 128; ++t) ops[t] = &pending[first + t].ops[i];
      retiring = Retiring{race::wgmma_retire_clock(first, p0.ops[i].seq), first, p0.ops[i].from};
      run_wgmma(ops);
    }
    for (int t = 0; t < 128; ++t) {
      auto& v = pending[first + t].ops;
      v.erase(v.begin(), v.begin() + n);
    }
  });
}

// stmatrix / ldmatrix m8n8.x4 (b16): lane L gives the address of row L % 8 of matrix L / 8;
// register i of lane L holds row L / 4, columns 2 (L % 4) and + 1 of matrix i (.trans: of
// its transpose, i.e. the matrix is stored or read column by column).
struct MatrixLane {
  uint32_t addr;
  uint32_t* regs;
};
uint32_t matrix_element(void* const* args, int i, int lane, int h, bool trans) {
  const int row = lane / 4, col = 2 * (lane % 4) + h;
  const MatrixLane& at = *static_cast<MatrixLane*>(args[8 * i + (trans ? col : row)]);
  return at.addr + 2 * (trans ? row : col);
}
void stmatrix_x4(uint32_t addr, const uint32_t* r, bool trans) {
  MatrixLane me{addr, const_cast<uint32_t*>(r)};
  collective(32, trans ? "stmatrix.x4.trans" : "stmatrix.x4", &me, [trans](void* const* args) {
    for (int lane = 0; lane < 32; ++lane) {
      if (static_cast<MatrixLane*>(args[lane])->addr % 16) fail("stmatrix: a row address not 16-byte aligned");
    }
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i)
        for (int h = 0; h < 2; ++h) {
          const uint16_t v = uint16_t(static_cast<MatrixLane*>(args[lane])->regs[i] >> (16 * h));
          const uint32_t at = matrix_element(args, i, lane, h, trans);
          memcpy(shared(at, 2, 2, "stmatrix"), &v, 2);
          generic_write(at, 2, thread_index() / 32 * 32 + lane);  // the lane whose register it was
          race::write(at, 2, thread_index() / 32 * 32 + lane, race::kStmatrix);
        }
  });
}
void ldmatrix_x4(uint32_t addr, uint32_t* r, bool trans) {
  MatrixLane me{addr, r};
  collective(32, trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", &me, [trans](void* const* args) {
    for (int lane = 0; lane < 32; ++lane) {
      if (static_cast<MatrixLane*>(args[lane])->addr % 16) fail("ldmatrix: a row address not 16-byte aligned");
    }
    uint32_t out[32][4] = {};
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i)
        for (int h = 0; h < 2; ++h) {
          uint16_t v;
          const uint32_t at = matrix_element(args, i, lane, h, trans);
          memcpy(&v, shared(at, 2, 2, "ldmatrix"), 2);
          race::read(at, 2, thread_index() / 32 * 32 + lane, race::kLdmatrix);
          out[lane][i] |= uint32_t(v) << (16 * h);
        }
    for (int lane = 0; lane < 32; ++lane) memcpy(static_cast<MatrixLane*>(args[lane])->regs, out[lane], 16);
  });
}

void fence_proxy_async() {
  const int me = thread_index();
  for (const auto& r : written[me])
    for (uint32_t b = 0; b < r.second; ++b)
      if (unfenced[r.first + b] == me + 1) unfenced[r.first + b] = 0;
  written[me].clear();
}

float ex2_approx_ftz(float x) {
  if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.f;
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}
float tanh_approx(float x) { return std::tanh(x); }

}  // namespace emu::sm90

namespace emu {
bool land_loads() {
  if (sm90::loads.empty()) return false;
  const std::vector<sm90::Load> now = std::move(sm90::loads);
  sm90::loads.clear();
  for (const auto& l : now) sm90::land(l);
  note_progress();
  return true;
}
void block_begin(int threads) {
  sm90::loads.clear();
  sm90::pending.assign(threads, sm90::Pending{});
  sm90::barriers_initialised.clear();
  sm90::unfenced.assign(kSmemOffset + dynamic_smem_bytes(), 0);
  sm90::written.assign(threads, {});
}
void thread_exit() {
  const sm90::Pending& p = sm90::pending[thread_index()];
  if (!p.ops.empty()) fail("a thread exited with wgmma ops not waited for (wgmma.wait_group)");
  if (!p.stores.empty()) fail("a thread exited with bulk stores still to read shared memory (cp.async.bulk.wait_group.read)");
}
void check_launch(const void* kernel, size_t dynamic_bytes) {
  if (dynamic_bytes > 227 * 1024) fail("a launch with more dynamic shared memory than an sm_90 block may have (227 KB)");
  const auto it = sm90::smem_limit.find(kernel);
  if (dynamic_bytes > 48 * 1024 && (it == sm90::smem_limit.end() || size_t(it->second) < dynamic_bytes))
    fail("a launch with over 48 KB of dynamic shared memory above the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize");
}
}  // namespace emu

// cuTensorMapEncodeTiled as the driver checks and encodes it (rank 1-3, element strides 1, no
// interleave); CUDA_ERROR_INVALID_VALUE for what the driver refuses or this does not emulate.
static CUresult encode_tiled_emu(CUtensorMap* out, CUtensorMapDataType type, cuuint32_t rank, void* base,
                                 const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                 const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                 CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill fill) {
  emu::sm90::Map m{};
  m.magic = emu::sm90::kMapMagic;
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: m.elem = 1; break;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16: case CU_TENSOR_MAP_DATA_TYPE_FLOAT16: case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: m.elem = 2; break;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32: case CU_TENSOR_MAP_DATA_TYPE_INT32: case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: m.elem = 4; break;
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: case CU_TENSOR_MAP_DATA_TYPE_INT64: case CU_TENSOR_MAP_DATA_TYPE_UINT64: m.elem = 8; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  if (rank < 1 || rank > 3 || base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 ||
      interleave != CU_TENSOR_MAP_INTERLEAVE_NONE)
    return CUDA_ERROR_INVALID_VALUE;
  m.swizzle = swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 128 : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
            : swizzle == CU_TENSOR_MAP_SWIZZLE_32B ? 32 : 0;
  if (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE && m.swizzle == 0) return CUDA_ERROR_INVALID_VALUE;
  m.base = static_cast<unsigned char*>(base);
  m.rank = rank;
  m.oob_nan = fill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
  for (cuuint32_t r = 0; r < rank; ++r) {
    m.dims[r] = dims[r];
    m.strides[r] = r == 0 ? m.elem : strides[r - 1];
    m.box[r] = box[r];
    if (dims[r] == 0 || dims[r] > (uint64_t(1) << 32) || box[r] == 0 || box[r] > 256 || element_strides[r] != 1)
      return CUDA_ERROR_INVALID_VALUE;
    if (r > 0 && (m.strides[r] % 16 || m.strides[r] >= (uint64_t(1) << 40))) return CUDA_ERROR_INVALID_VALUE;
  }
  if ((box[0] * m.elem) % 16 || (m.swizzle && box[0] * m.elem > m.swizzle)) return CUDA_ERROR_INVALID_VALUE;
  memset(out, 0, sizeof *out);
  memcpy(out, &m, sizeof m);
  return CUDA_SUCCESS;
}

// The runtime calls of the kernels' host code (tensor_map.cpp and the launchers).
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                                       cudaDriverEntryPointQueryResult* status) {
  const bool known = std::string(symbol) == "cuTensorMapEncodeTiled";
  *fn = known ? reinterpret_cast<void*>(&encode_tiled_emu) : nullptr;
  if (status) *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = emu::sm_count; return cudaSuccess;
    default: return cudaErrorInvalidValue;
  }
}
cudaError_t CUDARTAPI cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > 227 * 1024) return cudaErrorInvalidValue;
    emu::sm90::smem_limit[func] = value;
  }
  return cudaSuccess;
}
const char* CUDARTAPI cudaGetErrorString(cudaError_t) { return "an error of the emulated CUDA runtime"; }
