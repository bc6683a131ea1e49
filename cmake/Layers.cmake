# One static library per layer of docs/design.md, from the .cpp files of its folder.
# perftrain_layer(NAME DEPS...): DEPS are lower layers it may use.
function(perftrain_layer name)
  file(GLOB _src CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/src/${name}/*.cpp"
                                   "${CMAKE_SOURCE_DIR}/src/${name}/*/*.cpp")
  if(name STREQUAL "kernels")
    # CUDA C++ on raw pointers: no torch, only the CUDA runtime and cuBLASLt.
    file(GLOB _cu CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/src/kernels/*.cu")
    if(NOT _src AND NOT _cu)
      add_library(perftrain_kernels INTERFACE)
      target_include_directories(perftrain_kernels INTERFACE "${CMAKE_SOURCE_DIR}/src")
      target_link_libraries(perftrain_kernels INTERFACE CUDA::cudart CUDA::cublasLt)
      return()
    endif()
    add_library(perftrain_kernels STATIC ${_src} ${_cu})
    target_include_directories(perftrain_kernels PUBLIC "${CMAKE_SOURCE_DIR}/src")
    target_link_libraries(perftrain_kernels PUBLIC CUDA::cudart CUDA::cublasLt)
    target_compile_options(perftrain_kernels PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
    set_target_properties(perftrain_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)
    return()
  endif()
  if(_src)
    add_library(perftrain_${name} STATIC ${_src})
    target_include_directories(perftrain_${name} PUBLIC "${CMAKE_SOURCE_DIR}/src")
    target_link_libraries(perftrain_${name} PUBLIC ${ARGN} ${TORCH_LIBRARIES})
    target_compile_options(perftrain_${name} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  else()
    add_library(perftrain_${name} INTERFACE)
    target_include_directories(perftrain_${name} INTERFACE "${CMAKE_SOURCE_DIR}/src")
    target_link_libraries(perftrain_${name} INTERFACE ${ARGN} ${TORCH_LIBRARIES})
  endif()
endfunction()

# perftrain_tests(LAYER LIBS...): tests/LAYER/*_test.cpp become one executable
# (label cpu); *_gpu_test.cpp another (label gpu; they skip without a GPU).
function(perftrain_tests layer)
  file(GLOB _all CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/tests/${layer}/*_test.cpp")
  set(_cpu "")
  set(_gpu "")
  foreach(f ${_all})
    if(f MATCHES "_gpu_test\\.cpp$")
      list(APPEND _gpu ${f})
    else()
      list(APPEND _cpu ${f})
    endif()
  endforeach()
  foreach(kind cpu gpu)
    if(_${kind})
      if(kind STREQUAL "cpu")
        set(exe test_${layer})
      else()
        set(exe test_${layer}_gpu)
      endif()
      add_executable(${exe} ${_${kind}})
      target_link_libraries(${exe} PRIVATE ${ARGN} perftrain_test_support GTest::gtest_main)
      # Listing the tests loads libtorch: from a cold disk on a 2-core machine
      # that took longer than the 5 s default, so the first ctest failed.
      gtest_discover_tests(${exe} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 600
        TEST_PREFIX "${layer}." PROPERTIES LABELS ${kind}
        WORKING_DIRECTORY "${CMAKE_SOURCE_DIR}")
    endif()
  endforeach()
endfunction()
