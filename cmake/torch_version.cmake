# muon_torch_version(OUT): the version of the LibTorch find_package(Torch) found, as MAJOR.MINOR.PATCH.
# TorchConfigVersion.cmake gives it as Torch_VERSION; a LibTorch without that file still has
# torch/version.h among its headers.
function(muon_torch_version out)
  if(Torch_VERSION)
    set(${out} ${Torch_VERSION} PARENT_SCOPE)
    return()
  endif()
  find_file(version_header torch/version.h PATHS ${TORCH_INCLUDE_DIRS}
            PATH_SUFFIXES torch/csrc/api/include NO_DEFAULT_PATH)
  if(NOT version_header)
    message(FATAL_ERROR "muon: cannot tell the LibTorch version (no Torch_VERSION, no "
                        "torch/version.h under ${TORCH_INCLUDE_DIRS})")
  endif()
  file(STRINGS ${version_header} lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "TORCH_VERSION_${part} ([0-9]+)" match "${lines}")
    set(${part} ${CMAKE_MATCH_1})
  endforeach()
  set(${out} "${MAJOR}.${MINOR}.${PATCH}" PARENT_SCOPE)
endfunction()
