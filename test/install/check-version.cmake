# cmake -DVERSION=x.y.z -DSOURCE_DIR=... -DHEADER=.../ums-version.h
#       -DLUA=lua5.4 -P check-version.cmake
# Fails unless every place that shows ums's version shows the project's
# (VERSION, from project() in CMakeLists.txt): the rockspec's name, version
# and tag, the generated ums-version.h, and `ums -v`, which prints the
# module's ums._VERSION. Run with the build tree's LUA_PATH and LUA_CPATH.

file(GLOB rockspecs "${SOURCE_DIR}/rockspecs/*.rockspec")
list(LENGTH rockspecs n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "want exactly one rockspec in rockspecs/, found ${n}: "
                      "${rockspecs}")
endif()
get_filename_component(name "${rockspecs}" NAME)
if(NOT name MATCHES "^ums-([0-9.]+)-([0-9]+)\\.rockspec$")
  message(FATAL_ERROR "rockspec name ${name} is not ums-<version>-<rev>")
endif()
set(rock_version "${CMAKE_MATCH_1}")
set(rock_rev "${CMAKE_MATCH_2}")
if(NOT rock_version STREQUAL VERSION)
  message(FATAL_ERROR "rockspec ${name} is for ${rock_version}, the project "
                      "is ${VERSION}: rename it and update version and tag")
endif()
file(READ "${rockspecs}" text)
foreach(want "version = \"${VERSION}-${rock_rev}\"" "tag = \"v${VERSION}\"")
  string(FIND "${text}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${name} lacks ${want}")
  endif()
endforeach()

file(READ "${HEADER}" text)
string(FIND "${text}" "#define UMS_VERSION_STRING \"${VERSION}\"" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${HEADER} does not define UMS_VERSION_STRING "
                      "\"${VERSION}\"")
endif()

execute_process(COMMAND ${LUA} ${SOURCE_DIR}/bin/ums -v
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc
                TIMEOUT 60)
if(NOT rc EQUAL 0 OR NOT out STREQUAL "ums ${VERSION} (Lua 5.4)\n")
  message(FATAL_ERROR "ums -v: status ${rc}, printed '${out}' '${err}', want "
                      "'ums ${VERSION} (Lua 5.4)'")
endif()
message(STATUS "version ${VERSION}: ${name}, ums-version.h and ums -v agree")
