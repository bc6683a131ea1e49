# A Python extension module must use the libstdc++ the interpreter process loads (the system's
# libstdc++.so.6, through torch), not copies of its code. Some toolchains built for older systems link
# part of libstdc++ statically into every shared object (a linker script adding a "nonshared" archive);
# such a module carries its own std::num_put and locale ids, and the first number it formats into a
# stream created by the system's library crashes the process (an error message with a shape in it was
# enough). perftrain_use_shared_libstdcxx(target) tests the compiler on a tiny shared object that
# formats a long; if that object defines std::ostream::_M_insert<long>, the target is linked with
# -nostdlib++ and the shared libstdc++.so.6 instead, and the same test must then come out clean.
function(_perftrain_libstdcxx_copies out_var flags)
  set(_dir "${CMAKE_BINARY_DIR}/CMakeFiles/perftrain_libstdcxx")
  file(MAKE_DIRECTORY "${_dir}")
  file(WRITE "${_dir}/probe.cpp"
       "#include <sstream>\n#include <string>\nstd::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n")
  separate_arguments(_flags UNIX_COMMAND "${flags}")
  execute_process(
    COMMAND "${CMAKE_CXX_COMPILER}" -shared -fPIC -O2 "${_dir}/probe.cpp" -o "${_dir}/probe.so" ${_flags}
    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    set(${out_var} "link-failed" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND "${CMAKE_NM}" -D --defined-only "${_dir}/probe.so" OUTPUT_VARIABLE _syms)
  if(_syms MATCHES "_ZNSo9_M_insertIlEERSoT_")
    set(${out_var} "copies" PARENT_SCOPE)
  else()
    set(${out_var} "shared" PARENT_SCOPE)
  endif()
endfunction()

function(perftrain_use_shared_libstdcxx target)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR NOT CMAKE_NM)
    return()
  endif()
  _perftrain_libstdcxx_copies(_plain "")
  if(NOT _plain STREQUAL "copies")
    return()
  endif()
  set(_fix "-nostdlib++ -l:libstdc++.so.6 -lm")
  _perftrain_libstdcxx_copies(_fixed "${_fix}")
  if(NOT _fixed STREQUAL "shared")
    message(FATAL_ERROR
      "perftrain: ${CMAKE_CXX_COMPILER} links copies of libstdc++ code into shared objects, and "
      "'${_fix}' does not stop it (${_fixed}); a Python module built so crashes on its first error "
      "message. Build the Python package with the system's g++ (CXX=/usr/bin/g++).")
  endif()
  message(STATUS "perftrain: ${CMAKE_CXX_COMPILER} copies libstdc++ code into shared objects; "
                 "${target} links the shared libstdc++.so.6 instead (-nostdlib++)")
  target_link_options(${target} PRIVATE -nostdlib++)
  target_link_libraries(${target} PRIVATE -l:libstdc++.so.6 -lm)
endfunction()
