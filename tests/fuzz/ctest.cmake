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
