# The Debian package: `cpack -G DEB` (or `ninja package`) in the build directory
# writes erun_<version>_<arch>.deb with everything `cmake --install` installs,
# under /usr: the erun binary, liberun.so.<major> and its links, liberun.a, the
# headers, the CMake package, erun.pc and the examples. Depends comes from
# dpkg-shlibdeps (package dpkg-dev), so it names the runtime packages of what
# the build linked (libspdlog, libfmt, libgloo, libssl, Open MPI, Boost).
# NCCL and the CUDA runtime, when the build found them, are not Debian packages
# here: the binaries keep their rpath to the toolkit (e.g. /usr/local/cuda) and
# the package does not name them; docs/build_your_program.md says so.
set(CPACK_PACKAGE_NAME erun)
set(CPACK_PACKAGE_VENDOR "erun")
set(CPACK_PACKAGE_CONTACT "erun maintainers <erun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "elastic launcher and worker library for data-parallel training")
set(CPACK_PACKAGE_DESCRIPTION "erun starts a training job on a changing set of machines (host
discovery script, SSH, Slurm) and keeps it alive while they come and go. Programs
built against liberun keep their state in erun::State and recover in place;
torchrun-style programs run in restart mode.")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
# Debug information stays in the build tree; the package carries stripped binaries.
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# liberun.so's own package provides it (a shlibs file for dpkg-shlibdeps of
# programs packaged against it) and runs ldconfig.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
# The SSH launcher runs ssh; a node that only runs workers does not need it.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "openssh-client")
if(ERUN_HAVE_NCCL)
  get_filename_component(_nccl_dir ${NCCL_LIBRARY} DIRECTORY)
  get_filename_component(_cudart_dir ${CUDART_LIBRARY} DIRECTORY)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${_nccl_dir} ${_cudart_dir})
endif()
include(CPack)
