// A happens-before race detector for the block's dynamic shared memory (README.md), in the
// manner of FastTrack: a vector clock per warp (the lanes of a warp count as one agent: they
// meet at every warp-wide instruction), one more slot for the TMA loads in flight (the async
// proxy's writes), and per byte of the shared window the last write's epoch and each warp's
// last read. Edges: bar.sync / __syncthreads (a join of the warps there), warpgroup-wide
// instructions (a join of the 4 warps), mbarrier arrive (release into the barrier's phase)
// -> the wait that sees the phase complete (acquire), a TMA load's completion (its issue clock
// and its own into the barrier). Asynchronous reads (wgmma operands, TMA stores) are checked
// against the issuer's clock at issue and recorded at the wait that retires them. A race
// aborts naming both accesses: kind, warp, thread, shared address and source line.
#pragma once
#include <cstdint>
#include <vector>

namespace emu::race {
using Clock = std::vector<uint32_t>;  // one entry per warp, then the TMA slot
enum Kind : uint8_t { kStShared, kLdShared, kStmatrix, kLdmatrix, kTmaLoad, kBulkLoad, kTmaStore, kWgmma };
// Where an access comes from: the wrapper's caller (file:line), and for an asynchronous read
// the line of the wait that retired it too.
struct Site { const char* file = nullptr; int line = 0; };
void set_site(const char* file, int line);  // the wrapper being called (sm90_emu.h)
Site site();
extern bool enabled;                        // on unless EMU_RACE=0

void block_begin(int threads, size_t window_bytes);
// Synchronisation: bar.sync's warps (a mask of warp indices) join their clocks; a
// warpgroup-wide instruction joins (enter) before its work and ticks after (leave).
void join(uint32_t warps);
void tick(uint32_t warps);
// An asynchronous operation's clock at issue (the issuing warp's), after which the warp ticks.
Clock issue(int warp);
// wgmma: the op `seq` of each thread; the last lane of a warp to issue it takes the warp's
// clock. retire_clock: the join of the 4 warps' clocks at issue of op seq.
void wgmma_issued(int thread, uint32_t seq);
Clock wgmma_retire_clock(int first_thread, uint32_t seq);
uint32_t tma_clock();                       // a new TMA load's own epoch

void mbar_init(uint32_t bar);
void mbar_release(uint32_t bar, int warp);  // arrive
void mbar_release_tma(uint32_t bar, const Clock& issued, uint32_t epoch);  // complete_tx
// try_wait saw the phase complete: the warp takes every release into the barrier so far
// (phases complete in order).
void mbar_acquire(uint32_t bar, int warp);

// An atomic read-modify-write at shared address addr by a thread of `warp`: it takes every
// earlier atomic's clock there and gives its own (the kernels' counters with
// __threadfence_block before them: the last to count goes on knowing what the others did).
void atomic(uint32_t addr, int warp);

// Accesses of `bytes` at shared address addr by `thread` (its warp's clock now).
void read(uint32_t addr, uint32_t bytes, int thread, Kind kind);
void write(uint32_t addr, uint32_t bytes, int thread, Kind kind);
// An asynchronous read by thread's warp(group), issued at clock `issued` from `from`, retired now.
void async_read(uint32_t addr, uint32_t bytes, const Clock& issued, int thread, Kind kind, Site from);
// A TMA load's write, landing now: issued at clock `issued` by thread from `from`, epoch its own.
void tma_write(uint32_t addr, uint32_t bytes, const Clock& issued, uint32_t epoch, int thread, Kind kind, Site from);
}  // namespace emu::race
