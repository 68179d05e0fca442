# Installs the built project into BUILD_DIR/consumer-test/prefix, then configures, builds and runs
# SOURCE_DIR/examples/consumer against that installation with find_package(muon), which must compile
# it as C++CXX_STANDARD (17 or 20: the standard of the LibTorch the project was built against) or
# later without the consumer asking for any.
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
execute_process(COMMAND ${work}/build/consumer OUTPUT_VARIABLE output RESULT_VARIABLE rc)
message("${output}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed (${rc})")
endif()
string(REGEX MATCH "built as C\\+\\+ ([0-9]+)" found "${output}")
if(NOT found)
  message(FATAL_ERROR "the consumer did not print its C++ standard")
endif()
set(least 201703)
if(CXX_STANDARD EQUAL 20)
  set(least 202002)
endif()
if(CMAKE_MATCH_1 LESS least)
  message(FATAL_ERROR "the installed package compiled the consumer as __cplusplus "
                      "${CMAKE_MATCH_1}; its LibTorch needs C++${CXX_STANDARD} (${least})")
endif()

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
