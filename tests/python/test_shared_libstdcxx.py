"""cmake/SharedLibstdcxx.cmake: a module built by a compiler that copies libstdc++ code into shared objects
is linked to the shared libstdc++.so.6 instead, and one built by a normal compiler is left alone.

The copying compiler is simulated by a wrapper around the system's g++ that adds -static-libstdc++ to every
link (as a toolchain's "nonshared" linker script does for part of the library) and, like GCC 12, rejects
-nostdlib++; so the check must fall through to its second candidate. Each case configures and builds a
small CMake project with a MODULE that formats a long into a stream (what crashed the Python module), then
reads the module's dynamic symbols and its DT_NEEDED entries, and loads it.
"""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSERT_LONG = "_ZNSo9_M_insertIlEERSoT_"  # std::ostream::_M_insert<long>

WRAPPER = """#!/bin/sh
for a in "$@"; do
  case "$a" in
    -nostdlib++) echo "g++: error: unrecognized command-line option '-nostdlib++'" >&2; exit 1;;
    -nodefaultlibs) exec {gxx} "$@";;
  esac
done
exec {gxx} "$@" -static-libstdc++
"""

PROJECT = """cmake_minimum_required(VERSION 3.20)
project(probe CXX)
include("{root}/cmake/SharedLibstdcxx.cmake")
perftrain_shared_libstdcxx_flags(flags)
file(WRITE "${{CMAKE_BINARY_DIR}}/flags.txt" "${{flags}}")
add_library(formats MODULE formats.cpp)
perftrain_link_shared_libstdcxx(formats "${{flags}}")
"""

SOURCE = """#include <sstream>
#include <string>
#include <cstring>
extern "C" int format_long(long x, char* out, int n) {
  std::ostringstream s;
  s << "shape [" << x << "]";
  std::strncpy(out, s.str().c_str(), n);
  return (int)s.str().size();
}
"""


def build(work, compiler):
    src = os.path.join(work, "src")
    os.makedirs(src)
    with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
        f.write(PROJECT.format(root=ROOT))
    with open(os.path.join(src, "formats.cpp"), "w") as f:
        f.write(SOURCE)
    out = os.path.join(work, "build")
    subprocess.run(["cmake", "-S", src, "-B", out, "-G", "Ninja", f"-DCMAKE_CXX_COMPILER={compiler}"],
                   check=True, capture_output=True, text=True)
    subprocess.run(["cmake", "--build", out], check=True, capture_output=True, text=True)
    with open(os.path.join(out, "flags.txt")) as f:
        flags = f.read()
    module = [os.path.join(out, n) for n in os.listdir(out) if n.endswith(".so")][0]
    return flags, module


def defined_symbols(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], check=True, capture_output=True, text=True)
    return out.stdout


def needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True)
    return [line.split("[")[1].rstrip("]") for line in out.stdout.splitlines() if "(NEEDED)" in line]


def formats(path):
    lib = ctypes.CDLL(path)
    buf = ctypes.create_string_buffer(64)
    lib.format_long(-1234567, buf, 64)
    return buf.value.decode()


def main():
    for tool in ("cmake", "ninja", "nm", "readelf"):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} not found")
            return 0
    gxx = shutil.which("g++")
    assert gxx, "g++ not found"
    with tempfile.TemporaryDirectory() as tmp:
        wrapper = os.path.join(tmp, "copying-g++")
        with open(wrapper, "w") as f:
            f.write(WRAPPER.format(gxx=gxx))
        os.chmod(wrapper, 0o755)

        # The simulation is real: the wrapper alone puts libstdc++'s code into a shared object.
        probe = os.path.join(tmp, "probe.so")
        src = os.path.join(tmp, "probe.cpp")
        with open(src, "w") as f:
            f.write(SOURCE)
        subprocess.run([wrapper, "-shared", "-fPIC", src, "-o", probe], check=True)
        assert INSERT_LONG in defined_symbols(probe), "the wrapper did not copy libstdc++ code"

        flags, module = build(os.path.join(tmp, "copying"), wrapper)
        assert flags.startswith("-nodefaultlibs|"), f"expected the -nodefaultlibs candidate, got {flags!r}"
        assert INSERT_LONG not in defined_symbols(module), "the module still defines libstdc++ code"
        deps = needed(module)
        assert "libstdc++.so.6" in deps, f"the module does not need the shared libstdc++: {deps}"
        assert formats(module) == "shape [-1234567]", formats(module)

        flags, module = build(os.path.join(tmp, "plain"), gxx)
        assert flags == "", f"a normal compiler got link flags: {flags!r}"
        assert INSERT_LONG not in defined_symbols(module)
        assert formats(module) == "shape [-1234567]"
    print("ok: a copying compiler's module links the shared libstdc++; a normal one is left alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
