# `make deb` (cpack -G DEB in the build folder): three Debian packages from the install
# components of cmake/install.cmake (docs/install.md, "Debian packages"):
#   libexitscope0   lib   /usr/lib/libexitscope.so.0*            (package name carries the SONAME)
#   libexitscope-dev dev  headers, libexitscope.so/.a, exitscope.pc, the CMake package
#   exitscope       tool  /usr/bin/exitscope and the docs
# Run-time dependencies come from dpkg-shlibdeps.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME exitscope)
set(CPACK_PACKAGE_VENDOR exitscope)
set(CPACK_PACKAGE_CONTACT "exitscope maintainers <exitscope@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Flight recorder and analyser for VM exits")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL lib dev tool)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_LIB_PACKAGE_NAME libexitscope${EXITSCOPE_SOVERSION})
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
# A shlibs file for packages built against it, and the ldconfig trigger.
set(CPACK_DEBIAN_LIB_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libexitscope-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libexitscope${EXITSCOPE_SOVERSION} (= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_DEV_PACKAGE_SUGGESTS "prometheus-cpp-dev, libunwind-dev, libdw-dev, libiberty-dev, pkg-config")
set(CPACK_DEBIAN_TOOL_PACKAGE_NAME exitscope)
set(CPACK_DEBIAN_TOOL_PACKAGE_SECTION utils)
set(CPACK_COMPONENT_LIB_DESCRIPTION "exitscope flight recorder library for VMMs (libexitscope.so)")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "exitscope development files: headers, static library, pkg-config and CMake package")
set(CPACK_COMPONENT_TOOL_DESCRIPTION "exitscope: VM-exit analyser, reference VMM and dump reader")
include(CPack)
