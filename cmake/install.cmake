# `cmake --install build [--prefix P]`: what a VMM team needs to build against exitscope
# without this source tree (docs/install.md). Components, for the Debian packages:
#   lib   libexitscope.so.X.Y.Z and its SONAME link libexitscope.so.X (X: EXITSCOPE_SOVERSION)
#   dev   include/exitscope/, libexitscope.so, libexitscope.a, exitscope.pc, the CMake package
#   tool  the exitscope binary, the docs
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(EXITSCOPE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/exitscope)

install(TARGETS exitscope_c EXPORT exitscopeTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS exitscope_static EXPORT exitscopeStaticTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(EXITSCOPE_PROMETHEUS)
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/exitscope
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.h")
else()  # no Prometheus endpoint: no exitscope/metrics.h
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/exitscope
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.h"
    PATTERN "metrics.h" EXCLUDE)
endif()

install(EXPORT exitscopeTargets NAMESPACE exitscope:: DESTINATION ${EXITSCOPE_CMAKE_DIR}
  COMPONENT dev)
install(EXPORT exitscopeStaticTargets NAMESPACE exitscope:: DESTINATION ${EXITSCOPE_CMAKE_DIR}
  COMPONENT dev)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/exitscopeConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cmake/exitscopeConfig.cmake INSTALL_DESTINATION ${EXITSCOPE_CMAKE_DIR})
# Before 1.0 every minor release may break the ABI (the SONAME says so): SameMinorVersion.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/exitscopeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/exitscopeConfig.cmake
  ${CMAKE_BINARY_DIR}/cmake/exitscopeConfigVersion.cmake
  DESTINATION ${EXITSCOPE_CMAKE_DIR} COMPONENT dev)

# exitscope.pc, relocatable: prefix is found from the .pc file's own folder (${pcfiledir}), so
# the same file works under /usr, /usr/local or a temporary prefix.
set(EXITSCOPE_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${EXITSCOPE_PC_DIR}")
  message(FATAL_ERROR "exitscope.pc: CMAKE_INSTALL_LIBDIR must be relative to the prefix")
endif()
string(REGEX REPLACE "[^/]+" ".." EXITSCOPE_PC_UP "${EXITSCOPE_PC_DIR}")
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
    set(EXITSCOPE_PC_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(EXITSCOPE_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
# What a static link adds (Libs.private).
set(EXITSCOPE_PC_PRIVATE "-lunwind -ldw -liberty -lstdc++ -lm -pthread")
if(EXITSCOPE_PROMETHEUS)
  set(EXITSCOPE_PC_PRIVATE
    "-lprometheus-cpp-pull -lprometheus-cpp-core -lcivetweb-cpp -lcivetweb ${EXITSCOPE_PC_PRIVATE}")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/exitscope.pc.in ${CMAKE_BINARY_DIR}/exitscope.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/exitscope.pc DESTINATION ${EXITSCOPE_PC_DIR} COMPONENT dev)

# The tool and the docs. The binary links the static layers (nothing of libexitscope.so).
if(EXITSCOPE_BUILD_TOOLS)
  install(TARGETS exitscope RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tool)
endif()
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT tool)
install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT tool)
