# CI's second builds of the patched tree (the macOS and Windows cross builds, the Vulkan and sanitized builds) as
# unity builds: upstream's files are compiled 16 to a translation unit, so the headers they share (nlohmann's json
# in common and the server, above all) are parsed once per batch instead of once per file (docs/decisions.md). What
# these builds check (that the tree compiles, links and runs for that target) does not depend on how files are
# grouped. The wheel and the suite's build stay plain builds: they are what ships.
# - The series' own files (a name with "longhaul") still compile one by one, as in the wheel: a missing #include in
#   one of them fails here too.
# - ggml's CPU backend stays out: its files define the same static helpers (nearest_int, ...), a redefinition once
#   merged; so do common's json.cpp (a using-declaration that clashes) and mtmd's helpers (they refuse mtmd's
#   internal headers, which their batch would include).
# Used as -DCMAKE_PROJECT_INCLUDE=ci/unity.cmake (cmake includes it after each project() call; the first one, at
# the top, counts). LONGHAUL_CI_UNITY=0 in the environment at configure time: a plain build.
include_guard(GLOBAL)
if ("$ENV{LONGHAUL_CI_UNITY}" STREQUAL "0")
    return()
endif()
if (CMAKE_VERSION VERSION_LESS 3.19)  # cmake_language(DEFER); a check, not cmake_minimum_required: that would move
    # the including project's policies
    message(FATAL_ERROR "ci/unity.cmake needs CMake 3.19 or newer (found ${CMAKE_VERSION}): upgrade CMake, or configure "
                        "with LONGHAUL_CI_UNITY=0 in the environment for a plain build")
endif()

set(CMAKE_UNITY_BUILD ON)
set(CMAKE_UNITY_BUILD_BATCH_SIZE 16)
# the files compiled one by one: the series' own, and upstream's that clash with another file of their batch
set(LONGHAUL_CI_UNITY_ALONE "(longhaul[^/]*|/common/json|/mtmd/mtmd-helper[^/]*)\\.(c|cpp)$")

function(longhaul_ci_unity_exclusions dir)
    get_property(_targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach (t ${_targets})
        if (t MATCHES "^ggml-cpu.*$")
            set_target_properties(${t} PROPERTIES UNITY_BUILD OFF)
            continue()
        endif()
        get_target_property(_type ${t} TYPE)
        if (_type STREQUAL "INTERFACE_LIBRARY" OR _type STREQUAL "UTILITY")
            continue()
        endif()
        get_target_property(_sources ${t} SOURCES)
        get_target_property(_source_dir ${t} SOURCE_DIR)
        set(_own "")
        foreach (s ${_sources})
            if (s MATCHES "^\\$<")  # a generator expression (objects of another target)
                continue()
            endif()
            cmake_path(ABSOLUTE_PATH s BASE_DIRECTORY "${_source_dir}" OUTPUT_VARIABLE _abs)
            if (_abs MATCHES "${LONGHAUL_CI_UNITY_ALONE}")
                list(APPEND _own "${_abs}")
            endif()
        endforeach()
        if (_own)
            set_source_files_properties(${_own} TARGET_DIRECTORY ${t} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
        endif()
    endforeach()
    get_property(_subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
    foreach (d ${_subdirs})
        longhaul_ci_unity_exclusions("${d}")
    endforeach()
endfunction()

# at the end of the top-level CMakeLists.txt, when every target exists
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL longhaul_ci_unity_exclusions "${CMAKE_SOURCE_DIR}")
