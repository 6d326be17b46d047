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
# live inside Python wheels with versioned sonames only, e.g. libcudnn.so.9). Sets
# CODAGPT_HAVE_<NAME>, <NAME>_INCLUDE_DIR and <NAME>_LIBRARY; without it, says what is lost.
macro(codagpt_find_cuda_library NAME header libnames without)
  find_path(${NAME}_INCLUDE_DIR ${header} HINTS ${${NAME}_ROOT} $ENV{${NAME}_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(${NAME}_LIBRARY NAMES ${libnames} HINTS ${${NAME}_ROOT} $ENV{${NAME}_ROOT} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  if(${NAME}_INCLUDE_DIR AND ${NAME}_LIBRARY)
    set(CODAGPT_HAVE_${NAME} ON)
    message(STATUS "codagpt: ${NAME} ${${NAME}_LIBRARY}")
  else()
    set(CODAGPT_HAVE_${NAME} OFF)
    message(STATUS "codagpt: ${NAME} not found: ${without} (pass -D${NAME}_ROOT=<dir with include/ and lib/>)")
  endif()
endmacro()

macro(codagpt_find_cudnn)
  codagpt_find_cuda_library(CUDNN cudnn.h "cudnn;libcudnn.so.9"
                            "attention uses the own flash-attention kernel (install cuDNN 9)")
endmacro()

macro(codagpt_find_nccl)
  codagpt_find_cuda_library(NCCL nccl.h "nccl;libnccl.so.2" "multi-GPU training is not built (apt-get install libnccl-dev)")
endmacro()
