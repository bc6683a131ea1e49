#include "shim.h"
#include "race.h"
#include <ucontext.h>
#include <map>
#include <string>
namespace emu {
thread_local Tls tls;
int sm_count = 2;
bool loads_land_early = false, fibers_reversed = false;
namespace {
// YIELD: waiting on a condition (an mbarrier phase) that only other fibers can change: it runs
// again once nothing else can. WBAR: at a barrier (bar.sync id; __syncthreads is id 0). WWARP: at a
// warp shuffle. WCOLL: at a warp- or warpgroup-collective instruction.
enum State { RUN, YIELD, WBAR, WWARP, WCOLL, DONE };
int nthreads = 0, cur = -1;
std::vector<State> st;
std::vector<Tls> info;
std::vector<float> slots;
std::vector<ucontext_t> ctx;
std::vector<std::vector<char>> stacks;
ucontext_t sched;
const std::function<void()>* g_body;
uint64_t progress = 0;  // events that can let a yielding fiber pass
struct Barrier { int arrived = 0, count = 0; };
Barrier barriers[16];
std::vector<int> barrier_of;       // the barrier a WBAR fiber waits at
std::vector<std::string> waiting;  // what a YIELD fiber waits for
struct Arrival { const char* tag; void* arg; };
std::vector<Arrival> arrivals;     // a WCOLL fiber's collective and its operands
std::map<std::pair<int, int>, int> collective_count;  // (group size, group) -> fibers there
std::vector<unsigned char> smem_window;
size_t smem_bytes = 0;
uintptr_t smem_base = 0;
void wait_at(State s) {
  const int me = cur;
  st[me] = s;
  swapcontext(&ctx[me], &sched);
}
void trampoline() {
  (*g_body)();
  thread_exit();
  st[cur] = DONE;
  ++progress;
  // returning goes to uc_link = sched
}
// Nothing runs: release the warps whose shuffle is complete (warps are independent, so others
// may wait at barriers meanwhile).
bool release_warps() {
  bool any = false;
  for (int w = 0; w * 32 < nthreads; ++w) {
    const int lanes = std::min(nthreads, w * 32 + 32) - w * 32;
    int n = 0;
    for (int t = w * 32; t < w * 32 + lanes; ++t) n += st[t] == WWARP;
    if (n == 32)
      for (int t = w * 32; t < w * 32 + 32; ++t) st[t] = RUN;
    any |= n == 32;
  }
  if (any) ++progress;
  return any;
}
// Nothing can run any more: say why (the first cause found) and abort.
[[noreturn]] void deadlock() {
  for (int w = 0; w * 32 < nthreads; ++w) {
    int shfl = 0, done = 0, bar = 0, lanes = std::min(nthreads, w * 32 + 32) - w * 32;
    for (int t = w * 32; t < w * 32 + lanes; ++t) { shfl += st[t] == WWARP; done += st[t] == DONE; bar += st[t] == WBAR; }
    if (shfl && done) fail("warp shuffle with full mask while some lanes exited");
    if (shfl && bar) fail("warp shuffle with full mask while some lanes of the warp wait at __syncthreads or bar.sync");
    if (shfl && shfl != 32) fail("warp shuffle in a partial warp");
  }
  bool any_done = false;
  for (int t = 0; t < nthreads; ++t) any_done |= st[t] == DONE;
  for (int t = 0; t < nthreads; ++t)
    if (st[t] == WBAR && barrier_of[t] == 0 && any_done)
      fail("__syncthreads reached by part of the block only (others exited)");
  for (int t = 0; t < nthreads; ++t) {
    char what[256];
    if (st[t] == YIELD) snprintf(what, sizeof what, "thread %d waits forever: %s", t, waiting[t].c_str());
    else if (st[t] == WBAR) snprintf(what, sizeof what, "thread %d waits forever at bar.sync %d (%d of %d arrived)", t,
                                     barrier_of[t], barriers[barrier_of[t]].arrived, barriers[barrier_of[t]].count);
    else if (st[t] == WCOLL) snprintf(what, sizeof what, "thread %d waits forever at %s (not all of its group reached it)",
                                      t, arrivals[t].tag);
    else continue;
    fail(what);
  }
  fail("deadlock");
}
}  // namespace
void fail(const char* what) {
  if (cur >= 0) fprintf(stderr, "EMU ERROR: %s (block %u,%u,%u thread %d)\n", what, tls.bid.x, tls.bid.y, tls.bid.z, cur);
  else fprintf(stderr, "EMU ERROR: %s (block %u,%u,%u)\n", what, tls.bid.x, tls.bid.y, tls.bid.z);
  abort();
}
void sync_block() { barrier(0, nthreads); }
void barrier(int id, int count) {
  if (id < 0 || id >= 16) fail("bar.sync with a barrier id outside 0-15");
  if (count <= 0 || count > nthreads || (id != 0 && count % 32 != 0)) fail("bar.sync with a thread count that is not a multiple of 32 up to the block's");
  Barrier& b = barriers[id];
  if (b.arrived == 0) b.count = count;
  else if (b.count != count) fail("bar.sync: threads of one barrier give different thread counts");
  if (++b.arrived < count) {
    barrier_of[cur] = id;
    wait_at(WBAR);
    return;
  }
  b.arrived = 0;
  uint32_t warps = 1u << (cur / 32);  // bar.sync orders the shared-memory accesses of the warps there
  for (int t = 0; t < nthreads; ++t)
    if (st[t] == WBAR && barrier_of[t] == id) {
      st[t] = RUN;
      warps |= 1u << (t / 32);
    }
  race::join(warps);
  race::tick(warps);
  ++progress;
}
void yield(const std::string& what) {
  waiting[cur] = what;
  wait_at(YIELD);
}
void note_progress() { ++progress; }
void atomic_order(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (cur >= 0 && a >= smem_base + kSmemOffset && a < smem_base + kSmemOffset + smem_bytes)
    race::atomic(uint32_t(a - smem_base), cur / 32);
}
void collective(int size, const char* tag, void* arg, const std::function<void(void* const* args)>& op) {
  const int me = cur, first = me / size * size;
  if (first + size > nthreads) fail("a warp- or warpgroup-wide instruction in a partial warp or warpgroup");
  arrivals[me] = {tag, arg};
  int& n = collective_count[{size, first}];
  if (++n < size) {
    wait_at(WCOLL);
    return;
  }
  n = 0;
  std::vector<void*> args(size);
  for (int t = first; t < first + size; ++t) {
    if (strcmp(arrivals[t].tag, tag) != 0) {
      char what[256];
      snprintf(what, sizeof what, "threads of one warp(group) at different collectives: %s and %s", arrivals[t].tag, tag);
      fail(what);
    }
    args[t - first] = arrivals[t].arg;
  }
  // A warpgroup-wide instruction orders its 4 warps (within a warp, lanes count as one agent).
  const uint32_t warps = size > 32 ? ((1u << (size / 32)) - 1) << (first / 32) : 0;
  race::join(warps);
  op(args.data());
  race::tick(warps);
  for (int t = first; t < first + size; ++t)
    if (t != me) st[t] = RUN;
  ++progress;
}
int thread_index() { return cur; }
int block_threads() { return nthreads; }
unsigned char* dynamic_smem() { return reinterpret_cast<unsigned char*>(smem_base) + kSmemOffset; }
size_t dynamic_smem_bytes() { return smem_bytes; }
uintptr_t smem_window_base() { return smem_base; }
float shfl_xor(float v, int o) {
  const int me = cur, base = me & ~31;
  slots[me] = v;
  wait_at(WWARP);
  float r = slots[base + ((me & 31) ^ o)];
  wait_at(WWARP);
  return r;
}
float shfl_idx(float v, int src) {
  const int me = cur, base = me & ~31;
  slots[me] = v;
  wait_at(WWARP);
  float r = slots[base + (src & 31)];
  wait_at(WWARP);
  return r;
}
void run_grid(dim3 grid, dim3 block, size_t dynamic_bytes, const std::function<void()>& body) {
  const int n = block.x * block.y * block.z;
  g_body = &body;
  if ((int)stacks.size() < n) { stacks.resize(n); for (auto& s : stacks) s.resize(256 * 1024); }
  // The shared window: 1024-byte aligned, the dynamic part kSmemOffset bytes in.
  smem_bytes = dynamic_bytes;
  smem_window.assign(kSmemOffset + dynamic_bytes + 2048, 0);
  smem_base = (reinterpret_cast<uintptr_t>(smem_window.data()) + 1023) & ~uintptr_t(1023);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
      nthreads = n; st.assign(n, RUN); slots.assign((n + 31) / 32 * 32, 0.f); ctx.assign(n, ucontext_t{}); info.resize(n);
      barrier_of.assign(n, -1); waiting.assign(n, ""); arrivals.assign(n, Arrival{"", nullptr});
      collective_count.clear();
      for (auto& b : barriers) b = Barrier{};
      // Unwritten shared memory reads as NaN (bf16, fp16 and fp32 alike).
      memset(reinterpret_cast<void*>(smem_base), 0xFF, kSmemOffset + dynamic_bytes);
      block_begin(n);
      race::block_begin(n, kSmemOffset + dynamic_bytes);
      for (int i = 0; i < n; ++i) {
        info[i].tid = uint3{unsigned(i % block.x), unsigned(i / block.x), 0};
        info[i].bid = uint3{bx, by, bz};
        info[i].bdim = block; info[i].gdim = grid; info[i].lin = i;
        getcontext(&ctx[i]);
        ctx[i].uc_stack.ss_sp = stacks[i].data();
        ctx[i].uc_stack.ss_size = stacks[i].size();
        ctx[i].uc_link = &sched;
        makecontext(&ctx[i], trampoline, 0);
      }
      uint64_t yield_round_at = ~uint64_t(0);  // progress when the yielding fibers last ran
      for (;;) {
        bool ran = false;
        for (int i = 0; i < n; ++i) {
          const int t = fibers_reversed ? n - 1 - i : i;
          if (st[t] != RUN) continue;
          cur = t; tls = info[t]; ran = true;
          swapcontext(&sched, &ctx[t]);
        }
        if (ran || release_warps()) continue;
        bool any_yield = false, all_done = true;
        for (int t = 0; t < n; ++t) { any_yield |= st[t] == YIELD; all_done &= st[t] == DONE; }
        cur = -1;
        if (all_done && land_loads()) fail("the block ended with TMA loads in flight (issued, never waited for)");
        if (all_done) break;
        if (land_loads()) continue;
        if (any_yield && progress != yield_round_at) {
          yield_round_at = progress;
          for (int t = 0; t < n; ++t)
            if (st[t] == YIELD) st[t] = RUN;
          continue;
        }
        deadlock();
      }
      cur = -1;
    }
}
}  // namespace emu
