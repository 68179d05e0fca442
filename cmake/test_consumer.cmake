# Installs the built project into BUILD_DIR/consumer-test/prefix, then configures, builds and runs
# SOURCE_DIR/examples/consumer against that installation with find_package(muon).
set(work ${BUILD_DIR}/consumer-test)
set(prefix ${work}/prefix)
file(REMOVE_RECURSE ${prefix})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/consumer -B ${work}/build -G Ninja
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${work}/build)
run(${work}/build/consumer)

# The installed Python package imports and steps (when the build made one).
if(PYTHON)
  file(GLOB_RECURSE core ${prefix}/*/_core*.so)
  list(LENGTH core found)
  if(NOT found EQUAL 1)
    message(FATAL_ERROR "expected one installed muon_cpp/_core module under ${prefix}, found: ${core}")
  endif()
  get_filename_component(package_dir ${core} DIRECTORY)
  get_filename_component(site_dir ${package_dir} DIRECTORY)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${site_dir} ${PYTHON} -c
    "import torch, muon_cpp; w = torch.nn.Parameter(torch.ones(3, 2)); o = muon_cpp.Muon([w]); w.grad = torch.ones(3, 2); o.step(); assert muon_cpp.__file__.startswith('${site_dir}'); print('installed muon_cpp works:', muon_cpp.__file__)"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the installed muon_cpp package does not import and step (${rc})")
  endif()
endif()
