# The engine core: everything but the bindings, as the static library strata_core. Included by the
# extension build (../CMakeLists.txt) and by the fuzzers (../fuzz/CMakeLists.txt). Portable code is built
# for baseline x86-64; ISA-specific kernels live in csrc/kernels/cpu/*_avx2.cpp / *_avx512.cpp /
# *_avx512vbmi.cpp and get their flags below, chosen at run time by cpu feature dispatch, so one build
# runs on any x86-64. STRATA_CORE_OPT: the optimisation flags (the sanitizer and coverage builds pass -O0).
get_filename_component(STRATA_ROOT ${CMAKE_CURRENT_LIST_DIR}/.. ABSOLUTE)
file(GLOB_RECURSE CORE_SOURCES CONFIGURE_DEPENDS ${STRATA_ROOT}/csrc/*.cpp)
list(FILTER CORE_SOURCES EXCLUDE REGEX ".*/bindings/.*")
if(NOT DEFINED STRATA_CORE_OPT)
  set(STRATA_CORE_OPT -O3)
endif()

add_library(strata_core STATIC ${CORE_SOURCES})
target_include_directories(strata_core PUBLIC ${STRATA_ROOT}/csrc)
target_link_libraries(strata_core PUBLIC Threads::Threads)
# Exactness: no fast-math, no implicit FMA contraction; kernels use explicit FMA where they mean it.
target_compile_options(strata_core PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:${STRATA_CORE_OPT};-ffp-contract=off;-fno-fast-math;-Wall;-Wextra;-Wno-unused-parameter>")
foreach(src ${CORE_SOURCES})
  if(src MATCHES "_avx512\\.cpp$")
    set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
      "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx2;-mfma;-mf16c;-mbmi2")
  elseif(src MATCHES "_avx512vbmi\\.cpp$")
    set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
      "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512vbmi;-mavx2;-mfma;-mf16c;-mbmi2")
  elseif(src MATCHES "_avx2\\.cpp$")
    set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-mbmi2")
  endif()
endforeach()
# The row ops' loops (rowops_impl.h: exp, silu, sigmoid; dn_chunked_impl.h) clamp their inputs. Under the default
# -ftrapping-math GCC if-converts those clamps only with AVX-512's masks, so the AVX2 and baseline builds ran the
# loops one float at a time (exp was a third of an AVX2 attention job). -fno-trapping-math lets it vectorize them
# everywhere; it changes no value (no reassociation, no contraction, NaN and signed zeros kept), so every ISA's
# row ops still give the same bits.
# -fno-thread-jumps: GCC's jump threading gave silu(x) = x / (1 + exp_inl(-x)) a path of its own for x < -88,
# where exp_inl's clamp makes the denominator the constant 1 + e^88; the vectorized loop then computed x / (1 + e^88)
# for every lane and blended it in where needed. For |x| < 2 that quotient is subnormal, and on Intel each such
# division took a microcode assist: silu_mul ran at 6.2 ns a value from L1 against 0.59 without the threading
# (Xeon, AVX-512). Like -fno-trapping-math it moves no operation of any value, only the code's shape.
foreach(src ${CORE_SOURCES})
  if(src MATCHES "/(rowops|dn_chunked|deltanet_chunked)[^/]*\\.cpp$")
    set_property(SOURCE ${src} APPEND PROPERTY COMPILE_OPTIONS -fno-trapping-math -fno-thread-jumps)
  endif()
endforeach()

# STRATA_PLAIN_SOURCES (a regex, default none): sources compiled at -O0 and without sanitizers. The sanitizer build
# of tests/test_sanitizers.py passes the AVX-512 kernels on a CPU that cannot run them: they must link, but no test
# there reaches them, and instrumented at -O1 they were a quarter of that build's compile time.
if(STRATA_PLAIN_SOURCES)
  foreach(src ${CORE_SOURCES})
    if(src MATCHES "${STRATA_PLAIN_SOURCES}")
      set_property(SOURCE ${src} APPEND PROPERTY COMPILE_OPTIONS -O0 -fno-sanitize=all)
    endif()
  endforeach()
endif()

include(${CMAKE_CURRENT_LIST_DIR}/strata_cuda.cmake)  # the CUDA backend: off unless asked (STRATA_CUDA)
