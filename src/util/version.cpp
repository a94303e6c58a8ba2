#include "ctquant/util/version.hpp"

#ifndef CTQUANT_VERSION_STRING
#error "CTQUANT_VERSION_STRING is set by CMakeLists.txt from the project version"
#endif

namespace ctquant {

const char* ctquant_version() noexcept { return CTQUANT_VERSION_STRING; }

}  // namespace ctquant
