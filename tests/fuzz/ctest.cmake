# Included by tests/CMakeLists.txt (the main build): a short run of each fuzz target, from the
# clang build `make test` makes in build-fuzz (tests/fuzz/fuzz.sh build). Each replays its
# committed corpus (crash regressions included), then fuzzes for GPUFENCE_FUZZ_TEST_SECONDS.
# Exit 77 (skipped, saying why) when that build does not exist or clang/libFuzzer is missing.
include(${CMAKE_CURRENT_LIST_DIR}/targets.cmake)
set(GPUFENCE_FUZZ_BUILD_DIR "${CMAKE_SOURCE_DIR}/build-fuzz" CACHE PATH "The GPUFENCE_FUZZ build")
set(GPUFENCE_FUZZ_TEST_SECONDS 5 CACHE STRING "Seconds each fuzz target runs under CTest")
foreach(name ${GPUFENCE_FUZZ_TARGETS})
  add_test(NAME fuzz.${name}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/fuzz.sh run ${name} ${GPUFENCE_FUZZ_TEST_SECONDS}
                   ${GPUFENCE_FUZZ_BUILD_DIR})
  set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz SKIP_RETURN_CODE 77 TIMEOUT 300)
endforeach()

# The corpora replayed as ordinary unit tests (label unit: `make check`), built with the main
# compiler: every committed input, crash regressions included, through each target's oracles,
# without clang or libFuzzer (tests/fuzz/replay_main.cpp). The libraries are the main build's.
set(replay_libs_selector gpufence_gpu)
set(replay_libs_oci_spec gpufence_runtime gpufence_doctor)
set(replay_libs_cdi_spec gpufence_cdi)
set(replay_libs_containerd_config gpufence_containerd)
set(replay_libs_ldcache gpufence_cdi)
set(replay_libs_doctor_parse gpufence_doctor)
set(replay_libs_runc_args gpufence_runtime)
set(replay_libs_quantity gpufence_kube)
set(replay_libs_go_match gpufence_common)
set(replay_libs_nri_wire gpufence_nri)
foreach(name ${GPUFENCE_FUZZ_TARGETS})
  add_executable(replay_${name} ${CMAKE_CURRENT_LIST_DIR}/fuzz_${name}.cpp
                                ${CMAKE_CURRENT_LIST_DIR}/replay_main.cpp)
  target_link_libraries(replay_${name} PRIVATE ${replay_libs_${name}})
  add_test(NAME fuzz-replay.${name}
           COMMAND replay_${name} ${CMAKE_CURRENT_LIST_DIR}/corpus/${name})
  set_tests_properties(fuzz-replay.${name} PROPERTIES LABELS unit TIMEOUT 120)
endforeach()
