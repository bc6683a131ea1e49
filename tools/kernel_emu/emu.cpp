#include "shim.h"
#include <ucontext.h>
namespace emu {
thread_local Tls tls;
namespace {
enum State { RUN, WBLOCK, WWARP, DONE };
int nthreads = 0, cur = -1;
std::vector<State> st;
std::vector<Tls> info;
std::vector<float> slots;
std::vector<ucontext_t> ctx;
std::vector<std::vector<char>> stacks;
ucontext_t sched;
const std::function<void()>* g_body;
void fail(const char* what) { fprintf(stderr, "EMU ERROR: %s (block %u,%u)\n", what, tls.bid.x, tls.bid.y); abort(); }
void wait_at(State s) {
  const int me = cur;
  st[me] = s;
  swapcontext(&ctx[me], &sched);
}
void trampoline() {
  (*g_body)();
  st[cur] = DONE;
  // returning goes to uc_link = sched
}
// All threads blocked: release the warps whose shuffle is complete (warps are independent, so
// others may wait at __syncthreads meanwhile); else a complete __syncthreads; else report.
bool release() {
  bool any_block = false, any_done = false, any_warp = false;
  for (int t = 0; t < nthreads; ++t) { any_block |= st[t] == WBLOCK; any_done |= st[t] == DONE; any_warp |= st[t] == WWARP; }
  if (!any_block && !any_warp) return false;  // all done
  if (any_warp) {
    for (int w = 0; w * 32 < nthreads; ++w) {
      int waiting = 0, done = 0, block = 0, lanes = std::min(nthreads, w * 32 + 32) - w * 32;
      for (int t = w * 32; t < w * 32 + lanes; ++t) { waiting += st[t] == WWARP; done += st[t] == DONE; block += st[t] == WBLOCK; }
      if (waiting && done) fail("warp shuffle with full mask while some lanes exited");
      if (waiting && block) fail("warp shuffle with full mask while some lanes of the warp wait at __syncthreads");
      if (waiting && (waiting != 32)) fail("warp shuffle in a partial warp");
      if (waiting) for (int t = w * 32; t < w * 32 + 32; ++t) st[t] = RUN;
    }
    return true;
  }
  if (any_done) fail("__syncthreads reached by part of the block only (others exited)");
  for (int t = 0; t < nthreads; ++t) st[t] = RUN;
  return true;
}
}  // namespace
void sync_block() { wait_at(WBLOCK); }
float shfl_xor(float v, int o) {
  const int me = cur, base = me & ~31;
  slots[me] = v;
  wait_at(WWARP);
  float r = slots[base + ((me & 31) ^ o)];
  wait_at(WWARP);
  return r;
}
void run_grid(dim3 grid, dim3 block, const std::function<void()>& body) {
  const int n = block.x * block.y * block.z;
  g_body = &body;
  if ((int)stacks.size() < n) { stacks.resize(n); for (auto& s : stacks) s.resize(256 * 1024); }
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      nthreads = n; st.assign(n, RUN); slots.assign((n + 31) / 32 * 32, 0.f); ctx.assign(n, ucontext_t{}); info.resize(n);
      for (int i = 0; i < n; ++i) {
        info[i].tid = uint3{unsigned(i % block.x), unsigned(i / block.x), 0};
        info[i].bid = uint3{bx, by, 0};
        info[i].bdim = block; info[i].gdim = grid; info[i].lin = i;
        getcontext(&ctx[i]);
        ctx[i].uc_stack.ss_sp = stacks[i].data();
        ctx[i].uc_stack.ss_size = stacks[i].size();
        ctx[i].uc_link = &sched;
        makecontext(&ctx[i], trampoline, 0);
      }
      for (;;) {
        bool ran = false;
        for (int t = 0; t < n; ++t) {
          if (st[t] != RUN) continue;
          cur = t; tls = info[t]; ran = true;
          swapcontext(&sched, &ctx[t]);
        }
        if (!ran && !release()) break;
      }
    }
}
}  // namespace emu
