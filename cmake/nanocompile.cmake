# nanocompile's CMake module: builds a generated model library and its C driver.
#
#   nanocompile_add_model(<target> SOURCES <files...> [TARGET_FLAGS <flags...>])  (-march=... and extensions)
#   nanocompile_add_driver(<target> <source> <model target>)
#
# Options: NANOCOMPILE_SANITIZE (AddressSanitizer + UndefinedBehaviorSanitizer),
#          NANOCOMPILE_TSAN (ThreadSanitizer), NANOCOMPILE_PROFILE (time each kernel call).
# CMAKE_BUILD_TYPE defaults to Release.

option(NANOCOMPILE_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(NANOCOMPILE_TSAN "Build with ThreadSanitizer" OFF)
option(NANOCOMPILE_PROFILE "Time every kernel call (exports <prefix>profile_*)" OFF)

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()

set(NANOCOMPILE_RUNTIME_DIR "${CMAKE_CURRENT_LIST_DIR}/../runtime" CACHE INTERNAL "")

function(_nanocompile_flags target target_flags)
  # Exact IEEE float32: no contraction of a*b+c into FMA, no reassociation. Bitwise agreement
  # between the reference and every later pass depends on these two flags.
  target_compile_options(${target} PRIVATE -ffp-contract=off -fno-fast-math -Wall -Wextra)
  if(target_flags)
    target_compile_options(${target} PRIVATE ${target_flags} -mtune=native)
  endif()
  if(NANOCOMPILE_PROFILE)
    target_compile_definitions(${target} PRIVATE NC_PROFILE)
  endif()
  if(NANOCOMPILE_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-sanitize-recover=all
                                             -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(NANOCOMPILE_TSAN)
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  endif()
endfunction()

function(nanocompile_add_model target)
  cmake_parse_arguments(NC "" "" "SOURCES;TARGET_FLAGS" ${ARGN})
  add_library(${target} SHARED ${NC_SOURCES})
  target_include_directories(${target} PUBLIC "${CMAKE_CURRENT_SOURCE_DIR}" "${NANOCOMPILE_RUNTIME_DIR}")
  set_target_properties(${target} PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON C_VISIBILITY_PRESET hidden)
  _nanocompile_flags(${target} "${NC_TARGET_FLAGS}")
  find_package(Threads REQUIRED)
  target_link_libraries(${target} PRIVATE m Threads::Threads)
endfunction()

function(nanocompile_add_driver target source model)
  add_executable(${target} ${source})
  set_target_properties(${target} PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON)
  _nanocompile_flags(${target} "")
  target_link_libraries(${target} PRIVATE ${model})
endfunction()
