# CUDA runtime and NCCL for dlo's own device code paths.
#
# A process must load exactly one CUDA runtime and one NCCL: the ones the pinned torch wheel ships
# (its nvidia-* packages). We therefore link those very files, put their directories first on the
# runtime search path, compile against NCCL's header from the same wheel, and check that the CUDA
# toolkit headers we compile with (the machine's toolkit) have the same major.minor as the wheel's
# runtime. A mismatch is a configure error, not a runtime surprise.
#
# Result: DLO_HAVE_CUDA (bool) and, when true, the INTERFACE target dlo_cuda.

set(DLO_HAVE_CUDA OFF)
if(DLO_CUDA STREQUAL "OFF")
  return()
endif()

set(_torch_has_cuda OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(_torch_has_cuda ON)
endif()
if(NOT _torch_has_cuda)
  if(DLO_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DLO_CUDA=ON but this libtorch has no CUDA")
  endif()
  return()
endif()

# The wheel's nvidia packages sit beside torch in site-packages.
get_filename_component(_site "${Torch_DIR}/../../../.." ABSOLUTE)   # .../site-packages
set(_cu_dir "${_site}/nvidia/cu13")
set(_nccl_dir "${_site}/nvidia/nccl")
find_library(DLO_CUDART_LIBRARY NAMES libcudart.so.13 cudart PATHS "${_cu_dir}/lib" NO_DEFAULT_PATH)
find_library(DLO_NCCL_LIBRARY NAMES libnccl.so.2 nccl PATHS "${_nccl_dir}/lib" NO_DEFAULT_PATH)
find_path(DLO_NCCL_INCLUDE_DIR nccl.h PATHS "${_nccl_dir}/include" NO_DEFAULT_PATH)
if(NOT DLO_CUDART_LIBRARY OR NOT DLO_NCCL_LIBRARY OR NOT DLO_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR "libtorch has CUDA, but the wheel's CUDA runtime or NCCL was not found under "
                      "${_site}/nvidia (cudart: ${DLO_CUDART_LIBRARY}, nccl: ${DLO_NCCL_LIBRARY}). "
                      "Re-run tools/setup.sh.")
endif()

# Versions: wheel runtime (from its dist-info) vs the toolkit headers torch's config found.
file(GLOB _rt_info "${_site}/nvidia_cuda_runtime-*.dist-info")
string(REGEX MATCH "nvidia_cuda_runtime-([0-9]+)\\.([0-9]+)" _m "${_rt_info}")
set(_wheel_cuda "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
if(NOT CUDAToolkit_VERSION)
  find_package(CUDAToolkit REQUIRED)
endif()
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _tk "${CUDAToolkit_VERSION}")
if(NOT _wheel_cuda STREQUAL _tk)
  message(FATAL_ERROR "CUDA mismatch: the torch wheel ships CUDA runtime ${_wheel_cuda}, but the "
                      "toolkit headers are ${CUDAToolkit_VERSION} (${CUDAToolkit_INCLUDE_DIRS}). "
                      "Pin a torch whose CUDA matches the toolkit.")
endif()
file(STRINGS "${DLO_NCCL_INCLUDE_DIR}/nccl.h" _nccl_code REGEX "#define NCCL_VERSION_CODE")
string(REGEX MATCH "[0-9]+" DLO_NCCL_VERSION_CODE "${_nccl_code}")
if(EXISTS "${CUDAToolkit_INCLUDE_DIRS}/nccl.h")
  file(STRINGS "${CUDAToolkit_INCLUDE_DIRS}/nccl.h" _sys_code REGEX "#define NCCL_VERSION_CODE")
  string(REGEX MATCH "[0-9]+" _sys_code "${_sys_code}")
  if(NOT _sys_code STREQUAL DLO_NCCL_VERSION_CODE)
    message(WARNING "The machine's nccl.h (${_sys_code}) differs from the torch wheel's "
                    "(${DLO_NCCL_VERSION_CODE}); dlo uses the wheel's.")
  endif()
endif()

add_library(dlo_cuda INTERFACE)
# The toolkit's include dir for cuda_runtime_api.h; the wheel's nccl.h comes first.
target_include_directories(dlo_cuda SYSTEM INTERFACE "${DLO_NCCL_INCLUDE_DIR}" ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(dlo_cuda INTERFACE "${DLO_CUDART_LIBRARY}" "${DLO_NCCL_LIBRARY}")
target_compile_definitions(dlo_cuda INTERFACE DLO_HAVE_CUDA=1)
# Wheel directories first on the runtime path, so the one libcudart.so.13 / libnccl.so.2 loaded
# by the process is the one libtorch_cuda also uses.
set(DLO_CUDA_RUNTIME_DIRS "${_cu_dir}/lib;${_nccl_dir}/lib" CACHE INTERNAL "")
set(DLO_HAVE_CUDA ON)
message(STATUS "dlo: CUDA runtime ${_wheel_cuda} (wheel) = toolkit ${CUDAToolkit_VERSION}; NCCL ${DLO_NCCL_VERSION_CODE} (wheel)")
