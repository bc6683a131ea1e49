// The shared-memory race detector of race.h. Shadow state per byte of the shared window (a
// byte, not a 4- or 16-byte granule: the kernels' warps write neighbouring bf16 pairs, 4
// bytes, and the checks' kernels 2-byte elements, so a coarser granule would report writes
// to neighbouring bytes as races): the last write's epoch (clock, slot), and each warp's
// last read. An epoch is (clock, thread, site); a slot a warp or the TMA. The shadow is
// cleared at each block's start when the block before used it.
#include "race.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>

#include "shim.h"

namespace emu::race {
namespace {
const char* const kKindName[] = {"st.shared write", "ld.shared read",  "stmatrix write",  "ldmatrix read",
                                 "TMA load write",  "cp.async.bulk write", "TMA store read", "wgmma operand read"};
struct SiteInfo { Kind kind; Site at, from; };
std::vector<SiteInfo> sites;
std::map<std::tuple<int, const char*, int, const char*, int>, uint16_t> site_ids;
Site current;

struct Rec { uint32_t clock; uint16_t thread, site; };
int nwarps = 0, nslots = 0;           // slots: the warps, then the TMA (slot nwarps)
std::vector<uint32_t> vc;             // nwarps rows of nslots
std::vector<Rec> wr;                  // per byte: the last write
std::vector<uint8_t> wslot;           //   and its slot
std::vector<Rec> rd;                  // per byte and warp: the last read
bool dirty = false;
uint32_t tma_epoch = 0;
struct MbarClock { Clock released; };  // every release into the barrier so far
std::map<uint32_t, MbarClock> mbars;
std::map<uint32_t, Clock> atomics;     // per shared address: every atomic's clock there so far
struct Issue { int lanes = 0; Clock at; };
std::vector<std::map<uint32_t, Issue>> wgmma_issues;  // per warp: op seq -> its issue

uint32_t* row(int warp) { return &vc[size_t(warp) * nslots]; }
void join_into(uint32_t* to, const uint32_t* from) {
  for (int s = 0; s < nslots; ++s) to[s] = to[s] > from[s] ? to[s] : from[s];
}
uint16_t site_id(Kind kind, Site at, Site from) {
  static std::tuple<int, const char*, int, const char*, int> last_key{-1, nullptr, 0, nullptr, 0};
  static uint16_t last_id = 0;
  const auto key = std::make_tuple(int(kind), at.file, at.line, from.file, from.line);
  if (key == last_key) return last_id;
  auto it = site_ids.find(key);
  if (it == site_ids.end()) {
    const uint16_t id = uint16_t(sites.size() < 65535 ? sites.size() : 65535);
    if (sites.size() < 65535) sites.push_back({kind, at, from});
    it = site_ids.emplace(key, id).first;
  }
  last_key = key;
  return last_id = it->second;
}
// The line in src/: run.sh's copies keep the lines of src/kernels/<name>.cu (as
// <work>/<name>_emu.cpp) and of the shared headers (as <work>/include/kernels/<name>.cuh).
std::string where(Site s) {
  if (!s.file) return "an unknown line";
  std::string f = s.file;
  const size_t inc = f.rfind("/include/kernels/"), slash = f.rfind('/');
  const std::string base = slash == std::string::npos ? f : f.substr(slash + 1), emu = "_emu.cpp";
  if (inc != std::string::npos) f = "src/kernels/" + base;
  else if (base.size() > emu.size() && base.compare(base.size() - emu.size(), emu.size(), emu) == 0)
    f = "src/kernels/" + base.substr(0, base.size() - emu.size()) + ".cu";
  return f + ":" + std::to_string(s.line);
}
std::string describe(const Rec& r, int slot) {
  const SiteInfo& s = sites[r.site];
  std::string d = kKindName[s.kind];
  if (s.kind == kTmaLoad || s.kind == kBulkLoad)
    return d + " (issued by warp " + std::to_string(r.thread / 32) + " thread " + std::to_string(r.thread) + " at " +
           where(s.at) + ")";
  d += " by warp " + std::to_string(slot) + " thread " + std::to_string(r.thread);
  if (s.kind == kWgmma || s.kind == kTmaStore) return d + " (issued at " + where(s.from) + ", retired at " + where(s.at) + ")";
  return d + " at " + where(s.at);
}
[[noreturn]] void report(uint32_t addr, const Rec& before, int before_slot, const Rec& now, int now_slot) {
  const std::string what = "shared-memory race at shared 0x" + [&] {
    char h[16];
    snprintf(h, sizeof h, "%x", addr);
    return std::string(h);
  }() + " (byte " + std::to_string(addr - kSmemOffset) + " of the dynamic shared memory): " + describe(before, before_slot) +
                           ", then " + describe(now, now_slot) +
                           ", with no barrier, mbarrier wait or wait_group ordering them";
  fail(what.c_str());
}
bool unordered(const Rec& r, int slot, const uint32_t* knows) { return r.clock != 0 && r.clock > knows[slot]; }
// A write of byte b known to `knows`, by `slot`: after the last write and every warp's last read?
void check_write(uint32_t b, const uint32_t* knows, const Rec& now, int slot) {
  if (unordered(wr[b], wslot[b], knows)) report(b, wr[b], wslot[b], now, slot);
  const Rec* reads = &rd[size_t(b) * nwarps];
  for (int w = 0; w < nwarps; ++w)
    if (unordered(reads[w], w, knows)) report(b, reads[w], w, now, slot);
}
void range_check(uint32_t addr, uint32_t bytes) {
  if (size_t(addr) + bytes > wr.size()) fail("race detector: an access outside the shared window");
  dirty = true;
}
// A read by warp w (recorded as `now`) of what `knows` knows: after each byte's last write?
void record_read(uint32_t addr, uint32_t bytes, const uint32_t* knows, int w, const Rec& now) {
  range_check(addr, bytes);
  for (uint32_t b = addr; b < addr + bytes; ++b) {
    if (unordered(wr[b], wslot[b], knows)) report(b, wr[b], wslot[b], now, w);
    rd[size_t(b) * nwarps + w] = now;
  }
}
void record_write(uint32_t addr, uint32_t bytes, const uint32_t* knows, int slot, const Rec& now) {
  range_check(addr, bytes);
  for (uint32_t b = addr; b < addr + bytes; ++b) {
    check_write(b, knows, now, slot);
    wr[b] = now;
    wslot[b] = uint8_t(slot);
  }
}
}  // namespace

bool enabled = [] {
  const char* e = getenv("EMU_RACE");
  return !(e && strcmp(e, "0") == 0);
}();

void set_site(const char* file, int line) { current = Site{file, line}; }
Site site() { return current; }

void block_begin(int threads, size_t window_bytes) {
  if (!enabled) return;
  nwarps = (threads + 31) / 32;
  nslots = nwarps + 1;
  vc.assign(size_t(nwarps) * nslots, 0);
  for (int w = 0; w < nwarps; ++w) row(w)[w] = 1;
  tma_epoch = 0;
  mbars.clear();
  atomics.clear();
  wgmma_issues.assign(nwarps, {});
  if (wr.size() != window_bytes || rd.size() != window_bytes * nwarps) {
    wr.assign(window_bytes, Rec{});
    wslot.assign(window_bytes, 0);
    rd.assign(window_bytes * nwarps, Rec{});
  } else if (dirty) {
    memset(wr.data(), 0, wr.size() * sizeof(Rec));
    memset(rd.data(), 0, rd.size() * sizeof(Rec));
  }
  dirty = false;
}

void join(uint32_t warps) {
  if (!enabled || warps == 0) return;
  Clock j(nslots, 0);
  for (int w = 0; w < nwarps; ++w)
    if (warps >> w & 1) join_into(j.data(), row(w));
  for (int w = 0; w < nwarps; ++w)
    if (warps >> w & 1) memcpy(row(w), j.data(), nslots * sizeof(uint32_t));
}
void tick(uint32_t warps) {
  if (!enabled) return;
  for (int w = 0; w < nwarps; ++w)
    if (warps >> w & 1) ++row(w)[w];
}
Clock issue(int warp) {
  if (!enabled) return {};
  Clock c(row(warp), row(warp) + nslots);
  ++row(warp)[warp];
  return c;
}
void wgmma_issued(int thread, uint32_t seq) {
  if (!enabled) return;
  const int w = thread / 32;
  Issue& is = wgmma_issues[w][seq];
  if (++is.lanes == 32) is.at = issue(w);  // the warp issues with its last lane
}
Clock wgmma_retire_clock(int first_thread, uint32_t seq) {
  if (!enabled) return {};
  Clock j(nslots, 0);
  for (int w = first_thread / 32; w < first_thread / 32 + 4; ++w) {
    auto it = wgmma_issues[w].find(seq);
    if (it == wgmma_issues[w].end() || it->second.lanes != 32) fail("race detector: a wgmma retired before its warp issued it");
    join_into(j.data(), it->second.at.data());
    wgmma_issues[w].erase(it);
  }
  return j;
}
uint32_t tma_clock() { return ++tma_epoch; }

void mbar_init(uint32_t bar) {
  if (enabled) mbars[bar].released.assign(nslots, 0);
}
void mbar_release(uint32_t bar, int warp) {
  if (!enabled) return;
  join_into(mbars[bar].released.data(), row(warp));
  ++row(warp)[warp];
}
void mbar_release_tma(uint32_t bar, const Clock& issued, uint32_t epoch) {
  if (!enabled) return;
  Clock& r = mbars[bar].released;
  join_into(r.data(), issued.data());
  r[nwarps] = r[nwarps] > epoch ? r[nwarps] : epoch;
}
void mbar_acquire(uint32_t bar, int warp) {
  if (enabled) join_into(row(warp), mbars[bar].released.data());
}

void atomic(uint32_t addr, int warp) {
  if (!enabled) return;
  Clock& c = atomics[addr];
  c.resize(nslots, 0);
  join_into(row(warp), c.data());
  memcpy(c.data(), row(warp), nslots * sizeof(uint32_t));
  ++row(warp)[warp];
}

void read(uint32_t addr, uint32_t bytes, int thread, Kind kind) {
  if (!enabled) return;
  const int w = thread / 32;
  record_read(addr, bytes, row(w), w, Rec{row(w)[w], uint16_t(thread), site_id(kind, current, Site{})});
}
void write(uint32_t addr, uint32_t bytes, int thread, Kind kind) {
  if (!enabled) return;
  const int w = thread / 32;
  record_write(addr, bytes, row(w), w, Rec{row(w)[w], uint16_t(thread), site_id(kind, current, Site{})});
}
void async_read(uint32_t addr, uint32_t bytes, const Clock& issued, int thread, Kind kind, Site from) {
  if (!enabled) return;
  const int w = thread / 32;
  record_read(addr, bytes, issued.data(), w, Rec{row(w)[w], uint16_t(thread), site_id(kind, current, from)});
}
void tma_write(uint32_t addr, uint32_t bytes, const Clock& issued, uint32_t epoch, int thread, Kind kind, Site from) {
  if (enabled) record_write(addr, bytes, issued.data(), nwarps, Rec{epoch, uint16_t(thread), site_id(kind, from, Site{})});
}
}  // namespace emu::race
