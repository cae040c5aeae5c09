# The library behind keel::kernels::gemm, exposed as the interface target keel_gemm_backend.
# Chosen by measurement (docs/blas.md): oneDNN's dnnl_sgemm. OpenBLAS's OpenMP build is the
# alternative (-DKEEL_GEMM_BACKEND=openblas). Both use libgomp, the runtime of our own
# `omp parallel` loops, so BLAS and kernel threads share one pool instead of oversubscribing.
set(KEEL_GEMM_BACKEND "dnnl" CACHE STRING "Library behind kernels::gemm: dnnl or openblas")
set_property(CACHE KEEL_GEMM_BACKEND PROPERTY STRINGS dnnl openblas)
add_library(keel_gemm_backend INTERFACE)

if(KEEL_GEMM_BACKEND STREQUAL "dnnl")
  # Not find_package(dnnl): Debian's dnnl-config.cmake insists on OpenCL development files.
  find_path(KEEL_DNNL_INCLUDE_DIR dnnl.h)
  find_library(KEEL_DNNL_LIBRARY dnnl)
  if(NOT KEEL_DNNL_INCLUDE_DIR OR NOT KEEL_DNNL_LIBRARY)
    message(FATAL_ERROR "oneDNN not found: run scripts/install-deps.sh (libdnnl-dev), "
                        "or configure with -DKEEL_GEMM_BACKEND=openblas")
  endif()
  target_include_directories(keel_gemm_backend INTERFACE ${KEEL_DNNL_INCLUDE_DIR})
  target_link_libraries(keel_gemm_backend INTERFACE ${KEEL_DNNL_LIBRARY})
  target_compile_definitions(keel_gemm_backend INTERFACE KEEL_GEMM_DNNL=1)
  # OpenBLAS's OpenMP build beside it, for the products oneDNN runs slower than OpenBLAS where the
  # CPU has no AVX-512 (weight gradients on AVX2: docs/blas.md, "OpenBLAS beside oneDNN on
  # AVX2"). Optional: without it those products stay with keel's packed kernel.
  find_library(KEEL_OPENBLAS_OPENMP_LIBRARY NAMES openblas libopenblas.so.0
               PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
  find_path(KEEL_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-openmp openblas-pthread)
  if(KEEL_OPENBLAS_OPENMP_LIBRARY AND KEEL_CBLAS_INCLUDE_DIR)
    target_include_directories(keel_gemm_backend INTERFACE ${KEEL_CBLAS_INCLUDE_DIR})
    target_link_libraries(keel_gemm_backend INTERFACE ${KEEL_OPENBLAS_OPENMP_LIBRARY})
    target_compile_definitions(keel_gemm_backend INTERFACE KEEL_GEMM_OPENBLAS_BESIDE=1)
    message(STATUS "keel gemm: OpenBLAS (OpenMP build) beside oneDNN: ${KEEL_OPENBLAS_OPENMP_LIBRARY}")
  else()
    target_compile_definitions(keel_gemm_backend INTERFACE KEEL_GEMM_OPENBLAS_BESIDE=0)
    message(STATUS "keel gemm: no OpenBLAS OpenMP build (libopenblas0-openmp, libopenblas-dev); AVX2 weight "
                   "gradients stay with keel's packed kernel")
  endif()
elseif(KEEL_GEMM_BACKEND STREQUAL "openblas")
  # Debian installs the OpenMP build beside the pthread one under the same SONAME; link it by
  # path so the runtime alternative (usually pthread) cannot be picked instead. CMake puts the
  # directory in the build RPATH of executables.
  find_library(KEEL_OPENBLAS_LIBRARY NAMES openblas libopenblas.so.0
               PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
  if(NOT KEEL_OPENBLAS_LIBRARY)
    message(WARNING "OpenBLAS OpenMP build not found (libopenblas0-openmp); using the default libopenblas")
    find_library(KEEL_OPENBLAS_LIBRARY NAMES openblas REQUIRED)
  endif()
  find_path(KEEL_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-openmp openblas-pthread REQUIRED)
  target_include_directories(keel_gemm_backend INTERFACE ${KEEL_CBLAS_INCLUDE_DIR})
  target_link_libraries(keel_gemm_backend INTERFACE ${KEEL_OPENBLAS_LIBRARY})
  target_compile_definitions(keel_gemm_backend INTERFACE KEEL_GEMM_DNNL=0 KEEL_GEMM_OPENBLAS_BESIDE=0)
else()
  message(FATAL_ERROR "KEEL_GEMM_BACKEND must be dnnl or openblas, got '${KEEL_GEMM_BACKEND}'")
endif()
message(STATUS "keel gemm backend: ${KEEL_GEMM_BACKEND}")
