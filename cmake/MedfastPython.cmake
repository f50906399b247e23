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

# The package's Python files next to the module, so that PYTHONPATH=build/python works.
file(GLOB _package_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/medfast/*.py
     ${PROJECT_SOURCE_DIR}/python/medfast/*.pyi ${PROJECT_SOURCE_DIR}/python/medfast/py.typed)
foreach(f IN LISTS _package_files)
  get_filename_component(name ${f} NAME)
  configure_file(${f} ${MEDFAST_PYTHON_PACKAGE_DIR}/${name} COPYONLY)
endforeach()
set(MEDFAST_PYTHON_BUILT ON)
