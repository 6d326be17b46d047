# Finding codagpt's dependencies, each with one message saying how to install it when missing.
# Debian package names are those scripts/setup.sh installs.

set(_codagpt_setup_hint "run scripts/setup.sh (as root it installs the Debian packages)")

# A header-only dependency: its CMake package, else its header under CODAGPT_DEPS_DIR/include.
function(codagpt_header_dep pkg target header debian)
  find_package(${pkg} CONFIG QUIET)
  if(TARGET ${target})
    return()
  endif()
  find_path(_dir ${header} HINTS ${CODAGPT_DEPS_DIR}/include NO_CACHE)
  if(NOT _dir)
    message(FATAL_ERROR "codagpt: ${pkg} not found: apt-get install ${debian} (or ${_codagpt_setup_hint}; "
                        "without a package manager copy its headers to CODAGPT_DEPS_DIR/include)")
  endif()
  add_library(${target} INTERFACE IMPORTED GLOBAL)
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${_dir})
  message(STATUS "codagpt: ${pkg} headers from ${_dir}")
endfunction()

codagpt_header_dep(nlohmann_json nlohmann_json::nlohmann_json nlohmann/json.hpp nlohmann-json3-dev)
codagpt_header_dep(CLI11 CLI11::CLI11 CLI/CLI.hpp libcli11-dev)

find_package(OpenMP REQUIRED COMPONENTS CXX)

find_package(ICU COMPONENTS uc QUIET)
if(ICU_FOUND)
  set(CODAGPT_HAVE_ICU ON)
else()
  set(CODAGPT_HAVE_ICU OFF)
  message(STATUS "codagpt: ICU not found: the tokenizer and `codagpt prepare` are not built "
                 "(apt-get install libicu-dev, or ${_codagpt_setup_hint})")
endif()

# GoogleTest: the installed package, else its sources (Debian's /usr/src/googletest, or a copy).
macro(codagpt_find_gtest)
  find_package(GTest QUIET)
  if(NOT TARGET GTest::gtest_main)
    find_path(_gtest_src CMakeLists.txt
              HINTS ${CODAGPT_DEPS_DIR}/googletest /usr/src/googletest NO_CACHE NO_DEFAULT_PATH)
    if(NOT _gtest_src)
      message(FATAL_ERROR "codagpt: GoogleTest not found: apt-get install libgtest-dev "
                          "(or ${_codagpt_setup_hint}), or configure with -DCODAGPT_BUILD_TESTS=OFF")
    endif()
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    add_subdirectory(${_gtest_src} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
endmacro()

# cuDNN and NCCL: system paths, or a hint (CUDNN_ROOT / NCCL_ROOT, as on the GPU machine where they
# live inside Python wheels with versioned sonames only, e.g. libcudnn.so.9).
function(_codagpt_find_versioned_lib var root_var names)
  find_library(${var} NAMES ${names}
               HINTS ${${root_var}} $ENV{${root_var}} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
endfunction()

macro(codagpt_find_cudnn)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  _codagpt_find_versioned_lib(CUDNN_LIBRARY CUDNN_ROOT "cudnn;libcudnn.so.9")
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
    set(CODAGPT_HAVE_CUDNN ON)
    message(STATUS "codagpt: cuDNN ${CUDNN_LIBRARY}")
  else()
    set(CODAGPT_HAVE_CUDNN OFF)
    message(STATUS "codagpt: cuDNN not found: attention falls back to the own flash-attention kernel "
                   "(install cuDNN 9, or pass -DCUDNN_ROOT=<dir with include/ and lib/>)")
  endif()
endmacro()

macro(codagpt_find_nccl)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  _codagpt_find_versioned_lib(NCCL_LIBRARY NCCL_ROOT "nccl;libnccl.so.2")
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(CODAGPT_HAVE_NCCL ON)
    message(STATUS "codagpt: NCCL ${NCCL_LIBRARY}")
  else()
    set(CODAGPT_HAVE_NCCL OFF)
    message(STATUS "codagpt: NCCL not found: multi-GPU training is not built "
                   "(apt-get install libnccl-dev, or pass -DNCCL_ROOT=<dir with include/ and lib/>)")
  endif()
endmacro()
