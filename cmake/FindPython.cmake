# The Python that has torch: the project's .venv if there is one, else python3.
# Used to locate libtorch and, in tests, to run the PyTorch reference model.
if(NOT PERFTRAIN_PYTHON)
  if(DEFINED SKBUILD AND Python_EXECUTABLE)
    # pip install (scikit-build-core): the Python that installs the package.
    set(_py "${Python_EXECUTABLE}")
  elseif(EXISTS "${CMAKE_SOURCE_DIR}/.venv/bin/python")
    set(_py "${CMAKE_SOURCE_DIR}/.venv/bin/python")
  else()
    find_program(_py NAMES python3 python REQUIRED)
  endif()
  set(PERFTRAIN_PYTHON "${_py}" CACHE FILEPATH "Python interpreter with torch")
endif()
message(STATUS "perftrain: python ${PERFTRAIN_PYTHON}")
