// The ctquant version, from the project version in CMakeLists.txt. Reports
// (quantize --report, inspect --json, verify --json) and `--version` print it.
#pragma once

namespace ctquant {

// "0.1.0": MAJOR.MINOR.PATCH of the CMake project.
const char* ctquant_version() noexcept;

}  // namespace ctquant
