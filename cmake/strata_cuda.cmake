# The CUDA backend (issue 19), included by strata_core.cmake. STRATA_CUDA:
#   OFF (default)  the CPU-only build, as before: no CUDA sources, no CUDA runtime, nothing probed.
#   ON             build csrc/**/*.cu for STRATA_CUDA_ARCHS; a missing toolkit is a configure error.
#   AUTO           ON when CMake finds a CUDA compiler, else OFF.
# Off unless asked (as llama.cpp's GGML_CUDA): the developer machines and CI have nvcc but no GPU, and a found
# toolkit would make every CPU build pay the CUDA compile and link the CUDA runtime for nothing. The runtime is
# linked statically (CUDA::cudart_static), which loads the driver only when first called, so a CUDA build still
# imports and runs on the CPU where no GPU or driver is present (_core.cuda_available() says False).
# STRATA_CUDA_ARCHS: CMAKE_CUDA_ARCHITECTURES' syntax; 90a = the H200/H100 (sm_90a), e.g. "80;89" for A100/L40.
set(STRATA_CUDA OFF CACHE STRING "CUDA backend: OFF, ON or AUTO (on when a CUDA toolkit is found)")
set_property(CACHE STRATA_CUDA PROPERTY STRINGS OFF ON AUTO)
set(STRATA_CUDA_ARCHS "90a" CACHE STRING "CUDA architectures for the CUDA backend (CMAKE_CUDA_ARCHITECTURES syntax)")

set(STRATA_CUDA_ON OFF)
if(STRATA_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(STRATA_CUDA_ON ON)
  endif()
elseif(STRATA_CUDA)
  set(STRATA_CUDA_ON ON)
endif()

if(STRATA_CUDA_ON)
  if(NOT CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX})
    # nvcc's host compiler = the C++ compiler of the rest, not whatever g++ is first on the PATH
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER} CACHE FILEPATH "host compiler for nvcc")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES ${STRATA_CUDA_ARCHS})
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  file(GLOB_RECURSE CUDA_SOURCES CONFIGURE_DEPENDS ${STRATA_ROOT}/csrc/*.cu)
  target_sources(strata_core PRIVATE ${CUDA_SOURCES})
  target_compile_definitions(strata_core PUBLIC STRATA_HAS_CUDA=1)
  target_link_libraries(strata_core PUBLIC CUDA::cudart_static)
  set_target_properties(strata_core PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                        CUDA_ARCHITECTURES "${STRATA_CUDA_ARCHS}")  # made before CUDA was enabled
  # Exactness: no contraction of a*b+c into FMA (kernels call fmaf where the CPU twin calls std::fma), IEEE
  # division and square root, denormals kept: the same float32 operations as the CPU kernels.
  target_compile_options(strata_core PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -prec-div=true -prec-sqrt=true -ftz=false -O3 -lineinfo>)
  message(STATUS "strata: CUDA backend ON (archs ${CMAKE_CUDA_ARCHITECTURES}, nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
else()
  message(STATUS "strata: CUDA backend OFF (STRATA_CUDA=${STRATA_CUDA})")
endif()
