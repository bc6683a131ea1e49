// The shared-memory race detector (race.h) by small kernels of this file (`run.sh
// race_check.cpp`, no kernel of src/): each a correct form, which must run clean, and the same
// with one ordering taken out, which must abort with "shared-memory race" (run in a child
// process, on both schedules of check.h):
// - a TMA-filled buffer read with no wait on its mbarrier;
// - a stage refilled by TMA with no wait for the consumer's release;
// - a wgmma operand overwritten by its own warpgroup before the wait_group that retires it;
// - a stage released (mbarrier arrive) before the wait_group, then rewritten by another warpgroup;
// - a TMA store's box rewritten before its wait_group.read;
// - an st.shared read by another warp with no __syncthreads between.
// Exit 1 on any failure.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "sm90_check.h"

namespace {
constexpr int kBox = 64;                    // 64 x 64 bf16 boxes (8 KB) in the 128-byte swizzle
constexpr uint32_t kBoxBytes = kBox * kBox * 2;
bf16 g_src[kBox * kBox], g_dst[kBox * kBox];
CUtensorMap g_in, g_out;

uint64_t* bars_at(unsigned char* smem) { return reinterpret_cast<uint64_t*>(smem + 4 * kBoxBytes); }

// Thread 0 loads the box; warp 1 reads it (after the wait when `wait`); thread 0 waits last.
__global__ void unwaited_load_kernel(bool wait) {
  unsigned char* smem = aligned_smem(emu::dynamic_smem());
  uint64_t* full = bars_at(smem);
  if (threadIdx.x == 0) s9::mbar_init(full, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    s9::mbar_arrive_expect_tx(full, kBoxBytes);
    s9::tma_load_2d(smem, &g_in, full, 0, 0);
  }
  if (threadIdx.x >= 32) {
    if (wait) s9::mbar_wait(full, 0);
    (void)s9::ld_shared_u32(s9::smem_u32(smem) + 4 * (threadIdx.x - 32));
  }
  if (threadIdx.x == 0) s9::mbar_wait(full, 0);
}

// Two rounds into one stage: warp 1 reads each and releases the stage (lane 0 arrives on
// `empty`); thread 0 refills it after waiting for that release when `wait` (without, the
// two loads' writes race too).
__global__ void refill_kernel(bool wait) {
  unsigned char* smem = aligned_smem(emu::dynamic_smem());
  uint64_t* full = bars_at(smem);
  uint64_t* empty = full + 1;
  if (threadIdx.x == 0) {
    s9::mbar_init(full, 1);
    s9::mbar_init(empty, 1);
  }
  __syncthreads();
  for (int round = 0; round < 2; ++round) {
    if (threadIdx.x == 0) {
      if (round == 1 && wait) s9::mbar_wait(empty, 0);
      s9::mbar_arrive_expect_tx(full, kBoxBytes);
      s9::tma_load_2d(smem, &g_in, full, 0, 0);
    }
    if (threadIdx.x >= 32) {
      s9::mbar_wait(full, round);
      (void)s9::ld_shared_u32(s9::smem_u32(smem) + 4 * (threadIdx.x - 32));
      __syncwarp();  // every lane's read before lane 0's release
      if (threadIdx.x == 32) s9::mbar_arrive(empty);
    }
  }
}

// Warpgroup 0: A (box 0) and B (box 1) loaded, one wgmma m64n64k16 reading them. overwrite 1:
// its thread 5 rewrites B after a warpgroup barrier but before the wait_group (0: after).
// overwrite 2: its warps release the stage (lane 0 of each arrives on `empty`) before the
// wait_group (0: after) and warpgroup 1 rewrites B once released.
__global__ void wgmma_kernel(int overwrite, bool early) {
  unsigned char* smem = aligned_smem(emu::dynamic_smem());
  uint64_t* full = bars_at(smem);
  uint64_t* empty = full + 1;
  const uint32_t sa = s9::smem_u32(smem), sb = sa + kBoxBytes;
  if (threadIdx.x == 0) {
    s9::mbar_init(full, 1);
    s9::mbar_init(empty, 4);
    s9::mbar_arrive_expect_tx(full, 2 * kBoxBytes);
    s9::tma_load_2d(smem, &g_in, full, 0, 0);
    s9::tma_load_2d(smem + kBoxBytes, &g_in, full, 0, 0);
  }
  __syncthreads();
  if (threadIdx.x >= 128) {
    if (overwrite != 2) return;
    s9::mbar_wait(empty, 0);
    if (threadIdx.x == 128) s9::st_shared_u32(sb, 0);
    return;
  }
  s9::mbar_wait(full, 0);
  float d[32];
  s9::wgmma_m64n64k16_ss<0>(d, s9::smem_desc(smem), s9::smem_desc(smem + kBoxBytes), 0);
  s9::wgmma_commit();
  const bool lane0 = threadIdx.x % 32 == 0;
  if (overwrite == 1) {
    s9::warpgroup_barrier(1);
    if (early && threadIdx.x == 5) {
      s9::st_shared_u32(sb, 0);
      s9::fence_async_shared();  // the proxy fence is there: the missing wait is what is wrong
    }
  }
  if (overwrite == 2 && early && lane0) s9::mbar_arrive(empty);
  s9::wgmma_wait<0>();
  if (overwrite == 2 && !early && lane0) s9::mbar_arrive(empty);
  if (overwrite == 1 && !early && threadIdx.x == 5) s9::st_shared_u32(sb, 0);
}

// The box staged by st.shared, stored by TMA; rewritten before (early) or after the
// wait_group.read that says the store has read it.
__global__ void store_kernel(bool early) {
  unsigned char* smem = aligned_smem(emu::dynamic_smem());
  const uint32_t box = s9::smem_u32(smem);
  for (uint32_t i = threadIdx.x; i < kBoxBytes / 4; i += 32) s9::st_shared_u32(box + 4 * i, 0x3F803F80u);
  s9::fence_async_shared();
  __syncthreads();
  if (threadIdx.x != 0) return;
  s9::tma_store_2d(&g_out, smem, 0, 0);
  if (early) {
    s9::st_shared_u32(box, 0);
    s9::fence_async_shared();
  }
  s9::tma_store_wait_read<0>();
  if (!early) s9::st_shared_u32(box, 0);
}

// Warp 0 writes a word each lane, warp 1 reads them: with a __syncthreads between when `sync`.
__global__ void plain_kernel(bool sync) {
  const uint32_t at = s9::smem_u32(aligned_smem(emu::dynamic_smem())) + 4 * (threadIdx.x % 32);
  if (threadIdx.x < 32) s9::st_shared_u32(at, threadIdx.x);
  if (sync) __syncthreads();
  if (threadIdx.x >= 32) (void)s9::ld_shared_u32(at);
}

const size_t kSmem = 4 * kBoxBytes + 1024 + 64;

struct Case {
  const char* name;
  void (*run)(bool correct);
};
const Case kCases[] = {
    {"a TMA-filled buffer read with no mbarrier wait",
     [](bool ok) { emu::launch(unwaited_load_kernel, dim3(1), dim3(64), kSmem, ok); }},
    {"a stage refilled with no wait for the consumer's release",
     [](bool ok) { emu::launch(refill_kernel, dim3(1), dim3(64), kSmem, ok); }},
    {"a wgmma operand overwritten by its warpgroup before wait_group",
     [](bool ok) { emu::launch(wgmma_kernel, dim3(1), dim3(128), kSmem, 1, !ok); }},
    {"a stage released before the wait_group of its wgmma, then rewritten",
     [](bool ok) { emu::launch(wgmma_kernel, dim3(1), dim3(256), kSmem, 2, !ok); }},
    {"a TMA store's box rewritten before wait_group.read",
     [](bool ok) { emu::launch(store_kernel, dim3(1), dim3(32), kSmem, !ok); }},
    {"an st.shared read by another warp with no __syncthreads",
     [](bool ok) { emu::launch(plain_kernel, dim3(1), dim3(64), kSmem, ok); }},
};

// Runs the case in a child process on schedule `schedule`; its stderr and how it ended.
bool run_child(const Case& c, bool correct, int schedule, std::string& err) {
  int fds[2];
  if (pipe(fds) != 0) { perror("pipe"); exit(1); }
  fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    set_schedule(schedule);
    c.run(correct);
    _exit(0);
  }
  close(fds[1]);
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}
}  // namespace

int main() {
  for (int i = 0; i < kBox * kBox; ++i) g_src[i] = fromd<bf16>(value(i / kBox, i % kBox));
  g_in = map_of(g_src, kBox, kBox, kBox, kBox, 128);
  g_out = map_of(g_dst, kBox, kBox, kBox, kBox, 128);
  for (const Case& c : kCases)
    for (int schedule : {0, 1}) {
      const std::string where = std::string(c.name) + " (schedule " + std::to_string(schedule) + ")";
      std::string err;
      if (!run_child(c, true, schedule, err)) {
        ++fails;
        printf("FAIL %s, correct form: %s\n", where.c_str(), err.c_str());
      }
      err.clear();
      const bool clean = run_child(c, false, schedule, err);
      const bool caught = !clean && err.find("shared-memory race") != std::string::npos;
      if (!caught) ++fails;
      printf("%s %s: %s", caught ? "caught" : "FAIL not caught", where.c_str(), err.empty() ? "no report\n" : err.c_str());
    }
  return finish();
}
