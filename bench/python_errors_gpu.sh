#!/usr/bin/env bash
# Where an error raised through perftrain._C crashes Python on the GPU machine (python.ops.ops and
# python.profile die with SIGSEGV there, pass on the CPU machine), for
#   MODE=script SCRIPT=bench/python_errors_gpu.sh BUILD_TARGETS=perftrain_python tools/gpu_run.sh
# Each probe is its own process under faulthandler: its exit code (139: the segfault) and the last lines
# of its output, into $OUT/python-errors.txt; then the module's unwind tables and, where gdb is there,
# the native stack of the first probe that crashes.
set -uo pipefail
: "${BIN:?run through tools/gpu_run.sh MODE=script}" "${OUT:?}" "${PY:?}"
PYTHONPATH="$(cd "$(dirname "$BIN")" && pwd)/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH PYTHONFAULTHANDLER=1
log="$OUT/python-errors.txt"
: > "$log"
# Where the module's copies of libstdc++ code come from: the crash's frames name std::ostream::_M_insert<long>
# and a codecvt facet inside _C.so, which a module built here (Debian 12) does not define.
build="$(dirname "$BIN")"
so=$(ls "$build"/python/perftrain/_C*.so)
{ echo "## libstdc++ code defined in $so"
  nm -D --defined-only "$so" | grep -cE " _ZNS[oti]| _ZNKS[oti]| _ZSt" | sed 's/^/defined std symbols: /'
  nm -D --defined-only "$so" | grep -E " _ZNSo| _ZNSt7codecvt| _ZNKSt7num_put| _ZNSt6locale" | head -n 12
  echo "## objects that define std::ostream::_M_insert<long> or codecvt<char16_t>"
  for f in "$build"/src/*.a $(find "$build/python" -name "*.o"); do
    nm -A --defined-only "$f" 2>/dev/null | grep -E "_ZNSo9_M_insertIlEERSoT_|_ZNSt7codecvtIDsc" | head -n 3
  done
  echo "## the module's link line"; ninja -C "$build" -t commands perftrain_python | tail -n 1 | tr ' ' '\n' | grep -vE '\.o$' | tr '\n' ' '; echo
  printf '#include <sstream>\nstd::string f(long x){ std::ostringstream os; os << x; return os.str(); }\n' > "$OUT/t.cpp"
  g++ -O3 -fPIC -c "$OUT/t.cpp" -o "$OUT/t.o" && echo "tiny TU, g++: $(nm "$OUT/t.o" | grep _M_insert)"
  cp "$OUT/t.cpp" "$OUT/t.cu"; /usr/local/cuda/bin/nvcc -O3 -Xcompiler -fPIC -c "$OUT/t.cu" -o "$OUT/tcu.o" && echo "tiny TU, nvcc: $(nm "$OUT/tcu.o" | grep _M_insert)"
  dpkg -l 2>/dev/null | grep -E "libstdc\+\+|g\+\+" | awk '{print $2, $3}'
  echo; } 2>&1 | tee -a "$log"
# The compiler CMake picked and the libstdc++ its link takes: a linker script that adds a static archive of
# libstdc++ code (as toolchains built for old systems do) puts copies into the module; then the module relinked
# two ways (the system's g++, and the same compiler without its libstdc++ but the system's libstdc++.so.6),
# each tried on the probe that crashes.
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
{ echo "## compiler $cxx: $("$cxx" --version | head -1)"
  lib=$("$cxx" -print-file-name=libstdc++.so); echo "its libstdc++.so: $lib"
  file -L "$lib" 2>/dev/null; grep -a -m3 -E "INPUT|GROUP" "$lib" 2>/dev/null
  ls "$(dirname "$lib")" | grep -E "stdc|nonshared" | head; echo; } 2>&1 | tee -a "$log"
relink() {  # name, compiler, extra flags
  local dir="$OUT/relink-$1" cmd
  mkdir -p "$dir/perftrain"
  cp "$build"/python/perftrain/*.py "$dir/perftrain/"
  cmd=$(ninja -C "$build" -t commands perftrain_python | tail -n 1)
  cmd=${cmd//"$cxx "/"$2 $3 "}
  cmd=${cmd//"-o python/perftrain/"/"-o $dir/perftrain/"}
  (cd "$build" && eval "$cmd") > "$dir/link.log" 2>&1 || { echo "## relink $1: link failed"; tail -3 "$dir/link.log"; return; }
  echo "## relink $1: $(nm -D --defined-only "$dir"/perftrain/_C*.so | grep -cE " _ZNS[oti]| _ZNKS[oti]| _ZSt") std symbols defined"
  PYTHONPATH="$dir" timeout 60 "$PY" -c 'import torch, perftrain.ops as P
try:
    P.gated_residual(torch.randn(2, 3, 8), torch.randn(2, 7), torch.randn(2, 3, 8))
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])' 2>&1 | tail -n 3; echo "rc ${PIPESTATUS[0]}"
}
{ relink system-gxx /usr/bin/g++ ""
  relink nostdlibxx "$cxx" "-nostdlib++ -Wl,-l:libstdc++.so.6"; echo; } 2>&1 | tee -a "$log"
probe() {  # name, python code
  local rc
  timeout 60 "$PY" -c "$2" > "$OUT/probe.out" 2>&1
  rc=$?
  { echo "## $1: rc $rc"; tail -n 6 "$OUT/probe.out"; echo; } | tee -a "$log"
  [ $rc -eq 139 ] && [ -z "${crashed:-}" ] && crashed="$2"
}
T='import torch
try:
    torch.ones(2) + torch.ones(3)
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])'
probe "an ATen error, torch alone" "$T"
probe "an ATen error, perftrain._C loaded" "import perftrain._C
$T"
probe "an ATen error, perftrain loaded" "import perftrain
$T"
probe "perftrain.ops.gated_residual, bad shapes" 'import torch, perftrain.ops as P
try:
    P.gated_residual(torch.randn(2, 3, 8), torch.randn(2, 7), torch.randn(2, 3, 8))
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])'
probe "diagnose_trace, no such file" 'import torch, perftrain
try:
    torch.ops.perftrain.diagnose_trace("/nonexistent.json")
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])'
# Which layer: the op's own kernel without the autograd kernel that ops.py registers in Python (below
# autograd, and under inference_mode), and torch alone with an error raised through the same nesting
# (a Python autograd kernel redispatching to a kernel that raises from C++).
probe "gated_residual, bad shapes, below autograd" 'import torch, perftrain
try:
    with torch._C._AutoDispatchBelowAutograd():
        torch.ops.perftrain.gated_residual(torch.randn(2, 3, 8), torch.randn(2, 7), torch.randn(2, 3, 8), None)
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])'
probe "gated_residual, bad shapes, inference_mode" 'import torch, perftrain.ops as P
try:
    with torch.inference_mode():
        P.gated_residual(torch.randn(2, 3, 8), torch.randn(2, 7), torch.randn(2, 3, 8))
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])'
probe "torch alone: a Python autograd kernel over a kernel raising from ATen" 'import torch
@torch.library.custom_op("probe::add", mutates_args=())
def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.add(a, b)
add.register_autograd(lambda ctx, g: (g, g))
try:
    add(torch.ones(2, requires_grad=True), torch.ones(3))
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])'
# The diagnosis of a trace recorded in this process: CPU activity only, then CPU and CUDA.
for acts in "CPU" "CPU, ProfilerActivity.CUDA"; do
  probe "diagnose of a trace with ProfilerActivity.$acts" "import torch, perftrain, tempfile, os
from torch.profiler import profile, ProfilerActivity
m = torch.nn.Linear(32, 8)
with profile(activities=[ProfilerActivity.$acts]) as p:
    for _ in range(3):
        m(torch.randn(4, 32)).sum().backward()
path = os.path.join(tempfile.mkdtemp(), 't.json')
p.export_chrome_trace(path)
print(torch.ops.perftrain.diagnose_trace(path).splitlines()[0])"
done
so=$(ls "$(dirname "$BIN")"/python/perftrain/_C*.so)
{ echo "## tools"; "$PY" --version; g++ --version | head -1; nvcc --version | tail -1
  echo "## $so"; readelf -lW "$so" | grep -E "EH_FRAME|GNU_STACK"; readelf -SW "$so" | grep -E "eh_frame|gcc_except"
  ldd "$so" | grep -E "stdc|gcc_s|torch_python|c10"; } 2>&1 | tee -a "$log"
if [ -n "${crashed:-}" ] && command -v gdb > /dev/null; then
  gdb -batch -ex run -ex bt --args "$PY" -c "$crashed" > "$OUT/gdb.txt" 2>&1
  grep -E "^#[0-9]+ " "$OUT/gdb.txt" | head -n 30 | tee -a "$log"
elif [ -n "${crashed:-}" ]; then
  # No gdb there: a preloaded SIGSEGV handler prints the native frames (glibc's backtrace, dynamic symbols).
  cat > "$OUT/segv_trace.c" <<'CEOF'
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
static void on_segv(int sig, siginfo_t* info, void* ctx) {
  void* frames[64];
  int n = backtrace(frames, 64);
  const char head[] = "native frames at SIGSEGV:\n";
  write(2, head, sizeof head - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, 0);
}
CEOF
  gcc -shared -fPIC -O1 -o "$OUT/segv_trace.so" "$OUT/segv_trace.c" &&
    PYTHONFAULTHANDLER= LD_PRELOAD="$OUT/segv_trace.so" timeout 60 "$PY" -c "$crashed" > "$OUT/native.txt" 2>&1
  { echo "## native frames (gdb absent), each with addr2line's function where the object has the symbol"
    grep -A40 "native frames" "$OUT/native.txt" | head -n 42 | while IFS= read -r line; do
      obj="${line%%(*}" off="${line#*(+}"
      off="${off%%)*}"
      fn=""
      [[ "$line" == *"(+0x"* ]] && [ -f "$obj" ] && fn="$(addr2line -f -C -e "$obj" "$off" 2>/dev/null | head -1)"
      echo "$line ${fn:+ -> $fn}"
    done; } | tee -a "$log"
else
  echo "gdb: $(command -v gdb || echo absent)" | tee -a "$log"
fi
exit 0
