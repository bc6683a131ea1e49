# Libraries from Debian's archive, or the same headers carried in
# PERFTRAIN_CARRY_DIR on machines without apt.
set(_hints "${PERFTRAIN_CARRY_DIR}/include" /usr/include)

find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp HINTS ${_hints} REQUIRED)
find_path(JSON_INCLUDE_DIR nlohmann/json.hpp HINTS ${_hints} REQUIRED)
find_path(TOMLPP_INCLUDE_DIR toml++/toml.h HINTS ${_hints} REQUIRED)
find_path(STB_INCLUDE_DIR stb_image_write.h HINTS ${_hints} PATH_SUFFIXES stb REQUIRED)

add_library(perftrain_thirdparty INTERFACE)
target_include_directories(perftrain_thirdparty SYSTEM INTERFACE
  ${CLI11_INCLUDE_DIR} ${JSON_INCLUDE_DIR} ${TOMLPP_INCLUDE_DIR} ${STB_INCLUDE_DIR})

# zlib: Debian's zlib1g-dev; elsewhere carried headers + the system libz.so.1.
find_package(ZLIB QUIET)
if(NOT ZLIB_FOUND)
  find_path(ZLIB_INCLUDE_DIR zlib.h HINTS ${_hints} REQUIRED)
  find_library(ZLIB_LIBRARY NAMES z libz.so.1 REQUIRED)
  add_library(ZLIB::ZLIB UNKNOWN IMPORTED)
  set_target_properties(ZLIB::ZLIB PROPERTIES IMPORTED_LOCATION "${ZLIB_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ZLIB_INCLUDE_DIR}")
endif()

# GoogleTest: the system's, else built from carried sources.
find_package(GTest QUIET)
if(NOT GTest_FOUND)
  set(_gtest_src "${PERFTRAIN_CARRY_DIR}/googletest")
  if(NOT EXISTS "${_gtest_src}/CMakeLists.txt")
    set(_gtest_src /usr/src/googletest)
  endif()
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory("${_gtest_src}" "${CMAKE_BINARY_DIR}/googletest" EXCLUDE_FROM_ALL)
  add_library(GTest::gtest ALIAS gtest)
  add_library(GTest::gtest_main ALIAS gtest_main)
endif()
include(GoogleTest)
