# The Python extension module medfast._medfast and its package (python/medfast),
# linked against the libtorch this build uses; the `torch` Python package it is
# imported with must be that same libtorch (Debian 12: python3-torch 1.13; the
# trixie root of scripts/compat.sh: 2.6; pip: the torch whose cmake_prefix_path
# was given). Skipped, with the reason, where no Python here can import torch.

set(MEDFAST_PYTHON_EXECUTABLE "" CACHE FILEPATH "python3 that imports torch (empty: /usr/bin/python3, then python3 on PATH)")
set(_candidates ${MEDFAST_PYTHON_EXECUTABLE} /usr/bin/python3)
find_program(_path_python3 python3)
if(_path_python3)
  list(APPEND _candidates ${_path_python3})
endif()
list(REMOVE_DUPLICATES _candidates)
set(MEDFAST_PYTHON_FOR_MODULE "")
foreach(py IN LISTS _candidates)
  if(NOT EXISTS "${py}")
    continue()
  endif()
  execute_process(
    COMMAND ${py} -c "import sysconfig, torch; print(torch.__version__.split('+')[0]); print(sysconfig.get_paths()['include']); print(sysconfig.get_config_var('EXT_SUFFIX'))"
    OUTPUT_VARIABLE _out ERROR_QUIET RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_rc EQUAL 0)
    string(REPLACE "\n" ";" _lines "${_out}")
    list(GET _lines 0 _torch_version)
    list(GET _lines 1 _python_include)
    list(GET _lines 2 _ext_suffix)
    set(MEDFAST_PYTHON_FOR_MODULE ${py})
    break()
  endif()
endforeach()

if(NOT MEDFAST_PYTHON_FOR_MODULE)
  message(STATUS "medfast: Python module not built: no python3 here can import torch "
                 "(tried: ${_candidates}; scripts/setup.sh --python installs python3-torch and the module, or set MEDFAST_PYTHON_EXECUTABLE)")
  return()
endif()
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _torch_mm "${_torch_version}")
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _libtorch_mm "${Torch_VERSION}")
if(NOT _torch_mm STREQUAL _libtorch_mm)
  message(STATUS "medfast: Python module not built: ${MEDFAST_PYTHON_FOR_MODULE} imports torch ${_torch_version}, "
                 "but this build uses libtorch ${Torch_VERSION} (build against that torch: "
                 "-DCMAKE_PREFIX_PATH=\$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)'))")
  return()
endif()
# pybind11 is header-only: its headers, not its CMake package (which looks for a Python
# of its own, and may find another one than the interpreter chosen above).
# A pip torch carries the pybind11 it was built with (torch/include/pybind11).
find_path(PYBIND11_INCLUDE_DIR pybind11/pybind11.h
          HINTS "${TORCH_INSTALL_PREFIX}/include" ${_python_include}/.. /usr/include "${TORCH_INSTALL_PREFIX}/../pybind11/include")
if(NOT PYBIND11_INCLUDE_DIR)
  message(STATUS "medfast: Python module not built: pybind11 headers not found (Debian: pybind11-dev)")
  return()
endif()
find_library(TORCH_PYTHON_LIBRARY torch_python HINTS "${TORCH_INSTALL_PREFIX}/lib" /usr/lib/x86_64-linux-gnu)
if(NOT TORCH_PYTHON_LIBRARY OR NOT EXISTS "${_python_include}/Python.h")
  message(STATUS "medfast: Python module not built: libtorch_python (${TORCH_PYTHON_LIBRARY}) or Python.h "
                 "(${_python_include}; Debian: python3-dev) missing")
  return()
endif()

message(STATUS "medfast: Python module for ${MEDFAST_PYTHON_FOR_MODULE} (torch ${_torch_version})")
set(MEDFAST_PYTHON_PACKAGE_DIR ${CMAKE_BINARY_DIR}/python/medfast)
add_library(medfast_python MODULE python/medfast_python.cpp)
set_target_properties(medfast_python PROPERTIES
  OUTPUT_NAME _medfast PREFIX "" SUFFIX "${_ext_suffix}"
  LIBRARY_OUTPUT_DIRECTORY ${MEDFAST_PYTHON_PACKAGE_DIR}
  CXX_VISIBILITY_PRESET hidden)
