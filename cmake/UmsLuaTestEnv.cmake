# The environment under which ctest runs lua5.4 against this build tree
# (Busted specs, the Lua benchmark's smoke run): the stdlib and the built
# module first on the paths, and in sanitizer builds the sanitizer runtime
# preloaded into the uninstrumented interpreter.
#
# Sets:
#   UMS_LUA_ENV       list of NAME=value entries for a test's ENVIRONMENT
#                     (everything but a TSan preload)
#   UMS_TSAN_PRELOAD  "LD_PRELOAD=<libtsan>" in TSan builds, else empty:
#                     kept apart because /bin/sh cannot start with it, so a
#                     test that starts children gives it to them instead
#
# ums_lua_test_env(<out> [CPATH <dir>...] [CHILD_PRELOAD])
#   <out>: UMS_LUA_ENV plus extra LUA_CPATH directories, and the TSan
#   preload either for the interpreter itself or, with CHILD_PRELOAD, as
#   UMS_CHILD_LD_PRELOAD for the children it starts (spec/subprocess.lua).

# Semicolons inside a value must be escaped from CMake's list syntax.
set(UMS_LUA_PATH "${CMAKE_SOURCE_DIR}/stdlib/?.lua\\;${CMAKE_SOURCE_DIR}/stdlib/?/init.lua\\;${CMAKE_SOURCE_DIR}/spec/?.lua\\;\\;")
set(UMS_LUA_ENV
  "LUA_PATH=${UMS_LUA_PATH}"
  "UMS_BIN=${CMAKE_SOURCE_DIR}/bin/ums"
  "UMS_EXAMPLES=${CMAKE_SOURCE_DIR}/examples")
set(UMS_TSAN_PRELOAD "")
if(UMS_SANITIZE STREQUAL "address")
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
                  OUTPUT_VARIABLE ASAN_LIB OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libubsan.so
                  OUTPUT_VARIABLE UBSAN_LIB OUTPUT_STRIP_TRAILING_WHITESPACE)
  # The interpreter and busted's own libraries are not ours: leaks are
  # checked by the C tests, which own everything they allocate.
  list(APPEND UMS_LUA_ENV "LD_PRELOAD=${ASAN_LIB} ${UBSAN_LIB}"
       "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
elseif(UMS_SANITIZE STREQUAL "thread")
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libtsan.so
                  OUTPUT_VARIABLE TSAN_LIB OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(UMS_TSAN_PRELOAD "LD_PRELOAD=${TSAN_LIB}")
  list(APPEND UMS_LUA_ENV "TSAN_OPTIONS=halt_on_error=1" "UMS_TSAN=1")
endif()

function(ums_lua_test_env out)
  cmake_parse_arguments(ARG "CHILD_PRELOAD" "" "CPATH" ${ARGN})
  set(cpath "${CMAKE_BINARY_DIR}/lua-binding/?.so")
  foreach(dir ${ARG_CPATH})
    string(APPEND cpath "\\;${dir}/?.so")
  endforeach()
  set(env "${UMS_LUA_ENV}")
  list(APPEND env "LUA_CPATH=${cpath}\\;\\;")
  if(UMS_TSAN_PRELOAD)
    if(ARG_CHILD_PRELOAD)
      list(APPEND env "UMS_CHILD_${UMS_TSAN_PRELOAD}")
    else()
      list(APPEND env "${UMS_TSAN_PRELOAD}")
    endif()
  endif()
  set(${out} "${env}" PARENT_SCOPE)
endfunction()
