# A Python extension module must use the libstdc++ the interpreter process loads (the system's
# libstdc++.so.6, through torch), not copies of its code. Some toolchains built for older systems link
# part of libstdc++ statically into every shared object (a linker script adding a "nonshared" archive);
# such a module carries its own std::num_put and locale ids, and the first number it formats into a
# stream created by the system's library crashes the process (an error message with a shape in it was
# enough). perftrain_shared_libstdcxx_flags(out) tests the compiler on a tiny shared object that formats
# a long: if that object defines std::ostream::_M_insert<long>, it tries link flags that take the shared
# libstdc++.so.6 instead, and gives the first with which the same test comes out clean:
#   ""           the compiler links the shared library already (nothing to do)
#   a flag list  link options then libraries, separated by "|"
#   NOTFOUND     no candidate worked: the module would crash, so it is not built
function(_perftrain_libstdcxx_copies out_var flags)
  set(_dir "${CMAKE_BINARY_DIR}/CMakeFiles/perftrain_libstdcxx")
  file(MAKE_DIRECTORY "${_dir}")
  file(WRITE "${_dir}/probe.cpp"
       "#include <sstream>\n#include <string>\nstd::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n")
  string(REPLACE "|" " " _flat "${flags}")
  separate_arguments(_flags UNIX_COMMAND "${_flat}")
  execute_process(
    COMMAND "${CMAKE_CXX_COMPILER}" -shared -fPIC -O2 "${_dir}/probe.cpp" -o "${_dir}/probe.so" ${_flags}
    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
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

function(perftrain_shared_libstdcxx_flags out_var)
  set(${out_var} "" PARENT_SCOPE)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR NOT CMAKE_NM)
    return()
  endif()
  _perftrain_libstdcxx_copies(_plain "")
  if(NOT _plain STREQUAL "copies")
    return()
  endif()
  # GCC 13 and later: -nostdlib++; before: no default libraries, the C and C++ runtimes named.
  foreach(_candidate "-nostdlib++|-l:libstdc++.so.6 -lm"
                     "-nodefaultlibs|-l:libstdc++.so.6 -lm -lgcc_s -lc -lgcc")
    _perftrain_libstdcxx_copies(_result "${_candidate}")
    if(_result STREQUAL "shared")
      message(STATUS "perftrain: ${CMAKE_CXX_COMPILER} copies libstdc++ code into shared objects; "
                     "the Python module links the shared libstdc++.so.6 instead (${_candidate})")
      set(${out_var} "${_candidate}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out_var} NOTFOUND PARENT_SCOPE)
endfunction()

# Applies a flag list of perftrain_shared_libstdcxx_flags to target.
function(perftrain_link_shared_libstdcxx target flags)
  if(flags STREQUAL "")
    return()
  endif()
  string(REPLACE "|" ";" _parts "${flags}")
  list(GET _parts 0 _options)
  list(GET _parts 1 _libraries)
  separate_arguments(_options UNIX_COMMAND "${_options}")
  separate_arguments(_libraries UNIX_COMMAND "${_libraries}")
  target_link_options(${target} PRIVATE ${_options})
  target_link_libraries(${target} PRIVATE ${_libraries})
endfunction()
