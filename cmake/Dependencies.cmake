# Every dependency is found as its Debian 12 package installs it (scripts/install-deps.sh).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)

set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATHS /usr/include/x86_64-linux-gnu /usr/include REQUIRED)

find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 QUIET)
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
find_package(CapnProto REQUIRED)
find_package(RocksDB REQUIRED)
find_package(Gloo REQUIRED PATHS /usr/share/cmake/Gloo)

find_package(PkgConfig REQUIRED)
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
# FindPkgConfig builds PkgConfig::ZMQ differently on the first configure and on later ones:
# libzmq's "-isystem /usr/include/mit-krb5" lands among the include directories once and
# among the compile options after, which changes every compile command, so running
# scripts/build.sh a second time rebuilt the whole tree. Both properties are set here from
# the cached pkg-config output, the same on every configure.
set(_zmq_system_includes "")
set(_zmq_options "")
set(_zmq_next_is_system FALSE)
foreach(_flag IN LISTS ZMQ_CFLAGS_OTHER)
  if(_zmq_next_is_system)
    list(APPEND _zmq_system_includes "${_flag}")
    set(_zmq_next_is_system FALSE)
  elseif(_flag STREQUAL "-isystem")
    set(_zmq_next_is_system TRUE)
  else()
    list(APPEND _zmq_options "${_flag}")
  endif()
endforeach()
set_target_properties(PkgConfig::ZMQ PROPERTIES
  INTERFACE_COMPILE_OPTIONS "${_zmq_options}"
  INTERFACE_INCLUDE_DIRECTORIES "${ZMQ_INCLUDE_DIRS};${_zmq_system_includes}"
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_zmq_system_includes}")
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
# GPT-2's pre-tokenizer pattern (Unicode letter/number classes) and the tokenizer fingerprint.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)
find_path(CPPZMQ_INCLUDE_DIR zmq.hpp REQUIRED)
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)

# Debian's CAF 0.17 ships no CMake config: headers in /usr/include/caf, libcaf_core/io.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
find_library(CAF_IO_LIBRARY caf_io REQUIRED)
add_library(caf::core INTERFACE IMPORTED)
set_target_properties(caf::core PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${CAF_CORE_LIBRARY};Threads::Threads")
add_library(caf::io INTERFACE IMPORTED)
set_target_properties(caf::io PROPERTIES INTERFACE_LINK_LIBRARIES "${CAF_IO_LIBRARY};caf::core")

# CUDA is optional: the build never requires it.
include(CheckLanguage)
check_language(CUDA)
set(DSACTOR_HAVE_CUDA OFF)
if(CMAKE_CUDA_COMPILER)
  set(DSACTOR_HAVE_CUDA ON)
endif()

# NCCL collectives (actors/collectives/nccl_collectives.cpp) need the CUDA runtime and NCCL, both host
# libraries: no nvcc involved. /usr/local/cuda is where the toolkit and NCCL live on our
# machines and in CI; CUDAToolkit_ROOT overrides. Not found (or DSACTOR_WITH_CUDA=OFF): the
# file is not compiled and make_nccl_collectives() throws "not built with NCCL".
set(DSACTOR_HAVE_NCCL OFF)
if(DSACTOR_WITH_CUDA)
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/lib64)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(DSACTOR_HAVE_NCCL ON)
      add_library(dsactor::nccl UNKNOWN IMPORTED)
      set_target_properties(dsactor::nccl PROPERTIES
        IMPORTED_LOCATION "${NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    endif()
  endif()
endif()
if(DSACTOR_HAVE_NCCL)
  message(STATUS "dsactor: NCCL collectives ON (CUDA ${CUDAToolkit_VERSION}, ${NCCL_LIBRARY})")
elseif(NOT DSACTOR_WITH_CUDA)
  message(STATUS "dsactor: NCCL collectives OFF (DSACTOR_WITH_CUDA=OFF)")
else()
  message(STATUS "dsactor: NCCL collectives OFF (no CUDA toolkit with nccl.h and libnccl found; set CUDAToolkit_ROOT)")
endif()
