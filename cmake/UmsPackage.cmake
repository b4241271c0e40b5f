# What C users get from `cmake --install`, besides the libraries and the
# headers (runtime/ and lua-binding/ install those): ums.pc for pkg-config
# and the CMake package for find_package(ums CONFIG). Included from the top
# CMakeLists.txt after the targets exist; not in the rock's build.

include(CMakePackageConfigHelpers)
find_package(PkgConfig REQUIRED)

# pkg-config ums: the host API (libums-lua) and the runtime (libums).
set(UMS_PC_REQUIRES_PRIVATE "libffi")
pkg_check_modules(UMS_PC_URING QUIET liburing)
if(UMS_PC_URING_FOUND)
  string(APPEND UMS_PC_REQUIRES_PRIVATE " liburing")
endif()
# The prefix written into ums.pc is the one the files are installed to,
# known only at install time (cmake --install --prefix may change it), so
# ums.pc is made then: pkg-config prints plain paths such as
# -I/usr/local/include, as for every other package. DESTDIR is not part of
# it, which is what a package built with DESTDIR needs.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(ums_pc_libdir "${CMAKE_INSTALL_LIBDIR}")
else()
  set(ums_pc_libdir "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ums_pc_includedir "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(ums_pc_includedir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
install(CODE "
  set(UMS_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(UMS_PC_LIBDIR [[${ums_pc_libdir}]])
  set(UMS_PC_INCLUDEDIR [[${ums_pc_includedir}]])
  set(UMS_PC_REQUIRES_PRIVATE [[${UMS_PC_REQUIRES_PRIVATE}]])
  set(PROJECT_VERSION [[${PROJECT_VERSION}]])
  configure_file([[${CMAKE_SOURCE_DIR}/cmake/ums.pc.in]]
                 [[${CMAKE_BINARY_DIR}/ums.pc]] @ONLY)")
install(FILES ${CMAKE_BINARY_DIR}/ums.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# find_package(ums CONFIG): ums::ums (libums, ums.h) and ums::ums-lua
# (libums-lua, ums-lua.h). Versions 0.x break compatibility between minor
# versions, so a request for 0.1 accepts 0.1.z only.
set(ums_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/ums)
install(EXPORT ums-targets NAMESPACE ums:: DESTINATION ${ums_cmake_dir})
configure_file(${CMAKE_SOURCE_DIR}/cmake/ums-config.cmake.in
               ${CMAKE_BINARY_DIR}/ums-config.cmake @ONLY)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ums-config-version.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ums-config.cmake
              ${CMAKE_BINARY_DIR}/ums-config-version.cmake
        DESTINATION ${ums_cmake_dir})