target_include_directories(medfast_python PRIVATE ${_python_include} ${PYBIND11_INCLUDE_DIR})
target_link_libraries(medfast_python PRIVATE medfast_train ${TORCH_PYTHON_LIBRARY})
target_compile_options(medfast_python PRIVATE -Wall -Wextra)

# The module must run on the C++ runtime the interpreter has loaded with torch, never on a
# copy of its own. A toolchain that links libstdc++ statically into shared objects (the GPU
# image's GCC 13 in /opt/gcc did; -static-libstdc++ in LDFLAGS does the same) gives the module
# a second libstdc++ whose symbols partly bind to the loaded one: `import medfast` then died
# in its first ostream insertion (a codecvt facet of the other copy; seen on an H100 with
# torch 2.11). A probe shared object, linked as the module is, tells; where it carries no
# libstdc++.so.6 of its own, the interpreter's (from /proc/self/maps after `import torch`)
# is linked ahead of the toolchain's static archive, which then supplies nothing.
set(_probe_dir ${CMAKE_BINARY_DIR}/CMakeFiles/medfast_libstdcxx_probe)
file(WRITE ${_probe_dir}/probe.cpp "#include <sstream>\nstd::string medfast_probe(long v) { std::ostringstream s; s << v; return s.str(); }\n")
separate_arguments(_probe_flags UNIX_COMMAND "${CMAKE_CXX_FLAGS} ${CMAKE_MODULE_LINKER_FLAGS}")
execute_process(COMMAND ${CMAKE_CXX_COMPILER} ${_probe_flags} -shared -fPIC -o ${_probe_dir}/probe.so ${_probe_dir}/probe.cpp
                RESULT_VARIABLE _probe_rc OUTPUT_QUIET ERROR_VARIABLE _probe_err)
set(_probe_needed "")
if(_probe_rc EQUAL 0)
  find_program(MEDFAST_READELF NAMES readelf ${CMAKE_READELF})
  if(MEDFAST_READELF)
    execute_process(COMMAND ${MEDFAST_READELF} -d ${_probe_dir}/probe.so OUTPUT_VARIABLE _probe_needed ERROR_QUIET)
  endif()
endif()
if(NOT _probe_rc EQUAL 0 OR NOT MEDFAST_READELF)
  message(STATUS "medfast: could not check how the toolchain links libstdc++ into the module "
                 "(probe exit ${_probe_rc}${_probe_err}; readelf: ${MEDFAST_READELF}); linking as it does")
elseif(NOT _probe_needed MATCHES "libstdc\\+\\+\\.so")
  execute_process(
    COMMAND ${MEDFAST_PYTHON_FOR_MODULE} -c "import torch\nfor l in open('/proc/self/maps'):\n    if '/libstdc++.so' in l:\n        print(l.split()[-1]); break"
    OUTPUT_VARIABLE _interpreter_libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_interpreter_libstdcxx AND EXISTS "${_interpreter_libstdcxx}")
    message(STATUS "medfast: this toolchain links libstdc++ statically into shared objects; the Python module "
                   "links ${_interpreter_libstdcxx}, the one ${MEDFAST_PYTHON_FOR_MODULE} runs torch on")
    # On the link line after the module's object (which needs it: --as-needed keeps it) and
    # before the toolchain's own static -lstdc++ at the end, which then finds nothing undefined.
    target_link_libraries(medfast_python PRIVATE "${_interpreter_libstdcxx}")
  else()
    message(WARNING "medfast: this toolchain links libstdc++ statically into shared objects and "
                    "${MEDFAST_PYTHON_FOR_MODULE} showed no libstdc++ it runs on: the module may crash on import "
                    "(link it with the interpreter's libstdc++.so.6)")
  endif()
endif()

# The package's Python files next to the module, so that PYTHONPATH=build/python works.
file(GLOB _package_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/medfast/*.py
     ${PROJECT_SOURCE_DIR}/python/medfast/*.pyi ${PROJECT_SOURCE_DIR}/python/medfast/py.typed)
foreach(f IN LISTS _package_files)
  get_filename_component(name ${f} NAME)
  configure_file(${f} ${MEDFAST_PYTHON_PACKAGE_DIR}/${name} COPYONLY)
endforeach()
set(MEDFAST_PYTHON_BUILT ON)
