# libtorch: an explicit Torch_DIR or CMAKE_PREFIX_PATH wins; otherwise ask the
# Python that has torch where its CMake files are.
if(NOT Torch_DIR AND NOT CMAKE_PREFIX_PATH)
  execute_process(
    COMMAND "${PERFTRAIN_PYTHON}" -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _torch_rc)
  if(NOT _torch_rc EQUAL 0)
    message(FATAL_ERROR "perftrain: ${PERFTRAIN_PYTHON} cannot import torch; "
      "install torch==2.11.0 into .venv (see README) or pass -DTorch_DIR=...")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
endif()
# find_package(Torch) ignores CMAKE_CUDA_ARCHITECTURES; it reads this.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "9.0a")
endif()
find_package(Torch REQUIRED)
message(STATUS "perftrain: torch ${Torch_VERSION} from ${Torch_DIR}")
# Torch's flags (e.g. -D_GLIBCXX_USE_CXX11_ABI) must reach every target.
add_compile_options(${TORCH_CXX_FLAGS})

# Our own kernels (src/kernels/*.cu): built for Hopper (sm_90a: wgmma,
# setmaxnreg) unless the caller names other architectures.
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90a)
endif()
if(NOT CMAKE_CUDA_COMPILER AND EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
  set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
endif()
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)  # one CUDA runtime in the process: libtorch's
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
