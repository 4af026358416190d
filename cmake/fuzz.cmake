# GPUFENCE_FUZZ=ON: libFuzzer targets over the parsers pods and nodes feed us (docs/fuzzing.md).
# Configured in its own build directory (build-fuzz, by tests/fuzz/fuzz.sh) with clang, it builds
# only the component libraries those parsers live in: no gRPC, no binaries, no unit tests.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "GPUFENCE_FUZZ needs clang with libFuzzer (CMAKE_CXX_COMPILER=clang++-19); "
                      "tests/fuzz/fuzz.sh build picks one")
endif()

# Every library is instrumented for coverage and both sanitizers; UB aborts rather than warns, and
# libstdc++'s assertions turn an out-of-range operator[] into a crash the fuzzer can see.
target_compile_options(gpufence_settings INTERFACE
  -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
target_compile_options(gpufence_settings INTERFACE
  -fsanitize-ignorelist=${CMAKE_SOURCE_DIR}/tests/fuzz/ubsan-ignorelist.txt)
target_compile_definitions(gpufence_settings INTERFACE _GLIBCXX_ASSERTIONS)
target_link_options(gpufence_settings INTERFACE -fsanitize=address,undefined)

add_subdirectory(src/common)
add_subdirectory(src/gpu)
add_subdirectory(src/distribution)
add_subdirectory(src/cdi)
add_subdirectory(src/runtime)
add_subdirectory(src/containerd)
# The doctor's parsers alone: the rest of src/doctor needs gRPC.
add_library(gpufence_doctor_parse STATIC src/doctor/parse.cpp)
target_link_libraries(gpufence_doctor_parse PUBLIC gpufence_runtime gpufence_common nlohmann_json::nlohmann_json)
# The quantity parser alone: the rest of src/kube needs libcurl.
add_library(gpufence_quantity STATIC src/kube/quantity.cpp)
target_link_libraries(gpufence_quantity PUBLIC gpufence_common nlohmann_json::nlohmann_json)

# NRI's framings alone: the rest of src/nri needs protobuf.
add_library(gpufence_nri_wire STATIC src/nri/wire.cpp)
target_link_libraries(gpufence_nri_wire PUBLIC gpufence_common)

enable_testing()
add_subdirectory(tests/fuzz)
